# cython: language_level=3
"""IOBinding and FrozenIOBinding: which values a session's inputs and outputs are bound to.

Typestate: an :class:`IOBinding` is mutable until a graph is captured from it;
from then on every mutation raises ``CaptureStateError`` naming the graph and
the fix, until that graph is released.  ``freeze()`` returns a
:class:`FrozenIOBinding`: an immutable snapshot with no bind or clear methods,
which remembers the binding it came from (capturing it locks that binding too).

Binding checks what can be checked at once: the name exists in the model,
the value is an ``OrtValue`` that may be used by this session (provenance),
not released, and of the model's dtype and (static) shape.  The session's
runner supplies those checks through the :class:`~ortgpu_core._owner.BindingOwner`
protocol (``check_bind``); this module never imports :mod:`ortgpu`.

A binding's *signature* is what a captured graph compares: for each bound
name, the native buffer's ``(handle, generation)``, never Python objects.

An output may also be bound by name alone (onnxruntime's ``bind_output(name)``
and ``bind_output(name, device_type, device_id)``): the session allocates it,
since its shape need not be known before the run.  An ordinary run allocates
a fresh value each time (on the host for ``"cpu"``, onnxruntime's default, on
the session's device for ``"webgpu"``); a capture allocates device values
once, binds them for good (``get_outputs()`` returns them after every replay),
since a captured graph writes fixed buffers.
"""

import threading

import numpy as np

from ._value cimport OrtValue
from ._dlpack import host_array, is_dlpack_producer
from ._errors import ArgumentTypeError, CaptureStateError, InvalidArgumentError, NotCopyable, UnsafeAccessError

#: The device types an output bound by name may name: the host, or the session's WebGPU device.
SESSION_OUTPUT_DEVICES = ("cpu", "webgpu")


def _raw_pointer_refused(str kind, str name):
    return UnsafeAccessError(
        f"bind_{kind}({name!r}, device_type, device_id, element_type, shape, buffer_ptr) binds raw device memory, "
        f"which ortgpu refuses: a pointer carries no provenance and cannot be pinned under a captured graph. "
        f"Allocate a value (session.allocator.empty(...) or env.shared_allocator(device).empty(...)) and call "
        f"bind_{kind}({name!r}, value)"
    )


cdef str _session_output_device(str name, object device_type, tuple rest):
    """The device type of ``bind_output(name, device_type[, device_id])`` (checked), or the refusal of the raw
    pointer form."""
    if len(rest) > 1 and any(part is not None for part in rest[1:]):
        raise _raw_pointer_refused("output", name)
    device_id = rest[0] if rest else 0
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise ArgumentTypeError(f"bind_output({name!r}, {device_type!r}, device_id): device_id must be an int >= 0, "
                                f"not {device_id!r}")
    if device_type is None:
        return "cpu"
    if device_type not in SESSION_OUTPUT_DEVICES:
        raise InvalidArgumentError(
            f"bind_output({name!r}, {device_type!r}): an output bound by name is allocated on 'cpu' (the host, "
            f"onnxruntime's default) or on 'webgpu' (the session's device); ortgpu has no {device_type!r} device"
        )
    return device_type


cdef tuple _signature_of(dict inputs, dict outputs, dict cpu_inputs, dict session_outputs):
    # A device buffer is named by its generation (unique in the process, never a native address); a host value
    # by the identity of the Python object bound.
    cdef list parts = []
    for name in sorted(inputs):
        buffer = (<OrtValue>inputs[name]).device_buffer()
        parts.append(
            ("input", name, "webgpu", buffer.generation) if buffer is not None
            else ("input", name, "cpu", id(inputs[name]))
        )
    for name in sorted(cpu_inputs):
        parts.append(("cpu-input", name, "cpu", id(cpu_inputs[name])))
    for name in sorted(outputs):
        buffer = (<OrtValue>outputs[name]).device_buffer()
        parts.append(
            ("output", name, "webgpu", buffer.generation) if buffer is not None
            else ("output", name, "cpu", id(outputs[name]))
        )
    for name in sorted(session_outputs):
        parts.append(("output", name, "session", session_outputs[name]))
    return tuple(parts)


