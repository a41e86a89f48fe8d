"""``python -m bench --vs torch`` and ``--zoo``: everything that runs without PyTorch.

The argument checks and the exit code 2 (with what to install) where torch is missing; the architecture names
and their parsing; the relative-error metric at its edges; rounds and their interleaving; the geometric mean, the
table and the rows left out of the means; the zoo's child processes (a crash, a timeout, the report read back);
the torch side's request protocol; and the whole measurement of one model with a stand-in torch side (an ONNX
file it writes, onnxruntime's outputs as "torch's"), on both backends: correctness gates the timing, capture,
placement, the row.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

import ortgpu
from bench import __main__ as bench_main
from bench import architectures, torch_arms, vs_torch, zoo
from bench.architectures import DEFAULT_ZOO, PRESETS, TEXT_SEQ, is_architecture, packages_for, parse_architecture
from bench.half import half_feeds, to_float16
from bench.models import mlp, random_feeds
from bench.vs_torch import (
    EAGER_ARM,
    GRAPH_ARM,
    ORTGPU_ARM,
    ORTGPU_UNCAPTURED_ARM,
    ROUND_WARMUP,
    interleave,
    relative_error,
    round_sizes,
    summary_row,
    worst_relative_error,
)
from bench.zoo import format_means, format_table, geometric_mean, means, zoo_names

#: The packages --vs torch looks for: each counts as installed unless a test hides it.
LOOKED_FOR = ("torch", "torchvision", "timm", "transformers", "onnxruntime")


def hide_packages(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        if name in hidden:
            return None
        return object() if name in LOOKED_FOR else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def present(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every package counts as importable; returns the list the name lists asked about are appended to."""
    asked: list[list[str]] = []

    def missing(names: list[str]) -> list[str]:
        asked.append(names)
        return []

    monkeypatch.setattr(vs_torch, "missing_packages", missing)
    return asked


