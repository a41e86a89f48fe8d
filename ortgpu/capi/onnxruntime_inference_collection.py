"""``onnxruntime.capi.onnxruntime_inference_collection``: the Python classes and the provider-argument check."""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

from ortgpu_core import OrtValue
from ortgpu_core._binding import IOBinding
from ortgpu_core._sparse import SparseTensor

from .._lora_adapter import AdapterFormat
from .._ort_api import ProviderArg
from .._run_options import RunOptions
from .._session import InferenceSession

__all__ = [
    "InferenceSession",
    "IOBinding",
    "RunOptions",
    "OrtValue",
    "SparseTensor",
    "AdapterFormat",
    "check_and_normalize_provider_args",
]


def check_and_normalize_provider_args(
    providers: Sequence[ProviderArg] | None,
    provider_options: Sequence[Mapping[Any, Any]] | None,
    available_provider_names: Sequence[str],
) -> tuple[list[str], list[dict[str, str]]]:
    """onnxruntime's check of provider arguments against ``available_provider_names``: names (or ``(name, options)``
    pairs) and options as two parallel lists, option keys and values as strings.  A name listed twice, or one not
    available, is dropped with a ``UserWarning`` (as onnxruntime does); arguments of the wrong shape are a
    ``ValueError``.  Sessions refuse unknown names instead (:func:`ortgpu._ort_api.normalize_providers`)."""
    if providers is None:
        return [], []
    if isinstance(providers, (str, bytes)) or not isinstance(providers, Sequence):
        raise ValueError("'providers' should be a sequence.")
    if provider_options is not None:
        if not isinstance(provider_options, Sequence) or len(provider_options) != len(providers):
            raise ValueError("'providers' and 'provider_options' should be the same length if both are given.")
        if any(not isinstance(p, str) for p in providers):
            raise ValueError("Only string values for 'providers' are supported if 'provider_options' is given.")
        pairs: list[tuple[Any, Any]] = list(zip(providers, provider_options))
    else:
        pairs = []
        for item in providers:
            if isinstance(item, str):
                pairs.append((item, {}))
            elif (
                isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], Mapping)
            ):
                pairs.append(item)
            else:
                raise ValueError("'providers' values must be either strings or (string, dict) tuples.")
    names: list[str] = []
    options: list[dict[str, str]] = []
    for name, opts in pairs:
        if not isinstance(opts, Mapping):
            raise ValueError("'provider_options' values must be dicts.")
        if name not in available_provider_names:
            warnings.warn(
                f"Specified provider '{name}' is not in available provider names. Available providers: "
                f"'{', '.join(available_provider_names)}'",
                stacklevel=2,
            )
            continue
        if name in names:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=2)
            continue
        names.append(name)
        options.append({str(k): str(v) for k, v in opts.items()})
    return names, options
