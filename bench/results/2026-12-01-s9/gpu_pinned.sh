#!/usr/bin/env bash
# H200 session 9: the threads bench (captured mlp16, K = 1, 2, 4, 8) unpinned and pinned to one and two cores
# (taskset), with the default spin and with spin_wait_us=0 (blocking polls), through where_time.py.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
W="timeout 60 python3 bench/results/2026-12-01-s9/where_time.py"
for round in 1 2; do
  echo "== round $round"
  $W 1,2,4,8 end_to_end 1500
  taskset -c 0 $W 1,2,4,8 end_to_end 1500 spin=0
  taskset -c 0 $W 1,4 end_to_end 1500
  taskset -c 0-1 $W 1,4 end_to_end 1500 spin=0
  $W 1,4 end_to_end 1500 spin=0 switch=0.05
  taskset -c 0 $W 1,2,4,8 replay_and_read 1500 spin=0
  taskset -c 0 $W 1,2,4,8 run_only 1500 spin=0
done
