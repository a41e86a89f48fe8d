"""Generators of models with the structure of real third-party ones (issue 12), built with ``onnx.helper`` from
fixed seeds: a YOLO-style detector head, a DBNet-style OCR detector, a classifier exported with ``-1`` dims, and
quantized MatMul/Conv models.  Small enough to run in the suite on lavapipe; the structure (operators, their
attributes, how they connect) is what real exporters write.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MODELS", "yolo_head", "dbnet_detector", "minus_one_classifier", "quantized_mlp", "quantized_conv"]


class _Builder:
    """Nodes and initializers of one graph, with unique names and seeded weights."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def constant(self, array: np.ndarray, stem: str = "c") -> str:
        name = self.name(stem)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs: object) -> list[str]:
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), **attrs))
        return names

    def conv(self, x: str, cin: int, cout: int, kernel: int = 3, stride: int = 1, group: int = 1) -> str:
        fan_in = cin // group * kernel * kernel
        weight = (self.rng.standard_normal((cout, cin // group, kernel, kernel)) / np.sqrt(fan_in)).astype(np.float32)
        bias = (0.1 * self.rng.standard_normal(cout)).astype(np.float32)
        pad = kernel // 2
        return self.node(
            "Conv",
            [x, self.constant(weight, "w"), self.constant(bias, "b")],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            group=group,
        )[0]

    def batch_norm(self, x: str, channels: int) -> str:
        scale = (1 + 0.1 * self.rng.standard_normal(channels)).astype(np.float32)
        bias = (0.1 * self.rng.standard_normal(channels)).astype(np.float32)
        mean = (0.1 * self.rng.standard_normal(channels)).astype(np.float32)
        var = (1 + 0.1 * self.rng.random(channels)).astype(np.float32)
        args = [x] + [self.constant(a, "bn") for a in (scale, bias, mean, var)]
        return self.node("BatchNormalization", args, epsilon=1e-5)[0]

    def silu(self, x: str) -> str:
        return self.node("Mul", [x, self.node("Sigmoid", [x])[0]])[0]

    def model(
        self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], opset: int
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "real_world", inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        return model


def yolo_head(size: int = 64, classes: int = 3) -> onnx.ModelProto:
    """A YOLOv5/v8-style detector: SiLU conv backbone at strides 8/16/32, an FPN that upsamples with ``Resize``
    (nearest, scales 2) and ``Concat``s, and per-scale heads reshaped to ``[1, boxes, 5 + classes]`` and
    concatenated (as exported detectors end)."""
    b = _Builder(11)
    x = b.silu(b.conv("images", 3, 8, stride=2))
    x = b.silu(b.conv(x, 8, 16, stride=2))
    p3 = b.silu(b.conv(x, 16, 16, stride=2))  # stride 8
    p4 = b.silu(b.conv(p3, 16, 24, stride=2))  # stride 16
    p5 = b.silu(b.conv(p4, 24, 32, stride=2))  # stride 32
    scales = b.constant(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    empty_roi = ""
    up5 = b.node("Resize", [p5, empty_roi, scales], mode="nearest")[0]
    f4 = b.silu(b.conv(b.node("Concat", [up5, p4], axis=1)[0], 56, 24, kernel=1))
    up4 = b.node("Resize", [f4, empty_roi, scales], mode="nearest")[0]
    f3 = b.silu(b.conv(b.node("Concat", [up4, p3], axis=1)[0], 40, 16, kernel=1))
    outputs = []
    for feature, channels in ((f3, 16), (f4, 24), (p5, 32)):
        head = b.conv(feature, channels, 5 + classes, kernel=1)
        flat = b.node("Reshape", [head, b.constant(np.array([1, 5 + classes, -1], dtype=np.int64), "shape")])[0]
        outputs.append(b.node("Transpose", [flat], perm=[0, 2, 1])[0])
    joined = b.node("Concat", outputs, axis=1)[0]
    b.node("Sigmoid", [joined])
    b.nodes[-1].output[0] = "detections"
    return b.model(
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("detections", TensorProto.FLOAT, None)],
        opset=13,
    )


def dbnet_detector(size: int = 64) -> onnx.ModelProto:
    """A DBNet-style text detector (as PaddleOCR/EasyOCR export it): a conv+BN+ReLU backbone at strides 4..32, an
    FPN that upsamples coarse maps with ``Resize`` (nearest x2, and x2/x4/x8 before the fuse ``Concat``), and a
    probability head of Conv, BN, ReLU and two stride-2 ``ConvTranspose`` back to the input size, then Sigmoid."""
    b = _Builder(23)

    def stage(x: str, cin: int, cout: int) -> str:
        return b.node("Relu", [b.batch_norm(b.conv(x, cin, cout, stride=2), cout)])[0]

    c1 = stage("image", 3, 8)
    c2 = stage(c1, 8, 8)  # stride 4
    c3 = stage(c2, 8, 16)  # stride 8
    c4 = stage(c3, 16, 16)  # stride 16
    c5 = stage(c4, 16, 16)  # stride 32
    lateral = [b.conv(c, ch, 8, kernel=1) for c, ch in ((c2, 8), (c3, 16), (c4, 16), (c5, 16))]

    def upsample(x: str, factor: int, mode: str = "nearest") -> str:
        scales = b.constant(np.array([1, 1, factor, factor], dtype=np.float32), "scales")
        roi = b.constant(np.array([], dtype=np.float32), "roi")
        return b.node("Resize", [x, roi, scales], mode=mode)[0]

    p5 = lateral[3]
    p4 = b.node("Add", [lateral[2], upsample(p5, 2)])[0]
    p3 = b.node("Add", [lateral[1], upsample(p4, 2, "linear")])[0]
    p2 = b.node("Add", [lateral[0], upsample(p3, 2)])[0]
    fused = b.node(
        "Concat",
        [
            b.conv(p2, 8, 4),
            upsample(b.conv(p3, 8, 4), 2),
            upsample(b.conv(p4, 8, 4), 4),
            upsample(b.conv(p5, 8, 4), 8),
        ],
        axis=1,
    )[0]
    head = b.node("Relu", [b.batch_norm(b.conv(fused, 16, 4), 4)])[0]
    up_weight = (b.rng.standard_normal((4, 4, 2, 2)) / 4).astype(np.float32)
    head = b.node(
        "ConvTranspose", [head, b.constant(up_weight, "wt"), b.constant(np.zeros(4, np.float32))], strides=[2, 2]
    )[0]
    head = b.node("Relu", [b.batch_norm(head, 4)])[0]
    last_weight = (b.rng.standard_normal((4, 1, 2, 2)) / 4).astype(np.float32)
    head = b.node("ConvTranspose", [head, b.constant(last_weight, "wt")], strides=[2, 2])[0]
    b.node("Sigmoid", [head])
    b.nodes[-1].output[0] = "probability"
    return b.model(
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("probability", TensorProto.FLOAT, [1, 1, size, size])],
        opset=11,
    )


def minus_one_classifier(size: int = 32, classes: int = 10) -> onnx.ModelProto:
    """A classifier as old exporters wrote it: batch dims of ``-1`` on its input and output (onnxruntime reads them
    as "any"), conv + BN + ReLU + max pooling, global average pooling, Flatten, Gemm and Softmax."""
    b = _Builder(37)
    x = b.node("Relu", [b.batch_norm(b.conv("input", 3, 8), 8)])[0]
    x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])[0]
    x = b.node("Relu", [b.batch_norm(b.conv(x, 8, 16, stride=2), 16)])[0]
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])[0]], axis=1)[0]
    weight = (b.rng.standard_normal((classes, 16)) / 4).astype(np.float32)
    logits = b.node("Gemm", [x, b.constant(weight, "fc"), b.constant(np.zeros(classes, np.float32))], transB=1)[0]
    b.node("Softmax", [logits], axis=1)
    b.nodes[-1].output[0] = "probabilities"
    return b.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [-1, 3, size, size])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [-1, classes])],
        opset=9,
    )


