#!/usr/bin/env bash
# H200 session 7: A/B of skipping encode-ahead while other threads queue for the device lock, on the captured mlp16
# threads bench (K = 1, 2, 4), alternating: skip (default), always encode ahead (bench_always_ahead.py), x2.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for run in 1 2; do
  echo "== skip while contended, run $run"
  timeout 60 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4 --capture on --iterations 500 --warmup 50 \
    --json "$OUT/skip_$run.json" 2>> "$OUT/err.txt" | grep "capture on"
  echo "== always ahead, run $run"
  timeout 60 python3 bench/results/2026-12-01-s7/bench_always_ahead.py --model mlp16 --batch 1 --threads 1,2,4 \
    --capture on --iterations 500 --warmup 50 --json "$OUT/always_$run.json" 2>> "$OUT/err.txt" | grep "capture on"
done
