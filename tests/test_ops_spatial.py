"""Spatial operators (Resize, Upsample, Pad, pools, DepthToSpace, GridSample, RoiAlign...): references vs
onnxruntime CPU, device plans (fake and wgpu) vs the references and onnxruntime.

Resize is checked on many random configurations (modes, coordinate transformations, nearest modes, scales or
sizes, axes, antialias, keep_aspect_ratio_policy, roi, float16), each on both backends.  The generator stays
inside what onnxruntime computes as the spec says: its linear/cubic kernels take 2-D inputs or 4-D inputs
resized on the last two axes, it ignores roi on an axis it does not resize (and returns the input when no axis
changes size), and it mishandles negative axes with keep_aspect_ratio_policy; align_corners with ``scales``
whose output length is fractional follows the ONNX definition (the node tests), where onnxruntime differs, so
align_corners configurations use ``sizes``.
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import numpy as np
import onnx
import pytest
from test_ops_elementwise import (
    Case,
    assert_close,
    caps_of,
    check_plan,
    check_reference,
    const,
    floats,
    halves,
    ints,
    open_device,
    run_onnxruntime,
)

from ortgpu.ops import NotOnDevice, TensorInfo, get_operator
from ortgpu.ops._runner import run_plan
from ortgpu_core._errors import ShapeError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

I64 = np.int64
F32 = np.float32

# -- Resize: random configurations ---------------------------------------------------------------------------------


def _random_resize(rng: np.random.Generator) -> tuple[int, dict[str, Any], list[np.ndarray | None]]:
    """(opset, attributes, inputs) of one Resize that onnxruntime computes as the spec says."""
    opset = int(rng.choice([11, 13, 18, 19, 19, 19]))
    mode = str(rng.choice(["nearest", "nearest", "linear", "linear", "cubic"]))
    transforms = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"]
    if opset >= 19:
        transforms.append("half_pixel_symmetric")
    if opset < 13 and mode == "nearest":
        transforms.append("tf_half_pixel_for_nn")
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": str(rng.choice(transforms))}
    if mode == "nearest":
        attrs["nearest_mode"] = str(rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
        rank = int(rng.choice([1, 2, 3, 4, 4, 5]))
        axes = list(range(rank))
        if opset >= 18 and rng.random() < 0.4:
            count = int(rng.integers(1, rank + 1))
            axes = sorted(int(a) for a in rng.choice(rank, count, replace=False))
            attrs["axes"] = [a - rank if rng.random() < 0.3 else a for a in axes]
    else:
        if mode == "cubic":
            attrs["cubic_coeff_a"] = float(rng.choice([-0.75, -0.5]))
            attrs["exclude_outside"] = int(rng.integers(0, 2))
        if opset >= 18 and rng.random() < 0.4:
            attrs["antialias"] = 1
        rank = int(rng.choice([2, 4] if mode == "cubic" else [2, 3, 4]))
        axes = [rank - 2, rank - 1] if rank == 4 else list(range(rank))
        if opset >= 18:
            attrs["axes"] = axes
    shape = [int(rng.integers(1, 6)) for _ in range(rank)]
    x = rng.standard_normal(shape).astype(F32)
    if rng.random() < 0.2:
        x = x.astype(np.float16)
    full = opset < 18 and len(axes) < rank  # before opset 18 scales/sizes/roi cover every axis
    inputs: list[np.ndarray | None] = [x, None, None, None]
    if attrs["coordinate_transformation_mode"] == "align_corners" or rng.random() < 0.5:
        sizes = [int(rng.integers(1, 9)) for _ in axes]
        if opset >= 18 and len(axes) > 1 and rng.random() < 0.3:
            attrs["keep_aspect_ratio_policy"] = str(rng.choice(["not_larger", "not_smaller"]))
            attrs["axes"] = [a % rank for a in axes]
        values = [shape[a] if a not in axes else sizes[axes.index(a)] for a in range(rank)] if full else sizes
        inputs[3] = np.array(values, dtype=I64)
    else:
        scales = [float(rng.choice([0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 3.0, 1.7, 0.33])) for _ in axes]
        values_f = [1.0 if a not in axes else scales[axes.index(a)] for a in range(rank)] if full else scales
        inputs[2] = np.array(values_f, dtype=F32)
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        attrs.pop("antialias", None)
        attrs["extrapolation_value"] = float(rng.choice([0.0, 2.5]))
        count = rank if full else len(axes)
        start = rng.uniform(-0.3, 0.6, count)
        roi = np.concatenate([start, start + rng.uniform(0.1, 0.9, count)]).astype(F32)
        out_shape = _resize_reference(opset, attrs, inputs[:1] + [np.array([0.0, 1.0] * 0, F32)] + inputs[2:]).shape
        listed = list(range(rank)) if full else [a % rank for a in attrs.get("axes", range(rank))]
        for i, a in enumerate(listed):
            if out_shape[a] == shape[a]:  # onnxruntime ignores roi on an axis it does not resize
                roi[i], roi[count + i] = 0.0, 1.0
        inputs[1] = roi
    if opset == 11:
        inputs[1] = np.zeros(0, F32) if inputs[1] is None else inputs[1]
        inputs[2] = np.zeros(0, F32) if inputs[2] is None else inputs[2]
    return opset, attrs, inputs


def _resize_reference(opset: int, attrs: dict[str, Any], inputs: list[np.ndarray | None]) -> np.ndarray:
    probe = dict(attrs)
    if probe.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        probe["coordinate_transformation_mode"] = "asymmetric"  # the shape only
    return get_operator("Resize", opset).reference(inputs, probe, [TensorInfo((), np.dtype(F32))])[0]


def _model(op_type: str, opset: int, attrs: dict[str, Any], inputs: list[np.ndarray | None], out: Any) -> Any:
    names = ["" if a is None else f"in{i}" for i, a in enumerate(inputs)]
    while names and names[-1] == "":
        names.pop()
    node = onnx.helper.make_node(op_type, names, ["out0"], **attrs)
    graph_inputs = [
        onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in zip(names, inputs)
        if name and a is not None
    ]
    output = onnx.helper.make_tensor_value_info("out0", onnx.helper.np_dtype_to_tensor_dtype(np.dtype(out)), None)
    graph = onnx.helper.make_graph([node], "g", graph_inputs, [output])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


_RNG = np.random.default_rng(20261130)
RESIZE_CONFIGS = [_random_resize(_RNG) for _ in range(64)]


def _config_id(config: tuple[int, dict[str, Any], list[np.ndarray | None]]) -> str:
    opset, attrs, inputs = config
    x = inputs[0]
    assert x is not None
    parts = [f"opset{opset}", str(attrs["mode"]), str(attrs["coordinate_transformation_mode"])]
    parts += [str(attrs.get("nearest_mode", "")), "aa" if attrs.get("antialias") else "", x.dtype.name]
    return "-".join(p for p in parts if p) + "-" + "x".join(map(str, x.shape))


def _onnxruntime(op_type: str, opset: int, attrs: dict[str, Any], inputs: list[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    return run_onnxruntime(_model(op_type, opset, attrs, inputs, x.dtype), inputs)[0]


def _close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    tolerance = 2e-3 if actual.dtype == np.float16 else 1e-4
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tolerance, atol=tolerance)


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


@pytest.mark.parametrize("config", RESIZE_CONFIGS, ids=[_config_id(c) for c in RESIZE_CONFIGS])
def test_resize_reference_matches_onnxruntime(config: tuple[int, dict[str, Any], list[np.ndarray | None]]) -> None:
    opset, attrs, inputs = config
    ours = get_operator("Resize", opset).reference(inputs, attrs, [TensorInfo((), np.dtype(F32))])[0]
    _close(ours, _onnxruntime("Resize", opset, attrs, inputs), "reference vs onnxruntime")


def test_resize_configurations_cover_the_variants() -> None:
    seen = {(c[1]["mode"], c[1]["coordinate_transformation_mode"]) for c in RESIZE_CONFIGS}
    assert {m for m, _ in seen} == {"nearest", "linear", "cubic"}
    assert len({t for _, t in seen}) >= 6
    assert any(c[1].get("antialias") for c in RESIZE_CONFIGS)
    assert any(c[1].get("keep_aspect_ratio_policy") for c in RESIZE_CONFIGS)
    assert any(c[2][0] is not None and c[2][0].dtype == np.float16 for c in RESIZE_CONFIGS)


def _plan_and_run(
    device: BackendDevice, op_type: str, opset: int, attrs: dict[str, Any], inputs: list[np.ndarray | None]
) -> np.ndarray | None:
    """The device's output, or None where ``plan`` places the node on the CPU."""
    operator = get_operator(op_type, opset)
    expected = operator.reference(inputs, attrs, [TensorInfo((), np.dtype(F32))])[0]
    infos = [None if a is None else TensorInfo(a.shape, a.dtype) for a in inputs]
    constants = {i: a for i, a in enumerate(inputs) if i > 0 and a is not None}
    out = [TensorInfo(expected.shape, expected.dtype)]
    try:
        plan = operator.plan(infos, out, attrs, caps_of(device), constants)
    except NotOnDevice:
        return None
    return run_plan(device, plan, inputs, out)[0]


