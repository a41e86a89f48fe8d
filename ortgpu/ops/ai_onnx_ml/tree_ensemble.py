"""TreeEnsemble-5 (``ai.onnx.ml``): the regressed values of a tree ensemble, ``[N, F] -> [N, n_targets]`` (CPU).

Interior nodes are the ``nodes_*`` tuples (feature, mode, split, true/false child, whether each child is a leaf),
leaves the ``leaf_*`` tuples (target, weight); ``tree_roots`` start each tree.  Each sample walks every tree to one
leaf; a target's leaves are aggregated (SUM, AVERAGE over the trees, MIN or MAX; a target no leaf reached is 0);
``post_transform`` NONE only (see the refusal).  A NaN feature follows the branch ``nodes_missing_value_tracks_true``
names, except at ``BRANCH_NEQ`` (NaN != split is true), as onnxruntime does.  ``BRANCH_MEMBER`` compares the value exactly, as the
spec and its test data do (onnxruntime accepts only integer members and differs on fractional values).
Computed in float64, returned in the input's dtype.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["TreeEnsemble"]

_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_MEMBER")
_MEMBER = 6


def _ints(attrs: Mapping[str, Any], name: str, default: Sequence[int] | None = None) -> list[int]:
    value = attrs.get(name)
    if value is None:
        if default is None:
            raise UnsupportedOpError(f"TreeEnsemble: attribute {name} is required")
        return list(default)
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _floats(attrs: Mapping[str, Any], name: str) -> np.ndarray:
    value = attrs.get(name)
    return np.zeros(0) if value is None else np.asarray(value, dtype=np.float64).reshape(-1)


def _member_sets(attrs: Mapping[str, Any], modes: Sequence[int]) -> dict[int, set[float]]:
    """node index -> its membership set, from ``membership_values`` (sets delimited by NaN, in node order)."""
    members = [i for i, mode in enumerate(modes) if mode == _MEMBER]
    if not members:
        return {}
    values = _floats(attrs, "membership_values")
    groups: list[set[float]] = [set()]
    for value in values:
        if math.isnan(value):
            groups.append(set())
        else:
            groups[-1].add(float(value))
    if groups and not groups[-1] and len(groups) == len(members) + 1:
        groups.pop()  # a trailing delimiter
    if len(groups) != len(members):
        raise ShapeError(
            f"TreeEnsemble: membership_values holds {len(groups)} sets for {len(members)} BRANCH_MEMBER nodes"
        )
    return dict(zip(members, groups))


def _goes_true(mode: int, value: float, split: float, members: set[float] | None) -> bool:
    if mode == 0:
        return value <= split
    if mode == 1:
        return value < split
    if mode == 2:
        return value >= split
    if mode == 3:
        return value > split
    if mode == 4:
        return value == split
    if mode == 5:
        return value != split
    assert members is not None
    return value in members


@register
class TreeEnsemble(Operator):
    """TreeEnsemble-5 (ai.onnx.ml)."""

    op_type = "TreeEnsemble"
    domain = "ai.onnx.ml"
    since_version = 5

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"TreeEnsemble: X must be float16/float32/float64, not {x.dtype}")
        if x.ndim != 2:
            raise ShapeError(f"TreeEnsemble: X must be [N, F], got {x.shape}")
        features = _ints(attrs, "nodes_featureids")
        count = len(features)
        modes = [int(m) for m in np.asarray(attrs.get("nodes_modes", np.zeros(count, np.uint8))).reshape(-1)]
        splits = _floats(attrs, "nodes_splits")
        true_ids, false_ids = _ints(attrs, "nodes_truenodeids"), _ints(attrs, "nodes_falsenodeids")
        true_leaf, false_leaf = _ints(attrs, "nodes_trueleafs"), _ints(attrs, "nodes_falseleafs")
        missing_true = _ints(attrs, "nodes_missing_value_tracks_true", [0] * count)
        roots = _ints(attrs, "tree_roots")
        targets = int(attrs.get("n_targets", 1))
        leaf_targets = _ints(attrs, "leaf_targetids")
        leaf_weights = _floats(attrs, "leaf_weights")
        aggregate = int(attrs.get("aggregate_function", 1))
        transform = int(attrs.get("post_transform", 0))
        if transform != 0:
            # onnxruntime 1.32 numbers them as its older ML operators do (1 LOGISTIC, 2 SOFTMAX), the spec the other
            # way round (1 SOFTMAX, 2 LOGISTIC), and its SOFTMAX_ZERO/PROBIT differ again: no answer to match.
            raise UnsupportedOpError(
                f"TreeEnsemble: post_transform {transform} is not supported (onnxruntime and the ONNX spec disagree "
                "on what it means); use post_transform 0 (NONE) and apply the transform with its own operator"
            )
        lengths = {len(modes), len(true_ids), len(false_ids), len(true_leaf), len(false_leaf), len(missing_true)}
        if lengths != {count} or (any(m != _MEMBER for m in modes) and len(splits) != count):
            raise ShapeError("TreeEnsemble: the nodes_* attributes must all have one entry per node")
        if len(leaf_targets) != len(leaf_weights):
            raise ShapeError("TreeEnsemble: leaf_targetids and leaf_weights must have one entry per leaf")
        if any(m < 0 or m >= len(_MODES) for m in modes):
            raise UnsupportedOpError(f"TreeEnsemble: nodes_modes must be in 0..{len(_MODES) - 1}")
        if any(t < 0 or t >= targets for t in leaf_targets):
            raise ShapeError(f"TreeEnsemble: leaf_targetids must lie in [0, {targets})")
        if aggregate not in (0, 1, 2, 3):
            raise UnsupportedOpError(f"TreeEnsemble: aggregate_function {aggregate} is not one of 0..3")
        if any(f < 0 or f >= x.shape[1] for f in features):
            raise ShapeError(f"TreeEnsemble: a node reads a feature outside [0, {x.shape[1]})")
        members = _member_sets(attrs, modes)
        data = x.astype(np.float64)
        scores = np.zeros((x.shape[0], targets))
        for row in range(x.shape[0]):
            reached: list[list[float]] = [[] for _ in range(targets)]
            for root in roots:
                node, steps = root, 0
                while True:
                    steps += 1
                    if steps > count + 1 or not 0 <= node < count:
                        raise ShapeError("TreeEnsemble: the nodes do not form trees (a cycle or a bad node id)")
                    value = data[row, features[node]]
                    if math.isnan(value):
                        # as onnxruntime: the comparison, or-ed with the missing-value flag (so BRANCH_NEQ,
                        # true for NaN, always goes true)
                        branch = bool(missing_true[node]) or modes[node] == 5
                    else:
                        branch = _goes_true(
                            modes[node], value, splits[node] if modes[node] != _MEMBER else 0.0, members.get(node)
                        )
                    child, is_leaf = (
                        (true_ids[node], true_leaf[node]) if branch else (false_ids[node], false_leaf[node])
                    )
                    if is_leaf:
                        if not 0 <= child < len(leaf_weights):
                            raise ShapeError("TreeEnsemble: a branch names a leaf that does not exist")
                        reached[leaf_targets[child]].append(float(leaf_weights[child]))
                        break
                    node = child
            for target, values in enumerate(reached):
                if not values:
                    continue
                if aggregate == 1:
                    scores[row, target] = sum(values)
                elif aggregate == 0:
                    scores[row, target] = sum(values) / len(roots)
                elif aggregate == 2:
                    scores[row, target] = min(values)
                else:
                    scores[row, target] = max(values)
        return [scores.astype(x.dtype)]
