#!/usr/bin/env bash
# H200 session 7, fourth threads run: encoding ahead is skipped while other threads queue for the device's lock
# (DeviceLock.contended). The primitive probe (probe_threads.py, default backend only via PROBE_VARIANTS), then the
# captured mlp16 threads bench twice, then once with sys.setswitchinterval(1e-4) (bench_switch.py).
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
timeout 70 python3 bench/results/2026-12-01-s7/bench_switch.py 1e-4 --model mlp16 --batch 1 --threads 1,2,4,8 --capture on \
  --iterations 500 --warmup 50 --json "$OUT/threads_switch.json" 2> "$OUT/threads_switch.err" | grep "capture on"
echo "switch rc=${PIPESTATUS[0]}"
