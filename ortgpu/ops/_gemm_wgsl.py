"""The WGSL of the tiled GEMM behind MatMul, Gemm and Conv (implicit GEMM), and what it needs to know of a problem.

A problem is ``out[b, m, n] = epilogue(sum_k A(b, m, k) * B(b, k, n))`` for ``b < batch``, stored linearly at
``(b * M + m) * N + n`` (both MatMul's output and Conv's ``[N, C, H, W]`` output are laid out so).  The operator
describes how to read A and B (:class:`GemmProblem`); :mod:`ortgpu.ops._tiled_gemm` plans it under a
:class:`~ortgpu.ops._gemm.GemmConfig` with the kernels written here:

* a workgroup of ``(tile_m / rows) x (tile_n / cols)`` invocations computes a ``tile_m x tile_n`` output tile,
  each invocation ``rows x cols`` outputs (vec4 accumulators along n), stepping through K by ``tile_k``.
  Shared tiles are ``vec4`` arrays laid out ``[k][m / 4]`` and ``[k][n / 4]``: the inner loop reads
  ``rows / 4 + cols / 4`` vec4s per k for ``rows * cols`` FMAs.  Invocation (tx, ty) owns the row quads
  ``ty + TY * p`` and the column quads ``tx + TX * q``, so a warp's B reads are consecutive vec4s and its A reads
  broadcasts.
* global loads are vec4 wherever the operand layout allows (the problem supplies vec4 loaders only when they
  are valid): along k for a row-major A (a 4 x 4 block transposed in registers), along n for a row-major B;
  otherwise four scalar loads fill one shared vec4.
* ``stages = 2``: the next K tile is fetched into registers while the current one is multiplied, into a
  second shared buffer, one barrier per K step; ``stages = 1``: load, barrier, multiply, barrier.
* ``split_k = S > 1``: the K range is cut into S slices (multiples of ``tile_k``); workgroups of slice s write
  their partial sums into a scratch buffer ``[S, batch, M, N]`` and a second kernel
  (:func:`split_k_reduce_kernel`) sums the slices and applies the epilogue.  It multiplies the workgroups of a
  small-output, long-K problem by S.
* the original kernel (:data:`~ortgpu.ops._gemm.LEGACY`, :func:`legacy_gemm_wgsl`): a 64 x 64 tile, 4 x 4 scalar
  outputs per invocation, scalar loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._gemm import GemmConfig
from ._gemm_pairs import pair_compute, pair_fetch_store, pair_tile_sizes
from ._kernel import Binding, DeviceCaps, ceil_div
from ._tiling import THREADS, BindingTable, grid_for_groups, workgroup_index

__all__ = [
    "GemmLoad",
    "GemmProblem",
    "Operands",
    "binding_name",
    "k_slices",
    "legacy_gemm_wgsl",
    "loader_functions",
    "operand_modes",
    "split_k_reduce_kernel",
    "tiled_gemm_kernel",
]


# -- the problem ---------------------------------------------------------------------------------------------------


def binding_name(binding: Binding, element: str = "f32") -> str:
    """The WGSL name :class:`BindingTable` gives ``binding`` bound as ``array<element>``."""
    return f"{binding.kind}_{binding.index}" + (
        "" if element == "f32" else "_" + element.replace("<", "").replace(">", "")
    )


@dataclass(frozen=True)
class GemmLoad:
    """A WGSL function body reading an operand, and the bindings ``(binding, element type)`` it reads
    (named by :func:`binding_name`)."""

    body: str
    bindings: tuple[tuple[Binding, str], ...] = ()


Operands = Callable[[list["np.ndarray | None"]], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class GemmProblem:
    """What the tiled GEMM needs to know about an operator.

    Loaders are bodies of (called only with in-range arguments):

    * ``load_a``: ``fn load_a(b: u32, m: u32, k: u32) -> f32``; ``load_b``: ``fn load_b(b: u32, k: u32, n: u32) -> f32``;
    * optional vector loaders, given only where valid for every aligned call: ``load_a4k(b, m, k) -> vec4<f32>``
      = A(m, k..k+3) (needs K % 4 == 0), ``load_a4m`` = A(m..m+3, k) (M % 4 == 0), ``load_b4n(b, k, n)`` =
      B(k, n..n+3) (N % 4 == 0), ``load_b4k`` = B(k..k+3, n) (K % 4 == 0).  The kernel uses a vector loader when
      there is one.

    ``prelude``: constants and helpers the loaders use.  ``operands``: the numpy twin of the loaders, the whole
    node's inputs -> ``(A [batch, M, K], B [batch, K, N])`` in float32; split-K needs it (its partial-sum
    kernel's twin).
    """

    batch: int
    m: int
    n: int
    k: int
    load_a: GemmLoad
    load_b: GemmLoad
    load_a4k: GemmLoad | None = None
    load_a4m: GemmLoad | None = None
    load_b4n: GemmLoad | None = None
    load_b4k: GemmLoad | None = None
    prelude: str = ""
    operands: Operands | None = None


def operand_modes(problem: GemmProblem) -> tuple[str, str]:
    if problem.load_a4k is not None and problem.k % 4 == 0:
        mode_a = "k4"
    elif problem.load_a4m is not None and problem.m % 4 == 0:
        mode_a = "m4"
    else:
        mode_a = "scalar"
    if problem.load_b4n is not None and problem.n % 4 == 0:
        mode_b = "n4"
    elif problem.load_b4k is not None and problem.k % 4 == 0:
        mode_b = "k4"
    else:
        mode_b = "scalar"
    return mode_a, mode_b


def loader_functions(problem: GemmProblem, mode_a: str, mode_b: str, table: BindingTable) -> str:
    chosen: list[tuple[str, str, GemmLoad]] = []
    a = {
        "k4": ("load_a4k", problem.load_a4k),
        "m4": ("load_a4m", problem.load_a4m),
        "scalar": ("load_a", problem.load_a),
    }[mode_a]
    b = {
        "n4": ("load_b4n", problem.load_b4n),
        "k4": ("load_b4k", problem.load_b4k),
        "scalar": ("load_b", problem.load_b),
    }[mode_b]
    for (name, load), signature in ((a, "b: u32, m: u32, k: u32"), (b, "b: u32, k: u32, n: u32")):
        assert load is not None
        returns = "f32" if name in ("load_a", "load_b") else "vec4<f32>"
        chosen.append((name, f"fn {name}({signature}) -> {returns}", load))
    text = []
    for _name, header, load in chosen:
        for binding, element in load.bindings:
            table.add(binding, element)
        text.append(f"{header} {{\n{load.body}\n}}\n")
    return "".join(text)


# -- the kernels ---------------------------------------------------------------------------------------------------


def _units(count: int, threads: int) -> list[tuple[int, bool]]:
    """(round, guarded) of the loops that spread ``count`` load units over ``threads`` invocations."""
    rounds = -(-count // threads)
    return [(r, count % threads != 0 and (r + 1) * threads > count) for r in range(rounds)]


def _k4_unit(
    decls: list[str],
    fetch: list[str],
    store: list[str],
    side: str,
    coord: str,
    load: Callable[[int], str],
    r: int,
    u: str,
    guarded: bool,
    count: int,
    tk: int,
    width4: int,
) -> None:
    """One fetch round of an operand read as vec4s along k (``side`` ``"a"``: rows ``m``; ``"b"``: columns ``n``):
    four vec4 registers of four neighbouring ``coord`` values, stored transposed into the shared tile."""
    reg, limit, valid = f"r{side}{r}", coord.upper(), f"u < {count}u && " if guarded else ""
    decls += [f"var {reg}_{j} = vec4<f32>(0.0);" for j in range(4)]
    loads = "".join(
        f"        {reg}_{j} = vec4<f32>(0.0); if ({valid}kv && {coord} + {j}u < {limit}) {{ {reg}_{j} = {load(j)}; }}\n"
        for j in range(4)
    )
    fetch.append(
        f"    {{\n        let u = {u};\n        let k = kt + 4u * (u % {tk // 4}u);\n        let {coord} = {coord}0 + 4u * (u / {tk // 4}u);\n"
        f"        let kv = k < K;\n{loads}    }}\n"
    )
    stores = "".join(
        f"        tile_{side}[o{side} + (4u * (u % {tk // 4}u) + {i}u) * {width4}u + u / {tk // 4}u] = "
        f"vec4<f32>({reg}_0[{i}], {reg}_1[{i}], {reg}_2[{i}], {reg}_3[{i}]);\n"
        for i in range(4)
    )
    store.append(
        f"    {{\n        let u = {u};\n"
        + (f"        if (u < {count}u) {{\n" if guarded else "")
        + stores
        + ("        }\n" if guarded else "")
        + "    }\n"
    )


def _fetch_store(config: GemmConfig, mode_a: str, mode_b: str) -> tuple[list[str], str, str]:
    """Register declarations, the fetch code (global -> registers, at ``kt``) and the store code (registers ->
    shared tiles at offsets ``oa``/``ob``)."""
    tm4, tn4, tk, threads = config.tile_m // 4, config.tile_n // 4, config.tile_k, config.threads
    decls: list[str] = []
    fetch: list[str] = []
    store: list[str] = []
    # A
    count_a = (tk // 4) * tm4 if mode_a == "k4" else tk * tm4
    for r, guarded in _units(count_a, threads):
        u = f"li + {r * threads}u"
        valid = f"u < {count_a}u && " if guarded else ""
        if mode_a == "k4":
            _k4_unit(
                decls, fetch, store, "a", "m", lambda j: f"load_a4k(b, m + {j}u, k)", r, u, guarded, count_a, tk, tm4
            )
        else:
            decls.append(f"var ra{r} = vec4<f32>(0.0);")
            if mode_a == "m4":
                index = (f"let mq = u % {tm4}u;", f"let kl = u / {tm4}u;")
                load = f"        ra{r} = vec4<f32>(0.0); if ({valid}k < K && m < M) {{ ra{r} = load_a4m(b, m, k); }}\n"
            else:
                index = (f"let mq = u / {tk}u;", f"let kl = u % {tk}u;")
                load = (
                    f"        ra{r} = vec4<f32>(0.0);\n        if ({valid}k < K) {{\n"
                    + "".join(
                        f"            if (m + {j}u < M) {{ ra{r}[{j}] = load_a(b, m + {j}u, k); }}\n" for j in range(4)
                    )
                    + "        }\n"
                )
            fetch.append(
                f"    {{\n        let u = {u};\n        {index[0]}\n        {index[1]}\n        let k = kt + kl;\n"
                f"        let m = m0 + 4u * mq;\n{load}    }}\n"
            )
            store.append(
                f"    {{\n        let u = {u};\n        {index[0]}\n        {index[1]}\n"
                + (f"        if (u < {count_a}u) {{ " if guarded else "        ")
                + f"tile_a[oa + kl * {tm4}u + mq] = ra{r};"
                + (" }\n" if guarded else "\n")
                + "    }\n"
            )
    # B
    count_b = (tk // 4) * tn4 if mode_b == "k4" else tk * tn4
    for r, guarded in _units(count_b, threads):
        u = f"li + {r * threads}u"
        valid = f"u < {count_b}u && " if guarded else ""
        if mode_b == "k4":
            _k4_unit(
                decls, fetch, store, "b", "n", lambda j: f"load_b4k(b, k, n + {j}u)", r, u, guarded, count_b, tk, tn4
            )
        else:
            decls.append(f"var rb{r} = vec4<f32>(0.0);")
            if mode_b == "n4":
                load = f"        rb{r} = vec4<f32>(0.0); if ({valid}k < K && n < N) {{ rb{r} = load_b4n(b, k, n); }}\n"
            else:
                load = (
                    f"        rb{r} = vec4<f32>(0.0);\n        if ({valid}k < K) {{\n"
                    + "".join(
                        f"            if (n + {j}u < N) {{ rb{r}[{j}] = load_b(b, k, n + {j}u); }}\n" for j in range(4)
                    )
                    + "        }\n"
                )
            fetch.append(
                f"    {{\n        let u = {u};\n        let k = kt + u / {tn4}u;\n        let n = n0 + 4u * (u % {tn4}u);\n{load}    }}\n"
            )
            store.append(
                f"    {{\n        let u = {u};\n"
                + (f"        if (u < {count_b}u) {{ " if guarded else "        ")
                + f"tile_b[ob + (u / {tn4}u) * {tn4}u + u % {tn4}u] = rb{r};"
                + (" }\n" if guarded else "\n")
                + "    }\n"
            )
    return decls, "".join(fetch), "".join(store)


def k_slices(config: GemmConfig, k: int) -> tuple[int, int]:
    """(slices, K per slice): slices are whole multiples of ``tile_k``; none is empty."""
    tk = config.tile_k
    per_slice = max(tk, ceil_div(ceil_div(k, config.split_k), tk) * tk)
    return max(1, -(-k // per_slice)), per_slice


def tiled_gemm_kernel(
    problem: GemmProblem,
    config: GemmConfig,
    declarations: str,
    loaders: str,
    store_body: str,
    caps: DeviceCaps,
    mode_a: str,
    mode_b: str,
) -> tuple[str, tuple[int, int, int], int]:
    """WGSL, grid and slice count of the tiled kernel; ``store_body`` stores ``acc`` (vec4 of columns
    ``n..n+3``) of row ``m`` and slice ``s``."""
    tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
    tx, ty = tn // config.cols, tm // config.rows
    tm4, tn4 = tm // 4, tn // 4
    tiles_m, tiles_n = -(-problem.m // tm), -(-problem.n // tn)
    slices, per_slice = k_slices(config, problem.k)
    total = slices * problem.batch * tiles_m * tiles_n
    grid = grid_for_groups(total, caps)
    p_count, q_count = config.rows // 4, config.cols // 4
    acc_decls = "".join(f"    var acc{r}_{q} = vec4<f32>(0.0);\n" for r in range(config.rows) for q in range(q_count))
    if config.half:  # f16 arithmetic on k-pairs: its own tiles, fetch and inner loop (ortgpu.ops._gemm_pairs)
        decls, fetch, store = pair_fetch_store(config, mode_a, mode_b)
        tile_type = "vec4<f16>"
        _, _, size_a, size_b = pair_tile_sizes(config)
        compute = pair_compute(config, tx, ty)
    else:
        decls, fetch, store = _fetch_store(config, mode_a, mode_b)
        tile_type = "vec4<f32>"
        size_a, size_b = tk * tm4, tk * tn4
        inner = []
        for p in range(p_count):
            inner.append(f"            let a{p} = tile_a[ca + kk * {tm4}u + lid.y + {ty * p}u];")
        for q in range(q_count):
            inner.append(f"            let b{q} = tile_b[cb + kk * {tn4}u + lid.x + {tx * q}u];")
        for r in range(config.rows):
            for q in range(q_count):
                inner.append(f"            acc{r}_{q} = fma(vec4<f32>(a{r // 4}[{r % 4}]), b{q}, acc{r}_{q});")
        compute = f"        for (var kk = 0u; kk < {tk}u; kk = kk + 1u) {{\n" + "\n".join(inner) + "\n        }\n"
    stores = []
    for p in range(p_count):
        for i in range(4):
            for q in range(q_count):
                stores.append(
                    f"    {{\n        let m = m0 + 4u * (lid.y + {ty * p}u) + {i}u;\n"
                    f"        let n = n0 + 4u * (lid.x + {tx * q}u);\n"
                    f"        let acc = acc{4 * p + i}_{q};\n{store_body}    }}\n"
                )
    if config.stages == 2:
        loop = f"""    var kt = k_begin;
    let oa = 0u;
    let ob = 0u;
{fetch}{store}    workgroupBarrier();
    for (var t = 0u; t < tiles; t = t + 1u) {{
        let cur = t & 1u;
        let ca = cur * {size_a}u;
        let cb = cur * {size_b}u;
        let has_next = t + 1u < tiles;
        if (has_next) {{
            kt = k_begin + (t + 1u) * {tk}u;
{_indent(fetch, 8)}        }}
{compute}        if (has_next) {{
            let oa = (1u - cur) * {size_a}u;
            let ob = (1u - cur) * {size_b}u;
{_indent(store, 8)}        }}
        workgroupBarrier();
    }}
