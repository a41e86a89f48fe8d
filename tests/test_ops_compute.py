"""Compute-heavy operators: reference vs onnxruntime CPU, and plans on the fake and wgpu devices vs reference.

Device pipelines are slow to create on lavapipe, so each device case is chosen to hit a distinct kernel path
(tiled / GEMV, vectorised or not, broadcast epilogues, padding modes) rather than to sweep shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from ortgpu.ops import DeviceCaps, NotOnDevice, TensorInfo, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu_core._errors import UnsupportedOpError

RNG = np.random.default_rng(20261129)
DTYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.bool_): TensorProto.BOOL,
}


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# -- onnxruntime ----------------------------------------------------------------------------------------------------


def ort_run(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any],
    opset: int,
    n_outputs: int = 1,
    epilogue: Sequence[tuple[Any, ...]] = (),
    own_inputs: int | None = None,
) -> list[np.ndarray]:
    """Run one node (followed by the unfused equivalent of ``epilogue``) on onnxruntime CPU."""
    own = len(inputs) if own_inputs is None else own_inputs
    graph_inputs, feeds, names = [], {}, []
    for index, array in enumerate(inputs):
        if array is None:
            names.append("")
            continue
        name = f"x{index}"
        names.append(name)
        graph_inputs.append(helper.make_tensor_value_info(name, DTYPES[array.dtype], list(array.shape)))
        feeds[name] = array
    while names and names[-1] == "":
        names.pop()
    outs = [f"y{i}" for i in range(n_outputs)]
    nodes = [helper.make_node(op_type, names[:own], ["t0"] + outs[1:], **attrs)]
    current = "t0"
    for step_number, step in enumerate(epilogue):
        nxt = f"t{step_number + 1}"
        if step[0] == "add":
            nodes.append(helper.make_node("Add", [current, names[step[1]]], [nxt]))
        elif step[0] == "relu":
            nodes.append(helper.make_node("Relu", [current], [nxt]))
        elif step[0] == "scale":
            factor = helper.make_tensor(f"c{step_number}", TensorProto.FLOAT, [], [step[1]])
            nodes.append(helper.make_node("Constant", [], [f"c{step_number}"], value=factor))
            nodes.append(helper.make_node("Mul", [current, f"c{step_number}"], [nxt]))
        elif step[0] == "sigmoid":
            nodes.append(helper.make_node("Sigmoid", [current], [nxt]))
        elif step[0] == "clip":
            lo = helper.make_tensor(f"lo{step_number}", TensorProto.FLOAT, [], [step[1]])
            hi = helper.make_tensor(f"hi{step_number}", TensorProto.FLOAT, [], [step[2]])
            nodes.append(helper.make_node("Constant", [], [f"lo{step_number}"], value=lo))
            nodes.append(helper.make_node("Constant", [], [f"hi{step_number}"], value=hi))
            nodes.append(helper.make_node("Clip", [current, f"lo{step_number}", f"hi{step_number}"], [nxt]))
        elif step[0] == "gelu":
            s = f"g{step_number}"
            c = helper.make_tensor(s + "c", TensorProto.FLOAT, [], [1 / np.sqrt(2)])
            half = helper.make_tensor(s + "h", TensorProto.FLOAT, [], [0.5])
            one = helper.make_tensor(s + "o", TensorProto.FLOAT, [], [1.0])
            nodes += [
                helper.make_node("Constant", [], [s + "c"], value=c),
                helper.make_node("Constant", [], [s + "h"], value=half),
                helper.make_node("Constant", [], [s + "o"], value=one),
                helper.make_node("Mul", [current, s + "c"], [s + "1"]),
                helper.make_node("Erf", [s + "1"], [s + "2"]),
                helper.make_node("Add", [s + "2", s + "o"], [s + "3"]),
                helper.make_node("Mul", [s + "3", s + "h"], [s + "4"]),
                helper.make_node("Mul", [s + "4", current], [nxt]),
            ]
        current = nxt
    nodes.append(helper.make_node("Identity", [current], ["y0"]))
    graph_outputs = [helper.make_empty_tensor_value_info(o) for o in outs]
    graph = helper.make_graph(nodes, "g", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in session.run(outs, feeds)]


def assert_close(got: np.ndarray, want: np.ndarray, tolerance: float = 1e-4) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
        return
    if want.size == 0:
        return
    both_nan = np.isnan(got) & np.isnan(want)
    assert not np.any(np.isnan(got) != np.isnan(want)), "NaN positions differ"
    g, w = np.where(both_nan, 0, got).astype(np.float64), np.where(both_nan, 0, want).astype(np.float64)
    error = float(np.linalg.norm(g - w)) / max(float(np.linalg.norm(w)), 1e-30)
    assert error < tolerance, f"relative error {error}"


def reference(op_type: str, opset: int, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return get_operator(op_type, opset).reference(inputs, attrs, [])


def check_reference(
    op_type: str,
    opset: int,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any],
    n_outputs: int = 1,
    epilogue: Sequence[tuple[Any, ...]] = (),
    own_inputs: int | None = None,
) -> list[np.ndarray]:
    fused = dict(attrs, _epilogue=tuple(epilogue)) if epilogue else attrs
    dummy = [TensorInfo((), np.dtype(np.float32))] * n_outputs
    ours = get_operator(op_type, opset).reference(inputs, fused, dummy)
    theirs = ort_run(op_type, inputs, attrs, opset, n_outputs, epilogue, own_inputs)
    assert len(ours) >= n_outputs
    for got, want in zip(ours, theirs):
        assert_close(got, want)
    return ours


# -- devices ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def backend_name(request: pytest.FixtureRequest) -> str:
    """Module-scoped (one device per backend for the module); named as conftest's, so --backend selects it."""
    return str(request.param)


@pytest.fixture(scope="module")
def device(backend_name: str) -> Iterator[Any]:
    dev: Any
    if backend_name == "fake":
        from ortgpu_core.backends.fake import FakeBackend

        dev = FakeBackend().open_device(0)
    else:
        from ortgpu_core.backends.wgpu_native import WgpuBackend

        backend = WgpuBackend()  # no adapter is a failure, not a skip: CI has lavapipe
        dev = backend.open_device(backend.default_adapter_index())
    yield dev
    dev.destroy()


def check_device(
    device: Any,
    op_type: str,
    opset: int,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any],
    constants: dict[int, np.ndarray] | None = None,
) -> None:
    """Plan the node for ``device`` and compare every output with the reference."""
    operator = get_operator(op_type, opset)
    want = operator.reference(inputs, attrs, [])
    outputs = [TensorInfo(tuple(w.shape), w.dtype) for w in want]
    infos = [None if a is None else TensorInfo(tuple(a.shape), a.dtype) for a in inputs]
    caps = DeviceCaps(frozenset(device.features), device.limits)
    plan = operator.plan(infos, outputs, attrs, caps, constants or {})
    before = device.live_handles()
    got = run_plan(device, plan, inputs, outputs)
    assert device.live_handles() == before
    for g, w in zip(got, want):
        assert_close(g, w)


