"""WGSL text helpers shared by operator kernels: element loads and stores, index functions, literals, grids.

Other operator modules import these helpers (read-only); they are the one place
that knows how numpy's memory layout looks from WGSL.

Storage model
-------------
Every storage buffer a kernel built here binds is declared ``array<u32>``; a
tensor's elements are read out of (and written into) those words according to
numpy's C layout, so buffers are never converted on upload or readback:

==========================  ===============  ==========================================
dtype                       compute type     how an element is read
==========================  ===============  ==========================================
float32                     ``f32``          ``bitcast<f32>(word[k])``
int32 / uint32              ``i32``/``u32``  ``bitcast`` of ``word[k]``
float16                     ``f32``          ``unpack2x16float(word[k / 2])``, one half
bfloat16                    ``f32``          half ``k % 2`` of ``word[k / 2]``, as an f32's high 16 bits
bool                        ``bool``         byte ``k % 4`` of ``word[k / 4]``, ``!= 0``
uint8 / int8                ``u32``/``i32``  byte ``k % 4`` of ``word[k / 4]`` (int8 sign-extended)
uint16 / int16              ``u32``/``i32``  half ``k % 2`` of ``word[k / 2]``
int64                       ``i32``          the low word ``word[2k]`` (valid in int32 range)
==========================  ===============  ==========================================

float16 goes through ``unpack2x16float``/``pack2x16float``, which core WGSL has
on every device, so float16 tensors need no ``shader-f16`` feature; arithmetic
is done in f32 and rounded once on store.  bfloat16 is an f32 with its low 16 bits
dropped: it is read by a shift, and stored rounded to nearest even (NaN kept quiet), on
every device.

Write rule: no two invocations write the same ``u32`` word (WGSL has no byte
stores, and a read-modify-write of a shared word would race).  Kernels whose
output elements are narrower than 4 bytes therefore compute
``elements_per_invocation(itemsize)`` consecutive elements per invocation and
write each word once, zero-filling the padding past the last element.

Grids
-----
A dispatch may have at most ``limits.max_compute_workgroups_per_dimension``
workgroups per dimension (65535).  :func:`grid_for` spreads larger counts over
a 2-D grid, and :data:`LINEAR_INVOCATION` recovers the linear invocation id
from ``global_invocation_id`` and ``num_workgroups`` (declare both builtins as
:func:`kernel_entry` does).

The kernel templates built on these helpers (the generic elementwise and
data-movement kernels) are in :mod:`ortgpu.ops._wgsl_kernels`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ortgpu_core.backends.protocol import DeviceLimits

from .._types import element_count
from ._kernel import DeviceCaps, NotOnDevice, TensorInfo

__all__ = [
    "DEFAULT_WORKGROUP_SIZE",
    "LINEAR_INVOCATION",
    "wgsl_compute_type",
    "device_dtype_supported",
    "require_device_dtype",
    "elements_per_invocation",
    "grid_for",
    "workgroup_size_for",
    "kernel_entry",
    "storage_declaration",
    "load_function",
    "raw_load_function",
    "broadcast_index_function",
    "affine_index_function",
    "contiguous_strides",
    "wgsl_float",
    "wgsl_int",
    "wgsl_uint",
    "check_binding_sizes",
    "check_binding_count",
    "store_statements",
    "INT64_WGSL",
]

#: Invocations per workgroup of the kernels built here (clamped to the device's limits).
DEFAULT_WORKGROUP_SIZE = 256

#: WGSL expression of the linear invocation id inside :func:`kernel_entry`'s ``main``
#: (``gid`` = global_invocation_id, ``nwg`` = num_workgroups, 1-D workgroups).
LINEAR_INVOCATION = "(gid.x + gid.y * nwg.x * WORKGROUP_SIZE)"

#: WGSL helpers for 64-bit values held as ``vec2<u32>(low, high)`` (two's complement for int64, IEEE
#: bits for float64).  WGSL has no 64-bit types, so carries, wide products, shifts and float64
#: conversions are spelled out on 32-bit words; all are exact (float conversions round to nearest
#: even, as C casts do).
INT64_WGSL = """
fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let low = a.x + b.x;
  return vec2<u32>(low, a.y + b.y + select(0u, 1u, low < a.x));
}
fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
fn neg64(a: vec2<u32>) -> vec2<u32> {
  return sub64(vec2<u32>(0u, 0u), a);
}
fn is_negative64(a: vec2<u32>) -> bool {
  return (a.y & 0x80000000u) != 0u;
}
fn abs64(a: vec2<u32>) -> vec2<u32> {
  return select(a, neg64(a), is_negative64(a));
}
// The full 64-bit product of two u32, from 16-bit halves.
fn mul_wide32(a: u32, b: u32) -> vec2<u32> {
  let a0 = a & 0xffffu;
  let a1 = a >> 16u;
  let b0 = b & 0xffffu;
  let b1 = b >> 16u;
  let p00 = a0 * b0;
  let p01 = a0 * b1;
  let p10 = a1 * b0;
  let middle = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return vec2<u32>((p00 & 0xffffu) | (middle << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (middle >> 16u));
}
// The low 64 bits of a product: the same bits for signed and unsigned operands.
fn mul64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let low = mul_wide32(a.x, b.x);
  return vec2<u32>(low.x, low.y + a.x * b.y + a.y * b.x);
}
fn less64u(a: vec2<u32>, b: vec2<u32>) -> bool {
  return a.y < b.y || (a.y == b.y && a.x < b.x);
}
fn less64s(a: vec2<u32>, b: vec2<u32>) -> bool {
  return bitcast<i32>(a.y) < bitcast<i32>(b.y) || (a.y == b.y && a.x < b.x);
}
fn shl64(a: vec2<u32>, s: u32) -> vec2<u32> {
  if (s == 0u) { return a; }
  if (s >= 64u) { return vec2<u32>(0u, 0u); }
  if (s >= 32u) { return vec2<u32>(0u, a.x << (s - 32u)); }
  return vec2<u32>(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}
fn shr64(a: vec2<u32>, s: u32) -> vec2<u32> {
  if (s == 0u) { return a; }
  if (s >= 64u) { return vec2<u32>(0u, 0u); }
  if (s >= 32u) { return vec2<u32>(a.y >> (s - 32u), 0u); }
  return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}
// a >> s rounded to nearest even (1 <= s <= 63), or to odd (sticky) when to_odd.
fn shr_round64(a: vec2<u32>, s: u32, to_odd: bool) -> vec2<u32> {
  let q = shr64(a, s);
  let rest = sub64(a, shl64(q, s));
  if (to_odd) {
    return vec2<u32>(q.x | select(0u, 1u, any(rest != vec2<u32>(0u, 0u))), q.y);
  }
  let half = shl64(vec2<u32>(1u, 0u), s - 1u);
  let up = less64u(half, rest) || (all(rest == half) && (q.x & 1u) == 1u);
  return select(q, add64(q, vec2<u32>(1u, 0u)), up);
}
// Unsigned 64-bit integer to f32, rounded to nearest even.
fn u64_to_f32(m: vec2<u32>) -> f32 {
  if (m.y == 0u && m.x < 0x1000000u) { return f32(m.x); }
  let top = select(31u - countLeadingZeros(m.x), 63u - countLeadingZeros(m.y), m.y != 0u);  // the leading bit
  let mantissa = shr_round64(m, top - 23u, false).x;  // 24 bits, or 2^24 after a carry
  return bitcast<f32>(((top + 127u) << 23u) + mantissa - 0x800000u);
}
fn i64_to_f32(a: vec2<u32>) -> f32 {
  let r = u64_to_f32(abs64(a));
  return select(r, -r, is_negative64(a));
}
// f32 to int64 truncating toward zero; NaN and out-of-range values give INT64_MIN (as x86 does).
fn f32_to_i64(x: f32) -> vec2<u32> {
  let bits = bitcast<u32>(x);
  let exponent = i32((bits >> 23u) & 0xffu) - 127;
  if (exponent < 0) { return vec2<u32>(0u, 0u); }
  if (exponent >= 63) { return vec2<u32>(0u, 0x80000000u); }
  let significand = vec2<u32>((bits & 0x7fffffu) | 0x800000u, 0u);
  var m: vec2<u32>;
  if (exponent >= 23) { m = shl64(significand, u32(exponent - 23)); } else { m = shr64(significand, u32(23 - exponent)); }
  return select(m, neg64(m), (bits & 0x80000000u) != 0u);
}
// f32 to float64 bits (exact; subnormals normalised, NaN payloads kept).
fn f32_to_f64(x: f32) -> vec2<u32> {
  let bits = bitcast<u32>(x);
  let sign = bits & 0x80000000u;
  let e = (bits >> 23u) & 0xffu;
  let m = bits & 0x7fffffu;
  if (e == 255u) { return vec2<u32>(m << 29u, sign | 0x7ff00000u | (m >> 3u)); }
  if (e == 0u) {
    if (m == 0u) { return vec2<u32>(0u, sign); }
    let p = 31u - countLeadingZeros(m);  // the leading bit: value = 2^(p - 149) * 1.f
    let fraction = shl64(vec2<u32>(m ^ (1u << p), 0u), 52u - p);
    return vec2<u32>(fraction.x, sign | ((p + 874u) << 20u) | fraction.y);
  }
  return vec2<u32>(m << 29u, sign | ((e + 896u) << 20u) | (m >> 3u));
}
// float64 bits to the bits of a float with `mbits` mantissa bits and exponent bias `bias`
// (f32: 23, 127; f16: 10, 15) without the sign, rounded to nearest even (or to odd).
fn f64_round(v: vec2<u32>, mbits: u32, bias: i32, to_odd: bool) -> u32 {
  let e = (v.y >> 20u) & 0x7ffu;
  let emax = u32(2 * bias + 1);
  let fraction = vec2<u32>(v.x, v.y & 0xfffffu);
  if (e == 2047u) {
    let nan = any(fraction != vec2<u32>(0u, 0u));
    return (emax << mbits) | select(0u, (1u << (mbits - 1u)) | shr64(fraction, 52u - mbits).x, nan);
  }
  if (e == 0u) { return select(0u, 1u, to_odd && any(fraction != vec2<u32>(0u, 0u))); }
  let exponent = i32(e) - 1023;
  let significand = vec2<u32>(v.x, fraction.y | 0x100000u);
  if (exponent + bias >= i32(emax)) { return emax << mbits; }
  if (exponent + bias >= 1) {
    let m = shr_round64(significand, 52u - mbits, to_odd).x;
    let bits = (u32(exponent + bias) << mbits) + m - (1u << mbits);
    return min(bits, emax << mbits);
  }
  let shift = 52 - i32(mbits) + 1 - bias - exponent;
  if (shift > 63) { return select(0u, 1u, to_odd); }
  return shr_round64(significand, u32(shift), to_odd).x;
}
fn f64_to_f32(v: vec2<u32>) -> f32 {
  return bitcast<f32>((v.y & 0x80000000u) | f64_round(v, 23u, 127, false));
}
// Rounded to odd, so that rounding the f32 again to float16 (on store) is correctly rounded.
fn f64_to_f32_odd(v: vec2<u32>) -> f32 {
  return bitcast<f32>((v.y & 0x80000000u) | f64_round(v, 23u, 127, true));
}
"""


# dtype name -> WGSL compute type (see the table in the module docstring).
_COMPUTE_TYPES: dict[str, str] = {
    "float32": "f32",
    "float16": "f32",
    "bfloat16": "f32",
    "int32": "i32",
    "uint32": "u32",
    "int64": "i32",
    "bool": "bool",
    "uint8": "u32",
    "int8": "i32",
    "uint16": "u32",
    "int16": "i32",
}


def wgsl_compute_type(dtype: np.dtype[Any] | str) -> str:
    """The WGSL type an element of ``dtype`` is computed in (``f32``, ``i32``, ``u32`` or ``bool``).

    Raises :class:`NotOnDevice` for dtypes WGSL cannot compute with (float64, uint64, strings...).
    """
    name = np.dtype(dtype).name
    try:
        return _COMPUTE_TYPES[name]
    except KeyError:
        raise NotOnDevice(f"dtype {name} has no WGSL compute type (WebGPU has no 64-bit float arithmetic)") from None


def device_dtype_supported(dtype: np.dtype[Any] | str) -> bool:
    """Whether :func:`load_function` can read ``dtype``."""
    return np.dtype(dtype).name in _COMPUTE_TYPES


def require_device_dtype(op_type: str, dtype: np.dtype[Any], allowed: Sequence[str], why: str = "") -> None:
    """Raise :class:`NotOnDevice` unless ``dtype`` is one of ``allowed`` (dtype names)."""
    if dtype.name not in allowed:
        reason = why or f"its WebGPU kernel supports {', '.join(allowed)}"
        raise NotOnDevice(f"{op_type} on {dtype.name} runs on the CPU: {reason}")


def elements_per_invocation(itemsize: int) -> int:
    """Output elements one invocation writes so that it owns whole ``u32`` words (4 for bytes, 2 for halves)."""
    return 4 // itemsize if itemsize < 4 else 1


def workgroup_size_for(limits: DeviceLimits, preferred: int = DEFAULT_WORKGROUP_SIZE) -> int:
    """A 1-D workgroup size within the device's limits (a power of two, at most ``preferred``)."""
    cap = min(preferred, limits.max_compute_invocations_per_workgroup, limits.max_compute_workgroup_size_x)
    size = 1
    while size * 2 <= cap:
        size *= 2
    return size


def grid_for(count: int, workgroup_size: int, limits: DeviceLimits) -> tuple[int, int, int]:
    """The dispatch grid that runs at least ``count`` invocations of a 1-D workgroup of ``workgroup_size``.

    Up to ``max_compute_workgroups_per_dimension`` workgroups the grid is 1-D;
    beyond, it is ``(x, y, 1)`` with ``x * y >= groups``.  Kernels recover the
    linear id as ``gid.x + gid.y * nwg.x * workgroup_size`` (:data:`LINEAR_INVOCATION`)
    and must bounds-check it, since the grid may overshoot.  A ``count`` of 0
    gives a grid of one workgroup (dispatches of zero workgroups are avoided).
    """
    groups = max(1, -(-count // workgroup_size))
    max_dim = limits.max_compute_workgroups_per_dimension
    if groups <= max_dim:
        return (groups, 1, 1)
    rows = -(-groups // max_dim)
    if rows > max_dim:
        raise NotOnDevice(
            f"{count} invocations exceed the device's 2-D dispatch grid ({max_dim} x {max_dim} workgroups)"
        )
    return (-(-groups // rows), rows, 1)


def kernel_entry(workgroup_size: int, body: str) -> str:
    """The ``main`` entry point: declares ``gid``/``nwg`` and the ``WORKGROUP_SIZE`` constant, then ``body``."""
    return (
        f"const WORKGROUP_SIZE: u32 = {workgroup_size}u;\n"
        f"@compute @workgroup_size({workgroup_size})\n"
        "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {\n"
        f"{body}"
        "}\n"
    )


def storage_declaration(binding: int, name: str, writable: bool) -> str:
    """``@group(0) @binding(i) var<storage, read|read_write> name: array<u32>;``"""
    access = "read_write" if writable else "read"
    return f"@group(0) @binding({binding}) var<storage, {access}> {name}: array<u32>;\n"


def wgsl_float(value: float) -> str:
    """A WGSL f32 literal for ``value``, which must be finite as float32.

    WGSL makes a constant expression that evaluates to an infinity or NaN a
    shader-creation error, so kernels must handle such values at run time
    (or leave the bound out, as Clip does for missing bounds).
    """
    value = float(np.float32(value))
    if not math.isfinite(value):
        raise NotOnDevice(f"the constant {value} cannot be written into WGSL (constants must be finite)")
    text = repr(value)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"f32({text})"


def wgsl_int(value: int) -> str:
    """A WGSL i32 literal (the most negative value spelled so WGSL accepts it)."""
    value = int(value)
    if value == -(2**31):
        return "i32(-2147483647 - 1)"
    return f"i32({value})"


def wgsl_uint(value: int) -> str:
    """A WGSL u32 literal."""
    return f"{int(value)}u"


def load_function(function: str, buffer: str, dtype: np.dtype[Any], *, int64_pair: bool = False) -> str:
    """A WGSL function ``fn <function>(k: u32) -> T`` reading element ``k`` of ``buffer`` as its compute type.

    ``int64_pair`` reads int64 (and uint64 and float64, which have no other
    reading) as ``vec2<u32>(low, high)`` for exact 64-bit arithmetic
    (:data:`INT64_WGSL`) instead of its low word as ``i32``.
    """
    name = np.dtype(dtype).name
    byte = f"(({buffer}[k >> 2u] >> ((k & 3u) * 8u)) & 0xffu)"
    half = f"(({buffer}[k >> 1u] >> ((k & 1u) * 16u)) & 0xffffu)"
    if name == "float32":
        return f"fn {function}(k: u32) -> f32 {{ return bitcast<f32>({buffer}[k]); }}\n"
    if name == "int32":
        return f"fn {function}(k: u32) -> i32 {{ return bitcast<i32>({buffer}[k]); }}\n"
    if name == "uint32":
        return f"fn {function}(k: u32) -> u32 {{ return {buffer}[k]; }}\n"
    if name == "float16":
        return (
            f"fn {function}(k: u32) -> f32 {{\n"
            f"  let pair = unpack2x16float({buffer}[k >> 1u]);\n"
            "  return select(pair.x, pair.y, (k & 1u) == 1u);\n}\n"
        )
    if name == "bfloat16":
        return f"fn {function}(k: u32) -> f32 {{ return bitcast<f32>({half} << 16u); }}\n"
    if name in ("int64", "uint64", "float64") and int64_pair:
        return f"fn {function}(k: u32) -> vec2<u32> {{ return vec2<u32>({buffer}[2u * k], {buffer}[2u * k + 1u]); }}\n"
    if name == "int64":
        return f"fn {function}(k: u32) -> i32 {{ return bitcast<i32>({buffer}[2u * k]); }}\n"
    if name == "bool":
        return f"fn {function}(k: u32) -> bool {{ return {byte} != 0u; }}\n"
    if name == "uint8":
        return f"fn {function}(k: u32) -> u32 {{ return {byte}; }}\n"
    if name == "int8":
        return f"fn {function}(k: u32) -> i32 {{ return bitcast<i32>({byte} << 24u) >> 24u; }}\n"
    if name == "uint16":
        return f"fn {function}(k: u32) -> u32 {{ return {half}; }}\n"
    if name == "int16":
        return f"fn {function}(k: u32) -> i32 {{ return bitcast<i32>({half} << 16u) >> 16u; }}\n"
    raise NotOnDevice(f"dtype {name} cannot be read by a WebGPU kernel")


def raw_load_function(function: str, buffer: str, itemsize: int) -> str:
    """``fn <function>(k: u32) -> vec2<u32>``: the bits of element ``k`` (any dtype of ``itemsize`` bytes).

    Elements of 1 or 2 bytes come back zero-extended in ``.x``; 8-byte elements as (low, high).
    """
    if itemsize == 8:
        body = f"vec2<u32>({buffer}[2u * k], {buffer}[2u * k + 1u])"
    elif itemsize == 4:
        body = f"vec2<u32>({buffer}[k], 0u)"
    elif itemsize == 2:
        body = f"vec2<u32>(({buffer}[k >> 1u] >> ((k & 1u) * 16u)) & 0xffffu, 0u)"
    elif itemsize == 1:
        body = f"vec2<u32>(({buffer}[k >> 2u] >> ((k & 3u) * 8u)) & 0xffu, 0u)"
    else:
        raise NotOnDevice(f"elements of {itemsize} bytes cannot be moved by a WebGPU kernel")
    return f"fn {function}(k: u32) -> vec2<u32> {{ return {body}; }}\n"


def affine_index_function(
    function: str,
    out_shape: Sequence[int],
    terms: Sequence[tuple[int | None, int]],
    offset: int = 0,
) -> str:
    """``fn <function>(j: u32) -> u32``: an input element index as an affine map of output coordinates.

    Output element ``j`` (C order over ``out_shape``) has coordinates ``c[d]``;
    the result is ``offset + sum_d (c[d] % modulus_d) * multiplier_d`` with
    ``terms[d] = (modulus_d or None, multiplier_d)``.  Multipliers and the
    offset may be negative (Slice with negative steps); arithmetic is i32.
    Transpose, Slice, Tile and Expand are all such maps.
    """
    lines = [f"fn {function}(j: u32) -> u32 {{\n", "  var rest = j;\n", f"  var index = {wgsl_int(offset)};\n"]
    for axis in range(len(out_shape) - 1, -1, -1):
        size = int(out_shape[axis])
        modulus, multiplier = terms[axis]
        if size == 1:
            continue  # coordinate is always 0
        lines.append(f"  let c{axis} = rest % {size}u;\n")
        lines.append(f"  rest = rest / {size}u;\n")
        if multiplier == 0:
            continue
        coordinate = f"c{axis}" if modulus is None or modulus >= size else f"(c{axis} % {int(modulus)}u)"
        lines.append(f"  index = index + i32({coordinate}) * {wgsl_int(multiplier)};\n")
    lines.append("  return u32(index);\n}\n")
    return "".join(lines)


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Element strides of a C-contiguous tensor of ``shape``."""
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * int(shape[axis + 1])
    return strides


def broadcast_index_function(function: str, in_shape: Sequence[int], out_shape: Sequence[int]) -> str:
    """``fn <function>(j: u32) -> u32``: the element of an input of ``in_shape`` that numpy broadcasting
    pairs with output element ``j`` of ``out_shape`` (identity and scalar inputs get one-line functions).

    An input with as many elements as the output is the identity whatever size-1 axes either shape adds
    (``[S, D]`` read as ``[1, S, D]``): broadcasting only repeats along the input's size-1 axes, and with equal
    counts none of them repeats."""
    in_shape = [int(d) for d in in_shape]
    out_shape = [int(d) for d in out_shape]
    if element_count(in_shape) == element_count(out_shape):
        return f"fn {function}(j: u32) -> u32 {{ return j; }}\n"
    if element_count(in_shape) == 1:
        return f"fn {function}(j: u32) -> u32 {{ return 0u; }}\n"
    aligned = [1] * (len(out_shape) - len(in_shape)) + in_shape
    strides = contiguous_strides(aligned)
    terms: list[tuple[int | None, int]] = [(None, 0 if aligned[d] == 1 else strides[d]) for d in range(len(out_shape))]
    return affine_index_function(function, out_shape, terms)


def check_binding_sizes(op_type: str, infos: Sequence[TensorInfo | None], caps: DeviceCaps) -> None:
    """Raise :class:`NotOnDevice` if a tensor is larger than one storage binding may be."""
    limit = caps.limits.max_storage_buffer_binding_size
    for info in infos:
        if info is not None and info.nbytes > limit:
            raise NotOnDevice(
                f"{op_type}: a tensor of {info.nbytes} bytes exceeds the device's storage binding limit ({limit} bytes)"
            )


def check_binding_count(op_type: str, count: int, caps: DeviceCaps) -> None:
    if count > caps.limits.max_storage_buffers_per_shader_stage:
        raise NotOnDevice(
            f"{op_type} needs {count} storage buffers in one kernel; the device allows "
            f"{caps.limits.max_storage_buffers_per_shader_stage}"
        )


def _store_statements(out_dtype: np.dtype[Any], count: int, value_fn: str, pair: bool = False) -> str:
    """Body lines that write the elements owned by invocation ``w`` into ``dst`` (see the write rule)."""
    name = out_dtype.name
    itemsize = out_dtype.itemsize
    per = elements_per_invocation(itemsize)
    if pair:
        return f"  let v = {value_fn}(w);\n  dst[2u * w] = v.x;\n  dst[2u * w + 1u] = v.y;\n"
    if per == 1:
        if name == "int64":
            return (
                f"  let v = {value_fn}(w);\n"
                "  dst[2u * w] = bitcast<u32>(v);\n"
                "  dst[2u * w + 1u] = select(0u, 0xffffffffu, v < 0);\n"
            )
        if itemsize != 4:
            raise NotOnDevice(f"a WebGPU elementwise kernel cannot write {name}")
        return f"  dst[w] = bitcast<u32>({value_fn}(w));\n"
    # Narrow outputs: this invocation owns word w, i.e. elements w*per .. w*per+per-1.
    lines = ["  var word = 0u;\n"]
    for e in range(per):
        j = f"(w * {per}u + {e}u)"
        if name == "float16":
            lines.append(f"  let v{e} = select(0.0, {value_fn}(min({j}, {count - 1}u)), {j} < {count}u);\n")
        elif name == "bfloat16":
            # f32 bits rounded to their high half, to nearest even; a NaN stays a (quiet) NaN
            lines.append(
                f"  let f{e} = bitcast<u32>(select(0.0, {value_fn}(min({j}, {count - 1}u)), {j} < {count}u));\n"
            )
            lines.append(
                f"  let v{e} = select((f{e} + 0x7fffu + ((f{e} >> 16u) & 1u)) >> 16u, (f{e} >> 16u) | 0x40u, "
                f"(f{e} & 0x7fffffffu) > 0x7f800000u);\n"
            )
        elif name == "bool":
            lines.append(f"  let v{e} = select(0u, 1u, {j} < {count}u && {value_fn}(min({j}, {count - 1}u)));\n")
        else:
            mask = "0xffu" if itemsize == 1 else "0xffffu"
            lines.append(
                f"  let v{e} = select(0u, bitcast<u32>({value_fn}(min({j}, {count - 1}u))) & {mask}, {j} < {count}u);\n"
            )
    if name == "float16":
        lines.append("  word = pack2x16float(vec2<f32>(v0, v1));\n")
    else:
        bits = 8 * itemsize
        for e in range(per):
            lines.append(f"  word = word | (v{e} << {e * bits}u);\n")
    lines.append("  dst[w] = word;\n")
    return "".join(lines)


def store_statements(out_dtype: np.dtype[Any], count: int, value_fn: str, pair: bool = False) -> str:
    """Body lines of a kernel ``main`` writing the output elements owned by invocation ``w`` into ``dst``.

    ``value_fn`` names a WGSL ``fn (j: u32) -> T`` (``T`` the output's compute type, or ``vec2<u32>``
    with ``pair``) giving output element ``j``; narrow outputs get whole words (the write rule).
    """
    return _store_statements(out_dtype, count, value_fn, pair)