# -- without torch: exit code 2 and what to install ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "hidden", "install"),
    [
        ("torchvision:resnet50", ("torch", "torchvision"), "pip install torch torchvision"),
        ("transformers:bert-base", ("torch",), "pip install torch"),
        ("timm:resnet18", ("timm", "onnxruntime"), "pip install timm onnxruntime"),
    ],
)
def test_vs_torch_without_torch_exits_2_naming_what_to_install(
    model: str,
    hidden: tuple[str, ...],
    install: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hide_packages(monkeypatch, *hidden)
    assert bench_main.main(["--vs", "torch", "--model", model]) == 2
    err = capsys.readouterr().err
    assert install in err and "--vs torch needs" in err


def test_zoo_without_torch_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    hide_packages(monkeypatch, "torch", "transformers")
    assert bench_main.main(["--zoo", "torchvision:resnet50,transformers:gpt2"]) == 2
    assert "pip install torch transformers" in capsys.readouterr().err


def test_missing_packages_lists_torch_first_then_sources_then_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_packages(monkeypatch, "torch", "timm", "transformers", "torchvision", "onnxruntime")
    names = ["transformers:gpt2", "timm:resnet18", "transformers:bert-base"]
    assert vs_torch.missing_packages(names) == ["torch", "transformers", "timm", "onnxruntime"]


# -- arguments -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vs", "torch"], "--vs torch needs --model SOURCE:NAME"),
        (["--vs", "torch", "--model", "resnet"], "--vs torch needs --model SOURCE:NAME"),
        (["--vs", "torch", "--model", "transformers:nope"], "unknown transformers model 'nope'"),
        (["--vs", "torch", "--model", "keras:resnet50"], "--vs torch needs --model SOURCE:NAME"),
        (["--vs", "torch", "--model", "timm:"], "is empty or malformed"),
        (["--vs", "torch", "--model", "timm:x", "--threads", "2"], "leave out --threads"),
        (["--vs", "torch", "--model", "timm:x", "--capture", "on"], "leave out --capture"),
        (["--vs", "torch", "--model", "timm:x", "--plot", "x.png", "--overhead"], "leave out --overhead, --plot"),
        (["--vs", "torch", "--model", "timm:x", "--rounds", "0"], "--rounds and --batch must be at least 1"),
        (["--vs", "onnxruntime", "--zoo", "default"], "--zoo compares with torch"),
        (["--zoo", " , "], "names no architecture"),
        (["--zoo", "default,resnet"], "not an architecture name"),
        (["--zoo", "default", "--torch-process", "thread"], "invalid choice: 'thread'"),
    ],
)
def test_bad_arguments(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = present(monkeypatch)
    with pytest.raises(SystemExit) as raised:
        bench_main.main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
    assert not asked  # refused before anything was looked up or run


def test_vs_torch_runs_one_model_with_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = present(monkeypatch)
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(zoo, "run_one", lambda args, argv: seen.append(args) or 7)
    argv = ["--vs", "torch", "--model", "timm:resnet18", "--batch", "4", "--torch-process", "same", "--rounds", "3"]
    assert bench_main.main([*argv, "--exporter", "dynamo", "--opset", "18", "--seed", "5"]) == 7
    (args,) = seen
    assert (args.model, args.batch, args.torch_process, args.rounds) == ("timm:resnet18", 4, "same", 3)
    assert (args.exporter, args.opset, args.seed, args.torch_device) == ("dynamo", 18, 5, "cuda")
    assert (args.ort_tolerance, args.torch_tolerance) == (1e-4, 1e-3)
    assert asked == [["timm:resnet18"]]


def test_zoo_expands_default_and_drops_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    present(monkeypatch)
    seen: list[list[str]] = []
    monkeypatch.setattr(zoo, "run_zoo", lambda args, names, argv: seen.append(names) or 0)
    assert bench_main.main(["--zoo", "timm:resnet18, default ,torchvision:resnet50,timm:resnet18"]) == 0
    assert seen == [["timm:resnet18", *DEFAULT_ZOO]]
    assert args_default_process() == "child"
    assert zoo_names("default") == list(DEFAULT_ZOO)
    assert zoo_names("transformers:gpt2,,transformers:gpt2,") == ["transformers:gpt2"]
    with pytest.raises(ValueError, match="unknown transformers model"):
        zoo_names("default,transformers:gpt3")


def args_default_process() -> str:
    parser = argparse.ArgumentParser()
    vs_torch.add_arguments(parser)
    return str(parser.parse_args([]).torch_process)


# -- names -----------------------------------------------------------------------------------------------------------
def test_architecture_names_parse() -> None:
    assert parse_architecture("torchvision:vit_b_16") == ("torchvision", "vit_b_16")
    assert parse_architecture("timm:deit_small_patch16_224") == ("timm", "deit_small_patch16_224")
    assert parse_architecture("transformers:llama-small") == ("transformers", "llama-small")
    for bad in ("resnet50", "torch:resnet50", ":resnet50", "timm:", "timm: x", "timm:a:b", "transformers:llama"):
        with pytest.raises(ValueError):
            parse_architecture(bad)
    assert is_architecture("timm:x") and not is_architecture("mlp16") and not is_architecture("keras:x")


def test_the_default_zoo_covers_the_kinds_it_promises() -> None:
    assert 12 <= len(DEFAULT_ZOO) == len(set(DEFAULT_ZOO)) <= 16
    for name in DEFAULT_ZOO:
        parse_architecture(name)
    for required in (
        "torchvision:vit_b_16",
        "torchvision:resnet50",
        "transformers:bert-base",
        "transformers:llama-small",
        "transformers:whisper-tiny-encoder",
    ):
        assert required in DEFAULT_ZOO
    assert {name.partition(":")[0] for name in DEFAULT_ZOO} == set(architectures.SOURCES)
    assert packages_for(list(DEFAULT_ZOO)) == ["torch", "torchvision", "timm", "transformers"]


def test_presets_inputs() -> None:
    assert {"bert-base", "gpt2", "llama-small", "qwen2-small", "t5-small-encoder", "vit-base"} <= set(PRESETS)
    for key in ("gpt2", "llama-small", "qwen2-small", "bert-base"):  # decoders need the mask to export
        assert [spec.name for spec in PRESETS[key].inputs] == ["input_ids", "attention_mask"], key
        assert all(spec.shape == (TEXT_SEQ,) for spec in PRESETS[key].inputs), key
        assert PRESETS[key].inputs[0].fill == "ids" and PRESETS[key].inputs[0].high > 1000, key
    whisper = PRESETS["whisper-tiny-encoder"].inputs
    assert [(s.name, s.shape, s.fill) for s in whisper] == [("input_features", (80, 3000), "normal")]
    assert vs_torch.onnx_file_name("torchvision:vit_b_16", 8) == "torchvision_vit_b_16_b8.onnx"


# -- the relative error ----------------------------------------------------------------------------------------------
def test_relative_error_values_and_edges() -> None:
    f = np.float32
    assert relative_error(np.array([1, 2], f), np.array([1, 4], f)) == 0.5
    assert relative_error(np.array([-3, 0], f), np.array([-4, 1], f)) == 0.25  # scaled by max|b|, sign-blind
    zeros = np.zeros(3, f)
    assert relative_error(zeros, zeros) == 0.0
    assert relative_error(np.array([0, 1e-6, 0], f), zeros) > 1e30  # nothing is small next to an all-zero reference
    assert relative_error(np.zeros((2, 3), f), np.zeros((3, 2), f)) == math.inf
    assert relative_error(np.zeros(0, f), np.zeros(0, f)) == 0.0
    nan = np.array([np.nan, 1.0], f)
    assert relative_error(nan, nan.copy()) == 0.0  # non-finite values that match exactly
    assert relative_error(np.array([1.0, 1.0], f), nan) == math.inf
    assert relative_error(nan, np.array([1.0, 1.0], f)) == math.inf
    inf = np.array([np.inf, 2.0], f)
    assert relative_error(inf, np.array([np.inf, 1.0], f)) == 1.0
    assert relative_error(inf, np.array([-np.inf, 2.0], f)) == math.inf
    assert relative_error(np.array([np.inf], f), np.array([np.inf], f)) == 0.0
    assert relative_error(np.array([3, 5], np.int64), np.array([3, 4], np.int64)) == 0.25
    assert worst_relative_error([np.ones(2, f), np.array([1, 2], f)], [np.ones(2, f), np.array([1, 4], f)]) == 0.5
    assert worst_relative_error([np.ones(2, f)], []) == math.inf


# -- rounds ----------------------------------------------------------------------------------------------------------
def test_round_sizes() -> None:
    assert round_sizes(200, 10) == [20] * 10
    assert round_sizes(10, 4) == [3, 3, 2, 2]
    assert round_sizes(3, 5) == [1, 1, 1]
    assert sum(round_sizes(1001, 7)) == 1001
    with pytest.raises(ValueError):
        round_sizes(5, 0)


def test_interleave_warms_up_then_rotates_the_arms_each_round() -> None:
    calls: list[tuple[str, int, int]] = []

    def timer(name: str) -> Any:
        def run(warmup: int, count: int) -> list[float]:
            calls.append((name, warmup, count))
            return [float(len(calls))] * count

        return run

    reported: list[tuple[int, int]] = []
    timers = {arm: timer(arm) for arm in ("a", "b", "c")}
    seconds = interleave(timers, 5, 10, 4, lambda i, n: reported.append((i, n)))
    assert calls[:3] == [("a", 5, 0), ("b", 5, 0), ("c", 5, 0)]
    rounds = [calls[i : i + 3] for i in range(3, len(calls), 3)]
    assert [[name for name, _, _ in r] for r in rounds] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]] + [
        ["a", "b", "c"]
    ]
    assert [r[0][2] for r in rounds] == [3, 3, 2, 2]
    assert all(warmup == ROUND_WARMUP for r in rounds for _, warmup, _ in r)
    assert {arm: len(values) for arm, values in seconds.items()} == {"a": 10, "b": 10, "c": 10}
    assert reported == [(0, 4), (1, 4), (2, 4), (3, 4)]


