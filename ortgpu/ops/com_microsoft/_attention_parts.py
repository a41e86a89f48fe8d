"""The parts the contributed attention operators' device plans are assembled from.

onnxruntime's ``Attention``, ``MultiHeadAttention`` and ``GroupQueryAttention`` all end in the same computation as
the standard ``Attention`` operator (:mod:`ortgpu.ops.ai_onnx.attention`): ``softmax(scale * Q.K^T + bias) . V``
over ``[B, S, heads * head]`` queries, grouped key/value heads allowed.  What differs is how Q, K and V arrive
(a packed projection, a bias to add, a cache in front, packed heads) and how the bias is spelled (key lengths, 0/1
masks, a causal frontier, an additive attention bias).  So each contributed plan is a few small kernels that bring
its operands into that shape, followed by the standard operator's own plan, rebound onto them:

* :class:`PlanBuilder` collects kernels and scratch buffers, and adds another operator's :class:`OpPlan` (the
  MatMul of a projection, the standard Attention) with its inputs and outputs rebound to the node's inputs,
  outputs or scratch buffers.  Each kernel's twin keeps working: a twin sees its bound arrays by slot, and
  rebinding changes which buffer fills a slot, never the slots.
* :func:`copy_kernel` copies a 4-D strided window of one buffer into another, adding a bias on the way (the
  split of a packed projection, a head transpose, a cache concatenation).
* :func:`additive_mask` and :func:`mask_kernel` turn onnxruntime's ``mask_index`` / ``key_padding_mask`` forms,
  its causal frontier and its ``attention_bias`` into one float32 ``[B, heads or 1, S, T]`` additive bias, with
  masked keys at ``mask_filter_value`` (as onnxruntime adds it, not ``-inf``: a row whose keys are all masked
  is still a softmax over them) and keys past the causal frontier at ``-inf`` (dropped, as onnxruntime does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._flash_attention import read_f32, stored
from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, OpPlan, TensorInfo
from .._tiling import THREADS, BindingTable, float_element, grid_for_groups, wgsl_f32, workgroup_index
from ..ai_onnx.attention import Attention as StandardAttention

__all__ = [
    "PlanBuilder",
    "Strided",
    "copy_kernel",
    "gathered",
    "present_copy",
    "head_major",
    "token_major",
    "additive_mask",
    "mask_kernel",
    "standard_attention",
    "attention_plan",
    "device_float",
]

F32 = np.dtype(np.float32)


def device_float(op_type: str, infos: Sequence[TensorInfo | None], caps: DeviceCaps) -> np.dtype[Any]:
    """The one float type (float32, or float16 with ``shader-f16``) of the node's float tensors; ``NotOnDevice``
    for anything else (the reference runs such nodes on the CPU)."""
    dtypes = {info.dtype for info in infos if info is not None}
    if len(dtypes) != 1 or not dtypes <= {np.dtype(np.float32), np.dtype(np.float16)}:
        raise NotOnDevice(f"{op_type}: the WebGPU kernels take float32 or float16 tensors of one type, not {dtypes}")
    dtype = dtypes.pop()
    if dtype == np.float16 and not caps.has_f16:
        raise NotOnDevice(f"{op_type}: float16 on the device needs the adapter's shader-f16 feature")
    return dtype


class PlanBuilder:
    """The kernels and scratch buffers of one node's plan, gathered part by part."""

    def __init__(self, op_type: str) -> None:
        self.op_type = op_type
        self.kernels: list[KernelSpec] = []
        self.scratch_sizes: list[int] = []

    def scratch(self, info: TensorInfo) -> Binding:
        """A new scratch buffer holding ``info``'s tensor."""
        self.scratch_sizes.append(max(4, info.nbytes))
        return Binding("scratch", len(self.scratch_sizes) - 1)

    def include(self, plan: OpPlan, inputs: Sequence[Binding | None], outputs: Sequence[Binding]) -> None:
        """Add ``plan``'s kernels with its input ``i`` bound to ``inputs[i]``, its output ``i`` to ``outputs[i]``
        and its scratch buffers after this plan's."""
        if plan.alias:
            raise NotOnDevice(f"{self.op_type}: a part of its plan aliases a buffer, which a composed plan cannot")
        base = len(self.scratch_sizes)
        self.scratch_sizes.extend(plan.scratch_sizes)

        def moved(binding: Binding) -> Binding:
            if binding.kind == "input":
                target = inputs[binding.index]
                assert target is not None, "a part reads an input the node does not bind"
                return target
            if binding.kind == "output":
                return outputs[binding.index]
            if binding.kind == "scratch":
                return Binding("scratch", base + binding.index)
            return binding

        for kernel in plan.kernels:
            bindings = tuple(moved(binding) for binding in kernel.bindings)
            self.kernels.append(
                dataclasses.replace(kernel, name=self.op_type, bindings=bindings, elementwise=None, gather=None)
            )

    def add(self, kernel: KernelSpec) -> None:
        """Append a kernel written for this plan's bindings."""
        self.kernels.append(kernel)

    def build(self) -> OpPlan:
        """The plan: the kernels in the order they were added, and every scratch buffer."""
        return OpPlan(kernels=tuple(self.kernels), scratch_sizes=tuple(self.scratch_sizes))


