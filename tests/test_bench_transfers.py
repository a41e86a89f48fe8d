"""``python -m bench.transfers`` (upload / download rates of an OrtValue), run in process on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import transfers
from ortgpu_core.backends import _host_copy


def test_transfers_rows_and_json(backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    json_path = tmp_path / "transfers.json"
    argv = ["--mb", "0.25,8", "--iterations", "3", "--warmup", "1", "--backend", backend_name]
    assert transfers.main([*argv, "--json", str(json_path)]) == 0
    report = json.loads(json_path.read_text())
    assert [row["megabytes"] for row in report["rows"]] == [0.25, 8.0]  # 8 MB: to_numpy() hands over its staging
    assert [row["bytes"] for row in report["rows"]] == [1 << 18, 8 << 20]
    assert report["copy_threads"] == _host_copy.copy_threads()
    for row in report["rows"]:
        for direction in ("upload", "download", "to_numpy_new", "first_read", "second_read", "host_copy"):
            stats = row[direction]
            assert 0 < stats["p50_ms"] <= stats["p90_ms"]
            assert stats["p50_GBps"] == pytest.approx(row["bytes"] / (stats["p50_ms"] * 1e-3) / 1e9)
    out = capsys.readouterr().out
    assert "| 0.25 MB |" in out and "| 8 MB |" in out and "host copy alone GB/s" in out


def test_transfers_copy_threads_option_sets_the_library_setting(backend_name: str) -> None:
    previous = _host_copy.copy_threads()
    try:
        assert transfers.main(["--mb", "2", "--iterations", "1", "--copy-threads", "3", "--backend", backend_name]) == 0
        assert _host_copy.copy_threads() == 3
    finally:
        _host_copy.set_copy_threads(previous)


def test_transfers_streaming_stores_for_the_run_only(
    backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "streaming.json"
    argv = ["--mb", "2", "--iterations", "1", "--streaming-stores", "--backend", backend_name, "--json", str(json_path)]
    assert not _host_copy.streaming_stores()
    assert transfers.main(argv) == 0
    assert not _host_copy.streaming_stores()  # restored after the run
    assert json.loads(json_path.read_text())["streaming_stores"] is True
    assert "streaming stores: True" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["", "a", "0", "-1", "1,,2", "5000"])
def test_transfers_refuses_bad_sizes(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        transfers.main(["--mb", text, "--backend", "fake"])
    assert raised.value.code == 2
    assert "--mb" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--iterations", "0"], ["--warmup", "-1"], ["--copy-threads", "0"]])
def test_transfers_refuses_bad_counts(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        transfers.main([*argv, "--backend", "fake"])
    assert raised.value.code == 2


def test_transfers_by_chunk_size_restores_the_library_setting(backend_name: str, tmp_path: Path) -> None:
    """``--chunk-mib``: rows per chunk size and round (writes and reads of 8 MiB or more split that way, the bytes
    checked by each measurement), and the library's chunk sizes back afterwards."""
    from ortgpu_core.backends import _wgpu_chunked_reads, _wgpu_staged_writes

    before = (_wgpu_staged_writes.CHUNK, _wgpu_staged_writes.POOL_CHUNKS, _wgpu_chunked_reads.READ_CHUNK)
    json_path = tmp_path / "chunks.json"
    argv = ["--mb", "9", "--iterations", "2", "--warmup", "0", "--chunk-mib", "1,4", "--rounds", "2"]
    assert transfers.main([*argv, "--backend", backend_name, "--json", str(json_path)]) == 0
    rows = json.loads(json_path.read_text())["rows"]
    assert [(row["chunk_mib"], row["round"]) for row in rows] == [(1, 0), (4, 0), (1, 1), (4, 1)]
    assert (_wgpu_staged_writes.CHUNK, _wgpu_staged_writes.POOL_CHUNKS, _wgpu_chunked_reads.READ_CHUNK) == before


@pytest.mark.parametrize("argv", [["--chunk-mib", "0"], ["--chunk-mib", "1.5"], ["--chunk-mib", "2", "--rounds", "0"]])
def test_transfers_refuses_bad_chunk_sizes(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        transfers.main([*argv, "--backend", "fake"])
    assert raised.value.code == 2


def test_phases_time_the_calls_inside_each_transfer(backend_name: str, tmp_path: Path) -> None:
    json_path = tmp_path / "phases.json"
    previous = _host_copy.copy_threads()
    argv = ["--mb", "9", "--iterations", "2", "--warmup", "1", "--phases", "--copy-threads", "2"]
    try:
        assert transfers.main([*argv, "--backend", backend_name, "--json", str(json_path)]) == 0
    finally:
        _host_copy.set_copy_threads(previous)
    (row,) = json.loads(json_path.read_text())["rows"]
    assert row["upload_p50_ms"] > 0 and row["download_p50_ms"] > 0
    phases = row["phases"]
    assert phases["wait_idle"]["calls_per_transfer"] == 1
    if backend_name == "wgpu":  # 9 MB: three staging chunks each way (4 MiB), every call timed once per chunk
        for name in ("staged_write", "copy_and_map", "_wait_map", "_copy_out_locked"):
            assert phases[name]["calls_per_transfer"] == 3, name
            assert phases[name]["ms_per_transfer"] > 0


def test_phases_leave_the_device_as_it_was(backend_name: str) -> None:
    import ortgpu
    from bench.transfer_phases import measure_phases

    env = ortgpu.Env(backend=backend_name)
    try:
        device = env.default_device._native_device()
        unlocked = getattr(device, "_unlocked", None)
        measure_phases(env, 0.5, 1, 0)
        assert getattr(device, "_unlocked", None) is unlocked
        assert not {"_wait_map", "_copy_out_locked", "wait_idle", "_take_upload_staging"} & set(vars(device))
    finally:
        env.close()


def test_phases_refuse_chunk_sizes() -> None:
    with pytest.raises(SystemExit):
        transfers.main(["--phases", "--chunk-mib", "2", "--backend", "fake"])
