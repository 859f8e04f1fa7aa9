"""fusion.draw: the fusion decisions as a picture (one box per kernel, externs apart, bytes).

Drawn with matplotlib's Agg backend (no display); the figure's patches and texts are read back.
Expected kernels are counted independently, from fusion.schedule on a fresh lowering.
"""
import pytest
import torch
import torch.fx

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import minicompile  # noqa: E402
from minicompile import api, fusion  # noqa: E402
from minicompile.lower import lower  # noqa: E402

P = fusion.PASSES


def softmax(x):
    return torch.softmax(x, -1)


def mlp(x, w1, b1, w2):
    return torch.relu(x @ w1 + b1) @ w2


def mlp_inputs():
    return [torch.randn(8, 16), torch.randn(16, 32), torch.randn(32), torch.randn(32, 4)]


@pytest.fixture
def close_figures():
    yield
    plt.close("all")


def boxes(fig):
    """gids of the step boxes, left to right, top to bottom."""
    patches = [p for ax in fig.axes for p in ax.patches if p.get_gid()]
    patches.sort(key=lambda p: (round(p.get_x(), 3), -p.get_y()))
    return [p.get_gid() for p in patches]


def texts(fig, bold=None):
    return [t.get_text() for ax in fig.axes for t in ax.texts
            if bold is None or (t.get_fontweight() == "bold") == bold]


def expected_steps(fn, inputs, passes=None):
    gm = torch.fx.symbolic_trace(fn)
    return fusion.schedule(lower(gm, inputs), passes=passes)


def test_softmax_is_one_kernel_with_its_ops_and_bytes(close_figures):
    x = torch.randn(8, 16)
    fig = fusion.draw(softmax, [x])
    assert isinstance(fig, matplotlib.figure.Figure)
    steps = expected_steps(softmax, [x])
    assert boxes(fig) == [s.name for s in steps] == ["kernel0"]
    words = texts(fig)
    for op in ("max", "exp", "sum", "softmax"):
        assert op in words
    assert "kernel0 (reduction)" in words
    assert "reads 512 B, writes 512 B" in words         # 8 x 16 float32 in, the same out
    # elide-stores kept the max and the sum in registers: only the result is stored
    assert texts(fig, bold=True) == ["softmax"]
    assert any(t.startswith("PASSES\n1 kernel, 1.0 kB moved") for t in words)


def test_softmax_plans_side_by_side(close_figures):
    x = torch.randn(8, 16)
    plans = [P[:4], P[:5], P]
    fig = fusion.draw(softmax, [x], plans)
    expected = [s.name for p in plans for s in expected_steps(softmax, [x], p)]
    assert boxes(fig) == expected == ["kernel0", "kernel1", "kernel2", "kernel0", "kernel0"]
    words = texts(fig)
    assert any(t.startswith("PASSES[:4]\n+ make-kernels\n3 kernels") for t in words)
    assert any(t.startswith("PASSES[:5]\n+ fuse-rows\n1 kernel") for t in words)
    # before elide-stores the max and the sum are written; after, only the result
    assert sorted(texts(fig, bold=True)) == sorted(["max", "sum", "softmax"] * 2 + ["softmax"])
    # three columns, the boxes of one plan in one column
    xs = sorted({round(p.get_x(), 3) for p in fig.axes[0].patches})
    assert len(xs) == 3


def test_mlp_externs_apart_from_the_kernel(close_figures):
    inputs = mlp_inputs()
    steps = expected_steps(mlp, inputs)
    fig = fusion.draw(mlp, inputs)
    names = [s.name if isinstance(s, fusion.Kernel) else f"extern:{s.box.name}" for s in steps]
    assert boxes(fig) == names
    kinds = [g.split(":")[0] for g in boxes(fig)]
    assert kinds == ["extern", "kernel0", "extern"]
    assert sum(isinstance(s, fusion.Kernel) for s in steps) == 1
    words = texts(fig)
    assert words.count("matmul") == 2 and words.count("extern (PyTorch)") == 2
    assert "add" in words and "relu" in words
    # the kernel reads the product (8 x 32) and the bias (32), writes 8 x 32 float32
    assert "reads 1.2 kB, writes 1.0 kB" in words
    assert any("1 kernel + 2 externs, 2.2 kB moved" in t for t in words)
    externs = [p for p in fig.axes[0].patches if p.get_gid().startswith("extern:")]
    kernels = [p for p in fig.axes[0].patches if p.get_gid().startswith("kernel")]
    assert all(p.get_hatch() for p in externs) and not any(p.get_hatch() for p in kernels)


def test_graph_module_into_given_axes_with_named_plans(close_figures):
    inputs = mlp_inputs()
    gm = minicompile.explain(mlp)(*inputs).graphs[0]
    fig, (left, right) = plt.subplots(1, 2)
    out = fusion.draw(gm, inputs, {"vertical": P[:4], "all": P}, ax=right, title="mlp")
    assert out is fig and not left.patches and right.get_title() == "mlp"
    assert len(right.patches) == 6
    assert any(t.startswith("vertical\n") for t in texts(fig))


def test_module_and_no_cache_left_behind(close_figures):
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    for _ in range(2):                       # a second draw captures again
        fig = fusion.draw(net, [torch.randn(8, 16)])
        assert [g.split(":")[0] for g in boxes(fig)] == ["extern", "kernel0", "extern"]
        assert "gelu" in texts(fig)
        assert not api._CACHES


def test_graph_break_is_refused():
    def breaks(x):
        print("side effect")
        return x + 1
    with pytest.raises(minicompile.Unsupported):
        fusion.draw(breaks, [torch.randn(4)])
