#!/usr/bin/env bash
# H200 session 17 (carry .gl and .whl): timestamp_parts.py (ROUNDS times), the threads bench with --gpu-under-load,
# then with TESTS=1 the test files of the profiling, reads ahead, encode ahead, waits and concurrency.
set -u
source bench/results/2026-12-03-s16/device_setup.sh
here=bench/results/2026-12-03-s17
for round in $(seq ${ROUNDS:-2}); do
  echo "== timestamp parts, round $round"
  ITER=${ITER:-2000} timeout 120 python3 $here/timestamp_parts.py 2>&1 | tail -7 | tee -a $OUT/timestamps.txt
done
if [ "${LOADED:-1}" = 1 ]; then
  echo "== threads bench, --gpu-under-load"
  timeout 240 python3 -m bench --model mlp16 --batch 1 --threads ${KS:-1,2,4,8} --capture on --iterations 400 --warmup 50 --gpu-under-load 2>&1 | grep -vE "^\s*$" | tail -30 | tee -a $OUT/loaded.txt
fi
if [ "${TESTS:-0}" = 1 ]; then
  echo "== tests"
  timeout 280 python3 -m pytest -q -x -p no:cacheprovider --backend=wgpu tests/test_profiling.py tests/test_profiling_async_ring.py tests/test_read_ahead.py tests/test_encode_ahead_threads.py tests/test_wait_unlocked.py tests/test_write_outside_lock.py tests/test_concurrency.py 2>&1 | tail -5 | tee -a $OUT/tests.txt
fi
