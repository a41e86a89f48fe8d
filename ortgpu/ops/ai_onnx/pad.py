"""Pad-1/2/11/13/18/19: constant, reflect, edge and wrap padding (negative pads crop), on the device too.

Pads come from the ``paddings`` (opset 1) or ``pads`` attribute (opset 2) or input 1 (opset 11+), the constant
from the ``value`` attribute or input 2, the padded axes from input 3 (opset 18+).  Negative pads crop first;
the remaining (positive) pads are then filled from the cropped tensor.  The device kernel copies elements
bit for bit (any dtype of 1, 2, 4 or 8 bytes): each output element maps to one input element or the constant.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import is_float_dtype
from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    contiguous_strides,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    raw_load_function,
    storage_declaration,
    workgroup_size_for,
)

__all__ = ["Pad", "copy_kernel_body", "pad_plan", "pad_reference"]

_MODES = ("constant", "reflect", "edge", "wrap")


def _pads(
    opset: int, rank: int, attrs: Mapping[str, Any], pads: np.ndarray | None, axes: np.ndarray | None
) -> list[tuple[int, int]]:
    """(begin, end) per axis of the data."""
    if opset < 11:
        raw = attrs.get("paddings" if opset < 2 else "pads")
        if raw is None:
            raise ShapeError("Pad: the pads attribute is required")
        values = [int(v) for v in raw]
    else:
        if pads is None:
            raise ShapeError("Pad: the pads input is required")
        values = [int(v) for v in np.asarray(pads).reshape(-1)]
    axis_list = list(range(rank))
    if opset >= 18 and axes is not None:
        axis_list = []
        for a in np.asarray(axes).reshape(-1):
            a = int(a)
            if not -rank <= a < rank:
                raise ShapeError(f"Pad: axis {a} is out of range for rank {rank}")
            axis_list.append(a + rank if a < 0 else a)
        if len(set(axis_list)) != len(axis_list):
            raise ShapeError("Pad: axes repeat an axis")
    if len(values) != 2 * len(axis_list):
        raise ShapeError(f"Pad: {len(values)} pads for {len(axis_list)} axes (2 per axis expected)")
    result = [(0, 0)] * rank
    for i, a in enumerate(axis_list):
        result[a] = (values[i], values[len(axis_list) + i])
    return result


def _mode(attrs: Mapping[str, Any], opset: int) -> str:
    mode = attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in _MODES or (mode == "wrap" and opset < 19):
        raise UnsupportedOpError(f"Pad: mode {mode!r} is not supported at opset {opset}")
    return mode


def _layout(shape: Sequence[int], pads: Sequence[tuple[int, int]], mode: str) -> list[tuple[int, int, int, int]]:
    """Per axis (crop_begin, cropped length, pad_begin, output length); checks the mode can fill the pads."""
    layout = []
    for axis, (size, (begin, end)) in enumerate(zip(shape, pads)):
        crop_begin, crop_end = max(0, -begin), max(0, -end)
        length = size - crop_begin - crop_end
        if length < 0:
            raise ShapeError(f"Pad: pads {begin, end} remove more than the {size} elements of axis {axis}")
        pad_begin, pad_end = max(0, begin), max(0, end)
        out = length + pad_begin + pad_end
        if mode != "constant" and (pad_begin or pad_end) and length == 0:
            raise ShapeError(f"Pad: {mode} padding of the empty axis {axis}")
        if mode == "reflect" and max(pad_begin, pad_end) > length - 1:
            # a reflection repeats no edge element, so it can add at most length - 1 (onnxruntime refuses too)
            raise ShapeError(f"Pad: reflect pads {pad_begin, pad_end} exceed length - 1 = {length - 1} of axis {axis}")
        layout.append((crop_begin, length, pad_begin, out))
    return layout


def _source_index(i: np.ndarray, length: int, mode: str) -> np.ndarray:
    """The cropped-input index that fills position ``i`` (may be outside [0, length) for constant)."""
    if mode == "edge":
        clipped: np.ndarray = np.clip(i, 0, length - 1)
        return clipped
    if mode == "wrap":
        wrapped: np.ndarray = np.mod(i, length)
        return wrapped
    if mode == "reflect":
        if length == 1:
            return np.zeros_like(i)
        period = 2 * (length - 1)
        m = np.mod(i, period)
        reflected: np.ndarray = np.where(m >= length, period - m, m)
        return reflected
    return i


def pad_reference(x: np.ndarray, pads: Sequence[tuple[int, int]], mode: str, value: Any) -> np.ndarray:
    layout = _layout(x.shape, pads, mode)
    out_shape = tuple(entry[3] for entry in layout)
    if 0 in out_shape:
        return np.zeros(out_shape, dtype=x.dtype)
    inside = np.ones(out_shape, dtype=bool)
    index: tuple[np.ndarray, ...] = ()
    grids = np.meshgrid(*[np.arange(n) for n in out_shape], indexing="ij", sparse=True)
    for axis, (crop_begin, length, pad_begin, _) in enumerate(layout):
        source = _source_index(grids[axis] - pad_begin, length, mode)
        inside &= (source >= 0) & (source < length)
        index += (np.clip(source, 0, max(length - 1, 0)) + crop_begin,)
    if x.size == 0:
        return np.full(out_shape, value, dtype=x.dtype)
    gathered = x[index]
    return np.ascontiguousarray(np.where(inside, gathered, np.asarray(value, dtype=x.dtype)))


def copy_kernel_body(itemsize: int, count: int) -> str:
    """Body lines writing the output elements owned by invocation ``w`` from ``fetch(j) -> vec2<u32>`` bits."""
    if itemsize == 8:
        return "  let v = fetch(w);\n  dst[2u * w] = v.x;\n  dst[2u * w + 1u] = v.y;\n"
    if itemsize == 4:
        return "  dst[w] = fetch(w).x;\n"
    per = elements_per_invocation(itemsize)
    bits = 8 * itemsize
    lines = ["  var word = 0u;\n"]
    for e in range(per):
        j = f"(w * {per}u + {e}u)"
        lines.append(f"  if ({j} < {count}u) {{ word = word | (fetch({j}).x << {e * bits}u); }}\n")
    lines.append("  dst[w] = word;\n")
    return "".join(lines)


def _fill_bits(value: Any, dtype: np.dtype[Any]) -> tuple[int, int]:
    raw = np.asarray(value, dtype=dtype).reshape(1).view(np.uint8)
    padded = np.zeros(8, dtype=np.uint8)
    padded[: raw.size] = raw
    low, high = padded.view(np.uint32)
    return int(low), int(high)


@register
class Pad(Operator):
    """Pad-1/2/11/13/18/19 (one class: pads and the constant move from attributes to inputs, axes and wrap
    arrive later)."""

    op_type = "Pad"
    since_version = 1
    opset_changes = (2, 11, 18, 19)

    def _settings(
        self, rank: int, attrs: Mapping[str, Any], values: Sequence[np.ndarray | None]
    ) -> tuple[list[tuple[int, int]], str]:
        pads_input = values[1] if len(values) > 1 else None
        axes = values[3] if len(values) > 3 else None
        return _pads(self.opset, rank, attrs, pads_input, axes), _mode(attrs, self.opset)

    def _value(self, attrs: Mapping[str, Any], constant: np.ndarray | None) -> Any:
        if self.opset < 11:
            return float(attrs.get("value", 0.0))
        if constant is None or constant.size == 0:
            return 0
        return np.asarray(constant).reshape(-1)[0]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fiubc":
            raise UnsupportedOpError(f"Pad: data of dtype {x.dtype} is not supported")
        pads, mode = self._settings(x.ndim, attrs, inputs)
        value = self._value(attrs, inputs[2] if len(inputs) > 2 and self.opset >= 11 else None)
        return [pad_reference(x, pads, mode, value)]

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
        values: list[np.ndarray | None] = [None] * len(inputs)
        for i in (1, 3):
            if i < len(inputs) and inputs[i] is not None:
                if i not in constants:
                    raise NotOnDevice("Pad: pads and axes must be constants for the WebGPU kernel")
                values[i] = np.asarray(constants[i])
        pads, mode = self._settings(len(x.shape), attrs, values)
        has_value_input = self.opset >= 11 and len(inputs) > 2 and inputs[2] is not None and inputs[2].size > 0
        return pad_plan(
            "Pad", pads, mode, 2 if has_value_input else None, self._value(attrs, None), inputs, outputs, caps
        )


def pad_plan(
    op_type: str,
    pads: Sequence[tuple[int, int]],
    mode: str,
    value_input: int | None,
    fill_default: Any,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
) -> OpPlan:
    """The one-kernel plan padding input 0 by ``pads``; the constant is element 0 of input ``value_input``, or
    ``fill_default`` when that is None."""
    x = inputs[0]
    assert x is not None
    layout = _layout(x.shape, pads, mode)
    out = outputs[0]
    if tuple(out.shape) != tuple(entry[3] for entry in layout):
        raise NotOnDevice(f"{op_type}: the planned output shape {out.shape} differs from the pads")
    if out.size == 0:
        return OpPlan()
    itemsize = x.dtype.itemsize
    if (
        itemsize not in (1, 2, 4, 8)
        or out.dtype != x.dtype
        or (x.dtype.kind not in "biuf" and not is_float_dtype(x.dtype))
    ):
        raise NotOnDevice(f"{op_type}: {x.dtype} elements cannot be moved by a WebGPU kernel")
    if out.size >= 2**31 or x.size >= 2**31:
        raise NotOnDevice(f"{op_type}: tensors beyond 2^31 elements run on the CPU")
    check_binding_sizes(op_type, [x, out], caps)
    bindings = [Binding("input", 0)]
    parts = [storage_declaration(0, "src", writable=False), raw_load_function("raw0", "src", itemsize)]
    needs_fill = mode == "constant" and any(e[2] or e[3] != e[1] for e in layout)
    if needs_fill and value_input is not None:
        bindings.append(Binding("input", value_input))
        parts += [storage_declaration(1, "fill", writable=False), raw_load_function("raw1", "fill", itemsize)]
        fill = "raw1(0u)"
    else:
        low, high = _fill_bits(fill_default, x.dtype)
        fill = f"vec2<u32>({low}u, {high}u)"
    bindings.append(Binding("output", 0))
    parts.append(storage_declaration(len(bindings) - 1, "dst", writable=True))
    strides = contiguous_strides(x.shape)
    lines = ["fn fetch(j: u32) -> vec2<u32> {", "  var rest = j;", "  var k = 0;"]
    for axis in reversed(range(len(x.shape))):
        crop_begin, length, pad_begin, size = layout[axis]
        lines += [f"  var i{axis} = i32(rest % {size}u) - {pad_begin};", f"  rest = rest / {size}u;"]
        if mode == "constant":
            if pad_begin or size != length:
                lines.append(f"  if (i{axis} < 0 || i{axis} >= {length}) {{ return {fill}; }}")
        elif mode == "edge":
            lines.append(f"  i{axis} = clamp(i{axis}, 0, {length - 1});")
        elif mode == "wrap":
            # Unsigned remainders only: shifted by a multiple of the length past the front padding, the index is
            # never negative (the signed-remainder form read wrong elements on NVIDIA's driver).
            shift = (max(pad_begin, 0) // length + 1) * length
            lines.append(f"  i{axis} = i32(u32(i{axis} + {shift}) % {length}u);")
        elif length == 1:
            lines.append(f"  i{axis} = 0;")
        else:
            period = 2 * (length - 1)
            shift = (max(pad_begin, 0) // period + 1) * period
            lines.append(f"  i{axis} = i32(u32(i{axis} + {shift}) % {period}u);")
            lines.append(f"  if (i{axis} >= {length}) {{ i{axis} = {period} - i{axis}; }}")
        lines.append(f"  k = k + (i{axis} + {crop_begin}) * {strides[axis]};")
    lines += ["  return raw0(u32(k));", "}"]
    parts.append("\n".join(lines) + "\n")

    # Without a bound constant_value the kernel fills with fill_default; the twin too.
    def function(*arrays: np.ndarray) -> np.ndarray:
        fill_value = arrays[1].reshape(-1)[0] if len(arrays) > 1 else fill_default
        return pad_reference(arrays[0], pads, mode, fill_value)

    invocations = -(-out.size // elements_per_invocation(itemsize))
    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    wgsl = "".join(parts) + kernel_entry(workgroup, guard + copy_kernel_body(itemsize, out.size))
    twin = reference_twin(function, bindings, inputs, outputs)
    grid = grid_for(invocations, workgroup, caps.limits)
    return OpPlan(kernels=(KernelSpec(op_type, wgsl, grid, tuple(bindings), twin),))
