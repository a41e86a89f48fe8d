"""The tiled GEMM behind MatMul, Gemm and Conv (implicit GEMM): configurations, their choice, and split-K.

A problem is ``out[b, m, n] = epilogue(sum_k A(b, m, k) * B(b, k, n))`` for ``b < batch``, stored linearly at
``(b * M + m) * N + n`` (both MatMul's output and Conv's ``[N, C, H, W]`` output are laid out so).  The operator
describes how to read A and B (:class:`GemmProblem`); :func:`plan_tiled_gemm` turns it into an :class:`OpPlan`
under a :class:`GemmConfig`:

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
  their partial sums into a scratch buffer ``[S, batch, M, N]`` and a second kernel sums the slices and applies
  the epilogue.  It multiplies the workgroups of a small-output, long-K problem by S.

Tuning knobs (module-level, documented below): :data:`GEMM_TILES`, :data:`GEMM_TARGET_WORKGROUPS`,
:data:`GEMM_SPLIT_MIN_K`, :data:`GEMM_MAX_SPLIT_K`, :data:`GEMM_OVERRIDE`, :data:`GEMM_SHAPE_CONFIGS`; the rule
that uses them is :func:`choose_gemm_config`.  ``python -m bench.sweep_kernels`` times the candidates on a
device, scores alternative settings of the rule's tunables over the measured shapes, and prints the best.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, OpPlan, TensorInfo, check_loop_budget
from ._tiling import (
    THREADS,
    BindingTable,
    EpilogueStep,
    apply_epilogue,
    check_device_fits,
    epilogue_function,
    grid_for_groups,
    legacy_gemm_wgsl,
    whole_op_twin,
    workgroup_index,
)

__all__ = [
    "GemmConfig",
    "GemmLoad",
    "GemmProblem",
    "GEMM_TILES",
    "GEMM_TARGET_WORKGROUPS",
    "GEMM_SPLIT_MIN_K",
    "GEMM_MAX_SPLIT_K",
    "GEMM_OVERRIDE",
    "GEMM_SHAPE_CONFIGS",
    "LEGACY",
    "binding_name",
    "choose_gemm_config",
    "config_fits",
    "gemm_workgroups",
    "plan_tiled_gemm",
]


@dataclass(frozen=True)
class GemmConfig:
    """One variant of the tiled GEMM kernel (see the module docstring).

    ``rows`` and ``cols`` (outputs per invocation) must be multiples of 4 dividing ``tile_m``/``tile_n``;
    ``tile_k`` a multiple of 4.  ``legacy``: the original 64 x 64 scalar kernel (kept for comparisons; only
    ``split_k = 1``).
    """

    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 16
    rows: int = 4
    cols: int = 4
    stages: int = 2
    split_k: int = 1
    legacy: bool = False

    @property
    def threads(self) -> int:
        if self.legacy:
            return 256
        return (self.tile_m // self.rows) * (self.tile_n // self.cols)

    @property
    def shared_bytes(self) -> int:
        if self.legacy:
            return (64 + 64) * 16 * 4
        return self.stages * (self.tile_m + self.tile_n) * self.tile_k * 4

    @property
    def label(self) -> str:
        """A short name: ``128x64k16/8x4/s2`` (+ ``/split4``)."""
        if self.legacy:
            return "legacy64x64"
        text = f"{self.tile_m}x{self.tile_n}k{self.tile_k}/{self.rows}x{self.cols}/s{self.stages}"
        return text + (f"/split{self.split_k}" if self.split_k > 1 else "")

    def validate(self) -> None:
        if self.legacy:
            if self.split_k != 1:
                raise ValueError("the legacy GEMM kernel has no split-K")
            return
        if self.rows % 4 or self.cols % 4 or self.tile_k % 4 or self.tile_m % self.rows or self.tile_n % self.cols:
            raise ValueError(f"bad GEMM config {self}")
        if self.stages not in (1, 2) or self.split_k < 1:
            raise ValueError(f"bad GEMM config {self}")


#: The original kernel (64 x 64 tile, 16 x 16 invocations, scalar loads), for comparisons in the sweep.
LEGACY = GemmConfig(legacy=True, stages=1)

# -- the tunables ------------------------------------------------------------------------------------------------

#: Output tiles the default rule tries, largest first: the first whose workgroup count reaches
#: :data:`GEMM_TARGET_WORKGROUPS` wins.  When none does, the *last* one is used with split-K.
#: (128 x 64 with 8 x 4 outputs per invocation for big problems, 64 x 64 for medium ones, 32 x 64 with
#: split-K for small outputs with long K.)
GEMM_TILES: tuple[GemmConfig, ...] = (
    GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False),
    GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=1, legacy=False),
    GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=1, legacy=False),
)
#: Workgroups a GEMM should launch to fill the GPU (4 per SM on a 132-SM H200).
GEMM_TARGET_WORKGROUPS = 528
#: Split-K keeps at least this many K per slice (so the partial sums stay cheap next to the products).
GEMM_SPLIT_MIN_K = 64
#: At most this many K slices.
GEMM_MAX_SPLIT_K = 16
#: When set, every tiled GEMM uses this configuration (if the device fits it): for sweeps and tests.
GEMM_OVERRIDE: GemmConfig | None = None
#: Exact problems ``(batch, M, N, K)`` -> configuration, consulted before the rule (``python -m
#: bench.sweep_kernels`` prints a ready-to-paste table of the fastest configuration per measured shape).
# Measured on the H200 on 2026-11-29 (device run 15: `python -m bench.sweep_kernels`, 636 variants, 0 wrong
# results): the fastest configuration per measured shape of the benchmark models; the rule above (also chosen
# by that sweep: the best of 72 candidate rules, mean slowdown x1.27 against per-shape best) covers other shapes.
GEMM_SHAPE_CONFIGS: dict[tuple[int, int, int, int], GemmConfig] = {
    (1, 128, 384, 1536): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=11, legacy=False),
    (1, 128, 384, 384): GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=6, legacy=False),
    (1, 128, 1536, 384): GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=6, legacy=False),
    (12, 128, 128, 32): GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=1, legacy=False),
    (12, 128, 32, 128): GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=2, legacy=False),
    (1, 2048, 384, 1536): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=4, legacy=False),
    (1, 2048, 384, 384): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=4, legacy=False),
    (1, 2048, 1536, 384): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False),
    (192, 128, 128, 32): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=8, cols=4, stages=2, split_k=1, legacy=False),
    (192, 128, 32, 128): GemmConfig(tile_m=32, tile_n=32, tile_k=16, rows=4, cols=4, stages=2, split_k=1, legacy=False),
    (1, 64, 50176, 576): GemmConfig(tile_m=64, tile_n=128, tile_k=16, rows=4, cols=8, stages=2, split_k=2, legacy=False),
    (1, 128, 12544, 1152): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=4, legacy=False),
    (1, 256, 3136, 2304): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=8, legacy=False),
    (1, 512, 784, 2304): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=12, legacy=False),
    (1, 512, 784, 4608): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=12, legacy=False),
    (1, 512, 784, 256): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=2, split_k=4, legacy=False),
    (16, 64, 50176, 576): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False),
    (16, 128, 12544, 1152): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=8, cols=4, stages=2, split_k=1, legacy=False),
    (16, 256, 3136, 2304): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False),
    (16, 512, 784, 2304): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False),
    (16, 512, 784, 4608): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=8, cols=4, stages=2, split_k=1, legacy=False),
    (16, 512, 784, 256): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=1, legacy=True),
    (1, 64, 50176, 27): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=1, legacy=False),
}


def config_fits(config: GemmConfig, caps: DeviceCaps) -> bool:
    """Whether the device's workgroup limits allow ``config``."""
    limits = caps.limits
    if config.legacy:
        return limits.max_compute_invocations_per_workgroup >= 256 and limits.max_compute_workgroup_storage_size >= config.shared_bytes
    tx, ty = config.tile_n // config.cols, config.tile_m // config.rows
    return (
        config.threads <= limits.max_compute_invocations_per_workgroup
        and tx <= limits.max_compute_workgroup_size_x
        and ty <= limits.max_compute_workgroup_size_y
        and config.shared_bytes <= limits.max_compute_workgroup_storage_size
    )


