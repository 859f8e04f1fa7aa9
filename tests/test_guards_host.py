"""The per-call host path of a compiled module: its guard fails on every change of what it
checks, with the C++ tensor check (TorchDynamo's TensorGuards) and with the pure-Python one
(config.cpp_tensor_guards=False); the guard's twin `check` hands on the graph's inputs.

Each case changes ONE property of a module whose parameters are graph inputs (modules are
guarded by type, never identity): the fast guard must fail, its slow twin must name the check,
and the compiled module, called again, must give eager's result (a recompile)."""
import pytest
import torch
import torch.nn as nn

import minicompile
from minicompile import config
from minicompile.capture import capture
from helpers import assert_same


@pytest.fixture(params=[True, False], ids=["cpp", "python"])
def tensor_guards(request, monkeypatch):
    monkeypatch.setattr(config, "cpp_tensor_guards", request.param)
    return request.param


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.norm = nn.LayerNorm(5)
        self.register_buffer("scale", torch.rand(5) + 0.5)

    def forward(self, x):
        return torch.relu(self.norm(self.fc(x))) * self.scale


def _param(m):
    return m.fc.weight


CHANGES = {
    # what changes: (how, the words the slow twin uses)
    "dtype": (lambda m: setattr(m.fc, "weight", nn.Parameter(_param(m).detach().double())),
              "dtype mismatch"),
    "shape": (lambda m: setattr(m.fc, "weight", nn.Parameter(torch.randn(5, 7))),
              "mismatch at index"),
    "strides": (lambda m: setattr(m.fc, "weight", nn.Parameter(torch.randn(6, 5).t())),
                "stride mismatch"),
    "requires_grad": (lambda m: _param(m).requires_grad_(False), "requires_grad mismatch"),
    "type (a tensor in place of a parameter)": (
        lambda m: (m.fc._parameters.pop("weight"), setattr(m.fc, "weight", torch.randn(5, 6))),
        "weight"),
    "buffer replaced by another shape": (
        lambda m: setattr(m, "scale", torch.rand(1)), "size mismatch"),
    "device": (lambda m: setattr(m.fc, "weight", nn.Parameter(torch.randn(5, 6, device="meta"))),
               "device mismatch"),
    "training flag": (lambda m: m.norm.train(not m.norm.training), "training"),
    "a forward hook": (lambda m: m.norm.register_forward_hook(lambda *a: None), "hooks"),
    "a submodule replaced by another class": (
        lambda m: setattr(m, "norm", nn.Identity()), "norm"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_change_fails_the_guard_and_names_it(change, tensor_guards):
    torch.manual_seed(0)
    m = Block().train()
    x = torch.randn(3, 6)
    cap = capture(m, (x,), {})
    assert cap.guard((x,), {}) and cap.guard.fail_reason((x,), {}) is None
    how, words = CHANGES[change]
    how(m)
    assert not cap.guard((x,), {})
    reason = cap.guard.fail_reason((x,), {})
    assert reason is not None and words in reason, reason
    seg = cap.segment
    assert seg.check(*cap_frame_call(m, x)) is None


def cap_frame_call(m, x):
    return type(m).forward, (m, x), {}


@pytest.mark.parametrize("change", [c for c in CHANGES if c not in ("device", "shape")])
def test_each_change_recompiles_to_eager_results(change, tensor_guards):
    torch.manual_seed(0)
    minicompile.reset()
    minicompile.metrics.reset()
    m = Block().eval()
    compiled = minicompile.compile(m)
    x = torch.randn(3, 6)
    with torch.no_grad():
        assert_same(compiled(x), m(x))
        CHANGES[change][0](m)
        if change == "dtype":
            x = x.double()
            m.fc.bias.data = m.fc.bias.data.double()
            m.norm.double()
            m.scale = m.scale.double()
        assert_same(compiled(x), m(x))
        assert_same(compiled(x), m(x))
    # a recompile (a hook on an inlined module is inlined with it)
    assert minicompile.metrics.graphs == 2


def test_only_the_cpp_check_sees_it(monkeypatch):
    """A conjugate view has the same dtype, sizes and strides: only its dispatch keys differ.
    The C++ check fails the guard and the slow twin gives its reason."""
    monkeypatch.setattr(config, "cpp_tensor_guards", True)

    def f(z):
        return z * 2
    z = torch.randn(4, dtype=torch.complex64)
    cap = capture(f, (z,), {})
    assert cap.guard((z,), {})
    assert not cap.guard((z.conj(),), {})
    assert "dispatch key set mismatch" in cap.guard.fail_reason((z.conj(),), {})
    minicompile.reset()
    compiled = minicompile.compile(f)
    for v in (z, z.conj(), z):
        assert_same(compiled(v), f(v))


def test_inference_mode_recompiles_and_says_why(monkeypatch, capsys):
    """Inference mode is global state the guard checks (tensors made in it are inference
    tensors, with other dispatch keys, which TorchDynamo's C++ tensor check would also see):
    the entry is compiled again, and the log names the check."""
    monkeypatch.setattr(config, "cpp_tensor_guards", True)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4)).eval()
    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(m)
    x = torch.randn(3, 8)
    minicompile.set_logs(recompiles=True)
    try:
        with torch.no_grad():
            assert_same(compiled(x), m(x))
        with torch.inference_mode():
            xi = torch.randn(3, 8)
            assert_same(compiled(xi), m(xi))
            assert_same(compiled(xi), m(xi))
    finally:
        minicompile.set_logs(recompiles=False)
    assert minicompile.metrics.recompiles == 1
    assert "GLOBAL_STATE changed: inference_mode" in capsys.readouterr().out


