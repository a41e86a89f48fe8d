"""Code generation shared by the compute-heavy operators.

* literals, grids and binding tables for generated WGSL;
* index functions (a linear output index -> a broadcast input's index);
* the fused epilogue (see :mod:`ortgpu.ops.matmul` for the contract) in numpy and WGSL;
* the tiled GEMM and the GEMV kernels that MatMul, Gemm and Conv instantiate;
* workgroup reductions used by the row-wise operators (Softmax, LayerNormalization, Reduce*).

Shapes, strides and attributes are baked into the WGSL text as constants: the
device caches pipelines by text, and constant loop bounds let the compiler
unroll.  No string from the model ever reaches the WGSL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ortgpu_core.backends.protocol import KernelTwin

from .._limits import element_count
from ._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, OpPlan, TensorInfo, check_loop_budget

__all__ = [
    "THREADS",
    "wgsl_f32",
    "grid_for_groups",
    "workgroup_index",
    "c_strides",
    "broadcast_strides",
    "index_function",
    "BindingTable",
    "EpilogueStep",
    "parse_epilogue",
    "apply_epilogue",
    "epilogue_function",
    "erf",
    "legacy_gemm_wgsl",
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
        name = f"{binding.kind}_{binding.index}" + ("" if element == "f32" else "_" + element.replace("<", "").replace(">", ""))
        access = "read_write" if writable else "read"
        self.bindings.append(binding)
        self._declarations.append(f"@group(0) @binding({slot}) var<storage, {access}> {name}: array<{element}>;")
        self._names[key] = name
        return name

    def declarations(self) -> str:
        return "\n".join(self._declarations) + "\n"


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
    kernel binds no buffer) and returns the outputs, which the twin writes into the bound output buffers."""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        full: list[np.ndarray | None] = [None] * len(inputs)
        for slot, binding in enumerate(bindings):
            if binding.kind == "input":
                info = inputs[binding.index]
                assert info is not None
                full[binding.index] = arrays[slot][: info.nbytes].view(info.dtype).reshape(info.shape)
        results = compute(full)
        for slot, binding in enumerate(bindings):
            if binding.kind == "output":
                out = outputs[binding.index]
                value = np.ascontiguousarray(np.asarray(results[binding.index], dtype=out.dtype).reshape(out.shape))
                arrays[slot][: out.nbytes] = value.reshape(-1).view(np.uint8)

    return twin


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


# -- erf -----------------------------------------------------------------------------------------------------------

# erfc(z) = t * exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0: a Chebyshev fit with fractional error below 1.2e-7
# everywhere (Numerical Recipes' erfcc).  Exact enough for float32 and cheap on a GPU.
_ERFC_COEFFICIENTS = (
    -1.26551223,
    1.00002368,
    0.37409196,
    0.09678418,
    -0.18628806,
    0.27886807,
    -1.13520398,
    1.48851587,
    -0.82215223,
    0.17087277,
)


