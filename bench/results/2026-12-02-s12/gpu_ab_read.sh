#!/usr/bin/env bash
# H200 session 12: to_numpy()'s read in C (the copy's submission and map request in one call without the GIL, the
# wait in another; the module was named _native_read then, _unlocked_calls since) against the read before it (old_read.tar: the four backend files it changed, as
# they were at b2141b5; made here by `git archive -o bench/results/2026-12-02-s12/old_read.tar b2141b5 <those files>`,
# not committed), side by side in one call: where_time.py's threaded end_to_end steps, alternating, then the
# threads bench on the new tree.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
MAIN=$PWD
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=.gl --exclude=.whl -cf - . | tar -xf - -C /tmp/old
tar -xf bench/results/2026-12-02-s12/old_read.tar -C /tmp/old && rm -f /tmp/old/ortgpu_core/backends/_native_read.pyx
for D in $MAIN /tmp/old; do
  (cd $D && PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1) || { tail -30 /tmp/build.log; exit 1; }
done
W=bench/results/2026-12-01-s9/where_time.py
for round in 1 2; do
  for tree in old new; do
    if [ $tree = old ]; then D=/tmp/old; else D=$MAIN; fi
    echo "== round $round $tree end_to_end"
    (cd $D && PYTHONPATH=/tmp/site:$D timeout 120 python3 $W 1,2,4,8 end_to_end 1500)
  done
done
echo "== threads bench (new)"
PYTHONPATH=/tmp/site:$MAIN timeout 200 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | tail -40
