"""Writes into inputs and outputs that are views: every effect as eager's, on every call.

For each function, eager and minicompile each run on their own copy of the same fresh random
inputs, three times (the first call compiles, the later ones hit the cache), and everything a
caller can observe is compared: the results' values, sizes, strides and storage offsets; which
results share memory with which input or with each other, and which result *is* an input; the
inputs' values after the call. Writes stay in one graph (no graph break), as in TorchDynamo.
"""
import copy
import re
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from conftest import DEVICE
from helpers import assert_same, randn


def observe(out, inputs):
    """What a caller can see of a call's result: per result leaf, its values and layout,
    which input it is, and which input or earlier result it shares memory with."""
    leaves = list(out) if isinstance(out, (tuple, list)) else [out]
    seen = []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            seen.append(("value", leaf))
            continue
        ptr = leaf.untyped_storage().data_ptr()
        seen.append(("tensor", leaf.detach().clone(), tuple(leaf.shape), leaf.stride(),
                     leaf.storage_offset(),
                     [leaf is x for x in inputs],
                     [ptr == x.untyped_storage().data_ptr() for x in inputs],
                     [ptr == o.untyped_storage().data_ptr() for o in leaves[:len(seen)]
                      if isinstance(o, torch.Tensor)]))
    return seen


def assert_same_effects(fn, make_inputs, calls=3, graph_breaks=0):
    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(fn)
    for call in range(calls):
        seed = int(torch.randint(2**31, ()))
        torch.manual_seed(seed)          # (every device's generator: inputs may be on a GPU)
        inputs = make_inputs()
        torch.manual_seed(seed)
        mine = make_inputs()             # the same values in the same layout (views too)
        expected = observe(fn(*inputs), inputs)
        got = observe(compiled(*mine), mine)
        for x, y in zip(inputs, mine):
            torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-5, msg=f"call {call}: input after the call")
        assert len(got) == len(expected)
        for e, g in zip(expected, got):
            assert e[0] == g[0]
            if e[0] == "value":
                assert e[1] == g[1]
                continue
            torch.testing.assert_close(g[1], e[1], rtol=1e-5, atol=1e-5, msg=f"call {call}: result")
            assert g[2:] == e[2:], f"call {call}: layout or sharing differs: eager {e[2:]}, minicompile {g[2:]}"
    assert minicompile.metrics.graph_breaks == graph_breaks


def one(*shape):
    return lambda: (randn(*shape),)


