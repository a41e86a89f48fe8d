"""ortgpu.Generator on onnxruntime-genai model folders: greedy tokens equal onnxruntime-genai's own (its CPU
provider) for Llama-, Qwen2- and Phi-style models and a 4-bit Llama (MatMulNBits at accuracy_level 4, which
onnxruntime computes over an int8-quantized A) and a float16 Llama (the builder's WebGPU layout), 64 new tokens, captured and uncaptured, on both backends; a
Phi-3-style LongRoPE model whose ``If`` switches rotary tables past 64 positions (decided on the host per step, one
captured graph per branch).

The prompts are ones for which onnxruntime-genai generates all 64 tokens (it stops at the end-of-sequence token,
which these random models also choose).  For the 4-bit model, equality holds where no element of the int8 A lies
within float rounding of a half code (one prompt in 10 to 20 measured otherwise: see the README).

The folders come from :mod:`genai_models`: onnxruntime-genai's model builder where torch and transformers are
importable, else graphs written in its layout with ``onnx.helper``.  Either way the model's sequence sizes are
symbolic and the generator binds the cache at the config's ``search.max_length``, as onnxruntime-genai does with
``past_present_share_buffer``; onnxruntime-genai itself (on the CPU) grows its cache each step.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np
import onnx
import pytest
from genai_models import genai_greedy_tokens, write_genai_folder

import ortgpu
from ortgpu_core import InvalidArgumentError, ModelError

NEW_TOKENS = 64
MODELS = {"llama": ("llama", "fp32", 0), "qwen2": ("qwen2", "fp32", 0), "phi": ("phi", "fp32", 1),
          "phi3-longrope": ("phi3", "fp32", 0), "llama-int4": ("llama", "int4", 0),
          "llama-fp16": ("llama", "fp16", 0)}  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("genai")
    return {name: write_genai_folder(str(root / name), *spec) for name, spec in MODELS.items()}


@pytest.mark.parametrize("capture", [True, False], ids=["captured", "uncaptured"])
@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_tokens_equal_onnxruntime_genai(
    env: ortgpu.Env, folders: dict[str, str], name: str, capture: bool
) -> None:
    prompt = np.random.default_rng(7).integers(3, 96, (1, 8)).astype(np.int64)
    want = genai_greedy_tokens(folders[name], prompt, NEW_TOKENS)
    assert want.shape == (1, NEW_TOKENS)  # no end-of-sequence token came first: all 64 are compared
    with ortgpu.Generator(folders[name], env=env, capture=capture) as generator:
        assert generator.max_length == 128  # the config's search.max_length
        got = np.stack(list(generator.generate(prompt, NEW_TOKENS)), axis=1)
    np.testing.assert_array_equal(got, want)


def test_a_batch_of_two_prompts_equals_onnxruntime_genai(env: ortgpu.Env, folders: dict[str, str]) -> None:
    prompt = np.concatenate([np.random.default_rng(seed).integers(3, 96, (1, 8)) for seed in (1, 3)]).astype(np.int64)
    want = genai_greedy_tokens(folders["llama"], prompt, 24)
    with ortgpu.Generator(folders["llama"], batch_size=2, env=env) as generator:
        got = np.stack(list(generator.generate(prompt, 24)), axis=1)
    np.testing.assert_array_equal(got, want)


def test_the_model_without_its_config_needs_the_cache_sizes(env: ortgpu.Env, folders: dict[str, str]) -> None:
    """Without the folder's config the builder's symbolic head size and cache length are unknown: refused with what
    to pass; with the sizes fixed in the model and max_length given, the tokens are the folder's."""
    path = os.path.join(folders["llama"], "model.onnx")
    with pytest.raises(InvalidArgumentError, match="pass max_length="):
        ortgpu.Generator(path, env=env)
    with pytest.raises(ModelError, match="given by genai_config.json"):
        ortgpu.Generator(path, env=env, max_length=20)
    model = onnx.load(path)
    for value in model.graph.input:
        if value.name.startswith("past_key_values."):
            value.type.tensor_type.shape.dim[3].dim_value = 16  # the head size
    prompt = np.random.default_rng(3).integers(3, 96, (1, 8)).astype(np.int64)
    with ortgpu.Generator(folders["llama"], env=env) as generator:
        want = np.stack(list(generator.generate(prompt, 12)), axis=1)
    with ortgpu.Generator(model, env=env, max_length=20) as generator:
        assert generator.max_length == 20
        np.testing.assert_array_equal(np.stack(list(generator.generate(prompt, 12)), axis=1), want)
        with pytest.raises(InvalidArgumentError, match="cache holds 20"):
            generator.generate(prompt, 14)
    with pytest.raises(InvalidArgumentError, match="max_length must be a positive int"):
        ortgpu.Generator(model, env=env, max_length=0)


