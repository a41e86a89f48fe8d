"""Hostile models (issue 10): shape overflow, folding and node-count bombs, hostile external data.

Each must end in a typed ortgpu error (never a wrong number, never a bare builtin exception) before anything
big is computed or allocated, or run correctly within the documented limits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import models
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
import ortgpu_core
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps
from ortgpu_core._errors import InvalidArgumentError, InvalidModelError, ModelError, ShapeError
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
OVERFLOWING_SHAPES = [[2**62 + 1, 16], [2**32, 2**32]]  # int64 element counts wrap to 16 and to 0


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> bytes:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _run(env: ortgpu_core.Env, data: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with ortgpu.InferenceSession(data, env=env) as session:
        return session.run(None, feeds)


def _placement(env: ortgpu_core.Env, data: bytes, shapes: dict[str, list[int]]) -> dict[str, str]:
    with ortgpu.InferenceSession(data, env=env) as session:
        return {p.node: p.placement for p in session.get_node_placement(shapes)}


# -- 6: shape arithmetic overflow --------------------------------------------------------------------------


def _expand_sum(shape: list[int], from_input: bool) -> tuple[bytes, dict[str, np.ndarray]]:
    """ReduceSum(Expand(x, shape)): x is the constant 1.0, or a [1] input fed with ones."""
    source = "X" if from_input else "one"
    nodes = [
        helper.make_node("Expand", [source, "shape"], ["big"], name="expand"),
        helper.make_node("ReduceSum", ["big"], ["Y"], name="sum", keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.array(shape, np.int64), "shape")]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])] if from_input else []
    if not from_input:
        inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    data = _model(nodes, inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])], inits)
    return data, ({"X": np.ones(1, np.float32)} if from_input else {})


@pytest.mark.parametrize("from_input", [False, True], ids=["constant", "input"])
@pytest.mark.parametrize("shape", OVERFLOWING_SHAPES, ids=["2^62+1x16", "2^32x2^32"])
def test_expand_overflow_is_a_shape_error_naming_tensor_node_and_limit(
    env: ortgpu_core.Env, shape: list[int], from_input: bool
) -> None:
    data, feeds = _expand_sum(shape, from_input)
    true_bytes = shape[0] * shape[1] * 4
    with pytest.raises(
        ShapeError,
        match=rf"tensor 'big' \(output 0 of Expand node 'expand'.*{true_bytes} bytes exceed "
        r"the device's max_buffer_size",
    ):
        _run(env, data, feeds)


@pytest.mark.parametrize("shape", OVERFLOWING_SHAPES, ids=["2^62+1x16", "2^32x2^32"])
def test_overflowing_constant_of_shape_is_a_shape_error_not_a_numpy_error(
    env: ortgpu_core.Env, shape: list[int]
) -> None:
    """Folding must not try to materialize it, and the CPU must not be asked to run it."""
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"),
        helper.make_node("ReduceSum", ["big"], ["Y"], name="sum", keepdims=0),
    ]
    data = _model(
        nodes,
        [],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array(shape, np.int64), "shape")],
    )
    with pytest.raises(ShapeError, match=r"tensor 'big' \(output 0 of ConstantOfShape node 'fill'.*max_buffer_size"):
        _run(env, data, {})


def test_range_bomb_is_a_shape_error(env: ortgpu_core.Env) -> None:
    nodes = [helper.make_node("Range", ["start", "limit", "delta"], ["Y"], name="range")]
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("start", 0), ("limit", 2**62), ("delta", 1))
    ]
    data = _model(nodes, [], [helper.make_tensor_value_info("Y", TensorProto.INT64, [None])], inits)
    with pytest.raises(ShapeError, match=r"tensor 'Y' \(output 0 of Range node 'range'.*max_buffer_size"):
        _run(env, data, {})


def test_tile_whose_shape_overflows_onnx_inference_is_a_shape_error(env: ortgpu_core.Env) -> None:
    """Tile by 2**62 overflows onnx's shape inference: the shape is computed in Python ints, not by running it."""
    nodes = [helper.make_node("Tile", ["x", "repeats"], ["Y"], name="tile")]
    inits = [
        numpy_helper.from_array(np.ones(2, np.float32), "x"),
        numpy_helper.from_array(np.array([2**62], np.int64), "repeats"),
    ]
    data = _model(nodes, [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])], inits)
    with pytest.raises(ShapeError, match=rf"tensor 'Y' \(output 0 of Tile node 'tile'.*shape \({2**63},\)"):
        _run(env, data, {})


