"""The operator registry (``ortgpu/ops/_registry.py``): operators by domain package, the opset each registered class
starts at and the versions it tells apart, checked against onnx's own operator schemas, and the version choice."""

from __future__ import annotations

import inspect
import os
import re
from typing import Any

import numpy as np
import onnx.defs
import pytest

import ortgpu.ops
from ortgpu.ops import Operator, get_operator
from ortgpu.ops._catalog import registered_operators
from ortgpu.ops._registry import _REGISTRY, DOMAIN_PACKAGES, _load_all, register, register_row, version_ranges
from ortgpu.ops.ai_onnx.unary import UNARY_OPERATORS, TableUnary
from ortgpu_core._errors import UnsupportedOpError


def _registered() -> list[tuple[str, str, list[type[Operator]]]]:
    _load_all()
    return [(domain, op_type, classes) for (domain, op_type), classes in sorted(_REGISTRY.items())]


def _onnx_versions() -> dict[tuple[str, str], set[int]]:
    """(domain, op type) -> every opset at which onnx defines (or changed) the operator, plus onnxruntime's own
    schemas: its ``com.microsoft`` operators, and the default-domain ones its tools emit that onnx does not define
    (``SimplifiedLayerNormalization``, its ``LayerNormalization`` before opset 17)."""
    from onnxruntime.capi import onnxruntime_pybind11_state

    versions: dict[tuple[str, str], set[int]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        versions.setdefault((schema.domain, schema.name), set()).add(schema.since_version)
    for schema in onnxruntime_pybind11_state.get_all_operator_schema():
        versions.setdefault((schema.domain or "ai.onnx", schema.name), set()).add(schema.since_version)
        versions.setdefault((schema.domain, schema.name), set()).add(schema.since_version)
    return versions


def test_each_domain_has_its_package() -> None:
    folder = os.path.dirname(ortgpu.ops.__file__)
    for package in DOMAIN_PACKAGES.values():
        assert os.path.isfile(os.path.join(folder, package, "__init__.py")), package
    assert set(registered_operators()) == {"ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "com.microsoft"}
    for domain, _, classes in _registered():
        for cls in classes:
            assert cls.__module__.startswith(f"ortgpu.ops.{DOMAIN_PACKAGES[domain]}."), cls


def test_versions_are_onnx_versions() -> None:
    """A class starts at a version where onnx defines its operator, and each version it tells apart by reading
    ``self.opset`` is one where onnx changed the operator, inside the class's range."""
    onnx_versions = _onnx_versions()
    for domain, op_type, _ in _registered():
        known = onnx_versions[(domain, op_type)]
        for cls, first, end in version_ranges(op_type, domain):
            assert first in known, (op_type, first, sorted(known))
            for version in cls.opset_changes:
                assert version in known and first < version < (end or 10**6), (op_type, version, sorted(known))


_OPSET_TEST = re.compile(r"self\.opset\s*(<|>=|<=|>)\s*(\d+)")


def _versions_read(cls: type[Operator]) -> set[int]:
    """The versions a class's own code (and its bases' in ortgpu.ops) tells apart by comparing ``self.opset``."""
    found: set[int] = set()
    for owner in cls.__mro__:
        if owner is Operator or not owner.__module__.startswith("ortgpu.ops."):
            continue
        try:
            source = inspect.getsource(owner)
        except OSError:  # a class made from a table row: its code is its base's
            continue
        for match in _OPSET_TEST.finditer(source):
            number = int(match.group(2))
            found.add(number + 1 if match.group(1) in ("<=", ">") else number)
    return found


def test_classes_name_the_versions_they_tell_apart() -> None:
    """Every ``self.opset < N`` / ``>= N`` in a class (within its range) is declared in its ``opset_changes``."""
    for domain, op_type, _ in _registered():
        for cls, first, end in version_ranges(op_type, domain):
            read = {v for v in _versions_read(cls) if first < v < (end or 10**6)}
            assert read <= set(cls.opset_changes), (cls.__qualname__, sorted(read), cls.opset_changes)


@pytest.mark.parametrize(
    ("op_type", "opset", "expected"),
    [
        ("Softmax", 1, "Softmax_1"),
        ("Softmax", 12, "Softmax_1"),
        ("Softmax", 13, "Softmax"),
        ("LogSoftmax", 11, "LogSoftmax_1"),
        ("LogSoftmax", 21, "LogSoftmax"),
        ("Hardmax", 11, "Hardmax_1"),
        ("Hardmax", 13, "Hardmax"),
        ("Relu", 14, "Relu"),
    ],
)
def test_highest_applicable_version_is_chosen(op_type: str, opset: int, expected: str) -> None:
    operator = get_operator(op_type, opset)
    assert type(operator).__qualname__ == expected
    assert operator.opset == opset


def test_versions_before_the_first_are_refused() -> None:
    with pytest.raises(UnsupportedOpError, match="from opset 20"):
        get_operator("Gelu", 19)
    with pytest.raises(UnsupportedOpError, match="not implemented by ortgpu"):
        get_operator("NoSuchOperator", 21)


def test_softmax_versions_differ_in_their_axes() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 10
    coerced = get_operator("Softmax", 11).reference([x], {"axis": 1}, [])[0]
    along = get_operator("Softmax", 13).reference([x], {"axis": 1}, [])[0]
    assert abs(float(coerced[0].sum()) - 1.0) < 1e-6  # one distribution over axes 1 and 2
    assert abs(float(along[0, :, 0].sum()) - 1.0) < 1e-6  # one distribution per column


def _class(**namespace: Any) -> type[Operator]:
    return type("Probe", (Operator,), {"op_type": "Relu", "since_version": 1, **namespace})


def test_register_refuses_inconsistent_classes() -> None:
    with pytest.raises(ValueError, match="belongs in ortgpu.ops.ai_onnx"):
        register(_class(__module__=__name__))
    with pytest.raises(ValueError, match="has no package"):
        register(_class(domain="org.example", __module__="ortgpu.ops.ai_onnx.unary"))
    with pytest.raises(ValueError, match="already registered"):
        register(_class(__module__="ortgpu.ops.ai_onnx.unary"))
    with pytest.raises(ValueError, match="must rise"):
        register(_class(since_version=6, opset_changes=(6,), __module__="ortgpu.ops.ai_onnx.unary"))
    without_version = type("Probe", (Operator,), {"op_type": "Probe", "__module__": "ortgpu.ops.ai_onnx.unary"})
    with pytest.raises(ValueError, match="since_version"):
        register(without_version)
    with pytest.raises(ValueError, match="already registered"):
        register_row(TableUnary, "ortgpu.ops.ai_onnx.unary", "Sqrt", 1, row=UNARY_OPERATORS[0])
    assert [c.__qualname__ for c, _, _ in version_ranges("Relu")] == ["Relu"]


def test_table_rows_are_registered_classes() -> None:
    for row in UNARY_OPERATORS:
        ((cls, first, end),) = version_ranges(row.op_type)
        assert issubclass(cls, TableUnary) and cls.row is row
        assert (cls.__qualname__, cls.__module__, first, end) == (
            row.op_type,
            "ortgpu.ops.ai_onnx.unary",
            row.since_version,
            None,
        )
