#!/usr/bin/env bash
# H200 session 7, final figures (run at the commit after 6c0c075 that removed the encode-ahead skip): profiling with per-step detail on every 10th replay (the others timed whole, two
# timestamps) - `python -m bench --model mlp16 --profile-overhead`, twice; the captured mlp16 threads bench twice
# (its GPU ceiling now from replays timed whole); the session's new and changed tests on the wgpu backend.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for run in 1 2; do
  timeout 90 python3 -m bench --model mlp16 --profile-overhead --iterations 400 --json "$OUT/profile_$run.json" \
    2>> "$OUT/profile.err" | grep -A4 "^step"
done
for run in 1 2; do
  timeout 70 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 \
    --json "$OUT/threads_$run.json" 2> "$OUT/threads_$run.err" | grep "capture on\|ceiling"
done
timeout 150 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_wait_unlocked.py tests/test_profiling.py \
  tests/test_profiling_bench.py tests/test_concurrency_modes.py tests/test_device_loss_threads.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -10
