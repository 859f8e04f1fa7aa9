"""torch.autocast around and inside compiled code: eager's dtypes and values.

Autocast is global state PyTorch's dispatcher reads; generated kernels read none. So the
autocast state is guarded (a call under another state recompiles, as Dynamo's GLOBAL_STATE
guard does), `with torch.autocast(...)` blocks are traced, and the backend makes every cast
autocast would make a node of the graph (minicompile/autocast.py). A block that changes
nothing (transformers' `maybe_autocast(enabled=False)` when autocast is off) leaves no trace.
"""
import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile import autocast
from conftest import DEVICE
from helpers import randn

LOW = torch.bfloat16 if DEVICE == "cpu" else torch.float16


def outer_autocast():
    return torch.autocast(DEVICE, dtype=LOW)


def assert_like_eager(got, expected):
    """Eager's dtypes; values within the low precision's tolerance wherever autocast is on
    (a float32 result computed from half-precision products inherits their rounding)."""
    low = autocast.state() != autocast.OFF or any(
        isinstance(e, torch.Tensor) and e.dtype == LOW for e in torch.utils._pytree.tree_leaves(expected))
    for g, e in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)):
        if not isinstance(e, torch.Tensor):
            assert g == e
            continue
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        tol = 3e-2 if low else 1e-5
        torch.testing.assert_close(g.float(), e.float(), rtol=tol, atol=tol)


def run_both_states(fn, *args, **options):
    """fn compiled once, called with autocast off, on, and off again: eager's results each time."""
    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(fn, **options)
    for ctx in (contextlib.nullcontext, outer_autocast, contextlib.nullcontext):
        with ctx(), warnings.catch_warnings():
            warnings.simplefilter("ignore")          # (a dtype without C++ kernels falls back)
            assert_like_eager(compiled(*args), fn(*args))
    return compiled


def mlp(x, w1, w2):
    h = F.gelu(x @ w1)
    return F.softmax(h @ w2, dim=-1), h.sum()


def test_compiled_outside_autocast_then_called_inside(kernel_backend):
    x, w1, w2 = randn(37, 24), randn(24, 19), randn(19, 11)
    run_both_states(mlp, x, w1, w2)
    assert minicompile.metrics.graphs == 2 and minicompile.metrics.recompiles == 1


def test_recompile_reason_names_autocast(capsys):
    minicompile.set_logs(recompiles=True)
    try:
        f = minicompile.compile(lambda x: x @ x, backend="eager")
        x = randn(5, 5)
        f(x)
        with outer_autocast():
            f(x)
    finally:
        minicompile.set_logs(recompiles=False)
    assert f"GLOBAL_STATE changed: autocast ({DEVICE})" in capsys.readouterr().out


def block_inside(x, w):
    with torch.autocast(DEVICE, dtype=LOW):
        y = x @ w
        z = torch.relu(y) + 1
    return y, z.float() * x.mean(), z.dtype


def test_autocast_block_inside_the_function(kernel_backend):
    x, w = randn(33, 17, layout="transposed"), randn(17, 9)
    run_both_states(block_inside, x, w)
    assert minicompile.metrics.graph_breaks == 0


def maybe_autocast(device_type, dtype=None, enabled=True):
    """transformers' helper: autocast only where it would change something."""
    if torch.is_autocast_enabled(device_type) or enabled:
        return torch.autocast(device_type, dtype=dtype, enabled=enabled)
    return contextlib.nullcontext()


def rotary(x, inv_freq, positions):
    with maybe_autocast(DEVICE, enabled=False):       # forced float32, as transformers' rotary
        freqs = (inv_freq[None, :, None].float() @ positions[:, None, :].float()).transpose(1, 2)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
    return (x @ x.transpose(-1, -2)).sum(-1), cos.to(x.dtype), sin


def test_disabled_block_in_and_out_of_autocast(kernel_backend):
    x = randn(2, 7, 16)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2, device=DEVICE).float() / 16))
    positions = torch.arange(7, device=DEVICE)[None].expand(2, 7)
    run_both_states(rotary, x, inv_freq, positions, fullgraph=True)
    assert minicompile.metrics.graph_breaks == 0


