"""The f16-arithmetic inner loop of the tiled GEMM (:attr:`GemmConfig.half`): products of k-pairs, no broadcasts.

A GPU multiplies half precision at twice its f32 rate only as two-lane ``vec2<f16>`` fused multiply-adds, and
only when both operands are such pairs. An outer product (one scalar of A times a vector of B) needs the scalar
broadcast into both lanes first, which on an H200 made the f16 kernel no faster than f32 arithmetic. Here the two
lanes hold two *k* values instead: ``h(m, n) += (A[m,k], A[m,k+1]) * (B[k,n], B[k+1,n])`` sums the even and the odd
products of output (m, n) in its two lanes, so every multiply-add takes both operands straight from workgroup
memory.

Workgroup tiles hold ``vec4<f16>`` elements of two k-pairs each, ``tile_a[kp][m / 2] = (A[m, 2kp], A[m, 2kp+1],
A[m+1, 2kp], A[m+1, 2kp+1])`` and ``tile_b[kp][n / 2] = (B[2kp, n], B[2kp+1, n], B[2kp, n+1], B[2kp+1, n+1])``, rows
padded by :data:`PAD` elements so that the stores of one fetch round spread over the memory banks. The fetch reads
the operands through the problem's loaders (f32 values of f16 storage: converting back is exact) and pairs them in
registers. Invocations own the same row and column quads as the f32 kernel, so the accumulators and the stores
(``acc`` rows of vec4<f32>, split-K included) are shared with it.

Precision: each lane sums ``tile_k / 2`` products in f16, then the pair is added into the f32 accumulator (one
flush per K tile), so rounding grows with ``tile_k``, not with K.
"""

from __future__ import annotations

from ._gemm import HALF_PAIR_PAD as PAD
from ._gemm import GemmConfig

__all__ = ["PAIR_FMA", "pair_fetch_store", "pair_compute", "pair_tile_sizes"]

#: Whether the pair products use WGSL's ``fma`` (one rounding) or ``a * b + h`` (which the driver may contract).
#: On an H100 (NVIDIA Vulkan driver 580) the fp16 matmul-1024-4096 chain ran at 19.5 TFLOP/s with ``fma`` and 28.1
#: with ``a * b + h``, at the same error (1.5e-3 against fp32).
PAIR_FMA = False


