"""Static typing: mypy --strict on the package, the pass corpus and the fail corpus; stubtest on the stubs.

The fail corpus marks each line that must not type-check with ``# expect: [code]``;
the test asserts mypy reports exactly those lines with those codes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAIL_DIR = ROOT / "tests" / "typing" / "fail"
PASS_DIR = ROOT / "tests" / "typing" / "pass"
COMPILED_MODULES = [
    "ortgpu_core._env",
    "ortgpu_core._value",
    "ortgpu_core._allocator",
    "ortgpu_core._binding",
    "ortgpu_core._graph",
    "ortgpu_core._transfer",
    "ortgpu_core.backends._commands",
]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


def test_mypy_strict_on_package_bench_and_pass_corpus() -> None:
    result = run("-m", "mypy", "--strict", "ortgpu", "bench", str(PASS_DIR))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", sorted(FAIL_DIR.glob("*.py")), ids=lambda p: p.name)
def test_fail_corpus_reports_exactly_the_expected_errors(path: Path) -> None:
    expected = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = re.search(r"# expect: \[([a-z-]+)\]", line)
        if match:
            expected.add((number, match.group(1)))
    assert expected, f"{path.name} marks no line with '# expect: [code]'"
    result = run("-m", "mypy", "--strict", "--no-incremental", str(path))
    reported = set()
    for line in result.stdout.splitlines():
        match = re.match(rf"{re.escape(str(path.relative_to(ROOT)))}:(\d+): error: .*\[([a-z-]+)\]$", line)
        if match:
            reported.add((int(match.group(1)), match.group(2)))
    assert reported == expected, result.stdout


def test_stubtest_checks_the_compiled_modules() -> None:
    result = run(
        "-m",
        "mypy.stubtest",
        *COMPILED_MODULES,
        "--mypy-config-file",
        "pyproject.toml",
        "--allowlist",
        "stubs/allowlist.txt",
        env={"MYPYPATH": str(ROOT / "stubs")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
