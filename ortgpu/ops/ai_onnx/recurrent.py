"""RNN, GRU and LSTM (opsets 7 and 14; 14 adds ``layout``), on the CPU.

Shapes (``layout`` 0; ``layout`` 1 puts the batch axis first in X, initial states and all outputs)::

    X          [seq_length, batch, input_size]
    W          [num_directions, gates * hidden, input_size]     gates: RNN 1, GRU 3 (z r h), LSTM 4 (i o f c)
    R          [num_directions, gates * hidden, hidden]
    B          [num_directions, 2 * gates * hidden]             W's bias then R's bias (absent: zeros)
    sequence_lens [batch]                                      absent: every sequence is seq_length long
    initial_h / initial_c [num_directions, batch, hidden]       absent: zeros
    P          [num_directions, 3 * hidden]                     LSTM peepholes (i o f; absent: zeros)
    Y          [seq_length, num_directions, batch, hidden]
    Y_h / Y_c  [num_directions, batch, hidden]

A sequence shorter than ``seq_length`` stops at its length: its later rows of Y are zero, and Y_h / Y_c hold its
last valid step (for the reverse direction, which starts at the sequence's last valid step, the step at 0); a
sequence of length 0 has all-zero outputs, Y_h / Y_c included (as in onnxruntime).

``reference`` runs the steps in numpy in float64 (inputs widened once, outputs rounded once).  ``plan`` runs float32
nodes on the device (:mod:`ortgpu.ops.ai_onnx._recurrent_plan`, WGSL in :mod:`ortgpu.ops.ai_onnx._recurrent_wgsl`): the
input projection of every step in one kernel, then the recurrence in one persistent dispatch (a workgroup per direction
and batch row, where the hidden size fits a workgroup) or one dispatch per step; ``sequence_lens`` is read at run time
(invalid lengths make the run raise ``InvalidArgumentError``).  float16 nodes run there too where the device has
``shader-f16`` (computed in float32); float64 nodes, empty dimensions and invalid nodes run on the CPU
(:class:`NotOnDevice`, with the reason).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from ._recurrent_cells import Activation, activations_for, decode_names
from ._recurrent_plan import device_plan as _device_plan
from ._recurrent_wgsl import Config

__all__ = ["RNN", "GRU", "LSTM"]

Array = np.ndarray
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class _Recurrent(Operator):
    """What RNN, GRU and LSTM share: input checks, directions, sequence lengths, layouts."""

    gates = 1
    default_activations: tuple[str, ...] = ("Tanh",)
    #: hidden-state-like inputs (initial_h, and initial_c for LSTM) by input position
    state_inputs: tuple[int, ...] = (5,)
    data_error_hint = "RNN, GRU and LSTM: sequence_lens must lie in [0, seq_length]"

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        cfg, functions = self._device_config(inputs, outputs, attrs, caps)
        return _device_plan(self, cfg, functions, inputs, outputs, attrs, caps)

    def _device_config(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
    ) -> tuple[Config, list[list[Activation]]]:
        """What the kernels bake in; :class:`NotOnDevice` for what they do not run (invalid nodes included:
        the reference then raises the typed error at run time)."""
        op = self.op_type

        def given(index: int) -> TensorInfo | None:
            return inputs[index] if len(inputs) > index else None

        x, w, r = given(0), given(1), given(2)
        if x is None or w is None or r is None:
            raise NotOnDevice(f"{op}: inputs X, W and R are required")
        # float32, or float16 where the device has shader-f16 (read and written as f16, computed in f32)
        dtype = x.dtype
        device_types = (np.float32, np.float16) if caps.has_f16 else (np.float32,)
        if dtype not in device_types:
            names = " and ".join(np.dtype(t).name for t in device_types)
            raise NotOnDevice(f"{op}: the WebGPU kernels take {names} only, not {dtype}; it runs on the CPU")
        for index in (1, 2, 3, 5, 6, 7):
            info = given(index)
            if info is not None and info.dtype != dtype:
                raise NotOnDevice(f"{op}: input {index} is {info.dtype}, X is {dtype}")
        lengths = given(4)
        if lengths is not None and lengths.dtype != np.int32:
            raise NotOnDevice(f"{op}: sequence_lens of dtype {lengths.dtype} (int32 expected)")
        layout = int(attrs.get("layout", 0)) if self.opset >= 14 else 0
        direction = attrs.get("direction", "forward")
        direction = direction.decode() if isinstance(direction, bytes) else str(direction)
        if layout not in (0, 1) or direction not in ("forward", "reverse", "bidirectional"):
            raise NotOnDevice(f"{op}: layout {layout} / direction {direction!r} is not defined")
        if len(x.shape) != 3 or len(w.shape) != 3 or len(r.shape) != 3:
            raise NotOnDevice(f"{op}: X, W and R must be 3-D")
        seq, batch, input_size = (x.shape[1], x.shape[0], x.shape[2]) if layout == 1 else x.shape
        directions = 2 if direction == "bidirectional" else 1
        hidden = int(attrs["hidden_size"]) if "hidden_size" in attrs else int(r.shape[-1])
        gh = self.gates * hidden
        state_shape = (batch, directions, hidden) if layout == 1 else (directions, batch, hidden)
        expected = {
            1: (directions, gh, input_size),
            2: (directions, gh, hidden),
            3: (directions, 2 * gh),
            4: (batch,),
            5: state_shape,
            6: state_shape,
            7: (directions, 3 * hidden),
        }
        for index, shape in expected.items():
            info = given(index)
            if info is not None and tuple(info.shape) != shape:
                raise NotOnDevice(f"{op}: input {index} has shape {info.shape}; expected {shape}")
        if min(seq, batch, input_size, hidden) <= 0:
            raise NotOnDevice(f"{op}: an empty dimension (seq {seq}, batch {batch}, hidden {hidden}); runs on the CPU")
        clip_value = attrs.get("clip")
        try:
            functions = activations_for(
                op,
                self.default_activations,
                directions,
                decode_names(attrs.get("activations")),
                [float(a) for a in attrs.get("activation_alpha", ()) or ()],
                [float(b) for b in attrs.get("activation_beta", ()) or ()],
                None if clip_value is None else float(clip_value),
            )
        except UnsupportedOpError as error:
            raise NotOnDevice(str(error)) from error
        if op == "LSTM":
            # h(C_t) takes no clip (see LSTM.step)
            functions = [[f, g, dataclasses.replace(h, clip=None)] for f, g, h in functions]
        present = tuple(len(outputs) > k and outputs[k].size > 0 for k in range(3))
        cfg = Config(
            op_type=op,
            gates=self.gates,
            seq=int(seq),
            batch=int(batch),
            input_size=int(input_size),
            hidden=hidden,
            directions=directions,
            direction=direction,
            layout=layout,
            has_bias=given(3) is not None,
            has_lengths=lengths is not None,
            has_h0=given(5) is not None,
            has_c0=op == "LSTM" and given(6) is not None,
            has_peepholes=op == "LSTM" and given(7) is not None,
            linear_before_reset=op == "GRU" and bool(int(attrs.get("linear_before_reset", 0))),
            input_forget=op == "LSTM" and bool(int(attrs.get("input_forget", 0))),
            outputs=(present[0], present[1], present[2] and op == "LSTM"),
            element="f16" if dtype == np.float16 else "f32",
        )
        return cfg, functions

    # -- the cell of one direction: subclasses ----------------------------------------------

    def step(
        self,
        x_proj: Array,
        states: list[Array],
        r: Array,
        rb: Array,
        peephole: Array | None,
        functions: list[Activation],
        attrs: Mapping[str, Any],
    ) -> list[Array]:
        """One time step: ``x_proj`` is ``x W^T + Wb`` for this step ([batch, gates*hidden]); returns the new
        states (hidden first)."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        op = self.op_type
        x, w, r = inputs[0], inputs[1], inputs[2]
        if x is None or w is None or r is None:
            raise ShapeError(f"{op}: inputs X, W and R are required")
        dtype = x.dtype
        if dtype not in _FLOATS:
            raise UnsupportedOpError(f"{op}: input type {dtype} is not supported (float16, float32, float64 are)")
        layout = int(attrs.get("layout", 0)) if self.opset >= 14 else 0
        if layout not in (0, 1):
            raise UnsupportedOpError(f"{op}: layout {layout} is not defined (0 or 1)")
        direction = attrs.get("direction", "forward")
        direction = direction.decode() if isinstance(direction, bytes) else str(direction)
        if direction not in ("forward", "reverse", "bidirectional"):
            raise UnsupportedOpError(f"{op}: direction {direction!r} is not defined (forward, reverse, bidirectional)")
        num_directions = 2 if direction == "bidirectional" else 1
        if x.ndim != 3 or w.ndim != 3 or r.ndim != 3:
            raise ShapeError(f"{op}: X, W and R must be 3-D (got ranks {x.ndim}, {w.ndim}, {r.ndim})")
        xs = np.swapaxes(x, 0, 1) if layout == 1 else x
        seq_length, batch, input_size = xs.shape
        hidden = int(attrs["hidden_size"]) if "hidden_size" in attrs else int(r.shape[-1])
        gh = self.gates * hidden
        if w.shape != (num_directions, gh, input_size):
            raise ShapeError(f"{op}: W has shape {w.shape}; expected {(num_directions, gh, input_size)}")
        if r.shape != (num_directions, gh, hidden):
            raise ShapeError(f"{op}: R has shape {r.shape}; expected {(num_directions, gh, hidden)}")
        bias = self._optional(inputs, 3, (num_directions, 2 * gh), "B")
        wb = bias[:, :gh] if bias is not None else np.zeros((num_directions, gh))
        rb = bias[:, gh:] if bias is not None else np.zeros((num_directions, gh))
        lengths = self._lengths(inputs, seq_length, batch)
        state_shape = (batch, num_directions, hidden) if layout == 1 else (num_directions, batch, hidden)
        initial = []
        for position in self.state_inputs:
            value = self._optional(inputs, position, state_shape, "initial state")
            if value is None:
                initial.append(np.zeros((num_directions, batch, hidden)))
            else:
                initial.append(np.swapaxes(value, 0, 1) if layout == 1 else value)
        peepholes = self._optional(inputs, 7, (num_directions, 3 * hidden), "P") if self.op_type == "LSTM" else None
        clip_value = attrs.get("clip")
        clip = None if clip_value is None else float(clip_value)
        functions = activations_for(
            op,
            self.default_activations,
            num_directions,
            decode_names(attrs.get("activations")),
            [float(a) for a in attrs.get("activation_alpha", ()) or ()],
            [float(b) for b in attrs.get("activation_beta", ()) or ()],
            clip,
        )

        wide_x = xs.astype(np.float64)
        # Every step's input projection at once: [directions, seq, batch, gates*hidden].
        x_proj = np.stack([wide_x @ w[d].astype(np.float64).T + wb[d] for d in range(num_directions)])
        reverse = [direction == "reverse" or d == 1 for d in range(num_directions)]
        y = np.zeros((seq_length, num_directions, batch, hidden))
        states = self.recur(
            x_proj,
            r.astype(np.float64),
            rb,
            lengths,
            [s.astype(np.float64) for s in initial],
            peepholes,
            functions,
            attrs,
            reverse,
            range(seq_length),
            y,
        )
        # A sequence of length 0 has zero final states, as in onnxruntime (not its initial state: the spec
        # leaves this case open, and zero matches its Y, which is all zeros).
        empty = (lengths <= 0)[None, :, None]
        finals = [np.where(empty, 0.0, state) for state in states]

        results = [y] + finals
        if layout == 1:
            results = [np.transpose(y, (2, 0, 1, 3))] + [np.swapaxes(f, 0, 1) for f in results[1:]]
        return [np.ascontiguousarray(v.astype(dtype)) for v in results]

    def _optional(self, inputs: Sequence[np.ndarray | None], index: int, shape: tuple[int, ...], what: str) -> Any:
        value = inputs[index] if len(inputs) > index else None
        if value is None:
            return None
        if value.shape != shape:
            raise ShapeError(f"{self.op_type}: {what} (input {index}) has shape {value.shape}; expected {shape}")
        return value.astype(np.float64)

    def _lengths(self, inputs: Sequence[np.ndarray | None], seq_length: int, batch: int) -> Array:
        value = inputs[4] if len(inputs) > 4 else None
        if value is None:
            return np.full(batch, seq_length, dtype=np.int64)
        if value.shape != (batch,):
            raise ShapeError(f"{self.op_type}: sequence_lens has shape {value.shape}; expected {(batch,)}")
        lengths = value.astype(np.int64)
        if np.any(lengths < 0) or np.any(lengths > seq_length):
            raise ShapeError(
                f"{self.op_type}: sequence_lens {lengths.tolist()} must lie in [0, seq_length={seq_length}]"
            )
        return lengths

    def recur(
        self,
        x_proj: Array,
        r: Array,
        rb: Array,
        lengths: Array,
        states: list[Array],
        peepholes: Array | None,
        functions: list[list[Activation]],
        attrs: Mapping[str, Any],
        reverse: Sequence[bool],
        steps: Iterable[int],
        y: Array | None,
    ) -> list[Array]:
        """Run ``steps`` (step numbers: step ``s`` is time ``s``, or ``seq - 1 - s`` in a reverse direction) of
        every direction; returns the new states ([directions, batch, hidden] each, hidden first) and writes Y's
        rows of those steps into ``y`` ([seq, directions, batch, hidden]) when given.

        ``x_proj`` is ``X W^T + Wb`` ([directions, seq, batch, gates*hidden]); past a sequence's length the
        state stays (Y_h is the last valid step) and Y's row is zero.  The reference runs every step at once;
        the device twins run the kernels' steps with it."""
        seq_length = x_proj.shape[1]
        states = [np.array(s, dtype=np.float64) for s in states]
        steps = list(steps)
        for d in range(x_proj.shape[0]):
            peephole = None if peepholes is None else peepholes[d]
            for s in steps:
                t = seq_length - 1 - s if reverse[d] else s
                new = self.step(x_proj[d, t], [st[d] for st in states], r[d], rb[d], peephole, functions[d], attrs)
                valid = (t < lengths)[:, None]
                for state, value in zip(states, new):
                    state[d] = np.where(valid, value, state[d])
                if y is not None:
                    y[t, d] = np.where(valid, new[0], 0.0)
        return states


