#!/usr/bin/env bash
# H200 session 8: A/B of the C map/work-done callbacks (no GIL inside wgpu-native's polls and submits) and of a
# pause between the spinning poller's polls, against the previous commit (e55771e, Python callbacks), on the
# captured mlp16 threads bench (K = 1, 4), alternating, two rounds.  .whl/old.tar: `git archive e55771e`.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
(PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1) &
(cd /tmp/old && PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build_old.log" 2>&1) &
wait
ARGS="--model mlp16 --batch 1 --threads 1,4 --capture on --iterations 500 --warmup 50"
for run in 1 2; do
  echo "== old (e55771e), run $run"
  (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 60 python3 -m bench $ARGS --json "$OUT/old_$run.json" 2>> "$OUT/err.txt" | grep "capture on")
  for pause in 0 10 30; do
    echo "== new, pause $pause us, run $run"
    PYTHONPATH=/tmp/site:$PWD timeout 60 python3 bench/results/2026-12-01-s8/bench_pause.py $pause $ARGS \
      --json "$OUT/new_p${pause}_$run.json" 2>> "$OUT/err.txt" | grep "capture on"
  done
done
PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_wait_unlocked.py \
  tests/test_device_loss_threads.py tests/test_encode_ahead_threads.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -5
