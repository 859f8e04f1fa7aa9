"""Compiled training (minicompile/autograd/): several SGD steps of the book's models compiled
and eager, side by side from the same weights, on fresh random inputs of awkward sizes. After
every step the losses, the gradients, the updated parameters and batch norm's running
statistics must be eager's, and the backward must be generated code (its kernels counted).
Tiny Hugging Face models are trained one step in tests/test_hf_zoo.py."""
import copy
import math
import operator
import warnings
import weakref
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from conftest import DEVICE
from helpers import assert_same, randn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import models  # noqa: E402


@pytest.fixture
def compiled_training(monkeypatch):
    """The list of what graph_compiler's compile_training made during the test (each graph's
    partition and its compiled forward and backward), newest last."""
    import minicompile.graph_compiler as graph_compiler
    made, compile_training = [], graph_compiler.compile_training

    def keep(*args, **kwargs):
        made.append(compile_training(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(graph_compiler, "compile_training", keep)
    return made


class ConvBN(nn.Module):
    """A torchvision-style stem: convolution, BatchNorm2d, ReLU(inplace=True), a residual add_."""

    def __init__(self, channels=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels, 3)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(x))
        y += x                                  # torchvision's BasicBlock: out += identity
        y = self.relu(y)
        return self.fc(y.mean((2, 3)))


def _model(name):
    torch.manual_seed(0)
    if name == "mlp":
        return models.MLP(width=37, depth=2), lambda: randn(13, 37)
    if name == "cnn":
        return models.SmallCNN(channels=4, classes=5), lambda: randn(3, 3, 9, 9)
    if name == "conv_bn_inplace":
        return ConvBN(), lambda: randn(2, 3, 7, 9)
    if name == "gpt_block":
        return models.Block(dim=32, heads=4), lambda: randn(2, 7, 32)
    raise ValueError(name)


def train_side_by_side(model, make_input, steps=3, lr=0.1):
    """SGD steps of the model compiled and of its eager twin, compared after each."""
    model = model.to(DEVICE).train()
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=lr)
    for step in range(steps):
        x = make_input()
        loss = compiled(x).square().mean()
        loss.backward()
        expected = twin(x).square().mean()
        expected.backward()
        assert_same(loss, expected)
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"step {step}: {name}")
        opt.step(), opt_twin.step()
        opt.zero_grad(), opt_twin.zero_grad()
        for (name, p), q in zip(model.state_dict().items(), twin.state_dict().values()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"step {step}: {name}")


@pytest.mark.parametrize("name", ["mlp", "cnn", "conv_bn_inplace", "gpt_block"])
def test_sgd_steps_match_eager(kernel_backend, name):
    model, make_input = _model(name)
    train_side_by_side(model, make_input)
    assert minicompile.metrics.graphs == 1 and minicompile.metrics.graph_breaks == 0
    assert minicompile.metrics.recompiles == 0
    # the backward is generated code: its kernels are counted (not a fallback to PyTorch's)
    assert minicompile.metrics.backward_kernels > 0


@pytest.mark.parametrize("name", ["mlp", "cnn", "conv_bn_inplace", "gpt_block"])
def test_the_book_models_train_without_make_fx(name, monkeypatch):
    """Every joint graph of the book's models is recorded by autograd/record.py (make_fx, which
    traces what it does not model, refuses here): eager's losses, gradients and parameters."""
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    def refused(*args, **kwargs):
        raise AssertionError("make_fx was asked to trace a joint graph")
    monkeypatch.setattr(proxy_tensor, "make_fx", refused)
    model, make_input = _model(name)
    train_side_by_side(model, make_input, steps=2)
    assert minicompile.metrics.backward_kernels > 0


def test_batch_norm_training_makes_no_graph_break():
    model, make_input = _model("conv_bn_inplace")
    out = minicompile.explain(model.to(DEVICE).train())(make_input())
    assert out.graph_count == 1 and out.graph_break_count == 0


def test_compiled_halves_return_their_outputs_without_pytree(compiled_training):
    """A training step's forward returns its outputs and what it saves (a ResNet-50's some 270
    tensors), its backward the gradients: each as a list built in the wrapper (an FX graph's
    output list is an immutable_list, rebuilt by pytree leaf by leaf on every call otherwise)."""
    model, make_input = _model("conv_bn_inplace")
    model = model.to(DEVICE).train()
    minicompile.compile(model)(make_input()).sum().backward()
    for half in (compiled_training[-1].forward, compiled_training[-1].backward):
        assert "tree_unflatten" not in half.wrapper_source, half.wrapper_source.splitlines()[-1]



def test_running_statistics_are_written_in_place_beside_split_statistics(kernel_backend, compiled_training):
    """A batch norm over few channels and many rows (a ResNet's first layers on a GPU): its
    statistics are split reductions, and the kernel that combines the pieces walks them twice
    (the mean first, then the squared deviations about it). The running mean and variance it
    updates are read once per channel, not along the walked rows: the new values are written
    over the old ones, not into new memory copied back after the graph (a copy of every
    running statistic on every step)."""
    if kernel_backend == "cpp":
        pytest.skip("C++ runs a long reduction's loop in parallel itself: no split")
    torch.manual_seed(0)
    model = nn.BatchNorm2d(8).to(DEVICE).train()
    x = (randn(16, 8, 128, 128) * 2 + 3).to(memory_format=torch.channels_last)
    twin, exact = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = minicompile.compile(model)
    for _ in range(2):
        out = compiled(x)
        out.square().mean().backward()
        expected = twin(x)
        expected.square().mean().backward()
        exact(x.double())
        assert_same(out, expected)
    # (the variance of 2M values: ours as near the float64 one as eager's)
    for name in ("running_mean", "running_var"):
        ours, eager, truth = getattr(model, name), getattr(twin, name), getattr(exact, name)
        assert (ours.double() - truth).abs().max() <= 2 * (eager.double() - truth).abs().max() + 1e-6, name
    assert model.num_batches_tracked == twin.num_batches_tracked == 2
    source = compiled_training[-1].forward.wrapper_source
    in_place = [line for line in source.splitlines() if "# in place:" in line]
    assert len(in_place) == 3, source        # the count of batches, the running mean and variance


def test_gradients_of_inputs_noncontiguous_and_broadcast(kernel_backend):
    """Gradients flow to inputs that require grad (not only parameters): a transposed one and
    one that broadcasts; an input that needs no gradient gets none."""
    def f(x, b, w):
        h = torch.tanh(x @ w + b)
        return (h * torch.sigmoid(h)).mean()

    def leaves():
        torch.manual_seed(3)
        return (randn(19, 7, layout="transposed").requires_grad_(), randn(11).requires_grad_(),
                randn(7, 11))
    ours, theirs = leaves(), leaves()
    minicompile.compile(f)(*ours).backward()
    f(*theirs).backward()
    for a, b in zip(ours[:2], theirs[:2]):
        assert_same(a.grad, b.grad)
    assert ours[2].grad is None
    assert minicompile.metrics.backward_kernels > 0


def test_writes_in_place_in_training(kernel_backend):
    """add_ and relu_ on values autograd needs, and on a buffer that needs no gradient."""
    def f(x, w, counter):
        y = x @ w
        y.add_(1.5)
        z = torch.relu_(y * 2)
        counter.add_(1)
        return z.sum() + y.square().mean()

    def leaves():
        torch.manual_seed(4)
        return randn(5, 6), randn(6, 3).requires_grad_(), torch.zeros((), device=DEVICE)
    ours, theirs = leaves(), leaves()
    compiled = minicompile.compile(f)
    for _ in range(2):
        assert_same(compiled(*ours), f(*theirs))
    compiled(*ours).backward()
    f(*theirs).backward()
    assert_same(ours[1].grad, theirs[1].grad)
    assert ours[2].item() == theirs[2].item() == 3


def test_cross_entropy_and_embedding_training(kernel_backend):
    """An embedding (its backward accumulates rows), layer norm, cross-entropy."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Embedding(23, 12), nn.LayerNorm(12), nn.Linear(12, 23)).to(DEVICE)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 23, (3, 9), device=DEVICE)
    ids[0, :4] = 5                                # repeated ids: gradients accumulate

    def loss(m):
        return F.cross_entropy(m(ids).flatten(0, 1), ids.flatten())
    loss(minicompile.compile(model)).backward()
    loss(twin).backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert_same(p.grad, q.grad)


def test_an_embedding_with_max_norm_renormalizes_its_rows_as_eager(kernel_backend):
    """F.embedding(max_norm=...) rescales the rows it reads in place, through weight.detach():
    a write autograd does not see, into a leaf that requires grad."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Embedding(10, 4, max_norm=0.5), nn.Linear(4, 3)).to(DEVICE)
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(model)
    for ids in ([0, 3, 7, 3], [1, 3, 9, 2, 2]):
        ids = torch.tensor(ids, device=DEVICE)
        got, want = compiled(ids), twin(ids)
        assert_same(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            assert_same(p, q)
            assert_same(p.grad, q.grad)


def _power_iteration_step(w0, u, v):
    """The old nn.utils.spectral_norm's step: v written under no_grad from a view of the
    weight, the same view then used with grad."""
    w = w0.reshape(6, -1)
    with torch.no_grad():
        torch.mv(w.t(), u, out=v)
    return w0 / torch.dot(u, torch.mv(w, v))


def test_a_view_used_under_no_grad_and_after_it_carries_its_gradient_after(kernel_backend):
    w0, u0, v0 = (torch.randn(*s, dtype=torch.float64, device=DEVICE) for s in ((6, 6), (6,), (6,)))
    grads = []
    for fn in (_power_iteration_step, minicompile.compile(_power_iteration_step)):
        w, v = w0.clone().requires_grad_(), v0.clone()
        fn(w, u0, v).pow(2).sum().backward()
        grads.append((w.grad, v))
    assert_same(grads[1][0], grads[0][0], dtype=torch.float64)
    assert_same(grads[1][1], grads[0][1], dtype=torch.float64)


def test_forward_mode_dual_tensors_get_eagers_tangents():
    """A graph carries no tangents: under a dual level the function runs as eager."""
    import torch.autograd.forward_ad as fwAD
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh()).to(DEVICE)
    x, v = torch.randn(5, 4, device=DEVICE), torch.randn(5, 4, device=DEVICE)
    compiled = minicompile.compile(model)
    compiled(x)
    tangents = []
    for fn in (model, compiled):
        with fwAD.dual_level():
            tangents.append(fwAD.unpack_dual(fn(fwAD.make_dual(x, v))).tangent)
    assert tangents[1] is not None
    assert_same(tangents[1], tangents[0])


def test_is_leaf_of_an_input_is_guarded():
    def f(x):
        return x + 100 if x.is_leaf else x - 1
    compiled = minicompile.compile(f)
    w = torch.zeros(3, requires_grad=True, device=DEVICE)
    assert_same(compiled(w * 1), w - 1)
    assert_same(compiled(torch.zeros(3, requires_grad=True, device=DEVICE)), w + 100)


