"""SessionRunner: the run machinery of one session (plans, staged runs, bound runs, programs, intermediates,
submission), and the object the core's bindings and graphs talk to.

:class:`~ortgpu.InferenceSession` keeps the public API and delegates here.  The runner implements the core's
:class:`~ortgpu_core._owner.BindingOwner` and :class:`~ortgpu_core._owner.GraphOwner` protocols (``check_open``,
``check_bind``, ``verify_replay``, ``forget_graph``), so the core never calls a session's private methods, and
hands each captured graph the :class:`~ortgpu_core._replay.GraphSubmitter` it replays through.  It holds no reference to the session object, so it adds no reference cycle.

Ownership: the runner owns the session's :class:`SessionAllocator` (intermediates, staging buffers,
``run_with_ort_values`` outputs), its uploaded weights and its captured graphs; ``close()`` releases the graphs
first, then programs and buffers.  Pipelines live in a per-device cache shared by all sessions on the device.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Mapping, Sequence

import numpy as np

from ortgpu_core import (
    CPU,
    ArgumentTypeError,
    Device,
    DeviceLostError,
    DtypeError,
    Env,
    InvalidArgumentError,
    OrtValue,
    ProvenanceError,
    ReleasedValueError,
    SessionAllocator,
    ShapeError,
    WebGPU,
)
from ortgpu_core._layout import padded_size
from ortgpu_core._replay import GraphSubmitter, PlainSubmitter, SerializedSubmitter
from ortgpu_core._sparse import dense_only_error
from ortgpu_core._value import DeviceBuffer
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice

from ._bound_plan import MAX_GUARDED_BYTES, plan_for_binding
from ._capture import AnyBinding, AnyValue, GraphRegistry, verify_replay
from ._device_caches import _pipeline_cache, _serial_lock
from ._executor import DeviceProgram, WeightStore, device_caps, host_io_names
from ._host_values import host_signature, is_box, is_optional_box, is_structured_dtype, items, optional_element
from ._planner import ExecutionPlan, plan_model
from ._profiled_replay import ProfiledReplay
from ._profiling import GpuStepTimer, SessionProfiler, gpu_timing_possible
from .loader._limits import max_cached_plans
from .loader._model import LoadedModel, ValueInfo

if TYPE_CHECKING:
    from ortgpu_core._graph import CapturedGraph

__all__ = ["SessionRunner", "AnyValue", "AnyBinding", "MAX_GUARDED_BYTES"]

# Guards making a program's GPU step timer (profiling), so two first profiled uses cannot both make one.
_timer_creation = threading.Lock()


@dataclass
class _StagedRun:
    """An ordinary-run program with its session-owned input and output staging buffers."""

    plan: ExecutionPlan
    program: DeviceProgram[DeviceBuffer]
    inputs: dict[str, DeviceBuffer]
    outputs: dict[str, DeviceBuffer]


class SessionRunner:
    """Runs one loaded model on one device for session ``session_id``; see the module docstring."""

    def __init__(
        self,
        session_id: int,
        env: Env,
        device: Device,
        model: LoadedModel,
        *,
        graph_capture: bool,
        allow_cpu_fallback: bool,
        verify_replays: bool,
        fuse: bool,
    ) -> None:
        self.session_id = session_id
        self.env = env
        self._serialized = env.execution_mode == "serialized"  # (fixed for the Env's life)
        self.device = device
        self.model = model
        self.graph_capture = graph_capture
        self.allow_cpu_fallback = allow_cpu_fallback
        self.verify_replays = verify_replays
        self.fuse = fuse
        self.closed = True  # until fully constructed
        self.backend_device: BackendDevice = device._native_device()
        self.caps = device_caps(self.backend_device)
        self.allocator = SessionAllocator(env, device, session_id)
        self.weights = WeightStore(self.backend_device)
        self.pipelines = _pipeline_cache(self.backend_device)
        self.lock = threading.RLock()  # guards the caches below and serializes this session's runs
        # Plans by input signature, least recently used first; at most max_plans, each dropped with its staged run
        # and program (captured graphs own their programs: they never depend on these caches).
        self.plans: OrderedDict[tuple[Any, ...], ExecutionPlan] = OrderedDict()
        self.max_plans = max_cached_plans()
        self.staged: dict[tuple[Any, ...], _StagedRun] = {}
        # By id() of a plan, with the plan itself: an id is only trusted for the object it was taken from.
        self.programs: dict[int, tuple[ExecutionPlan, DeviceProgram[DeviceBuffer]]] = {}
        self.graphs = GraphRegistry()  # captured graphs by id, and the capture lock (see _capture)
        # This session's own profiling record while profiling is on (see _profiling); None: runs and replays pay
        # one attribute check.
        self._profiler: SessionProfiler | None = None  # (see the profiler property)
        # What captured graphs replay through (see ortgpu_core._replay): swapped on the live graphs when the
        # profiler property is set (profiling starts or ends).
        self._unprofiled_replay: GraphSubmitter = (
            SerializedSubmitter(self.backend_device, _serial_lock(env))
            if self._serialized
            else PlainSubmitter(self.backend_device)
        )
        self._profiled_replay = ProfiledReplay(self, self._unprofiled_replay)
        # The runner for runs that feed overridable initializers (LoRA adapters), made on first use and closed with
        # this one (see ortgpu._adapter_runs); guarded by the lock.
        self.adapter_runner: SessionRunner | None = None
        self.input_infos = {info.name: info for info in model.inputs}
        self.output_infos = {info.name: info for info in model.outputs}
        self.closed = False

    @property
    def input_names(self) -> list[str]:
        return [info.name for info in self.model.inputs]

    @property
    def output_names(self) -> list[str]:
        return [info.name for info in self.model.outputs]

    # -- lifetime (GraphOwner) ------------------------------------------------------------------
    def check_open(self, what: str = "use the session") -> None:
        if self.closed:
            raise ReleasedValueError(
                f"cannot {what}: session {self.session_id} is closed; create a new InferenceSession"
            )
        self.env.check_open()

    def closed_reason(self) -> str | None:
        """Why this session can no longer replay (its Env or itself closed), or None while it is open."""
        if self.env.closed:
            return f"its Env {self.env.id} was closed; create a new Env and session, and capture again"
        if self.closed:
            return f"its session {self.session_id} was closed; create a new session and capture again"
        return None

    def close(self) -> None:
        """Release captured graphs, then programs and buffers.  Idempotent; always completes.

        Waits for a capture in flight on another thread (the capture lock is taken before the run lock,
        as capture takes them), so no graph can be registered, or half rolled back, on a closed session.
        """
        with self.graphs.capture_lock, self.lock:
            if self.closed:
                return
            self.closed = True
            if self.adapter_runner is not None:
                self.adapter_runner.close()
            # Closing always completes: graph release never raises, and native frees on a closed or lost device
            # are skipped (the device freed everything it had).
            self.graphs.release_all()
            for program in [staged.program for staged in self.staged.values()] + [
                program for _, program in self.programs.values()
            ]:
                _free_native(program.release)
            self.staged.clear()
            self.programs.clear()
            self.plans.clear()
            _free_native(self.weights.release)
            self.allocator.close(f"session {self.session_id} was closed")

    def forget_graph(self, graph: CapturedGraph) -> None:
        """Called by :meth:`CapturedGraph.release`: drop the graph from this session's registry."""
        self.graphs.forget(graph)

    def verify_replay(self, graph: CapturedGraph) -> None:
        """Called by ``replay()`` in verify mode: see :func:`ortgpu._capture.verify_replay`."""
        verify_replay(self, graph)

    # -- ordinary runs -------------------------------------------------------------------------
    def run_arrays(self, arrays: Mapping[str, np.ndarray], order: Sequence[str]) -> list[np.ndarray]:
        """``run()``: host arrays in, host arrays out (the feeds are checked by the session)."""
        with self.lock:
            staged = self.staged_run(
                {n: a.shape for n, a in arrays.items()}, {n: a.dtype for n, a in arrays.items()}, arrays
            )
            host: dict[str, np.ndarray] = {}  # strings: host values only, no staging buffer
            for name, array in arrays.items():
                if array.dtype == object:
                    host[name] = array
                elif array.nbytes:
                    staged.inputs[name].write(array)
            self.run_program(staged.program, staged.inputs, staged.outputs, host)
            results = {}
            for name in order:
                info = staged.plan.output_infos[name]
                if info.dtype == object:
                    results[name] = staged.program.host_output(name, host)
                else:
                    results[name] = staged.outputs[name].read(info.shape, info.dtype)
            staged.program.raise_data_errors()
        return [results[name] for name in order]

    def run_values(self, values: Mapping[str, AnyValue], order: Sequence[str]) -> list[OrtValue[WebGPU]]:
        """``run_with_ort_values()``: OrtValues in, new session-owned device values out."""
        with self.lock:
            shapes = {n: tuple(v.shape()) for n, v in values.items()}
            plan = self.plan_for(
                shapes, {n: v.dtype for n, v in values.items()}, self.values_deciding_shapes(values, {})
            )
            _refuse_strings(plan)
            outputs = {n: self.allocator.empty(info.shape, info.dtype) for n, info in plan.output_infos.items()}
            self.run_bound(plan, dict(values), {}, dict(outputs))
        return [outputs[name] for name in order]

    # -- checks, plans, programs and submission ---------------------------------------------------
    def check_value(self, value: object, what: str) -> None:
        """Provenance check: may this session use ``value``?"""
        if not isinstance(value, OrtValue):
            hint = " (bind host arrays with bind_cpu_input)" if isinstance(value, np.ndarray) else ""
            raise ArgumentTypeError(f"{what} needs an OrtValue, got {type(value).__name__}{hint}")
        if value.released:
            raise ReleasedValueError(f"cannot use {value.provenance.describe()} for {what}: it was released")
        if value.is_sparse_tensor():  # runs take dense tensors (onnxruntime refuses a sparse input as well)
            raise dense_only_error(value.as_sparse_tensor(), f"use it for {what}")
        provenance = value.provenance
        if provenance.placement == "cpu":
            return
        if provenance.env_id != self.env.id:
            raise ProvenanceError(
                f"{what}: {provenance.describe()} belongs to Env {provenance.env_id}, but session {self.session_id} "
                f"runs in Env {self.env.id}; allocate the value from this session's Env"
            )
        if provenance.device is not self.device:
            raise ProvenanceError(
                f"{what}: {provenance.describe()} is on another device than session {self.session_id} "
                f"(device {self.device.index}, {self.device.name}); allocate it on the session's device, "
                f"e.g. env.shared_allocator(session.device).empty(...)"
            )
        if provenance.allocator_kind == "session" and provenance.session_id != self.session_id:
            raise ProvenanceError(
                f"{what}: {provenance.describe()} is owned by session {provenance.session_id} and cannot be used by "
                f"session {self.session_id}; use session.allocator of this session, or share it through "
                f"env.shared_allocator(device)"
            )

    def check_bind(self, name: str, value: object, kind: str) -> None:
        """Called by :class:`IOBinding` before a bind: name, provenance, dtype and shape."""
        self.check_open("bind a value")
        infos = self.output_infos if kind == "output" else self.input_infos
        if name not in infos:
            role = "output" if kind == "output" else "input"
            raise InvalidArgumentError(f"the model has no {role} {name!r}; its {role}s are {sorted(infos)}")
        info = infos[name]
        if info.dtype == object:
            raise DtypeError(_STRINGS_UNBOUND.format(names=[name]))
        if kind == "cpu-input":
            assert isinstance(value, np.ndarray)
            dtype, shape = value.dtype, tuple(value.shape)
        else:
            self.check_value(value, f"binding {kind} {name!r}")
            assert isinstance(value, OrtValue)
            dtype, shape = value.dtype, tuple(value.shape())
        self.check_info(name, info, dtype, shape, kind)

    def check_output_name(self, name: str) -> None:
        """Called by :class:`IOBinding` before ``bind_output(name)`` (the session allocates the value)."""
        self.check_open("bind an output")
        if name not in self.output_infos:
            raise InvalidArgumentError(f"the model has no output {name!r}; its outputs are {sorted(self.output_infos)}")
        if self.output_infos[name].dtype == object:
            raise DtypeError(_STRINGS_UNBOUND.format(names=[name]))

    @staticmethod
    def check_info(name: str, info: ValueInfo, dtype: np.dtype[Any], shape: tuple[int, ...], kind: str) -> None:
        if dtype != info.dtype:
            raise DtypeError(
                f"{kind} {name!r} has dtype {info.dtype} in the model, got {dtype}; ortgpu never casts silently: "
                f"provide {info.dtype} data"
                + (" (numpy has none: x.astype(ml_dtypes.bfloat16))" if info.dtype.name == "bfloat16" else "")
            )
        if not info.ranked:
            return  # the model gives this value no rank: the plan checks the shape it gets
        if len(shape) != len(info.shape) or any(isinstance(d, int) and d != s for d, s in zip(info.shape, shape)):
            raise ShapeError(f"{kind} {name!r} has shape {list(info.shape)} in the model, got {list(shape)}")

    def plan_key(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        values: Mapping[str, np.ndarray] | None,
        dtypes: Mapping[str, np.dtype[Any]] | None = None,
    ) -> tuple[Any, ...]:
        """Plans are cached per input-shape signature (a sequence input's: its element dtype and shapes; an optional
        input's: empty or present, and its element's shapes; their dtypes carry them), plus the values of inputs that
        decide shapes by value."""
        key: tuple[Any, ...] = tuple(sorted((name, tuple(shape)) for name, shape in shapes.items()))
        if dtypes is not None:
            key += tuple(
                (name, host_signature(dtype)) for name, dtype in sorted(dtypes.items()) if is_structured_dtype(dtype)
            )
        if self.model.value_dependent_inputs:
            chosen = values or {}
            key += tuple(
                (name, str(chosen[name].dtype), _value_key(chosen[name])) if name in chosen else (name, None)
                for name in sorted(self.model.value_dependent_inputs)
            )
        return key

    def plan_for(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        dtypes: Mapping[str, np.dtype[Any]],
        values: Mapping[str, np.ndarray] | None = None,
    ) -> ExecutionPlan:
        key = self.plan_key(shapes, values, dtypes)
        with self.lock:
            plan = self.plans.get(key)
            if plan is not None:
                self.plans.move_to_end(key)
            else:
                plan = plan_model(
                    self.model,
                    shapes,
                    self.caps,
                    input_dtypes=dtypes,
                    input_values={n: v for n, v in (values or {}).items() if n in self.model.value_dependent_inputs},
                    allow_cpu=self.allow_cpu_fallback,
                    fuse=self.fuse,
                )
                self.plans[key] = plan
                while len(self.plans) > self.max_plans:
                    self._drop_plan(*self.plans.popitem(last=False))
            return plan

    def _drop_plan(self, key: tuple[Any, ...], plan: ExecutionPlan) -> None:
        """Free what the caches hold for an evicted plan (under the lock: no run of this session is using it)."""
        staged = self.staged.pop(key, None)
        if staged is not None:
            _free_native(staged.program.release)
            for buffer in list(staged.inputs.values()) + list(staged.outputs.values()):
                buffer.release("staging buffer of an evicted plan")
        entry = self.programs.get(id(plan))
        if entry is not None and entry[0] is plan:
            del self.programs[id(plan)]
            _free_native(entry[1].release)

    def values_deciding_shapes(
        self, values: Mapping[str, AnyValue], cpu_inputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Host copies of the inputs whose values decide shapes (a synchronous read for device values)."""
        chosen: dict[str, np.ndarray] = {}
        for name in self.model.value_dependent_inputs:
            if name in cpu_inputs:
                chosen[name] = np.asarray(cpu_inputs[name])
            elif name in values:
                chosen[name] = values[name].to_numpy()
        return chosen

    def new_program(self, plan: ExecutionPlan) -> DeviceProgram[DeviceBuffer]:
        """A program for ``plan``: its intermediates come from this session's allocator and die with it."""
        return DeviceProgram(
            plan, self.backend_device, self.pipelines, self.allocator._allocate, _release_intermediate, self.weights
        )

    def submission(self) -> ContextManager[object]:
        """What a submission holds: the Env's serial lock in ``serialized`` mode, else nothing."""
        return _serial_lock(self.env) if self._serialized else contextlib.nullcontext()

    def graph_submitter(self) -> GraphSubmitter:
        """The submitter a graph captured now replays through (under :attr:`lock`): the profiled one while this
        session profiles, else the plain (or serialized) one."""
        return self._unprofiled_replay if self._profiler is None else self._profiled_replay

    @property
    def profiler(self) -> SessionProfiler | None:
        """This session's profiling record while profiling is on, else None."""
        return self._profiler

    @profiler.setter
    def profiler(self, profiler: SessionProfiler | None) -> None:
        """Start (a record) or end (None) profiling: the live graphs swap to the profiled submitter, or back.
        Under the run lock, which capture holds from choosing a graph's submitter until the graph is registered,
        so a graph captured meanwhile gets the submitter that matches."""
        with self.lock:
            self._profiler = profiler
            self.graphs.use_submitter(self.graph_submitter())

    def submit(
        self,
        commands: CommandList,
        read_ahead: Sequence[tuple[int, int, int]] = (),
        encode_next: CommandList | None = None,
    ) -> None:
        """Submit ``commands`` (the backend's ``submit``: ``read_ahead``, the ranges a read may ask for next;
        ``encode_next``, the list submitted next) under :meth:`submission` (nothing to hold in concurrent mode:
        a replay's submit pays no context manager)."""
        if self._serialized:
            with _serial_lock(self.env):
                self.backend_device.submit(commands, read_ahead, encode_next)
        else:
            self.backend_device.submit(commands, read_ahead, encode_next)

    def wait_idle(self) -> None:
        """Block until the device finished the work submitted so far (``replay_async`` and profiling wait so)."""
        with self.submission():
            self.backend_device.wait_idle()

    def run_program(
        self,
        program: DeviceProgram[DeviceBuffer],
        inputs: Mapping[str, DeviceBuffer],
        outputs: Mapping[str, DeviceBuffer],
        host: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Run ``program`` (an ordinary run): as one submission per device segment; while profiling is on, timed
        into this session's profiling record: one submission with GPU timestamps where the device has them and the
        plan runs whole on it, else step by step on the host clock (see :mod:`ortgpu._profiling`)."""
        profiler = self.profiler
        if profiler is None:
            program.run(inputs, outputs, self.submit, host)
            return
        args = {"steps": len(program.plan.steps)}
        detail = profiler.take_detail()
        timer = self.gpu_timer(program) if not host else None
        if timer is not None:
            profiler.run_timed_on_gpu(timer, program, inputs, outputs, self.submit, "run", "run", args, detail)
            return
        if not detail:  # host timing, not in the sample: run as unprofiled, inside its host span
            with profiler.span("run", "run", {**args, "timing": "host", "detail": False}):
                program.run(inputs, outputs, self.submit, host)
            return
        with profiler.span("run", "run", {**args, "timing": "host"}):
            profiler.run_steps(program, inputs, outputs, self.submit, self.wait_idle, host)

    def gpu_timer(self, program: DeviceProgram[DeviceBuffer]) -> GpuStepTimer | None:
        """``program``'s GPU step timer (made on first use, released with the program), or None where its runs
        are timed on the host (no timestamp queries on the device, or CPU steps in the plan)."""
        timer = program.timing_resources
        if isinstance(timer, GpuStepTimer):
            return timer
        if not gpu_timing_possible(self.backend_device, program.plan):
            return None
        with _timer_creation, self.submission():
            timer = program.timing_resources
            if not isinstance(timer, GpuStepTimer):
                timer = GpuStepTimer(program, self.backend_device, self._read_timestamps)
                program.timing_resources = timer
        return timer

    def _read_timestamps(self, commands: CommandList, buffer: int, offset: int, out: Any) -> None:
        """Submit ``commands`` (a GPU step timer's resolves) and read ``out`` from ``buffer`` after them."""
        with self.submission():
            self.backend_device.submit_and_read(commands, [(buffer, offset, out)])

    def submit_and_read(self, commands: CommandList, reads: list[tuple[int, int, Any]]) -> None:
        """:meth:`_submit` ``commands`` and read ``(buffer, offset, out)`` regions in the same submission."""
        with self.submission():
            self.backend_device.submit_and_read(commands, reads)

    def staged_run(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        dtypes: Mapping[str, np.dtype[Any]],
        values: Mapping[str, np.ndarray],
    ) -> _StagedRun:
        key = self.plan_key(shapes, values, dtypes)
        staged = self.staged.get(key)
        if staged is not None:
            self.plans.move_to_end(key)  # a staged run's plan is cached: they are dropped together
        else:
            plan = self.plan_for(shapes, dtypes, values)
            program = self.new_program(plan)
            try:
                host_only = set(host_io_names(plan))  # strings get no staging buffer
                inputs = {
                    n: self.allocator._allocate(padded_size(i.nbytes))
                    for n, i in plan.input_infos.items()
                    if n not in host_only
                }
                outputs = {
                    n: self.allocator._allocate(padded_size(i.nbytes))
                    for n, i in plan.output_infos.items()
                    if n not in host_only
                }
            except BaseException:
                program.release()
                raise
            staged = self.staged[key] = _StagedRun(plan, program, inputs, outputs)
        return staged

    def program_for(self, plan: ExecutionPlan) -> tuple[DeviceProgram[DeviceBuffer], bool]:
        """The program for ordinary runs over bound values, one per cached plan, and whether it is cached; a plan
        dropped from the cache since the caller got it (another thread's new shapes) gets a program for this run
        only, which the caller releases."""
        entry = self.programs.get(id(plan))
        if entry is not None and entry[0] is plan:
            return entry[1], True
        program = self.new_program(plan)
        if not any(cached is plan for cached in self.plans.values()):
            return program, False
        self.programs[id(plan)] = (plan, program)
        return program, True

    def run_bound(
        self,
        plan: ExecutionPlan,
        inputs: dict[str, AnyValue],
        cpu_inputs: dict[str, np.ndarray],
        outputs: dict[str, AnyValue],
    ) -> None:
        """An ordinary run over bound values (host values go through staging buffers)."""
        _refuse_strings(plan)
        program, cached = self.program_for(plan)
        staged: list[DeviceBuffer] = []
        try:
            input_buffers: dict[str, DeviceBuffer] = {}
            for name, info in plan.input_infos.items():
                if name in plan.unread_inputs:
                    continue  # its value was folded into the plan: no buffer
                value = inputs.get(name)
                if value is not None and value._device_buffer is not None:
                    input_buffers[name] = value._device_buffer
                    continue
                host = cpu_inputs[name] if value is None else value.numpy()  # type: ignore[misc]
                buffer = self.allocator._allocate(padded_size(info.nbytes))
                staged.append(buffer)
                if info.nbytes:
                    buffer.write(np.asarray(host))
                input_buffers[name] = buffer
            output_buffers: dict[str, DeviceBuffer] = {}
            host_outputs: dict[str, tuple[OrtValue[CPU], DeviceBuffer]] = {}
            for name, info in plan.output_infos.items():
                target = outputs.get(name)
                if target is not None and target._device_buffer is not None:
                    output_buffers[name] = target._device_buffer
                    continue
                buffer = self.allocator._allocate(padded_size(info.nbytes))
                staged.append(buffer)
                output_buffers[name] = buffer
                if target is not None:
                    host_outputs[name] = (target, buffer)  # type: ignore[assignment]
            self.run_program(program, input_buffers, output_buffers)
            program.raise_data_errors()  # before any host output is written: a refused run changes none
            for name, (target, buffer) in host_outputs.items():
                info = plan.output_infos[name]
                target.update_inplace(buffer.read(info.shape, info.dtype))
        finally:
            if not cached:
                _free_native(program.release)
            elif staged:
                # Bind groups built for transient buffers must not outlive them.
                program.forget_buffers(staged)
                for buffer in staged:
                    buffer.release("transient staging buffer")

    def bound_plan(
        self, binding: AnyBinding, *, for_capture: bool, deciding: dict[str, np.ndarray] | None = None
    ) -> ExecutionPlan:
        """The plan for a binding's values (see :func:`ortgpu._bound_plan.plan_for_binding`)."""
        return plan_for_binding(self, binding, for_capture=for_capture, deciding=deciding)


_STRINGS_UNBOUND = (
    "the model's inputs/outputs {names} are strings, sequences or optionals, which live on the host only and cannot "
    "be bound to OrtValues or an IOBinding; run this model with session.run() on numpy arrays (lists of them for "
    "sequences, None for an empty optional)"
)


def _refuse_strings(plan: ExecutionPlan) -> None:
    """A :class:`DtypeError` when ``plan`` has string inputs or outputs (bound runs take device values only)."""
    strings = host_io_names(plan)
    if strings:
        raise DtypeError(_STRINGS_UNBOUND.format(names=strings))


def _value_key(value: np.ndarray) -> Any:
    """A hashable key for an input's value (strings by their text: an object array's bytes are pointers; a
    sequence by its elements' dtypes, shapes and bytes)."""
    if is_box(value):
        return tuple((a.dtype.str, a.shape, _value_key(a)) for a in items(value, "sequence"))
    if is_optional_box(value):
        element = optional_element(value)
        return ("optional", None if element is None else (element.dtype.str, element.shape, _value_key(element)))
    return tuple(value.ravel().tolist()) if value.dtype == object else value.tobytes()


def _free_native(release: Callable[[], object]) -> None:
    """Run ``release``; on a closed or lost device there is nothing left to free."""
    try:
        release()
    except (DeviceLostError, ReleasedValueError):
        pass


def _release_intermediate(buffer: DeviceBuffer) -> None:
    buffer.release("its program was released")
