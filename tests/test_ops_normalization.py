"""Attention and normalisation operators: references vs onnxruntime CPU, device plans vs the references.

Same method as ``test_ops_elementwise.py`` (whose helpers this module uses): single-node models on fresh random
inputs, onnxruntime's CPU provider as the judge of the references (SwiGLU, which onnxruntime lacks, against an
independent numpy formula), the fake and wgpu devices checked against the references.  Cases whose operator
runs on the CPU check that ``plan`` says why.
"""

from __future__ import annotations

import gc
from typing import Iterator

import numpy as np
import pytest
from test_ops_elementwise import (
    Case,
    Generator,
    absent,
    bools,
    caps_of,
    check_plan,
    check_reference,
    const,
    floats,
    halves,
    open_device,
)

from ortgpu.ops import TensorInfo, get_operator
from ortgpu_core._errors import InvalidArgumentError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

I64 = np.int64
#: an output info for direct reference calls (only the count matters to them)
OUT = TensorInfo((), np.dtype(np.float32))


def positions(batch: int, sequence: int, limit: int) -> Generator:
    return lambda rng: rng.integers(0, limit, (batch, sequence)).astype(I64)


def cache(*shape: int) -> Generator:
    """A cos/sin cache: values in [-1, 1]."""
    return lambda rng: rng.uniform(-1.0, 1.0, shape).astype(np.float32)


def _mask_with_dead_row(sq: int, sk: int) -> Generator:
    """A float mask dropping every other key and every key of row 3 (a zero row in Attention's output)."""

    def make(rng: np.random.Generator) -> np.ndarray:
        mask = rng.standard_normal((sq, sk)).astype(np.float32)
        mask[:, ::2] = -np.inf
        mask[3] = -np.inf
        return mask

    return make


