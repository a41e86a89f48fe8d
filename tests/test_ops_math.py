"""Elementwise math: Max Min Sum Mean, trigonometric/hyperbolic functions, activations, PRelu.

Same method as ``test_ops_elementwise.py`` (whose helpers this module uses): single-node models on
fresh random inputs, onnxruntime's CPU provider as the judge of the references, the fake and wgpu
devices checked against the references.  Inputs reach the regions where the WGSL formulations change
(series near 0, large arguments, +-1 for the inverse functions) and carry NaN and infinities.
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import numpy as np
import pytest
from test_ops_elementwise import (
    Case,
    Generator,
    assert_close,
    caps_of,
    check_plan,
    check_reference,
    floats,
    halves,
    ints,
    open_device,
    wide_ints,
)

from ortgpu.ops import TensorInfo, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu_core._errors import ShapeError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice


def with_specials(generate: Generator, *values: float) -> Generator:
    """``generate`` with its first elements replaced by ``values`` (NaN, infinities, boundaries)."""

    def make(rng: np.random.Generator) -> np.ndarray:
        array = generate(rng)
        assert array is not None
        flat = array.reshape(-1)
        flat[: len(values)] = np.asarray(values, dtype=array.dtype)
        return array

    return make


def spread(*shape: int, dtype: Any = np.float32) -> Generator:
    """Magnitudes from 1e-6 to 1e4, both signs (series, exponential and asymptotic regions)."""

    def make(rng: np.random.Generator) -> np.ndarray:
        magnitude = 10.0 ** rng.uniform(-6, 4, shape)
        return (magnitude * rng.choice([-1.0, 1.0], shape)).astype(dtype)

    return make


def unit(*shape: int, dtype: Any = np.float32) -> Generator:
    """Values in (-1, 1), a third of them within 1e-3 of +-1."""

    def make(rng: np.random.Generator) -> np.ndarray:
        near = rng.random(shape) < 0.33
        values = np.where(near, np.sign(rng.standard_normal(shape)) * (1 - rng.uniform(0, 1e-3, shape)), 0)
        return np.where(near, values, rng.uniform(-1, 1, shape)).astype(dtype)

    return make


NAN, INF = float("nan"), float("inf")
F64 = lambda *shape: lambda rng: rng.standard_normal(shape)  # noqa: E731

CASES: list[Case] = [
    # variadic
    Case("Max", [floats(2, 3, 4), floats(3, 1), floats(4)], opset=13, label="three-broadcast"),
    Case("Max", [floats(3, 5)], opset=13, label="one"),
    Case("Min", [floats(2, 1, 4), floats(1, 3, 1)], opset=8, label="opset8"),
    Case(
        "Max", [with_specials(floats(7), NAN, 1.0, NAN), with_specials(floats(7), 2.0, NAN, NAN)], opset=13, label="nan"
    ),
    Case(
        "Min", [with_specials(floats(7), NAN, 1.0, NAN), with_specials(floats(7), 2.0, NAN, NAN)], opset=13, label="nan"
    ),
    Case("Max", [halves(3, 5), halves(5)], opset=13, label="float16"),
    Case("Min", [ints(4, 9), ints(9), ints(4, 1)], opset=13, label="int32"),
    Case(
        "Max",
        [ints(4, 9, low=-128, high=128, dtype=np.int8), ints(9, low=-128, high=128, dtype=np.int8)],
        opset=13,
        label="int8",
    ),
    Case(
        "Min",
        [ints(4, 9, low=0, high=256, dtype=np.uint8), ints(9, low=0, high=256, dtype=np.uint8)],
        opset=13,
        label="uint8",
    ),
    Case(
        "Max",
        [ints(4, 9, low=0, high=2**32, dtype=np.uint32), ints(9, low=0, high=2**32, dtype=np.uint32)],
        opset=13,
        label="uint32",
    ),
    Case("Max", [wide_ints(4, 9), wide_ints(9), wide_ints(4, 1)], opset=13, label="int64"),
    Case("Min", [wide_ints(4, 9), wide_ints(9)], opset=13, label="int64"),
    Case("Min", [wide_ints(4, 9, dtype=np.uint64), wide_ints(9, dtype=np.uint64)], opset=13, label="uint64"),
    Case("Max", [floats(0, 3), floats(3)], opset=13, label="empty"),
    Case("Sum", [floats(2, 3, 4), floats(3, 1), floats(4)], opset=13, label="three-broadcast"),
    Case("Sum", [floats(3, 5)], opset=13, label="one"),
    Case("Sum", [halves(3, 5), halves(5), halves(1)], opset=13, label="float16"),
    Case("Sum", [floats(4, 0), floats(1)], opset=13, label="empty"),
    Case("Mean", [floats(2, 3, 4), floats(3, 1), floats(4)], opset=13, label="three-broadcast"),
    Case("Mean", [floats(3, 5), floats(3, 5)], opset=6, label="opset6"),
    Case("Mean", [halves(3, 5), halves(5)], opset=13, label="float16"),
    Case("Sum", [F64(3, 4), F64(4)], opset=13, on_device=False, label="float64"),
    # trigonometric
    *[
        Case(op, [with_specials(floats(2, 600, scale=4.0), NAN, INF, -INF, 0.0, 1e-30)], opset=7)
        for op in ("Sin", "Cos", "Tan", "Atan")
    ],
    *[Case(op, [floats(1000, low=-3000.0, high=3000.0)], opset=7, label="large") for op in ("Sin", "Cos")],
    Case("Atan", [with_specials(spread(1000), 1e30, -1e30)], opset=7, label="spread"),
    *[
        Case(op, [with_specials(unit(2, 600), NAN, 1.0, -1.0, 0.0, 1.5, -2.0)], opset=9)
        for op in ("Asin", "Acos", "Atanh")
    ],
    *[Case(op, [with_specials(spread(1000), NAN, INF, -INF, 0.0, 85.0, -89.0)], opset=9) for op in ("Sinh", "Cosh")],
    Case("Asinh", [with_specials(spread(1000), NAN, INF, -INF, 0.0, 1e30, -1e30)], opset=9),
    Case("Acosh", [lambda rng: (1 + np.abs(spread(1000)(rng))).astype(np.float32)], opset=9),
    Case("Acosh", [with_specials(floats(20, low=0.5, high=1.5), NAN, INF, 1.0, 0.0)], opset=22, label="near-one"),
    *[Case(op, [halves(4, 33)], opset=22, label="float16") for op in ("Sin", "Cos", "Atan", "Sinh", "Asinh")],
    Case("Cos", [F64(3, 4)], opset=7, on_device=False, label="float64"),
    # activations
    Case("Elu", [with_specials(spread(500), NAN, -INF, INF, -1e-7)], opset=6),
    Case("Elu", [floats(5, 40, scale=3)], {"alpha": 0.3}, opset=22, label="alpha"),
    Case("Selu", [with_specials(floats(5, 40, scale=3), NAN, -INF)], opset=6),
    Case("Selu", [floats(5, 40, scale=3)], {"alpha": 2.0, "gamma": 3.0}, opset=22, label="attrs"),
    Case("Celu", [with_specials(floats(5, 40, scale=3), NAN, -1e-6)], opset=12),
    Case("Celu", [floats(5, 40, scale=3)], {"alpha": 2.5}, opset=12, label="alpha"),
    Case("Softplus", [with_specials(spread(500), NAN, INF, -INF, 100.0, -100.0)], opset=1),
    Case("Softsign", [with_specials(spread(500), NAN, 0.0)], opset=1),
    Case("ThresholdedRelu", [floats(5, 40, scale=3)], opset=10),
    Case("ThresholdedRelu", [floats(5, 40, scale=3)], {"alpha": -0.5}, opset=22, label="alpha"),
    Case("Shrink", [floats(5, 40, scale=3)], opset=9),
    Case("Shrink", [floats(5, 40, scale=3)], {"lambd": 1.5, "bias": 0.25}, opset=9, label="attrs"),
    Case(
        "Shrink", [ints(5, 40, low=-128, high=128, dtype=np.int8)], {"lambd": 3.0, "bias": 2.0}, opset=9, label="int8"
    ),
    Case(
        "Shrink",
        [ints(5, 40, low=0, high=2**16, dtype=np.uint16)],
        {"lambd": 9.0, "bias": 2.0},
        opset=9,
        label="uint16",
    ),
    Case(
        "Shrink",
        [ints(5, 40, low=-1000, high=1000)],
        {"lambd": 9.0, "bias": 2.0},
        opset=9,
        on_device=False,
        label="int32",
    ),
    Case(
        "Shrink",
        [ints(5, 40, low=-128, high=128, dtype=np.int8)],
        {"lambd": 0.2, "bias": 2.9},
        opset=9,
        label="int8-fractional",
    ),
    Case(
        "Shrink",
        [ints(5, 40, low=0, high=256, dtype=np.uint8)],
        {"lambd": -2.5, "bias": -3.7},
        opset=9,
        label="uint8-wrapping",
    ),
    Case("Mish", [with_specials(spread(500), NAN, 30.0, -30.0)], opset=18),
    Case("Swish", [with_specials(floats(5, 40, scale=5), NAN)], opset=24),
    Case("Swish", [floats(5, 40, scale=5)], {"alpha": 0.4}, opset=24, label="alpha"),
    *[Case(op, [halves(4, 33)], opset=22, label="float16") for op in ("Elu", "Selu", "Softplus", "Mish", "Softsign")],
    # PRelu
    Case("PRelu", [floats(2, 3, 4, 5), floats(3, 1, 1)], opset=16, label="channels"),
    Case("PRelu", [floats(2, 3, 4, 5), floats(5)], opset=9, label="last-axis"),
    Case("PRelu", [floats(3, 4), floats(1)], opset=7, label="scalar"),
    Case("PRelu", [halves(3, 4), halves(4)], opset=16, label="float16"),
    Case("PRelu", [floats(0, 4), floats(4)], opset=16, label="empty"),
]

#: Variants onnxruntime's CPU provider has no kernel for: the device is checked against the reference only.
DEVICE_ONLY: list[Case] = [
    Case("PRelu", [floats(3, 4), floats(3, 4)], opset=6, label="opset6"),
    Case(
        "Max", [ints(4, 9, low=-(2**15), high=2**15, dtype=np.int16), ints(9, dtype=np.int16)], opset=13, label="int16"
    ),
    Case(
        "Min",
        [ints(4, 9, low=0, high=2**16, dtype=np.uint16), ints(9, low=0, high=9, dtype=np.uint16)],
        opset=13,
        label="uint16",
    ),
    Case("PRelu", [ints(3, 4), ints(4)], opset=16, label="int32"),
    Case("PRelu", [wide_ints(3, 4), ints(4, low=-3, high=3, dtype=np.int64)], opset=16, label="int64"),
    Case(
        "PRelu",
        [ints(3, 4, low=0, high=2**32, dtype=np.uint32), ints(4, low=0, high=9, dtype=np.uint32)],
        opset=16,
        label="uint32",
    ),
    Case(
        "PRelu", [wide_ints(3, 4, dtype=np.uint64), ints(4, low=0, high=9, dtype=np.uint64)], opset=16, label="uint64"
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


@pytest.mark.parametrize("case", CASES + DEVICE_ONLY, ids=[c.id for c in CASES + DEVICE_ONLY])
def test_plan_matches_reference(case: Case, op_device: BackendDevice) -> None:
    if "float16" in case.label:
        check_half_plan(case, op_device)
    else:
        check_plan(case, op_device)


def check_half_plan(case: Case, device: BackendDevice) -> None:
    """float16 outputs within one float16 ulp of the reference, elementwise.

    Both compute in f32 and round once to float16, but the driver's ``exp``/``log`` may differ from numpy's
    by an f32 ulp or two, which flips the float16 rounding of values near a rounding midpoint.
    """
    rng = np.random.default_rng()
    arrays = [generate(rng) for generate in case.inputs]
    operator = get_operator(case.op_type, case.opset)
    attrs = dict(case.attrs)
    (expected,) = operator.reference(arrays, attrs, [])
    infos = [TensorInfo(a.shape, a.dtype) for a in arrays if a is not None]
    output = TensorInfo(expected.shape, expected.dtype)
    plan = operator.plan(infos, [output], attrs, caps_of(device), {})
    (actual,) = run_plan(device, plan, arrays, [output])
    assert actual.dtype == np.float16 and actual.shape == expected.shape
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(e)), case.id
    finite = np.isfinite(e)
    assert np.array_equal(a[~finite & ~np.isnan(e)], e[~finite & ~np.isnan(e)]), case.id
    spacing = np.spacing(np.abs(expected[finite])).astype(np.float64)
    assert np.all(np.abs(a[finite] - e[finite]) <= spacing), case.id


def test_device_only_references_follow_the_spec() -> None:
    """The references of the variants onnxruntime lacks, against the ONNX formulas written in numpy."""
    rng = np.random.default_rng(3)
    a = rng.integers(-(2**15), 2**15, (4, 9)).astype(np.int16)
    b = rng.integers(-100, 100, 9).astype(np.int16)
    (got,) = get_operator("Max", 13).reference([a, b], {}, [])
    np.testing.assert_array_equal(got, np.maximum(a, b))
    x = rng.integers(-(2**62), 2**62, (3, 4))
    slope = rng.integers(-3, 3, 4)
    (got,) = get_operator("PRelu", 16).reference([x, slope], {}, [])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, np.where(x < 0, x * slope, x))
    u = rng.integers(0, 2**32, (3, 4)).astype(np.uint32)
    (got,) = get_operator("PRelu", 16).reference([u, u], {}, [])
    np.testing.assert_array_equal(got, u)


def test_large_sine_arguments_are_reduced_exactly(op_device: BackendDevice) -> None:
    """sin/cos/tan of arguments up to the largest f32 keep f32 precision: Cody-Waite reduction by pi/2 below
    1e5, Payne-Hanek beyond (the driver's built-ins are never used)."""
    rng = np.random.default_rng(7)
    huge = 10.0 ** rng.uniform(4.9, 38.5, 3000) * rng.choice([-1.0, 1.0], 3000)
    x = np.concatenate([np.linspace(-110000.0, 110000.0, 3001), huge, [102943.0, -102943.0, 3.4e38, 2.0**25 + 2]])
    x = x.astype(np.float32)
    info = TensorInfo(x.shape, x.dtype)
    for op in ("Sin", "Cos", "Tan"):
        operator = get_operator(op, 13)
        plan = operator.plan([info], [info], {}, caps_of(op_device), {})
        (got,) = run_plan(op_device, plan, [x], [info])
        want = getattr(np, op.lower())(x.astype(np.float64))
        error = np.abs(got.astype(np.float64) - want) / np.maximum(np.abs(want), 1.0)
        assert float(np.max(error)) < 1e-6, op


def test_refusals_are_typed() -> None:
    with pytest.raises(UnsupportedOpError, match="different dtypes"):
        get_operator("Max", 13).reference([np.zeros(2, np.float32), np.zeros(2, np.int32)], {}, [])
    with pytest.raises(UnsupportedOpError, match="int32"):
        get_operator("Sum", 13).reference([np.zeros(2, np.int32)], {}, [])
    with pytest.raises(ShapeError, match="do not broadcast"):
        get_operator("Mean", 13).reference([np.zeros(2, np.float32), np.zeros(3, np.float32)], {}, [])
    with pytest.raises(ShapeError, match="one shape before opset 8"):
        get_operator("Max", 6).reference([np.zeros((2, 3), np.float32), np.zeros(3, np.float32)], {}, [])
    with pytest.raises(ShapeError, match="unidirectionally"):
        get_operator("PRelu", 16).reference([np.zeros(3, np.float32), np.zeros((2, 3), np.float32)], {}, [])
    with pytest.raises(UnsupportedOpError, match="int32"):
        get_operator("PRelu", 7).reference([np.zeros(3, np.int32), np.zeros(3, np.int32)], {}, [])
    with pytest.raises(UnsupportedOpError, match="alpha=0"):
        get_operator("Celu", 12).reference([np.zeros(3, np.float32)], {"alpha": 0.0}, [])
    with pytest.raises(UnsupportedOpError, match="int32"):
        get_operator("Sin", 7).reference([np.zeros(3, np.int32)], {}, [])


@pytest.mark.parametrize(
    ("op", "dtype"),
    [("Sum", np.float32), ("Mean", np.float16), ("Max", np.int64), ("Min", np.float32), ("Max", np.uint8)],
)
def test_more_inputs_than_one_kernel_binds_chain_kernels(op: str, dtype: Any, op_device: BackendDevice) -> None:
    """Nodes with more inputs than storage bindings fold them in several kernels, in the node's order."""
    caps = caps_of(op_device)
    rng = np.random.default_rng(11)
    limit = caps.limits.max_storage_buffers_per_shader_stage
    for count in (limit, 2 * limit + 5):  # two kernels; three (both scratch buffers in turn)
        shapes = [(4, 5) if i % 3 else (5,) for i in range(count)]
        if np.dtype(dtype).kind == "f":
            arrays = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
            arrays[3].reshape(-1)[0] = np.nan
        else:
            arrays = [
                wide_ints(*shape, dtype=dtype)(rng)
                if dtype == np.int64
                else ints(*shape, low=0, high=256, dtype=dtype)(rng)
                for shape in shapes
            ]
        operator = get_operator(op, 13)
        (expected,) = operator.reference(arrays, {}, [])
        infos = [TensorInfo(a.shape, a.dtype) for a in arrays]
        output = TensorInfo(expected.shape, expected.dtype)
        plan = operator.plan(infos, [output], {}, caps, {})
        assert len(plan.kernels) > 1
        (actual,) = run_plan(op_device, plan, arrays, [output])
        if np.dtype(dtype) == np.float16:
            np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32), rtol=1e-3, atol=1e-3)
        else:
            assert_close(actual, expected, f"{op} of {count} inputs")
