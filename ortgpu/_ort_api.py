"""onnxruntime's module-level Python API, as ortgpu answers it: providers, build information, ``SessionOptions``,
``GraphOptimizationLevel``, ``ExecutionMode``, ``OrtDevice``, ``OrtMemoryInfo``, ``ModelMetadata``.

These hold no device state.  ``SessionOptions`` fields that change nothing in ortgpu (threads, arenas, memory
patterns, log levels) are accepted and kept, documented as having no effect; those whose acceptance would change
results are either honoured (initializers, free dimension overrides, ``session.disable_cpu_ep_fallback``,
``graph_optimization_level``) or refused with a typed error (custom-op libraries).
"""

from __future__ import annotations

import enum
import os
import platform
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ortgpu_core import InvalidArgumentError, OrtValue, UnsupportedOpError
from ortgpu_core._errors import Fail

from ._version import __version__

__all__ = [
    "WEBGPU_PROVIDER",
    "CPU_PROVIDER",
    "Fail",
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
    "SessionOptions",
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
    "normalize_providers",
]

WEBGPU_PROVIDER = "WebGpuExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
_PROVIDERS = (WEBGPU_PROVIDER, CPU_PROVIDER)


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's optimization levels.  ``ORT_DISABLE_ALL`` plans node by node (``fuse=False``); every other
    level applies ortgpu's rewrites (BatchNormalization folding, epilogue fusion, Transpose folding)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """Accepted, no effect: ortgpu runs a session's planned steps in order on one device queue."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """Accepted, no effect: ortgpu's planner orders the nodes (topologically)."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class OrtAllocatorType(enum.IntEnum):
    """onnxruntime's allocator kinds, accepted where its API takes one (ortgpu's allocators are its own)."""

    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(enum.IntEnum):
    """onnxruntime's memory kinds, accepted where its API takes one (``DEFAULT``: the device's own memory)."""

    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


class OrtDevice:
    """A device as onnxruntime names it: ``OrtDevice(OrtDevice.cpu(), OrtDevice.default_memory(), 0)``.

    ortgpu's WebGPU devices are ``OrtDevice.gpu()`` with vendor id 0 here (the adapter's vendor is on
    :class:`ortgpu.Device`).
    """

    __slots__ = ("_type", "_mem", "_id", "_vendor")

    def __init__(self, device_type: int, memory_type: int, device_id: int, vendor_id: int = 0) -> None:
        self._type = int(device_type)
        self._mem = int(memory_type)
        self._id = int(device_id)
        self._vendor = int(vendor_id)

    @staticmethod
    def cpu() -> int:
        """The device type of the host."""
        return 0

    @staticmethod
    def cuda() -> int:
        """onnxruntime's CUDA device type (the same number as :meth:`gpu`)."""
        return 1

    @staticmethod
    def gpu() -> int:
        """The device type of a GPU: ortgpu's WebGPU devices have it."""
        return 1

    @staticmethod
    def fpga() -> int:
        """onnxruntime's FPGA device type (no ortgpu device has it)."""
        return 2

    @staticmethod
    def npu() -> int:
        """onnxruntime's NPU device type (no ortgpu device has it)."""
        return 3

    @staticmethod
    def dml() -> int:
        """onnxruntime's DirectML device type (no ortgpu device has it)."""
        return 4

    @staticmethod
    def default_memory() -> int:
        """The memory type of a device's own memory."""
        return 0

    @staticmethod
    def make(ort_device_name: str, device_id: int, vendor_id: int = -1) -> OrtDevice:
        """onnxruntime's factory by name: ``"cpu"``, ``"gpu"`` or ``"webgpu"`` (ortgpu's devices), or one of
        onnxruntime's other names (``"cuda"``, ``"dml"``, ``"cann"``, ``"npu"``), which describe devices ortgpu has
        none of but which programs pass on, e.g. to ask for a CUDA copy (which ortgpu then refuses).  Each name
        gives onnxruntime's device type and vendor id; ``vendor_id`` (a PCI id, when >= 0) replaces the vendor."""
        known = _DEVICE_NAMES.get(ort_device_name) if isinstance(ort_device_name, str) else None
        if known is None:
            raise InvalidArgumentError(
                f"Unsupported device type: {ort_device_name!r}; OrtDevice.make takes one of {sorted(_DEVICE_NAMES)}"
            )
        device_type, name_vendor = known
        return OrtDevice(
            device_type, OrtDevice.default_memory(), device_id, name_vendor if vendor_id < 0 else vendor_id
        )

    def device_type(self) -> int:
        """The device type (:meth:`cpu`, :meth:`gpu`, ...)."""
        return self._type

    def device_id(self) -> int:
        """The device's index among devices of its type."""
        return self._id

    def device_mem_type(self) -> int:
        """The memory type (:meth:`default_memory` for the device's own memory)."""
        return self._mem

    def device_vendor_id(self) -> int:
        """The PCI vendor id given at construction (0 when none was)."""
        return self._vendor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtDevice) and (self._type, self._mem, self._id, self._vendor) == (
            other._type,
            other._mem,
            other._id,
            other._vendor,
        )

    def __hash__(self) -> int:
        return hash((self._type, self._mem, self._id, self._vendor))

    def __repr__(self) -> str:
        return f"OrtDevice(type={self._type}, mem={self._mem}, id={self._id}, vendor={self._vendor})"


