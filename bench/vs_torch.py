"""``python -m bench --vs torch --model SOURCE:NAME``: ortgpu's captured replay against PyTorch on the same model.

The architecture (``bench/architectures.py``) is built with random seeded weights, exported to ONNX, and that file
loaded by ortgpu; torch times the very module it exported (``bench/torch_arms.py``). Three arms, one boundary (the
bench's ``end_to_end``): inputs from the host into fixed device memory, the model, outputs back to the host:

* ``ortgpu captured``: ``update_inplace`` of every input, ``graph.replay()``, ``to_numpy(out=...)`` of every output
  into a fixed host array, but ``to_numpy()`` for outputs of 8 MiB or more (a decoder's logits: the staging memory
  the device copied them into, handed over without a host copy, as torch's end in pinned memory) (where ortgpu refuses to capture: its uncaptured run over the same I/O, ``capture_refused``
  in the JSON, and the model is left out of the geometric means);
* ``torch CUDA graph``: pinned host inputs copied into static CUDA tensors, ``graph.replay()``, the output copied
  into a pinned host tensor, ``torch.cuda.synchronize()``;
* ``torch eager``: the same with ``module(*inputs)`` under ``torch.inference_mode()`` instead of the replay.

Correctness comes before timing. The relative error of outputs ``a`` against a reference ``b`` is
``max|a - b| / max(max|b|, tiny)`` (float64, ``tiny`` the smallest normal float32; the worst over the outputs;
non-finite values must match exactly, else the error is inf; a shape mismatch is inf; an all-zero reference gives
0 when ``a`` is all zero too, else a huge error). ortgpu's outputs are compared with onnxruntime's CPU provider on
the same ONNX file (graph optimizations at the basic level) and must agree within ``--ort-tolerance`` (1e-4), and
with torch's eager and CUDA-graph outputs within ``--torch-tolerance`` (1e-3: the exported model must be the timed
one); a model that fails either is not timed. The JSON also records onnxruntime against torch (where both
disagree with ortgpu, suspect the export), the captured replay against the uncaptured run (1e-6), and the
placement (every node on the GPU, or which ones are not).

With ``--dtype float16`` the module is converted by ``module.half()`` (floating-point inputs rounded to float16,
token ids unchanged) after its float32 output is kept as the reference, and that half module is what is exported,
loaded by ortgpu and timed by torch (which may use its tensor cores; ortgpu has none through WebGPU). The
tolerances against onnxruntime CPU (same float16 file; where onnxruntime lacks a float16 kernel it is skipped and
said) and torch default to 1e-2, and ortgpu's outputs are compared with the float32 module's: beyond
:data:`FP32_REFERENCE_TOLERANCE` (1e-2) the model is timed, reported, and left out of the geometric means.

Timing: ``--warmup`` untimed steps per arm, then ``--rounds`` rounds; in each round every arm runs two untimed
steps and then its share of ``--iterations`` timed steps, the order of the arms rotating from round to round; p50
(and p90/p99) over all of an arm's timed steps. Ratios: torch CUDA graph p50 / ortgpu p50 and torch eager p50 /
ortgpu p50 (above 1: ortgpu is faster).

``--torch-process child`` (the default) runs the torch side in a child process (``python -m bench.torch_arms``),
``same`` in the bench's own process. The arms never run at the same time in either; what differs is what shares
the process: torch's threads, allocator and import weight next to wgpu-native's. Child is the default because it
leaves ortgpu's process as the plain bench has it. To measure which disturbs less: run the same models with
``--torch-process same`` and ``--torch-process child`` alternately, three times each, and compare each arm's p50;
for ortgpu's baseline without torch anywhere, add ``--save-onnx DIR`` and run ``python -m bench --model
DIR/FILE.onnx --capture on`` (its ``ortgpu capture on end_to_end`` p50 is the same boundary). The mode whose p50s
sit lower and closer to the baseline disturbs less.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from .architectures import is_architecture, packages_for, parse_architecture

__all__ = [
    "ORTGPU_ARM",
    "ORTGPU_UNCAPTURED_ARM",
    "GRAPH_ARM",
    "EAGER_ARM",
    "RELATIVE_ERROR",
    "add_arguments",
    "relative_error",
    "worst_relative_error",
    "round_sizes",
    "interleave",
    "missing_packages",
    "run",
]

ORTGPU_ARM = "ortgpu captured"
ORTGPU_UNCAPTURED_ARM = "ortgpu uncaptured (capture refused)"
GRAPH_ARM = "torch CUDA graph"
EAGER_ARM = "torch eager"
RELATIVE_ERROR = "max|a - b| / max(max|b|, tiny), tiny = smallest normal float32, worst over the outputs"
BOUNDARY = "inputs host -> fixed device memory, the model, outputs device -> host, until the host has them"
#: Untimed steps each arm runs at the start of its block in every round (the other arms ran in between).
ROUND_WARMUP = 2
#: ortgpu's captured replay against its uncaptured run (the bench's own check).
CAPTURE_TOLERANCE = 1e-6
#: The tolerances' defaults per --dtype: (ortgpu vs onnxruntime CPU, ortgpu vs torch). In float16 every engine
#: rounds its sums and intermediates differently, so they are compared at half precision's scale.
DEFAULT_TOLERANCES = {"float32": (1e-4, 1e-3), "float16": (1e-2, 1e-2)}
#: --dtype float16: the largest relative error of ortgpu's float16 outputs against the float32 module's (issue
#: 37's bound); a model beyond it is timed and reported but left out of the geometric means.
FP32_REFERENCE_TOLERANCE = 1e-2
_TINY = float(np.finfo(np.float32).tiny)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``--vs torch`` and ``--zoo`` (``--vs torch`` itself is a choice of the bench's ``--vs``)."""
    group = parser.add_argument_group("--vs torch and --zoo (see bench/vs_torch.py)")
    group.add_argument(
        "--zoo",
        default=None,
        metavar="NAMES",
        help="compare with torch on several architectures, each in its own child process, and print one table: "
        "comma-separated SOURCE:NAME names or 'default' (implies --vs torch)",
    )
    group.add_argument(
        "--torch-process",
        choices=("child", "same"),
        default="child",
        help="where torch's arms run: a child process (default) or the bench's own process",
    )
    group.add_argument("--rounds", type=int, default=10, help="rounds the timed iterations are interleaved in")
    group.add_argument(
        "--exporter",
        choices=("auto", "torchscript", "dynamo"),
        default="auto",
        help="torch.onnx.export with dynamo=False (auto: unless this torch lacks it) or dynamo=True",
    )
    group.add_argument("--opset", type=int, default=17, help="ONNX opset of the export (dynamo: at least 18)")
    group.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the weights and the inputs")
    group.add_argument(
        "--torch-device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu only checks the pipeline on a machine without CUDA (no CUDA graph arm; not a comparison)",
    )
    group.add_argument("--save-onnx", default=None, metavar="DIR", help="keep the exported .onnx files in DIR")
    group.add_argument(
        "--ort-tolerance",
        type=float,
        default=None,
        help="ortgpu vs onnxruntime CPU, relative (default 1e-4; with --dtype float16 1e-2)",
    )
    group.add_argument(
        "--torch-tolerance",
        type=float,
        default=None,
        help="ortgpu vs torch's outputs, relative (default 1e-3; with --dtype float16 1e-2)",
    )
    group.add_argument("--zoo-timeout", type=float, default=1800.0, help="seconds one --zoo model may take")


