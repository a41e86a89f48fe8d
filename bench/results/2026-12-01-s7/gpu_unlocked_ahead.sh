#!/usr/bin/env bash
# H200 session 7: encoding ahead outside the device lock (a release cancels or waits for it). The captured mlp16
# threads bench twice, the frame sampler at K=4 (profile_threads.py), the profiling overhead once, and the
# session's thread/encode-ahead tests on the wgpu backend.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for run in 1 2; do
  timeout 70 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 \
    --json "$OUT/threads_$run.json" 2> "$OUT/threads_$run.err" | grep "capture on\|ceiling"
done
timeout 60 python3 bench/results/2026-12-01-s7/profile_threads.py 4 1500 2>&1 | head -12 | tee "$OUT/k4.txt"
timeout 90 python3 -m bench --model mlp16 --profile-overhead --iterations 400 --json "$OUT/profile.json" \
  2>> "$OUT/profile.err" | grep -A3 "^step"
timeout 120 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_encode_ahead_threads.py \
  tests/test_wait_unlocked.py tests/test_device_loss_threads.py tests/test_concurrency_modes.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -5
