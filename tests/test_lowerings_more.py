"""Lowerings that used to fall back to PyTorch: argmax/argmin (a reduction that keeps a
position).

Each op is compared with eager on fresh random inputs, awkward sizes and non-contiguous
layouts, for every kernel backend; each test also checks that the op is generated code (no
PyTorch fallback in the wrapper) and, where it matters, that it fuses with its neighbours.
"""

import pytest
import torch
import torch.fx

import minicompile
from conftest import DEVICE
from helpers import assert_same, randn
from minicompile.graph_compiler import compile_graph

NAN, INF = float("nan"), float("inf")


def check(fn, *args, dtype=torch.float32, kernels=None):
    """Compiled equals eager (exactly for integer results), no op fell back to PyTorch, and,
    if given, the graph is that many kernels. Returns the compiled graph."""
    expected = fn(*args)
    minicompile.metrics.reset()
    compiled = compile_graph(torch.fx.symbolic_trace(fn), list(args))
    actual = compiled(*args)
    for a, e in zip(torch.utils._pytree.tree_leaves(actual), torch.utils._pytree.tree_leaves(expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
        if e.dtype.is_floating_point:
            assert_same(a, e, dtype)
        else:
            assert torch.equal(a, e), (a, e)
    assert "no lowering" not in compiled.wrapper_source, compiled.wrapper_source
    if kernels is not None:
        assert minicompile.metrics.kernels == kernels
    return compiled


def small(kernel_backend, shape, big):
    """`big` where kernels are fast (C++, a GPU), `shape` under Triton's interpreter."""
    return big if kernel_backend == "cpp" or DEVICE == "cuda" else shape


# --------------------------------------------------------------------------- argmax / argmin

def values(dtype, *shape, layout="contiguous"):
    if dtype == torch.int64:        # few distinct values: many ties
        x = torch.randint(-3, 4, shape[::-1] if layout == "transposed" else shape, device=DEVICE)
        return x.t() if layout == "transposed" else x
    return randn(*shape, dtype=dtype, layout=layout)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_argmax_argmin(kernel_backend, op, dtype, layout):
    x = values(dtype, 7, 13, layout=layout)
    for kwargs in [{}, {"dim": 1}, {"dim": 0}, {"dim": -1, "keepdim": True}, {"dim": 0, "keepdim": True}]:
        check(lambda x: getattr(torch, op)(x, **kwargs), x)
    check(lambda x: getattr(x, op)(1) + 1, x)
    check(lambda x: getattr(x[:, 2:11:3], op)(-1), x)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin_ties_nan_inf(kernel_backend, op):
    # ties: the first position wins; NaN counts as the best value and the first NaN wins
    rows = torch.tensor([[1.0, NAN, 3.0, NAN, 3.0], [2.0, 2.0, 1.0, 2.0, 1.0], [-INF] * 5, [INF] * 5,
                         [NAN] * 5, [0.0, -1.0, 5.0, -1.0, NAN], [3.0, 3.0, 3.0, -1.0, -1.0]], device=DEVICE)
    check(lambda x: getattr(x, op)(-1), rows)
    check(lambda x: getattr(x, op)(0), rows)
    check(lambda x: getattr(x, op)(), rows)
    check(lambda x: getattr(x, op)(), rows[1:4])
    # long rows are reduced in chunks (Triton's looped reduction): ties and NaN across chunks
    long = randn(5, 17001).round()
    long[1, 7], long[1, 9000], long[2] = NAN, NAN, -INF
    long[3, 16999] = NAN
    long[4] = torch.where(long[4] > 0, 1.0, -1.0)
    check(lambda x: getattr(x, op)(-1), long)
    check(lambda x: getattr(x, op)(-1), long.half())


def test_argmax_large_non_contiguous(kernel_backend):
    x = randn(*small(kernel_backend, (183, 78), (1823, 781)), layout="transposed")
    check(lambda x: x.argmax(-1), x)
    check(lambda x: x.argmin(0), x)
    check(lambda x: torch.argmax(x), x)


def test_argmax_fuses_with_its_row_work(kernel_backend):
    # softmax's max, sum and division, then the argmax of the result: one pass over each row
    check(lambda x: torch.softmax(x * 2, -1).argmax(-1), randn(37, 53), kernels=1)
    check(lambda x: (x.relu() + 1).argmin(-1, keepdim=True) * 2, randn(37, 53), kernels=1)
