"""MatMulNBits and GatherBlockQuantized: the block-quantized weights that onnxruntime's quantization tools and
onnxruntime-genai's model builder emit (4-bit and 8-bit, one scale and zero point per block along K).

Semantics (onnxruntime's CPU kernels): a code ``q`` of block ``b`` dequantizes to ``(q - zero[b]) * scale[b]`` in
float32 (float16 scales widened); the zero point defaults to ``2^(bits - 1)`` for uint8 codes.  MatMulNBits then
computes ``A @ W^T (+ bias)`` in float32 and rounds once to A's type, as onnxruntime does for float16 too (it widens
A and the scales and narrows the result).  ``accuracy_level`` 4 (what onnxruntime-genai's builder writes for int4
on the CPU) quantizes A first, as onnxruntime's CPU kernels do (:func:`quantize_rows_by_block`: each row's blocks of
``block_size`` along K to int8 on their own absolute maximum), unless the zero points are floats, where onnxruntime
keeps float A; other levels compute in float32.  ortgpu multiplies the dequantized A (each int8 code times its
block's scale, rounded to float32) where onnxruntime sums int8 x int4 products in integers and scales once per block:
the results differ by float rounding (about 1e-7 relative, measured), not by the quantization.

On the device, MatMulNBits never materializes the float weight: up to :data:`GEMV_MAX_ROWS` rows of A run the
GEMV of :mod:`._quantized_weights_wgsl` (one packed word per lane per step), more rows run the tiled GEMM with
loaders that dequantize each tile as it is fetched; a bias rides the GEMM's epilogue.  ``g_idx`` (deprecated: a
block per K index instead of ``k / block_size``) runs on the CPU, as do empty weights (the output is the bias).
GatherBlockQuantized (uint8 data, gathered on axis 0, quantized along the last axis, as onnxruntime requires) runs
as one invocation per output element; constant int4/uint4 data (one code an element, zero points default 0) is
packed into that uint8 form by the planner (:mod:`ortgpu._four_bit`) and runs there too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import FOUR_BIT_DTYPES, element_count
from .._epilogue import EpilogueStep, epilogue_function
from .._gemv import default_gemv_config
from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    Operator,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    reference_twin,
)
from .._registry import register
from .._tiled_gemm import GemmProblem, plan_tiled_gemm
from .._tiling import BindingTable, grid_for_groups, single_kernel_plan, workgroup_index
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    workgroup_size_for,
)
from ..ai_onnx.quantize import EXACT_DIVISION_WGSL
from ._quantized_weights_wgsl import NBitsLayout, gather_block_quantized_wgsl, nbits_gemm_loaders, nbits_gemv_wgsl

__all__ = [
    "MatMulNBits",
    "GatherBlockQuantized",
    "unpack_codes",
    "dequantize_nbits",
    "quantize_rows_by_block",
    "GEMV_MAX_ROWS",
]

#: MatMulNBits runs the GEMV for at most this many rows of A (each row re-reads the packed weight, which a tiled
#: GEMM reads once per tile of rows); not yet tuned on hardware.
GEMV_MAX_ROWS = 4

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The ``bits``-bit codes packed low bits first in the bytes of ``packed``'s last axis, as int32, the first
    ``count`` of each row."""
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)[..., :count].astype(np.int32)


def _power_of_two_block(op_type: str, block_size: int) -> None:
    if block_size < 16 or block_size & (block_size - 1):
        raise UnsupportedOpError(f"{op_type}: block_size must be a power of 2 and at least 16, got {block_size}")


def _nbits_attributes(attrs: Mapping[str, Any]) -> tuple[int, int, int, int]:
    try:
        k, n, block_size = int(attrs["K"]), int(attrs["N"]), int(attrs["block_size"])
    except KeyError as missing:
        raise UnsupportedOpError(f"MatMulNBits: the required attribute {missing} is missing") from None
    bits = int(attrs.get("bits", 4))
    if bits not in (2, 4, 8):
        raise UnsupportedOpError(f"MatMulNBits: bits must be 2, 4 or 8, got {bits}")
    _power_of_two_block("MatMulNBits", block_size)
    if int(attrs.get("weight_prepacked", 0)):
        raise UnsupportedOpError("MatMulNBits: weight_prepacked weights are CUDA layouts; export unpacked weights")
    return k, n, bits, block_size


