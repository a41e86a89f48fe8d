"""float16 attention on the device: f16 Q/K/V/mask/output, the scores, the online softmax and the sums in f32.

The exporters' attention patterns (torch's ``scaled_dot_product_attention``, HF eager attention with the Casts to
float32 and back around its Softmax, grouped K/V heads as a broadcast axis) written in float16 fuse into one step as
their float32 versions do, and run on both flash kernels (the workgroup-tiled one for short queries and odd heads,
the row-per-invocation one with its Q row in registers or in a tile and every key split); the unfused nodes
compute the same; the ONNX ``Attention`` operator runs every kernel of its plan in float16 (the flash kernel, the
per-element kernel of caches, sequence lengths, windows and soft caps, the present copies, the score outputs), and
``LinearAttention`` its recurrence.  Every case is compared with onnxruntime CPU running the same float16 model, on
both backends (on the fake backend the kernels' numpy twins run, so the WGSL itself is checked on wgpu).  A device
without ``shader-f16`` runs them on the CPU and says why.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps, _flash_rows
from ortgpu.ops._fused_attention import FUSE_MAX_SCORES, FusedAttention
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS, FakeBackend, FakeDeviceSpec

F16, F32, BOOL, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
CAPS = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)
NUMPY = {F16: np.float16, F32: np.float32, BOOL: np.bool_, I64: np.int64}


def _model(
    nodes: list[onnx.NodeProto],
    inputs: Mapping[str, tuple[tuple[int, ...], int]],
    outputs: Mapping[str, int],
    inits: tuple[onnx.TensorProto, ...] = (),
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "half_attention",
        [helper.make_tensor_value_info(name, elem, shape) for name, (shape, elem) in inputs.items()],
        [helper.make_tensor_value_info(name, elem, None) for name, elem in outputs.items()],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    for index, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{index}"
    return model


def _const(name: str, value: Any, elem: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=NUMPY[elem]), name)


# -- the exporters' patterns ------------------------------------------------------------------------------------------


def sdpa(b: int, h: int, sq: int, sk: int, d: int, mask: str, elem: int = F16) -> onnx.ModelProto:
    """torch's export of F.scaled_dot_product_attention: Q and K^T each scaled by sqrt(scale); ``mask``: "none",
    "additive" (an input [B, 1, Sq, Sk]) or "causal" (a constant of 0 and -inf)."""
    nodes = [
        helper.make_node("Mul", ["q", "root"], ["qs"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["kt", "root"], ["kts"]),
        helper.make_node("MatMul", ["qs", "kts"], ["s0"]),
    ]
    inputs = {"q": ((b, h, sq, d), elem), "k": ((b, h, sk, d), elem), "v": ((b, h, sk, d), elem)}
    inits = [_const("root", np.sqrt(1.0 / np.sqrt(d)), elem)]
    last = "s0"
    if mask == "additive":
        inputs["mask"] = ((b, 1, sq, sk), elem)
    elif mask == "causal":
        inits.append(_const("mask", np.triu(np.full((sq, sk), -np.inf), k=1 + sk - sq), elem))
    if mask != "none":
        nodes.append(helper.make_node("Add", ["s0", "mask"], ["s1"]))
        last = "s1"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    return _model(nodes, inputs, {"y": elem}, tuple(inits))


def hf_eager(
    b: int, h: int, sq: int, sk: int, d: int, dv: int, mask: tuple[int, ...], elem: int = F16
) -> onnx.ModelProto:
    """HF eager attention: matmul(q, k^T) * scale + mask, softmax(..., dtype=torch.float32).to(query.dtype) (a Cast
    to float32 before the Softmax and one back after it; in float32 only the one after), matmul(., v)."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Add", ["s1", "mask"], ["s2"]),
        helper.make_node("Cast", ["s2"], ["s32"], to=F32),
        helper.make_node("Softmax", ["s32"], ["p32"], axis=-1),
        helper.make_node("Cast", ["p32"], ["p"], to=elem),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = {"q": ((b, h, sq, d), elem), "k": ((b, h, sk, d), elem), "v": ((b, h, sk, dv), elem), "mask": (mask, elem)}
    return _model(nodes, inputs, {"y": elem}, (_const("scale", 1.0 / np.sqrt(d), elem),))


