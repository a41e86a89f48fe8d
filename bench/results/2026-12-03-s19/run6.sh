# Session 19, H200 call 6: as call 5, with the hint's validation after the submit and the slots' per-step query
# sets made on first use: ring_and_sample twice, --profile-overhead twice, the tests on wgpu.
source bench/results/2026-12-03-s16/device_setup.sh
mkdir -p $OUT/run6
for i in 1 2; do
  ITER=3000 ARMS="whole64 d10@64 d50@64 d100@64" \
    python3 bench/results/2026-12-03-s19/ring_and_sample.py > $OUT/run6/ring_$i.txt 2>&1
  cat $OUT/run6/ring_$i.txt
done
for i in 1 2; do
  python3 -m bench --model mlp16 --profile-overhead --iterations 400 > $OUT/run6/profile_$i.txt 2>&1
  grep -A4 "profiling overhead" $OUT/run6/profile_$i.txt
done
timeout 240 python3 -m pytest -q -x -p no:cacheprovider --backend=wgpu tests/test_profiling.py \
  tests/test_profiling_async_ring.py tests/test_encode_ahead_threads.py tests/test_backend_protocol.py \
  tests/test_capture.py tests/test_backend_wgpu.py tests/test_profiling_bench.py 2>&1 | tail -5 | tee $OUT/run6/tests.txt
