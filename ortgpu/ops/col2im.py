"""Col2Im-18: fold column blocks (N, C * prod(block), L) back into images (N, C, *image_shape), summing where
blocks overlap (PyTorch's ``fold``, N-d).  ``L`` must equal the number of block positions that strides, pads
and dilations give over the padded image.  Computed on the CPU (the output shape depends on input values)."""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

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
        image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
        block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
        rank = len(image)
        if len(block) != rank or rank == 0 or any(v <= 0 for v in image + block):
            raise ShapeError(f"Col2Im: image_shape {image} and block_shape {block} must be positive, of equal length")
        strides = _ints(attrs.get("strides"), [1] * rank, rank, "strides")
        dilations = _ints(attrs.get("dilations"), [1] * rank, rank, "dilations")
        pads = _ints(attrs.get("pads"), [0] * (2 * rank), 2 * rank, "pads")
        if x.ndim != 3:
            raise ShapeError(f"Col2Im: input must be 3-D (N, C * prod(block), L), got {x.shape}")
        block_size = int(np.prod(block))
        n, channels_blocks, length = x.shape
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
        c = channels_blocks // block_size
        columns = x.reshape((n, c) + tuple(block) + tuple(counts))
        padded_shape = tuple(size + b + e for size, b, e in zip(image, pads[:rank], pads[rank:]))
        wide = np.float64 if x.dtype.kind == "f" else np.int64
        out = np.zeros((n, c) + padded_shape, dtype=wide)
        for offset in itertools.product(*(range(k) for k in block)):
            where = tuple(
                slice(o * d, o * d + (count - 1) * s + 1, s)
                for o, d, count, s in zip(offset, dilations, counts, strides)
            )
            out[(slice(None), slice(None)) + where] += columns[(slice(None), slice(None)) + offset]
        crop = tuple(slice(b, b + size) for b, size in zip(pads[:rank], image))
        return [np.ascontiguousarray(out[(slice(None), slice(None)) + crop].astype(x.dtype))]
