"""The device plans of RNN, GRU and LSTM: kernels from :mod:`ortgpu.ops.ai_onnx._recurrent_wgsl` with their numpy twins.

Scratch buffers (float32): 0 ``xp`` ``[directions, seq, batch, gates*hidden]`` (the input projection with its
biases), 1 the hidden state ``[directions, batch, hidden]``, 2 ``aux`` (LSTM's cell state, the peepholes, GRU's
candidate recurrent bias), 3 R transposed ``[directions, hidden, gates*hidden]`` (coalesced reads), and on the
per-step path 4 the other hidden-state buffer of the ping-pong and 5 (GRU without ``linear_before_reset``)
``r * h`` and ``z`` between its two phases.

Which recurrence runs: :func:`persistent_fits` (the persistent kernel where the hidden size fits one workgroup and
the driver's loop budget allows it), else one dispatch per step.  ``PERSISTENT_MAX_HIDDEN`` caps the persistent
path (tests set it to 0 to force the per-step path); ``FORCE_PERSISTENT`` makes it required (NotOnDevice where it
cannot run).

Twins: each kernel's twin does what its WGSL does with numpy on the bound buffers (the recurrence through the
operator's own float64 cell, the states stored as float32 between steps as on the device).
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError

from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    flagging_twin,
)
from .._tiling import grid_for_groups
from ._recurrent_cells import Activation
from ._recurrent_persistent_wgsl import (
    persistent_kernel,
    persistent_split_kernel,
    persistent_workgroup,
    split_shared_floats,
)
from ._recurrent_wgsl import GROUP, Config, final_kernel, prepare_kernel, project_kernel, step_kernel, transpose_kernel

__all__ = [
    "PERSISTENT_MAX_HIDDEN",
    "MAX_SPLIT",
    "SPLIT_MIN_CHUNK",
    "FORCE_PERSISTENT",
    "persistent_split",
    "persistent_fits",
    "device_plan",
]

#: The largest hidden size the persistent kernel takes (also bounded by the device's workgroup size).
PERSISTENT_MAX_HIDDEN = 1024
#: The most invocations per hidden unit of the persistent kernel (each sums a share of the recurrent product).
MAX_SPLIT = 8
#: The least share of the hidden state's ``k`` one invocation sums when a unit is split.
SPLIT_MIN_CHUNK = 16
#: Tests: require the persistent kernel (NotOnDevice where it does not fit) instead of falling back per step.
FORCE_PERSISTENT = False

Array = np.ndarray


class _Recurrence(Protocol):
    """What the plan's twins need of the operator (:class:`ortgpu.ops.ai_onnx.recurrent._Recurrent`): its numpy
    recurrence, so the twins compute as the reference does without this module importing the operator's."""

    def recur(
        self,
        x_proj: Array,
        r: Array,
        rb: Array,
        lengths: Array,
        states: list[Array],
        peepholes: Array | None,
        functions: list[list[Activation]],
        attrs: Mapping[str, Any],
        reverse: Sequence[bool],
        steps: Iterable[int],
        y: Array | None,
    ) -> list[Array]: ...


F32 = np.dtype(np.float32)
Twin = Callable[[Sequence[np.ndarray], tuple[int, int, int]], None]


