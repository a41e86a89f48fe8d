"""Sibling projections (MatMuls of one input by constant weights) planned as one product whose columns are stored
into each projection's own output: which steps merge, and that every kernel variant stores the right columns."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps, _gemm, _gemv
from ortgpu.ops._gemm import LEGACY, GemmConfig
from ortgpu.ops._gemv import GemvConfig
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)


def _projections(
    width: int,
    parts: Sequence[tuple[int, str]],
    dtype: Any = np.float32,
    batch: tuple[int, ...] = (1,),
    seq: Any = "S",
) -> onnx.ModelProto:
    """``X [*batch, seq, width]`` times one weight per part; each part's ``kind``: ``"plain"``, ``"bias"`` (Add of a
    constant, the bias first), ``"scale:c"`` (a bias Add, then a Mul by ``c``), ``"relu"`` (a Relu after it: an
    epilogue of its own), ``"residual"`` (Add of X)."""
    rng = np.random.default_rng(len(parts) * 7 + width)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes, inits, outputs = [], [], []
    for index, (columns, kind) in enumerate(parts):
        weight = f"W{index}"
        inits.append(numpy_helper.from_array((rng.standard_normal((width, columns)) * 0.2).astype(dtype), weight))
        product = f"p{index}"
        nodes.append(helper.make_node("MatMul", ["X", weight], [product], name=f"proj{index}"))
        out = f"y{index}"
        if kind == "plain":
            out = product
        elif kind == "bias":
            inits.append(numpy_helper.from_array(rng.standard_normal(columns).astype(dtype), f"b{index}"))
            nodes.append(helper.make_node("Add", [f"b{index}", product], [out], name=f"bias{index}"))
        elif kind == "relu":
            nodes.append(helper.make_node("Relu", [product], [out], name=f"relu{index}"))
        elif kind.startswith("scale"):  # "scale:c": the bias Add, then a Mul by c
            factor = float(kind.split(":")[1])
            inits.append(numpy_helper.from_array(rng.standard_normal(columns).astype(dtype), f"b{index}"))
            inits.append(numpy_helper.from_array(np.asarray(factor, dtype), f"c{index}"))
            nodes.append(helper.make_node("Add", [product, f"b{index}"], [f"q{index}"], name=f"bias{index}"))
            nodes.append(helper.make_node("Mul", [f"q{index}", f"c{index}"], [out], name=f"scale{index}"))
        elif kind == "residual":
            assert columns == width
            nodes.append(helper.make_node("Add", [product, "X"], [out], name=f"residual{index}"))
        outputs.append(out)
    shape = [*batch, seq, width]
    graph = helper.make_graph(
        nodes,
        "siblings",
        [helper.make_tensor_value_info("X", elem, shape)],
        [helper.make_tensor_value_info(name, elem, None) for name in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _merged_groups(model: onnx.ModelProto, shape: tuple[int, ...], dtype: Any = np.float32) -> list[tuple[str, ...]]:
    """The node names of each planned step that computes several projections."""
    plan = plan_model(load_model(model), {"X": shape}, CAPS, input_dtypes={"X": np.dtype(dtype)})
    return [step.node_names for step in plan.steps if len(step.outputs) > 1]


def _check(env: ortgpu.Env, model: onnx.ModelProto, shape: tuple[int, ...], dtype: Any = np.float32) -> None:
    x = (np.random.default_rng(1).standard_normal(shape)).astype(dtype)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x}
    )
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        got = session.run(None, {"X": x})
    tolerance = 2e-3 if dtype == np.float16 else 1e-5
    for actual, want in zip(got, expected):
        assert actual.shape == want.shape and actual.dtype == want.dtype
        np.testing.assert_allclose(actual.astype(np.float32), want.astype(np.float32), rtol=tolerance, atol=tolerance)


# -- which steps merge ---------------------------------------------------------------------------------------------


def test_query_key_value_with_and_without_biases_merge() -> None:
    model = _projections(64, [(64, "bias"), (32, "plain"), (48, "bias")])
    assert _merged_groups(model, (1, 17, 64)) == [("proj0", "bias0", "proj1", "proj2", "bias2")]


def test_a_projection_with_its_own_epilogue_stays_alone() -> None:
    # the Relu and the residual Add ride on their own MatMul; merging would lose that fusion
    model = _projections(32, [(32, "plain"), (16, "relu"), (32, "residual"), (8, "bias")])
    assert _merged_groups(model, (1, 5, 32)) == [("proj0", "proj3", "bias3")]


def test_a_scale_by_a_power_of_two_folds_into_the_weights() -> None:
    model = _projections(32, [(32, "scale:0.125"), (16, "plain"), (8, "scale:0.3333"), (8, "scale:4")])
    assert _merged_groups(model, (1, 5, 32)) == [("proj0", "bias0", "scale0", "proj1", "proj3", "bias3", "scale3")]


def test_a_scale_that_would_round_a_weight_is_not_folded(env: ortgpu.Env) -> None:
    # 2^14 times weights of about 0.2 is exact; 2^-140 makes them subnormal, rounded (the member's own product
    # scales its sums instead): that member stays alone
    model = _projections(32, [(16, f"scale:{2.0**-140}"), (16, "plain"), (8, "scale:16384")])
    assert _merged_groups(model, (1, 5, 32)) == [("proj1", "proj2", "bias2", "scale2")]
    _check(env, _projections(32, [(16, "scale:0.125"), (16, "plain"), (8, "scale:0.5")]), (1, 5, 32))


def test_one_projection_is_left_as_it_is() -> None:
    model = _projections(32, [(32, "bias"), (16, "relu")])
    assert _merged_groups(model, (1, 5, 32)) == []


def test_more_projections_than_a_kernel_can_bind_merge_in_parts(env: ortgpu.Env) -> None:
    model = _projections(16, [(8, "bias")] * 11)
    groups = _merged_groups(model, (1, 3, 16))
    most = CAPS.limits.max_storage_buffers_per_shader_stage - 4  # A, B, bias, scratch and one per output
    assert [len([n for n in names if n.startswith("proj")]) for names in groups] == [most, most, 11 - 2 * most]
    _check(env, model, (1, 3, 16))


def test_unfused_plans_do_not_merge() -> None:
    model = _projections(32, [(32, "plain"), (16, "plain")])
    plan = plan_model(load_model(model), {"X": (1, 5, 32)}, CAPS, fuse=False)
    assert all(len(step.outputs) == 1 for step in plan.steps)


def test_different_inputs_do_not_merge() -> None:
    model = _projections(32, [(32, "plain"), (16, "plain")])
    graph = model.graph
    graph.node[1].input[0] = "p0"  # the second projection reads the first one's output
    graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones((32, 16), np.float32), graph.initializer[1].name))
    assert _merged_groups(model, (1, 5, 32)) == []


def test_merged_weights_replace_the_originals_on_the_device() -> None:
    model = _projections(32, [(32, "bias"), (16, "plain")])
    plan = plan_model(load_model(model), {"X": (1, 5, 32)}, CAPS)
    assert not {"W0", "W1", "b0"} & set(plan.constant_keys)
    merged = [name for name in plan.constant_keys if "sibling" in name]
    assert len(merged) == 2  # the weights side by side and the biases side by side (zeros for the second)


# -- the stores of every kernel variant ----------------------------------------------------------------------------

_PARTS = [(20, "bias"), (12, "plain"), (8, "bias")]
_ODD = [(7, "bias"), (5, "plain"), (3, "plain")]


@pytest.mark.parametrize("rows", [1, 2, 17, 130])
@pytest.mark.parametrize("parts", [_PARTS, _ODD], ids=["multiples-of-4", "odd"])
def test_outputs_match_onnxruntime(env: ortgpu.Env, rows: int, parts: list[tuple[int, str]]) -> None:
    _check(env, _projections(40, parts), (1, rows, 40))


@pytest.mark.parametrize(
    "config",
    [
        LEGACY,
        GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=3),
        _gemm.GEMM_BIG_TILE,
    ],
    ids=lambda c: c.label,
)
@pytest.mark.parametrize("parts", [_PARTS, _ODD], ids=["multiples-of-4", "odd"])
def test_every_gemm_variant_stores_each_part(
    env: ortgpu.Env, config: GemmConfig, parts: list[tuple[int, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", config)
    _check(env, _projections(96, parts, batch=(2,)), (2, 33, 96))


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("parts", [_PARTS, _ODD], ids=["multiples-of-4", "odd"])
def test_one_row_gemv_stores_each_part(
    env: ortgpu.Env, split_k: int, parts: list[tuple[int, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_gemv, "GEMV_OVERRIDE", GemvConfig(threads_x=4, threads_k=64, unroll=2, split_k=split_k))
    _check(env, _projections(256, parts), (1, 1, 256))


def test_batched_input_and_float16(env: ortgpu.Env) -> None:
    _check(env, _projections(48, _PARTS, batch=(3,)), (3, 9, 48))
    _check(env, _projections(48, _PARTS, dtype=np.float16), (1, 9, 48), np.float16)


def test_another_sequence_length_plans_again(env: ortgpu.Env) -> None:
    model = _projections(40, _PARTS)
    x_long, x_short = (np.random.default_rng(2).standard_normal((1, n, 40)).astype(np.float32) for n in (19, 1))
    reference = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        for x in (x_long, x_short, x_long):
            for got, want in zip(session.run(None, {"X": x}), reference.run(None, {"X": x})):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_captured_replay_reads_every_part(env: ortgpu.Env) -> None:
    model = _projections(40, _PARTS, seq=6)
    reference = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    first = np.random.default_rng(3).standard_normal((1, 6, 40)).astype(np.float32)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env, graph_capture=True) as session:
        x = session.allocator.from_numpy(first)
        binding = session.io_binding()
        binding.bind_input("X", x)
        for name in ("y0", "p1", "y2"):
            binding.bind_output(name)
        with session.capture(binding) as graph:
            for feed in (first, -2 * first):
                x.update_inplace(feed)
                graph.replay()
                for value, want in zip(binding.get_outputs(), reference.run(None, {"X": feed})):
                    np.testing.assert_allclose(value.to_numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_group_is_split_where_the_weights_would_not_fit_one_binding() -> None:
    model = _projections(16, [(8, "plain")] * 4)  # weights of 16 x 8 float32: 512 bytes each
    small = DeviceCaps(CAPS.features, dataclasses.replace(CAPS.limits, max_storage_buffer_binding_size=1100))
    plan = plan_model(load_model(model), {"X": (1, 3, 16)}, small)
    assert [len(step.outputs) for step in plan.steps if len(step.outputs) > 1] == [2, 2]


def test_a_projection_without_columns_stays_out_and_the_others_merge(env: ortgpu.Env) -> None:
    model = _projections(16, [(8, "bias"), (8, "plain"), (8, "plain")])
    empty = numpy_helper.from_array(np.zeros((16, 0), np.float32), "W1")
    model.graph.initializer[[i.name for i in model.graph.initializer].index("W1")].CopyFrom(empty)
    assert _merged_groups(model, (1, 3, 16)) == [("proj0", "bias0", "proj2")]
    _check(env, model, (1, 3, 16))


def test_merged_weights_are_hashed_once_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import ortgpu._planner as planner
    import ortgpu._sibling_projections as siblings

    calls = {"planner": 0, "siblings": 0}

    def counting(where: str, real: Any) -> Any:
        def digest(value: np.ndarray) -> str:
            calls[where] += 1
            return str(real(value))

        return digest

    monkeypatch.setattr(planner, "constant_digest", counting("planner", planner.constant_digest))
    monkeypatch.setattr(siblings, "constant_digest", counting("siblings", siblings.constant_digest))
    loaded = load_model(_projections(32, [(32, "bias"), (16, "plain")]))
    first = plan_model(loaded, {"X": (1, 5, 32)}, CAPS)
    assert calls == {"planner": 0, "siblings": 2}  # the weights and the biases side by side
    second = plan_model(loaded, {"X": (1, 9, 32)}, CAPS)
    assert calls == {"planner": 0, "siblings": 2}
    assert first.constant_keys == second.constant_keys
