"""Invalid data found on the device (issue 12): a Gather index fed at run time that is out of range.

ONNX makes it an error and onnxruntime refuses it; the WGSL kernel can only clamp it (it must read somewhere), so it
flags the run in the program's status words and every path that returns results raises ``InvalidArgumentError``
instead: ``run()``, ``run_with_ort_values()``, ``run_with_iobinding()``, capture, ``replay_and_read()`` and verify
mode.  The next valid run is unaffected (the status is cleared before each run), and host outputs of a refused run
are left as they were.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu import InvalidArgumentError

TABLE = np.arange(40, dtype=np.float32).reshape(10, 4)


def _embedding(index_type: int) -> bytes:
    """An embedding lookup (Gather on a weight table) followed by a Relu, so the Gather runs on the device."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0), helper.make_node("Relu", ["rows"], ["Y"])]
    graph = helper.make_graph(
        nodes,
        "embedding",
        [helper.make_tensor_value_info("ids", index_type, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3, 4])],
        [numpy_helper.from_array(TABLE, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # onnxruntime 1.31 (the GPU machine's) reads IR versions up to 13
    return bytes(model.SerializeToString())


BAD_INDICES = {
    "past_the_end": [[0, 1, 10], [2, 3, 4]],
    "below_minus_size": [[0, -11, 1], [2, 3, 4]],
    "int64_high_word": [[0, 1, 2], [3, 4, (1 << 32) + 1]],  # its low word alone reads as 1
}


# every bad-index case with int64 indices, and those int32 can hold with int32 indices
CASES = [(case, np.int64) for case in sorted(BAD_INDICES)] + [
    (case, np.int32) for case in sorted(BAD_INDICES) if case != "int64_high_word"
]


@pytest.mark.parametrize(("case", "dtype"), CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_out_of_range_runtime_index_raises_on_every_path(env: ortgpu.Env, case: str, dtype: type) -> None:
    onnx_type = TensorProto.INT64 if dtype is np.int64 else TensorProto.INT32
    model = _embedding(onnx_type)
    good = np.array([[0, 1, 9], [-1, -10, 4]], dtype=dtype)
    bad = np.array(BAD_INDICES[case], dtype=dtype)
    reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime refuses it too (its own exception type)
        reference.run(None, {"ids": bad})
    with ortgpu.InferenceSession(model, env=env) as session:
        placement = session.get_node_placement({"ids": bad.shape})
        assert all(p.placement == "webgpu" for p in placement), placement
        with pytest.raises(InvalidArgumentError, match="index out of range"):
            session.run(None, {"ids": bad})
        (y,) = session.run(None, {"ids": good})  # the status is cleared: a valid run after a refused one
        np.testing.assert_array_equal(y, reference.run(None, {"ids": good})[0])
        with pytest.raises(InvalidArgumentError, match="index out of range"):
            session.run_with_ort_values(None, {"ids": ortgpu.OrtValue.ortvalue_from_numpy(bad)})
        # IOBinding with a host output: a refused run leaves it as it was
        binding = session.io_binding()
        binding.bind_cpu_input("ids", bad)
        host_out = ortgpu.OrtValue.ortvalue_from_numpy(np.full((2, 3, 4), 7, np.float32))
        binding.bind_output("Y", host_out)
        with pytest.raises(InvalidArgumentError, match="index out of range"):
            session.run_with_iobinding(binding)
        np.testing.assert_array_equal(host_out.numpy(), np.full((2, 3, 4), 7, np.float32))


def test_captured_graph_reports_bad_indices_where_it_reads_back(env: ortgpu.Env) -> None:
    """Capture runs once (a bad index then refuses the capture); replay_and_read and verify mode raise; a
    plain replay reads nothing back (documented) and the next replay_and_read on good indices is right."""
    model = _embedding(TensorProto.INT64)
    reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    good = np.array([[0, 1, 9], [-1, -10, 4]], dtype=np.int64)
    bad = np.array(BAD_INDICES["past_the_end"], dtype=np.int64)
    with ortgpu.InferenceSession(model, env=env, graph_capture=True) as session:
        ids = session.allocator.from_numpy(bad)
        y = session.allocator.empty((2, 3, 4), "float32")
        binding = session.io_binding()
        binding.bind_input("ids", ids)
        binding.bind_output("Y", y)
        with pytest.raises(InvalidArgumentError, match="index out of range"):
            session.capture(binding, graph_id=0)
        assert session.captured_graph_ids == []
        ids.update_inplace(good)
        graph = session.capture(binding, graph_id=0)
        ids.update_inplace(bad)
        with pytest.raises(InvalidArgumentError, match="index out of range"):
            graph.replay_and_read()
        with pytest.raises(InvalidArgumentError, match="index out of range"):
            graph.replay(verify=True)
        ids.update_inplace(good)
        (out,) = graph.replay_and_read()
        np.testing.assert_array_equal(out, reference.run(None, {"ids": good})[0])
        graph.release()


def _single_node(op_type: str, inputs: list[tuple[str, int, list[int]]], opset: int, **attrs: object) -> bytes:
    node = helper.make_node(op_type, [name for name, _, _ in inputs], ["Y"], **attrs)
    graph = helper.make_graph(
        [node],
        op_type,
        [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in inputs],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return bytes(model.SerializeToString())


F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(5)
FLAGGED = {
    # op: (model, feeds with valid data, the name and an invalid value of the data input)
    "NegativeLogLikelihoodLoss": (
        _single_node("NegativeLogLikelihoodLoss", [("X", F, [3, 4]), ("T", I64, [3])], 13, reduction="none"),
        {"X": RNG.standard_normal((3, 4)).astype(np.float32), "T": np.array([0, 3, 1], np.int64)},
        ("T", np.array([0, 4, 1], np.int64)),
    ),
    "RotaryEmbedding": (
        _single_node(
            "RotaryEmbedding", [("X", F, [1, 2, 3, 4]), ("C", F, [5, 2]), ("S", F, [5, 2]), ("P", I64, [1, 3])], 23
        ),
        {
            "X": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32),
            "C": RNG.standard_normal((5, 2)).astype(np.float32),
            "S": RNG.standard_normal((5, 2)).astype(np.float32),
            "P": np.array([[0, 4, 2]], np.int64),
        },
        ("P", np.array([[0, 5, 2]], np.int64)),
    ),
    "TensorScatter": (
        _single_node("TensorScatter", [("K", F, [2, 6, 3]), ("U", F, [2, 2, 3]), ("W", I64, [2])], 24, axis=1),
        {
            "K": RNG.standard_normal((2, 6, 3)).astype(np.float32),
            "U": RNG.standard_normal((2, 2, 3)).astype(np.float32),
            "W": np.array([0, 4], np.int64),
        },
        ("W", np.array([0, 5], np.int64)),
    ),
}


@pytest.mark.parametrize("op_type", sorted(FLAGGED))
def test_other_kernels_flag_invalid_data(env: ortgpu.Env, op_type: str) -> None:
    """Labels, position ids and write indices read at run time: on the device when valid, and a typed error (as
    in the reference, and onnxruntime where it has the operator) when not."""
    model, feeds, (name, bad) = FLAGGED[op_type]
    with ortgpu.InferenceSession(model, env=env) as session:
        placement = session.get_node_placement({n: a.shape for n, a in feeds.items()})
        assert [p.placement for p in placement] == ["webgpu"], placement
        (good,) = session.run(None, feeds)
        assert np.isfinite(good).all()
        with pytest.raises(InvalidArgumentError):
            session.run(None, {**feeds, name: bad})
        (again,) = session.run(None, feeds)
        np.testing.assert_array_equal(again, good)
