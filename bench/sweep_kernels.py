"""``python -m bench.sweep_kernels``: time the tiled GEMM / implicit-GEMM Conv and the GEMV variants at the shapes that matter.

For each shape (the BERT-style encoder's MatMuls and the ResNet-style CNN's convolutions, batch 1 and 16) and
each candidate :class:`ortgpu.ops._gemm.GemmConfig` (tile shape, outputs per invocation, K step, pipeline
stages, split-K), the node is planned with ``get_operator(...).plan`` under ``_gemm.GEMM_OVERRIDE``, its
kernels are recorded ``R`` times into one command list over persistent buffers, and the time per run is
``(median(submit + wait) - median(empty submit + wait)) / R``.  Every variant's output is checked against the
first one's (and that one against the numpy reference on the small shapes).

Prints TFLOP/s per shape x config, the best config per shape and where the default
(:func:`ortgpu.ops._gemm.choose_gemm_config`) ranks; ``--json PATH`` writes it all.

GEMV shapes (labels start with ``gemv``; batch 1, M = 1: mlp16's [1,1024]x[1024,1024] MatMul+Add+Relu, a
[1,4096]x[4096,4096] MatMul, and Gemm transB at 4096 and 8192) run first, each
:class:`ortgpu.ops._gemv.GemvConfig` candidate forced through ``_gemv.GEMV_OVERRIDE`` (columns x K-rows,
vec4 column groups, unrolling, split-K over workgroups, subgroup reduction where the device has subgroups).
They report GB/s (bytes of the node's inputs and output per run) and the percentage of
:data:`PEAK_BANDWIDTH_GBS`, the best variant per shape against the default, a markdown table for
``bench/RESULTS.md`` and a paste-ready ``GEMV_SHAPE_CONFIGS``.  Example::

    python -m bench.sweep_kernels --json sweep.json            # everything (estimated 1.5-2 minutes on an H200)
    python -m bench.sweep_kernels --shapes gemv                # the GEMV shapes only (estimated 20-40 s)
    python -m bench.sweep_kernels --shapes bert --quick        # BERT shapes, fewer variants
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortgpu.ops import DeviceCaps, OpPlan, TensorInfo, _gemm, _gemv, get_operator
from ortgpu.ops._gemm import LEGACY, GemmConfig, choose_gemm_config, config_fits, gemm_workgroups
from ortgpu.ops._gemv import (
    GemvConfig,
    choose_gemv_config,
    default_gemv_config,
    effective_gemv_config,
    gemv_config_fits,
    gemv_workgroups,
    has_subgroups,
)
from ortgpu.ops._runner import padded_size
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice, BindingEntry

from .probes import (
    Owned,
    bandwidth_probes,
    dispatch_floor_probe,
    interleaved,
    median_submit,
    open_backend_device,
)


@dataclass(frozen=True)
class Shape:
    """One node to time: op, opset, input shapes (None = absent), attributes; GEMM dims for the config choice."""

    label: str
    op: str
    opset: int
    inputs: tuple[tuple[int, ...] | None, ...]
    attrs: dict[str, Any]
    gemm: tuple[int, int, int, int]  # batch, M, N, K as the tiled kernel sees them
    weight: int = 1  # occurrences per layer / block in the bench models (scores the rules)
    layout: str = ""  # GEMV shapes: B's layout ("kn" row-major, "nk" transposed)

    @property
    def flops(self) -> float:
        batch, m, n, k = self.gemm
        return 2.0 * batch * m * n * k


def _matmul(
    label: str, a: tuple[int, ...], b: tuple[int, ...], extras: tuple[tuple[int, ...], ...], weight: int = 1
) -> Shape:
    epilogue = tuple(("add", 2 + i) for i in range(len(extras)))
    if len(b) == 2:
        gemm = (1, int(np.prod(a[:-1])), b[-1], a[-1])
    else:
        gemm = (int(np.prod(a[:-2])), a[-2], b[-1], a[-1])
    return Shape(label, "MatMul", 13, (a, b) + extras, {"_epilogue": epilogue} if epilogue else {}, gemm, weight)


def _conv(label: str, batch: int, c_in: int, c_out: int, size: int, kernel: int, stride: int, residual: bool) -> Shape:
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1
    epilogue: tuple[tuple[Any, ...], ...] = (("add", 3), ("relu",)) if residual else (("relu",),) if kernel > 1 else ()
    inputs: tuple[tuple[int, ...] | None, ...] = ((batch, c_in, size, size), (c_out, c_in, kernel, kernel), (c_out,))
    if residual:
        inputs += ((batch, c_out, out, out),)
    attrs = {"pads": [kernel // 2] * 4, "strides": [stride, stride], "_epilogue": epilogue}
    return Shape(label, "Conv", 11, inputs, attrs, (batch, c_out, out * out, c_in * kernel * kernel))


def shapes() -> list[Shape]:
    result = []
    for batch in (1, 16):
        s = 128
        result += [
            _matmul(
                f"bert b{batch} ffn-down MatMul+Add+Add [{batch},128,384] K=1536",
                (batch, s, 1536),
                (1536, 384),
                ((384,), (batch, s, 384)),
            ),
            _matmul(
                f"bert b{batch} proj MatMul+Add [{batch},128,384] K=384", (batch, s, 384), (384, 384), ((384,),), 4
            ),
            _matmul(
                f"bert b{batch} ffn-up MatMul+Add [{batch},128,1536] K=384", (batch, s, 384), (384, 1536), ((1536,),)
            ),
            _matmul(f"bert b{batch} QK^T MatMul [{batch},12,128,128] K=32", (batch, 12, s, 32), (batch, 12, 32, s), ()),
            _matmul(f"bert b{batch} PV MatMul [{batch},12,128,32] K=128", (batch, 12, s, s), (batch, 12, s, 32), ()),
        ]
    for batch in (1, 16):
        result += [
            _conv(f"resnet b{batch} Conv+Relu [{batch},64,224,224] 3x3", batch, 64, 64, 224, 3, 1, False),
            _conv(f"resnet b{batch} Conv+Add+Relu [{batch},128,112,112] 3x3", batch, 128, 128, 112, 3, 1, True),
            _conv(f"resnet b{batch} Conv+Add+Relu [{batch},256,56,56] 3x3", batch, 256, 256, 56, 3, 1, True),
            _conv(f"resnet b{batch} Conv+Relu [{batch},512,28,28] 3x3 s2", batch, 256, 512, 56, 3, 2, False),
            _conv(f"resnet b{batch} Conv+Add+Relu [{batch},512,28,28] 3x3", batch, 512, 512, 28, 3, 1, True),
            _conv(f"resnet b{batch} shortcut Conv [{batch},512,28,28] 1x1 s2", batch, 256, 512, 56, 1, 2, False),
        ]
    result.append(_conv("resnet b1 stem Conv+Relu [1,64,224,224] 3x3 K=27", 1, 3, 64, 224, 3, 1, False))
    return result + transformer_shapes()


#: The projections of the ``--vs torch`` zoo's transformers at batch 1 (their rows M: ViT-B/16's 197 tokens,
#: Whisper-tiny's 1500 frames, 128-token text; K/N of 256..32000): the shapes that leave an H100/H200 with too few
#: workgroups per SM unless the tile or a K split is chosen for them.  (family, rows, [(K, N, epilogue adds)]).
TRANSFORMER_PROJECTIONS: tuple[tuple[str, int, tuple[tuple[int, int, int], ...]], ...] = (
    ("vit-b", 197, ((768, 2304, 1), (768, 768, 2), (768, 3072, 1), (3072, 768, 2))),
    ("whisper-tiny", 1500, ((384, 384, 1), (384, 1536, 1), (1536, 384, 2))),
    ("bert-base", 128, ((768, 768, 1), (768, 3072, 1), (3072, 768, 2))),
    ("llama-small", 128, ((512, 256, 0), (512, 1376, 0), (1376, 512, 1), (512, 32000, 0))),
)


def transformer_shapes() -> list[Shape]:
    """One MatMul (with its bias / residual Adds) per projection of :data:`TRANSFORMER_PROJECTIONS`; labels start
    with ``xf`` (``--shapes xf`` sweeps them alone)."""
    result = []
    for family, rows, projections in TRANSFORMER_PROJECTIONS:
        for k, n, adds in projections:
            extras = ((n,), (1, rows, n))[:adds]
            name = "MatMul" + "+Add" * adds
            result.append(_matmul(f"xf {family} {name} M={rows} N={n} K={k}", (1, rows, k), (k, n), extras))
    for family, heads, rows, head in TRANSFORMER_ATTENTION:
        result += [
            _matmul(
                f"xf {family} QK^T {heads}x{rows}x{rows} K={head}", (1, heads, rows, head), (1, heads, head, rows), ()
            ),
            _matmul(
                f"xf {family} PV {heads}x{rows}x{head} K={rows}", (1, heads, rows, rows), (1, heads, rows, head), ()
            ),
        ]
    return result


#: The attention products left unfused (over the fused kernel's 128 x 128 scores per head): (family, heads, rows,
#: head size) at batch 1.
TRANSFORMER_ATTENTION: tuple[tuple[str, int, int, int], ...] = (("vit-b", 12, 197, 64), ("whisper-tiny", 6, 1500, 64))


#: The H200's memory bandwidth (HBM3e, 4.8 TB/s) that the GEMV percentages refer to.
PEAK_BANDWIDTH_GBS = 4800.0


def gemv_shapes() -> list[Shape]:
    """Batch-1 GEMVs (M = 1): the memory-bound shapes of issue 5's bandwidth target."""
    return [
        _matmul_gemv("gemv mlp16 MatMul+Add+Relu [1,1024]x[1024,1024]", 1024, 1024, (("add", 2), ("relu",))),
        _matmul_gemv("gemv MatMul+Add [1,4096]x[4096,4096]", 4096, 4096, (("add", 2),)),
        _gemm_gemv("gemv Gemm transB [1,4096]x[4096,4096]^T +C", 4096, 4096),
        _gemm_gemv("gemv Gemm transB [1,8192]x[8192,8192]^T +C", 8192, 8192),
    ]