def relative_error(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    """``max|a - b| / max(max|b|, tiny)`` of one output against its reference ``b`` (see the module docstring)."""
    if a.shape != b.shape:
        return math.inf
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    finite = np.isfinite(y)
    if not np.array_equal(np.isfinite(x), finite) or not np.array_equal(x[~finite], y[~finite], equal_nan=True):
        return math.inf
    if not finite.any():
        return 0.0
    scale = max(float(np.max(np.abs(y[finite]))), _TINY)
    return float(np.max(np.abs(x[finite] - y[finite]))) / scale


def worst_relative_error(a: list[npt.NDArray[Any]], b: list[npt.NDArray[Any]]) -> float:
    """The worst :func:`relative_error` over the outputs; inf where their number differs."""
    if len(a) != len(b):
        return math.inf
    return max((relative_error(x, y) for x, y in zip(a, b)), default=0.0)


def round_sizes(iterations: int, rounds: int) -> list[int]:
    """``iterations`` split over ``rounds`` as evenly as possible, the larger shares first; empty rounds dropped."""
    if iterations < 0 or rounds < 1:
        raise ValueError(f"need iterations >= 0 and rounds >= 1, not {iterations} and {rounds}")
    base, extra = divmod(iterations, rounds)
    return [size for size in (base + (1 if r < extra else 0) for r in range(rounds)) if size]


def interleave(
    timers: dict[str, Callable[[int, int], list[float]]],
    warmup: int,
    iterations: int,
    rounds: int,
    report: Callable[[int, int], None] | None = None,
) -> dict[str, list[float]]:
    """Time the arms in rounds. ``timers[arm](warmup, count)`` runs ``warmup`` untimed steps, then ``count`` timed
    ones, and returns their seconds. First every arm's ``warmup``; then per round, every arm (the order rotating by
    one each round) gets :data:`ROUND_WARMUP` untimed steps and its share of ``iterations``."""
    names = list(timers)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for name in names:
        timers[name](warmup, 0)
    sizes = round_sizes(iterations, rounds)
    for index, size in enumerate(sizes):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            seconds[name] += timers[name](ROUND_WARMUP, size)
        if report is not None:
            report(index, len(sizes))
    return seconds


def missing_packages(names: list[str]) -> list[str]:
    """What ``--vs torch`` on ``names`` needs and cannot import here: torch, the names' sources, onnxruntime."""
    return [p for p in [*packages_for(names), "onnxruntime"] if importlib.util.find_spec(p) is None]


def _summary(values: list[float]) -> dict[str, Any]:
    array = np.asarray(values)
    return {
        "p50_ms": float(np.percentile(array, 50)) * 1e3,
        "p90_ms": float(np.percentile(array, 90)) * 1e3,
        "p99_ms": float(np.percentile(array, 99)) * 1e3,
        "iterations": len(values),
        "raw_s": values,
    }


def onnx_file_name(name: str, batch: int) -> str:
    """The exported file's name for architecture ``name`` at ``batch`` (``torchvision:vit_b_16`` ->
    ``torchvision_vit_b_16_b1.onnx``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + f"_b{batch}.onnx"


def _placement(session: Any, feeds: dict[str, npt.NDArray[Any]]) -> dict[str, Any]:
    try:
        values = {name: feeds[name] for name in session.value_deciding_inputs if name in feeds}
        shapes = {name: value.shape for name, value in feeds.items()}
        rows = session.get_node_placement(shapes, input_values=values or None)
    except Exception as error:  # report it; the run itself says the rest
        return {"error": f"{type(error).__name__}: {error}"}
    cpu = [row for row in rows if row.placement != "webgpu"]
    return {
        "nodes": len(rows),
        "on_cpu": len(cpu),
        "all_on_gpu": not cpu,
        "cpu_nodes": [f"{row.node} ({row.op_type}): {row.reason}" for row in cpu[:20]],
    }


def placement_text(placement: dict[str, Any]) -> str:
    """``"all N planned nodes on the GPU"``, ``"K of N planned nodes on the CPU"`` (nodes as ortgpu plans them,
    after its fusions), or the error that kept it from being known."""
    if "error" in placement:
        return f"unknown ({placement['error']})"
    if placement.get("all_on_gpu"):
        return f"all {placement['nodes']} planned nodes on the GPU"
    return f"{placement['on_cpu']} of {placement['nodes']} planned nodes on the CPU"


def _onnxruntime_cpu(model_bytes: bytes, feeds: dict[str, npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
    ort = importlib.import_module("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(model_bytes, sess_options=options, providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _check(detail: dict[str, Any], problems: list[str], label: str, value: float, tolerance: float) -> bool:
    detail["rel_err"][label] = value
    if value <= tolerance:  # NaN fails too
        return True
    problems.append(f"{label}: relative error {value:.2e} > {tolerance:g}")
    return False


def _measure(args: argparse.Namespace, env: Any, side: Any, path: str, detail: dict[str, Any]) -> None:
    """Fill ``detail`` for ``args.model``; model failures go to ``detail["problems"]``, not exceptions."""
    import onnx

    import ortgpu

    from .harness import OrtgpuArms, time_loop

    problems: list[str] = detail["problems"]
    info = side.prepare(
        name=args.model,
        batch=args.batch,
        seed=args.seed,
        exporter=args.exporter,
        opset=args.opset,
        onnx_path=path,
        device=args.torch_device,
        dtype=args.dtype,
    )
    detail["torch"] = {k: info.get(k) for k in ("settings", "versions", "notes", "exporter", "graph_mode")}
    for stage in ("build", "export"):
        if f"{stage}_error" in info:
            problems.append(f"{stage} failed: {info[f'{stage}_error']}")
            detail[f"{stage}_traceback"] = info.get(f"{stage}_traceback")
            return
    model_bytes = Path(path).read_bytes()
    model = onnx.load_from_string(model_bytes)
    initializers = {tensor.name for tensor in model.graph.initializer}
    feeds = {i.name: info["inputs"][i.name] for i in model.graph.input if i.name not in initializers}
    detail["onnx"] = {
        "exporter": info["exporter"],
        "opset": max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None),
        "nodes": len(model.graph.node),
        "bytes": len(model_bytes),
        "inputs": {name: [list(value.shape), str(value.dtype)] for name, value in feeds.items()},
    }
    del model
    torch_eager = side.outputs("eager")
    torch_graph = side.outputs("graph") if info.get("graph_mode") else None
    if torch_graph is None:
        detail["torch"]["graph_errors"] = info.get("graph_errors")
        errors = info.get("graph_errors") or {}
        problems.append("torch CUDA graph failed: " + "; ".join(f"{mode}: {why}" for mode, why in errors.items()))
    try:
        arms = OrtgpuArms(model_bytes, feeds, env)
    except Exception as error:
        problems.append(f"ortgpu load failed: {type(error).__name__}: {error}")
        return
    try:
        detail["placement"] = _placement(arms.session, feeds)
        uncaptured = arms.uncaptured_end_to_end(keep=True)
        captured = None
        try:
            detail["dispatches"] = arms.capture().dispatch_count
            captured = arms.captured_end_to_end(keep=True)
        except ortgpu.CaptureStateError as error:  # a documented refusal: time the uncaptured run, say so
            detail["capture_refused"] = str(error)
            problems.append(f"ortgpu capture refused: {error}")
        detail["ortgpu_arm"] = ORTGPU_ARM if captured is not None else ORTGPU_UNCAPTURED_ARM
        ours = captured if captured is not None else uncaptured
        detail["rel_err"] = {}
        correct = True
        if not any(np.any(output != 0) for output in torch_eager):
            problems.append("torch's output is all zeros: comparing with it would prove nothing")
            correct = False
        if captured is not None:
            value = worst_relative_error(captured, uncaptured)
            correct &= _check(detail, problems, "ortgpu captured vs uncaptured", value, CAPTURE_TOLERANCE)
        try:
            reference = _onnxruntime_cpu(model_bytes, feeds)
        except Exception as error:
            if args.dtype == "float32":
                problems.append(f"onnxruntime CPU failed: {type(error).__name__}: {error}")
                return
            # onnxruntime CPU lacks float16 kernels of some operators: torch's float16 and float32 outputs still
            # check ortgpu's, so the model is timed and the gap is said
            detail["onnxruntime_cpu_error"] = f"{type(error).__name__}: {str(error)[:300]}"
            reference = None
        if reference is not None:
            value = worst_relative_error(ours, reference)
            correct &= _check(detail, problems, "ortgpu vs onnxruntime CPU", value, args.ort_tolerance)
            detail["rel_err"]["onnxruntime CPU vs torch eager"] = worst_relative_error(reference, torch_eager)
            del reference
        value = worst_relative_error(ours, torch_eager)
        correct &= _check(detail, problems, "ortgpu vs torch eager", value, args.torch_tolerance)
        if torch_graph is not None:
            value = worst_relative_error(ours, torch_graph)
            correct &= _check(detail, problems, "ortgpu vs torch CUDA graph", value, args.torch_tolerance)
            detail["rel_err"]["torch CUDA graph vs eager"] = worst_relative_error(torch_graph, torch_eager)
        if not correct:
            detail["timed"] = False
            return
        step = arms.captured_end_to_end if captured is not None else arms.uncaptured_end_to_end
        timers: dict[str, Callable[[int, int], list[float]]] = {
            detail["ortgpu_arm"]: lambda warmup, count: time_loop(step, warmup, count)
        }
        if torch_graph is not None:
            timers[GRAPH_ARM] = lambda warmup, count: side.time("graph", warmup, count)
        timers[EAGER_ARM] = lambda warmup, count: side.time("eager", warmup, count)

        def report(index: int, total: int) -> None:
            print(f"\r  {args.model}: round {index + 1}/{total}", end="\n" if index + 1 == total else "", flush=True)

        seconds = interleave(timers, args.warmup, args.iterations, args.rounds, report)
        detail["timed"] = True
        detail["results"] = {arm: _summary(values) for arm, values in seconds.items()}
        if "fp32_outputs" in info:  # judged after timing: half precision's cost is reported, not a reason to skip
            fp32 = [np.asarray(output) for output in info["fp32_outputs"]]
            detail["rel_err"]["torch float16 vs the float32 module"] = worst_relative_error(torch_eager, fp32)
            value = worst_relative_error(ours, fp32)
            _check(detail, problems, "ortgpu vs the float32 module", value, FP32_REFERENCE_TOLERANCE)
    finally:
        arms.close()


def summary_row(detail: dict[str, Any]) -> dict[str, Any]:
    """The table's row for one model's ``detail``: p50s, ratios (torch / ortgpu), relative errors, status
    (``"ok"`` or what went wrong), and ``in_mean``: whether the ratios enter the geometric means (everything ran,
    captured, and agreed)."""
    problems: list[str] = detail.get("problems", [])
    results = detail.get("results", {})
    ours = results.get(ORTGPU_ARM, {}).get("p50_ms")
    graph = results.get(GRAPH_ARM, {}).get("p50_ms")
    eager = results.get(EAGER_ARM, {}).get("p50_ms")
    errors = detail.get("rel_err", {})
    versus_torch = [v for k, v in errors.items() if k.startswith("ortgpu vs torch")]
    return {
        "model": detail["model"],
        "batch": detail["batch"],
        "status": "ok" if not problems else "; ".join(problems),
        "in_mean": not problems and None not in (ours, graph, eager),
        "ortgpu_p50_ms": ours if ours is not None else results.get(ORTGPU_UNCAPTURED_ARM, {}).get("p50_ms"),
        "ortgpu_arm": detail.get("ortgpu_arm"),
        "dispatches": detail.get("dispatches"),
        "torch_graph_p50_ms": graph,
        "torch_eager_p50_ms": eager,
        "graph_over_ortgpu": graph / ours if graph and ours else None,
        "eager_over_ortgpu": eager / ours if eager and ours else None,
        "rel_err_vs_ort_cpu": errors.get("ortgpu vs onnxruntime CPU"),
        "rel_err_vs_torch": max(versus_torch) if versus_torch else None,
        "rel_err_vs_fp32": errors.get("ortgpu vs the float32 module"),
        "dtype": detail.get("dtype", "float32"),
        "placement": placement_text(detail["placement"]) if "placement" in detail else None,
        "graph_mode": detail.get("torch", {}).get("graph_mode"),
    }


def measure_model(args: argparse.Namespace, env: Any) -> dict[str, Any]:
    """Everything about ``args.model``: torch side, export, ortgpu, correctness, timings; ``summary`` its row."""
    from .torch_arms import ChildTorch, TorchSide, TorchSideError

    detail: dict[str, Any] = {"model": args.model, "batch": args.batch, "dtype": args.dtype, "problems": []}
    side: Any = TorchSide() if args.torch_process == "same" else ChildTorch()
    directory = args.save_onnx or tempfile.mkdtemp(prefix="ortgpu-vs-torch-")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, onnx_file_name(args.model, args.batch))
    try:
        _measure(args, env, side, path, detail)
    except TorchSideError as error:  # the torch side broke (or its child died): a failed row, the trace kept
        lines = str(error).strip().splitlines()
        detail["problems"].append(f"torch side failed: {lines[-1] if lines else 'no message'}")
        detail["torch_side_error"] = str(error)
    finally:
        side.close()
        if args.save_onnx:
            detail["onnx_path"] = path
        else:
            shutil.rmtree(directory, ignore_errors=True)
    detail["summary"] = summary_row(detail)
    return detail


def check_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """Validate the ``--vs torch`` / ``--zoo`` options (``parser.error`` on a mistake); returns the model names."""
    from .zoo import zoo_names

    if args.zoo is not None and args.vs not in (None, "torch"):
        parser.error("--zoo compares with torch: leave out --vs or give --vs torch")
    others = {
        "--threads": args.threads is not None,
        "--profile-overhead": args.profile_overhead,
        "--overhead": args.overhead or args.overhead_only,
        "--plot": args.plot is not None,
        "--capture": args.capture != "both",
        "--peer-cpu": args.peer_cpu != "auto",
        "--seconds": args.seconds is not None,
        "--gpu-under-load": args.gpu_under_load,
    }
    given = [flag for flag, on in others.items() if on]
    if given:
        parser.error(f"--vs torch times ortgpu's captured replay against torch: leave out {', '.join(given)}")
    if args.iterations < 1 or args.warmup < 0 or args.rounds < 1 or args.batch < 1:
        parser.error("--iterations, --rounds and --batch must be at least 1, --warmup at least 0")
    ort_default, torch_default = DEFAULT_TOLERANCES[args.dtype]
    args.ort_tolerance = ort_default if args.ort_tolerance is None else args.ort_tolerance
    args.torch_tolerance = torch_default if args.torch_tolerance is None else args.torch_tolerance
    try:
        if args.zoo is not None:
            return zoo_names(args.zoo)
        if not is_architecture(args.model):
            parser.error(
                f"--vs torch needs --model SOURCE:NAME (torchvision:, timm: or transformers:), not {args.model!r}"
            )
        parse_architecture(args.model)
    except ValueError as error:
        parser.error(str(error))
    return [args.model]


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """``--vs torch`` or ``--zoo``: 2 (and what to install) when torch or another package is missing, else 0 when
    every model ran, was captured and agreed, 1 otherwise."""
    names = check_arguments(args, parser)
    missing = missing_packages(names)
    if missing:
        print(
            f"--vs torch needs {', '.join(missing)}, which cannot be imported here: pip install {' '.join(missing)}",
            file=sys.stderr,
        )
        return 2
    if args.zoo is not None:
        from .zoo import run_zoo

        return run_zoo(args, names, argv)
    from .zoo import run_one

    return run_one(args, argv)
