#!/usr/bin/env bash
# H200 session 8, final: the captured mlp16 threads bench (K = 1, 2, 4, 8; end_to_end, replay_and_read, run_only)
# alternating this tree (short native calls under the device's lock keep the GIL) and release_gil_bench.py (the
# same calls releasing it, as before), two rounds; the profiling overhead twice; the thread/encode-ahead/wait tests
# three times, lock_holds.py at K=4, and race_probe.py (the stale-handle reads) on and off.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
ARGS="--model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50"
for run in 1 2; do
  echo "== keep GIL, run $run"
  timeout 100 python3 -m bench $ARGS --json "$OUT/keep_$run.json" 2>> "$OUT/err.txt" | grep "capture on\|ceiling"
  echo "== release GIL, run $run"
  timeout 100 python3 bench/results/2026-12-01-s8/release_gil_bench.py $ARGS --json "$OUT/release_$run.json" \
    2>> "$OUT/err.txt" | grep "capture on\|ceiling"
done
timeout 60 python3 bench/results/2026-12-01-s8/lock_holds.py 4 1500 end_to_end 2>&1 | tee "$OUT/holds_k4.txt"
for run in 1 2; do
  timeout 90 python3 -m bench --model mlp16 --profile-overhead --iterations 400 --json "$OUT/profile_$run.json" \
    2>> "$OUT/err.txt" | grep -A3 "^step"
done
for i in 1 2 3; do
  timeout 100 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_encode_ahead_threads.py \
    tests/test_wait_unlocked.py tests/test_device_loss_threads.py tests/test_backend_wgpu.py 2>&1 \
    | grep -E "passed|failed|Failed:|^E  " | head -4
done
timeout 60 python3 bench/results/2026-12-01-s8/race_probe.py off 3
timeout 60 python3 bench/results/2026-12-01-s8/race_probe.py on 3