@register
class RNN(_Recurrent):
    """RNN-7/14: ``H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)`` (f defaults to Tanh)."""

    op_type = "RNN"
    since_version = 7
    opset_changes = (14,)
    gates = 1
    default_activations = ("Tanh",)

    def step(
        self,
        x_proj: Array,
        states: list[Array],
        r: Array,
        rb: Array,
        peephole: Array | None,
        functions: list[Activation],
        attrs: Mapping[str, Any],
    ) -> list[Array]:
        (h,) = states
        return [functions[0](x_proj + h @ r.T + rb)]


@register
class GRU(_Recurrent):
    """GRU-7/14, gates z, r, h; ``linear_before_reset`` applies the reset gate after R_h's product."""

    op_type = "GRU"
    since_version = 7
    opset_changes = (14,)
    gates = 3
    default_activations = ("Sigmoid", "Tanh")

    def step(
        self,
        x_proj: Array,
        states: list[Array],
        r: Array,
        rb: Array,
        peephole: Array | None,
        functions: list[Activation],
        attrs: Mapping[str, Any],
    ) -> list[Array]:
        (h,) = states
        f, g = functions
        n = h.shape[1]
        zr = x_proj[:, : 2 * n] + h @ r[: 2 * n].T + rb[: 2 * n]
        z = f(zr[:, :n])
        reset = f(zr[:, n:])
        if int(attrs.get("linear_before_reset", 0)):
            candidate = g(x_proj[:, 2 * n :] + reset * (h @ r[2 * n :].T + rb[2 * n :]))
        else:
            candidate = g(x_proj[:, 2 * n :] + (reset * h) @ r[2 * n :].T + rb[2 * n :])
        return [(1.0 - z) * candidate + z * h]


