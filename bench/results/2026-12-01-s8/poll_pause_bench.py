"""Run ``python -m bench`` with the spinning poller pausing ``<us>`` microseconds between two polls
(``_wgpu_readback._POLL_PAUSE_US``): the A/B of gpu_pause.sh (run 12).  Usage: python poll_pause_bench.py <us>
<bench arguments>.  A pause of 20 us was no better (K=4 end_to_end 3119/2516 vs 3545/2823 steps/s without), and
was removed after the A/B: the setting below no longer exists (this script then runs the bench unchanged)."""

from __future__ import annotations

import runpy
import sys

from ortgpu_core.backends import _wgpu_readback

setattr(_wgpu_readback, "_POLL_PAUSE_US", float(sys.argv[1]))  # noqa: B010 - a setting that may not exist
sys.argv = ["bench", *sys.argv[2:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)
