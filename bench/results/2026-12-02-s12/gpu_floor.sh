#!/usr/bin/env bash
# Session 12, on the device machine (carry .gl and .whl): the native floor of a threaded captured step
# (native_floor.py): by default three rounds of K = 1, 2, 4, 8, 3000 steps each (KS, N, ROUNDS, MIXED: its arguments).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
(cd bench/results/2026-12-02-s12 && python3 -m Cython.Build.Cythonize -i -q native_step.pyx > /tmp/floor_build.log 2>&1) || { tail -20 /tmp/floor_build.log; exit 1; }
nvidia-smi --query-gpu=name,utilization.gpu --format=csv,noheader
python3 bench/results/2026-12-02-s12/native_floor.py ${KS:-1,2,4,8} ${N:-3000} ${ROUNDS:-3} ${MIXED:-} 2>&1 | tee $OUT/floor.txt
