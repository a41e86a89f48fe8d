"""Greedy decoding with the plain public API: a KV cache in place, the next token chosen on the device, and each
step a replay of a captured graph that reads back only the token ids.

The model is a one-layer decoder written with ``onnx.helper`` in onnxruntime-genai's static-cache layout: token
embedding, Q/K/V projections, GroupQueryAttention (rotary, a cache of ``CACHE`` positions shared by past and present,
``total_sequence_length`` fed as that length), a residual, the vocabulary projection and ArgMax.  The token buffers
ping-pong between two captured graphs (A -> B, then B -> A): one value is never a graph's input and output at once.
The tokens must equal onnxruntime CPU's greedy loop over the same model with separate past and present buffers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortgpu

HEADS, KV_HEADS, HEAD, VOCAB, CACHE, BATCH = 4, 2, 16, 37, 16, 2
HIDDEN = HEADS * HEAD


def _decoder(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)

    def weight(name: str, shape: tuple[int, ...], scale: float = 0.3) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    positions = np.arange(CACHE)[:, None] * (1.0 / 10000 ** (np.arange(HEAD // 2) / (HEAD // 2)))[None, :]
    initializers = [
        weight("embed", (VOCAB, HIDDEN), 1.0),
        weight("wq", (HIDDEN, HIDDEN)),
        weight("wk", (HIDDEN, KV_HEADS * HEAD)),
        weight("wv", (HIDDEN, KV_HEADS * HEAD)),
        weight("head", (HIDDEN, VOCAB)),
        onnx.numpy_helper.from_array(np.cos(positions).astype(np.float32), "cos"),
        onnx.numpy_helper.from_array(np.sin(positions).astype(np.float32), "sin"),
    ]
    nodes = [
        helper.make_node("Gather", ["embed", "ids"], ["x"]),
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total", "cos", "sin"],
            ["attended", "present_key", "present_value"],
            domain="com.microsoft",
            num_heads=HEADS,
            kv_num_heads=KV_HEADS,
            do_rotary=1,
        ),  # fmt: skip
        helper.make_node("Add", ["attended", "x"], ["residual"]),
        helper.make_node("MatMul", ["residual", "head"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["next"], axis=-1, keepdims=1),
        helper.make_node("Squeeze", ["next", "last"], ["next_ids"]),
    ]
    initializers.append(onnx.numpy_helper.from_array(np.array([2], np.int64), "last"))
    cache = [BATCH, KV_HEADS, CACHE, HEAD]
    graph = helper.make_graph(
        nodes, "decoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [BATCH, 1]),
         helper.make_tensor_value_info("past_key", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("past_value", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [BATCH]),
         helper.make_tensor_value_info("total", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("next_ids", TensorProto.INT64, [BATCH, 1]),
         helper.make_tensor_value_info("present_key", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("present_value", TensorProto.FLOAT, cache)],
        initializers,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _onnxruntime_tokens(model: bytes, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
    """onnxruntime CPU's greedy loop: the prompt one token per step, then its own choices."""
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    past = [np.zeros((BATCH, KV_HEADS, CACHE, HEAD), np.float32) for _ in range(2)]
    total = np.array([CACHE], np.int32)
    chosen: list[np.ndarray] = []
    ids = prompt[:, :1]
    for step in range(prompt.shape[1] + new_tokens - 1):
        feeds = {"ids": ids, "past_key": past[0], "past_value": past[1],
                 "seqlens_k": np.full(BATCH, step, np.int32), "total": total}  # fmt: skip
        next_ids, past[0], past[1] = session.run(None, feeds)
        if step + 1 < prompt.shape[1]:
            ids = prompt[:, step + 1 : step + 2]
        else:
            ids = next_ids
            chosen.append(next_ids)
    return np.concatenate(chosen, axis=1)


def _ortgpu_tokens(model: bytes, prompt: np.ndarray, new_tokens: int, env: ortgpu.Env) -> np.ndarray:
    """The same loop on ortgpu: the prompt's steps run uncaptured, then every decode step is a replay."""
    with ortgpu.InferenceSession(model, env=env, graph_capture=True) as session:
        allocator = session.allocator
        cache = [allocator.empty((BATCH, KV_HEADS, CACHE, HEAD), np.float32) for _ in range(2)]
        tokens = [allocator.from_numpy(prompt[:, :1].copy()), allocator.empty((BATCH, 1), np.int64)]
        lengths = allocator.from_numpy(np.zeros(BATCH, np.int32))
        bindings = []
        for source, target in ((0, 1), (1, 0)):
            binding = session.io_binding()
            binding.bind_input("ids", tokens[source])
            binding.bind_input("seqlens_k", lengths)
            # the total length sized the cache when the plan was made; on the host, a replay checks it by a look
            binding.bind_cpu_input("total", np.array([CACHE], np.int32))
            for name, value in zip(("key", "value"), cache):
                binding.bind_input(f"past_{name}", value)
                binding.bind_output(f"present_{name}", value)  # the cache in place
            binding.bind_output("next_ids", tokens[target])
            bindings.append(binding)
        graphs: list[Any] = [None, None]
        chosen: list[np.ndarray] = []
        source = 0
        try:
            for step in range(prompt.shape[1] + new_tokens - 1):
                lengths.update_inplace(np.full(BATCH, step, np.int32))
                if step + 1 < prompt.shape[1]:
                    session.run_with_iobinding(bindings[0], ortgpu.RunOptions(gpu_graph_id=-1))
                    tokens[0].update_inplace(prompt[:, step + 1 : step + 2].copy())
                    continue
                if graphs[source] is None:
                    graphs[source] = session.capture(bindings[source], graph_id=source)
                else:
                    graphs[source].replay()
                source = 1 - source
                chosen.append(tokens[source].to_numpy())  # the only read back: the token ids
        finally:
            for graph in graphs:
                if graph is not None:
                    graph.release()
            for value in [*cache, *tokens, lengths]:
                value.release()
        return np.concatenate(chosen, axis=1)


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_decoding_with_captured_steps_matches_onnxruntime(env: ortgpu.Env, seed: int) -> None:
    model = _decoder(seed)
    prompt = np.random.default_rng(seed + 10).integers(0, VOCAB, (BATCH, 3)).astype(np.int64)
    new_tokens = CACHE - prompt.shape[1]
    expected = _onnxruntime_tokens(model, prompt, new_tokens)
    got = _ortgpu_tokens(model, prompt, new_tokens, env)
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (BATCH, new_tokens)
