"""``python -m ortgpu.demo``: build a small MLP, run it on the default device, capture and replay it.

Prints the device, the result's error against a numpy reference, and
median timings of an ordinary run and of a captured replay (end to end:
upload, run or replay, readback), timed alternately so that both see the
same machine state, with their ratio spelled out: captured time / uncaptured
time, lower is better.  Capture saves host work per run (planning, binding,
encoding), so it pays where that work dominates, as on a real GPU; on lavapipe
(no GPU) the kernels themselves run on the CPU and dominate, so the ratio is
near 1 there.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

import ortgpu


def build_mlp(
    layers: int, width: int, batch: int, seed: int = 0
) -> tuple[onnx.ModelProto, list[tuple[np.ndarray, np.ndarray]]]:
    """``layers`` x [MatMul width x width, Add bias, Relu] as an ONNX model, with its weights."""
    rng = np.random.default_rng(seed)
    nodes, initializers, weights = [], [], []
    current = "X"
    for index in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = (rng.standard_normal(width) * 0.1).astype(np.float32)
        weights.append((w, b))
        initializers += [numpy_helper.from_array(w, f"W{index}"), numpy_helper.from_array(b, f"B{index}")]
        nodes += [
            helper.make_node("MatMul", [current, f"W{index}"], [f"mm{index}"]),
            helper.make_node("Add", [f"mm{index}", f"B{index}"], [f"add{index}"]),
            helper.make_node("Relu", [f"add{index}"], ["Y" if index == layers - 1 else f"h{index}"]),
        ]
        current = f"h{index}"
    graph = helper.make_graph(
        nodes,
        "demo_mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, width])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, weights


def reference(x: npt.NDArray[np.float32], weights: list[tuple[np.ndarray, np.ndarray]]) -> npt.NDArray[np.float32]:
    for w, b in weights:
        x = np.maximum(x @ w + b, 0).astype(np.float32)
    return x


def relative_error(actual: npt.NDArray[np.float32], expected: npt.NDArray[np.float32]) -> float:
    """``||actual - expected|| / ||expected||``."""
    return float(np.linalg.norm(actual - expected)) / max(float(np.linalg.norm(expected)), 1e-30)


def alternating_median_ms(steps: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median milliseconds of each step, the steps called in turn ``repeats`` times (after one warm-up round)."""
    times: list[list[float]] = [[] for _ in steps]
    for round_index in range(repeats + 1):
        for step, samples in zip(steps, times):
            start = time.perf_counter()
            step()
            if round_index:
                samples.append(time.perf_counter() - start)
    return [statistics.median(samples) * 1e3 for samples in times]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", choices=("wgpu", "fake"), default="wgpu")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)

    env = ortgpu.Env(backend=args.backend)
    device = env.default_device
    print(
        f"device: {device.name} ({device.backend_type}, {device.adapter_type}, vendor_id=0x{device.vendor_id:04x}, "
        f"device_id=0x{device.device_id:04x})"
    )
    model, weights = build_mlp(args.layers, args.width, args.batch)
    rng = np.random.default_rng(1)
    batch = rng.standard_normal((args.batch, args.width)).astype(np.float32)

    with ortgpu.InferenceSession(model.SerializeToString(), env=env, device=device, graph_capture=True) as sess:
        placement = sess.get_node_placement()
        on_gpu = sum(1 for p in placement if p.placement == "webgpu")
        print(
            f"model: {args.layers} x [MatMul {args.width}x{args.width} + Add + Relu], batch {args.batch}; "
            f"{on_gpu}/{len(placement)} nodes placed on WebGPU"
        )
        (out,) = sess.run(None, {"X": batch})
        expected = reference(batch, weights)
        error = relative_error(out, expected)
        print(f"run(): output {list(out.shape)}, relative error vs numpy {error:.2e}")

        x = env.shared_allocator(device).from_numpy(batch)
        y = sess.allocator.empty(expected.shape, "float32")
        binding = sess.io_binding()
        binding.bind_input("X", x)
        binding.bind_output("Y", y)
        with sess.capture(binding, graph_id=0) as graph:
            second = (batch * 0.5).astype(np.float32)
            x.update_inplace(second)
            graph.replay()
            expected_second = reference(second, weights)
            replay_error = relative_error(y.to_numpy(), expected_second)
            print(
                f"captured graph: {graph.dispatch_count} dispatches; replay on new input, relative error {replay_error:.2e}"
            )

            def uncaptured() -> object:
                return sess.run(None, {"X": batch})

            def captured() -> object:
                x.update_inplace(batch)
                graph.replay()
                return y.to_numpy()

            run_ms, replay_ms = alternating_median_ms([uncaptured, captured], args.repeats)
        print(
            f"end to end, median of {args.repeats}: run() {run_ms:.3f} ms, update_inplace + replay + to_numpy "
            f"{replay_ms:.3f} ms"
        )
        if device.backend_type == "Fake":
            where = "the fake backend runs the kernels' numpy twins on the host"
        elif device.adapter_type == "CPU":
            where = (
                "on a CPU adapter (lavapipe when there is no GPU) the kernels themselves run on the CPU and dominate"
            )
        else:
            where = "where the kernels themselves dominate, it gains little"
        print(
            f"captured (replay) / uncaptured (run()) time per run: {replay_ms / run_ms:.2f} (lower is better: "
            f"capture pays when per-run host work dominates, as on a real GPU; {where})"
        )
        ok = error < 1e-4 and replay_error < 1e-4
    env.close()
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
