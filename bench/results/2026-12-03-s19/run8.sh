# Session 19, H200 call 8: the final code (ee61a9b: replay_and_read profiled as a replay with read-ahead outputs):
# ring_and_sample once, --profile-overhead twice, the tests on wgpu.
source bench/results/2026-12-03-s16/device_setup.sh
mkdir -p $OUT/run8
ITER=3000 ARMS="whole64 d10@64 d50@64" python3 bench/results/2026-12-03-s19/ring_and_sample.py > $OUT/run8/ring.txt 2>&1
cat $OUT/run8/ring.txt
for i in 1 2; do
  python3 -m bench --model mlp16 --profile-overhead --iterations 400 > $OUT/run8/profile_$i.txt 2>&1
  grep -A6 "profiling overhead" $OUT/run8/profile_$i.txt
done
timeout 200 python3 -m pytest -q -x -p no:cacheprovider --backend=wgpu tests/test_profiling.py \
  tests/test_profiling_async_ring.py tests/test_encode_ahead_threads.py tests/test_backend_protocol.py \
  tests/test_capture.py tests/test_backend_wgpu.py tests/test_profiling_bench.py 2>&1 | tail -3 | tee $OUT/run8/tests.txt