# -- MatMul, Gemm -----------------------------------------------------------------------------------------------------

MATMUL_CASES = [
    ((5, 7), (7, 3)),
    ((70, 33), (33, 130)),
    ((1, 100), (100, 64)),
    ((100,), (100, 63)),
    ((2, 1, 5, 7), (3, 7, 9)),
    ((7,), (2, 7, 9)),
    ((7,), (7,)),
    ((2, 3, 6, 4), (4,)),
    ((3, 1, 16), (16, 8)),
]


@pytest.mark.parametrize("a_shape,b_shape", MATMUL_CASES)
def test_matmul_reference(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    check_reference("MatMul", 13, [rand(*a_shape), rand(*b_shape)], {})


EPILOGUES: list[tuple[tuple[Any, ...], ...]] = [
    (("add", 2), ("relu",)),
    (("add", 2), ("gelu",)),
    (("sigmoid",), ("add", 3)),
    (("clip", -0.5, 0.25),),
    (("scale", 0.125), ("add", 2), ("gelu",)),
]


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_matmul_epilogue_reference(epilogue: tuple[tuple[Any, ...], ...]) -> None:
    a, b = rand(4, 6, 10), rand(10, 12)
    check_reference("MatMul", 13, [a, b, rand(12), rand(4, 1, 12)], {}, epilogue=epilogue, own_inputs=2)


MATMUL_DEVICE_CASES: list[tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[Any, ...], ...]]] = [
    ((70, 33), (33, 130), ()),  # tiled, partial tiles
    ((3, 4, 20), (20, 24), (("add", 2), ("relu",))),  # batch folds into M
    ((2, 1, 5, 7), (3, 7, 9), (("add", 3), ("clip", -0.5, 0.5))),  # broadcast batch
    ((1, 100), (100, 64), (("add", 2), ("gelu",))),  # GEMV, vec4
    ((2, 3, 8, 12), (2, 3, 12, 8), (("scale", -0.35),)),  # batched, the attention scale
    ((100,), (100, 63), (("sigmoid",),)),  # GEMV, scalar
    ((7,), (7,), ()),
]


@pytest.mark.parametrize("a_shape,b_shape,epilogue", MATMUL_DEVICE_CASES)
def test_matmul_device(
    device: Any, a_shape: tuple[int, ...], b_shape: tuple[int, ...], epilogue: tuple[tuple[Any, ...], ...]
) -> None:
    from ortgpu.ops.ai_onnx.matmul import matmul_output_shape

    out = matmul_output_shape(a_shape, b_shape)
    extras = [rand(*out[-1:]), rand(*out[:-2], 1, out[-1]) if len(out) >= 2 else rand(1)]
    attrs = {"_epilogue": epilogue} if epilogue else {}
    check_device(device, "MatMul", 13, [rand(*a_shape), rand(*b_shape), *extras], attrs)


def test_matmul_epilogue_rejects_bad_index() -> None:
    with pytest.raises(UnsupportedOpError):
        reference("MatMul", 13, [rand(2, 3), rand(3, 4), rand(4)], {"_epilogue": (("add", 1),)})
    with pytest.raises(UnsupportedOpError):
        reference("MatMul", 13, [rand(2, 3), rand(3, 4), rand(5)], {"_epilogue": (("add", 2),)})


def test_matmul_float64_stays_on_cpu(device: Any) -> None:
    a = RNG.standard_normal((2, 3))
    info = TensorInfo((2, 3), a.dtype)
    caps = DeviceCaps(frozenset(device.features), device.limits)
    with pytest.raises(NotOnDevice, match="float32"):
        get_operator("MatMul", 13).plan(
            [info, TensorInfo((3, 2), a.dtype)], [TensorInfo((2, 2), a.dtype)], {}, caps, {}
        )


GEMM_CASES: list[tuple[tuple[int, int], tuple[int, int], tuple[int, ...] | None, dict[str, Any]]] = [
    ((5, 7), (7, 3), (3,), {}),
    ((7, 5), (7, 3), (5, 1), {"transA": 1, "alpha": 0.5, "beta": 2.0}),
    ((5, 7), (3, 7), (5, 3), {"transB": 1}),
    ((1, 64), (32, 64), (32,), {"transB": 1}),
    ((1, 30), (30, 17), None, {"alpha": -1.5}),
    ((1, 30), (17, 30), (1,), {"transB": 1, "beta": 0.0}),
]


@pytest.mark.parametrize("a_shape,b_shape,c_shape,attrs", GEMM_CASES)
def test_gemm_reference(
    a_shape: tuple[int, int], b_shape: tuple[int, int], c_shape: tuple[int, ...] | None, attrs: dict[str, Any]
) -> None:
    c = None if c_shape is None else rand(*c_shape)
    check_reference("Gemm", 13, [rand(*a_shape), rand(*b_shape), c], attrs)


@pytest.mark.parametrize("a_shape,b_shape,c_shape,attrs", GEMM_CASES)
def test_gemm_device(
    device: Any,
    a_shape: tuple[int, int],
    b_shape: tuple[int, int],
    c_shape: tuple[int, ...] | None,
    attrs: dict[str, Any],
) -> None:
    c = None if c_shape is None else rand(*c_shape)
    check_device(device, "Gemm", 13, [rand(*a_shape), rand(*b_shape), c], attrs)


def test_gemm_epilogue(device: Any) -> None:
    a, b, bias = rand(1, 48), rand(40, 48), rand(40)
    inputs = [a, b, None, bias]
    epilogue = (("add", 3), ("gelu",))
    check_reference("Gemm", 13, inputs, {"transB": 1}, epilogue=epilogue, own_inputs=3)
    check_device(device, "Gemm", 13, inputs, {"transB": 1, "_epilogue": epilogue})
    inputs = [rand(9, 12), rand(12, 10), rand(10), rand(9, 10)]
    epilogue = (("add", 3), ("relu",))
    check_reference("Gemm", 13, inputs, {"alpha": 2.0}, epilogue=epilogue, own_inputs=3)
    check_device(device, "Gemm", 13, inputs, {"alpha": 2.0, "_epilogue": epilogue})


# -- GEMM variants (tile shapes, pipelining, split-K) -------------------------------------------------------------


