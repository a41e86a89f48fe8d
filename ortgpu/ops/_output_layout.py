"""How a GEMM or GEMV stores its product: as it is, split by columns into several outputs, or transposed.

**Split by columns** (sibling projections computed as one GEMM).  Projections that read the same activations (a transformer's query, key and value; a gated MLP's gate and up) run
as one product against their weights side by side, ``[K, N_1 + ... + N_p]``; its columns are stored into ``p``
outputs, output ``i`` taking ``N_i`` of them (``[..., M, N_i]``, contiguous as if computed alone).  One dispatch
replaces ``p`` and the combined problem fills more of the GPU (small ``M`` and ``N`` leave most of it idle).

**Transposed** (a Transpose after the product folded into its store: the heads of an attention merged back,
``[B, H, S, D] -> [B, S, H, D]``).  The output is ``numpy.transpose(product, perm)``; only permutations that keep the
last axis last are taken (:func:`store_permutation`), so a row of outputs stays contiguous and the stores coalesce.

The GEMM and GEMV kernels store through :func:`output_store`: with one output, the plain store (through an index
function for a transposed one); with several, a WGSL function that finds the output of a column (a few comparisons,
uniform across a vec4 of columns whenever each ``N_i`` is a multiple of 4) and the element's place in it.
:func:`laid_out` is the numpy twin of both.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ._kernel import Binding, TensorInfo
from ._tiling import BindingTable, c_strides, index_function

__all__ = [
    "column_parts",
    "holds_as",
    "laid_out",
    "output_parts",
    "output_store",
    "split_columns",
    "store_permutation",
]

Perm = tuple[int, ...]


def store_permutation(perm: Sequence[int] | None, rank: int) -> Perm | None:
    """``perm`` as a store permutation of a rank-``rank`` product (None for none or the identity).  Raises
    ``ValueError`` unless it permutes the axes and keeps the last one last."""
    if perm is None:
        return None
    checked = tuple(int(p) for p in perm)
    if sorted(checked) != list(range(rank)) or checked[-1] != rank - 1:
        raise ValueError(f"a store permutation must permute the {rank} axes and keep the last one last, got {perm!r}")
    return None if checked == tuple(range(rank)) else checked


def _permuted(shape: Sequence[int], perm: Perm | None) -> tuple[int, ...]:
    return tuple(shape) if perm is None else tuple(shape[p] for p in perm)


def holds_as(shape: Sequence[int], held: Sequence[int]) -> bool:
    """Whether an output of shape ``held`` holds a C-order array of ``shape``: the same shape, or it with adjacent
    axes merged (an attention's heads split in two for the product, one head axis in the graph)."""
    shape, held = [int(d) for d in shape if d != 1], [int(d) for d in held if d != 1]
    at = 0
    for size in held:
        product = 1
        while product < size and at < len(shape):
            product *= shape[at]
            at += 1
        if product != size:
            return False
    return at == len(shape)


def output_parts(outputs: Sequence[TensorInfo], out_shape: tuple[int, ...], perm: Perm | None) -> tuple[int, ...]:
    """:func:`column_parts` of ``outputs``, checked against ``perm``: raises ``ValueError`` where a split product is
    also transposed or one output does not hold the product transposed by ``perm``."""
    parts = column_parts(outputs, out_shape)
    if perm is not None and parts:
        raise ValueError("a product split by columns is not also transposed")
    if perm is not None and not holds_as(_permuted(out_shape, perm), outputs[0].shape):
        raise ValueError(f"output {outputs[0].shape} is not the product {out_shape} transposed by {perm}")
    return parts


def column_parts(outputs: Sequence[TensorInfo], out_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The column counts of ``outputs`` when they split the product ``out_shape`` by columns (``()`` for one
    output).  Raises ``ValueError`` unless every output has the product's leading axes and their columns add up."""
    if len(outputs) <= 1:
        return ()
    if not out_shape:
        raise ValueError("a product split by columns needs an output of rank >= 1")
    parts = tuple(int(info.shape[-1]) if info.shape else -1 for info in outputs)
    leading = out_shape[:-1]
    if any(tuple(info.shape[:-1]) != leading for info in outputs) or any(p <= 0 for p in parts):
        raise ValueError(
            f"outputs {[info.shape for info in outputs]} do not split a product of shape {out_shape} by columns"
        )
    if sum(parts) != out_shape[-1]:
        raise ValueError(f"the outputs' columns {parts} do not add up to the product's {out_shape[-1]}")
    return parts


def laid_out(
    y: np.ndarray, outputs: Sequence[TensorInfo], out_shape: tuple[int, ...], perm: Perm | None = None
) -> list[np.ndarray]:
    """The product ``y`` (shape ``out_shape``) as the outputs hold it: split by columns, or transposed by ``perm``."""
    if perm is not None:
        y = np.ascontiguousarray(np.transpose(y.reshape(out_shape), perm))
    parts = () if perm is not None else column_parts(outputs, out_shape)
    if parts:
        return split_columns(y, parts)
    # one output may hold the product under merged axes (:func:`holds_as`); references called with placeholder
    # output infos (shape unknown yet) keep the product's shape
    held = tuple(outputs[0].shape) if outputs else y.shape
    return [y.reshape(held) if int(np.prod(held)) == y.size else y]


def split_columns(y: np.ndarray, parts: Sequence[int]) -> list[np.ndarray]:
    """``y``'s columns as the outputs hold them (``[y]`` for no parts)."""
    if not parts:
        return [y]
    bounds = np.cumsum(parts)[:-1]
    return [np.ascontiguousarray(part) for part in np.split(y, bounds, axis=-1)]


def output_store(
    table: BindingTable,
    element: str,
    outputs: Sequence[TensorInfo],
    out_shape: tuple[int, ...],
    perm: Perm | None = None,
) -> tuple[str, Callable[[str, str], str]]:
    """Bind the outputs; return the WGSL helpers and ``store(o, value)``: the statement storing ``epilogue(value,
    o)`` for element ``o`` of the product (linear, C order), into the output holding its column, at its place
    after ``perm``."""
    parts = output_parts(outputs, out_shape, perm)
    if not parts:
        output = table.add(Binding("output", 0), element, writable=True)
        if perm is None:
            return "", lambda o, value: f"{output}[{o}] = epilogue({value}, {o});"
        strides = c_strides(_permuted(out_shape, perm))
        by_axis = [0] * len(perm)
        for position, axis in enumerate(perm):
            by_axis[axis] = strides[position]
        helper = index_function("store_index", out_shape, by_axis)
        return helper, lambda o, value: f"{output}[store_index({o})] = epilogue({value}, {o});"
    names = [table.add(Binding("output", index), element, writable=True) for index in range(len(parts))]
    total = out_shape[-1]
    lines = [
        "fn store_parts(o: u32, v: f32) {",
        "    let x = epilogue(v, o);",
        f"    let row = o / {total}u;",
        f"    let col = o - row * {total}u;",
    ]
    start = 0
    for index, (name, width) in enumerate(zip(names, parts)):
        place = f"row * {width}u + col" + (f" - {start}u" if start else "")
        if index == len(parts) - 1:
            lines.append(f"    {name}[{place}] = x;")
        else:
            lines.append(f"    if (col < {start + width}u) {{ {name}[{place}] = x; return; }}")
        start += width
    lines.append("}")
    return "\n".join(lines) + "\n", lambda o, value: f"store_parts({o}, {value});"
