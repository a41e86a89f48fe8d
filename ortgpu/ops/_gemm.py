"""The tiled GEMM's configurations and the rule that chooses one per problem.

MatMul, Gemm and Conv (implicit GEMM) run ``out[b, m, n] = epilogue(sum_k A(b, m, k) * B(b, k, n))`` on the tiled
GEMM kernel: :mod:`ortgpu.ops._gemm_wgsl` writes its WGSL and :mod:`ortgpu.ops._tiled_gemm` plans it for a problem
under a :class:`GemmConfig` (tile shape, outputs per invocation, K step, pipeline stages, split-K).  This module
holds the configurations and :func:`choose_gemm_config`.

Tuning knobs (module-level, documented below): :data:`GEMM_TILES`, :data:`GEMM_TARGET_WORKGROUPS`,
:data:`GEMM_SPLIT_MIN_K`, :data:`GEMM_MAX_SPLIT_K`, :data:`GEMM_OVERRIDE`, :data:`GEMM_SHAPE_CONFIGS`; the rule
that uses them is :func:`choose_gemm_config` (it reads them from this module at each call, so tests and the sweep
set them here).  ``python -m bench.sweep_kernels`` times the candidates on a device, scores alternative settings
of the rule's tunables over the measured shapes, and prints the best.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from ._kernel import DeviceCaps

__all__ = [
    "GemmConfig",
    "GEMM_TILES",
    "GEMM_TARGET_WORKGROUPS",
    "GEMM_SPLIT_MIN_K",
    "GEMM_MAX_SPLIT_K",
    "GEMM_OVERRIDE",
    "GEMM_SHAPE_CONFIGS",
    "LEGACY",
    "choose_gemm_config",
    "config_fits",
    "gemm_workgroups",
]


@dataclass(frozen=True)
class GemmConfig:
    """One variant of the tiled GEMM kernel (see the module docstring).

    ``rows`` and ``cols`` (outputs per invocation) must be multiples of 4 dividing ``tile_m``/``tile_n``;
    ``tile_k`` a multiple of 4.  ``legacy``: the original 64 x 64 scalar kernel (only ``split_k = 1``; the sweep
    times it, and :data:`GEMM_SHAPE_CONFIGS` picks it where it measured fastest).
    """

    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 16
    rows: int = 4
    cols: int = 4
    stages: int = 2
    split_k: int = 1
    legacy: bool = False
    #: f16 arithmetic (float16 storage only): products of k-pairs, two lanes per multiply-add, each K tile's sums
    #: added into f32 accumulators (:mod:`ortgpu.ops._gemm_pairs`).
    half: bool = False

    @property
    def threads(self) -> int:
        if self.legacy:
            return 256
        return (self.tile_m // self.rows) * (self.tile_n // self.cols)

    @property
    def shared_bytes(self) -> int:
        if self.legacy:
            return (64 + 64) * 16 * 4
        if self.half:  # vec4<f16> elements of two k-pairs, rows padded (ortgpu.ops._gemm_pairs)
            rows = self.tile_m // 2 + self.tile_n // 2 + 2 * HALF_PAIR_PAD
            return self.stages * (self.tile_k // 2) * rows * 8
        return self.stages * (self.tile_m + self.tile_n) * self.tile_k * 4

    @property
    def label(self) -> str:
        """A short name: ``128x64k16/8x4/s2`` (+ ``/split4``)."""
        if self.legacy:
            return "legacy64x64"
        text = f"{self.tile_m}x{self.tile_n}k{self.tile_k}/{self.rows}x{self.cols}/s{self.stages}"
        return text + (f"/split{self.split_k}" if self.split_k > 1 else "") + ("/h16" if self.half else "")

    def validate(self) -> None:
        if self.legacy:
            if self.split_k != 1 or self.half:
                raise ValueError("the legacy GEMM kernel has no split-K and no f16 arithmetic")
            return
        if self.rows % 4 or self.cols % 4 or self.tile_k % 4 or self.tile_m % self.rows or self.tile_n % self.cols:
            raise ValueError(f"bad GEMM config {self}")
        if self.stages not in (1, 2) or self.split_k < 1:
            raise ValueError(f"bad GEMM config {self}")


#: Elements of padding after each k-pair row of the f16-arithmetic kernel's workgroup tiles, so that the stores of
#: one fetch round spread over the memory banks.
HALF_PAIR_PAD = 2

#: The original kernel (64 x 64 tile, 16 x 16 invocations, scalar loads): a sweep candidate, and the measured
#: best of one shape in :data:`GEMM_SHAPE_CONFIGS`.
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
#: Workgroups a GEMM should launch to fill the GPU (4 per SM on a 132-SM GPU, the largest this was tuned on).
GEMM_TARGET_WORKGROUPS = 528
#: The large-problem tile, tried before :data:`GEMM_TILES`: 8 x 8 outputs per invocation make 64 FMAs per 16 values
#: read from workgroup memory (8 x 4: 32 per 12), which pays off once the grid still gives every SM about two
#: workgroups (:data:`GEMM_BIG_TILE_WORKGROUPS`) and M and N fill whole tiles.  On an H200 the fp32 matmul-1024-4096
#: chain (256 such workgroups) ran at 31.0 TFLOP/s with it against 20.0 with 128 x 64 / 8 x 4.  The bound is 1.8
#: workgroups per SM of a 132-SM GPU, not exactly 256, so that a decoder's vocabulary head ([128, 512] x [512, 32000]:
#: 250 workgroups, 1.9 per SM) gets the tile the chain's 256 get.
GEMM_BIG_TILE = GemmConfig(tile_m=128, tile_n=128, tile_k=16, rows=8, cols=8, stages=1, split_k=1, legacy=False)
GEMM_BIG_TILE_WORKGROUPS = 240
#: Where the first tile of :data:`GEMM_TILES` launches too few workgroups, it is still used, split over K, when M fills
#: its rows (the rows launched at most this many times M) and the split reaches half the target: on an H100 (`python
#: -m bench.sweep_kernels --shapes xf`) 128 x 64 / 8 x 4 split 2-8 beat the smaller tiles the ladder steps down to by
#: 1.1-1.4x on Whisper-tiny's projections and attention-times-values (M = 1500), while at M = 197 (ViT-B/16, 30% of
#: the tile's rows empty) it lost.
GEMM_SPLIT_ROW_FILL = 1.1
#: Split-K keeps at least this many K per slice (so the partial sums stay cheap next to the products).
GEMM_SPLIT_MIN_K = 64
#: At most this many K slices.
GEMM_MAX_SPLIT_K = 16
#: Whether float16 GEMMs multiply in f16 (:attr:`GemmConfig.half`, k-pairs) rather than in f32.  Off: through WGSL
#: the NVIDIA Vulkan driver runs f16 multiply-adds at only about 1.2x its f32 rate (``python -m bench.arithmetic`` on
#: an H100: f16 vec4 55 TFLOP/s, f32 vec4 45), and on an H100 the fp16 matmul-1024-4096 chain ran at 28.1 TFLOP/s
#: (128 x 128 tile, k-pairs) against 30.4 multiplying in f32, at twice the error (1.5e-3 against 8.3e-4 vs fp32).
GEMM_HALF_MATH = False
#: When set, every tiled GEMM uses this configuration (if the device fits it): for sweeps and tests.
GEMM_OVERRIDE: GemmConfig | None = None
#: Exact problems ``(batch, M, N, K)`` -> configuration, consulted before the rule (``python -m
#: bench.sweep_kernels`` prints a ready-to-paste table of the fastest configuration per measured shape).
# Chosen by `python -m bench.sweep_kernels` on a discrete GPU: the fastest configuration per measured shape of the
# benchmark models; the rule above (also chosen by that sweep, the candidate rule closest to the per-shape best on
# average) covers other shapes.
GEMM_SHAPE_CONFIGS: dict[tuple[int, int, int, int], GemmConfig] = {
    (1, 128, 384, 1536): GemmConfig(
        tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=11, legacy=False
    ),
    (1, 128, 384, 384): GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=6, legacy=False),
    (1, 128, 1536, 384): GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=6, legacy=False),
    (12, 128, 128, 32): GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=1, legacy=False),
    (12, 128, 32, 128): GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=2, legacy=False),
    (1, 2048, 384, 1536): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=4, legacy=False
    ),
    (1, 2048, 384, 384): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=4, legacy=False
    ),
    (1, 2048, 1536, 384): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False
    ),
    (192, 128, 128, 32): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=8, cols=4, stages=2, split_k=1, legacy=False),
    (192, 128, 32, 128): GemmConfig(tile_m=32, tile_n=32, tile_k=16, rows=4, cols=4, stages=2, split_k=1, legacy=False),
    (1, 64, 50176, 576): GemmConfig(
        tile_m=64, tile_n=128, tile_k=16, rows=4, cols=8, stages=2, split_k=2, legacy=False
    ),
    (1, 128, 12544, 1152): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=4, legacy=False
    ),
    (1, 256, 3136, 2304): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=8, legacy=False
    ),
    (1, 512, 784, 2304): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=12, legacy=False
    ),
    (1, 512, 784, 4608): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=12, legacy=False
    ),
    (1, 512, 784, 256): GemmConfig(tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=2, split_k=4, legacy=False),
    (16, 64, 50176, 576): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False
    ),
    (16, 128, 12544, 1152): GemmConfig(
        tile_m=64, tile_n=64, tile_k=16, rows=8, cols=4, stages=2, split_k=1, legacy=False
    ),
    (16, 256, 3136, 2304): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False
    ),
    (16, 512, 784, 2304): GemmConfig(
        tile_m=128, tile_n=64, tile_k=16, rows=8, cols=4, stages=1, split_k=1, legacy=False
    ),
    (16, 512, 784, 4608): GemmConfig(
        tile_m=64, tile_n=64, tile_k=16, rows=8, cols=4, stages=2, split_k=1, legacy=False
    ),
    (16, 512, 784, 256): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=1, legacy=True),
    (1, 64, 50176, 27): GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=1, split_k=1, legacy=False),
}


def config_fits(config: GemmConfig, caps: DeviceCaps) -> bool:
    """Whether the device's workgroup limits allow ``config``."""
    limits = caps.limits
    if config.legacy:
        return (
            limits.max_compute_invocations_per_workgroup >= 256
            and limits.max_compute_workgroup_storage_size >= config.shared_bytes
        )
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
    batch: int,
    m: int,
    n: int,
    k: int,
    caps: DeviceCaps,
    *,
    tiles: Sequence[GemmConfig] | None = None,
    target: int | None = None,
    split_min_k: int | None = None,
    max_split: int | None = None,
) -> GemmConfig:
    """The default configuration for a ``batch x [M, K] x [K, N]`` problem.

    1. :data:`GEMM_OVERRIDE` if set, else :data:`GEMM_SHAPE_CONFIGS` ``[(batch, M, N, K)]`` if present (and the
       device fits it).
    2. :data:`GEMM_BIG_TILE` where M and N are multiples of its tile and it launches at least
       :data:`GEMM_BIG_TILE_WORKGROUPS` workgroups (with the module's own tiles only).
    3. The first tile of :data:`GEMM_TILES` (that the device fits, and that is less than twice the problem in
       M and N) launching at least :data:`GEMM_TARGET_WORKGROUPS` workgroups; but where the first such tile falls
       short, M fills its rows (:data:`GEMM_SPLIT_ROW_FILL`) and a K split reaches half the target, that tile split
       as in 4.
    4. Otherwise the last such tile, with ``split_k = ceil(target / tiles)`` capped by
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
    big = GEMM_BIG_TILE
    if (
        tiles is GEMM_TILES
        and m % big.tile_m == 0
        and n % big.tile_n == 0
        and config_fits(big, caps)
        and gemm_workgroups(big, batch, m, n) >= GEMM_BIG_TILE_WORKGROUPS
    ):
        return big
    fitting = [c for c in tiles if config_fits(c, caps)]
    if not fitting:
        fitting = [GemmConfig(32, 32, 16, 4, 4, stages=1)]
    useful = [c for c in fitting if c.tile_m < 2 * m and c.tile_n < 2 * n] or fitting[-1:]
    first = useful[0]
    if tiles is GEMM_TILES and -(-m // first.tile_m) * first.tile_m <= GEMM_SPLIT_ROW_FILL * m:
        # the largest tile, its rows filled, split over K to fill the GPU rather than a smaller tile unsplit
        count = gemm_workgroups(dataclasses.replace(first, split_k=1), batch, m, n)
        split = min(max_split, k // max(1, split_min_k), -(-target // count))
        if count < target and split > 1 and 2 * count * split >= target:
            return dataclasses.replace(first, split_k=split)
    for config in useful:
        if gemm_workgroups(dataclasses.replace(config, split_k=1), batch, m, n) >= target:
            return dataclasses.replace(config, split_k=1)
    config = useful[-1]
    count = gemm_workgroups(dataclasses.replace(config, split_k=1), batch, m, n)
    split = min(max_split, k // max(1, split_min_k), -(-target // count))
    return dataclasses.replace(config, split_k=max(1, split))
