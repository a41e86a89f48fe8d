"""``python -m bench --zoo NAMES``: ``--vs torch`` on several architectures, each in its own child process (its own
GPU memory, its own failures), then one table and the geometric means of the ratios.

Each model runs as ``python -m bench --vs torch --model NAME ... --json FILE`` with the zoo's own options; its
output is shown as it comes, prefixed with the model's name, and its JSON report read back. A model that fails
(build, export, ortgpu load or capture, torch's CUDA graph, correctness, a crash or ``--zoo-timeout``) keeps a
row that says why and is left out of the geometric means; the bench prints how many did. ``--json PATH`` writes
every model's report, the rows and the means.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from .architectures import DEFAULT_ZOO, parse_architecture

__all__ = ["zoo_names", "geometric_mean", "means", "format_table", "format_means", "child_argv", "run_zoo", "run_one"]

#: Lines of a failed child's output kept for its row.
TAIL_LINES = 20


def zoo_names(text: str) -> list[str]:
    """The architectures of ``--zoo``: comma-separated names, ``default`` standing for :data:`DEFAULT_ZOO`;
    duplicates dropped (first one kept); ValueError for an empty list or a name that does not parse."""
    names: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        for name in DEFAULT_ZOO if part == "default" else (part,):
            parse_architecture(name)
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError(f"--zoo {text!r} names no architecture (comma-separated SOURCE:NAME names, or 'default')")
    return names


def geometric_mean(values: list[float]) -> float:
    """``exp(mean(log(v)))``; NaN for no values; ValueError for a value that is not positive and finite."""
    if not values:
        return math.nan
    bad = [v for v in values if not (v > 0 and math.isfinite(v))]
    if bad:
        raise ValueError(f"a geometric mean of ratios needs positive finite values, not {bad}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def means(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The geometric means of both ratios over the rows ``in_mean``, and the rows left out (with why)."""
    kept = [row for row in rows if row.get("in_mean")]
    return {
        "graph_over_ortgpu": geometric_mean([row["graph_over_ortgpu"] for row in kept]),
        "eager_over_ortgpu": geometric_mean([row["eager_over_ortgpu"] for row in kept]),
        "models_in_means": len(kept),
        "left_out": {row["model"]: row["status"] for row in rows if not row.get("in_mean")},
    }


def _number(value: Any, form: str) -> str:
    return "-" if value is None else format(value, form)


COLUMNS: tuple[tuple[str, int, Callable[[dict[str, Any]], str]], ...] = (
    ("model", 34, lambda r: r["model"]),
    ("batch", 5, lambda r: str(r["batch"])),
    ("ortgpu p50 ms", 13, lambda r: _number(r.get("ortgpu_p50_ms"), ".3f")),
    ("graph p50 ms", 12, lambda r: _number(r.get("torch_graph_p50_ms"), ".3f")),
    ("eager p50 ms", 12, lambda r: _number(r.get("torch_eager_p50_ms"), ".3f")),
    ("graph/ortgpu", 12, lambda r: _number(r.get("graph_over_ortgpu"), ".2f")),
    ("eager/ortgpu", 12, lambda r: _number(r.get("eager_over_ortgpu"), ".2f")),
    ("err vs ORT", 10, lambda r: _number(r.get("rel_err_vs_ort_cpu"), ".1e")),
    ("err vs torch", 12, lambda r: _number(r.get("rel_err_vs_torch"), ".1e")),
    ("err vs fp32", 11, lambda r: _number(r.get("rel_err_vs_fp32"), ".1e")),
    ("dispatches", 10, lambda r: _number(r.get("dispatches"), "d")),
)
#: Characters of a failed row's reason shown in the table (the full text follows it).
STATUS_WIDTH = 60