def _gemm_variants() -> list[Any]:
    from ortgpu.ops._gemm import LEGACY, GemmConfig

    return [
        LEGACY,
        GemmConfig(32, 32, 8, 4, 4, stages=1, split_k=3),
        GemmConfig(64, 32, 16, 8, 4, stages=2, split_k=2),
        GemmConfig(32, 64, 32, 4, 8, stages=2),
        GemmConfig(64, 64, 16, 8, 8, stages=1, split_k=5),
    ]


# (op, opset, input shapes, attrs): each hits other load paths of the tiled kernel (vec4 along k / m / n, scalar).
GEMM_VARIANT_CASES: list[tuple[str, int, list[tuple[int, ...] | None], dict[str, Any], int]] = [
    # MatMul: A vec4 along k, B vec4 along n, bias + residual epilogue, partial tiles, 3 K tiles at TK=16
    ("MatMul", 13, [(2, 35, 44), (44, 68), (68,), (2, 35, 68)], {"_epilogue": (("add", 2), ("add", 3))}, 2),
    # batched, broadcast batch, scalar loads (K, N odd)
    ("MatMul", 13, [(2, 1, 9, 37), (3, 37, 21)], {}, 2),
    # Gemm transA/transB: A vec4 along m, B vec4 along k; alpha, beta * C
    ("Gemm", 13, [(40, 20), (36, 40), (36,)], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, 3),
    # implicit-GEMM Conv: weights vec4 along k, im2col scalar, residual + relu
    (
        "Conv",
        11,
        [(1, 12, 9, 9), (16, 12, 3, 3), (16,), (1, 16, 9, 9)],
        {"pads": [1, 1, 1, 1], "_epilogue": (("add", 3), ("relu",))},
        3,
    ),
    # pointwise grouped Conv: input vec4 along n
    ("Conv", 11, [(2, 64, 6, 6), (32, 32, 1, 1), (32,)], {"group": 2}, 3),
]


# MatMul reading folded transposes (``_input_perms``): input shapes are the sources, before the transpose.
FOLDED_CASES: list[tuple[list[tuple[int, ...]], dict[str, Any]]] = [
    # attention scores: Q [B,S,H,D] -> [B,H,S,D], K -> [B,H,D,S]; A vec4 along k, B vec4 along k; scale epilogue
    ([(2, 20, 3, 96), (2, 20, 3, 96)], {"_input_perms": ((0, 2, 1, 3), (0, 2, 3, 1)), "_epilogue": (("scale", 0.5),)}),
    # attention values: V [B,S,H,D] -> [B,H,S,D] (B vec4 along n), probs plain
    ([(2, 3, 20, 96), (2, 96, 3, 12)], {"_input_perms": (None, (0, 2, 1, 3))}),
    # a transposed weight under batched activations (A's batch folds into its rows), bias epilogue; odd N: scalar B
    ([(2, 9, 96), (13, 96), (13,)], {"_input_perms": (None, (1, 0)), "_epilogue": (("add", 2),)}),
]


