"""Where a session's Env, device and model come from, as onnxruntime's ``SessionOptions`` and provider options
say: the CPU provider's Env, the WebGPU provider's ``deviceId``, ``session.load_config_from_model`` and
``optimized_model_filepath``.  :class:`ortgpu.InferenceSession` calls these while it is built.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ortgpu_core import Device, Env, InvalidArgumentError, UnsafeAccessError, get_env

from ._ort_api import (
    WEBGPU_PROVIDER,
    ExecutionMode,
    GraphOptimizationLevel,
    ProviderArg,
    SessionOptions,
    normalize_providers,
)

__all__ = ["cpu_env", "device_from_options", "save_loaded_model", "config_from_model"]


_cpu_env_instance: Env | None = None


_cpu_env_guard = threading.Lock()


def cpu_env() -> Env:
    """The process's host Env (the fake backend: numpy twins of the kernels) for CPU-only sessions."""
    global _cpu_env_instance
    with _cpu_env_guard:
        if _cpu_env_instance is None or _cpu_env_instance.closed:
            _cpu_env_instance = Env(backend="fake")
        return _cpu_env_instance


#: onnxruntime WebGPU provider options that mean nothing here (its Dawn device, buffer caches, layout and
#: debugging): accepted so an onnxruntime program runs unchanged, kept, reported by ``get_provider_options()``, and
#: without effect (ortgpu plans its own layouts and buffers).  Where onnxruntime takes a fixed set of values, a value
#: outside it is refused as onnxruntime refuses it.
WEBGPU_OPTIONS_WITHOUT_EFFECT: dict[str, frozenset[str] | None] = {
    "preferredLayout": frozenset({"NCHW", "NHWC"}),
    "storageBufferCacheMode": frozenset({"disabled", "lazyRelease", "simple", "bucket", "graph"}),
    "uniformBufferCacheMode": frozenset({"disabled", "lazyRelease", "simple", "bucket", "graph"}),
    "queryResolveBufferCacheMode": frozenset({"disabled", "lazyRelease", "simple", "bucket", "graph"}),
    "defaultBufferCacheMode": frozenset({"disabled", "lazyRelease", "simple", "bucket", "graph"}),
    "validationMode": frozenset({"disabled", "wgpuOnly", "basic", "full"}),
    "dawnBackendType": frozenset({"D3D12", "Vulkan"}),
    "forceCpuNodeNames": None,
    "enablePIXCapture": frozenset({"0", "1"}),
    "preserveDevice": frozenset({"0", "1"}),
    "powerPreference": frozenset({"high-performance", "low-power"}),
}
#: Options that hand onnxruntime a native WebGPU object by address, which ortgpu never takes (a pointer carries no
#: provenance); ``env=`` / ``device=`` choose the device instead.
WEBGPU_POINTER_OPTIONS = frozenset({"webgpuInstance", "webgpuAdapter", "webgpuDevice", "dawnProcTable"})
#: What the options are called in onnxruntime's session-config spelling (``ep.webgpuexecutionprovider.deviceId``).
_OPTION_PREFIXES = ("ep.webgpuexecutionprovider.", "ep.WebGpuExecutionProvider.", "WebGPU:")


def _bare_option(key: str) -> str:
    for prefix in _OPTION_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def device_from_options(env: Env, options: Mapping[str, str]) -> Device:
    """The WebGPU provider's ``deviceId`` (or ``device_id``) option: an index into ``env.devices``; the other
    options onnxruntime's WebGPU provider takes are checked (:data:`WEBGPU_OPTIONS_WITHOUT_EFFECT`)."""
    options = {_bare_option(key): value for key, value in options.items()}
    known = {"deviceId", "device_id", "enableGraphCapture"} | set(WEBGPU_OPTIONS_WITHOUT_EFFECT)
    pointers = sorted(set(options) & WEBGPU_POINTER_OPTIONS)
    if pointers:
        raise UnsafeAccessError(
            f"WebGpuExecutionProvider options {pointers} hand over a native WebGPU object by address, which ortgpu "
            "never takes; choose the device with InferenceSession(..., env=..., device=...) or the deviceId option"
        )
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidArgumentError(
            f"WebGpuExecutionProvider options {unknown} are not supported by ortgpu; it knows {sorted(known)} "
            "(pass env=/device= for more control)"
        )
    for key, allowed in WEBGPU_OPTIONS_WITHOUT_EFFECT.items():
        if allowed is not None and key in options and options[key] not in allowed:
            raise InvalidArgumentError(
                f"WebGpuExecutionProvider option {key}={options[key]!r}: expected one of {sorted(allowed)}"
            )
    raw = options.get("deviceId", options.get("device_id", "0"))
    try:
        index = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"WebGpuExecutionProvider deviceId must be an integer, got {raw!r}") from None
    if not 0 <= index < len(env.devices):
        raise InvalidArgumentError(f"WebGpuExecutionProvider deviceId {index}: this Env has {len(env.devices)} devices")
    return env.devices[index]


