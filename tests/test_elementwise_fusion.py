"""Connected elementwise and data-movement steps run as one kernel, with the unfused graph's results.

Chains, broadcasts into a larger shape, diamonds (``x * Sigmoid(x)``), trees with broadcast leaves and the whole
rotary embedding (Transpose, Slice, Neg, Concat, Mul, Add) fuse; a value also read outside the group, a graph
output and a non-float32 intermediate stay steps of their own; a group never needs more storage bindings than the
device has, nor more member evaluations per element than the bound.  Each case runs on both backends against
onnxruntime CPU.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu._elementwise_fusion import FusedElementwise
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
F32 = TensorProto.FLOAT


def _model(
    nodes: list[onnx.NodeProto],
    inputs: Mapping[str, tuple[tuple[int, ...], int]],
    outputs: list[str],
    inits: tuple[onnx.TensorProto, ...] = (),
    output_types: tuple[int, ...] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "elementwise",
        [helper.make_tensor_value_info(name, dtype, shape) for name, (shape, dtype) in inputs.items()],
        [
            helper.make_tensor_value_info(name, dtype, None)
            for name, dtype in zip(outputs, output_types or (F32,) * len(outputs))
        ],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type}_{index}"
    return model


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        shape = tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = (rng.standard_normal(shape) * 3).astype(dtype)
    return feeds


def _groups(model: onnx.ModelProto, caps: DeviceCaps = CAPS) -> list[tuple[str, ...]]:
    """The op types of each fused elementwise step (checks the unfused plan has none)."""
    feeds = _feeds(model)
    shapes = {n: v.shape for n, v in feeds.items()}
    dtypes = {n: v.dtype for n, v in feeds.items()}
    loaded = load_model(model)
    plan = plan_model(loaded, shapes, caps, input_dtypes=dtypes)
    unfused = plan_model(loaded, shapes, caps, input_dtypes=dtypes, fuse=False)
    assert not any(isinstance(step.operator, FusedElementwise) for step in unfused.steps)
    return [step.op_types for step in plan.steps if isinstance(step.operator, FusedElementwise)]


def _check(env: ortgpu.Env, model: onnx.ModelProto) -> None:
    feeds = _feeds(model)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        got = sess.run(None, feeds)
    for actual, want in zip(got, expected):
        assert actual.shape == want.shape and actual.dtype == want.dtype
        if want.dtype == np.float32:
            np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(actual, want)


def _const(name: str, value: Any) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def chain() -> onnx.ModelProto:
    """RMSNorm's tail: 1 / sqrt(mean + eps), then x * that * weight."""
    nodes = [
        helper.make_node("Abs", ["ms"], ["a"]),
        helper.make_node("Add", ["a", "eps"], ["b"]),
        helper.make_node("Sqrt", ["b"], ["c"]),
        helper.make_node("Reciprocal", ["c"], ["d"]),
        helper.make_node("Mul", ["x", "d"], ["e"]),
        helper.make_node("Mul", ["e", "w"], ["y"]),
    ]
    inputs = {"ms": ((2, 5, 1), F32), "x": ((2, 5, 8), F32), "w": ((8,), F32)}
    return _model(nodes, inputs, ["y"], (_const("eps", 1e-6),))


def silu() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["y"]),
    ]
    return _model(nodes, {"x": ((3, 7), F32)}, ["y"])


