"""One device value bound as an input and as an output of the same run.

Allowed only for an operator's declared in-place pair whose input the model's plan reads before it first writes the
output (no dispatch does both): a GroupQueryAttention KV cache read as the past and written as the present, the way
an LLM's decode loop keeps its cache in fixed buffers.  Elsewhere the run (or capture) is refused with a typed error
naming the pair, and nothing changes, even where the plan would happen to read first (an accidental binding would
otherwise feed each replay its previous output); two outputs bound to one value are refused too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from test_contrib_attention import GH, GKV, _gqa

import ortgpu
from ortgpu_core import CaptureStateError, InvalidArgumentError, ShapeError

X = np.arange(4, dtype=np.float32)


def _elementwise_model(outputs: int = 1) -> bytes:
    nodes = [helper.make_node("Add", ["x", "one"], ["y"])]
    if outputs == 2:
        nodes.append(helper.make_node("Mul", ["x", "one"], ["z"]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("y", "z")[:outputs]],
        [onnx.numpy_helper.from_array(np.full(4, 2, np.float32), "one")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_an_input_bound_as_the_output_of_a_kernel_that_reads_it_is_refused(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(_elementwise_model(), env=env, graph_capture=True) as session:
        value = session.allocator.from_numpy(X)
        binding = session.io_binding()
        binding.bind_input("x", value)
        binding.bind_output("y", value)
        with pytest.raises(
            InvalidArgumentError, match="input 'x' and output 'y': one value bound both as an input and as an output"
        ):
            session.run_with_iobinding(binding, ortgpu.RunOptions(gpu_graph_id=-1))
        with pytest.raises(CaptureStateError, match="input 'x' and output 'y'"):
            session.capture(binding)
        np.testing.assert_array_equal(value.to_numpy(), X)  # nothing ran
        assert binding.captured_by == ()
        value.release()


def test_two_outputs_bound_to_one_value_are_refused(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(_elementwise_model(2), env=env) as session:
        x, out = session.allocator.from_numpy(X), session.allocator.empty((4,), np.float32)
        binding = session.io_binding()
        binding.bind_input("x", x)
        binding.bind_output("y", out)
        binding.bind_output("z", out)
        with pytest.raises(InvalidArgumentError, match="outputs 'y' and 'z' are bound to the same value"):
            session.run_with_iobinding(binding)
        x.release()
        out.release()


# -- a KV cache updated in place ----------------------------------------------------------------------------------

#: The cache's length (onnxruntime-genai's max_length): past and present share one buffer of it.
CACHE = 8


def _step_feeds(rng: np.random.Generator, batch: int, lengths: list[int]) -> dict[str, np.ndarray]:
    """One decode step's new query/key/value and seqlens_k (each batch's length so far minus one)."""
    return {
        "q": rng.standard_normal((batch, 1, 4 * GH)).astype(np.float32),
        "k": rng.standard_normal((batch, 1, GKV * GH)).astype(np.float32),
        "v": rng.standard_normal((batch, 1, GKV * GH)).astype(np.float32),
        "seqlens": np.array(lengths, np.int32),
    }


def _onnxruntime(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, feeds)]


@pytest.mark.parametrize("verify", [False, True], ids=["replay", "verify"])
def test_a_kv_cache_read_as_the_past_and_written_as_the_present_in_place(env: ortgpu.Env, verify: bool) -> None:
    """Decode steps with past_key/present_key (and the values) bound to one value each: first uncaptured, then as
    replays of one captured graph; every step's output and cache equal onnxruntime's on separate buffers."""
    model, feeds = _gqa([2, 1], past=CACHE, total=CACHE, rotary=True, seed=3)
    batch = len(feeds["seqlens"])
    rng = np.random.default_rng(4)
    caches = {"pk": feeds["pk"].copy(), "pv": feeds["pv"].copy()}
    with ortgpu.InferenceSession(model, env=env, graph_capture=True) as session:
        allocator = session.allocator
        # total_sequence_length decides the plan (the present's length): a capture re-reads it before each replay
        values: dict[str, Any] = {name: allocator.from_numpy(array) for name, array in feeds.items()}
        binding = session.io_binding()
        for name, value in values.items():
            binding.bind_input(name, value)
        y = allocator.empty((batch, 1, 4 * GH), np.float32)
        binding.bind_output("y", y)
        binding.bind_output("present_key", values["pk"])
        binding.bind_output("present_value", values["pv"])
        graph = None
        for step in range(4):
            new = _step_feeds(rng, batch, [2 + step, 1 + step])
            for name, array in new.items():
                values[name].update_inplace(array)
            expected = _onnxruntime(model, {**feeds, **new, **caches})
            if step < 2:
                session.run_with_iobinding(binding, ortgpu.RunOptions(gpu_graph_id=-1))
            else:
                if graph is None:
                    graph = session.capture(binding)
                else:
                    graph.replay(verify=verify)
            np.testing.assert_allclose(y.to_numpy(), expected[0], rtol=1e-4, atol=1e-5)
            for name, want in zip(("pk", "pv"), expected[1:]):
                np.testing.assert_allclose(values[name].to_numpy(), want, rtol=1e-5, atol=1e-6)
                caches[name] = want
        assert graph is not None
        # the cache cannot be freed or rebound under the graph that updates it
        with pytest.raises(CaptureStateError, match="release the graph first"):
            values["pk"].release()
        with pytest.raises(CaptureStateError):
            binding.bind_output("present_key", allocator.empty(values["pk"].shape(), np.float32))
        # nor resized: a value keeps its shape, so a longer cache is a new value (refused above)
        longer = [*values["pk"].shape()[:2], values["pk"].shape()[2] + 4, values["pk"].shape()[3]]
        with pytest.raises(ShapeError, match="shape"):
            values["pk"].update_inplace(np.zeros(longer, np.float32))
        before = values["pk"].to_numpy()
        graph.replay()  # the same step again: the cache it was captured with, rewritten with the same values
        np.testing.assert_array_equal(values["pk"].to_numpy(), before)
        graph.release()
        y.release()
        for value in values.values():
            value.release()