@pytest.mark.parametrize("config", RESIZE_CONFIGS, ids=[_config_id(c) for c in RESIZE_CONFIGS])
def test_resize_plan_matches_onnxruntime(
    config: tuple[int, dict[str, Any], list[np.ndarray | None]], op_device: BackendDevice
) -> None:
    opset, attrs, inputs = config
    actual = _plan_and_run(op_device, "Resize", opset, attrs, inputs)
    if actual is None:
        # only cubic resizes of more than 64 taps (or antialias windows beyond lavapipe's loop budget) stay
        assert attrs["mode"] == "cubic" or attrs.get("antialias"), f"{attrs} did not run on the device"
        return
    _close(actual, _onnxruntime("Resize", opset, attrs, inputs), f"{op_device.info.backend_type} vs onnxruntime")


def test_resize_nearest_and_linear_4d_run_on_the_device(op_device: BackendDevice) -> None:
    """The detector/OCR shapes: NCHW x2 nearest (YOLO's upsample) and bilinear, float32 and float16."""
    rng = np.random.default_rng(0)
    for dtype in (F32, np.float16):
        x = rng.standard_normal((2, 3, 5, 7)).astype(dtype)
        for attrs in (
            {"mode": "nearest"},
            {"mode": "linear"},
            {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        ):
            sizes = np.array([2, 3, 10, 14], dtype=I64)
            inputs: list[np.ndarray | None] = [x, None, None, sizes]
            actual = _plan_and_run(op_device, "Resize", 19, dict(attrs), inputs)
            assert actual is not None, f"{attrs} {dtype} did not run on the device"
            _close(actual, _onnxruntime("Resize", 19, dict(attrs), inputs), f"{attrs} {np.dtype(dtype).name}")


def test_resize_antialias_runs_on_the_device(op_device: BackendDevice) -> None:
    """Antialiased downsampling (image preprocessing graphs): linear and cubic, float32 and float16."""
    rng = np.random.default_rng(4)
    for mode, dtype in (("linear", F32), ("cubic", np.float16), ("cubic", F32)):
        x = rng.standard_normal((1, 3, 17, 12)).astype(dtype)
        attrs = {"mode": mode, "antialias": 1, "axes": [2, 3], "exclude_outside": int(dtype == F32)}
        inputs: list[np.ndarray | None] = [x, None, None, np.array([5, 7], I64)]
        actual = _plan_and_run(op_device, "Resize", 19, attrs, inputs)
        assert actual is not None, f"{attrs} did not run on the device"
        _close(actual, _onnxruntime("Resize", 19, attrs, inputs), f"antialias {mode} {np.dtype(dtype).name}")


def test_resize_nearest_moves_integers_exactly(op_device: BackendDevice) -> None:
    rng = np.random.default_rng(1)
    attrs = {"mode": "nearest"}
    scales = np.array([1, 1, 2.5, 1.5], F32)
    x32 = rng.integers(-(2**31), 2**31 - 1, (1, 2, 3, 4)).astype(np.int32)
    actual = _plan_and_run(op_device, "Resize", 19, attrs, [x32, None, scales])
    assert actual is not None
    np.testing.assert_array_equal(actual, _onnxruntime("Resize", 19, attrs, [x32, None, scales]))
    # int64 (onnxruntime has no int64 Resize): the same gather of 8-byte elements, against the reference
    x64 = rng.integers(-(2**40), 2**40, (1, 2, 3, 4)).astype(I64)
    actual = _plan_and_run(op_device, "Resize", 19, attrs, [x64, None, scales])
    assert actual is not None
    reference = get_operator("Resize", 19).reference([x64, None, scales], attrs, [])[0]
    np.testing.assert_array_equal(actual, reference)
    np.testing.assert_array_equal(
        reference.astype(np.float64) % 7, _onnxruntime("Resize", 19, attrs, [(x64 % 7).astype(np.int32), None, scales])
    )


def test_resize_edges() -> None:
    resize = get_operator("Resize", 19)
    empty = np.zeros((0, 3, 4, 4), F32)
    out = resize.reference([empty, None, np.array([1, 1, 2, 2], F32)], {"mode": "linear"}, [])[0]
    assert out.shape == (0, 3, 8, 8)
    with pytest.raises(ShapeError):  # both scales and sizes
        resize.reference([np.ones((1, 2), F32), None, np.ones(2, F32), np.ones(2, I64)], {}, [])
    with pytest.raises(UnsupportedOpError):
        resize.reference([np.ones((1, 2), F32), None, np.ones(2, F32)], {"mode": "area"}, [])
    with pytest.raises(UnsupportedOpError):  # interpolating integers
        resize.reference([np.ones((1, 2), np.int32), None, np.ones(2, F32)], {"mode": "linear"}, [])
    # the output length is the exact floor of length x float32 scale, as onnx's shape inference computes it
    # (10 x 0.7f = 6.9999999 -> 6; onnxruntime rounds the product to float32 first and gets 7)
    out = resize.reference([np.zeros((1, 10), F32), None, np.array([1, 0.7], F32)], {"mode": "nearest"}, [])[0]
    assert out.shape == (1, 6)
    # align_corners with scales: length_resized is length * scale (the ONNX node tests' definition)
    x = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], F32).reshape(1, 1, 2, 4)
    attrs = {"mode": "linear", "coordinate_transformation_mode": "align_corners"}
    out = resize.reference([x, None, np.array([1, 1, 0.6, 0.6], F32)], attrs, [])[0]
    np.testing.assert_allclose(out.reshape(-1), [1.0, 3.142857], rtol=1e-5)


