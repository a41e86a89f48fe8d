"""``python -m bench.wgsl_digest``: a digest of every WGSL kernel ortgpu generates for a fixed set of models.

A refactor that should not change the generated kernels (moving operators, splitting planners) is checked by
running this before and after and comparing the digests: the models are the ONNX node tests shipped with the
installed ``onnx`` package plus the bench's own models, planned and run once on the fake backend (which receives
the same WGSL the wgpu backend would compile, and runs the numpy twins, so no GPU is needed).

Output: one line per distinct kernel (``sha256  label``), sorted, then a final ``digest <sha256> kernels <n>``
line over all of them.  ``--list FILE`` writes the per-kernel lines to FILE so two runs can be diffed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

import ortgpu


@contextlib.contextmanager
def recording_kernels(env: ortgpu.Env) -> Iterator[dict[str, str]]:
    """Within the block, every pipeline compiled on ``env``'s default device is recorded (WGSL -> label).

    The device's class method is wrapped for the block's duration only: the digest is a probe, and the protocol
    offers no compile hook.
    """
    native = env.default_device._native_device()
    device_class = type(native)
    original = device_class.create_compute_pipeline
    seen: dict[str, str] = {}

    def recorder(self: Any, wgsl: str, *args: Any, **kwargs: Any) -> int:
        seen.setdefault(wgsl, str(kwargs.get("label", "")))
        return int(original(self, wgsl, *args, **kwargs))

    device_class.create_compute_pipeline = recorder  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        device_class.create_compute_pipeline = original  # type: ignore[method-assign]


def _node_test_models() -> Iterator[tuple[bytes, dict[str, Any]]]:
    """Each ONNX node test of the installed onnx package: its model and its first data set's inputs."""
    import onnx.backend.test.loader as loader
    from onnx import numpy_helper

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = loader.load_node_model_tests()
    for case in sorted(cases, key=lambda c: c.name):
        model: Any = case.model
        if model is None or not case.data_sets:
            continue
        inputs, _ = case.data_sets[0]
        names = [value.name for value in model.graph.input]
        feeds: dict[str, Any] = {}
        for name, value in zip(names, inputs):
            stored: Any = value  # a TensorProto, or already a numpy value
            feeds[name] = numpy_helper.to_array(stored) if hasattr(stored, "raw_data") else stored
        yield model.SerializeToString(), feeds


def _shapes(model: Any, batch: int) -> dict[str, tuple[int, ...]]:
    """Each graph input's shape with its symbolic dimensions set to ``batch``."""
    return {
        value.name: tuple(d.dim_value if d.HasField("dim_value") else batch for d in value.type.tensor_type.shape.dim)
        for value in model.graph.input
    }


def _bench_models() -> Iterator[tuple[bytes, dict[str, Any]]]:
    """The bench's own models at small sizes, batch 1 and 4."""
    from .models import conv_chain, matmul_chain, mlp, random_feeds, resnet, transformer_encoder

    for model in (
        mlp(layers=4, width=64),
        resnet(),
        transformer_encoder(),
        matmul_chain(k=128),
        conv_chain(channels=8, size=16),
    ):
        for batch in (1, 4):
            yield model.SerializeToString(), random_feeds(model, _shapes(model, batch))


def collect(env: ortgpu.Env, node_tests: bool = True, bench_models: bool = True) -> dict[str, str]:
    """WGSL -> label of every kernel compiled while running the selected models once on ``env``.

    A model ortgpu refuses (an unsupported operator, bad data) contributes the kernels compiled before the refusal.
    """
    sources: list[Iterator[tuple[bytes, dict[str, Any]]]] = []
    if node_tests:
        sources.append(_node_test_models())
    if bench_models:
        sources.append(_bench_models())
    with recording_kernels(env) as seen:
        for source in sources:
            for model, feeds in source:
                with contextlib.suppress(Exception), np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    session = ortgpu.InferenceSession(model, env=env, device=env.default_device)
                    try:
                        session.run(None, feeds)
                    finally:
                        session.close()
    return dict(seen)


def digest_lines(kernels: dict[str, str]) -> list[str]:
    """``sha256  label`` per kernel, sorted."""
    return sorted(f"{hashlib.sha256(wgsl.encode()).hexdigest()}  {label}" for wgsl, label in kernels.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--list", metavar="FILE", help="write the per-kernel lines to FILE")
    parser.add_argument("--no-node-tests", action="store_true", help="only the bench's models")
    args = parser.parse_args(argv)
    env = ortgpu.Env(backend="fake")
    try:
        lines = digest_lines(collect(env, node_tests=not args.no_node_tests))
    finally:
        env.close()
    if args.list:
        with open(args.list, "w", encoding="utf-8") as listing:
            listing.write("\n".join(lines) + "\n")
    total = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    print(f"digest {total} kernels {len(lines)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