# --- writes through views of an input ----------------------------------------------------
WRITES = {
    "x[:, 0].mul_(2)": lambda x: x[:, 0].mul_(2),
    "x.t()[1].mul_(3)": lambda x: x.t()[1].mul_(3),
    "x.view(-1)[::7].add_(1)": lambda x: x.view(-1)[::7].add_(1),
    "torch.relu_(x)": lambda x: torch.relu_(x),
    "F.relu(x, inplace=True)": lambda x: F.relu(x, inplace=True),
    "F.relu(x, True)": lambda x: F.relu(x, True),
    "F.leaky_relu(x, 0.5, True)": lambda x: F.leaky_relu(x, 0.5, True),
    "x.mul_(2).add_(1) is x": lambda x: x.mul_(2).add_(1) is x,
    "x.clamp_(-0.5, 0.5) * 2": lambda x: x.clamp_(-0.5, 0.5) * 2,
    "x.copy_(x.flip(0))": lambda x: x.copy_(x.flip(0)),
    "x.zero_()": lambda x: x.zero_(),
    "x.fill_(2.5)": lambda x: x.fill_(2.5),
    "x[2:].masked_fill_(x[2:] > 0, 0)": lambda x: x[2:].masked_fill_(x[2:] > 0, 0),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_writes_through_views_of_an_input(kernel_backend, name):
    assert_same_effects(WRITES[name], one(7, 5))


# torch.nn.functional's in-place activations that tensors have no method of (torch._C._nn's
# leaky_relu_, hardtanh_, elu_; torch.celu_, torch.selu_): on a value the graph computed, the
# write was not seen (the call, dead code, was dropped: y came back unchanged) or its
# out-of-place twin was looked up as a tensor method (celu: an error, and PyTorch's kernels)
INPLACE_ACTIVATIONS = {
    "F.leaky_relu_": lambda y: F.leaky_relu_(y, 0.1), "F.hardtanh_": lambda y: F.hardtanh_(y, -0.5, 0.5),
    "F.elu_": lambda y: F.elu_(y, 0.7), "F.celu_": lambda y: F.celu_(y), "F.selu_": lambda y: F.selu_(y),
    "F.threshold_": lambda y: F.threshold_(y, 0.5, -1.0), "F.hardswish": lambda y: F.hardswish(y, inplace=True),
}


@pytest.mark.parametrize("name", list(INPLACE_ACTIVATIONS))
def test_an_inplace_activation_of_a_computed_value_is_applied(kernel_backend, name):
    activation = INPLACE_ACTIVATIONS[name]

    def scaled_then_activated(x):
        y = x * 3
        activation(y)
        return y

    with warnings.catch_warnings():
        warnings.simplefilter("error")              # (not on PyTorch's kernels)
        assert_same_effects(scaled_then_activated, one(7, 5))
        assert_same_effects(lambda x: (activation(x), x.sum())[1], one(7, 5))


def view_written_and_returned(x):
    v = x[1]
    v.add_(1)
    return v


def augmented_then_read(x):
    x += 1
    return x * 2


def item_assignment(x):
    x[1:3, 2] = 7.0
    x[0] = x[4]
    return x.sum()


def written_then_viewed(x):
    x.mul_(2)
    return x.t(), x[0]


def views_read_after_a_write(x):
    head = x[:2]
    x.add_(10)
    return head * 1


def write_into_another_input(x, w):
    torch.mul(x[0], 2, out=w[1])
    return w


def write_through_a_split(x):
    a, b = x.split(3)
    b.mul_(-1)
    return a + 0, x


def write_twice(x, y):
    x.add_(y)
    y.mul_(x[0])
    x.sub_(y)
    return x, y


@pytest.mark.parametrize("fn", [view_written_and_returned, augmented_then_read, item_assignment,
                                written_then_viewed, views_read_after_a_write,
                                write_through_a_split])
def test_writes_in_one_graph(kernel_backend, fn):
    assert_same_effects(fn, one(6, 5))


def test_out_argument_into_a_view_of_another_input(kernel_backend):
    assert_same_effects(write_into_another_input, lambda: (randn(6, 5), randn(3, 5)))


def test_two_inputs_written_in_turn(kernel_backend):
    assert_same_effects(write_twice, lambda: (randn(4, 5), randn(5)))


def test_non_contiguous_input_written(kernel_backend):
    assert_same_effects(lambda x: x.mul_(3), lambda: (randn(9, 4, layout="transposed"),))
    assert_same_effects(lambda x: x[:, 1:].add_(1), lambda: (randn(9, 4, layout="strided"),))


def _written_then_read_elsewhere(x, y):
    old = x.clone()
    x.mul_(2)
    y.add_(x[:, :1])             # reads x's new value at other positions
    return old, x.sum()


def _written_read_by_an_extern(x, w):
    x.add_(1)
    return x @ w, x.exp_()


def test_new_values_stored_straight_into_the_inputs_they_are_written_to(kernel_backend):
    """A kernel may store an input's new value straight into the input (its write-back is
    then of memory onto itself): never where another step still reads the old value."""
    assert_same_effects(_written_then_read_elsewhere, lambda: (randn(5, 3), randn(5, 3)))
    assert_same_effects(_written_read_by_an_extern, lambda: (randn(4, 6), randn(6, 2)))
    from minicompile.graph_compiler import compile_graph

    def momentum(x, g):
        return x.mul_(0.9).add_(g, alpha=0.1)

    x, g = randn(1000), randn(1000)
    expected = x.clone().mul_(0.9).add_(g, alpha=0.1)
    compiled = compile_graph(torch.fx.symbolic_trace(momentum), [x, g])
    compiled(x, g)
    torch.testing.assert_close(x, expected)
    # (a C++ kernel's pointers that may overlap so are not __restrict__: codegen/cpp.py)
    assert re.search(r"= arg0(\.as_strided.*)?  # in place", compiled.wrapper_source), compiled.wrapper_source


def _cache_update(cache, pos, row):
    cache.index_copy_(1, pos, row)               # a static KV cache's update
    return cache[:, :6].sum(1)


def _scatters_then_reads_the_old_value(x, idx, src):
    old = x[:, 0] * 2
    x.index_put_((idx,), src.t(), accumulate=True)
    return old + x[:, 1]


def _scatter_into_an_intermediate(x, idx, src):
    y = x * 3
    return y.scatter_(0, idx, src).relu(), y.sum()


def test_scatters_into_an_input_are_done_in_place(kernel_backend):
    """index_copy_, index_put_, scatter_... into an input nothing reads afterwards run in place
    (their out-of-place form would copy the whole tensor, then the epilogue copy it back):
    where the old value is read later, or the written tensor is a view of part of an input,
    they are not."""
    from minicompile.graph_compiler import compile_graph

    def pos():
        return torch.randint(0, 7, (1,), device=DEVICE)
    assert_same_effects(_cache_update, lambda: (randn(3, 7, 5), pos(), randn(3, 1, 5)))
    assert_same_effects(_scatters_then_reads_the_old_value,
                        lambda: (randn(5, 4), torch.tensor([3, 0, 3], device=DEVICE), randn(4, 3)))
    assert_same_effects(_scatter_into_an_intermediate,
                        lambda: (randn(4, 5), torch.randint(0, 4, (2, 5), device=DEVICE), randn(2, 5)))
    assert_same_effects(lambda x, i, r: x[1:].index_copy_(0, i, r),
                        lambda: (randn(6, 3), torch.tensor([2, 0], device=DEVICE), randn(2, 3)))

    cache, p, row = randn(3, 7, 5), pos(), randn(3, 1, 5)
    expected = cache.clone().index_copy_(1, p, row)
    compiled = compile_graph(torch.fx.symbolic_trace(_cache_update), [cache, p, row])
    ptr = cache.data_ptr()
    compiled(cache, p, row)
    torch.testing.assert_close(cache, expected)
    assert cache.data_ptr() == ptr
    assert "arg0.index_copy_(1, arg1, arg2)" in compiled.wrapper_source, compiled.wrapper_source
    assert ".index_copy(" not in compiled.wrapper_source


def test_integer_and_half_inputs_written(kernel_backend):
    assert_same_effects(lambda x: x.add_(3), lambda: (torch.randint(-5, 5, (4, 6), dtype=torch.int32, device=DEVICE),))
    assert_same_effects(lambda x: x.mul_(0.5), lambda: (randn(4, 6, dtype=torch.float16),))


def test_inputs_that_share_memory_are_written_as_eager():
    """A written input that shares memory with another input: eager's result (the graph runs
    on PyTorch's kernels) and a new entry when the sharing changes."""
    def f(a, b):
        a.add_(1)
        return b * 2
    base = randn(8)
    compiled = minicompile.compile(f)
    expected_base = base.clone()
    expected = f(expected_base[:4], expected_base[2:6])
    with pytest.warns(UserWarning, match="runs on PyTorch's kernels, not compiled: input l_a_ is written"):
        torch.testing.assert_close(compiled(base[:4], base[2:6]), expected)
    torch.testing.assert_close(base, expected_base)
    x, y = randn(4), randn(4)
    ex, ey = x.clone(), y.clone()
    torch.testing.assert_close(compiled(x, y), f(ex, ey))
    torch.testing.assert_close(x, ex)


def _shifted_in_place(x):
    x[1:] = x[:-1]                                  # eager: "unsupported operation"
    return x


def _added_to_its_neighbour(x):
    x[0:3].add_(x[1:4])
    return x


def _sum_into_an_overlapping_out(x):
    y = x * 1
    torch.add(y[1:4], 1, out=y[0:3])
    return y


@pytest.mark.parametrize("fn", [_shifted_in_place, _added_to_its_neighbour, _sum_into_an_overlapping_out])
def test_in_place_sources_that_partly_overlap_what_is_written_raise_as_eager(fn):
    """Eager refuses an in-place call whose source shares part of the memory written; a
    functional graph would have read a copy (and returned a result)."""
    with pytest.raises(RuntimeError, match="unsupported operation") as eager:
        fn(torch.arange(6.0))
    with pytest.raises(RuntimeError) as compiled:
        minicompile.compile(fn)(torch.arange(6.0))
    assert str(compiled.value) == str(eager.value)


def test_writes_into_an_expanded_input_as_eager():
    """Elements that share memory (an expanded input): eager refuses add_ and makes
    masked_fill_ (with a warning): so does the compiled function."""
    def refused(y):
        y.add_(1)
        return y * 2

    def made(y):
        y.masked_fill_(y > 100, 0)
        return y + 1
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        minicompile.compile(refused)(randn(1, 7).expand(5, 7))
    y = randn(1, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(minicompile.compile(made)(y.expand(5, 7)), made(y.clone().expand(5, 7)))


def _windows_added_to(x):
    x.unfold(0, 3, 1).add_(1)             # x[2] is in three windows: eager adds 1 three times
    return x * 2


def _row_of_an_expanded_input_written(y):
    y[0].add_(1)                          # every row is that memory
    return y * 2


@pytest.mark.parametrize("fn, make", [(_windows_added_to, lambda: (randn(10),)),
                                      (_windows_added_to, lambda: (randn(24).view(6, 4)[:, 0],)),
                                      (_row_of_an_expanded_input_written, lambda: (randn(1, 7).expand(5, 7),))])
def test_writes_into_views_whose_elements_share_memory_as_eager(fn, make):
    assert_same_effects(fn, make, graph_breaks=1)


@pytest.mark.parametrize("fn", [
    lambda x: (x[:, 0].copy_(x[:, 1]), x)[1],                   # strided views that do not meet
    lambda x: x.__setitem__((slice(None), 0), x[:, 2]) or x,
    lambda x: (x.view(-1)[::2].add_(x.view(-1)[1::2]), x)[1],
    lambda x: (x[:3].add_(x[3:6]), x)[1],                      # apart
    lambda x: (x.mul_(x), x)[1],                                # the same elements
])
def test_in_place_sources_in_other_memory_of_the_written_tensor_stay_in_the_graph(kernel_backend, fn):
    assert_same_effects(fn, one(6, 8))


# --- outputs that are views, or the input itself -----------------------------------------
VIEWS = {
    "x.t()": lambda x: x.t(),
    "x[::2]": lambda x: x[::2],
    "x[1::2, ::3]": lambda x: x[1::2, ::3],
    "x.view(-1)": lambda x: x.view(-1),
    "x.reshape(2, -1)": lambda x: x.reshape(2, -1),
    "x[:4]": lambda x: x[:4],
    "x[0, 0]": lambda x: x[0, 0],
    "x.to(x.dtype)": lambda x: x.to(x.dtype),
    "x.contiguous()": lambda x: x.contiguous(),
    "x.detach()": lambda x: x.detach(),
    "x.unsqueeze(0).expand(3, -1, -1)": lambda x: x.unsqueeze(0).expand(3, -1, -1),
    "x, x.t(), x[0]": lambda x: (x, x.t(), x[0]),
    "x.unbind(0)": lambda x: x.unbind(0),
    "x.chunk(2, 1)": lambda x: x.chunk(2, 1),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_views_of_an_input(kernel_backend, name):
    assert_same_effects(VIEWS[name], one(6, 4))


def views_of_one_intermediate(x):
    y = torch.tanh(x) * 2
    return y, y.t(), y[0]


def only_views_of_an_intermediate(x):
    y = x + 1
    return y[1:], y.t()[0]


def expanded_intermediates(x):
    """Eager returns views that repeat memory (stride 0): a write into one raises."""
    y = x[:1] * 2
    return y.expand(5, -1), torch.broadcast_tensors(x[:, :1] + 1, x)[0], x.sum(0).expand(3, -1)


@pytest.mark.parametrize("fn", [views_of_one_intermediate, only_views_of_an_intermediate, expanded_intermediates])
def test_views_of_an_intermediate(kernel_backend, fn):
    assert_same_effects(fn, one(6, 4))


def test_an_expanded_result_refuses_writes_as_eager():
    out = minicompile.compile(lambda a: (a * 2).expand(2, 3))(randn(1, 3))
    assert out.stride() == (0, 1)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        out.add_(1)


# functions of one size n whose result is expanded (stride 0), and their inputs at size n
EXPANDED = {
    "(a * 2).expand(4, -1, -1)": (lambda a: (a * 2).expand(4, -1, -1), lambda n: (randn(1, n),)),
    "(a * 2).expand(3, -1)": (lambda a: (a * 2).expand(3, -1), lambda n: (randn(1, n),)),
    "(a + 1).expand(3, n, 5)": (lambda a: (a + 1).expand(3, -1, 5), lambda n: (randn(3, n, 1),)),
    "broadcast_to(a.sin(), (2, n, 5))": (lambda a: torch.broadcast_to(a.sin(), (2, a.shape[0], 5)),
                                         lambda n: (randn(n, 1),)),
    "x.sum(0, keepdim=True).expand_as(x)": (lambda x: x.sum(0, keepdim=True).expand_as(x), lambda n: (randn(n, 3),)),
    "x.sum(0, keepdim=True).expand(4, -1, -1)": (lambda x: x.sum(0, keepdim=True).expand(4, -1, -1),
                                                 lambda n: (randn(3, n),)),
    "(a @ b).expand(4, -1, -1)": (lambda a, b: (a @ b).expand(4, -1, -1), lambda n: (randn(1, n), randn(n, 9))),
    "(x.t() * 2).unsqueeze(1).expand(-1, 3, -1)": (lambda x: (x.t() * 2).unsqueeze(1).expand(-1, 3, -1),
                                                   lambda n: (randn(5, n),)),
    # PyTorch's op (no lowering) whose result repeats values: its strides kept at every size
    "meshgrid(arange(n), x[0] * 2)[1]": (lambda x: torch.meshgrid(torch.arange(x.shape[0], dtype=x.dtype,
                                                                               device=x.device),
                                                                  x[0] * 2, indexing="ij")[1],
                                         lambda n: (randn(n, 5),)),
}


@pytest.mark.parametrize("name", list(EXPANDED))
def test_an_expanded_result_is_eagers_view_at_every_size(kernel_backend, name):
    """Eager returns an expanded value as a view, strides 0 where it repeats, of a buffer that
    holds only the values it repeats: so does minicompile, with eager's strides (a dim of size
    1's too), and a write into it raises as eager's does. Called at several sizes, the later
    calls run a graph generic in sizes."""
    fn, make = EXPANDED[name]
    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(fn)
    for n in (7, 13, 6):
        inputs = make(n)
        expected, got = fn(*inputs), compiled(*inputs)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert got.stride() == expected.stride()
        assert got.untyped_storage().nbytes() == expected.untyped_storage().nbytes()
        for out in (expected, got):
            with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
                out.add_(1)
    assert minicompile.metrics.graphs == 2


# functions of one size n whose result is a view with gaps of a value they computed
STRIDED_VIEWS = {
    "(x + 1)[:, :3]": lambda x: (x + 1)[:, :3],
    "(x * 2).t()[:2]": lambda x: (x * 2).t()[:2],
    "x.exp()[:, 2]": lambda x: x.exp()[:, 2],
    "x.sin()[1::2, ::3]": lambda x: x.sin()[1::2, ::3],
    "(x @ x.t()).diagonal()": lambda x: (x @ x.t()).diagonal(),
    "x.softmax(-1)[..., -1]": lambda x: x.softmax(-1)[..., -1],
}


@pytest.mark.parametrize("name", list(STRIDED_VIEWS))
def test_a_view_of_an_intermediate_has_eagers_strides_at_every_size(kernel_backend, name):
    """Eager returns `(x + 1)[:, :3]` as a view of the whole sum, strides (6, 1) for an (n, 6)
    x: so does minicompile, at every size (the later calls run a graph generic in sizes). It
    returned a dense copy of the view, strides (3, 1): not contiguous in eager, contiguous here."""
    fn = STRIDED_VIEWS[name]
    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(fn)
    for n in (7, 13, 6):
        x = randn(n, 6)
        expected, got = fn(x), compiled(x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert got.stride() == expected.stride() and got.is_contiguous() == expected.is_contiguous()
        got.add_(1)                                    # (its own memory: a write is the caller's)
    assert minicompile.metrics.graphs == 2


def test_an_extern_result_has_eagers_strides_in_dims_of_size_one():
    """PyTorch's op given a view whose dims of size 1 have other strides than eager's view (the
    wrapper's views of an unsqueeze) may return them too (sdpa does): the result is restrided
    to eager's, a view of the same memory, at every size."""
    def f(x):
        return F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None])
    compiled = minicompile.compile(f)
    for n in (3, 5, 7):
        x = randn(n, 4)
        expected, got = f(x), compiled(x)
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride()


def test_as_layout_repeats_a_dense_result_where_eager_repeats_it():
    """An extern op's result the trace saw repeating values (stride 0) but the call returns
    dense (its argument is a stored buffer, not eager's expanded view): the wrapper's
    as_layout gives the predicted strides over one copy of the values, which no copy into a
    stride-0 layout could."""
    from minicompile.runtime.memory import as_layout
    dense = randn(3, 1, 5).expand(3, 4, 5).contiguous()
    got = as_layout(dense, (5, 0, 1))
    assert got.stride() == (5, 0, 1) and got.untyped_storage().nbytes() == 15 * 4
    torch.testing.assert_close(got, dense, rtol=0, atol=0)


def overlapping_chunks(x):
    """Longformer's _chunk: as_strided over the memory of a view of a computed value (the
    reshape of a transposed projection is a view in eager, with its strides), read by a
    product and returned."""
    y = (x * 2).view(4, 2, 12).transpose(0, 1).reshape(2, 4, 3, 4)
    stride = list(y.stride())
    stride[1] //= 2
    chunks = y.as_strided(size=[2, 7, 3, 4], stride=stride)
    return torch.einsum("bcxd,bcyd->bcxy", chunks, chunks), chunks


def strided_windows(x):
    """as_strided of a computed value itself, and with an explicit storage offset."""
    y = torch.tanh(x)
    return y.as_strided((5, 3), (2, 1)) + 1, y.as_strided((2, 2), (1, 3), 4)


@pytest.mark.parametrize("fn", [overlapping_chunks, strided_windows])
def test_as_strided_reads_eager_memory(kernel_backend, fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # compiled, not run on PyTorch's kernels
        assert_same_effects(fn, one(8, 12))
    assert minicompile.metrics.kernels > 0


def test_as_strided_of_memory_laid_out_otherwise_runs_on_pytorch_kernels():
    """A view of an input as_strided: the input's storage is the caller's, beyond the view;
    eager's result, not a compiled one (a warning says so)."""
    with pytest.warns(UserWarning, match="PyTorch's kernels"):
        assert_same_effects(lambda x: x.t().as_strided((3, 3), (1, 2), 1) * 2, one(6, 4))


def add_at_indices(x, idx):
    """x[idx] with a tensor index is a copy, not a view: a write into it changes the copy
    only, and `out[idx] += 1` writes the changed copy back."""
    out = torch.zeros_like(x)
    out[idx] += 1
    picked = x[idx]
    picked.mul_(2)
    return out, picked


def test_a_write_into_an_indexed_copy(kernel_backend):
    assert_same_effects(add_at_indices, lambda: (randn(6, 4), torch.tensor([1, 3, 3], device=DEVICE)))


def test_a_returned_view_can_be_written_by_the_caller():
    compiled = minicompile.compile(lambda x: x[1:3])
    x = randn(5, 3)
    compiled(x).fill_(0)
    assert (x[1:3] == 0).all() and (x[0] != 0).all()


COPIES = {      # a tensor made in the function, then overwritten whole by copy_ or fill_
    "x.clone().copy_(y)": lambda x, y: x.clone().copy_(y),
    "empty(6, 4).copy_(row)": lambda x, y: torch.empty(6, 4, device=x.device).copy_(y[0]),
    "x.t().clone().copy_(y.t())": lambda x, y: x.t().clone().copy_(y.t()),
    "int32 empty.copy_(y * 10)": lambda x, y: torch.empty(6, 4, dtype=torch.int32, device=x.device).copy_(y * 10),
    "x.clone().fill_(y[0, 0])": lambda x, y: x.clone().fill_(y[0, 0]),
}


@pytest.mark.parametrize("name", list(COPIES))
def test_a_copy_returned_is_a_tensor_of_its_own(kernel_backend, name):
    """Eager's result is the written tensor, in its layout: not the source (x.clone().copy_(y)
    returned y itself, so a write into the result changed y) nor the source broadcast (a row
    expanded, whose rows a write changed all together)."""
    assert_same_effects(COPIES[name], lambda: (randn(6, 4), randn(6, 4)))
    x, y = randn(6, 4), randn(6, 4)
    out, expected, before = minicompile.compile(COPIES[name])(x, y), COPIES[name](x, y), y.clone()
    out[0, 0] = expected[0, 0] = 7
    assert torch.equal(out, expected) and torch.equal(y, before)


def test_a_zero_dim_result_is_its_own_tensor(kernel_backend):
    """x.sum() is a 0-dim tensor of its own in eager: computed under no_grad, then scaled in
    place by a tensor that needs a gradient. A view of a one-element buffer was "a view
    created in no_grad mode" to autograd, which raised."""
    compiled = minicompile.compile(lambda x: (x.sum(), (x * 2).amax(), x.argmax()))
    w = randn(()).requires_grad_()
    with torch.no_grad():
        outs = compiled(randn(7, 3))
    assert all(out._base is None for out in outs)
    assert minicompile.compile(lambda s: torch.softmax(s, 0))(randn(()))._base is None   # (in place)
    total = outs[0].mul_(w)
    total.backward()
    assert w.grad is not None


# --- module buffers and parameters written -----------------------------------------------
def test_batch_norm_training_updates_running_statistics_in_one_graph(kernel_backend):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
    mine = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
    mine.load_state_dict(ref.state_dict())
    ref, mine = ref.to(DEVICE), mine.to(DEVICE)
    compiled = minicompile.compile(mine)
    with torch.no_grad():
        for _ in range(3):
            x = randn(2, 3, 9, 9)
            torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-4)
            for (name, a), b in zip(ref.named_buffers(), mine.buffers()):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)
    assert minicompile.metrics.graph_breaks == 0 and minicompile.metrics.graphs == 1


# Functions that update the running statistics handed to them, each with its own argument
# order (torch.batch_norm's weight comes before its running mean, F.batch_norm's after)
RUNNING_STATS = {
    "F.batch_norm": lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, True, 0.3),
    "torch.batch_norm": lambda x, w, b, rm, rv: torch.batch_norm(x, w, b, rm, rv, True, 0.3, 1e-5, False),
    "torch.native_batch_norm": lambda x, w, b, rm, rv: torch.native_batch_norm(x, w, b, rm, rv, True, 0.3, 1e-5),
    "F.instance_norm": lambda x, w, b, rm, rv: F.instance_norm(x, rm, rv, w, b, momentum=0.3),
    "torch.instance_norm": lambda x, w, b, rm, rv: torch.instance_norm(x, w, b, rm, rv, True, 0.3, 1e-5, False),
}


