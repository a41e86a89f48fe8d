"""The capture state machine with copies, pickles, garbage collection and a second thread (issue 10).

:class:`ThreadedCaptureMachine` keeps every rule, model and invariant of
:class:`test_capture_state_machine.CaptureMachine` and adds:

* ``copy_or_pickle``: ``copy.copy``, ``copy.deepcopy`` or ``pickle.dumps`` (any protocol) of a random object of the
  model: a device value, the buffer behind it, a binding (mutable, frozen, or a graph's own), a graph, a session, an
  allocator, the Env, its device.  Each raises exactly ``UnsafeAccessError`` and changes nothing, even once the
  collector has run (a half-made copy must not free, unpin or unlock anything).  A provenance copies to itself and
  refuses pickling; a CPU value copies and round-trips through pickle with equal, independent data.
* ``drop_session``: every reference the machine holds to a session, its bindings, its graphs and its values is
  dropped without ``close()``, then ``gc.collect()``: the session is collected, and each Env-shared value its graphs
  pinned is unpinned, intact and releasable.  (Teardown's leak check then covers what the session owned.)
* ``drop_graph_reference``: a live graph's object is dropped while its session lives: after ``gc.collect()`` the
  graph is still registered, still pins and locks, and replays correctly through ``session.captured_graph(id)`` or
  ``run_with_iobinding``.  A released graph's object is dropped too, changing nothing.
* ``race``: a second thread mutates the bindings of one session (bind, rebind, clear) and releases its graphs for
  20-50 steps, while this thread captures and replays.  The mutator may only see ``CaptureStateError`` or
  ``ReleasedValueError``; each capture and replay that succeeds writes the reference of its inputs; after the join
  the model adopts the real state (which graphs the mutator released, what each binding names), every live graph's
  locked binding names exactly what the graph replays, and every live graph replays to the reference of its
  inputs' current contents.  These hold for every interleaving (the switch interval is shortened to vary them).
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import random
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from test_capture_state_machine import CaptureMachine, GraphModel, assert_close, device_buffer, reference

from ortgpu import (
    CapturedGraph,
    CaptureStateError,
    IOBinding,
    OrtValue,
    Provenance,
    ReleasedValueError,
    RunOptions,
    UnsafeAccessError,
)

COPIES: dict[str, Callable[[object, int], object]] = {
    "copy.copy": lambda obj, protocol: copy.copy(obj),
    "copy.deepcopy": lambda obj, protocol: copy.deepcopy(obj),
    "pickle.dumps": lambda obj, protocol: pickle.dumps(obj, protocol=protocol),
}
RACE_ERRORS = (CaptureStateError, ReleasedValueError)  # what a racing bind, clear, release, capture or replay may raise
MAX_CPU_VALUES = 2


class ThreadedCaptureMachine(CaptureMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cpu_values: list[tuple[OrtValue[Any], np.ndarray]] = []  # (value, expected contents)

    def teardown(self) -> None:
        # A failed drop_graph_reference may leave a model without its graph object: the session still releases it.
        self.graphs = [g for g in self.graphs if g.graph is not None]
        super().teardown()

    def names(self, binding: Any) -> dict[str, int]:
        """What a real binding names: name -> value index."""
        return {n: self.value_index(v) for n, v in {**binding.inputs(), **binding.outputs()}.items()}

    # -- copy and pickle --------------------------------------------------------------------------------------------

    def copy_targets(self) -> dict[str, list[object]]:
        env, device = self.env, self.env.default_device
        return {
            "device value": [v.value for v in self.values],
            "device buffer": [device_buffer(v.value) for v in self.values],
            "IOBinding": [b.binding for b in self.bindings if not b.frozen],
            "FrozenIOBinding": [b.binding for b in self.bindings if b.frozen]
            + [g.graph.binding for g in self.live_graphs()],
            "CapturedGraph": [g.graph for g in self.graphs],
            "InferenceSession": [s.session for s in self.sessions],
            "SessionAllocator": [s.session.allocator for s in self.sessions],
            "SharedAllocator": [env.shared_allocator(device)],
            "Env": [env],
            "Device": [device],
            "Provenance": [v.value.provenance for v in self.values] + [v.provenance for v, _ in self.cpu_values],
            "CPU value": list(range(len(self.cpu_values))),
        }

    @precondition(lambda self: len(self.cpu_values) < MAX_CPU_VALUES)
    @rule()
    def cpu_value(self) -> None:
        array = self.random_input()
        value = OrtValue.ortvalue_from_numpy(array)
        assert value.device_name() == "cpu"
        self.cpu_values.append((value, array.copy()))

    @rule(data=st.data(), how=st.sampled_from(sorted(COPIES)), protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
    def copy_or_pickle(self, data: st.DataObject, how: str, protocol: int) -> None:
        targets = self.copy_targets()
        kind = data.draw(st.sampled_from(sorted(k for k, objects in targets.items() if objects)), label="kind")
        target = targets[kind][data.draw(st.integers(0, len(targets[kind]) - 1), label=kind)]
        del targets
        event(f"{how} of a {kind}")
        if kind == "CPU value":
            assert isinstance(target, int)
            self.copied_cpu_value(target, how, protocol)
        elif kind == "Provenance" and how != "pickle.dumps":
            assert isinstance(target, Provenance)
            assert COPIES[how](target, protocol) is target, f"{how} of an immutable Provenance is the object itself"
        else:
            self.refused_copy(lambda: COPIES[how](target, protocol))

    def refused_copy(self, action: Callable[[], object]) -> None:
        """``action`` (a copy or pickle) raises exactly ``UnsafeAccessError`` and changes nothing, collected or not."""
        before = self.snapshot()
        with pytest.raises(UnsafeAccessError) as info:
            action()
        assert type(info.value) is UnsafeAccessError, f"{type(info.value).__name__}: {info.value}"
        assert isinstance(info.value, TypeError)  # what copy and pickle callers catch
        del info
        gc.collect()  # whatever a refused copy left behind dies now: it must free, unpin and unlock nothing
        assert self.snapshot() == before, "a refused copy or pickle changed state"

    def copied_cpu_value(self, index: int, how: str, protocol: int) -> None:
        """A CPU value copies (and pickles) its data: equal contents, independent of the original both ways."""
        value, expected = self.cpu_values[index]
        before = self.snapshot()
        made = COPIES[how](value, protocol)
        if how == "pickle.dumps":
            assert isinstance(made, bytes)
            made = pickle.loads(made)
        assert isinstance(made, OrtValue) and made is not value
        assert made.device_name() == "cpu" and made.provenance == value.provenance
        assert made.shape() == value.shape() and made.dtype == value.dtype
        np.testing.assert_array_equal(made.numpy(), expected)
        assert not np.shares_memory(made.numpy(), value.numpy()), f"{how} of a CPU value shares its memory"
        into_copy, into_original = self.random_input(), self.random_input()
        made.update_inplace(into_copy)
        np.testing.assert_array_equal(value.numpy(), expected, err_msg="writing the copy changed the original")
        value.update_inplace(into_original)
        self.cpu_values[index] = (value, into_original.copy())
        np.testing.assert_array_equal(made.numpy(), into_copy, err_msg="writing the original changed the copy")
        made.release()
        np.testing.assert_array_equal(value.numpy(), into_original, err_msg="releasing the copy changed the original")
        assert self.snapshot() == before, "copying a CPU value changed device state"

    # -- garbage collection -----------------------------------------------------------------------------------------

    def forget_session(self, index: int) -> None:
        """Drop session ``index`` from the model with its values, bindings and graphs; renumber the rest."""
        keep_sessions = [i for i in range(len(self.sessions)) if i != index]
        keep_values = [i for i, v in enumerate(self.values) if v.owner != index]
        keep_bindings = [i for i, b in enumerate(self.bindings) if b.session != index]
        sessions = {old: new for new, old in enumerate(keep_sessions)}
        values = {old: new for new, old in enumerate(keep_values)}
        bindings = {old: new for new, old in enumerate(keep_bindings)}
        for i in keep_values:
            value = self.values[i]
            value.owner = None if value.owner is None else sessions[value.owner]
        for i in keep_bindings:
            binding = self.bindings[i]
            binding.session = sessions[binding.session]
            binding.bound = {name: values[v] for name, v in binding.bound.items()}
            binding.origin = None if binding.origin is None else bindings[binding.origin]
        kept_graphs = [g for g in self.graphs if g.session != index]
        for graph in kept_graphs:
            graph.session = sessions[graph.session]
            graph.snapshot = {name: values[v] for name, v in graph.snapshot.items()}
            graph.binding, graph.origin = bindings[graph.binding], bindings[graph.origin]
        self.sessions = [self.sessions[i] for i in keep_sessions]
        self.values = [self.values[i] for i in keep_values]
        self.bindings = [self.bindings[i] for i in keep_bindings]
        self.graphs = kept_graphs

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def drop_session(self, data: st.DataObject) -> None:
        """Drop a session without close(): collected, it unpins the Env-shared values its graphs pinned."""
        index = self.pick_session(data)
        was_open = not self.sessions[index].closed
        shared = sorted(
            {
                v
                for g in self.live_graphs()
                if g.session == index
                for v in g.snapshot.values()
                if self.values[v].owner is None
            }
        )
        unpinned = [self.values[v] for v in shared]  # ValueModel objects survive the renumbering
        session_ref = weakref.ref(self.sessions[index].session)
        binding_refs = [weakref.ref(b.binding) for b in self.bindings if b.session == index]
        self.forget_session(index)
        if not self.sessions:
            self.open_session()  # the machine's rules assume a session exists (as it always has one)
        gc.collect()
        if session_ref() is not None:
            holders = sorted({type(r).__name__ for r in gc.get_referrers(session_ref())})
            raise AssertionError(f"a dropped session was not collected; referred to by {holders}")
        assert all(ref() is None for ref in binding_refs), "a dropped session's binding was not collected"
        event(
            f"dropped {'an open' if was_open else 'a closed'} session whose graphs pinned {min(len(unpinned), 2)}+ shared values"
        )
        for value in unpinned:
            value_index = next(i for i, v in enumerate(self.values) if v is value)
            assert not value.value.released, "a shared value was released with a session that did not own it"
            assert_close(value.value.to_numpy(), value.expected, "a shared value once pinned by a dropped session")
            if not self.pinned(value_index) and data.draw(st.booleans(), label="release it now"):
                value.value.release()  # unpinned: this must not raise CaptureStateError
                value.released = True
                event("released a shared value a dropped session had pinned")

    @precondition(lambda self: self.graphs)
    @rule(data=st.data(), through_run=st.booleans())
    def drop_graph_reference(self, data: st.DataObject, through_run: bool) -> None:
        """Drop a graph object: a live one stays registered (its session keeps it) and replays; a released one goes."""
        position = data.draw(st.integers(0, len(self.graphs) - 1), label="graph")
        model = self.graphs[position]
        if model.released:
            before = self.snapshot()
            del self.graphs[position], model
            gc.collect()
            after = self.snapshot()
            assert after[:3] == before[:3] and after[3] == before[3][:position] + before[3][position + 1 :]
            assert after[4] <= before[4] and after[5] == before[5]
            event("dropped a released graph")
            return
        session = self.sessions[model.session].session
        origin = self.bindings[model.origin].binding
        replays, label = model.graph.replays, str(model.graph.label)
        model.graph = None  # type: ignore[assignment]  # the machine's only reference
        gc.collect()
        assert model.graph_id in session.captured_graph_ids, "a live graph was forgotten when its object was dropped"
        assert label in map(str, origin.captured_by), "a live graph unlocked its binding when its object was dropped"
        if through_run:
            session.run_with_iobinding(origin, RunOptions(gpu_graph_id=model.graph_id))
        else:
            session.captured_graph(model.graph_id).replay()
        self.check_outputs(model.snapshot, "a replay of a graph whose object was dropped")
        model.graph = session.captured_graph(model.graph_id)
        assert str(model.graph.label) == label and model.graph.replays == replays + 1 and not model.graph.released
        event(
            f"dropped a live graph's object, replayed it through {'run_with_iobinding' if through_run else 'captured_graph'}"
        )

    # -- a second thread --------------------------------------------------------------------------------------------

    def race_sessions(self) -> list[int]:
        """Open sessions with a mutable binding and a value the mutator may bind."""
        return [
            s
            for s, model in enumerate(self.sessions)
            if not model.closed
            and any(b.session == s and not b.frozen for b in self.bindings)
            and any(not v.released and v.owner in (None, s) for v in self.values)
        ]

    @precondition(lambda self: self.race_sessions())
    @rule(data=st.data(), seed=st.integers(0, 2**32 - 1), mutations=st.integers(20, 50), steps=st.integers(3, 10))
    def race(self, data: st.DataObject, seed: int, mutations: int, steps: int) -> None:
        s = data.draw(st.sampled_from(self.race_sessions()), label="session")
        session = self.sessions[s].session
        ours = [i for i, b in enumerate(self.bindings) if b.session == s]
        mutable_indices = [i for i in ours if not self.bindings[i].frozen]
        mutable = [self.bindings[i].binding for i in mutable_indices]
        names_before = {i: dict(self.bindings[i].bound) for i in mutable_indices}
        graphs_before = len(self.graphs)
        pool = [v.value for v in self.values if not v.released and v.owner in (None, s)]
        # Every graph of the session this thread knows, with what it replays (name -> value index).
        known: list[tuple[CapturedGraph, dict[str, int]]] = [
            (g.graph, dict(g.snapshot)) for g in self.live_graphs() if g.session == s
        ]
        captured: list[tuple[CapturedGraph, int]] = []  # graphs captured here, with the binding index captured
        released: list[tuple[CapturedGraph, dict[str, OrtValue[Any]]]] = []  # by the mutator: (graph, what it named)
        unexpected: list[str] = []
        start = threading.Barrier(2, timeout=60)

        def mutate() -> None:
            rng = random.Random(seed)
            try:
                start.wait()
                for _ in range(mutations):
                    try:
                        op = rng.randrange(8)
                        binding = rng.choice(mutable)
                        if op < 3:
                            binding.bind_input("X", rng.choice(pool))
                        elif op < 5:
                            binding.bind_output("Y", rng.choice(pool))
                        elif op == 5:
                            (binding.clear_binding_inputs if rng.random() < 0.5 else binding.clear_binding_outputs)()
                        else:
                            graph_id = rng.randrange(2)
                            graph = session.captured_graph(graph_id)  # only this thread releases: it stays live
                            frozen = graph.binding
                            released.append((graph, {**frozen.inputs(), **frozen.outputs()}))
                            if op == 6:
                                graph.release()
                            else:
                                session.release_captured_graph(graph_id)
                    except RACE_ERRORS:
                        pass
                    except BaseException:
                        unexpected.append(traceback.format_exc())
                    time.sleep(rng.choice((0.0, 0.0, 1e-4)))
            except BaseException:
                unexpected.append(traceback.format_exc())

        rng = random.Random(seed ^ 0x5EED)
        thread = threading.Thread(target=mutate, name="binding mutator", daemon=True)
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)
        thread.start()
        try:
            start.wait()
            for _ in range(steps):
                self.race_step(rng, session, ours, known, captured, released)
        finally:
            thread.join(timeout=120)
            sys.setswitchinterval(switch_interval)
        assert not thread.is_alive(), "the mutator thread did not finish (a deadlock?)"
        assert not unexpected, "the mutator thread raised:\n" + "\n".join(unexpected)
        event(f"race: {len(captured)} captured, {len(released)} released by the mutator")

        # Adopt the real state: which graphs the mutator released, what each binding names now.
        gone = [graph for graph, _ in released]
        assert all(any(g is graph for g, _ in known) for graph in gone), "the mutator released a graph nobody captured"
        for model in self.graphs:
            if model.session == s and not model.released:
                model.released = model.graph.released
                assert model.released == any(g is model.graph for g in gone), f"{model.graph!r} released by nobody"
        for graph, binding_index in captured:
            snapshot = next(names for g, names in known if g is graph)
            binding = self.bindings[binding_index]
            origin = binding.origin if binding.frozen else binding_index
            assert origin is not None
            self.graphs.append(GraphModel(graph, s, graph.graph_id, snapshot, binding_index, origin, graph.released))
            assert graph.released == any(g is graph for g in gone), f"{graph!r} released by nobody"
        for index in mutable_indices:
            self.bindings[index].bound = self.names(self.bindings[index].binding)
        self.real_state_matches_the_model()  # locks, pins, registered ids and bindings agree with the adopted model
        self.steps -= 1  # (that invariant counts the machine's steps)

        # A locked binding names exactly what its graph replays (capture froze and locked in one step), and every live
        # graph replays to the reference of the current contents of the inputs its binding names.
        for model in self.live_graphs():
            frozen, origin_binding = model.graph.binding, self.bindings[model.origin].binding
            assert frozen.origin is origin_binding
            assert {**origin_binding.inputs(), **origin_binding.outputs()} == {**frozen.inputs(), **frozen.outputs()}, (
                f"graph {model.graph.label} replays other buffers than its locked binding names "
                f"({self.names(frozen)} against {self.names(origin_binding)})"
            )
            if model.session == s:
                x = frozen.inputs()["X"].to_numpy()
                assert_close(x, self.values[model.snapshot["X"]].expected, "an input after the race")
                model.graph.replay()
                assert_close(frozen.outputs()["Y"].to_numpy(), reference(x), "a replay after the race")
                self.values[model.snapshot["Y"]].expected = reference(x)

        # Back to a state that does not depend on the interleaving, so that hypothesis draws the same choices when it
        # replays this example: every graph of the session released (the ones captured here forgotten), and each
        # mutable binding naming what it named before (less values released since, which cannot be bound).
        for model in self.graphs:
            if model.session == s and not model.released:
                model.graph.release()
                model.released = True
        del self.graphs[graphs_before:]
        for index, bound in names_before.items():
            binding = self.bindings[index]
            real = binding.binding
            assert isinstance(real, IOBinding)
            real.clear_binding_inputs()
            real.clear_binding_outputs()
            binding.bound = {name: v for name, v in bound.items() if not self.values[v].released}
            for name, v in binding.bound.items():
                (real.bind_input if name == "X" else real.bind_output)(name, self.values[v].value)

    def race_step(
        self,
        rng: random.Random,
        session: Any,
        ours: list[int],
        known: list[tuple[CapturedGraph, dict[str, int]]],
        captured: list[tuple[CapturedGraph, int]],
        released: list[tuple[CapturedGraph, dict[str, OrtValue[Any]]]],
    ) -> None:
        """One capture or replay of this thread while the mutator runs; a success is checked at once."""
        op = rng.randrange(3)
        if op == 0:
            binding_index = rng.choice(ours)
            try:
                graph = session.capture(self.bindings[binding_index].binding, graph_id=rng.randrange(2))
            except RACE_ERRORS:
                return
            try:
                snapshot = self.names(graph.binding)
            except CaptureStateError:  # released by the mutator already, which noted what it named first
                snapshot = next(
                    {n: self.value_index(v) for n, v in named.items()} for g, named in released if g is graph
                )
            known.append((graph, snapshot))
            captured.append((graph, binding_index))
            self.check_outputs(snapshot, "a capture run racing the mutator")
            return
        if op == 1:
            if not known:
                return
            graph, snapshot = rng.choice(known)
        else:
            try:
                graph = session.captured_graph(rng.randrange(2))
            except CaptureStateError:
                return
            found = next((entry for entry in known if entry[0] is graph), None)
            assert found is not None, "the session registers a graph this thread did not capture"
            graph, snapshot = found
        try:
            graph.replay()
        except CaptureStateError:
            assert graph.released, "replay refused a live graph"
            return
        self.check_outputs(snapshot, "a replay racing the mutator")


class FakeThreadedCaptureMachine(ThreadedCaptureMachine):
    backend = "fake"


class WgpuThreadedCaptureMachine(ThreadedCaptureMachine):
    backend = "wgpu"


# As in test_capture_state_machine: derandomized under CI, new sequences locally.
_COMMON = dict(
    deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], derandomize=bool(os.environ.get("CI"))
)

FakeThreadedCaptureMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=40, **_COMMON)  # type: ignore[arg-type]
WgpuThreadedCaptureMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=40, **_COMMON)  # type: ignore[arg-type]
TestThreadedCaptureStateMachineFake = pytest.mark.fake_only(FakeThreadedCaptureMachine.TestCase)
TestThreadedCaptureStateMachineWgpu = pytest.mark.wgpu_only(WgpuThreadedCaptureMachine.TestCase)
