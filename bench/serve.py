"""``python -m bench --serve``: a closed-loop HTTP load test of the ``ortgpu.serve`` deployment.

For each runtime (ortgpu, onnxruntime in the same deployment), replica count and batching setting, the bench deploys
the model on a local Ray cluster (Serve's HTTP proxy on a free loopback port), then ``--clients`` client processes
each POST one-row JSON requests back to back (a persistent connection each) for ``--warmup`` seconds, then for
``--seconds`` more, timed.  It reports requests/s over the timed window (requests begun and answered within it), the
latency p50/p99 of those requests, and errors, warm-up's included (none is expected: any is reported).  Batching "off" is ``max_batch_size=1``; "on" batches up to the largest
bucket.  Client processes, not threads, so that the clients' JSON work does not share one interpreter lock.

``--model`` is ``mlp16`` (16 x [MatMul 1024 x 1024 + Add + Relu]), an ``.onnx`` file, or an architecture name as
``--vs torch`` takes it (exported at batch 1 on the spot; needs torch): its inputs' and outputs' first dimension is
made symbolic (the batch), which holds for models whose other shapes do not depend on it.
"""

from __future__ import annotations

import http.client
import itertools
import json
import multiprocessing
import os
import tempfile
import time
from typing import Any

import numpy as np
import onnx

__all__ = ["run_serve", "serve_model", "format_serve"]


def serve_model(name: str) -> bytes:
    """The model to serve, with a symbolic batch dimension (see the module docstring)."""
    if name == "mlp16":
        from .models import mlp

        model = mlp(16, 1024, 1)
    elif name.endswith(".onnx"):
        model = onnx.load(name)
    else:
        from .architectures import build_architecture, export_onnx, is_architecture

        if not is_architecture(name):
            raise SystemExit(f"--serve --model takes mlp16, an .onnx file or SOURCE:NAME, not {name!r}")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.onnx")
            export_onnx(build_architecture(name, 1), path)
            model = onnx.load(path)
    for value in [*model.graph.input, *model.graph.output]:
        initializers = {t.name for t in model.graph.initializer}
        if value.name not in initializers and value.type.tensor_type.shape.dim:
            value.type.tensor_type.shape.dim[0].dim_param = "batch"
    serialized: bytes = model.SerializeToString()
    return serialized


def _client(port: int, route: str, body: bytes, warmup: float, seconds: float, max_requests: int) -> dict[str, Any]:
    """One closed-loop client: (latencies of the timed window in ms, errors, the first answer's keys)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}
    start = time.perf_counter()
    timed_from, until = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    errors: list[str] = []
    sent = 0
    while sent < max_requests:
        began = time.perf_counter()
        if began >= until:
            break
        try:
            connection.request("POST", route, body, headers)
            response = connection.getresponse()
            payload = response.read()
            ok = response.status == 200
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            ok, payload = False, str(error).encode()
        ended = time.perf_counter()
        sent += 1
        if not ok:  # warm-up's errors count too: none is expected anywhere
            errors.append(payload[:200].decode(errors="replace"))
        elif began >= timed_from and ended <= until:  # answered within the timed window
            latencies.append((ended - began) * 1e3)
    connection.close()
    return {"latencies": latencies, "errors": errors}


def _body(model: bytes) -> bytes:
    """One request of one row of random inputs, as JSON."""
    from .models import random_feeds

    proto = onnx.load_from_string(model)
    shapes = {v.name: tuple(d.dim_value or 1 for d in v.type.tensor_type.shape.dim) for v in proto.graph.input}
    feeds = random_feeds(proto, shapes)
    return json.dumps({"inputs": {name: array.tolist() for name, array in feeds.items()}}).encode()


def run_serve(args: Any) -> int:
    """The ``--serve`` command (options checked by ``bench.__main__``)."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise SystemExit("--serve needs Ray Serve: pip install 'ortgpu[serve]'") from None
    from ortgpu.serve import application
    from ortgpu.serve._deployment import free_loopback_port, start_local

    model = serve_model(args.model)
    body = _body(model)
    buckets = [b for b in (1, 2, 4, 8, 16, 32) if b <= max(1, args.clients)] or [1]
    rows: list[dict[str, Any]] = []
    if ray.is_initialized():
        raise SystemExit("--serve starts its own Ray cluster and Serve; call it where Ray is not running")
    port = free_loopback_port()
    start_local(port, ingress=args.ingress)
    context = multiprocessing.get_context("spawn")
    configurations = [
        (runtime, replicas, batching, placement)
        for runtime, replicas, batching, placement in itertools.product(
            args.serve_runtimes, args.replicas, args.batching, args.placements
        )
        if placement == "default" or runtime == "ortgpu"  # onnxruntime's replicas take its own default device
    ]
    try:
        with context.Pool(args.clients) as pool:
            for runtime, replicas, batching, placement in configurations:
                name = f"{runtime}-{replicas}-{batching}-{placement}".replace("onnxruntime", "ort")
                app = application(model, name=name, num_replicas=replicas, buckets=buckets,
                                  max_batch_size=None if batching == "on" else 1, runtime=runtime,
                                  backend=args.backend, batch_wait_timeout_s=args.batch_wait_ms / 1e3,
                                  devices=placement)  # fmt: skip
                handle = serve.run(app, name=name, route_prefix=f"/{name}")
                status = handle.status.remote().result()
                job = (port, f"/{name}", body, args.serve_warmup, args.seconds, args.max_requests)
                clients = pool.starmap(_client, [job] * args.clients)
                serve.delete(name)
                latencies = np.concatenate([np.asarray(c["latencies"], np.float64) for c in clients])
                errors = [e for c in clients for e in c["errors"]]
                rows.append({
                    "runtime": runtime, "device": status["device"], "captured": status["captured"],
                    "replicas": replicas, "batching": batching, "placement": placement, "ingress": args.ingress,
                    "clients": args.clients,
                    "requests_per_s": latencies.size / args.seconds,
                    "p50_ms": float(np.median(latencies)) if latencies.size else None,
                    "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
                    "errors": len(errors), "first_error": errors[0] if errors else None,
                })  # fmt: skip
                print(format_serve([rows[-1]], header=len(rows) == 1), flush=True)
    finally:
        ray.shutdown()  # Serve's actors go with the cluster (serve.shutdown first only adds Ray's retry warnings)
    if args.json_path:
        with open(args.json_path, "w") as handle_file:
            json.dump({"model": args.model, "rows": rows}, handle_file, indent=1)
    return 1 if any(row["errors"] for row in rows) else 0


def format_serve(rows: list[dict[str, Any]], header: bool = True) -> str:
    lines = []
    if header:
        lines += [
            "| runtime | device | replicas | batching | placement | ingress | clients | requests/s | p50 ms | p99 ms "
            "| p99/p50 | errors |",
            "|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
    for row in rows:
        p50, p99 = row["p50_ms"], row["p99_ms"]
        ratio = f"{p99 / p50:.2f}" if p50 and p99 else "-"
        lines.append(
            f"| {row['runtime']}{'' if row['captured'] or row['runtime'] != 'ortgpu' else ' (uncaptured)'} | "
            f"{row['device']} | {row['replicas']} | {row['batching']} | {row['placement']} | {row['ingress']} | "
            f"{row['clients']} | {row['requests_per_s']:.0f} | {p50 or 0:.2f} | {p99 or 0:.2f} | {ratio} | "
            f"{row['errors']} |"
        )
    return "\n".join(lines)
