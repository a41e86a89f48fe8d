# Session 18, H200: the profiling changes measured and tested (run from the repository root, .gl and .whl carried).
source bench/results/2026-12-03-s16/device_setup.sh
mkdir -p $OUT/run
for i in 1 2; do
  HINTS=1 python3 bench/results/2026-12-03-s18/profile_split.py > $OUT/run/split_$i.txt 2>&1
  tail -16 $OUT/run/split_$i.txt
done
for i in 1 2; do
  python3 -m bench --model mlp16 --profile-overhead --iterations 400 > $OUT/run/profile_$i.txt 2>&1
  grep -A4 "profiling overhead" $OUT/run/profile_$i.txt
done
timeout ${TEST_SECONDS:-200} python3 -m pytest -q -x -p no:cacheprovider --backend=wgpu tests/test_profiling.py \
  tests/test_profiling_async_ring.py tests/test_encode_ahead_threads.py tests/test_backend_protocol.py \
  tests/test_capture.py 2>&1 | tail -5 | tee $OUT/run/tests.txt
