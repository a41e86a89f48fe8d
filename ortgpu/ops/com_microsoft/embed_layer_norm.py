"""onnxruntime's ``EmbedLayerNormalization`` (com.microsoft, version 1): BERT's embedding layer, fused by its
transformer optimizer.

For each token (b, s) of ``input_ids`` (batch, sequence), the sum ``word_embedding[input_ids[b, s]] +
position_embedding[p] + segment_embedding[segment_ids[b, s]]`` is layer-normalised over the hidden size with gamma
and beta (epsilon default 1e-12).  ``p`` is ``position_ids[b, s]`` (position_ids of shape (batch, sequence) or (1,
sequence)), or ``s`` without them.  Without segment_ids a present segment_embedding adds its row 0 (what
onnxruntime's CPU kernel does); segment_ids without a segment_embedding are refused.  Outputs: the normalised
(batch, sequence, hidden); ``mask_index`` (batch,) int32, the count of ones in each row of ``mask`` (zeros without a
mask); optionally the embedding sum before normalisation (output 2).  Ids, segment ids, position ids and mask are
int32, as onnxruntime requires; an id outside its table is an error of the run (``InvalidArgumentError``).

On the device, two kernels: a gather kernel adds the three rows of each element in float32 into a scratch buffer
(and output 2 where asked), counts the mask's ones into mask_index, and flags an id outside its table through the
program's status words; then the shared row kernel (:mod:`.._row_norm`) normalises the scratch rows, planned for a
node whose input 0 is that sum and rebound onto this node's buffers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, InvalidModelError, ShapeError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._row_norm import RowNorm, require_row_norm_dtypes, row_norm_plan
from .._tiling import THREADS, BindingTable, grid_for_groups, single_kernel_plan, workgroup_index
from .layer_norms import DEFAULT_EPSILON, check_vector, wanted_outputs

__all__ = ["EmbedLayerNormalization"]

_NAME = "EmbedLayerNormalization"
#: input positions
_IDS, _SEGMENT_IDS, _WORDS, _POSITIONS, _SEGMENTS, _GAMMA, _BETA, _MASK, _POSITION_IDS = range(9)


#: what a twin's computation returns for an output its kernel does not bind (never written)
_UNBOUND = np.zeros(0, np.float32)


def _optional(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


def _check_shapes(shapes: Sequence[tuple[int, ...] | None]) -> None:
    """ShapeError (InvalidModelError for segment ids without their table) naming the input and the shape it needs."""
    ids, words, positions = shapes[_IDS], shapes[_WORDS], shapes[_POSITIONS]
    assert ids is not None and words is not None and positions is not None
    if len(ids) != 2:
        raise ShapeError(f"{_NAME}: input_ids has shape {ids}; it must be 2-D (batch, sequence)")
    for index, name in ((_SEGMENT_IDS, "segment_ids"), (_MASK, "mask")):
        shape = _optional(shapes, index)
        if shape is not None and shape != ids:
            raise ShapeError(f"{_NAME}: {name} has shape {shape}; it must be input_ids' {ids}")
    if len(words) != 2:
        raise ShapeError(f"{_NAME}: word_embedding has shape {words}; it must be 2-D (vocabulary, hidden)")
    hidden = words[1]
    for index, name in ((_POSITIONS, "position_embedding"), (_SEGMENTS, "segment_embedding")):
        shape = _optional(shapes, index)
        if shape is not None and (len(shape) != 2 or shape[1] != hidden):
            raise ShapeError(f"{_NAME}: {name} has shape {shape}; it must be 2-D (rows, {hidden}), as word_embedding")
    if _optional(shapes, _SEGMENT_IDS) is not None and _optional(shapes, _SEGMENTS) is None:
        raise InvalidModelError(f"{_NAME}: segment_ids are given without a segment_embedding (input 4) to look up")
    for index, name in ((_GAMMA, "gamma"), (_BETA, "beta")):
        shape = shapes[index]
        assert shape is not None
        check_vector(_NAME, name, shape, hidden)
    position_ids = _optional(shapes, _POSITION_IDS)
    if position_ids is None:
        if ids[1] > positions[0]:
            raise ShapeError(
                f"{_NAME}: the sequence has {ids[1]} tokens, and position_embedding only {positions[0]} rows "
                "(without position_ids token s takes row s)"
            )
    elif len(position_ids) != 2 or position_ids[0] not in (1, ids[0]) or position_ids[1] != ids[1]:
        raise ShapeError(
            f"{_NAME}: position_ids has shape {position_ids}; it must be ({ids[0]}, {ids[1]}) or (1, {ids[1]})"
        )


def _rows(name: str, ids: np.ndarray, table_rows: int) -> np.ndarray:
    """``ids`` as row numbers of a table of ``table_rows`` rows; an id outside it is an error of the run."""
    wide = ids.astype(np.int64)
    if wide.size and (wide.min() < 0 or wide.max() >= table_rows):
        bad = int(wide.min() if wide.min() < 0 else wide.max())
        raise InvalidArgumentError(f"{_NAME}: {name} holds {bad}, outside [0, {table_rows}) (the rows of its table)")
    return wide


def _embedding_sum(inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """The float32 sum of each token's three embedding rows, in onnxruntime's order (word, position, segment)."""
    ids, words, positions = inputs[_IDS], inputs[_WORDS], inputs[_POSITIONS]
    assert ids is not None and words is not None and positions is not None
    batch, sequence = ids.shape
    total = words.astype(np.float32)[_rows("input_ids", ids, words.shape[0])]
    position_ids = _optional(inputs, _POSITION_IDS)
    if position_ids is None:
        rows = np.broadcast_to(np.arange(sequence), (batch, sequence))
    else:
        rows = np.broadcast_to(_rows("position_ids", position_ids, positions.shape[0]), (batch, sequence))
    total = total + positions.astype(np.float32)[rows]
    segments = _optional(inputs, _SEGMENTS)
    if segments is not None:
        segment_ids = _optional(inputs, _SEGMENT_IDS)
        rows = np.zeros((batch, sequence), np.int64) if segment_ids is None else segment_ids
        total = total + segments.astype(np.float32)[_rows("segment_ids", rows, segments.shape[0])]
    return np.asarray(total, dtype=np.float32)


def _normalized(total: np.ndarray, gamma: np.ndarray, beta: np.ndarray, epsilon: float) -> np.ndarray:
    wide = total.astype(np.float64)
    mean = np.mean(wide, axis=-1, keepdims=True)
    inv_std = 1.0 / np.sqrt(np.mean((wide - mean) ** 2, axis=-1, keepdims=True) + epsilon)
    return np.asarray((wide - mean) * inv_std * gamma.astype(np.float64) + beta.astype(np.float64))


def _mask_index(mask: np.ndarray | None, batch: int) -> np.ndarray:
    """The count of ones in each row of ``mask`` (zeros without one), as onnxruntime's CPU kernel writes it."""
    if mask is None:
        return np.zeros(batch, np.int32)
    return np.asarray(np.count_nonzero(mask == 1, axis=1), dtype=np.int32)