def quantized_mlp(features: int = 32, hidden: int = 48, outputs: int = 16) -> onnx.ModelProto:
    """A dynamically quantized MLP as onnxruntime's quantizer writes it: ``DynamicQuantizeLinear`` on the
    activations, ``MatMulInteger`` with uint8 weights and zero points, the int32 result scaled back to float
    (``Cast``, ``Mul`` by input scale x weight scale), bias, ReLU; then a static ``QuantizeLinear`` /
    ``QLinearMatMul`` / ``DequantizeLinear`` layer."""
    b = _Builder(41)
    x, x_scale, x_zero = b.node("DynamicQuantizeLinear", ["input"], outputs=3)
    weight = b.rng.integers(0, 256, (features, hidden), dtype=np.uint8)
    weight_zero = b.constant(np.array(128, dtype=np.uint8), "wz")
    product = b.node("MatMulInteger", [x, b.constant(weight, "wq"), x_zero, weight_zero])[0]
    as_float = b.node("Cast", [product], to=TensorProto.FLOAT)[0]
    scale = b.node("Mul", [x_scale, b.constant(np.array(0.02, dtype=np.float32), "ws")])[0]
    hidden_out = b.node("Mul", [as_float, scale])[0]
    hidden_out = b.node("Add", [hidden_out, b.constant((0.1 * b.rng.standard_normal(hidden)).astype(np.float32))])[0]
    hidden_out = b.node("Relu", [hidden_out])[0]
    a_scale, a_zero = b.constant(np.array(0.05, np.float32), "as"), b.constant(np.array(3, np.uint8), "az")
    quantized = b.node("QuantizeLinear", [hidden_out, a_scale, a_zero])[0]
    weight2 = b.rng.integers(0, 256, (hidden, outputs), dtype=np.uint8)
    w2_scale, w2_zero = b.constant(np.array(0.01, np.float32), "w2s"), b.constant(np.array(120, np.uint8), "w2z")
    y_scale, y_zero = b.constant(np.array(0.2, np.float32), "ys"), b.constant(np.array(128, np.uint8), "yz")
    q_out = b.node(
        "QLinearMatMul", [quantized, a_scale, a_zero, b.constant(weight2, "w2"), w2_scale, w2_zero, y_scale, y_zero]
    )[0]
    b.node("DequantizeLinear", [q_out, y_scale, y_zero])
    b.nodes[-1].output[0] = "output"
    return b.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", outputs])],
        opset=13,
    )


