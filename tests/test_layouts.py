"""Memory layouts: channels-last convolutions on a CPU and the kernels around them.

On a CPU a 2-D convolution gets its input channels-last (PyTorch's oneDNN kernels are much
faster so) and returns its result channels-last; the buffers computed from it keep that layout,
their loops follow memory order, max pooling is a generated pointwise kernel, and a mean over
H and W vectorizes across channels. Graph outputs keep the strides eager gives. Every result
is compared with eager on fresh random inputs of awkward sizes and layouts.
"""
import re

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import minicompile
from conftest import DEVICE
from helpers import assert_same, randn
from minicompile.graph_compiler import compile_graph
from minicompile.runtime import memory

CL = torch.channels_last


def compiled_and_expected(fn, *args):
    gm = torch.fx.symbolic_trace(fn)
    compiled = compile_graph(gm, list(args))
    return compiled, compiled(*args), fn(*args)


def assert_same_with_strides(actual, expected):
    """Equal values, and the strides eager gives (dims of size 1 aside)."""
    for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                    expected if isinstance(expected, tuple) else (expected,)):
        assert_same(a, e)
        assert all(x == y or n == 1 for x, y, n in zip(a.stride(), e.stride(), e.shape)), \
            (a.stride(), e.stride(), e.shape)


def conv_block(x, w1, b1, mean, var, gamma, beta, w2):
    """The small CNN's shape: conv, batch norm, relu, max pool, conv, relu, mean over H, W."""
    y = F.relu(F.batch_norm(F.conv2d(x, w1, b1, padding=1), mean, var, gamma, beta, training=False))
    p = F.max_pool2d(y, 2)
    z = F.relu(F.conv2d(p, w2))
    return y, p * 2, z.mean((2, 3)), z.amax((2, 3))


def block_inputs(n, c, h, w, layout):
    x = randn(n, c, h, w)
    if layout == "channels_last":
        x = x.to(memory_format=CL)
    elif layout == "strided":
        x = randn(n, c, h, w * 2)[..., ::2]
    elif layout == "permuted":
        x = randn(n, h, w, c).permute(0, 3, 1, 2)         # channels-last strides, not .to()
    return (x, randn(6, c, 3, 3), randn(6), randn(6), randn(6).abs() + 0.5, randn(6), randn(6),
            randn(5, 6, 1, 1))


@pytest.mark.parametrize("size", [(3, 5, 7, 9), (1, 3, 5, 5), (2, 1, 4, 6)])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided", "permuted"])
def test_conv_block_matches_eager_values_and_strides(kernel_backend, size, layout):
    if kernel_backend == "triton" and (size != (3, 5, 7, 9) or layout == "strided"):
        pytest.skip("the Triton interpreter is slow: one size, three layouts")
    args = block_inputs(*size, layout)
    _, actual, expected = compiled_and_expected(conv_block, *args)
    assert_same_with_strides(actual, expected)


def inverted_residual(x, w_expand, w_depthwise, w_grouped, w_project):
    """MobileNet's block: a 1x1 expansion, a depthwise 3x3, a grouped 3x3, a 1x1 projection,
    hardswish between them, and the residual."""
    y = F.hardswish(F.conv2d(x, w_expand))
    y = F.hardswish(F.conv2d(y, w_depthwise, padding=1, groups=y.shape[1]))
    y = F.relu(F.conv2d(y, w_grouped, padding=1, groups=3))
    return x + F.conv2d(y, w_project), y.mean((2, 3))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_depthwise_and_grouped_convolutions_match_eager_values_and_strides(kernel_backend, layout):
    # depthwise and grouped convolutions are channels-last on a GPU too, as Inductor has them
    x = randn(2, 4, 9, 11)
    if layout == "channels_last":
        x = x.to(memory_format=CL)
    weights = (randn(12, 4, 1, 1) / 2, randn(12, 1, 3, 3) / 3, randn(6, 4, 3, 3) / 6, randn(4, 6, 1, 1) / 2)
    _, actual, expected = compiled_and_expected(inverted_residual, x, *weights)
    assert_same_with_strides(actual, expected)