@pytest.mark.parametrize("name", list(RUNNING_STATS))
def test_running_statistics_updated_by_each_batch_and_instance_norm(kernel_backend, name):
    assert_same_effects(RUNNING_STATS[name], lambda: (randn(4, 5, 6), randn(5), randn(5), randn(5),
                                                     torch.rand(5, device=DEVICE) + 0.5))


def test_a_counter_buffer_written_each_call():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    m = Counter().to(DEVICE)
    compiled = minicompile.compile(m)
    x = randn(3)
    for i in range(1, 4):
        torch.testing.assert_close(compiled(x), x * i)
    assert m.calls.item() == 3
    assert minicompile.metrics.graphs == 1


# --- writes capture does not model are never made twice ----------------------------------
# Tracing runs each op on the real inputs: a write it does not recognise must not happen there
# (it would happen again when the graph or the break runs); it becomes a graph break instead.
NOT_MODELLED = {
    # the same write as x[i] = v, called as a method
    "x.__setitem__(i, x[i] + 1)": (lambda x: x.__setitem__(torch.tensor([0, 0, 2], device=x.device),
                                                           x[torch.tensor([0, 0, 2], device=x.device)] + 1), 0),
    "x.__iadd__(1)": (lambda x: x.__iadd__(1), 0),
    # out= of other sizes: PyTorch resizes it
    "torch.mul(x, 2, out=torch.empty(0))": (lambda x: torch.mul(x, 2, out=torch.empty(0, device=x.device)), 1),
    # a write through an op whose name says nothing (the aten op's schema says it writes)
    "torch.ops.aten.add_.Tensor(x[1], x[0])": (lambda x: torch.ops.aten.add_.Tensor(x[1], x[0]), 1),
}


