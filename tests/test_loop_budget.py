"""llvmpipe's loop cap: kernels whose loops could run past it are placed on the CPU there, with the reason.

Mesa's llvmpipe (lavapipe, the software Vulkan driver these tests run on) silently stops the loops of a shader
invocation once 65535 iterations have run in all.  Before this guard an int32 ReduceSum over 100000 ones returned
65535 on lavapipe.  Hardware GPUs (and the fake backend) have no cap: the same nodes stay on the device there.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ortgpu
import ortgpu_core
from ortgpu.ops import DeviceCaps, NotOnDevice
from ortgpu.ops._kernel import LLVMPIPE_LOOP_BUDGET, check_loop_budget, loop_budget_for
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS


def _model(op: str, length: int, dtype: int, **attrs: object) -> bytes:
    out_shape: list[int] = [] if op.startswith("Reduce") else [1, length]
    node = helper.make_node(op, ["X"], ["Y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", dtype, [1, length])],
        [helper.make_tensor_value_info("Y", dtype, out_shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_budget_from_the_adapter_name() -> None:
    assert loop_budget_for("llvmpipe (LLVM 15.0.6, 256 bits)") == LLVMPIPE_LOOP_BUDGET == 65535
    assert loop_budget_for("NVIDIA H200") is None and loop_budget_for("fake device 0") is None
    limits = DEFAULT_FAKE_LIMITS
    capped, free = DeviceCaps(frozenset(), limits, 65535), DeviceCaps(frozenset(), limits)
    check_loop_budget("ReduceSum", 65534, capped)
    check_loop_budget("ReduceSum", 10**9, free)
    with pytest.raises(
        NotOnDevice,
        match=r"ReduceSum: its kernel would run 65535 loop iterations per invocation.*stops loops after 65535",
    ):
        check_loop_budget("ReduceSum", 65535, capped)


# (op, row length, ONNX dtype, numpy dtype, attributes): each just under and just over llvmpipe's budget
CASES = [
    ("ReduceSum", 65000, TensorProto.INT32, np.int32, {"keepdims": 0}),  # integer rows: one invocation walks the row
    ("ReduceSum", 100000, TensorProto.INT32, np.int32, {"keepdims": 0}),
    ("ReduceSum", 256 * 65000, TensorProto.FLOAT, np.float32, {"keepdims": 0}),  # 256 invocations share a row
    ("ReduceSum", 256 * 65535 + 4099, TensorProto.FLOAT, np.float32, {"keepdims": 0}),
    ("Softmax", 256 * 21000, TensorProto.FLOAT, np.float32, {"axis": -1}),  # three walks over the row
    ("Softmax", 256 * 22000, TensorProto.FLOAT, np.float32, {"axis": -1}),
]


@pytest.mark.parametrize("op, length, dtype, np_dtype, attrs", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_long_rows_run_where_they_give_right_results(
    env: ortgpu_core.Env, op: str, length: int, dtype: int, np_dtype: type, attrs: dict[str, object]
) -> None:
    device = env.default_device
    budget = loop_budget_for(device.name)
    x = np.random.default_rng(0).integers(-3, 4, (1, length)).astype(np_dtype)
    with ortgpu.InferenceSession(_model(op, length, dtype, **attrs), env=env) as session:
        (placement,) = session.get_node_placement()
        (got,) = session.run(None, {"X": x})
        if op == "ReduceSum":
            np.testing.assert_allclose(got, x.sum(dtype=np.float64), rtol=1e-6)
        else:
            shifted = np.exp(x.astype(np.float64) - x.max())
            np.testing.assert_allclose(got, shifted / shifted.sum(), rtol=1e-4, atol=1e-12)
    walks = 3 if op == "Softmax" else 1
    # integer rows: one invocation walks the row; float rows: 256 invocations, plus two halving loops of 9 steps
    per_invocation = length if np_dtype is np.int32 else walks * -(-length // 256) + 18
    over = budget is not None and per_invocation >= budget
    assert placement.placement == ("cpu" if over else "webgpu"), placement
    if over:
        assert "llvmpipe/lavapipe" in placement.reason and "stops loops after 65535" in placement.reason
        with pytest.raises(ortgpu_core.UnsupportedOpError, match="stops loops after 65535"):
            ortgpu.InferenceSession(_model(op, length, dtype, **attrs), env=env, allow_cpu_fallback=False)


def test_long_k_matmul_runs_where_it_gives_right_results(env: ortgpu_core.Env) -> None:
    """[8, 1M] x [1M, 8]: on lavapipe the tiled GEMM's K loop returned 932080 instead of 2097152 for K = 2M."""
    m, k, n = 8, 1 << 20, 8
    node = helper.make_node("MatMul", ["A", "B"], ["Y"])
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [k, n]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    rng = np.random.default_rng(2)
    a = rng.integers(-2, 3, (m, k)).astype(np.float32)
    b = rng.integers(-2, 3, (k, n)).astype(np.float32)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        (placement,) = session.get_node_placement()
        (got,) = session.run(None, {"A": a, "B": b})
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5)
    capped = loop_budget_for(env.default_device.name) is not None
    assert placement.placement == ("cpu" if capped else "webgpu"), placement


def _plans(
    op: str,
    opset: int,
    shapes: list[tuple[int, ...]],
    out: tuple[int, ...],
    attrs: dict[str, object],
    budget: int | None,
) -> None:
    from ortgpu.ops import TensorInfo, get_operator

    f32 = np.dtype(np.float32)
    get_operator(op, opset).plan(
        [TensorInfo(s, f32) for s in shapes],
        [TensorInfo(out, f32)],
        attrs,
        DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS, budget),
        {},
    )


@pytest.mark.parametrize(
    "op, opset, shapes, out, attrs",
    [
        ("MatMul", 13, [(1, 4096), (4096, 6)], (1, 6), {}),  # GEMV (N not a multiple of 4: scalar column loop)
        ("MatMul", 13, [(64, 4096), (4096, 64)], (64, 64), {}),  # tiled GEMM
        ("Conv", 11, [(1, 64, 8, 8), (4, 64, 3, 3)], (1, 4, 6, 6), {}),  # direct kernel (4 output channels)
        ("ConvTranspose", 11, [(1, 64, 4, 4), (64, 2, 3, 3)], (1, 2, 6, 6), {}),
        ("MaxPool", 12, [(1, 1, 40, 40)], (1, 1, 1, 1), {"kernel_shape": [40, 40]}),
        ("Softmax", 13, [(2, 4096)], (2, 4096), {"axis": -1}),
    ],
)
def test_every_looping_kernel_checks_the_budget(
    op: str, opset: int, shapes: list[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, object]
) -> None:
    """With a small budget the plan refuses (NotOnDevice, so the planner places the node on the CPU); without one
    it plans."""
    _plans(op, opset, shapes, out, attrs, None)
    with pytest.raises(NotOnDevice, match="stops loops after 40"):
        _plans(op, opset, shapes, out, attrs, 40)