def grouped(b: int, hkv: int, rep: int, s: int, d: int, elem: int = F16) -> onnx.ModelProto:
    """Grouped K/V heads as a broadcast axis: Q [B, Hkv, rep, S, D] against K/V [B, Hkv, 1, S, D], the scores
    divided by sqrt(D), an additive [B, 1, 1, 1, S] mask."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 2, 4, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Div", ["s0", "root_d"], ["s1"]),
        helper.make_node("Add", ["s1", "mask"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = {
        "q": ((b, hkv, rep, s, d), elem),
        "k": ((b, hkv, 1, s, d), elem),
        "v": ((b, hkv, 1, s, d), elem),
        "mask": ((b, 1, 1, 1, s), elem),
    }
    return _model(nodes, inputs, {"y": elem}, (_const("root_d", np.sqrt(d), elem),))


# -- running and comparing --------------------------------------------------------------------------------------------


def _feeds(model: onnx.ModelProto, seed: int, **given: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = tuple(dim.dim_value for dim in value.type.tensor_type.shape.dim)
        elem = value.type.tensor_type.elem_type
        if value.name in given:
            feeds[value.name] = given[value.name]
        elif elem == BOOL:
            feeds[value.name] = rng.random(shape) < 0.7
        elif value.name == "mask":
            feeds[value.name] = (rng.standard_normal(shape) * 2).astype(NUMPY[elem])
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(NUMPY[elem])
    return feeds


def _attention_steps(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], caps: DeviceCaps = CAPS) -> list[Any]:
    plan = plan_model(
        load_model(model),
        {n: v.shape for n, v in feeds.items()},
        caps,
        input_dtypes={n: v.dtype for n, v in feeds.items()},
    )
    return [step for step in plan.steps if isinstance(step.operator, FusedAttention)]


def _kernels(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> str:
    """The WGSL of every kernel the plan runs."""
    plan = plan_model(
        load_model(model),
        {n: v.shape for n, v in feeds.items()},
        CAPS,
        input_dtypes={n: v.dtype for n, v in feeds.items()},
    )
    return "".join(k.wgsl for step in plan.steps if step.op_plan is not None for k in step.op_plan.kernels)


def _wgsl(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> str:
    """The fused step's one kernel (float16 storage, checked here)."""
    (step,) = _attention_steps(model, feeds)
    (kernel,) = step.op_plan.kernels
    assert kernel.wgsl.startswith("enable f16;\n") and "array<f16>" in kernel.wgsl
    return str(kernel.wgsl)


def _check(
    env: ortgpu.Env,
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    fused: bool | None = True,
    tolerance: float = 2e-3,
    fuse: bool = True,
    elsewhere: tuple[str, ...] = (),
) -> None:
    """The session's outputs match onnxruntime CPU's within ``tolerance`` of each output's largest magnitude (NaN
    where it has NaN); every node runs on the device (but the op types in ``elsewhere``, other operators' kernels);
    the attention ran fused when ``fused`` (unfused when False; None: an operator, not a pattern)."""
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, dict(feeds)
    )
    with ortgpu.InferenceSession(model.SerializeToString(), env=env, fuse=fuse) as session:
        placement = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        got = session.run(None, dict(feeds))
    if fused is not None:
        assert any("fused attention" in p.reason for p in placement) == fused
    assert all(p.placement == "webgpu" for p in placement if p.op_type not in elsewhere), [
        (p.op_type, p.reason) for p in placement
    ]
    for actual, want in zip(got, expected):
        assert actual.shape == want.shape and actual.dtype == want.dtype
        assert np.array_equal(np.isnan(actual), np.isnan(want))
        finite = ~np.isnan(want)
        scale = max(float(np.abs(want[finite].astype(np.float64)).max(initial=0.0)), 1e-30)
        error = float(np.abs(actual[finite].astype(np.float64) - want[finite]).max(initial=0.0))
        assert error <= tolerance * scale, (error, scale)


