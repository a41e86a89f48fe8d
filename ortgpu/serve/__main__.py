"""``python -m ortgpu.serve``: serve a model over HTTP on the loopback address with Ray Serve, or ``--demo``.

    python -m ortgpu.serve --demo                         # serve a small MLP, answer one HTTP request, stop
    python -m ortgpu.serve model.onnx --port 8000 --replicas 2 --buckets 1,2,4,8
    curl -s localhost:8000/ortgpu -d '{"inputs": {"X": [[...]]}}'

Every input and output of the model has the batch as its first dimension (``--row-shape NAME=D1,D2`` fixes the
other dimensions where the model leaves them symbolic).  Stop the server with Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
import urllib.request
from typing import Any

import numpy as np

from ..demo import build_mlp, reference


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, not {text!r}") from None


def _row_shape(text: str) -> tuple[str, list[int]]:
    name, _, dims = text.partition("=")
    if not name or not dims:
        raise argparse.ArgumentTypeError(f"--row-shape takes NAME=D1,D2,..., not {text!r}")
    return name, _ints(dims)


def _demo_model() -> tuple[bytes, Any]:
    model, weights = build_mlp(4, 64, 1)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    return model.SerializeToString(), weights


def _stop(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ortgpu.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="the .onnx file to serve")
    parser.add_argument("--demo", action="store_true", help="serve a 4-layer MLP, answer one request, stop")
    parser.add_argument("--port", type=int, default=None, help="HTTP port on 127.0.0.1 (default 8000; --demo: free)")
    parser.add_argument("--name", default="ortgpu", help="the application's name and route (/NAME)")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--buckets", type=_ints, default=[1, 2, 4, 8], help="batch sizes to capture")
    parser.add_argument("--max-batch-size", type=int, default=None, help="default: the largest bucket; 1: no batching")
    parser.add_argument("--backend", choices=("wgpu", "fake"), default="wgpu")
    parser.add_argument("--row-shape", type=_row_shape, action="append", default=[], metavar="NAME=D1,D2")
    parser.add_argument("--ingress", choices=("proxy", "haproxy"), default="proxy",
                        help="Serve's Python HTTP proxy, or Ray's HAProxy ingress (faster for small models; opens "
                             "HAProxy's statistics ports 8404 and 9101 on every interface)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.demo == (args.model is not None):
        parser.error("give a model to serve, or --demo")
    try:
        import ray
    except ImportError:
        parser.exit(2, "python -m ortgpu.serve needs Ray Serve: pip install 'ortgpu[serve]'\n")
    from ._deployment import free_loopback_port, run

    model: Any = args.model
    weights = None
    if args.demo:
        model, weights = _demo_model()
    port = args.port if args.port is not None else (free_loopback_port() if args.demo else 8000)
    try:
        handle = run(
            model,
            name=args.name,
            http_port=port,
            ingress=args.ingress,
            num_replicas=args.replicas,
            buckets=args.buckets,
            max_batch_size=args.max_batch_size,
            backend=args.backend,
            row_shapes=dict(args.row_shape),
        )
        status = handle.status.remote().result()
        captured = "captured" if status["captured"] else f"uncaptured ({status['capture_error']})"
        url = f"http://127.0.0.1:{port}/{args.name}"
        print(f"serving {args.model or 'the demo MLP'} at {url}: {args.replicas} replica(s) on {status['device']}, "
              f"buckets {status['buckets']}, {captured}", flush=True)  # fmt: skip
        if weights is not None:
            x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
            body = json.dumps({"inputs": {"X": x.tolist()}}).encode()
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                y = np.asarray(json.loads(response.read())["outputs"]["Y"], np.float32)
            error = float(np.abs(y - reference(x, weights)).max())
            print(f"POST {url} with 3 rows: output {list(y.shape)}, max difference from numpy {error:.1e}")
            return 0 if error < 1e-3 else 1
        print(f"""try: curl -s {url} -d '{{"inputs": {{...}}}}'   (Ctrl-C stops)""", flush=True)
        signal.signal(signal.SIGTERM, _stop)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        ray.shutdown()  # Serve's actors go with the cluster (serve.shutdown first only adds Ray's retry warnings)


if __name__ == "__main__":
    raise SystemExit(main())
