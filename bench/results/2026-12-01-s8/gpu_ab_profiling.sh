#!/usr/bin/env bash
# H200 session 8 (helper P): profiling overhead, interleaved per round: `python -m bench --model mlp16
# --profile-overhead --iterations 400` with HEAD's ortgpu/_profiling.py + _runner.py ("before", .ab_P/before), and
# candidates in .ab_P/<arm> (run 2: v2, raw ticks + replay_and_read reads its own slot + 16 slots; v3, v2 + one
# query set per slot, resolved at the ring's read instead of per run; run 3: v3 and v4, v3 with replay_and_read's
# timestamps in the ring too, read in its wait once the ring is half full), all on the committed backends (HEAD)
# (.ab_P/head: the tree carried another engineer's uncommitted backend edits); then host_cost.py (16 Relu) for each.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
cp -r .ab_P/head/. ./
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for run in 1 2 3; do
  for arm in before v3 v4; do
    cp .ab_P/$arm/_profiling.py .ab_P/$arm/_runner.py ortgpu/
    echo "== $arm $run"
    timeout 80 python3 -m bench --model mlp16 --profile-overhead --iterations 400 --json "$OUT/${arm}_$run.json" \
      2>> "$OUT/profile.err" | grep -A3 "^step"
  done
done
for arm in before v3 v4; do
  cp .ab_P/$arm/_profiling.py .ab_P/$arm/_runner.py ortgpu/
  echo "== host_cost $arm"
  timeout 60 python3 bench/results/2026-12-01-s8/host_cost.py wgpu --iterations 1500 2>> "$OUT/profile.err" | tail -10
done
