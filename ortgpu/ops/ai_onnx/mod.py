"""Mod (opset 10+): elementwise remainder with numpy broadcasting.

``fmod=0`` (the default) is the integer remainder with the sign of the divisor (Python's ``%``);
``fmod=1`` the remainder with the sign of the dividend (C's ``%`` and ``fmod``).  Floats require
``fmod=1`` before opset 28 (``fmod=0`` on floats is refused there); from opset 28 ``fmod=0`` on floats
is Python's float ``%`` (the C remainder, plus the divisor where the signs differ; a zero takes the
divisor's sign).

Integer division by zero: onnxruntime fails the run ("Integer modulo by zero"); the reference
raises :class:`~ortgpu_core._errors.InvalidArgumentError` likewise.  A device kernel cannot stop a
run, so integer Mod runs on the device only where the divisor is a constant without zeros, and on
the CPU otherwise.  The most negative value modulo -1 is 0, as in onnxruntime.

On the device: every integer type (int64/uint64 exactly, by 64-bit long division on
``vec2<u32>`` pairs) and float32/float16.  Float remainders are exact (as C's ``fmod`` is): WGSL's
float ``%`` is ``x - y * trunc(x / y)``, which rounds, so the kernel reduces the significands in
integer arithmetic instead.  float64 runs on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._wgsl import INT64_WGSL, require_device_dtype
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["Mod", "mod_array", "FMOD_WGSL", "MOD_INT_WGSL", "MOD64_WGSL"]

_DEVICE_DTYPES = (
    "float32",
    "float16",
    "int32",
    "uint32",
    "int16",
    "uint16",
    "int8",
    "uint8",
    "int64",
    "uint64",
)

#: WGSL ``fn fmod_f32(x: f32, y: f32) -> f32``: C's ``fmod``, exactly, on the bits.  A finite
#: ``|x| >= |y| > 0`` is ``mx * 2^ex`` and ``|y|`` is ``my * 2^ey`` (24-bit significands); the
#: remainder is ``(mx * 2^(ex - ey) mod my) * 2^ey``, reduced one doubling at a time (at most 253),
#: then renormalised (subnormal results written directly, never computed in float arithmetic).
FMOD_WGSL = """
fn fmod_f32(x: f32, y: f32) -> f32 {
  let bx = bitcast<u32>(x);
  let by = bitcast<u32>(y);
  let sign = bx & 0x80000000u;
  let ax = bx & 0x7fffffffu;
  let ay = by & 0x7fffffffu;
  if (ax >= 0x7f800000u || ay > 0x7f800000u || ay == 0u) { return bitcast<f32>(0x7fc00000u); }
  if (ay == 0x7f800000u || ax < ay) { return x; }
  var ex = ax >> 23u;
  var mx = ax & 0x7fffffu;
  if (ex == 0u) { ex = 1u; } else { mx = mx | 0x800000u; }
  var ey = ay >> 23u;
  var my = ay & 0x7fffffu;
  if (ey == 0u) { ey = 1u; } else { my = my | 0x800000u; }
  var r = mx % my;
  for (var e = ex; e > ey; e = e - 1u) {
    r = (r << 1u) % my;
  }
  if (r == 0u) { return bitcast<f32>(sign); }
  let shift = min(countLeadingZeros(r) - 8u, ey - 1u);
  r = r << shift;
  let scale = ey - shift;
  if (r >= 0x800000u) { return bitcast<f32>(sign | (scale << 23u) | (r & 0x7fffffu)); }
  return bitcast<f32>(sign | r);
}
// Python's float %: the divisor's sign (a zero result takes it too); adding the divisor rounds, as there.
fn pymod_f32(x: f32, y: f32) -> f32 {
  let r = fmod_f32(x, y);
  let bits = bitcast<u32>(r);
  let y_sign = bitcast<u32>(y) & 0x80000000u;
  if ((bits & 0x7fffffffu) > 0x7f800000u) { return r; }
  if ((bits & 0x7fffffffu) == 0u) { return bitcast<f32>(y_sign); }
  if ((bits & 0x80000000u) != y_sign) { return r + y; }
  return r;
}
"""

#: WGSL remainders of 32-bit (and narrower) integers: C's (``rem_i32``) and Python's (``mod_i32``).
#: WGSL leaves ``i32 % -1`` of the most negative value to the implementation: it is 0 here.
MOD_INT_WGSL = """
fn rem_i32(a: i32, b: i32) -> i32 {
  if (b == -1) { return 0; }
  return a % b;
}
fn mod_i32(a: i32, b: i32) -> i32 {
  let r = rem_i32(a, b);
  return select(r, r + b, r != 0 && ((r < 0) != (b < 0)));
}
"""

#: WGSL 64-bit remainders on ``vec2<u32>`` pairs (needs ``INT64_WGSL``): ``urem64`` by binary long
#: division (64 steps; the doubled remainder's carry bit is kept, so divisors above 2^63 work),
#: ``rem64`` with the dividend's sign, ``mod64`` with the divisor's.
MOD64_WGSL = """
fn urem64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  if (less64u(a, b)) { return a; }
  var r = vec2<u32>(0u, 0u);
  for (var i = 63i; i >= 0; i = i - 1) {
    let carry = (r.y >> 31u) == 1u;
    r = shl64(r, 1u);
    r.x = r.x | (shr64(a, u32(i)).x & 1u);
    if (carry || !less64u(r, b)) { r = sub64(r, b); }
  }
  return r;
}
fn rem64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let r = urem64(abs64(a), abs64(b));
  return select(r, neg64(r), is_negative64(a));
}
fn mod64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let r = rem64(a, b);
  let zero = vec2<u32>(0u, 0u);
  return select(r, add64(r, b), any(r != zero) && (is_negative64(r) != is_negative64(b)));
}
"""


def mod_array(a: np.ndarray, b: np.ndarray, fmod: bool) -> np.ndarray:
    """``a mod b`` (broadcast) in ``a``'s dtype: C's remainder when ``fmod``, else the divisor's sign."""
    with np.errstate(all="ignore"):
        result = np.fmod(a, b) if fmod else np.mod(a, b)
    return np.asarray(result, dtype=a.dtype)


