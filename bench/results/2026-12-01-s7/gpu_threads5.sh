#!/usr/bin/env bash
# H200 session 7, fifth threads run: the short native calls made under the device's lock keep the GIL (submit of a
# command buffer encoded ahead, encode+submit of lists up to 128 records, the copy to staging, write_buffer up to
# 1 MiB; _device_calls.pyx, CommandList keep_gil). Probe (default variant), the captured mlp16 threads bench twice,
# and the profiling overhead (`python -m bench --profile-overhead`, mlp16).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
timeout 100 python3 bench/results/2026-12-01-s7/probe_threads.py "$OUT/probe.json" 2>&1 | grep "^default\|^no_ahead" | grep "e2e\|read"
for run in 1 2; do
  timeout 70 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 \
    --json "$OUT/threads_$run.json" 2> "$OUT/threads_$run.err" | grep "capture on\|ceiling"
  echo "run $run rc=${PIPESTATUS[0]}"
done
timeout 120 python3 -m bench --model mlp16 --profile-overhead --json "$OUT/profile_overhead.json" 2> "$OUT/profile.err" | tail -12
echo "profile rc=${PIPESTATUS[0]}"
