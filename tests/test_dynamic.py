"""Dynamic shapes: graphs generic in a size, against eager and the real torch.compile.

A dynamic dimension is a size symbol from capture to the generated kernels (a kernel argument),
so a new size runs the same compiled code: no new trace, no new kernel. Each test checks every
result against eager on fresh random inputs and counts compiles, against torch.compile's count
on the same sequence where the two should agree.
"""
import copy
import math
import re
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from conftest import DEVICE
from helpers import assert_same, graph_counter, randn


def torch_compiles(fn, calls, dynamic=None, mark=None):
    """How many graphs torch.compile makes over `calls` (argument tuples)."""
    torch._dynamo.reset()
    counter, graphs = graph_counter()
    compiled = torch.compile(fn, backend=counter, dynamic=dynamic)
    for args in calls:
        if mark:
            mark(args)
        compiled(*args)
    torch._dynamo.reset()
    return len(graphs)


def our_compiles(fn, calls, dynamic=None, mark=None, dtype=torch.float32):
    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(fn, dynamic=dynamic)
    for args in calls:
        if mark:
            mark(args)
        assert_same(compiled(*args), fn(*args), dtype)
    return minicompile.metrics.graphs


def rows_softmax(x, y):
    return torch.softmax(x * 2, -1) + y.sum(-1, keepdim=True)


def test_sizes_2_to_64_cost_two_compiles(kernel_backend):
    # dynamic=None: the first call compiles for its sizes; the first size change recompiles
    # with that dimension symbolic, and every later size reuses that graph and its kernels
    calls = [(torch.randn(n, 7, device=DEVICE), torch.randn(n, 3, device=DEVICE)) for n in range(2, 65)]
    assert our_compiles(rows_softmax, calls) == 2
    assert torch_compiles(rows_softmax, calls) == 2


def test_a_new_size_runs_the_same_kernels(kernel_backend):
    f = minicompile.compile(rows_softmax)
    for n in (5, 6):
        f(torch.randn(n, 7, device=DEVICE), torch.randn(n, 3, device=DEVICE))
    frame = next(iter(minicompile.api._CACHES.values()))
    entry = list(frame)[0]                           # newest first: the dynamic one
    # the size is read from the input on each call and passed to the kernels
    assert re.search(r"\bs\d+ = arg0\.size\(0\)", entry.compiled.wrapper_source)
    assert "5" not in re.sub(r"\w*\d\w*", "", entry.compiled.kernel_source)
    kernels = entry.compiled.kernels
    for n in (9, 31, 64):
        x, y = torch.randn(n, 7, device=DEVICE), torch.randn(n, 3, device=DEVICE)
        assert_same(f(x, y), rows_softmax(x, y))
    assert list(frame)[0] is entry and entry.compiled.kernels is kernels
    assert len(list(frame)) == 2 and minicompile.metrics.graphs == 2


def test_row_length_dynamic_too(kernel_backend):
    # the reduced dimension changes: rows of any length (a looped reduction over a size argument)
    calls = [(torch.randn(4, n, device=DEVICE), torch.randn(4, 3, device=DEVICE)) for n in (5, 6, 17, 300, 2)]
    assert our_compiles(rows_softmax, calls) == 2
    assert torch_compiles(rows_softmax, calls) == 2


def means_over_a_dynamic_dim(x):
    return x.mean((0, 2)) + x.mean(-1).sum(0)


def test_a_mean_over_a_dynamic_dim_divides_by_its_whole_size(kernel_backend):
    """The mean's division by a row length that is a product of sizes (9 * s0): Triton's code
    divided by 9 and then multiplied by s0 (`acc / 9*s0`)."""
    calls = [(torch.randn(n, 3, 9, device=DEVICE),) for n in (3, 5, 2, 7)]
    assert our_compiles(means_over_a_dynamic_dim, calls) == 2


def test_a_size_rounded_up_to_a_multiple_is_written_as_integer_arithmetic():
    """A size ceil(s0 / 32) * 32 (the padded row statistics attention saves on a GPU), in the
    wrapper's Python and the kernels' C: (s0 + 31) // 32 * 32, no float."""
    import sympy
    from torch.utils._sympy.functions import CeilToInt, IntTrueDiv
    from minicompile import ir
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    padded = 32 * CeilToInt(IntTrueDiv(s0, 32))
    python = eval("lambda s0: " + ir.render_size(padded))
    assert [python(n) for n in (2, 31, 32, 33, 64, 65)] == [32, 32, 32, 64, 64, 96]
    assert "/ (32)" in ir.render_size(padded, "/")


def norms(x, w, b):
    return F.layer_norm(x, (8,), w, b).relu() + x.var(-1, keepdim=True)


def test_dynamic_true_one_compile_and_0_1_specialized(kernel_backend):
    make = lambda n: (torch.randn(n, 3, 8, device=DEVICE), torch.randn(8, device=DEVICE),  # noqa: E731
                      torch.randn(8, device=DEVICE))
    calls = [make(n) for n in (4, 7, 2, 33)]
    assert our_compiles(norms, calls, dynamic=True) == 1
    assert torch_compiles(norms, calls, dynamic=True) == 1
    # size 1 is specialized (a dim of size 1 broadcasts; it is never made a symbol)
    calls.append(make(1))
    assert our_compiles(norms, calls, dynamic=True) == 2
    assert torch_compiles(norms, calls, dynamic=True) == 2


def test_dynamic_false_compiles_every_size():
    calls = [(torch.randn(n, 7), torch.randn(n, 3)) for n in (3, 4, 5)]
    assert our_compiles(rows_softmax, calls, dynamic=False) == 3
    assert torch_compiles(rows_softmax, calls, dynamic=False) == 3


def test_mark_dynamic_from_the_first_compile(kernel_backend):
    calls = [(torch.randn(n, 7, device=DEVICE), torch.randn(n, 3, device=DEVICE)) for n in (3, 4, 9)]

    def mark(args):
        minicompile.mark_dynamic(args[0], 0)
        torch._dynamo.mark_dynamic(args[1], 0)      # either marks a tensor for both compilers
    assert our_compiles(rows_softmax, calls, mark=mark) == 1
    assert torch_compiles(rows_softmax, calls, mark=mark) == 1


def test_mark_dynamic_rejects_bad_arguments():
    with pytest.raises(TypeError, match="tensor"):
        minicompile.mark_dynamic([1, 2], 0)
    with pytest.raises(IndexError, match="out of range"):
        minicompile.mark_dynamic(torch.randn(3), 1)
    with pytest.raises(TypeError, match="int or a list"):
        minicompile.mark_dynamic(torch.randn(3), "0")


def test_sizes_that_must_agree_are_guarded():
    # x and y broadcast together, so the compiled code needs x.size(0) == y.size(0): a call
    # where they differ must not reuse it, and fails as eager fails
    f = minicompile.compile(rows_softmax)
    for n in (3, 4):
        f(torch.randn(n, 7), torch.randn(n, 3))
    with pytest.raises(Exception) as ours:
        f(torch.randn(5, 7), torch.randn(6, 3))
    with pytest.raises(Exception) as eager:
        rows_softmax(torch.randn(5, 7), torch.randn(6, 3))
    assert type(ours.value) is type(eager.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int64])
def test_dtypes(kernel_backend, dtype):
    def f(x):
        return (x * 3 + 1).sum(-1) - x.amax(-1)
    compiled = minicompile.compile(f)
    for n in (3, 4, 11, 2):
        x = (torch.randn(n, n + 1, device=DEVICE) * 4).to(dtype)
        # half: minicompile rounds once per stored value, eager after each op (1 ulp apart)
        tol = {"atol": 2e-2, "rtol": 1e-2} if dtype == torch.float16 else {}
        torch.testing.assert_close(compiled(x), f(x), **tol)
    assert minicompile.metrics.graphs == 2


