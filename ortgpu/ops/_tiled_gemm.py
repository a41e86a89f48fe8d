"""Plans of the tiled GEMM for MatMul, Gemm and Conv: one kernel, or split-K's two, with their numpy twins.

:func:`plan_tiled_gemm` takes an operator's :class:`~ortgpu.ops._gemm_wgsl.GemmProblem` (re-exported here with
:class:`~ortgpu.ops._gemm_wgsl.GemmLoad` and :func:`~ortgpu.ops._gemm_wgsl.binding_name`: what operators need),
a configuration (default: :func:`~ortgpu.ops._gemm.choose_gemm_config`) and the epilogue, and returns the
:class:`~ortgpu.ops.OpPlan`.  :func:`split_k_plan` is shared with the GEMV (:mod:`ortgpu.ops._gemv`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from . import _gemm
from ._epilogue import EpilogueStep, apply_epilogue, epilogue_function
from ._gemm import GemmConfig, choose_gemm_config, config_fits
from ._gemm_wgsl import (
    GemmLoad,
    GemmProblem,
    Operands,
    binding_name,
    k_slices,
    legacy_gemm_wgsl,
    loader_functions,
    operand_modes,
    split_k_reduce_kernel,
    tiled_gemm_kernel,
)
from ._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, OpPlan, TensorInfo, check_loop_budget
from ._output_layout import Perm, laid_out, output_store
from ._tiling import BindingTable, check_device_fits, float_element, whole_op_twin

__all__ = [
    "GemmLoad",
    "GemmProblem",
    "binding_name",
    "plan_tiled_gemm",
    "split_k_plan",
]


def split_k_plan(
    name: str,
    partial: KernelSpec,
    slices: int,
    total: int,
    vector: bool,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    output_perm: Perm | None = None,
    scratch: int = 0,
) -> OpPlan:
    """A split-K plan (tiled GEMM and GEMV): ``partial`` writes ``slices`` partial results of ``total`` outputs
    into scratch buffer ``scratch`` (``vec4`` elements with ``vector``); a second kernel sums them, applies the
    epilogue and stores them (:func:`~ortgpu.ops._output_layout.output_store`, ``output_perm`` its permutation).
    The plan's scratch sizes list that buffer last (buffers before it are the caller's)."""
    reduce_table = BindingTable()
    element = float_element(outputs[0])
    scratch_in = reduce_table.add(Binding("scratch", scratch), "vec4<f32>" if vector else "f32")
    parts_helpers, store = output_store(reduce_table, element, outputs, out_shape, output_perm)
    epilogue = epilogue_function(steps, out_shape, reduce_table, element) + parts_helpers
    reduce_wgsl, reduce_grid = split_k_reduce_kernel(
        total, slices, reduce_table.enables() + reduce_table.declarations(), epilogue, scratch_in, store, vector, caps
    )
    reduce_twin = _reduce_twin(
        steps, reduce_table.bindings, inputs, outputs, out_shape, output_perm, slices, total, scratch
    )
    check_device_fits(name, list(inputs) + list(outputs), max(len(partial.bindings), len(reduce_table.bindings)), caps)
    scratch_bytes = slices * total * 4
    if scratch_bytes > caps.limits.max_storage_buffer_binding_size:
        raise NotOnDevice(f"{name}: split-K scratch of {scratch_bytes} bytes exceeds the storage binding limit")
    return OpPlan(
        kernels=(partial, KernelSpec(name, reduce_wgsl, reduce_grid, tuple(reduce_table.bindings), reduce_twin)),
        scratch_sizes=(0,) * scratch + (scratch_bytes,),
    )


def plan_tiled_gemm(
    name: str,
    problem: GemmProblem,
    *,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    config: GemmConfig | None = None,
    output_perm: Perm | None = None,
    before: Sequence[tuple[KernelSpec, int]] = (),
) -> OpPlan:
    """The plan of the tiled GEMM for ``problem`` with the epilogue ``steps`` (extra inputs bound by the epilogue);
    the product (``out_shape``) is stored as :func:`~ortgpu.ops._output_layout.output_store` says: split by
    columns over several ``outputs``, or transposed by ``output_perm``.

    ``config``: the kernel variant; default :func:`choose_gemm_config`.  ``compute`` is the whole node's
    function (the twin of the single-kernel variant).  Split-K needs ``problem.operands``; without it the
    config runs unsplit.  ``before``: kernels that run first, each with the byte size of the scratch buffer it
    writes (scratch 0, 1, ... in order), which the problem's loaders may read; split-K's partial sums come after.
    """
    plan = _plan_tiled_gemm(
        name, problem, steps, out_shape, compute, inputs, outputs, caps, config, output_perm, len(before)
    )
    if not before:
        return plan
    sizes = tuple(size for _, size in before)
    return OpPlan(
        kernels=tuple(kernel for kernel, _ in before) + plan.kernels,
        scratch_sizes=sizes + plan.scratch_sizes[len(sizes) :],
    )


def _plan_tiled_gemm(
    name: str,
    problem: GemmProblem,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    config: GemmConfig | None,
    output_perm: Perm | None,
    scratch_index: int,
) -> OpPlan:
    """:func:`plan_tiled_gemm` without the kernels before; split-K's partial sums in scratch ``scratch_index``."""
    if config is None:
        config = choose_gemm_config(problem.batch, problem.m, problem.n, problem.k, caps)
    config.validate()
    if not config_fits(config, caps):
        raise NotOnDevice(f"{name}: GEMM config {config.label} exceeds the device's workgroup limits")
    if config.split_k > 1 and (problem.operands is None or problem.k < 2 * config.tile_k):
        config = dataclasses.replace(config, split_k=1)
    # per invocation: a K tile loop per slice, each tile an inner loop of tile_k steps and the fetch loops (counted
    # as 4); measured on lavapipe: [8, 2M] x [2M, 8] (8192 tiles of 16 per slice) returned 932080 instead of 2097152
    tiles = (
        -(-k_slices(config, problem.k)[1] // config.tile_k) if config.split_k > 1 else -(-problem.k // config.tile_k)
    )
    check_loop_budget(name, tiles * (config.tile_k + 5), caps)
    mode_a, mode_b = operand_modes(problem)
    total_out = problem.batch * problem.m * problem.n
    element = float_element(outputs[0])  # f32 or f16 storage
    if element == "f16" and not config.legacy and _gemm.GEMM_HALF_MATH:
        config = dataclasses.replace(config, half=True)
    elif element != "f16" and config.half:  # f16 arithmetic needs f16 operands (and shader-f16)
        config = dataclasses.replace(config, half=False)
    if config.legacy:
        table = BindingTable()
        loaders = loader_functions(problem, "scalar", "scalar", table)
        parts_helpers, store = output_store(table, element, outputs, out_shape, output_perm)
        epilogue = epilogue_function(steps, out_shape, table, element)
        wgsl, grid = legacy_gemm_wgsl(
            problem.batch,
            problem.m,
            problem.n,
            problem.k,
            problem.prelude + loaders + epilogue + parts_helpers,
            table.enables() + table.declarations(),
            store,
            caps,
        )
        check_device_fits(name, list(inputs) + list(outputs), len(table.bindings), caps)
        twin = whole_op_twin(compute, table.bindings, inputs, outputs)
        return OpPlan(kernels=(KernelSpec(name, wgsl, grid, tuple(table.bindings), twin),))
    if config.split_k > 1 and k_slices(config, problem.k)[0] > 1:
        slices, per_slice = k_slices(config, problem.k)
        vector = problem.n % 4 == 0
        element = "vec4<f32>" if vector else "f32"
        table = BindingTable()
        loaders = loader_functions(problem, mode_a, mode_b, table)
        scratch = table.add(Binding("scratch", scratch_index), element, writable=True)
        if vector:
            body = f"        if (m < M && n < N) {{ {scratch}[(s * {total_out}u + b * {problem.m * problem.n}u + m * N + n) / 4u] = acc; }}\n"
        else:
            body = "".join(
                f"        if (m < M && n + {j}u < N) {{ {scratch}[s * {total_out}u + b * {problem.m * problem.n}u + m * N + n + {j}u] = acc[{j}]; }}\n"
                for j in range(4)
            )
        wgsl, grid, slices = tiled_gemm_kernel(
            problem, config, table.enables() + table.declarations(), loaders, body, caps, mode_a, mode_b
        )
        operands = problem.operands
        assert operands is not None
        partial_twin = _partial_twin(operands, table.bindings, inputs, slices, per_slice, problem, scratch_index)
        partial = KernelSpec(name, wgsl, grid, tuple(table.bindings), partial_twin)
        return split_k_plan(
            name,
            partial,
            slices,
            total_out,
            vector,
            steps,
            out_shape,
            inputs,
            outputs,
            caps,
            output_perm,
            scratch_index,
        )
    config = dataclasses.replace(config, split_k=1)
    table = BindingTable()
    loaders = loader_functions(problem, mode_a, mode_b, table)
    parts_helpers, store = output_store(table, element, outputs, out_shape, output_perm)
    epilogue = epilogue_function(steps, out_shape, table, element) + parts_helpers
    body = "".join(
        f"        if (m < M && n + {j}u < N) {{ let o = (b * M + m) * N + n + {j}u; {store('o', f'acc[{j}]')} }}\n"
        for j in range(4)
    )
    wgsl, grid, _ = tiled_gemm_kernel(
        problem, config, table.enables() + table.declarations(), loaders + epilogue, body, caps, mode_a, mode_b
    )
    check_device_fits(name, list(inputs) + list(outputs), len(table.bindings), caps)
    twin = whole_op_twin(compute, table.bindings, inputs, outputs)
    return OpPlan(kernels=(KernelSpec(name, wgsl, grid, tuple(table.bindings), twin),))


# -- twins of the split-K kernels ----------------------------------------------------------------------------------


def _bound_inputs(
    arrays: Sequence[np.ndarray], bindings: Sequence[Binding], inputs: Sequence[TensorInfo | None]
) -> list[np.ndarray | None]:
    full: list[np.ndarray | None] = [None] * len(inputs)
    for slot, binding in enumerate(bindings):
        if binding.kind == "input":
            info = inputs[binding.index]
            assert info is not None
            full[binding.index] = arrays[slot][: info.nbytes].view(info.dtype).reshape(info.shape)
    return full


def _partial_twin(
    operands: Operands,
    bindings: Sequence[Binding],
    inputs: Sequence[TensorInfo | None],
    slices: int,
    per_slice: int,
    problem: GemmProblem,
    scratch: int,
) -> Callable[[Sequence[np.ndarray], tuple[int, int, int]], None]:
    scratch_slot = bindings.index(Binding("scratch", scratch))

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        a, b = operands(_bound_inputs(arrays, bindings, inputs))
        a = np.asarray(a, dtype=np.float32).reshape(problem.batch, problem.m, problem.k)
        b = np.asarray(b, dtype=np.float32).reshape(problem.batch, problem.k, problem.n)
        partial = np.empty((slices, problem.batch, problem.m, problem.n), dtype=np.float32)
        for s in range(slices):
            ks = slice(s * per_slice, min(problem.k, (s + 1) * per_slice))
            partial[s] = np.matmul(a[:, :, ks], b[:, ks, :])
        raw = partial.reshape(-1).view(np.uint8)
        arrays[scratch_slot][: raw.size] = raw

    return twin


def _reduce_twin(
    steps: Sequence[EpilogueStep],
    bindings: Sequence[Binding],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    out_shape: tuple[int, ...],
    output_perm: Perm | None,
    slices: int,
    total: int,
    scratch: int,
) -> Callable[[Sequence[np.ndarray], tuple[int, int, int]], None]:
    scratch_slot = bindings.index(Binding("scratch", scratch))
    output_slots = {b.index: slot for slot, b in enumerate(bindings) if b.kind == "output"}
    shape = out_shape if len(outputs) > 1 or output_perm is not None else outputs[0].shape

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        partial = arrays[scratch_slot][: slices * total * 4].view(np.float32).reshape(slices, total)
        y = partial[0].copy()
        for s in range(1, slices):
            y += partial[s]
        result = apply_epilogue(y.reshape(shape), steps, _bound_inputs(arrays, bindings, inputs))
        for index, value in enumerate(laid_out(result, outputs, out_shape, output_perm)):
            raw = np.ascontiguousarray(value, dtype=outputs[index].dtype).reshape(-1).view(np.uint8)
            arrays[output_slots[index]][: raw.size] = raw

    return twin