@pytest.mark.parametrize("variant", range(5))
@pytest.mark.parametrize("case", range(len(FOLDED_CASES)))
def test_gemm_variants_read_folded_transposes(
    device: Any, variant: int, case: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kernel variant, split-K included, reads operands through folded transposes as numpy.transpose would."""
    from ortgpu.ops import _gemm

    config = _gemm_variants()[variant]
    monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", config)
    shapes, attrs = FOLDED_CASES[case]
    inputs = [rand(*shape) for shape in shapes]
    operator = get_operator("MatMul", 13)
    a_perm, b_perm = attrs["_input_perms"]
    a = np.transpose(inputs[0], a_perm) if a_perm else inputs[0]
    b = np.transpose(inputs[1], b_perm) if b_perm else inputs[1]
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    for step in attrs.get("_epilogue", ()):
        want = want * step[1] if step[0] == "scale" else want + inputs[step[1]]
    outputs = [TensorInfo(want.shape, np.dtype(np.float32))]
    caps = DeviceCaps(frozenset(device.features), device.limits)
    plan = operator.plan([TensorInfo(x.shape, x.dtype) for x in inputs], outputs, attrs, caps, {})
    assert len(plan.kernels) == (2 if config.split_k > 1 else 1)  # K = 96: every variant's split applies
    got = run_plan(device, plan, inputs, outputs)
    assert_close(got[0], want.astype(np.float32))
    np.testing.assert_allclose(operator.reference(inputs, attrs, outputs)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", range(5))
@pytest.mark.parametrize("op,opset,shapes,attrs,own", GEMM_VARIANT_CASES)
def test_gemm_variants_match_onnxruntime(
    device: Any,
    variant: int,
    op: str,
    opset: int,
    shapes: list[tuple[int, ...] | None],
    attrs: dict[str, Any],
    own: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every kernel variant (forced through GEMM_OVERRIDE) computes what onnxruntime computes."""
    from ortgpu.ops import _gemm

    config = _gemm_variants()[variant]
    monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", config)
    inputs = [None if s is None else rand(*s) for s in shapes]
    operator = get_operator(op, opset)
    outputs = [TensorInfo(tuple(w.shape), w.dtype) for w in operator.reference(inputs, attrs, [])]
    infos = [None if a is None else TensorInfo(tuple(a.shape), a.dtype) for a in inputs]
    caps = DeviceCaps(frozenset(device.features), device.limits)
    plan = operator.plan(infos, outputs, attrs, caps, {})
    if config.split_k > 1:
        assert len(plan.kernels) == 2 and len(plan.scratch_sizes) == 1  # partial sums, then the reduction
    before = device.live_handles()
    got = run_plan(device, plan, inputs, outputs)
    assert device.live_handles() == before
    plain = {key: value for key, value in attrs.items() if key != "_epilogue"}
    want = ort_run(op, inputs, plain, opset, epilogue=attrs.get("_epilogue", ()), own_inputs=own)
    assert_close(got[0], want[0])


# -- GEMV variants (columns x K-rows, vectors, unrolling, split-K, subgroups) ----------------------------------------


def _gemv_variants() -> list[Any]:
    from ortgpu.ops._gemv import GemvConfig

    return [
        None,  # the default kernel
        GemvConfig(8, 32, vectors=2, unroll=3),  # more columns, fewer K-rows, several loads in flight
        GemvConfig(4, 64, unroll=2, split_k=3),  # split-K over workgroups (K not a multiple of the split)
        GemvConfig(2, 128, unroll=2, split_k=2, subgroups=True),
        GemvConfig(32, 4, vectors=4, subgroups=True),  # subgroups narrower / wider than the column threads
        GemvConfig(16, 16, split_k=4, subgroups=True),
    ]


# (op, input shapes, attrs, own inputs): bias, relu and residual add epilogues; row-major and transposed B;
# vectorised and scalar (N or K not a multiple of 4).
GEMV_VARIANT_CASES: list[tuple[str, list[tuple[int, ...] | None], dict[str, Any], int]] = [
    ("MatMul", [(1, 300), (300, 72), (72,), (1, 72)], {"_epilogue": (("add", 2), ("relu",), ("add", 3))}, 2),
    ("MatMul", [(133,), (133, 61), (61,)], {"_epilogue": (("add", 2), ("relu",))}, 2),
    (
        "Gemm",
        [(1, 264), (37, 264), (37,), (1, 37)],
        {"transB": 1, "alpha": 0.5, "_epilogue": (("relu",), ("add", 3))},
        3,
    ),
    ("Gemm", [(1, 203), (40, 203), None, (40,)], {"transB": 1, "_epilogue": (("add", 3), ("relu",))}, 3),
]


@pytest.mark.parametrize("variant", range(6))
@pytest.mark.parametrize("op,shapes,attrs,own", GEMV_VARIANT_CASES)
def test_gemv_variants_match_onnxruntime(
    device: Any,
    variant: int,
    op: str,
    shapes: list[tuple[int, ...] | None],
    attrs: dict[str, Any],
    own: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every GEMV variant (forced through GEMV_OVERRIDE) computes what onnxruntime computes; without subgroups
    on the device the subgroup variants fall back to the workgroup-memory reduction."""
    import dataclasses

    from ortgpu.ops import _gemv

    config = _gemv_variants()[variant]
    layout = "nk" if attrs.get("transB") else "kn"
    if config is not None and layout == "nk":
        config = dataclasses.replace(config, vectors=1)  # vec4 column groups are a row-major-B option
    monkeypatch.setattr(_gemv, "GEMV_OVERRIDE", config)
    inputs = [None if s is None else rand(*s) for s in shapes]
    operator = get_operator(op, 13)
    outputs = [TensorInfo(tuple(w.shape), w.dtype) for w in operator.reference(inputs, attrs, [])]
    infos = [None if a is None else TensorInfo(tuple(a.shape), a.dtype) for a in inputs]
    caps = DeviceCaps(frozenset(device.features), device.limits)
    plan = operator.plan(infos, outputs, attrs, caps, {})
    if config is not None:
        b = shapes[1]
        assert b is not None
        n, k = (b[0], b[1]) if layout == "nk" else (b[-1], b[0])
        effective = _gemv.effective_gemv_config(config, layout, n, k, caps)
        assert len(plan.kernels) == (2 if effective.split_k > 1 else 1)
        assert len(plan.scratch_sizes) == (1 if effective.split_k > 1 else 0)
        assert ("subgroupShuffleXor" in plan.kernels[0].wgsl) == (config.subgroups and _gemv.has_subgroups(caps))
    before = device.live_handles()
    got = run_plan(device, plan, inputs, outputs)
    assert device.live_handles() == before
    plain = {key: value for key, value in attrs.items() if key != "_epilogue"}
    want = ort_run(op, inputs, plain, 13, epilogue=attrs.get("_epilogue", ()), own_inputs=own)
    assert_close(got[0], want[0])


def test_choose_gemv_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default kernel (the first of GEMV_DEFAULTS the device fits) for every shape unless GEMV_SHAPE_CONFIGS or
    GEMV_OVERRIDE say otherwise; configs the device cannot run are ignored; the default plan is ``gemv_kernel`` with
    the default config."""
    from ortgpu.ops import _gemv, _tiling
    from ortgpu.ops._gemv import GemvConfig, choose_gemv_config, default_gemv_config
    from ortgpu_core.backends.fake import FakeBackend

    device = FakeBackend().open_device(0)
    try:
        caps = DeviceCaps(frozenset(device.features), device.limits)
    finally:
        device.destroy()
    big = DeviceCaps(
        caps.features,
        dataclasses.replace(caps.limits, max_compute_invocations_per_workgroup=1024, max_compute_workgroup_size_y=1024),
    )
    small = DeviceCaps(
        caps.features,
        dataclasses.replace(caps.limits, max_compute_invocations_per_workgroup=256, max_compute_workgroup_size_y=256),
    )
    assert default_gemv_config("kn", big) == GemvConfig(4, 128, unroll=2)  # 512 invocations where they fit
    assert default_gemv_config("kn", small) == GemvConfig(2, 128, unroll=2) == default_gemv_config("kn")
    assert default_gemv_config("nk", big) == default_gemv_config("nk", small) == GemvConfig(4, 64, unroll=2)
    for layout, ladder in _gemv.GEMV_DEFAULTS.items():  # the last entry fits every WebGPU device (256 invocations)
        assert _gemv.gemv_config_fits(ladder[-1], layout, small)
    for (layout, n, k), config in _gemv.GEMV_SHAPE_CONFIGS.items():
        assert _gemv.gemv_config_fits(config, layout, caps)
        assert choose_gemv_config(layout, n, k, caps) == config
    monkeypatch.setattr(_gemv, "GEMV_SHAPE_CONFIGS", {})
    for layout, n, k in (("kn", 1024, 1024), ("kn", 4096, 4096), ("nk", 4096, 4096), ("nk", 8192, 8192), ("kn", 63, 7)):
        assert choose_gemv_config(layout, n, k, caps) == default_gemv_config(layout, caps)
    tuned = GemvConfig(8, 32, unroll=2, split_k=4)
    monkeypatch.setattr(_gemv, "GEMV_SHAPE_CONFIGS", {("kn", 1024, 1024): tuned, ("kn", 64, 64): GemvConfig(2048, 1)})
    assert choose_gemv_config("kn", 1024, 1024, caps) == tuned
    assert choose_gemv_config("nk", 1024, 1024, caps) == default_gemv_config("nk", caps)
    assert choose_gemv_config("kn", 64, 64, caps) == default_gemv_config("kn", caps)  # invalid: falls back
    monkeypatch.setattr(_gemv, "GEMV_OVERRIDE", GemvConfig(4, 64))
    assert choose_gemv_config("kn", 1024, 1024, caps) == GemvConfig(4, 64)
    monkeypatch.setattr(_gemv, "GEMV_OVERRIDE", None)
    # The default MatMul plan is the default config's kernel (what MatMul ran before configurations).
    monkeypatch.setattr(_gemv, "GEMV_SHAPE_CONFIGS", {})
    f32 = np.dtype(np.float32)
    plan = get_operator("MatMul", 13).plan(
        [TensorInfo((1, 96), f32), TensorInfo((96, 40), f32)], [TensorInfo((1, 40), f32)], {}, caps, {}
    )
    wgsl, grid = _gemv.gemv_kernel(
        n=40,
        k=96,
        b_layout="kn",
        config=default_gemv_config("kn", caps),
        a_name="input_0",
        b_name="input_1_vec4f32",
        declarations=_tiling.BindingTable().declarations(),
        epilogue="",
        store=lambda o, value: f"output_0[{o}] = epilogue({value}, {o});",
        caps=caps,
    )
    assert plan.kernels[0].grid == grid
    assert (
        wgsl.split("const N:")[1].split("@compute")[1] == plan.kernels[0].wgsl.split("const N:")[1].split("@compute")[1]
    )
    for bad in (GemvConfig(3, 64), GemvConfig(4, 64, vectors=3), GemvConfig(4, 8, subgroups=True), GemvConfig(64, 32)):
        with pytest.raises(ValueError):
            bad.validate("kn")
    with pytest.raises(ValueError):
        GemvConfig(4, 64, vectors=2).validate("nk")


def test_choose_gemm_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule: small outputs with long K split K; big problems take the big tile unsplit; workgroups reach the
    target.  Measured per-shape entries (GEMM_SHAPE_CONFIGS) win over the rule."""
    from ortgpu.ops import _gemm
    from ortgpu.ops._gemm import GEMM_TARGET_WORKGROUPS, choose_gemm_config, gemm_workgroups
    from ortgpu_core.backends.fake import FakeBackend

    measured = dict(_gemm.GEMM_SHAPE_CONFIGS)
    monkeypatch.setattr(_gemm, "GEMM_SHAPE_CONFIGS", {})

    device = FakeBackend().open_device(0)
    try:
        caps = DeviceCaps(frozenset(device.features), device.limits)
    finally:
        device.destroy()
    small = choose_gemm_config(1, 128, 384, 1536, caps)  # BERT FFN down-projection, batch 1
    assert small.split_k > 1
    # It reaches the workgroup target, unless the split is already at its cap.
    assert gemm_workgroups(small, 1, 128, 384) >= GEMM_TARGET_WORKGROUPS or small.split_k == _gemm.GEMM_MAX_SPLIT_K
    big = choose_gemm_config(16, 512, 784, 4608, caps)  # a batch-16 3x3 conv
    assert big.split_k == 1 and big.tile_m * big.tile_n >= 64 * 64
    short = choose_gemm_config(12, 128, 128, 32, caps)  # attention scores: K too short to split
    assert short.split_k == 1
    # the big tile: whole tiles and about two workgroups per SM, else the ordinary rule
    assert choose_gemm_config(1, 1024, 4096, 4096, caps) == _gemm.GEMM_BIG_TILE
    assert choose_gemm_config(1, 1024, 4000, 4096, caps) != _gemm.GEMM_BIG_TILE  # N not whole tiles
    assert choose_gemm_config(1, 256, 512, 4096, caps) != _gemm.GEMM_BIG_TILE  # 8 workgroups
    assert choose_gemm_config(1, 128, 32000, 512, caps) == _gemm.GEMM_BIG_TILE  # a vocabulary head: 250 workgroups
    assert choose_gemm_config(1, 128, 28672, 512, caps) != _gemm.GEMM_BIG_TILE  # 224: under 1.8 per SM of 132
    # the first tile split over K where M fills its rows and the split reaches half the target
    first = _gemm.GEMM_TILES[0]
    wide = choose_gemm_config(1, 1500, 1536, 384, caps)  # 12 x 24 tiles of 128 x 64: split 2
    assert (wide.tile_m, wide.tile_n, wide.split_k) == (first.tile_m, first.tile_n, 2)
    values = choose_gemm_config(6, 1500, 64, 1500, caps)  # attention times values: 72 tiles, split 8
    assert (values.tile_m, values.split_k) == (first.tile_m, 8)
    assert choose_gemm_config(1, 197, 3072, 768, caps).tile_m < first.tile_m  # 197 rows: 30% of 256 empty
    assert choose_gemm_config(1, 128, 768, 768, caps).tile_m < first.tile_m  # 12 tiles x 12 slices: too few
    monkeypatch.setattr(_gemm, "GEMM_SHAPE_CONFIGS", measured)
    for (batch, m, n, k), config in measured.items():
        if _gemm.config_fits(config, caps):
            assert choose_gemm_config(batch, m, n, k, caps) == config


def test_default_rule_splits_k(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a higher workgroup target the default rule plans split-K (two kernels and a scratch buffer)."""
    from ortgpu.ops import _gemm

    monkeypatch.setattr(_gemm, "GEMM_TARGET_WORKGROUPS", 64)
    monkeypatch.setattr(_gemm, "GEMM_SPLIT_MIN_K", 32)
    a, b, bias = rand(3, 20, 160), rand(160, 44), rand(44)
    operator = get_operator("MatMul", 13)
    attrs = {"_epilogue": (("add", 2),)}
    infos = [TensorInfo(a.shape, a.dtype), TensorInfo(b.shape, b.dtype), TensorInfo(bias.shape, bias.dtype)]
    outputs = [TensorInfo((3, 20, 44), np.dtype(np.float32))]
    plan = operator.plan(infos, outputs, attrs, DeviceCaps(frozenset(device.features), device.limits), {})
    assert len(plan.kernels) == 2
    got = run_plan(device, plan, [a, b, bias], outputs)
    assert_close(got[0], ort_run("MatMul", [a, b, bias], {}, 13, epilogue=(("add", 2),), own_inputs=2)[0])


# -- Conv ------------------------------------------------------------------------------------------------------------

CONV_CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((1, 3, 9, 9), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 10, 7), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 0, 1]}),
    ((1, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 7, 8), (16, 2, 3, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 1]}),
    ((1, 2, 7, 8), (16, 2, 3, 3), {"pads": [2, 1, 2, 0], "dilations": [2, 3]}),
    ((1, 2, 7, 8), (16, 2, 2, 3), {"auto_pad": "VALID", "strides": [2, 3]}),
    ((2, 3, 11), (9, 3, 3), {"pads": [2, 1], "strides": [2], "dilations": [2]}),
    ((1, 32, 6, 6), (24, 32, 1, 1), {}),
    ((1, 16, 9, 9), (32, 8, 3, 3), {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_reference(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any], bias: bool) -> None:
    check_reference("Conv", 11, [rand(*x_shape), rand(*w_shape), rand(w_shape[0]) if bias else None], attrs)


def test_conv_3d_reference() -> None:
    check_reference("Conv", 11, [rand(1, 2, 4, 5, 6), rand(3, 2, 2, 3, 2), None], {"pads": [1, 0, 1, 0, 1, 1]})


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES)
def test_conv_device(device: Any, x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    check_device(device, "Conv", 11, [rand(*x_shape), rand(*w_shape), rand(w_shape[0])], attrs)


@pytest.mark.parametrize("epilogue", [(("relu",),), (("add", 3), ("clip", 0.0, 6.0)), (("gelu",),)])
@pytest.mark.parametrize("out_channels", [4, 16])
def test_conv_epilogue(device: Any, epilogue: tuple[tuple[Any, ...], ...], out_channels: int) -> None:
    inputs = [rand(1, 3, 6, 6), rand(out_channels, 3, 3, 3), rand(out_channels), rand(1, out_channels, 6, 6)]
    attrs = {"pads": [1, 1, 1, 1]}
    check_reference("Conv", 11, inputs, attrs, epilogue=epilogue, own_inputs=3)
    check_device(device, "Conv", 11, inputs, dict(attrs, _epilogue=epilogue))


# -- ConvTranspose ---------------------------------------------------------------------------------------------------

CONV_TRANSPOSE_CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((1, 3, 4, 5), (3, 2, 3, 3), {}),
    ((2, 4, 3, 4), (4, 3, 3, 2), {"group": 2, "strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_padding": [1, 0], "dilations": [1, 2]}),
    ((1, 2, 3, 5), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [7, 10]}),
    ((1, 2, 3, 5), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [8, 10], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 5), (2, 2, 4, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 5), (2, 2, 4, 3), {"strides": [3, 2], "auto_pad": "SAME_LOWER"}),
    ((2, 3, 6), (3, 4, 3), {"strides": [2], "pads": [1, 2]}),
    # output_shape beyond the full output: zeros at the tail (the total padding clamps at 0)
    ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_TRANSPOSE_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose_reference(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any], bias: bool
) -> None:
    group = attrs.get("group", 1)
    b = rand(w_shape[1] * group) if bias else None
    check_reference("ConvTranspose", 11, [rand(*x_shape), rand(*w_shape), b], attrs)


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_TRANSPOSE_CASES)
def test_conv_transpose_device(
    device: Any, x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]
) -> None:
    group = attrs.get("group", 1)
    check_device(device, "ConvTranspose", 11, [rand(*x_shape), rand(*w_shape), rand(w_shape[1] * group)], attrs)