def test_multilabel_margin_loss_ignores_the_targets_after_the_first_minus_one():
    """PyTorch's decomposition of it counts them (torch 2.13): its own kernel is used."""
    def loss(x, y):
        return F.multilabel_margin_loss(x, y, reduction="sum")
    y = torch.tensor([[3, 0, -1, 1, 2], [1, -1, 0, 0, 0], [0, 1, 2, 3, 4]], device=DEVICE)
    x = torch.randn(3, 5, device=DEVICE, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    got, want = minicompile.compile(loss)(x, y), loss(x2, y)
    assert_same(got, want)
    got.backward()
    want.backward()
    assert_same(x.grad, x2.grad)


class _Recurrent(nn.Module):
    """An embedding (its output needs no gradient) into a recurrent layer; the output and the
    last hidden state both reach the loss."""

    def __init__(self, layer):
        super().__init__()
        self.embed, self.layer = nn.Embedding(19, 8), layer

    def forward(self, tokens):
        out, hidden = self.layer(self.embed(tokens))
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return torch.cat([out.flatten(), hidden.flatten()])


class _Packed(nn.Module):
    """An LSTM over padded sequences of other lengths, packed and padded again."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)

    def forward(self, x):
        lengths = (x[:, :, 0] > -1.5).sum(1).clamp(min=1).cpu()       # per call: its own lengths
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, _) = self.lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return torch.cat([padded.flatten(), h.flatten()])


def test_packed_sequences_through_a_recurrent_layer():
    """The packed data's rows are the sum of the lengths (a break, as in Dynamo); a
    PackedSequence goes to torch's functions as one, not as a plain tuple."""
    torch.manual_seed(7)
    train_side_by_side(_Packed(), lambda: torch.randn(3, 7, 4, device=DEVICE))
    model = _Packed().to(DEVICE).eval()
    compiled = minicompile.compile(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 7, 4, device=DEVICE)
            assert_same(compiled(x), model(x))


def test_old_weight_norm_recomputes_its_weight_each_call():
    """nn.utils.weight_norm's pre-hook sets `weight` on each call; the graph reads the old one
    (a tensor an earlier call computed) but no gradient flows to it: handed over detached, the
    backward does not reach the earlier call's graph."""
    models = []
    for _ in range(2):                          # (such a module cannot be deep-copied)
        torch.manual_seed(8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)      # (deprecated for parametrizations)
            models.append(nn.Sequential(nn.utils.weight_norm(nn.Linear(6, 4)), nn.Tanh()).to(DEVICE))
    model, twin = models
    compiled = minicompile.compile(model)
    for step in range(3):
        x = torch.randn(2, 6, device=DEVICE)
        compiled(x).sum().backward()
        twin(x).sum().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=f"step {step}")
        with torch.no_grad():
            for m in models:
                m[0].weight_g.mul_(1.5)
                m.zero_grad()


@pytest.mark.parametrize("layer", [
    lambda: nn.LSTM(8, 6, batch_first=True),
    lambda: nn.LSTM(8, 6, num_layers=2, bidirectional=True),
    lambda: nn.GRU(8, 6, batch_first=True, bidirectional=True),
    lambda: nn.RNN(8, 6, nonlinearity="relu")], ids=["lstm", "lstm_2_layers_both_ways", "gru", "rnn"])
def test_recurrent_layers_train_as_eager(kernel_backend, layer):
    """On a CPU, PyTorch's LSTM decomposition picks oneDNN's kernel when the input needs no
    gradient, whose backward reads a workspace that kernel keeps only under grad mode (which the
    compiled forward is not): the joint graph traces the cells' ops instead, and the backward is
    generated kernels. (On a GPU the graph keeps cuDNN's recurrent op and its backward.)"""
    torch.manual_seed(6)
    train_side_by_side(_Recurrent(layer()), lambda: torch.randint(0, 19, (3, 5), device=DEVICE))
    assert minicompile.metrics.graph_breaks == 0
    assert minicompile.metrics.backward_kernels > 0 or DEVICE == "cuda"


def test_aot_graphs_log(capsys):
    minicompile.set_logs(aot_graphs=True)
    try:
        model, make_input = _model("mlp")
        minicompile.compile(model.to(DEVICE))(make_input()).sum().backward()
    finally:
        minicompile.set_logs(aot_graphs=False)
    out = capsys.readouterr().out
    assert "Forward graph" in out and "Backward graph" in out
    assert "Saved for backward:" in out and "bytes" in out


def test_the_partitions_minimum_cut_is_the_one_nearest_the_sink():
    """source_side (Dinic's max-flow, part by part) on small random networks, against every
    cut: its cut is a minimum, and of the minimum cuts the one whose source side is largest
    (the backward recomputes least), as networkx's minimum_cut gave."""
    import itertools
    import math
    import random
    from minicompile.autograd.partition import source_side
    rng = random.Random(0)
    for _ in range(300):
        vertices = [f"v{i}" for i in range(rng.randint(1, 7))]
        ends = vertices + ["source", "sink"]
        capacity = {}
        for _ in range(rng.randint(1, 20)):
            u, v = rng.choice(ends[:-1] if rng.random() < 0.8 else ["source"]), rng.choice(vertices + ["sink"])
            if u != v:
                capacity[u, v] = rng.choice([math.inf, rng.randint(1, 9)])
        vertices = sorted({v for edge in capacity for v in edge} - {"source", "sink"})

        def cut(side):
            return sum(c for (u, v), c in capacity.items() if u in side and v not in side)
        sides = [{"source", *chosen} for r in range(len(vertices) + 1)
                 for chosen in itertools.combinations(vertices, r)]
        best = min(cut(side) for side in sides)
        if best == math.inf:
            with pytest.raises(AssertionError, match="unbounded"):
                source_side(capacity, "source", "sink")
            continue
        side = source_side(capacity, "source", "sink") | {"source"}
        assert cut(side) == best
        assert side & set(vertices) == set().union(*(s for s in sides if cut(s) == best)) & set(vertices)


def test_partition_saves_one_value_and_recomputes_the_pointwise_chain():
    """sigmoid(exp(x @ w) * 2 + 1): the backward needs exp's result (the derivative of exp) and
    x (for w's gradient); the min-cut saves two values, x and the product x @ w (as many bytes as
    exp's result, and computed by the forward anyway), and recomputes the exp, the multiply, the
    add and the sigmoid in the backward, rather than saving each."""
    from minicompile.autograd import partition, trace_joint

    def f(x, w):
        return torch.sigmoid(torch.exp(x @ w) * 2 + 1)
    x, w = randn(8, 5), randn(5, 4).requires_grad_()
    part = partition(trace_joint(torch.fx.symbolic_trace(f), [x, w]))
    assert len(part.saved) == 2 and part.saved_bytes == (8 * 4 + 8 * 5) * 4, part.saved


def sin_weighted_sum(a):
    return (a * a.sin()).sum()


def test_an_input_with_room_between_its_items_saved_for_the_backward(kernel_backend):
    """A slice of a leaf (x[:, 1:3] of 4 channels) is saved as it is; at symbolic sizes the
    backward reads saved values dense, so it is handed a dense copy of one that is not (it
    read the slice's memory as if dense: wrong gradients from the second size on)."""
    compiled = minicompile.compile(sin_weighted_sum)
    for n in (7, 9, 13):
        base = randn(2, 4, n).requires_grad_()
        base2 = base.detach().clone().requires_grad_()
        compiled(base[:, 1:3]).backward()
        sin_weighted_sum(base2[:, 1:3]).backward()
        assert_same(base.grad, base2.grad)
    assert minicompile.metrics.graphs == 2


def test_partition_recomputes_positions_made_from_no_input():
    """Relative positions made with arange (torchvision's MViT, on the CPU beside CUDA tensors)
    and used to index a parameter: the joint trace makes them a constant, which the backward
    reads itself rather than be handed it, so lowering can put it on the device that reads it."""
    from minicompile.autograd import partition, trace_joint

    def f(q, table):
        dist = torch.arange(6)[:, None] - torch.arange(6)[None, :] + 5
        return (q @ table[dist].sum(1).T).sum()
    q, table = randn(4, 3), randn(11, 3).requires_grad_()
    part = partition(trace_joint(torch.fx.symbolic_trace(f), [q, table]))
    assert part.saved == ["primals_1"], part.saved
    assert any(n.op == "get_attr" for n in part.backward.graph.nodes)


def test_backward_computes_a_recomputed_value_right_before_it_is_read():
    """Six layers of a @ w then sigmoid(a) * a: each layer's backward needs sigmoid(a), which
    the partition recomputes from the saved a. Recomputed where the joint graph has it (its
    forward part), every layer's sigmoid would be computed at the top of the backward and
    held until the backward reaches its layer; each is computed right before its first reader,
    after the gradient work of the layers above it."""
    from minicompile.autograd import partition, trace_joint

    def f(x, w0, w1, w2, w3, w4, w5):
        for w in (w0, w1, w2, w3, w4, w5):
            a = x @ w
            x = torch.sigmoid(a) * a
        return x
    ws = [randn(7, 7).requires_grad_() for _ in range(6)]
    part = partition(trace_joint(torch.fx.symbolic_trace(f), [randn(5, 7)] + ws))
    nodes = list(part.backward.graph.nodes)
    gradient_work = set(n for n in nodes if n.name.startswith("tangents"))
    for n in nodes:
        if n.op == "call_function" and any(a in gradient_work for a in n.all_input_nodes):
            gradient_work.add(n)
    recomputed = [n for n in nodes if n.op == "call_function" and n not in gradient_work]
    assert sum(n.target is torch.ops.aten.sigmoid.default for n in recomputed) == 6
    for n in recomputed:
        first_reader = min(nodes.index(u) for u in n.users)
        assert not gradient_work & set(nodes[nodes.index(n) + 1:first_reader]), (n, part.backward.code)


def test_backward_does_not_recompute_the_residual_stream_from_the_first_layer(kernel_backend, compiled_training):
    """Four pre-norm transformer layers: the residual stream (each layer's sums) could be
    recomputed from the saved outputs of the projections, but only from the first layer up,
    so the backward's first layer would make every layer's sum and hold each until the
    backward reached its layer: as much memory as saving them. The partition saves them
    instead: no value the backward computes again for another is held across its matrix
    products. Gradients are eager's."""
    partition_module = sys.modules["minicompile.autograd.partition"]
    made = compiled_training
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
                            for _ in range(4)]).to(DEVICE).train()
    twin = copy.deepcopy(model)
    x = randn(2, 7, 32)
    minicompile.compile(model)(x).square().mean().backward()
    twin(x).square().mean().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    nodes = list(made[-1].partition.backward.graph.nodes)
    gradient_work = set(n for n in nodes if n.name.startswith("tangents"))
    for n in nodes:
        if n.op == "call_function" and any(a in gradient_work for a in n.all_input_nodes):
            gradient_work.add(n)
    assert partition_module._held_across_externs(nodes, gradient_work) == set()


def test_partition_saves_an_input_rather_than_a_view_of_it(kernel_backend):
    """x @ w: w's gradient needs x, read in the backward as x.t(). Saving x and saving x.t()
    cost the same bytes, but a saved view is a forward output, written as a copy by an extra
    kernel; the input is handed on as it is. So the input is saved, and the forward is one
    kernel (exp, then the sigmoid chain), with gradients equal to eager's."""
    from minicompile.autograd import partition, trace_joint

    def f(x, w):
        return torch.sigmoid(torch.exp(x @ w) * 2 + 1)
    x, w = randn(9, 5), randn(5, 3).requires_grad_()
    part = partition(trace_joint(torch.fx.symbolic_trace(f), [x, w]))
    assert ("primal", 0) in part.saved_from and len(part.saved) == 2, part.saved
    minicompile.metrics.reset()
    compiled = minicompile.compile(f)
    for _ in range(2):
        x, w = randn(9, 5), randn(5, 3).requires_grad_()
        w_twin = w.detach().clone().requires_grad_()
        out = compiled(x, w)
        out.backward(torch.ones_like(out))
        expected = f(x, w_twin)
        expected.backward(torch.ones_like(expected))
        assert_same(out, expected)
        torch.testing.assert_close(w.grad, w_twin.grad, rtol=1e-4, atol=1e-5)
    assert minicompile.metrics.kernels - minicompile.metrics.backward_kernels == 1


def test_a_gradient_penalty_differentiates_the_gradient_as_eager(kernel_backend):
    """A gradient penalty (WGAN-GP's): the gradient of x, taken with create_graph=True, then
    differentiated. The compiled backward has no backward of its own: a differentiable backward
    runs the graph again with PyTorch's autograd, whose gradients are eager's, second-order
    terms and all (it raised before, as torch.compile does)."""
    torch.manual_seed(6)
    lin = nn.Linear(4, 1).to(DEVICE)
    twin = copy.deepcopy(lin)

    def f(m, x):
        return torch.tanh(m(x)).sum()
    x = randn(6, 4).requires_grad_()
    compiled = minicompile.compile(f)
    results = []
    for fn, m in ((compiled, lin), (f, twin)):
        out = fn(m, x)
        (g,) = torch.autograd.grad(out, x, create_graph=True)
        (out + g.square().sum()).backward()
        results.append((g.detach(), m.weight.grad, m.bias.grad))
    for got, want in zip(*results):
        assert_same(got, want)


def _hooked(x, w, on_input):
    y = x * w
    (x if on_input else y).register_hook(lambda g: g * 3)
    return (y * y).sum()


