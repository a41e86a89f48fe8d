"""Run ``python -m bench`` with profiled steps' timestamps written between compute passes (each one ending the pass),
as before session 7's in-pass timestamps: the A/B for ``--profile-overhead``.  Usage: python
bench_no_pass_timestamps.py <bench arguments>"""

from __future__ import annotations

import runpy
import sys
from typing import Any

from ortgpu_core.backends.wgpu_native import WgpuDevice

_original_init = WgpuDevice._init


def _init_without_pass_timestamps(self: WgpuDevice, *args: Any) -> None:
    _original_init(self, *args)
    self._native_table.timestamps_in_passes = False


WgpuDevice._init = _init_without_pass_timestamps  # type: ignore[method-assign,assignment]
sys.argv = ["bench", *sys.argv[1:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)
