"""One replica's model: :class:`ModelServer` answers batches of requests from captured graphs, one per batch size.

Ray-free (the deployment in :mod:`ortgpu.serve._deployment` wraps it), so it runs and is tested anywhere.  At start-up
it opens its own Env, loads the model, and for each batch size of ``buckets`` allocates fixed device inputs and
outputs, runs once, and captures a graph.  A batch of requests is concatenated along the first axis (every input's
first dimension is the batch), padded with zeros to the smallest bucket that holds it (batches larger than the
largest bucket go in several), written into that bucket's inputs, replayed, read back and split into the requests'
rows.  The padding rows are computed and dropped: a model whose rows are independent (the batch dimension is only a
batch) answers each request as if it came alone.

Failure: a replay that raises (the device lost, a validation error) marks the server unhealthy for good; that batch's
requests and every later one get :class:`ReplicaFailedError` (never a result from buffers the failed work may have
left half-written), and :meth:`check_health` raises, so that Serve replaces the replica.  A model that cannot be
captured serves uncaptured runs and says why in :meth:`status`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from ortgpu_core import Env, InvalidArgumentError, ModelError, OrtGpuError, UnsafeAccessError

from .._run_options import RunOptions
from .._session import InferenceSession

__all__ = [
    "ModelServer",
    "BucketedServer",
    "ReplicaFailedError",
    "DEFAULT_BUCKETS",
    "input_rows",
    "validate_request",
]

#: Batch sizes captured by default.
DEFAULT_BUCKETS = (1, 2, 4, 8)
_ONNX_DTYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}  # fmt: skip


class ReplicaFailedError(OrtGpuError, RuntimeError):
    """The replica's device work failed (device lost, validation error): this request got no result, and the
    replica reports unhealthy until Serve replaces it.  Send the request again."""


class _Bucket:
    """One batch size's device inputs and outputs, its binding and (when captured) its graph."""

    def __init__(self, size: int, inputs: dict[str, Any], outputs: dict[str, Any], binding: Any) -> None:
        self.size = size
        self.inputs = inputs
        self.outputs = outputs
        self.binding = binding
        self.graph: Any = None


def input_rows(
    inputs: Sequence[Any], row_shapes: Mapping[str, Sequence[int]]
) -> tuple[dict[str, tuple[int, ...]], dict[str, np.dtype[Any]]]:
    """Per input (onnxruntime-style ``NodeArg``s), its shape without the batch dimension and its dtype; symbolic
    row dimensions must be given in ``row_shapes``."""
    rows: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype[Any]] = {}
    unknown = set(row_shapes) - {i.name for i in inputs}
    if unknown:
        raise InvalidArgumentError(f"row_shapes names {sorted(unknown)}, which the model has no inputs called")
    for info in inputs:
        if info.type not in _ONNX_DTYPES:
            raise ModelError(f"ModelServer: input {info.name!r} of type {info.type} is not a plain tensor")
        dtypes[info.name] = np.dtype(_ONNX_DTYPES[info.type])
        shape = list(info.shape)
        if not shape:
            raise ModelError(f"ModelServer: input {info.name!r} is a scalar; every input needs a batch dimension")
        given = row_shapes.get(info.name)
        row = list(given) if given is not None else shape[1:]
        if len(row) != len(shape) - 1:
            raise InvalidArgumentError(
                f"row_shapes[{info.name!r}] = {row} must have {len(shape) - 1} dimensions (the model's shape "
                "without the batch)"
            )
        fixed = [d for d in row if isinstance(d, int) and not isinstance(d, bool) and d >= 0]
        if len(fixed) != len(row):
            raise ModelError(
                f"ModelServer: input {info.name!r} has shape {shape}; give its row shape (without the batch) in "
                "row_shapes, since each bucket is captured for fixed shapes"
            )
        rows[info.name] = tuple(fixed)
    return rows, dtypes