def _erfc_nonnegative(z: np.ndarray) -> np.ndarray:
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.zeros_like(z)
    for coefficient in reversed(_ERFC_COEFFICIENTS):
        poly = poly * t + coefficient
    result: np.ndarray = t * np.exp(-z * z + poly)
    return result


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in float64 (relative error below 2e-7)."""
    x64 = np.asarray(x, dtype=np.float64)
    erfc = _erfc_nonnegative(np.abs(x64))
    return np.where(x64 >= 0, 1.0 - erfc, erfc - 1.0)


def _gelu(x: np.ndarray) -> np.ndarray:
    x64 = np.asarray(x, dtype=np.float64)
    u = -x64 / math.sqrt(2.0)
    # 1 + erf(x / sqrt2) = erfc(-x / sqrt2), computed without cancellation for negative x.
    erfc = np.where(u >= 0, _erfc_nonnegative(np.abs(u)), 2.0 - _erfc_nonnegative(np.abs(u)))
    result: np.ndarray = 0.5 * x64 * erfc
    return result


def _erfc_wgsl() -> str:
    poly = "0.0"
    for coefficient in reversed(_ERFC_COEFFICIENTS):
        poly = f"fma({poly}, t, {wgsl_f32(coefficient)})" if poly != "0.0" else wgsl_f32(coefficient)
    return (
        "fn erfc_nonnegative(z: f32) -> f32 {\n"
        "    let t = 1.0 / (1.0 + 0.5 * z);\n"
        f"    return t * exp(-z * z + {poly});\n"
        "}\n"
        "fn gelu(x: f32) -> f32 {\n"
        "    let u = -x * 0.70710678118654752;\n"
        "    let c = erfc_nonnegative(abs(u));\n"
        "    return 0.5 * x * select(2.0 - c, c, u >= 0.0);\n"
        "}\n"
    )


# -- the fused epilogue ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpilogueStep:
    """One step applied to each output element before the store.

    ``kind``: ``"scale"`` (multiply by ``value``), ``"add"`` (add ``value`` times input ``input_index``,
    read as ``view_shape`` and broadcast to the output), ``"relu"``, ``"gelu"``, ``"clip"`` (``low``,
    ``high``; infinite bounds are omitted) or ``"sigmoid"``.
    """

    kind: str
    input_index: int = -1
    value: float = 1.0
    view_shape: tuple[int, ...] = ()
    low: float = -math.inf
    high: float = math.inf


def parse_epilogue(
    op_type: str,
    attrs: Mapping[str, Any],
    first_extra: int,
    input_shapes: Sequence[tuple[int, ...] | None],
    out_shape: tuple[int, ...],
) -> list[EpilogueStep]:
    """The ``_epilogue`` attribute as steps; validates input indices and broadcasting."""
    raw = attrs.get("_epilogue", ())
    steps: list[EpilogueStep] = []
    for entry in raw:
        if not entry:
            raise UnsupportedOpError(f"{op_type}: empty _epilogue step")
        kind = str(entry[0])
        if kind == "add":
            if len(entry) != 2:
                raise UnsupportedOpError(f"{op_type}: _epilogue step ('add', k) takes one input index, got {entry!r}")
            index = int(entry[1])
            if index < first_extra or index >= len(input_shapes) or input_shapes[index] is None:
                raise UnsupportedOpError(
                    f"{op_type}: _epilogue ('add', {index}) must name an extra input at index >= {first_extra} "
                    f"(the node has {len(input_shapes)} inputs)"
                )
            shape = input_shapes[index]
            assert shape is not None
            try:
                broadcast_strides(shape, out_shape)
            except ValueError:
                raise UnsupportedOpError(
                    f"{op_type}: _epilogue input {index} of shape {shape} does not broadcast to the output {out_shape}"
                ) from None
            steps.append(EpilogueStep("add", index, 1.0, tuple(shape)))
        elif kind in ("relu", "gelu", "sigmoid"):
            if len(entry) != 1:
                raise UnsupportedOpError(f"{op_type}: _epilogue step ({kind!r},) takes no arguments, got {entry!r}")
            steps.append(EpilogueStep(kind))
        elif kind == "scale":
            if len(entry) != 2:
                raise UnsupportedOpError(f"{op_type}: _epilogue step ('scale', c) takes one factor, got {entry!r}")
            factor = float(np.float32(entry[1]))
            if not math.isfinite(factor):
                raise UnsupportedOpError(f"{op_type}: _epilogue ('scale', c) needs a finite float32 factor, got {entry[1]!r}")
            steps.append(EpilogueStep("scale", value=factor))
        elif kind == "clip":
            if len(entry) != 3:
                raise UnsupportedOpError(f"{op_type}: _epilogue step ('clip', lo, hi) takes two bounds, got {entry!r}")
            steps.append(EpilogueStep("clip", low=float(entry[1]), high=float(entry[2])))
        else:
            raise UnsupportedOpError(f"{op_type}: unknown _epilogue step {kind!r}")
    return steps


def apply_epilogue(y: np.ndarray, steps: Sequence[EpilogueStep], inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """The steps in numpy; ``y`` is the op's float32 result before the epilogue."""
    out_dtype = y.dtype
    for step in steps:
        if step.kind == "scale":
            y = y * np.float32(step.value)
        elif step.kind == "add":
            extra = inputs[step.input_index]
            assert extra is not None
            term = np.asarray(extra).reshape(step.view_shape).astype(out_dtype, copy=False)
            if step.value != 1.0:
                term = term * np.asarray(step.value, dtype=out_dtype)
            summed = y + term
            if summed.shape != y.shape:
                raise ValueError(f"epilogue input of shape {term.shape} does not broadcast to {y.shape}")
            y = summed
        elif step.kind == "relu":
            y = np.maximum(y, np.asarray(0, dtype=out_dtype))
        elif step.kind == "gelu":
            y = _gelu(y).astype(out_dtype)
        elif step.kind == "clip":
            if step.low > -math.inf:
                y = np.maximum(y, np.asarray(step.low, dtype=out_dtype))
            if step.high < math.inf:
                y = np.minimum(y, np.asarray(step.high, dtype=out_dtype))
        elif step.kind == "sigmoid":
            y = (1.0 / (1.0 + np.exp(-y.astype(np.float64)))).astype(out_dtype)
        else:  # pragma: no cover - parse_epilogue rejects these
            raise ValueError(step.kind)
    return np.asarray(y, dtype=out_dtype)


