"""Lowering, fusion and code generation, tested through the backend contract alone.

Graphs come from torch.fx.symbolic_trace (independent of minicompile's capture); every result is
compared with eager PyTorch on fresh random inputs. Each test runs once per kernel backend that
this machine can run (C++; Triton through its interpreter on a CPU, for real on a GPU).
"""
import ctypes
import os
import re
import time
import warnings

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import minicompile
from conftest import DEVICE, HAS_TRITON
from helpers import assert_same, randn
from minicompile.graph_compiler import compile_graph


def run_compiled(fn, *args):
    gm = torch.fx.symbolic_trace(fn)
    compiled = compile_graph(gm, list(args))
    return compiled(*args)


def check(fn, *args, dtype=torch.float32, **tolerance):
    """Compiled equals eager. Long float32 sums differ from eager by summation order alone;
    such tests pass a tolerance scaled to the number of terms."""
    expected = fn(*args)
    actual = run_compiled(fn, *args)
    if tolerance:
        torch.testing.assert_close(actual, expected, **tolerance)
    else:
        assert_same(actual, expected, dtype)
    return actual


POINTWISE = {
    "relu_chain": lambda x: torch.relu(x + 1) * 2,
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": lambda x: F.silu(x),
    "hardswish": lambda x: F.hardswish(x * 4),
    "hardsigmoid": lambda x: F.hardsigmoid(x * 4) * x,
    "sigmoid_tanh": lambda x: torch.sigmoid(x) * torch.tanh(x) - x.abs(),
    "exp_log": lambda x: torch.log(torch.exp(x) + 1.5).sqrt(),
    "rsqrt_div": lambda x: x / (x.abs() + 1) + torch.rsqrt(x * x + 2),
    "where_compare": lambda x: torch.where(x > 0.5, x * 3, -x),
    "clamp": lambda x: x.clamp(-0.5, 0.7) + torch.clamp(x, min=0.1),
    "max_min": lambda x: torch.maximum(x, x * 0.5) - torch.minimum(x, -x),
    "erf_pow": lambda x: torch.erf(x) + (x.abs() + 1) ** 2,
    "pow_constants": lambda x: x ** 3 - x.abs() ** 0.5 + (x.abs() + 1) ** -2 + (x.abs() + 0.5) ** 1.7 + x ** 0,
    "pow_tensor_exponent_falls_back": lambda x: (x.abs() + 0.5) ** x,
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_ops(kernel_backend, name):
    check(POINTWISE[name], randn(123, 45))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_awkward_sizes_and_layouts(kernel_backend, layout):
    shape = (1823, 781) if kernel_backend == "cpp" or DEVICE == "cuda" else (183, 78)
    check(lambda x: torch.relu(x + 1) * 2, randn(*shape, layout=layout))


def test_broadcast_inputs(kernel_backend):
    x, row, col = randn(37, 19), randn(19), randn(37, 1)
    check(lambda x, r, c: (x + r) * c - r, x, row, col)
    check(lambda x, r: x * r.expand(37, 19), x, row)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dtypes(kernel_backend, dtype):
    x = randn(67, 129, dtype=dtype)
    check(lambda x: F.gelu(x * 2 + 1) - x, x, dtype=dtype)
    check(lambda x: x.sum(-1), x, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mobilenet_activations_and_global_pooling(kernel_backend, dtype):
    # hardswish/hardsigmoid around their kinks (-3, 3), with a NaN; global average pooling
    # of a channels-last input, fused with the work before and after it
    x = randn(5, 6, 7, 9, dtype=dtype) * 4
    x[0, 0, 0, 0] = float("nan")
    tolerance = dict(rtol=1e-2, atol=1e-2) if dtype != torch.float32 else dict(rtol=1e-5, atol=1e-5)
    check(lambda x: F.hardswish(x) - F.hardsigmoid(x), x, equal_nan=True, **tolerance)
    pool = lambda x: F.hardsigmoid(F.adaptive_avg_pool2d(F.hardswish(x), 1)) * x
    check(pool, x, equal_nan=True, **tolerance)
    check(pool, x.contiguous(memory_format=torch.channels_last), equal_nan=True, **tolerance)
    check(lambda x: F.adaptive_avg_pool2d(x, (1, 1)).flatten(1), x[1:, :, 1:, 2:], equal_nan=True, **tolerance)


def test_type_promotion(kernel_backend):
    a = randn(31, 17)
    i = torch.randint(-5, 5, (31, 17), device=DEVICE)
    check(lambda a, i: a * i + i, a, i)
    check(lambda a, i: (i > 0) & (a < 0.5), a, i)
    check(lambda i: i * 3 + 1, i)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_last_dim_reductions(kernel_backend, op, keepdim):
    x = randn(129, 781)
    check(lambda x: getattr(torch, op)(torch.relu(x) * 2 + 1, -1, keepdim=keepdim), x)


def test_reductions_other_dims(kernel_backend):
    x = randn(13, 29, 31)
    check(lambda x: x.sum(0), x)
    check(lambda x: x.amax((0, 2)), x)
    check(lambda x: x.mean(1, keepdim=True), x)
    check(lambda x: x.sum(), x, rtol=1e-5, atol=x.numel() * 2e-7)
    check(lambda x: x.max(), x)


def test_long_rows_use_looped_reduction(kernel_backend):
    x = randn(7, 10007)
    check(lambda x: x.sum(-1) + x.amax(-1), x)


def test_non_contiguous_reduction(kernel_backend):
    check(lambda x: x.sum(-1), randn(781, 123, layout="transposed"))


def test_softmax_layer_norm(kernel_backend):
    x, w, b = randn(67, 129), randn(129), randn(129)
    check(lambda x: torch.softmax(x, -1), x)
    check(lambda x: F.log_softmax(x, dim=-1), x)
    check(lambda x, w, b: F.layer_norm(x, (129,), w, b), x, w, b)


def test_views(kernel_backend):
    x = randn(6, 10, 14)
    check(lambda x: x.permute(2, 0, 1) * 2, x)
    check(lambda x: x.transpose(0, 1).sum(-1), x)
    check(lambda x: x.reshape(60, 14) + 1, x)
    check(lambda x: (x * 2).view(6, 140).sum(-1), x)
    check(lambda x: x[:, 2:9:3, 1] + x[0, 1:4, 5] - x[..., 3:, None][:, 1, :3, 0], x)
    check(lambda x: x.unsqueeze(1).squeeze(1) * x[None, ...].squeeze(0), x)


def test_extern_matmul_with_pointwise(kernel_backend):
    a, b, bias = randn(33, 65), randn(65, 17), randn(17)
    check(lambda a, b, bias: torch.relu(a @ b + bias), a, b, bias)
    check(lambda a, b, bias: F.linear(a, b.t(), bias).softmax(-1), a, b, bias)


def test_op_without_lowering_falls_back_to_pytorch(kernel_backend):
    x = randn(20, 30)
    check(lambda x: torch.cumsum(x + 1, 1) * 2, x)


def test_multiple_outputs_and_shared_intermediate(kernel_backend):
    x = randn(50, 60)

    def f(x):
        y = torch.sigmoid(x) * torch.tanh(x) + torch.exp(x) / (x.abs() + 1)
        return y + 1, y.sum(-1), x
    expected = f(x)
    actual = run_compiled(f, x)
    for a, e in zip(actual, expected):
        assert_same(a, e)


def test_relu_chain_is_one_kernel(kernel_backend):
    minicompile.metrics.reset()
    check(lambda x: torch.relu(x + 1) * 2, randn(64, 64))
    assert minicompile.metrics.kernels == 1
    (name, read, written), = minicompile.metrics.kernel_bytes
    assert read == written == 64 * 64 * 4


def test_reduction_fuses_its_pointwise_input(kernel_backend):
    minicompile.metrics.reset()
    check(lambda x: (torch.relu(x) * 2 + 1).sum(-1), randn(64, 100))
    assert minicompile.metrics.kernels == 1


def test_torch_compile_backend(kernel_backend):
    torch._dynamo.reset()
    x = randn(45, 67)
    f = torch.compile(lambda x: torch.relu(x + 1) * 2 - x.mean(-1, keepdim=True),
                      backend=minicompile.backend)
    assert_same(f(x), torch.relu(x + 1) * 2 - x.mean(-1, keepdim=True))


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


ONE_KERNEL = {
    "softmax": (lambda x, w: torch.softmax(x, -1), (67, 129)),
    "log_softmax": (lambda x, w: F.log_softmax(x, -1), (67, 129)),
    "layer_norm": (lambda x, w: F.layer_norm(x, (x.shape[-1],), w, w * 0.5), (67, 129)),
    "rms_norm": (lambda x, w: rms_norm(x, w), (67, 129)),
    "layer_norm_3d": (lambda x, w: F.layer_norm(x, (x.shape[-1],), w, None), (3, 23, 129)),
    "sum_and_max_of_same_rows": (lambda x, w: x.sum(-1) + x.amax(-1), (67, 129)),
    "softmax_long_rows": (lambda x, w: torch.softmax(x * 2, -1), (5, 6001)),
    "rms_norm_long_rows": (lambda x, w: rms_norm(x, w), (5, 6001)),
}


@pytest.mark.parametrize("name", sorted(ONE_KERNEL))
def test_row_fusion_one_kernel(kernel_backend, name):
    fn, shape = ONE_KERNEL[name]
    x, w = randn(*shape), randn(shape[-1])
    minicompile.metrics.reset()
    check(fn, x, w)
    assert minicompile.metrics.kernels == 1, name
    (_, read, written), = minicompile.metrics.kernel_bytes
    assert written == fn(x, w).numel() * 4          # intermediates stay in registers


def test_row_fusion_keeps_intermediates_that_are_returned(kernel_backend):
    x = randn(33, 65)

    def f(x):
        m = x.amax(-1, keepdim=True)
        return torch.softmax(x, -1), m
    actual, expected = run_compiled(f, x), f(x)
    for a, e in zip(actual, expected):
        assert_same(a, e)


def test_no_fusion_across_rows(kernel_backend):
    # the second reduction reads the first one's results along another dim: not row-local
    x = randn(30, 40)
    check(lambda x: (x - x.amax(0, keepdim=True)).sum(-1), x)
    check(lambda x: x.sum(-1, keepdim=True).t() + x[:1, :30], x)


def test_extern_output_layout_follows_realized_inputs(kernel_backend):
    # Eager passes attention non-contiguous views and gets an output laid out as (B, T, H, D);
    # the compiled graph passes realized (contiguous) inputs: the output layout differs, and
    # kernels reading it must use the layout it really has.
    def f(qkv):
        q, k, v = qkv.split(16, dim=2)
        q, k, v = (t.view(2, 8, 2, 8).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).contiguous().view(2, 8, 16) * 2
    check(f, randn(2, 8, 48))


def test_attention_with_a_boolean_mask(kernel_backend):
    # masks as models build them: from positions (a view whose key dim has stride 0), from
    # padding (broadcast over queries and heads), and one that masks whole rows (NaN rows)
    q, k, v = (randn(3, 7, 2, 8).transpose(1, 2) for _ in range(3))    # (3, 2, 7, 8) views

    def by_position(q, k, v):
        keep = torch.arange(7, device=q.device) >= 0
        mask = keep[None, None, :, None].expand(3, 1, 7, 7)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3) * 2

    def by_padding(q, k, v, pad):
        mask = pad[:, None, None, :].expand(3, 1, 7, 7)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    pad = torch.rand(3, 7, device=DEVICE) > 0.3
    pad[:, 0] = True
    check(by_position, q, k, v)
    check(by_padding, q, k, v, pad)
    causal = torch.ones(7, 7, dtype=torch.bool, device=DEVICE).tril()
    causal[2] = False                                                  # a row that attends to nothing
    actual = run_compiled(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, causal)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    torch.testing.assert_close(actual, expected, equal_nan=True)


def test_var_std_batch_norm_dropout(kernel_backend):
    x = randn(37, 53)
    check(lambda x: x.var(-1), x)
    check(lambda x: torch.std(x, dim=1, keepdim=True) + x, x)
    check(lambda x: x.var(0, unbiased=False), x)
    check(lambda x: F.dropout(x * 2, p=0.3, training=False), x)
    img, mean, var, w, b = randn(4, 6, 5, 7), randn(6), randn(6).abs() + 0.5, randn(6), randn(6)
    check(lambda img, m, v, w, b: F.relu(F.batch_norm(img, m, v, w, b, training=False)), img, mean, var, w, b)


def test_var_is_one_kernel(kernel_backend):
    minicompile.metrics.reset()
    check(lambda x: x.var(-1), randn(37, 53))
    assert minicompile.metrics.kernels == 1


def test_dead_buffers_are_reused(kernel_backend):
    def f(x):
        a = x.sum(0, keepdim=True)        # reductions over one dim, then the other: a kernel each
        b = (x - a).amax(1, keepdim=True)
        c = (x * b).sum(0, keepdim=True)
        d = (x + c).amin(1, keepdim=True)
        return (x - d).mean(0)
    x = randn(64, 32)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x])
    assert_same(compiled(x), f(x))
    # a dead buffer's memory is taken by a later one, or written over by the kernel reading it
    source = compiled.wrapper_source
    assert source.count("reuses") + source.count("# in place") >= 2, source


