"""WGSL of the recurrent operators (RNN, GRU, LSTM): the kernels' text and bindings, no numpy.

A node runs as

1. ``prepare``: the initial states (or zeros) into the state scratch in the kernels' own layout
   ``[direction, batch, hidden]``, LSTM's cell state, peepholes and GRU's ``linear_before_reset`` recurrent bias
   into the ``aux`` scratch; ``sequence_lens`` outside ``[0, seq_length]`` sets the program's status word;
2. ``project``: ``X W^T + Wb (+ Rb)`` for every direction and step at once into the ``xp`` scratch
   ``[direction, step, batch, gates*hidden]`` (R's bias is folded in wherever it is added outside the reset
   gate's product, i.e. everywhere but GRU's ``linear_before_reset`` candidate);
3. the recurrence, either

   * **persistent** (:func:`persistent_kernel`): one dispatch, one workgroup per (direction, batch row) looping
     over all steps; invocation ``j`` owns hidden unit ``j`` (and its cell state, in a register), the hidden
     state lives in ``var<workgroup>`` memory, two ``workgroupBarrier()`` per step; or
   * **per step** (:func:`step_kernel`, :func:`final_kernel`): one dispatch per step (two for GRU without
     ``linear_before_reset``, whose candidate needs every unit's ``r * h`` first), the hidden state ping-ponging
     between two scratch buffers, the step number in a uniform; then one dispatch writing ``Y_h`` / ``Y_c``.

Every loop has a constant bound and every barrier is in uniform control flow: a step past a sequence's length is
computed and then discarded with ``select`` (the state stays, Y's row is zero), so ``sequence_lens`` is read at
run time and may change between runs without replanning.

Numerics: float32 throughout; ``tanh``, ``exp(x) - 1`` and ``log(1 + x)`` are written out (WGSL's builtins are
loose on some GPUs, and a plain ``exp(x) - 1`` cancels near 0), sigmoid never overflows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .._kernel import Binding
from ._recurrent_cells import Activation

__all__ = [
    "Config",
    "GROUP",
    "activation_functions",
    "BindingTable",
    "flat_main",
    "prepare_kernel",
    "project_kernel",
    "step_kernel",
    "transpose_kernel",
    "final_kernel",
]

#: Invocations per workgroup of the element-per-invocation kernels (prepare, project, per step, final).
GROUP = 64


@dataclass(frozen=True)
class Config:
    """What the kernels of one node bake in."""

    op_type: str
    gates: int
    seq: int
    batch: int
    input_size: int
    hidden: int
    directions: int
    #: "forward", "reverse" or "bidirectional"
    direction: str
    layout: int
    has_bias: bool
    has_lengths: bool
    has_h0: bool
    has_c0: bool
    has_peepholes: bool
    linear_before_reset: bool
    input_forget: bool
    #: which outputs are present (Y, Y_h, Y_c)
    outputs: tuple[bool, bool, bool]
    #: the WGSL type of the node's float tensors (the kernels compute in f32 either way)
    element: str = "f32"

    @property
    def gh(self) -> int:
        return self.gates * self.hidden

    @property
    def dbh(self) -> int:
        return self.directions * self.batch * self.hidden

    @property
    def two_phase(self) -> bool:
        """GRU without ``linear_before_reset``: its candidate needs every unit's ``r * h`` first."""
        return self.op_type == "GRU" and not self.linear_before_reset

    # aux scratch (floats): the cell state [D, B, H], peepholes [D, 3H], GRU's candidate recurrent bias [D, H]
    @property
    def aux_peepholes(self) -> int:
        return self.dbh

    @property
    def aux_rbh(self) -> int:
        return self.dbh + 3 * self.directions * self.hidden

    @property
    def aux_floats(self) -> int:
        return self.aux_rbh + self.directions * self.hidden

    @property
    def xp_floats(self) -> int:
        return self.directions * self.seq * self.batch * self.gh


def _f32(value: float) -> str:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"no WGSL literal for {value!r}")
    return f"{float(np.float32(value)):.9e}f"


def _u(value: int) -> str:
    return f"{int(value)}u"


# -- shared WGSL -------------------------------------------------------------------------------------------------


