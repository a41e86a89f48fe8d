"""The flash-attention kernel for many query rows: each invocation owns one query row and a share of the keys.

:mod:`._flash_attention`'s kernel splits one row's scores across 8 invocations, which exchange maxima, sums and
weights through workgroup memory with three barriers per key tile: every multiply-add there pays a workgroup-memory
read or two, so it computes well below the tiled GEMMs.  Here the work of a row stays in one invocation's
registers: its query row (``head / 4`` vectors; read from workgroup memory instead when the head is over 64, so the
registers hold the accumulators), its running maximum and sum, and its ``value_head / 4`` output accumulators.  Per
key it reads one K row and one V row from the workgroup's tiles, the same rows for every invocation of a key split
(a broadcast, no bank conflicts), for ``head + value_head`` multiply-adds.

A workgroup of 128 invocations owns ``rows`` query rows of one batch index and ``splits = 128 / rows`` key splits:
the keys of each tile of ``keys`` are dealt out in ``keys / splits`` consecutive runs, one per split, so every
invocation walks all key tiles but folds in only its split's run of each.  The splits multiply the invocations a
problem with few rows (a small model's 9 000 query rows over all heads, say) puts on the GPU.  After the last tile
the splits combine: each writes its maximum, sum and accumulators to workgroup memory (over the tiles), and split 0
rescales them to the largest maximum and adds them up (the online softmax's merge), then stores the row.

Scores are folded in groups of up to 8 keys: the group's maximum first, then the accumulators are rescaled once by
``exp(old max - new max)`` and the group's weighted V rows added.  A dropped key (a mask value of ``-inf``, past
the causal frontier) contributes nothing, and a row whose every key is dropped is NaN (zero for ``Attention``).

f16 operands (``OperandView.element``) are widened as the tiles are loaded: the tiles, the query row, the online
softmax and the accumulators are f32, and the store converts once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._flash_attention import (
    FlashProblem,
    _batch_offset,
    _product,
    bind_operands,
    flash_attention_wgsl,
    read_f32,
    stored,
)
from ._kernel import DeviceCaps, check_loop_budget
from ._tiling import BindingTable, grid_for_groups, wgsl_f32, workgroup_index

__all__ = ["RowsTiles", "attention_kernel", "flash_rows_wgsl", "key_splits", "rows_tiles"]

#: Invocations per workgroup.
ROWS_THREADS = 128
#: Invocations a problem should put on the GPU at least (more key splits until it does, up to 8).
TARGET_INVOCATIONS = 1 << 16
#: Heads up to this size keep the query row in registers; larger ones read it from workgroup memory.
REGISTER_HEAD = 64
#: The largest head and value head this kernel takes (registers for the accumulators).
MAX_HEAD = 128


@dataclass(frozen=True)
class RowsTiles:
    """``rows`` query rows and ``splits`` key splits per workgroup (rows x splits = 128), ``keys`` per tile."""

    rows: int
    splits: int
    keys: int

    @property
    def run(self) -> int:
        """Keys of a tile each split folds in."""
        return self.keys // self.splits

    def shared_vectors(self, head: int, value_head: int, masked: bool, shared_q: bool) -> tuple[int, int, int]:
        """vec4s of the region (the K, V and mask tiles, then the merge's slabs over them) and of the Q tile, and the
        merge's slab width in vec4 columns (see :meth:`slab`)."""
        tiles = self.keys * (head + value_head) // 4 + (self.rows * self.keys // 4 if masked else 0)
        slab = self.slab(tiles, value_head)
        region = max(tiles, (self.splits - 1) * self.rows * (slab + 1))
        return region, self.rows * (head // 4 + 1) if shared_q else 0, slab

    def slab(self, tiles: int, value_head: int) -> int:
        """The merge's columns per round (vec4s): as many of the value head's as fit over ``tiles`` vec4s, at least 1."""
        others = (self.splits - 1) * self.rows
        if others == 0:
            return value_head // 4
        return max(1, min(value_head // 4, tiles // others - 1))


def key_splits(rows_total: int) -> int:
    """The fewest key splits (1, 2, 4, 8) that put :data:`TARGET_INVOCATIONS` invocations on ``rows_total`` rows."""
    splits = 1
    while splits < 8 and rows_total * splits < TARGET_INVOCATIONS:
        splits *= 2
    return splits


def rows_tiles(problem: FlashProblem, caps: DeviceCaps) -> RowsTiles | None:
    """This kernel's tiles for ``problem``, or None when it does not take it: heads not a multiple of 4 or over
    :data:`MAX_HEAD`, or fewer than 16 query rows (decoding: :mod:`._flash_attention`'s kernel spreads a row over
    invocations instead).  Splits: the fewest (1, 2, 4, 8) that put :data:`TARGET_INVOCATIONS` invocations on the GPU;
    key tiles of 8 keys per split (at least 32), halved while the workgroup storage does not fit."""
    p = problem
    if p.head % 4 or p.value_head % 4 or max(p.head, p.value_head) > MAX_HEAD or p.sq < 16:
        return None
    splits = key_splits(p.sq * _product(p.batch))
    limit = caps.limits.max_compute_workgroup_storage_size
    while splits <= 8:  # more splits (fewer rows) when a large head's Q tile does not fit
        keys = max(32, 8 * splits)
        while keys >= max(splits, 4):
            tiles = RowsTiles(ROWS_THREADS // splits, splits, keys)
            region, q, _ = tiles.shared_vectors(p.head, p.value_head, p.mask is not None, p.head > REGISTER_HEAD)
            if 16 * (region + q) <= limit:
                return tiles
            keys //= 2
        splits *= 2
    return None


def flash_rows_wgsl(
    problem: FlashProblem, tiles: RowsTiles, caps: DeviceCaps
) -> tuple[str, tuple[int, int, int], BindingTable]:
    """The kernel's WGSL, grid and bindings for ``problem`` with ``tiles`` (from :func:`rows_tiles`)."""
    p, t = problem, tiles
    rows, splits, keys, run = t.rows, t.splits, t.keys, t.run
    hv, vv = p.head // 4, p.value_head // 4
    shared_q = p.head > REGISTER_HEAD
    region, q_vectors, slab = t.shared_vectors(p.head, p.value_head, p.mask is not None, shared_q)
    v_at = keys * hv  # the V tile's first vector in the region
    m_at = v_at + keys * vv  # the mask tile's
    key_tiles = -(-p.sk // keys)
    group = min(8, run)
    check_loop_budget(
        "fused attention",
        (-(-rows * hv // ROWS_THREADS) if shared_q else 0)
        + key_tiles * (-(-keys * (hv + vv) // ROWS_THREADS) + -(-rows * keys // ROWS_THREADS) + run // group)
        + splits,
        caps,
    )
    blocks = -(-p.sq // rows)
    groups = blocks * _product(p.batch)
    grid = grid_for_groups(groups, caps)

    table, (q_name, k_name, v_name, mask_name, out_name) = bind_operands(p)
    elements = {q_name: p.q.element, k_name: p.k.element, v_name: p.v.element}

    def vector(name: str, view_base: str, row: str, first: str, view_col: int) -> str:
        at = f"{view_base} + {row} + ({first} + LANEu) * {view_col}u"
        lanes = [read_f32(name, at.replace("LANE", str(lane)), elements[name]) for lane in range(4)]
        return f"vec4<f32>({', '.join(lanes)})"

    # The Q row: registers q0.. (or the Q tile), loaded once
    q_row = f"qb + min(i, {p.sq - 1}u) * {p.q.row_stride}u"
    if shared_q:
        q_load = f"""    for (var t = li; t < {rows * hv}u; t = t + {ROWS_THREADS}u) {{
        let row = t / {hv}u;
        let d = t % {hv}u;
        qs[row * {hv + 1}u + d] = {vector(q_name, "qb", f"min(i0 + row, {p.sq - 1}u) * {p.q.row_stride}u", "d * 4u", p.q.col_stride)};
    }}
"""
        q_of = [f"qs[r * {hv + 1}u + {d}u]" for d in range(hv)]
    else:
        q_load = (
            "\n".join(f"    let q{d} = {vector(q_name, q_row, '0u', f'{4 * d}u', p.q.col_stride)};" for d in range(hv))
            + "\n"
        )
        q_of = [f"q{d}" for d in range(hv)]

    # The tiles: K and V rows [keys, head] / [keys, value_head] as vec4s, the mask [rows, keys] packed in vec4s
    def tile_load(source: str, view_base: str, row_stride: int, col_stride: int, vectors: int, at: int) -> str:
        return f"""    for (var t = li; t < {keys * vectors}u; t = t + {ROWS_THREADS}u) {{
        let jj = t / {vectors}u;
        let d = t % {vectors}u;
        let j = min(j0 + jj, {p.sk - 1}u);
        sm[{at}u + t] = {vector(source, view_base, f"j * {row_stride}u", "d * 4u", col_stride)};
    }}
"""

    loads = tile_load(k_name, "kb", p.k.row_stride, p.k.col_stride, hv, 0)
    loads += tile_load(v_name, "vb", p.v.row_stride, p.v.col_stride, vv, v_at)
    if p.mask is not None:
        m = p.mask
        lanes = [
            read_f32(
                mask_name,
                f"mb + min(i0 + row, {p.sq - 1}u) * {m.row_stride}u + min(j0 + jq * 4u + {lane}u, {p.sk - 1}u)"
                f" * {m.col_stride}u",
                m.element,
            )
            for lane in range(4)
        ]
        loads += f"""    for (var t = li; t < {rows * keys // 4}u; t = t + {ROWS_THREADS}u) {{
        let row = t / {keys // 4}u;
        let jq = t % {keys // 4}u;
        sm[{m_at}u + t] = vec4<f32>({", ".join(lanes)});
    }}
"""
    keep = f"j < {p.sk}u && i < {p.sq}u"
    key_end = f"{p.sk}u"
    if p.causal_offset is not None:
        key_end = f"min({p.sk}u, u32(max(0, i32(i0) + {rows + p.causal_offset})))"
        keep += f" && i32(j) <= i32(i) + {p.causal_offset}"

    # One group of `group` keys: scores, the group's maximum, the rescale, the weighted V rows
    lines = []
    for g in range(group):
        dots = " + ".join(f"dot({q_of[d]}, sm[kr{g} + {d}u])" for d in range(hv))
        bias = ""
        if p.mask is not None:
            bias = f"""
            let b = sm[{m_at}u + r * {keys // 4}u + (jj{g} / 4u)][jj{g} % 4u];
            if (bitcast<u32>(b) == 0xff800000u) {{ x = neg_inf(); }} else {{ x = x + b * {wgsl_f32(p.bias_scale)}; }}"""
        lines.append(f"""        let jj{g} = jg + {g}u;
        let kr{g} = jj{g} * {hv}u;
        var x{g} = neg_inf();
        {{
            let j = j0 + jj{g};
            if ({keep}) {{
                var x = ({dots}) * {wgsl_f32(p.logit_scale)};{bias}
                x{g} = x;
            }}
            if (!dropped(x{g})) {{
                top = select(x{g}, max(top, x{g}), hit);
                hit = true;
            }}
        }}""")
    lines.append("        if (hit) {")
    lines.append("            let next = select(top, max(m, top), seen);")
    lines.append("            let alpha = select(1.0, exp(m - next), seen);")
    lines.append("            m = next;")
    lines.append("            seen = true;")
    lines.append("            l = l * alpha;")
    lines += [f"            acc{e} = acc{e} * alpha;" for e in range(vv)]
    for g in range(group):
        lines.append(f"            let w{g} = select(exp(x{g} - m), 0.0, dropped(x{g}));")
        lines.append(f"            l = l + w{g};")
        lines.append(f"            let vr{g} = {v_at}u + jj{g} * {vv}u;")
        lines += [f"            acc{e} = acc{e} + w{g} * sm[vr{g} + {e}u];" for e in range(vv)]
    lines.append("        }")
    group_block = "\n".join(lines) + "\n"

    accumulators = "\n".join(f"    var acc{e} = vec4<f32>();" for e in range(vv))
    # The merge, in rounds of `slab` accumulators: splits 1.. write their (m, l, seen) and that slab over the tiles;
    # split 0 finds the largest maximum of the splits that saw a key and folds the slab in, rescaled to it
    combine = ""
    if splits > 1:
        stride = slab + 1
        rounds = []
        for first in range(0, vv, slab):
            columns = list(range(first, min(vv, first + slab)))
            write = [f"        let at = ((s - 1u) * {rows}u + r) * {stride}u;"]
            write.append("        sm[at] = vec4<f32>(m, l, select(0.0, 1.0, seen), 0.0);")
            write += [f"        sm[at + {k + 1}u] = acc{e};" for k, e in enumerate(columns)]
            merge = ["        var top = m;", "        var any = seen;"]
            merge.append(f"        for (var o = 1u; o < {splits}u; o = o + 1u) {{")
            merge.append(f"            let h = sm[((o - 1u) * {rows}u + r) * {stride}u];")
            merge.append("            if (h.z > 0.0) { top = select(h.x, max(top, h.x), any); any = true; }")
            merge.append("        }")
            merge.append("        let mine = select(0.0, exp(m - top), seen);")
            merge.append("        var total = l * mine;")
            merge += [f"        acc{e} = acc{e} * mine;" for e in columns]
            merge.append(f"        for (var o = 1u; o < {splits}u; o = o + 1u) {{")
            merge.append(f"            let at = ((o - 1u) * {rows}u + r) * {stride}u;")
            merge.append("            let h = sm[at];")
            merge.append("            if (h.z > 0.0) {")
            merge.append("                let theirs = exp(h.x - top);")
            merge.append("                total = total + h.y * theirs;")
            merge += [f"                acc{e} = acc{e} + sm[at + {k + 1}u] * theirs;" for k, e in enumerate(columns)]
            merge.append("            }")
            merge.append("        }")
            merge.append("        merged_l = total;")
            merge.append("        merged_seen = any;")
            rounds.append(f"""    workgroupBarrier();
    if (s > 0u) {{
{chr(10).join(write)}
    }}
    workgroupBarrier();
    if (s == 0u) {{
{chr(10).join(merge)}
    }}
""")
        combine = (
            "    var merged_l = 0.0;\n    var merged_seen = false;\n"
            + "".join(rounds)
            + "    l = merged_l;\n    seen = merged_seen;\n"
        )
    empty = "0.0" if p.empty_rows_zero else "nan()"
    stores = [f"        let ob = {_batch_offset(p.out, p.batch)} + i * {p.out.row_stride}u;"]
    for e in range(vv):
        for lane in range(4):
            column = 4 * e + lane
            value = stored(f"select({empty}, acc{e}.{'xyzw'[lane]} / l, seen)", p.out.element)
            stores.append(f"        {out_name}[ob + {column * p.out.col_stride}u] = {value};")
    store_block = "\n".join(stores)
    wgsl = f"""{table.enables()}{table.declarations()}
var<workgroup> sm: array<vec4<f32>, {region}>;
{f"var<workgroup> qs: array<vec4<f32>, {q_vectors}>;" if shared_q else ""}

// -inf and NaN made at run time (WGSL makes non-finite constant expressions an error)
fn neg_inf() -> f32 {{
    var bits = 0xff800000u;
    return bitcast<f32>(bits);
}}
fn nan() -> f32 {{
    var bits = 0x7fc00000u;
    return bitcast<f32>(bits);
}}
fn dropped(x: f32) -> bool {{
    return bitcast<u32>(x) == 0xff800000u;
}}

@compute @workgroup_size({ROWS_THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let g = {workgroup_index(grid)};
    if (g >= {groups}u) {{ return; }}
    let z = g / {blocks}u;
    let i0 = (g % {blocks}u) * {rows}u;
    let qb = {_batch_offset(p.q, p.batch)};
    let kb = {_batch_offset(p.k, p.batch)};
    let vb = {_batch_offset(p.v, p.batch)};
    {f"let mb = {_batch_offset(p.mask, p.batch)};" if p.mask is not None else ""}
    let r = li % {rows}u;
    let s = li / {rows}u;
    let i = i0 + r;
{q_load}    var m = 0.0;
    var l = 0.0;
    var seen = false;
{accumulators}
    let key_end = {key_end};
    for (var j0 = 0u; j0 < key_end; j0 = j0 + {keys}u) {{
        workgroupBarrier();
{loads}        workgroupBarrier();
        for (var jg = s * {run}u; jg < (s + 1u) * {run}u; jg = jg + {group}u) {{
        var top = 0.0;
        var hit = false;
{group_block}        }}
    }}
{combine}    if (s == 0u && i < {p.sq}u) {{
{store_block}
    }}
}}
"""
    return wgsl, grid, table


def attention_kernel(problem: FlashProblem, caps: DeviceCaps) -> tuple[str, tuple[int, int, int], BindingTable]:
    """The flash kernel for ``problem``: this module's when :func:`rows_tiles` takes it (16 query rows or more), else
    :mod:`._flash_attention`'s (decoding, odd heads)."""
    tiles = rows_tiles(problem, caps)
    if tiles is not None:
        return flash_rows_wgsl(problem, tiles, caps)
    return flash_attention_wgsl(problem, caps)
