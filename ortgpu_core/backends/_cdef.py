"""Turn wgpu-native's C headers (``webgpu.h`` + ``wgpu.h``) into a cffi ``cdef``.

cffi's parser (pycparser) understands plain C declarations only: no
preprocessor, no attributes, no ``static const`` with initialisers.  This module
is a small, purpose-built preprocessor for the two pinned headers that ship in
the ``wgpu`` wheel's ``resources/`` folder:

* comments are removed and backslash continuations joined;
* ``#if``/``#ifdef``/``#ifndef`` blocks are kept, except those whose condition
  mentions ``__cplusplus`` or ``_WIN32`` (we are C, and ABI mode never needs
  the Windows export branch); the matching ``#else`` branch is kept instead;
* macros defined as *empty* (``WGPU_EXPORT``, ``WGPU_NULLABLE``,
  ``WGPU_*_ATTRIBUTE``) are deleted wherever they are used;
* ``#define NAME value`` is kept when ``value`` is an integer constant
  expression (after unwrapping ``UINT32_C(...)`` and naming ``UINT32_MAX``,
  ``UINT64_MAX``, ``SIZE_MAX``); every other ``#define`` (initialiser macros,
  ``NAN``) and every ``#include`` is dropped;
* ``static const T NAME = expr;`` (the flag constants) becomes
  ``#define NAME value``, with ``expr`` evaluated.

The result is committed as ``resources/wgpu_native.cdef.h`` and loaded at run
time; ``tests/test_backend_wgpu.py`` regenerates it from the installed headers
and fails on drift.  Regenerate with ``python -m ortgpu_core.backends._cdef``.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

__all__ = [
    "wgpu_resources_dir",
    "generated_cdef_path",
    "generate_cdef",
    "preprocess_header",
    "empty_macro_names",
]

HEADER_NAMES = ("webgpu.h", "wgpu.h")

# The values of the <stdint.h> limits the headers use, for a 64-bit platform
# (the only kind wgpu wheels are built for that ortgpu supports).
_KNOWN_CONSTANTS = {
    "UINT32_MAX": 0xFFFFFFFF,
    "UINT64_MAX": 0xFFFFFFFFFFFFFFFF,
    "SIZE_MAX": 0xFFFFFFFFFFFFFFFF,
}
# Conditions naming these are false for us; every other condition is true.
_FALSE_CONDITION_NAMES = ("__cplusplus", "_WIN32")

_DEFINE = re.compile(r"#\s*define\s+([A-Za-z_]\w*)(\([^)]*\))?(?:\s+(.*))?$")
_STATIC_CONST = re.compile(r"static\s+const\s+\w+\s+([A-Za-z_]\w*)\s*=\s*([^;]+);")


def wgpu_resources_dir() -> Path:
    """The ``resources/`` folder of the installed ``wgpu`` package (found without importing it)."""
    spec = importlib.util.find_spec("wgpu")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the 'wgpu' package (which carries wgpu-native) is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "resources"


def generated_cdef_path() -> Path:
    """Where the committed cdef lives."""
    return Path(__file__).parent / "resources" / "wgpu_native.cdef.h"


def _strip_comments(text: str) -> str:
    # Headers hold no string literals containing comment markers outside
    # `extern "C"`, so a regex is enough.
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", text)


def _evaluate_integer(expression: str) -> int | None:
    """The value of a C integer constant expression, or ``None`` if it is not one we accept."""
    text = re.sub(r"\b(?:U?INT(?:8|16|32|64)_C)\s*\(", "(", expression.strip())
    for name, value in _KNOWN_CONSTANTS.items():
        text = re.sub(rf"\b{name}\b", str(value), text)
    text = re.sub(r"\b(0[xX][0-9A-Fa-f]+|\d+)[uUlL]+\b", r"\1", text)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    return _evaluate_node(tree.body)


def _evaluate_node(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Invert)):
        operand = _evaluate_node(node.operand)
        if operand is None:
            return None
        return -operand if isinstance(node.op, ast.USub) else ~operand
    if isinstance(node, ast.BinOp):
        left, right = _evaluate_node(node.left), _evaluate_node(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.BitOr):
            return left | right
        if isinstance(node.op, ast.BitAnd):
            return left & right
        if isinstance(node.op, ast.LShift):
            return left << right
        if isinstance(node.op, ast.Add):
            return left + right
    return None


def _format_define(name: str, value: int) -> str:
    return f"#define {name} {value:#x}" if value >= 0 else f"#define {name} {value}"


def _clean_lines(text: str) -> list[str]:
    return _strip_comments(text.replace("\\\n", " ")).split("\n")


def empty_macro_names(text: str) -> set[str]:
    """The macros ``text`` defines as empty (the attribute macros), e.g. ``WGPU_NULLABLE``."""
    names = set()
    for line in _clean_lines(text):
        match = _DEFINE.match(line.strip())
        if match and match.group(2) is None and not (match.group(3) or "").strip():
            names.add(match.group(1))
    return names


def preprocess_header(text: str, empty_macros: set[str] | None = None) -> str:
    """One header's text, preprocessed into cdef text (see the module docstring).

    ``empty_macros`` are the attribute macros to delete; by default those
    ``text`` defines itself (``wgpu.h`` uses the ones ``webgpu.h`` defines).
    """
    lines = _clean_lines(text)
    if empty_macros is None:
        empty_macros = empty_macro_names(text)
    empty_pattern = re.compile(r"\b(?:" + "|".join(sorted(empty_macros)) + r")\b") if empty_macros else None

    out: list[str] = []
    # A stack of (this branch is kept, the enclosing block is kept).
    stack: list[tuple[bool, bool]] = []
    for raw in lines:
        line = raw.strip()
        keeping = all(kept for kept, _ in stack)
        if line.startswith("#"):
            directive = line[1:].strip()
            keyword = directive.split(None, 1)[0] if directive else ""
            if keyword in ("if", "ifdef", "ifndef"):
                condition_true = not any(name in directive for name in _FALSE_CONDITION_NAMES)
                stack.append((condition_true, keeping))
            elif keyword in ("elif", "else"):
                if not stack:
                    raise ValueError(f"#{keyword} without #if")
                kept, outer = stack.pop()
                # Conditions with a false name are two-way; keep the other branch.
                stack.append((not kept, outer))
            elif keyword == "endif":
                if not stack:
                    raise ValueError("#endif without #if")
                stack.pop()
            elif keyword == "define" and keeping:
                match = _DEFINE.match(line)
                if match and match.group(2) is None and match.group(3):
                    value = _evaluate_integer(match.group(3))
                    if value is not None:
                        out.append(_format_define(match.group(1), value))
            # #include, #undef, #pragma: dropped.
            continue
        if not keeping or not line:
            continue
        if empty_pattern is not None:
            line = empty_pattern.sub("", line)
        match = _STATIC_CONST.search(line)
        if match:
            value = _evaluate_integer(match.group(2))
            if value is None:
                raise ValueError(f"cannot evaluate the constant in: {line}")
            out.append(_format_define(match.group(1), value))
            continue
        line = re.sub(r"[ \t]+", " ", line).strip()
        out.append(re.sub(r"\s+;", ";", line))
    if stack:
        raise ValueError("unterminated #if block")
    return "\n".join(out) + "\n"


def generate_cdef(resources: Path | None = None) -> str:
    """The cdef text for wgpu-native, generated from the headers in ``resources``."""
    folder = wgpu_resources_dir() if resources is None else resources
    parts = [
        "/* Generated by ortgpu_core/backends/_cdef.py from wgpu-native's webgpu.h and wgpu.h."
        " Do not edit; regenerate. */\n"
    ]
    texts = {name: (folder / name).read_text(encoding="utf-8") for name in HEADER_NAMES}
    empty_macros: set[str] = set()
    for text in texts.values():
        empty_macros |= empty_macro_names(text)
    for name, text in texts.items():
        parts.append(f"/* ---- {name} ---- */\n")
        parts.append(preprocess_header(text, empty_macros))
    return "".join(parts)


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    target = generated_cdef_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(generate_cdef(), encoding="utf-8")
    print(f"wrote {target}")
