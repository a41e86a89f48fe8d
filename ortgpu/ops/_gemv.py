"""The GEMV kernels behind MatMul and Gemm at M = 1: configurations, their choice, split-K and subgroups.

A problem is ``out[n] = epilogue(sum_k a[k] * B(k, n))`` with B in one of two layouts:

``"kn"``
    B is row-major ``[K, N]`` (MatMul's weight).  A workgroup of ``threads_x x threads_k`` invocations owns
    ``4 * vectors * threads_x`` neighbouring columns: invocation ``(x, y)`` owns the vec4 column groups
    ``c4 + v * threads_x`` (``v < vectors``) and reads rows ``y, y + threads_k, ...`` of them (one vec4 load per row
    and column group when N % 4 == 0, else four guarded scalars), so each row segment a workgroup reads is
    ``16 * threads_x`` contiguous bytes per vector.
``"nk"``
    B is ``[N, K]`` (Gemm's ``transB``): each output is the dot product of ``a`` with one row of B.  A workgroup
    of ``threads_k x threads_x`` invocations computes ``threads_x`` outputs, ``threads_k`` lanes per output
    reading its row as vec4s (when K % 4 == 0).

Both then reduce the per-invocation partial sums over K:

* through workgroup memory, a tree of ``log2(threads_k)`` barrier steps (``subgroups=False``); or
* ``subgroups=True`` (where the device has the ``subgroups`` feature, else the workgroup-memory reduction):
  a butterfly of ``subgroupShuffleXor`` within each subgroup, then one barrier and a short serial sum over the
  subgroups' results.  Invocations are numbered by ``subgroup_id * subgroup_size + subgroup_invocation_id``
  (not by their local index), so the kernel does not assume how the device lays subgroups out; it does assume
  full subgroups of one size, which holds for the power-of-two workgroups of at least 64 invocations it uses.
  The workgroup is one-dimensional (``threads_x * threads_k``; naga allows ``subgroup_id`` only there).

``unroll = U``: ``U`` independent accumulators, so each invocation has ``U`` (times ``vectors``) loads in flight
per loop iteration.

``split_k = S > 1``: K is cut into ``S`` slices (whole multiples of ``threads_k`` rows, or vec4 units for a
vectorised ``"nk"``); workgroups of slice ``s`` write their partial sums (no epilogue) to a scratch buffer
``[S, N]`` and a second kernel sums the slices in order and applies the epilogue.  It multiplies the
workgroups by ``S`` (a 1024 x 1024 GEMV launches 128 workgroups unsplit with the default kernel).

The default (:func:`default_gemv_config`) is the first entry of :data:`GEMV_DEFAULTS` that the device fits
(``"kn"``: 4 column threads x 128 K-rows, unrolled twice; ``"nk"``: 4 outputs x 64 lanes, unrolled twice; the last
entry of each fits every WebGPU device).  :func:`choose_gemv_config` consults :data:`GEMV_OVERRIDE` and
:data:`GEMV_SHAPE_CONFIGS` first;
``python -m bench.sweep_kernels --shapes gemv`` times the variants and prints a paste-ready table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ._epilogue import EpilogueStep, epilogue_function
from ._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, OpPlan, TensorInfo, ceil_div, check_loop_budget
from ._output_layout import Perm, output_store
from ._tiled_gemm import _bound_inputs, split_k_plan  # shared with the tiled GEMM's split-K (same semantics)
from ._tiling import BindingTable, check_device_fits, float_element, grid_for_groups, whole_op_twin, workgroup_index

__all__ = [
    "GemvConfig",
    "GEMV_OVERRIDE",
    "GEMV_SHAPE_CONFIGS",
    "LAYOUTS",
    "choose_gemv_config",
    "default_gemv_config",
    "GEMV_DEFAULTS",
    "effective_gemv_config",
    "gemv_config_fits",
    "gemv_kernel",
    "gemv_workgroups",
    "has_subgroups",
    "plan_gemv",
]

#: ``"kn"``: B is ``[K, N]`` (row-major); ``"nk"``: B is ``[N, K]`` (transposed).
LAYOUTS = ("kn", "nk")


@dataclass(frozen=True)
class GemvConfig:
    """One variant of the GEMV kernel (see the module docstring).

    ``threads_x``: ``"kn"``: invocations along N per workgroup (each owns ``4 * vectors`` columns); ``"nk"``:
    outputs per workgroup.  ``threads_k``: invocations splitting K within a workgroup (``"kn"``: rows of B in
    flight; ``"nk"``: lanes per row).  Both powers of two.  ``vectors`` (``"kn"`` only): vec4 column groups per
    invocation.  ``unroll``: independent accumulators (loads in flight per loop iteration).  ``split_k``: K
    slices over workgroups (a scratch buffer and a reduce kernel when > 1).  ``subgroups``: reduce with subgroup
    shuffles where the device has them (needs at least 64 invocations).
    """

    threads_x: int
    threads_k: int
    vectors: int = 1
    unroll: int = 1
    split_k: int = 1
    subgroups: bool = False

    @property
    def threads(self) -> int:
        return self.threads_x * self.threads_k

    @property
    def label(self) -> str:
        """A short name: ``4x64`` + ``/v2`` + ``/u2`` + ``/split8`` + ``/sg`` (only the parts that differ from 1)."""
        text = f"{self.threads_x}x{self.threads_k}"
        text += f"/v{self.vectors}" if self.vectors > 1 else ""
        text += f"/u{self.unroll}" if self.unroll > 1 else ""
        text += f"/split{self.split_k}" if self.split_k > 1 else ""
        return text + ("/sg" if self.subgroups else "")

    def shared_bytes(self, layout: str) -> int:
        return self.threads * (self.vectors * 16 if layout == "kn" else 4)

    def validate(self, layout: str) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"GEMV layout must be one of {LAYOUTS}, not {layout!r}")
        if not (_power_of_two(self.threads_x) and _power_of_two(self.threads_k)) or self.threads > 1024:
            raise ValueError(
                f"bad GEMV config {self}: threads_x and threads_k must be powers of two, at most 1024 in all"
            )
        if self.vectors not in (1, 2, 4) or (layout == "nk" and self.vectors != 1):
            raise ValueError(f"bad GEMV config {self}: vectors is 1, 2 or 4 (and 1 for the nk layout)")
        if not 1 <= self.unroll <= 8 or self.split_k < 1:
            raise ValueError(f"bad GEMV config {self}: unroll 1..8, split_k >= 1")
        if self.subgroups and self.threads < 64:
            raise ValueError(f"bad GEMV config {self}: the subgroup reduction needs at least 64 invocations")


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


#: Default configurations per layout, best first; :func:`default_gemv_config` takes the first the device fits.
#: Chosen by ``python -m bench.sweep_kernels --shapes gemv`` on a discrete GPU (weights cycling through copies beyond
#: the L2 cache as in mlp16, interleaved rounds; bench/RESULTS.md has the figures): ``"kn"`` 4x128/u2 was the
#: fastest or close to it at [1024, 1024] and [4096, 4096], and faster than the 2x128 kernel used before; 2x128/u2 is
#: the fallback for devices with 256 invocations per workgroup; ``"nk"`` 4x64/u2 close to the best at
#: [4096, 4096] and [8192, 8192], and faster than 4x64 without unrolling.
GEMV_DEFAULTS: dict[str, tuple[GemvConfig, ...]] = {
    "kn": (GemvConfig(threads_x=4, threads_k=128, unroll=2), GemvConfig(threads_x=2, threads_k=128, unroll=2)),
    "nk": (GemvConfig(threads_x=4, threads_k=64, unroll=2),),
}


def default_gemv_config(layout: str, caps: DeviceCaps | None = None) -> GemvConfig:
    """The first of :data:`GEMV_DEFAULTS` ``[layout]`` that fits ``caps`` (the last one without ``caps``: it fits
    every WebGPU device)."""
    ladder = GEMV_DEFAULTS[layout]
    if caps is not None:
        for config in ladder:
            if gemv_config_fits(config, layout, caps):
                return config
    return ladder[-1]


#: When set, every GEMV uses this configuration (if the device fits it): for sweeps and tests.
GEMV_OVERRIDE: GemvConfig | None = None
#: Exact problems ``(layout, N, K)`` -> configuration, consulted before the default.  Empty: every shape runs
#: the default kernel until the variants are measured (``python -m bench.sweep_kernels --shapes gemv`` prints
#: a ready-to-paste table of the fastest configuration per measured shape).
GEMV_SHAPE_CONFIGS: dict[tuple[str, int, int], GemvConfig] = {}


def has_subgroups(caps: DeviceCaps) -> bool:
    """Whether the device has subgroup operations (WebGPU's ``subgroups``, or wgpu's native ``subgroup``)."""
    return bool({"subgroups", "subgroup"} & caps.features)


def gemv_config_fits(config: GemvConfig, layout: str, caps: DeviceCaps) -> bool:
    """Whether ``config`` is valid and within the device's workgroup limits."""
    try:
        config.validate(layout)
    except ValueError:
        return False
    limits = caps.limits
    size_x, size_y = (config.threads_x, config.threads_k) if layout == "kn" else (config.threads_k, config.threads_x)
    if config.subgroups:  # a one-dimensional workgroup (naga allows subgroup_id only there)
        size_x, size_y = config.threads, 1
    return (
        config.threads <= limits.max_compute_invocations_per_workgroup
        and size_x <= limits.max_compute_workgroup_size_x
        and size_y <= limits.max_compute_workgroup_size_y
        and config.shared_bytes(layout) <= limits.max_compute_workgroup_storage_size
    )