def gemm_workgroups(config: GemmConfig, batch: int, m: int, n: int) -> int:
    """Output tiles of a problem under ``config`` (times ``split_k`` for the workgroups launched)."""
    tile_m, tile_n = (64, 64) if config.legacy else (config.tile_m, config.tile_n)
    return batch * -(-m // tile_m) * -(-n // tile_n) * config.split_k


def choose_gemm_config(
    batch: int, m: int, n: int, k: int, caps: DeviceCaps, *,
    tiles: Sequence[GemmConfig] | None = None, target: int | None = None, split_min_k: int | None = None,
    max_split: int | None = None,
) -> GemmConfig:
    """The default configuration for a ``batch x [M, K] x [K, N]`` problem.

    1. :data:`GEMM_OVERRIDE` if set, else :data:`GEMM_SHAPE_CONFIGS` ``[(batch, M, N, K)]`` if present (and the
       device fits it).
    2. The first tile of :data:`GEMM_TILES` (that the device fits, and that is less than twice the problem in
       M and N) launching at least :data:`GEMM_TARGET_WORKGROUPS` workgroups.
    3. Otherwise the last such tile, with ``split_k = ceil(target / tiles)`` capped by
       :data:`GEMM_MAX_SPLIT_K` and by ``K // GEMM_SPLIT_MIN_K``.

    The keyword arguments replace the module's tunables (the sweep scores alternative rules with them).
    """
    tiles = GEMM_TILES if tiles is None else tiles
    target = GEMM_TARGET_WORKGROUPS if target is None else target
    split_min_k = GEMM_SPLIT_MIN_K if split_min_k is None else split_min_k
    max_split = GEMM_MAX_SPLIT_K if max_split is None else max_split
    for fixed in (GEMM_OVERRIDE, GEMM_SHAPE_CONFIGS.get((batch, m, n, k))):
        if fixed is not None and config_fits(fixed, caps):
            return fixed
    fitting = [c for c in tiles if config_fits(c, caps)]
    if not fitting:
        fitting = [GemmConfig(32, 32, 16, 4, 4, stages=1)]
    useful = [c for c in fitting if c.tile_m < 2 * m and c.tile_n < 2 * n] or fitting[-1:]
    for config in useful:
        if gemm_workgroups(dataclasses.replace(config, split_k=1), batch, m, n) >= target:
            return dataclasses.replace(config, split_k=1)
    config = useful[-1]
    count = gemm_workgroups(dataclasses.replace(config, split_k=1), batch, m, n)
    split = min(max_split, k // max(1, split_min_k), -(-target // count))
    return dataclasses.replace(config, split_k=max(1, split))


# -- the problem ---------------------------------------------------------------------------------------------------


def binding_name(binding: Binding, element: str = "f32") -> str:
    """The WGSL name :class:`BindingTable` gives ``binding`` bound as ``array<element>``."""
    return f"{binding.kind}_{binding.index}" + ("" if element == "f32" else "_" + element.replace("<", "").replace(">", ""))


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


def _modes(problem: GemmProblem) -> tuple[str, str]:
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


def _loader_functions(problem: GemmProblem, mode_a: str, mode_b: str, table: BindingTable) -> str:
    chosen: list[tuple[str, str, GemmLoad]] = []
    a = {"k4": ("load_a4k", problem.load_a4k), "m4": ("load_a4m", problem.load_a4m), "scalar": ("load_a", problem.load_a)}[mode_a]
    b = {"n4": ("load_b4n", problem.load_b4n), "k4": ("load_b4k", problem.load_b4k), "scalar": ("load_b", problem.load_b)}[mode_b]
    for (name, load), signature, result in ((a, "b: u32, m: u32, k: u32", "a"), (b, "b: u32, k: u32, n: u32", "b")):
        assert load is not None
        returns = "f32" if name in ("load_a", "load_b") else "vec4<f32>"
        chosen.append((name, f"fn {name}({signature}) -> {returns}", load))
    text = []
    for name, header, load in chosen:
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
    decls: list[str], fetch: list[str], store: list[str], side: str, coord: str, load: Callable[[int], str],
    r: int, u: str, guarded: bool, count: int, tk: int, width4: int,
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
    store.append(f"    {{\n        let u = {u};\n" + (f"        if (u < {count}u) {{\n" if guarded else "") + stores
                 + ("        }\n" if guarded else "") + "    }\n")


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
            _k4_unit(decls, fetch, store, "a", "m", lambda j: f"load_a4k(b, m + {j}u, k)", r, u, guarded, count_a, tk, tm4)
        else:
            decls.append(f"var ra{r} = vec4<f32>(0.0);")
            if mode_a == "m4":
                index = (f"let mq = u % {tm4}u;", f"let kl = u / {tm4}u;")
                load = f"        ra{r} = vec4<f32>(0.0); if ({valid}k < K && m < M) {{ ra{r} = load_a4m(b, m, k); }}\n"
            else:
                index = (f"let mq = u / {tk}u;", f"let kl = u % {tk}u;")
                load = f"        ra{r} = vec4<f32>(0.0);\n        if ({valid}k < K) {{\n" + "".join(
                    f"            if (m + {j}u < M) {{ ra{r}[{j}] = load_a(b, m + {j}u, k); }}\n" for j in range(4)
                ) + "        }\n"
            fetch.append(
                f"    {{\n        let u = {u};\n        {index[0]}\n        {index[1]}\n        let k = kt + kl;\n"
                f"        let m = m0 + 4u * mq;\n{load}    }}\n"
            )
            store.append(
                f"    {{\n        let u = {u};\n        {index[0]}\n        {index[1]}\n"
                + (f"        if (u < {count_a}u) {{ " if guarded else "        ")
                + f"tile_a[oa + kl * {tm4}u + mq] = ra{r};" + (" }\n" if guarded else "\n") + "    }\n"
            )
    # B
    count_b = (tk // 4) * tn4 if mode_b == "k4" else tk * tn4
    for r, guarded in _units(count_b, threads):
        u = f"li + {r * threads}u"
        valid = f"u < {count_b}u && " if guarded else ""
        if mode_b == "k4":
            _k4_unit(decls, fetch, store, "b", "n", lambda j: f"load_b4k(b, k, n + {j}u)", r, u, guarded, count_b, tk, tn4)
        else:
            decls.append(f"var rb{r} = vec4<f32>(0.0);")
            if mode_b == "n4":
                load = f"        rb{r} = vec4<f32>(0.0); if ({valid}k < K && n < N) {{ rb{r} = load_b4n(b, k, n); }}\n"
            else:
                load = f"        rb{r} = vec4<f32>(0.0);\n        if ({valid}k < K) {{\n" + "".join(
                    f"            if (n + {j}u < N) {{ rb{r}[{j}] = load_b(b, k, n + {j}u); }}\n" for j in range(4)
                ) + "        }\n"
            fetch.append(
                f"    {{\n        let u = {u};\n        let k = kt + u / {tn4}u;\n        let n = n0 + 4u * (u % {tn4}u);\n{load}    }}\n"
            )
            store.append(
                f"    {{\n        let u = {u};\n"
                + (f"        if (u < {count_b}u) {{ " if guarded else "        ")
                + f"tile_b[ob + (u / {tn4}u) * {tn4}u + u % {tn4}u] = rb{r};" + (" }\n" if guarded else "\n") + "    }\n"
            )
    return decls, "".join(fetch), "".join(store)


def _slicing(config: GemmConfig, k: int) -> tuple[int, int]:
    """(slices, K per slice): slices are whole multiples of ``tile_k``; none is empty."""
    tk = config.tile_k
    per_slice = max(tk, -(-(-(-k // config.split_k)) // tk) * tk)
    return max(1, -(-k // per_slice)), per_slice


def _gemm_kernel(
    problem: GemmProblem, config: GemmConfig, declarations: str, loaders: str, store_body: str, caps: DeviceCaps,
    mode_a: str, mode_b: str,
) -> tuple[str, tuple[int, int, int], int]:
    """WGSL, grid and slice count of the tiled kernel; ``store_body`` stores ``acc`` (vec4 of columns
    ``n..n+3``) of row ``m`` and slice ``s``."""
    tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
    tx, ty = tn // config.cols, tm // config.rows
    tm4, tn4 = tm // 4, tn // 4
    tiles_m, tiles_n = -(-problem.m // tm), -(-problem.n // tn)
    slices, per_slice = _slicing(config, problem.k)
    total = slices * problem.batch * tiles_m * tiles_n
    grid = grid_for_groups(total, caps)
    decls, fetch, store = _fetch_store(config, mode_a, mode_b)
    p_count, q_count = config.rows // 4, config.cols // 4
    acc_decls = "".join(f"    var acc{r}_{q} = vec4<f32>(0.0);\n" for r in range(config.rows) for q in range(q_count))
    inner = []
    for p in range(p_count):
        inner.append(f"            let a{p} = tile_a[ca + kk * {tm4}u + lid.y + {ty * p}u];")
    for q in range(q_count):
        inner.append(f"            let b{q} = tile_b[cb + kk * {tn4}u + lid.x + {tx * q}u];")
    for p in range(p_count):
        for i in range(4):
            for q in range(q_count):
                r = 4 * p + i
                inner.append(f"            acc{r}_{q} = fma(vec4<f32>(a{p}[{i}]), b{q}, acc{r}_{q});")
    compute = (
        f"        for (var kk = 0u; kk < {tk}u; kk = kk + 1u) {{\n" + "\n".join(inner) + "\n        }\n"
    )
    stores = []
    for p in range(p_count):
        for i in range(4):
            for q in range(q_count):
                stores.append(
                    f"    {{\n        let m = m0 + 4u * (lid.y + {ty * p}u) + {i}u;\n"
                    f"        let n = n0 + 4u * (lid.x + {tx * q}u);\n"
                    f"        let acc = acc{4 * p + i}_{q};\n{store_body}    }}\n"
                )
    size_a, size_b = tk * tm4, tk * tn4
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
var<workgroup> tile_a: array<vec4<f32>, {config.stages * size_a}>;
var<workgroup> tile_b: array<vec4<f32>, {config.stages * size_b}>;
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


def _reduce_kernel(
    total: int, slices: int, declarations: str, epilogue: str, scratch: str, output: str, vector: bool, caps: DeviceCaps,
) -> tuple[str, tuple[int, int, int]]:
    """Sum ``slices`` partial results of ``total`` outputs each (vec4 at a time with ``vector``), then the epilogue."""
    width = 4 if vector else 1
    items = total // width
    groups = -(-items // THREADS)
    grid = grid_for_groups(groups, caps)
    zero = "vec4<f32>(0.0)" if vector else "0.0"
    if vector:
        store = "".join(f"    {output}[i * 4u + {j}u] = epilogue(sum[{j}], i * 4u + {j}u);\n" for j in range(4))
    else:
        store = f"    {output}[i] = epilogue(sum, i);\n"
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
{store}}}
"""
    return wgsl, grid


def split_k_plan(
    name: str,
    partial: KernelSpec,
    slices: int,
    total: int,
    vector: bool,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
) -> OpPlan:
    """A split-K plan (tiled GEMM and GEMV): ``partial`` writes ``slices`` partial results of ``total`` outputs
    into the scratch buffer (``vec4`` elements with ``vector``); a second kernel sums them and applies the epilogue."""
    reduce_table = BindingTable()
    scratch_in = reduce_table.add(Binding("scratch", 0), "vec4<f32>" if vector else "f32")
    output = reduce_table.add(Binding("output", 0), writable=True)
    epilogue = epilogue_function(steps, out_shape, reduce_table)
    reduce_wgsl, reduce_grid = _reduce_kernel(
        total, slices, reduce_table.declarations(), epilogue, scratch_in, output, vector, caps
    )
    reduce_twin = _reduce_twin(steps, reduce_table.bindings, inputs, outputs, slices, total)
    check_device_fits(name, list(inputs) + list(outputs), max(len(partial.bindings), len(reduce_table.bindings)), caps)
    scratch_bytes = slices * total * 4
    if scratch_bytes > caps.limits.max_storage_buffer_binding_size:
        raise NotOnDevice(f"{name}: split-K scratch of {scratch_bytes} bytes exceeds the storage binding limit")
    return OpPlan(
        kernels=(partial, KernelSpec(name, reduce_wgsl, reduce_grid, tuple(reduce_table.bindings), reduce_twin)),
        scratch_sizes=(scratch_bytes,),
    )


def plan_tiled_gemm(
    name: str,
    problem: GemmProblem,
    *,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    config: GemmConfig | None = None,
) -> OpPlan:
    """The plan of the tiled GEMM for ``problem`` with the epilogue ``steps`` (extra inputs bound by the epilogue).

    ``config``: the kernel variant; default :func:`choose_gemm_config`.  ``compute`` is the whole node's
    function (the twin of the single-kernel variant).  Split-K needs ``problem.operands``; without it the
    config runs unsplit.
    """
    if config is None:
        config = choose_gemm_config(problem.batch, problem.m, problem.n, problem.k, caps)
    config.validate()
    if not config_fits(config, caps):
        raise NotOnDevice(f"{name}: GEMM config {config.label} exceeds the device's workgroup limits")
    if config.split_k > 1 and (problem.operands is None or problem.k < 2 * config.tile_k):
        config = dataclasses.replace(config, split_k=1)
    # per invocation: a K tile loop per slice, each tile an inner loop of tile_k steps and the fetch loops (counted
    # as 4); measured on lavapipe: [8, 2M] x [2M, 8] (8192 tiles of 16 per slice) returned 932080 instead of 2097152
    tiles = -(-_slicing(config, problem.k)[1] // config.tile_k) if config.split_k > 1 else -(-problem.k // config.tile_k)
    check_loop_budget(name, tiles * (config.tile_k + 5), caps)
    mode_a, mode_b = _modes(problem)
    total_out = problem.batch * problem.m * problem.n
    if config.legacy:
        table = BindingTable()
        loaders = _loader_functions(problem, "scalar", "scalar", table)
        output = table.add(Binding("output", 0), writable=True)
        epilogue = epilogue_function(steps, out_shape, table)
        wgsl, grid = legacy_gemm_wgsl(
            problem.batch, problem.m, problem.n, problem.k, problem.prelude + loaders + epilogue,
            table.declarations(), output, caps,
        )
        check_device_fits(name, list(inputs) + list(outputs), len(table.bindings), caps)
        twin = whole_op_twin(compute, table.bindings, inputs, outputs)
        return OpPlan(kernels=(KernelSpec(name, wgsl, grid, tuple(table.bindings), twin),))
    if config.split_k > 1 and _slicing(config, problem.k)[0] > 1:
        slices, per_slice = _slicing(config, problem.k)
        vector = problem.n % 4 == 0
        element = "vec4<f32>" if vector else "f32"
        table = BindingTable()
        loaders = _loader_functions(problem, mode_a, mode_b, table)
        scratch = table.add(Binding("scratch", 0), element, writable=True)
        if vector:
            body = f"        if (m < M && n < N) {{ {scratch}[(s * {total_out}u + b * {problem.m * problem.n}u + m * N + n) / 4u] = acc; }}\n"
        else:
            body = "".join(
                f"        if (m < M && n + {j}u < N) {{ {scratch}[s * {total_out}u + b * {problem.m * problem.n}u + m * N + n + {j}u] = acc[{j}]; }}\n"
                for j in range(4)
            )
        wgsl, grid, slices = _gemm_kernel(problem, config, table.declarations(), loaders, body, caps, mode_a, mode_b)
        operands = problem.operands
        assert operands is not None
        partial_twin = _partial_twin(operands, table.bindings, inputs, slices, per_slice, problem)
        partial = KernelSpec(name, wgsl, grid, tuple(table.bindings), partial_twin)
        return split_k_plan(name, partial, slices, total_out, vector, steps, out_shape, inputs, outputs, caps)
    config = dataclasses.replace(config, split_k=1)
    table = BindingTable()
    loaders = _loader_functions(problem, mode_a, mode_b, table)
    output = table.add(Binding("output", 0), writable=True)
    epilogue = epilogue_function(steps, out_shape, table)
    body = "".join(
        f"        if (m < M && n + {j}u < N) {{ let o = (b * M + m) * N + n + {j}u; {output}[o] = epilogue(acc[{j}], o); }}\n"
        for j in range(4)
    )
    wgsl, grid, _ = _gemm_kernel(problem, config, table.declarations(), loaders + epilogue, body, caps, mode_a, mode_b)
    check_device_fits(name, list(inputs) + list(outputs), len(table.bindings), caps)
    twin = whole_op_twin(compute, table.bindings, inputs, outputs)
    return OpPlan(kernels=(KernelSpec(name, wgsl, grid, tuple(table.bindings), twin),))


# -- twins of the split-K kernels ----------------------------------------------------------------------------------


def _bound_inputs(arrays: Sequence[np.ndarray], bindings: Sequence[Binding], inputs: Sequence[TensorInfo | None]) -> list[np.ndarray | None]:
    full: list[np.ndarray | None] = [None] * len(inputs)
    for slot, binding in enumerate(bindings):
        if binding.kind == "input":
            info = inputs[binding.index]
            assert info is not None
            full[binding.index] = arrays[slot][: info.nbytes].view(info.dtype).reshape(info.shape)
    return full


def _partial_twin(
    operands: Operands, bindings: Sequence[Binding], inputs: Sequence[TensorInfo | None], slices: int, per_slice: int,
    problem: GemmProblem,
) -> Callable[[Sequence[np.ndarray], tuple[int, int, int]], None]:
    scratch_slot = next(slot for slot, b in enumerate(bindings) if b.kind == "scratch")

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        a, b = operands(_bound_inputs(arrays, bindings, inputs))
        a = np.asarray(a, dtype=np.float32).reshape(problem.batch, problem.m, problem.k)
        b = np.asarray(b, dtype=np.float32).reshape(problem.batch, problem.k, problem.n)
        partial = np.empty((slices, problem.batch, problem.m, problem.n), dtype=np.float32)
        for s in range(slices):
            ks = slice(s * per_slice, min(problem.k, (s + 1) * per_slice))
            partial[s] = np.matmul(a[:, :, ks], b[:, ks, :])
        raw = partial.reshape(-1).view(np.uint8)
        arrays[scratch_slot][: raw.size] = raw

    return twin


def _reduce_twin(
    steps: Sequence[EpilogueStep], bindings: Sequence[Binding], inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo], slices: int, total: int,
) -> Callable[[Sequence[np.ndarray], tuple[int, int, int]], None]:
    scratch_slot = next(slot for slot, b in enumerate(bindings) if b.kind == "scratch")
    output_slot = next(slot for slot, b in enumerate(bindings) if b.kind == "output")
    out = outputs[0]

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        partial = arrays[scratch_slot][: slices * total * 4].view(np.float32).reshape(slices, total)
        y = partial[0].copy()
        for s in range(1, slices):
            y += partial[s]
        result = apply_epilogue(y.reshape(out.shape), steps, _bound_inputs(arrays, bindings, inputs))
        raw = np.ascontiguousarray(result, dtype=np.float32).reshape(-1).view(np.uint8)
        arrays[output_slot][: raw.size] = raw

    return twin
