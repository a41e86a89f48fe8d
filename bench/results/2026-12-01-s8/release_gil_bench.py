"""Run ``python -m bench`` with the short native calls made under the device's lock releasing the GIL again (the
encoded-ahead submit, a read's copy submit, writes), as before session 8's keep-GIL change: the A/B of
gpu_final.sh.  Usage: python release_gil_bench.py <bench arguments>."""

from __future__ import annotations

import runpy
import sys

from ortgpu_core.backends import _wgpu_encode_ahead, _wgpu_readback, wgpu_native

_wgpu_encode_ahead._KEEP_GIL_SUBMIT = False
_wgpu_readback._KEEP_GIL_COPY = False
wgpu_native._KEEP_GIL_WRITE_BYTES = -1
sys.argv = ["bench", *sys.argv[1:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)