def test_non_contiguous_inputs(kernel_backend):
    # a transposed input is dense in another order: dynamic, its strides guarded as
    # functions of its sizes; a strided slice is not: each size is a compile, still right
    def f(x):
        return (x.exp() * 2).sum(0)
    transposed = [(torch.randn(7, n, device=DEVICE).t(),) for n in (3, 4, 9, 2)]
    assert our_compiles(f, transposed) == 2
    assert torch_compiles(f, transposed) == 2
    sliced = [(torch.randn(n, 8, device=DEVICE)[:, ::2],) for n in (3, 4, 9)]
    assert our_compiles(f, sliced) >= 2


def test_broadcast_and_views(kernel_backend):
    def f(x, b):
        y = x.transpose(0, 1).reshape(x.shape[1], -1)        # a static size, read: a constant
        return (x + b).relu()[1:].sum(1) + x[:, -1].mean() + y.sum()
    calls = [(torch.randn(n, 6, device=DEVICE), torch.randn(6, device=DEVICE)) for n in (3, 5, 8)]
    assert our_compiles(f, calls) == 2
    assert torch_compiles(f, calls) == 2


def test_sizes_read_by_the_code_stay_symbolic(kernel_backend):
    # x.shape[0] and x.size(1) are graph nodes (symbolic ints) when the dim is dynamic, and
    # arithmetic on them too, so view(B, -1) and x * T stay generic, as with TorchDynamo
    def f(x):
        B, T = x.shape[0], x.size(1)
        return x.view(B, -1).relu() * T + x.numel() + (T * 2 - 1)
    calls = [(torch.randn(n, n + 1, 4, device=DEVICE),) for n in (2, 3, 4, 5, 9)]
    assert our_compiles(f, calls) == 2
    assert torch_compiles(f, calls) == 2


def test_len_of_a_tensor_is_its_first_size_at_every_call(kernel_backend):
    """len(x) of a dynamic dim is that dim's size in each call (a symbolic int), not the size
    the trace saw; len() of a 0-d tensor raises as eager's does."""
    def f(x):
        return x * len(x), len(x), len(x.t()), len(x[1:])
    calls = [(torch.randn(n, 4, device=DEVICE),) for n in (3, 4, 5, 6)]
    assert our_compiles(f, calls) == 2
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        minicompile.compile(lambda x: len(x.sum()))(torch.randn(3))


def test_int_of_a_size_stays_symbolic(kernel_backend):
    """int(1 + cache.shape[2]) (ProphetNet's positions, each decoding step) is the size itself:
    one graph for every length once it is dynamic, not one per length."""
    def f(cache, w):
        n = int(1 + cache.shape[2])
        return torch.ones(1, 1, dtype=torch.long, device=cache.device) * n + w
    calls = [(torch.zeros(2, 4, n, 8, device=DEVICE), torch.tensor(3, device=DEVICE)) for n in range(1, 8)]
    assert our_compiles(f, calls) == torch_compiles(f, calls) == 2


def test_a_size_compared_with_none_by_identity_stays_symbolic(kernel_backend):
    """`size[i] if size[i] is not None else size[j]` (torch_geometric's propagate, every
    message-passing layer) and `flag = n is None`: a size is never None; the answer does not
    read it, which made its dim static (a graph per node count)."""
    def f(x):
        size = [x.size(0), None]
        n = size[0] if size[0] is not None else size[1]
        missing = size[0] is None
        return torch.zeros(n, 3, device=x.device).index_add(0, torch.arange(x.size(0), device=x.device) % n, x) \
            * (2 if not missing else 3)
    calls = [(randn(n, 3),) for n in (10, 17, 33, 40)]
    assert our_compiles(f, calls) == 2


STATS = {"scale": 1.0}
SCHEDULE = {"optimizer": {"lr": 0.1}}


def test_a_float_read_through_a_global_or_an_argument_changes_without_a_graph_per_value(kernel_backend):
    """A statistic a global dict holds (`stats["norm"] = y.norm().item()`, read back in the
    next graph), a learning rate in an argument's nested dict: after one change, a number the
    graph takes (automatic dynamic, as TorchDynamo's unspecialized floats), not a graph per
    value until the recompile limit."""
    def f(x, schedule):
        return x * STATS["scale"] + schedule["optimizer"]["lr"]
    for step in range(6):
        STATS["scale"], SCHEDULE["optimizer"]["lr"] = 1.0 + step / 7, 0.1 / (step + 1)
        if step == 0:
            minicompile.reset()
            minicompile.metrics.reset()
            compiled = minicompile.compile(f)
        x = randn(4, 3)
        assert_same(compiled(x, SCHEDULE), f(x, SCHEDULE))
    assert minicompile.metrics.graphs == 2


@pytest.mark.parametrize("resize", [
    lambda y: F.interpolate(y, scale_factor=1.7, mode="bilinear"),
    lambda y: F.interpolate(y, scale_factor=(0.6, 1.5), mode="bilinear", align_corners=True),
    lambda y: F.interpolate(y, scale_factor=0.5, mode="area"),
    lambda y: F.interpolate(y, scale_factor=0.45, mode="bilinear", antialias=True),
], ids=["bilinear", "align_corners", "area", "antialias"])
@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_interpolation_by_a_float_scale_at_dynamic_sizes(kernel_backend, resize, train):
    """The output's sizes are trunc(size * scale), computed through a float: written in C and
    Python (kernels, wrapper, guards), and a backward that computes them is generated too."""
    compiled = minicompile.compile(resize)
    for shape in ((2, 3, 8, 8), (1, 3, 7, 9), (3, 3, 10, 6)):
        x = randn(*shape).requires_grad_(train)
        x2 = x.detach().clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            got, want = compiled(x), resize(x2)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        if train:
            got.sin().sum().backward()
            want.sin().sum().backward()
            torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)


def patch_grid_and_scales(x):
    """What diffusers' DiT and positional embeddings compute from a sequence length."""
    b, n = x.shape
    side = int(n ** 0.5)                                   # a patch grid's side
    grid = torch.arange(side, dtype=torch.float32, device=x.device) / (side / 4)
    y = x[:, : side * side].reshape(b, side, side) + grid
    half = x[:, : int(n / 2)] * (n / 2 + 1.5) - 1 / n       # a float of the sizes as a number
    return y / math.sqrt(n), half * -(n / n - 1), x * math.floor(n / 3) + math.ceil(n / 3)


def test_floats_computed_from_sizes_stay_symbolic(kernel_backend):
    """`n / 4`, `int(n / 2)`, `math.floor(n / 3)`, `n ** 0.5`, `math.sqrt(n)` of a dynamic size:
    a float (or an int made of one) the graph computes from the sizes as Python does, not a
    graph per size; TorchDynamo makes them SymFloats. Its -0.0 too (a negated zero)."""
    calls = [(randn(3, n),) for n in (9, 16, 25, 36, 49)]
    assert our_compiles(patch_grid_and_scales, calls) == 2
    x = randn(3, 30)
    assert torch.signbit(minicompile.compile(patch_grid_and_scales)(x)[1]).any()