def format_table(rows: list[dict[str, Any]]) -> str:
    """One line per row (p50s in ms; ratios torch / ortgpu, above 1 when ortgpu is faster; relative errors of
    ortgpu's outputs; ``-`` where there is no value), then a status column: ``ok`` or the start of the reason."""
    header = " ".join(
        f"{title:>{width}s}" if index else f"{title:{width}s}" for index, (title, width, _) in enumerate(COLUMNS)
    )
    lines = [f"{header} status"]
    for row in rows:
        cells = [
            f"{cell(row):>{width}s}" if index else f"{cell(row):{width}s}"
            for index, (_, width, cell) in enumerate(COLUMNS)
        ]
        status = row["status"]
        if len(status) > STATUS_WIDTH:
            status = status[: STATUS_WIDTH - 3] + "..."
        lines.append(" ".join(cells) + " " + status)
    return "\n".join(lines)


def format_means(rows: list[dict[str, Any]]) -> str:
    """The geometric means (over the rows in them) and the rows left out, each with its full reason."""
    summary = means(rows)
    count = summary["models_in_means"]
    if count:
        text = (
            f"geometric mean over {count} model{'s' if count != 1 else ''}: torch CUDA graph / ortgpu "
            f"{summary['graph_over_ortgpu']:.2f}x, torch eager / ortgpu {summary['eager_over_ortgpu']:.2f}x "
            "(above 1: ortgpu faster)"
        )
    else:
        text = "geometric mean: no model ran through (see below)"
    left_out = summary["left_out"]
    lines = [text, f"{len(left_out)} of {len(rows)} models failed and are left out of the geometric means"]
    lines += [f"  {model}: {why}" for model, why in left_out.items()]
    return "\n".join(lines)


_PASSED = ("batch", "iterations", "warmup", "rounds", "torch_process", "exporter", "opset", "seed", "backend", "dtype")
_PASSED_FLOATS = ("ort_tolerance", "torch_tolerance")


def child_argv(args: argparse.Namespace, name: str, json_path: str) -> list[str]:
    """The command one zoo model runs: this Python, ``-m bench --vs torch --model NAME``, the zoo's options."""
    argv = [sys.executable, "-m", "bench", "--vs", "torch", "--model", name]
    for key in (*_PASSED, *_PASSED_FLOATS, "torch_device"):
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    if args.save_onnx:
        argv += ["--save-onnx", args.save_onnx]
    return [*argv, "--json", json_path]


def _failed_row(name: str, batch: int, why: str) -> dict[str, Any]:
    return {"model": name, "batch": batch, "status": why, "in_mean": False}


def _run_child(args: argparse.Namespace, name: str, directory: str) -> tuple[dict[str, Any] | None, str | None]:
    """Run one model's child; its report, or None and why there is none."""
    json_path = os.path.join(directory, f"{len(os.listdir(directory))}.json")
    command = child_argv(args, name, json_path)
    root = Path(__file__).resolve().parent.parent
    process = subprocess.Popen(
        command,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group: a timeout ends the torch child with it
    )
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(args.zoo_timeout, stop)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            print(f"[{name}] {line}", end="", flush=True)
            tail.append(line.rstrip())
        code = process.wait()
    finally:
        timer.cancel()
    if timed_out.is_set():
        return None, f"timed out after {args.zoo_timeout:g} s"
    try:
        with open(json_path) as handle:
            return json.load(handle), None
    except (OSError, ValueError):
        last = next((line for line in reversed(tail) if line.strip()), "no output")
        return None, f"exited with code {code} without a report: {last.strip()}"


def run_zoo(args: argparse.Namespace, names: list[str], argv: list[str] | None) -> int:
    """Every model in its own child; the table, the means; 0 when every model is in the means, else 1."""
    rows: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ortgpu-zoo-") as directory:
        for index, name in enumerate(names):
            print(f"\n=== {index + 1}/{len(names)} {name}, batch {args.batch}", flush=True)
            report, why = _run_child(args, name, directory)
            if report is None or "vs_torch" not in report:
                rows.append(_failed_row(name, args.batch, why or "the report has no vs_torch section"))
                reports.append({"model": name, "error": rows[-1]["status"]})
                continue
            reports.append(report)
            rows.append(report["vs_torch"]["summary"])
    first = next((r for r in reports if "adapter" in r), {})
    print(f"\nadapter: {first.get('adapter', {}).get('name', 'unknown')}; versions: {first.get('versions', {})}")
    print(f"boundary: {_boundary()}; relative error: {_metric()}")
    print(f"{args.iterations} timed iterations per arm in {args.rounds} interleaved rounds after {args.warmup} warm-up")
    if args.dtype == "float16":
        print(
            "float16: torch runs module.half() (tensor cores allowed), ortgpu its ONNX export; err vs fp32: ortgpu's "
            "outputs against the float32 module's"
        )
    print(format_table(rows))
    print(format_means(rows))
    if args.json_path:
        everything = {
            "command": _command(argv),
            "adapter": first.get("adapter"),
            "versions": first.get("versions"),
            "rows": rows,
            "means": means(rows),
            "models": reports,
        }
        _write(args.json_path, everything)
    return 0 if all(row.get("in_mean") for row in rows) else 1


