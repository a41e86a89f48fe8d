"""onnxruntime's contributed attention operators (com.microsoft Attention, MultiHeadAttention, RotaryEmbedding,
GroupQueryAttention): single-node models run on both backends, every node on the device where its float path is
meant to run there, against onnxruntime's CPU provider (float16 against onnxruntime's float32 run of the same values,
which has no float16 kernel for most of them); refused variants raise typed errors naming the operator."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import run_model
from onnx import TensorProto, helper
from test_ops_elementwise import open_device

import ortgpu
from ortgpu_core._errors import InvalidArgumentError, ModelError, ShapeError, UnsupportedOpError

#: A shape error found while the loader learns the outputs' shapes (it runs the reference) arrives as a ModelError
#: carrying the operator's message; found while planning, as the ShapeError itself.
SHAPE_ERRORS = (ShapeError, ModelError)

F, H16, I32, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64
_DEVICES: dict[str, Any] = {}


def _device(backend_name: str) -> Any:
    if backend_name not in _DEVICES:
        _DEVICES[backend_name] = open_device(backend_name)
    return _DEVICES[backend_name]


def _model(op: str, inputs: list[tuple[str, int, tuple[int, ...]] | None], outputs: list[str], **attrs: Any) -> bytes:
    """One com.microsoft node; ``None`` inputs are left out (empty names), float outputs of unknown shape."""
    names, infos = [], []
    for spec in inputs:
        if spec is None:
            names.append("")
            continue
        names.append(spec[0])
        infos.append(helper.make_tensor_value_info(spec[0], spec[1], list(spec[2])))
    while names and not names[-1]:
        names.pop()
    out_type = next((t for _, t, _ in (s for s in inputs if s is not None) if t in (F, H16)), F)
    node = helper.make_node(op, names, outputs, domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node], "g", infos, [helper.make_tensor_value_info(o, out_type, None) for o in outputs if o]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    return model.SerializeToString()


def _onnxruntime(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _as_float32(model: bytes) -> bytes:
    """The model with its float16 declarations made float32 (onnxruntime's CPU judge for a float16 run)."""
    proto = onnx.load_from_string(model)
    for value in list(proto.graph.input) + list(proto.graph.output):
        if value.type.tensor_type.elem_type == H16:
            value.type.tensor_type.elem_type = F
    return proto.SerializeToString()


def _check(
    backend_name: str,
    model: bytes,
    feeds: dict[str, np.ndarray],
    expected: list[np.ndarray] | None = None,
    device_only: bool = True,
    tolerance: float = 1e-4,
) -> list[np.ndarray]:
    """Run on ortgpu (every node on the device when ``device_only``) and compare with ``expected`` (default:
    onnxruntime on ``model``) within ``tolerance`` relative to the largest expected value."""
    if expected is None:
        expected = _onnxruntime(model, feeds)
    got, plan = run_model(model, feeds, _device(backend_name), allow_cpu=not device_only)
    if device_only:
        assert all(step.placement == "webgpu" for step in plan.steps), plan.describe()
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert mine.shape == theirs.shape
        scale = max(1.0, float(np.abs(theirs.astype(np.float64)).max(initial=0.0)))
        error = float(np.abs(mine.astype(np.float64) - theirs.astype(np.float64)).max(initial=0.0))
        assert error <= tolerance * scale, f"error {error} at scale {scale}"
    return got


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# -- com.microsoft Attention -----------------------------------------------------------------------------------------

ATTENTION_CASES = {
    "defaults": dict(mask=None),
    "key_lengths": dict(mask="1d"),
    "end_and_start": dict(mask="2b"),
    "raw_mask": dict(mask="2d"),
    "raw_mask_causal": dict(mask="2d", attrs={"unidirectional": 1}),
    "mask_3d_causal": dict(mask="3d", attrs={"unidirectional": 1, "mask_filter_value": -5000.0}),
    "causal_no_mask": dict(mask=None, attrs={"unidirectional": 1, "scale": 0.3}),
    "attention_bias": dict(mask=None, bias_heads=1),
    "bias_and_mask": dict(mask="2d", bias_heads=3),
    "no_qkv_bias": dict(mask="1d", qkv_bias=False),
    "value_size": dict(mask=None, sizes=(6, 6, 9)),
    "past_present": dict(mask="2d", past=2, attrs={"unidirectional": 1}),
    "dead_row": dict(mask="dead", attrs={"unidirectional": 1}),
}


def _attention_feeds(case: dict[str, Any], batch: int, sq: int, hidden: int, heads: int, seed: int = 0) -> tuple:
    rng = _rng(seed)
    sizes = case.get("sizes", (hidden, hidden, hidden))
    past = case.get("past", 0)
    total = past + sq
    feeds = {"x": _normal(rng, (batch, sq, hidden)), "w": _normal(rng, (hidden, sum(sizes)), 0.4)}
    specs: list[Any] = [("x", F, (batch, sq, hidden)), ("w", F, (hidden, sum(sizes)))]
    if case.get("qkv_bias", True):
        feeds["b"] = _normal(rng, (sum(sizes),))
        specs.append(("b", F, (sum(sizes),)))
    else:
        specs.append(None)
    masks = {
        "1d": np.array([total - 2, total][:batch], np.int32),
        "2b": np.array([total - 1, total, 1, 0][: 2 * batch] if batch == 2 else [total - 1, 1], np.int32),
        "2d": (rng.random((batch, total)) > 0.3).astype(np.int32),
        "3d": (rng.random((batch, sq, total)) > 0.3).astype(np.int32),
        "dead": np.array([[0] * total, [1] * total][:batch], np.int32),
    }
    if case["mask"] is not None:
        feeds["m"] = masks[case["mask"]]
        specs.append(("m", I32, feeds["m"].shape))
    else:
        specs.append(None)
    if past:
        head = sizes[0] // heads
        feeds["p"] = _normal(rng, (2, batch, heads, past, head))
        specs.append(("p", F, feeds["p"].shape))
    else:
        specs.append(None)
    if "bias_heads" in case:
        feeds["ab"] = _normal(rng, (batch, case["bias_heads"], sq, total))
        specs.append(("ab", F, feeds["ab"].shape))
    attrs: dict[str, Any] = {"num_heads": heads, **case.get("attrs", {})}
    if "sizes" in case:
        attrs["qkv_hidden_sizes"] = list(sizes)
    outputs = ["y", "present"] if past else ["y"]
    return feeds, specs, attrs, outputs


@pytest.mark.parametrize("name", sorted(ATTENTION_CASES))
def test_attention_matches_onnxruntime(backend_name: str, name: str) -> None:
    case = ATTENTION_CASES[name]
    feeds, specs, attrs, outputs = _attention_feeds(case, 2, 5, 6, 3)
    _check(backend_name, _model("Attention", specs, outputs, **attrs), feeds)


def test_attention_one_token(backend_name: str) -> None:
    """One query (the GEMV projection), a past in front; unidirectional means nothing for one query."""
    case = dict(mask="1d", past=3, attrs={"unidirectional": 1})
    feeds, specs, attrs, outputs = _attention_feeds(case, 2, 1, 8, 2, seed=3)
    _check(backend_name, _model("Attention", specs, outputs, **attrs), feeds)


def test_attention_float16(backend_name: str) -> None:
    case = dict(mask="2d", bias_heads=1, attrs={"unidirectional": 1})
    feeds, specs, attrs, outputs = _attention_feeds(case, 2, 4, 8, 2, seed=5)
    halves = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    specs16 = [None if s is None else (s[0], H16 if s[1] == F else s[1], s[2]) for s in specs]
    model = _model("Attention", specs16, outputs, **attrs)
    wide = {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in halves.items()}
    expected = _onnxruntime(_as_float32(model), wide)
    got = _check(backend_name, model, halves, expected, tolerance=2e-2)
    assert got[0].dtype == np.float16


@pytest.mark.parametrize(
    ("attrs", "mask_shape", "error", "match"),
    [
        ({"do_rotary": 1}, None, UnsupportedOpError, "do_rotary"),
        ({}, (2, 1, 5, 5), UnsupportedOpError, "4-D mask"),
        ({}, (3,), SHAPE_ERRORS, "mask of shape"),
        ({"qkv_hidden_sizes": [6, 4, 8]}, None, SHAPE_ERRORS, "qkv_hidden_sizes"),
    ],
)
def test_attention_refusals(
    backend_name: str, attrs: dict[str, Any], mask_shape: tuple[int, ...] | None, error: Any, match: str
) -> None:
    rng = _rng()
    feeds = {"x": _normal(rng, (2, 5, 6)), "w": _normal(rng, (6, 18))}
    specs: list[Any] = [("x", F, (2, 5, 6)), ("w", F, (6, 18)), None]
    if mask_shape is not None:
        feeds["m"] = np.ones(mask_shape, np.int32)
        specs.append(("m", I32, mask_shape))
    model = _model("Attention", specs, ["y"], num_heads=3, **attrs)
    with pytest.raises(error, match=match):
        run_model(model, feeds, _device(backend_name))


def test_attention_bad_heads(backend_name: str) -> None:
    rng = _rng()
    model = _model("Attention", [("x", F, (1, 2, 6)), ("w", F, (6, 18))], ["y"], num_heads=4)
    with pytest.raises(SHAPE_ERRORS, match="num_heads 4 must divide"):
        run_model(model, {"x": _normal(rng, (1, 2, 6)), "w": _normal(rng, (6, 18))}, _device(backend_name))


# -- MultiHeadAttention ----------------------------------------------------------------------------------------------

B, S, L, N, HD, P = 2, 3, 4, 2, 4, 2


def _mha_case(bias: bool, mask: str | None, attention_bias: bool, past: bool, causal: bool, seed: int = 0) -> tuple:
    rng = _rng(seed)
    d, total = N * HD, L + (P if past else 0)
    feeds = {"q": _normal(rng, (B, S, d)), "k": _normal(rng, (B, L, d)), "v": _normal(rng, (B, L, d))}
    specs: list[Any] = [("q", F, (B, S, d)), ("k", F, (B, L, d)), ("v", F, (B, L, d))]
    if bias:
        feeds["b"] = _normal(rng, (3 * d,))
    masks = {
        "1d": np.array([total - 1, 2], np.int32),
        "2d": (rng.random((B, total)) > 0.3).astype(np.int32),
        "3d": (rng.random((B, S, total)) > 0.3).astype(np.int32),
    }
    if mask is not None:
        feeds["m"] = masks[mask]
        if mask != "1d":
            # a row whose every key is masked is a softmax over scores near -10000, which onnxruntime rounds in
            # float32 (the references compute wider): keep key 0, so that only the ATTENTION_CASES' dead row has one
            feeds["m"][..., 0] = 1
    if attention_bias:
        feeds["ab"] = _normal(rng, (1, N, S, total))
    if past:
        feeds["pk"], feeds["pv"] = _normal(rng, (B, N, P, HD)), _normal(rng, (B, N, P, HD))
    for name, type_ in (("b", F), ("m", I32), ("ab", F), ("pk", F), ("pv", F)):
        specs.append((name, type_, feeds[name].shape) if name in feeds else None)
    outputs = ["y", "present_key", "present_value"] if past else ["y"]
    return feeds, specs, outputs, {"num_heads": N, "unidirectional": int(causal)}


@pytest.mark.parametrize(
    ("bias", "mask", "attention_bias", "past", "causal"),
    [
        (False, None, False, False, False),
        (True, None, False, False, True),
        (True, "1d", False, False, False),
        (False, "2d", True, False, True),
        (True, "3d", False, True, True),
        (True, "2d", True, True, True),
        (False, None, True, True, False),
    ],
)
def test_multi_head_attention_matches_onnxruntime(
    backend_name: str, bias: bool, mask: str | None, attention_bias: bool, past: bool, causal: bool
) -> None:
    feeds, specs, outputs, attrs = _mha_case(bias, mask, attention_bias, past, causal)
    _check(backend_name, _model("MultiHeadAttention", specs, outputs, **attrs), feeds)


def test_multi_head_attention_every_combination_fake() -> None:
    """Every mix of bias, mask form, attention bias, past and causality on the fake backend (the twins)."""
    for bias, mask, attention_bias, past, causal in itertools.product(
        [False, True], [None, "1d", "2d", "3d"], [False, True], [False, True], [False, True]
    ):
        feeds, specs, outputs, attrs = _mha_case(bias, mask, attention_bias, past, causal, seed=7)
        _check("fake", _model("MultiHeadAttention", specs, outputs, **attrs), feeds)


def _unpacked_expected(feeds: dict[str, np.ndarray], with_bias: bool) -> list[np.ndarray]:
    d = N * HD
    specs: list[Any] = [("q", F, (B, S, d)), ("k", F, feeds["k"].shape), ("v", F, feeds["v"].shape)]
    if with_bias:
        specs.append(("b", F, (3 * d,)))
    return _onnxruntime(_model("MultiHeadAttention", specs, ["y"], num_heads=N), feeds)


def test_multi_head_attention_packed_qkv(backend_name: str) -> None:
    """query [B, S, N, 3, H] means the unpacked Q, K, V (onnxruntime's CPU refuses the packed form)."""
    rng = _rng(11)
    packed = _normal(rng, (B, S, N, 3, HD))
    bias = _normal(rng, (3 * N * HD,))
    unpacked = {name: packed[:, :, :, i].reshape(B, S, N * HD) for i, name in enumerate("qkv")}
    expected = _unpacked_expected({**unpacked, "b": bias}, True)
    model = _model("MultiHeadAttention", [("q", F, packed.shape), None, None, ("b", F, bias.shape)], ["y"], num_heads=N)
    _check(backend_name, model, {"q": packed, "b": bias}, expected)


def test_multi_head_attention_packed_kv_and_bnsh(backend_name: str) -> None:
    rng = _rng(12)
    q = _normal(rng, (B, S, N * HD))
    packed = _normal(rng, (B, L, N, 2, HD))
    unpacked = {"q": q, "k": packed[:, :, :, 0].reshape(B, L, -1), "v": packed[:, :, :, 1].reshape(B, L, -1)}
    expected = _unpacked_expected(unpacked, False)
    model = _model("MultiHeadAttention", [("q", F, q.shape), ("k", F, packed.shape)], ["y"], num_heads=N)
    _check(backend_name, model, {"q": q, "k": packed}, expected)
    # key/value already split into heads, [B, N, L, H]: onnxruntime reads them as they are
    heads_first = {name: unpacked[name].reshape(B, L, N, HD).transpose(0, 2, 1, 3).copy() for name in "kv"}
    specs = [("q", F, q.shape), ("k", F, heads_first["k"].shape), ("v", F, heads_first["v"].shape)]
    model = _model("MultiHeadAttention", specs, ["y"], num_heads=N)
    _check(backend_name, model, {"q": q, **heads_first})


def test_multi_head_attention_float16(backend_name: str) -> None:
    feeds, specs, outputs, attrs = _mha_case(True, "2d", True, True, True, seed=4)
    halves = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    specs16 = [None if s is None else (s[0], H16 if s[1] == F else s[1], s[2]) for s in specs]
    wide = {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in halves.items()}
    expected = _onnxruntime(_model("MultiHeadAttention", specs, outputs, **attrs), wide)
    _check(backend_name, _model("MultiHeadAttention", specs16, outputs, **attrs), halves, expected, tolerance=2e-2)


def test_multi_head_attention_refusals(backend_name: str) -> None:
    feeds, specs, _, attrs = _mha_case(False, None, False, False, False)
    model = _model("MultiHeadAttention", specs, ["y", "", "", "qk"], **attrs)
    with pytest.raises(UnsupportedOpError, match="qk output"):
        run_model(model, feeds, _device(backend_name))
    bad = _model(
        "MultiHeadAttention", [("q", F, (B, S, 7)), ("k", F, (B, L, 7)), ("v", F, (B, L, 7))], ["y"], num_heads=2
    )
    with pytest.raises(SHAPE_ERRORS, match="MultiHeadAttention"):
        run_model(
            bad,
            {n: np.zeros(s, np.float32) for n, s in (("q", (B, S, 7)), ("k", (B, L, 7)), ("v", (B, L, 7)))},
            _device(backend_name),
        )


# -- RotaryEmbedding -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x_shape", "positions", "cache", "attrs"),
    [
        ((2, 3, 16), (2, 3), (10, 4), {}),
        ((2, 3, 16), (1,), (10, 4), {"interleaved": 1}),
        ((2, 2, 3, 8), (), (10, 4), {}),
        ((2, 3, 16), (2, 3), (10, 2), {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1}),
        ((1, 5, 12), (1, 5), (9, 3), {"num_heads": 2, "scale": 2.0}),
    ],
)
def test_rotary_embedding_matches_onnxruntime(
    backend_name: str, x_shape: tuple[int, ...], positions: tuple[int, ...], cache: tuple[int, int], attrs: dict
) -> None:
    rng = _rng(2)
    feeds = {
        "x": _normal(rng, x_shape),
        "p": rng.integers(0, 5, positions).astype(np.int64),
        "c": rng.uniform(-1, 1, cache).astype(np.float32),
        "s": rng.uniform(-1, 1, cache).astype(np.float32),
    }
    specs = [("x", F, x_shape), ("p", I64, positions), ("c", F, cache), ("s", F, cache)]
    _check(backend_name, _model("RotaryEmbedding", specs, ["y"], **attrs), feeds)


