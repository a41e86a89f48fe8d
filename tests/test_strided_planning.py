"""Planning over strided operands and size-1 axes: MatMul's batch axes fold into rows whenever B is broadcast
along them, and a size-1 axis's stride or position never decides a layout.

The case that motivated these tests is ViT's packed Q/K/V projection, ``[1, S, D] -> Transpose(1, 0, 2) ->
[S, 1, D] @ [D, 3D] + bias``: the folded Transpose hands the planner a size-1 axis whose stride is meaningless, and
a planner that compares that stride refuses to merge the batch into the rows, so the product runs as S separate
one-row GEMMs (one live row per workgroup).  Every size-1 axis, one-row product, partial fold and empty shape here
is checked for its plan (what the tiled GEMM or GEMV was given) and, on both backends, its numbers.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu.ops import DeviceCaps, NotOnDevice, TensorInfo, get_operator
from ortgpu.ops._runner import run_plan

RNG = np.random.default_rng(20260611)


def _model(nodes: list[onnx.NodeProto], x_shape: tuple[int, ...], y_shape: tuple[int, ...], inits: list[Any]) -> bytes:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(y_shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 10)
    return bytes(model.SerializeToString())


def _projection(s: int, d: int, n: int, *, transpose: bool) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``Y = Transpose(X, [1, 0, 2]) @ W + bias`` with X ``[1, s, d]`` (or, without ``transpose``, X already
    ``[s, 1, d]``): the same product either way."""
    w = RNG.standard_normal((d, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "bias")]
    nodes = [
        helper.make_node("MatMul", ["Xt" if transpose else "X", "W"], ["P"], name="mm"),
        helper.make_node("Add", ["P", "bias"], ["Y"], name="add"),
    ]
    if transpose:
        nodes.insert(0, helper.make_node("Transpose", ["X"], ["Xt"], perm=[1, 0, 2], name="t"))
    return _model(nodes, (1, s, d) if transpose else (s, 1, d), (s, 1, n), inits), w, bias


def _kernels(session: ortgpu.InferenceSession, x_shape: tuple[int, ...]) -> list[Any]:
    plan = session._runner.plan_for({"X": x_shape}, {"X": np.dtype(np.float32)})
    return [kernel for step in plan.steps if step.op_plan is not None for kernel in step.op_plan.kernels]


def _workgroups(kernels: list[Any]) -> int:
    return sum(int(np.prod(kernel.grid)) for kernel in kernels)


def test_a_transpose_of_a_size_1_axis_merges_the_batch_into_rows(env: Any) -> None:
    """ViT's Q/K/V projection: one fused step, the very kernel of the untransposed product (S rows in one GEMM,
    not S one-row GEMMs), and numpy's numbers."""
    s, d, n = 7, 16, 48
    folded, w, bias = _projection(s, d, n, transpose=True)
    plain, _, _ = _projection(s, d, n, transpose=False)
    x = RNG.standard_normal((1, s, d)).astype(np.float32)
    with ortgpu.InferenceSession(folded, env=env) as session, ortgpu.InferenceSession(plain, env=env) as reference:
        plan = session._runner.plan_for({"X": (1, s, d)}, {"X": np.dtype(np.float32)})
        assert [step.op_types for step in plan.steps] == [("MatMul", "Transpose", "Add")], plan.describe()
        kernels, plain_kernels = _kernels(session, (1, s, d)), _kernels(reference, (s, 1, d))
        assert [k.wgsl for k in kernels] == [k.wgsl for k in plain_kernels]
        assert "const BATCH: u32 = 1u;" in kernels[0].wgsl and f"const M: u32 = {s}u;" in kernels[0].wgsl
        assert _workgroups(kernels) == 1  # 7 x 48 fits one tile; 7 one-row products took 7 workgroups
        got = session.run(None, {"X": x})[0]
    want = np.transpose(x, (1, 0, 2)).astype(np.float64) @ w + bias
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_vit_shape_plans_one_gemm(env: Any) -> None:
    """At ViT-B/16's own shape (197 tokens, 768 -> 2304): the kernels of the untransposed product, a fraction of
    the workgroups of 197 one-row GEMMs (197 x 36 = 7092 with 64 x 64 tiles, split-K's reduction aside).
    Planned only."""
    folded, _, _ = _projection(197, 768, 2304, transpose=True)
    plain, _, _ = _projection(197, 768, 2304, transpose=False)
    with ortgpu.InferenceSession(folded, env=env) as session, ortgpu.InferenceSession(plain, env=env) as reference:
        kernels = _kernels(session, (1, 197, 768))
        assert [k.wgsl for k in kernels] == [k.wgsl for k in _kernels(reference, (197, 1, 768))]
        assert "const BATCH: u32 = 1u;" in kernels[0].wgsl and "const M: u32 = 197u;" in kernels[0].wgsl
        assert _workgroups(kernels) < 7092 // 4


