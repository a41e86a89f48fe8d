"""The row-per-invocation flash kernel (:mod:`ortgpu.ops._flash_rows`): 16 query rows or more, every key split.

Its hazards: a split that folds in another split's keys or none, the merge of splits that saw nothing (a row of
dropped keys, a causal block), masks read through the packed tile, the Q row in registers vs the Q tile (heads over
64), and tiles shrunk to fit the device.  Every case is checked against onnxruntime CPU through a session (on the
fake backend the kernel's numpy twin runs, so the WGSL itself is checked on wgpu), and the plan is checked to use
this kernel.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from test_fused_attention import CAPS, _check, _feeds, _fused_steps, bert, grouped, hf_eager, sdpa

import ortgpu
from ortgpu.ops import _flash_rows
from ortgpu.ops._flash_attention import FlashProblem, OperandView
from ortgpu.ops._flash_rows import RowsTiles, attention_kernel, key_splits, rows_tiles

#: lavapipe's workgroup storage (32 KB), where these tests run the WGSL.
LAVAPIPE_CAPS = replace(CAPS, limits=replace(CAPS.limits, max_compute_workgroup_storage_size=32768))


@pytest.fixture(params=[1, 2, 4, 8], ids=lambda s: f"splits{s}")
def splits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Plan every problem with this many key splits, whatever its size."""
    count = int(request.param)
    monkeypatch.setattr(_flash_rows, "key_splits", lambda rows_total: count)
    return count


def _problem(sq: int, sk: int, head: int, value_head: int, batch: tuple[int, ...] = (2,), mask: bool = False) -> Any:
    def view(index: int, rows: int, cols: int) -> OperandView:
        return OperandView(index, (rows * cols,), cols, 1)

    return FlashProblem(
        batch=batch,
        sq=sq,
        sk=sk,
        head=head,
        value_head=value_head,
        q=view(0, sq, head),
        k=view(1, sk, head),
        v=view(2, sk, value_head),
        mask=view(3, sq, sk) if mask else None,
        logit_scale=0.125,
        bias_scale=1.0,
        out=view(0, sq, value_head),
    )


@pytest.mark.parametrize("head", [32, 64, 80, 128])
@pytest.mark.parametrize("sq,sk", [(16, 16), (33, 70), (100, 9)])
def test_lengths_and_heads(env: ortgpu.Env, splits: int, head: int, sq: int, sk: int) -> None:
    model = hf_eager(1, 2, sq, sk, head, head, (1, 1, sq, sk))
    feeds = _feeds(model, head + sq + splits)
    assert rows_tiles(_problem(sq, sk, head, head), LAVAPIPE_CAPS) is not None  # (16 KB fit heads up to 80)
    assert len(_fused_steps(model, feeds)) == 1
    _check(env, model, feeds)


@pytest.mark.parametrize("kind", ["zero", "finite-min", "rows-dropped", "keys-dropped", "split-dropped"])
def test_masks(env: ortgpu.Env, splits: int, kind: str) -> None:
    sq, sk = 20, 67
    mask = np.zeros((2, 1, sq, sk), np.float32)
    if kind == "finite-min":
        mask[:, :, :, 4:] = np.finfo(np.float32).min
    elif kind == "rows-dropped":
        mask[0, :, 2, :] = -np.inf  # every key of a row dropped: NaN, as Softmax gives
        mask[1, :, 17, :] = -np.inf
    elif kind == "keys-dropped":
        mask[:, :, :, ::2] = -np.inf
    elif kind == "split-dropped":
        mask[:, :, :, 40:] = -np.inf  # the later splits of the last tiles see nothing: the merge skips them
        mask[:, :, 5, :3] = -np.inf
    model = hf_eager(2, 3, sq, sk, 16, 24, (2, 1, sq, sk))
    _check(env, model, _feeds(model, 4, mask=mask))


@pytest.mark.parametrize("sq,sk", [(16, 16), (40, 40), (20, 45), (64, 130)])
def test_causal(env: ortgpu.Env, splits: int, sq: int, sk: int) -> None:
    model = sdpa(1, 3, sq, sk, 32, causal=True)
    feeds = _feeds(model, sq * sk)
    assert len(_fused_steps(model, feeds)) == 1
    _check(env, model, feeds)


def test_bert_heads_and_grouped_heads(env: ortgpu.Env, splits: int) -> None:
    model = bert(2, 4, 37, 16)
    mask = np.zeros((2, 1, 1, 37), np.float32)
    mask[1, ..., 29:] = -10000.0
    _check(env, model, _feeds(model, 5, mask=mask))
    model = grouped(2, 2, 3, 21, 32)
    _check(env, model, _feeds(model, 7))


def test_tiles_shrink_to_the_workgroup_storage() -> None:
    def caps(limit: int) -> Any:
        return replace(CAPS, limits=replace(CAPS.limits, max_compute_workgroup_storage_size=limit))

    problem = _problem(64, 64, 64, 64, mask=True)
    tiles, roomy = rows_tiles(problem, caps(16384)), rows_tiles(problem, caps(49152))
    assert tiles is not None and roomy is not None
    assert 16 * sum(tiles.shared_vectors(64, 64, True, False)[:2]) <= 16384
    assert 16 * sum(roomy.shared_vectors(64, 64, True, False)[:2]) <= 49152
    assert tiles.keys < roomy.keys
    # a head of 128 reads its Q row from a tile: more splits (fewer rows) until it fits
    large = rows_tiles(_problem(64, 64, 128, 128), caps(32768))
    assert large is not None and 16 * sum(large.shared_vectors(128, 128, False, True)[:2]) <= 32768


@pytest.mark.parametrize(
    "sq, head, value_head, expected",
    [(15, 64, 64, False), (16, 64, 64, True), (64, 66, 64, False), (64, 64, 132, False), (64, 132, 64, False)],
)
def test_which_problems_it_takes(sq: int, head: int, value_head: int, expected: bool) -> None:
    assert (rows_tiles(_problem(sq, 40, head, value_head), CAPS) is not None) == expected
    wgsl, _, _ = attention_kernel(_problem(sq, 40, head, value_head), CAPS)
    assert ("var<workgroup> sm:" in wgsl) == expected  # else the blocks kernel


@pytest.mark.parametrize("rows_total, expected", [(1 << 16, 1), ((1 << 16) - 1, 2), (1 << 14, 4), (100, 8)])
def test_splits_follow_the_problem_size(rows_total: int, expected: int) -> None:
    assert key_splits(rows_total) == expected
    tiles = rows_tiles(_problem(16, 40, 64, 64, batch=(-(-rows_total // 16),)), CAPS)
    assert isinstance(tiles, RowsTiles) and tiles.rows * tiles.splits == 128
    assert tiles.splits == key_splits(-(-rows_total // 16) * 16)
