"""InferenceSession: load an ONNX model, run it on a WebGPU device, capture and replay it.

Names follow onnxruntime's Python API (``run``, ``run_with_ort_values``,
``run_with_iobinding``, ``io_binding``, ``get_inputs``...), so porting is a
change of import.  What is new is the safe capture workflow:

* ``session.capture(binding, graph_id)`` returns a :class:`CapturedGraph` that
  owns a frozen snapshot of the binding, pins its buffers and locks the
  binding it came from until ``graph.release()``;
* ``run_with_iobinding(binding, RunOptions(gpu_graph_id=N))`` does the same
  in onnxruntime's spelling: it captures graph N on its first call and
  replays it afterwards, refusing any other binding until N is released;
* every value passed in is checked against its provenance (session, device,
  Env), and every value returned carries this session's provenance.

Ownership: the session owns its :class:`SessionAllocator` (intermediates,
staging buffers, ``run_with_ort_values`` outputs), its uploaded weights and
its graphs.  ``close()`` releases the graphs first, then the buffers.
Pipelines live in a per-device cache shared by all sessions on the device.

Layout: this module holds the session's construction, metadata, value and
binding checks, plan cache and ordinary runs; the captured-graph registry,
capture, replay checks and verify mode are in :mod:`ortgpu._capture`; the
per-device pipeline caches and per-Env serial locks in :mod:`ortgpu._device_caches`;
``RunOptions``, ``NodeArg`` and ``NodePlacement`` in :mod:`ortgpu._run_options`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping, Sequence, Union

import numpy as np
import numpy.typing as npt

from ortgpu_core import (
    ArgumentTypeError,
    CPU,
    CaptureStateError,
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
    get_env,
)
from ortgpu_core._binding import FrozenIOBinding, IOBinding
from ortgpu_core._errors import NotCopyable
from ortgpu_core._graph import CapturedGraph
from ortgpu_core._value import DeviceBuffer, padded_size
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice

from ._capture import AnyBinding, GraphRegistry, check_graph_id, verify_replay
from ._device_caches import _pipeline_cache, _serial_lock
from ._executor import DeviceProgram, WeightStore, device_caps
from ._model import LoadedModel, ValueInfo, load_model
from ._planner import ExecutionPlan, plan_model
from ._run_options import NodeArg, NodePlacement, RunOptions, _node_arg

__all__ = ["InferenceSession"]

AnyValue = Union[OrtValue[CPU], OrtValue[WebGPU]]

_session_ids = itertools.count(1)


@dataclass
class _StagedRun:
    """An ordinary-run program with its session-owned input and output staging buffers."""

    plan: ExecutionPlan
    program: DeviceProgram
    inputs: dict[str, DeviceBuffer]
    outputs: dict[str, DeviceBuffer]


class InferenceSession(NotCopyable):
    """Runs one ONNX model on one WebGPU device.

    A session that is dropped without :meth:`close` is closed when it is garbage-collected (its graphs
    released, their pins and binding locks dropped, its buffers freed).  Sessions cannot be copied or
    pickled (``UnsafeAccessError``): create another from the same model.

    Parameters
    ----------
    path_or_bytes:
        A path to an ``.onnx`` file, or the serialized model.
    env:
        The :class:`Env` (default: :func:`get_env`).
    device:
        One of ``env.devices`` (default: ``env.default_device``).
    graph_capture:
        Allow :meth:`capture` and ``run_with_iobinding`` with a graph id.
    allow_cpu_fallback:
        Place nodes the device cannot run on the CPU (reported by
        :meth:`get_node_placement`); False makes such a model an error.
    verify_replays:
        Every ``replay()`` checks its outputs against an uncaptured run (slow; for tests).
    """

    def __init__(
        self,
        path_or_bytes: str | bytes | os.PathLike[str],
        *,
        env: Env | None = None,
        device: Device | None = None,
        graph_capture: bool = False,
        allow_cpu_fallback: bool = True,
        verify_replays: bool = False,
        fuse: bool = True,
    ) -> None:
        self._closed = True  # until fully constructed
        self.session_id: int = next(_session_ids)
        self.env: Env = env if env is not None else get_env()
        self.device: Device = self.env.check_device(device if device is not None else self.env.default_device)
        self.graph_capture = bool(graph_capture)
        self.allow_cpu_fallback = bool(allow_cpu_fallback)
        self.verify_replays = bool(verify_replays)
        self._fuse = bool(fuse)
        self._model: LoadedModel = load_model(path_or_bytes)
        self._backend_device: BackendDevice = self.device._native_device()
        self._caps = device_caps(self._backend_device)
        self.allocator = SessionAllocator(self.env, self.device, self.session_id)
        self._weights = WeightStore(self._backend_device)
        self._pipelines = _pipeline_cache(self._backend_device)
        self._lock = threading.RLock()  # guards the caches below and serializes this session's runs
        self._plans: dict[tuple[Any, ...], ExecutionPlan] = {}
        self._staged: dict[tuple[Any, ...], _StagedRun] = {}
        self._programs: dict[int, DeviceProgram] = {}  # by id() of a plan in self._plans (kept alive there)
        # handle -> the user buffer that _programs' cached bind groups were built with (see _forget_stale_bind_groups)
        self._bound_buffers: dict[int, weakref.ref[DeviceBuffer]] = {}
        self._graphs = GraphRegistry()  # captured graphs by id, and the capture lock (see _capture)
        self._intermediates: dict[int, DeviceBuffer] = {}
        self._input_infos = {info.name: info for info in self._model.inputs}
        self._output_infos = {info.name: info for info in self._model.outputs}
        self._closed = False
        try:
            if not self.allow_cpu_fallback and all(isinstance(d, int) for i in self._model.inputs for d in i.shape):
                # Static model: report forbidden CPU placement now, not at the first run.
                self._plan_for(
                    {i.name: tuple(int(d) for d in i.shape if isinstance(d, int)) for i in self._model.inputs},
                    {i.name: i.dtype for i in self._model.inputs},
                )
            self.env._register_session(self)  # Env.close() closes the session (graphs first) before its devices
        except BaseException:
            self.close()
            raise

    # -- metadata ------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [info.name for info in self._model.inputs]

    @property
    def output_names(self) -> list[str]:
        return [info.name for info in self._model.outputs]

    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(info) for info in self._model.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(info) for info in self._model.outputs]

    def get_providers(self) -> list[str]:
        return ["WebGpuExecutionProvider", "CPUExecutionProvider"] if self.allow_cpu_fallback else ["WebGpuExecutionProvider"]

    def get_node_placement(
        self,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        input_values: Mapping[str, npt.NDArray[Any]] | None = None,
    ) -> list[NodePlacement]:
        """Where each node runs for ``input_shapes`` (default: the model's static shapes).

        Models whose shapes depend on input values (a Reshape's shape or Slice bounds fed as inputs)
        are planned for ``input_values`` too (name -> array; required for those inputs).
        """
        shapes = dict(input_shapes) if input_shapes is not None else {}
        for info in self._model.inputs:
            if info.name not in shapes:
                if not all(isinstance(d, int) for d in info.shape):
                    raise InvalidArgumentError(
                        f"input {info.name!r} has dynamic shape {list(info.shape)}: pass input_shapes={{...}} to say which shapes to plan for"
                    )
                shapes[info.name] = tuple(int(d) for d in info.shape)  # type: ignore[arg-type]
        values = {name: np.asarray(value) for name, value in (input_values or {}).items()}
        plan = self._plan_for(
            {k: tuple(v) for k, v in shapes.items()}, {i.name: i.dtype for i in self._model.inputs}, values
        )
        return [NodePlacement(name, op_type, where, reason) for name, op_type, where, reason in plan.placement]  # type: ignore[arg-type]

    # -- lifetime --------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self, what: str = "use the session") -> None:
        if self._closed:
            raise ReleasedValueError(f"cannot {what}: session {self.session_id} is closed; create a new InferenceSession")
        self.env.check_open()

    def close(self) -> None:
        """Release captured graphs, then programs and buffers.  Idempotent.

        Waits for a capture in flight on another thread (the capture lock is taken before the run lock,
        as capture takes them), so no graph can be registered, or half rolled back, on a closed session.
        """
        with self._graphs.capture_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            # Closing always completes: graph release never raises, and native frees on a closed or lost device
            # are skipped (the device freed everything it had).
            self._graphs.release_all()
            for program in [staged.program for staged in self._staged.values()] + list(self._programs.values()):
                _free_native(program.release)
            self._staged.clear()
            self._programs.clear()
            self._plans.clear()
            _free_native(self._weights.release)
            self.allocator.close(f"session {self.session_id} was closed")
            self._intermediates.clear()

    _copy_hint = "Create another InferenceSession from the same model."

    def __del__(self) -> None:
        # onnxruntime-style code never calls close(): free what the session owns when it is collected.  Safe here:
        # a collected session's own locks, bindings and graphs are unreachable, so no other thread holds them.
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except Exception as error:  # a finalizer never raises; the device frees the rest when it closes
            try:
                warnings.warn(f"closing {self!r} at garbage collection failed: {error}", ResourceWarning, stacklevel=1)
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to warn with
                pass

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<InferenceSession {self.session_id} on {self.device!r} graph_capture={self.graph_capture}{state}>"

    # -- values ----------------------------------------------------------------------
    def io_binding(self) -> IOBinding:
        """A new, empty :class:`IOBinding` for this session."""
        self._check_open("create a binding")
        return IOBinding._create(self)

    def create_ortvalue_from_shape_and_type(
        self, shape: Sequence[int], element_type: npt.DTypeLike, device_type: str = "webgpu", device_id: int | None = None
    ) -> OrtValue[WebGPU]:
        """A zero-filled session-owned device value (same as ``session.allocator.empty``)."""
        self._check_open("allocate a value")
        if device_type != "webgpu":
            raise InvalidArgumentError(
                f"device_type {device_type!r}: sessions allocate on their WebGPU device; for host values use "
                f"OrtValue.ortvalue_from_numpy(array)"
            )
        if device_id is not None and device_id != self.device.index:
            raise ProvenanceError(
                f"session {self.session_id} runs on device {self.device.index} ({self.device.name}), not device "
                f"{device_id}; allocate on device {self.device.index} or create a session on device {device_id}"
            )
        return self.allocator.empty(tuple(shape), element_type)

    def _check_value(self, value: object, what: str) -> None:
        """Provenance check: may this session use ``value``?"""
        if not isinstance(value, OrtValue):
            hint = " (bind host arrays with bind_cpu_input)" if isinstance(value, np.ndarray) else ""
            raise ArgumentTypeError(f"{what} needs an OrtValue, got {type(value).__name__}{hint}")
        if value.released:
            raise ReleasedValueError(f"cannot use {value.provenance.describe()} for {what}: it was released")
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

    def _check_bind(self, name: str, value: object, kind: str) -> None:
        """Called by :class:`IOBinding` before a bind: name, provenance, dtype and shape."""
        self._check_open("bind a value")
        infos = self._output_infos if kind == "output" else self._input_infos
        if name not in infos:
            role = "output" if kind == "output" else "input"
            raise InvalidArgumentError(f"the model has no {role} {name!r}; its {role}s are {sorted(infos)}")
        info = infos[name]
        if kind == "cpu-input":
            assert isinstance(value, np.ndarray)
            dtype, shape = value.dtype, tuple(value.shape)
        else:
            self._check_value(value, f"binding {kind} {name!r}")
            assert isinstance(value, OrtValue)
            dtype, shape = value.dtype, tuple(value.shape())
        self._check_info(name, info, dtype, shape, kind)

    @staticmethod
    def _check_info(name: str, info: ValueInfo, dtype: np.dtype[Any], shape: tuple[int, ...], kind: str) -> None:
        if dtype != info.dtype:
            raise DtypeError(
                f"{kind} {name!r} has dtype {info.dtype} in the model, got {dtype}; ortgpu never casts silently: "
                f"provide {info.dtype} data"
            )
        if len(shape) != len(info.shape) or any(isinstance(d, int) and d != s for d, s in zip(info.shape, shape)):
            raise ShapeError(f"{kind} {name!r} has shape {list(info.shape)} in the model, got {list(shape)}")

    # -- planning ----------------------------------------------------------------------
    def _plan_key(
        self, shapes: Mapping[str, tuple[int, ...]], values: Mapping[str, np.ndarray] | None
    ) -> tuple[Any, ...]:
        """Plans are cached per input-shape signature, plus the values of inputs that decide shapes by value."""
        key: tuple[Any, ...] = tuple(sorted((name, tuple(shape)) for name, shape in shapes.items()))
        if self._model.value_dependent_inputs:
            chosen = values or {}
            key += tuple(
                (name, str(chosen[name].dtype), chosen[name].tobytes()) if name in chosen else (name, None)
                for name in sorted(self._model.value_dependent_inputs)
            )
        return key

    def _plan_for(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        dtypes: Mapping[str, np.dtype[Any]],
        values: Mapping[str, np.ndarray] | None = None,
    ) -> ExecutionPlan:
        key = self._plan_key(shapes, values)
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = plan_model(
                    self._model,
                    shapes,
                    self._caps,
                    input_dtypes=dtypes,
                    input_values={n: v for n, v in (values or {}).items() if n in self._model.value_dependent_inputs},
                    allow_cpu=self.allow_cpu_fallback,
                    fuse=self._fuse,
                )
                self._plans[key] = plan
            return plan

    def _values_deciding_shapes(self, values: Mapping[str, AnyValue], cpu_inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Host copies of the inputs whose values decide shapes (a synchronous read for device values)."""
        chosen: dict[str, np.ndarray] = {}
        for name in self._model.value_dependent_inputs:
            if name in cpu_inputs:
                chosen[name] = np.asarray(cpu_inputs[name])
            elif name in values:
                chosen[name] = values[name].to_numpy()
        return chosen

    def _allocate_intermediate(self, nbytes: int) -> int:
        buffer = self.allocator._allocate(nbytes)
        self._intermediates[buffer.handle] = buffer
        return buffer.handle

    def _free_intermediate(self, handle: int) -> None:
        buffer = self._intermediates.pop(handle, None)
        if buffer is not None:
            buffer.release("its program was released")

    def _new_program(self, plan: ExecutionPlan) -> DeviceProgram:
        return DeviceProgram(
            plan, self._backend_device, self._pipelines, self._allocate_intermediate, self._free_intermediate, self._weights
        )

    def _submission(self) -> ContextManager[object]:
        """What a submission holds: the Env's serial lock in ``serialized`` mode, else nothing."""
        return _serial_lock(self.env) if self.env.execution_mode == "serialized" else contextlib.nullcontext()

    def _submit(self, commands: CommandList) -> None:
        with self._submission():
            self._backend_device.submit(commands)

    def _submit_and_read(self, commands: CommandList, reads: list[tuple[int, int, Any]]) -> None:
        """:meth:`_submit` ``commands`` and read ``(buffer, offset, out)`` regions in the same submission."""
        with self._submission():
            self._backend_device.submit_and_read(commands, reads)

    # -- ordinary runs ---------------------------------------------------------------------
    def _check_feeds(self, feeds: Mapping[str, object]) -> None:
        if not isinstance(feeds, Mapping):
            raise ArgumentTypeError(f"feeds must be a dict of input name -> value, got {type(feeds).__name__}")
        missing = [name for name in self.input_names if name not in feeds]
        extra = [name for name in feeds if name not in self._input_infos]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing inputs {missing}")
            if extra:
                parts.append(f"unknown inputs {extra}")
            raise InvalidArgumentError(f"{' and '.join(parts)}; the model's inputs are {self.input_names}")

    def _output_order(self, output_names: Sequence[str] | None) -> list[str]:
        if output_names is None:
            return self.output_names
        unknown = [name for name in output_names if name not in self._output_infos]
        if unknown:
            raise InvalidArgumentError(f"unknown outputs {unknown}; the model's outputs are {self.output_names}")
        return list(output_names)

    @staticmethod
    def _graph_id_of(run_options: RunOptions | None) -> int | None:
        if run_options is None:
            return None
        if not isinstance(run_options, RunOptions):
            raise ArgumentTypeError(f"run_options must be ortgpu.RunOptions, got {type(run_options).__name__}")
        return run_options.gpu_graph_id

    def _refuse_graph_id(self, run_options: RunOptions | None, method: str) -> None:
        graph_id = self._graph_id_of(run_options)
        if graph_id is not None and graph_id != -1:
            raise CaptureStateError(
                f"{method} takes transient feeds, so it cannot capture or replay graph {graph_id}: bind fixed device "
                f"values and call run_with_iobinding(binding, RunOptions(gpu_graph_id={graph_id})), or use gpu_graph_id=-1"
            )

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.NDArray[Any]],
        run_options: RunOptions | None = None,
    ) -> list[npt.NDArray[Any]]:
        """Run the model on host arrays; returns host arrays in ``output_names`` order (all outputs if None)."""
        self._check_open("run")
        self._refuse_graph_id(run_options, "run()")
        self._check_feeds(input_feed)
        order = self._output_order(output_names)
        arrays: dict[str, np.ndarray] = {}
        for name, array in input_feed.items():
            if not isinstance(array, np.ndarray):
                raise ArgumentTypeError(f"input {name!r} must be a numpy array, got {type(array).__name__}")
            self._check_info(name, self._input_infos[name], array.dtype, tuple(array.shape), "input")
            arrays[name] = array
        with self._lock:
            staged = self._staged_run(
                {n: a.shape for n, a in arrays.items()}, {n: a.dtype for n, a in arrays.items()}, arrays
            )
            for name, array in arrays.items():
                if array.nbytes:
                    _write(self._backend_device, staged.inputs[name], array)
            staged.program.run(
                {n: b.handle for n, b in staged.inputs.items()}, {n: b.handle for n, b in staged.outputs.items()}, self._submit
            )
            results = {}
            for name in order:
                info = staged.plan.output_infos[name]
                results[name] = _read(self._backend_device, staged.outputs[name], info.shape, info.dtype)
        return [results[name] for name in order]

    def _staged_run(
        self, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, np.dtype[Any]], values: Mapping[str, np.ndarray]
    ) -> _StagedRun:
        key = self._plan_key(shapes, values)
        staged = self._staged.get(key)
        if staged is None:
            plan = self._plan_for(shapes, dtypes, values)
            program = self._new_program(plan)
            try:
                inputs = {n: self.allocator._allocate(padded_size(i.nbytes)) for n, i in plan.input_infos.items()}
                outputs = {n: self.allocator._allocate(padded_size(i.nbytes)) for n, i in plan.output_infos.items()}
            except BaseException:
                program.release()
                raise
            staged = self._staged[key] = _StagedRun(plan, program, inputs, outputs)
        return staged

    def _program_for(self, plan: ExecutionPlan) -> DeviceProgram:
        """The program for ordinary runs over bound values, one per plan."""
        program = self._programs.get(id(plan))
        if program is None:
            program = self._programs[id(plan)] = self._new_program(plan)
        return program

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, AnyValue],
        run_options: RunOptions | None = None,
    ) -> list[OrtValue[WebGPU]]:
        """Run on OrtValues; returns new session-owned device values (with this session's provenance)."""
        self._check_open("run")
        self._refuse_graph_id(run_options, "run_with_ort_values()")
        self._check_feeds(input_dict_ort_values)
        order = self._output_order(output_names)
        for name, value in input_dict_ort_values.items():
            self._check_value(value, f"input {name!r}")
            self._check_info(name, self._input_infos[name], value.dtype, tuple(value.shape()), "input")
        with self._lock:
            shapes = {n: tuple(v.shape()) for n, v in input_dict_ort_values.items()}
            plan = self._plan_for(
                shapes,
                {n: v.dtype for n, v in input_dict_ort_values.items()},
                self._values_deciding_shapes(input_dict_ort_values, {}),
            )
            outputs = {n: self.allocator.empty(info.shape, info.dtype) for n, info in plan.output_infos.items()}
            self._run_bound(plan, dict(input_dict_ort_values), {}, dict(outputs))
        return [outputs[name] for name in order]

    def _run_bound(
        self,
        plan: ExecutionPlan,
        inputs: dict[str, AnyValue],
        cpu_inputs: dict[str, np.ndarray],
        outputs: dict[str, AnyValue],
    ) -> None:
        """An ordinary run over bound values (host values go through staging buffers)."""
        program = self._program_for(plan)
        staged: list[DeviceBuffer] = []
        try:
            input_handles: dict[str, int] = {}
            for name, info in plan.input_infos.items():
                value = inputs.get(name)
                if value is not None and value.provenance.placement == "webgpu":
                    assert value._device_buffer is not None
                    input_handles[name] = value._device_buffer.handle
                    continue
                host = cpu_inputs[name] if value is None else value.numpy()  # type: ignore[misc]
                buffer = self.allocator._allocate(padded_size(info.nbytes))
                staged.append(buffer)
                if info.nbytes:
                    _write(self._backend_device, buffer, np.asarray(host))
                input_handles[name] = buffer.handle
            output_handles: dict[str, int] = {}
            host_outputs: dict[str, tuple[OrtValue[CPU], DeviceBuffer]] = {}
            for name, info in plan.output_infos.items():
                target = outputs.get(name)
                if target is not None and target.provenance.placement == "webgpu":
                    assert target._device_buffer is not None
                    output_handles[name] = target._device_buffer.handle
                    continue
                buffer = self.allocator._allocate(padded_size(info.nbytes))
                staged.append(buffer)
                output_handles[name] = buffer.handle
                if target is not None:
                    host_outputs[name] = (target, buffer)  # type: ignore[assignment]
            self._forget_stale_bind_groups(
                [v._device_buffer for v in list(inputs.values()) + list(outputs.values()) if v._device_buffer is not None]
            )
            program.run(input_handles, output_handles, self._submit)
            for name, (target, buffer) in host_outputs.items():
                info = plan.output_infos[name]
                target.update_inplace(_read(self._backend_device, buffer, info.shape, info.dtype))
        finally:
            if staged:
                # Bind groups built for transient buffers must not outlive them.
                program.forget_buffers([b.handle for b in staged])
                for buffer in staged:
                    buffer.release("transient staging buffer")

    def _forget_stale_bind_groups(self, buffers: Sequence[DeviceBuffer]) -> None:
        """Before a bound run over ``buffers``: drop the cached bind groups of every user buffer released since.

        Programs cache bind groups by buffer handle, but a handle outlives its buffer: wgpu-native reuses
        the address of a freed buffer, so a new value could pick up a bind group of a destroyed one (a
        validation error that aborts the process).  Caching stays keyed by handle, checked against the
        buffer object it was built for.
        """
        stale = []
        for handle, known in list(self._bound_buffers.items()):
            buffer = known()
            if buffer is None or buffer.released:
                stale.append(handle)
                del self._bound_buffers[handle]
        if stale:
            for program in self._programs.values():
                program.forget_buffers(stale)
        for buffer in buffers:
            self._bound_buffers[buffer.handle] = weakref.ref(buffer)

    # -- bindings, capture and replay ----------------------------------------------------------
    def _check_binding(self, binding: object) -> AnyBinding:
        if not isinstance(binding, (IOBinding, FrozenIOBinding)):
            raise ArgumentTypeError(f"expected an IOBinding or FrozenIOBinding from session.io_binding(), got {type(binding).__name__}")
        if binding.session is not self:
            raise ProvenanceError(
                f"this binding belongs to session {binding.session_id}, not session {self.session_id}; "
                f"create one with this session's io_binding()"
            )
        return binding

    def _bound_plan(self, binding: AnyBinding, *, for_capture: bool) -> ExecutionPlan:
        inputs, outputs, cpu_inputs = binding.inputs(), binding.outputs(), binding.cpu_inputs()
        missing = [n for n in self.input_names if n not in inputs and n not in cpu_inputs]
        if missing:
            raise CaptureStateError(
                f"inputs {missing} are not bound; bind every input (binding.bind_input(name, value)) before running"
            ) if for_capture else InvalidArgumentError(f"inputs {missing} are not bound; bind every input before running")
        unbound = [n for n in self.output_names if n not in outputs]
        if unbound:
            message = f"outputs {unbound} are not bound; bind each to a device value (binding.bind_output(name, session.allocator.empty(shape, dtype)))"
            raise CaptureStateError(message) if for_capture else InvalidArgumentError(message)
        for name, value in list(inputs.items()) + list(outputs.items()):
            self._check_value(value, f"bound value {name!r}")
        if for_capture:
            host = sorted(cpu_inputs) + [n for n, v in inputs.items() if v.provenance.placement == "cpu"]
            host_out = [n for n, v in outputs.items() if v.provenance.placement == "cpu"]
            if host or host_out:
                raise CaptureStateError(
                    f"cannot capture with host values bound ({sorted(host + host_out)}): a captured graph replays device "
                    f"buffers only; bind device values and update them with value.update_inplace(array)"
                )
            buffers = [v._device_buffer for v in outputs.values()]
            identities = [b.identity for b in buffers if b is not None]
            if len(set(identities)) != len(identities):
                raise CaptureStateError("two outputs are bound to the same value; bind a distinct value to each output")
            input_ids = {v._device_buffer.identity for v in inputs.values() if v._device_buffer is not None}
            if input_ids & set(identities):
                raise CaptureStateError("a value is bound both as an input and as an output; bind distinct values")
        shapes = {n: tuple(v.shape()) for n, v in inputs.items()}
        shapes.update({n: tuple(a.shape) for n, a in cpu_inputs.items()})
        dtypes = {n: v.dtype for n, v in inputs.items()}
        dtypes.update({n: a.dtype for n, a in cpu_inputs.items()})
        if for_capture and self._model.value_dependent_inputs:
            raise CaptureStateError(
                f"cannot capture: inputs {sorted(self._model.value_dependent_inputs)} decide tensor shapes by their values, "
                f"which a captured graph cannot follow; run this model with gpu_graph_id=-1"
            )
        plan = self._plan_for(shapes, dtypes, self._values_deciding_shapes(inputs, cpu_inputs))
        for name, info in plan.output_infos.items():
            value = outputs[name]
            if tuple(value.shape()) != info.shape or value.dtype != info.dtype:
                raise ShapeError(
                    f"output {name!r} is {info.dtype} of shape {list(info.shape)} for these inputs, but the bound value is "
                    f"{value.dtype} of shape {value.shape()}; bind a value of that dtype and shape"
                )
        if for_capture and not plan.capturable:
            raise CaptureStateError(
                f"cannot capture: nodes {plan.cpu_nodes} run on the CPU (see session.get_node_placement()), and a "
                f"captured graph can only replay device work; use a model whose nodes all run on WebGPU"
            )
        return plan

    def run_with_iobinding(self, iobinding: AnyBinding, run_options: RunOptions | None = None) -> None:
        """Run on a binding: an ordinary run (``gpu_graph_id=-1``), or capture/replay graph N."""
        self._check_open("run")
        binding = self._check_binding(iobinding)
        graph_id = self._graph_id_of(run_options)
        if graph_id is None:
            graph_id = 0 if self.graph_capture else -1
        if graph_id == -1:
            plan = self._bound_plan(binding, for_capture=False)
            with self._lock:
                self._run_bound(plan, binding.inputs(), binding.cpu_inputs(), binding.outputs())
            return
        self._graphs.capture_or_replay(self, binding, graph_id)

    def capture(self, binding: AnyBinding, graph_id: int = 0) -> CapturedGraph:
        """Run the model once on ``binding`` and record it as graph ``graph_id``.

        Returns the :class:`CapturedGraph`.  The binding (and the IOBinding a
        FrozenIOBinding came from) stays immutable until the graph is released.
        """
        self._check_open("capture")
        frozen = self._check_binding(binding)
        check_graph_id(self, graph_id)
        with self._graphs.capture_lock:
            return self._graphs.capture_locked(self, frozen, graph_id)

    def captured_graph(self, graph_id: int) -> CapturedGraph:
        """The captured graph ``graph_id`` (``CaptureStateError`` if none)."""
        graph = self._graphs.get(graph_id)
        if graph is None:
            raise CaptureStateError(f"session {self.session_id} has no captured graph {graph_id}; capture it first")
        return graph

    def release_captured_graph(self, graph_id: int) -> IOBinding | None:
        """Release graph ``graph_id``; returns the binding it was captured from (mutable again)."""
        return self.captured_graph(graph_id).release()

    @property
    def captured_graph_ids(self) -> list[int]:
        return self._graphs.ids()

    def _forget_graph(self, graph: CapturedGraph) -> None:
        """Called by :meth:`CapturedGraph.release`: drop the graph from this session's registry."""
        self._graphs.forget(graph)

    def _verify_replay(self, graph: CapturedGraph) -> None:
        """Called by ``replay()`` in verify mode: see :func:`ortgpu._capture.verify_replay`."""
        verify_replay(self, graph)


def _free_native(release: Callable[[], object]) -> None:
    """Run ``release``; on a closed or lost device there is nothing left to free."""
    try:
        release()
    except (DeviceLostError, ReleasedValueError):
        pass


def _write(device: BackendDevice, buffer: DeviceBuffer, array: np.ndarray) -> None:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if data.nbytes % 4:
        data = np.concatenate([data, np.zeros(padded_size(data.nbytes) - data.nbytes, np.uint8)])
    device.write_buffer(buffer.handle, 0, data.data)


def _read(device: BackendDevice, buffer: DeviceBuffer, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    result = np.empty(shape, dtype)
    device.read_buffer_into(buffer.handle, 0, result.reshape(-1).view(np.uint8))
    return result
