#!/usr/bin/env python3
"""Builds the bundled demo model: Y = RMSNorm(X; G) · W at tiny shapes.

Written the way exporters write it: Pow, ReduceMean, Add, Sqrt, Div, Mul and
MatMul; fp32; deterministic random weights. The full benchmark suite comes
with the model builders of the importer issue.

    .venv/bin/python models/tiny_rmsnorm_matmul.py models/tiny_rmsnorm_matmul.onnx
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TOKENS, HIDDEN, OUT = 4, 64, 32


def build():
    rng = np.random.default_rng(20261122)
    g = rng.standard_normal(HIDDEN).astype(np.float32)
    w = (rng.standard_normal((HIDDEN, OUT)) / np.sqrt(HIDDEN)).astype(np.float32)
    inits = [
        numpy_helper.from_array(g, "rms.weight"),
        numpy_helper.from_array(w, "proj.weight"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
    ]
    nodes = [
        helper.make_node("Pow", ["X", "two"], ["x_sq"], name="/rms/Pow"),
        helper.make_node("ReduceMean", ["x_sq", "last_axis"], ["mean_sq"],
                         name="/rms/ReduceMean", keepdims=1),
        helper.make_node("Add", ["mean_sq", "eps"], ["mean_eps"], name="/rms/Add"),
        helper.make_node("Sqrt", ["mean_eps"], ["rms"], name="/rms/Sqrt"),
        helper.make_node("Div", ["X", "rms"], ["normed"], name="/rms/Div"),
        helper.make_node("Mul", ["normed", "rms.weight"], ["scaled"], name="/rms/Mul"),
        helper.make_node("MatMul", ["scaled", "proj.weight"], ["Y"], name="/proj/MatMul"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_rmsnorm_matmul",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [TOKENS, HIDDEN])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [TOKENS, OUT])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              producer_name="mirage-onnx models", ir_version=8)
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    onnx.save(build(), sys.argv[1] if len(sys.argv) > 1 else "tiny_rmsnorm_matmul.onnx")