@pytest.fixture(params=[1, 2, 8], ids=lambda s: f"splits{s}")
def splits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Plan every problem of the row kernel with this many key splits, whatever its size."""
    count = int(request.param)
    monkeypatch.setattr(_flash_rows, "key_splits", lambda rows_total: count)
    return count


# -- the plan ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda elem: sdpa(1, 2, 4, 6, 8, "additive", elem),
        lambda elem: sdpa(1, 2, 20, 20, 8, "causal", elem),
        lambda elem: hf_eager(1, 2, 5, 5, 8, 8, (1, 1, 5, 5), elem),
        lambda elem: grouped(1, 2, 2, 5, 8, elem),
    ],
    ids=["sdpa-additive", "sdpa-causal", "hf-eager-casts", "grouped"],
)
def test_float16_fuses_into_one_step_as_float32_does(build: Any) -> None:
    half, single = build(F16), build(F32)
    half_steps = _attention_steps(half, _feeds(half, 0))
    single_steps = _attention_steps(single, _feeds(single, 0))
    assert len(half_steps) == len(single_steps) == 1
    # every node absorbed in both (the Casts to float32 and back around the Softmax too), the kernel storing float16
    assert set(half_steps[0].node_names) == set(single_steps[0].node_names) == {n.name for n in half.graph.node}
    assert half_steps[0].placement == "webgpu"
    assert half_steps[0].output_infos[0].dtype == np.float16
    _wgsl(half, _feeds(half, 0))
    assert "f16" not in single_steps[0].op_plan.kernels[0].wgsl  # float32 keeps its own kernel


# -- the fused patterns on each kernel --------------------------------------------------------------------------------


@pytest.mark.parametrize("sq,sk,head", [(1, 7, 32), (7, 9, 64), (5, 33, 6), (3, 12, 80)])
def test_blocks_kernel(env: ortgpu.Env, sq: int, sk: int, head: int) -> None:
    """Short queries (decoding) and heads not a multiple of 4 (scalar loads) take the workgroup-tiled kernel."""
    model = sdpa(2, 3, sq, sk, head, "additive")
    feeds = _feeds(model, sq * sk + head)
    assert "var<workgroup> qs:" in _wgsl(model, feeds)
    _check(env, model, feeds)


def test_blocks_kernel_with_v_from_device_memory(env: ortgpu.Env) -> None:
    """A value head too large for V's tile in workgroup storage (16 KB on the fake device, 32 KB on lavapipe): V read
    straight from the f16 buffer."""
    model = hf_eager(1, 2, 1, 20, 8, 1024, (1, 1, 1, 20))
    feeds = _feeds(model, 3)
    wgsl = _wgsl(model, feeds)
    assert "var<workgroup> qs:" in wgsl and "var<workgroup> vs:" not in wgsl
    _check(env, model, feeds)


@pytest.mark.parametrize("head", [32, 64, 80])
def test_rows_kernel(env: ortgpu.Env, splits: int, head: int) -> None:
    """16 query rows or more: the row-per-invocation kernel, its Q row in registers (heads up to 64) or in a tile."""
    model = hf_eager(1, 2, 33, 70, head, head, (1, 1, 33, 70))
    feeds = _feeds(model, head + splits)
    assert "var<workgroup> sm:" in _wgsl(model, feeds)
    _check(env, model, feeds)


@pytest.mark.parametrize("sq,sk", [(3, 40), (20, 45), (64, 130)])
def test_sdpa_causal(env: ortgpu.Env, sq: int, sk: int) -> None:
    model = sdpa(1, 3, sq, sk, 32, "causal")
    feeds = _feeds(model, sq * sk)
    _check(env, model, feeds)


@pytest.mark.parametrize("kind", ["finite-min", "keys-dropped", "rows-dropped"])
def test_masks(env: ortgpu.Env, splits: int, kind: str) -> None:
    """float16 masks as exporters make them: the float16 minimum (HF), -inf keys, a row of -inf (NaN, as Softmax)."""
    sq, sk = 20, 37
    mask = np.zeros((2, 1, sq, sk), np.float16)
    if kind == "finite-min":
        mask[:, :, :, 25:] = np.finfo(np.float16).min
    elif kind == "keys-dropped":
        mask[:, :, :, ::3] = -np.inf
    else:
        mask[1, :, 4, :] = -np.inf
    for model in (hf_eager(2, 2, sq, sk, 16, 24, (2, 1, sq, sk)), sdpa(2, 2, sq, sk, 16, "additive")):
        _check(env, model, _feeds(model, 4, mask=mask))


def test_scores_cast_to_float32_before_a_float32_mask(env: ortgpu.Env) -> None:
    """The scores cast to float32 straight after Q.K^T, scaled and masked in float32 (a float32 mask), cast back after
    the Softmax: one step still, the mask bound as f32 beside the f16 Q/K/V/output."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s16"]),
        helper.make_node("Cast", ["s16"], ["s0"], to=F32),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Add", ["mask", "s1"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p32"], axis=-1),
        helper.make_node("Cast", ["p32"], ["p"], to=F16),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    shapes = {"q": ((1, 2, 18, 16), F16), "k": ((1, 2, 30, 16), F16), "v": ((1, 2, 30, 16), F16)}
    model = _model(nodes, shapes | {"mask": ((1, 1, 18, 30), F32)}, {"y": F16}, (_const("scale", 0.25, F32),))
    feeds = _feeds(model, 10)
    wgsl = _wgsl(model, feeds)
    assert "input_3: array<f32>" in wgsl and "output_0_f16: array<f16>" in wgsl
    _check(env, model, feeds)