@dataclass(frozen=True)
class Strided:
    """A 4-D window of a bound buffer of ``dtype``: element ``(a, b, c, d)`` at ``offset + a * strides[0] + ...``."""

    binding: Binding
    dtype: np.dtype[Any]
    offset: int
    strides: tuple[int, int, int, int]

    def where(self, names: Sequence[str]) -> str:
        """WGSL of the element index for the index variables ``names``."""
        terms = [f"{name} * {stride}u" for name, stride in zip(names, self.strides) if stride]
        return " + ".join([f"{self.offset}u", *terms])

    def flat(self, shape: tuple[int, int, int, int]) -> np.ndarray:
        """The element index of every point of ``shape``, in C order."""
        grid = np.indices(shape, dtype=np.int64).reshape(4, -1)
        return np.asarray(self.offset + (grid * np.array(self.strides, dtype=np.int64)[:, None]).sum(axis=0))


def copy_kernel(
    op_type: str,
    shape: tuple[int, int, int, int],
    source: Strided,
    target: Strided,
    caps: DeviceCaps,
    bias: Strided | None = None,
) -> KernelSpec:
    """``target[p] = source[p] (+ bias[p])`` for every point ``p`` of ``shape``, summed in f32 and stored once."""
    count = int(np.prod(shape))
    table = BindingTable()
    names = ("a", "b", "c", "d")
    source_name = table.add(source.binding, float_element(TensorInfo((), source.dtype)))
    value = read_f32(source_name, source.where(names), float_element(TensorInfo((), source.dtype)))
    if bias is not None:
        element = float_element(TensorInfo((), bias.dtype))
        value = f"{value} + {read_f32(table.add(bias.binding, element), bias.where(names), element)}"
    target_element = float_element(TensorInfo((), target.dtype))
    target_name = table.add(target.binding, target_element, writable=True)
    grid = grid_for_groups(-(-count // THREADS), caps)
    d0, d1, d2, d3 = shape
    wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    let d = n % {d3}u;
    let c = (n / {d3}u) % {d2}u;
    let b = (n / {d3 * d2}u) % {d1}u;
    let a = n / {d3 * d2 * d1}u;
    {target_name}[{target.where(names)}] = {stored(value, target_element)};
}}
"""
    views = [source] + ([bias] if bias is not None else []) + [target]

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        total = arrays[0].view(source.dtype)[source.flat(shape)].astype(np.float32)
        if bias is not None:
            total = total + arrays[1].view(bias.dtype)[bias.flat(shape)].astype(np.float32)
        arrays[len(views) - 1].view(target.dtype)[target.flat(shape)] = total.astype(target.dtype)

    return KernelSpec(op_type, wgsl, grid, tuple(table.bindings), twin)


def head_major(binding: Binding, dtype: np.dtype[Any], offset: int, heads: int, length: int, size: int) -> Strided:
    """A ``[B, heads, length, size]`` tensor (at ``offset``) read at points ``(b, position, head, feature)``."""
    return Strided(binding, dtype, offset, (heads * length * size, size, length * size, 1))


def token_major(binding: Binding, dtype: np.dtype[Any], offset: int, length: int, row: int, size: int) -> Strided:
    """A ``[B, length, row]`` tensor whose heads of ``size`` features start at ``offset`` of each row, read at points
    ``(b, position, head, feature)``."""
    return Strided(binding, dtype, offset, (length * row, row, size, 1))


def gathered(
    builder: PlanBuilder,
    dtype: np.dtype[Any],
    shape: tuple[int, int, int, int],
    source: Strided,
    caps: DeviceCaps,
    bias: Strided | None = None,
    past: Strided | None = None,
    past_length: int = 0,
) -> tuple[Binding, TensorInfo]:
    """An operand ``[B, past_length + L, heads * size]`` of the standard Attention, from ``source`` read at points
    ``shape`` = ``(B, L, heads, size)`` plus ``bias``, after ``past`` (points ``(B, past_length, heads, size)``):
    ``source`` itself where it already is one (no bias, no past, contiguous), else a scratch buffer the copy
    kernels fill."""
    batch, length, heads, size = shape
    hidden, total = heads * size, past_length + length
    info = TensorInfo((batch, total, hidden), dtype)
    if bias is None and not past_length and source.offset == 0 and source.dtype == dtype:
        if source.strides == (length * hidden, hidden, size, 1):
            return source.binding, info
    at = builder.scratch(info)
    target = token_major(at, dtype, past_length * hidden, total, hidden, size)
    builder.add(copy_kernel(builder.op_type, shape, source, target, caps, bias))
    if past is not None and past_length:
        front = token_major(at, dtype, 0, total, hidden, size)
        builder.add(copy_kernel(builder.op_type, (batch, past_length, heads, size), past, front, caps))
    return at, info


def present_copy(
    builder: PlanBuilder,
    operand: tuple[Binding, TensorInfo],
    heads: int,
    target: Binding,
    offset: int,
    caps: DeviceCaps,
) -> None:
    """Copy a ``[B, T, heads * size]`` operand into ``target`` as ``[B, heads, T, size]`` from ``offset``."""
    binding, info = operand
    batch, total, hidden = info.shape
    size = hidden // heads
    source = token_major(binding, info.dtype, 0, total, hidden, size)
    destination = head_major(target, info.dtype, offset, heads, total, size)
    builder.add(copy_kernel(builder.op_type, (batch, total, heads, size), source, destination, caps))


def additive_mask(
    op_type: str,
    mask: np.ndarray | None,
    attention_bias: np.ndarray | None,
    causal: bool,
    past: int,
    filter_value: float,
    shape: tuple[int, int, int, int],
) -> np.ndarray:
    """The float32 bias ``shape`` = ``[B, heads or 1, S, T]`` added to the scaled scores, as onnxruntime's CPU
    kernels build it: masked keys at ``filter_value`` (a 1-D mask gives key end positions ``[B]``, or end then
    start positions ``[2B]``; a 2-D ``[B, T]`` or 3-D ``[B, S, T]`` mask is 1 to keep, 0 to mask), keys past the
    causal frontier (``key > past + query``) dropped (``-inf``: a row whose every visible key is masked is a softmax
    over those, never over the future; the frontier spares the last query row, whose loop onnxruntime stops
    before, which matters only where there are more keys than past + queries), and ``attention_bias`` ``[B or 1, N or 1, S,
    T]`` added."""
    batch, _, sq, total = shape
    f = np.float32(filter_value)
    m = np.zeros((batch, sq, total), np.float32)
    keys = np.arange(total)
    if mask is not None:
        check_mask(op_type, tuple(mask.shape), batch, sq, total)
        values = mask.astype(np.int64)
        if mask.ndim == 1:
            m[np.broadcast_to(keys[None, None, :] >= values[:batch, None, None], m.shape)] = f
            if mask.shape[0] == 2 * batch:
                starts = np.minimum(values[batch:], total)
                m[np.broadcast_to(keys[None, None, :] < starts[:, None, None], m.shape)] = f
        elif mask.ndim == 2:
            m = np.broadcast_to(np.where(values[:, None, :] > 0, np.float32(0), f), m.shape).copy()
        else:
            m = np.where(values > 0, np.float32(0), f).astype(np.float32)
    if causal:
        rows = np.arange(sq)[:, None]
        frontier = (keys[None, :] > past + rows) & (rows < sq - 1)
        m = np.where(frontier[None], -np.inf, m).astype(np.float32)
    result = m[:, None]
    if attention_bias is not None:
        result = (attention_bias.astype(np.float32) + result).astype(np.float32)
    return np.ascontiguousarray(np.broadcast_to(result, shape), dtype=np.float32)


def check_mask(op_type: str, shape: tuple[int, ...], batch: int, sq: int, total: int) -> None:
    """A clear error for a mask form onnxruntime's CPU kernels do not take (or whose shape does not fit)."""
    accepted = {(batch,), (2 * batch,), (batch, total), (batch, sq, total)}
    if len(shape) == 4:
        raise UnsupportedOpError(
            f"{op_type}: a 4-D mask {shape} (Megatron's [B, 1, max, max]) is not supported, as on onnxruntime's CPU; "
            "pass a 2-D [B, T] 0/1 mask or an attention_bias instead"
        )
    if shape not in accepted:
        raise ShapeError(
            f"{op_type}: mask of shape {shape} fits none of [B], [2B], [B, T], [B, S, T] with B={batch}, S={sq}, "
            f"T={total}"
        )


