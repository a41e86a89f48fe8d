"""onnxruntime's ``QAttention`` (com.microsoft): the ``Attention`` operator with an 8-bit packed projection.

What onnxruntime's dynamic quantization writes for a fused ``Attention``: the float hidden state goes through a
``DynamicQuantizeLinear`` node first (so ``input`` arrives here already quantized, uint8 on onnxruntime's CPU, with
its run-time ``input_scale`` and ``input_zero_point``), and the packed weights ``[K, 3 * hidden]`` are int8 or uint8
with ``weight_scale`` and ``weight_zero_point`` per tensor or per column.  The projection is onnxruntime's
integer GEMM: ``acc = (input - input_zero_point) . (weight - weight_zero_point)`` exactly in int32, then
``float(acc) * (weight_scale * input_scale) + bias`` in float32 (the scales' product rounded once, as onnxruntime
multiplies them before its GEMM).  The rest is the ``Attention`` operator's: heads split from the packed Q, K, V,
``past`` ``[2, B, N, P, H]`` in front of K and V, ``mask_index`` in its forms, ``unidirectional``, ``scale``,
``mask_filter_value``, ``present``.

On the device (float32, per-tensor scales and zero points) the projection is the integer matmul kernel of
``MatMulInteger`` in its to-float form (:func:`..ai_onnx.quantized_matmul.integer_matmul_kernel`, which adds the
bias too), writing the packed scratch that :func:`.attention.plan_packed_attention` then splits and attends, as for
the float ``Attention``.  Per-column weight scales or zero points run on the CPU (that kernel reads one scale and one
zero point per operand), as do float16 nodes (onnxruntime's CPU kernel has none to agree with).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from ..ai_onnx.quantized_matmul import integer_matmul, integer_matmul_kernel
from ._attention_parts import F32, PlanBuilder
from .attention import PackedInputs, attend_packed, packed_geometry, plan_packed_attention

__all__ = ["QAttention"]

_NAME = "QAttention"
#: input positions
_INPUT, _WEIGHT, _BIAS, _INPUT_SCALE, _WEIGHT_SCALE, _MASK, _INPUT_ZERO, _WEIGHT_ZERO, _PAST = range(9)
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _optional(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


def _check(inputs: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[int, int, int, tuple[int, int, int], int, int]:
    """The packed geometry after checking the quantization inputs (arrays or infos: both have shape, size, dtype)."""
    x, w, bias = inputs[_INPUT], inputs[_WEIGHT], inputs[_BIAS]
    past = _optional(inputs, _PAST)
    if attrs.get("qkv_hidden_sizes"):
        raise UnsupportedOpError(f"{_NAME}: qkv_hidden_sizes is not an attribute of QAttention; remove it")
    geometry = packed_geometry(
        tuple(x.shape), tuple(w.shape), None if past is None else tuple(past.shape), attrs, _NAME
    )
    width = int(w.shape[1])
    for name, value in (("input", x), ("weight", w)):
        if value.dtype not in _EIGHT_BIT:
            raise UnsupportedOpError(f"{_NAME}: {name} of dtype {value.dtype} (uint8 or int8 expected)")
    if tuple(bias.shape) != (width,):
        raise ShapeError(f"{_NAME}: bias has shape {tuple(bias.shape)}; it must be ({width},), the weight's columns")
    scale = inputs[_INPUT_SCALE]
    if scale.size != 1 or len(scale.shape) > 1:
        raise ShapeError(f"{_NAME}: input_scale has shape {tuple(scale.shape)}; it must be a scalar (one value)")
    for index, name, dtype in ((_WEIGHT_SCALE, "weight_scale", None), (_WEIGHT_ZERO, "weight_zero_point", w.dtype)):
        value = _optional(inputs, index)
        if value is None:
            continue
        if (value.size != 1 or len(value.shape) > 1) and tuple(value.shape) != (width,):
            raise ShapeError(
                f"{_NAME}: {name} has shape {tuple(value.shape)}; it must be one value (per tensor) or ({width},) "
                "(per column)"
            )
        if dtype is not None and value.dtype != dtype:
            raise UnsupportedOpError(f"{_NAME}: {name} of dtype {value.dtype} differs from the weight's {dtype}")
    zero = _optional(inputs, _INPUT_ZERO)
    if zero is not None:
        if zero.size != 1 or len(zero.shape) > 1:
            raise ShapeError(f"{_NAME}: input_zero_point has shape {tuple(zero.shape)}; it must be one value")
        if zero.dtype != x.dtype:
            raise UnsupportedOpError(f"{_NAME}: input_zero_point of dtype {zero.dtype} differs from input's {x.dtype}")
    for index, name in ((_BIAS, "bias"), (_INPUT_SCALE, "input_scale"), (_WEIGHT_SCALE, "weight_scale")):
        if inputs[index].dtype not in (np.float32, np.float16):
            raise UnsupportedOpError(f"{_NAME}: {name} of dtype {inputs[index].dtype} (float32 or float16 expected)")
    return geometry


@register
class QAttention(Operator):
    """com.microsoft QAttention-1."""

    op_type = _NAME
    domain = "com.microsoft"
    since_version = 1

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        batch, sq, heads, sizes, head, past_length = _check(inputs, attrs)
        return [(batch, sq, sizes[2]), (2, batch, heads, past_length + sq, head)]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        geometry = _check(inputs, attrs)
        x, w, bias, input_scale, weight_scale = inputs[:5]
        assert x is not None and w is not None and bias is not None
        assert input_scale is not None and weight_scale is not None
        batch, sq, _, _, _, _ = geometry
        accumulated = integer_matmul(
            x.reshape(batch * sq, -1), w, _optional(inputs, _INPUT_ZERO), _optional(inputs, _WEIGHT_ZERO), _NAME
        )
        # onnxruntime multiplies the scales first (float32), then scales each int32 sum and adds the bias
        scales = weight_scale.astype(np.float32).reshape(-1) * input_scale.astype(np.float32).reshape(())
        packed = accumulated.astype(np.float32) * scales + bias.astype(np.float32)
        dtype = bias.dtype
        past = _optional(inputs, _PAST)
        results = attend_packed(
            packed.reshape(batch, sq, -1),
            geometry,
            _optional(inputs, _MASK),
            None if past is None else past.astype(np.float32),
            None,
            attrs,
            len(outputs) > 1,
            _NAME,
        )
        return [result.astype(dtype) for result in results]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        geometry = _check(inputs, attrs)
        x, w, bias = inputs[_INPUT], inputs[_WEIGHT], inputs[_BIAS]
        assert x is not None and w is not None and bias is not None
        mask, past = _optional(inputs, _MASK), _optional(inputs, _PAST)
        floats = [bias, inputs[_INPUT_SCALE], inputs[_WEIGHT_SCALE], past, *outputs]
        if any(info is not None and info.dtype != F32 for info in floats):
            raise NotOnDevice(f"{_NAME}: the WebGPU kernels take float32 scales, bias and past (float16 on the CPU)")
        for index in (_WEIGHT_SCALE, _WEIGHT_ZERO):
            info = _optional(inputs, index)
            if info is not None and info.size != 1:
                raise NotOnDevice(
                    f"{_NAME}: per-column weight scales and zero points run on the CPU (the integer matmul kernel "
                    "reads one of each)"
                )
        batch, sq, _, (hq, hk, hv), _, _ = geometry
        width = hq + hk + hv
        builder = PlanBuilder(_NAME)
        packed = TensorInfo((batch * sq, width), F32)
        packed_at = builder.scratch(packed)
        # the projection planned as a MatMulInteger-to-float node of inputs (a, b, a_zero, b_zero, a_scale, b_scale,
        # bias), rebound onto this node's inputs
        node = [_INPUT, _WEIGHT, _INPUT_ZERO, _WEIGHT_ZERO, _INPUT_SCALE, _WEIGHT_SCALE, _BIAS]
        present = [_optional(inputs, index) is not None for index in node]
        infos: list[TensorInfo | None] = [_optional(inputs, index) for index in node]
        infos[0] = TensorInfo((batch * sq, x.shape[2]), x.dtype)
        positions = [slot if present[slot] else -1 for slot in range(4)]

        def projection(*arrays: np.ndarray) -> np.ndarray:
            values: list[np.ndarray | None] = [None] * len(node)
            for slot, array in zip([slot for slot in range(len(node)) if present[slot]], arrays):
                values[slot] = array
            a, b, a_zero, b_zero, a_scale, b_scale, added = values
            assert a is not None and b is not None and a_scale is not None and b_scale is not None
            assert added is not None
            accumulated = integer_matmul(a, b, a_zero, b_zero, _NAME)
            scales = b_scale.astype(np.float32).reshape(()) * a_scale.astype(np.float32).reshape(())
            return np.asarray(accumulated.astype(np.float32) * scales + added.astype(np.float32))

        gemm = integer_matmul_kernel(_NAME, infos, [packed], positions, caps, projection, to_float=(4, 5, 6))
        node_bindings: list[Binding | None] = [
            Binding("input", index) if present[s] else None for s, index in enumerate(node)
        ]
        builder.include(gemm, node_bindings, [packed_at])
        parts = PackedInputs(
            bias=None,  # added by the projection
            mask=None if mask is None else (Binding("input", _MASK), mask),
            past=None if past is None else Binding("input", _PAST),
            attention_bias=None,
        )
        plan_packed_attention(builder, packed_at, F32, geometry, parts, attrs, caps, len(outputs) > 1)
        return builder.build()
