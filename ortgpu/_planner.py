"""Planning a loaded model for concrete input shapes.

:func:`plan_model` turns a :class:`~ortgpu._model.LoadedModel` and one input
shape signature into an :class:`ExecutionPlan`: every tensor's shape (folding
what the shapes make constant), a check of every tensor against the device's
limits before anything is allocated, fused epilogues, one
:class:`~ortgpu.ops.OpPlan` per step (or CPU placement), aliases, and a
liveness-based assignment of intermediates to reusable buffer slots.

The plan is device-independent apart from the :class:`DeviceCaps` it was made
for; :class:`~ortgpu._executor.DeviceProgram` instantiates it on a device.
Callers cache plans per input-shape signature.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Hashable, Literal, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import DtypeError, ModelError, ShapeError, UnsupportedOpError

import dataclasses

from ._limits import FoldBudget
from ._model import GraphNode, LoadedModel
from ._propagate import Shape, is_concrete, propagate, public_attrs
from .ops import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, get_operator
from .ops._runner import padded_size
from .ops.transpose import permutation

__all__ = [
    "Placement",
    "PlannedStep",
    "PlannedTensor",
    "ExecutionPlan",
    "plan_model",
    "FUSABLE_PRODUCERS",
]

Placement = Literal["webgpu", "cpu"]
Storage = Literal["input", "output", "constant", "intermediate", "alias"]

#: Operators that accept a fused elementwise epilogue (``attrs["_epilogue"]``).
FUSABLE_PRODUCERS = frozenset({"MatMul", "Gemm", "Conv"})
#: Inputs of each fusable op before its epilogue's extra inputs (absent optional ones padded with "").
_ARITY = {"MatMul": 2, "Gemm": 3, "Conv": 3}
_EPILOGUE_UNARY = {"Relu": ("relu",), "Gelu": ("gelu",), "Sigmoid": ("sigmoid",)}


@dataclass(frozen=True)
class PlannedTensor:
    """Where a tensor lives while a plan runs.

    ``storage``: ``input``/``output`` (the caller's buffer of that name),
    ``constant`` (an uploaded weight), ``intermediate`` (buffer slot ``slot``),
    ``alias`` (the buffer of tensor ``alias_of``, unchanged: Reshape and the like).
    """

    name: str
    info: TensorInfo
    storage: Storage
    slot: int = -1
    alias_of: str = ""


@dataclass(frozen=True)
class PlannedStep:
    """One node, or a fused group whose first node is the producer."""

    node_names: tuple[str, ...]
    op_types: tuple[str, ...]
    placement: Placement
    reason: str
    operator: Operator
    attrs: Mapping[str, Any]
    inputs: tuple[str, ...]  # "" for an absent optional input
    outputs: tuple[str, ...]
    input_infos: tuple[TensorInfo | None, ...]
    output_infos: tuple[TensorInfo, ...]
    op_plan: OpPlan | None  # None on the CPU
    scratch_slots: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.node_names[0]

    @property
    def op_type(self) -> str:
        return "+".join(self.op_types)


@dataclass
class ExecutionPlan:
    """Everything needed to run a model for one input-shape signature.

    ``constants`` holds every constant a step reads (CPU steps read them on the
    host); ``constant_keys`` those to upload, with their :class:`WeightStore` keys.
    ``output_copies`` lists ``(step index, graph output, source tensor)``: after
    that step (index -1: before the first) the source's bytes are copied into
    the output's buffer, because the output is an alias, an input, a constant
    or another output's tensor.
    """

    caps: DeviceCaps
    input_infos: dict[str, TensorInfo]
    output_infos: dict[str, TensorInfo]
    steps: list[PlannedStep]
    tensors: dict[str, PlannedTensor]
    slot_sizes: list[int]
    constants: dict[str, np.ndarray]
    constant_keys: dict[str, Hashable]
    output_copies: list[tuple[int, str, str]]
    placement: list[tuple[str, str, str, str]]
    folded_nodes: list[str] = field(default_factory=list)

    @property
    def cpu_nodes(self) -> list[str]:
        return [name for step in self.steps if step.placement == "cpu" for name in step.node_names]

    @property
    def capturable(self) -> bool:
        return not any(step.placement == "cpu" for step in self.steps)

    def root(self, name: str) -> str:
        """The tensor whose buffer ``name`` lives in (following aliases)."""
        tensor = self.tensors[name]
        while tensor.storage == "alias":
            tensor = self.tensors[tensor.alias_of]
        return tensor.name

    def describe(self) -> str:
        lines = [f"{len(self.steps)} steps, {len(self.slot_sizes)} buffer slots ({sum(self.slot_sizes)} bytes)"]
        for name, op_type, where, reason in self.placement:
            lines.append(f"  {name:30s} {op_type:24s} {where:7s} {reason}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------


def _tensor_info(name: str, types: Mapping[str, tuple[Shape, np.dtype[Any]]], node: GraphNode | None) -> TensorInfo:
    if name not in types:
        where = f" ({node.describe()})" if node is not None else ""
        raise ModelError(f"cannot infer the type of tensor {name!r}{where}")
    shape, dtype = types[name]
    if not is_concrete(shape):
        where = f" produced by {node.describe()}" if node is not None else ""
        raise ModelError(f"cannot infer a concrete shape for tensor {name!r}{where}: got {shape}")
    if any(d < 0 for d in shape if isinstance(d, int)):
        where = f" produced by {node.describe()}" if node is not None else ""
        raise ShapeError(f"tensor {name!r}{where} has a negative dimension in its shape {shape}; the model is invalid")
    return TensorInfo(tuple(int(d) for d in shape if isinstance(d, int)), dtype)


def _check_size(name: str, info: TensorInfo, caps: DeviceCaps, what: str) -> None:
    limits = caps.limits
    for limit_name, limit in (
        ("max_buffer_size", limits.max_buffer_size),
        ("max_storage_buffer_binding_size", limits.max_storage_buffer_binding_size),
    ):
        if padded_size(info.nbytes) > limit:
            raise ShapeError(
                f"tensor {name!r} ({what}) has shape {info.shape} and dtype {info.dtype.name}: "
                f"{info.nbytes} bytes exceed the device's {limit_name} ({limit}); "
                "use smaller input shapes (batch, sequence length, image size) or a device with larger limits"
            )


def _input_infos(
    model: LoadedModel, input_shapes: Mapping[str, Sequence[int]], input_dtypes: Mapping[str, Any] | None
) -> dict[str, TensorInfo]:
    infos = {}
    for value in model.inputs:
        if value.name not in input_shapes:
            raise ModelError(f"no shape given for model input {value.name!r} (expected shape {value.shape})")
        shape = tuple(int(d) for d in input_shapes[value.name])
        if any(d < 0 for d in shape):
            raise ShapeError(f"input {value.name!r}: negative dimension in shape {shape}")
        if value.shape and len(value.shape) != len(shape):
            raise ShapeError(f"input {value.name!r} has rank {len(value.shape)} {value.shape}; got shape {shape}")
        for declared, given in zip(value.shape, shape):
            if isinstance(declared, int) and declared != given:
                raise ShapeError(f"input {value.name!r} expects shape {value.shape}; got {shape}")
        dtype = value.dtype
        if input_dtypes is not None and value.name in input_dtypes:
            given_dtype = np.dtype(input_dtypes[value.name])
            if given_dtype != dtype:
                raise DtypeError(f"input {value.name!r} expects dtype {dtype.name}; got {given_dtype.name}")
        infos[value.name] = TensorInfo(shape, dtype)
    unknown = set(input_shapes) - {v.name for v in model.inputs}
    if unknown:
        raise ModelError(f"unknown model input(s) {sorted(unknown)}; the model's inputs are {model.input_names}")
    return infos


def _constant_key(name: str, value: np.ndarray, model: LoadedModel) -> Hashable:
    if name in model.initializers and model.initializers[name] is value:
        return ("initializer", name)
    digest = hashlib.blake2b(np.asarray(value, order="C").tobytes(), digest_size=16).hexdigest()
    return ("folded", name, value.dtype.str, value.shape, digest)


# ---------------------------------------------------------------------------
# fusion


def _epilogue_step(
    node: GraphNode,
    produced: str,
    types: Mapping[str, tuple[Shape, np.dtype[Any]]],
    constants: Mapping[str, np.ndarray],
    output_shape: tuple[int, ...],
    extra_index: int,
) -> tuple[tuple[Any, ...], str | None] | None:
    """The epilogue step for ``node`` applied to ``produced``, and the extra input it needs, or None."""
    if node.domain != "":
        return None
    if node.op_type in _EPILOGUE_UNARY:
        if node.op_type == "Gelu" and str(node.attrs.get("approximate", "none")) != "none":
            return None
        return _EPILOGUE_UNARY[node.op_type], None
    if node.op_type == "Clip":
        if node.opset < 11:
            lo = float(node.attrs.get("min", -np.inf))
            hi = float(node.attrs.get("max", np.inf))
        else:
            bounds: list[float] = []
            for position, default in ((1, -np.inf), (2, np.inf)):
                name = node.inputs[position] if len(node.inputs) > position else ""
                if not name:
                    bounds.append(default)
                elif name in constants and constants[name].size == 1:
                    bounds.append(float(constants[name].reshape(())))
                else:
                    return None
            lo, hi = bounds
        return ("clip", lo, hi), None
    if node.op_type in ("Mul", "Div") and len(node.inputs) == 2 and node.inputs[0] != node.inputs[1]:
        # x * c, c * x or x / c with a scalar float constant c: ("scale", c) (x / c as x * (1 / c)).
        other = node.inputs[1] if node.inputs[0] == produced else node.inputs[0]
        if node.op_type == "Div" and node.inputs[0] != produced:
            return None
        factor = _scalar_constant(other, constants)
        out_shape = types.get(node.outputs[0], ((), None))[0]
        if factor is None or tuple(out_shape) != output_shape:
            return None
        if node.op_type == "Div":
            if factor == 0.0:
                return None
            factor = float(np.float32(1.0) / np.float32(factor))
        if not np.isfinite(factor):
            return None
        return ("scale", factor), None
    if node.op_type == "Add" and len(node.inputs) == 2:
        other = node.inputs[1] if node.inputs[0] == produced else node.inputs[0]
        if node.inputs[0] == node.inputs[1]:
            return None
        out_shape = types.get(node.outputs[0], ((), None))[0]
        if tuple(out_shape) != output_shape:
            return None  # the add broadcasts the product: not an epilogue
        return ("add", extra_index), other
    return None


def _scalar_constant(name: str, constants: Mapping[str, np.ndarray]) -> float | None:
    """The value of a one-element float32 constant, else None."""
    value = constants.get(name)
    if value is None or value.size != 1 or value.dtype != np.float32:
        return None
    number = float(value.reshape(()))
    return number if np.isfinite(number) else None


def _is_constant(name: str, constants: Mapping[str, np.ndarray], expected: float) -> bool:
    value = _scalar_constant(name, constants)
    return value is not None and abs(value - expected) <= 1e-6 * abs(expected)


_SQRT2 = float(np.sqrt(2.0))


# ---------------------------------------------------------------------------


class _Planner:
    def __init__(self, model: LoadedModel, caps: DeviceCaps, allow_cpu: bool, fuse: bool) -> None:
        self.model = model
        self.caps = caps
        self.allow_cpu = allow_cpu
        self.fuse = fuse

    def run(self, input_infos: dict[str, TensorInfo], input_values: Mapping[str, np.ndarray]) -> ExecutionPlan:
        model = self.model
        types: dict[str, tuple[Shape, np.dtype[Any]]] = {}
        for name, (shape, dtype) in model.types.items():
            if name in model.constants:
                types[name] = (shape, dtype)
        for name, info in input_infos.items():
            types[name] = (info.shape, info.dtype)
        constants = dict(model.constants)
        for name, info in input_infos.items():  # before folding: nothing is computed for inputs that cannot fit
            _check_size(name, info, self.caps, "model input")
        for name in model.value_dependent_inputs:
            if name not in input_values:
                raise ModelError(
                    f"the shapes of this model depend on the value of input {name!r} (it feeds a shape, axes or "
                    "bounds input); pass its value to plan for it"
                )
            value = np.asarray(np.asarray(input_values[name], dtype=input_infos[name].dtype), order="C")
            if value.shape != input_infos[name].shape:
                raise ShapeError(f"the value of input {name!r} has shape {value.shape}, not {input_infos[name].shape}")
            constants[name] = value
        # Folding shares the model's budget with the load (what the load folded is still held).
        budget = FoldBudget(model.limits.max_fold_bytes, spent=model.folded_bytes)
        nodes, folded = propagate(model.nodes, types, constants, model.opsets, concrete=True, budget=budget)
        self.types = types
        self.constants = constants
        producer_of = {out: node for node in nodes for out in node.outputs if out}
        consumers: dict[str, list[GraphNode]] = {}
        for node in nodes:
            for name in node.inputs:
                if name:
                    consumers.setdefault(name, []).append(node)
        output_names = model.output_names
        for name in output_names:
            if name not in types and name not in input_infos:
                raise ModelError(f"graph output {name!r} is produced by no node")

        # Every tensor's info, checked against the device limits before anything is allocated.
        infos: dict[str, TensorInfo] = dict(input_infos)
        for node in nodes:
            for index, name in enumerate(node.outputs):
                if name:
                    info = _tensor_info(name, types, node)
                    _check_size(name, info, self.caps, f"output {index} of {node.describe()}")
                    infos[name] = info
        for name in output_names:
            if name in constants:
                infos[name] = TensorInfo(tuple(constants[name].shape), constants[name].dtype)
                _check_size(name, infos[name], self.caps, "constant graph output")
        for node in nodes:
            for name in node.inputs:
                if name and name in constants and name not in infos:
                    info = TensorInfo(tuple(constants[name].shape), constants[name].dtype)
                    _check_size(name, info, self.caps, f"constant input of {node.describe()}")
                    infos[name] = info
        self.infos = infos

        steps = self._steps(nodes, producer_of, consumers, set(output_names))
        return self._memory_plan(steps, input_infos, output_names, folded)

    # -- steps ----------------------------------------------------------------

    def _steps(
        self,
        nodes: list[GraphNode],
        producer_of: Mapping[str, GraphNode],
        consumers: Mapping[str, list[GraphNode]],
        graph_outputs: set[str],
    ) -> list[PlannedStep]:
        steps: list[PlannedStep] = []
        absorbed: set[str] = set()
        cpu_problems: list[str] = []
        # A fused step runs where its last node was: an epilogue's extra input (a residual) may be
        # produced after the producer node, never after the last node of the group.
        delayed: dict[str, PlannedStep] = {}
        # Transposes read only by a MatMul are folded into it (its loads follow the permuted strides); each one is
        # planned after all, at the MatMul, if the MatMul cannot take it.
        folds = self._foldable_transposes(nodes, consumers, graph_outputs) if self.fuse else {}
        folded = {t.name for pending in folds.values() for t, _ in pending.values()}
        for node in nodes:
            if node.name in absorbed:
                if node.name in delayed:
                    steps.append(delayed.pop(node.name))
                continue
            if node.name in folded:
                continue  # planned with (or, failing that, just before) the MatMul that reads it
            operator = get_operator(node.op_type, node.opset, node.domain)
            attrs = public_attrs(node.attrs)
            step = None
            if node.name in folds:
                transposes = folds[node.name]
                step = self._fold_transposes(node, transposes, operator, attrs, consumers, graph_outputs, absorbed)
                if step is None:  # the MatMul could not take them: the transposes run as their own steps
                    for transpose, _ in transposes.values():
                        own = self._plan_node(transpose, get_operator(transpose.op_type, transpose.opset, ""),
                                              public_attrs(transpose.attrs))
                        if own.placement == "cpu":
                            cpu_problems.append(f"{transpose.describe()}: {own.reason}")
                        steps.append(own)
                elif len(step.node_names) > 1 + len(transposes):  # (MatMul, *transposes, *epilogue nodes)
                    absorbed.update(step.node_names[1:])
                    delayed[step.node_names[-1]] = step
                    continue
                else:
                    steps.append(step)
                    continue
            if self.fuse and node.op_type in FUSABLE_PRODUCERS and node.domain == "":
                step = self._try_fuse(node, operator, attrs, consumers, graph_outputs, absorbed)
                if step is not None:
                    absorbed.update(step.node_names[1:])
                    delayed[step.node_names[-1]] = step
                    continue
            if step is None:
                step = self._plan_node(node, operator, attrs)
            if step.placement == "cpu":
                cpu_problems.append(f"{node.describe()}: {step.reason}")
            steps.append(step)
        if cpu_problems and not self.allow_cpu:
            raise UnsupportedOpError(
                "these nodes cannot run on the WebGPU device (allow_cpu=False): " + "; ".join(cpu_problems)
            )
        return steps

    def _foldable_transposes(
        self, nodes: list[GraphNode], consumers: Mapping[str, list[GraphNode]], graph_outputs: set[str]
    ) -> dict[str, dict[int, tuple[GraphNode, tuple[int, ...]]]]:
        """MatMul node name -> {input index: (the Transpose feeding it, its perm)} for every Transpose whose output
        only that MatMul reads, once, as a float32 operand of rank >= 2 (not a graph output, not a constant)."""
        folds: dict[str, dict[int, tuple[GraphNode, tuple[int, ...]]]] = {}
        for node in nodes:
            if node.op_type != "Transpose" or node.domain != "" or not node.outputs or not node.inputs:
                continue
            out, source = node.outputs[0], node.inputs[0]
            users = consumers.get(out, [])
            if out in graph_outputs or len(users) != 1 or source in self.constants:
                continue
            user = users[0]
            if user.op_type != "MatMul" or user.domain != "" or list(user.inputs[:2]).count(out) != 1:
                continue
            info = self.infos.get(source)
            if info is None or info.dtype != np.float32 or len(info.shape) < 2:
                continue
            try:
                perm = tuple(permutation(node.attrs, len(info.shape)))
            except UnsupportedOpError:
                continue  # planned as its own step, which reports the bad perm
            if perm == tuple(range(len(perm))):
                continue
            folds.setdefault(user.name, {})[list(user.inputs[:2]).index(out)] = (node, perm)
        return folds

    def _fold_transposes(
        self,
        node: GraphNode,
        transposes: Mapping[int, tuple[GraphNode, tuple[int, ...]]],
        operator: Operator,
        attrs: Mapping[str, Any],
        consumers: Mapping[str, list[GraphNode]],
        graph_outputs: set[str],
        absorbed: set[str],
    ) -> PlannedStep | None:
        """MatMul ``node`` reading the sources of ``transposes`` through ``_input_perms`` (with its epilogue, if
        any); None if it cannot run so on the device."""
        inputs = list(node.inputs)
        perms: list[tuple[int, ...] | None] = [None, None]
        for index, (transpose, perm) in transposes.items():
            perms[index] = perm
            inputs[index] = transpose.inputs[0]
        folded_node = dataclasses.replace(node, inputs=tuple(inputs))
        folded_attrs = dict(attrs)
        folded_attrs["_input_perms"] = tuple(perms)
        step = self._try_fuse(folded_node, operator, folded_attrs, consumers, graph_outputs, absorbed)
        if step is None:
            step = self._plan_node(folded_node, operator, folded_attrs)
            if step.placement != "webgpu":
                return None
        names = tuple(t.name for t, _ in transposes.values())
        return dataclasses.replace(
            step,
            node_names=step.node_names[:1] + names + step.node_names[1:],
            op_types=step.op_types[:1] + ("Transpose",) * len(names) + step.op_types[1:],
            reason=f"{step.reason}, folded input transpose{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}",
        )

    def _infos_of(self, names: Sequence[str]) -> tuple[TensorInfo | None, ...]:
        return tuple(self.infos[name] if name else None for name in names)

    def _constants_of(self, names: Sequence[str]) -> dict[int, np.ndarray]:
        return {i: self.constants[name] for i, name in enumerate(names) if name and name in self.constants}

    def _plan_node(self, node: GraphNode, operator: Operator, attrs: Mapping[str, Any]) -> PlannedStep:
        input_infos = self._infos_of(node.inputs)
        output_infos = tuple(self.infos[name] if name else TensorInfo((0,), np.dtype(np.float32)) for name in node.outputs)
        try:
            op_plan: OpPlan | None = operator.plan(input_infos, output_infos, attrs, self.caps, self._constants_of(node.inputs))
            placement: Placement = "webgpu"
            reason = "WGSL kernel" if op_plan is not None and op_plan.kernels else "no kernel needed (alias or empty)"
        except NotOnDevice as why:
            op_plan = None
            placement = "cpu"
            reason = str(why) or "no WebGPU kernel"
        return PlannedStep(
            (node.name,), (node.op_type,), placement, reason, operator, attrs,
            tuple(node.inputs), tuple(node.outputs), input_infos, output_infos, op_plan,
        )

    def _try_fuse(
        self,
        node: GraphNode,
        operator: Operator,
        attrs: Mapping[str, Any],
        consumers: Mapping[str, list[GraphNode]],
        graph_outputs: set[str],
        absorbed: set[str],
    ) -> PlannedStep | None:
        current = node.outputs[0]
        output_info = self.infos[current]
        if output_info.dtype != np.float32:
            return None
        inputs = list(node.inputs) + [""] * max(0, _ARITY.get(node.op_type, 0) - len(node.inputs))
        epilogue: list[tuple[Any, ...]] = []
        group = [node]
        while True:
            users = consumers.get(current, [])
            if current in graph_outputs:
                break
            if len(users) == 2 and not any(user.name in absorbed for user in users):
                gelu = self._match_gelu(current, users, consumers, graph_outputs, output_info)
                if gelu is None:
                    break
                epilogue.append(("gelu",))
                group.extend(gelu)
                current = gelu[-1].outputs[0]
                continue
            if len(users) != 1:
                break
            user = users[0]
            if user.name in absorbed:
                break  # already the epilogue of another producer (the other side of a residual Add)
            if sum(1 for name in user.inputs if name == current) != 1:
                break
            found = _epilogue_step(user, current, self.types, self.constants, output_info.shape, len(inputs))
            if found is None:
                break
            step_spec, extra = found
            if extra is not None:
                info = self.infos.get(extra)
                if info is None or info.dtype != output_info.dtype:
                    break
                inputs.append(extra)
            if self.infos[user.outputs[0]].dtype != output_info.dtype:
                break
            epilogue.append(step_spec)
            group.append(user)
            current = user.outputs[0]
        if not epilogue:
            return None
        fused_attrs = dict(attrs)
        fused_attrs["_epilogue"] = tuple(epilogue)
        input_infos = self._infos_of(inputs)
        output_infos = (self.infos[current],) + tuple(self.infos[name] for name in node.outputs[1:] if name)
        try:
            op_plan = operator.plan(input_infos, output_infos, fused_attrs, self.caps, self._constants_of(inputs))
        except NotOnDevice:
            return None
        except (UnsupportedOpError, KeyError, TypeError, ValueError, AssertionError):
            return None  # the operator does not take this epilogue: run the nodes one by one
        return PlannedStep(
            tuple(n.name for n in group), tuple(n.op_type for n in group), "webgpu",
            "WGSL kernel, fused epilogue " + "+".join(str(s[0]) for s in epilogue), operator, fused_attrs,
            tuple(inputs), (current,) + tuple(node.outputs[1:]), input_infos, output_infos, op_plan,
        )

    def _match_gelu(
        self,
        x: str,
        users: Sequence[GraphNode],
        consumers: Mapping[str, list[GraphNode]],
        graph_outputs: set[str],
        output_info: TensorInfo,
    ) -> list[GraphNode] | None:
        """The nodes of the exported erf GELU of ``x`` (its two consumers start it), the final Mul last; else None.

        Recognised: ``u = Div(x, sqrt 2)`` or ``Mul(x, 1 / sqrt 2)``; ``e = Erf(u)``; ``a = Add(e, 1)``; then
        ``0.5 * x * a`` as ``Mul(Mul(x, a), 0.5)``, ``Mul(Mul(x, 0.5), a)`` or ``Mul(Mul(a, 0.5), x)`` (operands
        of each Mul in either order).  Every intermediate has this one consumer and is no graph output, and
        every tensor keeps the shape and dtype of ``x``.
        """
        constants = self.constants

        def only_user(name: str) -> GraphNode | None:
            found = consumers.get(name, [])
            if name in graph_outputs or len(found) != 1 or found[0].domain != "":
                return None
            node = found[0]
            info = self.infos.get(node.outputs[0]) if node.outputs else None
            if info is None or info.shape != output_info.shape or info.dtype != output_info.dtype:
                return None
            return node

        def other_input(node: GraphNode, name: str) -> str | None:
            if len(node.inputs) != 2 or node.inputs[0] == node.inputs[1] or name not in node.inputs:
                return None
            return node.inputs[1] if node.inputs[0] == name else node.inputs[0]

        def is_scale(node: GraphNode) -> bool:  # x / sqrt2 or x * (1 / sqrt2)
            if node.op_type == "Div" and len(node.inputs) == 2 and node.inputs[0] == x:
                return _is_constant(node.inputs[1], constants, _SQRT2)
            if node.op_type == "Mul":
                other = other_input(node, x)
                return other is not None and _is_constant(other, constants, 1.0 / _SQRT2)
            return False

        scale = [u for u in users if is_scale(u)]
        if len(scale) != 1:
            return None
        rest = [u for u in users if u is not scale[0]][0]
        if not all(len(u.outputs) == 1 and u.domain == "" and self.infos.get(u.outputs[0]) is not None for u in users):
            return None
        erf = only_user(scale[0].outputs[0])
        if erf is None or erf.op_type != "Erf":
            return None
        add = only_user(erf.outputs[0])
        if add is None or add.op_type != "Add":
            return None
        one = other_input(add, erf.outputs[0])
        if one is None or not _is_constant(one, constants, 1.0):
            return None
        a = add.outputs[0]
        head = [scale[0], erf, add]
        if rest.op_type != "Mul" or self.infos[rest.outputs[0]].shape != output_info.shape:
            return None
        # rest consumes x: Mul(x, a) -> Mul(., 0.5); Mul(x, 0.5) -> Mul(., a); or Mul(a, 0.5) -> Mul(., x).
        partner = other_input(rest, x)
        if partner is None:
            return None
        mul_a = only_user(a)
        if partner == a:
            if mul_a is not rest:
                return None
            last = only_user(rest.outputs[0])
            half = None if last is None or last.op_type != "Mul" else other_input(last, rest.outputs[0])
            if last is None or half is None or not _is_constant(half, constants, 0.5):
                return None
            return head + [rest, last]
        if _is_constant(partner, constants, 0.5):
            last = only_user(rest.outputs[0])
            if last is None or last.op_type != "Mul" or mul_a is not last or other_input(last, rest.outputs[0]) != a:
                return None
            return head + [rest, last]
        if mul_a is not None and mul_a.op_type == "Mul" and mul_a.outputs[0] == partner:
            half = other_input(mul_a, a)
            if half is not None and _is_constant(half, constants, 0.5) and only_user(partner) is rest:
                return head + [mul_a, rest]
        return None

    # -- memory ---------------------------------------------------------------

    def _memory_plan(
        self,
        steps: list[PlannedStep],
        input_infos: dict[str, TensorInfo],
        output_names: list[str],
        folded: list[str],
    ) -> ExecutionPlan:
        tensors: dict[str, PlannedTensor] = {}
        constants = self.constants
        for name, info in input_infos.items():
            tensors[name] = PlannedTensor(name, info, "input")
        output_set = set(output_names)
        produced_direct: set[str] = set()
        for step in steps:
            alias = step.op_plan.alias if step.op_plan is not None else {}
            for index, name in enumerate(step.outputs):
                if not name:
                    continue
                info = step.output_infos[index]
                if index in alias:
                    tensors[name] = PlannedTensor(name, info, "alias", alias_of=step.inputs[alias[index]])
                elif name in output_set:
                    tensors[name] = PlannedTensor(name, info, "output")
                    produced_direct.add(name)
                else:
                    tensors[name] = PlannedTensor(name, info, "intermediate")
            for name in step.inputs:
                if name and name not in tensors:
                    if name not in constants:
                        raise ModelError(f"tensor {name!r} read by node {step.name!r} is produced by no earlier node")
                    tensors[name] = PlannedTensor(name, self.infos[name], "constant")
        for name in output_names:
            if name not in tensors and name in constants:
                tensors[name] = PlannedTensor(name, TensorInfo(tuple(constants[name].shape), constants[name].dtype), "constant")

        def root(name: str) -> str:
            while tensors[name].storage == "alias":
                name = tensors[name].alias_of
            return name

        # Output copies: outputs that are not written directly by their producer.
        producing_step: dict[str, int] = {}
        for index, step in enumerate(steps):
            for name in step.outputs:
                if name:
                    producing_step[name] = index
        output_copies: list[tuple[int, str, str]] = []
        for name in output_names:
            if name in produced_direct:
                continue
            output_copies.append((producing_step.get(name, -1), name, root(name)))

        # Liveness of buffer roots: last step that reads them (a copy counts as a read).
        last_use: dict[str, int] = {}
        for index, step in enumerate(steps):
            for name in step.inputs:
                if name:
                    last_use[root(name)] = index
            for name in step.outputs:
                if name:
                    last_use.setdefault(root(name), index)
                    last_use[root(name)] = max(last_use[root(name)], index)
        for index, _, source in output_copies:
            last_use[source] = max(last_use.get(source, index), index)

        slot_sizes: list[int] = []
        free_slots: list[int] = []
        slot_of: dict[str, int] = {}
        dying_at: dict[int, list[str]] = {}
        planned_steps: list[PlannedStep] = []
        for index, step in enumerate(steps):
            for name in step.outputs:
                if name and tensors[name].storage == "intermediate":
                    slot = _take_slot(padded_size(tensors[name].info.nbytes), slot_sizes, free_slots)
                    slot_of[name] = slot
                    dying_at.setdefault(last_use.get(name, index), []).append(name)
            scratch: tuple[int, ...] = ()
            if step.op_plan is not None and step.op_plan.scratch_sizes:
                for size in step.op_plan.scratch_sizes:
                    if padded_size(size) > self.caps.limits.max_storage_buffer_binding_size:
                        raise ShapeError(
                            f"node {step.name!r} ({step.op_type}) needs a {size}-byte scratch buffer, over the "
                            f"device's max_storage_buffer_binding_size; use smaller input shapes"
                        )
                scratch = tuple(_take_slot(padded_size(s), slot_sizes, free_slots) for s in step.op_plan.scratch_sizes)
            planned_steps.append(_with_scratch(step, scratch))
            free_slots.extend(scratch)
            for name in dying_at.pop(index, []):
                free_slots.append(slot_of[name])
        for name, slot in slot_of.items():
            tensors[name] = PlannedTensor(name, tensors[name].info, "intermediate", slot=slot)

        used_constants: dict[str, np.ndarray] = {}
        uploaded: set[str] = set()
        for step in planned_steps:
            bound = _bound_inputs(step)
            for position, name in enumerate(step.inputs):
                if name and tensors[root(name)].storage == "constant":
                    used_constants[root(name)] = constants[root(name)]
                    if position in bound:
                        uploaded.add(root(name))
        for _, _, source in output_copies:
            if tensors[source].storage == "constant":
                used_constants[source] = constants[source]
                uploaded.add(source)
        placement: list[tuple[str, str, str, str]] = [
            (node_name, op_type, str(step.placement), step.reason)
            for step in planned_steps
            for node_name, op_type in zip(step.node_names, step.op_types)
        ]
        return ExecutionPlan(
            caps=self.caps,
            input_infos=dict(input_infos),
            output_infos={name: tensors[name].info for name in output_names},
            steps=planned_steps,
            tensors=tensors,
            slot_sizes=slot_sizes,
            constants=used_constants,
            constant_keys={name: _constant_key(name, used_constants[name], self.model) for name in sorted(uploaded)},
            output_copies=output_copies,
            placement=placement,
            folded_nodes=list(self.model.folded_nodes) + folded,
        )


def _bound_inputs(step: PlannedStep) -> set[int]:
    if step.op_plan is None:
        return set()
    return {b.index for kernel in step.op_plan.kernels for b in kernel.bindings if b.kind == "input"}


def _with_scratch(step: PlannedStep, scratch: tuple[int, ...]) -> PlannedStep:
    if not scratch:
        return step
    return PlannedStep(
        step.node_names, step.op_types, step.placement, step.reason, step.operator, step.attrs, step.inputs,
        step.outputs, step.input_infos, step.output_infos, step.op_plan, scratch,
    )


def _take_slot(size: int, slot_sizes: list[int], free_slots: list[int]) -> int:
    """Best fit among free slots; grow the largest free one if none fits; else a new slot."""
    fitting = [s for s in free_slots if slot_sizes[s] >= size]
    if fitting:
        slot = min(fitting, key=lambda s: slot_sizes[s])
    elif free_slots:
        slot = max(free_slots, key=lambda s: slot_sizes[s])
        slot_sizes[slot] = size
    else:
        slot_sizes.append(size)
        return len(slot_sizes) - 1
    free_slots.remove(slot)
    return slot


def plan_model(
    model: LoadedModel,
    input_shapes: Mapping[str, Sequence[int]],
    caps: DeviceCaps,
    *,
    input_dtypes: Mapping[str, Any] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    allow_cpu: bool = True,
    fuse: bool = True,
) -> ExecutionPlan:
    """Plan ``model`` for the given input shapes on a device with ``caps``.

    Raises :class:`ShapeError` when a tensor would not fit the device (before
    any allocation), :class:`UnsupportedOpError` naming the nodes that must
    run on the CPU when ``allow_cpu`` is false, :class:`ModelError` when a
    shape cannot be inferred.  ``input_values`` gives the values of
    ``model.value_dependent_inputs`` (required for those): the plan is valid
    only for those values, so callers key their plan cache by them too.
    """
    input_infos = _input_infos(model, input_shapes, input_dtypes)
    return _Planner(model, caps, allow_cpu, fuse).run(input_infos, input_values or {})