def mask_kernel(
    op_type: str,
    mask: tuple[Binding, TensorInfo] | None,
    attention_bias: tuple[Binding, TensorInfo] | None,
    causal: bool,
    past: int,
    filter_value: float,
    shape: tuple[int, int, int, int],
    target: Binding,
    caps: DeviceCaps,
) -> KernelSpec:
    """:func:`additive_mask` as a kernel writing ``target`` (float32 ``shape``), one element per invocation."""
    batch, heads, sq, total = shape
    count = int(np.prod(shape))
    table = BindingTable()
    f = wgsl_f32(filter_value)
    lines = ["var m = 0.0;"]
    if mask is not None:
        check_mask(op_type, tuple(mask[1].shape), batch, sq, total)
        if mask[1].dtype != np.int32:
            raise NotOnDevice(f"{op_type}: the mask kernel reads an int32 mask, not {mask[1].dtype}")
        name = table.add(mask[0], "i32")
        rank, length = len(mask[1].shape), int(mask[1].shape[0])
        if rank == 1:
            lines.append(f"if (i32(j) >= {name}[b]) {{ m = {f}; }}")
            if length == 2 * batch:
                lines.append(f"if (i32(j) < min({name}[b + {batch}u], {total})) {{ m = {f}; }}")
        elif rank == 2:
            lines.append(f"if ({name}[b * {total}u + j] <= 0) {{ m = {f}; }}")
        else:
            lines.append(f"if ({name}[(b * {sq}u + i) * {total}u + j] <= 0) {{ m = {f}; }}")
    if causal:
        lines.append(f"if (j > {past}u + i && i < {sq - 1}u) {{ var bits = 0xff800000u; m = bitcast<f32>(bits); }}")
    if attention_bias is not None:
        info = attention_bias[1]
        element = float_element(info)
        name = table.add(attention_bias[0], element)
        b_stride = int(info.shape[1]) * sq * total if int(info.shape[0]) != 1 else 0
        h_stride = sq * total if int(info.shape[1]) != 1 else 0
        lines.append(f"m = {read_f32(name, f'b * {b_stride}u + h * {h_stride}u + i * {total}u + j', element)} + m;")
    out = table.add(target, "f32", writable=True)
    grid = grid_for_groups(-(-count // THREADS), caps)
    body = "\n    ".join(lines)
    wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    let j = n % {total}u;
    let i = (n / {total}u) % {sq}u;
    let h = (n / {total * sq}u) % {heads}u;
    let b = n / {total * sq * heads}u;
    _ = h;
    {body}
    {out}[n] = m;
}}
"""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        slot = 0
        values: list[np.ndarray | None] = []
        for part in (mask, attention_bias):
            if part is None:
                values.append(None)
                continue
            info = part[1]
            values.append(arrays[slot][: info.nbytes].view(info.dtype).reshape(info.shape))
            slot += 1
        result = additive_mask(op_type, values[0], values[1], causal, past, filter_value, shape)
        arrays[slot][: result.nbytes] = result.reshape(-1).view(np.uint8)

    return KernelSpec(op_type, wgsl, grid, tuple(table.bindings), twin)


def _standard_attrs(heads: int, kv_heads: int, scale: float, softcap: float = 0.0) -> dict[str, Any]:
    attrs: dict[str, Any] = {"q_num_heads": heads, "kv_num_heads": kv_heads, "scale": scale}
    if softcap > 0:
        attrs["softcap"] = softcap
    return attrs


def standard_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    bias: np.ndarray | None,
    heads: int,
    kv_heads: int,
    scale: float,
    softcap: float = 0.0,
) -> np.ndarray:
    """The standard Attention's reference over 3-D ``[B, S, heads * head]`` Q and ``[B, T, kv_heads * head]`` K/V,
    with an additive (or boolean) bias broadcasting to ``[B, heads, S, T]``."""
    out = TensorInfo((q.shape[0], q.shape[1], heads * (v.shape[2] // kv_heads)), q.dtype)
    inputs: list[np.ndarray | None] = [q, k, v, bias]
    return StandardAttention(23).reference(inputs, _standard_attrs(heads, kv_heads, scale, softcap), [out])[0]


def attention_plan(
    builder: PlanBuilder,
    operands: Sequence[tuple[Binding, TensorInfo]],
    bias: tuple[Binding, TensorInfo] | None,
    output: Binding,
    heads: int,
    kv_heads: int,
    scale: float,
    caps: DeviceCaps,
    softcap: float = 0.0,
) -> None:
    """Add the standard Attention's plan over the 3-D Q, K, V ``operands`` (bindings and infos) and ``bias`` (an
    additive float or boolean mask, or None), writing ``output`` ``[B, S, heads * value head]``."""
    (qb, q), (kb, k), (vb, v) = operands
    out = TensorInfo((q.shape[0], q.shape[1], heads * (v.shape[2] // kv_heads)), q.dtype)
    infos: list[TensorInfo | None] = [q, k, v, None if bias is None else bias[1]]
    plan = StandardAttention(23).plan(infos, [out], _standard_attrs(heads, kv_heads, scale, softcap), caps, {})
    builder.include(plan, [qb, kb, vb, None if bias is None else bias[0]], [output])
