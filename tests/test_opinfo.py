"""A curated subset of the OpInfo sweep (tools/opinfo_sweep.py), forward and backward: the ops
whose cases found bugs, and a spread of the rest (pointwise unary and binary, reductions, views
and indexing, normalization, losses, matrix products). Each case is one of an OpInfo's sample
inputs (the sweep's choice: fresh random values, non-contiguous, broadcast, 0-dim and empty
tensors among them), compiled with minicompile and compared with eager: results, inputs after
the call, and gradients for a random cotangent. Parametrized by op, dtype, pass and sample, so
a failure names them; `python tools/opinfo_sweep.py --ops NAME` runs more of that op's cases.
"""
import os
import sys

import pytest
import torch

import minicompile
from conftest import DEVICE, HAS_TRITON

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import opinfo_sweep  # noqa: E402

F32, F16, BF16, F64, I64, B = "float32", "float16", "bfloat16", "float64", "int64", "bool"

# (op, dtype, pass, sample index, expected outcome): the first ones found bugs
CASES = [
    ("copysign", F32, "bwd", 0, "ok"),              # the sign source's gradient is zeros, not None
    ("sgn", F64, "bwd", 0, "ok"),
    ("native_layer_norm", F32, "bwd", 19, "ok"),    # empty input: its gradient is an empty tensor
    ("native_batch_norm", F32, "fwd", 0, "ok"),     # running statistics written
    ("nn.functional.instance_norm", F32, "fwd", 2, "ok"),
    ("angle", F32, "bwd", 0, "ok"),                 # a gradient that reads no tangent
    ("linalg.det", F32, "bwd", 0, "ok"),
    ("softmax", F32, "fwd", 6, "ok"),               # a 0-dim input's dim 0
    ("log_softmax", F32, "fwd", 6, "ok"),
    ("softmax", F32, "fwd", 5, "ok"),               # a dim of size 0: PyTorch's kernel
    ("nn.functional.embedding_bag", F32, "bwd", 9, "ok"),  # strided indices: the traced copy
    ("var.unbiased", F32, "fwd", 1, "ok"),          # var(x, unbiased)
    ("std.unbiased", F32, "fwd", 3, "ok"),
    ("svd_lowrank", F32, "bwd", 15, "break"),       # it sets the seed: PyTorch's kernels run it
    ("nn.functional.hardsigmoid", F64, "fwd", 0, "ok"),    # float64 constants
    ("nn.functional.hardswish", F64, "fwd", 0, "ok"),
    # a spread of the rest
    ("add", F32, "bwd", 10, "ok"),
    ("mul", BF16, "fwd", 0, "ok"),
    ("div.no_rounding_mode", F32, "bwd", 6, "ok"),      # broadcast both ways
    ("remainder", I64, "fwd", 0, "ok"),
    ("where", F32, "bwd", 3, "ok"),
    ("clamp", F16, "fwd", 0, "ok"),
    ("exp", F32, "bwd", 1, "ok"),                       # empty
    ("nn.functional.gelu", F32, "bwd", 1, "ok"),
    ("logical_and", B, "fwd", 0, "ok"),
    ("sum", F32, "bwd", 12, "ok"),                      # dims (0, -1), kept
    ("amax", F32, "fwd", 12, "ok"),
    ("argmax", I64, "fwd", 8, "ok"),
    ("cumsum", F32, "bwd", 1, "ok"),
    ("permute", F32, "bwd", 1, "ok"),                   # negative dims
    ("reshape", F32, "bwd", 2, "ok"),
    ("index_select", F32, "bwd", 2, "ok"),
    ("gather", F32, "bwd", 2, "ok"),
    ("cat", F32, "bwd", 3, "ok"),
    ("stack", F32, "bwd", 2, "ok"),
    ("nn.functional.layer_norm", F32, "bwd", 0, "ok"),
    ("nn.functional.batch_norm", F32, "bwd", 0, "ok"),  # training, running statistics
    ("nn.functional.cross_entropy", F32, "bwd", 14, "ok"),     # class weights
    ("nn.functional.mse_loss", F32, "bwd", 4, "ok"),
    ("matmul", F32, "bwd", 11, "ok"),                   # batched
    ("addmm", F32, "bwd", 3, "ok"),                     # a 0-dim bias
    ("nn.functional.linear", F32, "bwd", 3, "ok"),
]
# Triton kernels (through the interpreter on a CPU: slow) for a few of them
TRITON = {"softmax", "var.unbiased", "nn.functional.hardswish", "copysign", "sum", "cat"}


pytestmark = pytest.mark.opinfo


@pytest.fixture(scope="module")
def ops():
    return dict(opinfo_sweep.select_ops())


def _params():
    # (CPU tensors: on a GPU machine, Triton's interpreter is off, so C++ only)
    triton = HAS_TRITON and DEVICE == "cpu"
    for case in CASES:
        name, dtype, kind, index, _ = case
        for backend in ["cpp"] + (["triton"] if triton and name in TRITON else []):
            yield pytest.param(*case, backend, id=f"{name}-{dtype}-{kind}-{index}-{backend}")


@pytest.mark.parametrize("name, dtype, kind, index, expected, backend", list(_params()))
def test_opinfo_case_as_eager(ops, name, dtype, kind, index, expected, backend):
    minicompile.config.cpu_backend = backend
    op, grad = ops[name], kind == "bwd"
    samples = dict(opinfo_sweep.samples_of(op, getattr(torch, dtype), grad, 40))
    if index not in samples:        # the cases were picked from the samples of the torch pinned here
        pytest.skip(f"torch {torch.__version__}'s OpInfo gives {name} no sample {index}")
    result = opinfo_sweep.run_case(op, samples[index], grad)
    assert result["outcome"] == expected, result
