"""The peers of ``python -m bench --generate``: onnxruntime-genai on the same model folder, and PyTorch on the
Hugging Face checkpoint the folder was built from (transformers ``generate`` with a static cache: eager, with
``disable_compile``, and compiled by transformers with ``CompileConfig(mode="reduce-overhead")``, i.e. CUDA graphs;
float32 with TF32 off).  transformers compiles the step by itself on CUDA with a static cache unless told not to, so
the eager arm says so explicitly.

Each arm reports what the ortgpu arms report: prefill ms (the prompt's run and the first token), then per later
token the time from asking for it to holding its id on the host (p50, p99), tokens/s from the p50, and its greedy
tokens.  onnxruntime-genai is told a minimum length so that it generates every token (it would stop at the
end-of-sequence token); PyTorch is timed per step by a stopping criterion that synchronizes the device (transformers
reads each step's tokens back anyway to check for the end of sequence).  PyTorch runs in a child process, so that
neither runtime's allocator or threads disturb the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import numpy as np

__all__ = ["genai_arm", "torch_arm", "summarize"]


def summarize(prefill_ms: list[float], decode_ms: list[float], batch: int) -> dict[str, float]:
    decode = np.asarray(decode_ms, dtype=np.float64)
    return {
        "prefill_ms_p50": float(np.median(prefill_ms)),
        "decode_ms_p50": float(np.median(decode)),
        "decode_ms_p99": float(np.percentile(decode, 99)),
        "tokens_per_s": float(batch * 1e3 / np.median(decode)),
    }


def genai_arm(folder: str, prompt: np.ndarray, new_tokens: int, rounds: int) -> dict[str, Any]:
    """onnxruntime-genai (as installed: its CPU provider) on ``folder``: one warm-up generation, then ``rounds``."""
    import onnxruntime_genai as og

    model = og.Model(folder)
    prefill: list[float] = []
    decode: list[float] = []
    tokens: list[list[int]] = []
    length = prompt.shape[1] + new_tokens
    for round_index in range(rounds + 1):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=length, min_length=length, batch_size=prompt.shape[0])
        generator = og.Generator(model, params)
        steps: list[float] = []
        chosen: list[np.ndarray] = []
        start = time.perf_counter()
        generator.append_tokens(prompt.astype(np.int32))
        while not generator.is_done():
            generator.generate_next_token()
            chosen.append(np.array(generator.get_next_tokens(), dtype=np.int64))
            now = time.perf_counter()
            steps.append(now - start)
            start = now
        if round_index:  # the first generation warms the sessions up
            prefill.append(steps[0] * 1e3)
            decode.extend(step * 1e3 for step in steps[1:])
        tokens = np.stack(chosen, axis=1).tolist()
    return {"summary": summarize(prefill, decode, prompt.shape[0]), "tokens": tokens}


_TORCH_SCRIPT = """
import json, sys, time, torch
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList
checkpoint, prompt, new_tokens, rounds, mode = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).cuda().eval()
# transformers compiles the step by itself on CUDA with a static cache (its CompileConfig, mode reduce-overhead: CUDA
# graphs) unless told not to: eager disables that, cuda-graph asks for it explicitly (wrapping forward in
# torch.compile besides made two compilations, which failed)
from transformers import GenerationConfig
options = {}
if hasattr(GenerationConfig(), "disable_compile"):
    options["disable_compile"] = mode == "eager"
elif mode == "eager":
    raise SystemExit("this transformers cannot disable its own compilation of the step: no eager arm")
if mode == "cuda-graph":
    from transformers import CompileConfig
    options["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead")
ids = torch.tensor(prompt, dtype=torch.long, device="cuda")

class Clock(StoppingCriteria):
    def __init__(self):
        self.times = []
    def __call__(self, input_ids, scores, **kwargs):
        torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

prefill, decode = [], []
for round_index in range(rounds + 2):  # two warm-ups: compiling the prompt's and the step's graphs
    clock = Clock()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             cache_implementation="static", stopping_criteria=StoppingCriteriaList([clock]),
                             **options)
    if round_index >= 2:
        prefill.append((clock.times[0] - start) * 1e3)
        decode.extend((b - a) * 1e3 for a, b in zip(clock.times, clock.times[1:]))
print(json.dumps({"prefill_ms": prefill, "decode_ms": decode, "tokens": out[:, ids.shape[1]:].tolist()}))
"""


def torch_arm(checkpoint: str, prompt: np.ndarray, new_tokens: int, rounds: int, mode: str) -> dict[str, Any]:
    """PyTorch on CUDA in a child process; ``mode`` is ``eager`` or ``cuda-graph``.  Raises RuntimeError (with the
    child's last lines) where it fails, e.g. without torch or CUDA."""
    command = [sys.executable, "-c", _TORCH_SCRIPT, checkpoint, json.dumps(prompt.tolist()), str(new_tokens),
               str(rounds), mode]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"the PyTorch arm ({mode}) failed: " + " | ".join(tail))
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return {
        "summary": summarize(report["prefill_ms"], report["decode_ms"], prompt.shape[0]),
        "tokens": report["tokens"],
    }