@pytest.mark.parametrize("s", [5, 21])
def test_grouped_heads(env: ortgpu.Env, s: int) -> None:
    model = grouped(2, 2, 3, s, 32)
    _check(env, model, _feeds(model, 7))


def test_unfused_nodes_compute_the_same(env: ortgpu.Env) -> None:
    """Not fused (planned node by node, or past FUSE_MAX_SCORES scores per head): the float16 MatMuls, Mul, Add and
    Casts run on the device one by one (the Softmax is another operator's kernel, wherever it runs)."""
    model = hf_eager(1, 2, 17, 23, 32, 32, (1, 1, 17, 23))
    _check(env, model, _feeds(model, 8), fused=False, fuse=False, elsewhere=("Softmax",))
    keys = FUSE_MAX_SCORES // 16 + 1
    model = sdpa(1, 1, 16, keys, 8, "none")
    feeds = _feeds(model, 9)
    assert _attention_steps(model, feeds) == []
    # a reduction over 4097 keys: both runtimes round the scores and the weights to float16 (a weight's rounding is
    # ~0.05% of it) and sum them in their own orders, so the errors add up further than over a few keys
    _check(env, model, feeds, fused=False, elsewhere=("Softmax",), tolerance=3e-3)


# -- the ONNX Attention operator --------------------------------------------------------------------------------------


def attention(
    shapes: Mapping[str, tuple[tuple[int, ...], int]],
    attrs: Mapping[str, Any],
    outputs: int = 1,
    opset: int = 23,
) -> onnx.ModelProto:
    """One Attention node over ``shapes`` (name -> (shape, type) in input order; "" names an absent input)."""
    names = ["q", "k", "v", "mask", "past_key", "past_value", "nonpad"]
    given = [name if name in shapes else "" for name in names]
    while given and not given[-1]:
        given.pop()
    output_names = ["y", "present_key", "present_value", "qk"][:outputs]
    node = helper.make_node("Attention", given, output_names, **attrs)
    return _model([node], dict(shapes), {name: F16 for name in output_names}, opset=opset)


def _heads(b: int, h: int, s: int, d: int) -> tuple[tuple[int, ...], int]:
    return ((b, h, s, d), F16)


@pytest.mark.parametrize(
    "sq,causal,masked",
    [(20, 0, False), (20, 1, False), (24, 0, True), (5, 0, True), (1, 0, False), (6, 1, True)],
    ids=["rows", "rows-causal", "rows-mask", "blocks-mask", "decode", "blocks-causal-mask"],
)
def test_attention_flash(env: ortgpu.Env, sq: int, causal: int, masked: bool) -> None:
    """No cache, window or soft cap and a float16 mask over every key (or none): the flash kernels, 4-D, grouped."""
    shapes = {"q": _heads(2, 4, sq, 32), "k": _heads(2, 2, 33, 32), "v": _heads(2, 2, 33, 32)}
    if masked:
        shapes["mask"] = ((sq, 33), F16)
    model = attention(shapes, {"is_causal": causal})
    feeds = _feeds(model, sq + causal)
    wgsl = _kernels(model, feeds)
    assert wgsl.startswith("enable f16;\n")
    assert ("var<workgroup> sm:" if sq >= 16 else "var<workgroup> qs:") in wgsl  # the rows or the blocks kernel
    _check(env, model, feeds, fused=None)


def test_attention_3d_heads(env: ortgpu.Env) -> None:
    shapes = {"q": ((2, 18, 6 * 16), F16), "k": ((2, 25, 2 * 16), F16), "v": ((2, 25, 2 * 24), F16)}
    model = attention(shapes, {"q_num_heads": 6, "kv_num_heads": 2, "is_causal": 1})
    _check(env, model, _feeds(model, 11), fused=None)


