"""Property test of the sliding-window operators (issue 12): random ranks, shapes, kernels, strides, pads,
dilations, ``auto_pad``, ``ceil_mode``, groups and output padding, drawn from a seeded generator, each compared
with onnxruntime's CPU provider and onnx's reference evaluator.  The silent-zeros pooling bug (a window longer
than the input) is one corner of this space.

* Where onnxruntime computes a result that the reference agrees with, ortgpu must compute the same.
* Where onnxruntime refuses the configuration, ortgpu must refuse with a typed error or compute what the reference
  computes.
* Where the two disagree (``auto_pad`` SAME with dilations: onnxruntime's pools size the padding for the undilated
  window, as ortgpu does, the reference for the dilated one; SAME padding that would be negative, which
  onnxruntime's MaxPool refuses and its AveragePool crops), ortgpu must compute one of the two results or refuse
  with a typed error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ortgpu
from ortgpu import ModelError, OrtGpuError

CASES_PER_OPERATOR = 24
OPERATORS = ("MaxPool", "AveragePool", "Conv", "ConvTranspose", "LpPool")


def _geometry(rng: np.random.Generator, op_type: str) -> tuple[tuple[int, ...], dict[str, Any], tuple[int, ...] | None]:
    """A random (input shape, attributes, weight shape) for ``op_type``; some are invalid on purpose."""
    rank = int(rng.choice([1, 2, 2, 2, 3]))
    spatial = tuple(int(rng.integers(1, 9)) for _ in range(rank))
    kernel = [int(rng.integers(1, 5)) for _ in range(rank)]
    strides = [int(rng.integers(1, 4)) for _ in range(rank)]
    dilations = [int(rng.integers(1, 3)) for _ in range(rank)]
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides}
    auto_pad = str(rng.choice(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad == "NOTSET":
        pad_limit = [k for k in kernel]  # ONNX requires pads smaller than the kernel for pools
        attrs["pads"] = [int(rng.integers(0, p)) for p in pad_limit] + [int(rng.integers(0, p)) for p in pad_limit]
    else:
        attrs["auto_pad"] = auto_pad
    channels = int(rng.integers(1, 5))
    weight_shape: tuple[int, ...] | None = None
    if op_type in ("MaxPool", "AveragePool", "LpPool"):
        attrs["ceil_mode"] = int(rng.integers(0, 2))
        if op_type != "LpPool" or rng.random() < 0.5:
            attrs["dilations"] = dilations
        if op_type == "AveragePool":
            attrs["count_include_pad"] = int(rng.integers(0, 2))
        if op_type == "LpPool":
            attrs["p"] = int(rng.choice([1, 2, 3]))
            attrs.pop("ceil_mode")
            if rng.random() < 0.5:
                attrs["ceil_mode"] = int(rng.integers(0, 2))
    else:
        group = int(rng.choice([1, 1, channels]))
        out_channels = group * int(rng.integers(1, 3))
        attrs["dilations"] = dilations
        attrs["group"] = group
        if op_type == "Conv":
            weight_shape = (out_channels, channels // group, *kernel)
        else:
            weight_shape = (channels, out_channels // group, *kernel)
            if rng.random() < 0.4:
                attrs["output_padding"] = [int(rng.integers(0, max(min(s, d), 1))) for s, d in zip(strides, dilations)]
    shape = (int(rng.integers(1, 3)), channels, *spatial)
    return shape, attrs, weight_shape


def _model(op_type: str, shape: tuple[int, ...], attrs: dict[str, Any], weight: np.ndarray | None) -> bytes:
    inputs = ["X"] + (["W"] if weight is not None else [])
    node = helper.make_node(op_type, inputs, ["Y"], **attrs)
    graph = helper.make_graph(
        [node],
        "window",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "W")] if weight is not None else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def _outcomes(model: bytes, x: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(onnxruntime's output, the reference evaluator's output); None where one refuses the configuration."""
    try:
        session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        ours = np.asarray(session.run(None, {"X": x})[0])
    except Exception:  # noqa: BLE001 - onnxruntime refuses this configuration
        ours = None
    try:
        with np.errstate(all="ignore"):
            reference = np.asarray(ReferenceEvaluator(model).run(None, {"X": x})[0])
    except Exception:  # noqa: BLE001 - the reference refuses it
        reference = None
    if reference is not None and reference.size and not np.isfinite(reference).all():
        reference = None  # the reference's windows over nothing but padding (-inf/NaN): no answer
    return ours, reference


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-4)


def _cases() -> list[tuple[str, int]]:
    return [(op_type, seed) for op_type in OPERATORS for seed in range(CASES_PER_OPERATOR)]


@pytest.mark.parametrize(("op_type", "seed"), _cases(), ids=lambda v: str(v))
def test_random_windows_match_onnxruntime_or_are_refused(env: ortgpu.Env, op_type: str, seed: int) -> None:
    rng = np.random.default_rng([OPERATORS.index(op_type), seed])
    shape, attrs, weight_shape = _geometry(rng, op_type)
    x = rng.standard_normal(shape).astype(np.float32)
    weight = rng.standard_normal(weight_shape).astype(np.float32) if weight_shape is not None else None
    model = _model(op_type, shape, attrs, weight)
    runtime, reference = _outcomes(model, x)
    described = f"{op_type} over {shape} with {attrs}"
    try:
        with ortgpu.InferenceSession(model, env=env) as session:
            (got,) = session.run(None, {"X": x})
    except (ModelError, OrtGpuError) as error:
        disputed = runtime is not None and not _same(runtime, reference)
        assert runtime is None or disputed, f"{described}: ortgpu refused ({error}) what onnxruntime computes"
        return
    if runtime is not None and (reference is None or _same(runtime, reference)):
        assert got.shape == runtime.shape, described
        np.testing.assert_allclose(got, runtime, rtol=1e-4, atol=1e-4, err_msg=described)
    else:
        assert reference is not None or runtime is not None, f"{described}: both refuse it, ortgpu computed it"
        assert _same(got, runtime) or _same(got, reference), (
            f"{described}: ortgpu's {got.shape} matches neither onnxruntime "
            f"({None if runtime is None else runtime.shape}) nor the reference "
            f"({None if reference is None else reference.shape})"
        )
