#!/usr/bin/env bash
# H200 session 17 (carry .gl and .whl): the final code: the threads bench in THREAD_RUNS processes, the profiling
# overhead bench ROUNDS times, then with TESTS=1 the wgpu half of the test suite for at most TEST_SECONDS.
set -u
source bench/results/2026-12-03-s16/device_setup.sh
for run in $(seq ${THREAD_RUNS:-3}); do
  echo "== threads bench, process $run"
  timeout 150 python3 -m bench --model mlp16 --batch 1 --threads ${KS:-1,2,4,8} --capture on --iterations 400 --warmup 50 2>&1 | grep -E "^ +[0-9]+ ortgpu.*end_to_end|ceiling|end_to_end: throughput" | tee -a $OUT/threads.txt
done
for round in $(seq ${ROUNDS:-2}); do
  echo "== profiling overhead, round $round"
  timeout 150 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -6 | tee -a $OUT/profile.txt
done
if [ "${TESTS:-0}" = 1 ]; then
  echo "== tests (wgpu backend)"
  timeout ${TEST_SECONDS:-400} python3 -m pytest -q -p no:cacheprovider --backend=wgpu tests 2>&1 | tail -15 | tee -a $OUT/tests.txt
fi
