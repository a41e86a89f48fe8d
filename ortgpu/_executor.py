"""Running an :class:`~ortgpu._planner.ExecutionPlan` on a backend device.

* :class:`~ortgpu._pipeline_cache.PipelineCache` (its own module): compute pipelines of one device keyed by
  their WGSL text, shared by every session on the device.
* :class:`WeightStore`: the uploaded constants of one session on one device,
  keyed by the plan's constant keys, so several plans share one upload.
* :class:`DeviceProgram`: one plan instantiated on one device: pipelines,
  params uniforms, intermediate buffer slots (from the caller's ``allocate``
  / ``free``), cached bind groups; ``record`` builds a :class:`CommandList`
  for a fully-on-device plan (the capture path), ``run`` runs any plan,
  moving tensors to and from the CPU around nodes placed there.  (``tests/helpers.run_model`` drives one.)

Ownership: a program owns its slots, params buffer and bind groups and
releases them in :meth:`DeviceProgram.release`; pipelines belong to the cache,
weights to the store, input/output buffers to the caller.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable, Generic, Hashable, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ModelError, ReleasedValueError
from ortgpu_core._value import padded_payload
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice, BindingEntry

from ._host_values import element_dtype_of, element_shapes_of, is_sequence_dtype, items
from ._pipeline_cache import PipelineCache
from ._planner import ExecutionPlan, PlannedStep
from ._types import computable
from .ops import DeviceCaps, TensorInfo
from .ops._kernel import STATUS_BYTES, loop_budget_for
from .ops._runner import padded_size

__all__ = [
    "PipelineCache",
    "WeightStore",
    "DeviceProgram",
    "device_caps",
    "padded_bytes",
    "host_io_names",
]

#: A recorded plan with at least ``2 * EARLY_SUBMIT_DISPATCHES`` dispatches submits its first
#: ``EARLY_SUBMIT_DISPATCHES`` as a command buffer of their own (``CommandList.early_submit``), so the GPU starts
#: while the host encodes the rest: wgpu-native's finishing of a command buffer costs time per dispatch, which
#: otherwise all comes before the GPU's first dispatch.  0 turns it off.
EARLY_SUBMIT_DISPATCHES = 4


def device_caps(device: BackendDevice) -> DeviceCaps:
    """The :class:`DeviceCaps` plans for ``device`` are made with."""
    return DeviceCaps(frozenset(device.features), device.limits, loop_budget_for(device.info.name))


def padded_bytes(array: np.ndarray) -> bytes:
    """``array``'s C-layout bytes, zero-padded to the buffer size (a multiple of 4)."""
    return bytes(padded_payload(np.asarray(array)))


def _with_early_submit(commands: CommandList) -> CommandList:
    """``commands`` with its first dispatches submitted early when it has enough of them (see
    :data:`EARLY_SUBMIT_DISPATCHES`)."""
    if EARLY_SUBMIT_DISPATCHES and commands.dispatch_count >= 2 * EARLY_SUBMIT_DISPATCHES:
        commands.early_submit = EARLY_SUBMIT_DISPATCHES
    return commands


class _Releasable(Protocol):
    def release(self) -> None: ...


class BufferRef(Protocol):
    """A device buffer as programs take it: its native handle and its generation (unique in the process, never
    reused), e.g. a :class:`~ortgpu_core.DeviceBuffer`.  Bind groups are cached by ``(handle, generation)``, so a
    freed buffer whose native address is reused can never pick up a bind group made for it."""

    @property
    def handle(self) -> int: ...

    @property
    def generation(self) -> int: ...

    @property
    def released(self) -> bool: ...


_BufferMap = Mapping[str, BufferRef]
_Buffer = TypeVar("_Buffer", bound=BufferRef)  # what a program's allocate() returns and free() takes


