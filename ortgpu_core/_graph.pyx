# cython: language_level=3
"""CapturedGraph: a session's recorded dispatches, replayed with the least host work.

A graph owns:

* a :class:`~ortgpu_core._binding.FrozenIOBinding` (the values it was
  captured with; its references keep their buffers alive even when the user
  drops theirs),
* pins on those buffers (``release()`` on a pinned value raises),
* its :class:`~ortgpu_core._replay.ReplayWork`: the frozen command list it replays, with the program that owns
  the native objects the list refers to (intermediate buffers, bind groups),
* the :class:`~ortgpu_core._replay.GraphSubmitter` that submits that work (plain, serialized or profiled: the
  session swaps it when profiling starts or ends).

``release()`` drops all of these, the snapshot included: a released graph no
longer keeps the user's values alive (it remembers its origin binding only
weakly, to return it again from a repeated ``release()``).

``replay()`` is the state guard plus one call, ``submitter.replay(work)``: on the
wgpu backend a C loop encodes every record through wgpu-native's function
pointers with the GIL released, then submits once; nothing is allocated per
dispatch.  ``release()`` unpins,
frees the graph's own state and unlocks the binding it was captured from
(returning it).  The session registers graphs by id under a lock.
"""

import threading
import weakref

cimport cython

from ._binding cimport FrozenIOBinding, IOBinding

from ._value cimport DeviceBuffer
from ._replay import ReplayWork
from ._errors import ArgumentTypeError, CaptureStateError, DeviceError, DeviceLostError, NotCopyable, ReleasedValueError


class GraphLabel:
    """Names a captured graph in pins, locks and messages: ``graph <id> of session <id>``."""

    __slots__ = ("session_id", "graph_id")

    def __init__(self, session_id, graph_id):
        self.session_id = session_id
        self.graph_id = graph_id

    def __eq__(self, other):
        return isinstance(other, GraphLabel) and (self.session_id, self.graph_id) == (other.session_id, other.graph_id)

    def __hash__(self):
        return hash((self.session_id, self.graph_id))

    def __str__(self):
        return f"{self.graph_id} of session {self.session_id}"

    def __repr__(self):
        return f"GraphLabel(session_id={self.session_id!r}, graph_id={self.graph_id!r})"


# no_gc_clear: a PinSet reached only from garbage must still hold its list in __dealloc__ to unpin.
@cython.no_gc_clear
cdef class PinSet:
    """The pins one captured graph holds on its buffers.  Internal: made by capture, owned by the graph.

    Pins are dropped by :meth:`release` or, if the owner is garbage-collected without releasing, when the
    PinSet dies; only the PinSet that took a pin can drop it (``DeviceBuffer`` has no Python unpin).
    """

    cdef object _label
    cdef list _buffers

    _copy_hint = "Pins belong to the graph that took them."
    __copy__ = NotCopyable.__copy__
    __deepcopy__ = NotCopyable.__deepcopy__
    __reduce_ex__ = NotCopyable.__reduce_ex__

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("PinSet objects are made by capture")

    @staticmethod
    def _create(label, buffers):
        """Pin every buffer for ``label``; a released one raises ``ReleasedValueError`` and pins nothing."""
        cdef PinSet pins = PinSet.__new__(PinSet)
        pins._label = label
        pins._buffers = []
        try:
            for buffer in buffers:
                (<DeviceBuffer?>buffer).pin(label)
                pins._buffers.append(buffer)
        except BaseException:
            pins.release()
            raise
        return pins

    def release(self):
        """Drop the pins (idempotent)."""
        buffers, self._buffers = self._buffers, []
        for buffer in buffers:
            (<DeviceBuffer>buffer).unpin(self._label)

    def __dealloc__(self):
        if self._buffers:
            for buffer in self._buffers:
                (<DeviceBuffer>buffer).unpin(self._label)


