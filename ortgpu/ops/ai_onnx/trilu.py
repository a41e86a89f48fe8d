"""Trilu: the upper (``upper=1``) or lower triangle of the last two axes, from diagonal ``k``; the rest is zero.

On the device for every dtype of 1, 2, 4 or 8 bytes: each output element is
the input's bits or zero bits (zero is all-zero bits for every numeric dtype).
``k`` (an optional int64 scalar input) is baked into the WGSL when it is a
constant and read at run time otherwise (as 64 bits, saturated to a range
wider than any diagonal, so huge ``k`` keep or clear everything as in numpy).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError

from .._kernel import Binding, DeviceCaps, KernelSpec, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    raw_load_function,
    storage_declaration,
    wgsl_int,
    workgroup_size_for,
)

__all__ = ["Trilu"]

#: |k| beyond this keeps or clears every element of any matrix a binding can hold; saturating to it keeps i32 exact.
_K_LIMIT = 2**30


def trilu(x: np.ndarray, k: int, upper: bool) -> np.ndarray:
    if x.ndim < 2:
        raise ShapeError(f"Trilu: the input has rank {x.ndim}; it needs at least 2")
    k = max(-_K_LIMIT, min(_K_LIMIT, k))
    return np.array(np.triu(x, k) if upper else np.tril(x, k), order="C")


def _k_of(value: np.ndarray | None) -> int:
    if value is None:
        return 0
    if value.size != 1:
        raise ShapeError(f"Trilu: k must be a scalar, got shape {value.shape}")
    return int(np.asarray(value).reshape(-1)[0])


def _k_function(constant: int | None) -> str:
    if constant is not None:
        return f"fn diagonal() -> i32 {{ return {wgsl_int(max(-_K_LIMIT, min(_K_LIMIT, constant)))}; }}\n"
    # k as int64 (low, high): inside int32 when high is the sign extension of low, else saturated.
    return (
        "fn diagonal() -> i32 {\n"
        "  let low = kbuf[0];\n"
        "  let high = kbuf[1];\n"
        "  let small = bitcast<i32>(low);\n"
        f"  if (high == 0u && small >= 0) {{ return min(small, {_K_LIMIT}); }}\n"
        f"  if (high == 0xffffffffu && small < 0) {{ return max(small, -{_K_LIMIT}); }}\n"
        f"  return select({_K_LIMIT}, -{_K_LIMIT}, (high & 0x80000000u) != 0u);\n"
        "}\n"
    )


@register
class Trilu(Operator):
    op_type = "Trilu"
    since_version = 14

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        k = _k_of(inputs[1] if len(inputs) > 1 else None)
        return [trilu(x, k, bool(int(attrs.get("upper", 1))))]

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
        if len(x.shape) < 2:
            raise ShapeError(f"Trilu: the input has rank {len(x.shape)}; it needs at least 2")
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        upper = bool(int(attrs.get("upper", 1)))
        k_info = inputs[1] if len(inputs) > 1 else None
        runtime_k = k_info is not None and 1 not in constants
        constant_k = None if runtime_k else _k_of(constants.get(1))
        if k_info is not None and k_info.size != 1:
            raise ShapeError(f"Trilu: k must be a scalar, got shape {k_info.shape}")
        rows, cols = x.shape[-2], x.shape[-1]
        itemsize = x.dtype.itemsize
        check_binding_sizes("Trilu", [x, out], caps)
        bindings: list[Binding] = [Binding("input", 0)]
        parts = [storage_declaration(0, "src", writable=False), raw_load_function("raw", "src", itemsize)]
        if runtime_k:
            bindings.append(Binding("input", 1))
            parts.append(storage_declaration(1, "kbuf", writable=False))
        parts.append(storage_declaration(len(bindings), "dst", writable=True))
        bindings.append(Binding("output", 0))
        parts.append(_k_function(constant_k))
        comparison = ">=" if upper else "<="
        parts.append(
            "fn value(j: u32) -> vec2<u32> {\n"
            f"  let column = i32(j % {cols}u);\n"
            f"  let row = i32((j / {cols}u) % {rows}u);\n"
            f"  return select(vec2<u32>(0u, 0u), raw(j), column - row {comparison} diagonal());\n"
            "}\n"
        )
        count = out.size
        per = elements_per_invocation(itemsize)
        invocations = -(-count // per)
        if itemsize == 8:
            body = "  let v = value(w);\n  dst[2u * w] = v.x;\n  dst[2u * w + 1u] = v.y;\n"
        elif itemsize == 4:
            body = "  dst[w] = value(w).x;\n"
        else:
            lines = ["  var word = 0u;\n"]
            for e in range(per):
                j = f"(w * {per}u + {e}u)"
                lines.append(f"  if ({j} < {count}u) {{ word = word | (value({j}).x << {e * 8 * itemsize}u); }}\n")
            lines.append("  dst[w] = word;\n")
            body = "".join(lines)
        workgroup = workgroup_size_for(caps.limits)
        guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"

        def function(array: np.ndarray, *k: np.ndarray) -> np.ndarray:
            return trilu(array, _k_of(k[0]) if k else (constant_k or 0), upper)

        kernel = KernelSpec(
            name="Trilu",
            wgsl="".join(parts) + kernel_entry(workgroup, guard + body),
            grid=grid_for(invocations, workgroup, caps.limits),
            bindings=tuple(bindings),
            twin=reference_twin(function, bindings, inputs, outputs),
        )
        return OpPlan(kernels=(kernel,))
