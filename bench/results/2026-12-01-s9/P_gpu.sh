#!/usr/bin/env bash
# H200 session 9 (helper P): profiling overhead A/B, interleaved per round, each arm its own process:
# `python -m bench --model mlp16 --profile-overhead --iterations 400` with HEAD's ortgpu/_profiling.py ("before",
# .ab_P9/before, from `git show HEAD:...`) and the working tree's ("new"); then P_diag.py (the variants of the new
# code in one process) once per round; then host_cost.py (session 8's, 16 Relu) for each arm.
# Usage on the device: bash P_gpu.sh ROUNDS [DIAG VARIANTS...]
set -u
ROUNDS=${1:-2}; shift || true
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
[ -d .ab_P9/head ] && cp -r .ab_P9/head/. ./  # HEAD's version of files others were changing (not this A/B's)
start=$(date +%s)
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 16 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
export PYTHONPATH=/tmp/site:$PWD
cp ortgpu/_profiling.py /tmp/new_profiling.py
for run in $(seq 1 "$ROUNDS"); do
  for arm in before new; do
    if [ $arm = before ]; then cp .ab_P9/before/_profiling.py ortgpu/; else cp /tmp/new_profiling.py ortgpu/_profiling.py; fi
    echo "== $arm $run ($(( $(date +%s) - start )) s)"
    timeout 60 python3 -m bench --model mlp16 --profile-overhead --iterations 400 --json "$OUT/${arm}_$run.json" \
      2>> /tmp/profile.err | grep -A3 "^step"
  done
  if [ $# -gt 0 ]; then
    echo "== diag $run ($(( $(date +%s) - start )) s)"
    timeout 90 python3 bench/results/2026-12-01-s9/P_diag.py --json "$OUT/diag_$run.json" "$@" 2>> /tmp/profile.err
  fi
done
for arm in before new; do
  if [ $arm = before ]; then cp .ab_P9/before/_profiling.py ortgpu/; else cp /tmp/new_profiling.py ortgpu/_profiling.py; fi
  echo "== host_cost $arm ($(( $(date +%s) - start )) s)"
  timeout 60 python3 bench/results/2026-12-01-s8/host_cost.py wgpu --iterations 1500 2>> /tmp/profile.err | tail -9
done
cp /tmp/new_profiling.py ortgpu/_profiling.py
tail -5 /tmp/profile.err
echo "total: $(( $(date +%s) - start )) s"
