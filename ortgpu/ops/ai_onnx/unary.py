"""Unary elementwise math: Sqrt Exp Log Neg Abs Reciprocal Relu LeakyRelu Sigmoid Tanh Erf Gelu
HardSigmoid HardSwish.

The operators are rows of one table (:data:`UNARY_OPERATORS`): each row pairs a numpy reference with a WGSL
expression in ``x0`` (the input in its compute type, f32 for float32/float16) for
:func:`~ortgpu.ops._wgsl_kernels.elementwise_kernel`, and states the opset the operator starts at; one class per row
is made from :class:`TableUnary` and registered.  Adding such an operator is adding a row (and its test).  Floating
ops run on device for float32 and float16 (computed in f32); Neg, Abs and Relu also for every integer type (int64
exactly, on ``vec2<u32>`` pairs).

:class:`UnaryOperator` is the base of every one-input elementwise operator, including the families of
:mod:`~ortgpu.ops.ai_onnx.trigonometric` and :mod:`~ortgpu.ops.ai_onnx.activations`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ..._types import is_float_dtype
from .._epilogue import GELU_WGSL, TANH_WGSL, gelu_numpy
from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register_row
from .._wgsl import INT64_WGSL, require_device_dtype, wgsl_float
from .._wgsl_kernels import Operand, elementwise_kernel, kernel_bindings

__all__ = [
    "UnaryOperator",
    "UnaryRow",
    "TableUnary",
    "UNARY_OPERATORS",
    "ERF_WGSL",
    "SIGMOID_WGSL",
    "TANH_WGSL",
    "erf_numpy",
    "LOG_WGSL",
    "sigmoid_numpy",
]

_FLOATS = ("float32", "float16", "bfloat16")
_FLOATS_AND_INTS = ("float32", "float16", "bfloat16", "int32", "int16", "int8", "uint32", "uint16", "uint8", "int64")

#: WGSL ``fn erf_f32(x: f32) -> f32`` (WGSL has no erf).  For |x| < 0.5 the
#: Maclaurin series to x^13 (truncation below 2e-8 relative); beyond,
#: Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7), odd in x.
ERF_WGSL = """
fn erf_f32(x: f32) -> f32 {
  let a = abs(x);
  if (a < 0.5) {
    let z = x * x;
    let series = 1.0 + z * (-1.0 / 3.0 + z * (1.0 / 10.0 + z * (-1.0 / 42.0 + z * (1.0 / 216.0
        + z * (-1.0 / 1320.0 + z * (1.0 / 9360.0))))));
    return 1.1283791670955126 * x * series;
  }
  if (a >= 4.0) {
    return sign(x);
  }
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  return sign(x) * (1.0 - poly * exp(-a * a));
}
"""


#: WGSL ``fn log_f32(x: f32) -> f32``: the built-in ``log`` keeps an absolute error (about 1e-7 on lavapipe, worse
#: where it is a base-2 approximation), which near 1, where the result is tiny, is a large relative one (5% at
#: 1 - 2e-6); there ``x - 1`` is exact and ``2 atanh(u / (2 + u))`` as its odd series keeps the relative precision.
#: Elsewhere, and for 0, negatives, infinities and NaN, the built-in.
LOG_WGSL = """
fn log_f32(x: f32) -> f32 {
  let u = x - 1.0;
  if (abs(u) < 0.0625) {
    let s = u / (2.0 + u);
    let s2 = s * s;
    return 2.0 * s * (1.0 + s2 * (1.0 / 3.0 + s2 * (1.0 / 5.0 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0)))));
  }
  return log(x);
}
"""

#: WGSL ``fn sigmoid_f32(x: f32) -> f32``, never dividing by an overflowed exp.
SIGMOID_WGSL = """
fn sigmoid_f32(x: f32) -> f32 {
  let e = exp(-abs(x));
  return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}
