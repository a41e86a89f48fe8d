#!/usr/bin/env bash
# H200 session 6, run 4: the issue-15 test files (concurrency modes, profiling, async) on the H200, and mlp16 captured
# against the WebGPU EP after the serialized-device, profiling and async changes (the replay path gained a check).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_concurrency_modes.py tests/test_profiling.py \
  tests/test_async.py tests/test_concurrency.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -10
for i in 1 2; do
  timeout 90 python3 -m bench --model mlp16 --batch 1 --capture both --vs onnxruntime --iterations 300 --warmup 30 \
    2> /dev/null | grep -E "capture (on|off) +end_to_end|capture on +run_only|WebGpu.*capture on +end_to_end|ratio capture off / on, end_to_end" | tee -a "$OUT/mlp16.txt"
done
