"""The register-tiled flash kernel (:mod:`ortgpu.ops._flash_blocks`): a block of query rows per workgroup, 4 rows
and ``keys / 16`` keys per invocation.

Its hazards: the row group's 16 invocations agreeing on one running maximum (each reads all partials), rows past
the query and keys past the last tile, dropped keys tracked by flags (masks of ``-inf``, a whole row dropped, a
whole tile dropped, the causal frontier), a finite ``float32.min`` mask (no overflow in the clamped exponent), value
heads that leave some of the 16 column invocations idle (32) or give them two columns (128), and every tile size.
Each case runs with this kernel forced, against onnxruntime CPU through a session (on the fake backend the
kernel's numpy twin runs, so the WGSL itself is checked on wgpu).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from test_flash_rows import LAVAPIPE_CAPS, _problem
from test_fused_attention import CAPS, _check, _feeds, _fused_steps, bert, grouped, hf_eager, sdpa

import ortgpu
from ortgpu.ops import _flash_blocks, _flash_rows
from ortgpu.ops._flash_blocks import CANDIDATES, BlockTiles, block_tiles
from ortgpu.ops._flash_rows import attention_kernel

LAVAPIPE_TILES = [tiles for tiles in CANDIDATES if tiles.shared_bytes(64, 64) <= 32768]


@pytest.fixture(params=LAVAPIPE_TILES, ids=lambda t: f"r{t.rows}k{t.keys}")
def tiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> BlockTiles:
    """Every problem planned with this kernel and these tiles (the smallest where a large head does not fit)."""
    forced: BlockTiles = request.param
    monkeypatch.setattr(_flash_rows, "prefers_blocks", lambda problem: True)
    original = _flash_blocks.block_tiles

    def pick(problem: Any, caps: Any) -> BlockTiles | None:
        chosen = original(problem, caps)
        limit = caps.limits.max_compute_workgroup_storage_size
        if chosen is not None and forced.shared_bytes(problem.head, problem.value_head) <= limit:
            return forced
        return chosen

    monkeypatch.setattr(_flash_rows, "block_tiles", pick)
    return forced


@pytest.mark.parametrize("head", [32, 64, 80, 128])
@pytest.mark.parametrize("sq,sk", [(1, 5), (16, 16), (33, 70), (100, 9)])
def test_lengths_and_heads(env: ortgpu.Env, tiles: BlockTiles, head: int, sq: int, sk: int) -> None:
    model = hf_eager(1, 2, sq, sk, head, head, (1, 1, sq, sk))
    feeds = _feeds(model, head + sq + tiles.keys)
    assert block_tiles(_problem(sq, sk, head, head), LAVAPIPE_CAPS) is not None
    assert len(_fused_steps(model, feeds)) == 1
    _check(env, model, feeds)


@pytest.mark.parametrize("kind", ["zero", "finite-min", "rows-dropped", "keys-dropped", "tile-dropped", "all-dropped"])
def test_masks(env: ortgpu.Env, tiles: BlockTiles, kind: str) -> None:
    sq, sk = 21, 67
    mask = np.zeros((2, 1, sq, sk), np.float32)
    if kind == "finite-min":
        mask[:, :, :, 4:] = np.finfo(np.float32).min
        mask[:, :, 3, :] = np.finfo(np.float32).min  # every key at the lowest float: uniform weights
    elif kind == "rows-dropped":
        mask[0, :, 2, :] = -np.inf  # every key of a row dropped: NaN, as Softmax gives
        mask[1, :, 17, :] = -np.inf
    elif kind == "keys-dropped":
        mask[:, :, :, ::2] = -np.inf
    elif kind == "tile-dropped":
        mask[:, :, :, :40] = -np.inf  # the first tiles see nothing: the maximum starts later
        mask[:, :, 5, 60:] = -np.inf
    elif kind == "all-dropped":
        mask[:] = -np.inf
    model = hf_eager(2, 3, sq, sk, 16, 24, (2, 1, sq, sk))
    _check(env, model, _feeds(model, 4, mask=mask))


def test_scores_far_apart_across_tiles(env: ortgpu.Env, tiles: BlockTiles) -> None:
    """The running maximum jumps by far more than 88 between tiles: the earlier sums rescale to nothing, and the
    earlier tiles' weights of a row whose maximum comes first stay exactly 1 against tiny later ones."""
    sq, sk = 18, 70
    mask = np.zeros((1, 1, sq, sk), np.float32)
    mask[..., :9, 50:] = 400.0
    mask[..., 9:, :3] = 400.0
    model = hf_eager(1, 2, sq, sk, 8, 8, (1, 1, sq, sk))
    _check(env, model, _feeds(model, 9, mask=mask))


@pytest.mark.parametrize("sq,sk", [(16, 16), (40, 40), (20, 45), (70, 130)])
def test_causal(env: ortgpu.Env, tiles: BlockTiles, sq: int, sk: int) -> None:
    model = sdpa(1, 3, sq, sk, 32, causal=True)
    feeds = _feeds(model, sq * sk)
    assert len(_fused_steps(model, feeds)) == 1
    _check(env, model, feeds)


def test_bert_heads_and_grouped_heads(env: ortgpu.Env, tiles: BlockTiles) -> None:
    model = bert(2, 4, 37, 16)
    mask = np.zeros((2, 1, 1, 37), np.float32)
    mask[1, ..., 29:] = -10000.0
    _check(env, model, _feeds(model, 5, mask=mask))
    model = grouped(2, 2, 3, 21, 32)
    _check(env, model, _feeds(model, 7))


def test_tiles_fit_the_workgroup_storage() -> None:
    def caps(limit: int) -> Any:
        return replace(CAPS, limits=replace(CAPS.limits, max_compute_workgroup_storage_size=limit))

    for limit in (16384, 32768, 49152):
        for head in (32, 64, 128):
            chosen = block_tiles(_problem(200, 200, head, head), caps(limit))
            if chosen is not None:
                assert chosen.shared_bytes(head, head) <= limit
    assert block_tiles(_problem(200, 200, 64, 64), caps(49152)) == BlockTiles(64, 32)
    assert block_tiles(_problem(200, 200, 64, 64), caps(32768)) == BlockTiles(32, 32)
    assert block_tiles(_problem(5, 200, 64, 64), caps(49152)) == BlockTiles(16, 16)  # a short query, a small block
    assert block_tiles(_problem(64, 64, 66, 64), caps(49152)) is None
    assert block_tiles(_problem(64, 64, 64, 132), caps(49152)) is None


def test_the_kernel_is_what_runs_when_forced(tiles: BlockTiles) -> None:
    wgsl, grid, _ = attention_kernel(_problem(40, 40, 64, 64), LAVAPIPE_CAPS)
    assert f"@workgroup_size({tiles.threads})" in wgsl and "var<workgroup> ps:" in wgsl
    assert grid[0] == 2 * -(-40 // tiles.rows)
