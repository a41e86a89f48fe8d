#!/usr/bin/env bash
# H200 session 6, run 2: after the host-bound value-deciding inputs (the VAD's sample rate is a host array in the
# bench, checked on the host before each replay): gpu_run.sh again, then mlp16 captured vs the WebGPU EP (stdout).
set -u
bash bench/results/2026-11-30-s6/gpu_run.sh
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 90 python3 -m bench --model mlp16 --batch 1 --capture both --vs onnxruntime --iterations 200 --warmup 20 \
  2> /dev/null | grep -E "capture (on|off) +end_to_end|WebGpu.*end_to_end|ratio .*end_to_end" | head -8
