"""Type, logic and integer operators: CastLike, Mod, Size, BitShift, Bitwise*, BitCast, And/Or/Xor,
Floor/Ceil/Round/Sign, IsNaN/IsInf.

Each :class:`Case` is one single-node model: its reference is compared with onnxruntime's CPU provider on
fresh random inputs, and its device plan (the fake backend's numpy twins, and lavapipe's WGSL) with the
reference (helpers of ``test_ops_elementwise.py``).
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import numpy as np
import onnx
import pytest
from test_ops_elementwise import (
    Case,
    bools,
    caps_of,
    check_plan,
    check_reference,
    const,
    floats,
    halves,
    ints,
    nonzero,
    open_device,
    wide_ints,
)

from ortgpu.ops import TensorInfo, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu_core._errors import InvalidArgumentError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

Generator = Any
ONE = frozenset({1})


def like(dtype: Any, *shape: int) -> Generator:
    """CastLike's second input: only its dtype matters."""
    return lambda rng: np.zeros(shape or (1,), dtype=dtype)


def specials(dtype: Any, *shape: int) -> Generator:
    """Floats with NaN, infinities, signed zeros, subnormals, halves and values of far-apart exponents."""

    def make(rng: np.random.Generator) -> np.ndarray:
        info = np.finfo(dtype)
        pool = np.array(
            [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, info.tiny / 4, -info.tiny, info.max],
            dtype=dtype,
        )
        with np.errstate(over="ignore"):
            values = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(dtype)
        pick = rng.random(shape) < 0.4
        return np.where(pick, rng.choice(pool, shape), values).astype(dtype)

    return make


def spread(dtype: Any, *shape: int, low: int = -60, high: int = 60) -> Generator:
    """Non-zero floats of both signs over a wide range of exponents (long remainder reductions)."""

    def make(rng: np.random.Generator) -> np.ndarray:
        magnitude = rng.uniform(1, 2, shape) * np.exp2(rng.integers(low, high, shape).astype(np.float64))
        return (magnitude * rng.choice([-1.0, 1.0], shape)).astype(dtype)

    return make


def unsigned(dtype: Any, *shape: int) -> Generator:
    info = np.iinfo(dtype)
    return lambda rng: rng.integers(0, info.max, shape, dtype=dtype, endpoint=True)


def amounts(dtype: Any, *shape: int, signed: bool = False) -> Generator:
    """Shift amounts, some at or beyond the width (and negative ones for signed types)."""
    width = 8 * np.dtype(dtype).itemsize

    def make(rng: np.random.Generator) -> np.ndarray:
        return rng.integers(-width if signed else 0, width + 8, shape).astype(dtype)

    return make


def halves_exact(*shape: int) -> Generator:
    """Multiples of 0.5 (Round's ties) with some other values."""
    return lambda rng: (rng.integers(-40, 40, shape) / 2 + (rng.random(shape) < 0.3) * 0.25).astype(np.float32)


INT_TYPES = [
    (np.int8, -128, 128),
    (np.uint8, 0, 256),
    (np.int16, -(2**15), 2**15),
    (np.uint16, 0, 2**16),
    (np.int32, -(2**31), 2**31),
    (np.uint32, 0, 2**32),
]

