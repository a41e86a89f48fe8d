#!/usr/bin/env bash
# H200 session 12: the working tree against earlier states of the backend, side by side in one call.  Each TREE
# is the working tree with the files of bench/results/2026-12-02-s12/TREE.tar over it (made here with
# `git archive -o TREE.tar COMMIT <files>`, not committed); "new" is the working tree itself.  Runs where_time.py's
# threaded end_to_end (K = 1, 2, 4, 8) and replay_and_read (K = 1, 4) steps, alternating trees, ROUNDS times, then
# the threads bench on the working tree.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
MAIN=$PWD
S=bench/results/2026-12-02-s12
TREES=${TREES:-old new}
for T in $TREES; do
  [ "$T" = new ] && continue
  rm -rf /tmp/$T && mkdir /tmp/$T && tar --exclude=.gl --exclude=.whl -cf - . | tar -xf - -C /tmp/$T
  tar -xf $S/$T.tar -C /tmp/$T
done
for T in $TREES; do
  D=/tmp/$T; [ "$T" = new ] && D=$MAIN
  (cd $D && PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > /tmp/build_$T.log 2>&1) || { tail -30 /tmp/build_$T.log; exit 1; }
done
W=bench/results/2026-12-01-s9/where_time.py
for round in $(seq 1 ${ROUNDS:-2}); do
  for T in $TREES; do
    D=/tmp/$T; [ "$T" = new ] && D=$MAIN
    echo "== round $round $T end_to_end"
    (cd $D && PYTHONPATH=/tmp/site:$D timeout 120 python3 $W 1,2,4,8 end_to_end 1500)
    echo "== round $round $T replay_and_read"
    (cd $D && PYTHONPATH=/tmp/site:$D timeout 120 python3 $W 1,4 replay_and_read 1500)
  done
done
if [ "${BENCH:-1}" = 1 ]; then
  echo "== threads bench (new)"
  PYTHONPATH=/tmp/site:$MAIN timeout 200 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | grep -v "^  [0-9] thread"
fi
