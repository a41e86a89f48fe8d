"""Operators on string tensors: StringConcat, StringSplit, RegexFullMatch, StringNormalizer.

Strings are numpy object arrays of ``str``; they live on the host only (the planner places every node that
reads or writes one on the CPU), so these operators have a ``reference`` and no kernel.

RegexFullMatch uses Python's :mod:`re` with ``re.ASCII`` (as RE2, ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are
ASCII-only there) and refuses the RE2 syntax Python reads differently (POSIX classes such as ``[[:alpha:]]``,
which Python would take as a character set) and the Python syntax RE2 lacks (lookarounds, backreferences,
conditionals), as onnxruntime would refuse those patterns.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["StringConcat", "StringSplit", "RegexFullMatch", "StringNormalizer", "string_array"]


def string_array(x: np.ndarray | None, op_type: str, opset: int, what: str = "input") -> np.ndarray:
    """``x`` checked to be a string tensor (an object array of ``str``)."""
    if x is None:
        raise UnsupportedOpError(f"{op_type} (opset {opset}): the {what} is absent")
    if x.dtype != object:
        raise UnsupportedOpError(f"{op_type} (opset {opset}): the {what} must be a string tensor, got {x.dtype.name}")
    for item in x.flat:
        if not isinstance(item, str):
            raise UnsupportedOpError(
                f"{op_type} (opset {opset}): the {what} holds a {type(item).__name__}, not a str; string tensors "
                "are numpy object arrays of str"
            )
    return x


def _objects(values: Any, shape: tuple[int, ...]) -> np.ndarray:
    """An object array of ``shape`` from ``values`` (a scalar for 0-d shapes, nested sequences otherwise)."""
    out = np.empty(shape, dtype=object)
    if shape == ():
        out[()] = values
    else:
        out[...] = values
    return out


@register
class StringConcat(Operator):
    """StringConcat-20: ``X + Y`` element by element, broadcast numpy-style."""

    op_type = "StringConcat"
    since_version = 20

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = string_array(inputs[0], self.op_type, self.opset, "input X")
        y = string_array(inputs[1], self.op_type, self.opset, "input Y")
        try:
            shape = np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise ShapeError(
                f"StringConcat (opset {self.opset}): shapes {list(x.shape)} and {list(y.shape)} do not broadcast"
            ) from None
        out = np.empty(shape, dtype=object)
        for index, (a, b) in zip(np.ndindex(*shape), np.broadcast(x, y)):
            out[index] = a + b
        return [out]


@register
class StringSplit(Operator):
    """StringSplit-20: each string split on ``delimiter`` (unset or "": runs of whitespace, stripped), at most
    ``maxsplit`` times; Y pads each row with "" to the largest count, Z holds the counts (int64)."""

    op_type = "StringSplit"
    since_version = 20

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = string_array(inputs[0], self.op_type, self.opset)
        delimiter = attrs.get("delimiter")
        separator = None if delimiter is None or str(delimiter) == "" else str(delimiter)
        maxsplit = attrs.get("maxsplit")
        limit = -1 if maxsplit is None else int(maxsplit)
        if limit < 0 and maxsplit is not None:
            raise UnsupportedOpError(f"StringSplit (opset {self.opset}): maxsplit {maxsplit} is negative")
        if separator is None:
            # Python's split(None) strips both ends only when it splits everything; the spec removes leading
            # and trailing whitespace from the output in every case.
            pieces = [_split_whitespace(s, limit) for s in x.flat]
        else:
            pieces = [s.split(separator, limit) if s else [] for s in x.flat]  # "" has no substrings
        width = max((len(p) for p in pieces), default=0)
        y = np.full(x.shape + (width,), "", dtype=object)
        rows = y.reshape(-1, width) if width else y
        for row, parts in enumerate(pieces):
            for column, part in enumerate(parts):
                rows[row, column] = part
        z = np.array([len(p) for p in pieces], dtype=np.int64).reshape(x.shape)
        return [y, z]


def _split_whitespace(text: str, limit: int) -> list[str]:
    parts = text.split(None, limit)
    if parts:
        parts[-1] = parts[-1].rstrip()
    return parts


# Python syntax RE2 does not have (onnxruntime refuses such patterns), and RE2 syntax Python reads otherwise.
_NOT_RE2 = (
    (re.compile(r"\(\?(?:=|!|<=|<!)"), "lookarounds"),
    (re.compile(r"\(\?\("), "conditionals"),
    (re.compile(r"\\[1-9]|\(\?P="), "backreferences"),
    (re.compile(r"\[:\^?[a-z]+:\]"), "POSIX classes such as [[:alpha:]]"),
)


@register
class RegexFullMatch(Operator):
    """RegexFullMatch-20: whether each string matches ``pattern`` as a whole (bool)."""

    op_type = "RegexFullMatch"
    since_version = 20

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = string_array(inputs[0], self.op_type, self.opset)
        pattern = str(attrs.get("pattern", ""))
        compiled = self._compile(pattern)
        out = np.zeros(x.shape, dtype=np.bool_)
        for index, text in np.ndenumerate(x):
            out[index] = compiled.fullmatch(text) is not None
        return [out]

    def _compile(self, pattern: str) -> re.Pattern[str]:
        for check, what in _NOT_RE2:
            if check.search(pattern):
                raise UnsupportedOpError(
                    f"RegexFullMatch (opset {self.opset}): the pattern {pattern!r} uses {what}, which ortgpu does "
                    "not run (RE2 lacks them or reads them differently from Python's re)"
                )
        try:
            return re.compile(pattern, re.ASCII)
        except re.error as error:
            raise UnsupportedOpError(
                f"RegexFullMatch (opset {self.opset}): ortgpu cannot compile the pattern {pattern!r} ({error}); it "
                "runs patterns with Python's re, which lacks some RE2 syntax (\\p{..}, \\Q..\\E, \\z, \\C)"
            ) from None


@register
class StringNormalizer(Operator):
    """StringNormalizer-10: drop ``stopwords`` (case-insensitively unless ``is_case_sensitive``) from a [C] or
    [1, C] tensor, then lower/upper-case what remains; nothing left gives a single "" ([1] or [1, 1])."""

    op_type = "StringNormalizer"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = string_array(inputs[0], self.op_type, self.opset)
        if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)):
            raise ShapeError(
                f"StringNormalizer (opset {self.opset}): the input must have shape [C] or [1, C], got {list(x.shape)}"
            )
        action = str(attrs.get("case_change_action", "NONE"))
        if action not in ("NONE", "LOWER", "UPPER"):
            raise UnsupportedOpError(
                f"StringNormalizer (opset {self.opset}): case_change_action {action!r} is not LOWER, UPPER or NONE"
            )
        ascii_only = self._ascii_locale(str(attrs.get("locale", "")))
        sensitive = bool(int(attrs.get("is_case_sensitive", 0)))
        stopwords = [str(w) for w in attrs.get("stopwords", [])]
        if sensitive:
            stop = set(stopwords)
            kept = [s for s in x.flat if s not in stop]
        else:
            stop = {_change_case(w, False, ascii_only) for w in stopwords}
            kept = [s for s in x.flat if _change_case(s, False, ascii_only) not in stop]
        if action != "NONE":
            kept = [_change_case(s, action == "UPPER", ascii_only) for s in kept]
        if not kept:
            kept = [""]
        shape = (len(kept),) if x.ndim == 1 else (1, len(kept))
        return [_objects(kept, (len(kept),)).reshape(shape)]

    def _ascii_locale(self, locale: str) -> bool:
        """Whether ``locale`` changes the case of ASCII letters only ("C", "POSIX"); English locales (and the
        default, en_US) change every letter with a one-letter case mapping; others are refused (Turkish i...)."""
        name = locale.split(".")[0]
        if name in ("C", "POSIX"):
            return True
        if name == "" or name == "en" or name.startswith("en_"):
            return False
        raise UnsupportedOpError(
            f"StringNormalizer (opset {self.opset}): locale {locale!r} is not supported (ortgpu changes case as "
            "en_US, or C/POSIX for ASCII only)"
        )


def _change_case(text: str, upper: bool, ascii_only: bool) -> str:
    """``text`` upper- or lower-cased letter by letter, as C's ``towupper``/``towlower`` do: a letter whose case
    mapping is not one letter (``ß`` -> ``SS``) stays; with ``ascii_only``, only A-Z/a-z change."""
    out = []
    for char in text:
        if ascii_only and not char.isascii():
            out.append(char)
            continue
        changed = char.upper() if upper else char.lower()
        out.append(changed if len(changed) == 1 else char)
    return "".join(out)