_MATH = """
// tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)); a series near 0, where that difference cancels.
fn r_tanh(x: f32) -> f32 {
    let a = min(abs(x), 20.0);
    if (a < 0.125) {
        let a2 = a * a;
        let t = a * (1.0 + a2 * (-0.33333333333 + a2 * (0.13333333333 + a2 * -0.05396825397)));
        return select(-t, t, x >= 0.0);
    }
    let t = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
    return select(-t, t, x >= 0.0);
}
// 1 / (1 + exp(-x)) through exp(-|x|) only: no overflow.
fn r_sigmoid(x: f32) -> f32 {
    let e = exp(-min(abs(x), 80.0));
    return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}
// exp(x) - 1 for x <= 0 (Elu), a series near 0.
fn r_expm1(x: f32) -> f32 {
    if (x > -0.125) {
        return x * (1.0 + x * (0.5 + x * (0.16666666667 + x * (0.04166666667 + x * 0.00833333333))));
    }
    return exp(max(x, -80.0)) - 1.0;
}
// log(1 + u) for 0 <= u <= 1 (Softplus), a series for small u.
fn r_log1p(u: f32) -> f32 {
    if (u < 0.0078125) {
        return u * (1.0 + u * (-0.5 + u * (0.33333333333 + u * -0.25)));
    }
    return log(1.0 + u);
}
"""


def _activation_expression(activation: Activation) -> str:
    """WGSL expression of ``activation`` of ``x`` (already clipped)."""
    name = activation.name.lower()
    a, b = _f32(activation.alpha), _f32(activation.beta)
    expressions = {
        "relu": "max(x, 0.0)",
        "tanh": "r_tanh(x)",
        "sigmoid": "r_sigmoid(x)",
        "affine": f"{a} * x + {b}",
        "leakyrelu": f"select({a} * x, x, x >= 0.0)",
        "thresholdedrelu": f"select(0.0, x, x > {a})",
        "scaledtanh": f"{a} * r_tanh({b} * x)",
        "hardsigmoid": f"clamp({a} * x + {b}, 0.0, 1.0)",
        "elu": f"select({a} * r_expm1(min(x, 0.0)), x, x >= 0.0)",
        "softsign": "x / (1.0 + abs(x))",
        "softplus": "max(x, 0.0) + r_log1p(exp(-min(abs(x), 80.0)))",
    }
    return expressions[name]


def activation_functions(functions: Sequence[Sequence[Activation]]) -> str:
    """WGSL ``act<k>(x: f32, d: u32) -> f32``: the ``k``-th activation of direction ``d`` (clip included)."""
    parts = [_MATH]
    for slot in range(len(functions[0])):
        for d, per_direction in enumerate(functions):
            activation = per_direction[slot]
            if activation.clip is None:
                argument = "v"
            else:
                bound = _f32(activation.clip)
                argument = f"clamp(v, -{bound}, {bound})"
            parts.append(
                f"fn act{slot}_d{d}(v: f32) -> f32 {{\n"
                f"    let x = {argument};\n"
                f"    return {_activation_expression(activation)};\n}}\n"
            )
        if len(functions) == 1:
            parts.append(f"fn act{slot}(x: f32, d: u32) -> f32 {{ return act{slot}_d0(x); }}\n")
        else:
            parts.append(
                f"fn act{slot}(x: f32, d: u32) -> f32 {{\n"
                f"    if (d == 1u) {{ return act{slot}_d1(x); }}\n"
                f"    return act{slot}_d0(x);\n}}\n"
            )
    return "".join(parts)


def _index_functions(cfg: Config) -> str:
    """WGSL index functions of the node's tensors (layout 0 or 1), the step order, the length of a row."""
    S, B, D, H, IN = _u(cfg.seq), _u(cfg.batch), _u(cfg.directions), _u(cfg.hidden), _u(cfg.input_size)
    if cfg.layout == 0:
        x_at = f"(t * {B} + b) * {IN} + k"
        y_at = f"((t * {D} + d) * {B} + b) * {H} + j"
        st_at = f"(d * {B} + b) * {H} + j"
    else:
        x_at = f"(b * {S} + t) * {IN} + k"
        y_at = f"((b * {S} + t) * {D} + d) * {H} + j"
        st_at = f"(b * {D} + d) * {H} + j"
    reverse = {"forward": "false", "reverse": "true", "bidirectional": "d == 1u"}[cfg.direction]
    return (
        f"fn x_at(t: u32, b: u32, k: u32) -> u32 {{ return {x_at}; }}\n"
        f"fn y_at(t: u32, d: u32, b: u32, j: u32) -> u32 {{ return {y_at}; }}\n"
        f"fn st_at(d: u32, b: u32, j: u32) -> u32 {{ return {st_at}; }}\n"
        f"fn time_of(s: u32, d: u32) -> u32 {{ return select(s, {_u(cfg.seq - 1)} - s, {reverse}); }}\n"
    )


