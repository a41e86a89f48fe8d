"""Col2Im-18: fold column blocks (N, C * prod(block), L) back into images (N, C, *image_shape), summing where
blocks overlap (PyTorch's ``fold``, N-d).  ``L`` must equal the number of block positions that strides, pads
and dilations give over the padded image.  On the device (float32/float16, image_shape and block_shape
constant) one invocation per output pixel sums the column entries of every block offset that covers it."""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

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
    check_binding_sizes,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    workgroup_size_for,
)

__all__ = ["Col2Im"]


def _ints(value: Any, default: Sequence[int], count: int, name: str) -> list[int]:
    result = [int(v) for v in (default if value is None else value)]
    if len(result) != count:
        raise ShapeError(f"Col2Im: {name} must have {count} values, got {result}")
    return result


@register
class Col2Im(Operator):
    op_type = "Col2Im"
    since_version = 18

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, image_shape, block_shape = inputs[0], inputs[1], inputs[2]
        assert x is not None and image_shape is not None and block_shape is not None
        if x.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"Col2Im: input of dtype {x.dtype} is not supported")
        return [col2im(x, *_geometry(x.shape, image_shape, block_shape, attrs))]

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
        if 1 not in constants or 2 not in constants:
            raise NotOnDevice("Col2Im: image_shape and block_shape must be constants for the WebGPU kernel")
        out = outputs[0]
        for info in (x, out):
            if info.dtype.name not in ("float32", "float16"):
                raise NotOnDevice(f"Col2Im: {info.dtype.name} runs on the CPU")
        geometry = _geometry(x.shape, np.asarray(constants[1]), np.asarray(constants[2]), attrs)
        image, block, strides, dilations, pads, counts = geometry
        rank = len(image)
        if tuple(out.shape) != tuple(x.shape[:1]) + (x.shape[1] // int(np.prod(block)),) + tuple(image):
            raise NotOnDevice(f"Col2Im: the planned output shape {out.shape} differs from image_shape {image}")
        if out.size == 0:
            return OpPlan()
        if max(x.size, out.size) >= 2**31:
            raise NotOnDevice("Col2Im: tensors beyond 2^31 elements run on the CPU")
        block_size = int(np.prod(block))
        check_loop_budget("Col2Im", block_size, caps)
        check_binding_sizes("Col2Im", [x, out], caps)
        length = int(np.prod(counts))
        pixels = int(np.prod(image))
        lines = ["fn value(j: u32) -> f32 {", f"  var rest = j % {pixels}u;", f"  let plane = j / {pixels}u;"]
        for axis in reversed(range(rank)):
            lines.append(f"  let y{axis} = i32(rest % {image[axis]}u);")
            lines.append(f"  rest = rest / {image[axis]}u;")
        lines += ["  var acc = 0.0f;", f"  for (var k = 0u; k < {block_size}u; k = k + 1u) {{", "    var kr = k;"]
        lines += ["    var l = 0u;", "    var ok = true;"]
        stride_l = 1
        for axis in reversed(range(rank)):
            lines.append(f"    let k{axis} = i32(kr % {block[axis]}u);")
            lines.append(f"    kr = kr / {block[axis]}u;")
            lines.append(f"    let p{axis} = y{axis} + {pads[axis]} - k{axis} * {dilations[axis]};")
            lines.append(
                f"    if (p{axis} < 0 || p{axis} % {strides[axis]} != 0 || p{axis} / {strides[axis]} >= {counts[axis]})"
                " { ok = false; }"
            )
            lines.append(f"    l = l + u32(max(p{axis}, 0) / {strides[axis]}) * {stride_l}u;")
            stride_l *= counts[axis]
        lines.append(f"    if (ok) {{ acc = acc + load0((plane * {block_size}u + k) * {length}u + l); }}")
        lines += ["  }", "  return acc;", "}"]
        parts = [
            storage_declaration(0, "src", writable=False),
            storage_declaration(1, "dst", writable=True),
            load_function("load0", "src", x.dtype),
            "\n".join(lines) + "\n",
        ]
        invocations = -(-out.size // elements_per_invocation(out.dtype.itemsize))
        guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
        body = guard + store_statements(out.dtype, out.size, "value")
        workgroup = workgroup_size_for(caps.limits)
        wgsl = "".join(parts) + kernel_entry(workgroup, body)
        bindings = (Binding("input", 0), Binding("output", 0))
        twin = reference_twin(lambda a: col2im(a, *geometry), bindings, inputs, outputs)
        return OpPlan(
            kernels=(KernelSpec("Col2Im", wgsl, grid_for(invocations, workgroup, caps.limits), bindings, twin),)
        )


Geometry = tuple[list[int], list[int], list[int], list[int], list[int], list[int]]


def _geometry(
    x_shape: Sequence[int], image_shape: np.ndarray, block_shape: np.ndarray, attrs: Mapping[str, Any]
) -> Geometry:
    """(image, block, strides, dilations, pads, block counts per axis), validated against X's shape."""
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    rank = len(image)
    if len(block) != rank or rank == 0 or any(v <= 0 for v in image + block):
        raise ShapeError(f"Col2Im: image_shape {image} and block_shape {block} must be positive, of equal length")
    strides = _ints(attrs.get("strides"), [1] * rank, rank, "strides")
    dilations = _ints(attrs.get("dilations"), [1] * rank, rank, "dilations")
    pads = _ints(attrs.get("pads"), [0] * (2 * rank), 2 * rank, "pads")
    if len(x_shape) != 3:
        raise ShapeError(f"Col2Im: input must be 3-D (N, C * prod(block), L), got {tuple(x_shape)}")
    block_size = int(np.prod(block))
    n, channels_blocks, length = (int(d) for d in x_shape)
    if channels_blocks % block_size:
        raise ShapeError(f"Col2Im: {channels_blocks} is not a multiple of the block size {block_size}")
    counts = []
    for size, k, s, d, b, e in zip(image, block, strides, dilations, pads[:rank], pads[rank:]):
        span = size + b + e - (d * (k - 1) + 1)
        if span < 0:
            raise ShapeError(f"Col2Im: block {block} does not fit the padded image {image}")
        counts.append(span // s + 1)
    if int(np.prod(counts)) != length:
        raise ShapeError(f"Col2Im: L = {length} but the blocks fit {int(np.prod(counts))} times ({counts})")
    return image, block, strides, dilations, pads, counts


def col2im(
    x: np.ndarray,
    image: list[int],
    block: list[int],
    strides: list[int],
    dilations: list[int],
    pads: list[int],
    counts: list[int],
) -> np.ndarray:
    """Fold ``x`` (validated by :func:`_geometry`): sum every block entry into its image position."""
    rank = len(image)
    n = x.shape[0]
    block_size = int(np.prod(block))
    c = x.shape[1] // block_size
    columns = x.reshape((n, c) + tuple(block) + tuple(counts))
    padded_shape = tuple(size + b + e for size, b, e in zip(image, pads[:rank], pads[rank:]))
    wide = np.float64 if x.dtype.kind == "f" else np.int64
    out = np.zeros((n, c) + padded_shape, dtype=wide)
    for offset in itertools.product(*(range(k) for k in block)):
        where = tuple(
            slice(o * d, o * d + (count - 1) * s + 1, s) for o, d, count, s in zip(offset, dilations, counts, strides)
        )
        out[(slice(None), slice(None)) + where] += columns[(slice(None), slice(None)) + offset]
    crop = tuple(slice(b, b + size) for b, size in zip(pads[:rank], image))
    result: np.ndarray = np.ascontiguousarray(out[(slice(None), slice(None)) + crop].astype(x.dtype))
    return result