# -- the operator's plan, case by case -----------------------------------------------------------------------------


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

        backend = WgpuBackend()
        dev = backend.open_device(backend.default_adapter_index())
    yield dev
    dev.destroy()


def _source(shape: tuple[int, ...], perm: tuple[int, ...] | None) -> tuple[int, ...]:
    """The shape whose ``numpy.transpose(., perm)`` is ``shape``."""
    return shape if perm is None else tuple(shape[int(i)] for i in np.argsort(perm))


# name: (A operand shape, A perm, B operand shape, B perm, expected plan: ("gemm", batch, rows) or ("gemv", layout))
CASES: dict[str, tuple[tuple[int, ...], Any, tuple[int, ...], Any, tuple[Any, ...]]] = {
    # the size-1 axis at each place of a rank-3 activation, moved by the transpose
    "vit_qkv": ((7, 1, 16), (1, 0, 2), (16, 12), None, ("gemm", 1, 7)),
    "one_row_batched": ((7, 1, 16), (0, 2, 1), (16, 12), None, ("gemm", 1, 7)),  # source [7, 16, 1]
    "size_1_leading": ((1, 7, 16), (1, 0, 2), (16, 12), None, ("gemm", 1, 7)),  # source [7, 1, 16]
    "size_1_batches": ((1, 3, 1, 5, 8), (3, 0, 1, 2, 4), (8, 12), None, ("gemm", 1, 15)),
    "batch_of_one": ((1, 5, 8), (0, 2, 1), (8, 12), None, ("gemm", 1, 5)),  # a real transpose of the rows
    # rows that are not one run merge all the same (read through an index function): ViT at batch 2, a batch over
    # transposed rows (vec4 along m within each run), a partial fold where B is broadcast along one axis only
    "vit_qkv_batch_2": ((7, 2, 16), (1, 0, 2), (16, 12), None, ("gemm", 1, 14)),
    "rows_not_one_run": ((3, 4, 8), (1, 0, 2), (8, 12), None, ("gemm", 1, 12)),
    "transposed_rows": ((3, 8, 12), (0, 2, 1), (12, 16), None, ("gemm", 1, 24)),
    "two_runs": ((2, 3, 5, 8), (2, 0, 1, 3), (8, 12), None, ("gemm", 1, 30)),
    "partial_fold_strided": ((2, 3, 5, 8), (2, 0, 1, 3), (2, 1, 8, 12), None, ("gemm", 2, 15)),
    "partial_fold_contiguous": ((2, 3, 5, 8), None, (2, 1, 8, 12), None, ("gemm", 2, 15)),
    "b_batched_no_fold": ((2, 3, 5, 8), None, (2, 3, 8, 12), None, ("gemm", 6, 5)),
    "a_broadcast_no_fold": ((1, 5, 8), (0, 2, 1), (3, 8, 12), None, ("gemm", 3, 5)),
    # one row: the GEMV, reading folded operands (A is K contiguous values; B a [K, N] or [N, K] source)
    "m1_a_transposed": ((1, 16), (1, 0), (16, 12), None, ("gemv", "kn")),
    "m1_b_transposed": ((1, 16), None, (16, 12), (1, 0), ("gemv", "nk")),
    "m1_batched_b_transposed": ((1, 1, 16), (1, 0, 2), (1, 16, 12), (0, 2, 1), ("gemv", "nk")),
    "only_size_1_axes_move": ((1, 1, 16), (1, 0, 2), (1, 16, 12), (1, 0, 2), ("gemv", "kn")),
    "n1_b_transposed": ((3, 16), (0, 1), (16, 1), (1, 0), ("gemm", 1, 3)),  # [1, 16] source: moves a size-1 axis
}