def epilogue_function(steps: Sequence[EpilogueStep], out_shape: tuple[int, ...], table: BindingTable) -> str:
    """WGSL ``fn epilogue(v: f32, o: u32) -> f32`` (``o``: the linear output index) and its helpers;
    binds the inputs that ``add`` steps read."""
    helpers: list[str] = []
    body = ["    var x = v;"]
    need_gelu = False
    for number, step in enumerate(steps):
        if step.kind == "scale":
            body.append(f"    x = x * {wgsl_f32(step.value)};")
        elif step.kind == "add":
            name = table.add(Binding("input", step.input_index))
            index_name = f"epilogue_index_{number}"
            helpers.append(index_function(index_name, out_shape, broadcast_strides(step.view_shape, out_shape)))
            term = f"{name}[{index_name}(o)]"
            if step.value != 1.0:
                term = f"{wgsl_f32(step.value)} * {term}"
            body.append(f"    x = x + {term};")
        elif step.kind == "relu":
            body.append("    x = max(x, 0.0);")
        elif step.kind == "gelu":
            need_gelu = True
            body.append("    x = gelu(x);")
        elif step.kind == "clip":
            if step.low > -math.inf:
                body.append(f"    x = max(x, {wgsl_f32(step.low)});")
            if step.high < math.inf:
                body.append(f"    x = min(x, {wgsl_f32(step.high)});")
        elif step.kind == "sigmoid":
            body.append("    x = 1.0 / (1.0 + exp(-x));")
    if need_gelu:
        helpers.append(_erfc_wgsl())
    body.append("    return x;")
    return "".join(helpers) + "fn epilogue(v: f32, o: u32) -> f32 {\n" + "\n".join(body) + "\n}\n"


# -- GEMM -----------------------------------------------------------------------------------------------------------


#: Tile of the original tiled GEMM (now :data:`ortgpu.ops._gemm.LEGACY`, kept for comparisons): a 16 x 16
#: workgroup computes a 64 x 64 output tile, 4 x 4 outputs per invocation, stepping through K by 16.
_TILE_M = 64
_TILE_N = 64
_TILE_K = 16


