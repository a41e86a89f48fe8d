from ._allocator import DeviceAllocator as DeviceAllocator
from ._allocator import SessionAllocator as SessionAllocator
from ._allocator import SharedAllocator as SharedAllocator
from ._env import Device as Device
from ._env import Env as Env
from ._env import get_env as get_env
from ._errors import ArgumentTypeError as ArgumentTypeError
from ._errors import CaptureStateError as CaptureStateError
from ._errors import DeviceError as DeviceError
from ._errors import DeviceLostError as DeviceLostError
from ._errors import DtypeError as DtypeError
from ._errors import InvalidArgumentError as InvalidArgumentError
from ._errors import InvalidModelError as InvalidModelError
from ._errors import ModelError as ModelError
from ._errors import OrtGpuError as OrtGpuError
from ._errors import OutOfMemoryError as OutOfMemoryError
from ._errors import ProvenanceError as ProvenanceError
from ._errors import ReleasedValueError as ReleasedValueError
from ._errors import ShapeError as ShapeError
from ._errors import SparseTensorError as SparseTensorError
from ._errors import TransferRoutingError as TransferRoutingError
from ._errors import UnsafeAccessError as UnsafeAccessError
from ._errors import UnsupportedOpError as UnsupportedOpError
from ._errors import ValidationError as ValidationError
from ._routes import Endpoint as Endpoint
from ._routes import Route as Route
from ._routes import register_foreign_kind as register_foreign_kind
from ._routes import register_route as register_route
from ._routes import route_counts as route_counts
from ._routes import unregister_route as unregister_route
from ._transfer import copy_tensors as copy_tensors
from ._transfer import transfer as transfer
from ._transfer import transfer_route as transfer_route
from ._transfer import transfer_routes as transfer_routes
from ._value import CPU as CPU
from ._value import DeviceBuffer as DeviceBuffer
from ._value import OrtValue as OrtValue
from ._value import Provenance as Provenance
from ._value import WebGPU as WebGPU

__all__ = [
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
    "Env",
    "Device",
    "get_env",
    "OrtValue",
    "Provenance",
    "DeviceBuffer",
    "CPU",
    "WebGPU",
    "DeviceAllocator",
    "SharedAllocator",
    "SessionAllocator",
    "transfer",
    "transfer_route",
    "transfer_routes",
    "copy_tensors",
    "Route",
    "Endpoint",
    "register_route",
    "unregister_route",
    "register_foreign_kind",
    "route_counts",
]
