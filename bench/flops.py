"""FLOPs of one run of a model: 2 x the multiply-adds of its MatMul, Gemm, Conv, ConvTranspose, LSTM, GRU and RNN
nodes.

Shapes come from onnx shape inference after the graph inputs' dims are fixed to the sizes the benchmark feeds.
onnx's inference does not follow shapes computed at run time (``Shape -> Gather -> Slice`` as exporters write
them), so small shape computations are folded into constants first, on a copy (see :func:`_fold_small_constants`).
A node whose operand shapes are not all known (symbolic or missing after inference) counts 0, and so does
every other operator (elementwise work, reductions, softmax, ...), so the count is a lower bound on the work
and the FLOP/s derived from it is the rate of the dense-algebra part. Nodes inside subgraphs (If, Loop, Scan)
are not counted.

Per node (multiply-adds, before the factor 2):

* MatMul ``A @ B`` (numpy semantics, batch dims broadcast, 1-D operands promoted): ``batch * M * K * N``.
* Gemm (``transA`` / ``transB`` honoured): ``M * K * N``; the bias add and ``alpha`` / ``beta`` are not counted.
* Conv, weight ``[M, C/group, k1, k2, ...]``: ``numel(Y) * C/group * k1 * k2 * ...``, so groups, strides, pads and
  dilations all enter through the inferred output shape.
* ConvTranspose, weight ``[C, M/group, k1, k2, ...]``: every input element meets ``M/group * k1 * k2 * ...``
  weights: ``numel(X) * M/group * k1 * k2 * ...`` (products that ``pads`` crop away are counted too).
* LSTM, GRU, RNN, ``W [directions, gates * H, I]`` and ``R [directions, gates * H, H]``: every time step of every
  sequence and direction multiplies its input by ``W`` and its state by ``R``: ``T * batch * directions * gates * H *
  (I + H)`` (``X`` is ``[T, batch, I]``, or ``[batch, T, I]`` with ``layout = 1``; ``sequence_lens`` is ignored, so
  padded steps count; gate nonlinearities and the elementwise cell updates are not counted).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnx.helper
from onnx import numpy_helper, shape_inference

__all__ = ["model_flops", "node_macs"]

_DEFAULT_DOMAINS = ("", "ai.onnx")
_SMALL = 1024  # elements: initializers up to this size are copied with their data; folded values are at most this


def _copy_fields(source: Any, target: Any, skip: str) -> None:
    """Copy every set field of protobuf message ``source`` into ``target`` except the field named ``skip``."""
    for descriptor, value in source.ListFields():
        if descriptor.name == skip:
            continue
        if isinstance(value, (str, bytes, int, float)):
            setattr(target, descriptor.name, value)
        elif hasattr(value, "CopyFrom"):  # a message
            getattr(target, descriptor.name).CopyFrom(value)
        else:  # a repeated field
            getattr(target, descriptor.name).extend(value)


def _with_fixed_inputs(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs named in ``shapes`` have those dims. Large initializers travel as
    graph inputs of their type and shape only (inference needs no more of them), so neither the copy nor the
    inference pays for the weights' bytes."""
    fixed = onnx.ModelProto()
    _copy_fields(model, fixed, skip="graph")
    _copy_fields(model.graph, fixed.graph, skip="initializer")
    declared = {value.name for value in fixed.graph.input}
    for initializer in model.graph.initializer:
        if math.prod(initializer.dims) <= _SMALL:
            fixed.graph.initializer.add().CopyFrom(initializer)
        elif initializer.name not in declared:
            fixed.graph.input.append(
                onnx.helper.make_tensor_value_info(initializer.name, initializer.data_type, list(initializer.dims))
            )
    for value in fixed.graph.input:
        if value.name not in shapes or not value.type.HasField("tensor_type"):
            continue
        shape = value.type.tensor_type.shape
        shape.ClearField("dim")
        for size in shapes[value.name]:
            shape.dim.add().dim_value = int(size)
    return fixed


def _known_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """Every value of ``graph`` whose shape is fully known (all dims concrete)."""
    known: dict[str, tuple[int, ...]] = {}
    for initializer in graph.initializer:
        known[initializer.name] = tuple(int(d) for d in initializer.dims)
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.name in known or not value.type.HasField("tensor_type"):
            continue
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        dims = tensor.shape.dim
        if all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
            known[value.name] = tuple(int(d.dim_value) for d in dims)
    return known


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return default