def test_a_block_that_changes_nothing_leaves_no_node():
    inv_freq = randn(8)
    positions = torch.arange(5, device=DEVICE)[None]
    gm = minicompile.explain(rotary)(randn(1, 5, 16), inv_freq, positions).graphs[0]
    assert not any(n.target in (autocast.ENTER, autocast.EXIT) for n in gm.graph.nodes)


def test_nullcontext_enter_result():
    def f(x):
        with contextlib.nullcontext(x * 2) as y:
            return y + 1
    x = randn(6)
    compiled = minicompile.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x), f(x))


def test_torch_compile_with_minicompile_backend_under_autocast():
    torch._dynamo.reset()
    x, w1, w2 = randn(21, 24), randn(24, 19), randn(19, 11)
    compiled = torch.compile(mlp, backend=minicompile.backend)
    for ctx in (outer_autocast, contextlib.nullcontext):
        with ctx(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert_like_eager(compiled(x, w1, w2), mlp(x, w1, w2))
    torch._dynamo.reset()


def test_autocast_with_a_non_constant_argument_breaks_the_graph():
    def f(x, flag):
        with torch.autocast(DEVICE, dtype=LOW, enabled=bool(flag.sum() > 0)):
            return x @ x
    x = randn(4, 4)
    flag = torch.ones(1, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = minicompile.compile(f)(x, flag)
    assert_like_eager(got, f(x, flag))


def test_explicit_casts_pass_on_a_plain_graph():
    """The pass alone: every node autocast changes gets its inputs cast, and the graph then
    gives autocast's dtypes with autocast off."""
    def f(x, w):
        return torch.relu(x @ w) * 2
    gm = torch.fx.symbolic_trace(f)
    x, w = randn(8, 8), randn(8, 8)
    with outer_autocast():
        expected = f(x, w)
        explicit = autocast.explicit_casts(gm, [x, w])
        assert autocast.state() != autocast.OFF         # the caller's state is left as it was
    got = explicit(x, w)
    assert sum(n.target == "to" for n in explicit.graph.nodes) == 2
    assert_like_eager(got, expected)


def _scaled_by_its_own_sum_under_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        s = float(y.float().sum())          # a graph break inside the block
        return (y @ w * s).float().sum()


def test_a_break_inside_autocast_is_traced_once():
    """The frame is resumed after the break, and traced no more after the second call (whose
    new `s` makes the rest generic in it). (Its frame was skipped, whose guard, built inside
    the block, asked for autocast on and failed at every call's entry: every call traced it.)"""
    compiled = minicompile.compile(_scaled_by_its_own_sum_under_autocast)
    w = torch.randn(4, 4)
    for call in range(6):
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x, w), _scaled_by_its_own_sum_under_autocast(x, w))
        if call == 1:
            traced = minicompile.metrics.graph_breaks, minicompile.metrics.graphs
    assert (minicompile.metrics.graph_breaks, minicompile.metrics.graphs) == traced
    assert minicompile.metrics.graphs >= 2


def _breaks(t):
    print(end="")                           # (a graph break)
    return t


def _break_inside(x, w):
    with outer_autocast():
        h = _breaks(x @ w)                  # the product runs in autocast's dtype
        y = h @ w + h
        inside = torch.is_autocast_enabled(DEVICE)
    return y, x @ w, inside


def _break_inside_a_block_that_turns_it_off(x, w):
    with outer_autocast():
        h = x @ w
        with torch.autocast(DEVICE, enabled=False):
            g = _breaks(h.float() @ w)
            g = g @ w
        z = g @ w
    return h, g, z


def _two_breaks_inside_no_grad_and_autocast(x, w):
    with torch.no_grad(), outer_autocast():
        h = _breaks(x @ w)
        h = _breaks(h @ w)
        h = h @ w
    return h * 2


