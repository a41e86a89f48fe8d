"""One flash-attention kernel: ``softmax(scale * Q.K^T + bias) . V`` without writing the scores anywhere.

The problem (:class:`FlashProblem`) is stated in strides, so one generator serves every layout the callers have: the
fused SDPA pattern of an exported graph (:mod:`ortgpu._attention_fusion`, its Q/K/V strided views of the tensors
before the data-movement nodes it absorbed), and the ONNX ``Attention`` operator (3-D ``[B, S, H * D]`` inputs,
grouped K/V heads as a broadcast batch axis). Each operand gives an element offset, per-batch-axis strides (0 where
it is broadcast), a row stride and a column stride; so does the output (output ``out.index``, rows are queries,
columns the value dimension).

A workgroup of 128 invocations owns one batch index and a block of ``BQ`` query rows (``TPR = 128 / BQ``
invocations per row).  It keeps the Q block in workgroup memory and walks the keys in tiles of ``BK``: the K (and,
when it fits, V) tile is loaded cooperatively, each invocation computes ``BK / TPR`` scores of its row into a
shared score tile, and each then folds the row's tile into its running maximum, sum and ``ceil(Dv / TPR)`` output
accumulators (the online softmax: earlier sums are rescaled by ``exp(old max - new max)``).  A dropped key (a mask
value of ``-inf``, past the causal frontier) contributes nothing; a row whose every key is dropped is NaN, as the
unfused Softmax gives.  Tiles are sized to the device's workgroup storage: rows padded by one float so the
score loop's reads of different rows fall in different banks.

Each operand is stored as f32 or f16 (``OperandView.element``; f16 needs the device's ``shader-f16``): every load
widens into f32, the online softmax, the accumulators and the workgroup tiles stay f32, and the store converts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ._kernel import Binding, DeviceCaps, NotOnDevice, check_loop_budget
from ._tiling import BindingTable, grid_for_groups, wgsl_f32, workgroup_index

__all__ = ["FlashProblem", "FlashTiles", "OperandView", "flash_attention_wgsl", "flash_tiles", "read_f32", "stored"]

#: Invocations per workgroup.
FLASH_THREADS = 128


@dataclass(frozen=True)
class OperandView:
    """How the kernel reads one operand: input ``index`` of the node, at ``offset + sum(batch index * batch_strides) +
    row * row_stride + col * col_stride`` (elements). Q: rows are queries, columns the head dimension; K: rows are keys,
    columns the head dimension; V: rows are keys, columns the value dimension; the mask: rows are queries, columns keys.
    ``element``: the tensor's storage, ``f32`` or ``f16`` (read into f32, stored from it)."""

    index: int
    batch_strides: tuple[int, ...]
    row_stride: int
    col_stride: int
    element: str = "f32"
    offset: int = 0


def read_f32(name: str, index: str, element: str) -> str:
    """WGSL reading ``name[index]`` as f32 (f16 storage is widened; f32 is read as it is)."""
    return f"{name}[{index}]" if element == "f32" else f"f32({name}[{index}])"


def stored(value: str, element: str) -> str:
    """WGSL converting the f32 ``value`` to the storage ``element`` (unchanged for f32)."""
    return value if element == "f32" else f"{element}({value})"


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
    """``rows`` queries per workgroup (``threads_per_row`` invocations each), ``keys`` per tile, vectors of
    ``width`` floats along the head dimensions (4 where both head sizes allow); V in workgroup memory when
    ``shared_v``."""

    rows: int
    keys: int
    width: int
    shared_v: bool

    @property
    def threads_per_row(self) -> int:
        return FLASH_THREADS // self.rows

    def pitch(self, head: int) -> int:
        """Vectors per row of the Q and K tiles: one spare, so rows start in different banks."""
        return head // self.width + 1

    def shared_bytes(self, head: int, value_head: int) -> int:
        floats = (self.rows + self.keys) * self.pitch(head) * self.width + self.rows * self.keys
        floats += 2 * self.rows * min(self.threads_per_row, self.keys)  # the rows' partial maxima and sums
        if self.shared_v:
            floats += self.keys * value_head
        return 4 * floats


