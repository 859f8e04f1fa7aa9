"""The compiled optimizer step (minicompile/optim.py): `opt.step()` inside compiled code runs
minicompile's generated update. Several steps of SGD, Adam and AdamW, eager and compiled, from
the same parameters and gradients (fresh random values of awkward sizes, a non-contiguous
parameter, two parameter groups, a parameter whose gradient appears late): after every step the
parameters and the optimizer's state must be eager's."""
import copy
import warnings

import pytest
import torch

import minicompile
from conftest import DEVICE
from helpers import assert_same, randn

CONFIGS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd_nesterov_maximize": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, maximize=True)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam_weight_decay_amsgrad": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.02, betas=(0.8, 0.99))),
    "adamw_foreach_maximize": (torch.optim.AdamW, dict(lr=0.02, foreach=True, maximize=True)),
}


def _params(dtype=torch.float32):
    torch.manual_seed(0)
    return [torch.nn.Parameter(randn(7, 5, dtype=dtype)),
            torch.nn.Parameter(randn(13, dtype=dtype)),
            torch.nn.Parameter(randn(3, 6, dtype=dtype, layout="transposed")),
            torch.nn.Parameter(randn(1, dtype=dtype))]


def _optimizer(cls, kwargs, params):
    # two groups, the second with its own learning rate
    return cls([{"params": params[:2]}, {"params": params[2:], "lr": kwargs["lr"] / 3}], **kwargs)


def _set_grads(eager, compiled, step):
    for i, (a, b) in enumerate(zip(eager, compiled)):
        if i == 3 and step == 0:              # its gradient appears at the second step
            a.grad = b.grad = None
            continue
        g = torch.randn_like(a)
        a.grad, b.grad = g.clone(), g.clone()


def _assert_state_equal(eager_opt, compiled_opt, dtype):
    for a, b in zip(eager_opt.param_groups, compiled_opt.param_groups):
        for p, q in zip(a["params"], b["params"]):
            assert_same(q, p, dtype)
            sa, sb = eager_opt.state[p], compiled_opt.state[q]
            assert sa.keys() == sb.keys()
            for k in sa:
                if isinstance(sa[k], torch.Tensor):
                    assert sb[k].device == sa[k].device and sb[k].dtype == sa[k].dtype
                    assert_same(sb[k], sa[k], dtype)
                else:
                    assert sb[k] == sa[k]


def _twin(params):
    """Parameters with params' values, for the compiled side."""
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def _steps_beside_eager(eager, mine, eager_opt, opt, step, steps, dtype=torch.float32):
    """`steps` steps of eager_opt and of `step` (opt's, compiled) on the same gradients, the
    parameters and states compared after each."""
    for i in range(steps):
        _set_grads(eager, mine, i)
        eager_opt.step()
        step()
        _assert_state_equal(eager_opt, opt, dtype)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_steps_equal_eager(name, kernel_backend):
    cls, kwargs = CONFIGS[name]
    eager = _params()
    mine = _twin(eager)
    eager_opt, opt = _optimizer(cls, kwargs, eager), _optimizer(cls, kwargs, mine)

    @minicompile.compile
    def step():
        opt.step()

    _steps_beside_eager(eager, mine, eager_opt, opt, step, 4)
    assert minicompile.metrics.kernels > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_adamw_in_other_dtypes(dtype, kernel_backend):
    eager = _params(dtype)
    mine = _twin(eager)
    eager_opt, opt = torch.optim.AdamW(eager, lr=0.01), torch.optim.AdamW(mine, lr=0.01)
    _steps_beside_eager(eager, mine, eager_opt, opt, minicompile.compile(lambda: opt.step()), 3, dtype)


def test_one_kernel_per_parameter_and_no_recompile_per_step():
    params = _params()
    opt = torch.optim.Adam(params, lr=0.01)
    step = minicompile.compile(lambda: opt.step())
    for i in range(4):
        _set_grads(params, [torch.empty_like(p) for p in params], i)
        step()
    # the first step lacks the last parameter's gradient: two graphs, then none per step
    assert minicompile.metrics.graphs == 2
    # every parameter's update (the moments, the bias corrections, the write) in one launch
    assert minicompile.metrics.kernels == 2


def test_one_kernel_per_parameter_without_combo_kernels():
    from minicompile.fusion import PASSES
    params = _params()
    opt = torch.optim.Adam(params, lr=0.01)
    step = minicompile.compile(lambda: opt.step(),
                               options={"fusion_passes": tuple(p for p in PASSES if p.name != "combo-kernels")})
    for i in range(2):
        _set_grads(params, [torch.empty_like(p) for p in params], i)
        step()
    assert minicompile.metrics.kernels == 3 + 4