cdef class _BindingView:
    """Read-only accessors shared by both binding states."""

    # A copy would share (or, for a captured binding, escape) the capture lock: bind into a new binding instead.
    _copy_hint = "Make a new binding with session.io_binding() and bind the same values."
    __copy__ = NotCopyable.__copy__
    __deepcopy__ = NotCopyable.__deepcopy__
    __reduce_ex__ = NotCopyable.__reduce_ex__

    @property
    def session(self):
        """The session this binding belongs to."""
        return self._session

    @property
    def session_id(self):
        return self._owner.session_id

    def inputs(self):
        """``{name: OrtValue}`` of the bound inputs (a copy)."""
        return dict(self._inputs)

    def cpu_inputs(self):
        """``{name: numpy array}`` bound with ``bind_cpu_input`` (a copy of the mapping)."""
        return dict(self._cpu_inputs)

    def outputs(self):
        """``{name: OrtValue}`` of the bound outputs (a copy)."""
        return dict(self._outputs)

    def session_outputs(self):
        """``{name: device type}`` of the outputs bound by name alone, which the session allocates (a copy)."""
        return dict(self._session_outputs)

    def get_outputs(self):
        """The output values, in the model's output order: those bound, and those the session allocated for the
        outputs bound by name (after a run; before it there are none to return)."""
        result = []
        for name in self._owner.output_names:
            if name in self._outputs:
                result.append(self._outputs[name])
            elif name in self._session_results:
                result.append(self._session_results[name])
        return result

    def copy_outputs_to_cpu(self):
        """Host copies of :meth:`get_outputs`, in the model's output order (synchronous)."""
        return [value.to_numpy() for value in self.get_outputs()]

    def _set_session_results(self, dict values):
        """Internal: the values a run allocated for the outputs bound by name (what get_outputs() returns)."""
        self._session_results = dict(values)

    @property
    def signature(self):
        """What the binding names, as a captured graph compares it: ``(role, name, placement, identity)`` tuples,
        where a device value's identity is its buffer's generation (opaque, never reused)."""
        return _signature_of(self._inputs, self._outputs, self._cpu_inputs, self._session_outputs)

    def _pinned_buffers(self):
        """The device buffers this binding refers to (what a captured graph pins).  Internal."""
        cdef list buffers = []
        for value in list(self._inputs.values()) + list(self._outputs.values()):
            buffer = (<OrtValue>value).device_buffer()
            if buffer is not None:
                buffers.append(buffer)
        return buffers

    def synchronize_inputs(self):
        """onnxruntime's name; uploads are queue-ordered, so there is nothing to wait for."""

    def synchronize_outputs(self):
        """onnxruntime's name; ``to_numpy()`` and ``copy_outputs_to_cpu()`` already wait."""


