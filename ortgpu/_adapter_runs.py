"""Runs with active LoRA adapters (``RunOptions.add_active_adapter``): which runner runs them and what it is fed.

Rules (onnxruntime's where it has one; where it silently drops a value, ortgpu refuses instead):

* Each parameter of each active adapter is fed as the model input of its name: an ordinary input, or an
  initializer the model also lists as a graph input (IR >= 4; onnxruntime's overridable initializer), whose own
  value is fed when no adapter supplies it.  A name that is neither is an ``InvalidArgumentError`` ("Invalid input
  name", as onnxruntime says); so are a dtype or shape the input does not accept.
* A name fed explicitly *and* by an active adapter is an ``InvalidArgumentError``: onnxruntime silently uses the
  adapter's value and drops the caller's, which hides a mistake.
* Two active adapters supplying one name is an ``InvalidArgumentError`` (onnxruntime silently uses the first one
  added); the same adapter added twice supplies its values once.
* ``run_with_iobinding`` (ordinary, capture or replay) refuses options with active adapters
  (``CaptureStateError``): a binding's inputs are fixed device values, and a captured graph replays the values it
  was captured with, so an adapter there could only be ignored (onnxruntime ignores it) or change under a graph.

Overridable initializers are constants in a session's plans (they fold, and capture pins them), so runs that feed
them go to a second runner of the same session whose model lists them as inputs (loaded once, on the first such run,
from the session's model source with the same options; closed with the session).  That runner holds its own copy
of the model's weights on the device, uploaded on its first run: a session used both with and without adapters holds
them twice.  Its runs are not captured and not profiled.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np

from ortgpu_core import CPU, CaptureStateError, InvalidArgumentError, OrtValue

from ._run_arguments import graph_id_of, refuse_graph_id
from ._run_options import RunOptions
from ._runner import SessionRunner
from .loader._model import load_model


class AdapterSession(Protocol):
    """What a run with adapters uses of the session (named here, not imported: the session imports this module)."""

    _runner: SessionRunner
    _sess_options: Any
    _model_source: Any


__all__ = ["transient_run_inputs", "bound_run_graph_id", "adapter_values"]


def adapter_values(run_options: RunOptions | None) -> dict[str, OrtValue[CPU]]:
    """The values the active adapters of ``run_options`` supply, by input name (empty when none)."""
    if run_options is None or not isinstance(run_options, RunOptions):
        return {}
    values: dict[str, OrtValue[CPU]] = {}
    supplier: dict[str, object] = {}
    for adapter in run_options.active_adapters:
        for name, value in adapter.get_parameters().items():
            if name in supplier and supplier[name] is not adapter:
                raise InvalidArgumentError(
                    f"two active adapters supply parameter {name!r} ({supplier[name]!r} and {adapter!r}); "
                    "activate only one of them for this run"
                )
            values[name], supplier[name] = value, adapter
    return values


def bound_run_graph_id(run_options: RunOptions | None) -> int | None:
    """``graph_id_of(run_options)`` for ``run_with_iobinding``, which refuses active adapters (module docstring)."""
    graph_id = graph_id_of(run_options)
    if run_options is not None and run_options.active_adapters:
        raise CaptureStateError(
            "run_with_iobinding does not apply LoRA adapters: a binding's inputs are fixed device values and a "
            "captured graph replays what it was captured with; run with adapters through run() or "
            "run_with_ort_values(), or use RunOptions without add_active_adapter here"
        )
    return graph_id


def _adapter_runner(session: AdapterSession) -> SessionRunner:
    """The session's runner whose model lists the overridable initializers as inputs, made on first use."""
    base = session._runner
    with base.lock:
        base.check_open("run with adapters")
        if base.adapter_runner is None:
            options = session._sess_options
            model = load_model(
                session._model_source,
                max_fold_bytes=base.model.limits.max_fold_bytes,
                max_nodes=base.model.limits.max_nodes,
                initializer_overrides=options.initializer_arrays(),
                free_dimension_overrides=options.free_dimensions(),
                free_denotation_overrides=options.free_denotations(),
                overridable_as_inputs=True,
            )
            base.adapter_runner = SessionRunner(
                base.session_id,
                base.env,
                base.device,
                model,
                graph_capture=False,
                allow_cpu_fallback=base.allow_cpu_fallback,
                verify_replays=False,
                fuse=base.fuse,
            )
        return base.adapter_runner


def transient_run_inputs(
    session: AdapterSession,
    run_options: RunOptions | None,
    feeds: Mapping[str, Any],
    method: str,
    *,
    host: bool,
) -> tuple[SessionRunner, Mapping[str, Any]]:
    """For ``run()`` (``host``: arrays) and ``run_with_ort_values()`` (OrtValues): refuse a graph id
    (:func:`refuse_graph_id`), then apply the active adapters.  Returns the runner to run on and its feeds: the
    session's own runner and ``feeds`` unchanged when no adapter is active."""
    refuse_graph_id(run_options, method)
    supplied = adapter_values(run_options)
    runner = session._runner
    if not supplied:
        return runner, feeds
    if not isinstance(feeds, Mapping):
        return runner, feeds  # check_feeds names the type error
    both = sorted(set(supplied) & set(feeds))
    if both:
        raise InvalidArgumentError(
            f"inputs {both} are fed explicitly and also supplied by an active adapter; remove them from the feeds "
            "or run without that adapter (onnxruntime would silently use the adapter's values)"
        )
    unknown = [n for n in supplied if n not in runner.input_infos and n not in runner.model.initializers]
    overriding = [n for n in supplied if n not in runner.input_infos and n not in unknown]
    if overriding:
        runner = _adapter_runner(session)
        unknown += [n for n in overriding if n not in runner.input_infos]
    if unknown:
        raise InvalidArgumentError(
            f"Invalid input name: {unknown[0]}: active adapter parameters {unknown} name no model input (nor any "
            f"initializer the model lists as a graph input); the model's inputs are {runner.input_names}"
        )
    merged: dict[str, Any] = dict(feeds)
    for name, value in supplied.items():
        merged[name] = value.numpy() if host else value
    base_initializers = session._runner.model.initializers
    for name in runner.input_names:
        if name not in merged and name in base_initializers and name not in session._runner.input_infos:
            default = base_initializers[name]  # an overridable initializer no adapter supplies: its own value
            merged[name] = default if host else OrtValue.ortvalue_from_numpy(np.ascontiguousarray(default))
    return runner, merged
