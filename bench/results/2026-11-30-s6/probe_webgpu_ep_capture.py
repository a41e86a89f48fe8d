"""H200, session 6: onnxruntime's WebGPU EP on the CRNN recognizer (bench lstm-ocr), plain runs and captured
replays against its CPU provider. Found: captured replays 0.75-0.78 relative error (varying from call to call),
plain runs (on the same capture session too) 1.3e-6.

Run there: PYTHONPATH=/tmp/site:$PWD python3 bench/results/2026-11-30-s6/probe_webgpu_ep_capture.py
"""

import numpy as np
import onnxruntime as ort

from bench.peer import OnnxruntimeArms
from bench.recurrent_models import crnn_recognizer


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


model = crnn_recognizer()
feeds = {"image": np.random.default_rng(1).standard_normal((1, 1, 32, 128)).astype(np.float32)}
want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
for capture in (False, True):
    peer = OnnxruntimeArms(model, feeds, capture=capture)
    errors = [relative(peer.end_to_end()[0], want) for _ in range(4)]
    print("capture", capture, peer.provider, errors)
    plain = ort.RunOptions()
    plain.add_run_config_entry("gpu_graph_id", "-1")
    print("  plain run on that session", relative(peer.session.run(None, feeds, plain)[0], want))
