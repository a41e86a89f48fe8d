"""The WGSL of the block-quantized weight operators (:mod:`.quantized_weights`): MatMulNBits' GEMV and its tiled
GEMM loaders, and GatherBlockQuantized's kernel.

MatMulNBits' weight B is ``[N, blocks, blob]`` bytes: row ``n`` holds the codes of ``B^T[n, :]`` packed along K,
``32 / bits`` codes per ``u32`` word, low bits first (byte ``j`` of a 4-bit blob holds codes ``2j`` and ``2j + 1``;
the little-endian word holds code ``i`` at bits ``bits * i``).  A blob is a whole number of words (``block_size >=
16``), so word ``w`` of a row covers ``k = w * codes_per_word ...`` within block ``w / words_per_block``, and the
kernels read the weight as ``array<u32>`` and never as bytes.

* The GEMV (few rows of A, batch-1 decoding): a workgroup of ``lanes x outputs`` invocations computes
  ``outputs`` neighbouring columns ``n`` of one row of A; its lanes stride over the words of those weight rows,
  so a lane reads one word (``32 / bits`` weights) per step, subtracts the block's zero point, dots the codes with
  ``A[m, k..]`` as vec4s and scales the partial sum once per word.  The lanes' sums meet in workgroup memory.
  Its shape (``outputs x lanes``) is the ordinary GEMV's ``"nk"`` configuration (:func:`.._gemv.default_gemv_config`),
  the same problem layout.
* The tiled GEMM (prefill): :mod:`.._tiled_gemm` with loaders that dequantize B(k, n) where the tile is fetched;
  ``load_b4k`` takes four codes of one word (``K % 4 == 0``: they share a word and a block).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._kernel import Binding
from .._tiled_gemm import GemmLoad, binding_name

__all__ = ["NBitsLayout", "nbits_gemv_wgsl", "nbits_gemm_loaders", "gather_block_quantized_wgsl"]


@dataclass(frozen=True)
class NBitsLayout:
    """What the kernels bake in about one MatMulNBits node.

    ``element``: the WGSL storage type of A, the scales, float zero points and the output (``f32``/``f16``).
    ``a_element``: A's own type where it differs (``f32``: A quantized per block first, see
    :func:`~ortgpu.ops.com_microsoft.quantized_weights.quantize_rows_by_block`).
    ``zero_points``: ``"none"`` (the default ``2^(bits-1)``), ``"packed"`` (uint8, ``bits`` per block, rows of
    ``zero_bytes`` bytes) or ``"float"`` (one per block, in ``element``).
    """

    n: int
    k: int
    bits: int
    block_size: int
    element: str
    zero_points: str
    a_element: str = ""

    @property
    def a_type(self) -> str:
        return self.a_element or self.element

    @property
    def blocks(self) -> int:
        return -(-self.k // self.block_size)

    @property
    def codes_per_word(self) -> int:
        return 32 // self.bits

    @property
    def words_per_block(self) -> int:
        return self.block_size * self.bits // 32

    @property
    def words_per_row(self) -> int:
        return self.blocks * self.words_per_block

    @property
    def zero_bytes(self) -> int:
        return -(-self.blocks * self.bits // 8)


def _widen(element: str, value: str) -> str:
    return value if element == "f32" else f"f32({value})"


def _block_functions(layout: NBitsLayout, scales: str, zeros: str) -> str:
    """WGSL ``nbits_scale(n, block) -> f32`` and ``nbits_zero(n, block) -> f32`` (the codes' offset)."""
    text = f"fn nbits_scale(n: u32, block: u32) -> f32 {{ return {_widen(layout.element, f'{scales}[n * {layout.blocks}u + block]')}; }}\n"
    if layout.zero_points == "none":
        return text + f"fn nbits_zero(n: u32, block: u32) -> f32 {{ return {float(1 << (layout.bits - 1))}; }}\n"
    if layout.zero_points == "float":
        return (
            text
            + f"fn nbits_zero(n: u32, block: u32) -> f32 {{ return {_widen(layout.element, f'{zeros}[n * {layout.blocks}u + block]')}; }}\n"
        )
    mask = (1 << layout.bits) - 1
    return text + (
        "fn nbits_zero(n: u32, block: u32) -> f32 {\n"
        f"    let byte = n * {layout.zero_bytes}u + block * {layout.bits}u / 8u;\n"
        f"    let shift = (byte & 3u) * 8u + (block * {layout.bits}u) % 8u;\n"
        f"    return f32(({zeros}[byte >> 2u] >> shift) & {mask}u);\n"
        "}\n"
    )


def _codes(word: str, first: int, bits: int) -> str:
    """vec4<f32> of the codes ``first .. first + 3`` of a u32 word."""
    mask = (1 << bits) - 1
    parts = [
        f"f32(({word} >> {bits * (first + i)}u) & {mask}u)" if first + i else f"f32({word} & {mask}u)" for i in range(4)
    ]
    return f"vec4<f32>({', '.join(parts)})"


def nbits_gemv_wgsl(
    layout: NBitsLayout,
    *,
    rows: int,
    outputs: int,
    lanes: int,
    names: dict[str, str],
    declarations: str,
    epilogue: str,
    grid: tuple[int, int, int],
    group_index: str,
) -> str:
    """The GEMV kernel: ``rows`` rows of A (``[rows, K]``), ``outputs`` columns per workgroup, ``lanes`` lanes per
    column.  ``names``: the bound arrays ``a`` (vec4 elements when K % 4 == 0), ``b`` (u32), ``scales``, ``zeros``
    (absent for ``"none"``) and ``out``."""
    n, k = layout.n, layout.k
    groups_n = -(-n // outputs)
    a = names["a"]
    if k % 4 == 0:
        a_function = (
            "fn a4(m: u32, k: u32) -> vec4<f32> {\n"
            f"    if (k >= K) {{ return vec4<f32>(0.0); }}\n"
            f"    return vec4<f32>({a}[(m * K + k) / 4u]);\n"
            "}\n"
        )
    else:  # the words beyond K read zeros of A (the padding codes of the last block meet 0)
        loads = ", ".join(
            f"select(0.0, {_widen(layout.a_type, f'{a}[m * K + min(k + {i}u, K - 1u)]')}, k + {i}u < K)"
            for i in range(4)
        )
        a_function = f"fn a4(m: u32, k: u32) -> vec4<f32> {{ return vec4<f32>({loads}); }}\n"
    steps = "".join(
        f"            part = part + dot({_codes('word', 4 * g, layout.bits)} - vec4<f32>(zero), a4(m, k0 + {4 * g}u));\n"
        for g in range(layout.codes_per_word // 4)
    )
    return f"""{declarations}
const N: u32 = {n}u;
const K: u32 = {k}u;
const WORDS: u32 = {layout.words_per_row}u;
const GROUPS_N: u32 = {groups_n}u;
const GROUPS: u32 = {groups_n * rows}u;
var<workgroup> partials: array<f32, {lanes * outputs}>;
{_block_functions(layout, names["scales"], names.get("zeros", ""))}{a_function}{epilogue}
@compute @workgroup_size({lanes}, {outputs})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{
    let group = {group_index};
    if (group >= GROUPS) {{ return; }}
    let m = group / GROUPS_N;
    let n = (group % GROUPS_N) * {outputs}u + lid.y;
    var acc = 0.0;
    if (n < N) {{
        for (var w = lid.x; w < WORDS; w = w + {lanes}u) {{
            let word = {names["b"]}[n * WORDS + w];
            let block = w / {layout.words_per_block}u;
            let zero = nbits_zero(n, block);
            let k0 = w * {layout.codes_per_word}u;
            var part = 0.0;
{steps}            acc = fma(part, nbits_scale(n, block), acc);
        }}
    }}
    partials[lid.y * {lanes}u + lid.x] = acc;
    workgroupBarrier();
    for (var s = {lanes // 2}u; s > 0u; s = s >> 1u) {{
        if (lid.x < s) {{
            partials[lid.y * {lanes}u + lid.x] = partials[lid.y * {lanes}u + lid.x] + partials[lid.y * {lanes}u + lid.x + s];
        }}
        workgroupBarrier();
    }}
    if (lid.x == 0u && n < N) {{
        let o = m * N + n;
        {names["out"]}[o] = epilogue(partials[lid.y * {lanes}u], o);
    }}
}}
"""


def nbits_gemm_loaders(layout: NBitsLayout) -> tuple[GemmLoad, GemmLoad, GemmLoad | None, GemmLoad | None, str]:
    """(load_a, load_b, load_a4k, load_b4k, prelude) of the tiled GEMM ``A [M, K] x dequantized B^T``: A is input
    0 (rows of K), B input 1, the scales input 2, the zero points input 3.  The vec4 loaders exist when K % 4 == 0."""
    element, a_type = layout.element, layout.a_type
    a_in, b_in = Binding("input", 0), Binding("input", 1)
    scales_in, zeros_in = Binding("input", 2), Binding("input", 3)
    vec = f"vec4<{a_type}>"
    block_bindings: tuple[tuple[Binding, str], ...] = ((b_in, "u32"), (scales_in, element))
    zeros = ""
    if layout.zero_points == "packed":
        block_bindings += ((zeros_in, "u32"),)
        zeros = binding_name(zeros_in, "u32")
    elif layout.zero_points == "float":
        block_bindings += ((zeros_in, element),)
        zeros = binding_name(zeros_in, element)
    words = binding_name(b_in, "u32")
    prelude = _block_functions(layout, binding_name(scales_in, element), zeros) + (
        "fn nbits_word(k: u32, n: u32) -> u32 {\n"
        f"    return {words}[n * {layout.words_per_row}u + k / {layout.codes_per_word}u];\n"
        "}\n"
    )
    mask = (1 << layout.bits) - 1
    load_a = GemmLoad(
        f"    return {_widen(a_type, f'{binding_name(a_in, a_type)}[m * {layout.k}u + k]')};", ((a_in, a_type),)
    )
    load_b = GemmLoad(
        f"    let code = (nbits_word(k, n) >> ((k % {layout.codes_per_word}u) * {layout.bits}u)) & {mask}u;\n"
        f"    let block = k / {layout.block_size}u;\n"
        "    return (f32(code) - nbits_zero(n, block)) * nbits_scale(n, block);",
        block_bindings,
    )
    if layout.k % 4:
        return load_a, load_b, None, None, prelude
    load_a4k = GemmLoad(f"    return vec4<f32>({binding_name(a_in, vec)}[(m * {layout.k}u + k) / 4u]);", ((a_in, vec),))
    load_b4k = GemmLoad(
        f"    let word = nbits_word(k, n) >> ((k % {layout.codes_per_word}u) * {layout.bits}u);\n"
        f"    let block = k / {layout.block_size}u;\n"
        f"    return ({_codes('word', 0, layout.bits)} - vec4<f32>(nbits_zero(n, block))) * nbits_scale(n, block);",
        block_bindings,
    )
    return load_a, load_b, load_a4k, load_b4k, prelude


def gather_block_quantized_wgsl(
    *,
    rows: int,
    row_length: int,
    last: int,
    bits: int,
    block_size: int,
    zero_points: bool,
    index_dtype: str,
) -> str:
    """Helpers and ``fn value(j: u32) -> f32`` of GatherBlockQuantized over uint8 data (gather axis 0, quantized
    along the last axis): output element ``j`` is logical element ``t = j % row_length`` of data row
    ``indices[j / row_length]`` (``rows`` rows; an index outside ``[-rows, rows)`` gives 0, as onnxruntime does).
    The data's logical last axis has ``last`` codes; the scales (``scale(i)``) and packed zero points (bytes
    ``zero_byte(i)``) hold one entry per block of ``block_size`` along it.  Bindings: ``data`` (u32 words), the
    indices ``index_word``, ``scale`` and ``zero_word`` loaders are the caller's."""
    per_byte = 8 // bits
    blocks = -(-last // block_size)
    zero_row = -(-blocks // per_byte)
    mask = (1 << bits) - 1
    if index_dtype == "int64":  # in range only where the high word is the low word's sign
        index = (
            "    let low = indices[2u * p];\n"
            "    let high = indices[2u * p + 1u];\n"
            "    if (high != select(0u, 0xffffffffu, (low & 0x80000000u) != 0u)) { return 0.0; }\n"
            "    var i = bitcast<i32>(low);\n"
        )
    else:
        index = "    var i = bitcast<i32>(indices[p]);\n"
    if zero_points:
        zero = (
            f"    let zero_at = (e / {last}u) * {zero_row}u + block / {per_byte}u;\n"
            f"    let zero = (((zeros[zero_at >> 2u] >> ((zero_at & 3u) * 8u)) & 0xffu) >> ((block % {per_byte}u) * {bits}u)) & {mask}u;\n"
        )
    else:
        zero = f"    let zero = {1 << (bits - 1)}u;\n"
    return f"""fn value(j: u32) -> f32 {{
    let p = j / {row_length}u;
    let t = j % {row_length}u;
{index}    if (i < 0) {{ i = i + {rows}; }}
    if (i < 0 || i >= {rows}) {{ return 0.0; }}
    let e = u32(i) * {row_length}u + t;
    let byte = e / {per_byte}u;
    let code = (((data[byte >> 2u] >> ((byte & 3u) * 8u)) & 0xffu) >> ((e % {per_byte}u) * {bits}u)) & {mask}u;
    let block = (e % {last}u) / {block_size}u;
{zero}    return f32(i32(code) - i32(zero)) * scale((e / {last}u) * {blocks}u + block);
}}
"""