# -- rows, means, the table ------------------------------------------------------------------------------------------
def row(model: str, ours: float | None, graph: float | None, eager: float | None, status: str = "ok") -> dict[str, Any]:
    results = {}
    for arm, value in ((ORTGPU_ARM, ours), (GRAPH_ARM, graph), (EAGER_ARM, eager)):
        if value is not None:
            results[arm] = {"p50_ms": value}
    detail = {
        "model": model,
        "batch": 1,
        "problems": [] if status == "ok" else [status],
        "results": results,
        "rel_err": {}
        if ours is None
        else {
            "ortgpu vs onnxruntime CPU": 1e-6,
            "ortgpu vs torch eager": 2e-6,
            "ortgpu vs torch CUDA graph": 3e-6,
        },
        "placement": {"nodes": 10, "on_cpu": 0, "all_on_gpu": True},
    }
    return summary_row(detail)


def test_summary_row() -> None:
    good = row("timm:a", 2.0, 3.0, 8.0)
    assert good["status"] == "ok" and good["in_mean"]
    assert (good["graph_over_ortgpu"], good["eager_over_ortgpu"]) == (1.5, 4.0)
    assert good["rel_err_vs_ort_cpu"] == 1e-6 and good["rel_err_vs_torch"] == 3e-6
    assert good["placement"] == "all 10 planned nodes on the GPU"
    no_graph = row("timm:b", 2.0, None, 8.0, "torch CUDA graph failed: x")
    assert not no_graph["in_mean"] and no_graph["graph_over_ortgpu"] is None and no_graph["eager_over_ortgpu"] == 4.0
    refused = summary_row(
        {
            "model": "timm:c",
            "batch": 2,
            "problems": ["ortgpu capture refused: a CPU node"],
            "results": {ORTGPU_UNCAPTURED_ARM: {"p50_ms": 4.0}, GRAPH_ARM: {"p50_ms": 1.0}, EAGER_ARM: {"p50_ms": 2.0}},
            "ortgpu_arm": ORTGPU_UNCAPTURED_ARM,
        }
    )
    assert refused["ortgpu_p50_ms"] == 4.0 and not refused["in_mean"] and refused["graph_over_ortgpu"] is None
    assert refused["status"] == "ortgpu capture refused: a CPU node"