def _a_break_that_raises_inside(x, w):
    with outer_autocast():
        h = x @ w
        int("not a number")
    return h


def _training_step_with_a_break_inside(x, w):
    with outer_autocast():
        h = (x @ w).relu()
        h = _breaks(h)
        loss = (h @ w).float().pow(2).mean()
    loss.backward()
    return loss, w.grad


def _autocast_state():
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return autocast.state(), torch.is_autocast_cache_enabled(), nesting


@pytest.mark.parametrize("fn", [_break_inside, _break_inside_a_block_that_turns_it_off,
                                _two_breaks_inside_no_grad_and_autocast, _a_break_that_raises_inside,
                                _training_step_with_a_break_inside])
def test_a_break_inside_autocast_is_resumed_in_its_state(fn):
    """The call that breaks the graph inside `with torch.autocast(...)` runs in autocast's
    state (a real block entered for it), the rest of the block is compiled in it, and the
    block's exit runs for real: eager's dtypes and values, and the state after the call (the
    exception's too) is the state before it. (The whole frame ran eagerly.)"""
    compiled = minicompile.compile(fn)
    for _ in range(3):
        x, w0 = randn(5, 8), randn(8, 8)
        outcomes = []
        for run in (fn, compiled):
            w = w0.clone().requires_grad_(fn is _training_step_with_a_break_inside)
            before = _autocast_state()
            try:
                outcomes.append(run(x, w))
            except ValueError as e:
                outcomes.append(str(e))
            assert _autocast_state() == before
        with outer_autocast():               # (values computed through the low precision)
            assert_like_eager(outcomes[1], outcomes[0])
        before = _autocast_state()
        with contextlib.suppress(ValueError):       # (its graphs run as they are, autocast
            minicompile.explain(fn)(x, w0.clone().requires_grad_(w.requires_grad))   # nodes too)
        assert _autocast_state() == before
    assert minicompile.metrics.graphs >= 1            # (compiled: the frame did not run eagerly)


# modules whose functional op (multi_head_attention_forward, torch.gru) autocast casts inside
COMPOSITES = {
    "MultiheadAttention, cross": (lambda: torch.nn.MultiheadAttention(16, 4, batch_first=True),
                                  lambda m, x, y: m(x, y, y)[0]),
    "TransformerDecoderLayer": (lambda: torch.nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True),
                                lambda m, x, y: m(x, y)),
    "GRU": (lambda: torch.nn.GRU(16, 16, batch_first=True), lambda m, x, y: m(x)[0]),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.skipif(
    n == "GRU" and DEVICE == "cuda", reason="cuDNN's GRU does not run on fake tensors: PyTorch's kernels run "
                                            "the graph")) for n in COMPOSITES])
def test_a_training_step_through_an_op_autocast_casts_inside_is_compiled(name):
    """Autocast casts the products inside `F.multi_head_attention_forward` and `torch.gru`,
    not only their inputs: the node runs in autocast's state, and training's trace of it
    records those casts op by op, so forward and backward are generated code. (The graph ran
    on PyTorch's kernels.) Outputs, losses and gradients as eager's, within bfloat16's
    rounding."""
    make, call = COMPOSITES[name]
    torch.manual_seed(0)
    modules = [make().to(DEVICE)]
    modules.append(copy.deepcopy(modules[0]))

    def step_of(m):
        def step(x, y):
            with outer_autocast():
                out = call(m, x, y)
                loss = out.float().pow(2).mean()
            loss.backward()
            return out, loss
        return step

    compiled = minicompile.compile(step_of(modules[1]))
    x, y = randn(2, 5, 16), randn(2, 7, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # (no graph left to PyTorch's kernels)
        got = compiled(x, y)
    expected = step_of(modules[0])(x, y)
    with outer_autocast():
        assert_like_eager(got, expected)
        assert_like_eager([p.grad for p in modules[1].parameters()], [p.grad for p in modules[0].parameters()])
    assert minicompile.metrics.backward_kernels > 0
