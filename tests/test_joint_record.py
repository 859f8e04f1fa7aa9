"""The joint trace's recorder (minicompile/autograd/record.py), a lean make_fx: on the graphs a
training step makes, the joint graph it records must be make_fx's, op for op (the same aten
ops, in the same order, on the same arguments, with the same values' sizes, strides, dtypes
and devices); what it does not model must go to make_fx (tests/test_training.py trains the
book's models with make_fx refused)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from conftest import DEVICE
from helpers import assert_same, randn
from minicompile.autograd import joint as joint_module
from minicompile.autograd import record, trace_joint


def _signature(gm: torch.fx.GraphModule) -> list:
    """Each node as what it computes: its op or target, its arguments (nodes by position), and
    its value's metadata."""
    index = {n: k for k, n in enumerate(gm.graph.nodes)}

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return ("node", index[a])
        if isinstance(a, (tuple, list)):
            return tuple(arg(v) for v in a)
        if isinstance(a, dict):
            return tuple(sorted((k, arg(v)) for k, v in a.items()))
        return a

    def meta(v):
        if isinstance(v, torch.Tensor):
            return (tuple(v.shape), v.stride(), v.dtype, v.device.type)
        if isinstance(v, (tuple, list)):
            return tuple(meta(x) for x in v)
        return None
    # (placeholders by position: make_fx names a functionalized function's arg0_1...)
    return [(n.op, str(n.target) if n.op == "call_function" else None, arg(n.args), arg(n.kwargs),
             meta(n.meta.get("val"))) for n in gm.graph.nodes]


def _both(gm, args, monkeypatch):
    """gm's joint graph recorded, then traced by make_fx."""
    import torch.fx.experimental.proxy_tensor as proxy_tensor
    make_fx = proxy_tensor.make_fx

    def refused(*a, **k):
        raise AssertionError("make_fx was asked to trace")
    monkeypatch.setattr(proxy_tensor, "make_fx", refused)
    recorded = trace_joint(gm, args)
    monkeypatch.setattr(proxy_tensor, "make_fx", make_fx)

    def not_recorded(*a, **k):
        raise record.NotRecorded("this test's")
    monkeypatch.setattr(record, "record", not_recorded)
    traced = trace_joint(gm, args)
    monkeypatch.undo()
    return recorded, traced


class Block(nn.Module):
    """A little of everything a model's graph has: a matrix product, layer norm, GELU, softmax,
    a mask fill, a concatenation and a split, an in-place ReLU, a reduction, a constant."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 10)
        self.norm = nn.LayerNorm(10)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 10))

    def forward(self, x, mask):
        h = F.gelu(self.norm(self.fc(x)))
        h = h.masked_fill(mask, 0.0) * self.scale
        a, b = torch.split(torch.cat([h, h.flip(-1)], -1), 10, dim=-1)
        p = torch.softmax(a, -1) + torch.relu_(b.clone())
        return p.sum(-1) * torch.tensor(2.0, device=p.device), p.amax(-1)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).mean((2, 3))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.qkv = nn.Linear(8, 24)

    def forward(self, ids):
        q, k, v = self.qkv(self.embed(ids)).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.cross_entropy(out.transpose(1, 2).flatten(2).flatten(0, 1), ids.flatten() % 8)


def _cases():
    torch.manual_seed(0)
    x = randn(5, 6)
    mask = torch.rand(5, 10, device=DEVICE) > 0.7
    yield Block(), [x, mask]
    yield ConvBN(), [randn(2, 3, 7, 9)]
    yield Attention(), [torch.randint(0, 11, (2, 5), device=DEVICE)]
    yield nn.Sequential(nn.Linear(6, 7), nn.Dropout(0.3), nn.Tanh()), [randn(5, 6, layout="transposed")]


def _captured(module, args) -> tuple:
    """The graph and inputs minicompile's compile_training is handed for module's training
    step (its parameters are inputs that need gradients)."""
    import minicompile.graph_compiler as graph_compiler
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        compile_training = graph_compiler.compile_training

        def keep(gm, example_inputs, *rest, **kwargs):
            seen.append((gm, list(example_inputs)))
            return compile_training(gm, example_inputs, *rest, **kwargs)
        patch.setattr(graph_compiler, "compile_training", keep)
        minicompile.compile(module)(*args)
    assert len(seen) == 1
    return seen[0]


def _fakes(primal_shapes, tangent_shapes) -> tuple:
    """(primals, tangents): fake tensors of one mode, the primals of fresh random values."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    primals = [mode.from_tensor(randn(*shape)) for shape in primal_shapes]
    with mode:
        tangents = [torch.empty(*shape, device=DEVICE) for shape in tangent_shapes]
    return primals, tangents


