"""Small causal LMs as onnxruntime-genai model folders (``genai_config.json`` + ``model.onnx``), for the generation
tests: written by onnxruntime-genai's own model builder where it can run here (it needs torch and transformers to
read a Hugging Face checkpoint), else with ``onnx.helper`` in the graph layout the builder writes (checked against
the builder's output for these configs): the attention mask's sum gives seqlens_k and its width
total_sequence_length; per layer a packed Q/K/V projection into GroupQueryAttention with rotary caches, the
builder's normalizations (SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization for Llama/Qwen2, LayerNorm
with a parallel MLP for Phi), sizes symbolic, the cache's length left to the runtime.

``precision="int4"`` writes every projection as MatMulNBits (4-bit, block 32, ``accuracy_level`` 4), as the builder
does for the CPU."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.genai_build import build_folder, builder_available

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, CONTEXT = 96, 64, 2, 4, 2, 128, 128
FAMILIES = ("llama", "qwen2", "phi", "phi3")
#: Phi-3's LongRoPE switches from short to long rotary factors past this many positions (an ``If`` in the graph)
ORIGINAL_CONTEXT = 64
EOS = 2


def write_genai_folder(folder: str, family: str, precision: str = "fp32", seed: int = 0) -> str:
    """A model folder for ``family`` (llama, qwen2, phi, phi3) at ``precision``: fp32, int4 (float32 activations,
    as the builder writes int4 for the CPU) or fp16 (float16 weights, activations and cache, as it writes for
    WebGPU); returns ``folder``."""
    if builder_available():
        build_folder(folder, family, _family_config(family), precision, seed)
    else:
        _write_with_helper(folder, family, precision, seed)
    return folder


# -- through onnxruntime-genai's builder ---------------------------------------------------------------------------


def _family_config(family: str) -> dict[str, Any]:
    """The Hugging Face config of ``family`` at this module's sizes."""
    config: dict[str, Any] = {
        "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "intermediate_size": INTERMEDIATE, "vocab_size": VOCAB,
        "max_position_embeddings": CONTEXT, "bos_token_id": 1, "eos_token_id": EOS,
    }  # fmt: skip
    if family == "phi":
        config.update(hidden_size=2 * HIDDEN, partial_rotary_factor=0.5)
    elif family == "phi3":
        half = HIDDEN // HEADS // 2
        scaling = {"type": "longrope", "long_factor": [1.0 + 0.5 * i for i in range(half)],
                   "short_factor": [1.0 + 0.1 * i for i in range(half)]}  # fmt: skip
        config.update(pad_token_id=0, original_max_position_embeddings=ORIGINAL_CONTEXT, rope_scaling=scaling)
    return config


# -- written with onnx.helper in the builder's layout --------------------------------------------------------------


