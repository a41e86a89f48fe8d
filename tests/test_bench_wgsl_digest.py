"""The WGSL digest (bench/wgsl_digest.py) that refactors are checked with: it must see every kernel a model
compiles, be the same for the same code, change when one kernel's text changes, and leave the backend as it was."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import ortgpu
from bench import wgsl_digest


@pytest.fixture
def fake_env() -> Iterator[ortgpu.Env]:
    env = ortgpu.Env(backend="fake")
    yield env
    env.close()


def test_digest_records_the_bench_models_kernels_and_is_repeatable(fake_env: ortgpu.Env) -> None:
    first = wgsl_digest.collect(fake_env, node_tests=False)
    other = ortgpu.Env(backend="fake")
    try:
        again = wgsl_digest.collect(other, node_tests=False)
    finally:
        other.close()
    assert first == again
    labels = set(first.values())
    assert any("MatMul" in label for label in labels) and any("Conv" in label for label in labels), labels
    assert all("fn main" in wgsl or "@compute" in wgsl for wgsl in first), "every recorded text is a WGSL kernel"
    lines = wgsl_digest.digest_lines(first)
    assert lines == sorted(lines) and len(lines) == len(first)
    assert lines[0].split("  ")[0] in {hashlib.sha256(w.encode()).hexdigest() for w in first}


def test_one_changed_kernel_changes_its_line(fake_env: ortgpu.Env) -> None:
    kernels = wgsl_digest.collect(fake_env, node_tests=False)
    wgsl, label = next(iter(kernels.items()))
    changed = dict(kernels)
    del changed[wgsl]
    changed[wgsl + " "] = label
    assert set(wgsl_digest.digest_lines(kernels)) ^ set(wgsl_digest.digest_lines(changed)) != set()


def test_the_device_class_is_restored(fake_env: ortgpu.Env) -> None:
    device_class = type(fake_env.default_device._native_device())
    before = device_class.create_compute_pipeline
    with pytest.raises(RuntimeError, match="inside"):
        with wgsl_digest.recording_kernels(fake_env):
            assert device_class.create_compute_pipeline is not before
            raise RuntimeError("inside")
    assert device_class.create_compute_pipeline is before


def test_main_writes_the_listing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "kernels.txt"
    assert wgsl_digest.main(["--no-node-tests", "--list", str(listing)]) == 0
    lines = listing.read_text().splitlines()
    out = capsys.readouterr().out.split()
    assert out[0] == "digest" and out[2] == "kernels" and int(out[3]) == len(lines) > 0
    assert out[1] == hashlib.sha256("\n".join(lines).encode()).hexdigest()
