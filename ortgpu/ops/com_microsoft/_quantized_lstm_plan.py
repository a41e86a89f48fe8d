"""DynamicQuantizeLSTM on the device: onnxruntime's integer products (:mod:`._quantized_lstm_math`) in WGSL.

Kernels, in order (``D`` directions, ``S`` steps, ``B`` batch rows, ``H`` hidden units, ``G = 4H`` gate columns):

1. ``prepare``: the initial states into the hidden-state and state scratch; ``sequence_lens`` checked (the status
   word);
2. ``constants``: ``Wb + Rb``, R's scales and zero points per column, the peepholes, into the state and quantization
   scratch;
3. ``x range``: one workgroup finds X's scale and zero point over its rows up to the longest sequence (read at run
   time) with DynamicQuantizeLinear's rule (:func:`~ortgpu.ops.ai_onnx.quantize.dynamic_range_wgsl`);
4. ``x quantize``: X's codes; 5. ``project``: ``f32(sum (qx - zx)(w - zw)) * (sx * sw)`` for every step;
6. per step, two dispatches (the step number in a uniform): ``h quantize``, one workgroup per direction, the range
   and codes of the previous hidden state of all batch rows; then ``step``, one invocation per (direction, row,
   unit): the four integer sums over H, the cell in onnxruntime's order, the new state into the other half of the
   hidden-state scratch;
7. ``final``: Y_h and Y_c.

Scratch (float32 unless said): 0 ``xp`` ``[D, S, B, G]``; 1 the hidden state, two halves ``[2, D, B, H]`` (step ``s``
reads half ``s % 2``); 2 ``state``: the cell state and the last valid hidden state ``[D, B, H]`` each, the peepholes
``[D, 3H]``, the fused bias and R's scales ``[D, G]`` each; 3 ``quant`` (u32): X's scale bits and zero point, each
direction's hidden-state scale and zero point, R's zero points ``[D, G]``, the hidden state's codes ``[D, B, H]``;
4 X's codes (u32 per element).

The quotients are exact (:data:`~ortgpu.ops.ai_onnx.quantize.EXACT_DIVISION_WGSL`), the integer sums exact, their
conversion to float rounded once; the activations are the recurrent operators' WGSL ones, within a few float32 ulps
of onnxruntime's, so a hidden-state value within that of a rounding tie may quantize one step apart.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, OpPlan, TensorInfo, check_loop_budget, flagging_twin
from .._tiling import grid_for_groups
from .._wgsl import load_function, workgroup_size_for
from ..ai_onnx._recurrent_cells import Activation
from ..ai_onnx._recurrent_wgsl import GROUP, BindingTable, activation_functions, flat_main
from ..ai_onnx.quantize import EXACT_DIVISION_WGSL, QUANTIZE_U8_WGSL, dynamic_range_wgsl, saturate_round
from ._quantized_lstm_math import cell, expand_parameter, fused_bias, integer_product, quantize_activations

__all__ = ["Shape", "device_plan", "codes_of"]

F32 = np.dtype(np.float32)
U32 = np.dtype(np.uint32)
Array = np.ndarray
Twin = Callable[[Sequence[np.ndarray], tuple[int, int, int]], None]


def codes_of(values: Array, scale: np.float32, zero: int) -> Array:
    """DynamicQuantizeLinear's codes of ``values`` with a given scale and zero point (uint8)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        quotient = (values.astype(F32) / np.float32(scale)).astype(F32)
        return saturate_round(np.rint(quotient.astype(np.float64)) + float(zero), np.dtype(np.uint8))


