"""Typestate misuse that mypy must reject.  Each line marked with an expect comment (code in brackets) must fail with that mypy error code."""

from __future__ import annotations

import ortgpu
from ortgpu import OrtValue, WebGPU


def rebind_frozen(sess: ortgpu.InferenceSession, x: OrtValue[WebGPU]) -> None:
    frozen = sess.io_binding().freeze()
    frozen.bind_input("X", x)  # expect: [attr-defined]
    frozen.clear_binding_inputs()  # expect: [attr-defined]


def replay_a_binding(sess: ortgpu.InferenceSession) -> None:
    binding = sess.io_binding()
    binding.replay()  # expect: [attr-defined]


def raw_pointer_bind(sess: ortgpu.InferenceSession) -> None:
    binding = sess.io_binding()
    binding.bind_input("X", "webgpu", 0, "float32", [1, 4], 0xDEAD)  # expect: [arg-type]


def graph_id_must_be_int(sess: ortgpu.InferenceSession) -> None:
    sess.capture(sess.io_binding(), graph_id="0")  # expect: [arg-type]
