"""Session 19 (H200): where a profiling record's start-up goes.  Captured mlp16 (batch 1); an unprofiled and a
profiled session (default sample) step in turn (update_inplace + replay + to_numpy) for LAPS turns of the ring; the
profiled one's device and program calls are wrapped with timers.  Printed per turn of the ring: the profiled steps'
extra time over the unprofiled ones (sum, ms), and the time spent in each wrapped call (sum, ms; n calls).

python3 startup_split.py   (LAPS=4)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
import ortgpu  # noqa: E402
import ortgpu._profiling as profiling  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402

LAPS = int(os.environ.get("LAPS", "4"))
model, shapes = build_model("mlp16", 1)
feeds = model_feeds("mlp16", model, shapes)
model_bytes = model.SerializeToString()
env = ortgpu.Env()
off = OrtgpuArms(model_bytes, feeds, env)
on = OrtgpuArms(model_bytes, feeds, env)
off.capture()
on.capture()
for _ in range(50):
    off.captured_end_to_end()
    on.captured_end_to_end()
spent: dict[str, list[float]] = defaultdict(list)
device: Any = on._backend_device


def wrap(owner: Any, name: str, label: str) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label].append(time.perf_counter() - start)

    setattr(owner, name, timed)


for name in ("_validate_for_submit", "_encode_and_submit", "_submit_unlocked", "_encode_ahead", "_job_for_next"):
    wrap(device, name, name)
for name in ("read_async", "read_async_finish", "create_query_set", "submit"):
    wrap(device, name, name)
on.session.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
on.session.start_profiling()
runner: Any = on.session._runner
wrap(runner, "profile_replay", "profile_replay (all)")
slots = profiling.RING_SLOTS
print(f"{LAPS} turns of a ring of {slots}; default sample (1 in {profiling.DEFAULT_DETAIL_EVERY} per step)")
for lap in range(LAPS):
    spent.clear()
    extra = []
    for _ in range(slots):
        start = time.perf_counter()
        off.captured_end_to_end()
        middle = time.perf_counter()
        on.captured_end_to_end()
        end = time.perf_counter()
        extra.append((end - middle) - (middle - start))
    print(
        f"turn {lap}: profiled steps took {sum(extra) * 1e3:.2f} ms more in all (median {statistics.median(extra) * 1e6:.1f} us)"
    )
    for label, values in sorted(spent.items()):
        print(f"    {label:22s} {sum(values) * 1e3:8.3f} ms  n {len(values):4d}  max {max(values) * 1e6:8.1f} us")
os.remove(on.session.end_profiling())