def _length(cfg: Config) -> str:
    """WGSL expression: the length of batch row ``b`` (an i32; invalid values are flagged by ``prepare``)."""
    return "lens[b]" if cfg.has_lengths else f"{cfg.seq}i"


class BindingTable:
    """Binding slots of one kernel and their declarations (the node's float tensors as ``tensor_element``)."""

    def __init__(self, tensor_element: str) -> None:
        self.tensor_element = tensor_element
        self.bindings: list[Binding] = []
        self.lines: list[str] = []

    def add(self, binding: Binding, name: str, element: str = "f32", writable: bool = False) -> None:
        if binding.kind in ("input", "output") and element == "f32":
            element = self.tensor_element
        slot = len(self.bindings)
        self.bindings.append(binding)
        if binding.kind == "params":
            self.lines.append(f"@group(0) @binding({slot}) var<uniform> {name}: vec4<u32>;")
        else:
            access = "read_write" if writable else "read"
            self.lines.append(f"@group(0) @binding({slot}) var<storage, {access}> {name}: array<{element}>;")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _finish(cfg: Config, wgsl: str) -> str:
    """A kernel's WGSL for the node's float type: ``OUT(v)`` converts to it; float16 needs ``enable f16``."""
    wgsl = wgsl.replace("OUT(", f"{cfg.element}(")
    return ("enable f16;\n" + wgsl) if cfg.element == "f16" else wgsl