@pytest.mark.skipif(not torch.cuda.is_available(), reason="eager's CUDA division and sqrt, to the bit")
def test_float32_division_is_rounded_to_nearest_beside_a_float64_tensor():
    """A float64 tensor elsewhere in the graph leaves a float32 kernel's division and square
    root rounded to nearest, as eager's CUDA kernels compute them (Triton's own `/` and sqrt
    are approximate for float32); a kernel of float64 values divides in float64."""
    def f(x, y, d):
        return x / y + x.abs().sqrt(), (d / 3.0).sqrt() + d
    x, y = torch.randn(4096, device="cuda"), torch.rand(4096, device="cuda") + 0.5
    d = torch.rand(1000, device="cuda", dtype=torch.float64)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, y, d])
    for got, expected in zip(compiled(x, y, d), f(x, y, d)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU beside the CPU")
def test_a_cpu_number_gpu_kernels_read_is_copied_to_the_gpu_once_a_call():
    def f(x, t):                  # t: a 0-dim CPU tensor, read by two reductions (two kernels)
        return (x * t).sum(0, keepdim=True) * t + (x - t).amax(1, keepdim=True)
    x, t = torch.randn(33, 17, device="cuda"), torch.tensor(1.5)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, t])
    assert_same(compiled(x, t), f(x, t))
    assert len(compiled.kernels) >= 2 and compiled.wrapper_source.count(".to(") == 1, compiled.wrapper_source


def test_outputs_are_written_over_dead_inputs_read_at_the_same_positions(kernel_backend):
    # an MLP's residual kernels and its closing layer norm write over the product they read
    # (as Inductor's in_out_ptr): the product's memory is the kernel's own, dead after it, and
    # read only where the kernel writes. A C++ kernel's two pointers are then not __restrict__
    def mlp(x, w1, b1, w2, b2, lw, lb):
        h = F.gelu(F.linear(x, w1) + b1) + x
        h = F.gelu(F.linear(h, w2) + b2) + h
        return F.layer_norm(h, (48,), lw, lb)
    for x in (randn(37, 48), randn(37, 2, 48)[:, 1]):     # the second is not contiguous
        args = [x, randn(48, 48) / 7, randn(48), randn(48, 48) / 7, randn(48), randn(48), randn(48)]
        compiled = compile_graph(torch.fx.symbolic_trace(mlp), args)
        assert_same(compiled(*args), mlp(*args))
        overwritten = re.findall(r"= (\w+)(?:\.as_strided.*)?  # in place", compiled.wrapper_source)
        assert len(overwritten) == 2, compiled.wrapper_source
        if kernel_backend == "cpp":
            for kernel in compiled.kernel_source.split("// ---- kernel")[1:]:
                signature = kernel.split(") {")[0]
                assert signature.count("__restrict__") < signature.count("_ptr"), signature


def test_a_buffer_written_over_in_place_is_let_go_of_after_the_kernel(kernel_backend):
    """The name of a product a kernel writes over in place is deleted after that kernel: kept
    to the end of the graph, it held the memory after the result was freed (a BERT layer's
    two products, 150 MB of a training forward's peak on the H100)."""
    def f(x, w, b):
        h = torch.relu(x @ w + b)              # written over the product x @ w
        return (h @ w).sum(0)
    x, w, b = randn(37, 48), randn(48, 48) / 7, randn(48)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, w, b])
    assert_same(compiled(x, w, b), f(x, w, b))
    lines = compiled.wrapper_source.splitlines()
    overwritten = [(i, m.group(1)) for i, line in enumerate(lines)
                   if (m := re.search(r"= (\w+)(?:\.as_strided.*)?  # in place", line))]
    assert overwritten, compiled.wrapper_source
    for i, name in overwritten:
        deleted_at = [j for j, line in enumerate(lines) if line.strip().startswith("del ")
                      and name in line.strip()[4:].split(", ")]
        # deleted right after the kernel (the line after the overwrite launches it)
        assert deleted_at and deleted_at[0] <= i + 3, compiled.wrapper_source


@pytest.mark.parametrize("case", ["two positions", "read later", "an output", "an input", "a cast",
                                  "a view of an argument"])
def test_inputs_that_must_keep_their_values_are_not_written_over(kernel_backend, case):
    def f(x, w):
        y = x @ w
        if case == "two positions":             # y[i, j] and y[j, i]: one lane would clobber another's
            return torch.relu(y) + y.t()
        if case == "read later":                # y is read again by a later kernel
            z = torch.relu(y) * 2
            return z.sum(0) + y.amax(0)
        if case == "an output":
            return torch.relu(y) * 2, y
        if case == "an input":
            return torch.relu(x) * 2
        if case == "a cast":                    # same bytes, other dtype
            return (torch.relu(y) * 2).to(torch.int32)
        v = torch.einsum("ij->ji", y)           # einsum may hand back a view of its argument
        return torch.relu(v) * 2, y
    x, w = randn(37, 37), randn(37, 37)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, w])
    leaves = torch.utils._pytree.tree_leaves
    for actual, expected in zip(leaves(compiled(x, w)), leaves(f(x, w))):
        assert_same(actual, expected)
    # neither the product (buf0) nor an argument is written over (a reduction's result, read
    # once by the last kernel, may be)
    overwritten = re.findall(r"= (\w+)(?:\.as_strided.*)?  # in place", compiled.wrapper_source)
    assert not {"buf0", "arg0", "arg1"} & set(overwritten), compiled.wrapper_source


