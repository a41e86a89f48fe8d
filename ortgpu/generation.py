"""Greedy token generation with a static KV cache and captured decode steps: :class:`Generator`.

The model is a causal LM in onnxruntime-genai's static-cache layout:

* inputs ``input_ids`` ``[batch, sequence]`` (int64), ``attention_mask`` ``[batch, max_length]`` (int64: 1 for the
  positions written so far; its width is the cache's), optionally ``position_ids`` ``[batch, sequence]`` (int64),
  and one ``past_key_values.<layer>.key`` / ``.value`` ``[batch, kv_heads, max_length, head]`` per layer;
* outputs ``logits`` ``[batch, sequence, vocabulary]`` and ``present.<layer>.key`` / ``.value``, each written by
  the GroupQueryAttention node that reads the past of the same name (so the cache is updated in place: see the
  README's "Lifetimes, copies and threads").

The generator appends the choice of the next token to the graph (the last position's logits, ArgMax), so a step
reads back only the token ids.  The prompt runs as one ordinary run; each later step is a replay of one of two
captured graphs, which ping-pong the token between two device values (a value is never a graph's input and output
at once).  The attention mask (and position ids) are written from the host before each step, a few bytes per row.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortgpu_core import Env, InvalidArgumentError, ModelError

from ._run_options import RunOptions
from ._session import InferenceSession

__all__ = ["Generator"]

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_NEXT = "ortgpu_next_token_ids"


def _with_next_token(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with output ``_NEXT`` ``[batch, 1]`` (int64): ArgMax of the last position's logits."""
    chosen = onnx.ModelProto()
    chosen.CopyFrom(model)
    graph = chosen.graph
    names = {"starts": -1, "ends": np.iinfo(np.int64).max, "axes": 1}
    for name, value in names.items():
        graph.initializer.append(onnx.numpy_helper.from_array(np.array([value], np.int64), f"ortgpu_last_{name}"))
    graph.node.append(
        helper.make_node(
            "Slice", ["logits", "ortgpu_last_starts", "ortgpu_last_ends", "ortgpu_last_axes"], ["ortgpu_last_logits"]
        )
    )
    graph.node.append(helper.make_node("ArgMax", ["ortgpu_last_logits"], ["ortgpu_argmax"], axis=-1, keepdims=0))
    graph.output.append(helper.make_tensor_value_info(_NEXT, TensorProto.INT64, None))
    graph.node.append(helper.make_node("Identity", ["ortgpu_argmax"], [_NEXT]))
    return chosen


