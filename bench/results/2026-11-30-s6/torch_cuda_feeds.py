"""Issue 14 on the GPU machine: torch CUDA tensors as ``run`` feeds and ``update_inplace`` sources give the same
outputs as numpy feeds, and the only route a CUDA tensor takes is ``dlpack-host-copy`` (a host copy torch makes).

Run from the checkout's root: ``python3 bench/results/2026-11-30-s6/torch_cuda_feeds.py``.
"""

from __future__ import annotations

import numpy as np
import torch  # type: ignore[import-not-found, unused-ignore]

import ortgpu
import ortgpu_core as core
from bench.models import mlp, random_feeds


def routes_ran(before: dict[str, int]) -> dict[str, int]:
    after = core.route_counts()
    return {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}


def main() -> None:
    assert torch.cuda.is_available(), "needs a CUDA device"
    model = mlp(layers=4, width=256, batch=2, seed=5)
    name = model.graph.input[0].name
    array = random_feeds(model, {name: (2, 256)})[name]
    env = ortgpu.Env(backend="wgpu")
    print("device:", env.default_device)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        expected = session.run(None, {name: array})[0]
        cuda = torch.from_numpy(array).cuda()
        before = core.route_counts()
        got = session.run(None, {name: cuda})[0]
        ran = routes_ran(before)
        print(
            "run(feeds=torch CUDA tensor): routes",
            ran,
            "max |diff| vs numpy feeds",
            float(np.abs(got - expected).max()),
        )
        assert np.array_equal(got, expected)
        value = session.allocator.empty(array.shape, array.dtype)
        before = core.route_counts()
        value.update_inplace(cuda)
        ran_update = routes_ran(before)
        print("update_inplace(torch CUDA tensor): routes", ran_update)
        assert ran_update == {"dlpack-host-copy": 1}, ran_update
        out = session.allocator.empty(expected.shape, expected.dtype)
        binding = session.io_binding()
        binding.bind_input(name, value)
        binding.bind_output(session.output_names[0], out)
        session.run_with_iobinding(binding)
        assert np.array_equal(out.to_numpy(), expected)
        print("run_with_iobinding on the value updated from CUDA: equal to numpy feeds")
        for v in (value, out):
            v.release()
    print("torch", torch.__version__, "OK")


if __name__ == "__main__":
    main()
