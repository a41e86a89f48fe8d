"""Session 16 (H200): why profiling costs K threads so much more than one.  K threads (KS, default 4) each step
their own captured mlp16 (end_to_end: update_inplace + replay + to_numpy) in passes: unprofiled, profiled (every
replay timed whole: detail only on the first), unprofiled again (do sessions that were profiled stay as fast?).
Per pass: the throughput, and per step the calls and time of the wgpu device's parts (wrapped with timers), the
device lock's acquisition wait and hold time (outermost holdings).

python3 threads_parts.py   (KS=4 ITER=500 VARIANT=full: what a timer gives back at a record's end, see idle_variant)
"""

from __future__ import annotations

import collections
import importlib.util
import os
import statistics
import tempfile
import threading
import time
from typing import Any, Callable

import ortgpu
from bench.__main__ import build_model, model_feeds
from bench.harness import OrtgpuArms
from bench.threads import time_threads
from ortgpu import _profiling
from ortgpu_core.backends import _device_lock

KS = [int(k) for k in os.environ.get("KS", "4").split(",")]
ITER = int(os.environ.get("ITER", "500"))
VARIANT = os.environ.get("VARIANT", "full")
WARMUP = 50
PARTS = (
    "read_async",
    "read_async_done",
    "read_async_finish",
    "_encode_and_submit",
    "_encode_ahead",
    "_submit_unlocked",
    "submit",
    "write_buffer",
    "read_buffer_into",
)
records: dict[str, list[float]] = collections.defaultdict(list)
held = threading.local()


def wrap() -> None:
    spec = importlib.util.spec_from_file_location(
        "ring_parts", os.path.join(os.path.dirname(__file__), "..", "2026-12-02-s15", "ring_parts.py")
    )
    assert spec is not None and spec.loader is not None
    ring_parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ring_parts)
    ring_parts.wrap(records, PARTS)  # session 15's timers around the device's calls
    lock_cls: Any = _device_lock.DeviceLock
    enter: Callable[..., Any] = lock_cls.__enter__
    leave: Callable[..., Any] = lock_cls.__exit__

    def timed_enter(self: Any) -> Any:
        start = time.perf_counter()
        result = enter(self)
        if self._held == 1:
            records["lock wait"].append(time.perf_counter() - start)
            held.since = time.perf_counter()
        return result

    def timed_exit(self: Any, *args: Any) -> Any:
        outermost = self._held == 1
        try:
            return leave(self, *args)
        finally:
            if outermost:
                records["lock hold"].append(time.perf_counter() - held.since)

    lock_cls.__enter__ = timed_enter
    lock_cls.__exit__ = timed_exit


def idle_variant(variant: str) -> None:
    """What a timer gives back when a profiling record ends: ``full`` (the library's), ``lists`` (only the timed
    command lists, with what was encoded ahead for them), ``sets`` (only the query sets and resolve buffer; the
    lists then name freed query sets, so they are dropped too, but the device's encoded-ahead buffers for them are
    kept alive by holding the lists elsewhere), ``none`` (nothing: as before session 16)."""
    timer_cls: Any = _profiling.GpuStepTimer
    full: Callable[..., Any] = timer_cls.idle
    kept: list[Any] = []

    def idle(self: Any) -> None:
        if variant == "none":
            return
        if variant == "lists":
            with self._lock:
                self._lists = [None] * self.slots
                self._span_lists = [None] * self.slots
                self._io = None
            return
        if variant == "sets":
            kept.extend(self._lists + self._span_lists)
        full(self)

    timer_cls.idle = idle


def report(label: str, window: float, steps: int) -> None:
    print(f"-- {label}: {steps / window:7.0f} steps/s", flush=True)
    for name, values in sorted(records.items()):
        print(
            f"   {name:20s} calls/step {len(values) / steps:5.3f} p50 {statistics.median(values) * 1e6:7.1f} mean "
            f"{statistics.fmean(values) * 1e6:7.1f} us, per step {sum(values) / steps * 1e6:7.1f} us",
            flush=True,
        )


def main() -> None:
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
    env = ortgpu.Env()
    sessions = [OrtgpuArms(model.SerializeToString(), feeds, env) for _ in range(max(KS))]
    for arms in sessions:
        arms.capture()
    wrap()
    idle_variant(VARIANT)
    print(f"timers' idle at a record's end: {VARIANT}")
    for k in KS:
        using = sessions[:k]
        for label in ("unprofiled", "profiled (whole)", "unprofiled again"):
            with tempfile.TemporaryDirectory() as folder:
                if label.startswith("profiled"):
                    for index, arms in enumerate(using):
                        arms.session.profile_file_prefix = os.path.join(folder, f"t{index}")
                        arms.session.start_profiling(10**9)
                steps: list[Callable[[], object]] = [a.captured_end_to_end for a in using]
                for step in steps:
                    step()
                time_threads(steps, WARMUP, 1, None)
                records.clear()
                window, times = time_threads(steps, 0, ITER, None)
                report(f"K={k} {label}", window, sum(len(t) for t in times))
                if label.startswith("profiled"):
                    for arms in using:
                        os.remove(arms.session.end_profiling())
    for arms in sessions:
        arms.close()


if __name__ == "__main__":
    main()