def legacy_gemm_wgsl(
    batch: int, m: int, n: int, k: int, helpers: str, declarations: str, output: str, caps: DeviceCaps
) -> tuple[str, tuple[int, int, int]]:
    """WGSL and grid of the original shared-memory tiled GEMM (scalar loads through ``load_a``/``load_b`` and
    ``epilogue`` defined in ``helpers``; output stored at ``(b * M + m) * N + n``).

    Invocation (tx, ty) of a workgroup owns rows ``m0 + ty + 16 i`` and columns ``n0 + tx + 16 j``
    (i, j < 4), so neighbouring invocations read neighbouring shared-memory words and store neighbouring
    outputs.
    """
    tiles_m = -(-m // _TILE_M)
    tiles_n = -(-n // _TILE_N)
    total = batch * tiles_m * tiles_n
    grid = grid_for_groups(total, caps)
    loads = []
    for r in range(_TILE_M * _TILE_K // THREADS):
        loads.append(
            f"""        {{
            let e = li + {r * THREADS}u;
            let am = m0 + e / {_TILE_K}u;
            let ak = k0 + e % {_TILE_K}u;
            var av = 0.0;
            if (am < M && ak < K) {{ av = load_a(b, am, ak); }}
            tile_a[(e % {_TILE_K}u) * {_TILE_M}u + e / {_TILE_K}u] = av;
            let bk = k0 + e / {_TILE_N}u;
            let bn = n0 + e % {_TILE_N}u;
            var bv = 0.0;
            if (bk < K && bn < N) {{ bv = load_b(b, bk, bn); }}
            tile_b[e] = bv;
        }}"""
        )
    inner = []
    for i in range(4):
        inner.append(f"            let a{i} = tile_a[kk * {_TILE_M}u + lid.y + {16 * i}u];")
    inner.append(
        f"            let bv = vec4<f32>(tile_b[kk * {_TILE_N}u + lid.x], tile_b[kk * {_TILE_N}u + lid.x + 16u], "
        f"tile_b[kk * {_TILE_N}u + lid.x + 32u], tile_b[kk * {_TILE_N}u + lid.x + 48u]);"
    )
    for i in range(4):
        inner.append(f"            acc{i} = fma(vec4<f32>(a{i}), bv, acc{i});")
    stores = []
    for i in range(4):
        for j in range(4):
            stores.append(
                f"""    {{
        let m = m0 + lid.y + {16 * i}u;
        let n = n0 + lid.x + {16 * j}u;
        if (m < M && n < N) {{
            let o = (b * M + m) * N + n;
            {output}[o] = epilogue(acc{i}[{j}], o);
        }}
    }}"""
            )
    wgsl = f"""{declarations}
const M: u32 = {m}u;
const N: u32 = {n}u;
const K: u32 = {k}u;
const TILES_M: u32 = {tiles_m}u;
const TILES_N: u32 = {tiles_n}u;
const TOTAL: u32 = {total}u;
var<workgroup> tile_a: array<f32, {_TILE_M * _TILE_K}>;
var<workgroup> tile_b: array<f32, {_TILE_N * _TILE_K}>;
{helpers}
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let tile = {workgroup_index(grid)};
    if (tile >= TOTAL) {{ return; }}
    let tn = tile % TILES_N;
    let tm = (tile / TILES_N) % TILES_M;
    let b = tile / (TILES_N * TILES_M);
    let m0 = tm * {_TILE_M}u;
    let n0 = tn * {_TILE_N}u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < K; k0 = k0 + {_TILE_K}u) {{
{chr(10).join(loads)}
        workgroupBarrier();
        for (var kk = 0u; kk < {_TILE_K}u; kk = kk + 1u) {{
{chr(10).join(inner)}
        }}
        workgroupBarrier();
    }}
{chr(10).join(stores)}
}}
"""
    return wgsl, grid


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
    base = index_function("row_base", kept_shape, tuple(strides[a] for a in kept)) if kept else "fn row_base(i: u32) -> u32 { return 0u; }\n"
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
