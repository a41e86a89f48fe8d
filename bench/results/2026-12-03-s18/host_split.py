"""Session 18 (H200): the host's part of a profiled replay, by layer.  Captured mlp16 (batch 1), two sessions (one
profiled, every replay timed whole unless DETAIL is set), timed interleaved, each step update_inplace + replay +
to_numpy.  Wrapped (same wrapper cost in both arms) and timed per call: the device's submit (``submit``), its
``_encode_and_submit`` (under the lock: fast when a command buffer encoded ahead is ready, else it encodes),
``_submit_unlocked`` (the native submit of a ready one), ``_encode_ahead`` (the next one, after the submit), and in
the profiled arm the runner's ``profile_replay`` (everything the profiler adds, the submit included).
Printed per arm: p50 and mean (us) of each, and how many submits found a command buffer encoded ahead.

python3 host_split.py   (ITER=1500, DETAIL=1000000000)
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

ITER = int(os.environ.get("ITER", "1500"))
model, shapes = build_model("mlp16", 1)
feeds = model_feeds("mlp16", model, shapes)
env = ortgpu.Env()
off = OrtgpuArms(model.SerializeToString(), feeds, env)
on = OrtgpuArms(model.SerializeToString(), feeds, env)
off.capture()
on.capture()
on.session.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
on.session.start_profiling(int(os.environ.get("DETAIL", str(10**9))))
device: Any = off._backend_device
times: dict[str, list[int]] = {}
ready: list[int] = []


def wrap(owner: Any, name: str, key: str, after: Callable[[Any], None] | None = None) -> None:
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        result = original(*args, **kwargs)
        times.setdefault(key, []).append(time.perf_counter_ns() - start)
        if after is not None:
            after(result)
        return result

    setattr(owner, name, wrapped)


wrap(device, "submit", "submit")
wrap(device, "_encode_and_submit", "encode_and_submit", lambda result: ready.append(1 if result[1] else 0))
wrap(device, "_submit_unlocked", "submit_unlocked")
wrap(device, "_encode_ahead", "encode_ahead")
wrap(on.session._runner, "profile_replay", "profile_replay")
for _ in range(200):
    off.captured_end_to_end()
    on.captured_end_to_end()
results: dict[str, dict[str, list[int]]] = {"off": {}, "on": {}}
ready_of: dict[str, list[int]] = {"off": [], "on": []}
for index in range(ITER):
    for label in ("off", "on") if index % 2 == 0 else ("on", "off"):
        arms = off if label == "off" else on
        assert arms.graph is not None
        arms._upload()
        times.clear()
        del ready[:]
        start = time.perf_counter_ns()
        arms.graph.replay()
        replay_ns = time.perf_counter_ns() - start
        arms._read()
        step_ns = time.perf_counter_ns() - start
        row = results[label]
        row.setdefault("replay() call", []).append(replay_ns)
        row.setdefault("replay + to_numpy", []).append(step_ns)
        for key, values in times.items():
            row.setdefault(key, []).append(sum(values))
        ready_of[label] += ready
print(f"{ITER} interleaved iterations; per step, us")
for label, row in results.items():
    print(f"{label}: submits from a buffer encoded ahead {sum(ready_of[label])} of {len(ready_of[label])}")
    for key, values in row.items():
        print(
            f"  {key:20s} p50 {statistics.median(values) / 1e3:8.1f}  mean {statistics.fmean(values) / 1e3:8.1f}  n {len(values)}"
        )
os.remove(on.session.end_profiling())