def _matmul_gemv(label: str, k: int, n: int, epilogue: tuple[tuple[Any, ...], ...]) -> Shape:
    return Shape(label, "MatMul", 13, ((1, k), (k, n), (n,)), {"_epilogue": epilogue}, (1, 1, n, k), layout="kn")


def _gemm_gemv(label: str, k: int, n: int) -> Shape:
    return Shape(label, "Gemm", 13, ((1, k), (n, k), (n,)), {"transB": 1}, (1, 1, n, k), layout="nk")


def gemv_bytes(shape: Shape) -> int:
    """Bytes a GEMV must move per run: its inputs once and its output once (float32)."""
    _, _, n, _ = shape.gemm
    return 4 * (sum(int(np.prod(s)) for s in shape.inputs if s is not None) + n)


#: GEMV variants: (threads_x, threads_k, vectors, unroll) per layout ("kn": column threads x K-rows, vec4 column
#: groups per invocation; "nk": outputs x lanes per output); each also runs split over workgroups and with the
#: subgroup reduction (see :func:`gemv_candidates`).
GEMV_BASES: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "kn": (
        (2, 128, 1, 1),
        (2, 128, 1, 2),
        (2, 128, 1, 4),
        (4, 64, 1, 1),
        (4, 64, 1, 2),
        (4, 64, 1, 4),
        (8, 32, 1, 2),
        (8, 32, 1, 4),
        (8, 32, 2, 2),
        (16, 16, 1, 4),
        (2, 64, 1, 4),
        (4, 32, 1, 4),
        (1, 256, 1, 2),
        (4, 128, 1, 2),
    ),
    "nk": (
        (4, 64, 1, 1),
        (4, 64, 1, 2),
        (4, 64, 1, 4),
        (8, 32, 1, 1),
        (8, 32, 1, 2),
        (8, 32, 1, 4),
        (16, 16, 1, 2),
        (16, 16, 1, 4),
        (2, 128, 1, 2),
        (1, 256, 1, 2),
        (8, 64, 1, 2),
        (16, 32, 1, 2),
    ),
}
QUICK_GEMV_BASES: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "kn": ((2, 128, 1, 1), (2, 128, 1, 4), (4, 64, 1, 2), (8, 32, 1, 4), (8, 32, 2, 2)),
    "nk": ((4, 64, 1, 1), (4, 64, 1, 4), (8, 32, 1, 2), (16, 16, 1, 4)),
}
GEMV_SPLITS = (2, 4, 8, 16, 32)
#: Split-K candidates keep the launched workgroups within this range (132 SMs on an H200).
GEMV_WORKGROUPS = (132, 2112)