def rotary() -> onnx.ModelProto:
    """q * cos + r * sin with cos/sin [S, D] broadcast over [B, H, S, D]."""
    nodes = [
        helper.make_node("Mul", ["q", "cos"], ["a"]),
        helper.make_node("Neg", ["r"], ["n"]),
        helper.make_node("Mul", ["n", "sin"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    inputs = {"q": ((1, 2, 5, 4), F32), "r": ((1, 2, 5, 4), F32), "cos": ((5, 4), F32), "sin": ((5, 4), F32)}
    return _model(nodes, inputs, ["y"])


def rotate_half() -> onnx.ModelProto:
    """HF rotary embedding on heads split by a Transpose: q * cos + cat(-q[..., D/2:], q[..., :D/2]) * sin."""
    nodes = [
        helper.make_node("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Slice", ["q", "half", "end", "last"], ["upper"]),
        helper.make_node("Slice", ["q", "zero", "half", "last"], ["lower"]),
        helper.make_node("Neg", ["upper"], ["negated"]),
        helper.make_node("Concat", ["negated", "lower"], ["rotated"], axis=-1),
        helper.make_node("Mul", ["q", "cos"], ["a"]),
        helper.make_node("Mul", ["rotated", "sin"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    ints = [
        numpy_helper.from_array(np.array([value], np.int64), name)
        for name, value in (("half", 4), ("end", 8), ("zero", 0), ("last", -1))
    ]
    inputs = {"q4": ((2, 5, 3, 8), F32), "cos": ((5, 8), F32), "sin": ((5, 8), F32)}
    return _model(nodes, inputs, ["y"], tuple(ints))


def test_chains_diamonds_and_trees_fuse() -> None:
    # [2, 5, 1] then [2, 5, 8]: the products read the reciprocal through broadcasting, inside the kernel
    assert _groups(chain()) == [("Abs", "Add", "Sqrt", "Reciprocal", "Mul", "Mul")]
    assert _groups(silu()) == [("Sigmoid", "Mul")]
    assert sorted(_groups(rotary())[0]) == ["Add", "Mul", "Mul", "Neg"]
    # data movement joins too: the whole rotary embedding, its heads' Transpose included, is one kernel
    assert [sorted(group) for group in _groups(rotate_half())] == [
        ["Add", "Concat", "Mul", "Mul", "Neg", "Slice", "Slice", "Transpose"]
    ]


@pytest.mark.parametrize("build", [chain, silu, rotary, rotate_half], ids=["chain", "silu", "rotary", "rotate-half"])
def test_fused_groups_match_onnxruntime(env: ortgpu.Env, build: Any) -> None:
    _check(env, build())


def test_values_read_outside_the_group_stay_steps(env: ortgpu.Env) -> None:
    nodes = [
        helper.make_node("Add", ["x", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Exp", ["b"], ["c"]),  # b is also a graph output
        helper.make_node("Neg", ["a"], ["d"]),
        helper.make_node("ReduceSum", ["d"], ["e"], keepdims=1),  # not elementwise
        helper.make_node("Mul", ["c", "e"], ["y"]),
    ]
    model = _model(nodes, {"x": ((4, 6), F32)}, ["y", "b"])
    groups = _groups(model)
    for group in groups:
        assert "Relu" not in group[:-1]  # b leaves the group, so Relu can only be a root
        assert "ReduceSum" not in group
    assert ("Exp", "Mul") in groups
    _check(env, model)


def test_non_float_intermediates_stay_steps(env: ortgpu.Env) -> None:
    nodes = [
        helper.make_node("Add", ["i", "i"], ["twice"]),  # int32 intermediate: not held in a register
        helper.make_node("Cast", ["twice"], ["f"], to=F32),
        helper.make_node("Abs", ["col"], ["c"]),  # [4, 1], broadcast into [4, 6]
        helper.make_node("Mul", ["f", "c"], ["m"]),
        helper.make_node("Greater", ["m", "x"], ["y"]),  # a bool root
    ]
    inputs = {"i": ((4, 6), TensorProto.INT32), "col": ((4, 1), F32), "x": ((4, 6), F32)}
    model = _model(nodes, inputs, ["y"], output_types=(TensorProto.BOOL,))
    assert _groups(model) == [("Cast", "Abs", "Mul", "Greater")]
    _check(env, model)


def test_groups_stay_within_the_storage_binding_limit(env: ortgpu.Env) -> None:
    count = 12
    nodes = [helper.make_node("Add", ["x0", "x1"], ["s1"])]
    nodes += [helper.make_node("Add", [f"s{k - 1}", f"x{k}"], [f"s{k}"]) for k in range(2, count)]
    model = _model(nodes, {f"x{k}": ((3, 5), F32) for k in range(count)}, [f"s{count - 1}"])
    limit = CAPS.limits.max_storage_buffers_per_shader_stage
    groups = _groups(model)
    assert groups and all(len(group) + 2 <= limit for group in groups)  # n chained Adds read n + 1 inputs
    _check(env, model)


def test_recomputation_is_bounded(env: ortgpu.Env) -> None:
    """Each Add reads the one before twice: fusing them all would evaluate the first 2^5 times per element."""
    nodes = [helper.make_node("Abs", ["x"], ["a0"])]
    nodes += [helper.make_node("Add", [f"a{k}", f"a{k}"], [f"a{k + 1}"]) for k in range(6)]
    model = _model(nodes, {"x": ((3, 4), F32)}, ["a6"])
    groups = _groups(model)
    assert len(groups) >= 2 and sum(len(group) for group in groups) == 7
    _check(env, model)


def test_views_join_the_data_movement_around_them(env: ortgpu.Env) -> None:
    """Grouped K/V heads repeated as HF writes it (Transpose, Unsqueeze, Expand, Reshape) before a MatMul: one
    kernel, the views read through as the identity."""
    nodes = [
        helper.make_node("Transpose", ["v4"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("Unsqueeze", ["v", "two"], ["u"]),
        helper.make_node("Expand", ["u", "wide"], ["e"]),
        helper.make_node("Reshape", ["e", "heads"], ["r"]),
        helper.make_node("MatMul", ["p", "r"], ["y"]),
    ]
    ints = [
        numpy_helper.from_array(np.array(value, np.int64), name)
        for name, value in (("two", [2]), ("wide", [1, 2, 3, 5, 4]), ("heads", [1, 6, 5, 4]))
    ]
    model = _model(nodes, {"v4": ((1, 5, 2, 4), F32), "p": ((1, 6, 5, 5), F32)}, ["y"], tuple(ints))
    assert _groups(model) == [("Transpose", "Unsqueeze", "Expand", "Reshape")]
    _check(env, model)


def test_views_alone_stay_views(env: ortgpu.Env) -> None:
    """Chained views with nothing else around them (a Reshape of a Reshape before a MatMul) stay views: fused, they
    would become a copy kernel."""
    nodes = [
        helper.make_node("Reshape", ["x", "heads"], ["r1"]),
        helper.make_node("Reshape", ["r1", "rows"], ["r2"]),
        helper.make_node("MatMul", ["r2", "w"], ["y"]),
    ]
    ints = [
        numpy_helper.from_array(np.array(value, np.int64), name)
        for name, value in (("heads", [1, 6, 2, 4]), ("rows", [6, 8]))
    ]
    model = _model(nodes, {"x": ((1, 6, 8), F32), "w": ((8, 3), F32)}, ["y"], tuple(ints))
    assert _groups(model) == []
    feeds = _feeds(model)
    plan = plan_model(load_model(model), {n: v.shape for n, v in feeds.items()}, CAPS)
    assert [step.reason.startswith("no kernel") for step in plan.steps] == [True, True, False]
    _check(env, model)