@dataclass(frozen=True)
class Shape:
    """What the kernels of one node bake in."""

    seq: int
    batch: int
    input_size: int
    hidden: int
    directions: int
    reverse: tuple[bool, ...]
    has_lengths: bool
    has_h0: bool
    has_c0: bool
    has_bias: bool
    has_peepholes: bool
    input_forget: bool
    #: per-channel (``[D, G]``) rather than per-direction parameters: W scale, W zero point, R scale, R zero point
    per_channel: tuple[bool, bool, bool, bool]
    #: the weights' dtypes (W, R): uint8 or int8
    weight_dtypes: tuple[np.dtype[Any], np.dtype[Any]]
    outputs: tuple[bool, bool, bool]

    @property
    def columns(self) -> int:
        return 4 * self.hidden

    @property
    def dbh(self) -> int:
        return self.directions * self.batch * self.hidden

    # state scratch (floats)
    @property
    def last(self) -> int:
        return self.dbh

    @property
    def peep(self) -> int:
        return 2 * self.dbh

    @property
    def bias(self) -> int:
        return self.peep + 3 * self.directions * self.hidden

    @property
    def r_scale(self) -> int:
        return self.bias + self.directions * self.columns

    @property
    def state_floats(self) -> int:
        return self.r_scale + self.directions * self.columns

    # quant scratch (words): 0 X's scale, 1 X's zero point, 2 + 2d / 3 + 2d direction d's hidden-state ones
    @property
    def r_zero(self) -> int:
        return 2 + 2 * self.directions

    @property
    def codes(self) -> int:
        return self.r_zero + self.directions * self.columns

    @property
    def quant_words(self) -> int:
        return self.codes + self.dbh

    @property
    def x_count(self) -> int:
        return self.seq * self.batch * self.input_size

    @property
    def xp_floats(self) -> int:
        return self.directions * self.seq * self.batch * self.columns


def _u(value: int) -> str:
    return f"{int(value)}u"


class _Table(BindingTable):
    """A kernel's bindings, with 8-bit inputs read as ``i32``."""

    def add_bytes(self, binding: Binding, name: str, dtype: np.dtype[Any]) -> None:
        """An 8-bit input read as ``i32`` through ``load_<name>(k)``."""
        self.add(binding, f"raw_{name}", "u32")
        self.lines.append(load_function(f"byte_{name}", f"raw_{name}", dtype))
        self.lines.append(f"fn load_{name}(k: u32) -> i32 {{ return i32(byte_{name}(k)); }}\n")


#: ``exact_f32(v)``: an i32 as f32 rounded once (WGSL leaves the rounding of ``f32(i32)`` to the device).
_EXACT_F32 = "fn exact_f32(v: i32) -> f32 { return f32(v >> 16u) * 65536.0 + f32(v & 65535); }\n"


def _dbj(shape: Shape) -> str:
    return (
        f"    let j = i % {_u(shape.hidden)};\n"
        f"    let b = (i / {_u(shape.hidden)}) % {_u(shape.batch)};\n"
        f"    let d = i / {_u(shape.batch * shape.hidden)};\n"
    )


def _length(shape: Shape) -> str:
    return "lens[b]" if shape.has_lengths else f"{shape.seq}i"


class _Views:
    """Typed views of a kernel's bound buffers (the twins' side)."""

    def __init__(self, bindings: Sequence[Binding], arrays: Sequence[np.ndarray]) -> None:
        self.slots: dict[tuple[str, int], int] = {(b.kind, b.index): slot for slot, b in enumerate(bindings)}
        self.arrays = arrays

    def __call__(self, kind: str, index: int, dtype: Any, count: int, offset: int = 0) -> Array:
        raw = self.arrays[self.slots[(kind, index)]]
        size = np.dtype(dtype).itemsize
        view: Array = raw[offset * size : (offset + count) * size].view(dtype)
        return view


