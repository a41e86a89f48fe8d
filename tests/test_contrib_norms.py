"""onnxruntime's contributed normalisations (``ortgpu/ops/com_microsoft/layer_norms.py``, ``embed_layer_norm.py`` and
``ortgpu/ops/ai_onnx/contrib_normalizations.py``): single-node models as onnxruntime's transformer optimizer writes
them, run on both backends with every node on the device, compared with onnxruntime's CPU provider.

Float32 results agree within 1e-4 of the largest magnitude; float16 ones within 2e-3 (a float16 ulp is 1e-3 of the
value: the kernels and onnxruntime both compute in float32 and round once, but their sums run in different orders,
so a value may land one ulp apart).  Integers (EmbedLayerNormalization's mask_index) agree exactly.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any, Iterator, Sequence

import numpy as np
import onnx
import onnxruntime
import pytest
from conftest import shared_env
from helpers import run_model
from onnx import TensorProto, helper
from test_ops_elementwise import caps_of, open_device

import ortgpu
from ortgpu.ops import DeviceCaps, TensorInfo, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu_core._errors import InvalidArgumentError, InvalidModelError, ModelError, ShapeError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

F32, F16, I32 = np.float32, np.float16, np.int32
MS = "com.microsoft"
#: ONNX element types of the outputs' numpy types
_ELEMENT = {np.dtype(F32): TensorProto.FLOAT, np.dtype(F16): TensorProto.FLOAT16, np.dtype(I32): TensorProto.INT32}


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def op_device(backend_name: str) -> Iterator[BackendDevice]:
    device = open_device(backend_name)
    try:
        yield device
        gc.collect()
        assert device.live_handles() == 0, "the contributed-normalisation tests leaked device objects"
    finally:
        device.destroy()


def _model(
    op_type: str,
    inputs: Sequence[tuple[str, np.ndarray | None]],
    outputs: Sequence[tuple[str, Any]],
    domain: str = MS,
    opset: int = 17,
    **attrs: Any,
) -> onnx.ModelProto:
    """One node; ``inputs`` (name, value) with None for an absent optional one, ``outputs`` (name or "", dtype)."""
    node = helper.make_node(op_type, [n for n, _ in inputs], [n for n, _ in outputs], domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        "contrib_norm",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for n, v in inputs
            if n and v is not None
        ],
        [helper.make_tensor_value_info(n, _ELEMENT[np.dtype(t)], None) for n, t in outputs if n],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])


def _feeds(inputs: Sequence[tuple[str, np.ndarray | None]]) -> dict[str, np.ndarray]:
    return {n: v for n, v in inputs if n and v is not None}


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _assert_agree(got: Sequence[np.ndarray], want: Sequence[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for index, (ours, theirs) in enumerate(zip(got, want)):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, index, ours.shape, theirs.shape)
        if not np.issubdtype(theirs.dtype, np.floating):
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{what} output {index}")
            continue
        tolerance = 2e-3 if theirs.dtype == np.float16 else 1e-4
        scale = max(float(np.abs(theirs.astype(np.float64)).max(initial=0.0)), 1e-30)
        error = float(np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max(initial=0.0)) / scale
        assert error < tolerance, f"{what} output {index}: relative error {error:.3g}"


def _check_on_device(model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: BackendDevice) -> None:
    """Every node on the device (``allow_cpu=False``), outputs as onnxruntime's CPU provider gives them."""
    want = _onnxruntime(model, feeds)
    got, plan = run_model(model.SerializeToString(), feeds, device, allow_cpu=False)
    assert [step.placement for step in plan.steps] == ["webgpu"]
    _assert_agree(got, want, model.graph.node[0].op_type)


