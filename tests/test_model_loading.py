"""Loading: parsing, checks, version limits, external data, shape inference and constant folding."""

from __future__ import annotations

import os
from pathlib import Path

import models
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu_core
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps
from ortgpu_core._errors import InvalidModelError, ModelError, ShapeError, UnsupportedOpError
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)


def _single(op_type: str, opset: int = 17, name: str = "the_node", **attrs: object) -> onnx.ModelProto:
    node = helper.make_node(op_type, ["X"], ["Y"], name=name, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_loads_inputs_outputs_opsets_initializers() -> None:
    model = load_model(models.mlp(layers=2, width=8).SerializeToString())
    assert [(v.name, v.shape, v.dtype) for v in model.inputs] == [("X", ("batch", 8), np.dtype(np.float32))]
    assert [(v.name, v.shape) for v in model.outputs] == [("Y", ("batch", 8))]
    assert model.opsets[""] == 17
    assert len(model.initializers) == 4
    assert all(isinstance(a, np.ndarray) for a in model.initializers.values())


def test_loads_from_path(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(models.mlp(layers=1, width=4), str(path))
    model = load_model(str(path))
    assert model.model_dir == str(tmp_path)
    assert model.input_names == ["X"]


def test_truncated_file_is_invalid(tmp_path: Path) -> None:
    data = models.mlp(layers=2, width=16).SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError, match="truncated|re-export|re-download"):
        load_model(str(path))


@pytest.mark.parametrize("data", [b"", b"not an onnx model at all", bytes(range(256)) * 4])
def test_garbage_is_invalid(data: bytes) -> None:
    with pytest.raises(InvalidModelError):
        load_model(data)


def test_missing_file_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match="cannot read"):
        load_model(str(tmp_path / "absent.onnx"))


@pytest.mark.parametrize("opset", [29, 40])
def test_opset_out_of_range(opset: int) -> None:
    model = _single("Relu", opset=opset)
    with pytest.raises(UnsupportedOpError, match=f"opset {opset}.*7\\.\\.28"):
        load_model(model.SerializeToString())


def test_ir_version_too_new() -> None:
    model = _single("Relu")
    model.ir_version = 15
    with pytest.raises(InvalidModelError, match="IR version 15"):
        load_model(model.SerializeToString())


