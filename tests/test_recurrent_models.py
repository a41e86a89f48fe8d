"""Recurrent and control-flow models with real-world structure (issue 13), built from seeded generators, on both
backends against onnxruntime's CPU provider on fresh inputs (relative error <= 1e-4): a CNN + 2-layer bidirectional
LSTM text recognizer, a GRU encoder fed ``sequence_lens``, a streaming voice-activity model with state inputs and
outputs and an ``If`` on its sample rate, and a ``Loop`` that decodes greedily for a fixed number of steps.

The model builders live in ``bench/recurrent_models.py`` (``python -m bench`` runs larger instances of two of
them). Every node of these runs on the device: the recurrent operators as WGSL kernels, the ``If`` inlined for the
planned sample rate, the ``Loop`` unrolled (``get_node_placement`` says so); tests/test_capture_control_flow.py
captures them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime
import pytest

import ortgpu
from bench.recurrent_models import greedy_decoder, gru_encoder, lstm_recognizer, streaming_vad


def _feeds(name: str, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Fresh inputs; several calls where a model's control inputs change (sample rate, lengths, start token)."""
    if name == "lstm_recognizer":
        return [{"image": rng.standard_normal((1, 1, 8, 24)).astype(np.float32)}]
    if name == "gru_encoder":
        return [
            {
                "x": rng.standard_normal((7, 3, 6)).astype(np.float32),
                "lengths": np.array(lengths, np.int32),
                "h0": rng.standard_normal((1, 3, 10)).astype(np.float32),
            }
            for lengths in ([7, 3, 5], [1, 7, 2])
        ]
    if name == "streaming_vad":
        h = np.zeros((1, 1, 8), np.float32)
        return [
            {"audio": rng.standard_normal(64).astype(np.float32), "sr": np.array(rate, np.int64), "h": h, "c": h}
            for rate in (16000, 8000, 16000)
        ]
    return [
        {"start": np.array([token], np.int64), "state": rng.standard_normal((1, 8)).astype(np.float32)}
        for token in (0, 4)
    ]


MODELS: dict[str, Callable[[], bytes]] = {
    "lstm_recognizer": lstm_recognizer,
    "gru_encoder": gru_encoder,
    "streaming_vad": streaming_vad,
    "greedy_decoder": greedy_decoder,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_recurrent_model_matches_onnxruntime(env: ortgpu.Env, name: str) -> None:
    model = MODELS[name]()
    reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    with ortgpu.InferenceSession(model, env=env) as session:
        for feeds in _feeds(name, np.random.default_rng()):
            expected = reference.run(None, feeds)
            actual = session.run(None, feeds)
            for want, got in zip(expected, actual):
                assert got.shape == want.shape and got.dtype == want.dtype, name
                if want.dtype.kind == "f":
                    error = np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30)
                    assert error <= 1e-4, f"{name}: relative error {error}"
                else:
                    np.testing.assert_array_equal(got, want)
        placement = session.get_node_placement(
            {n: a.shape for n, a in _feeds(name, np.random.default_rng(0))[0].items()},
            input_values=_feeds(name, np.random.default_rng(0))[0],
        )
        assert all(p.placement == "webgpu" and p.capturable for p in placement), placement
        recurrent = [p for p in placement if p.op_type in ("LSTM", "GRU", "If", "Loop")]
        assert recurrent, placement
        for row in recurrent:
            if row.op_type in ("If", "Loop"):  # expanded when planning: the row says how, its nodes follow
                assert "inlined" in row.reason or "unrolled" in row.reason, row
                assert any(p.node.startswith(row.node + "/") for p in placement), placement