def test_geometric_mean() -> None:
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([0.5, 2.0, 1.0]) == pytest.approx(1.0)
    assert math.isnan(geometric_mean([]))
    for bad in ([0.0], [1.0, -2.0], [math.inf], [math.nan]):
        with pytest.raises(ValueError):
            geometric_mean(bad)


def test_failed_rows_are_left_out_of_the_means_and_the_table_says_why() -> None:
    rows = [
        row("torchvision:resnet50", 1.0, 2.0, 4.0),
        row("transformers:gpt2", 2.0, 1.0, 1.0),
        row("timm:x", None, None, None, "export failed: UnsupportedOperatorError: aten::diff " + "x" * 80),
        row("timm:y", 1.0, 100.0, 100.0, "ortgpu capture refused: If on the CPU"),
    ]
    summary = means(rows)
    assert summary["models_in_means"] == 2
    assert summary["graph_over_ortgpu"] == pytest.approx(1.0)  # sqrt(2 * 0.5): timm:y's 100 stays out
    assert summary["eager_over_ortgpu"] == pytest.approx(math.sqrt(4 * 0.5))
    assert set(summary["left_out"]) == {"timm:x", "timm:y"}
    lines = format_table(rows).splitlines()
    assert lines[0].split()[:3] == ["model", "batch", "ortgpu"] and lines[0].endswith("status")
    assert len(lines) == 5
    assert lines[0].split()[-2:] == ["dispatches", "status"] and lines[1].split()[-2] == "-"  # no capture ran
    resnet = lines[1].split()
    assert resnet[:8] == ["torchvision:resnet50", "1", "1.000", "2.000", "4.000", "2.00", "4.00", "1.0e-06"]
    assert resnet[-1] == "ok"
    failed = lines[3]
    assert failed.split()[1:9] == ["1", "-", "-", "-", "-", "-", "-", "-"]
    assert "export failed: UnsupportedOperatorError" in failed and failed.endswith("...")
    text = format_means(rows)
    assert "geometric mean over 2 models: torch CUDA graph / ortgpu 1.00x, torch eager / ortgpu 1.41x" in text
    assert "2 of 4 models failed and are left out of the geometric means" in text
    assert "  timm:x: export failed: UnsupportedOperatorError: aten::diff " + "x" * 80 in text
    nothing = format_means([rows[2]])
    assert "no model ran through" in nothing and "1 of 1 models failed" in nothing


