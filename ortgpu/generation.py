"""Token generation with a static KV cache and captured decode steps: :class:`Generator`.

The model is a causal LM as onnxruntime-genai's model builder writes it (a model folder with ``genai_config.json``,
or the ONNX file alone with these names):

* inputs ``input_ids`` ``[batch, sequence]`` (int64), ``attention_mask`` ``[batch, max_length]`` (int64: 1 for the
  positions written so far; its width is the cache's), optionally ``position_ids`` ``[batch, sequence]`` (int64),
  and one ``past_key_values.<layer>.key`` / ``.value`` ``[batch, kv_heads, max_length, head]`` per layer;
* outputs ``logits`` ``[batch, sequence, vocabulary]`` and ``present.<layer>.key`` / ``.value``, each written by
  the GroupQueryAttention node that reads the past of the same name (so the cache is updated in place: see the
  README's "Lifetimes, copies and threads").

The builder leaves the sequence sizes symbolic; the generator binds the mask and the cache at ``max_length``
(onnxruntime-genai's ``past_present_share_buffer`` layout), so every step has the same shapes and one plan.

The generator appends the choice of the next token to the graph (:func:`with_next_token`: the last position's
logits, temperature, top-k, top-p, a seeded Gumbel-max draw; top-k 1 is greedy), so a step reads back only the
token ids.  The prompt runs as one ordinary run; each later step is a replay of one of two
captured graphs, which ping-pong the token between two device values (a value is never a graph's input and output
at once).  The attention mask (and position ids) are written from the host before each step, a few bytes per row.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortgpu_core import Env, InvalidArgumentError, UnsafeAccessError

from ._generation_conditions import host_conditions
from ._generation_layout import load_decoder
from ._run_options import RunOptions
from ._session import InferenceSession

__all__ = ["Generator", "with_next_token", "TOP_K", "SAMPLING", "RANDOM"]

_NEXT = "ortgpu_next_token_ids"


#: The inputs the next-token subgraph adds: top-k (int64 [1]; 1 is greedy), temperature and top-p (float32 [2]), the
#: random stream's seed and step (uint32 [2]).
TOP_K, SAMPLING, RANDOM = "ortgpu_top_k", "ortgpu_sampling", "ortgpu_random"
#: Odd 32-bit constants mixing seed, step, row and candidate into one word, and the finalizer's multipliers.
_MIX = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F)
_FINAL = (0x7FEB352D, 0x846CA68B)


def with_next_token(model: onnx.ModelProto, logits: str = "logits") -> onnx.ModelProto:
    """A copy of ``model`` whose output ``ortgpu_next_token_ids`` ``[batch, 1]`` (int64) is the next token, chosen
    from the last position's logits by standard ONNX operators, so any runtime computes the same choice:

    the logits divided by the temperature, their ``top_k`` largest (TopK: ties to the lower index), a softmax over
    those, the candidates whose preceding cumulative probability is below ``top_p`` kept, then the Gumbel-max trick:
    the kept candidate of the largest ``log p + g``, ``g = -log(-log u)`` with ``u`` in (0, 1) from a hash of (seed,
    step, row, candidate) in uint32 arithmetic (shift-add-multiply rounds: opset 17 has no bitwise xor).  ``top_k`` 1 is greedy decoding: the first index of the largest
    logit, as ArgMax chooses it, and an ``If`` on ``top_k == 1`` runs ArgMax alone: ``top_k`` is bound as a host
    value, so each plan holds one branch (a greedy step skips the sampling's few dozen small kernels)."""
    chosen = onnx.ModelProto()
    chosen.CopyFrom(model)
    graph = chosen.graph
    constants: dict[str, np.ndarray] = {
        "last_starts": np.array([-1], np.int64),
        "last_ends": np.array([np.iinfo(np.int64).max], np.int64),
        "axis1": np.array([1], np.int64),
        "axis_last": np.array(-1, np.int64),
        "axis_first": np.array(0, np.int64),
        "first": np.array([0], np.int64),
        "second": np.array([1], np.int64),
        "unit": np.array(2.0**-24, np.float32),
        "half_unit": np.array(2.0**-25, np.float32),
        "minus_inf": np.array(-np.inf, np.float32),
        "eight": np.array(8, np.uint32),
        "fifteen": np.array(15, np.uint32),
        "sixteen": np.array(16, np.uint32),
    }
    for index, factor in enumerate(_MIX):
        constants[f"mix{index}"] = np.array(factor, np.uint32)
    for index, factor in enumerate(_FINAL):
        constants[f"final{index}"] = np.array(factor, np.uint32)
    for name, array in constants.items():
        graph.initializer.append(onnx.numpy_helper.from_array(array, f"ortgpu_{name}"))

    def c(name: str) -> str:
        return f"ortgpu_{name}"

    nodes: list[onnx.NodeProto] = []

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [c(output)], **attrs))
        return c(output)

    last = node("Slice", [logits, c("last_starts"), c("last_ends"), c("axis1")], "last")
    # float32 from here on: a float16 model's logits are compared and sampled in float32, as onnxruntime-genai does
    flat = node("Cast", [node("Squeeze", [last, c("axis1")], "squeezed")], "flat", to=TensorProto.FLOAT)
    greedy = node("Equal", [TOP_K, c("second")], "greedy")  # top_k == 1 (c("second") holds [1])
    outer, nodes = nodes, []  # the sampling below becomes the else branch of an If on ``greedy``
    temperature = node("Gather", [SAMPLING, c("first")], "temperature")
    top_p = node("Gather", [SAMPLING, c("second")], "top_p")
    scaled = node("Div", [flat, temperature], "scaled")
    nodes.append(helper.make_node("TopK", [scaled, TOP_K], [c("values"), c("indices")], axis=-1, largest=1, sorted=1))
    probabilities = node("Softmax", [c("values")], "probabilities", axis=-1)
    cumulative = node("CumSum", [probabilities, c("axis_last")], "cumulative")
    before = node("Sub", [cumulative, probabilities], "before")
    keep = node("Less", [before, top_p], "keep")
    ones = node("ConstantOfShape", [node("Shape", [c("values")], "shape")], "ones",
                value=onnx.numpy_helper.from_array(np.array([1], np.int32)))  # fmt: skip
    column = node("Sub", [node("CumSum", [ones, c("axis_last")], "columns"), ones], "column")
    row = node("Sub", [node("CumSum", [ones, c("axis_first")], "rows"), ones], "row")
    seed = node("Gather", [RANDOM, c("first")], "seed")
    step = node("Gather", [RANDOM, c("second")], "step")
    terms = [
        node("Mul", [seed, c("mix0")], "seed_mix"),
        node("Mul", [step, c("mix1")], "step_mix"),
        node("Mul", [node("Cast", [row], "row_u32", to=TensorProto.UINT32), c("mix2")], "row_mix"),
        node("Mul", [node("Cast", [column], "column_u32", to=TensorProto.UINT32), c("mix3")], "column_mix"),
    ]
    word = node("Add", [node("Add", [terms[0], terms[1]], "sum01"), terms[2]], "sum012")
    word = node("Add", [word, terms[3]], "word")
    for index, (shift, multiplier) in enumerate(((c("sixteen"), c("final0")), (c("fifteen"), c("final1")))):
        shifted = node("BitShift", [word, shift], f"shifted{index}", direction="RIGHT")
        word = node("Mul", [node("Add", [word, shifted], f"mixed{index}"), multiplier], f"hashed{index}")
    word = node("Add", [word, node("BitShift", [word, c("sixteen")], "shifted2", direction="RIGHT")], "hash")
    top_bits = node("Cast", [node("BitShift", [word, c("eight")], "top_bits", direction="RIGHT")], "top_float",
                    to=TensorProto.FLOAT)  # fmt: skip
    uniform = node("Add", [node("Mul", [top_bits, c("unit")], "scaled_bits"), c("half_unit")], "uniform")
    gumbel = node("Neg", [node("Log", [node("Neg", [node("Log", [uniform], "log_u")], "minus_log_u")], "log_log_u")],
                  "gumbel")  # fmt: skip
    score = node("Add", [node("Log", [probabilities], "log_p"), gumbel], "score")
    masked = node("Where", [keep, score, c("minus_inf")], "masked")
    pick = node("ArgMax", [masked], "pick", axis=-1, keepdims=1)
    node("GatherElements", [c("indices"), pick], "next", axis=-1)
    chosen_type = [helper.make_tensor_value_info(name, TensorProto.INT64, None) for name in (c("argmax"), c("next"))]
    argmax = helper.make_node("ArgMax", [flat], [c("argmax")], axis=-1, keepdims=1)
    outer.append(helper.make_node(
        "If", [greedy], [_NEXT],
        then_branch=helper.make_graph([argmax], "greedy", [], chosen_type[:1]),
        else_branch=helper.make_graph(nodes, "sample", [], chosen_type[1:]),
    ))  # fmt: skip
    graph.node.extend(outer)
    graph.input.extend([
        helper.make_tensor_value_info(TOP_K, TensorProto.INT64, [1]),
        helper.make_tensor_value_info(SAMPLING, TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info(RANDOM, TensorProto.UINT32, [2]),
    ])  # fmt: skip
    graph.output.append(helper.make_tensor_value_info(_NEXT, TensorProto.INT64, None))
    return chosen


class Generator:
    """Token generation for a causal LM (onnxruntime-genai's static-cache layout; see the module docstring).

    Parameters
    ----------
    model
        An onnxruntime-genai model folder (``genai_config.json`` names the ONNX file, its inputs and outputs, the
        key/value heads and ``search.max_length``), or the model as a path, bytes or an ``onnx.ModelProto``.
    batch_size
        Rows generated together (every prompt of one call has this many rows, of one length).
    env
        The Env to run on (default: the process's).
    capture
        Replay the decode step from captured graphs (the default); False runs each step as an ordinary run.
    max_length
        The static cache's length (prompt plus new tokens) where the model leaves it symbolic, as onnxruntime-genai's
        builder does; default: the config's ``search.max_length``.  A model whose attention mask has a fixed width
        needs none (a different one is refused).

    ``generate(prompt, max_new_tokens)`` yields each step's token ids ``[batch_size]`` as they are chosen;
    ``close()`` (or the ``with`` block) releases the graphs, the cache and the session; a generator dropped without
    it is cleaned up with its session (which releases its graphs and values).  One thread at a time: the cache is
    the generator's state, so two threads need two generators.  Copying or pickling raises ``UnsafeAccessError``.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes | onnx.ModelProto,
        *,
        batch_size: int = 1,
        env: Env | None = None,
        capture: bool = True,
        max_length: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be a positive int, not {batch_size!r}")
        proto, layout = load_decoder(model, max_length)
        self._layout = layout
        #: The static cache's length: a prompt and its new tokens take at most this many positions
        self.max_length = layout.max_length
        #: The vocabulary's size where the model states it (top_k's bound), else unbounded here
        self.vocabulary = layout.vocabulary if layout.vocabulary else 2**62
        #: End-of-sequence ids from onnxruntime-genai's config (empty without one); ``generate(stop_at_eos=True)`` stops at them
        self.eos_token_ids = layout.eos_token_ids
        self.batch_size = batch_size
        self._capture = capture
        # The proto itself, not its bytes: a model past protobuf's 2 GB (its external data loaded) still loads.
        augmented = with_next_token(proto, layout.logits)
        self._conditions = host_conditions(augmented, layout.attention_mask, batch_size)
        self._session = InferenceSession(augmented, env=env, graph_capture=capture)
        self._closed = False
        self._top_k = np.array([1], np.int64)
        self._cache_values: list[Any] = []
        self._graphs: dict[tuple[int, tuple[bool, ...]], Any] = {}
        try:
            allocator = self._session.allocator
            for shape, elem_type in zip(layout.cache_shapes, layout.cache_elem_types):
                dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
                self._cache_values.append(allocator.empty((batch_size, *shape), dtype))
            self._tokens = [allocator.empty((batch_size, 1), np.int64) for _ in range(2)]
            self._sampling = allocator.from_numpy(np.ones(2, np.float32))
            self._random = allocator.from_numpy(np.zeros(2, np.uint32))
            self._mask = allocator.empty((batch_size, self.max_length), np.int64)
            positions = layout.position_ids is not None
            self._step_positions = allocator.empty((batch_size, 1), np.int64) if positions else None
        except BaseException:
            self.close()
            raise

    # -- lifetime -------------------------------------------------------------------------------------------------

    def __enter__(self) -> Generator:
        return self

    def __copy__(self) -> Generator:
        raise UnsafeAccessError(
            "a Generator cannot be copied: a copy would share its session, cache and graphs; make another Generator"
        )

    def __deepcopy__(self, memo: object) -> Generator:
        return self.__copy__()

    def __reduce__(self) -> Any:
        raise UnsafeAccessError("a Generator cannot be pickled: it holds device memory; make one in each process")

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the captured graphs, the cache and the session (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._release_graphs()
        extras = ("_mask", "_step_positions", "_sampling", "_random")
        for value in [*self._cache_values, *getattr(self, "_tokens", []), *(getattr(self, n, None) for n in extras)]:
            if value is not None:
                value.release()
        self._session.close()

    # -- generation -----------------------------------------------------------------------------------------------

    def _release_graphs(self) -> None:
        for graph in self._graphs.values():
            graph.release()
        self._graphs = {}

    def _decision(self, length: int) -> tuple[bool, ...]:
        """The host-decided ``If`` conditions for a sequence of ``length`` positions (see
        :mod:`ortgpu._generation_conditions`)."""
        return tuple(condition.at(length) for condition in self._conditions)

    def _binding(self, ids: Any, target: Any, positions: Any, decision: tuple[bool, ...] = ()) -> Any:
        """A binding of one step: token ids ``ids`` in, the next ones into ``target``, the cache in place, each
        host-decided condition bound as its own host array (a graph captured with it checks it before replaying)."""
        binding = self._session.io_binding()
        self._bind_choice(binding)
        for condition, value in zip(self._conditions, decision):
            binding.bind_cpu_input(condition.name, np.array(value))
        layout = self._layout
        binding.bind_input(layout.input_ids, ids)
        binding.bind_input(layout.attention_mask, self._mask)
        if positions is not None and layout.position_ids is not None:
            binding.bind_input(layout.position_ids, positions)
        for (past, present), value in zip(layout.caches, self._cache_values):
            binding.bind_input(past, value)
            binding.bind_output(present, value)
        binding.bind_output(_NEXT, target)
        binding.bind_output(layout.logits, "webgpu")
        return binding

    def _bind_choice(self, binding: Any) -> None:
        binding.bind_cpu_input(TOP_K, self._top_k)  # decides the plan (TopK's width); a replay checks it by a look
        binding.bind_input(SAMPLING, self._sampling)
        binding.bind_input(RANDOM, self._random)

    def generate(
        self,
        prompt: Sequence[Sequence[int]] | np.ndarray,
        max_new_tokens: int,
        *,
        top_k: int = 1,
        top_p: float = 1.0,
        temperature: float = 1.0,
        seed: int = 0,
        stop_at_eos: bool = False,
    ) -> Iterator[np.ndarray]:
        """Yield the next token ids ``[batch_size]`` (int64) for ``max_new_tokens`` steps after ``prompt``
        (``[batch_size, length]`` token ids, every row of one length).

        ``stop_at_eos``: end once every row has chosen one of :attr:`eos_token_ids` (from onnxruntime-genai's
        config), as onnxruntime-genai does; a row that ended before the others keeps generating until then, so
        cut each row at its first end-of-sequence id.  Without it (the default) all ``max_new_tokens`` are generated.

        ``top_k`` 1 (the default) is greedy decoding; above 1 each token is sampled from the ``top_k`` most likely
        (after dividing the logits by ``temperature``), within the smallest set whose probability reaches ``top_p``,
        from a random stream fixed by ``seed`` (see :func:`with_next_token`).  Raises InvalidArgumentError where
        the prompt and the new tokens do not fit the cache (``max_length``) or a parameter is out of range.

        One generation at a time: the generator has one cache, so the first step of a later ``generate()`` ends an
        earlier one still being iterated (its graphs are released; iterate it no further)."""
        if self._closed:
            raise InvalidArgumentError("Generator: closed")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= self.vocabulary:
            raise InvalidArgumentError(
                f"top_k must be an int in [1, {self.vocabulary}] (the vocabulary), not {top_k!r}"
            )
        if not 0.0 < float(top_p) <= 1.0 or not 0.0 < float(temperature) < float("inf"):
            raise InvalidArgumentError(
                f"top_p must lie in (0, 1] and temperature be positive and finite, not {top_p!r} and {temperature!r}"
            )
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise InvalidArgumentError(f"seed must be an int in [0, 2**32), not {seed!r}")
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
        if stop_at_eos and not self.eos_token_ids:
            raise InvalidArgumentError(
                "stop_at_eos needs end-of-sequence ids: this model's folder gives none (genai_config.json's "
                "model.eos_token_id)"
            )
        steps = self._steps(ids, max_new_tokens, top_k, (float(top_p), float(temperature)), seed)
        return _until_every_row_ends(steps, self.eos_token_ids) if stop_at_eos else steps

    def _steps(
        self, ids: np.ndarray, max_new_tokens: int, top_k: int, sampling: tuple[float, float], seed: int
    ) -> Iterator[np.ndarray]:
        length = ids.shape[1]
        rows = self.batch_size
        if max_new_tokens == 0:
            return
        self._release_graphs()
        self._top_k = np.array([top_k], np.int64)
        top_p, temperature = sampling
        self._sampling.update_inplace(np.array([temperature, top_p], np.float32))
        self._random.update_inplace(np.array([seed, 0], np.uint32))
        mask = np.zeros((rows, self.max_length), np.int64)
        mask[:, :length] = 1
        self._mask.update_inplace(mask)
        # the prompt: one ordinary run over its tokens, into token value 0
        prompt_ids = self._session.allocator.from_numpy(ids)
        prompt_positions = None
        try:
            if self._layout.position_ids is not None:
                prompt_positions = self._session.allocator.from_numpy(
                    np.broadcast_to(np.arange(length, dtype=np.int64), (rows, length)).copy()
                )
            binding = self._binding(prompt_ids, self._tokens[0], prompt_positions, self._decision(length))
            self._session.run_with_iobinding(binding, RunOptions(gpu_graph_id=-1))
        finally:
            prompt_ids.release()
            if prompt_positions is not None:
                prompt_positions.release()
        yield self._tokens[0].to_numpy().reshape(rows)
        tokens, positions = self._tokens, self._step_positions
        bindings: dict[tuple[int, tuple[bool, ...]], Any] = {}
        source = 0
        for step in range(1, max_new_tokens):
            position = length + step - 1
            mask[:, position] = 1
            self._mask.update_inplace(mask)
            self._random.update_inplace(np.array([seed, step], np.uint32))
            if self._step_positions is not None:
                self._step_positions.update_inplace(np.full((rows, 1), position, np.int64))
            key = (source, self._decision(position + 1))
            binding = bindings.get(key)
            if binding is None:
                binding = bindings[key] = self._binding(tokens[source], tokens[1 - source], positions, key[1])
            graph = self._graphs.get(key)
            if not self._capture:
                self._session.run_with_iobinding(binding, RunOptions(gpu_graph_id=-1))
            elif graph is None:
                self._graphs[key] = self._session.capture(binding, graph_id=len(self._graphs))
            else:
                graph.replay()
            source = 1 - source
            yield self._tokens[source].to_numpy().reshape(rows)


def _until_every_row_ends(steps: Iterator[np.ndarray], eos: Sequence[int]) -> Iterator[np.ndarray]:
    """``steps`` until the step by which every row has chosen an end-of-sequence id (that step included)."""
    ended: np.ndarray | None = None
    for ids in steps:
        chosen = np.isin(ids, list(eos))
        ended = chosen if ended is None else ended | chosen
        yield ids
        if ended.all():
            return
