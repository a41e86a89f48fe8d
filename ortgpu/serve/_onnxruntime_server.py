"""The comparison runtime of the serving deployment: the same model served by onnxruntime, with the interface of
:class:`~ortgpu.serve._server.ModelServer` (``application(..., runtime="onnxruntime")``).

onnxruntime's WebGPU plugin EP (``onnxruntime-ep-webgpu``) where it is installed and finds a device, else its CPU
provider; uncaptured (its capture needs IOBinding with fixed device buffers per shape, which a serving loop of
changing batch sizes would have to manage by hand).  Batches are padded to the same buckets as ortgpu's, so both
runtimes compute the same shapes."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core import InvalidArgumentError

from ._server import DEFAULT_BUCKETS, BucketedServer, input_rows

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


class OnnxruntimeServer(BucketedServer):
    """:class:`ModelServer`'s interface over an onnxruntime session (see the module docstring)."""

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes,
        *,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        row_shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self._start(buckets)
        source = model if isinstance(model, bytes) else os.fspath(model)
        self.session, self.provider = _session(source)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._rows, self.input_dtypes = input_rows(self.session.get_inputs(), row_shapes or {})

    def _run(self, feeds: dict[str, np.ndarray], size: int) -> Mapping[str, Any]:
        try:
            return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))
        except Exception as error:  # noqa: BLE001 - onnxruntime's errors have no common base
            # onnxruntime keeps no device state to lose: a failing run is the data's (an index out of range)
            raise InvalidArgumentError(f"onnxruntime failed on this batch: {error}") from error

    def check_health(self) -> None:
        """onnxruntime's sessions keep no failure state: always healthy."""

    def status(self) -> dict[str, Any]:
        return {
            "device": self.provider,
            "pid": os.getpid(),
            "buckets": list(self.buckets),
            "captured": False,
            "capture_error": "onnxruntime serves uncaptured runs",
            "healthy": True,
            "failure": None,
            **self._usage(),
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
