"""Relative precision where outputs are tiny: activations and exp/log-based operators on inputs that make them so
(a text detector's Sigmoid map of ~1e-5 once differed from onnxruntime by 1e-2 relative).  Each output is checked
against float64 math, in float32, on both backends: the forms that cancel (``1 + erf`` and ``1 + tanh`` for
negative x, ``x / 6 + 0.5`` near -3, ``log`` near 1) are the ones written out."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import ortgpu


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


_ERFC = np.frompyfunc(math.erfc, 1, 1)
_TANH_GELU = 2.0 * math.sqrt(2.0 / math.pi)

#: (op type, domain, attributes, float32 inputs, float64 reference, relative tolerance)
CASES: list[tuple[str, str, dict[str, Any], np.ndarray, Callable[[np.ndarray], np.ndarray], float]] = [
    ("Sigmoid", "", {}, np.linspace(-80, -4, 257), _sigmoid, 1e-5),
    ("Softplus", "", {}, np.linspace(-80, -4, 257), lambda x: np.log1p(np.exp(x)), 1e-5),
    ("Log", "", {}, np.linspace(1 - 1e-3, 1 + 1e-3, 257), np.log, 1e-5),
    ("Tanh", "", {}, np.linspace(-1e-3, 1e-3, 257), np.tanh, 1e-5),
    ("Elu", "", {}, np.linspace(-1e-3, -1e-7, 257), np.expm1, 1e-5),
    ("HardSwish", "", {}, np.linspace(-3.1, -2.9, 257), lambda x: x * np.clip((x + 3) / 6, 0, 1), 1e-5),
    (
        "Gelu",
        "",
        {},
        np.linspace(-12, -1, 257),
        lambda x: 0.5 * x * np.asarray(_ERFC(-x / math.sqrt(2.0)), np.float64),
        1e-4,
    ),
    (
        "Gelu",
        "",
        {"approximate": "tanh"},
        np.linspace(-8, -1, 257),
        lambda x: x * _sigmoid(_TANH_GELU * (x + 0.044715 * x**3)),
        1e-4,
    ),
    (
        "FastGelu",
        "com.microsoft",
        {},
        np.linspace(-8, -1, 257),
        lambda x: x * _sigmoid(_TANH_GELU * (x + 0.044715 * x**3)),
        1e-4,
    ),
]


def _model(op_type: str, domain: str, attrs: dict[str, Any], size: int) -> bytes:
    x = oh.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [size])
    y = oh.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [size])
    node = oh.make_node(op_type, ["X"], ["Y"], domain=domain, **attrs)
    opsets = [oh.make_opsetid("", 21)] + ([oh.make_opsetid(domain, 1)] if domain else [])
    return bytes(oh.make_model(oh.make_graph([node], "tiny", [x], [y]), opset_imports=opsets).SerializeToString())


@pytest.mark.parametrize(
    ("op_type", "domain", "attrs", "values", "reference", "tolerance"),
    CASES,
    ids=[f"{c[0]}{'-' + c[2]['approximate'] if c[2] else ''}" for c in CASES],
)
def test_tiny_outputs_keep_their_relative_precision(
    env: ortgpu.Env,
    op_type: str,
    domain: str,
    attrs: dict[str, Any],
    values: np.ndarray,
    reference: Callable[[np.ndarray], np.ndarray],
    tolerance: float,
) -> None:
    x = values.astype(np.float32)
    expected = reference(x.astype(np.float64))
    with ortgpu.InferenceSession(_model(op_type, domain, attrs, x.size), env=env, allow_cpu_fallback=False) as sess:
        (y,) = sess.run(None, {"X": x})
    tiny = np.abs(expected) > 1e-37  # below float32's normal range the output flushes or is subnormal
    relative = np.abs(y[tiny].astype(np.float64) - expected[tiny]) / np.abs(expected[tiny])
    worst = int(np.argmax(relative))
    assert relative.max() < tolerance, (op_type, float(x[tiny][worst]), float(expected[tiny][worst]), relative.max())