CASES: list[Case] = [
    # RMSNormalization
    Case("RMSNormalization", [floats(2, 3, 8), floats(8)], opset=23),
    Case("RMSNormalization", [floats(2, 3, 8), floats(3, 8)], {"axis": -2}, opset=23, label="axis-2"),
    Case("RMSNormalization", [floats(2, 3, 8), floats(2, 3, 8)], {"axis": 0, "epsilon": 0.1}, opset=23, label="all"),
    Case("RMSNormalization", [floats(3, 3000), floats(3000)], opset=23, label="long-rows"),
    Case("RMSNormalization", [floats(0, 5), floats(5)], opset=23, label="empty"),
    # InstanceNormalization
    Case("InstanceNormalization", [floats(2, 3, 4, 5), floats(3), floats(3)], opset=6),
    Case("InstanceNormalization", [floats(2, 3, 7), floats(3), floats(3)], {"epsilon": 0.01}, opset=22, label="3d"),
    # GroupNormalization (onnxruntime runs opset 18 through its function body)
    Case("GroupNormalization", [floats(2, 6, 3, 3), floats(6), floats(6)], {"num_groups": 3}, opset=21),
    Case("GroupNormalization", [floats(2, 4, 5), floats(4), floats(4)], {"num_groups": 1}, opset=21, label="one"),
    Case("GroupNormalization", [floats(2, 4, 5), floats(4), floats(4)], {"num_groups": 4}, opset=21, label="each"),
    # LpNormalization
    Case("LpNormalization", [floats(3, 4, 5)], {"axis": 1, "p": 2}, opset=22, label="l2-axis1"),
    Case("LpNormalization", [floats(3, 4, 5)], {"axis": -1, "p": 1}, opset=22, label="l1-last"),
    Case("LpNormalization", [floats(6, 2)], {"axis": 0}, opset=1, label="axis0"),
    # MeanVarianceNormalization
    Case("MeanVarianceNormalization", [floats(2, 3, 4, 5)], opset=13),
    Case("MeanVarianceNormalization", [floats(2, 3, 4)], {"axes": [1]}, opset=13, label="middle"),
    Case("MeanVarianceNormalization", [floats(2, 3, 4, 5)], {"axes": [-2, -1]}, opset=9, label="spatial"),
    # LRN
    Case("LRN", [floats(2, 5, 3, 3)], {"size": 3}, opset=13),
    Case("LRN", [floats(1, 7, 4, 2)], {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, opset=13, label="wide"),
    # RotaryEmbedding
    Case("RotaryEmbedding", [floats(2, 4, 3, 8), cache(20, 4), cache(20, 4), positions(2, 3, 20)], opset=23),
    Case(
        "RotaryEmbedding",
        [floats(2, 3, 32), cache(20, 4), cache(20, 4), positions(2, 3, 20)],
        {"num_heads": 4},
        opset=23,
        label="3d",
    ),
    Case(
        "RotaryEmbedding",
        [floats(2, 4, 3, 8), cache(20, 2), cache(20, 2), positions(2, 3, 20)],
        {"interleaved": 1, "rotary_embedding_dim": 4},
        opset=23,
        label="interleaved-partial",
    ),
    Case("RotaryEmbedding", [floats(2, 4, 3, 8), cache(2, 3, 4), cache(2, 3, 4)], opset=23, label="no-positions"),
    # Dropout (inference)
    Case("Dropout", [floats(3, 4)], opset=13, outputs=2, label="mask"),
    Case(
        "Dropout",
        [floats(3, 4), const(0.3, np.float32), const(False, np.bool_)],
        opset=13,
        constants=frozenset({1, 2}),
        label="not-training",
    ),
    Case(
        "Dropout",
        [floats(3, 4), const(0.0, np.float32), const(True, np.bool_)],
        opset=13,
        outputs=2,
        constants=frozenset({1, 2}),
        label="zero-ratio",
    ),
    Case("Dropout", [floats(5)], {"ratio": 0.2}, opset=10, label="old"),
    Case("Dropout", [floats(2, 3), const(0.4, np.float32)], opset=12, outputs=2, label="computed-ratio"),
    # BatchNormalization training mode (CPU)
    Case(
        "BatchNormalization",
        [floats(2, 3, 4), floats(3), floats(3), floats(3), floats(3, low=0.5, high=2.0)],
        {"training_mode": 1, "momentum": 0.8},
        opset=15,
        outputs=3,
        label="training",
    ),
    Case(
        "BatchNormalization",
        [floats(3, 2, 2, 3), floats(2), floats(2), floats(2), floats(2, low=0.5, high=2.0)],
        {"training_mode": 1, "epsilon": 0.01},
        opset=14,
        outputs=3,
        label="training-4d",
    ),
    # Attention (CPU)
    Case("Attention", [floats(2, 3, 4, 8), floats(2, 3, 6, 8), floats(2, 3, 6, 8)], opset=23),
    Case(
        "Attention",
        [floats(2, 4, 36), floats(2, 6, 12), floats(2, 6, 20)],
        {"q_num_heads": 6, "kv_num_heads": 2, "is_causal": 1},
        opset=23,
        label="3d-gqa-causal",
    ),
    Case(
        "Attention",
        [floats(1, 2, 4, 8), floats(1, 2, 6, 8), floats(1, 2, 6, 8), bools(4, 6)],
        {"softcap": 2.0, "qk_matmul_output_mode": 3},
        opset=23,
        outputs=4,
        label="bool-softmax",
    ),
    Case(
        "Attention",
        [
            floats(2, 3, 4, 8),
            floats(2, 3, 2, 8),
            floats(2, 3, 2, 8),
            floats(1, 4, 7),
            floats(2, 3, 5, 8),
            floats(2, 3, 5, 8),
        ],
        {"scale": 0.2, "qk_matmul_output_mode": 2},
        opset=23,
        outputs=4,
        label="past-float-mask",
    ),
    Case(
        "Attention",
        [
            floats(2, 4, 32),
            floats(2, 2, 16),
            floats(2, 2, 8),
            bools(2, 1, 4, 5),
            floats(2, 2, 3, 8),
            floats(2, 2, 3, 4),
        ],
        {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1, "softcap": 1.5},
        opset=23,
        outputs=3,
        label="3d-past-present-bool-mask",
    ),
    Case(
        "Attention",
        [
            floats(2, 2, 3, 8),
            floats(2, 2, 6, 8),
            floats(2, 2, 6, 8),
            floats(3, 6),
            absent(),
            absent(),
            const([4, 6], I64),
        ],
        {"is_causal": 1},
        opset=24,
        constants=frozenset({6}),
        label="external-cache-float-mask",
    ),
    Case(
        "Attention",
        [floats(1, 2, 5, 4), floats(1, 1, 7, 4), floats(1, 1, 7, 4)],
        {"left_window_size": 1, "right_window_size": 2, "scale": 0.3},
        opset=25,
        label="window",
    ),
    Case(
        "Attention",
        [
            floats(2, 1, 2, 4),
            floats(2, 1, 2, 4),
            floats(2, 1, 2, 4),
            bools(2, 2),
            floats(2, 1, 0, 4),
            floats(2, 1, 0, 4),
        ],
        {},
        opset=23,
        outputs=3,
        label="empty-past",
    ),
    Case(
        "Attention",
        [floats(2, 2, 3, 4), floats(2, 1, 5, 4), floats(2, 1, 5, 4), floats(2, 2, 3, 5)],
        {"is_causal": 1},
        opset=23,
        outputs=4,
        label="raw-scores",
    ),
    Case(
        "Attention",
        [floats(1, 3, 8), floats(1, 4, 8), floats(1, 4, 8)],
        {"q_num_heads": 2, "kv_num_heads": 2, "softcap": 0.7, "qk_matmul_output_mode": 1},
        opset=23,
        outputs=4,
        label="capped-scores",
    ),
    Case(
        "Attention",
        [floats(1, 1, 3, 4), floats(1, 1, 5, 4), floats(1, 1, 5, 4), bools(3, 5)],
        opset=23,
        label="odd-bool-mask",
    ),
    Case(
        "Attention",
        [floats(1, 2, 19, 80), floats(1, 2, 33, 80), floats(1, 2, 33, 80), _mask_with_dead_row(19, 33)],
        opset=23,
        label="head80-dead-row",
    ),
    Case(
        "Attention",
        [floats(2, 1, 128), floats(2, 9, 64), floats(2, 9, 64)],
        {"q_num_heads": 4, "kv_num_heads": 2},
        opset=23,
        label="3d-gqa-one-query",
    ),
    # size-0 edges
    Case("InstanceNormalization", [floats(0, 3, 4), floats(3), floats(3)], opset=22, label="empty-batch"),
    Case("LpNormalization", [floats(0, 4)], {"axis": -1}, opset=22, label="empty"),
    Case("LRN", [floats(0, 3, 2, 2)], {"size": 3}, opset=13, label="empty"),
    Case(
        "TensorScatter",
        [floats(2, 4, 3), floats(2, 0, 3), const([1, 2], I64)],
        {"axis": 1},
        opset=24,
        label="empty-update",
    ),
    # newer operators
    Case("TensorScatter", [floats(2, 3, 6, 4), floats(2, 3, 2, 4), const([1, 4], I64)], opset=24, label="linear"),
    Case(
        "TensorScatter",
        [floats(3, 5, 4), floats(3, 3, 4), const([4, 0, 2], I64)],
        {"mode": "circular"},
        opset=24,
        label="circular",
    ),
    Case("TensorScatter", [floats(2, 5, 3), floats(2, 2, 3)], {"axis": 1}, opset=24, label="no-indices"),
    Case(
        "CausalConvWithState",
        [floats(2, 4, 8), floats(4, 1, 3), floats(4), floats(2, 4, 2)],
        {"activation": "silu"},
        opset=27,
        outputs=2,
    ),
    Case("CausalConvWithState", [floats(1, 3, 2), floats(3, 1, 5)], opset=27, outputs=2, label="short"),
    Case("CausalConvWithState", [floats(2, 3, 4), floats(3, 1, 1)], opset=27, outputs=2, label="one-tap"),
    Case(
        "LinearAttention",
        [
            floats(2, 3, 16),
            floats(2, 3, 8),
            floats(2, 3, 12),
            absent(),
            floats(2, 3, 8, scale=0.1),
            floats(2, 3, 2, low=0.0, high=1.0),
        ],
        {"q_num_heads": 4, "kv_num_heads": 2},
        opset=27,
        outputs=2,
        label="gated-delta-gqa",
    ),
    Case(
        "LinearAttention",
        [floats(1, 4, 8), floats(1, 4, 8), floats(1, 4, 4), floats(1, 2, 4, 2), floats(1, 4, 2, scale=0.1)],
        {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "gated", "scale": 0.5},
        opset=27,
        outputs=2,
        label="gated-per-head-past",
    ),
    Case(
        "LinearAttention",
        [floats(2, 2, 6), floats(2, 2, 3), floats(2, 2, 3), absent(), absent(), floats(2, 2, 1, low=0.0, high=1.0)],
        {"q_num_heads": 2, "kv_num_heads": 1, "update_rule": "delta"},
        opset=27,
        outputs=2,
        label="delta-mqa",
    ),
]

#: float16 kernels (f16 arrays, float32 arithmetic) vs the reference, on the devices only: float16 RMSNormalization
#: rounds the normalised value to float16 before the scale, as the ONNX function does, where onnxruntime rounds once
FLOAT16_CASES = [
    Case("RMSNormalization", [halves(2, 8), halves(8)], opset=23, label="float16"),
    Case("RMSNormalization", [halves(2, 8), floats(8)], opset=23, label="float16-float-scale"),
    Case("InstanceNormalization", [halves(2, 3, 5), halves(3), halves(3)], opset=22, label="float16"),
    Case("GroupNormalization", [halves(2, 4, 3), halves(4), halves(4)], {"num_groups": 2}, opset=21, label="float16"),
    Case("LpNormalization", [halves(3, 5)], {"axis": 0}, opset=22, label="float16"),
    Case("MeanVarianceNormalization", [halves(2, 3, 4, 5)], opset=13, label="float16"),
    Case(
        "RotaryEmbedding",
        [halves(2, 3, 16), halves(10, 2), halves(10, 2), positions(2, 3, 10)],
        {"num_heads": 2, "rotary_embedding_dim": 4},
        opset=23,
        label="float16",
    ),
    Case(
        "Attention",
        [halves(1, 2, 3, 4), halves(1, 2, 3, 4), halves(1, 2, 3, 4)],
        opset=23,
        label="float16",
    ),
]

#: what onnxruntime refuses but the definition allows: an attn_mask shorter than the keys (the rest is padding), no
#: queries (an empty Y)
SPEC_ONLY_CASES = [
    Case("Attention", [floats(1, 2, 0, 4), floats(1, 2, 3, 4), floats(1, 2, 3, 4)], opset=23, label="no-queries"),
    Case(
        "Attention",
        [
            floats(2, 2, 3, 8),
            floats(2, 2, 6, 8),
            floats(2, 2, 6, 8),
            bools(2, 1, 3, 4),
            absent(),
            absent(),
            const([3, 4], I64),
        ],
        {"is_causal": 1},
        opset=24,
        constants=frozenset({6}),
        label="short-mask",
    ),
]

SWIGLU_CASES = [
    Case("SwiGLU", [floats(3, 40, scale=4.0), floats(3, 40)], opset=28, in_onnxruntime=False),
    Case("SwiGLU", [halves(7), halves(7)], {"alpha": 0.5}, opset=28, in_onnxruntime=False, label="float16"),
]


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def op_device(backend_name: str) -> Iterator[BackendDevice]:
    device = open_device(backend_name)
    try:
        yield device
        gc.collect()
        assert device.live_handles() == 0, "operator tests leaked device objects"
    finally:
        device.destroy()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_matches_onnxruntime(case: Case) -> None:
    check_reference(case)


DEVICE_CASES = CASES + FLOAT16_CASES + SPEC_ONLY_CASES + SWIGLU_CASES


@pytest.mark.parametrize("case", DEVICE_CASES, ids=[c.id for c in DEVICE_CASES])
def test_plan_matches_reference(case: Case, op_device: BackendDevice) -> None:
    check_plan(case, op_device)


@pytest.mark.parametrize("case", SWIGLU_CASES, ids=[c.id for c in SWIGLU_CASES])
def test_swiglu_matches_its_formula(case: Case) -> None:
    rng = np.random.default_rng()
    a, b = (generate(rng) for generate in case.inputs)
    assert a is not None and b is not None
    alpha = float(case.attrs.get("alpha", 1.0))
    (got,) = get_operator("SwiGLU", 28).reference([a, b], dict(case.attrs), [])
    wide = a.astype(np.float64)
    want = (wide / (1.0 + np.exp(-alpha * wide)) * b).astype(a.dtype)
    assert got.dtype == a.dtype
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=2e-3 if a.dtype == np.float16 else 1e-6
    )


