"""Architectures by name for ``python -m bench --vs torch``: built with random seeded weights, in eval mode, and
exported to ONNX on the spot from the very module that PyTorch times.

Names (``SOURCE:NAME``):

* ``torchvision:NAME``: any classification builder of ``torchvision.models.get_model(NAME, weights=None)``, e.g.
  ``resnet50``, ``mobilenet_v3_large``, ``efficientnet_b0``, ``convnext_tiny``, ``vit_b_16``, ``swin_t``. Input
  ``x [batch, 3, 224, 224]`` (299 for ``inception_v3``), output the logits ``[batch, 1000]``.
* ``timm:NAME``: any ``timm.create_model(NAME, pretrained=False)``, e.g. ``deit_small_patch16_224``,
  ``resnet18``; input ``x [batch, *pretrained_cfg["input_size"]]`` (224 x 224 where the model names none),
  output the logits.
* ``transformers:KEY``: a model built from a configuration class (no download), KEY one of :data:`PRESETS`:

  ====================== =========================================================== ===================================
  key                    model                                                       inputs -> output
  ====================== =========================================================== ===================================
  bert-base              BertModel, BertConfig() defaults (12 layers, hidden 768)    ids, mask [b, 128] -> hidden
  distilbert-base        DistilBertModel, DistilBertConfig() (6 layers, hidden 768)  ids, mask [b, 128] -> hidden
  t5-small-encoder       T5EncoderModel, T5-small sizes (6 layers, d_model 512)      ids [b, 128] -> hidden
  vit-base               ViTModel, ViTConfig() (12 layers, hidden 768, patch 16)     pixels [b, 3, 224, 224] -> hidden
  whisper-tiny-encoder   WhisperModel(...).encoder, Whisper-tiny sizes (4 x 384)     features [b, 80, 3000] -> hidden
  gpt2                   GPT2LMHeadModel, GPT2Config() (12 layers, hidden 768)       ids, mask [b, 128] -> logits
  llama-small            LlamaForCausalLM, hidden 512, 4 layers, 8 heads, 4 KV heads ids, mask [b, 128] -> logits
  qwen2-small            Qwen2ForCausalLM, the same sizes as llama-small             ids, mask [b, 128] -> logits
  ====================== =========================================================== ===================================

  Every one is built with ``attn_implementation="eager"`` (attention as plain matmul + softmax: what both
  exporters turn into ONNX, and the same code in the timed torch module) and ``use_cache=False``; the wrapper
  returns the model's first output (``last_hidden_state`` or ``logits``: ``output[0]`` of a ModelOutput or a
  tuple). Decoders run a full forward over the 128-token prompt, without a KV cache. Token ids are uniform over
  the vocabulary; attention masks are all ones (the decoders take one because without it transformers looks
  for packed sequences in the position ids with ``torch.diff``, which the TorchScript exporter cannot export);
  images and audio features are standard normal.

Weights: ``torch.manual_seed(seed)`` right before the model is built; weight matrices that the model initializes
to all zeros (torchvision's ViT head) are then redrawn from N(0, 0.02^2), so that no output is all zeros (the
notes name them); inputs come from their own generator seeded with ``seed`` too. Nothing here imports torch at module level: the names parse without it.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = [
    "SOURCES",
    "PRESETS",
    "DEFAULT_ZOO",
    "TEXT_SEQ",
    "InputSpec",
    "Preset",
    "Built",
    "parse_architecture",
    "is_architecture",
    "packages_for",
    "build_architecture",
    "export_onnx",
    "to_half",
]

SOURCES = ("torchvision", "timm", "transformers")
#: The prompt / sequence length of the text models.
TEXT_SEQ = 128
#: Image sizes of the torchvision builders that do not take 224 x 224.
TORCHVISION_SIZES = {"inception_v3": 299}
#: Keyword arguments every transformers configuration gets.
HF_OPTIONS: dict[str, Any] = {"attn_implementation": "eager", "use_cache": False}

#: ``--zoo default``: CNNs, vision transformers, text and audio encoders, decoders.
DEFAULT_ZOO = (
    "torchvision:resnet50",
    "torchvision:mobilenet_v3_large",
    "torchvision:efficientnet_b0",
    "torchvision:convnext_tiny",
    "torchvision:vit_b_16",
    "torchvision:swin_t",
    "timm:deit_small_patch16_224",
    "transformers:vit-base",
    "transformers:bert-base",
    "transformers:t5-small-encoder",
    "transformers:whisper-tiny-encoder",
    "transformers:gpt2",
    "transformers:llama-small",
    "transformers:qwen2-small",
)


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, shape after the batch, and how it is filled: ``"ids"`` (int64 uniform in
    ``[0, high)``), ``"ones"`` (int64 ones: an attention mask) or ``"normal"`` (float32 standard normal)."""

    name: str
    shape: tuple[int, ...]
    fill: str
    high: int = 0