def flash_tiles(problem: FlashProblem, caps: DeviceCaps) -> FlashTiles:
    """The largest tiles that fit the device's workgroup storage: a query block of up to 16 rows (fewer for a short
    query, down to one for decoding), key tiles of 32 (64 for a single row), halved until they fit (down to 8:
    invocations of a row beyond the tile's keys then sit out the scores); V read from device memory when even the
    smallest tile with V does not fit."""
    rows = 1
    while rows < 16 and rows < problem.sq:
        rows *= 2
    width = 4 if problem.head % 4 == 0 and problem.value_head % 4 == 0 else 1
    limit = caps.limits.max_compute_workgroup_storage_size
    for shared_v in (True, False):
        keys = 64 if rows == 1 else 32
        while keys >= 8:
            tiles = FlashTiles(rows, keys, width, shared_v)
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
    if view.offset:
        terms.insert(0, f"{view.offset}u")
    return " + ".join(terms) or "0u"


def _product(values: Sequence[int]) -> int:
    result = 1
    for value in values:
        result *= value
    return result


def _vector(width: int) -> str:
    return "vec4<f32>" if width == 4 else "f32"


def _tile_load(
    target: str,
    pitch: int,
    width: int,
    source: str,
    view: OperandView,
    base: str,
    first: str,
    rows: int,
    cols: int,
    limit: int,
) -> str:
    """WGSL loop filling ``target[row * pitch + v]`` (vectors of ``width`` floats along the columns) for a
    ``rows x cols`` tile starting at row ``first``, zero past row ``limit``; consecutive invocations take
    consecutive elements of whichever axis is contiguous."""
    vectors = cols // width
    if view.row_stride < view.col_stride:
        row, vec = f"t % {rows}u", f"t / {rows}u"
    else:
        row, vec = f"t / {vectors}u", f"t % {vectors}u"
    at = f"{base} + ({first} + row) * {view.row_stride}u + (vec * {width}u + LANEu) * {view.col_stride}u"
    if width == 4:
        lanes = (read_f32(source, at.replace("LANE", str(lane)), view.element) for lane in range(4))
        value = "vec4<f32>(" + ", ".join(lanes) + ")"
    else:
        value = read_f32(source, at.replace("LANE", "0"), view.element)
    return f"""    for (var t = li; t < {rows * vectors}u; t = t + {FLASH_THREADS}u) {{
        let row = {row};
        let vec = {vec};
        var x = {_vector(width)}();
        if ({first} + row < {limit}u) {{ x = {value}; }}
        {target}[row * {pitch}u + vec] = x;
    }}
"""


def bind_operands(problem: FlashProblem) -> tuple[BindingTable, tuple[str, str, str, str, str]]:
    """The kernel's bindings (Q, K, V, the mask if any, the output, each as its storage element) and their WGSL names
    (the mask's "" without one)."""
    p = problem
    for view in (p.q, p.k, p.v, p.out) + ((p.mask,) if p.mask is not None else ()):
        if view.element not in ("f32", "f16"):
            raise NotOnDevice(f"fused attention: the kernel reads f32 or f16 storage, not {view.element}")
    table = BindingTable()
    q_name = table.add(Binding("input", p.q.index), p.q.element)
    k_name = table.add(Binding("input", p.k.index), p.k.element)
    v_name = table.add(Binding("input", p.v.index), p.v.element)
    mask_name = table.add(Binding("input", p.mask.index), p.mask.element) if p.mask is not None else ""
    out_name = table.add(Binding("output", p.out.index), p.out.element, writable=True)
    return table, (q_name, k_name, v_name, mask_name, out_name)


