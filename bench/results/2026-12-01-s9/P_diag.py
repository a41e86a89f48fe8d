"""Session 9, helper P: where profiling's cost on a captured mlp16 replay goes (issue 15), in one process.

``bench.profile_overhead.measure_profile_overhead`` (the measurement of ``python -m bench --profile-overhead``:
two sessions, one profiled, timed interleaved at ``replay + to_numpy`` and ``replay_and_read``) run once per
variant of the profiling code, each variant switched on by patching this process only (diagnosis, not shipped):

* ``default``: the code as it is (``profile_detail_every`` 10, the ring read without waiting where it can);
* ``sync_ring``: the ring read by a read that waits, when full (``ASYNC_READS`` off: the pre-session-9 ring);
* ``detail_20`` / ``detail_50``: ``start_profiling(detail_every=20 / 50)``;
* ``no_detail``: ``detail_every`` 10**9 (only the record's first replay is timed per step);
* ``no_timestamps``: as ``no_detail``, and the timed lists hold no timestamp (nor the ring's reads a resolve): the
  host path of a profiled replay with no GPU timestamp at all (its spans read 0 ns);
* ``no_ts_one_list``: as ``no_timestamps``, with one list for every slot (the same frozen list each replay, as an
  unprofiled replay submits), where the ring otherwise rotates one list per slot.

Usage: ``python bench/results/2026-12-01-s9/P_diag.py [--iterations N] [VARIANT ...]``; prints one line per
variant (on/off ratios, p50 and mean, both steps) and ``--json PATH`` writes them.
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import ortgpu
from bench import profile_overhead
from bench.__main__ import build_model, model_feeds
from ortgpu import _profiling
from ortgpu._executor import DeviceProgram
from ortgpu_core.backends._commands import CommandList


@contextmanager
def detail_every(n: int) -> Iterator[None]:
    original = profile_overhead._profiled

    def profiled(arms: Any, folder: str, detail_every: int | None = None) -> None:
        arms.session.profile_file_prefix = f"{folder}/profile"
        arms.session.start_profiling(detail_every=n)

    profile_overhead._profiled = profiled
    try:
        yield
    finally:
        profile_overhead._profiled = original


@contextmanager
def attribute(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def no_timestamps() -> Iterator[None]:
    def untimed(self: Any, inputs: Any, outputs: Any, query_set: int, per_step: bool = True) -> Any:
        return self.record(inputs, outputs), self.bind_groups_token(inputs, outputs)

    with detail_every(10**9), attribute(DeviceProgram, "record_timed", untimed):
        with attribute(_profiling.GpuStepTimer, "_resolves", lambda self, pending: CommandList()):
            yield


@contextmanager
def no_timestamps_one_list() -> Iterator[None]:
    lists: dict[int, Any] = {}

    def untimed(self: Any, inputs: Any, outputs: Any, query_set: int, per_step: bool = True) -> Any:
        token = self.bind_groups_token(inputs, outputs)
        if id(self) not in lists:
            lists[id(self)] = (self, self.record(inputs, outputs))
        return lists[id(self)][1], token

    with detail_every(10**9), attribute(DeviceProgram, "record_timed", untimed):
        with attribute(_profiling.GpuStepTimer, "_resolves", lambda self, pending: CommandList()):
            yield
    lists.clear()


@contextmanager
def nothing() -> Iterator[None]:
    yield


VARIANTS: dict[str, Callable[[], Any]] = {
    "default": nothing,
    "sync_ring": lambda: attribute(_profiling, "ASYNC_READS", False),
    "detail_20": lambda: detail_every(20),
    "detail_50": lambda: detail_every(50),
    "no_detail": lambda: detail_every(10**9),
    "no_timestamps": no_timestamps,
    "no_ts_one_list": no_timestamps_one_list,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variants", nargs="*", help=f"some of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json")
    options = parser.parse_args()
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
    model_bytes = model.SerializeToString()
    env = ortgpu.Env(backend="wgpu")
    rows: dict[str, Any] = {}
    for name in options.variants or list(VARIANTS):
        with VARIANTS[name]():
            result = profile_overhead.measure_profile_overhead(
                model_bytes, feeds, env, options.warmup, options.iterations
            )
        rows[name] = result
        cells = "  ".join(
            f"{step}: p50 {row['ratio_on_off']:.3f} mean {row['mean_ratio_on_off']:.3f}"
            f" (off {row['p50_off_s'] * 1e6:.0f}/{row['mean_off_s'] * 1e6:.0f} us)"
            for step, row in result.items()
            if isinstance(row, dict)
        )
        print(f"{name:14s} {cells}", flush=True)
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