@pytest.mark.parametrize(("op_type", "opset"), [("Relu", 6), ("Not", 1), ("Identity", 1), ("Sigmoid", 6)])
def test_old_opsets_run_operators_unchanged_since(op_type: str, opset: int, env: ortgpu_core.Env) -> None:
    """A model older than opset 7 loads where its operators did not change until opset 7 (as onnxruntime runs it)."""
    import ortgpu

    dtype = TensorProto.BOOL if op_type == "Not" else TensorProto.FLOAT
    node = helper.make_node(op_type, ["X"], ["Y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", dtype, [2, 3])],
        [helper.make_tensor_value_info("Y", dtype, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    if op_type == "Not":
        x = x > 0
    references = {"Relu": lambda: np.maximum(x, 0), "Not": lambda: ~x, "Identity": lambda: x}
    expected = references.get(op_type, lambda: 1 / (1 + np.exp(-x)))()
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        (y,) = sess.run(None, {"X": x})
    np.testing.assert_allclose(y, expected, rtol=1e-6)


@pytest.mark.parametrize(("op_type", "opset", "then"), [("Relu", 5, 1), ("Add", 6, 6), ("Sigmoid", 5, 1)])
def test_old_opsets_refuse_operators_that_changed(op_type: str, opset: int, then: int) -> None:
    """An operator whose definition at the model's opset differs from opset 7's is refused with the reason."""
    inputs = ["X", "X"] if op_type == "Add" else ["X"]
    node = helper.make_node(op_type, inputs, ["Y"], name="old_node")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    with pytest.raises(UnsupportedOpError, match=f"old_node.*opset-{then} definition.*version_converter"):
        load_model(model.SerializeToString())


def test_minus_one_dims_are_symbolic_and_untyped_outputs_are_inferred(env: ortgpu_core.Env) -> None:
    """Old exporters' -1 ("any") dims, outputs without a shape and outputs without a type load and run, as in
    onnxruntime; a ModelProto passed in is left unchanged."""
    import ortgpu

    nodes = [helper.make_node("Relu", ["X"], ["A"]), helper.make_node("Cast", ["X"], ["B"], to=TensorProto.INT32)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [-1, 3])],
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, None), onnx.ValueInfoProto(name="B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    loaded = load_model(model)
    assert model.SerializeToString() == before
    assert loaded.inputs[0].shape[1] == 3 and isinstance(loaded.inputs[0].shape[0], str)
    assert [o.dtype for o in loaded.outputs] == [np.dtype(np.float32), np.dtype(np.int32)]
    with ortgpu.InferenceSession(before, env=env) as sess:
        for rows in (1, 4):
            x = np.linspace(-2, 2, rows * 3, dtype=np.float32).reshape(rows, 3)
            a, b = sess.run(None, {"X": x})
            np.testing.assert_array_equal(a, np.maximum(x, 0))
            np.testing.assert_array_equal(b, x.astype(np.int32))


def test_untyped_output_that_inference_cannot_type_is_invalid() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["A"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [onnx.ValueInfoProto(name="A"), onnx.ValueInfoProto(name="X_again")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError):
        load_model(model.SerializeToString())


def test_unsupported_op_names_op_node_and_opset() -> None:
    model = _single("ImageDecoder", opset=20, name="determinant_7")
    with pytest.raises(UnsupportedOpError) as error:
        load_model(model.SerializeToString())
    message = str(error.value)
    assert "ImageDecoder" in message and "determinant_7" in message and "opset 20" in message


def test_checker_failure_is_invalid() -> None:
    model = _single("Relu")
    model.graph.node[0].input[0] = "nowhere"
    with pytest.raises(InvalidModelError):
        load_model(model.SerializeToString())


def test_unsupported_dtype_is_clear() -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT8E4M3FN, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT8E4M3FN, [2])],
    )
    with pytest.raises(UnsupportedOpError, match="FLOAT8E4M3FN"):
        load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString())


# -- external data --------------------------------------------------------------------------------


def _external_model(folder: Path) -> Path:
    model = models.mlp(layers=1, width=32)
    path = folder / "model.onnx"
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path


