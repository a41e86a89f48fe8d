#!/usr/bin/env bash
# H200 session 9: py-spy (native stacks, idle included) over where_time.py, captured mlp16 end_to_end, K = 1 and 4.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for k in 1 4; do
  timeout 120 /tmp/site/bin/py-spy record --native --idle --threads -r 250 --format raw -o "$OUT/spy_k$k.txt" -- \
    python3 bench/results/2026-12-01-s9/where_time.py $k end_to_end 12000 2>&1 | grep -v "^$" | tail -4
done
timeout 100 /tmp/site/bin/py-spy record --native --idle --threads -r 250 --format raw -o "$OUT/spy_k4_rr.txt" -- \
    python3 bench/results/2026-12-01-s9/where_time.py 4 replay_and_read 12000 2>&1 | grep -v "^$" | tail -4
