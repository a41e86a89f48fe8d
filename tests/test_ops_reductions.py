"""Losses, reductions, arg-reductions and scans: reference vs onnxruntime CPU, and the device plans vs the reference.

Same method as ``test_ops_elementwise.py`` (whose helpers this module uses): single-node models on fresh random
inputs, onnxruntime's CPU provider as the judge of the references, the fake and wgpu devices checked against the
references (cases marked ``on_device=False`` check that ``plan`` says why the node stays on the CPU).  Integer
inputs are drawn from small ranges so that ties (ArgMax, TopK, Hardmax) are common.
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import numpy as np
import pytest
from test_ops_elementwise import (
    NUMPY_ORACLES,
    Case,
    Generator,
    caps_of,
    check_plan,
    check_reference,
    const,
    floats,
    halves,
    ints,
    open_device,
    wide_ints,
)

from ortgpu.ops import DeviceCaps, NotOnDevice, TensorInfo, get_operator
from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

I64 = np.int64
F32 = np.float32


def labels(*shape: int, classes: int, ignore: int | None = None, dtype: Any = I64) -> Generator:
    """Class labels in ``[0, classes)``, about a quarter of them ``ignore`` when given."""

    def make(rng: np.random.Generator) -> np.ndarray:
        values = rng.integers(0, classes, shape).astype(dtype)
        if ignore is not None:
            values[rng.random(shape) < 0.25] = ignore
        return values

    return make


def small_floats(*shape: int) -> Generator:
    """Floats from a few values (ties)."""
    return lambda rng: rng.integers(-2, 3, shape).astype(F32)


def _loss_cases() -> list[Case]:
    cases: list[Case] = []
    for op in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):

        def scores(*shape: int, op: str = op) -> Generator:
            # NegativeLogLikelihoodLoss takes log-probabilities (<= 0): with inputs of either sign its mean can
            # cancel to ~0, where float32 summation fails a relative tolerance (seen once in CI with these random
            # inputs); SoftmaxCrossEntropyLoss takes scores of any sign, and its loss is positive anyway
            return floats(*shape, low=-4.0, high=-0.05) if op == "NegativeLogLikelihoodLoss" else floats(*shape)

        for reduction in ("none", "sum", "mean"):
            for weighted in (False, True):
                for ignore in (None, 1, -5):
                    inputs = [scores(3, 4, 2, 5), labels(3, 2, 5, classes=4, ignore=ignore)]
                    if weighted:
                        inputs.append(floats(4, low=0.1, high=2.0))
                    attrs: dict[str, Any] = {"reduction": reduction}
                    if ignore is not None:
                        attrs["ignore_index"] = ignore
                    label = f"{reduction}-{'weight' if weighted else 'plain'}-ii{ignore}"
                    cases.append(Case(op, inputs, attrs, opset=13, label=label))
        cases.append(Case(op, [scores(6, 3), labels(6, classes=3, dtype=np.int32)], opset=13, label="2d-int32"))
        cases.append(
            Case(
                op,
                [scores(700, 3), labels(700, classes=3, ignore=0)],
                {"ignore_index": 0},
                opset=13,
                label="many-samples",
            )
        )
        cases.append(
            Case(
                op,
                [lambda rng: rng.standard_normal((4, 3)), labels(4, classes=3)],
                opset=13,
                on_device=False,
                label="float64",
            )
        )
    cases += [
        Case(
            "SoftmaxCrossEntropyLoss",
            [floats(2, 5, 3), labels(2, 3, classes=5, ignore=-1)],
            {"ignore_index": -1},
            opset=13,
            outputs=2,
            label="log-prob",
        ),
        Case(
            "SoftmaxCrossEntropyLoss",
            # Scores far apart, no label the largest: a sum of losses all near 0 (random labels could give one)
            # is where onnxruntime's float32 loses its digits, and the "confident" case below covers that.
            [
                const([[30.0, -25.0, 4.0], [-40.0, 12.0, 35.0], [8.0, 60.0, -5.0], [-3.0, -2.5, -70.0]], F32),
                const([1, 0, 2, 0], I64),
            ],
            {"reduction": "sum"},
            opset=12,
            label="large-scores",
        ),
        Case(
            # Every sample sure of its label: each loss is about 1e-5, log(1 + tiny) where a plain log(total) of
            # a float32 sum near 1 is off by a few percent of it.
            "SoftmaxCrossEntropyLoss",
            [
                const([[14.0, 2.0, 1.0], [0.0, 13.0, 1.5], [2.0, 1.0, 15.0], [12.5, 0.5, -3.0]], F32),
                const([0, 1, 2, 0], I64),
            ],
            {"reduction": "none"},
            opset=13,
            label="confident",
            in_onnxruntime=False,  # onnxruntime's float32 log(total) is itself off by ~1%: NUMPY_ORACLES judges
        ),
        Case(
            "NegativeLogLikelihoodLoss",
            [floats(0, 3), labels(0, classes=3)],
            opset=13,
            on_device=False,
            label="no-samples",
        ),
        Case(
            "SoftmaxCrossEntropyLoss",
            [floats(2, 3, 0), labels(2, 0, classes=3)],
            {"reduction": "none"},
            opset=13,
            on_device=False,
            label="empty-d1",
        ),
        Case(
            "NegativeLogLikelihoodLoss",
            [floats(3, 4), const([2, 2, 2], I64)],
            {"ignore_index": 2, "reduction": "sum"},
            opset=12,
            label="all-ignored-sum",
        ),
    ]
    return cases


def _arg_cases() -> list[Case]:
    cases: list[Case] = []
    for op in ("ArgMax", "ArgMin"):
        cases += [
            Case(op, [small_floats(4, 7, 5)], {"axis": 1}, opset=13, label="ties"),
            Case(op, [small_floats(4, 7, 5)], {"axis": -1, "select_last_index": 1}, opset=13, label="last"),
            Case(op, [floats(3, 300)], {"axis": 1, "keepdims": 0}, opset=13, label="long"),
            Case(op, [floats(5, 4)], opset=11, label="default-axis"),
            Case(op, [ints(6, 9, low=-3, high=3)], {"axis": 0, "keepdims": 0}, opset=13, label="int32"),
            Case(op, [ints(6, 9, low=-3, high=3, dtype=np.int8)], {"axis": 1}, opset=13, label="int8"),
            Case(op, [ints(6, 9, low=0, high=3, dtype=np.uint8)], {"axis": 1, "select_last_index": 1}, label="uint8"),
            Case(op, [wide_ints(5, 6)], {"axis": 1, "select_last_index": 1}, opset=13, label="int64"),
            Case(op, [halves(4, 6)], {"axis": -2}, opset=13, label="float16"),
            Case(op, [floats(0, 4)], {"axis": 1}, opset=13, label="no-rows"),
            Case(op, [lambda rng: rng.standard_normal((3, 4))], {"axis": 1}, opset=13, on_device=False, label="f64"),
        ]
    return cases


_REDUCE_OPS = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd", "ReduceSumSquare")


def _positive(*shape: int) -> Generator:
    return floats(*shape, low=0.5, high=1.5)


def _reduce_cases() -> list[Case]:
    cases: list[Case] = []
    for op in _REDUCE_OPS:
        data = _positive if op in ("ReduceLogSum", "ReduceProd") else floats
        cases += [
            Case(op, [data(3, 4, 5)], {"axes": [1]}, opset=13, label="attr"),
            Case(op, [data(3, 4, 5)], {"axes": [0, -1], "keepdims": 0}, opset=13, label="attr-negative"),
            Case(op, [data(3, 4, 5)], opset=13, label="all"),
            Case(op, [data(3, 4, 5), const([1, 2], I64)], opset=18, constants=frozenset({1}), label="input"),
            Case(op, [data(2, 600)], {"keepdims": 0}, opset=18, label="long-row"),
            Case(op, [data(3, 4), const([], I64)], opset=18, constants=frozenset({1}), label="empty-axes"),
            Case(
                op,
                [data(3, 4), const([], I64)],
                {"noop_with_empty_axes": 1},
                opset=18,
                constants=frozenset({1}),
                label="noop",
            ),
            Case(op, [floats(2, 0, 3), const([1], I64)], opset=18, constants=frozenset({1}), label="empty-reduced"),
            Case(op, [floats(0, 3), const([1], I64)], opset=18, constants=frozenset({1}), label="no-rows"),
            Case(op, [data(3, 4), const([0], I64)], opset=18, on_device=False, label="runtime-axes"),
        ]
        if op in ("ReduceL1", "ReduceProd", "ReduceSumSquare"):
            cases += [
                Case(op, [ints(3, 5, low=-4, high=5)], {"axes": [1]}, opset=13, label="int32"),
                Case(op, [ints(3, 5, low=-9, high=9, dtype=I64)], {"axes": [0]}, opset=13, label="int64"),
            ]
        cases.append(Case(op, [halves(3, 4)], {"axes": [1]}, opset=13, label="float16"))
    cases += [
        Case("ReduceLogSumExp", [floats(3, 40, scale=60.0)], {"axes": [1]}, opset=13, label="large"),
        Case("ReduceLogSumExp", [const(np.full((2, 3), -np.inf), F32)], {"axes": [1]}, opset=13, label="minus-inf"),
        Case("ReduceL2", [ints(3, 5, low=-9, high=9)], {"axes": [1]}, opset=13, on_device=False, label="int32"),
        Case("ReduceLogSum", [ints(3, 5, low=1, high=9)], {"axes": [1]}, opset=13, on_device=False, label="int32"),
        # products up to 2**51, across the word boundary (onnxruntime saturates int64 products that overflow, and
        # rounds above 2**53: the reference wraps exactly, so overflowing inputs are not compared)
        Case("ReduceProd", [ints(4, 3, low=-(2**17), high=2**17, dtype=I64)], {"axes": [1]}, opset=13, label="int64"),
        Case("ReduceMax", [const(np.full((2, 3), -np.inf), F32)], {"axes": [1]}, opset=13, label="minus-inf"),
        Case("ReduceMin", [const(np.full((2, 3), np.inf), F32)], {"axes": [1]}, opset=13, label="inf"),
    ]
    return cases


def _scan_cases() -> list[Case]:
    cases: list[Case] = []
    for op, opset in (("CumSum", 14), ("CumProd", 26)):
        values = (lambda *s: floats(*s, low=0.5, high=1.5)) if op == "CumProd" else floats
        for exclusive in (0, 1):
            for reverse in (0, 1):
                cases.append(
                    Case(
                        op,
                        [values(3, 5, 4), const(1, I64)],
                        {"exclusive": exclusive, "reverse": reverse},
                        opset=opset,
                        constants=frozenset({1}),
                        label=f"ex{exclusive}-rev{reverse}",
                    )
                )
        cases += [
            Case(op, [values(3, 5), const([-1], np.int32)], opset=opset, constants=frozenset({1}), label="neg"),
            Case(op, [ints(4, 6, low=-3, high=4), const(0, I64)], opset=opset, constants=frozenset({1}), label="i32"),
            Case(
                op,
                [wide_ints(4, 6), const(1, I64)],
                {"reverse": 1},
                opset=opset,
                constants=frozenset({1}),
                label="int64",
            ),
            Case(op, [floats(0, 3), const(1, I64)], opset=opset, constants=frozenset({1}), label="empty"),
            Case(op, [values(3, 5), const(1, I64)], opset=opset, on_device=False, label="runtime-axis"),
            Case(
                op,
                [halves(3, 5), const(1, I64)],
                opset=opset,
                constants=frozenset({1}),
                on_device=False,
                label="float16",
            ),
        ]
    return cases


def _other_cases() -> list[Case]:
    return [
        Case("Hardmax", [small_floats(3, 4, 5)], opset=13, label="ties"),
        Case("Hardmax", [floats(3, 4, 5)], {"axis": 1}, opset=13, label="axis1"),
        Case("Hardmax", [floats(3, 4, 5)], {"axis": 1}, opset=11, label="coerced"),
        Case("Hardmax", [floats(3, 4, 5)], {"axis": 0}, opset=11, label="coerced-all"),
        Case("Hardmax", [floats(3, 4, 5)], {"axis": -1}, opset=11, label="coerced-last"),
        Case("Hardmax", [halves(3, 4)], opset=13, on_device=False, label="float16"),
        Case("TopK", [floats(3, 8), const([3], I64)], {"axis": 1}, opset=11, outputs=2),
        Case(
            "TopK",
            [ints(3, 8, low=0, high=3), const([5], I64)],
            {"axis": 1},
            opset=11,
            outputs=2,
            label="ties",
        ),
        Case(
            "TopK",
            [small_floats(5, 4), const([4], I64)],
            {"axis": 0, "largest": 0},
            opset=11,
            outputs=2,
            label="smallest-ties",
        ),
        Case("TopK", [floats(3, 6)], {"k": 2}, opset=1, outputs=2, label="k-attr"),
        Case("TopK", [floats(3, 6), const([0], I64)], opset=11, outputs=2, label="k0"),
        Case(
            "TopK",
            [wide_ints(4, 9), const([3], I64)],
            {"axis": 1, "largest": 0},
            opset=11,
            outputs=2,
            label="int64-smallest",
        ),
        Case("TopK", [floats(2, 300), const([299], I64)], opset=11, outputs=2, label="long"),
        Case("TopK", [floats(3, 4, 5), const([2], I64)], {"axis": 1}, opset=11, outputs=2, label="middle-axis"),
        Case(
            "TopK",
            [lambda rng: rng.standard_normal((3, 6)), const([2], I64)],
            opset=11,
            on_device=False,
            outputs=2,
            label="float64",
        ),
        Case("Einsum", [floats(3, 4), floats(4, 5)], {"equation": "ij,jk->ik"}, opset=12, on_device=False),
        Case(
            "Einsum",
            [floats(2, 3, 4), floats(2, 4, 5)],
            {"equation": "bij, bjk -> bik"},
            opset=12,
            on_device=False,
            label="batch",
        ),
        Case("Einsum", [floats(3, 3)], {"equation": "ii"}, opset=12, on_device=False, label="trace"),
        Case("Einsum", [floats(2, 3, 4)], {"equation": "...ij->...ji"}, opset=12, on_device=False, label="ellipsis"),
        Case("Einsum", [floats(5), floats(5)], {"equation": "i,i"}, opset=12, on_device=False, label="implicit"),
        Case("Einsum", [ints(3, 4), ints(4)], {"equation": "ij,j->i"}, opset=12, on_device=False, label="int32"),
        Case(
            "Einsum",
            [floats(2, 3, 4), floats(4, 5)],
            {"equation": "...ij,jk"},
            opset=12,
            on_device=False,
            label="implicit-ellipsis",
        ),
        Case(
            "Einsum",
            [floats(2, 3), floats(1, 3)],
            {"equation": "ij,ij->ij"},
            opset=12,
            on_device=False,
            label="broadcast-one",
        ),
        Case("Einsum", [floats(2, 3, 3)], {"equation": "bii->b"}, opset=12, on_device=False, label="diagonal"),
        Case("Det", [floats(4, 4)], opset=11),
        Case("Det", [floats(2, 3, 3, 3)], opset=11, label="batch"),
        Case("Det", [floats(5, 1, 1)], opset=11, label="order-1"),
        Case("Det", [floats(3, 8, 8)], opset=11, label="order-8"),  # float32 elimination: error grows with order
        Case("Det", [const(np.array([[1, 2, 3], [2, 4, 6], [0, 1, 5]]), F32)], opset=11, label="singular"),
        Case("Det", [const(np.array([[0, 1], [1, 0]]), F32)], opset=11, label="swap"),
        Case("Det", [floats(2, 17, 17)], opset=11, on_device=False, label="order-17"),
        Case("Det", [floats(2, 0, 0)], opset=11, on_device=False, label="order-0"),
    ]


CASES: list[Case] = _loss_cases() + _arg_cases() + _reduce_cases() + _scan_cases() + _other_cases()


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


def _reference(op_type: str, opset: int, inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return get_operator(op_type, opset).reference(inputs, attrs, [TensorInfo((), np.dtype(F32))] * 2)


def test_invalid_inputs_are_refused_with_typed_errors() -> None:
    x = np.zeros((3, 4), F32)
    with pytest.raises(InvalidArgumentError, match="label 7"):
        _reference("NegativeLogLikelihoodLoss", 13, [x, np.array([0, 7, 1], I64)], {})
    with pytest.raises(InvalidArgumentError, match="label -1"):
        _reference("SoftmaxCrossEntropyLoss", 13, [x, np.array([0, -1, 1], I64)], {"ignore_index": 2})
    with pytest.raises(ShapeError, match="labels"):
        _reference("NegativeLogLikelihoodLoss", 13, [x, np.array([0, 1], I64)], {})
    with pytest.raises(ShapeError, match="k = 5"):
        _reference("TopK", 11, [x, np.array([5], I64)], {})
    with pytest.raises(UnsupportedOpError, match="ReduceLogSumExp on int64"):
        _reference("ReduceLogSumExp", 13, [np.ones((2, 3), I64)], {"axes": [1]})
    with pytest.raises(ShapeError, match="empty"):
        _reference("ArgMax", 13, [np.zeros((2, 0), F32)], {"axis": 1})
    with pytest.raises(ShapeError, match="square"):
        _reference("Det", 11, [np.zeros((2, 3), F32)], {})
    for equation, message in (
        ("ij,jk", "2 input terms"),
        ("i1", "characters other than letters"),
        ("ij->ik", "does not occur"),
        ("ij->ii", "repeats"),
        ("ijk", "does not fit input"),
        ("......", "more than one ellipsis"),
        ("ij->...", "no input term has"),
    ):
        with pytest.raises(ShapeError, match=message):
            _reference("Einsum", 12, [x], {"equation": equation})
    with pytest.raises(UnsupportedOpError, match="output term 'ab' does not"):
        _reference("Einsum", 12, [np.zeros((2, 3), F32), np.zeros((4, 3), F32)], {"equation": "a...,b...->ab"})
    with pytest.raises(UnsupportedOpError, match="axis 2 out of range"):
        _reference("Hardmax", 11, [x], {"axis": 2})
    with pytest.raises(ShapeError, match="does not fit the input shapes"):
        _reference("Einsum", 12, [x, np.zeros((5, 2), F32)], {"equation": "ij,jk->ik"})


def test_all_ignored_mean_is_nan_like_onnxruntime() -> None:
    """Every label ignored: 0 / 0 (onnxruntime gives NaN too)."""
    from test_ops_elementwise import attribute_values, onnx_model, run_onnxruntime

    case = Case("NegativeLogLikelihoodLoss", [floats(3, 4), const([2, 2, 2], I64)], {"ignore_index": 2}, opset=13)
    arrays: list[np.ndarray | None] = [np.ones((3, 4), F32), np.array([2, 2, 2], I64)]
    model = onnx_model(case, arrays, [np.dtype(F32)])
    (ours,) = _reference("NegativeLogLikelihoodLoss", 13, arrays, attribute_values(model))
    (theirs,) = run_onnxruntime(model, arrays)
    assert np.isnan(ours) and np.isnan(theirs)


def test_long_scans_and_rows_respect_the_loop_budget(op_device: BackendDevice) -> None:
    """Lines longer than lavapipe's loop budget run on the CPU (NotOnDevice names the budget)."""
    limits = op_device.limits
    caps = DeviceCaps(frozenset(op_device.features), limits, loop_budget=65535)
    x = TensorInfo((2, 70000), np.dtype(F32))
    axis = {1: np.array(1, I64)}
    with pytest.raises(NotOnDevice, match="loop"):
        get_operator("CumSum", 14).plan([x, TensorInfo((), np.dtype(I64))], [x], {}, caps, axis)
    out = TensorInfo((2, 1), np.dtype(I64))
    with pytest.raises(NotOnDevice, match="loop"):
        get_operator("ArgMax", 13).plan([x], [out], {"axis": 1}, caps, {})
    with pytest.raises(NotOnDevice, match="loop"):
        get_operator("Hardmax", 13).plan([x], [x], {}, caps, {})
    short = TensorInfo((2, 30000), np.dtype(F32))
    get_operator("CumSum", 14).plan([short, TensorInfo((), np.dtype(I64))], [short], {}, caps, axis)