def _normal(rng: np.random.Generator, *shape: int, dtype: Any = F32, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


# -- SkipLayerNormalization, SkipSimplifiedLayerNormalization ----------------------------------------------------------

#: (label, op, input shape, skip shape, which of beta/bias are given, which outputs, dtype, attributes)
SKIP_CASES = [
    ("all", "SkipLayerNormalization", (2, 3, 16), (2, 3, 16), "beta bias", (0, 1, 2, 3), F32, {}),
    ("sum-only", "SkipLayerNormalization", (2, 3, 16), (2, 3, 16), "bias", (0, 3), F32, {}),
    ("plain-2d-odd", "SkipLayerNormalization", (5, 37), (5, 37), "", (0,), F32, {}),
    ("skip-batch1", "SkipLayerNormalization", (3, 4, 12), (1, 4, 12), "beta", (0, 2), F32, {}),
    ("skip-2d", "SkipLayerNormalization", (3, 4, 12), (4, 12), "beta bias", (0, 1), F32, {"epsilon": 1e-3}),
    ("long-rows", "SkipLayerNormalization", (1, 3, 1000), (1, 3, 1000), "beta", (0, 3), F32, {}),
    ("fp16", "SkipLayerNormalization", (2, 3, 24), (2, 3, 24), "beta bias", (0, 1, 2, 3), F16, {}),
    ("all", "SkipSimplifiedLayerNormalization", (2, 3, 16), (2, 3, 16), "bias", (0, 1, 2, 3), F32, {}),
    ("plain-2d-odd", "SkipSimplifiedLayerNormalization", (7, 19), (7, 19), "", (0,), F32, {"epsilon": 1e-5}),
    ("skip-2d", "SkipSimplifiedLayerNormalization", (2, 5, 8), (5, 8), "", (0, 2, 3), F32, {}),
    ("fp16", "SkipSimplifiedLayerNormalization", (2, 3, 24), (2, 3, 24), "bias", (0, 2, 3), F16, {}),
]


def _skip_inputs(
    op_type: str, x: tuple[int, ...], skip: tuple[int, ...], given: str, dtype: Any, seed: int = 0
) -> list[tuple[str, np.ndarray | None]]:
    rng = np.random.default_rng(seed)
    hidden = x[-1]
    inputs: list[tuple[str, np.ndarray | None]] = [
        ("input", _normal(rng, *x, dtype=dtype, scale=2.0)),
        ("skip", _normal(rng, *skip, dtype=dtype)),
        ("gamma", _normal(rng, hidden, dtype=dtype)),
    ]
    if op_type == "SkipLayerNormalization":
        inputs.append(("beta", _normal(rng, hidden, dtype=dtype)) if "beta" in given else ("", None))
    if "bias" in given:
        inputs.append(("bias", _normal(rng, hidden, dtype=dtype)))
    while inputs[-1][1] is None:  # trailing absent inputs are left out, as exporters write them
        inputs.pop()
    return inputs


def _skip_outputs(wanted: Sequence[int], dtype: Any) -> list[tuple[str, Any]]:
    types = [dtype, F32, F32, dtype]
    return [(f"out{i}" if i in wanted else "", types[i]) for i in range(max(wanted) + 1)]


@pytest.mark.parametrize(
    ("op_type", "x", "skip", "given", "wanted", "dtype", "attrs"),
    [case[1:] for case in SKIP_CASES],
    ids=[f"{case[1]}-{case[0]}" for case in SKIP_CASES],
)
def test_skip_norms_match_onnxruntime(
    op_device: BackendDevice,
    op_type: str,
    x: tuple[int, ...],
    skip: tuple[int, ...],
    given: str,
    wanted: tuple[int, ...],
    dtype: Any,
    attrs: dict[str, Any],
) -> None:
    inputs = _skip_inputs(op_type, x, skip, given, dtype)
    model = _model(op_type, inputs, _skip_outputs(wanted, dtype), **attrs)
    _check_on_device(model, _feeds(inputs), op_device)


def test_all_skip_outputs_split_over_two_kernels(op_device: BackendDevice) -> None:
    """Five inputs and four outputs need nine storage bindings, one more than WebGPU's default limit (lavapipe
    allows more): on a device of 8 the statistics take a kernel of their own, with onnxruntime's values still."""
    inputs = _skip_inputs("SkipLayerNormalization", (2, 3, 16), (2, 3, 16), "beta bias", F32)
    model = _model("SkipLayerNormalization", inputs, _skip_outputs((0, 1, 2, 3), F32))
    want = _onnxruntime(model, _feeds(inputs))
    caps = caps_of(op_device)
    eight = replace_limit(caps, 8)
    operator = get_operator("SkipLayerNormalization", 1, MS)
    arrays = [value for _, value in inputs]
    infos = [TensorInfo(w.shape, w.dtype) for w in want]
    ways = [(eight, 2)] + ([(caps, 1)] if caps.limits.max_storage_buffers_per_shader_stage >= 9 else [])
    for device_caps, kernels in ways:
        plan = operator.plan([TensorInfo(a.shape, a.dtype) for a in arrays], infos, {}, device_caps, {})
        assert len(plan.kernels) == kernels
        _assert_agree(run_plan(op_device, plan, arrays, infos), want, f"SkipLayerNormalization in {kernels} kernels")


def replace_limit(caps: DeviceCaps, bindings: int) -> DeviceCaps:
    return DeviceCaps(caps.features, dataclasses.replace(caps.limits, max_storage_buffers_per_shader_stage=bindings))


@pytest.mark.parametrize(
    ("x", "skip", "gamma", "message"),
    [
        ((1, 2, 3, 8), (1, 2, 3, 8), (8,), "3-D"),
        ((2, 3, 8), (2, 1, 8), (8,), "skip has shape"),
        ((3, 8), (1, 8), (8,), "skip has shape"),
        ((2, 3, 8), (2, 3, 8), (7,), "gamma"),
    ],
)
def test_skip_norm_bad_shapes_are_refused(
    x: tuple[int, ...], skip: tuple[int, ...], gamma: tuple[int, ...], message: str
) -> None:
    rng = np.random.default_rng(1)
    arrays = [_normal(rng, *x), _normal(rng, *skip), _normal(rng, *gamma)]
    for op_type in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        with pytest.raises(ShapeError, match=f"{op_type}: .*{message}"):
            get_operator(op_type, 1, MS).reference(arrays, {}, [])


def test_skip_norm_bad_bias_is_refused_when_planned(op_device: BackendDevice) -> None:
    inputs = _skip_inputs("SkipSimplifiedLayerNormalization", (2, 3, 8), (2, 3, 8), "bias", F32)
    inputs[3] = ("bias", np.zeros(5, F32))
    model = _model("SkipSimplifiedLayerNormalization", inputs, _skip_outputs((0,), F32))
    # the loader learns the node's output shapes by running its reference, and reports the ShapeError as a ModelError
    with pytest.raises((ShapeError, ModelError), match="bias has shape \\(5,\\); it must be 1-D of the hidden size 8"):
        run_model(model.SerializeToString(), _feeds(inputs), op_device)


# -- SimplifiedLayerNormalization and LayerNormalization-1 (onnxruntime's, in the default domain) ----------------------


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize(
    ("x", "scale", "x_type", "scale_type", "inv_std", "attrs"),
    [
        ((2, 3, 16), (16,), F32, F32, True, {}),
        ((4, 33), (33,), F32, F32, False, {"epsilon": 1e-3}),
        ((2, 3, 8), (3, 8), F32, F32, True, {"axis": -2}),
        ((2, 3, 24), (24,), F16, F16, True, {}),
        ((2, 3, 24), (24,), F32, F16, True, {}),
    ],
    ids=["last", "2d-odd", "axis-2", "fp16", "f32-x-f16-scale"],
)
def test_simplified_layer_norm_matches_onnxruntime(
    op_device: BackendDevice,
    opset: int,
    x: tuple[int, ...],
    scale: tuple[int, ...],
    x_type: Any,
    scale_type: Any,
    inv_std: bool,
    attrs: dict[str, Any],
) -> None:
    rng = np.random.default_rng(2)
    inputs: list[tuple[str, np.ndarray | None]] = [
        ("X", _normal(rng, *x, dtype=x_type, scale=3.0)),
        ("scale", _normal(rng, *scale, dtype=scale_type)),
    ]
    outputs = [("Y", scale_type)] + ([("inv_std_var", F32)] if inv_std else [])
    model = _model("SimplifiedLayerNormalization", inputs, outputs, domain="", opset=opset, **attrs)
    _check_on_device(model, _feeds(inputs), op_device)


@pytest.mark.parametrize(
    ("x", "bias", "outputs", "attrs"),
    [((2, 3, 16), True, 3, {}), ((2, 5, 6), False, 2, {"axis": 1, "epsilon": 1e-3}), ((3, 40), True, 1, {})],
    ids=["stats", "axis1", "2d"],
)
def test_layer_norm_before_opset_17_matches_onnxruntime(
    op_device: BackendDevice, x: tuple[int, ...], bias: bool, outputs: int, attrs: dict[str, Any]
) -> None:
    """A default-domain LayerNormalization in an opset-13 model (the optimizer's output for BERT exported at
    opset 13) is onnxruntime's contributed one: ortgpu runs it, on the device."""
    rng = np.random.default_rng(3)
    normalized = x[attrs.get("axis", -1) % len(x) :]
    inputs: list[tuple[str, np.ndarray | None]] = [
        ("X", _normal(rng, *x, scale=2.0)),
        ("Scale", _normal(rng, *normalized)),
    ] + ([("B", _normal(rng, *normalized))] if bias else [])
    names = [("Y", F32), ("Mean", F32), ("InvStdDev", F32)][:outputs]
    model = _model("LayerNormalization", inputs, names, domain="", opset=13, **attrs)
    _check_on_device(model, _feeds(inputs), op_device)


def test_layer_norm_versions_are_chosen_by_opset() -> None:
    assert type(get_operator("LayerNormalization", 13)).__qualname__ == "LayerNormalization_1"
    assert type(get_operator("LayerNormalization", 17)).__qualname__ == "LayerNormalization"
    assert type(get_operator("SimplifiedLayerNormalization", 21)).__qualname__ == "SimplifiedLayerNormalization"


def test_layer_norm_1_of_mixed_types_runs_on_the_cpu(op_device: BackendDevice) -> None:
    """float16 X with a float32 scale gives float32 Y (onnxruntime's types); the device kernel of LayerNormalization
    takes one type, so this variant runs on the CPU, and says so."""
    rng = np.random.default_rng(4)
    inputs: list[tuple[str, np.ndarray | None]] = [("X", _normal(rng, 2, 3, 8, dtype=F16)), ("Scale", _normal(rng, 8))]
    model = _model("LayerNormalization", inputs, [("Y", F32), ("Mean", F32)], domain="", opset=13)
    want = _onnxruntime(model, _feeds(inputs))
    got, plan = run_model(model.SerializeToString(), _feeds(inputs), op_device)
    assert [step.placement for step in plan.steps] == ["cpu"] and "float" in plan.steps[0].reason
    _assert_agree(got, want, "LayerNormalization-1 mixed")


def test_unknown_default_domain_operators_are_still_refused() -> None:
    """The loader lets onnx's checker pass over onnxruntime's default-domain operators that ortgpu implements, and
    only those: an operator nobody implements is still refused, by name."""
    from ortgpu.loader._model import load_model

    x = np.zeros((2, 3), F32)
    model = _model("NoSuchNormalization", [("X", x)], [("Y", F32)], domain="", opset=13)
    with pytest.raises((InvalidModelError, UnsupportedOpError), match="NoSuchNormalization"):
        load_model(model.SerializeToString())


def test_simplified_layer_norm_bad_scale_is_refused() -> None:
    with pytest.raises(ShapeError, match="SimplifiedLayerNormalization: scale of shape \\(5,\\)"):
        get_operator("SimplifiedLayerNormalization", 13).reference([np.ones((2, 8), F32), np.ones(5, F32)], {}, [])


# -- EmbedLayerNormalization ------------------------------------------------------------------------------------------


def _embed_inputs(
    batch: int = 2,
    sequence: int = 5,
    hidden: int = 12,
    *,
    segments: bool = True,
    segment_ids: bool = True,
    mask: bool = True,
    position_ids: tuple[int, int] | None = None,
    dtype: Any = F32,
    seed: int = 5,
) -> list[tuple[str, np.ndarray | None]]:
    rng = np.random.default_rng(seed)
    vocabulary, positions = 11, sequence + 3
    values: list[tuple[str, np.ndarray | None]] = [
        ("input_ids", rng.integers(0, vocabulary, (batch, sequence)).astype(I32)),
        ("segment_ids", rng.integers(0, 2, (batch, sequence)).astype(I32) if segment_ids else None),
        ("word_embedding", _normal(rng, vocabulary, hidden, dtype=dtype)),
        ("position_embedding", _normal(rng, positions, hidden, dtype=dtype)),
        ("segment_embedding", _normal(rng, 2, hidden, dtype=dtype) if segments else None),
        ("gamma", _normal(rng, hidden, dtype=dtype)),
        ("beta", _normal(rng, hidden, dtype=dtype)),
        # mask values other than 0 and 1 count as neither (onnxruntime counts the ones)
        ("mask", rng.choice(np.array([0, 1, 1, 1, 2], I32), (batch, sequence)) if mask else None),
        ("position_ids", rng.integers(0, positions, position_ids).astype(I32) if position_ids else None),
    ]
    named = [(name if value is not None else "", value) for name, value in values]
    while named[-1][1] is None:
        named.pop()
    return named


EMBED_CASES = {
    "bert": {},
    "distilbert": {"segments": False, "segment_ids": False},
    "no-mask": {"mask": False},
    "segment-row-0": {"segment_ids": False},
    "position-ids-shared": {"position_ids": (1, 5)},
    "position-ids-per-batch": {"position_ids": (2, 5), "mask": False},
    "odd-hidden": {"hidden": 37, "batch": 3, "sequence": 3},
    "fp16": {"dtype": F16, "hidden": 24},
}


@pytest.mark.parametrize("with_sum", [False, True], ids=["", "sum"])
@pytest.mark.parametrize("case", sorted(EMBED_CASES))
def test_embed_layer_norm_matches_onnxruntime(op_device: BackendDevice, case: str, with_sum: bool) -> None:
    options = EMBED_CASES[case]
    inputs = _embed_inputs(**options)
    dtype = options.get("dtype", F32)
    outputs = [("output", dtype), ("mask_index", I32)] + ([("embedding_sum", dtype)] if with_sum else [])
    model = _model("EmbedLayerNormalization", inputs, outputs, epsilon=1e-5 if case == "odd-hidden" else 1e-12)
    _check_on_device(model, _feeds(inputs), op_device)


def _run_in_session_raises(model: onnx.ModelProto, feeds: dict[str, np.ndarray], backend_name: str) -> None:
    """A session runs the node on the device (capturable: no CPU step) and raises InvalidArgumentError from the
    status words its kernel set; the same session then runs valid ids."""
    session = ortgpu.InferenceSession(model.SerializeToString(), env=shared_env(backend_name))
    try:
        with pytest.raises(InvalidArgumentError, match="index out of range"):
            session.run(None, feeds)
        valid = {name: np.zeros_like(value) if value.dtype == I32 else value for name, value in feeds.items()}
        _assert_agree(session.run(None, valid), _onnxruntime(model, valid), "EmbedLayerNormalization after an error")
        placements = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        assert [row.placement for row in placements] == ["webgpu"], placements
    finally:
        session.close()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [("input_ids", 11, "input_ids holds 11"), ("input_ids", -1, "input_ids holds -1"), ("segment_ids", 2, "segment")],
)
def test_embed_layer_norm_ids_outside_their_table_fail_the_run(
    backend_name: str, name: str, value: int, message: str
) -> None:
    """onnxruntime fails the run (INVALID_ARGUMENT); the device kernel flags it in the status words, and the run
    raises InvalidArgumentError (the fake backend's twin raises the reference's message)."""
    inputs = _embed_inputs()
    feeds = _feeds(inputs)
    feeds[name] = feeds[name].copy()
    feeds[name][1, 2] = value
    model = _model("EmbedLayerNormalization", inputs, [("output", F32), ("mask_index", I32)])
    with pytest.raises(Exception, match="out of range"):
        _onnxruntime(model, feeds)
    _run_in_session_raises(model, feeds, backend_name)
    with pytest.raises(InvalidArgumentError, match=message):
        get_operator("EmbedLayerNormalization", 1, MS).reference([feeds.get(n) for n, _ in inputs], {}, [])