def test_floats_computed_from_sizes_in_training(kernel_backend):
    """The backward computes them again from the sizes it is handed (partition: size
    arithmetic is recomputed, never saved), and its kernels are generated."""
    def f(x, w):
        b, n = x.shape
        side = int(n ** 0.5)
        y = x[:, : side * side].reshape(b, side, side) * (side / 4) + w[:side, :side]
        return (y / math.sqrt(n)).sin().sum() + (x * -(n / 3 - 1.5)).cos().mean() + (x[:, : int(n / 2)] ** 2).sum() / n
    compiled = minicompile.compile(f)
    for n in (9, 16, 25, 36):
        x, w = randn(3, n).requires_grad_(), randn(8, 8).requires_grad_()
        x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
        compiled(x, w).backward()
        f(x2, w2).backward()
        assert_same((x.grad, w.grad), (x2.grad, w2.grad))
    assert minicompile.metrics.graphs == 2 and minicompile.metrics.backward_kernels > 0

def test_a_size_floor_divided_with_a_negative_numerator_floors_in_every_language(kernel_backend):
    """A stride-2 convolution's output side over a kernel of dynamic size k, (30 - k) // 2 + 1,
    which sympy writes 16 + (-k) // 2: C's and Triton's integer division truncate toward zero
    where Python's floors, so a kernel over that output wrote a row and a column past its
    buffer (a wrong result, then a corrupted heap)."""
    def f(x, w):
        return torch.relu(F.conv2d(x, w, stride=2, padding=1)) * 2

    compiled = minicompile.compile(f)
    x = randn(2, 4, 28, 28)
    for k in (3, 5, 7):
        w = randn(4, 4, k, k)
        minicompile.mark_dynamic(w, 2)
        minicompile.mark_dynamic(w, 3)
        assert_same(compiled(x, w), f(x, w))


def _prints_then_doubles(x):
    print("", end="")                       # a graph break inside the called function
    return x * 2


def halves_through_a_break(inputs):
    a, b = torch.split(inputs, [2, 2], dim=1)
    return torch.cat([a, b - _prints_then_doubles(a)], 1)


def test_a_split_piece_handed_on_at_a_break_stays_dynamic():
    """The code after a break is handed the split's pieces: views with room between their
    channels (a stride of 4 * n for 2 channels of n). Their strides are functions of their
    sizes all the same, so the second length compiles them dynamic, as Dynamo does (6 graphs
    for 10 lengths), not a graph per length until the recompile limit (VITS's WaveNet)."""
    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(halves_through_a_break)
    for n in (19, 29, 30, 54, 21, 66, 40, 33, 45, 50):
        x = torch.randn(2, 4, n, device=DEVICE)
        assert_same(compiled(x), halves_through_a_break(x))
    assert minicompile.metrics.graphs == 6
    piece = torch.randn(2, 6, 23, device=DEVICE)[:, 1:3]      # other room between channels
    assert_same(compiled(torch.cat([piece, piece], 1)), halves_through_a_break(torch.cat([piece, piece], 1)))
    guarded = minicompile.compile(lambda t: t * 3)
    for n in (9, 12):
        t = torch.randn(2, 6, n, device=DEVICE)[:, 1:3]
        assert_same(guarded(t), t * 3)
    dense = torch.randn(2, 2, 12, device=DEVICE)             # the same sizes, no room: guarded
    assert_same(guarded(dense), dense * 3)
    from minicompile import ir
    assert ir.gapped_layout((2, 2, 9), (36, 9, 1)) == ([0, 1, 2], [2, 1, 1])
    assert ir.gapped_layout((5, 0, 3), (3, 3, 1)) is None     # no items: no layout (it divided by 0)
    assert ir.gapped_layout((4, 3), (1, 5)) is None           # a slice along the inner dim


def branches_on_a_sum_of_a_size_divided(x):
    n = x.shape[0]
    if (n + 8) / 4 < 3:                 # n < 4: the guard must divide the sum, not n alone
        return x * 2
    return x - 1


class _Average:
    def __init__(self):
        self.updates = 0


def decays_by_updates(average, x):
    average.updates += 1                # torch_ema's use_num_updates
    return x * min(0.999, (1 + average.updates) / (10 + average.updates))


def test_a_float_of_a_sum_of_sizes_is_guarded_with_its_parentheses(kernel_backend):
    """The guard on `(n + 8) / 4 < 3` spelled the sum without parentheses (n + 8 / 4), so
    the entry compiled at n = 5 (False) passed at n = 2, where the code takes the other side;
    min() of such a float and a constant compared it the same way (a graph per call)."""
    compiled = minicompile.compile(branches_on_a_sum_of_a_size_divided)
    for n in (5, 6, 2, 3, 7):
        x = randn(n)
        assert_same(compiled(x), branches_on_a_sum_of_a_size_divided(x))
    minicompile.metrics.reset()
    average, compiled = _Average(), minicompile.compile(decays_by_updates)
    for i in range(10):
        x = randn(3)
        assert_same(compiled(average, x), x * min(0.999, (2 + i) / (11 + i)))
    assert minicompile.metrics.graphs == 2


class _PerCodebookHeads(nn.Module):
    """BarkFineModel's: an int argument picks a head and slices the input."""
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, idx, x):
        h = x[:, :, : idx + 1].sum(2)
        return self.heads[idx - 1](h).relu()


def test_an_int_read_twice_as_a_python_int_specializes_itself_alone(kernel_backend):
    """dynamic=True: the index makes the int static; reading it again (the ModuleList looks it
    up twice) took it for a size of some other tensor and made every input's dims static (a
    graph per length)."""
    model = _PerCodebookHeads().to(DEVICE)
    compiled = minicompile.compile(model, dynamic=True)
    for n in (7, 9, 12):
        x = randn(2, n, 4, 8)
        assert_same(compiled(2, x), model(2, x))
    assert minicompile.metrics.graphs == 1


def branches_on_a_float_of_a_size(x):
    n = x.shape[-1]
    if n / 4 > 2.5:                     # (n = 10 is 2.5: False, at the boundary)
        return x * (n / 4)
    return x - n / 3


def test_a_branch_on_a_float_of_a_size_is_guarded_as_the_code_computes_it(kernel_backend):
    compiled = minicompile.compile(branches_on_a_float_of_a_size)
    for n in (8, 12, 10, 20, 7, 11):
        x = randn(2, n)
        assert_same(compiled(x), branches_on_a_float_of_a_size(x))
    assert minicompile.metrics.graphs == 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_float_of_sizes_meets_a_half_precision_tensor_as_a_number_does(kernel_backend, dtype):
    """x + n / 7 with x in bfloat16: eager's CPU kernel takes the number as a bfloat16 first
    (as a constant number is taken); x * (n / 3) as it is."""
    def f(x):
        n = x.shape[-1]
        return x + n / 7, x * (n / 3), x > n / 9, x.float() / (n / 3)
    calls = [(randn(3, n, dtype=dtype),) for n in (8, 12, 20, 28)]
    assert our_compiles(f, calls, dtype=dtype) == 2


def test_arithmetic_on_a_dynamic_float_keeps_it_an_input(kernel_backend):
    """lr * 0.5, -lr, lr / 3 of a float that changes (a schedule's learning rate): the graph
    computes them from the input, so a new value is no new graph."""
    def f(x, lr):
        return x * (lr * 0.5) - lr / 3 + (-lr)
    calls = [(randn(5), lr) for lr in (0.1, 0.05, 0.025, 0.0125, 0.5)]
    assert our_compiles(f, calls) == torch_compiles(f, calls) == 2


@pytest.mark.parametrize("expression", [
    lambda x, v: x * abs(v), lambda x, v: x * v ** 2, lambda x, v: x * 2 ** v, lambda x, v: x * pow(v, 3),
    lambda x, v: x * v ** 0.5, lambda x, v: x * 2.0 ** -v, lambda x, v: x * torch.tensor(v),
    lambda x, v: x + torch.tensor(v, dtype=torch.float64)],
    ids=["abs", "square", "two_to_the", "pow", "sqrt", "negative_power", "tensor", "tensor_float64"])
