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
from onnx import TensorProto, helper

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
    with pytest.raises(InvalidArgumentError, match="pass max_length="):
        ortgpu.Generator(model, env=env)
    with pytest.raises(ModelError, match="static cache"):  # the cache's fixed length is not max_length
        ortgpu.Generator(model, env=env, max_length=MAX_LENGTH + 1)
    with pytest.raises(InvalidArgumentError, match="fixed at 12 positions"):
        ortgpu.Generator(_genai_model(1, 1), env=env, max_length=MAX_LENGTH + 1)
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


def _onnxruntime_sampled(model: onnx.ModelProto, prompt: np.ndarray, new_tokens: int, layers: int,
                         top_k: int, top_p: float, temperature: float, seed: int) -> np.ndarray:  # fmt: skip
    """onnxruntime CPU running the Generator's own graph (``with_next_token``) with the same random stream."""
    from ortgpu.generation import RANDOM, SAMPLING, TOP_K, with_next_token

    session = onnxruntime.InferenceSession(
        with_next_token(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    batch, length = prompt.shape
    caches = {f"past_key_values.{layer}.{kind}": np.zeros((batch, KV_HEADS, MAX_LENGTH, HEAD), np.float32)
              for layer in range(layers) for kind in ("key", "value")}  # fmt: skip
    mask = np.zeros((batch, MAX_LENGTH), np.int64)
    mask[:, :length] = 1
    ids, chosen = prompt, []
    outputs = [o.name for o in session.get_outputs()]
    for step in range(new_tokens):
        feeds = {"input_ids": ids, "attention_mask": mask, **caches, TOP_K: np.array([top_k], np.int64),
                 SAMPLING: np.array([temperature, top_p], np.float32), RANDOM: np.array([seed, step], np.uint32)}  # fmt: skip
        results = dict(zip(outputs, session.run(None, feeds)))
        token = results["ortgpu_next_token_ids"]
        chosen.append(token[:, 0])
        for name in caches:
            caches[name] = results[name.replace("past_key_values", "present")]
        if length + step < MAX_LENGTH:
            mask = mask.copy()
            mask[:, length + step] = 1
        ids = token
    return np.stack(chosen, axis=1)


@pytest.mark.parametrize("capture", [True, False], ids=["captured", "uncaptured"])
def test_sampled_tokens_equal_onnxruntime_running_the_same_graph(env: ortgpu.Env, capture: bool) -> None:
    """top-k, top-p and temperature: ortgpu's tokens equal onnxruntime's on the generator's graph and random stream;
    the same seed gives the same tokens, another seed others."""
    model = _genai_model(1, 1, seed=9)
    prompt = np.random.default_rng(9).integers(0, VOCAB, (1, 3)).astype(np.int64)
    new_tokens = MAX_LENGTH - prompt.shape[1] + 1
    options = {"top_k": 8, "top_p": 0.9, "temperature": 1.5}
    expected = _onnxruntime_sampled(model, prompt, new_tokens, 1, seed=3, **options)  # type: ignore[arg-type]
    with ortgpu.Generator(model, env=env, capture=capture) as generator:
        got = np.stack(list(generator.generate(prompt, new_tokens, seed=3, **options)), axis=1)  # type: ignore[arg-type]
        again = np.stack(list(generator.generate(prompt, new_tokens, seed=3, **options)), axis=1)  # type: ignore[arg-type]
        other = np.stack(list(generator.generate(prompt, new_tokens, seed=4, **options)), axis=1)  # type: ignore[arg-type]
        greedy = np.stack(list(generator.generate(prompt, new_tokens)), axis=1)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(again, got)
    assert not np.array_equal(other, got)
    assert not np.array_equal(greedy, got)


def test_sampling_follows_the_filtered_softmax(env: ortgpu.Env) -> None:
    """The choice alone, on fixed logits, 4000 rows: top-k 4 of 6 tokens at temperature 2 gives each kept token its
    softmax share (within 5 standard deviations) and the others never; top-p 0.5 keeps only the most likely."""
    from ortgpu.generation import RANDOM, SAMPLING, TOP_K, with_next_token

    logits = np.array([2.0, 0.5, 1.0, -1.0, 1.5, -3.0], np.float32)
    rows = 4000
    graph = helper.make_graph(
        [helper.make_node("Expand", ["row", "shape"], ["logits"])], "choice", [],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [rows, 1, 6])],
        [onnx.numpy_helper.from_array(logits.reshape(1, 1, 6), "row"),
         onnx.numpy_helper.from_array(np.array([rows, 1, 6], np.int64), "shape")],
    )  # fmt: skip
    model = with_next_token(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:

        def choose(top_k: int, top_p: float) -> np.ndarray:
            feeds = {TOP_K: np.array([top_k], np.int64), SAMPLING: np.array([2.0, top_p], np.float32),
                     RANDOM: np.array([11, 5], np.uint32)}  # fmt: skip
            return np.asarray(session.run(["ortgpu_next_token_ids"], feeds)[0]).reshape(-1)

        counts = np.bincount(choose(4, 1.0), minlength=6)
        kept = np.argsort(-logits)[:4]
        weights = np.exp(logits[kept] / 2.0)
        shares = weights / weights.sum()
        assert counts[[i for i in range(6) if i not in kept]].sum() == 0
        spread = np.sqrt(rows * shares * (1 - shares))
        assert np.all(np.abs(counts[kept] - rows * shares) < 5 * spread), (counts, rows * shares)
        assert set(np.unique(choose(6, 0.3)).tolist()) == {0}  # the most likely alone holds 30% at temperature 2


def test_generate_refuses_bad_sampling_parameters(env: ortgpu.Env) -> None:
    with ortgpu.Generator(_genai_model(1, 1), env=env) as generator:
        prompt = np.zeros((1, 2), np.int64)
        for options in ({"top_k": 0}, {"top_k": VOCAB + 1}, {"top_p": 0.0}, {"top_p": 1.5}, {"temperature": 0.0},
                        {"seed": -1}):  # fmt: skip
            with pytest.raises(InvalidArgumentError):
                generator.generate(prompt, 3, **options)  # type: ignore[arg-type]


def test_a_generator_refuses_copy_and_pickle_and_is_cleaned_up_when_dropped(env: ortgpu.Env) -> None:
    import copy
    import gc
    import pickle

    generator = ortgpu.Generator(_genai_model(1, 1), env=env)
    for action in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(ortgpu.UnsafeAccessError):
            action(generator)
    assert len(list(generator.generate(np.zeros((1, 2), np.int64), 3))) == 3
    del generator  # no close(): its session goes with it (the env fixture checks that nothing leaked)
    gc.collect()


def test_a_greedy_step_runs_argmax_alone(env: ortgpu.Env) -> None:
    """top_k, a host value, decides the If of the next-token subgraph: a greedy plan holds ArgMax and none of the
    sampling's kernels (TopK, Softmax, CumSum, the hash), a sampling plan the reverse."""
    model = ortgpu.generation.with_next_token(_genai_model(1, 1))
    shapes = {"input_ids": [1, 1], "attention_mask": [1, MAX_LENGTH], "past_key_values.0.key": [1, KV_HEADS, MAX_LENGTH, HEAD],
              "past_key_values.0.value": [1, KV_HEADS, MAX_LENGTH, HEAD], ortgpu.generation.TOP_K: [1],
              ortgpu.generation.SAMPLING: [2], ortgpu.generation.RANDOM: [2]}  # fmt: skip
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        kinds = {}
        for top_k in (1, 4):
            placement = session.get_node_placement(shapes, {ortgpu.generation.TOP_K: np.array([top_k], np.int64)})
            kinds[top_k] = {p.op_type for p in placement if p.placement == "webgpu"}
    assert "ArgMax" in kinds[1] and not {"TopK", "Softmax", "CumSum", "BitShift"} & kinds[1]
    assert {"TopK", "Softmax", "CumSum", "BitShift"} <= kinds[4]
