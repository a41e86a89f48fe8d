"""Elementwise operators: reference vs onnxruntime CPU, and the device plans vs the reference.

Each :class:`Case` is one single-node model.  ``test_reference_matches_onnxruntime``
runs the node through onnxruntime's CPU provider and through the operator's
numpy reference on fresh random inputs; ``test_plan_matches_reference`` plans
the node for a device (the fake backend, which runs the kernels' numpy twins,
and lavapipe through wgpu-native, which runs the WGSL) and compares it with the
reference.  Cases expected to stay on the CPU check that ``plan`` says why.

The helpers here are shared with ``test_ops_movement.py``.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import onnxruntime
import pytest

from ortgpu.ops import DeviceCaps, NotOnDevice, TensorInfo, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu.ops._wgsl import grid_for
from ortgpu_core._errors import UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

Generator = Callable[[np.random.Generator], np.ndarray | None]


@dataclass
class Case:
    """One single-node model and how it should run."""

    op_type: str
    inputs: Sequence[Generator]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    opset: int = 17
    #: input indices given to ``plan`` as constants (like initializers)
    constants: frozenset[int] = frozenset()
    #: False: ``plan`` must raise NotOnDevice
    on_device: bool = True
    outputs: int = 1
    label: str = ""
    #: False where onnxruntime's CPU provider has no kernel for the variant
    in_onnxruntime: bool = True

    @property
    def id(self) -> str:
        return f"{self.op_type}-opset{self.opset}-{self.label}" if self.label else f"{self.op_type}-opset{self.opset}"


# -- input generators -------------------------------------------------------------------


def floats(*shape: int, scale: float = 1.0, low: float | None = None, high: float | None = None) -> Generator:
    def make(rng: np.random.Generator) -> np.ndarray:
        if low is not None and high is not None:
            return rng.uniform(low, high, shape).astype(np.float32)
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return make


def halves(*shape: int) -> Generator:
    return lambda rng: rng.standard_normal(shape).astype(np.float16)


def ints(*shape: int, low: int = -100, high: int = 100, dtype: Any = np.int32) -> Generator:
    return lambda rng: rng.integers(low, high, shape).astype(dtype)


def nonzero(generate: Generator) -> Generator:
    """``generate`` with zeros replaced by one (divisors: integer division by zero is an error in onnxruntime)."""
    return lambda rng: _no_zeros(generate(rng))


def _no_zeros(values: np.ndarray) -> np.ndarray:
    values = values.copy()
    values[values == 0] = 1
    return values


def wide_ints(*shape: int, dtype: Any = np.int64) -> Generator:
    """64-bit integers over their whole range (carries between the words), with some small values."""

    def make(rng: np.random.Generator) -> np.ndarray:
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        small = rng.random(shape) < 0.25
        return np.where(small, rng.integers(0 if info.min == 0 else -5, 5, shape).astype(dtype), values)

    return make


def _close_wide(*shape: int, dtype: Any) -> Generator:
    """64-bit integers that often share their high word (so the low word decides a comparison)."""

    def make(rng: np.random.Generator) -> np.ndarray:
        info = np.iinfo(dtype)
        high = rng.integers(-2 if info.min else 0, 3, shape).astype(np.int64) * (2**32)
        low = rng.integers(0, 2**32, shape).astype(np.int64) if rng.random() < 0.5 else rng.integers(0, 3, shape)
        values = (high + low).astype(dtype)
        huge = rng.random(shape) < 0.2
        return np.where(huge, rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True), values).astype(dtype)

    return make


def bools(*shape: int) -> Generator:
    return lambda rng: rng.random(shape) > 0.5


def const(value: Any, dtype: Any = None) -> Generator:
    array = np.asarray(value, dtype=dtype)
    return lambda rng: array.copy()


def absent() -> Generator:
    return lambda rng: None


# -- running -----------------------------------------------------------------------------

_ORT_IR_VERSION = 9


def onnx_model(
    case: Case, arrays: Sequence[np.ndarray | None], output_dtypes: Sequence[np.dtype[Any]]
) -> onnx.ModelProto:
    names = ["" if a is None else f"in{i}" for i, a in enumerate(arrays)]
    while names and names[-1] == "":
        names.pop()
    outputs = [f"out{i}" for i in range(case.outputs)]
    node = onnx.helper.make_node(case.op_type, names, outputs, **dict(case.attrs))
    graph_inputs = [
        onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in zip(names, arrays)
        if a is not None
    ]
    graph_outputs = [
        onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(dtype), None)
        for name, dtype in zip(outputs, output_dtypes)
    ]
    graph = onnx.helper.make_graph([node], "single_node", graph_inputs, graph_outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", case.opset)])
    model.ir_version = _ORT_IR_VERSION
    return model


def attribute_values(model: onnx.ModelProto) -> dict[str, Any]:
    """The node's attributes as the model loader passes them (tensors as numpy, strings as str)."""
    values: dict[str, Any] = {}
    for attribute in model.graph.node[0].attribute:
        if attribute.type == onnx.AttributeProto.TENSOR:
            values[attribute.name] = onnx.numpy_helper.to_array(attribute.t)
            continue
        value = onnx.helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return values


