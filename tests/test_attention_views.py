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
from ortgpu.ops import DeviceCaps, _fused_attention
from ortgpu.ops._fused_attention import FusedAttention

_DATA_MOVEMENT = {"Gather", "Split", "Slice", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Cast"}


def _plan(model: onnx.ModelProto, feeds: dict[str, np.ndarray], caps: DeviceCaps = CAPS) -> Any:
    return plan_model(
        load_model(model),
        {n: v.shape for n, v in feeds.items()},
        caps,
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


@pytest.mark.parametrize(
    "b,hkv,rep,mask",
    [(1, 2, 2, False), (1, 2, 4, True), (2, 2, 2, True), (3, 2, 3, True), (2, 1, 3, False)],
    ids=["b1", "b1-mask", "b2-mask", "b3-mask", "one-kv-head"],
)
def test_repeated_heads_are_read_in_place(
    env: ortgpu.Env, no_fused_kernel: None, b: int, hkv: int, rep: int, mask: bool
) -> None:
    # HF's repeat_kv (Unsqueeze, Expand, Reshape) is not copied: both products run over the head axis split into
    # (groups, rep), K and V read with stride 0 along the repeats, a mask per batch split with the scores
    model = repeated_heads(b, hkv, rep, 5, 8, mask)
    feeds = _feeds(model, 6 + rep)
    plan = _plan(model, feeds)
    products = _products_reading_views(plan)
    assert len(products) == 2 and _copies(plan) == []
    assert products[0].inputs[:2] == ("q_proj", "k_proj") and products[1].inputs[1] == "v_proj"
    assert sum(step.op_types.count("Expand") for step in products) == 2
    _check(env, model, feeds, fused=False)


def test_a_mask_per_head_of_repeated_heads_is_split_too(env: ortgpu.Env, no_fused_kernel: None) -> None:
    model = repeated_heads(2, 2, 2, 5, 8, mask=True)
    (mask,) = [value for value in model.graph.input if value.name == "mask"]
    mask.type.tensor_type.shape.dim[1].dim_value = 4  # [B, H, S, S]: one mask per query head
    feeds = _feeds(model, 9)
    assert len(_products_reading_views(_plan(model, feeds))) == 2
    _check(env, model, feeds, fused=False)


def _hf_eager_float16(heads: int, rows: int, keys: int, head: int, scale_in_float32: bool = False) -> onnx.ModelProto:
    """A float16 export of HF's eager attention: scores, scale and mask in float16, then
    ``softmax(..., dtype=torch.float32).to(torch.float16)`` as Cast, Softmax, Cast, and the product with V.
    ``scale_in_float32``: the Cast comes right after the product, the scale and the mask follow in float32."""
    f16 = onnx.TensorProto.FLOAT16
    nodes = [
        onnx.helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        onnx.helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        onnx.helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        onnx.helper.make_node("Add", ["s1", "mask"], ["s2"]),
        onnx.helper.make_node("Cast", ["s2"], ["s32"], to=onnx.TensorProto.FLOAT),
    ]
    if scale_in_float32:
        nodes = [
            nodes[0],
            nodes[1],
            onnx.helper.make_node("Cast", ["s0"], ["c0"], to=onnx.TensorProto.FLOAT),
            onnx.helper.make_node("Cast", ["scale"], ["scale32"], to=onnx.TensorProto.FLOAT),
            onnx.helper.make_node("Cast", ["mask"], ["mask32"], to=onnx.TensorProto.FLOAT),
            onnx.helper.make_node("Mul", ["c0", "scale32"], ["c1"]),
            onnx.helper.make_node("Add", ["c1", "mask32"], ["s32"]),
        ]
    nodes += [
        onnx.helper.make_node("Softmax", ["s32"], ["p32"], axis=-1),
        onnx.helper.make_node("Cast", ["p32"], ["p"], to=f16),
        onnx.helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    shapes = {"q": (1, heads, rows, head), "k": (1, heads, keys, head), "v": (1, heads, keys, head)}
    graph = onnx.helper.make_graph(
        nodes,
        "attention_float16",
        [onnx.helper.make_tensor_value_info(n, f16, s) for n, s in {**shapes, "mask": (1, 1, rows, keys)}.items()],
        [onnx.helper.make_tensor_value_info("y", f16, None)],
        [onnx.numpy_helper.from_array(np.array(1.0 / np.sqrt(head), np.float16), "scale")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("scale_in_float32", [False, True], ids=["scale-in-float16", "scale-in-float32"])
def test_float16_softmax_casts_run_between_the_products(
    env: ortgpu.Env, no_fused_kernel: None, scale_in_float32: bool
) -> None:
    # the Casts to float32 and back fold with the Softmax into the second product's loads (f32 probabilities, never
    # stored); the products read Q, K^T and V in place, unless the scale and mask come after the Cast (the scores'
    # epilogue cannot round before them): then node by node
    model = _hf_eager_float16(2, 7, 9, 16, scale_in_float32)
    rng = np.random.default_rng(8)
    feeds = {name: rng.standard_normal((1, 2, n, 16)).astype(np.float16) for name, n in (("q", 7), ("k", 9), ("v", 9))}
    feeds["mask"] = np.where(rng.random((1, 1, 7, 9)) < 0.3, -60000.0, 0.0).astype(np.float16)
    plan = _plan(model, feeds, DeviceCaps(frozenset({"shader-f16"}), CAPS.limits))
    products = _products_reading_views(plan)
    if scale_in_float32:
        assert products == []
    else:
        assert len(products) == 2 and products[0].inputs[2] == "mask"
        assert _copies(plan) == []  # no copies at all, and no Softmax step
        assert products[1].attrs["_softmax_a"] is True and products[1].op_types[:3] == ("Cast", "Softmax", "Cast")
        assert products[1].input_infos[0].dtype == np.float16 and len(plan.steps) == 2
    scores = feeds["q"].astype(np.float32) @ feeds["k"].astype(np.float32).transpose(0, 1, 3, 2) / 4.0
    scores = scores + feeds["mask"].astype(np.float32)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = (weights / weights.sum(-1, keepdims=True)) @ feeds["v"].astype(np.float32)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        placement = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        assert all(p.placement == "webgpu" for p in placement)
        (got,) = session.run(None, feeds)
    assert got.dtype == np.float16 and got.shape == want.shape
    assert float(np.abs(got.astype(np.float32) - want).max()) <= 5e-3 * float(np.abs(want).max())
    with ortgpu.InferenceSession(model.SerializeToString(), env=env, fuse=False) as session:
        (node_by_node,) = session.run(None, feeds)
    # the same roundings as the graph's, but the scores' (one at the end of the product's epilogue, not three)
    assert float(np.abs(got.astype(np.float32) - node_by_node.astype(np.float32)).max()) <= 5e-3 * float(
        np.abs(want).max()
    )
