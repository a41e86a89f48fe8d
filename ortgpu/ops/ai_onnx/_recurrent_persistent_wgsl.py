"""WGSL of the recurrent operators' persistent kernels: the whole recurrence in one dispatch.

One workgroup per (direction, batch row) loops over every step; invocation ``j`` owns hidden unit ``j`` (and its
cell state, in a register) and the hidden state lives in ``var<workgroup>`` memory, two ``workgroupBarrier()`` per
step.  The split variant (:func:`persistent_split_kernel`) spreads each unit's dot products over ``split``
invocations, for hidden sizes whose row of R does not fit one invocation's budget.  The cell math and the text
helpers are shared with the per-step kernels (:mod:`._recurrent_wgsl`), so both paths compute the same gates.
"""

from __future__ import annotations

from typing import Sequence

from .._kernel import Binding
from ._recurrent_cells import Activation
from ._recurrent_wgsl import (
    BindingTable,
    Config,
    _cell_update,
    _finish,
    _gate_math,
    _index_functions,
    _length,
    _u,
    activation_functions,
)

__all__ = ["persistent_kernel", "persistent_split_kernel", "persistent_workgroup", "split_shared_floats"]


def persistent_workgroup(hidden: int) -> int:
    """Invocations of the persistent kernel's workgroup for ``hidden`` units: ``hidden`` rounded up to 32."""
    return -(-hidden // 32) * 32


def _persistent_table(cfg: Config) -> BindingTable:
    """The bindings of a persistent kernel (split or not): projections, transposed R, states, lengths, outputs."""
    table = BindingTable(cfg.element)
    table.add(Binding("scratch", 0), "xp")
    table.add(Binding("scratch", 3), "rt")
    table.add(Binding("scratch", 1), "hstate")
    if cfg.op_type == "LSTM" or cfg.linear_before_reset:
        table.add(Binding("scratch", 2), "aux")
    if cfg.has_lengths:
        table.add(Binding("input", 4), "lens", "i32")
    for index, name in enumerate(("y", "y_h", "y_c")):
        if cfg.outputs[index]:
            table.add(Binding("output", index), name, writable=True)
    return table


def persistent_kernel(
    cfg: Config, functions: Sequence[Sequence[Activation]], grid: tuple[int, int, int]
) -> tuple[str, tuple[Binding, ...]]:
    """The whole recurrence in one dispatch: workgroup ``(d, b)`` loops over the steps, invocation ``j`` owns
    unit ``j``; the hidden state in workgroup memory."""
    table = _persistent_table(cfg)
    H, B, S, GH = cfg.hidden, cfg.batch, cfg.seq, cfg.gh
    wg = persistent_workgroup(H)
    group = "wid.x" if grid[1] == 1 else f"(wid.y * {grid[0]}u + wid.x)"
    setup, update = _gate_math(cfg)
    lines = [
        f"var<workgroup> hs: array<f32, {wg}>;\n",
        f"var<workgroup> rh: array<f32, {wg}>;\n" if cfg.two_phase else "",
        f"@compute @workgroup_size({wg})\n",
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) j: u32) {\n",
        f"    let g = {group};\n",
        f"    if (g >= {_u(cfg.directions * B)}) {{ return; }}\n",
        f"    let d = g / {_u(B)};\n",
        f"    let b = g % {_u(B)};\n",
        f"    let len = {_length(cfg)};\n",
        f"    let owner = j < {_u(H)};\n",
        f"    let jj = min(j, {_u(H - 1)});\n",
        "    var h = 0.0;\n",
        "    var c = 0.0;\n",
        "    if (owner) {\n",
        f"        h = hstate[(d * {_u(B)} + b) * {_u(H)} + j];\n",
        f"        c = aux[(d * {_u(B)} + b) * {_u(H)} + j];\n" if cfg.op_type == "LSTM" else "",
        "    }\n",
        "    hs[j] = h;\n",
        "    workgroupBarrier();\n",
        f"    let rbase = d * {_u(H * GH)} + jj;\n",
        f"    for (var s = 0u; s < {_u(S)}; s = s + 1u) {{\n",
        "        let t = time_of(s, d);\n",
        "        let valid = i32(t) < len;\n",
        f"        let xbase = ((d * {_u(S)} + t) * {_u(B)} + b) * {_u(GH)} + jj;\n",
        setup,
        "        if (owner) {\n",
        f"            for (var k = 0u; k < {_u(H)}; k = k + 1u) {{\n",
        "                let hk = hs[k];\n",
        update.replace("            ", "                "),
        "            }\n",
        "        }\n",
    ]
    if cfg.op_type == "GRU":
        lines.append("        let zg = act0(az, d);\n        let rg = act0(ar, d);\n")
    if cfg.two_phase:
        lines += [
            "        rh[j] = rg * h;\n",
            "        workgroupBarrier();\n",
            "        if (owner) {\n",
            f"            for (var k = 0u; k < {_u(H)}; k = k + 1u) {{\n",
            f"                ah = ah + rh[k] * rt[rbase + k * {_u(GH)} + {_u(2 * H)}];\n",
            "            }\n",
            "        }\n",
        ]
    else:
        lines.append("        workgroupBarrier();\n")
    lines.append(_cell_update(cfg))
    lines += _persistent_step_end(cfg, "hn", "cn")
    wgsl = table.text() + _index_functions(cfg) + activation_functions(functions) + "".join(lines)
    return _finish(cfg, wgsl), tuple(table.bindings)


