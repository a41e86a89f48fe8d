"""onnxruntime's ``QEmbedLayerNormalization`` (com.microsoft): ``EmbedLayerNormalization`` over 8-bit tables.

What onnxruntime's dynamic quantization writes for a fused ``EmbedLayerNormalization``: the word, position and
segment embeddings, gamma and beta are uint8 or int8 (one type for all, as onnxruntime's kernel reads them), each with
its own per-tensor scale (inputs 8-12) and zero point (inputs 13-17).  onnxruntime's CPU kernel dequantizes every
value it reads as ``float(q - zero_point) * scale`` (float32, as ``DequantizeLinear``), then computes what the float
operator does: the word + position (+ segment) sum per token, layer-normalised with gamma and beta (epsilon default
1e-12); token ``s`` takes position row ``s`` (there is no ``position_ids`` input); the segment ids, table, scale and
zero point come together or not at all.  Outputs: the normalised ``[B, S, hidden]`` float32 and ``mask_index`` ``[B]`` int32, each
mask row's count of ones (zeros without a mask).

On the device, the plan is ``DequantizeLinear``'s kernel for each table into a float32 scratch buffer (the plan
format holds no constant data of its own to dequantize into at plan time, so the tables are dequantized by the first
kernels of every run: one pass over each table), then ``EmbedLayerNormalization``'s kernels (gather and sum, mask
count, row normalisation) rebound onto those scratch tables and this node's ids, mask and outputs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidModelError, ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from ..ai_onnx.quantize import DequantizeLinear
from ._attention_parts import F32, PlanBuilder
from .embed_layer_norm import EmbedLayerNormalization

__all__ = ["QEmbedLayerNormalization"]

_NAME = "QEmbedLayerNormalization"
_IDS, _SEGMENT_IDS, _WORDS, _POSITIONS, _SEGMENTS, _GAMMA, _BETA, _MASK = range(8)
_TABLE_NAMES = {
    _WORDS: "word_embedding",
    _POSITIONS: "position_embedding",
    _SEGMENTS: "segment_embedding",
    _GAMMA: "gamma",
    _BETA: "beta",
}
#: a table's scale input is ``table + 6``, its zero point ``table + 11``
_SCALE_OFFSET, _ZERO_OFFSET = 6, 11
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _optional(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index and inputs[index] is not None else None


def _tables(inputs: Sequence[Any]) -> list[int]:
    """The table inputs this node reads (the segment table only with segment ids, as onnxruntime's kernel), after
    checking each table's type and its per-tensor scale and zero point."""
    tables = [_WORDS, _POSITIONS, _GAMMA, _BETA]
    segment_parts = [_SEGMENT_IDS, _SEGMENTS, _SEGMENTS + _SCALE_OFFSET, _SEGMENTS + _ZERO_OFFSET]
    given = [_optional(inputs, index) is not None for index in segment_parts]
    if any(given) and not all(given):
        raise InvalidModelError(
            f"{_NAME}: segment_ids, segment_embedding and its scale and zero point (inputs 1, 4, 10, 15) are given "
            "together or not at all (as onnxruntime requires); this node gives only some of them"
        )
    if all(given):
        tables.insert(2, _SEGMENTS)
    words = inputs[_WORDS]
    if words.dtype not in _EIGHT_BIT:
        raise UnsupportedOpError(f"{_NAME}: word_embedding of dtype {words.dtype} (uint8 or int8 expected)")
    for table in tables:
        name = _TABLE_NAMES[table]
        value, scale, zero = (
            inputs[table],
            _optional(inputs, table + _SCALE_OFFSET),
            _optional(inputs, table + _ZERO_OFFSET),
        )
        if value.dtype != words.dtype:
            raise UnsupportedOpError(
                f"{_NAME}: {name} of dtype {value.dtype} differs from word_embedding's {words.dtype}"
            )
        if scale is None or zero is None:
            raise UnsupportedOpError(
                f"{_NAME}: {name} needs its scale (input {table + _SCALE_OFFSET}) and zero point (input "
                f"{table + _ZERO_OFFSET})"
            )
        for what, parameter in (("scale", scale), ("zero point", zero)):
            if parameter.size != 1 or len(parameter.shape) > 1:
                raise ShapeError(
                    f"{_NAME}: the {what} of {name} has shape {tuple(parameter.shape)}; it must be one value"
                )
        if scale.dtype != np.float32:
            raise UnsupportedOpError(f"{_NAME}: the scale of {name} is {scale.dtype} (float32 expected)")
        if zero.dtype != value.dtype:
            raise UnsupportedOpError(f"{_NAME}: the zero point of {name} is {zero.dtype}, the table {value.dtype}")
    return tables


def _float_inputs(inputs: Sequence[Any], tables: Sequence[int], dequantized: Sequence[Any]) -> list[Any]:
    """EmbedLayerNormalization's inputs: the ids and mask of this node, the tables replaced by ``dequantized``."""
    result: list[Any] = [inputs[_IDS], _optional(inputs, _SEGMENT_IDS), None, None, None, None, None]
    for table, value in zip(tables, dequantized):
        result[table] = value
    result.append(_optional(inputs, _MASK))
    return result


@register
class QEmbedLayerNormalization(Operator):
    """com.microsoft QEmbedLayerNormalization-1."""

    op_type = _NAME
    domain = "com.microsoft"
    since_version = 1

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        _tables(inputs)
        ids, words = inputs[_IDS], inputs[_WORDS]
        assert ids is not None and words is not None
        if len(ids.shape) != 2 or len(words.shape) != 2:
            raise ShapeError(f"{_NAME}: input_ids {ids.shape} must be 2-D and word_embedding {words.shape} 2-D")
        return [(ids.shape[0], ids.shape[1], words.shape[1]), (ids.shape[0],)]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        tables = _tables(inputs)
        dequantize = DequantizeLinear(21)
        dequantized = []
        for table in tables:
            parameters = [inputs[table], inputs[table + _SCALE_OFFSET], inputs[table + _ZERO_OFFSET]]
            dequantized.append(dequantize.reference(parameters, {}, [])[0])
        results = EmbedLayerNormalization().reference(_float_inputs(inputs, tables, dequantized), attrs, outputs[:2])
        return results[:2]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        tables = _tables(inputs)
        if outputs[0].dtype != F32:
            raise NotOnDevice(f"{_NAME}: the WebGPU kernels write float32, not {outputs[0].dtype}")
        builder = PlanBuilder(_NAME)
        dequantized: list[TensorInfo] = []
        bindings: list[Binding] = []
        for table in tables:
            info = inputs[table]
            assert info is not None
            scale, zero = inputs[table + _SCALE_OFFSET], inputs[table + _ZERO_OFFSET]
            assert scale is not None and zero is not None
            floats = TensorInfo(info.shape, F32)
            at = builder.scratch(floats)
            plan = DequantizeLinear(21).plan([info, scale, zero], [floats], {}, caps, {})
            sources = [
                Binding("input", table),
                Binding("input", table + _SCALE_OFFSET),
                Binding("input", table + _ZERO_OFFSET),
            ]
            builder.include(plan, sources, [at])
            dequantized.append(floats)
            bindings.append(at)
        float_inputs = _float_inputs(inputs, tables, dequantized)
        float_bindings: list[Binding | None] = [
            None if info is None else Binding("input", index) for index, info in enumerate(float_inputs)
        ]
        for table, at in zip(tables, bindings):
            float_bindings[table] = at
        embed = EmbedLayerNormalization().plan(float_inputs, outputs[:2], attrs, caps, {})
        builder.include(embed, float_bindings, [Binding("output", 0), Binding("output", 1)])
        return builder.build()
