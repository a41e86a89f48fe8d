#!/usr/bin/env bash
# H200 session 8: the captured mlp16 threads bench (K = 1, 2, 4, 8; end_to_end, replay_and_read, run_only) on this
# tree twice and on e55771e (.whl/old.tar: session 7's last commit; it has no replay_and_read boundary) once,
# alternating; then the encode-ahead/wait tests 4 times and race_probe.py (the wrong reads of run 4) on this tree.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
(PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1) &
(cd /tmp/old && PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build_old.log" 2>&1) &
wait
ARGS="--model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50"
for run in 1 2; do
  echo "== new, run $run"
  PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m bench $ARGS --json "$OUT/new_$run.json" 2>> "$OUT/err.txt" \
    | grep "capture on\|ceiling"
  if [ $run = 1 ]; then
    echo "== old (e55771e)"
    (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 100 python3 -m bench $ARGS --json "$OUT/old.json" \
      2>> "$OUT/err.txt" | grep "capture on\|ceiling")
  fi
done
export PYTHONPATH=/tmp/site:$PWD
for i in 1 2 3 4; do
  timeout 100 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_encode_ahead_threads.py \
    tests/test_wait_unlocked.py tests/test_device_loss_threads.py 2>&1 | grep -E "passed|failed|Failed:|^E  " | head -4
done
timeout 100 python3 bench/results/2026-12-01-s8/race_probe.py off 5
timeout 100 python3 bench/results/2026-12-01-s8/race_probe.py on 5
