"""A product's first operand read as the softmax of its input, from row statistics: the Softmax between an
attention's two products folded into the second one's loads.

Unfused, ``P = Softmax(S)`` reads the scores ``S`` and writes ``P`` (as many bytes again), and the product ``P.V``
reads ``P``.  Folded, one kernel walks each row of ``S`` once and keeps two numbers per row, its maximum ``mx`` and
the reciprocal ``1 / sum(exp(s - mx))`` (an online maximum: a larger value rescales the running sum), and the
product's A loads compute ``exp(s - mx) * reciprocal`` from ``S`` itself: ``P`` is never stored.  The exponentials
move into the product's tile loads, where each element of ``S`` is loaded once per column tile of the output (one
tile where V's head is no wider than the tile's 64 columns).

The statistics live in a scratch buffer of the product's plan (``vec2<f32>`` per row: maximum, reciprocal sum), the
operand's rows in C order, so the row of the element at flat offset ``e`` is ``e / K``: the operand must be read
contiguously from the input's start.  A row that is all ``-inf`` (fully masked) gives ``0 * inf = NaN`` as the
Softmax kernel's ``0 / 0`` does; a NaN anywhere in a row makes the row NaN.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ortgpu_core.backends.protocol import KernelTwin

from .._types import element_count
from ._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, TensorInfo
from ._tiling import BindingTable, c_strides, float_element, row_kernel_header, row_kernel_prologue, row_layout

__all__ = [
    "STATS_ELEMENT",
    "check_softmax_operand",
    "softmax_of",
    "softmax_operands",
    "softmax_stats_kernel",
    "softmax_load",
]

#: An operand read as a strided view: ``(shape, element strides, element offset)``.
View = tuple[tuple[int, ...], tuple[int, ...], int]
Operands = Callable[[list["np.ndarray | None"]], tuple[np.ndarray, np.ndarray]]

_FLOAT32_MAX = float(np.finfo(np.float32).max)

#: The WGSL element of the statistics scratch buffer: (row maximum, reciprocal of the row's sum of exponentials).
STATS_ELEMENT = "vec2<f32>"


def softmax_of(a: np.ndarray) -> np.ndarray:
    """The numpy twin of the folded operand: the softmax of ``a`` over its last axis, computed in float64 and
    returned in float32 (the loads hand the product f32 values; a float16 input is not rounded back)."""
    if a.shape[-1] == 0:  # rows of no element: nothing to normalise (the product over K = 0 is zeros)
        return np.zeros(a.shape, dtype=np.float32)
    wide = a.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(wide - np.max(wide, axis=-1, keepdims=True))
        return np.asarray(e / np.sum(e, axis=-1, keepdims=True), dtype=np.float32)


def check_softmax_operand(
    op_type: str,
    a_shape: tuple[int, ...],
    trans_a: bool,
    a_perm: tuple[int, ...] | None,
    a_view: View | None,
    source: TensorInfo | None,
) -> None:
    """``NotOnDevice`` unless A (of ``a_shape``) is all of input 0 (``source``) read in C order from its start: the
    statistics index rows by flat offset.  A view's strides on size-1 axes are not compared (never stepped)."""

    def ordered(view: View) -> bool:
        shape, strides, offset = view
        steps = [(st, c) for n, st, c in zip(shape, strides, c_strides(shape)) if n != 1]
        return offset == 0 and all(st == c for st, c in steps)

    contiguous = a_view is None or (
        ordered(a_view) and source is not None and element_count(a_view[0]) == element_count(source.shape)
    )
    if trans_a or a_perm is not None or not contiguous or len(a_shape) < 2:
        raise NotOnDevice(f"{op_type}: a softmax operand must be its whole input read in order; run the Softmax alone")


def softmax_operands(operands: Operands) -> Operands:
    """The split-K twin's ``operands`` (:class:`~ortgpu.ops._gemm_wgsl.GemmProblem`) with A replaced by its softmax."""

    def softmaxed(full: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
        a, b = operands(full)
        return softmax_of(a), b

    return softmaxed


def _stats_twin(rows: int, length: int, info: TensorInfo, bindings: Sequence[Binding]) -> KernelTwin:
    source = next(slot for slot, b in enumerate(bindings) if b.kind == "input")
    target = next(slot for slot, b in enumerate(bindings) if b.kind == "scratch")

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        x = arrays[source][: info.nbytes].view(info.dtype).reshape(rows, length).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            top = np.maximum(np.max(x, axis=1, keepdims=True), -_FLOAT32_MAX)  # the kernel's starting maximum
            stats = np.stack([top[:, 0], 1.0 / np.sum(np.exp(x - top), axis=1)], axis=1)
        raw = np.ascontiguousarray(stats, dtype=np.float32).reshape(-1).view(np.uint8)
        arrays[target][: raw.size] = raw

    return twin


def softmax_stats_kernel(name: str, info: TensorInfo, length: int, scratch: int, caps: DeviceCaps) -> KernelSpec:
    """The kernel writing the statistics of input 0 (``info``: float32 or float16, rows of ``length`` elements in C
    order) into scratch buffer ``scratch``, one ``vec2<f32>`` per row."""
    rows = info.size // length
    layout = row_layout((rows, length), (1,))
    _, rows_per_group, grid, helpers = row_kernel_header(layout, caps, name, loops=1)
    table = BindingTable()
    element = float_element(info)
    x = table.add(Binding("input", 0), element)
    stats = table.add(Binding("scratch", scratch), STATS_ELEMENT, writable=True)
    wgsl = f"""{table.enables()}{table.declarations()}
{helpers}
{row_kernel_prologue(grid, rows_per_group)}
    var mx = -3.402823466e+38f;
    var s = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            let v = f32({x}[base + r]);
            if (v > mx) {{ s = s * exp(mx - v) + 1.0; mx = v; }} else {{ s = s + exp(v - mx); }}
        }}
    }}
    let row_max = wg_max(mx, t, slot);
    let row_sum = wg_sum(s * exp(mx - row_max), t, slot);
    if (valid && t == 0u) {{ {stats}[row] = vec2<f32>(row_max, 1.0 / row_sum); }}
}}
"""
    return KernelSpec(name, wgsl, grid, tuple(table.bindings), _stats_twin(rows, length, info, table.bindings))


def softmax_load(value: str, offset: str, k: int, stats: str, vector: bool) -> str:
    """The body of an A loader returning the softmax of ``value`` (the f32 or ``vec4<f32>`` loaded at flat element
    ``offset``, WGSL expressions) from the row statistics bound as ``stats``; rows are ``k`` long."""
    top = "vec4<f32>(st.x)" if vector else "st.x"
    return f"    let st = {stats}[({offset}) / {k}u];\n    return exp({value} - {top}) * st.y;"
