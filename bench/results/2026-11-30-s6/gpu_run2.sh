#!/usr/bin/env bash
# H200 session 6, the lead's run: gpu_run.sh (build, recurrent bench tests, vad b1 and lstm-ocr b1/b8 against
# onnxruntime's WebGPU EP and CPU provider), then the issue-13 test files on the H200 (summaries on stdout).
set -u
bash bench/results/2026-11-30-s6/gpu_run.sh
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_capture_control_flow.py \
  tests/test_recurrent_kernels.py tests/test_recurrent_models.py tests/test_control_flow.py tests/test_ops_recurrent.py \
  -x 2>&1 | grep -E "passed|failed|^FAILED|^E  " | tail -15
echo "issue-13 tests done"
