"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both take scores of shape ``(N, C, d1, ..., dk)`` and class labels of shape ``(N, d1, ..., dk)``, an optional
per-class ``weight`` of shape ``(C,)``, an optional ``ignore_index`` (a label value whose samples contribute
nothing, neither loss nor weight; it may be negative or outside ``[0, C)``) and ``reduction``:

* ``none``: the per-sample losses, shape ``(N, d1, ..., dk)``;
* ``sum``: their sum (a scalar);
* ``mean`` (the default): their sum divided by the sum of the weights of the samples that count (without
  ``weight``, by the number of samples whose label is not ``ignore_index``).

SoftmaxCrossEntropyLoss applies LogSoftmax over axis 1 first and may also return those log-probabilities.

The reference gathers with numpy, in float64 for float inputs, and raises :class:`InvalidArgumentError` for a
label outside ``[0, C)`` that is not ``ignore_index`` (onnxruntime refuses such labels too).

The device plan (float32 scores and weights, int32/int64 labels) runs one invocation per sample: the log-softmax
of its C scores where needed (also written out as ``log_prob``), then its loss and weight, written to the output
(``none``) or to a scratch buffer that a second kernel, one workgroup, sums (``sum``) and divides by the summed
weights (``mean``).  A label that is out of range gives NaN there and flags the run in the program's status words,
so the run raises ``InvalidArgumentError`` as the reference does (its twin flags the same way); int64 labels are
compared on both words.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    Operator,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    flagging_twin,
)
from .._registry import register
from .._tiling import THREADS, workgroup_reduce_functions
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_count,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    storage_declaration,
    workgroup_size_for,
)
from .trigonometric import MATH_WGSL

__all__ = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "negative_log_likelihood"]


_REDUCTIONS = ("none", "sum", "mean")


def _reduction(op_type: str, attrs: Mapping[str, Any]) -> str:
    reduction = attrs.get("reduction", "mean")
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction not in _REDUCTIONS:
        raise UnsupportedOpError(f"{op_type}: reduction {reduction!r} is not one of {', '.join(_REDUCTIONS)}")
    return str(reduction)


def _check_shapes(op_type: str, scores: np.ndarray, labels: np.ndarray, weight: np.ndarray | None) -> None:
    if scores.ndim < 2:
        raise ShapeError(f"{op_type}: the scores must have rank 2 or more (N, C, ...), got shape {scores.shape}")
    expected = scores.shape[:1] + scores.shape[2:]
    if labels.shape != expected:
        raise ShapeError(f"{op_type}: labels of shape {labels.shape} do not match scores {scores.shape}")
    if weight is not None and weight.shape != (scores.shape[1],):
        raise ShapeError(f"{op_type}: weight of shape {weight.shape} does not match C = {scores.shape[1]}")
    if labels.dtype.kind not in "iu":
        raise UnsupportedOpError(f"{op_type}: labels must be int32 or int64, not {labels.dtype}")


def negative_log_likelihood(
    op_type: str,
    log_prob: np.ndarray,
    labels: np.ndarray,
    weight: np.ndarray | None,
    ignore_index: int | None,
    reduction: str,
    dtype: np.dtype[Any],
) -> np.ndarray:
    """The loss of ``log_prob`` (float64, ``(N, C, ...)``) against ``labels``, as ``dtype``."""
    classes = log_prob.shape[1]
    target = labels.astype(np.int64)
    ignored = target == ignore_index if ignore_index is not None else np.zeros(target.shape, dtype=bool)
    bad = ~ignored & ((target < 0) | (target >= classes))
    if np.any(bad):
        value = int(target[bad][0])
        raise InvalidArgumentError(
            f"{op_type}: label {value} is outside [0, {classes - 1}] and is not ignore_index ({ignore_index})"
        )
    safe = np.where(ignored, 0, target)
    # picked[n, d...] = log_prob[n, safe[n, d...], d...]
    if classes == 0:
        picked = np.zeros(target.shape)  # every label is ignore_index (checked above): nothing to pick
    else:
        picked = np.take_along_axis(log_prob, np.expand_dims(safe, 1), axis=1).squeeze(1)
    sample_weight = np.ones(target.shape) if weight is None else weight.astype(np.float64)[safe]
    sample_weight = np.where(ignored, 0.0, sample_weight)
    loss = -picked * sample_weight
    if reduction == "none":
        return loss.astype(dtype)
    total = np.sum(loss)
    if reduction == "sum":
        return np.asarray(total, dtype=dtype)
    if target.size == 0:
        return np.zeros((), dtype=dtype)  # no samples at all: 0, as onnxruntime gives (not 0 / 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Every sample ignored (or a zero total weight): 0 / 0, NaN, as onnxruntime and PyTorch give.
        return np.asarray(total / np.sum(sample_weight), dtype=dtype)


