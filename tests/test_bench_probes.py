"""The kernel sweep's reference probes (bench/probes.py) and its interleaved GEMV timing, on both backends.

The probes are what GEMV bandwidth percentages and the dispatch floor are read against, so they must compute what
they claim: the copy copies, the read sums every vector once, the floor chain runs every dispatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ortgpu_core
from bench import arithmetic, sweep_kernels
from bench.probes import bandwidth_probes, dispatch_floor_probe
from ortgpu.ops import DeviceCaps


def _caps(device: ortgpu_core.Device) -> DeviceCaps:
    backend_device = device._native_device()
    return DeviceCaps(frozenset(backend_device.features), backend_device.limits)


def test_bandwidth_probes_copy_and_sum(device: ortgpu_core.Device) -> None:
    backend_device = device._native_device()
    copy, read = bandwidth_probes(backend_device, _caps(device), megabytes=1, repeats=2)
    try:
        src, dst = copy.bound
        assert read.bound == (src, dst)
        nbytes = backend_device.buffer_size(src)
        assert 0 < nbytes <= 1_000_000 and nbytes % (16 * 256) == 0
        assert copy.bytes_per_repeat == 2 * nbytes and copy.repeats == 2
        values = np.random.default_rng(3).integers(-8, 8, nbytes // 4).astype(np.float32)  # exact sums in f32
        backend_device.write_buffer(src, 0, values.tobytes())
        backend_device.submit(copy.commands)
        copied = np.frombuffer(backend_device.read_buffer(dst, 0, nbytes), np.float32)
        np.testing.assert_array_equal(copied, values)

        backend_device.submit(read.commands)
        invocations = (read.bytes_per_repeat - nbytes) // 16
        assert invocations >= 256 and invocations % 256 == 0
        sums = np.frombuffer(backend_device.read_buffer(dst, 0, invocations * 16), np.float32).reshape(-1, 4)
        vectors = values.reshape(-1, 4)
        expected = np.zeros((invocations, 4), np.float64)
        np.add.at(expected, np.arange(len(vectors)) % invocations, vectors)
        np.testing.assert_array_equal(sums, expected.astype(np.float32))
        # the untouched rest of dst still holds the copy
        rest = np.frombuffer(backend_device.read_buffer(dst, invocations * 16, nbytes - invocations * 16), np.float32)
        np.testing.assert_array_equal(rest, values[invocations * 4 :])
    finally:
        copy.release()
        read.release()


def test_dispatch_floor_probe_runs_every_dispatch(device: ortgpu_core.Device) -> None:
    backend_device = device._native_device()
    probe = dispatch_floor_probe(backend_device, repeats=37)
    try:
        (word,) = probe.bound
        backend_device.submit(probe.commands)
        backend_device.submit(probe.commands)
        assert np.frombuffer(backend_device.read_buffer(word, 0, 4), np.uint32)[0] == 74
        assert probe.bytes_per_repeat == 0 and probe.repeats == 37
    finally:
        probe.release()
    probe.release()  # idempotent


def test_gemv_sweep_interleaves_probes_and_prints_a_table(
    backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep.json"
    code = sweep_kernels.main(
        [
            "--backend",
            backend_name,
            "--shapes",
            "mlp16",
            "--quick",
            "--rounds",
            "2",
            "--probe-mb",
            "1",
            "--budget-ms",
            "1",
            "--cold-mb",
            "12",
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(out.read_text())
    assert set(report["probes"]) == {"bandwidth copy 1 MB", "bandwidth read 1 MB", "dispatch floor"}
    assert all(value["us"] > 0 for value in report["probes"].values())
    rows = [row for row in report["gemv_rows"] if "us" in row]
    assert len(rows) >= 5 and sum(row["is_default"] for row in rows) == 1
    for row in rows:
        assert row["err_vs_first"] < 1e-5
        assert row["measured_gbs"] > 0 and row["measured_percent"] == pytest.approx(
            100 * row["gbs"] / row["measured_gbs"]
        )
    (best,) = report["gemv_best"]
    assert best["best_us"] == min(row["us"] for row in rows)
    assert "measured bandwidth" in printed and "dispatch floor" in printed
    assert "cycling through 3 copies of B" in printed  # 4.2 MB of weights, at least 12 MB in all
    table = printed.split("GEMV_SHAPE_CONFIGS: dict[tuple[str, int, int], GemvConfig] = {", 1)[1].split("}", 1)[0]
    namespace: dict[str, object] = {"GemvConfig": sweep_kernels.GemvConfig}
    parsed = eval("{" + table + "}", namespace)  # the printed table is valid Python for _gemv.py
    assert all(key[0] == "kn" and key[1:] == (1024, 1024) for key in parsed)


def test_wait_latency_compares_spinning_and_blocking_waits(device: ortgpu_core.Device) -> None:
    """bench.overhead.measure_wait_latency: None where waits do not spin (CPU adapters, the fake backend); on a
    spinning wgpu device both modes per dispatch count, and the device's own setting restored."""
    from bench.overhead import measure_wait_latency
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    default = measure_wait_latency(device._native_device(), dispatch_counts=(0,), iterations=2)
    if getattr(device._native_device(), "spin_wait_us", 0):  # a GPU adapter: its waits spin by default
        assert default is not None and set(default["spinning_us"]) == {"0 dispatches"}
    else:  # lavapipe (a CPU adapter) or the fake backend: nothing to compare
        assert default is None
    if device.backend_type == "Fake":
        return
    backend = WgpuBackend(spin_wait_us=300)
    spinning = backend.open_device(backend.default_adapter_index())
    try:
        result = measure_wait_latency(spinning, dispatch_counts=(0, 3), iterations=3)
        assert result is not None and result["spin_wait_us"] == 300 and result["iterations"] == 3
        for mode in ("spinning_us", "blocking_us"):
            assert set(result[mode]) == {"0 dispatches", "3 dispatches"}
            assert all(value > 0 for value in result[mode].values())
        assert spinning.spin_wait_us == 300
        assert spinning.live_handles() == 0
    finally:
        spinning.destroy()
        backend.close()