def test_learning_rate_scheduler_and_hooks():
    eager = _params()
    mine = _twin(eager)
    eager_opt, opt = torch.optim.AdamW(eager, lr=0.05), torch.optim.AdamW(mine, lr=0.05)
    eager_sched = torch.optim.lr_scheduler.StepLR(eager_opt, step_size=1, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    calls = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))

    @minicompile.compile
    def train_step():
        opt.step()
        sched.step()

    for i in range(4):
        _set_grads(eager, mine, i)
        eager_opt.step()
        eager_sched.step()
        train_step()
        _assert_state_equal(eager_opt, opt, torch.float32)
    assert calls == ["pre", "post"] * 4
    assert opt._opt_called
    assert minicompile.metrics.graphs == 2           # a new learning rate does not recompile


def train_step(m, o, x):
    loss = m(x).square().mean()
    loss.backward()
    o.step()
    o.zero_grad()
    return loss


def test_training_loop_with_backward_and_step():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(9, 17), torch.nn.GELU(), torch.nn.Linear(17, 3)).to(DEVICE)
    twin = copy.deepcopy(model)
    eager_opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    opt = torch.optim.AdamW(twin.parameters(), lr=0.01)
    compiled = minicompile.compile(twin)

    step = minicompile.compile(train_step)
    for _ in range(3):
        x = randn(6, 9)
        assert_same(step(compiled, opt, x), train_step(model, eager_opt, x))
        for p, q in zip(model.parameters(), twin.parameters()):
            assert_same(q, p)
            assert q.grad is None


@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.SGD])
def test_a_learning_rate_per_layer_compiles_each_groups_update_once(cls):
    """Twelve layers of other widths, a parameter group each (layer-wise learning rates): every
    group's update was a recompile of one function, which reached the recompile limit (the
    groups after ran eagerly, and the step was slower than eager's)."""
    torch.manual_seed(0)
    widths = [6] + [4 + i for i in range(12)] + [3]
    model = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]).to(DEVICE)
    twin = copy.deepcopy(model)
    extra = {"momentum": 0.9} if cls is torch.optim.SGD else {}
    eager_opt, opt = [cls([{"params": layer.parameters(), "lr": 0.01 * 0.9 ** i} for i, layer in enumerate(m)],
                          lr=0.01, **extra) for m in (model, twin)]

    step = minicompile.compile(train_step)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)            # (the recompile limit's warning)
        for _ in range(3):
            x = randn(5, 6)
            assert_same(step(twin, opt, x), train_step(model, eager_opt, x))
    for p, q in zip(model.parameters(), twin.parameters()):
        assert_same(q, p)


def test_clipping_gradients_of_a_parameters_generator_as_eager(recwarn):
    """clip_grad_norm_(model.parameters()) inside the compiled step: the generator is drained
    once, by the clipping (a trace that ran it on the real generator left it empty for the
    call made at the graph break: no clipping, a norm of 0)."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(9, 17), torch.nn.GELU(), torch.nn.Linear(17, 3)).to(DEVICE)
    twin = copy.deepcopy(model)
    eager_opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)

    def train_step(m, o, x):
        loss = m(x).square().mean() * 100
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        o.step()
        o.zero_grad()
        return loss, norm

    step = minicompile.compile(train_step)
    for _ in range(3):
        x = randn(6, 9)
        ours, theirs = step(twin, opt, x), train_step(model, eager_opt, x)
        assert ours[1] > 0.5
        assert_same(ours, theirs)
        for p, q in zip(model.parameters(), twin.parameters()):
            assert_same(q, p)
    assert not [w for w in recwarn if "empty generator" in str(w.message)]


def test_unmodelled_options_run_pytorchs_step(capsys):
    params = _params()
    opt = torch.optim.Adam(params, lr=0.01, fused=True)
    eager = _twin(params)
    eager_opt = torch.optim.Adam(eager, lr=0.01, fused=True)
    minicompile.logs.set_logs(graph_breaks=True)
    try:
        step = minicompile.compile(lambda: opt.step())
        _set_grads(eager, params, 1)
        step()
        eager_opt.step()
    finally:
        minicompile.logs.set_logs()
    _assert_state_equal(eager_opt, opt, torch.float32)
    assert "Adam.step() runs as PyTorch's: fused=True" in capsys.readouterr().out


def test_compiling_the_step_method_itself():
    """minicompile.compile(opt.step), as some guides write it, runs the compiled step too."""
    eager = _params()
    mine = _twin(eager)
    eager_opt, opt = torch.optim.Adam(eager, lr=0.01), torch.optim.Adam(mine, lr=0.01)
    _steps_beside_eager(eager, mine, eager_opt, opt, minicompile.compile(opt.step), 3)
    assert minicompile.metrics.kernels > 0
