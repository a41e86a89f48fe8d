"""Small float models in the form torch's exporter writes them, for ``tests/test_onnxruntime_tools.py``: BERT, GPT-2 and
ViT encoders (opset 17, dynamic batch and sequence axes) that onnxruntime's transformer optimizer fuses, and an MLP
and a CNN for its quantization tools.

The graphs follow the exports node for node where the optimizer's patterns look (``onnxruntime/transformers/
fusion_*.py``): projections as ``MatMul`` then ``Add(bias, ...)``, heads by ``Reshape [0, 0, N, H]`` and
``Transpose`` (keys straight to ``[0, 2, 3, 1]``, as the exporter merges the two transposes), scores scaled by
``Div`` or ``Mul``, erf-GELU as ``Div/Erf/Add/Mul/Mul``.  The axes are dynamic on purpose: with static shapes
onnxruntime's constant folding (``opt_level`` 1 and 2) turns GPT-2's causal-mask ``Shape/Slice`` chain into a
constant, and the GPT-2 attention pattern, which starts from that chain, no longer matches.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["Graph", "bert", "cnn", "gpt2", "mlp", "vit"]

I64 = np.int64


class Graph:
    """A graph under construction: ``op`` appends a node and returns its output name(s), ``const`` an initializer."""

    def __init__(self, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.rng = np.random.default_rng(seed)
        self._count = 0

    def _name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        name = self._name("const")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, shape: tuple[int, ...], scale: float = 0.2) -> str:
        return self.const(self.rng.standard_normal(shape) * scale)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any) -> Any:
        names = [self._name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self._name(f"/{op_type}"), **attrs))
        return names[0] if outputs == 1 else names

    def input(self, name: str, element: int, shape: list[Any]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, element, shape))
        return name

    def model(self, output: str, shape: list[Any], opset: int = 17) -> onnx.ModelProto:
        """The model with ``output`` (the last node's) as its float output, named "output"."""
        assert self.nodes[-1].output[0] == output
        self.nodes[-1].output[0] = "output"
        for node in self.nodes:
            node.input[:] = ["output" if name == output else name for name in node.input]
        graph = helper.make_graph(
            self.nodes, "exported", self.inputs, [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
            self.initializers,
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="pytorch")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def layer_norm(g: Graph, x: str, hidden: int, decomposed: bool = False) -> str:
    """LayerNormalization-17, or the ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add chain of older exports."""
    gamma = g.const(1 + g.rng.standard_normal(hidden) * 0.1)
    beta = g.const(g.rng.standard_normal(hidden) * 0.1)
    if not decomposed:
        return g.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=1e-5)
    centred = g.op("Sub", x, g.op("ReduceMean", x, axes=[-1]))
    variance = g.op("ReduceMean", g.op("Pow", centred, g.const(2.0)), axes=[-1])
    normed = g.op("Div", centred, g.op("Sqrt", g.op("Add", variance, g.const(1e-5))))
    return g.op("Add", g.op("Mul", normed, gamma), beta)


def linear(g: Graph, x: str, n_in: int, n_out: int) -> str:
    return g.op("Add", g.const(g.rng.standard_normal(n_out) * 0.1), g.op("MatMul", x, g.weight((n_in, n_out))))


def erf_gelu(g: Graph, x: str) -> str:
    erf = g.op("Erf", g.op("Div", x, g.const(math.sqrt(2.0))))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, g.const(1.0))), g.const(0.5))