def gemv_candidates(shape: Shape, caps: DeviceCaps, quick: bool) -> list[tuple[str, GemvConfig]]:
    """("default" or the label, config) per GEMV variant of ``shape``, default first, no two that run alike."""
    _, _, n, k = shape.gemm
    layout = shape.layout
    default = choose_gemv_config(layout, n, k, caps)
    chosen: list[tuple[str, GemvConfig]] = [("default", default)]
    seen = {effective_gemv_config(default, layout, n, k, caps)}
    sub = [False, True] if has_subgroups(caps) else [False]
    units = k // 4 if layout == "nk" and k % 4 == 0 else k
    for tx, tk, vectors, unroll in (QUICK_GEMV_BASES if quick else GEMV_BASES)[layout]:
        base = GemvConfig(tx, tk, vectors, unroll)
        unsplit = gemv_workgroups(base, layout, n, k)
        splits = [1] + [
            split
            for split in GEMV_SPLITS
            if (not quick or split in (4, 8, 16))
            and GEMV_WORKGROUPS[0] <= unsplit * split <= GEMV_WORKGROUPS[1]
            and units // split >= tk * unroll
        ]
        for split in splits:
            for subgroups in sub:
                config = dataclasses.replace(base, split_k=split, subgroups=subgroups)
                if not gemv_config_fits(config, layout, caps):
                    continue
                effective = effective_gemv_config(config, layout, n, k, caps)
                if effective in seen:
                    continue
                seen.add(effective)
                chosen.append((config.label, config))
    return chosen


#: Tile variants tried on every shape (split-K variants are added for the small ones).
BASE_CONFIGS: tuple[GemmConfig, ...] = (
    GemmConfig(128, 128, 16, 8, 8, stages=1),
    GemmConfig(128, 128, 16, 8, 8, stages=2),
    GemmConfig(128, 64, 16, 8, 4, stages=2),
    GemmConfig(128, 64, 16, 8, 4, stages=1),
    GemmConfig(128, 64, 32, 8, 4, stages=1),
    GemmConfig(64, 128, 16, 4, 8, stages=2),
    GemmConfig(64, 64, 16, 4, 4, stages=2),
    GemmConfig(64, 64, 16, 4, 4, stages=1),
    GemmConfig(64, 64, 32, 4, 4, stages=2),
    GemmConfig(64, 64, 16, 8, 4, stages=2),
    GemmConfig(32, 64, 16, 4, 4, stages=2),
    GemmConfig(32, 64, 16, 4, 4, stages=1),
    GemmConfig(32, 32, 16, 4, 4, stages=2),
)
QUICK_CONFIGS: tuple[GemmConfig, ...] = (
    GemmConfig(128, 64, 16, 8, 4, stages=2),
    GemmConfig(64, 64, 16, 4, 4, stages=2),
    GemmConfig(32, 64, 16, 4, 4, stages=2),
    GemmConfig(32, 32, 16, 4, 4, stages=2),
)
SPLITS = (2, 3, 4, 6, 8, 12, 16)


def _ladder(*tiles: tuple[int, int, int, int, int, int]) -> tuple[GemmConfig, ...]:
    return tuple(GemmConfig(tm, tn, tk, rows, cols, stages=stages) for tm, tn, tk, rows, cols, stages in tiles)


#: Alternative settings of the default rule's tunables (GEMM_TILES ladder, target workgroups, min K per
#: split slice), scored over the measured shapes after the sweep; their picks are always measured.
LADDERS: dict[str, tuple[GemmConfig, ...]] = {
    "128x64,64x64,32x64 s2": _ladder((128, 64, 16, 8, 4, 2), (64, 64, 16, 4, 4, 2), (32, 64, 16, 4, 4, 2)),
    "128x64,64x64,32x64 s1": _ladder((128, 64, 16, 8, 4, 1), (64, 64, 16, 4, 4, 1), (32, 64, 16, 4, 4, 1)),
    "128x128,128x64,64x64,32x64 s2": _ladder(
        (128, 128, 16, 8, 8, 2), (128, 64, 16, 8, 4, 2), (64, 64, 16, 4, 4, 2), (32, 64, 16, 4, 4, 2)
    ),
    "128x64,64x64 s2": _ladder((128, 64, 16, 8, 4, 2), (64, 64, 16, 4, 4, 2)),
    "128x64,32x64 s2": _ladder((128, 64, 16, 8, 4, 2), (32, 64, 16, 4, 4, 2)),
    "128x64 s2": _ladder((128, 64, 16, 8, 4, 2)),
    "64x64,32x64 s2": _ladder((64, 64, 16, 4, 4, 2), (32, 64, 16, 4, 4, 2)),
    "128x64,64x64,32x32 s2": _ladder((128, 64, 16, 8, 4, 2), (64, 64, 16, 4, 4, 2), (32, 32, 16, 4, 4, 2)),
}
TARGETS = (132, 264, 528)
SPLIT_MIN_KS = (64, 128, 256)


