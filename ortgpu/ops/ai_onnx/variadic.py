"""Variadic elementwise operators: Max Min Sum Mean (1..N inputs, multidirectional broadcasting).

On the device: one :func:`~ortgpu.ops._wgsl_kernels.elementwise_kernel` over all inputs (one binding
each), folding them left to right.  float32 and float16 are computed in f32 (Sum and Mean round once
to float16 at the end, as the reference does); Max and Min also run on every integer type, int64 and
uint64 exactly on ``vec2<u32>`` pairs.  Float Max/Min propagate NaN (as numpy and onnxruntime do):
WGSL's ``max``/``min`` leave NaN operands unspecified, so NaN is tested on the bits.  Nodes with more
inputs than the device binds storage buffers run as several kernels, each folding a group into a
partial result in scratch (float32 for float16 sums) that the next one starts from.  float64 runs on
the CPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError
from ortgpu_core.backends.protocol import KernelTwin

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import INT64_WGSL, require_device_dtype, wgsl_float
from .._wgsl_kernels import Operand, elementwise_kernel, elementwise_plan

__all__ = ["VariadicOperator", "Max", "Min", "Sum", "Mean", "MINMAX_WGSL", "MINMAX64_WGSL"]

_FLOATS = ("float32", "float16")
_NARROW_INTS = ("int32", "uint32", "int16", "uint16", "int8", "uint8")
_PAIRS = ("int64", "uint64")

#: WGSL float max/min that return a NaN operand (WGSL leaves ``max(NaN, x)`` to the driver).
MINMAX_WGSL = """
fn is_nan_f32(a: f32) -> bool {
  return (bitcast<u32>(a) & 0x7fffffffu) > 0x7f800000u;
}
fn max_f32(a: f32, b: f32) -> f32 {
  if (is_nan_f32(a)) { return a; }
  if (is_nan_f32(b)) { return b; }
  return select(b, a, a > b);
}
fn min_f32(a: f32, b: f32) -> f32 {
  if (is_nan_f32(a)) { return a; }
  if (is_nan_f32(b)) { return b; }
  return select(b, a, a < b);
}
"""

#: WGSL max/min of 64-bit integer pairs (needs ``INT64_WGSL``).
MINMAX64_WGSL = """
fn max64s(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(a, b, less64s(a, b)); }
fn min64s(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(a, b, less64s(b, a)); }
fn max64u(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(a, b, less64u(a, b)); }
fn min64u(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(a, b, less64u(b, a)); }
"""


def _fold(function: str, count: int) -> str:
    """``function(function(x0, x1), x2) ...`` over ``count`` operands (``x0`` alone for one)."""
    expression = "x0"
    for slot in range(1, count):
        expression = f"{function}({expression}, x{slot})"
    return expression


class VariadicOperator(Operator):
    """An elementwise operator of 1..N inputs of one dtype, broadcast numpy-style (from opset 8)."""

    #: dtype kinds the reference accepts ("f": floats only, "fiu": also integers).
    kinds = "f"

    def accumulate(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """The left-to-right fold of broadcastable arrays (floats in the accumulation dtype)."""
        raise NotImplementedError

    def finish(self, total: np.ndarray, count: int) -> np.ndarray:
        """The result from the fold of all ``count`` inputs (Mean divides)."""
        return total

    def combine(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """The result of the (already broadcastable, same-dtype) inputs."""
        return self.finish(self.accumulate(arrays), len(arrays))

    def accumulation_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        """The dtype partial results are kept in between chained kernels."""
        return dtype

    def expression(self, dtype: np.dtype[Any], count: int, total: int | None) -> tuple[str, str]:
        """(WGSL expression over ``x0 .. x<count-1>``, helpers) for a device dtype; ``total``: the number of
        inputs of the whole node when this kernel gives the final result (None for a partial result)."""
        raise NotImplementedError

    def _check(self, arrays: Sequence[np.ndarray | TensorInfo | None]) -> list[np.ndarray | TensorInfo]:
        present = [a for a in arrays if a is not None]
        if not present:
            raise ShapeError(f"{self.op_type} (opset {self.opset}) needs at least one input")
        dtype = present[0].dtype
        for a in present:
            if a.dtype != dtype:
                raise UnsupportedOpError(
                    f"{self.op_type} (opset {self.opset}): inputs of different dtypes {dtype} and {a.dtype}"
                )
        if dtype.kind not in self.kinds:
            raise UnsupportedOpError(f"{self.op_type} (opset {self.opset}) does not support dtype {dtype.name}")
        shapes = [tuple(a.shape) for a in present]
        if self.opset < 8 and any(s != shapes[0] for s in shapes):
            raise ShapeError(
                f"{self.op_type} (opset {self.opset}): inputs must have one shape before opset 8: {shapes}"
            )
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            raise ShapeError(f"{self.op_type} (opset {self.opset}): shapes {shapes} do not broadcast") from None
        return present

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        present = self._check(inputs)
        arrays = [np.asarray(a) for a in present]
        shape = np.broadcast_shapes(*[a.shape for a in arrays])
        with np.errstate(all="ignore"):
            result = self.combine(arrays)
        return [np.ascontiguousarray(np.broadcast_to(np.asarray(result, dtype=arrays[0].dtype), shape))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        self._check(inputs)
        indices = [i for i, info in enumerate(inputs) if info is not None]
        dtype = outputs[0].dtype
        pair = dtype.name in _PAIRS
        allowed = _FLOATS + (_NARROW_INTS + _PAIRS if "i" in self.kinds else ())
        require_device_dtype(self.op_type, dtype, allowed)
        if outputs[0].size == 0:
            return OpPlan()
        operands = []
        for i in indices:
            info = inputs[i]
            assert info is not None
            operands.append(Operand(i, info, int64_pair=pair))
        limit = caps.limits.max_storage_buffers_per_shader_stage
        if len(operands) + 1 <= limit:
            expression, helpers = self.expression(dtype, len(operands), len(operands))

            def function(*arrays: np.ndarray) -> np.ndarray:
                return self.reference(list(arrays), attrs, outputs)[0]

            return elementwise_plan(
                self.op_type, operands, outputs, expression, caps, function, inputs, helpers=helpers, pair_output=pair
            )
        if limit < 3:
            raise NotOnDevice(f"{self.op_type}: the device binds only {limit} storage buffers per kernel")
        return self._chained_plan(operands, outputs[0], caps, pair, limit)

    def _chained_plan(
        self, operands: list[Operand], output: TensorInfo, caps: DeviceCaps, pair: bool, limit: int
    ) -> OpPlan:
        """More inputs than one kernel binds: kernels folding groups into a partial result (two scratch
        buffers, used in turn), each starting from the previous one's, in the node's left-to-right order."""
        partial = TensorInfo(output.shape, self.accumulation_dtype(output.dtype))
        groups = [operands[: limit - 1]]
        rest = operands[limit - 1 :]
        while rest:
            groups.append(rest[: limit - 2])
            rest = rest[limit - 2 :]
        kernels = []
        for number, group in enumerate(groups):
            final = number == len(groups) - 1
            infos = ([partial] if number else []) + [operand.info for operand in group]
            sources = ([Binding("scratch", (number - 1) % 2)] if number else []) + [
                Binding("input", operand.input_index) for operand in group
            ]
            kernel_operands = [Operand(-1, partial, int64_pair=pair)] if number else []
            kernel_operands += group
            target = output if final else partial
            destination = Binding("output", 0) if final else Binding("scratch", number % 2)
            expression, helpers = self.expression(target.dtype, len(infos), len(operands) if final else None)
            twin = self._chain_twin(infos, target, len(operands) if final else None)
            kernel = elementwise_kernel(
                self.op_type, kernel_operands, target, expression, caps, twin, helpers=helpers, pair_output=pair
            )
            kernels.append(replace(kernel, bindings=tuple(sources) + (destination,)))
        size = partial.nbytes
        return OpPlan(kernels=tuple(kernels), scratch_sizes=(size, size) if len(groups) > 2 else (size,))

    def _chain_twin(self, infos: list[TensorInfo], target: TensorInfo, total: int | None) -> KernelTwin:
        """The numpy twin of one chained kernel: fold the bound arrays, finish when ``total`` is given."""

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            views = [
                arrays[slot][: info.nbytes].view(info.dtype).reshape(info.shape) for slot, info in enumerate(infos)
            ]
            with np.errstate(all="ignore"):
                result = self.accumulate(views)
                if total is not None:
                    result = self.finish(result, total)
            value = np.ascontiguousarray(np.broadcast_to(np.asarray(result, dtype=target.dtype), target.shape))
            arrays[len(infos)][: target.nbytes] = value.reshape(-1).view(np.uint8)

        return twin


class _MinMax(VariadicOperator):
    kinds = "fiu"
    #: "max" or "min"
    which = ""

    def accumulate(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        ufunc = np.maximum if self.which == "max" else np.minimum
        result = arrays[0]
        for a in arrays[1:]:
            result = ufunc(result, a)  # propagates NaN
        return result

    def expression(self, dtype: np.dtype[Any], count: int, total: int | None) -> tuple[str, str]:
        if dtype.kind == "f":
            return _fold(f"{self.which}_f32", count), MINMAX_WGSL
        if dtype.name in _PAIRS:
            suffix = "s" if dtype.name == "int64" else "u"
            return _fold(f"{self.which}64{suffix}", count), INT64_WGSL + MINMAX64_WGSL
        return _fold(self.which, count), ""


@register
class Max(_MinMax):
    op_type = "Max"
    since_version = 1
    opset_changes = (8,)
    which = "max"


@register
class Min(_MinMax):
    op_type = "Min"
    since_version = 1
    opset_changes = (8,)
    which = "min"


def _float_sum(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Left-to-right sum; float16 accumulates in float32 (as the device does), rounded by the caller."""
    wide = np.float32 if arrays[0].dtype == np.float16 else arrays[0].dtype
    result = arrays[0].astype(wide)
    for a in arrays[1:]:
        result = result + a.astype(wide)
    return result


class _Sum(VariadicOperator):
    def accumulate(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        return _float_sum(arrays)

    def accumulation_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return np.dtype(np.float32) if dtype == np.float16 else dtype

    def expression(self, dtype: np.dtype[Any], count: int, total: int | None) -> tuple[str, str]:
        return " + ".join(f"x{slot}" for slot in range(count)), ""


@register
class Sum(_Sum):
    op_type = "Sum"
    since_version = 1
    opset_changes = (8,)


@register
class Mean(_Sum):
    op_type = "Mean"
    since_version = 1
    opset_changes = (8,)

    def finish(self, total: np.ndarray, count: int) -> np.ndarray:
        return np.asarray(total / np.asarray(count, dtype=total.dtype))

    def expression(self, dtype: np.dtype[Any], count: int, total: int | None) -> tuple[str, str]:
        text = " + ".join(f"x{slot}" for slot in range(count))
        return (text, "") if total is None else (f"({text}) / {wgsl_float(total)}", "")