@pytest.mark.parametrize("name", list(NOT_MODELLED))
def test_a_write_is_made_once(kernel_backend, name):
    fn, breaks = NOT_MODELLED[name]
    assert_same_effects(fn, one(7, 5), graph_breaks=breaks)


def test_backward_inside_the_function_runs_once():
    def fn(x):
        (x * 2).sum().backward()
        return x.grad
    for call in range(2):
        x, y = randn(3, 4).requires_grad_(), None
        y = x.detach().clone().requires_grad_()
        torch.testing.assert_close(minicompile.compile(fn)(y), fn(x))


def test_writing_a_leaf_that_requires_grad_raises_as_eager():
    for fn in (lambda x: x.add_(1), lambda x: x[0].mul_(2)):
        x = randn(3, 4).requires_grad_()
        with pytest.raises(RuntimeError) as eager:
            fn(x)
        with pytest.raises(RuntimeError) as compiled:
            minicompile.compile(fn)(x)
        assert str(compiled.value) == str(eager.value)


@pytest.mark.parametrize("write", [lambda b, w: b.add_(w), lambda b, w: b.__setitem__(slice(1, 3), w[:2] ** 2)])
def test_an_input_written_with_a_value_that_needs_a_gradient_takes_its_history(kernel_backend, write):
    """b (no gradient) written with a value made from w: in eager b then requires grad, and a
    loss on b reaches w. The kernel that stored the new value straight into b left b a leaf:
    w's gradient lacked that part."""
    def fn(b, w):
        write(b, w)
        return (w * 2).sum()
    compiled = minicompile.compile(fn)
    for _ in range(2):
        grads = []
        for f in (fn, compiled):
            torch.manual_seed(0)
            b, w = randn(5), randn(5).requires_grad_()
            (f(b, w) + (b * 3).sum()).backward()
            grads.append((b.requires_grad, w.grad))
        assert grads[1][0] and grads[0][0]
        torch.testing.assert_close(grads[1][1], grads[0][1])


def test_inputs_written_are_written_in_place_in_training(kernel_backend):
    """In training as in inference, the kernels store the new values of written inputs (batch
    norm's running statistics) straight into them: no copy after the call, each eager's."""
    import copy
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4)).to(DEVICE).train()
    twin = copy.deepcopy(net)
    x = torch.randn(2, 3, 9, 11, device=DEVICE)
    calls = []
    real = torch._foreach_copy_
    torch._foreach_copy_ = lambda a, b: (calls.append(len(a)), real(a, b))[1]
    try:
        out = minicompile.compile(net)(x)
    finally:
        torch._foreach_copy_ = real
    torch.testing.assert_close(out, twin(x))
    assert calls == []
    for (name, a), b in zip(net.state_dict().items(), twin.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_the_epilogue_copies_by_one_foreach_copy_per_dtype(monkeypatch):
    """Where new values are copied into written inputs after the graph, one torch._foreach_copy_
    per device and dtype does it (PyTorch's fast path takes one dtype: a list of running
    statistics and int64 counts of batches would be copied one tensor at a time)."""
    from minicompile.functionalize import Epilogue
    inputs = [torch.zeros(4, device=DEVICE), torch.zeros((), dtype=torch.int64, device=DEVICE),
              torch.zeros(3, device=DEVICE), torch.zeros((), dtype=torch.int64, device=DEVICE)]
    new = [torch.randn(4, device=DEVICE), torch.tensor(2, device=DEVICE), torch.randn(3, device=DEVICE),
           torch.tensor(5, device=DEVICE)]
    calls = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda a, b: (calls.append([t.dtype for t in a]), real(a, b))[1])
    leaves, spec = torch.utils._pytree.tree_flatten(())
    Epilogue(spec, leaves, [(i, i) for i in range(4)])(lambda *args: list(new), inputs)
    assert sorted(map(str, calls)) == sorted(map(str, [[torch.float32] * 2, [torch.int64] * 2]))
    for x, value in zip(inputs, new):
        assert torch.equal(x, value)


def test_the_epilogue_says_which_outputs_the_users_output_is_made_from():
    """Epilogue.read: a written input's new value that the user's output does not read is not
    among them (a CUDA graph's recording may then write it into its static input itself)."""
    from minicompile.functionalize import functionalize

    def step(x, count):
        count.add_(1)
        return x * 2, x[:1]

    def returned(x, count):
        count.add_(1)
        return x * count

    for f, read in ((step, {0}), (returned, {0})):
        _, epilogue = functionalize(torch.fx.symbolic_trace(f), [torch.randn(3), torch.zeros(3)])
        (i, k), = epilogue.copies
        assert i == 1 and k not in epilogue.read and epilogue.read == read
    _, epilogue = functionalize(torch.fx.symbolic_trace(lambda x, c: c.add_(1)[:2]), [torch.randn(3), torch.zeros(3)])
    assert epilogue.read == set()          # a view of the written input: made from the input


