"""Shared test set-up.

Triton's interpreter must be switched on before triton is first imported, so it is done here,
before any test module imports minicompile, on machines without a GPU.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests compile every graph afresh (some change lowering or fusion on the fly, which a graph
# cache keyed on minicompile's source would not see); tests/test_graph_cache.py turns it on.
os.environ.setdefault("MINICOMPILE_GRAPH_CACHE", "0")

import minicompile  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# cuDNN runs float32 convolutions in TF32 by default (10-bit mantissas), and a convolution that
# minicompile runs channels-last gets another algorithm than eager's contiguous one: both are
# then about 1e-3 from float32 and from each other. Tests compare float32 with float32.
torch.backends.cudnn.allow_tf32 = False


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False


HAS_TRITON = _has_triton()


@pytest.fixture(autouse=True)
def _fresh_state():
    """Every test starts with empty caches, zeroed counters, no logs and the default CPU
    backend (a log left on changes what is compiled: the fusion log turns the graph cache off)."""
    minicompile.reset()
    minicompile.metrics.reset()
    minicompile.set_logs(**{name: False for name in minicompile.logs.ARTIFACTS})
    backend = minicompile.config.cpu_backend
    yield
    minicompile.config.cpu_backend = backend


def kernel_backends():
    """The code generators a test can run here: C++ on a CPU; Triton on a GPU, or through the
    interpreter on a CPU."""
    if DEVICE == "cuda":
        return ["triton"]
    return ["cpp"] + (["triton"] if HAS_TRITON else [])


@pytest.fixture(params=kernel_backends())
def kernel_backend(request):
    """Selects the code generator for the test (on a CPU: C++ or Triton's interpreter)."""
    minicompile.config.cpu_backend = request.param
    return request.param
