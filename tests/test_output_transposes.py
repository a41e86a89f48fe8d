"""A Transpose read only from a MatMul's product, folded into the product's store (``_output_perm``): when it is
folded, and that every kernel variant stores each element at its transposed place."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps, _gemm, _gemv
from ortgpu.ops._gemm import LEGACY, GemmConfig
from ortgpu.ops._gemv import GemvConfig
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)


def _heads_merge(
    a_shape: Sequence[int],
    columns: int | None,
    perm: Sequence[int] = (0, 2, 1, 3),
    *,
    bias: bool = False,
    residual: bool = False,
    product_out: bool = False,
    also_read: bool = False,
    dtype: Any = np.float32,
) -> onnx.ModelProto:
    """``A @ B -> [+ bias] [+ R] -> Transpose(perm) -> Reshape (last two axes merged)``: B a constant ``[K,
    columns]``, or (``columns`` None) a second input ``[..., K, K]``, as an attention's ``scores @ V``."""
    rng = np.random.default_rng(sum(a_shape))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    k = a_shape[-1]
    inputs = [helper.make_tensor_value_info("A", elem, list(a_shape))]
    inits = []
    if columns is None:
        b_shape = list(a_shape[:-2]) + [k, k]
        inputs.append(helper.make_tensor_value_info("B", elem, b_shape))
        product_shape = list(a_shape[:-1]) + [k]
    else:
        inits.append(numpy_helper.from_array((rng.standard_normal((k, columns)) * 0.3).astype(dtype), "B"))
        product_shape = list(a_shape[:-1]) + [columns]
    nodes = [helper.make_node("MatMul", ["A", "B"], ["P"], name="product")]
    current = "P"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(product_shape[-1]).astype(dtype), "bias"))
        nodes.append(helper.make_node("Add", [current, "bias"], ["PB"], name="bias"))
        current = "PB"
    if residual:
        inputs.append(helper.make_tensor_value_info("R", elem, product_shape))
        nodes.append(helper.make_node("Add", [current, "R"], ["PR"], name="residual"))
        current = "PR"
    nodes.append(helper.make_node("Transpose", [current], ["T"], name="transpose", perm=list(perm)))
    shape = [product_shape[p] for p in perm]
    merged = np.asarray(shape[:-2] + [shape[-2] * shape[-1]], np.int64)
    inits.append(numpy_helper.from_array(merged, "merged"))
    nodes.append(helper.make_node("Reshape", ["T", "merged"], ["Y"], name="merge"))
    outputs = ["Y"] + ([current] if product_out else [])
    if also_read:
        nodes.append(helper.make_node("Relu", [current], ["other"], name="other"))
        outputs.append("other")
    graph = helper.make_graph(
        nodes, "heads", inputs, [helper.make_tensor_value_info(name, elem, None) for name in outputs], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    feeds = {}
    for value in model.graph.input:
        shape = tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _folded(model: onnx.ModelProto) -> bool:
    """Whether the plan stores the product transposed (and runs no Transpose of its own)."""
    feeds = _feeds(model)
    plan = plan_model(
        load_model(model),
        {n: v.shape for n, v in feeds.items()},
        CAPS,
        input_dtypes={n: v.dtype for n, v in feeds.items()},
    )
    folded = [step for step in plan.steps if "_output_perm" in step.attrs]
    assert len(folded) <= 1
    if folded:
        assert "transpose" in folded[0].node_names
        assert not any("transpose" in step.node_names for step in plan.steps if step is not folded[0])
    return bool(folded)


def _check(env: ortgpu.Env, model: onnx.ModelProto) -> None:
    feeds = _feeds(model)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        got = session.run(None, feeds)
    half = any(v.dtype == np.float16 for v in feeds.values())
    for actual, want in zip(got, expected):
        assert actual.shape == want.shape and actual.dtype == want.dtype
        tolerance = 3e-3 if half else 1e-5
        np.testing.assert_allclose(actual.astype(np.float32), want.astype(np.float32), rtol=tolerance, atol=tolerance)


# -- when it folds -------------------------------------------------------------------------------------------------


def test_the_heads_merge_after_a_product_is_folded() -> None:
    assert _folded(_heads_merge((2, 3, 5, 8), 8))
    assert _folded(_heads_merge((1, 4, 6, 8), None))  # scores @ V: both operands inputs
    assert _folded(
        _heads_merge((2, 3, 5, 8), 8, bias=True, residual=True)
    )  # the epilogue stays in the product's layout


def test_a_transpose_that_moves_the_last_axis_is_not_folded() -> None:
    assert not _folded(_heads_merge((2, 3, 5, 8), 8, perm=(0, 1, 3, 2)))


def test_a_product_read_elsewhere_or_returned_is_not_folded() -> None:
    assert not _folded(_heads_merge((2, 3, 5, 8), 8, product_out=True))
    assert not _folded(_heads_merge((2, 3, 5, 8), 8, also_read=True))


def test_unfused_plans_do_not_fold() -> None:
    model = _heads_merge((2, 3, 5, 8), 8)
    feeds = _feeds(model)
    plan = plan_model(load_model(model), {n: v.shape for n, v in feeds.items()}, CAPS, fuse=False)
    assert not any("_output_perm" in step.attrs for step in plan.steps)


# -- the stores ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: _heads_merge((2, 3, 5, 8), 8),
        lambda: _heads_merge((1, 6, 33, 20), 12, bias=True, residual=True),
        lambda: _heads_merge((1, 4, 9, 9), None),
        lambda: _heads_merge((2, 3, 4, 5, 6), 7, perm=(0, 3, 1, 2, 4)),
        lambda: _heads_merge((1, 3, 5, 8), 8, dtype=np.float16),
    ],
    ids=["heads", "epilogue", "scores-v", "rank-5", "float16"],
)
def test_outputs_match_onnxruntime(env: ortgpu.Env, build: Any) -> None:
    model = build()
    assert _folded(model)
    _check(env, model)


@pytest.mark.parametrize(
    "config",
    [LEGACY, GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=3), _gemm.GEMM_BIG_TILE],
    ids=lambda c: c.label,
)
def test_every_gemm_variant_stores_transposed(
    env: ortgpu.Env, config: GemmConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", config)
    _check(env, _heads_merge((2, 3, 37, 96), 20, bias=True, residual=True))


@pytest.mark.parametrize("split_k", [1, 3])
def test_one_row_gemv_stores_transposed(env: ortgpu.Env, split_k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gemv, "GEMV_OVERRIDE", GemvConfig(threads_x=4, threads_k=64, unroll=2, split_k=split_k))
    model = _heads_merge((1, 1, 1, 256), 24, perm=(1, 2, 0, 3), bias=True)
    assert _folded(model)
    _check(env, model)
