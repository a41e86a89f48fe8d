"""A tensor read in place through data-movement nodes: shape, strides and offset over a contiguous source.

Exporters put chains of Reshape, Transpose, Squeeze, Unsqueeze and index Gathers between a projection and the
kernel that reads it (torch's ``nn.MultiheadAttention`` splits its packed Q/K/V with a Reshape, a Transpose, a
Squeeze, a Gather per operand and a Reshape/Transpose/Reshape per head).  Each such node only says where the
elements are; a kernel that reads through element strides and an offset can read the chain's source instead, and
the copies the nodes would make disappear.  :class:`StridedView` is that arithmetic, and nothing else: each method
returns the view after one node, or None where the result is not one strided view of the source (a Reshape that
merges axes which are not adjacent in memory), so a caller stops the chain there.

Strides and offset count elements. The stride of a size-1 axis is arbitrary (it is never stepped along); a broadcast
axis (Expand) has stride 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["StridedView"]


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class StridedView:
    """Element ``index`` of the view is element ``offset + sum(index * strides)`` of the flat source."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @classmethod
    def contiguous(cls, shape: Sequence[int]) -> StridedView:
        """The source itself, C-contiguous."""
        return cls(tuple(int(s) for s in shape), _contiguous_strides(shape), 0)

    @property
    def is_contiguous(self) -> bool:
        """Whether the view is the first elements of the source in C order (the source read as it lies)."""
        return self.offset == 0 and all(
            size == 1 or stride == want
            for size, stride, want in zip(self.shape, self.strides, _contiguous_strides(self.shape))
        )

    def transpose(self, perm: Sequence[int]) -> StridedView:
        """Axis ``i`` of the result is axis ``perm[i]`` of this view."""
        return StridedView(tuple(self.shape[a] for a in perm), tuple(self.strides[a] for a in perm), self.offset)

    def select(self, axis: int, index: int) -> StridedView | None:
        """Element ``index`` of ``axis`` (the axis dropped), as Gather with a scalar index takes it."""
        size = self.shape[axis]
        if not -size <= index < size:
            return None
        index %= size
        return StridedView(
            self.shape[:axis] + self.shape[axis + 1 :],
            self.strides[:axis] + self.strides[axis + 1 :],
            self.offset + index * self.strides[axis],
        )

    def expand(self, shape: Sequence[int]) -> StridedView | None:
        """Broadcast to ``shape`` (numpy's rule, as Expand takes it): size-1 axes repeat with stride 0, new leading
        axes too."""
        target = tuple(int(s) for s in shape)
        rank = max(len(target), len(self.shape))
        own = (1,) * (rank - len(self.shape)) + self.shape
        strides = (0,) * (rank - len(self.shape)) + self.strides
        want = (1,) * (rank - len(target)) + target
        out_shape, out_strides = [], []
        for size, stride, wanted in zip(own, strides, want):
            if size == wanted or wanted == 1:
                out_shape.append(size)
                out_strides.append(stride)
            elif size == 1:
                out_shape.append(wanted)
                out_strides.append(0)
            else:
                return None
        return StridedView(tuple(out_shape), tuple(out_strides), self.offset)

    def narrow(self, axis: int, start: int, length: int, step: int = 1) -> StridedView | None:
        """Elements ``start, start + step, ...`` (``length`` of them) of ``axis``, as Slice and Split take them."""
        size = self.shape[axis]
        if step < 1 or length < 0 or not 0 <= start <= size or (length and start + (length - 1) * step >= size):
            return None
        shape = self.shape[:axis] + (length,) + self.shape[axis + 1 :]
        strides = self.strides[:axis] + (self.strides[axis] * step,) + self.strides[axis + 1 :]
        return StridedView(shape, strides, self.offset + (start * self.strides[axis] if length else 0))

    def reshape(self, shape: Sequence[int]) -> StridedView | None:
        """The same elements in C order under ``shape``, where that is one strided view: every group of axes merged
        or split must be adjacent in memory (numpy's rule for a reshape without a copy)."""
        new = tuple(int(s) for s in shape)
        if any(s < 0 for s in new) or _product(new) != _product(self.shape):
            return None
        if _product(new) == 0:
            return None  # nothing is read: no caller needs the view of an empty tensor
        old = [(s, st) for s, st in zip(self.shape, self.strides) if s != 1]
        strides: list[int] = []
        i = 0  # the next axis of ``old``
        j = 0  # the next axis of ``new``
        while j < len(new):
            if new[j] == 1:
                strides.append(0)
                j += 1
                continue
            # the smallest run of old axes and new axes (size-1 new axes skipped) with equal products
            old_end, new_end = i + 1, j + 1
            old_size, new_size = old[i][0], new[j]
            while old_size != new_size:
                if old_size < new_size:
                    old_size *= old[old_end][0]
                    old_end += 1
                else:
                    new_size *= new[new_end]
                    new_end += 1
            for k in range(i, old_end - 1):  # the old run must be one contiguous block
                if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                    return None
            step = old[old_end - 1][1]
            group: list[int] = []
            for size in reversed(new[j:new_end]):
                group.append(step if size != 1 else 0)
                step *= size
            strides.extend(reversed(group))
            i, j = old_end, new_end
        # size-1 axes: the stride the contiguous layout would give them (never stepped along)
        fixed = [st if size != 1 else 0 for size, st in zip(new, strides)]
        for k in range(len(new) - 1, -1, -1):
            if new[k] == 1:
                fixed[k] = fixed[k + 1] * new[k + 1] if k + 1 < len(new) else 1
        return StridedView(new, tuple(fixed), self.offset)

    def squeeze(self, axes: Sequence[int]) -> StridedView | None:
        """Without the size-1 ``axes`` (all size-1 axes where ``axes`` is empty)."""
        rank = len(self.shape)
        drop = {a % rank for a in axes} if axes else {a for a, s in enumerate(self.shape) if s == 1}
        if any(self.shape[a] != 1 for a in drop):
            return None
        keep = [a for a in range(rank) if a not in drop]
        return StridedView(tuple(self.shape[a] for a in keep), tuple(self.strides[a] for a in keep), self.offset)

    def unsqueeze(self, axes: Sequence[int]) -> StridedView | None:
        """With size-1 axes inserted at ``axes`` (positions in the result)."""
        rank = len(self.shape) + len(axes)
        where = {a % rank for a in axes}
        if len(where) != len(axes):
            return None
        shape, strides = list(self.shape), list(self.strides)
        for axis in sorted(where):
            shape.insert(axis, 1)
            strides.insert(axis, 0)
        return StridedView(tuple(shape), tuple(strides), self.offset).reshape(shape)


def _product(values: Sequence[int]) -> int:
    result = 1
    for value in values:
        result *= int(value)
    return result
