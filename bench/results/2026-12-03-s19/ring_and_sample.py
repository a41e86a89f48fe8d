"""Session 19 (H200): a profiled replay's cost against the ring's size and the per-step sample.  Captured mlp16
(batch 1); per iteration, in turn (order alternating), each arm does update_inplace + graph.replay() + to_numpy(),
timed as a whole step; arms:
  off            an unprofiled session
  whole<S>       profiled, every replay timed whole (detail_every huge), a ring of S slots
  d<N>@<S>       profiled with one replay in N timed per step, a ring of S slots
Each profiled arm is warmed up with WARM replays first (every slot's lists built and validated); COLD=1 also prints
the first WARM replays' mean per arm (against off's).  Printed: step p50 and mean (us) and their ratios to off.

python3 ring_and_sample.py   (ITER=1500 WARM=400; ARMS="whole32 whole64 ..." to choose)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.getcwd())
import ortgpu  # noqa: E402
import ortgpu._profiling as profiling  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402

ITER = int(os.environ.get("ITER", "1500"))
WARM = int(os.environ.get("WARM", "400"))
ARMS = os.environ.get("ARMS", "whole32 whole64 whole128 d10@32 d10@128 d25@128 d50@64 d50@128 d100@128").split()

model, shapes = build_model("mlp16", 1)
feeds = model_feeds("mlp16", model, shapes)
env = ortgpu.Env()
model_bytes = model.SerializeToString()
folder = tempfile.mkdtemp()
arms: dict[str, OrtgpuArms] = {}
cold: dict[str, float] = {}


def step(a: OrtgpuArms) -> float:
    start = time.perf_counter()
    a.captured_end_to_end()
    return time.perf_counter() - start


off = arms["off"] = OrtgpuArms(model_bytes, feeds, env)
off.capture()
reference = off.captured_end_to_end()
for name in ARMS:
    every, slots = (10**9, int(name[5:])) if name.startswith("whole") else map(int, name[1:].split("@"))
    a = arms[name] = OrtgpuArms(model_bytes, feeds, env)
    a.capture()
    a.session.profile_file_prefix = os.path.join(folder, "p")
    profiling.RING_SLOTS = slots  # read when the graph's timer is made (its first profiled replay, below)
    a.session.start_profiling(every)
    cold_on, cold_off = [], []
    for _ in range(WARM):  # the first replays, interleaved with off's: every slot's lists are built meanwhile
        cold_on.append(step(a))
        cold_off.append(step(off))
    cold[name] = statistics.fmean(cold_on) / statistics.fmean(cold_off)
    profiler: Any = a.session._runner.profiler
    (timer,) = list(profiler._timers)
    assert timer.slots == slots, (name, timer.slots)
    out = a.captured_end_to_end()
    assert all((x == y).all() for x, y in zip(out, reference)), name
names = list(arms)
times: dict[str, list[float]] = {name: [] for name in names}
for index in range(ITER):
    for name in names if index % 2 == 0 else names[::-1]:
        times[name].append(step(arms[name]))
base = statistics.median(times["off"]), statistics.fmean(times["off"])
print(f"{ITER} interleaved iterations (order alternating) after {WARM} warm-up replays per profiled arm")
print(f"{'arm':10} {'p50 us':>8} {'mean us':>8} {'p50/off':>8} {'mean/off':>9} {'first WARM mean/off':>20}")
for name in names:
    p50, mean = statistics.median(times[name]), statistics.fmean(times[name])
    print(
        f"{name:10} {p50 * 1e6:8.1f} {mean * 1e6:8.1f} {p50 / base[0]:8.3f} {mean / base[1]:9.3f}"
        f" {cold.get(name, 1.0):20.3f}"
    )
for name in names[1:]:
    path = arms[name].session.end_profiling()
    os.remove(path)