def run_onnxruntime(model: onnx.ModelProto, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {f"in{i}": a for i, a in enumerate(arrays) if a is not None}
    return [np.asarray(r) for r in session.run(None, feeds)]


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """float: ||a - e|| / ||e|| < 1e-4 (float16: 1e-3) over finite values, same NaN/inf positions; others: exact."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype.kind != "f":
        mismatches = int(np.count_nonzero(actual != expected))
        assert mismatches == 0, f"{what}: {mismatches} of {expected.size} elements differ\n{actual}\n{expected}"
        return
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(e)), f"{what}: NaN positions differ"
    finite = np.isfinite(e)
    assert np.array_equal(a[~finite & ~np.isnan(e)], e[~finite & ~np.isnan(e)]), f"{what}: infinities differ"
    norm = max(float(np.linalg.norm(e[finite])), 1e-30)
    error = float(np.linalg.norm(a[finite] - e[finite]))
    # float16 results: an f32 intermediate one ulp off (a GPU's inverseSqrt or exp) flips an f16 rounding, one f16
    # ulp (~1e-3 relative); lavapipe happens to agree bit for bit, the H200 does not
    limit = 1e-3 if expected.dtype == np.float16 else 1e-4
    assert error <= limit * norm, f"{what}: relative error {error / norm:.3g}"


def make_inputs(case: Case) -> list[np.ndarray | None]:
    rng = np.random.default_rng()
    return [generate(rng) for generate in case.inputs]


def placeholder_outputs(case: Case) -> list[TensorInfo]:
    """Output infos for a reference call before the outputs are known (their count is what matters)."""
    return [TensorInfo((), np.dtype(np.float32))] * case.outputs


#: For cases onnxruntime's CPU provider cannot run: the ONNX semantics, written directly in numpy.
NUMPY_ORACLES: dict[str, Callable[..., np.ndarray]] = {
    "Relu-opset14-int64": lambda x: np.maximum(x, np.int64(0)),
    "Pow-opset15-uint32-exponent": lambda a, b: np.power(a, b.astype(np.float32)).astype(a.dtype),
    "Pow-opset15-uint64-exponent": lambda a, b: np.power(a, b.astype(np.float32)).astype(a.dtype),
    "Clip-opset13-uint32-constant": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    "Where-opset17-bool": lambda condition, a, b: np.where(condition, a, b),
}


#: The onnxruntime these reference comparisons were validated against, and what older ones get wrong (measured with
#: onnxruntime 1.31.1 on the GPU machine, whose onnxruntime is pinned for the bench's WebGPU peer).
#: Comparing with a peer known to be wrong for an op checks nothing, and INT64_MIN % -1 kills the interpreter.
PEER_VALIDATED_VERSION = (1, 32)
PEER_DEFECTS_BEFORE_VALIDATED = {
    "Mod": "computes integer fmod=1 through doubles (wrong past 2**53) and dies of SIGFPE on INT64_MIN % -1",
    "OneHot": "places OneHot's output differently with a negative axis",
}


def _version(text: str) -> tuple[int, ...]:
    """A version string's major and minor numbers (their leading digits)."""
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in text.split(".")[:2])