def test_a_power_abs_or_tensor_of_a_changing_float_is_no_graph_per_value(kernel_backend, expression):
    """abs(v), v ** 2, 2 ** v, v ** 0.5, torch.tensor(v) of a float that changes each call (a
    focal loss's annealed gamma): as TorchDynamo, a graph that takes the float, not one per
    value; the power computed in Python as eager's code does (a fractional power of a negative
    base, complex in Python, is guarded off)."""
    calls = [(randn(5), v) for v in (1.5, 2.7, 3.2, 4.9, 0.25)]
    assert our_compiles(expression, calls) == 2
    for v in (-1.5, 0.0):               # a new graph or eager's own error, never a wrong value
        x = randn(5)
        try:
            expected = expression(x, v)
        except ZeroDivisionError:
            with pytest.raises(ZeroDivisionError):
                minicompile.compile(expression)(x, v)
            continue
        assert_same(minicompile.compile(expression)(x, v), expected)


def test_a_split_along_a_dim_that_never_changes_keeps_the_others_dynamic(kernel_backend):
    """qkv.chunk(3, -1) of a projection, unbind(0) of a stacked pair, split(x, [1, n - 1]): the
    number of pieces is fixed by a dim that does not change (or by the list): the batch and
    sequence sizes stay dynamic, one graph (every size was a graph: specializing the split dim
    made every dim static); a list that no longer adds up raises as eager's split does."""
    def attention(x):
        q, k, v = x.chunk(3, dim=-1)
        return (q @ k.transpose(-1, -2)).softmax(-1) @ v

    def pair(x):
        a, b = x.unbind(0)
        return a * b + 1

    def head_and_rest(x):
        first, rest = x.split([1, x.shape[0] - 1])
        return first * 2 + rest.sum(0)

    for fn, shapes in ((attention, [(2, 5, 24), (3, 7, 24), (4, 9, 24)]), (pair, [(2, 5, 3), (2, 7, 4), (2, 9, 6)]),
                       (head_and_rest, [(4, 5), (7, 5), (9, 5)])):
        assert our_compiles(fn, [(randn(*shape),) for shape in shapes], dynamic=True) == 1
    fixed = minicompile.compile(lambda x: x.split([2, 3]), dynamic=True)
    fixed(randn(5, 2))
    with pytest.raises(RuntimeError):
        fixed(randn(6, 2))


@pytest.mark.parametrize("fn", [
    lambda x: x * 2 if x.shape[0] else x, lambda x: x + len(x) if x.numel() else x,
    lambda x: x * (x.shape[0] ** 2) + x.shape[1] ** 3,
    lambda x: x.reshape(math.prod(x.shape)) + 1], ids=["truth", "numel_truth", "square", "prod"])
def test_python_on_a_size_that_keeps_it_symbolic(kernel_backend, fn):
    """`if n:`, n ** 2, math.prod(x.shape) of a dynamic size: a size still (TorchDynamo's
    too), not a graph per size."""
    calls = [(randn(n, n),) for n in (3, 5, 7, 9, 12)]
    assert our_compiles(fn, calls, dynamic=True) == 1
    assert our_compiles(fn, calls) == 2


def test_training_with_a_weight_argument_that_has_a_gradient_stays_size_generic(kernel_backend):
    """dynamic=True, `f(x, w)` with w a weight passed in whose .grad the last step left: one
    graph for every sequence length (the joint trace gave up on a condition tying the stale
    gradient's sizes to w's, and compiled a graph per size); gradients equal eager's."""
    def f(x, w):
        return (x @ w).tanh()

    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(f, dynamic=True)
    w = randn(8, 8).requires_grad_()
    twin = w.detach().clone().requires_grad_()
    warm = randn(2, 3, 8)
    for weight in (w, twin):             # an eager step first: each weight has a .grad
        f(warm, weight).sum().backward()
    for length in (5, 7, 16):
        x = randn(2, length, 8)
        compiled(x, w).sum().backward()
        f(x, twin).sum().backward()
        assert_same(w.grad, twin.grad)
    assert minicompile.metrics.graphs == 1


def test_slices_from_the_end_by_a_dynamic_size(kernel_backend):
    """x[:, 3 - T:], x[:, -T:] (Mamba's last T steps of a padded convolution): a start that is
    negative for every size counts from the end, as Python's slices do, at every length."""
    def f(x):
        T = x.shape[1] - 2
        return x[:, -T:] * 2, x[:, 3 - x.shape[1]:] + 1, x[:, 2 - x.shape[1]: T] - 1, x[:, 1 - T::2]
    calls = [(torch.randn(2, n, device=DEVICE),) for n in (5, 7, 9, 6, 8)]
    assert our_compiles(f, calls) == 2


def test_a_size_compared_in_python_is_guarded_not_specialized():
    # a comparison of a dynamic size (a branch on it) keeps the size symbolic: the guard gets
    # the branch's condition (x.size(0) > 3), as TorchDynamo's does: one compile per branch
    def f(x):
        if x.shape[0] > 3:
            return x * 2
        return x - 1
    calls = [(torch.randn(n, 3),) for n in (2, 3, 4, 5, 7)]
    assert our_compiles(f, calls) == torch_compiles(f, calls) == 3


def test_sizes_compared_as_a_tuple_and_asked_is_tensor_stay_symbolic():
    # XGLM's checks: a size tuple compared with a tuple of sizes, torch.is_tensor of a size
    def f(x):
        n = x.size(0) + 2
        if torch.is_tensor(n) or x.size() != (x.shape[0], 3):
            return x - 1
        return x * n
    calls = [(torch.randn(n, 3),) for n in (2, 3, 4, 5, 7)]
    assert our_compiles(f, calls) == torch_compiles(f, calls) == 2


def test_a_size_tuple_extended_with_a_tuple_stays_symbolic():
    # DeBERTa-v2's heads: x.view(x.size()[:-1] + (heads, -1))
    def f(x):
        return x.view(x.size()[:-1] + (2, -1)).transpose(1, 2) * 2
    calls = [(torch.randn(2, n, 8),) for n in (5, 6, 7)]
    assert our_compiles(f, calls) == torch_compiles(f, calls) == 2


def test_a_broadcast_written_into_a_new_buffer_with_a_dynamic_length():
    # DeepSeek-V3's keys: one rotary part for every head, written into each head's slice; the
    # copy's traced value is a broadcast (stride 0), which no memory can be laid out as
    def f(x, r):
        out = x.new_empty(x.shape[0], 3, x.shape[1], 8)
        out[..., :4].copy_(x.unsqueeze(1))
        out[..., 4:].copy_((r * 2).unsqueeze(1).expand(-1, 3, -1, -1))
        return out
    calls = [(torch.randn(2, n, 4), torch.randn(2, n, 4)) for n in (5, 6, 7)]
    assert our_compiles(f, calls) == 2


def test_a_size_used_as_a_python_int_specializes(capsys):
    # any other use of a dynamic size needs its value (range(), a Python function): that dim
    # becomes static again (guarded by value), so each size compiles; the results stay right
    def f(x):
        total = x[0] * 0
        for i in range(x.shape[0]):
            total = total + x[i]
        return total
    calls = [(torch.randn(n, 3),) for n in (2, 3, 4, 5)]
    minicompile.set_logs(dynamic=True)
    try:
        ours = our_compiles(f, calls)
    finally:
        minicompile.set_logs(dynamic=False)
    assert "made static: the trace used a size" in capsys.readouterr().out
    assert ours == 4