def test_pointwise_after_extern_is_generated(kernel_backend):
    # regression: the extern's predicted layout must not carry the meta device into lowering
    minicompile.metrics.reset()
    check(lambda x, w: torch.relu(x @ w) * 2, randn(6, 4), randn(4, 5))
    assert minicompile.metrics.kernels == 1


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_split_reductions_of_few_long_rows(kernel_backend, op):
    # one (or a few) very long rows: on a GPU reduced in two stages so many programs share the
    # work; in C++ one loop, parallel
    x = randn(2, 2**16 + 2**14) if kernel_backend == "cpp" or DEVICE == "cuda" else randn(2, 2**16)
    tol = dict(rtol=1e-4, atol=x.shape[1] * 1e-6)
    check(lambda x: getattr(torch, op)(x, -1), x, **tol)
    check(lambda x: getattr(torch, op)(x * 2), x, **tol)
    check(lambda x: getattr(torch, op)(x.t(), 0, keepdim=True), x, **tol)
    minicompile.metrics.reset()
    check(lambda x: getattr(torch, op)(x), x, **tol)
    # Triton: partial results, then their reduction; C++ runs the one long loop in parallel
    assert minicompile.metrics.kernels == (1 if kernel_backend == "cpp" else 2)


def test_repeated_launches_and_misaligned_inputs(kernel_backend):
    # later launches take the fast path on a GPU; a pointer with another alignment must not
    f = minicompile.compile(lambda x, y: torch.relu(x + 1) * y)
    for _ in range(3):
        x, y = randn(33, 19), randn(33, 19)
        assert_same(f(x, y), torch.relu(x + 1) * y)
    base = randn(34, 19)
    x = base[1:]                         # same shape and strides, data 76 bytes in: misaligned
    assert x.data_ptr() % 16 != 0
    y = randn(33, 19)
    assert_same(f(x, y), torch.relu(x + 1) * y)
    assert_same(f(x, y), torch.relu(x + 1) * y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_bias_joins_the_elementwise_kernel_after_it(kernel_backend, dtype):
    # Triton: the product runs without its bias, which a generated kernel adds: the one of
    # the elementwise work that reads the result, or one of its own (a view, the output)
    if dtype == torch.float16 and DEVICE == "cpu":
        pytest.skip("half matrix products are a GPU case")

    def f(x, w1, b1, w2, b2, w3, b3):
        h = F.gelu(F.linear(x, w1, b1)) + x
        q, k = F.linear(h, w2, b2).split(24, dim=-1)
        return F.linear(h * 2, w3, b3), q * k
    args = [randn(3, 37, 48, dtype=dtype).transpose(0, 1), randn(48, 48, dtype=dtype) / 7, randn(48, dtype=dtype),
            randn(48, 48, dtype=dtype) / 7, randn(48, dtype=dtype), randn(29, 48, dtype=dtype) / 7, randn(29, dtype=dtype)]
    gm = torch.fx.symbolic_trace(f)
    compiled = compile_graph(gm, args)
    for actual, expected in zip(compiled(*args), f(*args)):
        assert_same(actual, expected, dtype) if dtype == torch.float32 else \
            torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)
    # with C++ kernels the bias stays in the product (the CPU's addmm adds it for less), which
    # writes into memory the wrapper's plan gives it (out=)
    if kernel_backend == "cpp":
        assert compiled.wrapper_source.count("torch.addmm(") == 3 and "linear(" not in compiled.wrapper_source
        return
    products = re.findall(r"linear\((.*)\)", compiled.wrapper_source)
    # Triton: torch.mm on 2-D views (the rows, the weight transposed), no bias
    assert not products and compiled.wrapper_source.count("torch.mm(") == 3, compiled.wrapper_source


def test_kernels_with_the_same_code_are_defined_once(kernel_backend):
    # an MLP's layers make the same elementwise kernel: it is defined once (so compiled once),
    # while each call site passes its own buffers

    def f(x, w1, w2, w3, b):
        for w in (w1, w2, w3):
            x = torch.relu(F.linear(x, w, b)) + x
        return x.sum(-1)
    args = [randn(37, 48), *(randn(48, 48) / 7 for _ in range(3)), randn(48)]
    compiled = compile_graph(torch.fx.symbolic_trace(f), args)
    assert_same(compiled(*args), f(*args))
    source = compiled.kernel_source
    calls = re.findall(r"^    (kernel\d+)[\[(]", compiled.wrapper_source, re.M)
    # the third layer's kernel also sums its rows: code of its own
    assert calls == ["kernel0", "kernel1", "kernel2"], compiled.wrapper_source
    defined = re.findall(r"^def (kernel\d+)|void (kernel\d+)\(", source, re.M)
    assert ["".join(names) for names in defined] == ["kernel0", "kernel2"], source
    if kernel_backend == "triton":
        assert re.findall(r"^(kernel\d+) = (kernel\d+)", source, re.M) == [("kernel1", "kernel0")]


@pytest.mark.parametrize("rows, cols", [(64, 256), (37, 129), (16, 8192), (3, 1000)])
def test_masks_are_constant_when_blocks_divide_the_sizes(rows, cols):
    # the in-range masks are constants (which Triton's compiler drops) exactly when the block
    # sizes divide the sizes; a weight read by every row asks the cache to keep it
    from minicompile.graph_compiler import generated_source

    from minicompile.codegen.triton import _pointwise_config, _reduction_config

    def gelu_bias(x, w):
        return F.gelu(x + w)

    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    x, w = randn(rows, cols), randn(cols)
    pointwise, reduction = (generated_source(torch.fx.symbolic_trace(f), [x, w], "triton")
                            for f in (gelu_bias, rms_norm))
    assert "RBLOCK" not in pointwise and "RBLOCK" in reduction
    assert ("xmask = tl.full" in pointwise) == (rows * cols % _pointwise_config(rows * cols)[0] == 0)
    _, xblock, rblock, _ = _reduction_config(rows, cols)
    assert ("xmask = tl.full" in reduction) == (rows % xblock == 0), reduction
    assert ("rmask = tl.full" in reduction) == (cols % rblock == 0), reduction
    for kernel in (pointwise, reduction):
        loads = re.findall(r"tl.load\(in_ptr(\d) \+ .*", kernel)
        assert sorted(loads) == ["0", "1"], kernel
        for line in re.findall(r"tl.load\(in_ptr\d \+ .*", kernel):   # in_ptr1 is w
            assert ("evict_last" in line) == line.startswith("tl.load(in_ptr1"), kernel
    for f in (gelu_bias, rms_norm):
        check(f, x, w)


def test_loads_come_before_the_arithmetic():
    # The tanh GELU's backward reads g only for its last product: written there, the load
    # waits for memory after the tanh (on the H200, 87 us for 3 x 2^23 float32 elements against
    # torch.compile's 71: results/sweep_heavy_pointwise_h200_loads_where_used.json; 75 with the
    # loads first). Loads go first, in order; a gathered load stays after the index it needs,
    # and a reduction's loads stay in its loop.
    from minicompile.codegen.triton import PERSISTENT_RBLOCK_LIMIT
    from minicompile.graph_compiler import generated_source

    def gelu_tanh_backward(g, x):
        t = torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 0.134145 * x * x))

    def gathered(x, idx, w):
        return torch.tanh(x).sum(-1, keepdim=True) + w[idx.clamp(0, 9)] * x

    g, x, w = randn(8, 96), randn(8, 96), randn(10)
    source = generated_source(torch.fx.symbolic_trace(gelu_tanh_backward), [g, x], "triton")
    lines = [line.strip() for line in source.splitlines() if line.startswith("    tmp")]
    assert [" = tl.load(" in line for line in lines[:3]] == [True, True, False], source
    assert re.findall(r"tl.load\(in_ptr(\d)", source) == ["0", "1"], source
    check(gelu_tanh_backward, g, x)
    for cols in (96, 20000):          # rows in registers; rows walked in loops
        x, idx = randn(3, cols), torch.randint(-3, 12, (3, cols), device=DEVICE)
        lines = generated_source(torch.fx.symbolic_trace(gathered), [x, idx, w], "triton").splitlines()
        loads = [at for at, line in enumerate(lines) if " = tl.load(" in line]
        assert len(loads) == 4 if cols > PERSISTENT_RBLOCK_LIMIT else 3, lines
        for at in loads:
            assert lines[at].startswith(" " * (8 if cols > PERSISTENT_RBLOCK_LIMIT else 4) + "tmp"), lines
            for name in set(re.findall(r"\b(tmp\d+)\b", lines[at].split(" = ", 1)[1])):   # defined above
                assert any(re.match(rf"\s*{name} = ", line) for line in lines[:at]), lines
        check(gathered, x, idx, w)


