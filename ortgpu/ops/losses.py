"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (CPU references).

Both take scores of shape ``(N, C, d1, ..., dk)`` and class labels of shape ``(N, d1, ..., dk)``, an optional
per-class ``weight`` of shape ``(C,)``, an optional ``ignore_index`` (a label value whose samples contribute
nothing, neither loss nor weight; it may be negative or outside ``[0, C)``) and ``reduction``:

* ``none``: the per-sample losses, shape ``(N, d1, ..., dk)``;
* ``sum``: their sum (a scalar);
* ``mean`` (the default): their sum divided by the sum of the weights of the samples that count (without
  ``weight``, by the number of samples whose label is not ``ignore_index``).

SoftmaxCrossEntropyLoss applies LogSoftmax over axis 1 first and may also return those log-probabilities.

Both run on the CPU: the reference gathers with numpy, in float64 for float inputs, and raises
:class:`InvalidArgumentError` for a label outside ``[0, C)`` that is not ``ignore_index`` (onnxruntime refuses such
labels too).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._registry import register

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
        raise NotOnDevice(f"{self.op_type} runs on the CPU (no WebGPU kernel; it validates labels on the host)")


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
        raise NotOnDevice(f"{self.op_type} runs on the CPU (no WebGPU kernel; it validates labels on the host)")
