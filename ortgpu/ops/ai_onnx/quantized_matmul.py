"""MatMulInteger and QLinearMatMul: exact integer matrix products (CPU references).

Both subtract the zero points exactly, multiply in int64 (numpy's integer
matmul is exact) and wrap the sums to int32, the accumulator ONNX specifies
("accumulation may overflow if and only if in 32 bits").  A 1-D zero point of
``a`` is per row (one value per row of each matrix), of ``b`` per column.
QLinearMatMul then requantizes: ``saturate(round_half_even(acc * a_scale *
b_scale / y_scale) + y_zero_point)``, the multiplier in float32 as onnxruntime
computes it.

Both run on the device for uint8/int8 matrices of rank >= 2 (batch axes
broadcast) with per-tensor zero points: one invocation per output element sums
over K in WGSL's i32 arithmetic, which wraps exactly like the int32
accumulator.  QLinearMatMul needs its scales as constants there (the multiplier
is computed on the host, in float32 as the reference does); the sum is
converted to f32 exactly and rounded once (``f32(acc >> 16) * 65536 + f32(acc &
0xffff)``), scaled (a correctly rounded f32 product), rounded half to even
(WGSL's ``round``) and saturated.  Per-row/per-column parameters run on the CPU
(the kernel reads per-column B parameters only for com.microsoft's to-float operators).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    Operator,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    reference_twin,
)
from .._registry import register
from .._wgsl import (
    LINEAR_INVOCATION,
    broadcast_index_function,
    check_binding_count,
    check_binding_sizes,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    wgsl_float,
    workgroup_size_for,
)
from .quantize import saturate_round

__all__ = ["MatMulInteger", "QLinearMatMul", "wrap_int32"]

_INTEGER_INPUTS = (np.dtype(np.uint8), np.dtype(np.int8))


def wrap_int32(values: np.ndarray) -> np.ndarray:
    """int64 sums as int32 with two's complement wrap-around (the accumulator's overflow)."""
    return values.astype(np.int64).astype(np.uint64).astype(np.uint32).view(np.int32)


def _per_row(value: np.ndarray | None, matrix: np.ndarray, op_type: str, what: str) -> np.ndarray:
    """A parameter of ``a`` shaped to broadcast over its rows (1-D: one value per row)."""
    if value is None:
        return np.zeros((), dtype=np.int64)
    if value.size == 1:
        return value.reshape(()).astype(np.int64)
    if value.ndim == 1:
        if matrix.ndim < 2 or value.shape[0] != matrix.shape[-2]:
            raise ShapeError(f"{op_type}: {what} of {value.shape[0]} values for rows of {matrix.shape}")
        return value.reshape(-1, 1).astype(np.int64)
    return value.astype(np.int64)


def _per_column(value: np.ndarray | None, matrix: np.ndarray, op_type: str, what: str) -> np.ndarray:
    """A parameter of ``b`` shaped to broadcast over its columns (1-D: one value per column)."""
    if value is None:
        return np.zeros((), dtype=np.int64)
    if value.size == 1:
        return value.reshape(()).astype(np.int64)
    if value.ndim == 1 and value.shape[0] != matrix.shape[-1]:
        raise ShapeError(f"{op_type}: {what} of {value.shape[0]} values for columns of {matrix.shape}")
    return value.astype(np.int64)


def integer_matmul(
    a: np.ndarray, b: np.ndarray, a_zero: np.ndarray | None, b_zero: np.ndarray | None, op_type: str
) -> np.ndarray:
    """``(a - a_zero) @ (b - b_zero)`` as int32 (wrapped)."""
    for name, value in (("A", a), ("B", b)):
        if value.dtype not in _INTEGER_INPUTS:
            raise UnsupportedOpError(f"{op_type}: {name} of dtype {value.dtype} (uint8 or int8 expected)")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"{op_type}: inputs must have rank >= 1")
    left = a.astype(np.int64) - _per_row(a_zero, a, op_type, "a_zero_point")
    right = b.astype(np.int64) - _per_column(b_zero, b, op_type, "b_zero_point")
    try:
        product = np.matmul(left, right)
    except ValueError as error:
        raise ShapeError(f"{op_type}: shapes {a.shape} and {b.shape} do not multiply ({error})") from None
    return wrap_int32(np.asarray(product))


@register
class MatMulInteger(Operator):
    op_type = "MatMulInteger"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        a_zero = inputs[2] if len(inputs) > 2 else None
        b_zero = inputs[3] if len(inputs) > 3 else None
        return [integer_matmul(a, b, a_zero, b_zero, self.op_type)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        present = [i if i < len(inputs) and inputs[i] is not None else -1 for i in range(4)]

        def function(*arrays: np.ndarray) -> np.ndarray:
            values: list[np.ndarray | None] = [None] * 4
            for position, array in zip([p for p in present if p >= 0], arrays):
                values[position] = array
            assert values[0] is not None and values[1] is not None
            return integer_matmul(values[0], values[1], values[2], values[3], "MatMulInteger")

        return integer_matmul_kernel("MatMulInteger", inputs, outputs, present, caps, function)


@register
class QLinearMatMul(Operator):
    op_type = "QLinearMatMul"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = inputs[:8]
        assert a is not None and b is not None and a_scale is not None and b_scale is not None
        assert y_scale is not None and y_zero is not None
        for scale in (a_scale, b_scale, y_scale):
            if scale.dtype not in (np.float32, np.float16):
                raise UnsupportedOpError(f"QLinearMatMul: scales of dtype {scale.dtype} (float32 or float16)")
        if y_zero.dtype not in _INTEGER_INPUTS:
            raise UnsupportedOpError(f"QLinearMatMul: outputs of dtype {y_zero.dtype} (uint8 or int8 expected)")
        accumulated = integer_matmul(a, b, a_zero, b_zero, self.op_type)
        if y_scale.size != 1 or y_zero.size != 1:
            raise UnsupportedOpError("QLinearMatMul: y_scale and y_zero_point must be per tensor (one value)")
        input_scales = _scale_rows(a_scale).astype(np.float32) * _scale_columns(b_scale).astype(np.float32)
        multiplier = input_scales / y_scale.reshape(()).astype(np.float32)
        scaled = accumulated.astype(np.float32) * multiplier.astype(np.float32)
        return [saturate_round(np.rint(scaled.astype(np.float64)) + float(y_zero.reshape(-1)[0]), y_zero.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        if not all(position in constants for position in (1, 4, 6)):
            raise NotOnDevice("QLinearMatMul: scales computed at run time run on the CPU (the multiplier is planned)")
        a_scale, b_scale, y_scale = (np.asarray(constants[p]) for p in (1, 4, 6))
        if a_scale.size != 1 or b_scale.size != 1 or y_scale.size != 1:
            raise NotOnDevice("QLinearMatMul: per-row/per-column scales run on the CPU")
        if any(s.dtype not in (np.float32, np.float16) for s in (a_scale, b_scale, y_scale)):
            raise NotOnDevice("QLinearMatMul: scales other than float32/float16 run on the CPU")
        y_zero = inputs[7]
        assert y_zero is not None
        if y_zero.size != 1 or y_zero.dtype not in _INTEGER_INPUTS or outputs[0].dtype != y_zero.dtype:
            raise NotOnDevice("QLinearMatMul: this output zero point runs on the CPU")
        # The multiplier exactly as the reference computes it (float32 products and quotient).
        multiplier = (a_scale.astype(np.float32).reshape(()) * b_scale.astype(np.float32).reshape(())) / (
            y_scale.astype(np.float32).reshape(())
        )
        # Every scaled sum must stay finite (WGSL need not produce infinities): |sum| < 2^31.
        if not np.isfinite(multiplier) or abs(float(multiplier)) * 2.0**31 >= 3.4e38:
            raise NotOnDevice("QLinearMatMul: a non-finite requantization multiplier runs on the CPU")
        operator = QLinearMatMul(self.opset)
        names = constants

        def function(
            a: np.ndarray, b: np.ndarray, a_zero: np.ndarray, b_zero: np.ndarray, zero: np.ndarray
        ) -> np.ndarray:
            values = [a, names[1], a_zero, b, names[4], b_zero, names[6], zero]
            return operator.reference(values, attrs, outputs)[0]

        return integer_matmul_kernel(
            "QLinearMatMul",
            inputs,
            outputs,
            [0, 3, 2, 5],
            caps,
            function,
            requantize=(float(multiplier), 7, y_zero.dtype.name),
        )


def _scale_rows(scale: np.ndarray) -> np.ndarray:
    if scale.size == 1:
        return scale.reshape(())
    return scale.reshape(-1, 1) if scale.ndim == 1 else scale


def _scale_columns(scale: np.ndarray) -> np.ndarray:
    return scale.reshape(()) if scale.size == 1 else scale


def _batch_shape(a: tuple[int, ...], b: tuple[int, ...], op_type: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise ShapeError(f"{op_type}: batch shapes {a} and {b} do not broadcast") from None


def integer_matmul_kernel(
    op_type: str,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    positions: Sequence[int],
    caps: DeviceCaps,
    function: Any,
    requantize: tuple[float | Sequence[float], int, str] | None = None,
    to_float: tuple[int, int, int] | None = None,
    *,
    transposed: tuple[bool, bool] = (False, False),
    integer_bias: int = -1,
    scaled: Sequence[float] | None = None,
    column_parameters: bool = False,
) -> OpPlan:
    """The kernel of ``(a - a_zero) @ (b - b_zero)`` (int32, wrapping) over node inputs ``positions`` = (a, b,
    a_zero or -1, b_zero or -1); with ``requantize = (multiplier, y_zero input, output dtype name)`` the sums are
    requantized to 8 bits; with ``to_float = (a_scale input, b_scale input, bias input or -1)`` (one float32 scale
    each, a bias per column) they become ``f32(sum) * (a_scale * b_scale) + bias`` (com.microsoft's
    MatMulIntegerToFloat); with ``scaled`` (host float32 multipliers) they become ``f32(sum) * multiplier``.

    For com.microsoft's QGemm: ``transposed`` reads 2-D A as (K, M) and/or B as (N, K); ``integer_bias`` (an int32
    input broadcasting to (M, N)) starts each sum; a multiplier of ``requantize`` or ``scaled`` may be a sequence of
    one value per column (per-column B scales), held in a private array of the kernel.

    With ``column_parameters`` B's zero point, and with ``to_float`` B's scale, may be read from their buffers per
    column (1-D, one value per column of B: com.microsoft's MatMulIntegerToFloat and DynamicQuantizeMatMul); the A
    scale of ``to_float`` is always read from its buffer, so it may be one a previous kernel of the plan wrote.
    Parameters of one value give the same WGSL either way."""
    a, b = inputs[positions[0]], inputs[positions[1]]
    assert a is not None and b is not None
    out = outputs[0]
    for name, info in (("A", a), ("B", b)):
        if info.dtype not in _INTEGER_INPUTS:
            raise NotOnDevice(f"{op_type}: {name} of dtype {info.dtype.name} runs on the CPU")
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise NotOnDevice(f"{op_type}: vector operands (rank 1) run on the CPU")
    if any(transposed) and (len(a.shape) != 2 or len(b.shape) != 2):
        raise NotOnDevice(f"{op_type}: transposed operands are planned for matrices (rank 2) only")
    m, k = a.shape[-2:][::-1] if transposed[0] else a.shape[-2:]
    k_b, n = b.shape[-2:][::-1] if transposed[1] else b.shape[-2:]
    if k != k_b:
        raise ShapeError(f"{op_type}: shapes {a.shape} and {b.shape} do not multiply")
    batch = _batch_shape(a.shape[:-2], b.shape[:-2], op_type)
    if out.size == 0:
        return OpPlan()
    per = elements_per_invocation(out.dtype.itemsize)
    check_loop_budget(op_type, per * k, caps)
    bindings: list[Binding] = []
    parts: list[str] = []
    infos: list[TensorInfo] = []
    # where each of B's parameters is read: "0u" (one value), or the output element's column
    zb_index, sb_index = "0u", "0u"
    for slot, (position, name) in enumerate(zip(positions, ("a", "b", "za", "zb"))):
        if position < 0:
            parts.append(f"fn load_{name}(k: u32) -> i32 {{ return 0; }}\n")
            continue
        operand = inputs[position]
        assert operand is not None
        info = operand
        if slot == 3 and info.size != 1 and _one_per_column(info, n, column_parameters):
            zb_index = "col"
        elif slot >= 2 and info.size != 1:
            raise NotOnDevice(f"{op_type}: per-row/per-column zero points run on the CPU")
        if info.dtype not in _INTEGER_INPUTS:
            raise NotOnDevice(f"{op_type}: zero points of dtype {info.dtype.name} run on the CPU")
        parts.append(storage_declaration(len(bindings), f"buf_{name}", writable=False))
        parts.append(load_function(f"raw_{name}", f"buf_{name}", info.dtype))
        parts.append(f"fn load_{name}(k: u32) -> i32 {{ return i32(raw_{name}(k)); }}\n")
        bindings.append(Binding("input", position))
        infos.append(info)
    if requantize is not None:
        multiplier, zero_position, _ = requantize
        zero = inputs[zero_position]
        assert zero is not None
        parts.append(storage_declaration(len(bindings), "buf_zy", writable=False))
        parts.append(load_function("raw_zy", "buf_zy", zero.dtype))
        bindings.append(Binding("input", zero_position))
        infos.append(zero)
    if to_float is not None:
        for name, position in zip(("sa", "sb", "bias"), to_float):
            if position < 0:
                parts.append(f"fn load_{name}(k: u32) -> f32 {{ return 0.0; }}\n")
                continue
            operand = inputs[position]
            assert operand is not None
            if name == "sb" and operand.size != 1:
                if not _one_per_column(operand, n, column_parameters):
                    raise NotOnDevice(f"{op_type}: a B scale of shape {operand.shape} runs on the CPU")
                sb_index = f"j % {n}u"
            parts.append(storage_declaration(len(bindings), f"buf_{name}", writable=False))
            parts.append(load_function(f"load_{name}", f"buf_{name}", operand.dtype))
            bindings.append(Binding("input", position))
            infos.append(operand)
    start = "0"
    if integer_bias >= 0:
        bias_info = inputs[integer_bias]
        assert bias_info is not None
        rows, columns = _bias_strides(bias_info.shape, m, n, op_type)
        parts.append(storage_declaration(len(bindings), "buf_c", writable=False))
        parts.append(load_function("load_c", "buf_c", bias_info.dtype))
        bindings.append(Binding("input", integer_bias))
        infos.append(bias_info)
        start = f"load_c(row * {rows}u + col * {columns}u)"
    check_binding_count(op_type, len(bindings) + 1, caps)
    check_binding_sizes(op_type, infos + [out], caps)
    parts.append(storage_declaration(len(bindings), "dst", writable=True))
    bindings.append(Binding("output", 0))
    parts.append(broadcast_index_function("a_batch", a.shape[:-2], batch))
    parts.append(broadcast_index_function("b_batch", b.shape[:-2], batch))
    # element (row, i) of A and (i, col) of B, whichever way each is stored
    a_row, a_step = ("row", f"i * {m}u") if transposed[0] else (f"row * {k}u", "i")
    b_col, b_step = (f"col * {k}u", "i") if transposed[1] else ("col", f"i * {n}u")
    parts.append(
        "fn accumulate(j: u32) -> i32 {\n"
        f"  let col = j % {n}u;\n"
        f"  let row = (j / {n}u) % {m}u;\n"
        f"  let batch = j / {m * n}u;\n"
        f"  let a0 = a_batch(batch) * {m * k}u + {a_row};\n"
        f"  let b0 = b_batch(batch) * {k * n}u + {b_col};\n"
        "  let za = load_za(0u);\n"
        f"  let zb = load_zb({zb_index});\n"
        f"  var acc = {start};\n"
        f"  for (var i = 0u; i < {k}u; i = i + 1u) {{\n"
        f"    acc = acc + (load_a(a0 + {a_step}) - za) * (load_b(b0 + {b_step}) - zb);\n"
        "  }\n"
        "  return acc;\n"
        "}\n"
    )
    if to_float is not None:
        # the sum converted exactly and rounded once (two exact f32 terms), scaled by the rounded product of scales
        parts.append(
            "fn value(j: u32) -> f32 {\n"
            "  let acc = accumulate(j);\n"
            "  let exact = f32(acc >> 16u) * 65536.0 + f32(acc & 65535);\n"
            f"  return exact * (load_sa(0u) * load_sb({sb_index})) + load_bias(j % {n}u);\n"
            "}\n"
        )
    elif scaled is not None:
        parts.append(_multiplier_function(scaled, n))
        parts.append(
            "fn value(j: u32) -> f32 {\n"
            "  let acc = accumulate(j);\n"
            "  return (f32(acc >> 16u) * 65536.0 + f32(acc & 65535)) * multiplier(j);\n"
            "}\n"
        )
    elif requantize is None:
        parts.append("fn value(j: u32) -> i32 { return accumulate(j); }\n")
    else:
        multiplier, _, dtype_name = requantize
        low, high = (0, 255) if dtype_name == "uint8" else (-128, 127)
        parts.append(_multiplier_function(multiplier, n))
        parts.append(
            "fn value(j: u32) -> i32 {\n"
            "  let acc = accumulate(j);\n"
            "  let exact = f32(acc >> 16u) * 65536.0 + f32(acc & 65535);\n"
            "  let scaled = round(exact * multiplier(j)) + f32(i32(raw_zy(0u)));\n"
            f"  return i32(clamp(scaled, {low}.0, {high}.0));\n"
            "}\n"
        )
    count = out.size
    invocations = -(-count // per)
    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    body = store_statements(out.dtype, count, "value")
    assert element_count(batch) * m * n == count
    kernel = KernelSpec(
        name=op_type,
        wgsl="".join(parts) + kernel_entry(workgroup, guard + body),
        grid=grid_for(invocations, workgroup, caps.limits),
        bindings=tuple(bindings),
        twin=reference_twin(function, bindings, inputs, outputs),
    )
    return OpPlan(kernels=(kernel,))


def _one_per_column(info: TensorInfo, columns: int, allowed: bool) -> bool:
    """Whether a parameter of B holds one value per column (1-D) where the caller reads such parameters."""
    return allowed and info.shape == (columns,)


def _multiplier_function(multiplier: float | Sequence[float], columns: int) -> str:
    """``fn multiplier(j: u32) -> f32``: one float32 multiplier, or one per column of output element ``j``."""
    values = [multiplier] if isinstance(multiplier, (int, float)) else list(multiplier)
    if len(values) == 1:
        return f"fn multiplier(j: u32) -> f32 {{ return {wgsl_float(values[0])}; }}\n"
    if len(values) != columns:
        raise NotOnDevice(f"{len(values)} multipliers for {columns} columns")
    literals = ", ".join(wgsl_float(value) for value in values)
    return (
        f"var<private> multipliers: array<f32, {columns}> = array<f32, {columns}>({literals});\n"
        f"fn multiplier(j: u32) -> f32 {{ return multipliers[j % {columns}u]; }}\n"
    )


def _bias_strides(shape: tuple[int, ...], m: int, n: int, op_type: str) -> tuple[int, int]:
    """Element strides (per row, per column) of an int32 bias of ``shape`` broadcast to (M, N) (0 where it
    repeats); onnxruntime's QGemm takes (), (1,), (N,), (1, N), (M, 1) and (M, N)."""
    if len(shape) > 2:
        raise ShapeError(f"{op_type}: bias C of shape {shape} has rank above 2")
    rows, columns = ((1, 1) + tuple(int(d) for d in shape))[-2:]
    if rows not in (1, m) or columns not in (1, n):
        raise ShapeError(f"{op_type}: bias C of shape {shape} does not broadcast to ({m}, {n})")
    return (columns if rows == m and m > 1 else 0), (1 if columns == n and n > 1 else 0)
