"""Cast between dtypes (attribute ``to``: an ONNX ``TensorProto`` data type).

On the device between float32, float16, int32, uint8, int8 and bool, and to
int64 (the value truncated to int32, then sign-extended into the high word:
exact for values in int32 range).  From int64 the device casts to int32, int8,
uint8 (the low bits, which is C's wrap-around) and bool (both words) exactly;
int64 to a float type needs 64-bit arithmetic to round correctly, so it runs
on the CPU.  A cast to the input's own dtype aliases its input.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from ortgpu_core._errors import UnsupportedOpError

from ._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._registry import register
from ._wgsl import Operand, elementwise_plan, require_device_dtype, wgsl_compute_type

__all__ = ["Cast", "onnx_dtype"]

_DEVICE_DTYPES = ("float32", "float16", "int32", "int64", "uint8", "int8", "bool")


def onnx_dtype(code: int, op_type: str, opset: int) -> np.dtype[Any]:
    """The numpy dtype of an ONNX ``TensorProto`` data type code (UnsupportedOpError if none)."""
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(code)))
    except (KeyError, ValueError, TypeError):
        raise UnsupportedOpError(f"{op_type} (opset {opset}): data type {code} is not supported") from None
    if dtype.kind not in "fiub":
        raise UnsupportedOpError(f"{op_type} (opset {opset}): data type {dtype} is not supported")
    return dtype


def _convert(source: str, target: str) -> str:
    """WGSL converting ``x0`` from compute type ``source`` to compute type ``target``."""
    if source == target:
        return "x0"
    if target == "bool":
        zero = {"f32": "0.0", "i32": "0", "u32": "0u"}[source]
        return f"x0 != {zero}"
    if source == "bool":
        one = {"f32": "1.0", "i32": "1", "u32": "1u"}[target]
        zero = {"f32": "0.0", "i32": "0", "u32": "0u"}[target]
        return f"select({zero}, {one}, x0)"
    if target == "f32":
        return "f32(x0)"
    if source == "f32":
        # Truncation toward zero; unsigned targets go through i32 so negative values wrap as
        # onnxruntime's static_cast does on x86 (and as the reference does), instead of saturating.
        return "i32(x0)" if target == "i32" else "bitcast<u32>(i32(x0))"
    return f"bitcast<{target}>(x0)"  # i32 <-> u32 keep the low bits, as C's integer conversions do


@register
class Cast(Operator):
    op_type = "Cast"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if "to" not in attrs:
            raise UnsupportedOpError(f"Cast (opset {self.opset}): the 'to' attribute is missing")
        target = onnx_dtype(attrs["to"], "Cast", self.opset)
        if x.dtype.kind not in "fiub":
            raise UnsupportedOpError(f"Cast (opset {self.opset}): source dtype {x.dtype} is not supported")
        with np.errstate(invalid="ignore", over="ignore"):
            if target == np.bool_:
                return [x != 0]
            if x.dtype.kind == "f" and target.kind in "iu":
                # C truncation; going through int64 gives C's wrap-around for narrow targets.
                return [np.trunc(x).astype(np.int64).astype(target)]
            return [x.astype(target)]

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
        if x.dtype == target:
            return OpPlan(alias={0: 0})
        require_device_dtype("Cast", x.dtype, _DEVICE_DTYPES)
        require_device_dtype("Cast", target, _DEVICE_DTYPES)
        pair = False
        if x.dtype.name == "int64":
            if target.kind == "f":
                raise NotOnDevice(
                    f"Cast from int64 to {target.name} runs on the CPU: rounding a 64-bit integer needs 64-bit arithmetic"
                )
            pair = target == np.bool_
        source_type = wgsl_compute_type(x.dtype)
        expression = "any(x0 != vec2<u32>(0u, 0u))" if pair else _convert(source_type, wgsl_compute_type(target))

        def function(array: np.ndarray) -> np.ndarray:
            return self.reference([array], attrs, outputs)[0]

        return elementwise_plan("Cast", [Operand(0, x, int64_pair=pair)], outputs, expression, caps, function, inputs)
