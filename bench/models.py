"""Model builders shared by the tests and the benchmarks (onnx.helper, deterministic weights).

Every builder returns a checked ``onnx.ModelProto`` whose sizes are parameters:

* :func:`mlp`: ``layers`` x (MatMul + bias Add + Relu), input ``X [batch, width]``.
* :func:`resnet`: a small ResNet-style CNN (Conv/BatchNorm/Relu stem, residual blocks, global pool, Gemm).
* :func:`depthwise_separable`: a MobileNet-style block (depthwise Conv, BatchNorm, Clip 0..6, pointwise Conv).
* :func:`transformer_encoder`: token ids -> embedding Gather -> a pre-norm encoder block with multi-head
  attention whose head reshapes are computed from ``Shape`` (so they exercise constant folding).
* :func:`matmul_chain`: ``layers`` x MatMul ``[M, K] x [K, K]`` (nothing else), compute-bound for large ``M``.
* :func:`conv_chain`: ``layers`` x (Conv 3x3 pad 1, ``C -> C`` channels, bias, Relu) on ``[batch, C, S, S]``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "mlp",
    "resnet",
    "depthwise_separable",
    "transformer_encoder",
    "matmul_chain",
    "conv_chain",
    "random_feeds",
]


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.counter = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def weight(self, prefix: str, array: np.ndarray) -> str:
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def normal(self, prefix: str, shape: tuple[int, ...], scale: float) -> str:
        return self.weight(prefix, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op_type: str, inputs: list[str], n_outputs: int = 1, **attrs: object) -> list[str]:
        outputs = [self.name(op_type.lower()) for _ in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.name(f"n_{op_type}"), **attrs))  # type: ignore[arg-type]
        return outputs

    def one(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        return self.node(op_type, inputs, 1, **attrs)[0]

    def model(
        self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], opset: int
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="ortgpu-tests")
        model.ir_version = min(model.ir_version, 9)  # readable by older onnxruntime builds too
        onnx.checker.check_model(model)
        return model

    def model_xy(self, name: str, x_dims: list[int | str], y_dims: list[int | str], opset: int) -> onnx.ModelProto:
        """:meth:`model` with one float input ``X`` and one float output ``Y`` of those dimensions."""
        return self.model(
            name,
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims)],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_dims)],
            opset,
        )


def _rename_output(builder: _Builder, last: str, new: str) -> None:
    for node in builder.nodes:
        for i, name in enumerate(node.output):
            if name == last:
                node.output[i] = new


def mlp(layers: int = 16, width: int = 1024, batch: int = 1, *, seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """``layers`` x (MatMul [width, width] + Add bias + Relu); input ``X``, output ``Y`` (no Relu after the last).

    The batch dim is symbolic in the model; ``batch`` is the size tests and benchmarks feed.
    """
    b = _Builder(seed)
    x = "X"
    for layer in range(layers):
        w = b.normal("W", (width, width), 1.0 / np.sqrt(width))
        bias = b.normal("B", (width,), 0.1)
        x = b.one("MatMul", [x, w])
        x = b.one("Add", [x, bias])
        if layer + 1 < layers:
            x = b.one("Relu", [x])
    _rename_output(b, x, "Y")
    return b.model_xy("mlp", ["batch", width], ["batch", width], opset)


def _conv_bn(b: _Builder, x: str, c_in: int, c_out: int, kernel: int, stride: int, group: int = 1) -> str:
    w = b.normal("conv_w", (c_out, c_in // group, kernel, kernel), np.sqrt(2.0 / (c_in // group * kernel * kernel)))
    pad = kernel // 2
    y = b.one("Conv", [x, w], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, group=group)
    scale = b.weight("bn_scale", (1.0 + 0.1 * b.rng.standard_normal(c_out)).astype(np.float32))
    shift = b.weight("bn_bias", (0.1 * b.rng.standard_normal(c_out)).astype(np.float32))
    mean = b.weight("bn_mean", (0.1 * b.rng.standard_normal(c_out)).astype(np.float32))
    var = b.weight("bn_var", (1.0 + 0.1 * np.abs(b.rng.standard_normal(c_out))).astype(np.float32))
    return b.one("BatchNormalization", [y, scale, shift, mean, var], epsilon=1e-5)


def resnet(
    batch: int = 1,
    channels: int = 16,
    size: int = 32,
    blocks: int = 2,
    classes: int = 10,
    *,
    seed: int = 0,
    opset: int = 17,
) -> onnx.ModelProto:
    """Stem Conv3x3+BN+Relu, ``blocks`` residual blocks (the second and later stages downsample), pool, Gemm."""
    b = _Builder(seed)
    x = b.one("Relu", [_conv_bn(b, "X", 3, channels, 3, 1)])
    c = channels
    for block in range(blocks):
        downsample = block > 0
        c_out = c * 2 if downsample else c
        stride = 2 if downsample else 1
        y = b.one("Relu", [_conv_bn(b, x, c, c_out, 3, stride)])
        y = _conv_bn(b, y, c_out, c_out, 3, 1)
        shortcut = _conv_bn(b, x, c, c_out, 1, stride) if downsample else x
        x = b.one("Relu", [b.one("Add", [y, shortcut])])
        c = c_out
    pooled = b.one("GlobalAveragePool", [x])
    flat = b.one("Flatten", [pooled], axis=1)
    w = b.normal("fc_w", (classes, c), 1.0 / np.sqrt(c))
    bias = b.normal("fc_b", (classes,), 0.1)
    logits = b.one("Gemm", [flat, w, bias], transB=1)
    _rename_output(b, logits, "Y")
    return b.model_xy("resnet", ["batch", 3, size, size], ["batch", classes], opset)


def depthwise_separable(
    batch: int = 1, channels: int = 32, out_channels: int = 64, size: int = 28, *, seed: int = 0, opset: int = 17
) -> onnx.ModelProto:
    """Depthwise Conv3x3 (group = channels) + BN + Clip(0, 6), pointwise Conv1x1 + BN + Relu."""
    b = _Builder(seed)
    y = _conv_bn(b, "X", channels, channels, 3, 1, group=channels)
    low = b.weight("clip_lo", np.array(0.0, dtype=np.float32))
    high = b.weight("clip_hi", np.array(6.0, dtype=np.float32))
    y = b.one("Clip", [y, low, high])
    y = b.one("Relu", [_conv_bn(b, y, channels, out_channels, 1, 1)])
    _rename_output(b, y, "Y")
    return b.model_xy(
        "depthwise_separable", ["batch", channels, size, size], ["batch", out_channels, size, size], opset
    )


def transformer_encoder(
    batch: int = 1,
    seq: int = 16,
    vocab: int = 100,
    d_model: int = 64,
    heads: int = 4,
    ffn: int = 128,
    *,
    layers: int = 1,
    seed: int = 0,
    opset: int = 17,
) -> onnx.ModelProto:
    """ids ``[batch, seq]`` (int64) -> embedding + positions -> ``layers`` x (LN -> MHA -> residual -> LN -> FFN ->
    residual) -> LN.

    The head split reshapes take their batch and sequence sizes from ``Shape``, as exporters write them.
    """
    assert d_model % heads == 0
    head = d_model // heads
    b = _Builder(seed)
    table = b.normal("embedding", (vocab, d_model), 1.0)
    positions = b.normal("positions", (1, 4096 if seq <= 4096 else seq, d_model), 0.1)
    x = b.one("Gather", [table, "ids"], axis=0)
    shape = b.one("Shape", [x])
    idx0 = b.weight("i0", np.array([0], dtype=np.int64))
    idx1 = b.weight("i1", np.array([1], dtype=np.int64))
    batch_dim = b.one("Gather", [shape, idx0], axis=0)
    seq_dim = b.one("Gather", [shape, idx1], axis=0)
    starts = b.weight("starts", np.array([0], dtype=np.int64))
    axes = b.weight("axes", np.array([1], dtype=np.int64))
    pos = b.one("Slice", [positions, starts, seq_dim, axes])
    x = b.one("Add", [x, pos])

    def layer_norm(v: str) -> str:
        gamma = b.weight("ln_g", (1.0 + 0.1 * b.rng.standard_normal(d_model)).astype(np.float32))
        beta = b.weight("ln_b", (0.1 * b.rng.standard_normal(d_model)).astype(np.float32))
        return b.one("LayerNormalization", [v, gamma, beta], axis=-1, epsilon=1e-5)

    def linear(v: str, n_in: int, n_out: int) -> str:
        w = b.normal("W", (n_in, n_out), 1.0 / np.sqrt(n_in))
        bias = b.normal("B", (n_out,), 0.1)
        return b.one("Add", [b.one("MatMul", [v, w]), bias])

    heads_const = b.weight("heads", np.array([heads, head], dtype=np.int64))
    split_shape = b.one("Concat", [batch_dim, seq_dim, heads_const], axis=0)
    model_dim = b.weight("dmodel", np.array([d_model], dtype=np.int64))
    merge_shape = b.one("Concat", [batch_dim, seq_dim, model_dim], axis=0)

    for _ in range(layers):
        h = layer_norm(x)
        q = b.one("Transpose", [b.one("Reshape", [linear(h, d_model, d_model), split_shape])], perm=[0, 2, 1, 3])
        k = b.one("Transpose", [b.one("Reshape", [linear(h, d_model, d_model), split_shape])], perm=[0, 2, 3, 1])
        v = b.one("Transpose", [b.one("Reshape", [linear(h, d_model, d_model), split_shape])], perm=[0, 2, 1, 3])
        scale = b.weight("scale", np.array(1.0 / np.sqrt(head), dtype=np.float32))
        scores = b.one("Mul", [b.one("MatMul", [q, k]), scale])
        probs = b.one("Softmax", [scores], axis=-1)
        context = b.one("Transpose", [b.one("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        merged = b.one("Reshape", [context, merge_shape])
        x = b.one("Add", [x, linear(merged, d_model, d_model)])

        h = layer_norm(x)
        f = linear(h, d_model, ffn)
        if opset >= 20:
            f = b.one("Gelu", [f])
        else:
            sqrt2 = b.weight("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
            half = b.weight("half", np.array(0.5, dtype=np.float32))
            one = b.weight("one", np.array(1.0, dtype=np.float32))
            erf = b.one("Erf", [b.one("Div", [f, sqrt2])])
            f = b.one("Mul", [b.one("Mul", [f, half]), b.one("Add", [erf, one])])
        x = b.one("Add", [x, linear(f, ffn, d_model)])
    y = layer_norm(x)
    _rename_output(b, y, "Y")
    return b.model(
        "transformer_encoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "seq", d_model])],
        opset,
    )


def matmul_chain(k: int, layers: int = 8, *, seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """``layers`` x MatMul by a ``[k, k]`` weight; input ``X [batch, k]``, output ``Y [batch, k]``.

    The weights are N(0, 1/k), so each product keeps the activations' scale and a long chain does not overflow.
    """
    b = _Builder(seed)
    x = "X"
    for _ in range(layers):
        x = b.one("MatMul", [x, b.normal("W", (k, k), 1.0 / np.sqrt(k))])
    _rename_output(b, x, "Y")
    return b.model_xy("matmul_chain", ["batch", k], ["batch", k], opset)


def conv_chain(channels: int, size: int, layers: int = 8, *, seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """``layers`` x (Conv 3x3, stride 1, pad 1, ``channels -> channels``, bias + Relu); input ``X [batch, channels,
    size, size]``, output ``Y`` of the same shape. He-scaled weights keep the activations bounded."""
    b = _Builder(seed)
    x = "X"
    for _ in range(layers):
        w = b.normal("conv_w", (channels, channels, 3, 3), np.sqrt(2.0 / (channels * 9)))
        bias = b.normal("conv_b", (channels,), 0.1)
        x = b.one("Relu", [b.one("Conv", [x, w, bias], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])])
    _rename_output(b, x, "Y")
    return b.model_xy("conv_chain", ["batch", channels, size, size], ["batch", channels, size, size], opset)


def random_feeds(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], *, seed: int | None = 1, high: int = 10
) -> dict[str, np.ndarray]:
    """Random inputs for ``model`` (floats ~ N(0, 1), integers in [0, high))."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        shape = shapes[value.name]
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(0, high, size=shape).astype(dtype)
    return feeds
