"""ortgpu_core: the Cython object model of ortgpu and its device backends.

The public API is :mod:`ortgpu`, which re-exports these classes.  This
package never imports :mod:`ortgpu`; the backends never import the object
model.
"""

from . import _env, _routes, _value
from ._allocator import DeviceAllocator, SessionAllocator, SharedAllocator
from ._env import Device, Env, get_env
from ._errors import *  # noqa: F401,F403
from ._errors import __all__ as _error_names
from ._routes import Endpoint, Route, register_foreign_kind, register_route, route_counts, unregister_route
from ._transfer import copy_tensors, transfer, transfer_route, transfer_routes
from ._value import CPU, DeviceBuffer, OrtValue, Provenance, WebGPU

# The composition root: the Env and the values call up into the allocators and the route table, which build on
# them; wiring them here keeps every import pointing down (tests/test_layers.py checks it).
_env._connect(SharedAllocator._create, register_foreign_kind)
_value._connect(_routes.run_transfer, _routes.endpoint)

__all__ = [
    *_error_names,
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
