#!/usr/bin/env bash
# H200 session 13 (carry .gl and .whl), the final code: the threads bench twice, the profiling overhead twice.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
for round in 1 2; do
  echo "== threads bench, round $round"
  timeout 150 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | grep -v "^  [0-9] thread" | tail -16 | tee -a $OUT/threads.txt
  echo "== profiling overhead, round $round"
  timeout 120 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -5 | tee -a $OUT/profile.txt
done
