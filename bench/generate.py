"""``python -m bench --generate MODEL``: token generation with :class:`ortgpu.Generator`, captured against uncaptured.

MODEL is an onnxruntime-genai model folder or ``.onnx`` file (see :mod:`ortgpu.generation`; a file whose cache
length is symbolic gets prompt + new tokens), or
``decoder-LAYERS-HIDDEN`` for a decoder built here with random seeded weights (:func:`build_decoder`: per layer Q/K/V
projections, GroupQueryAttention with rotary embeddings, an output projection and a ReLU MLP, residuals; head size
64, a quarter as many key/value heads, a vocabulary of 32000 unless smaller is asked).

For each arm (captured replays, ordinary runs), in rounds that alternate the arms: the prompt's run (prefill ms) and
each new token's step (the time from asking for a token to holding its ids on the host; decode ms per token p50 and
p99, tokens/s from the p50).  The arms must choose the same tokens, else no timings are reported.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

import ortgpu

__all__ = ["build_decoder", "parse_decoder", "measure_generation", "format_generation"]


def _parse_sized(text: str, family: str, multiple: int) -> tuple[int, int] | None:
    """``FAMILY-LAYERS-HIDDEN`` -> (layers, hidden), the hidden size a positive multiple of ``multiple``; None for
    anything else (a path)."""
    parts = text.split("-")
    if len(parts) != 3 or parts[0] != family:
        return None
    try:
        layers, hidden = int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"--generate {family}-LAYERS-HIDDEN takes two ints, not {text!r}") from None
    if layers < 1 or hidden < multiple or hidden % multiple:
        raise ValueError(f"--generate {text}: at least one layer, and a hidden size that is a multiple of {multiple}")
    return layers, hidden


def parse_decoder(text: str) -> tuple[int, int] | None:
    """``decoder-LAYERS-HIDDEN`` -> (layers, hidden); None for anything else (a path)."""
    return _parse_sized(text, "decoder", 64)


def build_decoder(
    layers: int,
    hidden: int,
    max_length: int,
    batch: int = 1,
    vocabulary: int = 32000,
    head: int = 64,
    seed: int = 0,
    positions: bool = False,
) -> onnx.ModelProto:
    """A decoder in onnxruntime-genai's static-cache layout with random seeded weights (see the module docstring);
    ``positions`` adds a ``position_ids`` input, read by a learned position embedding added to the token's."""
    rng = np.random.default_rng(seed)
    heads = hidden // head
    kv_heads = max(1, heads // 4)

    def weight(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    angles = np.arange(max_length)[:, None] * (1.0 / 10000 ** (np.arange(head // 2) / (head // 2)))[None, :]
    scale = 1.0 / np.sqrt(hidden)
    initializers = [
        weight("embed", (vocabulary, hidden), 1.0),
        weight("head", (hidden, vocabulary), scale),
        onnx.numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
        onnx.numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        onnx.numpy_helper.from_array(np.array(1, np.int64), "one"),
    ]
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["seqlens_64"]),
        helper.make_node("Cast", ["seqlens_64"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["total_64"]),
        helper.make_node("Cast", ["total_64"], ["total"], to=TensorProto.INT32),
        helper.make_node("Gather", ["embed", "input_ids"], ["x0"]),
    ]
    cache = [batch, kv_heads, max_length, head]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, max_length]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, "sequence", vocabulary])]
    x = "x0"
    if positions:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [batch, "sequence"]))
        initializers.append(weight("position_embed", (max_length, hidden), 0.5))
        nodes += [helper.make_node("Gather", ["position_embed", "position_ids"], ["pe"]),
                  helper.make_node("Add", ["x0", "pe"], ["x0p"])]  # fmt: skip
        x = "x0p"
    for layer in range(layers):
        shapes = {
            "wq": (hidden, hidden),
            "wk": (hidden, kv_heads * head),
            "wv": (hidden, kv_heads * head),
            "wo": (hidden, hidden),
            "up": (hidden, 4 * hidden),
            "down": (4 * hidden, hidden),
        }
        initializers += [weight(f"{name}{layer}", shape, 1.0 / np.sqrt(shape[0])) for name, shape in shapes.items()]
        past = [f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"]
        present = [f"present.{layer}.key", f"present.{layer}.value"]
        q, k, v, a, o, r, u, g, m = (f"{name}{layer}" for name in ("q", "k", "v", "a", "o", "r", "u", "g", "m"))
        nodes += [
            helper.make_node("MatMul", [x, f"wq{layer}"], [q]),
            helper.make_node("MatMul", [x, f"wk{layer}"], [k]),
            helper.make_node("MatMul", [x, f"wv{layer}"], [v]),
            helper.make_node(
                "GroupQueryAttention",
                [q, k, v, *past, "seqlens_k", "total", "cos", "sin"],
                [a, *present],
                domain="com.microsoft",
                num_heads=heads,
                kv_num_heads=kv_heads,
                do_rotary=1,
            ),  # fmt: skip
            helper.make_node("MatMul", [a, f"wo{layer}"], [o]),
            helper.make_node("Add", [x, o], [r]),
            helper.make_node("MatMul", [r, f"up{layer}"], [u]),
            helper.make_node("Relu", [u], [g]),
            helper.make_node("MatMul", [g, f"down{layer}"], [m]),
            helper.make_node("Add", [r, m], [f"x{layer + 1}"]),
        ]
        inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, cache) for name in past]
        outputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, cache) for name in present]
        x = f"x{layer + 1}"
    nodes.append(helper.make_node("MatMul", [x, "head"], ["logits"]))
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _one_pass(
    generator: ortgpu.Generator, prompt: np.ndarray, new_tokens: int
) -> tuple[float, list[float], np.ndarray]:
    """(prefill seconds, seconds per later token, the tokens ``[batch, new_tokens]``) of one generation."""
    steps = generator.generate(prompt, new_tokens)
    times: list[float] = []
    tokens: list[np.ndarray] = []
    start = time.perf_counter()
    for ids in steps:
        now = time.perf_counter()
        times.append(now - start)
        tokens.append(ids)
        start = time.perf_counter()
    return times[0], times[1:], np.stack(tokens, axis=1)


