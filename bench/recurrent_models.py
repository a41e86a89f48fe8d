"""Recurrent and control-flow model builders (issue 13), shared by the tests and ``python -m bench``.

Every builder returns the serialized model (``bytes``, which both ortgpu and onnxruntime sessions take), built from a
seeded generator, with sizes as parameters whose defaults are the small models of ``tests/test_recurrent_models.py``:

* :func:`lstm_recognizer`: Conv + Relu + MaxPool stages over a text-line image, its columns as the sequence, two
  bidirectional LSTM layers and a linear classifier per time step (the CRNN shape of OCR recognizers).
* :func:`gru_encoder`: a GRU over a padded batch whose true lengths come in as ``sequence_lens``.
* :func:`streaming_vad`: a voice-activity detector chunk by chunk: state in and out, an ``If`` on the sample rate
  choosing the front end, an LSTM step and a sigmoid probability (the shape of Silero VAD).
* :func:`greedy_decoder`: a ``Loop`` of a fixed number of steps decoding greedily.

:func:`crnn_recognizer` and :func:`silero_like_vad` are the realistic sizes ``python -m bench`` runs
(``--model lstm-ocr`` and ``--model vad``), with :func:`vad_feeds` for the VAD's inputs (its ``sr`` input must be a
real sample rate, its state the LSTM's).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "lstm_recognizer",
    "gru_encoder",
    "streaming_vad",
    "greedy_decoder",
    "crnn_recognizer",
    "silero_like_vad",
    "vad_feeds",
    "VAD_RATES",
]

F = TensorProto.FLOAT

#: The sample rates :func:`streaming_vad` understands and the chunk it takes at each, as a multiple of its frame
#: (Silero VAD: 512 samples at 16 kHz, 256 at 8 kHz).
VAD_RATES = (16000, 8000)


def _weights(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _scale(fan_in: int) -> float:
    """The weights' standard deviation: 0.3 (the small test models), smaller for wide layers so that activations
    stay in range (and the LSTM gates out of saturation) at realistic sizes."""
    return min(0.3, 2.0 / float(np.sqrt(fan_in)))


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto],
    opset: int = 17,
) -> bytes:
    graph = helper.make_graph(nodes, "recurrent", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def lstm_recognizer(
    *,
    batch: int = 1,
    height: int = 8,
    width: int = 24,
    conv_channels: Sequence[int] = (8,),
    pools: Sequence[tuple[int, int]] = ((2, 2),),
    hidden: int = 12,
    classes: int = 7,
    seed: int = 61,
) -> bytes:
    """Conv 3x3 + ReLU + MaxPool stages over a text-line image ``[batch, 1, height, width]`` (stage ``i`` has
    ``conv_channels[i]`` channels and pools by ``pools[i]`` = (rows, columns)), columns as the sequence, two
    bidirectional LSTM layers, a linear classifier per time step: ``logits [T, batch, classes]`` (the CRNN shape of
    OCR recognizers)."""
    if len(conv_channels) != len(pools) or not conv_channels:
        raise ValueError("one pool per conv stage, at least one stage")
    rng = np.random.default_rng(seed)
    rows = height
    columns = width
    init: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    source, c_in = "image", 1
    for stage, (c_out, (pool_rows, pool_columns)) in enumerate(zip(conv_channels, pools)):
        suffix = "" if stage == 0 else f"_{stage + 1}"
        init.append(
            numpy_helper.from_array(_weights(rng, c_out, c_in, 3, 3, scale=_scale(9 * c_in)), f"conv_w{suffix}")
        )
        nodes += [
            helper.make_node(
                "Conv", [source, f"conv_w{suffix}"], [f"c{suffix}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
            ),
            helper.make_node("Relu", [f"c{suffix}"], [f"r{suffix}"]),
            helper.make_node(
                "MaxPool",
                [f"r{suffix}"],
                [f"p{suffix}"],
                kernel_shape=[pool_rows, pool_columns],
                strides=[pool_rows, pool_columns],
            ),
        ]
        source, c_in = f"p{suffix}", c_out
        rows, columns = rows // pool_rows, columns // pool_columns
    features = c_in * rows  # per column: [batch, C, rows, T] -> [T, batch, C * rows]
    init += [
        numpy_helper.from_array(_weights(rng, 2, 4 * hidden, features, scale=_scale(features)), "w1"),
        numpy_helper.from_array(_weights(rng, 2, 4 * hidden, hidden, scale=_scale(hidden)), "r1"),
        numpy_helper.from_array(_weights(rng, 2, 8 * hidden, scale=0.1), "b1"),
        numpy_helper.from_array(_weights(rng, 2, 4 * hidden, 2 * hidden, scale=_scale(2 * hidden)), "w2"),
        numpy_helper.from_array(_weights(rng, 2, 4 * hidden, hidden, scale=_scale(hidden)), "r2"),
        numpy_helper.from_array(_weights(rng, 2 * hidden, classes, scale=_scale(2 * hidden)), "fc"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), "seq_shape"),
        numpy_helper.from_array(np.array([0, 0, 2 * hidden], np.int64), "merge_shape"),
    ]
    nodes += [
        helper.make_node("Transpose", [source], ["t"], perm=[3, 0, 1, 2]),  # [T, batch, C, rows]
        helper.make_node("Reshape", ["t", "seq_shape"], ["seq"]),  # [T, batch, C * rows]
        helper.make_node("LSTM", ["seq", "w1", "r1", "b1"], ["y1"], hidden_size=hidden, direction="bidirectional"),
        helper.make_node("Transpose", ["y1"], ["y1t"], perm=[0, 2, 1, 3]),  # [T, batch, 2, H]
        helper.make_node("Reshape", ["y1t", "merge_shape"], ["m1"]),  # [T, batch, 2H]
        helper.make_node("LSTM", ["m1", "w2", "r2"], ["y2"], hidden_size=hidden, direction="bidirectional"),
        helper.make_node("Transpose", ["y2"], ["y2t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["y2t", "merge_shape"], ["m2"]),
        helper.make_node("MatMul", ["m2", "fc"], ["logits"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("image", F, [batch, 1, height, width])],
        [helper.make_tensor_value_info("logits", F, None)],
        init,
    )


def gru_encoder(*, steps: int = 7, batch: int = 3, features: int = 6, hidden: int = 10, seed: int = 67) -> bytes:
    """A GRU over a padded batch ``x [steps, batch, features]`` whose true lengths come in as ``sequence_lens``
    (``lengths``, int32), with ``linear_before_reset`` and an initial state ``h0``."""
    rng = np.random.default_rng(seed)
    init = [
        numpy_helper.from_array(_weights(rng, 1, 3 * hidden, features, scale=_scale(features)), "w"),
        numpy_helper.from_array(_weights(rng, 1, 3 * hidden, hidden, scale=_scale(hidden)), "r"),
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
            helper.make_tensor_value_info("x", F, [steps, batch, features]),
            helper.make_tensor_value_info("lengths", TensorProto.INT32, [batch]),
            helper.make_tensor_value_info("h0", F, [1, batch, hidden]),
        ],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("y_h", F, None)],
        init,
    )


def streaming_vad(
    *,
    chunk: int = 64,
    frame_16k: int = 32,
    frame_8k: int = 16,
    features: int = 16,
    front_layers: int = 1,
    hidden: int = 8,
    seed: int = 71,
) -> bytes:
    """A voice-activity detector chunk by chunk: ``audio [chunk]``, ``sr`` (int64 scalar), state ``h``, ``c``
    ``[1, 1, hidden]`` in; ``probability [1]``, ``h_out``, ``c_out`` out.

    An ``If`` on ``sr == 16000`` chooses the front end: the 16 kHz branch cuts the chunk into frames of
    ``frame_16k`` samples, the other into frames of ``frame_8k``; each projects its frames to ``features`` through
    ``front_layers`` x (MatMul + Relu) (both read the outer-scope ``audio``). Then an LSTM over the frames from the
    state, and a sigmoid of a linear head on the last hidden state."""
    rng = np.random.default_rng(seed)

    def branch(name: str, frame: int) -> onnx.GraphProto:
        weights, nodes, source, width = [], [], f"{name}_frames", frame
        nodes.append(helper.make_node("Reshape", ["audio", f"{name}_shape"], [source]))  # [T, 1, frame]
        for layer in range(front_layers):
            suffix = "" if layer == 0 else str(layer + 1)
            weights.append(
                numpy_helper.from_array(_weights(rng, width, features, scale=_scale(width)), f"{name}_w{suffix}")
            )
            out = f"{name}_out" if layer + 1 == front_layers else f"{name}_h{suffix or 1}"
            nodes += [
                helper.make_node("MatMul", [source, f"{name}_w{suffix}"], [f"{name}_proj{suffix}"]),
                helper.make_node("Relu", [f"{name}_proj{suffix}"], [out]),
            ]
            source, width = out, features
        shape = numpy_helper.from_array(np.array([-1, 1, frame], np.int64), f"{name}_shape")
        return helper.make_graph(
            nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", F, None)], [*weights, shape]
        )

    init = [
        numpy_helper.from_array(np.array(16000, np.int64), "rate_16k"),
        numpy_helper.from_array(_weights(rng, 1, 4 * hidden, features, scale=_scale(features)), "w"),
        numpy_helper.from_array(_weights(rng, 1, 4 * hidden, hidden, scale=_scale(hidden)), "r"),
        numpy_helper.from_array(_weights(rng, hidden, 1, scale=_scale(hidden)), "head"),
    ]
    then_branch, else_branch = branch("wide", frame_16k), branch("narrow", frame_8k)
    nodes = [
        helper.make_node("Equal", ["sr", "rate_16k"], ["is_16k"]),
        helper.make_node("If", ["is_16k"], ["features"], then_branch=then_branch, else_branch=else_branch),
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
            helper.make_tensor_value_info("audio", F, [chunk]),
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


def greedy_decoder(steps: int = 5, *, vocab: int = 11, hidden: int = 8, seed: int = 73) -> bytes:
    """A ``Loop`` of ``steps`` iterations decoding greedily: embed the last token, one tanh RNN cell, project to
    the vocabulary, ArgMax; the tokens are the loop's scan output, the hidden state its carried value. Inputs
    ``start [1]`` (int64) and ``state [1, hidden]``."""
    rng = np.random.default_rng(seed)
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
        numpy_helper.from_array(_weights(rng, hidden, hidden, scale=_scale(hidden)), "w_in"),
        numpy_helper.from_array(_weights(rng, hidden, hidden, scale=_scale(hidden)), "w_state"),
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


# -- the realistic sizes python -m bench runs ------------------------------------------------------------------


def crnn_recognizer(batch: int = 1, width: int = 128, hidden: int = 128, classes: int = 100) -> bytes:
    """``--model lstm-ocr``: a small CRNN text recognizer. Image ``[batch, 1, 32, width]``; three Conv 3x3 + ReLU +
    MaxPool stages (32, 64, 128 channels; the last pools rows only) to ``width / 4`` columns of 128 x 4 features;
    two bidirectional LSTM layers of ``hidden``; ``classes`` logits per column."""
    return lstm_recognizer(
        batch=batch,
        height=32,
        width=width,
        conv_channels=(32, 64, 128),
        pools=((2, 2), (2, 2), (2, 1)),
        hidden=hidden,
        classes=classes,
    )


def silero_like_vad(hidden: int = 128) -> bytes:
    """``--model vad``: a Silero-VAD-sized detector. A chunk of 512 samples (16 kHz; 256 at 8 kHz would be the
    other branch's chunk), framed by 64 samples at 16 kHz or 32 at 8 kHz (8 frames either way), a front end of two
    MatMul + Relu layers to 128 features, an LSTM of ``hidden`` with state in and out, a sigmoid probability."""
    return streaming_vad(chunk=512, frame_16k=64, frame_8k=32, features=128, front_layers=2, hidden=hidden)


def vad_feeds(model: onnx.ModelProto, rate: int = 16000, *, seed: int = 1) -> dict[str, np.ndarray]:
    """Inputs for a :func:`streaming_vad` model: audio ~ N(0, 0.1) of the declared chunk, ``sr = rate`` (which picks
    the ``If`` branch: ortgpu plans per value of it), and a small random state (as after a few chunks)."""
    if rate not in VAD_RATES:
        raise ValueError(f"sample rate {rate} is not one of {VAD_RATES}")
    rng = np.random.default_rng(seed)
    dims = {value.name: tuple(d.dim_value for d in value.type.tensor_type.shape.dim) for value in model.graph.input}
    state = dims["h"]
    return {
        "audio": (rng.standard_normal(dims["audio"]) * 0.1).astype(np.float32),
        "sr": np.array(rate, np.int64),
        "h": (rng.standard_normal(state) * 0.1).astype(np.float32),
        "c": (rng.standard_normal(state) * 0.1).astype(np.float32),
    }
