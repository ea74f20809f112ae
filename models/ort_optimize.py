#!/usr/bin/env python3
"""Writes tests/data/contrib/bert_ortopt.onnx: the committed Optimum BERT
export (tests/data/whole/bert_optimum.onnx, two layers, hidden 64, 4 heads)
passed through ONNX Runtime's transformer optimizer, as deployment
pipelines do, which writes its contrib ops (com.microsoft):
EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu.

The optimizer imports torch, so this runs in the venv models/export_whole.py
describes (made with onnxruntime 1.32):

    /work/tv/bin/python models/ort_optimize.py
"""
import os
import sys

from onnxruntime.transformers import optimizer

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "tests", "data", "whole", "bert_optimum.onnx")
OUT = os.path.join(HERE, "..", "tests", "data", "contrib", "bert_ortopt.onnx")


def main():
    m = optimizer.optimize_model(SRC, model_type="bert", num_heads=4, hidden_size=64,
                                 opt_level=1)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    m.save_model_to_file(OUT)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
