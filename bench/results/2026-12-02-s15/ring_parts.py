"""Session 15 (H200): where a profiled replay's time goes, by part of the wgpu device's calls (wrapped with timers):
the ring's read (``read_async``: validation, encode + submit, map request, encode ahead) and the replay's own parts,
for a captured mlp16 with profiling on and off, replay() + to_numpy() one thread.

python3 ring_parts.py
"""

from __future__ import annotations

import collections
import os
import statistics
import tempfile
import time
from typing import Any, Callable

import ortgpu
from bench.__main__ import build_model, model_feeds
from bench.harness import OrtgpuArms
from bench.profile_overhead import _end_profiling, _profiled
from ortgpu_core.backends import wgpu_native

STEPS = int(os.environ.get("STEPS", "2000"))

PARTS = (
    "read_async",
    "read_async_done",
    "read_async_finish",
    "_validate_for_submit",
    "_encode_and_submit",
    "_encode_ahead",
    "_submit_unlocked",
    "_request_map",
    "_note_writes",
    "submit",
    "write_buffer",
    "read_buffer_into",
)


def wrap(records: dict[str, list[float]], parts: tuple[str, ...] = PARTS) -> None:
    """Time every call of the wgpu device's methods named in ``parts`` into ``records`` (seconds, by name)."""
    cls: Any = wgpu_native.WgpuDevice
    for name in parts:
        original: Callable[..., Any] = getattr(cls, name)

        def timed(self: Any, *args: Any, _original: Callable[..., Any] = original, _name: str = name, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return _original(self, *args, **kw)
            finally:
                records[_name].append(time.perf_counter() - start)

        setattr(cls, name, timed)


def main() -> None:
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
    env = ortgpu.Env()
    records: dict[str, list[float]] = collections.defaultdict(list)
    wrap(records)
    for profiled in (False, True, False, True):
        arms = OrtgpuArms(model.SerializeToString(), feeds, env)
        arms.capture()
        graph = arms.graph
        assert graph is not None
        with tempfile.TemporaryDirectory() as folder:
            if profiled:
                _profiled(arms, folder)
            for _ in range(STEPS // 6):
                arms.captured_end_to_end()
            records.clear()
            replay_times, read_times = [], []
            for _ in range(STEPS):
                arms._upload()
                t0 = time.perf_counter()
                graph.replay()
                t1 = time.perf_counter()
                arms._read()
                replay_times.append(t1 - t0)
                read_times.append(time.perf_counter() - t1)
            if profiled:
                _end_profiling(arms)
        print(
            f"== profile {'on ' if profiled else 'off'}: replay() p50 {statistics.median(replay_times) * 1e6:.1f} mean "
            f"{statistics.mean(replay_times) * 1e6:.1f} us; read p50 {statistics.median(read_times) * 1e6:.1f} mean "
            f"{statistics.mean(read_times) * 1e6:.1f} us",
            flush=True,
        )
        for name, values in sorted(records.items()):
            print(
                f"   {name:22s} calls/step {len(values) / STEPS:5.3f} p50 {statistics.median(values) * 1e6:8.1f} "
                f"mean {statistics.mean(values) * 1e6:8.1f} us, per step {sum(values) / STEPS * 1e6:7.1f} us",
                flush=True,
            )
        arms.close()


if __name__ == "__main__":
    main()