def test_the_check_hands_on_the_graphs_inputs(tensor_guards):
    torch.manual_seed(0)
    m = Block()
    x = torch.randn(3, 6)
    cap = capture(m, (x,), {})
    F, args, kwargs = cap_frame_call(m, x)
    inputs = cap.segment.check(F, args, kwargs)
    expected = cap.segment.get_inputs(F, args, kwargs)
    assert len(inputs) == len(expected) == 6
    assert all(a is b for a, b in zip(inputs, expected))
    # another instance of the class: its own parameters
    other = Block()
    got = cap.segment.check(F, (other, x), {})
    assert [id(t) for t in got[1:]] == [id(t) for t in (other.fc.weight, other.fc.bias,
                                                        other.norm.weight, other.norm.bias, other.scale)]


def test_the_guard_log_lists_each_tensor(tensor_guards):
    m = Block()
    src = capture(m, (torch.randn(3, 6),), {}).guard_source
    if tensor_guards:
        assert "TENSORS.check(" in src and "size (5, 6) stride (6, 1) requires_grad=True" in src
    else:
        assert "TENSORS" not in src and ".shape == (5, 6)" in src


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight              # one tensor, two sources

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def test_tied_weights_compile_once(tensor_guards):
    torch.manual_seed(0)
    minicompile.reset()
    minicompile.metrics.reset()
    m = Tied().eval()
    compiled = minicompile.compile(m)
    with torch.no_grad():
        for _ in range(3):
            ids = torch.randint(0, 10, (2, 5))
            assert_same(compiled(ids), m(ids))
    assert minicompile.metrics.graphs == 1


def test_one_tensor_where_the_trace_saw_two(tensor_guards):
    def f(a, b):
        return a * 2 + b
    minicompile.reset()
    compiled = minicompile.compile(f)
    a, b, x = torch.randn(5), torch.randn(5), torch.randn(5)
    for args in ((a, b), (x, x), (a, b), (x, x)):
        assert_same(compiled(*args), f(*args))


# --- a model many modules deep: the fast guard reads a module's attributes from its __dict__
# and reuses its locals (guards._reads_own_dict, guards._name_locals); each change to ONE module
# deep in the tree must still fail it, and it must agree with its slow twin, which reads each
# attribute by getattr, one check at a time, as the guard did before.

class Layer(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.norm(self.fc(x))) + x


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList(nn.Sequential(*[Layer() for _ in range(3)]) for _ in range(4))

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return x


def _deepest(m):
    return m.stages[3][2]


def _set_instance_forward(mod):
    mod.forward = lambda x: x


