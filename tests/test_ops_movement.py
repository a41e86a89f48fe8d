"""Data-movement operators: reference vs onnxruntime CPU, and the device plans vs the reference.

Same method as ``test_ops_elementwise.py`` (whose helpers this module uses):
single-node models on fresh random inputs, onnxruntime's CPU provider as the
judge of the references, the fake and wgpu devices checked against the
references.  Movement kernels copy bits, so every comparison here is exact
for every dtype.
"""

from __future__ import annotations

import gc
from typing import Iterator

import numpy as np
import onnx
import pytest
from test_ops_elementwise import (
    Case,
    bools,
    caps_of,
    check_plan,
    check_reference,
    const,
    floats,
    halves,
    ints,
    open_device,
)

from ortgpu.ops import DeviceCaps, NotOnDevice, TensorInfo, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu_core._errors import InvalidArgumentError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

I64 = np.int64

CASES: list[Case] = [
    # aliases
    Case("Reshape", [floats(2, 3, 4), const([4, -1], I64)], opset=13),
    Case("Reshape", [floats(2, 3, 4), const([0, 0, 2, 2], I64)], opset=14, label="zero-copies"),
    Case("Reshape", [floats(2, 0, 4), const([0, 4], I64)], {"allowzero": 1}, opset=14, label="allowzero"),
    Case("Reshape", [ints(6, dtype=I64), const([3, 2], I64)], opset=5, label="int64"),
    Case("Squeeze", [floats(1, 3, 1, 4)], {"axes": [0, -2]}, opset=11, label="attribute"),
    Case("Squeeze", [floats(1, 3, 1, 4), const([2], I64)], opset=13, label="input"),
    Case("Squeeze", [floats(1, 3, 1, 4)], opset=13, label="all"),
    Case("Unsqueeze", [floats(3, 4)], {"axes": [0, 3]}, opset=11, label="attribute"),
    Case("Unsqueeze", [floats(3, 4), const([-1, 1], I64)], opset=13, label="input"),
    Case("Flatten", [floats(2, 3, 4, 5)], {"axis": 2}),
    Case("Flatten", [floats(2, 3, 4, 5)], {"axis": -1}, opset=13, label="negative"),
    Case("Flatten", [floats(2, 3, 4)], {"axis": 0}, label="zero"),
    Case("Identity", [bools(3, 5)]),
    # Transpose
    Case("Transpose", [floats(2, 3, 4)]),
    Case("Transpose", [floats(2, 3, 4, 5)], {"perm": [0, 2, 1, 3]}, label="bert"),
    Case("Transpose", [ints(3, 5, 7, dtype=I64)], {"perm": [2, 0, 1]}, label="int64"),
    Case("Transpose", [ints(3, 5, 7, low=0, high=256, dtype=np.uint8)], {"perm": [1, 2, 0]}, label="uint8"),
    Case("Transpose", [halves(3, 5, 7)], {"perm": [1, 0, 2]}, label="float16"),
    Case("Transpose", [floats(1, 5, 1, 3)], {"perm": [2, 1, 0, 3]}, label="unit-axes"),
    # Concat
    Case("Concat", [floats(2, 3), floats(2, 5), floats(2, 1)], {"axis": 1}),
    Case("Concat", [floats(2, 3), floats(4, 3)], {"axis": -2}, opset=13, label="negative"),
    Case("Concat", [ints(3, dtype=I64), ints(1, dtype=I64), ints(2, dtype=I64)], {"axis": 0}, label="int64"),
    Case("Concat", [bools(3, 2), bools(3, 5), bools(3, 0)], {"axis": 1}, label="bool-empty"),
    Case("Concat", [halves(2, 3), halves(2, 3)], {"axis": 0}, label="float16"),
    # Split
    Case("Split", [floats(6, 4)], {"axis": 0}, outputs=3, label="even"),
    Case("Split", [floats(4, 7)], {"axis": 1, "split": [2, 5]}, opset=11, outputs=2, label="attribute"),
    Case("Split", [floats(4, 7), const([3, 1, 3], I64)], {"axis": -1}, opset=13, outputs=3, label="input"),
    Case(
        "Split",
        [ints(7, 3, low=0, high=256, dtype=np.uint8)],
        {"axis": 0, "num_outputs": 3},
        opset=18,
        outputs=3,
        label="num-outputs",
    ),
    # Slice
    Case("Slice", [floats(10, 8)], {"starts": [1, 2], "ends": [7, 100], "axes": [0, 1]}, opset=9, label="attributes"),
    Case(
        "Slice",
        [floats(10, 8), const([1], I64), const([-2], I64)],
        opset=13,
        constants=frozenset({1, 2}),
        label="default-axes",
    ),
    Case(
        "Slice",
        [floats(10, 8, 6), const([-1, 1], I64), const([-100, 7], I64), const([0, 2], I64), const([-2, 2], I64)],
        opset=13,
        constants=frozenset({1, 2, 3, 4}),
        label="negative-steps",
    ),
    Case(
        "Slice",
        [ints(9, 5, dtype=I64), const([8], I64), const([-100], I64), const([0], I64), const([-3], I64)],
        opset=13,
        constants=frozenset({1, 2, 3, 4}),
        label="int64-reverse",
    ),
    Case(
        "Slice",
        [bools(11, 3), const([1], np.int32), const([10], np.int32), const([0], np.int32), const([3], np.int32)],
        opset=13,
        constants=frozenset({1, 2, 3, 4}),
        label="bool-int32-args",
    ),
    Case(
        "Slice",
        [floats(10, 8), const([1], I64), const([5], I64)],
        opset=13,
        constants=frozenset({2}),
        on_device=False,
        label="runtime-starts",
    ),
    # Gather
    Case("Gather", [floats(50, 16), ints(3, 7, low=-50, high=50, dtype=I64)], label="embedding"),
    Case("Gather", [floats(50, 16), ints(9, low=0, high=50)], label="int32-indices"),
    Case("Gather", [floats(4, 6, 5), ints(2, 2, low=-6, high=6, dtype=I64)], {"axis": 1}, label="axis1"),
    Case("Gather", [ints(5, dtype=I64), const(-1, I64)], {"axis": 0}, label="int64-scalar-index"),
    Case(
        "Gather",
        [ints(3, 4, low=0, high=256, dtype=np.uint8), ints(5, low=-4, high=4, dtype=I64)],
        {"axis": -1},
        opset=13,
        label="uint8",
    ),
    # Expand, Tile
    Case("Expand", [floats(3, 1), const([2, 3, 4], I64)]),
    Case("Expand", [floats(3, 4), const([3, 1], I64)], label="smaller-shape"),
    Case("Expand", [bools(1, 5), const([3, 1, 5], I64)], label="bool"),
    Case("Expand", [ints(4, 1, dtype=I64), const([4, 6], I64)], label="int64"),
    Case("Tile", [floats(2, 3), const([2, 3], I64)]),
    Case("Tile", [ints(3, 1, 2, low=0, high=256, dtype=np.uint8), const([1, 4, 3], I64)], label="uint8"),
    # Where is tested with the elementwise ops; Shape, Constant, ConstantOfShape, Range
    Case("Shape", [floats(2, 3, 4)], on_device=False),
    Case("Shape", [floats(2, 3, 4, 5)], {"start": 1, "end": -1}, opset=15, on_device=False, label="start-end"),
    Case("Shape", [floats(2, 3, 4, 5)], {"start": -10}, opset=15, on_device=False, label="clamped"),
    Case("ConstantOfShape", [const([2, 3], I64)], on_device=False, label="default"),
    Case(
        "ConstantOfShape",
        [const([4], I64)],
        {"value": onnx.helper.make_tensor("value", onnx.TensorProto.INT32, [1], [7])},
        on_device=False,
        label="int32",
    ),
    Case(
        "Constant",
        [],
        {"value": onnx.helper.make_tensor("value", onnx.TensorProto.FLOAT, [2], [1.5, 2.0])},
        on_device=False,
    ),
    Case("Constant", [], {"value_ints": [1, 2, 3]}, opset=13, on_device=False, label="ints"),
    Case("Constant", [], {"value_float": 0.25}, opset=13, on_device=False, label="float"),
    Case("Range", [const(1.0, np.float32), const(9.0, np.float32), const(0.75, np.float32)], label="float"),
    Case("Range", [const(10, np.int32), const(-7, np.int32), const(-3, np.int32)], label="int32"),
    Case("Range", [const(0, I64), const(5, I64), const(1, I64)], on_device=False, label="int64"),
    Case("Range", [const(3, np.int32), const(3, np.int32), const(1, np.int32)], label="empty"),
]


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def op_device(backend_name: str) -> Iterator[BackendDevice]:
    device = open_device(backend_name)
    try:
        yield device
        gc.collect()
        assert device.live_handles() == 0, "operator tests leaked device objects"
    finally:
        device.destroy()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_matches_onnxruntime(case: Case) -> None:
    check_reference(case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_matches_reference(case: Case, op_device: BackendDevice) -> None:
    check_plan(case, op_device)


def test_aliases_need_no_kernel(op_device: BackendDevice) -> None:
    caps = caps_of(op_device)
    info = TensorInfo((2, 3), np.dtype(np.float32))
    for op_type in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"):
        plan = get_operator(op_type, 13).plan([info, None], [info], {}, caps, {})
        assert plan.kernels == () and dict(plan.alias) == {0: 0}, op_type


def test_gather_reads_indices_at_run_time(op_device: BackendDevice) -> None:
    """One plan, several index tensors: the embedding lookup of a session that is replayed."""
    operator = get_operator("Gather", 13)
    rng = np.random.default_rng()
    table = rng.standard_normal((30, 8)).astype(np.float32)
    index_info = TensorInfo((4,), np.dtype(np.int64))
    infos = [TensorInfo(table.shape, table.dtype), index_info]
    out = [TensorInfo((4, 8), table.dtype)]
    plan = operator.plan(infos, out, {}, caps_of(op_device), {})
    for _ in range(3):
        indices = rng.integers(-30, 30, 4).astype(np.int64)
        (result,) = run_plan(op_device, plan, [table, indices], out)
        np.testing.assert_array_equal(result, table[indices])


def test_large_gather_uses_a_two_dimensional_grid() -> None:
    """65535 * 256 elements and more: a 2-D grid (fake device: twins run; the grid is checked)."""
    from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

    caps = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
    infos = [TensorInfo((70_000, 256), np.dtype(np.float32)), TensorInfo((70_000,), np.dtype(np.int32))]
    out = [TensorInfo((70_000, 256), np.dtype(np.float32))]
    (kernel,) = get_operator("Gather", 13).plan(infos, out, {}, caps, {}).kernels
    assert kernel.grid[0] <= 65535 and kernel.grid[1] > 1


def test_concat_beyond_the_binding_limit_runs_on_the_cpu() -> None:
    from ortgpu_core.backends.fake import fake_limits

    caps = DeviceCaps(frozenset(), fake_limits(max_storage_buffers_per_shader_stage=8))
    infos = [TensorInfo((2, 2), np.dtype(np.float32))] * 8
    with pytest.raises(NotOnDevice, match="Concat"):
        get_operator("Concat", 13).plan(infos, [TensorInfo((2, 16), np.dtype(np.float32))], {"axis": 1}, caps, {})


def test_unsupported_variants_name_the_op() -> None:
    with pytest.raises(UnsupportedOpError, match="Constant"):
        get_operator("Constant", 13).reference([], {"value_string": "text"}, [])
    with pytest.raises(UnsupportedOpError, match="Slice"):
        get_operator("Slice", 13).reference(
            [np.zeros(3, np.float32), np.array([0]), np.array([1]), np.array([0]), np.array([0])], {}, []
        )
    with pytest.raises(InvalidArgumentError, match="Gather"):  # invalid data, not an unsupported variant
        get_operator("Gather", 13).reference([np.zeros(3, np.float32), np.array([3])], {}, [])
    with pytest.raises(NotOnDevice, match="Shape"):
        from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

        info = TensorInfo((2,), np.dtype(np.float32))
        get_operator("Shape", 13).plan(
            [info], [TensorInfo((1,), np.dtype(np.int64))], {}, DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS), {}
        )
