"""A product stored as several outputs, split by columns: sibling projections computed as one GEMM.

Projections that read the same activations (a transformer's query, key and value; a gated MLP's gate and up) run
as one product against their weights side by side, ``[K, N_1 + ... + N_p]``; its columns are stored into ``p``
outputs, output ``i`` taking ``N_i`` of them (``[..., M, N_i]``, contiguous as if computed alone).  One dispatch
replaces ``p`` and the combined problem fills more of the GPU (small ``M`` and ``N`` leave most of it idle).

The GEMM and GEMV kernels store through :func:`output_store`: with one output, the plain store; with several, a
WGSL function that finds the output of a column (a few comparisons, uniform across a vec4 of columns whenever each
``N_i`` is a multiple of 4) and the element's place in it.  :func:`split_columns` is the numpy twin.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ._kernel import Binding, TensorInfo
from ._tiling import BindingTable

__all__ = ["column_parts", "output_store", "split_columns"]


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


def split_columns(y: np.ndarray, parts: Sequence[int]) -> list[np.ndarray]:
    """``y``'s columns as the outputs hold them (``[y]`` for no parts)."""
    if not parts:
        return [y]
    bounds = np.cumsum(parts)[:-1]
    return [np.ascontiguousarray(part) for part in np.split(y, bounds, axis=-1)]


def output_store(
    table: BindingTable, element: str, outputs: Sequence[TensorInfo], out_shape: tuple[int, ...]
) -> tuple[str, Callable[[str, str], str]]:
    """Bind the outputs; return the WGSL helpers and ``store(o, value)``: the statement storing ``epilogue(value,
    o)`` for element ``o`` of the product (linear, C order), into the output holding its column."""
    parts = column_parts(outputs, out_shape)
    if not parts:
        output = table.add(Binding("output", 0), element, writable=True)
        return "", lambda o, value: f"{output}[{o}] = epilogue({value}, {o});"
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
