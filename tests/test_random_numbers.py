"""Random numbers as eager draws them.

Every random op (rand, randn, their _like forms, randint, randperm, bernoulli, dropout in
training, nn.Dropout in train mode) inside a compiled function runs as PyTorch's own kernel,
once and in program order, so a seeded program gives eager's values and leaves PyTorch's
generator where eager leaves it: on the first call (whose trace ran the ops on real values)
and on cached calls, with torch.manual_seed inside the function too, through
minicompile.compile end to end on both kernel backends. With config.fallback_random off,
dropout, bernoulli, rand_like and randn_like are made inside the kernels instead (Philox, a
different stream): those tests check the distribution, not eager's values.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from conftest import DEVICE
from minicompile.graph_compiler import compile_graph
import torch.fx


def generator_state():
    return torch.cuda.get_rng_state() if DEVICE == "cuda" else torch.get_rng_state()


def check_as_eager(fn, *inputs, calls=3):
    """fn compiled gives eager's values and leaves the generator in eager's state, on the
    first call and on cached ones, each call from another seed."""
    compiled = minicompile.compile(fn)
    for call in range(calls):
        torch.manual_seed(100 + call)
        expected, state = fn(*inputs), generator_state()
        torch.manual_seed(100 + call)
        actual = compiled(*inputs)
        assert torch.equal(generator_state(), state), f"call {call}: the generator's state differs"
        for a, e in zip(torch.utils._pytree.tree_leaves(actual), torch.utils._pytree.tree_leaves(expected)):
            # the same numbers: what is computed from them may differ in the last digits
            # (the work around them is fused), nothing more
            assert a.dtype == e.dtype and a.shape == e.shape
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=f"call {call}")
    return compiled


X = torch.randn(37, 19, device=DEVICE)

RANDOM_PROGRAMS = {
    "rand": lambda x: x + torch.rand(37, 19, device=x.device),
    "randn": lambda x: torch.randn(37, 19, device=x.device) * x - 1,
    "rand_like": lambda x: torch.rand_like(x).relu() * 2,
    "randn_like": lambda x: (x + torch.randn_like(x)).sum(1),
    "randint": lambda x: x * torch.randint(0, 10, (37, 19), device=x.device),
    "randperm": lambda x: x[torch.randperm(37, device=x.device)] + 1,
    "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)) * x,
    "bernoulli_p": lambda x: x.bernoulli(0.3) + x,
    "dropout": lambda x: F.dropout(x * 2, 0.4, training=True) + 1,
    "two_in_a_row": lambda x: (torch.rand_like(x) + torch.randn_like(x), torch.rand(5, device=x.device)),
    # in-place random methods, on an input and on a new tensor: compiling must draw nothing
    "uniform_ of an input copy": lambda x: x.clone().uniform_() + x,
    "exponential_": lambda x: torch.empty_like(x).exponential_() * x,
    # random ops the lists of ir.RANDOM_* do not name: found by the aten ops they run
    "nn.init.normal_ unused": lambda x: (torch.nn.init.normal_(torch.empty(3, device=x.device)), x * torch.rand_like(x))[1],
    "gumbel_softmax": lambda x: F.gumbel_softmax(x, tau=0.5),
    "rrelu": lambda x: F.rrelu(x, training=True),
}


@pytest.mark.parametrize("name", list(RANDOM_PROGRAMS))
def test_random_ops_draw_what_eager_draws(kernel_backend, name):
    check_as_eager(RANDOM_PROGRAMS[name], X)


def test_random_tensors_are_eagers_to_the_bit(kernel_backend):
    def fn(x):
        return (torch.rand(3, 5, device=x.device), torch.randn_like(x), torch.randint(-5, 5, (7,), device=x.device),
                torch.randperm(9, device=x.device), F.dropout(x, 0.5, training=True), torch.bernoulli(x.sigmoid()))
    compiled = minicompile.compile(fn)
    for call in range(2):
        torch.manual_seed(call)
        expected = fn(X)
        torch.manual_seed(call)
        assert all(torch.equal(a, e) for a, e in zip(compiled(X), expected)), call


def draws_over_a_transpose(x):
    t = x.transpose(1, 2)
    return torch.randn_like(t) + torch.rand_like(t), F.dropout(t, 0.5, training=True)


@pytest.mark.parametrize("dynamic", [False, True])
def test_random_numbers_of_a_transposed_input_at_symbolic_sizes(kernel_backend, dynamic):
    """randn_like of a transpose fills its memory in order, so eager's (i, j) number is at the
    transpose's place: at symbolic sizes the input was made contiguous and drew them in
    another order (VITS's prior noise over a transposed matmul)."""
    compiled = minicompile.compile(draws_over_a_transpose, dynamic=dynamic)
    for n in (4, 6):
        x = torch.randn(2, 3, n, device=DEVICE)
        torch.manual_seed(n)
        expected = draws_over_a_transpose(x)
        torch.manual_seed(n)
        assert all(torch.equal(a, e) for a, e in zip(compiled(x), expected)), n


def test_dropout_module_in_training(kernel_backend):
    model = nn.Sequential(nn.Linear(19, 23), nn.Dropout(0.25), nn.ReLU(), nn.Dropout(0.5)).to(DEVICE).train()
    with torch.no_grad():
        check_as_eager(model, X)
        model.eval()                       # evaluation mode: the identity, no draws
        check_as_eager(model, X)


def test_manual_seed_inside_the_function(kernel_backend):
    def fn(x):
        torch.manual_seed(123)
        a = x + torch.rand_like(x)
        return a, torch.randperm(6, device=x.device), F.dropout(a, 0.5, training=True)
    compiled = check_as_eager(fn, X)
    # the same numbers whatever the seed before the call: the function seeds
    torch.manual_seed(0)
    first = compiled(X)
    torch.manual_seed(1)
    assert all(torch.equal(a, b) for a, b in zip(first, compiled(X)))


def test_a_random_result_nobody_reads_still_draws(kernel_backend):
    def fn(x):
        torch.rand(100, device=x.device)
        F.dropout(x, 0.5, training=True)
        x.bernoulli()
        return x + torch.rand_like(x)
    check_as_eager(fn, torch.rand(8, 8, device=DEVICE))


def test_random_ops_stay_in_order_between_fused_work(kernel_backend):
    """Random draws between computations fuse into their neighbours' kernels without being
    moved or repeated: each is an extern call, in program order."""
    def fn(x):
        a = torch.relu(x) * torch.rand_like(x)
        b = a.sum(1, keepdim=True) + torch.randn_like(x)
        return F.dropout(b, 0.2, training=True) * torch.rand(37, 1, device=x.device)
    check_as_eager(fn, X)


def test_random_op_is_logged_with_its_reason(kernel_backend, capsys):
    minicompile.set_logs(fusion=True)
    try:
        minicompile.compile(lambda x: torch.rand_like(x) + x)(X)
    finally:
        minicompile.set_logs(fusion=False)
    assert "random numbers: PyTorch's generator, in eager's order (config.fallback_random)" \
        in capsys.readouterr().out


def test_random_ops_through_torch_compile_with_minicompile_backend(kernel_backend):
    """Real TorchDynamo in front of minicompile's kernels: the values and the generator's
    state after the call are eager's too."""
    import torch._dynamo
    torch._dynamo.reset()
    fn = RANDOM_PROGRAMS["dropout"]
    compiled = torch.compile(fn, backend=minicompile.backend)
    for call in range(2):
        torch.manual_seed(call)
        expected, state = fn(X), generator_state()
        torch.manual_seed(call)
        assert torch.equal(compiled(X), expected)
        assert torch.equal(generator_state(), state)


# --------------------------------------------------------------------------- made in kernels


def in_kernels(fn, *inputs):
    with minicompile.config.patch(fallback_random=False):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
    return compiled


def test_dropout_made_in_the_kernel(kernel_backend):
    x = torch.randn(64, 200, device=DEVICE) + 3
    compiled = in_kernels(lambda x: F.dropout(x, 0.3, training=True) * 2, x)
    assert "dropout" not in compiled.wrapper_source         # no PyTorch kernel: it is generated
    y = compiled(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], (x * 2 / 0.7)[kept])
    assert 0.27 < 1 - kept.float().mean().item() < 0.33
    assert not torch.equal(compiled(x), y)                  # a new seed per call


