"""Run ``python -m bench`` with the spinning poller pausing ``<us>`` microseconds between two non-blocking polls
(``_wgpu_readback.DEFAULT_POLL_PAUSE_US``): the A/B of session 8 (gpu_ab_callbacks.sh, run 1).  Usage: python
bench_pause.py <us> <bench arguments>.  The A/B showed no gain (10 us: the same as none within the noise; 30 us:
slower at K=1), and the pause was removed after it: the setting below no longer exists (this script then runs
the bench unchanged)."""

from __future__ import annotations

import runpy
import sys

from ortgpu_core.backends import _wgpu_readback

setattr(_wgpu_readback, "DEFAULT_POLL_PAUSE_US", float(sys.argv[1]))  # noqa: B010 - a setting that may not exist
sys.argv = ["bench", *sys.argv[2:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)
