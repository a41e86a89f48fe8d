"""The planner's graph rewrites follow ``fuse``: BatchNormalization is folded into its Conv only when fusing.

With ``fuse=False`` (``plan_model`` or ``InferenceSession``) every node of the loaded graph is a step of its own,
BatchNormalization included; both ways match onnxruntime.
"""

from __future__ import annotations

import models
import numpy as np
import onnx
import onnxruntime
import pytest

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS

CAPS = DeviceCaps(frozenset(), DEFAULT_FAKE_LIMITS)

CASES = {
    "resnet": (lambda: models.resnet(channels=8, size=16, blocks=2), {"X": (2, 3, 16, 16)}),
    "depthwise": (lambda: models.depthwise_separable(channels=8, out_channels=16, size=12), {"X": (1, 8, 12, 12)}),
}


def _batch_norms(proto: onnx.ModelProto) -> set[str]:
    return {node.name for node in proto.graph.node if node.op_type == "BatchNormalization"}


def _named(proto: onnx.ModelProto) -> onnx.ModelProto:
    for index, node in enumerate(proto.graph.node):
        node.name = node.name or f"n_{node.op_type}_{index}"
    return proto


def _ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual.astype(np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30))


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_folds_batch_norm_only_when_fusing(case: str) -> None:
    build, shapes = CASES[case]
    proto = _named(build())
    norms = _batch_norms(proto)
    assert norms
    model = load_model(proto)
    # The loader leaves the graph as it is: folding is a rewrite of the planner.
    assert {n.name for n in model.nodes if n.op_type == "BatchNormalization"} == norms
    assert not any(name.endswith(("::bn_folded_weight", "::bn_folded_bias")) for name in model.constants)

    fused = plan_model(model, shapes, CAPS)
    assert not any("BatchNormalization" in step.op_types for step in fused.steps)
    assert norms <= set(fused.folded_nodes)
    assert any(name.endswith("::bn_folded_weight") for name in fused.constants)

    unfused = plan_model(model, shapes, CAPS, fuse=False)
    own = [step for step in unfused.steps if step.op_types == ("BatchNormalization",)]
    assert {step.name for step in own} == norms
    assert all(step.placement == "webgpu" for step in own)
    assert all(len(step.op_types) == 1 for step in unfused.steps)
    assert not norms & set(unfused.folded_nodes)
    assert not any(name.endswith(("::bn_folded_weight", "::bn_folded_bias")) for name in unfused.constants)

    # A later plan of the same model reuses the folded weights (the same arrays, not a copy per plan).
    again = plan_model(model, {name: (3,) + shape[1:] for name, shape in shapes.items()}, CAPS)
    for name, value in fused.constants.items():
        if name.endswith("::bn_folded_weight"):
            assert again.constants[name] is value


@pytest.mark.parametrize("fuse", [True, False])
def test_session_fuse_false_keeps_batch_norm_steps_and_matches_onnxruntime(env: ortgpu.Env, fuse: bool) -> None:
    build, shapes = CASES["resnet"]
    proto = _named(build())
    norms = _batch_norms(proto)
    feeds = models.random_feeds(proto, shapes)
    expected = _ort(proto, feeds)
    with ortgpu.InferenceSession(proto.SerializeToString(), env=env, fuse=fuse) as sess:
        placement = sess.get_node_placement(shapes)
        placed = {p.node for p in placement if p.op_type == "BatchNormalization"}
        assert placed == (set() if fuse else norms)
        assert all(p.placement == "webgpu" for p in placement)
        outputs = sess.run(None, feeds)
    for got, want in zip(outputs, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert _rel_err(got, want) < 1e-4
