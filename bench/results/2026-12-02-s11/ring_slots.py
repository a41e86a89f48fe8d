"""Session 11 diagnostic: `python -m bench` with the profiler's ring of N slots (``_profiling.RING_SLOTS``).

Usage: python bench/results/2026-12-02-s11/ring_slots.py N [bench arguments...]"""

from __future__ import annotations

import sys

from bench.__main__ import main
from ortgpu import _profiling

_profiling.RING_SLOTS = int(sys.argv[1])
print(f"ring slots: {_profiling.RING_SLOTS}", flush=True)
sys.exit(main(sys.argv[2:]))
