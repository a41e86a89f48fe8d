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
