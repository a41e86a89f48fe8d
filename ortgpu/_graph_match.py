"""Reading the graph around a rewrite's candidate: one-consumer chains, scalar constants, float Casts, and views of
a tensor through Transposes and scalar Muls.  Shared by the pattern rewrites (:mod:`ortgpu._attention_fusion`,
:mod:`ortgpu._norm_fusion`); every query applies their common rule: an intermediate has exactly one consumer, reads
it once, and is no graph output, and no other rewrite took the consumer.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ._rewrites import RewriteContext
from .loader._model import GraphNode
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

    def view(self, name: str, consumer: GraphNode) -> tuple[str, tuple[int, ...], float, list[GraphNode]] | None:
        """``name`` as read by ``consumer``: (source tensor, permutation, factor, the nodes in between), walking
        back through one-consumer Transposes and scalar Muls/Divs."""
        info = self.ctx.infos.get(name)
        if info is None:
            return None
        perm = tuple(range(len(info.shape)))
        factor = 1.0
        nodes: list[GraphNode] = []
        while True:
            producer = self.producers.get(name)
            if producer is None or producer.domain != "" or self.only_user(name) is not consumer:
                break
            if producer.op_type == "Transpose" and producer.inputs:
                source = self.ctx.infos.get(producer.inputs[0])
                if source is None or len(source.shape) != len(perm):
                    break
                try:
                    moved = tuple(permutation(producer.attrs, len(source.shape)))
                except UnsupportedOpError:
                    break
                perm = tuple(moved[axis] for axis in perm)
                name = producer.inputs[0]
            elif producer.op_type in ("Mul", "Div") and len(producer.inputs) == 2:
                operand = producer.inputs[0] if self.scalar(producer.inputs[1]) is not None else producer.inputs[1]
                operand_info = self.ctx.infos.get(operand)
                scale = self.factor(producer, operand)
                if scale is None or operand_info is None or operand_info.shape != info.shape:
                    break
                factor *= scale
                name = operand
            else:
                break
            nodes.append(producer)
            consumer = producer
            info = self.ctx.infos[name]
        return name, perm, factor, nodes
