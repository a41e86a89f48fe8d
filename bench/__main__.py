"""``python -m bench``: ortgpu with graph capture on and off, side by side, optionally against onnxruntime.

Examples::

    python -m bench --model mlp16 --capture both --json out.json
    python -m bench --model resnet --batch 16 --vs onnxruntime
    python -m bench --model matmul-1024-4096 --vs onnxruntime   # compute-bound: 8 x [1024, 4096] x [4096, 4096]
    python -m bench --model conv-64-56 --batch 64              # 8 x Conv 3x3 64->64 on [64, 64, 56, 56]
    python -m bench --overhead            # host cost per replayed dispatch vs wgpu-py's classes
    python -m bench --model lstm-ocr --batch 8 --vs onnxruntime  # CRNN recognizer: 3 x Conv, 2 x biLSTM 128
    python -m bench --model vad --vs onnxruntime                 # Silero-like VAD: If on sr, LSTM 128, state
    python -m bench --model mlp16 --threads 1,2,4,8 --capture both   # K threads, each with its own session
    python -m bench --model mlp16 --profile-overhead   # captured replay with profiling off vs on, interleaved
    python -m bench --vs torch --model torchvision:resnet50 --batch 8   # ortgpu captured vs torch graph and eager
    python -m bench --zoo default --json zoo.json      # 14 architectures vs torch: one table, geometric means
    python -m bench --zoo default --dtype float16      # the same in half precision (module.half() in both)

Models: ``mlp16``, ``resnet``, ``bert``; ``lstm-ocr`` (a CRNN text recognizer: image ``[batch, 1, 32, 128]``,
three Conv + Relu + MaxPool stages, two bidirectional LSTM layers of 128, 100 classes per column, see
``bench/recurrent_models.py``); ``vad`` (a Silero-like voice-activity detector, batch 1: a 512-sample chunk at
``sr = 16000``, an ``If`` on ``sr`` choosing the front end, an LSTM of 128 with state in and out);
``matmul-M-K`` (8 x MatMul ``[M, K] x [K, K]``; M is the batch, so
``--batch`` must be left at 1 or equal M); ``conv-C-S`` (8 x (Conv 3x3 pad 1, C -> C channels, bias, Relu) on
``[batch, C, S, S]``); or the path of an ``.onnx`` file. The FLOPs of one run (2 x the multiply-adds of the MatMul,
Gemm, Conv, ConvTranspose, LSTM, GRU and RNN nodes of the main graph, see ``bench/flops.py``) are printed, and
every result gets its achieved TFLOP/s at p50 (FLOPs per run / p50 time at that boundary).

With ``--vs onnxruntime`` the recurrent models also get an onnxruntime CPU-provider arm (``--peer-cpu``), their
usual deployment. Where ortgpu refuses to capture a model (``ortgpu.CaptureStateError``: a node placed on the CPU,
an input whose value decides the plan), the captured arms are skipped, the reason is printed and recorded in the
JSON as ``capture_refused``, and the other arms are reported. Every peer arm's outputs are compared with ortgpu's
before timing (its first and second call: a captured peer's recording run and a replay): an arm that differs is not
timed, and recorded as ``peer_wrong_outputs`` when another onnxruntime arm agrees with ortgpu; when none does, the
bench stops without reporting any timing.

With ``--threads K[,K2,...]`` the bench measures throughput with threads instead (``bench/threads.py``): K threads,
each driving its own session (and, captured, its own graph over its own device I/O) on one device, started together
at a barrier after their warm-up, for ``--iterations`` steps each (or ``--seconds``); per K, arm and boundary it
reports the aggregate steps per second and each thread's p50 and p99 (JSON: ``threads``). Every session's outputs are
compared with the single-thread reference before timing and after. The captured arm also gets the GPU ceiling: the
GPU time of one replay from timestamp queries, ``1 / gpu_time``, and each K's throughput as a fraction of it (JSON:
``threads.gpu_ceiling``); with ``--gpu-under-load``, also a replay's GPU time while the K threads step, and the
fraction of the time the GPU is busy with replays (JSON: ``threads.gpu_under_load``).

With ``--vs torch --model SOURCE:NAME`` (``torchvision:``, ``timm:`` or ``transformers:`` names, see
``bench/architectures.py``) the bench builds the architecture in PyTorch with random seeded weights, exports it to
ONNX, checks ortgpu's outputs against onnxruntime's CPU provider (1e-4) and torch's, and times ortgpu's captured
replay against torch's CUDA graph and eager arms at the same boundary, interleaved in ``--rounds``
(``bench/vs_torch.py``, ``bench/torch_arms.py``); ``--zoo NAMES`` (comma-separated, or ``default``) does so for
each name in its own child process and prints one table with the geometric means of torch p50 / ortgpu p50
(``bench/zoo.py``). Without torch importable, ``--vs torch`` exits with code 2 and names what to install.

With ``--profile-overhead`` the bench measures what profiling costs a captured replay instead
(``bench/profile_overhead.py``): two sessions with a captured graph each, one profiled, timed interleaved for
``--iterations`` steps after ``--warmup``, at replay + to_numpy and at replay_and_read; it prints each p50 with
profiling off and on and the ratio on / off, and the GPU time per replay from the profiled session's timestamps
(JSON: ``profile_overhead``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import numpy as np
import numpy.typing as npt
import onnx

import ortgpu

from .flops import model_flops
from .half import float16_accuracy, half_feeds, to_float16
from .harness import ArmResult, OrtgpuArms, median_ms, summarize, time_loop
from .models import conv_chain, matmul_chain, mlp, random_feeds, resnet, transformer_encoder
from .recurrent_models import crnn_recognizer, silero_like_vad, vad_feeds
from .threads import bench_threads, parse_thread_counts
from .vs_torch import add_arguments as add_torch_arguments
from .vs_torch import run as run_vs_torch

#: The captured arm that reads its outputs with graph.replay_and_read() (end_to_end only).
READ_ARM = "ortgpu capture on, replay_and_read"
#: The captured arm (replay + to_numpy) with the wgpu backend's encode-ahead switched off (end_to_end only): every
#: replay encodes its command buffer before submitting it, as it did before encode-ahead.
NO_AHEAD_ARM = "ortgpu capture on, encode ahead off"

BOUNDARIES = {
    "end_to_end": "update_inplace of every input + run (or replay) + readback of every output",
    "run_only": "run (or replay) until the device is idle; inputs already on the device",
}


MODEL_FORMS = (
    "mlp16 | resnet | bert | lstm-ocr | vad (batch 1) | matmul-M-K (8 x MatMul [M,K]x[K,K]; M is the batch) | "
    "conv-C-S (8 x Conv3x3+bias+Relu, C->C channels, input [batch,C,S,S]) | path to an .onnx file"
)
#: Recurrent models: their outputs pass through long chains of LSTM steps, compared with the peers at this relative
#: error (the others at PEER_TOLERANCE); with --vs onnxruntime they get an onnxruntime CPU-provider arm too.
RECURRENT_MODELS = ("lstm-ocr", "vad")
RECURRENT_TOLERANCE = 1e-4
PEER_TOLERANCE = 1e-3
#: With --dtype float16 the peers run the float16 model too, and each rounds its sums differently: 1e-2 (issue 37's
#: bound on the float16 models' error against float32).
HALF_TOLERANCE = 1e-2
#: The VAD's input sizes (Silero VAD: 512 samples at 16 kHz, state [1, 1, 128] for h and c).
VAD_CHUNK, VAD_HIDDEN, VAD_RATE = 512, 128, 16000
OCR_HEIGHT, OCR_WIDTH = 32, 128

_SIZED = {
    "matmul": re.compile(r"matmul-([1-9][0-9]*)-([1-9][0-9]*)"),
    "conv": re.compile(r"conv-([1-9][0-9]*)-([1-9][0-9]*)"),
}


def _sized_model(name: str) -> tuple[str, int, int] | None:
    for kind, pattern in _SIZED.items():
        match = pattern.fullmatch(name)
        if match:
            return kind, int(match[1]), int(match[2])
    return None


def check_model(name: str, batch: int) -> None:
    """Raise ValueError, with the accepted forms, unless ``name`` (with ``batch``) names a model build_model makes."""
    if batch < 1:
        raise ValueError(f"--batch must be at least 1, not {batch}")
    sized = _sized_model(name)
    if sized is not None:
        kind, m, _ = sized
        if kind == "matmul" and batch not in (1, m):
            raise ValueError(f"--batch {batch} does not apply to {name}: its batch is M = {m} (leave --batch at 1)")
        return
    if name == "vad" and batch != 1:
        raise ValueError(f"--batch {batch} does not apply to vad: it runs one stream's chunk (leave --batch at 1)")
    if name in ("mlp16", "resnet", "bert", *RECURRENT_MODELS) or os.path.isfile(name):
        return
    raise ValueError(
        f"unknown model {name!r}: expected one of {MODEL_FORMS}, e.g. matmul-1024-4096 or conv-64-56 (positive integers)"
    )


def build_model(name: str, batch: int) -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]]]:
    """A built-in model (or a file) and the input shapes to run it with (ValueError for a name that is neither)."""
    check_model(name, batch)
    sized = _sized_model(name)
    if sized is not None:
        kind, first, second = sized
        if kind == "matmul":
            return matmul_chain(k=second, layers=8), {"X": (first, second)}
        return conv_chain(channels=first, size=second, layers=8), {"X": (batch, first, second, second)}
    if name == "mlp16":
        return mlp(layers=16, width=1024, batch=batch), {"X": (batch, 1024)}
    if name == "resnet":
        return resnet(batch=batch, channels=64, size=224, blocks=4, classes=1000), {"X": (batch, 3, 224, 224)}
    if name == "bert":
        model = transformer_encoder(batch=batch, seq=128, vocab=30522, d_model=384, heads=12, ffn=1536, layers=6)
        return model, {"ids": (batch, 128)}
    if name == "lstm-ocr":
        model = onnx.load_from_string(crnn_recognizer(batch=batch, width=OCR_WIDTH))
        return model, {"image": (batch, 1, OCR_HEIGHT, OCR_WIDTH)}
    if name == "vad":
        state = (1, 1, VAD_HIDDEN)
        model = onnx.load_from_string(silero_like_vad(hidden=VAD_HIDDEN))
        return model, {"audio": (VAD_CHUNK,), "sr": (), "h": state, "c": state}
    model = onnx.load(name)
    shapes = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in value.type.tensor_type.shape.dim]
        shapes[value.name] = tuple(dims)
    return model, shapes


def model_feeds(name: str, model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, npt.NDArray[Any]]:
    """The inputs the bench feeds: random (floats ~ N(0, 1), integers in [0, 100)); the VAD's are a real sample
    rate (its value picks the ``If`` branch) and small audio and state values."""
    if name == "vad":
        return vad_feeds(model, VAD_RATE)
    return random_feeds(model, shapes, high=100)


def _progress(label: str, total: int) -> Any:
    step = max(1, total // 10)

    def report(index: int) -> None:
        if (index + 1) % step == 0 or index + 1 == total:
            print(
                f"\r  {label}: {index + 1}/{total}", end="" if index + 1 < total else "\n", file=sys.stderr, flush=True
            )

    return report


def _versions() -> dict[str, str]:
    versions = {"ortgpu": ortgpu.__version__, "python": platform.python_version(), "numpy": np.__version__}
    try:
        versions["wgpu (carrier of wgpu-native)"] = version("wgpu")
    except PackageNotFoundError:
        pass
    try:
        from ortgpu_core.backends.wgpu_native import native_version

        versions["wgpu-native"] = native_version()
    except Exception:  # no wgpu-native here (fake backend only)
        pass
    return versions


def _relative_error(a: list[npt.NDArray[Any]], b: list[npt.NDArray[Any]]) -> float:
    """The worst relative error (2-norm) of ``a``'s outputs against ``b``'s: inf where their number or a shape
    differs, NaN where one holds NaN."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        denominator = max(float(np.linalg.norm(y.astype(np.float64))), 1e-30)
        worst = float(
            np.maximum(worst, float(np.linalg.norm(x.astype(np.float64) - y.astype(np.float64))) / denominator)
        )
    return worst