# -- pooling -----------------------------------------------------------------------------------------------------------

POOL_CASES: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((2, 2, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 7, 9), {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1, "pads": [0, 1, 1, 0]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [1, 2]}),
    ((2, 3, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
]


@pytest.mark.parametrize("x_shape,attrs", POOL_CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_reference(x_shape: tuple[int, ...], attrs: dict[str, Any], include_pad: int) -> None:
    check_reference("AveragePool", 11, [rand(*x_shape)], dict(attrs, count_include_pad=include_pad))


def test_average_pool_dilations_reference() -> None:
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 1], "pads": [1, 1, 0, 1], "count_include_pad": 1}
    check_reference("AveragePool", 19, [rand(1, 2, 7, 7)], attrs)
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 0, 1]}
    check_reference("AveragePool", 19, [rand(1, 2, 7, 7)], attrs)
    with pytest.raises(UnsupportedOpError):
        reference("AveragePool", 11, [rand(1, 2, 7, 7)], attrs)


@pytest.mark.parametrize("x_shape,attrs", POOL_CASES + [((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2]})])
@pytest.mark.parametrize("indices", [False, True])
def test_max_pool_reference(x_shape: tuple[int, ...], attrs: dict[str, Any], indices: bool) -> None:
    check_reference("MaxPool", 12, [rand(*x_shape)], attrs, n_outputs=2 if indices else 1)


