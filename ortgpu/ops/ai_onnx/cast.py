"""Cast between dtypes (attribute ``to``: an ONNX ``TensorProto`` data type).

On the device between every numpy dtype except float64 -> integers and
integers -> float64, exactly: 8-byte values (int64, uint64, float64) are read
and written as ``vec2<u32>(low, high)`` pairs and converted with the 32-bit
arithmetic of :data:`~ortgpu.ops._wgsl.INT64_WGSL` (64-bit integer to float
rounds to nearest even; float to integer truncates through int64 and keeps
the low bits, which is the reference's C wrap-around; float64 <-> float32
round like IEEE conversions, float64 -> float16 through a round-to-odd float32
so the second rounding is exact).  A cast to the input's own dtype aliases its
input.

CastLike casts its first input to the dtype of its second (only the dtype is
read: the second input's values never reach the kernel); it shares Cast's
conversions and kernels.  ``saturate`` and ``round_mode`` only concern float8
targets, which numpy cannot hold: those are refused, so the attributes never
change a result here.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ..._types import computable, is_float_dtype, numpy_dtype_of
from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import INT64_WGSL, require_device_dtype, wgsl_compute_type
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["Cast", "CastLike", "onnx_dtype", "cast_array"]

_DEVICE_DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "int32",
    "uint32",
    "int16",
    "uint16",
    "int8",
    "uint8",
    "bool",
    "int64",
    "uint64",
    "float64",
)


def onnx_dtype(code: int, op_type: str, opset: int) -> np.dtype[Any]:
    """The numpy dtype of an ONNX ``TensorProto`` data type code (UnsupportedOpError if none)."""
    try:
        dtype = numpy_dtype_of(int(code))
    except (ValueError, TypeError):
        dtype = None
    if dtype is None:
        raise UnsupportedOpError(f"{op_type} (opset {opset}): data type {code} is not supported")
    if dtype.kind not in "fiubO" and not is_float_dtype(dtype):
        raise UnsupportedOpError(f"{op_type} (opset {opset}): data type {dtype} is not supported")
    return dtype


def _convert(source: np.dtype[Any], target: np.dtype[Any], op_type: str = "Cast") -> tuple[str, bool]:
    """WGSL converting ``x0`` (``source`` read in its compute type, or as a pair if 8 bytes) to ``target``
    (its compute type, or a pair if 8 bytes); and whether the helpers of ``INT64_WGSL`` are needed.

    Raises :class:`NotOnDevice` for float64 <-> integer casts.
    """
    wide_in, wide_out = source.itemsize == 8, target.itemsize == 8
    if source.name == "float64" and target.kind in "iub" or target.name == "float64" and source.kind in "iub":
        raise NotOnDevice(f"{op_type} from {source.name} to {target.name} runs on the CPU: no WebGPU kernel")
    if wide_in:
        if source.name == "float64":
            return ("f64_to_f32(x0)" if target.name == "float32" else "f64_to_f32_odd(x0)"), True
        if wide_out:
            return "x0", False  # int64 <-> uint64: the same bits
        if target.kind == "b":
            return "any(x0 != vec2<u32>(0u, 0u))", False
        if target.kind == "f":
            return ("i64_to_f32(x0)" if source.kind == "i" else "u64_to_f32(x0)"), True
        return ("bitcast<i32>(x0.x)" if wgsl_compute_type(target) == "i32" else "x0.x"), False
    source_type = wgsl_compute_type(source)
    if wide_out:
        if target.name == "float64":
            return "f32_to_f64(x0)", True  # from float32 or float16 (read as f32, exactly)
        if source_type == "f32":
            return "f32_to_i64(x0)", True
        if source_type == "i32":
            return "vec2<u32>(bitcast<u32>(x0), select(0u, 0xffffffffu, x0 < 0))", False
        if source_type == "u32":
            return "vec2<u32>(x0, 0u)", False
        return "vec2<u32>(select(0u, 1u, x0), 0u)", False
    target_type = wgsl_compute_type(target)
    if source_type == target_type:
        return "x0", False
    if target_type == "bool":
        zero = {"f32": "0.0", "i32": "0", "u32": "0u"}[source_type]
        return f"x0 != {zero}", False
    if source_type == "bool":
        one = {"f32": "1.0", "i32": "1", "u32": "1u"}[target_type]
        zero = {"f32": "0.0", "i32": "0", "u32": "0u"}[target_type]
        return f"select({zero}, {one}, x0)", False
    if target_type == "f32":
        return "f32(x0)", False
    if source_type == "f32":
        # Truncation toward zero through int64, keeping the low bits: C's wrap-around for narrow
        # and unsigned targets (as onnxruntime's static_cast does on x86, and as the reference does),
        # where WGSL's own conversion would saturate.
        return ("bitcast<i32>(f32_to_i64(x0).x)" if target_type == "i32" else "f32_to_i64(x0).x"), True
    return f"bitcast<{target_type}>(x0)", False  # i32 <-> u32 keep the low bits, as C's integer conversions do


def cast_array(x: np.ndarray, target: np.dtype[Any], op_type: str, opset: int) -> np.ndarray:
    """``x`` converted to ``target`` as onnxruntime's Cast does (C truncation and wrap-around).  Strings (object
    arrays of ``str``): see :func:`_to_strings` and :func:`_from_strings`."""
    x = computable(x)  # bfloat16 widened exactly: converting the float32 converts the bfloat16
    if target.kind == "O":
        return x.copy() if x.dtype == object else _to_strings(x)
    if x.dtype == object:
        return _from_strings(x, target, op_type, opset)
    if x.dtype.kind not in "fiub":
        raise UnsupportedOpError(f"{op_type} (opset {opset}): source dtype {x.dtype} is not supported")
    with np.errstate(invalid="ignore", over="ignore"):
        if target == np.bool_:
            return np.asarray(x != 0)
        if x.dtype.kind == "f" and target.kind in "iu":
            # C truncation; going through int64 gives C's wrap-around for narrow targets.
            return np.asarray(np.trunc(x).astype(np.int64).astype(target))
        return np.asarray(x.astype(target))


def _to_strings(x: np.ndarray) -> np.ndarray:
    """Numbers as onnxruntime writes them: floats with ``%.8g`` ("INF", "-INF", "NaN"), integers in decimal,
    bools as "1"/"0"."""
    out = np.empty(x.shape, dtype=object)
    for index, value in np.ndenumerate(x):
        if x.dtype.kind == "f":
            number = float(value)
            if math.isnan(number):
                out[index] = "NaN"
            elif math.isinf(number):
                out[index] = "INF" if number > 0 else "-INF"
            else:
                out[index] = "%.8g" % number
        else:
            out[index] = str(int(value))
    return out


#: What the spec allows in a string cast to a number (plain or scientific decimals, INF/NaN in any case); other
#: text (hex, digit separators, trailing characters) is undefined behaviour there, and refused here.
_DECIMAL = re.compile(
    r"\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|infinity|nan)", re.ASCII | re.IGNORECASE
)
_INTEGER = re.compile(r"\s*[+-]?\d+", re.ASCII)


def _from_strings(x: np.ndarray, target: np.dtype[Any], op_type: str, opset: int) -> np.ndarray:
    """Strings parsed as numbers of ``target``: floats from plain or scientific decimals and INF/NaN (any case),
    integers (and bools) from integer decimals, wrapped to narrow types as onnxruntime does; other text is
    refused (the spec leaves it undefined)."""
    out = np.empty(x.shape, dtype=target)
    for index, text in np.ndenumerate(x):
        if not isinstance(text, str):
            raise UnsupportedOpError(f"{op_type} (opset {opset}): a string tensor holds a {type(text).__name__}")
        if is_float_dtype(target):
            if not _DECIMAL.fullmatch(text):
                raise UnsupportedOpError(
                    f"{op_type} (opset {opset}): cannot convert the string {text[:40]!r} to {target.name} (the spec "
                    "defines plain and scientific decimals, INF and NaN only)"
                )
            number = np.float64(float(text))
            out[index] = number.astype(np.float32).astype(target) if target.itemsize == 2 else number
            continue
        if not _INTEGER.fullmatch(text):
            raise UnsupportedOpError(
                f"{op_type} (opset {opset}): cannot convert the string {text[:40]!r} to {target.name} (the spec "
                "defines integer decimals only)"
            )
        value = int(text)
        if not -(2**63) <= value < 2**64:
            raise UnsupportedOpError(f"{op_type} (opset {opset}): the string {text[:40]!r} is out of the int64 range")
        if target.kind == "b":
            out[index] = value != 0
        else:
            bits = target.itemsize * 8
            value %= 2**bits  # keep the low bits (C's conversions), then read them as the target type
            if target.kind == "i" and value >= 2 ** (bits - 1):
                value -= 2**bits
            out[index] = value
    return out


@register
class Cast(Operator):
    op_type = "Cast"
    since_version = 1

    def target(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> np.dtype[Any]:
        """The dtype to cast to (Cast: the ``to`` attribute)."""
        if "to" not in attrs:
            raise UnsupportedOpError(f"Cast (opset {self.opset}): the 'to' attribute is missing")
        return onnx_dtype(attrs["to"], "Cast", self.opset)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        return [cast_array(x, self.target(inputs, attrs), self.op_type, self.opset)]

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
        target = outputs[0].dtype
        if x.dtype.kind == "O" or target.kind == "O":
            raise NotOnDevice("string tensors live on the host")
        if x.dtype == target:
            return OpPlan(alias={0: 0})
        require_device_dtype(self.op_type, x.dtype, _DEVICE_DTYPES)
        require_device_dtype(self.op_type, target, _DEVICE_DTYPES)
        expression, helpers = _convert(x.dtype, target, self.op_type)
        op_type, opset = self.op_type, self.opset

        def function(array: np.ndarray) -> np.ndarray:
            return cast_array(array, target, op_type, opset)

        return elementwise_plan(
            self.op_type,
            [Operand(0, x, int64_pair=x.dtype.itemsize == 8)],
            outputs,
            expression,
            caps,
            function,
            inputs,
            helpers=INT64_WGSL if helpers else "",
            pair_output=target.itemsize == 8,
        )


@register
class CastLike(Cast):
    """CastLike (opset 15): Cast to the dtype of input 1."""

    op_type = "CastLike"
    since_version = 15

    def target(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> np.dtype[Any]:
        like = inputs[1]
        assert like is not None
        if like.dtype.kind not in "fiubO" and not is_float_dtype(like.dtype):
            raise UnsupportedOpError(f"CastLike (opset {self.opset}): target dtype {like.dtype} is not supported")
        return like.dtype
