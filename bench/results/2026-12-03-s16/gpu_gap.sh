#!/usr/bin/env bash
# H200 session 16 (carry .gl and .whl): the threads bench with the spinning poller pausing between polls
# (ORTGPU_POLL_GAP_NS, an experiment switch read at import by _unlocked_calls.pyx in the tree of run 6, removed
# since: no clear effect), settings alternating, ROUNDS rounds.
set -u
source bench/results/2026-12-03-s16/device_setup.sh
for round in $(seq ${ROUNDS:-2}); do
  for gap in ${GAPS:-0 5000 20000}; do
    echo "== threads bench, round $round, ORTGPU_POLL_GAP_NS=$gap"
    ORTGPU_POLL_GAP_NS=$gap timeout 120 python3 -m bench --model mlp16 --batch 1 --threads ${KS:-1,4,8} --capture on --iterations 400 --warmup 50 2>&1 | grep -E "^ +[0-9]+ ortgpu.*(end_to_end|run_only)|ceiling" | tee -a $OUT/gap.txt
  done
done
