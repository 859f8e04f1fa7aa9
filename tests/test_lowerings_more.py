"""Lowerings that used to fall back to PyTorch: argmax/argmin (a reduction that keeps a
position), max/min over a dim (values and indices), prod (also on Triton), cat/stack (pieces
selected by position, read under masks), split/chunk/unbind (tuples of views), training batch
norm (running statistics written back into the inputs), embedding (an indirect load, its index
checked: IndexError on a CPU, a device-side assert on a GPU). Keyword forms of the arguments
(torch.split(x, split_size_or_sections=2, dim=1)) lower like positional ones.

Each op is compared with eager on fresh random inputs, awkward sizes and non-contiguous
layouts, for every kernel backend; each test also checks that the op is generated code (no
PyTorch fallback in the wrapper) and, where it matters, that it fuses with its neighbours.
"""

import copy
import math
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import minicompile
from conftest import DEVICE, HAS_TRITON
from helpers import assert_same, randn, tolerances
from minicompile.graph_compiler import compile_graph

NAN, INF = float("nan"), float("inf")


def same_layout_copy(x):
    if not isinstance(x, torch.Tensor):
        return x
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)


def check(fn, *args, dtype=torch.float32, kernels=None):
    """Compiled equals eager (exactly for integer results), inputs included (ops that write
    them in place), no op fell back to PyTorch, and, if given, the graph is that many kernels.
    Eager and compilation get copies of the inputs. Returns the compiled graph."""
    eager_args = [same_layout_copy(a) for a in args]
    expected = fn(*eager_args)
    minicompile.metrics.reset()
    compiled = compile_graph(torch.fx.symbolic_trace(fn), [same_layout_copy(a) for a in args])
    actual = compiled(*args)
    leaves = torch.utils._pytree.tree_leaves
    for a, e in zip(leaves((actual, args)), leaves((expected, eager_args))):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
        if e.dtype.is_floating_point:
            torch.testing.assert_close(a, e, equal_nan=True, **tolerances(dtype))
        else:
            assert torch.equal(a, e), (a, e)
    assert "no lowering" not in compiled.wrapper_source, compiled.wrapper_source
    if kernels is not None:
        assert minicompile.metrics.kernels == kernels
    return compiled


