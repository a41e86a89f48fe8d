"""CenterCropPad-18: crop (start rounded down) or zero-pad (the odd pixel on the right) each listed axis to the
target ``shape`` so that the input stays centred.  It is a Pad with computed (possibly negative) pads, so the
device kernel is Pad's bit-exact copy (the target shape must be a constant there)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .pad import pad_plan, pad_reference

__all__ = ["CenterCropPad"]


def _pads(shape: Sequence[int], target: np.ndarray, attrs: Mapping[str, Any]) -> list[tuple[int, int]]:
    rank = len(shape)
    axes = [int(a) for a in attrs.get("axes", range(rank))]
    for a in axes:
        if not -rank <= a < rank:
            raise ShapeError(f"CenterCropPad: axis {a} is out of range for rank {rank}")
    axes = [a + rank if a < 0 else a for a in axes]
    if len(set(axes)) != len(axes):
        raise ShapeError("CenterCropPad: axes repeat an axis")
    sizes = [int(v) for v in np.asarray(target).reshape(-1)]
    if len(sizes) != len(axes):
        raise ShapeError(f"CenterCropPad: shape has {len(sizes)} values for {len(axes)} axes")
    pads = [(0, 0)] * rank
    for a, size in zip(axes, sizes):
        if size < 0:
            raise ShapeError(f"CenterCropPad: target size {size} is negative")
        difference = size - int(shape[a])
        if difference >= 0:  # pad: the extra pixel goes to the end
            pads[a] = (difference // 2, difference - difference // 2)
        else:  # crop: the window starts rounded down
            removed = -difference
            pads[a] = (-(removed // 2), -(removed - removed // 2))
    return pads


@register
class CenterCropPad(Operator):
    op_type = "CenterCropPad"
    since_version = 18

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, target = inputs[0], inputs[1]
        assert x is not None and target is not None
        return [pad_reference(x, _pads(x.shape, target, attrs), "constant", 0)]

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
        if 1 not in constants:
            raise NotOnDevice("CenterCropPad: the target shape must be a constant for the WebGPU kernel")
        pads = _pads(x.shape, np.asarray(constants[1]), attrs)
        return pad_plan("CenterCropPad", pads, "constant", None, 0, inputs, outputs, caps)