def _zero_points_kind(zero_points: TensorInfo | np.ndarray | None, element: np.dtype[Any]) -> str:
    if zero_points is None:
        return "none"
    if zero_points.dtype == np.uint8:
        return "packed"
    if zero_points.dtype != element:
        raise UnsupportedOpError(
            f"MatMulNBits: zero points of dtype {zero_points.dtype} (uint8, or the scales' {element} expected)"
        )
    return "float"


def _check_nbits_shapes(
    a: TensorInfo | np.ndarray,
    b: TensorInfo | np.ndarray,
    scales: TensorInfo | np.ndarray,
    zero_points: TensorInfo | np.ndarray | None,
    bias: TensorInfo | np.ndarray | None,
    attrs: Mapping[str, Any],
) -> NBitsLayout:
    """The node's layout after checking every input against the attributes (what onnxruntime checks)."""
    k, n, bits, block_size = _nbits_attributes(attrs)
    if a.dtype not in _FLOATS:
        raise UnsupportedOpError(f"MatMulNBits: A of dtype {a.dtype} (float32 or float16 expected)")
    if len(a.shape) == 0 or a.shape[-1] != k:
        raise ShapeError(f"MatMulNBits: A of shape {tuple(a.shape)} must end in K = {k}")
    if b.dtype != np.uint8:
        raise UnsupportedOpError(f"MatMulNBits: B of dtype {b.dtype} (packed uint8 expected)")
    layout = NBitsLayout(n, k, bits, block_size, "f16" if a.dtype == np.float16 else "f32", "none")
    packed = (n, layout.blocks, block_size * bits // 8)
    if tuple(b.shape) != packed and element_count(b.shape) != 0:
        raise ShapeError(f"MatMulNBits: B of shape {tuple(b.shape)}, expected {packed} (N, blocks, blob bytes)")
    if scales.dtype != a.dtype:
        raise UnsupportedOpError(f"MatMulNBits: scales of dtype {scales.dtype} differ from A's {a.dtype}")
    if element_count(b.shape) and element_count(scales.shape) != n * layout.blocks:
        raise ShapeError(f"MatMulNBits: scales of shape {tuple(scales.shape)}, expected ({n}, {layout.blocks})")
    kind = _zero_points_kind(zero_points, a.dtype)
    if zero_points is not None and element_count(b.shape):
        want = n * (layout.zero_bytes if kind == "packed" else layout.blocks)
        if element_count(zero_points.shape) != want:
            raise ShapeError(f"MatMulNBits: zero points of shape {tuple(zero_points.shape)}, expected {want} values")
    if bias is not None and (tuple(bias.shape) != (n,) or bias.dtype != a.dtype):
        raise ShapeError(f"MatMulNBits: bias of shape {tuple(bias.shape)} ({bias.dtype}), expected ({n},) {a.dtype}")
    return NBitsLayout(n, k, bits, block_size, layout.element, kind)


def dequantize_nbits(
    b: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    g_idx: np.ndarray | None,
    layout: NBitsLayout,
) -> np.ndarray:
    """MatMulNBits' float32 weight ``W [N, K]`` (``Y = A @ W^T``): ``(code - zero) * scale`` of each code's block."""
    n, k, blocks = layout.n, layout.k, layout.blocks
    codes = unpack_codes(b.reshape(n, -1), layout.bits, blocks * layout.block_size)[:, :k]
    if g_idx is None:
        block_of = np.arange(k) // layout.block_size
    else:
        block_of = g_idx.reshape(-1).astype(np.int64)[:k]
        if block_of.size != k or np.any((block_of < 0) | (block_of >= blocks)):
            raise ShapeError(f"MatMulNBits: g_idx must hold K = {k} block indices in [0, {blocks})")
    scale = scales.reshape(n, blocks).astype(np.float32)[:, block_of]
    if zero_points is None:
        offset = codes - (1 << (layout.bits - 1))
        return (offset.astype(np.float32) * scale).astype(np.float32)
    if zero_points.dtype == np.uint8:
        zeros = unpack_codes(zero_points.reshape(n, -1), layout.bits, blocks)[:, block_of]
        return np.asarray((codes - zeros).astype(np.float32) * scale, dtype=np.float32)
    zeros_float = zero_points.reshape(n, blocks).astype(np.float32)[:, block_of]
    return ((codes.astype(np.float32) - zeros_float) * scale).astype(np.float32)


def _a_block(attrs: Mapping[str, Any], layout: NBitsLayout, has_g_idx: bool = False) -> int | None:
    """The block length along K in which onnxruntime's CPU kernel quantizes A, or None where it keeps A in float:
    accuracy_level 4 with integer (or default) zero points and no g_idx; 4- and 8-bit weights in blocks of the
    weight's block size up to 256 (larger weight blocks: 256), 2-bit weights only for blocks of 32 to 128 (measured
    against onnxruntime 1.32's CPU provider on x86-64)."""
    if int(attrs.get("accuracy_level", 0)) != 4 or layout.zero_points == "float" or has_g_idx:
        return None
    if layout.bits == 2:
        return layout.block_size if 32 <= layout.block_size <= 128 else None
    return min(layout.block_size, 256)


def quantize_rows_by_block(a: np.ndarray, block_size: int) -> np.ndarray:
    """A (float32, last axis K) as onnxruntime's CPU MatMulNBits sees it at accuracy_level 4: each row's blocks of
    ``block_size`` along K (the last one may be shorter) become int8 codes ``round_half_even(a * (127 / amax))``
    with ``amax`` the block's largest absolute value, dequantized as ``code * (amax / 127)`` (float32 throughout;
    an all-zero block stays zero)."""
    k = a.shape[-1]
    rows = a.reshape(-1, k).astype(np.float32)
    blocks = -(-k // block_size)
    padded = np.zeros((rows.shape[0], blocks * block_size), np.float32)
    padded[:, :k] = rows
    grouped = padded.reshape(rows.shape[0], blocks, block_size)
    amax = np.abs(grouped).max(axis=2, keepdims=True)
    scale = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    codes = np.rint(grouped * inverse)
    quantized: np.ndarray = (codes * scale).astype(np.float32).reshape(rows.shape[0], blocks * block_size)[:, :k]
    return quantized.reshape(a.shape)


def _optional(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


@register
class MatMulNBits(Operator):
    op_type = "MatMulNBits"
    domain = "com.microsoft"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b, scales = inputs[0], inputs[1], inputs[2]
        assert a is not None and b is not None and scales is not None
        zero_points, g_idx, bias = _optional(inputs, 3), _optional(inputs, 4), _optional(inputs, 5)
        layout = _check_nbits_shapes(a, b, scales, zero_points, bias, attrs)
        out_shape = a.shape[:-1] + (layout.n,)
        if b.size == 0:  # an omitted projection: zeros, or the bias
            y = np.zeros(out_shape, np.float32)
        else:
            weight = dequantize_nbits(b, scales, zero_points, g_idx, layout)
            a_float = a.astype(np.float32)
            a_block = _a_block(attrs, layout, g_idx is not None)
            if a_block is not None:
                a_float = quantize_rows_by_block(a_float, a_block)
            y = np.matmul(a_float, weight.T)
        if bias is not None:
            y = y + bias.astype(np.float32)
        return [np.ascontiguousarray(y.astype(a.dtype))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b, scales = inputs[0], inputs[1], inputs[2]
        assert a is not None and b is not None and scales is not None
        zero_points, g_idx, bias = _optional(inputs, 3), _optional(inputs, 4), _optional(inputs, 5)
        layout = _check_nbits_shapes(a, b, scales, zero_points, bias, attrs)
        if g_idx is not None:
            raise NotOnDevice("MatMulNBits: g_idx (deprecated block reordering) runs on the CPU")
        if b.size == 0:
            raise NotOnDevice("MatMulNBits: an empty (omitted) weight runs on the CPU (the output is the bias)")
        if layout.element == "f16" and not caps.has_f16:
            raise NotOnDevice("MatMulNBits: float16 on the device needs the adapter's shader-f16 feature")
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        steps = [EpilogueStep("add", 5, 1.0, (layout.n,))] if bias is not None else []
        check_binding_sizes(self.op_type, [*inputs, out], caps)
        a_block = _a_block(attrs, layout)
        if a_block is None:
            return self._product_plan(layout, steps, inputs, outputs, attrs, caps)
        # accuracy_level 4: a first kernel writes the quantized A (float32) into a scratch buffer, and the product
        # reads it there in place of input 0 (its twin sees the scratch as a float32 A and multiplies at level 0).
        quantized_a = TensorInfo(tuple(a.shape), np.dtype(np.float32))
        check_binding_sizes(self.op_type, [quantized_a], caps)  # a float16 A's float32 copy is twice its size
        product = self._product_plan(
            dataclasses.replace(layout, a_element="f32"),
            steps,
            [quantized_a, *inputs[1:]],
            outputs,
            {**attrs, "accuracy_level": 0},
            caps,
        )
        scratch = Binding("scratch", len(product.scratch_sizes))
        kernels = tuple(
            dataclasses.replace(
                kernel, bindings=tuple(scratch if b == Binding("input", 0) else b for b in kernel.bindings)
            )
            for kernel in product.kernels
        )
        first = _quantize_a_kernel(a, layout, a_block, scratch, caps)
        return OpPlan(kernels=(first, *kernels), scratch_sizes=(*product.scratch_sizes, quantized_a.nbytes))

    def _product_plan(
        self,
        layout: NBitsLayout,
        steps: list[EpilogueStep],
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
    ) -> OpPlan:
        """The product's kernels: the GEMV for few rows of A, else the tiled GEMM over dequantizing loaders."""
        a, out = inputs[0], outputs[0]
        assert a is not None
        operator, attributes = MatMulNBits(self.opset), dict(attrs)

        def compute(full: list[np.ndarray | None]) -> list[np.ndarray]:
            # float16 widened (exactly): A may be the float32 quantized A beside float16 scales and bias
            widened = [x.astype(np.float32) if x is not None and x.dtype == np.float16 else x for x in full]
            return [operator.reference(widened, attributes, outputs)[0].astype(out.dtype)]

        rows = element_count(a.shape[:-1])
        if rows <= GEMV_MAX_ROWS:
            return _gemv_plan(layout, rows, steps, out.shape, compute, inputs, outputs, caps)
        load_a, load_b, load_a4k, load_b4k, prelude = nbits_gemm_loaders(layout)

        def operands(full: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
            a_value, b_value, s_value = full[0], full[1], full[2]
            assert a_value is not None and b_value is not None and s_value is not None
            weight = dequantize_nbits(b_value, s_value, _optional(full, 3), None, layout)
            return a_value.astype(np.float32).reshape(1, rows, layout.k), weight.T.reshape(1, layout.k, layout.n)

        problem = GemmProblem(
            batch=1,
            m=rows,
            n=layout.n,
            k=layout.k,
            load_a=load_a,
            load_b=load_b,
            load_a4k=load_a4k,
            load_b4k=load_b4k,
            prelude=prelude,
            operands=operands,
        )
        return plan_tiled_gemm(
            self.op_type,
            problem,
            steps=steps,
            out_shape=out.shape,
            compute=compute,
            inputs=inputs,
            outputs=outputs,
            caps=caps,
        )


def _quantize_a_kernel(
    a: TensorInfo, layout: NBitsLayout, block: int, scratch: Binding, caps: DeviceCaps
) -> KernelSpec:
    """One invocation per (row, block) of A: the block's absolute maximum, then each element's int8 code times
    the block's scale into ``scratch`` (float32), the quotients exact as onnxruntime's float32 division is."""
    k = layout.k
    blocks = -(-k // block)
    rows = element_count(a.shape[:-1])
    count = rows * blocks
    table = BindingTable()
    source = table.add(Binding("input", 0), layout.element)
    target = table.add(scratch, "f32", writable=True)
    workgroup = workgroup_size_for(caps.limits)
    body = f"""  let w = {LINEAR_INVOCATION};
  if (w >= {count}u) {{ return; }}
  let row = w / {blocks}u;
  let first = row * {k}u + (w % {blocks}u) * {block}u;
  let last = min(first + {block}u, (row + 1u) * {k}u);
  var amax = 0.0;
  for (var i = first; i < last; i = i + 1u) {{ amax = max(amax, abs(f32({source}[i]))); }}
  let limit = bitcast<u32>(127.0);
  let scale = bitcast<f32>(div_bits(bitcast<u32>(amax), limit));
  let inverse = select(0.0, bitcast<f32>(div_bits(limit, bitcast<u32>(amax))), amax != 0.0);
  for (var i = first; i < last; i = i + 1u) {{ {target}[i] = round(f32({source}[i]) * inverse) * scale; }}
"""
    wgsl = table.enables() + table.declarations() + EXACT_DIVISION_WGSL + kernel_entry(workgroup, body)
    bindings = tuple(table.bindings)
    source_slot = next(slot for slot, b in enumerate(bindings) if b == Binding("input", 0))
    target_slot = next(slot for slot, b in enumerate(bindings) if b == scratch)

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        values = arrays[source_slot][: a.nbytes].view(a.dtype).reshape(a.shape)
        raw = quantize_rows_by_block(values.astype(np.float32), block).reshape(-1).view(np.uint8)
        arrays[target_slot][: raw.size] = raw

    return KernelSpec("MatMulNBits", wgsl, grid_for(count, workgroup, caps.limits), bindings, twin)


def _gemv_plan(
    layout: NBitsLayout,
    rows: int,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Any,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
) -> OpPlan:
    """The GEMV plan: one workgroup per (row of A, ``outputs`` columns), shaped as the ordinary ``"nk"`` GEMV."""
    config = default_gemv_config("nk", caps)
    outputs_per_group, lanes = config.threads_x, config.threads_k
    check_loop_budget("MatMulNBits", -(-layout.words_per_row // lanes) + lanes.bit_length(), caps)
    element = layout.element
    table = BindingTable()
    names = {
        "a": table.add(Binding("input", 0), f"vec4<{layout.a_type}>" if layout.k % 4 == 0 else layout.a_type),
        "b": table.add(Binding("input", 1), "u32"),
        "scales": table.add(Binding("input", 2), element),
    }
    if layout.zero_points != "none":
        names["zeros"] = table.add(Binding("input", 3), "u32" if layout.zero_points == "packed" else element)
    names["out"] = table.add(Binding("output", 0), element, writable=True)
    epilogue = epilogue_function(steps, out_shape, table, element)
    grid = grid_for_groups(-(-layout.n // outputs_per_group) * rows, caps)
    wgsl = nbits_gemv_wgsl(
        layout,
        rows=rows,
        outputs=outputs_per_group,
        lanes=lanes,
        names=names,
        declarations=table.enables() + table.declarations(),
        epilogue=epilogue,
        grid=grid,
        group_index=workgroup_index(grid),
    )
    return single_kernel_plan("MatMulNBits", wgsl, grid, table, compute, inputs, outputs, caps)


# -- GatherBlockQuantized ------------------------------------------------------------------------------------------


def _gather_attributes(data: TensorInfo | np.ndarray, attrs: Mapping[str, Any]) -> tuple[int, int]:
    """(bits, block_size) after checking what onnxruntime requires of uint8 data."""
    if data.dtype != np.uint8:
        raise UnsupportedOpError(f"GatherBlockQuantized: data of dtype {data.dtype} (uint8, int4 or uint4 expected)")
    rank = len(data.shape)
    if rank < 2:
        raise ShapeError("GatherBlockQuantized: uint8 data must have rank >= 2 (gathered on 0, quantized on the last)")
    bits, block_size = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
    if bits not in (2, 4, 8):
        raise UnsupportedOpError(f"GatherBlockQuantized: bits must be 2, 4 or 8 for uint8 data, got {bits}")
    _power_of_two_block("GatherBlockQuantized", block_size)
    gather_axis, quantize_axis = int(attrs.get("gather_axis", 0)), int(attrs.get("quantize_axis", 1))
    if gather_axis % rank != 0 or not -rank <= gather_axis < rank:
        raise UnsupportedOpError(f"GatherBlockQuantized: uint8 data is gathered on axis 0, not {gather_axis}")
    if quantize_axis % rank != rank - 1 or not -rank <= quantize_axis < rank:
        raise UnsupportedOpError(
            f"GatherBlockQuantized: uint8 data is quantized along its last axis ({rank - 1}), not {quantize_axis}"
        )
    return bits, block_size


def _check_gather_parameters(
    data: TensorInfo | np.ndarray,
    scales: TensorInfo | np.ndarray,
    zero_points: TensorInfo | np.ndarray | None,
    bits: int,
    block_size: int,
) -> None:
    if scales.dtype not in _FLOATS:
        raise UnsupportedOpError(f"GatherBlockQuantized: scales of dtype {scales.dtype} (float32 or float16)")
    last = data.shape[-1] * (8 // bits)
    blocks = -(-last // block_size)
    want = tuple(data.shape[:-1]) + (blocks,)
    if tuple(scales.shape) != want:
        raise ShapeError(f"GatherBlockQuantized: scales of shape {tuple(scales.shape)}, expected {want}")
    if zero_points is not None:
        zero_shape = want[:-1] + (-(-blocks // (8 // bits)),)
        if zero_points.dtype != np.uint8 or tuple(zero_points.shape) != zero_shape:
            raise ShapeError(
                f"GatherBlockQuantized: zero points {tuple(zero_points.shape)} {zero_points.dtype}, expected "
                f"{zero_shape} uint8"
            )


def _four_bit_codes(
    data: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, attrs: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray, int]:
    """(codes, zero points, block_size) of int4/uint4 data (one code an element; the zero points default to 0),
    after the checks of :func:`_gather_attributes` that apply to it.  The planner packs constant 4-bit data into
    the uint8 form (:mod:`ortgpu._four_bit`), so this path runs only where that form cannot hold it."""
    rank = data.ndim
    if rank < 2:
        raise ShapeError("GatherBlockQuantized: 4-bit data must have rank >= 2 (gathered on 0, quantized on the last)")
    block_size = int(attrs.get("block_size", 128))
    _power_of_two_block("GatherBlockQuantized", block_size)
    gather_axis, quantize_axis = int(attrs.get("gather_axis", 0)), int(attrs.get("quantize_axis", 1))
    if not -rank <= gather_axis < rank or gather_axis % rank != 0:
        raise UnsupportedOpError(f"GatherBlockQuantized: ortgpu gathers 4-bit data on axis 0, not {gather_axis}")
    if not -rank <= quantize_axis < rank or quantize_axis % rank != rank - 1:
        raise UnsupportedOpError(
            f"GatherBlockQuantized: ortgpu reads 4-bit data quantized along its last axis ({rank - 1}), not "
            f"{quantize_axis}"
        )
    if scales.dtype not in _FLOATS:
        raise UnsupportedOpError(f"GatherBlockQuantized: scales of dtype {scales.dtype} (float32 or float16)")
    want = tuple(data.shape[:-1]) + (-(-data.shape[-1] // block_size),)
    if tuple(scales.shape) != want:
        raise ShapeError(f"GatherBlockQuantized: scales of shape {tuple(scales.shape)}, expected {want}")
    if zero_points is None:
        return data.astype(np.int32), np.zeros(want, np.int32), block_size
    if zero_points.dtype != data.dtype or tuple(zero_points.shape) != want:
        raise ShapeError(
            f"GatherBlockQuantized: zero points {tuple(zero_points.shape)} {zero_points.dtype}, expected {want} "
            f"{data.dtype} (the data's type)"
        )
    return data.astype(np.int32), zero_points.astype(np.int32), block_size


@register
class GatherBlockQuantized(Operator):
    op_type = "GatherBlockQuantized"
    domain = "com.microsoft"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices, scales = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and scales is not None
        zero_points = _optional(inputs, 3)
        if indices.dtype not in (np.int32, np.int64):
            raise UnsupportedOpError(f"GatherBlockQuantized: indices of dtype {indices.dtype} (int32 or int64)")
        if data.dtype in FOUR_BIT_DTYPES:
            codes, zeros, block_size = _four_bit_codes(data, scales, zero_points, attrs)
            last = data.shape[-1]
        else:
            bits, block_size = _gather_attributes(data, attrs)
            _check_gather_parameters(data, scales, zero_points, bits, block_size)
            last = data.shape[-1] * (8 // bits)
            codes = unpack_codes(data, bits, last)
            blocks = scales.shape[-1]
            if zero_points is None:
                zeros = np.full(scales.shape, 1 << (bits - 1), np.int32)
            else:
                zeros = unpack_codes(zero_points, bits, blocks)
        block_of = np.arange(last) // block_size
        values = (codes - zeros[..., block_of]).astype(np.float32) * scales.astype(np.float32)[..., block_of]
        rows = data.shape[0]
        flat = indices.astype(np.int64).reshape(-1)
        valid = (flat >= -rows) & (flat < rows)  # onnxruntime: an index out of range gathers zeros
        picked = values[np.where(valid, flat % max(rows, 1), 0)] if rows else np.zeros((flat.size,) + values.shape[1:])
        picked = np.where(valid.reshape((-1,) + (1,) * (values.ndim - 1)), picked, 0.0)
        out = picked.reshape(indices.shape + values.shape[1:]).astype(scales.dtype)
        return [np.ascontiguousarray(out)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        data, indices, scales = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and scales is not None
        zero_points = _optional(inputs, 3)
        if data.dtype in FOUR_BIT_DTYPES:
            raise NotOnDevice(
                "GatherBlockQuantized: 4-bit data the planner could not pack into the uint8 form (not a constant, "
                "or an odd last axis) runs on the CPU"
            )
        bits, block_size = _gather_attributes(data, attrs)
        _check_gather_parameters(data, scales, zero_points, bits, block_size)
        out = outputs[0]
        if indices.dtype.name not in ("int32", "int64"):
            raise NotOnDevice(f"GatherBlockQuantized: indices of dtype {indices.dtype.name} run on the CPU")
        if out.dtype == np.float16:
            # WGSL leaves the float16 conversion of values beyond its range indeterminate: the device writes float16
            # only where constant scales bound every product (|code - zero| < 2^bits) inside it.
            bound = float(np.abs(constants[2].astype(np.float64)).max()) * (1 << bits) if 2 in constants else np.inf
            if not bound <= 65504.0:
                raise NotOnDevice("GatherBlockQuantized: float16 outputs that could overflow run on the CPU")
        if out.size == 0 or data.shape[0] == 0:
            raise NotOnDevice("GatherBlockQuantized: empty tensors run on the CPU")
        last = data.shape[-1] * (8 // bits)
        row_length = element_count(data.shape[1:]) * (8 // bits)
        parts = [
            storage_declaration(0, "data", writable=False),
            storage_declaration(1, "indices", writable=False),
            storage_declaration(2, "scales", writable=False),
            load_function("scale", "scales", scales.dtype),
        ]
        bindings = [Binding("input", 0), Binding("input", 1), Binding("input", 2)]
        if zero_points is not None:
            parts.append(storage_declaration(3, "zeros", writable=False))
            bindings.append(Binding("input", 3))
        parts.append(storage_declaration(len(bindings), "dst", writable=True))
        bindings.append(Binding("output", 0))
        parts.append(
            gather_block_quantized_wgsl(
                rows=data.shape[0],
                row_length=row_length,
                last=last,
                bits=bits,
                block_size=block_size,
                zero_points=zero_points is not None,
                index_dtype=indices.dtype.name,
            )
        )
        check_binding_sizes(self.op_type, [*inputs, out], caps)
        per = elements_per_invocation(out.dtype.itemsize)
        invocations = -(-out.size // per)
        workgroup = workgroup_size_for(caps.limits)
        guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
        operator, attributes = GatherBlockQuantized(self.opset), dict(attrs)

        def function(*arrays: np.ndarray) -> list[np.ndarray]:
            full: list[np.ndarray | None] = list(arrays) + [None] * (4 - len(arrays))
            return operator.reference(full, attributes, outputs)

        kernel = KernelSpec(
            name=self.op_type,
            wgsl="".join(parts) + kernel_entry(workgroup, guard + store_statements(out.dtype, out.size, "value")),
            grid=grid_for(invocations, workgroup, caps.limits),
            bindings=tuple(bindings),
            twin=reference_twin(function, bindings, inputs, outputs),
        )
        return OpPlan(kernels=(kernel,))
