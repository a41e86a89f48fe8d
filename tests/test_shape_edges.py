"""Operators at the edges of their shape rules (issue 12): zero-size dimensions, K = 0 reductions, empty results,
out-of-range or negative indices, 1-D operands.  Every case either matches onnxruntime's CPU provider or raises a
typed ``OrtGpuError``; none may silently write nothing and hand back whatever the output buffer held.

Each case runs twice: alone, and inside a larger model whose earlier nodes fill intermediate buffers with large
values that die before the edge node runs (so a kernel that writes nothing would hand back that stale data), and
whose edge output is consumed by a further node (so it is itself an intermediate, planned by liveness).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

import ortgpu
from ortgpu import OrtGpuError

F = np.float32
I64 = np.int64
INT_MAX = np.iinfo(np.int64).max
INT_MIN = np.iinfo(np.int64).min

_rng = np.random.default_rng(12)


def r(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(F)


def c(values: Any) -> tuple[str, np.ndarray]:
    """A constant (initializer) input."""
    return ("const", np.asarray(values, dtype=I64))


def e(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=F)


def cf(value: np.ndarray) -> tuple[str, np.ndarray]:
    """A float constant (initializer) input: an empty one becomes a 0-byte device buffer."""
    return ("const", value)


# (id, op_type, inputs, attrs, number of outputs, opset).  An input is an array (a graph input), a ("const", array)
# pair (an initializer), or None (an omitted optional input).
Case = tuple[str, str, list[Any], dict[str, Any], int, int]

CASES: list[Case] = [
    # MatMul
    ("k0", "MatMul", [e(3, 0), e(0, 4)], {}, 1, 17),
    ("k0_batch", "MatMul", [e(2, 3, 0), e(2, 0, 4)], {}, 1, 17),
    ("k0_bcast", "MatMul", [e(2, 3, 0), e(0, 4)], {}, 1, 17),
    ("m0", "MatMul", [e(0, 5), r(5, 4)], {}, 1, 17),
    ("n0", "MatMul", [r(3, 5), e(5, 0)], {}, 1, 17),
    ("batch0", "MatMul", [e(0, 3, 5), r(5, 4)], {}, 1, 17),
    ("batch0_bcast", "MatMul", [e(0, 1, 3, 5), r(2, 5, 4)], {}, 1, 17),
    ("batch_bcast1", "MatMul", [r(2, 1, 3, 5), r(1, 4, 5, 2)], {}, 1, 17),
    ("a1d", "MatMul", [r(5), r(5, 4)], {}, 1, 17),
    ("b1d", "MatMul", [r(3, 5), r(5)], {}, 1, 17),
    ("both1d", "MatMul", [r(5), r(5)], {}, 1, 17),
    ("a1d_batched", "MatMul", [r(5), r(2, 5, 4)], {}, 1, 17),
    ("b1d_batched", "MatMul", [r(2, 3, 5), r(5)], {}, 1, 17),
    ("k0_1d", "MatMul", [e(0), e(0, 4)], {}, 1, 17),
    ("k1", "MatMul", [r(3, 1), r(1, 4)], {}, 1, 17),
    ("k_mismatch", "MatMul", [r(3, 5), r(4, 2)], {}, 1, 17),
    # Gemm
    ("k0", "Gemm", [e(3, 0), e(0, 4)], {}, 1, 17),
    ("k0_bias", "Gemm", [e(3, 0), e(0, 4), r(4)], {"beta": 2.0}, 1, 17),
    ("k0_transposed", "Gemm", [e(0, 3), e(4, 0), r(3, 4)], {"transA": 1, "transB": 1}, 1, 17),
    ("m0", "Gemm", [e(0, 5), r(5, 4), r(4)], {}, 1, 17),
    ("n0", "Gemm", [r(3, 5), e(5, 0)], {}, 1, 17),
    ("bias_scalar", "Gemm", [r(3, 5), r(5, 4), r(1)], {"alpha": 0.5}, 1, 17),
    ("bias_col", "Gemm", [r(3, 5), r(5, 4), r(3, 1)], {}, 1, 17),
    # Conv
    ("batch0", "Conv", [e(0, 2, 5, 5), r(3, 2, 3, 3)], {}, 1, 17),
    ("dilated", "Conv", [r(1, 2, 7, 7), r(3, 2, 3, 3)], {"dilations": [2, 3]}, 1, 17),
    ("dilated_too_long", "Conv", [r(1, 2, 4, 7), r(3, 2, 3, 3)], {"dilations": [2, 1]}, 1, 17),
    ("pads_gt_kernel", "Conv", [r(1, 2, 3, 3), r(3, 2, 2, 2)], {"pads": [3, 3, 3, 3]}, 1, 17),
    (
        "pads_gt_kernel_strided",
        "Conv",
        [r(1, 1, 2, 2), r(2, 1, 1, 1)],
        {"pads": [2, 1, 3, 2], "strides": [2, 3]},
        1,
        17,
    ),
    ("depthwise", "Conv", [r(1, 4, 5, 5), r(4, 1, 3, 3)], {"group": 4}, 1, 17),
    ("group_multiplier", "Conv", [r(1, 4, 5, 5), r(8, 2, 3, 3)], {"group": 2}, 1, 17),
    ("group_mismatch", "Conv", [r(1, 4, 5, 5), r(6, 3, 3, 3)], {"group": 2}, 1, 17),
    ("channel_mismatch", "Conv", [r(1, 4, 5, 5), r(6, 3, 3, 3)], {}, 1, 17),
    ("same_upper", "Conv", [r(1, 2, 5, 6), r(3, 2, 3, 2)], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, 1, 17),
    ("same_lower", "Conv", [r(1, 2, 5, 6), r(3, 2, 4, 3)], {"auto_pad": "SAME_LOWER", "strides": [1, 2]}, 1, 17),
    ("conv1d", "Conv", [r(2, 3, 9), r(4, 3, 3)], {"strides": [2], "pads": [1, 1]}, 1, 17),
    ("conv1x1_on_1x1", "Conv", [r(1, 3, 1, 1), r(5, 3, 1, 1), r(5)], {}, 1, 17),
    # ConvTranspose
    ("batch0", "ConvTranspose", [e(0, 2, 3, 3), r(2, 3, 3, 3)], {}, 1, 17),
    (
        "output_padding",
        "ConvTranspose",
        [r(1, 2, 3, 3), r(2, 3, 3, 3)],
        {"strides": [2, 2], "output_padding": [1, 1]},
        1,
        17,
    ),
    (
        "output_shape",
        "ConvTranspose",
        [r(1, 2, 3, 3), r(2, 3, 3, 3)],
        {"strides": [2, 2], "output_shape": [8, 8]},
        1,
        17,
    ),
    ("dilated", "ConvTranspose", [r(1, 2, 3, 3), r(2, 3, 2, 2)], {"dilations": [2, 2]}, 1, 17),
    ("pads_eat_output", "ConvTranspose", [r(1, 1, 2, 2), r(1, 1, 2, 2)], {"pads": [1, 1, 1, 1]}, 1, 17),
    ("pads_exceed_output", "ConvTranspose", [r(1, 1, 2, 2), r(1, 1, 2, 2)], {"pads": [2, 2, 2, 2]}, 1, 17),
    ("grouped", "ConvTranspose", [r(1, 4, 3, 3), r(4, 1, 3, 3)], {"group": 4, "strides": [2, 2]}, 1, 17),
    ("stride_gt_kernel", "ConvTranspose", [r(1, 2, 3, 3), r(2, 1, 2, 2)], {"strides": [3, 3]}, 1, 17),
    # Concat
    ("empty_middle", "Concat", [r(2, 3), e(0, 3), r(1, 3)], {"axis": 0}, 1, 17),
    ("all_empty", "Concat", [e(0, 3), e(0, 3)], {"axis": 0}, 1, 17),
    ("empty_other_axis", "Concat", [e(0, 3), e(0, 2)], {"axis": 1}, 1, 17),
    ("negative_axis", "Concat", [r(2, 3), e(2, 0), r(2, 1)], {"axis": -1}, 1, 17),
    ("single", "Concat", [r(2, 3)], {"axis": 1}, 1, 17),
    ("mismatch", "Concat", [r(2, 3), r(3, 2)], {"axis": 0}, 1, 17),
    # Split
    ("uneven_attr", "Split", [r(7, 2)], {"axis": 0, "num_outputs": 3}, 3, 18),
    ("zero_piece", "Split", [r(5, 2), c([2, 0, 3])], {"axis": 0}, 3, 18),
    ("all_zero_axis", "Split", [e(0, 2), c([0, 0])], {"axis": 0}, 2, 18),
    ("split_input_negative_axis", "Split", [r(2, 6), c([1, 5])], {"axis": -1}, 2, 18),
    ("split_bad_sum", "Split", [r(2, 6), c([1, 4])], {"axis": 1}, 2, 18),
    ("even_opset13", "Split", [r(6, 2)], {"axis": 0}, 3, 13),
    ("more_outputs_than_elements", "Split", [r(2, 2)], {"axis": 0, "num_outputs": 3}, 3, 18),
    # Slice
    ("end_int_max", "Slice", [r(5, 4), c([1]), c([INT_MAX]), c([0])], {}, 1, 17),
    ("start_out_of_range", "Slice", [r(5, 4), c([10]), c([20]), c([0])], {}, 1, 17),
    ("start_below_range", "Slice", [r(5, 4), c([-10]), c([2]), c([0])], {}, 1, 17),
    ("empty_start_eq_end", "Slice", [r(5, 4), c([2]), c([2]), c([1])], {}, 1, 17),
    ("empty_start_gt_end", "Slice", [r(5, 4), c([3]), c([1]), c([0])], {}, 1, 17),
    ("neg_step", "Slice", [r(5, 4), c([4]), c([0]), c([0]), c([-1])], {}, 1, 17),
    ("neg_step_int_min", "Slice", [r(5, 4), c([-1]), c([INT_MIN]), c([0]), c([-1])], {}, 1, 17),
    ("neg_step_by_2", "Slice", [r(5, 7), c([10]), c([-100]), c([1]), c([-2])], {}, 1, 17),
    ("neg_step_empty", "Slice", [r(5, 4), c([0]), c([3]), c([0]), c([-1])], {}, 1, 17),
    ("step_gt_len", "Slice", [r(5, 4), c([1]), c([5]), c([0]), c([10])], {}, 1, 17),
    ("no_axes", "Slice", [r(5, 4), c([1, -3]), c([INT_MAX, -1])], {}, 1, 17),
    ("negative_axes", "Slice", [r(5, 4), c([1]), c([3]), c([-1])], {}, 1, 17),
    ("on_empty", "Slice", [e(0, 4), c([0]), c([2]), c([1])], {}, 1, 17),
    ("step_zero", "Slice", [r(5, 4), c([0]), c([2]), c([0]), c([0])], {}, 1, 17),
    # Gather
    ("empty_indices", "Gather", [r(5, 4), c(np.zeros((0,)))], {"axis": 0}, 1, 17),
    ("empty_indices_2d", "Gather", [r(5, 4), c(np.zeros((2, 0)))], {"axis": 1}, 1, 17),
    ("negative_indices", "Gather", [r(5, 4), c([-1, 0, -5])], {"axis": 0}, 1, 17),
    ("scalar_index", "Gather", [r(5, 4), c(-2)], {"axis": 1}, 1, 17),
    ("out_of_range", "Gather", [r(5, 4), c([5])], {"axis": 0}, 1, 17),
    ("from_empty_other_axis", "Gather", [e(3, 0), c([1, 2])], {"axis": 0}, 1, 17),
    ("runtime_negative", "Gather", [r(5, 4), np.array([-1, 2], dtype=I64)], {"axis": 0}, 1, 17),
    # Reshape
    ("zero_copies", "Reshape", [r(2, 3, 4), c([0, -1])], {}, 1, 17),
    ("to_empty_allowzero", "Reshape", [e(0, 4), c([0, 8, 0])], {"allowzero": 1}, 1, 17),
    ("empty_minus1", "Reshape", [e(0, 4), c([0, -1])], {}, 1, 17),
    ("empty_minus1_ambiguous", "Reshape", [e(0, 4), c([-1, 0])], {"allowzero": 1}, 1, 17),
    ("scalar_target", "Reshape", [r(1, 1), c(np.zeros((0,)))], {}, 1, 17),
    ("count_mismatch", "Reshape", [r(2, 3), c([4, 2])], {}, 1, 17),
    # Expand / Tile
    ("to_zero", "Expand", [r(1, 3), c([0, 3])], {}, 1, 17),
    ("from_zero", "Expand", [e(0, 1), c([1, 4])], {}, 1, 17),
    ("rank_up", "Expand", [r(3, 1), c([2, 1, 1, 4])], {}, 1, 17),
    ("smaller_target", "Expand", [r(2, 3), c([1])], {}, 1, 17),
    ("zero_repeats", "Tile", [r(2, 3), c([0, 2])], {}, 1, 17),
    ("on_empty", "Tile", [e(0, 3), c([3, 2])], {}, 1, 17),
    ("ones", "Tile", [r(2, 3), c([1, 1])], {}, 1, 17),
    # Reductions
    *[
        (name, op, inputs, attrs, 1, 18)
        for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")
        for name, inputs, attrs in [
            ("no_axes", [r(2, 3, 4)], {}),
            ("empty_axes_const", [r(2, 3, 4), c(np.zeros((0,)))], {"keepdims": 0}),
            ("noop_empty_axes", [r(2, 3, 4), c(np.zeros((0,)))], {"noop_with_empty_axes": 1}),
            ("noop_no_axes", [r(2, 3, 4)], {"noop_with_empty_axes": 1}),
            ("axis_zero_size", [e(2, 0, 4), c([1])], {}),
            ("axis_zero_size_nokeep", [e(2, 0, 4), c([1])], {"keepdims": 0}),
            ("all_on_empty", [e(2, 0, 4)], {"keepdims": 0}),
            ("other_axis_zero", [e(2, 0, 4), c([2])], {}),
            ("negative_axes", [r(2, 3, 4), c([-1, 0])], {"keepdims": 0}),
            ("length1_axis", [r(2, 1, 4), c([1])], {"keepdims": 0}),
            ("scalar_input", [np.array(2.5, dtype=F)], {}),
        ]
    ],
    # Softmax family / LayerNormalization on 0-size axes
    ("axis_zero_size", "Softmax", [e(2, 0)], {"axis": -1}, 1, 17),
    ("other_zero", "Softmax", [e(0, 5)], {"axis": -1}, 1, 17),
    ("axis_len1", "Softmax", [r(3, 1)], {"axis": -1}, 1, 17),
    ("axis0", "Softmax", [r(3, 4)], {"axis": 0}, 1, 17),
    ("axis_zero_size", "LogSoftmax", [e(2, 0)], {"axis": -1}, 1, 17),
    ("other_zero", "LogSoftmax", [e(0, 5)], {"axis": 1}, 1, 17),
    ("axis_len1", "LogSoftmax", [r(3, 1)], {"axis": -1}, 1, 17),
    ("rows_zero", "LayerNormalization", [e(0, 4), r(4), r(4)], {"axis": -1}, 1, 17),
    ("len1", "LayerNormalization", [r(3, 1), r(1), r(1)], {"axis": -1}, 1, 17),
    ("axis0_all", "LayerNormalization", [r(2, 3), r(2, 3), r(2, 3)], {"axis": 0}, 1, 17),
    # Transpose
    ("empty", "Transpose", [e(2, 0, 3)], {"perm": [2, 0, 1]}, 1, 17),
    ("default_perm", "Transpose", [r(2, 3, 4)], {}, 1, 17),
    ("rank1", "Transpose", [r(5)], {}, 1, 17),
    ("bad_perm", "Transpose", [r(2, 3)], {"perm": [0, 0]}, 1, 17),
    # Elementwise with 0-size broadcast
    ("zero_bcast", "Add", [e(0, 3), r(1, 3)], {}, 1, 17),
    ("zero_vs_one", "Mul", [e(2, 0), r(2, 1)], {}, 1, 17),
    ("zero_rank_up", "Sub", [r(3), e(0, 1, 3)], {}, 1, 17),
    ("bad_bcast", "Add", [r(2, 3), r(3, 2)], {}, 1, 17),
    ("empty", "Relu", [e(0, 5)], {}, 1, 17),
    ("empty", "Pow", [e(3, 0), r(1)], {}, 1, 17),
    ("empty", "Less", [e(3, 0), r(1)], {}, 1, 17),
    ("zero_bcast", "Where", [np.zeros((0, 3), dtype=bool), r(1, 3), r(3)], {}, 1, 17),
    ("bcast_all", "Where", [np.array([[True], [False]]), r(1, 3), r(2, 1)], {}, 1, 17),
    ("empty", "Clip", [e(0, 3), np.array(-0.5, dtype=F), np.array(0.5, dtype=F)], {}, 1, 17),
    ("empty_to_int", "Cast", [e(0, 3)], {"to": TensorProto.INT64}, 1, 17),
    ("empty_to_bool", "Cast", [e(2, 0)], {"to": TensorProto.BOOL}, 1, 17),
    # Range / ConstantOfShape
    ("empty", "Range", [np.array(5, dtype=I64), np.array(2, dtype=I64), np.array(1, dtype=I64)], {}, 1, 17),
    ("neg_delta", "Range", [np.array(5.0, dtype=F), np.array(2.0, dtype=F), np.array(-1.5, dtype=F)], {}, 1, 17),
    ("empty_const", "Range", [c(3), c(3), c(1)], {}, 1, 17),
    ("zero_dim", "ConstantOfShape", [c([2, 0])], {"value": numpy_helper.from_array(np.array([1.5], dtype=F))}, 1, 17),
    (
        "scalar",
        "ConstantOfShape",
        [c(np.zeros((0,)))],
        {"value": numpy_helper.from_array(np.array([2.0], dtype=F))},
        1,
        17,
    ),
    # BatchNormalization
    ("batch0", "BatchNormalization", [e(0, 3, 2, 2), r(3), r(3), r(3), np.abs(r(3)) + 0.5], {}, 1, 15),
    ("rank2", "BatchNormalization", [r(4, 3), r(3), r(3), r(3), np.abs(r(3)) + 0.5], {}, 1, 15),
    ("spatial0", "BatchNormalization", [e(2, 3, 0), r(3), r(3), r(3), np.abs(r(3)) + 0.5], {}, 1, 15),
    # GlobalAveragePool
    ("one_by_one", "GlobalAveragePool", [r(2, 3, 1, 1)], {}, 1, 17),
    ("batch0", "GlobalAveragePool", [e(0, 3, 4, 4)], {}, 1, 17),
    ("spatial0", "GlobalAveragePool", [e(1, 3, 0, 4)], {}, 1, 17),
    ("one_d", "GlobalAveragePool", [r(2, 3, 5)], {}, 1, 17),
    # Flatten
    ("axis0", "Flatten", [r(2, 3, 4)], {"axis": 0}, 1, 17),
    ("axis_rank", "Flatten", [r(2, 3, 4)], {"axis": 3}, 1, 17),
    ("axis_negative", "Flatten", [r(2, 3, 4)], {"axis": -1}, 1, 17),
    ("empty", "Flatten", [e(2, 0, 4)], {"axis": 2}, 1, 17),
    ("axis_out_of_range", "Flatten", [r(2, 3)], {"axis": 3}, 1, 17),
    # Squeeze / Unsqueeze
    ("all", "Squeeze", [r(1, 3, 1)], {}, 1, 17),
    ("negative_axis", "Squeeze", [r(1, 3, 1), c([-1])], {}, 1, 17),
    ("not_one", "Squeeze", [r(2, 3), c([0])], {}, 1, 17),
    ("empty", "Squeeze", [e(1, 0, 1), c([0])], {}, 1, 17),
    ("negative", "Unsqueeze", [r(2, 3), c([-1, 0])], {}, 1, 17),
    ("empty", "Unsqueeze", [e(0, 3), c([1])], {}, 1, 17),
    ("scalar", "Unsqueeze", [np.array(1.5, dtype=F), c([0])], {}, 1, 17),
    ("duplicate", "Unsqueeze", [r(2, 3), c([1, 1])], {}, 1, 17),
    # Zero channels: the reduction over input channels is empty (the output is the bias, or zeros)
    ("in_channels0", "Conv", [e(1, 0, 4, 4), e(3, 0, 3, 3)], {}, 1, 17),
    ("in_channels0_bias", "Conv", [e(1, 0, 4, 4), e(3, 0, 3, 3), r(3)], {}, 1, 17),
    ("out_channels0", "Conv", [r(1, 2, 4, 4), e(0, 2, 3, 3)], {}, 1, 17),
    ("in_channels0", "ConvTranspose", [e(1, 0, 3, 3), e(0, 2, 2, 2)], {}, 1, 17),
    ("in_channels0_bias", "ConvTranspose", [e(1, 0, 3, 3), e(0, 2, 2, 2), r(2)], {}, 1, 17),
    ("channels0", "BatchNormalization", [e(2, 0, 3), e(0), e(0), e(0), e(0)], {}, 1, 15),
    ("channels0", "GlobalAveragePool", [e(2, 0, 3, 3)], {}, 1, 17),
    ("axis_zero_size", "LayerNormalization", [e(2, 0), e(0), e(0)], {"axis": -1}, 1, 17),
    # Shapes, indices and axes read at run time (graph inputs, not constants)
    ("runtime_empty", "Slice", [r(5, 4), np.array([3], dtype=I64), np.array([1], dtype=I64)], {}, 1, 17),
    ("runtime_neg_step", "Slice", [r(5, 4), *(np.array([v], dtype=I64) for v in (-1, INT_MIN, 1, -2))], {}, 1, 17),
    ("runtime_zero", "Reshape", [e(0, 4), np.array([0, -1], dtype=I64)], {}, 1, 17),
    ("runtime_to_zero", "Expand", [r(1, 3), np.array([0, 3], dtype=I64)], {}, 1, 17),
    ("runtime_zero_repeats", "Tile", [r(2, 3), np.array([2, 0], dtype=I64)], {}, 1, 17),
    ("runtime_zero_dim", "ConstantOfShape", [np.array([3, 0], dtype=I64)], {}, 1, 17),
    ("runtime_zero_piece", "Split", [r(5, 2), np.array([5, 0], dtype=I64)], {"axis": 0}, 2, 18),
    ("runtime_empty_axes", "ReduceSum", [r(2, 3), np.zeros((0,), dtype=I64)], {"keepdims": 0}, 1, 18),
    ("runtime_axes_zero_size", "ReduceMean", [e(2, 0, 3), np.array([1], dtype=I64)], {}, 1, 18),
    ("runtime_axes_zero_size", "ReduceMax", [e(2, 0, 3), np.array([1], dtype=I64)], {}, 1, 18),
    ("runtime_empty_indices", "Gather", [r(5, 4), np.zeros((0, 2), dtype=I64)], {"axis": 0}, 1, 17),
    ("runtime_empty", "Unsqueeze", [e(3, 0), np.array([0], dtype=I64)], {}, 1, 17),
    ("all_empty", "Where", [np.zeros((0,), dtype=bool), e(0), e(0)], {}, 1, 17),
    ("int_empty", "Cast", [np.zeros((0, 2), dtype=I64)], {"to": TensorProto.FLOAT}, 1, 17),
    # Empty constants (0-byte device buffers) beside non-empty outputs
    ("const_empty_middle", "Concat", [r(2, 3), cf(e(0, 3)), r(1, 3)], {"axis": 0}, 1, 17),
    ("const_empty_first", "Concat", [cf(e(2, 0)), r(2, 2)], {"axis": 1}, 1, 17),
    ("const_k0", "MatMul", [e(3, 0), cf(e(0, 4))], {}, 1, 17),
    ("const_k0", "Gemm", [e(3, 0), cf(e(0, 4)), cf(r(4))], {}, 1, 17),
    ("const_in_channels0_bias", "Conv", [e(1, 0, 4, 4), cf(e(3, 0, 3, 3)), cf(r(3))], {}, 1, 17),
    ("const_in_channels0", "ConvTranspose", [e(1, 0, 3, 3), cf(e(0, 2, 2, 2))], {}, 1, 17),
    ("const_empty_data", "Expand", [cf(e(0, 1)), c([0, 4])], {}, 1, 17),
    # Integer dtypes: identities of the empty reductions
    ("int_axis_zero_size", "ReduceSum", [np.zeros((2, 0), dtype=I64), c([1])], {}, 1, 18),
    ("int_axis_zero_size", "ReduceMax", [np.zeros((2, 0), dtype=I64), c([1])], {}, 1, 18),
    ("int_axis_zero_size", "ReduceMin", [np.zeros((2, 0), dtype=I64), c([1])], {}, 1, 18),
    ("opset11_axis_zero_size", "Softmax", [e(2, 0, 3)], {"axis": 1}, 1, 11),
    ("opset11_rows_zero", "LogSoftmax", [e(0, 2, 3)], {"axis": 1}, 1, 11),
    # Invalid shapes and indices: onnxruntime refuses, so must ortgpu (with a typed error)
    ("repeated_axes", "Slice", [r(5, 4), c([0, 1]), c([2, 3]), c([0, 0])], {}, 1, 17),
    ("axis_out_of_range", "Slice", [r(5, 4), c([0]), c([2]), c([2])], {}, 1, 17),
    ("two_minus1", "Reshape", [r(2, 3), c([-1, -1])], {}, 1, 17),
    ("minus2", "Reshape", [r(2, 3), c([-2, 3])], {}, 1, 17),
    ("zero_no_allowzero_empty", "Reshape", [e(0, 4), c([0, 4, 0])], {}, 1, 17),
    ("zero_copies_a_dim_the_data_lacks", "Reshape", [e(2, 0, 8), c([1, 2, 0, 8])], {}, 1, 17),
    ("incompatible", "Expand", [r(2, 3), c([4, 3])], {}, 1, 17),
    ("negative_repeats", "Tile", [r(2, 3), c([1, -1])], {}, 1, 17),
    ("wrong_repeats_length", "Tile", [r(2, 3), c([2])], {}, 1, 17),
    ("negative_dim", "ConstantOfShape", [c([2, -1])], {}, 1, 17),
    ("zero_delta", "Range", [np.array(0, dtype=I64), np.array(5, dtype=I64), np.array(0, dtype=I64)], {}, 1, 17),
    ("axis_out_of_range", "Gather", [r(5, 4), c([0])], {"axis": 2}, 1, 17),
    ("axis_out_of_range", "Softmax", [r(2, 3)], {"axis": 2}, 1, 17),
    ("axis_out_of_range", "Concat", [r(2, 3), r(2, 3)], {"axis": 2}, 1, 17),
    ("axis_out_of_range", "Unsqueeze", [r(2, 3), c([3])], {}, 1, 17),
    ("zero_dim", "Squeeze", [e(2, 0), c([1])], {}, 1, 17),
    ("perm_length", "Transpose", [r(2, 3, 4)], {"perm": [1, 0]}, 1, 17),
    ("scale_shape", "BatchNormalization", [r(2, 3, 2), r(4), r(3), r(3), np.abs(r(3)) + 0.5], {}, 1, 15),
    ("rank1_weight", "Conv", [r(1, 2, 5, 5), r(3)], {}, 1, 17),
    ("zero_stride", "Conv", [r(1, 2, 5, 5), r(3, 2, 3, 3)], {"strides": [0, 1]}, 1, 17),
    ("scalar_operand", "MatMul", [np.array(2.0, dtype=F), r(3)], {}, 1, 17),
    ("a_3d", "Gemm", [r(2, 3, 4), r(4, 2)], {}, 1, 17),
    ("bias_unbroadcastable", "Gemm", [r(3, 4), r(4, 2), r(3)], {}, 1, 17),
    ("sum_mismatch_attr", "Split", [r(6, 2)], {"axis": 0, "num_outputs": 4}, 3, 18),
    # Pools at a 0-size batch (the window edges themselves are in test_window_edges.py)
    ("batch0", "MaxPool", [e(0, 2, 4, 4)], {"kernel_shape": [2, 2]}, 1, 17),
    ("batch0", "AveragePool", [e(0, 2, 4, 4)], {"kernel_shape": [2, 2]}, 1, 17),
    ("channels0", "MaxPool", [e(1, 0, 4, 4)], {"kernel_shape": [2, 2]}, 1, 17),
    ("channels0", "AveragePool", [e(1, 0, 4, 4)], {"kernel_shape": [2, 2]}, 1, 17),
    ("spatial0_padded", "MaxPool", [e(1, 2, 0, 4)], {"kernel_shape": [1, 2], "pads": [1, 0, 1, 0]}, 1, 17),
    ("spatial0_padded", "AveragePool", [e(1, 2, 0, 4)], {"kernel_shape": [1, 2], "pads": [1, 0, 1, 0]}, 1, 17),
    ("batch_and_channels0", "GlobalAveragePool", [e(0, 0, 3, 3)], {}, 1, 17),
]

_ONNX_TYPE = {np.dtype(F): TensorProto.FLOAT, np.dtype(I64): TensorProto.INT64, np.dtype(bool): TensorProto.BOOL}


def _model(case: Case, in_context: bool) -> tuple[bytes, dict[str, np.ndarray]]:
    _, op_type, inputs, attrs, n_outputs, opset = case
    graph_inputs, initializers, feeds, names = [], [], {}, []
    for i, value in enumerate(inputs):
        name = f"in{i}"
        if value is None:
            names.append("")
        elif isinstance(value, tuple):
            initializers.append(numpy_helper.from_array(value[1], name))
            names.append(name)
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, _ONNX_TYPE[value.dtype], list(value.shape)))
            feeds[name] = value
            names.append(name)
    outs = [f"y{i}" for i in range(n_outputs)]
    nodes = [helper.make_node(op_type, names, outs, **attrs)]
    out_names = outs
    consumer = "Not" if op_type == "Less" or attrs.get("to") == TensorProto.BOOL else "Neg"
    if in_context:
        # Before the edge node: intermediates full of 1000s that die before it runs.  After it: each edge output
        # feeds an Identity-free consumer (Neg), so the edge output is an intermediate buffer too.
        graph_inputs.append(helper.make_tensor_value_info("fill", TensorProto.FLOAT, [4096]))
        feeds["fill"] = np.full((4096,), 1000.0, dtype=F)
        nodes = [
            helper.make_node("Relu", ["fill"], ["f1"]),
            helper.make_node("Abs", ["f1"], ["f2"]),
            helper.make_node("Sqrt", ["f2"], ["f3"]),
            helper.make_node("Neg", ["f3"], ["fill_out"]),
            *nodes,
            *[helper.make_node("Identity", [o], [f"{o}_id"]) for o in outs],
            *[helper.make_node(consumer, [f"{o}_id"], [f"{o}_neg"]) for o in outs],
        ]
        out_names = ["fill_out", *[f"{o}_neg" for o in outs]]
    graph = helper.make_graph(
        nodes, "edge", graph_inputs, [helper.make_empty_tensor_value_info(n) for n in out_names], initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    # Graph outputs need an element type (onnx's checker): take it from onnx's type inference, shape left open.
    inferred = {v.name: v.type.tensor_type for v in shape_inference.infer_shapes(model).graph.value_info}
    for output in model.graph.output:
        tensor_type = inferred.get(output.name)
        elem = tensor_type.elem_type if tensor_type is not None and tensor_type.elem_type else TensorProto.FLOAT
        rank = len(tensor_type.shape.dim) if tensor_type is not None and tensor_type.HasField("shape") else 1
        dims = [f"{output.name}_d{i}" for i in range(rank)]
        output.CopyFrom(helper.make_tensor_value_info(output.name, elem, dims))
    return bytes(model.SerializeToString()), feeds


# onnxruntime's kernels as written, without its graph rewrites (its NCHWc layout rewrite refuses 0 channels where
# the GlobalAveragePool kernel itself returns the empty result).
_ORT_OPTIONS = onnxruntime.SessionOptions()
_ORT_OPTIONS.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL


def _id(case: Case) -> str:
    return f"{case[1]}-{case[0]}"


@pytest.mark.parametrize("in_context", [False, True], ids=["alone", "in_context"])
@pytest.mark.parametrize("case", CASES, ids=[_id(case) for case in CASES])
def test_shape_edge_matches_onnxruntime_or_raises_typed(env: ortgpu.Env, case: Case, in_context: bool) -> None:
    model, feeds = _model(case, in_context)
    try:
        expected = onnxruntime.InferenceSession(model, _ORT_OPTIONS, providers=["CPUExecutionProvider"]).run(
            None, feeds
        )
    except Exception:  # noqa: BLE001 - onnxruntime refuses: ortgpu must refuse with a typed error
        with pytest.raises(OrtGpuError):
            with ortgpu.InferenceSession(model, env=env) as session:
                session.run(None, feeds)
        return
    with ortgpu.InferenceSession(model, env=env) as session:
        for _ in range(2):  # twice: the second run reuses buffers the first one filled
            got = session.run(None, feeds)
            assert len(got) == len(expected)
            for g, x in zip(got, expected):
                assert g.shape == x.shape, (g.shape, x.shape)
                assert g.dtype == x.dtype, (g.dtype, x.dtype)
                np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-4)


def _chain(nodes: list[Any], feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray]) -> bytes:
    """A model of ``nodes`` (output ``Y``) after a prefix that fills buffers with stale data (input ``fill``)."""
    prefix = [
        helper.make_node("Relu", ["fill"], ["f1"]),
        helper.make_node("Abs", ["f1"], ["f2"]),
        helper.make_node("Neg", ["f2"], ["fill_out"]),
    ]
    graph = helper.make_graph(
        prefix + nodes,
        "chain",
        [helper.make_tensor_value_info(n, _ONNX_TYPE[v.dtype], list(v.shape)) for n, v in feeds.items()],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"{n}{i}" for i in range(rank)])
            for n, rank in (("fill_out", 1), ("Y", 4))
        ],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def _lift(name: str, out: str) -> list[Any]:
    """Reshape ``name`` to rank 4 (the chain's output rank) as ``out``."""
    return [helper.make_node("Reshape", [name, "shape4"], [out])]


_SHAPE4 = {"shape4": np.array([1, 1, 3, 4], dtype=I64)}

# K = 0 inside the chains the planner fuses (epilogues, folded transposes): the fused node still writes every output.
CHAINS: dict[str, tuple[list[Any], dict[str, np.ndarray], dict[str, np.ndarray]]] = {
    "matmul_k0_bias_relu": (
        [
            helper.make_node("MatMul", ["A", "B"], ["m"]),
            helper.make_node("Add", ["m", "bias"], ["a"]),
            helper.make_node("Relu", ["a"], ["r"]),
            *_lift("r", "Y"),
        ],
        {"A": e(3, 0), "B": e(0, 4)},
        {"bias": r(4), **_SHAPE4},
    ),
    "gemm_k0_c_sigmoid": (
        [
            helper.make_node("Gemm", ["A", "B", "C"], ["m"], alpha=2.0, beta=0.5),
            helper.make_node("Sigmoid", ["m"], ["s"]),
            *_lift("s", "Y"),
        ],
        {"A": e(3, 0), "B": e(0, 4)},
        {"C": r(3, 4), **_SHAPE4},
    ),
    "attention_scores_head_dim0": (
        [
            helper.make_node("Transpose", ["Q"], ["q"], perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", ["K"], ["k"], perm=[0, 2, 3, 1]),
            helper.make_node("MatMul", ["q", "k"], ["s"]),
            helper.make_node("Mul", ["s", "half"], ["scaled"]),
            helper.make_node("Softmax", ["scaled"], ["Y"], axis=-1),
        ],
        {"Q": e(1, 3, 2, 0), "K": e(1, 3, 2, 0)},
        {"half": np.array(0.5, dtype=F)},
    ),
    "conv_in_channels0_bias_relu": (
        [helper.make_node("Conv", ["X", "W", "Bc"], ["c"]), helper.make_node("Relu", ["c"], ["Y"])],
        {"X": e(1, 0, 4, 4)},
        {"W": e(3, 0, 3, 3), "Bc": r(3)},
    ),
    "conv_transpose_in_channels0_bias": (
        [helper.make_node("ConvTranspose", ["X", "W", "Bc"], ["c"]), helper.make_node("Neg", ["c"], ["Y"])],
        {"X": e(1, 0, 3, 3)},
        {"W": e(0, 2, 2, 2), "Bc": r(2)},
    ),
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_fused_chain_with_an_empty_reduction_matches_onnxruntime(env: ortgpu.Env, name: str) -> None:
    nodes, feeds, consts = CHAINS[name]
    feeds = {**feeds, "fill": np.full((4096,), 1000.0, dtype=F)}
    model = _chain(nodes, feeds, consts)
    expected = onnxruntime.InferenceSession(model, _ORT_OPTIONS, providers=["CPUExecutionProvider"]).run(None, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        for _ in range(2):
            got = session.run(None, feeds)
            for g, x in zip(got, expected):
                assert g.shape == x.shape, (g.shape, x.shape)
                np.testing.assert_allclose(g, x, rtol=1e-5, atol=1e-6)


# One session, symbolic dims, fed a non-empty, then an empty, then a non-empty reduction: the plan for each shape
# must write its output (a plan cached for another shape, or a buffer sized for it, must not leak through).
DYNAMIC: dict[str, tuple[str, list[tuple[int, ...]], dict[str, Any], list[list[tuple[int, ...]]]]] = {
    "MatMul_K": ("MatMul", [("m", "k"), ("k", "n")], {}, [[(3, 4), (4, 2)], [(3, 0), (0, 2)], [(3, 5), (5, 2)]]),
    "Gemm_K": ("Gemm", [("m", "k"), ("n", "k")], {"transB": 1}, [[(3, 4), (2, 4)], [(3, 0), (2, 0)], [(2, 1), (2, 1)]]),
    "ReduceSum_axis": ("ReduceSum", [("a", "b")], {"keepdims": 0}, [[(2, 3)], [(2, 0)], [(2, 5)]]),
    "ReduceMean_axis": ("ReduceMean", [("a", "b")], {"keepdims": 0}, [[(2, 3)], [(2, 0)], [(4, 5)]]),
    "ReduceMax_axis": ("ReduceMax", [("a", "b")], {"keepdims": 0}, [[(2, 3)], [(2, 0)], [(2, 5)]]),
    "Softmax_rows": ("Softmax", [("a", "b")], {"axis": -1}, [[(2, 3)], [(0, 3)], [(2, 3)]]),
    "Concat_empty": (
        "Concat",
        [("a", "b"), ("c", "b")],
        {"axis": 0},
        [[(2, 3), (1, 3)], [(0, 3), (1, 3)], [(2, 3), (0, 3)]],
    ),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_one_session_through_empty_and_non_empty_shapes(env: ortgpu.Env, name: str) -> None:
    op_type, dims, attrs, runs = DYNAMIC[name]
    inputs = [helper.make_tensor_value_info(f"in{i}", TensorProto.FLOAT, list(d)) for i, d in enumerate(dims)]
    nodes = [
        helper.make_node("Relu", ["fill"], ["f1"]),
        helper.make_node("Neg", ["f1"], ["fill_out"]),
        helper.make_node(op_type, [f"in{i}" for i in range(len(dims))], ["y"], **attrs),
        helper.make_node("Neg", ["y"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("fill", TensorProto.FLOAT, [4096]), *inputs],
        [
            helper.make_tensor_value_info("fill_out", TensorProto.FLOAT, [4096]),
            helper.make_tensor_value_info(
                "Y", TensorProto.FLOAT, ["y0"] if op_type.startswith("Reduce") else ["y0", "y1"]
            ),
        ],
    )
    model_proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model_proto.ir_version = 9
    model = bytes(model_proto.SerializeToString())
    reference = onnxruntime.InferenceSession(model, _ORT_OPTIONS, providers=["CPUExecutionProvider"])
    with ortgpu.InferenceSession(model, env=env) as session:
        for shapes in runs + runs[::-1]:
            feeds = {"fill": np.full((4096,), 1000.0, dtype=F), **{f"in{i}": r(*s) for i, s in enumerate(shapes)}}
            expected = reference.run(None, feeds)
            got = session.run(None, feeds)
            for g, x in zip(got, expected):
                assert g.shape == x.shape, (shapes, g.shape, x.shape)
                np.testing.assert_allclose(g, x, rtol=1e-5, atol=1e-5, err_msg=str(shapes))


def test_a_reshape_the_data_does_not_fill_names_both_sizes(env: ortgpu.Env) -> None:
    """Reshape's 0 copies an input dimension: on an empty [2, 0, 8], [1, 2, 0, 8] asks for 128 elements of 0.
    onnxruntime refuses it when it runs; ortgpu refuses it while planning, naming both sizes."""
    model, feeds = _model(
        ("zero_copies_a_dim_the_data_lacks", "Reshape", [e(2, 0, 8), c([1, 2, 0, 8])], {}, 1, 17), False
    )
    with ortgpu.InferenceSession(model, env=env) as session:
        with pytest.raises(ortgpu.ShapeError, match="has 0 elements.*needs 128"):
            session.run(None, feeds)
