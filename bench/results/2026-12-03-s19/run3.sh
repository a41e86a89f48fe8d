# Session 19, H200 call 3: the median's split (floor_split.py), two processes.
source bench/results/2026-12-03-s16/device_setup.sh
mkdir -p $OUT/run3
for i in 1 2; do
  ITER=3000 python3 bench/results/2026-12-03-s19/floor_split.py > $OUT/run3/floor_$i.txt 2>&1
  cat $OUT/run3/floor_$i.txt
done
