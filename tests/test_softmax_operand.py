"""The Softmax between an unfused attention's two products folded into the second one's loads (MatMul's
``_softmax_a``, :mod:`ortgpu.ops._softmax_operand`): the product on both backends at its edges (every kernel variant
that reads A, split-K, odd lengths, broadcast batches, masked and fully masked rows, float16 scores), what it refuses,
and the planner choosing it for attentions the fused kernel does not take."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest
from test_attention_views import _plan, _products_reading_views, no_fused_kernel  # noqa: F401 (a fixture)
from test_fused_attention import _check, _feeds, hf_eager, mha_packed, repeated_heads, sdpa
from test_ops_compute import assert_close
from test_ops_elementwise import open_device

import ortgpu
from ortgpu.ops import DeviceCaps, NotOnDevice, TensorInfo, _gemm, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu_core._errors import UnsupportedOpError

RNG = np.random.default_rng(20261208)


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def device(request: pytest.FixtureRequest) -> Iterator[Any]:
    dev = open_device(str(request.param))  # lavapipe in CI: no adapter is a failure, not a skip
    yield dev
    dev.destroy()


def _caps(device: Any) -> DeviceCaps:
    return DeviceCaps(frozenset(device.features), device.limits)


def _softmax(s: np.ndarray) -> np.ndarray:
    wide = s.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(wide - wide.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _run(device: Any, s: np.ndarray, v: np.ndarray, attrs: dict[str, Any] | None = None) -> tuple[np.ndarray, Any]:
    """(device output, plan) of ``softmax(s) @ v`` as one MatMul node with ``_softmax_a``."""
    operator = get_operator("MatMul", 13)
    batch = np.broadcast_shapes(s.shape[:-2], v.shape[:-2])
    out = TensorInfo(tuple(batch) + (s.shape[-2], v.shape[-1]), s.dtype)
    infos = [TensorInfo(s.shape, s.dtype), TensorInfo(v.shape, v.dtype)]
    plan = operator.plan(infos, [out], {"_softmax_a": True, **(attrs or {})}, _caps(device), {})
    before = device.live_handles()
    (got,) = run_plan(device, plan, [s, v], [out])
    assert device.live_handles() == before
    return np.asarray(got), plan


SHAPES = [
    ((6, 150, 150), (6, 150, 64)),  # Whisper's shape, smaller: K and N multiples of 4 (vec4 loads)
    ((2, 3, 37, 45), (2, 3, 45, 16)),  # odd rows and keys: scalar loads of A
    ((1, 9, 33), (33, 5)),  # V broadcast over the batch: the rows merge into one product
    ((2, 1, 7, 12), (2, 4, 12, 8)),  # the scores broadcast over the heads: A's rows repeat
    ((4, 197, 197), (4, 197, 64)),  # ViT-B/16's 197 keys
]
CONFIGS = {
    "rule": None,
    "split-k": _gemm.GemmConfig(tile_m=32, tile_n=64, tile_k=16, split_k=3),
    "big-tile": _gemm.GEMM_BIG_TILE,
    "legacy": _gemm.LEGACY,
}


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("shapes", SHAPES, ids=[str(s[0]) for s in SHAPES])
def test_the_product_of_the_softmax(
    device: Any, monkeypatch: pytest.MonkeyPatch, config: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", CONFIGS[config])
    s = (RNG.standard_normal(shapes[0]) * 4).astype(np.float32)
    v = RNG.standard_normal(shapes[1]).astype(np.float32)
    got, plan = _run(device, s, v)
    assert plan.scratch_sizes[0] == s.size // s.shape[-1] * 8  # (maximum, reciprocal sum) per row
    assert_close(got, np.matmul(_softmax(s), v).astype(np.float32))


def test_a_view_of_the_same_bytes(device: Any) -> None:
    # the scores [2, 6, 20, 40] read as [12, 20, 40] (heads merged: the strided GEMM's path, rows by flat offset)
    s = (RNG.standard_normal((2, 6, 20, 40)) * 3).astype(np.float32)
    v = RNG.standard_normal((12, 40, 8)).astype(np.float32)
    view = ((12, 20, 40), (800, 40, 1), 0)
    operator = get_operator("MatMul", 13)
    out = TensorInfo((12, 20, 8), np.dtype(np.float32))
    attrs = {"_softmax_a": True, "_input_views": (view, None)}
    plan = operator.plan([TensorInfo(s.shape, s.dtype), TensorInfo(v.shape, v.dtype)], [out], attrs, _caps(device), {})
    (got,) = run_plan(device, plan, [s, v], [out])
    assert_close(np.asarray(got), np.matmul(_softmax(s.reshape(12, 20, 40)), v).astype(np.float32))


def test_masked_rows(device: Any) -> None:
    s = (RNG.standard_normal((3, 20, 40)) * 3).astype(np.float32)
    s[0, :, ::3] = -np.inf  # masked keys: probability 0
    s[1, 5:, 10:] = -np.inf  # a causal-like block
    s[2, 7, :] = -np.inf  # one fully masked row: NaN, as the Softmax step gives (0 / 0)
    s[2, 8, :] = 3.0e38  # a row near float32's largest value
    v = RNG.standard_normal((3, 40, 8)).astype(np.float32)
    got, _ = _run(device, s, v)
    want = np.matmul(_softmax(s), v)
    assert np.all(np.isnan(got[2, 7])) and not np.isnan(np.delete(got.reshape(60, 8), 47, axis=0)).any()
    finite = ~np.isnan(want)
    assert_close(got[finite], want[finite].astype(np.float32))


def test_float16_scores_are_softmaxed_in_f32(device: Any) -> None:
    assert "shader-f16" in device.features  # both test devices have it
    s = (RNG.standard_normal((2, 30, 64)) * 4).astype(np.float16)
    v = RNG.standard_normal((2, 64, 16)).astype(np.float16)
    got, _ = _run(device, s, v)
    assert got.dtype == np.float16
    want = np.matmul(_softmax(s), v.astype(np.float64))  # the probabilities never rounded to float16
    assert float(np.abs(got.astype(np.float64) - want).max()) <= 2e-3 * float(np.abs(want).max())


def test_what_it_refuses(device: Any) -> None:
    operator = get_operator("MatMul", 13)
    caps = _caps(device)
    f32 = np.dtype(np.float32)

    def plan(a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...], **attrs: Any) -> Any:
        return operator.plan([TensorInfo(a, f32), TensorInfo(b, f32)], [TensorInfo(out, f32)], attrs, caps, {})

    with pytest.raises(NotOnDevice, match="one-row"):  # the GEMV's loads take no statistics
        plan((1, 40), (40, 8), (1, 8), _softmax_a=True)
    with pytest.raises(NotOnDevice, match="whole input read in order"):  # a folded transpose reorders the rows
        plan((3, 20, 40), (3, 20, 8), (3, 40, 8), _softmax_a=True, _input_perms=((0, 2, 1), None))
    view = ((3, 10, 40), (800, 40, 1), 0)  # every other half of the rows: not the whole input in order
    with pytest.raises(NotOnDevice, match="whole input read in order"):
        plan((3, 20, 40), (3, 40, 8), (3, 10, 8), _softmax_a=True, _input_views=(view, None))
    with pytest.raises(UnsupportedOpError, match="_softmax_a must be True or False"):
        plan((3, 20, 40), (3, 40, 8), (3, 20, 8), _softmax_a=1)
    assert plan((3, 20, 40), (3, 40, 8), (3, 20, 8), _softmax_a=False).scratch_sizes == ()
    with pytest.raises(NotOnDevice, match="K is 0"):  # the twin computes the zeros instead
        plan((3, 20, 0), (3, 0, 8), (3, 20, 8), _softmax_a=True)
    (zeros,) = operator.reference(
        [np.zeros((3, 20, 0), f32), np.zeros((3, 0, 8), f32)], {"_softmax_a": True}, [TensorInfo((3, 20, 8), f32)]
    )
    assert zeros.shape == (3, 20, 8) and not zeros.any()


# -- the planner --------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_fused_kernel")
@pytest.mark.parametrize(
    "build",
    [
        lambda: hf_eager(1, 2, 5, 7, 8, 8, (1, 1, 5, 7)),
        lambda: sdpa(1, 2, 4, 6, 8, causal=True),
        lambda: mha_packed(5, 1, 2, 8),
        lambda: repeated_heads(2, 2, 2, 5, 8, True),
    ],
    ids=["hf-eager-mask", "sdpa-causal", "mha-packed", "repeated-heads"],
)
def test_the_planner_folds_an_unfused_attentions_softmax(env: ortgpu.Env, build: Any) -> None:
    model = build()
    feeds = _feeds(model, 11)
    plan = _plan(model, feeds)
    scores, mix = _products_reading_views(plan)
    assert mix.attrs["_softmax_a"] is True and mix.inputs[0] == scores.outputs[0]
    assert "Softmax" in mix.op_types and not any(step.op_types == ("Softmax",) for step in plan.steps)
    _check(env, model, feeds, fused=False)  # against onnxruntime CPU, 1e-4


@pytest.mark.usefixtures("no_fused_kernel")
def test_one_query_row_keeps_the_softmax_step(env: ortgpu.Env) -> None:
    model = mha_packed(1, 1, 1, 8)  # one head of one row: the GEMV, which reads no statistics
    feeds = _feeds(model, 12)
    plan = _plan(model, feeds)
    assert "_softmax_a" not in _products_reading_views(plan)[1].attrs
    assert any(step.op_types == ("Softmax",) for step in plan.steps)
    _check(env, model, feeds, fused=False)