def test_planner_sizes_are_exact_python_ints() -> None:
    from ortgpu._types import element_count, tensor_bytes
    from ortgpu.ops import TensorInfo

    assert element_count([2**32, 2**32]) == 2**64
    assert element_count(np.array([2**62 + 1, 16], np.int64)) == (2**62 + 1) * 16
    assert element_count([]) == 1 and element_count([3, 0, 2**40]) == 0
    assert tensor_bytes((2**62 + 1, 16), np.float32) == (2**62 + 1) * 64
    assert TensorInfo((2**32, 2**32), np.dtype(np.float32)).nbytes == 2**66
    data, _ = _expand_sum([2**32, 2**32], from_input=True)
    with pytest.raises(ShapeError, match=r"'big'.*73786976294838206464 bytes"):
        plan_model(load_model(data), {"X": [1]}, CAPS)


def test_an_input_too_big_for_the_device_is_refused_before_planning() -> None:
    data = _model(
        [helper.make_node("Shape", ["X"], ["Y"], name="shape")],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", "m"])],
        [helper.make_tensor_value_info("Y", TensorProto.INT64, [2])],
    )
    with pytest.raises(ShapeError, match=r"tensor 'X' \(model input\)"):
        plan_model(load_model(data), {"X": [2**40, 2**40]}, CAPS)


@pytest.mark.parametrize("where", ["initializer", "attribute"])
@pytest.mark.parametrize(
    "tensor",
    [
        TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3], float_data=[1.0] * 5),
        TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3], raw_data=bytes(16)),
        TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3], raw_data=bytes(13)),
    ],
    ids=["5-floats", "16-bytes", "13-bytes"],
)
def test_tensor_data_that_does_not_match_its_shape_is_invalid(tensor: TensorProto, where: str) -> None:
    """onnx's checker lets through data longer than the shape needs; numpy's reshape error must not escape."""
    if where == "initializer":
        nodes, inits, what = [helper.make_node("Identity", ["w"], ["Y"])], [tensor], "initializer 'w'"
    else:
        nodes, inits, what = (
            [helper.make_node("Constant", [], ["Y"], name="c", value=tensor)],
            [],
            "attribute 'value' of Constant node 'c'",
        )
    data = _model(nodes, [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])], inits)
    with pytest.raises(InvalidModelError, match=f"{what}.*does not match its shape"):
        load_model(data)


# -- 7: constant-folding budget --------------------------------------------------------------------------

ELEMENTS = 16384  # 64 KiB of float32 per ConstantOfShape


def _fill_concat(count: int) -> bytes:
    """Y = Concat(fill_0 .. fill_{count-1}) + X, fill_i a ConstantOfShape of ELEMENTS float32 i + 1."""
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            [f"f{i}"],
            name=f"fill_{i}",
            value=numpy_helper.from_array(np.array([i + 1.0], np.float32)),
        )
        for i in range(count)
    ]
    nodes.append(helper.make_node("Concat", [f"f{i}" for i in range(count)], ["c"], name="concat", axis=0))
    nodes.append(helper.make_node("Add", ["c", "X"], ["Y"], name="add"))
    return _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [count * ELEMENTS])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [count * ELEMENTS])],
        [numpy_helper.from_array(np.array([ELEMENTS], np.int64), "shape")],
    )