@pytest.mark.parametrize("on_input", [False, True])
def test_a_hook_registered_in_the_function_runs_once_in_a_differentiable_backward(on_input):
    """A tensor hook registered in the compiled function (at a break), then a gradient taken
    with create_graph=True: the graph after the hook asked autograd for the gradient of the
    hooked tensor itself, which ran the hook, and it ran again as the gradient flowed on (the
    gradient 3x eager's, the penalty's 9x)."""
    torch.manual_seed(10)
    x0, w0 = randn(4, 3, dtype=torch.float64), randn(4, 3, dtype=torch.float64)
    results = []
    for fn in (minicompile.compile(_hooked), _hooked):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(x, w, on_input), x, create_graph=True)
        g.square().sum().backward()
        results.append((g.detach(), x.grad, w.grad))
    for got, want in zip(*results):
        assert_same(got, want, torch.float64)


@pytest.mark.parametrize("f", [lambda t, x: t.clone() * x.sin(), lambda t, x: t.clone() @ x.t(),
                               lambda t, x: torch.nn.functional.linear(t.clone(), x)], ids=["mul", "matmul", "linear"])
def test_an_inference_mode_input_cloned_and_used_with_gradients(f):
    """An inference-mode tensor (a cached embedding, a teacher's output) cloned, as PyTorch
    tells its users to, then used with gradients: eager saves the clone; the partition saved
    the input itself (or a view of it), which autograd refuses ("Inference tensors cannot be
    saved")."""
    with torch.inference_mode():
        cached = randn(5, 3) * 4
    x0 = randn(5, 3)
    results = []
    for fn in (minicompile.compile(f), f):
        x = x0.clone().requires_grad_()
        out = fn(cached, x)
        out.sum().backward()
        results.append((out.detach(), x.grad))
    for got, want in zip(*results):
        assert_same(got, want)


def test_a_meta_learning_step_through_an_input_the_forward_did_not_save():
    """MAML's step: the gradient of a compiled loss with create_graph=True, then a gradient of
    that. The loss's forward saves what it computed (out - y), not its input `out`, whose
    history leads to the parameters: the second-order terms through `out` were silently left
    out (a gradient 20% off); they are eager's now."""
    torch.manual_seed(7)
    lin = nn.Linear(4, 3).to(DEVICE)

    def loss_of(out, y):
        return ((out - y) ** 2).mean()
    compiled = minicompile.compile(loss_of)
    x, y = randn(5, 4), randn(5, 3)
    results = []
    for fn in (compiled, loss_of):
        g = torch.autograd.grad(fn(lin(x), y), list(lin.parameters()), create_graph=True)
        second = torch.autograd.grad(sum(t.square().sum() for t in g), list(lin.parameters()))
        results.append(list(g) + list(second))
    for got, want in zip(*results):
        assert_same(got, want)


def test_double_backward_of_a_graph_that_draws_random_numbers_raises():
    """Run again, dropout would draw other masks than the forward's: differentiating the
    gradients raises (as torch.compile does) rather than give another mask's terms."""
    torch.manual_seed(8)
    lin = nn.Linear(4, 4).to(DEVICE)

    def f(m, x):
        return torch.nn.functional.dropout(m(x), 0.5).tanh().sum()
    x = randn(6, 4).requires_grad_()
    out = minicompile.compile(f)(lin, x)
    (g,) = torch.autograd.grad(out, x, create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        (out + g.square().sum()).backward()


def test_double_backward_of_a_graph_that_writes_its_inputs_raises():
    """A spectral-normed critic writes its power iteration's vector in forward: run again for a
    differentiable backward, the graph would read the vector written, not the one the forward
    read (the penalty's gradient was slightly off): differentiating the gradients raises."""
    torch.manual_seed(9)
    critic = nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(4, 8)), nn.Tanh(),
                           nn.Linear(8, 1)).to(DEVICE)
    x = randn(6, 4).requires_grad_()
    out = minicompile.compile(critic)(x).sum()
    (g,) = torch.autograd.grad(out, x, create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        (out + g.square().sum()).backward()


def test_partition_saves_weights_and_the_inputs_of_matrix_products():
    """Two linear layers with a GELU between. The backward multiplies by W.t().t(), which is W:
    the weight itself is saved (an input passed on as it is, never copied out by the forward).
    The GELU's output, which the second weight's gradient multiplies, is saved rather than
    recomputed by a kernel of its own in the backward (the forward computed it already); the
    GELU's derivative is computed in the backward from the first product, which is saved."""
    from minicompile.autograd import partition, trace_joint

    def f(x, w1, b1, w2, b2):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    args = [randn(9, 7), randn(11, 7).requires_grad_(), randn(11).requires_grad_(),
            randn(5, 11).requires_grad_(), randn(5).requires_grad_()]
    joint = trace_joint(torch.fx.symbolic_trace(f), args)
    aten = torch.ops.aten
    assert not any(n.target is aten.permute.default and n.args[0].target is aten.permute.default
                   for n in joint.graph.graph.nodes if n.op == "call_function")
    part = partition(joint)
    assert ("primal", 3) in part.saved_from and ("primal", 1) not in part.saved_from
    saved = {n.name: n for n in joint.graph.graph.nodes if n.name in part.saved}
    assert any(n.target is aten.gelu.default for n in saved.values()), part.saved
    assert any(n.target is aten.addmm.default for n in saved.values()), part.saved
    assert not any(n.target is aten.gelu.default for n in part.backward.graph.nodes)
    forward_outputs = next(n for n in part.forward.graph.nodes if n.op == "output").args[0]
    assert not any(getattr(o, "target", None) is aten.permute.default for o in forward_outputs)



def test_a_value_computed_in_every_layer_is_computed_and_saved_once(kernel_backend):
    """PyTorch's attention turns a boolean mask into an additive one in every call: in the
    joint graph, one `where` per layer, each read by its layer's attention backward. Merged
    into one value (common subexpressions), the mask is saved once, not once per layer; random
    ops, which draw new numbers each call, stay apart (two dropouts of one tensor)."""
    from minicompile.autograd import partition, trace_joint

    def f(q, k, v, mask):
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        a = F.scaled_dot_product_attention(a, k, v, attn_mask=mask)
        return a, F.dropout(a, 0.5) + F.dropout(a, 0.5), a + 0.0, a + (-0.0), a + 1, a + True
    args = [randn(2, 4, 16, 8).requires_grad_() for _ in range(3)] + [torch.rand(2, 1, 16, 16, device=DEVICE) > 0.3]
    joint = trace_joint(torch.fx.symbolic_trace(f), args)
    nodes = [n for n in joint.graph.graph.nodes if n.op == "call_function"]
    assert sum(n.target is torch.ops.aten.where.self for n in nodes) == 1
    random = [n for n in nodes if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
    assert len(random) >= 4            # two attentions and two dropouts, none merged
    outputs = next(n for n in joint.graph.graph.nodes if n.op == "output").args[0]
    assert len({o.name for o in outputs[2:6]}) == 4     # a + 0.0, a + -0.0, a + 1, a + True differ
    part = partition(joint)
    masks = [s for s in part.saved if s.startswith("where")]
    assert len(masks) == 1, part.saved
    # and the results and gradients are eager's
    ours = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    torch.manual_seed(0)
    out = minicompile.compile(f)(*ours)
    torch.manual_seed(0)
    expected = f(*args)
    for i in (0, 2, 3, 4, 5):
        assert_same(out[i], expected[i])
    out[0].sum().backward()
    expected[0].sum().backward()
    for a, b in zip(ours[:3], args[:3]):
        assert_same(a.grad, b.grad)

class RelativeBiasAttention(nn.Module):
    """timm's MaxViT: a learnt table of relative position biases, gathered and permuted to
    (heads, tokens, tokens), the attention mask of every window; the permute leaves the
    bias's last dim strided."""

    def __init__(self, heads=2, window=4, dim=8):
        super().__init__()
        self.heads, self.window = heads, window
        self.qkv = nn.Linear(dim * heads, 3 * dim * heads)
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("index", rel[..., 0] * (2 * window - 1) + rel[..., 1], persistent=False)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0)).transpose(1, 2).reshape(b, n, c)


def test_attention_bias_laid_out_as_traced_at_dynamic_sizes(kernel_backend):
    """The bias handed to efficient attention is a broadcast view of a permuted table: at
    symbolic sizes it was passed as a view of our own layout (heads innermost), and the GPU's
    kernel, which takes a bias with its last dim contiguous, raised at the second batch size.
    It is laid out as the traced argument was, at every size; gradients are eager's."""
    torch.manual_seed(0)
    model = RelativeBiasAttention().to(DEVICE)
    ours = copy.deepcopy(model)
    compiled = minicompile.compile(ours)
    for batch in (3, 5, 7):
        x = randn(batch, 16, 16)
        assert_same(compiled(x), model(x))
        compiled(x).square().sum().backward()
        model(x).square().sum().backward()
        for (name, a), b in zip(ours.named_parameters(), model.parameters()):
            assert_same(a.grad, b.grad)


class Pool(nn.Module):
    def __init__(self, c, thw, stride):
        super().__init__()
        self.thw = thw
        self.conv = nn.Conv3d(c, c, 3, stride=stride, padding=1, groups=c, bias=False)
        self.norm = nn.LayerNorm(c)

    def forward(self, x):
        b, n, l, c = x.shape
        cls, rest = torch.split(x, [1, l - 1], dim=2)
        rest = self.conv(rest.transpose(2, 3).reshape(b * n, c, *self.thw))
        rest = rest.reshape(b, n, c, -1).transpose(2, 3)
        return self.norm(torch.cat((cls, rest), dim=2))


class PooledAttention(nn.Module):
    """torchvision's MViT v2 attention, cut down: q, k, v are strided views of one qkv product
    (transpose, unbind), each pooled with its class token split off and put back; a relative
    position term from q's tokens; the pooled q added to the result (residual pooling)."""

    def __init__(self, dim=16, heads=2, thw=(2, 4, 4)):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.pool_q = Pool(self.head_dim, thw, (1, 2, 2))
        self.pool_k = Pool(self.head_dim, thw, (1, 2, 2))
        self.pool_v = Pool(self.head_dim, thw, (1, 2, 2))
        self.rel = nn.Parameter(torch.randn(3, self.head_dim) * 0.1)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).transpose(1, 3).unbind(dim=2)
        q, k, v = self.pool_q(q), self.pool_k(k), self.pool_v(v)
        attn = (q * self.head_dim ** -0.5) @ k.transpose(2, 3)
        tokens = q[:, :, 1:].reshape(b, self.heads, 2, 2, 2, self.head_dim)
        rel = torch.einsum("bythwc,kc->bythwk", tokens, self.rel).reshape(b, self.heads, 8, -1)
        attn[:, :, 1:, 1:] += rel.sum(-1, keepdim=True)
        out = attn.softmax(dim=-1) @ v
        out[:, :, 1:, :] += q[:, :, 1:, :]
        return self.proj(out.transpose(1, 2).reshape(b, -1, c))


def test_saved_views_with_room_between_items_are_read_as_handed_over(kernel_backend):
    """q, k and v are strided views of one product; their class tokens, split off, are saved
    for the backward, which reshapes what it computes from them. At dynamic sizes the
    backward is handed them dense, where its graph was traced on the views: it does not run
    on symbolic sizes, and compiled for each size it read them as the views, past their
    memory (NaN gradients, on a GPU an illegal memory access: torchvision's MViT). Now such
    a value is handed over as traced (autograd.function.SymbolicLayout), the backward is
    generic in the batch size, and its gradients are eager's at every size."""
    torch.manual_seed(0)
    model = PooledAttention().to(DEVICE)
    ours = copy.deepcopy(model)
    compiled = minicompile.compile(ours)
    minicompile.metrics.reset()
    for batch in (2, 3, 4, 5):
        x = randn(batch, 33, 16)
        ours.zero_grad(), model.zero_grad()
        compiled(x).square().sum().backward()
        model(x).square().sum().backward()
        for a, b in zip(ours.parameters(), model.parameters()):
            assert_same(a.grad, b.grad)
    assert minicompile.metrics.graphs == 2            # the first size's, then one for every size