"""
    else:
        loop = f"""    let oa = 0u;
    let ob = 0u;
    let ca = 0u;
    let cb = 0u;
    for (var t = 0u; t < tiles; t = t + 1u) {{
        let kt = k_begin + t * {tk}u;
{_indent(fetch, 4)}{_indent(store, 4)}        workgroupBarrier();
{compute}        workgroupBarrier();
    }}
"""
    wgsl = f"""{declarations}
const M: u32 = {problem.m}u;
const N: u32 = {problem.n}u;
const K: u32 = {problem.k}u;
const BATCH: u32 = {problem.batch}u;
const TILES_M: u32 = {tiles_m}u;
const TILES_N: u32 = {tiles_n}u;
const TOTAL: u32 = {total}u;
const SLICE_K: u32 = {per_slice}u;
var<workgroup> tile_a: array<{tile_type}, {config.stages * size_a}>;
var<workgroup> tile_b: array<{tile_type}, {config.stages * size_b}>;
{problem.prelude}
{loaders}
@compute @workgroup_size({tx}, {ty})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let tile = {workgroup_index(grid)};
    if (tile >= TOTAL) {{ return; }}
    let tn = tile % TILES_N;
    let tm = (tile / TILES_N) % TILES_M;
    let b = (tile / (TILES_N * TILES_M)) % BATCH;
    let s = tile / (TILES_N * TILES_M * BATCH);
    let m0 = tm * {tm}u;
    let n0 = tn * {tn}u;
    let k_begin = s * SLICE_K;
    let k_end = min(K, k_begin + SLICE_K);
    let tiles = (k_end - k_begin + {tk - 1}u) / {tk}u;
{"".join("    " + d + chr(10) for d in decls)}{acc_decls}{loop}{"".join(stores)}}}
"""
    return wgsl, grid, slices


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line + "\n" if line else "\n" for line in text.splitlines())


def split_k_reduce_kernel(
    total: int,
    slices: int,
    declarations: str,
    epilogue: str,
    scratch: str,
    store: Callable[[str, str], str],
    vector: bool,
    caps: DeviceCaps,
) -> tuple[str, tuple[int, int, int]]:
    """Sum ``slices`` partial results of ``total`` outputs each (vec4 at a time with ``vector``), then the epilogue;
    ``store(o, value)`` is the WGSL statement storing output ``o`` (:func:`~ortgpu.ops._output_layout.output_store`)."""
    width = 4 if vector else 1
    items = total // width
    groups = -(-items // THREADS)
    grid = grid_for_groups(groups, caps)
    zero = "vec4<f32>(0.0)" if vector else "0.0"
    if vector:
        stores = "".join(f"    {store(f'i * 4u + {j}u', f'sum[{j}]')}\n" for j in range(4))
    else:
        stores = f"    {store('i', 'sum')}\n"
    wgsl = f"""{declarations}