def _quantize_int4(weight: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' packed codes ``[N, blocks, block / 2]`` and scales ``[N * blocks]`` of ``weight [K, N]``,
    symmetric (zero point 8), low nibble first."""
    k, n = weight.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), np.float32)
    padded[:k] = weight
    grouped = padded.T.reshape(n, blocks, block)
    scales = np.abs(grouped).max(axis=2) / 7.0
    scales[scales == 0] = 1.0
    codes = np.clip(np.rint(grouped / scales[..., None]) + 8, 0, 15).astype(np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return packed, scales.astype(np.float32).reshape(-1)


class _Graph:
    def __init__(self, precision: str, rng: np.random.Generator) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.precision = precision
        self.rng = rng

    def constant(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], output: str, domain: str = "", **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, domain=domain, **attrs))
        return output

    def weight(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        return self.constant(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def gain(self, name: str, size: int) -> str:
        """A normalization's scale: near 1, as trained models have (near 0 would flatten attention)."""
        return self.constant(name, (1.0 + self.rng.standard_normal(size) * 0.1).astype(np.float32))

    def project(self, x: str, name: str, k: int, n: int, bias: bool = False) -> str:
        weight = (self.rng.standard_normal((k, n)) * k**-0.5).astype(np.float32)
        if self.precision == "int4":
            packed, scales = _quantize_int4(weight)
            self.constant(f"{name}.weight_Q4", packed)
            self.constant(f"{name}.weight_scales", scales)
            y = self.node("MatMulNBits", [x, f"{name}.weight_Q4", f"{name}.weight_scales"], f"{name}/out",
                          domain="com.microsoft", K=k, N=n, bits=4, block_size=32, accuracy_level=4)  # fmt: skip
        else:
            y = self.node("MatMul", [x, self.constant(f"{name}.weight", weight)], f"{name}/out")
        if bias:
            y = self.node("Add", [y, self.weight(f"{name}.bias", (n,), 0.1)], f"{name}/biased")
        return y


def _write_with_helper(folder: str, family: str, precision: str, seed: int) -> None:
    os.makedirs(folder, exist_ok=True)
    phi = family == "phi"
    hidden = 2 * HIDDEN if phi else HIDDEN
    head = hidden // HEADS
    rotary = head // 2 if phi else head  # Phi rotates half of each head
    g = _Graph(precision, np.random.default_rng(seed))
    ints = {name: g.constant(name, np.array(value, np.int64)) for name, value in (("one", 1), ("axis1", [1]))}
    mask_sum = g.node("ReduceSum", ["attention_mask", ints["axis1"]], "mask/sum", keepdims=0)
    seqlens = g.node("Cast", [g.node("Sub", [mask_sum, ints["one"]], "mask/sub")], "mask/seqlens", to=TensorProto.INT32)
    width = g.node("Gather", [g.node("Shape", ["attention_mask"], "mask/shape"), ints["one"]], "mask/width", axis=0)
    total = g.node("Cast", [width], "mask/total", to=TensorProto.INT32)
    angles = np.arange(CONTEXT)[:, None] * (10000.0 ** (-np.arange(0, rotary, 2) / rotary))[None, :]
    if family == "phi3":  # LongRoPE: short factors up to ORIGINAL_CONTEXT positions, long ones past it
        # (factors, magnitude): the long tables also scale q and k, as LongRoPE's attention factor does
        factors = {"long": (4.0 + np.arange(rotary // 2), 1.5), "short": (1.0 + 0.1 * np.arange(rotary // 2), 1.0)}
        branches = {}
        for kind, rows in (("long", CONTEXT), ("short", ORIGINAL_CONTEXT)):
            scaled, magnitude = angles[:rows] / factors[kind][0], factors[kind][1]
            tables = [(f"{t}_{kind}", (f(scaled) * magnitude).astype(np.float32))
                      for t, f in (("cos", np.cos), ("sin", np.sin))]  # fmt: skip
            branches[kind] = helper.make_graph(
                [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(a)) for n, a in tables],
                kind,
                [],
                [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n, _ in tables],
            )
        original = g.constant("original", np.array(ORIGINAL_CONTEXT, np.int64))
        longer = g.node("Greater", [width, original], "rope/longer")
        g.nodes.append(helper.make_node("If", [longer], ["cos_cache", "sin_cache"], name="rope/if",
                                        then_branch=branches["long"], else_branch=branches["short"]))  # fmt: skip
        cos, sin = "cos_cache", "sin_cache"
    else:
        cos = g.constant("cos_cache", np.cos(angles).astype(np.float32))
        sin = g.constant("sin_cache", np.sin(angles).astype(np.float32))
    x = g.node("Gather", [g.weight("embed_tokens", (VOCAB, hidden), 1.0), "input_ids"], "embed")
    residual = x
    for layer in range(LAYERS):
        p = f"layers.{layer}"
        past = [f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"]
        present = [f"present.{layer}.key", f"present.{layer}.value"]
        if phi:
            gamma, beta = g.gain(f"{p}.ln.weight", hidden), g.weight(f"{p}.ln.bias", (hidden,), 0.1)
            if layer == 0:
                normed = g.node("LayerNormalization", [residual, gamma, beta], f"{p}/ln", axis=-1, epsilon=1e-5)
            else:
                g.nodes.append(helper.make_node("SkipLayerNormalization", [residual, x, gamma, beta],
                                                [f"{p}/ln", "", "", f"{p}/sum"], name=f"{p}/ln",
                                                domain="com.microsoft", epsilon=1e-5))  # fmt: skip
                normed, residual = f"{p}/ln", f"{p}/sum"
        else:
            gamma = g.gain(f"{p}.input_norm", hidden)
            if layer == 0:
                normed = g.node(
                    "SimplifiedLayerNormalization", [residual, gamma], f"{p}/in_norm", axis=-1, epsilon=1e-6
                )
            else:
                g.nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual, x, gamma],
                                                [f"{p}/in_norm", "", "", f"{p}/in_sum"], name=f"{p}/in_norm",
                                                domain="com.microsoft", epsilon=1e-6))  # fmt: skip
                normed, residual = f"{p}/in_norm", f"{p}/in_sum"
        qkv = g.project(normed, f"{p}.qkv_proj", hidden, (HEADS + 2 * KV_HEADS) * head, bias=family == "qwen2")
        g.nodes.append(helper.make_node(
            "GroupQueryAttention", [qkv, "", "", *past, seqlens, total, cos, sin], [f"{p}/attn", *present],
            name=f"{p}/attn", domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1,
            scale=float(head**-0.5), local_window_size=-1))  # fmt: skip
        attention = g.project(f"{p}/attn", f"{p}.o_proj", hidden, hidden, bias=phi)
        if phi:  # the MLP reads the same normed input (parallel), both add to the residual
            up = g.project(normed, f"{p}.fc1", hidden, INTERMEDIATE)
            mlp = g.project(g.node("Gelu", [up], f"{p}/gelu", approximate="tanh"), f"{p}.fc2", INTERMEDIATE, hidden)
            x = g.node("Add", [attention, mlp], f"{p}/out")
            continue
        gamma = g.gain(f"{p}.post_norm", hidden)
        g.nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual, attention, gamma],
                                        [f"{p}/post_norm", "", "", f"{p}/post_sum"], name=f"{p}/post_norm",
                                        domain="com.microsoft", epsilon=1e-6))  # fmt: skip
        residual = f"{p}/post_sum"
        gate = g.project(f"{p}/post_norm", f"{p}.gate_proj", hidden, INTERMEDIATE)
        up = g.project(f"{p}/post_norm", f"{p}.up_proj", hidden, INTERMEDIATE)
        silu = g.node("Mul", [gate, g.node("Sigmoid", [gate], f"{p}/sigmoid")], f"{p}/silu")
        x = g.project(g.node("Mul", [silu, up], f"{p}/gated"), f"{p}.down_proj", INTERMEDIATE, hidden)
    gamma = g.gain("final_norm", hidden)
    if phi:
        g.nodes.append(helper.make_node("SkipLayerNormalization", [residual, x, gamma, g.weight("final_bias", (hidden,), 0.1)],
                                        ["final"], name="final", domain="com.microsoft", epsilon=1e-5))  # fmt: skip
    else:
        g.nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual, x, gamma], ["final"],
                                        name="final", domain="com.microsoft", epsilon=1e-6))  # fmt: skip
    logits = g.project("final", "lm_head", hidden, VOCAB)
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits"))
    cache = ["batch_size", KV_HEADS, "past_sequence_length", "kv_cache_dim"]  # the builder leaves the head symbolic
    present_shape = ["batch_size", KV_HEADS, "total_sequence_length", "kv_cache_dim"]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", VOCAB])]
    for layer in range(LAYERS):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{layer}.{kind}", TensorProto.FLOAT, cache))
            outputs.append(helper.make_tensor_value_info(f"present.{layer}.{kind}", TensorProto.FLOAT, present_shape))
    graph = helper.make_graph(g.nodes, "decoder", inputs, outputs, g.initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    if precision == "fp16":
        _to_float16(model)
    onnx.save(model, os.path.join(folder, "model.onnx"))
    config = {
        "model": {
            "bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": EOS, "context_length": CONTEXT, "type": family,
            "vocab_size": VOCAB,
            "decoder": {
                "filename": "model.onnx", "head_size": head, "hidden_size": hidden, "num_attention_heads": HEADS,
                "num_hidden_layers": LAYERS, "num_key_value_heads": KV_HEADS,
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"do_sample": False, "max_length": CONTEXT, "num_beams": 1, "past_present_share_buffer": True,
                   "top_k": 1, "top_p": 1.0, "temperature": 1.0},
    }  # fmt: skip
    with open(os.path.join(folder, "genai_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=1)


def _to_float16(model: onnx.ModelProto) -> None:
    """Every float32 tensor of the model (initializers, Constant values in any subgraph, graph inputs and outputs)
    as float16, in place."""

    def convert(tensor: onnx.TensorProto) -> None:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name))

    def visit(graph: onnx.GraphProto) -> None:
        for tensor in graph.initializer:
            convert(tensor)
        for value in [*graph.input, *graph.output]:
            if value.type.tensor_type.elem_type == TensorProto.FLOAT:
                value.type.tensor_type.elem_type = TensorProto.FLOAT16
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    convert(attribute.t)
                elif attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)

    visit(model.graph)


def genai_greedy_tokens(folder: str, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
    """onnxruntime-genai's greedy tokens ``[batch, n]`` on its CPU provider (it stops at the end-of-sequence
    token, so ``n`` may be below ``new_tokens``)."""
    import onnxruntime_genai as og

    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prompt.shape[1] + new_tokens, batch_size=prompt.shape[0])
    generator = og.Generator(model, params)
    generator.append_tokens(prompt.astype(np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(np.array(generator.get_next_tokens(), dtype=np.int64))
    return np.stack(tokens, axis=1)