def measure_generation(
    model: onnx.ModelProto | str,
    prompt_length: int,
    new_tokens: int,
    batch: int,
    env: ortgpu.Env,
    rounds: int = 2,
    max_length: int | None = None,
) -> dict[str, Any]:
    """Time both arms over ``rounds`` alternating rounds (the first generation of each arm is a warm-up: it plans
    and captures); their tokens must agree."""
    arms = {"captured": True, "uncaptured": False}
    generators: dict[str, ortgpu.Generator] = {}
    for name, capture in arms.items():
        generators[name] = ortgpu.Generator(model, batch_size=batch, env=env, capture=capture, max_length=max_length)
    vocabulary = generators["captured"].vocabulary
    vocabulary = vocabulary if vocabulary < 2**62 else 2  # a vocabulary the model leaves symbolic: token ids 0 and 1
    eos = generators["captured"].eos_token_ids
    prompt = np.random.default_rng(0).integers(0, vocabulary, (batch, prompt_length)).astype(np.int64)
    results: dict[str, Any] = {name: {"prefill_ms": [], "decode_ms": []} for name in arms}
    tokens: dict[str, np.ndarray] = {}
    try:
        for name, generator in generators.items():
            _, _, tokens[name] = _one_pass(generator, prompt, new_tokens)  # warm-up: plans, pipelines, captures
        if not np.array_equal(tokens["captured"], tokens["uncaptured"]):
            raise SystemExit("--generate: the captured and uncaptured arms chose different tokens; no timings reported")
        for _ in range(rounds):
            for name, generator in generators.items():
                prefill, decode, _ = _one_pass(generator, prompt, new_tokens)
                results[name]["prefill_ms"].append(prefill * 1e3)
                results[name]["decode_ms"].extend(d * 1e3 for d in decode)
    finally:
        for generator in generators.values():
            generator.close()
    for result in results.values():
        decode_ms = np.asarray(result["decode_ms"], dtype=np.float64)
        result["summary"] = {
            "prefill_ms_p50": float(np.median(result["prefill_ms"])),
            "decode_ms_p50": float(np.median(decode_ms)),
            "decode_ms_p99": float(np.percentile(decode_ms, 99)),
            "tokens_per_s": float(batch * 1e3 / np.median(decode_ms)),
        }
    summary = {name: result["summary"] for name, result in results.items()}
    speedup = summary["uncaptured"]["decode_ms_p50"] / summary["captured"]["decode_ms_p50"]
    return {
        "arms": results,
        "summary": summary,
        "decode_speedup": speedup,
        "tokens": tokens["captured"].tolist(),
        "prompt": prompt.tolist(),
        "eos_token_ids": list(eos),
    }


