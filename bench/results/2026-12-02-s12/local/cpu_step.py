"""Session 12, on the development machine (lavapipe): the calling thread's CPU time per captured end_to_end step
(16 chained Relu on [1, 256]), by part (update_inplace, replay, to_numpy), median of rounds of 500 steps.  Thread CPU
excludes lavapipe's own threads (the "GPU" work) and the time asleep in a blocking poll: it is the host work of the
step on its thread, Python and wgpu-native together.  Usage: python cpu_step.py [rounds]"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
from onnx import TensorProto, helper

import ortgpu
from bench.harness import OrtgpuArms


def main() -> None:
    nodes, previous = [], "X"
    for i in range(16):
        nodes.append(helper.make_node("Relu", [previous], [f"r{i}"]))
        previous = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, 256])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"X": np.random.default_rng(0).random((1, 256), dtype=np.float32)}
    arm = OrtgpuArms(model.SerializeToString(), feeds, ortgpu.Env())
    replayed: Any = arm.capture()
    for _ in range(200):
        arm.captured_end_to_end()
    parts: dict[str, Callable[[], object]] = {"upload": arm._upload, "replay": replayed.replay, "read": arm._read}
    per_part: dict[str, list[float]] = {name: [] for name in parts}
    totals: list[float] = []
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 7):
        spent = dict.fromkeys(parts, 0.0)
        start = time.thread_time()
        for _ in range(500):
            for name, call in parts.items():
                before = time.thread_time()
                call()
                spent[name] += time.thread_time() - before
        totals.append((time.thread_time() - start) / 500 * 1e6)
        for name in parts:
            per_part[name].append(spent[name] / 500 * 1e6)
    print(
        f"thread CPU us/step: total {statistics.median(totals):.1f} "
        + " ".join(f"{name} {statistics.median(values):.1f}" for name, values in per_part.items())
    )
    arm.close()


if __name__ == "__main__":
    main()
