# Session 19, H200 call 2: the median's split (floor_split.py), three processes (an older version of the script: two Envs, A and B with timestamps_open_pass; the arms at the A/B boundary, pyA and offB, paid a switch between the two devices).
source bench/results/2026-12-03-s16/device_setup.sh
mkdir -p $OUT/run2
for i in 1 2 3; do
  ITER=3000 python3 bench/results/2026-12-03-s19/floor_split.py > $OUT/run2/floor_$i.txt 2>&1
  cat $OUT/run2/floor_$i.txt
done
