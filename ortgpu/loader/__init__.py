"""The model loader: an ONNX file becomes checked :class:`~ortgpu.loader._model.GraphNode` records with shapes.

:mod:`._model` loads and checks a model; :mod:`._propagate` propagates shapes and folds constants (for the
planner too); :mod:`._node_inference` infers one node's outputs; :mod:`._subgraph` turns control-flow attributes
into runnable subgraphs and :mod:`._expand_control_flow` inlines them where their inputs are known;
:mod:`._limits` bounds what a hostile model may cost; :mod:`._graph_node` holds the records they share.

The loader sits above the operators (:mod:`ortgpu.ops`), which it looks up by type; the operators never import
it: what they need of it (a subgraph to run) reaches them as an :class:`ortgpu._types.SubgraphRunner` attribute.
"""
