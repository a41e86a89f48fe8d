"""ortgpu.Generator: greedy decoding of a model in onnxruntime-genai's static-cache layout, the tokens equal to
onnxruntime CPU's greedy loop over the same model, captured and uncaptured, on both backends.

The models come from ``bench.generate.build_decoder`` (``onnx.helper``, as onnxruntime-genai's builder lays them out:
seqlens_k from the attention mask's sum, total_sequence_length from its width, the cache's; GroupQueryAttention with
rotary embeddings, an MLP and residuals per layer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

import ortgpu
from bench.generate import build_decoder
from ortgpu_core import InvalidArgumentError, ModelError

HEAD, VOCAB, MAX_LENGTH, HIDDEN = 16, 41, 12, 64
KV_HEADS = 1  # build_decoder's: a quarter of the HIDDEN / HEAD query heads


def _genai_model(layers: int, batch: int, positions: bool = False, seed: int = 0) -> onnx.ModelProto:
    return build_decoder(layers, HIDDEN, MAX_LENGTH, batch, vocabulary=VOCAB, head=HEAD, seed=seed, positions=positions)


def _onnxruntime_tokens(model: onnx.ModelProto, prompt: np.ndarray, new_tokens: int, layers: int) -> np.ndarray:
    """onnxruntime CPU's greedy loop: the prompt in one run, then a token per step, presents fed back as pasts."""
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    batch, length = prompt.shape
    names = {i.name for i in session.get_inputs()}
    caches = {f"past_key_values.{layer}.{kind}": np.zeros((batch, KV_HEADS, MAX_LENGTH, HEAD), np.float32)
              for layer in range(layers) for kind in ("key", "value")}  # fmt: skip
    mask = np.zeros((batch, MAX_LENGTH), np.int64)
    mask[:, :length] = 1
    ids, positions = prompt, np.broadcast_to(np.arange(length), (batch, length)).astype(np.int64)
    chosen = []
    for step in range(new_tokens):
        feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, **caches}
        if "position_ids" in names:
            feeds["position_ids"] = positions
        results = session.run(None, feeds)
        token = results[0][:, -1].argmax(axis=-1).astype(np.int64)
        chosen.append(token)
        for index, name in enumerate(sorted(caches, key=lambda n: (int(n.split(".")[1]), n.endswith("value")))):
            caches[name] = results[1 + index]
        position = length + step
        if position < MAX_LENGTH:
            mask = mask.copy()
            mask[:, position] = 1
        ids, positions = token[:, None], np.full((batch, 1), position, np.int64)
    return np.stack(chosen, axis=1)


@pytest.mark.parametrize("capture", [True, False], ids=["captured", "uncaptured"])
@pytest.mark.parametrize("layers,batch,positions", [(2, 1, False), (1, 2, True)], ids=["2-layers", "batch-2-positions"])
def test_greedy_tokens_equal_onnxruntime(
    env: ortgpu.Env, capture: bool, layers: int, batch: int, positions: bool
) -> None:
    model = _genai_model(layers, batch, positions, seed=layers)
    prompt = np.random.default_rng(7).integers(0, VOCAB, (batch, 3)).astype(np.int64)
    new_tokens = MAX_LENGTH - prompt.shape[1] + 1
    # onnxruntime takes a prompt after a (static) past for one row only: each row alone, the same weights
    single = _genai_model(layers, 1, positions, seed=layers)
    expected = np.concatenate([_onnxruntime_tokens(single, prompt[row : row + 1], new_tokens, layers)
                               for row in range(batch)])  # fmt: skip
    with ortgpu.Generator(model, batch_size=batch, env=env, capture=capture) as generator:
        got = np.stack(list(generator.generate(prompt, new_tokens)), axis=1)
        # a second prompt on the same generator: the graphs are captured afresh, the cache rewritten
        again = np.stack(list(generator.generate(prompt, new_tokens)), axis=1)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(again, expected)


@pytest.mark.parametrize("capture", [True, False], ids=["captured", "uncaptured"])
def test_greedy_tokens_of_a_4bit_model_equal_onnxruntime_on_the_same_file(env: ortgpu.Env, capture: bool) -> None:
    """The model's projections quantized to 4 bits by onnxruntime's MatMulNBitsQuantizer (MatMulNBits next to
    GroupQueryAttention in every step's graph): the tokens equal onnxruntime CPU's on the quantized file."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(_genai_model(2, 1, seed=5), bits=4, block_size=16)
    quantizer.process()
    model: onnx.ModelProto = quantizer.model.model
    assert sum(node.op_type == "MatMulNBits" for node in model.graph.node) == 2 * 6 + 1
    prompt = np.random.default_rng(8).integers(0, VOCAB, (1, 4)).astype(np.int64)
    new_tokens = MAX_LENGTH - prompt.shape[1] + 1
    expected = _onnxruntime_tokens(model, prompt, new_tokens, 2)
    with ortgpu.Generator(model, env=env, capture=capture) as generator:
        got = np.stack(list(generator.generate(prompt, new_tokens)), axis=1)
    np.testing.assert_array_equal(got, expected)


def test_generate_refuses_what_does_not_fit(env: ortgpu.Env) -> None:
    model = _genai_model(1, 1)
    with ortgpu.Generator(model, env=env) as generator:
        with pytest.raises(InvalidArgumentError, match="cache holds 12"):
            generator.generate(np.zeros((1, 4), np.int64), MAX_LENGTH)
        with pytest.raises(InvalidArgumentError, match=r"batch_size=1"):
            generator.generate(np.zeros((2, 4), np.int64), 2)
        with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
            generator.generate(np.zeros((1, 4), np.int64), -1)
        assert len(list(generator.generate(np.zeros((1, 4), np.int64), 0))) == 0


def test_a_model_without_a_static_cache_is_refused(env: ortgpu.Env) -> None:
    model = _genai_model(1, 1)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "total"
    with pytest.raises(ModelError, match="static cache"):
        ortgpu.Generator(model, env=env)
    plain = _genai_model(1, 1)
    del plain.graph.input[2:]
    with pytest.raises(ModelError, match="KV cache"):
        ortgpu.Generator(plain, env=env)


def test_bench_generate_reports_both_arms(backend_name: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m bench --generate decoder-LAYERS-HIDDEN``: prefill and per-token decode times of both arms, which
    chose the same tokens, in the table and the JSON."""
    import json

    from bench.__main__ import main

    path = tmp_path / "generate.json"
    argv = ["--generate", "decoder-1-64", "--prompt-len", "3", "--new-tokens", "4", "--rounds", "1",
            "--backend", backend_name, "--json", str(path)]  # fmt: skip
    assert main(argv) == 0
    assert "captured decode is" in capsys.readouterr().out
    report = json.loads(path.read_text())
    assert set(report["summary"]) == {"captured", "uncaptured"}
    for arm in report["arms"].values():
        assert len(arm["prefill_ms"]) == 1 and len(arm["decode_ms"]) == 3
        assert all(value > 0 for value in arm["decode_ms"])
    assert report["decode_speedup"] > 0


@pytest.mark.parametrize("text", ["decoder-x-64", "decoder-1-60", "decoder-0-64"])
def test_bench_generate_refuses_a_malformed_decoder(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["--generate", text])
    assert "--generate" in capsys.readouterr().err