"""


def erf_numpy(x: np.ndarray) -> np.ndarray:
    """Elementwise erf in the dtype of ``x`` (numpy has none; math.erf in float64)."""
    erf = np.frompyfunc(math.erf, 1, 1)
    return np.asarray(erf(np.asarray(x, dtype=np.float64)), dtype=np.float64).astype(x.dtype)


class UnaryOperator(Operator):
    """An elementwise operator of one input; subclasses give ``compute`` and ``expression``."""

    #: dtype names the WGSL kernel accepts.
    device_dtypes: tuple[str, ...] = _FLOATS
    #: WGSL helper functions the expression calls.
    helpers: str = ""

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def pair_expression(self) -> str:
        """The expression on an int64 ``x0`` read as ``vec2<u32>`` (see ``INT64_WGSL``); empty: no kernel."""
        return ""

    def check_attrs(self, attrs: Mapping[str, Any]) -> None:
        """Raise :class:`UnsupportedOpError` for attribute values this implementation lacks."""

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        self.check_attrs(attrs)
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fiub":
            raise UnsupportedOpError(f"{self.op_type} (opset {self.opset}) does not support dtype {x.dtype.name}")
        return [np.asarray(self.compute(x, attrs), dtype=x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        self.check_attrs(attrs)
        x = inputs[0]
        assert x is not None
        require_device_dtype(self.op_type, x.dtype, self.device_dtypes)
        if outputs[0].size == 0:
            return OpPlan()
        pair = x.dtype.itemsize == 8
        if pair and not self.pair_expression():
            raise NotOnDevice(f"{self.op_type} on {x.dtype.name} runs on the CPU: no 64-bit WebGPU kernel")
        operands = [Operand(0, x, int64_pair=pair)]

        def function(array: np.ndarray) -> np.ndarray:
            return self.reference([array], attrs, outputs)[0]

        kernel = elementwise_kernel(
            self.op_type,
            operands,
            outputs[0],
            self.pair_expression() if pair else self.expression(x.dtype, attrs),
            caps,
            reference_twin(function, kernel_bindings(1), inputs, outputs),
            helpers=INT64_WGSL if pair else self.helpers,
            pair_output=pair,
        )
        return OpPlan(kernels=(kernel,))


def _float(attrs: Mapping[str, Any], name: str, default: float) -> float:
    value = attrs.get(name, default)
    return float(value)


def _approximate(attrs: Mapping[str, Any]) -> str:
    value = attrs.get("approximate", "none")
    return value.decode() if isinstance(value, bytes) else str(value)


#: A numpy reference of a unary row: ``(x, attrs) -> values`` (cast to ``x``'s dtype by the caller).
UnaryNumpy = Callable[[np.ndarray, Mapping[str, Any]], Any]
#: A WGSL expression in ``x0`` for the input's dtype and the node's attributes.
UnaryWgsl = Callable[[np.dtype[Any], Mapping[str, Any]], str]


@dataclass(frozen=True)
class UnaryRow:
    """One unary operator of :data:`UNARY_OPERATORS`.

    Attributes
    ----------
    op_type, since_version
        The operator and the ai.onnx opset this implementation starts at (the registry picks it for models
        importing that opset or later, until a row or class with a later ``since_version``).
    numpy
        The reference, ``(x, attrs) -> values``.
    wgsl
        The WGSL expression in ``x0``: a string, or ``(dtype, attrs) -> str`` where it depends on them.
    device_dtypes
        The dtype names the WGSL kernel accepts.
    helpers
        WGSL functions the expression calls.
    int64_wgsl
        The expression on an int64 ``x0`` read as ``vec2<u32>`` (see ``INT64_WGSL``); empty: no 64-bit kernel.
    attribute_problem
        ``attrs -> message`` for attribute values this implementation lacks (``None``: all are supported).
    """

    op_type: str
    since_version: int
    numpy: UnaryNumpy
    wgsl: str | UnaryWgsl
    device_dtypes: tuple[str, ...] = _FLOATS
    helpers: str = ""
    int64_wgsl: str = ""
    attribute_problem: Callable[[Mapping[str, Any]], str | None] | None = None


class TableUnary(UnaryOperator):
    """The operator of one :class:`UnaryRow`: each row's registered class is this one with ``row`` set."""

    row: ClassVar[UnaryRow]

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return self.row.numpy(x, attrs)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        wgsl = self.row.wgsl
        return wgsl if isinstance(wgsl, str) else wgsl(dtype, attrs)

    def pair_expression(self) -> str:
        return self.row.int64_wgsl

    def check_attrs(self, attrs: Mapping[str, Any]) -> None:
        problem = self.row.attribute_problem(attrs) if self.row.attribute_problem else None
        if problem:
            raise UnsupportedOpError(f"{self.op_type} (opset {self.opset}): {problem}")


