"""wgpu-native's shared library through cffi (ABI mode): loading it, and the small conversions every call needs.

The library and its headers come from the ``wgpu`` wheel's ``resources/``
folder, found without importing wgpu-py; the cffi ``cdef`` is generated from
those headers by :mod:`ortgpu_core.backends._cdef`.  Also here: C strings
(``WGPUStringView``) both ways, C enum names, native pointers as ``int``, and
WebGPU's names of the C feature enums.

Process-wide, and stateless apart from two ``functools.lru_cache`` results (the
loaded library and the feature tables), which need no lock of ours.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from typing import Any

from . import _cdef

_LIBRARY_NAME = "libwgpu_native-release.so"

# WebGPU's spelling of the standard features whose C enum names do not convert
# mechanically (CamelCase -> kebab-case) to it.
_FEATURE_NAME_OVERRIDES = {
    "Depth32FloatStencil8": "depth32float-stencil8",
    "TextureCompressionBCSliced3D": "texture-compression-bc-sliced-3d",
    "TextureCompressionASTCSliced3D": "texture-compression-astc-sliced-3d",
    "RG11B10UfloatRenderable": "rg11b10ufloat-renderable",
    "BGRA8UnormStorage": "bgra8unorm-storage",
}


def native_version() -> str:
    """wgpu-native's own version, e.g. ``"29.0.0.0"`` (from ``wgpuGetVersion``)."""
    _, lib = load_native()
    # uint32_t wgpuGetVersion(void): one byte per component, most significant first
    packed = int(lib.wgpuGetVersion())
    return ".".join(str((packed >> shift) & 0xFF) for shift in (24, 16, 8, 0))


@functools.lru_cache(maxsize=1)
def load_native() -> tuple[Any, Any]:
    """``(ffi, lib)`` for wgpu-native, loaded once per process."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(_cdef.generated_cdef_path().read_text(encoding="utf-8"))
    _give_the_driver_a_runtime_dir()
    lib = ffi.dlopen(str(_cdef.wgpu_resources_dir() / _LIBRARY_NAME))
    return ffi, lib


def _give_the_driver_a_runtime_dir() -> None:
    """Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid or not set" (on stderr, several times per process)
    when the variable is unset, as in containers, CI and cron jobs.  Compute needs no display, so when it is unset or
    not a directory, point it at a private (0700) folder of ours; a valid setting is left alone."""
    current = os.environ.get("XDG_RUNTIME_DIR", "")
    if current and os.path.isdir(current):
        return
    folder = tempfile.mkdtemp(prefix="ortgpu-runtime-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["XDG_RUNTIME_DIR"] = folder


def feature_name(enum_name: str) -> str:
    """WebGPU's name of a feature, from its C enum name without the prefix (``ShaderF16`` -> ``shader-f16``)."""
    if enum_name in _FEATURE_NAME_OVERRIDES:
        return _FEATURE_NAME_OVERRIDES[enum_name]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", enum_name).lower()


@functools.lru_cache(maxsize=1)
def _feature_tables() -> tuple[dict[int, str], dict[str, int]]:
    """``({enum value: WebGPU name}, {WebGPU name: enum value})`` over standard and native features."""
    ffi, _ = load_native()
    by_value: dict[int, str] = {}
    for type_name, prefix in (("WGPUFeatureName", "WGPUFeatureName_"), ("WGPUNativeFeature", "WGPUNativeFeature_")):
        for value, name in ffi.typeof(type_name).elements.items():
            short = name[len(prefix) :]
            if short not in ("Force32",):
                by_value[int(value)] = feature_name(short)
    return by_value, {name: value for value, name in by_value.items()}


def _enum_suffix(type_name: str, value: int) -> str:
    ffi, _ = load_native()
    name: str = ffi.typeof(type_name).elements.get(int(value), f"{type_name}_Unknown")
    return name.split("_", 1)[1]


def _string(view: Any) -> str:
    """A ``WGPUStringView`` as ``str`` (it may be NULL, or lack a terminating NUL)."""
    ffi, lib = load_native()
    if view.data == ffi.NULL:
        return ""
    if view.length == lib.WGPU_STRLEN:
        return bytes(ffi.string(view.data)).decode("utf-8", "replace")
    return bytes(ffi.buffer(view.data, view.length)).decode("utf-8", "replace")


def _string_view(text: str, keep: list[Any]) -> Any:
    """A ``WGPUStringView`` over ``text``; the backing memory is appended to ``keep``."""
    ffi, _ = load_native()
    encoded = text.encode("utf-8")
    data = ffi.new("char[]", encoded)
    keep.append(data)
    view = ffi.new("WGPUStringView *")
    view.data = data
    view.length = len(encoded)
    return view[0]


def _address(pointer: Any) -> int:
    ffi, _ = load_native()
    return int(ffi.cast("uintptr_t", pointer))