def test_depthwise_and_grouped_convolutions_train_as_eager():
    # the training trace gives them the layout lowering does: gradients equal eager's
    weights = [randn(12, 4, 1, 1) / 2, randn(12, 1, 3, 3) / 3, randn(6, 4, 3, 3) / 6, randn(4, 6, 1, 1) / 2]
    x = randn(2, 4, 9, 11)
    leaves = {"eager": [w.clone().requires_grad_() for w in weights],
              "compiled": [w.clone().requires_grad_() for w in weights]}

    def loss(x, *ws):
        out, pooled = inverted_residual(x, *ws)
        return out.square().mean() + pooled.sum()
    compiled = minicompile.compile(loss)
    for name, fn in (("eager", loss), ("compiled", compiled)):
        fn(x, *leaves[name]).backward()
    for e, c in zip(leaves["eager"], leaves["compiled"]):
        torch.testing.assert_close(c.grad, e.grad, rtol=1e-4, atol=1e-5)


def squeeze_excitation(x, w, b, mean, var, w_down, b_down, w_up, b_up):
    """MobileNetV3's block: a convolution with a bias, batch norm and activation, kept while a
    pooled branch (two 1x1 convolutions with biases) computes a per-channel scale for it."""
    y = F.hardswish(F.batch_norm(F.conv2d(x, w, b, padding=1), mean, var, training=False))
    scale = F.hardsigmoid(F.conv2d(F.relu(F.conv2d(y.mean((2, 3), keepdim=True), w_down, b_down)), w_up, b_up))
    return y * scale


def test_a_value_computed_from_a_channels_last_one_is_stored_channels_last(kernel_backend):
    # y is stored (the pooled branch reads it, then the scaling): in the convolution's layout,
    # not transposed to contiguous. With Triton kernels the convolution's bias is added by the
    # generated kernel that reads its result, not by a launch of cuDNN's
    x = randn(2, 5, 17, 19)
    weights = (randn(8, 5, 3, 3) / 4, randn(8), randn(8), randn(8).abs() + 0.5,
               randn(4, 8, 1, 1) / 2, randn(4), randn(8, 4, 1, 1) / 2, randn(8))
    compiled, actual, expected = compiled_and_expected(squeeze_excitation, x, *weights)
    assert_same_with_strides(actual, expected)
    if not minicompile.ir.conv_input_channels_last(x.device, x.dtype, (2, 8, 17, 19)):
        return
    stored = [list(m.box.data.stride) for k in compiled.kernels for m in k.members
              if m.box.name in k.stored and list(m.box.shape) == [2, 8, 17, 19]]
    assert stored == [[2584, 1, 152, 8], [2584, 323, 19, 1]], stored        # y, then the output
    # (on a CPU the weight is given channels-last too: a copy, buf)
    first_convolution = re.search(r"torch\.convolution\(buf\d+, (?:arg1|buf\d+), (\w+),", compiled.wrapper_source)
    assert first_convolution and first_convolution[1] == ("arg2" if kernel_backend == "cpp" else "None"), \
        compiled.wrapper_source


@pytest.mark.skipif(DEVICE != "cpu", reason="the channels-last layout choice is for CPUs")
def test_kernels_after_a_channels_last_conv_keep_its_layout(monkeypatch):
    copies = []

    def as_layout(tensor, stride, **how):       # a wrong prediction of a conv's layout costs a copy
        out = memory_as_layout(tensor, stride, **how)
        copies.append(out is not tensor)
        return out
    memory_as_layout = memory.as_layout
    monkeypatch.setattr(memory, "as_layout", as_layout)
    args = block_inputs(3, 5, 19, 21, "contiguous")      # both convolutions have >= 256 output pixels

    def f(x, w1, b1, mean, var, gamma, beta, w2):
        y = F.relu(F.batch_norm(F.conv2d(x, w1, b1, padding=1), mean, var, gamma, beta, training=False))
        return F.relu(F.conv2d(F.max_pool2d(y, 2), w2)).mean((2, 3))
    compiled, actual, expected = compiled_and_expected(f, *args)
    assert_same(actual, expected)
    assert copies and not any(copies), copies
    source = compiled.wrapper_source
    # the input is copied into channels-last once; the pooled batch norm is stored so directly
    assert "empty_strided_cpu((3, 5, 19, 21), (1995, 1, 105, 5)" in source
    assert "empty_strided_cpu((3, 6, 9, 10), (540, 1, 60, 6)" in source
    # the copies (the input's, and the first convolution's weight's: oneDNN takes it channels-last
    # with a channels-last input), batch norm + relu + pool, relu + mean
    assert len(compiled.kernels) == 3
    # stores of the kernel after the first conv are contiguous in its innermost loop
    kernel1 = compiled.kernel_source.split(f"kernel {compiled.kernels[1].name}")[1].split("// ---- kernel")[0]
    innermost = re.findall(r"for \(int64_t (x\d) = 0; x\d < (\d+);", kernel1)[-1]
    assert innermost[1] == "6" and re.search(rf"out_ptr0\[[^\]]*\+ {innermost[0]}\] = ", kernel1), kernel1


