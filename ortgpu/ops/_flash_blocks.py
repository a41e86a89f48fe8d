"""The flash-attention kernel with register-tiled products: a block of query rows per workgroup, 4 rows per invocation.

:mod:`._flash_rows`'s kernel gives each invocation one query row: every multiply-add of its scores and of its
output reads one vector from workgroup memory, and a problem with few rows puts few invocations on the GPU.  Here,
as in a tiled GEMM, each value read from workgroup memory feeds several multiply-adds:

* A workgroup owns ``rows`` query rows of one batch index (``rows / 4`` row groups) and ``4 * rows`` invocations:
  row group ``tr = li % (rows / 4)``, column ``tc = li / (rows / 4)`` (16 columns).  The Q block is loaded once into
  workgroup memory, transposed so that one vec4 holds a dimension of a row group's 4 rows.
* Per tile of ``keys`` keys (K transposed and V loaded into workgroup memory), invocation ``(tr, tc)`` computes the
  scores of its 4 rows and ``keys / 16`` keys in registers: per head dimension one Q vec4 and one K vector, 4 x
  ``keys / 16`` multiply-adds.
* The online softmax: each invocation's maximum per row goes to workgroup memory, every invocation of the row group
  reads the 16 partials, so all hold the same running maximum ``m`` and rescale factor without a second round; the
  weights go to workgroup memory transposed (a vec4 per key holds the row group's 4 weights), their partial sums
  likewise.
* The output: invocation ``(tr, tc)`` owns the row group's value columns ``tc, tc + 16, ...`` (vec4s): per key one
  weight vec4 and one V vec4 per column for 16 multiply-adds.

Dropped keys (past the keys, past the causal frontier, a mask value of ``-inf``) are tracked with flags, never
with infinite arithmetic (WGSL lets an implementation assume there is none): their score counts as the lowest
float in the maxima and their weight is zero.  Exponents are clamped at ``m - 88`` (a weight below ``exp(-88)``
becomes that instead of 0, far below float32's resolution of a sum with the row's largest weight, 1), so a
finite mask's ``float32.min`` never overflows a difference.  A row with no key kept has a zero sum: NaN (the
unfused Softmax's result), or zero for ``Attention``.

f16 operands are widened as they are loaded; the tiles, the softmax and the accumulators are f32.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._flash_attention import FlashProblem, _batch_offset, _product, bind_operands, read_f32, stored
from ._kernel import DeviceCaps, check_loop_budget
from ._tiling import BindingTable, grid_for_groups, wgsl_f32, workgroup_index

__all__ = ["BlockTiles", "block_tiles", "flash_blocks_wgsl"]

#: Invocations per row group (the score tile's columns of keys, the output's columns of value vectors).
COLUMNS = 16
#: The largest head and value head the kernel takes.
MAX_HEAD = 128
#: The largest float32, the "no key" of the maxima.
_LOWEST = "-3.40282347e+38f"


@dataclass(frozen=True)
class BlockTiles:
    """``rows`` query rows per workgroup (a multiple of 4; ``4 * rows`` invocations) and ``keys`` per tile (16, 32
    or 64: ``keys / 16`` per invocation)."""

    rows: int
    keys: int

    @property
    def threads(self) -> int:
        return 4 * self.rows

    @property
    def per_thread(self) -> int:
        return self.keys // COLUMNS

    def shared_bytes(self, head: int, value_head: int) -> int:
        """Q block, K and V tiles, the weights, and the partial maxima and sums."""
        floats = head * self.rows + self.keys * (head + value_head) + self.keys * self.rows
        return 4 * (floats + 2 * COLUMNS * self.rows)


#: Tile candidates, the first that fits the device's workgroup storage is taken.
CANDIDATES = (BlockTiles(64, 32), BlockTiles(32, 32), BlockTiles(32, 16), BlockTiles(16, 16))


def block_tiles(problem: FlashProblem, caps: DeviceCaps) -> BlockTiles | None:
    """The first of :data:`CANDIDATES` that fits ``caps``' workgroup storage, or None when the kernel does not take
    ``problem`` (heads not a multiple of 4 or over :data:`MAX_HEAD`, or no candidate fits)."""
    p = problem
    if p.head % 4 or p.value_head % 4 or max(p.head, p.value_head) > MAX_HEAD:
        return None
    limit = caps.limits.max_compute_workgroup_storage_size
    for tiles in CANDIDATES:
        if tiles.rows <= max(16, 4 * -(-p.sq // 4)) and tiles.shared_bytes(p.head, p.value_head) <= limit:
            return tiles
    for tiles in reversed(CANDIDATES):  # a short query: the smallest block that fits
        if tiles.shared_bytes(p.head, p.value_head) <= limit:
            return tiles
    return None


def _kvec(n: int) -> str:
    return "f32" if n == 1 else f"vec{n}<f32>"


def flash_blocks_wgsl(
    problem: FlashProblem, tiles: BlockTiles, caps: DeviceCaps
) -> tuple[str, tuple[int, int, int], BindingTable]:
    """The kernel's WGSL, grid and bindings for ``problem`` with ``tiles`` (from :func:`block_tiles`)."""
    p, t = problem, tiles
    rows, keys, threads, kpt = t.rows, t.keys, t.threads, t.per_thread
    groups_of_rows = rows // 4
    head, vv = p.head, p.value_head // 4
    columns_per_thread = -(-vv // COLUMNS)
    key_tiles = -(-p.sk // keys)
    check_loop_budget(
        "fused attention",
        -(-head * groups_of_rows // threads)
        + key_tiles * (2 * -(-keys * (head + 4 * vv) // threads) + head + 2 * COLUMNS + keys),
        caps,
    )
    blocks = -(-p.sq // rows)
    groups = blocks * _product(p.batch)
    grid = grid_for_groups(groups, caps)
    table, (q_name, k_name, v_name, mask_name, out_name) = bind_operands(p)
    elements = {q_name: p.q.element, k_name: p.k.element, v_name: p.v.element}

    def read(name: str, at: str) -> str:
        return read_f32(name, at, elements[name])

    kv = _kvec(kpt)
    kvec_count = keys // kpt
    # The Q block: qs[d * groups_of_rows + tr] holds dimension d of rows 4 tr .. 4 tr + 3 (clamped to the last row)
    q_lanes = ", ".join(
        read(q_name, f"qb + min(i0 + t4 * 4u + {r}u, {p.sq - 1}u) * {p.q.row_stride}u + d * {p.q.col_stride}u")
        for r in range(4)
    )
    # The K tile, transposed: ks[d * (keys / kpt) + c] holds dimension d of keys c * kpt .. c * kpt + kpt - 1
    k_lanes = [
        read(k_name, f"kb + min(j0 + c * {kpt}u + {e}u, {p.sk - 1}u) * {p.k.row_stride}u + d * {p.k.col_stride}u")
        for e in range(kpt)
    ]
    k_value = k_lanes[0] if kpt == 1 else f"{kv}({', '.join(k_lanes)})"
    v_lanes = ", ".join(
        read(v_name, f"vb + min(j0 + jj, {p.sk - 1}u) * {p.v.row_stride}u + (c * 4u + {e}u) * {p.v.col_stride}u")
        for e in range(4)
    )

    # Scores of the invocation's 4 rows (vec4 lanes) and kpt keys, with their keep flags
    def lane(e: int) -> str:
        return "" if kpt == 1 else "xyzw"[e]

    score_lines = []
    for e in range(kpt):
        key = f"j0 + tc * {kpt}u + {e}u"
        keep = [f"{key} < {p.sk}u"]
        if p.causal_offset is not None:
            keep.append(f"vec4<i32>(i32({key})) <= vec4<i32>(rows_i) + vec4<i32>({p.causal_offset})")
        score_lines.append(f"        var x{e} = s{e} * {wgsl_f32(p.logit_scale)};")
        if p.mask is not None:
            m = p.mask
            b_lanes = ", ".join(
                read_f32(
                    mask_name,
                    f"mb + min(rows_i[{r}], {p.sq - 1}u) * {m.row_stride}u + min({key}, {p.sk - 1}u) * {m.col_stride}u",
                    m.element,
                )
                for r in range(4)
            )
            score_lines.append(f"        let b{e} = vec4<f32>({b_lanes});")
            keep.append(f"bitcast<vec4<u32>>(b{e}) != vec4<u32>(0xff800000u)")
            score_lines.append(
                f"        x{e} = x{e} + select(vec4<f32>(), b{e}, bitcast<vec4<u32>>(b{e}) != vec4<u32>(0xff800000u))"
                f" * {wgsl_f32(p.bias_scale)};"
            )
        flags = [f"vec4<bool>({k})" if "vec4" not in k else k for k in keep]
        keep_expr = flags[0]
        for flag in flags[1:]:
            keep_expr = f"({keep_expr} & {flag})"
        score_lines.append(f"        let keep{e} = {keep_expr};")
        score_lines.append(f"        x{e} = select(vec4<f32>({_LOWEST}), x{e}, keep{e});")
    score_block = "\n".join(score_lines)
    partial_max = "x0" if kpt == 1 else "max(" * (kpt - 1) + "x0" + "".join(f", x{e})" for e in range(1, kpt))
    weights = "\n".join(
        f"        let w{e} = select(vec4<f32>(), exp(max(x{e}, m - 88.0) - m), keep{e});\n"
        f"        ps[(tc * {kpt}u + {e}u) * {groups_of_rows}u + tr] = w{e};"
        for e in range(kpt)
    )
    weight_sum = " + ".join(f"w{e}" for e in range(kpt))
    dims = "\n".join(f"            s{e} = s{e} + q * kk{'.' + lane(e) if kpt > 1 else ''};" for e in range(kpt))
    acc_decl = "\n".join(f"    var a{r}_{c} = vec4<f32>();" for c in range(columns_per_thread) for r in range(4))
    rescale = "\n".join(
        f"        a{r}_{c} = a{r}_{c} * alpha[{r}];" for c in range(columns_per_thread) for r in range(4)
    )
    accumulate = []
    for c in range(columns_per_thread):
        column = f"tc + {c * COLUMNS}u"
        body = "\n".join(f"                a{r}_{c} = a{r}_{c} + w[{r}] * v;" for r in range(4))
        accumulate.append(f"""            if ({column} < {vv}u) {{
                let v = vs[jj * {vv}u + {column}];
{body}
            }}""")
    accumulate_block = "\n".join(accumulate)
    empty = "0.0" if p.empty_rows_zero else "nan()"
    stores = []
    for c in range(columns_per_thread):
        column = f"tc + {c * COLUMNS}u"
        lines = []
        for r in range(4):
            for e in range(4):
                value = stored(f"select(a{r}_{c}[{e}] / l[{r}], {empty}, l[{r}] == 0.0)", p.out.element)
                lines.append(
                    f"            if (rows_i[{r}] < {p.sq}u) {{ {out_name}[ob + rows_i[{r}] * {p.out.row_stride}u"
                    f" + (({column}) * 4u + {e}u) * {p.out.col_stride}u] = {value}; }}"
                )
        stores.append(f"        if ({column} < {vv}u) {{\n" + "\n".join(lines) + "\n        }")
    store_block = "\n".join(stores)
    key_end = f"{p.sk}u"
    if p.causal_offset is not None:
        key_end = f"min({p.sk}u, u32(max(0, i32(i0) + {rows + p.causal_offset})))"

    wgsl = f"""{table.enables()}{table.declarations()}
var<workgroup> qs: array<vec4<f32>, {head * groups_of_rows}>;
var<workgroup> ks: array<{kv}, {head * kvec_count}>;
var<workgroup> vs: array<vec4<f32>, {keys * vv}>;
var<workgroup> ps: array<vec4<f32>, {keys * groups_of_rows}>;
var<workgroup> pm: array<vec4<f32>, {COLUMNS * groups_of_rows}>;
var<workgroup> pl: array<vec4<f32>, {COLUMNS * groups_of_rows}>;

fn nan() -> f32 {{
    var bits = 0x7fc00000u;
    return bitcast<f32>(bits);
}}

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let g = {workgroup_index(grid)};
    if (g >= {groups}u) {{ return; }}
    let z = g / {blocks}u;
    let i0 = (g % {blocks}u) * {rows}u;
    let qb = {_batch_offset(p.q, p.batch)};
    let kb = {_batch_offset(p.k, p.batch)};
    let vb = {_batch_offset(p.v, p.batch)};
    {f"let mb = {_batch_offset(p.mask, p.batch)};" if p.mask is not None else ""}
    let ob = {_batch_offset(p.out, p.batch)};
    let tr = li % {groups_of_rows}u;
    let tc = li / {groups_of_rows}u;
    let rows_i = vec4<u32>(i0 + tr * 4u) + vec4<u32>(0u, 1u, 2u, 3u);
    for (var x = li; x < {head * groups_of_rows}u; x = x + {threads}u) {{
        let d = x % {head}u;
        let t4 = x / {head}u;
        qs[d * {groups_of_rows}u + t4] = vec4<f32>({q_lanes});
    }}
    var m = vec4<f32>({_LOWEST});
    var l = vec4<f32>();
{acc_decl}
    let key_end = {key_end};
    for (var j0 = 0u; j0 < key_end; j0 = j0 + {keys}u) {{
        workgroupBarrier();
        for (var x = li; x < {head * kvec_count}u; x = x + {threads}u) {{
            let d = x % {head}u;
            let c = x / {head}u;
            ks[d * {kvec_count}u + c] = {k_value};
        }}
        for (var x = li; x < {keys * vv}u; x = x + {threads}u) {{
            let c = x % {vv}u;
            let jj = x / {vv}u;
            vs[x] = vec4<f32>({v_lanes});
        }}
        workgroupBarrier();
{chr(10).join(f"        var s{e} = vec4<f32>();" for e in range(kpt))}
        for (var d = 0u; d < {head}u; d = d + 1u) {{
            let q = qs[d * {groups_of_rows}u + tr];
            let kk = ks[d * {kvec_count}u + tc];
{dims}
        }}
{score_block}
        pm[tc * {groups_of_rows}u + tr] = {partial_max};
        workgroupBarrier();
        var top = m;
        for (var o = 0u; o < {COLUMNS}u; o = o + 1u) {{
            top = max(top, pm[o * {groups_of_rows}u + tr]);
        }}
        let alpha = exp(max(m, top - 88.0) - top);
        m = top;
{weights}
        pl[tc * {groups_of_rows}u + tr] = {weight_sum};
        workgroupBarrier();
        var sum = vec4<f32>();
        for (var o = 0u; o < {COLUMNS}u; o = o + 1u) {{
            sum = sum + pl[o * {groups_of_rows}u + tr];
        }}
        l = l * alpha + sum;
{rescale}
        for (var jj = 0u; jj < {keys}u; jj = jj + 1u) {{
            let w = ps[jj * {groups_of_rows}u + tr];
{accumulate_block}
        }}
    }}
{store_block}
}}
"""
    return wgsl, grid, table
