#!/usr/bin/env bash
# H200 session 17 (carry .gl and .whl): the threads bench with the replay's submit and its next encoding ahead in
# one native call (ORTGPU_S17_COMBINED=1, an experiment switch of the prototype tree: combined_prototype.patch,
# applied to 23916b8, not on main) against two calls (=0),
# alternating ROUNDS times; then with RING=1 ring_size.py.
set -u
source bench/results/2026-12-03-s16/device_setup.sh
here=bench/results/2026-12-03-s17
for round in $(seq ${ROUNDS:-3}); do
  for arm in ${ARMS:-0 1}; do
    echo "== threads bench, round $round, combined=$arm"
    ORTGPU_S17_COMBINED=$arm timeout 150 python3 -m bench --model mlp16 --batch 1 --threads ${KS:-1,4,8} --capture on --iterations ${ITER:-400} --warmup 50 2>&1 | grep -E "^ +[0-9]+ ortgpu.*end_to_end|ceiling|end_to_end: throughput" | tee -a $OUT/threads_$arm.txt
  done
done
if [ "${RING:-0}" = 1 ]; then
  for r in 1 2; do SLOTS=16,32,64 ITER=1500 timeout 150 python3 $here/ring_size.py 2>&1 | tail -8 | tee -a $OUT/ring_slots.txt; done
fi
