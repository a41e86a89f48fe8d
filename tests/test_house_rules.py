"""Rules of the tree that a review once enforced by hand and that drifted: small modules, no lab notebook, product
text that gives reasons rather than session or run numbers.  Each is cheap to check, so CI checks it."""

from __future__ import annotations

import enum
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ortgpu", "ortgpu_core", "stubs")
SOURCE_SUFFIXES = {".py", ".pyx", ".pxd", ".pyi"}
#: Files made by a tool rather than written, exempt from the size rule: the cffi declarations preprocessed from
#: wgpu-native's pinned headers.
GENERATED = {"ortgpu_core/backends/resources/wgpu_native.cdef.h"}
MAX_LINES = 650


def _product_files() -> list[Path]:
    files = []
    for package in PACKAGES:
        files += [p for p in (ROOT / package).rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()]
    assert files, "no product file found: the rule would check nothing"
    return sorted(files)


def test_no_product_module_is_longer_than_a_sitting() -> None:
    too_long = {
        str(path.relative_to(ROOT)): n
        for path in _product_files()
        if str(path.relative_to(ROOT)) not in GENERATED and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines (split them by job): {too_long}"


#: What a lab notebook leaves in product text: session and run numbers, dated measurements, result folders.
NOTEBOOK = re.compile(
    r"\bsession \d+\b|\bs\d{1,2} run\b|\bruns? \d+(-\d+)?\b|bench/results/|\b20\d\d-\d\d-\d\d\b",
    re.IGNORECASE,
)


def test_product_text_cites_no_session_run_or_result_folder() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _product_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NOTEBOOK.search(line)
    ]
    assert not hits, "product files cite sessions, runs or dates (figures belong in bench/RESULTS.md):\n" + "\n".join(
        hits
    )


def test_the_notebook_rule_catches_what_it_is_for() -> None:
    for text in ("measured in session 17", "runs 4-8 agree", "see bench/results/x", "on 2026-12-03"):
        assert NOTEBOOK.search(text), text
    for text in ("run the graph", "a session's runner", "sessions 2 and more", "rerun it"):
        assert not NOTEBOOK.search(text), text


def test_the_lab_notebook_is_out_of_the_tree() -> None:
    assert not (ROOT / "bench" / "results").exists()
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    assert len(results.splitlines()) < 400, "bench/RESULTS.md is a table of current figures, not a diary"


@pytest.mark.parametrize("path", ["pyproject.toml", ".pre-commit-config.yaml"])
def test_the_linters_are_configured(path: str) -> None:
    text = (ROOT / path).read_text()
    for tool in ("ruff", "cython-lint", "import"):
        assert tool in text, f"{path} does not configure {tool}"


def _undocumented_public_names() -> list[str]:
    """Public names of ``ortgpu`` (classes, functions, and the classes' public methods, properties and attributes)
    whose docstring is missing, or is only the signature Cython embeds."""
    import inspect

    import ortgpu

    missing = []
    for name in sorted(ortgpu.__all__):
        obj = getattr(ortgpu, name)
        if inspect.ismodule(obj) or not (callable(obj) or inspect.isclass(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException) or issubclass(obj, enum.Enum):
            continue
        for attribute, member in vars(obj).items():
            if attribute.startswith("_"):
                continue
            if isinstance(member, (classmethod, staticmethod)):
                member = member.__func__
            elif not (callable(member) or inspect.isdatadescriptor(member)):
                continue  # a constant
            text = (member.__doc__ or "").strip()
            if not text or (text.startswith(f"{attribute}(") and "\n" not in text):
                missing.append(f"{name}.{attribute}")
    return missing


def test_every_public_name_has_a_docstring() -> None:
    missing = _undocumented_public_names()
    assert not missing, f"{len(missing)} public names have no docstring: {missing}"
