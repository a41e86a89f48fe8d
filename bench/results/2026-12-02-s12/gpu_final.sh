#!/usr/bin/env bash
# H200 session 12, the final code: the threads bench once more and the profiling overhead.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "== threads bench"
timeout 200 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | grep -v "^  [0-9] thread"
echo "== profiling overhead"
timeout 150 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -12
