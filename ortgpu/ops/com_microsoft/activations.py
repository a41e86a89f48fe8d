"""onnxruntime's contributed activations: Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd and BiasSplitGelu.

Each is an elementwise function of its inputs with numpy broadcasting (the bias inputs are 1-D over the last axis),
so all but BiasSplitGelu are planned as the standard elementwise operators are
(:func:`~ortgpu.ops._wgsl_kernels.elementwise_plan`): one kernel that the planner may fuse with its elementwise
neighbours.  BiasSplitGelu reads two halves of each row, which no broadcast expresses, so it has a kernel of its own
(one invocation per output element).  On the device: float32 and float16, computed in f32 and rounded once (as
onnxruntime computes float16); float64 and bfloat16 run on the CPU.

The references compute in float64 and round once.  The WGSL erf GELU is the fused epilogue's
(:data:`~ortgpu.ops._epilogue.GELU_WGSL`, through ``erfc`` so that negative inputs keep their relative precision),
tanh and sigmoid are the standard operators' (:data:`~ortgpu.ops.ai_onnx.unary.TANH_WGSL`, ``SIGMOID_WGSL``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import computable, element_count, is_float_dtype
from .._epilogue import GELU_WGSL, gelu_numpy
from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._tiling import THREADS, BindingTable, grid_for_groups, require_float, single_kernel_plan, workgroup_index
from .._wgsl import require_device_dtype, wgsl_float
from .._wgsl_kernels import Operand, elementwise_plan
from ..ai_onnx.unary import SIGMOID_WGSL, sigmoid_numpy

__all__ = ["Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd", "BiasSplitGelu"]

_DEVICE_DTYPES = ("float32", "float16")
#: sqrt(2 / pi) and 0.044715 * sqrt(2 / pi): FastGelu's tanh argument is ``x * (A + B * x * x)``.
_FAST_A = math.sqrt(2.0 / math.pi)
_FAST_B = 0.044715 * math.sqrt(2.0 / math.pi)


def _fast_gelu_numpy(x: np.ndarray) -> np.ndarray:
    wide = np.asarray(x, dtype=np.float64)
    result: np.ndarray = wide * sigmoid_numpy(2.0 * wide * (_FAST_A + _FAST_B * wide * wide))  # 0.5 (1 + tanh z)
    return result


def _last_axis_bias(op_type: str, x: tuple[int, ...], bias: tuple[int, ...], name: str = "bias") -> None:
    """The bias of the Bias* operators: 1-D, as long as the input's last axis."""
    if len(x) < 1 or len(bias) != 1 or bias[0] != x[-1]:
        raise ShapeError(
            f"{op_type}: {name} must be 1-D with the input's last dimension ({x[-1] if x else '?'}), got shape "
            f"{list(bias)} for an input of shape {list(x)}"
        )