def format_generation(report: dict[str, Any]) -> str:
    lines = [
        "| arm | prefill ms p50 | decode ms/token p50 | p99 | tokens/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in report["summary"].items():
        lines.append(
            f"| {name} | {row['prefill_ms_p50']:.3f} | {row['decode_ms_p50']:.3f} | {row['decode_ms_p99']:.3f} | "
            f"{row['tokens_per_s']:.1f} |"
        )
    lines.append(f"captured decode is {report['decode_speedup']:.2f}x the uncaptured one (p50 per token)")
    for name, agreement in report.get("agreement", {}).items():
        where = " (there ortgpu chose an end-of-sequence token, which the peer is held past)"
        lines.append(f"{name}: the first {agreement['equal']} of {agreement['of']} greedy tokens equal ortgpu's"
                     + (where if agreement["parted_at_eos"] else ""))  # fmt: skip
    return "\n".join(lines)


def _genai_model_file(folder: str) -> str:
    with open(os.path.join(folder, "genai_config.json"), encoding="utf-8") as handle:
        return str(json.load(handle)["model"]["decoder"]["filename"])


PEERS = ("onnxruntime-genai", "torch")


def parse_peers(text: str | None) -> list[str]:
    """``--generate-vs`` (comma-separated): onnxruntime-genai, torch."""
    peers = [p for p in (text or "").split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"--generate-vs takes {', '.join(PEERS)}, not {', '.join(unknown)}")
    return peers


def parse_llama(text: str) -> tuple[int, int] | None:
    """``llama-LAYERS-HIDDEN`` -> (layers, hidden); None for anything else."""
    return _parse_sized(text, "llama", 256)


def _agreement(ours: list[list[int]], theirs: list[list[int]], eos: list[int]) -> dict[str, Any]:
    """How many leading tokens every row of ``ours`` and ``theirs`` share, and whether ortgpu's token where they
    part is an end-of-sequence id (a peer held past it by a minimum length then necessarily chooses another)."""
    count = min(len(ours[0]), len(theirs[0]))
    for row_a, row_b in zip(ours, theirs):
        count = min(count, next((i for i, (x, y) in enumerate(zip(row_a, row_b)) if x != y), count))
    parted_at_eos = count < len(ours[0]) and any(row[count] in eos for row in ours)
    return {"equal": count, "of": len(ours[0]), "parted_at_eos": parted_at_eos}


def run_peers(report: dict[str, Any], folder: str | None, peers: list[str], args: Any) -> None:
    """Time the peers on the same prompt; their rows join ``report["summary"]``, their agreement with ortgpu's
    captured tokens (leading tokens equal) ``report["agreement"]``."""
    from .generate_peers import genai_arm, torch_arm

    prompt = np.asarray(report["prompt"], dtype=np.int64)
    report.setdefault("agreement", {})
    for peer in peers:
        if folder is None:
            raise SystemExit(f"--generate-vs {peer} needs an onnxruntime-genai model folder or llama-LAYERS-HIDDEN")
        if peer == "onnxruntime-genai":
            arms = {"onnxruntime-genai CPU": genai_arm(folder, prompt, args.new_tokens, args.rounds)}
        else:
            from .genai_build import CHECKPOINT_DIR

            checkpoint = os.path.join(folder, CHECKPOINT_DIR)
            if not os.path.isdir(checkpoint):
                raise SystemExit(f"--generate-vs torch needs the Hugging Face checkpoint the folder was built from, "
                                 f"in {checkpoint} (llama-LAYERS-HIDDEN writes one)")  # fmt: skip
            arms = {}
            for mode in ("eager", "cuda-graph"):
                try:
                    arms[f"torch {mode}"] = torch_arm(checkpoint, prompt, args.new_tokens, args.rounds, mode)
                except RuntimeError as error:  # no torch, no CUDA, a compile failure: say so, keep the other arms
                    print(f"--generate-vs torch: {error}")
                    report.setdefault("failed", {})[f"torch {mode}"] = str(error)
        for name, arm in arms.items():
            report["summary"][name] = arm["summary"]
            report["agreement"][name] = _agreement(report["tokens"], arm["tokens"], report["eos_token_ids"])


def run_generate(args: Any) -> int:
    """The ``--generate`` command (options checked by ``bench.__main__``)."""
    decoder = parse_decoder(args.generate)
    llama = parse_llama(args.generate)
    peers = parse_peers(getattr(args, "generate_vs", None))
    length = args.prompt_len + args.new_tokens
    model: onnx.ModelProto | str
    max_length: int | None = None
    folder: str | None = None
    scratch: str | None = None
    if llama is not None:
        from .genai_build import build_folder, builder_available, llama_config

        if not builder_available():
            raise SystemExit("--generate llama-LAYERS-HIDDEN builds through onnxruntime-genai's builder: it needs "
                             "onnxruntime-genai, torch and transformers importable")  # fmt: skip
        scratch = tempfile.mkdtemp(prefix="ortgpu-generate-")
        print(f"building {args.generate} with onnxruntime-genai's builder into {scratch}", flush=True)
        config = llama_config(*llama, context=max(length, 256))
        model = folder = build_folder(scratch, "llama", config)
    elif decoder is not None:
        layers, hidden = decoder
        model = build_decoder(layers, hidden, length, batch=args.batch)
    else:
        model = args.generate
        folder = model if os.path.isdir(model) else None
    if isinstance(model, str):
        path = os.path.join(model, _genai_model_file(model)) if os.path.isdir(model) else model
        header = onnx.load(path, load_external_data=False)
        parameters = sum(int(np.prod(t.dims)) for t in header.graph.initializer)
        mask = next((v for v in header.graph.input if v.name == "attention_mask"), None)
        fixed = mask is not None and mask.type.tensor_type.shape.dim[-1].HasField("dim_value")
        max_length = None if fixed else length  # the cache as long as the run needs, as the peers hold it
    else:
        parameters = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    env = ortgpu.Env(backend=args.backend)
    try:
        device = env.default_device
        print(f"adapter: {device.name} ({device.backend_type}), driver {device.driver}")
        print(f"model: {args.generate}, {parameters / 1e6:.1f} M parameters (4-bit ones counted as bytes); prompt "
              f"{args.prompt_len}, {args.new_tokens} new tokens, batch {args.batch}")  # fmt: skip
        report = measure_generation(model, args.prompt_len, args.new_tokens, args.batch, env, args.rounds, max_length)
    finally:
        env.close()
    try:
        run_peers(report, folder, peers, args)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(format_generation(report))
    if args.json_path:
        with open(args.json_path, "w") as handle:
            kept = {k: v for k, v in report.items() if k not in ("tokens", "prompt")}
            json.dump({"model": args.generate, **kept}, handle, indent=1)
    return 2 if report.get("failed") else 0
