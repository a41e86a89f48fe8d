"""Session 16 (H200): the GPU time of one captured mlp16 replay while K threads each step their own session
(timestamps: each session profiled, every replay timed whole), against the same replays back to back on one thread.
Per K: the unprofiled end_to_end throughput (as the bench measures it), then the same K threads profiled: the
median first-to-last-timestamp span of a replay, and the unprofiled throughput x that median (the fraction of the
time the GPU would be busy with replays if each took the loaded median).

python3 loaded_gpu_time.py   (KS=1,2,4,8 ITER=500)
"""

from __future__ import annotations

import os
import statistics
import tempfile

import ortgpu
from bench.__main__ import build_model, model_feeds
from bench.harness import OrtgpuArms
from bench.profile_overhead import _trace_gpu_ns, gpu_time_per_replay
from bench.threads import time_threads

KS = [int(k) for k in os.environ.get("KS", "1,2,4,8").split(",")]
ITER = int(os.environ.get("ITER", "500"))
WARMUP = 50


def main() -> None:
    env = ortgpu.Env()
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
    model_bytes = model.SerializeToString()
    sessions = [OrtgpuArms(model_bytes, feeds, env) for _ in range(max(KS))]
    for arms in sessions:
        arms.capture()
    back_to_back = gpu_time_per_replay(model_bytes, feeds, env)
    assert back_to_back is not None
    print(f"back to back, one thread: {back_to_back * 1e6:.1f} us per replay (ceiling {1 / back_to_back:.0f}/s)")
    for k in KS:
        using = sessions[:k]
        window, times = time_threads([a.captured_end_to_end for a in using], WARMUP, ITER, None)
        plain = sum(len(t) for t in times) / window
        with tempfile.TemporaryDirectory() as folder:
            for index, arms in enumerate(using):
                arms.session.profile_file_prefix = os.path.join(folder, f"k{k}t{index}")
                arms.session.start_profiling(10**9)
            window_p, times_p = time_threads([a.captured_end_to_end for a in using], WARMUP, ITER, None)
            spans: list[int] = []
            for arms in using:
                spans.extend(_trace_gpu_ns(arms.session.end_profiling())[1][WARMUP:])
        loaded = statistics.median(spans) / 1e9
        q90 = statistics.quantiles(spans, n=10)[-1] / 1e9
        profiled = sum(len(t) for t in times_p) / window_p
        print(
            f"K={k}: end_to_end {plain:7.0f}/s ({plain * back_to_back:.2f} of back-to-back ceiling); profiled pass "
            f"{profiled:7.0f}/s, replay span median {loaded * 1e6:6.1f} us (p90 {q90 * 1e6:6.1f}); "
            f"unprofiled throughput x loaded median = {plain * loaded:.2f}"
        )
    for arms in sessions:
        arms.close()


if __name__ == "__main__":
    main()
