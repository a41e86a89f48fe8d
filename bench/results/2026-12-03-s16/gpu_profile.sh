#!/usr/bin/env bash
# H200 session 16 (carry .gl and .whl): profiling's cost, the ring read without resolves (this tree) against
# session 15's ring (old_profiling.txt, made with `git show 21839ab:ortgpu/_profiling.py > bench/results/2026-12-03-s16/old_profiling.txt`:
# resolves per slot in the read), alternating ROUNDS times; then ring_parts.py.
set -u
source bench/results/2026-12-03-s16/device_setup.sh
here=bench/results/2026-12-03-s16
cp ortgpu/_profiling.py /tmp/new_profiling.py
for round in $(seq ${ROUNDS:-2}); do
  for arm in ${ARMS:-old new}; do
    if [ "$arm" = old ]; then cp $here/old_profiling.txt ortgpu/_profiling.py; else cp /tmp/new_profiling.py ortgpu/_profiling.py; fi
    echo "== profiling overhead, round $round, ring $arm"
    timeout 150 python3 -m bench --model mlp16 --profile-overhead --iterations ${ITER:-400} 2>&1 | tail -6 | tee -a $OUT/profile.txt
  done
done
cp /tmp/new_profiling.py ortgpu/_profiling.py
if [ "${PARTS:-1}" = 1 ]; then
  echo "== ring parts (new)"
  STEPS=${STEPS:-2000} timeout 120 python3 bench/results/2026-12-02-s15/ring_parts.py 2>&1 | tail -30
fi
