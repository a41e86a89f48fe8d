"""Run ``python -m bench`` with every native call under the device's lock releasing the GIL again (as before
session 7's keep-GIL calls; map request and copy-out excepted): the A/B for the threads bench.  Usage: python
bench_release_gil.py <bench arguments>.  Ran (gpu_ab_gil.sh) against the code of the commit that added it; the A/B
showed no difference, the keep-GIL submits and writes were removed after, and the two settings below no longer exist
(this script then runs the bench unchanged)."""

from __future__ import annotations

import runpy
import sys

from ortgpu_core.backends import _wgpu_encode_ahead, wgpu_native

setattr(_wgpu_encode_ahead, "_KEEP_GIL_RECORDS", -1)
setattr(wgpu_native, "_KEEP_GIL_WRITE_BYTES", -1)
sys.argv = ["bench", *sys.argv[1:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)