def test_erf_and_gelu_over_their_whole_range(kernel_backend):
    # the C++ float erf has its own exp (for arguments <= 0): check the tails, zero, NaN, inf
    x = torch.cat([torch.linspace(-12, 12, 20001, device=DEVICE), randn(999) * 4,
                   torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf")], device=DEVICE)])
    check(lambda v: torch.erf(v), x, rtol=0, atol=1e-6, equal_nan=True)
    finite = x[:-2]           # eager's vectorized gelu gives NaN for +inf on some CPUs
    check(lambda v: F.gelu(v) - v.sigmoid(), finite, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_both_backends_print_every_ir_operation():
    from minicompile import ir
    from minicompile.codegen.cpp import CppWriter
    from minicompile.codegen.triton import TritonWriter
    for writer in (CppWriter, TritonWriter):
        missing = set(ir.POINTWISE_OPS) - set(writer.OPS)
        assert not missing, (writer.__name__, missing)


gpu_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="kernel binaries are saved on a GPU")


STAGES_CHILD = r"""
import importlib.util, json, os, sys, tempfile
import torch
import triton
if not os.path.exists(triton.knobs.nvidia.ptxas.path or ""):
    print("SKIP no ptxas in this Triton"); sys.exit()
from triton.backends.compiler import GPUTarget
from minicompile import fusion
from minicompile.codegen import triton as triton_codegen
from minicompile.lower import lower

triton_codegen._gpu_target = lambda: GPUTarget("cuda", 90, 32)      # an H100, without one
def f(x, w):
    return torch.nn.functional.gelu(torch.softmax(x, -1) * w).sum(0) + torch.rsqrt(x.var(-1)).max()
gm = torch.fx.symbolic_trace(f)
buffers_in = [torch.randn(37, 1000), torch.randn(1000, dtype=torch.float64)]
program = lower(gm, buffers_in)
kernels = [s for s in fusion.schedule(program) if isinstance(s, fusion.Kernel)]
buffers = fusion.buffers_by_name(program)
source, meta = triton_codegen.generate(kernels, buffers)
path = os.path.join(tempfile.mkdtemp(), "generated.py")
open(path, "w").write(source)
spec = importlib.util.spec_from_file_location("generated", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
results = []
for name, (args, launch, _) in meta.items():
    fn, dtypes = getattr(module, name), [buffers[a].dtype for a in args]
    settings = {k: v for k, v in launch.items() if k != "grid"}
    facts = []
    for listener in (None, lambda **kw: None):      # a listener sends it through triton.compile
        triton.knobs.compilation.listener = listener
        kernel = triton_codegen._compile_ahead(fn, dtypes, settings)
        base = os.path.join(tempfile.mkdtemp(), "k")
        assert triton_codegen._save_binary(kernel, base) == base
        facts.append((json.load(open(base + ".json")), open(base + ".cubin", "rb").read()))
        assert not kernel.metadata.debug
    # a launch setting of debug=True (a kernel with a device assert) must reach the compiler
    assert triton_codegen._compile_ahead(fn, dtypes, dict(settings, debug=True)).metadata.debug
    results.append([name, facts[0][0] == facts[1][0], facts[0][1] == facts[1][1], facts[0][0]["types"]])
print(json.dumps(results))
"""


def test_stage_runner_builds_the_binaries_triton_compile_builds(tmp_path):
    # minicompile runs Triton's compiler stages itself (no cache lookup, so no hash of
    # Triton's library first): for each generated kernel, the cubin and launch facts must be
    # byte for byte what triton.compile makes. ptxas needs no GPU, so this runs in CI, in a
    # process of its own (without Triton's interpreter), compiling for an H100
    import os
    import subprocess
    import sys
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(minicompile.__file__)),
                                           env.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", STAGES_CHILD], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    if run.stdout.startswith("SKIP"):
        pytest.skip(run.stdout.strip())
    results = __import__("json").loads(run.stdout)
    assert len(results) >= 4
    for name, same_facts, same_cubin, types in results:
        assert same_facts and same_cubin, name
        assert types.startswith("OO")


@gpu_only
def test_kernel_binaries_are_keyed_by_what_they_were_compiled_for(tmp_path, monkeypatch):
    # one kernel text serves several compiles: float32 and float64 inputs (there is no cast in
    # it), rows of 129 and 130 (a constant argument), aligned and misaligned pointers. Each
    # needs a binary of its own; the second round reads them all back from disk
    from minicompile import config
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    for _ in range(2):
        for dtype in (torch.float32, torch.float64):
            for n in (129, 130):
                minicompile.reset()
                f = minicompile.compile(lambda x: (x * 3).sum(-1))
                x = randn(37, n, dtype=dtype, device="cuda")
                assert_same(f(x), (x * 3).sum(-1), dtype)
                misaligned = randn(37 * n + 1, dtype=dtype, device="cuda")[1:].view(37, n)
                assert_same(f(misaligned), (misaligned * 3).sum(-1), dtype)
    assert len(list((tmp_path / "triton" / "bin").glob("*.cubin"))) == 8


@gpu_only
def test_warm_process_runs_kernels_without_importing_triton(tmp_path):
    # a second process finds every kernel's binary on disk: Triton is not even imported
    import subprocess
    import sys
    script = (
        "import sys, torch, minicompile\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(300, 257, device='cuda')\n"
        "f = minicompile.compile(lambda x: torch.softmax(x * 2, -1) + x.relu())\n"
        "err = (f(x) - (torch.softmax(x * 2, -1) + x.relu())).abs().max().item()\n"
        "print('triton' in sys.modules, err)\n")
    env = {**__import__("os").environ, "MINICOMPILE_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    (cold_imported, cold_err), (warm_imported, warm_err) = [r.stdout.split() for r in runs]
    assert cold_imported == "True" and warm_imported == "False"
    assert float(cold_err) < 1e-5 and float(warm_err) < 1e-5


def test_reshape_through_a_view_of_more_dims_indexes_linearly():
    """Rows of an (N*T, C) buffer read through an (N, T, C) view and back: the index
    (C*x0 + x1) // (T*C) is x0 // T, and T*C*(x0 // T) + C*(x0 % T) is C*x0, so the kernel
    reads a plain linear index (its loop vectorizes) with the value unchanged."""
    from minicompile.ir import Index, contiguous_strides, flat_index, unflatten
    x0, x1 = Index.var("x0"), Index.var("x1")
    ranges = {"x0": 10, "x1": 12}
    parts = unflatten(x0 * 12 + x1, [2, 5, 12])
    index = flat_index(parts, contiguous_strides([2, 5, 12]))
    assert index.simplify(ranges) == x0 * 12 + x1
    odd = (x0 * 6 + x1 + 2) % 12                   # 6 divides 12 and x1 + 2 < 6
    simple = odd.simplify({"x0": 9, "x1": 4})
    assert all(simple.substitute({"x0": Index({}, a), "x1": Index({}, b)}).const == (6 * a + b + 2) % 12
               for a in range(9) for b in range(4))


def test_a_walk_of_three_dims_laid_out_in_a_row_indexes_linearly():
    """A channels-last batch norm's rows, n, h and w, walked as one position r (a piece of a
    split reduction): C*H*W*(r // (H*W)) + C*W*((r // W) % H) + C*(r % W) is C*r, with no
    division in the kernel (at 56 x 56 the divisions made the statistics' kernel three times
    slower than its reads). Equal at every position."""
    from minicompile.ir import Index, contiguous_strides, flat_index, unflatten
    r = Index.var("r0")
    n, c, h, w = 4, 8, 6, 5
    parts = unflatten(r, [n, h, w])
    index = flat_index(parts, [h * w * c, w * c, c])
    assert index.simplify({"r0": n * h * w}) == r * c
    nested = ((r // w) % h) * w + r % w
    assert nested.simplify({"r0": n * h * w}) == r % (h * w)


def test_an_index_is_a_value_that_keeps_its_hash_and_crosses_processes():
    """Index keeps its hash once computed (a large model's lowering hashes the same indices
    thousands of times). Equal indices hash equally however they were made; a pickled one
    computes its hash again where it is loaded (a string hashes differently in each process),
    so it is found in that process's dicts. Adding 0 or multiplying by 1 hands back the same
    index; zero terms vanish."""
    import pickle
    import subprocess
    import sys
    from minicompile.ir import FloorDiv, Index
    x0, x1 = Index.var("x0"), Index.var("x1")
    a, b = x0 * 3 + x1 + 2, Index({"x1": 1, "x0": 3, "x2": 0}, 2)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1 and "x2" not in b.terms
    assert a + 0 is a and a * 1 is a and (a + x0 * -3).terms == {"x1": 1}
    nested = Index({FloorDiv(a, 4): 2}, 1)
    assert hash(nested) == hash(Index({FloorDiv(b, 4): 2}, 1))
    code = ("import pickle, sys; from minicompile.ir import Index, FloorDiv; "
            "i = pickle.loads(sys.stdin.buffer.read()); x0, x1 = Index.var('x0'), Index.var('x1'); "
            "print({Index({FloorDiv(x0 * 3 + x1 + 2, 4): 2}, 1): 'found'}.get(i, 'missing'))")
    run = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(nested), capture_output=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.stdout.decode().strip() == "found", run.stderr.decode()[-2000:]


@pytest.fixture
def cpp_backend():
    """C++ kernels (for tests that read their source); they serve CPU tensors only."""
    if DEVICE != "cpu":
        pytest.skip("C++ kernels serve CPU tensors")
    minicompile.config.cpu_backend = "cpp"


def test_gelu_of_a_reshaped_product_vectorizes(cpp_backend):
    """A GELU read through views of another rank (a transformer's MLP): no division in the
    kernel's index, results eager's."""
    def f(x, w):
        h = (x @ w).view(3, 7, 130)
        return F.gelu(h, approximate="tanh").view(21, 130) * 2
    x, w = randn(21, 33), randn(33, 130)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, w])
    assert_same(compiled(x, w), f(x, w))
    loads = re.findall(r"in_ptr\d+\[([^\]]*)\]", compiled.kernel_source)
    assert loads and not any("/" in index or "%" in index for index in loads), loads


@pytest.mark.parametrize("cols", [781, 100])
def test_column_reductions_vectorize_across_rows(cpp_backend, cols):
    """Reductions over dim 0 (a bias's gradient; a layer norm weight's, whose mean and rstd
    per row are one value across the columns) and over the leading dims of a 3-D tensor walk
    the contiguous columns in the innermost loop, in parallel blocks of columns (a partial
    last block of 781); sums of long columns, a max with a NaN, eager's results."""
    def f(a, b, c, mean, rstd):
        return a.sum(0), (a * b).sum(0), a.amax(0), c.mean((0, 1)), (a * ((b - mean) * rstd)).sum(0)
    a, b, c = randn(1023, cols), randn(1023, cols), randn(3, 37, cols)
    mean, rstd = randn(1023, 1), randn(1023, 1).abs()
    a[5, 3] = float("nan")
    compiled = compile_graph(torch.fx.symbolic_trace(f), [a, b, c, mean, rstd])
    for actual, expected in zip(compiled(a, b, c, mean, rstd), f(a, b, c, mean, rstd)):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4, equal_nan=True)
    source = compiled.kernel_source
    assert source.count("acc0[") >= 4 and ("x0_block" in source) == (cols > 128), source
    assert not re.search(r"\b(double|float) acc\d+ =", source), source     # no column walked alone


@pytest.mark.parametrize("shape, dims", [((16, 32, 12, 12), (0, 2, 3)),     # batch norm's: a short x loop
                                         ((5, 200, 3, 7), (0, 2, 3)),       # more than a block of channels
                                         ((4, 24, 9, 11), (2, 3))])         # rows (n, c): an outer loop
def test_a_variance_of_columns_walks_them_twice_across_rows(cpp_backend, shape, dims):
    """A channels-last tensor's variance over all dims but the channels (batch norm's training
    statistics): its squared deviations read the mean, so the rows are walked twice, each time
    vectorized across the contiguous channels, the mean passed on in an array (one walk of
    each channel on its own, its elements 32 floats apart, took 1.1 ms of the CPU CNN's 6 ms
    training step). Values far from zero, where a sum of squares would lose every digit."""
    def stats(x):
        var, mean = torch.var_mean(x, dims, correction=0)
        return var, mean, x.amax(dims)

    def batch_norm(x, w, b):
        return F.batch_norm(x, None, None, w, b, training=True)
    x = (randn(*shape) * 3 + 1000).to(memory_format=torch.channels_last)
    x[1, 2, 1, 1] = float("nan")
    w, b = randn(shape[1]), randn(shape[1])
    compiled = compile_graph(torch.fx.symbolic_trace(stats), [x])
    for actual, expected in zip(compiled(x), stats(x)):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4, equal_nan=True)
    sources = [compiled.kernel_source]
    if dims[0] == 0:
        y = (randn(*shape) * 3 + 1000).to(memory_format=torch.channels_last)
        compiled = compile_graph(torch.fx.symbolic_trace(batch_norm), [y, w, b])
        # (eager's own error here, against float64, is up to 5e-4)
        torch.testing.assert_close(compiled(y, w, b), batch_norm(y, w, b), rtol=1e-3, atol=2e-3)
        assert "result0[" in compiled.kernel_source, compiled.kernel_source
        sources.append(compiled.kernel_source)
    for source in sources:      # accumulators are arrays, one element per channel
        assert "acc0[" in source and not re.search(r"\b(double|float) acc\d+ =", source), source