def test_embed_layer_norm_position_id_outside_the_table_fails_the_run(backend_name: str) -> None:
    inputs = _embed_inputs(position_ids=(1, 5))
    feeds = _feeds(inputs)
    feeds["position_ids"] = np.full((1, 5), 8, I32)  # the table has 5 + 3 rows
    model = _model("EmbedLayerNormalization", inputs, [("output", F32), ("mask_index", I32)])
    _run_in_session_raises(model, feeds, backend_name)


def test_embed_layer_norm_bad_inputs_are_refused() -> None:
    operator = get_operator("EmbedLayerNormalization", 1, MS)
    arrays = [value for _, value in _embed_inputs()]
    short = list(arrays)
    short[3] = np.zeros((4, 12), F32)  # 4 positions for a sequence of 5, and no position_ids
    with pytest.raises(ShapeError, match="the sequence has 5 tokens, and position_embedding only 4 rows"):
        operator.reference(short, {}, [])
    no_table = list(arrays)
    no_table[4] = None
    with pytest.raises(InvalidModelError, match="segment_ids are given without a segment_embedding"):
        operator.reference(no_table, {}, [])
    bad_beta = list(arrays)
    bad_beta[6] = np.zeros(5, F32)
    with pytest.raises(ShapeError, match="beta has shape \\(5,\\)"):
        operator.reference(bad_beta, {}, [])
    bad_mask = list(arrays)
    bad_mask[7] = np.ones((2, 4), I32)
    with pytest.raises(ShapeError, match="mask has shape \\(2, 4\\); it must be input_ids'"):
        operator.reference(bad_mask, {}, [])
    flat = list(arrays)
    flat[0] = np.zeros(10, I32)
    with pytest.raises(ShapeError, match="input_ids has shape \\(10,\\); it must be 2-D"):
        operator.reference(flat, {}, [])
