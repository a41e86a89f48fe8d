#!/usr/bin/env bash
# H200 session 13 (carry .gl and .whl): reads ahead measured: the threads bench, the profiling overhead, the
# library's step beside the native one (group_floor.py, ARMS=ortgpu,ahead,three), and the test files of threads,
# waits, loss and reads ahead.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
for d in 2026-12-02-s12/native_step 2026-12-02-s13/native_group; do
  (cd bench/results/${d%/*} && python3 -m Cython.Build.Cythonize -i -q ${d#*/}.pyx > /tmp/diag_build.log 2>&1) || { tail -20 /tmp/diag_build.log; exit 1; }
done
echo "== threads bench"
timeout 200 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | grep -v "^  [0-9] thread" | tee $OUT/threads.txt
echo "== library beside the native step"
ARMS=ortgpu,ahead,three timeout 150 python3 bench/results/2026-12-02-s13/group_floor.py 1,2,4,8 2000 2 2>&1 | tee $OUT/group.txt
echo "== profiling overhead"
timeout 150 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -8 | tee $OUT/profile.txt
if [ "${TESTS:-1}" = 1 ]; then
  echo "== tests"
  timeout 200 python3 -m pytest -q -p no:cacheprovider --backend=wgpu tests/test_read_ahead.py tests/test_wait_unlocked.py tests/test_device_loss_threads.py tests/test_concurrency.py 2>&1 | tail -4
fi
