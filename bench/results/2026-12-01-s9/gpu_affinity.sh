#!/usr/bin/env bash
# H200 session 9: is the threaded step GIL/cache bound?  where_time.py end_to_end at K = 1, 4 pinned to 1, 2, 4 cores
# and unpinned, and K = 1 beside 3 threads of pure Python work (busy=3).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
W="timeout 60 python3 bench/results/2026-12-01-s9/where_time.py"
for round in 1 2; do
  echo "== round $round"
  $W 1,4 end_to_end 1500
  taskset -c 0-3 $W 1,4 end_to_end 1500
  taskset -c 0-1 $W 1,4 end_to_end 1500
  taskset -c 0 $W 1,4 end_to_end 1500 spin=0
  $W 1 end_to_end 1500 busy=1
  $W 1 end_to_end 1500 busy=3
  $W 1,4 run_only 1500
  taskset -c 0-1 $W 1,4 run_only 1500
done
