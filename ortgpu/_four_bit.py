"""4-bit constants (ONNX INT4/UINT4) rewritten, at plan time, into the forms the existing device kernels read.

The loader keeps an INT4/UINT4 initializer or Constant as an ``ml_dtypes.int4``/``uint4`` array (one element a byte
on the host, the ONNX semantics intact, so the numpy references and constant folding read it as it is).  No kernel
reads 4-bit elements, and WebGPU has no such type; rather than teaching each kernel a second storage layout, the
planner replaces the 4-bit operands of the two operators that take them with constants of the same values in a
layout those kernels already read:

* ``DequantizeLinear`` (input 0 and its zero point): widened to int8/uint8.  ``(x - zero) * scale`` is the same
  number, so the per-tensor and per-axis kernels of :mod:`ortgpu.ops.ai_onnx.quantize` run unchanged (blocked
  scales run on the CPU as for 8-bit weights).
* com.microsoft ``GatherBlockQuantized`` (its data and zero points): packed two codes a byte, low nibble first,
  as its uint8 form with ``bits=4``.  int4 codes move to the unsigned range (``q + 8``, the zero point too), where
  the uint8 form's default zero point 8 is int4's default 0; uint4 data without zero points gets explicit zeros
  (the uint8 form would default to 8).  Only the layout the uint8 kernel covers is packed (gathered on axis 0,
  quantized along an even-length last axis); the rest stays 4-bit and runs on the CPU reference.

The rewritten values are cached in the model's rewrite cache, so plans for other input shapes share them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable, MutableMapping, Sequence

import numpy as np

from ._types import FOUR_BIT_DTYPES
from .loader._model import GraphNode
from .loader._propagate import Shape

__all__ = ["widen_four_bit_constants", "pack_nibbles"]

_Types = MutableMapping[str, tuple[Shape, np.dtype[Any]]]


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Unsigned 4-bit ``codes`` (0..15, any integer dtype) packed two a byte along the last axis, low nibble first
    (an odd last axis padded with a zero code)."""
    values = np.asarray(codes).astype(np.uint8)
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros(values.shape[:-1] + (1,), np.uint8)], axis=-1)
    return np.ascontiguousarray(values[..., 0::2] | (values[..., 1::2] << np.uint8(4)))


def widen_four_bit_constants(
    nodes: Sequence[GraphNode],
    types: _Types,
    constants: MutableMapping[str, np.ndarray],
    cache: MutableMapping[Hashable, Any],
) -> list[GraphNode]:
    """``nodes`` with every DequantizeLinear and GatherBlockQuantized that reads a 4-bit constant reading the
    widened (or packed) constant instead; the new constants are added to ``constants`` and ``types``."""
    rewritten: list[GraphNode] = []
    for node in nodes:
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
            node = _widened_dequantize(node, types, constants, cache)
        elif node.op_type == "GatherBlockQuantized" and node.domain == "com.microsoft":
            node = _packed_gather(node, types, constants, cache)
        rewritten.append(node)
    return rewritten


def _is_four_bit_constant(name: str, constants: MutableMapping[str, np.ndarray]) -> bool:
    return bool(name) and name in constants and constants[name].dtype in FOUR_BIT_DTYPES


def _add(
    base: str,
    kind: str,
    compute: Any,
    types: _Types,
    constants: MutableMapping[str, np.ndarray],
    cache: MutableMapping[Hashable, Any],
) -> str:
    """The name of a new constant ``compute()`` derived from constant ``base`` (computed once per model)."""
    key = ("four_bit", kind, base)
    name = f"{base}::{kind}"
    while name in types and name not in constants:  # never shadow a tensor of the graph
        name += "'"
    value = cache.get(key)
    if value is None or value[0] is not constants[base]:
        value = cache[key] = (constants[base], compute(constants[base]))
    constants[name] = value[1]
    types[name] = (tuple(value[1].shape), value[1].dtype)
    return name


def _widened_dequantize(
    node: GraphNode, types: _Types, constants: MutableMapping[str, np.ndarray], cache: MutableMapping[Hashable, Any]
) -> GraphNode:
    inputs = list(node.inputs)
    if not _is_four_bit_constant(inputs[0], constants):
        return node
    zero = inputs[2] if len(inputs) > 2 else ""
    if zero and not _is_four_bit_constant(zero, constants):
        return node  # a zero point of another type: the reference refuses the mismatch by name
    for index in (0, 2) if zero else (0,):
        signed = constants[inputs[index]].dtype.name == "int4"
        wide = np.dtype(np.int8 if signed else np.uint8)
        inputs[index] = _add(
            inputs[index], wide.name, lambda v, w=wide: np.ascontiguousarray(v.astype(w)), types, constants, cache
        )
    return dataclasses.replace(node, inputs=tuple(inputs))


def _packed_gather(
    node: GraphNode, types: _Types, constants: MutableMapping[str, np.ndarray], cache: MutableMapping[Hashable, Any]
) -> GraphNode:
    inputs = list(node.inputs)
    data_name = inputs[0]
    if not _is_four_bit_constant(data_name, constants):
        return node
    data = constants[data_name]
    rank = data.ndim
    gather_axis, quantize_axis = int(node.attrs.get("gather_axis", 0)), int(node.attrs.get("quantize_axis", 1))
    zero = inputs[3] if len(inputs) > 3 else ""
    if (
        rank < 2
        or data.shape[-1] % 2
        or not -rank <= gather_axis < rank
        or gather_axis % rank != 0
        or not -rank <= quantize_axis < rank
        or quantize_axis % rank != rank - 1
        or (zero and (not _is_four_bit_constant(zero, constants) or constants[zero].dtype != data.dtype))
        or len(inputs) < 3
        or inputs[2] not in types
    ):
        return node  # the CPU reference takes it as it is (or refuses it by name)
    offset = 8 if data.dtype.name == "int4" else 0

    def packed(value: np.ndarray) -> np.ndarray:
        return pack_nibbles(value.astype(np.int16) + offset)

    inputs[0] = _add(data_name, "packed", packed, types, constants, cache)
    if zero:
        inputs[3] = _add(zero, "packed", packed, types, constants, cache)
    elif offset == 0:
        # uint4's default zero point is 0, the uint8 form's is 8: give the zeros explicitly.
        blocks = types[inputs[2]][0][-1]
        assert isinstance(blocks, int)
        zero_shape = tuple(data.shape[:-1]) + (-(-blocks // 2),)
        inputs[3:] = [
            _add(data_name, "zero_points", lambda _v: np.zeros(zero_shape, np.uint8), types, constants, cache)
        ]
    return dataclasses.replace(node, inputs=tuple(inputs), attrs={**node.attrs, "bits": 4})
