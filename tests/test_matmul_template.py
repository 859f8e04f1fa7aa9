"""Matrix-product templates (fusion's matmul-templates, codegen/matmul_template.py): torch.mm and
the pointwise kernel that reads its result as one Triton kernel. Forced with
config.matmul_templates (Triton's interpreter on a CPU), and chosen by timing in
mode="max-autotune" on a GPU. Results against eager on awkward sizes, strided and broadcast
inputs and each float dtype; the cases a template must refuse, with their reasons."""
import contextlib
import io

import pytest
import torch
import torch.nn.functional as F

import minicompile
from conftest import DEVICE, HAS_TRITON
from helpers import randn

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")]


@pytest.fixture
def templates():
    """Templates wherever they apply, untimed (on a CPU, in Triton's interpreter)."""
    with minicompile.config.patch(cpu_backend="triton", matmul_templates=True):
        yield


def compiled_and_logs(fn, *args, logs=("fusion", "output_code")):
    out = io.StringIO()
    minicompile.set_logs(**{name: True for name in logs})
    try:
        with contextlib.redirect_stdout(out):
            result = minicompile.compile(fn)(*args)
    finally:
        minicompile.set_logs(**{name: False for name in logs})
    return result, out.getvalue()


def assert_as_close_as_eager(out, eager, fn, inputs):
    """As close to the exact result (float64) as eager is. The template sums the product in
    another order than eager's: in float32 of 256 terms of size 1, a unit in the last place
    of values of size 10 is 1e-6, and the differences reach 2e-4 (GELU and a residual can make
    them relatively large); rounded to a half-precision dtype, or summed in TF32, more. Four
    units in the last place of the largest value are allowed besides: where eager's own error
    happens to be tiny (fresh inputs each run), the order of the sum alone can double it. In
    float32 with TF32 products allowed, the unit is TF32's (10 bits of mantissa)."""
    assert out.dtype == eager.dtype and out.stride() == eager.stride()
    exact = fn(*(t.double() for t in inputs))
    tf32 = out.dtype == torch.float32 and out.is_cuda and torch.backends.cuda.matmul.allow_tf32
    ulp = (2.0 ** -10 if tf32 else torch.finfo(out.dtype).eps) * exact.abs().max()
    assert (out.double() - exact).abs().max() <= 2 * (eager.double() - exact).abs().max() + 4 * ulp


def linear_gelu_residual(x, w, b, r):
    return F.gelu(F.linear(x, w, b)) + r


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_bias_activation_and_residual_are_one_kernel(templates, dtype):
    x, w, b, r = (randn(3, 37, 48, dtype=dtype), randn(70, 48, dtype=dtype), randn(70, dtype=dtype),
                  randn(3, 37, 70, dtype=dtype))
    out, text = compiled_and_logs(linear_gelu_residual, x, w, b, r)
    eager = linear_gelu_residual(x, w, b, r)
    assert_as_close_as_eager(out, eager, linear_gelu_residual, (x, w, b, r))
    assert "become one template kernel" in text and "tl.dot(" in text
    assert minicompile.metrics.kernels == 1          # the product's extern call is gone
    assert "torch.mm" not in text.split("def call(args):")[1]


@pytest.mark.parametrize("layout", ["transposed", "sliced", "broadcast-epilogue"])
def test_strided_operands_and_broadcast_epilogue_inputs(templates, layout):
    """a read as a transpose or a slice of its buffer (strides and an offset); the epilogue
    reading a tensor broadcast over the rows, and a scalar."""
    a_buf, b = randn(48, 111), randn(48, 65)
    scale = randn(1, 65)
    if layout == "transposed":
        def f(a_buf, b, scale):
            return torch.relu(a_buf.t() @ b) * 2
    elif layout == "sliced":
        a_buf = randn(130, 50)

        def f(a_buf, b, scale):
            return torch.sigmoid(a_buf[7:118, 1:49] @ b)
    else:
        def f(a_buf, b, scale):
            return (a_buf.t() @ b) * scale + 0.5
    out, text = compiled_and_logs(f, a_buf, b, scale)
    torch.testing.assert_close(out, f(a_buf, b, scale), rtol=1e-4, atol=1e-4)
    assert "become one template kernel" in text


