#!/usr/bin/env bash
# H200 session 7: profiling overhead after a profiled replay_and_read became one submission (22669ec):
# `python -m bench --model mlp16 --profile-overhead --iterations 400`, three times.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for run in 1 2 3; do
  timeout 90 python3 -m bench --model mlp16 --profile-overhead --iterations 400 --json "$OUT/profile_$run.json" \
    2>> "$OUT/profile.err" | grep -A4 "^step"
done
