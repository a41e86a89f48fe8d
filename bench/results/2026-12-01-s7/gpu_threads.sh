#!/usr/bin/env bash
# H200 session 7: issue 15's throughput with threads after waits stopped holding the device lock (reads and
# wait_idle poll outside it; staging buffers from a per-thread pool). Same commands as session 6's gpu_threads.sh:
# `python -m bench --model mlp16 --threads 1,2,4,8`, captured (twice) and uncaptured, plus the unlocked-wait tests
# and the thread tests on the wgpu backend.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,utilization.gpu,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
for run in 1 2; do
  capture=$([ $run = 1 ] && echo both || echo on)
  timeout $([ $run = 1 ] && echo 110 || echo 60) python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 \
    --capture $capture --iterations 500 --warmup 50 --json "$OUT/threads_$run.json" 2> "$OUT/threads_$run.err" \
    | tee "$OUT/threads_$run.txt"
  echo "run $run rc=${PIPESTATUS[0]}"
done
timeout 120 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_wait_unlocked.py \
  tests/test_concurrency_modes.py tests/test_device_loss_threads.py tests/test_soak_threads.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -10
