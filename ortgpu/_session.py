"""InferenceSession: load an ONNX model, run it on a WebGPU device, capture and replay it.

Names follow onnxruntime's Python API, so porting is a change of import.  What is new is the safe capture
workflow: ``session.capture(binding, graph_id)`` returns a :class:`CapturedGraph` that owns a frozen snapshot of the
binding, pins its buffers and locks the binding until ``graph.release()``; ``run_with_iobinding(binding,
RunOptions(gpu_graph_id=N))`` does the same in onnxruntime's spelling; every value passed in is checked against its
provenance, and every value returned carries this session's.

Layout: this module holds the public API and delegates the work to the session's
:class:`~ortgpu._runner.SessionRunner` (plans, programs, buffers, runs, submission).  Arguments are checked and
converted in :mod:`ortgpu._run_arguments`; the Env and device chosen in :mod:`ortgpu._session_setup`; capture and
the graph registry live in :mod:`ortgpu._capture`; asynchronous runs in :mod:`ortgpu._async_runs`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import warnings
from typing import Any, Awaitable, Iterator, Mapping, Sequence, overload

import numpy.typing as npt
from onnx import ModelProto

from ortgpu_core import (
    ArgumentTypeError,
    CaptureStateError,
    Device,
    Env,
    InvalidArgumentError,
    OrtValue,
    ProvenanceError,
    SessionAllocator,
    WebGPU,
)
from ortgpu_core._binding import IOBinding
from ortgpu_core._dlpack import SupportsDLPack
from ortgpu_core._errors import NotCopyable
from ortgpu_core._graph import CapturedGraph

from ._adapter_runs import bound_run_graph_id, transient_run_inputs
from ._async_runs import RunAsyncCallback, _UserData, start_run_async
from ._capture import allocate_session_outputs, check_graph_id
from ._host_io import as_output
from ._host_values import is_optional_dtype, is_structured_dtype, optional_type_name
from ._ort_api import (
    CPU_PROVIDER,
    WEBGPU_PROVIDER,
    Fail,
    GraphOptimizationLevel,
    ModelMetadata,
    ProviderArg,
    SessionOptions,
    normalize_providers,
)
from ._profiling import DEFAULT_DETAIL_EVERY, ProfilingRecord, SessionProfiler, checked_detail_every
from ._run_arguments import (
    check_binding,
    check_feeds,
    host_feeds,
    node_placement,
    output_order,
)
from ._run_options import NodeArg, NodePlacement, RunOptions, _node_arg
from ._runner import AnyBinding, AnyValue, SessionRunner
from ._session_setup import config_from_model, place_session, save_loaded_model
from .loader._model import load_model

__all__ = ["InferenceSession"]

_session_ids = itertools.count(1)


class InferenceSession(NotCopyable):
    """Runs one ONNX model on one WebGPU device.

    A session that is dropped without :meth:`close` is closed when it is garbage-collected (its graphs
    released, their pins and binding locks dropped, its buffers freed).  Sessions cannot be copied or
    pickled (``UnsafeAccessError``): create another from the same model.

    Parameters
    ----------
    path_or_bytes:
        An ``.onnx`` path, the serialized model, or an ``onnx.ModelProto`` (never changed; it may pass 2 GB).
    sess_options:
        onnxruntime's :class:`~ortgpu.SessionOptions` (what each field does: its docstring; fields with no effect in
        ortgpu are accepted and kept).
    providers, provider_options:
        onnxruntime's provider list: ``"WebGpuExecutionProvider"`` (options: ``deviceId``, an index into
        ``env.devices``) and ``"CPUExecutionProvider"``; ``["CPUExecutionProvider"]`` alone runs the whole model on
        the host through the numpy twins of the kernels (slow).  As in onnxruntime the CPU takes the nodes the device
        cannot run whether listed or not (``allow_cpu_fallback=False`` or the config entry
        ``session.disable_cpu_ep_fallback=1`` forbid it).  Unknown names are refused with the available ones.
        The WebGPU provider's option ``enableGraphCapture="1"`` is ``graph_capture=True``.
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
    fuse:
        Apply the planner's graph rewrites (BatchNormalization folded into Conv, epilogue fusion, Transpose
        folding); False plans node by node.
    max_fold_bytes, max_nodes:
        Limits for hostile or huge models: bytes of constants folding may create per model, and nodes per
        model (default: ``$ORTGPU_MAX_FOLD_BYTES`` / ``$ORTGPU_MAX_NODES`` if set, else 256 MiB and 100000);
        exceeding one is a ``ModelError`` that names it.
    profile:
        Start profiling at once (as onnxruntime's ``SessionOptions.enable_profiling``): see :meth:`start_profiling`
        and :meth:`end_profiling`.
    profile_file_prefix:
        The trace file's name prefix (default ``"ortgpu_profile"``, in the working directory): the file is
        ``<prefix>_<session id>_<timestamp>.json``.
    profile_detail_every:
        While profiling, the first run or replay and then every Nth are timed per step (GPU timestamps where the
        device has them); the others are timed whole (one span each) or, where runs are timed on the host, run as
        unprofiled ones and only marked in the trace.  Default 50 (per-step timestamps cost the GPU about half a
        replay, so timing every one would; see :mod:`ortgpu._profiling`); 1 times every run and replay.
    """

    _copy_hint = "Create another InferenceSession from the same model."

    def __init__(
        self,
        path_or_bytes: str | bytes | os.PathLike[str] | ModelProto,
        sess_options: SessionOptions | None = None,
        providers: Sequence[ProviderArg] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
        *,
        env: Env | None = None,
        device: Device | None = None,
        graph_capture: bool = False,
        allow_cpu_fallback: bool = True,
        verify_replays: bool = False,
        fuse: bool = True,
        max_fold_bytes: int | None = None,
        max_nodes: int | None = None,
        profile: bool = False,
        profile_file_prefix: str | os.PathLike[str] | None = None,
        profile_detail_every: int = DEFAULT_DETAIL_EVERY,
    ) -> None:
        self.session_id: int = next(_session_ids)
        self.profile_detail_every: int = checked_detail_every(profile_detail_every)
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise ArgumentTypeError(f"sess_options must be ortgpu.SessionOptions, got {type(sess_options).__name__}")
        self._sess_options: SessionOptions = sess_options if sess_options is not None else SessionOptions()
        options = self._sess_options
        if os.environ.get("ORT_LOAD_CONFIG_FROM_MODEL") == "1":
            config_from_model(path_or_bytes, options)
        if profile_file_prefix is None and options.enable_profiling:
            profile_file_prefix = options.profile_file_prefix
        self.profile_file_prefix: str = (
            os.fspath(profile_file_prefix) if profile_file_prefix is not None else "ortgpu_profile"
        )
        self._model_source = path_or_bytes
        self._user_env = env
        self._user_device = device
        self._settings = {
            "graph_capture": bool(graph_capture),
            "allow_cpu_fallback": bool(allow_cpu_fallback) and not options.disables_cpu_fallback,
            "verify_replays": bool(verify_replays),
            "fuse": bool(fuse) and options.graph_optimization_level != GraphOptimizationLevel.ORT_DISABLE_ALL,
            "max_fold_bytes": max_fold_bytes,
            "max_nodes": max_nodes,
        }
        self._build(providers, provider_options, profile or options.enable_profiling)

    def _build(
        self,
        providers: Sequence[ProviderArg] | None,
        provider_options: Sequence[Mapping[str, Any]] | None,
        profile: bool,
    ) -> None:
        """Choose the Env and device from the providers, load the model with the session options, plan."""
        placement = place_session(providers, provider_options, self._user_env, self._user_device)
        names, options = placement.provider_names, placement.provider_options
        if placement.graph_capture:
            self._settings["graph_capture"] = True  # onnxruntime's WebGPU provider option enableGraphCapture
        allow_cpu = bool(self._settings["allow_cpu_fallback"])
        self.env: Env = placement.env
        self.device: Device = placement.device
        self._providers = names
        self._provider_options = options
        opts = self._sess_options
        model = load_model(
            self._model_source,
            max_fold_bytes=self._settings["max_fold_bytes"],
            max_nodes=self._settings["max_nodes"],
            initializer_overrides=opts.initializer_arrays(),
            free_dimension_overrides=opts.free_dimensions(),
            free_denotation_overrides=opts.free_denotations(),
        )
        self._runner = SessionRunner(
            self.session_id,
            self.env,
            self.device,
            model,
            graph_capture=bool(self._settings["graph_capture"]),
            allow_cpu_fallback=allow_cpu,
            verify_replays=bool(self._settings["verify_replays"]),
            fuse=bool(self._settings["fuse"]),
        )
        try:
            model = self._runner.model
            static = all(isinstance(d, int) for i in model.inputs for d in i.shape)
            if static and not self.allow_cpu_fallback and not any(is_structured_dtype(i.dtype) for i in model.inputs):
                # Static model: report forbidden CPU placement now, not at the first run.
                self._runner.plan_for(
                    {i.name: tuple(int(d) for d in i.shape if isinstance(d, int)) for i in model.inputs},
                    {i.name: i.dtype for i in model.inputs},
                )
            self.env._register_session(self)  # Env.close() closes the session (graphs first) before its devices
            if opts.optimized_model_filepath:
                save_loaded_model(self._model_source, opts)
            if profile:
                self.start_profiling()
        except BaseException:
            self.close()
            raise

    # -- settings and metadata -----------------------------------------------------------
    @property
    def graph_capture(self) -> bool:
        """Whether the session was made with ``graph_capture=True`` (or onnxruntime's ``enableGraphCapture``), so
        that ``capture()`` and ``run_with_iobinding(..., RunOptions(gpu_graph_id=N))`` record graphs."""
        return self._runner.graph_capture

    @property
    def allow_cpu_fallback(self) -> bool:
        """Whether nodes the device cannot run may run on the host (numpy twins); when False such a model is
        refused at load with ``UnsupportedOpError``."""
        return self._runner.allow_cpu_fallback

    @property
    def verify_replays(self) -> bool:
        """Every ``replay()`` checks its outputs against an uncaptured run (slow; for tests).  Settable."""
        return self._runner.verify_replays

    @verify_replays.setter
    def verify_replays(self, value: bool) -> None:
        self._runner.verify_replays = bool(value)

    @property
    def allocator(self) -> SessionAllocator:
        """This session's allocator: its values may be bound only by this session, and are released when it closes."""
        return self._runner.allocator

    @property
    def input_names(self) -> list[str]:
        """The model's graph inputs (initializers excluded), in the model's order."""
        return self._runner.input_names

    @property
    def output_names(self) -> list[str]:
        """The model's graph outputs, in the model's order (the order ``run(None, ...)`` returns them in)."""
        return self._runner.output_names

    @property
    def value_deciding_inputs(self) -> list[str]:
        """Inputs whose *values* (not only shapes) decide the plan: an ``If`` condition, a ``Loop`` trip count, a
        ``Reshape`` target fed by a graph input.  Each value gets its own plan; a graph captured for one value
        refuses to replay when it changed.  Bound with ``binding.bind_cpu_input(name, array)`` (where no device
        work reads them), a captured graph checks them without a device read."""
        return sorted(self._runner.model.value_dependent_inputs)

    def get_inputs(self) -> list[NodeArg]:
        """Describe the model's inputs, as onnxruntime does.

        Returns
        -------
        list of NodeArg
            One per graph input, in the model's order: ``name``, ``type`` (e.g. ``"tensor(float)"``) and ``shape``
            (ints, and strings for symbolic dimensions).
        """
        return [_described(info) for info in self._runner.model.inputs]

    def get_outputs(self) -> list[NodeArg]:
        """Describe the model's outputs, as onnxruntime does.

        Returns
        -------
        list of NodeArg
            One per graph output, in the model's order (``name``, ``type``, ``shape``).
        """
        return [_described(info) for info in self._runner.model.outputs]

    def get_providers(self) -> list[str]:
        """The providers this session uses, as onnxruntime names them (the CPU one where nodes may run there)."""
        if WEBGPU_PROVIDER not in self._providers:
            return [CPU_PROVIDER]
        return [WEBGPU_PROVIDER, CPU_PROVIDER] if self.allow_cpu_fallback else [WEBGPU_PROVIDER]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Each provider's options (strings, as onnxruntime gives them)."""
        out = {name: dict(opts) for name, opts in zip(self._providers, self._provider_options)}
        if WEBGPU_PROVIDER in out:
            out[WEBGPU_PROVIDER].setdefault("deviceId", str(self.device.index))
        return {name: out.get(name, {}) for name in self.get_providers()}

    def set_providers(
        self,
        providers: Sequence[ProviderArg] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Re-create the session on other providers (onnxruntime's semantics): captured graphs, bindings and
        session-owned values of the previous session are released."""
        try:  # refuse bad names before closing anything
            normalize_providers(providers, provider_options, strict=True)
        except InvalidArgumentError as error:
            raise Fail(f"Unknown Provider Type: {error}") from None
        profiling = self.profiling_active
        self.close()
        self._build(providers, provider_options, profiling)

    def get_session_options(self) -> SessionOptions:
        """The :class:`SessionOptions` the session was made with (a default one when none was given).

        Returns
        -------
        SessionOptions
            The same object on every call; changing it after the session was made has no effect on the session.
        """
        return self._sess_options

    def get_modelmeta(self) -> ModelMetadata:
        """The model's metadata, as onnxruntime reports it.

        Returns
        -------
        ModelMetadata
            ``producer_name``, ``graph_name``, ``domain``, ``description``, ``version`` and the model's
            ``custom_metadata_map``.
        """
        return ModelMetadata(**self._runner.model.metadata)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers a feed may override (onnxruntime: those also listed as graph inputs, IR >= 4).  ortgpu
        treats every initializer as a constant, so none: feed it as a graph input or use
        ``SessionOptions.add_initializer``."""
        return []

    def run_with_ortvaluevector(
        self,
        run_options: RunOptions | None,
        feed_names: Sequence[str],
        feeds: Sequence[AnyValue],
        fetch_names: Sequence[str],
        fetches: list[Any],
        fetch_devices: Sequence[Any] | None = None,
    ) -> None:
        """onnxruntime's vector spelling of :meth:`run_with_ort_values`: ``fetches`` (a list) is filled with the
        outputs named ``fetch_names``, in order."""
        if len(feed_names) != len(feeds):
            raise InvalidArgumentError(f"{len(feed_names)} feed names but {len(feeds)} feeds")
        results = self.run_with_ort_values(list(fetch_names), dict(zip(feed_names, feeds)), run_options)
        fetches[:] = results

    def get_node_placement(
        self,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        input_values: Mapping[str, npt.NDArray[Any] | list[npt.NDArray[Any]]] | None = None,
    ) -> list[NodePlacement]:
        """Where each node runs for ``input_shapes`` (default: the model's static shapes).

        Models whose shapes depend on input values (a Reshape's shape or Slice bounds fed as inputs)
        are planned for ``input_values`` too (name -> array; required for those inputs).  A sequence input is
        planned for its element shapes: give its value (a list of arrays) in ``input_values``; an optional input
        for its state: give its value (None for an empty one) there too.
        """
        return node_placement(self._runner, input_shapes, input_values)

    # -- lifetime --------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the session failed to finish loading); a closed session refuses work."""
        runner = getattr(self, "_runner", None)
        return runner is None or runner.closed

    def close(self) -> None:
        """Release captured graphs, then programs and buffers.  Idempotent; always completes.

        Waits for a capture in flight on another thread, so no graph can be registered on a closed session.
        """
        runner = getattr(self, "_runner", None)
        if runner is not None:
            runner.close()

    def __del__(self) -> None:
        # onnxruntime-style code never calls close(): free what the session owns when it is collected.  Safe here:
        # a collected session's own locks, bindings and graphs are unreachable, so no other thread holds them.
        if self.closed:
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
        state = " closed" if self.closed else ""
        return f"<InferenceSession {self.session_id} on {self.device!r} graph_capture={self.graph_capture}{state}>"

    # -- values ----------------------------------------------------------------------
    def io_binding(self) -> IOBinding:
        """A new, empty :class:`IOBinding` for this session."""
        self._runner.check_open("create a binding")
        return IOBinding._create(self, self._runner)

    def create_ortvalue_from_shape_and_type(
        self,
        shape: Sequence[int],
        element_type: npt.DTypeLike,
        device_type: str = "webgpu",
        device_id: int | None = None,
    ) -> OrtValue[WebGPU]:
        """A zero-filled session-owned device value (same as ``session.allocator.empty``)."""
        self._runner.check_open("allocate a value")
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
        return self._runner.allocator.empty(tuple(shape), element_type)

    # -- ordinary runs ---------------------------------------------------------------------
    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.NDArray[Any] | SupportsDLPack | list[Any] | None],
        run_options: RunOptions | None = None,
    ) -> list[Any]:
        """Run the model on host arrays; returns host arrays in ``output_names`` order (all outputs if None).
        Sequence inputs and outputs (``seq(tensor(...))``) are lists of arrays; optional ones (``optional(...)``)
        are None when empty, else their element (an array, or a list of arrays).  A feed may also be any DLPack
        tensor (``__dlpack__``): a CPU one is read in place, a device one (CUDA...) through a host copy its producer
        makes (see Transfers in the README)."""
        self._runner.check_open("run")
        runner, input_feed = transient_run_inputs(self, run_options, input_feed, "run()", host=True)
        check_feeds(runner, input_feed)
        order = output_order(runner, output_names)
        results = runner.run_arrays(host_feeds(runner, input_feed), order)
        # Sequence outputs come back as lists of arrays, optional ones as None or their element (copies: the run's
        # values are not shared).
        return [as_output(name, value) for name, value in zip(order, results)]

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, AnyValue],
        run_options: RunOptions | None = None,
    ) -> list[OrtValue[WebGPU]]:
        """Run on OrtValues; returns new session-owned device values (with this session's provenance)."""
        self._runner.check_open("run")
        method = "run_with_ort_values()"
        runner, feeds = transient_run_inputs(self, run_options, input_dict_ort_values, method, host=False)
        check_feeds(runner, feeds)
        order = output_order(runner, output_names)
        for name, value in feeds.items():
            runner.check_value(value, f"input {name!r}")
            runner.check_info(name, runner.input_infos[name], value.dtype, tuple(value.shape()), "input")
        return runner.run_values(feeds, order)

    # -- asynchronous runs -------------------------------------------------------------------
    @overload
    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.NDArray[Any] | SupportsDLPack | list[Any] | None],
        callback: None = None,
        user_data: object = None,
        run_options: RunOptions | None = None,
    ) -> Awaitable[list[Any]]: ...

    @overload
    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.NDArray[Any] | SupportsDLPack | list[Any] | None],
        callback: RunAsyncCallback[_UserData],
        user_data: _UserData = ...,
        run_options: RunOptions | None = None,
    ) -> None: ...

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.NDArray[Any] | SupportsDLPack | list[Any] | None],
        callback: RunAsyncCallback[Any] | None = None,
        user_data: Any = None,
        run_options: RunOptions | None = None,
    ) -> Awaitable[list[Any]] | None:
        """:meth:`run` in a worker thread, so the caller never blocks while the device works.

        Two spellings:

        * ``results = await session.run_async(output_names, feeds)`` (asyncio; call it with a running event
          loop): the run starts at the call and the await returns what :meth:`run` returns; the event loop is
          never blocked meanwhile.  An error is raised by the await, to its caller only.
        * onnxruntime's ``session.run_async(output_names, feeds, callback, user_data)`` returns None at once;
          ``callback(results, user_data, error)`` is called from a worker thread when the run ends: ``error`` is
          ``""`` on success (as onnxruntime's empty status string), else the typed exception (then ``results`` is
          None; ``str(error)`` is the message, where onnxruntime passes a status string): ``if err:`` works for both.

        The feeds are read by the worker: do not modify them until the run completes.  Runs of one session are
        serialized (each waits for the previous); runs of different sessions proceed independently.
        """

        def run() -> list[Any]:
            return self.run(output_names, input_feed, run_options)

        return start_run_async(run, callback, user_data)

    # -- profiling ------------------------------------------------------------------------------
    @property
    def profiling_active(self) -> bool:
        """Whether this session is recording a profile now."""
        return self._runner.profiler is not None

    def start_profiling(self, detail_every: int | None = None) -> None:
        """Record runs and replays into this session's own profiling record (other sessions, profiled or not, are
        unaffected) until :meth:`end_profiling`: the first and then every ``detail_every``-th (default: the
        session's ``profile_detail_every``) timed per step, the others marked.

        **GPU timestamps** where the device has them: a timed run or replay is one submission with a timestamp
        before each planned step, read back later (nothing waits for it).  **Host timing** otherwise (and for plans
        with CPU steps): each planned step is submitted alone and waited for, its duration submit-to-completion on
        the host clock.  The trace says which (``otherData.timing``); :mod:`ortgpu._profiling` has the details.
        Starting again while profiling is a no-op.
        """
        every = self.profile_detail_every if detail_every is None else checked_detail_every(detail_every)
        runner = self._runner
        runner.check_open("start profiling")
        with runner.lock:
            if runner.profiler is None:
                runner.profiler = SessionProfiler(
                    self.session_id,
                    self.profile_file_prefix,
                    {
                        "device": self.device.name,
                        "backend": self.env.backend_name,
                        "execution_mode": self.env.execution_mode,
                    },
                    every,
                )

    def end_profiling(self) -> str:
        """Stop profiling and write this session's record as a Chrome trace JSON file (``traceEvents`` of
        ``ph: "X"`` events: one per run (cat ``"run"``) and replay (cat ``"replay"``) and, nested in it, one per
        planned step, named by its node, cat its op type; ``ts``/``dur`` in microseconds; ``pid`` is the session id,
        ``tid`` the calling thread), which Perfetto and ``chrome://tracing`` open.  Returns the file's path, or
        ``""`` when profiling was not on (as onnxruntime does)."""
        runner = self._runner
        with runner.lock:
            profiler, runner.profiler = runner.profiler, None
        if profiler is None:
            return ""
        # A replay in flight on another thread may still add its event: write after taking the record out, so
        # no later run adds to it, and let the file hold what was recorded until now.  The GPU step timers give
        # back their query sets and timed lists (a later record makes them again).
        return profiler.finish()

    @contextlib.contextmanager
    def profiling(self) -> Iterator[ProfilingRecord]:
        """``with session.profiling() as record: ...``: :meth:`start_profiling`, then :meth:`end_profiling` when
        the block ends (also on an error); ``record.path`` is the trace file afterwards."""
        record = ProfilingRecord()
        self.start_profiling()
        try:
            yield record
        finally:
            record.path = self.end_profiling() or None

    def get_profiling_start_time_ns(self) -> int:
        """When the current profiling record started (``time.time_ns()``), 0 when not profiling."""
        profiler = self._runner.profiler
        return 0 if profiler is None else profiler.start_wall_ns

    # -- bindings, capture and replay ----------------------------------------------------------
    def run_with_iobinding(self, iobinding: AnyBinding, run_options: RunOptions | None = None) -> None:
        """Run on a binding: an ordinary run (``gpu_graph_id=-1``), or capture/replay graph N."""
        runner = self._runner
        runner.check_open("run")
        binding = check_binding(self, self.session_id, iobinding)
        graph_id = bound_run_graph_id(run_options)
        if graph_id is None:
            graph_id = 0 if self.graph_capture else -1
        if graph_id == -1:
            plan = runner.bound_plan(binding, for_capture=False)
            allocated = allocate_session_outputs(runner.allocator, plan, binding.session_outputs(), on_device=False)
            with runner.lock:
                runner.run_bound(plan, binding.inputs(), binding.cpu_inputs(), {**binding.outputs(), **allocated})
            binding._set_session_results(allocated)  # what get_outputs() returns for the outputs bound by name
            return
        runner.graphs.capture_or_replay(runner, self, binding, graph_id)

    def capture(self, binding: AnyBinding, graph_id: int = 0) -> CapturedGraph:
        """Run the model once on ``binding`` and record it as graph ``graph_id``.

        Returns the :class:`CapturedGraph`.  The binding (and the IOBinding a
        FrozenIOBinding came from) stays immutable until the graph is released.
        """
        runner = self._runner
        runner.check_open("capture")
        frozen = check_binding(self, self.session_id, binding)
        check_graph_id(runner, graph_id)
        with runner.graphs.capture_lock:
            return runner.graphs.capture_locked(runner, self, frozen, graph_id)

    def captured_graph(self, graph_id: int) -> CapturedGraph:
        """The captured graph ``graph_id`` (``CaptureStateError`` if none)."""
        graph = self._runner.graphs.get(graph_id)
        if graph is None:
            raise CaptureStateError(f"session {self.session_id} has no captured graph {graph_id}; capture it first")
        return graph

    def release_captured_graph(self, graph_id: int) -> IOBinding | None:
        """Release graph ``graph_id``; returns the binding it was captured from (mutable again)."""
        return self.captured_graph(graph_id).release()

    @property
    def captured_graph_ids(self) -> list[int]:
        """The ids of the graphs captured and not yet released, in ascending order."""
        return self._runner.graphs.ids()


def _described(info: Any) -> NodeArg:
    """The :class:`NodeArg` of a model input or output, optionals named as onnxruntime names them."""
    arg = _node_arg(info)
    if is_optional_dtype(info.dtype):
        return NodeArg(arg.name, arg.shape, optional_type_name(info.dtype), arg.dtype)
    return arg
