"""The operator behind a fused attention step: ``MatMul -> [scale] -> [Add mask] -> Softmax -> MatMul`` as one kernel.

Not an ONNX operator and not in the registry: the planner's attention rewrite (:mod:`ortgpu._attention_fusion`)
builds it for a matched group.  Its inputs are the sources the group read: Q, K^T and V, each through a strided
view (``attrs["_views"]``: per operand its logical shape, element strides and element offset over the source, the
data-movement nodes the group absorbed), and the additive mask or nothing.  ``attrs["_out_perm"]``, where present,
is a Transpose after the product that the step writes through: the output is the product with its axes moved.
``attrs["_batch_split"]`` ``(axis, groups, rep)``: the views split the product's head axis in two
(:mod:`ortgpu._repeated_heads`: K/V heads repeated by Expand, read with stride 0); the mask broadcasts against the
merged batch and is split the same way; the output is written merged. ``_logit_scale`` multiplies Q.K^T (the scalar
Muls/Divs before the mask, on either operand or on the scores); ``_bias_scale`` the mask (those after it). The reference
computes exactly the unfused graph's function (in float64, rounded once to the output's type), which the fake backend's
twin runs.

Each tensor may be float32 or float16 (float16 needs the device's ``shader-f16``): the kernel reads float16 into f32
and computes the scores, the softmax and the sums in f32, as the reference computes without the intermediate
roundings a float16 graph's Mul/Softmax/MatMul would make.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ._flash_attention import FlashProblem, OperandView
from ._flash_rows import attention_kernel
from ._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._tiling import broadcast_strides, c_strides, float_element, single_kernel_plan

__all__ = ["FUSE_MAX_SCORES", "FusedAttention"]

#: The most scores per head (query rows x keys) an attention group is fused at.  The flash kernels compute well
#: below the tiled GEMMs' rate, so fusing pays only where the unfused path's extra dispatches and score traffic are
#: most of its time.  One attention alone on an H100 (GPU time per replay, bench/RESULTS.md): 8-12 heads of 128 x
#: 128, fused and unfused within 6% of each other (fused kept: fewer steps, no score buffer); ViT's 12 heads of 197
#: x 197, fused 64 us against 37 unfused, and 1.3x slower at batch 8; Whisper's 1500 x 1500, 5.7x slower.
FUSE_MAX_SCORES = 128 * 128


def _view(info: TensorInfo, view: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """The logical shape, strides and offset of ``info``'s tensor read through ``view`` (checked to lie inside it)."""
    shape, strides, offset = (tuple(int(x) for x in view[0]), tuple(int(x) for x in view[1]), int(view[2]))
    size = int(np.prod(info.shape, dtype=np.int64))
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)
    if (
        len(shape) != len(strides)
        or min(strides, default=0) < 0
        or offset < 0
        or (min(shape, default=1) > 0 and last >= size)
    ):
        raise NotOnDevice(f"fused attention: the view {view} does not lie inside a tensor of shape {info.shape}")
    return shape, strides, offset


def _read_view(source: np.ndarray, view: Sequence[Any]) -> np.ndarray:
    """``source`` read through ``view`` (as :func:`_view` takes it), as a new array."""
    flat = np.ascontiguousarray(source).reshape(-1)
    shape, strides, offset = view
    byte_strides = tuple(int(s) * flat.itemsize for s in strides)
    return np.lib.stride_tricks.as_strided(flat[int(offset) :], tuple(shape), byte_strides).copy()


def _batch_strides(shape: Sequence[int], strides: Sequence[int], batch: Sequence[int]) -> tuple[int, ...]:
    """Per-axis strides of an operand's batch axes (``shape[:-2]``) right-aligned in ``batch``, 0 where broadcast."""
    own = list(zip(shape[:-2], strides[:-2]))
    if len(own) > len(batch):
        raise NotOnDevice(f"fused attention: batch axes {tuple(shape[:-2])} do not broadcast to {tuple(batch)}")
    padded = [(1, 0)] * (len(batch) - len(own)) + own
    result = []
    for (size, stride), want in zip(padded, batch):
        if size not in (1, want):
            raise NotOnDevice(f"fused attention: batch axes {tuple(shape[:-2])} do not broadcast to {tuple(batch)}")
        result.append(0 if size == 1 else stride)
    return tuple(result)


