"""bfloat16 as a storage type: values, models, elementwise kernels and the CPU fallback, on both backends.

numpy has no bfloat16; ml_dtypes' type (onnx's own numpy type for it) holds such arrays, and raw uint16 arrays come
in with an explicit ONNX element type (16).  On the device a bfloat16 element is the high half of an f32: kernels
read it by a shift, compute in f32 and store rounded to nearest even, so every result here is the float32 result
rounded once, which the tests compute with numpy and ml_dtypes.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu_core._errors import DtypeError

BF16 = np.dtype(ml_dtypes.bfloat16)
BF = TensorProto.BFLOAT16


def _bf(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(BF16)


def _model(nodes: list[Any], inputs: dict[str, tuple[int, int]], outputs: dict[str, int], inits: Any = ()) -> bytes:
    graph = helper.make_graph(
        nodes,
        "bf16",
        [helper.make_tensor_value_info(name, BF, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, kind, None) for name, kind in outputs.items()],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()


def _placements(session: ortgpu.InferenceSession, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    return {p.op_type: p.placement for p in session.get_node_placement(shapes)}


def test_values_round_trip_and_are_typed(env: ortgpu.Env) -> None:
    host = _bf([[1.5, -2.25, 3.0e38], [np.inf, -0.0, 1e-40]])
    value = env.shared_allocator().from_numpy(host)
    try:
        assert value.dtype == BF16
        back = value.to_numpy()
        assert back.dtype == BF16
        assert back.view(np.uint16).tolist() == host.view(np.uint16).tolist()
        update = _bf([[7.0, 8.0, 9.0], [10.0, 11.0, 12.0]])
        value.update_inplace(update)
        assert value.to_numpy().view(np.uint16).tolist() == update.view(np.uint16).tolist()
    finally:
        value.release()


def test_raw_uint16_with_the_bfloat16_element_type() -> None:
    raw = _bf([1.0, -3.5, 0.125]).view(np.uint16)
    value = ortgpu.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, TensorProto.BFLOAT16)
    assert value.numpy().dtype == BF16
    assert value.numpy().astype(np.float32).tolist() == [1.0, -3.5, 0.125]
    assert value.data_type() == "tensor(bfloat16)"
    with pytest.raises(DtypeError, match="item size"):
        ortgpu.OrtValue.ortvalue_from_numpy_with_onnx_type(raw.astype(np.float32), TensorProto.BFLOAT16)


def test_elementwise_chain_runs_on_the_device(env: ortgpu.Env) -> None:
    weight = _bf(np.linspace(-2.0, 2.0, 12).reshape(3, 4))
    nodes = [
        helper.make_node("Add", ["x", "w"], ["s"]),
        helper.make_node("Mul", ["s", "x"], ["m"]),
        helper.make_node("Div", ["m", "w"], ["d"]),
        helper.make_node("Neg", ["d"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("Sub", ["r", "e"], ["y0"]),
        helper.make_node("Clip", ["y0", "lo", "hi"], ["y"]),
        helper.make_node("Less", ["x", "w"], ["less"]),
        helper.make_node("Transpose", ["y"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["wide"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["wide"], ["narrow"], to=BF),
    ]
    inits = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(_bf(-3.0).reshape(()), "lo"),
        numpy_helper.from_array(_bf(3.0).reshape(()), "hi"),
    ]
    outputs = {"y": BF, "less": TensorProto.BOOL, "wide": TensorProto.FLOAT, "narrow": BF}
    model = _model(nodes, {"x": (3, 4)}, outputs, inits)
    x = _bf(np.random.default_rng(0).standard_normal((3, 4)))
    with ortgpu.InferenceSession(model, env=env) as session:
        assert set(_placements(session, {"x": (3, 4)}).values()) == {"webgpu"}
        assert session.get_inputs()[0].type == "tensor(bfloat16)"
        y, less, wide, narrow = session.run(None, {"x": x})

    def once(value: np.ndarray) -> np.ndarray:  # a float32 result rounded to bfloat16
        return value.astype(np.float32).astype(BF16)

    xf, wf = x.astype(np.float32), weight.astype(np.float32)
    s = once(xf + wf)
    m = once(s.astype(np.float32) * xf)
    d = once(m.astype(np.float32) / wf)
    r = once(np.maximum(-d.astype(np.float32), 0))
    e = once(np.exp(xf))
    want = once(np.clip(r.astype(np.float32) - e.astype(np.float32), -3, 3))
    assert y.dtype == BF16 and narrow.dtype == BF16 and wide.dtype == np.float32
    # Exp is the driver's f32 exp, a few f32 ulps from numpy's: at most one bfloat16 step apart after rounding
    np.testing.assert_allclose(y.astype(np.float32), want.astype(np.float32), rtol=2**-7, atol=2**-7)
    np.testing.assert_array_equal(less, xf < wf)
    np.testing.assert_array_equal(wide, y.astype(np.float32).T)
    np.testing.assert_array_equal(narrow.view(np.uint16), y.T.copy().view(np.uint16))


def test_cast_to_bfloat16_rounds_to_nearest_even(env: ortgpu.Env) -> None:
    bits = np.array(
        [
            0x3F808000,  # a tie, even below: rounds down
            0x3F818000,  # a tie, odd below: rounds up
            0x3F808001,  # just above a tie: up
            0x7F7FFFFF,  # float32's largest: rounds to infinity
            0x7FC00001,  # a quiet NaN with payload
            0x7F800001,  # a signalling NaN: stays NaN
            0x80000000,  # -0
            0x00000001,  # the smallest subnormal: rounds to 0
            0x00018000,  # a subnormal tie
            0xFF800000,  # -inf
        ],
        dtype=np.uint32,
    )
    values = bits.view(np.float32).reshape(2, 5)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=BF)],
        "cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 5))],
        [helper.make_tensor_value_info("y", BF, (2, 5))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    with ortgpu.InferenceSession(model, env=env) as session:
        assert _placements(session, {"x": (2, 5)}) == {"Cast": "webgpu"}
        (y,) = session.run(None, {"x": values})
    with np.errstate(invalid="ignore"):  # numpy warns on converting the NaNs
        want = values.astype(BF16).view(np.uint16).reshape(-1)
    got = y.view(np.uint16).reshape(-1)
    is_nan = np.isnan(values.reshape(-1))
    np.testing.assert_array_equal(got[~is_nan], want[~is_nan])
    assert np.isnan(y.astype(np.float32).reshape(-1)[is_nan]).all()


def test_an_operator_without_a_bfloat16_kernel_computes_in_float32_on_the_cpu(env: ortgpu.Env) -> None:
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": (4, 8), "b": (8, 3)}, {"y": BF})
    rng = np.random.default_rng(1)
    a, b = _bf(rng.standard_normal((4, 8))), _bf(rng.standard_normal((8, 3)))
    with ortgpu.InferenceSession(model, env=env) as session:
        placement = session.get_node_placement({"a": (4, 8), "b": (8, 3)})
        assert placement[0].placement == "cpu" and "bfloat16" in placement[0].reason
        (y,) = session.run(None, {"a": a, "b": b})
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16)
    assert y.dtype == BF16
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))


def test_a_feed_of_another_dtype_is_refused(env: ortgpu.Env) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 2)}, {"y": BF})
    with ortgpu.InferenceSession(model, env=env) as session:
        with pytest.raises(DtypeError, match=r"bfloat16 in the model, got float32.*ml_dtypes\.bfloat16"):
            session.run(None, {"x": np.ones((2, 2), np.float32)})
        (y,) = session.run(None, {"x": _bf(np.full((2, 2), -1.5))})
        assert y.astype(np.float32).tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_bfloat16_initializers_load_as_bfloat16() -> None:
    weight = _bf([[0.5, 1.5]])
    tensor = numpy_helper.from_array(weight, "w")
    assert tensor.data_type == BF
    model = onnx.load_from_string(
        _model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": (1, 2)}, {"y": BF}, [tensor])
    )
    with ortgpu.InferenceSession(model.SerializeToString()) as session:
        (y,) = session.run(None, {"x": _bf([[1.0, 2.0]])})
    assert y.astype(np.float32).tolist() == [[1.5, 3.5]]
