"""com.microsoft's QLinearSoftmax: the Softmax of ``quantize_static``'s QOperator format, on uint8/int8 tensors.

Inputs X, X_scale, x_zero_point (optional, unused: softmax does not change when every input moves by the same
amount), y_scale, y_zero_point; attributes ``opset`` (required: the ai.onnx opset of the Softmax it replaces) and
``axis`` (default -1: the schema's default, which onnxruntime applies before its kernel's opset-dependent one).  Before opset 13 each row is everything from ``axis`` on (the input
coerced to 2-D), from 13 the single ``axis``; D is the row's length.

onnxruntime's CPU kernel, reproduced here: a 256-entry float32 table of exponentials built in float64,
``T[i] = f32(exp((i - 255 + shift) * x_scale))`` with ``shift = max(0, log(f32(FLT_MAX / D)) - 5) / x_scale`` (so that
D terms sum below ``FLT_MAX``); per row, with ``m`` the row's largest byte, each element's term ``T[x - m + 255]``, the
float32 sum of the terms in row order, then ``round_half_even(term / sum * floor(1 / y_scale)) + y_zero_point``
saturated to the output type.

Where this may differ from onnxruntime by one step: the kernel that onnxruntime 1.32 ships is not the one its
published source shows (the source wraps int8 results and overflows for one-element rows; the shipped kernel
saturates and does not), so the order of its last float32 operations is inferred from its outputs; random tests
agree on every element but a few near rounding ties.

Runs on the CPU: a device kernel would need that exact operation order (unknown) and a correctly rounded float32
division (WGSL's is not: 2.5 ULP), so it could not promise onnxruntime's bytes.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidModelError, ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register

__all__ = ["QLinearSoftmax", "exponential_table"]

F32 = np.float32
_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))
#: The ai.onnx opset from which Softmax normalizes along one axis (before: everything from ``axis`` on).
_ONE_AXIS_OPSET = 13


def exponential_table(x_scale: float, length: int) -> np.ndarray:
    """onnxruntime's 256 float32 exponentials for rows of ``length`` terms (indexed by ``x - row_max + 255``)."""
    largest = F32(np.finfo(F32).max) / F32(length)
    shift = max(0.0, math.log(float(largest)) - 5.0) / float(x_scale)
    return np.array([math.exp((float(i) - 255.0 + shift) * float(x_scale)) for i in range(256)]).astype(F32)


def _scalar(op_type: str, value: np.ndarray | None, what: str) -> Any:
    if value is None:
        raise ShapeError(f"{op_type}: {what} is required")
    if value.size != 1 or value.ndim > 1:
        raise ShapeError(f"{op_type}: {what} must be a scalar or one value, got shape {value.shape}")
    return value.reshape(-1)[0]


@register
class QLinearSoftmax(Operator):
    op_type = "QLinearSoftmax"
    domain = "com.microsoft"
    since_version = 1

    def _rows(self, shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[int, bool]:
        """The normalized axis (non-negative) and whether rows span every later axis too (opset < 13)."""
        if "opset" not in attrs:
            raise InvalidModelError(
                f"{self.op_type}: the 'opset' attribute is required (the ai.onnx opset of the Softmax it replaces)"
            )
        flattened = int(attrs["opset"]) < _ONE_AXIS_OPSET
        # the schema's default (-1) applies whatever the opset: onnxruntime reads it before its own opset-12 default
        axis = int(attrs.get("axis", -1))
        rank = len(shape)
        if rank == 0 or not -rank <= axis < rank:
            raise ShapeError(f"{self.op_type}: axis {axis} out of range for an input of shape {shape}")
        return axis % rank, flattened

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype not in _BYTES:
            raise UnsupportedOpError(f"{self.op_type}: X of dtype {x.dtype} (uint8 or int8 expected)")
        x_scale, y_scale = inputs[1], inputs[3] if len(inputs) > 3 else None
        y_zero = inputs[4] if len(inputs) > 4 else None
        for value, what in ((x_scale, "X_scale"), (y_scale, "y_scale")):
            if value is not None and value.dtype != np.float32:
                raise UnsupportedOpError(f"{self.op_type}: {what} of dtype {value.dtype} (float32 expected)")
        if y_zero is not None and y_zero.dtype != x.dtype:
            raise UnsupportedOpError(f"{self.op_type}: y_zero_point of dtype {y_zero.dtype} differs from X's {x.dtype}")
        scale_in = F32(_scalar(self.op_type, x_scale, "X_scale"))
        scale_out = F32(_scalar(self.op_type, y_scale, "y_scale"))
        zero = int(_scalar(self.op_type, y_zero, "y_zero_point"))
        axis, flattened = self._rows(x.shape, attrs)
        if x.size == 0:
            return [np.empty(x.shape, dtype=x.dtype)]
        moved = x if flattened else np.moveaxis(x, axis, -1)
        length = int(np.prod(x.shape[axis:])) if flattened else int(x.shape[axis])
        rows = moved.reshape(-1, length).astype(np.int64)
        table = exponential_table(float(scale_in), length)
        terms = table[rows - rows.max(axis=1, keepdims=True) + 255]
        sums = np.zeros(rows.shape[0], dtype=F32)
        for column in range(length):  # float32, in row order, as onnxruntime sums
            sums = (sums + terms[:, column]).astype(F32)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            steps = F32(np.floor(F32(1.0) / scale_out))
            quotients = ((terms / sums[:, None]).astype(F32) * steps).astype(F32)
        info = np.iinfo(x.dtype)
        rounded = np.rint(np.nan_to_num(quotients.astype(np.float64), nan=0.0, posinf=info.max, neginf=info.min))
        y = np.clip(rounded + zero, info.min, info.max).astype(x.dtype).reshape(moved.shape)
        return [np.ascontiguousarray(y if flattened else np.moveaxis(y, -1, axis))]

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        x = inputs[0]
        assert x is not None
        self._rows(x.shape, attrs)  # a bad axis or a missing opset is the model's error
        return [tuple(x.shape)]

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
        self._rows(x.shape, attrs)  # a bad axis or a missing opset is the model's error, not a placement
        raise NotOnDevice(
            f"{self.op_type}: runs on the CPU (onnxruntime's exact float32 order is reproduced there; WGSL's division "
            "is not correctly rounded)"
        )