def effective_gemv_config(config: GemvConfig, layout: str, n: int, k: int, caps: DeviceCaps) -> GemvConfig:
    """What :func:`plan_gemv` runs for ``config``: without subgroups where the device has none, unsplit where
    K has only one slice."""
    if config.subgroups and not has_subgroups(caps):
        config = dataclasses.replace(config, subgroups=False)
    if config.split_k > 1 and _slicing(config, layout, k)[0] < 2:
        config = dataclasses.replace(config, split_k=1)
    return config


def choose_gemv_config(layout: str, n: int, k: int, caps: DeviceCaps) -> GemvConfig:
    """The configuration of a ``[1, K] x B`` GEMV (``layout`` of B, see :data:`LAYOUTS`).

    :data:`GEMV_OVERRIDE` if set, else :data:`GEMV_SHAPE_CONFIGS` ``[(layout, N, K)]`` if present (each only
    when the device fits it), else :func:`default_gemv_config`.
    """
    for fixed in (GEMV_OVERRIDE, GEMV_SHAPE_CONFIGS.get((layout, n, k))):
        if fixed is not None and gemv_config_fits(fixed, layout, caps):
            return fixed
    return default_gemv_config(layout, caps)


def gemv_workgroups(config: GemvConfig, layout: str, n: int, k: int) -> int:
    """Workgroups the (first) kernel launches."""
    if layout == "kn":
        groups = ceil_div(ceil_div(n, 4), config.threads_x * config.vectors)
    else:
        groups = -(-n // config.threads_x)
    return groups * (_slicing(config, layout, k)[0] if config.split_k > 1 else 1)


def _units(layout: str, k: int) -> tuple[int, int]:
    """(units of K the loops step over, K per unit): vec4s for a vectorised ``"nk"``, else rows."""
    if layout == "nk" and k % 4 == 0:
        return k // 4, 4
    return k, 1


def _slicing(config: GemvConfig, layout: str, k: int) -> tuple[int, int]:
    """(slices, units per slice) of split-K: slices are whole multiples of ``threads_k`` units; none is empty."""
    units, _ = _units(layout, k)
    align = config.threads_k
    per_slice = max(align, ceil_div(ceil_div(units, config.split_k), align) * align)
    return max(1, -(-units // per_slice)), per_slice


# -- WGSL ----------------------------------------------------------------------------------------------------------

_SUBGROUP_BUILTINS = (
    ",\n        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sgs: u32, "
    "@builtin(subgroup_id) sid: u32"
)


def gemv_kernel(
    *,
    n: int,
    k: int,
    b_layout: str,
    config: GemvConfig,
    a_name: str,
    b_name: str,
    declarations: str,
    epilogue: str,
    store: Callable[[str, str], str],
    caps: DeviceCaps,
) -> tuple[str, tuple[int, int, int]]:
    """WGSL and grid of one GEMV kernel under ``config`` (with ``split_k > 1``: the partial-sum kernel; the slice
    index is ``slice``).  ``store(o, value)`` is the WGSL statement storing ``value`` for output ``o``;
    ``epilogue`` the helpers it uses.  ``a_name``/``b_name`` are bound as ``array<vec4<f32>>`` where the layout
    vectorises (``"kn"``: B when N % 4 == 0; ``"nk"``: both when K % 4 == 0), else ``array<f32>``."""
    config.validate(b_layout)
    if b_layout == "kn":
        return _kn_kernel(n, k, config, a_name, b_name, declarations, epilogue, store, caps)
    return _nk_kernel(n, k, config, a_name, b_name, declarations, epilogue, store, caps)


def _at(name: str, index: str) -> str:
    """WGSL reading element ``index`` of the binding ``name`` as f32 (or vec4<f32>): f16 storage (bound as
    ``array<f16>``/``array<vec4<f16>>``, named so by ``BindingTable``) is widened."""
    if name.endswith("_vec4f16"):
        return f"vec4<f32>({name}[{index}])"
    if name.endswith("_f16"):
        return f"f32({name}[{index}])"
    return f"{name}[{index}]"


def _split_prologue(config: GemvConfig, layout: str, k: int, groups: int, units: str) -> tuple[str, str, str, int]:
    """(WGSL after the group check, start expression offset, loop limit, slices) of the K range."""
    if config.split_k == 1:
        return "", "", units, 1
    slices, per_slice = _slicing(config, layout, k)
    if slices == 1:
        return "", "", units, 1
    text = (
        f"    let slice = group / {groups}u;\n"
        f"    let k_begin = slice * {per_slice}u;\n"
        f"    let k_end = min({units}, k_begin + {per_slice}u);\n"
    )
    return text, "k_begin + ", "k_end", slices


def _kn_kernel(
    n: int,
    k: int,
    config: GemvConfig,
    a_name: str,
    b_name: str,
    declarations: str,
    epilogue: str,
    store: Callable[[str, str], str],
    caps: DeviceCaps,
) -> tuple[str, tuple[int, int, int]]:
    vector = n % 4 == 0
    threads_x, slices, vectors, unroll = config.threads_x, config.threads_k, config.vectors, config.unroll
    subgroups = config.subgroups
    x, y = ("tx", "ty") if subgroups else ("lid.x", "lid.y")
    groups = -(-n // (threads_x * 4 * vectors))
    split_text, start, limit, k_slices = _split_prologue(config, "kn", k, groups, "K")
    grid = grid_for_groups(groups * k_slices, caps)
    width = threads_x * slices  # vec4 partial sums per vector in workgroup memory

    def acc(v: int, u: int) -> str:
        if v == 0:
            return f"acc{u}" if u else "acc"
        return f"acc_{v}_{u}" if u else f"acc_{v}"

    def column(v: int) -> str:
        return "c4" if v == 0 else f"(c4 + {v * threads_x}u)"

    def step(k_expr: str, u: int) -> str:
        lines = ""
        for v in range(vectors):
            if vector:
                # vectors > 0 clamp their column: loads stay in bounds, the store drops the surplus
                at = "c4" if v == 0 else f"min(c4 + {v * threads_x}u, N4 - 1u)"
                lines += f"            {acc(v, u)} = fma(vec4<f32>({_at(a_name, k_expr)}), {_at(b_name, f'({k_expr}) * N4 + {at}')}, {acc(v, u)});\n"
            else:
                lines += (
                    f"            for (var j = 0u; j < 4u; j = j + 1u) {{\n"
                    f"                if ({column(v)} * 4u + j < N) {{ {acc(v, u)}[j] = fma({_at(a_name, k_expr)}, {_at(b_name, f'({k_expr}) * N + {column(v)} * 4u + j')}, {acc(v, u)}[j]); }}\n"
                    f"            }}\n"
                )
        return lines

    unrolled = "".join(step(f"k + {u * slices}u" if u else "k", u) for u in range(unroll))
    partial = (
        "".join(f"        var {acc(v, u)} = vec4<f32>(0.0);\n" for v in range(vectors) for u in range(1, unroll))
        + f"        var k = {start}{y};\n"
        + (
            f"        for (; k + {(unroll - 1) * slices}u < {limit}; k = k + {unroll * slices}u) {{\n{unrolled}        }}\n"
            if unroll > 1
            else ""
        )
        + f"        for (; k < {limit}; k = k + {slices}u) {{\n{step('k', 0)}        }}\n"
        + "".join(
            f"        {acc(v, 0)} = {acc(v, 0)} + {acc(v, u)};\n" for v in range(vectors) for u in range(1, unroll)
        )
    )
    accumulators = "".join(f"    var {acc(v, 0)} = vec4<f32>(0.0);\n" for v in range(vectors))
    load_guard = "c4 < N4" if vector else "c4 * 4u < N"
    if k_slices == 1 and vectors == 1:
        c4 = f"group * {threads_x}u + {x}"
    else:
        c4 = f"(group % {groups}u) * {threads_x * vectors}u + {x}"

    def base(v: int) -> str:
        return f"{v * width}u + " if v else ""

    def total(v: int) -> str:
        return f"total{v}" if v else "total"

    if not subgroups:
        slot = ""
        reduction = (
            "".join(f"    partials[{base(v)}lid.y * {threads_x}u + lid.x] = {acc(v, 0)};\n" for v in range(vectors))
            + "    workgroupBarrier();\n"
            + f"    for (var s = {slices // 2}u; s > 0u; s = s >> 1u) {{\n"
            + "        if (lid.y < s) {\n"
            + "".join(
                f"            partials[{base(v)}lid.y * {threads_x}u + lid.x] = partials[{base(v)}lid.y * {threads_x}u + lid.x] + "
                f"partials[{base(v)}(lid.y + s) * {threads_x}u + lid.x];\n"
                for v in range(vectors)
            )
            + "        }\n        workgroupBarrier();\n    }\n"
        )
        final_guard = "lid.y == 0u"
        totals = "".join(f"        let {total(v)} = partials[{base(v)}lid.x];\n" for v in range(vectors))
    else:
        slot = (
            f"    let slot = sid * sgs + lane;\n    let tx = slot % {threads_x}u;\n    let ty = slot / {threads_x}u;\n"
        )
        # butterfly over the lanes of a subgroup that share a column (lane % threads_x), then one value per
        # subgroup (or per lane when a subgroup is narrower than threads_x) into workgroup memory
        reduction = (
            f"    for (var d = {threads_x}u; d < sgs; d = d << 1u) {{\n"
            + "".join(
                f"        {acc(v, 0)} = {acc(v, 0)} + subgroupShuffleXor({acc(v, 0)}, d);\n" for v in range(vectors)
            )
            + "    }\n"
            + f"    let rows_per_subgroup = max(1u, sgs / {threads_x}u);\n"
            + "    if (ty % rows_per_subgroup == 0u) {\n"
            + "".join(
                f"        partials[{base(v)}(ty / rows_per_subgroup) * {threads_x}u + tx] = {acc(v, 0)};\n"
                for v in range(vectors)
            )
            + "    }\n    workgroupBarrier();\n"
        )
        final_guard = "ty == 0u"
        totals = "".join(
            f"        var {total(v)} = partials[{base(v)}tx];\n"
            f"        for (var q = 1u; q < {slices}u / rows_per_subgroup; q = q + 1u) {{\n"
            f"            {total(v)} = {total(v)} + partials[{base(v)}q * {threads_x}u + tx];\n"
            f"        }}\n"
            for v in range(vectors)
        )
    stores = "".join(
        f"        for (var j = 0u; j < 4u; j = j + 1u) {{\n"
        f"            let o = {column(v)} * 4u + j;\n"
        f"            if (o < N) {{ {store('o', total(v) + '[j]')} }}\n"
        f"        }}\n"
        for v in range(vectors)
    )
    wgsl = f"""{declarations}
const N: u32 = {n}u;
const N4: u32 = {-(-n // 4)}u;
const K: u32 = {k}u;
const GROUPS: u32 = {groups * k_slices}u;
var<workgroup> partials: array<vec4<f32>, {width * vectors}>;
{epilogue}
@compute @workgroup_size({f"{threads_x}, {slices}" if not subgroups else config.threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>{_SUBGROUP_BUILTINS if subgroups else ""}) {{
    let group = {workgroup_index(grid)};
    if (group >= GROUPS) {{ return; }}
{split_text}{slot}    let c4 = {c4};
{accumulators}    if ({load_guard}) {{
{partial}    }}
{reduction}    if ({final_guard}) {{
{totals}{stores}    }}
}}
"""
    return wgsl, grid


def _nk_kernel(
    n: int,
    k: int,
    config: GemvConfig,
    a_name: str,
    b_name: str,
    declarations: str,
    epilogue: str,
    store: Callable[[str, str], str],
    caps: DeviceCaps,
) -> tuple[str, tuple[int, int, int]]:
    vector = k % 4 == 0
    lanes, rows, unroll, subgroups = config.threads_k, config.threads_x, config.unroll, config.subgroups
    x, y = ("tx", "ty") if subgroups else ("lid.x", "lid.y")
    groups = -(-n // rows)
    index, units = ("k4", "K4") if vector else ("k", "K")
    split_text, start, limit, k_slices = _split_prologue(config, "nk", k, groups, units)
    grid = grid_for_groups(groups * k_slices, caps)

    def term(offset: int, acc: str) -> str:
        at = f"{index} + {offset}u" if offset else index
        if vector:
            return f"            {acc} = {acc} + dot({_at(a_name, at)}, {_at(b_name, f'row * K4 + {at}')});\n"
        return f"            {acc} = fma({_at(a_name, at)}, {_at(b_name, f'row * K + {at}')}, {acc});\n"

    accumulators = ["acc"] + [f"acc{u}" for u in range(1, unroll)]
    if unroll == 1 and not start and not subgroups:
        loop = f"        for (var {index} = lid.x; {index} < {units}; {index} = {index} + {lanes}u) {{\n{term(0, 'acc')}        }}\n"
    else:
        body = "".join(term(u * lanes, a) for u, a in enumerate(accumulators))
        loop = (
            "".join(f"        var {a} = 0.0;\n" for a in accumulators[1:])
            + f"        var {index} = {start}{x};\n"
            + (
                f"        for (; {index} + {(unroll - 1) * lanes}u < {limit}; {index} = {index} + {unroll * lanes}u) {{\n{body}        }}\n"
                if unroll > 1
                else ""
            )
            + f"        for (; {index} < {limit}; {index} = {index} + {lanes}u) {{\n{term(0, 'acc')}        }}\n"
            + "".join(f"        acc = acc + {a};\n" for a in accumulators[1:])
        )
    if not subgroups:
        reduction = f"""    partials[lid.y * {lanes}u + lid.x] = acc;
    workgroupBarrier();
    for (var s = {lanes // 2}u; s > 0u; s = s >> 1u) {{
        if (lid.x < s) {{
            partials[lid.y * {lanes}u + lid.x] = partials[lid.y * {lanes}u + lid.x] + partials[lid.y * {lanes}u + lid.x + s];
        }}
        workgroupBarrier();
    }}
    if (lid.x == 0u && row < N) {{
        {store("row", f"partials[lid.y * {lanes}u]")}
    }}
"""
        slot = ""
    else:
        reduction = f"""    let width = min({lanes}u, sgs);
    for (var d = 1u; d < width; d = d << 1u) {{
        acc = acc + subgroupShuffleXor(acc, d);
    }}
    if (tx % width == 0u) {{ partials[slot / width] = acc; }}
    workgroupBarrier();
    if (tx == 0u && row < N) {{
        let pieces = {lanes}u / width;
        var total = partials[ty * pieces];
        for (var p = 1u; p < pieces; p = p + 1u) {{ total = total + partials[ty * pieces + p]; }}
        {store("row", "total")}
    }}
"""
        slot = f"    let slot = sid * sgs + lane;\n    let tx = slot % {lanes}u;\n    let ty = slot / {lanes}u;\n"
    row_group = "group" if k_slices == 1 else f"(group % {groups}u)"
    wgsl = f"""{declarations}
const N: u32 = {n}u;
const K: u32 = {k}u;
const K4: u32 = {k // 4}u;
const GROUPS: u32 = {groups * k_slices}u;
var<workgroup> partials: array<f32, {lanes * rows}>;
{epilogue}
@compute @workgroup_size({f"{lanes}, {rows}" if not subgroups else config.threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>{_SUBGROUP_BUILTINS if subgroups else ""}) {{
    let group = {workgroup_index(grid)};
    if (group >= GROUPS) {{ return; }}
{split_text}{slot}    let row = {row_group} * {rows}u + {y};
    var acc = 0.0;
    if (row < N) {{
{loop}    }}
{reduction}}}
"""
    return wgsl, grid


# -- the plan ------------------------------------------------------------------------------------------------------


def _partial_twin(
    layout: str,
    n: int,
    k: int,
    slices: int,
    per_slice: int,
    bindings: Sequence[Binding],
    inputs: Sequence[TensorInfo | None],
) -> Callable[[Sequence[np.ndarray], tuple[int, int, int]], None]:
    """What the partial-sum kernel does: scratch[s, :] = the products over slice s of K (float32)."""
    scratch_slot = next(slot for slot, b in enumerate(bindings) if b.kind == "scratch")
    _, unit = _units(layout, k)

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        full = _bound_inputs(arrays, bindings, inputs)
        a_in, b_in = full[0], full[1]
        assert a_in is not None and b_in is not None
        a = np.asarray(a_in, dtype=np.float32).reshape(k)
        b = np.asarray(b_in, dtype=np.float32).reshape((k, n) if layout == "kn" else (n, k))
        partial = np.empty((slices, n), dtype=np.float32)
        for s in range(slices):
            ks = slice(s * per_slice * unit, min(k, (s + 1) * per_slice * unit))
            partial[s] = a[ks] @ b[ks, :] if layout == "kn" else b[:, ks] @ a[ks]
        raw = partial.reshape(-1).view(np.uint8)
        arrays[scratch_slot][: raw.size] = raw

    return twin


def plan_gemv(
    name: str,
    *,
    n: int,
    k: int,
    layout: str,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    config: GemvConfig | None = None,
    output_perm: Perm | None = None,
) -> OpPlan:
    """The plan of ``out = epilogue(a @ B)``, A = input 0 (K values), B = input 1 in ``layout`` (``[K, N]`` or
    ``[N, K]``), epilogue extras bound by the epilogue; stored as :func:`~ortgpu.ops._output_layout.output_store`
    says (``output_perm``: its permutation).

    ``config``: the variant, default :func:`choose_gemv_config`; run as :func:`effective_gemv_config` says
    (no subgroups without the feature, no split with a single slice).  ``compute``: the whole node's function
    (the twin of the single-kernel variants).
    """
    if config is None:
        config = choose_gemv_config(layout, n, k, caps)
    config.validate(layout)
    config = effective_gemv_config(config, layout, n, k, caps)
    if not gemv_config_fits(config, layout, caps):
        raise NotOnDevice(f"{name}: GEMV config {config.label} exceeds the device's workgroup limits")
    vector_a = layout == "nk" and k % 4 == 0
    vector_b = (layout == "kn" and n % 4 == 0) or vector_a
    # per invocation: the K loop (a 4-step column loop inside where B is not vectorised), then the reductions
    k_steps = -(-(_slicing(config, layout, k)[1] if config.split_k > 1 else _units(layout, k)[0]) // config.threads_k)
    check_loop_budget(name, k_steps * (1 if vector_b else 5) + 64, caps)
    table = BindingTable()
    element = float_element(outputs[0])  # f16 storage is loaded into f32 (_at): the sums stay f32
    a_name = table.add(Binding("input", 0), f"vec4<{element}>" if vector_a else element)
    b_name = table.add(Binding("input", 1), f"vec4<{element}>" if vector_b else element)
    if config.split_k == 1:
        parts_helpers, store = output_store(table, element, outputs, out_shape, output_perm)
        epilogue = epilogue_function(steps, out_shape, table, element) + parts_helpers
        wgsl, grid = gemv_kernel(
            n=n,
            k=k,
            b_layout=layout,
            config=config,
            a_name=a_name,
            b_name=b_name,
            declarations=table.enables() + table.declarations(),
            epilogue=epilogue,
            store=store,
            caps=caps,
        )
        check_device_fits(name, list(inputs) + list(outputs), len(table.bindings), caps)
        twin = whole_op_twin(compute, table.bindings, inputs, outputs)
        return OpPlan(kernels=(KernelSpec(name, wgsl, grid, tuple(table.bindings), twin),))
    slices, per_slice = _slicing(config, layout, k)
    scratch = table.add(Binding("scratch", 0), writable=True)
    wgsl, grid = gemv_kernel(
        n=n,
        k=k,
        b_layout=layout,
        config=config,
        a_name=a_name,
        b_name=b_name,
        declarations=table.enables() + table.declarations(),
        epilogue="",
        store=lambda o, value: f"{scratch}[slice * N + {o}] = {value};",
        caps=caps,
    )
    partial_twin = _partial_twin(layout, n, k, slices, per_slice, table.bindings, inputs)
    partial = KernelSpec(name, wgsl, grid, tuple(table.bindings), partial_twin)
    return split_k_plan(name, partial, slices, n, False, steps, out_shape, inputs, outputs, caps, output_perm)
