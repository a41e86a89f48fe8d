"""onnxruntime's quantized operators in QOperator form: QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
QLinearConcat and QLinearGlobalAveragePool (uint8 and int8, per-tensor scales and zero points).

The references compute what onnxruntime's CPU kernels compute, unit for unit (:mod:`._qlinear_math`: the order of
their float32 operations decides the result at rounding ties, so a plain formula would differ by one there).

On the device every operator but the pool is a table lookup, exact by construction: with constant scales and zero
points (what ``quantize_static`` writes) the output byte is a function of the input bytes alone, so the plan
computes that function once on the host with the reference and the kernel looks the result up.  QLinearAdd and
QLinearMul index a 64 KiB table by the pair of input bytes (it rides in the kernel's uniform ``params``; onnxruntime's
broadcasting decides which of its formulas the table holds, see :func:`~._qlinear_math.scalar_input`), the
activations a 256-byte table by the input byte (onnxruntime's own method), QLinearConcat one table per input.
QLinearGlobalAveragePool sums each channel in i32 (wrapping as onnxruntime's int32 accumulator does), converts the
sum to f32 rounded once, multiplies by the host's float32 multiplier (a correctly rounded product in WGSL), clamps and
rounds half to even (WGSL's ``round``), as onnxruntime does.  Scales or zero points computed at run time run on the
CPU (the tables need them at plan time).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

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
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    wgsl_float,
    wgsl_int,
    workgroup_size_for,
)
from ._qlinear_math import (
    BYTE_DTYPES,
    add_values,
    average_pool_scale,
    logistic,
    lookup_table,
    mul_values,
    scalar_input,
    scale_of,
    zero_point_of,
)

__all__ = [
    "QLinearAdd",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearConcat",
    "QLinearGlobalAveragePool",
]

_U8 = np.dtype(np.uint8)


def _given(values: Sequence[Any], index: int) -> Any:
    return values[index] if len(values) > index else None


def _byte_dtype(op_type: str, value: np.ndarray | TensorInfo, what: str) -> np.dtype[Any]:
    if value.dtype not in BYTE_DTYPES:
        raise UnsupportedOpError(f"{op_type}: {what} of dtype {value.dtype} is not supported (uint8 or int8)")
    return np.dtype(value.dtype)


def _planned_constants(op_type: str, constants: Mapping[int, np.ndarray], required: Sequence[int]) -> None:
    missing = [index for index in required if index not in constants]
    if missing:
        raise NotOnDevice(
            f"{op_type}: scales or zero points computed at run time (inputs {missing}) run on the CPU (the device "
            "kernel looks results up in a table built at plan time)"
        )


def _table_kernel(
    op_type: str,
    sources: Sequence[tuple[int, TensorInfo]],
    table: np.ndarray,
    output: TensorInfo,
    value_function: str,
    caps: DeviceCaps,
    function: Callable[..., np.ndarray],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
) -> KernelSpec:
    """A kernel writing the bytes ``value(j)`` (WGSL ``fn value(j: u32) -> u32``, which may call ``load<s>(k)``:
    byte ``k`` of source ``s``, and ``table_byte(i)``: byte ``i`` of ``table``, held in the kernel's uniform
    ``params``).  ``function`` is the numpy twin (source arrays in order -> output 0)."""
    padded = np.zeros(-(-max(table.size, 16) // 16) * 16, dtype=np.uint8)
    padded[: table.size] = table
    if padded.size > caps.limits.max_uniform_buffer_binding_size:
        raise NotOnDevice(f"{op_type}: its {padded.size}-byte table exceeds the device's uniform binding limit")
    check_binding_count(op_type, len(sources) + 1, caps)
    check_binding_sizes(op_type, [info for _, info in sources] + [output], caps)
    parts: list[str] = []
    for slot, _ in enumerate(sources):
        parts.append(storage_declaration(slot, f"in{slot}", writable=False))
        parts.append(load_function(f"load{slot}", f"in{slot}", _U8))
    parts.append(f"@group(0) @binding({len(sources)}) var<uniform> table: array<vec4<u32>, {padded.size // 16}>;\n")
    parts.append(storage_declaration(len(sources) + 1, "dst", writable=True))
    parts.append(
        "fn table_byte(i: u32) -> u32 { return (table[i >> 4u][(i >> 2u) & 3u] >> ((i & 3u) * 8u)) & 0xffu; }\n"
    )
    parts.append(value_function)
    count = output.size
    invocations = -(-count // 4)
    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    bindings = tuple(Binding("input", index) for index, _ in sources) + (Binding("params"), Binding("output", 0))
    return KernelSpec(
        name=op_type,
        wgsl="".join(parts) + kernel_entry(workgroup, guard + store_statements(_U8, count, "value")),
        grid=grid_for(invocations, workgroup, caps.limits),
        bindings=bindings,
        twin=reference_twin(function, bindings, inputs, outputs),
        params=padded.tobytes(),
    )


def _identity(values: np.ndarray) -> np.ndarray:
    return values


class _QLinearBinary(Operator):
    """QLinearAdd and QLinearMul: inputs A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
    C_zero_point (zero points optional), A and B broadcast as numpy does."""

    domain = "com.microsoft"
    since_version = 1

    def values(
        self,
        a: np.ndarray,
        b: np.ndarray,
        scales: tuple[np.float32, np.float32, np.float32],
        zeros: tuple[int, int, int],
        scalar: Any,
        dtype: np.dtype[Any],
    ) -> np.ndarray:
        raise NotImplementedError

    def _parameters(
        self, inputs: Sequence[np.ndarray | None], dtype: np.dtype[Any]
    ) -> tuple[tuple[np.float32, np.float32, np.float32], tuple[int, int, int]]:
        op = self.op_type
        names = (("A_scale", "A_zero_point"), ("B_scale", "B_zero_point"), ("C_scale", "C_zero_point"))
        scales = tuple(scale_of(op, _given(inputs, p), n) for p, (n, _) in zip((1, 4, 6), names))
        zeros = tuple(zero_point_of(op, _given(inputs, p), dtype, n) for p, (_, n) in zip((2, 5, 7), names))
        return scales, zeros  # type: ignore[return-value]

    def _check(self, a: np.ndarray | TensorInfo, b: np.ndarray | TensorInfo) -> tuple[np.dtype[Any], tuple[int, ...]]:
        dtype = _byte_dtype(self.op_type, a, "A")
        if b.dtype != dtype:
            raise UnsupportedOpError(f"{self.op_type}: A is {dtype} but B is {b.dtype} (one type for both)")
        try:
            shape = tuple(int(d) for d in np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
        except ValueError:
            raise ShapeError(f"{self.op_type}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        return dtype, shape

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        a, b = inputs[0], _given(inputs, 3)
        assert a is not None and b is not None
        return [self._check(a, b)[1]]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], _given(inputs, 3)
        if a is None or b is None:
            raise ShapeError(f"{self.op_type}: inputs A and B are required")
        dtype, _ = self._check(a, b)
        scales, zeros = self._parameters(inputs, dtype)
        return [self.values(a, b, scales, zeros, scalar_input(a.shape, b.shape), dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b = inputs[0], _given(inputs, 3)
        assert a is not None and b is not None
        dtype, shape = self._check(a, b)
        _planned_constants(self.op_type, constants, [p for p in range(1, 8) if p != 3 and _given(inputs, p)])
        params = [constants.get(p) for p in range(8)]
        scales, zeros = self._parameters(params, dtype)
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        # Every pair of bytes: row a, column b.
        grid = np.arange(256, dtype=np.uint8).view(dtype)
        table = self.values(grid[:, None], grid[None, :], scales, zeros, scalar_input(a.shape, b.shape), dtype)
        value = (
            broadcast_index_function("index0", a.shape, shape)
            + broadcast_index_function("index1", b.shape, shape)
            + "fn value(j: u32) -> u32 { return table_byte(load0(index0(j)) * 256u + load1(index1(j))); }\n"
        )
        operator, attributes = type(self)(self.opset), dict(attrs)

        def function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            full: list[np.ndarray | None] = [*params]
            full[0], full[3] = x, y
            return operator.reference(full, attributes, outputs)[0]

        kernel = _table_kernel(
            self.op_type,
            [(0, a), (3, b)],
            table.view(np.uint8).reshape(-1),
            out,
            value,
            caps,
            function,
            inputs,
            outputs,
        )
        return OpPlan(kernels=(kernel,))


@register
class QLinearAdd(_QLinearBinary):
    op_type = "QLinearAdd"

    def values(
        self,
        a: np.ndarray,
        b: np.ndarray,
        scales: tuple[np.float32, np.float32, np.float32],
        zeros: tuple[int, int, int],
        scalar: Any,
        dtype: np.dtype[Any],
    ) -> np.ndarray:
        return add_values(a, b, scales, zeros, scalar, dtype)


@register
class QLinearMul(_QLinearBinary):
    op_type = "QLinearMul"

    def values(
        self,
        a: np.ndarray,
        b: np.ndarray,
        scales: tuple[np.float32, np.float32, np.float32],
        zeros: tuple[int, int, int],
        scalar: Any,
        dtype: np.dtype[Any],
    ) -> np.ndarray:
        return mul_values(a, b, scales, zeros, dtype)


class _QLinearLookup(Operator):
    """An activation of inputs X, X_scale, X_zero_point, Y_scale, Y_zero_point (zero points optional), computed by
    onnxruntime (and here) through a 256-entry table."""

    domain = "com.microsoft"
    since_version = 1

    def function(self, attrs: Mapping[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
        raise NotImplementedError

    def table(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], dtype: np.dtype[Any]) -> np.ndarray:
        op = self.op_type
        x_scale, y_scale = scale_of(op, _given(inputs, 1), "X_scale"), scale_of(op, _given(inputs, 3), "Y_scale")
        x_zero = zero_point_of(op, _given(inputs, 2), dtype, "X_zero_point")
        y_zero = zero_point_of(op, _given(inputs, 4), dtype, "Y_zero_point")
        return lookup_table(self.function(attrs), x_scale, x_zero, y_scale, y_zero, dtype)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        dtype = _byte_dtype(self.op_type, x, "X")
        return [self.table(inputs, attrs, dtype)[x.view(np.uint8)].view(dtype)]

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
        dtype = _byte_dtype(self.op_type, x, "X")
        _planned_constants(self.op_type, constants, [p for p in range(1, 5) if _given(inputs, p)])
        params = [constants.get(p) for p in range(5)]
        table = self.table(params, attrs, dtype)
        if outputs[0].size == 0:
            return OpPlan()

        def function(values: np.ndarray) -> np.ndarray:
            return table[values.view(np.uint8)].view(dtype)

        value = "fn value(j: u32) -> u32 { return table_byte(load0(j)); }\n"
        return OpPlan(kernels=(_table_kernel(self.op_type, [(0, x)], table, outputs[0], value, caps, function,
                                             inputs, outputs),))  # fmt: skip


@register
class QLinearSigmoid(_QLinearLookup):
    """Sigmoid through MLAS's float32 logistic approximation (which onnxruntime's table is built with)."""

    op_type = "QLinearSigmoid"

    def function(self, attrs: Mapping[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
        return logistic


@register
class QLinearLeakyRelu(_QLinearLookup):
    """LeakyRelu (``alpha`` default 0.01): ``x`` where ``x >= 0``, else ``alpha * x`` in float32."""

    op_type = "QLinearLeakyRelu"

    def function(self, attrs: Mapping[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
        alpha = np.float32(attrs.get("alpha", 0.01))

        def leaky(values: np.ndarray) -> np.ndarray:
            return np.where(values >= 0, values, (alpha * values).astype(np.float32)).astype(np.float32)

        return leaky


@register
class QLinearConcat(Operator):
    """Concat of quantized inputs requantized to the output's scale and zero point: inputs Y_scale, Y_zero_point,
    then (X, X_scale, X_zero_point) per tensor; ``axis`` is required.  An input whose scale and zero point are the
    output's is copied; the others go through onnxruntime's identity lookup table."""

    op_type = "QLinearConcat"
    domain = "com.microsoft"
    since_version = 1

    def _layout(self, shapes: Sequence[tuple[int, ...]], attrs: Mapping[str, Any]) -> tuple[int, tuple[int, ...]]:
        op = self.op_type
        if not shapes:
            raise ShapeError(f"{op}: needs Y_scale, Y_zero_point and at least one (X, X_scale, X_zero_point) triple")
        if "axis" not in attrs:
            raise UnsupportedOpError(f"{op}: the 'axis' attribute is required")
        rank = len(shapes[0])
        axis = int(attrs["axis"])
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{op}: axis {axis} is out of range for rank {rank}")
        axis = axis + rank if axis < 0 else axis
        for shape in shapes:
            if len(shape) != rank or any(shape[d] != shapes[0][d] for d in range(rank) if d != axis):
                raise ShapeError(f"{op}: input shapes {[list(s) for s in shapes]} differ off axis {axis}")
        total = sum(shape[axis] for shape in shapes)
        return axis, tuple(total if d == axis else shapes[0][d] for d in range(rank))

    def _triples(self, inputs: Sequence[Any]) -> list[int]:
        if len(inputs) < 5 or (len(inputs) - 2) % 3:
            raise ShapeError(f"{self.op_type}: inputs must be Y_scale, Y_zero_point, then (X, scale, zero point)s")
        return list(range(2, len(inputs), 3))

    def _tables(self, inputs: Sequence[np.ndarray | None], dtype: np.dtype[Any]) -> list[np.ndarray | None]:
        """Each input's table (None: copied as it is)."""
        op = self.op_type
        y_scale, y_zero = scale_of(op, inputs[0], "Y_scale"), zero_point_of(op, inputs[1], dtype, "Y_zero_point")
        tables: list[np.ndarray | None] = []
        for position in self._triples(inputs):
            x_scale = scale_of(op, inputs[position + 1], f"the scale of input {position}")
            x_zero = zero_point_of(op, inputs[position + 2], dtype, f"the zero point of input {position}")
            same = x_scale == y_scale and x_zero == y_zero
            tables.append(None if same else lookup_table(_identity, x_scale, x_zero, y_scale, y_zero, dtype))
        return tables

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        shapes = [tuple(info.shape) for info in (inputs[p] for p in self._triples(inputs)) if info is not None]
        return [self._layout(shapes, attrs)[1]]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        positions = self._triples(inputs)
        y_zero = inputs[1]
        if y_zero is None:
            raise ShapeError(f"{self.op_type}: Y_zero_point is required")
        dtype = _byte_dtype(self.op_type, y_zero, "Y_zero_point")
        arrays = [inputs[p] for p in positions]
        for position, array in zip(positions, arrays):
            if array is None or array.dtype != dtype:
                got = "absent" if array is None else array.dtype
                raise UnsupportedOpError(f"{self.op_type}: input {position} is {got}; the output is {dtype}")
        axis, _ = self._layout([a.shape for a in arrays if a is not None], attrs)
        parts = [
            array if table is None else table[array.view(np.uint8)].view(dtype)
            for array, table in zip(arrays, self._tables(inputs, dtype))
            if array is not None
        ]
        return [np.concatenate(parts, axis=axis)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        positions = self._triples(inputs)
        y_zero = inputs[1]
        assert y_zero is not None
        dtype = _byte_dtype(self.op_type, y_zero, "Y_zero_point")
        required = [0, 1] + [p + k for p in positions for k in (1, 2)]
        _planned_constants(self.op_type, constants, required)
        params: list[np.ndarray | None] = [constants.get(p) for p in range(len(inputs))]
        infos = [inputs[p] for p in positions]
        if any(info is None or info.dtype != dtype for info in infos):
            raise NotOnDevice(f"{self.op_type}: inputs of another type than the output's run on the CPU")
        axis, shape = self._layout([tuple(i.shape) for i in infos if i is not None], attrs)
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        tables = self._tables(params, dtype)
        identity = np.arange(256, dtype=np.uint8)
        post = element_count(shape[axis + 1 :])
        block = shape[axis] * post
        sources: list[tuple[int, TensorInfo]] = []
        chunks: list[np.ndarray] = []
        lines = [
            "fn value(j: u32) -> u32 {\n",
            f"  let outer = j / {block}u;\n",
            f"  let a = (j % {block}u) / {post}u;\n",
            f"  let p = j % {post}u;\n",
        ]
        start = 0
        for position, info, table in zip(positions, infos, tables):
            assert info is not None
            if info.size == 0:
                continue
            slot, size = len(sources), info.shape[axis]
            sources.append((position, info))
            chunks.append(identity if table is None else table)
            load = f"load{slot}((outer * {size}u + (a - {start}u)) * {post}u + p)"
            lines.append(f"  if (a < {start + size}u) {{ return table_byte({slot * 256}u + {load}); }}\n")
            start += size
        lines.append("  return 0u;\n}\n")
        operator, attributes = QLinearConcat(self.opset), dict(attrs)
        kept = [position for position, _ in sources]

        def function(*arrays: np.ndarray) -> np.ndarray:
            full: list[np.ndarray | None] = list(params)
            for position in positions:
                info = inputs[position]
                assert info is not None
                full[position] = np.zeros(info.shape, dtype)
            for position, array in zip(kept, arrays):
                full[position] = array
            return operator.reference(full, attributes, outputs)[0]

        kernel = _table_kernel(
            self.op_type, sources, np.concatenate(chunks), out, "".join(lines), caps, function, inputs, outputs
        )
        return OpPlan(kernels=(kernel,))


@register
class QLinearGlobalAveragePool(Operator):
    """The mean of each channel over all spatial positions, requantized: inputs X, x_scale, x_zero_point, y_scale,
    y_zero_point; ``channels_last`` (default 0) puts the channels last (NHWC) instead of second (NCHW)."""

    op_type = "QLinearGlobalAveragePool"
    domain = "com.microsoft"
    since_version = 1

    def _geometry(self, shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[bool, int, int, tuple[int, ...]]:
        """(channels_last, channels, image_size, output shape)."""
        if len(shape) < 3:
            raise ShapeError(f"{self.op_type}: X must have rank >= 3 (batch, channels, spatial...), got {list(shape)}")
        last = bool(int(attrs.get("channels_last", 0)))
        spatial = range(1, len(shape) - 1) if last else range(2, len(shape))
        out = tuple(1 if d in spatial else shape[d] for d in range(len(shape)))
        return last, shape[-1] if last else shape[1], element_count([shape[d] for d in spatial]), out

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        x = inputs[0]
        assert x is not None
        return [self._geometry(tuple(x.shape), attrs)[3]]

    def _parameters(self, inputs: Sequence[np.ndarray | None], dtype: np.dtype[Any], image: int) -> tuple[Any, ...]:
        op = self.op_type
        x_zero = zero_point_of(op, _given(inputs, 2), dtype, "x_zero_point")
        y_zero = zero_point_of(op, _given(inputs, 4), dtype, "y_zero_point")
        scale = average_pool_scale(op, scale_of(op, _given(inputs, 1), "x_scale"), scale_of(op, _given(inputs, 3),
                                   "y_scale"), image)  # fmt: skip
        return scale, x_zero, y_zero

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        dtype = _byte_dtype(self.op_type, x, "X")
        last, _, image, out_shape = self._geometry(x.shape, attrs)
        scale, x_zero, y_zero = self._parameters(inputs, dtype, image)
        axes = tuple(range(1, x.ndim - 1)) if last else tuple(range(2, x.ndim))
        sums = x.astype(np.int64).sum(axis=axes, keepdims=True) - x_zero * image
        wrapped = (sums + 2**31) % 2**32 - 2**31  # onnxruntime's int32 accumulator
        scaled = (wrapped.astype(np.float32) * scale).astype(np.float32)
        info = np.iinfo(dtype)
        clamped = np.clip(scaled, np.float32(info.min - y_zero), np.float32(info.max - y_zero))
        return [(np.rint(clamped.astype(np.float64)).astype(np.int64) + y_zero).astype(dtype).reshape(out_shape)]

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
        dtype = _byte_dtype(self.op_type, x, "X")
        last, channels, image, _ = self._geometry(tuple(x.shape), attrs)
        _planned_constants(self.op_type, constants, [p for p in range(1, 5) if _given(inputs, p)])
        scale, x_zero, y_zero = self._parameters([constants.get(p) for p in range(5)], dtype, image)
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        check_loop_budget(self.op_type, 4 * image, caps)
        check_binding_sizes(self.op_type, [x, out], caps)
        info = np.iinfo(dtype)
        bias = (-x_zero * image + 2**31) % 2**32 - 2**31  # onnxruntime's int32 product, wrapped
        # Output j is (n, c); its values start at (n * C + c) * image (NCHW, stride 1) or n * image * C + c (NHWC).
        start, stride = (f"(j / {channels}u) * {image * channels}u + j % {channels}u", channels) if last else (
            f"j * {image}u", 1)  # fmt: skip
        wgsl = (
            storage_declaration(0, "src", writable=False)
            + storage_declaration(1, "dst", writable=True)
            + load_function("load", "src", dtype)
            + "fn value(j: u32) -> u32 {\n"
            f"  let start = {start};\n"
            "  var acc = 0;\n"
            f"  for (var p = 0u; p < {image}u; p = p + 1u) {{ acc = acc + i32(load(start + p * {stride}u)); }}\n"
            f"  let biased = acc + {wgsl_int(bias)};\n"
            # the sum converted exactly, then rounded once (WGSL leaves the rounding of f32(i32) to the device)
            "  let exact = f32(biased >> 16u) * 65536.0 + f32(biased & 65535);\n"
            f"  let scaled = clamp(exact * {wgsl_float(scale)}, {float(info.min - y_zero)}, {float(info.max - y_zero)});\n"
            f"  return bitcast<u32>(i32(round(scaled)) + {y_zero}) & 0xffu;\n"
            "}\n"
        )
        count = out.size
        invocations = -(-count // 4)
        workgroup = workgroup_size_for(caps.limits)
        guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
        bindings = (Binding("input", 0), Binding("output", 0))
        operator, attributes = QLinearGlobalAveragePool(self.opset), dict(attrs)
        params = [constants.get(p) for p in range(5)]

        def function(values: np.ndarray) -> np.ndarray:
            return operator.reference([values, *params[1:]], attributes, outputs)[0]

        kernel = KernelSpec(
            name=self.op_type,
            wgsl=wgsl + kernel_entry(workgroup, guard + store_statements(_U8, count, "value")),
            grid=grid_for(invocations, workgroup, caps.limits),
            bindings=bindings,
            twin=reference_twin(function, bindings, inputs, outputs),
        )
        return OpPlan(kernels=(kernel,))