DEEP_CHANGES = {
    # what changes in the last layer of the last stage: (how, the words the slow twin uses)
    "a module's training flag": (lambda m: _deepest(m).norm.train(not _deepest(m).norm.training),
                                 "_modules['norm'].training =="),
    "a layer's training flag": (lambda m: _deepest(m).train(not _deepest(m).training), "training =="),
    "a forward hook": (lambda m: _deepest(m).fc.register_forward_hook(lambda *a: None), "hooks"),
    "a forward pre-hook": (lambda m: _deepest(m).act.register_forward_pre_hook(lambda *a: None), "hooks"),
    "forward replaced on the instance": (lambda m: _set_instance_forward(_deepest(m).act),
                                         "forward was replaced"),
    "a constant attribute": (lambda m: setattr(_deepest(m).norm, "eps", 1e-3), "eps == 1e-05"),
    "a submodule of another class": (lambda m: setattr(_deepest(m), "act", nn.ReLU()), "type"),
    "a submodule removed": (lambda m: delattr(_deepest(m), "act"), "cannot be read now"),
    "a parameter replaced by another shape": (
        lambda m: setattr(_deepest(m).fc, "bias", nn.Parameter(torch.randn(1))), "size mismatch"),
}


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("change", list(DEEP_CHANGES))
def test_a_change_deep_in_the_model_fails_the_guard(change, training, tensor_guards):
    torch.manual_seed(0)
    m = Deep().train(training)
    x = torch.randn(2, 8)
    cap = capture(m, (x,), {})
    F, args, kwargs = cap_frame_call(m, x)
    assert cap.segment.check(F, args, kwargs) is not None
    assert cap.guard((x,), {}) and cap.guard.fail_reason((x,), {}) is None
    how, words = DEEP_CHANGES[change]
    how(m)
    assert not cap.guard((x,), {})
    assert cap.segment.check(F, args, kwargs) is None
    reason = cap.guard.fail_reason((x,), {})
    assert reason is not None and words in reason, reason
    assert "stages" in reason or "tensor" in reason, reason
    # another instance, unchanged, still passes: modules are guarded by type, not identity
    other = Deep().train(training)
    assert cap.segment.check(F, (other, x), {}) is not None


def test_the_fast_guard_reads_modules_dicts_and_reuses_locals():
    """What makes the guard of a model with many modules cheap: attributes read as items of
    the module's __dict__ (no nn.Module.__getattr__ path), and few locals (none numbered past
    255 but the values the last line reads: here fewer than 256 in all)."""
    m = Deep().eval()
    x = torch.randn(2, 8)
    cap = capture(m, (x,), {})
    code_lines = [line for line in cap.guard_source.splitlines() if not line.lstrip().startswith("#")]
    assert not any(".training" in line or "._forward_hooks" in line for line in code_lines)
    assert sum("['training']" in line for line in code_lines) == sum(1 for _ in m.modules())
    fetched = sum(1 for line in code_lines if line.lstrip().startswith(("v", "t")) and " = " in line)
    assert fetched > 256
    assert cap.segment.check.__code__.co_nlocals < 256
    # the slow twin reads by getattr, as the trace did
    assert ".training" in cap.guard.failure_source


class Scaled(nn.Module):
    factor = 2.0                                      # a class attribute of the same name

    def __init__(self):
        super().__init__()
        self.factor = 3.0
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * self.factor


def test_an_attribute_that_left_the_instance_dict_fails_the_guard():
    """Read from the instance's __dict__, an attribute deleted there fails the guard even where
    the class has one of that name (getattr would find it: the slow twin says what it reads),
    and the call compiles again to eager's result."""
    torch.manual_seed(0)
    minicompile.reset()
    m = Scaled().eval()
    x = torch.randn(3, 4)
    compiled = minicompile.compile(m)
    with torch.no_grad():
        cap = capture(m, (x,), {})
        assert cap.guard((x,), {})
        assert_same(compiled(x), m(x))
        del m.factor                                  # m.factor is now the class's 2.0
        assert not cap.guard((x,), {})
        assert "factor == 3.0" in cap.guard.fail_reason((x,), {})
        assert_same(compiled(x), m(x))


class WithProperty(nn.Module):
    def __init__(self):
        super().__init__()
        self.__dict__["scale"] = 5.0                  # hidden behind the property below
        self.plain = 1.0

    @property
    def scale(self):
        return 2.0


def test_the_guard_reads_by_getattr_what_a_class_puts_in_front_of_the_dict():
    """Only names the instance's __dict__ held, and that no data descriptor of the class
    hides, are read from the dict: elsewhere the dict's item is not what getattr gives."""
    from minicompile.capture.guards import GuardBuilder
    from minicompile.capture.sources import AttrSource, LocalSource
    g = GuardBuilder()
    src = LocalSource("self")
    g.module(src, WithProperty())
    assert g._reads_own_dict(AttrSource(src, "plain"))
    assert g._reads_own_dict(AttrSource(src, "training"))
    assert not g._reads_own_dict(AttrSource(src, "scale"))       # a property: getattr
    assert not g._reads_own_dict(AttrSource(src, "missing"))     # not in the dict: getattr
