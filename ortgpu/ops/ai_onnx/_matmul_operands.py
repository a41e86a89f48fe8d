"""How MatMul reads its operands: as they are, through a folded Transpose (``_input_perms``), or as a strided view
(``_input_views``); the attributes' checks, the strides the kernels read by, and the numpy operands of the twins.
The attributes are described in :mod:`ortgpu.ops.ai_onnx.matmul`."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._tiling import c_strides

__all__ = [
    "InputView",
    "Perm",
    "Read",
    "canonical",
    "input_perms",
    "input_views",
    "operand_strides",
    "permuted",
    "read_through",
    "strided",
    "transposed",
]

Perm = tuple[int, ...]


def input_perms(attrs: Mapping[str, Any], shapes: Sequence[tuple[int, ...]]) -> tuple[Perm | None, Perm | None]:
    """The ``_input_perms`` attribute, checked against the two inputs' shapes."""
    raw = attrs.get("_input_perms")
    if raw is None:
        return None, None
    if not isinstance(raw, (tuple, list)) or len(raw) != 2:
        raise UnsupportedOpError(f"MatMul: _input_perms must be (perm_a, perm_b), got {raw!r}")
    perms: list[Perm | None] = []
    for index, (perm, shape) in enumerate(zip(raw, shapes)):
        if perm is None:
            perms.append(None)
            continue
        perm = tuple(int(p) for p in perm)
        if len(shape) < 2 or sorted(perm) != list(range(len(shape))):
            raise UnsupportedOpError(
                f"MatMul: _input_perms[{index}] = {perm} is not a permutation of input "
                f"{index}'s {len(shape)} axes (rank >= 2)"
            )
        perms.append(perm)
    return perms[0], perms[1]


#: An operand read as a strided view of its input: ``(shape, element strides, element offset)``.
InputView = tuple[tuple[int, ...], tuple[int, ...], int]
#: How the strided GEMM reads an operand: canonical strides, the offset, and the numpy operand from the input.
Read = tuple[tuple[int, ...], int, Callable[[np.ndarray], np.ndarray]]


def input_views(attrs: Mapping[str, Any], sizes: Sequence[int]) -> tuple[InputView | None, InputView | None]:
    """The ``_input_views`` attribute, checked against the inputs' element counts ``sizes``: every element a view
    reaches lies in its input."""
    raw = attrs.get("_input_views")
    if raw is None:
        return None, None
    if not isinstance(raw, (tuple, list)) or len(raw) != 2 or attrs.get("_input_perms") is not None:
        raise UnsupportedOpError(f"MatMul: _input_views must be (view_a, view_b), without _input_perms, got {raw!r}")
    views: list[InputView | None] = []
    for index, (view, size) in enumerate(zip(raw, sizes)):
        if view is None:
            views.append(None)
            continue
        shape, strides, offset = (tuple(int(x) for x in view[0]), tuple(int(x) for x in view[1]), int(view[2]))
        reach = offset + sum((n - 1) * st for n, st in zip(shape, strides)) if all(shape) else -1
        if len(shape) < 2 or len(strides) != len(shape) or min(strides + (offset,)) < 0 or reach >= size:
            raise UnsupportedOpError(
                f"MatMul: _input_views[{index}] = {view!r} is no view of rank >= 2 within input {index}'s "
                f"{size} elements"
            )
        views.append((shape, strides, offset))
    return views[0], views[1]


def strided(array: np.ndarray, view: InputView) -> np.ndarray:
    """``view`` of ``array`` (read only: a view of the caller's data)."""
    shape, strides, offset = view
    flat = np.ascontiguousarray(array).reshape(-1)[offset:]
    return np.lib.stride_tricks.as_strided(flat, shape, tuple(st * flat.itemsize for st in strides), writeable=False)


def read_through(shape: tuple[int, ...], perm: Perm | None, view: InputView | None) -> Read:
    """How the strided GEMM reads an operand of ``shape``: through ``view``, ``perm`` or neither."""
    if view is not None:
        return canonical(shape, view[1]), view[2], lambda array: strided(array, view)
    return operand_strides(shape, perm), 0, lambda array: transposed(array, perm)


def permuted(shape: tuple[int, ...], perm: Perm | None) -> tuple[int, ...]:
    return shape if perm is None else tuple(shape[p] for p in perm)


def transposed(array: np.ndarray, perm: Perm | None) -> np.ndarray:
    return array if perm is None else np.transpose(array, perm)


def operand_strides(logical: tuple[int, ...], perm: Perm | None) -> tuple[int, ...]:
    """Element strides of the operand ``numpy.transpose(source, perm)`` of shape ``logical``, per logical axis, in
    the canonical form of :func:`canonical`."""
    if perm is None:
        return canonical(logical, c_strides(logical))
    source = [0] * len(perm)
    for axis, p in enumerate(perm):
        source[p] = logical[axis]
    source_strides = c_strides(source)
    return canonical(logical, tuple(source_strides[p] for p in perm))


def canonical(shape: tuple[int, ...], strides: Sequence[int]) -> tuple[int, ...]:
    """``strides`` with 0 on every size-1 axis.

    Such an axis is only ever indexed at 0, so its stride is meaningless: a Transpose that moves it (``[1, S, D] ->
    [S, 1, D]``) hands it whatever stride its old place had.  Comparing layouts, merging axes or checking vec4
    alignment on that value refuses layouts that are in fact contiguous, so every check here sees 0 instead.
    """
    return tuple(0 if size == 1 else int(stride) for size, stride in zip(shape, strides))
