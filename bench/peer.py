"""The comparison peer: onnxruntime, with its WebGPU plugin EP when installed, else its CPU provider (or the CPU
provider on request: ``provider="cpu"``, the arm that small recurrent models are usually deployed on).

Same model, same I/O pattern (fixed inputs and outputs bound through an
IOBinding, updated in place) and the same boundaries as the ortgpu arms.
"""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

__all__ = ["OnnxruntimeArms", "peer_versions", "webgpu_ep_available"]

_registered = False


def _webgpu_ep_device() -> Any | None:
    """The onnxruntime EP device of the WebGPU plugin, registering the plugin once; None if unavailable."""
    global _registered
    try:
        import onnxruntime as ort
        import onnxruntime_ep_webgpu as webgpu_ep
    except ImportError:
        return None
    if not _registered:
        ort.register_execution_provider_library("webgpu", webgpu_ep.get_library_path())
        _registered = True
    return next((d for d in ort.get_ep_devices() if d.ep_name == webgpu_ep.get_ep_name()), None)


def webgpu_ep_available() -> bool:
    """Whether onnxruntime's WebGPU plugin EP is installed (then ``provider="auto"`` uses it)."""
    return _webgpu_ep_device() is not None


def peer_versions() -> dict[str, str]:
    versions = {}
    try:
        import onnxruntime as ort

        versions["onnxruntime"] = ort.__version__
    except ImportError:
        return versions
    try:
        from importlib.metadata import version

        versions["onnxruntime-ep-webgpu"] = version("onnxruntime-ep-webgpu")
    except Exception:
        pass
    return versions


class OnnxruntimeArms:
    """One onnxruntime session (graph capture on or off) with fixed bound I/O."""

    def __init__(
        self, model_bytes: bytes, feeds: dict[str, npt.NDArray[Any]], *, capture: bool, provider: str = "auto"
    ) -> None:
        """``provider``: ``"auto"`` (the WebGPU plugin EP when installed, else the CPU provider) or ``"cpu"``."""
        import onnxruntime as ort

        if provider not in ("auto", "cpu"):
            raise ValueError(f"provider must be 'auto' or 'cpu', not {provider!r}")
        self.capture = capture
        options = ort.SessionOptions()
        device = _webgpu_ep_device() if provider == "auto" else None
        if device is not None:
            options.add_provider_for_devices([device], {"enableGraphCapture": "1" if capture else "0"})
            self.provider = "WebGpuExecutionProvider"
            self.device_type = "webgpu"
        else:
            self.provider = "CPUExecutionProvider"
            self.device_type = "cpu"
        if capture and device is None:
            raise RuntimeError(
                "onnxruntime's CPU provider has no graph capture (install onnxruntime-ep-webgpu for a "
                "captured peer arm)"
            )
        self.session = ort.InferenceSession(
            model_bytes, sess_options=options, providers=None if device is not None else ["CPUExecutionProvider"]
        )
        self.feeds = feeds
        ordinary = ort.RunOptions()
        ordinary.add_run_config_entry("gpu_graph_id", "-1")  # a plain run is refused on a capture session otherwise
        reference = self.session.run(None, feeds, ordinary)
        self.binding = self.session.io_binding()
        self.inputs = {}
        self.io_placement = self.device_type
        for name, array in feeds.items():
            self.inputs[name] = self._value_from_numpy(ort, array)
            self.binding.bind_ortvalue_input(name, self.inputs[name])
        for info, array in zip(self.session.get_outputs(), reference):
            value = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, self.io_placement, 0)
            self.binding.bind_ortvalue_output(info.name, value)
        self.run_options = ort.RunOptions()
        if capture:
            self.run_options.add_run_config_entry("gpu_graph_id", "1")
        self.uncaptured_name = "onnxruntime-capture" if capture else "onnxruntime"

    def _value_from_numpy(self, ort: Any, array: npt.NDArray[Any]) -> Any:
        try:
            return ort.OrtValue.ortvalue_from_numpy(array, self.io_placement, 0)
        except Exception:
            # Device-placed OrtValues need the EP's allocator; fall back to host I/O and say so.
            self.io_placement = "cpu"
            return ort.OrtValue.ortvalue_from_numpy(array, "cpu", 0)

    def end_to_end(self) -> list[npt.NDArray[Any]]:
        for name, value in self.inputs.items():
            value.update_inplace(self.feeds[name])
        self.session.run_with_iobinding(self.binding, self.run_options)
        outputs: list[npt.NDArray[Any]] = self.binding.copy_outputs_to_cpu()
        return outputs

    @property
    def run_only_waits_for_device(self) -> bool:
        """Whether :meth:`run_only` ends when the device is idle.  onnxruntime's Python API has no wait for the
        WebGPU plugin EP's queue: ``synchronize_outputs()`` returns before the GPU work is done (on the H200, ResNet
        batch 16 captured: run_only 1.0 ms p50, end_to_end 31 ms), so with that EP run_only times the host call
        and the queue backs up into the next boundary's timings; compare end_to_end.  The CPU provider runs
        synchronously."""
        return self.provider == "CPUExecutionProvider"

    def run_only(self) -> None:
        self.session.run_with_iobinding(self.binding, self.run_options)
        self.binding.synchronize_outputs()
