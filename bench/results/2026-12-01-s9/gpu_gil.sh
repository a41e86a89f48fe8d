#!/usr/bin/env bash
# H200 session 9: how busy the GIL is (py-spy --gil --nonblocking: samples only the thread holding the GIL) at K = 1
# and 4, end_to_end, with encode and submit releasing the GIL (as main) and keeping it (keepgil=1: an experiment,
# undone after this run, so where_time.py no longer has that knob); the steps/s of both without py-spy, alternating;
# and the thread hand-over latency (handover.py).  gil_summary.py reads the py-spy files.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
D=bench/results/2026-12-01-s9
python3 $D/handover.py 3000
for k in 1 4; do
  for g in 0 1; do
    timeout 60 /tmp/site/bin/py-spy record --gil --nonblocking -r 1000 --format raw -o "$OUT/gil_k${k}_keep$g.txt" -- \
      python3 $D/where_time.py $k end_to_end 6000 keepgil=$g 2>&1 | grep "steps/s\|Samples"
  done
done
for round in 1 2 3; do
  for g in 0 1; do timeout 60 python3 $D/where_time.py 1,4,8 end_to_end 1500 keepgil=$g; done
done
for g in 0 1; do timeout 60 python3 $D/where_time.py 1,4 replay_and_read 1500 keepgil=$g; done
