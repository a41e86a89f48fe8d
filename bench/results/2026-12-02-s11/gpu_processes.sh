#!/usr/bin/env bash
# H200 session 11: K threads (where_time.py) against K processes (processes.py), each stepping its own captured
# mlp16 on the one GPU, side by side in one call.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for round in 1 2; do
  for step in end_to_end replay_and_read; do
    echo "== round $round threads $step"
    timeout 120 python3 bench/results/2026-12-01-s9/where_time.py 1,2,4,8 $step 1500
    echo "== round $round processes $step"
    timeout 150 python3 bench/results/2026-12-02-s11/processes.py 1,2,4,8 1500 $step
  done
done
nproc
