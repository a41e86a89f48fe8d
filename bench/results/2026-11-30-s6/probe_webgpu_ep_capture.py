import numpy as np, onnx, onnxruntime as ort
from bench.recurrent_models import crnn_recognizer
from bench.peer import OnnxruntimeArms
mb = crnn_recognizer()
feeds = {"image": np.random.default_rng(1).standard_normal((1, 1, 32, 128)).astype(np.float32)}
want = ort.InferenceSession(mb, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
for capture in (False, True):
    p = OnnxruntimeArms(mb, feeds, capture=capture)
    errs = []
    for i in range(4):
        got = p.end_to_end()[0]
        errs.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    print("capture", capture, p.provider, errs)
    # a plain run on the capture session
    o = ort.RunOptions(); o.add_run_config_entry("gpu_graph_id", "-1")
    got = p.session.run(None, feeds, o)[0]
    print("  plain run on it", float(np.linalg.norm(got - want) / np.linalg.norm(want)))
