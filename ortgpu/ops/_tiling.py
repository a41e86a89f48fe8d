"""Code generation shared by the compute-heavy operators.

* literals, grids and binding tables for generated WGSL;
* index functions (a linear output index -> a broadcast input's index);
* checks, twins and one-kernel plans for kernels bound through a :class:`BindingTable`;
* workgroup reductions used by the row-wise operators (Softmax, LayerNormalization, Reduce*).

The fused epilogue is in :mod:`ortgpu.ops._epilogue`; the tiled GEMM in :mod:`ortgpu.ops._gemm` (its
configurations), :mod:`ortgpu.ops._gemm_wgsl` (its WGSL) and :mod:`ortgpu.ops._tiled_gemm` (its plans); the GEMV
in :mod:`ortgpu.ops._gemv`.

Shapes, strides and attributes are baked into the WGSL text as constants: the
device caches pipelines by text, and constant loop bounds let the compiler
unroll.  No string from the model ever reaches the WGSL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ortgpu_core.backends.protocol import KernelTwin

from .._types import computable, element_count
from ._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    flagging_twin,
)

__all__ = [
    "THREADS",
    "wgsl_f32",
    "grid_for_groups",
    "workgroup_index",
    "c_strides",
    "broadcast_strides",
    "index_function",
    "BindingTable",
    "reduction_threads",
    "workgroup_reduce_functions",
    "require_float32",
    "check_device_fits",
    "whole_op_twin",
    "single_kernel_plan",
]

#: Invocations per workgroup of the elementwise-style kernels.
THREADS = 256


# -- literals, grids ---------------------------------------------------------------------------------------------


def wgsl_f32(value: float) -> str:
    """A WGSL f32 literal that round-trips ``value`` as float32 (which must be finite)."""
    value32 = float(np.float32(value))
    if not math.isfinite(value32):
        raise ValueError(f"no WGSL literal for the non-finite float {value!r}")
    return f"{value32:.9e}f"


def grid_for_groups(groups: int, caps: DeviceCaps) -> tuple[int, int, int]:
    """A grid of at least ``groups`` workgroups, folded into (x, y) within the per-dimension limit.

    Kernels recover the linear workgroup index with :func:`workgroup_index` and
    skip (uniformly) the surplus workgroups of the last row.
    """
    limit = caps.limits.max_compute_workgroups_per_dimension
    groups = max(1, groups)
    if groups <= limit:
        return (groups, 1, 1)
    rows = -(-groups // limit)
    if rows > limit:
        raise NotOnDevice(f"{groups} workgroups exceed the device's grid of {limit} x {limit}")
    return (-(-groups // rows), rows, 1)


def workgroup_index(grid: tuple[int, int, int]) -> str:
    """WGSL expression of the linear workgroup index for ``grid`` (uses the builtin ``wid``)."""
    if grid[1] == 1:
        return "wid.x"
    return f"(wid.y * {grid[0]}u + wid.x)"


# -- shapes and index functions ------------------------------------------------------------------------------------


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of numpy's C layout."""
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * max(1, shape[axis + 1])
    return tuple(strides)


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Strides (in elements, per output axis) that read a ``shape`` tensor broadcast to ``out_shape``."""
    if len(shape) > len(out_shape):
        raise ValueError(f"shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides = c_strides(padded)
    result = []
    for size, out_size, stride in zip(padded, out_shape, strides):
        if size == out_size:
            result.append(stride if size != 1 else 0)
        elif size == 1:
            result.append(0)
        else:
            raise ValueError(f"shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
    return tuple(result)


def index_function(name: str, out_shape: Sequence[int], strides: Sequence[int]) -> str:
    """WGSL ``fn name(i: u32) -> u32``: the element of a tensor read with ``strides`` at linear index ``i``
    of ``out_shape``.  Size-1 and zero-stride axes vanish; contiguous runs of axes merge."""
    dims = list(zip(out_shape, strides))
    # An identity mapping (the tensor has the output's own layout) is the common case.
    if all(size == 1 or stride == c for (size, stride), c in zip(dims, c_strides(out_shape))):
        return f"fn {name}(i: u32) -> u32 {{ return i; }}\n"
    merged: list[list[int]] = []  # [size, stride, period] with period = product of inner output sizes
    period = 1
    for size, stride in reversed(dims):
        if size != 1 and stride != 0:
            if merged and merged[-1][2] * merged[-1][0] == period and merged[-1][1] * merged[-1][0] == stride:
                merged[-1][0] *= size
            else:
                merged.append([size, stride, period])
        period *= size
    total = period
    lines = [f"fn {name}(i: u32) -> u32 {{", "    var j = 0u;"]
    for size, stride, inner in merged:
        term = f"i / {inner}u" if inner != 1 else "i"
        if inner * size < total:
            term = f"({term}) % {size}u"
        lines.append(f"    j = j + ({term}) * {stride}u;")
    lines.append("    return j;")
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- bindings ------------------------------------------------------------------------------------------------------


class BindingTable:
    """Allocates ``@binding`` slots of one kernel and writes their WGSL declarations."""

    def __init__(self) -> None:
        self.bindings: list[Binding] = []
        self._declarations: list[str] = []
        self._names: dict[tuple[str, int, str], str] = {}

    def add(self, binding: Binding, element: str = "f32", *, writable: bool = False) -> str:
        """Bind ``binding`` as ``array<element>``; returns the WGSL variable name (reused if bound before)."""
        key = (binding.kind, binding.index, element)
        if key in self._names:
            return self._names[key]
        slot = len(self.bindings)
        name = f"{binding.kind}_{binding.index}" + (
            "" if element == "f32" else "_" + element.replace("<", "").replace(">", "")
        )
        access = "read_write" if writable else "read"
        self.bindings.append(binding)
        self._declarations.append(f"@group(0) @binding({slot}) var<storage, {access}> {name}: array<{element}>;")
        self._names[key] = name
        return name

    def declarations(self) -> str:
        return "\n".join(self._declarations) + "\n"

    def enables(self) -> str:
        """``enable f16;`` when a binding holds f16 elements (WGSL wants it before every declaration), else ""."""
        return "enable f16;\n" if any("f16" in element for _, _, element in self._names) else ""


def float_element(info: TensorInfo) -> str:
    """The WGSL storage element of a float16 or float32 tensor (kernels load it into f32 and compute there)."""
    return "f16" if info.dtype == np.float16 else "f32"


def require_float(op_type: str, infos: Sequence[TensorInfo | None], caps: DeviceCaps) -> str:
    """The storage element every present tensor shares: ``f32`` (float32), or ``f16`` (float16, on a device with
    ``shader-f16``); ``NotOnDevice`` otherwise (the kernels load into f32 and accumulate there)."""
    dtypes = {info.dtype for info in infos if info is not None}
    if dtypes <= {np.dtype(np.float32)}:
        return "f32"
    if dtypes == {np.dtype(np.float16)}:
        if not caps.has_f16:
            raise NotOnDevice(f"{op_type}: float16 on the device needs the adapter's shader-f16 feature")
        return "f16"
    names = ", ".join(sorted(str(d) for d in dtypes))
    raise NotOnDevice(f"{op_type}: the WebGPU kernel takes float32 or float16 tensors of one type, not {names}")


def require_float32(op_type: str, infos: Sequence[TensorInfo | None]) -> None:
    """``NotOnDevice`` unless every present tensor is float32 (the kernels compute in float32)."""
    for info in infos:
        if info is not None and info.dtype != np.float32:
            raise NotOnDevice(f"{op_type}: the WebGPU kernel computes float32 only, not {info.dtype}")


def check_device_fits(op_type: str, infos: Sequence[TensorInfo | None], bindings: int, caps: DeviceCaps) -> None:
    """``NotOnDevice`` when a tensor exceeds the storage binding limit or there are too many bindings."""
    for info in infos:
        if info is not None and info.nbytes > caps.limits.max_storage_buffer_binding_size:
            raise NotOnDevice(
                f"{op_type}: a tensor of {info.nbytes} bytes exceeds the device's storage binding limit of "
                f"{caps.limits.max_storage_buffer_binding_size} bytes"
            )
    if bindings > caps.limits.max_storage_buffers_per_shader_stage:
        raise NotOnDevice(
            f"{op_type}: the kernel needs {bindings} storage buffers, the device allows "
            f"{caps.limits.max_storage_buffers_per_shader_stage} per stage"
        )


def whole_op_twin(
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
    bindings: Sequence[Binding],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
) -> KernelTwin:
    """A twin computing the whole node: ``compute`` receives a list as long as ``inputs`` (``None`` where the
    kernel binds no buffer) and returns the outputs, which the twin writes into the bound output buffers.

    A kernel that binds the program's status words flags invalid data there instead of failing; its twin does the
    same: an ``InvalidArgumentError`` from ``compute`` sets the status word (the outputs are then not valid, as on
    the device)."""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        full: list[np.ndarray | None] = [None] * len(inputs)
        for slot, binding in enumerate(bindings):
            if binding.kind == "input":
                info = inputs[binding.index]
                assert info is not None
                full[binding.index] = computable(arrays[slot][: info.nbytes].view(info.dtype).reshape(info.shape))
        results = compute(full)
        for slot, binding in enumerate(bindings):
            if binding.kind == "output":
                out = outputs[binding.index]
                value = np.ascontiguousarray(np.asarray(results[binding.index], dtype=out.dtype).reshape(out.shape))
                arrays[slot][: out.nbytes] = value.reshape(-1).view(np.uint8)

    return flagging_twin(twin, bindings) if any(b.kind == "status" for b in bindings) else twin


def single_kernel_plan(
    name: str,
    wgsl: str,
    grid: tuple[int, int, int],
    table: BindingTable,
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
) -> OpPlan:
    """An :class:`OpPlan` of one kernel whose twin computes the node with ``compute``."""
    check_device_fits(name, list(inputs) + list(outputs), len(table.bindings), caps)
    twin = whole_op_twin(compute, table.bindings, inputs, outputs)
    return OpPlan(kernels=(KernelSpec(name, wgsl, grid, tuple(table.bindings), twin),))


# -- row reductions ---------------------------------------------------------------------------------------------------


def reduction_threads(length: int) -> int:
    """Invocations that cooperate on one row of ``length`` elements: a power of two, ~8+ elements each."""
    threads = 1
    while threads < THREADS and threads * 8 < length:
        threads *= 2
    return threads


def workgroup_reduce_functions(threads: int) -> str:
    """WGSL ``wg_sum``/``wg_max``/``wg_min(v, t, slot) -> f32``: combine ``v`` over the ``threads`` invocations
    ``t`` of row slot ``slot`` (each workgroup holds ``THREADS / threads`` rows).  Call in uniform control flow."""
    parts = []
    for name, combine in (("sum", "a + b"), ("max", "max(a, b)"), ("min", "min(a, b)")):
        if threads == 1:
            parts.append(f"fn wg_{name}(v: f32, t: u32, slot: u32) -> f32 {{ return v; }}\n")
            continue
        parts.append(
            f"""fn combine_{name}(a: f32, b: f32) -> f32 {{ return {combine}; }}