def test_max_pool_column_major_indices() -> None:
    check_reference("MaxPool", 12, [rand(2, 2, 6, 5)], {"kernel_shape": [2, 2], "storage_order": 1}, n_outputs=2)


@pytest.mark.parametrize("x_shape,attrs", POOL_CASES[1:4] + POOL_CASES[6:])
def test_pool_device(device: Any, x_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = rand(*x_shape)
    check_device(device, "MaxPool", 12, [x], dict(attrs, dilations=[1] * (len(x_shape) - 2)))
    check_device(device, "AveragePool", 11, [x], dict(attrs, count_include_pad=0))
    check_device(device, "AveragePool", 11, [x], dict(attrs, count_include_pad=1))


POOL_3D_CASES: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 2, 2]}),
    ((2, 1, 6, 5, 7), {"kernel_shape": [3, 2, 3], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 0]}),
    ((1, 2, 7, 6, 5), {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "ceil_mode": 1}),
]


@pytest.mark.parametrize("x_shape,attrs", POOL_3D_CASES)
def test_pool_3d(device: Any, x_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    """3-D pooling runs on the device (the kernel nests one loop per spatial axis)."""
    x = rand(*x_shape)
    for include_pad in (0, 1):
        check_reference("AveragePool", 11, [x], dict(attrs, count_include_pad=include_pad))
        check_device(device, "AveragePool", 11, [x], dict(attrs, count_include_pad=include_pad))
    check_reference("MaxPool", 12, [x], attrs, n_outputs=2)
    check_device(device, "MaxPool", 12, [x], dict(attrs, dilations=[2, 1, 1]))


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("x_shape,attrs", POOL_CASES[1:3] + POOL_CASES[6:] + POOL_3D_CASES[1:2])
def test_max_pool_indices_on_device(
    device: Any, x_shape: tuple[int, ...], attrs: dict[str, Any], storage_order: int
) -> None:
    """MaxPool's Indices output (first maximum, flat index, row- or column-major) comes from the device kernel."""
    x = rand(*x_shape)
    attrs = dict(attrs, storage_order=storage_order)
    if not storage_order or len(x_shape) == 4:  # onnxruntime supports storage_order only for 2-D pooling
        check_reference("MaxPool", 12, [x], attrs, n_outputs=2)
    operator = get_operator("MaxPool", 12)
    want = operator.reference([x], attrs, [TensorInfo((), np.dtype(np.float32))] * 2)
    outputs = [TensorInfo(tuple(w.shape), w.dtype) for w in want]
    caps = DeviceCaps(frozenset(device.features), device.limits)
    plan = operator.plan([TensorInfo(x.shape, x.dtype)], outputs, attrs, caps, {})
    got = run_plan(device, plan, [x], outputs)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("x_shape", [(2, 3, 5, 4), (1, 8, 40, 40), (2, 5, 7)])
def test_global_average_pool(device: Any, x_shape: tuple[int, ...]) -> None:
    x = rand(*x_shape)
    check_reference("GlobalAveragePool", 11, [x], {})
    check_device(device, "GlobalAveragePool", 11, [x], {})


# -- reductions ---------------------------------------------------------------------------------------------------------

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18}
REDUCE_CASES: list[tuple[tuple[int, ...], list[int] | None, int]] = [
    ((3, 4, 5), [1], 1),
    ((3, 4, 5), [0, 2], 0),
    ((3, 4, 5), [-1], 1),
    ((3, 4, 5), None, 0),
    ((2, 300), [1], 0),
    ((64, 3, 7), [0], 1),
]