@register
class Mod(Operator):
    op_type = "Mod"
    since_version = 10
    opset_changes = (28,)

    def _fmod(self, attrs: Mapping[str, Any], dtype: np.dtype[Any]) -> bool:
        fmod = int(attrs.get("fmod", 0))
        if fmod not in (0, 1):
            raise UnsupportedOpError(f"Mod (opset {self.opset}): fmod must be 0 or 1, not {fmod}")
        if dtype.kind == "f" and fmod == 0 and self.opset < 28:
            raise UnsupportedOpError(
                f"Mod (opset {self.opset}): {dtype.name} inputs need fmod=1 before opset 28 (the spec allows fmod=0 "
                "only for integers there)"
            )
        return fmod == 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if a.dtype != b.dtype:
            raise UnsupportedOpError(f"Mod (opset {self.opset}): inputs of different dtypes {a.dtype} and {b.dtype}")
        if a.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"Mod (opset {self.opset}) does not support dtype {a.dtype.name}")
        fmod = self._fmod(attrs, a.dtype)
        result = mod_array(a, b, fmod)
        if a.dtype.kind in "iu" and result.size and np.any(b == 0):
            raise InvalidArgumentError("Mod: integer modulo by zero (onnxruntime fails the run likewise)")
        return [result]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if a.dtype != b.dtype:
            raise NotOnDevice(f"Mod: inputs of different dtypes {a.dtype} and {b.dtype}")
        require_device_dtype("Mod", a.dtype, _DEVICE_DTYPES)
        fmod = self._fmod(attrs, a.dtype)
        kind = a.dtype.kind
        if kind in "iu":
            divisor = constants.get(1)
            if divisor is None or np.any(divisor == 0):
                raise NotOnDevice(
                    "Mod: integer modulo by zero must fail the run (as in onnxruntime), which a device kernel "
                    "cannot do; it runs on the CPU unless the divisor is a constant without zeros"
                )

        def function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return mod_array(x, y, fmod)

        pair = a.dtype.itemsize == 8
        operands = [Operand(0, a, int64_pair=pair), Operand(1, b, int64_pair=pair)]
        if kind == "f":
            check_loop_budget("Mod", 254, caps)
            expression = "fmod_f32(x0, x1)" if fmod else "pymod_f32(x0, x1)"
            helpers = FMOD_WGSL
        elif pair:
            check_loop_budget("Mod", 64, caps)
            if kind == "u":
                expression = "urem64(x0, x1)"
            else:
                expression = "rem64(x0, x1)" if fmod else "mod64(x0, x1)"
            helpers = INT64_WGSL + MOD64_WGSL
        elif kind == "u":
            expression, helpers = "x0 % x1", ""
        else:
            expression = "rem_i32(x0, x1)" if fmod else "mod_i32(x0, x1)"
            helpers = MOD_INT_WGSL
        return elementwise_plan(
            "Mod", operands, outputs, expression, caps, function, inputs, helpers=helpers, pair_output=pair
        )
