"""``onnxruntime.capi._pybind_state``: the same names as :mod:`ortgpu.capi.onnxruntime_pybind11_state`."""

from .onnxruntime_pybind11_state import *  # noqa: F403
from .onnxruntime_pybind11_state import __all__ as __all__
