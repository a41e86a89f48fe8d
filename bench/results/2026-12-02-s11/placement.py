"""Session 11 diagnostic: `python -m bench` with every wgpu device's timestamp placement set first (where the
profiler's timestamp records go: NativeTable.timestamp_placement), for an A/B of profiling's cost.  The knob was
only in commit f84bb87 (removed after this A/B showed no difference): run it at that commit.

Usage: python bench/results/2026-12-02-s11/placement.py PLACEMENT [bench arguments...]"""

from __future__ import annotations

import sys

from bench.__main__ import main
from ortgpu_core.backends import wgpu_native

placement = sys.argv[1]
original_init = wgpu_native.WgpuDevice.__init__


def init(self: wgpu_native.WgpuDevice, *args: object, **kwargs: object) -> None:
    original_init(self, *args, **kwargs)
    setattr(self._native_table, "timestamp_placement", placement)  # (only at f84bb87: see the docstring)


wgpu_native.WgpuDevice.__init__ = init  # type: ignore[method-assign]
print(f"timestamp placement: {placement}", flush=True)
sys.exit(main(sys.argv[2:]))
