#!/usr/bin/env bash
# H200 session 15 (carry .gl and .whl): diag.py (ceiling reading, K=8 tail causes, profiling cost split), then the
# threads bench and the profiling-overhead bench.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
if [ -n "${PARTS:-}" ]; then
  echo "== diag $PARTS"
  timeout ${DIAG_S:-300} python3 bench/results/2026-12-02-s15/lock_arms.py $PARTS 2>&1 | tee $OUT/diag.txt
fi
if [ "${BENCH:-1}" = 1 ]; then
  for round in $(seq ${ROUNDS:-1}); do
  for exp in ${EXPS:-base}; do
  echo "== threads bench (round $round, ORTGPU_LOCK_EXPERIMENT=$exp)"
  ORTGPU_LOCK_EXPERIMENT=$exp timeout 200 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | grep -v "^  [0-9] thread" | tee -a $OUT/threads.txt
  done
  done
  echo "== profiling overhead"
  timeout 150 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -8 | tee $OUT/profile.txt
fi
if [ "${TESTS:-0}" = 1 ]; then
  for exp in ${TEST_EXPS:-base}; do
  echo "== tests ORTGPU_LOCK_EXPERIMENT=$exp"
  ORTGPU_LOCK_EXPERIMENT=$exp timeout 240 python3 -m pytest -q -p no:cacheprovider --backend=wgpu tests/test_wait_nap_poll.py tests/test_wait_unlocked.py tests/test_device_loss_threads.py tests/test_read_ahead.py tests/test_encode_ahead_threads.py tests/test_concurrency.py 2>&1 | tail -4
  done
fi
