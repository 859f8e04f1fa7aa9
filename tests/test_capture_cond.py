"""torch.cond: a data-dependent branch captured as ONE graph with both branches as subgraphs.

Each function is compared with eager on fresh inputs that take both branches, and with
torch._dynamo.explain (graph count, break count, ops per graph); the graph itself is checked
to hold a `torch.ops.higher_order.cond` node over two GraphModule attributes, and to run under
torch.fx.Interpreter.
"""
import os
import sys

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import minicompile  # noqa: E402
from minicompile.capture import Unsupported, capture  # noqa: E402
from test_capture_control import assert_same, compare  # noqa: E402

W = torch.randn(4, 5)


def r(*shape):
    return torch.randn(*shape)


def pos():
    return (r(4, 5).abs() + 0.1, r(4, 5))


def neg():
    return (-r(4, 5).abs() - 0.1, r(4, 5))


def data_dependent(x, y):
    def true_fn(x, y):
        return x.sin() + y

    def false_fn(x, y):
        return x.cos() - y
    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y)) * 2


def with_lambdas_and_tuple(x, y):
    a, b = torch.cond(x.mean() > 0, lambda x, y: (x + y, x * y), lambda x, y: (x - y, x / (y.abs() + 1)),
                      (x, y))
    return a.relu() + b


def closure_and_global(x, y):
    scale = y.exp()

    def true_fn(x):
        return x * scale + W          # a closure tensor and a global tensor: lifted

    def false_fn(x):
        return x - scale
    return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


def nested(x, y):
    def inner_true(x, y):
        return x + y

    def inner_false(x, y):
        return x - y

    def true_fn(x, y):
        return torch.cond(y.sum() > 0, inner_true, inner_false, (x, y)) * 3

    def false_fn(x, y):
        return x.neg()
    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y)) + 1


def constant_pred(x, y):
    # a Python predicate: Dynamo specializes on it (one branch inlined, no cond node)
    return torch.cond(x.shape[0] > 2, lambda x: x + 1, lambda x: x - 1, (x,))


def predicate_kwargs(x, y):
    return torch.cond(pred=(x * y).sum() < 0, true_fn=lambda a: a.tanh(),
                      false_fn=lambda a: a.sigmoid(), operands=(x,))


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(5, 5)
        self.down = nn.Linear(5, 5)

    def forward(self, x, y):
        # module parameters read inside the branches are lifted as operands
        h = torch.cond(x.sum() > 0, lambda t: self.up(t).relu(), lambda t: self.down(t), (x,))
        return h + y


CASES = [data_dependent, with_lambdas_and_tuple, closure_and_global, nested, constant_pred,
         predicate_kwargs]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("make", [pos, neg], ids=["positive", "negative"])
def test_cond_matches_eager_and_dynamo(fn, make):
    ours = compare(fn, make)
    assert (ours.graph_count, ours.graph_break_count) == (1, 0)
    # both ways, one compiled function: the same graph serves both signs
    compiled = minicompile.compile(fn, backend="eager")
    for m in (pos, neg, pos):
        args = m()
        assert_same(fn(*args), compiled(*args))


def test_module_with_cond():
    torch.manual_seed(0)
    m = Gate()
    ours = compare(m, pos)
    assert ours.graph_count == 1
    compiled = minicompile.compile(m, backend="eager")
    for make in (pos, neg):
        args = make()
        assert_same(m(*args), compiled(*args))


def _cond_nodes(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]


def test_graph_holds_both_branches_as_subgraphs():
    x, y = pos()
    cap = capture(data_dependent, (x, y), {})
    (node,) = _cond_nodes(cap.gm)
    pred, t, f, operands = node.args
    assert (t.op, f.op) == ("get_attr", "get_attr")
    tg, fg = getattr(cap.gm, t.target), getattr(cap.gm, f.target)
    assert isinstance(tg, torch.fx.GraphModule) and isinstance(fg, torch.fx.GraphModule)
    assert {n.target for n in tg.graph.nodes if n.op == "call_method"} == {"sin"}
    assert {n.target for n in fg.graph.nodes if n.op == "call_method"} == {"cos"}
    assert len(operands) == 2
    # the graph runs under torch.fx.Interpreter, either way
    for args in (pos(), neg()):
        (out,) = torch.fx.Interpreter(cap.gm).run(*cap.get_inputs(args, {}))
        assert_same(data_dependent(*args), out)


def test_free_variables_are_lifted_into_both_branches():
    cap = capture(closure_and_global, pos(), {})
    (node,) = _cond_nodes(cap.gm)
    operands = node.args[3]
    assert len(operands) == 3          # x, then the closure tensor `scale` and the global W
    for attr in node.args[1:3]:
        sub = getattr(cap.gm, attr.target)
        assert len([n for n in sub.graph.nodes if n.op == "placeholder"]) == 3
    for args in (pos(), neg()):
        (out,) = torch.fx.Interpreter(cap.gm).run(*cap.get_inputs(args, {}))
        assert_same(closure_and_global(*args), out)


def test_nested_cond_is_a_subgraph_of_a_subgraph():
    cap = capture(nested, pos(), {})
    (outer,) = _cond_nodes(cap.gm)
    true_gm = getattr(cap.gm, outer.args[1].target)
    assert len(_cond_nodes(true_gm)) == 1
    for sx in (1, -1):
        for sy in (1, -1):
            x, y = sx * (r(4, 5).abs() + 0.1), sy * (r(4, 5).abs() + 0.1)
            (out,) = torch.fx.Interpreter(cap.gm).run(*cap.get_inputs((x, y), {}))
            assert_same(nested(x, y), out)


def test_constant_predicate_is_specialized():
    cap = capture(constant_pred, pos(), {})
    assert not _cond_nodes(cap.gm)


def test_branches_must_agree():
    def bad(x):
        return torch.cond(x.sum() > 0, lambda t: t, lambda t: t.sum(), (x,))
    with pytest.raises(Unsupported, match="different structures, shapes or dtypes"):
        capture(bad, (r(3, 3),), {})


def test_branch_side_effect_is_refused():
    def bad(x):
        seen = []

        def true_fn(t):
            seen.append(t)
            return t + 1
        return torch.cond(x.sum() > 0, true_fn, lambda t: t - 1, (x,)), len(seen)
    with pytest.raises(Unsupported, match="mutates Python state"):
        capture(bad, (r(3, 3),), {})


def test_data_dependent_if_breaks_but_cond_does_not():
    def with_if(x, y):
        if x.sum() > 0:
            return x.sin() + y
        return x.cos() - y
    ours_if = minicompile.explain(with_if)(*pos())
    ours_cond = minicompile.explain(data_dependent)(*pos())
    assert ours_if.graph_break_count >= 1 and ours_cond.graph_break_count == 0