def _persistent_step_end(cfg: Config, h_new: str, c_new: str) -> list[str]:
    """The end of a persistent kernel's time step and of the kernel: the owner of each hidden unit writes Y, keeps
    the new state where the step is within the sequence (``h_new``/``c_new``), shares it through workgroup memory;
    after the last step it writes Y_h / Y_c (zero for a sequence of length 0)."""
    lines = ["        if (owner) {\n"]
    if cfg.outputs[0]:
        lines.append(f"            y[y_at(t, d, b, j)] = OUT(select(0.0, {h_new}, valid));\n")
    lines.append(f"            h = select(h, {h_new}, valid);\n")
    if cfg.op_type == "LSTM":
        lines.append(f"            c = select(c, {c_new}, valid);\n")
    lines += ["            hs[j] = h;\n", "        }\n", "        workgroupBarrier();\n", "    }\n"]
    lines.append("    if (owner) {\n")
    if cfg.outputs[1]:
        lines.append("        y_h[st_at(d, b, j)] = OUT(select(h, 0.0, len <= 0i));\n")
    if cfg.outputs[2]:
        lines.append("        y_c[st_at(d, b, j)] = OUT(select(c, 0.0, len <= 0i));\n")
    lines.append("    }\n}\n")
    return lines


def _phase_accumulators(cfg: Config) -> list[tuple[str, str, int]]:
    """(name, initial value, gate column offset) of the accumulators of the split kernel's first phase: each
    sums ``h[k] * R[gate row, k]`` over its invocation's share of ``k``."""
    H = cfg.hidden
    if cfg.op_type == "RNN":
        return [("a0", "xp[xbase]", 0)]
    if cfg.op_type == "LSTM":
        return [(name, f"xp[xbase + {_u(g * H)}]", g * H) for g, name in enumerate(("ai", "ao", "af", "ac"))]
    gates = [("az", "xp[xbase]", 0), ("ar", f"xp[xbase + {_u(H)}]", H)]
    if cfg.linear_before_reset:
        gates.append(("ahr", f"aux[{_u(cfg.aux_rbh)} + d * {_u(H)} + jj]", 2 * H))
    return gates


def split_shared_floats(cfg: Config, split: int) -> int:
    """Workgroup memory (floats) of the persistent kernel with ``split`` invocations per unit."""
    pad = persistent_workgroup(cfg.hidden)
    floats = pad * (2 if cfg.two_phase else 1)
    if split > 1:
        floats += len(_phase_accumulators(cfg)) * split * pad
    return floats


