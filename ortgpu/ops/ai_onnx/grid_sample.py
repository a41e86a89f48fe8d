"""GridSample-16/20/22: sample X (N, C, D1..Dr) at the normalised grid points (N, O1..Or, r) -> (N, C, O1..Or).

The grid's last axis holds coordinates in [-1, 1] with the innermost spatial axis first (x, y, z).  Opset 16
takes 4-D X with modes bilinear/nearest/bicubic; opset 20 renames them linear/nearest/cubic and allows any
rank.  Conventions (those of onnxruntime, which follows PyTorch):

* unnormalise: ``(g + 1) / 2 * (size - 1)`` with align_corners, else ``((g + 1) * size - 1) / 2`` (float32);
* a coordinate outside ``[0, size - 1]`` (align_corners) or ``[-0.5, size - 0.5]`` is first clamped into
  ``[0, size - 1]`` (border, except cubic) or reflected into that range (reflection);
* nearest rounds half to even; linear reads 2 taps and cubic 4 (Keys, a = -0.75) per axis; a tap outside
  the input reads 0 (zeros), the edge (border) or its reflection (reflection).

2-D and 3-D sampling runs on the device for float32/float16 (one invocation per output element, the same
float32 unnormalisation, 1, 2 or 4 taps per axis unrolled); other ranks run on the CPU.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._tiling import wgsl_f32
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

__all__ = ["GridSample"]

F32 = np.float32


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Fold coordinates into [low, high] by reflecting at its ends (repeatedly)."""
    span = high - low
    if span <= 0:
        return np.zeros_like(x) + max(low, 0.0)
    below = x < low
    above = x > high
    distance = np.where(below, low - x, np.where(above, x - high, 0.0))
    folds = np.floor(distance / span)
    rest = distance - folds * span
    even = np.mod(folds, 2) == 0
    from_below = np.where(even, low + rest, high - rest)
    from_above = np.where(even, high - rest, low + rest)
    return np.where(below, from_below, np.where(above, from_above, x))


def _cubic(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75
    weights = []
    for distance in (t + 1.0, t, 1.0 - t, 2.0 - t):
        d = np.abs(distance)
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        weights.append(np.where(d <= 1, near, np.where(d < 2, far, 0.0)))
    return weights


def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align: bool) -> np.ndarray:
    rank = x.ndim - 2
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    out_spatial = grid.shape[1:-1]
    if grid.ndim != x.ndim or grid.shape[0] != n or grid.shape[-1] != rank:
        raise ShapeError(f"GridSample: grid of shape {grid.shape} does not fit X of shape {x.shape}")
    if n == 0 or c == 0 or 0 in out_spatial:
        return np.zeros((n, c) + tuple(out_spatial), dtype=x.dtype)
    if 0 in spatial:
        raise ShapeError(f"GridSample: X of shape {x.shape} has an empty spatial axis")
    g = grid.astype(F32)
    per_axis: list[list[tuple[np.ndarray, np.ndarray]]] = []  # per spatial axis: (index, weight) taps
    for axis, size in enumerate(spatial):
        v = g[..., rank - 1 - axis]
        if align:
            coord = (v + F32(1)) / F32(2) * F32(size - 1)
            low, high = 0.0, float(size - 1)
        else:
            coord = ((v + F32(1)) * F32(size) - F32(1)) / F32(2)
            low, high = -0.5, size - 0.5
        coord = coord.astype(np.float64)
        if mode == "nearest":
            coord = np.rint(coord)
        if padding == "border" and mode != "cubic":  # cubic clamps its taps only
            coord = np.clip(coord, 0.0, size - 1.0)
        elif padding == "reflection":
            coord = _reflect(coord, low, high)
        if mode == "nearest":
            taps = [(np.rint(coord).astype(np.int64), np.ones_like(coord))]
        elif mode == "linear":
            base = np.floor(coord)
            t = coord - base
            taps = [(base.astype(np.int64), 1.0 - t), (base.astype(np.int64) + 1, t)]
        else:
            base = np.floor(coord)
            weights = _cubic(coord - base)
            taps = [(base.astype(np.int64) + k - 1, weights[k]) for k in range(4)]
        resolved = []
        for index, weight in taps:
            if padding == "zeros":
                inside = (index >= 0) & (index < size)
                weight = np.where(inside, weight, 0.0)
                index = np.clip(index, 0, size - 1)
            elif padding == "border":
                index = np.clip(index, 0, size - 1)
            else:
                index = np.clip(_reflect(index.astype(np.float64), low, high).astype(np.int64), 0, size - 1)
            resolved.append((index, weight))
        per_axis.append(resolved)
    batch = np.arange(n).reshape((n,) + (1,) * rank)
    data = np.moveaxis(x, 1, -1).astype(np.float64)  # (N, D1..Dr, C)
    total = np.zeros((n,) + tuple(out_spatial) + (c,), dtype=np.float64)
    for combination in itertools.product(*per_axis):
        weight = np.ones((n,) + tuple(out_spatial), dtype=np.float64)
        where: tuple[Any, ...] = (batch,)
        for tap_index, tap_weight in combination:
            weight = weight * tap_weight
            where += (tap_index,)
        total += data[where] * weight[..., None]
    return np.ascontiguousarray(np.moveaxis(total, -1, 1).astype(x.dtype))