# -- the other operators: fixed cases --------------------------------------------------------------------------------


def _indices_of_max_pool(rng: np.random.Generator) -> list[np.ndarray]:
    """X and Indices of a 2x2/stride-2 MaxPool over a (1, 2, 4, 6) input, from onnxruntime."""
    x = rng.standard_normal((1, 2, 4, 6)).astype(F32)
    node = onnx.helper.make_node("MaxPool", ["in0"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("in0", 1, x.shape)],
        [onnx.helper.make_tensor_value_info("y", 1, None), onnx.helper.make_tensor_value_info("i", 7, None)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 12)])
    model.ir_version = 9
    return run_onnxruntime(model, [x])


def _pooled(rng: np.random.Generator) -> np.ndarray:
    return _indices_of_max_pool(rng)[0]


def _pooled_indices(rng: np.random.Generator) -> np.ndarray:
    return _indices_of_max_pool(np.random.default_rng(int(rng.integers(0, 2**31))))[1]


def _boxes(rng: np.random.Generator) -> np.ndarray:
    corners = rng.uniform(-2, 9, (3, 2))
    return np.concatenate([corners, corners + rng.uniform(0.5, 6, (3, 2))], 1).astype(F32)


def _theta(rank: int) -> Any:
    return lambda rng: (np.eye(rank, rank + 1) + 0.2 * rng.standard_normal((2, rank, rank + 1))).astype(F32)


