"""Names programs import from ``onnxruntime.capi.onnxruntime_pybind11_state``: the exception types (each one of
ortgpu's typed errors) and ``OrtValueVector`` (a list of values), plus the session's Python classes."""

from __future__ import annotations

from typing import Any

from ortgpu_core import (
    DeviceError,
    InvalidArgumentError,
    InvalidModelError,
    ModelError,
    OrtGpuError,
    OrtValue,
    UnsupportedOpError,
)
from ortgpu_core._sparse import OrtSparseFormat, SparseCooView, SparseCsrView, SparseTensor

from .._lora_adapter import AdapterFormat, LoraAdapter
from .._ort_api import (
    ExecutionMode,
    ExecutionOrder,
    Fail,
    GraphOptimizationLevel,
    ModelMetadata,
    OrtDevice,
    OrtMemoryInfo,
    SessionOptions,
    get_all_providers,
    get_available_providers,
    get_build_info,
    get_device,
    get_version_string,
)
from .._run_options import NodeArg, RunOptions
from .._session import InferenceSession

__all__ = [
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "EngineError",
    "RuntimeException",
    "InvalidProtobuf",
    "ModelLoaded",
    "NotImplemented",
    "InvalidGraph",
    "EPFail",
    "OrtValueVector",
    "OrtValue",
    "RunOptions",
    "SessionOptions",
    "InferenceSession",
    "NodeArg",
    "ModelMetadata",
    "GraphOptimizationLevel",
    "ExecutionMode",
    "ExecutionOrder",
    "OrtDevice",
    "OrtMemoryInfo",
    "SparseTensor",
    "SparseCooView",
    "SparseCsrView",
    "OrtSparseFormat",
    "get_available_providers",
    "get_all_providers",
    "get_device",
    "get_build_info",
    "get_version_string",
    "get_default_session_options",
    "AdapterFormat",
    "LoraAdapter",
]

#: onnxruntime's exception names, as ortgpu's typed errors (``except InvalidArgument`` catches what ortgpu raises
#: for the same fault).
InvalidArgument = InvalidArgumentError
NoSuchFile = InvalidModelError
NoModel = InvalidModelError
InvalidProtobuf = InvalidModelError
InvalidGraph = InvalidModelError
ModelLoaded = ModelError
NotImplemented = UnsupportedOpError  # noqa: A001 - onnxruntime's name
EngineError = OrtGpuError
RuntimeException = OrtGpuError
EPFail = DeviceError


class OrtValueVector(list[Any]):
    """onnxruntime's vector of values (``run_with_ortvaluevector`` fills one): a list here."""


def get_default_session_options() -> SessionOptions:
    return SessionOptions()
