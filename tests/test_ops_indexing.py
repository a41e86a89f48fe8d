"""Indexing operators: references vs onnxruntime CPU, device plans vs references, and whole sessions.

Same method as ``test_ops_elementwise.py`` (whose helpers this module uses):
single-node models on fresh random inputs judged by onnxruntime's CPU provider,
and each node planned for the fake and wgpu devices.  GatherElements (constant
indices) and Trilu have kernels; the others must say they run on the CPU.
Sessions check the data-dependent output sizes (NonZero, Unique, Compress,
NonMaxSuppression) and the typed errors for out-of-range indices.
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import numpy as np
import onnx
import onnx.helper
import pytest
from test_ops_elementwise import (
    NUMPY_ORACLES,
    Case,
    absent,
    bools,
    check_plan,
    check_reference,
    const,
    floats,
    halves,
    ints,
    open_device,
)

import ortgpu
from ortgpu.ops import get_operator
from ortgpu_core._errors import InvalidArgumentError, ModelError, OrtGpuError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

I64 = np.int64
U8 = np.uint8


def distinct_rows(rows: int, shape: tuple[int, ...]) -> Any:
    """Indices along axis 0 with no duplicates within a column (scatters without reduction are then defined)."""

    def make(rng: np.random.Generator) -> np.ndarray:
        columns = int(np.prod(shape[1:]))
        picked = np.stack([rng.permutation(rows)[: shape[0]] for _ in range(columns)], axis=1)
        signs = rng.random(picked.shape) < 0.5
        return np.where(signs, picked - rows, picked).reshape(shape).astype(I64)

    return make


def boxes(batches: int, count: int) -> Any:
    def make(rng: np.random.Generator) -> np.ndarray:
        corner = rng.uniform(0, 10, (batches, count, 2))
        size = rng.uniform(1, 4, (batches, count, 2))
        return np.concatenate([corner, corner + size], axis=-1).astype(np.float32)

    return make


POOL = {
    "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7],
    "ngram_counts": [0, 4],
    "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
    "min_gram_length": 1,
    "max_gram_length": 2,
    "max_skip_count": 2,
}

CASES: list[Case] = [
    # GatherElements: a kernel for constant indices and for run-time ones (checked by the kernel: status flag)
    Case("GatherElements", [floats(3, 4), ints(2, 4, low=-3, high=3, dtype=I64)], opset=13),
    Case(
        "GatherElements",
        [ints(4, 5, 6, dtype=I64), ints(3, 2, 9, low=-6, high=6)],
        {"axis": -1},
        opset=13,
        label="runtime-int32-int64-last-axis-smaller",
    ),
    Case(
        "GatherElements",
        [halves(5, 3), ints(7, 3, low=-5, high=5, dtype=I64)],
        opset=13,
        label="runtime-float16",
    ),
    Case(
        "GatherElements",
        [ints(3, 7, low=0, high=256, dtype=U8), ints(3, 5, low=-7, high=7)],
        {"axis": 1},
        opset=11,
        label="runtime-uint8",
    ),
    Case("GatherElements", [floats(3, 4), ints(0, 4, low=0, high=3, dtype=I64)], opset=13, label="runtime-empty"),
    Case(
        "GatherElements",
        [floats(3, 4), ints(2, 4, low=-3, high=3, dtype=I64)],
        opset=13,
        constants=frozenset({1}),
        label="constant",
    ),
    Case(
        "GatherElements",
        [ints(4, 5, 6, dtype=I64), ints(3, 2, 9, low=-6, high=6)],
        {"axis": -1},
        opset=13,
        constants=frozenset({1}),
        label="int64-last-axis-smaller",
    ),
    Case(
        "GatherElements",
        [halves(5, 3), ints(7, 3, low=0, high=5, dtype=I64)],
        opset=13,
        constants=frozenset({1}),
        label="float16",
    ),
    Case(
        "GatherElements",
        [ints(3, 7, low=0, high=256, dtype=U8), ints(3, 5, low=-7, high=7)],
        {"axis": 1},
        opset=11,
        constants=frozenset({1}),
        label="uint8",
    ),
    Case(
        "GatherElements",
        [floats(3, 4), ints(0, 4, low=0, high=3, dtype=I64)],
        opset=13,
        constants=frozenset({1}),
        label="empty",
    ),
    # Trilu
    Case("Trilu", [floats(2, 4, 5)], opset=14),
    Case("Trilu", [floats(5, 3), const(-1, I64)], {"upper": 0}, opset=14, constants=frozenset({1}), label="lower"),
    Case("Trilu", [floats(4, 6), const(2, I64)], opset=14, label="runtime-k"),
    Case("Trilu", [ints(3, 4, dtype=I64), const(-2, I64)], {"upper": 0}, opset=14, label="int64-runtime-k"),
    # onnxruntime has no uint8/float16/bool Trilu: numpy's triu/tril judge (NUMPY_ORACLES below)
    Case(
        "Trilu",
        [ints(3, 5, 7, low=0, high=256, dtype=U8), const(1, I64)],
        opset=14,
        label="uint8",
        in_onnxruntime=False,
    ),
    Case("Trilu", [halves(3, 5), const(-1, I64)], {"upper": 0}, opset=14, label="float16", in_onnxruntime=False),
    Case("Trilu", [bools(4, 5)], {"upper": 0}, opset=14, label="bool", in_onnxruntime=False),
    Case("Trilu", [floats(3, 4), const(2**40, I64)], opset=14, label="huge-k"),
    Case("Trilu", [floats(3, 4), const(-(2**40), I64)], {"upper": 0}, opset=14, label="huge-negative-k"),
    Case("Trilu", [floats(2, 0, 3)], opset=14, label="empty"),
    # scatters: run-time indices on the device (checked by the kernel: status flag), reductions where exact
    Case(
        "ScatterElements",
        [floats(5, 3), distinct_rows(5, (2, 3)), floats(2, 3)],
        opset=18,
    ),
    *[
        Case(
            "ScatterElements",
            [floats(4, 5), ints(4, 3, low=-5, high=5, dtype=I64), floats(4, 3)],
            {"axis": -1, "reduction": reduction},
            opset=18,
            on_device=reduction in ("add", "mul"),
            label=reduction,
        )
        for reduction in ("add", "mul", "max", "min")
    ],
    Case(
        "ScatterElements",
        [ints(4, 5), ints(6, 5, low=0, high=4, dtype=I64), ints(6, 5)],
        {"reduction": "add"},
        opset=16,
        label="int32-add",
    ),
    Case("Scatter", [floats(5, 3), distinct_rows(5, (2, 3)), floats(2, 3)], opset=10),
    Case(
        "ScatterElements",
        [halves(3, 7), const([[6, -1], [0, 2], [3, -4]], np.int32), halves(3, 2)],
        {"axis": 1},
        opset=13,
        label="runtime-int32-float16-axis1",
    ),
    Case(
        "ScatterElements",
        [ints(6, 4, 3, dtype=I64), distinct_rows(6, (4, 2, 3)), ints(4, 2, 3, dtype=I64)],
        opset=16,
        label="runtime-int64-smaller",
    ),
    # duplicates without a reduction: the last in index order wins (deterministic: one invocation per element)
    Case(
        "ScatterElements",
        [floats(4, 2), const([[1, 0], [1, 3], [1, 0]], I64), floats(3, 2)],
        opset=18,
        label="runtime-duplicates",
        in_onnxruntime=False,
    ),
    # reductions with constant indices: a kernel for integers and float32 add/mul, the CPU for float max/min
    *[
        Case(
            "ScatterElements",
            [floats(4, 5), ints(4, 3, low=-5, high=5, dtype=I64), floats(4, 3)],
            {"axis": -1, "reduction": reduction},
            opset=18,
            constants=frozenset({1}),
            on_device=reduction in ("add", "mul"),
            label=f"constant-{reduction}",
        )
        for reduction in ("add", "mul", "max", "min")
    ],
    *[
        Case(
            "ScatterElements",
            [
                ints(6, 5, low=low, high=high, dtype=dtype),
                ints(9, 5, low=0, high=6, dtype=I64),
                ints(9, 5, low=low, high=high, dtype=dtype),
            ],
            {"reduction": reduction},
            opset=18,
            constants=frozenset({1}),
            label=f"constant-{np.dtype(dtype).name}-{reduction}",
        )
        for dtype, low, high, reduction in (
            (np.int32, -(2**31), 2**31, "add"),
            (np.int32, -50000, 50000, "mul"),
            (U8, 0, 256, "max"),
            (np.int8, -128, 128, "min"),
        )
    ],
    *[
        Case(
            "ScatterND",
            [floats(4, 5), const([[1], [3], [1]], I64), floats(3, 5)],
            {"reduction": reduction},
            opset=18,
            constants=frozenset({1}),
            on_device=reduction in ("add", "mul"),
            label=f"constant-{reduction}",
        )
        for reduction in ("add", "mul", "max", "min")
    ],
    Case(
        "ScatterND",
        [ints(4, 5), const([[1, 2], [1, 2], [0, 0], [1, 2]], I64), ints(4)],
        {"reduction": "add"},
        opset=16,
        constants=frozenset({1}),
        label="constant-int32-elements-add",
    ),
    Case(
        "ScatterElements",
        [floats(5, 3), distinct_rows(5, (2, 3)), floats(2, 3)],
        opset=18,
        constants=frozenset({1}),
        label="constant",
    ),
    Case(
        "ScatterElements",
        [ints(6, 4, 3, dtype=I64), distinct_rows(6, (4, 2, 3)), ints(4, 2, 3, dtype=I64)],
        opset=16,
        constants=frozenset({1}),
        label="constant-int64-smaller",
    ),
    Case(
        "ScatterElements",
        [halves(3, 7), const([[6, -1], [0, 2], [3, -4]], I64), halves(3, 2)],
        {"axis": 1},
        opset=13,
        constants=frozenset({1}),
        label="constant-float16-axis1",
    ),
    Case(
        "Scatter",
        [floats(5, 3), distinct_rows(5, (2, 3)), floats(2, 3)],
        opset=10,
        constants=frozenset({1}),
        label="constant",
    ),
    Case(
        "ScatterND",
        [floats(4, 5, 6), const([[0, 1], [3, -2]], I64), floats(2, 6)],
        opset=18,
        constants=frozenset({1}),
        label="constant",
    ),
    Case(
        "ScatterND",
        [
            ints(4, 5, low=0, high=256, dtype=U8),
            const([[1, 2], [3, 4], [0, 0]], I64),
            ints(3, low=0, high=256, dtype=U8),
        ],
        opset=11,
        constants=frozenset({1}),
        label="constant-uint8-elements",
    ),
    Case(
        "ScatterND",
        [ints(3, 2, 4, dtype=I64), const([[2], [0]], I64), ints(2, 2, 4, dtype=I64)],
        opset=13,
        constants=frozenset({1}),
        label="constant-int64-rows",
    ),
    # duplicate destinations without a reduction: ONNX leaves them undefined; here (and in onnxruntime) the last wins
    Case(
        "ScatterND",
        [floats(4, 3), const([[1], [2], [1]], I64), floats(3, 3)],
        opset=11,
        constants=frozenset({1}),
        label="constant-duplicates",
        in_onnxruntime=False,
    ),
    Case(
        "ScatterND",
        [floats(4, 5, 6), const([[0, 1], [3, -2]], I64), floats(2, 6)],
        opset=18,
    ),
    Case(
        "ScatterND",
        [
            ints(4, 5, low=0, high=256, dtype=U8),
            const([[1, 2], [3, 4], [0, 0]], I64),
            ints(3, low=0, high=256, dtype=U8),
        ],
        opset=11,
        label="runtime-uint8-elements",
    ),
    Case(
        "ScatterND",
        [floats(4, 3), const([[1], [2], [1]], I64), floats(3, 3)],
        opset=11,
        label="runtime-duplicates",
        in_onnxruntime=False,
    ),
    Case(
        "ScatterND",
        [ints(4, 5), const([[1, 2], [1, 2], [0, 0], [1, 2]], I64), ints(4)],
        {"reduction": "add"},
        opset=16,
        label="runtime-int32-elements-add",
    ),
    Case(
        "ScatterND",
        [floats(2, 0), const([[1], [0]], I64), floats(2, 0)],
        opset=11,
        on_device=False,
        label="runtime-empty-slices",
    ),
    *[
        Case(
            "ScatterND",
            [floats(4, 5), const([[1], [3], [1]], I64), floats(3, 5)],
            {"reduction": reduction},
            opset=18,
            on_device=reduction in ("add", "mul"),
            label=reduction,
        )
        for reduction in ("add", "mul", "max", "min")
    ],
    Case(
        "ScatterND",
        [ints(4, 5, dtype=I64), const([[1, 2], [1, 2], [0, 0]], I64), ints(3, dtype=I64)],
        {"reduction": "add"},
        opset=16,
        on_device=False,  # 64-bit reductions stay on the CPU
        label="elements-int64",
    ),
    # OneHot (a kernel once depth is known), GatherND (a kernel; run-time indices flag), EyeLike (a kernel)
    Case(
        "OneHot",
        [ints(2, 3, low=-6, high=8, dtype=I64), const(5, I64), const([0.0, 3.0], np.float32)],
        opset=11,
        constants=frozenset({1}),
    ),
    Case(
        "OneHot",
        [ints(2, 3, low=-6, high=8, dtype=I64), const(5, I64), const([0.0, 3.0], np.float32)],
        opset=11,
        on_device=False,
        label="runtime-depth",
    ),
    Case(
        "OneHot",
        [ints(2, 3, low=-4, high=4, dtype=I64), const(4, np.float32), const([2, 7], np.int32)],
        {"axis": 1},
        opset=11,
        constants=frozenset({1}),
        label="axis",
    ),
    Case(
        "OneHot",
        [floats(3, low=-3.0, high=4.0), const([3], np.float32), const([-1, 1], np.float32)],
        {"axis": -2},
        opset=11,
        constants=frozenset({1}),
        label="negative-axis",
    ),
    Case(
        "OneHot",
        [
            const([2**32 + 1, -(2**32) + 2, 3, -1, 2**40, -(2**33) - 1], I64),
            const(5, I64),
            const([0, 9], I64),
        ],
        opset=11,
        constants=frozenset({1}),
        label="wide-int64-indices",
    ),
    Case(
        "OneHot",
        [ints(4, 2, low=-3, high=3), const(3, I64), const([False, True], np.bool_)],
        {"axis": 0},
        opset=11,
        constants=frozenset({1}),
        label="int32-bool",
        in_onnxruntime=False,
    ),
    Case("GatherND", [floats(2, 3, 4), const([[1, -1], [0, 2]], I64)], opset=13),
    Case(
        "GatherND",
        [halves(2, 3, 4, 5), const([[[1, -2], [0, 0], [2, 1]], [[0, 3], [1, 1], [2, 2]]], I64)],
        {"batch_dims": 1},
        opset=13,
        label="runtime-batch-dims-float16-slices",
    ),
    Case(
        "GatherND",
        [ints(3, 4, low=0, high=256, dtype=U8), ints(5, 1, low=-3, high=3, dtype=I64)],
        opset=11,
        label="runtime-uint8-rows",
    ),
    Case(
        "GatherND",
        [floats(3, 0), const([[2], [0]], I64)],
        opset=11,
        on_device=False,
        label="runtime-empty-slices",
    ),
    Case(
        "GatherND",
        [floats(2, 3, 4), const([[1, -1], [0, 2]], I64)],
        opset=13,
        constants=frozenset({1}),
        label="constant",
    ),
    Case(
        "GatherND",
        [ints(2, 3, 4), const([[[1, 3]], [[2, 0]]], I64)],
        {"batch_dims": 1},
        opset=13,
        constants=frozenset({1}),
        label="batch-dims",
    ),
    Case(
        "GatherND",
        [halves(2, 3, 4, 5), const([[[1, -2], [0, 0], [2, 1]], [[0, 3], [1, 1], [2, 2]]], I64)],
        {"batch_dims": 1},
        opset=13,
        constants=frozenset({1}),
        label="batch-dims-float16-slices",
    ),
    Case(
        "GatherND",
        [floats(3, 4), const([[2, 3], [0, 0], [1, 2]], I64)],
        opset=11,
        constants=frozenset({1}),
        label="elements",
    ),
    Case(
        "GatherND",
        [ints(3, 4, low=0, high=256, dtype=U8), const([[2], [0]], I64)],
        opset=11,
        constants=frozenset({1}),
        label="uint8-rows",
    ),
    Case("EyeLike", [floats(3, 5)], {"k": 1}, opset=9),
    Case("EyeLike", [ints(4, 3)], {"k": -2, "dtype": onnx.TensorProto.DOUBLE}, opset=9, label="double"),
    Case("EyeLike", [floats(2, 3)], {"k": 5}, opset=9, label="off-matrix"),
    Case("EyeLike", [ints(5, 4, dtype=I64)], {"k": -1}, opset=9, label="int64"),
    Case(
        "EyeLike",
        [floats(5, 7)],
        {"k": 2, "dtype": onnx.TensorProto.UINT8},
        opset=9,
        label="uint8",
        in_onnxruntime=False,
    ),
    Case(
        "EyeLike", [floats(3, 3)], {"dtype": onnx.TensorProto.FLOAT16}, opset=9, label="float16", in_onnxruntime=False
    ),
    Case("EyeLike", [floats(3, 3)], {"dtype": onnx.TensorProto.UINT64}, opset=9, label="uint64", in_onnxruntime=False),
    # data-dependent sizes (CPU)
    Case("Compress", [floats(3, 4), bools(3)], {"axis": 0}, opset=11, on_device=False),
    Case("Compress", [floats(3, 4), bools(5)], opset=11, on_device=False, label="flattened"),
    Case("Compress", [ints(2, 5, dtype=I64), bools(5)], {"axis": -1}, opset=11, on_device=False, label="negative-axis"),
    Case("NonZero", [ints(3, 4, low=-1, high=2)], opset=13, on_device=False),
    Case("NonZero", [bools(2, 3, 4)], opset=13, on_device=False, label="bool"),
    Case("Unique", [ints(12, low=0, high=5, dtype=I64)], opset=11, outputs=4, on_device=False),
    Case("Unique", [floats(9)], {"sorted": 0}, opset=11, outputs=4, on_device=False, label="unsorted"),
    Case(
        "Unique",
        [lambda rng: rng.integers(0, 2, (6, 2)).astype(np.float32)],
        {"axis": 0},
        opset=11,
        outputs=4,
        on_device=False,
        label="axis",
    ),
    Case(
        "Unique",
        [lambda rng: rng.integers(0, 2, (2, 6)).astype(I64)],
        {"axis": -1, "sorted": 0},
        opset=11,
        outputs=4,
        on_device=False,
        label="negative-axis-unsorted",
    ),
    Case(
        "NonMaxSuppression",
        [boxes(2, 8), floats(2, 3, 8, low=0, high=1), const(3, I64), const(0.3, np.float32), const(0.2, np.float32)],
        opset=11,
        on_device=False,
    ),
    Case(
        "NonMaxSuppression",
        [boxes(1, 10), floats(1, 2, 10, low=0, high=1), const(10, I64), const(0.1, np.float32)],
        {"center_point_box": 1},
        opset=11,
        on_device=False,
        label="center",
    ),
    Case(
        "NonMaxSuppression",
        [boxes(1, 4), floats(1, 1, 4)],
        opset=11,
        on_device=False,
        label="no-limit",
    ),
    Case(
        "ReverseSequence",
        [floats(4, 3, 2), const([4, 1, 2], I64)],
        opset=10,
    ),
    Case(
        "ReverseSequence",
        [ints(3, 5, dtype=I64), const([0, 5, 3], I64)],
        {"batch_axis": 0, "time_axis": 1},
        opset=10,
        label="runtime-batch-first",
    ),
    Case(
        "ReverseSequence",
        [floats(0, 3, 2), const([0, 0, 0], I64)],
        opset=10,
        on_device=False,
        label="runtime-empty",
    ),
    Case(
        "ReverseSequence",
        [floats(4, 3, 2), const([4, 1, 2], I64)],
        opset=10,
        constants=frozenset({1}),
        label="constant",
    ),
    Case(
        "ReverseSequence",
        [ints(3, 5, dtype=I64), const([0, 5, 3], I64)],
        {"batch_axis": 0, "time_axis": 1},
        opset=10,
        constants=frozenset({1}),
        label="batch-first",
    ),
    Case(
        "ReverseSequence",
        [ints(5, 2, 3, 3, low=-128, high=128, dtype=np.int8), const([3, 5], I64)],
        opset=10,
        constants=frozenset({1}),
        label="int8-4d",
        in_onnxruntime=False,
    ),
    *[
        Case(
            "TfIdfVectorizer",
            [ints(2, 9, low=2, high=9, dtype=I64)],
            dict(POOL, mode=mode, weights=[0.5, 1.0, 2.0, 1.5, 0.25, 3.0, 1.0]),
            opset=9,
            on_device=False,
            label=mode,
        )
        for mode in ("TF", "IDF", "TFIDF")
    ],
    Case(
        "TfIdfVectorizer",
        [ints(11, low=2, high=9)],
        dict(POOL, min_gram_length=2, max_skip_count=0, mode="TF"),
        opset=9,
        on_device=False,
        label="1d-bigrams",
    ),
]


NUMPY_ORACLES.update(
    {
        "Trilu-opset14-uint8": lambda x, k: np.triu(x, int(k)),
        "Trilu-opset14-float16": lambda x, k: np.tril(x, int(k)),
        "Trilu-opset14-bool": lambda x: np.tril(x),
        "OneHot-opset11-int32-bool": lambda i, depth, values: np.where(
            np.arange(3)[:, None, None] == np.where(i < 0, i + 3, i)[None], values[1], values[0]
        ),
        "EyeLike-opset9-uint64": lambda x: np.eye(3, dtype=np.uint64),
        "ScatterND-opset11-constant-duplicates": lambda data, indices, updates: np.concatenate(
            [data[:1], updates[2:3], updates[1:2], data[3:]]
        ),
        "ScatterND-opset11-runtime-duplicates": lambda data, indices, updates: np.concatenate(
            [data[:1], updates[2:3], updates[1:2], data[3:]]
        ),
        "ScatterElements-opset18-runtime-duplicates": lambda data, indices, updates: np.array(
            [
                [data[0, 0], updates[2, 1]],
                [updates[2, 0], data[1, 1]],
                [data[2, 0], data[2, 1]],
                [data[3, 0], updates[1, 1]],
            ],
            dtype=np.float32,
        ),
        "ReverseSequence-opset10-int8-4d": lambda x, lengths: np.concatenate(
            [np.concatenate([x[:3, :1][::-1], x[3:, :1]]), x[:, 1:][::-1]], axis=1
        ),
        "EyeLike-opset9-uint8": lambda x: np.eye(5, 7, k=2, dtype=np.uint8),
        "EyeLike-opset9-float16": lambda x: np.eye(3, dtype=np.float16),
    }
)


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


def _model(node: onnx.NodeProto, inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray], opset: int) -> bytes:
    graph = onnx.helper.make_graph(
        [node],
        "indexing",
        [
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in inputs.items()
        ],
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None) for name in node.output],
        initializer=[onnx.numpy_helper.from_array(a, name) for name, a in constants.items()],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model.SerializeToString()


def test_data_dependent_sizes_run_in_sessions(backend_name: str) -> None:
    """NonZero of a fed input, and Compress after it with a constant condition: sizes follow the values."""
    env = ortgpu.Env(backend=backend_name)
    try:
        node = onnx.helper.make_node("NonZero", ["x"], ["y"])
        x = np.array([[0, 3, 0], [4, 0, 5]], dtype=np.float32)
        with ortgpu.InferenceSession(_model(node, {"x": x}, {}, 13), env=env) as session:
            (got,) = session.run(None, {"x": x})
            np.testing.assert_array_equal(got, np.array(np.nonzero(x), dtype=I64))
        node = onnx.helper.make_node("Compress", ["x", "c"], ["y"], axis=1)
        condition = np.array([True, False, True])
        with ortgpu.InferenceSession(_model(node, {"x": x}, {"c": condition}, 11), env=env) as session:
            (got,) = session.run(None, {"x": x})
            np.testing.assert_array_equal(got, x[:, [0, 2]])
    finally:
        env.close()


def test_out_of_range_indices_are_typed_errors() -> None:
    data = np.zeros((3, 4), np.float32)
    with pytest.raises(InvalidArgumentError, match="GatherElements"):
        get_operator("GatherElements", 13).reference([data, np.array([[3, 0, 0, 0]], I64)], {}, [])
    with pytest.raises(InvalidArgumentError, match="GatherND"):
        get_operator("GatherND", 13).reference([data, np.array([[0, -5]], I64)], {}, [])
    with pytest.raises(InvalidArgumentError, match="ScatterElements"):
        get_operator("ScatterElements", 18).reference(
            [data, np.array([[-4, 0, 0, 0]], I64), np.ones((1, 4), np.float32)], {}, []
        )
    with pytest.raises(InvalidArgumentError, match="ScatterND"):
        get_operator("ScatterND", 18).reference([data, np.array([[3]], I64), np.ones((1, 4), np.float32)], {}, [])


def test_gather_elements_constant_out_of_range_is_refused_when_planned(op_device: BackendDevice) -> None:
    from test_ops_elementwise import caps_of

    from ortgpu.ops import TensorInfo

    operator = get_operator("GatherElements", 13)
    infos = [TensorInfo((3, 4), np.dtype(np.float32)), TensorInfo((1, 4), np.dtype(I64))]
    with pytest.raises(InvalidArgumentError, match="outside"):
        operator.plan(
            infos,
            [TensorInfo((1, 4), np.dtype(np.float32))],
            {},
            caps_of(op_device),
            {1: np.array([[0, 1, 2, 3]], I64) * 2},
        )


def test_gather_elements_runtime_indices_out_of_range_in_a_session(backend_name: str) -> None:
    """Run-time indices run on the device; an out-of-range one flags the run: a typed error, not a clamped value."""
    env = ortgpu.Env(backend=backend_name)
    try:
        node = onnx.helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0)
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        good = np.array([[2, -1, 0, 1]], I64)
        with ortgpu.InferenceSession(_model(node, {"x": x, "i": good}, {}, 13), env=env) as session:
            assert [p.placement for p in session.get_node_placement({"x": x.shape, "i": good.shape})] == ["webgpu"]
            (got,) = session.run(None, {"x": x, "i": good})
            np.testing.assert_array_equal(got, np.take_along_axis(x, good % 3, axis=0))
            with pytest.raises(InvalidArgumentError):
                session.run(None, {"x": x, "i": np.array([[3, 0, 0, 0]], I64)})
    finally:
        env.close()


EMPTY = {
    # op: (opset, attributes, input shapes, output shape): run-time indices no kernel could check (or read through)
    "GatherElements": (13, {"axis": 1}, [(3, 0), (3, 2), None], (3, 2)),
    "GatherND": (13, {}, [(3, 0, 2), (4, 2), None], (4, 2)),
    "GatherND-empty-slices": (13, {}, [(3, 0), (2, 1), None], (2, 0)),
    "ScatterElements": (18, {}, [(0, 3), (2, 3), (2, 3)], (0, 3)),
    "ScatterND": (18, {}, [(2, 0), (2, 1), (2, 0)], (2, 0)),
    "ReverseSequence": (10, {}, [(0, 3, 2), (3,), None], (0, 3, 2)),
}


@pytest.mark.parametrize("case", sorted(EMPTY))
def test_runtime_indices_of_empty_tensors_run_on_the_cpu(case: str, op_device: BackendDevice) -> None:
    """Indices into an empty axis are all invalid, and those of an empty output are read by no invocation: the CPU
    checks them (its reference raises the typed error)."""
    from test_ops_elementwise import caps_of

    from ortgpu.ops import NotOnDevice, TensorInfo

    opset, attrs, shapes, out_shape = EMPTY[case]
    op_type = case.split("-")[0]
    dtypes = [np.float32, I64, np.float32]
    infos = [None if shape is None else TensorInfo(shape, np.dtype(t)) for shape, t in zip(shapes, dtypes)]
    infos = infos if infos[-1] is not None else infos[:-1]
    with pytest.raises(NotOnDevice, match=op_type):
        get_operator(op_type, opset).plan(
            infos, [TensorInfo(out_shape, np.dtype(np.float32))], attrs, caps_of(op_device), {}
        )


def test_unsupported_variants_are_typed() -> None:
    with pytest.raises(UnsupportedOpError, match="reduction"):
        get_operator("ScatterElements", 16).reference(
            [np.zeros(3, np.float32), np.zeros(1, I64), np.zeros(1, np.float32)], {"reduction": "max"}, []
        )
    with pytest.raises(UnsupportedOpError, match="NonZero"):
        get_operator("NonZero", 13).reference([np.array(1.0, np.float32)], {}, [])
    with pytest.raises(ModelError, match="TfIdfVectorizer"):
        get_operator("TfIdfVectorizer", 9).reference([np.zeros(3, I64)], {"pool_strings": ["a"]}, [])
    assert absent()(np.random.default_rng()) is None


def test_ambiguous_inputs_are_refused() -> None:
    """Where numpy and onnxruntime disagree and ONNX does not say: a typed refusal, not a guess."""
    with pytest.raises(UnsupportedOpError, match="NaN"):
        get_operator("Unique", 11).reference([np.array([1.0, np.nan, 1.0], np.float32)], {}, [])
    attrs = dict(POOL, pool_int64s=[2, 3, 2, 4, 5, 6, 7, 8, 6, 7], mode="TF")
    with pytest.raises(OrtGpuError, match="twice"):
        get_operator("TfIdfVectorizer", 9).reference([np.zeros(3, I64)], attrs, [])
