"""TfIdfVectorizer: counts of the pool's n-grams in integer sequences, optionally IDF-weighted (CPU).

An n-gram with skip ``s`` takes every ``(s + 1)``-th token; every skip from 0 to
``max_skip_count`` and every length from ``min_gram_length`` to
``max_gram_length`` is counted (unigrams once: skips do not change them).  The
i-th n-gram of the pool (``pool_int64s``, grouped by length as ``ngram_counts``
says) is counted at output position ``ngram_indexes[i]`` and weighted by
``weights[i]``.  String pools and inputs (dtypes numpy cannot compute with here)
are refused.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["TfIdfVectorizer"]


def _pool(attrs: Mapping[str, Any], max_gram: int) -> dict[tuple[int, ...], int]:
    """n-gram -> its ordinal in the pool."""
    pool = [int(v) for v in attrs.get("pool_int64s", [])]
    starts = [int(v) for v in attrs.get("ngram_counts", [])]
    found: dict[tuple[int, ...], int] = {}
    ordinal = 0
    for group, start in enumerate(starts):
        n = group + 1
        end = starts[group + 1] if group + 1 < len(starts) else len(pool)
        if (end - start) % n:
            raise ShapeError(f"TfIdfVectorizer: pool entries {start}..{end} do not split into {n}-grams")
        for offset in range(start, end, n):
            gram = tuple(pool[offset : offset + n])
            if gram in found:
                # onnxruntime refuses such pools too (which count would the output hold?)
                raise ShapeError(f"TfIdfVectorizer: the n-gram {gram} appears twice in pool_int64s")
            found[gram] = ordinal
            ordinal += 1
    return found


def _count_row(tokens: Sequence[int], pool: Mapping[tuple[int, ...], int], grams: range, skips: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for n in grams:
        for skip in range(skips + 1 if n > 1 else 1):
            step = skip + 1
            for start in range(len(tokens) - (n - 1) * step):
                ordinal = pool.get(tuple(tokens[start : start + (n - 1) * step + 1 : step]))
                if ordinal is not None:
                    counts[ordinal] = counts.get(ordinal, 0) + 1
    return counts


@register
class TfIdfVectorizer(Operator):
    op_type = "TfIdfVectorizer"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if "pool_strings" in attrs or x.dtype.kind not in "iu":
            raise UnsupportedOpError(
                f"TfIdfVectorizer: only integer inputs with pool_int64s are supported (input {x.dtype})"
            )
        if x.ndim not in (1, 2):
            raise ShapeError(f"TfIdfVectorizer: the input must be 1-D or 2-D, got shape {x.shape}")
        mode = str(attrs.get("mode", "TF"))
        if mode not in ("TF", "IDF", "TFIDF"):
            raise UnsupportedOpError(f"TfIdfVectorizer: mode {mode!r} (TF, IDF or TFIDF expected)")
        min_gram, max_gram = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
        skips = int(attrs["max_skip_count"])
        if not 1 <= min_gram <= max_gram:
            raise UnsupportedOpError(f"TfIdfVectorizer: gram lengths {min_gram}..{max_gram}")
        indexes = [int(v) for v in attrs["ngram_indexes"]]
        weights = np.asarray(attrs.get("weights", [1.0] * len(indexes)), dtype=np.float32)
        pool = _pool(attrs, max_gram)
        if len(indexes) < len(pool) or (mode != "TF" and weights.size < len(indexes)):
            raise ShapeError("TfIdfVectorizer: ngram_indexes/weights are shorter than the pool")
        width = max(indexes) + 1 if indexes else 0
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        output = np.zeros((rows.shape[0], width), dtype=np.float32)
        for r, row in enumerate(rows):
            for ordinal, count in _count_row([int(t) for t in row], pool, range(min_gram, max_gram + 1), skips).items():
                if mode == "TF":
                    value = np.float32(count)
                elif mode == "IDF":
                    value = weights[ordinal]
                else:
                    # The weight added once per occurrence in float32, as onnxruntime sums it (not count * weight,
                    # which can differ in the last bit).
                    value = np.float32(0)
                    for _ in range(count):
                        value = np.float32(value + weights[ordinal])
                output[r, indexes[ordinal]] = value
        return [output.reshape(width) if x.ndim == 1 else output]