def validate_request(
    request: Mapping[str, Any], rows: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, np.dtype[Any]]
) -> dict[str, np.ndarray]:
    """``request``'s inputs as arrays of ``dtypes`` (same-kind casts) shaped ``[n, *rows[name]]``, one ``n`` >= 1
    for all; raises InvalidArgumentError saying what is wrong."""
    if not isinstance(request, Mapping):
        raise InvalidArgumentError(f"a request is a mapping of input name to array, not {type(request).__name__}")
    missing, extra = set(rows) - set(request), set(request) - set(rows)
    if missing or extra:
        raise InvalidArgumentError(
            f"a request needs exactly the inputs {sorted(rows)}; missing {sorted(missing)}, unknown {sorted(extra)}"
        )
    arrays: dict[str, np.ndarray] = {}
    count = None
    for name, value in request.items():
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as error:
            raise InvalidArgumentError(f"input {name!r}: {error}") from error
        want = dtypes[name]
        if array.dtype != want:
            if not np.can_cast(array.dtype, want, casting="same_kind"):
                raise InvalidArgumentError(f"input {name!r} of dtype {array.dtype}; the model takes {want}")
            if array.dtype.kind in "iu" and want.kind in "iu" and array.size:
                limits = np.iinfo(want)
                if array.min() < limits.min or array.max() > limits.max:
                    raise InvalidArgumentError(f"input {name!r} holds values outside {want}'s range")
            array = array.astype(want)
        if array.ndim != len(rows[name]) + 1 or array.shape[1:] != rows[name] or array.shape[0] < 1:
            raise InvalidArgumentError(
                f"input {name!r} has shape {list(array.shape)}; it must be [rows >= 1, {', '.join(map(str, rows[name]))}]"
            )
        if count is not None and array.shape[0] != count:
            raise InvalidArgumentError("every input of a request must have the same number of rows")
        count = array.shape[0]
        arrays[name] = array
    return arrays


def answer_each(
    infer: Callable[[Sequence[Mapping[str, Any]]], list[dict[str, np.ndarray]]],
    requests: Sequence[Mapping[str, Any]],
) -> list[dict[str, np.ndarray] | InvalidArgumentError]:
    """``infer(requests)``; where it raises InvalidArgumentError, each request alone, its error in its place."""
    try:
        return list(infer(requests))
    except InvalidArgumentError as error:
        if len(requests) == 1:
            return [error]
    answers: list[dict[str, np.ndarray] | InvalidArgumentError] = []
    for request in requests:
        try:
            answers.extend(infer([request]))
        except InvalidArgumentError as error:
            answers.append(error)
    return answers


