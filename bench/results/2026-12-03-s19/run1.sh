# Session 19, H200 call 1: the ring's size and the per-step sample (three processes), then the threads bench once.
source bench/results/2026-12-03-s16/device_setup.sh
mkdir -p $OUT/run1
for i in 1 2 3; do
  ITER=3000 python3 bench/results/2026-12-03-s19/ring_and_sample.py > $OUT/run1/ring_$i.txt 2>&1
  cat $OUT/run1/ring_$i.txt
done
timeout 240 python3 -m bench --model mlp16 --batch 1 --threads 1,4,8 --capture on --iterations 400 --warmup 50 \
  > $OUT/run1/threads.txt 2>&1
tail -25 $OUT/run1/threads.txt
