#!/usr/bin/env bash
# H200 session 7: confirmation at aa5b28a (an encode-ahead job stays registered until kept or released): the
# captured mlp16 threads bench once, and the encode-ahead/thread tests on the wgpu backend.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
timeout 70 python3 -m bench --model mlp16 --batch 1 --threads 1,2,4,8 --capture on --iterations 500 --warmup 50 \
  --json "$OUT/threads.json" 2> "$OUT/threads.err" | grep "capture on\|ceiling"
timeout 100 python3 -m pytest -q --backend=wgpu -p no:cacheprovider tests/test_encode_ahead_threads.py \
  tests/test_wait_unlocked.py tests/test_device_loss_threads.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -5
