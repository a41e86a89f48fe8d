"""Host cost of profiling a captured replay, side by side in one process (session 8, issue 15).

Two sessions of the same tiny model (16 chained Relu on [1, 256]: host work dominates), each with its own captured
graph; one profiling the whole time (``start_profiling()``), one not.  Three steps, each timed interleaved (one call
of each arm in turn, the order alternating per iteration), after a warm-up:

* ``replay``: ``graph.replay()`` alone (nothing waited for: the host cost of a submission; every
  ``RING_SLOTS``-th profiled one may include the ring drain's wait),
* ``replay+wait``: ``graph.replay()`` then a wait for the device,
* ``replay+to_numpy``: ``graph.replay()`` then ``to_numpy()`` of the output (the bench's captured end-to-end step),
* ``replay_and_read``: ``graph.replay_and_read()``.

Reported per backend: median and mean microseconds off / on, their difference and ratio, of each step and of its
host part (the step minus its time in the backend: submits, reads, waits; what profiling's own Python costs, apart
from the backend's cost of the timestamp records).  Usage:
``python bench/results/2026-12-01-s8/host_cost.py [fake|wgpu ...] [--iterations N]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any, Callable, Literal

import numpy as np
from onnx import TensorProto, helper

import ortgpu

LAYERS, WIDTH = 16, 256


def relu_chain() -> bytes:
    nodes = [
        helper.make_node("Relu", [f"t{i}" if i else "X"], [f"t{i + 1}" if i + 1 < LAYERS else "Y"])
        for i in range(LAYERS)
    ]
    graph = helper.make_graph(
        nodes,
        "relu_chain",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, WIDTH])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


class Arm:
    """A session and its captured graph; ``device_ns`` adds up the time spent in the backend (the runner's
    ``submit``, ``submit_and_read`` and timestamp reads, wrapped before capture so the graph's own submit is
    too, and the waits and reads of the steps): a step's time minus that is the host work around it."""

    def __init__(self, model: bytes, env: ortgpu.Env) -> None:
        self.session = ortgpu.InferenceSession(model, env=env, graph_capture=True)
        self.device_ns = 0
        runner: Any = self.session._runner
        for name in ("submit", "submit_and_read", "_read_timestamps"):
            setattr(runner, name, self._timed(getattr(runner, name)))
        self.x = self.session.allocator.from_numpy(np.linspace(-1, 1, WIDTH, dtype=np.float32).reshape(1, WIDTH))
        self.y = self.session.allocator.empty((1, WIDTH), "float32")
        binding = self.session.io_binding()
        binding.bind_input("X", self.x)
        binding.bind_output("Y", self.y)
        self.graph = self.session.capture(binding, 0)
        self._device = env.default_device._native_device()

    def _timed(self, call: Callable[..., None]) -> Callable[..., None]:
        def timed(*args: Any) -> None:
            start = time.perf_counter_ns()
            try:
                call(*args)
            finally:
                self.device_ns += time.perf_counter_ns() - start

        return timed

    def replay(self) -> None:
        self.graph.replay()

    def replay_wait(self) -> None:
        self.graph.replay()
        start = time.perf_counter_ns()
        self._device.wait_idle()
        self.device_ns += time.perf_counter_ns() - start

    def replay_to_numpy(self) -> None:
        self.graph.replay()
        start = time.perf_counter_ns()
        self.y.to_numpy()
        self.device_ns += time.perf_counter_ns() - start

    def replay_and_read(self) -> None:
        self.graph.replay_and_read()


def _summary(times: dict[str, list[float]], key: str) -> dict[str, float]:
    return {
        f"p50_off{key}": statistics.median(times["off"]),
        f"p50_on{key}": statistics.median(times["on"]),
        f"mean_off{key}": statistics.fmean(times["off"]),
        f"mean_on{key}": statistics.fmean(times["on"]),
    }


def interleaved(off: Arm, on: Arm, step: str, warmup: int, iterations: int) -> dict[str, float]:
    """Per arm, p50 and mean microseconds of the step (``p50_off`` ...) and of its host part outside the backend
    (``p50_off_host`` ...)."""
    calls = {"off": STEPS[step](off), "on": STEPS[step](on)}
    arms = {"off": off, "on": on}
    for _ in range(warmup):
        calls["off"]()
        calls["on"]()
    times: dict[str, list[float]] = {"off": [], "on": []}
    host: dict[str, list[float]] = {"off": [], "on": []}
    clock = time.perf_counter_ns
    for index in range(iterations):
        for label in ("off", "on") if index % 2 == 0 else ("on", "off"):
            arm, call = arms[label], calls[label]
            device_before = arm.device_ns
            start = clock()
            call()
            elapsed = clock() - start
            times[label].append(elapsed / 1e3)
            host[label].append((elapsed - (arm.device_ns - device_before)) / 1e3)
    return {**_summary(times, ""), **_summary(host, "_host")}


STEPS: dict[str, Callable[[Arm], Callable[[], None]]] = {
    "replay": lambda arm: arm.replay,
    "replay+wait": lambda arm: arm.replay_wait,
    "replay+to_numpy": lambda arm: arm.replay_to_numpy,
    "replay_and_read": lambda arm: arm.replay_and_read,
}


def measure(backend: Literal["fake", "wgpu"], iterations: int) -> dict[str, Any]:
    env = ortgpu.Env(backend=backend)
    model = relu_chain()
    off, on = Arm(model, env), Arm(model, env)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        on.session.profile_file_prefix = f"{folder}/profile"
        on.session.start_profiling()
        for name in STEPS:
            rows[name] = interleaved(off, on, name, warmup=max(iterations // 10, 20), iterations=iterations)
            off.replay_wait()
            on.replay_wait()
        on.session.end_profiling()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backends", nargs="*", default=["fake", "wgpu"], choices=["fake", "wgpu"])
    parser.add_argument("--iterations", type=int, default=2000)
    options = parser.parse_args()
    for backend in options.backends:
        rows = measure("fake" if backend == "fake" else "wgpu", options.iterations)
        print(f"\n{backend}: {LAYERS} chained Relu on [1, {WIDTH}], {options.iterations} interleaved iterations (us)")
        print(
            f"{'step':16s} {'p50 off':>8s} {'p50 on':>8s} {'diff':>7s} {'ratio':>6s} {'mean off':>9s} {'mean on':>8s} {'diff':>7s} {'ratio':>6s}"
        )
        for name, row in rows.items():
            for key, label in (("", name), ("_host", "  host part")):
                p50_off, p50_on = row[f"p50_off{key}"], row[f"p50_on{key}"]
                mean_off, mean_on = row[f"mean_off{key}"], row[f"mean_on{key}"]
                print(
                    f"{label:16s} {p50_off:8.1f} {p50_on:8.1f} {p50_on - p50_off:7.1f} {p50_on / p50_off:6.2f}"
                    f" {mean_off:9.1f} {mean_on:8.1f} {mean_on - mean_off:7.1f} {mean_on / mean_off:6.2f}"
                )


if __name__ == "__main__":
    main()
