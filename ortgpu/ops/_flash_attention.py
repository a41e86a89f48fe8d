"""One flash-attention kernel: ``softmax(scale * Q.K^T + bias) . V`` without writing the scores anywhere.

The problem (:class:`FlashProblem`) is stated in strides, so one generator serves every layout the callers have:
the fused SDPA pattern of an exported graph (:mod:`ortgpu._attention_fusion`, its Q/K/V read through the
Transposes it absorbed), and the ONNX ``Attention`` operator (3-D ``[B, S, H * D]`` inputs, grouped K/V heads as
a broadcast batch axis).  Each operand gives per-batch-axis strides (0 where it is broadcast), a row stride and a
column stride; so does the output (output ``out.index``, rows are queries, columns the value dimension).

A workgroup of 128 invocations owns one batch index and a block of ``BQ`` query rows (``TPR = 128 / BQ``
invocations per row).  It keeps the Q block in workgroup memory and walks the keys in tiles of ``BK``: the K (and,
when it fits, V) tile is loaded cooperatively, each invocation computes ``BK / TPR`` scores of its row into a
shared score tile, and each then folds the row's tile into its running maximum, sum and ``ceil(Dv / TPR)`` output
accumulators (the online softmax: earlier sums are rescaled by ``exp(old max - new max)``).  A dropped key (a mask
value of ``-inf``, past the causal frontier) contributes nothing; a row whose every key is dropped is NaN, as the
unfused Softmax gives.  Tiles are sized to the device's workgroup storage: rows padded by one float so the
score loop's reads of different rows fall in different banks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ._kernel import Binding, DeviceCaps, NotOnDevice, check_loop_budget
from ._tiling import BindingTable, grid_for_groups, wgsl_f32, workgroup_index

__all__ = ["FlashProblem", "FlashTiles", "OperandView", "flash_attention_wgsl", "flash_tiles"]

#: Invocations per workgroup.
FLASH_THREADS = 128


@dataclass(frozen=True)
class OperandView:
    """How the kernel reads one operand: input ``index`` of the node, at ``sum(batch index * batch_strides) +
    row * row_stride + col * col_stride`` (elements).  Q: rows are queries, columns the head dimension; K: rows
    are keys, columns the head dimension; V: rows are keys, columns the value dimension; the mask: rows are
    queries, columns keys."""

    index: int
    batch_strides: tuple[int, ...]
    row_stride: int
    col_stride: int


@dataclass(frozen=True)
class FlashProblem:
    """``out[z, i, e] = sum_j softmax_j(logit_scale * Q[z, i].K[z, j] + bias_scale * mask[z, i, j]) V[z, j, e]``
    over the batch ``batch`` (any rank), keys ``j > i + causal_offset`` dropped when ``causal_offset`` is set, and
    keys whose mask value is ``-inf`` dropped."""

    batch: tuple[int, ...]
    sq: int
    sk: int
    head: int
    value_head: int
    q: OperandView
    k: OperandView
    v: OperandView
    mask: OperandView | None
    logit_scale: float
    bias_scale: float
    out: OperandView
    causal_offset: int | None = None
    #: A row whose every key is dropped: NaN (as Softmax gives) or, when set, zero (as ``Attention`` defines).
    empty_rows_zero: bool = False


@dataclass(frozen=True)
class FlashTiles:
    """``rows`` queries per workgroup (``threads_per_row`` invocations each), ``keys`` per tile; V in
    workgroup memory when ``shared_v``."""

    rows: int
    keys: int
    shared_v: bool

    @property
    def threads_per_row(self) -> int:
        return FLASH_THREADS // self.rows

    def shared_bytes(self, head: int, value_head: int) -> int:
        floats = self.rows * (head + 1) + self.keys * (head + 1) + self.rows * self.keys
        if self.shared_v:
            floats += self.keys * value_head
        return 4 * floats


def flash_tiles(problem: FlashProblem, caps: DeviceCaps) -> FlashTiles:
    """The largest tiles that fit the device's workgroup storage: a query block of up to 16 rows (fewer for a short
    query, down to one for decoding), key tiles of 32 (or one per invocation of a row, when rows are few), halved
    until they fit (down to 8: invocations of a row beyond the tile's keys then sit out the scores); V read from device memory when even the smallest tile with V does not fit."""
    rows = 1
    while rows < 16 and rows < problem.sq:
        rows *= 2
    limit = caps.limits.max_compute_workgroup_storage_size
    per_row = FLASH_THREADS // rows
    for shared_v in (True, False):
        keys = max(32, per_row)
        while keys >= 8:
            tiles = FlashTiles(rows, keys, shared_v)
            if tiles.shared_bytes(problem.head, problem.value_head) <= limit:
                return tiles
            keys //= 2
    raise NotOnDevice(
        f"fused attention: head size {problem.head} needs more workgroup storage than the device's {limit} bytes"
    )


def _batch_offset(view: OperandView, batch: Sequence[int]) -> str:
    """WGSL expression of the operand's offset for the linear batch index ``z``."""
    terms = []
    inner = 1
    for size, stride in reversed(list(zip(batch, view.batch_strides))):
        if size != 1 and stride != 0:
            index = f"z / {inner}u" if inner != 1 else "z"
            if inner * size < _product(batch):
                index = f"({index}) % {size}u"
            terms.append(f"({index}) * {stride}u")
        inner *= size
    return " + ".join(terms) or "0u"


def _product(values: Sequence[int]) -> int:
    result = 1
    for value in values:
        result *= value
    return result


def _tile_load(
    target: str, pitch: int, source: str, view: OperandView, base: str, first: str, rows: int, cols: int, limit: int
) -> str:
    """WGSL loop filling ``target[row * pitch + col]`` for a ``rows x cols`` tile starting at row ``first``, zero
    past row ``limit``; consecutive invocations take consecutive elements of whichever axis is contiguous."""
    if view.row_stride < view.col_stride:
        row, col = f"t % {rows}u", f"t / {rows}u"
    else:
        row, col = f"t / {cols}u", f"t % {cols}u"
    return f"""    for (var t = li; t < {rows * cols}u; t = t + {FLASH_THREADS}u) {{
        let row = {row};
        let col = {col};
        var x = 0.0;
        if ({first} + row < {limit}u) {{
            x = {source}[{base} + ({first} + row) * {view.row_stride}u + col * {view.col_stride}u];
        }}
        {target}[row * {pitch}u + col] = x;
    }}
"""


def flash_attention_wgsl(problem: FlashProblem, caps: DeviceCaps) -> tuple[str, tuple[int, int, int], BindingTable]:
    """The kernel's WGSL, grid and bindings (raises :class:`NotOnDevice` when it cannot run on ``caps``)."""
    p = problem
    if min(p.sq, p.sk, p.head, p.value_head) <= 0:
        raise NotOnDevice("fused attention: an empty query, key or head dimension is left to the unfused operators")
    tiles = flash_tiles(p, caps)
    rows, keys, tpr = tiles.rows, tiles.keys, tiles.threads_per_row
    per_thread_scores = -(-keys // tpr)
    columns = -(-p.value_head // tpr)
    key_tiles = -(-p.sk // keys)
    check_loop_budget(
        "fused attention",
        -(-rows * p.head // FLASH_THREADS)
        + key_tiles
        * (
            -(-keys * p.head // FLASH_THREADS) * (2 if tiles.shared_v else 1)
            + per_thread_scores * (p.head + 1)
            + keys * (2 + columns)
        )
        + columns,
        caps,
    )
    blocks = -(-p.sq // rows)
    groups = blocks * _product(p.batch)
    grid = grid_for_groups(groups, caps)

    table = BindingTable()
    q_name = table.add(Binding("input", p.q.index))
    k_name = table.add(Binding("input", p.k.index))
    v_name = table.add(Binding("input", p.v.index))
    mask_name = table.add(Binding("input", p.mask.index)) if p.mask is not None else ""
    out_name = table.add(Binding("output", p.out.index), writable=True)
    pitch = p.head + 1

    bias = ""
    if p.mask is not None:
        bias = f"""
                let b = {mask_name}[mb + i * {p.mask.row_stride}u + j * {p.mask.col_stride}u];
                if (bitcast<u32>(b) == 0xff800000u) {{ x = neg_inf(); }} else {{ x = x + b * {wgsl_f32(p.bias_scale)}; }}"""
    key_end = f"{p.sk}u"
    keep = f"j < {p.sk}u && i < {p.sq}u"
    if p.causal_offset is not None:
        # keys past the block's last row's frontier are dropped for every row of the block: stop the walk there
        key_end = f"min({p.sk}u, u32(max(0, i32(i0) + {rows + p.causal_offset})))"
        keep += f" && i32(j) <= i32(i) + {p.causal_offset}"
    v_read = (
        f"vs[jj * {p.value_head}u + col]"
        if tiles.shared_v
        else (f"{v_name}[vb + (j0 + jj) * {p.v.row_stride}u + col * {p.v.col_stride}u]")
    )
    v_load = _tile_load("vs", p.value_head, v_name, p.v, "vb", "j0", keys, p.value_head, p.sk) if tiles.shared_v else ""
    wgsl = f"""{table.declarations()}
var<workgroup> qs: array<f32, {rows * pitch}>;
var<workgroup> ks: array<f32, {keys * pitch}>;
{f"var<workgroup> vs: array<f32, {keys * p.value_head}>;" if tiles.shared_v else ""}
var<workgroup> ps: array<f32, {rows * keys}>;

// -inf and NaN made at run time (WGSL makes non-finite constant expressions an error)
fn neg_inf() -> f32 {{
    var bits = 0xff800000u;
    return bitcast<f32>(bits);
}}
fn nan() -> f32 {{
    var bits = 0x7fc00000u;
    return bitcast<f32>(bits);
}}

@compute @workgroup_size({FLASH_THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let g = {workgroup_index(grid)};
    if (g >= {groups}u) {{ return; }}
    let z = g / {blocks}u;
    let i0 = (g % {blocks}u) * {rows}u;
    let qb = {_batch_offset(p.q, p.batch)};
    let kb = {_batch_offset(p.k, p.batch)};
    let vb = {_batch_offset(p.v, p.batch)};
    {f"let mb = {_batch_offset(p.mask, p.batch)};" if p.mask is not None else ""}
    let r = li / {tpr}u;
    let c = li % {tpr}u;
    let i = i0 + r;
{_tile_load("qs", pitch, q_name, p.q, "qb", "i0", rows, p.head, p.sq)}
    var m = 0.0;
    var l = 0.0;
    var seen = false;
    var acc: array<f32, {columns}>;
    let key_end = {key_end};
    for (var j0 = 0u; j0 < key_end; j0 = j0 + {keys}u) {{
        workgroupBarrier();
{_tile_load("ks", pitch, k_name, p.k, "kb", "j0", keys, p.head, p.sk)}{v_load}
        workgroupBarrier();
        for (var s = 0u; s < {per_thread_scores}u; s = s + 1u) {{
            let jj = c + s * {tpr}u;
            {f"if (jj >= {keys}u) {{ break; }}" if keys < tpr else ""}
            let j = j0 + jj;
            var x = neg_inf();
            if ({keep}) {{
                var dot = 0.0;
                for (var d = 0u; d < {p.head}u; d = d + 1u) {{
                    dot = fma(qs[r * {pitch}u + d], ks[jj * {pitch}u + d], dot);
                }}
                x = dot * {wgsl_f32(p.logit_scale)};{bias}
            }}
            ps[r * {keys}u + jj] = x;
        }}
        workgroupBarrier();
        var top = 0.0;
        var hit = false;
        for (var jj = 0u; jj < {keys}u; jj = jj + 1u) {{
            let x = ps[r * {keys}u + jj];
            if (bitcast<u32>(x) != 0xff800000u) {{
                top = select(x, max(top, x), hit);
                hit = true;
            }}
        }}
        if (hit) {{
            let next = select(top, max(m, top), seen);
            let alpha = select(0.0, exp(m - next), seen);
            l = l * alpha;
            for (var e = 0u; e < {columns}u; e = e + 1u) {{ acc[e] = acc[e] * alpha; }}
            m = next;
            seen = true;
            for (var jj = 0u; jj < {keys}u; jj = jj + 1u) {{
                let x = ps[r * {keys}u + jj];
                if (bitcast<u32>(x) == 0xff800000u) {{ continue; }}
                let w = exp(x - m);
                l = l + w;
                for (var e = 0u; e < {columns}u; e = e + 1u) {{
                    let col = min(c + e * {tpr}u, {p.value_head - 1}u);
                    acc[e] = fma(w, {v_read}, acc[e]);
                }}
            }}
        }}
    }}
    if (i < {p.sq}u) {{
        let ob = {_batch_offset(p.out, p.batch)} + i * {p.out.row_stride}u;
        for (var e = 0u; e < {columns}u; e = e + 1u) {{
            let col = c + e * {tpr}u;
            if (col < {p.value_head}u) {{ {out_name}[ob + col * {p.out.col_stride}u] = select({"0.0" if p.empty_rows_zero else "nan()"}, acc[e] / l, seen); }}
        }}
    }}
}}
"""
    return wgsl, grid, table
