"""onnxruntime-genai model folders written by its own model builder, from a random Hugging Face checkpoint.

The builder reads a checkpoint through transformers (so torch must be installed) and insists on a tokenizer, so
:func:`build_folder` first writes one in a child process (torch never enters the calling process): the family's
config with seeded random weights (matrices N(0, 1/fan_in), other non-norm parameters N(0, 0.1), norms as
initialized) and a word-level tokenizer over the vocabulary.  The checkpoint stays in ``<folder>/hf`` (the
PyTorch arm of ``python -m bench --generate`` loads it, so both runtimes hold the same weights).  float16 folders are
built for WebGPU (the builder's CPU float16 is a different layout, without GroupQueryAttention); every folder's
provider options are cleared so that onnxruntime-genai runs it on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

__all__ = ["builder_available", "build_folder", "llama_config", "CHECKPOINT_DIR"]

#: The checkpoint's folder inside a built model folder.
CHECKPOINT_DIR = "hf"

_CHECKPOINT_SCRIPT = """
import json, sys, torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, Phi3Config, PhiConfig, PreTrainedTokenizerFast, Qwen2Config
family, path, seed, kwargs = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
config = {"llama": LlamaConfig, "qwen2": Qwen2Config, "phi": PhiConfig, "phi3": Phi3Config}[family](**kwargs)
torch.manual_seed(seed)
model = AutoModelForCausalLM.from_config(config)
with torch.no_grad():
    for name, parameter in model.named_parameters():
        if parameter.dim() == 2:
            parameter.normal_(0.0, parameter.shape[1] ** -0.5)
        elif "norm" not in name:
            parameter.normal_(0.0, 0.1)
model.save_pretrained(path)
words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config.vocab_size)}, unk_token="t0"))
words.pre_tokenizer = pre_tokenizers.Whitespace()
eos = config.eos_token_id if isinstance(config.eos_token_id, int) else 2
PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t1", eos_token=f"t{eos}").save_pretrained(path)
"""


def builder_available() -> bool:
    """Whether onnxruntime-genai's builder can run here: it reads checkpoints through torch and transformers."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime_genai", "torch", "transformers"))


def llama_config(layers: int, hidden: int, context: int) -> dict[str, Any]:
    """A Llama of ``layers`` x ``hidden`` (head 64, a quarter as many key/value heads, SwiGLU MLP of about 8/3
    hidden, vocabulary 32000) with ``context`` positions."""
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": max(1, hidden // 256),
        "intermediate_size": (8 * hidden // 3 + 255) // 256 * 256,
        "vocab_size": 32000,
        "max_position_embeddings": context,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def build_folder(folder: str, family: str, config: dict[str, Any], precision: str = "fp32", seed: int = 0) -> str:
    """Write the checkpoint (``<folder>/hf``) and run the builder into ``folder``; returns ``folder``.  Raises
    ``RuntimeError`` with the builder's last output where it fails."""
    checkpoint = os.path.join(folder, CHECKPOINT_DIR)
    script = [sys.executable, "-c", _CHECKPOINT_SCRIPT, family, checkpoint, str(seed), json.dumps(config)]
    _run(script, "writing the checkpoint")
    provider = "webgpu" if precision == "fp16" else "cpu"
    builder = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", checkpoint, "-o", folder,
               "-p", precision, "-e", provider, "-c", os.path.join(folder, "builder_cache")]  # fmt: skip
    _run(builder, "onnxruntime-genai's builder")
    path = os.path.join(folder, "genai_config.json")
    with open(path, encoding="utf-8") as handle:
        written = json.load(handle)
    written["model"]["decoder"]["session_options"]["provider_options"] = []
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(written, handle, indent=1)
    return folder


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{what} failed (exit {result.returncode}): " + " | ".join(tail))
