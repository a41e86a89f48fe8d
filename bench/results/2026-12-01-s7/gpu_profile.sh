#!/usr/bin/env bash
# H200 session 7: profiling overhead with timestamps written inside the open compute pass (default now) and, as the
# A/B, between passes (bench_no_pass_timestamps.py); `python -m bench --model mlp16 --profile-overhead`, each twice,
# alternating. Then the captured mlp16 threads bench once more.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for run in 1 2; do
  echo "== in-pass timestamps, run $run"
  timeout 90 python3 -m bench --model mlp16 --profile-overhead --json "$OUT/profile_inpass_$run.json" 2>> "$OUT/profile.err" | grep -A4 "^step"
  echo "== between-pass timestamps, run $run"
  timeout 90 python3 bench/results/2026-12-01-s7/bench_no_pass_timestamps.py --model mlp16 --profile-overhead \
    --json "$OUT/profile_between_$run.json" 2>> "$OUT/profile.err" | grep -A4 "^step"
done
timeout 70 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 \
  --json "$OUT/threads.json" 2> "$OUT/threads.err" | grep "capture on\|ceiling"