#: The installed onnxruntime's (major, minor).
PEER_VERSION = _version(onnxruntime.__version__)
PEER_TOO_OLD = PEER_VERSION < PEER_VALIDATED_VERSION
#: What to install, said by every message about an older peer.
PEER_REQUIREMENT = "onnxruntime>=" + ".".join(map(str, PEER_VALIDATED_VERSION))


def check_reference(case: Case) -> None:
    if PEER_TOO_OLD and case.in_onnxruntime and case.op_type in PEER_DEFECTS_BEFORE_VALIDATED:
        pytest.fail(
            f"{case.id}: onnxruntime {onnxruntime.__version__} {PEER_DEFECTS_BEFORE_VALIDATED[case.op_type]}, so it "
            f"cannot check this reference; install {PEER_REQUIREMENT} (pip install '{PEER_REQUIREMENT}')"
        )
    arrays = make_inputs(case)
    if not case.in_onnxruntime:
        # onnxruntime's CPU provider has no kernel for these: an independent numpy oracle stands in.
        operator = get_operator(case.op_type, case.opset)
        provisional = onnx_model(case, arrays, [np.dtype(np.float32)] * case.outputs)
        (got,) = operator.reference(arrays, attribute_values(provisional), placeholder_outputs(case))
        want = NUMPY_ORACLES[case.id](*arrays)
        assert got.dtype == want.dtype and got.shape == want.shape
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(got, want, rtol=1e-6)  # float powers: integer exponent by squaring vs libm
        else:
            np.testing.assert_array_equal(got, want)
        return
    operator = get_operator(case.op_type, case.opset)
    # The reference gives the output dtypes the ONNX graph declares.
    provisional = onnx_model(case, arrays, [np.dtype(np.float32)] * case.outputs)
    expected = operator.reference(arrays, attribute_values(provisional), placeholder_outputs(case))
    model = onnx_model(case, arrays, [e.dtype for e in expected])
    actual = run_onnxruntime(model, arrays)
    assert len(actual) == len(expected)
    for index, (ours, theirs) in enumerate(zip(expected, actual)):
        assert_close(ours, theirs, f"{case.id} output {index} (reference vs onnxruntime)")


def caps_of(device: BackendDevice) -> DeviceCaps:
    return DeviceCaps(frozenset(device.features), device.limits)


def check_plan(case: Case, device: BackendDevice) -> None:
    arrays = make_inputs(case)
    operator = get_operator(case.op_type, case.opset)
    attrs = attribute_values(onnx_model(case, arrays, [np.dtype(np.float32)] * case.outputs))
    expected = operator.reference(arrays, attrs, placeholder_outputs(case))
    input_infos = [None if a is None else TensorInfo(a.shape, a.dtype) for a in arrays]
    output_infos = [TensorInfo(e.shape, e.dtype) for e in expected]
    constants = {i: a for i, a in enumerate(arrays) if i in case.constants and a is not None}
    if not case.on_device:
        with pytest.raises(NotOnDevice) as raised:
            operator.plan(input_infos, output_infos, attrs, caps_of(device), constants)
        assert case.op_type in str(raised.value)
        return
    plan = operator.plan(input_infos, output_infos, attrs, caps_of(device), constants)
    actual = run_plan(device, plan, arrays, output_infos)
    for index, (ours, reference) in enumerate(zip(actual, expected)):
        assert_close(ours, reference, f"{case.id} output {index} ({device.info.backend_type} vs reference)")


def open_device(backend_name: str) -> BackendDevice:
    if backend_name == "fake":
        from ortgpu_core.backends.fake import FakeBackend

        return FakeBackend().open_device(0)
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    backend = WgpuBackend()
    return backend.open_device(backend.default_adapter_index())


# -- cases -------------------------------------------------------------------------------

UNARY_FLOAT = ["Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Relu", "Sigmoid", "Tanh", "Erf", "HardSigmoid"]

CASES: list[Case] = []
for op in UNARY_FLOAT:
    positive = op in ("Sqrt", "Log")
    generator = floats(3, 67, low=0.01, high=10.0) if positive else floats(3, 67, scale=3.0)
    CASES.append(Case(op, [generator], opset=13))