def test_external_data_inside_folder_loads(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    model = load_model(str(path))
    reference = {t.name: numpy_helper.to_array(t) for t in models.mlp(layers=1, width=32).graph.initializer}
    for name, array in reference.items():
        np.testing.assert_array_equal(model.initializers[name], array)


@pytest.mark.parametrize("location", ["../outside.bin", "sub/../../outside.bin", "/etc/passwd"])
def test_external_data_escaping_folder_is_rejected_before_reading(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder)
    (tmp_path / "outside.bin").write_bytes((folder / "weights.bin").read_bytes())
    proto = onnx.load(str(path), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    with pytest.raises(InvalidModelError, match="model's folder|only relative paths"):
        load_model(_save(proto, path))


def _save(proto: onnx.ModelProto, path: Path) -> str:
    path.write_bytes(proto.SerializeToString())
    return str(path)


def test_external_data_symlink_escape_is_rejected(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder)
    outside = tmp_path / "real.bin"
    os.replace(folder / "weights.bin", outside)
    os.symlink(outside, folder / "weights.bin")
    with pytest.raises(InvalidModelError, match="leaves"):
        load_model(str(path))


def test_external_data_needs_a_path(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    proto = onnx.load(str(path), load_external_data=False)
    with pytest.raises(InvalidModelError, match="from its path"):
        load_model(proto.SerializeToString())


def test_external_data_truncated_file(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    data = (tmp_path / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError, match="truncated|outside"):
        load_model(str(path))


# -- shapes and folding ----------------------------------------------------------------------------


def _shape_chain_model() -> onnx.ModelProto:
    """Y = Reshape(X, Concat(Unsqueeze(Gather(Shape(X), 0)), [-1])): the exporters' flatten."""
    nodes = [
        helper.make_node("Shape", ["X"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["X", "target"], ["Y"], name="reshape"),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 3, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 12])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _require_ops(*op_types: str) -> None:
    from ortgpu.ops import registered_op_types

    missing = set(op_types) - set(registered_op_types())
    assert not missing, f"operators not implemented: {sorted(missing)}"


def test_shape_chain_folds_when_shapes_are_concrete() -> None:
    _require_ops("Shape", "Gather", "Unsqueeze", "Concat", "Reshape")
    model = load_model(_shape_chain_model().SerializeToString())
    assert [n.op_type for n in model.nodes] == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]  # n symbolic
    plan = plan_model(model, {"X": (5, 3, 4)}, CAPS)
    assert [s.op_type for s in plan.steps] == ["Reshape"]
    assert {"shape", "gather", "unsqueeze", "concat"} <= set(plan.folded_nodes)
    assert plan.output_infos["Y"].shape == (5, 12)


def test_static_shapes_fold_at_load() -> None:
    _require_ops("Shape", "Gather", "Unsqueeze", "Concat", "Reshape")
    proto = _shape_chain_model()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    model = load_model(proto.SerializeToString())
    assert [n.op_type for n in model.nodes] == ["Reshape"]
    np.testing.assert_array_equal(model.constants["target"], [2, -1])
    assert model.outputs[0].shape == (2, 12)


def test_constant_nodes_fold() -> None:
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones((2, 3), np.float32))),
        helper.make_node("Add", ["X", "c"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op_type for n in model.nodes] == ["Add"]
    np.testing.assert_array_equal(model.constants["c"], np.ones((2, 3), np.float32))


def test_symbolic_dims_propagate_and_resolve() -> None:
    model = load_model(models.mlp(layers=3, width=8))
    plan = plan_model(model, {"X": (7, 8)}, CAPS)
    assert plan.output_infos["Y"].shape == (7, 8)
    assert all(t.info.shape in {(7, 8), (8, 8), (8,)} for t in plan.tensors.values())


def test_wrong_input_shape_or_dtype() -> None:
    model = load_model(models.mlp(layers=1, width=8))
    with pytest.raises(ShapeError, match="expects shape"):
        plan_model(model, {"X": (2, 9)}, CAPS)
    with pytest.raises(ModelError, match="no shape given"):
        plan_model(model, {}, CAPS)
    with pytest.raises(TypeError, match="float32"):
        plan_model(model, {"X": (2, 8)}, CAPS, input_dtypes={"X": np.float64})


def _widening_model() -> onnx.ModelProto:
    """Y = Relu(X @ W) with W [8, 131072]: a small input whose product is 512 MiB at 1024 rows."""
    w = numpy_helper.from_array(np.full((8, 1 << 17), 0.5, np.float32), "W")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["P"], name="widen"),
            helper.make_node("Relu", ["P"], ["Y"], name="act"),
        ],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 1 << 17])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dims_too_big_for_the_device_fail_before_allocation() -> None:
    from helpers import run_model

    from ortgpu_core.backends.fake import FakeBackend

    model = load_model(_widening_model())
    plan_model(model, {"X": (4, 8)}, CAPS)  # fine when small
    # 1024 x 131072 float32 = 512 MiB > the fake's 256 MiB binding limit.
    with pytest.raises(ShapeError) as error:
        plan_model(model, {"X": (1024, 8)}, CAPS)
    message = str(error.value)
    assert "MatMul" in message and "(1024, 131072)" in message and "max_storage_buffer_binding_size" in message
    backend = FakeBackend()
    device = backend.open_device(0)
    with pytest.raises(ShapeError):
        run_model(model, {"X": np.ones((1024, 8), np.float32)}, device)
    assert device.live_handles() == 0
    assert device.stats.buffers_created == 0


def test_input_too_big_for_the_device() -> None:
    model = load_model(models.mlp(layers=1, width=1024))
    with pytest.raises(ShapeError, match="model input"):
        plan_model(model, {"X": (1 << 17, 1024)}, CAPS)


