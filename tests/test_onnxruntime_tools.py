"""What onnxruntime's own tools write runs on ortgpu: the transformer optimizer's fused BERT, GPT-2 and ViT graphs
(``onnxruntime.transformers.optimizer.optimize_model`` at ``opt_level`` 0, 1 and 2), and the quantization tools'
models (``quantize_dynamic``, ``quantize_static`` in QDQ and QOperator formats, ``MatMulNBitsQuantizer``).

The float models come from ``tests/onnxruntime_tool_models.py`` (torch's export form, built with ``onnx.helper``);
each test first asserts that the tool really wrote the com.microsoft operators it is meant to, then runs the result
in an ``ortgpu.InferenceSession`` on both backends, asserts from ``get_node_placement()`` that every com.microsoft
node (for the float models, every node) runs on the device, and compares with onnxruntime's CPU provider on the
same file.

Tolerances: float outputs within 1e-4 of the output's largest magnitude.  QDQ models equal onnxruntime exactly when
onnxruntime runs them as written (graph optimizations off: dequantize, float operator, quantize); onnxruntime's
default session fuses each QDQ group into an integer kernel whose requantization rounds on its own, so against that
session the outputs may differ by a step of the last quantizer per fused group, at most two steps here.
MatMulNBits at ``accuracy_level`` 4 is compared at 3e-2, as in ``tests/test_contrib_quantized_matmul.py`` (onnxruntime
then quantizes A to int8 per block, which ortgpu does not).

Two quirks of the tools, worked around here: ``optimize_model`` with ``opt_level`` >= 1 imports ``torch.version``
only to pick a GPU provider (a stub stands in where torch is absent, as in CI), and the optimizer's symbolic shape
inference needs sympy (a dependency of ``onnx-ir``, which ``MatMulNBitsQuantizer`` needs: the ``test`` extra has it).
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper
from onnxruntime.transformers.fusion_options import AttentionMaskFormat
from onnxruntime_tool_models import bert, cnn, gpt2, mlp, vit

import ortgpu

MS = "com.microsoft"


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``optimize_by_onnxruntime`` runs ``from torch import version`` and reads ``version.hip`` only when asked
    for a GPU; without torch installed a stub with ``hip = None`` lets the CPU optimization run."""
    try:
        import torch  # noqa: F401
    except ImportError:
        stub = types.ModuleType("torch")
        stub.version = types.SimpleNamespace(hip=None)  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "torch", stub)


def _ops(model: onnx.ModelProto, domain: str = MS) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node if node.domain == domain)


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray], optimize: bool = True) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(value) for value in session.run(None, feeds)]


def _ortgpu(
    env: Any, model: onnx.ModelProto, feeds: dict[str, np.ndarray], every_node_on_device: bool = True
) -> list[np.ndarray]:
    """Run on ortgpu; every com.microsoft node (and every node where ``every_node_on_device``) on the device."""
    domains = {node.name: node.domain for node in model.graph.node}
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        placements = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        contributed = [p for p in placements if domains.get(p.node) == MS]
        assert contributed, "the model has no com.microsoft node"
        checked = placements if every_node_on_device else contributed
        off_device = [(p.node, p.op_type, p.reason) for p in checked if p.placement != "webgpu"]
        assert not off_device, off_device
        return [np.asarray(value) for value in session.run(None, feeds)]


def _assert_close(got: np.ndarray, want: np.ndarray, tolerance: float = 1e-4) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    scale = max(1.0, float(np.abs(want.astype(np.float64)).max(initial=0.0)))
    error = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0.0))
    assert error <= tolerance * scale, f"error {error} at scale {scale}"


def _check(
    env: Any, model: onnx.ModelProto, feeds: dict[str, np.ndarray], tolerance: float = 1e-4, **kwargs: Any
) -> None:
    for got, want in zip(_ortgpu(env, model, feeds, **kwargs), _onnxruntime(model, feeds), strict=True):
        _assert_close(got, want, tolerance)


def _save(model: onnx.ModelProto, path: Path) -> str:
    onnx.save(model, path)
    return str(path)


# -- the transformer optimizer ---------------------------------------------------------------------------------------


