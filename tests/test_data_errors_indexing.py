"""Invalid indices read at run time by the indexing operators (issue 12): GatherElements, GatherND, ScatterElements,
Scatter, ScatterND and ReverseSequence's ``sequence_lens``.

Their kernels run on the device with the indices a graph input: a valid run matches onnxruntime's CPU provider; an
index out of range (past the end, below ``-size``, or an int64 whose high word is wrong: ``2**32 + 1`` must not read
as 1) flags the run in the program's status words, so ``run()`` raises ``InvalidArgumentError`` (onnxruntime refuses
it too); the next valid run is right again (the status is cleared before each run).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortgpu
from ortgpu import InvalidArgumentError

F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
RNG = np.random.default_rng(12)
HIGH = (1 << 32) + 1  # an int64 whose low word alone reads as 1
LOW_MINUS_ONE = (1 << 32) - 1  # an int64 whose low word alone reads as -1 (a valid index from the end)


def _model(op_type: str, inputs: list[tuple[str, int, list[int]]], opset: int, **attrs: Any) -> bytes:
    node = helper.make_node(op_type, [name for name, _, _ in inputs], ["Y"], **attrs)
    graph = helper.make_graph(
        [node],
        op_type,
        [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in inputs],
        [helper.make_tensor_value_info("Y", F, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# id: (model, feeds with valid data, the name of the index input, invalid values of it)
CASES: dict[str, tuple[bytes, dict[str, np.ndarray], str, list[np.ndarray]]] = {
    "GatherElements": (
        _model("GatherElements", [("X", F, [3, 4]), ("I", I64, [2, 4])], 13, axis=0),
        {"X": _floats(3, 4), "I": np.array([[0, -1, 2, 1], [-3, 2, 0, 0]], np.int64)},
        "I",
        [
            np.array([[0, 3, 2, 1], [0, 0, 0, 0]], np.int64),
            np.array([[0, -4, 2, 1], [0, 0, 0, 0]], np.int64),
            np.array([[0, 1, 2, 1], [0, 0, HIGH, 0]], np.int64),
            np.array([[0, 1, 2, 1], [0, 0, LOW_MINUS_ONE, 0]], np.int64),
        ],
    ),
    "GatherElements-int32-axis1": (
        _model("GatherElements", [("X", F, [3, 5]), ("I", I32, [3, 2])], 13, axis=1),
        {"X": _floats(3, 5), "I": np.array([[4, -5], [0, 1], [-1, 3]], np.int32)},
        "I",
        [np.array([[5, 0], [0, 1], [0, 0]], np.int32), np.array([[0, 0], [0, -6], [0, 0]], np.int32)],
    ),
    "GatherND": (
        _model("GatherND", [("X", F, [2, 3, 4]), ("I", I64, [3, 2])], 13),
        {"X": _floats(2, 3, 4), "I": np.array([[1, -1], [0, 2], [-2, 0]], np.int64)},
        "I",
        [
            np.array([[1, 3], [0, 2], [0, 0]], np.int64),
            np.array([[1, 0], [-3, 2], [0, 0]], np.int64),
            np.array([[1, 0], [0, 2], [HIGH, 0]], np.int64),
        ],
    ),
    "GatherND-batch-dims": (
        _model("GatherND", [("X", F, [2, 3, 4]), ("I", I64, [2, 1, 2])], 13, batch_dims=1),
        {"X": _floats(2, 3, 4), "I": np.array([[[2, 3]], [[-3, 0]]], np.int64)},
        "I",
        [np.array([[[2, 4]], [[0, 0]]], np.int64), np.array([[[0, 0]], [[0, HIGH]]], np.int64)],
    ),
    "ScatterElements": (
        _model("ScatterElements", [("X", F, [4, 3]), ("I", I64, [2, 3]), ("U", F, [2, 3])], 18, axis=0),
        {"X": _floats(4, 3), "I": np.array([[0, -1, 2], [3, 1, -4]], np.int64), "U": _floats(2, 3)},
        "I",
        [
            np.array([[0, 4, 2], [3, 1, 0]], np.int64),
            np.array([[0, 1, 2], [3, -5, 0]], np.int64),
            np.array([[0, 1, HIGH], [3, 1, 0]], np.int64),
        ],
    ),
    "ScatterElements-add": (
        _model(
            "ScatterElements",
            [("X", F, [3, 5]), ("I", I32, [3, 4]), ("U", F, [3, 4])],
            18,
            axis=1,
            reduction="add",
        ),
        {"X": _floats(3, 5), "I": np.array([[0, 0, 4, -1], [1, 2, 3, 1], [-5, 0, 0, 2]], np.int32), "U": _floats(3, 4)},
        "I",
        [np.array([[0, 0, 5, 0], [0, 0, 0, 0], [0, 0, 0, 0]], np.int32)],
    ),
    "Scatter": (
        _model("Scatter", [("X", F, [4, 3]), ("I", I64, [2, 3]), ("U", F, [2, 3])], 10, axis=0),
        {"X": _floats(4, 3), "I": np.array([[0, 1, 2], [3, 2, 1]], np.int64), "U": _floats(2, 3)},
        "I",
        [np.array([[0, 1, 2], [4, 2, 1]], np.int64), np.array([[0, 1, 2], [3, HIGH, 1]], np.int64)],
    ),
    "ScatterND": (
        _model("ScatterND", [("X", F, [4, 5, 2]), ("I", I64, [3, 2]), ("U", F, [3, 2])], 18),
        {"X": _floats(4, 5, 2), "I": np.array([[0, 1], [3, -2], [-4, 4]], np.int64), "U": _floats(3, 2)},
        "I",
        [
            np.array([[0, 5], [3, 0], [0, 4]], np.int64),
            np.array([[-5, 1], [3, 0], [0, 4]], np.int64),
            np.array([[0, 1], [HIGH, 0], [0, 4]], np.int64),
        ],
    ),
    "ScatterND-mul": (
        _model("ScatterND", [("X", F, [4, 3]), ("I", I64, [3, 1]), ("U", F, [3, 3])], 18, reduction="mul"),
        {"X": _floats(4, 3), "I": np.array([[1], [3], [1]], np.int64), "U": _floats(3, 3)},
        "I",
        [np.array([[1], [4], [1]], np.int64), np.array([[1], [3], [HIGH]], np.int64)],
    ),
    "ReverseSequence": (
        _model("ReverseSequence", [("X", F, [4, 3, 2]), ("L", I64, [3])], 10),
        {"X": _floats(4, 3, 2), "L": np.array([4, 1, 0], np.int64)},
        "L",
        [
            np.array([5, 1, 2], np.int64),
            np.array([1, -1, 2], np.int64),
            np.array([1, HIGH, 2], np.int64),
            np.array([LOW_MINUS_ONE, 1, 2], np.int64),
        ],
    ),
    "ReverseSequence-batch-first": (
        _model("ReverseSequence", [("X", F, [2, 5]), ("L", I64, [2])], 10, batch_axis=0, time_axis=1),
        {"X": _floats(2, 5), "L": np.array([3, 5], np.int64)},
        "L",
        [np.array([6, 5], np.int64)],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_runtime_indices_on_the_device_and_invalid_ones_raise(env: ortgpu.Env, case: str) -> None:
    model, feeds, name, bad_values = CASES[case]
    reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    (expected,) = reference.run(None, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        placement = session.get_node_placement({n: a.shape for n, a in feeds.items()})
        assert [p.placement for p in placement] == ["webgpu"], placement
        (good,) = session.run(None, feeds)
        np.testing.assert_allclose(good, expected, rtol=1e-6, atol=1e-6)
        for bad in bad_values:
            with pytest.raises(Exception):  # noqa: B017 - onnxruntime refuses it too (its own exception type)
                reference.run(None, {**feeds, name: bad})
            with pytest.raises(InvalidArgumentError):
                session.run(None, {**feeds, name: bad})
            (again,) = session.run(None, feeds)  # the status is cleared: a valid run after a refused one
            np.testing.assert_array_equal(again, good)
