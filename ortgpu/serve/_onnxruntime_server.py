"""The comparison runtime of the serving deployment: the same model served by onnxruntime, with the interface of
:class:`~ortgpu.serve._server.ModelServer` (``application(..., runtime="onnxruntime")``).

onnxruntime's WebGPU plugin EP (``onnxruntime-ep-webgpu``) where it is installed and finds a device, else its CPU
provider; uncaptured (its capture needs IOBinding with fixed device buffers per shape, which a serving loop of
changing batch sizes would have to manage by hand).  Batches are padded to the same buckets as ortgpu's, so both
runtimes compute the same shapes."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core import InvalidArgumentError

from ._server import DEFAULT_BUCKETS, answer_each, input_rows, validate_request

__all__ = ["OnnxruntimeServer"]


def _session(model: str | bytes) -> tuple[Any, str]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    device = None
    try:
        import onnxruntime_ep_webgpu as webgpu_ep
    except ImportError:
        webgpu_ep = None
    if webgpu_ep is not None:
        try:
            ort.register_execution_provider_library("webgpu", webgpu_ep.get_library_path())
        except RuntimeError:  # registered already in this process
            pass
        device = next((d for d in ort.get_ep_devices() if d.ep_name == webgpu_ep.get_ep_name()), None)
    if device is not None:
        options.add_provider_for_devices([device], {})
        return ort.InferenceSession(model, sess_options=options), "WebGpuExecutionProvider"
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"]), "CPUExecutionProvider"


class OnnxruntimeServer:
    """:class:`ModelServer`'s interface over an onnxruntime session (see the module docstring)."""

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes,
        *,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        row_shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        sizes = sorted({int(b) for b in buckets})
        if not sizes or sizes[0] < 1:
            raise InvalidArgumentError(f"buckets must be positive batch sizes, not {list(buckets)!r}")
        self.buckets = tuple(sizes)
        source = model if isinstance(model, bytes) else os.fspath(model)
        self.session, self.provider = _session(source)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "rows": 0, "batches": 0, "padded_rows": 0}
        self._replay_ms: list[float] = []
        self._rows, self.input_dtypes = input_rows(self.session.get_inputs(), row_shapes or {})

    def validate(self, request: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return validate_request(request, self._rows, self.input_dtypes)

    def infer(self, requests: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
        with self._lock:
            arrays = [self.validate(r) for r in requests]
            counts = [next(iter(a.values())).shape[0] for a in arrays]
            total = sum(counts)
            merged = {name: np.concatenate([a[name] for a in arrays]) for name in arrays[0]}
            pieces: dict[str, list[np.ndarray]] = {name: [] for name in self.output_names}
            start = 0
            while start < total:
                take = min(total - start, self.buckets[-1])
                size = next(b for b in self.buckets if b >= take)
                feeds = {}
                for name, array in merged.items():
                    padded = np.zeros((size, *array.shape[1:]), array.dtype)
                    padded[:take] = array[start : start + take]
                    feeds[name] = padded
                began = time.perf_counter()
                try:
                    results = self.session.run(self.output_names, feeds)
                except Exception as error:  # noqa: BLE001 - onnxruntime's errors have no common base
                    # onnxruntime keeps no device state to lose: a failing run is the data's (an index out of range)
                    raise InvalidArgumentError(f"onnxruntime failed on this batch: {error}") from error
                self._replay_ms.append((time.perf_counter() - began) * 1e3)
                del self._replay_ms[:-1024]
                for name, result in zip(self.output_names, results):
                    pieces[name].append(np.asarray(result)[:take])
                self._counts["batches"] += 1
                self._counts["padded_rows"] += size - take
                start += take
            outputs = {name: np.concatenate(parts) for name, parts in pieces.items()}
            self._counts["requests"] += len(requests)
            self._counts["rows"] += total
            answers, offset = [], 0
            for count in counts:
                answers.append({name: outputs[name][offset : offset + count] for name in self.output_names})
                offset += count
            return answers

    def answer(self, requests: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray] | InvalidArgumentError]:
        """:meth:`infer`, a request with invalid data getting its error in its place (see ModelServer.answer)."""
        return answer_each(self.infer, requests)

    def check_health(self) -> None:
        """onnxruntime's sessions keep no failure state: always healthy."""

    def status(self) -> dict[str, Any]:
        fill_rows = self._counts["rows"] + self._counts["padded_rows"]
        return {
            "device": self.provider,
            "pid": os.getpid(),
            "buckets": list(self.buckets),
            "captured": False,
            "capture_error": "onnxruntime serves uncaptured runs",
            "healthy": True,
            "failure": None,
            **self._counts,
            "batch_fill": self._counts["rows"] / fill_rows if fill_rows else None,
            "replay_ms_p50": float(np.median(self._replay_ms)) if self._replay_ms else None,
        }

    def inject_fault(self, kind: str, n: int = 1) -> None:
        raise InvalidArgumentError("inject_fault needs ortgpu's fake backend; onnxruntime has none")

    def profile(self) -> None:
        raise InvalidArgumentError("profiling traces are ortgpu's; onnxruntime's profiler is set at session creation")

    def end_profile(self) -> str:
        return ""

    def close(self) -> None:
        with self._lock:
            self.session = None
