"""The benchmark package (``python -m bench``, ``python -m bench.profile``, ``bench.overhead``), run in process.

Each test calls a bench ``main(argv)`` on a small MLP written to a temporary
.onnx file, with few iterations, on the backend under test, and checks what
the issue asks of the bench: capture on/off arms over the same fixed device
I/O, their outputs compared before any timing is reported, the boundaries
printed, ``--vs onnxruntime``, ``--json`` (raw timings, percentiles, adapter,
versions, command line), ``--plot``, the progress display and ``--overhead``;
and ``--threads``: K threads each with its own session, started at a barrier,
their outputs checked against the single-thread reference, aggregate
throughput and per-thread p50/p99 per K.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

import ortgpu
from bench import __main__ as bench_main
from bench import overhead as bench_overhead
from bench import peer as bench_peer
from bench import profile as bench_profile
from bench import threads as bench_threads
from bench.harness import OrtgpuArms
from bench.models import mlp, random_feeds

ITERATIONS = 5
WARMUP = 1
TABLE_HEADER = re.compile(r"^arm\s+boundary\s+p50 ms\s+p90 ms\s+p99 ms\b", re.M)  # more columns may follow
ORTGPU_ARMS = {
    "off": {"ortgpu capture off/end_to_end", "ortgpu capture off/run_only", "ortgpu run() numpy in/out/end_to_end"},
    "on": {
        "ortgpu capture on/end_to_end",
        "ortgpu capture on/run_only",
        "ortgpu capture on, replay_and_read/end_to_end",
    },
}
#: The wgpu backend encodes a graph's next replay ahead; its bench also times the captured step without that.
NO_AHEAD_ARM = "ortgpu capture on, encode ahead off/end_to_end"
AHEAD_RATIO = "capture on: encode ahead off / on, end_to_end"


def ortgpu_arms(capture: str, backend_name: str) -> set[str]:
    return ORTGPU_ARMS[capture] | ({NO_AHEAD_ARM} if capture == "on" and backend_name == "wgpu" else set())


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("bench") / "mlp.onnx"
    onnx.save(mlp(layers=2, width=64), str(path))  # symbolic batch: the bench feeds --batch
    return str(path)


def run_bench(*argv: str) -> int:
    return bench_main.main(list(argv))


def small_args(model_path: str, backend_name: str, *extra: str) -> list[str]:
    return [
        "--model",
        model_path,
        "--backend",
        backend_name,
        "--iterations",
        str(ITERATIONS),
        "--warmup",
        str(WARMUP),
        *extra,
    ]


def table_rows(stdout: str) -> dict[tuple[str, str], tuple[float, float, float]]:
    """The printed timing table: (arm, boundary) -> (p50, p90, p99)."""
    rows = {}
    for line in stdout.splitlines():
        match = re.match(r"^(.+?)\s+(end_to_end|run_only)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)(\s|$)", line)
        if match:
            rows[(match[1], match[2])] = (float(match[3]), float(match[4]), float(match[5]))
    return rows


def expected_adapter(device: ortgpu.Device) -> dict[str, Any]:
    return {
        "name": device.name,
        "vendor_id": hex(device.vendor_id),
        "device_id": hex(device.device_id),
        "backend": device.backend_type,
        "adapter_type": device.adapter_type,
        "driver": device.driver,
    }


def check_results(results: dict[str, Any], arms: set[str]) -> None:
    assert set(results) == arms
    for key, result in results.items():
        assert result["iterations"] == ITERATIONS, key
        raw = result["raw_s"]
        assert isinstance(raw, list) and len(raw) == ITERATIONS, key
        assert all(isinstance(t, float) and t > 0 for t in raw), key
        p50, p90, p99 = result["p50_ms"], result["p90_ms"], result["p99_ms"]
        assert all(isinstance(p, float) for p in (p50, p90, p99)), key
        assert 0 < p50 <= p90 <= p99, key
        assert min(raw) * 1e3 <= p50 and p99 <= max(raw) * 1e3, key
        assert p50 == pytest.approx(float(np.percentile(raw, 50)) * 1e3), key


# -- the full run: both arms, the peer, JSON ---------------------------------------------------------


def test_bench_both_arms_vs_onnxruntime_json(
    backend_name: str, device: ortgpu.Device, model_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "out.json"
    argv = small_args(model_path, backend_name, "--capture", "both", "--vs", "onnxruntime", "--json", str(json_path))
    assert run_bench(*argv) == 0
    out, err = capsys.readouterr()
    report = json.loads(json_path.read_text())

    # What was run and where.
    assert report["command"] == shlex.join(["python", "-m", "bench", *argv])
    assert report["adapter"] == expected_adapter(device)
    assert report["model"] == {"name": model_path, "batch": 1, "inputs": {"X": [1, 64]}}
    versions = report["versions"]
    assert versions["ortgpu"] == ortgpu.__version__
    assert versions["onnxruntime"] == onnxruntime.__version__
    if backend_name == "wgpu":
        from ortgpu_core.backends.wgpu_native import native_version

        assert versions["wgpu-native"] == native_version()
    assert report["boundaries"] == bench_main.BOUNDARIES

    # The arms, and the equality gate passed before any timing: the captured replay runs the uncaptured run's
    # kernels on the same bound device values, so its outputs are the same bits.
    assert report["capture_vs_uncaptured_rel_error"] == 0.0
    assert report["dispatches"] == 2  # two fused MatMul+Add(+Relu) steps
    provider = "WebGpuExecutionProvider" if bench_peer._webgpu_ep_device() is not None else "CPUExecutionProvider"
    # onnxruntime's CPU provider has no graph capture: no "capture on" peer arm then, and the report says why
    modes = ("off", "on") if provider == "WebGpuExecutionProvider" else ("off",)
    peers = {f"onnxruntime {provider} capture {mode}" for mode in modes}
    assert set(report["peer"]) == peers
    assert all(report["peer"][label]["provider"] == provider for label in peers)
    waits = provider == "CPUExecutionProvider"  # the WebGPU EP's run_only cannot wait for its GPU work
    assert all(report["peer"][label]["run_only_waits_for_device"] is waits for label in peers)
    assert ("run_only does not wait for its GPU work" in out) is not waits
    if provider == "WebGpuExecutionProvider":
        assert "peer_errors" not in report
    else:
        assert report["peer_errors"] == {
            "capture on": "onnxruntime's CPU provider has no graph capture (install "
            "onnxruntime-ep-webgpu for a captured peer arm)"
        }
    assert set(report["peer_vs_ortgpu_rel_error"]) == peers
    assert all(0.0 <= error < 1e-4 for error in report["peer_vs_ortgpu_rel_error"].values())
    peer_arms = {f"{label}/{boundary}" for label in peers for boundary in bench_main.BOUNDARIES}
    check_results(report["results"], ortgpu_arms("off", backend_name) | ortgpu_arms("on", backend_name) | peer_arms)

    # Ratios: capture off / on per boundary, and each peer arm against ortgpu's arm of the same capture mode.
    ratios = report["ratios"]
    expected_ratios = {f"capture off / on, {b}" for b in bench_main.BOUNDARIES}
    expected_ratios.add("capture off / on with replay_and_read, end_to_end")
    if backend_name == "wgpu":
        expected_ratios.add(AHEAD_RATIO)
    expected_ratios |= {f"{label} / ortgpu, {b}" for label in peers for b in bench_main.BOUNDARIES}
    # onnxruntime's CPU provider, which has no capture, against ortgpu's captured arm too
    cpu_peers = {label for label in peers if "CPUExecutionProvider" in label}
    expected_ratios |= {f"{label} / ortgpu capture on, {b}" for label in cpu_peers for b in bench_main.BOUNDARIES}
    assert set(ratios) == expected_ratios
    results = report["results"]
    for boundary in bench_main.BOUNDARIES:
        off = float(np.median(results[f"ortgpu capture off/{boundary}"]["raw_s"]))
        on = float(np.median(results[f"ortgpu capture on/{boundary}"]["raw_s"]))
        assert ratios[f"capture off / on, {boundary}"] == pytest.approx(off / on)
        for label in peers:
            theirs = float(np.median(results[f"{label}/{boundary}"]["raw_s"]))
            mine = on if label.endswith("capture on") else off
            assert ratios[f"{label} / ortgpu, {boundary}"] == pytest.approx(theirs / mine)
            if label in cpu_peers:
                assert ratios[f"{label} / ortgpu capture on, {boundary}"] == pytest.approx(theirs / on)
    read = float(np.median(results["ortgpu capture on, replay_and_read/end_to_end"]["raw_s"]))
    off = float(np.median(results["ortgpu capture off/end_to_end"]["raw_s"]))
    assert ratios["capture off / on with replay_and_read, end_to_end"] == pytest.approx(off / read)
    if backend_name == "wgpu":
        on = float(np.median(results["ortgpu capture on/end_to_end"]["raw_s"]))
        assert ratios[AHEAD_RATIO] == pytest.approx(float(np.median(results[NO_AHEAD_ARM]["raw_s"])) / on)
        assert device._native_device().encode_ahead is True  # switched back on after its arm
    assert set(report["breakdown_ms"]) == {"capture off", "capture on"}
    for parts in report["breakdown_ms"].values():
        assert set(parts) == {"update_inplace", "run_or_replay_call", "gpu_wait", "readback"}
        assert all(isinstance(v, float) and v > 0 for v in parts.values())

    # stdout: adapter, boundaries, the table (same numbers as the JSON), the ratios; stderr: the progress display.
    assert f"adapter: {device.name} ({device.backend_type}, {device.adapter_type}), driver {device.driver}" in out
    for boundary, text in bench_main.BOUNDARIES.items():
        assert f"boundary {boundary}: {text}\n" in out
    assert TABLE_HEADER.search(out)
    rows = table_rows(out)
    assert {f"{arm}/{boundary}" for arm, boundary in rows} == set(results)
    for (arm, boundary), (p50, p90, p99) in rows.items():
        summary = results[f"{arm}/{boundary}"]
        assert (p50, p90, p99) == pytest.approx((summary["p50_ms"], summary["p90_ms"], summary["p99_ms"]), abs=6e-4)
        assert p50 <= p90 <= p99
    for text in expected_ratios:
        assert f"ratio {text}: " in out
    assert f"wrote {json_path}" in out
    for key in results:
        arm, boundary = key.rsplit("/", 1)
        label = arm if arm.startswith("ortgpu run()") else f"{arm} {boundary}"
        assert f"{label}: {ITERATIONS}/{ITERATIONS}\n" in err  # the progress line ends when the loop does
    assert TABLE_HEADER.search(err) is None


@pytest.mark.parametrize("capture", ["off", "on"])
def test_bench_one_capture_mode(
    backend_name: str, model_path: str, tmp_path: Path, capture: str, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "out.json"
    assert run_bench(*small_args(model_path, backend_name, "--capture", capture, "--json", str(json_path))) == 0
    out = capsys.readouterr().out
    report = json.loads(json_path.read_text())
    check_results(report["results"], ortgpu_arms(capture, backend_name))
    assert set(report["breakdown_ms"]) == {f"capture {capture}"}
    assert ("capture_vs_uncaptured_rel_error" in report) == (capture == "on")
    if capture == "on":
        assert report["capture_vs_uncaptured_rel_error"] == 0.0
    # no off/on ratio with one arm, no peer without --vs; on wgpu, capture on has its encode-ahead A/B
    assert set(report["ratios"]) == ({AHEAD_RATIO} if capture == "on" and backend_name == "wgpu" else set())
    assert "peer" not in report and "onnxruntime" not in report["versions"]
    assert {arm for arm, _ in table_rows(out)} == {key.rsplit("/", 1)[0] for key in ortgpu_arms(capture, backend_name)}
    assert ("ratio " in out) == bool(report["ratios"])


# -- the equality gate --------------------------------------------------------------------------------


def _perturbed(original: Any, change: Any) -> Any:
    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        return [change(array) for array in original(self, *args, **kwargs)]

    return step


@pytest.mark.parametrize("change", [lambda a: a + 1.0, lambda a: np.full_like(a, np.nan)], ids=["shifted", "nan"])
def test_bench_refuses_timings_when_capture_outputs_differ(
    backend_name: str,
    model_path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(OrtgpuArms, "captured_end_to_end", _perturbed(OrtgpuArms.captured_end_to_end, change))
    json_path, plot_path = tmp_path / "out.json", tmp_path / "out.png"
    argv = small_args(model_path, backend_name, "--json", str(json_path), "--plot", str(plot_path))
    with pytest.raises(SystemExit) as raised:
        run_bench(*argv)
    message = str(raised.value.code)
    assert message.startswith("capture on vs off: outputs differ") and "no timings reported" in message
    out, err = capsys.readouterr()
    assert TABLE_HEADER.search(out) is None and not table_rows(out) and "ratio " not in out
    assert "capture on end_to_end:" not in err  # the captured arm was never timed
    assert not json_path.exists() and not plot_path.exists()


def test_bench_refuses_timings_when_peer_outputs_differ(
    backend_name: str,
    model_path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(
        bench_peer.OnnxruntimeArms, "end_to_end", _perturbed(bench_peer.OnnxruntimeArms.end_to_end, lambda a: a * 2)
    )
    json_path = tmp_path / "out.json"
    argv = small_args(model_path, backend_name, "--capture", "off", "--vs", "onnxruntime", "--json", str(json_path))
    with pytest.raises(SystemExit, match=r"^onnxruntime \S+ capture off: outputs differ .*no timings reported"):
        run_bench(*argv)
    out = capsys.readouterr().out
    assert TABLE_HEADER.search(out) is None and not table_rows(out)
    assert not json_path.exists()


# -- fixed device I/O shared by the two arms -----------------------------------------------------------


def test_arms_share_fixed_device_io(env: ortgpu.Env) -> None:
    model = mlp(layers=2, width=64)
    feeds = random_feeds(model, {"X": (1, 64)}, high=100)
    arms = OrtgpuArms(model.SerializeToString(), feeds, env)
    try:
        inputs = {name: id(value) for name, value in arms.inputs.items()}
        outputs = {name: id(value) for name, value in arms.outputs.items()}
        reference = arms.uncaptured_end_to_end(keep=True)
        graph = arms.capture()
        assert arms.capture() is graph  # captured once
        for value in arms.outputs.values():  # the replay must refill the very values the uncaptured run wrote
            value.update_inplace(np.zeros(value.shape(), np.float32))
        replayed = arms.captured_end_to_end(keep=True)
        assert all(np.array_equal(r, e) for r, e in zip(replayed, reference))
        # A timed step reads into the fixed host arrays (nothing allocated per step); keep=True gives new ones.
        fixed = arms.captured_end_to_end()
        assert all(a is b for a, b in zip(fixed, arms.host_outputs.values()))
        assert all(a is b for a, b in zip(arms.uncaptured_end_to_end(), fixed))
        assert not any(a is b for a, b in zip(replayed, fixed))
        # New input data through the same values: both arms see it and agree.
        arms.feeds = random_feeds(model, {"X": (1, 64)}, seed=2, high=100)
        fresh_uncaptured = arms.uncaptured_end_to_end(keep=True)
        fresh_captured = arms.captured_end_to_end(keep=True)
        assert not np.array_equal(fresh_uncaptured[0], reference[0])
        assert np.array_equal(fresh_captured[0], fresh_uncaptured[0])
        assert {name: id(value) for name, value in arms.inputs.items()} == inputs
        assert {name: id(value) for name, value in arms.outputs.items()} == outputs
        arms.uncaptured_run_only()
        arms.captured_run_only()
        breakdown = arms.breakdown(True, 2)
        assert set(breakdown) == {"update_inplace", "run_or_replay_call", "gpu_wait", "readback"}
    finally:
        arms.close()
    del arms, graph


# -- --plot ---------------------------------------------------------------------------------------------


def _matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("hide_matplotlib", [False, True], ids=["as_installed", "without_matplotlib"])
def test_bench_plot(
    backend_name: str,
    model_path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hide_matplotlib: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if hide_matplotlib:
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    plot_path = tmp_path / "latency.png"
    assert run_bench(*small_args(model_path, backend_name, "--capture", "both", "--plot", str(plot_path))) == 0
    out, err = capsys.readouterr()
    if not hide_matplotlib and _matplotlib_available():
        assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {plot_path}" in out
    else:
        assert not plot_path.exists()
        assert "--plot needs matplotlib" in err and "no plot written" in err
    assert TABLE_HEADER.search(out)  # the timings are reported either way


# -- --overhead ---------------------------------------------------------------------------------------------

# A few hundred dispatches keep the marginal cost well above the timer's noise and the test fast.
DISPATCHES, OVERHEAD_ITERATIONS = 200, 7


def _wgpu_py_available() -> bool:
    try:
        import wgpu  # noqa: F401
    except ImportError:
        return False
    return True


def test_bench_overhead_only(
    backend_name: str,
    device: ortgpu.Device,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(
        bench_overhead,
        "measure_overhead",
        functools.partial(bench_overhead.measure_overhead, dispatches=DISPATCHES, iterations=OVERHEAD_ITERATIONS),
    )
    json_path = tmp_path / "out.json"
    assert run_bench("--backend", backend_name, "--overhead-only", "--json", str(json_path)) == 0
    out = capsys.readouterr().out
    report = json.loads(json_path.read_text())
    assert "results" not in report and "model" not in report and not table_rows(out)  # no model was run
    assert report["adapter"] == expected_adapter(device)
    overhead = report["overhead"]
    assert overhead["dispatches"] == DISPATCHES and overhead["iterations"] == OVERHEAD_ITERATIONS
    assert overhead["ortgpu_replay_us_per_dispatch"] > 0
    submits = overhead["ortgpu_replay_submit_us"]
    assert set(submits) == {"n=1", f"n={DISPATCHES}"} and 0 < submits["n=1"] < submits[f"n={DISPATCHES}"]
    assert f"host cost per replayed dispatch: ortgpu {overhead['ortgpu_replay_us_per_dispatch']:.3f} us" in out
    if backend_name == "wgpu":
        phases = overhead["ortgpu_phases_us_per_dispatch"]
        assert set(phases) == {"encode", "finish", "submit"} and all(v > 0 for v in phases.values())
        assert "of which per dispatch: encode " in out
        ahead = overhead["ortgpu_encoded_ahead_submit_us_per_dispatch"]
        assert isinstance(ahead, float)  # a marginal cost: noise may make it slightly negative on an idle machine
        assert f"(a replay's critical path with encode_ahead): {ahead:.3f} us per dispatch" in out
        if _wgpu_py_available():
            assert overhead["wgpu_py_us_per_dispatch"] > 0
            assert overhead["ratio"] == pytest.approx(
                overhead["wgpu_py_us_per_dispatch"] / overhead["ortgpu_replay_us_per_dispatch"]
            )
            assert f"wgpu-py classes {overhead['wgpu_py_us_per_dispatch']:.3f} us, ratio " in out
        else:
            assert "ratio" not in overhead and "(wgpu-py not importable: no comparison)" in out
    else:
        # The fake backend replays numpy twins, not wgpu-native: its host cost is measured (the path runs), but
        # a ratio against wgpu-py's classes on a real adapter would compare nothing, so there is none.
        assert "ortgpu_phases_us_per_dispatch" not in overhead
        assert "ortgpu_encoded_ahead_submit_us_per_dispatch" not in overhead
        assert "wgpu_py_us_per_dispatch" not in overhead and "ratio" not in overhead
        assert overhead["no_comparison"] == "device not wgpu-native"
        assert "(device not wgpu-native: no comparison)" in out


def test_overhead_without_wgpu_py(backend_name: str, device: ortgpu.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wgpu", None)  # import wgpu raises ImportError
    overhead = bench_overhead.measure_overhead(device._native_device(), dispatches=DISPATCHES, iterations=3)
    assert overhead["ortgpu_replay_submit_us"]["n=1"] > 0
    assert "wgpu_py_us_per_dispatch" not in overhead and "ratio" not in overhead
    expected = "wgpu-py not importable" if backend_name == "wgpu" else "device not wgpu-native"
    assert overhead["no_comparison"] == expected


def test_bench_with_overhead_reports_both(
    backend_name: str,
    model_path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(
        bench_overhead,
        "measure_overhead",
        functools.partial(bench_overhead.measure_overhead, dispatches=DISPATCHES, iterations=3),
    )
    json_path = tmp_path / "out.json"
    argv = small_args(model_path, backend_name, "--capture", "on", "--overhead", "--json", str(json_path))
    assert run_bench(*argv) == 0
    out = capsys.readouterr().out
    report = json.loads(json_path.read_text())
    check_results(report["results"], ortgpu_arms("on", backend_name))
    assert report["overhead"]["dispatches"] == DISPATCHES
    assert TABLE_HEADER.search(out) and "host cost per replayed dispatch" in out


# -- python -m bench.profile ----------------------------------------------------------------------------------


def test_profile_rows_and_json(
    backend_name: str, device: ortgpu.Device, model_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "profile.json"
    argv = ["--model", model_path, "--backend", backend_name, "--repeats", "3", "--json", str(json_path)]
    assert bench_profile.main(argv) == 0
    out = capsys.readouterr().out
    report = json.loads(json_path.read_text())
    assert report["model"] == model_path and report["batch"] == 1
    assert isinstance(report["whole_us"], float) and isinstance(report["baseline_us"], float)
    assert report["baseline_us"] > 0
    steps = report["steps"]
    assert sorted((s["op"], s["output"], s["dispatches"]) for s in steps) == [
        ("MatMul+Add", [1, 64], 1),
        ("MatMul+Add+Relu", [1, 64], 1),
    ]
    assert [s["us"] for s in steps] == sorted((s["us"] for s in steps), reverse=True)
    for step in steps:
        assert isinstance(step["us"], float)
        flops = 2.0 * 64 * 64  # [1, 64] x [64, 64]
        if step["us"] > 0:
            assert step["gflops_per_s"] == pytest.approx(flops / (step["us"] * 1e-6) / 1e9)
    assert report["by_op_us"] == {s["op"]: pytest.approx(max(s["us"], 0.0)) for s in steps}

    header, columns, *rows, by_op = out.strip().splitlines()
    assert header.startswith(f"{model_path} batch 1 on {device.name}: {len(steps)} steps; whole plan ")
    assert columns.split() == ["us", "%", "GFLOP/s", "op", "/", "output", "shape"]
    assert len(rows) == len(steps)  # one row per step, slowest first
    for row, step in zip(rows, steps):
        assert row.split()[0] == f"{step['us']:.1f}"
        assert row.endswith(f"  {step['op']} {step['output']}")
    assert by_op.startswith("by op: ") and all(s["op"] in by_op for s in steps)


def test_profile_top_limits_rows(backend_name: str, model_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_profile.main(["--model", model_path, "--backend", backend_name, "--repeats", "2", "--top", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4  # header, columns, one row, by op


def test_profile_no_fuse_profiles_each_node(
    backend_name: str, model_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "profile.json"
    argv = ["--model", model_path, "--backend", backend_name, "--repeats", "2", "--no-fuse", "--json", str(json_path)]
    assert bench_profile.main(argv) == 0
    ops = sorted(step["op"] for step in json.loads(json_path.read_text())["steps"])
    assert ops == ["Add", "Add", "MatMul", "MatMul", "Relu"]  # the epilogues are steps of their own


def test_profile_gpu_times_the_captured_replay(
    backend_name: str, model_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--gpu``: the replay's GPU time from timestamps, the host's replay + wait, and each step's GPU time (both
    backends have timestamps: lavapipe's Vulkan queries, the fake backend's own clock)."""
    json_path = tmp_path / "profile.json"
    argv = ["--model", model_path, "--backend", backend_name, "--repeats", "3", "--gpu", "--json", str(json_path)]
    assert bench_profile.main(argv) == 0
    out = capsys.readouterr().out
    report = json.loads(json_path.read_text())
    assert report["timing"] == "gpu-timestamps"
    assert report["gpu_whole_us"] > 0 and report["host_replay_us"] > 0
    steps = report["steps"]
    assert sorted((s["op"], s["dispatches"], s["samples"]) for s in steps) == [
        ("MatMul+Add", 1, 3),
        ("MatMul+Add+Relu", 1, 3),
    ]  # one event per step and replay
    assert report["step_count"] == 2 and report["dispatch_count"] == 2
    assert [s["us"] for s in steps] == sorted((s["us"] for s in steps), reverse=True)
    assert report["steps_sum_us"] == pytest.approx(sum(s["us"] for s in steps))
    assert report["by_op_us"] == {s["op"]: pytest.approx(s["us"]) for s in steps}
    header, columns, *rows, by_op = out.strip().splitlines()
    assert header.startswith(f"{model_path} batch 1: 2 steps, 2 dispatches; GPU time per replay ")
    assert columns.split() == ["us", "%", "disp", "op"] and len(rows) == 2
    assert by_op.startswith("by op: ")


