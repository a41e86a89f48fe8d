"""A float16 graph's ``Cast(float32), Softmax, Cast(float16)`` (and LogSoftmax) runs as one float16 Softmax with the
three nodes' values; chains whose middle values are read elsewhere, or that do not widen float16, keep their nodes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)
SHAPE = (3, 5, 37)


def _model(op: str = "Softmax", source: int = TensorProto.FLOAT16, middle_output: bool = False) -> onnx.ModelProto:
    """x (``source``) -> Cast(float32) -> ``op`` over the last axis -> Cast(float16) -> y; ``middle_output``: the
    float32 result is a graph output too."""
    nodes = [
        helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
        helper.make_node(op, ["x32"], ["p32"], axis=-1),
        helper.make_node("Cast", ["p32"], ["y"], to=TensorProto.FLOAT16),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT16, SHAPE)]
    if middle_output:
        outputs.append(helper.make_tensor_value_info("p32", TensorProto.FLOAT, SHAPE))
    graph = helper.make_graph(nodes, "softmax_casts", [helper.make_tensor_value_info("x", source, SHAPE)], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type}_{index}"
    return model


def _steps(model: onnx.ModelProto, dtype: type) -> list[tuple[str, ...]]:
    plan = plan_model(load_model(model), {"x": SHAPE}, CAPS, input_dtypes={"x": np.dtype(dtype)})
    return [step.op_types for step in plan.steps]


def _run(env: ortgpu.Env, model: onnx.ModelProto, x: np.ndarray, fuse: bool) -> list[np.ndarray]:
    with ortgpu.InferenceSession(model.SerializeToString(), env=env, fuse=fuse) as session:
        assert all(p.placement == "webgpu" for p in session.get_node_placement({"x": x.shape}))
        return list(session.run(None, {"x": x}))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_the_three_nodes_run_as_one_float16_softmax(env: ortgpu.Env, op: str) -> None:
    model = _model(op)
    assert _steps(model, np.float16) == [("Cast", op, "Cast")]
    x = (np.random.default_rng(3).standard_normal(SHAPE) * 4).astype(np.float16)
    x[0, 0, :5] = [np.float16(-np.inf), 0, 0, 60000, -60000]  # a masked score, ties, the float16 range's ends
    (folded,) = _run(env, model, x, fuse=True)
    (nodes,) = _run(env, model, x, fuse=False)
    assert folded.dtype == np.float16
    wide = x.astype(np.float64)
    shifted = wide - wide.max(axis=-1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    want = shifted - log_sum if op == "LogSoftmax" else np.exp(shifted - log_sum)
    with np.errstate(over="ignore"):
        finite = np.isfinite(want.astype(np.float16))  # LogSoftmax's -120000 is -inf in float16
    assert np.array_equal(np.isfinite(folded), finite) and np.array_equal(np.isfinite(nodes), finite)
    # both round once from f32 arithmetic: within a float16 rounding of the exact value, and of each other
    limit = 2.0**-10 * np.maximum(np.abs(want[finite]), 2.0**-14)
    assert np.all(np.abs(folded[finite].astype(np.float64) - want[finite]) <= limit)
    assert np.all(np.abs(folded[finite].astype(np.float64) - nodes[finite]) <= 2 * limit)


def test_a_middle_value_read_elsewhere_keeps_the_nodes(env: ortgpu.Env) -> None:
    model = _model(middle_output=True)
    assert len(_steps(model, np.float16)) == 3
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float16)
    y, p32 = _run(env, model, x, fuse=True)
    assert p32.dtype == np.float32 and np.array_equal(y, p32.astype(np.float16))


def test_a_cast_that_does_not_widen_float16_keeps_the_nodes() -> None:
    # float32 -> float32 changes nothing to fold into a float16 kernel; a float64 source would round
    assert len(_steps(_model(source=TensorProto.FLOAT), np.float32)) == 3
    assert len(_steps(_model(source=TensorProto.DOUBLE), np.float64)) == 3
