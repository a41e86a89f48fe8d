"""Session 17 (H200): what the two timestamps (and their resolve) around a replay cost a step, without the
profiler.  One captured mlp16 (batch 1); per iteration, in turn, five steps of update_inplace + a submit + to_numpy:
  graph     graph.replay() (the library's path)
  plain     the same program's list recorded again (program.record), submitted with the graph's read-ahead ranges
  ts        that list with a timestamp before and after (program.record_timed, per_step=False), no resolve
  ts+res    as ts, then the resolve of the two queries into a buffer (what a profiled replay submits)
  res       plain + the resolve only (of queries written by an earlier ts list)
Printed: p50 and mean per arm (us) and the ratio to plain.

python3 timestamp_parts.py   (ITER=2000)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
import ortgpu  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402

ITER = int(os.environ.get("ITER", "2000"))
model, shapes = build_model("mlp16", 1)
feeds = model_feeds("mlp16", model, shapes)
env = ortgpu.Env()
arms = OrtgpuArms(model.SerializeToString(), feeds, env)
graph = arms.capture()
runner: Any = arms.session._runner
seen: dict[str, Any] = {}


class Spy:
    def profile_replay(self, graph_: Any, program: Any, reads: Any = None) -> int:
        seen["program"] = program
        return 0


# catch the graph's program: replay() hands it to its owner's profile_replay while a profiler is set
runner.profiler = object()
original = runner.profile_replay
runner.profile_replay = Spy().profile_replay
graph.replay()
runner.profile_replay = original
runner.profiler = None
program = seen["program"]
device: Any = arms._backend_device
binding = graph.binding
inputs = {n: v._device_buffer for n, v in binding.inputs().items() if n not in program.plan.unread_inputs}
outputs = {n: v._device_buffer for n, v in binding.outputs().items()}
ranges = graph._read_ahead_ranges()
query_set = device.create_query_set(2, label="s17 timestamps")
resolve = device.create_query_resolve_buffer(256)
plain = program.record(inputs, outputs).freeze()
ts, _ = program.record_timed(inputs, outputs, query_set, per_step=False)
ts = ts.freeze()
ts_res, _ = program.record_timed(inputs, outputs, query_set, per_step=False)
ts_res.add_resolve(query_set, 0, 2, resolve, 0)
ts_res = ts_res.freeze()
res = program.record(inputs, outputs)
res.add_resolve(query_set, 0, 2, resolve, 0)
res = res.freeze()


def submitting(commands: Any) -> Callable[[], object]:
    def step() -> object:
        arms._upload()
        device.submit(commands, ranges)
        return arms._read()

    return step


steps: dict[str, Callable[[], object]] = {
    "graph": arms.captured_end_to_end,
    "plain": submitting(plain),
    "ts": submitting(ts),
    "ts+res": submitting(ts_res),
    "res": submitting(res),
}
reference = arms.captured_end_to_end()
for name, step in steps.items():
    out: Any = None
    for _ in range(50):
        out = step()
    assert all((a == b).all() for a, b in zip(out, reference)), name
times: dict[str, list[float]] = {name: [] for name in steps}
for _ in range(ITER):
    for name, step in steps.items():
        start = time.perf_counter()
        step()
        times[name].append(time.perf_counter() - start)
base_p50 = statistics.median(times["plain"])
base_mean = statistics.fmean(times["plain"])
print(f"{'arm':8} {'p50 us':>8} {'mean us':>8} {'p50/plain':>10} {'mean/plain':>11}")
for name, values in times.items():
    p50, mean = statistics.median(values), statistics.fmean(values)
    print(f"{name:8} {p50 * 1e6:8.1f} {mean * 1e6:8.1f} {p50 / base_p50:10.3f} {mean / base_mean:11.3f}")
device.release_query_set(query_set)
device.destroy_buffer(resolve)
