"""Softmax and LogSoftmax rows held in registers against rows read in every pass.

A row of at most ``CACHED_PER_INVOCATION`` elements per invocation is read once and kept in registers; a longer one
is read in each of the three passes.  Both paths compute the same expressions in the same order, so on one device
they must give the same bits; both must match the float64 reference.  The edges: rows just inside and just past
the cached length, rows along a strided axis, a single element, rows that are all -inf or hold -inf entries (a
masked attention row), float16 rows, and LogSoftmax's large negative values.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest
from test_ops_compute import assert_close

from ortgpu.ops import DeviceCaps, TensorInfo, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu.ops.ai_onnx import softmax as softmax_module
from ortgpu_core.backends.fake import FakeBackend

RNG = np.random.default_rng(20261207)


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def device(request: pytest.FixtureRequest) -> Iterator[Any]:
    dev: Any
    if request.param == "fake":
        dev = FakeBackend().open_device(0)
    else:
        from ortgpu_core.backends.wgpu_native import WgpuBackend

        backend = WgpuBackend()  # no adapter is a failure, not a skip: CI has lavapipe
        dev = backend.open_device(backend.default_adapter_index())
    yield dev
    dev.destroy()


def _run(device: Any, op: str, x: np.ndarray, axis: int, cached: int, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """Plan ``op`` over ``axis`` with rows cached up to ``cached`` elements per invocation, run it, and return y."""
    monkeypatch.setattr(softmax_module, "CACHED_PER_INVOCATION", cached)
    operator = get_operator(op, 13)
    attrs = {"axis": axis}
    info = TensorInfo(tuple(x.shape), x.dtype)
    plan = operator.plan([info], [info], attrs, DeviceCaps(frozenset(device.features), device.limits), {})
    wgsl = "\n".join(kernel.wgsl for kernel in plan.kernels)
    assert ("var held" in wgsl) == (cached > 0), "the plan did not take the path asked for"
    before = device.live_handles()
    (got,) = run_plan(device, plan, [x], [info])
    assert device.live_handles() == before
    return np.asarray(got)


def _both_paths(device: Any, op: str, x: np.ndarray, axis: int, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    cached = _run(device, op, x, axis, 1 << 20, monkeypatch)
    read_each_pass = _run(device, op, x, axis, 0, monkeypatch)
    np.testing.assert_array_equal(cached, read_each_pass)
    return cached


SHAPES: list[tuple[tuple[int, ...], int]] = [
    ((3, 2048), -1),  # 8 per invocation at 256 invocations: the longest cached row by default
    ((2, 2049), -1),  # 9 per invocation: read in every pass by default
    ((2, 1500, 3), 1),  # Whisper's key length, along a strided axis
    ((5, 1), -1),  # one element a row
    ((4, 7, 197), -1),  # ViT-B/16's 197 keys, an odd length
    ((6, 33), 0),  # rows shorter than a workgroup's share, several rows per workgroup
]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_cached_and_uncached_rows_agree_bit_for_bit(
    device: Any, op: str, shape: tuple[int, ...], axis: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    got = _both_paths(device, op, x, axis, monkeypatch)
    want = get_operator(op, 13).reference([x], {"axis": axis}, [])[0]
    assert_close(got, want)


def test_default_bound_caches_2048_and_reads_2049(device: Any) -> None:
    """The default keeps rows of 2048 elements in registers (256 invocations x 8) and reads longer ones per pass."""
    caps = DeviceCaps(frozenset(device.features), device.limits)
    for length, held in ((2048, True), (2049, False)):
        info = TensorInfo((2, length), np.dtype(np.float32))
        plan = get_operator("Softmax", 13).plan([info], [info], {"axis": -1}, caps, {})
        assert ("var held" in plan.kernels[0].wgsl) == held, length


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_masked_rows(device: Any, op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """-inf entries (an attention mask) get probability 0 / log-probability -inf; a row that is all -inf gives the
    same NaNs on both paths as onnxruntime's definition does (0 / 0)."""
    x = (RNG.standard_normal((4, 300)) * 3).astype(np.float32)
    x[0, ::3] = -np.inf
    x[1, 150:] = -np.inf
    x[2, :] = -np.inf
    x[3, :] = -3.0e38
    got = _both_paths(device, op, x, -1, monkeypatch)
    with np.errstate(all="raise"):  # the reference (the fake backend's twin) warns of nothing here
        want = get_operator(op, 13).reference([x], {"axis": -1}, [])[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    assert_close(got[finite], want[finite])
    assert np.all(np.isnan(got[2]))
    if op == "Softmax":
        assert np.all(got[0, ::3] == 0) and np.all(got[1, 150:] == 0)
        np.testing.assert_allclose(got[[0, 1, 3]].sum(axis=-1), 1.0, rtol=1e-5)
    else:
        assert np.all(np.isneginf(got[0, ::3])) and np.all(np.isneginf(got[1, 150:]))


def test_float16_rows(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """float16 rows (where the device has shader-f16): loaded into f32, rounded once, on both paths alike."""
    assert "shader-f16" in device.features  # both test devices have it (lavapipe, the fake backend's default)
    x = (RNG.standard_normal((3, 1500)) * 4).astype(np.float16)
    got = _both_paths(device, "Softmax", x, -1, monkeypatch)
    want = get_operator("Softmax", 13).reference([x], {"axis": -1}, [])[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-4, rtol=2e-3)
