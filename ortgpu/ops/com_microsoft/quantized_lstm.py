"""DynamicQuantizeLSTM: an LSTM whose weights are 8-bit (uint8 or int8) with float32 scales and zero points.

Inputs: X, W ``[directions, input_size, 4*hidden]``, R ``[directions, hidden, 4*hidden]``, B, sequence_lens,
initial_h, initial_c, P (as LSTM's), then W_scale, W_zero_point, R_scale, R_zero_point, each ``[directions]`` (per
tensor) or ``[directions, 4*hidden]`` (per output channel).  Attributes as LSTM's (no ``layout``).  W and R are
stored transposed relative to LSTM's ``[directions, 4*hidden, input]``.

Both paths dequantize the weights, ``(w - zero_point) * scale`` in float32 (an exact difference and one correctly
rounded product, bit for bit the same on the host and in WGSL), transpose them into LSTM's layout and run the standard
LSTM (:class:`~ortgpu.ops.ai_onnx.recurrent.LSTM`): its float64 reference, or its device plan, which reads the
dequantized weights from two scratch buffers that a first kernel fills from the 8-bit inputs on every run.

onnxruntime computes otherwise: it quantizes X and the hidden state to uint8 at every step and multiplies in integers,
so its outputs differ from the float LSTM over the same dequantized weights by that activation quantization (about
1e-2 for activations of order 1); this module keeps the float product, the semantics the quantized weights stand for.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    workgroup_size_for,
)
from ..ai_onnx.recurrent import LSTM
from ._qlinear_math import BYTE_DTYPES

__all__ = ["DynamicQuantizeLSTM", "dequantized_weights"]

F32 = np.dtype(np.float32)
#: The LSTM opset whose semantics the node has (7: no ``layout``).
_LSTM_OPSET = 7


def _directions(attrs: Mapping[str, Any]) -> int:
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    return 2 if direction == "bidirectional" else 1


def _check_parameters(
    weights: TensorInfo | np.ndarray,
    scale: TensorInfo | np.ndarray | None,
    zero: TensorInfo | np.ndarray | None,
    name: str,
) -> tuple[int, int, int]:
    """(directions, rows, 4*hidden) of 8-bit ``weights`` whose scale and zero point fit it."""
    op = "DynamicQuantizeLSTM"
    if weights.dtype not in BYTE_DTYPES:
        raise UnsupportedOpError(f"{op}: {name} of dtype {weights.dtype} is not supported (uint8 or int8)")
    if len(weights.shape) != 3:
        raise ShapeError(f"{op}: {name} must be 3-D [directions, rows, 4*hidden], got shape {list(weights.shape)}")
    directions, rows, columns = (int(d) for d in weights.shape)
    if scale is None or zero is None:
        raise ShapeError(f"{op}: {name}_scale and {name}_zero_point are required")
    if scale.dtype != F32:
        raise UnsupportedOpError(f"{op}: {name}_scale of dtype {scale.dtype} (float32 expected)")
    if zero.dtype != weights.dtype:
        raise UnsupportedOpError(f"{op}: {name}_zero_point is {zero.dtype}, {name} is {weights.dtype}")
    for what, value in (("scale", scale), ("zero point", zero)):
        if tuple(value.shape) not in ((directions,), (directions, columns)):
            raise ShapeError(
                f"{op}: {name}'s {what} has shape {list(value.shape)}; expected [{directions}] (per tensor) or "
                f"[{directions}, {columns}] (per channel)"
            )
    return directions, rows, columns


def dequantized_weights(weights: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """``(weights - zero) * scale`` in float32, transposed to LSTM's layout ``[directions, 4*hidden, rows]``."""
    directions = weights.shape[0]
    # [directions, 1, 1] (per tensor) or [directions, 1, 4*hidden] (per channel): broadcast over the rows
    difference = weights.astype(np.int32) - zero.reshape(directions, 1, -1).astype(np.int32)
    product = difference.astype(np.float32) * scale.reshape(directions, 1, -1).astype(np.float32)
    return np.ascontiguousarray(np.swapaxes(product.astype(np.float32), 1, 2))


