"""DynamicQuantizeLSTM: an LSTM whose weights are 8-bit (uint8 or int8) with float32 scales and zero points.

Inputs: X, W ``[directions, input_size, 4*hidden]``, R ``[directions, hidden, 4*hidden]``, B, sequence_lens,
initial_h, initial_c, P (as LSTM's), then W_scale, W_zero_point, R_scale, R_zero_point, each ``[directions]`` (per
tensor) or ``[directions, 4*hidden]`` (per output channel).  Attributes as LSTM's (no ``layout``).  W and R are
stored transposed relative to LSTM's ``[directions, 4*hidden, input]``.

Computed as onnxruntime's CPU kernel computes it, not as a float LSTM over dequantized weights: X (up to the
longest sequence) and, at every step, the previous hidden state are quantized to uint8 on their own range and
multiplied in integers (:mod:`._quantized_lstm_math` says exactly how, and where onnxruntime's result depends on its
thread count: this follows one thread).  The reference is that arithmetic in numpy float32; the device plan
(:mod:`._quantized_lstm_plan`) runs it in WGSL with the same integer sums and exact quotients, two dispatches per
step.  Per-channel zero points are taken as given (onnxruntime refuses those that are not one value, 0 for int8).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from ..ai_onnx._recurrent_cells import Activation, activations_for, decode_names
from ._qlinear_math import BYTE_DTYPES
from ._quantized_lstm_math import expand_parameter, fused_bias, quantized_lstm
from ._quantized_lstm_plan import Shape, device_plan

__all__ = ["DynamicQuantizeLSTM"]

F32 = np.dtype(np.float32)
_OP = "DynamicQuantizeLSTM"


def _direction(attrs: Mapping[str, Any]) -> str:
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction not in ("forward", "reverse", "bidirectional"):
        raise UnsupportedOpError(f"{_OP}: direction {direction!r} is not defined (forward, reverse, bidirectional)")
    return direction


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


@register
class DynamicQuantizeLSTM(Operator):
    op_type = "DynamicQuantizeLSTM"
    domain = "com.microsoft"
    since_version = 1
    data_error_hint = "DynamicQuantizeLSTM: sequence_lens must lie in [0, seq_length]"

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

        if x.dtype != F32:
            raise UnsupportedOpError(f"{_OP}: X of dtype {x.dtype} (float32 expected)")
        seq, batch = int(x.shape[0]), int(x.shape[1])
        expected = {
            3: ("B", (directions, 8 * hidden), F32),
            4: ("sequence_lens", (batch,), np.dtype(np.int32)),
            5: ("initial_h", (directions, batch, hidden), F32),
            6: ("initial_c", (directions, batch, hidden), F32),
            7: ("P", (directions, 3 * hidden), F32),
        }
        for index, (name, shape, dtype) in expected.items():
            value = inputs[index] if len(inputs) > index else None
            if value is None:
                continue
            if value.dtype != dtype:
                raise UnsupportedOpError(f"{_OP}: {name} of dtype {value.dtype} ({dtype} expected)")
            if tuple(value.shape) != shape:
                raise ShapeError(f"{_OP}: {name} has shape {list(value.shape)}; expected {list(shape)}")
        _direction(attrs)
        if seq < 0 or batch < 0:
            raise ShapeError(f"{_OP}: X has shape {list(x.shape)}")

    @staticmethod
    def _functions(attrs: Mapping[str, Any], directions: int) -> list[list[Activation]]:
        """f, g, h of each direction (h without ``clip``: onnxruntime clips the gates' inputs, not the cell's)."""
        clip = attrs.get("clip")
        functions = activations_for(
            _OP,
            ("Sigmoid", "Tanh", "Tanh"),
            directions,
            decode_names(attrs.get("activations")),
            [float(a) for a in attrs.get("activation_alpha", ()) or ()],
            [float(b) for b in attrs.get("activation_beta", ()) or ()],
            None if clip is None else float(clip),
        )
        return [[f, g, dataclasses.replace(h, clip=None)] for f, g, h in functions]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        self._check(inputs, attrs)
        x, w, r = inputs[0], inputs[1], inputs[2]
        assert x is not None and w is not None and r is not None

        def given(index: int) -> np.ndarray | None:
            return inputs[index] if len(inputs) > index else None

        seq, batch, _ = x.shape
        directions, hidden = int(w.shape[0]), int(r.shape[1])
        columns = 4 * hidden
        lengths_value = given(4)
        lengths = np.full(batch, seq, np.int64) if lengths_value is None else lengths_value.astype(np.int64)
        if np.any(lengths < 0) or np.any(lengths > seq):
            raise ShapeError(f"{_OP}: sequence_lens {lengths.tolist()} must lie in [0, seq_length={seq}]")
        parameters = []
        for weights, scale_at in ((w, 8), (r, 10)):
            scale, zero = given(scale_at), given(scale_at + 1)
            assert scale is not None and zero is not None
            parameters.append(
                (weights, expand_parameter(zero.astype(np.int64), directions, columns),
                 expand_parameter(scale, directions, columns))
            )  # fmt: skip
        state = np.zeros((directions, batch, hidden), np.float32)
        h0, c0 = given(5), given(6)
        direction = _direction(attrs)
        y, y_h, y_c = quantized_lstm(
            x,
            lengths,
            parameters[0],
            parameters[1],
            fused_bias(given(3), directions, hidden),
            given(7),
            (state if h0 is None else h0, state if c0 is None else c0),
            self._functions(attrs, directions),
            [direction == "reverse" or d == 1 for d in range(directions)],
            bool(int(attrs.get("input_forget", 0))),
            y_present=len(outputs) > 0 and outputs[0].size > 0,
        )
        return [y, y_h, y_c]

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
            functions = self._functions(attrs, _directions(attrs))
        except (ShapeError, UnsupportedOpError) as error:
            raise NotOnDevice(str(error)) from error
        x, w, r = inputs[0], inputs[1], inputs[2]
        assert x is not None and w is not None and r is not None
        seq, batch, input_size = (int(d) for d in x.shape)
        directions, hidden = int(w.shape[0]), int(r.shape[1])
        if min(seq, batch, input_size, hidden) <= 0:
            raise NotOnDevice(f"{_OP}: an empty dimension (X {list(x.shape)}, hidden {hidden}); runs on the CPU")

        def present(index: int) -> bool:
            return len(inputs) > index and inputs[index] is not None

        def per_channel(index: int) -> bool:
            value = inputs[index]
            return value is not None and len(value.shape) == 2

        direction = _direction(attrs)
        shape = Shape(
            seq=seq,
            batch=batch,
            input_size=input_size,
            hidden=hidden,
            directions=directions,
            reverse=tuple(direction == "reverse" or d == 1 for d in range(directions)),
            has_lengths=present(4),
            has_h0=present(5),
            has_c0=present(6),
            has_bias=present(3),
            has_peepholes=present(7),
            input_forget=bool(int(attrs.get("input_forget", 0))),
            per_channel=(per_channel(8), per_channel(9), per_channel(10), per_channel(11)),
            weight_dtypes=(w.dtype, r.dtype),
            outputs=tuple(len(outputs) > k and outputs[k].size > 0 for k in range(3)),  # type: ignore[arg-type]
        )
        return device_plan(shape, functions, [*inputs, *outputs], caps)
