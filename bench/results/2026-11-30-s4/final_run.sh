#!/usr/bin/env bash
# H200 session 4, last call: build the tree as committed and the tree before session 4 (c69c838, unpacked into
# .ab_old); time mlp16 b1 (capture off/on) alternately in each, three times; bench mlp16 against onnxruntime's
# WebGPU EP in the same process; then the wgpu test suite (typing and run.sh's install checks need tools that machine
# lacks).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
(cd .ab_old && PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build_old.log" 2>&1; echo "old build rc=$?")
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for i in 1 2 3; do
  for tree in new old; do
    dir=$PWD; [ "$tree" = old ] && dir=$PWD/.ab_old
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 100 python3 -m bench --model mlp16 --batch 1 --capture both \
      --iterations 300 --warmup 30 > "$OUT/ab_${tree}_$i.txt" 2>/dev/null)
    echo "$tree $i rc=$?"; grep -E "^ortgpu capture (on|off) " "$OUT/ab_${tree}_$i.txt" | head -4
  done
done
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python3 -m bench --model mlp16 --batch 1 --capture both --vs onnxruntime --iterations 200 --warmup 20 \
  > "$OUT/mlp16_vs.txt" 2> /dev/null; echo "bench vs rc=$?"
grep -E "capture (on|off)|onnxruntime|ratio|x " "$OUT/mlp16_vs.txt" | head -16
timeout 300 python3 -m pytest -q --backend=wgpu -p no:cacheprovider --deselect tests/test_typing.py \
  --deselect tests/test_run_script.py > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
grep -E "passed|failed|Error" "$OUT/tests.log" | tail -8