@dataclass(frozen=True)
class Preset:
    """A transformers model built from a configuration class: ``config(transformers)`` makes the configuration,
    ``model(transformers, config)`` the module whose first output is timed."""

    summary: str
    inputs: tuple[InputSpec, ...]
    config: Callable[[Any], Any]
    model: Callable[[Any, Any], Any]


def _tokens(vocab: int, mask: bool = True) -> tuple[InputSpec, ...]:
    ids = InputSpec("input_ids", (TEXT_SEQ,), "ids", vocab)
    return (ids, InputSpec("attention_mask", (TEXT_SEQ,), "ones")) if mask else (ids,)


_SMALL_DECODER: dict[str, Any] = {
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}

PRESETS: dict[str, Preset] = {
    "bert-base": Preset(
        "BertModel, BertConfig() defaults: 12 layers, hidden 768, 12 heads, vocab 30522; last_hidden_state",
        _tokens(30522),
        lambda t: t.BertConfig(**HF_OPTIONS),
        lambda t, c: t.BertModel(c, add_pooling_layer=False),
    ),
    "distilbert-base": Preset(
        "DistilBertModel, DistilBertConfig() defaults: 6 layers, hidden 768, 12 heads; last_hidden_state",
        _tokens(30522),
        lambda t: t.DistilBertConfig(**HF_OPTIONS),
        lambda t, c: t.DistilBertModel(c),
    ),
    "t5-small-encoder": Preset(
        "T5EncoderModel, T5-small sizes: 6 layers, d_model 512, 8 heads, d_ff 2048, vocab 32128; last_hidden_state",
        _tokens(32128, mask=False),
        lambda t: t.T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, **HF_OPTIONS),
        lambda t, c: t.T5EncoderModel(c),
    ),
    "vit-base": Preset(
        "ViTModel, ViTConfig() defaults: 224 x 224, patch 16, 12 layers, hidden 768; last_hidden_state",
        (InputSpec("pixel_values", (3, 224, 224), "normal"),),
        lambda t: t.ViTConfig(**HF_OPTIONS),
        lambda t, c: t.ViTModel(c, add_pooling_layer=False),
    ),
    "whisper-tiny-encoder": Preset(
        "the encoder of WhisperModel at Whisper-tiny sizes: 4 layers, d_model 384, 6 heads, FFN 1536, 80 mel bins; "
        "last_hidden_state [b, 1500, 384]",
        (InputSpec("input_features", (80, 3000), "normal"),),
        lambda t: t.WhisperConfig(
            d_model=384,
            encoder_layers=4,
            encoder_attention_heads=6,
            encoder_ffn_dim=1536,
            decoder_layers=4,
            decoder_attention_heads=6,
            decoder_ffn_dim=1536,
            num_mel_bins=80,
            max_source_positions=1500,
            **HF_OPTIONS,
        ),
        lambda t, c: t.WhisperModel(c).encoder,
    ),
    "gpt2": Preset(
        "GPT2LMHeadModel, GPT2Config() defaults: 12 layers, hidden 768, 12 heads, vocab 50257; logits",
        _tokens(50257),
        lambda t: t.GPT2Config(**HF_OPTIONS),
        lambda t, c: t.GPT2LMHeadModel(c),
    ),
    "llama-small": Preset(
        "LlamaForCausalLM: hidden 512, FFN 1376, 4 layers, 8 heads, 4 KV heads, vocab 32000; logits",
        _tokens(32000),
        lambda t: t.LlamaConfig(**_SMALL_DECODER, **HF_OPTIONS),
        lambda t, c: t.LlamaForCausalLM(c),
    ),
    "qwen2-small": Preset(
        "Qwen2ForCausalLM: hidden 512, FFN 1376, 4 layers, 8 heads, 4 KV heads, vocab 32000; logits",
        _tokens(32000),
        lambda t: t.Qwen2Config(**_SMALL_DECODER, **HF_OPTIONS),
        lambda t, c: t.Qwen2ForCausalLM(c),
    ),
}


