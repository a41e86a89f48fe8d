#!/usr/bin/env bash
# H200 session 16 (carry .gl and .whl): profile_parts.py (ROUNDS times), then the threads bench at K=4,8 in
# THREAD_RUNS separate processes (is the K=4 shortfall per process or per measurement?); with LOADED=1,
# loaded_gpu_time.py.
set -u
source bench/results/2026-12-03-s16/device_setup.sh
here=bench/results/2026-12-03-s16
for round in $(seq ${ROUNDS:-2}); do
  echo "== profile parts, round $round"
  timeout 120 python3 $here/profile_parts.py 2>&1 | tail -9 | tee -a $OUT/parts.txt
done
for run in $(seq ${THREAD_RUNS:-0}); do
  echo "== threads bench, process $run"
  timeout 150 python3 -m bench --model mlp16 --batch 1 --threads ${KS:-4,8} --capture on --iterations 500 --warmup 50 2>&1 | grep -E "^ +[0-9]+ ortgpu|ceiling" | tee -a $OUT/threads.txt
done
if [ "${LOADED:-0}" = 1 ]; then
  echo "== GPU time per replay under load"
  timeout 200 python3 $here/loaded_gpu_time.py 2>&1 | tail -6 | tee -a $OUT/loaded.txt
fi
