"""ortgpu.Generator: greedy decoding of a model in onnxruntime-genai's static-cache layout, the tokens equal to
onnxruntime CPU's greedy loop over the same model, captured and uncaptured, on both backends.

The models are written with ``onnx.helper`` as the builder writes them: seqlens_k from the attention mask's sum,
total_sequence_length from its width (the cache's), GroupQueryAttention with rotary embeddings per layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortgpu
from ortgpu_core import InvalidArgumentError, ModelError

HEADS, KV_HEADS, HEAD, VOCAB, MAX_LENGTH = 4, 2, 16, 41, 12
HIDDEN = HEADS * HEAD


def _genai_model(layers: int, batch: int, positions: bool = False, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def weight(name: str, shape: tuple[int, ...], scale: float = 0.3) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    angles = np.arange(MAX_LENGTH)[:, None] * (1.0 / 10000 ** (np.arange(HEAD // 2) / (HEAD // 2)))[None, :]
    initializers = [
        weight("embed", (VOCAB, HIDDEN), 1.0),
        weight("head", (HIDDEN, VOCAB)),
        onnx.numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
        onnx.numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        onnx.numpy_helper.from_array(np.array(1, np.int64), "one"),
    ]
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["seqlens_64"]),
        helper.make_node("Cast", ["seqlens_64"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["total_64"]),
        helper.make_node("Cast", ["total_64"], ["total"], to=TensorProto.INT32),
        helper.make_node("Gather", ["embed", "input_ids"], ["x0"]),
    ]
    cache = [batch, KV_HEADS, MAX_LENGTH, HEAD]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, MAX_LENGTH]),
    ]
    if positions:  # read by nothing but a residual term, as some exports keep it
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [batch, "sequence"]))
        initializers.append(weight("position_embed", (MAX_LENGTH, HIDDEN), 0.5))
        nodes += [helper.make_node("Gather", ["position_embed", "position_ids"], ["pe"]),
                  helper.make_node("Add", ["x0", "pe"], ["x0p"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, "sequence", VOCAB])]
    x = "x0p" if positions else "x0"
    for layer in range(layers):
        names = [f"wq{layer}", f"wk{layer}", f"wv{layer}", f"wo{layer}"]
        shapes = [(HIDDEN, HIDDEN), (HIDDEN, KV_HEADS * HEAD), (HIDDEN, KV_HEADS * HEAD), (HIDDEN, HIDDEN)]
        initializers += [weight(n, s) for n, s in zip(names, shapes)]
        past = [f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"]
        present = [f"present.{layer}.key", f"present.{layer}.value"]
        nodes += [
            helper.make_node("MatMul", [x, names[0]], [f"q{layer}"]),
            helper.make_node("MatMul", [x, names[1]], [f"k{layer}"]),
            helper.make_node("MatMul", [x, names[2]], [f"v{layer}"]),
            helper.make_node(
                "GroupQueryAttention",
                [f"q{layer}", f"k{layer}", f"v{layer}", *past, "seqlens_k", "total", "cos", "sin"],
                [f"a{layer}", *present],
                domain="com.microsoft",
                num_heads=HEADS,
                kv_num_heads=KV_HEADS,
                do_rotary=1,
            ),  # fmt: skip
            helper.make_node("MatMul", [f"a{layer}", names[3]], [f"o{layer}"]),
            helper.make_node("Add", [x, f"o{layer}"], [f"x{layer + 1}"]),
        ]
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, cache) for n in past]
        outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, cache) for n in present]
        x = f"x{layer + 1}"
    nodes.append(helper.make_node("MatMul", [x, "head"], ["logits"]))
    graph = helper.make_graph(nodes, "genai", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _onnxruntime_tokens(model: onnx.ModelProto, prompt: np.ndarray, new_tokens: int, layers: int) -> np.ndarray:
    """onnxruntime CPU's greedy loop: the prompt in one run, then a token per step, presents fed back as pasts."""
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    batch, length = prompt.shape
    names = {i.name for i in session.get_inputs()}
    caches = {f"past_key_values.{layer}.{kind}": np.zeros((batch, KV_HEADS, MAX_LENGTH, HEAD), np.float32)
              for layer in range(layers) for kind in ("key", "value")}  # fmt: skip
    mask = np.zeros((batch, MAX_LENGTH), np.int64)
    mask[:, :length] = 1
    ids, positions = prompt, np.broadcast_to(np.arange(length), (batch, length)).astype(np.int64)
    chosen = []
    for step in range(new_tokens):
        feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, **caches}
        if "position_ids" in names:
            feeds["position_ids"] = positions
        results = session.run(None, feeds)
        token = results[0][:, -1].argmax(axis=-1).astype(np.int64)
        chosen.append(token)
        for index, name in enumerate(sorted(caches, key=lambda n: (int(n.split(".")[1]), n.endswith("value")))):
            caches[name] = results[1 + index]
        position = length + step
        if position < MAX_LENGTH:
            mask = mask.copy()
            mask[:, position] = 1
        ids, positions = token[:, None], np.full((batch, 1), position, np.int64)
    return np.stack(chosen, axis=1)