def test_random_values_made_in_kernels(kernel_backend):
    x = torch.randn(128, 300, device=DEVICE)
    compiled = in_kernels(lambda x: (torch.rand_like(x), torch.randn_like(x), torch.bernoulli(torch.full_like(x, 0.25)),
                                     x.bernoulli(0.75)), x)
    u, n, b, c = compiled(x)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert abs(n.mean().item()) < 0.02 and abs(n.std().item() - 1) < 0.02
    assert abs(b.mean().item() - 0.25) < 0.01 and abs(c.mean().item() - 0.75) < 0.01
    assert b.dtype == x.dtype and set(b.unique().tolist()) <= {0.0, 1.0}
    torch.manual_seed(7)
    first = compiled(x)
    torch.manual_seed(7)
    assert all(torch.equal(p, q) for p, q in zip(first, compiled(x)))     # seeded: repeatable


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_uniform_numbers_in_half_precision_stay_below_one(kernel_backend, dtype):
    """A float draw just below 1 rounds up to 1.0 in half precision; eager's rand_like never
    gives 1.0."""
    x = torch.empty(200_000, dtype=dtype, device=DEVICE)
    u = in_kernels(lambda x: torch.rand_like(x), x)(x)
    assert u.dtype == dtype and 0 <= u.min() and u.max() < 1