def pair_tile_sizes(config: GemmConfig) -> tuple[int, int, int, int]:
    """(row stride of tile_a, of tile_b, elements of one tile_a buffer, of one tile_b buffer)."""
    sa, sb = config.tile_m // 2 + PAD, config.tile_n // 2 + PAD
    return sa, sb, (config.tile_k // 2) * sa, (config.tile_k // 2) * sb


def _rounds(count: int, threads: int) -> list[tuple[int, str]]:
    """(round, guard) of the loops spreading ``count`` units over ``threads`` invocations (``true`` when every
    invocation of the round has a unit)."""
    rounds = -(-count // threads)
    return [
        (r, f"li + {r * threads}u < {count}u" if count % threads and (r + 1) * threads > count else "true")
        for r in range(rounds)
    ]


def _half4(x: str, y: str, z: str, w: str) -> str:
    return f"vec4<f16>(vec4<f32>({x}, {y}, {z}, {w}))"


def pair_fetch_store(config: GemmConfig, mode_a: str, mode_b: str) -> tuple[list[str], str, str]:
    """Register declarations, the fetch (global -> registers at ``kt``) and the store (registers -> the paired tiles
    at offsets ``oa``/``ob``) for the operand modes of :func:`~ortgpu.ops._gemm_wgsl.operand_modes`."""
    tm, tn, tk, threads = config.tile_m, config.tile_n, config.tile_k, config.threads
    sa, sb, _, _ = pair_tile_sizes(config)
    decls: list[str] = []
    fetch: list[str] = []
    store: list[str] = []

    def unit(r: int, guard: str, index: str, loads: str, stores: str, regs: list[str]) -> None:
        decls.extend(f"var {reg} = vec4<f32>(0.0);" for reg in regs)
        zero = "".join(f" {reg} = vec4<f32>(0.0);" for reg in regs)
        fetch.append(f"    {{\n        let u = li + {r * threads}u;\n        {index}\n       {zero}\n{loads}    }}\n")
        body = stores if guard == "true" else f"        if ({guard}) {{\n{stores}        }}\n"
        store.append(f"    {{\n        let u = li + {r * threads}u;\n        {index}\n{body}    }}\n")

    # A: tile_a[kp][mp] holds rows 2mp, 2mp+1 at k = 2kp, 2kp+1
    if mode_a == "k4":  # A[m, k..k+3]: two rows of one k quad make two elements
        for r, guard in _rounds((tm // 2) * (tk // 4), threads):
            index = f"let kc = u % {tk // 4}u; let mp = u / {tk // 4}u; let m = m0 + 2u * mp; let k = kt + 4u * kc;"
            x, y = f"ra{r}_0", f"ra{r}_1"
            loads = (
                f"        if ({guard} && k < K) {{\n"
                f"            if (m < M) {{ {x} = load_a4k(b, m, k); }}\n"
                f"            if (m + 1u < M) {{ {y} = load_a4k(b, m + 1u, k); }}\n        }}\n"
            )
            stores = (
                f"            tile_a[oa + 2u * kc * {sa}u + mp] = {_half4(f'{x}.x', f'{x}.y', f'{y}.x', f'{y}.y')};\n"
                f"            tile_a[oa + (2u * kc + 1u) * {sa}u + mp] = {_half4(f'{x}.z', f'{x}.w', f'{y}.z', f'{y}.w')};\n"
            )
            unit(r, guard, index, loads, stores, [x, y])
    elif mode_a == "m4":  # A[m..m+3, k]: two k of one row quad make two elements
        for r, guard in _rounds((tm // 4) * (tk // 2), threads):
            index = f"let mq = u % {tm // 4}u; let kp = u / {tm // 4}u; let m = m0 + 4u * mq; let k = kt + 2u * kp;"
            x, y = f"ra{r}_0", f"ra{r}_1"
            loads = (
                f"        if ({guard} && m < M) {{\n"
                f"            if (k < K) {{ {x} = load_a4m(b, m, k); }}\n"
                f"            if (k + 1u < K) {{ {y} = load_a4m(b, m, k + 1u); }}\n        }}\n"
            )
            stores = (
                f"            tile_a[oa + kp * {sa}u + 2u * mq] = {_half4(f'{x}.x', f'{y}.x', f'{x}.y', f'{y}.y')};\n"
                f"            tile_a[oa + kp * {sa}u + 2u * mq + 1u] = {_half4(f'{x}.z', f'{y}.z', f'{x}.w', f'{y}.w')};\n"
            )
            unit(r, guard, index, loads, stores, [x, y])
    else:
        for r, guard in _rounds((tm // 2) * (tk // 2), threads):
            index = f"let kp = u % {tk // 2}u; let mp = u / {tk // 2}u; let m = m0 + 2u * mp; let k = kt + 2u * kp;"
            x = f"ra{r}"
            loads = (
                f"        if ({guard}) {{\n"
                + "".join(
                    f"            if (m + {i}u < M && k + {j}u < K) {{ {x}[{2 * i + j}] = load_a(b, m + {i}u, k + {j}u); }}\n"
                    for i in range(2)
                    for j in range(2)
                )
                + "        }\n"
            )
            stores = f"            tile_a[oa + kp * {sa}u + mp] = vec4<f16>({x});\n"
            unit(r, guard, index, loads, stores, [x])
    # B: tile_b[kp][np] holds columns 2np, 2np+1 at k = 2kp, 2kp+1
    if mode_b == "n4":  # B[k, n..n+3]: two k of one column quad make two elements
        for r, guard in _rounds((tk // 2) * (tn // 4), threads):
            index = f"let nq = u % {tn // 4}u; let kp = u / {tn // 4}u; let n = n0 + 4u * nq; let k = kt + 2u * kp;"
            x, y = f"rb{r}_0", f"rb{r}_1"
            loads = (
                f"        if ({guard} && n < N) {{\n"
                f"            if (k < K) {{ {x} = load_b4n(b, k, n); }}\n"
                f"            if (k + 1u < K) {{ {y} = load_b4n(b, k + 1u, n); }}\n        }}\n"
            )
            stores = (
                f"            tile_b[ob + kp * {sb}u + 2u * nq] = {_half4(f'{x}.x', f'{y}.x', f'{x}.y', f'{y}.y')};\n"
                f"            tile_b[ob + kp * {sb}u + 2u * nq + 1u] = {_half4(f'{x}.z', f'{y}.z', f'{x}.w', f'{y}.w')};\n"
            )
            unit(r, guard, index, loads, stores, [x, y])
    elif mode_b == "k4":  # B[k..k+3, n]: two columns of one k quad make two elements
        for r, guard in _rounds((tn // 2) * (tk // 4), threads):
            index = f"let kc = u % {tk // 4}u; let np = u / {tk // 4}u; let n = n0 + 2u * np; let k = kt + 4u * kc;"
            x, y = f"rb{r}_0", f"rb{r}_1"
            loads = (
                f"        if ({guard} && k < K) {{\n"
                f"            if (n < N) {{ {x} = load_b4k(b, k, n); }}\n"
                f"            if (n + 1u < N) {{ {y} = load_b4k(b, k, n + 1u); }}\n        }}\n"
            )
            stores = (
                f"            tile_b[ob + 2u * kc * {sb}u + np] = {_half4(f'{x}.x', f'{x}.y', f'{y}.x', f'{y}.y')};\n"
                f"            tile_b[ob + (2u * kc + 1u) * {sb}u + np] = {_half4(f'{x}.z', f'{x}.w', f'{y}.z', f'{y}.w')};\n"
            )
            unit(r, guard, index, loads, stores, [x, y])
    else:
        for r, guard in _rounds((tn // 2) * (tk // 2), threads):
            index = f"let kp = u % {tk // 2}u; let np = u / {tk // 2}u; let n = n0 + 2u * np; let k = kt + 2u * kp;"
            x = f"rb{r}"
            loads = (
                f"        if ({guard}) {{\n"
                + "".join(
                    f"            if (n + {i}u < N && k + {j}u < K) {{ {x}[{2 * i + j}] = load_b(b, k + {j}u, n + {i}u); }}\n"
                    for i in range(2)
                    for j in range(2)
                )
                + "        }\n"
            )
            stores = f"            tile_b[ob + kp * {sb}u + np] = vec4<f16>({x});\n"
            unit(r, guard, index, loads, stores, [x])
    return decls, "".join(fetch), "".join(store)


def pair_compute(config: GemmConfig, tx: int, ty: int) -> str:
    """One K tile: ``tile_k / 2`` k-pair steps into the f16 pair sums ``h``, then those added into the f32
    accumulators ``acc{row}_{column quad}`` (the f32 kernel's) at offsets ``ca``/``cb`` of the current tiles."""
    sa, sb, _, _ = pair_tile_sizes(config)
    rows, cols = config.rows, config.cols
    outputs = [(r, c) for r in range(rows) for c in range(cols)]
    lines = [f"        var h{r}_{c} = vec2<f16>(0.0h);" for r, c in outputs]
    lines.append(f"        for (var kp = 0u; kp < {config.tile_k // 2}u; kp = kp + 1u) {{")
    for p in range(rows // 4):
        for half in range(2):
            lines.append(f"            let a{p}_{half} = tile_a[ca + kp * {sa}u + 2u * (lid.y + {ty * p}u) + {half}u];")
    for q in range(cols // 4):
        for half in range(2):
            lines.append(f"            let b{q}_{half} = tile_b[cb + kp * {sb}u + 2u * (lid.x + {tx * q}u) + {half}u];")
    for r, c in outputs:
        a = f"a{r // 4}_{(r % 4) // 2}.{'xy' if r % 2 == 0 else 'zw'}"
        b = f"b{c // 4}_{(c % 4) // 2}.{'xy' if c % 2 == 0 else 'zw'}"
        product = f"fma({a}, {b}, h{r}_{c})" if PAIR_FMA else f"{a} * {b} + h{r}_{c}"
        lines.append(f"            h{r}_{c} = {product};")
    lines.append("        }")
    for r in range(rows):
        for q in range(cols // 4):
            w0 = f"vec4<f32>(vec2<f32>(h{r}_{4 * q}), vec2<f32>(h{r}_{4 * q + 1}))"
            w1 = f"vec4<f32>(vec2<f32>(h{r}_{4 * q + 2}), vec2<f32>(h{r}_{4 * q + 3}))"
            lines.append(
                f"        {{ let w0 = {w0}; let w1 = {w1}; "
                f"acc{r}_{q} = acc{r}_{q} + vec4<f32>(w0.xz + w0.yw, w1.xz + w1.yw); }}"
            )
    return "\n".join(lines) + "\n"
