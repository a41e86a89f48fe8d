#!/usr/bin/env bash
# H200 session 6, run 3: issue 14 with PyTorch CUDA (torch CUDA tensors as run feeds and update_inplace sources; the
# route taken is logged), the transfer/DLPack/adapter/optional test files on the H200, and the node tests again.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 setup.py -q build_ext --inplace -j 8 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
timeout 120 python3 bench/results/2026-11-30-s6/torch_cuda_feeds.py 2>&1 | tee "$OUT/torch_cuda_feeds.txt"
timeout 240 python3 -m pytest -q -s --backend=wgpu -p no:cacheprovider tests/test_dlpack.py tests/test_transfer_routes.py \
  tests/test_adapters.py tests/test_transfer.py tests/test_optional.py tests/test_control_flow.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "torch CUDA|passed|failed|^FAILED|^E  " "$OUT/tests.log" | tail -12
timeout 200 python3 tests/test_conformance.py -j 8 > "$OUT/conformance.txt" 2>&1; echo "conformance rc=$?"
grep -E "^TOTAL|^passed" "$OUT/conformance.txt"
