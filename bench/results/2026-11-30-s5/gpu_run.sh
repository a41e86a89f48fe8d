#!/usr/bin/env bash
# H200 session 5: build the committed tree; every ONNX node test through InferenceSession on the H200 (the
# conformance script, 8 workers); the model tests with real-world structure and the data-error tests; then mlp16 and
# bert captured against onnxruntime's WebGPU EP (the status buffer and plan-cache changes must not slow them).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import ortgpu; e = ortgpu.Env(backend='wgpu'); print(e.default_device)"
timeout 200 python3 tests/test_conformance.py -j 8 > "$OUT/conformance.txt" 2>&1; echo "conformance rc=$?"
cp tests/conformance_report.txt "$OUT/conformance_report_h200.txt"
grep -E "^TOTAL|^passed|wrong\]|error\]" "$OUT/conformance.txt" | head -20
timeout 200 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_real_world_models.py \
  tests/test_data_errors.py tests/test_window_properties.py tests/test_window_edges.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/tests.log" | tail -8
for model in mlp16 bert; do
  timeout 90 python3 -m bench --model $model --batch 1 --capture both --vs onnxruntime --iterations 200 --warmup 20 \
    > "$OUT/${model}_vs.txt" 2> /dev/null; echo "bench $model rc=$?"
  grep -E "capture (on|off)|onnxruntime|ratio" "$OUT/${model}_vs.txt" | head -10
done