def _rebound(kernel: KernelSpec, mapping: Mapping[Binding, Binding]) -> KernelSpec:
    """``kernel`` bound to other buffers: its twin reads its arrays by slot, so it follows unchanged."""
    return dataclasses.replace(kernel, bindings=tuple(mapping.get(b, b) for b in kernel.bindings))


@register
class EmbedLayerNormalization(Operator):
    """EmbedLayerNormalization-1 (com.microsoft)."""

    op_type = _NAME
    domain = "com.microsoft"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        _check_shapes([a if a is None else tuple(a.shape) for a in inputs])
        words, gamma, beta = inputs[_WORDS], inputs[_GAMMA], inputs[_BETA]
        assert words is not None and gamma is not None and beta is not None
        total = _embedding_sum(inputs)
        y = _normalized(total, gamma, beta, float(attrs.get("epsilon", DEFAULT_EPSILON)))
        results = [
            y.astype(words.dtype),
            _mask_index(_optional(inputs, _MASK), total.shape[0]),
            total.astype(words.dtype),
        ]
        return results[: max(1, len(outputs))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        _check_shapes([i if i is None else i.shape for i in inputs])
        ids, words, positions = inputs[_IDS], inputs[_WORDS], inputs[_POSITIONS]
        assert ids is not None and words is not None and positions is not None
        wanted = wanted_outputs(outputs, 3)
        floats = [inputs[i] for i in (_WORDS, _POSITIONS, _SEGMENTS, _GAMMA, _BETA) if i < len(inputs)]
        require_row_norm_dtypes(_NAME, floats + [outputs[i] for i in (0, 2) if wanted[i]], caps)
        if wanted[1] and outputs[1].dtype != np.int32:
            raise NotOnDevice(f"{_NAME}: mask_index is int32, not {outputs[1].dtype}")
        for index in (_IDS, _SEGMENT_IDS, _MASK, _POSITION_IDS):
            info = _optional(inputs, index)
            if info is not None and info.dtype != np.int32:
                raise NotOnDevice(
                    f"{_NAME}: its kernel reads int32 ids and mask (onnxruntime's type), not {info.dtype}"
                )
        batch, sequence = ids.shape
        hidden = words.shape[1]
        if batch * sequence * hidden == 0:
            raise NotOnDevice(f"{_NAME}: an empty batch, sequence or hidden size is computed on the CPU")
        total = TensorInfo((batch, sequence, hidden), np.dtype(np.float32))
        gather = self._gather_kernel(inputs, outputs, wanted, total, caps)
        # the row kernel of a node (sum, gamma, beta) -> output 0, rebound onto the scratch sum and this node's buffers
        gamma, beta = inputs[_GAMMA], inputs[_BETA]
        assert gamma is not None and beta is not None
        channel = f"return at % {hidden}u;"
        spec = RowNorm(
            "variance",
            epsilon=float(attrs.get("epsilon", DEFAULT_EPSILON)),
            scale_input=1,
            scale_index=channel,
            bias_input=2,
            bias_index=channel,
            sum_output=2 if wanted[2] else None,
        )
        epsilon = spec.epsilon
        words_dtype = words.dtype

        def compute(full: list[np.ndarray | None]) -> list[np.ndarray]:
            summed, gamma_values, beta_values = full[0], full[1], full[2]
            assert summed is not None and gamma_values is not None and beta_values is not None
            y = _normalized(summed, gamma_values, beta_values, epsilon)
            return [y, _UNBOUND, summed.astype(words_dtype)]

        norm_outputs = [outputs[0], total, outputs[2] if wanted[2] else total]
        (norm,) = row_norm_plan(_NAME, spec, (2,), [total, gamma, beta], norm_outputs, caps, compute).kernels
        norm = _rebound(
            norm,
            {
                Binding("input", 0): Binding("scratch", 0),
                Binding("input", 1): Binding("input", _GAMMA),
                Binding("input", 2): Binding("input", _BETA),
            },
        )
        kernels = (gather, norm) if not wanted[1] else (gather, self._mask_kernel(inputs, outputs, caps), norm)
        return OpPlan(kernels=kernels, scratch_sizes=(total.nbytes,))

    def _gather_kernel(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        wanted: Sequence[bool],
        total: TensorInfo,
        caps: DeviceCaps,
    ) -> KernelSpec:
        """The kernel adding each element's embedding rows into the scratch sum (bound as output 0 of the node it is
        planned for, rebound to scratch 0), counting the mask into mask_index and flagging ids outside their tables."""
        words, positions = inputs[_WORDS], inputs[_POSITIONS]
        assert words is not None and positions is not None
        batch, sequence, hidden = total.shape
        count = batch * sequence * hidden
        table = BindingTable()
        element = "f16" if words.dtype == np.float16 else "f32"
        ids = table.add(Binding("input", _IDS), "i32")
        word_table = table.add(Binding("input", _WORDS), element)
        position_table = table.add(Binding("input", _POSITIONS), element)
        scratch = table.add(Binding("output", 0), "f32", writable=True)
        status = table.add(Binding("status"), "atomic<u32>", writable=True)
        lines = [
            f"    let word = {ids}[token];",
            f"    var bad = word < 0 || word >= {words.shape[0]};",
        ]
        position_ids = _optional(inputs, _POSITION_IDS)
        if position_ids is None:
            lines.append(f"    let position = i32(token % {sequence}u);")
        else:
            name = table.add(Binding("input", _POSITION_IDS), "i32")
            row = "token" if position_ids.shape[0] == batch else f"token % {sequence}u"
            lines += [
                f"    let position = {name}[{row}];",
                f"    bad = bad || position < 0 || position >= {positions.shape[0]};",
            ]
        value = (
            f"f32({word_table}[u32(clamp(word, 0, {words.shape[0] - 1})) * {hidden}u + c])"
            f" + f32({position_table}[u32(clamp(position, 0, {positions.shape[0] - 1})) * {hidden}u + c])"
        )
        segments = _optional(inputs, _SEGMENTS)
        if segments is not None:
            segment_table = table.add(Binding("input", _SEGMENTS), element)
            if _optional(inputs, _SEGMENT_IDS) is None:
                lines.append("    let segment = 0;")
            else:
                name = table.add(Binding("input", _SEGMENT_IDS), "i32")
                lines += [
                    f"    let segment = {name}[token];",
                    f"    bad = bad || segment < 0 || segment >= {segments.shape[0]};",
                ]
            value += f" + f32({segment_table}[u32(clamp(segment, 0, {segments.shape[0] - 1})) * {hidden}u + c])"
        lines += [f"    if (bad) {{ atomicOr(&{status}[0], 1u); }}", f"    let v = {value};", f"    {scratch}[j] = v;"]
        grid = grid_for_groups(-(-count // THREADS), caps)
        body = "\n".join(lines)
        wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let j = {workgroup_index(grid)} * {THREADS}u + li;
    if (j >= {count}u) {{ return; }}
    let token = j / {hidden}u;
    let c = j % {hidden}u;
{body}
}}
"""

        compute = lambda full: [_embedding_sum(full)]  # noqa: E731
        # planned as a node whose output 0 is the float32 sum (its twin writes it there), then rebound to the scratch
        plan = single_kernel_plan(_NAME, wgsl, grid, table, compute, inputs, [total], caps)
        return _rebound(plan.kernels[0], {Binding("output", 0): Binding("scratch", 0)})

    def _mask_kernel(
        self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo], caps: DeviceCaps
    ) -> KernelSpec:
        """The kernel writing mask_index: one invocation per batch row counts the ones of its mask row (0 without
        a mask)."""
        ids = inputs[_IDS]
        assert ids is not None
        batch, sequence = ids.shape
        table = BindingTable()
        mask_index = table.add(Binding("output", 1), "i32", writable=True)
        if _optional(inputs, _MASK) is None:
            body = f"    {mask_index}[b] = 0;"
        else:
            check_loop_budget(_NAME, sequence, caps)
            mask = table.add(Binding("input", _MASK), "i32")
            body = f"""    var ones = 0;
    for (var k = 0u; k < {sequence}u; k = k + 1u) {{
        ones = ones + select(0, 1, {mask}[b * {sequence}u + k] == 1);
    }}
    {mask_index}[b] = ones;"""
        grid = grid_for_groups(-(-batch // THREADS), caps)
        wgsl = f"""{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let b = {workgroup_index(grid)} * {THREADS}u + li;
    if (b >= {batch}u) {{ return; }}
{body}
}}
"""
        compute = lambda full: [_UNBOUND, _mask_index(_optional(full, _MASK), batch)]  # noqa: E731
        return single_kernel_plan(_NAME, wgsl, grid, table, compute, inputs, outputs, caps).kernels[0]
