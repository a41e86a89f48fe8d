"""RotaryEmbedding-23: rotate pairs of each head's first ``rotary_embedding_dim`` (default: all) features by
position-dependent angles (RoPE).

X is ``[B, H, S, D]`` or ``[B, S, H * D]`` (with ``num_heads``).  The caches are ``[max_position, rot / 2]``
indexed by ``position_ids [B, S]``, or ``[B, S, rot / 2]`` without ``position_ids``.  Pairs are the two halves
of the rotated features (``x[j]``, ``x[j + rot / 2]``), or neighbours with ``interleaved`` (``x[2j]``,
``x[2j + 1]``): ``(x1, x2) -> (cos * x1 - sin * x2, sin * x1 + cos * x2)``.

The device kernel computes one output element per invocation, in float32 (float16 tensors read and written as
``f16`` where the device has ``shader-f16``).  A position id outside the cache
(which the reference refuses) gives NaN there and flags the run in the program's status words, so the run raises
``InvalidArgumentError`` as the reference does.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._tiling import THREADS, BindingTable, grid_for_groups, single_kernel_plan, workgroup_index

__all__ = ["RotaryEmbedding"]


def _geometry(
    x_shape: Sequence[int], cache_shape: Sequence[int], has_positions: bool, attrs: Mapping[str, Any]
) -> tuple[int, int, int, int, int]:
    """(batch, sequence, heads, head size, rotary dim) after checking the shapes."""
    if len(x_shape) == 4:
        batch, heads, sequence, head = (int(d) for d in x_shape)
    elif len(x_shape) == 3:
        heads = int(attrs.get("num_heads", 0))
        batch, sequence, hidden = (int(d) for d in x_shape)
        if heads <= 0 or hidden % heads:
            raise ShapeError(
                f"RotaryEmbedding: 3-D input of shape {tuple(x_shape)} needs num_heads dividing {hidden}, got {heads}"
            )
        head = hidden // heads
    else:
        raise ShapeError(f"RotaryEmbedding: input must be 3-D or 4-D, got shape {tuple(x_shape)}")
    rotary = int(attrs.get("rotary_embedding_dim", 0)) or head
    if rotary > head or rotary % 2:
        raise ShapeError(f"RotaryEmbedding: rotary_embedding_dim {rotary} must be even and at most {head}")
    want_rank = 2 if has_positions else 3
    if len(cache_shape) != want_rank or int(cache_shape[-1]) != rotary // 2:
        raise ShapeError(
            f"RotaryEmbedding: caches must be {want_rank}-D with last dimension {rotary // 2}, got {tuple(cache_shape)}"
        )
    if not has_positions and tuple(int(d) for d in cache_shape[:2]) != (batch, sequence):
        raise ShapeError(
            f"RotaryEmbedding: without position_ids the caches must be [{batch}, {sequence}, {rotary // 2}], "
            f"got {tuple(cache_shape)}"
        )
    return batch, sequence, heads, head, rotary


@register
class RotaryEmbedding(Operator):
    """RotaryEmbedding-23."""

    op_type = "RotaryEmbedding"
    since_version = 23

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, cos, sin = inputs[0], inputs[1], inputs[2]
        assert x is not None and cos is not None and sin is not None
        positions = inputs[3] if len(inputs) > 3 else None
        if cos.shape != sin.shape:
            raise ShapeError(f"RotaryEmbedding: cos_cache {cos.shape} and sin_cache {sin.shape} differ")
        batch, sequence, heads, head, rotary = _geometry(x.shape, cos.shape, positions is not None, attrs)
        if positions is not None:
            if positions.shape != (batch, sequence):
                raise ShapeError(f"RotaryEmbedding: position_ids must be [{batch}, {sequence}], got {positions.shape}")
            if positions.size and (positions.min() < 0 or positions.max() >= cos.shape[0]):
                raise InvalidArgumentError(f"RotaryEmbedding: position ids must lie in [0, {cos.shape[0]})")
            cos, sin = cos[positions], sin[positions]
        # [B, S, H, D] view of the input
        view = x.transpose(0, 2, 1, 3) if x.ndim == 4 else x.reshape(batch, sequence, heads, head)
        wide = view.astype(np.float64)
        c = cos.astype(np.float64)[:, :, None, :]
        s = sin.astype(np.float64)[:, :, None, :]
        half = rotary // 2
        if int(attrs.get("interleaved", 0)):
            x1, x2 = wide[..., 0:rotary:2], wide[..., 1:rotary:2]
        else:
            x1, x2 = wide[..., :half], wide[..., half:rotary]
        real, imag = c * x1 - s * x2, s * x1 + c * x2
        out = wide.copy()
        if int(attrs.get("interleaved", 0)):
            out[..., 0:rotary:2], out[..., 1:rotary:2] = real, imag
        else:
            out[..., :half], out[..., half:rotary] = real, imag
        y = out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)
        return [y.astype(x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, cos, sin = inputs[0], inputs[1], inputs[2]
        assert x is not None and cos is not None and sin is not None
        positions = inputs[3] if len(inputs) > 3 else None
        element = "f32" if x.dtype == np.float32 else "f16"
        for info in [x, cos, sin] + list(outputs):
            if info.dtype != x.dtype or not (x.dtype == np.float32 or (x.dtype == np.float16 and caps.has_f16)):
                raise NotOnDevice(
                    f"RotaryEmbedding: the WebGPU kernel computes float32, or float16 with shader-f16, not {info.dtype}"
                )
        batch, sequence, heads, head, rotary = _geometry(x.shape, cos.shape, positions is not None, attrs)
        if cos.shape != sin.shape or (positions is not None and positions.shape != (batch, sequence)):
            raise ShapeError("RotaryEmbedding: cache or position_ids shapes do not match the input")
        total = x.size
        if total == 0:
            return OpPlan()
        table = BindingTable()
        x_name = table.add(Binding("input", 0), element)
        cos_name = table.add(Binding("input", 1), element)
        sin_name = table.add(Binding("input", 2), element)
        output = table.add(Binding("output", 0), element, writable=True)
        half = rotary // 2
        # token (b, s) of element i: 4-D [B, H, S, D] or 3-D [B, S, H * D]
        if len(x.shape) == 4:
            token = f"(i / {heads * sequence * head}u) * {sequence}u + (i / {head}u) % {sequence}u"
        else:
            token = f"i / {heads * head}u"
        if positions is not None:
            assert positions.dtype.itemsize in (4, 8)
            words = positions.dtype.itemsize // 4
            pid = table.add(Binding("input", 3), "u32")
            high = f"{pid}[token * 2u + 1u]" if words == 2 else f"select(0u, 0xffffffffu, {pid}[token] >= 0x80000000u)"
            # An id outside the cache: NaN there, and the run is flagged (it raises InvalidArgumentError).
            status = table.add(Binding("status"), "atomic<u32>", writable=True)
            row = f"""    let low = {pid}[token * {words}u];
    var nan_bits = 0x7fc00000u;
    if ({high} != 0u || low >= {int(cos.shape[0])}u) {{
        atomicOr(&{status}[0], 1u);
        {output}[i] = {element}(bitcast<f32>(nan_bits));
        return;
    }}
    let row = low;"""
        else:
            row = "    let row = token;"
        if int(attrs.get("interleaved", 0)):
            pair = """    let j = d / 2u;
    let first = (d % 2u) == 0u;
    let partner = select(i - 1u, i + 1u, first);"""
        else:
            pair = f"""    let first = d < {half}u;
    let j = select(d - {half}u, d, first);
    let partner = select(i - {half}u, i + {half}u, first);"""
        grid = grid_for_groups(-(-total // THREADS), caps)
        enable = "enable f16;\n" if element == "f16" else ""
        wgsl = f"""{enable}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let i = {workgroup_index(grid)} * {THREADS}u + li;
    if (i >= {total}u) {{ return; }}
    let d = i % {head}u;
    if (d >= {rotary}u) {{ {output}[i] = {x_name}[i]; return; }}
    let token = {token};
{row}
{pair}
    let c = f32({cos_name}[row * {half}u + j]);
    let s = f32({sin_name}[row * {half}u + j]);
    let v = f32({x_name}[i]);
    let w = f32({x_name}[partner]);
    {output}[i] = {element}(select(s * w + c * v, c * v - s * w, first));
}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("RotaryEmbedding", wgsl, grid, table, compute, inputs, outputs, caps)