def check_captured(fn, *args, dtype=torch.float32, kernels=None):
    """As check(), through minicompile's own capture (which keeps keyword arguments as
    written, where torch.fx.symbolic_trace makes some positional), and the result has eager's
    structure, named tuples included."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(compile_graph(gm, example_inputs))
        return graphs[-1]
    expected = fn(*[same_layout_copy(a) for a in args])
    minicompile.metrics.reset()
    actual = minicompile.compile(fn, fullgraph=True, backend=backend)(*args)
    assert torch.utils._pytree.tree_structure(actual) == torch.utils._pytree.tree_structure(expected)
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerances(dtype))
    for graph in graphs:
        assert "no lowering" not in graph.wrapper_source, graph.wrapper_source
    if kernels is not None:
        assert minicompile.metrics.kernels == kernels
    return graphs


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


# --------------------------------------------------------------------------- max / min over a dim

@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_max_min_over_a_dim(kernel_backend, op, dtype, layout):
    # (values, indices), in every spelling; integers have many ties
    x = values(dtype, 7, 13, layout=layout)
    check(lambda x: getattr(x, op)(1), x, dtype=dtype)
    check(lambda x: getattr(torch, op)(x, 0, True), x, dtype=dtype)
    check(lambda x: getattr(torch, op)(x, dim=-1, keepdim=True), x, dtype=dtype)
    check(lambda x: getattr(x, op)(dim=0).values * 2 + getattr(x, op)(0)[1], x, dtype=dtype)
    check(lambda x: getattr(x[:, 2:11:3], op)(-1).indices, x, dtype=dtype)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_over_a_dim_nan_inf_and_ties(kernel_backend, op):
    # values: NaN where the row holds one; indices: the first NaN, else the first best value
    rows = torch.tensor([[1.0, NAN, 3.0, NAN, 3.0], [2.0, 2.0, 1.0, 2.0, 1.0], [-INF] * 5, [INF] * 5,
                         [NAN] * 5, [0.0, -1.0, 5.0, -1.0, NAN], [3.0, 3.0, 3.0, -1.0, -1.0]], device=DEVICE)
    check(lambda x: getattr(x, op)(-1), rows)
    check(lambda x: getattr(x, op)(0, keepdim=True), rows)
    # long rows: Triton's looped reduction; a few rows of 2**16 also split the values' reduction
    for shape in [(5, 17001), (2, 2**16)]:
        long = randn(*shape).round()
        long[1, 7], long[1, 9000], long[0] = NAN, NAN, -INF
        long[-1, shape[1] - 2] = NAN
        check(lambda x: getattr(x, op)(-1), long)
        check(lambda x: getattr(x, op)(-1), long.half(), dtype=torch.float16)


def test_max_min_over_a_dim_is_one_kernel_with_its_neighbours(kernel_backend):
    check(lambda x: x.max(-1), randn(37, 53), kernels=1)
    # an item no one reads is not computed: no positions for .values, no values for [1]
    def computed(compiled):
        return [op for kernel in compiled.kernels for op in kernel.fused]
    assert computed(check(lambda x: x.max(-1).values * 2, randn(37, 53), kernels=1)) == ["max", "mul"]
    assert computed(check(lambda x: x.min(0)[1], randn(37, 53), kernels=1)) == ["argmin"]
    check(lambda x: (lambda m: (x - m.values[:, None]).exp() * m.indices[:, None])(x.max(1)), randn(37, 53),
          kernels=1)


def test_max_min_over_a_dim_through_minicompile_capture(kernel_backend):
    # the named tuple comes back as eager's (torch.return_types.min), fields by name and index
    x = randn(7, 13, layout="transposed")
    check_captured(lambda x: x.min(0), x)
    check_captured(lambda x: torch.max(x, dim=1, keepdim=True), x)
    check_captured(lambda x: (lambda v, i: v * i)(*x.max(-1)), x)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_over_a_dim_falls_back_where_argmax_does(kernel_backend, op):
    # bool values, a 0-dim tensor: left to PyTorch, still right
    b = randn(7, 13) > 0
    for fn, x in [(lambda x: getattr(x, op)(1), b), (lambda x: getattr(x, op)(0), randn(1)[0])]:
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
        assert f"no lowering for {op}" in compiled.wrapper_source
        torch.testing.assert_close(compiled(x), fn(x))
    # no rows at all (reducing a non-empty dim): an empty result
    empty = randn(3, 0)
    fn = lambda x: getattr(x, op)(0)        # noqa: E731
    torch.testing.assert_close(compile_graph(torch.fx.symbolic_trace(fn), [empty])(empty), fn(empty))


# --------------------------------------------------------------------------- prod

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_prod(kernel_backend, dtype, layout):
    if dtype == torch.int64:        # small factors of both signs, no zeros: exact, no overflow
        x = torch.randint(1, 4, (7, 13), device=DEVICE) * (torch.randint(0, 2, (7, 13), device=DEVICE) * 2 - 1)
        x = x.t().contiguous().t() if layout == "transposed" else x
    else:                           # near 1 (never 0): a product of 13 stays in range
        x = (randn(7, 13, layout=layout) * 0.2 + 1).to(dtype)
    check(lambda x: x.prod(1), x, dtype=dtype)
    check(lambda x: torch.prod(x, 0, keepdim=True), x, dtype=dtype)
    check_captured(lambda x: torch.Tensor.prod(x, dim=-1) + 1, x, dtype=dtype)
    check(lambda x: x[:, 2:11:3].prod(-1), x, dtype=dtype)
    check(lambda x: (x > 1).prod(1), x, dtype=dtype)               # bool: int64 products
    check(lambda x: x[:3, :4].prod(), x, dtype=dtype)


def test_prod_nan_inf_and_long_rows(kernel_backend):
    rows = torch.tensor([[1.5, NAN, 2.0], [INF, 0.0, 1.0], [-INF, 2.0, -1.0], [3.0, 0.5, -2.0]], device=DEVICE)
    check(lambda x: x.prod(-1), rows)
    check(lambda x: x.prod(0), rows)
    # long rows (Triton's looped reduction): factors close to 1, so the product stays finite
    long = torch.exp(randn(5, 17001) * 1e-2)
    long[2, 9000] = NAN
    check(lambda x: x.prod(-1), long)


def test_prod_fuses_with_its_row_work(kernel_backend):
    check(lambda x: (x.sigmoid() + 0.5).prod(-1) * x.sum(-1), randn(37, 53), kernels=1)


# --------------------------------------------------------------------------- cat / stack

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cat(kernel_backend, dtype):
    x, y, z = randn(7, 13, dtype=dtype), randn(7, 5, dtype=dtype, layout="transposed"), randn(7, 1, dtype=dtype)
    check(lambda x, y, z: torch.cat([x, y, z], 1), x, y, z, dtype=dtype)
    check(lambda x, y, z: torch.cat([z, x * 2, y.relu(), x], dim=-1), x, y, z, dtype=dtype)
    check(lambda x, y: torch.cat((x[:3, :7], y.t(), x[:, 2:9].t()), 0), x, y, dtype=dtype)
    check(lambda x, z: torch.cat([x, z[:1].expand(7, 2)], 1), x, z, dtype=dtype)   # one element, read by all
    a = randn(3, 4, 5, dtype=dtype, layout="strided")
    check(lambda a: torch.concat([a, a[:, :2] * 3, a], dim=1), a, dtype=dtype)
    check(lambda a: torch.cat([a.sin(), a], 2), a, dtype=dtype)
    check(lambda a: torch.cat([a], 0) + 1, a, dtype=dtype)


def test_cat_spellings_and_axis(kernel_backend):
    # torch.cat, torch.concat, torch.concatenate; dim or NumPy's axis, by keyword or position
    x, y = randn(7, 13), randn(7, 5, layout="transposed")
    for cat in (torch.cat, torch.concat, torch.concatenate):
        check(lambda x, y: cat([x, y], 1), x, y)
        check_captured(lambda x, y: cat((x, y.relu()), dim=-1) * 2, x, y, kernels=1)
        check_captured(lambda x, y: cat([x.t(), y.t()], axis=0), x, y)
        check_captured(lambda x: cat(tensors=[x, x[:2]]), x)


def test_cat_mixed_dtypes_and_empty_inputs(kernel_backend):
    x, h, i = randn(7, 13), randn(7, 3, dtype=torch.float16), torch.randint(-5, 5, (7, 4), device=DEVICE)
    check(lambda x, h: torch.cat([h, x], 1), x, h)                 # float16 and float32: float32
    check(lambda x, i: torch.cat([i, x, i], 1), x, i)              # int64 and float32: float32
    check(lambda i: torch.cat([i, i * 2], 0), i)                    # integers stay integers
    empty = torch.randn(7, 0, device=DEVICE)
    check(lambda x, e: torch.cat([e, x, e, x], 1), x, empty)
    check(lambda x, e: torch.cat([x, e]), x, torch.randn(0, device=DEVICE))   # legacy 1-D empty


def test_cat_large(kernel_backend):
    x, y = randn(*small(kernel_backend, (183, 78), (1823, 781))), randn(*small(kernel_backend, (183, 41), (1823, 411)))
    check(lambda x, y: torch.cat([x, y.exp()], 1), x, y, kernels=1)
    check(lambda x, y: torch.cat([x.t(), y.t()], 0), x, y, kernels=1)


def test_cat_fuses_with_producers_and_consumer(kernel_backend):
    x, y = randn(5, 3), randn(5, 4)
    check(lambda x, y: torch.cat([x * 2, y.relu()], 1).sum(-1), x, y, kernels=1)
    check(lambda x, y: torch.softmax(torch.cat([x, y], -1), -1), x, y, kernels=1)
    check(lambda x, y: torch.stack([x, y * 2], 0).mean(0), x, x, kernels=1)


def test_cat_loads_only_inside_each_inputs_range(kernel_backend):
    # every read of an input is guarded by the input's range: never an out-of-bounds load
    x, y = randn(6, 3), randn(6, 4)
    compiled = check(lambda x, y: torch.cat([x, y, x], 1) * 2, x, y)
    loads = [line for line in compiled.kernel_source.splitlines() if "in_ptr" in line and "=" in line]
    assert len(loads) == 3
    for line in loads:
        assert ("? in_ptr" in line) if kernel_backend == "cpp" else ("& (tmp" in line), line


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack(kernel_backend, dim):
    x, y = randn(7, 13), randn(7, 13, layout="transposed")
    check(lambda x, y: torch.stack([x, y, x * y], dim), x, y)
    check(lambda x, y: torch.stack((x.half(), y.half()), dim).float(), x, y)


# --------------------------------------------------------------------------- split / chunk / unbind

def test_split_chunk_unbind_are_views(kernel_backend):
    x = randn(7, 13, layout="transposed")
    check(lambda x: x.split(4, dim=1), x)
    check(lambda x: torch.split(x, [2, 6, 5], 1)[1] * 2, x)
    check(lambda x: x.chunk(3), x)
    check(lambda x: torch.chunk(x, 4, dim=-1)[-1].sum(0), x)
    check(lambda x: x.unbind(1)[5] + torch.unbind(x)[0][:7], x)
    check(lambda x: (lambda p: p[0] * p[1] + p[2])(x[:, :12].chunk(3, dim=1)), x)


def test_split_with_keyword_arguments(kernel_backend):
    # the method's keyword is split_size, the function's split_size_or_sections (and tensor)
    x = randn(7, 13, layout="transposed")
    check_captured(lambda x: x.split(split_size=4, dim=1), x)
    check_captured(lambda x: x.split(3, dim=0)[1] * 2, x)
    check_captured(lambda x: torch.split(x, split_size_or_sections=[2, 6, 5], dim=-1), x)
    check_captured(lambda x: torch.split(tensor=x, split_size_or_sections=5)[1].sum(0), x)
    check_captured(lambda x: torch.Tensor.split(x, split_size=[1, 12], dim=1)[0], x)


def test_split_pieces_fuse_with_their_consumers(kernel_backend):
    def f(x):
        a, b = x.chunk(2, dim=-1)
        return a * torch.sigmoid(b)                  # a gated unit: one kernel
    check(f, randn(6, 14), kernels=1)


def test_split_through_minicompile_capture(kernel_backend):
    def f(x):
        q, k, v = x.split(3, dim=1)
        rows = [t.sum() for t in x.unbind(0)]
        return q * k + v, torch.stack(rows).argmax(), torch.cat(x.chunk(3, dim=1)[::-1], 1)
    x = randn(4, 9)
    expected = f(x)
    actual = minicompile.compile(f, fullgraph=True)(x)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


# --------------------------------------------------------------------------- batch norm (training)

def channel_stats(c, dtype=torch.float32):
    """running mean, running var (positive), weight, bias"""
    return (torch.randn(c, device=DEVICE, dtype=dtype), torch.rand(c, device=DEVICE, dtype=dtype) + 0.5,
            torch.randn(c, device=DEVICE, dtype=dtype), torch.randn(c, device=DEVICE, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_batch_norm_training_updates_running_stats(kernel_backend, dtype):
    # output normalized with the batch's statistics; running stats updated in place (checked
    # by check(), which compares the inputs after the call too)
    x = randn(4, 5, 7, 6, dtype=dtype).permute(0, 3, 1, 2)          # channels last
    check(lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=True), x, *channel_stats(6), dtype=dtype)
    check(lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, True, 0.3, 1e-3).relu() + m.sum(),
          randn(9, 6, dtype=dtype), *channel_stats(6), dtype=dtype)
    check(lambda x, m, v: F.batch_norm(x[:, :, 1:], m, v, None, None, True), randn(3, 6, 12, dtype=dtype),
          *channel_stats(6, dtype)[:2], dtype=dtype)
    check(lambda x: F.batch_norm(x * 2, None, None, training=True), randn(5, 6, 4, dtype=dtype), dtype=dtype)


def test_batch_norm_training_is_two_kernels(kernel_backend):
    # statistics and both running updates in one pass over the channels; then the output
    check(lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=True), randn(4, 6, 5, 7),
          *channel_stats(6), kernels=2)


def test_batch_norm_training_twice_and_in_place_ops_on_inputs(kernel_backend):
    def f(x, m, v, w, b):
        y = F.batch_norm(x, m, v, w, b, training=True)
        m.mul_(2)                                  # in-place ops on graph inputs: written back
        z = F.batch_norm(y, m, v, None, None, training=True, momentum=0.5)
        v.add_(1)
        return z + v.sum()
    check(f, randn(4, 6, 5), *channel_stats(6))


def test_batch_norm_training_module_through_torch_compile(kernel_backend):
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(6), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.BatchNorm1d(6 * 5 * 4)).to(DEVICE).train()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=minicompile.backend)
    with torch.no_grad():
        for _ in range(2):
            x = randn(3, 6, 5, 4)
            assert_same(compiled(x), reference(x))
            for a, e in zip(model.buffers(), reference.buffers()):
                torch.testing.assert_close(a, e)
    assert model[0].num_batches_tracked.item() == 2


def test_batch_norm_training_statistics_read_by_a_view_or_computed(kernel_backend):
    """Functionalization makes the running statistics' new values plain values: a view read
    before the write, and statistics computed in the graph, are fused like the rest."""
    x, (m, v, w, b) = randn(4, 6, 5), channel_stats(6)

    def read_by_a_view(x, m, v):         # the view was read before the write: old values
        first = m[:2] * 1
        return F.batch_norm(x, m, v, training=True), first, m[2:]

    def not_inputs(x, m, v):             # running statistics computed in the graph
        return F.batch_norm(x, m * 1, v * 1, training=True)
    for f in (read_by_a_view, not_inputs):
        compiled = compile_graph(torch.fx.symbolic_trace(f), [x, m.clone(), v.clone()])
        assert "no lowering for batch_norm" not in compiled.wrapper_source
        mine, eager = [x, m.clone(), v.clone()], [x, m.clone(), v.clone()]
        torch.testing.assert_close((compiled(*mine), mine), (f(*eager), eager))

    def reads_the_other(x, m, v):        # v and m share memory: each write changes the other
        return F.batch_norm(x, m, v, training=True) + v.sum() + m.sum()
    shared = torch.rand(12, device=DEVICE) + 0.5
    with pytest.raises(NotImplementedError, match="shares memory"):   # PyTorch's kernels run it
        compile_graph(torch.fx.symbolic_trace(reads_the_other), [x, shared[:6], shared[6:]])


# --------------------------------------------------------------------------- embedding

def indices(*shape, high=10, dtype=torch.int64):
    return torch.randint(0, high, shape, device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embedding(kernel_backend, dtype):
    i, w = indices(3, 4), randn(10, 6, dtype=dtype)
    check(lambda i, w: F.embedding(i, w), i, w, dtype=dtype)
    check(lambda i, w: F.embedding(i.t(), w) * 2, i, randn(10, 6, dtype=dtype, layout="transposed"), dtype=dtype)
    check(lambda i, w: torch.embedding(w.t(), 9 - i), i, randn(6, 10, dtype=dtype), dtype=dtype)
    check(lambda i, w: F.embedding(i, w, padding_idx=0), indices(7, dtype=torch.int32), w, dtype=dtype)
    check(lambda i, w: F.embedding(i[1, 2], w[:, 1:5]), i, w, dtype=dtype)          # one index
    check(lambda i, w: torch.cat([F.embedding(i, w), w[:3, None].expand(3, 4, 6)], 1), i, w, dtype=dtype)


def test_embedding_large(kernel_backend):
    rows, dim = small(kernel_backend, (50, 78), (2000, 781))
    i, w = indices(*small(kernel_backend, (7, 13), (1823,)), high=rows), randn(rows, dim)
    check(lambda i, w: F.embedding(i, w) + 1, i, w, kernels=1)


def test_embedding_fuses_with_indices_and_consumers(kernel_backend):
    i, w = indices(5, 7), randn(10, 16)
    check(lambda i, w: F.embedding(i, w).sum(-1), i, w, kernels=1)
    check(lambda i, w: F.layer_norm(F.embedding(9 - i, w), (16,)), i, w, kernels=1)


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU a bad index is a device-side assert, as in eager")
@pytest.mark.parametrize("bad", [10, -1])
def test_embedding_index_out_of_range_raises(kernel_backend, bad):
    # C++ and Triton's interpreter (which skips device asserts): IndexError, as eager on a CPU
    i, w = indices(3, 4), randn(10, 6)
    compiled = check(lambda i, w: F.embedding(i, w).sum(-1), i, w)
    i[1, 2] = bad
    with pytest.raises(IndexError):
        F.embedding(i, w)
    with pytest.raises(IndexError):
        compiled(i, w)
    i[1, 2] = 3
    torch.testing.assert_close(compiled(i, w), F.embedding(i, w).sum(-1))


@pytest.mark.skipif(DEVICE == "cuda" or not HAS_TRITON, reason="the GPU's own test runs there")
def test_embedding_device_assert_code_runs_under_the_interpreter(monkeypatch):
    # what a GPU gets, generated here and run through the interpreter (which skips the assert
    # itself): the kernel asserts and takes no INDEX_ERRORS flag, the launch compiles it in
    # debug mode without overflow checks, the wrapper reads nothing back
    from minicompile.codegen import triton as triton_codegen
    monkeypatch.setattr(triton_codegen, "asserts_on_device", lambda device: True)
    minicompile.config.cpu_backend = "triton"
    i, w = indices(3, 4), randn(10, 6)
    compiled = check(lambda i, w: torch.cat([F.embedding(i, w), w[:3, None].expand(3, 4, 6)], 1).sum(-1), i, w)
    assert "tl.device_assert(" in compiled.kernel_source and "index_errors" not in compiled.kernel_source
    assert "debug=True, sanitize_overflow=False" in compiled.wrapper_source
    assert "index_errors" not in compiled.wrapper_source


@pytest.mark.skipif(DEVICE != "cuda", reason="device-side asserts need a GPU")
def test_embedding_index_out_of_range_asserts_on_the_gpu(kernel_backend):
    # no flag read back after the kernels (a wait for the GPU every call): the kernel asserts
    i, w = indices(3, 4), randn(10, 6)
    compiled = check(lambda i, w: F.embedding(i, w).sum(-1), i, w)
    assert "tl.device_assert" in compiled.kernel_source
    assert ".item()" not in compiled.wrapper_source and "index_errors" not in compiled.wrapper_source
    # a failed device assert leaves the process's CUDA context unusable: it is met in a child
    child = textwrap.dedent("""
        import torch, torch.fx, torch.nn.functional as F
        from minicompile.graph_compiler import compile_graph
        f = lambda i, w: F.embedding(i, w).sum(-1)
        i, w = torch.randint(0, 10, (3, 4), device="cuda"), torch.randn(10, 6, device="cuda")
        compiled = compile_graph(torch.fx.symbolic_trace(f), [i, w])
        torch.testing.assert_close(compiled(i, w), f(i, w))
        i[1, 2] = BAD
        compiled(i, w)
        torch.cuda.synchronize()
        print("no error")
    """)
    for bad in (10, -1):
        proc = subprocess.run([sys.executable, "-c", child.replace("BAD", str(bad))], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=300)
        assert proc.returncode != 0 and "no error" not in proc.stdout, proc.stdout
        # the device prints the failed assertion (each failing thread), as eager's kernels do
        assert "Assertion `index out of range in self` failed" in proc.stderr, proc.stderr[-3000:]


def test_embedding_module_and_max_norm_fallback(kernel_backend):
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.LayerNorm(8)).to(DEVICE)
    i = indices(2, 5)
    with torch.no_grad():
        assert_same(minicompile.compile(model)(i), model(i))
    assert minicompile.metrics.kernels == 1
    w = randn(10, 6)
    compiled = compile_graph(torch.fx.symbolic_trace(lambda i, w: F.embedding(i, w, max_norm=1.0)), [i, w.clone()])
    assert "no lowering for embedding" in compiled.wrapper_source


def test_batch_norm_training_called_directly_updates_the_statistics_once(kernel_backend):
    # capture runs each op on the example values: on copies for an op that writes its
    # arguments, so the running statistics change once per call (by the compiled code), as eager
    def f(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1).relu()
    x, w, b = randn(4, 3, 5, 5), randn(3), randn(3)
    rm, rv = randn(3), torch.rand(3, device=DEVICE) + 0.5
    rm_eager, rv_eager = rm.clone(), rv.clone()
    compiled = minicompile.compile(f)
    for _ in range(3):
        assert_same(compiled(x, rm, rv, w, b), f(x, rm_eager, rv_eager, w, b))
        assert_same(rm, rm_eager)
        assert_same(rv, rv_eager)
    assert minicompile.metrics.graphs == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_hardtanh_and_relu6_are_generated(kernel_backend, dtype):
    # ReLU6 (MobileNetV2's activation) is hardtanh(x, 0, 6): clamp, NaN kept; any bounds
    x = randn(3, 37, dtype=dtype) * 5
    x[0, :3] = torch.tensor([NAN, INF, -INF])
    check(lambda x: F.relu6(x) + 1, x, dtype=dtype, kernels=1)
    check(lambda x: F.hardtanh(x, -2.0, 0.5) * F.hardtanh(x.t().t()), x, dtype=dtype, kernels=1)
    check(lambda x: F.hardtanh(x.transpose(0, 1), min_val=0, max_val=6), x, dtype=dtype)


def test_relu6_modules_in_place_match_eager(kernel_backend):
    # nn.ReLU6(inplace=True), as torchvision's MobileNetV2 has it, after a convolution
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.BatchNorm2d(6), torch.nn.ReLU6(inplace=True),
                                torch.nn.Conv2d(6, 4, 1), torch.nn.ReLU6(inplace=True)).to(DEVICE).eval()
    x = randn(2, 3, 9, 11) * 4
    with torch.no_grad():
        expected = model(x)
        actual = minicompile.compile(model)(x)
    assert_same(actual, expected)


@pytest.mark.parametrize("pad, value", [((0, 1, 0, 1), None), ((1, 1, 1, 1), 2.5), ((-1, 2), 0.0),
                                        ((0, 0, 0, 0), None), ((1, 2, -2, 1, 3, 0), -1.0), ((2, 3), 7)])
def test_constant_padding_is_generated(kernel_backend, pad, value):
    # F.pad(mode="constant"): a masked load, negative amounts crop; fused with the work around it
    x = randn(2, 3, 5, 7)
    check(lambda x: F.pad(x, pad, value=value), x, kernels=1)
    check(lambda x: F.pad(F.relu6(x * 3), pad, value=value) * 2, x.transpose(1, 3), kernels=1)
    check(lambda x: torch.constant_pad_nd(x, pad, 0.5 if value is None else value), x, kernels=1)


def test_padding_in_other_dtypes(kernel_backend):
    # integer tensors with an integer value, half precision
    check(lambda x: F.pad(x, (1, 2), value=3), torch.arange(24, device=DEVICE).view(4, 6), kernels=1)
    check(lambda x: F.pad(x, (1, 0, 2, 2), value=1.5), randn(4, 6, dtype=torch.float16), dtype=torch.float16,
          kernels=1)


@pytest.mark.parametrize("mode, shape, pad", [
    ("reflect", (2, 3, 5, 7), (1, 2, 3, 4)), ("reflect", (2, 3, 9), (8, 8)), ("reflect", (2, 3, 5, 7), (2, -1, 0, 3)),
    ("replicate", (2, 3, 5, 7), (3, 0, 2, 5)), ("replicate", (2, 3, 4, 5, 6), (1, 2, -1, 3, 2, 0)),
    ("circular", (2, 3, 5, 7), (2, 7, 5, 1)), ("circular", (1, 2, 3), (3, 3))])
def test_padding_by_reflection_replication_and_wrapping_is_generated(kernel_backend, mode, shape, pad):
    # the position read is computed in the kernel (inside the input by construction: no check,
    # no index-error flag); fused with the work before and after
    compiled = check(lambda x: F.pad(x * 2, pad, mode=mode) + 1, randn(*shape), kernels=1)
    assert "index_errors" not in compiled.wrapper_source


def test_circular_padding_with_a_negative_amount_stays_pytorchs(kernel_backend):
    # it wraps around the cropped input, not the input (by at most the cropped size: PyTorch
    # checks the amount against the input's size, and past the cropped one its CUDA kernel reads
    # outside the input)
    x = randn(1, 2, 3)
    compiled = compile_graph(torch.fx.symbolic_trace(lambda x: F.pad(x, (-1, 2), mode="circular")), [x])
    torch.testing.assert_close(compiled(x), F.pad(x, (-1, 2), mode="circular"))


def test_calls_as_hugging_face_writes_them_are_lowered(kernel_backend):
    # .to(device=its own, dtype=...), flatten(start_dim=1) and squeeze(dim=...) by keyword,
    # torch.tensor of a number and of an empty list: generated, not PyTorch calls
    x = randn(3, 4, 1, 5)

    def f(x):
        mask = (x > 0).to(device=DEVICE, dtype=torch.float16)
        empty = torch.tensor([], dtype=torch.float32, device=DEVICE)
        big = torch.tensor(-3.5, dtype=torch.float64, device=DEVICE)
        return mask * 2, x.flatten(start_dim=1) + big, torch.flatten(x, start_dim=2, end_dim=3), \
            x.squeeze(dim=2), empty + 1, torch.tensor(7, device=DEVICE) * x.sum()
    check(f, x)
    check(lambda x: x.transpose(1, 3).flatten(start_dim=1).unflatten(1, sizes=(5, 4)), x)


def test_indexing_by_integer_tensors_is_generated(kernel_backend):
    # x[i] and x[i0, i1] with integer tensors (broadcast together, negative from the end), as
    # Hugging Face picks a mask's rows per batch: indices loaded in the kernel
    x = randn(4, 5, 6)
    rows, cols = torch.tensor([[0], [3], [-1]], device=DEVICE), torch.tensor([1, 4, -5, 2], device=DEVICE)
    check(lambda x, a, b: x[a, b] * 2, x, rows, cols, kernels=1)
    check(lambda x, a: x[a] + 1, x, torch.tensor([[1, -4], [3, 0]], device=DEVICE, dtype=torch.int32), kernels=1)
    check(lambda x, a, b: x.transpose(0, 2)[(a, b)], x, cols % 6, cols)
    # whole dims before and after the picked ones; tensors apart from each other stay PyTorch's
    x = randn(4, 5, 6, 3)
    check(lambda x, a, b: x[:, a, b] * 2, x, rows % 5, cols % 6, kernels=1)
    check(lambda x, a, b: x[:, :, a, b], x, rows % 6, cols % 3, kernels=1)
    compiled = compile_graph(torch.fx.symbolic_trace(lambda x, a, b: x[a, :, b]), [x, rows, cols % 6])
    torch.testing.assert_close(compiled(x, rows, cols % 6), x[rows, :, cols % 6])


def test_an_index_with_two_ellipses_as_pytorch_reads_it(kernel_backend):
    """PyTorch accepts a second `...` (numpy does not) and reads it its own way."""
    x = randn(4, 5, 3)
    check(lambda x: x[..., ::2, ...] * 2, x)
    check(lambda x: x[1, ..., 2, ...] + 1, x)


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU an index out of range is a device-side assert")
def test_indexing_by_a_tensor_out_of_range_raises(kernel_backend):
    x = randn(4, 5)
    compiled = compile_graph(torch.fx.symbolic_trace(lambda x, a: x[a]), [x, torch.tensor([1])])
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([4]))
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([-5]))


def test_gather_is_generated_and_fuses(kernel_backend):
    # torch.gather / x.gather: the index loaded in the kernel; the log-probabilities of chosen
    # tokens (log_softmax, then gather) are one kernel
    x = randn(3, 7, 5)
    check(lambda x, i: torch.gather(x, 1, i) * 2, x, torch.randint(0, 7, (3, 4, 2), device=DEVICE), kernels=1)
    check(lambda x, i: x.log_softmax(-1).gather(-1, i), x, torch.randint(0, 5, (3, 7, 1), device=DEVICE), kernels=1)
    check(lambda x, i: x.transpose(0, 2).gather(0, i), x, torch.randint(0, 5, (2, 7, 3), device=DEVICE).int())


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU an index out of range is a device-side assert")
def test_gather_out_of_range_raises_runtime_error_and_indexing_index_error(kernel_backend):
    # the exception eager raises: RuntimeError for gather, IndexError for indexing, in one graph
    x = randn(4, 5)

    def f(x, i, j):
        return torch.gather(x, 1, i), x[j]
    fine = (torch.zeros(4, 2, dtype=torch.int64), torch.tensor([1]))
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, *fine])
    for bad in (torch.full((4, 2), 5), torch.full((4, 2), -1)):
        with pytest.raises(RuntimeError):
            f(x, bad, fine[1])
        with pytest.raises(RuntimeError):
            compiled(x, bad, fine[1])
    with pytest.raises(IndexError):
        compiled(x, fine[0], torch.tensor([4]))


def test_filled_like_tensors_are_generated(kernel_backend):
    # full_like, zeros_like, ones_like: the input's sizes and layout, every element the value
    x = randn(4, 6).t()
    check(lambda x: (torch.full_like(x, 15), torch.zeros_like(x) + x, torch.ones_like(x, dtype=torch.int64),
                     torch.full_like(x, 2.5, dtype=torch.float16)), x)
    compiled = check(lambda x: torch.zeros_like(x, memory_format=torch.contiguous_format) * 2, x)
    assert compiled(x).stride() == (4, 1)
    assert compile_graph(torch.fx.symbolic_trace(lambda x: torch.full_like(x, 3)), [x])(x).stride() == (1, 6)


@pytest.fixture
def fallbacks(monkeypatch):
    """The targets of the ops lowering hands to PyTorch (extern calls) from here on."""
    import minicompile.lower as lower
    left = []
    fallback = lower.lower_fallback
    monkeypatch.setattr(lower, "lower_fallback", lambda program, node, *a, **k: left.append(
        str(node.target)) or fallback(program, node, *a, **k))
    return left


@pytest.mark.parametrize("start, end", [(None, None), (2, 5), (-3, None), (1, -1), (6, 2)])
def test_slice_scatter_is_generated(kernel_backend, start, end):
    x = randn(3, 7, 4)
    src = torch.zeros(3, 7, 4, device=DEVICE)[:, start:end].clone() + randn(3, 7, 4)[:, start:end]
    check(lambda x, s: torch.slice_scatter(x * 2, s, 1, start, end) + 1, x, src, kernels=1)
    check(lambda x, s: torch.slice_scatter(x, s.transpose(0, 2), 2, start, end),
          randn(7, 3, 7).transpose(0, 2), randn(7, 3, 7).transpose(0, 2)[:, :, start:end].transpose(0, 2))


def test_rotary_and_indexing_train_as_eager(fallbacks):
    # the gradients of slices (slice_scatter), indexing by tensors and gather are generated
    # (the scatters of the gradients of the latter two stay PyTorch's)
    x, table = randn(2, 5, 8).requires_grad_(), randn(6, 8).requires_grad_()
    rows = torch.tensor([[0, 5, 2, 2, 1]] * 2, device=DEVICE)

    def loss(x, table):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        picked = x.log_softmax(-1).gather(-1, rows[..., None] % 8)
        return ((x * 0.5 + rotated) * table[rows, :]).square().mean() - picked.mean()
    expected = torch.autograd.grad(loss(x, table), (x, table))
    actual = torch.autograd.grad(minicompile.compile(loss)(x, table), (x, table))
    for a, e in zip(actual, expected):
        assert_same(a, e)
    assert not [t for t in fallbacks if "slice_scatter" in t or "index.Tensor" in t or "gather" in t], fallbacks


def test_padding_and_relu6_train_as_eager(fallbacks):
    # the training graph's constant_pad_nd and hardtanh (a backward that crops) are generated
    w = randn(4, 3, 3, 3).requires_grad_()
    x = randn(2, 3, 9, 9)

    def loss(x, w):
        y = F.relu6(F.conv2d(F.pad(x, (0, 1, 0, 1)), w, stride=2) * 3)
        reflected = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), w)
        return F.pad(y, (1, 1, 1, 1), value=0.5).square().mean() \
            + F.pad(reflected, (2, 2, 2, 2), mode="replicate").mean()
    expected = torch.autograd.grad(loss(x, w), w)[0]
    minicompile.metrics.reset()
    actual = torch.autograd.grad(minicompile.compile(loss)(x, w), w)[0]
    assert_same(actual, expected)
    # (padding by reflection or replication is indexing by tensors in the joint graph)
    assert not [t for t in fallbacks if "constant_pad" in t or "hardtanh" in t or "index.Tensor" in t], fallbacks


def test_mobilenet_activations_and_global_pooling_are_lowered(kernel_backend):
    # hardswish, hardsigmoid and global average pooling, each without a PyTorch kernel: the
    # squeeze-and-excitation block of MobileNetV3 is one kernel (the pooled rows and their use)
    x = randn(4, 6, 5, 7) * 4
    check(lambda x: F.hardsigmoid(F.adaptive_avg_pool2d(F.hardswish(x), 1)) * F.hardswish(x), x, kernels=1)


@pytest.mark.parametrize("bias", [False, True])
def test_a_product_of_unaligned_width_is_padded(kernel_backend, monkeypatch, bias):
    # a language model's head: n = 50257 words is not a multiple of 16 bytes. Where Triton
    # kernels run, the weight gets zero rows up to an aligned width and the result is the view
    # of its first n columns; a graph output is returned in eager's (contiguous) layout
    from minicompile.lower import lowerings
    monkeypatch.setattr(lowerings, "PAD_PRODUCTS_FROM", 1)
    x, w, b = randn(2, 5, 12), randn(37, 12), randn(37)
    head = (lambda x, w, b: F.linear(x, w, b) * 2) if bias else (lambda x, w, b: F.linear(x, w))
    compiled = check(head, x, w, b)
    assert (f"empty_strided_{DEVICE}((40, 12)" in compiled.wrapper_source) == (kernel_backend == "triton")
    out = compiled(x, w, b)
    assert out.is_contiguous()
    check(lambda x, w, b: F.linear(x, w).softmax(-1), x.transpose(0, 1), w, b)


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    DEVICE == "cpu", reason="Triton's interpreter multiplies bfloat16 values' bits as integers"))])
def test_an_unaligned_product_is_written_in_eager_layout_by_minicompiles_kernel(monkeypatch, dtype):
    # with TF32 or half precision products, an unaligned head on a GPU is lower/matmul.py's
    # Triton kernel, which writes eager's contiguous layout: no padded weight, no copy. On a
    # CPU the kernel runs in Triton's interpreter, put in the GPU's place
    from minicompile.lower import lowerings, matmul
    monkeypatch.setattr(minicompile.config, "cpu_backend", "triton")
    monkeypatch.setattr(lowerings, "PAD_PRODUCTS_FROM", 1)
    if DEVICE == "cpu":
        monkeypatch.setattr(matmul, "chosen", lambda device, dtype: True)
        monkeypatch.setattr(matmul, "applies", lambda a, b: True)
    x, w = randn(3, 5, 24).to(dtype), randn(37, 24).to(dtype)
    # TF32 and bfloat16 round each operand; the two kernels sum in different orders
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True          # (monkeypatch cannot restore it)
    try:
        for args in [(x, w), (x.transpose(0, 1), w), (x[:, :, :20], w[:, 4:])]:
            compiled = compile_graph(torch.fx.symbolic_trace(lambda x, w: F.linear(x, w) * 2), list(args))
            assert "matmul.mm(" in compiled.wrapper_source and "zero-padded" not in compiled.kernel_source
            out = compiled(*args)
            assert out.is_contiguous() and out.dtype == dtype
            expected = F.linear(*(a.double() for a in args)) * 2
            assert (out.double() - expected).abs().max() <= tol * expected.abs().max()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
def test_an_unaligned_heads_backward_reads_one_padded_gradient(monkeypatch):
    # a language model's head in training: the logits' gradient (37 wide here, 50,257 in
    # GPT-2) is multiplied by the weight (k unaligned) and, transposed, by the input (m
    # unaligned). Both products read one zero-padded copy of it, written by the kernel that
    # computes it (no buffer of the unpadded gradient); gradients as eager's
    from minicompile.lower import lowerings
    monkeypatch.setattr(minicompile.config, "cpu_backend", "triton")
    monkeypatch.setattr(lowerings, "PAD_PRODUCTS_FROM", 1)
    x, w = randn(3, 4, 24).requires_grad_(), randn(37, 24).requires_grad_()

    def head(x, w):
        return (F.linear(x, w) * 1.5).square().mean()
    compiled = compile_graph(torch.fx.symbolic_trace(head), [x, w], training=True)
    backward = compiled.backward.wrapper_source
    assert backward.count("torch.mm(") == 2 and "(12, 40)" in backward, backward
    assert "(12, 37)" not in backward and "(37, 12)" not in backward, backward
    actual = torch.autograd.grad(compiled(x, w), (x, w))
    expected = torch.autograd.grad(head(x, w), (x, w))
    for a, e in zip(actual, expected):
        assert_same(a, e)


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
@pytest.mark.parametrize("case", ["a.t() @ b", "a @ b.t()", "a.t() @ b.t()", "permute", "transpose", "square"])
def test_unaligned_products_of_transposes_are_padded_as_eager(monkeypatch, case):
    # every operand layout: a transpose is padded untransposed, then viewed transposed
    from minicompile.lower import lowerings
    monkeypatch.setattr(minicompile.config, "cpu_backend", "triton")
    monkeypatch.setattr(lowerings, "PAD_PRODUCTS_FROM", 1)
    fns = {"a.t() @ b": (lambda a, b: torch.mm(a.t(), b * 2), (10, 37), (10, 21)),
           "a @ b.t()": (lambda a, b: torch.mm(a + 1, b.t()), (13, 37), (21, 37)),
           "a.t() @ b.t()": (lambda a, b: torch.mm(a.t(), b.t()).relu(), (37, 13), (21, 37)),
           "permute": (lambda a, b: torch.mm(a.permute(1, 0), b), (10, 37), (10, 21)),
           "transpose": (lambda a, b: torch.mm(a.transpose(-1, -2), b), (10, 37), (10, 21)),
           "square": (lambda a, b: torch.mm(a.transpose(0, 0) * 2, b), (5, 5), (5, 7))}
    fn, a_shape, b_shape = fns[case]
    a, b = randn(*a_shape), randn(*b_shape)
    compiled = compile_graph(torch.fx.symbolic_trace(fn), [a, b])
    assert compiled.wrapper_source.count("torch.mm(") == 1, compiled.wrapper_source
    assert_same(compiled(a, b), fn(a, b))


def test_the_unaligned_product_kernel_is_compiled_while_the_graphs_kernels_are(monkeypatch):
    # the wrapper hands each such product's sizes and strides to matmul.compile_ahead, which
    # compile_all runs while its workers compile (here: none to compile), errors left to the
    # first launch
    from minicompile.codegen import triton as triton_codegen, wrapper
    from minicompile.lower import lowerings, matmul
    seen = []
    monkeypatch.setattr(minicompile.config, "cpu_backend", "triton")
    monkeypatch.setattr(lowerings, "PAD_PRODUCTS_FROM", 1)
    monkeypatch.setattr(matmul, "chosen", lambda device, dtype: True)
    namespace = wrapper._namespace
    monkeypatch.setattr(wrapper, "_namespace", lambda *args: seen.append(args[5]) or namespace(*args))
    x, w = randn(3, 5, 24), randn(37, 24)
    compile_graph(torch.fx.symbolic_trace(lambda x, w: F.linear(x, w)), [x, w])
    assert seen == [[(torch.float32, x.device, (15, 24, 37), (24, 1), (1, 24))]]
    ran = []
    triton_codegen.compile_all([], meanwhile=lambda: ran.append(1))
    triton_codegen.compile_all([], meanwhile=lambda: 1 / 0)
    assert ran == [1]


def test_the_unaligned_product_kernel_is_for_gpus_with_tf32_tensor_cores(monkeypatch):
    # on a T4 (compute capability 7.5, Colab's free GPU) the padded product stays
    from minicompile.lower import matmul
    cuda = torch.device("cuda", 0)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True          # (monkeypatch cannot restore it)
    try:
        for capability, expected in [((7, 5), False), ((8, 0), True), ((9, 0), True)]:
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
            assert matmul.chosen(cuda, torch.float32) == expected
            assert matmul.chosen(cuda, torch.bfloat16) == expected
        assert not matmul.chosen(torch.device("cpu"), torch.float32)
        torch.backends.cuda.matmul.allow_tf32 = False
        assert not matmul.chosen(cuda, torch.float32) and matmul.chosen(cuda, torch.float16)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
@pytest.mark.parametrize("descriptors", [False, True])
def test_the_unaligned_product_kernel_on_awkward_sizes(descriptors):
    # the kernel alone, both ways of reading the operands, edges in every dimension; the
    # operands as a linear layer hands them over (the weight transposed) and strided
    from minicompile.codegen.triton import import_triton
    from minicompile.lower import matmul
    import_triton()
    for m, k, n, settings in [(37, 24, 29, (32, 32, 16, 1, 4)), (130, 40, 3, (64, 16, 16, 1, 4)),
                              (5, 72, 131, (16, 64, 32, 1, 4)), (1, 8, 1, (16, 16, 16, 1, 4))]:
        a, w = randn(m, k), randn(n, k)
        if not descriptors:
            a = randn(k, m).t()                          # columns of k: read through strides
        out = matmul.launch(a, w.t(), settings, descriptors)
        assert out.is_contiguous() and out.shape == (m, n)
        expected = a.double() @ w.double().t()
        # float32 operands are rounded to TF32 (10 bits): each term of a sum is off by up to
        # about 1e-3 of its size, so the bound is in the sizes of the terms (a sum of 8 terms
        # can be far smaller than they are)
        terms = a.double().abs() @ w.double().abs().t()
        assert ((out.double() - expected).abs() <= 2e-3 * terms).all()
    assert matmul.launch(randn(0, 8), randn(8, 5), (16, 16, 16, 1, 4)).shape == (0, 5)
    assert torch.equal(matmul.launch(randn(4, 0), randn(0, 5), (16, 16, 16, 1, 4)), torch.zeros(4, 5, device=DEVICE))


def test_a_boolean_attention_mask_is_handed_over_dense(kernel_backend):
    # a mask as Hugging Face builds it (a view with a zero stride in the key dim): where Triton
    # kernels run, attention gets the dense additive mask, which its fused kernels take
    q, k, v = (randn(3, 7, 2, 8).transpose(1, 2) for _ in range(3))

    def f(q, k, v, positions):
        mask = (positions >= 0)[None, None, :, None].expand(3, 1, 7, 7)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    compiled = check(f, q, k, v, torch.arange(7, device=DEVICE))
    dense = not re.search(r"attn_mask=(torch\.as_strided|reinterpret_tensor)\(", compiled.wrapper_source)
    assert dense == (kernel_backend == "triton"), compiled.wrapper_source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_of_one_query_is_generated_code(kernel_backend, dtype):
    # a decoding step's attention (one query per head, a KV cache's keys read through views):
    # generated kernels, not PyTorch's, with each kind of mask, a query whose every key is
    # masked out (eager's fused kernels give 0 there), the keys' and values' feature sizes
    # apart, and a scale given or not
    q = randn(2, 3, 1, 12, dtype=dtype)
    k = randn(2, 3, 12, 37, dtype=dtype).transpose(-1, -2)[:, :, :29]
    v = randn(2, 3, 37, 5, dtype=dtype)[:, :, 3:32]
    mask = torch.rand(2, 1, 1, 29, device=DEVICE) > 0.4
    mask[1] = False

    def attend(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def attend_scaled(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=0.3) * 2
    for m in (mask, torch.where(mask, 0.0, -math.inf).to(dtype)[0, 0]):
        compiled = check(attend, q, k, v, m, dtype=dtype)
        assert "scaled_dot_product_attention" not in compiled.wrapper_source, compiled.wrapper_source
    compiled = check(attend_scaled, q, k, v, dtype=dtype)
    assert "scaled_dot_product_attention" not in compiled.wrapper_source, compiled.wrapper_source


def test_addmm_bias_is_added_by_a_generated_kernel(kernel_backend):
    # GPT-2's Conv1D: bias + x @ w. With Triton kernels the product is torch.mm and the bias
    # joins the elementwise work after it; other forms of addmm stay PyTorch's
    x, w, b = randn(37, 48), randn(48, 29) / 7, randn(29)
    compiled = check(lambda x, w, b: F.gelu(torch.addmm(b, x, w)) * 2, x, w, b)
    assert ("torch.mm(" in compiled.wrapper_source) == (kernel_backend == "triton"), compiled.wrapper_source
    check(lambda x, w, b: torch.addmm(b, x.t(), w.t()[:, :29]), randn(48, 37), randn(29, 48), b)
    check(lambda x, w, b: torch.addmm(b[:37, None], x, w, beta=0.5, alpha=2), x, w, randn(48))


def test_layers_share_one_additive_attention_mask(kernel_backend):
    # two attention layers read one boolean mask: where Triton kernels run, the additive mask
    # is made by one kernel, which both calls read
    q, k, v = (randn(3, 7, 2, 8).transpose(1, 2) for _ in range(3))

    def f(q, k, v, positions):
        mask = (positions >= 1)[None, None, None, :].expand(3, 1, 7, 7)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(h, k, v, attn_mask=mask)
    compiled = check(f, q, k, v, torch.arange(7, device=DEVICE))
    if kernel_backend == "triton":
        assert minicompile.metrics.kernels == 1, compiled.wrapper_source


def test_tensors_made_from_nothing_are_lowered(kernel_backend, capsys):
    # masks and positions as models build them: arange, ones, zeros, full, new_ones, new_full,
    # & and | of boolean tensors, each a value computed in the kernels that read it
    def f(x, ids):
        pos = torch.arange(2, 9, 2, device=x.device) + ids.new_ones(())
        keep = (ids >= 1) & torch.ones(4, dtype=torch.bool, device=x.device) | (pos > 5)
        z = torch.zeros(3, 4, device=x.device) + torch.full((4,), 2.5, device=x.device) + x.new_full((4,), -1)
        return z * keep * x, pos, torch.logical_and(keep, ids.new_zeros(4, dtype=torch.bool))
    x, ids = randn(3, 4), torch.randint(0, 3, (4,), device=DEVICE)
    minicompile.set_logs(output_code=True)
    try:
        actual = minicompile.compile(f)(x, ids)
    finally:
        minicompile.set_logs(output_code=False)
    for a, e in zip(actual, f(x, ids)):
        assert a.dtype == e.dtype and torch.equal(a, e), (a, e)
    assert "no lowering" not in capsys.readouterr().out


def test_products_read_a_value_stored_once(kernel_backend):
    # two linear layers read one layer norm's result of a 3-D input: it is stored once, and
    # each product reads its rows through a view of that buffer (no copy for each product)
    x, w1, w2 = randn(2, 5, 12), randn(7, 12), randn(7, 12)
    def f(x, w1, w2):
        h = F.layer_norm(x, (12,))
        return F.linear(h, w1) * F.linear(h, w2)
    check(f, x, w1, w2, kernels=2)


def _rotary_in_complex_numbers(x, w, pos):
    """DeepSeek-V2's rotary embedding: the rope half of each head as complex numbers, times
    a polar form of the positions' angles."""
    q = (x @ w).view(2, 7, 4, 6).transpose(1, 2)
    q_nope, q_pe = torch.split(q, [2, 4], dim=-1)
    inv = 1.0 / (10000 ** (torch.arange(0, 4, 2, device=x.device).float() / 4))
    freqs = (inv[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs) * 0.7
    qc = torch.view_as_complex(q_pe.float().reshape(*q_pe.shape[:-1], -1, 2))
    q_rot = torch.view_as_real(qc * freqs_cis.unsqueeze(1)).flatten(3).type_as(q)
    return torch.cat([q_nope, q_rot], -1) * 2


def test_complex_values_between_pytorchs_ops_are_never_copied_by_a_kernel(kernel_backend):
    """Complex ops are PyTorch's; one whose complex argument came back from the op before in
    another layout than the trace's took it as it is, where a kernel would have copied it into
    that layout: no kernel handles complex numbers, and the whole graph ran on PyTorch's
    kernels (DeepSeek-V2's inference graph)."""
    x, w, pos = randn(2, 7, 8), randn(8, 24), torch.arange(7, device=DEVICE)[None]
    minicompile.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = minicompile.compile(_rotary_in_complex_numbers)(x, w, pos)
    assert_same(got, _rotary_in_complex_numbers(x, w, pos))
    assert minicompile.metrics.kernels > 0


def relative_positions(q, table):
    n = q.shape[1]
    dist = torch.arange(n)[:, None] - torch.arange(n)[None, :] + (n - 1)       # made on the CPU
    keep = ~torch.zeros(n, n).to(device=q.device, dtype=torch.bool)
    return (torch.einsum("bnc,nmc->bnm", q, table[dist]).masked_fill(~keep, 0.0) * 2 + keep.cumsum(-1)).sum()


@pytest.mark.skipif(DEVICE != "cuda", reason="a CPU graph has one device")
def test_cpu_positions_beside_gpu_tensors_are_constants_on_the_gpu():
    """torchvision's MViT makes relative positions with torch.arange on the CPU and indexes a
    CUDA table with them; timm's EdgeNeXt moves torch.zeros(shape) to the GPU: computed when
    compiled (eager's values), the graph has one device, and generated kernels. In training,
    the backward reads the constant itself."""
    q, table = randn(2, 8, 8), randn(15, 8)
    minicompile.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = minicompile.compile(relative_positions)(q, table)
    assert_same(out, relative_positions(q, table))
    assert minicompile.metrics.kernels > 0
    q2, t2 = (t.clone().requires_grad_() for t in (q, table))
    q.requires_grad_(), table.requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        minicompile.compile(relative_positions)(q, table).backward()
    relative_positions(q2, t2).backward()
    assert_same((q.grad, table.grad), (q2.grad, t2.grad))
    assert minicompile.metrics.backward_kernels > 0


@pytest.mark.skipif(DEVICE != "cuda", reason="a CPU graph has one device")
def test_cpu_tensors_made_from_sizes_are_made_on_the_gpu():
    """At dynamic sizes the positions and `torch.zeros(n, n).to(device)` are made from the
    input's sizes, so are no constants: made on the GPU instead (the same items), the graph has
    one device and generated kernels at every size."""
    compiled = minicompile.compile(relative_positions)
    for n in (8, 11, 13):
        q, table = randn(2, n, 8), randn(2 * n - 1, 8)
        minicompile.metrics.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")     # (no "the graph runs on PyTorch's kernels")
            out = compiled(q, table)
        assert_same(out, relative_positions(q, table))
        assert minicompile.metrics.recompiles == 0 or minicompile.metrics.kernels > 0
