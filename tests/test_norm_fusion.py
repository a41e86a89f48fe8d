"""RMSNorm as exporters write it (Pow, ReduceMean, Add eps, Sqrt, Div or Reciprocal, Mul, Casts, Mul weight) runs as
one RMSNormalization row kernel, and LayerNorm written out (exports before opset 17: ReduceMean, Sub, Pow or Mul,
ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta) as one LayerNormalization kernel, with the unfused graph's
results; near misses stay unfused and still match."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
F32 = TensorProto.FLOAT
SHAPE = (2, 7, 48)


def rms_norm(
    inverse: str = "div", opset: int = 17, exponent: float = 2.0, axis: int = -1, weight: bool = True
) -> onnx.ModelProto:
    """HF LlamaRMSNorm's export on x [2, 7, 48], x also read by a residual Add."""
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"])]
    if opset >= 18:
        nodes.append(helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1))
    else:
        nodes.append(helper.make_node("ReduceMean", ["p"], ["m"], axes=[axis], keepdims=1))
    nodes += [helper.make_node("Add", ["m", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"])]
    if inverse == "div":
        nodes.append(helper.make_node("Div", ["one", "s"], ["r"]))
    else:
        nodes.append(helper.make_node("Reciprocal", ["s"], ["r"]))
    nodes += [helper.make_node("Mul", ["x", "r"], ["n"]), helper.make_node("Cast", ["n"], ["nc"], to=F32)]
    last = "nc"
    if weight:
        nodes.append(helper.make_node("Mul", ["w", "nc"], ["y"]))
        last = "y"
    nodes.append(helper.make_node("Add", [last, "x"], ["out"]))
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(np.array(exponent, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array([axis], np.int64), "axes"),
        numpy_helper.from_array(rng.standard_normal(SHAPE[-1]).astype(np.float32), "w"),
    ]
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", F32, SHAPE)],
        [helper.make_tensor_value_info("out", F32, SHAPE)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type}_{index}"
    return model


def _fused(model: onnx.ModelProto) -> list[tuple[str, ...]]:
    plan = plan_model(load_model(model), {"x": SHAPE}, CAPS)
    return [step.op_types for step in plan.steps if "fused RMS" in step.reason]


def _check(env: ortgpu.Env, model: onnx.ModelProto) -> None:
    x = (np.random.default_rng(2).standard_normal(SHAPE) * 4).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs", [{}, {"inverse": "reciprocal"}, {"opset": 18}], ids=["div", "reciprocal", "axes-input"]
)
def test_rms_norm_is_one_step(env: ortgpu.Env, kwargs: dict[str, Any]) -> None:
    model = rms_norm(**kwargs)
    groups = _fused(model)
    assert len(groups) == 1 and groups[0][:2] == ("Pow", "ReduceMean") and groups[0][-1] == "Mul"
    assert len(groups[0]) == 8
    assert _fused_unfused_differ(model)
    _check(env, model)


def _fused_unfused_differ(model: onnx.ModelProto) -> bool:
    unfused = plan_model(load_model(model), {"x": SHAPE}, CAPS, fuse=False)
    return not any("fused RMS" in step.reason for step in unfused.steps)


@pytest.mark.parametrize(
    "kwargs", [{"exponent": 3.0}, {"axis": 1}, {"weight": False}], ids=["cube", "other-axis", "no-weight"]
)
def test_near_misses_stay_unfused(env: ortgpu.Env, kwargs: dict[str, Any]) -> None:
    model = rms_norm(**kwargs)
    assert _fused(model) == []
    _check(env, model)


def layer_norm(
    square: str = "pow", beta: bool = True, axis: int = -1, gamma_shape: tuple[int, ...] = (48,)
) -> onnx.ModelProto:
    """torch's nn.LayerNorm exported at opset 14 on x [2, 7, 48], x also read by a residual Add."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[axis], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"]) if square == "pow" else helper.make_node("Mul", ["d", "d"], ["p"]),
        helper.make_node("ReduceMean", ["p"], ["v"], axes=[axis], keepdims=1),
        helper.make_node("Add", ["v", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["g"]),
    ]
    last = "g"
    if beta:
        nodes.append(helper.make_node("Add", ["g", "beta"], ["b"]))
        last = "b"
    nodes.append(helper.make_node("Add", [last, "x"], ["out"]))
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(rng.standard_normal(gamma_shape).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(SHAPE[-1]).astype(np.float32), "beta"),
    ]
    graph = helper.make_graph(
        nodes,
        "layer_norm",
        [helper.make_tensor_value_info("x", F32, SHAPE)],
        [helper.make_tensor_value_info("out", F32, SHAPE)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type}_{index}"
    return model


def _layer_norm_groups(model: onnx.ModelProto) -> list[tuple[str, ...]]:
    plan = plan_model(load_model(model), {"x": SHAPE}, CAPS)
    return [step.op_types for step in plan.steps if "fused layer" in step.reason]


@pytest.mark.parametrize("kwargs", [{}, {"square": "mul"}, {"beta": False}], ids=["pow", "mul-square", "no-beta"])
def test_layer_norm_is_one_step(env: ortgpu.Env, kwargs: dict[str, Any]) -> None:
    model = layer_norm(**kwargs)
    groups = _layer_norm_groups(model)
    assert len(groups) == 1 and groups[0][:2] == ("ReduceMean", "Sub")
    assert len(groups[0]) == (9 if kwargs.get("beta", True) else 8)
    assert not any(
        "fused layer" in s.reason for s in plan_model(load_model(model), {"x": SHAPE}, CAPS, fuse=False).steps
    )
    _check(env, model)


@pytest.mark.parametrize("kwargs", [{"axis": 1}, {"gamma_shape": (1, 48)}], ids=["other-axis", "gamma-not-a-vector"])
def test_layer_norm_near_misses_stay_unfused(env: ortgpu.Env, kwargs: dict[str, Any]) -> None:
    model = layer_norm(**kwargs)
    assert _layer_norm_groups(model) == []
    _check(env, model)
