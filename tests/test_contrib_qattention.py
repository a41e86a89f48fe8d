"""onnxruntime's int8 BERT operators (com.microsoft QAttention and QEmbedLayerNormalization): single-node models on
both backends against onnxruntime's CPU provider, every node on the device where its path is meant to run there.

Tolerance: 1e-4 of the largest expected value.  Both operators dequantize exactly as onnxruntime does (the integer
sums are exact, each scaled once in float32), so the only differences are float32 rounding in the attention or the
layer normalisation; a quantization step of these tables would be ~1e-2, far outside it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import shared_env
from helpers import run_model
from onnx import TensorProto, helper
from test_ops_elementwise import open_device

import ortgpu
from ortgpu_core._errors import InvalidArgumentError, ModelError, ShapeError, UnsupportedOpError

F, H16, I32, U8, I8 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.UINT8, TensorProto.INT8
_NP = {F: np.float32, H16: np.float16, I32: np.int32, U8: np.uint8, I8: np.int8}
#: a shape error found while the loader learns the outputs' shapes arrives as a ModelError carrying the message
SHAPE_ERRORS = (ShapeError, ModelError)
_DEVICES: dict[str, Any] = {}

Spec = tuple[str, int, tuple[int, ...], np.ndarray] | None


def _device(backend_name: str) -> Any:
    if backend_name not in _DEVICES:
        _DEVICES[backend_name] = open_device(backend_name)
    return _DEVICES[backend_name]


def _model(op: str, inputs: list[Spec], outputs: list[tuple[str, int]], **attrs: Any) -> bytes:
    """One com.microsoft node over graph inputs (``None``: an absent optional input)."""
    names, infos = [], []
    for spec in inputs:
        if spec is None:
            names.append("")
            continue
        names.append(spec[0])
        infos.append(helper.make_tensor_value_info(spec[0], spec[1], list(spec[2])))
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, [name for name, _ in outputs], domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node], "g", infos, [helper.make_tensor_value_info(name, kind, None) for name, kind in outputs]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    return model.SerializeToString()


def _feeds(inputs: list[Spec]) -> dict[str, np.ndarray]:
    return {spec[0]: spec[3] for spec in inputs if spec is not None}


def _onnxruntime(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds))


def _assert_close(got: list[np.ndarray], want: list[np.ndarray], tolerance: float = 1e-4) -> None:
    assert len(got) == len(want)
    for mine, theirs in zip(got, want):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, (mine.shape, mine.dtype, theirs.shape)
        scale = max(1.0, float(np.abs(theirs.astype(np.float64)).max(initial=0.0)))
        error = float(np.abs(mine.astype(np.float64) - theirs.astype(np.float64)).max(initial=0.0))
        assert error <= tolerance * scale, f"error {error} at scale {scale}"


def _check(backend_name: str, model: bytes, feeds: dict[str, np.ndarray], on_device: bool = True) -> Any:
    """ortgpu against onnxruntime; the node on the device when ``on_device``, else on the CPU (the plan is returned
    so a test can read the reason)."""
    got, plan = run_model(model, feeds, _device(backend_name), allow_cpu=not on_device)
    placements = [step.placement for step in plan.steps]
    assert placements == (["webgpu"] if on_device else ["cpu"]), plan.describe()
    _assert_close(got, _onnxruntime(model, feeds))
    return plan


def _table(rng: np.random.Generator, shape: tuple[int, ...], kind: int) -> np.ndarray:
    low, high = (0, 256) if kind == U8 else (-128, 128)
    return rng.integers(low, high, shape).astype(_NP[kind])


# -- QAttention ------------------------------------------------------------------------------------------------------

QATTENTION_CASES: dict[str, dict[str, Any]] = {
    "defaults_no_mask": {},
    "key_lengths": {"mask": "1d"},
    "end_and_start": {"mask": "2b"},
    "raw_mask": {"mask": "2d"},
    "mask_3d_causal": {"mask": "3d", "attrs": {"unidirectional": 1, "mask_filter_value": -5000.0}},
    "causal_scale": {"attrs": {"unidirectional": 1, "scale": 0.3}},
    "uint8_weights": {"weight": U8, "mask": "1d"},
    "no_zero_points": {"zero_points": False, "mask": "2d"},
    "past_present": {"mask": "2d", "past": 2, "attrs": {"unidirectional": 1}},
    "odd_sizes": {"batch": 1, "sequence": 3, "input_hidden": 7, "heads": 3, "hidden": 9, "mask": "1d"},
    "per_column_scale": {"per_column": "scale", "mask": "1d", "cpu": True},
    "per_column_zero_point": {"per_column": "zero", "mask": "1d", "cpu": True},
}


def _qattention(case: dict[str, Any], seed: int = 0) -> tuple[bytes, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    batch, sq = case.get("batch", 2), case.get("sequence", 4)
    k, heads, hidden = case.get("input_hidden", 8), case.get("heads", 2), case.get("hidden", 8)
    past, weight = case.get("past", 0), case.get("weight", I8)
    total, head = past + sq, hidden // heads
    width = 3 * hidden
    per_column = case.get("per_column")
    weight_scale = (rng.random(width) * 0.02 + 0.005).astype(np.float32) if per_column == "scale" else np.float32(0.011)
    inputs: list[Spec] = [
        ("x", U8, (batch, sq, k), _table(rng, (batch, sq, k), U8)),
        ("w", weight, (k, width), _table(rng, (k, width), weight)),
        ("bias", F, (width,), rng.standard_normal(width).astype(np.float32)),
        ("x_scale", F, (), np.array(0.013, np.float32)),
        ("w_scale", F, np.shape(weight_scale), np.asarray(weight_scale, np.float32)),
    ]
    masks = {
        "1d": np.array([total - 1, total][:batch], np.int32),
        "2b": np.array([total - 1, total, 1, 0][: 2 * batch], np.int32),
        "2d": (rng.random((batch, total)) > 0.3).astype(np.int32),
        "3d": (rng.random((batch, sq, total)) > 0.3).astype(np.int32),
    }
    mask = case.get("mask")
    inputs.append(None if mask is None else ("mask", I32, masks[mask].shape, masks[mask]))
    if case.get("zero_points", True):
        weight_zero = _table(rng, (width,) if per_column == "zero" else (), weight)
        inputs += [("x_zero", U8, (), np.array(131, np.uint8)), ("w_zero", weight, weight_zero.shape, weight_zero)]
    else:
        inputs += [None, None]
    if past:
        state = (rng.standard_normal((2, batch, heads, past, head)) * 0.5).astype(np.float32)
        inputs.append(("past", F, state.shape, state))
    outputs = [("y", F)] + ([("present", F)] if past else [])
    model = _model("QAttention", inputs, outputs, num_heads=heads, **case.get("attrs", {}))
    return model, _feeds(inputs)


@pytest.mark.parametrize("case", sorted(QATTENTION_CASES))
def test_qattention_matches_onnxruntime(backend_name: str, case: str) -> None:
    options = QATTENTION_CASES[case]
    model, feeds = _qattention(options)
    plan = _check(backend_name, model, feeds, on_device=not options.get("cpu"))
    if options.get("cpu"):
        assert "per-column" in plan.steps[0].reason, plan.steps[0].reason


def test_qattention_float16_runs_on_the_cpu_as_float32_does(backend_name: str) -> None:
    """float16 scales, bias and output (the schema allows them; onnxruntime's CPU kernel has none): the node runs
    the reference on the CPU, within float16's precision of the float32 node's onnxruntime result."""
    model32, feeds = _qattention({"mask": "1d"})
    proto = onnx.load_from_string(model32)
    for value in list(proto.graph.input) + list(proto.graph.output):
        if value.type.tensor_type.elem_type == F:
            value.type.tensor_type.elem_type = H16
    feeds16 = {name: value.astype(np.float16) if value.dtype == np.float32 else value for name, value in feeds.items()}
    got, plan = run_model(proto.SerializeToString(), feeds16, _device(backend_name))
    assert [step.placement for step in plan.steps] == ["cpu"] and "float16" in plan.steps[0].reason
    [want] = _onnxruntime(
        model32, {n: v.astype(np.float32) if v.dtype == np.float16 else v for n, v in feeds16.items()}
    )
    assert got[0].dtype == np.float16
    np.testing.assert_allclose(got[0].astype(np.float32), want, rtol=0, atol=4e-3 * float(np.abs(want).max()))


def _qattention_with(change: str) -> tuple[bytes, dict[str, np.ndarray]]:
    model, feeds = _qattention({"mask": "1d"})
    proto = onnx.load_from_string(model)
    node, inputs = proto.graph.node[0], {value.name: value for value in proto.graph.input}
    if change == "bias_shape":
        inputs["bias"].type.tensor_type.shape.dim[0].dim_value = 5
        feeds["bias"] = feeds["bias"][:5]
    elif change == "input_scale_vector":
        inputs["x_scale"].type.tensor_type.shape.dim.add().dim_value = 3
        feeds["x_scale"] = np.repeat(feeds["x_scale"], 3)
    elif change == "float_weights":
        inputs["w"].type.tensor_type.elem_type = F
        feeds["w"] = feeds["w"].astype(np.float32)
    elif change == "heads":
        node.attribute[0].i = 3
    elif change == "do_rotary":
        node.attribute.append(helper.make_attribute("do_rotary", 1))
    return proto.SerializeToString(), feeds


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ("bias_shape", SHAPE_ERRORS, "QAttention.*bias has shape"),
        ("input_scale_vector", SHAPE_ERRORS, "QAttention.*input_scale"),
        ("float_weights", (UnsupportedOpError, ModelError), "QAttention.*weight of dtype float32"),
        ("heads", SHAPE_ERRORS, "QAttention.*num_heads 3 must divide"),
        ("do_rotary", (UnsupportedOpError, ModelError), "QAttention.*do_rotary=1 is not supported"),
    ],
)
def test_qattention_refuses_bad_inputs(backend_name: str, change: str, error: Any, message: str) -> None:
    model, feeds = _qattention_with(change)
    with pytest.raises(error, match=message):
        run_model(model, feeds, _device(backend_name))


# -- QEmbedLayerNormalization ----------------------------------------------------------------------------------------

QEMBED_CASES: dict[str, dict[str, Any]] = {
    "uint8_segments_mask": {},
    "int8_tables": {"kind": I8},
    "no_segments": {"segments": False},
    "no_mask": {"mask": False, "epsilon": 1e-5},
    "odd_hidden": {"hidden": 7, "batch": 3, "sequence": 5},
}


def _qembed(case: dict[str, Any], seed: int = 1) -> tuple[list[Spec], dict[str, Any]]:
    rng = np.random.default_rng(seed)
    batch, sq, hidden, kind = case.get("batch", 2), case.get("sequence", 4), case.get("hidden", 8), case.get("kind", U8)
    vocabulary, positions, segment_rows = 11, 6, 2
    segments, segment_ids = case.get("segments", True), case.get("segment_ids", case.get("segments", True))
    tables = {
        "word": (vocabulary, hidden),
        "position": (positions, hidden),
        "segment": (segment_rows, hidden),
        "gamma": (hidden,),
        "beta": (hidden,),
    }
    quantized = {name: _table(rng, shape, kind) for name, shape in tables.items()}
    scales = {name: np.array(rng.random() * 0.05 + 0.01, np.float32) for name in tables}
    zeros = {name: _table(rng, (), kind) for name in tables}

    def table(name: str) -> Spec:
        if name == "segment" and not segments:
            return None
        return (f"{name}_q", kind, tables[name], quantized[name])

    def parameter(name: str, what: str) -> Spec:
        if name == "segment" and not segments:
            return None
        value = scales[name] if what == "scale" else zeros[name]
        return (f"{name}_{what}", F if what == "scale" else kind, (), value)

    ids = rng.integers(0, vocabulary, (batch, sq)).astype(np.int32)
    mask = (np.arange(sq)[None, :] < np.array([sq, sq - 1, 2][:batch])[:, None]).astype(np.int32)
    inputs: list[Spec] = [
        ("input_ids", I32, (batch, sq), ids),
        ("segment_ids", I32, (batch, sq), (rng.random((batch, sq)) > 0.5).astype(np.int32)) if segment_ids else None,
        table("word"),
        table("position"),
        table("segment"),
        table("gamma"),
        table("beta"),
        ("mask", I32, (batch, sq), mask) if case.get("mask", True) else None,
    ]
    names = ["word", "position", "segment", "gamma", "beta"]
    inputs += [parameter(name, "scale") for name in names] + [parameter(name, "zero") for name in names]
    attrs = {"epsilon": case["epsilon"]} if "epsilon" in case else {}
    return inputs, attrs


@pytest.mark.parametrize("case", sorted(QEMBED_CASES))
def test_qembed_layer_norm_matches_onnxruntime(backend_name: str, case: str) -> None:
    inputs, attrs = _qembed(QEMBED_CASES[case])
    model = _model("QEmbedLayerNormalization", inputs, [("output", F), ("mask_index", I32)], **attrs)
    _check(backend_name, model, _feeds(inputs))


def test_qembed_layer_norm_id_outside_the_table_fails_the_run(backend_name: str) -> None:
    """onnxruntime fails the run; on ortgpu the device kernel flags it and the run raises InvalidArgumentError."""
    inputs, attrs = _qembed({})
    model = _model("QEmbedLayerNormalization", inputs, [("output", F), ("mask_index", I32)], **attrs)
    feeds = _feeds(inputs)
    feeds["input_ids"] = feeds["input_ids"].copy()
    feeds["input_ids"][1, 2] = 11
    with pytest.raises(Exception, match="out of range"):
        _onnxruntime(model, feeds)
    with ortgpu.InferenceSession(model, env=shared_env(backend_name)) as session:
        placements = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        assert [row.placement for row in placements] == ["webgpu"], placements
        with pytest.raises(InvalidArgumentError):
            session.run(None, feeds)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ("gamma_int8", (UnsupportedOpError, ModelError), "QEmbedLayerNormalization: gamma of dtype int8 differs"),
        ("scale_vector", SHAPE_ERRORS, "QEmbedLayerNormalization: the scale of beta has shape"),
        ("float_words", (UnsupportedOpError, ModelError), "QEmbedLayerNormalization: word_embedding of dtype float32"),
        ("segment_table_without_ids", ModelError, "QEmbedLayerNormalization: segment_ids, segment_embedding.*together"),
    ],
)
def test_qembed_layer_norm_refuses_bad_inputs(backend_name: str, change: str, error: Any, message: str) -> None:
    inputs, _ = _qembed({"segment_ids": False} if change == "segment_table_without_ids" else {})
    specs = {spec[0]: index for index, spec in enumerate(inputs) if spec is not None}
    name, kind, shape, value = inputs[
        specs[{"gamma_int8": "gamma_q", "scale_vector": "beta_scale"}.get(change, "word_q")]
    ]
    if change == "segment_table_without_ids":
        pass
    elif change == "gamma_int8":
        inputs[specs[name]] = (name, I8, shape, value.astype(np.int8))
    elif change == "scale_vector":
        inputs[specs[name]] = (name, kind, (2,), np.repeat(value, 2))
    else:
        inputs[specs[name]] = (name, F, shape, value.astype(np.float32))
    model = _model("QEmbedLayerNormalization", inputs, [("output", F), ("mask_index", I32)])
    with pytest.raises(error, match=message):
        run_model(model, _feeds(inputs), _device(backend_name))