def test_folder_errors_say_what_is_wrong(env: ortgpu.Env, folders: dict[str, str], tmp_path: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="genai_config.json"):
        ortgpu.Generator(str(tmp_path), env=env)
    with open(os.path.join(folders["llama"], "genai_config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "genai_config.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(ModelError, match="model.decoder.filename"):
        ortgpu.Generator(str(broken), env=env)
    config["model"]["decoder"]["filename"] = os.path.join(folders["llama"], "model.onnx")
    config["model"]["decoder"]["outputs"]["present_key_names"] = "cache.%d.key"
    (broken / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="no input past_key_values.0.key and output cache.0.key"):
        ortgpu.Generator(str(broken), env=env)


def test_the_generator_reads_end_of_sequence_ids_from_the_config(env: ortgpu.Env, folders: dict[str, str]) -> None:
    with ortgpu.Generator(folders["qwen2"], env=env) as generator:
        assert generator.eos_token_ids == (2,)


def test_bench_generate_takes_a_genai_folder(
    backend_name: str, folders: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m bench --generate FOLDER``: both arms, which chose the same tokens, on the 4-bit folder."""
    from bench.__main__ import main

    argv = ["--generate", folders["llama-int4"], "--prompt-len", "5", "--new-tokens", "4", "--rounds", "1",
            "--backend", backend_name]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| captured |" in out and "| uncaptured |" in out and "captured decode is" in out


def test_a_longrope_if_is_decided_on_the_host(folders: dict[str, str]) -> None:
    """The ``If`` choosing the rotary tables by the sequence's length reads a boolean input of its own, computed
    per length as onnxruntime-genai's growing mask would decide it."""
    from ortgpu._generation_conditions import host_conditions

    model = onnx.load(os.path.join(folders["phi3-longrope"], "model.onnx"))
    conditions = host_conditions(model, "attention_mask", 1)
    assert len(conditions) == 1
    (node,) = [n for n in model.graph.node if n.op_type == "If"]
    assert node.input[0] == conditions[0].name and conditions[0].name in {i.name for i in model.graph.input}
    assert [conditions[0].at(length) for length in (1, 64, 65, 128)] == [False, False, True, True]
    plain = onnx.load(os.path.join(folders["llama"], "model.onnx"))
    assert host_conditions(plain, "attention_mask", 1) == []


def test_bench_generate_against_onnxruntime_genai(
    backend_name: str, folders: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--generate-vs onnxruntime-genai``: its row in the table, timed on the same prompt, and how many of its
    greedy tokens equal ortgpu's; ``torch`` without the folder's checkpoint is refused, naming it."""
    from bench.__main__ import main

    argv = ["--generate", folders["qwen2"], "--prompt-len", "6", "--new-tokens", "5", "--rounds", "1",
            "--backend", backend_name, "--generate-vs", "onnxruntime-genai"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| onnxruntime-genai CPU |" in out
    agreement = re.search(r"onnxruntime-genai CPU: the first (\d+) of 5 greedy tokens equal ortgpu's( \(there)?", out)
    assert agreement is not None and (agreement.group(1) == "5" or agreement.group(2))
    if not os.path.isdir(os.path.join(folders["qwen2"], "hf")):
        with pytest.raises(SystemExit, match="needs the Hugging Face checkpoint"):
            main([*argv[:-1], "torch"])
    with pytest.raises(SystemExit):
        main([*argv[:-1], "tensorflow"])
    assert "--generate-vs takes onnxruntime-genai, torch, not tensorflow" in capsys.readouterr().err


def test_bench_generate_builds_a_llama_through_the_builder(
    backend_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--generate llama-LAYERS-HIDDEN`` builds a random Llama with onnxruntime-genai's builder, or says what it
    needs where the builder cannot run."""
    from bench.__main__ import main
    from bench.genai_build import builder_available

    argv = ["--generate", "llama-1-256", "--prompt-len", "4", "--new-tokens", "3", "--rounds", "1",
            "--backend", backend_name]  # fmt: skip
    if not builder_available():
        with pytest.raises(SystemExit, match="needs onnxruntime-genai, torch and transformers"):
            main(argv)
        return
    assert main(argv) == 0
    assert "captured decode is" in capsys.readouterr().out


def test_stop_at_eos_ends_where_onnxruntime_genai_ends(env: ortgpu.Env, folders: dict[str, str]) -> None:
    """``stop_at_eos=True``: the same tokens as onnxruntime-genai's generator, which stops at the end-of-sequence
    token, for prompts that end early and prompts that do not."""
    lengths = []
    with ortgpu.Generator(folders["llama"], env=env) as generator:
        for seed in range(6):
            prompt = np.random.default_rng(seed).integers(3, 96, (1, 8)).astype(np.int64)
            want = genai_greedy_tokens(folders["llama"], prompt, NEW_TOKENS)
            got = np.stack(list(generator.generate(prompt, NEW_TOKENS, stop_at_eos=True)), axis=1)
            np.testing.assert_array_equal(got, want)
            lengths.append(got.shape[1])
    assert min(lengths) < NEW_TOKENS  # some prompt ended early


def test_stop_at_eos_needs_end_of_sequence_ids(env: ortgpu.Env, folders: dict[str, str]) -> None:
    model = onnx.load(os.path.join(folders["llama"], "model.onnx"))
    for value in model.graph.input:
        if value.name.startswith("past_key_values."):
            value.type.tensor_type.shape.dim[3].dim_value = 16
    with ortgpu.Generator(model, env=env, max_length=20) as generator:
        assert generator.eos_token_ids == ()
        with pytest.raises(InvalidArgumentError, match="stop_at_eos needs end-of-sequence ids"):
            generator.generate(np.ones((1, 4), np.int64), 4, stop_at_eos=True)