CASES += [
    Case("Exp", [floats(2, 5)], opset=7, label="old"),
    Case("Sigmoid", [floats(1000, scale=30.0)], label="large"),
    Case("Tanh", [floats(1000, scale=30.0)], label="large"),
    Case("Erf", [floats(4, 250, scale=2.0)], label="wide"),
    Case("Neg", [ints(5, 7)], label="int32"),
    Case("Abs", [ints(5, 7)], label="int32"),
    Case("Relu", [ints(5, 7)], opset=14, label="int32"),
    Case("Neg", [wide_ints(5, 7)], label="int64"),
    Case("Neg", [ints(5, 7, low=-128, high=128, dtype=np.int8)], label="int8"),
    Case("Abs", [wide_ints(5, 7)], label="int64"),
    Case("Abs", [ints(5, 7, low=-(2**15), high=2**15, dtype=np.int16)], label="int16"),
    Case("Relu", [wide_ints(5, 7)], opset=14, label="int64", in_onnxruntime=False),
    Case("Relu", [ints(5, 7, low=-128, high=128, dtype=np.int8)], opset=14, label="int8"),
    Case("Sqrt", [lambda rng: rng.uniform(0.1, 4, (9,)).astype(np.float64)], on_device=False, label="float64"),
    Case("LeakyRelu", [floats(4, 33)], {"alpha": 0.2}),
    Case("LeakyRelu", [floats(4, 33)], label="default"),
    Case("HardSigmoid", [floats(4, 33, scale=4)], {"alpha": 0.3, "beta": 0.4}, label="attrs"),
    Case("HardSwish", [floats(4, 33, scale=4)], opset=14),
    Case("Gelu", [floats(5, 41, scale=3)], opset=20),
    Case("Gelu", [floats(5, 41, scale=3)], {"approximate": "tanh"}, opset=20, label="tanh"),
    Case("Sqrt", [halves(3, 11)], label="float16"),
    # binary arithmetic, broadcasting
    Case("Add", [floats(2, 3, 4, 5), floats(4, 1)]),
    Case("Add", [floats(1), floats(3, 7)], label="scalar-left"),
    Case("Add", [ints(3, 1, 5), ints(4, 1)], label="int32"),
    Case("Add", [wide_ints(3, 5), wide_ints(5)], label="int64"),
    Case("Add", [wide_ints(3, 5, dtype=np.uint64), wide_ints(5, dtype=np.uint64)], label="uint64"),
    Case("Sub", [wide_ints(3, 5), wide_ints(3, 1)], label="int64"),
    Case("Sub", [wide_ints(3, 5, dtype=np.uint64), wide_ints(5, dtype=np.uint64)], label="uint64"),
    Case("Mul", [wide_ints(4, 9), wide_ints(9)], label="int64"),
    Case("Mul", [wide_ints(4, 9, dtype=np.uint64), wide_ints(4, 9, dtype=np.uint64)], label="uint64"),
    Case(
        "Mul",
        [ints(4, 9, low=-(2**31), high=2**31, dtype=np.int64), ints(9, low=-(2**31), high=2**31, dtype=np.int64)],
        label="int64-wide-products",
    ),
    Case("Div", [wide_ints(3, 5), nonzero(wide_ints(5))], on_device=False, label="int64"),
    Case("Add", [halves(3, 5), halves(5)], label="float16"),
    Case("Sub", [floats(6, 7), floats(6, 7)]),
    Case("Sub", [ints(6, 7), ints(7)], label="int32"),
    Case("Mul", [floats(8, 1, 3), floats(1, 5, 3)]),
    Case("Mul", [ints(6, 7), ints(6, 1)], label="int32"),
    Case("Div", [floats(6, 7), floats(low=0.5, high=3.0)], label="scalar"),
    Case("Div", [floats(6, 7), floats(7, low=0.5, high=3.0)]),
    Case("Div", [ints(6, 7), ints(7, low=1, high=9)], label="int32-positive"),
    Case("Div", [ints(6, 7), ints(7, low=-9, high=-1)], label="int32-truncation"),
    *[
        Case(
            op,
            [
                ints(6, 7, low=low, high=high, dtype=dtype),
                ints(7, low=max(low, 1) if op == "Div" else low, high=high, dtype=dtype),
            ],
            label=np.dtype(dtype).name,
        )
        for op in ("Add", "Sub", "Mul", "Div")
        for dtype, low, high in (
            (np.int8, -128, 128),
            (np.uint8, 0, 256),
            (np.int16, -(2**15), 2**15),
            (np.uint16, 0, 2**16),
            (np.uint32, 0, 2**32),
        )
    ],
    Case("Add", [floats(2, 3), floats(3)], opset=7, label="opset7"),
    Case("Pow", [floats(4, 9, low=0.1, high=3.0), floats(9, low=-2.0, high=2.0)]),
    Case("Pow", [floats(4, 9), const(2.0, np.float32)], label="square"),
    Case("Pow", [floats(4, 9), const(2.0, np.float32)], constants=frozenset({1}), label="square-constant"),
    Case("Pow", [floats(4, 9, low=0.1, high=4.0), const(0.5, np.float32)], constants=frozenset({1}), label="sqrt"),
    Case("Pow", [floats(4, 9), ints(9, low=-3, high=4, dtype=np.int64)], opset=15, label="int-exponent"),
    Case("Pow", [floats(4, 9), ints(9, low=-3, high=4, dtype=np.int32)], opset=15, label="int32-exponent"),
    Case(
        "Pow",
        [floats(4, 9, low=0.5, high=2.0), ints(9, low=0, high=6, dtype=np.uint32)],
        opset=15,
        label="uint32-exponent",
        in_onnxruntime=False,
    ),
    Case(
        "Pow",
        [floats(4, 9, low=0.5, high=2.0), ints(9, low=0, high=6, dtype=np.uint64)],
        opset=15,
        label="uint64-exponent",
        in_onnxruntime=False,
    ),
    Case("Pow", [ints(4, 9, low=-12, high=12), ints(9, low=0, high=7)], opset=15, label="int32-int32"),
    # negative exponents truncate toward zero (0 ** -n overflows, which C leaves undefined: not tested)
    Case(
        "Pow",
        [lambda rng: rng.choice(np.array([-2, -1, 1, 2], np.int32), (4, 9)), ints(9, low=-3, high=0)],
        opset=15,
        label="int32-negative-exponent",
    ),
    # fractional exponents of negative bases give NaN, whose conversion to an integer C leaves undefined;
    # the device computes fractional powers in f32, so results are kept small enough to truncate alike
    Case(
        "Pow", [ints(4, 9, low=0, high=4), floats(9, low=0.0, high=1.0)], opset=15, label="int32-float32"
    ),  # small results: f32 pow truncated to int is exact there (large ones can be off by one, see ops/ai_onnx/binary.py)
    Case(
        "Pow",
        [ints(4, 9, low=-12, high=12), lambda rng: rng.integers(0, 7, 9).astype(np.float32)],
        opset=15,
        label="int32-integral-float32",
    ),
    Case(
        "Pow",
        [ints(4, 9, low=-3000, high=3000, dtype=np.int64), ints(9, low=0, high=5, dtype=np.int64)],
        opset=15,
        label="int64-int64",
    ),
    Case(
        "Pow",
        [ints(4, 9, low=-3000, high=3000, dtype=np.int64), lambda rng: rng.integers(0, 5, 9).astype(np.float32)],
        opset=15,
        label="int64-integral-float32",
    ),
    # comparisons and Not
    Case("Equal", [ints(5, 9, low=-3, high=3), ints(9, low=-3, high=3)], opset=13),
    Case(
        "Equal", [ints(5, 9, low=-3, high=3, dtype=np.int64), ints(5, 1, low=-3, high=3, dtype=np.int64)], label="int64"
    ),
    *[
        Case(op, [generator(4, 9), generator(9)], label=name)
        for op in ("Equal", "Less", "Greater")
        for name, generator in (
            ("int16", lambda *shape: ints(*shape, low=-3, high=3, dtype=np.int16)),
            ("uint16", lambda *shape: ints(*shape, low=0, high=2**16, dtype=np.uint16)),
            ("uint32", lambda *shape: ints(*shape, low=0, high=2**32, dtype=np.uint32)),
            ("uint64", lambda *shape: _close_wide(*shape, dtype=np.uint64)),
            ("int64-wide", lambda *shape: _close_wide(*shape, dtype=np.int64)),
        )
    ],
    Case("Equal", [bools(7, 3), bools(3)], label="bool"),
    Case("Equal", [floats(2, 11), floats(2, 11)], label="float"),
    Case("Less", [floats(3, 13), floats(13)]),
    Case(
        "Less",
        [ints(3, 13, low=-(2**40), high=2**40, dtype=np.int64), ints(13, low=-(2**40), high=2**40, dtype=np.int64)],
        label="int64",
    ),
    Case("Less", [ints(3, 13, low=-3, high=3), ints(3, 13, low=-3, high=3)], label="int32"),
    Case("Greater", [floats(3, 13), floats(3, 1)]),
    Case(
        "Greater",
        [ints(6, low=-(2**40), high=2**40, dtype=np.int64), ints(6, low=-(2**40), high=2**40, dtype=np.int64)],
        label="int64",
    ),
    Case("Greater", [ints(2, 5, low=0, high=4, dtype=np.uint8), ints(5, low=0, high=4, dtype=np.uint8)], label="uint8"),
    Case(
        "LessOrEqual", [ints(3, 13, low=-3, high=3, dtype=np.int64), ints(13, low=-3, high=3, dtype=np.int64)], opset=16
    ),
    Case("Not", [bools(3, 17)]),
    # Clip, both forms
    Case("Clip", [floats(4, 25, scale=2)], {"min": -0.5, "max": 0.7}, opset=6, label="attributes"),
    Case("Clip", [floats(4, 25, scale=2)], {"max": 0.7}, opset=6, label="attribute-max"),
    Case("Clip", [floats(4, 25, scale=2), const(-0.5, np.float32), const(0.7, np.float32)], opset=11, label="inputs"),
    Case(
        "Clip",
        [floats(4, 25, scale=2), const(-0.5, np.float32), const(0.7, np.float32)],
        opset=13,
        constants=frozenset({1, 2}),
        label="constant-inputs",
    ),
    Case("Clip", [floats(4, 25, scale=2), absent(), const(0.1, np.float32)], opset=13, label="max-only"),
    Case("Clip", [floats(4, 25, scale=2)], opset=13, label="no-bounds"),
    Case("Clip", [floats(9), const(1.0, np.float32), const(-1.0, np.float32)], opset=13, label="min-above-max"),
    Case("Clip", [ints(4, 25), const(-5, np.int32), const(20, np.int32)], opset=13, label="int32"),
    Case(
        "Clip",
        [ints(4, 25, low=-128, high=128, dtype=np.int8), const(-5, np.int8), const(20, np.int8)],
        opset=13,
        label="int8",
    ),
    Case(
        "Clip",
        [ints(4, 25, low=-128, high=128, dtype=np.int8), absent(), const(7, np.int8)],
        opset=13,
        constants=frozenset({2}),
        label="int8-constant-max",
    ),
    Case(
        "Clip",
        [ints(4, 25, low=0, high=256, dtype=np.uint8), const(200, np.uint8)],
        opset=13,
        constants=frozenset({1}),
        label="uint8-constant-min",
    ),
    Case(
        "Clip",
        [
            ints(4, 25, low=0, high=2**32, dtype=np.uint32),
            const(3_000_000_000, np.uint32),
            const(4_000_000_000, np.uint32),
        ],
        opset=13,
        constants=frozenset({1, 2}),
        label="uint32-constant",
        in_onnxruntime=False,
    ),
    # Where
    Case("Where", [bools(3, 1), floats(3, 5), floats(5)]),
    Case("Where", [bools(4, 6), ints(4, 6, dtype=np.int64), ints(1, dtype=np.int64)], label="int64"),
    Case(
        "Where",
        [bools(9), ints(9, low=0, high=256, dtype=np.uint8), ints(1, low=0, high=256, dtype=np.uint8)],
        label="uint8",
    ),
    Case("Where", [bools(9), bools(9), bools(1)], label="bool", in_onnxruntime=False),
    Case("Where", [bools(2, 1, 7), halves(3, 1), halves(2, 3, 7)], label="float16"),
]