def _dequantize_kernel(
    weights: TensorInfo,
    positions: tuple[int, int, int],
    per_channel: bool,
    scratch: int,
    caps: DeviceCaps,
) -> KernelSpec:
    """The kernel writing ``dequantized_weights`` of node inputs ``positions`` (weights, scale, zero point) into
    scratch buffer ``scratch`` (float32, one invocation per element)."""
    directions, rows, columns = (int(d) for d in weights.shape)
    channel = f"d * {columns}u + g" if per_channel else "d"
    wgsl = (
        storage_declaration(0, "weights", writable=False)
        + storage_declaration(1, "scales", writable=False)
        + storage_declaration(2, "zeros", writable=False)
        + storage_declaration(3, "dst", writable=True)
        + load_function("load_weight", "weights", weights.dtype)
        + load_function("load_zero", "zeros", weights.dtype)
        + "fn value(j: u32) -> f32 {\n"
        f"  let k = j % {rows}u;\n"
        f"  let g = (j / {rows}u) % {columns}u;\n"
        f"  let d = j / {rows * columns}u;\n"
        f"  let c = {channel};\n"
        f"  let difference = i32(load_weight((d * {rows}u + k) * {columns}u + g)) - i32(load_zero(c));\n"
        "  return f32(difference) * bitcast<f32>(scales[c]);\n"
        "}\n"
    )
    count = directions * rows * columns
    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {count}u) {{ return; }}\n"
    bindings = (
        Binding("input", positions[0]),
        Binding("input", positions[1]),
        Binding("input", positions[2]),
        Binding("scratch", scratch),
    )
    channels = directions * columns if per_channel else directions
    nbytes = weights.nbytes

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        values = arrays[0][:nbytes].view(weights.dtype).reshape(weights.shape)
        scale = arrays[1][: 4 * channels].view(np.float32).reshape(directions, -1)
        zero = arrays[2][:channels].view(weights.dtype).reshape(directions, -1)
        arrays[3][: 4 * count] = dequantized_weights(values, scale, zero).reshape(-1).view(np.uint8)

    return KernelSpec(
        name="DynamicQuantizeLSTM",
        wgsl=wgsl + kernel_entry(workgroup, guard + store_statements(F32, count, "value")),
        grid=grid_for(count, workgroup, caps.limits),
        bindings=bindings,
        twin=twin,
    )


@register
class DynamicQuantizeLSTM(Operator):
    op_type = "DynamicQuantizeLSTM"
    domain = "com.microsoft"
    since_version = 1

    def _lstm(self) -> LSTM:
        return LSTM(_LSTM_OPSET)

    def _check(self, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> None:
        x, w, r = (inputs[i] if len(inputs) > i else None for i in range(3))
        if x is None or w is None or r is None:
            raise ShapeError("DynamicQuantizeLSTM: inputs X, W and R are required")
        given = [inputs[i] if len(inputs) > i else None for i in range(8, 12)]
        directions, rows, columns = _check_parameters(w, given[0], given[1], "W")
        r_directions, hidden, r_columns = _check_parameters(r, given[2], given[3], "R")
        expected_hidden = int(attrs.get("hidden_size", hidden))
        if (
            directions != _directions(attrs)
            or r_directions != directions
            or hidden != expected_hidden
            or columns != 4 * hidden
            or r_columns != columns
            or len(x.shape) != 3
            or x.shape[2] != rows
        ):
            raise ShapeError(
                f"DynamicQuantizeLSTM: W {list(w.shape)} and R {list(r.shape)} do not fit X {list(x.shape)}, "
                f"hidden_size {expected_hidden} and {_directions(attrs)} direction(s) (W: [directions, input_size, "
                "4*hidden], R: [directions, hidden, 4*hidden])"
            )

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        self._check(inputs, attrs)
        x = inputs[0]
        assert x is not None
        if x.dtype != F32:
            raise UnsupportedOpError(f"DynamicQuantizeLSTM: X of dtype {x.dtype} (float32 expected)")
        w, r, w_scale, w_zero, r_scale, r_zero = (inputs[i] for i in (1, 2, 8, 9, 10, 11))
        assert w is not None and r is not None and w_scale is not None and w_zero is not None
        assert r_scale is not None and r_zero is not None
        lstm_inputs = [
            x,
            dequantized_weights(w, w_scale, w_zero),
            dequantized_weights(r, r_scale, r_zero),
            *(inputs[i] if len(inputs) > i else None for i in range(3, 8)),
        ]
        return self._lstm().reference(lstm_inputs, attrs, outputs)

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        try:
            self._check(inputs, attrs)
        except (ShapeError, UnsupportedOpError) as error:
            raise NotOnDevice(str(error)) from error
        w, r = inputs[1], inputs[2]
        assert w is not None and r is not None
        # The LSTM sees float32 weights of its own layout; its kernels read them from two scratch buffers.
        float_w = TensorInfo((w.shape[0], w.shape[2], w.shape[1]), F32)
        float_r = TensorInfo((r.shape[0], r.shape[2], r.shape[1]), F32)
        check_binding_sizes(self.op_type, [float_w, float_r], caps)
        lstm_inputs = [inputs[0], float_w, float_r, *(inputs[i] if len(inputs) > i else None for i in range(3, 8))]
        lstm_plan = self._lstm().plan(lstm_inputs, outputs, attrs, caps, {})
        w_slot, r_slot = len(lstm_plan.scratch_sizes), len(lstm_plan.scratch_sizes) + 1
        moved = {Binding("input", 1): Binding("scratch", w_slot), Binding("input", 2): Binding("scratch", r_slot)}
        # Same slots, other buffers: the LSTM twins index their arrays by slot, so they read the scratch copies.
        kernels = [
            dataclasses.replace(kernel, bindings=tuple(moved.get(b, b) for b in kernel.bindings))
            for kernel in lstm_plan.kernels
        ]
        scales = [inputs[8], inputs[10]]
        dequantize = [
            _dequantize_kernel(info, positions, scale is not None and len(scale.shape) == 2, slot, caps)
            for info, positions, scale, slot in ((w, (1, 8, 9), scales[0], w_slot), (r, (2, 10, 11), scales[1], r_slot))
        ]
        return OpPlan(
            kernels=(*dequantize, *kernels),
            scratch_sizes=(*lstm_plan.scratch_sizes, float_w.nbytes, float_r.nbytes),
        )
