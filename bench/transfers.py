"""``python -m bench.transfers``: host <-> device copy rates of an OrtValue, the way an application moves its tensors.

Upload: ``value.update_inplace(host)`` and a wait for the device to be idle (the data is on the device when the
time is taken).  Download: ``value.to_numpy(out=host_out)`` (synchronous; a fixed output array, as a loop reading
the same output every step would use), and ``value.to_numpy()``, a new array (from ``MAPPED_READ_MIN``, 8 MiB, the
staging buffer the device copied into, handed over mapped with no host copy; below it, a copy into a new array),
then two ``sum()`` of that new array, the caller's first read of it and a second (a mapping whose pages fault on
first touch would show in the first).
All three on one value of each size, interleaved iteration by iteration, with the
bytes checked at the end; p50 and p90 per direction, in ms and GB/s (1e9 bytes per second).  In the same rounds, the
host copy alone: the same bytes from one host array into another through the library's threaded copy
(:mod:`ortgpu_core.backends._host_copy`), the ceiling a staged upload or a chunked read cannot pass, since each makes
one such copy into or out of a mapped staging buffer.

Examples::

    python -m bench.transfers                       # 16 MB each way, 40 iterations
    python -m bench.transfers --mb 1,16,64 --json transfers.json
    python -m bench.transfers --chunk-mib 1,2,4,8   # the staging chunk size: a fresh Env per size, in rounds
    python -m bench.transfers --phases              # the time of each library call inside a transfer

``--chunk-mib`` sets the library's staging chunk (:data:`ortgpu_core.backends._wgpu_staged_writes.CHUNK` for writes,
:data:`ortgpu_core.backends._wgpu_chunked_reads.READ_CHUNK` for reads of 8 MiB or more) for each row, the sizes
alternating over ``--rounds``, and restores it after: the knob to tune them by on a given machine.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

import ortgpu
from ortgpu_core.backends import _host_copy, _wgpu_chunked_reads, _wgpu_staged_writes

from .transfer_phases import format_phases, measure_phases


def parse_sizes(text: str) -> list[float]:
    """``"1,16,64"`` -> [1.0, 16.0, 64.0] (megabytes, 2**20 bytes; each positive)."""
    sizes = []
    for part in text.split(","):
        try:
            size = float(part)
        except ValueError:
            raise ValueError(f"--mb takes comma-separated sizes in MB, not {text!r}") from None
        if not size > 0 or size > 4096:
            raise ValueError(f"--mb sizes must be above 0 and at most 4096 MB, not {part}")
        sizes.append(size)
    return sizes


def _stats(seconds: list[float], nbytes: int) -> dict[str, float]:
    p50, p90 = (float(np.percentile(seconds, q)) for q in (50, 90))
    return {"p50_ms": p50 * 1e3, "p90_ms": p90 * 1e3, "p50_GBps": nbytes / p50 / 1e9}


def measure(env: ortgpu.Env, megabytes: float, iterations: int, warmup: int) -> dict[str, Any]:
    """Time ``iterations`` uploads and downloads of one float32 value of ``megabytes`` MB (after ``warmup`` of each),
    interleaved, and check that the last of each moved the right bytes."""
    count = max(1, int(megabytes * (1 << 20)) // 4)
    rng = np.random.default_rng(0)
    hosts = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
    out = np.empty(count, np.float32)
    copied = np.empty(count, np.float32)
    value = env.shared_allocator().from_numpy(hosts[1])
    device = env.default_device._native_device()
    up: list[float] = []
    down: list[float] = []
    handed: list[float] = []
    first_reads: list[float] = []
    second_reads: list[float] = []
    host_only: list[float] = []
    try:
        for index in range(warmup + iterations):
            host = hosts[index % 2]
            start = time.perf_counter()
            value.update_inplace(host)
            device.wait_idle()
            middle = time.perf_counter()
            value.to_numpy(out=out)
            end = time.perf_counter()
            new = value.to_numpy()
            new_end = time.perf_counter()
            new.sum()  # the caller's first read of the new array (its memory's page faults, if any, land here)
            first_end = time.perf_counter()
            new.sum()
            second_end = time.perf_counter()
            _host_copy.copy_bytes(copied, host)
            host_end = time.perf_counter()
            if index >= warmup:
                up.append(middle - start)
                down.append(end - middle)
                handed.append(new_end - end)
                first_reads.append(first_end - new_end)
                second_reads.append(second_end - first_end)
                host_only.append(host_end - second_end)
        last = hosts[(warmup + iterations - 1) % 2]
        if not np.array_equal(out, last) or not np.array_equal(new, last) or not np.array_equal(copied, out):
            raise SystemExit(f"{megabytes} MB: the bytes read back differ from those written; no rates reported")
    finally:
        value.release()
    nbytes = count * 4
    return {
        "megabytes": megabytes,
        "bytes": nbytes,
        "upload": _stats(up, nbytes),
        "download": _stats(down, nbytes),
        "to_numpy_new": _stats(handed, nbytes),
        "first_read": _stats(first_reads, nbytes),
        "second_read": _stats(second_reads, nbytes),
        "host_copy": _stats(host_only, nbytes),
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| size | upload p50 ms | upload GB/s | download p50 ms | download GB/s | to_numpy() p50 ms | to_numpy() GB/s "
        "| its first sum() GB/s | its second | host copy alone GB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        up, down, new = row["upload"], row["download"], row["to_numpy_new"]
        size = f"{row['megabytes']:g} MB" + (
            f", chunk {row['chunk_mib']} MiB, round {row['round']}" if "chunk_mib" in row else ""
        )
        lines.append(
            f"| {size} | {up['p50_ms']:.3f} | {up['p50_GBps']:.1f} | {down['p50_ms']:.3f} | "
            f"{down['p50_GBps']:.1f} | {new['p50_ms']:.3f} | {new['p50_GBps']:.1f} | {row['first_read']['p50_GBps']:.1f} | "
            f"{row['second_read']['p50_GBps']:.1f} | {row['host_copy']['p50_GBps']:.1f} |"
        )
    return "\n".join(lines)


def _by_chunk(args: argparse.Namespace, sizes: list[float], chunks: list[int]) -> tuple[list[dict[str, Any]], str]:
    """Every size with each staging chunk size, a fresh Env (and so fresh staging pools) per chunk size and round;
    the library's chunk sizes restored after."""
    saved = (_wgpu_staged_writes.CHUNK, _wgpu_staged_writes.POOL_CHUNKS, _wgpu_chunked_reads.READ_CHUNK)
    rows: list[dict[str, Any]] = []
    adapter = ""
    try:
        for round_index in range(args.rounds):
            for chunk in chunks:
                _wgpu_staged_writes.CHUNK = _wgpu_chunked_reads.READ_CHUNK = chunk << 20
                _wgpu_staged_writes.POOL_CHUNKS = max(saved[1], 32 // chunk)  # two 16 MB writes in flight
                env = ortgpu.Env(backend=args.backend)
                try:
                    adapter = env.default_device.name
                    for size in sizes:
                        row = measure(env, size, args.iterations, args.warmup)
                        rows.append({**row, "chunk_mib": chunk, "round": round_index})
                finally:
                    env.close()
    finally:
        _wgpu_staged_writes.CHUNK, _wgpu_staged_writes.POOL_CHUNKS, _wgpu_chunked_reads.READ_CHUNK = saved
    print(f"adapter: {adapter}; host copy threads: {_host_copy.copy_threads()}")
    return rows, adapter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transfers", description=__doc__.splitlines()[0])
    parser.add_argument("--mb", default="16", help="comma-separated sizes in MB (2**20 bytes; default 16)")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--backend", choices=("wgpu", "fake"), default="wgpu")
    parser.add_argument(
        "--copy-threads", type=int, default=None, help="threads per large host copy (default: the library's)"
    )
    parser.add_argument(
        "--chunk-mib",
        default=None,
        help="comma-separated staging chunk sizes in MiB to compare (default: the library's)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="with --chunk-mib: rounds alternating the chunk sizes")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="time the library's calls inside each upload and download instead (bench/transfer_phases.py)",
    )
    parser.add_argument(
        "--streaming-stores",
        action="store_true",
        help="host copies with non-temporal stores instead of memcpy (ortgpu_core.backends._host_copy)",
    )
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.mb)
        chunk_sizes = None if args.chunk_mib is None else parse_sizes(args.chunk_mib)
    except ValueError as error:
        parser.error(str(error))
    chunks = None if chunk_sizes is None else [int(c) for c in chunk_sizes]
    if chunk_sizes is not None and (
        any(not c.is_integer() or not 1 <= c <= 256 for c in chunk_sizes) or args.rounds < 1
    ):
        parser.error("--chunk-mib takes whole sizes from 1 to 256 MiB, and --rounds at least 1")
    if args.iterations < 1 or args.warmup < 0:
        parser.error("--iterations must be at least 1 and --warmup at least 0")
    if args.copy_threads is not None:
        try:
            _host_copy.set_copy_threads(args.copy_threads)
        except ValueError as error:
            parser.error(str(error))
    if args.phases and chunks is not None:
        parser.error("--phases runs the library's own chunk sizes; leave out --chunk-mib")
    previous = _host_copy.set_streaming_stores(args.streaming_stores)
    try:
        return _run(args, sizes, chunks)
    finally:
        _host_copy.set_streaming_stores(previous)