def _ignore_index(attrs: Mapping[str, Any]) -> int | None:
    value = attrs.get("ignore_index")
    return None if value is None else int(value)


def _require_float(op_type: str, x: np.ndarray) -> None:
    if x.dtype.kind != "f":
        raise UnsupportedOpError(f"{op_type}: scores must be float16, float32 or float64, not {x.dtype}")


@register
class NegativeLogLikelihoodLoss(Operator):
    """NegativeLogLikelihoodLoss-12/13/22 (the versions differ only in the dtypes they allow)."""

    op_type = "NegativeLogLikelihoodLoss"
    since_version = 12

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, target = inputs[0], inputs[1]
        assert x is not None and target is not None
        weight = inputs[2] if len(inputs) > 2 else None
        _require_float(self.op_type, x)
        _check_shapes(self.op_type, x, target, weight)
        reduction = _reduction(self.op_type, attrs)
        loss = negative_log_likelihood(
            self.op_type, x.astype(np.float64), target, weight, _ignore_index(attrs), reduction, x.dtype
        )
        return [loss]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        return plan_loss(self.op_type, False, inputs, outputs, attrs, caps)


@register
class SoftmaxCrossEntropyLoss(Operator):
    """SoftmaxCrossEntropyLoss-12/13: LogSoftmax over axis 1, then the negative log likelihood; output 1 (optional)
    is the log-probabilities."""

    op_type = "SoftmaxCrossEntropyLoss"
    since_version = 12

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        scores, labels = inputs[0], inputs[1]
        assert scores is not None and labels is not None
        weight = inputs[2] if len(inputs) > 2 else None
        _require_float(self.op_type, scores)
        _check_shapes(self.op_type, scores, labels, weight)
        reduction = _reduction(self.op_type, attrs)
        wide = scores.astype(np.float64)
        peak = np.max(wide, axis=1, keepdims=True, initial=-np.inf)
        shifted = wide - np.where(np.isfinite(peak), peak, 0.0)
        log_prob = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
        loss = negative_log_likelihood(
            self.op_type, log_prob, labels, weight, _ignore_index(attrs), reduction, scores.dtype
        )
        results = [loss]
        if len(outputs) > 1:
            results.append(log_prob.astype(scores.dtype))
        return results

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        return plan_loss(self.op_type, True, inputs, outputs, attrs, caps)


def _sample_weights(labels: np.ndarray, weight: np.ndarray | None, ignore_index: int | None) -> np.ndarray:
    """Each sample's weight (0 where ignored) in float64; labels already validated."""
    target = labels.astype(np.int64)
    ignored = target == ignore_index if ignore_index is not None else np.zeros(target.shape, dtype=bool)
    safe = np.where(ignored, 0, target)
    weights = np.ones(target.shape) if weight is None else weight.astype(np.float64)[safe]
    return np.where(ignored, 0.0, weights)


