"""Session 18 (H200): where using several command lists in turn costs a step.  Captured mlp16 (batch 1); the graph's
program recorded again as frozen lists submitted directly (``device.submit(list, read-ahead ranges)``), interleaved:
  plain1    one list, submitted every step
  plain32   32 copies of it, used in turn
  ts1       one list with two timestamps and their resolve
  ts32      32 such lists (32 query sets), used in turn
  plain32next  (HINT=1) plain32, each submit naming the next list as
            encode_next, so that its command buffer is encoded just before its use
Each step: update_inplace, the submit, to_numpy.  The device's methods are wrapped (the same wrappers in every arm)
and timed per step: ``_encode_and_submit`` (under the lock), ``_submit_unlocked`` (the native submit of the command
buffer encoded ahead), ``_encode_ahead`` (the next one, after the submit), ``read_buffer_into`` (to_numpy's read:
wait + copy).  Printed per arm: p50 and mean (us) of each part.

python3 rotation_split.py   (ITER=1500)
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s18_program import GraphProgram  # noqa: E402

ITER = int(os.environ.get("ITER", "1500"))
model, shapes = build_model("mlp16", 1)
feeds = model_feeds("mlp16", model, shapes)
env = ortgpu.Env()
arms = OrtgpuArms(model.SerializeToString(), feeds, env)
caught = GraphProgram(arms)
program, device = caught.program, caught.device
inputs, outputs, ranges = caught.inputs, caught.outputs, caught.ranges
resolve = device.create_query_resolve_buffer(256 * 32)
query_sets = [device.create_query_set(2, label="s18 timestamps") for _ in range(32)]


def plain_list(slot: int) -> Any:
    return program.record(inputs, outputs).freeze()


def timed_list(slot: int) -> Any:
    commands, _ = program.record_timed(inputs, outputs, query_sets[slot], per_step=False)
    commands.add_resolve(query_sets[slot], 0, 2, resolve, 256 * slot)
    return commands.freeze()


def rotating(n: int, make: Callable[[int], Any], hint: bool = False) -> Callable[[], None]:
    lists = [make(slot) for slot in range(n)]
    turn = [0]

    def call() -> None:
        arms._upload()
        turn[0] = (turn[0] + 1) % n
        if hint:
            device.submit(lists[turn[0]], ranges, encode_next=lists[(turn[0] + 1) % n])
        else:
            device.submit(lists[turn[0]], ranges)

    return call


calls = {
    "plain1": rotating(1, plain_list),
    "plain32": rotating(32, plain_list),
    "ts1": rotating(1, timed_list),
    "ts32": rotating(32, timed_list),
    **({"plain32next": rotating(32, plain_list, True)} if os.environ.get("HINT") else {}),
}
parts: dict[str, int] = {}


def wrap(name: str) -> None:
    method = getattr(device, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return method(*args, **kwargs)
        finally:
            parts[name] = parts.get(name, 0) + time.perf_counter_ns() - start

    setattr(device, name, wrapped)


for name in ("_encode_and_submit", "_submit_unlocked", "_encode_ahead", "read_buffer_into"):
    wrap(name)
for call in calls.values():
    for _ in range(100):
        call()
        arms._read()
results: dict[str, dict[str, list[int]]] = {name: {} for name in calls}
names = list(calls)
for index in range(ITER):
    for name in names if index % 2 == 0 else names[::-1]:
        parts.clear()
        start = time.perf_counter_ns()
        calls[name]()
        middle = time.perf_counter_ns()
        arms._read()
        end = time.perf_counter_ns()
        row = results[name]
        row.setdefault("call (upload+submit)", []).append(middle - start)
        row.setdefault("step", []).append(end - start)
        for key, value in parts.items():
            row.setdefault(key, []).append(value)
print(f"{ITER} interleaved iterations; us per step")
keys = ["call (upload+submit)", "_encode_and_submit", "_submit_unlocked", "_encode_ahead", "read_buffer_into", "step"]
print(f"{'arm':11} " + " ".join(f"{k[:18]:>18}" for k in keys))
for name, row in results.items():
    print(f"{name:11} " + " ".join(f"{statistics.median(row.get(k, [0])) / 1e3:18.1f}" for k in keys))
print("means")
for name, row in results.items():
    print(f"{name:11} " + " ".join(f"{statistics.fmean(row.get(k, [0])) / 1e3:18.1f}" for k in keys))
for query_set in query_sets:
    device.release_query_set(query_set)
device.destroy_buffer(resolve)