fn wg_{name}(v: f32, t: u32, slot: u32) -> f32 {{
    let base = slot * {threads}u;
    scratch[base + t] = v;
    workgroupBarrier();
    for (var s = {threads // 2}u; s > 0u; s = s >> 1u) {{
        if (t < s) {{ scratch[base + t] = combine_{name}(scratch[base + t], scratch[base + t + s]); }}
        workgroupBarrier();
    }}
    let result = scratch[base];
    workgroupBarrier();
    return result;
}}
"""
        )
    shared = f"var<workgroup> scratch: array<f32, {THREADS}>;\n" if threads > 1 else ""
    return shared + "".join(parts)


@dataclass(frozen=True)
class RowLayout:
    """Rows (kept positions) x reduced positions of a tensor, for the row-wise kernels."""

    rows: int
    length: int
    row_base: str  # WGSL fn row_base(row: u32) -> u32
    row_offset: str  # WGSL fn row_offset(r: u32) -> u32


def row_layout(shape: tuple[int, ...], axes: Sequence[int]) -> RowLayout:
    """Split ``shape`` into kept axes (rows, in C order) and reduced ``axes`` (positions within a row)."""
    strides = c_strides(shape)
    reduced = sorted(set(axes))
    kept = [a for a in range(len(shape)) if a not in reduced]
    kept_shape = tuple(shape[a] for a in kept)
    reduced_shape = tuple(shape[a] for a in reduced)
    rows = element_count(kept_shape) if kept_shape else 1
    length = element_count(reduced_shape) if reduced_shape else 1
    base = (
        index_function("row_base", kept_shape, tuple(strides[a] for a in kept))
        if kept
        else "fn row_base(i: u32) -> u32 { return 0u; }\n"
    )
    offset = (
        index_function("row_offset", reduced_shape, tuple(strides[a] for a in reduced))
        if reduced
        else "fn row_offset(i: u32) -> u32 { return 0u; }\n"
    )
    return RowLayout(rows, length, base, offset)


def row_kernel_header(
    layout: RowLayout, caps: DeviceCaps, op_type: str, loops: int
) -> tuple[int, int, tuple[int, int, int], str]:
    """(threads per row, rows per workgroup, grid, WGSL helpers) of a row-wise kernel whose ``main`` starts with
    :func:`row_kernel_prologue` and walks the row ``loops`` times (``for (var r = t; r < LENGTH; r = r + T)``);
    raises :class:`NotOnDevice` where the driver's loop budget is too small for that (:func:`check_loop_budget`)."""
    threads = reduction_threads(layout.length)
    # the row walks, plus the workgroup reductions' halving loops (log2 T each, at most two per kernel)
    check_loop_budget(op_type, loops * -(-layout.length // threads) + 2 * threads.bit_length(), caps)
    rows_per_group = THREADS // threads
    groups = -(-layout.rows // rows_per_group)
    grid = grid_for_groups(groups, caps)
    helpers = (
        f"const ROWS: u32 = {layout.rows}u;\nconst LENGTH: u32 = {layout.length}u;\nconst T: u32 = {threads}u;\n"
        + layout.row_base
        + layout.row_offset
        + workgroup_reduce_functions(threads)
    )
    return threads, rows_per_group, grid, helpers


def row_kernel_prologue(grid: tuple[int, int, int], rows_per_group: int) -> str:
    """Start of a row kernel's main: ``t`` (invocation within the row), ``slot``, ``row``, ``valid``, ``base``."""
    return f"""@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let t = li % T;
    let slot = li / T;
    let row = {workgroup_index(grid)} * {rows_per_group}u + slot;
    let valid = row < ROWS;
    let base = row_base(min(row, ROWS - 1u));
"""