def _quiet(ufunc: Callable[[np.ndarray], Any], **ignored: str) -> UnaryNumpy:
    """``ufunc`` as a row's reference, with the floating-point warnings in ``ignored`` silenced (NaN and
    infinity are the specified results there, not mistakes)."""

    def compute(x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        with np.errstate(**ignored):  # type: ignore[arg-type]
            return ufunc(x)

    return compute


def _neg_wgsl(dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
    # 0 - x wraps for i32::MIN as numpy does (unary minus on the literal would not be the point).
    if is_float_dtype(dtype):
        return "-x0"
    return "0u - x0" if dtype.kind == "u" else "bitcast<i32>(0u - bitcast<u32>(x0))"


def _relu_wgsl(dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
    if is_float_dtype(dtype):
        return "max(x0, 0.0)"
    return "x0" if dtype.kind == "u" else "max(x0, 0)"


def _leaky_relu(x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
    alpha = np.asarray(_float(attrs, "alpha", 0.01), dtype=x.dtype)
    return np.where(x >= 0, x, x * alpha)


def sigmoid_numpy(x: np.ndarray) -> Any:
    """``1 / (1 + exp(-x))`` in x's dtype, as ``e / (1 + e)`` for negative x (never an overflowed exp)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _sigmoid(x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
    return sigmoid_numpy(x)


def _gelu(x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
    wide = x.astype(np.float64)
    if _approximate(attrs) == "tanh":  # 0.5 (1 + tanh z) as sigmoid(2 z), without cancellation for negative x
        return wide * sigmoid_numpy(2.0 * math.sqrt(2.0 / math.pi) * (wide + 0.044715 * wide**3))
    return gelu_numpy(wide)


def _gelu_wgsl(dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
    # Both forms without the cancellation of 1 + erf / 1 + tanh for negative x (which left no correct digit below
    # x = -5): the erf form through erfc (the epilogue's gelu), the tanh form as x * sigmoid(2 z).
    if _approximate(attrs) == "tanh":
        return "x0 * sigmoid_f32(1.5957691216057308 * (x0 + 0.044715 * x0 * x0 * x0))"
    return "gelu(x0)"


def _gelu_problem(attrs: Mapping[str, Any]) -> str | None:
    """Gelu (opset 20) has ``approximate="none"`` (erf form) or ``"tanh"``."""
    approximate = _approximate(attrs)
    return None if approximate in ("none", "tanh") else f"approximate={approximate!r} is not supported"


def _hard_sigmoid(x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
    alpha = np.asarray(_float(attrs, "alpha", 0.2), dtype=x.dtype)
    beta = np.asarray(_float(attrs, "beta", 0.5), dtype=x.dtype)
    return np.clip(x * alpha + beta, 0, 1)


def _hard_sigmoid_wgsl(dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
    alpha = wgsl_float(_float(attrs, "alpha", 0.2))
    beta = wgsl_float(_float(attrs, "beta", 0.5))
    return f"clamp(x0 * {alpha} + {beta}, 0.0, 1.0)"


def _hard_swish(x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
    return x * np.clip((x + np.asarray(3.0, dtype=x.dtype)) * np.asarray(1.0 / 6.0, dtype=x.dtype), 0, 1)


#: The unary operators: one row each (op type, first opset, numpy reference, WGSL expression, and what differs).
UNARY_OPERATORS: tuple[UnaryRow, ...] = (
    UnaryRow("Sqrt", 1, _quiet(np.sqrt, invalid="ignore"), "sqrt(x0)"),
    UnaryRow("Exp", 1, _quiet(np.exp, over="ignore"), "exp(x0)"),
    UnaryRow("Log", 1, _quiet(np.log, invalid="ignore", divide="ignore"), "log_f32(x0)", helpers=LOG_WGSL),
    UnaryRow("Neg", 1, lambda x, attrs: np.negative(x), _neg_wgsl, _FLOATS_AND_INTS, int64_wgsl="neg64(x0)"),
    UnaryRow("Abs", 1, lambda x, attrs: np.abs(x), "abs(x0)", _FLOATS_AND_INTS, int64_wgsl="abs64(x0)"),
    UnaryRow("Reciprocal", 1, _quiet(np.reciprocal, divide="ignore"), "1.0 / x0"),
    UnaryRow(
        "Relu",
        1,
        lambda x, attrs: np.maximum(x, np.zeros((), dtype=x.dtype)),
        _relu_wgsl,
        _FLOATS_AND_INTS,
        int64_wgsl="select(x0, vec2<u32>(0u, 0u), is_negative64(x0))",
    ),
    UnaryRow(
        "LeakyRelu",
        1,
        _leaky_relu,
        lambda dtype, attrs: f"select(x0 * {wgsl_float(_float(attrs, 'alpha', 0.01))}, x0, x0 >= 0.0)",
    ),
    UnaryRow("Sigmoid", 1, _sigmoid, "sigmoid_f32(x0)", helpers=SIGMOID_WGSL),
    UnaryRow("Tanh", 1, lambda x, attrs: np.tanh(x), "tanh_f32(x0)", helpers=TANH_WGSL),
    UnaryRow("Erf", 9, lambda x, attrs: erf_numpy(x), "erf_f32(x0)", helpers=ERF_WGSL),
    UnaryRow("Gelu", 20, _gelu, _gelu_wgsl, helpers=GELU_WGSL + SIGMOID_WGSL, attribute_problem=_gelu_problem),
    UnaryRow("HardSigmoid", 1, _hard_sigmoid, _hard_sigmoid_wgsl),
    UnaryRow(
        # (x + 3) / 6 rather than x / 6 + 0.5: exact near x = -3, where the factor is tiny
        "HardSwish",
        14,
        _hard_swish,
        lambda dtype, attrs: f"x0 * clamp((x0 + 3.0) * {wgsl_float(1.0 / 6.0)}, 0.0, 1.0)",
    ),
)

for _row in UNARY_OPERATORS:
    register_row(
        TableUnary,
        __name__,
        _row.op_type,
        _row.since_version,
        row=_row,
        device_dtypes=_row.device_dtypes,
        helpers=_row.helpers,
    )
