#!/usr/bin/env bash
# H200 session 13 (carry .gl and .whl), the final code: the thread, wait, loss, read-ahead, async, profiling and soak
# test files, then the threads bench once.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
timeout 240 python3 -m pytest -q -p no:cacheprovider --backend=wgpu tests/test_read_ahead.py tests/test_wait_unlocked.py \
  tests/test_device_loss_threads.py tests/test_concurrency.py tests/test_concurrency_modes.py tests/test_async.py \
  tests/test_profiling.py tests/test_profiling_async_ring.py tests/test_soak.py tests/test_capture.py 2>&1 | tail -4 | tee $OUT/tests.txt
timeout 150 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | grep -v "^  [0-9] thread" | tail -16 | tee $OUT/threads.txt
