"""Session 19 (this machine, fake backend): the profiled replay's Python alone.  Captured mlp16; every session's
submits are replaced by a no-op (unprofiled and profiled alike), so a replay() call is the library's host path
only.  Printed per arm: the minimum over ITER/1000 chunks of 1000 replays of the time per replay (the minimum: this
shared machine is noisy), and its excess over the unprofiled arm.

python bench/results/2026-12-03-s19/host_python.py   (ITER=20000)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.getcwd())
import ortgpu  # noqa: E402
import ortgpu._profiling as profiling  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402

ITER = int(os.environ.get("ITER", "20000"))
model, shapes = build_model("mlp16", 1)
feeds = model_feeds("mlp16", model, shapes)
env = ortgpu.Env(backend="fake")
model_bytes = model.SerializeToString()
folder = tempfile.mkdtemp()


def noop(*args: Any, **kwargs: Any) -> None:
    return None


arms: dict[str, OrtgpuArms] = {}
for name, every, slots in [("off", None, 64), ("whole", 10**9, 64), ("default", None, 64)]:
    a = OrtgpuArms(model_bytes, feeds, env)
    runner: Any = a.session._runner
    runner.submit = noop
    a.capture()
    if name != "off":
        profiling.RING_SLOTS = slots
        a.session.profile_file_prefix = os.path.join(folder, "p")
        a.session.start_profiling(every)
        for _ in range(3 * slots):
            a.graph.replay()  # type: ignore[union-attr]
    arms[name] = a
times: dict[str, list[float]] = {name: [] for name in arms}
for _ in range(ITER // 1000):
    for name, a in arms.items():
        replay = a.graph.replay  # type: ignore[union-attr]
        start = time.perf_counter()
        for _ in range(1000):
            replay()
        times[name].append((time.perf_counter() - start) / 1000)
base = min(times["off"])
for name in arms:
    best = min(times[name])
    print(f"{name:8} {best * 1e6:6.2f} us per replay (+{(best - base) * 1e6:5.2f})")
for name in ("whole", "default"):
    os.remove(arms[name].session.end_profiling())
