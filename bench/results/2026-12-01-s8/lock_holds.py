"""Session 8 diagnostic: who holds the device's lock, and for how long, while K threads each drive their own
captured mlp16.  DeviceLock's outermost acquire and release are wrapped to record, per call site (the first frame
outside the lock module and the backend's decorator), the time spent waiting to acquire and the time held
(perf_counter).  Prints steps/s, and per site: acquisitions per step, mean wait and mean hold in microseconds, and
the share of the window the lock was held from there.  Usage: python lock_holds.py K N STEP [tiny], STEP one of
end_to_end, replay_and_read, run_only; ``tiny``: 16 chained Relu on [1, 256] instead of mlp16 (for a CPU adapter)."""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any, Callable

import numpy as np
from onnx import TensorProto, helper

import ortgpu
from bench.harness import OrtgpuArms
from bench.models import mlp, random_feeds
from ortgpu_core.backends import _device_lock

SKIP = ("_device_lock.py", "_wgpu_device_base.py:locked", "contextlib.py")


def _site() -> str:
    frame: Any = sys._getframe(2)
    while frame is not None:
        name = f"{frame.f_code.co_filename.split('/')[-1]}:{frame.f_code.co_name}"
        if not any(skip in name for skip in SKIP):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _model(tiny: bool) -> tuple[bytes, dict[str, np.ndarray]]:
    if tiny:
        nodes, previous = [], "X"
        for i in range(16):
            nodes.append(helper.make_node("Relu", [previous], [f"r{i}"]))
            previous = f"r{i}"
        graph = helper.make_graph(
            nodes,
            "tiny",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 256])],
            [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, 256])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model.SerializeToString(), {"X": np.random.default_rng(0).random((1, 256), dtype=np.float32)}
    proto = mlp(layers=16, width=1024, batch=1)
    return proto.SerializeToString(), random_feeds(proto, {v.name: (1, 1024) for v in proto.graph.input})


def main() -> None:
    k, n, step_name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    model_bytes, feeds = _model(len(sys.argv) > 4 and sys.argv[4] == "tiny")
    env = ortgpu.Env()
    arms = [OrtgpuArms(model_bytes, feeds, env) for _ in range(k)]
    for arm in arms:
        arm.capture()
    choices: dict[str, list[Callable[[], object]]] = {
        "end_to_end": [a.captured_end_to_end for a in arms],
        "replay_and_read": [a.captured_read_end_to_end for a in arms],
        "run_only": [a.captured_run_only for a in arms],
    }
    steps = choices[step_name]
    records: list[tuple[str, float, float]] = []
    recording = threading.Event()
    local = threading.local()
    enter, leave = _device_lock.DeviceLock.__enter__, _device_lock.DeviceLock.__exit__

    def timed_enter(self: Any) -> Any:
        outermost = not self._lock._is_owned()
        asked = time.perf_counter()
        result = enter(self)
        if outermost and recording.is_set():
            local.start = (_site(), asked, time.perf_counter())
        return result

    def timed_exit(self: Any, *exc: Any) -> None:
        started = getattr(local, "start", None) if self._depth == 1 else None
        leave(self, *exc)
        if started is not None:
            local.start = None
            site, asked, got = started
            records.append((site, got - asked, time.perf_counter() - got))

    setattr(_device_lock.DeviceLock, "__enter__", timed_enter)  # noqa: B010 - mypy refuses assigning a method
    setattr(_device_lock.DeviceLock, "__exit__", timed_exit)  # noqa: B010
    barrier = threading.Barrier(k + 1)
    ends = [0.0] * k

    def work(i: int) -> None:
        for _ in range(50):
            steps[i]()
        barrier.wait()
        for _ in range(n):
            steps[i]()
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    barrier.wait()
    recording.set()
    start = time.perf_counter()
    for t in threads:
        t.join()
    window = max(ends) - start
    recording.clear()
    total = k * n
    print(
        f"K={k} {step_name}: {total / window:.0f} steps/s; device lock held {sum(r[2] for r in records) / window:.0%} of the window"
    )
    by_site: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for site, wait, hold in records:
        by_site[site].append((wait, hold))
    rows = sorted(by_site.items(), key=lambda item: -sum(h for _, h in item[1]))
    for site, values in rows[:10]:
        waits = [w for w, _ in values]
        holds = [h for _, h in values]
        print(
            f"  {len(values) / total:5.2f}/step  wait {1e6 * float(np.mean(waits)):7.1f} us  hold {1e6 * float(np.mean(holds)):6.1f} us"
            f"  (p50 {1e6 * float(np.median(holds)):6.1f})  {100 * sum(holds) / window:5.1f}% of window  {site}"
        )
    for arm in arms:
        arm.close()


if __name__ == "__main__":
    main()
