"""Whole models from the book (benchmarks/models.py), compiled and compared with eager."""
import os
import sys

import pytest
import torch

import minicompile
from conftest import DEVICE
from helpers import assert_same

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import models  # noqa: E402


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt_block"])
def test_model_inference_matches_eager(kernel_backend, name):
    scale = 1 / 64 if DEVICE == "cpu" else 1 / 8
    model, x = models.model_and_input(name, DEVICE, scale=scale)
    if kernel_backend == "triton" and DEVICE == "cpu":
        x = x[:2] if name != "gpt_block" else x[:1, :32]     # the interpreter is slow
    with torch.no_grad():
        expected = model(x)
        actual = minicompile.compile(model)(x)
    assert_same(actual, expected)
    assert minicompile.metrics.graphs == 1 and minicompile.metrics.graph_breaks == 0


def test_gpt_block_kernel_count_not_above_inductor(monkeypatch):
    """The non-matmul work of a transformer block in no more kernels than torch.compile's.
    (A small product's bias is added by a kernel of its own on a GPU, to spare cuBLASLt's
    per-call heuristics, where Inductor adds it in the product: not counted here.)"""
    from torch._inductor import metrics as inductor_metrics
    from minicompile.lower import lowerings

    monkeypatch.setattr(lowerings, "BIAS_PASS_UP_TO", 0)

    model, x = models.model_and_input("gpt_block", DEVICE, scale=1 / 64)
    x = x[:, :32]
    with torch.no_grad():
        torch._dynamo.reset()
        inductor_metrics.reset()
        torch.compile(model)(x)
        inductor_kernels = inductor_metrics.generated_kernel_count
        minicompile.compile(model)(x)
    assert 0 < minicompile.metrics.kernels <= inductor_kernels, (minicompile.metrics.kernels, inductor_kernels)