def test_folding_stops_at_the_budget_and_the_rest_runs(env: ortgpu_core.Env, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _fill_concat(4)
    x = np.arange(4 * ELEMENTS, dtype=np.float32)
    expected = np.repeat(np.arange(1, 5, dtype=np.float32), ELEMENTS) + x
    fills = {f"fill_{i}" for i in range(4)}
    # Default budget: every fill is folded; nothing of them is planned.
    assert not fills & set(_placement(env, data, {"X": [4 * ELEMENTS]}))
    np.testing.assert_array_equal(_run(env, data, {"X": x})[0], expected)
    # 150000 bytes: two fills (2 x 65536) fit, the other two run (on the CPU, as ConstantOfShape does).
    monkeypatch.setenv("ORTGPU_MAX_FOLD_BYTES", "150000")
    loaded = load_model(data)
    assert loaded.folded_bytes == 2 * 4 * ELEMENTS <= 150000
    assert [n for n in loaded.folded_nodes if n.startswith("fill")] == ["fill_0", "fill_1"]
    placement = _placement(env, data, {"X": [4 * ELEMENTS]})
    assert {n: placement[n] for n in fills & set(placement)} == {"fill_2": "cpu", "fill_3": "cpu"}
    np.testing.assert_array_equal(_run(env, data, {"X": x})[0], expected)
    # The keyword wins over the environment variable.
    assert load_model(data, max_fold_bytes=0).folded_bytes == 0
    assert load_model(data, max_fold_bytes=10**9).folded_bytes == 2 * 4 * 4 * ELEMENTS  # the fills and their Concat


def _value_through_a_big_constant() -> bytes:
    """Y = ConstantOfShape(Cast(ReduceSum(ConstantOfShape([ELEMENTS], 1.0)))) + X: a shape computed from 64 KiB."""
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["big"],
            name="big_fill",
            value=numpy_helper.from_array(np.array([1.0], np.float32)),
        ),
        helper.make_node("ReduceSum", ["big"], ["total"], name="sum", keepdims=1),
        helper.make_node("Cast", ["total"], ["n"], name="cast", to=TensorProto.INT64),
        helper.make_node(
            "ConstantOfShape",
            ["n"],
            ["twos"],
            name="sized_fill",
            value=numpy_helper.from_array(np.array([2.0], np.float32)),
        ),
        helper.make_node("Add", ["twos", "X"], ["Y"], name="add"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [ELEMENTS])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [ELEMENTS])],
        [numpy_helper.from_array(np.array([ELEMENTS], np.int64), "shape")],
    )


def test_a_shape_that_needs_a_constant_over_the_budget_is_a_model_error_saying_how_to_raise_it(
    env: ortgpu_core.Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _value_through_a_big_constant()
    x = np.ones(ELEMENTS, np.float32)
    np.testing.assert_array_equal(_run(env, data, {"X": x})[0], np.full(ELEMENTS, 3.0, np.float32))
    monkeypatch.setenv("ORTGPU_MAX_FOLD_BYTES", "0")
    with pytest.raises(
        ModelError,
        match=r"ConstantOfShape node 'sized_fill'.*'n'.*budget of 0 bytes, first at node "
        r"'big_fill'.*ORTGPU_MAX_FOLD_BYTES",
    ):
        _run(env, data, {"X": x})


def test_small_constants_fold_even_when_the_budget_is_spent() -> None:
    """Shapes and axes (up to 1 KiB) always fold: later shapes depend on them."""
    data = _model(
        [
            helper.make_node("Shape", ["X"], ["s"], name="shape"),
            helper.make_node("Concat", ["s", "minus_one"], ["target"], name="concat", axis=0),
            helper.make_node("Reshape", ["X", "target"], ["Y"], name="reshape"),
        ],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3, 1])],
        [numpy_helper.from_array(np.array([-1], np.int64), "minus_one")],
    )
    loaded = load_model(data, max_fold_bytes=0)
    assert loaded.folded_nodes == ["shape", "concat"]
    assert [n.name for n in loaded.nodes] == ["reshape"]


@pytest.mark.parametrize("variable", ["ORTGPU_MAX_FOLD_BYTES", "ORTGPU_MAX_NODES"])
@pytest.mark.parametrize("text", ["-1", "1e6", "many", "0x10"])
def test_limit_variables_must_be_decimal_integers(monkeypatch: pytest.MonkeyPatch, variable: str, text: str) -> None:
    monkeypatch.setenv(variable, text)
    with pytest.raises(InvalidArgumentError, match=f"{variable}={text!r}"):
        load_model(models.mlp(layers=1, width=4).SerializeToString())


