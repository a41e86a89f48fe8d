"""Where a causal LM keeps its token inputs, its cache and its logits: :class:`DecoderLayout`, read from an
onnxruntime-genai model folder (``genai_config.json`` next to the ONNX file) or from the graph's names alone.

onnxruntime-genai's builder writes the decoder with symbolic sizes (``attention_mask`` ``[batch_size,
total_sequence_length]``, ``past_key_values.N.key`` ``[batch_size, kv_heads, past_sequence_length, head]``, the head
sometimes symbolic too) and leaves the cache's layout to the runtime; its config says the names, the key/value heads,
the head size and ``search.max_length``, the static cache's length when ``past_present_share_buffer`` is on.  The
generator binds the mask and every cache at that length, so the model runs with past = present = max_length and
reads each row's length from the mask's sum (GroupQueryAttention's seqlens_k)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import onnx

from ortgpu_core import InvalidArgumentError, ModelError

__all__ = ["DecoderLayout", "load_decoder"]

_CONFIG = "genai_config.json"
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


@dataclass(frozen=True)
class DecoderLayout:
    """The names a generator binds and the static cache's shape (``[batch, kv_heads, max_length, head]`` per
    past/present pair, of ``cache_dtype``)."""

    input_ids: str
    attention_mask: str
    position_ids: str | None
    logits: str
    caches: tuple[tuple[str, str], ...]
    cache_shapes: tuple[tuple[int, int, int], ...]  # (kv_heads, max_length, head) per pair
    cache_elem_types: tuple[int, ...]
    max_length: int
    vocabulary: int | None
    eos_token_ids: tuple[int, ...]


def _dims(value: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def _read_config(folder: str) -> tuple[str, dict[str, Any]]:
    path = os.path.join(folder, _CONFIG)
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
        decoder = config["model"]["decoder"]
        filename = decoder["filename"]
    except OSError as error:
        raise InvalidArgumentError(
            f"Generator: {folder!r} is a folder without a readable {_CONFIG} ({error}); pass an onnxruntime-genai "
            "model folder or the .onnx file"
        ) from error
    except (ValueError, KeyError, TypeError) as error:
        raise ModelError(
            f"Generator: {path} is not an onnxruntime-genai config (model.decoder.filename): {error}"
        ) from error
    return os.path.join(folder, os.fspath(filename)), config


def _template(names: dict[str, Any], key: str, default: str) -> str:
    value = names.get(key, default)
    if not isinstance(value, str):
        raise ModelError(f"Generator: the config's {key} must be a name, not {value!r}")
    return value


def load_decoder(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto, max_length: int | None
) -> tuple[onnx.ModelProto, DecoderLayout]:
    """The model (external data loaded) and its layout; ``model`` may be an onnxruntime-genai folder.  Raises
    ModelError where the model is not a causal LM with a KV cache, and InvalidArgumentError for a ``max_length``
    the model or its config contradicts."""
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise InvalidArgumentError(f"max_length must be a positive int or None, not {max_length!r}")
    config: dict[str, Any] = {}
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        path = os.fspath(model)
        if os.path.isdir(path):
            path, config = _read_config(path)
        try:
            proto = onnx.load(path)
        except OSError as error:
            raise InvalidArgumentError(f"Generator: cannot read the model {path!r}: {error}") from error
    if config.get("search", {}).get("past_present_share_buffer", True) is False:
        raise ModelError(
            "Generator: this folder was built without past_present_share_buffer (its attention does not update a "
            "static cache in place); rebuild it with onnxruntime-genai's builder for an execution provider that "
            "shares the buffer (webgpu, cuda) or one whose attention is GroupQueryAttention"
        )
    decoder = config.get("model", {}).get("decoder", {})
    names = {**decoder.get("inputs", {}), **decoder.get("outputs", {})}
    inputs = {value.name: value for value in proto.graph.input}
    outputs = {value.name: value for value in proto.graph.output}
    input_ids = _template(names, "input_ids", "input_ids")
    attention_mask = _template(names, "attention_mask", "attention_mask")
    logits = _template(names, "logits", "logits")
    missing = [n for n in (input_ids, attention_mask) if n not in inputs] + ([logits] if logits not in outputs else [])
    if missing:
        raise ModelError(
            f"Generator: the model needs inputs {input_ids} and {attention_mask} and output {logits} "
            f"(onnxruntime-genai's layout); missing {missing}"
        )
    position_ids = _template(names, "position_ids", "position_ids")
    caches = _cache_pairs(decoder, names, inputs, outputs)
    length = _max_length(inputs[attention_mask], config, max_length)
    shapes, elem_types = [], []
    for past, _ in caches:
        dims = _dims(inputs[past])
        kv_heads = dims[1] if len(dims) == 4 and dims[1] else decoder.get("num_key_value_heads")
        head = dims[3] if len(dims) == 4 and dims[3] else decoder.get("head_size")
        if len(dims) != 4 or not kv_heads or not head or dims[2] not in (None, length):
            raise ModelError(
                f"Generator: {past} must be [batch, kv_heads, {length}, head] (a static cache as long as the attention "
                f"mask; kv_heads and head fixed in the model or given by {_CONFIG}), not {dims}"
            )
        shapes.append((int(kv_heads), length, int(head)))
        elem_types.append(inputs[past].type.tensor_type.elem_type)
    logit_dims = _dims(outputs[logits])
    vocabulary = logit_dims[-1] if len(logit_dims) == 3 else None
    eos = config.get("model", {}).get("eos_token_id", [])
    layout = DecoderLayout(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids if position_ids in inputs else None,
        logits=logits,
        caches=tuple(caches),
        cache_shapes=tuple(shapes),
        cache_elem_types=tuple(elem_types),
        max_length=length,
        vocabulary=vocabulary,
        eos_token_ids=tuple(int(t) for t in (eos if isinstance(eos, list) else [eos])),
    )
    return proto, layout


def _cache_pairs(
    decoder: dict[str, Any],
    names: dict[str, Any],
    inputs: dict[str, onnx.ValueInfoProto],
    outputs: dict[str, onnx.ValueInfoProto],
) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    if "past_key_names" in names:
        layers = decoder.get("num_hidden_layers")
        if not isinstance(layers, int) or layers < 1:
            raise ModelError(f"Generator: the config's num_hidden_layers must be a positive int, not {layers!r}")
        templates = [
            (_template(names, f"past_{kind}_names", ""), _template(names, f"present_{kind}_names", ""))
            for kind in ("key", "value")
        ]
        for layer in range(layers):
            for past, present in templates:
                try:
                    pairs.append((past % layer, present % layer))
                except TypeError as error:
                    raise ModelError(f"Generator: the config's cache names {past!r}, {present!r}: {error}") from error
    else:
        for name in inputs:
            found = _PAST.match(name)
            if found is not None:
                pairs.append((name, f"present.{found.group(1)}.{found.group(2)}"))
    for past, present in pairs:
        if past not in inputs or present not in outputs:
            raise ModelError(f"Generator: the model has no input {past} and output {present} pair (the KV cache)")
    if not pairs:
        raise ModelError("Generator: the model has no past_key_values.<layer>.key/value inputs (a KV cache)")
    return pairs


def _max_length(mask: onnx.ValueInfoProto, config: dict[str, Any], asked: int | None) -> int:
    dims = _dims(mask)
    if len(dims) != 2:
        raise ModelError(f"Generator: the attention mask must be [batch, max_length], not {len(dims)}-D")
    if dims[1] is not None:
        if asked is not None and asked != dims[1]:
            raise InvalidArgumentError(
                f"max_length={asked}, but the model's attention mask is fixed at {dims[1]} positions (its cache)"
            )
        return dims[1]
    if asked is not None:
        return asked
    search = config.get("search", {}).get("max_length")
    if isinstance(search, int) and search > 0:
        return search
    raise InvalidArgumentError(
        "Generator: the model's attention mask has no fixed width and no genai_config.json gives search.max_length; "
        "pass max_length= (the static cache's length: prompt plus new tokens)"
    )
