"""Einsum: Einstein summation over the inputs, as the equation says (CPU reference).

The equation is validated first (letters, at most one ``...`` per term, one term per input, each term as long as
its input's rank, an output term of distinct letters that all occur on the left): a malformed equation is refused
with :class:`ShapeError` naming the problem, never guessed at.  Then numpy's ``einsum`` evaluates it (implicit mode,
without ``->``: the letters that occur once, in ASCII order, after the ellipsis dimensions), floats in float64 and
cast back to the input dtype, integers in their own dtype.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register

__all__ = ["Einsum", "parse_equation"]

_ELLIPSIS = "..."


def _split_term(op_type: str, term: str) -> tuple[str, bool]:
    """(letters, has an ellipsis) of one term; refuses other characters and a second ellipsis."""
    count = term.count(_ELLIPSIS)
    if count > 1:
        raise ShapeError(f"{op_type}: the term {term!r} has more than one ellipsis")
    letters = term.replace(_ELLIPSIS, "")
    bad = [c for c in letters if not (c.isascii() and c.isalpha())]
    if bad:
        raise ShapeError(f"{op_type}: the term {term!r} has characters other than letters and '...': {bad[0]!r}")
    return letters, count == 1


def parse_equation(op_type: str, equation: str, ranks: Sequence[int]) -> str:
    """The equation without spaces, checked against the inputs' ``ranks``; raises :class:`ShapeError`."""
    text = equation.replace(" ", "")
    if text.count("->") > 1:
        raise ShapeError(f"{op_type}: the equation {equation!r} has more than one '->'")
    left, arrow, right = text.partition("->")
    terms = left.split(",")
    if len(terms) != len(ranks):
        raise ShapeError(f"{op_type}: the equation {equation!r} has {len(terms)} input terms for {len(ranks)} inputs")
    seen: set[str] = set()
    any_ellipsis = False
    for index, (term, rank) in enumerate(zip(terms, ranks)):
        letters, ellipsis = _split_term(op_type, term)
        seen.update(letters)
        any_ellipsis |= ellipsis
        if len(letters) > rank or (not ellipsis and len(letters) != rank):
            raise ShapeError(f"{op_type}: the term {term!r} does not fit input {index} of rank {rank}")
    if arrow:
        letters, ellipsis = _split_term(op_type, right)
        if len(set(letters)) != len(letters):
            raise ShapeError(f"{op_type}: the output term {right!r} repeats a letter")
        missing = [c for c in letters if c not in seen]
        if missing:
            raise ShapeError(f"{op_type}: the output letter {missing[0]!r} does not occur in an input term")
        if ellipsis and not any_ellipsis:
            raise ShapeError(f"{op_type}: the output term {right!r} has '...' but no input term has")
        if any_ellipsis and not ellipsis:
            # numpy would sum over the ellipsis dimensions; onnxruntime refuses the equation
            raise UnsupportedOpError(
                f"{op_type}: the input terms have '...' but the output term {right!r} does not (summing over "
                "broadcast dimensions is not implemented; write the ellipsis in the output, or name the dimensions)"
            )
    return text


@register
class Einsum(Operator):
    """Einsum-12/28 (28 adds bfloat16)."""

    op_type = "Einsum"
    since_version = 12

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        arrays = [a for a in inputs if a is not None]
        if len(arrays) != len(inputs) or not arrays:
            raise ShapeError(f"{self.op_type}: every input must be present (got {len(arrays)} of {len(inputs)})")
        equation = attrs.get("equation")
        if isinstance(equation, bytes):
            equation = equation.decode()
        if not isinstance(equation, str):
            raise ShapeError(f"{self.op_type}: the equation attribute is required")
        dtype = arrays[0].dtype
        if any(a.dtype != dtype for a in arrays) or dtype.kind not in "fiu":
            raise UnsupportedOpError(
                f"{self.op_type}: inputs must share one numeric dtype, got {', '.join(str(a.dtype) for a in arrays)}"
            )
        text = parse_equation(self.op_type, equation, [a.ndim for a in arrays])
        wide = [a.astype(np.float64) for a in arrays] if dtype.kind == "f" else arrays
        try:
            result = np.einsum(text, *wide, optimize=len(wide) > 1)
        except ValueError as error:
            raise ShapeError(
                f"{self.op_type}: the equation {equation!r} does not fit the input shapes: {error}"
            ) from None
        return [np.asarray(result, dtype=dtype).copy()]  # copy: C order, and 0-d stays 0-d

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice(f"{self.op_type} runs on the CPU (no WebGPU kernel)")
