"""A hypothesis state machine over the capture workflow (issue 4), on both backends.

Random sequences of: open/close a session, allocate (session-owned or Env-shared), release a value,
update_inplace, copy_from, make a binding, bind/rebind, clear, freeze, capture, replay (sometimes
verified), run_with_iobinding with a graph id (capture or replay) or -1, run / run_with_ort_values with
transient feeds, release a graph (``graph.release()`` or ``session.release_captured_graph``), read a value.

A plain-Python model predicts every step.  Invariants:

* an illegal step raises the documented error class and changes nothing (a snapshot of sessions,
  bindings, locks, pins, value contents, graphs, live native objects and submits is compared);
* every replay or run leaves outputs equal to a numpy reference on the *current* inputs (never stale);
* the real objects agree with the model after every step (released flags, locks, pins, graph ids), and a binding
  locked by a live graph names exactly the values that graph replays (capturing a FrozenIOBinding whose IOBinding
  was rebound since the freeze is refused: locked, that binding would name other buffers);
* at teardown, after releasing graphs, closing sessions and releasing values, nothing leaked.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import models
import numpy as np
import pytest
from conftest import owned_handles, shared_env
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from onnx import numpy_helper

from ortgpu import (
    CapturedGraph,
    CaptureStateError,
    FrozenIOBinding,
    InferenceSession,
    InvalidArgumentError,
    IOBinding,
    OrtValue,
    ProvenanceError,
    ReleasedValueError,
    RunOptions,
    WebGPU,
)

BATCH, WIDTH = 2, 8
_MODEL_PROTO = models.mlp(layers=2, width=WIDTH, batch=BATCH, seed=3)
MODEL = _MODEL_PROTO.SerializeToString()
_W1, _B1, _W2, _B2 = (numpy_helper.to_array(t).astype(np.float64) for t in _MODEL_PROTO.graph.initializer)

MAX_SESSIONS, MAX_VALUES, MAX_BINDINGS, MAX_LIVE_GRAPHS = 4, 10, 7, 3
NAMES = ("X", "Y")


def reference(x: np.ndarray) -> np.ndarray:
    """The MLP in float64 numpy: Y = relu(X W1 + b1) W2 + b2."""
    hidden = np.maximum(x.astype(np.float64) @ _W1 + _B1, 0.0)
    return (hidden @ _W2 + _B2).astype(np.float32)


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=what)


def device_buffer(value: OrtValue[Any]) -> Any:
    """The core's buffer behind a device value: the one internal the machine reads (for its pins).  Users never need
    it; ortgpu keeps it off the public API (``OrtValue._device_buffer``)."""
    return value._device_buffer


def pin_labels(value: OrtValue[Any]) -> tuple[str, ...]:
    """The labels of the captured graphs pinning ``value``'s buffer, sorted."""
    buffer = device_buffer(value)
    return tuple(sorted(map(str, buffer.pins if buffer is not None else ())))


# -- the model of the world ---------------------------------------------------------------------------------


@dataclass
class SessionModel:
    session: InferenceSession
    closed: bool = False


@dataclass
class ValueModel:
    value: OrtValue[Any]
    owner: int | None  # session index, None for Env-shared
    expected: np.ndarray
    released: bool = False


@dataclass
class BindingModel:
    binding: IOBinding | FrozenIOBinding
    session: int
    bound: dict[str, int] = field(default_factory=dict)  # name -> value index
    origin: int | None = None  # frozen: the binding index it was frozen from

    @property
    def frozen(self) -> bool:
        return self.origin is not None


@dataclass
class GraphModel:
    graph: CapturedGraph
    session: int
    graph_id: int
    snapshot: dict[str, int]  # name -> value index (what replay reads and writes)
    binding: int  # the frozen binding index it replays (-1: made inside capture from an IOBinding)
    origin: int  # the IOBinding index it locks
    released: bool = False


