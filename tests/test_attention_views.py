"""Attention the fused kernel does not take (longer than it handles) as three steps whose products read Q, K^T and V
in place (``_input_views``): no copies for a packed projection's split or the heads' Reshapes and Transposes."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from test_fused_attention import (
    CAPS,
    _check,
    _feeds,
    bert,
    grouped,
    hf_eager,
    mha_packed,
    repeated_heads,
    sdpa,
    timm_packed,
)

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import _fused_attention
from ortgpu.ops._fused_attention import FusedAttention

_DATA_MOVEMENT = {"Gather", "Split", "Slice", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Cast"}


def _plan(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Any:
    return plan_model(
        load_model(model),
        {n: v.shape for n, v in feeds.items()},
        CAPS,
        input_dtypes={n: v.dtype for n, v in feeds.items()},
    )


def _products_reading_views(plan: Any) -> list[Any]:
    return [step for step in plan.steps if "_input_views" in step.attrs]


def _copies(plan: Any) -> list[tuple[str, ...]]:
    """Steps that only move data and run a kernel (what reading in place removes)."""
    return [
        step.op_types
        for step in plan.steps
        if step.op_plan is not None and step.op_plan.kernels and set(step.op_types) <= _DATA_MOVEMENT
    ]


@pytest.fixture
def no_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every attention over the fused kernel's bound (one score per head is too many)."""
    monkeypatch.setattr(_fused_attention, "FUSE_MAX_SCORES", 0)


@pytest.mark.parametrize(
    "build",
    [
        lambda: hf_eager(1, 2, 5, 7, 8, 8, (1, 1, 5, 7)),
        lambda: hf_eager(2, 3, 6, 6, 16, 8, None),
        lambda: sdpa(1, 2, 4, 6, 8, causal=True),
        lambda: bert(2, 2, 5, 8),
        lambda: mha_packed(5, 1, 2, 8),
        lambda: mha_packed(1, 1, 2, 8),  # one query row: the tiled kernel reads the views' offsets
        lambda: timm_packed(1, 5, 2, 8, "split"),
        lambda: timm_packed(2, 5, 2, 8, "slice"),
        lambda: grouped(1, 2, 2, 5, 8),
    ],
    ids=[
        "hf-eager-mask",
        "hf-eager",
        "sdpa-causal",
        "bert",
        "mha-packed",
        "mha-packed-one-row",
        "timm-split",
        "timm-slice",
        "grouped",
    ],
)
def test_unfused_attention_reads_its_operands_in_place(env: ortgpu.Env, no_fused_kernel: None, build: Any) -> None:
    model = build()
    feeds = _feeds(model, 3)
    plan = _plan(model, feeds)
    assert not any(isinstance(step.operator, FusedAttention) for step in plan.steps)
    assert len(_products_reading_views(plan)) == 2
    assert _copies(plan) == []
    _check(env, model, feeds, fused=False)


def test_a_long_packed_attention_reads_the_projection_without_the_bound_lowered(env: ortgpu.Env) -> None:
    model = mha_packed(130, 1, 2, 8)  # 130 x 130 scores per head: over the fused kernel's bound
    feeds = _feeds(model, 4)
    plan = _plan(model, feeds)
    assert len(_products_reading_views(plan)) == 2 and _copies(plan) == []
    _check(env, model, feeds, fused=False)


def test_a_batch_that_breaks_the_packed_view_copies_only_that(env: ortgpu.Env, no_fused_kernel: None) -> None:
    # at batch 2 a packed [S, B, 3E] projection's heads cannot be merged as one strided view of it (numpy's reshape
    # rule): the split runs once as a copy, and the products read its parts in place
    model = mha_packed(9, 2, 3, 8)
    feeds = _feeds(model, 7)
    plan = _plan(model, feeds)
    assert len(_products_reading_views(plan)) == 2 and len(_copies(plan)) == 1
    _check(env, model, feeds, fused=False)


def test_masks_and_scales_ride_in_the_scores_epilogue(env: ortgpu.Env, no_fused_kernel: None) -> None:
    model = hf_eager(1, 2, 5, 7, 8, 8, (1, 2, 5, 7))
    feeds = _feeds(model, 5, mask=np.where(np.random.default_rng(1).random((1, 2, 5, 7)) < 0.3, -1e9, 0.0))
    feeds["mask"] = feeds["mask"].astype(np.float32)
    plan = _plan(model, feeds)
    scores = _products_reading_views(plan)[0]
    assert scores.inputs[2] == "mask" and ("add", 2) in scores.attrs["_epilogue"]
    _check(env, model, feeds, fused=False)


def test_repeated_heads_keep_the_nodes(env: ortgpu.Env, no_fused_kernel: None) -> None:
    # the fused kernel splits the head axis for them; the products do not: the attention runs node by node
    model = repeated_heads(1, 2, 2, 5, 8)
    feeds = _feeds(model, 6)
    assert _products_reading_views(_plan(model, feeds)) == []
    _check(env, model, feeds, fused=False)
