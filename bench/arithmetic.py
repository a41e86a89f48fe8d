"""``python -m bench.arithmetic``: the arithmetic rate WGSL reaches on this device, per number format and vector width.

A GEMM kernel's TFLOP/s means little without the rate the same shader language reaches on the same device when
it does nothing but multiply-add. Each form here runs ``CHAINS`` independent chains per invocation, each chain
``h = fma(h, a, b)`` for ``--iterations`` steps (a value that cannot be folded or reassociated: every step needs
the one before), over enough workgroups to fill the GPU, and reports FLOPs (2 per lane per fma) per second:

* ``f32 vec4``: the float32 rate, what the float32 tiled GEMM is read against;
* ``f16 vec4`` / ``f16 vec2``: packed half precision, two f16 lanes per 32-bit register (the GPU's paired f16
  rate, twice the f32 rate on NVIDIA Hopper, is reached only if the driver pairs them);
* ``f16 scalar``: half precision one lane at a time (if this equals ``f16 vec2``, nothing is paired);
* ``f16 vec4 splat``: the tiled GEMM's inner step, a scalar broadcast into a vec4 and multiplied by a vec4;
* ``... mul+add``: the same with ``h * a + b`` instead of ``fma`` (two roundings, which a driver may contract).

The f16 forms need the ``shader-f16`` feature and are reported as absent without it. Every form's results are
checked against numpy (the same recurrence) before timing, so a rate is never reported for a kernel that computed
something else.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ortgpu.ops import DeviceCaps
from ortgpu.ops._tiling import grid_for_groups, workgroup_index
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice, BindingEntry, KernelTwin

from .probes import Owned, Probe, interleaved, median_submit, open_backend_device

__all__ = ["CHAINS", "FORMS", "Form", "arithmetic_probes", "expected", "main"]

#: Independent chains per invocation: enough to cover the FMA latency (4 cycles) on every scheduler.
CHAINS = 8
_THREADS = 256
#: a and b of ``h = h * a + b``: the chain converges to b / (1 - a) = 2, representable in f16 and far from overflow.
_A = 0.5
_B = 1.0
#: the splat form's multiplier steps ``s = s * a + _Q`` towards _Q / (1 - a) = 0.5, so its chains converge too.
_Q = 0.25


@dataclass(frozen=True)
class Form:
    """One arithmetic form: element type, lanes per value, and whether its multiplier is a splatted scalar."""

    name: str
    element: str  # "f32" or "f16"
    width: int  # 1, 2 or 4
    splat: bool = False
    #: ``fma(x, y, z)`` (one rounding, as WGSL defines it) or ``x * y + z`` (which the driver may contract)
    fused: bool = True

    @property
    def value_type(self) -> str:
        return self.element if self.width == 1 else f"vec{self.width}<{self.element}>"

    @property
    def flops_per_step(self) -> int:
        """FLOPs of one iteration of one invocation (the splat form also steps the vector it splats from)."""
        return 2 * self.width * (CHAINS + (1 if self.splat else 0))


FORMS: tuple[Form, ...] = (
    Form("f32 vec4", "f32", 4),
    Form("f16 vec4", "f16", 4),
    Form("f16 vec2", "f16", 2),
    Form("f16 scalar", "f16", 1),
    Form("f16 vec4 splat", "f16", 4, splat=True),
    Form("f32 vec4 mul+add", "f32", 4, fused=False),
    Form("f16 vec4 mul+add", "f16", 4, fused=False),
    Form("f16 vec2 mul+add", "f16", 2, fused=False),
    Form("f16 vec4 splat mul+add", "f16", 4, splat=True, fused=False),
)


def _kernel(form: Form, iterations: int, invocations: int, grid: tuple[int, int, int]) -> str:
    t = form.value_type
    seed = "src[i]" if form.width == 4 else ("src[i].xy" if form.width == 2 else "src[i].x")
    convert = seed if form.element == "f32" else f"{t}({seed})"
    chains = "".join(f"    var h{c} = {convert} + {t}({c}.0 / {4 * CHAINS}.0);\n" for c in range(CHAINS))
    a, b = f"{t}({_A})", f"{t}({_B})"

    def madd(x: str, y: str, z: str) -> str:
        return f"fma({x}, {y}, {z})" if form.fused else f"{x} * {y} + {z}"

    if form.splat:
        steps = f"        s = {madd('s', 'a', 'q')};\n" + "".join(
            f"        h{c} = {madd(f'{t}(s[{c % 4}])', f'h{c}', 'b')};\n" for c in range(CHAINS)
        )
        setup = f"    var s = {convert};\n    let a = {a};\n    let b = {b};\n    let q = {t}({_Q});\n"
    else:
        steps = "".join(f"        h{c} = {madd(f'h{c}', 'a', 'b')};\n" for c in range(CHAINS))
        setup = f"    let a = {a};\n    let b = {b};\n"
    total = " + ".join(f"h{c}" for c in range(CHAINS)) + (" + s" if form.splat else "")
    widen = {
        1: "vec4<f32>(f32(total), 0.0, 0.0, 0.0)",
        2: "vec4<f32>(vec2<f32>(total), 0.0, 0.0)",
        4: "vec4<f32>(total)",
    }
    enable = "enable f16;\n" if form.element == "f16" else ""
    return f"""{enable}
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size({_THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let i = ({workgroup_index(grid)}) * {_THREADS}u + lid;
    if (i >= {invocations}u) {{ return; }}
{setup}{chains}    for (var n = 0u; n < {iterations}u; n = n + 1u) {{
{steps}    }}
    let total = {total};
    dst[i] = {widen[form.width]};
}}
"""


def expected(form: Form, seeds: np.ndarray, iterations: int) -> np.ndarray:
    """What the form's kernel writes for ``seeds`` ([invocations, 4] float32): the same recurrence in numpy, in the
    form's precision (each step rounded once per operation; a fused multiply-add rounds once, so the two agree to a
    few units in the last place, which is what :func:`main` allows)."""
    dtype = np.dtype(np.float32 if form.element == "f32" else np.float16)
    lanes = seeds[:, : form.width].astype(dtype)
    a, b, q = (np.full((), value, dtype) for value in (_A, _B, _Q))
    chains = [lanes + np.full((), c / (4 * CHAINS), dtype) for c in range(CHAINS)]
    s = lanes.copy()
    for _ in range(iterations):
        if form.splat:
            s = s * a + q
            chains = [np.repeat(s[:, c % 4 : c % 4 + 1], 4, axis=1) * chains[c] + b for c in range(CHAINS)]
        else:
            chains = [h * a + b for h in chains]
    total = chains[0]
    for h in chains[1:]:
        total = total + h
    if form.splat:
        total = total + s
    out = np.zeros((seeds.shape[0], 4), np.float32)
    out[:, : form.width] = total.astype(np.float32)
    return out


def _twin(form: Form, iterations: int, invocations: int) -> KernelTwin:
    def twin(views: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        seeds = views[0].view(np.float32).reshape(-1, 4)[:invocations]
        views[1][: invocations * 16] = expected(form, seeds, iterations).view(np.uint8).reshape(-1)

    return twin


def arithmetic_probes(
    device: BackendDevice, caps: DeviceCaps, iterations: int, workgroups: int, repeats: int
) -> tuple[list[Probe], list[str]]:
    """One probe per form the device can run (``repeats`` dispatches each), over ``workgroups`` workgroups of 256
    invocations; and the names of the forms it cannot run (no ``shader-f16``). Each probe's ``flops_per_repeat``
    is the FLOPs of one dispatch; ``bound`` is (seeds, results)."""
    invocations = workgroups * _THREADS
    nbytes = invocations * 16
    src = device.create_buffer(nbytes, label="arith-src")
    dst = device.create_buffer(nbytes, label="arith-dst")
    grid = grid_for_groups(workgroups, caps)
    probes: list[Probe] = []
    absent: list[str] = []
    for form in FORMS:
        if form.element == "f16" and not caps.has_f16:
            absent.append(form.name)
            continue
        wgsl = _kernel(form, iterations, invocations, grid)
        pipeline = device.create_compute_pipeline(
            wgsl, twin=_twin(form, iterations, invocations), label=f"arith-{form.name}"
        )
        group = device.create_bind_group(pipeline, [BindingEntry(0, src, 0, nbytes), BindingEntry(1, dst, 0, nbytes)])
        commands = CommandList()
        for _ in range(repeats):
            commands.add_dispatch(pipeline, group, *grid)
        probes.append(
            Probe(
                form.name,
                commands,
                repeats,
                0,
                Owned(device, [pipeline], [group]),
                bound=(src, dst),
                flops_per_repeat=invocations * iterations * form.flops_per_step,
            )
        )
    if probes:
        probes[-1].owned.buffers += [src, dst]  # released with the last probe
    else:
        device.destroy_buffer(src)
        device.destroy_buffer(dst)
    return probes, absent


def _form(name: str) -> Form:
    return next(form for form in FORMS if form.name == name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arithmetic", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=("wgpu", "fake"), default="wgpu")
    parser.add_argument("--iterations", type=int, default=2048, help="steps of every chain per invocation")
    parser.add_argument("--workgroups", type=int, default=4096, help="workgroups of 256 invocations per dispatch")
    parser.add_argument("--repeats", type=int, default=4, help="dispatches per timed submit")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds, forms interleaved (median)")
    args = parser.parse_args(argv)
    if min(args.iterations, args.workgroups, args.repeats, args.rounds) < 1:
        parser.error("--iterations, --workgroups, --repeats and --rounds must be at least 1")
    device = open_backend_device(args.backend)
    caps = DeviceCaps(frozenset(device.features), device.limits)
    print(f"device: {device.info.name} ({device.info.driver}, {device.info.backend_type})")
    probes, absent = arithmetic_probes(device, caps, args.iterations, args.workgroups, args.repeats)
    wrong: set[str] = set()
    try:
        src, dst = probes[0].bound if probes else (0, 0)
        seeds = np.random.default_rng(0).uniform(-1.0, 1.0, (args.workgroups * _THREADS, 4)).astype(np.float32)
        if probes:
            device.write_buffer(src, 0, seeds.tobytes())
        for probe in probes:
            device.submit(probe.commands)
            got = np.frombuffer(device.read_buffer(dst, 0, seeds.nbytes), np.float32).reshape(-1, 4)
            want = expected(_form(probe.name), seeds[:256], args.iterations)
            tolerance = 1e-5 if _form(probe.name).element == "f32" else 2e-2
            if not np.allclose(got[:256], want, rtol=tolerance, atol=tolerance * CHAINS):
                wrong.add(probe.name)
                print(f"{probe.name}: WRONG results (max error {float(np.max(np.abs(got[:256] - want))):.3g})")
        checked = [probe for probe in probes if probe.name not in wrong]
        baseline = median_submit(device, CommandList(), 3)
        timed = [(probe.name, probe.commands, probe.repeats) for probe in checked]
        samples = interleaved(device, timed, baseline, args.rounds, np.random.default_rng(1))
        print(
            f"{args.workgroups} x {_THREADS} invocations, {CHAINS} chains x {args.iterations} steps, median of {args.rounds}"
        )
        for probe in checked:
            seconds = max(statistics.median(samples[probe.name]), 1e-9)
            print(
                f"  {probe.name:16s} {probe.flops_per_repeat / seconds / 1e12:9.3f} TFLOP/s  ({seconds * 1e3:.3f} ms)"
            )
        for name in absent:
            print(f"  {name:16s} not run: the device has no shader-f16")
    finally:
        for probe in probes:
            probe.release()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
