"""ONNX optional values (``optional(tensor)``, ``optional(seq(tensor))``): the operators on them.

Optional values live on the host; how ortgpu holds them (an "optional box") is :mod:`ortgpu._host_values`, which
this module re-exports for its callers.

Operators:

* ``Optional`` (opset 15): with an input, an optional holding it; without one, an empty optional of the ``type``
  attribute's type.
* ``OptionalHasElement`` (opset 15/18): true iff the input holds an element; a plain tensor or sequence input is
  true, an absent input (an empty input name, opset 18) false.
* ``OptionalGetElement`` (opset 15/18): the element; a plain tensor or sequence is returned unchanged (a tensor's
  device plan aliases the input buffer); an empty optional or an absent input is a typed error.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ModelError

from ..._host_values import (
    OPTIONAL_REASON,
    OptionalValue,
    element_type_of_proto,
    host_signature,
    is_optional_box,
    is_optional_dtype,
    is_structured_box,
    is_structured_dtype,
    optional_box,
    optional_dtype,
    optional_element,
    optional_element_dtype,
    optional_present,
    optional_type_name,
    probe_value,
    value_dtype_matches,
)
from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register

__all__ = [
    "OPTIONAL_REASON",
    "OptionalValue",
    "optional_dtype",
    "is_optional_dtype",
    "optional_element_dtype",
    "optional_present",
    "optional_box",
    "is_optional_box",
    "optional_element",
    "is_structured_dtype",
    "is_structured_box",
    "host_signature",
    "probe_value",
    "optional_type_name",
    "value_dtype_matches",
    "element_type_of_proto",
    "Optional",
    "OptionalHasElement",
    "OptionalGetElement",
]


class _OptionalOp(Operator):
    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice(OPTIONAL_REASON)


@register
class Optional(_OptionalOp):
    op_type = "Optional"
    since_version = 15

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        value = inputs[0] if inputs else None
        declared = attrs.get("type")
        element = None if declared is None else element_type_of_proto(declared, "Optional's type attribute")
        if value is None:
            if element is None:
                raise ModelError("Optional: without an input the node needs its 'type' attribute")
            return [optional_box(None, element)]
        if is_optional_box(value):
            raise ModelError("Optional: its input is an optional value; it takes a tensor or a sequence")
        if element is not None and not value_dtype_matches(element, value.dtype):
            raise ModelError(f"Optional: its input's type differs from its 'type' attribute ({declared})")
        return [optional_box(value)]


@register
class OptionalHasElement(_OptionalOp):
    op_type = "OptionalHasElement"
    since_version = 15

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        value = inputs[0] if inputs else None
        if value is None:
            present = False
        elif is_optional_box(value):
            present = optional_element(value) is not None
        else:
            present = True  # a tensor or a sequence (opset 18 takes them): it is there
        return [np.array(present, dtype=np.bool_)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice("OptionalHasElement: a single bool known when planning; it is written on the CPU")


@register
class OptionalGetElement(_OptionalOp):
    op_type = "OptionalGetElement"
    since_version = 15

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        value = inputs[0] if inputs else None
        if value is None:
            raise InvalidArgumentError("OptionalGetElement: the input is absent (it has no element)")
        if is_optional_box(value):
            element = optional_element(value)
            if element is None:
                raise InvalidArgumentError("OptionalGetElement: the optional input is empty (it has no element)")
            return [element]
        return [value]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        if not inputs or inputs[0] is None:
            raise NotOnDevice("OptionalGetElement: an absent input is an error, reported on the CPU")
        return OpPlan(alias={0: 0})
