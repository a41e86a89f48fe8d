"""``onnxruntime.capi.onnxruntime_inference_collection``: the Python classes and the provider-argument check."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .._ort_api import ProviderArg, normalize_providers
from .._run_options import RunOptions
from .._session import InferenceSession
from ortgpu_core import OrtValue
from ortgpu_core._binding import IOBinding

__all__ = ["InferenceSession", "IOBinding", "RunOptions", "OrtValue", "check_and_normalize_provider_args"]


def check_and_normalize_provider_args(
    providers: Sequence[ProviderArg] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    available_provider_names: Sequence[str],
) -> tuple[list[str], list[dict[str, str]]]:
    """onnxruntime's check: names (or ``(name, options)`` pairs) and options as two parallel lists; unknown names
    refused with the available ones."""
    if providers is None:
        return [], []
    return normalize_providers(providers, provider_options)