@register
class LSTM(_Recurrent):
    """LSTM-7/14, gates i, o, f, c, with peepholes P (i, o, f) and ``input_forget`` (f = 1 - i); ``clip`` bounds
    the gates' and the candidate's activation inputs, not the cell state's output activation (as onnxruntime)."""

    op_type = "LSTM"
    since_version = 7
    opset_changes = (14,)
    gates = 4
    default_activations = ("Sigmoid", "Tanh", "Tanh")
    state_inputs = (5, 6)

    def step(
        self,
        x_proj: Array,
        states: list[Array],
        r: Array,
        rb: Array,
        peephole: Array | None,
        functions: list[Activation],
        attrs: Mapping[str, Any],
    ) -> list[Array]:
        h, c = states
        f, g, act_h = functions
        n = h.shape[1]
        pre = x_proj + h @ r.T + rb
        p_i, p_o, p_f = (peephole[:n], peephole[n : 2 * n], peephole[2 * n :]) if peephole is not None else (0, 0, 0)
        i = f(pre[:, :n] + p_i * c)
        if int(attrs.get("input_forget", 0)):
            # Coupled input and forget gates.
            forget = 1.0 - i
        else:
            forget = f(pre[:, 2 * n : 3 * n] + p_f * c)
        cell = forget * c + i * g(pre[:, 3 * n :])
        o = f(pre[:, n : 2 * n] + p_o * cell)
        # clip bounds the input of every activation but this one, h(C_t), as in onnxruntime (the spec's wording
        # would clip it too; onnxruntime is what models are checked against)
        return [o * act_h.function(cell), cell]