_CAST_SOURCES: dict[str, Generator] = {
    "float32": floats(5, 23, low=-200.0, high=200.0),
    "float32-nonnegative": floats(5, 23, low=0.0, high=250.0),
    "int32": ints(5, 23, low=-1000, high=1000),
    "int64": ints(5, 23, low=-(2**40), high=2**40, dtype=np.int64),
    "int64-small": ints(5, 23, low=-(2**20), high=2**20, dtype=np.int64),
    "bool": bools(5, 23),
    "uint8": ints(5, 23, low=0, high=256, dtype=np.uint8),
    "float16": halves(5, 23),
}
_T = onnx.TensorProto
_CAST_TARGETS = {
    "float32": _T.FLOAT,
    "float16": _T.FLOAT16,
    "int32": _T.INT32,
    "int64": _T.INT64,
    "bool": _T.BOOL,
    "uint8": _T.UINT8,
}
for source_name, source in _CAST_SOURCES.items():
    for target_name, code in _CAST_TARGETS.items():
        base = source_name.split("-")[0]
        if base == "float32" and target_name == "int64" and source_name != "float32":
            continue
        if base == "int64" and source_name == "int64-small" and target_name != "float32":
            continue
        CASES.append(Case("Cast", [source], {"to": code}, label=f"{source_name}-to-{target_name}"))


