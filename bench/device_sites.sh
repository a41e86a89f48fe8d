#!/usr/bin/env bash
# Pack what a GPU-machine session needs for `python -m bench --serve` (Ray Serve is not on that machine, which has
# no network) into one file under the 64 MiB a run may carry: out/sites/sites.tar.xz, holding site/ (the wheels of
# ../shared/tools/device-prep.sh, installed for Python 3.12) and raysite/ (ray[serve] and what it needs that the
# machine's PyTorch/transformers/onnx environment does not already have). Binaries are stripped and the parts of
# Ray that Serve does not use are left out. bench/gpu_session.sh unpacks it and puts raysite before the machine's own
# site-packages: Ray gets the versions it was resolved with (its generated gRPC code checks grpcio's), while the
# packages torch and onnx share with it (numpy, protobuf and the others removed below) stay the machine's.
# Usage, from the repository root, after device-prep.sh: bash bench/device_sites.sh; then carry [".gl", "out/sites"].
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
test -d .whl || { echo "run ../shared/tools/device-prep.sh first (it makes .whl)"; exit 1; }
RAY=${RAY:-ray[serve]==2.60.0}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
pip_target() {
  python3 -m pip install -q --target "$1" --python-version 3.12 --implementation cp --only-binary=:all: $plat "${@:2}" 2>&1 |
    { grep -v "^WARNING" || true; }
}
pip_target "$work/site" --no-deps .whl/*.whl
pip_target "$work/raysite" "$RAY"
# onnxruntime's optional tools; numpy, protobuf and the packages the machine's torch, transformers and onnx need
# (it has them); the parts of Ray that Serve does not use.
rm -rf "$work"/site/onnxruntime/{tools,transformers,quantization}
( cd "$work/raysite"
  for package in numpy protobuf typing_extensions packaging filelock jinja2 markupsafe requests urllib3 idna \
    certifi charset_normalizer yaml pyyaml; do rm -rf "$package" "$package"-*.dist-info "$package".libs; done
  rm -rf google/protobuf google/_upb bin cryptography* virtualenv* distlib* uvloop* \
    ray/{jars,rllib,data,tune,train,llm} ray/dashboard/client/build/static/js/*.map
  find . -name __pycache__ -prune -exec rm -rf {} + )
find "$work" -name "*.so" -exec strip {} + 2>/dev/null || true
strip "$work"/raysite/ray/core/src/ray/raylet/raylet "$work"/raysite/ray/core/src/ray/gcs/gcs_server
mkdir -p out/sites
tar -cf - -C "$work" site raysite | xz -T0 -9 > out/sites/sites.tar.xz
size=$(stat -c %s out/sites/sites.tar.xz)
echo "out/sites/sites.tar.xz: $((size >> 20)) MiB"
[ "$size" -lt $((62 << 20)) ] || { echo "too large to carry with .gl (64 MiB in all)"; exit 1; }