def reduce_call(
    op: str, opset: int, x: np.ndarray, axes: list[int] | None, keepdims: int, noop: int | None = None
) -> tuple[list[np.ndarray | None], dict[str, Any]]:
    attrs: dict[str, Any] = {"keepdims": keepdims}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    if opset >= AXES_INPUT_SINCE[op]:
        return [x, None if axes is None else np.array(axes, dtype=np.int64)], attrs
    if axes is not None:
        attrs["axes"] = axes
    return [x], attrs


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("x_shape,axes,keepdims", REDUCE_CASES)
def test_reduce_reference(op: str, opset: int, x_shape: tuple[int, ...], axes: list[int] | None, keepdims: int) -> None:
    inputs, attrs = reduce_call(op, opset, rand(*x_shape), axes, keepdims)
    check_reference(op, opset, inputs, attrs)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(op: str) -> None:
    x = rand(3, 4)
    inputs, attrs = reduce_call(op, 18, x, None, 1, noop=1)
    check_reference(op, 18, inputs, attrs)
    inputs, attrs = reduce_call(op, 18, x, [], 0, noop=0)
    check_reference(op, 18, inputs, attrs)


def test_reduce_int64_reference() -> None:
    x = RNG.integers(-100, 100, size=(3, 4)).astype(np.int64)
    for op in REDUCE_OPS[:1] + REDUCE_OPS[2:]:
        check_reference(op, 18, [x, np.array([1], dtype=np.int64)], {"keepdims": 0})


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("x_shape,axes,keepdims", REDUCE_CASES[1:])
def test_reduce_device(device: Any, op: str, x_shape: tuple[int, ...], axes: list[int] | None, keepdims: int) -> None:
    inputs, attrs = reduce_call(op, 18, rand(*x_shape), axes, keepdims)
    constants = {1: inputs[1]} if len(inputs) > 1 and inputs[1] is not None else {}
    check_device(device, op, 18, inputs, attrs, constants)


def _reduce_inputs(kind: str) -> np.ndarray:
    if kind == "int64":
        wide = RNG.integers(-(2**62), 2**62, size=(3, 5, 4), dtype=np.int64)
        return np.where(RNG.random((3, 5, 4)) < 0.3, RNG.integers(-9, 9, size=(3, 5, 4)), wide).astype(np.int64)
    if kind == "int32":
        return RNG.integers(-(2**31), 2**31 - 1, size=(3, 5, 4), dtype=np.int64).astype(np.int32)
    if kind == "uint8":
        return RNG.integers(0, 256, size=(3, 5, 4)).astype(np.uint8)
    if kind == "int8":
        return RNG.integers(-128, 128, size=(3, 5, 4)).astype(np.int8)
    return RNG.random((3, 5, 4)) < 0.3  # bool: mostly False, so any/all differ by row


#: (op, dtype) pairs onnxruntime's CPU provider implements (bool max/min from opset 20).
INTEGER_REDUCTIONS = [
    ("ReduceSum", "int64"),
    ("ReduceSum", "int32"),
    ("ReduceMax", "int64"),
    ("ReduceMin", "int64"),
    ("ReduceMax", "int32"),
    ("ReduceMin", "int32"),
    ("ReduceMax", "uint8"),
    ("ReduceMin", "int8"),
    ("ReduceMax", "bool"),
    ("ReduceMin", "bool"),
]