@cython.no_gc_clear
cdef class CapturedGraph:
    """A captured graph of a session: ``replay()`` it, ``release()`` it (or use ``with``).

    Created by ``session.capture(binding, graph_id)`` (or on the first
    ``run_with_iobinding`` with ``RunOptions(gpu_graph_id=N)``).
    """

    cdef object _graph_id
    cdef object _label
    cdef object _session  # the InferenceSession (the public .session)
    cdef object _owner  # its runner: a GraphOwner (ortgpu_core._owner), for the checks around a replay
    cdef FrozenIOBinding _binding  # None once released
    cdef object _origin_ref  # weak reference to the origin IOBinding, once released
    cdef object _work  # the ReplayWork (ortgpu_core._replay); None once released
    cdef object _submitter  # the GraphSubmitter its work goes through; swapped by the session (_use_submitter)
    cdef Py_ssize_t _dispatch_count  # (kept after release, for repr)
    cdef Py_ssize_t _command_count
    cdef PinSet _pins
    cdef bint _released
    cdef object _lock  # serializes replay with release, so a replay never submits freed bind groups
    cdef object _guard  # None, or a callable raising CaptureStateError when the graph's decided inputs changed
    cdef object _failure  # None, or the DeviceError a replay's submission raised: the graph is failed
    cdef unsigned long long _replays

    # A copy would be a second owner of the pins, the lock on the binding and the recorded work: releasing it
    # would unpin and unlock while this graph still replays.
    _copy_hint = "Replay this graph, or capture another one with session.capture(binding, graph_id)."
    __copy__ = NotCopyable.__copy__
    __deepcopy__ = NotCopyable.__deepcopy__
    __reduce_ex__ = NotCopyable.__reduce_ex__

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("CapturedGraph objects are made by session.capture(binding, graph_id)")

    @staticmethod
    def _create(session, owner, label, FrozenIOBinding binding, work, submitter, PinSet pins, guard=None):
        """Internal: capture has locked the origin binding for ``label`` and pinned the buffers (``pins``).

        Parameters
        ----------
        session
            The public session object (``graph.session``).
        owner
            The session's runner, a :class:`~ortgpu_core._owner.GraphOwner`: the checks around a replay, verify
            mode, and forgetting the graph at release.
        work
            The :class:`~ortgpu_core._replay.ReplayWork` recorded at capture; the graph takes ownership of its
            program (released with the graph).
        submitter
            The :class:`~ortgpu_core._replay.GraphSubmitter` for the session's current mode; the session swaps
            it with :meth:`_use_submitter` while the graph lives.
        guard
            None, or a callable run before every replay's submission that raises ``CaptureStateError`` when an
            input whose value decided the recorded work (a branch, a trip count, a shape) holds another value now.
        """
        if not isinstance(work, ReplayWork):
            raise ArgumentTypeError(f"work must be a ReplayWork, got {type(work).__name__}")
        cdef CapturedGraph graph = CapturedGraph.__new__(CapturedGraph)
        graph._graph_id = label.graph_id
        graph._label = label
        graph._session = session
        graph._owner = owner
        graph._binding = binding
        graph._origin_ref = None
        graph._work = work
        graph._submitter = submitter
        graph._dispatch_count = work.commands.dispatch_count
        graph._command_count = len(work.commands)
        graph._pins = pins
        graph._released = False
        graph._lock = threading.Lock()
        graph._guard = guard
        graph._failure = None
        graph._replays = 0
        return graph

    def _use_submitter(self, submitter):
        """Internal: replay through ``submitter`` from the next replay on (the session swaps it when profiling
        starts or ends).  A plain assignment, not under the graph's lock: a replay in flight finishes with the
        submitter it started with."""
        self._submitter = submitter

    @property
    def _replay_work(self):
        """Internal: the :class:`~ortgpu_core._replay.ReplayWork` this graph replays (None once released)."""
        return self._work

    @property
    def session(self):
        """The session that captured this graph."""
        return self._session

    @property
    def graph_id(self):
        """The graph's id in its session (``session.captured_graph(graph_id)``, ``RunOptions(gpu_graph_id=...)``)."""
        return self._graph_id

    @property
    def label(self):
        """The :class:`GraphLabel` naming this graph in pins, binding locks and messages."""
        return self._label

    @property
    def replays(self):
        """Replays submitted so far (verify-mode replays included; failed ones not)."""
        return self._replays

    @property
    def dispatch_count(self):
        """Compute dispatches recorded in the graph."""
        return self._dispatch_count

    @property
    def command_count(self):
        """Records (dispatches, copies, clears) in the graph."""
        return self._command_count

    @property
    def binding(self):
        """The :class:`FrozenIOBinding` this graph replays (``CaptureStateError`` once released)."""
        if self._binding is None:
            raise CaptureStateError(
                f"graph {self.label} was released and no longer holds a binding; use the IOBinding that "
                f"release() returned"
            )
        return self._binding

    @property
    def released(self):
        """True once :meth:`release` ran (the graph can no longer be replayed)."""
        return self._released

    @property
    def failed(self):
        """True once a replay's submission failed (a validation error, out-of-memory, device loss): every later
        replay is refused; ``release()`` the graph (and capture again).  False again once released."""
        return self._failure is not None and not self._released

    @property
    def failure(self):
        """The error that failed the graph (see :attr:`failed`), or None."""
        return self._failure

    @property
    def state(self):
        """``"live"`` (replayable), ``"failed"`` (a replay failed: release it) or ``"released"``."""
        if self._released:
            return "released"
        return "failed" if self._failure is not None else "live"

    cdef int _check_not_released(self) except -1:
        if self._released:
            why = self._owner.closed_reason() or (
                f"capture it again with session.capture(binding, graph_id={self.graph_id!r})"
            )
            raise CaptureStateError(f"graph {self.label} was released and can no longer be replayed: {why}")
        failure = self._failure
        if failure is not None:
            if isinstance(failure, DeviceLostError):
                raise DeviceLostError(
                    f"graph {self.label} failed: its device was lost ({failure}); release it, and create a new Env, "
                    f"session and graph"
                ) from failure
            raise CaptureStateError(
                f"graph {self.label} failed: a replay raised {type(failure).__name__}: {failure}. Its recorded work "
                f"is no longer trusted; release it (graph.release() or "
                f"session.release_captured_graph({self.graph_id!r})) and capture again"
            ) from failure
        return 0

    cdef int _fail(self, error) except -1:
        """Record that a replay's submission raised ``error`` (under ``_lock``): the graph is failed."""
        if self._failure is None:
            self._failure = error
        return 0

    def replay(self, verify=False):
        """Run the recorded work again on the current contents of the bound inputs.

        Outputs are written into the bound output values; read them with
        ``value.to_numpy()`` or ``graph.binding.copy_outputs_to_cpu()``.
        ``verify=True`` first poisons the outputs, then compares the replay's
        results with an uncaptured run on the same inputs (slow; for tests):
        a mismatch raises ``CaptureStateError`` naming the outputs.

        A replay reads nothing back, so data that kernels can only flag (an
        index out of range for a Gather fed at run time, clamped on the device)
        is not reported by ``replay()``; ``replay_and_read()`` and verify mode
        raise ``InvalidArgumentError`` for it, as ordinary runs do.

        Raises
        ------
        CaptureStateError
            The graph was released or failed, or an input whose value decided the recorded work changed.
        DeviceError
            The submission failed; the graph is failed from then on (see :attr:`failed`).
        """
        if verify or self._owner.verify_replays:
            self._check_not_released()
            self._owner.verify_replay(self)
            return
        with self._lock:
            self._check_replayable()
            try:
                self._submitter.replay(self._work)
            except DeviceError as error:
                self._fail(error)
                raise
            self._replays += 1

    cdef int _check_replayable(self) except -1:
        """The state guard of every replay (under ``_lock``): not released or failed, the session open, and the
        inputs that decided the recorded work unchanged."""
        self._check_not_released()
        self._owner.check_open("replay a captured graph")
        if self._guard is not None:
            self._guard()
        return 0

    def replay_async(self):
        """``await graph.replay_async()``: :meth:`replay` in a worker thread (the event loop's default executor),
        then a wait for the device to finish the submitted work, so the bound outputs hold its results when the
        await returns; the event loop is never blocked meanwhile.  The replay starts when this is called (it
        returns an ``asyncio.Future``; call it from a coroutine, with a running loop).  Errors are raised by the
        await, to its caller only.  The wait covers all work submitted to the device so far (this graph's, and
        other sessions' submitted before it)."""
        import asyncio

        return asyncio.get_running_loop().run_in_executor(None, self._replay_and_wait)

    def _replay_and_wait(self):
        self.replay()
        self._submitter.wait_idle()

    def replay_and_read(self):
        """:meth:`replay`, then host copies of the bound outputs in the model's output order (what
        ``graph.binding.copy_outputs_to_cpu()`` returns), with the output copies recorded into the replay's own
        submission: one submit and one wait for the whole step, where replay + ``to_numpy()`` per output submits
        again for each read.  Synchronous.  In verify mode it is ``replay(verify=True)`` then the reads.

        A convenience, not a speed-up: it is not faster than ``replay()`` + ``to_numpy()`` (bench/RESULTS.md
        has the figures), and it copies every output, where ``to_numpy()`` hands over outputs of 8 MiB or more
        without a host copy.

        Raises
        ------
        CaptureStateError, DeviceError
            As :meth:`replay`.
        InvalidArgumentError
            A kernel found invalid data (an index out of range), as an ordinary run reports it.
        """
        if self._owner.verify_replays:
            self.replay(verify=True)
            with self._lock:
                self._check_not_released()
                return self._binding.copy_outputs_to_cpu()
        with self._lock:
            self._check_replayable()
            work = self._work
            try:
                # (device values only: capture refuses host-bound outputs)
                arrays = self._submitter.replay_and_read(work, self._binding.get_outputs())
            except DeviceError as error:
                self._fail(error)
                raise
            self._replays += 1
            # Synchronous already: a kernel that found invalid data (an index out of range) raises here.
            work.program.raise_data_errors()
        return arrays

    def _check_inputs(self):
        """Internal: raise ``CaptureStateError`` if an input whose value decided the recorded work holds another
        value now (what every replay checks first; verify mode checks it before it poisons the outputs)."""
        with self._lock:
            self._check_not_released()
            if self._guard is not None:
                self._guard()

    def _replay_unchecked(self):
        """Internal: submit the recorded list alone, without the verify indirection or read-ahead (used by
        verification itself, which reads the outputs after)."""
        with self._lock:
            self._check_not_released()
            if self._guard is not None:
                self._guard()
            try:
                self._submitter.replay_alone(self._work)
            except DeviceError as error:
                self._fail(error)
                raise
            self._replays += 1

    def release(self):
        """Unpin the buffers, free the graph's own state and unlock its binding.

        Returns the :class:`IOBinding` the graph was captured from (mutable
        again), or None.  Idempotent (a repeated call returns that binding
        while something else keeps it alive, else None).
        """
        with self._lock:  # waits for a replay in flight on another thread
            if self._released:
                return self._origin_ref() if self._origin_ref is not None else None
            # Releasing always completes: each step below either cannot fail or only frees native objects, which
            # a closed or lost device has freed already.
            self._released = True
            self._pins.release()
            work, self._work = self._work, None
            try:
                work.program.release()
            except (DeviceLostError, ReleasedValueError):
                pass  # the device is gone, and with it everything the program held
            origin = self._binding.origin
            if origin is not None:
                (<IOBinding>origin)._unlock_for(self.label)
                self._origin_ref = weakref.ref(origin)
            # The values are the user's again: a released graph must not keep them (or their buffers) alive.
            self._binding = None
        self._owner.forget_graph(self)
        return origin

    def __dealloc__(self):
        # Reached without release() only when the graph's session was dropped unclosed and both were collected
        # (the session's finalizer normally releases its graphs first).  No locks, no native calls here: drop
        # the binding's lock on this graph (a list removal); the PinSet unpins when it dies with this graph.
        if self._released or self._binding is None:
            return
        origin = self._binding._origin
        if origin is not None:
            captured_by = (<IOBinding>origin)._captured_by
            if self.label in captured_by:
                captured_by.remove(self.label)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.release()

    def __repr__(self):
        state = (
            " released" if self._released
            else f" failed ({type(self._failure).__name__}) replays={self.replays}" if self._failure is not None
            else f" replays={self.replays}"
        )
        return f"<CapturedGraph {self.label} dispatches={self.dispatch_count}{state}>"