def test_rotary_embedding_float16_and_errors(backend_name: str) -> None:
    rng = _rng(3)
    feeds = {
        "x": _normal(rng, (2, 3, 16)).astype(np.float16),
        "p": np.array([1], np.int64),
        "c": rng.uniform(-1, 1, (8, 4)).astype(np.float16),
        "s": rng.uniform(-1, 1, (8, 4)).astype(np.float16),
    }
    specs = [("x", H16, (2, 3, 16)), ("p", I64, (1,)), ("c", H16, (8, 4)), ("s", H16, (8, 4))]
    model = _model("RotaryEmbedding", specs, ["y"])
    wide = {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in feeds.items()}
    _check(backend_name, model, feeds, _onnxruntime(_as_float32(model), wide), tolerance=5e-3)
    bad = _model(
        "RotaryEmbedding", [("x", F, (2, 3, 16)), ("p", I64, (3, 2)), ("c", F, (8, 4)), ("s", F, (8, 4))], ["y"]
    )
    wrong = {"x": np.zeros((2, 3, 16), np.float32), "p": np.zeros((3, 2), np.int64)}
    wrong |= {"c": np.zeros((8, 4), np.float32), "s": np.zeros((8, 4), np.float32)}
    with pytest.raises(SHAPE_ERRORS, match="position_ids"):
        run_model(bad, wrong, _device(backend_name))
    packed = _model("RotaryEmbedding", specs, ["y"], is_packed_batching=1)
    with pytest.raises(UnsupportedOpError, match="is_packed_batching"):
        run_model(packed, feeds, _device(backend_name))