def parse_architecture(name: str) -> tuple[str, str]:
    """``"SOURCE:NAME"`` -> ``(SOURCE, NAME)``; ValueError, saying what is accepted, for anything else (an unknown
    source, an empty name, a transformers key that is not in :data:`PRESETS`)."""
    source, colon, rest = name.partition(":")
    if not colon or source not in SOURCES:
        raise ValueError(
            f"{name!r} is not an architecture name: expected SOURCE:NAME with SOURCE one of {', '.join(SOURCES)} "
            "(e.g. torchvision:resnet50, timm:deit_small_patch16_224, transformers:bert-base)"
        )
    if not rest or rest != rest.strip() or ":" in rest:
        raise ValueError(f"{name!r}: the name after {source}: is empty or malformed")
    if source == "transformers" and rest not in PRESETS:
        raise ValueError(f"unknown transformers model {rest!r}: expected one of {', '.join(PRESETS)}")
    return source, rest


def is_architecture(name: str) -> bool:
    """Whether ``name`` has the ``SOURCE:NAME`` form of a known source (what ``--vs torch`` takes as ``--model``)."""
    return name.partition(":")[0] in SOURCES and ":" in name


def packages_for(names: list[str]) -> list[str]:
    """The Python packages the architectures ``names`` need: torch, then their sources, in first-use order."""
    needed = ["torch"]
    for name in names:
        source = parse_architecture(name)[0]
        if source not in needed:
            needed.append(source)
    return needed


@dataclass
class Built:
    """A module ready to time and export: ``module(*inputs.values())`` returns one tensor (on the CPU, eval mode)."""

    name: str
    module: Any
    inputs: dict[str, Any]
    output_name: str
    notes: dict[str, str] = field(default_factory=dict)


def _first_tensor(torch: Any, output: Any) -> Any:
    """The tensor a model's output leads with: itself, ``output[0]`` of a tuple, list or ModelOutput, or the first
    value of a dict (torchvision's segmentation models)."""
    while not isinstance(output, torch.Tensor):
        output = next(iter(output.values())) if isinstance(output, dict) else output[0]
    return output


def _wrap(torch: Any, model: Any, keywords: list[str] | None) -> Any:
    """An ``nn.Module`` around ``model`` with a fixed positional signature (what both exporters and the CUDA graph
    see) returning one tensor; ``keywords`` names the model's keyword arguments (transformers), None passes
    positionally."""

    def forward(self: Any, first: Any, second: Any = None) -> Any:
        args = [first] if second is None else [first, second]
        if keywords is None:
            return _first_tensor(torch, self.model(*args))
        return _first_tensor(torch, self.model(**dict(zip(keywords, args))))

    def init(self: Any) -> None:
        torch.nn.Module.__init__(self)
        self.model = model

    cls = type("Timed", (torch.nn.Module,), {"__init__": init, "forward": forward})
    return cls().eval()


def _make_inputs(torch: Any, specs: tuple[InputSpec, ...], batch: int, seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    inputs = {}
    for spec in specs:
        shape = (batch, *spec.shape)
        if spec.fill == "ids":
            inputs[spec.name] = torch.randint(0, spec.high, shape, generator=generator, dtype=torch.int64)
        elif spec.fill == "ones":
            inputs[spec.name] = torch.ones(shape, dtype=torch.int64)
        else:
            inputs[spec.name] = torch.randn(shape, generator=generator, dtype=torch.float32)
    return inputs


def _redraw_zero_weights(torch: Any, model: Any, seed: int) -> list[str]:
    """Fill every all-zero weight matrix or kernel (2 or more dimensions; torchvision's ViT initializes its head to
    zeros) with N(0, 0.02^2) values, so that the output is not all zeros and comparing it proves something; the
    names of those parameters."""
    generator = torch.Generator().manual_seed(seed + 1)
    redrawn = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2 and parameter.is_floating_point() and not bool(parameter.any()):
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.02)
                redrawn.append(name)
    return redrawn


