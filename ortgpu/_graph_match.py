"""Reading the graph around a rewrite's candidate: one-consumer chains, scalar constants, float Casts, and views of
a tensor through data-movement nodes and scalar Muls. Shared by the pattern rewrites (:mod:`ortgpu._attention_fusion`,
:mod:`ortgpu._norm_fusion`); every query applies their common rule: an intermediate has exactly one consumer, reads it
once, and is no graph output, and no other rewrite took the consumer (:meth:`GraphMatcher.view` may widen it to a set of
readers its caller names, and the caller then checks what it takes).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ._rewrites import RewriteContext
from ._strided_view import StridedView
from .loader._model import GraphNode
from .ops.ai_onnx.slice import slice_ranges
from .ops.ai_onnx.transpose import permutation

__all__ = ["GraphMatcher"]

_FLOAT = 1  # TensorProto.FLOAT


class GraphMatcher:
    """Reads the graph around one candidate; every query checks the one-consumer, no-graph-output rule."""

    def __init__(self, ctx: RewriteContext, producers: Mapping[str, GraphNode]) -> None:
        self.ctx = ctx
        self.producers = producers

    def only_user(self, name: str) -> GraphNode | None:
        users = self.ctx.consumers.get(name, [])
        if name in self.ctx.graph_outputs or len(users) != 1 or users[0].domain != "":
            return None
        user = users[0]
        if sum(1 for inp in user.inputs if inp == name) != 1 or user.name in self.ctx.absorbed:
            return None
        return user

    def scalar(self, name: str) -> float | None:
        value = self.ctx.constants.get(name)
        if value is None or value.size != 1 or value.dtype != np.float32:
            return None
        number = float(value.reshape(()))
        return number if np.isfinite(number) else None

    def factor(self, node: GraphNode, operand: str) -> float | None:
        """The factor ``node`` multiplies ``operand`` by (a scalar float32 constant Mul, or Div of it), else None."""
        if node.op_type not in ("Mul", "Div") or len(node.inputs) != 2 or node.inputs[0] == node.inputs[1]:
            return None
        if node.op_type == "Div":
            if node.inputs[0] != operand:
                return None
            divisor = self.scalar(node.inputs[1])
            return None if not divisor else float(np.float32(1.0) / np.float32(divisor))
        return self.scalar(node.inputs[1] if node.inputs[0] == operand else node.inputs[0])

    def is_float_cast(self, node: GraphNode, operand: str) -> bool:
        info = self.ctx.infos.get(operand)
        return (
            node.op_type == "Cast"
            and int(node.attrs.get("to", 0)) == _FLOAT
            and info is not None
            and info.dtype == np.float32
        )

    def view(
        self,
        name: str,
        consumer: GraphNode,
        shared: frozenset[str] = frozenset(),
        stop: frozenset[str] = frozenset(),
    ) -> tuple[str, StridedView, float, list[GraphNode]] | None:
        """``name`` as read by ``consumer``: (source tensor, the strided view of it, factor, the nodes in between),
        walking back through one-consumer data-movement nodes (Transpose, Reshape, Squeeze, Unsqueeze, Flatten,
        Identity, Gather of one constant index, Split, Slice of constant bounds, Expand) and scalar Muls/Divs, as far as
        the view stays one strided view of the source (:class:`~ortgpu._strided_view.StridedView`). ``shared``: nodes
        (by name) that may read a tensor of the chain besides it (the other operands' chains of one fused step, reading
        one packed projection); the caller checks that every node it absorbs is read only inside its step. ``stop``:
        nodes (by name) the walk never takes."""
        if self.ctx.infos.get(name) is None:
            return None
        chain: list[tuple[GraphNode, str, str]] = []  # (node, the operand it reads, its output read), consumer back
        while True:
            producer = self.producers.get(name)
            if (
                producer is None
                or producer.domain != ""
                or producer.name in stop
                or not self._read_by(name, consumer, shared)
            ):
                break
            operand = self._moved_operand(producer)
            if operand is None and producer.op_type in ("Mul", "Div") and len(producer.inputs) == 2:
                candidate = producer.inputs[0] if self.scalar(producer.inputs[1]) is not None else producer.inputs[1]
                candidate_info = self.ctx.infos.get(candidate)
                if (
                    self.factor(producer, candidate) is not None
                    and candidate_info is not None
                    and candidate_info.shape == self.ctx.infos[name].shape
                ):
                    operand = candidate
            if operand is None or self.ctx.infos.get(operand) is None:
                break
            chain.append((producer, operand, name))
            consumer = producer
            name = operand
        # forward from the deepest source; where a step is not one strided view, the source moves past it
        forward = [(node, output) for node, _, output in chain[::-1]]
        start = 0
        while True:
            view: StridedView | None = StridedView.contiguous(self.ctx.infos[name].shape)
            for index in range(start, len(forward)):
                node, output = forward[index]
                view = self._step(node, output, view) if view is not None else None
                if view is None:
                    start = index + 1
                    name = output
                    break
            if view is not None:
                break
        assert view is not None
        absorbed = chain[: len(forward) - start]
        factor = 1.0
        for node, operand, _ in absorbed:
            scale = self.factor(node, operand) if node.op_type in ("Mul", "Div") else None
            factor *= 1.0 if scale is None else scale
        return name, view, factor, [node for node, _, _ in absorbed]

    def _read_by(self, name: str, consumer: GraphNode, shared: frozenset[str]) -> bool:
        """Whether ``consumer`` reads ``name`` once and no node but it and the ``shared`` ones reads it (the rule of
        :meth:`only_user`, widened by ``shared``)."""
        if not shared:
            return self.only_user(name) is consumer
        users = self.ctx.consumers.get(name, [])
        return (
            name not in self.ctx.graph_outputs
            and consumer.domain == ""
            and consumer.name not in self.ctx.absorbed
            and sum(1 for inp in consumer.inputs if inp == name) == 1
            and any(user is consumer for user in users)
            and all(user is consumer or user.name in shared for user in users)
        )

    def _moved_operand(self, node: GraphNode) -> str | None:
        """The tensor whose elements data-movement ``node`` only rearranges, or None (not such a node here)."""
        if not node.inputs or not node.inputs[0]:
            return None
        if node.op_type in ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"):
            return node.inputs[0]
        if node.op_type == "Gather" and len(node.inputs) == 2:
            index = self.ctx.constants.get(node.inputs[1])
            if index is not None and index.ndim == 0 and index.dtype.kind in "iu":
                return node.inputs[0]
        if node.op_type == "Split" or (node.op_type == "Expand" and len(node.inputs) == 2):
            return node.inputs[0]
        if node.op_type == "Slice" and all(name in self.ctx.constants for name in node.inputs[1:] if name):
            return node.inputs[0]
        return None

    def _slice_ranges(self, node: GraphNode, shape: tuple[int, ...]) -> list[tuple[int, int, int]] | None:
        """Slice ``node``'s (first index, -1, step) per axis of ``shape``, clamped as the operator clamps them
        (:func:`~ortgpu.ops.ai_onnx.slice.slice_ranges`); None where its arguments are refused."""
        if node.opset < 10:
            starts, axes, steps = node.attrs.get("starts"), node.attrs.get("axes"), None
        else:
            values = [self.ctx.constants.get(n) if n else None for n in (list(node.inputs) + ["", "", "", ""])[1:5]]
            starts, axes, steps = values[0], values[2], values[3]
        if starts is None:
            return None
        listed = [None if v is None else [int(x) for x in np.asarray(v).reshape(-1)] for v in (starts, axes, steps)]
        assert listed[0] is not None
        try:
            return slice_ranges(shape, listed[0], None, listed[1], listed[2], node.opset)
        except UnsupportedOpError:
            return None

    def _step(self, node: GraphNode, output: str, view: StridedView) -> StridedView | None:
        """``view`` after data-movement ``node``, as its ``output`` (None: not one strided view of the source)."""
        out = self.ctx.infos.get(output)
        if out is None:
            return None
        if node.op_type == "Transpose":
            try:
                perm = tuple(permutation(node.attrs, len(view.shape)))
            except UnsupportedOpError:
                return None
            moved = view.transpose(perm)
        elif node.op_type == "Gather":
            axis = int(node.attrs.get("axis", 0))
            if not -len(view.shape) <= axis < len(view.shape):
                return None
            selected = view.select(axis % len(view.shape), int(self.ctx.constants[node.inputs[1]]))
            if selected is None:
                return None
            moved = selected
        elif node.op_type == "Split":  # the output's part of the axis, after the parts of the outputs before it
            axis = int(node.attrs.get("axis", 0)) % len(view.shape)
            before = 0
            for earlier in node.outputs[: list(node.outputs).index(output)]:
                info = self.ctx.infos.get(earlier)
                if info is None:
                    return None
                before += info.shape[axis]
            narrowed = view.narrow(axis, before, out.shape[axis])
            if narrowed is None:
                return None
            moved = narrowed
        elif node.op_type == "Expand":  # the output's shape: size-1 axes repeated with stride 0
            expanded = view.expand(out.shape)
            if expanded is None:
                return None
            moved = expanded
        elif node.op_type == "Slice":
            ranges = self._slice_ranges(node, view.shape)
            if ranges is None:
                return None
            sliced: StridedView | None = view
            for axis, (start, _, step) in enumerate(ranges):  # (a negative step: narrow refuses it)
                sliced = sliced.narrow(axis, start, out.shape[axis], step) if sliced is not None else None
            if sliced is None:
                return None
            moved = sliced
        elif node.op_type in ("Mul", "Div"):
            moved = view  # a scalar factor, folded into the caller's scale
        else:  # Reshape, Squeeze, Unsqueeze, Flatten, Identity: the same elements in C order
            reshaped = view.reshape(out.shape)
            if reshaped is None:
                return None
            moved = reshaped
        return moved if moved.shape == tuple(out.shape) else None