@register
class GridSample(Operator):
    """GridSample-16 (4-D; bilinear/nearest/bicubic) and -20/22 (N-d; linear/nearest/cubic)."""

    op_type = "GridSample"
    since_version = 16
    opset_changes = (20,)

    def _settings(self, x_rank: int, attrs: Mapping[str, Any]) -> tuple[str, str, bool]:
        names = {"bilinear": "linear", "bicubic": "cubic"} if self.opset < 20 else {}
        raw_mode = _text(attrs.get("mode"), "bilinear" if self.opset < 20 else "linear")
        mode = names.get(raw_mode, raw_mode)
        if mode not in ("linear", "nearest", "cubic") or (self.opset < 20 and raw_mode in ("linear", "cubic")):
            raise UnsupportedOpError(f"GridSample: mode {raw_mode!r} is not supported at opset {self.opset}")
        padding = _text(attrs.get("padding_mode"), "zeros")
        if padding not in ("zeros", "border", "reflection"):
            raise UnsupportedOpError(f"GridSample: padding_mode {padding!r} is not supported")
        if x_rank < 3 or (self.opset < 20 and x_rank != 4):
            raise ShapeError(f"GridSample: X of rank {x_rank} is not supported at opset {self.opset}")
        if mode == "cubic" and x_rank != 4:
            raise UnsupportedOpError("GridSample: cubic mode is defined for 4-D X only")
        return mode, padding, bool(int(attrs.get("align_corners", 0)))

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, grid = inputs[0], inputs[1]
        assert x is not None and grid is not None
        if x.dtype.kind != "f" or grid.dtype.kind != "f":
            raise UnsupportedOpError(f"GridSample: X {x.dtype} / grid {grid.dtype} are not supported (float only)")
        mode, padding, align = self._settings(x.ndim, attrs)
        return [grid_sample(x, grid, mode, padding, align)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, grid = inputs[0], inputs[1]
        assert x is not None and grid is not None
        mode, padding, align = self._settings(len(x.shape), attrs)
        out = outputs[0]
        if len(x.shape) not in (4, 5):
            raise NotOnDevice("GridSample: sampling over other than 2 or 3 spatial axes runs on the CPU")
        for info in (x, grid, out):
            if info.dtype.name not in ("float32", "float16"):
                raise NotOnDevice(f"GridSample: {info.dtype.name} runs on the CPU")
        if out.size == 0:
            return OpPlan()
        rank = len(x.shape) - 2
        if 0 in x.shape or tuple(grid.shape[:1]) != (x.shape[0],) or tuple(grid.shape[-1:]) != (rank,):
            raise NotOnDevice(f"GridSample: shapes X {x.shape}, grid {grid.shape} run on the CPU")
        if max(x.size, grid.size, out.size) >= 2**31:
            raise NotOnDevice("GridSample: tensors beyond 2^31 elements run on the CPU")
        check_binding_sizes("GridSample", [x, grid, out], caps)
        wgsl, invocations = _device_kernel(x, grid, out, mode, padding, align, caps)
        bindings = (Binding("input", 0), Binding("input", 1), Binding("output", 0))
        twin = reference_twin(lambda a, g: grid_sample(a, g, mode, padding, align), bindings, inputs, outputs)
        launch = grid_for(invocations, workgroup_size_for(caps.limits), caps.limits)
        return OpPlan(kernels=(KernelSpec("GridSample", wgsl, launch, bindings, twin),))


_REFLECT = """fn reflect(x: f32, low: f32, high: f32) -> f32 {
  let span = high - low;
  if (span <= 0.0f) { return max(low, 0.0f); }
  if (x >= low && x <= high) { return x; }
  let d = select(x - high, low - x, x < low);
  let folds = floor(d / span);
  let rest = d - folds * span;
  let even = (i32(folds) % 2) == 0;
  if (x < low) { return select(high - rest, low + rest, even); }
  return select(low + rest, high - rest, even);
}
"""


_CUBIC_WGSL = """fn cubic(t: f32) -> f32 {
  let d = abs(t);
  if (d <= 1.0f) { return (1.25f * d - 2.25f) * d * d + 1.0f; }
  if (d < 2.0f) { return ((-0.75f * d + 3.75f) * d - 6.0f) * d + 3.0f; }
  return 0.0f;
}
"""


def _axis_wgsl(name: str, component: str, size: int, mode: str, padding: str, align: bool) -> tuple[list[str], int]:
    """WGSL lines computing the taps ``{name}{t}`` (i32) and weights ``w{name}{t}`` (validity folded into the
    weights) of one spatial axis from grid value ``component``; and the tap count."""
    s = wgsl_f32(size)
    if align:
        coord = f"({component} + 1.0f) / 2.0f * {wgsl_f32(size - 1)}"
        low, high = "0.0f", wgsl_f32(size - 1)
    else:
        coord = f"(({component} + 1.0f) * {s} - 1.0f) / 2.0f"
        low, high = wgsl_f32(-0.5), wgsl_f32(size - 0.5)
    lines = [f"  var p{name} = {coord};"]
    if mode == "nearest":
        lines.append(f"  p{name} = round(p{name});")
    if padding == "border" and mode != "cubic":
        lines.append(f"  p{name} = clamp(p{name}, 0.0f, {wgsl_f32(size - 1)});")
    elif padding == "reflection":
        lines.append(f"  p{name} = reflect(p{name}, {low}, {high});")
    if mode == "nearest":
        lines += [f"  var {name}0 = i32(round(p{name}));", f"  var w{name}0 = 1.0f;"]
        taps = 1
    elif mode == "linear":
        lines += [
            f"  let f{name} = floor(p{name});",
            f"  var {name}0 = i32(f{name});",
            f"  var {name}1 = {name}0 + 1;",
            f"  var w{name}1 = p{name} - f{name};",
            f"  var w{name}0 = 1.0f - w{name}1;",
        ]
        taps = 2
    else:
        lines += [f"  let f{name} = floor(p{name});", f"  let t{name} = p{name} - f{name};"]
        for k, distance in enumerate(("+ 1.0f", "", "- 1.0f", "- 2.0f")):
            lines.append(f"  var {name}{k} = i32(f{name}) + {k - 1};")
            lines.append(f"  var w{name}{k} = cubic(t{name} {distance});")
        taps = 4
    for t in range(taps):
        tap = f"{name}{t}"
        if padding == "zeros":
            lines.append(f"  if ({tap} < 0 || {tap} >= {size}) {{ w{tap} = 0.0f; }}")
        elif padding == "reflection":
            lines.append(f"  {tap} = i32(reflect(f32({tap}), {low}, {high}));")
        lines.append(f"  {tap} = clamp({tap}, 0, {size - 1});")
    return lines, taps


def _device_kernel(
    x: TensorInfo, grid: TensorInfo, out: TensorInfo, mode: str, padding: str, align: bool, caps: DeviceCaps
) -> tuple[str, int]:
    c = x.shape[1]
    spatial = x.shape[2:]
    out_spatial = out.shape[2:]
    rank = len(spatial)
    points = 1
    for size in out_spatial:
        points *= size
    image = 1
    for size in spatial:
        image *= size
    lines = ["fn value(j: u32) -> f32 {", f"  let point = j % {points}u;", f"  let plane = j / {points}u;"]
    lines += [f"  let n = plane / {c}u;", f"  let g = {rank}u * (n * {points}u + point);"]
    lines.append(f"  let base = plane * {image}u;")
    taps: list[int] = []
    for axis in range(rank):
        axis_lines, count = _axis_wgsl(
            f"a{axis}_", f"loadg(g + {rank - 1 - axis}u)", spatial[axis], mode, padding, align
        )
        lines += axis_lines
        taps.append(count)
    strides = [1] * rank
    for axis in range(rank - 2, -1, -1):
        strides[axis] = strides[axis + 1] * spatial[axis + 1]
    terms = []
    for combination in itertools.product(*(range(t) for t in taps)):  # the reference's order: axis 0 outermost
        flat = " + ".join(f"u32(a{axis}_{t}) * {strides[axis]}u" for axis, t in enumerate(combination))
        weight = " * ".join(f"wa{axis}_{t}" for axis, t in enumerate(combination))
        terms.append(f"loadx(base + {flat}) * ({weight})")
    if len(terms) > 64:
        raise NotOnDevice(f"GridSample: {len(terms)} taps per output run on the CPU")
    lines.append("  return " + " + ".join(terms) + ";")
    lines.append("}")
    parts = [
        storage_declaration(0, "xs", writable=False),
        storage_declaration(1, "gs", writable=False),
        storage_declaration(2, "dst", writable=True),
        load_function("loadx", "xs", x.dtype),
        load_function("loadg", "gs", grid.dtype),
        _REFLECT if padding == "reflection" else "",
        _CUBIC_WGSL if mode == "cubic" else "",
        "\n".join(lines) + "\n",
    ]
    invocations = -(-out.size // elements_per_invocation(out.dtype.itemsize))
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    body = guard + store_statements(out.dtype, out.size, "value")
    return "".join(parts) + kernel_entry(workgroup_size_for(caps.limits), body), invocations
