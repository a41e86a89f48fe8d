# Session 19, H200 call 7: where a record's start-up goes (startup_split.py), and --profile-overhead with the
# start-up reported apart.
source bench/results/2026-12-03-s16/device_setup.sh
mkdir -p $OUT/run7
LAPS=4 python3 bench/results/2026-12-03-s19/startup_split.py > $OUT/run7/startup.txt 2>&1
cat $OUT/run7/startup.txt
python3 -m bench --model mlp16 --profile-overhead --iterations 400 > $OUT/run7/profile.txt 2>&1
grep -A6 "profiling overhead" $OUT/run7/profile.txt
