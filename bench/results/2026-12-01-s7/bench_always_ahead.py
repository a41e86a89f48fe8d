"""Run ``python -m bench`` with encoding ahead never skipped (``DeviceLock.contended`` always False), as before
session 7's skip-while-contended: the A/B for the threads bench.  Usage: python bench_always_ahead.py <bench args>.
Ran (gpu_ab_ahead.sh) against the commit that had the skip; always encoding ahead was faster at K = 2 and 4 in all
four pairs, so the skip was removed after, and the property set below no longer exists on DeviceLock."""

from __future__ import annotations

import runpy
import sys

from ortgpu_core.backends._device_lock import DeviceLock

setattr(DeviceLock, "contended", property(lambda self: False))
sys.argv = ["bench", *sys.argv[1:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)