class CaptureMachine(RuleBasedStateMachine):
    backend = "fake"

    def __init__(self) -> None:
        super().__init__()
        self.env = shared_env(self.backend)
        gc.collect()
        self.baseline = owned_handles(self.env)
        self.sessions: list[SessionModel] = []
        self.values: list[ValueModel] = []
        self.bindings: list[BindingModel] = []
        self.graphs: list[GraphModel] = []
        self.rng = np.random.default_rng(0)
        self.steps = 0

    # -- helpers --------------------------------------------------------------------------------------------------

    def random_input(self) -> np.ndarray:
        return self.rng.standard_normal((BATCH, WIDTH)).astype(np.float32)

    def pick(self, data: st.DataObject, count: int, usable: Callable[[int], bool], label: str) -> int:
        """An index below ``count``: three times in four a usable one (when there is one), else any."""
        good = [i for i in range(count) if usable(i)]
        if good and data.draw(st.integers(0, 3), label=f"{label}: usable?") != 0:
            return data.draw(st.sampled_from(good), label=label)
        return data.draw(st.integers(0, count - 1), label=label)

    def pick_value(self, data: st.DataObject, label: str = "value") -> int:
        return self.pick(data, len(self.values), lambda i: not self.values[i].released, label)

    def pick_session(self, data: st.DataObject) -> int:
        return self.pick(data, len(self.sessions), lambda i: not self.sessions[i].closed, "session")

    def pick_binding(self, data: st.DataObject, candidates: list[int] | None = None) -> int:
        pool = candidates if candidates is not None else list(range(len(self.bindings)))
        chosen = self.pick(
            data, len(pool), lambda i: not self.sessions[self.bindings[pool[i]].session].closed, "binding"
        )
        return pool[chosen]

    def live_graphs(self) -> list[GraphModel]:
        return [g for g in self.graphs if not g.released]

    def live_graph(self, session: int, graph_id: int) -> GraphModel | None:
        return next((g for g in self.live_graphs() if g.session == session and g.graph_id == graph_id), None)

    def locked(self, binding_index: int) -> bool:
        return any(g.origin == binding_index for g in self.live_graphs())

    def pinned(self, value_index: int) -> bool:
        return any(value_index in g.snapshot.values() for g in self.live_graphs())

    def value_index(self, value: object) -> int:
        return next(i for i, v in enumerate(self.values) if v.value is value)

    def snapshot(self) -> tuple[Any, ...]:
        """Everything an illegal step must leave unchanged."""
        device = self.env.default_device._native_device()
        stats = getattr(device, "stats", None)
        return (
            tuple((s.session.closed, tuple(s.session.captured_graph_ids)) for s in self.sessions),
            tuple(
                (
                    tuple(sorted((n, self.value_index(v)) for n, v in b.binding.inputs().items())),
                    tuple(sorted((n, self.value_index(v)) for n, v in b.binding.outputs().items())),
                    tuple(sorted(map(str, b.binding.captured_by))) if isinstance(b.binding, IOBinding) else None,
                )
                for b in self.bindings
            ),
            tuple(
                (v.value.released, pin_labels(v.value), None if v.value.released else v.value.to_numpy().tobytes())
                for v in self.values
            ),
            tuple((g.graph.released, g.graph.replays) for g in self.graphs),
            owned_handles(self.env),
            None if stats is None else stats.submits,
        )

    def illegal(self, error: type[BaseException], action: Callable[[], object]) -> None:
        """``action`` must raise exactly the documented ``error`` and change nothing."""
        before = self.snapshot()
        with pytest.raises(error) as info:
            action()
        assert type(info.value) is error, f"expected {error.__name__}, got {type(info.value).__name__}: {info.value}"
        event(f"refused: {error.__name__}")
        assert self.snapshot() == before, f"the refused step changed state ({error.__name__}: {info.value})"

    def check_outputs(self, snapshot: dict[str, int], what: str) -> None:
        """After a replay or run over ``snapshot``: Y is the reference of X's current contents."""
        event(f"checked outputs of {what}")
        x, y = self.values[snapshot["X"]], self.values[snapshot["Y"]]
        want = reference(x.expected)
        y.expected = want
        assert_close(y.value.to_numpy(), want, what)

    def capture_error(self, session_index: int, binding_index: int, graph_id: int) -> type[BaseException] | None:
        """The error a capture of ``binding_index`` as ``graph_id`` on ``session_index`` must raise, in check order."""
        binding = self.bindings[binding_index]
        if self.sessions[session_index].closed:
            return ReleasedValueError
        if binding.session != session_index:
            return ProvenanceError
        if self.live_graph(session_index, graph_id) is not None:
            return CaptureStateError
        if binding.frozen and self.bindings[binding.origin].bound != binding.bound:  # type: ignore[index]
            return CaptureStateError  # its IOBinding was rebound since the freeze: locked, it would name other buffers
        if any(name not in binding.bound for name in NAMES):
            return CaptureStateError
        if any(self.values[binding.bound[name]].released for name in NAMES):
            return ReleasedValueError
        if binding.bound["X"] == binding.bound["Y"]:
            return CaptureStateError
        return None

    def record_capture(self, graph: CapturedGraph, session_index: int, binding_index: int, graph_id: int) -> None:
        binding = self.bindings[binding_index]
        origin = binding.origin if binding.frozen else binding_index
        assert origin is not None
        assert graph.graph_id == graph_id and not graph.released
        self.graphs.append(GraphModel(graph, session_index, graph_id, dict(binding.bound), binding_index, origin))
        event("captured")
        self.check_outputs(binding.bound, "the capture run")

    @initialize(shared_input=st.booleans())
    def start(self, shared_input: bool) -> None:
        """One session with a complete binding, so that captures and replays happen from the first steps."""
        self.open_session()
        self.complete_binding(0, shared_input)

    def complete_binding(self, session_index: int, shared_input: bool) -> None:
        """A new binding of ``session_index`` with fresh values bound to X (shared or owned) and Y (owned)."""
        session = self.sessions[session_index].session
        x = self.random_input()
        allocator = self.env.shared_allocator(self.env.default_device) if shared_input else session.allocator
        self.values.append(ValueModel(allocator.from_numpy(x), None if shared_input else session_index, x))
        zeros = np.zeros((BATCH, WIDTH), np.float32)
        self.values.append(ValueModel(session.allocator.empty((BATCH, WIDTH), "float32"), session_index, zeros))
        binding = session.io_binding()
        binding.bind_input("X", self.values[-2].value)
        binding.bind_output("Y", self.values[-1].value)
        self.bindings.append(
            BindingModel(binding, session_index, {"X": len(self.values) - 2, "Y": len(self.values) - 1})
        )

    @precondition(
        lambda self: (
            len(self.values) <= MAX_VALUES - 2
            and len(self.bindings) < MAX_BINDINGS
            and any(not s.closed for s in self.sessions)
        )
    )
    @rule(data=st.data(), shared_input=st.booleans())
    def new_complete_binding(self, data: st.DataObject, shared_input: bool) -> None:
        open_sessions = [i for i, s in enumerate(self.sessions) if not s.closed]
        self.complete_binding(data.draw(st.sampled_from(open_sessions), label="session"), shared_input)

    # -- sessions -------------------------------------------------------------------------------------------------

    @precondition(lambda self: len(self.sessions) < MAX_SESSIONS and sum(not s.closed for s in self.sessions) < 2)
    @rule()
    def open_session(self) -> None:
        session = InferenceSession(MODEL, env=self.env, device=self.env.default_device, graph_capture=True)
        self.sessions.append(SessionModel(session))

    @precondition(lambda self: self.sessions and self.steps >= 15)  # late: a closed session refuses everything after
    @rule(data=st.data())
    def close_session(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.sessions) - 1), label="session")
        self.sessions[index].session.close()  # idempotent
        self.sessions[index].closed = True
        for graph in self.graphs:
            if graph.session == index:
                graph.released = True
        for value in self.values:
            if value.owner == index:
                value.released = True

    # -- values -----------------------------------------------------------------------------------------------------

    @precondition(lambda self: len(self.values) < MAX_VALUES)
    @rule(data=st.data(), zeros=st.booleans())
    def allocate(self, data: st.DataObject, zeros: bool) -> None:
        owner = None if data.draw(st.booleans(), label="shared") else self.pick_session(data)
        array = np.zeros((BATCH, WIDTH), np.float32) if zeros else self.random_input()
        if owner is None:
            allocator = self.env.shared_allocator(self.env.default_device)
            value = allocator.empty((BATCH, WIDTH), "float32") if zeros else allocator.from_numpy(array)
        else:
            session = self.sessions[owner].session
            if self.sessions[owner].closed:
                self.illegal(
                    ReleasedValueError, lambda: session.create_ortvalue_from_shape_and_type((BATCH, WIDTH), "float32")
                )
                self.illegal(ReleasedValueError, lambda: session.allocator.from_numpy(array))
                return
            if zeros:
                value = session.create_ortvalue_from_shape_and_type(
                    (BATCH, WIDTH), "float32", "webgpu", session.device.index
                )
            else:
                value = session.allocator.from_numpy(array)
            assert value.provenance.session_id == session.session_id
        self.values.append(ValueModel(value, owner, array))

    @precondition(lambda self: self.values)
    @rule(data=st.data())
    def release_value(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.values) - 1), label="value")
        value = self.values[index]
        if not value.released and self.pinned(index):
            self.illegal(CaptureStateError, value.value.release)
            return
        value.value.release()  # idempotent on a released value
        value.released = True

    @precondition(lambda self: self.values)
    @rule(data=st.data())
    def update_inplace(self, data: st.DataObject) -> None:
        value = self.values[self.pick_value(data)]
        array = self.random_input()
        if value.released:
            self.illegal(ReleasedValueError, lambda: value.value.update_inplace(array))
            return
        value.value.update_inplace(array)
        value.expected = array

    @precondition(lambda self: len(self.values) >= 2)
    @rule(data=st.data())
    def copy_from(self, data: st.DataObject) -> None:
        source_index = self.pick_value(data, "source")
        offset = data.draw(st.integers(1, len(self.values) - 1), label="target offset")
        target_index = (source_index + offset) % len(self.values)  # never the source itself
        source, target = self.values[source_index], self.values[target_index]
        if source.released or target.released:
            self.illegal(ReleasedValueError, lambda: target.value.copy_from(source.value))
            return
        target.value.copy_from(source.value)
        target.expected = source.expected.copy()

    @precondition(lambda self: self.values)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        value = self.values[self.pick_value(data)]
        if value.released:
            self.illegal(ReleasedValueError, value.value.to_numpy)
            return
        assert_close(value.value.to_numpy(), value.expected, "a value's contents")

    # -- bindings ---------------------------------------------------------------------------------------------------

    @precondition(lambda self: self.sessions and len(self.bindings) < MAX_BINDINGS)
    @rule(data=st.data())
    def new_binding(self, data: st.DataObject) -> None:
        index = self.pick_session(data)
        session = self.sessions[index]
        if session.closed:
            self.illegal(ReleasedValueError, session.session.io_binding)
            return
        self.bindings.append(BindingModel(session.session.io_binding(), index))

    def _mutable_bindings(self) -> list[int]:
        return [i for i, b in enumerate(self.bindings) if not b.frozen]

    @precondition(lambda self: self.values and any(not b.frozen for b in self.bindings))
    @rule(data=st.data(), name=st.sampled_from(NAMES))
    def bind(self, data: st.DataObject, name: str) -> None:
        binding_index = self.pick_binding(data, self._mutable_bindings())
        value_index = self.pick(
            data,
            len(self.values),
            lambda i: (
                not self.values[i].released and self.values[i].owner in (None, self.bindings[binding_index].session)
            ),
            "value",
        )
        binding, value = self.bindings[binding_index], self.values[value_index]
        real = binding.binding
        assert isinstance(real, IOBinding)
        method = real.bind_input if name == "X" else real.bind_output
        if self.locked(binding_index):
            self.illegal(CaptureStateError, lambda: method(name, value.value))
        elif self.sessions[binding.session].closed or value.released:
            self.illegal(ReleasedValueError, lambda: method(name, value.value))
        elif value.owner is not None and value.owner != binding.session:
            self.illegal(ProvenanceError, lambda: method(name, value.value))
        else:
            method(name, value.value)
            binding.bound[name] = value_index

    @precondition(lambda self: any(not b.frozen for b in self.bindings))
    @rule(data=st.data(), which=st.sampled_from(["inputs", "outputs"]))
    def clear(self, data: st.DataObject, which: str) -> None:
        binding_index = self.pick_binding(data, self._mutable_bindings())
        binding = self.bindings[binding_index]
        real = binding.binding
        assert isinstance(real, IOBinding)
        action = real.clear_binding_inputs if which == "inputs" else real.clear_binding_outputs
        if self.locked(binding_index):
            self.illegal(CaptureStateError, action)
            return
        action()
        binding.bound.pop("X" if which == "inputs" else "Y", None)

    @precondition(lambda self: len(self.bindings) < MAX_BINDINGS and any(not b.frozen for b in self.bindings))
    @rule(data=st.data())
    def freeze(self, data: st.DataObject) -> None:
        binding_index = self.pick_binding(data, self._mutable_bindings())
        binding = self.bindings[binding_index]
        real = binding.binding
        assert isinstance(real, IOBinding)
        frozen = real.freeze()
        assert frozen.origin is real and not hasattr(frozen, "bind_input")
        self.bindings.append(BindingModel(frozen, binding.session, dict(binding.bound), binding_index))

    # -- capture, replay, release -------------------------------------------------------------------------------------

    @precondition(lambda self: self.bindings and len(self.live_graphs()) < MAX_LIVE_GRAPHS)
    @rule(data=st.data(), graph_id=st.integers(0, 1))
    def capture(self, data: st.DataObject, graph_id: int) -> None:
        binding_index = self.pick_binding(data)
        binding = self.bindings[binding_index]
        other = data.draw(st.integers(0, 5), label="capture on another session") == 5 and len(self.sessions) > 1
        session_index = (binding.session + 1) % len(self.sessions) if other else binding.session
        session = self.sessions[session_index].session
        error = self.capture_error(session_index, binding_index, graph_id)
        if error is not None:
            self.illegal(error, lambda: session.capture(binding.binding, graph_id=graph_id))
            return
        graph = session.capture(binding.binding, graph_id=graph_id)
        self.record_capture(graph, session_index, binding_index, graph_id)

    @precondition(lambda self: self.bindings and len(self.live_graphs()) < MAX_LIVE_GRAPHS)
    @rule(data=st.data(), graph_id=st.integers(-1, 1))
    def run_with_iobinding(self, data: st.DataObject, graph_id: int) -> None:
        binding_index = self.pick_binding(data)
        binding = self.bindings[binding_index]
        session_model = self.sessions[binding.session]
        session = session_model.session
        options = RunOptions(gpu_graph_id=graph_id)

        def run() -> None:
            session.run_with_iobinding(binding.binding, options)

        if session_model.closed:
            self.illegal(ReleasedValueError, run)
            return
        if graph_id == -1:
            if any(name not in binding.bound for name in NAMES):
                self.illegal(InvalidArgumentError, run)
            elif any(self.values[binding.bound[name]].released for name in NAMES):
                self.illegal(ReleasedValueError, run)
            elif binding.bound["X"] == binding.bound["Y"]:
                self.illegal(InvalidArgumentError, run)  # one value as input and output: only a cache may be
            else:
                run()
                self.check_outputs(binding.bound, "an ordinary run_with_iobinding")
            return
        graph = self.live_graph(binding.session, graph_id)
        if graph is None:
            error = self.capture_error(binding.session, binding_index, graph_id)
            if error is not None:
                self.illegal(error, run)
                return
            run()
            self.record_capture(session.captured_graph(graph_id), binding.session, binding_index, graph_id)
            return
        same_binding = binding_index in (graph.binding, graph.origin) or binding.origin == graph.origin
        if not same_binding or binding.bound != graph.snapshot:
            self.illegal(CaptureStateError, run)
            return
        replays = graph.graph.replays
        run()
        assert graph.graph.replays == replays + 1
        self.check_outputs(graph.snapshot, "a replay through run_with_iobinding")

    @precondition(lambda self: self.graphs)
    @rule(data=st.data(), verify=st.booleans())
    def replay(self, data: st.DataObject, verify: bool) -> None:
        graph = self.graphs[self.pick(data, len(self.graphs), lambda i: not self.graphs[i].released, "graph")]
        if graph.released:
            self.illegal(CaptureStateError, lambda: graph.graph.replay(verify=verify))
            return
        graph.graph.replay(verify=verify)
        self.check_outputs(graph.snapshot, f"a replay (verify={verify})")

    @precondition(lambda self: self.graphs)
    @rule(data=st.data(), by_id=st.booleans())
    def release_graph(self, data: st.DataObject, by_id: bool) -> None:
        graph = self.graphs[data.draw(st.integers(0, len(self.graphs) - 1), label="graph")]
        session = self.sessions[graph.session].session
        if by_id:
            live = self.live_graph(graph.session, graph.graph_id)
            if live is None:
                self.illegal(CaptureStateError, lambda: session.release_captured_graph(graph.graph_id))
                return
            graph = live
            returned = session.release_captured_graph(graph.graph_id)
        else:
            was_released = graph.released
            returned = graph.graph.release()  # idempotent
            if was_released:
                assert returned is None or returned is self.bindings[graph.origin].binding
                return
        assert returned is self.bindings[graph.origin].binding
        graph.released = True
        assert graph.graph.released

    # -- transient runs ----------------------------------------------------------------------------------------------

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), with_values=st.booleans())
    def run_transient(self, data: st.DataObject, with_values: bool) -> None:
        session_index = self.pick_session(data)
        model = self.sessions[session_index]
        session = model.session
        ordinary = RunOptions(gpu_graph_id=-1)
        array = self.random_input()
        if not with_values or not self.values:

            def run_arrays() -> list[np.ndarray]:
                return session.run(None, {"X": array}, ordinary)

            if model.closed:
                self.illegal(ReleasedValueError, run_arrays)
                return
            assert_close(run_arrays()[0], reference(array), "run() with gpu_graph_id=-1")
            return
        value = self.values[self.pick_value(data)]

        def run() -> list[OrtValue[WebGPU]]:
            return session.run_with_ort_values(None, {"X": value.value}, ordinary)

        if model.closed or value.released:
            self.illegal(ReleasedValueError, run)
            return
        if value.owner is not None and value.owner != session_index:
            self.illegal(ProvenanceError, run)
            return
        (output,) = run()
        assert output.provenance.session_id == session.session_id and output.provenance.allocator_kind == "session"
        assert_close(output.to_numpy(), reference(value.expected), "run_with_ort_values with gpu_graph_id=-1")
        output.release()

    # -- invariants ---------------------------------------------------------------------------------------------------

    @invariant()
    def real_state_matches_the_model(self) -> None:
        self.steps += 1
        for index, session in enumerate(self.sessions):
            assert session.session.closed == session.closed
            live_ids = sorted(g.graph_id for g in self.live_graphs() if g.session == index)
            assert session.session.captured_graph_ids == live_ids
        for graph in self.graphs:
            assert graph.graph.released == graph.released
        for index, value in enumerate(self.values):
            assert value.value.released == value.released
            labels = tuple(
                sorted(str(g.graph.label) for g in self.live_graphs() for v in g.snapshot.values() if v == index)
            )
            assert device_buffer(value.value) is not None
            assert pin_labels(value.value) == labels
        for index, binding in enumerate(self.bindings):
            bound = {**binding.binding.inputs(), **binding.binding.outputs()}
            assert {n: self.value_index(v) for n, v in bound.items()} == binding.bound
            if not binding.frozen:
                assert isinstance(binding.binding, IOBinding)
                lockers = sorted(str(g.graph.label) for g in self.live_graphs() if g.origin == index)
                assert sorted(map(str, binding.binding.captured_by)) == lockers
        for graph in self.live_graphs():
            # A locked binding names exactly what its graph replays (the real objects, not the model's indices).
            replayed = graph.graph.binding
            origin = self.bindings[graph.origin].binding
            assert replayed.origin is origin
            for name, value in {**replayed.inputs(), **replayed.outputs()}.items():
                assert {**origin.inputs(), **origin.outputs()}.get(name) is value, f"{name} of {graph.graph.label}"
            assert len(origin.inputs()) + len(origin.outputs()) == len(replayed.inputs()) + len(replayed.outputs())

    def teardown(self) -> None:
        event(f"steps: {min(self.steps // 10 * 10, 40)}+, graphs captured: {min(len(self.graphs), 3)}+")
        for graph in self.graphs:
            graph.graph.release()
        for session in self.sessions:
            session.session.close()
        for value in self.values:
            value.value.release()
        self.graphs.clear()
        self.bindings.clear()
        self.values.clear()
        self.sessions.clear()
        gc.collect()
        leaked = owned_handles(self.env) - self.baseline
        assert leaked == 0, f"{leaked} native object(s) leaked on the {self.backend} backend"


class FakeCaptureMachine(CaptureMachine):
    backend = "fake"


class WgpuCaptureMachine(CaptureMachine):
    backend = "wgpu"


# CI (``CI`` set, as .ci/run does) replays the same derandomized sequences every run, so a landing cannot hinge on
# luck; locally each run explores new sequences.
_COMMON = dict(
    deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], derandomize=bool(os.environ.get("CI"))
)

FakeCaptureMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, **_COMMON)  # type: ignore[arg-type]
WgpuCaptureMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, **_COMMON)  # type: ignore[arg-type]
TestCaptureStateMachineFake = pytest.mark.fake_only(FakeCaptureMachine.TestCase)
TestCaptureStateMachineWgpu = pytest.mark.wgpu_only(WgpuCaptureMachine.TestCase)
