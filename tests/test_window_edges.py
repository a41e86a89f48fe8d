"""Sliding windows at the edges of their shape rules (issue 12): a window longer than the input, overhanging by
less than a stride, empty outputs, ceil mode, padding.  Every case either matches onnxruntime's CPU provider or
raises a typed error; none may silently write nothing (MaxPool/AveragePool returned zeros for a 2x2 window over a
height-1 input: onnxruntime divides toward zero, so one output row reads the input's only row).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu import ModelError, OrtGpuError

# (input shape, kernel, strides, pads)
GEOMETRIES = [
    ((1, 4, 1, 50), (2, 2), (2, 2), (0, 0, 0, 0)),  # the OCR classifier's case: height 1, window 2
    ((1, 4, 3, 6), (4, 4), (1, 1), (0, 0, 0, 0)),  # window longer than the input by one: no output rows
    ((1, 1, 3, 3), (4, 4), (2, 2), (0, 0, 0, 0)),  # overhang of 1 < stride 2: one output
    ((1, 1, 1, 1), (3, 3), (5, 5), (0, 0, 0, 0)),  # overhang of 2 < stride 5
    ((1, 2, 2, 5), (3, 2), (2, 3), (1, 0, 0, 0)),  # padding at the start, overhang at the end
    ((1, 2, 5, 5), (3, 3), (2, 2), (0, 0, 0, 0)),  # an ordinary case beside them
]


def _model(op_type: str, shape: tuple[int, ...], attrs: dict[str, Any], weight: np.ndarray | None) -> bytes:
    inputs = ["X"] + (["W"] if weight is not None else [])
    node = helper.make_node(op_type, inputs, ["Y"], **attrs)
    graph = helper.make_graph(
        [node],
        "window",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", "c", "h", "w"])],
        [numpy_helper.from_array(weight, "W")] if weight is not None else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def _cases() -> list[tuple[str, tuple[int, ...], dict[str, Any], bool]]:
    cases = []
    for (shape, kernel, strides, pads), ceil_mode in itertools.product(GEOMETRIES, (0, 1)):
        base = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads)}
        cases.append(("MaxPool", shape, {**base, "ceil_mode": ceil_mode}, False))
        for include_pad in (0, 1):
            cases.append(
                ("AveragePool", shape, {**base, "ceil_mode": ceil_mode, "count_include_pad": include_pad}, False)
            )
        for p in (1, 2):
            cases.append(("LpPool", shape, {**base, "ceil_mode": ceil_mode, "p": p}, False))
        if not ceil_mode:
            cases.append(("Conv", shape, base, True))
    return cases


@pytest.mark.parametrize(("op_type", "shape", "attrs", "with_weight"), _cases(), ids=lambda v: str(v).replace(" ", ""))
def test_window_edges_match_onnxruntime_or_raise(
    env: ortgpu.Env, op_type: str, shape: tuple[int, ...], attrs: dict[str, Any], with_weight: bool
) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    weight = rng.standard_normal((3, shape[1], *attrs["kernel_shape"])).astype(np.float32) if with_weight else None
    model = _model(op_type, shape, attrs, weight)
    try:
        (expected,) = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    except Exception:  # noqa: BLE001 - onnxruntime refuses: ortgpu must refuse with a typed error
        with pytest.raises((ModelError, OrtGpuError)):
            with ortgpu.InferenceSession(model, env=env) as session:
                session.run(None, {"X": x})
        return
    with ortgpu.InferenceSession(model, env=env) as session:
        (got,) = session.run(None, {"X": x})
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