#: ``OrtDevice.make``'s names: (device type, PCI vendor id), as onnxruntime gives them.
_DEVICE_NAMES: dict[str, tuple[int, int]] = {
    "cpu": (0, 0),
    "gpu": (1, 0),
    "webgpu": (1, 0),
    "cuda": (1, 0x10DE),
    "dml": (1, 0x1414),
    "cann": (3, 0x19E5),
    "npu": (3, 0),
}


@dataclass(frozen=True)
class OrtMemoryInfo:
    """``OrtMemoryInfo(name, alloc_type, id, mem_type)``, as onnxruntime spells it; ``name`` is "Cpu" or
    "WebGPU_Buffer" (onnxruntime's WebGPU name)."""

    name: str
    alloc_type: int = OrtAllocatorType.ORT_ARENA_ALLOCATOR
    id: int = 0
    mem_type: int = OrtMemType.DEFAULT


_ARENA_FIELDS = (
    "max_mem",
    "arena_extend_strategy",
    "initial_chunk_size_bytes",
    "max_dead_bytes_per_chunk",
    "initial_growth_chunk_size_bytes",
    "max_power_of_two_extend_bytes",
)


class OrtArenaCfg:
    """onnxruntime's arena settings: ``OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes,
    max_dead_bytes_per_chunk)`` or ``OrtArenaCfg({name: value})``.  Kept and readable; ortgpu's allocators are not
    arenas (device memory comes from the session's or a shared allocator), so they change nothing."""

    max_mem: int
    arena_extend_strategy: int
    initial_chunk_size_bytes: int
    max_dead_bytes_per_chunk: int
    initial_growth_chunk_size_bytes: int
    max_power_of_two_extend_bytes: int

    def __init__(self, *args: int | Mapping[str, int]) -> None:
        values = dict.fromkeys(_ARENA_FIELDS, -1)
        if len(args) == 1 and isinstance(args[0], Mapping):
            unknown = sorted(set(args[0]) - set(_ARENA_FIELDS))
            if unknown:
                raise InvalidArgumentError(f"OrtArenaCfg: unknown keys {unknown}; it takes {list(_ARENA_FIELDS)}")
            values.update({str(k): int(v) for k, v in args[0].items()})
        elif len(args) == 4 and all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            values.update(zip(_ARENA_FIELDS, (int(a) for a in args if isinstance(a, int))))
        else:
            raise InvalidArgumentError(
                "OrtArenaCfg takes (max_mem, arena_extend_strategy, initial_chunk_size_bytes, max_dead_bytes_per_chunk)"
                " as ints, or one dict of those names"
            )
        for name, value in values.items():
            setattr(self, name, value)