def test_attention_fully_masked_rows_are_zero() -> None:
    """A query row whose keys are all masked gives zeros (not NaN), in Y and in the mode-3 probabilities."""
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 1, 3, 4)).astype(np.float32) for _ in range(3))
    mask = np.array([[True, False, True], [False, False, False], [True, True, True]])
    infos = [TensorInfo((1, 1, 3, 4), np.dtype(np.float32))] * 2
    y, probs = get_operator("Attention", 23).reference([q, k, v, mask], {"qk_matmul_output_mode": 3}, infos[:1] * 4)[
        ::3
    ]
    assert np.all(y[0, 0, 1] == 0) and np.all(probs[0, 0, 1] == 0)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(probs[0, 0, [0, 2]].sum(axis=-1), 1.0, rtol=1e-6)


def test_attention_external_cache_and_windows() -> None:
    """nonpad_kv_seqlen (opset 24) drops padded keys and offsets the causal frontier; windows (opset 25) bound it."""
    rng = np.random.default_rng()
    q = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    k = rng.standard_normal((2, 1, 5, 4)).astype(np.float32)
    v = rng.standard_normal((2, 1, 5, 4)).astype(np.float32)
    lengths = np.array([3, 5], I64)
    attention = get_operator("Attention", 25)
    (y,) = attention.reference([q, k, v, None, None, None, lengths], {"is_causal": 1, "left_window_size": 1}, [OUT])
    for b, n in enumerate(lengths):
        for i in range(2):
            p = n - 2 + i  # the query's absolute position
            keys = [j for j in range(5) if p - 1 <= j <= p]
            scores = q[b, 0, i].astype(np.float64) @ k[b, 0, keys].T.astype(np.float64) / 2.0
            weights = np.exp(scores - scores.max())
            want = weights / weights.sum() @ v[b, 0, keys].astype(np.float64)
            np.testing.assert_allclose(y[b, 0, i], want, rtol=1e-5, atol=1e-6)


