#!/usr/bin/env bash
# H200 session 7, third threads run: the calls made under the device's lock during a read (map request, mapped
# range + copy + unmap) now keep the GIL (ortgpu_core/backends/_readback_native.pyx). probe_phases.py (where a 4 KB
# read's time goes, K = 1, 2, 4) then the captured mlp16 threads bench, twice.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
timeout 100 python3 bench/results/2026-12-01-s7/probe_phases.py "$OUT/phases.json" | head -9
for run in 1 2; do
  timeout 70 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 \
    --json "$OUT/threads_$run.json" 2> "$OUT/threads_$run.err" | tee "$OUT/threads_$run.txt" | grep -v "^boundary\|^model\|^adapter"
  echo "run $run rc=${PIPESTATUS[0]}"
done