class ContribElementwise(Operator):
    """A contributed operator computing one float output elementwise from its inputs (broadcast numpy-style).

    Subclasses give ``arity`` (required, total), :meth:`check_shapes`, :meth:`compute` (float64 arrays of the present
    inputs) and :meth:`expression` (WGSL over ``x0, x1, ...``, the present inputs in order, in f32).
    """

    domain = "com.microsoft"
    since_version = 1
    #: (required inputs, all inputs)
    arity: ClassVar[tuple[int, int]] = (1, 1)
    #: WGSL functions :meth:`expression` calls.
    helpers: ClassVar[str] = ""

    def check_shapes(self, shapes: Sequence[tuple[int, ...]]) -> None:
        """Raise :class:`ShapeError` for input shapes onnxruntime refuses (the present inputs, in order)."""

    def compute(self, values: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
        raise NotImplementedError

    def expression(self, count: int, attrs: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def _present(self, inputs: Sequence[Any]) -> list[Any]:
        required, total = self.arity
        if len(inputs) < required or len(inputs) > total or any(x is None for x in inputs[:required]):
            raise UnsupportedOpError(
                f"{self.op_type} (com.microsoft): takes {required} to {total} inputs, the first {required} required; "
                f"got {len(inputs)}"
            )
        present = [x for x in inputs if x is not None]
        dtypes = {x.dtype for x in present}
        if len(dtypes) != 1 or not is_float_dtype(present[0].dtype):
            names = ", ".join(sorted(str(d) for d in dtypes))
            raise UnsupportedOpError(
                f"{self.op_type} (com.microsoft): inputs must share one float dtype (float32, float16, float64, "
                f"bfloat16), got {names}"
            )
        self.check_shapes([tuple(x.shape) for x in present])
        return present

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        present = self._present(inputs)
        wide = [np.asarray(computable(x), dtype=np.float64) for x in present]
        with np.errstate(all="ignore"):
            return [np.asarray(self.compute(wide, attrs)).astype(present[0].dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        present = self._present(inputs)
        require_device_dtype(self.op_type, present[0].dtype, _DEVICE_DTYPES)
        operands = [Operand(index, info) for index, info in enumerate(inputs) if info is not None]

        def function(*arrays: np.ndarray) -> np.ndarray:
            full: list[np.ndarray | None] = [None] * len(inputs)
            for operand, array in zip(operands, arrays):
                full[operand.input_index] = array
            return self.reference(full, attrs, outputs)[0]

        return elementwise_plan(
            self.op_type,
            operands,
            outputs,
            self.expression(len(operands), attrs),
            caps,
            function,
            inputs,
            helpers=self.helpers,
        )


@register
class Gelu(ContribElementwise):
    """Gelu (com.microsoft): the erf GELU, ``0.5 x (1 + erf(x / sqrt 2))``."""

    op_type = "Gelu"
    helpers = GELU_WGSL

    def compute(self, values: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
        return gelu_numpy(values[0])

    def expression(self, count: int, attrs: Mapping[str, Any]) -> str:
        return "gelu(x0)"


@register
class BiasGelu(ContribElementwise):
    """BiasGelu: the erf GELU of ``A + B``, B a 1-D bias over A's last axis."""

    op_type = "BiasGelu"
    arity = (2, 2)
    helpers = GELU_WGSL

    def check_shapes(self, shapes: Sequence[tuple[int, ...]]) -> None:
        _last_axis_bias(self.op_type, shapes[0], shapes[1], "B")

    def compute(self, values: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
        return gelu_numpy(values[0] + values[1])

    def expression(self, count: int, attrs: Mapping[str, Any]) -> str:
        return "gelu(x0 + x1)"


@register
class FastGelu(ContribElementwise):
    """FastGelu: the tanh GELU ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` of ``X`` (plus the optional 1-D
    bias over its last axis)."""

    op_type = "FastGelu"
    arity = (1, 2)
    helpers = SIGMOID_WGSL

    def check_shapes(self, shapes: Sequence[tuple[int, ...]]) -> None:
        if len(shapes) == 2:
            _last_axis_bias(self.op_type, shapes[0], shapes[1])

    def compute(self, values: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
        return _fast_gelu_numpy(values[0] + values[1] if len(values) == 2 else values[0])

    def expression(self, count: int, attrs: Mapping[str, Any]) -> str:
        x = "(x0 + x1)" if count == 2 else "x0"
        # 0.5 (1 + tanh z) = sigmoid(2 z): no cancellation for negative x
        return f"{x} * sigmoid_f32({x} * ({wgsl_float(2 * _FAST_A)} + {wgsl_float(2 * _FAST_B)} * {x} * {x}))"


def _alpha(attrs: Mapping[str, Any]) -> float:
    return float(np.float32(attrs.get("alpha", 1.702)))


@register
class QuickGelu(ContribElementwise):
    """QuickGelu: ``x * sigmoid(alpha * x)`` (alpha 1.702 by default)."""

    op_type = "QuickGelu"
    helpers = SIGMOID_WGSL

    def compute(self, values: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
        result: np.ndarray = values[0] * sigmoid_numpy(_alpha(attrs) * values[0])
        return result

    def expression(self, count: int, attrs: Mapping[str, Any]) -> str:
        return f"x0 * sigmoid_f32({wgsl_float(_alpha(attrs))} * x0)"


@register
class BiasAdd(ContribElementwise):
    """BiasAdd: ``X + bias + skip``, X and skip of shape (N, S, C), bias (C)."""

    op_type = "BiasAdd"
    arity = (3, 3)

    def check_shapes(self, shapes: Sequence[tuple[int, ...]]) -> None:
        x, bias, skip = shapes
        if len(x) != 3:
            raise ShapeError(f"BiasAdd: X must be 3-D (N, S, C), got shape {list(x)}")
        _last_axis_bias(self.op_type, x, bias)
        if skip != x:
            raise ShapeError(f"BiasAdd: skip must have X's shape {list(x)}, got {list(skip)}")

    def compute(self, values: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
        result: np.ndarray = values[0] + values[1] + values[2]
        return result

    def expression(self, count: int, attrs: Mapping[str, Any]) -> str:
        return "x0 + x1 + x2"


@register
class BiasSplitGelu(Operator):
    """BiasSplitGelu: ``X + bias`` split in two halves along the last axis, the left half times the erf GELU of the
    right; X (N, S, D) with D even, bias (D), output (N, S, D / 2)."""

    op_type = "BiasSplitGelu"
    domain = "com.microsoft"
    since_version = 1

    def _check(self, inputs: Sequence[Any]) -> tuple[tuple[int, ...], np.dtype[Any]]:
        if len(inputs) != 2 or inputs[0] is None or inputs[1] is None:
            raise UnsupportedOpError("BiasSplitGelu (com.microsoft): takes two inputs, X and bias")
        x, bias = inputs
        if x.dtype != bias.dtype or not is_float_dtype(x.dtype):
            raise UnsupportedOpError(
                f"BiasSplitGelu (com.microsoft): X and bias must share one float dtype, got {x.dtype} and {bias.dtype}"
            )
        shape = tuple(x.shape)
        if len(shape) != 3 or shape[-1] % 2:
            raise ShapeError(f"BiasSplitGelu: X must be 3-D (N, S, D) with an even D, got shape {list(shape)}")
        _last_axis_bias(self.op_type, shape, tuple(bias.shape))
        return shape, x.dtype

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        shape, _ = self._check(inputs)
        return [shape[:-1] + (shape[-1] // 2,)]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        shape, dtype = self._check(inputs)
        x, bias = (np.asarray(computable(value), dtype=np.float64) for value in inputs)
        summed = x + bias
        half = shape[-1] // 2
        with np.errstate(all="ignore"):
            return [(summed[..., :half] * gelu_numpy(summed[..., half:])).astype(dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        shape, dtype = self._check(inputs)
        require_device_dtype(self.op_type, dtype, _DEVICE_DTYPES)
        element = require_float(self.op_type, list(inputs) + list(outputs), caps)
        total = element_count(outputs[0].shape)
        if total == 0:
            return OpPlan()
        half = shape[-1] // 2
        table = BindingTable()
        x = table.add(Binding("input", 0), element)
        bias = table.add(Binding("input", 1), element)
        out = table.add(Binding("output", 0), element, writable=True)
        grid = grid_for_groups(-(-total // THREADS), caps)
        wgsl = f"""{table.enables()}{table.declarations()}
{GELU_WGSL}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let index = {workgroup_index(grid)} * {THREADS}u + li;
    if (index >= {total}u) {{ return; }}
    let c = index % {half}u;
    let left = (index / {half}u) * {2 * half}u + c;
    let a = f32({x}[left]) + f32({bias}[c]);
    let b = f32({x}[left + {half}u]) + f32({bias}[c + {half}u]);
    {out}[index] = {element}(a * gelu(b));
}}
"""
        return single_kernel_plan(
            self.op_type, wgsl, grid, table, lambda full: self.reference(full, attrs, outputs), inputs, outputs, caps
        )