def test_overhead_arguments_are_checked(device: ortgpu_core.Device) -> None:
    from bench.overhead import measure_overhead

    for dispatches, iterations in ((1, 5), (0, 5), (10, 0)):
        with pytest.raises(ValueError, match="measure_overhead needs dispatches >= 2"):
            measure_overhead(device._native_device(), dispatches=dispatches, iterations=iterations)


# -- the arithmetic-rate probes (bench/arithmetic.py) ----------------------------------------------------------------
def test_arithmetic_probes_compute_their_recurrences(device: ortgpu_core.Device) -> None:
    backend_device = device._native_device()
    caps = _caps(device)
    probes, absent = arithmetic.arithmetic_probes(backend_device, caps, iterations=5, workgroups=2, repeats=3)
    try:
        assert [p.name for p in probes] + absent == [form.name for form in arithmetic.FORMS]
        assert absent == ([] if caps.has_f16 else [f.name for f in arithmetic.FORMS if f.element == "f16"])
        src, dst = probes[0].bound
        seeds = np.random.default_rng(5).uniform(-1, 1, (512, 4)).astype(np.float32)
        backend_device.write_buffer(src, 0, seeds.tobytes())
        for probe in probes:
            form = next(f for f in arithmetic.FORMS if f.name == probe.name)
            assert probe.repeats == 3 and probe.flops_per_repeat == 512 * 5 * form.flops_per_step
            backend_device.write_buffer(dst, 0, bytes(seeds.nbytes))
            backend_device.submit(probe.commands)
            got = np.frombuffer(backend_device.read_buffer(dst, 0, seeds.nbytes), np.float32).reshape(-1, 4)
            want = arithmetic.expected(form, seeds, 5)
            tolerance = 1e-5 if form.element == "f32" else 1e-2
            np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance, err_msg=form.name)
            assert not np.any(got[:, form.width :])  # lanes beyond the form's width are written as zero
            # the chains moved towards their fixed point 2 (8 chains): the kernel ran the steps, not a copy
            assert np.all(np.abs(got[:, : form.width] - seeds[:, : form.width]) > 0.5)
    finally:
        for probe in probes:
            probe.release()


def test_arithmetic_probes_without_shader_f16_run_f32_only() -> None:
    from ortgpu_core.backends.fake import FakeBackend, FakeDeviceSpec

    backend_device = FakeBackend([FakeDeviceSpec(features=frozenset())]).open_device(0)
    caps = DeviceCaps(frozenset(backend_device.features), backend_device.limits)
    probes, absent = arithmetic.arithmetic_probes(backend_device, caps, iterations=2, workgroups=1, repeats=1)
    try:
        assert [p.name for p in probes] == [f.name for f in arithmetic.FORMS if f.element == "f32"]
        assert absent == [f.name for f in arithmetic.FORMS if f.element == "f16"]
    finally:
        for probe in probes:
            probe.release()


def test_arithmetic_main_reports_a_rate_per_form(backend_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = arithmetic.main(["--backend", backend_name, "--iterations", "4", "--workgroups", "2", "--rounds", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    for form in arithmetic.FORMS:
        assert any(line.split("  ")[1:2] and form.name in line and "TFLOP/s" in line for line in out.splitlines())
    assert "WRONG" not in out


def test_arithmetic_main_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        arithmetic.main(["--backend", "fake", "--iterations", "0"])
    assert raised.value.code == 2 and "at least 1" in capsys.readouterr().err


def test_transformer_projection_shapes_are_swept_and_checked(
    backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--shapes xf``: the zoo's transformer projections, each timed against its own first variant (a wrong
    variant is a failure, not a row), with the default's rank printed."""
    labels = [shape.label for shape in sweep_kernels.transformer_shapes()]
    assert len(labels) == len(set(labels)) and all(label.startswith("xf ") for label in labels)
    attention = {family for family, *_ in sweep_kernels.TRANSFORMER_ATTENTION}
    for shape in sweep_kernels.transformer_shapes():
        batch, m, n, k = shape.gemm
        if shape.inputs[1] == (k, n):  # a projection: [1, M, K] x [K, N]
            assert shape.inputs[0] == (1, m, k) and batch == 1
        else:  # an attention product, per head: [1, heads, M, K] x [1, heads, K, N]
            assert shape.inputs[0] == (1, batch, m, k) and shape.inputs[1] == (1, batch, k, n)
            assert shape.label.split()[1] in attention
    assert sum(shape.inputs[1] != shape.gemm[3:1:-1] for shape in sweep_kernels.transformer_shapes()) == 2 * len(
        attention
    )
    assert set(labels) <= {shape.label for shape in sweep_kernels.shapes()}
    out = tmp_path / "sweep.json"
    label = "xf llama-small MatMul M=128 N=256 K=512"
    assert label in labels and not any("," in label for label in labels)  # --shapes splits on commas
    arguments = ["--backend", backend_name, "--shapes", label, "--quick", "--repeats", "1", "--budget-ms", "1"]
    code = sweep_kernels.main([*arguments, "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(out.read_text())
    (best,) = report["best"]
    assert best["shape"] == label and best["gemm"] == [1, 128, 256, 512]
    timed = [row for row in report["rows"] if row.get("us")]
    assert len(timed) >= 3 and sum(row["is_default"] for row in timed) == 1
    assert all(row["err_vs_first"] < 1e-4 for row in timed)
    assert best["best_us"] == min(row["us"] for row in timed)