def test_several_results_stored_from_one_tile(templates):
    """An epilogue kernel of two stored members (the activation, and the pre-activation the
    graph returns) stores both from the tile."""
    def f(x, w):
        h = x @ w + 1
        return h, torch.tanh(h)
    x, w = randn(33, 40), randn(40, 17)
    (h, t), text = compiled_and_logs(f, x, w)
    eh, et = f(x, w)
    torch.testing.assert_close(h, eh, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(t, et, rtol=1e-4, atol=1e-4)
    assert "become one template kernel" in text


@pytest.mark.parametrize("case, reason", [
    ("returned", "the graph returns it"),
    ("row-reduction", "not a pointwise kernel"),
    ("two-readers", "read by more than one step"),
    ("float64", "a product of torch.float64"),
])
def test_what_a_template_refuses_is_said_and_eager_results_kept(templates, case, reason):
    def f(x, w):
        p = x @ w
        if case == "returned":
            return p, torch.relu(p)
        if case == "row-reduction":
            return torch.softmax(p, -1)
        if case == "two-readers":
            return torch.relu(p), p.sum(0)
        return (x.double() @ w.double()) + 1
    x, w = randn(21, 30), randn(30, 19)
    out, text = compiled_and_logs(f, x, w, logs=("fusion",))
    torch.testing.assert_close(out, f(x, w), rtol=1e-4, atol=1e-4)
    assert "become one template kernel" not in text and reason in text


def test_no_templates_by_default_and_none_on_the_cpp_backend():
    x, w, b, r = randn(3, 37, 48), randn(70, 48), randn(70), randn(3, 37, 70)
    _, text = compiled_and_logs(linear_gelu_residual, x, w, b, r, logs=("fusion",))
    assert "template" not in text
    with minicompile.config.patch(matmul_templates=True, cpu_backend="cpp"):
        minicompile.reset()
        _, text = compiled_and_logs(linear_gelu_residual, x, w, b, r, logs=("fusion",))
    assert "template" not in text or DEVICE == "cuda"


def test_changing_tf32_recompiles():
    """Whether float32 products may use TF32 is global state a template bakes in: guarded."""
    f = minicompile.compile(lambda x: x * 2)
    x = randn(4)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        f(x)
        torch.backends.cuda.matmul.allow_tf32 = not before
        f(x)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert minicompile.metrics.recompiles == 1


def test_template_settings_fit_the_sizes_and_the_shared_memory():
    from minicompile.codegen.matmul_template import candidates, default_settings
    assert default_settings(20, 3000, 9, torch.float32, torch.device("cpu"))[:3] == (32, 128, 16)
    found = candidates(4096, 4096, 4096, torch.bfloat16, torch.device("cpu"))
    assert found[0] == default_settings(4096, 4096, 4096, torch.bfloat16, torch.device("cpu"))
    assert len(found) == len(set(found)) >= 5
    if DEVICE == "cuda":
        limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
        for bm, bn, bk, stages, _ in candidates(4096, 4096, 4096, torch.float32, torch.device("cuda")):
            assert (bm + bn) * bk * 4 * stages <= limit


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="timing needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_max_autotune_times_templates_against_pytorchs_product(dtype, tmp_path, monkeypatch):
    monkeypatch.setattr(minicompile.config, "cache_dir", str(tmp_path))      # nothing tuned before
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    x, w, b, r = (randn(8, 128, 768, dtype=dtype), randn(3072, 768, dtype=dtype), randn(3072, dtype=dtype),
                  randn(8, 128, 3072, dtype=dtype))
    out = io.StringIO()
    minicompile.set_logs(autotune=True)
    with contextlib.redirect_stdout(out):
        result = minicompile.compile(linear_gelu_residual, mode="max-autotune-no-cudagraphs")(x, w, b, r)
    assert_as_close_as_eager(result, linear_gelu_residual(x, w, b, r), linear_gelu_residual, (x, w, b, r))
    assert "template (1024 x 768 @ 768 x 3072" in out.getvalue()
    minicompile.reset()                       # a later compile times nothing: the choice is on disk
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        again = minicompile.compile(linear_gelu_residual, mode="max-autotune-no-cudagraphs")(x, w, b, r)
    assert "template (" not in out.getvalue()
    torch.testing.assert_close(again, result)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="timing needs a GPU")
def test_templates_of_the_same_code_are_timed_once(tmp_path, monkeypatch):
    """Two layers with the same sizes: one template's code, compiled and timed once, the choice
    serving both."""
    monkeypatch.setattr(minicompile.config, "cache_dir", str(tmp_path))
    def two_layers(x, w, b):
        h = F.gelu(F.linear(x, w, b)) + x
        return F.gelu(F.linear(h, w, b)) + h
    x, w, b = randn(512, 256), randn(256, 256), randn(256)
    out = minicompile.compile(two_layers, mode="max-autotune-no-cudagraphs")(x, w, b)
    assert_as_close_as_eager(out, two_layers(x, w, b), two_layers, (x, w, b))
    choices = minicompile.metrics.template_choices
    assert len(choices) == 1 and choices[0]["same_code"] == 2, choices
