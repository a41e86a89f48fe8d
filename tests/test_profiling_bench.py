"""``python -m bench --profile-overhead`` and the GPU ceiling of ``--threads`` (issue 15), on both backends: the
numbers are reported and consistent; nothing here asserts a time (the targets are for the H200)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

import bench.__main__ as bench_main
from bench.models import mlp
from ortgpu._profiling import DEFAULT_DETAIL_EVERY, RING_SLOTS


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("bench_profiling") / "mlp.onnx"
    onnx.save(mlp(layers=2, width=64), str(path))
    return str(path)


def test_profile_overhead_reports_off_on_and_gpu_time(
    backend_name: str, model_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "out.json"
    argv = ["--model", model_path, "--backend", backend_name, "--iterations", "6", "--warmup", "1"]
    assert bench_main.main([*argv, "--profile-overhead", "--json", str(json_path)]) == 0
    out = capsys.readouterr().out
    assert "profiling overhead (profiling timing: gpu-timestamps)" in out and "on/off" in out
    part = json.loads(json_path.read_text())["profile_overhead"]
    assert part["timing"] == "gpu-timestamps"
    for step in ("replay + to_numpy", "replay_and_read"):
        row = part[step]
        assert row["iterations"] == 6 and row["p50_off_s"] > 0 and row["p50_on_s"] > 0
        assert row["ratio_on_off"] == pytest.approx(row["p50_on_s"] / row["p50_off_s"])
        assert row["mean_ratio_on_off"] == pytest.approx(row["mean_on_s"] / row["mean_off_s"])
    # every profiled replay of the on arm was timed on the GPU: checks, warm-up and the timed iterations
    # the record's start-up (a check, then two turns of the ring), then 18 profiled replays (2 steps x (1 warm-up +
    # 2 checks + 6 timed)); the first and every DEFAULT_DETAIL_EVERY-th are timed per step, the GPU time per replay
    # comes from those timed whole
    startup = part["startup"]
    assert startup["replays"] == 2 * RING_SLOTS and startup["mean_ratio_on_off"] > 0
    assert "record start-up" in out
    profiled = 1 + startup["replays"] + 2 * (2 + 1 + 6)
    per_step = len(range(0, profiled, DEFAULT_DETAIL_EVERY))
    assert part["replays_timed_on_gpu"] == profiled - per_step and part["gpu_time_per_replay_s"] > 0
    assert not list(tmp_path.glob("*profile*"))  # the traces went to a temporary folder, now gone


def test_profile_overhead_refuses_other_modes(model_path: str) -> None:
    with pytest.raises(SystemExit):
        bench_main.main(["--model", model_path, "--backend", "fake", "--profile-overhead", "--threads", "1"])


def test_threads_reports_the_gpu_ceiling(backend_name: str, model_path: str, tmp_path: Path) -> None:
    json_path = tmp_path / "out.json"
    argv = ["--model", model_path, "--backend", backend_name, "--iterations", "4", "--warmup", "1"]
    assert bench_main.main([*argv, "--threads", "1,2", "--capture", "on", "--json", str(json_path)]) == 0
    part = json.loads(json_path.read_text())["threads"]
    ceiling = part["gpu_ceiling"]
    assert ceiling["gpu_time_per_replay_s"] > 0
    assert ceiling["ceiling_per_s"] == pytest.approx(1 / ceiling["gpu_time_per_replay_s"])
    throughput = {(r["threads"], r["boundary"]): r["throughput_per_s"] for r in part["results"]}
    # every boundary the captured arm ran (bench/threads.py: end_to_end, run_only and replay_and_read)
    assert set(ceiling["fraction"]) == {"end_to_end", "run_only", "replay_and_read"}
    for boundary, by_k in ceiling["fraction"].items():
        assert set(by_k) == {"1", "2"}
        for k, fraction in by_k.items():
            assert fraction == pytest.approx(throughput[(int(k), boundary)] / ceiling["ceiling_per_s"])
