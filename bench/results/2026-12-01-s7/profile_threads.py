"""Session 7 diagnostic: where K threads' captured mlp16 end_to_end steps spend their time.  Each thread: its own
OrtgpuArms (session, captured graph, device I/O), warm-up, barrier, then N steps of captured_end_to_end.  A sampler
thread reads every worker's innermost frame each 0.5 ms (``sys._current_frames``; cProfile cannot profile several
threads at once on Python 3.12) and counts (function, line) and the ortgpu frame nearest the top.  Prints aggregate
steps/s and the most frequent places.  Usage: python profile_threads.py K N"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any

import ortgpu
from bench.harness import OrtgpuArms
from bench.models import mlp, random_feeds


def main() -> None:
    k, n = int(sys.argv[1]), int(sys.argv[2])
    model = mlp(layers=16, width=1024, batch=1)
    feeds = random_feeds(model, {v.name: (1, 1024) for v in model.graph.input})
    model_bytes = model.SerializeToString()
    env = ortgpu.Env()
    arms = [OrtgpuArms(model_bytes, feeds, env) for _ in range(k)]
    for arm in arms:
        arm.capture()
    barrier = threading.Barrier(k + 1)
    spans: list[float] = [0.0] * k
    idents: list[int] = [0] * k
    done = threading.Event()
    top: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()

    def work(i: int) -> None:
        idents[i] = threading.get_ident()
        for _ in range(50):
            arms[i].captured_end_to_end()
        barrier.wait()
        start = time.perf_counter()
        for _ in range(n):
            arms[i].captured_end_to_end()
        spans[i] = time.perf_counter() - start

    def sample() -> None:
        while not done.is_set():
            frames = sys._current_frames()
            for ident in idents:
                frame: Any = frames.get(ident)
                if frame is None:
                    continue
                top[f"{frame.f_code.co_filename.split('/')[-1]}:{frame.f_code.co_name}:{frame.f_lineno}"] += 1
                while frame is not None and "ortgpu" not in frame.f_code.co_filename:
                    frame = frame.f_back
                if frame is not None:
                    ours[f"{frame.f_code.co_filename.split('/')[-1]}:{frame.f_code.co_name}:{frame.f_lineno}"] += 1
            time.sleep(0.0005)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    barrier.wait()
    sampler = threading.Thread(target=sample)
    sampler.start()
    for t in threads:
        t.join()
    done.set()
    sampler.join()
    print(f"K={k}: {k * n / max(spans):.0f} steps/s (sampled)")
    total = sum(top.values())
    print(f"innermost frames ({total} samples):")
    for place, count in top.most_common(18):
        print(f"  {100 * count / total:5.1f}%  {place}")
    print("innermost ortgpu frames:")
    for place, count in ours.most_common(14):
        print(f"  {100 * count / total:5.1f}%  {place}")
    for arm in arms:
        arm.close()


if __name__ == "__main__":
    main()
