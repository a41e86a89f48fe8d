#!/usr/bin/env bash
# H200 session 11: the step's Python compiled by Cython (setup.py COMPILED_PYTHON) against the same source
# interpreted, side by side in one call: where_time.py's threaded steps, then the profiling overhead.
# The COMPILED_PYTHON list this reads was a setup.py change measured here and then undone (no difference): with
# today's setup.py the "plain" copy equals the compiled one.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PART=${1:-threads}  # threads | profile (the second call reuses the first's build when the machine is still warm)
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
# the interpreted copy: the same tree without the compiled plain-Python modules
rm -rf /tmp/plain && mkdir /tmp/plain && tar --exclude=.gl --exclude=.whl -cf - . | tar -xf - -C /tmp/plain
for m in $(python3 - <<'PY'
import ast
tree = ast.parse(open("setup.py").read())
for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED_PYTHON":
        for elt in node.value.elts:
            print(elt.value[:-3])
PY
); do rm -v /tmp/plain/$m.cpython-*.so; done
MAIN=$PWD
W=bench/results/2026-12-01-s9/where_time.py
if [ "$PART" = threads ]; then
for round in 1 2 3; do
  for tree in plain compiled; do
    if [ $tree = plain ]; then D=/tmp/plain; else D=$MAIN; fi
    echo "== round $round $tree end_to_end"
    (cd $D && PYTHONPATH=/tmp/site:$D timeout 90 python3 $W 1,2,4,8 end_to_end 1500)
    echo "== round $round $tree replay_and_read"
    (cd $D && PYTHONPATH=/tmp/site:$D timeout 90 python3 $W 1,4 replay_and_read 1500)
  done
done
fi
if [ "$PART" = profile ]; then
for round in 1 2; do
  for tree in plain compiled; do
    if [ $tree = plain ]; then D=/tmp/plain; else D=$MAIN; fi
    echo "== round $round $tree profile overhead"
    (cd $D && PYTHONPATH=/tmp/site:$D timeout 200 python3 -m bench --model mlp16 --profile-overhead --iterations 400 2>&1 | tail -12)
  done
done
echo "== compiled: the threads bench"
PYTHONPATH=/tmp/site:$MAIN timeout 240 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 2>&1 | tail -30
fi
