"""The fused epilogue: elementwise steps a producer (MatMul, Gemm, Conv) applies to each output before storing it.

The planner (:mod:`ortgpu._rewrites`) writes them as the ``_epilogue`` attribute (see :mod:`ortgpu.ops.ai_onnx.matmul`
for the contract); :func:`parse_epilogue` checks it, :func:`apply_epilogue` is its numpy twin and
:func:`epilogue_function` its WGSL.  The erf GELU needs an erf: :func:`erf` (numpy) and its WGSL twin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ._kernel import Binding
from ._tiling import BindingTable, broadcast_strides, index_function, wgsl_f32

__all__ = [
    "EpilogueStep",
    "parse_epilogue",
    "apply_epilogue",
    "epilogue_function",
    "erf",
    "gelu_numpy",
    "TANH_WGSL",
    "GELU_WGSL",
]


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


def gelu_numpy(x: np.ndarray) -> np.ndarray:
    """The erf GELU ``0.5 x (1 + erf(x / sqrt 2))`` in float64, through erfc for negative x (no cancellation)."""
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


#: WGSL ``fn tanh_f32(x: f32) -> f32``: ``-expm1(-2a) / (2 + expm1(-2a))`` for ``a = min(|x|, 10)`` (tanh(10)
#: rounds to 1 in f32), with expm1 as its series above -0.5, so small |x| keep their relative precision (the
#: built-in lost it on lavapipe: 19% error at 1e-7) and large |x| never divide overflowed exponentials.
#: NaN is returned as NaN (tested on the bits).
TANH_WGSL = """
fn tanh_f32(x: f32) -> f32 {
  if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) { return x; }
  let y = -2.0 * min(abs(x), 10.0);
  var e = exp(y) - 1.0;
  if (y > -0.5) {
    e = y * (1.0 + y * (0.5 + y * (1.0 / 6.0 + y * (1.0 / 24.0 + y * (1.0 / 120.0 + y * (1.0 / 720.0
        + y * (1.0 / 5040.0 + y * (1.0 / 40320.0 + y * (1.0 / 362880.0)))))))));
  }
  let t = -e / (2.0 + e);
  return select(t, -t, x < 0.0);
}
"""

#: WGSL ``fn gelu(x: f32) -> f32`` (the erf form through ``erfc``, without cancellation for negative x) and its
#: helper ``erfc_nonnegative``: the epilogue's, and the elementwise kernels' of the contributed Gelu operators.
GELU_WGSL = _erfc_wgsl()


# -- the fused epilogue ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpilogueStep:
    """One step applied to each output element before the store.

    ``kind``: ``"scale"`` (multiply by ``value``), ``"shift"`` (add ``value``), ``"add"`` (add ``value`` times
    input ``input_index``, read as ``view_shape`` and broadcast to the output), ``"relu"``, ``"gelu"``, ``"clip"``
    (``low``, ``high``; infinite bounds are omitted), ``"sigmoid"``, ``"tanh"`` or ``"leaky_relu"`` (negative
    values times ``value``).  The last two and ``"shift"`` serve the activations of onnxruntime's FusedConv
    (HardSigmoid is ``scale``, ``shift``, ``clip``).
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
        elif kind in ("relu", "gelu", "sigmoid", "tanh"):
            if len(entry) != 1:
                raise UnsupportedOpError(f"{op_type}: _epilogue step ({kind!r},) takes no arguments, got {entry!r}")
            steps.append(EpilogueStep(kind))
        elif kind in ("scale", "shift", "leaky_relu"):
            if len(entry) != 2:
                raise UnsupportedOpError(f"{op_type}: _epilogue step ({kind!r}, c) takes one constant, got {entry!r}")
            factor = float(np.float32(entry[1]))
            if not math.isfinite(factor):
                raise UnsupportedOpError(
                    f"{op_type}: _epilogue ({kind!r}, c) needs a finite float32 constant, got {entry[1]!r}"
                )
            steps.append(EpilogueStep(kind, value=factor))
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
            y = gelu_numpy(y).astype(out_dtype)
        elif step.kind == "clip":
            if step.low > -math.inf:
                y = np.maximum(y, np.asarray(step.low, dtype=out_dtype))
            if step.high < math.inf:
                y = np.minimum(y, np.asarray(step.high, dtype=out_dtype))
        elif step.kind == "sigmoid":
            y = (1.0 / (1.0 + np.exp(-y.astype(np.float64)))).astype(out_dtype)
        elif step.kind == "shift":
            y = y + np.asarray(step.value, dtype=out_dtype)
        elif step.kind == "tanh":
            y = np.tanh(y)
        elif step.kind == "leaky_relu":
            y = np.where(y >= 0, y, y * np.asarray(step.value, dtype=out_dtype))
        else:  # pragma: no cover - parse_epilogue rejects these
            raise ValueError(step.kind)
    return np.asarray(y, dtype=out_dtype)


def epilogue_function(
    steps: Sequence[EpilogueStep], out_shape: tuple[int, ...], table: BindingTable, element: str = "f32"
) -> str:
    """WGSL ``fn epilogue(v: f32, o: u32) -> element`` (``o``: the linear output index; ``element``: the output's
    storage type, f32 or f16, which the inputs ``add`` steps read share) and its helpers; binds those inputs.
    The steps compute in f32; the result is converted once, at the end."""
    helpers: list[str] = []
    body = ["    var x = v;"]
    need_gelu = need_tanh = False
    for number, step in enumerate(steps):
        if step.kind == "scale":
            body.append(f"    x = x * {wgsl_f32(step.value)};")
        elif step.kind == "add":
            name = table.add(Binding("input", step.input_index), element)
            index_name = f"epilogue_index_{number}"
            helpers.append(index_function(index_name, out_shape, broadcast_strides(step.view_shape, out_shape)))
            term = f"{name}[{index_name}(o)]" if element == "f32" else f"f32({name}[{index_name}(o)])"
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
        elif step.kind == "shift":
            body.append(f"    x = x + {wgsl_f32(step.value)};")
        elif step.kind == "tanh":
            need_tanh = True
            body.append("    x = tanh_f32(x);")
        elif step.kind == "leaky_relu":
            body.append(f"    x = select(x * {wgsl_f32(step.value)}, x, x >= 0.0);")
    if need_gelu:
        helpers.append(GELU_WGSL)
    if need_tanh:
        helpers.append(TANH_WGSL)  # the operators' tanh: the built-in loses relative precision near 0 on some drivers
    body.append("    return x;" if element == "f32" else f"    return {element}(x);")
    return "".join(helpers) + f"fn epilogue(v: f32, o: u32) -> {element} {{\n" + "\n".join(body) + "\n}\n"