# -- the zoo's children ----------------------------------------------------------------------------------------------
def zoo_args(tmp_path: Path, **overrides: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    vs_torch.add_arguments(parser)
    args = parser.parse_args([])
    values = {
        "batch": 2,
        "iterations": 30,
        "warmup": 3,
        "backend": "fake",
        "json_path": None,
        "dtype": "float32",
        "ort_tolerance": 1e-4,
        "torch_tolerance": 1e-3,
        **overrides,
    }
    for key, value in values.items():
        setattr(args, key, value)
    return args


def test_child_argv_passes_the_zoo_options(tmp_path: Path) -> None:
    args = zoo_args(tmp_path, save_onnx=str(tmp_path), rounds=4, torch_process="same", ort_tolerance=2e-5)
    argv = zoo.child_argv(args, "timm:resnet18", "out.json")
    assert argv[:7] == [sys.executable, "-m", "bench", "--vs", "torch", "--model", "timm:resnet18"]
    pairs = dict(zip(argv[7::2], argv[8::2]))
    assert pairs["--batch"] == "2" and pairs["--rounds"] == "4" and pairs["--torch-process"] == "same"
    assert pairs["--iterations"] == "30" and pairs["--warmup"] == "3" and pairs["--backend"] == "fake"
    assert float(pairs["--ort-tolerance"]) == 2e-5 and pairs["--save-onnx"] == str(tmp_path)
    assert pairs["--json"] == "out.json" and pairs["--torch-device"] == "cuda"


def test_a_child_that_crashes_or_hangs_gets_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = {
        "crash": "print('loading'); print('Segmentation fault'); raise SystemExit(139)",
        "hang": "import time; time.sleep(60)",
    }
    monkeypatch.setattr(zoo, "child_argv", lambda args, name, path: [sys.executable, "-c", script[name]])
    report, why = zoo._run_child(zoo_args(tmp_path), "crash", str(tmp_path))
    assert report is None and why == "exited with code 139 without a report: Segmentation fault"
    assert "[crash] loading" in capsys.readouterr().out
    report, why = zoo._run_child(zoo_args(tmp_path, zoo_timeout=0.5), "hang", str(tmp_path))
    assert report is None and why == "timed out after 0.5 s"


def test_run_zoo_prints_the_table_and_writes_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = {
        "timm:a": {
            "adapter": {"name": "gpu"},
            "versions": {"torch": "9"},
            "vs_torch": {"summary": row("timm:a", 1.0, 3.0, 9.0)},
        },
        "timm:b": None,
    }
    monkeypatch.setattr(zoo, "_run_child", lambda args, name, directory: (reports[name], "exited with code 1"))
    path = tmp_path / "zoo.json"
    code = zoo.run_zoo(zoo_args(tmp_path, json_path=str(path)), ["timm:a", "timm:b"], ["--zoo", "timm:a,timm:b"])
    out = capsys.readouterr().out
    assert code == 1  # a model failed
    assert "geometric mean over 1 model: torch CUDA graph / ortgpu 3.00x, torch eager / ortgpu 9.00x" in out
    assert "1 of 2 models failed" in out and "timm:b: exited with code 1" in out
    written = json.loads(path.read_text())
    assert [r["model"] for r in written["rows"]] == ["timm:a", "timm:b"]
    assert written["means"]["models_in_means"] == 1 and written["adapter"] == {"name": "gpu"}
    assert written["command"] == "python -m bench --zoo timm:a,timm:b"
    reports["timm:b"] = {"vs_torch": {"summary": row("timm:b", 1.0, 1.0, 1.0)}}
    assert zoo.run_zoo(zoo_args(tmp_path), ["timm:a", "timm:b"], None) == 0


# -- the torch side's protocol ---------------------------------------------------------------------------------------
def test_serve_answers_requests_until_close() -> None:
    requests = io.BytesIO()
    for command, kwargs in (
        ("time", {"arm": "eager", "warmup": 0, "iterations": 1}),
        ("explode", {}),
        ("close", {}),
        ("time", {}),
    ):
        pickle.dump((command, kwargs), requests)
    requests.seek(0)
    replies = io.BytesIO()
    torch_arms.serve(requests, replies)
    replies.seek(0)
    answers = [pickle.load(replies) for _ in range(3)]
    assert answers[0][0] == "error" and "TorchSideError: no model prepared" in answers[0][1]
    assert answers[1][0] == "error" and "unknown command 'explode'" in answers[1][1]
    assert answers[2] == ("ok", None)
    assert replies.read() == b""  # nothing after close


# -- one model, end to end, with a stand-in torch side ---------------------------------------------------------------
def zero_model(batch: int) -> onnx.ModelProto:
    """``Y = X * 0`` over ``X [batch, 32]``: a model whose output is all zeros."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "zero"], ["Y"])],
        "zero",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 32])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, 32])],
        [numpy_helper.from_array(np.zeros(1, np.float32), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class StandInTorch:
    """Writes a small MLP where the export would go; its "torch outputs" are onnxruntime's (times ``scale``)."""

    scale = 1.0
    fp32_scale = 1.0
    zero = False
    prepared_dtype = ""
    graph_mode: str | None = "plain module"
    timed: list[tuple[str, int, int]] = []

    def prepare(
        self,
        name: str,
        batch: int,
        seed: int,
        exporter: str,
        opset: int,
        onnx_path: str,
        device: str,
        dtype: str = "float32",
    ) -> dict[str, Any]:
        """float16: the MLP converted by bench/half.py; its float32 outputs are the "float32 module's" (times
        ``fp32_scale``)."""
        model = zero_model(batch) if self.zero else mlp(layers=2, width=32, batch=batch)
        feeds = random_feeds(model, {"X": (batch, 32)})
        extra: dict[str, Any] = {}
        if dtype == "float16":
            fp32 = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            extra["fp32_outputs"] = [o * self.fp32_scale for o in fp32.run(None, feeds)]
            model, feeds = to_float16(model), half_feeds(feeds)
        onnx.save(model, onnx_path)
        self.feeds = feeds
        self.outputs_ = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"]).run(
            None, self.feeds
        )
        StandInTorch.prepared_dtype = dtype
        return {
            "inputs": self.feeds,
            "exporter": exporter,
            "graph_mode": self.graph_mode,
            "graph_errors": {"plain module": "no"},
            "settings": {},
            "versions": {"torch": "stand-in"},
            "notes": {},
            **extra,
        }

    def outputs(self, arm: str) -> list[Any]:
        return [o * self.scale for o in self.outputs_]

    def time(self, arm: str, warmup: int, iterations: int) -> list[float]:
        StandInTorch.timed.append((arm, warmup, iterations))
        return [0.002 if arm == "graph" else 0.004] * iterations

    def close(self) -> None:
        pass


