"""Operator registry: op type -> implementations by first opset."""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import TypeVar

from ortgpu_core._errors import UnsupportedOpError

from ._kernel import Operator

__all__ = ["register", "get_operator", "registered_op_types"]

_REGISTRY: dict[tuple[str, str], list[type[Operator]]] = {}
_loaded = False

OperatorType = TypeVar("OperatorType", bound=type[Operator])


def register(cls: OperatorType) -> OperatorType:
    """Class decorator: register an :class:`Operator` subclass."""
    _REGISTRY.setdefault((cls.domain, cls.op_type), []).append(cls)
    _REGISTRY[(cls.domain, cls.op_type)].sort(key=lambda c: c.since_version)
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    # This package's folder (its __path__), read without importing the package from one of its own modules.
    for module in pkgutil.iter_modules([os.path.dirname(__file__)]):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__package__}.{module.name}")
    _loaded = True


def registered_op_types() -> list[str]:
    _load_all()
    return sorted(op for (_, op) in _REGISTRY)


def get_operator(op_type: str, opset: int, domain: str = "") -> Operator:
    """The implementation of ``op_type`` for a model importing ``opset`` of its domain."""
    _load_all()
    candidates = _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type))
    if not candidates:
        raise UnsupportedOpError(f"operator {op_type!r} (domain {domain or 'ai.onnx'!r}) is not implemented by ortgpu")
    applicable = [c for c in candidates if c.since_version <= opset]
    if not applicable:
        raise UnsupportedOpError(
            f"operator {op_type!r} at opset {opset} is not implemented (ortgpu implements it from opset "
            f"{candidates[0].since_version})"
        )
    operator = applicable[-1]()
    operator.opset = opset
    return operator
