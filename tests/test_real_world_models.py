"""Models with the structure of real third-party ones (``real_world_models.py``), on both backends, against
onnxruntime's CPU provider on fresh random inputs (issue 12): relative error at most 1e-4 for float32 outputs.

Quantized models round to integers inside: an activation that lands within float32 rounding of a quantization
step may round the other way in one runtime, so for them at most one element in 10000 may differ by one output
quantum, and the rest must match to 1e-4.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from real_world_models import MODELS

import ortgpu


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / max(float(np.linalg.norm(expected)), 1e-30))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_world_structure_matches_onnxruntime(env: ortgpu.Env, name: str) -> None:
    build, feeds_shapes = MODELS[name]
    model = build()
    data = model.SerializeToString()
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng()  # fresh inputs each run
    with ortgpu.InferenceSession(data, env=env) as session:
        for shapes in feeds_shapes:
            feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
            expected = reference.run(None, feeds)
            actual = session.run(None, feeds)
            for want, got in zip(expected, actual):
                assert got.shape == want.shape and got.dtype == want.dtype
                if name.startswith("quantized"):
                    quantum = 0.2 if name == "quantized_mlp" else 0.1
                    off = np.abs(got - want) > 1e-4 * max(1.0, float(np.abs(want).max()))
                    assert off.mean() <= 1e-4 + 1.0 / want.size, f"{off.sum()} of {want.size} elements differ"
                    assert np.all(np.abs(got - want)[off] <= quantum * 1.001)
                else:
                    assert relative_error(got, want) <= 1e-4, f"{name}: relative error {relative_error(got, want)}"
