#!/usr/bin/env bash
# H200 session 13 (carry .gl and .whl): the grouped-submit floor (group_floor.py), then session 12's final code
# measured once more (the threads bench and the profiling overhead), all in one call.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
for d in 2026-12-02-s12/native_step 2026-12-02-s13/native_group; do
  (cd bench/results/${d%/*} && python3 -m Cython.Build.Cythonize -i -q ${d#*/}.pyx > /tmp/diag_build.log 2>&1) || { tail -20 /tmp/diag_build.log; exit 1; }
done
nvidia-smi --query-gpu=name,utilization.gpu --format=csv,noheader
echo "== grouped submits"
timeout 240 python3 bench/results/2026-12-02-s13/group_floor.py ${KS:-1,2,4,8} ${N:-2000} ${ROUNDS:-2} 2>&1 | tee $OUT/group.txt
if [ -z "${GROUP_ONLY:-}" ]; then
  echo "== threads bench"
  timeout 200 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | grep -v "^  [0-9] thread" | tee $OUT/threads.txt
  echo "== profiling overhead"
  timeout 150 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -12 | tee $OUT/profile.txt
fi