class WeightStore:
    """Constants uploaded once per session and device, shared by that session's plans."""

    def __init__(self, device: BackendDevice) -> None:
        self.device = device
        self._buffers: dict[Hashable, int] = {}
        self._released = False
        self.uploaded_bytes = 0

    def get(self, key: Hashable, array: np.ndarray) -> int:
        """The buffer holding ``array`` (uploaded on first use of ``key``)."""
        if self._released:
            raise ReleasedValueError("this WeightStore was released")
        buffer = self._buffers.get(key)
        if buffer is None:
            data = padded_bytes(array)
            buffer = self.device.create_buffer(len(data), label="weight")
            try:
                self.device.write_buffer(buffer, 0, data)
            except BaseException:
                self.device.destroy_buffer(buffer)
                raise
            self._buffers[key] = buffer
            self.uploaded_bytes += array.nbytes
        return buffer

    def __len__(self) -> int:
        return len(self._buffers)

    def release(self) -> None:
        """Destroy every weight buffer.  Idempotent."""
        buffers, self._buffers = self._buffers, {}
        self._released = True
        for buffer in buffers.values():
            self.device.destroy_buffer(buffer)


_ParamsEntry = tuple[int, int]  # offset, size in the program's uniform buffer


class DeviceProgram(Generic[_Buffer]):
    """An :class:`ExecutionPlan` instantiated on one device.

    ``allocate(nbytes) -> buffer`` and ``free(buffer)`` provide the
    intermediate buffers (:class:`BufferRef` objects; the session's allocator); ``weights`` is the
    session's :class:`WeightStore` for this device (a private one when
    omitted, released with the program).
    """

    def __init__(
        self,
        plan: ExecutionPlan,
        device: BackendDevice,
        pipeline_cache: PipelineCache,
        allocate: Callable[[int], _Buffer],
        free: Callable[[_Buffer], None],
        weights: WeightStore | None = None,
    ) -> None:
        if pipeline_cache.device is not device:
            raise ValueError("the pipeline cache belongs to another device")
        self.plan = plan
        self.device = device
        self._free = free
        self._own_weights = weights is None
        self.weights = weights if weights is not None else WeightStore(device)
        self._slots: list[_Buffer] = []
        self._params_buffer: int | None = None
        self._status_buffer: int | None = None  # see Binding("status"): made when a kernel binds it
        # (handle, generation) of each input, then each output -> (the bind groups, weak references to the buffers)
        self._bind_groups: dict[tuple[tuple[int, int], ...], tuple[list[int], list[weakref.ref[Any]]]] = {}
        self._released = False
        # What profiling keeps per program (a GPU step timer: its query set and resolve buffer, see
        # ortgpu._profiling); released with the program.  None until a profiled run or replay needs it.
        self.timing_resources: _Releasable | None = None
        # Graph inputs and outputs that live on the host only (strings): no buffer; see run(host=...).
        # Host-only values (strings) and inputs the plan never reads (folded values) get no buffer.
        self._host_io = frozenset(host_io_names(plan))
        # Host-only values and inputs the plan never reads (values folded into it) get no buffer.
        self._no_buffer = self._host_io | plan.unread_inputs
        try:
            for size in plan.slot_sizes:
                self._slots.append(allocate(padded_size(size)))
            self._constant_buffers = {
                name: self.weights.get(key, plan.constants[name]) for name, key in plan.constant_keys.items()
            }
            self._pipelines: list[list[int]] = []
            self._params: list[list[_ParamsEntry | None]] = []
            self._build_params_and_pipelines(pipeline_cache)
            checking = [
                step
                for step in plan.steps
                if step.op_plan is not None
                and any(b.kind == "status" for kernel in step.op_plan.kernels for b in kernel.bindings)
            ]
            self._status_nodes = [step.name for step in checking]
            self._status_hints = sorted({step.operator.data_error_hint for step in checking} - {""})
            if self._status_nodes:
                self._status_buffer = device.create_buffer(STATUS_BYTES, label="status")
                device.write_buffer(self._status_buffer, 0, bytes(STATUS_BYTES))
        except BaseException:
            self.release()
            raise

    # -- construction ------------------------------------------------------------

    def _build_params_and_pipelines(self, cache: PipelineCache) -> None:
        alignment = max(16, self.device.limits.min_uniform_buffer_offset_alignment)
        blob = bytearray()
        for step in self.plan.steps:
            pipelines: list[int] = []
            params: list[_ParamsEntry | None] = []
            if step.placement == "webgpu" and step.op_plan is not None and not _empty_step(step):
                for kernel in step.op_plan.kernels:
                    pipelines.append(cache.get(kernel))
                    if any(b.kind == "params" for b in kernel.bindings):
                        offset = (len(blob) + alignment - 1) // alignment * alignment
                        size = max(16, (len(kernel.params) + 15) // 16 * 16)
                        blob.extend(b"\0" * (offset - len(blob)))
                        blob.extend(kernel.params + b"\0" * (size - len(kernel.params)))
                        params.append((offset, size))
                    else:
                        params.append(None)
            self._pipelines.append(pipelines)
            self._params.append(params)
        if blob:
            self._params_buffer = self.device.create_buffer(padded_size(len(blob)), uniform=True, label="params")
            self.device.write_buffer(self._params_buffer, 0, bytes(blob) + b"\0" * (padded_size(len(blob)) - len(blob)))

    # -- buffers --------------------------------------------------------------------

    def _buffer_of(self, name: str, inputs: _BufferMap, outputs: _BufferMap) -> int:
        plan = self.plan
        tensor = plan.tensors[plan.root(name)]
        if tensor.storage == "input":
            return inputs[tensor.name].handle
        if tensor.storage == "output":
            return outputs[tensor.name].handle
        if tensor.storage == "constant":
            return self._constant_buffers[tensor.name]
        return self._slots[tensor.slot].handle

    def _check_io(self, inputs: _BufferMap, outputs: _BufferMap) -> None:
        if self._released:
            raise ReleasedValueError("this DeviceProgram was released")
        missing = [n for n in self.plan.input_infos if n not in inputs and n not in self._no_buffer]
        missing += [n for n in self.plan.output_infos if n not in outputs and n not in self._host_io]
        if missing:
            raise ModelError(
                f"no buffer given for {missing}; the plan needs inputs {sorted(self.plan.input_infos)} "
                f"and outputs {sorted(self.plan.output_infos)}"
            )

    def _bind_groups_for(self, inputs: _BufferMap, outputs: _BufferMap) -> list[int]:
        buffers = [inputs[n] for n in self.plan.input_infos if n not in self._no_buffer]
        buffers += [outputs[n] for n in self.plan.output_infos if n not in self._host_io]
        key = tuple((b.handle, b.generation) for b in buffers)
        cached = self._bind_groups.get(key)
        if cached is not None:
            return cached[0]
        self._forget_dead_buffers()
        groups: list[int] = []
        # filled in place so a failure still releases what was made
        self._bind_groups[key] = (groups, [weakref.ref(b) for b in buffers])
        for step_index, step in enumerate(self.plan.steps):
            if not self._pipelines[step_index]:
                continue
            assert step.op_plan is not None
            for kernel_index, kernel in enumerate(step.op_plan.kernels):
                entries = []
                for slot, binding in enumerate(kernel.bindings):
                    if binding.kind == "params":
                        entry = self._params[step_index][kernel_index]
                        assert entry is not None and self._params_buffer is not None
                        entries.append(BindingEntry(slot, self._params_buffer, entry[0], entry[1]))
                    elif binding.kind == "input":
                        name = step.inputs[binding.index]
                        info = step.input_infos[binding.index]
                        assert info is not None, "a kernel binds an absent optional input"
                        entries.append(
                            BindingEntry(slot, self._buffer_of(name, inputs, outputs), 0, padded_size(info.nbytes))
                        )
                    elif binding.kind == "output":
                        name = step.outputs[binding.index]
                        size = padded_size(step.output_infos[binding.index].nbytes)
                        entries.append(BindingEntry(slot, self._buffer_of(name, inputs, outputs), 0, size))
                    elif binding.kind == "status":
                        assert self._status_buffer is not None
                        entries.append(BindingEntry(slot, self._status_buffer, 0, STATUS_BYTES))
                    else:
                        assert step.op_plan is not None
                        size = padded_size(step.op_plan.scratch_sizes[binding.index])
                        entries.append(
                            BindingEntry(slot, self._slots[step.scratch_slots[binding.index]].handle, 0, size)
                        )
                groups.append(self.device.create_bind_group(self._pipelines[step_index][kernel_index], entries))
        return groups

    def forget_buffers(self, buffers: Sequence[BufferRef]) -> None:
        """Release cached bind groups that use any of ``buffers`` (call before freeing transient buffers, so their
        bind groups go with them)."""
        doomed = {(b.handle, b.generation) for b in buffers}
        self._release_bind_groups([key for key in self._bind_groups if doomed.intersection(key)])

    def _forget_dead_buffers(self) -> None:
        """Release the cached bind groups of buffers that were released or collected since they were cached (they
        can never be used again: a new buffer has a new generation, whatever its native address)."""
        self._release_bind_groups(
            [
                key
                for key, (_, refs) in self._bind_groups.items()
                if any((buffer := ref()) is None or buffer.released for ref in refs)
            ]
        )

    def _release_bind_groups(self, keys: Sequence[tuple[tuple[int, int], ...]]) -> None:
        for key in keys:
            groups, _ = self._bind_groups.pop(key)
            for group in groups:
                self.device.release_bind_group(group)

    # -- recording --------------------------------------------------------------------

    def _record_copies(self, commands: CommandList, after_step: int, inputs: _BufferMap, outputs: _BufferMap) -> None:
        for step_index, output, source in self.plan.output_copies:
            if step_index != after_step:
                continue
            nbytes = self.plan.output_infos[output].nbytes
            if nbytes == 0 or output in self._host_io:
                continue
            source_buffer = self._buffer_of(source, inputs, outputs)
            target = outputs[output].handle
            if source_buffer != target:
                commands.add_copy(source_buffer, 0, target, 0, padded_size(nbytes))

    def _record_steps(
        self,
        commands: CommandList,
        first: int,
        stop: int,
        groups: list[int],
        group_start: int,
        inputs: _BufferMap,
        outputs: _BufferMap,
    ) -> int:
        """Record steps ``first..stop-1`` (all on the device); returns the next bind-group index."""
        g = group_start
        for step_index in range(first, stop):
            step = self.plan.steps[step_index]
            pipelines = self._pipelines[step_index]
            if pipelines:
                assert step.op_plan is not None
                for kernel, pipeline in zip(step.op_plan.kernels, pipelines):
                    x, y, z = kernel.grid
                    if x > 0 and y > 0 and z > 0:
                        commands.add_dispatch(pipeline, groups[g], x, y, z)
                    g += 1
            self._record_copies(commands, step_index, inputs, outputs)
        return g

    def _start_list(self, inputs: _BufferMap, outputs: _BufferMap) -> tuple[list[int], CommandList]:
        """The bind groups for these buffers and a new list holding what precedes the steps (the status clear and
        the input copies), for a fully-on-device plan; :class:`ModelError` when the plan has CPU nodes."""
        self._check_io(inputs, outputs)
        if not self.plan.capturable:
            raise ModelError(
                f"the plan runs nodes on the CPU ({', '.join(self.plan.cpu_nodes)}), so it cannot be recorded "
                "into one command list; use run() or a model whose nodes all run on WebGPU"
            )
        groups = self._bind_groups_for(inputs, outputs)
        commands = CommandList()
        self._record_status_clear(commands)
        self._record_copies(commands, -1, inputs, outputs)
        return groups, commands

    def record(self, inputs: _BufferMap, outputs: _BufferMap) -> CommandList:
        """Every dispatch and copy of a fully-on-device plan, for these input/output buffers.

        Bind groups are cached by buffer identity: recording again with the
        same buffers creates nothing.  Raises :class:`ModelError` when the
        plan has CPU nodes (``plan.cpu_nodes``); use :meth:`run` for those.
        """
        groups, commands = self._start_list(inputs, outputs)
        self._record_steps(commands, 0, len(self.plan.steps), groups, 0, inputs, outputs)
        return _with_early_submit(commands)

    def record_timed(
        self, inputs: _BufferMap, outputs: _BufferMap, query_set: int, per_step: bool = True, first_query: int = 0
    ) -> tuple[CommandList, object]:
        """:meth:`record` with a timestamp written into ``query_set`` before each planned step (query ``i`` before
        step ``i``) and one after the last (query ``len(plan.steps)``): the same work in the same order, in one
        command list (a timestamp between dispatches is written inside their compute pass where the device allows
        it, else it ends the pass).  Without ``per_step``: query 0 before the first step and query 1 after the
        last, nothing between.  Query numbers start at ``first_query`` (``first_query + i``).
        Also returns the cached bind-group list the records use: while :meth:`bind_groups_token` returns the same
        object for these buffers, the list stays valid (for callers that keep it)."""
        groups, commands = self._start_list(inputs, outputs)
        steps = len(self.plan.steps)
        if per_step:
            g = 0
            for step_index in range(steps):
                commands.add_timestamp(query_set, first_query + step_index)
                g = self._record_steps(commands, step_index, step_index + 1, groups, g, inputs, outputs)
            commands.add_timestamp(query_set, first_query + steps)
        else:
            commands.add_timestamp(query_set, first_query)
            self._record_steps(commands, 0, steps, groups, 0, inputs, outputs)
            commands.add_timestamp(query_set, first_query + 1)
        return _with_early_submit(commands), groups

    def bind_groups_token(self, inputs: _BufferMap, outputs: _BufferMap) -> object:
        """The cached bind-group list these buffers use (made now if there is none): a list recorded for them
        stays valid while this returns the same object."""
        return self._bind_groups_for(inputs, outputs)

    def record_per_step(self, inputs: _BufferMap, outputs: _BufferMap) -> list[tuple[PlannedStep, CommandList]]:
        """One command list per step of a fully-on-device plan, in order (for profiling: submit each alone)."""
        self._check_io(inputs, outputs)
        if not self.plan.capturable:
            raise ModelError(
                f"the plan runs nodes on the CPU ({', '.join(self.plan.cpu_nodes)}); profile a WebGPU-only plan"
            )
        groups = self._bind_groups_for(inputs, outputs)
        lists: list[tuple[PlannedStep, CommandList]] = []
        g = 0
        for step_index, step in enumerate(self.plan.steps):
            commands = CommandList()
            g = self._record_steps(commands, step_index, step_index + 1, groups, g, inputs, outputs)
            lists.append((step, commands))
        return lists

    def run(
        self,
        inputs: _BufferMap,
        outputs: _BufferMap,
        submit: Callable[[CommandList], None],
        host: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Run the plan: device segments through ``submit``, CPU nodes on the host in between.

        ``host``: the values of the graph inputs that live on the host only (strings, :func:`host_io_names`),
        by name; after the run it also holds the values CPU nodes computed (read host-only outputs with
        :meth:`host_output`)."""
        host = {} if host is None else host
        self._check_io(inputs, outputs)
        absent = [n for n in self.plan.input_infos if n in self._host_io and n not in host]
        if absent:
            raise ModelError(f"no host value given for the string input(s) {absent}")
        if self.plan.capturable:
            submit(self.record(inputs, outputs))
            return
        groups = self._bind_groups_for(inputs, outputs)
        commands = CommandList()
        self._record_status_clear(commands)
        self._record_copies(commands, -1, inputs, outputs)
        g = 0
        segment_start = 0
        steps = self.plan.steps
        for step_index, step in enumerate(steps):
            if step.placement == "webgpu":
                continue
            g = self._record_steps(commands, segment_start, step_index, groups, g, inputs, outputs)
            if len(commands):
                submit(commands)
                commands = CommandList()
            self._run_on_cpu(step, host, inputs, outputs)
            self._record_copies(commands, step_index, inputs, outputs)
            segment_start = step_index + 1
        self._record_steps(commands, segment_start, len(steps), groups, g, inputs, outputs)
        if len(commands):
            submit(commands)

    def run_timed(
        self,
        inputs: _BufferMap,
        outputs: _BufferMap,
        submit: Callable[[CommandList], None],
        wait: Callable[[], None],
        on_step: Callable[[PlannedStep, int, int, int], None],
        host: dict[str, np.ndarray] | None = None,
    ) -> None:
        """:meth:`run` for profiling: each planned step's work is submitted alone and waited for (``wait``), and
        ``on_step(step, start_ns, end_ns, dispatches)`` reports it (host clock, ``time.perf_counter_ns``).  The
        same work in the same order as :meth:`run` (and as a captured graph's list, which :meth:`record` makes):
        only the submissions are split."""
        host = {} if host is None else host
        self._check_io(inputs, outputs)
        absent = [n for n in self.plan.input_infos if n in self._host_io and n not in host]
        if absent:
            raise ModelError(f"no host value given for the string input(s) {absent}")
        groups = self._bind_groups_for(inputs, outputs)
        commands = CommandList()
        self._record_status_clear(commands)
        self._record_copies(commands, -1, inputs, outputs)
        if len(commands):
            submit(commands)
        g = 0
        for step_index, step in enumerate(self.plan.steps):
            commands = CommandList()
            start = time.perf_counter_ns()
            if step.placement == "webgpu":
                g = self._record_steps(commands, step_index, step_index + 1, groups, g, inputs, outputs)
            else:
                wait()  # the CPU step reads what earlier steps wrote: start its clock at their completion
                start = time.perf_counter_ns()
                self._run_on_cpu(step, host, inputs, outputs)
                self._record_copies(commands, step_index, inputs, outputs)
            if len(commands):
                submit(commands)
            wait()
            on_step(step, start, time.perf_counter_ns(), commands.dispatch_count)

    def _record_status_clear(self, commands: CommandList) -> None:
        if self._status_buffer is not None:
            commands.add_clear(self._status_buffer, 0, STATUS_BYTES)

    @property
    def checks_data(self) -> bool:
        """Whether kernels of this program check their input data (see :meth:`raise_data_errors`)."""
        return self._status_buffer is not None

    def raise_data_errors(self) -> None:
        """Raise :class:`InvalidArgumentError` if a kernel of the last run found invalid data (an index out of
        range: ONNX makes it an error, and the kernel could only clamp it).  Reads the status words back, so it
        waits for that run; a no-op for programs whose kernels check nothing."""
        if self._status_buffer is None:
            return
        status = np.frombuffer(self.device.read_buffer(self._status_buffer, 0, STATUS_BYTES), dtype=np.uint32)
        if status[0]:
            nodes = ", ".join(repr(name) for name in self._status_nodes)
            hints = "".join(f"; {hint}" for hint in self._status_hints)
            raise InvalidArgumentError(
                f"the run read an index out of range (or a length that does not fit) in one of the nodes {nodes} "
                f"(found on the device; onnxruntime refuses such inputs too): its outputs are not valid{hints}"
            )

    def _read(
        self, name: str, info: TensorInfo, host: dict[str, np.ndarray], inputs: _BufferMap, outputs: _BufferMap
    ) -> np.ndarray:
        root = self.plan.root(name)
        if root in self.plan.constants:
            value = self.plan.constants[root]
        elif root in host:
            value = host[root]
        elif info.dtype == object and info.size == 0:
            return np.empty(info.shape, dtype=object)
        elif info.dtype == object:
            raise ModelError(
                f"host value {name!r} (a string tensor or a sequence) has no value (those never live on the device)"
            )
        else:
            if info.nbytes == 0:
                return np.zeros(info.shape, dtype=info.dtype)
            raw = self.device.read_buffer(self._buffer_of(name, inputs, outputs), 0, padded_size(info.nbytes))
            value = np.frombuffer(raw, dtype=np.uint8, count=info.nbytes).view(info.dtype)
            host[root] = value
        return value.reshape(info.shape)

    def _run_on_cpu(
        self, step: PlannedStep, host: dict[str, np.ndarray], inputs: _BufferMap, outputs: _BufferMap
    ) -> None:
        if all(info.size == 0 for name, info in zip(step.outputs, step.output_infos) if name):
            return
        values: list[np.ndarray | None] = [
            computable(self._read(name, info, host, inputs, outputs)) if name and info is not None else None
            for name, info in zip(step.inputs, step.input_infos)
        ]
        results = step.operator.reference(values, step.attrs, step.output_infos)
        for name, info, value in zip(step.outputs, step.output_infos, results):
            if not name:
                continue
            array = np.asarray(value)
            if tuple(array.shape) != info.shape:
                raise ModelError(
                    f"node {step.name!r} ({step.op_type}) produced shape {array.shape} on the CPU; "
                    f"shape inference said {info.shape}"
                )
            if is_sequence_dtype(info.dtype):
                _check_sequence(step, name, info, array)
            array = np.asarray(array, dtype=info.dtype, order="C")
            host[name] = array
            if info.nbytes and info.dtype != object:
                self.device.write_buffer(self._buffer_of(name, inputs, outputs), 0, padded_bytes(array))

    def host_output(self, name: str, host: Mapping[str, np.ndarray]) -> np.ndarray:
        """Graph output ``name``, one that lives on the host only (a string), after :meth:`run` with ``host``."""
        info = self.plan.output_infos[name]
        root = self.plan.root(name)
        value = self.plan.constants[root] if root in self.plan.constants else host.get(root)
        if value is None and info.size == 0:  # an empty CPU step does not run
            value = np.empty(info.shape, dtype=object)
        if value is None:
            raise ModelError(f"host output {name!r} (a string tensor or a sequence) has no value after the run")
        return np.asarray(value, dtype=object).reshape(info.shape).copy()

    # -- lifetime -----------------------------------------------------------------------

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Free the program's buffers and bind groups (pipelines stay in the cache).  Idempotent."""
        if self._released:
            return
        self._released = True
        timing, self.timing_resources = self.timing_resources, None
        if timing is not None:
            timing.release()
        bind_groups, self._bind_groups = self._bind_groups, {}
        for groups, _ in bind_groups.values():
            for group in groups:
                self.device.release_bind_group(group)
        if self._params_buffer is not None:
            buffer, self._params_buffer = self._params_buffer, None
            self.device.destroy_buffer(buffer)
        if self._status_buffer is not None:
            buffer, self._status_buffer = self._status_buffer, None
            self.device.destroy_buffer(buffer)
        slots, self._slots = self._slots, []
        for slot in slots:
            self._free(slot)
        if self._own_weights:
            self.weights.release()


def _check_sequence(step: PlannedStep, name: str, info: TensorInfo, value: np.ndarray) -> None:
    """A sequence a CPU node produced must have the element shapes (and dtype) the plan was made for: the shapes
    of what reads it were planned from them (a run that differs is a typed error, never a wrong shape)."""
    planned_shapes = element_shapes_of(info.dtype)
    planned_dtype = element_dtype_of(info.dtype)
    arrays = items(value, f"node {step.name!r} ({step.op_type}) output {name!r}")
    shapes = tuple(tuple(int(d) for d in a.shape) for a in arrays)
    if planned_shapes is not None and shapes != planned_shapes:
        raise ModelError(
            f"node {step.name!r} ({step.op_type}) produced a sequence {name!r} with element shapes {list(shapes)} on "
            f"the CPU; the plan was made for {list(planned_shapes)} (they depend on values the plan could not know)"
        )
    if planned_dtype is not None and any(a.dtype != planned_dtype for a in arrays):
        raise ModelError(
            f"node {step.name!r} ({step.op_type}) produced a sequence {name!r} whose elements are not {planned_dtype}"
        )


def host_io_names(plan: ExecutionPlan) -> list[str]:
    """The graph inputs and outputs of ``plan`` that live on the host only (strings: numpy object arrays); they
    have no device buffer, and :meth:`DeviceProgram.run` takes and gives their values in its ``host`` dict."""
    names = [n for n, info in plan.input_infos.items() if info.dtype == object]
    return names + [n for n, info in plan.output_infos.items() if info.dtype == object and n not in names]


def _empty_step(step: PlannedStep) -> bool:
    return all(info.size == 0 for name, info in zip(step.outputs, step.output_infos) if name)