def _run(args: argparse.Namespace, sizes: list[float], chunks: list[int] | None) -> int:
    """The measurement ``main`` asked for, its table printed and its JSON written."""
    threads = f"host copy threads: {_host_copy.copy_threads()}, streaming stores: {_host_copy.streaming_stores()}"
    if args.phases:
        env = ortgpu.Env(backend=args.backend)
        try:
            adapter = env.default_device.name
            print(f"adapter: {adapter}; {threads}")
            rows = [measure_phases(env, size, args.iterations, args.warmup) for size in sizes]
        finally:
            env.close()
        print(format_phases(rows))
    elif chunks is not None:
        rows, adapter = _by_chunk(args, sizes, chunks)
    else:
        env = ortgpu.Env(backend=args.backend)
        try:
            device = env.default_device
            adapter = device.name
            print(f"adapter: {device.name} ({device.backend_type}); {threads}")
            rows = [measure(env, size, args.iterations, args.warmup) for size in sizes]
        finally:
            env.close()
    if not args.phases:
        print(format_rows(rows))
    if args.json_path:
        report = {
            "adapter": adapter,
            "copy_threads": _host_copy.copy_threads(),
            "streaming_stores": _host_copy.streaming_stores(),
            "rows": rows,
        }
        with open(args.json_path, "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
