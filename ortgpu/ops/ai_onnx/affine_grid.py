"""AffineGrid-20: the sampling grid (N, H, W, 2) or (N, D, H, W, 3) of affine matrices theta (N, 2, 3) or
(N, 3, 4) over the normalised output coordinates (GridSample's input).

Normalised coordinates of ``size`` positions are ``-1 + (2 i + 1) / size`` (pixel centres), or evenly spaced
from -1 to 1 with align_corners (0 for one position).  On the device (float32/float16 theta, a constant size)
one invocation per grid value.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
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

__all__ = ["AffineGrid"]


def _check_unit_axes(spatial: Sequence[int], align: bool) -> None:
    if align and 1 in spatial:
        # the single position of an aligned axis: onnxruntime puts it at +1, onnx's reference at -1, PyTorch at 0
        raise UnsupportedOpError(
            f"AffineGrid: align_corners=1 with a spatial size of 1 ({list(spatial)}) is not supported (onnxruntime, "
            "onnx's reference and PyTorch place that position differently)"
        )


def _positions(size: int, align: bool) -> np.ndarray:
    if align:
        return np.linspace(-1.0, 1.0, size) if size > 1 else np.zeros(size)
    return (2.0 * np.arange(size) + 1.0) / size - 1.0


@register
class AffineGrid(Operator):
    op_type = "AffineGrid"
    since_version = 20

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        theta, size = inputs[0], inputs[1]
        assert theta is not None and size is not None
        if theta.dtype.kind != "f":
            raise UnsupportedOpError(f"AffineGrid: theta of dtype {theta.dtype} is not supported (float only)")
        return [affine_grid(theta, size, bool(int(attrs.get("align_corners", 0))))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        theta = inputs[0]
        assert theta is not None
        out = outputs[0]
        if 1 not in constants:
            raise NotOnDevice("AffineGrid: size must be a constant for the WebGPU kernel")
        if theta.dtype.name not in ("float32", "float16") or out.dtype != theta.dtype:
            raise NotOnDevice(f"AffineGrid: theta of dtype {theta.dtype.name} runs on the CPU")
        size = np.asarray(constants[1])
        align = bool(int(attrs.get("align_corners", 0)))
        dims = [int(v) for v in size.reshape(-1)]
        rank = len(dims) - 2
        if rank not in (2, 3) or tuple(theta.shape) != (dims[0], rank, rank + 1):
            raise NotOnDevice(f"AffineGrid: theta {theta.shape} and size {dims} run on the CPU")
        spatial = dims[2:]
        _check_unit_axes(spatial, align)
        if tuple(out.shape) != (dims[0], *spatial, rank):
            raise NotOnDevice(f"AffineGrid: the planned output shape {out.shape} differs from size {dims}")
        if out.size == 0:
            return OpPlan()
        # output element j = ((n * D.. + p) * rank + component); theta row (n, component) has rank + 1 values
        points = int(np.prod(spatial))
        lines = [
            "fn grid_value(j: u32) -> f32 {",
            f"  let component = j % {rank}u;",
            f"  var rest = (j / {rank}u) % {points}u;",
            f"  let n = j / {rank * points}u;",
            f"  let row = (n * {rank}u + component) * {rank + 1}u;",
            f"  var total = load0(row + {rank}u);",
        ]
        for axis in reversed(range(rank)):  # the innermost spatial axis is coordinate 0 (x)
            length = spatial[axis]
            lines.append(f"  let i{axis} = f32(rest % {length}u);")
            lines.append(f"  rest = rest / {length}u;")
            if align:
                position = (
                    f"(-1.0f + i{axis} * {2.0 / (length - 1) if length > 1 else 0.0!r}f)" if length > 1 else "0.0f"
                )
            else:
                position = f"((2.0f * i{axis} + 1.0f) / {float(length)!r}f - 1.0f)"
            lines.append(f"  total = total + load0(row + {rank - 1 - axis}u) * {position};")
        lines += ["  return total;", "}"]
        bindings = (Binding("input", 0), Binding("output", 0))
        twin = reference_twin(lambda t: affine_grid(t, size, align), bindings, inputs, outputs)
        check_binding_sizes("AffineGrid", [theta, out], caps)
        parts = [
            storage_declaration(0, "src", writable=False),
            storage_declaration(1, "dst", writable=True),
            load_function("load0", "src", theta.dtype),
            "\n".join(lines) + "\n",
        ]
        invocations = -(-out.size // elements_per_invocation(out.dtype.itemsize))
        guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
        workgroup = workgroup_size_for(caps.limits)
        wgsl = "".join(parts) + kernel_entry(workgroup, guard + store_statements(out.dtype, out.size, "grid_value"))
        launch = grid_for(invocations, workgroup, caps.limits)
        return OpPlan(kernels=(KernelSpec("AffineGrid", wgsl, launch, bindings, twin),))


def affine_grid(theta: np.ndarray, size: np.ndarray, align: bool) -> np.ndarray:
    """The grid of ``theta`` (N, r, r + 1) over the spatial extent of ``size`` (float64 arithmetic)."""
    dims = [int(v) for v in np.asarray(size).reshape(-1)]
    if len(dims) not in (4, 5) or any(d < 0 for d in dims):
        raise ShapeError(f"AffineGrid: size must be (N, C, H, W) or (N, C, D, H, W), got {dims}")
    rank = len(dims) - 2
    n = dims[0]
    if theta.shape != (n, rank, rank + 1):
        raise ShapeError(f"AffineGrid: theta of shape {theta.shape} does not fit size {dims}")
    spatial = dims[2:]
    _check_unit_axes(spatial, align)
    # coordinates per spatial axis, the innermost (x) first in the grid's last axis
    axes = [_positions(s, align) for s in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # each (D.., H, W)
    base = np.stack([m for m in reversed(mesh)] + [np.ones(tuple(spatial))], axis=-1)  # (..., rank + 1)
    grid = np.einsum("...k,njk->n...j", base, theta.astype(np.float64))
    result: np.ndarray = np.ascontiguousarray(grid.astype(theta.dtype))
    return result
