"""StridedView: each step gives the elements numpy's own view operations give, and refuses exactly the reshapes
numpy can only make by copying."""

from __future__ import annotations

import numpy as np
import pytest

from ortgpu._strided_view import StridedView


def _read(source: np.ndarray, view: StridedView) -> np.ndarray:
    flat = source.reshape(-1)
    strides = tuple(s * flat.itemsize for s in view.strides)
    return np.lib.stride_tricks.as_strided(flat[view.offset :], view.shape, strides).copy()


def _is_view(array: np.ndarray, shape: tuple[int, ...]) -> bool:
    """Whether numpy reshapes ``array`` to ``shape`` without copying."""
    try:
        reshaped = array.view()
        reshaped.shape = shape  # raises where a copy would be needed
    except AttributeError:
        return False
    return True


def test_the_multihead_attention_split_reads_the_packed_projection_in_place() -> None:
    # nn.MultiheadAttention at batch 1: [S, B, 3E] -> [S, B, 3, E] -> unsqueeze 0 -> transpose (3,1,2,0,4)
    # -> squeeze -2 -> select i -> [S, B*H, D] -> transpose (1,0,2) -> [B, H, S, D]
    s, b, h, d = 5, 1, 4, 8
    e = h * d
    packed = np.arange(s * b * 3 * e, dtype=np.float32).reshape(s, b, 3 * e)
    for index in range(3):
        expected = (
            packed.reshape(s, b, 3, e)[None].transpose(3, 1, 2, 0, 4).squeeze(-2)[index]
            .reshape(s, b * h, d).transpose(1, 0, 2).reshape(b, h, s, d)
        )  # fmt: skip
        view = StridedView.contiguous(packed.shape).reshape((s, b, 3, e))
        assert view is not None
        view = view.unsqueeze([0])
        assert view is not None
        view = view.transpose((3, 1, 2, 0, 4)).squeeze([-2])
        assert view is not None
        view = view.select(0, index)
        assert view is not None
        view = view.reshape((s, b * h, d))
        assert view is not None
        view = view.transpose((1, 0, 2)).reshape((b, h, s, d))
        assert view is not None and view.offset == index * e
        np.testing.assert_array_equal(_read(packed, view), expected)


def test_merging_axes_apart_in_memory_is_refused() -> None:
    # at batch 2 the [S, B*H, D] reshape merges B (stride 3E) with H (stride D): not one strided axis
    view = StridedView.contiguous((5, 2, 3, 32)).select(2, 1)
    assert view is not None
    assert view.reshape((5, 8, 8)) is None
    assert view.reshape((5, 2, 4, 8)) is not None


@pytest.mark.parametrize("seed", range(200))
def test_random_chains_match_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 5))
    shape = tuple(int(x) for x in rng.choice([1, 2, 3, 4, 6], size=rank))
    source = rng.standard_normal(shape).astype(np.float32)
    array = source
    view: StridedView | None = StridedView.contiguous(shape)
    for _ in range(5):
        assert view is not None
        kind = rng.choice(["transpose", "reshape", "select", "squeeze", "unsqueeze"])
        if kind == "transpose":
            perm = tuple(int(a) for a in rng.permutation(array.ndim))
            array, view = array.transpose(perm), view.transpose(perm)
        elif kind == "reshape":
            sizes = list(np.asarray(array.shape, dtype=np.int64))
            flat = [f for size in sizes for f in _factors(int(size))]
            rng.shuffle(flat)
            cut = sorted(int(c) for c in rng.integers(0, len(flat) + 1, size=int(rng.integers(0, 3))))
            groups = np.split(np.asarray(flat, dtype=np.int64), cut) if flat else [np.asarray([1])]
            new = tuple(int(np.prod(g)) for g in groups)
            new = new if int(np.prod(new)) == array.size else (array.size,)
            stepped = view.reshape(new)
            if _is_view(array, new):
                assert stepped is not None, (array.shape, array.strides, new, view)
            if stepped is None:
                return  # a copy would be needed: the chain stops here
            array, view = array.reshape(new), stepped
        elif kind == "select":
            if array.ndim == 0:
                continue
            axis = int(rng.integers(0, array.ndim))
            index = int(rng.integers(0, array.shape[axis]))
            selected = view.select(axis, index)
            assert selected is not None
            array, view = array[(slice(None),) * axis + (index,)], selected
        elif kind == "squeeze":
            squeezed = view.squeeze([])
            assert squeezed is not None
            array, view = array.squeeze(), squeezed
        else:
            axis = int(rng.integers(0, array.ndim + 1))
            grown = view.unsqueeze([axis])
            assert grown is not None
            array, view = np.expand_dims(array, axis), grown
        assert view.shape == array.shape
        np.testing.assert_array_equal(_read(source, view), array)


def _factors(n: int) -> list[int]:
    out, k = [], 2
    while n > 1:
        while n % k == 0:
            out.append(k)
            n //= k
        k += 1
    return out


def test_narrow_matches_slicing() -> None:
    source = np.arange(5 * 12, dtype=np.float32).reshape(5, 12)
    view = StridedView.contiguous(source.shape).narrow(1, 2, 4, 3)
    assert view is not None
    np.testing.assert_array_equal(_read(source, view), source[:, 2:12:3])
    empty = StridedView.contiguous(source.shape).narrow(0, 5, 0)
    assert empty is not None and empty.shape == (0, 12)


def test_expand_broadcasts_with_stride_zero() -> None:
    source = np.arange(2 * 3, dtype=np.float32).reshape(2, 1, 3)
    view = StridedView.contiguous(source.shape).expand((4, 2, 5, 3))
    assert view is not None and view.strides[0] == view.strides[2] == 0
    np.testing.assert_array_equal(_read(source, view), np.broadcast_to(source, (4, 2, 5, 3)))
    assert view.reshape((4, 10, 3)) is None  # merging a repeated axis with another is no strided view
    assert StridedView.contiguous((2, 3)).expand((4, 3)) is None


def test_steps_out_of_range_are_refused() -> None:
    assert StridedView.contiguous((2, 3)).narrow(1, 1, 2, 2) is None  # 1, 3: past the axis
    assert StridedView.contiguous((2, 3)).narrow(1, 0, 1, 0) is None
    view = StridedView.contiguous((2, 3))
    assert view.select(1, 3) is None
    assert view.select(1, -1) == StridedView((2,), (3,), 2)
    assert view.squeeze([0]) is None
    assert view.reshape((7,)) is None
    assert view.unsqueeze([0, 0]) is None
    assert StridedView.contiguous((2, 3)).is_contiguous
    assert not view.transpose((1, 0)).is_contiguous