def _float64_specials(rng: np.random.Generator) -> np.ndarray:
    """float64 values that exercise every rounding path to float32 and float16."""
    normal = rng.standard_normal(60) * np.exp2(rng.integers(-30, 30, 60))
    ties = np.array([1 + 2.0**-24, 1 + 3 * 2.0**-24, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 65504.0, 65520.0, 65519.99])
    tiny = np.array([1e-39, 1.5e-45, 7e-46, 2.0**-149, 2.0**-150, 3 * 2.0**-151, 6e-8, 3e-8, 1e-300, 5e-324])
    large = np.array([3.4028234e38, 3.4028235677973366e38, 3.5e38, 1e300, np.inf, -np.inf, np.nan, 0.0, -0.0])
    values = np.concatenate([normal, ties, -ties, tiny, -tiny, large])
    return values.astype(np.float64)


def _float32_specials(rng: np.random.Generator) -> np.ndarray:
    """float32 values including subnormals, infinities, NaN and signed zeros."""
    normal = (rng.standard_normal(40) * np.exp2(rng.integers(-60, 60, 40))).astype(np.float32)
    special = np.array([1e-40, -1e-45, 1.2e-38, 3.4e38, np.inf, -np.inf, np.nan, 0.0, -0.0], dtype=np.float32)
    return np.concatenate([normal, special])


