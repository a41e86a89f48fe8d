"""What a session's run takes: feeds, output names, run options and placement questions, checked and converted.

Every public run method of :class:`~ortgpu.InferenceSession` checks its arguments the same way before any work is
done (so a bad argument changes nothing): the feeds name every model input and nothing else, the output names are
the model's, the run options are ortgpu's and do not ask a transient-feed run to capture.  Host feeds are converted
here to the host values the runner plans with (DLPack tensors, nested lists, string arrays, sequences and optionals).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ortgpu_core import ArgumentTypeError, CaptureStateError, InvalidArgumentError, ProvenanceError
from ortgpu_core._binding import FrozenIOBinding, IOBinding
from ortgpu_core._dlpack import host_array, is_dlpack_producer

from ._host_io import as_host_value, as_string_objects, list_as_array
from ._host_values import is_structured_dtype
from ._ort_api import Fail
from ._run_options import NodePlacement, RunOptions
from ._runner import AnyBinding, SessionRunner

__all__ = [
    "check_binding",
    "check_feeds",
    "output_order",
    "graph_id_of",
    "refuse_graph_id",
    "host_feeds",
    "node_placement",
]


def check_binding(session: object, session_id: int, binding: object) -> AnyBinding:
    """``binding`` as a binding of ``session`` (whose id is ``session_id``); raise for any other object."""
    if not isinstance(binding, (IOBinding, FrozenIOBinding)):
        raise ArgumentTypeError(
            f"expected an IOBinding or FrozenIOBinding from session.io_binding(), got {type(binding).__name__}"
        )
    if binding.session is not session:
        raise ProvenanceError(
            f"this binding belongs to session {binding.session_id}, not session {session_id}; "
            f"create one with this session's io_binding()"
        )
    return binding


def check_feeds(runner: SessionRunner, feeds: Mapping[str, object]) -> None:
    """Raise unless ``feeds`` is a mapping naming every model input and nothing else."""
    if not isinstance(feeds, Mapping):
        raise ArgumentTypeError(f"feeds must be a dict of input name -> value, got {type(feeds).__name__}")
    missing = [name for name in runner.input_names if name not in feeds]
    extra = [name for name in feeds if name not in runner.input_infos]
    if missing or extra:
        parts = []
        if missing:
            # onnxruntime's wording first, so code matching its message keeps working.
            parts.append(
                f"Required inputs ({missing}) are missing from input feed ({list(feeds)}): missing inputs {missing}"
            )
        if extra:
            parts.append(f"unknown inputs {extra}")
        raise InvalidArgumentError(f"{' and '.join(parts)}; the model's inputs are {runner.input_names}")


def output_order(runner: SessionRunner, output_names: Sequence[str] | None) -> list[str]:
    """The outputs a run returns, in order: ``output_names``, or every output when None or empty (onnxruntime)."""
    if not output_names:
        return runner.output_names
    unknown = [name for name in output_names if name not in runner.output_infos]
    if unknown:
        raise InvalidArgumentError(f"unknown outputs {unknown}; the model's outputs are {runner.output_names}")
    return list(output_names)


def graph_id_of(run_options: RunOptions | None) -> int | None:
    """The graph id ``run_options`` asks for (None when it names none); a terminating run is refused as
    onnxruntime refuses it."""
    if run_options is None:
        return None
    if not isinstance(run_options, RunOptions):
        raise ArgumentTypeError(f"run_options must be ortgpu.RunOptions, got {type(run_options).__name__}")
    if run_options.terminate:
        raise Fail("Exiting due to terminate flag being set to true.")
    return run_options.gpu_graph_id


def refuse_graph_id(run_options: RunOptions | None, method: str) -> None:
    """A run on transient feeds cannot capture or replay: raise if ``run_options`` names a graph."""
    graph_id = graph_id_of(run_options)
    if graph_id is not None and graph_id != -1:
        raise CaptureStateError(
            f"{method} takes transient feeds, so it cannot capture or replay graph {graph_id}: bind fixed device "
            f"values and call run_with_iobinding(binding, RunOptions(gpu_graph_id={graph_id})), or use gpu_graph_id=-1"
        )


def host_feeds(runner: SessionRunner, input_feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``run()``'s feeds as the host values the runner plans with, each checked against the model's input."""
    arrays: dict[str, np.ndarray] = {}
    for name, array in input_feed.items():
        info = runner.input_infos[name]
        if not isinstance(array, np.ndarray) and is_dlpack_producer(array):
            # CPU tensors are shared, device tensors copied by their producer.
            array = host_array(array, f"input {name!r}")
        if is_structured_dtype(info.dtype):
            arrays[name] = as_host_value(name, array, info.dtype)
            continue
        if isinstance(array, (list, tuple)):
            # onnxruntime accepts nested lists: read as an array of the model input's dtype (what numpy makes of the
            # list must convert exactly; a float list for an int input is refused, not truncated).
            array = list_as_array(name, array, info.dtype)
        if not isinstance(array, np.ndarray):
            raise ArgumentTypeError(f"input {name!r} must be a numpy array, got {type(array).__name__}")
        if info.dtype == object and array.dtype.kind in "USV":
            array = as_string_objects(array)  # a string input: numpy str/bytes arrays as object arrays of str
        runner.check_info(name, info, array.dtype, tuple(array.shape), "input")
        arrays[name] = array
    return arrays


def node_placement(
    runner: SessionRunner,
    input_shapes: Mapping[str, Sequence[int]] | None,
    input_values: Mapping[str, npt.NDArray[Any] | list[npt.NDArray[Any]]] | None,
) -> list[NodePlacement]:
    """Where each node runs when the model is planned for ``input_shapes`` and ``input_values`` (see
    :meth:`ortgpu.InferenceSession.get_node_placement`)."""
    shapes = dict(input_shapes) if input_shapes is not None else {}
    for info in runner.model.inputs:
        if info.name not in shapes:
            if not all(isinstance(d, int) for d in info.shape):
                raise InvalidArgumentError(
                    f"input {info.name!r} has dynamic shape {list(info.shape)}: pass input_shapes={{...}} to say "
                    "which shapes to plan for"
                )
            shapes[info.name] = tuple(int(d) for d in info.shape)  # type: ignore[arg-type]
    dtypes = {i.name: i.dtype for i in runner.model.inputs}
    values: dict[str, np.ndarray] = {}
    for name, value in (input_values or {}).items():
        given = runner.input_infos.get(name)
        if given is not None and is_structured_dtype(given.dtype):
            values[name] = as_host_value(name, value, given.dtype)
            dtypes[name] = values[name].dtype
            shapes[name] = ()
        else:
            values[name] = np.asarray(value)
    missing = [n for n, d in dtypes.items() if is_structured_dtype(d) and n not in values]
    if missing:
        raise InvalidArgumentError(
            f"inputs {missing} are sequences or optionals: pass their values (lists of arrays; None for an empty "
            "optional) in input_values, their element shapes decide the plan"
        )
    plan = runner.plan_for({k: tuple(v) for k, v in shapes.items()}, dtypes, values)
    return [NodePlacement(*row) for row in plan.placement]  # type: ignore[arg-type]