const ITEMS: u32 = {items}u;
{epilogue}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let i = {workgroup_index(grid)} * {THREADS}u + li;
    if (i >= ITEMS) {{ return; }}
    var sum = {zero};
    for (var s = 0u; s < {slices}u; s = s + 1u) {{
        sum = sum + {scratch}[s * ITEMS + i];
    }}
{stores}}}
"""
    return wgsl, grid


# -- the original kernel ----------------------------------------------------------------------------------------


#: Tile of the original tiled GEMM (:data:`ortgpu.ops._gemm.LEGACY`): a 16 x 16
#: workgroup computes a 64 x 64 output tile, 4 x 4 outputs per invocation, stepping through K by 16.
_TILE_M = 64
_TILE_N = 64
_TILE_K = 16


def legacy_gemm_wgsl(
    batch: int,
    m: int,
    n: int,
    k: int,
    helpers: str,
    declarations: str,
    store: Callable[[str, str], str],
    caps: DeviceCaps,
) -> tuple[str, tuple[int, int, int]]:
    """WGSL and grid of the original shared-memory tiled GEMM (scalar loads through ``load_a``/``load_b`` and
    ``epilogue`` defined in ``helpers``; output ``(b * M + m) * N + n`` stored by the statement ``store(o, value)``).

    Invocation (tx, ty) of a workgroup owns rows ``m0 + ty + 16 i`` and columns ``n0 + tx + 16 j``
    (i, j < 4), so neighbouring invocations read neighbouring shared-memory words and store neighbouring
    outputs.
    """
    tiles_m = -(-m // _TILE_M)
    tiles_n = -(-n // _TILE_N)
    total = batch * tiles_m * tiles_n
    grid = grid_for_groups(total, caps)
    loads = []
    for r in range(_TILE_M * _TILE_K // THREADS):
        loads.append(
            f"""        {{
            let e = li + {r * THREADS}u;
            let am = m0 + e / {_TILE_K}u;
            let ak = k0 + e % {_TILE_K}u;
            var av = 0.0;
            if (am < M && ak < K) {{ av = load_a(b, am, ak); }}
            tile_a[(e % {_TILE_K}u) * {_TILE_M}u + e / {_TILE_K}u] = av;
            let bk = k0 + e / {_TILE_N}u;
            let bn = n0 + e % {_TILE_N}u;
            var bv = 0.0;
            if (bk < K && bn < N) {{ bv = load_b(b, bk, bn); }}
            tile_b[e] = bv;
        }}"""
        )
    inner = []
    for i in range(4):
        inner.append(f"            let a{i} = tile_a[kk * {_TILE_M}u + lid.y + {16 * i}u];")
    inner.append(
        f"            let bv = vec4<f32>(tile_b[kk * {_TILE_N}u + lid.x], tile_b[kk * {_TILE_N}u + lid.x + 16u], "
        f"tile_b[kk * {_TILE_N}u + lid.x + 32u], tile_b[kk * {_TILE_N}u + lid.x + 48u]);"
    )
    for i in range(4):
        inner.append(f"            acc{i} = fma(vec4<f32>(a{i}), bv, acc{i});")
    stores = []
    for i in range(4):
        for j in range(4):
            stores.append(
                f"""    {{
        let m = m0 + lid.y + {16 * i}u;
        let n = n0 + lid.x + {16 * j}u;
        if (m < M && n < N) {{
            let o = (b * M + m) * N + n;
            {store("o", f"acc{i}[{j}]")}
        }}
    }}"""
            )
    wgsl = f"""{declarations}
const M: u32 = {m}u;
const N: u32 = {n}u;
const K: u32 = {k}u;
const TILES_M: u32 = {tiles_m}u;
const TILES_N: u32 = {tiles_n}u;
const TOTAL: u32 = {total}u;
var<workgroup> tile_a: array<f32, {_TILE_M * _TILE_K}>;
var<workgroup> tile_b: array<f32, {_TILE_N * _TILE_K}>;
{helpers}
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let tile = {workgroup_index(grid)};
    if (tile >= TOTAL) {{ return; }}
    let tn = tile % TILES_N;
    let tm = (tile / TILES_N) % TILES_M;
    let b = tile / (TILES_N * TILES_M);
    let m0 = tm * {_TILE_M}u;
    let n0 = tn * {_TILE_N}u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < K; k0 = k0 + {_TILE_K}u) {{
{chr(10).join(loads)}
        workgroupBarrier();
        for (var kk = 0u; kk < {_TILE_K}u; kk = kk + 1u) {{
{chr(10).join(inner)}
        }}
        workgroupBarrier();
    }}
{chr(10).join(stores)}
}}
"""
    return wgsl, grid