@pytest.mark.parametrize("op,kind", INTEGER_REDUCTIONS)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), (None, 0)])
def test_reduce_integer_and_bool(device: Any, op: str, kind: str, axes: list[int] | None, keepdims: int) -> None:
    """Integer and bool reductions run on the device (int64 exactly, through both words)."""
    opset = 20
    inputs, attrs = reduce_call(op, opset, _reduce_inputs(kind), axes, keepdims)
    if op == "ReduceSum":
        # onnxruntime's int64 sums of huge values are not exact (they round like doubles): compare the
        # reference with it on moderate values, and the device with the reference on the whole range.
        moderate = (inputs[0] // (2**24)).astype(inputs[0].dtype)
        check_reference(op, opset, [moderate] + list(inputs[1:]), attrs)
    else:
        check_reference(op, opset, inputs, attrs)
    constants = {1: inputs[1]} if len(inputs) > 1 and inputs[1] is not None else {}
    check_device(device, op, opset, inputs, attrs, constants)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_reduce_empty_axis_gives_the_identity(device: Any, op: str, dtype: Any) -> None:
    """Max/min over an empty axis: -inf/+inf (the integer limits, False/True), on the device."""
    x = np.zeros((3, 0, 2), dtype=dtype)
    inputs, attrs = reduce_call(op, 20, x, [1], 1)
    operator = get_operator(op, 20)
    want = operator.reference(inputs, attrs, [])[0]
    if dtype == np.float32:
        assert np.all(want == (-np.inf if op == "ReduceMax" else np.inf))
    caps = DeviceCaps(frozenset(device.features), device.limits)
    output = TensorInfo(tuple(want.shape), want.dtype)
    plan = operator.plan(
        [TensorInfo(x.shape, x.dtype), TensorInfo((1,), np.dtype(np.int64))],
        [output],
        attrs,
        caps,
        {1: np.array([1], np.int64)},
    )
    assert plan.kernels, "max/min over an empty axis runs on the device"
    (got,) = run_plan(device, plan, inputs, [output])
    np.testing.assert_array_equal(got, want)


def test_reduce_integer_mean_stays_on_cpu(device: Any) -> None:
    caps = DeviceCaps(frozenset(device.features), device.limits)
    i32 = np.dtype(np.int32)
    with pytest.raises(NotOnDevice):
        get_operator("ReduceMean", 18).plan(
            [TensorInfo((3, 4), i32), TensorInfo((1,), np.dtype(np.int64))],
            [TensorInfo((3, 1), i32)],
            {},
            caps,
            {1: np.array([1], np.int64)},
        )


def test_reduce_runtime_axes_stay_on_cpu(device: Any) -> None:
    caps = DeviceCaps(frozenset(device.features), device.limits)
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    with pytest.raises(NotOnDevice, match="axes"):
        get_operator("ReduceSum", 13).plan(
            [TensorInfo((3, 4), f32), TensorInfo((1,), i64)], [TensorInfo((3, 1), f32)], {}, caps, {}
        )


# -- Softmax, LogSoftmax ---------------------------------------------------------------------------------------------

SOFTMAX_CASES: list[tuple[tuple[int, ...], int | None, int]] = [
    ((3, 4, 5), None, 11),
    ((3, 4, 5), None, 13),
    ((3, 4, 5), 0, 11),
    ((3, 4, 5), 1, 13),
    ((3, 4, 5), -2, 11),
    ((4, 1000), -1, 13),
    ((2, 3, 40, 8), 2, 13),
    ((7,), 0, 13),
]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("x_shape,axis,opset", SOFTMAX_CASES)
def test_softmax_reference(op: str, x_shape: tuple[int, ...], axis: int | None, opset: int) -> None:
    attrs = {} if axis is None else {"axis": axis}
    check_reference(op, opset, [rand(*x_shape) * 3], attrs)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("x_shape,axis,opset", SOFTMAX_CASES[1:2] + SOFTMAX_CASES[4:])
def test_softmax_device(device: Any, op: str, x_shape: tuple[int, ...], axis: int | None, opset: int) -> None:
    attrs = {} if axis is None else {"axis": axis}
    check_device(device, op, opset, [rand(*x_shape) * 3], attrs)


# -- LayerNormalization, BatchNormalization --------------------------------------------------------------------------

LAYER_NORM_CASES: list[tuple[tuple[int, ...], int, tuple[int, ...], bool]] = [
    ((2, 5, 16), -1, (16,), True),
    ((2, 5, 16), 1, (5, 16), False),
    ((3, 600), -1, (600,), True),
    ((2, 3, 4, 5), 2, (1, 5), True),
]


@pytest.mark.parametrize("x_shape,axis,scale_shape,bias", LAYER_NORM_CASES)
@pytest.mark.parametrize("n_outputs", [1, 3])
def test_layer_normalization(
    device: Any, x_shape: tuple[int, ...], axis: int, scale_shape: tuple[int, ...], bias: bool, n_outputs: int
) -> None:
    inputs = [rand(*x_shape), rand(*scale_shape), rand(*scale_shape) if bias else None]
    attrs = {"axis": axis, "epsilon": 1e-3}
    check_reference("LayerNormalization", 17, inputs, attrs, n_outputs=n_outputs)
    operator = get_operator("LayerNormalization", 17)
    want = operator.reference(inputs, attrs, [TensorInfo((), np.dtype(np.float32))] * n_outputs)
    outputs = [TensorInfo(tuple(w.shape), w.dtype) for w in want]
    infos = [None if a is None else TensorInfo(tuple(a.shape), a.dtype) for a in inputs]
    plan = operator.plan(infos, outputs, attrs, DeviceCaps(frozenset(device.features), device.limits), {})
    for got, expected in zip(run_plan(device, plan, inputs, outputs), want):
        assert_close(got, expected)


@pytest.mark.parametrize("x_shape", [(2, 3, 4, 5), (4, 6), (2, 3, 7)])
@pytest.mark.parametrize("opset", [9, 15])
def test_batch_normalization(device: Any, x_shape: tuple[int, ...], opset: int) -> None:
    channels = x_shape[1]
    inputs = [rand(*x_shape), rand(channels), rand(channels), rand(channels), np.abs(rand(channels)) + 0.1]
    check_reference("BatchNormalization", opset, inputs, {"epsilon": 1e-3})
    check_device(device, "BatchNormalization", opset, inputs, {"epsilon": 1e-3})


def test_batch_normalization_per_activation() -> None:
    x = rand(2, 3, 4)
    inputs = [x, rand(3, 4), rand(3, 4), rand(3, 4), np.abs(rand(3, 4)) + 0.1]
    check_reference("BatchNormalization", 7, inputs, {"spatial": 0})


def test_batch_normalization_training_mode_before_opset_14_is_refused() -> None:
    """training_mode exists from opset 14 (supported there: test_ops_normalization.py); before, it is refused."""
    inputs = [rand(2, 3), rand(3), rand(3), rand(3), rand(3)]
    with pytest.raises(UnsupportedOpError, match="training_mode"):
        reference("BatchNormalization", 9, inputs, {"training_mode": 1})


# -- 2-D grids ---------------------------------------------------------------------------------------------------------

FOLDED_GRID_CASES: list[tuple[str, int, list[tuple[int, ...] | None], dict[str, Any]]] = [
    ("MatMul", 13, [(300, 40), (40, 300)], {}),
    ("MatMul", 13, [(1, 64), (64, 1000)], {}),
    ("Gemm", 13, [(1, 64), (300, 64), None], {"transB": 1}),
    ("Conv", 11, [(1, 8, 40, 40), (8, 1, 3, 3), None], {"group": 8, "pads": [1, 1, 1, 1]}),
    ("Conv", 11, [(1, 8, 40, 40), (16, 8, 3, 3), None], {"pads": [1, 1, 1, 1]}),
    ("ConvTranspose", 11, [(1, 8, 20, 20), (8, 4, 2, 2), None], {"strides": [2, 2]}),
    ("MaxPool", 12, [(1, 4, 40, 40)], {"kernel_shape": [2, 2]}),
    ("Softmax", 13, [(6000, 4)], {}),
    ("ReduceSum", 11, [(100, 300)], {"axes": [1]}),
    ("BatchNormalization", 15, [(2, 3, 40, 40), (3,), (3,), (3,), (3,)], {}),
]


@pytest.mark.parametrize("op,opset,shapes,attrs", FOLDED_GRID_CASES)
def test_grids_fold_into_two_dimensions(
    device: Any, op: str, opset: int, shapes: list[tuple[int, ...] | None], attrs: dict[str, Any]
) -> None:
    """A device allowing only 16 workgroups per grid dimension gets (x, y) grids; results do not change."""
    import dataclasses

    inputs = [None if s is None else np.abs(rand(*s)) + 0.1 for s in shapes]
    operator = get_operator(op, opset)
    want = operator.reference(inputs, attrs, [])
    outputs = [TensorInfo(tuple(w.shape), w.dtype) for w in want]
    infos = [None if a is None else TensorInfo(tuple(a.shape), a.dtype) for a in inputs]
    limits = dataclasses.replace(device.limits, max_compute_workgroups_per_dimension=16)
    plan = operator.plan(infos, outputs, attrs, DeviceCaps(frozenset(device.features), limits), {})
    assert all(k.grid[0] <= 16 and k.grid[1] <= 16 for k in plan.kernels)
    assert any(k.grid[1] > 1 for k in plan.kernels)
    for got, expected in zip(run_plan(device, plan, inputs, outputs), want):
        assert_close(got, expected)