def persistent_split_kernel(
    cfg: Config, functions: Sequence[Sequence[Activation]], grid: tuple[int, int, int], split: int
) -> tuple[str, tuple[Binding, ...]]:
    """The persistent kernel with ``split`` invocations per unit: invocation ``(p, j)`` sums its share of ``k``
    for unit ``j`` (partial sums in workgroup memory, added in a fixed order by ``p == 0``, which owns the unit's
    state), so each step's dependent chain of loads is ``split`` times shorter (a workgroup per direction and
    batch row leaves most of a large GPU idle: latency, not throughput, bounds a step)."""
    table = _persistent_table(cfg)
    H, B, S, GH = cfg.hidden, cfg.batch, cfg.seq, cfg.gh
    pad = persistent_workgroup(H)
    chunk = -(-H // split)
    stride = split * pad
    group = "wid.x" if grid[1] == 1 else f"(wid.y * {grid[0]}u + wid.x)"
    accumulators = _phase_accumulators(cfg)

    def total(index: int, initial: str) -> str:
        # the partial sums of accumulator ``index`` in a fixed order (p = 0, 1, ...): deterministic
        terms = " + ".join(f"part[{_u(index * stride + p * pad)} + j]" for p in range(split))
        return f"{initial} + ({terms})"

    lines = [
        f"var<workgroup> hs: array<f32, {pad}>;\n",
        f"var<workgroup> rh: array<f32, {pad}>;\n" if cfg.two_phase else "",
        f"var<workgroup> part: array<f32, {len(accumulators) * stride}>;\n",
        f"@compute @workgroup_size({stride})\n",
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {\n",
        f"    let g = {group};\n",
        f"    if (g >= {_u(cfg.directions * B)}) {{ return; }}\n",
        f"    let d = g / {_u(B)};\n",
        f"    let b = g % {_u(B)};\n",
        f"    let len = {_length(cfg)};\n",
        f"    let p = li / {_u(pad)};\n",
        f"    let j = li % {_u(pad)};\n",
        f"    let worker = j < {_u(H)};\n",
        "    let owner = worker && p == 0u;\n",
        f"    let jj = min(j, {_u(H - 1)});\n",
        f"    let k0 = min(p * {_u(chunk)}, {_u(H)});\n",
        f"    let k1 = min(k0 + {_u(chunk)}, {_u(H)});\n",
        "    var h = 0.0;\n",
        "    var c = 0.0;\n",
        "    if (owner) {\n",
        f"        h = hstate[(d * {_u(B)} + b) * {_u(H)} + j];\n",
        f"        c = aux[(d * {_u(B)} + b) * {_u(H)} + j];\n" if cfg.op_type == "LSTM" else "",
        "    }\n",
        "    if (p == 0u) { hs[j] = h; }\n",
        "    workgroupBarrier();\n",
        f"    let rbase = d * {_u(H * GH)} + jj;\n",
        f"    for (var s = 0u; s < {_u(S)}; s = s + 1u) {{\n",
        "        let t = time_of(s, d);\n",
        "        let valid = i32(t) < len;\n",
        f"        let xbase = ((d * {_u(S)} + t) * {_u(B)} + b) * {_u(GH)} + jj;\n",
    ]
    lines += [f"        var p_{name} = 0.0;\n" for name, _, _ in accumulators]
    lines += [
        "        if (worker) {\n",
        "            for (var k = k0; k < k1; k = k + 1u) {\n",
        "                let hk = hs[k];\n",
    ]
    lines += [
        f"                p_{name} = p_{name} + hk * rt[rbase + k * {_u(GH)} + {_u(offset)}];\n"
        for name, _, offset in accumulators
    ]
    lines += ["            }\n", "        }\n"]
    lines += [
        f"        part[{_u(index * stride)} + li] = p_{name};\n" for index, (name, _, _) in enumerate(accumulators)
    ]
    lines += ["        workgroupBarrier();\n", "        var nh = 0.0;\n", "        var nc = 0.0;\n"]
    if cfg.two_phase:
        lines += [
            "        var zg = 0.0;\n",
            "        if (owner) {\n",
            f"            zg = act0({total(0, accumulators[0][1])}, d);\n",
            f"            let rg = act0({total(1, accumulators[1][1])}, d);\n",
            "            rh[j] = rg * h;\n",
            "        }\n",
            "        workgroupBarrier();\n",
            "        var p_ah = 0.0;\n",
            "        if (worker) {\n",
            "            for (var k = k0; k < k1; k = k + 1u) {\n",
            f"                p_ah = p_ah + rh[k] * rt[rbase + k * {_u(GH)} + {_u(2 * H)}];\n",
            "            }\n",
            "        }\n",
            "        part[li] = p_ah;\n",
            "        workgroupBarrier();\n",
            "        if (owner) {\n",
            f"            let ah = {total(0, f'xp[xbase + {_u(2 * H)}]')};\n",
            "            nh = (1.0 - zg) * act1(ah, d) + zg * h;\n",
            "        }\n",
        ]
    else:
        lines.append("        if (owner) {\n")
        lines += [
            f"            let {name} = {total(index, initial)};\n"
            for index, (name, initial, _) in enumerate(accumulators)
        ]
        if cfg.op_type == "GRU":
            lines.append(f"            let ah = xp[xbase + {_u(2 * H)}];\n")
            lines.append("            let zg = act0(az, d);\n            let rg = act0(ar, d);\n")
        lines.append(_cell_update(cfg).replace("        ", "            "))
        lines.append("            nh = hn;\n")
        if cfg.op_type == "LSTM":
            lines.append("            nc = cn;\n")
        lines.append("        }\n")
    lines += _persistent_step_end(cfg, "nh", "nc")
    wgsl = table.text() + _index_functions(cfg) + activation_functions(functions) + "".join(lines)
    return _finish(cfg, wgsl), tuple(table.bindings)
