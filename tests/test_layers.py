"""Layers: the packages' imports form no circle, and import-linter's contracts (pyproject.toml) hold.

The circle check reads the source itself: every ``import`` and ``from ... import`` in the ``.py`` files (those
inside functions too, since a deferred import is still a dependency), relative imports resolved, and the
``import``/``from``/``cimport`` lines of the Cython ``.pyx``/``.pxd`` files, which ``ast`` cannot parse and
import-linter (grimp) does not read.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ortgpu", "ortgpu_core")

# ``from X cimport a, b`` / ``from X import a`` / ``cimport X`` / ``import X, Y`` at the start of a Cython line.
_CYTHON_FROM = re.compile(r"^\s*from\s+([.\w]+)\s+c?import\s+(.+)$")
_CYTHON_IMPORT = re.compile(r"^\s*c?import\s+(.+)$")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _source_files() -> dict[str, list[Path]]:
    """The packages' source files by module name (a ``.pyx`` and its ``.pxd`` are one module)."""
    files: dict[str, list[Path]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix in (".py", ".pyx", ".pxd") and "resources" not in path.parts:
                files.setdefault(_module_name(path), []).append(path)
    return files


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a (possibly relative) import found in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _imported_names(path: Path, module: str) -> set[str]:
    """Every name ``path`` imports, absolute; ``from A import b`` gives ``A.b``, which names module ``A.b`` or, when
    ``b`` is not a module, something in module ``A`` (the graph maps it to the deepest module it names, as grimp)."""
    is_package = path.stem == "__init__"
    names: set[str] = set()
    if path.suffix == ".py":
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node.level, node.module)
                names.update(f"{base}.{alias.name}" for alias in node.names)
        return names
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0]
        match = _CYTHON_FROM.match(line)
        if match:
            target = match.group(1)
            level = len(target) - len(target.lstrip("."))
            base = _resolve(module, is_package, level, target.lstrip(".") or None)
            items = match.group(2).strip().strip("()")
            names.update(f"{base}.{item.split(' as ')[0].strip()}" for item in items.split(",") if item.strip())
            continue
        match = _CYTHON_IMPORT.match(line)
        if match:
            names.update(item.split(" as ")[0].strip() for item in match.group(1).split(","))
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (each imported name mapped to the deepest module it names)."""
    files = _source_files()
    graph: dict[str, set[str]] = {name: set() for name in files}
    for module, paths in files.items():
        for path in paths:
            for name in _imported_names(path, module):
                parts = name.split(".")
                while parts and ".".join(parts) not in files:
                    parts.pop()
                target = ".".join(parts)
                if target and target != module:
                    graph[module].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:
        nonlocal counter
        # Iterative depth-first search: a recursive one would be deep on a long import chain.
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(components, key=len, reverse=True)


def _a_circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete circle inside a strongly connected component: a path from its first module back to itself."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = previous[node]
                    return [start, *reversed(path[1:]), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component


#: Circles still in the tree, each with why it is there; the test fails on any other circle, and on an entry here
#: that is no longer a circle (so the list only shrinks).  Each entry is a strongly connected component.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}


def test_the_graph_sees_function_level_relative_and_cython_imports() -> None:
    graph = import_graph()
    # A Cython cimport of a sibling .pxd; a relative import; a function-level import (the Env's backends).
    assert "ortgpu_core._value" in graph["ortgpu_core._binding"]
    assert "ortgpu.ops._kernel" in graph["ortgpu.ops"]
    assert "ortgpu_core.backends.fake" in graph["ortgpu_core._env"]


def test_no_import_circle_between_modules() -> None:
    graph = import_graph()
    found = {frozenset(component): component for component in find_cycles(graph)}
    new = [component for key, component in found.items() if key not in KNOWN_CIRCLES]
    assert not new, "import circles (function-level and TYPE_CHECKING imports counted):\n" + "\n".join(
        f"  {' -> '.join(_a_circle(graph, component))}\n    (strongly connected: {', '.join(component)})"
        for component in new
    )
    gone = [", ".join(sorted(key)) for key in KNOWN_CIRCLES if key not in found]
    assert not gone, "no longer circles: remove them from KNOWN_CIRCLES:\n  " + "\n  ".join(gone)


def test_the_operators_never_import_the_loader_or_the_session() -> None:
    graph = import_graph()
    above = ("ortgpu.loader", "ortgpu._session", "ortgpu._runner", "ortgpu._planner", "ortgpu._executor")
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("ortgpu.ops")
        for target in targets
        if target.startswith(above) or target == "ortgpu"
    )
    assert not wrong, "operators importing what sits above them:\n  " + "\n  ".join(wrong)


def test_the_core_never_imports_ortgpu_and_the_backends_never_import_the_object_model() -> None:
    # import-linter's contracts say the same for .py files; this covers the Cython modules too.
    graph = import_graph()
    below_the_object_model = (
        "ortgpu_core.backends",
        "ortgpu_core._errors",
        "ortgpu_core._dtypes",
        "ortgpu_core._dlpack",
    )
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("ortgpu_core")
        for target in targets
        if target == "ortgpu"
        or target.startswith("ortgpu.")
        or (module.startswith("ortgpu_core.backends") and not target.startswith(below_the_object_model))
    )
    assert not wrong, "imports against the core's layers:\n  " + "\n  ".join(wrong)


def test_import_linter_contracts_hold() -> None:
    """The contracts in pyproject.toml's [tool.importlinter] (``lint-imports``, from the ``test`` extra)."""
    script = Path(sys.executable).with_name("lint-imports")
    command = str(script) if script.exists() else shutil.which("lint-imports")
    assert command, "lint-imports is missing: pip install -e '.[test]' (it installs import-linter)"
    result = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