@pytest.mark.skipif(DEVICE != "cpu", reason="C++ kernels are for CPU tensors")
def test_cpp_and_triton_kernels_draw_the_same_bits():
    """The C++ prelude's Philox is Triton's tl.rand: one seed, the same uniform numbers."""
    from conftest import HAS_TRITON
    if not HAS_TRITON:
        pytest.skip("no Triton")
    x = torch.randn(50, 70)
    out = {}
    for backend in ("cpp", "triton"):
        minicompile.config.cpu_backend = backend
        compiled = in_kernels(lambda x: (torch.rand_like(x), F.dropout(x, 0.5, training=True)), x)
        torch.manual_seed(3)
        out[backend] = compiled(x)
    assert all(torch.equal(a, b) for a, b in zip(out["cpp"], out["triton"]))


def test_an_explicit_generator_is_not_drawn_from_while_tracing(kernel_backend):
    """torch.rand(..., generator=g) runs at a graph break: the trace must not advance g."""
    def fn(x, g):
        return x + torch.rand(x.shape, generator=g, device=x.device)
    compiled = minicompile.compile(fn)
    for seed in (5, 6):
        g1 = torch.Generator(device=DEVICE).manual_seed(seed)
        g2 = torch.Generator(device=DEVICE).manual_seed(seed)
        torch.testing.assert_close(compiled(X, g2), fn(X, g1))
        assert torch.equal(g1.get_state(), g2.get_state())


def _draws_one_it_does_not_use(a):
    unused = torch.rand_like(a)               # noqa: F841 (eager's draw all the same)
    return a * torch.rand_like(a)


def test_a_random_draw_whose_result_is_unused_is_drawn_in_training_too():
    """A graph for training dropped a random op nothing read (the joint graph's dead code): the
    next draw, and every one after the call, differed from eager's under the same seed."""
    results = []
    for fn in (_draws_one_it_does_not_use, minicompile.compile(_draws_one_it_does_not_use)):
        torch.manual_seed(3)
        a = torch.randn(4, 5, device=DEVICE, requires_grad=True)
        out = fn(a)
        results.append((out.detach(), torch.rand(3, device=DEVICE)))
    torch.testing.assert_close(results[1], results[0])