def statistic_and_value(x, w):
    with torch.no_grad():
        scale = (x * w).abs().amax()         # a statistic, not differentiated
    return scale, (x * w).abs().amax(), x * w, (x * w).detach()


def test_one_expression_returned_with_and_without_its_gradient_stays_two_tensors(kernel_backend):
    """The same expression under no_grad and with grad (or detached): merged as common
    subexpressions, the two outputs were one tensor, and the differentiable one lost its
    gradient (w.grad missed y's part)."""
    x, weight = randn(5), randn(5)
    results = []
    for fn in (statistic_and_value, minicompile.compile(statistic_and_value)):
        w = weight.clone().requires_grad_()
        outs = fn(x, w)
        (outs[1] + outs[2].sum()).backward()
        results.append(([o.requires_grad for o in outs], w.grad, outs))
    assert results[0][0] == results[1][0] == [False, True, True, False]
    assert_same(results[1][1], results[0][1])
    assert results[1][2][2] is not results[1][2][3]


def test_partition_saves_a_layer_norms_input_rather_than_its_normalized_value():
    """The normalized input (x - mean) * rstd is read only by pointwise work: no forward kernel
    would store it. Saved, it would take memory of its own; the input is held anyway (on the
    H100 the GPT block's forward kept 24 MB more than torch.compile's). So the input and the
    two statistics are saved, and the backward normalizes again; the layer norm's output,
    which the linear layer's weight gradient reads, is saved as it is."""
    from minicompile.autograd import partition, trace_joint

    def f(x, w, b, w2):
        return F.linear(F.layer_norm(x, (16,), w, b), w2)
    args = [randn(8, 16).requires_grad_(), randn(16).requires_grad_(), randn(16).requires_grad_(),
            randn(4, 16).requires_grad_()]
    joint = trace_joint(torch.fx.symbolic_trace(f), args)
    part = partition(joint)
    assert ("primal", 0) in part.saved_from, part.saved
    nodes = {n.name: n for n in joint.graph.graph.nodes}
    full = [s for s in part.saved if nodes[s].op != "placeholder" and nodes[s].meta["val"].shape == (8, 16)]
    assert len(full) == 1, part.saved         # the output alone, not the normalized input too


def test_backward_makes_a_weights_gradient_first_when_that_frees_the_saved_input(kernel_backend):
    """A linear layer's backward: the product that makes the weight's gradient is the last to
    read the layer's saved input, bigger than that gradient (more rows than features). It runs
    before the product that makes the input's gradient, so that the saved input's memory is
    free for it (autograd's order, with a bias: the input's first). Where the weight's gradient
    is the bigger (few rows), the order stays."""
    from minicompile.autograd import partition, trace_joint

    def f(x, w1, w2, b2):
        return F.linear(F.gelu(F.linear(x, w1)), w2, b2)
    for rows, first in ((64, "weight"), (2, "input")):
        args = [randn(rows, 16).requires_grad_(), randn(32, 16).requires_grad_(), randn(8, 32).requires_grad_(),
                randn(8).requires_grad_()]
        part = partition(trace_joint(torch.fx.symbolic_trace(f), args))
        products = [n for n in part.backward.graph.nodes if n.target is torch.ops.aten.mm.default]
        placeholders = {n.name for n in part.backward.graph.nodes if n.op == "placeholder"}
        w2 = next(n for n in part.backward.graph.nodes if n.op == "placeholder" and n.meta["val"].shape == (8, 32))

        def reads(node, value):
            return any(a is value or (a.op == "call_function" and a.args[0] is value) for a in node.all_input_nodes)
        input_grad = next(i for i, n in enumerate(products) if reads(n, w2))
        weight_grad = next(i for i, n in enumerate(products) if i != input_grad and any(
            (a.name in placeholders and a is not w2) or (a.op == "call_function" and a.args[0].name in placeholders
                                                          and a.args[0] is not w2) for a in n.all_input_nodes))
        assert (weight_grad < input_grad) == (first == "weight"), [n.format_node() for n in products]
        ours = [a.detach().clone().requires_grad_() for a in args]
        minicompile.compile(f)(*ours).sum().backward()
        f(*args).sum().backward()
        for a, b in zip(ours, args):
            assert_same(a.grad, b.grad)


@pytest.mark.parametrize("shape, kernel, stride, padding, ceil_mode", [
    ((2, 3, 8, 8), 2, 2, 0, False), ((2, 3, 9, 7), 3, 2, 1, False), ((2, 3, 9, 7), 3, 2, 1, True),
    ((1, 4, 11, 13), 3, 1, 1, False), ((3, 10, 10), 2, 2, 0, True), ((2, 3, 12, 12), (3, 2), (2, 1), (1, 0), False),
    ((2, 3, 7, 7), 2, 3, 0, False)])
def test_max_pooling_backward_is_a_generated_kernel(kernel_backend, compiled_training, shape, kernel, stride,
                                                     padding, ceil_mode):
    """Max pooling's backward gathers, for each input position, the gradient of the windows
    whose maximum it was: a generated kernel, not PyTorch's fill-then-scatter. Overlapping
    windows (ResNet's 3 x 3, stride 2), padding, ceil_mode's partial windows, strides larger
    than the window, channels-last inputs and ties (equal values in a window) give eager's
    gradients. float16 stays PyTorch's kernel, with eager's gradients too. The saved maxima's
    places in their windows are compared with each position's in 32-bit integers (the indices
    into the input plane they stand for would take 64-bit arithmetic)."""
    def f(x):
        return F.max_pool2d(torch.relu(x) * 1.5, kernel, stride, padding, ceil_mode=ceil_mode) * 3
    for dtype, channels_last in ((torch.float32, False), (torch.float32, True), (torch.float16, False)):
        if dtype == torch.float16 and DEVICE == "cpu" and kernel_backend == "triton":
            continue
        x = ((randn(*shape) * 2).round() / 2).to(dtype)          # halves: ties in many windows
        if channels_last and len(shape) == 4:
            x = x.to(memory_format=torch.channels_last)
        ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        minicompile.reset()
        compiled = minicompile.compile(f)
        out, expected = compiled(ours), f(theirs)
        g = randn(*expected.shape).to(dtype)
        out.backward(g)
        expected.backward(g)
        assert_same(out, expected, dtype)
        assert_same(ours.grad, theirs.grad, dtype)
    # the float32 backward has no call of PyTorch's pooling backward
    made = compiled_training
    minicompile.reset()
    minicompile.compile(f)(randn(*shape).requires_grad_()).sum().backward()
    assert "max_pool2d_with_indices_backward" not in made[-1].backward.wrapper_source
    if kernel_backend == "triton":
        assert "int64" not in made[-1].backward.source


@pytest.mark.parametrize("shape, kernel, stride, padding, ceil_mode", [
    ((2, 3, 9, 7), 3, 2, 1, False), ((2, 3, 9, 7), 3, 2, 1, True), ((3, 10, 10), 2, 2, 0, True),
    ((2, 3, 12, 12), (3, 2), (2, 1), (1, 0), False)])
def test_max_pooling_forward_finds_eagers_maximum_and_index(kernel_backend, compiled_training, shape, kernel,
                                                             stride, padding, ceil_mode):
    """In training, max pooling's forward makes the maxima and where they are in a generated
    kernel. It saves each one's place in its window (int8), not its index into the input plane
    (int64: eight times the bytes); the backward turns the places into indices where it
    gathers. The place is eager's: the first of equal maxima, the last NaN of a window, the
    first element inside the input of a window of -inf alone; so gradients go where eager's
    do. A window's NaN is the maximum."""
    def f(x):
        return F.max_pool2d(x * 1.5, kernel, stride, padding, ceil_mode=ceil_mode) * 3
    made = compiled_training
    for specials in (False, True):
        x = (randn(*shape) * 2).round() / 2                    # halves: ties in many windows
        if specials:
            flat = x.view(-1)
            picks = torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(3))
            flat[picks[:4].to(flat.device)] = math.nan
            flat[picks[4:flat.numel() // 2].to(flat.device)] = -math.inf
        ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        minicompile.reset()
        out, expected = minicompile.compile(f)(ours), f(theirs)
        g = randn(*expected.shape)
        out.backward(g)
        expected.backward(g)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4, equal_nan=True)
        assert_same(ours.grad, theirs.grad)
        assert "max_pool2d_with_indices" not in made[-1].forward.wrapper_source
        saved = [n.meta["val"].dtype for n in made[-1].partition.backward.graph.nodes
                 if n.name in made[-1].partition.saved]
        assert torch.int8 in saved and torch.int64 not in saved, saved
        assert "offsets_to_indices" not in made[-1].backward.wrapper_source


def test_max_pool_offsets_eager_definitions_are_pytorchs_pooling():
    """custom_ops.py's ops run as defined where lowering leaves them to PyTorch: the maxima are
    max_pool2d's, the offsets fit int8 and give back max_pool2d_with_indices's indices."""
    from minicompile import custom_ops
    x = randn(2, 3, 9, 7)
    x[0, 0, :3, :3] = float("nan")
    for kernel, stride, padding, ceil_mode in (([3, 3], [2, 2], [1, 1], False), ([3, 2], [2, 1], [1, 0], True),
                                               ([2, 2], [3, 3], [0, 0], True)):
        maxima, offsets = custom_ops.max_pool2d_offsets(x, kernel, stride, padding, ceil_mode)
        expected, indices = torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, [1, 1], ceil_mode)
        torch.testing.assert_close(maxima, expected, equal_nan=True, rtol=0, atol=0)
        assert offsets.dtype == torch.int8 and 0 <= int(offsets.min()) and int(offsets.max()) < kernel[0] * kernel[1]
        assert torch.equal(custom_ops.max_pool2d_offsets_to_indices(offsets, kernel, stride, padding, 7), indices)


@pytest.mark.parametrize("name, forward_kernels", [("mlp", 2), ("gpt_block", 4)])
def test_forward_kernels_compute_only_what_eager_does(kernel_backend, name, forward_kernels):
    """The compiled forward of a training step copies nothing out for the backward (no weight,
    no view of a product, no value it also feeds a matrix product through a reshape): the MLP
    is one kernel per layer (GELU and residual; the last with the layer norm), the GPT block
    four (each layer norm, the GELU, the last residual add). With Triton kernels, the biases
    of the block's projections that no elementwise work reads (attention's input, the first
    MLP layer's output) are added by kernels of their own (lowerings._linear says why), and so
    is the attention projection's, whose biased output is saved: the second layer norm's
    backward recomputes its normalized input from it and the block's input, rather than the
    forward storing the normalized input only to save it (partition.save_cost)."""
    model, make_input = _model(name)
    minicompile.compile(model.to(DEVICE).train())(make_input()).square().mean().backward()
    if kernel_backend == "triton" and name == "gpt_block":
        forward_kernels += 3
    assert minicompile.metrics.kernels - minicompile.metrics.backward_kernels == forward_kernels


@pytest.mark.skipif(DEVICE != "cpu", reason="the channels-last layout is the CPU's (oneDNN)")
def test_convolutions_train_channels_last_on_a_cpu(kernel_backend):
    """On a CPU the joint graph records channels-last values around each convolution, so the
    CNN's forward stores them so: no kernel copies a saved convolution output, or the input of
    max pooling, between layouts (10 launches, with combo kernels: batch norm's statistics in one
    kernel, its running statistics written by a generated kernel, max pooling's maxima and their
    indices in one; with Triton kernels one more, which adds the classifier's bias). A 4-D output still comes back in eager's
    (contiguous) layout, and gradients are eager's. (Inputs large enough for every
    convolution to run channels-last: ir.conv_channels_last.)"""
    model, _ = _model("cnn")
    minicompile.compile(model.train())(randn(3, 3, 20, 20)).square().mean().backward()
    assert minicompile.metrics.kernels - minicompile.metrics.backward_kernels == \
        (11 if kernel_backend == "triton" else 10)

    torch.manual_seed(6)
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU()).train()
    twin = copy.deepcopy(net)
    x = randn(2, 3, 12, 11)
    out, expected = minicompile.compile(net)(x), twin(x)
    assert out.is_contiguous() and out.stride() == expected.stride()
    assert_same(out, expected)
    out.square().mean().backward()
    expected.square().mean().backward()
    for p, q in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda x: torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2),   # GPT-J's rotate_every_two
    lambda x: x.unbind(-1)[1] * 3 + x.select(-2, 1)[:, :5] - x[..., 2:-1:2].sum(-1),
], ids=["stack_of_strided_slices", "select_and_slice_from_the_end"])
def test_backward_of_selects_and_slices_on_negative_dimensions(kernel_backend, fn):
    """The backward graph's select and slice name their dimension from the end (stack's
    backward selects on dim -1): each must read that dimension, not the first."""
    def leaves():
        torch.manual_seed(5)
        return randn(3, 5, 8).requires_grad_()
    ours, theirs = leaves(), leaves()
    weight = randn(*fn(theirs).shape)
    (minicompile.compile(fn)(ours) * weight).sum().backward()
    (fn(theirs) * weight).sum().backward()
    assert_same(ours.grad, theirs.grad)
    assert minicompile.metrics.backward_kernels > 0