def plan_loss(
    op_type: str,
    softmax: bool,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    attrs: Mapping[str, Any],
    caps: DeviceCaps,
) -> OpPlan:
    """The device plan of NegativeLogLikelihoodLoss (``softmax`` False) or SoftmaxCrossEntropyLoss."""
    x, labels = inputs[0], inputs[1]
    assert x is not None and labels is not None
    weight = inputs[2] if len(inputs) > 2 else None
    reduction = _reduction(op_type, attrs)
    ignore_index = _ignore_index(attrs)
    for info in [x, weight, *outputs]:
        if info is not None and info.dtype != np.float32:
            raise NotOnDevice(f"{op_type}: the WebGPU kernel computes float32 only, not {info.dtype}")
    if labels.dtype.name not in ("int32", "int64"):
        raise NotOnDevice(f"{op_type}: labels of {labels.dtype} run on the CPU")
    if len(x.shape) < 2 or labels.shape != x.shape[:1] + x.shape[2:]:
        raise ShapeError(f"{op_type}: labels of shape {labels.shape} do not match scores {x.shape}")
    classes = x.shape[1]
    inner = element_count(x.shape[2:])
    samples = element_count(labels.shape)
    if samples == 0 or classes == 0:
        raise NotOnDevice(f"{op_type}: empty scores run on the CPU")
    check_loop_budget(op_type, 3 * classes if softmax else 1, caps)
    log_prob = softmax and len(outputs) > 1 and outputs[1].shape == x.shape
    reduce = reduction != "none"
    if reduce:
        check_loop_budget(op_type, -(-samples // THREADS) + 2 * THREADS.bit_length(), caps)
    pair = labels.dtype.itemsize == 8

    # bindings of the per-sample kernel
    bindings: list[Binding] = [Binding("input", 0), Binding("input", 1)]
    names = ["scores", "labels"]
    if weight is not None:
        bindings.append(Binding("input", 2))
        names.append("weights")
    bindings.append(Binding("scratch", 0) if reduce else Binding("output", 0))
    names.append("losses")
    if log_prob:
        bindings.append(Binding("output", 1))
        names.append("log_prob")
    # A label neither in [0, C) nor ignore_index flags the run (it raises InvalidArgumentError, as the reference).
    bindings.append(Binding("status"))
    check_binding_count(op_type, len(bindings), caps)
    check_binding_sizes(op_type, [x, labels, weight, *outputs], caps)
    declarations = (
        "".join(
            storage_declaration(slot, name, writable=name in ("losses", "log_prob")) for slot, name in enumerate(names)
        )
        + f"@group(0) @binding({len(names)}) var<storage, read_write> status: array<atomic<u32>>;\n"
    )
    # label of sample s: (value as i32 clamped into [0, C), valid, ignored)
    if pair:
        low, high = (0, 1) if ignore_index is None else (ignore_index & 0xFFFFFFFF, (ignore_index >> 32) & 0xFFFFFFFF)
        label_code = (
            "  let raw = vec2<u32>(labels[2u * s], labels[2u * s + 1u]);\n"
            f"  let valid = raw.y == 0u && raw.x < {classes}u;\n"
            + (
                "  let ignored = false;\n"
                if ignore_index is None
                else f"  let ignored = raw.x == {low}u && raw.y == {high}u;\n"
            )
            + "  let c = select(0u, raw.x, valid);\n"
        )
    else:
        in_range = ignore_index is not None and -(2**31) <= ignore_index < 2**31
        label_code = (
            "  let raw = bitcast<i32>(labels[s]);\n"
            f"  let valid = raw >= 0 && raw < {classes};\n"
            + (f"  let ignored = raw == i32({ignore_index});\n" if in_range else "  let ignored = false;\n")
            + "  let c = select(0u, u32(raw), valid);\n"
        )
    score = "bitcast<f32>(scores[base + k * INNER])"
    softmax_code = ""
    log_probability = score
    if softmax:
        softmax_code = (
            # The largest score's own term (exactly 1) stays out of the sum: a confident sample's loss is
            # log(1 + rest) with rest tiny, which log(total) of a float32 total near 1 would lose.
            "  var m = bitcast<f32>(0xff800000u);\n  var top = 0u;\n"
            f"  for (var k = 0u; k < {classes}u; k = k + 1u) {{ if ({score} > m) {{ m = {score}; top = k; }} }}\n"
            "  var rest = 0.0;\n"
            f"  for (var k = 0u; k < {classes}u; k = k + 1u) {{\n"
            f"    if (k != top) {{ rest = rest + exp({score} - m); }}\n"
            "  }\n"
            "  let spread = log1p_f32(rest);\n"
        )
        log_probability = f"({score} - m) - spread"  # m + spread first would round the spread away
        if log_prob:
            softmax_code += (
                f"  for (var k = 0u; k < {classes}u; k = k + 1u) {{\n"
                f"    log_prob[base + k * INNER] = bitcast<u32>({log_probability});\n"
                "  }\n"
            )
    weight_code = "bitcast<f32>(weights[c])" if weight is not None else "1.0"
    store = (
        "  losses[s] = bitcast<u32>(loss);\n  losses[SAMPLES + s] = bitcast<u32>(w);\n"
        if reduce
        else "  losses[s] = bitcast<u32>(loss);\n"
    )
    body = (
        f"  let s = {LINEAR_INVOCATION};\n"
        "  if (s >= SAMPLES) { return; }\n"
        "  let base = (s / INNER) * CLASSES * INNER + s % INNER;\n" + label_code + softmax_code + "  let k = c;\n"
        f"  let picked = {log_probability};\n"
        "  if (!valid && !ignored) { atomicOr(&status[0], 1u); }\n"
        f"  let nan = bitcast<f32>(0x7fc00000u);\n"
        f"  let w = select(select(nan, {weight_code}, valid), 0.0, ignored);\n"
        "  let loss = select(select(nan, -picked * w, valid), 0.0, ignored);\n" + store
    )
    workgroup = workgroup_size_for(caps.limits)
    constants = f"const SAMPLES: u32 = {samples}u;\nconst INNER: u32 = {inner}u;\nconst CLASSES: u32 = {classes}u;\n"
    wgsl = declarations + constants + (MATH_WGSL if softmax else "") + kernel_entry(workgroup, body)
    kernel_bindings = tuple(bindings)
    x_info, labels_info, weight_info = x, labels, weight

    def per_sample_twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        scores = arrays[0][: x_info.nbytes].view(np.float32).reshape(x_info.shape)
        label_values = arrays[1][: labels_info.nbytes].view(labels_info.dtype).reshape(labels_info.shape)
        slot = 2
        weight_values = None
        if weight_info is not None:
            weight_values = arrays[2][: weight_info.nbytes].view(np.float32).reshape(weight_info.shape)
            slot = 3
        wide = scores.astype(np.float64)
        if softmax:
            peak = np.max(wide, axis=1, keepdims=True)
            shifted = wide - np.where(np.isfinite(peak), peak, 0.0)
            wide = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
        loss = negative_log_likelihood(
            op_type, wide, label_values, weight_values, ignore_index, "none", np.dtype(np.float32)
        )
        values = loss.reshape(-1)
        if reduce:
            weights = _sample_weights(label_values, weight_values, ignore_index).astype(np.float32).reshape(-1)
            values = np.concatenate([values, weights])
        arrays[slot][: values.nbytes] = values.view(np.uint8)
        if log_prob:
            lp = wide.astype(np.float32).reshape(-1)
            arrays[slot + 1][: lp.nbytes] = lp.view(np.uint8)

    twin = flagging_twin(per_sample_twin, kernel_bindings)
    kernels = [KernelSpec(op_type, wgsl, grid_for(samples, workgroup, caps.limits), kernel_bindings, twin)]
    if not reduce:
        return OpPlan(kernels=tuple(kernels))
    finish = "a" if reduction == "sum" else "a / b"
    reduce_wgsl = (
        storage_declaration(0, "losses", writable=False)
        + storage_declaration(1, "dst", writable=True)
        + f"const SAMPLES: u32 = {samples}u;\nconst T: u32 = {THREADS}u;\n"
        + workgroup_reduce_functions(THREADS)
        + f"""@compute @workgroup_size({THREADS})
fn main(@builtin(local_invocation_index) t: u32) {{
    var a = 0.0;
    var b = 0.0;
    for (var i = t; i < SAMPLES; i = i + T) {{
        a = a + bitcast<f32>(losses[i]);
        b = b + bitcast<f32>(losses[SAMPLES + i]);
    }}
    let a_total = wg_sum(a, t, 0u);
    let b_total = wg_sum(b, t, 0u);
    if (t == 0u) {{
        let a = a_total;
        let b = b_total;
        dst[0] = bitcast<u32>({finish});
    }}
}}
"""
    )

    def reduce_twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        values = arrays[0][: 8 * samples].view(np.float32).astype(np.float64)
        total, weights = np.sum(values[:samples]), np.sum(values[samples:])
        with np.errstate(divide="ignore", invalid="ignore"):
            result = np.float32(total if reduction == "sum" else total / weights)
        arrays[1][:4] = np.asarray([result], dtype=np.float32).view(np.uint8)

    kernels.append(
        KernelSpec(op_type, reduce_wgsl, (1, 1, 1), (Binding("scratch", 0), Binding("output", 0)), reduce_twin)
    )
    return OpPlan(kernels=tuple(kernels), scratch_sizes=(8 * samples,))