CASES: list[Case] = [
    # CastLike
    Case("CastLike", [floats(3, 5, scale=100), like(np.int32)], opset=15, label="float32-int32"),
    Case("CastLike", [floats(3, 5), like(np.float16, 2)], opset=19, label="float32-float16"),
    Case("CastLike", [wide_ints(4, 6), like(np.float32)], opset=15, label="int64-float32"),
    Case("CastLike", [ints(4, 6), like(np.int64)], opset=15, label="int32-int64"),
    Case("CastLike", [floats(4, 6, scale=50), like(np.uint8)], opset=15, label="float32-uint8"),
    Case("CastLike", [ints(7, low=-2, high=3), like(np.bool_)], opset=15, label="int32-bool"),
    Case("CastLike", [floats(2, 3), like(np.float32)], opset=15, label="same-dtype"),
    Case("CastLike", [floats(0, 3), like(np.int32)], opset=15, label="empty"),
    Case(
        "CastLike",
        [lambda rng: rng.standard_normal((3, 4)) * 10, like(np.int32)],
        opset=15,
        on_device=False,
        label="float64-int32",
    ),
    # Mod: integers on the device only with a constant divisor without zeros
    *[
        Case(
            "Mod",
            [ints(5, 7, low=low, high=high, dtype=dtype), nonzero(ints(7, low=low, high=high, dtype=dtype))],
            {"fmod": fmod},
            opset=13,
            constants=ONE,
            label=f"{np.dtype(dtype).name}-fmod{fmod}",
        )
        for dtype, low, high in INT_TYPES
        for fmod in (0, 1)
    ],
    *[
        Case(
            "Mod",
            [wide_ints(5, 7, dtype=dtype), nonzero(wide_ints(5, 1, dtype=dtype))],
            {"fmod": fmod},
            opset=13,
            constants=ONE,
            label=f"{np.dtype(dtype).name}-fmod{fmod}",
        )
        for dtype in (np.int64, np.uint64)
        for fmod in (0, 1)
    ],
    Case(
        "Mod",
        [ints(4, 6, low=-50, high=50, dtype=np.int64), nonzero(ints(6, low=-7, high=7, dtype=np.int64))],
        opset=13,
        constants=ONE,
        label="int64-small",
    ),
    Case(
        "Mod",
        [const([-(2**31), -(2**31), 7, -7], np.int32), const([-1, 1, -1, -3], np.int32)],
        {"fmod": 1},
        opset=13,
        constants=ONE,
        label="int32-min-by-minus-one",
    ),
    Case(
        "Mod",
        [const([-(2**63), -(2**63), 7, -7], np.int64), const([-1, 3, -1, 2], np.int64)],
        opset=13,
        constants=ONE,
        label="int64-min-by-minus-one",
    ),
    Case(
        "Mod",
        [ints(3, 4), nonzero(ints(4))],
        opset=13,
        on_device=False,
        label="int32-runtime-divisor",
    ),
    Case("Mod", [floats(4, 9, scale=10), floats(9, low=0.5, high=3)], {"fmod": 1}, opset=13, label="float32"),
    Case("Mod", [spread(np.float32, 6, 40), spread(np.float32, 6, 40)], {"fmod": 1}, opset=13, label="float32-spread"),
    Case(
        "Mod",
        [spread(np.float32, 300, low=-126, high=127), spread(np.float32, 300, low=-149, high=-100)],
        {"fmod": 1},
        opset=13,
        label="float32-tiny-divisors",
    ),
    Case(
        "Mod", [specials(np.float32, 5, 14), specials(np.float32, 14)], {"fmod": 1}, opset=13, label="float32-special"
    ),
    Case("Mod", [halves(4, 9), nonzero(halves(9))], {"fmod": 1}, opset=13, label="float16"),
    Case(
        "Mod",
        [spread(np.float16, 4, 30, low=-24, high=15), spread(np.float16, 30, low=-24, high=15)],
        {"fmod": 1},
        opset=13,
        label="float16-spread",
    ),
    Case(
        "Mod",
        [lambda rng: rng.standard_normal((3, 5)) * 9, lambda rng: rng.uniform(1, 3, (5,))],
        {"fmod": 1},
        opset=13,
        on_device=False,
        label="float64",
    ),
    Case("Mod", [ints(0, 3), const([2, 3, 4], np.int32)], opset=13, constants=ONE, label="empty"),
    # Size
    Case("Size", [floats(3, 4)], opset=13),
    Case("Size", [floats(0, 5)], opset=13, label="empty"),
    Case("Size", [lambda rng: np.array(2.0, np.float32)], opset=13, label="scalar"),
    Case("Size", [bools(2, 3, 4)], opset=21, label="bool"),
    # BitShift
    *[
        Case(
            "BitShift",
            [unsigned(dtype, 4, 9), amounts(dtype, 9)],
            {"direction": direction},
            opset=13,
            label=f"{np.dtype(dtype).name}-{direction}",
        )
        for dtype in (np.uint8, np.uint16, np.uint32, np.uint64)
        for direction in ("LEFT", "RIGHT")
    ],
    Case(
        "BitShift",
        [unsigned(np.uint32, 3, 1, 5), amounts(np.uint32, 4, 1)],
        {"direction": "LEFT"},
        opset=13,
        label="broadcast",
    ),
    # Bitwise
    *[
        Case(
            op,
            [ints(4, 7, low=low, high=high, dtype=dtype), ints(7, low=low, high=high, dtype=dtype)],
            opset=18,
            label=np.dtype(dtype).name,
        )
        for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")
        for dtype, low, high in INT_TYPES
    ],
    *[
        Case(op, [wide_ints(3, 6, dtype=dtype), wide_ints(3, 1, dtype=dtype)], opset=18, label=np.dtype(dtype).name)
        for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")
        for dtype in (np.int64, np.uint64)
    ],
    *[
        Case("BitwiseNot", [ints(4, 7, low=low, high=high, dtype=dtype)], opset=18, label=np.dtype(dtype).name)
        for dtype, low, high in INT_TYPES
    ],
    Case("BitwiseNot", [wide_ints(4, 7)], opset=18, label="int64"),
    Case("BitwiseNot", [wide_ints(4, 7, dtype=np.uint64)], opset=18, label="uint64"),
    # And / Or / Xor
    *[Case(op, [bools(3, 4, 5), bools(4, 1)], opset=7, label="broadcast") for op in ("And", "Or", "Xor")],
    Case("And", [bools(0, 3), bools(3)], opset=7, label="empty"),
    Case("Or", [bools(1), bools(5, 2, 3)], opset=7, label="scalar-left"),
    # Floor / Ceil / Round / Sign
    *[Case(op, [specials(np.float32, 6, 11)], opset=13, label="special") for op in ("Floor", "Ceil")],
    *[Case(op, [halves(5, 9)], opset=13, label="float16") for op in ("Floor", "Ceil", "Round")],
    Case("Floor", [floats(3, 5, scale=20)], opset=6, label="opset6"),
    Case("Round", [halves_exact(6, 11)], opset=11, label="ties"),
    Case("Round", [specials(np.float32, 6, 11)], opset=11, label="special"),
    *[
        Case(op, [lambda rng: rng.standard_normal((4,)) * 9], opset=13, on_device=False, label="float64")
        for op in ("Floor", "Ceil", "Round")
    ],
    Case("Sign", [specials(np.float32, 5, 8)], opset=13, label="float32"),
    Case("Sign", [halves(5, 8)], opset=13, label="float16"),
    *[
        Case("Sign", [ints(5, 8, low=low, high=high, dtype=dtype)], opset=13, label=np.dtype(dtype).name)
        for dtype, low, high in INT_TYPES
    ],
    Case("Sign", [wide_ints(5, 8)], opset=13, label="int64"),
    Case("Sign", [wide_ints(5, 8, dtype=np.uint64)], opset=13, label="uint64"),
    # IsNaN / IsInf
    Case("IsNaN", [specials(np.float32, 5, 9)], opset=13, label="float32"),
    Case("IsNaN", [specials(np.float16, 5, 9)], opset=13, label="float16"),
    Case("IsNaN", [specials(np.float64, 5, 9)], opset=13, label="float64"),
    Case("IsInf", [specials(np.float32, 5, 9)], opset=10, label="float32"),
    Case("IsInf", [specials(np.float16, 5, 9)], opset=20, label="float16"),
    Case("IsInf", [specials(np.float64, 5, 9)], opset=10, label="float64"),
    Case("IsInf", [specials(np.float32, 5, 9)], {"detect_negative": 0}, opset=10, label="positive"),
    Case("IsInf", [specials(np.float64, 5, 9)], {"detect_positive": 0}, opset=10, label="negative"),
    Case(
        "IsInf", [specials(np.float32, 5, 9)], {"detect_positive": 0, "detect_negative": 0}, opset=10, label="neither"
    ),
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


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_matches_reference(case: Case, op_device: BackendDevice) -> None:
    check_plan(case, op_device)


# Variants onnxruntime 1.32 has no kernel for in these single-node models: an independent numpy oracle.
NEW_OPSET_CASES: list[tuple[Case, Any]] = [
    (
        Case(
            "Mod", [specials(np.float32, 5, 14), specials(np.float32, 14)], {"fmod": 0}, opset=28, label="float32-fmod0"
        ),
        lambda a, b: np.mod(a, b),
    ),
    (
        Case(
            "Mod",
            [spread(np.float32, 6, 40), spread(np.float32, 6, 40)],
            {"fmod": 0},
            opset=28,
            label="float32-fmod0-spread",
        ),
        lambda a, b: np.mod(a, b),
    ),
    (
        Case("Mod", [halves(4, 9), nonzero(halves(9))], {"fmod": 0}, opset=28, label="float16-fmod0"),
        lambda a, b: np.mod(a, b),
    ),
    *[
        (
            Case(
                "BitShift",
                [ints(4, 9, low=low, high=high, dtype=dtype), amounts(dtype, 9, signed=True)],
                {"direction": direction},
                opset=28,
                label=f"{np.dtype(dtype).name}-{direction}",
            ),
            None,
        )
        for dtype, low, high in ((np.int8, -128, 128), (np.int16, -(2**15), 2**15), (np.int32, -(2**31), 2**31))
        for direction in ("LEFT", "RIGHT")
    ],
    *[
        (
            Case(
                "BitShift",
                [wide_ints(4, 9), amounts(np.int64, 9, signed=True)],
                {"direction": direction},
                opset=28,
                label=f"int64-{direction}",
            ),
            None,
        )
        for direction in ("LEFT", "RIGHT")
    ],
    *[
        (
            Case(
                "BitCast",
                [generate, lambda rng: None],
                {"to": onnx.helper.np_dtype_to_tensor_dtype(np.dtype(to))},
                opset=26,
                label=f"{np.dtype(source).name}-{np.dtype(to).name}",
            ),
            lambda x, _, to=to: np.ascontiguousarray(x).view(to) if to != np.bool_ else x.view(np.uint8) != 0,
        )
        for source, to, generate in (
            (np.float32, np.int32, specials(np.float32, 3, 5)),
            (np.int32, np.float32, ints(3, 5, low=0, high=2**30)),
            (np.int64, np.float64, wide_ints(3, 5)),
            (np.float64, np.uint64, specials(np.float64, 3, 5)),
            (np.uint8, np.int8, unsigned(np.uint8, 3, 5)),
            (np.float16, np.uint16, specials(np.float16, 3, 5)),
            (np.uint8, np.bool_, lambda rng: rng.integers(0, 3, (3, 5)).astype(np.uint8)),
            (np.bool_, np.uint8, bools(3, 5)),
        )
    ],
]


def _signed_shift(x: np.ndarray, amount: np.ndarray, left: bool) -> np.ndarray:
    """The opset-28 rule, element by element in Python integers."""
    width = 8 * x.dtype.itemsize
    out = []
    for value, shift in zip(*(a.ravel().tolist() for a in np.broadcast_arrays(x, amount))):
        if not 0 <= shift < width:
            out.append(-1 if (not left and value < 0) else 0)
        elif left:
            wrapped = (value << shift) & ((1 << width) - 1)
            out.append(wrapped - (1 << width) if wrapped >= 1 << (width - 1) else wrapped)
        else:
            out.append(value >> shift)
    return np.array(out, dtype=x.dtype).reshape(np.broadcast_shapes(x.shape, amount.shape))


@pytest.mark.parametrize("case,oracle", NEW_OPSET_CASES, ids=[c.id for c, _ in NEW_OPSET_CASES])
def test_new_opsets_match_numpy(case: Case, oracle: Any, op_device: BackendDevice) -> None:
    rng = np.random.default_rng()
    arrays = [generate(rng) for generate in case.inputs]
    if case.op_type == "BitCast":
        arrays = arrays[:1]
    operator = get_operator(case.op_type, case.opset)
    (got,) = operator.reference(arrays, case.attrs, [])
    if oracle is None:
        want = _signed_shift(arrays[0], arrays[1], case.attrs["direction"] == "LEFT")
    else:
        with np.errstate(all="ignore"):
            want = np.asarray(oracle(*arrays, None) if case.op_type == "BitCast" else oracle(*arrays))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit for bit (NaN payloads, -0)
    if case.op_type != "BitCast":
        check_plan(case, op_device)
        return
    # BitCast: the device result must be the reference's bytes exactly (float comparisons would read them).
    infos = [TensorInfo(arrays[0].shape, arrays[0].dtype)]
    out = [TensorInfo(got.shape, got.dtype)]
    plan = operator.plan(infos, out, case.attrs, caps_of(op_device), {})
    (result,) = run_plan(op_device, plan, arrays, out)
    assert result.dtype == got.dtype
    np.testing.assert_array_equal(result.view(np.uint8), got.view(np.uint8))


def test_mod_integer_division_by_zero_fails_the_run() -> None:
    operator = get_operator("Mod", 13)
    a = np.array([5, 6], np.int32)
    with pytest.raises(InvalidArgumentError, match="modulo by zero"):
        operator.reference([a, np.array([2, 0], np.int32)], {"fmod": 1}, [])
    with pytest.raises(InvalidArgumentError, match="modulo by zero"):
        operator.reference([a.astype(np.uint64), np.zeros(1, np.uint64)], {}, [])
    # float division by zero is NaN, as in C's fmod
    (result,) = operator.reference([a.astype(np.float32), np.zeros(2, np.float32)], {"fmod": 1}, [])
    assert np.isnan(result).all()


def test_mod_refuses_float_fmod0_before_opset_28_and_bad_attributes() -> None:
    a = np.ones(2, np.float32)
    with pytest.raises(UnsupportedOpError, match="fmod=1"):
        get_operator("Mod", 13).reference([a, a], {}, [])
    with pytest.raises(UnsupportedOpError, match="fmod"):
        get_operator("Mod", 13).reference([a.astype(np.int32), a.astype(np.int32)], {"fmod": 2}, [])
    with pytest.raises(UnsupportedOpError, match="Mod"):
        get_operator("Mod", 13).reference([a, a.astype(np.float16)], {"fmod": 1}, [])


def test_refusals_name_the_op() -> None:
    with pytest.raises(UnsupportedOpError, match="BitShift"):
        get_operator("BitShift", 13).reference([np.ones(2, np.int32)] * 2, {"direction": "LEFT"}, [])
    with pytest.raises(UnsupportedOpError, match="BitShift"):
        get_operator("BitShift", 13).reference([np.ones(2, np.uint8)] * 2, {"direction": "UP"}, [])
    with pytest.raises(UnsupportedOpError, match="BitCast"):
        get_operator("BitCast", 26).reference([np.ones(2, np.int32)], {"to": onnx.TensorProto.INT64}, [])
    with pytest.raises(UnsupportedOpError, match="BitCast"):
        get_operator("BitCast", 26).reference([np.ones(2, np.int32)], {"to": onnx.TensorProto.BFLOAT16}, [])
    with pytest.raises(UnsupportedOpError, match="And"):
        get_operator("And", 7).reference([np.ones(2, np.int32)] * 2, {}, [])
    (both,) = get_operator("Xor", 1).reference([np.array([True, False, True]), np.array([True, True, False])], {}, [])
    np.testing.assert_array_equal(both, [False, True, True])  # opset 1 without broadcasting
    with pytest.raises(UnsupportedOpError, match="Xor"):
        get_operator("Xor", 1).reference([np.ones(2, np.bool_)] * 2, {"broadcast": 1}, [])
    with pytest.raises(UnsupportedOpError, match="Floor"):
        get_operator("Floor", 13).reference([np.ones(2, np.int32)], {}, [])
    with pytest.raises(UnsupportedOpError, match="IsNaN"):
        get_operator("IsNaN", 13).reference([np.ones(2, np.int32)], {}, [])
    with pytest.raises(UnsupportedOpError, match="BitwiseNot"):
        get_operator("BitwiseNot", 18).reference([np.ones(2, np.float32)], {}, [])
    with pytest.raises(UnsupportedOpError, match="CastLike"):
        get_operator("CastLike", 15).reference([np.ones(2, np.float32), np.array(["a"])], {}, [])


def test_size_writes_its_count_without_reading_the_input(op_device: BackendDevice) -> None:
    operator = get_operator("Size", 13)
    info = TensorInfo((70000, 3), np.dtype(np.float32))
    out = [TensorInfo((), np.dtype(np.int64))]
    plan = operator.plan([info], out, {}, caps_of(op_device), {})
    assert all(b.kind != "input" for kernel in plan.kernels for b in kernel.bindings)
    (result,) = run_plan(op_device, plan, [np.zeros((70000, 3), np.float32)], out)
    assert result.dtype == np.int64 and result.shape == () and int(result) == 210000