def build_architecture(name: str, batch: int, seed: int = 0) -> Built:
    """Build ``name`` (see the module docstring) for ``batch`` with weights seeded by ``seed``: on the CPU, eval."""
    source, key = parse_architecture(name)
    torch = importlib.import_module("torch")
    library = importlib.import_module(source)
    torch.manual_seed(seed)
    notes: dict[str, str] = {}
    if source == "transformers":
        preset = PRESETS[key]
        config = preset.config(library)
        model = preset.model(library, config).eval()
        notes["attn_implementation"] = str(getattr(model.config, "_attn_implementation", "unknown"))
        notes["model"] = preset.summary
        specs = preset.inputs
        keywords: list[str] | None = [spec.name for spec in specs]
        output = "logits" if "logits" in preset.summary else "last_hidden_state"
    else:
        if source == "torchvision":
            model = library.models.get_model(key, weights=None).eval()
            size = TORCHVISION_SIZES.get(key, 224)
            image: tuple[int, ...] = (3, size, size)
        else:
            model = library.create_model(key, pretrained=False).eval()
            config = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
            image = tuple(config.get("input_size", (3, 224, 224)))
        specs = (InputSpec("x", image, "normal"),)
        keywords = None
        output = "logits"
    redrawn = _redraw_zero_weights(torch, model, seed)
    if redrawn:
        notes["all-zero weights redrawn"] = ", ".join(redrawn)
    if len(specs) > 2:
        raise ValueError(f"{name}: {len(specs)} inputs; the wrapper takes at most 2")
    return Built(name, _wrap(torch, model, keywords), _make_inputs(torch, specs, batch, seed), output, notes)


def to_half(built: Built, device: str) -> Built:
    """``built`` in half precision on ``device``: ``module.half()`` (every floating-point parameter and buffer
    float16, as a deployment does before export) and every floating-point input rounded to float16; integer inputs
    (token ids, masks) unchanged. The module is converted in place: ``built`` is not to be used after this."""
    module = built.module.to(device).half()
    inputs = {
        key: (value.half() if value.is_floating_point() else value).to(device) for key, value in built.inputs.items()
    }
    return Built(built.name, module, inputs, built.output_name, {**built.notes, "dtype": "float16 (module.half())"})


def _torchscript_exporter_present(torch: Any) -> bool:
    """Whether this torch still has the TorchScript-based exporter (``dynamo=False``)."""
    if "dynamo" not in inspect.signature(torch.onnx.export).parameters:
        return True  # a torch from before the dynamo exporter: the TorchScript one is all there is
    for module in ("torch.onnx._internal.torchscript_exporter.utils", "torch.onnx.utils"):
        try:
            if hasattr(importlib.import_module(module), "export"):
                return True
        except ImportError:
            continue
    return False


def export_onnx(built: Built, path: str, exporter: str = "auto", opset: int = 17) -> str:
    """Export ``built.module`` to ``path`` (one file, static shapes, constants folded); returns the exporter used:
    ``"torchscript"`` (``dynamo=False``; ``auto`` picks it) or ``"dynamo"`` (``auto`` falls back to it only when
    this torch has no TorchScript exporter). Export errors propagate."""
    torch = importlib.import_module("torch")
    if exporter not in ("auto", "torchscript", "dynamo"):
        raise ValueError(f"exporter must be auto, torchscript or dynamo, not {exporter!r}")
    if exporter == "auto":
        exporter = "torchscript" if _torchscript_exporter_present(torch) else "dynamo"
    args = tuple(built.inputs.values())
    common: dict[str, Any] = {"input_names": list(built.inputs), "output_names": [built.output_name]}
    takes_dynamo = "dynamo" in inspect.signature(torch.onnx.export).parameters
    # Not under no_grad: with grad off, nn.MultiheadAttention (torchvision's ViT) takes its fused fast path, which
    # the TorchScript exporter cannot export.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        if exporter == "torchscript":
            extra = {"dynamo": False} if takes_dynamo else {}
            torch.onnx.export(
                built.module, args, path, opset_version=opset, do_constant_folding=True, **extra, **common
            )
        else:
            torch.onnx.export(
                built.module,
                args,
                path,
                dynamo=True,
                opset_version=max(opset, 18),
                external_data=False,
                do_constant_folding=True,
                **common,
            )
    return exporter
