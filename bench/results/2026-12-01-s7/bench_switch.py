"""Run ``python -m bench`` with ``sys.setswitchinterval(float(argv[1]))`` (session 7: does the GIL's switch interval
change the threads bench?).  Usage: python bench_switch.py SECONDS <bench arguments>"""

from __future__ import annotations

import runpy
import sys

sys.setswitchinterval(float(sys.argv[1]))
sys.argv = ["bench", *sys.argv[2:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)
