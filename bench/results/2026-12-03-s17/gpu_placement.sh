#!/usr/bin/env bash
# H200 session 17 (carry .gl and .whl): is K=4's spread between processes where the threads land?  The machine's
# CPU layout, then the threads bench ROUNDS times unpinned and pinned (taskset) to CPUS_A and CPUS_B, alternating.
set -u
source bench/results/2026-12-03-s16/device_setup.sh
lscpu | grep -E "^(CPU\(s\)|On-line|Thread|Core|Socket|NUMA|L3|Model name)" | tee $OUT/lscpu.txt
cat /sys/fs/cgroup/cpuset.cpus.effective 2>/dev/null | sed 's/^/cpuset: /' | tee -a $OUT/lscpu.txt
allowed=$(python3 -c "import os; c=sorted(os.sched_getaffinity(0)); print(','.join(map(str,c)))")
half=$(python3 -c "import os; c=sorted(os.sched_getaffinity(0)); print(','.join(map(str,c[:len(c)//2])))")
quarter=$(python3 -c "import os; c=sorted(os.sched_getaffinity(0)); print(','.join(map(str,c[:max(1,len(c)//4)])))")
echo "allowed: $allowed; A (half): $half; B (quarter): $quarter" | tee -a $OUT/lscpu.txt
for round in $(seq ${ROUNDS:-3}); do
  for arm in unpinned "${CPUS_A:-$half}" "${CPUS_B:-$quarter}"; do
    echo "== threads bench, round $round, cpus $arm"
    if [ "$arm" = unpinned ]; then pre=""; else pre="taskset -c $arm"; fi
    ORTGPU_S17_COMBINED=${COMBINED:-0} timeout 150 $pre python3 -m bench --model mlp16 --batch 1 --threads ${KS:-1,4,8} --capture on --iterations ${ITER:-400} --warmup 50 2>&1 | grep -E "^ +[0-9]+ ortgpu.*end_to_end|end_to_end: throughput" | tee -a "$OUT/threads_${arm}.txt"
  done
done