def test_an_input_whose_gradient_formula_gives_zeros_gets_zeros_not_none(kernel_backend):
    """copysign's gradient with respect to its sign source is zeros: eager gives the input that
    tensor, not None (None is for an input that no output used reaches), and so must we."""
    def f(x, y, z):
        return torch.copysign(x, y) * 2, z.exp()

    def leaves():
        torch.manual_seed(6)
        return [randn(7, 5).requires_grad_() for _ in range(3)]
    ours, theirs = leaves(), leaves()
    minicompile.compile(f)(*ours)[0].sum().backward()
    f(*theirs)[0].sum().backward()
    for a, b in zip(ours, theirs):
        assert (a.grad is None) == (b.grad is None)
        if b.grad is not None:
            assert_same(a.grad, b.grad)
    assert theirs[1].grad is not None and theirs[2].grad is None


def test_a_gradient_that_reads_no_tangent(kernel_backend):
    """angle's gradient for a real input is zeros like it: it reads the input's shape, no
    tangent, and still belongs to the backward graph (the partition crashed on it)."""
    def f(x, y):
        return torch.angle(x) * 3 + y.square()

    def leaves():
        torch.manual_seed(7)
        return randn(7, 5).requires_grad_(), randn(7, 5).requires_grad_()
    ours, theirs = leaves(), leaves()
    minicompile.compile(f)(*ours).sum().backward()
    f(*theirs).sum().backward()
    for a, b in zip(ours, theirs):
        assert_same(a.grad, b.grad)


def _seeds_itself(x):
    """Dropout under a seed of its own, the generator restored after (as torch.testing's
    wrapper_set_seed, which the OpInfo database's svd_lowrank runs)."""
    with torch.random.fork_rng():
        torch.manual_seed(42)
        return F.dropout(x, 0.5)


_seeds_itself.__module__ = "torch.testing"     # capture records a function of torch's whole


def test_a_function_that_sets_the_seed_keeps_eager_numbers(kernel_backend):
    """The joint graph records aten ops, not torch.manual_seed: traced through, the function
    above drew from the caller's stream instead. It runs on PyTorch's kernels (and says so)."""
    def f(x):
        return _seeds_itself(x * 2) + 1

    def leaves():
        torch.manual_seed(8)
        return randn(6, 7).requires_grad_()
    ours, theirs = leaves(), leaves()
    with pytest.warns(UserWarning, match="sets a random generator"):
        out = minicompile.compile(f)(ours)
    assert_same(out, f(theirs))
    out.sum().backward()
    f(theirs).sum().backward()
    assert_same(ours.grad, theirs.grad)


def test_an_internal_op_gets_the_contiguous_copy_the_traced_graph_made(kernel_backend):
    """embedding_bag's decomposition copies non-contiguous indices (clone) before
    aten._embedding_bag, which reads them as contiguous: handing that op a strided view of
    the indices instead gave every bag other rows."""
    def f(w, idx):
        return F.embedding_bag(idx, w, mode="sum") * 2

    def leaves():
        torch.manual_seed(9)
        return randn(10, 5).requires_grad_(), torch.randint(0, 10, (5, 10), device=DEVICE)[:, ::2]
    ours, theirs = leaves(), leaves()
    out, expected = minicompile.compile(f)(*ours), f(*theirs)
    assert_same(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert_same(ours[0].grad, theirs[0].grad)


def test_a_compiled_block_given_an_activation_passes_its_gradient_back(kernel_backend):
    """A compiled block whose input is computed with autograd (an activation, not a leaf: the
    blocks of a model compiled one by one, the later ones reading the earlier ones' outputs)
    returns that input's gradient, so everything before it gets its gradients too."""
    torch.manual_seed(7)
    model = nn.Sequential(models.Block(dim=16, heads=2), models.Block(dim=16, heads=2)).to(DEVICE)
    twin = copy.deepcopy(model)
    for block in model:
        block.forward = minicompile.compile(block.forward)
    x, target = randn(3, 5, 16), randn(3, 5, 16)
    (model(x) - target).square().mean().backward()
    (twin(x) - target).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_tied_weights_get_the_gradients_of_both_uses(kernel_backend):
    """One parameter read twice (GPT-2's embedding and LM head: the trace sees two inputs that
    are one tensor): its gradient is the sum of both uses', as eager's."""
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(11, 8), nn.Linear(8, 11, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            return self.head(torch.tanh(self.embed(ids)))
    torch.manual_seed(8)
    model = Tied().to(DEVICE)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 11, (2, 5), device=DEVICE)
    minicompile.compile(model)(ids).square().mean().backward()
    twin(ids).square().mean().backward()
    assert_same(model.embed.weight.grad, twin.embed.weight.grad)


def test_the_joint_trace_runs_the_graph_once(monkeypatch):
    """What the joint trace must know before it starts (which outputs carry gradients, their
    shapes) comes from the values capture recorded: the graph runs once, inside make_fx.
    Without those values (or when the trace finds otherwise) it runs on fake tensors first, and
    the gradients are the same."""
    from minicompile.autograd import joint
    runs = []
    interpret = torch.fx.Interpreter.run

    def counted(self, *args, **kwargs):
        runs.append(type(self).__name__)
        return interpret(self, *args, **kwargs)
    monkeypatch.setattr(torch.fx.Interpreter, "run", counted)
    captured = joint._captured_outputs
    for record in (True, False):
        monkeypatch.setattr(joint, "_captured_outputs", captured if record else lambda gm: None)
        torch.manual_seed(3)
        width = 8 if record else 9          # (another graph: not the one compiled before)
        model = nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 2)).to(DEVICE)
        twin = copy.deepcopy(model)
        x = randn(5, 6)
        runs.clear()
        minicompile.compile(model)(x).square().mean().backward()
        assert runs.count("_WatchingGenerators") + runs.count("Interpreter") == (1 if record else 2), runs
        twin(x).square().mean().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            assert_same(p.grad, q.grad)


def test_the_backward_lets_go_of_each_saved_activation_after_its_last_use(kernel_backend, monkeypatch):
    """The forward's saved activations are held by the backward's list of inputs alone (autograd's
    node lets go of them, as AOTAutograd's does), so the generated backward frees each once it
    has read it last: gradients computed late take the memory of activations read early. With
    retain_graph=True autograd keeps them, and a second backward gives the same gradients."""
    from minicompile.codegen.wrapper import CompiledGraph
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)).to(DEVICE)
    twin = copy.deepcopy(model)
    x = randn(9, 16)
    alive_after = []
    original = CompiledGraph.run_consuming

    def spy(self, args):
        refs = [weakref.ref(a) for a in args if isinstance(a, torch.Tensor)]
        keep = {id(p) for p in model.parameters()} | {id(x)}
        refs = [r for r in refs if id(r()) not in keep]       # activations, and the tangent
        out = original(self, args)
        alive_after.append(sum(r() is not None for r in refs))
        return out
    monkeypatch.setattr(CompiledGraph, "run_consuming", spy)
    compiled = minicompile.compile(model)
    compiled(x).sum().backward()
    twin(x).sum().backward()
    assert alive_after == [0]
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
        p.grad = q.grad = None
    out = compiled(x).sum()
    out.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    out.backward()
    for p, g in zip(model.parameters(), first):
        torch.testing.assert_close(p.grad, 2 * g)


class ConvBNPool(nn.Module):
    """A classifier's stem and head: convolution, batch norm, ReLU, a global average pool."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        return self.fc(self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1))


def test_batch_norm_and_a_global_pool_train_from_one_trace_of_the_joint_graph(kernel_backend, monkeypatch):
    """Batch norm's running statistics are computed as new values (aten's functional batch
    norm) and a global average pool as a mean, so the joint graph writes nothing and is traced
    once, not a second time through functionalization; gradients and statistics are eager's."""
    calls = []
    real = torch.func.functionalize
    monkeypatch.setattr(torch.func, "functionalize", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(8)
    train_side_by_side(ConvBNPool(), lambda: randn(3, 3, 11, 9))
    assert calls == [] and minicompile.metrics.graph_breaks == 0
    assert minicompile.metrics.backward_kernels > 0


def test_only_calls_that_could_seed_a_generator_are_watched():
    """The joint graph's first run watches, with a profile hook, the calls that could set a
    generator's seed or state (a Python function the graph calls whole, a generator's own
    method); aten ops, C functions, tensor methods and torch.nn.functional's run unwatched."""
    from minicompile.autograd.joint import _never_seeds
    generator = torch.Generator()
    for target in (torch.add, torch.conv2d, F.relu, F.batch_norm, F.linear, torch.Tensor.add,
                   torch.ops.aten.add.Tensor, torch.ops.aten.add, operator.add):
        assert _never_seeds(target), target
    for target in (generator.manual_seed, torch.Generator.manual_seed, torch.manual_seed,
                   torch.set_rng_state, torch.random.seed, _seeds_itself, lambda x: x):
        assert not _never_seeds(target), target


def test_partition_makes_constants_again_in_the_backward_rather_than_saving_them(kernel_backend):
    """A Llama's rotary embedding: rotate_half slices and concatenates, and the slices' backward
    scatters into zeros (`full`), which a scatter (not a pointwise op) reads. Made from no
    other value, the zeros are made again in the backward, not held from the forward to the
    backward: what is saved is the inputs and the softmax's result. Gradients are eager's."""
    from minicompile.autograd import partition, trace_joint

    def rotate_half(x):
        x1, x2 = x[..., :4], x[..., 4:]
        return torch.cat((-x2, x1), dim=-1)

    def f(q, cos, sin, w):
        q = q @ w
        return torch.softmax(q * cos + rotate_half(q) * sin, -1)
    q, cos, sin, w = randn(2, 3, 8), randn(3, 8), randn(3, 8), randn(8, 8).requires_grad_()
    part = partition(trace_joint(torch.fx.symbolic_trace(f), [q, cos, sin, w]))
    saved = {n.name: n for n in part.backward.graph.nodes if n.op == "placeholder"}
    assert not any(n.startswith("full") for n in part.saved), part.saved
    assert part.saved_bytes == (2 * 3 * 8 + 3 * 8 + 3 * 8 + 2 * 3 * 8) * 4, (part.saved, saved)
    w_twin = w.detach().clone().requires_grad_()
    compiled = minicompile.compile(f)
    compiled(q, cos, sin, w).square().sum().backward()
    f(q, cos, sin, w_twin).square().sum().backward()
    torch.testing.assert_close(w.grad, w_twin.grad, rtol=1e-4, atol=1e-5)


def test_partition_recomputes_a_concatenation_rather_than_saving_it(kernel_backend):
    """A Llama's rotary angles: freqs = positions x inverse frequencies (a product of a column
    and a row), emb = cat((freqs, freqs)), and q is rotated by emb's cos and sin. The backward
    needs cos and sin; lowering makes a concatenation a pointwise value, so the backward
    computes the cat again from what is saved, and the forward does not hold emb (twice
    freqs' bytes) from the forward to the backward. Gradients are eager's."""
    from minicompile.autograd import partition, trace_joint

    def f(q, inv_freq, positions, w):
        freqs = positions[:, None].float() @ inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        q = q @ w
        return q * emb.cos() + q.flip(-1) * emb.sin()
    q, w = randn(2, 9, 8), randn(8, 8).requires_grad_()
    inv_freq, positions = torch.rand(4, device=q.device) + 0.1, torch.arange(9, device=q.device)
    part = partition(trace_joint(torch.fx.symbolic_trace(f), [q, inv_freq, positions, w]))
    nodes = {n.name: n for n in part.backward.graph.nodes}
    assert not any(nodes[s].op == "placeholder" and getattr(nodes[s].meta.get("val"), "shape", None) == (9, 8)
                   for s in part.saved), part.saved
    assert any(n.target is torch.ops.aten.cat.default for n in part.backward.graph.nodes), part.backward.code
    w_twin = w.detach().clone().requires_grad_()
    minicompile.compile(f)(q, inv_freq, positions, w).square().sum().backward()
    f(q, inv_freq, positions, w_twin).square().sum().backward()
    torch.testing.assert_close(w.grad, w_twin.grad, rtol=1e-4, atol=1e-5)


class _Checkpointed(nn.Module):
    """Pre-norm MLP blocks, each through torch.utils.checkpoint (or not)."""

    def __init__(self, width=24, blocks=3, use_reentrant=False, checkpointed=True):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.GELU(),
                                                  nn.Linear(3 * width, width)) for _ in range(blocks))
        self.use_reentrant, self.checkpointed = use_reentrant, checkpointed

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=self.use_reentrant) if self.checkpointed else block(x))
        return x


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_saves_what_eager_saves(kernel_backend, compiled_training, use_reentrant):
    """torch.utils.checkpoint inside the compiled graph (one graph, no break): the backward
    computes each checkpointed call's values again, matrix products included, from what the
    call was given; the forward saves the calls' inputs and no value computed inside them.
    Gradients are eager's (of the checkpointed model, run eagerly)."""
    torch.manual_seed(0)
    model = _Checkpointed(use_reentrant=use_reentrant).to(DEVICE)
    twin = copy.deepcopy(model)
    for step in range(2):
        x = randn(5, 7, 24).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        minicompile.compile(model)(x).square().mean().backward()
        twin(x2).square().mean().backward()
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-6)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
            p.grad = q.grad = None
    assert minicompile.metrics.graph_breaks == 0 and minicompile.metrics.graphs == 1
    part = compiled_training[-1].partition
    saved = {n.name: n for n in part.forward.graph.nodes if n.name in part.saved}
    aten = torch.ops.aten
    computed = [n for n in saved.values() if n.op == "call_function"]
    # the block's sums (x after each block but the last, which the backward does not read)
    assert len(computed) == 2 and all(n.target is aten.add.Tensor for n in computed), part.saved
    backward_products = [n for n in part.backward.graph.nodes if n.target in (aten.addmm.default, aten.mm.default)]
    unchecked = _Checkpointed(checkpointed=False).to(DEVICE)
    minicompile.compile(unchecked)(randn(5, 7, 24)).square().mean().backward()
    plain = compiled_training[-1].partition
    assert part.saved_bytes < plain.saved_bytes
    # the backward's products: the gradients' (dx, dW), and each block's first again (no
    # gradient reads the second's result, which eager's checkpoint computes again too)
    assert len(backward_products) == len([n for n in plain.backward.graph.nodes
                                          if n.target in (aten.addmm.default, aten.mm.default)]) + 3