def flat_main(total: int, grid: tuple[int, int, int]) -> str:
    """Start of a kernel's ``main`` with one invocation per element ``i < total`` (surplus ones return)."""
    group = "wid.x" if grid[1] == 1 else f"(wid.y * {grid[0]}u + wid.x)"
    return (
        f"@compute @workgroup_size({GROUP})\n"
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {\n"
        f"    let i = {group} * {GROUP}u + li;\n"
        f"    if (i >= {_u(total)}) {{ return; }}\n"
    )


def _dbj(cfg: Config) -> str:
    """``d``, ``b``, ``j`` of a flat index ``i`` over ``[direction, batch, hidden]``."""
    return (
        f"    let j = i % {_u(cfg.hidden)};\n"
        f"    let b = (i / {_u(cfg.hidden)}) % {_u(cfg.batch)};\n"
        f"    let d = i / {_u(cfg.batch * cfg.hidden)};\n"
    )


# -- kernels -----------------------------------------------------------------------------------------------------


def prepare_kernel(cfg: Config, grid: tuple[int, int, int]) -> tuple[str, tuple[Binding, ...]]:
    """Initial states, cell state, peepholes and the candidate's recurrent bias into the scratch buffers;
    ``sequence_lens`` checked.  One invocation per (direction, batch, unit).  Scratch 1: hidden state, 2: aux."""
    table = BindingTable(cfg.element)
    if cfg.has_h0:
        table.add(Binding("input", 5), "init_h")
    if cfg.has_c0:
        table.add(Binding("input", 6), "init_c")
    if cfg.has_peepholes:
        table.add(Binding("input", 7), "peep")
    rbh = cfg.linear_before_reset and cfg.has_bias
    if rbh:
        table.add(Binding("input", 3), "bias")
    if cfg.has_lengths:
        table.add(Binding("input", 4), "lens", "i32")
        table.add(Binding("status"), "status", "atomic<u32>", writable=True)
    table.add(Binding("scratch", 1), "hstate", writable=True)
    table.add(Binding("scratch", 2), "aux", writable=True)
    H = cfg.hidden
    body = [_dbj(cfg)]
    body.append(f"    hstate[i] = {'f32(init_h[st_at(d, b, j)])' if cfg.has_h0 else '0.0'};\n")
    body.append(f"    aux[i] = {'f32(init_c[st_at(d, b, j)])' if cfg.has_c0 else '0.0'};\n")
    body.append("    if (b == 0u) {\n")
    for g in range(3):
        value = f"f32(peep[d * {_u(3 * H)} + {_u(g * H)} + j])" if cfg.has_peepholes else "0.0"
        body.append(f"        aux[{_u(cfg.aux_peepholes)} + d * {_u(3 * H)} + {_u(g * H)} + j] = {value};\n")
    value = f"f32(bias[d * {_u(2 * cfg.gh)} + {_u(cfg.gh + 2 * H)} + j])" if rbh else "0.0"
    body.append(f"        aux[{_u(cfg.aux_rbh)} + d * {_u(H)} + j] = {value};\n")
    body.append("    }\n")
    if cfg.has_lengths:
        body.append(
            "    if (d == 0u && j == 0u) {\n"
            "        let len = lens[b];\n"
            f"        if (len < 0i || len > {cfg.seq}i) {{ atomicOr(&status[0], 1u); }}\n"
            "    }\n"
        )
    wgsl = table.text() + _index_functions(cfg) + flat_main(cfg.dbh, grid) + "".join(body) + "}\n"
    return _finish(cfg, wgsl), tuple(table.bindings)


def project_kernel(cfg: Config, grid: tuple[int, int, int]) -> tuple[str, tuple[Binding, ...]]:
    """``xp[d, t, b, row] = sum_k X[t, b, k] W[d, row, k] + Wb[d, row] (+ Rb[d, row])``, one invocation per
    element.  Scratch 0: xp."""
    table = BindingTable(cfg.element)
    table.add(Binding("input", 0), "x")
    table.add(Binding("input", 1), "w")
    if cfg.has_bias:
        table.add(Binding("input", 3), "bias")
    table.add(Binding("scratch", 0), "xp", writable=True)
    GH, B, S, IN, H = cfg.gh, cfg.batch, cfg.seq, cfg.input_size, cfg.hidden
    if not cfg.has_bias:
        bias = "0.0"
    else:
        wb = f"f32(bias[d * {_u(2 * GH)} + row])"
        rb = f"f32(bias[d * {_u(2 * GH)} + {_u(GH)} + row])"
        if cfg.linear_before_reset:
            # GRU's candidate adds Rb inside the reset gate's product: not folded (the recurrence adds it).
            bias = f"{wb} + select({rb}, 0.0, row >= {_u(2 * H)})"
        else:
            bias = f"{wb} + {rb}"
    body = (
        f"    let row = i % {_u(GH)};\n"
        f"    let b = (i / {_u(GH)}) % {_u(B)};\n"
        f"    let t = (i / {_u(GH * B)}) % {_u(S)};\n"
        f"    let d = i / {_u(GH * B * S)};\n"
        f"    let wrow = (d * {_u(GH)} + row) * {_u(IN)};\n"
        "    var acc = 0.0;\n"
        f"    for (var k = 0u; k < {_u(IN)}; k = k + 1u) {{\n"
        "        acc = acc + f32(x[x_at(t, b, k)]) * f32(w[wrow + k]);\n"
        "    }\n"
        f"    xp[i] = acc + {bias};\n"
    )
    wgsl = table.text() + _index_functions(cfg) + flat_main(cfg.xp_floats, grid) + body + "}\n"
    return _finish(cfg, wgsl), tuple(table.bindings)


def transpose_kernel(cfg: Config, grid: tuple[int, int, int]) -> tuple[str, tuple[Binding, ...]]:
    """R ``[direction, gates*hidden, hidden]`` transposed into scratch 3 ``[direction, hidden, gates*hidden]``:
    the recurrence's invocations (one per unit) then read consecutive words at each ``k`` (coalesced)."""
    table = BindingTable(cfg.element)
    table.add(Binding("input", 2), "r")
    table.add(Binding("scratch", 3), "rt", writable=True)
    GH, H = cfg.gh, cfg.hidden
    body = (
        f"    let row = i % {_u(GH)};\n"
        f"    let k = (i / {_u(GH)}) % {_u(H)};\n"
        f"    let d = i / {_u(GH * H)};\n"
        f"    rt[i] = f32(r[(d * {_u(GH)} + row) * {_u(H)} + k]);\n"
    )
    wgsl = table.text() + flat_main(cfg.directions * GH * H, grid) + body + "}\n"
    return _finish(cfg, wgsl), tuple(table.bindings)


def _gate_math(cfg: Config) -> tuple[str, str]:
    """(accumulator setup, per-k update) of the gates' pre-activations of unit ``j`` of direction ``d``, reading
    the previous hidden state through ``hk``; GRU without ``linear_before_reset`` leaves out its candidate."""
    H, GH = cfg.hidden, cfg.gh
    names = {"RNN": ["a0"], "GRU": ["az", "ar", "ah"], "LSTM": ["ai", "ao", "af", "ac"]}[cfg.op_type]
    setup, update = [], []
    for g, name in enumerate(names):
        if cfg.op_type == "GRU" and g == 2:
            if cfg.two_phase:
                setup.append(f"        var {name} = xp[xbase + {_u(g * H)}];\n")
                continue
            # linear_before_reset: the candidate's recurrent product (and its bias) apart from xp.
            setup.append(f"        let {name} = xp[xbase + {_u(g * H)}];\n")
            setup.append(f"        var ahr = aux[{_u(cfg.aux_rbh)} + d * {_u(H)} + jj];\n")
            update.append(f"            ahr = ahr + hk * rt[rbase + k * {_u(GH)} + {_u(g * H)}];\n")
            continue
        setup.append(f"        var {name} = xp[xbase + {_u(g * H)}];\n")
        update.append(f"            {name} = {name} + hk * rt[rbase + k * {_u(GH)} + {_u(g * H)}];\n")
    return "".join(setup), "".join(update)


def _cell_update(cfg: Config) -> str:
    """WGSL computing ``hn`` (and ``cn``) of unit ``j`` from the accumulators, ``h`` and ``c``."""
    H = cfg.hidden
    if cfg.op_type == "RNN":
        return "        let hn = act0(a0, d);\n"
    if cfg.op_type == "GRU":
        candidate = "act1(ah, d)" if cfg.two_phase else "act1(ah + rg * ahr, d)"
        return f"        let hn = (1.0 - zg) * {candidate} + zg * h;\n"
    peep = f"{_u(cfg.aux_peepholes)} + d * {_u(3 * H)} + jj"
    forget = "1.0 - ig" if cfg.input_forget else f"act0(af + aux[{peep} + {_u(2 * H)}] * c, d)"
    return (
        f"        let ig = act0(ai + aux[{peep}] * c, d);\n"
        f"        let fg = {forget};\n"
        "        let cn = fg * c + ig * act1(ac, d);\n"
        f"        let og = act0(ao + aux[{peep} + {_u(H)}] * cn, d);\n"
        "        let hn = og * act2(cn, d);\n"
    )


def step_kernel(
    cfg: Config,
    functions: Sequence[Sequence[Activation]],
    grid: tuple[int, int, int],
    step: int,
    phase: int,
) -> tuple[str, tuple[Binding, ...]]:
    """One time step (the step number in the ``params`` uniform, so every step shares one pipeline), one
    invocation per (direction, batch, unit).  Hidden state from scratch 1 (even steps) or 4 (odd) into the other;
    the cell state updated in place in aux.  GRU without ``linear_before_reset`` runs two phases: 1 writes
    ``r * h`` and ``z`` into scratch 5, 2 the candidate and the new state (``phase`` 0: a single phase)."""
    table = BindingTable(cfg.element)
    source, target = (1, 4) if step % 2 == 0 else (4, 1)
    H, B, S, GH = cfg.hidden, cfg.batch, cfg.seq, cfg.gh
    table.add(Binding("params"), "params")
    table.add(Binding("scratch", 0), "xp")
    table.add(Binding("scratch", 3), "rt")
    table.add(Binding("scratch", source), "hin")
    if phase == 1:
        table.add(Binding("scratch", 5), "zr", writable=True)
    else:
        if phase == 2:
            table.add(Binding("scratch", 5), "zr")
        table.add(Binding("scratch", target), "hout", writable=True)
    needs_aux = phase == 0 and (cfg.op_type == "LSTM" or cfg.linear_before_reset)
    if needs_aux:
        table.add(Binding("scratch", 2), "aux", writable=cfg.op_type == "LSTM")
    if cfg.has_lengths and phase != 1:
        table.add(Binding("input", 4), "lens", "i32")
    if cfg.outputs[0] and phase != 1:
        table.add(Binding("output", 0), "y", writable=True)
    setup, update = _gate_math(cfg)
    lines = [
        _dbj(cfg),
        "    let s = params.x;\n",
        "    let t = time_of(s, d);\n",
        f"    let hbase = (d * {_u(B)} + b) * {_u(H)};\n",
        "    let jj = j;\n",
        "    let h = hin[i];\n",
        f"    let rbase = d * {_u(H * GH)} + jj;\n",
        f"    let xbase = ((d * {_u(S)} + t) * {_u(B)} + b) * {_u(GH)} + j;\n",
    ]
    if phase != 1:
        lines.append(f"    let len = {_length(cfg)};\n    let valid = i32(t) < len;\n")
    if cfg.op_type == "LSTM":
        lines.append("    let c = aux[i];\n")
    if phase == 2:
        lines += [
            f"    var ah = xp[xbase + {_u(2 * H)}];\n",
            f"    for (var k = 0u; k < {_u(H)}; k = k + 1u) {{\n",
            f"        ah = ah + zr[hbase + k] * rt[rbase + k * {_u(GH)} + {_u(2 * H)}];\n",
            "    }\n",
            f"    let zg = zr[{_u(cfg.dbh)} + i];\n",
        ]
    else:
        lines += [
            setup.replace("        ", "    ", 1).replace("\n        ", "\n    "),
            f"    for (var k = 0u; k < {_u(H)}; k = k + 1u) {{\n",
            "        let hk = hin[hbase + k];\n",
            update.replace("            ", "        "),
            "    }\n",
        ]
        if cfg.op_type == "GRU":
            lines.append("    let zg = act0(az, d);\n    let rg = act0(ar, d);\n")
    if phase == 1:
        lines.append(f"    zr[i] = rg * h;\n    zr[{_u(cfg.dbh)} + i] = zg;\n")
    else:
        lines.append(_cell_update(cfg).replace("        ", "    "))
        if cfg.outputs[0]:
            lines.append("    y[y_at(t, d, b, j)] = OUT(select(0.0, hn, valid));\n")
        lines.append("    hout[i] = select(h, hn, valid);\n")
        if cfg.op_type == "LSTM":
            lines.append("    aux[i] = select(c, cn, valid);\n")
    wgsl = (
        table.text()
        + _index_functions(cfg)
        + activation_functions(functions)
        + flat_main(cfg.dbh, grid)
        + "".join(lines)
        + "}\n"
    )
    return _finish(cfg, wgsl), tuple(table.bindings)


def final_kernel(cfg: Config, grid: tuple[int, int, int]) -> tuple[str, tuple[Binding, ...]]:
    """``Y_h`` / ``Y_c`` from the last step's state (zero for a sequence of length 0), per (direction, batch,
    unit)."""
    table = BindingTable(cfg.element)
    if cfg.outputs[1]:
        table.add(Binding("scratch", 1 if cfg.seq % 2 == 0 else 4), "hfinal")
    if cfg.outputs[2]:
        table.add(Binding("scratch", 2), "aux")
    if cfg.has_lengths:
        table.add(Binding("input", 4), "lens", "i32")
    for index, name in ((1, "y_h"), (2, "y_c")):
        if cfg.outputs[index]:
            table.add(Binding("output", index), name, writable=True)
    lines = [_dbj(cfg), f"    let len = {_length(cfg)};\n"]
    if cfg.outputs[1]:
        lines.append("    y_h[st_at(d, b, j)] = OUT(select(hfinal[i], 0.0, len <= 0i));\n")
    if cfg.outputs[2]:
        lines.append("    y_c[st_at(d, b, j)] = OUT(select(aux[i], 0.0, len <= 0i));\n")
    wgsl = table.text() + _index_functions(cfg) + flat_main(cfg.dbh, grid) + "".join(lines) + "}\n"
    return _finish(cfg, wgsl), tuple(table.bindings)
