"""RNN, GRU, LSTM and the preview-training optimizers, run in ortgpu sessions on both backends.

The recurrent operators are judged by onnxruntime's CPU provider on fresh random inputs, over every attribute
variant: directions, activations with their alpha/beta, clip, GRU's ``linear_before_reset``, LSTM's peepholes
and ``input_forget``, absent optional inputs and outputs, ``sequence_lens`` shorter than the sequence.
onnxruntime's CPU kernels have no ``layout`` 1: those cases run onnxruntime on the ``layout`` 0 model with the
batch axis moved, which is what ``layout`` 1 means.  The optimizers (which onnxruntime's CPU provider lacks)
are judged by the pseudo code of their ONNX documents written out here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import onnx
import onnx.helper
import onnxruntime
import pytest

import ortgpu
import ortgpu_core
from ortgpu.ops import DeviceCaps, NotOnDevice, TensorInfo, get_operator
from ortgpu_core._errors import ShapeError, UnsupportedOpError
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

F32, F64 = np.float32, np.float64
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
OUTPUTS = {"RNN": 2, "GRU": 2, "LSTM": 3}


@dataclass
class Case:
    op_type: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    seq: int = 5
    batch: int = 3
    input_size: int = 4
    hidden: int = 6
    #: optional inputs given: "B", "sequence_lens", "initial_h", "initial_c", "P"
    optional: frozenset[str] = frozenset({"B", "initial_h", "initial_c", "P"})
    #: sequence lengths (None: absent input)
    lengths: tuple[int, ...] | None = None
    #: which outputs the node names (others left out)
    outputs: tuple[bool, ...] = (True, True, True)
    opset: int = 14
    dtype: Any = F32
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.op_type}-opset{self.opset}-{self.label}"

    @property
    def directions(self) -> int:
        return 2 if self.attrs.get("direction") == "bidirectional" else 1


def _inputs(case: Case, rng: np.random.Generator) -> list[np.ndarray | None]:
    g, n, d = GATES[case.op_type], case.hidden, case.directions

    def normal(*shape: int, scale: float = 0.5) -> np.ndarray:
        # Drawn in float32 whatever the dtype, so float64 cases hold values float32 holds exactly.
        return (rng.standard_normal(shape) * scale).astype(F32).astype(case.dtype)

    arrays: list[np.ndarray | None] = [
        normal(case.seq, case.batch, case.input_size, scale=1.0),
        normal(d, g * n, case.input_size),
        normal(d, g * n, n),
        normal(d, 2 * g * n) if "B" in case.optional else None,
        None if case.lengths is None else np.array(case.lengths, np.int32),
        normal(d, case.batch, n) if "initial_h" in case.optional else None,
    ]
    if case.op_type == "LSTM":
        arrays.append(normal(d, case.batch, n) if "initial_c" in case.optional else None)
        arrays.append(normal(d, 3 * n) if "P" in case.optional else None)
    return arrays


def _batch_first(case: Case, arrays: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """The layout 1 inputs holding the same values as layout 0 ``arrays``."""
    moved = list(arrays)
    assert arrays[0] is not None
    moved[0] = np.ascontiguousarray(np.swapaxes(arrays[0], 0, 1))
    for index in (5, 6):
        state = arrays[index] if index < len(arrays) else None
        if state is not None:
            moved[index] = np.ascontiguousarray(np.swapaxes(state, 0, 1))
    return moved


def _model(case: Case, arrays: list[np.ndarray | None], layout: int, domain: str = "") -> bytes:
    names = ["" if a is None else f"in{i}" for i, a in enumerate(arrays)]
    while names and names[-1] == "":
        names.pop()
    outputs = [f"out{i}" if wanted else "" for i, wanted in enumerate(case.outputs[: OUTPUTS[case.op_type]])]
    attrs = dict(case.attrs, hidden_size=case.hidden)
    if layout:
        attrs["layout"] = 1
    node = onnx.helper.make_node(case.op_type, names, outputs, **attrs)
    graph = onnx.helper.make_graph(
        [node],
        "recurrent",
        [
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in zip(names, arrays)
            if a is not None
        ],
        [
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(case.dtype)), None)
            for name in outputs
            if name
        ],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", case.opset)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _feeds(arrays: list[np.ndarray | None]) -> dict[str, np.ndarray]:
    return {f"in{i}": a for i, a in enumerate(arrays) if a is not None}


def _onnxruntime(model: bytes, arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in session.run(None, _feeds(arrays))]


def _assert_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    tolerance = 1e-9 if actual.dtype == F64 else 2e-5
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance, err_msg=what)


BI = {"direction": "bidirectional"}
REV = {"direction": "reverse"}
NO_OPTIONAL: frozenset[str] = frozenset()

CASES = [
    # RNN
    Case("RNN", {}, optional=NO_OPTIONAL, label="minimal"),
    Case("RNN", {}, label="bias-initial"),
    Case("RNN", REV, lengths=(5, 2, 4), label="reverse-lengths"),
    Case("RNN", BI, lengths=(3, 5, 1), label="bidirectional-lengths"),
    Case("RNN", REV, lengths=(0, 5, 2), label="reverse-empty-sequence"),
    Case("RNN", {"activations": ["Relu"], "clip": 0.7}, label="relu-clip"),
    Case("RNN", {"activations": ["Affine"], "activation_alpha": [0.6], "activation_beta": [0.2]}, label="affine"),
    Case("RNN", {"activations": ["LeakyRelu"], "activation_alpha": [0.3]}, label="leakyrelu"),
    Case("RNN", {"activations": ["ThresholdedRelu"], "activation_alpha": [0.2]}, label="thresholdedrelu"),
    Case("RNN", {"activations": ["ScaledTanh"], "activation_alpha": [1.5], "activation_beta": [0.7]}, label="st"),
    Case("RNN", {"activations": ["Elu"], "activation_alpha": [0.8]}, label="elu"),
    Case("RNN", {"activations": ["Softsign"]}, label="softsign"),
    Case("RNN", {"activations": ["Softplus"]}, label="softplus"),
    Case("RNN", {"activations": ["HardSigmoid"], "activation_alpha": [0.3], "activation_beta": [0.4]}, label="hs"),
    Case("RNN", {**BI, "activations": ["Sigmoid", "Relu"]}, label="bidirectional-two-activations"),
    Case("RNN", {}, dtype=F64, outputs=(False, True), label="float64-y_h-only"),
    Case("RNN", {}, opset=7, label="opset7"),
    # GRU
    Case("GRU", {}, optional=NO_OPTIONAL, label="minimal"),
    Case("GRU", {"linear_before_reset": 1}, label="linear-before-reset"),
    Case("GRU", {**BI, "linear_before_reset": 1}, lengths=(2, 5, 4), label="bidirectional-lbr-lengths"),
    Case("GRU", REV, lengths=(4, 1, 5), label="reverse-lengths"),
    Case(
        "GRU",
        {"activations": ["HardSigmoid", "Elu"], "activation_alpha": [0.25, 0.9], "activation_beta": [0.45]},
        label="hardsigmoid-elu-params",
    ),
    Case("GRU", {"clip": 0.5}, dtype=F64, label="clip-float64"),
    Case("GRU", {}, opset=7, outputs=(True, False), label="opset7-y-only"),
    Case("GRU", BI, lengths=(5, 2, 3), dtype=np.float16, label="float16-bidirectional-lengths"),
    # LSTM
    Case("LSTM", {}, optional=NO_OPTIONAL, label="minimal"),
    Case("LSTM", {}, label="peepholes"),
    Case("LSTM", {"input_forget": 1}, label="input-forget"),
    Case("LSTM", BI, lengths=(5, 3, 2), label="bidirectional-lengths"),
    Case("LSTM", REV, lengths=(1, 4, 5), label="reverse-lengths"),
    Case("LSTM", BI, lengths=(4, 0, 5), label="bidirectional-empty-sequence"),
    Case(
        "LSTM",
        {"activations": ["Sigmoid", "Softsign", "LeakyRelu"], "activation_alpha": [0.2], "clip": 1.2},
        label="activations-clip",
    ),
    Case(
        "LSTM",
        {
            **BI,
            "activations": ["HardSigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "Affine"],
            "activation_alpha": [0.3, 0.7],
            "activation_beta": [0.4, 0.1],
        },
        label="bidirectional-six-activations",
    ),
    Case("LSTM", {}, dtype=F64, outputs=(False, False, True), label="float64-y_c-only"),
    Case("LSTM", {}, optional=frozenset({"initial_c"}), opset=7, label="opset7-initial-c-only"),
]
LAYOUT_CASES = [
    Case("RNN", BI, lengths=(4, 5, 2), label="layout1-bidirectional"),
    Case("GRU", {"linear_before_reset": 1}, lengths=(5, 3, 1), label="layout1"),
    Case("LSTM", BI, lengths=(2, 5, 3), label="layout1-bidirectional"),
]


def _run_ortgpu(env: ortgpu_core.Env, model: bytes, arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    with ortgpu.InferenceSession(model, env=env) as session:
        return [np.asarray(r) for r in session.run(None, _feeds(arrays))]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recurrent_matches_onnxruntime(case: Case, env: ortgpu_core.Env) -> None:
    arrays = _inputs(case, np.random.default_rng())
    model = _model(case, arrays, layout=0)
    actual = _run_ortgpu(env, model, arrays)
    if case.dtype != F32:
        # onnxruntime's CPU kernels are float32 only: they run on the same values in float32 (the inputs are
        # drawn in float32, or are float16), and the results must agree to the accuracy of the narrower type.
        narrow = Case(**{**case.__dict__, "dtype": F32})
        small = [a.astype(F32) if a is not None and a.dtype == case.dtype else a for a in arrays]
        expected = [e.astype(case.dtype) for e in _onnxruntime(_model(narrow, small, layout=0), small)]
        tolerance = 2e-3 if case.dtype == np.float16 else 1e-5
        for index, (ours, theirs) in enumerate(zip(actual, expected)):
            assert ours.dtype == case.dtype
            np.testing.assert_allclose(
                ours.astype(F64),
                theirs.astype(F64),
                rtol=tolerance,
                atol=tolerance,
                err_msg=f"{case.id} output {index}",
            )
        return
    expected = _onnxruntime(model, arrays)
    assert len(actual) == len(expected) == sum(case.outputs[: OUTPUTS[case.op_type]])
    for index, (ours, theirs) in enumerate(zip(actual, expected)):
        _assert_close(ours, theirs, f"{case.id} output {index}")


@pytest.mark.parametrize("case", LAYOUT_CASES, ids=[c.id for c in LAYOUT_CASES])
def test_batch_first_layout_moves_the_batch_axis(case: Case, env: ortgpu_core.Env) -> None:
    arrays = _inputs(case, np.random.default_rng())
    expected = _onnxruntime(_model(case, arrays, layout=0), arrays)
    moved = _batch_first(case, arrays)
    actual = _run_ortgpu(env, _model(case, moved, layout=1), moved)
    # layout 1: Y [batch, seq, directions, hidden], states [batch, directions, hidden].
    _assert_close(actual[0], np.transpose(expected[0], (2, 0, 1, 3)), f"{case.id} Y")
    for index in range(1, len(actual)):
        _assert_close(actual[index], np.swapaxes(expected[index], 0, 1), f"{case.id} output {index}")


def test_lengths_zero_rows_and_last_valid_state() -> None:
    """Y is zero past each sequence's length; Y_h is Y's last valid row (forward) or its row 0 (reverse)."""
    case = Case("GRU", BI, lengths=(2, 5, 3))
    arrays = _inputs(case, np.random.default_rng(7))
    y, y_h = get_operator("GRU", 14).reference(arrays, dict(BI, hidden_size=case.hidden), [])
    for b, length in enumerate(case.lengths or ()):
        assert not np.any(y[length:, :, b])
        np.testing.assert_array_equal(y_h[0, b], y[length - 1, 0, b])
        np.testing.assert_array_equal(y_h[1, b], y[0, 1, b])


def test_recurrent_plans_stay_on_the_cpu() -> None:
    caps = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
    info = TensorInfo((2, 1, 3), np.dtype(F32))
    for op_type in ("RNN", "GRU", "LSTM"):
        with pytest.raises(NotOnDevice, match=op_type):
            get_operator(op_type, 14).plan([info], [info], {}, caps, {})
    with pytest.raises(NotOnDevice, match="Adam"):
        get_operator("Adam", 1, "ai.onnx.preview.training").plan([info], [info], {}, caps, {})


def test_recurrent_refusals_are_typed() -> None:
    case = Case("LSTM", {})
    arrays = _inputs(case, np.random.default_rng(1))
    lstm = get_operator("LSTM", 14)
    with pytest.raises(UnsupportedOpError, match="Gelu"):
        lstm.reference(arrays, {"activations": ["Gelu", "Tanh", "Tanh"]}, [])
    with pytest.raises(UnsupportedOpError, match="Affine"):
        rnn_inputs = _inputs(Case("RNN", {}), np.random.default_rng(2))
        get_operator("RNN", 14).reference(rnn_inputs, {"activations": ["Affine"], "activation_alpha": [0.5]}, [])
    with pytest.raises(UnsupportedOpError, match="activations"):
        lstm.reference(arrays, {"activations": ["Tanh", "Tanh"]}, [])
    both = _inputs(Case("LSTM", BI), np.random.default_rng(3))
    with pytest.raises(UnsupportedOpError, match="2 direction"):
        lstm.reference(both, {**BI, "activations": ["Sigmoid", "Tanh", "Tanh"]}, [])
    with pytest.raises(UnsupportedOpError, match="int32"):
        lstm.reference([a.astype(np.int32) if a is not None else None for a in arrays], {}, [])
    with pytest.raises(ShapeError, match="W"):
        lstm.reference([arrays[0], arrays[1][:, :-1]] + arrays[2:], {}, [])  # type: ignore[index]
    arrays[4] = np.array([1, 9, 2], np.int32)
    with pytest.raises(ShapeError, match="sequence_lens"):
        lstm.reference(arrays, {}, [])


# -- preview-training optimizers ---------------------------------------------------------

TRAINING = "ai.onnx.preview.training"


def _adagrad(r: float, t: int, attrs: Mapping[str, float], x: Any, g: Any, h: Any) -> list[np.ndarray]:
    rate = r / (1 + t * attrs.get("decay_factor", 0.0))
    g = attrs.get("norm_coefficient", 0.0) * x + g
    h = h + g * g
    return [x - rate * g / (np.sqrt(h) + attrs.get("epsilon", 1e-6)), h]


def _momentum(r: float, t: int, attrs: Mapping[str, Any], x: Any, g: Any, v: Any) -> list[np.ndarray]:
    g = attrs["norm_coefficient"] * x + g
    v = attrs["alpha"] * v + (attrs["beta"] if t > 0 else 1.0) * g
    step = v if attrs["mode"] == "standard" else g + attrs["alpha"] * v
    return [x - r * step, v]


def _adam(r: float, t: int, attrs: Mapping[str, float], x: Any, g: Any, v: Any, h: Any) -> list[np.ndarray]:
    alpha, beta = attrs.get("alpha", 0.9), attrs.get("beta", 0.999)
    g = attrs.get("norm_coefficient", 0.0) * x + g
    v = alpha * v + (1 - alpha) * g
    h = beta * h + (1 - beta) * g * g
    rate = r * np.sqrt(1 - beta**t) / (1 - alpha**t) if t > 0 else r
    x = x - rate * v / (np.sqrt(h) + attrs.get("epsilon", 1e-6))
    return [(1 - attrs.get("norm_coefficient_post", 0.0)) * x, v, h]


OPTIMIZERS: list[tuple[str, Any, int, dict[str, Any], int]] = [
    ("Adagrad", _adagrad, 3, {}, 0),
    ("Adagrad", _adagrad, 3, {"decay_factor": 0.1, "epsilon": 1e-4, "norm_coefficient": 0.01}, 5),
    ("Momentum", _momentum, 3, {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.02}, 0),
    ("Momentum", _momentum, 3, {"alpha": 0.8, "beta": 0.3, "mode": "nesterov", "norm_coefficient": 0.0}, 4),
    ("Adam", _adam, 4, {}, 0),
    ("Adam", _adam, 4, {"alpha": 0.85, "beta": 0.99, "norm_coefficient": 0.01, "norm_coefficient_post": 0.02}, 3),
]


@pytest.mark.parametrize(("dtype", "tensors"), [(F32, 1), (F64, 2)], ids=["float32-one", "float64-two"])
@pytest.mark.parametrize("entry", OPTIMIZERS, ids=[f"{o[0]}-{i}" for i, o in enumerate(OPTIMIZERS)])
def test_optimizers_follow_their_pseudo_code(entry: Any, tensors: int, dtype: Any, env: ortgpu_core.Env) -> None:
    op_type, oracle, groups, attrs, count = entry
    rng = np.random.default_rng()
    shapes = [(3, 4), (5,)][:tensors]
    # State tensors (H) must be non-negative: they accumulate squares.
    values = [np.abs(rng.standard_normal(s)).astype(dtype) for _ in range(groups) for s in shapes]
    r, t = np.array(0.1, dtype), np.array(count, np.int64)
    names = ["R", "T"] + [f"v{i}" for i in range(len(values))]
    outputs = [f"o{i}" for i in range((groups - 1) * tensors)]
    node = onnx.helper.make_node(op_type, names, outputs, domain=TRAINING, **attrs)
    graph = onnx.helper.make_graph(
        [node],
        "optimizer",
        [
            onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, [r, t, *values])
        ],
        [
            onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)
            for n in outputs
        ],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        got = session.run(None, dict(zip(names, [r, t, *values])))
    wide = [v.astype(F64) for v in values]
    for index in range(tensors):
        # FLOAT attributes hold float32 values: the oracle takes them as the model holds them.
        defaults = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6} if op_type == "Adam" else {"epsilon": 1e-6}
        held = {k: float(F32(v)) if isinstance(v, float) else v for k, v in {**defaults, **attrs}.items()}
        expected = oracle(float(r), count, held, *wide[index::tensors])
        for group, want in enumerate(expected):
            ours = np.asarray(got[group * tensors + index])
            assert ours.dtype == dtype
            tolerance = 2e-6 if dtype == F32 else 1e-12
            np.testing.assert_allclose(ours, want.astype(dtype), rtol=tolerance, atol=tolerance, err_msg=op_type)