@pytest.mark.parametrize("overwrite", [lambda t: t.zero_(), lambda t: t.fill_(2.5),
                                       lambda t: t.copy_(torch.arange(4.0)), lambda t: torch.zero_(t)])
def test_a_value_overwritten_in_place_keeps_its_gradient(overwrite):
    """x.clone().fill_(v) requires grad as in eager, with a zero gradient for x (functionalized,
    the write became full_like, which is not differentiable: the output did not require grad,
    and backward() on it raised where eager runs)."""
    def fn(x, y):
        return overwrite(x.clone()), overwrite(x.clone()) * y
    x0, y0 = torch.randn(3, 4), torch.randn(3, 4)
    results = []
    for f in (fn, minicompile.compile(fn)):
        x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        a, b = f(x, y)
        assert a.requires_grad and b.requires_grad
        (a.sum() + (b * b).sum()).backward()
        results.append((a.detach(), b.detach(), x.grad, y.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)


# --- x[mask] = v: a masked fill -------------------------------------------------------------
MASK_FILLS = {
    "rows of an input, a vector": (lambda x, m, v: x.__setitem__(m, v), (7, 5), (7,), (5,)),
    "every element, a number": (lambda x, m, v: x.__setitem__(m, 2.5), (6, 3), (6, 3), (1,)),
    "leading dims, a [1, 5] tensor": (lambda x, m, v: x.__setitem__(m, v), (2, 7, 5), (2, 7), (1, 5)),
    "a copy, returned": (lambda x, m, v: (lambda y: (y.__setitem__(m, v * 2), y.sin())[1])(x * 3), (4, 6), (4,), (6,)),
    "a transposed view": (lambda x, m, v: x.t().__setitem__(m, v), (5, 7), (7,), (5,)),
}


@pytest.mark.parametrize("name", list(MASK_FILLS))
def test_a_masked_fill_by_item_assignment(kernel_backend, name):
    """x[mask] = v with one v for every place the mask picks: a pointwise where(), as eager's
    (the effects on the inputs, and the result)."""
    fn, xs, ms, vs = MASK_FILLS[name]
    assert_same_effects(fn, lambda: (randn(*xs), torch.rand(ms, device=DEVICE) > 0.5, randn(*vs)))


def test_a_masked_fill_trains_without_counting_the_places():
    """Its joint graph is traced (no data-dependent count of the mask's places, which made the
    graph run on PyTorch's kernels) and the gradients are eager's, the filled value's too."""
    def fn(h, mask, v):
        h = h * 2
        h[mask] = v
        return h.sin()
    h0, v0, mask = torch.randn(2, 7, 5), torch.randn(5), torch.rand(2, 7) > 0.5
    results = []
    minicompile.reset()
    minicompile.metrics.reset()
    for f in (fn, minicompile.compile(fn)):
        h, v = h0.clone().requires_grad_(), v0.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = f(h, mask, v)
        (out * out).sum().backward()
        results.append((out.detach(), h.grad, v.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)
    assert minicompile.metrics.backward_kernels >= 1


def test_an_output_the_code_made_as_a_view_can_be_written_in_training():
    """A training graph's output that the generated code made as a view of its own buffer (a
    transpose), one of several outputs: the caller may write into it, as into eager's."""
    def fn(x, w):
        h = (x @ w).transpose(1, 2)
        return h, h.sum()
    x0, w0 = torch.randn(2, 5, 4), torch.randn(4, 3)
    results = []
    for f in (fn, minicompile.compile(fn)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        h, s = f(x, w)
        h[:, 0] = 1.0
        ((h * h).sum() + s).backward()
        results.append((h.detach(), x.grad, w.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)


WRITES_WITH_GRADIENTS = {
    "h.add_(w)": lambda h, w, m: h.add_(w),
    "h[:, 1] = w": lambda h, w, m: h.__setitem__((slice(None), 1), w),
    "h[m] = w": lambda h, w, m: h.__setitem__(m, w.to(h.dtype)),
    "h[0].mul_(w)": lambda h, w, m: h[0].mul_(w),
}


@pytest.mark.parametrize("name", list(WRITES_WITH_GRADIENTS))
def test_a_write_into_an_input_that_requires_grad_is_recorded_by_autograd(name):
    """An input computed by the caller (not a leaf), written in the graph with a value that
    needs gradients: the write is autograd's (the epilogue's copy_), not made by the generated
    code straight into the input's memory, where autograd did not see it (the value written
    got no gradient, and the input's went through as if unwritten)."""
    write = WRITES_WITH_GRADIENTS[name]

    def fn(h, w, m):
        write(h, w, m)
        return h.cos()
    x0, w0, m = torch.randn(2, 7, 5), torch.randn(5), torch.rand(2, 7) > 0.5
    results = []
    minicompile.reset()
    for f in (fn, minicompile.compile(fn)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        h = x * 2
        out = f(h, w, m)
        (out * out).sum().backward()
        results.append((out.detach(), h.detach(), x.grad, w.grad))
    for got, want in zip(results[1], results[0]):
        assert got is not None
        torch.testing.assert_close(got, want)


class ClampsItsWeight(nn.Module):
    """Writes its own parameter in forward, under no_grad (a weight constraint)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.clamp_(-0.2, 0.2)
        return F.gelu(self.lin(x))


def halves_an_input_unseen(x, w):
    with torch.no_grad():
        w.mul_(0.5)
    return (x @ w).tanh()


def clamps_a_value_unseen(x, w):
    y = x @ w
    with torch.no_grad():
        y.clamp_(-0.1, 0.1)
    return y * 2


def zeroes_a_row_of_an_input_unseen(x, w):
    with torch.no_grad():
        w[0].zero_()                  # (a view made under no_grad: it does not require grad)
        w.t()[1].fill_(2.0)
    return (x @ w).tanh()


def clamps_a_row_of_a_value_unseen(x, w):
    y = x @ w
    with torch.no_grad():
        y[1:].clamp_(-0.1, 0.1)
    return y * 2


@pytest.mark.parametrize("fn", [halves_an_input_unseen, clamps_a_value_unseen, zeroes_a_row_of_an_input_unseen,
                                clamps_a_row_of_a_value_unseen])
def test_a_write_under_no_grad_keeps_the_tensors_history(fn):
    """Written under no_grad, a tensor that requires grad keeps its history in eager: a later
    use is differentiated into it, at its new value (the compiled graph's output carried no
    gradient: backward() raised). So too where the write is through a view (the view, made
    under no_grad, does not require grad: the tensor written does)."""
    results = []
    minicompile.reset()
    for f in (fn, minicompile.compile(fn)):
        torch.manual_seed(0)
        x, w0 = torch.randn(4, 3), torch.randn(3, 3, requires_grad=True)
        w = w0 * 1.0
        out = f(x, w)
        (out * out).sum().backward()
        results.append((out.detach(), w.detach(), w0.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)


def test_a_module_that_clamps_its_weight_in_forward_trains_as_eager():
    torch.manual_seed(0)
    model = ClampsItsWeight()
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, twin)]
    for step in range(3):
        x = torch.randn(5, 6)
        for f, opt in zip((compiled, twin), opts):
            f(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p, q)
    assert minicompile.metrics.backward_kernels >= 1


def test_a_non_differentiable_output_made_as_a_view_stays_non_differentiable():
    """An output that carries no gradient (h.detach().t(): a batch norm's new running
    statistics are such outputs) and that the generated code made as a view of its own buffer:
    handed out as a tensor of its own, it must still be marked non-differentiable (it required
    grad, and a running statistic copied from it then required grad: the next step raised)."""
    def f(x, w):
        h = (x @ w).sin()
        return h * 2, h.detach().t()
    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    got, want = minicompile.compile(f)(x, w), f(x, w)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == [True, False]
    torch.testing.assert_close(got[1], want[1])


def _view_then_break_in_no_grad(x, idx):
    h = x.reshape(-1, 4)                   # a view of the input, made with grad
    with torch.no_grad():
        hit = (idx > 0).nonzero()          # a graph break under no_grad: the graph returns h
    return (h * 2).sum() + hit.sum()


def _view_in_no_grad_then_break(x, idx):
    with torch.no_grad():
        v = x.reshape(-1, 4)               # made under no_grad: no gradient flows through it
    hit = (idx > 0).nonzero()
    return (v * 2).sum() + x.sum() + hit.sum()


def _view_in_no_grad_returned(x, idx):
    with torch.no_grad():
        v = x.view(-1)
    return v, x * 2


@pytest.mark.parametrize("fn", [_view_then_break_in_no_grad, _view_in_no_grad_then_break, _view_in_no_grad_returned])
def test_a_view_of_an_input_handed_on_keeps_the_grad_mode_it_was_made_in(fn):
    """A view of an input that the graph hands on (at a break, or returned) is made again after
    the graph in the grad mode the frame made it in, not the one the graph ends in: made with
    grad, the gradient flows through it (an MoE layer's reshape before a no_grad break: DBRX's
    gradients were lost); made under no_grad, none does, and it has no grad_fn."""
    def run(f):
        x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
        out = f(x, torch.tensor([0, 1, 2]))
        if isinstance(out, tuple):
            return [(t.requires_grad, t.grad_fn is None) for t in out]
        out.backward()
        return x.grad
    expected, got = run(fn), run(minicompile.compile(fn))
    if isinstance(expected, list):
        assert got == expected
    else:
        torch.testing.assert_close(got, expected)


def _data_read(p, x):
    y = p * x
    return y.data.min() + y.sum(), y.data.requires_grad


def _data_written_after_use(p, x):
    out = (p * x).sum()
    p.data.mul_(0.5)                       # an update autograd does not see
    return out


def _data_clamped_before_use(p, x):
    p.data.clamp_(-0.5, 0.5)
    return (p * x).sum()


@pytest.mark.parametrize("fn", [_data_read, _data_written_after_use, _data_clamped_before_use])
def test_tensor_data_is_the_tensor_cut_off_from_autograd(fn):
    """x.data (I-BERT's quantizers read x.data.min() in training) is traced as a detach: the
    same values, no gradient through it, writes through it that autograd does not see; it broke
    the graph, and the frame ran eagerly."""
    minicompile.metrics.reset()
    results = []
    for f in (fn, minicompile.compile(fn)):
        p, x = torch.randn(4, generator=torch.Generator().manual_seed(0)).requires_grad_(), torch.arange(4.0)
        out = f(p, x)
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()
        results.append((loss.detach(), out[1:] if isinstance(out, tuple) else (), p.grad, p.detach().clone()))
    (ev, eflags, egrad, ep), (gv, gflags, ggrad, gp) = results
    assert eflags == gflags
    for a, b in ((ev, gv), (egrad, ggrad), (ep, gp)):
        torch.testing.assert_close(b, a)
    assert minicompile.metrics.graph_breaks == 0


def test_a_view_as_another_dtype_reinterprets_the_bits():
    """x.view(torch.int32) is x's bits read as int32 (PyTorch's kernel makes it), not x's
    values converted; of another size, the last dimension grows or shrinks."""
    x = randn(5, 3)
    i = torch.randint(0, 2**30, (4,), dtype=torch.int32, device=DEVICE)
    h = randn(6).half()
    for f, a in [(lambda x: x.view(torch.int32) + 1, x), (lambda x: (x * 2).view(torch.uint8), x),
                 (lambda i: (i + 1).view(torch.float32), i), (lambda h: (h * 2).view(torch.int16) & 0x7FFF, h)]:
        got, want = minicompile.compile(f)(a), f(a)
        assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_true_as_an_index_adds_a_dimension():
    x = randn(2, 3)
    for f in (lambda x: x[True] * 1, lambda x: x[None, True] * 1, lambda x: x[:, True] + 1):
        torch.testing.assert_close(minicompile.compile(f)(x), f(x))


def max_into(x, values, indices):
    found = torch.max(x, 1, out=(values, indices))
    return found.values * 2, found.indices, type(found).__name__


def test_an_out_pair_comes_back_as_the_ops_result_type():
    """torch.max(..., out=(v, i)) returns torch.return_types.max_out, fields by name, holding
    the very tensors given (written)."""
    x = randn(4, 5)
    compiled = minicompile.compile(max_into)
    outs = [torch.empty(4, device=DEVICE), torch.empty(4, dtype=torch.long, device=DEVICE)]
    doubled, indices, kind = compiled(x, *outs)
    assert kind == "max_out" and indices is outs[1]
    torch.testing.assert_close(doubled, x.max(1).values * 2)
    torch.testing.assert_close(outs[0], x.max(1).values)


def add_one_out_none(x):
    return torch.add(x, 1, out=None) * 2


def cholesky_of(a, out=None):
    factor, info = torch.linalg.cholesky_ex(a, out=out)        # (linear_operator's default, passed on)
    return factor, info


def test_out_none_is_no_out():
    """`out=None` is no `out` argument: the call returns its result (it returned None, and
    unpacking cholesky_ex's pair raised where eager runs)."""
    x = randn(3, 5)
    torch.testing.assert_close(minicompile.compile(add_one_out_none)(x), add_one_out_none(x))
    a = randn(4, 4)
    a = a @ a.T + 4 * torch.eye(4, device=DEVICE)
    factor, info = minicompile.compile(cholesky_of)(a)
    torch.testing.assert_close(factor, torch.linalg.cholesky(a))
    assert info.item() == 0


@pytest.mark.parametrize("fn", [lambda x: (x.sum(), x.sum()), lambda x: (x.amax(-1), x.amax(-1)),
                                lambda x: (x.argmax(), x.flatten().max(0).indices), lambda x: (x * 2, x * 2),
                                lambda x: (x.sum(0), x.sum(0).view(5, 1)),
                                lambda x: (x.sum(0), x.sum(0).expand(3, -1))],
                         ids=["sum", "amax", "argmax", "mul", "sum_view", "expanded"])
def test_equal_outputs_of_distinct_ops_are_distinct_tensors(fn):
    """Lowering computes two equal reductions once: both outputs were one tensor, so a write
    into one showed in the other. The same value returned twice stays one tensor."""
    x = randn(3, 5)
    got, want = minicompile.compile(fn)(x), fn(x)
    assert got[0] is not got[1]
    got[0].add_(1)
    want[0].add_(1)
    torch.testing.assert_close(got, want)
    same = minicompile.compile(lambda x: (lambda y: (y, y))(x.sum()))(x)
    assert same[0] is same[1]
    # one value and a view of it share memory, as in eager
    shared = minicompile.compile(lambda x: (lambda s: (s, s.view(5, 1)))(x.sum(0)))(x)
    shared[0].add_(1)
    torch.testing.assert_close(shared[1].flatten(), shared[0])


@pytest.mark.parametrize("make", [lambda: randn(2)[::2], lambda: randn(5, 1).t(),
                                  lambda: randn(5).as_strided((1, 5), (0, 1))], ids=["step", "column_t", "stride0"])
def test_an_input_whose_size_one_dim_has_an_odd_stride_is_written_in_place(make):
    """The write-back compared strides dim by dim, size-1 dims too: the value stored into the
    input itself looked like another tensor, and copying it onto itself raised."""
    def f(x):
        x.mul_(2).add_(1)
        return x.sum()
    x, mine = make(), make()
    mine.copy_(x)
    got, want = minicompile.compile(f)(mine), f(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(mine, x)


def _set_through_expanded(y):
    v = y.unsqueeze(0).expand(2, *y.shape)
    v[0] = 3
    return y * 1


def _mul_through_expanded(y):
    y.expand(4, *y.shape)[1].mul_(2)
    return y.sum()


@pytest.mark.parametrize("fn", [_set_through_expanded, _mul_through_expanded])
def test_a_write_through_one_slice_of_an_expanded_view_of_an_input(fn):
    """v = y.expand(4, ...); v[1].mul_(2) writes y once per element, as eager does: the write
    went back through the expanded view on its own, whose elements share memory, and raised."""
    compiled = minicompile.compile(fn)
    for n in (5, 5, 8):
        y = randn(3, n)
        mine = y.clone()
        torch.testing.assert_close(compiled(mine), fn(y))
        torch.testing.assert_close(mine, y)


def _reshaped_through_itself(x):
    a = (x * 2)[:, 0]
    b = a.flatten()              # 1-D: eager returns a itself
    b.unsqueeze_(0)
    c = a.float()                # a float tensor: a itself
    c.squeeze_(0)
    return a.shape, b.shape, a + 1


def test_a_shape_changed_in_place_through_an_op_that_returns_its_input():
    """b = a.flatten() of a 1-D a, or a.float() of a float a, is a itself in eager: b.unsqueeze_(0)
    gives a the new shape too. Traced, a kept its old one."""
    compiled = minicompile.compile(_reshaped_through_itself)
    for n in (5, 5, 8):
        x = randn(n, 4)
        got, want = compiled(x), _reshaped_through_itself(x)
        assert got[:2] == want[:2]
        torch.testing.assert_close(got[2], want[2])


def test_an_inference_tensor_written_in_place_outside_inference_mode_raises():
    """Eager refuses to write an inference tensor outside inference mode; the graph wrote it."""
    with torch.inference_mode():
        t = randn(4)

    def f(t):
        t.add_(1)
        return t * 2
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
        minicompile.compile(f)(t)


def _doubles_then_adds(x):
    x.mul_(2)
    x.add_(1)
    return x + 1


def _writes_a_slice(x):
    x[1:].mul_(2)
    return x.sum()


@pytest.mark.parametrize("fn", [_doubles_then_adds, _writes_a_slice])
def test_a_written_input_counts_its_writes_as_eagers_so_autograd_sees_them(fn):
    """The kernel may store the new value straight into the input: its version counter goes
    up all the same, once per in-place op as in eager, and so a tensor saved for backward and
    then written by the compiled call makes backward raise eager's error (a gradient from the
    changed values otherwise)."""
    compiled = minicompile.compile(fn)
    for make in (lambda: randn(7, 9), lambda: randn(9, 7).t()):
        mine, theirs = make(), None
        theirs = mine.clone()
        before = mine._version, theirs._version
        compiled(mine)
        fn(theirs)
        assert mine._version - before[0] == theirs._version - before[1]

    for run in (fn, compiled):
        a = torch.randn(5, 4, requires_grad=True)
        b = a * 1
        y = b.sin()                             # saves b for backward
        with torch.no_grad():
            run(b)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


class _ScaledByABuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.rand(5, device=DEVICE) + 0.5)

    def forward(self, x):
        y = x * self.scale                 # eager's product saves scale for x's gradient
        self.scale.mul_(2)                 # and then it is written
        return y


def _saved_as_a_value_then_written(x, s):
    y = x * (s * 2)                        # eager saves s * 2, not s: its backward raises nothing
    s.mul_(3)
    return y


def test_an_input_eager_saves_for_backward_and_the_graph_writes_raises_at_backward_as_eager():
    """A tensor eager's autograd saves as it is, written later in the function: eager's
    backward raises (the write moved its version counter); the compiled call's too (it gave
    the gradient of the old value). Where eager saved a value computed from the tensor, both
    give that value's gradient."""
    for module in (_ScaledByABuffer(), minicompile.compile(_ScaledByABuffer())):
        x = randn(3, 5).requires_grad_()
        y = module(x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    grads = []
    for fn in (_saved_as_a_value_then_written, minicompile.compile(_saved_as_a_value_then_written)):
        torch.manual_seed(1)
        x, s = randn(3, 5).requires_grad_(), randn(5)
        fn(x, s).square().sum().backward()
        grads.append((x.grad, s))
    torch.testing.assert_close(grads[1], grads[0])


def _exp_in_place_then_shifted(x):
    y = x * 2
    y.exp_()                               # its backward reads y as exp_ wrote it
    y.add_(1)
    return y


def _relu_in_place_then_accumulated(x):
    h = F.relu(x * 3, inplace=True)
    h += x
    return h


def _leaky_then_clipped_in_place(x):
    h = F.leaky_relu(x * 3, 0.1, inplace=True)     # eager's saves h as it wrote it (the
    return F.hardtanh(h, inplace=True)             # out-of-place leaky_relu saves its input)


@pytest.mark.filterwarnings("ignore:minicompile. the graph runs on PyTorch's kernels")
@pytest.mark.parametrize("fn", [_exp_in_place_then_shifted, _relu_in_place_then_accumulated,
                                _leaky_then_clipped_in_place])
def test_an_inplace_op_whose_saved_result_is_written_again_raises_at_backward_as_eager(fn):
    """`y.exp_()` saves its own result for backward; `y.add_(1)` then changes it, and eager's
    backward raises. The compiled call's backward gave the gradient of the program written
    without the writes (saves by the op that writes a tensor were all taken to be of its
    value before the write)."""
    for run in (fn, minicompile.compile(fn)):
        x = randn(3, 4).requires_grad_()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            run(x).sum().backward()


def _squared_in_place(x, w):
    y = x * 2
    y.mul_(y)                              # eager saves `other`, y, then writes y
    return y


def _half_scaled_by_the_other_half(x, w):
    y = x * 2
    y[:2].mul_(y[2:])                      # a view of the memory it writes
    return y


def _scaled_by_itself_detached(x, w):
    y = x * 2
    y.addcmul_(w, y.detach())              # detach() shares y's version counter
    return y


def _squared_in_place_input(x, w):
    x.mul_(x)
    return x * w


def _scaled_by_its_data(x, w):
    y = x * 2
    y.mul_(y.data)                         # no error (`.data` has a version counter of its own):
    return y * w                           # eager's backward reads y.data as mul_ wrote it


@pytest.mark.filterwarnings("ignore:minicompile. the graph runs on PyTorch's kernels")
@pytest.mark.parametrize("fn", [_squared_in_place, _half_scaled_by_the_other_half,
                                _scaled_by_itself_detached, _squared_in_place_input, _scaled_by_its_data])
def test_an_inplace_op_handed_what_it_writes_as_another_argument_behaves_as_eager(fn):
    """`y.mul_(y)`: eager's mul_ saves its other argument, the tensor it then writes, and its
    backward raises. The compiled call's gave a gradient (saves by the op that writes a tensor
    were all taken to be of the argument it writes), or none at all for an input; and through
    `y.data`, whose new value eager's backward reads, the gradient of y before the write."""
    outcomes = []
    for run in (fn, minicompile.compile(fn)):
        torch.manual_seed(0)
        x0, w = randn(4, 3).requires_grad_(), randn(4, 3).requires_grad_()
        try:
            run(x0 * 1, w).sum().backward()
            outcomes.append((x0.grad, w.grad))
        except RuntimeError as e:
            assert "modified by an inplace operation" in str(e)
            outcomes.append(None)
    if outcomes[0] is None:
        assert outcomes[1] is None
    else:
        torch.testing.assert_close(outcomes[1], outcomes[0])


def _data_written_after_a_product(x, w):
    y = x @ w
    w.data.mul_(0.5)                       # an update autograd does not see
    return y.sum()


def test_a_write_through_data_after_a_use_is_read_by_the_backward_as_eager():
    """x @ w saves w for x's gradient; `w.data.mul_(0.5)` after it leaves w's version as it
    was (`.data` has a counter of its own), so eager's backward reads the halved w. The compiled
    call's read the w of before the write, and moved w's version."""
    results = []
    for fn in (_data_written_after_a_product, minicompile.compile(_data_written_after_a_product)):
        torch.manual_seed(1)
        x, w = randn(7, 13).requires_grad_(), randn(13, 5).requires_grad_()
        fn(x, w).backward()
        results.append((x.grad, w.grad, w.detach(), w._version))
    torch.testing.assert_close(results[1], results[0])


class _MovingAverage(nn.Module):
    """A buffer updated in place, then read by a product that saves it for backward."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, device=DEVICE))
        self.register_buffer("ema", torch.rand(8, device=DEVICE) + 0.5)

    def forward(self, x):
        self.ema.mul_(0.9).add_(x.detach().mean(0) * 0.1)
        return (x * self.w * self.ema).sum()


def test_a_buffer_written_then_saved_for_backward_trains_as_eager():
    """The forward stores the buffer's new value straight into it, and saves it: its version
    moves before it is saved, as eager's two writes come before its product saves it (the
    backward raised "is at version 2; expected version 0")."""
    torch.manual_seed(0)
    modules = [_MovingAverage(), None]
    modules[1] = minicompile.compile(copy.deepcopy(modules[0]))
    results = []
    for m in modules:
        torch.manual_seed(1)
        inner = getattr(m, "_orig_mod", m)
        version = inner.ema._version              # (deepcopy writes the copy once)
        for _ in range(2):
            m(randn(4, 8)).backward()
        results.append((inner.w.grad, inner.ema, inner.ema._version - version))
    torch.testing.assert_close(results[1], results[0])


class _UpdatesAnAverageThroughData(nn.Module):
    """Multiplies by a buffer, then updates it through `.data`, as EMA trackers do."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(13, 7).to(DEVICE)
        self.register_buffer("ema", torch.randn(7, device=DEVICE))

    def forward(self, x):
        h = self.l(x)
        y = (h * self.ema).tanh()
        self.ema.data.mul_(0.9).add_(h.detach().mean(0), alpha=0.1)
        return y


class _ReadsTheRunningVarianceFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.l, self.bn = nn.Linear(13, 7).to(DEVICE), nn.BatchNorm1d(7).to(DEVICE)

    def forward(self, x):
        h = self.l(x)
        return self.bn(h) + h * self.bn.running_var       # the product saves running_var


@pytest.mark.parametrize("make", [_UpdatesAnAverageThroughData, _ReadsTheRunningVarianceFirst])
def test_a_buffer_saved_and_then_updated_trains_as_eager(make):
    """The backward reads what eager's does: the tanh eager saved was computed from the
    buffer before its `.data` update (the compiled backward computed it again from the new
    one: wrong gradients); batch norm's update of its running statistics leaves their versions
    as they were, as eager's kernel does (the backward raised "modified by an inplace
    operation")."""
    torch.manual_seed(0)
    model = make()
    mine = copy.deepcopy(model)
    compiled = minicompile.compile(mine)
    results = []
    for m, inner in ((model, model), (compiled, mine)):
        versions = [b._version for b in inner.buffers()]
        torch.manual_seed(1)
        m(randn(6, 13)).pow(2).mean().backward()
        results.append(([p.grad for p in inner.parameters()], list(inner.buffers()),
                        [b._version - v for b, v in zip(inner.buffers(), versions)]))
    torch.testing.assert_close(results[1], results[0])


def _doubles_one_through_data(w, a, b):
    y = (w * b).sum()
    a.data.mul_(2)
    return y


def test_a_write_through_data_into_an_input_passed_twice_leaves_its_version():
    """One tensor passed as two inputs, written through `.data` (the graph runs on PyTorch's
    kernels, its inputs sharing memory): `.data` is run as `.data`, not as the detach it is
    traced as, whose writes moved the version and made the backward raise."""
    results = []
    for fn in (_doubles_one_through_data, minicompile.compile(_doubles_one_through_data)):
        torch.manual_seed(0)
        w, x = randn(7, 13).requires_grad_(), randn(7, 13)
        version = x._version
        fn(w, x, x).backward()
        results.append((w.grad, x, x._version - version))
    torch.testing.assert_close(results[1], results[0])


def _written_saved_written_through_data(x, w):
    x.mul_(2)
    y = x * w                              # eager saves x (as it is after the first write)
    x.data.add_(1)                         # and its backward reads the x of after this one
    return y


def _written_saved_written_again(x, w):
    x.mul_(2)
    y = x * w
    x.add_(1)                              # eager's backward raises: x changed since it was saved
    return y


def _saved_result_written(x, w):
    e = (x * w).exp()                      # exp saves its result
    e.add_(1)                              # which eager's backward finds changed
    return e


def _saved_result_written_through_data(x, w):
    e = (x * w).exp()
    y = e * 3
    e.data.add_(1)                         # eager's backward reads the new e
    return y


@pytest.mark.parametrize("fn", [_written_saved_written_through_data, _written_saved_written_again,
                                _saved_result_written, _saved_result_written_through_data])
def test_a_tensor_saved_for_backward_and_then_written_is_read_or_refused_as_eager(fn):
    """Eager's autograd saves a tensor, not its value: written in place after it is saved (an
    input written before too, or a value the graph computed), eager's backward raises, or,
    written through `.data`, reads the new values. The compiled backward read the value of
    when it was saved (a wrong gradient, or no error)."""
    results = []
    for run in (fn, minicompile.compile(fn)):
        torch.manual_seed(1)
        x, w = randn(6, 5) + 3, randn(6, 5).requires_grad_()
        version = x._version
        try:
            run(x, w).square().sum().backward()
            results.append((w.grad, x, x._version - version))
        except RuntimeError as err:
            assert "modified by an inplace operation" in str(err)
            results.append("raised")
    _assert_same_outcome(*results)


def _sigmoid_and_product(x, w):
    h = x @ w
    return torch.sigmoid(h), h * 2, h


@pytest.mark.parametrize("written", [0, 1, 2])
def test_an_output_written_after_the_call_raises_at_backward_where_eagers_saved_it(written):
    """sigmoid saves its result, which the caller then writes: eager's backward raises, as
    the compiled one now does (it recomputed the sigmoid from the saved product). Eager saves
    neither h * 2 nor h, and its backward runs with either written; the compiled forward saves
    h (to compute the sigmoid's gradient from), and, h written, its backward computes the
    gradients from the graph run again (it raised, as torch.compile's does)."""
    results = []
    for run in (_sigmoid_and_product, minicompile.compile(_sigmoid_and_product)):
        torch.manual_seed(1)
        x, w = randn(6, 5), randn(5, 4).requires_grad_()
        outs = run(x, w)
        outs[written].mul_(-1)
        try:
            sum(o.sum() for o in outs[:2]).backward()
            results.append(w.grad)
        except RuntimeError as err:
            assert "modified by an inplace operation" in str(err)
            results.append("raised")
    _assert_same_outcome(*results)


def _assert_same_outcome(eager, compiled):
    if isinstance(eager, str) or isinstance(compiled, str):
        assert compiled == eager
    else:
        torch.testing.assert_close(compiled, eager)


def _clone_read_by_an_extern(x):
    v = x.clone()
    return torch.div(v, 2, rounding_mode="floor"), v


def test_a_returned_clone_read_by_an_op_without_a_lowering_is_a_tensor_of_its_own():
    """An op lowering leaves to PyTorch (div with rounding_mode) read the clone as a view of
    the input's buffer, and the output, the same value, became the input itself: writing the
    returned clone wrote x (in training, where the graph returns the clone to autograd)."""
    for requires_grad in (False, True):
        x = randn(3, 4).requires_grad_(requires_grad)
        before = x.detach().clone()
        _, v = minicompile.compile(_clone_read_by_an_extern)(x)
        assert v.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        with torch.no_grad():
            v.add_(100)
        assert torch.equal(x.detach(), before)


def _written_then_viewed_by_its_memory(a):
    a[torch.tensor([0], device=a.device)] = 1.0
    return a.as_strided([3], [1], a.storage_offset()) * 2


def test_as_strided_of_an_input_written_before_reads_its_memory_as_eager():
    """as_strided's offset and strides place the view in the input's memory, which the input's
    new value (a tensor of its own) is not: it read 3 elements too far on, in an input with an
    offset (base[1:]). Such a graph runs on PyTorch's kernels."""
    for make in (lambda: randn(5, 3)[1:], lambda: randn(4, 3)):
        base = make()
        ours = base._base.clone()[1:] if base._base is not None else base.clone()
        expected = _written_then_viewed_by_its_memory(base)
        got = minicompile.compile(_written_then_viewed_by_its_memory)(ours)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(ours, base)


def _not_differentiated_in_place(a):
    v = a + 1
    v.logical_not_()                     # not differentiable: v keeps its history
    w = a * 3
    w.gt_(0)
    return v, w + a


def test_an_in_place_op_autograd_does_not_differentiate_leaves_the_history_as_eager():
    """`v.logical_not_()`: eager's autograd leaves v's history as it was (a later use's
    gradient flows on into it); made a value (logical_not(v)), it lost it: v did not require
    grad, a's gradient was short. `w.gt_(0)` makes w's history a comparison's (zero gradient),
    as a value does."""
    results = []
    for fn in (_not_differentiated_in_place, minicompile.compile(_not_differentiated_in_place)):
        torch.manual_seed(0)
        a = randn(4, 5).requires_grad_()
        v, y = fn(a)
        (v.sum() + y.sum()).backward()
        results.append((v, y, v.requires_grad, a.grad))
    assert_same(results[1], results[0])


def _taken_then_negated(a):
    v = torch.take(a, torch.tensor([1, 2], device=a.device))     # eager saves a for its backward
    a.logical_not_()
    return v


def test_an_input_eager_saves_and_a_later_op_writes_makes_the_backward_raise():
    """torch.take saves its input; written after (here by the graph's own non-differentiable
    op, which a leaf allows; or after the call), eager's backward raises. The compiled backward,
    which needs no more than the input's size, ran."""
    for fn in (_taken_then_negated, minicompile.compile(_taken_then_negated)):
        a = randn(4).requires_grad_()
        v = fn(a)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            v.sum().backward()


def test_an_input_whose_negation_is_pending_is_read_as_its_values():
    """`z.conj().imag` is a view whose memory holds the values negated until resolved (its
    negative bit): the kernels read the memory, every value with the wrong sign. Such a graph
    runs on PyTorch's kernels."""
    z = torch.randn(5, dtype=torch.complex64, device=DEVICE)
    x = z.conj().imag
    assert x.is_neg()
    torch.testing.assert_close(minicompile.compile(lambda t: t * 2 + 1)(x), x * 2 + 1)