class FusedAttention(Operator):
    """Scaled dot-product attention matched in a graph (see the module docstring)."""

    op_type = "FusedAttention"
    since_version = 1
    domain = "ortgpu.fused"

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        q_src, k_src, v_src = inputs[0], inputs[1], inputs[2]
        mask = inputs[3] if len(inputs) > 3 else None
        assert q_src is not None and k_src is not None and v_src is not None
        vq, vk, vv = attrs["_views"]
        q = _read_view(q_src, vq).astype(np.float64)
        kt = _read_view(k_src, vk).astype(np.float64)
        v = _read_view(v_src, vv).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            scores = np.matmul(q, kt) * float(attrs["_logit_scale"])
            if mask is not None:  # broadcast against the unsplit batch, then split like the scores
                merged = _logical_out(outputs[0], attrs)[:-2] + scores.shape[-2:]
                bias = np.broadcast_to(mask.astype(np.float64), merged).reshape(scores.shape)
                scores = scores + bias * float(attrs["_bias_scale"])
            top = scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores - top)
            weights = weights / weights.sum(axis=-1, keepdims=True)
            result = np.matmul(weights, v)
        result = result.reshape(_logical_out(outputs[0], attrs))  # (a split head axis merged back)
        if "_out_perm" in attrs:
            result = np.transpose(result, attrs["_out_perm"])
        return [result.astype(outputs[0].dtype).reshape(outputs[0].shape)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        q_info, k_info, v_info = inputs[0], inputs[1], inputs[2]
        mask_info = inputs[3] if len(inputs) > 3 else None
        assert q_info is not None and k_info is not None and v_info is not None
        elements = _elements([q_info, k_info, v_info, mask_info, outputs[0]], caps)
        vq, vk, vv = attrs["_views"]
        q_shape, q_strides, q_offset = _view(q_info, vq)
        kt_shape, kt_strides, kt_offset = _view(k_info, vk)
        v_shape, v_strides, v_offset = _view(v_info, vv)
        out_shape = _logical_out(outputs[0], attrs)
        merged_batch, split_at = out_shape[:-2], None
        out_strides = c_strides(out_shape)
        if "_out_perm" in attrs:  # written where the Transpose after the product would put each element
            perm = tuple(attrs["_out_perm"])
            stored = c_strides(outputs[0].shape)
            out_strides = tuple(stored[perm.index(axis)] for axis in range(len(out_shape)))
        if "_batch_split" in attrs:  # the head axis as (groups, rep): K/V heads repeated by stride 0
            axis, groups, rep = (int(x) for x in attrs["_batch_split"])
            if not 0 <= axis < len(out_shape) - 2 or out_shape[axis] != groups * rep:
                raise NotOnDevice(f"fused attention: cannot split axis {axis} of {out_shape} into {groups} x {rep}")
            out_shape = out_shape[:axis] + (groups, rep) + out_shape[axis + 1 :]
            split_at = (axis, rep)
            out_strides = _split_stride(out_strides, axis, rep)
        if min(len(q_shape), len(kt_shape), len(v_shape), len(out_shape)) < 2:
            raise NotOnDevice("fused attention: Q, K^T and V must have rank >= 2")
        sq, head = q_shape[-2:]
        sk, value_head = kt_shape[-1], v_shape[-1]
        if kt_shape[-2] != head or v_shape[-2] != sk or out_shape[-2:] != (sq, value_head):
            raise NotOnDevice(f"fused attention: Q {q_shape}, K^T {kt_shape}, V {v_shape} do not chain")
        if sq * sk > FUSE_MAX_SCORES:
            raise NotOnDevice(
                f"fused attention: {sq} x {sk} scores per head; past {FUSE_MAX_SCORES} the unfused tiled GEMMs are faster"
            )
        batch = out_shape[:-2]
        problem = FlashProblem(
            batch=batch,
            sq=sq,
            sk=sk,
            head=head,
            value_head=value_head,
            q=OperandView(
                0, _batch_strides(q_shape, q_strides, batch), q_strides[-2], q_strides[-1], elements[0], q_offset
            ),
            k=OperandView(
                1, _batch_strides(kt_shape, kt_strides, batch), kt_strides[-1], kt_strides[-2], elements[1], kt_offset
            ),
            v=OperandView(
                2, _batch_strides(v_shape, v_strides, batch), v_strides[-2], v_strides[-1], elements[2], v_offset
            ),
            mask=None if mask_info is None else _mask_view(mask_info, merged_batch, sq, sk, elements[3], split_at),
            logit_scale=float(attrs["_logit_scale"]),
            bias_scale=float(attrs["_bias_scale"]),
            out=OperandView(0, out_strides[:-2], out_strides[-2], out_strides[-1], elements[4]),
        )
        wgsl, grid, table = attention_kernel(problem, caps)
        return single_kernel_plan(
            "FusedAttention",
            wgsl,
            grid,
            table,
            lambda full: self.reference(full, attrs, outputs),
            inputs,
            outputs,
            caps,
        )


def _logical_out(info: TensorInfo, attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The product's shape ([..., queries, value head]): the output's, or the output's before ``_out_perm`` (the
    Transpose written through) moved its axes."""
    shape = tuple(info.shape)
    perm = attrs.get("_out_perm")
    if perm is None:
        return shape
    if sorted(perm) != list(range(len(shape))):
        raise NotOnDevice(f"fused attention: {tuple(perm)} is not a permutation of the output's {len(shape)} axes")
    logical = [0] * len(shape)
    for position, axis in enumerate(perm):
        logical[axis] = shape[position]
    return tuple(logical)


def _elements(infos: Sequence[TensorInfo | None], caps: DeviceCaps) -> list[str]:
    """The storage element of each tensor ("f32", "f16"; "" where absent); ``NotOnDevice`` for other types, and for
    float16 on a device without ``shader-f16``.  The types may differ (a graph may cast around its Softmax)."""
    for info in infos:
        if info is not None and info.dtype not in (np.float32, np.float16):
            raise NotOnDevice(f"fused attention: the kernel takes float32 or float16 tensors, not {info.dtype}")
    elements = ["" if info is None else float_element(info) for info in infos]
    if "f16" in elements and not caps.has_f16:
        raise NotOnDevice("fused attention: float16 on the device needs the adapter's shader-f16 feature")
    return elements


def _split_stride(strides: tuple[int, ...], axis: int, rep: int) -> tuple[int, ...]:
    """``strides`` with ``axis`` split into (groups, ``rep``): the groups step ``rep`` times as far."""
    return strides[:axis] + (strides[axis] * rep, strides[axis]) + strides[axis + 1 :]


def _mask_view(
    info: TensorInfo, batch: tuple[int, ...], sq: int, sk: int, element: str, split_at: tuple[int, int] | None = None
) -> OperandView:
    """The mask broadcast to the product's (unsplit) batch; ``split_at`` (axis, rep): that axis then split as the
    output's is (``_batch_split``)."""
    try:
        strides = broadcast_strides(info.shape, batch + (sq, sk))
    except ValueError:
        raise NotOnDevice(f"fused attention: the mask {info.shape} does not broadcast to the scores") from None
    if split_at is not None:
        strides = _split_stride(strides, *split_at)
    return OperandView(3, strides[:-2], strides[-2], strides[-1], element)