# -- the recurrent models (issue 13): lstm-ocr and vad, with onnxruntime's CPU provider as a peer -----------------

CPU_PEER = "onnxruntime CPUExecutionProvider capture off"


def _recurrent_flops(batch: int) -> float:
    """2 x the multiply-adds of ``lstm-ocr``: three Conv 3x3 stages (1 -> 32 -> 64 -> 128 channels on 32 x 128,
    pooled to 16 x 64, 8 x 32, 4 x 32), two bidirectional LSTM layers of 128 over 32 columns (4 gates, inputs 512
    then 256), a [256, 100] classifier per column."""
    conv = 32 * 32 * 128 * 1 * 9 + 64 * 16 * 64 * 32 * 9 + 128 * 8 * 32 * 64 * 9
    lstm = 32 * 2 * 4 * 128 * ((512 + 128) + (256 + 128))
    return 2.0 * batch * (conv + lstm + 32 * 256 * 100)


@pytest.mark.parametrize(("model", "batch"), [("vad", 1), ("lstm-ocr", 1), ("lstm-ocr", 2)])
def test_bench_recurrent_models(
    backend_name: str, model: str, batch: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "out.json"
    argv = small_args(model, backend_name, "--batch", str(batch), "--vs", "onnxruntime", "--json", str(json_path))
    assert run_bench(*argv) == 0  # a refused capture is reported, not raised
    out, err = capsys.readouterr()
    report = json.loads(json_path.read_text())

    inputs = (
        {"audio": [512], "sr": [], "h": [1, 1, 128], "c": [1, 1, 128]}
        if model == "vad"
        else {"image": [batch, 1, 32, 128]}
    )
    assert report["model"] == {"name": model, "batch": batch, "inputs": inputs}
    if model == "lstm-ocr":  # the LSTMs are counted (the VAD's LSTM reads the If's output, of no inferable shape)
        assert report["flops_per_run"] == _recurrent_flops(batch)

    # The captured arms: timed and equal to the uncaptured run, or refused with the session's reason, printed and
    # recorded, and the other arms still reported.
    refused = report.get("capture_refused")
    if refused is not None:
        assert refused.startswith("cannot capture: ")
        assert f"ortgpu capture on: refused ({refused}); its arms are not timed" in out
        assert "dispatches" not in report and "capture_vs_uncaptured_rel_error" not in report
        ours = ORTGPU_ARMS["off"]
    else:
        assert report["capture_vs_uncaptured_rel_error"] <= 1e-6 and report["dispatches"] > 0
        ours = ortgpu_arms("off", backend_name) | ortgpu_arms("on", backend_name)

    # The peers: onnxruntime's CPU provider always (its WebGPU EP too where installed), agreeing to 1e-4.
    webgpu = bench_peer.webgpu_ep_available()
    assert CPU_PEER in report["peer"] and report["peer"][CPU_PEER]["provider"] == "CPUExecutionProvider"
    assert report["peer"][CPU_PEER]["run_only_waits_for_device"] is True
    assert set(report["peer_vs_ortgpu_rel_error"]) == set(report["peer"])
    assert all(0.0 <= e <= 1e-4 for e in report["peer_vs_ortgpu_rel_error"].values())
    if webgpu:  # each WebGPU EP arm ran, or its refusal (graph capture of control flow, say) or its wrong
        for mode in ("off", "on"):  # outputs (its captured CRNN on the H200) are recorded
            label = f"onnxruntime WebGpuExecutionProvider capture {mode}"
            not_timed = f"capture {mode}" in report.get("peer_errors", {}) or label in report.get(
                "peer_wrong_outputs", {}
            )
            assert (label in report["peer"]) != not_timed, label
    else:
        assert set(report["peer"]) == {CPU_PEER}
        assert report["peer_errors"] == {
            "capture on": "onnxruntime's CPU provider has no graph capture (install "
            "onnxruntime-ep-webgpu for a captured peer arm)"
        }
    check_results(report["results"], ours | {f"{label}/{b}" for label in report["peer"] for b in bench_main.BOUNDARIES})
    assert f"ratio {CPU_PEER} / ortgpu, end_to_end: " in out
    if refused is None:
        assert report["ratios"][f"{CPU_PEER} / ortgpu capture on, end_to_end"] == pytest.approx(
            float(np.median(report["results"][f"{CPU_PEER}/end_to_end"]["raw_s"]))
            / float(np.median(report["results"]["ortgpu capture on/end_to_end"]["raw_s"]))
        )
    else:
        assert not any(key.endswith(" / ortgpu capture on, end_to_end") for key in report["ratios"])
    assert report["ratios"][f"{CPU_PEER} / ortgpu, end_to_end"] == pytest.approx(
        float(np.median(report["results"][f"{CPU_PEER}/end_to_end"]["raw_s"]))
        / float(np.median(report["results"]["ortgpu capture off/end_to_end"]["raw_s"]))
    )
    assert f"{CPU_PEER} end_to_end: {ITERATIONS}/{ITERATIONS}\n" in err
    assert {f"{arm}/{boundary}" for arm, boundary in table_rows(out)} == set(report["results"])


def test_bench_vad_refuses_a_batch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:  # argparse's error exit
        run_bench("--model", "vad", "--batch", "2", "--backend", "fake")
    assert raised.value.code == 2
    assert "--batch 2 does not apply to vad: it runs one stream's chunk" in capsys.readouterr().err


@pytest.mark.parametrize("peer_cpu", ["auto", "on", "off"])
@pytest.mark.parametrize("recurrent", [True, False], ids=["vad", "mlp"])
def test_bench_cpu_peer_next_to_the_webgpu_ep(
    backend_name: str,
    model_path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    peer_cpu: str,
    recurrent: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Where the WebGPU EP is installed (simulated here: the "auto" peer's arms are relabelled), --peer-cpu adds a
    CPU-provider arm: by default for the recurrent models only."""
    calls: list[tuple[str, bool]] = []

    class Spy(bench_peer.OnnxruntimeArms):
        def __init__(self, *args: Any, capture: bool, provider: str = "auto") -> None:
            calls.append((provider, capture))
            super().__init__(*args, capture=capture, provider=provider)
            if provider == "auto":
                self.provider = "SimulatedWebGpuExecutionProvider"

    monkeypatch.setattr(bench_peer, "webgpu_ep_available", lambda: True)
    monkeypatch.setattr(bench_peer, "OnnxruntimeArms", Spy)
    json_path = tmp_path / "out.json"
    model = "vad" if recurrent else model_path
    argv = small_args(model, backend_name, "--vs", "onnxruntime", "--peer-cpu", peer_cpu, "--json", str(json_path))
    assert run_bench(*argv) == 0
    capsys.readouterr()
    report = json.loads(json_path.read_text())
    cpu = peer_cpu == "on" or (peer_cpu == "auto" and recurrent)
    assert calls == [("auto", False), ("auto", True)] + ([("cpu", False)] if cpu else [])
    peers = {"onnxruntime SimulatedWebGpuExecutionProvider capture off"} | ({CPU_PEER} if cpu else set())
    if "capture on" not in report.get("peer_errors", {}):  # only where the WebGPU EP is really installed
        peers.add("onnxruntime SimulatedWebGpuExecutionProvider capture on")
    assert set(report["peer"]) == peers
    assert {key.rsplit("/", 1)[0] for key in report["results"] if key.startswith("onnxruntime")} == peers


def test_flops_count_recurrent_nodes() -> None:
    """GRU ``x [7, 3, 6]``, ``W [1, 30, 6]``, ``R [1, 30, 10]``: 7 steps x 3 sequences x 30 gate rows x (6 + 10)."""
    from bench.flops import model_flops
    from bench.recurrent_models import gru_encoder

    assert model_flops(onnx.load_from_string(gru_encoder()), {}) == 2.0 * 7 * 3 * 30 * (6 + 10)


def test_bench_skips_a_peer_arm_that_another_peer_arm_proves_wrong(
    backend_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the H200, onnxruntime's WebGPU EP replays its captured CRNN wrongly (0.75-0.78 relative error; its plain
    runs agree): that arm is not timed, the CPU provider's arm, agreeing with ortgpu, is (simulated here)."""

    class Wrong(bench_peer.OnnxruntimeArms):
        def __init__(self, *args: Any, capture: bool, provider: str = "auto") -> None:
            super().__init__(*args, capture=capture, provider=provider)
            if provider == "auto":
                self.provider = "SimulatedWebGpuExecutionProvider"

        def end_to_end(self) -> list[np.ndarray]:
            outputs = super().end_to_end()
            return [a + 1.0 for a in outputs] if self.provider.startswith("Simulated") else outputs

    monkeypatch.setattr(bench_peer, "webgpu_ep_available", lambda: True)
    monkeypatch.setattr(bench_peer, "OnnxruntimeArms", Wrong)
    json_path = tmp_path / "out.json"
    argv = small_args("vad", backend_name, "--capture", "off", "--vs", "onnxruntime", "--json", str(json_path))
    assert run_bench(*argv) == 0
    out = capsys.readouterr().out
    report = json.loads(json_path.read_text())
    wrong = "onnxruntime SimulatedWebGpuExecutionProvider capture off"
    assert set(report["peer_wrong_outputs"]) == {wrong} and report["peer_wrong_outputs"][wrong] > 1e-4
    assert f"{wrong}: outputs differ from ortgpu's (relative error " in out
    assert f"which {CPU_PEER} confirms: its timings are not reported" in out
    assert set(report["peer"]) == {CPU_PEER}
    check_results(report["results"], ORTGPU_ARMS["off"] | {f"{CPU_PEER}/{b}" for b in bench_main.BOUNDARIES})


# -- --threads: K threads, each with its own session ---------------------------------------------------

THREAD_ROW = re.compile(
    r"^\s*(\d+) (ortgpu capture (?:on|off))\s+(end_to_end|replay_and_read|run_only)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s",
    re.M,
)


def _thread_boundaries(arm: str) -> tuple[str, ...]:
    """The boundaries --threads times for an arm: the captured one also times replay_and_read."""
    if arm.endswith("capture on"):
        return ("end_to_end", "replay_and_read", "run_only")
    return ("end_to_end", "run_only")


def check_thread_result(result: dict[str, Any], threads: int, iterations: int | None) -> None:
    per_thread = result["per_thread"]
    assert len(per_thread) == result["threads"] == threads
    every = [t for entry in per_thread for t in entry["raw_s"]]
    assert result["steps"] == len(every) == sum(entry["steps"] for entry in per_thread)
    for entry in per_thread:
        raw = entry["raw_s"]
        assert entry["steps"] == len(raw) > 0
        if iterations is not None:
            assert len(raw) == iterations
        assert all(isinstance(t, float) and t > 0 for t in raw)
        assert 0 < entry["p50_ms"] <= entry["p99_ms"] <= max(raw) * 1e3
        assert entry["p50_ms"] == pytest.approx(float(np.percentile(raw, 50)) * 1e3)
        assert entry["p99_ms"] == pytest.approx(float(np.percentile(raw, 99)) * 1e3)
        assert sum(raw) <= result["window_s"]  # every timed step lies inside the window
    assert result["p50_ms"] == pytest.approx(float(np.percentile(every, 50)) * 1e3)
    assert result["p99_ms"] == pytest.approx(float(np.percentile(every, 99)) * 1e3)
    assert result["throughput_per_s"] == pytest.approx(result["steps"] / result["window_s"])
    assert result["p99_over_p50"] == pytest.approx(result["p99_ms"] / result["p50_ms"]) and result["p99_over_p50"] >= 1


@pytest.mark.parametrize("capture", ["both", "on"])
def test_bench_threads_json(
    backend_name: str, model_path: str, tmp_path: Path, capture: str, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "out.json"
    argv = small_args(model_path, backend_name, "--threads", "1,3", "--capture", capture, "--json", str(json_path))
    assert run_bench(*argv) == 0
    out, err = capsys.readouterr()
    report = json.loads(json_path.read_text())
    part = report["threads"]
    assert part["thread_counts"] == [1, 3] and part["iterations_per_thread"] == ITERATIONS and part["seconds"] is None
    arms = ["ortgpu capture off", "ortgpu capture on"] if capture == "both" else ["ortgpu capture on"]
    expected = [(k, arm, b) for k in (1, 3) for arm in arms for b in _thread_boundaries(arm)]
    assert [(r["threads"], r["arm"], r["boundary"]) for r in part["results"]] == expected
    for result in part["results"]:
        check_thread_result(result, result["threads"], ITERATIONS)
    # three sessions (the largest K), each checked against the single-thread reference before and after timing
    checked = part["outputs_checked"]
    assert "capture_refused" not in checked and "capture_refused" not in report
    for when in ("rel_error_before", "rel_error_after"):
        assert checked[when] == [{"capture off": 0.0, "capture on": 0.0}] * 3
    assert set(part["scaling"]) == {f"{arm}/{b}" for arm in arms for b in _thread_boundaries(arm)}
    for key, ratios in part["scaling"].items():
        assert set(ratios) == {"1", "3"} and ratios["1"] == 1.0
        one, three = (
            next(r for r in part["results"] if f"{r['arm']}/{r['boundary']}" == key and r["threads"] == k)
            for k in (1, 3)
        )
        assert ratios["3"] == pytest.approx(three["throughput_per_s"] / one["throughput_per_s"])
    # the table: one row per (K, arm, boundary) with the JSON's throughput, p50 and p99
    rows = {(int(m[1]), m[2], m[3]): tuple(float(m[i]) for i in (4, 6, 7)) for m in THREAD_ROW.finditer(out)}
    assert list(rows) == expected
    for result in part["results"]:
        rate, p50, p99 = rows[(result["threads"], result["arm"], result["boundary"])]
        assert rate == pytest.approx(result["throughput_per_s"], abs=0.06)
        assert p50 == pytest.approx(result["p50_ms"], abs=6e-4) and p99 == pytest.approx(result["p99_ms"], abs=6e-4)
    assert "threads 1,3: 5 iterations per thread after 1 warm-up" in out
    assert "3 thread(s), ortgpu capture on run_only" in err
    assert "results" not in report  # the single-thread arms are not run with --threads


def test_bench_threads_gpu_under_load(
    backend_name: str, model_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--gpu-under-load: per K, a profiled pass of the K threads gives a replay's GPU time under that load (the
    replays timed whole: each session's first is timed per step), and busy = end_to_end throughput x that time."""
    json_path = tmp_path / "out.json"
    argv = small_args(model_path, backend_name, "--threads", "1,2", "--capture", "on", "--gpu-under-load")
    assert run_bench(*argv, "--json", str(json_path)) == 0
    out, _ = capsys.readouterr()
    part = json.loads(json_path.read_text())["threads"]
    loaded = part["gpu_under_load"]
    assert set(loaded) == {"1", "2"} and "gpu_under_load" not in part["outputs_checked"]
    for k, row in loaded.items():
        e2e = next(r for r in part["results"] if r["threads"] == int(k) and r["boundary"] == "end_to_end")
        assert 0 < row["gpu_time_per_replay_s"] <= row["p90_s"]
        assert row["replays_timed"] == int(k) * (WARMUP + ITERATIONS - 1)
        assert row["profiled_steps_per_s"] > 0
        assert row["busy"] == pytest.approx(e2e["throughput_per_s"] * row["gpu_time_per_replay_s"])
        assert f"K={k}: GPU time per replay under load {row['gpu_time_per_replay_s'] * 1e3:.4f} ms" in out


def test_bench_threads_for_seconds(backend_name: str, model_path: str, tmp_path: Path) -> None:
    json_path = tmp_path / "out.json"
    argv = small_args(model_path, backend_name, "--threads", "2", "--seconds", "0.3", "--capture", "on")
    assert run_bench(*argv, "--json", str(json_path)) == 0
    part = json.loads(json_path.read_text())["threads"]
    assert part["seconds"] == 0.3 and part["iterations_per_thread"] is None
    for result in part["results"]:
        check_thread_result(result, 2, None)
        assert result["window_s"] >= 0.3
        # no thread starts a step after the deadline: each thread's steps end within one step of it
        for entry in result["per_thread"]:
            assert sum(entry["raw_s"]) <= 0.3 + max(entry["raw_s"]) + 0.05


def test_bench_threads_refuses_timings_when_a_thread_differs(
    backend_name: str,
    model_path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The second thread's session (the third session made: the reference's comes first) gives wrong outputs: the
    bench stops before timing anything."""
    made: list[OrtgpuArms] = []
    original_init, original_step = OrtgpuArms.__init__, OrtgpuArms.uncaptured_end_to_end

    def init(self: OrtgpuArms, *args: Any) -> None:
        original_init(self, *args)
        made.append(self)

    def step(self: OrtgpuArms, keep: bool = False) -> list[np.ndarray]:
        outputs = original_step(self, keep)
        return [a + 1.0 for a in outputs] if made.index(self) == 2 else outputs

    monkeypatch.setattr(OrtgpuArms, "__init__", init)
    monkeypatch.setattr(OrtgpuArms, "uncaptured_end_to_end", step)
    json_path = tmp_path / "out.json"
    with pytest.raises(SystemExit) as raised:
        run_bench(*small_args(model_path, backend_name, "--threads", "1,2", "--json", str(json_path)))
    message = str(raised.value.code)
    assert message.startswith("thread 1 capture off: outputs differ from the single-thread reference")
    assert "no timings reported" in message and not json_path.exists()
    out, err = capsys.readouterr()
    assert not THREAD_ROW.search(out) and "thread(s)" not in err
    assert len(made) == 3


def test_bench_threads_refuses_a_wrong_replay(
    backend_name: str, model_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        OrtgpuArms, "captured_end_to_end", _perturbed(OrtgpuArms.captured_end_to_end, lambda a: np.full_like(a, np.nan))
    )
    with pytest.raises(SystemExit) as raised:
        run_bench(*small_args(model_path, backend_name, "--threads", "2"))
    assert str(raised.value.code).startswith("thread 0 capture on: outputs differ from the single-thread reference")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--threads", "0"], "--threads takes positive integers"),
        (["--threads", "1,x"], "--threads takes positive integers"),
        (["--threads", "2,2"], "--threads lists a count twice"),
        (["--threads", "2", "--vs", "onnxruntime"], "leave out --vs, --overhead and --plot"),
        (["--threads", "2", "--overhead"], "leave out --vs, --overhead and --plot"),
        (["--threads", "2", "--seconds", "0"], "--seconds must be positive"),
        (["--seconds", "1"], "--seconds applies to --threads only"),
        (["--gpu-under-load"], "--gpu-under-load applies to --threads only"),
    ],
)
def test_bench_threads_bad_arguments(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:  # argparse's error exit
        run_bench("--model", "mlp16", "--backend", "fake", *extra)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_time_threads_starts_every_thread_after_every_warmup() -> None:
    """The barrier: no timed step begins before the last thread's warm-up ended (thread 0 warms up slowly), and
    the window opens after that."""
    events: list[tuple[str, int, float]] = []
    lock = threading.Lock()
    warm = [0, 0, 0]

    def make(index: int) -> Any:
        def step() -> None:
            phase = "warm" if warm[index] < 2 else "timed"
            warm[index] += 1
            if phase == "warm" and index == 0:
                time.sleep(0.05)
            with lock:
                events.append((phase, index, time.perf_counter()))

        return step

    window, times = bench_threads.time_threads([make(i) for i in range(3)], 2, 4, None)
    assert [len(t) for t in times] == [4, 4, 4]
    last_warm = max(t for phase, _, t in events if phase == "warm")
    first_timed = min(t for phase, _, t in events if phase == "timed")
    assert last_warm < first_timed
    assert 0 < window < 0.05  # thread 0's slow warm-up is outside the window


def test_time_threads_raises_a_thread_error_without_hanging() -> None:
    def good() -> None:
        pass

    def bad() -> None:
        raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):  # in warm-up: the others leave the barrier
        bench_threads.time_threads([good, bad, good], 1, 3, None)
    calls = [0]

    def late() -> None:
        calls[0] += 1
        if calls[0] > 2:
            raise RuntimeError("timed")

    with pytest.raises(RuntimeError, match="timed"):  # in the timed loop
        bench_threads.time_threads([good, late], 1, 5, None)