CASES += [
    Case("Cast", [_float64_specials], {"to": _T.FLOAT}, label="float64-to-float32"),
    Case("Cast", [_float64_specials], {"to": _T.FLOAT16}, label="float64-to-float16"),
    Case("Cast", [_float32_specials], {"to": _T.DOUBLE}, label="float32-to-float64"),
    Case("Cast", [halves(7, 9)], {"to": _T.DOUBLE}, label="float16-to-float64"),
    Case(
        "Cast", [ints(7, low=-5, high=5, dtype=np.int64)], {"to": _T.DOUBLE}, on_device=False, label="int64-to-float64"
    ),
    Case("Cast", [floats(9, scale=3)], {"to": _T.DOUBLE}, label="float32-to-float64-random"),
    Case("Cast", [lambda rng: rng.standard_normal(9)], {"to": _T.INT32}, on_device=False, label="float64-to-int32"),
    Case("Cast", [wide_ints(6, 11)], {"to": _T.FLOAT}, label="int64-full-range-to-float32"),
    Case("Cast", [wide_ints(6, 11, dtype=np.uint64)], {"to": _T.FLOAT}, label="uint64-to-float32"),
    Case("Cast", [wide_ints(6, 11, dtype=np.uint64)], {"to": _T.INT64}, label="uint64-to-int64"),
    Case("Cast", [wide_ints(6, 11)], {"to": _T.INT16}, label="int64-to-int16"),
    Case("Cast", [wide_ints(6, 11)], {"to": _T.UINT32}, label="int64-to-uint32"),
    Case("Cast", [floats(6, 11, scale=1e12)], {"to": _T.INT64}, label="float32-large-to-int64"),
    Case("Cast", [floats(6, 11, low=0.0, high=1e15)], {"to": _T.UINT64}, label="float32-to-uint64"),
    Case("Cast", [ints(6, 11, low=0, high=2**32, dtype=np.uint32)], {"to": _T.INT64}, label="uint32-to-int64"),
    Case("Cast", [ints(6, 11, low=-(2**15), high=2**15, dtype=np.int16)], {"to": _T.FLOAT}, label="int16-to-float32"),
    Case("Cast", [ints(6, 11, low=0, high=2**16, dtype=np.uint16)], {"to": _T.INT8}, label="uint16-to-int8"),
    Case("Cast", [floats(6, 11, scale=100)], {"to": _T.UINT16}, label="float32-to-uint16"),
]
CASES.append(Case("Cast", [floats(3, 4)], {"to": _T.FLOAT}, opset=6, label="identity-opset6"))


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


