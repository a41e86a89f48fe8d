"""Asynchronous runs (issue 15): ``await session.run_async(...)``, onnxruntime's callback spelling
``session.run_async(output_names, feeds, callback, user_data)``, and ``await graph.replay_async()``, on both
backends: results equal synchronous runs, the event loop keeps running while a run is pending, and an error
reaches only its own caller.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import models
import numpy as np
import onnxruntime
import pytest

from ortgpu import CaptureStateError, DtypeError, Env, InferenceSession

WIDTH, BATCH = 16, 4
MODEL = models.mlp(layers=2, width=WIDTH, batch=BATCH).SerializeToString()
_ORT = onnxruntime.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
_rng = np.random.default_rng(151)


def image() -> np.ndarray:
    return _rng.standard_normal((BATCH, WIDTH)).astype(np.float32)


def reference(x: np.ndarray) -> np.ndarray:
    return np.asarray(_ORT.run(None, {"X": x})[0])


def test_awaited_runs_equal_synchronous_runs(env: Env) -> None:
    sessions = [InferenceSession(MODEL, env=env) for _ in range(2)]
    xs = [image() for _ in range(8)]

    async def main() -> list[list[Any]]:
        return await asyncio.gather(*(sessions[i % 2].run_async(None, {"X": x}) for i, x in enumerate(xs)))

    try:
        results = asyncio.run(main())
        for i, (x, result) in enumerate(zip(xs, results)):
            expected = sessions[i % 2].run(["Y"], {"X": x})
            assert len(result) == 1
            np.testing.assert_array_equal(result[0], expected[0])
            np.testing.assert_allclose(result[0], reference(x), rtol=1e-5, atol=1e-5)
    finally:
        for sess in sessions:
            sess.close()


def test_the_event_loop_runs_while_a_run_is_pending(env: Env) -> None:
    """The run cannot finish before another coroutine has made progress: the test holds the session's run lock
    (what a run waits for) and only a ticking coroutine, on the same loop, lets it go."""
    with InferenceSession(MODEL, env=env) as sess:
        x = image()
        lock = sess._runner.lock
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            for _ in range(20):
                ticks += 1
                await asyncio.sleep(0.001)
            lock.release()

        async def main() -> list[Any]:
            lock.acquire()
            pending = sess.run_async(None, {"X": x})
            await asyncio.sleep(0.01)
            assert not asyncio.ensure_future(pending).done()  # the run waits for the lock; the loop slept meanwhile
            ticking = asyncio.ensure_future(ticker())
            result = await pending
            await ticking
            return result

        result = asyncio.run(main())
        assert ticks == 20
        np.testing.assert_allclose(result[0], reference(x), rtol=1e-5, atol=1e-5)


def test_errors_reach_only_their_caller(env: Env) -> None:
    with InferenceSession(MODEL, env=env) as first, InferenceSession(MODEL, env=env) as second:
        good = image()

        async def main() -> list[Any]:
            return await asyncio.gather(
                first.run_async(None, {"X": good.astype(np.float64)}),  # wrong dtype: DtypeError, to this caller
                second.run_async(None, {"X": good}),
                first.run_async(None, {"X": good}),  # the failed call left `first` usable
                return_exceptions=True,
            )

        bad, ok, after = asyncio.run(main())
        assert isinstance(bad, DtypeError)
        for result in (ok, after):
            assert isinstance(result, list)
            np.testing.assert_allclose(result[0], reference(good), rtol=1e-5, atol=1e-5)
        with pytest.raises(RuntimeError):
            first.run_async(None, {"X": good})  # the awaitable spelling needs a running event loop


def test_callback_spelling(env: Env) -> None:
    with InferenceSession(MODEL, env=env) as sess:
        x = image()
        done = threading.Event()
        calls: list[tuple[Any, Any, Any, str]] = []

        def callback(results: Any, user_data: Any, error: Any) -> None:
            calls.append((results, user_data, error, threading.current_thread().name))
            if len(calls) == 2:
                done.set()

        marker = object()
        assert sess.run_async(["Y"], {"X": x}, callback, marker) is None
        sess.run_async(None, {"X": x.astype(np.float64)}, callback, "bad")
        assert done.wait(60)
        by_data = {id(c[1]): c for c in calls}
        results, _, error, thread = by_data[id(marker)]
        assert error == "" and thread != threading.current_thread().name  # onnxruntime's empty status on success
        np.testing.assert_allclose(results[0], reference(x), rtol=1e-5, atol=1e-5)
        failed = [c for c in calls if c[1] == "bad"][0]
        assert failed[0] is None and isinstance(failed[2], DtypeError)
        with pytest.raises(Exception, match="callback must be callable"):
            sess.run_async(None, {"X": x}, "not callable", None)  # type: ignore[call-overload]


def test_replay_async(env: Env) -> None:
    with InferenceSession(MODEL, env=env, graph_capture=True) as sess:
        x_value = sess.allocator.from_numpy(image())
        y_value = sess.allocator.empty((BATCH, WIDTH), "float32")
        binding = sess.io_binding()
        binding.bind_input("X", x_value)
        binding.bind_output("Y", y_value)
        graph = sess.capture(binding, 0)
        xs = [image() for _ in range(3)]

        async def main() -> list[np.ndarray]:
            got = []
            for x in xs:
                x_value.update_inplace(x)
                await graph.replay_async()
                got.append(y_value.to_numpy())
            return got

        for x, y in zip(xs, asyncio.run(main())):
            np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-5)
        assert graph.replays == 3
        graph.release()

        async def released() -> None:
            await graph.replay_async()

        with pytest.raises(CaptureStateError, match="released"):
            asyncio.run(released())