class _Node:
    """The kernels of one node: WGSL and twins side by side."""

    def __init__(self, shape: Shape, functions: list[list[Activation]], caps: DeviceCaps) -> None:
        self.shape, self.functions, self.caps = shape, functions, caps
        self.workgroup = workgroup_size_for(caps.limits)
        self.kernels: list[KernelSpec] = []

    def _add(
        self, name: str, table: _Table, body: str, grid: tuple[int, int, int], twin: Twin, params: bytes = b""
    ) -> None:
        storage = sum(1 for b in table.bindings if b.kind != "params")
        if storage > self.caps.limits.max_storage_buffers_per_shader_stage:
            raise NotOnDevice(f"DynamicQuantizeLSTM: a kernel needs {storage} storage buffers; the device allows "
                              f"{self.caps.limits.max_storage_buffers_per_shader_stage}")  # fmt: skip
        bindings = tuple(table.bindings)
        if any(b.kind == "status" for b in bindings):
            twin = flagging_twin(twin, bindings)
        self.kernels.append(
            KernelSpec(f"DynamicQuantizeLSTM {name}", table.text() + body, grid, bindings, twin, params)
        )

    def _flat_grid(self, count: int) -> tuple[int, int, int]:
        return grid_for_groups(-(-count // GROUP), self.caps)

    def _lengths(self, views: _Views) -> Array:
        s = self.shape
        if not s.has_lengths:
            return np.full(s.batch, s.seq, dtype=np.int64)
        return views("input", 4, np.int32, s.batch).astype(np.int64)

    # -- 1. prepare -----------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        s = self.shape
        table = _Table("f32")
        if s.has_h0:
            table.add(Binding("input", 5), "init_h")
        if s.has_c0:
            table.add(Binding("input", 6), "init_c")
        if s.has_lengths:
            table.add(Binding("input", 4), "lens", "i32")
            table.add(Binding("status"), "status", "atomic<u32>", writable=True)
        table.add(Binding("scratch", 1), "hbuf", writable=True)
        table.add(Binding("scratch", 2), "state", writable=True)
        grid = self._flat_grid(s.dbh)
        body = (
            flat_main(s.dbh, grid)
            + _dbj(s)
            + (
                f"    hbuf[i] = {'init_h[i]' if s.has_h0 else '0.0'};\n"
                f"    state[i] = {'init_c[i]' if s.has_c0 else '0.0'};\n"
                f"    state[{_u(s.last)} + i] = 0.0;\n"
            )
        )
        if s.has_lengths:
            body += (
                "    if (d == 0u && j == 0u) {\n"
                "        let len = lens[b];\n"
                f"        if (len < 0i || len > {s.seq}i) {{ atomicOr(&status[0], 1u); }}\n"
                "    }\n"
            )
        bindings = tuple(table.bindings)

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = _Views(bindings, arrays)
            views("scratch", 1, F32, s.dbh)[...] = views("input", 5, F32, s.dbh) if s.has_h0 else 0.0
            state = views("scratch", 2, F32, 2 * s.dbh)
            state[: s.dbh] = views("input", 6, F32, s.dbh) if s.has_c0 else 0.0
            state[s.dbh :] = 0.0
            lengths = self._lengths(views)
            if np.any(lengths < 0) or np.any(lengths > s.seq):
                raise InvalidArgumentError(
                    f"DynamicQuantizeLSTM: sequence_lens {lengths.tolist()} must lie in [0, seq_length={s.seq}]"
                )

        self._add("prepare", table, body + "}\n", grid, twin)

    # -- 2. constants ---------------------------------------------------------------------------------------------

    def constants(self) -> None:
        s = self.shape
        G, H, D = s.columns, s.hidden, s.directions
        table = _Table("f32")
        if s.has_bias:
            table.add(Binding("input", 3), "bias")
        if s.has_peepholes:
            table.add(Binding("input", 7), "peep")
        table.add(Binding("input", 10), "r_scale")
        table.add_bytes(Binding("input", 11), "rz", s.weight_dtypes[1])
        table.add(Binding("scratch", 2), "state", writable=True)
        table.add(Binding("scratch", 3), "quant", "u32", writable=True)
        count = D * G
        grid = self._flat_grid(count)
        bias = f"bias[d * {_u(2 * G)} + n] + bias[d * {_u(2 * G)} + {_u(G)} + n]" if s.has_bias else "0.0"
        peep = f"peep[d * {_u(3 * H)} + n]" if s.has_peepholes else "0.0"
        body = flat_main(count, grid) + (
            f"    let n = i % {_u(G)};\n"
            f"    let d = i / {_u(G)};\n"
            f"    state[{_u(s.bias)} + i] = {bias};\n"
            f"    state[{_u(s.r_scale)} + i] = r_scale[{'i' if s.per_channel[2] else 'd'}];\n"
            f"    quant[{_u(s.r_zero)} + i] = bitcast<u32>(load_rz({'i' if s.per_channel[3] else 'd'}));\n"
            f"    if (n < {_u(3 * H)}) {{ state[{_u(s.peep)} + d * {_u(3 * H)} + n] = {peep}; }}\n"
            "}\n"
        )
        bindings = tuple(table.bindings)

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = _Views(bindings, arrays)
            bias_value = views("input", 3, F32, 2 * count) if s.has_bias else None
            views("scratch", 2, F32, count, s.bias)[...] = fused_bias(bias_value, D, H).reshape(-1)
            scales = views("input", 10, F32, count if s.per_channel[2] else D)
            views("scratch", 2, F32, count, s.r_scale)[...] = expand_parameter(scales, D, G).reshape(-1)
            zeros = views("input", 11, s.weight_dtypes[1], count if s.per_channel[3] else D).astype(np.int32)
            views("scratch", 3, np.int32, count, s.r_zero)[...] = expand_parameter(zeros, D, G).reshape(-1)
            peep = views("scratch", 2, F32, 3 * H * D, s.peep)
            peep[...] = views("input", 7, F32, 3 * H * D) if s.has_peepholes else 0.0

        self._add("constants", table, body, grid, twin)

    # -- 3. X's range, 4. its codes, 5. the input projection ------------------------------------------------------

    def x_range(self) -> None:
        s = self.shape
        table = _Table("f32")
        table.add(Binding("input", 0), "x", "u32")
        if s.has_lengths:
            table.add(Binding("input", 4), "lens", "i32")
        table.add(Binding("scratch", 3), "quant", "u32", writable=True)
        workgroup = self.workgroup
        check_loop_budget("DynamicQuantizeLSTM", -(-s.x_count // workgroup) + 2 * workgroup.bit_length(), self.caps)
        longest = (
            f"    var longest = 0u;\n    for (var b = 0u; b < {_u(s.batch)}; b = b + 1u) {{\n"
            f"        longest = max(longest, u32(clamp(lens[b], 0i, {s.seq}i)));\n    }}\n"
            if s.has_lengths
            else f"    let longest = {_u(s.seq)};\n"
        )
        body = (
            dynamic_range_wgsl(workgroup)
            + "fn range_bits(i: u32) -> u32 { return x[i]; }\n"
            + f"@compute @workgroup_size({workgroup})\n"
            "fn main(@builtin(local_invocation_index) lid: u32) {\n"
            + longest
            + f"    let found = dynamic_range(lid, 0u, longest * {_u(s.batch * s.input_size)});\n"
            "    if (lid == 0u) {\n        quant[0] = found.x;\n        quant[1] = found.y;\n    }\n}\n"
        )
        bindings = tuple(table.bindings)

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = _Views(bindings, arrays)
            longest_rows = int(np.clip(self._lengths(views), 0, s.seq).max()) if s.batch else 0
            x = views("input", 0, F32, longest_rows * s.batch * s.input_size)
            _, scale, zero = quantize_activations(x)
            views("scratch", 3, F32, 1)[0] = scale
            views("scratch", 3, U32, 1, 1)[0] = zero

        self._add("x range", table, body, (1, 1, 1), twin)

    def x_quantize(self) -> None:
        s = self.shape
        table = _Table("f32")
        table.add(Binding("input", 0), "x", "u32")
        table.add(Binding("scratch", 3), "quant", "u32")
        table.add(Binding("scratch", 4), "qx", "u32", writable=True)
        grid = self._flat_grid(s.x_count)
        body = (
            EXACT_DIVISION_WGSL
            + QUANTIZE_U8_WGSL
            + flat_main(s.x_count, grid)
            + "    qx[i] = quantize_u8(x[i], quant[0], quant[1]);\n}\n"
        )
        bindings = tuple(table.bindings)

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = _Views(bindings, arrays)
            scale, zero = views("scratch", 3, F32, 1)[0], int(views("scratch", 3, U32, 1, 1)[0])
            codes = codes_of(views("input", 0, F32, s.x_count), scale, zero)
            views("scratch", 4, U32, s.x_count)[...] = codes

        self._add("x quantize", table, body, grid, twin)

    def project(self) -> None:
        s = self.shape
        G, B, S, IN = s.columns, s.batch, s.seq, s.input_size
        check_loop_budget("DynamicQuantizeLSTM", IN, self.caps)
        table = _Table("f32")
        table.add(Binding("scratch", 4), "qx", "u32")
        table.add_bytes(Binding("input", 1), "w", s.weight_dtypes[0])
        table.add(Binding("input", 8), "w_scale")
        table.add_bytes(Binding("input", 9), "wz", s.weight_dtypes[0])
        table.add(Binding("scratch", 3), "quant", "u32")
        table.add(Binding("scratch", 0), "xp", writable=True)
        grid = self._flat_grid(s.xp_floats)
        channel = f"d * {_u(G)} + n"
        body = (
            _EXACT_F32 + flat_main(s.xp_floats, grid) + f"    let n = i % {_u(G)};\n"
            f"    let b = (i / {_u(G)}) % {_u(B)};\n"
            f"    let t = (i / {_u(G * B)}) % {_u(S)};\n"
            f"    let d = i / {_u(G * B * S)};\n"
            "    let zx = i32(quant[1]);\n"
            f"    let zw = load_wz({channel if s.per_channel[1] else 'd'});\n"
            f"    let row = (t * {_u(B)} + b) * {_u(IN)};\n"
            "    var acc = 0i;\n"
            f"    for (var k = 0u; k < {_u(IN)}; k = k + 1u) {{\n"
            f"        acc = acc + (i32(qx[row + k]) - zx) * (load_w((d * {_u(IN)} + k) * {_u(G)} + n) - zw);\n"
            "    }\n"
            f"    let multiplier = bitcast<f32>(quant[0]) * w_scale[{channel if s.per_channel[0] else 'd'}];\n"
            "    xp[i] = exact_f32(acc) * multiplier;\n}\n"
        )
        bindings = tuple(table.bindings)

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = _Views(bindings, arrays)
            D = s.directions
            scale, zero = views("scratch", 3, F32, 1)[0], int(views("scratch", 3, U32, 1, 1)[0])
            codes = views("scratch", 4, U32, s.x_count).reshape(S * B, IN)
            w = views("input", 1, s.weight_dtypes[0], D * IN * G).reshape(D, IN, G)
            w_scale = expand_parameter(views("input", 8, F32, D * G if s.per_channel[0] else D), D, G)
            w_zero = expand_parameter(views("input", 9, s.weight_dtypes[0], D * G if s.per_channel[1] else D), D, G)
            xp = views("scratch", 0, F32, s.xp_floats).reshape(D, S * B, G)
            for d in range(D):
                xp[d] = integer_product(codes, zero, w[d], w_zero[d].astype(np.int64), (scale * w_scale[d]).astype(F32))

        self._add("project", table, body, grid, twin)

    # -- 6. the steps ---------------------------------------------------------------------------------------------

    def h_quantize(self, step: int) -> None:
        s = self.shape
        bh = s.batch * s.hidden
        workgroup = self.workgroup
        check_loop_budget("DynamicQuantizeLSTM", 2 * -(-bh // workgroup) + 2 * workgroup.bit_length(), self.caps)
        table = _Table("f32")
        table.add(Binding("params"), "params")
        table.add(Binding("scratch", 1), "hbuf")
        table.add(Binding("scratch", 3), "quant", "u32", writable=True)
        body = (
            dynamic_range_wgsl(workgroup)
            + QUANTIZE_U8_WGSL
            + "fn range_bits(i: u32) -> u32 { return bitcast<u32>(hbuf[i]); }\n"
            + f"@compute @workgroup_size({workgroup})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {\n"
            "    let d = wid.x;\n"
            f"    let first = (params.x % 2u) * {_u(s.dbh)} + d * {_u(bh)};\n"
            f"    let found = dynamic_range(lid, first, {_u(bh)});\n"
            "    if (lid == 0u) {\n        quant[2u + 2u * d] = found.x;\n        quant[3u + 2u * d] = found.y;\n    }\n"
            f"    for (var k = lid; k < {_u(bh)}; k = k + {_u(workgroup)}) {{\n"
            f"        quant[{_u(s.codes)} + d * {_u(bh)} + k] = quantize_u8(range_bits(first + k), found.x, found.y);\n"
            "    }\n}\n"
        )
        bindings = tuple(table.bindings)

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = _Views(bindings, arrays)
            hidden = views("scratch", 1, F32, s.dbh, (step % 2) * s.dbh).reshape(s.directions, bh)
            for d in range(s.directions):
                codes, scale, zero = quantize_activations(hidden[d])
                views("scratch", 3, F32, 1, 2 + 2 * d)[0] = scale
                views("scratch", 3, U32, 1, 3 + 2 * d)[0] = zero
                views("scratch", 3, U32, bh, s.codes + d * bh)[...] = codes

        self._add("h quantize", table, body, (s.directions, 1, 1), twin, struct.pack("<4I", step, 0, 0, 0))

    def step(self, step: int) -> None:
        s = self.shape
        G, H, B, S, D = s.columns, s.hidden, s.batch, s.seq, s.directions
        check_loop_budget("DynamicQuantizeLSTM", H, self.caps)
        table = _Table("f32")
        table.add(Binding("params"), "params")
        table.add(Binding("scratch", 0), "xp")
        table.add(Binding("scratch", 1), "hbuf", writable=True)
        table.add(Binding("scratch", 2), "state", writable=True)
        table.add(Binding("scratch", 3), "quant", "u32")
        table.add_bytes(Binding("input", 2), "r", s.weight_dtypes[1])
        if s.has_lengths:
            table.add(Binding("input", 4), "lens", "i32")
        if s.outputs[0]:
            table.add(Binding("output", 0), "y", writable=True)
        grid = self._flat_grid(s.dbh)
        reverse = " || ".join(f"d == {d}u" for d, r in enumerate(s.reverse) if r) or "false"
        gates = "iofc"
        lines = [
            "    let s = params.x;\n",
            f"    let origin = (s % 2u) * {_u(s.dbh)};\n",
            f"    let dest = {_u(s.dbh)} - origin;\n",
            f"    let len = {_length(s)};\n",
            "    let valid = i32(s) < len;\n",
            f"    let t = select(s, u32(len) - 1u - s, valid && ({reverse}));\n",
            "    let zh = i32(quant[3u + 2u * d]);\n",
            "    let sh = bitcast<f32>(quant[2u + 2u * d]);\n",
            f"    let codes = {_u(s.codes)} + (d * {_u(B)} + b) * {_u(H)};\n",
            f"    let column = d * {_u(G)} + j;\n",
        ]
        for g, name in enumerate(gates):
            lines.append(f"    let z{name} = bitcast<i32>(quant[{_u(s.r_zero)} + column + {_u(g * H)}]);\n")
            lines.append(f"    var a{name} = 0i;\n")
        lines.append(f"    for (var k = 0u; k < {_u(H)}; k = k + 1u) {{\n")
        lines.append("        let q = i32(quant[codes + k]) - zh;\n")
        lines.append(f"        let row = (d * {_u(H)} + k) * {_u(G)} + j;\n")
        for g, name in enumerate(gates):
            lines.append(f"        a{name} = a{name} + q * (load_r(row + {_u(g * H)}) - z{name});\n")
        lines.append("    }\n")
        lines.append(f"    let xrow = ((d * {_u(S)} + t) * {_u(B)} + b) * {_u(G)} + j;\n")
        for g, name in enumerate(gates):
            lines.append(
                f"    let p{name} = xp[xrow + {_u(g * H)}] + exact_f32(a{name}) * "
                f"(sh * state[{_u(s.r_scale)} + column + {_u(g * H)}]);\n"
            )
            lines.append(f"    let b{name} = state[{_u(s.bias)} + column + {_u(g * H)}];\n")
        lines.append("    let c = state[i];\n")
        peep = f"{_u(s.peep)} + d * {_u(3 * H)} + j"

        def gate(name: str, index: int, state: str) -> str:
            if s.has_peepholes:
                return f"(p{name} + {state} * state[{peep} + {_u(index * H)}]) + b{name}"
            return f"p{name} + b{name}"

        forget = "1.0 - ig" if s.input_forget else f"act0({gate('f', 2, 'c')}, d)"
        lines += [
            f"    let ig = act0({gate('i', 0, 'c')}, d);\n",
            f"    let fg = {forget};\n",
            "    let cg = act1(pc + bc, d);\n",
            "    let cn = c * fg + ig * cg;\n",
            f"    let og = act0({gate('o', 1, 'cn')}, d);\n",
            "    let hn = og * act2(cn, d);\n",
            "    if (valid) {\n",
            "        state[i] = cn;\n",
            f"        state[{_u(s.last)} + i] = hn;\n",
            "        hbuf[dest + i] = hn;\n",
        ]
        if s.outputs[0]:
            lines.append(f"        y[((t * {_u(D)} + d) * {_u(B)} + b) * {_u(H)} + j] = hn;\n")
        lines.append("    } else {\n")
        # an ended row reads 0 where onnxruntime reads it from Y (and where it never started), else its last state
        ended = "true" if s.outputs[0] else "len <= 0i"
        lines.append(f"        hbuf[dest + i] = select(hbuf[origin + i], 0.0, {ended});\n")
        if s.outputs[0]:
            lines.append(f"        y[((s * {_u(D)} + d) * {_u(B)} + b) * {_u(H)} + j] = 0.0;\n")
        lines.append("    }\n}\n")
        body = _EXACT_F32 + activation_functions(self.functions) + flat_main(s.dbh, grid) + _dbj(s) + "".join(lines)
        bindings = tuple(table.bindings)

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = _Views(bindings, arrays)
            lengths = np.clip(self._lengths(views), 0, S)
            source, target = (step % 2) * s.dbh, s.dbh - (step % 2) * s.dbh
            hidden_in = views("scratch", 1, F32, s.dbh, source).reshape(D, B, H)
            hidden_out = views("scratch", 1, F32, s.dbh, target).reshape(D, B, H)
            cells = views("scratch", 2, F32, s.dbh).reshape(D, B, H)
            last = views("scratch", 2, F32, s.dbh, s.last).reshape(D, B, H)
            peepholes = views("scratch", 2, F32, 3 * H * D, s.peep).reshape(D, 3 * H)
            bias = views("scratch", 2, F32, D * G, s.bias).reshape(D, G)
            r_scale = views("scratch", 2, F32, D * G, s.r_scale).reshape(D, G)
            r_zero = views("scratch", 3, np.int32, D * G, s.r_zero).reshape(D, G)
            codes = views("scratch", 3, U32, s.dbh, s.codes).reshape(D, B, H)
            r = views("input", 2, s.weight_dtypes[1], D * H * G).reshape(D, H, G)
            xp = views("scratch", 0, F32, s.xp_floats).reshape(D, S, B, G)
            y = views("output", 0, F32, S * s.dbh).reshape(S, D, B, H) if s.outputs[0] else None
            valid = step < lengths
            for d in range(D):
                scale = views("scratch", 3, F32, 1, 2 + 2 * d)[0]
                zero = int(views("scratch", 3, U32, 1, 3 + 2 * d)[0])
                product = integer_product(codes[d], zero, r[d], r_zero[d], (scale * r_scale[d]).astype(F32))
                times = [n - 1 - step if (ok and s.reverse[d]) else step for n, ok in zip(lengths, valid)]
                pre = (xp[d, times, np.arange(B)] + product).astype(F32)
                peep = peepholes[d] if s.has_peepholes else None
                h_new, c_new = cell(pre, cells[d], peep, bias[d], self.functions[d], s.input_forget)
                ended = np.where(((lengths <= 0) | s.outputs[0])[:, None], np.float32(0), hidden_in[d])
                rows = valid[:, None]
                hidden_out[d] = np.where(rows, h_new, ended)
                cells[d] = np.where(rows, c_new, cells[d])
                last[d] = np.where(rows, h_new, last[d])
                if y is not None:
                    for b in range(B):
                        y[times[b], d, b] = h_new[b] if valid[b] else 0.0

        self._add("step", table, body, grid, twin, struct.pack("<4I", step, 0, 0, 0))

    # -- 7. final -------------------------------------------------------------------------------------------------

    def final(self) -> None:
        s = self.shape
        table = _Table("f32")
        table.add(Binding("scratch", 2), "state")
        if s.has_lengths:
            table.add(Binding("input", 4), "lens", "i32")
        for index, name in ((1, "y_h"), (2, "y_c")):
            if s.outputs[index]:
                table.add(Binding("output", index), name, writable=True)
        grid = self._flat_grid(s.dbh)
        lines = [f"    let len = {_length(s)};\n"]
        if s.outputs[1]:
            lines.append(f"    y_h[i] = select(state[{_u(s.last)} + i], 0.0, len <= 0i);\n")
        if s.outputs[2]:
            lines.append("    y_c[i] = select(state[i], 0.0, len <= 0i);\n")
        body = flat_main(s.dbh, grid) + _dbj(s) + "".join(lines) + "}\n"
        bindings = tuple(table.bindings)

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = _Views(bindings, arrays)
            started = np.repeat(self._lengths(views) > 0, s.hidden)
            started = np.tile(started, s.directions)
            if s.outputs[1]:
                views("output", 1, F32, s.dbh)[...] = np.where(started, views("scratch", 2, F32, s.dbh, s.last), 0.0)
            if s.outputs[2]:
                views("output", 2, F32, s.dbh)[...] = np.where(started, views("scratch", 2, F32, s.dbh), 0.0)

        self._add("final", table, body, grid, twin)


def device_plan(
    shape: Shape, functions: list[list[Activation]], infos: Sequence[TensorInfo | None], caps: DeviceCaps
) -> OpPlan:
    """The kernels of one node (see the module docstring); :class:`NotOnDevice` where a buffer or loop exceeds the
    device's limits."""
    limits = caps.limits
    scratch = (
        shape.xp_floats * 4,
        2 * shape.dbh * 4,
        shape.state_floats * 4,
        shape.quant_words * 4,
        max(shape.x_count, 1) * 4,
    )
    for info in infos:
        if info is not None and info.nbytes > limits.max_storage_buffer_binding_size:
            raise NotOnDevice(f"DynamicQuantizeLSTM: a tensor of {info.nbytes} bytes exceeds the storage binding limit")
    if max(scratch) > limits.max_storage_buffer_binding_size:
        raise NotOnDevice("DynamicQuantizeLSTM: its scratch buffers exceed the device's storage binding limit")
    node = _Node(shape, functions, caps)
    node.prepare()
    if any(shape.outputs):
        node.constants()
        node.x_range()
        node.x_quantize()
        node.project()
        for step in range(shape.seq):
            node.h_quantize(step)
            node.step(step)
        if shape.outputs[1] or shape.outputs[2]:
            node.final()
    kernels = tuple(node.kernels)
    # the twins hold the node: dropping its list leaves no cycle, so the kernels (and their cached pipelines) go as
    # soon as the plan does
    node.kernels.clear()
    return OpPlan(kernels=kernels, scratch_sizes=scratch)