class BucketedServer:
    """What both runtimes' servers share: the request checks, a batch of requests concatenated, split into chunks of
    at most the largest bucket, each padded to the smallest bucket that holds it and run by :meth:`_run`, then the
    rows handed back; the counts behind ``status()``.  One batch runs at a time (the buckets' buffers are shared
    state).  Not copyable or picklable: a server owns its session (and, for ortgpu, its Env and device buffers)."""

    buckets: tuple[int, ...]
    output_names: list[str]
    input_dtypes: dict[str, np.dtype[Any]]
    _rows: dict[str, tuple[int, ...]]

    def _start(self, buckets: Sequence[int]) -> None:
        sizes = sorted({int(b) for b in buckets})
        if not sizes or sizes[0] < 1 or any(isinstance(b, bool) for b in buckets):
            raise InvalidArgumentError(f"buckets must be positive batch sizes, not {list(buckets)!r}")
        self.buckets = tuple(sizes)
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "rows": 0, "batches": 0, "padded_rows": 0}
        self._run_ms: list[float] = []

    def __copy__(self) -> Any:
        raise UnsafeAccessError(f"a {type(self).__name__} cannot be copied: it owns its session; make another")

    def __deepcopy__(self, memo: object) -> Any:
        return self.__copy__()

    def __reduce__(self) -> Any:
        raise UnsafeAccessError(f"a {type(self).__name__} cannot be pickled: make one in each process")

    def bucket_for(self, rows: int) -> int:
        """The smallest bucket that holds ``rows`` (the largest where none does: the rows then take several)."""
        return next((b for b in self.buckets if b >= rows), self.buckets[-1])

    def validate(self, request: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The request's inputs as arrays of the model's dtypes and row shapes, ``[rows, *row]`` each with one
        ``rows`` >= 1; raises InvalidArgumentError saying what is wrong (nothing is run)."""
        return validate_request(request, self._rows, self.input_dtypes)

    def infer(self, requests: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
        """Answer requests in order: each gets its own rows of every output.  Raises InvalidArgumentError for
        invalid requests (or data the run finds invalid), ReplicaFailedError where the device work fails."""
        with self._lock:
            self._check_usable()
            arrays = [self.validate(r) for r in requests]
            counts = [next(iter(a.values())).shape[0] for a in arrays]
            merged = {name: np.concatenate([a[name] for a in arrays]) for name in self._rows}
            total = sum(counts)
            pieces: dict[str, list[np.ndarray]] = {name: [] for name in self.output_names}
            for start in range(0, total, self.buckets[-1]):
                take = min(total - start, self.buckets[-1])
                size = self.bucket_for(take)
                feeds = {name: _padded(array[start : start + take], size) for name, array in merged.items()}
                began = time.perf_counter()
                results = self._run(feeds, size)
                self._run_ms.append((time.perf_counter() - began) * 1e3)
                del self._run_ms[:-1024]
                for name in self.output_names:
                    pieces[name].append(np.asarray(results[name])[:take])
                self._counts["batches"] += 1
                self._counts["padded_rows"] += size - take
            outputs = {name: np.concatenate(parts) for name, parts in pieces.items()}
            self._counts["requests"] += len(requests)
            self._counts["rows"] += total
            bounds = np.cumsum([0, *counts])
            return [{name: outputs[name][a:b] for name in self.output_names} for a, b in zip(bounds, bounds[1:])]

    def answer(self, requests: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray] | InvalidArgumentError]:
        """:meth:`infer`, but a request whose data is invalid (an index out of range, found by the run) gets its
        InvalidArgumentError in its place and the others their answers: the batch is answered request by request
        once it fails so.  ReplicaFailedError still fails them all."""
        return answer_each(self.infer, requests)

    def _usage(self) -> dict[str, Any]:
        """The counts of ``status()``: requests, rows, batches (runs of a bucket), padded rows, batch fill (rows /
        (rows + padded rows)), and a bucket's run (writes, run or replay, reads) in ms, p50 of the last 1024."""
        fill_rows = self._counts["rows"] + self._counts["padded_rows"]
        return {
            **self._counts,
            "batch_fill": self._counts["rows"] / fill_rows if fill_rows else None,
            "replay_ms_p50": float(np.median(self._run_ms)) if self._run_ms else None,
        }

    def _check_usable(self) -> None:
        """Raise where no batch may run any more."""

    def _run(self, feeds: dict[str, np.ndarray], size: int) -> Mapping[str, Any]:
        """Run bucket ``size`` on ``feeds`` (padded to it); its outputs by name."""
        raise NotImplementedError


def _padded(array: np.ndarray, size: int) -> np.ndarray:
    if array.shape[0] == size:
        return array
    padded = np.zeros((size, *array.shape[1:]), array.dtype)
    padded[: array.shape[0]] = array
    return padded


class ModelServer(BucketedServer):
    """Serves one model on one device from captured graphs, one per batch size in ``buckets``.

    Parameters
    ----------
    model
        A path to an ``.onnx`` file or its bytes.  Every input and output has the batch as its first dimension.
    buckets
        The batch sizes captured at start-up (sorted, deduplicated); a request batch goes to the smallest that holds
        it.
    backend
        The Env's backend: ``"wgpu"``, ``"fake"`` (for tests: see :meth:`inject_fault`), or a callable that makes
        one (``functools.partial(FakeBackend, devices=[...])`` declares several fake adapters).
    device
        Which of the Env's GPUs to run on, as an index taken modulo their count (software adapters are left out
        where there is a GPU), so that replica ranks spread over the GPUs; None: the Env's default device.
    capture
        False serves uncaptured runs (for comparison); a model that cannot be captured serves uncaptured anyway.
    row_shapes
        Per input, its shape without the batch dimension, where the model leaves it symbolic.

    Thread-safe: one batch runs at a time (the buckets' buffers are shared state).  Not copyable or picklable
    (``UnsafeAccessError``); dropped without :meth:`close`, its session and Env are cleaned up with them.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes,
        *,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        backend: Literal["wgpu", "fake"] | Callable[[], Any] = "wgpu",
        capture: bool = True,
        row_shapes: Mapping[str, Sequence[int]] | None = None,
        device: int | None = None,
    ) -> None:
        self._start(buckets)
        self._failure: str | None = None
        self.capture_error: str | None = None
        if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
            raise InvalidArgumentError(f"device must be a non-negative adapter index or None, not {device!r}")
        self.env = Env(backend=backend() if callable(backend) else backend)
        self._buckets: dict[int, _Bucket] = {}
        try:
            adapters = self.env.devices
            if device is None:
                chosen = self.env.default_device
                #: The index of the adapter this server runs on, in ``env.devices``
                self.device_index = adapters.index(chosen) if chosen in adapters else 0
            else:  # spread over the GPUs (a software adapter, lavapipe, only where there is no other)
                gpus = [i for i, d in enumerate(adapters) if d.adapter_type != "CPU"] or list(range(len(adapters)))
                self.device_index = gpus[device % len(gpus)]
                chosen = adapters[self.device_index]
            self.session = InferenceSession(model, env=self.env, device=chosen, graph_capture=capture)
            self._rows, self.input_dtypes = input_rows(self.session.get_inputs(), row_shapes or {})
            self.output_names = list(self.session.output_names)
            for size in self.buckets:
                self._buckets[size] = self._prepare(size, capture)
        except BaseException:
            self.close()
            raise

    # -- start-up -------------------------------------------------------------------------------------------------

    def _prepare(self, size: int, capture: bool) -> _Bucket:
        zeros = {name: np.zeros((size, *row), self.input_dtypes[name]) for name, row in self._rows.items()}
        results = self.session.run(None, zeros)
        for name, result in zip(self.output_names, results):
            array = np.asarray(result)
            if array.ndim == 0 or array.shape[0] != size:
                raise ModelError(
                    f"ModelServer: output {name!r} has shape {list(array.shape)} for a batch of {size}; every output "
                    "needs the batch as its first dimension"
                )
        allocator = self.session.allocator
        inputs = {name: allocator.from_numpy(array) for name, array in zeros.items()}
        outputs = {
            name: allocator.empty(np.shape(r), np.asarray(r).dtype) for name, r in zip(self.output_names, results)
        }
        binding = self.session.io_binding()
        for name, value in inputs.items():
            binding.bind_input(name, value)
        for name, value in outputs.items():
            binding.bind_output(name, value)
        bucket = _Bucket(size, inputs, outputs, binding)
        if capture and self.capture_error is None:
            try:
                bucket.graph = self.session.capture(binding, graph_id=size)
            except OrtGpuError as error:  # not capturable (a CPU step, a value read back): serve uncaptured
                self.capture_error = f"{type(error).__name__}: {error}"
        return bucket

    # -- requests -------------------------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise ReplicaFailedError(f"this replica failed earlier ({self._failure}); it awaits replacement")

    def _run(self, feeds: dict[str, np.ndarray], size: int) -> Mapping[str, Any]:
        bucket = self._buckets[size]
        try:
            for name, array in feeds.items():
                bucket.inputs[name].update_inplace(np.ascontiguousarray(array))
            if bucket.graph is not None:  # reads the outputs in the replay's submission, and reports flagged data
                return dict(zip(self.output_names, bucket.graph.replay_and_read()))
            self.session.run_with_iobinding(bucket.binding, RunOptions(gpu_graph_id=-1))
            return {name: value.to_numpy() for name, value in bucket.outputs.items()}
        except InvalidArgumentError:
            raise  # invalid data in a request (an index out of range): that batch's answer, not the replica's failure
        except OrtGpuError as error:
            self._failure = f"{type(error).__name__}: {error}"
            raise ReplicaFailedError(f"the device work of this batch failed ({self._failure}); no result") from error

    # -- health, status, faults -----------------------------------------------------------------------------------

    def check_health(self) -> None:
        """Raise ReplicaFailedError once a batch's device work has failed (Serve then replaces the replica)."""
        if self._failure is not None:
            raise ReplicaFailedError(f"unhealthy: {self._failure}")

    def status(self) -> dict[str, Any]:
        """What this replica serves and how: device, buckets, whether captured (and why not), health, and the
        counts (see :meth:`BucketedServer._usage`)."""
        device = self.session.device
        return {
            "device": f"{device.name} ({device.backend_type})",
            "device_index": self.device_index,
            "pid": os.getpid(),
            "buckets": list(self.buckets),
            "captured": all(b.graph is not None for b in self._buckets.values()) and bool(self._buckets),
            "capture_error": self.capture_error,
            "healthy": self._failure is None,
            "failure": self._failure,
            **self._usage(),
        }

    def inject_fault(self, kind: str, n: int = 1) -> None:
        """For tests on the fake backend: schedule one of its faults (``lose_device_on_submit``,
        ``validation_error_on_submit``) for the ``n``-th next submit."""
        faults = getattr(self.env.backend, "faults", None)
        if faults is None or kind not in ("lose_device_on_submit", "validation_error_on_submit"):
            raise InvalidArgumentError(
                f"inject_fault needs the fake backend and lose_device_on_submit or validation_error_on_submit, not "
                f"{kind!r} on {self.env.backend_name}"
            )
        getattr(faults, kind)(n)

    def profile(self) -> None:
        """Start a Chrome trace of the batches from now on, each timed per step (read it with :meth:`end_profile`)."""
        self.session.start_profiling(detail_every=1)

    def end_profile(self) -> str:
        """Stop the trace and return its JSON text ("" when none was started)."""
        path = self.session.end_profiling()
        if not path:
            return ""
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        os.unlink(path)
        return text

    def close(self) -> None:
        """Release the graphs, the buffers, the session and the Env (idempotent; waits for a batch in progress)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        for bucket in self._buckets.values():
            if bucket.graph is not None:
                bucket.graph.release()
            for value in [*bucket.inputs.values(), *bucket.outputs.values()]:
                value.release()
        self._buckets = {}
        session = getattr(self, "session", None)
        if session is not None:
            session.close()
        self.env.close()