def _padded_to_a_multiple_of_4(x):
    # Pegasus-X's blocks: a length padded to a multiple of the block size when it is not one
    length = x.shape[1]
    if length % 4 != 0:
        x = F.pad(x, (0, 0, 0, 4 - length % 4))
    return x.view(x.shape[0], -1, 4, x.shape[2]).sum(2).tanh(), length % 3


def test_a_branch_on_a_remainder_of_a_size_is_guarded_not_specialized(kernel_backend):
    """`length % 4 != 0` stays symbolic (the guard gets the condition), as TorchDynamo's: one
    compile per branch, not per length, and the batch dim stays dynamic."""
    calls = [(randn(b, n, 6),) for b, n in [(2, 7), (3, 11), (4, 16), (5, 19), (6, 24), (3, 13)]]
    assert our_compiles(_padded_to_a_multiple_of_4, calls) == 3


def test_a_size_read_as_an_int_makes_only_its_own_dim_static(capsys):
    """A length used as a Python int (range) specializes that dim of the input, not the
    batch dim beside it: new batch sizes at one length reuse the one graph."""
    def f(x):
        return sum(x[:, i] for i in range(x.shape[1]))
    minicompile.set_logs(dynamic=True)
    try:
        ours = our_compiles(f, [(randn(b, 3, 4),) for b in (2, 3, 5, 7)], dynamic=True)
    finally:
        minicompile.set_logs(dynamic=False)
    assert "dims [1] made static" in capsys.readouterr().out
    assert ours == 1


def test_a_size_of_a_computed_tensor_read_as_an_int_makes_only_the_dims_it_is_made_of_static(capsys):
    """An RNN-style loop over the length of a tensor the graph computed (an embedding of the
    ids): the length is ids' dim 1, so that dim alone becomes static, and new batch sizes reuse
    the graph."""
    embed = nn.Embedding(97, 8)

    def f(ids):
        h = embed(ids)
        _, n, _ = h.size()
        s = torch.zeros_like(h[:, 0])
        for t in range(n):
            s = s * 0.5 + h[:, t]
        return s
    calls = [(torch.randint(0, 97, (b, n)),) for b, n in ((2, 5), (3, 9), (4, 9), (5, 9), (7, 9))]
    minicompile.set_logs(dynamic=True)
    try:
        with torch.no_grad():
            assert our_compiles(f, calls) == 2
    finally:
        minicompile.set_logs(dynamic=False)
    assert "dims [1] made static" in capsys.readouterr().out


def test_attention_with_a_dynamic_sequence_length(kernel_backend):
    import math

    class Attention(nn.Module):
        def __init__(self, C=32, H=4, T=64):
            super().__init__()
            self.qkv, self.proj, self.H = nn.Linear(C, 3 * C), nn.Linear(C, C), H
            self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.qkv(x).split(C, dim=2)
            q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
            return self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
    model = Attention().to(DEVICE).eval()
    calls = [(torch.randn(2, t, 32, device=DEVICE),) for t in (5, 7, 12, 33, 64)]
    with torch.no_grad():
        # T = 64 (the whole mask) is a case of its own for both: the slice :T is then the mask
        assert our_compiles(model, calls) == torch_compiles(model, calls) == 3


def test_models_with_a_dynamic_batch(kernel_backend):
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).to(DEVICE).eval()
    compiled = minicompile.compile(mlp)
    with torch.no_grad():
        for n in (2, 3, 17, 5):
            x = torch.randn(n, 16, device=DEVICE)
            assert_same(compiled(x), mlp(x))
    assert minicompile.metrics.graphs == 2


def test_as_a_torch_compile_backend_with_dynamic_true(kernel_backend):
    # TorchDynamo hands the backend fake tensors with symbolic sizes and the sizes as inputs
    torch._dynamo.reset()
    compiled = torch.compile(rows_softmax, backend=minicompile.backend, dynamic=True)
    for n in (3, 8, 5):
        x, y = torch.randn(n, 7, device=DEVICE), torch.randn(n, 3, device=DEVICE)
        assert_same(compiled(x, y), rows_softmax(x, y))
    torch._dynamo.reset()


def _sets_a_row(x):
    x[0] = 5.0
    x[:, 1] = -1.0
    return x * 2


def _weighted_sum(x, w):
    return (x * w).sum() + (x @ w.unsqueeze(1)).sum()


@pytest.mark.filterwarnings("ignore:minicompile. a training graph TorchDynamo made generic")
def test_as_a_torch_compile_backend_writes_and_trains_at_every_size():
    """TorchDynamo reuses its size-generic graph at every size: what minicompile makes of it
    (a Python scalar written into an input; a training graph) must hold at each size, not only
    at the first call's."""
    torch._dynamo.reset()
    writes = torch.compile(_sets_a_row, backend=minicompile.backend, dynamic=True)
    trains = torch.compile(_weighted_sum, backend=minicompile.backend, dynamic=True)
    norm = torch.compile(torch.nn.BatchNorm1d(5).to(DEVICE), backend=minicompile.backend)
    eager_norm = copy.deepcopy(norm._orig_mod)
    for n in (7, 13, 9):
        mine = randn(n, n + 2)
        theirs = mine.clone()
        assert_same(writes(mine), _sets_a_row(theirs))
        assert_same(mine, theirs)
        w = torch.randn(n + 2, device=DEVICE, requires_grad=True)
        x = randn(n, n + 2).requires_grad_()
        trains(x, w).backward()
        got = x.grad, w.grad
        x.grad = w.grad = None
        _weighted_sum(x, w).backward()
        assert_same(got[0], x.grad)
        assert_same(got[1], w.grad)
        with torch.no_grad():
            batch = randn(n, 5)
            assert_same(norm(batch), eager_norm(batch))
    assert_same(norm._orig_mod.running_var, eager_norm.running_var)
    torch._dynamo.reset()


def test_other_backends_stay_static():
    # a backend that does not say it takes dynamic graphs gets static ones: each size compiles
    seen = []

    def backend(gm, example_inputs):
        seen.append([tuple(t.shape) for t in example_inputs])
        return gm.forward
    f = minicompile.compile(rows_softmax, backend=backend)
    for n in (3, 4, 5):
        x, y = torch.randn(n, 7), torch.randn(n, 3)
        assert_same(f(x, y), rows_softmax(x, y))
    assert len(seen) == 3


def scaled(x, n):
    return x * n + 1


def view_rows(x, n):
    return x.view(n, -1) * 2


def test_an_int_argument_that_changes_becomes_symbolic(kernel_backend):
    # dynamic=None: an int argument whose value changed is a graph input (a symbolic int)
    # in the second compile, as TorchDynamo makes it a SymInt input; 0 reuses it too
    calls = [(torch.randn(5, device=DEVICE), k) for k in (2, 2, 3, 2, 5, 0, 9, -4)]
    assert our_compiles(scaled, calls) == torch_compiles(scaled, calls) == 2
    # used as a size, it must divide the length; a bad one fails as eager fails
    calls = [(torch.randn(6, device=DEVICE), k) for k in (2, 3, 6)]
    assert our_compiles(view_rows, calls) == torch_compiles(view_rows, calls) == 3
    with pytest.raises(RuntimeError):
        minicompile.compile(view_rows)(torch.randn(6), 4)


def int_arithmetic_past_int64(x, n):
    m = n * 8
    return x + m % 1000, x[m % 5], m


def test_int_arithmetic_on_an_int_argument_is_exact_past_int64(kernel_backend):
    # the kernels compute a symbolic int in int64, Python exactly: 8 * n past int64 must not
    # wrap (n * 8 % 1000 of 2**61 is 616, not 0); such a call recompiles with n static
    compiled = minicompile.compile(int_arithmetic_past_int64)
    minicompile.metrics.reset()
    for n in (5, 6, 7, 2 ** 61, 2 ** 62 + 3, 9, -(2 ** 61)):
        x = randn(5, 7, device=DEVICE)
        assert_same(compiled(x, n), int_arithmetic_past_int64(x, n))
    assert minicompile.metrics.graphs == 5     # 5, then generic in n, then one per value past int64


