"""``python -m bench.transfers`` (upload / download rates of an OrtValue), run in process on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import transfers
from ortgpu_core.backends import _host_copy


def test_transfers_rows_and_json(backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    json_path = tmp_path / "transfers.json"
    argv = ["--mb", "0.25,2", "--iterations", "3", "--warmup", "1", "--backend", backend_name]
    assert transfers.main([*argv, "--json", str(json_path)]) == 0
    report = json.loads(json_path.read_text())
    assert [row["megabytes"] for row in report["rows"]] == [0.25, 2.0]
    assert [row["bytes"] for row in report["rows"]] == [1 << 18, 2 << 20]
    assert report["copy_threads"] == _host_copy.copy_threads()
    for row in report["rows"]:
        for direction in ("upload", "download", "host_copy"):
            stats = row[direction]
            assert 0 < stats["p50_ms"] <= stats["p90_ms"]
            assert stats["p50_GBps"] == pytest.approx(row["bytes"] / (stats["p50_ms"] * 1e-3) / 1e9)
    out = capsys.readouterr().out
    assert "| 0.25 MB |" in out and "| 2 MB |" in out and "host copy alone GB/s" in out


def test_transfers_copy_threads_option_sets_the_library_setting(backend_name: str) -> None:
    previous = _host_copy.copy_threads()
    try:
        assert transfers.main(["--mb", "2", "--iterations", "1", "--copy-threads", "3", "--backend", backend_name]) == 0
        assert _host_copy.copy_threads() == 3
    finally:
        _host_copy.set_copy_threads(previous)


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