def _optimize(tmp_path: Path, model: onnx.ModelProto, kind: str, heads: int, level: int, **options: Any) -> Any:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    fusion_options = FusionOptions(kind)
    for name, value in options.items():
        assert hasattr(fusion_options, name), name
        setattr(fusion_options, name, value)
    optimizer = optimize_model(
        _save(model, tmp_path / "exported.onnx"), model_type=kind, num_heads=heads, hidden_size=32,
        opt_level=level, optimization_options=fusion_options,
    )  # fmt: skip
    optimizer.save_model_to_file(str(tmp_path / "optimized.onnx"))
    return onnx.load(tmp_path / "optimized.onnx")


def _text_feeds(seed: int, batch: int = 2, sequence: int = 8, mask: bool = True) -> dict[str, np.ndarray]:
    """Token ids, and for BERT a right-padded mask (the second row's last three keys masked) and token types."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 100, (batch, sequence)).astype(np.int64)}
    if mask:
        lengths = np.array([sequence, sequence - 3][:batch])
        feeds["attention_mask"] = (np.arange(sequence)[None, :] < lengths[:, None]).astype(np.int64)
        feeds["token_type_ids"] = (np.arange(sequence)[None, :] >= sequence // 2).repeat(batch, 0).astype(np.int64)
    return feeds


def _optimized_and_checked(
    env: Any, tmp_path: Path, exported: onnx.ModelProto, kind: str, heads: int, level: int,
    feeds: dict[str, np.ndarray], expected: dict[str, int], **options: Any,
) -> onnx.ModelProto:  # fmt: skip
    """Optimize, assert the fused operators are ``expected`` exactly, check the fused model keeps the export's
    results (onnxruntime on both; the tanh approximation of GELU, asked for, moves them by up to 1e-3), and run it
    on ortgpu."""
    optimized = _optimize(tmp_path, exported, kind, heads, level, **options)
    assert _ops(optimized) == Counter(expected), _ops(optimized)
    tool_tolerance = 1e-3 if options.get("enable_gelu_approximation") else 1e-4
    for fused, plain in zip(_onnxruntime(optimized, feeds), _onnxruntime(exported, feeds), strict=True):
        _assert_close(fused, plain, tool_tolerance)
    _check(env, optimized, feeds)
    return optimized


BERT_FUSED = {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}


@pytest.mark.parametrize("level", [0, 1, 2])
def test_bert_optimized(env: Any, tmp_path: Path, no_torch: None, level: int) -> None:
    """The default BERT fusion: the embeddings and first LayerNorm in EmbedLayerNormalization (whose mask index,
    each row's key count, feeds Attention), Attention per layer, residual + LayerNorm in SkipLayerNormalization
    with the projection's bias folded in, BiasGelu."""
    optimized = _optimized_and_checked(env, tmp_path, bert(), "bert", 4, level, _text_feeds(0), BERT_FUSED)
    attention = [node for node in optimized.graph.node if node.op_type == "Attention"]
    embed = next(node for node in optimized.graph.node if node.op_type == "EmbedLayerNormalization")
    assert all(node.input[3] == embed.output[1] for node in attention)  # the mask index


@pytest.mark.parametrize(
    ("variant", "exported", "options", "expected"),
    [
        ("multi_head", bert(), {"use_multi_head_attention": True}, {**BERT_FUSED, "Attention": 0, "MultiHeadAttention": 2}),
        ("raw_mask", bert(), {"enable_embed_layer_norm": False, "attention_mask_format": AttentionMaskFormat.AttentionMask},
         {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}),
        ("fast_gelu", bert(), {"enable_gelu_approximation": True}, {**BERT_FUSED, "BiasGelu": 0, "FastGelu": 2}),
        ("decomposed_norms", bert(decomposed=True), {}, BERT_FUSED),
        ("mul_scale_unfused", bert(scale_by="Mul"), {}, {**BERT_FUSED, "Attention": 0}),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)  # fmt: skip
def test_bert_optimizer_variants(
    env: Any, tmp_path: Path, variant: str, exported: onnx.ModelProto, options: dict[str, Any],
    expected: dict[str, int],
) -> None:  # fmt: skip
    """MultiHeadAttention (separate Q/K/V MatMuls, the bias packed in); a raw 0/1 mask (AttentionMask format, cast
    to int32 for Attention); FastGelu instead of BiasGelu; LayerNorm written out.

    Scores scaled by ``Mul`` (1 / sqrt(H)) instead of ``Div`` stay unfused, a near miss that must still run: the
    optimizer's no-mask pattern knows only ``Div``, and its mask pattern starts from the Add's first ``Mul`` parent,
    which is then the scale, not the mask's."""
    expected = {op: count for op, count in expected.items() if count}
    _optimized_and_checked(env, tmp_path, exported, "bert", 4, 0, _text_feeds(1), expected, **options)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_gpt2_optimized(env: Any, tmp_path: Path, no_torch: None, level: int) -> None:
    """GPT-2 without past: Attention with ``unidirectional = 1`` (the causal-mask chain pruned), FastGelu from the
    tanh form with its bias folded in, LayerNorm fused from its written-out form, then SkipLayerNormalization."""
    expected = {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "FastGelu": 2}
    optimized = _optimized_and_checked(env, tmp_path, gpt2(), "gpt2", 4, level, _text_feeds(2, mask=False), expected)
    attention = [node for node in optimized.graph.node if node.op_type == "Attention"]
    assert all(onnx.helper.get_node_attr_value(node, "unidirectional") == 1 for node in attention)


def _pixels(seed: int, batch: int = 2) -> dict[str, np.ndarray]:
    return {"pixel_values": np.random.default_rng(seed).standard_normal((batch, 3, 12, 12)).astype(np.float32)}


@pytest.mark.parametrize("level", [0, 1, 2])
def test_vit_optimized(env: Any, tmp_path: Path, no_torch: None, level: int) -> None:
    """ViT (pre-LN, no mask): Attention, SkipLayerNormalization returning the residual sum too (its fourth output,
    the next block's residual), BiasGelu; the patch Conv, class token and final LayerNorm stay standard."""
    expected = {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    optimized = _optimized_and_checked(env, tmp_path, vit(), "vit", 2, level, _pixels(3), expected)
    sums = [node for node in optimized.graph.node if node.op_type == "SkipLayerNormalization" and len(node.output) > 3]
    assert sums and all(node.output[3] for node in sums)


def test_vit_multi_head_attention_one_image(env: Any, tmp_path: Path) -> None:
    """MultiHeadAttention without mask, a batch of one."""
    expected = {"MultiHeadAttention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    options = {"use_multi_head_attention": True}
    _optimized_and_checked(env, tmp_path, vit(), "vit", 2, 0, _pixels(4, 1), expected, **options)


# -- quantization tools ----------------------------------------------------------------------------------------------


class _Calibration:
    """A tiny calibration data reader (``get_next`` until None), as ``quantize_static`` reads one."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def _images(seed: int, count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(count)]


def _quantize_static(
    tmp_path: Path, model: onnx.ModelProto, quant_format: str, weight_type: str = "QInt8", **kwargs: Any
) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(
        _save(model, tmp_path / "float.onnx"), str(tmp_path / "quantized.onnx"), _Calibration(_images(5, 4)),
        quant_format=QuantFormat.from_string(quant_format), activation_type=QuantType.QUInt8,
        weight_type=QuantType.from_string(weight_type), **kwargs,
    )  # fmt: skip
    return onnx.load(tmp_path / "quantized.onnx")


def _last_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that writes the output: one step of the output's quantization."""
    producer = next(node for node in model.graph.node if "output" in node.output)
    assert producer.op_type == "DequantizeLinear", producer.op_type
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    return float(numpy_helper.to_array(initializers[producer.input[1]]))


@pytest.mark.parametrize("contrib", [False, True], ids=["onnx-qdq", "com.microsoft-qdq"])
def test_quantize_static_qdq(env: Any, tmp_path: Path, contrib: bool) -> None:
    """QDQ around every operator; with ``UseQDQContribOps`` the Q/DQ nodes are com.microsoft's."""
    quantized = _quantize_static(tmp_path, cnn(), "QDQ", extra_options={"UseQDQContribOps": contrib})
    counts = _ops(quantized)
    assert (counts["QuantizeLinear"] > 0 and counts["DequantizeLinear"] > 0) == contrib, counts
    feeds = _images(6, 1)[0]
    [got] = _ortgpu(env, quantized, feeds) if contrib else _ortgpu_plain(env, quantized, feeds)
    [as_written] = _onnxruntime(quantized, feeds, optimize=False)
    np.testing.assert_array_equal(got, as_written)
    [fused] = _onnxruntime(quantized, feeds)
    assert np.abs(got - fused).max() <= 2 * _last_step(quantized) * (1 + 1e-6)


@pytest.mark.parametrize("weight_type", ["QInt4", "QUInt4"])
def test_quantize_static_qdq_four_bit_weights(env: Any, tmp_path: Path, weight_type: str) -> None:
    """4-bit weights: onnxruntime writes them as INT4/UINT4 initializers read by com.microsoft DequantizeLinear
    (the standard one takes 4-bit types only from opset 21); every node runs on the device, and the output equals
    onnxruntime's running the file as written."""
    quantized = _quantize_static(tmp_path, cnn(), "QDQ", weight_type)
    four_bit = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
    assert any(t.data_type in four_bit for t in quantized.graph.initializer)
    feeds = _images(8, 1)[0]
    [got] = _ortgpu(env, quantized, feeds)
    [as_written] = _onnxruntime(quantized, feeds, optimize=False)
    np.testing.assert_array_equal(got, as_written)


def _ortgpu_plain(env: Any, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model without com.microsoft nodes, every node on the device."""
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        placements = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        assert all(p.placement == "webgpu" for p in placements), [(p.op_type, p.reason) for p in placements]
        return [np.asarray(value) for value in session.run(None, feeds)]


QOPERATOR_SUPPORTED = ["Conv", "Relu", "MaxPool", "Sigmoid", "Mul", "Add", "GlobalAveragePool", "Flatten"]


def test_quantize_static_qoperator(env: Any, tmp_path: Path) -> None:
    """QOperator format: QLinearConv (onnx) and com.microsoft's QLinearSigmoid, QLinearMul, QLinearAdd and
    QLinearGlobalAveragePool; quantized inside, float at the ends.  The standard MaxPool between them reads uint8,
    which its WebGPU kernel does not take: it runs on the CPU, the com.microsoft nodes on the device."""
    quantized = _quantize_static(tmp_path, cnn(), "QOperator", op_types_to_quantize=QOPERATOR_SUPPORTED)
    assert _ops(quantized) == Counter(
        {"QLinearSigmoid": 1, "QLinearMul": 1, "QLinearAdd": 1, "QLinearGlobalAveragePool": 1}
    ), _ops(quantized)
    assert _ops(quantized, "")["QLinearConv"] == 2
    feeds = _images(7, 1)[0]
    [got] = _ortgpu(env, quantized, feeds, every_node_on_device=False)  # MaxPool on uint8 runs on the CPU
    [want] = _onnxruntime(quantized, feeds)
    _assert_close(got, want)  # the float Gemm and Softmax after it: one quantization step apart would be ~1e-2


def test_quantize_static_qoperator_gemm_and_softmax(env: Any, tmp_path: Path) -> None:
    """Quantizing every operator also writes com.microsoft QGemm and QLinearSoftmax; both run on the device (the
    uint8 MaxPool runs on the CPU), and the float output (the softmax's bytes dequantized) matches onnxruntime."""
    quantized = _quantize_static(tmp_path, cnn(), "QOperator")
    assert {"QGemm", "QLinearSoftmax"} <= set(_ops(quantized)), _ops(quantized)
    for feeds in _images(7, 2):
        with ortgpu.InferenceSession(quantized.SerializeToString(), env=env) as session:
            placements = session.get_node_placement({name: value.shape for name, value in feeds.items()})
            placed = [(p.op_type, p.placement) for p in placements if p.op_type in ("QGemm", "QLinearSoftmax")]
            assert {op for op, _ in placed} == {"QGemm", "QLinearSoftmax"}, placed
            assert all(where == "webgpu" for _, where in placed), placed
            [got] = [np.asarray(value) for value in session.run(None, feeds)]
        [want] = _onnxruntime(quantized, feeds)
        _assert_close(got, want)


def test_quantize_dynamic_mlp(env: Any, tmp_path: Path) -> None:
    """quantize_dynamic writes standard operators for MatMul (DynamicQuantizeLinear, MatMulInteger, float scales);
    onnxruntime fuses them at load into DynamicQuantizeMatMul, ortgpu runs them as written, on the device."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized_path = tmp_path / "quantized.onnx"
    quantize_dynamic(_save(mlp(), tmp_path / "float.onnx"), str(quantized_path), weight_type=QuantType.QInt8)
    quantized = onnx.load(quantized_path)
    assert _ops(quantized, "")["MatMulInteger"] == 2 and not _ops(quantized)
    feeds = {"ids": np.random.default_rng(8).integers(0, 100, (2, 8)).astype(np.int64)}
    for got, want in zip(_ortgpu_plain(env, quantized, feeds), _onnxruntime(quantized, feeds), strict=True):
        _assert_close(got, want)


def test_quantize_dynamic_transformer(env: Any, tmp_path: Path) -> None:
    """onnxruntime's int8 BERT recipe (optimize, then quantize_dynamic) writes QEmbedLayerNormalization (8-bit
    embedding tables) and QAttention (its input quantized by a DynamicQuantizeLinear node before it): every
    com.microsoft node on the device, the outputs within 1e-4 of onnxruntime's (both dequantize the same integer
    sums in float32; a changed quantization step of an activation would move them by ~1e-2)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    optimized_path = _save(_optimize(tmp_path, bert(), "bert", 4, 0), tmp_path / "fused.onnx")
    quantize_dynamic(
        optimized_path, str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},  # the fused outputs have no inferred type
    )  # fmt: skip
    quantized = onnx.load(tmp_path / "int8.onnx")
    assert _ops(quantized) == Counter(
        {"QEmbedLayerNormalization": 1, "QAttention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    ), _ops(quantized)
    _check(env, quantized, _text_feeds(3))


def _nbits(model: onnx.ModelProto, **kwargs: Any) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, **kwargs)
    quantizer.process()
    result: onnx.ModelProto = quantizer.model.model
    return result


NBITS_CASES: dict[str, tuple[dict[str, Any], float]] = {
    "4bit_asymmetric": ({"bits": 4, "block_size": 32}, 1e-4),
    "4bit_symmetric_block16": ({"bits": 4, "block_size": 16, "is_symmetric": True}, 1e-4),
    "8bit": ({"bits": 8, "block_size": 32}, 1e-4),
    "4bit_accuracy_level_4": ({"bits": 4, "block_size": 32, "accuracy_level": 4}, 3e-2),
}


@pytest.mark.parametrize("case", sorted(NBITS_CASES))
def test_matmul_nbits_quantizer(env: Any, case: str) -> None:
    options, tolerance = NBITS_CASES[case]
    quantized = _nbits(mlp(), **options)
    assert _ops(quantized) == Counter({"MatMulNBits": 2}), _ops(quantized)
    feeds = {"ids": np.random.default_rng(9).integers(0, 100, (2, 8)).astype(np.int64)}
    _check(env, quantized, feeds, tolerance)


def test_matmul_nbits_on_the_optimized_gpt2(env: Any, tmp_path: Path) -> None:
    """The LLM recipe on a small scale: fuse GPT-2, then 4-bit weights for the MatMuls the fusion left."""
    quantized = _nbits(_optimize(tmp_path, gpt2(), "gpt2", 4, 0), bits=4, block_size=32)
    assert _ops(quantized) == Counter(
        {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "FastGelu": 2, "MatMulNBits": 6}
    ), _ops(quantized)
    _check(env, quantized, _text_feeds(10, mask=False))


@pytest.mark.parametrize(
    "options",
    [
        {"bits": 4, "block_size": 32, "op_types_to_quantize": ("MatMul", "Gather"),
         "quant_axes": (("MatMul", 0), ("Gather", 1))},
        {"bits": 4, "block_size": 32, "quant_format": "QDQ"},
    ],
    ids=["gather_block_quantized", "qdq_blockwise"],
)  # fmt: skip
def test_matmul_nbits_4bit_tensors(env: Any, options: dict[str, Any]) -> None:
    """GatherBlockQuantized's data and the QDQ format's blockwise DequantizeLinear weights are 4-bit tensors
    (UINT4): they load as ml_dtypes arrays and run (the planner packs or widens them for the kernels).  The QDQ
    model is compared with onnxruntime running it as written: its default session fuses DequantizeLinear and MatMul
    into MatMulNBits at accuracy level 4 (A quantized to int8)."""
    from onnxruntime.quantization import QuantFormat

    qdq = "quant_format" in options
    if qdq:
        options = {**options, "quant_format": QuantFormat.from_string(options["quant_format"])}
    quantized = _nbits(mlp(), **options)
    assert any(t.data_type in (onnx.TensorProto.UINT4, onnx.TensorProto.INT4) for t in quantized.graph.initializer)
    feeds = {"ids": np.random.default_rng(10).integers(0, 100, (2, 8)).astype(np.int64)}
    if qdq:  # no com.microsoft node: every node on the device
        got = _ortgpu_plain(env, quantized, feeds)
    else:
        assert _ops(quantized) == Counter({"MatMulNBits": 2, "GatherBlockQuantized": 1}), _ops(quantized)
        got = _ortgpu(env, quantized, feeds)
    for value, want in zip(got, _onnxruntime(quantized, feeds, optimize=not qdq), strict=True):
        _assert_close(value, want)