SIZES_SET_BY_A_NUMBER = {
    "unfold": lambda x, n: (x.unfold(0, n, 1).shape, x.unfold(0, n, 1) + 1),
    "pool": lambda x, n: F.avg_pool1d(x[None], n).shape[-1],
    "split": lambda x, n: (len(x.split(n)), x.split(n)[-1] * 2),
    "chunk": lambda x, n: len(x.chunk(n)),
    "linspace": lambda x, n: (torch.linspace(0, 1, n).shape, torch.linspace(0, 1, n, device=x.device) + x[0, 0]),
    "diag": lambda x, n: x.diag(n).shape,
    "arange of a float": lambda x, a: (torch.arange(0, a, 0.25).sum(), len(torch.arange(0, a, 0.25))),
    "interpolate by a float": lambda x, a: F.interpolate(x[None], scale_factor=a) * 2,
}


@pytest.mark.parametrize("name", SIZES_SET_BY_A_NUMBER)
def test_sizes_an_int_or_float_argument_sets_are_its_own(name):
    # a number argument that changed is a graph input; where an op's sizes (or how many
    # tensors it gives) follow from its value, the number is static again, not the value of
    # the call that compiled (the tensors' sizes did not change, so nothing else recompiled)
    fn = SIZES_SET_BY_A_NUMBER[name]
    compiled = minicompile.compile(fn)
    numbers = (1.5, 2.25, 3.0, 4.75) if "float" in name else (2, 3, 4, 5)
    x = randn(12, 6)
    for n in numbers:
        assert_same(compiled(x, n), fn(x, n))


def batch_norm_by_momentum(x, running_mean, momentum):
    return F.batch_norm(x, running_mean, torch.ones(6, device=x.device), training=True, momentum=momentum), running_mean


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_float_argument_of_batch_norm_is_read_in_the_functional_graph(dynamic):
    # functionalization handed batch_norm's momentum on as the captured graph's node: a float
    # graph input then named no value of the new graph (KeyError in lowering)
    compiled = minicompile.compile(batch_norm_by_momentum, dynamic=dynamic)
    for momentum in (0.1, 0.2, 0.5, 0.9):
        x, stats = randn(8, 6), randn(6)
        assert_same(compiled(x, stats.clone(), momentum), batch_norm_by_momentum(x, stats.clone(), momentum))


def add_into(x, out):
    return torch.add(x, 1, out=out)


def test_out_resized_by_eager_at_a_dynamic_size_is_resized():
    # whether eager resizes `out` hangs on the sizes: a dynamic entry compiled where they
    # matched must not run where they differ (the write back failed there)
    compiled = minicompile.compile(add_into)
    for n in (2, 3, 4, 5):
        x = randn(n)
        out, ref = torch.empty(3, device=DEVICE), torch.empty(3, device=DEVICE)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)      # (eager's deprecation of the resize)
            assert_same(compiled(x, out), add_into(x, ref))
        assert_same(out, ref)


def size_as_python_compares_and_adds_it(x, n):
    grown = x.shape + (n,)
    return x * 1, x.shape == [x.shape[0], 6], list(x.shape) == x.shape, x.shape != [x.shape[0], 6], \
        isinstance(grown, torch.Size), grown.numel(), isinstance((n,) + x.shape, torch.Size)


def test_a_torch_size_with_dynamic_sizes_compares_and_adds_as_python():
    # a tuple (torch.Size) never equals a list; torch.Size + tuple is a torch.Size, tuple +
    # torch.Size a tuple: also where a size or the int beside it is symbolic
    compiled = minicompile.compile(size_as_python_compares_and_adds_it)
    for rows, n in ((2, 2), (3, 3), (4, 4), (5, 5), (4, 7)):
        x = randn(rows, 6)
        assert_same(compiled(x, n), size_as_python_compares_and_adds_it(x, n))


LAID_OUT_BY_EAGERS_KERNEL = {
    "batch norm": lambda x: F.batch_norm(x, torch.zeros(6, device=x.device), torch.ones(6, device=x.device)),
    "rrelu": lambda x: F.rrelu(x, 0.1, 0.3, training=False),
    "power of a number": lambda x: 2 ** x.clamp(max=3),
}


@pytest.mark.parametrize("name", LAID_OUT_BY_EAGERS_KERNEL)
def test_an_output_at_dynamic_sizes_is_laid_out_as_eagers_kernel_lays_it_out(name):
    # of a transposed input, eager's kernel makes these contiguous where their shape
    # functions (the symbolic run) say transposed: the output is eager's, and views as eager's
    fn = LAID_OUT_BY_EAGERS_KERNEL[name]
    compiled = minicompile.compile(fn, dynamic=True)
    for x in (randn(8, 6), randn(9, 6), randn(6, 8).t()):
        got, want = compiled(x), fn(x)
        assert_same(got, want)
        assert got.stride() == want.stride()
        if want.is_contiguous():            # (on a GPU, eager's batch norm keeps the input's layout)
            assert_same(got.view(-1), want.view(-1))


def add_a_number(x, n):
    return x.double() + n


def clamp_by(x, bound):
    return x.clamp(max=bound), torch.add(x, x, alpha=bound)


@pytest.mark.parametrize("dynamic", [None, True])
def test_numbers_past_what_the_kernels_take_are_eagers(dynamic):
    # an int in [2**63, 2**64) is no int64 (eager takes it; the kernels wrapped it), and a
    # float past float32's range is refused by eager's clamp (the symbolic kernel returned x)
    compiled = minicompile.compile(add_a_number, dynamic=dynamic)
    for n in (3, 4, 2 ** 63, 2 ** 63 + 1, 2 ** 64 - 1, -(2 ** 63), 5):
        x = randn(4)
        assert_same(compiled(x, n), add_a_number(x, n))
    compiled = minicompile.compile(clamp_by, dynamic=dynamic)
    for bound in (0.5, 1.5, float("inf"), 2.5, 1e39, -1e300, 0.25):
        x = randn(4)
        try:
            want = clamp_by(x, bound)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match="without overflow"):
                compiled(x, bound)
            assert "without overflow" in str(e)
        else:
            assert_same(compiled(x, bound), want)


SCALE = 2.0


def uses_global_scale(x):
    return (x * SCALE).relu()


def test_a_float_that_changes_becomes_an_input(kernel_backend):
    # dynamic=None: a float argument or global whose value changed is a graph input (a kernel
    # argument) in the second compile, as TorchDynamo makes it one; an int global stays
    # specialized in both
    calls = [(torch.randn(5, device=DEVICE), v) for v in (2.0, 2.5, 3.0, 0.0, -1.5)]
    assert our_compiles(scaled, calls) == torch_compiles(scaled, calls) == 2
    global SCALE

    def set_scale(value):
        def prepare(args):
            global SCALE
            SCALE = value
        return prepare
    for values, expected in [((2.0, 3.0, 4.0), 2), ((2, 3, 4), 3)]:
        counts = []
        for counter in (our_compiles, torch_compiles):
            calls = [(torch.randn(4, device=DEVICE),) for _ in values]
            it = iter(values)
            counts.append(counter(uses_global_scale, calls, mark=lambda args: set_scale(next(it))(args)))
        assert counts == [expected, expected], (values, counts)
    SCALE = 2.0


def branches_on_a_float(x, a):
    if a != 0:
        return x * a
    if a > -1:          # (never reached with a != 0: the guard holds the first answer)
        return x + 1
    return x - 1