cdef class IOBinding(_BindingView):
    """A mutable binding of a session's inputs and outputs to values.

    Create with ``session.io_binding()``.  Bind device values with
    ``bind_input`` / ``bind_output`` (or onnxruntime's ``bind_ortvalue_input``
    / ``bind_ortvalue_output``); ``bind_cpu_input`` binds a host array for
    ordinary runs only (a captured graph cannot read host memory).
    """

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("IOBinding objects are created by a session: use session.io_binding()")

    @staticmethod
    def _create(session, owner):
        """Internal: a binding of ``session``, whose checks ``owner`` (a BindingOwner) makes."""
        cdef IOBinding binding = IOBinding.__new__(IOBinding)
        binding._session = session
        binding._owner = owner
        binding._inputs = {}
        binding._outputs = {}
        binding._cpu_inputs = {}
        binding._session_outputs = {}
        binding._session_results = {}
        binding._captured_by = []
        binding._lock = threading.Lock()
        return binding

    @property
    def captured_by(self):
        """Labels of the captured graphs that lock this binding (empty when mutable)."""
        return tuple(self._captured_by)

    cdef int _check_mutable(self, str what) except -1:
        if self._captured_by:
            label = self._captured_by[0]
            raise CaptureStateError(
                f"cannot {what}: this IOBinding is captured by graph {label.graph_id} of session "
                f"{label.session_id}, which replays the buffers it was captured with. Release the graph first "
                f"(graph.release() or session.release_captured_graph({label.graph_id})), or bind into a new "
                f"binding from session.io_binding()"
            )
        return 0

    def bind_input(self, name, value, *raw_pointer_form):
        """Bind input ``name`` to ``value`` (a device or CPU ``OrtValue``)."""
        if raw_pointer_form or isinstance(value, str):
            raise _raw_pointer_refused("input", name)
        with self._lock:
            self._check_mutable(f"bind input {name!r}")
            self._owner.check_bind(name, value, "input")
            self._cpu_inputs.pop(name, None)
            self._inputs[name] = value

    def bind_output(self, name, value=None, *device_or_raw_pointer):
        """Bind output ``name`` to ``value`` (an ``OrtValue`` the run writes into), or, as onnxruntime's
        ``bind_output(name)`` / ``bind_output(name, device_type, device_id)``, to a value the session allocates at
        each run (``device_type`` ``"cpu"``, the default, or ``"webgpu"``; see the module)."""
        if value is None or isinstance(value, str):
            device = _session_output_device(name, value, device_or_raw_pointer)
            with self._lock:
                self._check_mutable(f"bind output {name!r}")
                self._owner.check_output_name(name)
                self._outputs.pop(name, None)
                self._session_results.pop(name, None)
                self._session_outputs[name] = device
            return
        if device_or_raw_pointer:
            raise _raw_pointer_refused("output", name)
        with self._lock:
            self._check_mutable(f"bind output {name!r}")
            self._owner.check_bind(name, value, "output")
            self._session_outputs.pop(name, None)
            self._session_results.pop(name, None)
            self._outputs[name] = value

    def bind_ortvalue_input(self, name, value):
        """onnxruntime's spelling of :meth:`bind_input`."""
        self.bind_input(name, value)

    def bind_ortvalue_output(self, name, value):
        """onnxruntime's spelling of :meth:`bind_output`."""
        self.bind_output(name, value)

    def bind_cpu_input(self, name, array):
        """Bind input ``name`` to a host array, for ordinary (uncaptured) runs only."""
        if not isinstance(array, np.ndarray):
            if not is_dlpack_producer(array):
                raise ArgumentTypeError(
                    f"bind_cpu_input({name!r}, ...) needs a numpy array or a DLPack tensor, got {type(array).__name__}"
                )
            array = host_array(array, f"bind_cpu_input({name!r})")
        with self._lock:
            self._check_mutable(f"bind input {name!r}")
            self._owner.check_bind(name, array, "cpu-input")
            self._inputs.pop(name, None)
            self._cpu_inputs[name] = array

    def clear_binding_inputs(self):
        with self._lock:
            self._check_mutable("clear the bound inputs")
            self._inputs.clear()
            self._cpu_inputs.clear()

    def clear_binding_outputs(self):
        with self._lock:
            self._check_mutable("clear the bound outputs")
            self._outputs.clear()
            self._session_outputs.clear()
            self._session_results.clear()

    def freeze(self):
        """An immutable snapshot of this binding (it remembers this binding as its origin)."""
        with self._lock:
            return FrozenIOBinding._create(
                self._session, self._owner, self._inputs, self._outputs, self._cpu_inputs, self,
                self._session_outputs
            )

    def _freeze_and_lock(self, label):
        """Capture's first step: under this binding's lock, lock it for graph ``label`` and return the snapshot
        the graph will replay.  One step, so no bind on another thread can land between the two."""
        with self._lock:
            self._captured_by.append(label)
            return FrozenIOBinding._create(
                self._session, self._owner, self._inputs, self._outputs, self._cpu_inputs, self,
                self._session_outputs
            )

    def _lock_matching(self, label, FrozenIOBinding snapshot):
        """Lock this binding for graph ``label``, which captures ``snapshot`` (frozen from it earlier), if it
        still names what the snapshot names; else ``CaptureStateError`` and nothing locked: a locked binding
        must name exactly the buffers its graph replays."""
        with self._lock:
            now = _signature_of(self._inputs, self._outputs, self._cpu_inputs, self._session_outputs)
            if now != snapshot.signature:
                raise CaptureStateError(
                    f"cannot capture this FrozenIOBinding as graph {label.graph_id}: the IOBinding it was frozen "
                    f"from was rebound since, and a captured binding stays locked naming what the graph replays. "
                    f"Capture the IOBinding itself, or freeze it again"
                )
            self._captured_by.append(label)

    def _adopt_session_outputs(self, label, dict values):
        """Internal, for capture: the device values graph ``label`` allocated for the outputs bound by name become
        this binding's bound outputs (it is locked for that graph: only the capture may change it)."""
        with self._lock:
            if label not in self._captured_by:
                raise CaptureStateError("internal: outputs adopted for a graph that does not lock this binding")
            for name, value in values.items():
                self._session_outputs.pop(name, None)
                self._session_results.pop(name, None)
                self._outputs[name] = value

    def _unlock_for(self, label):
        with self._lock:
            if label in self._captured_by:
                self._captured_by.remove(label)

    def __repr__(self):
        state = f" captured by graph {self._captured_by[0].graph_id}" if self._captured_by else ""
        return (
            f"<IOBinding session={self._owner.session_id} inputs={sorted(self._inputs) + sorted(self._cpu_inputs)} "
            f"outputs={sorted(self._outputs)}"
            + (f" session_outputs={sorted(self._session_outputs)}" if self._session_outputs else "")
            + f"{state}>"
        )


cdef class FrozenIOBinding(_BindingView):
    """An immutable binding: what a captured graph replays.  No bind or clear methods."""

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("FrozenIOBinding objects are made by IOBinding.freeze()")

    @staticmethod
    def _create(session, owner, dict inputs, dict outputs, dict cpu_inputs, origin, dict session_outputs=None):
        cdef FrozenIOBinding frozen = FrozenIOBinding.__new__(FrozenIOBinding)
        frozen._session = session
        frozen._owner = owner
        frozen._inputs = dict(inputs)
        frozen._outputs = dict(outputs)
        frozen._cpu_inputs = dict(cpu_inputs)
        frozen._session_outputs = dict(session_outputs or {})
        frozen._session_results = {}
        frozen._origin = origin
        return frozen

    def _with_outputs(self, dict values):
        """Internal, for capture: this snapshot with ``values`` bound for the outputs it binds by name."""
        outputs = dict(self._outputs)
        outputs.update(values)
        rest = {name: device for name, device in self._session_outputs.items() if name not in values}
        return FrozenIOBinding._create(
            self._session, self._owner, self._inputs, outputs, self._cpu_inputs, self._origin, rest
        )

    @property
    def origin(self):
        """The :class:`IOBinding` this snapshot was frozen from (None if made directly by a session)."""
        return self._origin

    def __repr__(self):
        return (
            f"<FrozenIOBinding session={self._owner.session_id} "
            f"inputs={sorted(self._inputs) + sorted(self._cpu_inputs)} "
            f"outputs={sorted(self._outputs)}>"
        )