# -- helpers and edge cases -------------------------------------------------------------


def test_grid_for_spreads_large_counts_over_two_dimensions() -> None:
    from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

    assert grid_for(1000, 256, DEFAULT_FAKE_LIMITS) == (4, 1, 1)
    assert grid_for(0, 256, DEFAULT_FAKE_LIMITS) == (1, 1, 1)
    x, y, z = grid_for(70_000 * 256, 256, DEFAULT_FAKE_LIMITS)
    assert x <= 65535 and y <= 65535 and z == 1 and x * y >= 70_000


def test_large_elementwise_uses_a_two_dimensional_grid(op_device: BackendDevice) -> None:
    """More than 65535 workgroups of output: the kernel must index through both grid dimensions."""
    count = 65536 * 256 + 1000  # 65540 workgroups of 256
    operator = get_operator("Add", 17)
    rng = np.random.default_rng()
    a = rng.standard_normal(count).astype(np.float32)
    b = np.float32(rng.standard_normal(1)).reshape(1)
    infos = [TensorInfo(a.shape, a.dtype), TensorInfo(b.shape, b.dtype)]
    out = [TensorInfo(a.shape, a.dtype)]
    plan = operator.plan(infos, out, {}, caps_of(op_device), {})
    assert plan.kernels[0].grid[1] > 1
    (result,) = run_plan(op_device, plan, [a, b], out)
    np.testing.assert_array_equal(result, a + b)


def test_bool_output_of_odd_length_writes_whole_words(op_device: BackendDevice) -> None:
    operator = get_operator("Less", 17)
    for count in (1, 2, 3, 5, 1023):
        a = np.arange(count, dtype=np.float32)
        b = np.full(1, count / 2, dtype=np.float32)
        infos = [TensorInfo(a.shape, a.dtype), TensorInfo(b.shape, b.dtype)]
        out = [TensorInfo(a.shape, np.dtype(np.bool_))]
        (result,) = run_plan(op_device, operator.plan(infos, out, {}, caps_of(op_device), {}), [a, b], out)
        np.testing.assert_array_equal(result, a < b)


def test_unsupported_variants_name_the_op() -> None:
    with pytest.raises(UnsupportedOpError, match="Gelu"):
        get_operator("Gelu", 20).reference([np.zeros(2, np.float32)], {"approximate": "erfc"}, [])
    with pytest.raises(UnsupportedOpError, match="Cast"):
        get_operator("Cast", 13).reference([np.zeros(2, np.float32)], {"to": onnx.TensorProto.FLOAT8E4M3FN}, [])
    with pytest.raises(UnsupportedOpError, match="Not"):
        get_operator("Not", 13).reference([np.zeros(2, np.float32)], {}, [])


def test_empty_outputs_need_no_kernel() -> None:
    from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

    caps = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
    info = TensorInfo((0, 3), np.dtype(np.float32))
    assert get_operator("Relu", 14).plan([info], [info], {}, caps, {}).kernels == ()
    assert get_operator("Add", 14).plan([info, info], [info], {}, caps, {}).kernels == ()
