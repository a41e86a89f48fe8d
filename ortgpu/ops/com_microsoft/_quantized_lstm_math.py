"""DynamicQuantizeLSTM's arithmetic in numpy, as onnxruntime's CPU kernel does it (float32 throughout).

onnxruntime runs the node as its float LSTM with two integer products:

* ``X W``: every row of X up to the longest sequence (``max(sequence_lens)`` steps, padding rows of shorter
  sequences included) quantized to uint8 at once, scale and zero point from that block's range (which always holds
  0: DynamicQuantizeLinear's rule); ``f32(sum (qx - zx)(w - zw)) * (sx * sw)``, the multiplier rounded first;
* ``H R`` at every step: the previous hidden state of all batch rows quantized the same way, its product added to
  the step's ``X W`` row.

The previous hidden state of a row whose sequence has ended is 0 when Y is an output (onnxruntime reads it from Y,
where such rows are zero) and the row's last state otherwise; both can move the step's range.  Then, per unit: the
peephole term, the bias ``Wb + Rb`` (summed first), ``clip`` and the gate activations in onnxruntime's order.

onnxruntime splits the batch rows among its threads (more than 4 rows, or 2 to 4 with a hidden size up to 256) and
quantizes each thread's rows of H on their own range, so its results depend on its thread count by about one
quantization step.  This module follows one thread (``intra_op_num_threads=1``): one range over all rows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .._kernel import TensorInfo
from ..ai_onnx._recurrent_cells import Activation
from ..ai_onnx.quantize import DynamicQuantizeLinear

__all__ = ["quantize_activations", "integer_product", "fused_bias", "cell", "quantized_lstm", "expand_parameter"]

F32 = np.float32
Array = np.ndarray


def quantize_activations(values: Array) -> tuple[Array, np.float32, int]:
    """(uint8 codes, scale, zero point) of float32 ``values`` quantized on their own range."""
    flat = np.ascontiguousarray(values, dtype=F32).reshape(-1)
    codes, scale, zero = DynamicQuantizeLinear().reference([flat], {}, [TensorInfo(flat.shape, np.dtype(np.uint8))])
    return codes.reshape(np.shape(values)), np.float32(scale), int(zero)


def expand_parameter(value: Array, directions: int, columns: int) -> Array:
    """A per-tensor ``[directions]`` or per-channel ``[directions, columns]`` parameter as ``[directions, columns]``."""
    return np.broadcast_to(np.asarray(value).reshape(directions, -1), (directions, columns))


def integer_product(codes: Array, zero: int, weights: Array, weight_zero: Array, multiplier: Array) -> Array:
    """``f32(sum_k (codes - zero)(weights - weight_zero)) * multiplier``: codes ``[M, K]``, weights ``[K, N]``,
    ``weight_zero`` and ``multiplier`` (float32) per column ``[N]``; the sum exact, converted and scaled with one
    rounding each."""
    a = codes.astype(np.int64) - int(zero)
    b = weights.astype(np.int64) - np.asarray(weight_zero, dtype=np.int64)
    product: Array = np.matmul(a, b).astype(F32) * np.asarray(multiplier, dtype=F32)
    return product.astype(F32)


def fused_bias(bias: Array | None, directions: int, hidden: int) -> Array:
    """``Wb + Rb`` per direction ``[directions, 4*hidden]`` in float32 (zeros without a bias)."""
    if bias is None:
        return np.zeros((directions, 4 * hidden), F32)
    b = np.asarray(bias, dtype=F32).reshape(directions, 8 * hidden)
    return (b[:, : 4 * hidden] + b[:, 4 * hidden :]).astype(F32)


def _apply(function: Activation, values: Array) -> Array:
    return np.asarray(function(values.astype(np.float64))).astype(F32)


def cell(
    pre: Array, c_prev: Array, peephole: Array | None, bias: Array, functions: Sequence[Activation], input_forget: bool
) -> tuple[Array, Array]:
    """(h, c) of one step from the gates' pre-activations ``pre`` ``[rows, 4*hidden]`` (i, o, f, c; products only,
    no bias), float32 as onnxruntime orders it: peephole term, bias, clip, activation; the output gate's peephole
    reads the new cell state.  ``functions``: f, g, h (h without clip)."""
    hidden = c_prev.shape[-1]
    gate = [pre[:, g * hidden : (g + 1) * hidden].astype(F32) for g in range(4)]
    bias_of = [bias[g * hidden : (g + 1) * hidden] for g in range(4)]
    f, g, h = functions

    def activate(function: Activation, value: Array, index: int, state: Array | None, peep: int) -> Array:
        if peephole is not None and state is not None:
            value = (value + (state * peephole[peep * hidden : (peep + 1) * hidden]).astype(F32)).astype(F32)
        return _apply(function, (value + bias_of[index]).astype(F32))

    i = activate(f, gate[0], 0, c_prev, 0)
    forget = (F32(1) - i).astype(F32) if input_forget else activate(f, gate[2], 2, c_prev, 2)
    candidate = activate(g, gate[3], 3, None, 0)
    c = ((c_prev * forget).astype(F32) + (i * candidate).astype(F32)).astype(F32)
    o = activate(f, gate[1], 1, c, 1)
    return (o * _apply(h, c)).astype(F32), c


def step_time(step: int, length: int, reverse: bool) -> int:
    """The time a row of length ``length`` is at on ``step`` (a reverse direction walks its own length back)."""
    return length - 1 - step if reverse else step


def quantized_lstm(
    x: Array,
    lengths: Array,
    weights: tuple[Array, Array, Array],
    recurrent: tuple[Array, Array, Array],
    bias: Array,
    peepholes: Array | None,
    initial: tuple[Array, Array],
    functions: Sequence[Sequence[Activation]],
    reverse: Sequence[bool],
    input_forget: bool,
    y_present: bool,
) -> tuple[Array, Array, Array]:
    """(Y ``[seq, directions, batch, hidden]``, Y_h, Y_c) of the node.

    ``x`` ``[seq, batch, input]`` float32; ``lengths`` ``[batch]`` (valid); ``weights`` / ``recurrent`` are
    (bytes ``[directions, rows, 4*hidden]``, zero points and scales expanded to ``[directions, 4*hidden]``);
    ``bias`` from :func:`fused_bias`; ``initial`` the states ``[directions, batch, hidden]`` float32."""
    seq, batch, _ = x.shape
    directions, hidden = initial[0].shape[0], initial[0].shape[2]
    columns = 4 * hidden
    y = np.zeros((seq, directions, batch, hidden), F32)
    y_h = np.zeros((directions, batch, hidden), F32)
    y_c = np.zeros((directions, batch, hidden), F32)
    longest = int(lengths.max()) if batch else 0
    if longest == 0:
        return y, y_h, y_c
    codes, x_scale, x_zero = quantize_activations(x[:longest])
    w, w_zero, w_scale = weights
    r, r_zero, r_scale = recurrent
    for d in range(directions):
        multiplier = (x_scale * w_scale[d]).astype(F32)
        xp = integer_product(codes.reshape(longest * batch, x.shape[2]), x_zero, w[d], w_zero[d], multiplier)
        xp = xp.reshape(longest, batch, columns)
        h = initial[0][d].astype(F32).copy()
        c = initial[1][d].astype(F32).copy()
        last = np.zeros((batch, hidden), F32)
        peep = None if peepholes is None else peepholes[d].astype(F32)
        for s in range(longest):
            h_codes, h_scale, h_zero = quantize_activations(h)
            product = integer_product(h_codes, h_zero, r[d], r_zero[d], (h_scale * r_scale[d]).astype(F32))
            valid = s < lengths
            times = [step_time(s, int(n), reverse[d]) if ok else s for n, ok in zip(lengths, valid)]
            pre = (xp[times, np.arange(batch)] + product).astype(F32)
            h_new, c_new = cell(pre, c, peep, bias[d], functions[d], input_forget)
            rows = valid[:, None]
            last = np.where(rows, h_new, last)
            c = np.where(rows, c_new, c)
            # an ended row: 0 where onnxruntime reads it from Y (and for a row that never started), else its state
            ended = np.where(((lengths == 0) | y_present)[:, None], F32(0), h)
            h = np.where(rows, h_new, ended).astype(F32)
            for b in np.flatnonzero(valid):
                y[times[b], d, b] = h_new[b]
        y_h[d], y_c[d] = last, np.where((lengths > 0)[:, None], c, 0.0)
    return y, y_h, y_c
