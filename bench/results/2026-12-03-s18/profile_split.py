"""Session 18 (H200): where a profiled replay's extra time goes.  Captured mlp16 (batch 1); per iteration, in turn,
each arm does update_inplace + a replay or submit + to_numpy, and its call (upload + replay/submit, no wait) and its
whole step are timed:
  off       graph.replay() of an unprofiled session (the library's path)
  on        graph.replay() of a profiled session, every replay timed whole (detail_every huge)
  on10      graph.replay() of a profiled session with the default per-step sample (1 in 10)
  plain     the off graph's program recorded again (program.record), submitted with the graph's read-ahead ranges
  ts1       that list with two timestamps and their resolve (one query set, one list, as session 17's ts+res)
  tsN       as ts1, but N query sets and N lists used in turn (N = 2, 4, 8, 16, 32), each resolving into its part of
            one buffer (as the profiler's ring of N slots, without the profiler: no reads, no bookkeeping)
  ts32q1    as ts32, but the 32 lists all write one query set (each still resolving into its own part)
  plain32   32 copies of plain used in turn (no timestamps): the cost of using 32 lists in turn alone
  on_nohint, on10_nohint  (HINTS=1) on and on10 with their submits
            encode_next hint dropped: the ring's lists encoded ahead right after their own use, as before
Printed: p50 per arm of the upload, p50 and mean of the call and of the whole step (us), and the step's ratio to off.

python3 profile_split.py   (ITER=1500)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
import ortgpu  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s18_program import GraphProgram  # noqa: E402

ITER = int(os.environ.get("ITER", "1500"))
SLOTS = 32
if os.environ.get("TINY"):  # 16 MatMul+Relu layers of 8x8: the host's part alone, where the GPU is slow (lavapipe)
    import numpy as np
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(16):
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [8, 8], rng.random(64, dtype=np.float32)))
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"y{i}"]),
        ]
        prev = f"y{i}"
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
            [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 8])],
            inits,
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    feeds = {"x": rng.random((1, 8), dtype=np.float32)}
else:
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
env = ortgpu.Env()
model_bytes = model.SerializeToString()
off = OrtgpuArms(model_bytes, feeds, env)
on = OrtgpuArms(model_bytes, feeds, env)
on10 = OrtgpuArms(model_bytes, feeds, env)
graph = off.capture()
on.capture()
on10.capture()
folder = tempfile.mkdtemp()
profiled = [(on, 10**9), (on10, None)]
HINTS = bool(os.environ.get("HINTS"))  # also the profiled arms without the encode_next hint
if HINTS:
    on_x = OrtgpuArms(model_bytes, feeds, env)
    on10_x = OrtgpuArms(model_bytes, feeds, env)
    on_x.capture()
    on10_x.capture()
    profiled += [(on_x, 10**9), (on10_x, None)]
    for arms in (on_x, on10_x):  # their submits drop the hint (set before profiling: the profiler binds submit then)
        runner_x: Any = arms.session._runner
        plain_submit = runner_x.submit

        def without_hint(commands: Any, read_ahead: Any = (), encode_next: Any = None, s: Any = plain_submit) -> None:
            s(commands, read_ahead)

        runner_x.submit = without_hint
for arms, every in profiled:
    arms.session.profile_file_prefix = os.path.join(folder, "p")
    arms.session.start_profiling(every)

caught = GraphProgram(off)
program, device = caught.program, caught.device
inputs, outputs, ranges = caught.inputs, caught.outputs, caught.ranges
resolve = device.create_query_resolve_buffer(256 * SLOTS)
query_sets = [device.create_query_set(2, label="s18 timestamps") for _ in range(SLOTS)]
plain = program.record(inputs, outputs).freeze()


def timed_list(slot: int) -> Any:
    commands, _ = program.record_timed(inputs, outputs, query_sets[slot], per_step=False)
    commands.add_resolve(query_sets[slot], 0, 2, resolve, 256 * slot)
    return commands.freeze()


ts1 = timed_list(0)
ROTATIONS = (2, 4, 8, 16, 32)
turns = {n: 0 for n in ROTATIONS}
uploaded: list[float] = []


def call_of(arms: OrtgpuArms) -> Callable[[], object]:
    assert arms.graph is not None
    g = arms.graph

    def call() -> object:
        arms._upload()
        uploaded.append(time.perf_counter())
        g.replay()
        return None

    return call


def submitting(pick: Callable[[], Any]) -> Callable[[], object]:
    def call() -> object:
        off._upload()
        uploaded.append(time.perf_counter())
        device.submit(pick(), ranges)
        return None

    return call


def one_query_set(slot: int) -> Any:
    commands, _ = program.record_timed(inputs, outputs, query_sets[0], per_step=False)
    commands.add_resolve(query_sets[0], 0, 2, resolve, 256 * slot)
    return commands.freeze()


def rotating(n: int, make: Callable[[int], Any] = timed_list) -> Callable[[], Any]:
    lists = [make(slot) for slot in range(n)]  # lists of their own (each with its own encoding ahead)

    def pick() -> Any:
        turns[n] = (turns[n] + 1) % n
        return lists[turns[n]]

    return pick


arms_of = {"off": off, "on": on, "on10": on10, "plain": off, "ts1": off, **{f"ts{n}": off for n in ROTATIONS}}
arms_of.update(ts32q1=off, plain32=off)
if HINTS:
    arms_of.update(on_nohint=on_x, on10_nohint=on10_x)
calls: dict[str, Callable[[], object]] = {
    "off": call_of(off),
    "on": call_of(on),
    "on10": call_of(on10),
    "plain": submitting(lambda: plain),
    "ts1": submitting(lambda: ts1),
    **{f"ts{n}": submitting(rotating(n)) for n in ROTATIONS},
    "ts32q1": submitting(rotating(32, one_query_set)),
    "plain32": submitting(rotating(32, lambda slot: program.record(inputs, outputs).freeze())),
}
if HINTS:
    calls.update(on_nohint=call_of(on_x), on10_nohint=call_of(on10_x))
reference = off.captured_end_to_end()
for name, call in calls.items():
    out: Any = None
    for _ in range(100):
        call()
        out = arms_of[name]._read()
    assert all((a == b).all() for a, b in zip(out, reference)), name
call_t: dict[str, list[float]] = {name: [] for name in calls}
step_t: dict[str, list[float]] = {name: [] for name in calls}
upload_t: dict[str, list[float]] = {name: [] for name in calls}
names = list(calls)
for index in range(ITER):
    order = names if index % 2 == 0 else names[::-1]
    for name in order:
        start = time.perf_counter()
        calls[name]()
        middle = time.perf_counter()
        arms_of[name]._read()
        end = time.perf_counter()
        call_t[name].append(middle - start)
        upload_t[name].append(uploaded.pop() - start)
        step_t[name].append(end - start)
base = statistics.median(step_t["off"]), statistics.fmean(step_t["off"])
print(f"{ITER} interleaved iterations (order alternating)")
print(
    f"{'arm':11} {'upload p50':>10} {'call p50':>9} {'call mean':>9} {'step p50':>9} {'step mean':>9} {'p50/off':>8} {'mean/off':>9}"
)
for name in names:
    c, s = call_t[name], step_t[name]
    p50, mean = statistics.median(s), statistics.fmean(s)
    print(
        f"{name:11} {statistics.median(upload_t[name]) * 1e6:10.1f} {statistics.median(c) * 1e6:9.1f} {statistics.fmean(c) * 1e6:9.1f} {p50 * 1e6:9.1f}"
        f" {mean * 1e6:9.1f} {p50 / base[0]:8.3f} {mean / base[1]:9.3f}"
    )
for arms, _every in profiled:
    os.remove(arms.session.end_profiling())
for query_set in query_sets:
    device.release_query_set(query_set)
device.destroy_buffer(resolve)