def test_a_mask_shared_by_the_channels_is_one_value_across_them(cpp_backend):
    """Rows (n, c) of a channels-last tensor summed over H and W, weighted by a mask per (n, h,
    w) that every channel shares: the mask is the same in every lane of the channel loop, so
    the sums still vectorize across the channels."""
    def f(x, m):
        return (x * m).sum((2, 3)), (x * m).amax((2, 3))
    x, m = randn(3, 40, 6, 7).to(memory_format=torch.channels_last), randn(3, 1, 6, 7)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, m])
    for actual, expected in zip(compiled(x, m), f(x, m)):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    source = compiled.kernel_source
    assert "acc0[" in source and not re.search(r"\b(double|float) acc\d+ =", source), source


def test_an_extern_reads_a_view_of_a_value_the_graph_also_returns(kernel_backend):
    """A value read by a matrix product through a reshape and also returned (a layer norm's
    output, saved for the backward): computed and stored once, the product reading it as a
    strided view, not a copy."""
    def f(x, w):
        y = torch.tanh(x) * 2 + 1
        return y, y.view(-1, 8) @ w
    x, w = randn(3, 5, 8), randn(8, 6)
    minicompile.metrics.reset()
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, w])
    for actual, expected in zip(compiled(x, w), f(x, w)):
        assert_same(actual, expected)
    assert minicompile.metrics.kernels == 1


def test_wrapper_lets_go_of_each_buffer_after_its_last_reader(kernel_backend):
    """Intermediate buffers (a product's result, a kernel's) are deleted once their last
    reader has run, so their memory serves the buffers allocated after them; the outputs are
    kept, results eager's."""
    def f(x, w):
        h = torch.relu(x @ w)
        return (h @ w.t()) * 2 + 1, h.sum(0)
    x, w = randn(37, 29), randn(29, 29)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, w])
    for actual, expected in zip(compiled(x, w), f(x, w)):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    deleted = [n for line in compiled.wrapper_source.splitlines() if line.strip().startswith("del ")
               for n in line.strip()[4:].split(", ")]
    returned = compiled.wrapper_source.splitlines()[-1]
    assert deleted and not any(re.search(rf"\b{n}\b", returned) for n in deleted), compiled.wrapper_source


@pytest.mark.skipif(not hasattr(os, "fork"), reason="compile workers are forked processes")
def test_a_compile_worker_that_hangs_is_stopped():
    # a graph's Triton kernels are compiled by forked workers; one that never exits is killed
    # at the deadline (its kernels are then compiled at their first launch)
    import time
    from minicompile.codegen.triton import _wait_for
    done, hung = os.fork(), None
    if done == 0:
        os._exit(0)
    hung = os.fork()
    if hung == 0:
        time.sleep(60)
        os._exit(0)
    start = time.monotonic()
    _wait_for([done, hung], deadline=0.3)
    assert time.monotonic() - start < 10
    with pytest.raises(ChildProcessError):      # both reaped: no zombie left behind
        os.waitpid(hung, os.WNOHANG)


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc"), reason="forked workers, /proc")
def test_the_workers_a_hung_worker_forked_are_stopped_with_it():
    # compile_all forks one worker, which forks the others into its process group: at the
    # deadline the whole group is stopped, not only the worker this process waits for
    import time
    from minicompile.codegen.triton import _wait_for
    read, write = os.pipe()
    first = os.fork()
    if first == 0:
        os.setpgid(0, 0)
        other = os.fork()
        if other == 0:
            time.sleep(60)
            os._exit(0)
        os.write(write, str(other).encode())
        os.waitpid(other, 0)
        os._exit(0)
    other = int(os.read(read, 32))
    os.close(read), os.close(write)
    _wait_for([first], deadline=0.3)

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"      # not a zombie
        except FileNotFoundError:
            return False
    deadline = time.monotonic() + 5
    while running(other) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not running(other)


def test_processes_compiling_the_same_cpp_kernels_at_once_each_load_them_whole(monkeypatch, tmp_path):
    # the ranks of a distributed job compile the same kernels into one cache at the same time:
    # none may compile a source file another is writing, or load half a library
    import shutil
    from concurrent.futures import ThreadPoolExecutor
    from minicompile.codegen import cpp
    if shutil.which(minicompile.config.cxx) is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(minicompile.config, "cache_dir", str(tmp_path))
    source = "".join(f'extern "C" int kernel{i}() {{ return {i}; }}\n' for i in range(200))
    with ThreadPoolExecutor(max_workers=4) as pool:
        libraries = list(pool.map(lambda _: cpp.compile_library(source), range(4)))
    for lib in libraries:
        lib.kernel199.restype = lib.kernel7.restype = ctypes.c_int
        assert lib.kernel199() == 199 and lib.kernel7() == 7
    assert sorted(p.suffix for p in (tmp_path / "cpp").iterdir()) == [".cpp", ".so"]


@pytest.mark.skipif(not hasattr(os, "fork") or not HAS_TRITON, reason="compile workers are forked processes")
def test_compiling_together_waits_for_the_workers_at_its_end(monkeypatch, tmp_path):
    # a training step's forward kernels compile while its backward is lowered: inside
    # compiling_together compile_all returns with its workers still compiling, and its end
    # waits for them (a tuning run, wait=True, waits at once)
    import time
    from minicompile.codegen import triton as triton_codegen
    monkeypatch.setattr(triton_codegen, "_gpu_target", lambda: None)
    monkeypatch.setattr(triton_codegen, "_toolchain", lambda: ())
    monkeypatch.setattr(minicompile.config, "compile_workers", 5)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)

    class SlowKernel:
        def __init__(self, name):
            self.path = tmp_path / name

        def binary_path(self, key):
            return None

        def compile(self, dtypes, settings, key):
            time.sleep(0.5)
            self.path.write_text("compiled")

    # five workers, forked as a tree (the first forks two, each of those up to two): every
    # worker's share is compiled
    kernels = [SlowKernel(name) for name in "abcdefg"]
    jobs = [(k, [torch.float32], {"XBLOCK": 128}) for k in kernels]
    with triton_codegen.compiling_together():
        triton_codegen.compile_all(jobs)
        assert not any(k.path.exists() for k in kernels)
    assert all(k.path.exists() for k in kernels)
    for k in kernels:
        k.path.unlink()
    with triton_codegen.compiling_together():
        triton_codegen.compile_all(jobs, wait=True)
        assert all(k.path.exists() for k in kernels)


class _WarmthRecordingKernel:
    """A kernel whose compilation writes down whether the process compiling it had been set
    up (picklable: a compile server gets its jobs pickled)."""
    set_up = False

    def __init__(self, path):
        self.path = path

    def binary_path(self, key):
        return None

    def compile(self, dtypes, settings, key):
        self.path.write_text(f"{os.getpid()} {'warm' if _WarmthRecordingKernel.set_up else 'cold'}")


