"""The README's entry point, ``run.sh``: its system check is reliable (it once reported libvulkan1 missing in 10
of 40 runs, because ``ldconfig -p | grep -q`` fails under ``pipefail`` when grep quits early)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_doctor_finds_the_installed_system_packages_every_time() -> None:
    # The suite runs after run.sh installed what was missing, so every check must find everything.
    answers = [
        subprocess.run(["bash", str(ROOT / "run.sh"), "doctor"], capture_output=True, text=True, cwd=ROOT)
        for _ in range(15)
    ]
    failures = [(a.returncode, a.stdout + a.stderr) for a in answers if a.returncode != 0]
    assert not failures, failures[:3]
    assert all(a.stdout.strip() == "system packages: ok" for a in answers)


def test_run_script_pipes_nothing_into_grep_q() -> None:
    script = (ROOT / "run.sh").read_text()
    assert "| grep -q" not in script


def test_user_scripts_outside_the_checkout_see_ortgpus_types(tmp_path: Path) -> None:
    """After run.sh's editable install, mypy on a script in another folder resolves ortgpu and its stubs (the
    default editable mode's import hook left it at import-not-found)."""
    script = tmp_path / "user_script.py"
    script.write_text(
        "import numpy as np\n"
        "import ortgpu\n"
        "env = ortgpu.Env(backend='fake')\n"
        "x = env.shared_allocator().from_numpy(np.zeros((2, 2), np.float32))\n"
        "reveal_type(x)\n"
        "x.numpy()\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert "import-not-found" not in output, output
    assert 'Revealed type is "ortgpu_core._value.OrtValue[ortgpu_core._value.WebGPU]"' in output, output
    assert 'Invalid self argument "OrtValue[WebGPU]"' in output, output  # numpy() on a device value is a type error


def test_every_module_imports_from_outside_the_checkout(tmp_path: Path) -> None:
    """The install carries every subpackage: one left out of setup.py's list imported from the checkout (pytest's
    own folder) but not from a user's, where ``import ortgpu`` failed on ``ortgpu.loader``."""
    code = (
        "import importlib, pkgutil, ortgpu, ortgpu_core\n"
        "names = [m.name for p in (ortgpu, ortgpu_core) for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(ortgpu.__file__, *names)\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    location, *imported = result.stdout.split()
    in_checkout = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in ("ortgpu", "ortgpu_core")
        for path in (ROOT / package).rglob("*.py*")
        if path.suffix in (".py", ".pyx") and path.name != "__init__.py"
    } | {".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.glob("ortgpu*/**/__init__.py")}
    assert in_checkout - {"ortgpu", "ortgpu_core"} <= set(imported), sorted(in_checkout - set(imported))
    assert not Path(location).resolve().is_relative_to(tmp_path)


@pytest.mark.wgpu_only
def test_opening_a_wgpu_device_prints_no_runtime_dir_warning(tmp_path: Path) -> None:
    """Mesa printed "XDG_RUNTIME_DIR is invalid or not set" four times per process when it was unset."""
    environment = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    code = "import ortgpu; env = ortgpu.Env(backend='wgpu'); env.default_device.features; env.close(); print('opened')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=environment)
    assert result.returncode == 0 and "opened" in result.stdout, result.stderr
    assert "XDG_RUNTIME_DIR" not in result.stderr, result.stderr


def test_setup_refuses_the_cython_that_builds_a_broken_allocator(tmp_path: Path) -> None:
    """Cython 3.3.0 builds an _allocator that fails to import; setup.py must say so and stop, naming the fix."""
    import os

    fake = tmp_path / "Cython"
    (fake / "Build").mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "3.3.0"\n')
    (fake / "Build" / "__init__.py").write_text("def cythonize(modules, **options):\n    return []\n")
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "setup.py", "--version"], capture_output=True, text=True, cwd=ROOT, env=environment
    )
    assert result.returncode != 0
    assert "Cython 3.3.0 builds a broken ortgpu_core._allocator" in result.stderr + result.stdout
    assert "!=3.3.0" in result.stderr + result.stdout  # says what to install


def test_project_license_is_an_spdx_string() -> None:
    """A TOML-table license made setuptools warn at every build."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