def test_refusals_name_the_op() -> None:
    x = np.ones((3, 4), np.float32)
    with pytest.raises(UnsupportedOpError, match="Dropout: random dropout"):
        get_operator("Dropout", 13).reference([x, np.array(0.5, np.float32), np.array(True)], {}, [OUT])
    with pytest.raises(UnsupportedOpError, match="Dropout: random dropout"):
        get_operator("Dropout", 6).reference([x], {}, [OUT])  # is_test=0 is training before opset 7
    with pytest.raises(UnsupportedOpError, match="LpNormalization: p"):
        get_operator("LpNormalization", 22).reference([x], {"p": 3}, [OUT])
    with pytest.raises(UnsupportedOpError, match="softmax_precision"):
        get_operator("Attention", 23).reference(
            [x[None, None], x[None, None], x[None, None]], {"softmax_precision": 16}, [OUT]
        )
    with pytest.raises(InvalidArgumentError, match="TensorScatter"):
        get_operator("TensorScatter", 24).reference(
            [np.zeros((1, 4, 2), np.float32), np.zeros((1, 2, 2), np.float32), np.array([3], I64)], {"axis": 1}, [OUT]
        )
    with pytest.raises(InvalidArgumentError, match="RotaryEmbedding"):
        get_operator("RotaryEmbedding", 23).reference(
            [
                np.zeros((1, 1, 2, 4), np.float32),
                np.zeros((4, 2), np.float32),
                np.zeros((4, 2), np.float32),
                np.array([[0, 9]], I64),
            ],
            {},
            [OUT],
        )


def test_lp_normalization_zero_norm_is_zero(op_device: BackendDevice) -> None:
    """A zero vector normalises to zero (opset 22's definition), on the device too."""
    from ortgpu.ops._runner import run_plan

    x = np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 0.0]], np.float32)
    operator = get_operator("LpNormalization", 22)
    for p in (1, 2):
        (want,) = operator.reference([x], {"p": p}, [OUT])
        assert np.all(want[0] == 0)
        info = TensorInfo(x.shape, x.dtype)
        plan = operator.plan([info], [info], {"p": p}, caps_of(op_device), {})
        (got,) = run_plan(op_device, plan, [x], [info])
        np.testing.assert_allclose(got, want, rtol=1e-6)
