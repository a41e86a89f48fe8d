"""Session 16 (H200): where profiling's cost in a captured mlp16 replay + to_numpy goes.  Arms, each its own session
and captured graph, timed interleaved (one step each per iteration, the order rotating): unprofiled; profiled with
per-step detail on every 10th replay (the default), every 20th, and never after the first ("whole": two timestamps
and a resolve per replay).  For the profiled arms, the host time of ``GpuStepTimer.run`` outside its submit (the
profiler's own Python) is measured too.

python3 profile_parts.py   (ITER=600 by default)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any, Callable

import ortgpu
from bench.__main__ import build_model, model_feeds
from bench.harness import OrtgpuArms
from ortgpu import _profiling

ITER = int(os.environ.get("ITER", "600"))
WARMUP = 50

own: dict[int, list[float]] = {}


def instrument() -> None:
    original: Callable[..., Any] = _profiling.GpuStepTimer.run

    def run(
        self: Any, program: Any, inputs: Any, outputs: Any, submit: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any:
        inside = [0.0]

        def timed_submit(commands: Any) -> None:
            start = time.perf_counter()
            try:
                submit(commands)
            finally:
                inside[0] += time.perf_counter() - start

        start = time.perf_counter()
        try:
            return original(self, program, inputs, outputs, timed_submit, *args, **kw)
        finally:
            own.setdefault(id(self), []).append(time.perf_counter() - start - inside[0])

    _profiling.GpuStepTimer.run = run  # type: ignore[method-assign]


def main() -> None:
    instrument()
    env = ortgpu.Env()
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
    model_bytes = model.SerializeToString()
    settings: dict[str, int | None] = {"off": None, "detail 10": 10, "detail 20": 20, "whole": 10**9}
    arms = {name: OrtgpuArms(model_bytes, feeds, env) for name in settings}
    with tempfile.TemporaryDirectory() as folder:
        for name, every in settings.items():
            arms[name].capture()
            if every is not None:
                arms[name].session.profile_file_prefix = os.path.join(folder, name.replace(" ", "_"))
                arms[name].session.start_profiling(every)
        names = list(settings)
        for _ in range(WARMUP):
            for name in names:
                arms[name].captured_end_to_end()
        own.clear()
        times: dict[str, list[float]] = {name: [] for name in names}
        for index in range(ITER):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                arms[name].captured_end_to_end()
                times[name].append(time.perf_counter() - start)
        base_p50 = statistics.median(times["off"])
        base_mean = statistics.fmean(times["off"])
        print(f"replay + to_numpy, {ITER} interleaved iterations per arm after {WARMUP} warm-up")
        for name in names:
            p50, mean = statistics.median(times[name]), statistics.fmean(times[name])
            print(
                f"  {name:10s} p50 {p50 * 1e6:7.1f} us ({p50 / base_p50:.3f})  mean {mean * 1e6:7.1f} us"
                f" ({mean / base_mean:.3f})"
            )
        for timer, values in own.items():
            print(
                f"  GpuStepTimer.run outside its submit (timer {timer:#x}): p50 {statistics.median(values) * 1e6:.1f} us, "
                f"mean {statistics.fmean(values) * 1e6:.1f} us over {len(values)}"
            )
        for name, every in settings.items():
            if every is not None:
                os.remove(arms[name].session.end_profiling())
    for arm in arms.values():
        arm.close()


if __name__ == "__main__":
    main()
