"""User code that must type-check under mypy --strict: greedy generation with ortgpu.Generator."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import ortgpu


def generate(path: str, prompt: npt.NDArray[np.int64], new_tokens: int) -> list[int]:
    tokens: list[int] = []
    with ortgpu.Generator(path, batch_size=1, capture=True) as generator:
        length: int = generator.max_length
        assert prompt.shape[1] + new_tokens - 1 <= length
        for ids in generator.generate(prompt, new_tokens):
            tokens.append(int(ids[0]))
    return tokens


def sample_from_folder(folder: str, prompt: npt.NDArray[np.int64]) -> list[list[int]]:
    """An onnxruntime-genai model folder, sampled, stopping at the end-of-sequence token."""
    rows: list[list[int]] = [[] for _ in range(prompt.shape[0])]
    with ortgpu.Generator(folder, batch_size=prompt.shape[0], max_length=None) as generator:
        eos: tuple[int, ...] = generator.eos_token_ids
        for ids in generator.generate(prompt, 32, top_k=40, top_p=0.9, temperature=0.8, seed=1, stop_at_eos=bool(eos)):
            for row, token in zip(rows, ids.tolist()):
                row.append(int(token))
    return rows
