"""``If`` nodes of a decoder whose condition is a function of the sequence's length, decided on the host per step.

onnxruntime-genai's builder writes such an ``If`` for LongRoPE models (Phi-3/Phi-4): ``If(total_sequence_length >
original_max_position_embeddings)`` picks the short or the long rotary caches, ``total_sequence_length`` being the
attention mask's width, which onnxruntime-genai grows by a position each step.  A generator with a static cache
binds the mask at its full width, so that width no longer says how long the sequence is, and the condition read
from it would pick the long caches from the first token.

:func:`host_conditions` rewires each such ``If`` to a boolean graph input of its own and returns how to compute
it: the condition's ancestors (standard operators reading only the attention mask) evaluated with onnx's reference
evaluator on a mask of ones as wide as the sequence, as onnxruntime-genai feeds it.  The generator binds the
result as a host array, so each value has its own plan with the branch inlined, and one captured graph per value:
the replays pick the graph whose condition holds, and a graph never replays with a condition it was not captured
for (the value is checked by a look before each replay).  An ``If`` whose condition reads anything else (token
ids, the cache, a value computed on the device) is left as it is: it runs as the plan decides (see the README's
"Control flow"), which cannot be captured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = ["HostCondition", "host_conditions"]


@dataclass
class HostCondition:
    """One rewired ``If``: its graph input ``name`` and the condition as a function of the sequence's length."""

    name: str
    evaluator: Any
    mask: str
    batch: int
    values: dict[int, bool] = field(default_factory=dict)

    def at(self, length: int) -> bool:
        """The condition for a sequence of ``length`` positions (memoized: a step costs a dictionary look)."""
        value = self.values.get(length)
        if value is None:
            result = self.evaluator.run(None, {self.mask: np.ones((self.batch, length), np.int64)})[0]
            value = self.values[length] = bool(np.asarray(result).reshape(-1)[0])
        return value


def _ancestors(graph: onnx.GraphProto, name: str) -> tuple[list[onnx.NodeProto], set[str]] | None:
    """The nodes computing ``name`` (in graph order) and the graph inputs they read; None where one reads a
    subgraph or a non-standard operator (the reference evaluator would not run it)."""
    producers = {output: node for node in graph.node for output in node.output if output}
    inputs = {value.name for value in graph.input}
    chosen: dict[int, onnx.NodeProto] = {}
    read: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        node = producers.get(current)
        if node is None:
            if current in inputs:
                read.add(current)
            continue
        if id(node) in chosen:
            continue
        if node.domain not in ("", "ai.onnx") or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
        ):
            return None
        chosen[id(node)] = node
        stack.extend(i for i in node.input if i)
    return [node for node in graph.node if id(node) in chosen], read


def host_conditions(model: onnx.ModelProto, mask: str, batch: int) -> list[HostCondition]:
    """Rewire (in place) every top-level ``If`` whose condition reads only the attention mask ``mask``; returns
    them in graph order."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    found: list[HostCondition] = []
    for node in graph.node:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.input[0]:
            continue
        ancestry = _ancestors(graph, node.input[0])
        if ancestry is None or ancestry[1] != {mask}:
            continue
        nodes, _ = ancestry
        used = {i for n in nodes for i in n.input}
        sub = helper.make_graph(
            nodes,
            "condition",
            [helper.make_tensor_value_info(mask, TensorProto.INT64, [batch, "length"])],
            [helper.make_tensor_value_info(node.input[0], TensorProto.BOOL, None)],
            [constants[n] for n in sorted(used) if n in constants],
        )
        evaluator = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import))
        name = f"ortgpu_condition_{len(found)}"
        node.input[0] = name
        graph.input.append(helper.make_tensor_value_info(name, TensorProto.BOOL, []))
        found.append(HostCondition(name, evaluator, mask, batch))
    return found
