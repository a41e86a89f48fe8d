"""NonMaxSuppression: greedy selection of high-scoring boxes per batch and class (CPU).

For each (batch, class), boxes scoring above ``score_threshold`` are visited
from the highest score down (ties in box order); a box is selected unless its
IoU with an already selected box is strictly greater than ``iou_threshold``, up
to ``max_output_boxes_per_class`` boxes.  Boxes are ``[y1, x1, y2, x2]`` corners
in either order (``center_point_box=0``) or ``[x_center, y_center, width,
height]`` (``center_point_box=1``).  The output is ``[selected, 3]`` int64 rows
``(batch, class, box)``; its size depends on every input's values, so the node
is planned only where they are known.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["NonMaxSuppression"]


def _scalar(value: np.ndarray | None, default: float, what: str) -> float:
    if value is None or value.size == 0:
        return default
    if value.size != 1:
        raise ShapeError(f"NonMaxSuppression: {what} must be a scalar, got shape {value.shape}")
    return float(np.asarray(value).reshape(-1)[0])


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """``[N, 4]`` boxes as ``(low0, low1, high0, high1)`` in float64."""
    b = boxes.astype(np.float64)
    if center_point_box:
        half_w, half_h = b[:, 2] / 2, b[:, 3] / 2
        return np.stack([b[:, 1] - half_h, b[:, 0] - half_w, b[:, 1] + half_h, b[:, 0] + half_w], axis=1)
    return np.stack(
        [
            np.minimum(b[:, 0], b[:, 2]),
            np.minimum(b[:, 1], b[:, 3]),
            np.maximum(b[:, 0], b[:, 2]),
            np.maximum(b[:, 1], b[:, 3]),
        ],
        axis=1,
    )


def _suppressed(box: np.ndarray, others: np.ndarray, threshold: float) -> bool:
    """Whether ``box`` overlaps one of ``others`` (rows of corners) with IoU above ``threshold``."""
    if others.size == 0:
        return False
    low = np.maximum(box[:2], others[:, :2])
    high = np.minimum(box[2:], others[:, 2:])
    extent = np.clip(high - low, 0.0, None)
    intersection = extent[:, 0] * extent[:, 1]
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - intersection
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where((intersection > 0) & (union > 0), intersection / union, 0.0)
    return bool((iou > threshold).any())


def non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_per_class: int,
    iou_threshold: float,
    score_threshold: float | None,
    center_point_box: int,
) -> np.ndarray:
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ShapeError(f"NonMaxSuppression: boxes must be [batch, boxes, 4], got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ShapeError(f"NonMaxSuppression: scores {scores.shape} do not match boxes {boxes.shape}")
    rows: list[tuple[int, int, int]] = []
    if max_per_class <= 0:
        return np.zeros((0, 3), dtype=np.int64)
    for batch in range(boxes.shape[0]):
        corners = _corners(boxes[batch], center_point_box)
        for cls in range(scores.shape[1]):
            score = scores[batch, cls].astype(np.float64)
            candidates = np.arange(score.size)
            if score_threshold is not None:
                candidates = candidates[score > score_threshold]
            order = candidates[np.argsort(-score[candidates], kind="stable")]
            chosen: list[int] = []
            for box in order:
                if len(chosen) >= max_per_class:
                    break
                if not _suppressed(corners[box], corners[chosen], iou_threshold):
                    chosen.append(int(box))
            rows.extend((batch, cls, box) for box in chosen)
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


@register
class NonMaxSuppression(Operator):
    op_type = "NonMaxSuppression"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        boxes, scores = inputs[0], inputs[1]
        assert boxes is not None and scores is not None
        extra = list(inputs[2:]) + [None] * (5 - len(inputs))
        center_point_box = int(attrs.get("center_point_box", 0))
        if center_point_box not in (0, 1):
            raise UnsupportedOpError(f"NonMaxSuppression: center_point_box {center_point_box} (0 or 1 expected)")
        max_per_class = int(_scalar(extra[0], 0, "max_output_boxes_per_class"))
        iou_threshold = _scalar(extra[1], 0.0, "iou_threshold")
        score_threshold = None if extra[2] is None or extra[2].size == 0 else _scalar(extra[2], 0.0, "score_threshold")
        if score_threshold is not None:
            # Scores are float32: compare against the threshold as float32, as onnxruntime does.
            score_threshold = float(np.float32(score_threshold))
        return [non_max_suppression(boxes, scores, max_per_class, iou_threshold, score_threshold, center_point_box)]
