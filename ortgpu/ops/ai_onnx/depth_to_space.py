"""DepthToSpace-1/11/13 (DCR and, from 11, CRD) and SpaceToDepth-1/13/28 (CRD from 28) on 4-D NCHW tensors.

Both are permutations of elements: the device kernel is a gather (a bit-exact copy of any dtype) whose source
index is computed from the output coordinates.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl_kernels import gather_kernel

__all__ = ["DepthToSpace", "SpaceToDepth"]


def _blocksize(attrs: Mapping[str, Any], op_type: str) -> int:
    if attrs.get("blocksize") is None:
        raise ShapeError(f"{op_type}: the blocksize attribute is required")
    b = int(attrs["blocksize"])
    if b <= 0:
        raise ShapeError(f"{op_type}: blocksize must be positive, got {b}")
    return b


def _mode(attrs: Mapping[str, Any], opset: int, op_type: str = "DepthToSpace") -> str:
    mode = attrs.get("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    first_crd = 11 if op_type == "DepthToSpace" else 28
    if mode not in ("DCR", "CRD") or (mode == "CRD" and opset < first_crd):
        raise UnsupportedOpError(f"{op_type}: mode {mode!r} is not supported at opset {opset}")
    return mode


def depth_to_space(x: np.ndarray, b: int, mode: str) -> np.ndarray:
    if x.ndim != 4:
        raise ShapeError(f"DepthToSpace: input must be 4-D, got shape {x.shape}")
    n, c, h, w = x.shape
    if c % (b * b):
        raise ShapeError(f"DepthToSpace: channels {c} are not a multiple of blocksize^2 = {b * b}")
    depth = c // (b * b)
    if mode == "DCR":
        moved = x.reshape(n, b, b, depth, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        moved = x.reshape(n, depth, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return np.ascontiguousarray(moved.reshape(n, depth, h * b, w * b))


def space_to_depth(x: np.ndarray, b: int, mode: str = "DCR") -> np.ndarray:
    if x.ndim != 4:
        raise ShapeError(f"SpaceToDepth: input must be 4-D, got shape {x.shape}")
    n, c, h, w = x.shape
    if h % b or w % b:
        raise ShapeError(f"SpaceToDepth: height {h} and width {w} must be multiples of blocksize {b}")
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    moved = x.reshape(n, c, h // b, b, w // b, b).transpose(order)
    return np.ascontiguousarray(moved.reshape(n, c * b * b, h // b, w // b))


def _plan(
    op_type: str,
    source: str,
    function: Any,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
) -> OpPlan:
    x = inputs[0]
    assert x is not None
    if x.dtype.kind not in "biuf":
        raise NotOnDevice(f"{op_type}: {x.dtype} tensors stay on the CPU")
    if outputs[0].size == 0:
        return OpPlan()
    if x.size >= 2**31:
        raise NotOnDevice(f"{op_type}: tensors beyond 2^31 elements run on the CPU")
    bindings = [Binding("input", 0), Binding("output", 0)]
    twin = reference_twin(function, bindings, inputs, outputs)
    kernel = gather_kernel(op_type, [(bindings[0], x)], [], outputs[0], source, caps, twin)
    return OpPlan(kernels=(kernel,))


def _coordinates(shape: Sequence[int]) -> str:
    n, c, h, w = shape
    return (
        f"  let ox = j % {w}u;\n  let oy = (j / {w}u) % {h}u;\n"
        f"  let oc = (j / {w * h}u) % {c}u;\n  let on = j / {w * h * c}u;\n"
    )


@register
class DepthToSpace(Operator):
    op_type = "DepthToSpace"
    since_version = 1
    opset_changes = (11,)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        return [depth_to_space(x, _blocksize(attrs, "DepthToSpace"), _mode(attrs, self.opset))]

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
        b, mode = _blocksize(attrs, "DepthToSpace"), _mode(attrs, self.opset)
        if len(x.shape) != 4 or x.shape[1] % (b * b):
            raise ShapeError(f"DepthToSpace: input shape {x.shape} does not fit blocksize {b}")
        _, c, h, w = x.shape
        depth = c // (b * b)
        out_shape = outputs[0].shape
        channel = f"(i * {b}u + k) * {depth}u + oc" if mode == "DCR" else f"oc * {b * b}u + i * {b}u + k"
        source = (
            "fn source(j: u32) -> vec2<u32> {\n" + _coordinates(out_shape) + f"  let i = oy % {b}u;\n"
            f"  let k = ox % {b}u;\n  let ic = {channel};\n"
            f"  return vec2<u32>(0u, ((on * {c}u + ic) * {h}u + oy / {b}u) * {w}u + ox / {b}u);\n}}\n"
        )
        return _plan("DepthToSpace", source, lambda a: depth_to_space(a, b, mode), inputs, outputs, caps)


@register
class SpaceToDepth(Operator):
    op_type = "SpaceToDepth"
    since_version = 1
    opset_changes = (28,)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        return [space_to_depth(x, _blocksize(attrs, "SpaceToDepth"), _mode(attrs, self.opset, "SpaceToDepth"))]

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
        b, mode = _blocksize(attrs, "SpaceToDepth"), _mode(attrs, self.opset, "SpaceToDepth")
        if len(x.shape) != 4 or x.shape[2] % b or x.shape[3] % b:
            raise ShapeError(f"SpaceToDepth: input shape {x.shape} does not fit blocksize {b}")
        _, c, h, w = x.shape
        if mode == "DCR":  # output channel (i * b + k) * C + c
            split = f"  let ic = oc % {c}u;\n  let ij = oc / {c}u;\n"
        else:  # output channel c * b * b + i * b + k
            split = f"  let ic = oc / {b * b}u;\n  let ij = oc % {b * b}u;\n"
        source = (
            "fn source(j: u32) -> vec2<u32> {\n"
            + _coordinates(outputs[0].shape)
            + split
            + f"  let iy = oy * {b}u + ij / {b}u;\n  let ix = ox * {b}u + ij % {b}u;\n"
            f"  return vec2<u32>(0u, ((on * {c}u + ic) * {h}u + iy) * {w}u + ix);\n}}\n"
        )
        return _plan("SpaceToDepth", source, lambda a: space_to_depth(a, b, mode), inputs, outputs, caps)