def _compile_server_here(monkeypatch, tmp_path, set_up):
    """A compile server on this machine (whatever its GPU): three workers, `set_up` as
    Triton's set-up, the batches' files in tmp_path."""
    from minicompile.codegen import triton as triton_codegen
    monkeypatch.setattr(triton_codegen, "_set_triton_up", set_up)
    monkeypatch.setattr(triton_codegen, "_compiles_ahead", lambda: True)
    monkeypatch.setattr(triton_codegen, "_gpu_target", lambda: None)
    monkeypatch.setattr(triton_codegen, "_toolchain", lambda: ())
    monkeypatch.setattr(minicompile.config, "compile_workers", 3)
    monkeypatch.setattr(minicompile.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    return triton_codegen


@pytest.mark.skipif(not hasattr(os, "fork") or not HAS_TRITON, reason="compile workers are forked processes")
def test_a_compile_server_forks_the_workers_once_triton_is_set_up(monkeypatch, tmp_path):
    # for a GPU's training graph, compiling_together forks a compile server first, which sets
    # Triton up while this process traces, then forks its workers from that state; compile_all
    # hands them its batches. Everything is compiled by the block's end.
    def set_up():
        _WarmthRecordingKernel.set_up = True
    triton_codegen = _compile_server_here(monkeypatch, tmp_path, set_up)
    batches = [[_WarmthRecordingKernel(tmp_path / f"{b}{i}") for i in range(4)] for b in "fb"]
    with triton_codegen.compiling_together(gpu=True):
        for kernels in batches:
            triton_codegen.compile_all([(k, [torch.float32], {"XBLOCK": 128}) for k in kernels])
    results = [k.path.read_text().split() for kernels in batches for k in kernels]
    assert all(warmth == "warm" for _, warmth in results)
    assert str(os.getpid()) not in {pid for pid, _ in results}
    assert not _WarmthRecordingKernel.set_up                   # (set in the server only)
    assert not list(tmp_path.glob("jobs-*"))                  # the batches' files are gone
    with triton_codegen.compiling_together(gpu=False):        # a CPU's graphs: no server
        assert triton_codegen._TOGETHER.server is None


@pytest.mark.skipif(not hasattr(os, "fork") or not HAS_TRITON, reason="compile workers are forked processes")
def test_the_end_of_a_gpu_s_graphs_leaves_the_next_graphs_a_server_set_up(monkeypatch, tmp_path):
    # a server's Triton set-up takes longer than a small graph's joint trace: the end of
    # compiling_together starts the next graphs' server, which the next block takes, set up by
    # then; one that saves elsewhere (the cache directory changed) is let go, and one started
    def set_up():
        _WarmthRecordingKernel.set_up = True
    triton_codegen = _compile_server_here(monkeypatch, tmp_path, set_up)
    monkeypatch.setattr(triton_codegen, "_SPARE", [])
    used, left = [], []
    for block in range(3):
        if block == 2:
            monkeypatch.setattr(minicompile.config, "cache_dir", str(tmp_path / "elsewhere"))
        kernels = [_WarmthRecordingKernel(tmp_path / f"{block}-{i}") for i in range(3)]
        with triton_codegen.compiling_together(gpu=True):
            used.append(triton_codegen._TOGETHER.server.pid)
            triton_codegen.compile_all([(k, [torch.float32], {"XBLOCK": 128}) for k in kernels])
        assert all(k.path.read_text().split()[1] == "warm" for k in kernels)
        assert len(triton_codegen._SPARE) == 1
        left.append(triton_codegen._SPARE[0].pid)
    assert used[1] == left[0]                 # taken
    assert used[2] not in left                # let go: it saves into the old directory
    spare = triton_codegen._SPARE.pop()
    assert spare.running()
    spare.discard()


class _LoadRecordingKernel(_WarmthRecordingKernel):
    """A kernel that writes down, in the process that waits for it, that its binary was loaded
    (and onto which GPU)."""
    loaded: list = []

    def load(self, key, device):
        _LoadRecordingKernel.loaded.append((self.path.name, key, device, os.getpid()))


@pytest.mark.skipif(not hasattr(os, "fork") or not HAS_TRITON, reason="compile workers are forked processes")
def test_a_compile_server_s_answers_have_their_binaries_loaded_while_the_rest_compile(monkeypatch, tmp_path):
    # each worker's answer names its job: the process waiting at the end of compiling_together
    # loads that kernel's binary onto the graph's GPU then, not at its first launch (a batch
    # with no GPU named, a matrix-product template's, is not loaded)
    triton_codegen = _compile_server_here(monkeypatch, tmp_path, lambda: None)
    monkeypatch.setattr(_LoadRecordingKernel, "loaded", [])
    batches = [[_LoadRecordingKernel(tmp_path / f"{b}{i}") for i in range(5)] for b in "fb"]
    with triton_codegen.compiling_together(gpu=True):
        triton_codegen.compile_all([(k, [torch.float32], {"XBLOCK": 128}) for k in batches[0]], device=1)
        triton_codegen.compile_all([(k, [torch.float16], {"XBLOCK": 64}) for k in batches[1]])
    assert all(k.path.exists() for kernels in batches for k in kernels)
    key = triton_codegen._spec_key(((torch.float32, True),), ())
    assert sorted(_LoadRecordingKernel.loaded) == [(f"f{i}", key, 1, os.getpid()) for i in range(5)]


class _CrashingKernel(_WarmthRecordingKernel):
    def compile(self, dtypes, settings, key):
        os._exit(1)


@pytest.mark.skipif(not hasattr(os, "fork") or not HAS_TRITON, reason="compile workers are forked processes")
def test_a_compile_worker_that_dies_does_not_hold_the_others_up(monkeypatch, tmp_path):
    # a worker that dies compiling (its kernel is then compiled at its first launch, which
    # reports the error) never answers: the end of compiling_together returns once the others
    # have compiled the rest and gone, not at the deadline
    import time
    triton_codegen = _compile_server_here(monkeypatch, tmp_path, lambda: None)
    kernels = [_CrashingKernel(tmp_path / "crash")] + [_WarmthRecordingKernel(tmp_path / f"k{i}") for i in range(5)]
    start = time.monotonic()
    with triton_codegen.compiling_together(gpu=True):
        triton_codegen.compile_all([(k, [torch.float32], {"XBLOCK": 128}) for k in kernels])
    assert time.monotonic() - start < 30
    assert all(k.path.exists() for k in kernels[1:]) and not kernels[0].path.exists()


@pytest.mark.skipif(not hasattr(os, "fork") or not HAS_TRITON, reason="compile workers are forked processes")
def test_a_batch_for_a_stopped_compile_server_is_compiled_here(monkeypatch, tmp_path):
    # the compile server (and its workers) stopped: the pipe to them is broken, and compile_all
    # compiles the batch in this process instead of raising
    import signal
    triton_codegen = _compile_server_here(monkeypatch, tmp_path, lambda: None)
    kernels = [_WarmthRecordingKernel(tmp_path / f"k{i}") for i in range(3)]
    with triton_codegen.compiling_together(gpu=True):
        server = triton_codegen._TOGETHER.server
        os.killpg(server.pid, signal.SIGKILL)
        os.waitpid(server.pid, 0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:          # (its workers go with it)
            try:
                os.killpg(server.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)
        monkeypatch.setattr(minicompile.config, "compile_workers", 1)
        triton_codegen.compile_all([(k, [torch.float32], {"XBLOCK": 128}) for k in kernels])
    assert all(k.path.read_text().split()[0] == str(os.getpid()) for k in kernels)


def rotary(q, cos, sin, heads=4):
    """A Llama-style attention input: heads split off a linear layer's output, transposed, and
    rotated by halves (rotate_half: a slice and a concatenation of the last dim)."""
    q = q.view(q.shape[0], q.shape[1], heads, 12).transpose(1, 2)
    half = torch.cat((-q[..., 6:], q[..., :6]), dim=-1)
    return q * cos + half * sin


def test_a_split_dim_read_through_a_slice_indexes_linearly(cpp_backend):
    """A reshape that splits a dim (the heads of (B, T, 48) as (B, T, 4, 12)) is reindexed dim
    group by dim group: the slice of rotate_half is then a plain offset, with no division or
    modulo in the kernel's index (its loads vectorize); results eager's."""
    def f(q, cos, sin):
        return rotary(q, cos, sin)
    q, cos, sin = randn(3, 7, 48), randn(7, 12), randn(7, 12)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [q, cos, sin])
    assert_same(compiled(q, cos, sin), f(q, cos, sin))
    loads = re.findall(r"in_ptr\d+\[([^\]]*)\]", compiled.kernel_source)
    assert loads and not any("/" in index or "%" in index for index in loads), loads


@pytest.mark.parametrize("shapes", [((3, 7, 48), (3, 7, 4, 12)), ((3, 7, 4, 12), (3, 28, 12)),
                                    ((6, 10), (3, 2, 5, 2)), ((3, 2, 5, 2), (2, 3, 10)),
                                    ((1, 35, 1, 2), (7, 1, 10)), ((4, 1, 9), (36,)),
                                    ((2, 3, 4, 5), (6, 20))])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_reshapes_by_dim_groups_match_eager(kernel_backend, shapes, layout):
    # splits, merges, both at once (a group of several dims on each side), size-1 dims on
    # either side; the input computed (relu), or a non-contiguous one viewed after a copy
    (before, after) = shapes
    x = randn(*before, layout=layout)

    def f(x):
        y = torch.relu(x).reshape(after)
        return y[..., 1:] * 2 + 1, y.reshape(-1)[3:].sum()
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x])
    for actual, expected in zip(compiled(x), f(x)):
        assert_same(actual, expected)


