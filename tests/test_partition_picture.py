"""picture.draw_partition: the AOT autograd partition as a picture (autograd/partition.py).

Drawn with matplotlib's Agg backend (no display); the figure's markers and lines are read back
and checked against the forward and backward graphs of the partition.
"""
import pytest
import torch
import torch.fx
import torch.nn.functional as F

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minicompile.autograd import partition, trace_joint  # noqa: E402
from minicompile.picture import draw_partition, partition_roles  # noqa: E402


@pytest.fixture
def close_figures():
    yield
    plt.close("all")


def f(x, w):
    return torch.sigmoid(torch.exp(x @ w) * 2 + 1)


def mlp(x, w1, b1, w2, g):
    return F.layer_norm(F.gelu(x @ w1 + b1) @ w2, (4,), g)


def markers(fig):
    """{node name: (role, saved?, (x, y))} of the node markers."""
    out = {}
    for line in fig.axes[0].lines:
        gid = line.get_gid()
        if gid:
            role, name, *saved = gid.split(":")
            out[name] = (role, bool(saved), (line.get_xdata()[0], line.get_ydata()[0]))
    return out


def test_small_function_roles_saved_and_labels(close_figures):
    x, w = torch.randn(8, 5), torch.randn(5, 4, requires_grad=True)
    joint = trace_joint(torch.fx.symbolic_trace(f), [x, w])
    part = partition(joint)
    fig = draw_partition(joint, part, title="f")
    seen = markers(fig)
    nodes = [n.name for n in joint.graph.graph.nodes if n.op != "output"]
    assert list(seen) == nodes                           # every node, in the graph's order
    assert {n for n, (_, s, _) in seen.items() if s} == set(part.saved) == {"primals_1", "mm"}
    assert seen["mm"][0] == "forward" and seen["tangents_1"][0] == "backward"
    assert seen["mm_1"][0] == "backward"                  # w's gradient
    # the backward graph recomputes the exp, the multiply, the add and the sigmoid from the
    # saved product
    for name in ("exp", "mul", "add", "sigmoid"):
        assert seen[name][0] == "recomputed"
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "sigmoid" in texts and "mm" in texts
    assert any(t.startswith("saved: 2, 288 B") for t in fig.axes[0].get_legend().get_texts()
               for t in [t.get_text()])
    assert fig.axes[0].get_title() == "f"


def test_roles_match_the_two_graphs_and_only_saved_values_cross():
    """Every node the backward graph computes is 'recomputed' or 'backward'; every other one is
    'forward'; the only forward nodes the lower lanes read are saved ones."""
    torch.manual_seed(0)
    args = [torch.randn(6, 3), torch.randn(3, 5, requires_grad=True),
            torch.randn(5, requires_grad=True), torch.randn(5, 4, requires_grad=True),
            torch.randn(4, requires_grad=True)]
    joint = trace_joint(torch.fx.symbolic_trace(mlp), args)
    part = partition(joint)
    roles = partition_roles(joint, part)
    in_backward = {n.name for n in part.backward.graph.nodes if n.op == "call_function"}
    for node in joint.graph.graph.nodes:
        if node.op == "output":
            continue
        if node.name in in_backward:
            assert roles[node.name] in ("recomputed", "backward"), node
        elif node.op != "placeholder" or node.name.startswith("primals"):
            assert roles[node.name] == "forward", node
        for m in node.all_input_nodes:
            if roles[m.name] == "forward" and roles[node.name] != "forward":
                assert m.name in part.saved, (m, node)


def test_big_graph_has_no_labels_and_draws_into_given_axes(close_figures):
    torch.manual_seed(0)
    args = [torch.randn(6, 3), torch.randn(3, 5, requires_grad=True),
            torch.randn(5, requires_grad=True), torch.randn(5, 4, requires_grad=True),
            torch.randn(4, requires_grad=True)]
    joint = trace_joint(torch.fx.symbolic_trace(mlp), args)
    fig, ax = plt.subplots()
    out = draw_partition(joint, ax=ax, labels=False)
    assert out is fig and not ax.texts
    assert len(markers(fig)) == sum(n.op != "output" for n in joint.graph.graph.nodes)