def _check_equal(name: str, a: list[npt.NDArray[Any]], b: list[npt.NDArray[Any]], tolerance: float) -> float:
    if len(a) != len(b):
        raise SystemExit(f"{name}: {len(a)} outputs against {len(b)}; no timings reported")
    worst = _relative_error(a, b)
    if not worst <= tolerance:  # NaN too (max() would drop it, and NaN > tolerance is False)
        raise SystemExit(f"{name}: outputs differ (relative error {worst:.3e} > {tolerance}); no timings reported")
    return worst


def build_parser() -> argparse.ArgumentParser:
    """The bench's command line (every option; :func:`main` checks how they combine)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", default="mlp16", help=MODEL_FORMS)
    parser.add_argument("--batch", type=int, default=1, help="batch size (matmul-M-K: M is the batch; leave this at 1)")
    parser.add_argument(
        "--capture",
        choices=("on", "off", "both"),
        default="both",
        help="time the captured replay, the uncaptured run, or both (default)",
    )
    parser.add_argument(
        "--vs",
        choices=("onnxruntime", "torch"),
        default=None,
        help="onnxruntime: also time onnxruntime in this process (its WebGPU plugin EP if installed, else CPU); "
        "torch: ortgpu captured vs PyTorch CUDA graph and eager on --model SOURCE:NAME (bench/vs_torch.py)",
    )
    parser.add_argument(
        "--peer-cpu",
        choices=("auto", "on", "off"),
        default="auto",
        help="with --vs onnxruntime, also time onnxruntime's CPU provider next to its WebGPU EP (auto: for the "
        "recurrent models lstm-ocr and vad; without the WebGPU EP the peer is the CPU provider anyway)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="float16: run the model converted to half precision (bench/half.py) and report its relative error "
        "against the float32 model on onnxruntime CPU and against onnxruntime CPU running the float16 model",
    )
    parser.add_argument("--iterations", type=int, default=200, help="timed iterations per arm and boundary")
    parser.add_argument("--warmup", type=int, default=20, help="untimed iterations before each timed loop")
    parser.add_argument("--backend", choices=("wgpu", "fake"), default="wgpu", help="device backend (default wgpu)")
    parser.add_argument(
        "--json",
        dest="json_path",
        default=None,
        help="write raw timings, p50/p90/p99, adapter, versions and the command line here",
    )
    parser.add_argument("--plot", default=None, help="PNG of the latency distributions (needs matplotlib)")
    parser.add_argument(
        "--overhead",
        action="store_true",
        help="also measure the host cost per replayed dispatch (vs wgpu-py) and spinning vs blocking waits",
    )
    parser.add_argument("--overhead-only", action="store_true", help="run only the host-overhead micro-benchmark")
    parser.add_argument(
        "--threads",
        default=None,
        help="measure throughput with K threads, each with its own session on one device, for each K of a comma "
        "list (e.g. 1,2,4,8): aggregate steps/s and per-thread p50/p99 (not with --vs, --overhead, --plot)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="with --threads: time each (K, arm, boundary) for this many seconds instead of --iterations per thread; "
        "with --serve: the timed window per configuration (default 10)",
    )
    parser.add_argument(
        "--gpu-under-load",
        action="store_true",
        help="with --threads: also measure a replay's GPU time (timestamps) while the K threads step, each session "
        "profiled, and the fraction of the time the GPU is busy with replays",
    )
    parser.add_argument(
        "--profile-overhead",
        action="store_true",
        help="measure a captured replay with profiling off vs on, interleaved (p50s, ratio on/off, GPU time per "
        "replay from timestamps); not with --threads, --vs, --overhead, --plot",
    )
    parser.add_argument(
        "--generate",
        default=None,
        metavar="MODEL",
        help="token generation with ortgpu.Generator, captured vs uncaptured: MODEL is an onnxruntime-genai model "
        "folder or .onnx, llama-LAYERS-HIDDEN (a random Llama built by onnxruntime-genai's builder: needs it, torch "
        "and transformers) or decoder-LAYERS-HIDDEN (a toy decoder with random weights; bench/generate.py); --rounds "
        "timed generations per arm",
    )
    parser.add_argument(
        "--generate-vs",
        default=None,
        metavar="PEERS",
        help="with --generate on a model folder: also time onnxruntime-genai (its CPU provider) and/or torch "
        "(transformers generate, static cache, eager and CUDA graphs, on the folder's hf/ checkpoint), comma-separated",
    )
    parser.add_argument("--prompt-len", type=int, default=128, help="with --generate: prompt tokens per row")
    parser.add_argument("--new-tokens", type=int, default=128, help="with --generate: tokens generated per row")
    serve_group = parser.add_argument_group("--serve: a closed-loop HTTP load test of ortgpu.serve (bench/serve.py)")
    serve_group.add_argument("--serve", action="store_true", help="load-test the serving deployment of --model")
    serve_group.add_argument("--replicas", type=_int_list, default=[1, 2, 4], help="replica counts (default 1,2,4)")
    serve_group.add_argument("--batching", type=_choice_list("on", "off"), default=["on", "off"], help="on,off")
    serve_group.add_argument("--serve-runtimes", type=_choice_list("ortgpu", "onnxruntime"),
                             default=["ortgpu", "onnxruntime"], help="ortgpu,onnxruntime (the same deployment)")  # fmt: skip
    serve_group.add_argument("--clients", type=int, default=16, help="closed-loop client processes")
    serve_group.add_argument("--serve-warmup", type=float, default=2.0, help="untimed seconds first")
    serve_group.add_argument("--max-requests", type=int, default=10**9, help="per client, warm-up included")
    serve_group.add_argument("--ingress", choices=("proxy", "haproxy"), default="proxy",
                             help="Serve's Python HTTP proxy (loopback only) or Ray's HAProxy ingress (binds every "
                                  "interface; see ortgpu.serve.start_local)")  # fmt: skip
    serve_group.add_argument("--batch-wait-ms", type=float, default=2.0, help="Serve's batch_wait_timeout_s, in ms")
    serve_group.add_argument("--placements", type=_choice_list("default", "spread"), default=["default"],
                             help="default (every replica on the default device), spread (over the machine's GPUs)")  # fmt: skip
    add_torch_arguments(parser)
    return parser


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive ints, not {text!r}")
    return values


def _choice_list(*choices: str) -> Any:
    def parse(text: str) -> list[str]:
        values = [part for part in text.split(",") if part]
        if not values or any(v not in choices for v in values):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices)}, not {text!r}")
        return values

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.serve:
        from .serve import run_serve

        args.seconds = 10.0 if args.seconds is None else args.seconds
        if args.clients < 1 or args.seconds <= 0 or args.serve_warmup < 0 or args.max_requests < 1:
            parser.error("--serve needs --clients >= 1, --seconds > 0, --serve-warmup >= 0, --max-requests >= 1")
        return run_serve(args)
    if args.generate is not None:
        from .generate import parse_decoder, parse_llama, parse_peers, run_generate

        try:
            parse_decoder(args.generate)
            parse_llama(args.generate)
            parse_peers(args.generate_vs)
        except ValueError as error:
            parser.error(str(error))
        if args.prompt_len < 1 or args.new_tokens < 2 or args.rounds < 1 or args.batch < 1:
            parser.error("--generate needs --prompt-len >= 1, --new-tokens >= 2, --rounds >= 1 and --batch >= 1")
        return run_generate(args)
    if args.vs == "torch" or args.zoo is not None:
        return run_vs_torch(args, parser, argv)
    if args.profile_overhead and (
        args.threads is not None or args.vs or args.overhead or args.overhead_only or args.plot
    ):
        parser.error("--profile-overhead measures profiling's cost only: leave out --threads, --vs, --overhead, --plot")
    if args.threads is not None:
        try:
            args.thread_counts = parse_thread_counts(args.threads)
        except ValueError as error:
            parser.error(str(error))
        if args.vs or args.overhead or args.overhead_only or args.plot:
            parser.error("--threads measures ortgpu's threaded throughput only: leave out --vs, --overhead and --plot")
        if args.seconds is not None and not args.seconds > 0:
            parser.error(f"--seconds must be positive, not {args.seconds}")
    elif args.seconds is not None:
        parser.error("--seconds applies to --threads only")
    elif args.gpu_under_load:
        parser.error("--gpu-under-load applies to --threads only")
    if args.iterations < 1 or args.warmup < 0:
        parser.error("--iterations must be at least 1 and --warmup at least 0")
    if not args.overhead_only:
        try:
            check_model(args.model, args.batch)
        except ValueError as error:
            parser.error(str(error))

    env = ortgpu.Env(backend=args.backend)
    try:
        return _run(args, env, argv)
    finally:
        env.close()


def _run(args: argparse.Namespace, env: ortgpu.Env, argv: list[str] | None) -> int:
    """Everything ``main`` does with its Env (which it closes on every way out)."""
    device = env.default_device
    adapter = {
        "name": device.name,
        "vendor_id": hex(device.vendor_id),
        "device_id": hex(device.device_id),
        "backend": device.backend_type,
        "adapter_type": device.adapter_type,
        "driver": device.driver,
    }
    report: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])]),
        "adapter": adapter,
        "versions": _versions(),
        "boundaries": BOUNDARIES,
    }
    print(f"adapter: {device.name} ({device.backend_type}, {device.adapter_type}), driver {device.driver}")
    for boundary, text in BOUNDARIES.items():
        print(f"boundary {boundary}: {text}")

    results: list[ArmResult] = []
    if not args.overhead_only:
        model, shapes = build_model(args.model, args.batch)
        batch = shapes["X"][0] if args.model.startswith("matmul-") else args.batch
        flops = model_flops(model, shapes)
        report["flops_per_run"] = flops
        print(
            f"model: {flops / 1e9:.3f} GFLOP per run (MatMul, Gemm, Conv, ConvTranspose, LSTM, GRU, RNN; "
            "not inside If/Loop/Scan)"
        )
        feeds = model_feeds(args.model, model, shapes)
        tolerance = RECURRENT_TOLERANCE if args.model in RECURRENT_MODELS else PEER_TOLERANCE
        float32_model = model
        if args.dtype == "float16":
            model, feeds, tolerance = to_float16(model), half_feeds(feeds), HALF_TOLERANCE
            report["dtype"] = "float16"
        model_bytes = model.SerializeToString()
        report["model"] = {"name": args.model, "batch": batch, "inputs": {k: list(v) for k, v in shapes.items()}}
        if args.threads is not None:
            bench_threads(args, env, report, model_bytes, feeds, batch)
            _write_report(args, report)
            return 0
        if args.profile_overhead:
            return _run_profile_overhead(args, env, report, model_bytes, feeds, batch)
        arms = OrtgpuArms(model_bytes, feeds, env)
        try:
            reference = arms.uncaptured_end_to_end(keep=True)
            if args.dtype == "float16":
                accuracy = float16_accuracy(float32_model, model, feeds, reference)
                report["float16_accuracy"] = accuracy
                print(
                    "float16 relative error: "
                    + ", ".join(f"{name.replace('_', ' ')} {value:.2e}" for name, value in accuracy.items())
                )
            step: Callable[[], object]
            if args.capture in ("off", "both"):
                for boundary, step in (
                    ("end_to_end", arms.uncaptured_end_to_end),
                    ("run_only", arms.uncaptured_run_only),
                ):
                    seconds = time_loop(
                        step, args.warmup, args.iterations, _progress(f"ortgpu capture off {boundary}", args.iterations)
                    )
                    results.append(ArmResult("ortgpu capture off", boundary, seconds))
                report.setdefault("breakdown_ms", {})["capture off"] = arms.breakdown(False, min(args.iterations, 100))
                # The plain numpy API too: run(None, feeds) with host arrays in and out.
                seconds = time_loop(
                    lambda: arms.session.run(None, feeds),
                    args.warmup,
                    args.iterations,
                    _progress("ortgpu run() numpy in/out", args.iterations),
                )
                results.append(ArmResult("ortgpu run() numpy in/out", "end_to_end", seconds))
            graph = None
            if args.capture in ("on", "both"):
                try:
                    graph = arms.capture()
                except ortgpu.CaptureStateError as error:  # a documented refusal: report it, time the other arms
                    report["capture_refused"] = str(error)
                    print(f"ortgpu capture on: refused ({error}); its arms are not timed")
            if graph is not None:
                report["dispatches"] = graph.dispatch_count
                replayed = arms.captured_end_to_end(keep=True)
                report["capture_vs_uncaptured_rel_error"] = _check_equal("capture on vs off", replayed, reference, 1e-6)
                for boundary, step in (("end_to_end", arms.captured_end_to_end), ("run_only", arms.captured_run_only)):
                    seconds = time_loop(
                        step, args.warmup, args.iterations, _progress(f"ortgpu capture on {boundary}", args.iterations)
                    )
                    results.append(ArmResult("ortgpu capture on", boundary, seconds))
                report.setdefault("breakdown_ms", {})["capture on"] = arms.breakdown(True, min(args.iterations, 100))
                # the same step with graph.replay_and_read(): one submission for the replay and the output copies
                _check_equal("replay_and_read vs replay + to_numpy", arms.captured_read_end_to_end(), reference, 1e-6)
                seconds = time_loop(
                    arms.captured_read_end_to_end,
                    args.warmup,
                    args.iterations,
                    _progress("ortgpu capture on, replay_and_read end_to_end", args.iterations),
                )
                results.append(ArmResult(READ_ARM, "end_to_end", seconds))
                backend_device = arms.device._native_device()
                if getattr(backend_device, "encode_ahead", False):  # a wgpu device encoding ahead: time it without
                    setattr(backend_device, "encode_ahead", False)  # noqa: B010 - a wgpu-only knob
                    try:
                        seconds = time_loop(
                            arms.captured_end_to_end,
                            args.warmup,
                            args.iterations,
                            _progress(f"{NO_AHEAD_ARM} end_to_end", args.iterations),
                        )
                    finally:
                        setattr(backend_device, "encode_ahead", True)  # noqa: B010 - a wgpu-only knob
                    results.append(ArmResult(NO_AHEAD_ARM, "end_to_end", seconds))
        finally:
            arms.close()
        if args.vs == "onnxruntime":
            from .peer import OnnxruntimeArms, peer_versions, webgpu_ep_available

            report["versions"].update(peer_versions())
            modes = {"off": [False], "on": [True], "both": [False, True]}[args.capture]
            configurations = [("auto", capture) for capture in modes]
            cpu_arm = args.peer_cpu == "on" or (args.peer_cpu == "auto" and args.model in RECURRENT_MODELS)
            if cpu_arm and webgpu_ep_available():  # without the WebGPU EP, "auto" is the CPU provider already
                configurations.append(("cpu", False))
            # Every peer's outputs are compared with ortgpu's before any peer is timed: twice, the first call
            # being where a captured peer records its graph, the second a replay (what is timed).
            agreed: list[tuple[str, OnnxruntimeArms, float]] = []
            wrong: dict[str, float] = {}
            for provider, capture in configurations:
                try:
                    peer = OnnxruntimeArms(model_bytes, feeds, capture=capture, provider=provider)
                    calls = [peer.end_to_end(), peer.end_to_end()]  # a captured peer may refuse at its first call
                except Exception as error:  # the peer may not support a configuration; say so, keep going
                    what = f"{'CPUExecutionProvider ' if provider == 'cpu' else ''}capture {'on' if capture else 'off'}"
                    print(f"onnxruntime {what}: could not run ({error})", file=sys.stderr)
                    report.setdefault("peer_errors", {})[what] = str(error)
                    continue
                label = f"onnxruntime {peer.provider} capture {'on' if capture else 'off'}"
                deviation = max(_relative_error(outputs, reference) for outputs in calls)
                if deviation <= tolerance:
                    agreed.append((label, peer, deviation))
                else:  # NaN too
                    wrong[label] = deviation
            if wrong and not agreed:  # nobody confirms ortgpu's outputs: no timings at all
                label, deviation = next(iter(wrong.items()))
                raise SystemExit(
                    f"{label}: outputs differ (relative error {deviation:.3e} > {tolerance}); no timings reported"
                )
            for label, deviation in wrong.items():  # another onnxruntime arm agrees with ortgpu: this arm is wrong
                print(
                    f"{label}: outputs differ from ortgpu's (relative error {deviation:.3e} > {tolerance}), which "
                    f"{agreed[0][0]} confirms: its timings are not reported"
                )
                report.setdefault("peer_wrong_outputs", {})[label] = deviation
            for label, peer, deviation in agreed:
                report.setdefault("peer", {})[label] = {
                    "provider": peer.provider,
                    "io_placement": peer.io_placement,
                    "run_only_waits_for_device": peer.run_only_waits_for_device,
                }
                if not peer.run_only_waits_for_device:
                    print(
                        f"note: {label} run_only does not wait for its GPU work (onnxruntime has no wait for this "
                        f"EP; synchronize_outputs() returns early): it times the host call; compare end_to_end"
                    )
                report.setdefault("peer_vs_ortgpu_rel_error", {})[label] = deviation
                for boundary, step in (("end_to_end", peer.end_to_end), ("run_only", peer.run_only)):
                    seconds = time_loop(
                        step, args.warmup, args.iterations, _progress(f"{label} {boundary}", args.iterations)
                    )
                    results.append(ArmResult(label, boundary, seconds))

        print(f"\nmodel {args.model}, batch {batch}, {args.iterations} iterations after {args.warmup} warm-up")
        flops_column = f" {'TFLOP/s p50':>11s}" if flops > 0 else ""
        print(f"{'arm':58s} {'boundary':11s} {'p50 ms':>9s} {'p90 ms':>9s} {'p99 ms':>9s}{flops_column}")
        for result in results:
            s = result.summary()
            rate = f" {result.tflops_p50(flops):11.4g}" if flops > 0 else ""
            print(
                f"{result.name:58s} {result.boundary:11s} {s['p50_ms']:9.3f} {s['p90_ms']:9.3f} {s['p99_ms']:9.3f}{rate}"
            )
        p50 = {(r.name, r.boundary): median_ms(r.seconds) for r in results}
        ratios = {}
        for boundary in BOUNDARIES:
            off, on = p50.get(("ortgpu capture off", boundary)), p50.get(("ortgpu capture on", boundary))
            if off and on:
                ratios[f"capture off / on, {boundary}"] = off / on
            read = p50.get((READ_ARM, boundary))
            if off and read:
                ratios[f"capture off / on with replay_and_read, {boundary}"] = off / read
            unahead = p50.get((NO_AHEAD_ARM, boundary))
            if on and unahead:
                ratios[f"capture on: encode ahead off / on, {boundary}"] = unahead / on
            for (name, b), value in p50.items():
                if b == boundary and name.startswith("onnxruntime"):
                    mine = on if "capture on" in name else off
                    if mine:
                        ratios[f"{name} / ortgpu, {boundary}"] = value / mine
                    if "CPUExecutionProvider" in name and on:  # no capture there: its rival is ortgpu's best arm
                        ratios[f"{name} / ortgpu capture on, {boundary}"] = value / on
        for text, value in ratios.items():
            print(f"ratio {text}: {value:.2f}x")
        for arm, parts in report.get("breakdown_ms", {}).items():
            print(
                f"end_to_end breakdown, ortgpu {arm} (median ms): "
                + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
            )
        report["results"] = summarize(results, flops_per_run=flops)
        report["ratios"] = ratios

    if args.overhead or args.overhead_only:
        from .overhead import measure_overhead, measure_wait_latency

        overhead = measure_overhead(device._native_device())
        report["overhead"] = overhead
        print(f"\nhost cost per replayed dispatch: ortgpu {overhead['ortgpu_replay_us_per_dispatch']:.3f} us", end="")
        phases = overhead.get("ortgpu_phases_us_per_dispatch")
        if "wgpu_py_us_per_dispatch" in overhead:
            print(f", wgpu-py classes {overhead['wgpu_py_us_per_dispatch']:.3f} us, ratio {overhead['ratio']:.0f}x")
        else:
            print(f" ({overhead.get('no_comparison', 'wgpu-py not importable')}: no comparison)")
        if phases:
            print("  of which per dispatch: " + ", ".join(f"{name} {value:.3f} us" for name, value in phases.items()))
        if "ortgpu_encoded_ahead_submit_us_per_dispatch" in overhead:
            print(
                f"  submitting a command buffer encoded ahead (a replay's critical path with encode_ahead): "
                f"{overhead['ortgpu_encoded_ahead_submit_us_per_dispatch']:.3f} us per dispatch"
            )
        waits = measure_wait_latency(device._native_device())
        if waits is not None:
            report["wait_latency"] = waits
            print(
                f"submit + wait_idle, median us (waits spin for up to {waits['spin_wait_us']:.0f} us, or block): "
                + "; ".join(
                    f"{count}: spinning {waits['spinning_us'][count]:.1f}, blocking {waits['blocking_us'][count]:.1f}"
                    for count in waits["spinning_us"]
                )
            )

    _write_report(args, report)
    if args.plot and results:
        _plot(results, args.plot)
    return 0


def _write_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Write ``report`` as JSON to ``--json``, when given."""
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(report, handle, indent=1)
        print(f"wrote {args.json_path}")


