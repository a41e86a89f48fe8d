"""Softmax and LogSoftmax rows at their edges, on both backends, against the float64 reference.

The edges: rows as long as a workgroup's 256 invocations take at 8 elements each and one longer, Whisper's 1500 keys
along a strided axis, a single element, ViT-B/16's odd 197 keys, rows short enough that a workgroup holds several,
and masked attention rows: -inf entries (probability 0, log-probability -inf) and rows that are all -inf (NaN, 0 / 0,
as onnxruntime's definition gives), float16 rows loaded into f32 and rounded once.  The reference, which is also the
fake backend's twin, warns of nothing on any of them.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest
from test_ops_compute import assert_close
from test_ops_elementwise import open_device

from ortgpu.ops import DeviceCaps, TensorInfo, get_operator
from ortgpu.ops._runner import run_plan

RNG = np.random.default_rng(20261207)


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def device(request: pytest.FixtureRequest) -> Iterator[Any]:
    dev = open_device(str(request.param))  # lavapipe in CI: no adapter is a failure, not a skip
    yield dev
    dev.destroy()


def _run(device: Any, op: str, x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(device output, reference) of ``op`` over ``axis``; the reference must not warn."""
    operator = get_operator(op, 13)
    attrs = {"axis": axis}
    info = TensorInfo(tuple(x.shape), x.dtype)
    plan = operator.plan([info], [info], attrs, DeviceCaps(frozenset(device.features), device.limits), {})
    assert plan.kernels, "the node did not plan onto the device"
    before = device.live_handles()
    (got,) = run_plan(device, plan, [x], [info])
    assert device.live_handles() == before
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # (underflow to 0 is the rounding asked for)
        want = operator.reference([x], attrs, [])[0]
    return np.asarray(got), want


SHAPES: list[tuple[tuple[int, ...], int]] = [
    ((3, 2048), -1),  # 256 invocations x 8 elements
    ((2, 2049), -1),  # one element more
    ((2, 1500, 3), 1),  # Whisper's key length, along a strided axis
    ((5, 1), -1),  # one element a row
    ((4, 7, 197), -1),  # ViT-B/16's 197 keys, an odd length
    ((6, 33), 0),  # rows shorter than a workgroup's share, several rows per workgroup
]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_rows_at_their_edges(device: Any, op: str, shape: tuple[int, ...], axis: int) -> None:
    got, want = _run(device, op, (RNG.standard_normal(shape) * 4).astype(np.float32), axis)
    assert_close(got, want)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_masked_rows(device: Any, op: str) -> None:
    x = (RNG.standard_normal((4, 300)) * 3).astype(np.float32)
    x[0, ::3] = -np.inf
    x[1, 150:] = -np.inf
    x[2, :] = -np.inf
    x[3, :] = -3.0e38
    got, want = _run(device, op, x, -1)
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


def test_float16_rows(device: Any) -> None:
    assert "shader-f16" in device.features  # both test devices have it (lavapipe, the fake backend's default)
    got, want = _run(device, "Softmax", (RNG.standard_normal((3, 1500)) * 4).astype(np.float16), -1)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-4, rtol=2e-3)