# vec4 loaders the merged rows keep (every row start aligned; four rows within the innermost run)
VECTORS = {
    "vit_qkv": {"a4k", "b4n"},
    "vit_qkv_batch_2": {"a4k", "b4n"},
    "rows_not_one_run": {"a4k", "b4n"},
    "two_runs": {"a4k", "b4n"},
    "transposed_rows": {"a4m", "b4n"},
}


def _plan(
    a: np.ndarray,
    b: np.ndarray,
    attrs: dict[str, Any],
    out: TensorInfo,
    caps: DeviceCaps,
    seen: list[Any],
    vectors: set[str],
) -> Any:
    """The operator's plan, noting in ``seen`` what it handed the tiled GEMM or GEMV and in ``vectors`` the tiled
    GEMM's vec4 loaders."""
    from ortgpu.ops import _gemv, _tiled_gemm

    original_tiled, original_gemv = _tiled_gemm.plan_tiled_gemm, _gemv.plan_gemv

    def tiled(name: str, problem: Any, **kwargs: Any) -> Any:
        seen.append(("gemm", problem.batch, problem.m))
        vectors.update(name for name in ("a4k", "a4m", "b4n", "b4k") if getattr(problem, f"load_{name}") is not None)
        return original_tiled(name, problem, **kwargs)

    def gemv(name: str, **kwargs: Any) -> Any:
        seen.append(("gemv", kwargs["layout"]))
        return original_gemv(name, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ortgpu.ops.ai_onnx.matmul.plan_tiled_gemm", tiled)
        patch.setattr("ortgpu.ops.ai_onnx.matmul.plan_gemv", gemv)
        return get_operator("MatMul", 13).plan(
            [TensorInfo(a.shape, a.dtype), TensorInfo(b.shape, b.dtype)], [out], attrs, caps, {}
        )


@pytest.mark.parametrize("split", [False, True], ids=["one-kernel", "split-k"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_strided_operands_plan_merged_rows(
    device: Any, case: str, split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each layout gets the plan its memory allows (merged rows, a partial fold, the GEMV) and numpy's numbers,
    with the one-kernel GEMM and with split-K (whose twin rebuilds the merged operands)."""
    from ortgpu.ops import _gemm, _gemv

    if split:
        monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", _gemm.GemmConfig(32, 32, 8, 4, 4, stages=1, split_k=2))
        monkeypatch.setattr(_gemv, "GEMV_OVERRIDE", _gemv.GemvConfig(4, 64, unroll=2, split_k=2))
    a_shape, a_perm, b_shape, b_perm, expected = CASES[case]
    a = RNG.standard_normal(_source(a_shape, a_perm)).astype(np.float32)
    b = RNG.standard_normal(_source(b_shape, b_perm)).astype(np.float32)
    a_op = a if a_perm is None else np.transpose(a, a_perm)
    b_op = b if b_perm is None else np.transpose(b, b_perm)
    assert a_op.shape == a_shape and b_op.shape == b_shape
    want = np.matmul(a_op.astype(np.float64), b_op.astype(np.float64))
    out = TensorInfo(want.shape, np.dtype(np.float32))
    caps = DeviceCaps(frozenset(device.features), device.limits)
    seen: list[Any] = []
    vectors: set[str] = set()
    plan = _plan(a, b, {"_input_perms": (a_perm, b_perm)}, out, caps, seen, vectors)
    assert seen == [expected]
    assert VECTORS.get(case, set()) <= vectors
    got = run_plan(device, plan, [a, b], [out])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "a_shape,a_perm,b_shape",
    [
        ((0, 7, 16), (1, 0, 2), (16, 12)),  # an empty batch axis moved by the transpose
        ((1, 0, 16), (1, 0, 2), (16, 12)),  # no rows
        ((1, 7, 16), (1, 0, 2), (16, 0)),  # no columns
    ],
)
def test_empty_products_plan_no_kernel(device: Any, a_shape: Any, a_perm: Any, b_shape: Any) -> None:
    a = np.zeros(_source(a_shape, a_perm), np.float32)
    b = np.zeros(b_shape, np.float32)
    want = np.matmul(np.transpose(a, a_perm), b)
    out = TensorInfo(want.shape, np.dtype(np.float32))
    caps = DeviceCaps(frozenset(device.features), device.limits)
    plan = get_operator("MatMul", 13).plan(
        [TensorInfo(a.shape, a.dtype), TensorInfo(b.shape, b.dtype)], [out], {"_input_perms": (a_perm, None)}, caps, {}
    )
    assert plan.kernels == ()


def test_an_empty_inner_dimension_stays_on_the_cpu(device: Any) -> None:
    """K = 0 through a folded transpose: every output is 0, which the twin (CPU) computes, as without the fold."""
    caps = DeviceCaps(frozenset(device.features), device.limits)
    with pytest.raises(NotOnDevice, match="inner dimension K is 0"):
        get_operator("MatMul", 13).plan(
            [TensorInfo((7, 1, 0), np.dtype(np.float32)), TensorInfo((0, 12), np.dtype(np.float32))],
            [TensorInfo((1, 7, 12), np.dtype(np.float32))],
            {"_input_perms": ((1, 0, 2), None)},
            caps,
            {},
        )


# -- size-1 axes in the elementwise kernels' broadcasting ------------------------------------------------------------


def test_an_operand_that_differs_only_by_size_1_axes_is_read_in_place() -> None:
    """``[S, D]`` broadcast to ``[1, S, D]`` (or ``[S, 1, D]``) is the identity: no per-element index arithmetic."""
    from ortgpu.ops._wgsl import broadcast_index_function

    identity = "fn index0(j: u32) -> u32 { return j; }\n"
    assert broadcast_index_function("index0", (7, 16), (1, 7, 16)) == identity
    assert broadcast_index_function("index0", (7, 1, 16), (7, 16)) == identity
    assert broadcast_index_function("index0", (1, 7, 1, 16), (7, 1, 16)) == identity
    assert "%" in broadcast_index_function("index0", (1, 16), (7, 16))  # a real broadcast still repeats


@pytest.mark.parametrize(
    "x_shape,y_shape",
    [((7, 16), (1, 7, 16)), ((7, 1, 16), (1, 7, 16)), ((1, 7, 16), (7, 16)), ((0, 16), (1, 0, 16))],
)
def test_adding_operands_that_differ_only_by_size_1_axes(device: Any, x_shape: Any, y_shape: Any) -> None:
    x = RNG.standard_normal(x_shape).astype(np.float32)
    y = RNG.standard_normal(y_shape).astype(np.float32)
    want = x + y
    out = TensorInfo(want.shape, np.dtype(np.float32))
    caps = DeviceCaps(frozenset(device.features), device.limits)
    plan = get_operator("Add", 14).plan(
        [TensorInfo(x.shape, x.dtype), TensorInfo(y.shape, y.dtype)], [out], {}, caps, {}
    )
    np.testing.assert_array_equal(run_plan(device, plan, [x, y], [out])[0], want)
