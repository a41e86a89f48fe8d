#!/usr/bin/env bash
# What one GPU-machine session runs (see ../shared/GPU.md): set-up, then benchmarks, then the wgpu test suite.
# Usage on the device machine, from the repository root, with .gl and .whl (or out/sites) carried:
#   [OUT=dir] [ARITH=1] [SWEEP=shapes] [PROFILE="model:batch ..."] [ZOO=names [ZOO_DTYPE=float16]]
#   [SERVE="mlp16 SOURCE:NAME ..." [REPLICAS=1,2,4] [SECONDS_EACH=5] [SERVE_S=280] [INGRESS="proxy haproxy"]
#    [SERVE_RUNTIMES=ortgpu,onnxruntime]]  (carry out/sites, see device_sites.sh)
#   [TRANSFERS=16,64 [COPY_THREADS="4 8"]] [TESTS=seconds TEST_ARGS=...] bash bench/gpu_session.sh [model:batch ...]
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
RAYSITE=""
if [ -f out/sites/sites.tar.xz ]; then  # bench/device_sites.sh: the wheels installed, and Ray Serve's packages
  tar -xJf out/sites/sites.tar.xz -C /tmp || exit 1
  [ -z "${SERVE:-}" ] || RAYSITE=/tmp/raysite:  # only for --serve: the other benches keep the machine's packages
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$RAYSITE$PWD PYTHONUNBUFFERED=1
FINAL=${OUT:-out}; OUT=$(mktemp -d); mkdir -p "$FINAL"
trap 'tar -czf "$FINAL/results.tgz" -C "$OUT" . ; cat "$OUT"/*.txt > "$FINAL/summary.txt" 2>/dev/null' EXIT
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
if [ -n "${ARITH:-}" ]; then  # the multiply-add rates the kernels' TFLOP/s are read against
  timeout 120 python3 -m bench.arithmetic 2>"$OUT/arithmetic.err" | tee "$OUT/arithmetic.txt"
fi
if [ -n "${SWEEP:-}" ]; then  # e.g. SWEEP=gemv: the kernel variants of those shapes, before the models
  timeout 300 python3 -m bench.sweep_kernels --shapes "$SWEEP" --json "$OUT/sweep.json" 2>"$OUT/sweep.err" | tee "$OUT/sweep.txt"
fi
if [ -n "${TRANSFERS:-}" ]; then  # e.g. TRANSFERS=16,64 [COPY_THREADS="4 8"]: the copies, then a 16 MB copy's phases
  for threads in ${COPY_THREADS:-default}; do
    arg=""; [ "$threads" = default ] || arg="--copy-threads $threads"
    timeout 120 python3 -m bench.transfers --mb "$TRANSFERS" $arg --iterations 25 --json "$OUT/transfers_$threads.json" \
      2>>"$OUT/transfers.err" | tee "$OUT/transfers_$threads.txt"
  done
  timeout 120 python3 -m bench.transfers --mb 16 --phases --iterations 25 2>>"$OUT/transfers.err" | tee "$OUT/phases.txt"
fi
for spec in "$@"; do
  model=${spec%%:*}; batch=${spec##*:}
  iterations=200; [ "$model" = mlp16 ] || iterations=60
  extra=""; [ "$model" = mlp16 ] && [ "$batch" = 1 ] && extra="--overhead"
  timeout 240 python3 -m bench --model "$model" --batch "$batch" --capture both --vs onnxruntime --iterations $iterations \
    --warmup 20 $extra --json "$OUT/${model}_b${batch}.json" 2>"$OUT/${model}_b${batch}.err" | tee "$OUT/${model}_b${batch}.txt"
done
for spec in ${PROFILE:-}; do
  model=${spec%%:*}; batch=${spec##*:}
  timeout 120 python3 -m bench.profile --model "$model" --batch "$batch" --json "$OUT/profile_${model}_b${batch}.json" \
    2>"$OUT/profile_${model}_b${batch}.err" | tee "$OUT/profile_${model}_b${batch}.txt"
done
if [ -n "${ZOO:-}" ]; then  # architectures against torch (the machine's python3 has it), e.g. ZOO=default
  timeout 1800 python3 -m bench --zoo "$ZOO" --dtype "${ZOO_DTYPE:-float32}" --iterations 50 --warmup 10 --rounds 5 \
    --json "$OUT/zoo_${ZOO_DTYPE:-float32}.json" 2>"$OUT/zoo.err" | grep -v "round [0-9]*/" | tee "$OUT/zoo.txt"
fi
for model in ${SERVE:-}; do  # e.g. SERVE="mlp16 torchvision:resnet50" (needs out/sites): the --serve load test
  for ingress in ${INGRESS:-proxy}; do  # INGRESS="proxy haproxy": Serve's Python proxy, Ray's HAProxy ingress
    tag=${model//[:\/.]/_}_$ingress
    timeout "${SERVE_S:-280}" python3 -m bench --serve --model "$model" --replicas "${REPLICAS:-1,2,4}" \
      --seconds "${SECONDS_EACH:-5}" --ingress "$ingress" --serve-runtimes "${SERVE_RUNTIMES:-ortgpu,onnxruntime}" \
      --json "$OUT/serve_$tag.json" 2>"$OUT/serve_$tag.err" | grep "^|" | tee "$OUT/serve_$tag.txt"
  done
done
if [ -n "${TESTS:-}" ]; then
  timeout "${TESTS}" python3 -m pytest -q --backend=wgpu -p no:cacheprovider --deselect tests/test_typing.py $TEST_ARGS > "$OUT/tests.log" 2>&1
  tail -60 "$OUT/tests.log" > "$OUT/tests.txt"
  tail -5 "$OUT/tests.txt"
fi