def _nan_rows(length: int) -> np.ndarray:
    """Rows with NaN first, in the middle, everywhere, nowhere, beside infinities."""
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((6, length)).astype(F32)
    rows[0, 0] = np.nan
    rows[1, length // 2] = np.nan
    rows[2, :] = np.nan
    rows[4, :] = -np.inf
    rows[5, 1] = np.inf
    rows[5, length - 1] = np.nan
    return rows


@pytest.mark.parametrize("length", [5, 700])
def test_nan_rows_match_the_reference_on_the_device(op_device: BackendDevice, length: int) -> None:
    """NaN in reductions follows numpy (the spec's model: NaN anywhere gives NaN, even where WGSL's max/min
    drop it); ArgMax/ArgMin/Hardmax follow onnxruntime's ordered scan (checked against onnxruntime too)."""
    from test_ops_elementwise import assert_close, attribute_values, onnx_model, run_onnxruntime

    from ortgpu.ops._runner import run_plan

    x = _nan_rows(length)
    for op_type, attrs, opset in (
        ("ReduceMax", {"axes": [1]}, 13),
        ("ReduceMin", {"axes": [1], "keepdims": 0}, 13),
        ("ReduceLogSumExp", {"axes": [1]}, 13),
        ("ReduceL2", {"axes": [1]}, 13),
        ("ArgMax", {"axis": 1}, 13),
        ("ArgMin", {"axis": 1, "select_last_index": 1}, 13),
        ("Hardmax", {}, 13),
    ):
        operator = get_operator(op_type, opset)
        (expected,) = operator.reference([x], attrs, [TensorInfo((), np.dtype(F32))])
        if op_type.startswith("Arg") or op_type == "Hardmax":
            case = Case(op_type, [const(x)], attrs, opset=opset)
            model = onnx_model(case, [x], [expected.dtype])
            assert attribute_values(model) == attrs
            (theirs,) = run_onnxruntime(model, [x])
            assert_close(expected, theirs, f"{op_type} NaN rows (reference vs onnxruntime)")
        else:
            assert np.isnan(expected.reshape(6)[[0, 1, 2, 5]]).all()
        output = TensorInfo(expected.shape, expected.dtype)
        plan = operator.plan([TensorInfo(x.shape, x.dtype)], [output], attrs, caps_of(op_device), {})
        (actual,) = run_plan(op_device, plan, [x], [output])
        assert_close(actual, expected, f"{op_type} NaN rows (device vs reference)")


def test_out_of_range_labels_on_the_device(op_device: BackendDevice, backend_name: str) -> None:
    """An out-of-range label flags the run in the program's status words (the kernel cannot raise; it writes NaN
    there), so running the plan raises InvalidArgumentError on both backends, as the reference and onnxruntime do."""
    from ortgpu.ops._runner import run_plan

    x = np.zeros((3, 4), F32)
    target = np.array([0, 9, 1], I64)
    for op_type in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):
        for reduction, shape in (("none", (3,)), ("mean", ())):
            attrs = {"reduction": reduction}
            output = TensorInfo(shape, np.dtype(F32))
            plan = get_operator(op_type, 13).plan(
                [TensorInfo(x.shape, x.dtype), TensorInfo(target.shape, target.dtype)],
                [output],
                attrs,
                caps_of(op_device),
                {},
            )
            assert any(b.kind == "status" for kernel in plan.kernels for b in kernel.bindings)
            with pytest.raises(InvalidArgumentError, match="invalid data"):
                run_plan(op_device, plan, [x, target], [output])
            (loss,) = run_plan(op_device, plan, [x, np.array([0, 3, 1], I64)], [output])
            assert np.isfinite(loss).all()