def node_macs(node: onnx.NodeProto, known: dict[str, tuple[int, ...]]) -> int:
    """Multiply-adds of one node given the known shapes (0 if unknown or not a counted operator)."""
    if node.domain not in _DEFAULT_DOMAINS:
        return 0
    op = node.op_type

    def operand(index: int) -> tuple[int, ...] | None:
        if index >= len(node.input) or not node.input[index]:
            return None
        return known.get(node.input[index])

    if op == "MatMul":
        a, b = operand(0), operand(1)
        if a is None or b is None or not a or not b:
            return 0
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        if a2[-1] != b2[-2]:
            return 0
        batch = _broadcast(a2[:-2], b2[:-2])
        if batch is None:
            return 0
        return math.prod(batch) * a2[-2] * a2[-1] * b2[-1]
    if op == "Gemm":
        a, b = operand(0), operand(1)
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return 0
        m, k = (a[1], a[0]) if _attribute(node, "transA", 0) else a
        n = b[0] if _attribute(node, "transB", 0) else b[1]
        return m * k * n
    if op == "Conv":
        w = operand(1)
        y = known.get(node.output[0]) if node.output and node.output[0] else None
        if w is None or y is None or len(w) < 2:
            return 0
        return math.prod(y) * math.prod(w[1:])
    if op == "ConvTranspose":
        x, w = operand(0), operand(1)
        if x is None or w is None or len(w) < 2:
            return 0
        return math.prod(x) * math.prod(w[1:])
    if op in ("LSTM", "GRU", "RNN"):
        x, w, r = operand(0), operand(1), operand(2)
        if x is None or w is None or r is None or len(x) != 3 or len(w) != 3 or len(r) != 3:
            return 0
        sequence = x[1] * x[0]  # steps x batch, in either layout
        return sequence * w[0] * w[1] * (w[2] + r[2])
    return 0


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + a
    b = (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(out)


# Operators evaluated on constant inputs when every input and output is small: the arithmetic of shape computations.
_FOLDABLE = frozenset(
    {
        "Constant",
        "Shape",
        "Size",
        "Gather",
        "Concat",
        "Slice",
        "Unsqueeze",
        "Squeeze",
        "Cast",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Reshape",
        "Range",
        "Equal",
        "Where",
        "ConstantOfShape",
        "ReduceProd",
        "Identity",
        "Max",
        "Min",
        "Neg",
    }
)


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # inference refused the model (e.g. > 2 GiB, unknown opset): count what is declared
        return model


def _fold_small_constants(model: onnx.ModelProto, passes: int = 8) -> onnx.ModelProto:
    """Replace the nodes of ``model`` (a copy we own) that compute small tensors from constants, and the ``Shape``
    of values whose shape is known, by initializers; re-infer and repeat until nothing more folds. Returns the
    inferred model."""
    from onnx.reference import ReferenceEvaluator

    opsets = {entry.domain: entry.version for entry in model.opset_import}
    inferred = _infer(model)
    for _ in range(passes):
        graph = inferred.graph
        known = _known_shapes(graph)
        constants: dict[str, onnx.TensorProto] = {
            init.name: init for init in graph.initializer if math.prod(init.dims) <= _SMALL
        }
        values: dict[str, npt.NDArray[Any]] = {}
        kept: list[onnx.NodeProto] = []
        folded: list[onnx.TensorProto] = []
        for node in graph.node:
            outputs: list[npt.NDArray[Any]] | None = None
            if node.domain in _DEFAULT_DOMAINS and node.op_type in _FOLDABLE and len(node.output) == 1:
                if node.op_type == "Shape" and node.input[0] in known:
                    shape = np.array(known[node.input[0]], dtype=np.int64)
                    rank = len(shape)
                    start, end = _attribute(node, "start", 0), _attribute(node, "end", rank)
                    outputs = [shape[slice(start, end)]]
                elif node.op_type == "Size" and node.input[0] in known:
                    outputs = [np.array(math.prod(known[node.input[0]]), dtype=np.int64)]
                elif node.op_type not in ("Shape", "Size") and all(not n or n in constants for n in node.input):
                    feeds = {}
                    for name in node.input:
                        if name and name not in values:
                            values[name] = numpy_helper.to_array(constants[name])
                        if name:
                            feeds[name] = values[name]
                    try:
                        result = ReferenceEvaluator(node, opsets=opsets).run(None, feeds)
                    except Exception:  # not evaluable here: leave the node
                        result = None
                    outputs = [np.asarray(result[0])] if isinstance(result, list) and result else None
            tensor = None
            if outputs is not None and outputs[0].size <= _SMALL:
                try:
                    tensor = numpy_helper.from_array(outputs[0], node.output[0])
                except Exception:  # a value onnx cannot store (e.g. object dtype): leave the node
                    tensor = None
            if tensor is not None and outputs is not None:
                values[node.output[0]] = outputs[0]
                constants[node.output[0]] = tensor
                folded.append(tensor)
            else:
                kept.append(node)
        if not folded:
            return inferred
        folded_names = {tensor.name for tensor in folded}
        graph.ClearField("node")
        graph.node.extend(kept)
        graph.initializer.extend(folded)
        kept_info = [v for v in graph.value_info if v.name not in folded_names]
        graph.ClearField("value_info")
        graph.value_info.extend(kept_info)
        inferred = _infer(inferred)
    return inferred


def model_flops(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> float:
    """2 x the multiply-adds of every MatMul, Gemm, Conv, ConvTranspose, LSTM, GRU and RNN node of ``model``'s main
    graph when its inputs have ``shapes`` (a name -> shape map; inputs not named keep the dims the model declares)."""
    inferred = _fold_small_constants(_with_fixed_inputs(model, shapes))
    known = _known_shapes(inferred.graph)
    return 2.0 * float(sum(node_macs(node, known) for node in inferred.graph.node))
