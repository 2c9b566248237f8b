"""Whole models: ONNX in, fused workloads out, a compiled model that runs them.

    graph = from_onnx("resnet18.onnx", input_shapes={"input": (1, 3, 224, 224)})
    module = build_model(graph, target=None, records=None)
    (logits,) = module.run(input=x)

ONNX → graph IR with static shapes (onnx_import.py) → constant and BatchNormalization folding
(passes.py) → fusion into groups (fuse.py) → each group a workload built from the compiler's
tensor functions (workloads.py) → kernels from the records or the default schedules, a memory
plan, a step list (runtime.py, plan.py); export_model.py writes a built model as one shared
library with a C API. Only onnx_import.py imports `onnx`, on first use.
"""

from __future__ import annotations

from .dynamic import ShapeSpecializedModel, compile_onnx
from .errors import DynamicShapeError, GraphError, InputError, NotOnnxError, ShapeError, UnsupportedModelError
from .export_model import ExportedModel, export_model
from .fuse import FusedGroup, fuse
from .ir import Graph, Node, Value
from .onnx_import import from_onnx
from .runtime import GraphModule, ModelTask, build_model, extract_tasks
from .workloads import GroupKernel, lower_group

__all__ = ["from_onnx", "build_model", "compile_onnx", "ShapeSpecializedModel", "extract_tasks", "export_model",
           "ExportedModel", "fuse", "lower_group", "Graph", "Node", "Value", "GraphModule", "ModelTask", "FusedGroup",
           "GroupKernel", "GraphError", "NotOnnxError", "UnsupportedModelError", "DynamicShapeError", "ShapeError",
           "InputError"]