def test_attention_bool_mask_and_scores(env: ortgpu.Env) -> None:
    """A bool or float16 mask and a soft cap: the per-element kernel; the scores of every mode by their own kernel.
    (Mode 2 with a float16 mask: onnxruntime writes a bool mask's dropped scores as the float16 minimum, the
    definition and ortgpu as -inf.)"""
    for mode in range(4):
        mask = ((4, 6), F16 if mode == 2 else BOOL)
        shapes = {"q": _heads(1, 2, 4, 8), "k": _heads(1, 2, 6, 8), "v": _heads(1, 2, 6, 8), "mask": mask}
        model = attention(shapes, {"softcap": 2.0, "qk_matmul_output_mode": mode}, outputs=4)
        _check(env, model, _feeds(model, 12 + mode), fused=None)


def test_attention_past_and_present(env: ortgpu.Env) -> None:
    """A key/value cache: the per-element kernel reads past and new keys, the present outputs are copies."""
    shapes = {
        "q": _heads(2, 4, 3, 8),
        "k": _heads(2, 2, 2, 8),
        "v": _heads(2, 2, 2, 8),
        "mask": ((3, 7), F16),
        "past_key": _heads(2, 2, 5, 8),
        "past_value": _heads(2, 2, 5, 8),
    }
    model = attention(shapes, {"scale": 0.3, "is_causal": 1}, outputs=3)
    _check(env, model, _feeds(model, 13), fused=None)


def test_attention_sequence_lengths_and_windows(env: ortgpu.Env) -> None:
    shapes = {"q": _heads(2, 2, 3, 8), "k": _heads(2, 2, 6, 8), "v": _heads(2, 2, 6, 8)}
    shapes["nonpad"] = ((2,), I64)
    model = attention(shapes, {"is_causal": 1}, opset=24)
    _check(env, model, _feeds(model, 14, nonpad=np.array([4, 6], np.int64)), fused=None)
    shapes = {"q": _heads(1, 2, 5, 4), "k": _heads(1, 1, 7, 4), "v": _heads(1, 1, 7, 4)}
    model = attention(shapes, {"left_window_size": 1, "right_window_size": 2, "scale": 0.3}, opset=25)
    _check(env, model, _feeds(model, 15), fused=None)


def test_linear_attention(env: ortgpu.Env) -> None:
    inputs = {
        "q": ((2, 3, 16), F16),
        "k": ((2, 3, 8), F16),
        "v": ((2, 3, 12), F16),
        "past": ((2, 2, 4, 6), F16),
        "decay": ((2, 3, 8), F16),
        "beta": ((2, 3, 2), F16),
    }
    node = helper.make_node(
        "LinearAttention", list(inputs), ["y", "state"], q_num_heads=4, kv_num_heads=2, update_rule="gated_delta"
    )
    model = _model([node], inputs, {"y": F16, "state": F16}, opset=27)
    rng = np.random.default_rng(16)
    feeds = _feeds(model, 16)
    feeds["decay"] = (rng.standard_normal((2, 3, 8)) * 0.1).astype(np.float16)
    feeds["beta"] = rng.uniform(0.0, 1.0, (2, 3, 2)).astype(np.float16)
    _check(env, model, feeds, fused=None)


# -- without shader-f16 -----------------------------------------------------------------------------------------------


def test_a_device_without_shader_f16_runs_them_on_the_cpu() -> None:
    env = ortgpu.Env(backend=FakeBackend([FakeDeviceSpec(features=frozenset())]))
    try:
        model = sdpa(1, 2, 5, 7, 8, "additive")
        feeds = _feeds(model, 17)
        assert _attention_steps(model, feeds, DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)) == []
        shapes = {"q": _heads(1, 2, 5, 8), "k": _heads(1, 2, 7, 8), "v": _heads(1, 2, 7, 8)}
        operator = attention(shapes, {"is_causal": 1})
        for graph, op_type in ((model, "MatMul"), (operator, "Attention")):
            inputs = _feeds(graph, 18)
            want = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(
                None, inputs
            )[0]
            with ortgpu.InferenceSession(graph.SerializeToString(), env=env) as session:
                placement = session.get_node_placement({n: v.shape for n, v in inputs.items()})
                node = next(p for p in placement if p.op_type == op_type)
                assert node.placement == "cpu" and "shader-f16" in node.reason
                got = session.run(None, inputs)[0]
            assert got.dtype == np.float16
            # the pattern's nodes run one by one, each rounding to float16 in both runtimes, but onnxruntime's float16
            # Mul does not round to nearest: a score an ulp apart here and there moves the output by a few ulps
            error = float(np.abs(got.astype(np.float64) - want).max())
            assert error <= 4e-3 * float(np.abs(want.astype(np.float64)).max())
    finally:
        env.close()
