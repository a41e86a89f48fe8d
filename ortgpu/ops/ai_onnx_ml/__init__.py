"""The operators of the ``ai.onnx.ml`` domain (classical machine learning: label encoding, tree ensembles,
feature transforms).  They run on the CPU through their numpy twins; the domain's opset is versioned apart from
``ai.onnx``'s, and the registry matches a class's ``since_version`` against the model's ``ai.onnx.ml`` import.
"""