def test_a_branch_on_a_dynamic_float_is_guarded(kernel_backend):
    # once the float is a graph input, `if a != 0` is answered for the example and guarded:
    # a call with a = 0 takes the other branch, as eager does
    compiled = minicompile.compile(branches_on_a_float)
    x = torch.randn(5, device=DEVICE)
    for a in (2.0, 3.0, 0.0, 5.0, 0.0):
        torch.testing.assert_close(compiled(x, a), branches_on_a_float(x, a))
    assert minicompile.metrics.recompiles == 2


def rotate_into_a_cache(k, x, w):
    """A KV-cache step as GPT-NeoX writes it: a head of a linear's output (a view of its flat
    buffer), rotated, concatenated onto a cache whose length is dynamic."""
    y = (x @ w).view(1, 1, -1, 24).transpose(1, 2)        # (1, 4, 1, 24)
    q = y.chunk(3, dim=-1)[1]                             # (1, 4, 1, 8)
    rot = torch.cat([-q[..., 1:2], q[..., :1]], dim=-1) * 0.5 + q[..., :2]
    piece = torch.cat([rot, q[..., 2:]], dim=-1)
    return torch.cat([k, piece], dim=-2)


def test_concatenation_onto_a_dynamic_length(kernel_backend):
    """The index of the new piece is (x1 - s0) * 96 + ..., taken modulo 96 by the view: the
    simplification once dropped 96*x1 but kept -96*s0, a negative index (garbage read)."""
    w = torch.randn(32, 96, device=DEVICE)
    compiled = minicompile.compile(rotate_into_a_cache)
    for length in (5, 6, 7, 9, 12):
        k, x = torch.randn(1, 4, length, 8, device=DEVICE), torch.randn(1, 1, 32, device=DEVICE)
        assert_same(compiled(k, x, w), rotate_into_a_cache(k, x, w))
    assert minicompile.metrics.graphs == 2


def test_index_simplification_keeps_a_whole_dividend():
    from minicompile.ir import Index, size_expr
    import sympy
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    x0, x1 = Index.var("x0"), Index.var("x1")
    flat = (x1 + Index({}, size_expr(-s0))) * 96 + x0 + 8          # (x1 - s0) * 96 + x0 + 8
    ranges = {"x0": 8, "x1": size_expr(s0 + 1)}
    assert (flat % 96).simplify(ranges) == x0 + 8                  # the symbolic multiple goes too
    odd = x1 * 96 + Index({}, size_expr(8 - 95 * s0)) + x0         # not a whole multiple: kept
    assert (odd % 96).simplify(ranges) == odd % 96



