"""The PyTorch side of ``python -m bench --vs torch``: build an architecture, export it, and time it eager and as a
CUDA graph, at the boundary of ortgpu's captured ``end_to_end`` arm.

One step of either arm: every input copied (``non_blocking=True``) from a pinned host tensor into a static CUDA
tensor, the model (eager: ``module(*inputs)`` under ``torch.inference_mode()``; graph: ``graph.replay()``), the
output copied (``non_blocking=True``) into a pinned host tensor, then ``torch.cuda.synchronize()``. Settings: TF32
off (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``, float32 matmul precision
``"highest"``), ``torch.backends.cudnn.benchmark = True``.

The CUDA graph: three warm-up calls on a side stream, then ``torch.cuda.graph`` capture of the plain module; where
that fails (transformers models copy host tensors to the device in their forward, which capture refuses unless the
host tensor is pinned) the module made by ``torch.export.export(module, inputs).module()`` (the same weights, the
same operations, host constants already on the device) is captured instead; ``graph_mode`` says which.

:class:`TorchSide` runs in the bench's process (``--torch-process same``); ``python -m bench.torch_arms`` serves
the same calls to :class:`ChildTorch` over its standard input and output (``--torch-process child``): pickled
``(command, kwargs)`` in, ``("ok", value)`` or ``("error", traceback)`` out; anything the child prints goes to its
standard error. This module imports neither ortgpu nor (until called) torch.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy.typing as npt

__all__ = ["TorchSide", "ChildTorch", "TorchSideError", "configure", "torch_versions", "serve"]

#: Untimed calls on the side stream before capture (cudnn.benchmark picks its algorithms during these).
CAPTURE_WARMUP = 3


class TorchSideError(RuntimeError):
    """An unexpected error on the torch side (in a child process: its traceback is the message)."""


def configure(torch: Any) -> dict[str, Any]:
    """TF32 off everywhere, cudnn.benchmark on; returns the settings as read back."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = True
    return {
        "cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
        "cudnn.benchmark": bool(torch.backends.cudnn.benchmark),
    }


def torch_versions(torch: Any) -> dict[str, str]:
    """torch, CUDA, cuDNN and the GPU, and the versions of torchvision, timm and transformers where installed."""
    versions = {"torch": str(torch.__version__), "torch CUDA": str(torch.version.cuda)}
    try:
        versions["cuDNN"] = str(torch.backends.cudnn.version())
    except Exception:  # no cuDNN in this build
        pass
    if torch.cuda.is_available():
        versions["torch device"] = str(torch.cuda.get_device_name())
    for name in ("torchvision", "timm", "transformers", "onnx"):
        try:
            versions[name] = str(importlib.import_module(name).__version__)
        except Exception:  # not installed: its architectures are not asked for
            pass
    return versions


def _time_loop(step: Callable[[], object], warmup: int, iterations: int) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def _error_text(error: BaseException) -> str:
    """The error's type and the first line of its message, and those of the error it arose from, if any (a failed
    capture's own error is often about the capture's end; what broke it comes first in the chain)."""
    texts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(texts) < 3:
        lines = str(current).strip().splitlines()
        texts.append(f"{type(current).__name__}: {lines[0] if lines else ''}")
        current = current.__cause__ or current.__context__
    return " (from ".join(texts) + ")" * (len(texts) - 1)


def _eager_output(torch: Any, module: Any, inputs: list[Any], device: str) -> npt.NDArray[Any]:
    """``module(*inputs)`` once on ``device`` (the module is moved there and stays), as a host array."""
    module.to(device)
    with torch.inference_mode():
        output = module(*[t.to(device) for t in inputs])
    result: npt.NDArray[Any] = output.cpu().numpy().copy()
    return result


