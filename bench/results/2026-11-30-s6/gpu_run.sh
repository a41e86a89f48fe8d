#!/usr/bin/env bash
# H200 session 6 (issue 13): the recurrent benchmarks. Build the committed tree; the bench tests of the recurrent
# models on the H200 (there onnxruntime's WebGPU EP is installed, which lavapipe runs only simulate); then the
# Silero-like VAD (batch 1) and the CRNN recognizer (batch 1 and 8), ortgpu captured and uncaptured against
# onnxruntime's WebGPU EP and its CPU provider. A captured arm ortgpu refuses (CaptureStateError: a node on the CPU,
# or an input whose value decides the plan) is reported as refused, with the reason, in the text and the JSON.
# Writes under $OUT (8 files, the most that come back): build.log, tests.log, <model>_b<batch>.txt (stdout, then
# the stderr lines that are not progress) and .json. About 2-4 minutes.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import ortgpu; e = ortgpu.Env(backend='wgpu'); print(e.default_device)"
python3 -c "import onnxruntime as o; from bench.peer import webgpu_ep_available as w; print('onnxruntime', o.__version__, 'WebGPU EP', w())"
timeout 90 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_bench.py tests/test_recurrent_models.py \
  -k "recurrent or vad or cpu_peer or flops" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -8
for run in vad:1:200 lstm-ocr:1:200 lstm-ocr:8:100; do
  IFS=: read -r model batch iterations <<< "$run"
  name="${model}_b${batch}"
  timeout 120 python3 -m bench --model "$model" --batch "$batch" --capture both --vs onnxruntime \
    --iterations "$iterations" --warmup 20 --json "$OUT/$name.json" > "$OUT/$name.txt" 2> "/tmp/$name.err"
  echo "bench $name rc=$?"
  tr '\r' '\n' < "/tmp/$name.err" | grep -vE "^ *$|: [0-9]+/[0-9]+$" >> "$OUT/$name.txt"
  grep -E "GFLOP|refused|could not run|differ|^ortgpu|^onnxruntime|^ratio|Error" "$OUT/$name.txt" | cut -c1-300
done
