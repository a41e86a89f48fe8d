#!/usr/bin/env bash
# H200 session 5, second call (after the Pad/Div fixes the first call's conformance run found): every ONNX node
# test on the H200 (8 workers), then the whole wgpu test suite (typing and run.sh's install checks need tools that
# machine lacks; the tests that compare numpy references with onnxruntime are left to CI's onnxruntime 1.32: that
# machine's 1.31.1 differs on OneHot with a negative axis and dies of SIGFPE on an integer Mod case).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
[ "${SKIP_CONFORMANCE:-0}" = 1 ] || timeout 200 python3 tests/test_conformance.py -j 8 > "$OUT/conformance.txt" 2>&1; echo "conformance rc=$?"
cp tests/conformance_report.txt "$OUT/conformance_report_h200.txt"
grep -E "^TOTAL|^passed|wrong\]|error\]" "$OUT/conformance.txt" | cut -c1-400 | head -20
timeout 420 python3 -m pytest -q --backend=wgpu -p no:cacheprovider --deselect tests/test_typing.py \
  --deselect tests/test_run_script.py -k "not reference_matches_onnxruntime" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"
grep -E "passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -15