@pytest.mark.parametrize("args", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                  dict(kernel_size=(2, 3), stride=(1, 2), ceil_mode=True),
                                  dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                  dict(kernel_size=2, dilation=2, padding=1)])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
def test_max_pool2d(kernel_backend, args, layout):
    if kernel_backend == "triton" and layout != "contiguous":
        pytest.skip("the Triton interpreter is slow")
    x = randn(2, 5, 9, 7, layout="transposed" if layout == "transposed" else "contiguous")
    if layout == "channels_last":
        x = x.to(memory_format=CL)
    _, actual, expected = compiled_and_expected(lambda x: F.max_pool2d(torch.relu(x) - 0.5, **args), x)
    assert_same_with_strides(actual, expected)


def test_max_pool2d_nan_inf_and_3d_input(kernel_backend):
    x = randn(5, 6, 8)
    x[0, 0, 0], x[1, 2, 3], x[2, :2, :2] = float("nan"), float("inf"), float("-inf")
    _, actual, expected = compiled_and_expected(lambda x: F.max_pool2d(x, 2) + F.max_pool2d(x, 3, 2, 1), x)
    torch.testing.assert_close(actual, expected, equal_nan=True)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_reduction_over_hw_of_channels_last(kernel_backend, op):
    # rows (n, c) lie side by side: the C++ kernel vectorizes across them
    x = randn(3, 20, 5, 7).to(memory_format=CL)
    x[1, 3, 2, 2] = float("nan")
    _, actual, expected = compiled_and_expected(lambda x: getattr(torch.relu(x), op)((2, 3)) + 1, x)
    torch.testing.assert_close(actual, expected, equal_nan=True)


def test_small_cnn_compiles_to_generated_pooling():
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import models

    model, x = models.model_and_input("cnn", DEVICE, scale=1 / 64)
    with torch.no_grad():
        expected = model(x)
        actual = minicompile.compile(model)(x)
        fresh = torch.randn_like(x).to(memory_format=CL)
        assert_same(minicompile.compile(model)(fresh), model(fresh))
    assert_same(actual, expected)
    assert minicompile.metrics.graph_breaks == 0


def test_a_convolution_returned_directly_has_eager_strides(kernel_backend):
    # PyTorch's convolution, given a channels-last input here, answers channels-last; eager's
    # answers contiguous: the output is copied to eager's layout, so viewing it works as in eager
    def f(x, w):
        return F.conv2d(x.relu(), w, padding=1), F.conv2d(x, w)
    x, w = randn(2, 3, 9, 7), randn(5, 3, 3, 3)
    _, actual, expected = compiled_and_expected(f, x, w)
    assert_same_with_strides(actual, expected)
    actual[0].view(2, -1)


