"""``python -m bench.profile``: GPU time per planned step of a model (where a forward pass spends its time).

Each step's dispatches are submitted alone and waited for; its time is the
median over ``--repeats`` minus the median of an empty submit-and-wait (the
fixed latency), so small steps read as ~0.  Coarse, but it needs no
timestamp queries and ranks the kernels worth optimising.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

import ortgpu
from ortgpu_core.backends._commands import CommandList

from .__main__ import build_model
from .models import random_feeds


def _median_seconds(submit: Any, commands: CommandList, wait: Any, repeats: int) -> float:
    submit(commands)
    wait()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        submit(commands)
        wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--model", default="resnet")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--backend", choices=("wgpu", "fake"), default="wgpu")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="time the captured replay on the GPU's clock instead (timestamps; see bench/gpu_profile.py)",
    )
    parser.add_argument(
        "--no-fuse", action="store_true", help="profile the plan without the graph rewrites (each node its own step)"
    )
    args = parser.parse_args(argv)

    env = ortgpu.Env(backend=args.backend)
    model, shapes = build_model(args.model, args.batch)
    feeds = random_feeds(model, shapes, high=100)
    if args.gpu:
        return _gpu_profile(args, env, model.SerializeToString(), feeds)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env, fuse=not args.no_fuse) as sess:
        reference = sess.run(None, feeds)
        shared = env.shared_allocator(sess.device)
        inputs = {name: shared.from_numpy(array) for name, array in feeds.items()}
        outputs = {name: sess.allocator.empty(a.shape, a.dtype) for name, a in zip(sess.output_names, reference)}
        binding = sess.io_binding()
        for name, value in inputs.items():
            binding.bind_input(name, value)
        for name, value in outputs.items():
            binding.bind_output(name, value)
        plan = sess._runner.bound_plan(binding, for_capture=True)
        program = sess._runner.new_program(plan)
        device = sess.device._native_device()
        try:
            buffers_in = {n: v._device_buffer for n, v in inputs.items() if v._device_buffer is not None}
            buffers_out = {n: v._device_buffer for n, v in outputs.items() if v._device_buffer is not None}
            per_step = program.record_per_step(buffers_in, buffers_out)
            whole = program.record(buffers_in, buffers_out)
            baseline = _median_seconds(device.submit, CommandList(), device.wait_idle, args.repeats)
            total = _median_seconds(device.submit, whole, device.wait_idle, args.repeats) - baseline
            rows: list[dict[str, Any]] = []
            for step, commands in per_step:
                if not len(commands):
                    continue
                seconds = _median_seconds(device.submit, commands, device.wait_idle, args.repeats) - baseline
                info = step.output_infos[0] if step.output_infos else None
                flops = _flops(step)
                rows.append(
                    {
                        "step": step.name,
                        "op": step.op_type,
                        "dispatches": commands.dispatch_count,
                        "output": list(info.shape) if info else [],
                        "us": seconds * 1e6,
                        "gflops_per_s": flops / seconds / 1e9 if flops and seconds > 0 else None,
                    }
                )
        finally:
            program.release()
    rows.sort(key=lambda r: -r["us"])
    summed = float(sum(max(float(r["us"]), 0.0) for r in rows))
    print(
        f"{args.model} batch {args.batch} on {sess.device.name}: {len(per_step)} steps; whole plan {total * 1e6:.1f} us "
        f"(one submit), steps alone sum to {summed:.1f} us; fixed submit+wait latency {baseline * 1e6:.1f} us subtracted"
    )
    print(f"{'us':>9s} {'%':>5s} {'GFLOP/s':>9s}  op / output shape")
    for row in rows[: args.top]:
        share = 100 * max(float(row["us"]), 0.0) / summed if summed else 0.0
        rate = f"{row['gflops_per_s']:9.1f}" if row["gflops_per_s"] else f"{'':9s}"
        print(f"{row['us']:9.1f} {share:5.1f} {rate}  {row['op']} {row['output']}")
    by_op: dict[str, float] = {}
    for row in rows:
        by_op[str(row["op"])] = by_op.get(str(row["op"]), 0.0) + max(float(row["us"]), 0.0)
    print("by op: " + ", ".join(f"{op} {us:.0f} us" for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])))
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(
                {
                    "model": args.model,
                    "batch": args.batch,
                    "whole_us": total * 1e6,
                    "baseline_us": baseline * 1e6,
                    "steps": rows,
                    "by_op_us": by_op,
                },
                handle,
                indent=1,
            )
    env.close()
    return 0


def _gpu_profile(args: argparse.Namespace, env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> int:
    from .gpu_profile import measure_gpu_profile, print_gpu_profile

    try:
        result = measure_gpu_profile(model_bytes, feeds, env, replays=args.repeats)
    finally:
        env.close()
    print_gpu_profile(f"{args.model} batch {args.batch}", result, args.top)
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump({"model": args.model, "batch": args.batch, **result}, handle, indent=1)
    return 0


def _flops(step: Any) -> float:
    """Multiply-add FLOPs of MatMul/Gemm/Conv steps (2 per MAC), else 0."""
    op = step.op_types[0]
    infos = step.input_infos
    out = step.output_infos[0] if step.output_infos else None
    if out is None or not infos or infos[0] is None:
        return 0.0
    if op in ("MatMul", "Gemm") and len(infos) > 1 and infos[1] is not None:
        a = infos[0].shape
        k = a[-1] if not (op == "Gemm" and step.attrs.get("transA")) else a[0]
        # a MatMul of merged sibling projections stores its product across several outputs
        return 2.0 * sum(float(np.prod(info.shape)) for info in step.output_infos) * float(k)
    if op == "Conv" and len(infos) > 1 and infos[1] is not None:
        w = infos[1].shape  # [M, C/group, kh, kw]
        return 2.0 * float(np.prod(out.shape)) * float(np.prod(w[1:]))
    return 0.0


if __name__ == "__main__":
    raise SystemExit(main())