CASES: list[Case] = [
    # Upsample (opset 7: attribute, 9: input)
    Case("Upsample", [floats(1, 2, 3, 4)], {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 3.0]}, opset=7),
    Case(
        "Upsample",
        [floats(1, 2, 3, 4), const([1.0, 1.0, 2.0, 1.5], F32)],
        {"mode": "linear"},
        opset=9,
        constants=frozenset({1}),
        label="linear",
    ),
    Case(
        "Upsample",
        [floats(2, 3, 4), const([1.0, 2.0, 2.0], F32)],
        {"mode": "nearest"},
        opset=9,
        constants=frozenset({1}),
        label="3d",
    ),
    # Pad
    Case("Pad", [floats(2, 3, 4), const([1, 0, 2, 0, 3, -1], I64)], opset=13, constants=frozenset({1})),
    Case(
        "Pad",
        [floats(2, 3, 4), const([1, 1, 0, 1, 2, 2], I64)],
        {"mode": "reflect"},
        opset=13,
        constants=frozenset({1}),
        label="reflect",
    ),
    Case(
        "Pad",
        [floats(2, 3, 4), const([2, 0, 3, 1, 1, 5], I64)],
        {"mode": "edge"},
        opset=13,
        constants=frozenset({1}),
        label="edge",
    ),
    Case(
        "Pad",
        [floats(2, 3, 4), const([3, 0, 5, 1, -1, 9], I64)],
        {"mode": "wrap"},
        opset=19,
        constants=frozenset({1}),
        label="wrap",
    ),
    Case(
        "Pad",
        [
            ints(2, 3, 5, dtype=np.uint8, low=0, high=255),
            const([0, 1, 3, 2], I64),
            const(np.array(7, np.uint8)),
            const([-2, 2], I64),
        ],
        opset=18,
        constants=frozenset({1, 3}),
        label="uint8-axes",
    ),
    Case(
        "Pad",
        [ints(3, 5, dtype=I64, low=-(2**40), high=2**40), const([1, 2, 1, 2], I64), const(np.array(-(2**35), I64))],
        opset=13,
        constants=frozenset({1, 2}),
        label="int64",
    ),
    Case(
        "Pad",
        [halves(3, 5), const([1, 2, 1, 2], I64)],
        {"mode": "reflect"},
        opset=13,
        constants=frozenset({1}),
        label="float16",
    ),
    Case(
        "Pad",
        [floats(0, 3), const([1, 1, 0, 2], I64), const(np.array(1.5, F32))],
        opset=13,
        constants=frozenset({1}),
        label="empty",
    ),
    Case("Pad", [floats(2, 3, 4)], {"pads": [0, 1, 0, 0, 2, 1], "value": 1.5}, opset=2, label="attribute"),
    Case("Pad", [floats(2, 3, 4), const([1, 0, 2, 0, 3, -1], I64)], opset=13, on_device=False, label="runtime-pads"),
    # CenterCropPad
    Case("CenterCropPad", [floats(5, 6, 3), const([8, 3], I64)], {"axes": [0, -2]}, opset=18, constants=frozenset({1})),
    Case(
        "CenterCropPad",
        [floats(5, 6, 3), const([4, 9, 3], I64)],
        opset=18,
        constants=frozenset({1}),
        label="crop-and-pad",
    ),
    # DepthToSpace / SpaceToDepth
    Case("DepthToSpace", [floats(2, 8, 3, 4)], {"blocksize": 2}, opset=13),
    Case("DepthToSpace", [floats(2, 18, 3, 2)], {"blocksize": 3, "mode": "CRD"}, opset=13, label="crd"),
    Case("DepthToSpace", [halves(1, 8, 3, 5)], {"blocksize": 2, "mode": "CRD"}, opset=13, label="float16"),
    Case("SpaceToDepth", [floats(2, 3, 4, 6)], {"blocksize": 2}, opset=13),
    Case(
        "SpaceToDepth", [ints(1, 2, 6, 3, dtype=np.int8, low=-128, high=127)], {"blocksize": 3}, opset=13, label="int8"
    ),
    # pools
    Case("GlobalMaxPool", [floats(2, 3, 5, 4)]),
    Case("GlobalLpPool", [floats(2, 3, 5, 4)], {"p": 2}, opset=2),
    Case("GlobalLpPool", [floats(2, 3, 7)], {"p": 1}, opset=2, label="p1"),
    Case("GlobalLpPool", [floats(2, 3, 5, 4)], {"p": 3}, opset=2, on_device=False, label="p3"),
    Case(
        "LpPool",
        [floats(1, 2, 7, 6)],
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": 2},
        opset=11,
    ),
    Case(
        "LpPool",
        [floats(1, 2, 8, 7)],
        {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "p": 3},
        opset=18,
        label="same-p3",
    ),
    Case(
        "LpPool",
        [floats(1, 2, 8, 7)],
        {"kernel_shape": [2, 2], "dilations": [2, 1], "ceil_mode": 1, "strides": [2, 2], "p": 1},
        opset=18,
        label="ceil",
    ),
    # GridSample
    Case("GridSample", [floats(2, 3, 5, 4), floats(2, 3, 6, 2, low=-1.3, high=1.3)], opset=16),
    Case(
        "GridSample",
        [floats(2, 3, 5, 4), floats(2, 3, 6, 2, low=-2.5, high=2.5)],
        {"mode": "nearest", "padding_mode": "reflection"},
        opset=20,
        label="nearest-reflection",
    ),
    Case(
        "GridSample",
        [floats(1, 2, 6, 4), floats(1, 7, 3, 2, low=-2.5, high=2.5)],
        {"mode": "linear", "padding_mode": "reflection", "align_corners": 1},
        opset=20,
        label="linear-reflection-align",
    ),
    Case(
        "GridSample",
        [floats(1, 2, 6, 4), floats(1, 7, 3, 2, low=-1.5, high=1.5)],
        {"mode": "linear", "padding_mode": "border"},
        opset=20,
        label="border",
    ),
    Case(
        "GridSample",
        [floats(1, 2, 5, 4), floats(1, 3, 6, 2, low=-1.3, high=1.3)],
        {"mode": "bicubic", "padding_mode": "reflection", "align_corners": 1},
        opset=16,
        label="bicubic",
    ),
    Case(
        "GridSample",
        [floats(1, 2, 3, 5, 4), floats(1, 2, 3, 6, 3, low=-1.3, high=1.3)],
        {"mode": "nearest", "padding_mode": "border"},
        opset=20,
        label="3d",
    ),
    # AffineGrid
    Case("AffineGrid", [_theta(2), const([2, 3, 4, 5], I64)], {"align_corners": 1}, opset=20, constants=frozenset({1})),
    Case("AffineGrid", [_theta(3), const([2, 3, 2, 4, 5], I64)], opset=20, constants=frozenset({1}), label="3d"),
    Case(
        "AffineGrid",
        [_theta(3), const([2, 3, 1, 4, 1], I64)],
        {"align_corners": 0},
        opset=20,
        constants=frozenset({1}),
        label="unit-axes",
    ),
    Case("AffineGrid", [_theta(2), const([2, 3, 4, 5], I64)], opset=20, on_device=False, label="runtime-size"),
    # Col2Im
    Case(
        "Col2Im",
        [floats(2, 12, 9), const([5, 5], I64), const([2, 2], I64)],
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1]},
        opset=18,
        constants=frozenset({1, 2}),
    ),
    Case(
        "Col2Im",
        [floats(1, 6, 36), const([3, 4, 5], I64), const([1, 2, 3], I64)],
        {"dilations": [1, 2, 1], "pads": [0, 1, 0, 0, 1, 0]},
        opset=18,
        constants=frozenset({1, 2}),
        label="3d",
    ),
    Case(
        "Col2Im",
        [floats(2, 12, 9), const([5, 5], I64), const([2, 2], I64)],
        {"strides": [2, 2], "pads": [1, 1, 1, 1]},
        opset=18,
        on_device=False,
        label="runtime-shapes",
    ),
    # MaxUnpool
    Case(
        "MaxUnpool", [_pooled, _pooled_indices], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11, on_device=False
    ),
    # DeformConv
    Case(
        "DeformConv",
        [
            floats(1, 4, 6, 5),
            floats(4, 2, 3, 2),
            floats(1, 24, 6, 5, scale=1.5),
            floats(4),
            floats(1, 12, 6, 5, low=0.0, high=1.0),
        ],
        {"group": 2, "offset_group": 2, "pads": [1, 0, 1, 1]},
        opset=19,
    ),
    Case(
        "DeformConv",
        [floats(2, 3, 7, 6), floats(2, 3, 2, 2), floats(2, 8, 3, 4, scale=2.0)],
        {"strides": [2, 1], "dilations": [1, 2]},
        opset=19,
        label="strided",
    ),
    # RoiAlign
    Case(
        "RoiAlign",
        [floats(2, 3, 8, 9), _boxes, const([0, 1, 1], I64)],
        {"output_height": 2, "output_width": 3, "sampling_ratio": 2, "spatial_scale": 0.5},
        opset=16,
    ),
    Case(
        "RoiAlign",
        [floats(2, 3, 8, 9), _boxes, const([1, 1, 0], I64)],
        {"mode": "max", "output_height": 3, "output_width": 2, "sampling_ratio": 3},
        opset=16,
        label="max-device",
    ),
    Case(
        "RoiAlign",
        [floats(2, 3, 8, 9), _boxes, const([1, 0, 1], I64)],
        {"mode": "max"},
        opset=10,
        on_device=False,
        label="adaptive-sampling",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_matches_onnxruntime(case: Case) -> None:
    check_reference(case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_matches_reference(case: Case, op_device: BackendDevice) -> None:
    check_plan(case, op_device)


def test_deform_conv_without_offsets_is_a_convolution() -> None:
    """Zero offsets and a mask of ones: DeformConv is Conv (onnxruntime's Conv judges it); the mask scales
    the taps, and whole-pixel offsets shift the image."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 6, 7)).astype(F32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(F32)
    b = rng.standard_normal(6).astype(F32)
    attrs = {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2], "group": 2}
    conv = run_onnxruntime(_model("Conv", 19, attrs, [x, w, b], F32), [x, w, b])[0]
    out_h, out_w = conv.shape[2:]
    offset = np.zeros((2, 2 * 2 * 6, out_h, out_w), F32)
    mask = np.ones((2, 2 * 6, out_h, out_w), F32)
    deform = get_operator("DeformConv", 19)
    deform_attrs = {**attrs, "offset_group": 2}
    got = deform.reference([x, w, offset, b, mask], deform_attrs, [])[0]
    assert_close(got, conv, "DeformConv vs Conv")
    half = deform.reference([x, w, offset, None, mask * 0.5], deform_attrs, [])[0]
    assert_close(half * 2, conv - b.reshape(1, -1, 1, 1), "DeformConv with mask 0.5")
    # one pixel down everywhere == Conv of the image shifted up by one row (a zero row at the bottom; no top pad)
    attrs = {"strides": [2, 1], "pads": [0, 0, 1, 1], "dilations": [1, 2], "group": 2}
    shifted = np.concatenate([x[:, :, 1:], np.zeros_like(x[:, :, :1])], axis=2)
    expected = run_onnxruntime(_model("Conv", 19, attrs, [shifted, w, b], F32), [shifted, w, b])[0]
    down = np.zeros((2, 2 * 2 * 6) + expected.shape[2:], F32)
    down[:, 0::2] = 1.0
    got = deform.reference([x, w, down, b], {**attrs, "offset_group": 2}, [])[0]
    assert_close(got, expected, "DeformConv with offset dy = 1")


def test_global_max_pool_skips_nan(op_device: BackendDevice) -> None:
    """NaN never wins (onnxruntime and MaxPool agree); an all-NaN image gives -inf, on both sides."""
    x = np.array([[np.nan, 1.0, 2.0], [3.0, np.nan, -1.0], [np.nan, np.nan, np.nan]], F32).reshape(1, 3, 3)
    actual = _plan_and_run(op_device, "GlobalMaxPool", 13, {}, [x])
    assert actual is not None
    np.testing.assert_array_equal(actual.reshape(-1), [2.0, 3.0, -np.inf])
    np.testing.assert_array_equal(_onnxruntime("GlobalMaxPool", 13, {}, [x[:, :2]]).reshape(-1), [2.0, 3.0])


def test_typed_refusals() -> None:
    with pytest.raises(ShapeError):  # reflect cannot add more than length - 1
        get_operator("Pad", 13).reference([np.ones((2, 3), F32), np.array([0, 3, 0, 0], I64)], {"mode": "reflect"}, [])
    with pytest.raises(UnsupportedOpError):
        get_operator("Pad", 18).reference([np.ones((2, 3), F32), np.array([0, 1, 0, 0], I64)], {"mode": "wrap"}, [])
    with pytest.raises(UnsupportedOpError):  # onnxruntime, onnx's reference and PyTorch disagree here
        get_operator("AffineGrid", 20).reference(
            [np.zeros((1, 2, 3), F32), np.array([1, 1, 1, 3], I64)], {"align_corners": 1}, []
        )
    with pytest.raises(UnsupportedOpError):  # GlobalMaxPool is defined on floats
        get_operator("GlobalMaxPool", 1).reference([np.ones((1, 2, 3), np.int32)], {}, [])
    with pytest.raises(ShapeError):
        get_operator("DepthToSpace", 13).reference([np.ones((1, 6, 2, 2), F32)], {"blocksize": 2}, [])
    with pytest.raises(UnsupportedOpError):
        get_operator("GridSample", 16).reference(
            [np.ones((1, 1, 2, 2), F32), np.zeros((1, 1, 1, 2), F32)], {"mode": "linear"}, []
        )
    with pytest.raises(UnsupportedOpError):  # onnx's reference and onnxruntime disagree on this output_shape
        get_operator("MaxUnpool", 11).reference(
            [np.ones((1, 1, 1, 1), F32), np.array([[[[0]]]], I64), np.array([1, 1, 3, 3], I64)],
            {"kernel_shape": [2, 2], "strides": [2, 2]},
            [],
        )
    with pytest.raises(ShapeError):  # an index outside the output
        get_operator("MaxUnpool", 11).reference(
            [np.ones((1, 1, 1, 1), F32), np.array([[[[9]]]], I64)], {"kernel_shape": [2, 2], "strides": [2, 2]}, []
        )
