#!/usr/bin/env bash
# H200 session 11: profiling's cost, three arms in turn per round (one process each): HEAD's ring ("before":
# .ab_s11/before), whole runs packed ("packed": .ab_s11/packed), and packed with a replay() finishing completed
# reads after its submit ("collect": the working tree).
set -u
ROUNDS=${1:-3}
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for arm in before packed; do
  rm -rf /tmp/$arm && mkdir /tmp/$arm && tar --exclude=.gl --exclude=.whl -cf - . | tar -xf - -C /tmp/$arm
  cp .ab_s11/$arm/*.py /tmp/$arm/ortgpu/
done
B="--model mlp16 --profile-overhead --iterations 400"
for round in $(seq 1 "$ROUNDS"); do
  for arm in before packed collect; do
    if [ $arm = collect ]; then D=$PWD; else D=/tmp/$arm; fi
    echo "== round $round $arm"
    (cd $D && PYTHONPATH=/tmp/site:$D timeout 90 python3 -m bench $B 2>>"$OUT/err.txt" | grep -A2 "^step" | tail -2)
  done
done
for arm in before collect; do
  if [ $arm = collect ]; then D=$PWD; else D=/tmp/$arm; fi
  echo "== profile_tail $arm"
  (cd $D && PYTHONPATH=/tmp/site:$D timeout 100 python3 bench/results/2026-12-02-s11/profile_tail.py 4000 | grep -v "slowest\|mod 16")
done