@pytest.mark.parametrize("case", range(4), ids=["block", "conv_bn", "attention", "dropout"])
def test_the_recorded_joint_graph_is_make_fx_s(case, monkeypatch):
    module, args = list(_cases())[case]
    gm, inputs = _captured(module.to(DEVICE).train(), args)
    recorded, traced = _both(gm, inputs, monkeypatch)
    assert _signature(recorded.graph) == _signature(traced.graph)
    assert recorded.grad_inputs == traced.grad_inputs and recorded.reached_by == traced.reached_by
    assert recorded.grad_inputs            # (gradients of the parameters, at least)


def test_a_recorded_graph_is_called_as_make_fx_s():
    """gm(primals, tangents) -> the list the function returned, as make_fx's graph module is
    called (a second trace, through functionalization, calls it so)."""
    primals, tangents = _fakes([(3, 4), (4,)], [(3, 4)])

    def fn(primals, tangents):
        x, b = (p.detach().requires_grad_() for p in primals)
        y = torch.tanh(x + b)
        gx, gb = torch.autograd.grad([y], [x, b], tangents)
        return [y.detach(), gx, gb]
    gm = record.record(fn, primals, tangents, joint_module.decompositions(), joint_module.graph_module)
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["primals_1", "primals_2", "tangents_1"]
    x, b, t = randn(3, 4), randn(4), randn(3, 4)
    y, gx, gb = gm([x, b], [t])
    assert_same(y, torch.tanh(x + b))
    assert_same(gx, t * (1 - y * y))
    assert_same(gb, (t * (1 - y * y)).sum(0))


def test_what_the_recorder_does_not_model_goes_to_make_fx():
    """An op that gives a tensor other memory (resize_): NotRecorded, and trace_joint's graph
    is make_fx's."""
    def f(x, w):
        y = x @ w
        scratch = torch.empty(0, device=y.device)
        scratch.resize_(y.shape)
        return y.sin() * scratch.copy_(y.detach())
    primals, tangents = _fakes([(3, 4), (4, 5)], [(3, 5)])

    def fn(primals, tangents):
        x, w = (p.detach().requires_grad_() for p in primals)
        return list(torch.autograd.grad([f(x, w)], [x, w], tangents))
    with pytest.raises(record.NotRecorded, match="other memory"):
        record.record(fn, primals, tangents, joint_module.decompositions(), joint_module.graph_module)
    x, w = randn(3, 4).requires_grad_(), randn(4, 5).requires_grad_()
    joint = trace_joint(torch.fx.symbolic_trace(f), [x, w])      # (by make_fx)
    assert joint.grad_inputs == [0, 1]


def test_a_size_changed_in_place_is_recorded_as_make_fx_records_it(monkeypatch):
    """An op that changes a tensor's sizes in place (a GRU's transpose_, Swin's as_strided_):
    the values recorded before it keep their sizes, as make_fx's do."""
    def f(x, w):
        y = x @ w
        y.t_()
        return y.sin(), y.amax(0)
    x, w = randn(3, 4).requires_grad_(), randn(4, 5).requires_grad_()
    recorded, traced = _both(torch.fx.symbolic_trace(f), [x, w], monkeypatch)
    assert _signature(recorded.graph) == _signature(traced.graph)


@pytest.mark.parametrize("case", range(4), ids=["block", "conv_bn", "attention", "dropout"])
def test_results_made_from_the_layouts_seen_before_are_the_fake_mode_s(case, monkeypatch):
    """An op seen before with arguments of the same layouts has its results made from what the
    fake tensors' mode answered then (record._MADE), views of the same memory where they are
    views: the joint graph recorded with that memo empty, full, and not used is one graph."""
    module, args = list(_cases())[case]
    gm, inputs = _captured(module.to(DEVICE).train(), args)
    monkeypatch.setattr(record, "_MADE", {})
    empty = trace_joint(gm, inputs)
    assert record._MADE
    full = trace_joint(gm, inputs)
    monkeypatch.setattr(record, "_kind", lambda func: None)
    unused = trace_joint(gm, inputs)
    assert _signature(empty.graph) == _signature(full.graph) == _signature(unused.graph)


def test_the_memo_of_results_stays_bounded(monkeypatch):
    """A process that traces ever new sizes does not grow record._MADE without end: past its
    bound it starts again, and the graph is the same."""
    module, args = list(_cases())[0]
    gm, inputs = _captured(module.to(DEVICE).train(), args)
    monkeypatch.setattr(record, "_MADE", {})
    unbounded = trace_joint(gm, inputs)
    monkeypatch.setattr(record, "_MADE", {})
    monkeypatch.setattr(record, "_MADE_AT_MOST", 5)
    bounded = trace_joint(gm, inputs)
    assert 0 < len(record._MADE) <= 5
    assert _signature(bounded.graph) == _signature(unbounded.graph)
