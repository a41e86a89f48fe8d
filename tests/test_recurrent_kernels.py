"""The WGSL kernels of RNN, GRU and LSTM (issue 13) on both backends, both recurrence paths.

Random configurations (seeded) over directions, layouts, sequence lengths (0 and full included), initial states,
peepholes, clip, ``linear_before_reset``, ``input_forget`` and non-default activations, against onnxruntime's
CPU provider (layout 0; layout 1 cases run onnxruntime on the layout 0 model with the batch axis moved) and the
float64 reference.  Each case runs with the persistent kernel and with one dispatch per step (forced through
``_recurrent_plan``'s switches).  Also: ``sequence_lens`` changed between runs of one session, invalid lengths
raising ``InvalidArgumentError``, the placement, and an LSTM captured and replayed with changed inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import onnx
import onnx.helper
import onnxruntime
import pytest
from test_ops_recurrent import OUTPUTS, _batch_first, _feeds, _inputs, _model
from test_ops_recurrent import Case as OpCase

import ortgpu
import ortgpu_core
from ortgpu.ops import get_operator
from ortgpu.ops.ai_onnx import _recurrent_plan

F32 = np.float32
NON_DEFAULT: dict[str, dict[str, list[Any]]] = {
    "RNN": {"activations": ["Softsign"]},
    "GRU": {"activations": ["HardSigmoid", "Elu"], "activation_alpha": [0.25, 0.9], "activation_beta": [0.45]},
    "LSTM": {"activations": ["Sigmoid", "Softplus", "LeakyRelu"], "activation_alpha": [0.2]},
}


@dataclass
class Case(OpCase):
    """A case of tests/test_ops_recurrent.py (float32 here), in a layout."""

    layout: int = 0


def _random_case(seed: int) -> Case:
    rng = np.random.default_rng(seed)
    op_type = ("RNN", "GRU", "LSTM")[seed % 3]
    attrs: dict[str, Any] = {}
    # every (operator, direction, layout) once over the 18 seeds; the rest drawn
    direction = ("forward", "reverse", "bidirectional")[(seed // 3) % 3]
    if direction != "forward":
        attrs["direction"] = direction
    if rng.random() < 0.3:
        attrs["clip"] = float(rng.uniform(0.5, 2.0))
    if op_type == "GRU" and rng.random() < 0.5:
        attrs["linear_before_reset"] = 1
    if op_type == "LSTM" and rng.random() < 0.25:
        attrs["input_forget"] = 1
    if rng.random() < 0.35:
        extra = NON_DEFAULT[op_type]
        repeat = 2 if direction == "bidirectional" else 1
        attrs["activations"] = list(extra["activations"]) * repeat
        for key in ("activation_alpha", "activation_beta"):
            if key in extra:
                attrs[key] = list(extra[key]) * repeat
    seq, batch = int(rng.integers(1, 7)), int(rng.integers(1, 4))
    lengths = None
    if rng.random() < 0.6:
        lengths = tuple(int(v) for v in rng.integers(0, seq + 1, size=batch))
        if batch > 1:
            lengths = (0, seq) + lengths[2:]  # an empty and a full sequence
    optional = frozenset(name for name in ("B", "initial_h", "initial_c", "P") if rng.random() < 0.7)
    outputs = tuple(bool(rng.random() < 0.8) for _ in range(3))
    if not any(outputs[: OUTPUTS[op_type]]):
        outputs = (True, False, True)
    return Case(
        op_type,
        attrs,
        seq=seq,
        batch=batch,
        input_size=int(rng.integers(1, 6)),
        hidden=int(rng.integers(1, 9)),
        optional=optional,
        lengths=lengths,
        outputs=outputs,
        layout=(seed // 9) % 2,
        opset=7 if seed == 4 else 14,  # (layout is opset 14's)
    )


def _onnxruntime(case: Case, arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    """onnxruntime's CPU results in ``case.layout`` (its CPU kernels have layout 0 only)."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(_model(case, arrays, 0), options, providers=["CPUExecutionProvider"])
    results = [np.asarray(r) for r in session.run(None, _feeds(arrays))]
    if case.layout == 0:
        return results
    wanted = [i for i, w in enumerate(case.outputs[: OUTPUTS[case.op_type]]) if w]
    return [np.transpose(r, (2, 0, 1, 3)) if i == 0 else np.swapaxes(r, 0, 1) for i, r in zip(wanted, results)]