def quantized_conv(size: int = 16) -> onnx.ModelProto:
    """A statically quantized conv block (QDQ as exported, then QLinearConv and ConvInteger): QuantizeLinear,
    QLinearConv with per-channel weight scales, DequantizeLinear, ReLU, and a ConvInteger branch rescaled."""
    b = _Builder(53)
    x_scale, x_zero = b.constant(np.array(0.03, np.float32), "xs"), b.constant(np.array(128, np.uint8), "xz")
    q = b.node("QuantizeLinear", ["input", x_scale, x_zero])[0]
    weight = b.rng.integers(-100, 100, (8, 3, 3, 3), dtype=np.int8)
    w_scale = b.constant((0.01 + 0.01 * b.rng.random(8)).astype(np.float32), "ws")
    w_zero = b.constant(np.zeros(8, np.int8), "wz")
    y_scale, y_zero = b.constant(np.array(0.1, np.float32), "ys"), b.constant(np.array(100, np.uint8), "yz")
    bias = b.constant(b.rng.integers(-500, 500, 8).astype(np.int32), "bias")
    conv = b.node(
        "QLinearConv",
        [q, x_scale, x_zero, b.constant(weight, "w"), w_scale, w_zero, y_scale, y_zero, bias],
        pads=[1, 1, 1, 1],
    )[0]
    main = b.node("Relu", [b.node("DequantizeLinear", [conv, y_scale, y_zero])[0]])[0]
    integer_weight = b.rng.integers(0, 256, (8, 3, 3, 3), dtype=np.uint8)
    branch = b.node(
        "ConvInteger",
        [q, b.constant(integer_weight, "wi"), x_zero, b.constant(np.array(128, np.uint8))],
        pads=[1, 1, 1, 1],
    )[0]
    branch = b.node("Mul", [b.node("Cast", [branch], to=TensorProto.FLOAT)[0], b.constant(np.array(3e-4, np.float32))])[
        0
    ]
    b.node("Add", [main, branch])
    b.nodes[-1].output[0] = "output"
    return b.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, size, size])],
        opset=13,
    )


#: name -> (generator, input shapes to feed: several for models with free dims)
MODELS: dict[str, tuple[Callable[[], onnx.ModelProto], list[dict[str, tuple[int, ...]]]]] = {
    "yolo_head": (yolo_head, [{"images": (1, 3, 64, 64)}]),
    "dbnet_detector": (dbnet_detector, [{"image": (1, 3, 64, 64)}]),
    "minus_one_classifier": (minus_one_classifier, [{"input": (1, 3, 32, 32)}, {"input": (3, 3, 32, 32)}]),
    "quantized_mlp": (quantized_mlp, [{"input": (4, 32)}, {"input": (1, 32)}]),
    "quantized_conv": (quantized_conv, [{"input": (1, 3, 16, 16)}]),
}
