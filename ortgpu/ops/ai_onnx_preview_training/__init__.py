"""The operators of the ``ai.onnx.preview.training`` domain (the optimizer steps Adagrad, Adam and Momentum).
The domain has one version so far; its operators run on the CPU through their numpy twins.
"""
