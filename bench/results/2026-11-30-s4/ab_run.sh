#!/usr/bin/env bash
# H200 session 4, call 1: build this tree and the tree before session 4 (c69c838, unpacked into .ab_old), then time the
# captured 16-layer MLP step (bench mlp16 b1, capture on and off) alternately in each, three times, same machine.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
(cd .ab_old && PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build_old.log" 2>&1; echo "old build rc=$?")
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build_new.log" 2>&1 || { tail -30 "$OUT/build_new.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2 3; do
  for tree in new old; do
    dir=$PWD; [ "$tree" = old ] && dir=$PWD/.ab_old
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 100 python3 -m bench --model mlp16 --batch 1 --capture both \
      --iterations 300 --warmup 30 --json "$OUT/ab_${tree}_$i.json" > "$OUT/ab_${tree}_$i.txt" 2> "$OUT/ab_${tree}_$i.err")
    echo "$tree $i rc=$?"; grep -E "capture on|capture off" "$OUT/ab_${tree}_$i.txt" | head -4
  done
done