@pytest.mark.parametrize("capture", [True, False], ids=["captured", "uncaptured"])
@pytest.mark.parametrize("layers,batch,positions", [(2, 1, False), (1, 2, True)], ids=["2-layers", "batch-2-positions"])
def test_greedy_tokens_equal_onnxruntime(
    env: ortgpu.Env, capture: bool, layers: int, batch: int, positions: bool
) -> None:
    model = _genai_model(layers, batch, positions, seed=layers)
    prompt = np.random.default_rng(7).integers(0, VOCAB, (batch, 3)).astype(np.int64)
    new_tokens = MAX_LENGTH - prompt.shape[1] + 1
    # onnxruntime takes a prompt after a (static) past for one row only: each row alone, the same weights
    single = _genai_model(layers, 1, positions, seed=layers)
    expected = np.concatenate([_onnxruntime_tokens(single, prompt[row : row + 1], new_tokens, layers)
                               for row in range(batch)])  # fmt: skip
    with ortgpu.Generator(model, batch_size=batch, env=env, capture=capture) as generator:
        got = np.stack(list(generator.generate(prompt, new_tokens)), axis=1)
        # a second prompt on the same generator: the graphs are captured afresh, the cache rewritten
        again = np.stack(list(generator.generate(prompt, new_tokens)), axis=1)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(again, expected)


@pytest.mark.parametrize("capture", [True, False], ids=["captured", "uncaptured"])
def test_greedy_tokens_of_a_4bit_model_equal_onnxruntime_on_the_same_file(env: ortgpu.Env, capture: bool) -> None:
    """The model's projections quantized to 4 bits by onnxruntime's MatMulNBitsQuantizer (MatMulNBits next to
    GroupQueryAttention in every step's graph): the tokens equal onnxruntime CPU's on the quantized file."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(_genai_model(2, 1, seed=5), bits=4, block_size=16)
    quantizer.process()
    model: onnx.ModelProto = quantizer.model.model
    assert sum(node.op_type == "MatMulNBits" for node in model.graph.node) == 9
    prompt = np.random.default_rng(8).integers(0, VOCAB, (1, 4)).astype(np.int64)
    new_tokens = MAX_LENGTH - prompt.shape[1] + 1
    expected = _onnxruntime_tokens(model, prompt, new_tokens, 2)
    with ortgpu.Generator(model, env=env, capture=capture) as generator:
        got = np.stack(list(generator.generate(prompt, new_tokens)), axis=1)
    np.testing.assert_array_equal(got, expected)


def test_generate_refuses_what_does_not_fit(env: ortgpu.Env) -> None:
    model = _genai_model(1, 1)
    with ortgpu.Generator(model, env=env) as generator:
        with pytest.raises(InvalidArgumentError, match="cache holds 12"):
            generator.generate(np.zeros((1, 4), np.int64), MAX_LENGTH)
        with pytest.raises(InvalidArgumentError, match=r"batch_size=1"):
            generator.generate(np.zeros((2, 4), np.int64), 2)
        with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
            generator.generate(np.zeros((1, 4), np.int64), -1)
        assert len(list(generator.generate(np.zeros((1, 4), np.int64), 0))) == 0


def test_a_model_without_a_static_cache_is_refused(env: ortgpu.Env) -> None:
    model = _genai_model(1, 1)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "total"
    with pytest.raises(ModelError, match="static cache"):
        ortgpu.Generator(model, env=env)
    plain = _genai_model(1, 1)
    del plain.graph.input[2:]
    with pytest.raises(ModelError, match="KV cache"):
        ortgpu.Generator(plain, env=env)