@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_nan_rows(op_device: BackendDevice, largest: int) -> None:
    """NaN sorts as the largest value, NaNs among themselves by index (onnxruntime's order), on the device too."""
    from test_ops_elementwise import assert_close, onnx_model, run_onnxruntime

    from ortgpu.ops._runner import run_plan

    x = _nan_rows(9)
    k = np.array([4], I64)
    attrs = {"axis": 1, "largest": largest}
    operator = get_operator("TopK", 11)
    expected = operator.reference([x, k], attrs, [TensorInfo((), np.dtype(F32))] * 2)
    model = onnx_model(
        Case("TopK", [const(x), const(k)], attrs, opset=11, outputs=2), [x, k], [np.dtype(F32), np.dtype(I64)]
    )
    for ours, theirs in zip(expected, run_onnxruntime(model, [x, k])):
        assert_close(ours, theirs, "TopK NaN rows (reference vs onnxruntime)")
    infos = [TensorInfo(e.shape, e.dtype) for e in expected]
    plan = operator.plan(
        [TensorInfo(x.shape, x.dtype), TensorInfo(k.shape, k.dtype)], infos, attrs, caps_of(op_device), {}
    )
    for actual, reference in zip(run_plan(op_device, plan, [x, k], infos), expected):
        assert_close(actual, reference, "TopK NaN rows (device vs reference)")


def _confident_losses(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each sample's loss as log1p of the other classes' exp(score - label's score), in float64."""
    wide = scores.astype(np.float64)
    picked = np.take_along_axis(wide, labels[:, None], axis=1)
    others = np.exp(wide - picked).sum(axis=1) - 1.0
    return np.log1p(others).astype(F32)


NUMPY_ORACLES["SoftmaxCrossEntropyLoss-opset13-confident"] = _confident_losses
