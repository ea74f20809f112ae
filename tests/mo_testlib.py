"""What the Python tests share: small ONNX model builders and the entry point
that CTest drives (`--cli PATH` and other paths, then unittest's own flags).
"""
import argparse
import os
import sys
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper as h, numpy_helper as nh

F = TensorProto.FLOAT


def vi(name, shape, t=F):
    return h.make_tensor_value_info(name, t, shape)


def const(name, value, dtype=np.float32):
    return nh.from_array(np.array(value, dtype=dtype), name)


def model(nodes, inputs, outputs, inits=(), opset=18):
    """A checked model of one graph at the default domain's opset."""
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def rng_weight(name, shape, seed):
    return nh.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32),
                         name)


def run_fused(path, feeds):
    """The outputs of fused model `path` in ONNX Runtime on the CPU, its
    plugin (named in its metadata) registered when it has one."""
    import onnxruntime as ort

    m = onnx.load(path, load_external_data=False)
    plugin = {p.key: p.value for p in m.metadata_props}.get("mirage.plugin")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    if plugin:
        so.register_custom_ops_library(os.path.join(os.path.dirname(path), plugin))
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def unittest_main(module_globals, paths=("cli",), verbosity=1):
    """Runs the calling module's tests. Each name in paths is a required
    option (--cli, --model, ...) whose absolute path is set as the module's
    global of that name in capitals (CLI, MODEL, ...) before the tests run;
    the other arguments go to unittest."""
    ap = argparse.ArgumentParser()
    for p in paths:
        ap.add_argument(f"--{p}", required=True)
    args, rest = ap.parse_known_args()
    for p in paths:
        module_globals[p.upper()] = os.path.abspath(getattr(args, p))
    unittest.main(argv=[sys.argv[0], *rest], verbosity=verbosity)