def test_a_residual_stream_through_many_layers_matches_eager(kernel_backend):
    """A transformer's residual stream (h = h + norm(h) @ w, layer after layer): a chain of
    cheap adds, each read by the next add and by a norm, which InlinePointwise stores once it
    reads more than max_reads buffers; results eager's, on fresh inputs too."""
    def f(h, w0, w1, w2, w3, w4, w5):
        for w in (w0, w1, w2, w3, w4, w5):
            h = h + F.rms_norm(h, (33,)) @ w
        return h
    args = [randn(5, 33)] + [randn(33, 33) * 0.2 for _ in range(6)]
    compiled = compile_graph(torch.fx.symbolic_trace(f), args)
    assert_same(compiled(*args), f(*args))
    args = [randn(5, 33)] + args[1:]
    assert_same(compiled(*args), f(*args))


def test_a_transcendental_read_by_several_kernels_is_computed_once(kernel_backend):
    """Rotary embeddings' cos and sin of a (T, D) table, read by the queries' and the keys'
    kernels (other shapes: 4 and 2 heads), are stored once (InlinePointwise.CALLS), not
    computed again for every head and batch row of each; results eager's."""
    def f(q, k, freqs):
        cos, sin = freqs.cos(), freqs.sin()
        return rotary(q, cos, sin), rotary(k, cos, sin, heads=2)
    args = [randn(3, 7, 48), randn(3, 7, 24), randn(7, 12)]
    compiled = compile_graph(torch.fx.symbolic_trace(f), args)
    for actual, expected in zip(compiled(*args), f(*args)):
        assert_same(actual, expected)
    if kernel_backend == "cpp":
        source = compiled.kernel_source
        assert source.count("std::cos(") == 1 and source.count("std::sin(") == 1, source


def test_linear_layers_write_into_planned_memory(cpp_backend):
    """With C++ kernels a linear layer is torch.addmm (or mm without a bias) with out=: its
    result takes the memory of a dead buffer of its size where there is one (a new allocation
    is mapped by the system, a page fault per page, on every call). Inputs transposed, a layer
    without a bias, one whose result is the graph's output; eager's results on fresh inputs."""
    def f(x, w1, b1, w2, w3, b3):
        h = F.linear(x, w1, b1).relu()
        g = F.linear(h * 3, w2)
        return F.linear(g.tanh() + h, w3, b3), g
    args = [randn(3, 37, 48).transpose(0, 1), randn(48, 48) / 7, randn(48), randn(48, 48) / 7,
            randn(29, 48) / 7, randn(29)]
    compiled = compile_graph(torch.fx.symbolic_trace(f), args)
    source = compiled.wrapper_source
    assert source.count("torch.addmm(") == 2 and source.count("torch.mm(") == 1, source
    assert "out=" in source and "linear(" not in source, source
    assert "# reuses" in source or "# in place" in source, source      # no allocation for each
    for _ in range(2):
        for actual, expected in zip(compiled(*args), f(*args)):
            assert_same(actual, expected)
        args[0] = randn(3, 37, 48).transpose(0, 1)


def test_reductions_of_the_same_columns_share_a_kernel(kernel_backend):
    """Batch norm's statistics (over N, H and W for each channel) and its backward's two sums:
    reductions over the same leading dims of one shape run as one kernel, the second reading
    the first's result per column; a mean asked for twice (var_mean's own and the one beside
    it) is computed once. (The variance's division by the count, a pointwise step over the
    columns' results, is a small kernel of its own: a kernel of reductions over leading dims
    takes no pointwise member.)"""
    def backward_sums(x, g, mean):
        return g.sum((0, 2, 3)), (g * (x - mean)).sum((0, 2, 3))

    def statistics(x):
        var, mean = torch.var_mean(x, (0, 2, 3), correction=0, keepdim=True)
        return var, mean, x.mean((0, 2, 3), keepdim=True)
    x, g = randn(4, 3, 5, 6).double(), randn(4, 3, 5, 6).double()
    for fn, args in ((backward_sums, [x, g, randn(1, 3, 1, 1).double()]), (statistics, [x])):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), args)
        assert_same(compiled(*args), fn(*args))
        assert [k.kind for k in compiled.kernels] == (["reduction"] if fn is backward_sums else
                                                      ["reduction", "pointwise"]), compiled.wrapper_source


def test_split_reductions_of_the_same_columns_share_their_partial_sums_kernel(kernel_backend):
    """Batch norm's backward sums on a GPU, for few channels over many rows: each is a split
    reduction (partial sums by many programs, then their sum). The second's partial sums do
    not depend on the first's second stage, so they join the first's partial sums kernel
    (fuse-rows looks back past it) and g is read once: two kernels, not four."""
    if kernel_backend == "cpp":
        pytest.skip("C++ runs a long reduction's loop in parallel itself: no split")

    def backward_sums(x, g):
        return g.sum(0) + 1, (x * g).sum(0)
    x, g = randn(8192, 16), randn(8192, 16)
    compiled = compile_graph(torch.fx.symbolic_trace(backward_sums), [x, g])
    torch.testing.assert_close(compiled(x, g), backward_sums(x, g), rtol=1e-4, atol=1e-3)
    assert len(compiled.kernels) == 2, compiled.wrapper_source


def test_a_split_mean_is_divided_in_the_kernel_that_sums_its_pieces(kernel_backend):
    """A mean of few columns over many rows is split (partial sums, then their sum); kept as
    (1, C, 1, 1), its division by the count is a per-row value of the second kernel (its C
    rows, with size-1 dims around them), not a kernel of its own: two kernels, and the
    centred values a third."""
    if kernel_backend == "cpp":
        pytest.skip("C++ runs a long reduction's loop in parallel itself: no split")

    def centred(x):
        m = x.mean((0, 2, 3), keepdim=True)
        return x - m, m
    x = (randn(8, 64, 32, 32) * 3 + 10).to(memory_format=torch.channels_last)
    compiled = compile_graph(torch.fx.symbolic_trace(centred), [x])
    torch.testing.assert_close(compiled(x), centred(x), rtol=1e-5, atol=1e-5)
    assert len(compiled.kernels) == 3, compiled.wrapper_source


@pytest.mark.parametrize("shape", [(8, 64, 32, 32), (8, 16, 30, 30)])
@pytest.mark.parametrize("offset", [0.0, 100.0, 1e4])
def test_a_split_variance_reads_its_input_in_the_mean_s_kernel(kernel_backend, offset, shape):
    """A batch norm's statistics on a GPU: the mean and the variance of each of few channels
    over many rows. The variance is split as the mean is, and computed with it (Chan's
    parallel variance): each piece's squared deviations about its own mean, in the walk that
    sums the piece (each lane's elements about the first it saw, the lanes then combined), then
    the pieces' combined in the kernel that sums them. Two kernels for both statistics (five as
    two passes), each piece read from memory once; as exact as eager's, far from zero too (no
    difference of large sums). Pieces of 256 rows are walked in one step; of 450 (the second
    shape), in two, the second partly masked."""
    if kernel_backend == "cpp":
        pytest.skip("C++ runs a long reduction's loop in parallel itself: no split")

    def statistics(x):
        var, mean = torch.var_mean(x, (0, 2, 3), correction=0, keepdim=True)
        return var, mean, x.var((0, 2, 3))
    x = (randn(*shape) * 3 + offset).to(memory_format=torch.channels_last)
    compiled = compile_graph(torch.fx.symbolic_trace(statistics), [x])
    exact = statistics(x.double())
    for ours, eager, truth in zip(compiled(x), statistics(x), exact):
        error, eager_error = (ours.double() - truth).abs().max(), (eager.double() - truth).abs().max()
        assert error <= 4 * eager_error + 1e-6 * truth.abs().max(), (offset, error, eager_error)
    assert len(compiled.kernels) == 2, compiled.wrapper_source


def test_a_split_variance_of_pieces_held_in_registers_is_eager_s(kernel_backend):
    """A variance of one long row (every element of a large tensor) is split into pieces short
    enough to be held in registers: each piece's squared deviations about its own mean from the
    piece read once, then Chan's combination; as exact as eager's, far from zero too."""
    if kernel_backend == "cpp":
        pytest.skip("C++ runs a long reduction's loop in parallel itself: no split")
    x = randn(1 << 20) * 3 + 100
    compiled = compile_graph(torch.fx.symbolic_trace(lambda x: torch.var(x)), [x])
    truth = torch.var(x.double())
    assert (compiled(x).double() - truth).abs() <= 4 * (torch.var(x).double() - truth).abs() + 1e-6 * truth
    assert "var" not in compiled.wrapper_source and len(compiled.kernels) == 2, compiled.wrapper_source


@pytest.mark.parametrize("call", [lambda x: torch.var_mean(x, 1), lambda x: torch.var_mean(x, False),
                                  lambda x: torch.var_mean(x, dim=-1, keepdim=True, unbiased=False),
                                  lambda x: torch.var_mean(x, (0, 2), correction=0)])
def test_var_mean_is_generated(kernel_backend, call):
    """torch.var_mean's pair, as eager's (its overloads: dims, unbiased alone, keywords), from
    generated kernels: no call of PyTorch's op."""
    x = randn(6, 7, 9) * 3 + 10
    compiled = compile_graph(torch.fx.symbolic_trace(call), [x])
    torch.testing.assert_close(compiled(x), call(x), rtol=1e-5, atol=1e-5)
    assert "var_mean" not in compiled.wrapper_source, compiled.wrapper_source