def flash_attention_wgsl(problem: FlashProblem, caps: DeviceCaps) -> tuple[str, tuple[int, int, int], BindingTable]:
    """The kernel's WGSL, grid and bindings (raises :class:`NotOnDevice` when it cannot run on ``caps``).

    Per key tile, invocation ``c`` of row ``r`` computes the scores of keys ``c, c + TPR, ...`` (its Q row and those
    K rows read as vectors), publishes its maximum; after a barrier each reads its row's maxima, turns its own
    scores into weights ``exp(score - row max)``, publishes them and their sum; after another it rescales its
    accumulators (its ``Dv / TPR`` columns, as vectors) and adds the tile's weighted V rows.
    """
    p = problem
    if min(p.sq, p.sk, p.head, p.value_head) <= 0:
        raise NotOnDevice("fused attention: an empty query, key or head dimension is left to the unfused operators")
    tiles = flash_tiles(p, caps)
    rows, keys, tpr, width = tiles.rows, tiles.keys, tiles.threads_per_row, tiles.width
    vec = _vector(width)
    pitch = tiles.pitch(p.head)
    scores = -(-keys // tpr)
    partials = min(tpr, keys)
    columns = -(-(p.value_head // width) // tpr)
    key_tiles = -(-p.sk // keys)
    head_vectors = p.head // width
    check_loop_budget(
        "fused attention",
        -(-rows * head_vectors // FLASH_THREADS)
        + key_tiles
        * (
            -(-keys * head_vectors // FLASH_THREADS) * (2 if tiles.shared_v else 1)
            + head_vectors * (scores + 1)
            + 3 * scores
            + 2 * partials
            + keys * (1 + columns)
        )
        + 2 * columns,
        caps,
    )
    blocks = -(-p.sq // rows)
    groups = blocks * _product(p.batch)
    grid = grid_for_groups(groups, caps)

    table, (q_name, k_name, v_name, mask_name, out_name) = bind_operands(p)

    bias = ""
    if p.mask is not None:
        mask_at = f"mb + i * {p.mask.row_stride}u + j * {p.mask.col_stride}u"
        bias = f"""
                let b = {read_f32(mask_name, mask_at, p.mask.element)};
                if (bitcast<u32>(b) == 0xff800000u) {{ x = neg_inf(); }} else {{ x = x + b * {wgsl_f32(p.bias_scale)}; }}"""
    key_end = f"{p.sk}u"
    keep = f"jj < {keys}u && j < {p.sk}u && i < {p.sq}u"
    if p.causal_offset is not None:
        # keys past the block's last row's frontier are dropped for every row of the block: stop the walk there
        key_end = f"min({p.sk}u, u32(max(0, i32(i0) + {rows + p.causal_offset})))"
        keep += f" && i32(j) <= i32(i) + {p.causal_offset}"
    value_vectors = p.value_head // width
    if tiles.shared_v:
        v_read = f"vs[jj * {value_vectors}u + col]"
        v_load = _tile_load("vs", value_vectors, width, v_name, p.v, "vb", "j0", keys, p.value_head, p.sk)
    else:
        at = f"vb + min(j0 + jj, {p.sk - 1}u) * {p.v.row_stride}u + (col * {width}u + LANEu) * {p.v.col_stride}u"
        lanes = [read_f32(v_name, at.replace("LANE", str(lane)), p.v.element) for lane in range(width)]
        v_read = f"vec4<f32>({', '.join(lanes)})" if width == 4 else lanes[0]
        v_load = ""
    # Per-invocation values live in scalars and vectors named by index (unrolled here), never in arrays a loop
    # indexes: drivers may put those in slow local memory.
    product = "dot(q, ks[jjS * PITCHu + d])" if width == 4 else "q * ks[jjS * PITCHu + d]"
    product = product.replace("PITCH", str(pitch))
    acc_declarations = "\n".join(
        [f"    var acc{e} = {vec}();" for e in range(columns)]
        + [f"    let col{e} = min(c + {e * tpr}u, {value_vectors - 1}u);" for e in range(columns)]
        + [f"    let jj{s} = min(c + {s * tpr}u, {keys - 1}u);" for s in range(scores)]
    )
    score_lines = [f"        var dot{s} = 0.0;" for s in range(scores)]
    score_lines.append(f"        for (var d = 0u; d < {head_vectors}u; d = d + 1u) {{")
    score_lines.append(f"            let q = qs[r * {pitch}u + d];")
    score_lines += [f"            dot{s} = dot{s} + {product.replace('jjS', f'jj{s}')};" for s in range(scores)]
    score_lines.append("        }")
    score_lines += ["        var top = 0.0;", "        var hit = false;"]
    for s in range(scores):
        score_lines.append(f"""        var x{s} = neg_inf();
        {{
            let jj = c + {s * tpr}u;
            let j = j0 + jj;
            if ({keep}) {{
                var x = dot{s} * {wgsl_f32(p.logit_scale)};{bias}
                x{s} = x;
            }}
            if (!dropped(x{s})) {{
                top = select(x{s}, max(top, x{s}), hit);
                hit = true;
            }}
        }}""")
    score_block = "\n".join(score_lines) + "\n"
    weight_lines = ["        var part = 0.0;"]
    for s in range(scores):
        weight_lines.append(f"        let w{s} = select(exp(x{s} - m), 0.0, dropped(x{s}));")
        guard = f"if (c + {s * tpr}u < {keys}u) " if keys < tpr * (s + 1) else ""
        weight_lines.append(f"        {guard}{{ ps[r * {keys}u + c + {s * tpr}u] = w{s}; }}")
        weight_lines.append(f"        part = part + w{s};")
    weight_block = "\n".join(weight_lines) + "\n"
    value_lines = [f"        acc{e} = acc{e} * alpha;" for e in range(columns)]
    value_lines.append(f"        for (var jj = 0u; jj < {keys}u; jj = jj + 1u) {{")
    value_lines.append(f"            let w = ps[r * {keys}u + jj];")
    value_lines += [f"            acc{e} = acc{e} + w * {v_read.replace('col', f'col{e}')};" for e in range(columns)]
    value_lines.append("        }")
    value_block = "\n".join(value_lines) + "\n"
    empty = "0.0" if p.empty_rows_zero else "nan()"
    store_lines = [f"        let ob = {_batch_offset(p.out, p.batch)} + i * {p.out.row_stride}u;"]
    for e in range(columns):
        for lane in range(width):
            component = f"acc{e}" + (f".{'xyzw'[lane]}" if width == 4 else "")
            column = f"(c + {e * tpr}u) * {width}u + {lane}u"
            store_lines.append(
                f"        if ({column} < {p.value_head}u) "
                f"{{ {out_name}[ob + ({column}) * {p.out.col_stride}u] = "
                f"{stored(f'select({empty}, {component} / l, seen)', p.out.element)}; }}"
            )
    store_block = "\n".join(store_lines) + "\n"
    wgsl = f"""{table.enables()}{table.declarations()}
var<workgroup> qs: array<{vec}, {rows * pitch}>;
var<workgroup> ks: array<{vec}, {keys * pitch}>;
{f"var<workgroup> vs: array<{vec}, {keys * value_vectors}>;" if tiles.shared_v else ""}
var<workgroup> ps: array<f32, {rows * keys}>;
var<workgroup> row_max: array<f32, {rows * partials}>;
var<workgroup> row_sum: array<f32, {rows * partials}>;

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
{_tile_load("qs", pitch, width, q_name, p.q, "qb", "i0", rows, p.head, p.sq)}
    var m = 0.0;
    var l = 0.0;
    var seen = false;
{acc_declarations}
    let key_end = {key_end};
    for (var j0 = 0u; j0 < key_end; j0 = j0 + {keys}u) {{
        workgroupBarrier();
{_tile_load("ks", pitch, width, k_name, p.k, "kb", "j0", keys, p.head, p.sk)}{v_load}
        workgroupBarrier();
{score_block}        if (c < {partials}u) {{ row_max[r * {partials}u + c] = select(neg_inf(), top, hit); }}
        workgroupBarrier();
        var tile_hit = false;
        for (var t = 0u; t < {partials}u; t = t + 1u) {{
            let y = row_max[r * {partials}u + t];
            if (!dropped(y)) {{
                top = select(y, max(top, y), tile_hit);
                tile_hit = true;
            }}
        }}
        let next = select(m, select(top, max(m, top), seen), tile_hit);
        let alpha = select(1.0, exp(m - next), seen);
        seen = seen || tile_hit;
        m = next;
{weight_block}        if (c < {partials}u) {{ row_sum[r * {partials}u + c] = part; }}
        workgroupBarrier();
        var tile_sum = 0.0;
        for (var t = 0u; t < {partials}u; t = t + 1u) {{ tile_sum = tile_sum + row_sum[r * {partials}u + t]; }}
        l = l * alpha + tile_sum;
{value_block}    }}
    if (i < {p.sq}u) {{
{store_block}    }}
}}
"""
    return wgsl, grid, table
