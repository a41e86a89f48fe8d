"""Session 9 diagnostic: where a threaded captured step's time goes, by backend call, with knobs.

Usage: python where_time.py K[,K...] STEP N [knob=value ...]; STEP one of end_to_end, replay_and_read, run_only.
Knobs: ``switch=S`` (sys.setswitchinterval), ``spin=US`` (the device's spin_wait_us), ``ahead=0|1`` (encode
ahead), ``tiny=1`` (16 chained Relu on [1, 256] instead of mlp16, for a CPU adapter), ``busy=N`` (N more threads doing pure Python work, releasing the GIL every ~20 us), ``timing=0|1`` (wrap the
backend calls below with perf_counter; per step and thread, inclusive times, so nested calls count twice).
Prints steps/s per K, and with timing the mean microseconds per step spent in each wrapped call."""

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
from ortgpu_core.backends import _wgpu_encode_ahead, _wgpu_readback, wgpu_native

WRAPPED = [
    (wgpu_native.WgpuDevice, "write_buffer"),
    (wgpu_native.WgpuDevice, "submit"),
    (_wgpu_readback._Readback, "submit_and_read"),
    (_wgpu_readback._Readback, "read_buffer_into"),
    (_wgpu_readback._Readback, "_copy_and_map"),
    (_wgpu_readback._Readback, "_request_map"),
    (_wgpu_readback._Readback, "_finish_read"),
    (_wgpu_readback._Readback, "_wait_until"),
    (_wgpu_readback._Readback, "wait_idle"),
    (_wgpu_encode_ahead._EncodeAhead, "_encode_and_submit"),
    (_wgpu_encode_ahead._EncodeAhead, "_encode_ahead"),
]


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


def _time_steps(steps: list[Callable[[], object]], n: int) -> tuple[float, list[list[float]]]:
    """Each of ``steps`` in its own thread: 50 warm-up steps, a barrier, then ``n`` timed steps.  Returns the window
    from the barrier's release to the last thread's last step, and every thread's step times."""
    k = len(steps)
    barrier = threading.Barrier(k + 1)
    ends = [0.0] * k
    step_times: list[list[float]] = [[] for _ in range(k)]

    def work(i: int) -> None:
        for _ in range(50):
            steps[i]()
        barrier.wait()
        for _ in range(n):
            t0 = time.perf_counter()
            steps[i]()
            step_times[i].append(time.perf_counter() - t0)
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return max(ends) - start, step_times


def main() -> None:
    counts = [int(k) for k in sys.argv[1].split(",")]
    step_name, n = sys.argv[2], int(sys.argv[3])
    knobs = dict(arg.split("=", 1) for arg in sys.argv[4:])
    if "switch" in knobs:
        sys.setswitchinterval(float(knobs["switch"]))
    timing = knobs.get("timing", "0") == "1"
    totals: dict[str, float] = collections.defaultdict(float)
    recording = threading.Event()
    if timing:
        for owner, name in WRAPPED:
            if name not in owner.__dict__:  # _copy_and_map left in session 12 (the read's C part)
                continue
            original = owner.__dict__[name]

            def wrapped(*args: Any, _original: Callable[..., Any] = original, _name: str = name, **kw: Any) -> Any:
                if not recording.is_set():
                    return _original(*args, **kw)
                start = time.perf_counter()
                try:
                    return _original(*args, **kw)
                finally:
                    totals[_name] += time.perf_counter() - start

            setattr(owner, name, wrapped)
    model_bytes, feeds = _model(knobs.get("tiny", "0") == "1")
    env = ortgpu.Env()
    arms = [OrtgpuArms(model_bytes, feeds, env) for _ in range(max(counts))]
    device: Any = arms[0].device._native_device()
    if "spin" in knobs:
        device.spin_wait_us = float(knobs["spin"])
    if "ahead" in knobs:
        device.encode_ahead = knobs["ahead"] == "1"
    for arm in arms:
        arm.capture()
    busy = int(knobs.get("busy", "0"))
    stop_busy = threading.Event()

    def busy_loop() -> None:  # pure Python work with a GIL release every ~20 us, as a stepping thread has
        while not stop_busy.is_set():
            total = 0
            for j in range(300):
                total += j * j
            time.sleep(0)

    busy_threads = [threading.Thread(target=busy_loop, daemon=True) for _ in range(busy)]
    for t in busy_threads:
        t.start()
    for k in counts:
        choices: dict[str, list[Callable[[], object]]] = {
            "end_to_end": [a.captured_end_to_end for a in arms[:k]],
            "replay_and_read": [a.captured_read_end_to_end for a in arms[:k]],
            "run_only": [a.captured_run_only for a in arms[:k]],
        }
        steps = choices[step_name]
        totals.clear()
        recording.set()
        window, step_times = _time_steps(steps, n)
        recording.clear()
        every = [s for times in step_times for s in times]
        p50, p99 = np.percentile(every, 50) * 1e3, np.percentile(every, 99) * 1e3
        print(
            f"K={k} {step_name} {knobs}: {k * n / window:.0f} steps/s  p50 {p50:.3f} ms  p99 {p99:.3f} ms", flush=True
        )
        if timing:
            per_step = {name: 1e6 * value / (k * (n + 50)) for name, value in totals.items()}
            print(
                "   us/step: "
                + "  ".join(f"{name} {us:.1f}" for name, us in sorted(per_step.items(), key=lambda x: -x[1]))
            )
    stop_busy.set()
    for t in busy_threads:
        t.join()
    for arm in arms:
        arm.close()


if __name__ == "__main__":
    main()
