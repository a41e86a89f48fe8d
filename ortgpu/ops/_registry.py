"""Operator registry: (domain, op type) -> implementations by the opset they start at.

Operators live in one subpackage per domain (``ai_onnx``, ``ai_onnx_ml``, ``ai_onnx_preview_training``,
``com_microsoft``; :data:`DOMAIN_PACKAGES`).  The registry imports every public module of those packages on first
use, so adding an operator means adding a decorated class, never editing a list.  As onnx's reference evaluator
does, each registered class states the domain opset it starts at (``since_version``) and :func:`get_operator`
picks the highest one not above the model's opset for that domain; a class covers its operator up to the next
class's ``since_version``, and names in ``opset_changes`` the versions in that range it tells apart by reading
``self.opset`` (see :class:`~ortgpu.ops.Operator`).  :func:`version_ranges` lists what is registered.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Any, TypeVar

from ortgpu_core._errors import UnsupportedOpError

from ._kernel import Operator

__all__ = ["DOMAIN_PACKAGES", "register", "register_row", "get_operator", "registered_op_types", "version_ranges"]

#: Domain as a model writes it (``""`` for ai.onnx) -> the subpackage of :mod:`ortgpu.ops` holding its operators.
DOMAIN_PACKAGES = {
    "": "ai_onnx",
    "ai.onnx.ml": "ai_onnx_ml",
    "ai.onnx.preview.training": "ai_onnx_preview_training",
    "com.microsoft": "com_microsoft",
}

_REGISTRY: dict[tuple[str, str], list[type[Operator]]] = {}
_loaded = False

OperatorType = TypeVar("OperatorType", bound=type[Operator])


def register(cls: OperatorType) -> OperatorType:
    """Class decorator: register an :class:`Operator` subclass under its domain, op type and ``since_version``.

    Parameters
    ----------
    cls
        The operator class; its module must lie in its domain's package (:data:`DOMAIN_PACKAGES`), so that the
        folder and the registration say the same thing.

    Returns
    -------
    type
        ``cls``, unchanged.

    Raises
    ------
    ValueError
        The class states no ``since_version``, its ``opset_changes`` do not rise above it, its domain has no
        package, it lies outside that package, or its (domain, op type, since_version) is already registered (two
        classes would compete for the same opsets).
    """
    if "since_version" not in dir(cls):
        raise ValueError(f"{cls.__qualname__}: a registered operator states the opset it starts at (since_version)")
    changes = cls.opset_changes
    if list(changes) != sorted(set(changes)) or (changes and changes[0] <= cls.since_version):
        raise ValueError(f"{cls.__qualname__}: opset_changes {changes} must rise, above {cls.since_version}")
    package = DOMAIN_PACKAGES.get(cls.domain)
    if package is None:
        raise ValueError(f"{cls.__qualname__}: domain {cls.domain!r} has no package in ortgpu.ops.DOMAIN_PACKAGES")
    if not cls.__module__.startswith(f"{__package__}.{package}."):
        raise ValueError(
            f"{cls.__qualname__} ({cls.__module__}): a {cls.domain or 'ai.onnx'} operator belongs in "
            f"{__package__}.{package}"
        )
    versions = _REGISTRY.setdefault((cls.domain, cls.op_type), [])
    if any(other.since_version == cls.since_version for other in versions):
        raise ValueError(f"{cls.__qualname__}: {cls.op_type} since opset {cls.since_version} is already registered")
    versions.append(cls)
    versions.sort(key=lambda c: c.since_version)
    return cls


def register_row(
    base: type[Operator], module: str, op_type: str, since_version: int, **attributes: Any
) -> type[Operator]:
    """Make and register the class of one row of an operator table: ``base`` with ``op_type``, ``since_version``
    and ``attributes`` set, named after the operator and placed in ``module`` (the table's), so that a family of
    same-shaped operators is one generic class and a table of rows rather than a class per operator.

    Parameters
    ----------
    base
        The family's generic class, which reads its row's values from class attributes.
    module
        ``__name__`` of the module holding the table.
    op_type, since_version
        The operator and the opset of its domain the row's implementation starts at.
    **attributes
        The row's other class attributes.

    Returns
    -------
    type
        The registered class.
    """
    namespace = {"op_type": op_type, "since_version": since_version, "__module__": module, **attributes}
    return register(type(op_type, (base,), namespace))


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    # Each domain package's folder, read without importing this package from one of its own modules.
    here = os.path.dirname(__file__)
    for package in DOMAIN_PACKAGES.values():
        for module in pkgutil.iter_modules([os.path.join(here, package)]):
            if not module.name.startswith("_"):
                importlib.import_module(f"{__package__}.{package}.{module.name}")
    _loaded = True


def registered_op_types() -> list[str]:
    """The op types ortgpu implements, in all domains, sorted."""
    _load_all()
    return sorted(op for (_, op) in _REGISTRY)


def version_ranges(op_type: str, domain: str = "") -> list[tuple[type[Operator], int, int | None]]:
    """The registered implementations of ``op_type``: (class, first opset, first opset of the next class or None).

    Parameters
    ----------
    op_type
        The operator name.
    domain
        Its domain; ``""`` and ``"ai.onnx"`` both name the default one.

    Returns
    -------
    list
        One entry per registered class, oldest first; empty when ortgpu does not implement the operator.
    """
    _load_all()
    classes = _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type), [])
    ends: list[int | None] = [c.since_version for c in classes[1:]]
    return [(c, c.since_version, end) for c, end in zip(classes, ends + [None])]


def get_operator(op_type: str, opset: int, domain: str = "") -> Operator:
    """The implementation of ``op_type`` for a model importing ``opset`` of its domain.

    Parameters
    ----------
    op_type
        The node's operator name.
    opset
        The version of ``domain`` the model imports.
    domain
        The node's domain; ``""`` and ``"ai.onnx"`` both name the default one.

    Returns
    -------
    Operator
        An instance of the registered class with the highest ``since_version`` not above ``opset``, built for
        ``opset`` (classes that cover several versions read it as ``self.opset``).

    Raises
    ------
    UnsupportedOpError
        ortgpu implements no version of the operator, or only versions later than ``opset``.
    """
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
    return applicable[-1](opset)
