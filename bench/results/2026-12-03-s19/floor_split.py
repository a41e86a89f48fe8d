"""Session 19 (H200): what a profiled replay pays at the median, split.  Captured mlp16 (batch 1), one Env.  Per
iteration, in turn (order alternating), each arm does update_inplace + its call + to_numpy:
  off      graph.replay(), unprofiled
  on       graph.replay(), profiled, every replay timed whole (ring of SLOTS slots)
  ts       no profiler: SLOTS lists of the work with two timestamps each (slot s: queries 2s, 2s+1 of one query set,
           nothing resolved), submitted in turn through the device, each naming the next (encode_next)
  ts1      as ts with one list (SLOTS=1)
  onP, tsP as on and ts with the device's native table's ``timestamps_open_pass`` on while they run (a timestamp with
           no pass open begins the compute pass and is written inside it: both of a run's timestamps then lie in the
           pass); each arm's command buffers are encoded in its own call (ahead, after its submit), so the switch
           holds for its lists only
Printed: call p50 (upload + call, us), step p50 and mean (us), their ratios to off.

python3 floor_split.py   (ITER=2000 SLOTS=64)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "bench/results/2026-12-03-s18"))
from s18_program import GraphProgram  # noqa: E402

import ortgpu  # noqa: E402
import ortgpu._profiling as profiling  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402

ITER = int(os.environ.get("ITER", "2000"))
SLOTS = int(os.environ.get("SLOTS", "64"))
profiling.RING_SLOTS = SLOTS
model, shapes = build_model("mlp16", 1)
feeds = model_feeds("mlp16", model, shapes)
model_bytes = model.SerializeToString()
folder = tempfile.mkdtemp()
env = ortgpu.Env()
arms: dict[str, OrtgpuArms] = {}
calls: dict[str, Callable[[], None]] = {}
open_pass: dict[str, bool] = {}


def replaying(name: str, profiled: bool = False) -> OrtgpuArms:
    a = arms[name] = OrtgpuArms(model_bytes, feeds, env)
    calls[name] = a.capture().replay
    if profiled:
        a.session.profile_file_prefix = os.path.join(folder, "p")
        a.session.start_profiling(10**9)
    return a


off = replaying("off")
caught = GraphProgram(off)
program, device, inputs, outputs, ranges = caught.program, caught.device, caught.inputs, caught.outputs, caught.ranges
table: Any = device._native_table
replaying("on", True)


def rotating(name: str, count: int) -> None:
    query_set = device.create_query_set(2 * count, label="s19 spans")
    lists = [
        program.record_timed(inputs, outputs, query_set, per_step=False, first_query=2 * s)[0].freeze()
        for s in range(count)
    ]
    turn = [0]

    def call() -> None:
        index = turn[0]
        turn[0] = (index + 1) % count
        device.submit(lists[index], ranges, lists[turn[0]] if count > 1 else None)

    arms[name] = off
    calls[name] = call


rotating("ts", SLOTS)
rotating("ts1", 1)
replaying("onP", True)
open_pass["onP"] = True
rotating("tsP", SLOTS)
open_pass["tsP"] = True
names = list(calls)
reference = off.captured_end_to_end()


def step(name: str) -> tuple[float, float]:
    a = arms[name]
    table.timestamps_open_pass = open_pass.get(name, False)
    start = time.perf_counter()
    a._upload()
    calls[name]()
    middle = time.perf_counter()
    a._read()
    return middle - start, time.perf_counter() - start


for name in names:  # warm up: every list built, validated and used once; results checked
    for _ in range(3 * SLOTS):
        step(name)
    out = arms[name]._read()
    assert all((x == y).all() for x, y in zip(out, reference)), name
call_t: dict[str, list[float]] = {n: [] for n in names}
step_t: dict[str, list[float]] = {n: [] for n in names}
for index in range(ITER):
    for name in names if index % 2 == 0 else names[::-1]:
        c, s = step(name)
        call_t[name].append(c)
        step_t[name].append(s)
print(f"{ITER} interleaved iterations (order alternating), ring/lists of {SLOTS}")
print(f"{'arm':6} {'call p50':>9} {'step p50':>9} {'step mean':>9} {'p50/off':>8} {'mean/off':>9}")
b50, bmean = statistics.median(step_t["off"]), statistics.fmean(step_t["off"])
for name in names:
    p50, mean = statistics.median(step_t[name]), statistics.fmean(step_t[name])
    print(
        f"{name:6} {statistics.median(call_t[name]) * 1e6:9.1f} {p50 * 1e6:9.1f} {mean * 1e6:9.1f}"
        f" {p50 / b50:8.3f} {mean / bmean:9.3f}"
    )
for name in ("on", "onP"):
    os.remove(arms[name].session.end_profiling())
