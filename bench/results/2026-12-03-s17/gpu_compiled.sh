#!/usr/bin/env bash
# H200 session 17 (carry .gl and .whl): the step's pure-Python modules compiled with Cython as they are
# (compile_py.py) against the same modules interpreted, alternating ROUNDS times: the threads bench (KS), then
# with PROFILE=1 the profiling overhead bench.
set -u
source bench/results/2026-12-03-s16/device_setup.sh
here=bench/results/2026-12-03-s17
MODS="ortgpu_core/backends/wgpu_native.py ortgpu_core/backends/_wgpu_read_ahead.py ortgpu_core/backends/_wgpu_encode_ahead.py ortgpu_core/backends/_wgpu_readback.py ortgpu_core/backends/_wgpu_device_base.py ortgpu_core/backends/_device_lock.py ortgpu/_runner.py ortgpu/_profiling.py"
python3 $here/compile_py.py $MODS > /tmp/compile.log 2>&1 || { tail -30 /tmp/compile.log; exit 1; }
grep compiled /tmp/compile.log
mkdir -p /tmp/compiled
for m in $MODS; do mv ${m%.py}.cpython-*.so /tmp/compiled/; done
for round in $(seq ${ROUNDS:-2}); do
  for arm in ${ARMS:-plain compiled}; do
    for m in $MODS; do rm -f ${m%.py}.cpython-*.so; done
    if [ "$arm" = compiled ]; then for m in $MODS; do d=$(dirname $m); b=$(basename ${m%.py}); cp /tmp/compiled/$b.cpython-*.so $d/; done; fi
    python3 -c "import ortgpu_core.backends.wgpu_native as w; print('wgpu_native from', w.__file__)"
    echo "== threads bench, round $round, $arm"
    timeout 150 python3 -m bench --model mlp16 --batch 1 --threads ${KS:-1,4,8} --capture on --iterations ${ITER:-400} --warmup 50 2>&1 | grep -E "^ +[0-9]+ ortgpu|ceiling|K=1" | tee -a $OUT/threads_$arm.txt
    if [ "${PROFILE:-0}" = 1 ]; then
      echo "== profiling overhead, round $round, $arm"
      timeout 150 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -6 | tee -a $OUT/profile_$arm.txt
    fi
  done
done
