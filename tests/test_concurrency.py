"""Sessions sharing one device from several threads: every result stays the one its own inputs give."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime
import pytest

import ortgpu
from bench.models import mlp

WIDTH = 32
MODELS = [mlp(layers=2, width=WIDTH, batch=2, seed=seed) for seed in (1, 2)]


def references(model_index: int, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(MODELS[model_index].SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"X": x})[0])


@pytest.mark.parametrize("execution_mode", ["concurrent", "serialized"])
def test_two_sessions_replay_and_run_from_two_threads(backend_name: str, execution_mode: str) -> None:
    iterations = 25
    rng = np.random.default_rng()
    inputs = [[rng.standard_normal((2, WIDTH)).astype(np.float32) for _ in range(iterations)] for _ in MODELS]
    expected = [[references(m, x) for x in inputs[m]] for m in range(len(MODELS))]
    with ortgpu.Env(backend=backend_name, execution_mode=execution_mode) as env:  # type: ignore[arg-type]
        device = env.default_device
        sessions = [
            ortgpu.InferenceSession(m.SerializeToString(), env=env, device=device, graph_capture=True) for m in MODELS
        ]
        failures: list[BaseException] = []
        start = threading.Barrier(len(sessions))

        def work(index: int) -> None:
            try:
                sess = sessions[index]
                x = env.shared_allocator(device).from_numpy(inputs[index][0])
                y = sess.allocator.empty((2, WIDTH), "float32")
                binding = sess.io_binding()
                binding.bind_input("X", x)
                binding.bind_output("Y", y)
                start.wait()
                with sess.capture(binding, graph_id=0) as graph:
                    for step in range(iterations):
                        x.update_inplace(inputs[index][step])
                        if step % 3 == 2:  # an ordinary run with transient feeds, interleaved with replays
                            (out,) = sess.run(None, {"X": inputs[index][step]}, ortgpu.RunOptions(gpu_graph_id=-1))
                        elif step % 4 == 1:  # the output copies in the replay's submission, through the device's
                            (out,) = graph.replay_and_read()  # one staging buffer, which both threads' reads share
                        else:
                            graph.replay()
                            out = y.to_numpy()
                        np.testing.assert_allclose(out, expected[index][step], rtol=1e-5, atol=1e-5)
            except BaseException as error:  # reported in the main thread
                failures.append(error)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(sessions))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a worker thread hung"
        for sess in sessions:
            sess.close()
        if failures:
            raise failures[0]
        assert env.live_handles() == sum(
            len(cache)
            for d, cache in list(ortgpu._device_caches._pipeline_caches.items())
            if d is device._native_device()
        )