def test_limit_arguments_must_be_non_negative_ints() -> None:
    with pytest.raises(InvalidArgumentError, match="max_nodes"):
        load_model(models.mlp(layers=1, width=4).SerializeToString(), max_nodes=-1)
    with pytest.raises(InvalidArgumentError, match="max_fold_bytes"):
        load_model(models.mlp(layers=1, width=4).SerializeToString(), max_fold_bytes=1.5)  # type: ignore[arg-type]


# -- 7: node-count limit ----------------------------------------------------------------------------------


def _relu_chain(count: int) -> bytes:
    nodes = [
        helper.make_node(
            "Relu", ["X" if i == 0 else f"t{i}"], [f"t{i + 1}" if i < count - 1 else "Y"], name=f"relu_{i}"
        )
        for i in range(count)
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
    )


def test_node_count_limit(env: ortgpu_core.Env, monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.array([-1, 0, 1, 2], np.float32)
    monkeypatch.setenv("ORTGPU_MAX_NODES", "6")
    np.testing.assert_array_equal(_run(env, _relu_chain(6), {"X": x})[0], np.maximum(x, 0))
    with pytest.raises(ModelError, match=r"7 nodes, more than the limit of 6.*max_nodes=N.*ORTGPU_MAX_NODES=N"):
        ortgpu.InferenceSession(_relu_chain(7), env=env)
    with pytest.raises(ModelError, match="limit of 3"):
        load_model(_relu_chain(4), max_nodes=3)
    assert len(load_model(_relu_chain(7), max_nodes=7).nodes) == 7


def test_default_node_limit_is_documented_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORTGPU_MAX_NODES", raising=False)
    monkeypatch.delenv("ORTGPU_MAX_FOLD_BYTES", raising=False)
    limits = load_model(_relu_chain(2)).limits
    assert (limits.max_nodes, limits.max_fold_bytes) == (100_000, 256 << 20)


# -- 10: hostile external data ----------------------------------------------------------------------------


def _external_model(folder: Path) -> Path:
    path = folder / "model.onnx"
    onnx.save(
        models.mlp(layers=1, width=32),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path


def _with_entries(path: Path, **changes: Any) -> str:
    """Rewrite the first external tensor's entries: key=value sets (None removes); returns the model path."""
    proto = onnx.load(str(path), load_external_data=False)
    tensor = next(t for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    entries = [(e.key, e.value) for e in tensor.external_data]
    extra = changes.pop("_append", [])
    for key, value in changes.items():
        entries = [(k, v) for k, v in entries if k != key]
        if value is not None:
            entries.append((key, value))
    del tensor.external_data[:]
    for key, value in entries + list(extra):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    path.write_bytes(proto.SerializeToString())
    return str(path)


def _offset_of(path: Path) -> int:
    proto = onnx.load(str(path), load_external_data=False)
    tensor = next(t for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    return int({e.key: e.value for e in tensor.external_data}.get("offset", "0"))


def test_external_data_location_with_a_nul_byte(tmp_path: Path) -> None:
    path = _with_entries(_external_model(tmp_path), location="weights.bin\0../../etc/passwd")
    with pytest.raises(InvalidModelError, match="NUL byte"):
        load_model(path)


@pytest.mark.parametrize("key", ["offset", "length"])
@pytest.mark.parametrize("text", ["abc", "1.5", "", "-4", "0x10", " 16", "1_0", "\u0661"])
def test_external_data_offset_and_length_must_be_decimal_integers(tmp_path: Path, key: str, text: str) -> None:
    path = _with_entries(_external_model(tmp_path), **{key: text})
    with pytest.raises(InvalidModelError, match=f"external data {key} .* is not a non-negative decimal integer"):
        load_model(path)


@pytest.mark.parametrize(
    "entry, message",
    [
        (("__class__", "x"), "unknown external data key '__class__'"),
        (("location", "weights.bin"), "'location' is given twice"),
    ],
)
def test_external_data_unknown_and_repeated_keys(tmp_path: Path, entry: tuple[str, str], message: str) -> None:
    path = _with_entries(_external_model(tmp_path), _append=[entry])
    with pytest.raises(InvalidModelError, match=message):
        load_model(path)


@pytest.mark.parametrize("location", [".", "sub", "sub/"])
def test_external_data_location_naming_a_folder(tmp_path: Path, location: str) -> None:
    (tmp_path / "sub").mkdir()
    path = _with_entries(_external_model(tmp_path), location=location)
    with pytest.raises(InvalidModelError, match="is a folder, not a file"):
        load_model(path)


def test_external_data_missing_file_and_special_file(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    with pytest.raises(InvalidModelError, match="'absent.bin' is missing"):
        load_model(_with_entries(path, location="absent.bin"))
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(InvalidModelError, match="not a regular file"):
        load_model(_with_entries(path, location="pipe"))


@pytest.mark.parametrize("location", ["/etc/hostname", "../weights.bin", "sub/../../weights.bin"])
def test_external_data_absolute_or_escaping_paths(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _with_entries(_external_model(folder), location=location)
    (tmp_path / "weights.bin").write_bytes((folder / "weights.bin").read_bytes())
    with pytest.raises(InvalidModelError, match="only relative paths|leaves the model's folder"):
        load_model(path)


def test_external_data_dotted_path_inside_the_folder_loads(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = _with_entries(_external_model(tmp_path), location="sub/../weights.bin")
    reference = {t.name: numpy_helper.to_array(t) for t in models.mlp(layers=1, width=32).graph.initializer}
    loaded = load_model(path)
    for name, array in reference.items():
        np.testing.assert_array_equal(loaded.initializers[name], array)


@pytest.mark.parametrize("offset", ["1000000000", "9" * 40])
def test_external_data_offset_past_the_end(tmp_path: Path, offset: str) -> None:
    path = _with_entries(_external_model(tmp_path), offset=offset)
    with pytest.raises(InvalidModelError, match="outside 'weights.bin'"):
        load_model(path)


def test_external_data_length_must_match_the_tensor(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    with pytest.raises(InvalidModelError, match=r"needs \d+ bytes.*holds 4"):
        load_model(_with_entries(path, length="4"))
    # Without a length the rest of the file is read: here more than the first tensor needs.
    start = _offset_of(path)
    with pytest.raises(InvalidModelError, match=rf"needs \d+ bytes.*offset {start}"):
        load_model(_with_entries(path, length=None))


# -- graph order ------------------------------------------------------------------------------------------


def test_topological_order_of_an_unsorted_graph_and_a_cycle() -> None:
    """onnx's checker (which requires sorted nodes) is skipped for models over 2 GB: the loader sorts them itself,
    in linear time (a reversed chain used to take one pass per node)."""
    from ortgpu.loader._model import GraphNode, _topological

    count = 3000
    chain = [GraphNode(f"n{i}", "Relu", "", (f"t{i}",), (f"t{i + 1}",), {}, 17) for i in range(count)]
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1])], [])
    assert [n.name for n in _topological(chain[::-1], graph)] == [n.name for n in chain]
    assert _topological(chain, graph) == chain
    cycle = [
        GraphNode("a", "Add", "", ("t0", "b_out"), ("a_out",), {}, 17),
        GraphNode("b", "Relu", "", ("a_out",), ("b_out",), {}, 17),
    ]
    with pytest.raises(InvalidModelError, match="cycle through node 'a'"):
        _topological(cycle, graph)
    with pytest.raises(InvalidModelError, match="reads 'nowhere', which nothing produces"):
        _topological([GraphNode("c", "Relu", "", ("nowhere",), ("c_out",), {}, 17)], graph)


def test_session_limits_are_passed_to_the_loader(env: ortgpu.Env) -> None:
    """``InferenceSession(..., max_nodes=, max_fold_bytes=)``: the documented way to raise or lower the limits."""
    with pytest.raises(ModelError, match="more than the limit of 3"):
        ortgpu.InferenceSession(_relu_chain(4), env=env, max_nodes=3)
    with ortgpu.InferenceSession(_relu_chain(4), env=env, max_nodes=4) as session:
        assert session.run(None, {session.input_names[0]: np.ones(session.get_inputs()[0].shape, np.float32)})