def _reference(case: Case, arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    operator = get_operator(case.op_type, case.opset)
    attrs = dict(case.attrs, hidden_size=case.hidden, layout=case.layout)
    wide = [None if a is None or a.dtype != F32 else a.astype(np.float64) for a in arrays]
    wide[4] = arrays[4]
    results = operator.reference(wide, attrs, [])
    return [r for r, w in zip(results, case.outputs) if w]


def _close(actual: np.ndarray, expected: np.ndarray, tolerance: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance, err_msg=what)


@pytest.fixture(params=["persistent", "persistent-split", "per-step"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Force one recurrence path: the persistent kernel with one invocation per unit, with up to 4 per unit (each
    summing a share of ``k``, shares of 1 and uneven ones included at these small sizes), or one dispatch per
    step."""
    if request.param == "per-step":
        monkeypatch.setattr(_recurrent_plan, "PERSISTENT_MAX_HIDDEN", 0)
    else:
        monkeypatch.setattr(_recurrent_plan, "FORCE_PERSISTENT", True)
        split = request.param == "persistent-split"
        monkeypatch.setattr(_recurrent_plan, "MAX_SPLIT", 4 if split else 1)
        monkeypatch.setattr(_recurrent_plan, "SPLIT_MIN_CHUNK", 1)
    yield str(request.param)


SEEDS = list(range(18))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_configurations_match_onnxruntime_and_the_reference(seed: int, path: str, env: ortgpu_core.Env) -> None:
    case = _random_case(seed)
    arrays = _inputs(case, np.random.default_rng(1000 + seed))
    expected = _onnxruntime(case, arrays)
    moved = _batch_first(case, arrays) if case.layout else arrays
    if case.layout:
        reference = _reference(case, moved)
    else:
        reference = _reference(case, arrays)
    model = _model(case, moved, case.layout)
    with ortgpu.InferenceSession(model, env=env) as session:
        placements = {p.op_type: p.placement for p in session.get_node_placement()}
        assert placements[case.op_type] == "webgpu", placements
        actual = [np.asarray(r) for r in session.run(None, _feeds(moved))]
    assert len(actual) == len(expected) == len(reference)
    for index, (ours, theirs, exact) in enumerate(zip(actual, expected, reference)):
        assert ours.dtype == F32
        _close(ours, theirs, 2e-5, f"{case} output {index} vs onnxruntime")
        _close(ours, exact.astype(F32), 2e-5, f"{case} output {index} vs reference")


def _session_case(op_type: str = "LSTM") -> Case:
    return Case(op_type, {"direction": "bidirectional"}, seq=6, batch=3, hidden=5, lengths=(6, 2, 0))


@pytest.mark.parametrize("op_type", ["GRU", "LSTM"])
def test_sequence_lens_change_between_runs_without_replanning(op_type: str, path: str, env: ortgpu_core.Env) -> None:
    case = _session_case(op_type)
    arrays = _inputs(case, np.random.default_rng(5))
    with ortgpu.InferenceSession(_model(case, arrays, 0), env=env) as session:
        for lengths in ((6, 2, 0), (1, 6, 3), (0, 0, 6), (6, 6, 6)):
            arrays[4] = np.array(lengths, np.int32)
            case.lengths = lengths
            actual = session.run(None, _feeds(arrays))
            for index, (ours, theirs) in enumerate(zip(actual, _onnxruntime(case, arrays))):
                _close(np.asarray(ours), theirs, 2e-5, f"lengths {lengths} output {index}")


@pytest.mark.parametrize("lengths", [(7, 1, 2), (-1, 3, 2)], ids=["too-long", "negative"])
def test_invalid_sequence_lens_raise(lengths: tuple[int, ...], path: str, env: ortgpu_core.Env) -> None:
    case = _session_case("RNN")
    arrays = _inputs(case, np.random.default_rng(6))
    with ortgpu.InferenceSession(_model(case, arrays, 0), env=env) as session:
        assert session.run(None, _feeds(arrays))  # valid lengths run
        arrays[4] = np.array(lengths, np.int32)
        with pytest.raises(ortgpu.InvalidArgumentError):
            session.run(None, _feeds(arrays))
        arrays[4] = np.array((3, 6, 0), np.int32)  # and the session still runs afterwards
        case.lengths = (3, 6, 0)
        for ours, theirs in zip(session.run(None, _feeds(arrays)), _onnxruntime(case, arrays)):
            _close(np.asarray(ours), theirs, 2e-5, "after an invalid run")


def test_realistic_sizes_are_accurate(env: ortgpu_core.Env) -> None:
    """Hidden 64, 32 steps, bidirectional LSTM with lengths: float32 on the device vs the float64 reference."""
    case = Case("LSTM", {"direction": "bidirectional"}, seq=32, batch=2, input_size=24, hidden=64, lengths=(32, 17))
    arrays = _inputs(case, np.random.default_rng(8))
    for index in (1, 2, 3, 5, 6, 7):  # trained-like weights (+-1/sqrt(hidden)): not chaotic over 32 steps
        value = arrays[index]
        if value is not None:
            arrays[index] = (value * (2.0 / np.sqrt(case.hidden))).astype(F32)
    reference = _reference(case, arrays)
    with ortgpu.InferenceSession(_model(case, arrays, 0), env=env) as session:
        actual = session.run(None, _feeds(arrays))
    for index, (ours, exact) in enumerate(zip(actual, reference)):
        error = np.max(np.abs(np.asarray(ours, np.float64) - exact)) / np.max(np.abs(exact))
        assert error < 1e-5, f"output {index}: relative error {error:.2e}"


def test_placement_says_webgpu_for_float32_and_cpu_for_float64(env: ortgpu_core.Env) -> None:
    case = _session_case("GRU")
    arrays = _inputs(case, np.random.default_rng(9))
    with ortgpu.InferenceSession(_model(case, arrays, 0), env=env) as session:
        (placement,) = session.get_node_placement()
        assert placement.placement == "webgpu" and placement.capturable
    wide = [None if a is None or a.dtype != F32 else a.astype(np.float64) for a in arrays]
    wide[4] = arrays[4]
    model = onnx.load_from_string(_model(case, arrays, 0))
    for value in list(model.graph.input) + list(model.graph.output):
        if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        (placement,) = session.get_node_placement()
        assert placement.placement == "cpu" and "float64" in placement.reason


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_float16_runs_on_the_device_in_float32(op_type: str, path: str, env: ortgpu_core.Env) -> None:
    """float16 tensors (shader-f16: lavapipe, the fake, GPUs) are read and written as f16, computed in f32: the
    results are the float64 reference's rounded to float16, to a unit or two of float16's last place."""
    case = Case(op_type, {"direction": "bidirectional"}, seq=5, hidden=6, lengths=(5, 2, 0))
    arrays = [
        None if a is None or a.dtype != F32 else a.astype(np.float16) for a in _inputs(case, np.random.default_rng(12))
    ]
    arrays[4] = np.array(case.lengths, np.int32)
    model = onnx.load_from_string(_model(case, arrays, 0))
    for value in model.graph.output:
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    reference = _reference(case, [a if a is None or a.dtype != np.float16 else a.astype(F32) for a in arrays])
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        (placement,) = session.get_node_placement()
        assert placement.placement == "webgpu", placement.reason
        actual = session.run(None, _feeds(arrays))
    for index, (ours, exact) in enumerate(zip(actual, reference)):
        assert np.asarray(ours).dtype == np.float16
        _close(np.asarray(ours, np.float64), exact, 2e-3, f"{op_type} float16 output {index}")


def test_captured_lstm_replays_with_changed_inputs_and_lengths(path: str, env: ortgpu_core.Env) -> None:
    case = _session_case("LSTM")
    rng = np.random.default_rng(10)
    arrays = _inputs(case, rng)
    with ortgpu.InferenceSession(_model(case, arrays, 0), env=env, graph_capture=True) as session:
        values = {name: session.allocator.from_numpy(a) for name, a in _feeds(arrays).items()}
        expected = _onnxruntime(case, arrays)
        outs = [session.allocator.empty(e.shape, "float32") for e in expected]
        binding = session.io_binding()
        for name, value in values.items():
            binding.bind_input(name, value)
        for index, value in enumerate(outs):
            binding.bind_output(f"out{index}", value)
        with session.capture(binding, graph_id=0) as graph:
            for index, value in enumerate(outs):
                _close(value.to_numpy(), expected[index], 2e-5, f"capture run output {index}")
            for lengths in ((1, 6, 3), (0, 4, 6), (6, 6, 6)):
                x = rng.standard_normal((case.seq, case.batch, case.input_size)).astype(F32)
                arrays[0], arrays[4] = x, np.array(lengths, np.int32)
                values["in0"].update_inplace(x)
                values["in4"].update_inplace(np.array(lengths, np.int32))
                case.lengths = lengths
                graph.replay()
                for index, (value, theirs) in enumerate(zip(outs, _onnxruntime(case, arrays))):
                    _close(value.to_numpy(), theirs, 2e-5, f"replay with lengths {lengths} output {index}")
        for value in list(values.values()) + outs:
            value.release()


def test_the_path_choice_follows_the_device_limits() -> None:
    """Split 4 where 1024 invocations fit (hidden 256), one invocation per unit where a workgroup holds 256, the
    per-step path where the hidden size exceeds a workgroup or lavapipe's loop budget would stop the loops."""
    import dataclasses

    from ortgpu.ops import DeviceCaps
    from ortgpu.ops._kernel import LLVMPIPE_LOOP_BUDGET
    from ortgpu.ops.ai_onnx._recurrent_wgsl import Config
    from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

    def config(hidden: int, seq: int) -> Config:
        no = False
        return Config("LSTM", 4, seq, 1, 8, hidden, 1, "forward", 0, no, no, no, no, no, no, no, (True, True, True))

    large = dataclasses.replace(
        DEFAULT_FAKE_LIMITS,
        max_compute_invocations_per_workgroup=1024,
        max_compute_workgroup_size_x=1024,
        max_compute_workgroup_storage_size=49152,
    )
    gpu = DeviceCaps(frozenset(), large)
    assert _recurrent_plan.persistent_split(config(256, 100), gpu) == 4
    assert _recurrent_plan.persistent_split(config(64, 100), gpu) == 4  # shares of 16
    assert _recurrent_plan.persistent_split(config(1024, 100), gpu) == 1
    assert _recurrent_plan.persistent_split(config(2048, 100), gpu) == 0
    small = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
    assert _recurrent_plan.persistent_split(config(256, 100), small) == 1
    assert _recurrent_plan.persistent_split(config(288, 100), small) == 0
    lavapipe = DeviceCaps(frozenset(), large, LLVMPIPE_LOOP_BUDGET)
    assert _recurrent_plan.persistent_split(config(64, 100), lavapipe) == 4
    assert _recurrent_plan.persistent_split(config(256, 2000), lavapipe) == 0  # 2000 * (256 / 4 + 1) iterations


def test_what_stays_on_the_cpu_says_why() -> None:
    from ortgpu.ops import DeviceCaps, NotOnDevice, TensorInfo
    from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

    caps = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)
    lstm = get_operator("LSTM", 14)

    def infos(seq: int, batch: int, dtype: Any) -> list[TensorInfo | None]:
        t = np.dtype(dtype)
        return [TensorInfo((seq, batch, 3), t), TensorInfo((1, 16, 3), t), TensorInfo((1, 16, 4), t)]

    out = [TensorInfo((0,), np.dtype(F32))]
    with pytest.raises(NotOnDevice, match="float32 and float16 only, not float64"):
        lstm.plan(infos(2, 1, np.float64), out, {"hidden_size": 4}, caps, {})
    no_f16 = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)
    with pytest.raises(NotOnDevice, match="float32 only, not float16"):
        lstm.plan(infos(2, 1, np.float16), out, {"hidden_size": 4}, no_f16, {})
    assert lstm.plan(infos(2, 1, np.float16), [TensorInfo((2, 1, 1, 4), np.dtype(np.float16))], {}, caps, {})
    for seq, batch in ((0, 1), (2, 0)):
        with pytest.raises(NotOnDevice, match="empty dimension"):
            lstm.plan(infos(seq, batch, F32), out, {"hidden_size": 4}, caps, {})
    with pytest.raises(NotOnDevice, match="Gelu"):
        lstm.plan(infos(2, 1, F32), out, {"hidden_size": 4, "activations": ["Gelu", "Tanh", "Tanh"]}, caps, {})
    assert lstm.plan(infos(2, 1, F32), [TensorInfo((2, 1, 1, 4), np.dtype(F32))], {"hidden_size": 4}, caps, {})


def test_lstm_clip_leaves_the_cell_output_activation_alone(env: ortgpu_core.Env) -> None:
    """onnxruntime clips the inputs of the gates' and the candidate's activations, not C_t before h(C_t): with a
    small clip the cell state grows past it, and h must follow the unclipped cell (CPU reference and kernels)."""
    attrs = {
        "clip": 0.3,
        "activations": ["Sigmoid", "Affine", "Tanh"],
        "activation_alpha": [5.0],
        "activation_beta": [0.0],
    }
    case = Case("LSTM", attrs, seq=6, hidden=5, lengths=(6, 3, 0))
    arrays = _inputs(case, np.random.default_rng(11))
    expected = _onnxruntime(case, arrays)
    reference = _reference(case, arrays)
    assert np.max(np.abs(reference[2])) > 0.6  # the cell state is well past the clip
    with ortgpu.InferenceSession(_model(case, arrays, 0), env=env) as session:
        actual = session.run(None, _feeds(arrays))
    for index, (ours, theirs, exact) in enumerate(zip(actual, expected, reference)):
        _close(np.asarray(ours), theirs, 2e-5, f"output {index} vs onnxruntime")
        _close(exact.astype(F32), theirs, 2e-5, f"reference output {index} vs onnxruntime")
