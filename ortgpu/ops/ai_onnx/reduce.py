"""ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceProd,
ReduceSumSquare: ``axes`` as an attribute (ReduceSum before opset 13, the others before 18) or as an input (after),
``keepdims``, ``noop_with_empty_axes``.  Reducing an empty axis gives the identity: 0 for the sums (L1, L2,
SumSquare too), 1 for the product, -inf for LogSum and LogSumExp, -inf/+inf (the integer limits) for max/min.

The device kernel is a row reduction (:func:`plan_row_reduction`, also used by GlobalAveragePool): the kept
axes enumerate rows, the reduced axes the elements of a row; a power-of-two team of invocations shares a row
(one invocation for short rows, up to a whole workgroup for long ones) and combines its partial results in
workgroup memory.  That kernel computes in float32: float16 tensors (on a device with ``shader-f16``) are loaded
into f32, the accumulators and the team's workgroup memory stay f32, and the result is rounded once on store.
Integer and bool inputs (ReduceSum/Max/Min/L1/SumSquare/Prod, int64 exactly on ``vec2<u32>`` pairs), ReduceProd and
max/min over an empty axis (the identity: -inf/+inf, the integer type's extremes) use :func:`plan_serial_reduction`,
one invocation per output element looping over its row (float16 there is unpacked from 32-bit words into f32, which
core WGSL does on every device).
ReduceLogSumExp's row kernel takes the row maximum first and sums ``exp(v - max)`` (no overflow).  The operators
are rows of :data:`REDUCTIONS` over one class.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register_row
from .._row_norm import narrowed, widened
from .._tiling import (
    BindingTable,
    RowLayout,
    float_element,
    require_float,
    row_kernel_header,
    row_kernel_prologue,
    row_layout,
    single_kernel_plan,
    wgsl_f32,
    whole_op_twin,
)
from .._wgsl import (
    INT64_WGSL,
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    workgroup_size_for,
)
from .unary import LOG_WGSL

__all__ = [
    "REDUCTIONS",
    "plan_row_reduction",
    "plan_serial_reduction",
]

#: compute type -> kind -> (WGSL initial value, combine of ``acc`` and ``v``) for the serial kernel.
_SERIAL: dict[str, dict[str, tuple[str, str]]] = {
    "f32": {
        "max": ("bitcast<f32>(0xff800000u)", "max(acc, v)"),
        "min": ("bitcast<f32>(0x7f800000u)", "min(acc, v)"),
        "prod": ("1.0", "acc * v"),
    },
    "i32": {
        "sum": ("0", "acc + v"),
        "max": ("i32(-2147483647 - 1)", "max(acc, v)"),
        "min": ("2147483647", "min(acc, v)"),
        "prod": ("1", "acc * v"),
        # wrapping i32 arithmetic: the low bits agree with numpy's wrapping int8/16/32 for + and *
        "l1": ("0", "acc + abs(v)"),
        "sumsquare": ("0", "acc + v * v"),
    },
    "u32": {
        "sum": ("0u", "acc + v"),
        "max": ("0u", "max(acc, v)"),
        "min": ("0xffffffffu", "min(acc, v)"),
        "prod": ("1u", "acc * v"),
        "l1": ("0u", "acc + v"),
        "sumsquare": ("0u", "acc + v * v"),
    },
    "bool": {"max": ("false", "acc || v"), "min": ("true", "acc && v")},
    "int64": {
        "sum": ("vec2<u32>(0u, 0u)", "add64(acc, v)"),
        "max": ("vec2<u32>(0u, 0x80000000u)", "select(acc, v, less64s(acc, v))"),
        "min": ("vec2<u32>(0xffffffffu, 0x7fffffffu)", "select(acc, v, less64s(v, acc))"),
        "prod": ("vec2<u32>(1u, 0u)", "mul64(acc, v)"),
        "l1": ("vec2<u32>(0u, 0u)", "add64(acc, abs64(v))"),
        "sumsquare": ("vec2<u32>(0u, 0u)", "add64(acc, mul64(v, v))"),
    },
    "uint64": {
        "sum": ("vec2<u32>(0u, 0u)", "add64(acc, v)"),
        "max": ("vec2<u32>(0u, 0u)", "select(acc, v, less64u(acc, v))"),
        "min": ("vec2<u32>(0xffffffffu, 0xffffffffu)", "select(acc, v, less64u(v, acc))"),
        "prod": ("vec2<u32>(1u, 0u)", "mul64(acc, v)"),
        "l1": ("vec2<u32>(0u, 0u)", "add64(acc, v)"),
        "sumsquare": ("vec2<u32>(0u, 0u)", "add64(acc, mul64(v, v))"),
    },
}
_COMPUTE = {
    "float32": "f32",
    "float16": "f32",  # unpacked into f32 (the product accumulates there), packed again once on store
    "int32": "i32",
    "int16": "i32",
    "int8": "i32",
    "uint32": "u32",
    "uint16": "u32",
    "uint8": "u32",
    "bool": "bool",
    "int64": "int64",
    "uint64": "uint64",
}


def plan_serial_reduction(
    op_type: str,
    kind: str,
    x: TensorInfo,
    axes: Sequence[int],
    outputs: Sequence[TensorInfo],
    inputs: Sequence[TensorInfo | None],
    caps: DeviceCaps,
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
) -> OpPlan:
    """One kernel, one invocation per output element, reducing its row serially (any length, 0 included).

    For integer and bool inputs, float products and float max/min of empty rows, whose rows are short in practice.
    Raises :class:`NotOnDevice` for dtypes or kinds it does not cover (float sums and means, float64).
    """
    compute_type = _COMPUTE.get(x.dtype.name)
    table = _SERIAL.get(compute_type or "", {})
    if compute_type is None or kind not in table:
        raise NotOnDevice(f"{op_type} on {x.dtype.name} runs on the CPU: no WebGPU kernel for this dtype")
    layout = row_layout(x.shape, axes)
    check_loop_budget(op_type, layout.length, caps)
    output = outputs[0]
    if output.size == 0:
        return OpPlan()
    check_binding_sizes(op_type, [x, output], caps)
    pair = x.dtype.itemsize == 8
    value_type = "vec2<u32>" if pair else compute_type
    initial, combine = table[kind]
    loop = (
        f"  for (var r = 0u; r < {layout.length}u; r = r + 1u) {{\n"
        "    let v = load(base + row_offset(r));\n"
        f"    acc = {combine};\n"
        "  }\n"
    )
    wgsl = (
        storage_declaration(0, "src", writable=False)
        + storage_declaration(1, "dst", writable=True)
        + load_function("load", "src", x.dtype, int64_pair=pair)
        + (INT64_WGSL if pair else "")
        + layout.row_base
        + layout.row_offset
        + f"fn value(j: u32) -> {value_type} {{\n  let base = row_base(j);\n  var acc: {value_type} = {initial};\n"
        + loop
        + "  return acc;\n}\n"
    )
    workgroup = workgroup_size_for(caps.limits)
    per = 4 // output.dtype.itemsize if output.dtype.itemsize < 4 else 1
    invocations = -(-output.size // per)
    body = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n" + store_statements(
        output.dtype, output.size, "value", pair
    )
    wgsl += kernel_entry(workgroup, body)
    bindings = (Binding("input", 0), Binding("output", 0))
    twin = whole_op_twin(compute, bindings, inputs, outputs)
    return OpPlan(kernels=(KernelSpec(op_type, wgsl, grid_for(invocations, workgroup, caps.limits), bindings, twin),))


#: kind -> (WGSL initial value, WGSL combine of ``acc`` and ``v``, workgroup combine function)
_KERNELS = {
    "sum": ("0.0", "acc + v", "wg_sum"),
    "mean": ("0.0", "acc + v", "wg_sum"),
    # the identities are the infinities (not the largest finite floats): a row of -inf has the maximum -inf
    "max": ("bitcast<f32>(0xff800000u)", "max(acc, v)", "wg_max"),
    "min": ("bitcast<f32>(0x7f800000u)", "min(acc, v)", "wg_min"),
    "l1": ("0.0", "acc + abs(v)", "wg_sum"),
    "l2": ("0.0", "acc + v * v", "wg_sum"),
    "sumsquare": ("0.0", "acc + v * v", "wg_sum"),
    "logsum": ("0.0", "acc + v", "wg_sum"),
}

#: WGSL -inf and NaN (bit patterns: WGSL refuses infinite or NaN constant expressions written as literals)
_NEG_INF = "bitcast<f32>(0xff800000u)"
_NAN = "bitcast<f32>(0x7fc00000u)"
#: WGSL test of an f32 for NaN, by its bits
_IS_NAN = "((bitcast<u32>({}) & 0x7fffffffu) > 0x7f800000u)"


def plan_row_reduction(
    op_type: str,
    kind: str,
    x: TensorInfo,
    axes: Sequence[int],
    outputs: Sequence[TensorInfo],
    inputs: Sequence[TensorInfo | None],
    caps: DeviceCaps,
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
) -> OpPlan:
    """One kernel reducing input 0 over ``axes`` into output 0 (whose C order is the kept axes' order): float32, or
    float16 (the caller checked the device has ``shader-f16``) loaded into f32 and rounded once on store."""
    layout = row_layout(x.shape, axes)
    if layout.rows == 0:
        return OpPlan()
    if layout.length == 0 and kind in ("max", "min"):
        raise NotOnDevice(f"{op_type}: reducing an empty axis stays on the CPU")
    if kind == "logsumexp":
        return _plan_log_sum_exp(op_type, layout, outputs, inputs, caps, compute)
    threads, rows_per_group, grid, helpers = row_kernel_header(layout, caps, op_type, loops=1)
    initial, combine, team_combine = _KERNELS[kind]
    table = BindingTable()
    x_name = table.add(Binding("input", 0), float_element(x))
    output_element = float_element(outputs[0])
    output = table.add(Binding("output", 0), output_element, writable=True)
    finish = "total"
    if kind == "mean":
        # The mean over an empty axis is 0 in onnxruntime (its sum, with no division), not NaN.
        finish = f"total / {wgsl_f32(layout.length)}" if layout.length else "total"
    elif kind == "l2":
        finish = "sqrt(total)"
    elif kind == "logsum":
        # log(0) spelled out: -inf (an empty row, or values summing to zero)
        finish = f"select(log_f32(total), {_NEG_INF}, total == 0.0)"
        helpers += LOG_WGSL
    nan_count = nan_total = ""
    if kind in ("max", "min"):
        # WGSL's max/min may drop a NaN operand (lavapipe does); the spec follows numpy, where a NaN anywhere in
        # the row makes the result NaN: NaNs are counted (by their bits, which no fast-math folds away).
        nan_count = f"\n            nans = nans + select(0.0, 1.0, {_IS_NAN.format('v')});"
        nan_total = "\n    let row_nans = wg_sum(nans, t, slot);"
        finish = f"select(total, {_NAN}, row_nans > 0.0)"
    wgsl = f"""{table.enables()}{table.declarations()}
{helpers}
{row_kernel_prologue(grid, rows_per_group)}
    var acc = {initial};
    var nans = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            let v = {widened(float_element(x), f"{x_name}[base + row_offset(r)]")};
            acc = {combine};{nan_count}
        }}
    }}
    let total = {team_combine}(acc, t, slot);{nan_total}
    if (valid && t == 0u) {{
        {output}[row] = {narrowed(output_element, finish)};
    }}
}}
"""
    return single_kernel_plan(op_type, wgsl, grid, table, compute, inputs, outputs, caps)


def _plan_log_sum_exp(
    op_type: str,
    layout: RowLayout,
    outputs: Sequence[TensorInfo],
    inputs: Sequence[TensorInfo | None],
    caps: DeviceCaps,
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
) -> OpPlan:
    """log(sum(exp(v))) per row as ``m + log(sum(exp(v - m)))`` with ``m`` the row maximum; an infinite maximum
    (or a NaN) is the result itself, an empty row gives -inf."""
    threads, rows_per_group, grid, helpers = row_kernel_header(layout, caps, op_type, loops=2)
    x, output_info = inputs[0], outputs[0]
    assert x is not None
    table = BindingTable()
    x_name = table.add(Binding("input", 0), float_element(x))
    output = table.add(Binding("output", 0), float_element(output_info), writable=True)
    x_at = widened(float_element(x), f"{x_name}[base + row_offset(r)]")
    result = narrowed(float_element(output_info), f"select(result, total, {_IS_NAN.format('total')})")
    wgsl = f"""{table.enables()}{table.declarations()}
{helpers}
{row_kernel_prologue(grid, rows_per_group)}
    var m = {_NEG_INF};
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{ m = max(m, {x_at}); }}
    }}
    let row_max = wg_max(m, t, slot);
    // not finite (+-inf, NaN): exp(v - row_max) would be NaN; the maximum is the answer
    let finite = (bitcast<u32>(row_max) & 0x7fffffffu) < 0x7f800000u;
    let shift = select(0.0, row_max, finite);
    var s = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{ s = s + exp({x_at} - shift); }}
    }}
    let total = wg_sum(s, t, slot);
    if (valid && t == 0u) {{
        // a NaN in the row makes the sum NaN (even where max() dropped it): the result is NaN
        let result = select(row_max, row_max + log(total), finite);
        {output}[row] = {result};
    }}
}}
"""
    return single_kernel_plan(op_type, wgsl, grid, table, compute, inputs, outputs, caps)


#: kinds whose reduction of a single element is that element: ``noop_with_empty_axes`` returns the input as is.
#: The others (L1, L2, LogSum, SumSquare) still transform each element, reduced over no axes.
_NOOP_IS_IDENTITY = frozenset({"sum", "mean", "max", "min", "prod", "logsumexp"})


class _Reduce(Operator):
    """The class of every row of :data:`REDUCTIONS`: ``kind`` picks the combine, ``axes_input_since`` the opset
    where axes moved from an attribute to input 1."""

    kind = "sum"
    axes_input_since = 18

    def _axes(self, rank: int, attrs: Mapping[str, Any], axes_input: np.ndarray | None) -> tuple[int, ...] | None:
        """Normalised axes, or ``None`` for the identity (empty axes with ``noop_with_empty_axes``)."""
        if self.opset >= self.axes_input_since:
            axes = [] if axes_input is None else [int(a) for a in np.asarray(axes_input).reshape(-1)]
            noop = bool(attrs.get("noop_with_empty_axes", 0))
        else:
            if "noop_with_empty_axes" in attrs and attrs["noop_with_empty_axes"]:
                raise UnsupportedOpError(
                    f"{self.op_type}: noop_with_empty_axes exists from opset {self.axes_input_since} (model opset {self.opset})"
                )
            axes = [int(a) for a in attrs.get("axes", [])]
            noop = False
        if not axes:
            return None if noop else tuple(range(rank))
        normalised = tuple(sorted({a + rank if a < 0 else a for a in axes}))
        if any(a < 0 or a >= rank for a in normalised):
            raise UnsupportedOpError(f"{self.op_type}: axes {axes} out of range for rank {rank}")
        return normalised

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        axes = self._axes(x.ndim, attrs, inputs[1] if len(inputs) > 1 else None)
        if axes is None:
            if self.kind in _NOOP_IS_IDENTITY:
                return [x.copy()]
            axes = ()  # each element reduced alone: |x|, sqrt(x*x), log(x), x*x (as onnxruntime and onnx do)
        keepdims = bool(attrs.get("keepdims", 1))
        if self.kind == "sum":
            # float16 sums in float32 (as the kernel does), rounded once below
            y = np.sum(x, axis=axes, keepdims=keepdims, dtype=np.float32 if x.dtype == np.float16 else x.dtype)
        elif self.kind == "mean" and x.size == 0:
            y = np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)  # onnxruntime: 0 over an empty axis, not NaN
        elif self.kind == "mean":
            y = np.mean(x, axis=axes, keepdims=keepdims, dtype=np.float64 if x.dtype.kind == "f" else None)
        elif self.kind == "max":
            initial = _extreme(x.dtype, low=True)
            y = np.max(x, axis=axes, keepdims=keepdims, initial=initial)
        elif self.kind == "min":
            initial = _extreme(x.dtype, low=False)
            y = np.min(x, axis=axes, keepdims=keepdims, initial=initial)
        else:
            y = _other_reduction(self.kind, x, axes, keepdims)
        return [np.asarray(y, dtype=x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        axes_input = None
        if self.opset >= self.axes_input_since and len(inputs) > 1 and inputs[1] is not None:
            if 1 not in constants:
                raise NotOnDevice(f"{self.op_type}: axes computed at run time cannot be planned; it runs on the CPU")
            axes_input = constants[1]
        axes = self._axes(len(x.shape), attrs, axes_input)
        if axes is None:
            if self.kind in _NOOP_IS_IDENTITY:
                return OpPlan(alias={0: 0})
            axes = ()

        def compute(full: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            return self.reference([full[0], axes_input] + list(full[2:]), attrs, outputs)

        empty = row_layout(x.shape, axes).length == 0
        if x.dtype.kind in "iub" or (empty and self.kind in ("max", "min")) or self.kind == "prod":
            return plan_serial_reduction(self.op_type, self.kind, x, axes, outputs, inputs[:1], caps, compute)
        require_float(self.op_type, [x] + list(outputs), caps)
        return plan_row_reduction(self.op_type, self.kind, x, axes, outputs, inputs[:1], caps, compute)


def _other_reduction(kind: str, x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """ReduceL1/L2/LogSum/LogSumExp/Prod/SumSquare in numpy: integers in their own (wrapping) dtype, floats in
    float64 (the caller casts back)."""
    if x.dtype.kind == "b":
        raise UnsupportedOpError(f"Reduce ({kind}): bool inputs are not allowed")
    wide = x.astype(np.float64) if x.dtype.kind == "f" else x
    integer = x.dtype.kind in "iu"
    if kind == "prod":
        return np.asarray(np.prod(wide, axis=axes, keepdims=keepdims, dtype=wide.dtype))
    if kind == "l1":
        return np.asarray(np.sum(np.abs(wide), axis=axes, keepdims=keepdims, dtype=wide.dtype))
    if kind == "sumsquare":
        return np.asarray(np.sum(wide * wide, axis=axes, keepdims=keepdims, dtype=wide.dtype))
    if kind == "l2":
        squares = np.sum(wide * wide, axis=axes, keepdims=keepdims, dtype=wide.dtype)
        return np.asarray(np.sqrt(squares.astype(np.float64)))
    if integer and kind == "logsumexp":
        # onnxruntime truncates its intermediate exponentials to the integer type ([7, 6, 7, 3, 6] gives 7, where
        # log(sum(exp)) is 8.01): no answer is safe to give
        raise UnsupportedOpError(
            f"ReduceLogSumExp on {x.dtype} is not implemented (implementations disagree on integer rounding); "
            "cast the input to float first"
        )
    if integer:
        # in float64, truncated toward zero by the caller's cast (as onnxruntime does)
        result = _other_reduction(kind, x.astype(np.float64), axes, keepdims)
        if not np.all(np.isfinite(result)):
            raise UnsupportedOpError(
                f"Reduce ({kind}): the result is not finite ({kind} of an empty or non-positive integer sum), which "
                f"{x.dtype} cannot hold"
            )
        return np.asarray(np.trunc(result))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if kind == "logsum":
            return np.asarray(np.log(np.sum(wide, axis=axes, keepdims=keepdims)))
        # logsumexp: shift by the (finite) row maximum so exp cannot overflow
        peak = np.max(wide, axis=axes, keepdims=True, initial=-np.inf)
        shift = np.where(np.isfinite(peak), peak, 0.0)
        total = np.log(np.sum(np.exp(wide - shift), axis=axes, keepdims=True)) + shift
        total = np.where(np.isfinite(peak), total, peak)
        return np.asarray(total if keepdims else np.squeeze(total, axis=axes))


def _extreme(dtype: np.dtype[Any], *, low: bool) -> Any:
    """The identity of max (``low``) or min over ``dtype``: -inf/+inf, the integer limits, False/True."""
    if dtype.kind == "f":
        return -np.inf if low else np.inf
    if dtype.kind == "b":
        return not low
    info = np.iinfo(dtype)
    return info.min if low else info.max


#: The reductions, one row each: (op type, combine ``kind``, the opset where ``axes`` became input 1).  Every one
#: starts at opset 1; the versions between differ by types and that move, which the one class tells apart.
REDUCTIONS: tuple[tuple[str, str, int], ...] = (
    ("ReduceSum", "sum", 13),
    ("ReduceMean", "mean", 18),
    ("ReduceMax", "max", 18),
    ("ReduceMin", "min", 18),
    ("ReduceL1", "l1", 18),  # sum of absolute values
    ("ReduceL2", "l2", 18),  # square root of the sum of squares
    ("ReduceLogSum", "logsum", 18),  # log of the sum
    ("ReduceLogSumExp", "logsumexp", 18),  # log of the sum of exponentials
    ("ReduceProd", "prod", 18),  # product (1 over an empty axis)
    ("ReduceSumSquare", "sumsquare", 18),  # sum of squares
)

for _op_type, _kind, _axes_input_since in REDUCTIONS:
    register_row(
        _Reduce,
        __name__,
        _op_type,
        1,
        kind=_kind,
        axes_input_since=_axes_input_since,
        opset_changes=(_axes_input_since,),
    )