def test_checkpointing_with_dropout_keeps_the_forwards_mask(kernel_backend, compiled_training):
    """A random op inside a checkpointed call is not drawn again: its mask is saved (eager's
    checkpoint replays the generator to draw the same numbers), so the gradient is the one
    of the forward's output."""
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)).to(DEVICE)
    from torch.utils.checkpoint import checkpoint

    def f(x):
        return checkpoint(layer, x, use_reentrant=False)
    x = randn(8, 16).requires_grad_()
    out = minicompile.compile(f)(x)
    out.backward(torch.ones_like(out))
    zeroed = out == 0
    # the gradient of x through a dropout: zero where the output was dropped
    expected = (torch.ones_like(out) * (~zeroed) * 2) @ layer[0].weight
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-6)
    drawn = [n for n in compiled_training[-1].partition.forward.graph.nodes if isinstance(
        n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags]
    assert drawn and not any(n.target in {d.target for d in drawn}
                             for n in compiled_training[-1].partition.backward.graph.nodes)


def test_checkpointing_at_dynamic_sizes(kernel_backend):
    """A checkpointed linear layer on a 3-d input at dynamic sizes: the backward computes the
    flattened input again, a view whose size is computed in the backward; the weight's product,
    moved up to free what it reads, takes that view with it and its size before it."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    layer = nn.Linear(16, 16).to(DEVICE)
    twin = copy.deepcopy(layer)
    compiled = minicompile.compile(lambda x: checkpoint(layer, x, use_reentrant=False).sum(), dynamic=True)
    for shape in ((3, 7, 16), (5, 2, 16)):
        x = randn(*shape)
        compiled(x).backward()
        checkpoint(twin, x, use_reentrant=False).sum().backward()
        for p, q in zip(layer.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            p.grad = q.grad = None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_group_norm_of_a_half_precision_input_with_float_weights(kernel_backend, dtype):
    """What autocast makes of a GroupNorm after a convolution: a bfloat16 input, float32
    weights. PyTorch's CPU kernel gives its statistics in float32 where its fake kernel says
    bfloat16; the backward read them as bfloat16 (NaN gradients, every one of a diffusers UNet's)."""
    if DEVICE != "cpu":
        pytest.skip("CUDA's group norm refuses these dtypes (autocast gives it float32 there)")
    torch.manual_seed(0)
    w, b = randn(8).requires_grad_(), randn(8).requires_grad_()
    x = randn(2, 8, 5, 6).to(dtype).requires_grad_()
    weights = torch.linspace(-1, 1, x.numel(), device=DEVICE).view_as(x)

    def f(h):
        return F.group_norm(h, 2, w, b)
    grads = []
    for fn in (minicompile.compile(f), f):
        (fn(x).float() * weights).sum().backward()
        grads.append([t.grad.float() for t in (x, w, b)])
        x.grad = w.grad = b.grad = None
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("loss", [lambda x, y: F.huber_loss(x, y, delta=0.3), F.smooth_l1_loss, F.l1_loss,
                                  F.mse_loss], ids=["huber", "smooth_l1", "l1", "mse"])
def test_mean_losses_train_at_new_sizes(kernel_backend, loss):
    """A mean loss's backward scales by -(1.0 / numel) at dynamic sizes (huber's): a float the
    wrapper computes from the sizes, negated too."""
    compiled = minicompile.compile(loss)
    for shape in ((5, 7), (16, 10), (3, 9)):
        x, y = randn(*shape).requires_grad_(), randn(*shape)
        x2 = x.detach().clone().requires_grad_()
        compiled(x, y).backward()
        loss(x2, y).backward()
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-6)


def test_autograd_grad_through_an_inputs_history_runs_as_eager():
    """torch.autograd.grad of a loss made from an input that has autograd history (a model's
    output from before a break; functional_call's): the trace does not run it on the examples
    (that went back through the caller's graph and freed it: eager then raised "backward
    through the graph a second time" where eager runs)."""
    def f(out, w):
        return torch.autograd.grad((out * out).sum(), [w])

    def maml_step(model, x, params):
        loss = torch.func.functional_call(model, params, (x,)).square().mean()
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        return {k: p - 0.1 * g for (k, p), g in zip(params.items(), grads)}
    w = randn(4).requires_grad_()
    assert_same(minicompile.compile(f)(w * 2, w), f(w * 2, w))
    model, x = nn.Linear(3, 2).to(DEVICE), randn(5, 3)
    params = dict(model.named_parameters())
    got, want = minicompile.compile(maml_step)(model, x, params), maml_step(model, x, params)
    for k in want:
        assert_same(got[k], want[k])


def test_an_update_of_weights_under_no_grad_is_not_compiled_for_training(recwarn):
    """An EMA of a model's weights, made with foreach ops under no_grad, with grad mode on
    outside: nothing records gradients, so the graph is not a training graph (which refused
    its writes into a list of tensors and ran on PyTorch's kernels)."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8).to(DEVICE)
    averages = [nn.Linear(8, 8).to(DEVICE).requires_grad_(False) for _ in range(2)]
    averages[1].load_state_dict(averages[0].state_dict())

    def update(ema, decay: float):
        with torch.no_grad():
            ema_params, params = list(ema.parameters()), list(model.parameters())
            torch._foreach_mul_(ema_params, decay)
            torch._foreach_add_(ema_params, params, alpha=1 - decay)
    compiled = minicompile.compile(update)
    for decay in (0.9, 0.8, 0.7):
        compiled(averages[0], decay)
        update(averages[1], decay)
    for p, q in zip(*[a.parameters() for a in averages]):
        assert_same(p, q)
    assert not [w for w in recwarn if "PyTorch's kernels" in str(w.message)]


def test_checkpoint_without_use_reentrant_runs_as_eagers(recwarn):
    """Eager warns and picks the reentrant variant: a graph break, with eager's warning."""
    from torch.utils.checkpoint import checkpoint
    layer = nn.Linear(4, 4).to(DEVICE)

    def f(x):
        return checkpoint(layer, x) * 2
    x = randn(3, 4).requires_grad_()
    torch.testing.assert_close(minicompile.compile(f)(x), f(x))
    assert any("use_reentrant" in str(w.message) for w in recwarn)
    assert "without use_reentrant" in str(minicompile.explain(f)(x).break_reasons[0])


def test_a_layer_that_checkpoints_itself_in_its_own_call(kernel_backend, compiled_training):
    """Hugging Face's checkpointing layers (some versions) override __call__ with
    checkpoint(partial(super().__call__, **kwargs), *args): the compiled model checkpoints as
    eager does (nothing inside a layer saved), instead of calling the layer's forward."""
    import functools
    from torch.utils.checkpoint import checkpoint

    class Layer(nn.Sequential):
        def __call__(self, *args, **kwargs):
            if self.training:
                return checkpoint(functools.partial(super().__call__, **kwargs), *args, use_reentrant=False)
            return super().__call__(*args, **kwargs)
    torch.manual_seed(0)
    model = nn.Sequential(*[Layer(nn.Linear(24, 72), nn.GELU(), nn.Linear(72, 24)) for _ in range(3)]).to(DEVICE)
    twin = copy.deepcopy(model)
    x = randn(5, 24).requires_grad_()
    minicompile.compile(model)(x).square().mean().backward()
    twin(x.detach()).square().mean().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    part = compiled_training[-1].partition
    computed = [n for n in part.forward.graph.nodes if n.name in part.saved and n.op == "call_function"]
    # the results of the first two layers (the next layers' inputs), nothing inside a layer
    assert len(computed) == 2 and all(n.target is torch.ops.aten.addmm.default for n in computed), part.saved


class _LeafInside(nn.Module):
    """wav2vec2's feature encoder: a view of the input made to require grad (so that
    checkpointing has something to differentiate), then convolutions."""

    def __init__(self, give_back=False):
        super().__init__()
        self.conv, self.give_back = nn.Conv1d(1, 4, 3), give_back

    def forward(self, x):
        h = x[:, None]
        h.requires_grad = True
        out = torch.tanh(self.conv(h))
        return (out, h) if self.give_back else out


@pytest.mark.filterwarnings("ignore:minicompile")       # (the second model's frame runs eagerly)
def test_a_tensor_made_to_require_grad_inside_the_graph(kernel_backend):
    """`t.requires_grad = True` on a tensor the graph computed: one graph, eager's gradients.
    Where that leaf leaves the graph (returned: its .grad could be read) the frame runs
    eagerly, and its gradient is eager's."""
    torch.manual_seed(8)
    train_side_by_side(_LeafInside(), lambda: randn(2, 9))
    assert minicompile.metrics.graphs == 1 and minicompile.metrics.graph_breaks == 0
    minicompile.reset()
    model = _LeafInside(give_back=True).to(DEVICE)
    x = randn(2, 9)
    out, leaf = minicompile.compile(model)(x)
    out.sum().backward()
    assert leaf.is_leaf and leaf.requires_grad
    twin_out, twin_leaf = model(x)
    twin_out.sum().backward()
    assert_same(leaf.grad, twin_leaf.grad)


def clipped(model):
    return torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1), model.bias.grad is None