def tanh_gelu(g: Graph, x: str) -> str:
    """GPT-2's ``gelu_new``: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    half = g.op("Mul", x, g.const(0.5))
    cube = g.op("Mul", g.op("Pow", x, g.const(3.0)), g.const(0.044715))
    inner = g.op("Mul", g.op("Add", x, cube), g.const(math.sqrt(2.0 / math.pi)))
    return g.op("Mul", half, g.op("Add", g.op("Tanh", inner), g.const(1.0)))


def self_attention(g: Graph, x: str, hidden: int, heads: int, mask: str | None, scale_by: str = "Div") -> str:
    """HF BertSelfAttention + BertSelfOutput's dense layer: Q/K/V projections to heads, scaled scores (``Div`` by
    sqrt(H) or ``Mul`` by its inverse), the additive mask, Softmax, the context back to [B, S, hidden]."""
    head = hidden // heads
    to_heads = g.const([0, 0, heads, head], I64)

    def project(perm: list[int]) -> str:
        return g.op("Transpose", g.op("Reshape", linear(g, x, hidden, hidden), to_heads), perm=perm)

    q, k, v = project([0, 2, 1, 3]), project([0, 2, 3, 1]), project([0, 2, 1, 3])
    scores = g.op("MatMul", q, k)
    if scale_by == "Div":
        scores = g.op("Div", scores, g.const(math.sqrt(head)))
    else:
        scores = g.op("Mul", scores, g.const(1.0 / math.sqrt(head)))
    if mask is not None:
        scores = g.op("Add", scores, mask)
    context = g.op("Transpose", g.op("MatMul", g.op("Softmax", scores, axis=-1), v), perm=[0, 2, 1, 3])
    return linear(g, g.op("Reshape", context, g.const([0, 0, hidden], I64)), hidden, hidden)


def bert(
    hidden: int = 32, heads: int = 4, layers: int = 2, vocab: int = 100, decomposed: bool = False, scale_by: str = "Div"
) -> onnx.ModelProto:
    """A post-LN BERT encoder: word + token type + position embeddings (positions sliced from a buffer by the
    sequence length, as HF's ``position_ids[:, :seq]``), the 2-D attention mask made additive (``(1 - m) * -10000``),
    ``layers`` blocks of self-attention and an erf-GELU feed-forward, each closed by residual Add + LayerNorm."""
    g = Graph(1)
    dims = ["batch", "sequence"]
    ids = g.input("input_ids", TensorProto.INT64, dims)
    attention_mask = g.input("attention_mask", TensorProto.INT64, dims)
    token_types = g.input("token_type_ids", TensorProto.INT64, dims)
    summed = g.op("Add", g.op("Gather", g.weight((vocab, hidden), 0.5), ids),
                  g.op("Gather", g.weight((2, hidden), 0.5), token_types))  # fmt: skip
    length = g.op("Gather", g.op("Shape", ids), g.const(1, I64), axis=0)
    end = g.op("Unsqueeze", length, g.const([0], I64))
    position_ids = g.op("Slice", g.const(np.arange(64)[None, :], I64), g.const([0], I64), end, g.const([1], I64),
                        g.const([1], I64))  # fmt: skip
    positions = g.op("Gather", g.weight((64, hidden), 0.5), position_ids)
    x = layer_norm(g, g.op("Add", summed, positions), hidden, decomposed)
    unsqueezed = g.op("Unsqueeze", g.op("Unsqueeze", attention_mask, g.const([1], I64)), g.const([2], I64))
    keep = g.op("Cast", unsqueezed, to=TensorProto.FLOAT)
    mask = g.op("Mul", g.op("Sub", g.const(1.0), keep), g.const(-10000.0))
    for _ in range(layers):
        attended = self_attention(g, x, hidden, heads, mask, scale_by)
        x = layer_norm(g, g.op("Add", attended, x), hidden, decomposed)
        inner = erf_gelu(g, linear(g, x, hidden, 4 * hidden))
        x = layer_norm(g, g.op("Add", linear(g, inner, 4 * hidden, hidden), x), hidden, decomposed)
    return g.model(x, dims + [hidden])


def _conv1d(g: Graph, x: str, n_in: int, n_out: int) -> str:
    """GPT-2's Conv1D as exported: flatten to 2-D, Gemm, back to x's leading dimensions."""
    y = g.op("Gemm", g.op("Reshape", x, g.const([-1, n_in], I64)), g.weight((n_in, n_out)),
             g.const(g.rng.standard_normal(n_out) * 0.1))  # fmt: skip
    leading = g.op("Slice", g.op("Shape", x), g.const([0], I64), g.const([2], I64))
    return g.op("Reshape", y, g.op("Concat", leading, g.const([n_out], I64), axis=0))


def gpt2(hidden: int = 32, heads: int = 4, layers: int = 2, vocab: int = 100) -> onnx.ModelProto:
    """A pre-LN GPT-2 (``input_ids`` alone, no past): token + position embeddings (positions by Range), Conv1D
    projections split into Q/K/V, the causal mask sliced from a lower-triangular buffer by the scores' shape and
    applied by ``Where`` (transformers >= 4.27), tanh-GELU, LayerNorm written out (older exports)."""
    g = Graph(3)
    head = hidden // heads
    dims = ["batch", "sequence"]
    ids = g.input("input_ids", TensorProto.INT64, dims)
    length = g.op("Gather", g.op("Shape", ids), g.const(1, I64), axis=0)
    positions = g.op("Unsqueeze", g.op("Range", g.const(0, I64), length, g.const(1, I64)), g.const([0], I64))
    x = g.op("Add", g.op("Gather", g.weight((vocab, hidden), 0.5), ids),
             g.op("Gather", g.weight((64, hidden), 0.5), positions))  # fmt: skip
    causal = g.const(np.tril(np.ones((64, 64), bool))[None, None], np.bool_)
    to_heads = g.const([0, 0, heads, head], I64)
    for _ in range(layers):
        qkv = _conv1d(g, layer_norm(g, x, hidden, decomposed=True), hidden, 3 * hidden)
        q, k, v = g.op("Split", qkv, g.const([hidden] * 3, I64), axis=2, outputs=3)
        q = g.op("Transpose", g.op("Reshape", q, to_heads), perm=[0, 2, 1, 3])
        k = g.op("Transpose", g.op("Reshape", k, to_heads), perm=[0, 2, 3, 1])
        v = g.op("Transpose", g.op("Reshape", v, to_heads), perm=[0, 2, 1, 3])
        scores = g.op("Div", g.op("MatMul", q, k), g.const(math.sqrt(head)))
        shape = g.op("Shape", scores)
        key_length = g.op("Squeeze", g.op("Slice", shape, g.const([-1], I64), g.const([2**62], I64)),
                          g.const([0], I64))  # fmt: skip
        query_length = g.op("Squeeze", g.op("Slice", shape, g.const([-2], I64), g.const([-1], I64)),
                            g.const([0], I64))  # fmt: skip
        start = g.op("Unsqueeze", g.op("Sub", key_length, query_length), g.const([0], I64))
        end = g.op("Unsqueeze", key_length, g.const([0], I64))
        rows = g.op("Slice", causal, start, end, g.const([2], I64), g.const([1], I64))
        allowed = g.op("Slice", rows, g.const([0], I64), end, g.const([3], I64), g.const([1], I64))
        masked = g.op("Where", allowed, scores, g.const(np.finfo(np.float32).min))
        context = g.op("Transpose", g.op("MatMul", g.op("Softmax", masked, axis=-1), v), perm=[0, 2, 1, 3])
        merged = g.op("Reshape", context, g.const([0, 0, hidden], I64))
        x = g.op("Add", x, _conv1d(g, merged, hidden, hidden))
        inner = tanh_gelu(g, _conv1d(g, layer_norm(g, x, hidden, decomposed=True), hidden, 4 * hidden))
        x = g.op("Add", x, _conv1d(g, inner, 4 * hidden, hidden))
    return g.model(layer_norm(g, x, hidden, decomposed=True), dims + [hidden])


def vit(hidden: int = 32, heads: int = 2, layers: int = 2, image: int = 12, patch: int = 4) -> onnx.ModelProto:
    """A pre-LN ViT: a patch-embedding Conv (stride = kernel = patch), flattened to tokens behind a class token
    (Expand to the batch), position embeddings, ``layers`` blocks without mask, a final LayerNorm."""
    g = Graph(2)
    pixels = g.input("pixel_values", TensorProto.FLOAT, ["batch", 3, image, image])
    embedded = g.op("Conv", pixels, g.weight((hidden, 3, patch, patch)), g.weight((hidden,)),
                    kernel_shape=[patch, patch], strides=[patch, patch])  # fmt: skip
    tokens = g.op("Transpose", g.op("Reshape", embedded, g.const([0, 0, -1], I64)), perm=[0, 2, 1])
    batch = g.op("Slice", g.op("Shape", pixels), g.const([0], I64), g.const([1], I64))
    cls = g.op("Expand", g.weight((1, 1, hidden)), g.op("Concat", batch, g.const([1, 1], I64), axis=0))
    sequence = (image // patch) ** 2 + 1
    x = g.op("Add", g.op("Concat", cls, tokens, axis=1), g.weight((1, sequence, hidden)))
    for _ in range(layers):
        x = g.op("Add", self_attention(g, layer_norm(g, x, hidden), hidden, heads, None), x)
        inner = erf_gelu(g, linear(g, layer_norm(g, x, hidden), hidden, 4 * hidden))
        x = g.op("Add", linear(g, inner, 4 * hidden, hidden), x)
    return g.model(layer_norm(g, x, hidden), ["batch", sequence, hidden])


def mlp(vocab: int = 100, width: int = 64, inner: int = 96, out: int = 32) -> onnx.ModelProto:
    """An embedding Gather and two biased MatMuls around a Relu (opset 21): the weights the quantizers rewrite."""
    g = Graph(4)
    ids = g.input("ids", TensorProto.INT64, [2, 8])
    hidden = g.op("Relu", linear(g, g.op("Gather", g.weight((vocab, width), 1.0), ids), width, inner))
    return g.model(linear(g, hidden, inner, out), [2, 8, out], opset=21)


def cnn(classes: int = 10) -> onnx.ModelProto:
    """Conv, Relu, MaxPool, a SiLU (Sigmoid, Mul) residual block, GlobalAveragePool, Flatten, Gemm, Softmax."""
    g = Graph(5)
    x = g.input("x", TensorProto.FLOAT, [1, 3, 8, 8])
    first = g.op("Conv", x, g.weight((8, 3, 3, 3), 0.3), g.weight((8,), 0.1), pads=[1, 1, 1, 1])
    pooled = g.op("MaxPool", g.op("Relu", first), kernel_shape=[2, 2], strides=[2, 2])
    second = g.op("Conv", pooled, g.weight((8, 8, 3, 3), 0.2), g.weight((8,), 0.1), pads=[1, 1, 1, 1])
    block = g.op("Add", g.op("Mul", second, g.op("Sigmoid", second)), pooled)
    flat = g.op("Flatten", g.op("GlobalAveragePool", block))
    logits = g.op("Gemm", flat, g.weight((classes, 8), 1.0), g.weight((classes,), 1.0), transB=1)
    return g.model(g.op("Softmax", logits, axis=-1), [1, classes])