class _Arms:
    """Static device tensors, pinned host tensors, the eager step and (once captured) the graph step."""

    def __init__(self, torch: Any, module: Any, inputs: list[Any], device: str) -> None:
        self.torch = torch
        self.cuda = device == "cuda"
        self.module = module.to(device).eval()
        self.host_inputs = [t.pin_memory() if self.cuda else t.clone() for t in inputs]
        self.device_inputs = [t.to(device) for t in inputs]
        with torch.inference_mode():
            out = self.module(*self.device_inputs)
        self.host_output = torch.empty(out.shape, dtype=out.dtype, pin_memory=self.cuda)
        self.graph: Any = None
        self.graph_output: Any = None

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _copy_in(self) -> None:
        for device_tensor, host_tensor in zip(self.device_inputs, self.host_inputs):
            device_tensor.copy_(host_tensor, non_blocking=True)

    def eager(self) -> Any:
        self._copy_in()
        with self.torch.inference_mode():
            out = self.module(*self.device_inputs)
        self.host_output.copy_(out, non_blocking=True)
        self._sync()
        return self.host_output

    def replay(self) -> Any:
        self._copy_in()
        self.graph.replay()
        self.host_output.copy_(self.graph_output, non_blocking=True)
        self._sync()
        return self.host_output

    def capture(self, module: Any) -> None:
        """Capture ``module`` over the static inputs (warm-up on a side stream first)."""
        torch = self.torch
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(CAPTURE_WARMUP):
                module(*self.device_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        original = torch.cuda.current_stream()
        try:
            with torch.inference_mode(), torch.cuda.graph(graph):
                output = module(*self.device_inputs)
        except BaseException:
            # torch.cuda.graph leaves its capture stream current when ending the capture raises: undo that, so the
            # next attempt and the eager arm run on the stream they would have run on.
            torch.cuda.set_stream(original)
            raise
        torch.cuda.synchronize()
        self.graph, self.graph_output = graph, output


class TorchSide:
    """The torch side in this process: :meth:`prepare` a model, then :meth:`outputs` and :meth:`time` its arms."""

    def __init__(self) -> None:
        self._arms: _Arms | None = None

    def prepare(
        self,
        name: str,
        batch: int,
        seed: int,
        exporter: str,
        opset: int,
        onnx_path: str,
        device: str = "cuda",
        dtype: str = "float32",
    ) -> dict[str, Any]:
        """Build ``name``, export it to ``onnx_path``, set up its arms on ``device``. Returns what happened:
        ``build_error`` or ``export_error`` (a model that could not be had; nothing else then), else ``exporter``,
        ``inputs`` (name -> array: what ortgpu is fed), ``graph_mode`` (``"plain module"``, ``"torch.export
        module"``, or None with ``graph_errors``), plus ``settings``, ``versions`` and ``notes``.

        ``dtype="float16"``: the float32 module's eager output on ``device`` is kept first (``fp32_outputs``, the
        reference half precision is judged against), then the module and its floating-point inputs become float16
        (``module.half()``), and that module is what is exported and timed."""
        from .architectures import build_architecture, export_onnx, to_half

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from configuration classes: nothing to fetch
        torch = importlib.import_module("torch")
        if dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be float32 or float16, not {dtype!r}")
        info: dict[str, Any] = {"settings": configure(torch), "versions": torch_versions(torch)}
        info["settings"]["dtype"] = dtype
        if device == "cuda" and not torch.cuda.is_available():
            raise TorchSideError("torch sees no CUDA device (use --torch-device cpu only to check the pipeline)")
        try:
            built = build_architecture(name, batch, seed)
            if dtype == "float16":
                info["fp32_outputs"] = [_eager_output(torch, built.module, list(built.inputs.values()), device)]
                built = to_half(built, device)
        except Exception as error:
            info["build_error"] = _error_text(error)
            info["build_traceback"] = traceback.format_exc()
            return info
        info["notes"] = built.notes
        info["inputs"] = {key: value.cpu().numpy().copy() for key, value in built.inputs.items()}
        try:
            info["exporter"] = export_onnx(built, onnx_path, exporter, opset)
        except Exception as error:
            info["export_error"] = _error_text(error)
            info["export_traceback"] = traceback.format_exc()
            return info
        self._arms = arms = _Arms(torch, built.module, [t.cpu() for t in built.inputs.values()], device)
        info["graph_mode"] = None
        info["graph_errors"] = {}
        if device != "cuda":
            info["graph_errors"]["plain module"] = "no CUDA graphs on the CPU"
            return info
        for mode in ("plain module", "torch.export module"):
            try:
                module = arms.module
                if mode == "torch.export module":
                    module = torch.export.export(arms.module, tuple(arms.device_inputs)).module()
                arms.capture(module)
                info["graph_mode"] = mode
                break
            except Exception as error:
                info["graph_errors"][mode] = _error_text(error)
                arms.graph = arms.graph_output = None
                try:
                    torch.cuda.synchronize()
                except Exception as sticky:  # the failed capture left the context unusable: say so, stop trying
                    info["graph_errors"]["synchronize after it"] = _error_text(sticky)
                    break
        return info

    def outputs(self, arm: str) -> list[npt.NDArray[Any]]:
        """One step of ``arm`` (``"eager"`` or ``"graph"``): its output, copied to a new array."""
        return [self._step(arm)().numpy().copy()]

    def time(self, arm: str, warmup: int, iterations: int) -> list[float]:
        """``warmup`` untimed steps of ``arm``, then ``iterations`` timed ones (seconds each)."""
        return _time_loop(self._step(arm), warmup, iterations)

    def _step(self, arm: str) -> Callable[[], Any]:
        if self._arms is None:
            raise TorchSideError("no model prepared")
        if arm == "graph":
            if self._arms.graph is None:
                raise TorchSideError("no CUDA graph was captured")
            return self._arms.replay
        if arm != "eager":
            raise ValueError(f"arm must be eager or graph, not {arm!r}")
        return self._arms.eager

    def close(self) -> None:
        self._arms = None


class ChildTorch:
    """The same calls as :class:`TorchSide`, served by ``python -m bench.torch_arms`` in a child process."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parent.parent
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.torch_arms"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root
        )

    def _call(self, command: str, **kwargs: Any) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            pickle.dump((command, kwargs), self.process.stdin)
            self.process.stdin.flush()
            status, value = pickle.load(self.process.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError) as error:
            code = self.process.wait()
            raise TorchSideError(f"the torch child process ended (exit code {code}) during {command}") from error
        if status == "error":
            raise TorchSideError(value)
        return value

    def prepare(
        self,
        name: str,
        batch: int,
        seed: int,
        exporter: str,
        opset: int,
        onnx_path: str,
        device: str = "cuda",
        dtype: str = "float32",
    ) -> dict[str, Any]:
        return dict(
            self._call(
                "prepare",
                name=name,
                batch=batch,
                seed=seed,
                exporter=exporter,
                opset=opset,
                onnx_path=onnx_path,
                device=device,
                dtype=dtype,
            )
        )

    def outputs(self, arm: str) -> list[npt.NDArray[Any]]:
        return list(self._call("outputs", arm=arm))

    def time(self, arm: str, warmup: int, iterations: int) -> list[float]:
        return list(self._call("time", arm=arm, warmup=warmup, iterations=iterations))

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._call("close")
            except TorchSideError:
                pass
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Answer pickled ``(command, kwargs)`` requests with a :class:`TorchSide` until ``close`` or end of input."""
    side = TorchSide()
    while True:
        try:
            command, kwargs = pickle.load(requests)
        except EOFError:
            return
        try:
            if command not in ("prepare", "outputs", "time", "close"):
                raise ValueError(f"unknown command {command!r}")
            reply: tuple[str, Any] = ("ok", getattr(side, command)(**kwargs))
        except BaseException:
            reply = ("error", traceback.format_exc())
        pickle.dump(reply, replies)
        replies.flush()
        if command == "close":
            return


def _main() -> None:
    # The protocol keeps the real standard output; everything printed (by Python or by libraries) goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    _main()