def _run_profile_overhead(
    args: argparse.Namespace,
    env: ortgpu.Env,
    report: dict[str, Any],
    model_bytes: bytes,
    feeds: dict[str, npt.NDArray[Any]],
    batch: int,
) -> int:
    """``--profile-overhead``: see ``bench/profile_overhead.py``."""
    from .profile_overhead import measure_profile_overhead, print_profile_overhead

    print(f"\nmodel {args.model}, batch {batch}: {args.iterations} interleaved iterations after {args.warmup} warm-up")
    try:
        result = measure_profile_overhead(model_bytes, feeds, env, args.warmup, args.iterations)
    except ortgpu.CaptureStateError as error:
        raise SystemExit(f"--profile-overhead needs a captured model: {error}") from error
    print_profile_overhead(result)
    report["profile_overhead"] = result
    _write_report(args, report)
    return 0


def _plot(results: list[ArmResult], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install 'ortgpu[plot]'); no plot written", file=sys.stderr)
        return
    figure, axes = plt.subplots(1, 2, figsize=(12, 4))
    for axis, boundary in zip(axes, BOUNDARIES):
        chosen = [r for r in results if r.boundary == boundary]
        axis.boxplot([np.asarray(r.seconds) * 1e3 for r in chosen], showfliers=False)
        axis.set_xticks(
            range(1, len(chosen) + 1), [r.name.replace(" capture", "\ncapture") for r in chosen], fontsize=7
        )
        axis.set_title(boundary)
        axis.set_ylabel("ms")
    figure.tight_layout()
    figure.savefig(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
