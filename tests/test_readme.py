"""The README's Python examples run as written (the first thing a new user tries).

The API tour is self-contained (it writes its own ``model.onnx``; the test runs it in a temporary folder) and the
fake-backend example runs as is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_examples_this_test_runs() -> None:
    blocks = _python_blocks()
    assert len(blocks) == 3
    assert "sess.capture(binding, graph_id=0)" in blocks[0] and "FakeBackend" in blocks[2]
    assert "import ortgpu as ort  # was: import onnxruntime as ort" in blocks[1]


def test_api_tour_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ortgpu

    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    try:
        exec(compile(_python_blocks()[0], str(README) + " (API tour)", "exec"), namespace)
        # the tour's last replayed output is the model's output for the last batch
        batches = namespace["batches"]
        assert isinstance(batches, list)
        with ortgpu.InferenceSession(str(tmp_path / "model.onnx"), env=ortgpu.Env(backend="fake")) as reference:
            (expected,) = reference.run(None, {"X": batches[-1]})
        out = namespace["out"]
        assert isinstance(out, np.ndarray) and out.shape == (1, 1024) and np.count_nonzero(out) > 0
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    finally:
        env = namespace.get("env")
        if isinstance(env, ortgpu.Env) and env is not ortgpu.get_env():
            env.close()
    assert os.getcwd() == str(tmp_path)


def test_porting_example_runs_unchanged_but_for_the_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The onnxruntime program of "Porting from onnxruntime", on the API tour's model.onnx: its captured replay of
    a changed input equals a fresh run."""
    monkeypatch.chdir(tmp_path)
    tour: dict[str, object] = {}
    exec(compile(_python_blocks()[0], str(README) + " (API tour)", "exec"), tour)
    namespace: dict[str, object] = {}
    exec(compile(_python_blocks()[1], str(README) + " (porting)", "exec"), namespace)
    sess, y, batch = namespace["sess"], namespace["y"], namespace["batch"]
    assert sess.get_providers() == ["WebGpuExecutionProvider", "CPUExecutionProvider"]  # type: ignore[attr-defined]
    (fresh,) = sess.run(None, {"X": batch * 2})  # type: ignore[attr-defined, operator]
    np.testing.assert_array_equal(y.to_numpy(), fresh)  # type: ignore[attr-defined]
    assert np.count_nonzero(fresh) > 0
    by_name = namespace["by_name"]
    (allocated,) = by_name.get_outputs()  # type: ignore[attr-defined]
    assert allocated.device_name() == "webgpu" and allocated is not y
    np.testing.assert_array_equal(by_name.copy_outputs_to_cpu()[0], fresh)  # type: ignore[attr-defined]


def test_fake_backend_example_runs() -> None:
    """The snippet runs as written, its imports included (a snippet a user pastes must not need a line more)."""
    namespace: dict[str, object] = {}
    exec(compile(_python_blocks()[2], str(README) + " (fake backend)", "exec"), namespace)
    namespace["env"].close()  # type: ignore[attr-defined]


def test_demo_runs_and_checks_its_results(backend_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``./run.sh demo`` (``python -m ortgpu.demo``): the README's first command."""
    from ortgpu import demo

    assert demo.main(["--backend", backend_name, "--layers", "3", "--width", "64", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"model: 3 x \[MatMul 64x64 \+ Add \+ Relu\], batch 1; 9/9 nodes placed on WebGPU", out), out
    assert re.search(r"run\(\): output \[1, 64\], relative error vs numpy \d\.\d\de[+-]\d\d", out), out
    assert re.search(r"captured graph: 3 dispatches; replay on new input", out), out
    assert re.search(r"end to end, median of 3: run\(\) [\d.]+ ms, update_inplace \+ replay \+ to_numpy [\d.]+ ms", out)
    assert out.rstrip().endswith("OK")
