"""A wide sweep of what people write, each compiled and compared with eager: ops with and
without lowerings (the latter must fall back to PyTorch), integer and boolean tensors, dtype
casts, NaN and infinity, empty and 0-dim tensors, containers as outputs."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import minicompile
from conftest import DEVICE


def X(*shape):
    return torch.randn(*shape, device=DEVICE)


def I(*shape):
    return torch.randint(-9, 9, shape, device=DEVICE)


NAN = float("nan")
CASES = {
    "masked_fill": (lambda x: x.masked_fill(x > 0.5, -1.0) * 2, lambda: (X(7, 9),)),
    "cat": (lambda x, y: torch.cat([x * 2, y.relu()], dim=1).sum(-1), lambda: (X(5, 3), X(5, 4))),
    "stack": (lambda x, y: torch.stack([x, y * 2], 0).mean(0), lambda: (X(5, 3), X(5, 3))),
    "chunk": (lambda x: sum(c.sum() for c in x.chunk(3, dim=1)), lambda: (X(4, 9),)),
    "argmax": (lambda x: x.argmax(-1) + 1, lambda: (X(6, 11),)),
    "topk": (lambda x: x.topk(3, dim=-1).values * 2, lambda: (X(6, 11),)),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b).tanh(), lambda: (X(4, 5), X(5, 6))),
    "int_ops": (lambda i: (i * 3 + 1) % 5, lambda: (I(6, 7),)),
    "int_floor_div": (lambda i: i // 3 + torch.div(i, 2, rounding_mode="floor"), lambda: (I(6, 7),)),
    "bool_mask_mean": (lambda x: (x > 0).float().mean(-1), lambda: (X(6, 7),)),
    "where_scalar": (lambda x: torch.where(x > 0, x, 0.0) + torch.where(x < 0, 1.0, x), lambda: (X(6, 7),)),
    # the method's first argument is the value taken where the condition holds (Longformer)
    "where_method": (lambda x, y: x.where(x > 0, y) + y.where(x < 0, 2.0), lambda: (X(6, 7), X(7))),
    "clamp_tensor": (lambda x, lo: torch.clamp(x, min=lo), lambda: (X(6, 7), X(7))),
    "inplace_on_intermediate": (lambda x: x.clone().mul_(2).add_(1), lambda: (X(6, 7),)),
    "reshape_minus_one": (lambda x: x.reshape(-1, 3).sum(0), lambda: (X(4, 6),)),
    "expand_sum": (lambda x: x.unsqueeze(0).expand(3, -1, -1).sum(0), lambda: (X(4, 6),)),
    "mean_tuple_dims": (lambda x: x.mean((0, 2), keepdim=True) - x, lambda: (X(3, 4, 5),)),
    "explicit_half_cast": (lambda x: (x.half() * 2).float().sum(-1), lambda: (X(5, 8),)),
    "sum_dtype_arg": (lambda x: x.sum(-1, dtype=torch.float64), lambda: (X(5, 8),)),
    "softmax_dim0": (lambda x: torch.softmax(x, 0), lambda: (X(5, 8),)),
    "log_softmax_3d": (lambda x: F.log_softmax(x, dim=1), lambda: (X(2, 5, 8),)),
    "layer_norm_2d": (lambda x, w, b: F.layer_norm(x, (4, 5), w, b), lambda: (X(3, 4, 5), X(4, 5), X(4, 5))),
    "mse_loss": (lambda a, b: F.mse_loss(a, b), lambda: (X(6, 7), X(6, 7))),
    "cross_entropy": (lambda a, t: F.cross_entropy(a, t),
                      lambda: (X(6, 7), torch.randint(0, 7, (6,), device=DEVICE))),
    "tensor_index": (lambda x, i: x[i] * 2, lambda: (X(6, 7), torch.tensor([0, 2, 5], device=DEVICE))),
    "bool_index": (lambda x: x[x > 0].sum(), lambda: (X(6, 7),)),
    "negative_slices": (lambda x: x[:, -3:] + x[:, :3], lambda: (X(6, 7),)),
    "transpose_matmul": (lambda x, w: (x.t() @ w).relu(), lambda: (X(6, 5), X(6, 4))),
    "reverse_ops": (lambda x: 1 - x + 1 / (x.abs() + 1), lambda: (X(6, 7),)),
    "count_in_range": (lambda x: ((x > -0.5) & (x < 0.5)).sum(), lambda: (X(6, 7),)),
    "int_amax": (lambda i: i.amax(-1), lambda: (I(6, 7),)),
    "sum_of_bools": (lambda x: (x > 0).sum(-1), lambda: (X(6, 7),)),
    "cumsum": (lambda x: x.cumsum(0) * 2, lambda: (X(6, 7),)),
    "bce_logits": (lambda x, t: F.binary_cross_entropy_with_logits(x, t),
                   lambda: (X(6, 7), torch.rand(6, 7, device=DEVICE))),
    "norm": (lambda x: x.norm(dim=-1), lambda: (X(6, 7),)),
    "nested_outputs": (lambda x: [x + 1, (x * 2, {"a": x.sum()})], lambda: (X(3, 3),)),
    "empty": (lambda x: x.sum(-1) * 2, lambda: (X(0, 4),)),
    "one_element": (lambda x: (x + 1).relu(), lambda: (X(1),)),
    "zero_dim": (lambda x: x * 3 + 1, lambda: (torch.tensor(2.0, device=DEVICE),)),
    "var_mean": (lambda x: torch.var_mean(x, -1), lambda: (X(5, 9),)),
    "max_with_dim": (lambda x: x.max(-1).values + x.min(dim=0)[0].sum(), lambda: (X(5, 9),)),
    "factories": (lambda x: torch.full_like(x, 3.0) + torch.ones_like(x) * x, lambda: (X(5, 9),)),
    "arange": (lambda x: x + torch.arange(9, device=x.device), lambda: (X(5, 9),)),
    "activations": (lambda x: F.leaky_relu(x, 0.1) + F.elu(x) + F.hardtanh(x) + F.relu6(x * 4), lambda: (X(5, 9),)),
    "embedding": (lambda i, w: F.embedding(i, w).sum(-1),
                  lambda: (torch.randint(0, 10, (3, 4), device=DEVICE), X(10, 6))),
    "conv_pool": (lambda x, w: F.max_pool2d(F.conv2d(x, w, padding=1).relu(), 2).mean((2, 3)),
                  lambda: (X(2, 3, 8, 8), X(4, 3, 3, 3))),
    "nan_in_max": (lambda x: x.amax(-1) + x.amin(-1),
                   lambda: (torch.tensor([[1.0, NAN, 2.0], [1.0, 3.0, 2.0]], device=DEVICE),)),
    "nan_in_relu_and_maximum": (lambda x: x.relu() + torch.maximum(x, torch.zeros_like(x)),
                                lambda: (torch.tensor([NAN, -1.0, 2.0], device=DEVICE),)),
    "overflow_to_inf": (lambda x: torch.exp(x * 1000).sum(-1), lambda: (X(3, 4),)),
    "bfloat16": (lambda x: torch.relu(x + 1) * 2, lambda: (X(8, 8).bfloat16(),)),
    # masks: not, ~, any (over one dim, several, all), a float read as a bool (NaN is True)
    "mask_logic": (lambda x, m: ((~m & (x > 0)).any(-1, keepdim=True) | m.any(0), torch.logical_not(x),
                                 (x < 0.3).any(dim=(0, 2)), (x > 5).any(), torch.where(~m, x, 0.0).sum(-1)),
                   lambda: (torch.tensor([NAN, 0.0, 1.0], device=DEVICE).repeat(70).view(5, 6, 7)
                            + X(5, 6, 7).abs(), X(5, 6, 7) > 0.5)),
    # reductions of the same columns share one kernel; a mean asked for twice is computed once
    "column_statistics": (lambda x: (x.sum(0), (x * x).sum(0), torch.var_mean(x, (0, 2)), x.mean((0, 2))),
                          lambda: (X(9, 5, 7).double(),)),
    # dims of a 0-dim tensor (0 and -1 name no dimension) and an empty dim list (every dim)
    "zero_dim_dims": (lambda x: torch.softmax(x, 0) + torch.var(x, -1) + x.sum(0) + x.t() + x.transpose(0, -1)
                      + torch.log_softmax(x, -1) + x.amax(0), lambda: (torch.randn((), device=DEVICE),)),
    "var_std_empty_dim_list": (lambda x: torch.var(x, dim=[]) + torch.std(x, dim=(), keepdim=True),
                               lambda: (X(5, 9),)),
    # a pointwise op of two numbers makes a tensor: nothing to read it from
    "numbers_only": (lambda x: x * 2 + torch.add(2.5, -1.25) * torch.sub(3, 1.5) / torch.div(1.0, 4.0),
                     lambda: (X(3, 4),)),
    # a composite lowering one of whose reductions has no elements (softmax's max)
    "softmax_of_empty_rows": (lambda x: torch.softmax(x, -1) * 2 + torch.log_softmax(x, 1), lambda: (X(5, 0, 0),)),
    # var(x, unbiased): a bool where the other overload takes dim
    "var_std_unbiased_overload": (lambda x: torch.var(x, False) + torch.std(x, True) + x.var(True)
                                  + x[0].std(False), lambda: (X(5, 9),)),
    # complex numbers run on PyTorch's kernels (a kernel would read them as reals)
    "complex": (lambda x: ((lambda z: ((z * z).abs(), z.angle(), torch.view_as_real(z * 2)))
                           (torch.complex(x, x * 2))), lambda: (X(6, 7),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(kernel_backend, name):
    fn, make_args = CASES[name]
    args = make_args()
    expected = fn(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # some cases run parts on PyTorch, and say so
        actual = minicompile.compile(fn)(*args)
    tol = dict(rtol=2e-2, atol=2e-2) if name == "bfloat16" else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(actual, expected, equal_nan=True, **tol)


def _mutate_after_use(x):
    y = x * 2
    z = y + 1            # computed before the mutation: must not see it
    y.mul_(3)
    return z, y + 0


def _mutate_with_view(x):
    y = x * 2
    v = y[0]             # a view: must see the mutation, as in eager
    y.add_(1)
    return v * 1


@pytest.mark.parametrize("fn", [_mutate_after_use, _mutate_with_view])
def test_in_place_ops_on_intermediates(kernel_backend, fn):
    x = X(4, 5)
    expected = fn(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = minicompile.compile(fn)(x)
    torch.testing.assert_close(actual, expected)


def _mutate_a_view(x):
    b = x * 2
    y = b[0]             # mutating a view changes its base, as in eager
    y.add_(1)
    return b


def test_in_place_op_on_a_view_changes_the_base(kernel_backend):
    x = X(4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(minicompile.compile(_mutate_a_view)(x), _mutate_a_view(x))


def test_float64_activations_compile_at_float64_precision(kernel_backend):
    """Constants in a float64 computation are float64: a float32 constant made C++'s max
    (double, float) fail to compile (hardsigmoid, hardswish) and rounded gelu's and layer
    norm's eps to float32 precision."""
    def fn(x):
        return F.hardsigmoid(x) + F.hardswish(x) + F.gelu(x) + F.gelu(x, approximate="tanh") \
            + F.layer_norm(x, (11,), eps=0.3)
    x = torch.randn(37, 11, dtype=torch.float64, device=DEVICE) * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")         # (a kernel that did not compile says so)
        out = minicompile.compile(fn)(x)
    torch.testing.assert_close(out, fn(x), rtol=1e-12, atol=1e-12)
