#!/usr/bin/env bash
# H200 session 11: profiling's cost with the three timestamp placements (placement.py), rounds interleaved, each run
# its own process: python -m bench --model mlp16 --profile-overhead --iterations 400.
set -u
ROUNDS=${1:-3}
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
start=$(date +%s)
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
export PYTHONPATH=/tmp/site:$PWD
for round in $(seq 1 "$ROUNDS"); do
  for p in open-pass any-pass edges-on-encoder; do
    echo "== round $round $p ($(( $(date +%s) - start )) s)"
    timeout 90 python3 bench/results/2026-12-02-s11/placement.py $p --model mlp16 --profile-overhead --iterations 400 \
      --json "$OUT/${p}_$round.json" 2>> "$OUT/err.txt" | grep -A4 "^step"
  done
done
echo "total: $(( $(date +%s) - start )) s"