class Generator:
    """Greedy decoding of a causal LM (onnxruntime-genai's static-cache layout; see the module docstring).

    Parameters
    ----------
    model
        The model: a path, bytes or an ``onnx.ModelProto``.
    batch_size
        Rows generated together (every prompt of one call has this many rows, of one length).
    env
        The Env to run on (default: the process's).
    capture
        Replay the decode step from captured graphs (the default); False runs each step as an ordinary run.

    ``generate(prompt, max_new_tokens)`` yields each step's token ids ``[batch_size]`` as they are chosen;
    ``close()`` (or the ``with`` block) releases the graphs, the cache and the session.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes | onnx.ModelProto,
        *,
        batch_size: int = 1,
        env: Env | None = None,
        capture: bool = True,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be a positive int, not {batch_size!r}")
        if isinstance(model, onnx.ModelProto):
            proto = model
        elif isinstance(model, bytes):
            proto = onnx.load_from_string(model)
        else:
            proto = onnx.load(os.fspath(model))
        inputs = {value.name: value for value in proto.graph.input}
        outputs = {value.name for value in proto.graph.output}
        missing = [name for name in ("input_ids", "attention_mask") if name not in inputs]
        if missing or "logits" not in outputs:
            raise ModelError(
                f"Generator: the model needs inputs input_ids and attention_mask and output logits "
                f"(onnxruntime-genai's layout); missing {missing + ([] if 'logits' in outputs else ['logits'])}"
            )
        self._caches: list[tuple[str, str]] = []
        for name in inputs:
            found = _PAST.match(name)
            if found is None:
                continue
            present = f"present.{found.group(1)}.{found.group(2)}"
            if present not in outputs:
                raise ModelError(f"Generator: the model reads {name} but has no output {present}")
            self._caches.append((name, present))
        if not self._caches:
            raise ModelError("Generator: the model has no past_key_values.<layer>.key/value inputs (a KV cache)")
        shape = inputs["attention_mask"].type.tensor_type.shape.dim
        if len(shape) != 2 or not shape[1].HasField("dim_value"):
            raise ModelError(
                "Generator: attention_mask must be [batch, max_length] with max_length fixed in the model (a static "
                "cache); export it with a static cache"
            )
        self.max_length = int(shape[1].dim_value)
        self.batch_size = batch_size
        self._capture = capture
        self._positions = "position_ids" in inputs
        self._session = InferenceSession(_with_next_token(proto).SerializeToString(), env=env, graph_capture=capture)
        self._closed = False
        self._cache_values: list[Any] = []
        self._graphs: list[Any] = []
        try:
            allocator = self._session.allocator
            for past, _ in self._caches:
                info = inputs[past].type.tensor_type
                dims = [d.dim_value if d.HasField("dim_value") else 0 for d in info.shape.dim]
                if len(dims) != 4 or dims[2] != self.max_length or not all(dims[1:]):
                    raise ModelError(
                        f"Generator: {past} must be [batch, kv_heads, {self.max_length}, head] with fixed sizes "
                        f"(a static cache of the attention mask's width), not {dims}"
                    )
                dtype = onnx.helper.tensor_dtype_to_np_dtype(info.elem_type)
                self._cache_values.append(allocator.empty((batch_size, *dims[1:]), dtype))
            self._tokens = [allocator.empty((batch_size, 1), np.int64) for _ in range(2)]
            self._mask = allocator.empty((batch_size, self.max_length), np.int64)
            self._step_positions = allocator.empty((batch_size, 1), np.int64) if self._positions else None
        except BaseException:
            self.close()
            raise

    # -- lifetime -------------------------------------------------------------------------------------------------

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the captured graphs, the cache and the session (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for graph in self._graphs:
            if graph is not None:
                graph.release()
        self._graphs = []
        for value in [*self._cache_values, *getattr(self, "_tokens", []), getattr(self, "_mask", None),
                      getattr(self, "_step_positions", None)]:  # fmt: skip
            if value is not None:
                value.release()
        self._session.close()

    # -- generation -----------------------------------------------------------------------------------------------

    def _binding(self, ids: Any, target: Any) -> Any:
        binding = self._session.io_binding()
        binding.bind_input("input_ids", ids)
        binding.bind_input("attention_mask", self._mask)
        if self._step_positions is not None:
            binding.bind_input("position_ids", self._step_positions)
        for (past, present), value in zip(self._caches, self._cache_values):
            binding.bind_input(past, value)
            binding.bind_output(present, value)
        binding.bind_output(_NEXT, target)
        binding.bind_output("logits", "webgpu")
        return binding

    def generate(self, prompt: Sequence[Sequence[int]] | np.ndarray, max_new_tokens: int) -> Iterator[np.ndarray]:
        """Yield the next token ids ``[batch_size]`` (int64) for ``max_new_tokens`` steps after ``prompt``
        (``[batch_size, length]`` token ids, every row of one length).  Raises InvalidArgumentError where the prompt
        and the new tokens do not fit the cache (``max_length``)."""
        if self._closed:
            raise InvalidArgumentError("Generator: closed")
        ids = np.asarray(prompt, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != self.batch_size or ids.shape[1] < 1:
            raise InvalidArgumentError(
                f"Generator: the prompt must be [batch_size={self.batch_size}, length >= 1] token ids, not shape "
                f"{list(ids.shape)}"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InvalidArgumentError(f"max_new_tokens must be a non-negative int, not {max_new_tokens!r}")
        length = ids.shape[1]
        if length + max_new_tokens - 1 > self.max_length:
            raise InvalidArgumentError(
                f"Generator: a prompt of {length} tokens and {max_new_tokens} new ones need "
                f"{length + max_new_tokens - 1} cache positions; the model's cache holds {self.max_length}"
            )
        return self._steps(ids, max_new_tokens)

    def _steps(self, ids: np.ndarray, max_new_tokens: int) -> Iterator[np.ndarray]:
        length = ids.shape[1]
        rows = self.batch_size
        if max_new_tokens == 0:
            return
        for graph in self._graphs:
            if graph is not None:
                graph.release()
        self._graphs = [None, None]
        mask = np.zeros((rows, self.max_length), np.int64)
        mask[:, :length] = 1
        self._mask.update_inplace(mask)
        # the prompt: one ordinary run over its tokens, into token value 0
        prompt_ids = self._session.allocator.from_numpy(ids)
        prompt_positions = None
        try:
            binding = self._session.io_binding()
            binding.bind_input("input_ids", prompt_ids)
            binding.bind_input("attention_mask", self._mask)
            if self._positions:
                prompt_positions = self._session.allocator.from_numpy(
                    np.broadcast_to(np.arange(length, dtype=np.int64), (rows, length)).copy()
                )
                binding.bind_input("position_ids", prompt_positions)
            for (past, present), value in zip(self._caches, self._cache_values):
                binding.bind_input(past, value)
                binding.bind_output(present, value)
            binding.bind_output(_NEXT, self._tokens[0])
            binding.bind_output("logits", "webgpu")
            self._session.run_with_iobinding(binding, RunOptions(gpu_graph_id=-1))
        finally:
            prompt_ids.release()
            if prompt_positions is not None:
                prompt_positions.release()
        yield self._tokens[0].to_numpy().reshape(rows)
        bindings = [self._binding(self._tokens[0], self._tokens[1]), self._binding(self._tokens[1], self._tokens[0])]
        source = 0
        for step in range(1, max_new_tokens):
            position = length + step - 1
            mask[:, position] = 1
            self._mask.update_inplace(mask)
            if self._step_positions is not None:
                self._step_positions.update_inplace(np.full((rows, 1), position, np.int64))
            if not self._capture:
                self._session.run_with_iobinding(bindings[source], RunOptions(gpu_graph_id=-1))
            elif self._graphs[source] is None:
                self._graphs[source] = self._session.capture(bindings[source], graph_id=source)
            else:
                self._graphs[source].replay()
            source = 1 - source
            yield self._tokens[source].to_numpy().reshape(rows)
