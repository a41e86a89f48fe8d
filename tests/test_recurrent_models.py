"""Recurrent and control-flow models with real-world structure (issue 13), built from seeded generators, on both
backends against onnxruntime's CPU provider on fresh inputs (relative error <= 1e-4): a CNN + 2-layer bidirectional
LSTM text recognizer, a GRU encoder fed ``sequence_lens``, a streaming voice-activity model with state inputs and
outputs and an ``If`` on its sample rate, and a ``Loop`` that decodes greedily for a fixed number of steps.

These run their recurrent and control-flow nodes on the CPU today (``get_node_placement`` says so; a graph with a
CPU node cannot be captured).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu

F = TensorProto.FLOAT


def _weights(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, initializers: list, opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "recurrent", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def lstm_recognizer() -> bytes:
    """Conv + ReLU + MaxPool over a text-line image, columns as the sequence, two bidirectional LSTM layers, a linear
    classifier per time step (the CRNN shape of OCR recognizers)."""
    rng = np.random.default_rng(61)
    hidden, classes = 12, 7
    init = [
        numpy_helper.from_array(_weights(rng, 8, 1, 3, 3), "conv_w"),
        numpy_helper.from_array(_weights(rng, 2, 4 * hidden, 8 * 4), "w1"),
        numpy_helper.from_array(_weights(rng, 2, 4 * hidden, hidden), "r1"),
        numpy_helper.from_array(_weights(rng, 2, 8 * hidden, scale=0.1), "b1"),
        numpy_helper.from_array(_weights(rng, 2, 4 * hidden, 2 * hidden), "w2"),
        numpy_helper.from_array(_weights(rng, 2, 4 * hidden, hidden), "r2"),
        numpy_helper.from_array(_weights(rng, 2 * hidden, classes), "fc"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), "seq_shape"),
        numpy_helper.from_array(np.array([0, 0, 2 * hidden], np.int64), "merge_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv_w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),  # [1, 8, 4, W/2]
        helper.make_node("Transpose", ["p"], ["t"], perm=[3, 0, 1, 2]),  # [T, 1, 8, 4]
        helper.make_node("Reshape", ["t", "seq_shape"], ["seq"]),  # [T, 1, 32]
        helper.make_node("LSTM", ["seq", "w1", "r1", "b1"], ["y1"], hidden_size=hidden, direction="bidirectional"),
        helper.make_node("Transpose", ["y1"], ["y1t"], perm=[0, 2, 1, 3]),  # [T, 1, 2, H]
        helper.make_node("Reshape", ["y1t", "merge_shape"], ["m1"]),  # [T, 1, 2H]
        helper.make_node("LSTM", ["m1", "w2", "r2"], ["y2"], hidden_size=hidden, direction="bidirectional"),
        helper.make_node("Transpose", ["y2"], ["y2t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["y2t", "merge_shape"], ["m2"]),
        helper.make_node("MatMul", ["m2", "fc"], ["logits"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("image", F, [1, 1, 8, 24])],
        [helper.make_tensor_value_info("logits", F, None)],
        init,
    )


def gru_encoder() -> bytes:
    """A GRU over a padded batch whose true lengths come in as ``sequence_lens`` (linear_before_reset, initial state)."""
    rng = np.random.default_rng(67)
    hidden, features = 10, 6
    init = [
        numpy_helper.from_array(_weights(rng, 1, 3 * hidden, features), "w"),
        numpy_helper.from_array(_weights(rng, 1, 3 * hidden, hidden), "r"),
        numpy_helper.from_array(_weights(rng, 1, 6 * hidden, scale=0.1), "b"),
    ]
    nodes = [
        helper.make_node(
            "GRU", ["x", "w", "r", "b", "lengths", "h0"], ["y", "y_h"], hidden_size=hidden, linear_before_reset=1
        )
    ]
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("x", F, [7, 3, features]),
            helper.make_tensor_value_info("lengths", TensorProto.INT32, [3]),
            helper.make_tensor_value_info("h0", F, [1, 3, hidden]),
        ],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("y_h", F, None)],
        init,
    )


def streaming_vad() -> bytes:
    """A voice-activity detector chunk by chunk: state in, state out, and an ``If`` on the sample rate choosing
    the 16 kHz or the 8 kHz front end (both read the outer scope), then an LSTM step and a sigmoid probability."""
    rng = np.random.default_rng(71)
    hidden = 8

    def branch(name: str, frame: int) -> onnx.GraphProto:
        w = numpy_helper.from_array(_weights(rng, frame, 16), f"{name}_w")
        nodes = [
            helper.make_node("Reshape", ["audio", f"{name}_shape"], [f"{name}_frames"]),
            helper.make_node("MatMul", [f"{name}_frames", f"{name}_w"], [f"{name}_proj"]),
            helper.make_node("Relu", [f"{name}_proj"], [f"{name}_out"]),
        ]
        shape = numpy_helper.from_array(np.array([-1, 1, frame], np.int64), f"{name}_shape")
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", F, None)], [w, shape])

    init = [
        numpy_helper.from_array(np.array(16000, np.int64), "rate_16k"),
        numpy_helper.from_array(_weights(rng, 1, 4 * hidden, 16), "w"),
        numpy_helper.from_array(_weights(rng, 1, 4 * hidden, hidden), "r"),
        numpy_helper.from_array(_weights(rng, hidden, 1), "head"),
    ]
    nodes = [
        helper.make_node("Equal", ["sr", "rate_16k"], ["is_16k"]),
        helper.make_node(
            "If", ["is_16k"], ["features"], then_branch=branch("wide", 32), else_branch=branch("narrow", 16)
        ),
        helper.make_node("LSTM", ["features", "w", "r", "", "", "h", "c"], ["", "h_out", "c_out"], hidden_size=hidden),
        helper.make_node(
            "Squeeze",
            ["h_out"],
            ["h_last"],
        ),
        helper.make_node("MatMul", ["h_last", "head"], ["score"]),
        helper.make_node("Sigmoid", ["score"], ["probability"]),
    ]
    # Squeeze without axes removes every 1-dim: [1, 1, H] -> [H]; MatMul [H] x [H, 1] -> [1]
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("audio", F, [64]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            helper.make_tensor_value_info("h", F, [1, 1, hidden]),
            helper.make_tensor_value_info("c", F, [1, 1, hidden]),
        ],
        [
            helper.make_tensor_value_info("probability", F, None),
            helper.make_tensor_value_info("h_out", F, None),
            helper.make_tensor_value_info("c_out", F, None),
        ],
        init,
    )


def greedy_decoder(steps: int = 5) -> bytes:
    """A ``Loop`` of a fixed number of steps decoding greedily: embed the last token, one tanh RNN cell, project to
    the vocabulary, ArgMax; the tokens are the loop's scan output, the hidden state its carried value."""
    rng = np.random.default_rng(73)
    vocab, hidden = 11, 8
    body_nodes = [
        helper.make_node("Gather", ["embedding", "token_in"], ["embedded"], axis=0),  # [1, H]
        helper.make_node("MatMul", ["embedded", "w_in"], ["a"]),
        helper.make_node("MatMul", ["state_in", "w_state"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["state_out"]),
        helper.make_node("MatMul", ["state_out", "w_out"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["token_out"], axis=1, keepdims=0),  # [1]
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Identity", ["token_out"], ["emitted"]),
    ]
    body = helper.make_graph(
        body_nodes,
        "step",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("token_in", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("state_in", F, [1, hidden]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("token_out", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("state_out", F, [1, hidden]),
            helper.make_tensor_value_info("emitted", TensorProto.INT64, [1]),
        ],
    )
    init = [
        numpy_helper.from_array(np.array(steps, np.int64), "steps"),
        numpy_helper.from_array(np.array(True), "go"),
        numpy_helper.from_array(_weights(rng, vocab, hidden, scale=1.0), "embedding"),
        numpy_helper.from_array(_weights(rng, hidden, hidden), "w_in"),
        numpy_helper.from_array(_weights(rng, hidden, hidden), "w_state"),
        numpy_helper.from_array(_weights(rng, hidden, vocab, scale=1.0), "w_out"),
    ]
    nodes = [helper.make_node("Loop", ["steps", "go", "start", "state"], ["last", "final", "tokens"], body=body)]
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("start", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("state", F, [1, hidden]),
        ],
        [
            helper.make_tensor_value_info("last", TensorProto.INT64, None),
            helper.make_tensor_value_info("final", F, None),
            helper.make_tensor_value_info("tokens", TensorProto.INT64, None),
        ],
        init,
    )


def _feeds(name: str, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Fresh inputs; several calls where a model's control inputs change (sample rate, lengths, start token)."""
    if name == "lstm_recognizer":
        return [{"image": rng.standard_normal((1, 1, 8, 24)).astype(np.float32)}]
    if name == "gru_encoder":
        return [
            {
                "x": rng.standard_normal((7, 3, 6)).astype(np.float32),
                "lengths": np.array(lengths, np.int32),
                "h0": rng.standard_normal((1, 3, 10)).astype(np.float32),
            }
            for lengths in ([7, 3, 5], [1, 7, 2])
        ]
    if name == "streaming_vad":
        h = np.zeros((1, 1, 8), np.float32)
        return [
            {"audio": rng.standard_normal(64).astype(np.float32), "sr": np.array(rate, np.int64), "h": h, "c": h}
            for rate in (16000, 8000, 16000)
        ]
    return [
        {"start": np.array([token], np.int64), "state": rng.standard_normal((1, 8)).astype(np.float32)}
        for token in (0, 4)
    ]


MODELS = {
    "lstm_recognizer": lstm_recognizer,
    "gru_encoder": gru_encoder,
    "streaming_vad": streaming_vad,
    "greedy_decoder": greedy_decoder,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_recurrent_model_matches_onnxruntime(env: ortgpu.Env, name: str) -> None:
    model = MODELS[name]()
    reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    with ortgpu.InferenceSession(model, env=env) as session:
        for feeds in _feeds(name, np.random.default_rng()):
            expected = reference.run(None, feeds)
            actual = session.run(None, feeds)
            for want, got in zip(expected, actual):
                assert got.shape == want.shape and got.dtype == want.dtype, name
                if want.dtype.kind == "f":
                    error = np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30)
                    assert error <= 1e-4, f"{name}: relative error {error}"
                else:
                    np.testing.assert_array_equal(got, want)
        placement = session.get_node_placement(
            {n: a.shape for n, a in _feeds(name, np.random.default_rng(0))[0].items()},
            input_values=_feeds(name, np.random.default_rng(0))[0],
        )
        cpu = {p.op_type for p in placement if p.placement == "cpu"}
        assert cpu & {"LSTM", "GRU", "If", "Loop"}, placement  # the recurrent/control-flow nodes, on the CPU today
