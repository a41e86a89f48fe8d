"""Timing arms: ortgpu captured and uncaptured, and the onnxruntime peer, with identical boundaries.

Boundaries (printed with every result):

* ``end_to_end``: ``update_inplace`` of the inputs + run (or replay) + readback of every output (into fixed host
  arrays, ``to_numpy(out=...)``, as the torch arms copy into fixed pinned tensors; outputs of 8 MiB or more with
  ``to_numpy()``, which hands over the mapped staging memory the device copied them into).
* ``run_only``: run (or replay) until the device is idle (inputs already on the device).

Both ortgpu arms use the same fixed device I/O (one shared input value per model
input, one session-owned output value per output), the same warm-up and the
same iteration count; their outputs are compared before any time is reported.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

import ortgpu
from ortgpu_core.backends.protocol import MAPPED_READ_MIN

__all__ = ["ArmResult", "summarize", "time_loop", "OrtgpuArms"]


@dataclass
class ArmResult:
    """Per-iteration timings (seconds) of one arm at one boundary."""

    name: str
    boundary: str
    seconds: list[float] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.seconds), q)) if self.seconds else float("nan")

    def summary(self) -> dict[str, float]:
        return {
            "p50_ms": self.percentile(50) * 1e3,
            "p90_ms": self.percentile(90) * 1e3,
            "p99_ms": self.percentile(99) * 1e3,
        }

    def tflops_p50(self, flops_per_run: float) -> float:
        """Achieved TFLOP/s at the median time: ``flops_per_run`` / p50 seconds / 1e12 (nan without timings)."""
        p50 = self.percentile(50)
        return flops_per_run / p50 / 1e12 if p50 > 0 else float("nan")


def summarize(results: list[ArmResult], flops_per_run: float | None = None) -> dict[str, Any]:
    """Per arm and boundary: p50/p90/p99 ms, iterations, raw seconds; with ``flops_per_run`` also ``tflops_p50``
    (None when the model has no counted FLOPs)."""
    summary: dict[str, Any] = {}
    for r in results:
        entry: dict[str, Any] = {**r.summary(), "iterations": len(r.seconds), "raw_s": r.seconds}
        if flops_per_run is not None:
            entry["tflops_p50"] = r.tflops_p50(flops_per_run) if flops_per_run > 0 else None
        summary[f"{r.name}/{r.boundary}"] = entry
    return summary


def time_loop(
    step: Callable[[], object], warmup: int, iterations: int, progress: Callable[[int], None] | None = None
) -> list[float]:
    """Call ``step`` ``warmup`` times untimed, then ``iterations`` times, each timed with perf_counter."""
    for _ in range(warmup):
        step()
    times = []
    for index in range(iterations):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        if progress is not None:
            progress(index)
    return times


class OrtgpuArms:
    """A session with fixed device I/O, and the two arms (capture off / on) over it."""

    def __init__(self, model_bytes: bytes, feeds: dict[str, npt.NDArray[Any]], env: ortgpu.Env) -> None:
        self.env = env
        self.device = env.default_device
        self.session = ortgpu.InferenceSession(model_bytes, env=env, device=self.device, graph_capture=True)
        shared = env.shared_allocator(self.device)
        self.feeds = feeds
        # Inputs whose values decide the plan (the VAD's sample rate) stay host arrays: the plan folds them, and
        # a captured graph checks them on the host before each replay instead of reading a device value back.
        self.host_inputs = {name: feeds[name] for name in self.session.value_deciding_inputs if name in feeds}
        self.inputs = {name: shared.from_numpy(array) for name, array in feeds.items() if name not in self.host_inputs}
        reference = self.session.run(None, feeds, ortgpu.RunOptions(gpu_graph_id=-1))
        self.outputs = {
            name: self.session.allocator.empty(array.shape, array.dtype)
            for name, array in zip(self.session.output_names, reference)
        }
        self.binding = self.session.io_binding()
        for name, value in self.inputs.items():
            self.binding.bind_input(name, value)
        for name, array in self.host_inputs.items():
            self.binding.bind_cpu_input(name, array)
        for name, value in self.outputs.items():
            self.binding.bind_output(name, value)
        self.host_outputs = {name: np.empty(array.shape, array.dtype) for name, array in zip(self.outputs, reference)}
        self._ordinary = ortgpu.RunOptions(gpu_graph_id=-1)
        self._backend_device = self.device._native_device()
        self.graph: ortgpu.CapturedGraph | None = None

    # -- the steps ---------------------------------------------------------------------------
    def _upload(self) -> None:
        for name, value in self.inputs.items():
            value.update_inplace(self.feeds[name])

    def _read(self, keep: bool) -> list[npt.NDArray[Any]]:
        """The outputs on the host: read into the fixed host arrays (as the torch arms copy into fixed pinned
        tensors), so a timed step allocates nothing, but for outputs of ``MAPPED_READ_MIN`` bytes or more (a
        decoder's logits), read with ``to_numpy()``: the staging memory the device copied them into is handed over
        without a host copy, as torch's arms end with theirs in pinned memory; ``keep``: new arrays, for results
        compared later."""
        if keep:
            return [value.to_numpy() for value in self.outputs.values()]
        return [
            value.to_numpy()
            if self.host_outputs[name].nbytes >= MAPPED_READ_MIN
            else value.to_numpy(out=self.host_outputs[name])
            for name, value in self.outputs.items()
        ]

    def uncaptured_end_to_end(self, keep: bool = False) -> list[npt.NDArray[Any]]:
        """One uncaptured step; its outputs are the fixed host arrays (overwritten by the next step) unless
        ``keep``."""
        self._upload()
        self.session.run_with_iobinding(self.binding, self._ordinary)
        return self._read(keep)

    def uncaptured_run_only(self) -> None:
        self.session.run_with_iobinding(self.binding, self._ordinary)
        self._backend_device.wait_idle()

    def capture(self) -> ortgpu.CapturedGraph:
        if self.graph is None:
            self.graph = self.session.capture(self.binding, graph_id=0)
        return self.graph

    def captured_end_to_end(self, keep: bool = False) -> list[npt.NDArray[Any]]:
        """One captured step (see :meth:`uncaptured_end_to_end` for ``keep``)."""
        assert self.graph is not None
        self._upload()
        self.graph.replay()
        return self._read(keep)

    def captured_read_end_to_end(self) -> list[npt.NDArray[Any]]:
        """The captured step through ``graph.replay_and_read()``: the output copies ride in the replay's submission."""
        assert self.graph is not None
        self._upload()
        return self.graph.replay_and_read()

    def captured_run_only(self) -> None:
        assert self.graph is not None
        self.graph.replay()
        self._backend_device.wait_idle()

    def wait_idle(self) -> None:
        """Wait until the device has finished everything submitted (replays queued by ``graph.replay()``)."""
        self._backend_device.wait_idle()

    def breakdown(self, captured: bool, iterations: int) -> dict[str, float]:
        """Median milliseconds of each part of the end-to-end step, one after the other: upload, the run or replay
        call (host), the wait for the device to finish it (``gpu_wait``), and the readback with the device idle
        (so a slow read is told apart from a read waiting for the work before it)."""
        parts: dict[str, list[float]] = {"update_inplace": [], "run_or_replay_call": [], "gpu_wait": [], "readback": []}
        for _ in range(iterations):
            t0 = time.perf_counter()
            self._upload()
            t1 = time.perf_counter()
            if captured:
                assert self.graph is not None
                self.graph.replay()
            else:
                self.session.run_with_iobinding(self.binding, self._ordinary)
            t2 = time.perf_counter()
            self._backend_device.wait_idle()
            t3 = time.perf_counter()
            self._read(keep=False)
            t4 = time.perf_counter()
            for name, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                parts[name].append(value)
        return {name: statistics.median(values) * 1e3 for name, values in parts.items()}

    def close(self) -> None:
        if self.graph is not None:
            self.graph.release()
        self.session.close()


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3 if seconds else float("nan")