def create_and_register_allocator(memory_info: OrtMemoryInfo, arena_cfg: OrtArenaCfg | None = None) -> None:
    """onnxruntime's process-wide arena allocator for sessions that set ``session.use_env_allocators``: accepted, no
    effect (checked for type).  ortgpu shares device memory between sessions through ``env.shared_allocator()``."""
    if not isinstance(memory_info, OrtMemoryInfo):
        raise InvalidArgumentError(f"create_and_register_allocator needs an OrtMemoryInfo, got {memory_info!r}")
    if arena_cfg is not None and not isinstance(arena_cfg, OrtArenaCfg):
        raise InvalidArgumentError(
            f"create_and_register_allocator: arena_cfg must be an OrtArenaCfg, got {arena_cfg!r}"
        )


@dataclass(frozen=True)
class ModelMetadata:
    """``session.get_modelmeta()``: the model's metadata, as onnxruntime's ``ModelMetadata`` has it."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


#: Session config keys ortgpu acts on; every other key is kept (``get_session_config_entry``) with no effect.
DISABLE_CPU_FALLBACK_KEY = "session.disable_cpu_ep_fallback"


class SessionOptions:
    """onnxruntime's ``SessionOptions``.  What each field does in ortgpu:

    * ``graph_optimization_level``: ``ORT_DISABLE_ALL`` plans node by node (``fuse=False``); others fuse.
    * ``enable_profiling`` / ``profile_file_prefix``: the session's profiler (``end_profiling()`` writes the trace).
    * ``optimized_model_filepath``: the model as loaded (after the initializer and dimension overrides) is saved
      there; ortgpu's plan rewrites are not ONNX, so it is not "optimized".
    * ``add_initializer`` / ``add_external_initializers``: replace the model's initializers of those names.
    * ``add_free_dimension_override_by_name``: fixes the inputs' symbolic dimensions of that name.
    * config entry ``session.disable_cpu_ep_fallback`` = "1": no node may run on the CPU
      (``allow_cpu_fallback=False``).  Every other config entry is kept and has no effect.
    * ``add_free_dimension_override_by_denotation``: fixes the inputs' symbolic dimensions with that denotation.
    * ``register_custom_ops_library``: refused (:class:`UnsupportedOpError`): ortgpu cannot load native kernels.
    * No effect (accepted, kept, documented): ``execution_mode``, ``execution_order``, ``intra_op_num_threads``,
      ``inter_op_num_threads``, ``enable_cpu_mem_arena``, ``enable_mem_pattern``, ``enable_mem_reuse``,
      ``use_deterministic_compute`` (ortgpu's kernels are deterministic), ``log_severity_level``,
      ``log_verbosity_level``, ``logid``, ``use_per_session_threads``.
    """

    def __init__(self) -> None:
        self.graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode: ExecutionMode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order: ExecutionOrder = ExecutionOrder.DEFAULT
        self.intra_op_num_threads: int = 0
        self.inter_op_num_threads: int = 0
        self.enable_profiling: bool = False
        self.profile_file_prefix: str = "onnxruntime_profile_"
        self.optimized_model_filepath: str = ""
        self.log_severity_level: int = -1  # onnxruntime's default: the process logger's level
        self.log_verbosity_level: int = 0
        self.logid: str = ""
        self.enable_mem_pattern: bool = True
        self.enable_mem_reuse: bool = True
        self.enable_cpu_mem_arena: bool = True
        self.use_deterministic_compute: bool = False
        self.use_per_session_threads: bool = True
        self._config: dict[str, str] = {}
        self._initializers: dict[str, OrtValue[Any] | npt.NDArray[Any]] = {}
        self._free_dimensions: dict[str, int] = {}
        self._free_denotations: dict[str, int] = {}

    # -- config entries -------------------------------------------------------------
    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set a session config entry, as onnxruntime's.  ortgpu acts on ``session.disable_cpu_ep_fallback``
        (``"1"``: refuse models with nodes the device cannot run); other keys are kept and have no effect."""
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        """The value set for ``key`` by :meth:`add_session_config_entry`.

        Raises
        ------
        Fail
            No value was set for ``key`` (onnxruntime's error).
        """
        try:
            return self._config[key]
        except KeyError:
            raise Fail(f"SessionOptions does not have configuration with key: {key}") from None

    # -- overrides ----------------------------------------------------------------------
    def add_initializer(self, name: str, value: OrtValue[Any] | npt.NDArray[Any]) -> None:
        """Replace the model's initializer ``name`` with ``value`` (a host OrtValue or a numpy array) in sessions
        made with these options.  The type and shape must match the model's initializer."""
        if not isinstance(value, (OrtValue, np.ndarray)):
            raise InvalidArgumentError(f"add_initializer({name!r}, ...) takes an OrtValue or a numpy array")
        self._initializers[str(name)] = value

    def add_external_initializers(
        self, names: Sequence[str], values: Sequence[OrtValue[Any] | npt.NDArray[Any]]
    ) -> None:
        """:meth:`add_initializer` for each pair of ``names`` and ``values``.

        Raises
        ------
        InvalidArgumentError
            The two sequences differ in length (nothing is added).
        """
        if len(names) != len(values):
            raise InvalidArgumentError(f"add_external_initializers: {len(names)} names but {len(values)} values")
        for name, value in zip(names, values):
            self.add_initializer(name, value)

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the inputs' symbolic dimension named ``dim_name`` (e.g. "batch") to ``dim_value`` in sessions made
        with these options.

        Raises
        ------
        InvalidArgumentError
            ``dim_value`` is negative.
        """
        if int(dim_value) < 0:
            raise InvalidArgumentError(f"free dimension {dim_name!r}: size must be >= 0, got {dim_value}")
        self._free_dimensions[str(dim_name)] = int(dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        """Fix the inputs' symbolic dimensions whose denotation is ``dim_denotation`` (e.g. "DATA_BATCH")."""
        if int(dim_value) < 0:
            raise InvalidArgumentError(f"free dimension {dim_denotation!r}: size must be >= 0, got {dim_value}")
        self._free_denotations[str(dim_denotation)] = int(dim_value)

    def register_custom_ops_library(self, library_path: str) -> None:
        """Refused: onnxruntime's custom-op libraries are native kernels for its C API, which ortgpu cannot run.

        Raises
        ------
        UnsupportedOpError
            Always.
        """
        raise UnsupportedOpError(
            f"register_custom_ops_library({library_path!r}): ortgpu cannot load onnxruntime custom-op libraries "
            "(native kernels for onnxruntime's C API); models with custom-domain ops are refused at load"
        )

    # -- what sessions read -------------------------------------------------------------
    def initializer_arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The added initializers as host arrays (device values are read back)."""
        out: dict[str, npt.NDArray[Any]] = {}
        for name, value in self._initializers.items():
            if isinstance(value, np.ndarray):
                out[name] = value
            elif value.device_name() == "cpu":
                out[name] = np.array(value.numpy())
            else:
                buffer = value._device_buffer
                if buffer is None:
                    raise InvalidArgumentError(f"add_initializer({name!r}): the value holds no data")
                out[name] = buffer.read(tuple(value.shape()), value.dtype)
        return out

    def free_dimensions(self) -> dict[str, int]:
        """A copy of the overrides by name (:meth:`add_free_dimension_override_by_name`)."""
        return dict(self._free_dimensions)

    def free_denotations(self) -> dict[str, int]:
        """A copy of the overrides by denotation (:meth:`add_free_dimension_override_by_denotation`)."""
        return dict(self._free_denotations)

    def config_entries(self) -> dict[str, str]:
        """A copy of every session config entry set."""
        return dict(self._config)

    @property
    def disables_cpu_fallback(self) -> bool:
        """True when ``session.disable_cpu_ep_fallback`` is ``"1"``: sessions refuse nodes the device cannot run."""
        return self._config.get(DISABLE_CPU_FALLBACK_KEY, "0") == "1"


# -- module functions ---------------------------------------------------------------------
def get_available_providers() -> list[str]:
    """The providers ortgpu has: ``["WebGpuExecutionProvider", "CPUExecutionProvider"]`` (the CPU one runs
    nodes the device cannot, or, alone, the whole model through the numpy twins of the kernels: slow)."""
    return list(_PROVIDERS)


def get_all_providers() -> list[str]:
    """onnxruntime lists every provider it knows, CPU last; ortgpu knows these two."""
    return list(_PROVIDERS)


def get_device() -> str:
    """onnxruntime's build-target name: "WebGPU" (ortgpu's default device type)."""
    return "WebGPU"


def get_version_string() -> str:
    """ortgpu's version, where onnxruntime returns its own."""
    return __version__