def test_a_nested_index_is_rendered_once_per_level(monkeypatch):
    """Terms are ordered by their text, and a division's text holds its inner index's: each
    index is rendered once (it was once per comparison, at every level: exponential in the
    depth, minutes for MaxViT's window and grid partitions at dynamic sizes)."""
    from minicompile.ir import Index
    import sympy
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    calls = []
    render = Index._render
    monkeypatch.setattr(Index, "_render", lambda self, floordiv: calls.append(1) or render(self, floordiv))
    index = Index.var("x0")
    for level in range(12):
        index = (index // (s0 + level)) * 3 + index % (s0 + level) + Index.var(f"x{level + 1}")
    index.render()
    assert len(calls) < 100

def sliding_window(cache, new, seen: int, window: int = 6):
    """A sliding-window cache (transformers' Mistral): `seen` counts the rows so far (an int
    that changes every call: a symbol), what is kept starts at max(seen - window, 0), and the
    new rows go after `seen` of them."""
    full = torch.cat([cache[:, :seen], new * 2], dim=1)
    start = max(seen + 1 - window, 0)
    kept = full[:, start:]
    return kept.softmax(-1), torch.cat([new, kept], dim=1).sum(1)


def test_a_sliding_window_stays_generic(kernel_backend):
    compiled = minicompile.compile(sliding_window)
    minicompile.metrics.reset()
    cache = torch.randn(2, 16, 8, device=DEVICE)
    for seen in (3, 4, 5, 7, 9, 12):
        new = torch.randn(2, 1, 8, device=DEVICE)
        assert_same(compiled(cache, new, seen), sliding_window(cache, new, seen))
    assert minicompile.metrics.graphs <= 3


def test_a_view_of_a_dividend_with_a_nonnegative_rest_is_simplified():
    """(x1*768 + x2) // 64 with 0 <= x2 < 768 is 12*x1 + x2 // 64: the transpose of attention's
    output back to (B, T, C) then reads memory in order, so a matrix product takes it as a view
    with no copy kernel (the dividend's rest is >= 0, where C's division is floor division)."""
    B, T, H, D = 2, 5, 12, 64

    def merge_heads(y, w):
        return y.transpose(1, 2).contiguous().view(B, T, H * D) @ w
    y = torch.randn(B, T, H, D, device=DEVICE).transpose(1, 2)
    w = torch.randn(H * D, 16, device=DEVICE)
    minicompile.metrics.reset()
    assert_same(minicompile.compile(merge_heads)(y, w), merge_heads(y, w))
    assert minicompile.metrics.kernels == 0


def at_the_largest(x):
    y = x.clone()
    y[y.argmax()] = 0
    return x[x.argmax()] * 2, y


def test_an_index_the_graph_computes_with_dynamic_sizes():
    """x[x.argmax()]: the fake run that makes size-generic code cannot index by a value, so
    the graph is compiled for the example's sizes (and guarded), not failed."""
    for dynamic in (None, True):
        minicompile.reset()
        compiled = minicompile.compile(at_the_largest, dynamic=dynamic)
        for n in (5, 7, 9):
            x = torch.randn(n, device=DEVICE)
            assert_same(compiled(x), at_the_largest(x))


def tensor_of_items(x):
    return torch.tensor([x[0], x[1]]) + 1


def shifted_mask(x):
    return (x > 0) << 2


@pytest.mark.parametrize("fn", [tensor_of_items, shifted_mask])
def test_ops_that_cannot_run_on_size_symbols_are_compiled_for_the_sizes_seen(fn):
    """torch.tensor of a list of tensors reads their data; bool << int's meta function checks
    the dtype: neither runs on fake tensors, so with dynamic sizes the graph is compiled for
    the example's sizes (and guarded), not failed."""
    compiled = minicompile.compile(fn)
    for n in (3, 4, 6):
        x = torch.arange(n, device=DEVICE) - 1
        assert_same(compiled(x), fn(x))


def trim_the_convolution(x, w):
    h = torch.conv1d(x, w)
    return h[..., 1:h.shape[-1] - 1]


def test_a_slice_of_dynamic_bounds_on_an_ops_result_without_a_lowering():
    """The slice PyTorch takes of the convolution's result (Encodec's unpadding): its bounds
    worked out from each call's sizes in the generated wrapper (a symbol in a constant slice
    raised TypeError)."""
    compiled = minicompile.compile(trim_the_convolution)
    w = torch.randn(4, 4, 3, device=DEVICE)
    for n in (10, 20, 40):
        x = torch.randn(2, 4, n, device=DEVICE)
        assert_same(compiled(x, w), trim_the_convolution(x, w))


def unrolled(x):
    """Hiera's unroll: views of views, each a division and a modulo of the one inside."""
    b, _, c = x.shape
    size = [16, 16]
    x = x.view(b, *size, c)
    for _ in range(2):
        size = [s // 2 for s in size]
        x = x.view(b, size[0], 2, size[1], 2, c).permute(0, 2, 4, 1, 3, 5).flatten(0, 2)
        b *= 4
    return x.reshape(-1, 256, c).cos() * 2


def test_nested_views_of_a_dynamic_batch_simplify_each_index_once(monkeypatch):
    """An index nests the same inner index under a division and a modulo at each level: each
    one is simplified once (it was exponential in the depth, minutes of sympy for Hiera)."""
    from minicompile import ir
    calls = []
    simplified = ir.Index.simplified
    monkeypatch.setattr(ir.Index, "simplified", lambda self, ranges: calls.append(1) or simplified(self, ranges))
    ir._SIMPLIFIED.clear()
    compiled = minicompile.compile(unrolled)
    for b in (2, 3):
        x = torch.randn(b, 256, 8, device=DEVICE)
        assert_same(compiled(x), unrolled(x))
    assert len(calls) < 300


def _branches_on_equal_sizes(a, b):
    if a.shape[0] == b.shape[0]:
        return a * 2
    return b * 3


def _writes_the_second(a, b):
    b.add_(a.sum())
    return a + 1


@pytest.mark.filterwarnings("ignore:minicompile.*shares memory with another input")
@pytest.mark.parametrize("dynamic", [True, None])
def test_one_tensor_passed_twice_is_an_entry_of_its_own(dynamic):
    """f(x, x) traces one tensor under two names, one set of size symbols: a later call with
    two tensors of other sizes must not reuse it (TorchDynamo's duplicate-input guard)."""
    compiled = minicompile.compile(_branches_on_equal_sizes, dynamic=dynamic)
    for n in (7, 13):
        x = randn(n, n)
        assert_same(compiled(x, x), _branches_on_equal_sizes(x, x))
    a, b = randn(9, 9), randn(8, 9)
    assert_same(compiled(a, b), _branches_on_equal_sizes(a, b))
    assert_same(compiled(b, b), _branches_on_equal_sizes(b, b))

    written = minicompile.compile(_writes_the_second, dynamic=dynamic)
    for n in (7, 13):
        x, y = randn(n, n), None
        y = x.clone()
        assert_same(written(x, x), _writes_the_second(y, y))
        assert_same(x, y)
    base = randn(9, 9)
    mine, theirs = base.clone(), base.clone()
    assert_same(written(mine, mine[1:]), _writes_the_second(theirs, theirs[1:]))
    assert_same(mine, theirs)


class _Holder:
    def __init__(self, x):
        self.shape, self.x = x.shape[:-1], x


def _reshaped_after_a_break(x):
    held = _Holder(x)
    print("", end="")                      # a graph break with `held` live
    return held.x.sum(-1).reshape(held.shape) * 2


def _expanded(x, n):
    return x.expand(torch.Size((n,)) + x.shape) * 2


def _windowed(x, window):
    return x[window] * 2


def _resized(x, size):
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False) * 2


def _sliced_by_a_tensor(x):
    n = torch.floor(torch.as_tensor(7 * x.shape[-1] / 5)).long()
    return (x * 2)[..., :n] + 1


@pytest.mark.parametrize("case", ["size_held_by_an_object", "size_made_of_an_int", "window_passed_in",
                                  "output_size_passed_in", "index_with_ellipsis", "slice_bound_by_a_tensor"])
def test_sizes_and_windows_the_call_passes_become_symbolic_not_a_graph_each(case):
    """A torch.Size an object holds across a break (a distribution's batch shape), one made of
    an int argument (`sample((n,))`), a tuple of slices passed in (sliding windows), an output
    size passed in as a tuple of ints (an interpolation's): their ints
    change from call to call, and automatic dynamic takes them as it takes an int argument, as
    TorchDynamo does. A slice bounded by a tensor breaks the graph, and the rest is compiled."""
    fn, calls = {
        "size_held_by_an_object": (_reshaped_after_a_break, [(randn(n, 5),) for n in (7, 13, 33, 40, 41)]),
        "size_made_of_an_int": (_expanded, [(randn(5), n) for n in (3, 4, 7, 9, 11)]),
        "window_passed_in": (_windowed, [(randn(4, 64), (slice(None), slice(s, s + 16))) for s in range(0, 48, 6)]),
        "output_size_passed_in": (_resized, [(randn(1, 3, 5, 5), (h, h + 1)) for h in (8, 10, 12, 14, 16)]),
        "index_with_ellipsis": (_windowed, [(randn(2, 3, 64), (Ellipsis, None, slice(s, s + 8))) for s in range(0, 40, 5)]),
        "slice_bound_by_a_tensor": (_sliced_by_a_tensor, [(randn(2, n),) for n in (700, 701, 703, 705)]),
    }[case]
    compiled = minicompile.compile(fn)
    minicompile.metrics.reset()
    for args in calls:
        assert_same(compiled(*args), fn(*args))
    frames = 2 if case in ("size_held_by_an_object", "slice_bound_by_a_tensor") else 1
    # (each frame: its first compile, and one generic in what changed)
    limit = 2 * frames if case != "slice_bound_by_a_tensor" else 2 * len(calls)
    assert minicompile.metrics.graphs <= limit


_QKV = torch.randn(8, 24, device=DEVICE)


def _attention_unpacking_qkv(x):
    B, T, D = x.shape
    q, k, v = (x @ _QKV).view(B, T, 3, 2, 4).permute(2, 0, 3, 1, 4)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_unpacking_a_tensor_makes_only_its_first_dim_static():
    """`q, k, v = qkv` reads the length of the first dim (3, static here): the batch and the
    sequence length stay dynamic (a graph per shape before), as in TorchDynamo."""
    compiled = minicompile.compile(_attention_unpacking_qkv)
    minicompile.metrics.reset()
    for B, T in [(2, 7), (2, 13), (3, 33), (4, 9), (5, 17)]:
        x = randn(B, T, 8)
        assert_same(compiled(x), _attention_unpacking_qkv(x))
    assert minicompile.metrics.graphs <= 3


def _checks_by_an_unused_reshape(x):
    y = x.abs()
    y.reshape(2, -1)                     # nothing reads it: eager's raises where numel is odd
    return y * 2


def _checks_by_an_unused_expand(x):
    x.expand(4, 6)
    return x + 1


@pytest.mark.parametrize("fn, bad", [(_checks_by_an_unused_reshape, (5, 7)), (_checks_by_an_unused_expand, (3, 6))])
def test_a_view_nothing_reads_still_checks_its_sizes_as_eager(fn, bad):
    """A dead view was dropped before lowering, and with it the condition between sizes that its
    compiled code would check: at a size eager's view refuses, the compiled call returned."""
    compiled = minicompile.compile(fn, dynamic=True)
    x = torch.randn(4, 6)
    torch.testing.assert_close(compiled(x), fn(x))
    with pytest.raises(RuntimeError) as theirs:
        fn(torch.randn(*bad))
    with pytest.raises(RuntimeError) as mine:
        compiled(torch.randn(*bad))
    assert str(mine.value) == str(theirs.value)


def _halved_aligned_and_doubled(x):
    n = x.shape[0]                 # (sizes of new tensors: torch 2.11 specializes some slices)
    return torch.arange(n >> 1) * 2, x.new_ones(n & ~3) * 3, x * (n & 3), x.new_zeros(n << 1) + 1


def test_shifts_and_masks_of_a_size_keep_it_dynamic():
    """n >> 1, n & ~3, n & 3, n << 1 of a dynamic size (an alignment, a half): a graph per size."""
    compiled = minicompile.compile(_halved_aligned_and_doubled, dynamic=True)
    for n in (5, 6, 9, 13, 16):
        x = torch.randn(n, 3)
        for got, want in zip(compiled(x), _halved_aligned_and_doubled(x)):
            torch.testing.assert_close(got, want)
    assert minicompile.metrics.graphs == 1