def test_looped_members_walk_the_row_together(kernel_backend):
    """In a looped reduction (a column reduction's rows are walked in steps), a stored
    pointwise member and the reductions of it share one loop over the row, which loads each
    element once (MobileNetV3's squeeze-excite input: an activation, stored, and its mean per
    channel); a member that needs a reduction's result (the activation scaled by that mean)
    walks the row again once the reduction is done. An argmax and a max of the same columns
    share their loop too."""
    from minicompile.graph_compiler import generated_source

    def activation_and_mean(x, w):
        y = torch.relu(x * w)
        return y, y.mean((2, 3), keepdim=True)

    def scaled_by_mean(x, w):
        y = torch.relu(x * w)
        return y * y.mean((2, 3), keepdim=True)

    def argmax_and_max(x):
        return x.argmax(0), x.amax(0), x.sum(0)
    x, w = randn(3, 24, 30, 30).to(memory_format=torch.channels_last), randn(24, 1, 1)
    # (a sum of 3000 numbers of size 1 is some 50: float32's rounding in another order is
    # 1e-5 and more there)
    cases = [(activation_and_mean, [x, w], 1, 1e-5), (scaled_by_mean, [x, w], 2, 1e-5),
             (argmax_and_max, [randn(3000, 24)], 1, 1e-4)]
    for fn, args, loops, atol in cases:
        check(fn, *args, rtol=1e-5, atol=atol)
        if kernel_backend == "triton":
            source = generated_source(torch.fx.symbolic_trace(fn), args, "triton")
            assert source.count("for roffset in range") == loops, source


_TEST_LIBRARY = torch.library.Library("minicompile_test_codegen", "DEF")
_TEST_LIBRARY.define("float_statistic(Tensor x) -> Tensor")


@torch.library.impl(_TEST_LIBRARY, "float_statistic", "CPU")
@torch.library.impl(_TEST_LIBRARY, "float_statistic", "CUDA")
def _float_statistic(x):
    return x.float().mean(-1)            # float32, whatever the fake kernel says


@torch.library.register_fake("minicompile_test_codegen::float_statistic", lib=_TEST_LIBRARY)
def _float_statistic_fake(x):
    return x.new_empty(x.shape[:-1])     # the input's dtype: wrong for a bfloat16 input


def test_an_extern_result_of_another_dtype_than_predicted_is_converted(kernel_backend):
    """An op whose fake kernel says one dtype and whose real kernel gives another (PyTorch's
    group norm on a CPU, for half-precision inputs with float weights): the kernels that read
    its result get the predicted dtype, converted, not its bytes read as another type."""
    op = torch.ops.minicompile_test_codegen.float_statistic.default

    def f(x, w):                         # (in training: the joint trace runs the fake kernel)
        return op(x.sin()) * w
    x, w = randn(6, 33).bfloat16(), randn(6).bfloat16().requires_grad_()
    got, want = minicompile.compile(f)(x, w), f(x, w)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_extern_arguments_are_plain_views_and_products_unchecked(kernel_backend):
    """An extern call's argument that is a view of a buffer is made by reinterpret_tensor (a
    C++ call; torch.as_strided costs three times its host time), and the result of a matrix
    product, which PyTorch always allocates contiguous, is not checked by as_layout."""
    def f(x, w):
        h = torch.relu(x * 2)
        return torch.bmm(h.transpose(1, 2), w).sum(-1)
    x, w = randn(3, 9, 5), randn(3, 9, 4)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, w])
    assert_same(compiled(x, w), f(x, w))
    assert "reinterpret_tensor(" in compiled.wrapper_source and "as_layout" not in compiled.wrapper_source, \
        compiled.wrapper_source


def test_one_gradient_read_by_two_batch_norms_backward_is_read_twice(kernel_backend):
    """A ResNet block's last batch norm and its shortcut's take one gradient g (an add and a
    ReLU's backward of the block's output): each needs g's sum and g * (x - mean)'s per channel,
    then its input gradient from them. On a GPU the sums are split (partial sums, then their
    sum), and the first input gradient's convolution (an extern call here, a cumsum) comes
    between the two batch norms in the graph. The second's partial sums join the first's, its
    second stage the first's, and its input gradient the first's kernel (fuse-rows moves each
    back past the steps it does not depend on): g's inputs are read twice (the sums, the
    gradients), not four times, in three kernels."""
    if kernel_backend == "cpp":
        pytest.skip("C++ runs a long reduction's loop in parallel itself: no split")

    def two_batch_norms(out, a, b, x1, m1, x2, m2):
        g = torch.where(out <= 0, 0, a + b)
        total = g.sum((0, 2, 3), keepdim=True)
        d1 = (g * (x1 - m1)).sum((0, 2, 3), keepdim=True)
        dx1 = torch.cumsum(g - total / 8192 - (x1 - m1) * d1 / 8192, 1)
        d2 = (g * (x2 - m2)).sum((0, 2, 3), keepdim=True)
        return dx1, g - total / 8192 - (x2 - m2) * d2 / 8192
    big = [randn(8, 64, 32, 32).to(memory_format=torch.channels_last) for _ in range(5)]
    out, a, b, x1, x2 = big
    args = [out, a, b, x1, randn(1, 64, 1, 1), x2, randn(1, 64, 1, 1)]
    minicompile.metrics.reset()
    compiled = compile_graph(torch.fx.symbolic_trace(two_batch_norms), args)
    torch.testing.assert_close(compiled(*args), two_batch_norms(*args), rtol=1e-4, atol=1e-4)
    assert len(compiled.kernels) == 3, compiled.wrapper_source
    read = sum(r for _, r, _ in minicompile.metrics.kernel_bytes)
    assert read < 2 * sum(t.numel() * 4 for t in big) * 1.01, compiled.wrapper_source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_short_rows_are_reduced_in_a_pointwise_kernel(kernel_backend, dtype):
    """Rows of at most 8 elements, apart in memory (a grouped-query attention's key gradient
    summed over the 4 query heads that share each key head) are reduced inside a pointwise
    kernel, each element loaded in turn: no reduction kernel with a block of mostly masked
    lanes. Eager's results: sums, means, products, maxima and minima (a NaN wins), in each
    dtype."""
    if dtype == torch.float16 and DEVICE == "cpu" and kernel_backend == "triton":
        pytest.skip("the Triton interpreter computes float16 in numpy's precision")

    def integer_reductions(k):
        return k.sum(2), k.amax(1), k.amin((0, 2)), k.prod(1)

    def float_reductions(k):
        return *integer_reductions(k), k.mean(3)
    reductions = float_reductions if dtype.is_floating_point else integer_reductions
    k = (randn(2, 6, 3, 5, 4) * 3).to(dtype).transpose(1, 3)
    if dtype.is_floating_point:
        k[0, 1, 2, 3] = float("nan")
    compiled = compile_graph(torch.fx.symbolic_trace(reductions), [k])
    for ours, eager in zip(compiled(k), reductions(k)):
        torch.testing.assert_close(ours, eager, equal_nan=True, **({"rtol": 2e-3, "atol": 2e-3}
                                                                  if dtype == torch.float16 else {}))
    assert {c.kind for c in compiled.kernels} <= {"pointwise", "combo"}, compiled.wrapper_source


def test_a_layer_norm_weight_gradient_is_a_column_reduction(kernel_backend):
    """A layer norm's weight gradient sums g * (x - mean) * rstd over the tokens for each
    channel: g and x are read along the channels (columns, next to each other in memory),
    mean and rstd once per token, the same for every channel. Those have no say in how the
    rows are walked: on a GPU the sum is a split column reduction (partial sums of many
    tokens for neighbouring channels, then their sum), not a walk of each channel's column
    down 4096 rows, 256 floats apart."""
    if kernel_backend == "cpp":
        pytest.skip("C++ runs a long reduction's loop in parallel itself: no split")

    def weight_gradient(g, x, mean, rstd):
        return (g * (x - mean) * rstd).sum(0)
    args = [randn(4096, 256), randn(4096, 256), randn(4096, 1), randn(4096, 1)]
    compiled = compile_graph(torch.fx.symbolic_trace(weight_gradient), args)
    torch.testing.assert_close(compiled(*args), weight_gradient(*args), rtol=1e-4, atol=1e-3)
    assert len(compiled.kernels) == 2, compiled.wrapper_source


def test_a_layer_norms_double_statistics_meet_a_float_clamp():
    """The variance a layer norm's kernel keeps in double, then hardswish's clamp of the
    normalized row with float bounds: one kernel that compiles (it fell back to PyTorch's)."""
    import warnings
    norm = torch.nn.LayerNorm(64).to(DEVICE)

    def f(x):
        return F.hardswish(norm(x)) + F.relu6(norm(x) * 4)

    x = randn(3, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(minicompile.compile(f)(x), f(x))


def test_where_of_a_constant_condition_is_a_bool_to_triton(kernel_backend):
    """A bool constant (a mask made by new_ones((), dtype=torch.bool), as transformers' mask
    functions start) is written 1 or 0, an int to Triton: where's condition must still be a
    bool, which Triton will require (it warns now)."""
    def f(x, y):
        keep = x.new_ones((), dtype=torch.bool) & (x > 0)
        return torch.where(torch.ones((), dtype=torch.bool), x, y) + torch.where(keep, x, 2 * y)
    x, y = randn(5, 3), randn(5, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = minicompile.compile(f)(x, y)
    torch.testing.assert_close(got, f(x, y))
    assert not [w for w in caught if "non-boolean condition" in str(w.message)]