def save_loaded_model(source: object, options: SessionOptions) -> None:
    """``optimized_model_filepath``: save the model as loaded (ortgpu's rewrites are not ONNX; overrides applied).
    onnxruntime's config entries ``session.optimized_model_external_initializers_file_name`` (a file next to the
    saved model) and ``..._min_size_in_bytes`` put the larger initializers in an external data file."""
    import onnx
    from onnx import external_data_helper

    from .loader._model import _apply_overrides, _parse

    model, model_dir = _parse(source)  # type: ignore[arg-type]
    _apply_overrides(model, options.initializer_arrays(), options.free_dimensions(), options.free_denotations())
    if model_dir is not None and any(
        external_data_helper.uses_external_data(t) for t in external_data_helper._get_all_tensors(model)
    ):
        external_data_helper.load_external_data_for_model(model, model_dir)
    config = options.config_entries()
    external = config.get("session.optimized_model_external_initializers_file_name", "")
    path = options.optimized_model_filepath
    if external:
        threshold = int(config.get("session.optimized_model_external_initializers_min_size_in_bytes", "1024"))
        data_path = os.path.join(os.path.dirname(os.path.abspath(path)), external)
        if os.path.exists(data_path):
            os.remove(data_path)  # onnxruntime overwrites it; onnx's writer would append
        onnx.save_model(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=external,
            size_threshold=threshold,
        )
        # onnxruntime writes the data file even when no initializer reaches the threshold.
        if not os.path.exists(data_path):
            open(data_path, "wb").close()
    else:
        onnx.save_model(model, path)


def config_from_model(source: object, options: SessionOptions) -> None:
    """``$ORT_LOAD_CONFIG_FROM_MODEL=1``: read the model's ``ort_config`` metadata (JSON ``session_options``) into
    ``options``, as onnxruntime does."""
    import json

    from .loader._model import _parse

    model, _ = _parse(source)  # type: ignore[arg-type]
    text = next((p.value for p in model.metadata_props if p.key == "ort_config"), None)
    if text is None:
        return
    try:
        values = json.loads(text).get("session_options", {})
    except (ValueError, AttributeError) as error:
        raise InvalidArgumentError(f"the model's ort_config metadata is not valid JSON: {error}") from error
    for key, value in values.items():
        if key == "graph_optimization_level":
            options.graph_optimization_level = GraphOptimizationLevel(int(value))
        elif key == "execution_mode":
            options.execution_mode = ExecutionMode(int(value))
        elif key in ("enable_profiling", "enable_mem_pattern", "enable_cpu_mem_arena", "use_deterministic_compute"):
            setattr(options, key, bool(value))
        elif key in ("inter_op_num_threads", "intra_op_num_threads", "log_severity_level", "log_verbosity_level"):
            setattr(options, key, int(value))
        elif key in ("profile_file_prefix", "logid", "optimized_model_filepath"):
            setattr(options, key, str(value))
        else:
            raise InvalidArgumentError(f"the model's ort_config sets {key!r}, which ortgpu does not know")


@dataclass(frozen=True)
class SessionPlacement:
    """Where a session runs, as its provider list and its ``env=``/``device=`` arguments decide."""

    env: Env
    device: Device
    provider_names: list[str]
    provider_options: list[dict[str, str]]
    #: The WebGPU provider's option ``enableGraphCapture`` was set (onnxruntime's spelling of ``graph_capture=True``).
    graph_capture: bool


def place_session(
    providers: Sequence[ProviderArg] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    env: Env | None,
    device: Device | None,
) -> SessionPlacement:
    """Choose a session's Env and device from onnxruntime's provider list and ortgpu's own arguments.

    Raises
    ------
    InvalidArgumentError
        An unknown provider or option, a CPU-only provider list with a non-fake ``env``, or a ``deviceId`` that
        names no device.
    """
    names, options = normalize_providers(providers, provider_options)
    if WEBGPU_PROVIDER not in names:
        # CPU alone: every node on the CPU, through the numpy twins of the kernels (the fake backend's device runs
        # them on the host).  Slow; for checks and machines without a GPU.
        if env is None:
            env = cpu_env()
        elif env.backend_name != "fake":
            raise InvalidArgumentError(
                "providers=['CPUExecutionProvider'] runs the model on the host (numpy); the env= given is a "
                f"{env.backend_name!r} Env: drop env=, or add 'WebGpuExecutionProvider' to the providers"
            )
    # As onnxruntime appends its CPU provider to any list as the fallback, a list without it still lets nodes the
    # device cannot run go to the CPU; allow_cpu_fallback=False or the config entry session.disable_cpu_ep_fallback=1
    # forbid that.
    chosen_env = env if env is not None else get_env()
    webgpu_options = options[names.index(WEBGPU_PROVIDER)] if WEBGPU_PROVIDER in names else {}
    capture = False
    if webgpu_options:
        chosen = device_from_options(chosen_env, webgpu_options)
        if device is None:
            device = chosen
        bare = {_bare_option(key): value for key, value in webgpu_options.items()}
        capture = bare.get("enableGraphCapture", "0").lower() in ("1", "true")
    chosen_device = chosen_env.check_device(device if device is not None else chosen_env.default_device)
    return SessionPlacement(chosen_env, chosen_device, names, options, capture)