@dataclass(frozen=True)
class Rule:
    ladder: str
    target: int
    split_min_k: int

    def pick(self, shape: Shape, caps: DeviceCaps) -> GemmConfig:
        batch, m, n, k = shape.gemm
        return choose_gemm_config(
            batch, m, n, k, caps, tiles=LADDERS[self.ladder], target=self.target, split_min_k=self.split_min_k
        )

    def snippet(self) -> str:
        tiles = ",\n".join(f"    {c!r}" for c in LADDERS[self.ladder])
        return (
            f"GEMM_TILES: tuple[GemmConfig, ...] = (\n{tiles},\n)\nGEMM_TARGET_WORKGROUPS = {self.target}\n"
            f"GEMM_SPLIT_MIN_K = {self.split_min_k}"
        )


def rules() -> list[Rule]:
    return [Rule(ladder, target, min_k) for ladder in LADDERS for target in TARGETS for min_k in SPLIT_MIN_KS]


def candidates(shape: Shape, caps: DeviceCaps, quick: bool) -> list[tuple[str, GemmConfig]]:
    batch, m, n, k = shape.gemm
    default = choose_gemm_config(batch, m, n, k, caps)
    chosen: list[tuple[str, GemmConfig]] = [("legacy", LEGACY), ("default", default)]
    seen = {LEGACY, default}
    for rule in rules():
        config = rule.pick(shape, caps)
        if config not in seen and config_fits(config, caps):
            seen.add(config)
            chosen.append(("rule", config))
    for base in QUICK_CONFIGS if quick else BASE_CONFIGS:
        if not config_fits(base, caps):
            continue
        if base.tile_m >= 4 * m or base.tile_n >= 4 * n:
            continue
        variants = [base]
        tiles = gemm_workgroups(base, batch, m, n)
        if tiles < 2 * _gemm.GEMM_TARGET_WORKGROUPS:
            target = _gemm.GEMM_TARGET_WORKGROUPS
            for split in SPLITS:
                if k // split < max(64, 2 * base.tile_k) or not target // 2 <= tiles * split <= 3 * target:
                    continue
                if quick and split not in (2, 4, 8):
                    continue
                variants.append(dataclasses.replace(base, split_k=split))
        for config in variants:
            if config not in seen:
                seen.add(config)
                chosen.append((config.label, config))
    return chosen


@dataclass
class Prepared:
    """A plan's pipelines, bind groups and scratch (``owned``), recorded ``count`` times into ``commands``."""

    commands: CommandList
    count: int
    owned: Owned

    def release(self) -> None:
        self.owned.release()


