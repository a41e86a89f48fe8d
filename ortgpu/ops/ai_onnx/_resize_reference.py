"""The N-d resampling engine of Resize and Upsample: the configuration, the tap tables and the numpy reference.

Resampling is separable: along every resized axis each output position reads a few input positions ("taps")
with weights (nearest: 1 tap, linear: 2, cubic: 4, antialiased filters: a stretched window).  The tap tables
are computed in float32 exactly as onnxruntime does (the coordinate transformation in float32), so nearest
ties land on the same side; the WGSL kernel (:mod:`._resize_wgsl`) evaluates the same float32 formulas per
output element.

Conventions (those of onnxruntime, which the node tests and the tests here check):

* linear: the source coordinate is clamped into ``[0, length - 1]``;
* cubic: the coordinate is not clamped; tap indices are (clamped to the edge, or dropped and the weights
  renormalised with ``exclude_outside``);
* tf_crop_and_resize: an output whose coordinate on any resized axis falls outside ``[0, length - 1]`` is
  ``extrapolation_value``;
* opset < 11 (and Upsample): asymmetric coordinates, nearest rounds down when enlarging and up when shrinking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

__all__ = ["ResizeConfig", "resize_config", "resize_reference", "axis_coordinates"]

F32 = np.float32

_MODES = ("nearest", "linear", "cubic")
_TRANSFORMS = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class ResizeConfig:
    """Everything one resize needs, per axis of X (axes that are not resized have scale 1 and no roi)."""

    op_type: str
    mode: str
    transform: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    extrapolation: float
    antialias: bool
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    scales: tuple[float, ...]  # float32 values
    from_scales: bool  # the output size came from ``scales`` (not ``sizes``)
    roi: tuple[tuple[float, float], ...]

    def resized(self, axis: int) -> bool:
        """Whether ``axis`` changes anything (an identity axis is copied straight through)."""
        return not (
            self.in_shape[axis] == self.out_shape[axis]
            and self.scales[axis] == 1.0
            and self.transform != "tf_crop_and_resize"
        )


def _round_half_away(value: float) -> int:
    return int(np.floor(value + 0.5))


def resize_config(
    op_type: str,
    opset: int,
    x_shape: Sequence[int],
    attrs: Mapping[str, Any],
    roi: np.ndarray | None,
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
) -> ResizeConfig:
    """Validate the attributes and inputs and work out the per-axis scales, roi and output shape."""
    rank = len(x_shape)
    mode = _text(attrs.get("mode"), "nearest")
    if op_type == "Upsample" and mode == "bilinear":
        mode = "linear"
    if mode not in _MODES or (op_type == "Upsample" and mode == "cubic"):
        raise UnsupportedOpError(f"{op_type}: mode {mode!r} is not supported (nearest, linear, cubic)")
    legacy = op_type == "Upsample" or opset < 11
    if legacy:
        transform, nearest = "asymmetric", "simple"
    else:
        transform = _text(attrs.get("coordinate_transformation_mode"), "half_pixel")
        nearest = _text(attrs.get("nearest_mode"), "round_prefer_floor")
        if transform not in _TRANSFORMS or (transform == "half_pixel_symmetric" and opset < 19):
            raise UnsupportedOpError(f"{op_type}: coordinate_transformation_mode {transform!r} is not supported")
        if transform == "tf_half_pixel_for_nn" and opset >= 13:
            raise UnsupportedOpError(f"{op_type}: tf_half_pixel_for_nn was removed in opset 13")
        if nearest not in _NEAREST[:4]:
            raise UnsupportedOpError(f"{op_type}: nearest_mode {nearest!r} is not supported")
    antialias = bool(int(attrs.get("antialias", 0))) and opset >= 18 and op_type == "Resize"
    axes_attr = attrs.get("axes") if op_type == "Resize" and opset >= 18 else None
    if axes_attr is None:
        axes = list(range(rank))
    else:
        axes = []
        for a in axes_attr:
            a = int(a)
            if not -rank <= a < rank:
                raise ShapeError(f"{op_type}: axis {a} is out of range for rank {rank}")
            axes.append(a + rank if a < 0 else a)
        if len(set(axes)) != len(axes):
            raise ShapeError(f"{op_type}: axes {list(axes_attr)} repeat an axis")
    policy = _text(attrs.get("keep_aspect_ratio_policy"), "stretch") if opset >= 18 else "stretch"
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise UnsupportedOpError(f"{op_type}: keep_aspect_ratio_policy {policy!r} is not supported")

    have_scales = scales is not None and scales.size > 0
    have_sizes = sizes is not None and sizes.size > 0
    if have_scales == have_sizes:
        raise ShapeError(f"{op_type}: exactly one of scales and sizes must be given")
    full_scales = [1.0] * rank
    out_shape = list(int(d) for d in x_shape)
    if have_scales:
        assert scales is not None
        values = np.asarray(scales).reshape(-1).astype(F32)
        if values.size != len(axes):
            raise ShapeError(f"{op_type}: scales has {values.size} values for {len(axes)} axes")
        if not np.all(np.isfinite(values)) or np.any(values <= 0):
            raise ShapeError(f"{op_type}: scales must be positive, got {values.tolist()}")
        for a, s in zip(axes, values):
            full_scales[a] = float(s)
            # exact product of the float32 scale (as onnx shape inference and the spec: 10 x 0.7f = 6.99.. -> 6)
            out_shape[a] = int(np.floor(float(x_shape[a]) * float(s)))
    else:
        assert sizes is not None
        wanted = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(wanted) != len(axes):
            raise ShapeError(f"{op_type}: sizes has {len(wanted)} values for {len(axes)} axes")
        if any(v < 0 for v in wanted):
            raise ShapeError(f"{op_type}: sizes must not be negative, got {wanted}")
        if policy == "stretch":
            for a, v in zip(axes, wanted):
                out_shape[a] = v
                full_scales[a] = float(F32(v) / F32(x_shape[a])) if x_shape[a] else 1.0
        else:
            ratios = [F32(v) / F32(x_shape[a]) for a, v in zip(axes, wanted) if x_shape[a]]
            if not ratios:
                raise ShapeError(f"{op_type}: keep_aspect_ratio_policy needs non-empty resized axes")
            scale = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                full_scales[a] = float(scale)
                out_shape[a] = _round_half_away(float(F32(scale) * F32(x_shape[a])))
    roi_pairs = [(0.0, 1.0)] * rank
    if transform == "tf_crop_and_resize":
        if roi is None or roi.size == 0:
            raise ShapeError(f"{op_type}: tf_crop_and_resize needs the roi input")
        values = np.asarray(roi).reshape(-1).astype(F32)
        if values.size != 2 * len(axes):
            raise ShapeError(f"{op_type}: roi has {values.size} values, expected {2 * len(axes)}")
        half = len(axes)
        for i, a in enumerate(axes):
            roi_pairs[a] = (float(values[i]), float(values[half + i]))
    return ResizeConfig(
        op_type=op_type,
        mode=mode,
        transform=transform,
        nearest=nearest,
        cubic_a=float(F32(attrs.get("cubic_coeff_a", -0.75))),
        exclude_outside=bool(int(attrs.get("exclude_outside", 0))),
        extrapolation=float(F32(attrs.get("extrapolation_value", 0.0))),
        antialias=antialias,
        in_shape=tuple(int(d) for d in x_shape),
        out_shape=tuple(out_shape),
        scales=tuple(full_scales),
        from_scales=have_scales,
        roi=tuple(roi_pairs),
    )


def axis_coordinates(config: ResizeConfig, axis: int) -> np.ndarray:
    """float32 source coordinates of every output position along ``axis`` (onnxruntime's formulas)."""
    length_in = config.in_shape[axis]
    length_out = config.out_shape[axis]
    scale = F32(config.scales[axis])
    o = np.arange(length_out, dtype=F32)
    half = F32(0.5)
    t = config.transform
    if t == "half_pixel":
        return (o + half) / scale - half
    if t == "half_pixel_symmetric":
        offset = half_pixel_symmetric_offset(length_in, length_out, scale)
        return offset + (o + half) / scale - half
    if t == "pytorch_half_pixel":
        return (o + half) / scale - half if length_out > 1 else np.zeros_like(o)
    if t == "align_corners":
        if length_out == 1:
            return np.zeros_like(o)
        return (np.arange(length_out, dtype=np.int64) * (length_in - 1)).astype(F32) / align_denominator(config, axis)
    if t == "asymmetric":
        return o / scale
    if t == "tf_half_pixel_for_nn":
        return (o + half) / scale
    start, end = crop_terms(config, axis)
    if length_out == 1:
        return np.full_like(o, end)
    return start + (o * end) / F32(length_out - 1)


def align_denominator(config: ResizeConfig, axis: int) -> np.float32:
    """align_corners divides by ``length_resized - 1``; with ``scales`` that length is ``length_original *
    scale``, which may be fractional (the ONNX definition; the node tests expect it)."""
    if config.from_scales:
        return F32(F32(config.in_shape[axis]) * F32(config.scales[axis]) - F32(1))
    return F32(config.out_shape[axis] - 1)


def half_pixel_symmetric_offset(length_in: int, length_out: int, scale: np.float32) -> np.float32:
    """The shift half_pixel_symmetric adds, in float32."""
    adjustment = F32(length_out) / (scale * F32(length_in))
    center = F32(length_in) / F32(2)
    return F32(center * (F32(1) - adjustment))


def crop_terms(config: ResizeConfig, axis: int) -> tuple[np.float32, np.float32]:
    """tf_crop_and_resize as ``start + o * span / (out - 1)``: (start, span); for one output, (unused, centre)."""
    begin, end = (F32(v) for v in config.roi[axis])
    last = F32(config.in_shape[axis] - 1)
    if config.out_shape[axis] == 1:
        return F32(0), F32(F32(F32(0.5) * (begin + end)) * last)
    return F32(begin * last), F32((end - begin) * last)


def nearest_index(x: np.ndarray, mode: str, downsample: bool) -> np.ndarray:
    """The nearest-neighbour input index of float32 coordinates (before clamping)."""
    floor = np.floor(x)
    frac = x - floor
    if mode == "round_prefer_floor":
        result = np.where(frac <= F32(0.5), floor, floor + F32(1))
    elif mode == "round_prefer_ceil":
        result = np.where(frac < F32(0.5), floor, floor + F32(1))
    elif mode == "floor":
        result = floor
    elif mode == "ceil":
        result = np.ceil(x)
    else:  # "simple": opset < 11 and Upsample
        result = np.ceil(x) if downsample else np.trunc(x)
    index: np.ndarray = result.astype(np.int64)
    return index


def cubic_weight(distance: np.ndarray, a: float) -> np.ndarray:
    """The cubic convolution kernel (Keys) with coefficient ``a`` at float32 distances."""
    d = np.abs(distance).astype(F32)
    a32 = F32(a)
    near = ((a32 + F32(2)) * d - (a32 + F32(3))) * d * d + F32(1)
    far = ((a32 * d - F32(5) * a32) * d + F32(8) * a32) * d - F32(4) * a32
    return np.where(d <= F32(1), near, np.where(d < F32(2), far, F32(0))).astype(F32)


def axis_taps(config: ResizeConfig, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices [out, T], float32 weights [out, T], outside [out]) of one resized axis."""
    length_in = config.in_shape[axis]
    x = axis_coordinates(config, axis)
    last = length_in - 1
    outside = (x < 0) | (x > F32(last)) if config.transform == "tf_crop_and_resize" else np.zeros(x.shape, dtype=bool)
    if config.mode == "nearest":
        downsample = config.scales[axis] < 1.0
        index = np.clip(nearest_index(x, config.nearest, downsample), 0, last)
        return index[:, None], np.ones((x.size, 1), dtype=F32), outside
    scale = F32(config.scales[axis])
    if config.antialias and scale < 1:
        return _antialias_taps(config, x, length_in, scale) + (outside,)
    if config.mode == "linear":
        xc = np.clip(x, F32(0), F32(last))
        i0 = np.floor(xc).astype(np.int64)
        i1 = np.minimum(i0 + 1, last)
        w1 = (xc - i0.astype(F32)).astype(F32)
        return np.stack([i0, i1], 1), np.stack([F32(1) - w1, w1], 1), outside
    floor = np.floor(x)
    t = (x - floor).astype(F32)
    base = floor.astype(np.int64)
    raw = np.stack([base - 1, base, base + 1, base + 2], 1)
    distances = np.stack([t + F32(1), t, F32(1) - t, F32(2) - t], 1)
    weights = cubic_weight(distances, config.cubic_a)
    if config.exclude_outside:
        weights = np.where((raw >= 0) & (raw <= last), weights, F32(0))
        weights = (weights / weights.sum(axis=1, keepdims=True, dtype=F32)).astype(F32)
    return np.clip(raw, 0, last), weights, outside


def _antialias_taps(
    config: ResizeConfig, x: np.ndarray, length_in: int, scale: np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Antialiased downsampling: the linear/cubic filter stretched by ``1 / scale`` (every input position
    within the widened support contributes), normalised to sum 1.  Positions beyond the edge read the edge
    element, or get weight 0 with ``exclude_outside``."""
    support = F32(1) if config.mode == "linear" else F32(2)
    window = support / scale
    count = 2 * int(np.ceil(window)) + 2
    low = np.floor(x - window).astype(np.int64)
    idx = low[:, None] + np.arange(count, dtype=np.int64)[None, :]
    distance = ((idx.astype(F32) - x[:, None]) * scale).astype(F32)
    if config.mode == "linear":
        weights = np.maximum(F32(0), F32(1) - np.abs(distance)).astype(F32)
    else:
        weights = cubic_weight(distance, config.cubic_a)
    if config.exclude_outside:
        weights = np.where((idx >= 0) & (idx < length_in), weights, F32(0))
    total = weights.sum(axis=1, keepdims=True, dtype=F32)
    weights = np.where(total != 0, weights / np.where(total != 0, total, F32(1)), F32(0)).astype(F32)
    return np.clip(idx, 0, length_in - 1), weights


def resize_reference(x: np.ndarray, config: ResizeConfig) -> np.ndarray:
    """Resample ``x`` to ``config.out_shape`` (axis by axis; float32 arithmetic for float16/32, float64 for
    float64; nearest copies elements of any dtype)."""
    if x.dtype.kind not in "fiub":
        raise UnsupportedOpError(f"{config.op_type}: X of dtype {x.dtype} is not supported")
    if config.mode != "nearest" and x.dtype.kind != "f":
        raise UnsupportedOpError(
            f"{config.op_type}: {config.mode} resize of {x.dtype} is not supported (float tensors only)"
        )
    if any(d == 0 for d in config.out_shape) or any(d == 0 for d in config.in_shape):
        if any(config.resized(a) and config.in_shape[a] == 0 for a in range(x.ndim)) and all(config.out_shape):
            raise ShapeError(f"{config.op_type}: cannot resize an empty axis to a non-empty one")
        return np.zeros(config.out_shape, dtype=x.dtype)
    compute = np.float64 if x.dtype == np.float64 else F32
    value = x if config.mode == "nearest" else x.astype(compute)
    outside = np.zeros(config.out_shape, dtype=bool)
    for axis in range(x.ndim):
        if not config.resized(axis):
            continue
        index, weights, out_mask = axis_taps(config, axis)
        shape = [1] * x.ndim
        shape[axis] = -1
        outside |= out_mask.reshape(shape)
        if config.mode == "nearest":
            value = np.take(value, index[:, 0], axis=axis)
            continue
        total = None
        for tap in range(index.shape[1]):
            term = np.take(value, index[:, tap], axis=axis) * weights[:, tap].astype(compute).reshape(shape)
            total = term if total is None else total + term
        assert total is not None
        value = total
    if outside.any():
        value = np.where(outside, np.asarray(config.extrapolation).astype(value.dtype), value)
    return np.ascontiguousarray(value.astype(x.dtype))
