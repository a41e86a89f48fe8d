"""ortgpu: ONNX models on WebGPU (wgpu-native), with safe GPU graph capture and replay.

>>> import ortgpu
>>> env = ortgpu.get_env()
>>> sess = ortgpu.InferenceSession("model.onnx", env=env, graph_capture=True)

The object model (values, allocators, bindings, captured graphs) is the
Cython package :mod:`ortgpu_core`, re-exported here; sessions, model loading,
planning and operators live in this package.
"""

from __future__ import annotations

from ortgpu_core import (
    CPU,
    ArgumentTypeError,
    CaptureStateError,
    Device,
    DeviceAllocator,
    DeviceError,
    DeviceLostError,
    DtypeError,
    Env,
    InvalidArgumentError,
    InvalidModelError,
    ModelError,
    OrtGpuError,
    OrtValue,
    OutOfMemoryError,
    Provenance,
    ProvenanceError,
    ReleasedValueError,
    SessionAllocator,
    ShapeError,
    SharedAllocator,
    SparseTensorError,
    TransferRoutingError,
    UnsafeAccessError,
    UnsupportedOpError,
    ValidationError,
    WebGPU,
    copy_tensors,
    get_env,
    transfer_route,
    transfer_routes,
)
from ortgpu_core._binding import FrozenIOBinding, IOBinding
from ortgpu_core._graph import CapturedGraph
from ortgpu_core._sparse import OrtSparseFormat, SparseTensor

from ._adapter_format import AdapterFileError
from ._lora_adapter import AdapterFormat, LoraAdapter
from ._ort_api import (
    ExecutionMode,
    ExecutionOrder,
    Fail,
    GraphOptimizationLevel,
    ModelMetadata,
    OrtAllocatorType,
    OrtArenaCfg,
    OrtDevice,
    OrtMemoryInfo,
    OrtMemType,
    SessionOptions,
    create_and_register_allocator,
    disable_telemetry_events,
    enable_telemetry_events,
    get_all_providers,
    get_available_providers,
    get_build_info,
    get_device,
    get_version_string,
    set_default_logger_severity,
    set_default_logger_verbosity,
    set_seed,
)
from ._run_options import NodeArg, NodePlacement, RunOptions
from ._session import InferenceSession
from ._version import __version__
from .generation import Generator

__all__ = [
    "__version__",
    "Env",
    "Device",
    "get_env",
    "InferenceSession",
    "Generator",
    "RunOptions",
    "NodeArg",
    "NodePlacement",
    "OrtValue",
    "Provenance",
    "CPU",
    "WebGPU",
    "DeviceAllocator",
    "SharedAllocator",
    "SessionAllocator",
    "IOBinding",
    "FrozenIOBinding",
    "CapturedGraph",
    "transfer_route",
    "transfer_routes",
    "copy_tensors",
    "OrtGpuError",
    "ProvenanceError",
    "CaptureStateError",
    "TransferRoutingError",
    "UnsafeAccessError",
    "ReleasedValueError",
    "DeviceError",
    "OutOfMemoryError",
    "ValidationError",
    "DeviceLostError",
    "ModelError",
    "UnsupportedOpError",
    "InvalidModelError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "ShapeError",
    "DtypeError",
    "SparseTensorError",
    # onnxruntime's module surface (ortgpu._ort_api)
    "SessionOptions",
    "GraphOptimizationLevel",
    "ExecutionMode",
    "ExecutionOrder",
    "OrtAllocatorType",
    "OrtArenaCfg",
    "create_and_register_allocator",
    "OrtMemType",
    "OrtDevice",
    "OrtMemoryInfo",
    "ModelMetadata",
    "SparseTensor",
    "OrtSparseFormat",
    "Fail",
    "get_available_providers",
    "get_all_providers",
    "get_device",
    "get_version_string",
    "get_build_info",
    "enable_telemetry_events",
    "disable_telemetry_events",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_seed",
    # LoRA adapters (ortgpu._lora_adapter)
    "AdapterFormat",
    "LoraAdapter",
    "AdapterFileError",
]