@pytest.mark.skipif(DEVICE != "cpu", reason="the channels-last layout choice is for CPUs")
@pytest.mark.parametrize("training", [False, True])
def test_a_convolution_with_few_output_pixels_reads_its_input_contiguous(monkeypatch, training):
    # oneDNN's channels-last kernels are slower than its others for few output pixels and many
    # channels (the last layers of a ResNet on small images): below ir.CONV_CHANNELS_LAST_PIXELS
    # the input stays contiguous; above it, channels-last. The forward traced for training
    # (autograd/joint.py) makes the same choice, so no layout is predicted wrong (a copy).
    from minicompile import ir
    copies = []

    def as_layout(tensor, stride, **how):
        out = memory_as_layout(tensor, stride, **how)
        copies.append(out is not tensor)
        return out
    memory_as_layout = memory.as_layout
    monkeypatch.setattr(memory, "as_layout", as_layout)

    def f(x, w1, w2, w3):
        y = F.relu(F.conv2d(x, w1, padding=1))                  # 2 x 12 x 11: 264 pixels
        z = F.relu(F.conv2d(y, w2, stride=2, padding=1))        # 2 x 6 x 6: 72 pixels
        return F.conv2d(z, w3, padding=1).tanh()                # 72 pixels
    args = [randn(2, 3, 12, 11), randn(16, 3, 3, 3), randn(40, 16, 3, 3), randn(24, 40, 3, 3)]
    assert ir.conv_channels_last((2, 16, 12, 11)) and not ir.conv_channels_last((2, 40, 6, 6))
    if training:
        params = [a.clone().requires_grad_() for a in args]
        compiled = minicompile.compile(f)
        compiled(*params).sum().backward()
        expected = [a.clone().requires_grad_() for a in args]
        f(*expected).sum().backward()
        for p, e in zip(params, expected):      # (oneDNN's channels-last backward sums in another order)
            torch.testing.assert_close(p.grad, e.grad, rtol=1e-4, atol=1e-4 * e.grad.abs().max().item())
        return
    compiled, actual, expected = compiled_and_expected(f, *args)
    assert_same_with_strides(actual, expected)
    assert copies and not any(copies), copies
    source = compiled.wrapper_source
    assert "empty_strided_cpu((2, 3, 12, 11), (396, 1, 33, 3)" in source      # channels-last copy
    assert "(2, 16, 12, 11), (2112, 132, 11, 1)" in source                       # relu: contiguous
    for k in range(3):                                     # the same input for other values
        args[0] = randn(2, 3, 12, 11)
        assert_same(compiled(*args), f(*args))


@torch.library.custom_op("minicompile_tests::contiguous_only", mutates_args=())
def _contiguous_only(x: torch.Tensor) -> torch.Tensor:
    """An op whose kernel takes contiguous input only, as a GPU's native_group_norm does."""
    if not x.is_contiguous():
        raise RuntimeError("contiguous_only: expected a contiguous input")
    return x * 2


@_contiguous_only.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def test_an_op_left_to_pytorch_gets_its_input_laid_out_as_traced():
    """x + conv(x): eager's sum is contiguous (its first operand's layout), the convolution's
    result channels-last (a CPU's oneDNN layout, a GPU's cuDNN one). Where lowering would store
    the sum channels-last, an op it leaves to PyTorch still gets it contiguous, as traced
    (timm's MobileViTv2 on a GPU: GroupNorm of a residual sum)."""
    def f(x, w):
        return _contiguous_only(x + F.conv2d(torch.sin(x), w))
    x, w = randn(4, 64, 4, 256), randn(64, 64, 1, 1)
    assert_same(minicompile.compile(f)(x, w), f(x, w))


@pytest.mark.parametrize("layout", ["transposed", "channels_last"])
def test_outputs_keep_eagers_layout_after_the_dynamic_recompile(layout):
    """A pointwise result of a transposed or channels-last input keeps the input's layout in
    eager. After a new size made the graph generic in sizes, it came back contiguous: a later
    .view(-1) worked where eager raises."""
    def f(x):
        return x * 2 + 1, x.sin().clone()
    compiled = minicompile.compile(f)
    for n, m in [(6, 4), (7, 5), (9, 3)]:
        x = randn(m, n).t() if layout == "transposed" else \
            randn(2, 3, n, m).contiguous(memory_format=torch.channels_last)
        got, want = compiled(x), f(x)
        assert_same(got, want)
        assert [g.stride() for g in got] == [w.stride() for w in want]


def test_a_returned_view_of_a_products_result_has_eagers_strides_in_dims_of_size_one():
    """A dim of size 1 may have any stride, and a view of a buffer read it as 0: kornia's blur
    of a batch of 1 (a depthwise convolution's result viewed) came back with strides (0, 99,
    11, 1) where eager's are (297, 99, 11, 1), which code reading strides sees."""
    import torch.nn.functional as F
    k, w = torch.randn(3, 1, 3, 3), torch.randn(12, 5)
    cases = [(lambda x: F.conv2d(x, k, groups=3, padding=1).view(x.shape), torch.rand(1, 3, 9, 11)),
             (lambda x: (x @ w).view(1, 7, 5), torch.rand(7, 12)),
             (lambda x: (x @ w).view(7, 1, 5), torch.rand(7, 12))]
    for fn, x in cases:
        minicompile.reset()
        expected, got = fn(x), minicompile.compile(fn)(x)
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride()
