#!/usr/bin/env bash
# H200 session 8: race_probe.py (the racing encode-ahead scenario, wrong results reported with their context), with
# encode-ahead on and off, on this tree and on e55771e (.whl/old.tar).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
(PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1) &
(cd /tmp/old && PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build_old.log" 2>&1) &
wait
P=$PWD/bench/results/2026-12-01-s8/race_probe.py
for mode in on off on off; do
  echo "== new"; PYTHONPATH=/tmp/site:$PWD timeout 100 python3 $P $mode 5
  echo "== old"; (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 100 python3 $P $mode 5)
done
