#!/usr/bin/env bash
# H200 session 8: lock_holds.py (who holds the device's lock, how long, how long others wait for it) for K = 1 and
# 4 threads, each captured step of the threads bench.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for step in end_to_end replay_and_read run_only; do
  for k in 1 4; do
    timeout 60 python3 bench/results/2026-12-01-s8/lock_holds.py $k 1500 $step 2>&1 | tee -a "$OUT/holds.txt"
  done
done
