#!/usr/bin/env bash
# H200 session 7: A/B of keeping the GIL in the short native calls made under the device lock, on the captured mlp16
# threads bench (K = 1, 2, 4), alternating: keep (default), release (bench_release_gil.py), keep, release.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for run in 1 2; do
  echo "== keep GIL, run $run"
  timeout 60 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4 --capture on --iterations 500 --warmup 50 \
    --json "$OUT/keep_$run.json" 2>> "$OUT/err.txt" | grep "capture on"
  echo "== release GIL, run $run"
  timeout 60 python3 bench/results/2026-12-01-s7/bench_release_gil.py --model mlp16 --batch 1 --threads 1,2,4 \
    --capture on --iterations 500 --warmup 50 --json "$OUT/release_$run.json" 2>> "$OUT/err.txt" | grep "capture on"
done
