#!/usr/bin/env bash
# H200 session 8: with the device lock's waits gone (run 11: ~5 us at K=4), does the spinning poller's rate slow
# the other threads' native calls?  The captured mlp16 threads bench at K = 1, 4, pause 0 / 20 us between polls,
# alternating, two rounds each.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
ARGS="--model mlp16 --batch 1 --threads 1,4 --capture on --iterations 500 --warmup 50"
for run in 1 2; do
  for pause in 0 20; do
    echo "== pause $pause us, run $run"
    timeout 60 python3 bench/results/2026-12-01-s8/poll_pause_bench.py $pause $ARGS --json "$OUT/p${pause}_$run.json" \
      2>> "$OUT/err.txt" | grep "capture on"
  done
done
