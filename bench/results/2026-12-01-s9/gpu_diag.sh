#!/usr/bin/env bash
# H200 session 9, diagnosis: where_time.py (captured mlp16, K = 1 and 4) with the knobs one at a time.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
W="timeout 60 python3 bench/results/2026-12-01-s9/where_time.py"
$W 1,4 end_to_end 1500
$W 1,4 end_to_end 1500 timing=1
$W 1,4 end_to_end 1500 switch=0.0002
$W 1,4 end_to_end 1500 switch=0.02
$W 1,4 end_to_end 1500 spin=0
$W 1,4 end_to_end 1500 spin=100
$W 1,4 end_to_end 1500 ahead=0
$W 1,4 end_to_end 1500 ahead=0 timing=1
$W 1,4 replay_and_read 1500 timing=1
$W 1,4 run_only 1500 timing=1
$W 1,4 end_to_end 1500
nproc; python3 -c "import sys; print(sys.version)"
