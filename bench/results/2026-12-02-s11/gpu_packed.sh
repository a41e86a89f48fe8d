#!/usr/bin/env bash
# H200 session 11: profiling's cost with the ring's whole runs packed in one query set (adjacent slots resolved by
# one command) against HEAD's per-slot resolves (.ab_s11/before: HEAD's _profiling.py and _executor.py), and the
# packed ring with 32 slots; rounds interleaved, one process per run; then profile_tail.py on the packed ring.
set -u
ROUNDS=${1:-3}
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
rm -rf /tmp/before && mkdir /tmp/before && tar --exclude=.gl --exclude=.whl -cf - . | tar -xf - -C /tmp/before
cp .ab_s11/before/_profiling.py .ab_s11/before/_executor.py /tmp/before/ortgpu/
MAIN=$PWD
B="--model mlp16 --profile-overhead --iterations 400"
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round before"
  (cd /tmp/before && PYTHONPATH=/tmp/site:/tmp/before timeout 90 python3 -m bench $B --json "$OUT/before_$round.json" 2>>"$OUT/err.txt" | grep -A4 "^step")
  echo "== round $round packed"
  PYTHONPATH=/tmp/site:$MAIN timeout 90 python3 -m bench $B --json "$OUT/packed_$round.json" 2>>"$OUT/err.txt" | grep -A4 "^step"
  echo "== round $round packed, 32 slots"
  PYTHONPATH=/tmp/site:$MAIN timeout 90 python3 bench/results/2026-12-02-s11/ring_slots.py 32 $B --json "$OUT/packed32_$round.json" 2>>"$OUT/err.txt" | grep -A4 "^step"
done
echo "== profile_tail, packed"
PYTHONPATH=/tmp/site:$MAIN timeout 120 python3 bench/results/2026-12-02-s11/profile_tail.py 4000
echo "== profile_tail, before"
(cd /tmp/before && PYTHONPATH=/tmp/site:/tmp/before timeout 120 python3 bench/results/2026-12-02-s11/profile_tail.py 4000)