def _boundary() -> str:
    from .vs_torch import BOUNDARY

    return BOUNDARY


def _metric() -> str:
    from .vs_torch import RELATIVE_ERROR

    return RELATIVE_ERROR


def _command(argv: list[str] | None) -> str:
    return shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])])


def _write(path: str, report: dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(report, handle, indent=1, default=str)
    print(f"wrote {path}")


def run_one(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``--vs torch`` on ``args.model`` in this process (torch in a child unless ``--torch-process same``)."""
    import numpy as np

    import ortgpu

    from .vs_torch import BOUNDARY, RELATIVE_ERROR, measure_model

    env = ortgpu.Env(backend=args.backend)
    try:
        device = env.default_device
        adapter = {"name": device.name, "backend": device.backend_type, "driver": device.driver}
        print(f"adapter: {device.name} ({device.backend_type}, {device.adapter_type}), driver {device.driver}")
        print(f"boundary: {BOUNDARY}")
        detail = measure_model(args, env)
    finally:
        env.close()
    versions = {"ortgpu": ortgpu.__version__, "python": platform.python_version(), "numpy": np.__version__}
    for package in ("onnxruntime", "wgpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        from ortgpu_core.backends.wgpu_native import native_version

        versions["wgpu-native"] = native_version()
    except Exception:  # no wgpu-native here (fake backend only)
        pass
    versions.update((detail.get("torch") or {}).get("versions") or {})
    row = detail["summary"]
    torch_info = detail.get("torch") or {}
    onnx_info = detail.get("onnx") or {}
    notes = ", ".join(f"{key}: {value}" for key, value in (torch_info.get("notes") or {}).items())
    print(f"\nmodel {args.model}, batch {args.batch}" + (f" ({notes})" if notes else ""))
    if onnx_info:
        print(
            f"export: {onnx_info['exporter']} exporter, opset {onnx_info['opset']}, {onnx_info['nodes']} nodes, "
            f"{onnx_info['bytes'] / 1e6:.1f} MB; torch CUDA graph of the {torch_info.get('graph_mode') or '-'}"
        )
    if "placement" in detail:
        print(f"placement: {row['placement']}; ortgpu arm: {detail.get('ortgpu_arm')}")
        for node in detail["placement"].get("cpu_nodes", []):
            print(f"  on the CPU: {node}")
    if "capture_refused" in detail:
        print(f"ortgpu capture on: refused ({detail['capture_refused']}); its uncaptured run is timed instead")
    for label, value in detail.get("rel_err", {}).items():
        print(f"relative error {label}: {value:.2e}")
    print(f"(relative error: {RELATIVE_ERROR})")
    for arm, result in detail.get("results", {}).items():
        print(f"{arm:40s} p50 {result['p50_ms']:9.3f} ms  p90 {result['p90_ms']:9.3f}  p99 {result['p99_ms']:9.3f}")
    print(format_table([row]))
    if row["status"] != "ok":
        print(f"not ok: {row['status']}")
    if args.json_path:
        settings = {key: getattr(args, key) for key in (*_PASSED, *_PASSED_FLOATS, "torch_device")}
        report = {
            "command": _command(argv),
            "adapter": adapter,
            "versions": versions,
            "boundary": BOUNDARY,
            "relative_error": RELATIVE_ERROR,
            "settings": settings,
            "vs_torch": detail,
        }
        _write(args.json_path, report)
    return 0 if row.get("in_mean") else 1
