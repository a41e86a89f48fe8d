"""Integer bit operators: BitShift (opset 11), BitwiseAnd/Or/Xor/Not (opset 18), BitCast (opset 26).

BitShift takes unsigned integers, and from opset 28 signed ones too (right shifts
of those are arithmetic, left shifts wrap).  A shift by the element's width or
more, or (signed) by a negative amount, gives what the sign extension alone
gives: -1 for a right shift of a negative value, else 0 (as onnxruntime does;
WGSL would take the amount modulo 32).  The
Bitwise operators take every integer type.  All run on the device: types up to
32 bits in their i32/u32 compute type (sign-extended narrow values keep their
low bits, which are what is stored), int64/uint64 on ``vec2<u32>`` pairs.

BitCast reinterprets each element's bytes as another dtype of the same width:
on the device the output aliases the input's buffer (no kernel), except for bool
targets, whose bytes are normalised to 0/1 (any non-zero byte is true).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import INT64_WGSL, require_device_dtype, wgsl_compute_type
from .._wgsl_kernels import Operand, elementwise_plan
from .cast import onnx_dtype

__all__ = ["BitShift", "BitwiseOperator", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitCast"]

_INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_UNSIGNED = ("uint8", "uint16", "uint32", "uint64")


def _same_dtype(op_type: str, opset: int, a: np.ndarray, b: np.ndarray, allowed: Sequence[str]) -> None:
    if a.dtype != b.dtype:
        raise UnsupportedOpError(f"{op_type} (opset {opset}): inputs of different dtypes {a.dtype} and {b.dtype}")
    if a.dtype.name not in allowed:
        raise UnsupportedOpError(f"{op_type} (opset {opset}) does not support dtype {a.dtype.name}")


def shift_array(x: np.ndarray, amount: np.ndarray, left: bool) -> np.ndarray:
    """``x << amount`` or ``x >> amount`` (broadcast; arithmetic for signed ``x``, left shifts wrap).

    Amounts outside ``0 .. width-1`` give the sign fill: -1 for a right shift of a negative value, else 0.
    """
    width = 8 * x.dtype.itemsize
    valid = (amount >= 0) & (amount < width)
    safe = np.where(valid, amount, 0).astype(x.dtype)
    shifted = np.left_shift(x, safe) if left else np.right_shift(x, safe)
    if left or x.dtype.kind == "u":
        fill = np.zeros_like(x)
    else:
        fill = np.where(x < 0, x.dtype.type(-1), x.dtype.type(0))
    return np.asarray(np.where(valid, shifted, fill), dtype=x.dtype)


@register
class BitShift(Operator):
    op_type = "BitShift"
    since_version = 11
    opset_changes = (28,)

    def _left(self, attrs: Mapping[str, Any]) -> bool:
        direction = attrs.get("direction")
        if direction not in ("LEFT", "RIGHT"):
            raise UnsupportedOpError(
                f"BitShift (opset {self.opset}): direction must be LEFT or RIGHT, not {direction!r}"
            )
        return bool(direction == "LEFT")

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, amount = inputs[0], inputs[1]
        assert x is not None and amount is not None
        _same_dtype("BitShift", self.opset, x, amount, _INTEGERS if self.opset >= 28 else _UNSIGNED)
        return [shift_array(x, amount, self._left(attrs))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, amount = inputs[0], inputs[1]
        assert x is not None and amount is not None
        if x.dtype != amount.dtype:
            raise NotOnDevice(f"BitShift: inputs of different dtypes {x.dtype} and {amount.dtype}")
        require_device_dtype("BitShift", x.dtype, _INTEGERS if self.opset >= 28 else _UNSIGNED)
        left = self._left(attrs)
        pair = x.dtype.itemsize == 8
        signed = x.dtype.kind == "i"
        width = 8 * x.dtype.itemsize

        def function(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return shift_array(a, b, left)

        if pair and signed:
            # A non-zero high word is an amount that is negative or 64 or more.
            valid = "x1.y == 0u && x1.x < 64u"
            if left:
                expression = f"select(vec2<u32>(0u, 0u), shl64(x0, x1.x), {valid})"
            else:
                fill = "select(vec2<u32>(0u, 0u), vec2<u32>(0xffffffffu, 0xffffffffu), is_negative64(x0))"
                expression = f"select({fill}, select(shr64(x0, x1.x), ~shr64(~x0, x1.x), is_negative64(x0)), {valid})"
            helpers = INT64_WGSL
        elif pair:
            shift = "shl64" if left else "shr64"
            # shl64/shr64 give 0 for amounts of 64 or more; a non-zero high word is such an amount.
            expression = f"select({shift}(x0, x1.x), vec2<u32>(0u, 0u), x1.y != 0u)"
            helpers = INT64_WGSL
        elif signed:
            # Computed in i32 on sign-extended values: arithmetic right shifts and wrapped left shifts
            # keep the right low bits, which are what is stored.
            valid = f"x1 >= 0 && x1 < {width}"
            if left:
                expression = f"select(0, x0 << u32(max(x1, 0)), {valid})"
            else:
                expression = f"select(select(0, -1, x0 < 0), x0 >> u32(clamp(x1, 0, 31)), {valid})"
            helpers = ""
        else:
            # Narrow types are computed in u32: bits shifted past their width are dropped on store.
            expression = f"select(x0 {'<<' if left else '>>'} x1, 0u, x1 >= 32u)"
            helpers = ""
        operands = [Operand(0, x, int64_pair=pair), Operand(1, amount, int64_pair=pair)]
        return elementwise_plan(
            "BitShift", operands, outputs, expression, caps, function, inputs, helpers=helpers, pair_output=pair
        )


class BitwiseOperator(Operator):
    """``output = a <op> b`` on integers of one dtype, broadcast numpy-style."""

    numpy_function: Callable[..., Any]
    #: WGSL operator (on scalars and on ``vec2<u32>`` pairs alike).
    symbol = ""

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        _same_dtype(self.op_type, self.opset, a, b, _INTEGERS)
        return [np.asarray(type(self).numpy_function(a, b), dtype=a.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if a.dtype != b.dtype:
            raise NotOnDevice(f"{self.op_type}: inputs of different dtypes {a.dtype} and {b.dtype}")
        require_device_dtype(self.op_type, a.dtype, _INTEGERS)
        pair = a.dtype.itemsize == 8

        def function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self.reference([x, y], attrs, outputs)[0]

        operands = [Operand(0, a, int64_pair=pair), Operand(1, b, int64_pair=pair)]
        return elementwise_plan(
            self.op_type, operands, outputs, f"x0 {self.symbol} x1", caps, function, inputs, pair_output=pair
        )


@register
class BitwiseAnd(BitwiseOperator):
    op_type = "BitwiseAnd"
    since_version = 18
    symbol = "&"
    numpy_function = staticmethod(np.bitwise_and)


@register
class BitwiseOr(BitwiseOperator):
    op_type = "BitwiseOr"
    since_version = 18
    symbol = "|"
    numpy_function = staticmethod(np.bitwise_or)


@register
class BitwiseXor(BitwiseOperator):
    op_type = "BitwiseXor"
    since_version = 18
    symbol = "^"
    numpy_function = staticmethod(np.bitwise_xor)


@register
class BitwiseNot(Operator):
    op_type = "BitwiseNot"
    since_version = 18

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.name not in _INTEGERS:
            raise UnsupportedOpError(f"BitwiseNot (opset {self.opset}) does not support dtype {x.dtype.name}")
        return [np.asarray(np.invert(x), dtype=x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        require_device_dtype("BitwiseNot", x.dtype, _INTEGERS)
        pair = x.dtype.itemsize == 8

        def function(a: np.ndarray) -> np.ndarray:
            return np.asarray(np.invert(a), dtype=a.dtype)

        return elementwise_plan(
            "BitwiseNot", [Operand(0, x, int64_pair=pair)], outputs, "~x0", caps, function, inputs, pair_output=pair
        )


@register
class BitCast(Operator):
    op_type = "BitCast"
    since_version = 26

    def _target(self, source: np.dtype[Any], attrs: Mapping[str, Any]) -> np.dtype[Any]:
        if "to" not in attrs:
            raise UnsupportedOpError(f"BitCast (opset {self.opset}): the 'to' attribute is missing")
        target = onnx_dtype(attrs["to"], "BitCast", self.opset)
        if source.kind not in "fiub":
            raise UnsupportedOpError(f"BitCast (opset {self.opset}): source dtype {source} is not supported")
        if target.itemsize != source.itemsize:
            raise UnsupportedOpError(
                f"BitCast (opset {self.opset}): {source.name} and {target.name} differ in width; "
                "BitCast needs types of the same bit width"
            )
        return target

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        target = self._target(x.dtype, attrs)
        if target == np.bool_:
            # A bool byte other than 0 or 1 is not a valid bool: any non-zero byte is true.
            return [np.ascontiguousarray(x).view(np.uint8) != 0]
        return [np.ascontiguousarray(x).view(target).copy()]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        target = self._target(x.dtype, attrs)
        if target != np.bool_ or x.dtype == np.bool_:
            return OpPlan(alias={0: 0})
        zero = {"i32": "0", "u32": "0u"}[wgsl_compute_type(x.dtype)]

        def function(a: np.ndarray) -> np.ndarray:
            return np.asarray(np.ascontiguousarray(a).view(np.uint8) != 0)

        return elementwise_plan("BitCast", [Operand(0, x)], outputs, f"x0 != {zero}", caps, function, inputs)
