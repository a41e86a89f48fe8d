"""Attention as exporters write it runs as one flash-attention kernel, with the unfused graph's numerics.

Each case builds the node pattern of one exporter (HF eager attention, torch's ``scaled_dot_product_attention``,
BERT-style Reshape/Transpose heads, ``nn.MultiheadAttention``'s 3-D batched heads and its packed projection split by
Gathers, timm's packed projection split by Split or Slices, grouped K/V heads broadcast along a batch axis), checks the planner makes one ``FusedAttention`` step of it only when fusing, and compares the run on
each backend with onnxruntime CPU at the shape edges: one query, odd lengths, head sizes 32/64/80/128, masks all
zero, all dropped (NaN rows, as Softmax gives), finite minimum masks, causal masks.  Patterns the kernel does not
compute (the scores also a graph output, a Softmax over another axis) stay unfused and still match.
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
from ortgpu.ops import DeviceCaps
from ortgpu.ops._fused_attention import FusedAttention
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
F32 = TensorProto.FLOAT


def _const(name: str, value: Any) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: Mapping[str, tuple[int, ...]],
    output: str,
    inits: list[onnx.TensorProto],
    extra_outputs: tuple[str, ...] = (),
    bool_inputs: tuple[str, ...] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info(n, TensorProto.BOOL if n in bool_inputs else F32, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(output, F32, None)]
        + [helper.make_tensor_value_info(name, F32, None) for name in extra_outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for index, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{index}"
    return model


def hf_eager(b: int, h: int, sq: int, sk: int, d: int, dv: int, mask: tuple[int, ...] | None) -> onnx.ModelProto:
    """matmul(q, k.transpose(2, 3)) * scale + mask, softmax in float32 (a Cast after it), matmul(., v)."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
    ]
    inputs: dict[str, tuple[int, ...]] = {"q": (b, h, sq, d), "k": (b, h, sk, d), "v": (b, h, sk, dv)}
    last = "s1"
    if mask is not None:
        nodes.append(helper.make_node("Add", ["s1", "mask"], ["s2"]))
        inputs["mask"] = mask
        last = "s2"
    nodes += [
        helper.make_node("Softmax", [last], ["p32"], axis=-1),
        helper.make_node("Cast", ["p32"], ["p"], to=F32),  # softmax(..., dtype=torch.float32)
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    return _model(nodes, inputs, "y", [_const("scale", 1.0 / np.sqrt(d))])


def sdpa(b: int, h: int, sq: int, sk: int, d: int, causal: bool) -> onnx.ModelProto:
    """torch's export of F.scaled_dot_product_attention: both operands scaled by sqrt(scale); is_causal as a
    constant mask of 0 and -inf."""
    root = np.float32(np.sqrt(1.0 / np.sqrt(d)))
    nodes = [
        helper.make_node("Mul", ["q", "root"], ["qs"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["kt", "root"], ["kts"]),
        helper.make_node("MatMul", ["qs", "kts"], ["s0"]),
    ]
    inits = [_const("root", root)]
    last = "s0"
    if causal:
        inits.append(_const("causal", np.triu(np.full((sq, sk), -np.inf, np.float32), k=1 + sk - sq)))
        nodes.append(helper.make_node("Add", ["s0", "causal"], ["s1"]))
        last = "s1"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    return _model(nodes, {"q": (b, h, sq, d), "k": (b, h, sk, d), "v": (b, h, sk, d)}, "y", inits)


def bert(b: int, h: int, s: int, d: int) -> onnx.ModelProto:
    """Heads split by Reshape + Transpose from [B, S, H*D] projections, K transposed straight to [B, H, D, S],
    the scores divided by sqrt(D), a [B, 1, 1, S] mask, the output transposed back and reshaped."""
    nodes = [
        helper.make_node("Reshape", ["xq", "heads"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["xk", "heads"], ["k4"]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["xv", "heads"], ["v4"]),
        helper.make_node("Transpose", ["v4"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Div", ["s0", "root_d"], ["s1"]),
        helper.make_node("Add", ["s1", "mask"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=3),
        helper.make_node("MatMul", ["p", "v"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merged"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([b, s, h, d], np.int64), "heads"),
        numpy_helper.from_array(np.array([b, s, h * d], np.int64), "merged"),
        _const("root_d", np.sqrt(d)),
    ]
    inputs = {"xq": (b, s, h * d), "xk": (b, s, h * d), "xv": (b, s, h * d), "mask": (b, 1, 1, s)}
    return _model(nodes, inputs, "y", inits)


def mha_3d(bh: int, sq: int, sk: int, d: int) -> onnx.ModelProto:
    """nn.MultiheadAttention's batched heads: [B*H, S, D], q scaled first, bmm with K transposed."""
    nodes = [
        helper.make_node("Mul", ["q", "scale"], ["qs"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["qs", "kt"], ["s0"]),
        helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = {"q": (bh, sq, d), "k": (bh, sk, d), "v": (bh, sk, d)}
    return _model(nodes, inputs, "y", [_const("scale", 1.0 / np.sqrt(d))])


def _scaled_heads_attention(merge: list[int], merged: str) -> list[onnx.NodeProto]:
    """torch's SDPA over heads ``q3``, ``k3``, ``v3`` [B, H, S, D] (Q and K scaled by ``quarter`` each), the product
    transposed by ``merge`` and reshaped to ``merged``, into ``y``."""
    return [
        helper.make_node("Mul", ["q3", "quarter"], ["qs"]),
        helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["kt", "quarter"], ["kts"]),
        helper.make_node("MatMul", ["qs", "kts"], ["s0"]),
        helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v3"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=merge),
        helper.make_node("Reshape", ["ctx_t", merged], ["y"]),
    ]


def mha_packed(s: int, b: int, h: int, d: int) -> onnx.ModelProto:
    """torch's ``nn.MultiheadAttention`` from its packed projection ``qkv`` [S, B, 3E] (sequence first): Reshape to
    [S, B, 3, E], Unsqueeze, Transpose (3, 1, 2, 0, 4), Squeeze, one Gather per operand, each Reshaped to
    [S, B*H, D], Transposed to [B*H, S, D] and Reshaped to [B, H, S, D]; Q and K scaled by D**-0.25 each; the output
    transposed to [S, B, H, D] and reshaped to [S*B, E] (as the output projection reads it)."""
    e = h * d
    nodes = [
        helper.make_node("Reshape", ["qkv", "split3"], ["r3"]),
        helper.make_node("Unsqueeze", ["r3", "zero_axis"], ["u"]),
        helper.make_node("Transpose", ["u"], ["t"], perm=[3, 1, 2, 0, 4]),
        helper.make_node("Squeeze", ["t", "minus2"], ["packed"]),
    ]
    for index, name in enumerate("qkv"):
        nodes += [
            helper.make_node("Gather", ["packed", f"index{index}"], [f"{name}0"], axis=0),
            helper.make_node("Reshape", [f"{name}0", "heads_first"], [f"{name}1"]),
            helper.make_node("Transpose", [f"{name}1"], [f"{name}2"], perm=[1, 0, 2]),
            helper.make_node("Reshape", [f"{name}2", "heads4"], [f"{name}3"]),
        ]
    nodes += _scaled_heads_attention(merge=[2, 0, 1, 3], merged="rows")
    inits = [
        numpy_helper.from_array(np.array([s, b, 3, e], np.int64), "split3"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
        numpy_helper.from_array(np.array([-2], np.int64), "minus2"),
        numpy_helper.from_array(np.array([s, b * h, d], np.int64), "heads_first"),
        numpy_helper.from_array(np.array([b, h, s, d], np.int64), "heads4"),
        numpy_helper.from_array(np.array([s * b, e], np.int64), "rows"),
        _const("quarter", d**-0.25),
    ] + [numpy_helper.from_array(np.array(i, np.int64), f"index{i}") for i in range(3)]
    return _model(nodes, {"qkv": (s, b, 3 * e)}, "y", inits)


def timm_packed(b: int, s: int, h: int, d: int, split: str = "split") -> onnx.ModelProto:
    """timm's ViT attention from its packed projection ``qkv`` [B, S, 3E]: Reshape to [B, S, 3, H, D], Transpose
    (2, 0, 3, 1, 4), ``unbind(0)`` exported as Split + Squeeze per operand (``split="slice"``: a Slice of constant
    bounds per operand instead of Split), torch's SDPA (Q and K scaled by D**-0.25), the heads merged back by
    Transpose (0, 2, 1, 3) + Reshape.  Also returns ``extra``: the Split's V part plus one (read outside the
    attention) when ``split="split-read-elsewhere"``."""
    e = h * d
    nodes = [
        helper.make_node("Reshape", ["qkv", "split5"], ["r5"]),
        helper.make_node("Transpose", ["r5"], ["t"], perm=[2, 0, 3, 1, 4]),
    ]
    inits = [
        numpy_helper.from_array(np.array([b, s, 3, h, d], np.int64), "split5"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([b, s, e], np.int64), "merged"),
        _const("quarter", d**-0.25),
        _const("one", 1.0),
    ]
    if split == "slice":
        for index, name in enumerate("qkv"):
            inits += [
                numpy_helper.from_array(np.array([index], np.int64), f"start{index}"),
                numpy_helper.from_array(np.array([index + 1], np.int64), f"end{index}"),
            ]
            nodes.append(helper.make_node("Slice", ["t", f"start{index}", f"end{index}", "axis0"], [f"{name}p"]))
    else:
        inits.append(numpy_helper.from_array(np.array([1, 1, 1], np.int64), "ones3"))
        nodes.append(helper.make_node("Split", ["t", "ones3"], ["qp", "kp", "vp"], axis=0))
    nodes += [helper.make_node("Squeeze", [f"{name}p", "axis0"], [f"{name}3"]) for name in "qkv"]
    nodes += _scaled_heads_attention(merge=[0, 2, 1, 3], merged="merged")
    extra: tuple[str, ...] = ()
    if split == "split-read-elsewhere":
        nodes.append(helper.make_node("Add", ["vp", "one"], ["extra"]))
        extra = ("extra",)
    return _model(nodes, {"qkv": (b, s, 3 * e)}, "y", inits, extra_outputs=extra)


def grouped(b: int, hkv: int, rep: int, s: int, d: int) -> onnx.ModelProto:
    """Grouped K/V heads as a broadcast axis: Q [B, Hkv, rep, S, D] against K/V [B, Hkv, 1, S, D]; a bool mask
    turned additive by Where(mask, 0, -inf)."""
    nodes = [
        helper.make_node("Where", ["keep", "zero", "minus_inf"], ["bias"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 2, 4, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Add", ["s1", "bias"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = {"q": (b, hkv, rep, s, d), "k": (b, hkv, 1, s, d), "v": (b, hkv, 1, s, d), "keep": (b, 1, 1, 1, s)}
    inits = [_const("scale", 1.0 / np.sqrt(d)), _const("zero", 0.0), _const("minus_inf", -np.inf)]
    return _model(nodes, inputs, "y", inits, bool_inputs=("keep",))


def _feeds(model: onnx.ModelProto, seed: int, **masks: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = tuple(dim.dim_value for dim in value.type.tensor_type.shape.dim)
        if value.name in masks:
            feeds[value.name] = masks[value.name]
        elif value.type.tensor_type.elem_type == TensorProto.BOOL:
            feeds[value.name] = rng.random(shape) < 0.7
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _fused_steps(model: onnx.ModelProto, feeds: dict[str, np.ndarray], fuse: bool = True) -> list[Any]:
    plan = plan_model(
        load_model(model),
        {n: v.shape for n, v in feeds.items()},
        CAPS,
        input_dtypes={n: v.dtype for n, v in feeds.items()},
        fuse=fuse,
    )
    return [step for step in plan.steps if isinstance(step.operator, FusedAttention)]


def _check(env: ortgpu.Env, model: onnx.ModelProto, feeds: dict[str, np.ndarray], fused: bool = True) -> None:
    """The session's outputs match onnxruntime CPU's; on this backend's device the attention ran fused or not."""
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        placement = sess.get_node_placement({name: value.shape for name, value in feeds.items()})
        assert any("fused attention" in p.reason for p in placement) == fused
        assert all(p.placement == "webgpu" for p in placement)
        got = sess.run(None, feeds)
    for actual, want in zip(got, expected):
        assert actual.shape == want.shape and actual.dtype == want.dtype
        assert np.array_equal(np.isnan(actual), np.isnan(want))
        finite = ~np.isnan(want)
        scale = max(float(np.abs(want[finite]).max(initial=0.0)), 1e-30)
        assert float(np.abs(actual[finite].astype(np.float64) - want[finite]).max(initial=0.0)) / scale <= 1e-4


# -- the plan ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: hf_eager(1, 2, 5, 5, 8, 8, (1, 1, 5, 5)),
        lambda: sdpa(1, 2, 4, 6, 8, causal=True),
        lambda: bert(2, 2, 5, 8),
        lambda: mha_3d(4, 3, 5, 8),
        lambda: grouped(1, 2, 2, 5, 8),
        lambda: mha_packed(5, 1, 2, 8),
    ],
    ids=["hf-eager", "sdpa-causal", "bert", "mha-3d", "grouped", "mha-packed"],
)
def test_the_pattern_becomes_one_fused_step_only_when_fusing(build: Any) -> None:
    model = build()
    feeds = _feeds(model, 0)
    steps = _fused_steps(model, feeds)
    assert len(steps) == 1
    step = steps[0]
    absorbed = {"MatMul", "Softmax"} <= set(step.op_types) and step.op_types.count("MatMul") == 2
    assert absorbed and step.placement == "webgpu"
    # every Transpose and scalar Mul/Div feeding the products is read through, not run, and the Transpose of the
    # product (the heads moved back together) is written through
    for node in model.graph.node:
        if node.op_type in ("Transpose", "Mul", "Div") and node.output[0] != "t":
            assert node.name in step.node_names
    assert ("_out_perm" in step.attrs) == any(node.output[0] == "ctx_t" for node in model.graph.node)
    assert _fused_steps(model, feeds, fuse=False) == []


def test_scores_read_elsewhere_stay_unfused(env: ortgpu.Env) -> None:
    model = hf_eager(1, 2, 5, 5, 8, 8, None)
    model.graph.output.append(helper.make_tensor_value_info("s1", F32, None))
    feeds = _feeds(model, 1)
    assert _fused_steps(model, feeds) == []
    _check(env, model, feeds, fused=False)


def test_softmax_over_another_axis_stays_unfused(env: ortgpu.Env) -> None:
    model = hf_eager(1, 2, 5, 5, 8, 8, None)
    next(n for n in model.graph.node if n.op_type == "Softmax").attribute[0].i = 2
    feeds = _feeds(model, 2)
    assert _fused_steps(model, feeds) == []
    _check(env, model, feeds, fused=False)


def test_scaled_values_keep_their_scale(env: ortgpu.Env) -> None:
    """The kernel takes no factor on V: a scalar Mul on V runs as its own step and the attention reads its output."""
    model = hf_eager(1, 2, 5, 5, 8, 8, None)
    node = next(n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] == "p")
    node.input[1] = "v2"
    model.graph.node.insert(0, helper.make_node("Mul", ["v", "scale"], ["v2"], name="scale_v"))
    feeds = _feeds(model, 3)
    (step,) = _fused_steps(model, feeds)
    assert "scale_v" not in step.node_names and step.inputs[2] == "v2"
    _check(env, model, feeds)


# -- numerics at the edges --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", [32, 64, 80, 128])
@pytest.mark.parametrize("sq,sk", [(1, 7), (7, 7), (19, 33)])
def test_hf_eager_head_sizes_and_lengths(env: ortgpu.Env, head: int, sq: int, sk: int) -> None:
    model = hf_eager(1, 2, sq, sk, head, head, (1, 1, sq, sk))
    feeds = _feeds(model, head + sq)
    assert len(_fused_steps(model, feeds)) == 1
    _check(env, model, feeds)


@pytest.mark.parametrize("kind", ["zero", "finite-min", "rows-dropped", "keys-dropped"])
def test_masks(env: ortgpu.Env, kind: str) -> None:
    sq, sk = 6, 9
    mask = np.zeros((2, 1, sq, sk), np.float32)
    if kind == "finite-min":
        mask[:, :, :, 4:] = np.finfo(np.float32).min
    elif kind == "rows-dropped":
        mask[0, :, 2, :] = -np.inf  # every key of a row dropped: NaN, as Softmax gives
    elif kind == "keys-dropped":
        mask[:, :, :, ::2] = -np.inf
    model = hf_eager(2, 3, sq, sk, 16, 24, (2, 1, sq, sk))
    feeds = _feeds(model, 4, mask=mask)
    assert len(_fused_steps(model, feeds)) == 1
    _check(env, model, feeds)


@pytest.mark.parametrize("sq,sk", [(1, 1), (5, 5), (3, 40)])
def test_sdpa_causal(env: ortgpu.Env, sq: int, sk: int) -> None:
    model = sdpa(1, 3, sq, sk, 32, causal=True)
    feeds = _feeds(model, sq * sk)
    assert len(_fused_steps(model, feeds)) == 1
    _check(env, model, feeds)


def test_bert_heads_through_reshape_and_transposes(env: ortgpu.Env) -> None:
    model = bert(2, 4, 13, 16)
    mask = np.zeros((2, 1, 1, 13), np.float32)
    mask[1, ..., 9:] = -10000.0
    _check(env, model, _feeds(model, 5, mask=mask))


def test_multihead_3d(env: ortgpu.Env) -> None:
    model = mha_3d(6, 1, 17, 64)
    _check(env, model, _feeds(model, 6))


def test_packed_projection_is_read_in_place() -> None:
    """Every node between the packed projection and the products is read through: its split (shared by Q, K and V),
    the Gathers, Reshapes and Transposes make no copies.  At batch 2 the [S, B*H, D] Reshape merges axes that lie
    apart in the projection; the views start at the split's output (the split still runs, once)."""
    model = mha_packed(7, 1, 4, 16)
    step = _fused_steps(model, _feeds(model, 0))[0]
    assert step.op_types.count("Gather") == 3 and step.op_types.count("Reshape") == 7
    assert len(set(step.node_names)) == len(step.node_names)
    assert set(step.inputs[:3]) == {"qkv"}
    assert [view[2] for view in step.attrs["_views"]] == [0, 64, 128]  # Q, K, V offsets in [S, B, 3E]: index * E
    model = mha_packed(7, 2, 4, 16)
    step = _fused_steps(model, _feeds(model, 0))[0]
    assert step.op_types.count("Gather") == 3 and "Squeeze" not in step.op_types
    assert set(step.inputs[:3]) == {"packed"}
    assert [view[2] for view in step.attrs["_views"]] == [0, 896, 1792]  # in [3, S, B, E]: index * S*B*E


@pytest.mark.parametrize("split", ["split", "slice"])
def test_unbind_as_split_or_slices_is_read_in_place(env: ortgpu.Env, split: str) -> None:
    """timm's ``qkv.unbind(0)`` (Split + Squeeze, or Slices): the attention reads the packed projection itself."""
    model = timm_packed(2, 9, 3, 32, split)
    feeds = _feeds(model, 12)
    step = _fused_steps(model, feeds)[0]
    assert set(step.inputs[:3]) == {"qkv"} and "_out_perm" in step.attrs
    assert [view[2] for view in step.attrs["_views"]] == [0, 96, 192]  # index * E in [B, S, 3E]
    _check(env, model, feeds)


def test_a_split_part_read_elsewhere_keeps_the_split(env: ortgpu.Env) -> None:
    """A Split whose V part is also read outside the attention is not taken into it: the Split runs, and every
    output, the other reader's too, is right."""
    model = timm_packed(1, 7, 2, 16, "split-read-elsewhere")
    feeds = _feeds(model, 13)
    step = _fused_steps(model, feeds)[0]
    assert "Split" not in step.op_types and "Squeeze" in step.op_types
    _check(env, model, feeds)


def test_a_split_read_elsewhere_still_runs(env: ortgpu.Env) -> None:
    """Where the split's output is also a graph output, the split runs and the views start at its output."""
    model = mha_packed(6, 1, 2, 32)
    model.graph.output.append(helper.make_tensor_value_info("packed", F32, None))
    feeds = _feeds(model, 4)
    step = _fused_steps(model, feeds)[0]
    assert set(step.inputs[:3]) == {"packed"} and "Squeeze" not in step.op_types
    _check(env, model, feeds)


def test_shared_query_and_key_keep_their_producer(env: ortgpu.Env) -> None:
    """Q and K one tensor (shared-QK attention) split from a packed projection by a Gather: the K^T view may not
    take the Gather that produces Q's source; the step reads Q where the Gather writes it."""
    b, s, h, d = 1, 6, 2, 8
    nodes = [
        helper.make_node("Reshape", ["x", "s5"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]),
        helper.make_node("Gather", ["t", "i0"], ["qk"], axis=0),
        helper.make_node("Gather", ["t", "i1"], ["v"], axis=0),
        helper.make_node("Transpose", ["qk"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qk", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([b, s, 2, h, d], np.int64), "s5"),
        numpy_helper.from_array(np.array(0, np.int64), "i0"),
        numpy_helper.from_array(np.array(1, np.int64), "i1"),
        _const("scale", d**-0.5),
    ]
    model = _model(nodes, {"x": (b, s, 2 * h * d)}, "y", inits)
    feeds = _feeds(model, 21)
    step = _fused_steps(model, feeds)[0]
    assert step.inputs[0] == "qk" and not {"Reshape", "Gather"} & set(step.op_types[:2])
    _check(env, model, feeds)


def test_a_split_part_read_twice_keeps_the_split(env: ortgpu.Env) -> None:
    """Q and V the same Split part, K^T the other: the Split produces a source the step reads, so it runs."""
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b"], axis=0),
        helper.make_node("Transpose", ["b"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["a", "kt"], ["s0"]),
        helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "a"], ["y"]),
    ]
    model = _model(nodes, {"x": (2, 2, 5, 8)}, "y", [])
    feeds = _feeds(model, 22)
    step = _fused_steps(model, feeds)[0]
    assert "Split" not in step.op_types
    _check(env, model, feeds)


def test_a_scaled_packed_projection_still_fuses(env: ortgpu.Env) -> None:
    """A scalar Mul on the packed projection before its split scales V too: it stays a step, the views start after
    it, and the attention still fuses."""
    model = timm_packed(1, 5, 2, 16)
    graph = model.graph
    graph.input[0].name = "qkv_in"
    graph.node.insert(0, helper.make_node("Mul", ["qkv_in", "half"], ["qkv"], name="scale_qkv"))
    graph.initializer.append(_const("half", 0.5))
    feeds = _feeds(model, 23)
    step = _fused_steps(model, feeds)[0]
    assert "scale_qkv" not in step.node_names and set(step.inputs[:3]) == {"qkv"}
    _check(env, model, feeds)


def test_expanded_key_and_value_heads_are_read_in_place(env: ortgpu.Env) -> None:
    """K and V of one head broadcast to every query head by Expand (multi-query attention as some exporters write
    it): the step reads the one head with stride 0, no copy."""
    b, h, s, d = 2, 4, 6, 16
    nodes = [
        helper.make_node("Expand", ["k1", "heads"], ["k"]),
        helper.make_node("Expand", ["v1", "heads"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([b, h, s, d], np.int64), "heads"), _const("scale", d**-0.5)]
    model = _model(nodes, {"q": (b, h, s, d), "k1": (b, 1, s, d), "v1": (b, 1, s, d)}, "y", inits)
    feeds = _feeds(model, 24)
    step = _fused_steps(model, feeds)[0]
    assert step.inputs[1:3] == ("k1", "v1") and step.op_types.count("Expand") == 2
    assert step.attrs["_views"][2][1][1] == 0  # V's head axis: stride 0
    _check(env, model, feeds)


def repeated_heads(b: int, hkv: int, rep: int, s: int, d: int, mask: bool = False) -> onnx.ModelProto:
    """HF's grouped-query attention: K and V [B, Hkv, S, D] (from [B, S, Hkv, D] projections, transposed) repeated
    for the query heads by ``repeat_kv`` (Unsqueeze, Expand to [B, Hkv, rep, S, D], Reshape to [B, H, S, D]), Q
    [B, H, S, D] from its [B, S, H, D] projection, a causal-style additive mask if ``mask``, the heads merged back."""
    h = hkv * rep
    nodes = [helper.make_node("Transpose", ["q_proj"], ["q"], perm=[0, 2, 1, 3])]
    for name in "kv":
        nodes += [
            helper.make_node("Transpose", [f"{name}_proj"], [f"{name}h"], perm=[0, 2, 1, 3]),
            helper.make_node("Unsqueeze", [f"{name}h", "axis2"], [f"{name}u"]),
            helper.make_node("Expand", [f"{name}u", "repeated"], [f"{name}e"]),
            helper.make_node("Reshape", [f"{name}e", "heads"], [f"{name}r"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
    ]
    last = "s1"
    if mask:
        nodes.append(helper.make_node("Add", ["s1", "mask"], ["s2"]))
        last = "s2"
    nodes += [
        helper.make_node("Softmax", [last], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vr"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merged"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
        numpy_helper.from_array(np.array([b, hkv, rep, s, d], np.int64), "repeated"),
        numpy_helper.from_array(np.array([b, h, s, d], np.int64), "heads"),
        numpy_helper.from_array(np.array([b, s, h * d], np.int64), "merged"),
        _const("scale", d**-0.5),
    ]
    inputs = {"q_proj": (b, s, h, d), "k_proj": (b, s, hkv, d), "v_proj": (b, s, hkv, d)}
    if mask:
        inputs["mask"] = (b, 1, s, s)
    return _model(nodes, inputs, "y", inits)


@pytest.mark.parametrize(
    "b,hkv,rep,s,d,mask",
    [
        (1, 2, 4, 7, 32, True),
        (2, 2, 2, 5, 16, True),
        (3, 2, 2, 5, 16, True),
        (2, 1, 3, 5, 64, False),
        (1, 3, 1, 4, 80, True),
    ],
)
def test_repeated_key_value_heads_are_not_copied(
    env: ortgpu.Env, b: int, hkv: int, rep: int, s: int, d: int, mask: bool
) -> None:
    """HF's repeat_kv (Unsqueeze, Expand, Reshape) is not copied: the attention splits its head axis into (groups,
    rep) and reads the K/V heads from the projections themselves, with stride 0 along the repeats; a mask per batch
    stays with its batch (batch sizes 2 and 3: against the split axes it would broadcast wrongly)."""
    model = repeated_heads(b, hkv, rep, s, d, mask)
    feeds = _feeds(model, 25 + rep)
    step = _fused_steps(model, feeds)[0]
    assert step.inputs[:3] == ("q_proj", "k_proj", "v_proj") and step.op_types.count("Expand") == 2
    # (one K/V head, or one query head per K/V head: the Reshape merges a size-1 axis, an ordinary view with
    # stride 0 for a repeated head, nothing to split)
    assert step.attrs.get("_batch_split") == ((1, hkv, rep) if hkv > 1 and rep > 1 else None)
    _check(env, model, feeds)


def test_a_repeat_read_elsewhere_is_copied_as_before(env: ortgpu.Env) -> None:
    """Where the repeated V is also a graph output, the repeat runs and the attention reads it unsplit."""
    model = repeated_heads(1, 2, 2, 6, 16)
    model.graph.output.append(helper.make_tensor_value_info("ve", F32, None))
    feeds = _feeds(model, 26)
    step = _fused_steps(model, feeds)[0]
    assert "_batch_split" not in step.attrs or step.inputs[2] != "v_proj"
    _check(env, model, feeds)


def test_a_reshape_that_would_copy_ends_the_view(env: ortgpu.Env) -> None:
    """A Reshape merging axes apart in memory (after a Transpose) is no strided view: it and what precedes it run,
    and the attention reads its output."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),  # [4, 3, 8] -> [3, 4, 8]
        helper.make_node("Reshape", ["xt", "flat"], ["q"]),  # [3, 4, 8] -> [1, 12, 8]: merges 3 and 4, apart
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1, 12, 8], np.int64), "flat")]
    model = _model(nodes, {"x": (4, 3, 8), "k": (1, 5, 8), "v": (1, 5, 8)}, "y", inits)
    feeds = _feeds(model, 3)
    step = _fused_steps(model, feeds)[0]
    assert step.inputs[0] == "q" and "Reshape" not in step.op_types
    _check(env, model, feeds)


@pytest.mark.parametrize("s,b,h,d", [(1, 1, 2, 32), (9, 1, 3, 64), (6, 2, 2, 80), (17, 1, 1, 128)])
def test_packed_projection(env: ortgpu.Env, s: int, b: int, h: int, d: int) -> None:
    model = mha_packed(s, b, h, d)
    _check(env, model, _feeds(model, 11 + s))


def test_grouped_heads_with_a_bool_mask(env: ortgpu.Env) -> None:
    model = grouped(2, 2, 3, 11, 32)
    _check(env, model, _feeds(model, 7))


def test_long_attention_stays_on_the_tiled_gemms(env: ortgpu.Env) -> None:
    """Past FUSE_MAX_SCORES scores per head the unfused path (tiled GEMMs, row Softmax) is the faster one."""
    from ortgpu.ops._fused_attention import FUSE_MAX_SCORES

    keys = FUSE_MAX_SCORES // 16 + 1
    model = hf_eager(1, 1, 16, keys, 8, 8, None)
    feeds = _feeds(model, 9)
    assert _fused_steps(model, feeds) == []
    assert (
        len(
            _fused_steps(
                hf_eager(1, 1, 16, keys - 1, 8, 8, None),
                feeds | {"k": feeds["k"][:, :, :-1], "v": feeds["v"][:, :, :-1]},
            )
        )
        == 1
    )
    _check(env, model, feeds, fused=False)
