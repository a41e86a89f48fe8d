"""Run ``python -m bench`` with the short native calls made under the device's lock releasing the GIL again (the
encoded-ahead submit, a read's copy submit, writes), as before session 8's keep-GIL change: the A/B of
gpu_final.sh (run 11).  Usage: python release_gil_bench.py <bench arguments>.  The A/B showed no throughput gain
from keeping the GIL and a worse p99 (K=8 end_to_end p99 3.4x p50 kept, 2.2-2.4x released), so the keep-GIL
calls were removed after it: the settings below no longer exist (this script then runs the bench unchanged)."""

from __future__ import annotations

import runpy
import sys

from ortgpu_core.backends import _wgpu_encode_ahead, _wgpu_readback, wgpu_native

setattr(_wgpu_encode_ahead, "_KEEP_GIL_SUBMIT", False)  # noqa: B010 - settings that may not exist
setattr(_wgpu_readback, "_KEEP_GIL_COPY", False)  # noqa: B010
setattr(wgpu_native, "_KEEP_GIL_WRITE_BYTES", -1)  # noqa: B010
sys.argv = ["bench", *sys.argv[1:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)
