"""Issue 15's soak test: threads mixing every kind of work on one device for a bounded time, on both backends.

Each thread loops until the deadline, picking at random: an ordinary run of a session shared by all threads or of
its own; ``await session.run_async``; onnxruntime's callback spelling of ``run_async``; a capture, a few replays
(``replay()`` + ``to_numpy()``, ``replay_and_read()``, ``await graph.replay_async()``) and a release of a
short-lived graph; a replay of the thread's long-lived graph; ``run_with_iobinding`` with a graph id (capture on
first use, replay after); an upload and read through the Env-shared allocator; profiling switched on or off on the
thread's own session (so some of the runs and replays above are profiled).  Every output is compared with
onnxruntime's on the same input.  The test prints the operations done by kind and the errors, which must be 0,
and checks that nothing is left alive at the end.

``ORTGPU_SOAK_SECONDS`` sets the time per backend (default 20); ``ORTGPU_SOAK_THREADS`` the threads (default 4).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import random
import threading
import time
import traceback
from typing import Any, Callable

import models
import numpy as np
import onnxruntime
from conftest import owned_handles

import ortgpu
from ortgpu import RunOptions

WIDTH, BATCH = 16, 2
SEEDS = (21, 22, 23)
MODELS = [models.mlp(layers=3, width=WIDTH, batch=BATCH, seed=seed).SerializeToString() for seed in SEEDS]
_ORT = [onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]) for m in MODELS]
SECONDS = float(os.environ.get("ORTGPU_SOAK_SECONDS", "20"))
THREADS = int(os.environ.get("ORTGPU_SOAK_THREADS", "4"))


def reference(model: int, x: np.ndarray) -> np.ndarray:
    return np.asarray(_ORT[model].run(None, {"X": x})[0])


class Mismatch(AssertionError):
    pass


class Worker:
    """One thread's state: its own sessions (one capturing, for graphs and profiling), its long-lived graph, its
    random choices, and the counts of what it did."""

    def __init__(self, index: int, env: ortgpu.Env, shared: list[ortgpu.InferenceSession], trace_dir: str) -> None:
        self.index = index
        self.env = env
        self.shared = shared
        self.rng = random.Random(1000 + index)
        self.model = index % len(MODELS)
        self.own = ortgpu.InferenceSession(
            MODELS[self.model],
            env=env,
            graph_capture=True,
            profile_file_prefix=os.path.join(trace_dir, f"thread{index}"),
        )
        self.done: collections.Counter[str] = collections.Counter()
        self.errors: list[str] = []
        self.inputs = 0
        # The long-lived graph: captured once, replayed with new inputs until the end.
        self.x = self.own.allocator.from_numpy(self.input())
        self.y = self.own.allocator.empty((BATCH, WIDTH), "float32")
        binding = self.own.io_binding()
        binding.bind_input("X", self.x)
        binding.bind_output("Y", self.y)
        self.graph = self.own.capture(binding, graph_id=0)
        # A binding for run_with_iobinding with a graph id (captured on its first use).
        self.rb_x = env.shared_allocator().from_numpy(self.input())
        self.rb_y = self.own.allocator.empty((BATCH, WIDTH), "float32")
        self.rb = self.own.io_binding()
        self.rb.bind_input("X", self.rb_x)
        self.rb.bind_output("Y", self.rb_y)

    def input(self) -> np.ndarray:
        self.inputs += 1
        return np.random.default_rng([self.index, self.inputs]).standard_normal((BATCH, WIDTH)).astype(np.float32)

    def expect(self, what: str, model: int, x: np.ndarray, y: np.ndarray) -> None:
        expected = reference(model, x)
        if y.shape != expected.shape or not np.allclose(y, expected, rtol=1e-4, atol=1e-4):
            raise Mismatch(f"thread {self.index}, {what}: max error {np.max(np.abs(y - expected))}")

    # -- operations --------------------------------------------------------------------------------------------
    def run_shared(self) -> None:
        model = self.rng.randrange(len(self.shared))
        x = self.input()
        self.expect("run (shared session)", model, x, self.shared[model].run(None, {"X": x})[0])

    def run_own(self) -> None:
        x = self.input()
        self.expect("run (own session)", self.model, x, self.own.run(None, {"X": x})[0])

    def run_async(self) -> None:
        model = self.rng.randrange(len(self.shared))
        xs = [self.input(), self.input()]

        async def go() -> list[list[np.ndarray]]:
            return list(await asyncio.gather(*(self.shared[model].run_async(None, {"X": x}) for x in xs)))

        for x, (y,) in zip(xs, asyncio.run(go())):
            self.expect("await run_async", model, x, y)

    def run_async_callback(self) -> None:
        x = self.input()
        finished = threading.Event()
        got: list[Any] = []

        def callback(results: Any, user_data: Any, error: Any) -> None:
            got.extend([results, user_data, error])
            finished.set()

        self.own.run_async(None, {"X": x}, callback, self.index)
        if not finished.wait(timeout=60):
            raise AssertionError(f"thread {self.index}: run_async's callback never came")
        results, user_data, error = got
        if error:  # "" on success, as onnxruntime's empty status
            raise AssertionError(f"run_async callback error: {error!r}")
        assert user_data == self.index
        self.expect("run_async (callback)", self.model, x, results[0])

    def capture_replay_release(self) -> None:
        sess = self.own
        shared = self.rng.random() < 0.5
        allocator = self.env.shared_allocator() if shared else sess.allocator
        x_value = allocator.from_numpy(self.input())
        y_value = sess.allocator.empty((BATCH, WIDTH), "float32")
        binding = sess.io_binding()
        binding.bind_input("X", x_value)
        binding.bind_output("Y", y_value)
        try:
            with sess.capture(binding, graph_id=1) as graph:
                for _ in range(self.rng.randrange(1, 4)):
                    x = self.input()
                    x_value.update_inplace(x)
                    how = self.rng.randrange(3)
                    if how == 0:
                        graph.replay()
                        y = y_value.to_numpy()
                    elif how == 1:
                        (y,) = graph.replay_and_read()
                    else:
                        asyncio.run(_await(graph.replay_async))
                        y = y_value.to_numpy()
                    self.expect(f"short-lived graph, replay kind {how}", self.model, x, y)
            assert graph.released and not graph.failed
            binding.bind_input("X", x_value)  # unlocked by the release
        finally:
            x_value.release()
            y_value.release()

    def replay_long_lived(self) -> None:
        x = self.input()
        self.x.update_inplace(x)
        self.graph.replay()
        self.expect("long-lived graph", self.model, x, self.y.to_numpy())

    def run_with_graph_id(self) -> None:
        x = self.input()
        self.rb_x.update_inplace(x)
        self.own.run_with_iobinding(self.rb, RunOptions(gpu_graph_id=2))
        self.expect("run_with_iobinding(gpu_graph_id=2)", self.model, x, self.rb_y.to_numpy())

    def shared_upload(self) -> None:
        x = self.input()
        value = self.env.shared_allocator().from_numpy(x)
        try:
            if not np.array_equal(value.to_numpy(), x):
                raise Mismatch(f"thread {self.index}: a shared upload read back different")
        finally:
            value.release()

    def toggle_profiling(self) -> None:
        if self.own.profiling_active:
            path = self.own.end_profiling()
            assert os.path.getsize(path) > 0
        else:
            self.own.start_profiling()

    OPERATIONS: dict[str, Callable[[Worker], None]] = {
        "run (shared session)": run_shared,
        "run (own session)": run_own,
        "await run_async": run_async,
        "run_async (callback)": run_async_callback,
        "capture, replay, release": capture_replay_release,
        "replay (long-lived graph)": replay_long_lived,
        "run_with_iobinding (graph id)": run_with_graph_id,
        "shared upload and read": shared_upload,
        "profiling on/off": toggle_profiling,
    }
    WEIGHTS = (3, 3, 2, 1, 2, 4, 2, 2, 1)

    def loop(self, deadline: float) -> None:
        names = list(self.OPERATIONS)
        while time.monotonic() < deadline:
            name = self.rng.choices(names, self.WEIGHTS)[0]
            try:
                self.OPERATIONS[name](self)
                self.done[name] += 1
            except BaseException:  # noqa: BLE001 - every error is counted and reported
                self.errors.append(f"{name}: {traceback.format_exc()}")
                if len(self.errors) > 20:
                    return

    def close(self) -> None:
        if self.own.profiling_active:
            self.own.end_profiling()
        self.graph.release()
        if 2 in self.own.captured_graph_ids:
            self.own.release_captured_graph(2)
        for value in (self.x, self.y, self.rb_x, self.rb_y):
            value.release()
        self.own.close()


async def _await(make: Callable[[], Any]) -> Any:
    return await make()


def test_soak_threads_mixing_every_kind_of_work(backend_name: str, tmp_path: Any) -> None:
    with ortgpu.Env(backend=backend_name) as env:  # type: ignore[arg-type]
        shared = [ortgpu.InferenceSession(m, env=env) for m in MODELS]
        workers = [Worker(i, env, shared, str(tmp_path)) for i in range(THREADS)]
        deadline = time.monotonic() + SECONDS
        threads = [threading.Thread(target=w.loop, args=(deadline,), daemon=True) for w in workers]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=SECONDS + 120)
        elapsed = time.monotonic() - started
        hung = [i for i, t in enumerate(threads) if t.is_alive()]
        assert not hung, f"threads {hung} still running two minutes after the deadline"
        done: collections.Counter[str] = collections.Counter()
        for worker in workers:
            done.update(worker.done)
        errors = [e for w in workers for e in w.errors]
        print(
            f"\nsoak on {backend_name}: {THREADS} threads, {elapsed:.1f} s, {sum(done.values())} operations, "
            f"{len(errors)} errors"
        )
        for name in Worker.OPERATIONS:
            print(f"  {name:32s} {done[name]}")
        assert not errors, f"{len(errors)} errors; the first:\n{errors[0]}"
        assert all(done[name] > 0 for name in Worker.OPERATIONS), done
        for worker in workers:
            worker.close()
        for sess in shared:
            sess.close()
        gc.collect()
        assert owned_handles(env) == 0, "the soak leaked device objects"