def measure(
    env: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dtype: str = "float32", **stand_in: Any
) -> dict[str, Any]:
    for key, value in stand_in.items():
        monkeypatch.setattr(StandInTorch, key, value)
    monkeypatch.setattr(StandInTorch, "timed", [])
    monkeypatch.setattr(torch_arms, "TorchSide", StandInTorch)
    ort_tolerance, torch_tolerance = vs_torch.DEFAULT_TOLERANCES[dtype]
    args = zoo_args(
        tmp_path,
        model="timm:standin",
        iterations=6,
        warmup=1,
        rounds=3,
        torch_process="same",
        save_onnx=str(tmp_path),
        dtype=dtype,
        ort_tolerance=ort_tolerance,
        torch_tolerance=torch_tolerance,
    )
    return vs_torch.measure_model(args, env)


def test_one_model_is_checked_then_timed_in_rounds(
    env: ortgpu.Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    detail = measure(env, monkeypatch, tmp_path)
    assert detail["problems"] == [], detail
    assert Path(detail["onnx_path"]).name == "timm_standin_b2.onnx"
    assert detail["placement"]["all_on_gpu"] and detail["placement"]["on_cpu"] == 0
    assert detail["ortgpu_arm"] == ORTGPU_ARM
    errors = detail["rel_err"]
    assert errors["ortgpu captured vs uncaptured"] == 0.0
    assert errors["ortgpu vs onnxruntime CPU"] <= 1e-5 and errors["ortgpu vs torch eager"] <= 1e-5
    assert errors["onnxruntime CPU vs torch eager"] == 0.0
    assert set(detail["results"]) == {ORTGPU_ARM, GRAPH_ARM, EAGER_ARM}
    assert all(result["iterations"] == 6 for result in detail["results"].values())
    assert detail["results"][GRAPH_ARM]["p50_ms"] == pytest.approx(2.0)
    assert StandInTorch.timed[:2] == [("graph", 1, 0), ("eager", 1, 0)]
    assert len(StandInTorch.timed) == 2 + 2 * 3
    row = detail["summary"]
    assert row["status"] == "ok" and row["in_mean"]
    assert row["graph_over_ortgpu"] == pytest.approx(2.0 / detail["results"][ORTGPU_ARM]["p50_ms"])
    assert row["dispatches"] == detail["dispatches"] > 0  # the captured replay's, a column of the table


def test_outputs_that_differ_from_torch_are_not_timed(
    env: ortgpu.Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    detail = measure(env, monkeypatch, tmp_path, scale=1.01)
    assert detail["timed"] is False and "results" not in detail and StandInTorch.timed == []
    assert detail["rel_err"]["ortgpu vs torch eager"] == pytest.approx(0.01 / 1.01, rel=1e-3)
    assert any(p.startswith("ortgpu vs torch eager: relative error 9.9") for p in detail["problems"])
    assert not detail["summary"]["in_mean"]


def test_without_a_torch_graph_the_other_arms_are_timed(
    env: ortgpu.Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    detail = measure(env, monkeypatch, tmp_path, graph_mode=None)
    assert detail["problems"] == ["torch CUDA graph failed: plain module: no"]
    assert set(detail["results"]) == {ORTGPU_ARM, EAGER_ARM}
    row = detail["summary"]
    assert not row["in_mean"] and row["graph_over_ortgpu"] is None and row["eager_over_ortgpu"] > 0


def test_a_failed_capture_is_reported_with_what_broke_it() -> None:
    try:
        try:
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture\nsecond line")
        finally:
            raise RuntimeError("operation failed due to a previous error during capture")
    except RuntimeError as error:
        text = torch_arms._error_text(error)
    assert text == (
        "RuntimeError: operation failed due to a previous error during capture (from RuntimeError: Cannot copy "
        "between CPU and CUDA tensors during CUDA graph capture)"
    )
    assert torch_arms._error_text(ValueError()) == "ValueError: "


def test_an_all_zero_output_proves_nothing_and_is_not_timed(
    env: ortgpu.Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    detail = measure(env, monkeypatch, tmp_path, zero=True)
    assert detail["problems"] == ["torch's output is all zeros: comparing with it would prove nothing"]
    assert detail["rel_err"]["ortgpu vs onnxruntime CPU"] == 0.0  # agreeing on zeros: the check alone would pass
    assert detail["timed"] is False and StandInTorch.timed == [] and not detail["summary"]["in_mean"]


def test_float16_is_checked_against_the_float32_module_and_timed(
    env: ortgpu.Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    detail = measure(env, monkeypatch, tmp_path, dtype="float16")
    assert StandInTorch.prepared_dtype == "float16"
    assert detail["problems"] == [], detail["problems"]
    assert onnx.load(detail["onnx_path"]).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    errors = detail["rel_err"]
    assert 0 < errors["ortgpu vs the float32 module"] <= 1e-2  # half precision costs something, within the bound
    assert errors["ortgpu vs onnxruntime CPU"] <= 1e-2 and errors["ortgpu vs torch eager"] <= 1e-2
    row = detail["summary"]
    assert row["in_mean"] and row["dtype"] == "float16"
    assert row["rel_err_vs_fp32"] == errors["ortgpu vs the float32 module"]


def test_float16_beyond_the_float32_bound_is_timed_but_left_out_of_the_means(
    env: ortgpu.Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    detail = measure(env, monkeypatch, tmp_path, dtype="float16", fp32_scale=1.05)
    assert detail["timed"] is True and set(detail["results"]) == {ORTGPU_ARM, GRAPH_ARM, EAGER_ARM}
    assert len(detail["problems"]) == 1 and detail["problems"][0].startswith("ortgpu vs the float32 module")
    assert not detail["summary"]["in_mean"]


def test_float16_tolerances_default_to_half_precisions_scale_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = bench_main.build_parser()
    for argv, expected in (
        (["--vs", "torch", "--model", "timm:resnet18"], (1e-4, 1e-3)),
        (["--vs", "torch", "--model", "timm:resnet18", "--dtype", "float16"], (1e-2, 1e-2)),
        (["--vs", "torch", "--model", "timm:resnet18", "--dtype", "float16", "--ort-tolerance", "3e-3"], (3e-3, 1e-2)),
    ):
        args = parser.parse_args(argv)
        vs_torch.check_arguments(args, parser)
        assert (args.ort_tolerance, args.torch_tolerance) == expected
    argv = zoo.child_argv(args, "timm:resnet18", "x.json")
    pairs = dict(zip(argv[1:], argv[2:]))
    assert pairs["--dtype"] == "float16" and pairs["--ort-tolerance"] == "0.003"
