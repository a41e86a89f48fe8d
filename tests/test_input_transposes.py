"""A Transpose read only by a LayerNormalization folded into its reads (``_input_perm``, :mod:`ortgpu._input_transposes`):
ConvNeXt's channels-first blocks, normalisations over several axes, float16, and the cases that keep the Transpose."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps, TensorInfo, get_operator
from ortgpu_core._errors import UnsupportedOpError
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)
RNG = np.random.default_rng(20261208)


def _model(
    shape: tuple[int, ...],
    perm: tuple[int, ...],
    axis: int = -1,
    extra_reader: bool = False,
    transposed_out: bool = False,
    dtype: Any = np.float32,
) -> onnx.ModelProto:
    """X -> Transpose(perm) -> LayerNormalization(axis) -> Y (+ a second reader of the Transpose, or it as an
    output)."""
    logical = tuple(shape[p] for p in perm)
    norm = logical[axis % len(logical) :]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [
        numpy_helper.from_array((RNG.standard_normal(norm) + 1).astype(dtype), "scale"),
        numpy_helper.from_array(RNG.standard_normal(norm).astype(dtype), "bias"),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=list(perm)),
        helper.make_node("LayerNormalization", ["t", "scale", "bias"], ["y"], axis=axis, epsilon=1e-6),
    ]
    outputs = [helper.make_tensor_value_info("y", elem, logical)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["t"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", elem, logical))
    if transposed_out:
        outputs.append(helper.make_tensor_value_info("t", elem, logical))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, shape)], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _steps(model: onnx.ModelProto, x: np.ndarray) -> list[Any]:
    plan = plan_model(load_model(model), {"x": x.shape}, CAPS, input_dtypes={"x": x.dtype})
    return [step for step in plan.steps if step.op_plan is not None and step.op_plan.kernels]


def _compare(env: ortgpu.Env, model: onnx.ModelProto, x: np.ndarray, tolerance: float) -> None:
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        got = session.run(None, {"x": x})
    for actual, expected in zip(got, want):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        scale = float(np.abs(expected.astype(np.float64)).max())
        assert float(np.abs(actual.astype(np.float64) - expected).max()) <= tolerance * scale


@pytest.mark.parametrize(
    "shape,perm,axis",
    [
        ((1, 96, 14, 14), (0, 2, 3, 1), -1),  # ConvNeXt: channels-first, normalised over the channels
        ((2, 40, 7, 9), (0, 2, 3, 1), -1),  # a batch, odd spatial sizes
        ((2, 3, 4, 5), (0, 2, 3, 1), 2),  # over the last two axes of the transposed order
        ((3, 300), (1, 0), -1),  # rows of 3 read 300 apart
        ((2, 5, 1, 6), (2, 0, 3, 1), -1),  # a size-1 axis moved
    ],
)
def test_the_layer_norm_reads_through_the_transpose(
    env: ortgpu.Env, shape: tuple[int, ...], perm: tuple[int, ...], axis: int
) -> None:
    model = _model(shape, perm, axis)
    x = RNG.standard_normal(shape).astype(np.float32) * 3 + 1
    (step,) = _steps(model, x)
    assert step.op_types == ("Transpose", "LayerNormalization") and step.attrs["_input_perm"] == perm
    assert step.inputs[0] == "x"
    _compare(env, model, x, 1e-5)


def test_float16(env: ortgpu.Env) -> None:
    model = _model((1, 64, 6, 6), (0, 2, 3, 1), dtype=np.float16)
    x = (RNG.standard_normal((1, 64, 6, 6)) * 2).astype(np.float16)
    assert [step.op_types for step in _steps(model, x)] == [("Transpose", "LayerNormalization")]
    _compare(env, model, x, 2e-3)


@pytest.mark.parametrize("other", ["extra_reader", "transposed_out"])
def test_a_transpose_read_elsewhere_stays(env: ortgpu.Env, other: str) -> None:
    model = _model((1, 8, 5, 5), (0, 2, 3, 1), **{other: True})
    x = RNG.standard_normal((1, 8, 5, 5)).astype(np.float32)
    assert not any("_input_perm" in step.attrs for step in _steps(model, x))
    _compare(env, model, x, 1e-5)


def test_mean_and_inverse_deviation_outputs(env: ortgpu.Env) -> None:
    model = _model((1, 16, 3, 5), (0, 2, 3, 1))
    norm = model.graph.node[1]
    norm.output.extend(["mean", "inv_std"])
    model.graph.output.extend([helper.make_tensor_value_info(name, 1, (1, 3, 5, 1)) for name in ("mean", "inv_std")])
    x = RNG.standard_normal((1, 16, 3, 5)).astype(np.float32) + 2
    assert [step.op_types for step in _steps(model, x)] == [("Transpose", "LayerNormalization")]
    _compare(env, model, x, 1e-5)


def test_a_product_stores_transposed_rather_than_the_norm_reading_strided() -> None:
    # MatMul -> Transpose (last axis kept last) -> LayerNorm: the product takes the Transpose into its store
    x = RNG.standard_normal((2, 3, 4, 8)).astype(np.float32)
    inits = [
        numpy_helper.from_array(RNG.standard_normal((8, 8)).astype(np.float32), "w"),
        numpy_helper.from_array(np.ones(8, np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("LayerNormalization", ["t", "scale"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", 1, x.shape)],
        [helper.make_tensor_value_info("y", 1, (2, 4, 3, 8))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    steps = _steps(model, x)
    assert [step.op_types for step in steps] == [("MatMul", "Transpose"), ("LayerNormalization",)]


def test_a_bad_permutation_is_refused() -> None:
    operator = get_operator("LayerNormalization", 17)
    info = TensorInfo((2, 3), np.dtype(np.float32))
    scale = TensorInfo((2,), np.dtype(np.float32))
    with pytest.raises(UnsupportedOpError, match="not a permutation"):
        operator.plan([info, scale], [TensorInfo((3, 2), np.dtype(np.float32))], {"_input_perm": (0, 0)}, CAPS, {})
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    (y,) = operator.reference([x, np.ones(2, np.float32)], {"_input_perm": (1, 0)}, [])
    centred = x.T - x.T.mean(axis=-1, keepdims=True)
    np.testing.assert_allclose(y, centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5), rtol=1e-5)