def get_build_info() -> str:
    """One line naming ortgpu's version, its device backend, the Python version and the OS."""
    return (
        f"ortgpu Build Info: version={__version__}, backend=wgpu-native (WGSL kernels), "
        f"python={platform.python_version()}, os={os.name}"
    )


def enable_telemetry_events() -> None:
    """No effect: ortgpu sends no telemetry."""


def disable_telemetry_events() -> None:
    """No effect: ortgpu sends no telemetry."""


def set_default_logger_severity(severity: int) -> None:
    """Accepted, no effect (ortgpu logs nothing by itself)."""
    if not 0 <= int(severity) <= 4:
        raise InvalidArgumentError(f"severity must be 0..4, got {severity}")


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted, no effect."""


def set_seed(seed: int) -> None:
    """Accepted, no effect: ortgpu has no random operators that draw from a session seed."""


ProviderArg = str | tuple[str, Mapping[str, Any]]


def normalize_providers(
    providers: Sequence[ProviderArg] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    *,
    strict: bool = False,
) -> tuple[list[str], list[dict[str, str]]]:
    """onnxruntime's provider arguments (names, or ``(name, options)`` pairs; or names with a parallel
    ``provider_options`` list) as names and options.

    As onnxruntime's constructor does, a provider ortgpu does not have (``CUDAExecutionProvider`` in the common
    ``["CUDAExecutionProvider", "CPUExecutionProvider"]``) and a repeated one are skipped with a warning
    (``RuntimeWarning``, saying what runs instead), and a list left empty falls back to the CPU provider; ``strict``
    (``set_providers``) refuses an unknown name instead."""
    if providers is None:
        return [WEBGPU_PROVIDER, CPU_PROVIDER], [{}, {}]
    if isinstance(providers, str):
        raise InvalidArgumentError(f"providers must be a list of names, got the string {providers!r}")
    if provider_options is not None and len(provider_options) != len(providers):
        raise InvalidArgumentError("'providers' and 'provider_options' should be the same length if both are given.")
    names: list[str] = []
    options: list[dict[str, str]] = []
    for index, item in enumerate(providers):
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[0], str) or not isinstance(item[1], Mapping):
                raise InvalidArgumentError(f"provider {item!r}: expected a name or a (name, options dict) pair")
            if provider_options is not None:
                raise InvalidArgumentError(
                    "Only one of 'providers' and 'provider_options' can contain provider options."
                )
            name, opts = item[0], dict(item[1])
        elif isinstance(item, str):
            name = item
            opts = dict(provider_options[index]) if provider_options is not None else {}
        else:
            raise InvalidArgumentError(f"provider {item!r}: expected a name or a (name, options dict) pair")
        if name not in _PROVIDERS:
            message = f"{name} is not in available provider names. Available providers: '{', '.join(_PROVIDERS)}'"
            if strict:
                raise InvalidArgumentError(message)
            warnings.warn(
                f"Specified provider '{name}' is not in available provider names (available: {', '.join(_PROVIDERS)});"
                f" skipped. ortgpu's GPU provider is '{WEBGPU_PROVIDER}': list it to run on the GPU",
                RuntimeWarning,
                stacklevel=5,
            )
            continue
        if name in names:
            if strict:
                raise InvalidArgumentError(f"provider {name!r} is listed twice")
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", RuntimeWarning, stacklevel=5)
            continue
        names.append(name)
        options.append({str(k): str(v) for k, v in opts.items()})
    if not names:
        if strict or not providers:
            raise InvalidArgumentError(f"providers is empty; available providers: {list(_PROVIDERS)}")
        warnings.warn(
            f"no provider of the list is available; falling back to ['{CPU_PROVIDER}'] (the model runs on the host). "
            f"List '{WEBGPU_PROVIDER}' to run on the GPU",
            RuntimeWarning,
            stacklevel=5,
        )
        return [CPU_PROVIDER], [{}]
    return names, options