class Runner:
    """Persistent input/output buffers of one shape; runs plans over them."""

    def __init__(self, device: BackendDevice, shape: Shape, rng: np.random.Generator, cold_bytes: int = 0) -> None:
        """``cold_bytes``: GEMV shapes keep copies of the weight B until they hold at least this many bytes, and
        successive runs cycle through them, so B streams from memory as in a model whose weights exceed the
        cache (mlp16's 64 MB against the H200's 50 MB L2) instead of staying cache-resident."""
        self.device = device
        self.shape = shape
        operator = get_operator(shape.op, shape.opset)
        self.operator = operator
        self.arrays: list[np.ndarray | None] = [
            None if s is None else rng.standard_normal(s).astype(np.float32) for s in shape.inputs
        ]
        self.infos = [None if a is None else TensorInfo(tuple(a.shape), a.dtype) for a in self.arrays]
        out_shape = self._out_shape()
        self.outputs = [TensorInfo(out_shape, np.dtype(np.float32))]
        self.buffers: list[int | None] = []
        for array in self.arrays:
            if array is None:
                self.buffers.append(None)
                continue
            buffer = device.create_buffer(padded_size(array.nbytes), label="sweep-input")
            device.write_buffer(buffer, 0, array.tobytes())
            self.buffers.append(buffer)
        self.output = device.create_buffer(padded_size(self.outputs[0].nbytes), label="sweep-output")
        # input index -> extra copies (GEMV weights only), cycled through by prepare()'s recording
        self.copies: list[int] = []
        weight = self.arrays[1] if shape.layout and len(self.arrays) > 1 else None
        if weight is not None and cold_bytes > weight.nbytes:
            for _ in range(-(-cold_bytes // weight.nbytes) - 1):
                buffer = device.create_buffer(padded_size(weight.nbytes), label="sweep-weight-copy")
                device.write_buffer(buffer, 0, weight.tobytes())
                self.copies.append(buffer)

    def _out_shape(self) -> tuple[int, ...]:
        s = self.shape
        if s.op == "MatMul":
            from ortgpu.ops.ai_onnx.matmul import matmul_output_shape

            assert s.inputs[0] is not None and s.inputs[1] is not None
            return matmul_output_shape(s.inputs[0], s.inputs[1])
        if s.op == "Gemm":
            batch, m, n, k = s.gemm
            return (m, n)
        x, w = s.inputs[0], s.inputs[1]
        assert x is not None and w is not None
        batch, m, n, k = s.gemm
        side = int(round(n**0.5))
        return (x[0], w[0], side, side)

    def plan(self, config: GemmConfig | GemvConfig, caps: DeviceCaps) -> OpPlan:
        if isinstance(config, GemvConfig):
            previous_gemv = _gemv.GEMV_OVERRIDE
            _gemv.GEMV_OVERRIDE = config
            try:
                return self.operator.plan(self.infos, self.outputs, self.shape.attrs, caps, {})
            finally:
                _gemv.GEMV_OVERRIDE = previous_gemv
        previous = _gemm.GEMM_OVERRIDE
        _gemm.GEMM_OVERRIDE = config
        try:
            return self.operator.plan(self.infos, self.outputs, self.shape.attrs, caps, {})
        finally:
            _gemm.GEMM_OVERRIDE = previous

    def reference(self) -> np.ndarray:
        return np.asarray(self.operator.reference(self.arrays, self.shape.attrs, self.outputs)[0])

    def prepare(self, plan: OpPlan, baseline: float, budget_s: float) -> tuple[Prepared, np.ndarray]:
        """``plan``'s kernels bound to the persistent buffers and recorded ``count`` times (about ``budget_s`` of GPU
        time per submit), and the output of one run."""
        device = self.device
        prepared = Prepared(CommandList(), 1, Owned(device))
        try:
            scratch = []
            for size in plan.scratch_sizes:
                buffer = device.create_buffer(padded_size(size), label="sweep-scratch")
                prepared.owned.buffers.append(buffer)
                scratch.append(buffer)
            pipelines = []
            for kernel in plan.kernels:
                pipeline = device.create_compute_pipeline(kernel.wgsl, twin=kernel.twin, label=kernel.name)
                prepared.owned.pipelines.append(pipeline)
                pipelines.append(pipeline)
            rotations: list[list[tuple[int, int, tuple[int, int, int]]]] = []
            for weight in [None, *self.copies]:  # the original B, then each copy of it
                dispatches: list[tuple[int, int, tuple[int, int, int]]] = []
                for kernel, pipeline in zip(plan.kernels, pipelines):
                    entries = []
                    for slot, binding in enumerate(kernel.bindings):
                        if binding.kind == "input":
                            bound = self.buffers[binding.index] if weight is None or binding.index != 1 else weight
                            assert bound is not None
                            buffer = bound
                            info = self.infos[binding.index]
                            assert info is not None
                            size = padded_size(info.nbytes)
                        elif binding.kind == "output":
                            buffer, size = self.output, padded_size(self.outputs[0].nbytes)
                        elif binding.kind == "scratch":
                            buffer, size = scratch[binding.index], padded_size(plan.scratch_sizes[binding.index])
                        else:
                            raise ValueError("params bindings are not used by the GEMM kernels")
                        entries.append(BindingEntry(slot, buffer, 0, size))
                    group = device.create_bind_group(pipeline, entries)
                    prepared.owned.groups.append(group)
                    dispatches.append((pipeline, group, kernel.grid))
                rotations.append(dispatches)

            def record(count: int) -> CommandList:
                commands = CommandList()
                for index in range(count):
                    for pipeline, group, grid in rotations[index % len(rotations)]:
                        commands.add_dispatch(pipeline, group, *grid)
                return commands

            once = record(1)
            device.submit(once)
            device.wait_idle()
            raw = device.read_buffer(self.output, 0, padded_size(self.outputs[0].nbytes))
            result = (
                np.frombuffer(raw[: self.outputs[0].nbytes], dtype=np.float32).reshape(self.outputs[0].shape).copy()
            )
            single = max(median_submit(device, once, 3) - baseline, 1e-6)
            prepared.count = int(min(200, max(len(rotations), budget_s / single)))
            prepared.commands = record(prepared.count)
            device.submit(prepared.commands)
            device.wait_idle()
            return prepared, result
        except BaseException:
            prepared.release()
            raise

    def time(self, plan: OpPlan, baseline: float, budget_s: float, repeats: int) -> tuple[float, np.ndarray]:
        """Seconds per run of ``plan`` (median of ``repeats`` submits of ``count`` runs) and its output."""
        prepared, result = self.prepare(plan, baseline, budget_s)
        try:
            return max(median_submit(self.device, prepared.commands, repeats) - baseline, 0.0) / prepared.count, result
        finally:
            prepared.release()

    def release(self) -> None:
        for buffer in [*self.buffers, *self.copies]:
            if buffer is not None:
                self.device.destroy_buffer(buffer)
        self.device.destroy_buffer(self.output)


def score_rules(
    swept: list[Shape], measured: dict[str, dict[GemmConfig, float]], caps: DeviceCaps
) -> list[dict[str, Any]]:
    """Each rule's score over the swept shapes, best first: the weighted mean of (its pick's time / the shape's
    fastest time), so 1.0 means it picks the fastest variant everywhere; also its weighted total time."""
    current = (tuple(_gemm.GEMM_TILES), _gemm.GEMM_TARGET_WORKGROUPS, _gemm.GEMM_SPLIT_MIN_K)
    scores: list[dict[str, Any]] = []
    for rule in rules():
        total = ratio = weights = 0.0
        picks = {}
        for shape in swept:
            times = measured.get(shape.label)
            if not times:
                continue
            config = rule.pick(shape, caps)
            seconds = times.get(config)
            if seconds is None:
                break
            total += seconds * shape.weight
            ratio += seconds / max(min(times.values()), 1e-12) * shape.weight
            weights += shape.weight
            picks[shape.label] = config.label
        else:
            if weights:
                scores.append(
                    {
                        "rule": f"{rule.ladder}, {rule.target}, {rule.split_min_k}",
                        "score": ratio / weights,
                        "total_us": total * 1e6,
                        "snippet": rule.snippet(),
                        "picks": picks,
                        "current": (LADDERS[rule.ladder], rule.target, rule.split_min_k) == current,
                    }
                )
    scores.sort(key=lambda entry: float(entry["score"]))
    return scores


def sweep_gemv(
    device: BackendDevice,
    caps: DeviceCaps,
    args: argparse.Namespace,
    started: float,
    baseline: float,
    rng: np.random.Generator,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], int]:
    """Time every GEMV candidate of the selected GEMV shapes, interleaved with the bandwidth and dispatch-floor
    probes of :mod:`bench.probes`: (rows, best per shape, probe results, wrong results)."""
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    probe_results: dict[str, Any] = {}
    failures = 0
    selected = [
        s for s in gemv_shapes() if not args.shapes or any(part.strip() in s.label for part in args.shapes.split(","))
    ]
    if not selected:
        return rows, summary, probe_results, failures
    probes = bandwidth_probes(device, caps, args.probe_mb, repeats=10) + [dispatch_floor_probe(device, repeats=200)]
    probe_samples: dict[str, list[float]] = {probe.name: [] for probe in probes}
    counts = [len(gemv_candidates(shape, caps, args.quick)) for shape in selected]
    print(
        f"\nGEMV: {sum(counts)} variants over {len(selected)} shapes (subgroups: {'yes' if has_subgroups(caps) else 'no'}), "
        f"{args.rounds} interleaved rounds with the probes; % of the measured bandwidth (and of {PEAK_BANDWIDTH_GBS / 1000:.1f} TB/s)"
    )
    try:
        for shape in selected:
            runner = Runner(device, shape, rng, cold_bytes=args.cold_mb * 1_000_000)
            prepared: dict[str, Prepared] = {}
            try:
                batch, m, n, k = shape.gemm
                nbytes = gemv_bytes(shape)
                print(
                    f"\n{shape.label}: layout {shape.layout}, N {n} K {k}, {nbytes / 1e6:.1f} MB per run"
                    + (f", cycling through {len(runner.copies) + 1} copies of B" if runner.copies else "")
                )
                first: np.ndarray | None = None
                shape_rows: list[dict[str, Any]] = []
                for name, config in gemv_candidates(shape, caps, args.quick):
                    if time.perf_counter() - started > args.max_seconds and name != "default":
                        print(f"  {config.label:28s} skipped (--max-seconds {args.max_seconds:.0f} reached)")
                        continue
                    effective = effective_gemv_config(config, shape.layout, n, k, caps)
                    row: dict[str, Any] = {
                        "shape": shape.label,
                        "layout": shape.layout,
                        "n": n,
                        "k": k,
                        "config": config.label,
                        "is_default": name == "default",
                        "fields": dataclasses.asdict(config),
                    }
                    try:
                        plan = runner.plan(config, caps)
                        ready, result = runner.prepare(plan, baseline, args.budget_ms / 1e3)
                    except Exception as error:  # a variant the device rejects is reported, not fatal
                        row.update(error=f"{type(error).__name__}: {error}")
                        print(f"  {config.label:28s} ERROR {row['error'][:120]}")
                        rows.append(row)
                        if name == "default":
                            print("  (the default does not run here: shape skipped)")
                            break
                        continue
                    prepared[config.label] = ready
                    if first is None:
                        first = result
                        if shape.flops / 1e9 <= args.reference_gflop:
                            row["err_vs_reference"] = _rel(result, runner.reference())
                    row.update(
                        workgroups=gemv_workgroups(effective, shape.layout, n, k),
                        kernels=len(plan.kernels),
                        err_vs_first=_rel(result, first),
                    )
                    rows.append(row)
                    shape_rows.append(row)
                timed = [(label, ready.commands, ready.count) for label, ready in prepared.items()]
                timed += [(probe.name, probe.commands, probe.repeats) for probe in probes]
                samples = interleaved(device, timed, baseline, args.rounds, rng)
                for probe in probes:
                    probe_samples[probe.name] += samples[probe.name]
                shape_probes = {probe.name: statistics.median(samples[probe.name]) for probe in probes}
                measured_gbs = max(
                    probe.bytes_per_repeat / shape_probes[probe.name] / 1e9
                    for probe in probes
                    if probe.bytes_per_repeat and shape_probes[probe.name] > 0
                )
                floor_us = shape_probes["dispatch floor"] * 1e6
                print(f"  measured bandwidth {measured_gbs:.0f} GB/s, dispatch floor {floor_us:.2f} us (interleaved)")
                for row in shape_rows:
                    seconds = statistics.median(samples[row["config"]])
                    gbs = nbytes / seconds / 1e9 if seconds > 0 else None
                    row.update(
                        us=seconds * 1e6,
                        gbs=gbs,
                        peak_percent=100.0 * gbs / PEAK_BANDWIDTH_GBS if gbs else None,
                        measured_percent=100.0 * gbs / measured_gbs if gbs else None,
                        measured_gbs=measured_gbs,
                        spread_us=(max(samples[row["config"]]) - min(samples[row["config"]])) * 1e6,
                    )
                    bad = row["err_vs_first"] > 1e-3 or row.get("err_vs_reference", 0.0) > 1e-3
                    failures += bad
                    rate = (
                        f"{gbs:8.0f} GB/s {row['measured_percent']:5.1f}% ({row['peak_percent']:4.1f}%)"
                        if gbs
                        else "     inf"
                    )
                    print(
                        f"  {row['config']:28s}{' (default)' if row['is_default'] else '          '} {row['us']:8.2f} us {rate} "
                        f"{row['workgroups']:6d} wg {row['kernels']} k{'  WRONG err=%.2e' % row['err_vs_first'] if bad else ''}",
                        flush=True,
                    )
                good = [r for r in shape_rows if r.get("us") and not (r["err_vs_first"] > 1e-3)]
                if good:
                    best = min(good, key=lambda r: r["us"])
                    default_row = next((r for r in good if r["is_default"]), None)
                    summary.append(
                        {
                            "shape": shape.label,
                            "layout": shape.layout,
                            "n": n,
                            "k": k,
                            "best": best["config"],
                            "best_us": best["us"],
                            "best_gbs": best["gbs"],
                            "best_percent": best["peak_percent"],
                            "best_measured_percent": best["measured_percent"],
                            "measured_gbs": measured_gbs,
                            "dispatch_floor_us": floor_us,
                            "best_fields": best["fields"],
                            "default": default_row["config"] if default_row else None,
                            "default_us": default_row["us"] if default_row else None,
                            "default_gbs": default_row["gbs"] if default_row else None,
                        }
                    )
            finally:
                for ready in prepared.values():
                    ready.release()
                runner.release()
    finally:
        for probe in probes:
            probe.release()
    for probe in probes:
        if probe_samples[probe.name]:
            seconds = statistics.median(probe_samples[probe.name])
            probe_results[probe.name] = {
                "us": seconds * 1e6,
                "gbs": probe.bytes_per_repeat / seconds / 1e9 if probe.bytes_per_repeat and seconds else None,
            }
    if summary:
        print(
            "\nprobes over the whole GEMV sweep: "
            + ", ".join(
                f"{name} {value['gbs']:.0f} GB/s" if value["gbs"] else f"{name} {value['us']:.2f} us per dispatch"
                for name, value in probe_results.items()
            )
        )
        print("\nGEMV best per shape (default = choose_gemv_config):")
        for entry in summary:
            ratio = entry["default_us"] / entry["best_us"] if entry["default_us"] and entry["best_us"] else float("nan")
            print(
                f"  {entry['shape']:48s} best {entry['best']:24s} {entry['best_us']:8.2f} us {entry['best_gbs'] or 0:7.0f} GB/s "
                f"({entry['best_measured_percent'] or 0:.1f}% of measured); default {entry['default']} x{ratio:.2f}"
            )
        print(
            "\nGEMV table (paste into bench/RESULTS.md; % of the bandwidth measured in the same rounds, and of "
            f"{PEAK_BANDWIDTH_GBS / 1000:.1f} TB/s):"
        )
        print("| shape | measured GB/s | floor us | default | us | GB/s | % | best | us | GB/s | % (of 4.8 TB/s) |")
        print("|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|")
        for entry in summary:
            d_us, d_gbs, measured = entry["default_us"], entry["default_gbs"], entry["measured_gbs"]
            default_cells = (
                f"{d_us:.2f} | {d_gbs:.0f} | {100 * d_gbs / measured:.1f}" if d_us and d_gbs else "- | - | -"
            )
            print(
                f"| {entry['shape']} | {measured:.0f} | {entry['dispatch_floor_us']:.2f} | {entry['default']} | {default_cells} | "
                f"{entry['best']} | {entry['best_us']:.2f} | {entry['best_gbs'] or 0:.0f} | "
                f"{entry['best_measured_percent'] or 0:.1f} ({entry['best_percent'] or 0:.1f}) |"
            )
        table = ",\n".join(
            f"    {(entry['layout'], entry['n'], entry['k'])!r}: {GemvConfig(**entry['best_fields'])!r}"
            for entry in summary
            if GemvConfig(**entry["best_fields"]) != default_gemv_config(entry["layout"], caps)
        )
        print(
            "\nfastest GEMV config per measured shape (paste into ortgpu/ops/_gemv.py):\n"
            "GEMV_SHAPE_CONFIGS: dict[tuple[str, int, int], GemvConfig] = {\n" + (table + ",\n" if table else "") + "}"
        )
    return rows, summary, probe_results, failures


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(float(np.linalg.norm(b.astype(np.float64))), 1e-30))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep_kernels", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", dest="json_path", default=None, help="write every measurement here")
    parser.add_argument(
        "--shapes",
        default="",
        help="only shapes whose label contains one of these comma-separated parts (e.g. gemv, bert, mlp16, 'b1 PV,b16')",
    )
    parser.add_argument("--quick", action="store_true", help="fewer variants per shape")
    parser.add_argument("--backend", choices=("wgpu", "fake"), default="wgpu")
    parser.add_argument(
        "--budget-ms", type=float, default=3.0, help="GPU time per timed submit (repeats per command list)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed submits per variant (median)")
    parser.add_argument(
        "--rounds", type=int, default=7, help="GEMV: interleaved rounds over all variants and probes (median)"
    )
    parser.add_argument(
        "--cold-mb",
        type=int,
        default=128,
        help="GEMV: cycle through copies of the weight holding at least this many MB (beyond the cache; 0 = one copy)",
    )
    parser.add_argument("--probe-mb", type=int, default=256, help="GEMV: source buffer of the bandwidth probes (MB)")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=170.0,
        help="after this long only the legacy, default and rule-picked variants are timed",
    )
    parser.add_argument(
        "--reference-gflop",
        type=float,
        default=4.0,
        help="check the first variant against numpy only below this many GFLOP",
    )
    args = parser.parse_args(argv)

    device = open_backend_device(args.backend)
    caps = DeviceCaps(frozenset(device.features), device.limits)
    info = device.info
    print(
        f"device: {info.name} ({info.driver}, {info.backend_type}); workgroup storage {device.limits.max_compute_workgroup_storage_size} B, "
        f"{device.limits.max_compute_invocations_per_workgroup} invocations"
    )
    started = time.perf_counter()
    baseline = median_submit(device, CommandList(), 21)
    print(f"empty submit+wait: {baseline * 1e6:.1f} us (subtracted)")
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    measured: dict[str, dict[GemmConfig, float]] = {}
    swept: list[Shape] = []
    gemv_rows, gemv_summary, probe_results, failures = sweep_gemv(device, caps, args, started, baseline, rng)
    for shape in shapes():
        if args.shapes and not any(part.strip() in shape.label for part in args.shapes.split(",")):
            continue
        swept.append(shape)
        runner = Runner(device, shape, rng)
        try:
            batch, m, n, k = shape.gemm
            print(f"\n{shape.label}: GEMM batch {batch} M {m} N {n} K {k}, {shape.flops / 1e9:.2f} GFLOP")
            first: np.ndarray | None = None
            shape_rows: list[dict[str, Any]] = []
            for name, config in candidates(shape, caps, args.quick):
                if time.perf_counter() - started > args.max_seconds and name not in ("legacy", "default", "rule"):
                    print(f"  {config.label:34s} skipped (--max-seconds {args.max_seconds:.0f} reached)")
                    continue
                row: dict[str, Any] = {
                    "shape": shape.label,
                    "gemm": list(shape.gemm),
                    "config": config.label,
                    "is_default": name == "default",
                    "fields": dataclasses.asdict(config),
                }
                try:
                    plan = runner.plan(config, caps)
                    seconds, result = runner.time(plan, baseline, args.budget_ms / 1e3, args.repeats)
                except Exception as error:  # a variant the device rejects is reported, not fatal
                    row.update(error=f"{type(error).__name__}: {error}")
                    print(f"  {config.label:34s} ERROR {row['error'][:120]}")
                    rows.append(row)
                    continue
                if first is None:
                    first = result
                    if shape.flops / 1e9 <= args.reference_gflop:
                        row["err_vs_reference"] = _rel(result, runner.reference())
                err = _rel(result, first)
                row.update(
                    us=seconds * 1e6,
                    tflops=shape.flops / seconds / 1e12 if seconds > 0 else None,
                    workgroups=gemm_workgroups(config, batch, m, n),
                    kernels=len(plan.kernels),
                    err_vs_first=err,
                )
                bad = err > 1e-3 or row.get("err_vs_reference", 0.0) > 1e-3
                failures += bad
                rate = f"{row['tflops']:7.2f}" if row["tflops"] else "    inf"
                print(
                    f"  {config.label:34s}{' (default)' if name == 'default' else '          '} {seconds * 1e6:9.1f} us {rate} TFLOP/s "
                    f"{row['workgroups']:6d} wg{'  WRONG err=%.2e' % err if bad else ''}",
                    flush=True,
                )
                rows.append(row)
                shape_rows.append(row)
                if not bad:
                    measured.setdefault(shape.label, {})[config] = seconds
            timed = [r for r in shape_rows if r.get("us") and not (r["err_vs_first"] > 1e-3)]
            if timed:
                best = min(timed, key=lambda r: r["us"])
                default_row = next((r for r in timed if r["is_default"]), None)
                legacy_row = next((r for r in timed if r["config"] == LEGACY.label), None)
                entry = {
                    "shape": shape.label,
                    "gemm": list(shape.gemm),
                    "best": best["config"],
                    "best_us": best["us"],
                    "best_tflops": best["tflops"],
                    "best_fields": best["fields"],
                    "default": default_row["config"] if default_row else None,
                    "default_us": default_row["us"] if default_row else None,
                    "legacy_us": legacy_row["us"] if legacy_row else None,
                }
                summary.append(entry)
        finally:
            runner.release()
    if summary:
        print("\nbest per shape (default = choose_gemm_config):")
    for entry in summary:
        ratio = entry["default_us"] / entry["best_us"] if entry["default_us"] and entry["best_us"] else float("nan")
        legacy = entry["legacy_us"] / entry["best_us"] if entry["legacy_us"] and entry["best_us"] else float("nan")
        print(
            f"  {entry['shape']:58s} best {entry['best']:30s} {entry['best_us']:8.1f} us "
            f"({entry['best_tflops'] or 0:.2f} TFLOP/s); default {entry['default']} x{ratio:.2f}; legacy x{legacy:.2f}"
        )
    scores = score_rules(swept, measured, caps)
    if scores:
        current = next((entry for entry in scores if entry["current"]), None)
        best_total = sum(min(times.values()) * shape.weight for shape in swept if (times := measured.get(shape.label)))
        print(
            "\nrules (GEMM_TILES ladder, GEMM_TARGET_WORKGROUPS, GEMM_SPLIT_MIN_K): mean slowdown vs the fastest "
            "variant per shape (weighted), and weighted total time"
        )
        for entry in scores[:8]:
            print(
                f"  x{entry['score']:.3f} {entry['total_us']:10.1f} us  {entry['rule']}{'  (current)' if entry['current'] else ''}"
            )
        if current is not None:
            print(
                f"  x{current['score']:.3f} {current['total_us']:10.1f} us  current rule; per-shape best total {best_total * 1e6:.1f} us"
            )
        print("\nbest rule's tunables (paste into ortgpu/ops/_gemm.py):\n" + scores[0]["snippet"])
    if summary:
        table = ",\n".join(f"    {tuple(entry['gemm'])!r}: {GemmConfig(**entry['best_fields'])!r}" for entry in summary)
        print(
            "\nfastest config per measured shape (optional: _gemm.GEMM_SHAPE_CONFIGS):\nGEMM_SHAPE_CONFIGS = {\n"
            + table
            + ",\n}"
        )
    elapsed = time.perf_counter() - started
    print(f"\n{len(rows)} GEMM/Conv and {len(gemv_rows)} GEMV variants in {elapsed:.0f} s; {failures} wrong results")
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(
                {
                    "device": dataclasses.asdict(info),
                    "baseline_us": baseline * 1e6,
                    "command": sys.argv,
                    "tunables": {
                        "GEMM_TILES": [dataclasses.asdict(c) for c in _gemm.GEMM_TILES],
                        "GEMM_TARGET_WORKGROUPS": _gemm.GEMM_TARGET_WORKGROUPS,
                        "GEMM_SPLIT_MIN_K": _gemm.GEMM_SPLIT_MIN_K,
                        "GEMM_MAX_SPLIT_K": _gemm.GEMM_MAX_SPLIT_K,
                    },
                    "rows": rows,
                    "best": summary,
                    "rules": scores,
                    "gemv_rows": gemv_rows,
                    "gemv_best": gemv_summary,
                    "probes": probe_results,
                    "gemv_peak_gbs": PEAK_BANDWIDTH_GBS,
                    "seconds": elapsed,
                },
                handle,
                indent=1,
            )
    device.destroy()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