def persistent_split(cfg: Config, caps: DeviceCaps) -> int:
    """Invocations per hidden unit of the persistent kernel for this node: 0 where it does not run it (the hidden
    size does not fit one workgroup or ``PERSISTENT_MAX_HIDDEN``, or the driver's loop budget would stop its
    loops), else the largest power of two up to ``MAX_SPLIT`` that fits the workgroup limits and leaves each
    invocation at least ``SPLIT_MIN_CHUNK`` of the hidden state's ``k``."""
    limits = caps.limits
    group = persistent_workgroup(cfg.hidden)
    largest = min(limits.max_compute_invocations_per_workgroup, limits.max_compute_workgroup_size_x)
    if cfg.hidden > PERSISTENT_MAX_HIDDEN:
        return 0
    phases = 2 if cfg.two_phase else 1
    split = MAX_SPLIT
    while split > 1 and not (
        split * group <= largest
        and split * SPLIT_MIN_CHUNK <= cfg.hidden
        and split_shared_floats(cfg, split) * 4 <= limits.max_compute_workgroup_storage_size
    ):
        split //= 2
    if group > largest or split_shared_floats(cfg, split) * 4 > limits.max_compute_workgroup_storage_size:
        return 0
    iterations = cfg.seq * (phases * -(-cfg.hidden // split) + 1)
    if caps.loop_budget is not None and iterations >= caps.loop_budget:
        return 0
    return split


def persistent_fits(cfg: Config, caps: DeviceCaps) -> bool:
    """Whether the persistent kernel runs this node (see :func:`persistent_split`)."""
    return persistent_split(cfg, caps) > 0


class _Slots:
    """Typed views of a kernel's bound buffers by what they are bound to."""

    def __init__(self, bindings: Sequence[Binding], arrays: Sequence[np.ndarray]) -> None:
        self._slots: dict[tuple[str, int], int] = {(b.kind, b.index): slot for slot, b in enumerate(bindings)}
        self._arrays = arrays

    def has(self, kind: str, index: int) -> bool:
        return (kind, index) in self._slots

    def view(self, kind: str, index: int, dtype: Any, shape: tuple[int, ...], offset: int = 0) -> Array:
        """A writable view of ``shape`` elements of ``dtype`` at element ``offset`` of a bound buffer."""
        raw = self._arrays[self._slots[(kind, index)]]
        itemsize = np.dtype(dtype).itemsize
        count = int(np.prod(shape))
        view: Array = raw[offset * itemsize : (offset + count) * itemsize].view(dtype).reshape(shape)
        return view


def _kernel_states(cfg: Config, value: Array) -> Array:
    """An initial state or Y_h-like tensor of the node's layout as [directions, batch, hidden]."""
    return np.swapaxes(value, 0, 1) if cfg.layout == 1 else value


def _node_states(cfg: Config, value: Array) -> Array:
    return np.swapaxes(value, 0, 1) if cfg.layout == 1 else value


def _y_rows(cfg: Config, y: Array, t: int, d: int) -> Array:
    """The view of Y's row (time ``t``, direction ``d``) as [batch, hidden]."""
    return y[:, t, d] if cfg.layout == 1 else y[t, d]


class _Parts:
    """The numpy side of the kernels of one node."""

    def __init__(
        self,
        op: _Recurrence,
        cfg: Config,
        functions: list[list[Activation]],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
    ) -> None:
        self.op, self.cfg, self.functions, self.outputs, self.attrs = op, cfg, functions, outputs, attrs
        c = cfg
        self.state_shape = (c.directions, c.batch, c.hidden)
        self.x_shape = (c.batch, c.seq, c.input_size) if c.layout == 1 else (c.seq, c.batch, c.input_size)
        self.reverse = [c.direction == "reverse" or d == 1 for d in range(c.directions)]
        #: the node's float type (the scratch buffers are float32 either way)
        self.dtype = np.dtype(np.float16 if c.element == "f16" else np.float32)

    # -- reading the scratch ----------------------------------------------------------------------------------

    def _aux(self, slots: _Slots) -> tuple[Array, Array | None, Array]:
        """(cell state view, peepholes or None, recurrent bias [D, gates*hidden]) from the aux scratch."""
        c = self.cfg
        cell = slots.view("scratch", 2, F32, self.state_shape)
        peep = (
            slots.view("scratch", 2, F32, (c.directions, 3 * c.hidden), c.aux_peepholes).astype(np.float64)
            if c.op_type == "LSTM"
            else None
        )
        rb = np.zeros((c.directions, c.gh))
        if c.linear_before_reset:
            rb[:, 2 * c.hidden :] = slots.view("scratch", 2, F32, (c.directions, c.hidden), c.aux_rbh)
        return cell, peep, rb

    def _lengths(self, slots: _Slots) -> Array:
        if self.cfg.has_lengths:
            return slots.view("input", 4, np.int32, (self.cfg.batch,)).astype(np.int64)
        return np.full(self.cfg.batch, self.cfg.seq, dtype=np.int64)

    def _xp(self, slots: _Slots) -> Array:
        c = self.cfg
        return slots.view("scratch", 0, F32, (c.directions, c.seq, c.batch, c.gh)).astype(np.float64)

    def _r(self, slots: _Slots) -> Array:
        """R ([D, gates*hidden, hidden]) from its transposed copy in scratch 3."""
        c = self.cfg
        return np.swapaxes(slots.view("scratch", 3, F32, (c.directions, c.hidden, c.gh)), 1, 2).astype(np.float64)

    def transpose(self, bindings: Sequence[Binding]) -> Twin:
        c = self.cfg

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            slots = _Slots(bindings, arrays)
            r = slots.view("input", 2, self.dtype, (c.directions, c.gh, c.hidden))
            slots.view("scratch", 3, F32, (c.directions, c.hidden, c.gh))[...] = np.swapaxes(r, 1, 2)

        return twin

    def _output(self, slots: _Slots, index: int) -> Array | None:
        if not slots.has("output", index):
            return None
        info = self.outputs[index]
        return slots.view("output", index, info.dtype, tuple(info.shape))

    def _finals(self, slots: _Slots, states: list[Array], lengths: Array) -> None:
        empty = (lengths <= 0)[None, :, None]
        for index, state in enumerate(states, start=1):
            out = self._output(slots, index)
            if out is not None:
                out[...] = _node_states(self.cfg, np.where(empty, 0.0, state))

    # -- twins ------------------------------------------------------------------------------------------------

    def prepare(self, bindings: Sequence[Binding]) -> Twin:
        c = self.cfg

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            slots = _Slots(bindings, arrays)
            hstate = slots.view("scratch", 1, F32, self.state_shape)
            aux = slots.view("scratch", 2, F32, (c.aux_floats,))
            hstate[...] = _kernel_states(c, slots.view("input", 5, self.dtype, _node_shape(c))) if c.has_h0 else 0.0
            aux[: c.dbh] = (
                _kernel_states(c, slots.view("input", 6, self.dtype, _node_shape(c))).reshape(-1) if c.has_c0 else 0.0
            )
            peep = slots.view("input", 7, self.dtype, (c.directions * 3 * c.hidden,)) if c.has_peepholes else 0.0
            aux[c.aux_peepholes : c.aux_rbh] = peep
            if c.linear_before_reset and c.has_bias:
                bias = slots.view("input", 3, self.dtype, (c.directions, 2 * c.gh))
                aux[c.aux_rbh :] = bias[:, c.gh + 2 * c.hidden :].reshape(-1)
            else:
                aux[c.aux_rbh :] = 0.0
            if c.has_lengths:
                lengths = slots.view("input", 4, np.int32, (c.batch,))
                if np.any(lengths < 0) or np.any(lengths > c.seq):
                    raise InvalidArgumentError(
                        f"{c.op_type}: sequence_lens {lengths.tolist()} must lie in [0, seq_length={c.seq}]"
                    )

        return flagging_twin(twin, bindings) if c.has_lengths else twin

    def project(self, bindings: Sequence[Binding]) -> Twin:
        c = self.cfg

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            slots = _Slots(bindings, arrays)
            x = slots.view("input", 0, self.dtype, self.x_shape).astype(np.float64)
            if c.layout == 1:
                x = np.swapaxes(x, 0, 1)
            w = slots.view("input", 1, self.dtype, (c.directions, c.gh, c.input_size)).astype(np.float64)
            bias = np.zeros((c.directions, c.gh))
            if c.has_bias:
                b = slots.view("input", 3, self.dtype, (c.directions, 2 * c.gh)).astype(np.float64)
                rb = b[:, c.gh :].copy()
                if c.linear_before_reset:
                    rb[:, 2 * c.hidden :] = 0.0
                bias = b[:, : c.gh] + rb
            xp = slots.view("scratch", 0, F32, (c.directions, c.seq, c.batch, c.gh))
            for d in range(c.directions):
                xp[d] = x @ w[d].T + bias[d]

        return twin

    def persistent(self, bindings: Sequence[Binding]) -> Twin:
        c = self.cfg

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            slots = _Slots(bindings, arrays)
            lengths = self._lengths(slots)
            initial = [slots.view("scratch", 1, F32, self.state_shape)]
            if c.op_type == "LSTM" or c.linear_before_reset:
                cell, peep, rb = self._aux(slots)
            else:
                cell, peep, rb = np.zeros(self.state_shape, F32), None, np.zeros((c.directions, c.gh))
            if c.op_type == "LSTM":
                initial.append(cell)
            y = np.zeros((c.seq, c.directions, c.batch, c.hidden))
            states = self.op.recur(
                self._xp(slots), self._r(slots), rb, lengths, initial, peep, self.functions, self.attrs,
                self.reverse, range(c.seq), y,
            )  # fmt: skip
            out = self._output(slots, 0)
            if out is not None:
                out[...] = np.transpose(y, (2, 0, 1, 3)) if c.layout == 1 else y
            self._finals(slots, [s.astype(F32) for s in states], lengths)

        return twin

    def step(self, bindings: Sequence[Binding], step: int, source: int, target: int) -> Twin:
        """Twin of step ``step`` (of its last phase: it computes the whole step from the hidden state)."""
        c = self.cfg

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            slots = _Slots(bindings, arrays)
            lengths = self._lengths(slots)
            hin = slots.view("scratch", source, F32, self.state_shape)
            needs_aux = c.op_type == "LSTM" or c.linear_before_reset
            cell, peep, rb = self._aux(slots) if needs_aux else (None, None, np.zeros((c.directions, c.gh)))
            initial = [hin] if cell is None or c.op_type != "LSTM" else [hin, cell]
            y = np.zeros((c.seq, c.directions, c.batch, c.hidden))
            states = self.op.recur(
                self._xp(slots), self._r(slots), rb, lengths, initial, peep, self.functions, self.attrs,
                self.reverse, [step], y,
            )  # fmt: skip
            slots.view("scratch", target, F32, self.state_shape)[...] = states[0]
            if c.op_type == "LSTM":
                assert cell is not None
                cell[...] = states[1]
            out = self._output(slots, 0)
            if out is not None:
                for d in range(c.directions):
                    t = c.seq - 1 - step if self.reverse[d] else step
                    _y_rows(c, out, t, d)[...] = y[t, d]

        return twin

    def final(self, bindings: Sequence[Binding]) -> Twin:
        c = self.cfg
        last = 1 if c.seq % 2 == 0 else 4

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            slots = _Slots(bindings, arrays)
            lengths = self._lengths(slots)
            h = slots.view("scratch", last, F32, self.state_shape) if c.outputs[1] else np.zeros(self.state_shape)
            states = [h]
            if c.outputs[2]:
                states.append(slots.view("scratch", 2, F32, self.state_shape))
            self._finals(slots, states, lengths)

        return twin


def _node_shape(cfg: Config) -> tuple[int, int, int]:
    if cfg.layout == 1:
        return (cfg.batch, cfg.directions, cfg.hidden)
    return (cfg.directions, cfg.batch, cfg.hidden)


def _no_op(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
    """Twin of GRU's first phase: the second phase's twin computes the whole step."""


def _storage_count(bindings: Sequence[Binding]) -> int:
    return sum(1 for b in bindings if b.kind != "params")


def device_plan(
    op: _Recurrence,
    cfg: Config,
    functions: list[list[Activation]],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    attrs: Mapping[str, Any],
    caps: DeviceCaps,
) -> OpPlan:
    """The kernels of one recurrent node (see the module docstring)."""
    name = cfg.op_type
    limits = caps.limits
    xp_bytes = cfg.xp_floats * 4
    for info in list(inputs) + list(outputs):
        if info is not None and info.nbytes > limits.max_storage_buffer_binding_size:
            raise NotOnDevice(f"{name}: a tensor of {info.nbytes} bytes exceeds the device's storage binding limit")
    if xp_bytes > limits.max_storage_buffer_binding_size:
        raise NotOnDevice(f"{name}: its input projection ({xp_bytes} bytes) exceeds the storage binding limit")
    check_loop_budget(name, cfg.input_size, caps)
    parts = _Parts(op, cfg, functions, outputs, attrs)
    state_grid = grid_for_groups(-(-cfg.dbh // GROUP), caps)
    kernels: list[KernelSpec] = []

    def add(
        wgsl: str, bindings: tuple[Binding, ...], grid: tuple[int, int, int], twin: Twin, params: bytes = b""
    ) -> None:
        if _storage_count(bindings) > limits.max_storage_buffers_per_shader_stage:
            raise NotOnDevice(f"{name}: a kernel needs {_storage_count(bindings)} storage buffers; the device allows "
                              f"{limits.max_storage_buffers_per_shader_stage}")  # fmt: skip
        kernels.append(KernelSpec(name, wgsl, grid, bindings, twin, params))

    wgsl, bindings = prepare_kernel(cfg, state_grid)
    add(wgsl, bindings, state_grid, parts.prepare(bindings))
    if not any(cfg.outputs):
        # Nothing to compute; the lengths are still checked.
        return OpPlan(kernels=tuple(kernels), scratch_sizes=(4, cfg.dbh * 4, cfg.aux_floats * 4))
    project_grid = grid_for_groups(-(-cfg.xp_floats // GROUP), caps)
    wgsl, bindings = project_kernel(cfg, project_grid)
    add(wgsl, bindings, project_grid, parts.project(bindings))
    rt_floats = cfg.directions * cfg.gh * cfg.hidden
    rt_grid = grid_for_groups(-(-rt_floats // GROUP), caps)
    wgsl, bindings = transpose_kernel(cfg, rt_grid)
    add(wgsl, bindings, rt_grid, parts.transpose(bindings))
    scratch = [xp_bytes, cfg.dbh * 4, cfg.aux_floats * 4, rt_floats * 4]
    split = persistent_split(cfg, caps)
    if FORCE_PERSISTENT and not split:
        raise NotOnDevice(f"{name}: the persistent kernel does not fit (FORCE_PERSISTENT)")
    if split:
        grid = grid_for_groups(cfg.directions * cfg.batch, caps)
        if split > 1:
            wgsl, bindings = persistent_split_kernel(cfg, functions, grid, split)
        else:
            wgsl, bindings = persistent_kernel(cfg, functions, grid)
        add(wgsl, bindings, grid, parts.persistent(bindings))
        return OpPlan(kernels=tuple(kernels), scratch_sizes=tuple(scratch))
    check_loop_budget(name, cfg.hidden, caps)
    scratch.append(cfg.dbh * 4)
    if cfg.two_phase:
        scratch.append(2 * cfg.dbh * 4)
    for step in range(cfg.seq):
        params = struct.pack("<4I", step, 0, 0, 0)
        source, target = (1, 4) if step % 2 == 0 else (4, 1)
        if cfg.two_phase:
            wgsl, bindings = step_kernel(cfg, functions, state_grid, step, 1)
            add(wgsl, bindings, state_grid, _no_op, params)
            wgsl, bindings = step_kernel(cfg, functions, state_grid, step, 2)
        else:
            wgsl, bindings = step_kernel(cfg, functions, state_grid, step, 0)
        add(wgsl, bindings, state_grid, parts.step(bindings, step, source, target), params)
    if cfg.outputs[1] or cfg.outputs[2]:
        wgsl, bindings = final_kernel(cfg, state_grid)
        add(wgsl, bindings, state_grid, parts.final(bindings))
    return OpPlan(kernels=tuple(kernels), scratch_sizes=tuple(scratch))