# -- GroupQueryAttention ---------------------------------------------------------------------------------------------

GB, GS, GN, GKV, GH = 2, 4, 4, 2, 16


def _gqa(
    seqlens: list[int],
    past: int = 0,
    packed: bool = False,
    rotary: bool = False,
    dtype: int = F,
    seed: int = 0,
    queries: int | None = None,
    total: int | None = None,
    batch: int = GB,
    **attrs: Any,
) -> tuple[bytes, dict[str, np.ndarray]]:
    """A node with ``queries`` new tokens (default: 1 with a past, else GS) after a past buffer of ``past``
    positions; ``total``: total_sequence_length (default past + queries; less with a static cache longer than what
    it holds)."""
    rng = _rng(seed)
    sq = queries if queries is not None else (1 if past else GS)
    numpy_type = np.float16 if dtype == H16 else np.float32
    feeds: dict[str, np.ndarray] = {}
    specs: list[Any] = []

    def add(name: str, value: np.ndarray, type_: int) -> None:
        feeds[name] = value
        specs.append((name, type_, value.shape))

    if packed:
        add("q", _normal(rng, (batch, sq, (GN + 2 * GKV) * GH)).astype(numpy_type), dtype)
        specs += [None, None]
    else:
        add("q", _normal(rng, (batch, sq, GN * GH)).astype(numpy_type), dtype)
        add("k", _normal(rng, (batch, sq, GKV * GH)).astype(numpy_type), dtype)
        add("v", _normal(rng, (batch, sq, GKV * GH)).astype(numpy_type), dtype)
    if past:
        add("pk", _normal(rng, (batch, GKV, past, GH)).astype(numpy_type), dtype)
        add("pv", _normal(rng, (batch, GKV, past, GH)).astype(numpy_type), dtype)
    else:
        specs += [None, None]
    add("seqlens", np.array(seqlens, np.int32), I32)
    add("total", np.array([total if total is not None else past + sq], np.int32), I32)
    if rotary:
        add("cos", rng.uniform(-1, 1, (16, GH // 2)).astype(numpy_type), dtype)
        add("sin", rng.uniform(-1, 1, (16, GH // 2)).astype(numpy_type), dtype)
    model = _model(
        "GroupQueryAttention",
        specs,
        ["y", "present_key", "present_value"],
        num_heads=GN,
        kv_num_heads=GKV,
        do_rotary=int(rotary),
        **attrs,
    )
    return model, feeds


GQA_CASES = {
    "prefill": dict(seqlens=[3, 3]),
    "padded_batch": dict(seqlens=[3, 1]),
    "window": dict(seqlens=[3, 3], local_window_size=2),
    "rotary": dict(seqlens=[3, 2], rotary=True),
    "rotary_interleaved": dict(seqlens=[3, 3], rotary=True, rotary_interleaved=1),
    "softcap_scale": dict(seqlens=[3, 3], softcap=2.0, scale=0.2),
    "packed": dict(seqlens=[3, 3], packed=True, rotary=True),
    # a first prompt into a static cache of 8 positions (past buffers given, none of their rows used)
    "static_cache": dict(seqlens=[3, 2], past=8, queries=GS, total=GS, rotary=True),
}


@pytest.mark.parametrize("name", sorted(GQA_CASES))
def test_group_query_attention_prefill(backend_name: str, name: str) -> None:
    model, feeds = _gqa(**GQA_CASES[name])
    expected = _onnxruntime(model, feeds)
    if name == "padded_batch":
        # rows past a batch's length: onnxruntime softmaxes scores it never computed; compare the real rows
        got, _ = run_model(model, feeds, _device(backend_name), allow_cpu=False)
        np.testing.assert_allclose(got[0][1, :2], expected[0][1, :2], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[0][0], expected[0][0], rtol=1e-4, atol=1e-5)
        for mine, theirs in zip(got[1:], expected[1:]):
            np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
        return
    _check(backend_name, model, feeds, expected)


GQA_DECODE_CASES = {
    # batch 0 has 4 cached positions, batch 1 two (its past buffer's last two rows are not its own)
    "step": dict(seqlens=[4, 2], past=4, rotary=True, seed=5),
    "window": dict(seqlens=[4, 3], past=4, local_window_size=2, seed=7),
    "packed_softcap": dict(seqlens=[4, 1], past=4, packed=True, rotary=True, softcap=2.0, seed=8),
    # two new tokens per step (onnxruntime takes that for one batch only)
    "two_tokens": dict(seqlens=[5], past=4, queries=2, rotary=True, seed=9, batch=1),
    # a static cache of 8 positions holding fewer (onnxruntime-genai's shared past/present buffers)
    "static_cache": dict(seqlens=[5, 2], past=8, total=6, rotary=True, seed=10),
}


@pytest.mark.parametrize("name", sorted(GQA_DECODE_CASES))
def test_group_query_attention_decoding(backend_name: str, name: str) -> None:
    """A step with a past: each batch's new keys land in the present at run-time positions (seqlens_k), on the
    device."""
    case = GQA_DECODE_CASES[name]
    model, feeds = _gqa(**case)
    got = _check(backend_name, model, feeds)
    present = max(int(feeds["total"][0]), int(case["past"]))
    assert got[1].shape == got[2].shape == (len(case["seqlens"]), GKV, present, GH)


def test_group_query_attention_decoding_lengths_change_between_runs(backend_name: str) -> None:
    """One plan, several steps: the positions come from seqlens_k at run time."""
    device = _device(backend_name)
    model, feeds = _gqa([4, 2], past=8, total=5, rotary=True, seed=11)
    for seqlens in ([4, 2], [1, 4], [4, 4]):
        feeds["seqlens"] = np.array(seqlens, np.int32)
        expected = _onnxruntime(model, feeds)
        got, _ = run_model(model, feeds, device, allow_cpu=False)
        for mine, theirs in zip(got, expected):
            np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seqlens", [[9, 2], [4, -1]], ids=["past-the-cache", "negative"])
def test_group_query_attention_decoding_refuses_lengths_that_do_not_fit(seqlens: list[int], env: Any) -> None:
    """seqlens_k is read on the device: a length past the present, or below the new tokens, makes that run raise
    (as onnxruntime refuses it), and the session runs on."""
    model, feeds = _gqa([4, 2], past=4, rotary=True, seed=12)
    with ortgpu.InferenceSession(model, env=env) as session:
        first = session.run(None, feeds)
        placements = session.get_node_placement({k: v.shape for k, v in feeds.items()}, feeds)
        assert {p.placement for p in placements} == {"webgpu"}
        with pytest.raises(InvalidArgumentError, match="must hold the new tokens and fit the present cache"):
            session.run(None, {**feeds, "seqlens": np.array(seqlens, np.int32)})
        for before, after in zip(first, session.run(None, feeds)):
            np.testing.assert_array_equal(np.asarray(before), np.asarray(after))


@pytest.mark.parametrize("past", [0, 4], ids=["prefill", "decoding"])
def test_group_query_attention_float16(backend_name: str, past: int) -> None:
    seqlens = [4, 2] if past else [3, 3]
    model, feeds = _gqa(seqlens, past=past, rotary=True, dtype=H16, seed=6, local_window_size=3)
    wide = {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in feeds.items()}
    expected = _onnxruntime(_as_float32(model), wide)
    _check(backend_name, model, feeds, expected, tolerance=2e-2)


def test_group_query_attention_refusals(backend_name: str) -> None:
    model, feeds = _gqa([3, 3], smooth_softmax=1)
    with pytest.raises(UnsupportedOpError, match="smooth_softmax"):
        run_model(model, feeds, _device(backend_name))
    model, feeds = _gqa([3, 3])
    proto = onnx.load_from_string(model)
    for attribute in proto.graph.node[0].attribute:
        if attribute.name == "kv_num_heads":
            attribute.i = 3
    with pytest.raises(SHAPE_ERRORS, match="kv_num_heads"):
        run_model(proto.SerializeToString(), feeds, _device(backend_name))
