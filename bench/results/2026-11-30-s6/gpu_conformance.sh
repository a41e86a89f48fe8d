#!/usr/bin/env bash
# H200 session 6: every ONNX node test through InferenceSession on the H200 (8 workers), after the recurrent kernels
# and the control-flow expansion.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
timeout 400 python3 tests/test_conformance.py -j 8 > "$OUT/conformance.txt" 2>&1; echo "conformance rc=$?"
cp tests/conformance_report.txt "$OUT/conformance_report_h200.txt"
grep -E "^TOTAL|^passed|wrong|error\]" "$OUT/conformance.txt" | head -20
