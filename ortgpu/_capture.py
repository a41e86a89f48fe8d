"""Capture, replay and verify: the captured graphs of one session.

:class:`GraphRegistry` holds a session's graphs by id and the capture lock that makes
registering one atomic; a session's runner owns one, and the session delegates ``capture``,
``captured_graph``, ``release_captured_graph`` and the capture/replay branch of
``run_with_iobinding`` to it.  The registry keeps no reference to its runner (the
:class:`CaptureHost` is passed to the methods that need it), so it adds no reference cycle.
This module imports neither the session nor the runner: what capture needs from them is
the :class:`CaptureHost` protocol.

The checks that only concern capture live here too: which graph ids a session accepts,
and which bindings may replay a graph; and the verify mode that compares a replay with
an uncaptured run.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol, Union

import numpy as np

from ortgpu_core import (
    CPU,
    ArgumentTypeError,
    CaptureStateError,
    DeviceLostError,
    InvalidArgumentError,
    OrtValue,
    ReleasedValueError,
    SessionAllocator,
    WebGPU,
)
from ortgpu_core._binding import FrozenIOBinding, IOBinding
from ortgpu_core._graph import CapturedGraph, GraphLabel, PinSet
from ortgpu_core._owner import GraphOwner
from ortgpu_core._replay import GraphSubmitter, ReadRange, ReplayWork
from ortgpu_core._value import DeviceBuffer
from ortgpu_core.backends._commands import CommandList

from ._executor import DeviceProgram
from ._planner import ExecutionPlan

AnyBinding = Union[IOBinding, FrozenIOBinding]
AnyValue = Union[OrtValue[CPU], OrtValue[WebGPU]]


class CaptureHost(GraphOwner, Protocol):
    """What capture, replay checks and verify mode need from a session's runner (which the graphs it captures
    also call, as their :class:`GraphOwner`)."""

    graph_capture: bool
    lock: Any  # the session's run lock (a threading.RLock)
    allocator: SessionAllocator

    @property
    def session_id(self) -> int: ...

    def bound_plan(
        self, binding: AnyBinding, *, for_capture: bool, deciding: dict[str, np.ndarray] | None = None
    ) -> ExecutionPlan: ...
    def new_program(self, plan: ExecutionPlan) -> DeviceProgram[DeviceBuffer]: ...
    def run_bound(
        self, plan: ExecutionPlan, inputs: dict[str, AnyValue], cpu_inputs: dict[str, Any], outputs: dict[str, AnyValue]
    ) -> None: ...
    def submit(self, commands: CommandList) -> None: ...
    def graph_submitter(self) -> GraphSubmitter: ...


class GraphRegistry:
    """The captured graphs of one session, by graph id.

    ``capture_lock`` makes graph registration atomic; a session takes it before its run lock
    (``close()`` too), so no graph can be registered, or half rolled back, on a closed session.
    An id maps to None while its capture is in flight: a second capture of that id fails.
    """

    def __init__(self) -> None:
        self.capture_lock = threading.Lock()  # graph registration is atomic
        self._graphs: dict[int, CapturedGraph | None] = {}

    def get(self, graph_id: int) -> CapturedGraph | None:
        """Graph ``graph_id``, or None if it is not captured (or its capture is in flight)."""
        return self._graphs.get(graph_id)

    def ids(self) -> list[int]:
        return sorted(gid for gid, graph in self._graphs.items() if graph is not None)

    def forget(self, graph: CapturedGraph) -> None:
        if self._graphs.get(graph.graph_id) is graph:
            del self._graphs[graph.graph_id]

    def use_submitter(self, submitter: GraphSubmitter) -> None:
        """Replay every live graph through ``submitter`` from now on (profiling started or ended; the caller holds
        the session's run lock, under which capture chooses a graph's submitter and registers it)."""
        for graph in list(self._graphs.values()):  # (a copy: release() on another thread forgets its graph)
            if graph is not None:
                graph._use_submitter(submitter)

    def release_all(self) -> None:
        """Release every graph (for the session's ``close()``, which holds ``capture_lock``)."""
        for graph in [g for g in self._graphs.values() if g is not None]:
            graph.release()
        self._graphs.clear()

    def capture_or_replay(self, host: CaptureHost, session: object, binding: AnyBinding, graph_id: int) -> None:
        """``run_with_iobinding`` with graph id N: capture graph N on first use, replay it afterwards."""
        check_graph_id(host, graph_id)
        with self.capture_lock:
            graph = self._graphs.get(graph_id)
            if graph is None:
                self.capture_locked(host, session, binding, graph_id)
                return
        check_replay_binding(graph, binding)
        graph.replay()

    def capture_locked(self, host: CaptureHost, session: object, binding: AnyBinding, graph_id: int) -> CapturedGraph:
        """Capture ``binding`` as graph ``graph_id`` of ``session`` (run by ``host``); the caller holds
        ``capture_lock``.

        The binding is locked for the graph in the same step as its snapshot is taken (under the binding's own
        lock), before anything else: a bind on another thread lands either before (and is captured) or after
        (and raises), so the locked binding always names exactly what the graph replays.  Planning, recording
        and the capture run hold the session's run lock, so a concurrent run never builds the same state twice.
        """
        host.check_open("capture")  # again, under the capture lock: close() may have run since the caller checked
        if graph_id in self._graphs:
            existing = self._graphs[graph_id]
            raise CaptureStateError(
                f"graph {graph_id} of session {host.session_id} is already captured"
                + (f" ({existing!r})" if existing is not None else "")
                + f"; release it first (graph.release() or session.release_captured_graph({graph_id})) or use another graph_id"
            )
        label = GraphLabel(host.session_id, graph_id)
        if isinstance(binding, IOBinding):
            frozen = binding._freeze_and_lock(label)
        else:
            frozen = binding
            if frozen.origin is not None:
                frozen.origin._lock_matching(label, frozen)
        origin = frozen.origin
        self._graphs[graph_id] = None  # reserved: a second capture of this id fails from here on
        pins: PinSet | None = None
        program: DeviceProgram[DeviceBuffer] | None = None
        allocated: dict[str, AnyValue] = {}
        try:
            with host.lock:
                deciding: dict[str, np.ndarray] = {}
                plan = host.bound_plan(frozen, for_capture=True, deciding=deciding)
                if frozen.session_outputs():
                    # Outputs bound by name: device values made once, which the graph writes on every replay.
                    allocated = allocate_session_outputs(host.allocator, plan, frozen.session_outputs(), on_device=True)
                    frozen = frozen._with_outputs(allocated)
                pins = PinSet._create(label, frozen._pinned_buffers())
                program = host.new_program(plan)
                inputs = frozen.inputs()
                outputs = frozen.outputs()
                read = {n: _buffer(v) for n, v in inputs.items() if n not in plan.unread_inputs}
                written = {n: _buffer(v) for n, v in outputs.items()}
                work = ReplayWork(
                    graph_id,
                    program.record(read, written).freeze(),
                    _read_ahead(frozen),
                    read,
                    written,
                    program,
                )
                # The capture run itself, of the list frozen as the graph will hold it: a backend that encodes a
                # frozen list's next submission ahead (wgpu) has the first replay's command buffer ready when
                # capture returns.
                host.submit(work.commands)
                program.raise_data_errors()  # the capture run read an index out of range: no graph
                bound: dict[str, AnyValue | np.ndarray] = {**frozen.cpu_inputs(), **inputs}
                guard = _value_guard(label, {name: bound[name] for name in deciding}, deciding) if deciding else None
                graph = CapturedGraph._create(session, host, label, frozen, work, host.graph_submitter(), pins, guard)
                # Registered under the run lock, as its submitter was chosen: profiling starting or ending (which
                # swaps the live graphs' submitters under that lock) either sees this graph or chose its submitter.
                self._graphs[graph_id] = graph
                if origin is not None and allocated:
                    origin._adopt_session_outputs(label, allocated)  # bound for good: get_outputs() returns them
        except BaseException:
            # A failed capture registers no graph and leaves the binding unlocked, whatever failed (on a lost
            # device too, where freeing the program's native objects may raise: the device freed them already).
            try:
                if pins is not None:
                    pins.release()
                if origin is not None:
                    origin._unlock_for(label)
                if program is not None:
                    try:
                        program.release()
                    except (DeviceLostError, ReleasedValueError):
                        pass
                for value in allocated.values():
                    value.release()
            finally:
                del self._graphs[graph_id]
            raise
        return graph


def allocate_session_outputs(
    allocator: SessionAllocator, plan: ExecutionPlan, by_name: dict[str, str], *, on_device: bool
) -> dict[str, AnyValue]:
    """Values for the outputs a binding binds by name (``{name: device type}``), of the plan's shapes: on the
    session's device for ``"webgpu"`` (or for every one, ``on_device``: a capture writes device buffers only), a
    host value for ``"cpu"``."""
    values: dict[str, AnyValue] = {}
    for name, device in by_name.items():
        info = plan.output_infos[name]
        if device == "webgpu" or on_device:
            values[name] = allocator.empty(info.shape, info.dtype)
        else:
            values[name] = OrtValue.ortvalue_from_numpy(np.empty(info.shape, info.dtype))
    return values


def _value_guard(
    label: GraphLabel, values: dict[str, AnyValue | np.ndarray], captured: dict[str, np.ndarray]
) -> Callable[[], None]:
    """What a graph runs before each replay when input values decided its work (an ``If`` branch, a ``Loop``'s
    trip count, a shape): read those inputs (a device value: a synchronous read back; a host array bound with
    ``bind_cpu_input``: a look at it) and refuse the replay if any holds another value than at capture, since the
    recorded work would not follow it."""
    expected = {name: (array.dtype, array.shape, array.tobytes()) for name, array in captured.items()}

    def guard() -> None:
        for name, value in values.items():
            now = value if isinstance(value, np.ndarray) else value.to_numpy()
            if (now.dtype, now.shape, now.tobytes()) != expected[name]:
                raise CaptureStateError(
                    f"graph {label} was captured for input {name!r} = {_show(captured[name])}, whose value decided "
                    f"the recorded work (a branch, a trip count or a shape); it now holds {_show(now)}, and a replay "
                    f"would not follow it. Capture a graph per value (another graph_id), or release this one and "
                    f"capture again, or run uncaptured (gpu_graph_id=-1)"
                )

    return guard


def _show(array: np.ndarray) -> str:
    text = np.array2string(array, threshold=8, edgeitems=2)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_ahead(binding: FrozenIOBinding) -> tuple[ReadRange, ...]:
    """The ranges of ``binding``'s outputs, in the model's output order, that each replay's submission copies ahead,
    so that ``to_numpy()`` after ``replay()`` submits nothing (the bound values are pinned while captured: their
    buffers stay the same)."""
    ranges: list[ReadRange] = []
    for value in binding.get_outputs():
        buffer = value._device_buffer
        if buffer is not None and value.nbytes:
            ranges.append((buffer.handle, 0, value.nbytes))
    return tuple(ranges)


def _buffer(value: OrtValue[CPU] | OrtValue[WebGPU]) -> DeviceBuffer:
    buffer = value._device_buffer
    assert buffer is not None  # capture refuses host values
    return buffer


def check_graph_id(host: CaptureHost, graph_id: object) -> None:
    if isinstance(graph_id, bool) or not isinstance(graph_id, int):
        raise ArgumentTypeError(f"graph_id must be an int, got {graph_id!r}")
    if graph_id < 0:
        raise InvalidArgumentError(f"graph_id must be >= 0 (gpu_graph_id=-1 means an ordinary run), got {graph_id}")
    if not host.graph_capture:
        raise CaptureStateError(
            f"session {host.session_id} was created with graph_capture=False; create it with "
            f"InferenceSession(..., graph_capture=True) to capture graph {graph_id}, or run with gpu_graph_id=-1"
        )


def check_replay_binding(graph: CapturedGraph, binding: AnyBinding) -> None:
    """May ``binding`` replay ``graph``?  It must be the captured binding (its snapshot, its origin, or
    another snapshot of that origin) *and* still refer to the same native buffers: replay re-issues
    the buffers recorded at capture, whatever the binding holds now."""
    captured = graph.binding
    origin = captured.origin
    same_binding = binding is captured or (
        origin is not None
        and (binding is origin or (isinstance(binding, FrozenIOBinding) and binding.origin is origin))
    )
    if not same_binding:
        raise CaptureStateError(
            f"graph {graph.label} was captured with another binding, and replay would use that binding's buffers, "
            f"not this one's; reuse the captured binding (update its inputs in place), or release the graph first "
            f"(session.release_captured_graph({graph.graph_id}))"
        )
    if binding.signature != captured.signature:
        now = {row[:2]: row[2:] for row in binding.signature}
        then = {row[:2]: row[2:] for row in captured.signature}
        changed = sorted(
            f"{role} {name!r}" for role, name in set(now) | set(then) if now.get((role, name)) != then.get((role, name))
        )
        raise CaptureStateError(
            f"graph {graph.label} replays the buffers it was captured with, but this binding's {', '.join(changed)} "
            f"now refer to other buffers (it was rebound after the snapshot the graph was captured from was frozen); "
            f"replay graph.binding, or release the graph first (session.release_captured_graph({graph.graph_id})) "
            f"and capture this binding"
        )


def verify_replay(host: CaptureHost, graph: CapturedGraph) -> None:
    """Poison the outputs, replay, and compare with an uncaptured run of the same inputs.  An output bound in place
    of an input (a KV cache) is not poisoned, since that would change the input; the input's contents before the
    replay are kept, and the uncaptured run reads that copy."""
    host.check_open("replay a captured graph")
    graph._check_inputs()  # a replay that would be refused must not poison the outputs first
    frozen = graph.binding
    outputs = frozen.outputs()
    inputs = dict(frozen.inputs())
    shared = {v._device_buffer.identity for v in outputs.values() if v._device_buffer is not None}
    kept = {
        name: value.to_numpy()
        for name, value in inputs.items()
        if value._device_buffer is not None and value._device_buffer.identity in shared
    }
    in_place = {buffer.identity for name in kept if (buffer := inputs[name]._device_buffer) is not None}
    for value in outputs.values():
        buffer = value._device_buffer
        assert buffer is not None
        if value.nbytes and buffer.identity not in in_place:
            buffer.write(b"\xff" * buffer.nbytes)
    graph._replay_unchecked()
    replayed = {name: value.to_numpy() for name, value in outputs.items()}
    plan = host.bound_plan(frozen, for_capture=True)
    scratch = {name: host.allocator.empty(value.shape(), value.dtype) for name, value in outputs.items()}
    copies = {name: host.allocator.from_numpy(array) for name, array in kept.items()}
    try:
        with host.lock:
            host.run_bound(plan, {**inputs, **copies}, frozen.cpu_inputs(), dict(scratch))
        for name, value in scratch.items():
            expected = value.to_numpy()
            same = np.array_equal(replayed[name], expected, equal_nan=expected.dtype.kind == "f")
            if not same:
                raise CaptureStateError(
                    f"verify: output {name!r} of graph {graph.label} differs from an uncaptured run on the same inputs: "
                    f"the replay produced stale or unwritten data"
                )
    finally:
        for value in [*scratch.values(), *copies.values()]:
            value.release()
