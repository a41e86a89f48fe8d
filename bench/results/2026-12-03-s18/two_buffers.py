"""Session 18 (H200): would one list plus a small per-slot list, as two command buffers of one submission, avoid
what using 32 lists in turn costs?  Captured mlp16 (batch 1); the graph's program recorded again as frozen lists,
submitted through wgpu-native directly (``wgpuQueueSubmit`` of command buffers encoded ahead with
``CommandList.encode_native``, the next ones encoded right after each submit, as the backend does; no read-ahead:
to_numpy submits its own copy), interleaved:
  plain1    the work, one list
  plain32   32 copies of it, in turn
  ts1       the work with two timestamps and their resolve, one list
  ts32      32 such lists (a query set and a part of the resolve buffer each), in turn
  two1      the work with two timestamps (one query set) + a second command buffer with the resolve, one of each
  two32     the same work list every time + one of 32 resolve lists (each into its own part), in turn
Each step: update_inplace, the submit, to_numpy.  Printed per arm: p50 and mean (us) of the submit (the
wgpuQueueSubmit call) and of the step, and the step's p50 ratio to plain1.

python3 two_buffers.py   (ITER=1500)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.getcwd())
import ortgpu  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s18_program import GraphProgram  # noqa: E402

from ortgpu_core.backends._commands import CommandList  # noqa: E402

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
table = device.native_table
ffi, lib, queue = device._ffi, device._lib, device._queue


def plain(slot: int) -> CommandList:
    commands: CommandList = program.record(inputs, outputs)
    return commands.freeze()


def timed(slot: int, resolved: bool = True) -> CommandList:
    commands: CommandList = program.record_timed(inputs, outputs, query_sets[slot], per_step=False)[0]
    if resolved:
        commands.add_resolve(query_sets[slot], 0, 2, resolve, 256 * slot)
    return commands.freeze()


def resolving(slot: int) -> CommandList:
    commands = CommandList()
    commands.add_resolve(query_sets[0], 0, 2, resolve, 256 * slot)
    return commands.freeze()


class Arm:
    """Groups of lists submitted in turn, each group as one submission of its lists' command buffers."""

    def __init__(self, groups: list[list[CommandList]]) -> None:
        for group in groups:  # validated once, as the backend does for frozen lists
            for commands in group:
                device.validate_commands(commands)
        self.groups = groups
        self.turn = 0
        self.ready = self._encode(0)

    def _encode(self, turn: int) -> Any:
        buffers = [commands.encode_native(table) for commands in self.groups[turn]]
        assert all(buffers)
        return ffi.new("WGPUCommandBuffer[]", [ffi.cast("WGPUCommandBuffer", b) for b in buffers])

    def step(self) -> int:
        arms._upload()
        ready = self.ready
        start = time.perf_counter_ns()
        lib.wgpuQueueSubmit(queue, len(ready), ready)
        submitted = time.perf_counter_ns() - start
        for index in range(len(ready)):
            lib.wgpuCommandBufferRelease(ready[index])
        self.turn = (self.turn + 1) % len(self.groups)
        self.ready = self._encode(self.turn)
        return submitted


work = timed(0, resolved=False)
arms_by_name = {
    "plain1": Arm([[plain(0)]]),
    "plain32": Arm([[plain(slot)] for slot in range(32)]),
    "ts1": Arm([[timed(0)]]),
    "ts32": Arm([[timed(slot)] for slot in range(32)]),
    "two1": Arm([[work, resolving(0)]]),
    "two32": Arm([[work, resolving(slot)] for slot in range(32)]),
}
reference = arms.captured_end_to_end()
for arm in arms_by_name.values():
    for _ in range(100):
        arm.step()
        out = arms._read()
    assert all((a == b).all() for a, b in zip(out, reference))
submit_t: dict[str, list[int]] = {name: [] for name in arms_by_name}
step_t: dict[str, list[int]] = {name: [] for name in arms_by_name}
names = list(arms_by_name)
for index in range(ITER):
    for name in names if index % 2 == 0 else names[::-1]:
        start = time.perf_counter_ns()
        submit_t[name].append(arms_by_name[name].step())
        arms._read()
        step_t[name].append(time.perf_counter_ns() - start)
base = statistics.median(step_t["plain1"])
print(f"{ITER} interleaved iterations; us")
print(f"{'arm':8} {'submit p50':>10} {'submit mean':>11} {'step p50':>9} {'step mean':>9} {'p50/plain1':>10}")
for name in names:
    s, t = submit_t[name], step_t[name]
    print(
        f"{name:8} {statistics.median(s) / 1e3:10.1f} {statistics.fmean(s) / 1e3:11.1f} {statistics.median(t) / 1e3:9.1f}"
        f" {statistics.fmean(t) / 1e3:9.1f} {statistics.median(t) / base:10.3f}"
    )
device.wait_idle()
for arm in arms_by_name.values():
    for index in range(len(arm.ready)):
        lib.wgpuCommandBufferRelease(arm.ready[index])
for query_set in query_sets:
    device.release_query_set(query_set)
device.destroy_buffer(resolve)