@pytest.mark.parametrize("grads", ["all", "some", "none"])
def test_gradients_of_parameters_are_read_in_the_graph(grads):
    """clip_grad_norm_ reads p.grad of each parameter: a graph input (or None), not a break at
    the read; the clipped gradients and the norm are eager's."""
    results = []
    for fn in (clipped, minicompile.compile(clipped)):
        torch.manual_seed(0)
        model = nn.Linear(4, 3).to(DEVICE)
        if grads != "none":
            model(randn(2, 4)).pow(2).sum().backward()
        if grads == "some":
            model.bias.grad = None
        minicompile.metrics.reset()
        norm, no_bias_grad = fn(model)
        results.append((norm, no_bias_grad, model.weight.grad))
    assert minicompile.metrics.graph_breaks == 0
    assert_same(results[1][0], results[0][0])
    assert results[1][1] == results[0][1]
    if results[0][2] is not None:
        assert_same(results[1][2], results[0][2])


def scales_a_list(tensors, w):
    torch._foreach_mul_(tensors, 0.5)
    return w * 2


def test_a_foreach_write_in_a_graph_compiled_for_training_is_made():
    """_foreach_mul_ into the call's tensors in a graph whose other input requires grad: the
    joint graph's trace lost the write (the tensors stayed as they were)."""
    results = []
    for fn in (scales_a_list, minicompile.compile(scales_a_list)):
        w = torch.ones(2, device=DEVICE, requires_grad=True)
        torch.manual_seed(0)
        tensors = [randn(4), randn(3)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(tensors, w)
        out.sum().backward()
        results.append((tensors, w.grad))
    assert_same(results[1][0][0], results[0][0][0])
    assert_same(results[1][0][1], results[0][0][1])
    assert_same(results[1][1], results[0][1])



def conjugated_as_real(a, b):
    return torch.view_as_real(torch.complex(b, a).conj() * 2)


def test_the_real_parts_of_a_conjugated_gradient_are_read():
    """The backward reads the real and imaginary parts of a gradient conjugated lazily (a
    conjugate bit) through view_as_real, which refused it when run as PyTorch's op."""
    results = []
    for fn in (conjugated_as_real, minicompile.compile(conjugated_as_real)):
        torch.manual_seed(0)
        a, b = randn(5, 3).requires_grad_(), randn(5, 3).requires_grad_()
        out = fn(a, b)
        out.pow(2).sum().backward()
        results.append((out, a.grad, b.grad))
    for got, expected in zip(*reversed(results)):
        assert_same(got, expected)


def row_products(x):
    return x.prod(1)


def test_a_products_gradient_at_a_nan_is_eagers():
    """Eager's gradient of a product is result / x where x holds no zero (NaN at a NaN); the
    traced formula took the product of the other elements (finite there). With a zero, both
    take that product."""
    for row in ([float("nan"), 1.0, 5.0, 5.0], [0.0, 2.0, 0.0, 5.0], [float("inf"), 1.0, 5.0, 5.0]):
        grads = []
        for fn in (row_products, minicompile.compile(row_products)):
            x = torch.tensor([[1.0, 3.0, 3.0, 2.0], row], device=DEVICE, requires_grad=True)
            fn(x).sum().backward()
            grads.append(x.grad)
        torch.testing.assert_close(grads[1], grads[0], equal_nan=True)


# --------------------------------------------------------------------------- dynamic shapes

_NEW_SIZES = {                 # per model: inputs of another batch size or sequence length per step
    "mlp": lambda k: randn((13, 6, 29, 6)[k], 37),
    "cnn": lambda k: randn((3, 5, 2, 5)[k], 3, 9, 9),
    "conv_bn_inplace": lambda k: randn((2, 3, 7, 3)[k], 3, 7, 9),
    "gpt_block": lambda k: randn(2, (7, 11, 5, 11)[k], 32),
}


@pytest.mark.parametrize("name", list(_NEW_SIZES))
def test_training_takes_new_sizes_without_compiling_again(kernel_backend, compiled_training, name):
    """A training step given another batch size (or sequence length) each step compiles twice,
    as inference does: for the first size, then once generic in the size that changed (the
    joint graph traced on a size symbol). Losses, gradients, updated parameters and batch norm's
    running statistics (whose update divides by n - 1, n a symbol) as eager's at every size."""
    model, _ = _model(name)
    steps = iter(range(4))
    train_side_by_side(model, lambda: _NEW_SIZES[name](next(steps)), steps=4)
    if kernel_backend == "triton" and DEVICE == "cpu" and name in ("cnn", "conv_bn_inplace"):
        # batch norm's statistics accumulate in float64 on a CPU, and Triton takes a run-time
        # float (n / (n - 1)) as float32: compiled for each size instead (codegen/triton.py)
        assert minicompile.metrics.graphs == 3           # one per size
        return
    assert minicompile.metrics.graphs == 2 and minicompile.metrics.recompiles == 1
    generic = compiled_training[-1]
    assert generic.shape_guards == [] or all("==" not in g or ".size" in g.split("==")[1]
                                             for g in generic.shape_guards), generic.shape_guards
    assert len(generic.backward.kernels) > 0


def _cross_entropy_of_a_projection(h, labels, w):
    logits = h @ w.t()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def test_a_language_models_loss_trains_at_new_lengths(kernel_backend):
    """Next-token cross entropy at sequence lengths that change each call (its backward's
    zeros are made like the log-softmax, float32, where torch.full of the fill 0 would be an
    int64 tensor the backward's kernel read as floats)."""
    w = randn(11, 8).requires_grad_()
    compiled = minicompile.compile(_cross_entropy_of_a_projection)
    for t in (9, 13, 6, 13):
        h, labels = randn(2, t, 8), torch.randint(0, 11, (2, t), device=DEVICE)
        labels[0, 3] = -100                     # ignored, as a padded position is
        grads = []
        for fn in (_cross_entropy_of_a_projection, compiled):
            w.grad = None
            loss = fn(h, labels, w)
            loss.backward()
            grads.append((loss, w.grad))
        assert_same(grads[1][0], grads[0][0])
        assert_same(grads[1][1], grads[0][1])
    assert minicompile.metrics.graphs == 2


def _mixup_loss(x, w, ya, yb, lam):
    logits = (x @ w).relu()
    return lam * F.cross_entropy(logits, ya) + (1 - lam) * F.cross_entropy(logits, yb)


def _scaled_tanh(x, w, n):
    return ((x @ w) * n).tanh().sum() / n


class _ReverseGradient(torch.autograd.Function):
    """A domain-adversarial network's gradient reversal layer: its scale changes every step."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.alpha * grad, None


def _adversarial_loss(x, w, alpha):
    return _ReverseGradient.apply(x @ w, alpha).square().sum()


@pytest.mark.parametrize("fn, values", [(_mixup_loss, (0.3, 0.71, 0.12, 0.9)), (_scaled_tanh, (3, 5, 7, 2)),
                                        (_adversarial_loss, (0.05, 0.15, 0.25, 0.35))],
                         ids=["float", "int", "autograd_function"])
def test_a_number_argument_that_changes_each_step_trains_in_one_generic_graph(
        kernel_backend, compiled_training, fn, values):
    """A float passed in that changes every step (a mixup weight, a loss scale) or an int (a
    multiplier) is an input of the joint graph, as automatic dynamic makes it in inference: the
    forward and the backward read it as a run-time number, so the second value compiles once
    and every later value runs the same code (compiled for each value, the frame ran eagerly
    after the recompile limit); one handed to an autograd.Function whose forward and backward
    use it as a value too. Loss and gradients as eager's at every value."""
    w = randn(6, 5).requires_grad_()
    compiled = minicompile.compile(fn)
    for v in values:
        x = randn(7, 6).requires_grad_()
        args = (torch.randint(0, 5, (7,), device=DEVICE), torch.randint(0, 5, (7,), device=DEVICE)) \
            if fn is _mixup_loss else ()
        results = []
        for f in (fn, compiled):
            w.grad = x.grad = None
            loss = f(x, w, *args, v)
            loss.backward()
            results.append((loss, w.grad, x.grad))
        for got, expected in zip(*reversed(results)):
            assert_same(got, expected)
    assert minicompile.metrics.graphs == 2 and minicompile.metrics.recompiles == 1
    generic = compiled_training[-1]
    assert not any("arg" in g and "==" in g for g in generic.shape_guards), generic.shape_guards
    assert len(generic.backward.kernels) > 0


def _focal_term(x, w, gamma):
    p = (x @ w).sigmoid()
    return ((1 - p) ** gamma * p.log()).sum() + (x ** gamma).nan_to_num(0.5).sum()


def _number_to_a_power(x, w, base):
    return (base ** (x @ w)).sum() + (x * torch.full(x.shape, base, device=DEVICE)).sum()


@pytest.mark.parametrize("fn", [_focal_term, _number_to_a_power], ids=["x ** k", "k ** x"])
def test_a_power_by_a_float_that_changes_each_step_trains_in_one_generic_graph(kernel_backend, fn):
    """A focal loss's gamma, changing every step, as a power's exponent (or a number raised to
    a tensor, a fill value): PyTorch's backward of a power reads the number as a double, which
    fixed its value (a graph per value), and torch.full took it as a size. The gradients are
    eager's at the values its kernels treat apart (0.5 and -0.5 are sqrt and rsqrt: -0.0's
    gradient is -inf; 0 gives zeros), at zeros, negatives and NaNs of the input."""
    w = randn(6, 5).requires_grad_()
    compiled = minicompile.compile(fn)
    special = torch.tensor([0.0, -0.0, -1.5, 2.0, 0.3, float("nan")], device=DEVICE)
    for v in (0.7, 0.5, 2.0, 0.0, -0.5, 1.0, 3.0, 2.5, 1.7):
        x = randn(7, 6)
        x[0] = special
        results = []
        for f in (fn, compiled):
            xs = x.clone().requires_grad_()
            w.grad = None
            loss = f(xs, w, v)
            loss.backward()
            results.append((loss, w.grad, xs.grad))
        for got, expected in zip(*reversed(results)):
            torch.testing.assert_close(got, expected, equal_nan=True)
    if DEVICE == "cpu":
        # (on a GPU, with torch 2.11, pow traced on fake CUDA tensors runs its reference
        # implementation, which compares the exponent with 2 and 0.5: a graph for each too)
        assert minicompile.metrics.graphs == 2 and minicompile.metrics.recompiles == 1


def test_a_generic_backward_not_made_for_the_calls_sizes_runs_its_graph_on_pytorchs_kernels(
        kernel_backend, compiled_training):
    """Where the compiled backward's own conditions on its inputs' sizes do not hold, the
    backward graph runs on PyTorch's kernels: eager's gradients still."""
    w = randn(8, 8).requires_grad_()

    def f(x):
        return (x[1:] @ w).tanh()
    compiled = minicompile.compile(f)
    compiled(randn(5, 8)).sum().backward()
    compiled(randn(7, 8)).sum().backward()
    generic = compiled_training[-1]
    generic.backward_holds = lambda *args: False
    x = randn(6, 8)
    w.grad = None
    compiled(x).square().sum().backward()
    got, w.grad = w.grad, None
    f(x).square().sum().backward()
    assert_same(got, w.grad)
    assert minicompile.metrics.graphs == 2


def _same_gradient_at_each_size(fn, param, calls):
    """fn(*args).backward(), eager then compiled, for each args in `calls`: param's gradient as
    eager's at every size."""
    compiled = minicompile.compile(fn)
    for args in calls:
        grads = []
        for f in (fn, compiled):
            param.grad = None
            f(*args).backward()
            grads.append(param.grad)
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-4)


def _shifted_squares(x, w):
    return (x * w)[:, 1:].pow(2).sum()


def test_a_reduction_over_a_sliced_dynamic_dim_sums_every_element(kernel_backend):
    """The weight's gradient sums over a dim of size s - 1 (a shifted sequence, as a causal
    LM's loss has): C++'s reduction split across threads bounded each thread's share by
    `s - 1 * chunk / 8`, unparenthesized, and summed almost nothing."""
    w = randn(6).requires_grad_()
    _same_gradient_at_each_size(_shifted_squares, w, [(randn(2, length, 6), w) for length in (300, 411, 257)])
    assert minicompile.metrics.graphs == 2