def test_models_of_other_domains_only_load_node_by_node() -> None:
    """A model importing no ai.onnx opset (preview-training or ai.onnx.ml graphs) is checked per node: an operator
    ortgpu lacks is refused naming its domain; a model importing nothing at all is invalid."""
    node = helper.make_node("Frobnicate", ["X"], ["Y"], domain="com.example", name="custom")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpError, match="Frobnicate.*com.example"):
        load_model(model.SerializeToString())
    del model.opset_import[:]
    with pytest.raises(InvalidModelError, match="imports no opset"):
        load_model(model.SerializeToString())


# -- the caller's proto ----------------------------------------------------------------------------


def _edited_by_loading() -> onnx.ModelProto:
    """A proto that every editing step of loading touches: IR 3 (initializers listed as inputs), an untyped output
    (the checker's placeholder), a contributed default-domain node (moved out of the checker's way), and an
    initializer that the test overrides."""
    weight = numpy_helper.from_array(np.ones(3, np.float32), "scale")
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["Y"], axis=-1, epsilon=1e-5),
        helper.make_node("Relu", ["X"], ["Z"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3]), onnx.ValueInfoProto(name="Z")], [weight],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 3
    return proto


def test_a_model_proto_passed_in_is_never_changed() -> None:
    """Loading works on a private copy: overrides, IR 3's listed inputs and the checker's placeholders never reach
    the caller's proto (two threads loading one proto would otherwise see each other's temporary edits)."""
    proto = _edited_by_loading()
    before = proto.SerializeToString()
    model = load_model(
        proto, initializer_overrides={"scale": np.full(3, 2.0, np.float32)}, free_dimension_overrides={"n": 2}
    )
    np.testing.assert_array_equal(model.initializers["scale"], np.full(3, 2.0, np.float32))
    assert proto.SerializeToString() == before
    proto.graph.node[0].op_type = "NoSuchOperator"  # and a failing load leaves it as it was too
    before = proto.SerializeToString()
    with pytest.raises(ModelError):
        load_model(proto)
    assert proto.SerializeToString() == before


# -- sparse constants ------------------------------------------------------------------------------


def _sparse(name: str, dense: np.ndarray, coordinates: bool) -> onnx.SparseTensorProto:
    where = np.argwhere(dense) if coordinates else np.flatnonzero(dense)
    indices = np.asarray(where, np.int64)
    values = dense[tuple(indices.T)] if coordinates else dense.reshape(-1)[indices]
    return helper.make_sparse_tensor(
        numpy_helper.from_array(np.asarray(values), name), numpy_helper.from_array(indices), dense.shape
    )


@pytest.mark.parametrize("coordinates", [False, True], ids=["linear", "coordinates"])
def test_sparse_initializers_and_constants_load_dense(coordinates: bool, env: ortgpu_core.Env) -> None:
    """A sparse initializer (both index forms) and a Constant's ``sparse_value`` load as the dense tensors they
    stand for; the outputs match onnxruntime's."""
    import onnxruntime

    import ortgpu

    weight = np.zeros((4, 3), np.float32)
    weight[0, 1], weight[2, 0], weight[3, 2] = 1.5, -2.0, 4.0
    bias = np.zeros(3, np.float32)
    bias[1] = 0.25
    constant = helper.make_node("Constant", [], ["B"], sparse_value=_sparse("bias", bias, coordinates))
    graph = helper.make_graph(
        [constant, helper.make_node("MatMul", ["X", "W"], ["P"]), helper.make_node("Add", ["P", "B"], ["Y"])],
        "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )  # fmt: skip
    graph.sparse_initializer.append(_sparse("W", weight, coordinates))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    loaded = load_model(model)
    np.testing.assert_array_equal(loaded.initializers["W"], weight)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x}
    )[0]
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        got = session.run(None, {"X": x})[0]
        assert all(p.placement == "webgpu" for p in session.get_node_placement() if p.op_type != "Constant")
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, x @ weight + bias, rtol=1e-6)


@pytest.mark.parametrize("index", [12, -1], ids=["past_the_end", "negative"])
def test_sparse_index_outside_the_shape_is_invalid(index: int) -> None:
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.ones(1, np.float32), "W"), numpy_helper.from_array(np.array([index])), [4, 3]
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )  # fmt: skip
    graph.sparse_initializer.append(sparse)
    with pytest.raises(InvalidModelError, match="outside the shape|out of range"):
        load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
