#!/usr/bin/env bash
# H200 session 13 (carry .gl, .whl and bench/results/2026-12-02-s13/base.tar): the working tree ("new") against
# "base" = the working tree with base.tar's files over it (made with `git archive -o base.tar COMMIT <files>`; here
# 8761a7c's _unlocked_calls.pyx and wgpu_native.py: the upload releasing the GIL), threads bench alternating,
# ROUNDS times; then the profiling overhead of the working tree twice.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
MAIN=$PWD
rm -rf /tmp/base && mkdir /tmp/base && tar --exclude=.gl --exclude=.whl -cf - . | tar -xf - -C /tmp/base
tar -xf bench/results/2026-12-02-s13/base.tar -C /tmp/base
for D in /tmp/base $MAIN; do
  (cd $D && PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1) || { tail -30 /tmp/build.log; exit 1; }
done
for round in $(seq 1 ${ROUNDS:-2}); do
  for T in base new; do
    D=/tmp/base; [ "$T" = new ] && D=$MAIN
    echo "== round $round $T threads bench"
    (cd $D && PYTHONPATH=/tmp/site:$D timeout 150 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | grep -E "end_to_end|replay_and_read|run_only|ceiling" | grep -v "^  [0-9] thread") | tee -a $OUT/ab_$T.txt
  done
done
for round in 1 2; do
  echo "== profiling overhead (new), round $round"
  PYTHONPATH=/tmp/site:$MAIN timeout 120 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -5 | tee -a $OUT/profile.txt
done