def _padded_to_a_multiple_of_four(x):
    padding = (-x.shape[1]) % 4
    return F.pad(x, (0, 0, 0, padding)).unflatten(1, (-1, 4)).relu().sum(2)


def test_a_sequence_padded_to_a_multiple_trains_at_every_size_in_one_graph(kernel_backend):
    """`unflatten(1, (-1, 4))` of a padded sequence: the joint trace asked whether eager's output
    was contiguous, of strides make_fx had not traced (an error), and each new length compiled
    a graph for its sizes."""
    compiled = minicompile.compile(_padded_to_a_multiple_of_four)
    for length in (5, 6, 7, 9, 13):
        x = randn(2, length, 6).requires_grad_()
        grad = randn(2, (length + 3) // 4, 6)
        expected = torch.autograd.grad(_padded_to_a_multiple_of_four(x), x, grad)[0]
        torch.testing.assert_close(torch.autograd.grad(compiled(x), x, grad)[0], expected)
    assert minicompile.metrics.graphs == 2


def _statistics_of_a_longer_row(x, lin):
    h = lin(x)
    b = torch.cat([h, h[:, :1]], dim=1)
    return (b.mean(1) + b.var(1) + b.std(1) + b.norm(dim=1) + torch.logsumexp(b, 1)).pow(2).sum()


def test_a_size_expression_as_a_kernel_constant_is_written_in_c(kernel_backend):
    """A size quotient used as a number in a backward kernel was printed as Python
    (`(s86//s11)`): the C++ compiler rejected the kernel and the graph ran on PyTorch's."""
    lin = torch.nn.Linear(6, 6).to(DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # ("a generated kernel did not compile")
        _same_gradient_at_each_size(_statistics_of_a_longer_row, lin.bias,
                                    [(randn(batch, length, 6), lin) for batch, length in [(2, 7), (3, 11), (5, 5)]])


def _shifted_squares_plus_bias(x, b):
    return (x + b)[:, 1:].pow(2).sum()


def test_a_saved_slice_of_a_larger_buffer_is_read_as_handed_over(kernel_backend):
    """The saved value is a slice (x + b)[:, 1:] of a buffer one row longer: the backward was
    compiled for the slice's strides in that buffer while the forward handed it over dense
    (uninitialized memory read: gradients of 1e32 and NaN at the size that compiled it)."""
    b = randn(6).requires_grad_()
    _same_gradient_at_each_size(_shifted_squares_plus_bias, b,
                                [(randn(batch, length, 6), b) for batch, length in [(2, 7), (3, 11), (5, 5), (4, 9)]])


class _Cache:
    def __init__(self):
        self.length = 0


def _projection_counting_its_length(x, lin, cache):
    cache.length += x.shape[1]              # (a sliding-window KV cache's cumulative length)
    return lin(x).pow(2).mean()


def test_a_size_the_graph_returns_keeps_training_generic(kernel_backend):
    """The graph also returns a number made from a dynamic size (stored on a Python object
    after it, a KV cache made on each call): computed from the inputs' sizes on each call, the
    joint graph generic, instead of a compile per size."""
    lin = torch.nn.Linear(6, 6).to(DEVICE)
    compiled = minicompile.compile(_projection_counting_its_length)
    for batch, length in [(2, 7), (3, 13), (4, 10), (5, 9)]:
        x, results = randn(batch, length, 6), []
        for fn in (_projection_counting_its_length, compiled):
            lin.weight.grad, cache = None, _Cache()
            fn(x, lin, cache).backward()
            results.append((lin.weight.grad, cache.length))
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-4)
        assert results[1][1] == results[0][1] == length
    assert minicompile.metrics.graphs == 2


def _rolled_rows(x, w):
    return (torch.roll(x * w, 7, 0) * torch.fft.fftshift(x, dim=0)).sum()


def test_a_roll_by_a_size_expression_trains_at_each_size(kernel_backend):
    """torch.roll's start (n - shift) % n, and fftshift's shift -(n // 2), are arithmetic on
    the dynamic size n: they had no lowering (an extern with no dtype: a crash in scheduling)."""
    w = randn(6).requires_grad_()
    _same_gradient_at_each_size(_rolled_rows, w, [(randn(length, 6), w) for length in (5, 9, 3)])


def _rfft_round_trip(x):
    return torch.fft.irfft(torch.fft.rfft(x, dim=0), n=x.shape[0], dim=0)


def test_a_size_of_a_complex_value_stays_a_size_in_the_backward(kernel_backend):
    """The rfft's backward slices its complex gradient to a length read from it (n - n//2 - 1):
    that size read ran as PyTorch's op, as complex ops do, and its result, a tensor box, was
    baked into a slice (TypeError in the wrapper at the second size)."""
    compiled = minicompile.compile(_rfft_round_trip)
    for length in (5, 7, 12):
        x, g, grads = randn(length, 4), randn(length, 4), []
        for fn in (_rfft_round_trip, compiled):
            leaf = x.clone().requires_grad_()
            fn(leaf).backward(g)
            grads.append(leaf.grad)
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(DEVICE != "cuda", reason="a CPU tensor beside CUDA ones needs a GPU")
def test_a_zero_dim_cpu_constant_in_a_gpu_training_graph_is_compiled():
    """transformers' sliding-window masks compare positions with torch.tensor(window), a 0-dim
    CPU tensor, in a CUDA graph; the joint trace keeps it as a constant, which eager reads as a
    number: forward and backward are generated code, gradients eager's."""
    def loss(x, w):
        positions = torch.arange(x.shape[-2], device=x.device)
        near = (positions[:, None] - positions[None, :]) < torch.tensor(3)
        return (x @ w).masked_fill(~near, -1e4).softmax(-1).sum()
    compiled = minicompile.compile(loss)
    minicompile.metrics.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (6, 11):
            x, w = randn(n, 4).requires_grad_(), randn(4, n).requires_grad_()
            expected, got = loss(x, w), compiled(x, w)
            torch.testing.assert_close(got, expected)
            for e, g in zip(torch.autograd.grad(expected, (x, w)), torch.autograd.grad(got, (x, w))):
                torch.testing.assert_close(g, e)
    assert not [w for w in caught if "PyTorch's kernels" in str(w.message)]
    assert minicompile.metrics.backward_kernels > 0


def test_a_step_under_detect_anomaly_is_compiled_and_checks_its_gradients():
    """(a first debugging step) The joint trace runs with anomaly mode off; the compiled
    backward's gradients are checked as any Function's: a NaN raises, as in eager."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(13, 8), nn.Tanh(), nn.Linear(8, 3))
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(twin)
    x = torch.randn(6, 13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # (anomaly mode warns that it is on)
        with torch.autograd.detect_anomaly():
            compiled(x).sum().backward()
            model(x).sum().backward()
            for p, q in zip(model.parameters(), twin.parameters()):
                torch.testing.assert_close(q.grad, p.grad)
            bad = x.clone()
            bad[0, 0] = float("nan")
            for m in (model, compiled):
                with pytest.raises(RuntimeError, match="nan"):
                    m(bad).sum().backward()
    assert minicompile.metrics.kernels > 0


def _sets_gradients_by_hand(model, x):
    loss = model(x).pow(2).mean()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    for p, g in zip(model.parameters(), grads):
        p.grad = g * 2
    total = sum(p.grad.sum() for p in model.parameters())        # (read back in the trace)
    model.bias.grad = None
    return loss.detach(), total


def test_gradients_assigned_by_hand_are_set_after_the_graph():
    """`p.grad = g` over a model's parameters (a gradient transformed by hand): one graph, the
    gradients set as eager sets them, later reads in the frame seeing them; a gradient of another
    shape raises eager's error."""
    torch.manual_seed(0)
    model = nn.Linear(13, 3)
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(_sets_gradients_by_hand)
    minicompile.metrics.reset()
    for _ in range(2):
        x = torch.randn(5, 13)
        got, expected = compiled(twin, x), _sets_gradients_by_hand(model, x)
        for g, e in zip(got, expected):
            assert_same(g, e)
        assert_same(twin.weight.grad, model.weight.grad)
        assert twin.bias.grad is None and model.bias.grad is None
    assert (minicompile.metrics.graphs, minicompile.metrics.graph_breaks) == (1, 0)

    def wrong_shape(p):
        p.grad = torch.zeros(2)
    for fn in (wrong_shape, minicompile.compile(wrong_shape)):
        with pytest.raises(RuntimeError, match="same size"):
            fn(nn.Parameter(torch.randn(3)))


def test_a_float_argument_handed_past_a_graph_break_keeps_one_generic_graph():
    """A training step with a break in it (a print, a log line) whose float changes every call:
    the graph before the break returns the float for the code after it, and the joint trace
    took no float output, so that graph was compiled for each value (8 graphs in 6 calls,
    then the frame ran eagerly)."""
    layer = nn.Linear(13, 5).to(DEVICE)

    def step(x, lam):
        h = layer(lam * x).tanh()
        print(end="")
        return (h * lam).pow(2).sum()
    compiled = minicompile.compile(step)
    minicompile.metrics.reset()
    for lam in (0.3, 0.7, 0.45, 0.9, 0.1, 0.2):
        x = randn(6, 13)
        grads = []
        for f in (step, compiled):
            layer.zero_grad()
            f(x, lam).backward()
            grads.append(layer.weight.grad.clone())
        assert_same(grads[1], grads[0])
    assert minicompile.metrics.graphs <= 4


def test_floats_in_a_tuple_argument_are_read_one_by_one():
    """Loss weights passed as a tuple, `(lam, T)`: each float is taken as a float argument is
    (symbolic once it changes); the tuple was guarded whole, a graph per value."""
    layer = nn.Linear(13, 5).to(DEVICE)

    def step(x, c):
        return (layer(c[0] * x) / c[1]).pow(2).mean()
    compiled = minicompile.compile(step)
    minicompile.metrics.reset()
    for v in (0.3, 0.7, 0.45, 0.9, 0.1):
        x = randn(6, 13)
        grads = []
        for f in (step, compiled):
            layer.zero_grad()
            f(x, (v, 1.5)).backward()
            grads.append(layer.weight.grad.clone())
        assert_same(grads[1], grads[0])
    assert minicompile.metrics.graphs <= 2


def test_an_input_made_to_require_grad_in_the_step_is_a_graph_break_there():
    """FGSM's `x = x.clone().requires_grad_()`, then `x.grad` read after backward: a graph break
    at requires_grad_ (TorchDynamo's too), so that x is a real leaf whose gradient the code
    reads; the frame ran as Python. Gradients, the perturbed loss and x.grad equal eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 11), nn.Tanh(), nn.Linear(11, 3)).to(DEVICE)
    twin = copy.deepcopy(model)

    def fgsm_step(net, x, y):
        x = x.clone().requires_grad_(True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        perturbed = (x + 0.1 * x.grad.sign()).detach()
        return F.cross_entropy(net(perturbed), y), x.grad

    x, y = randn(6, 7), torch.randint(0, 3, (6,), device=DEVICE)
    minicompile.metrics.reset()
    got = minicompile.compile(fgsm_step)(model, x, y)
    expected = fgsm_step(twin, x, y)
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    for p, q in zip(model.parameters(), twin.parameters()):
        assert_same(p.grad, q.grad)
    assert minicompile.metrics.graphs >= 2


def test_detach_in_place_of_a_tensor_the_graph_made_is_no_graph_break():
    """`s.detach_()` in a forward (a stop-gradient written in place): from there on s carries no
    gradient, and a view taken before keeps its history, as in eager; no graph break (it broke,
    its reason wrongly saying detach_ changes sizes)."""
    w = randn(7, 7).requires_grad_()

    def f(x):
        h = x @ w
        s = h * 1.5
        before = s[0]
        s.detach_()
        return (torch.tanh(h) + s).sum() + before.sum() * 2, s.requires_grad

    x = randn(5, 7)
    expected = f(x)
    expected[0].backward()
    expected_grad, w.grad = w.grad.clone(), None
    minicompile.metrics.reset()
    got = minicompile.compile(f)(x)
    got[0].backward()
    assert_same(got[0], expected[0])
    assert got[1] is expected[1] is False
    assert_same(w.grad, expected_grad)
    assert minicompile.metrics.graph_breaks == 0
