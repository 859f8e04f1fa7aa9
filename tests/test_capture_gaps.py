"""Generator expressions, sets, super(), objects made in the frame, and context managers other
than grad mode: each compared with eager (fresh inputs) and with torch._dynamo.explain (graph
count, break count, ops per graph)."""
import collections
import contextlib
import copy
import dataclasses
import enum
import os
import sys
import threading

import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree

import minicompile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import assert_same  # noqa: E402
from test_capture_control import compare  # noqa: E402


def r(*shape):
    return torch.randn(*shape)


one = lambda: (r(4, 5),)  # noqa: E731
two = lambda: (r(4, 5), r(4, 5))  # noqa: E731


def gen_sum(x):
    return sum(x * i for i in range(3))


def gen_tuple(x, y):
    return tuple(t.relu() for t in (x, y) if t.dim() == 2)


def gen_any_all(x):
    if any(d > 4 for d in x.shape) and all(d > 0 for d in x.shape):
        return x + 1
    return x - 1


def gen_join_and_max(x):
    name = "-".join(str(d) for d in x.shape)
    return x * max(d for d in x.shape) + len(name)


def set_comprehension(x):
    s = {d % 3 for d in x.shape}
    s.add(7)
    return x * len(s) + (1 if 7 in s else 0)


def set_display(x, y):
    dims = {x.dim(), y.dim(), 2}
    return x + y if len(dims) == 1 else x - y


class Base:
    def __init__(self, scale):
        self.scale = scale


class Affine(Base):
    def __init__(self, scale, shift):
        super().__init__(scale)
        self.shift = shift

    def apply(self, x):
        return x * self.scale + self.shift


def user_class_with_super(x, y):
    a = Affine(2.0, y)
    return a.apply(x).sin()


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


def dataclass_made_inside(x, y):
    p = Pair(x.relu(), y)
    return p.a * p.b + p.a


def object_returned(x, y):
    return Affine(3.0, x + y)          # rebuilt after the graph: a new object each call


class ReluLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x).relu()


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = ReluLinear(5, 5)
        self.b = ReluLinear(5, 5)

    def forward(self, x):
        return self.b(self.a(x)) + x


LOCK = threading.Lock()


def lock_ctx(x):
    x = x + 1
    with LOCK:
        x = x * 2
    return x - 1


class Loud:
    def __enter__(self):
        print("enter")
        return self

    def __exit__(self, *exc):
        print("exit")
        return False


def loud_ctx(x):
    x = x + 1
    with Loud():
        x = x * 2
    return x - 1


@contextlib.contextmanager
def tagged():
    yield "tag"


def generator_ctx(x):
    x = x + 1
    with tagged() as t:
        x = x * len(t)
    return x - 1


CASES = [
    (gen_sum, one), (gen_tuple, two), (gen_any_all, one), (gen_join_and_max, one),
    (set_comprehension, one), (set_display, two),
    (user_class_with_super, two), (dataclass_made_inside, two),
    # context managers the capture does not model: the frame runs eagerly, as Dynamo skips it
    (lock_ctx, one), (loud_ctx, one),
]


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_matches_eager_and_dynamo(fn, make, capsys):
    compare(fn, make)


def test_unmodelled_context_manager_runs_the_frame_eagerly():
    """The frame is skipped (its own ops run eagerly, as Dynamo skips it), the lock entered and
    left for real; the calls it makes would be compiled on their own."""
    import minicompile
    ours = minicompile.explain(lock_ctx)(r(4, 5))
    assert (ours.graph_count, ours.graph_break_count) == (0, -1)
    assert any("with" in str(b) for b in ours.break_reasons)
    assert not LOCK.locked()


def test_contextmanager_generator_is_correct():
    # Dynamo inlines contextlib.contextmanager; minicompile runs the block for real (counts
    # differ, results do not)
    import minicompile
    compiled = minicompile.compile(generator_ctx, backend="eager")
    for _ in range(2):
        x = r(4, 5)
        torch.testing.assert_close(compiled(x), generator_ctx(x))


def test_object_made_inside_is_rebuilt():
    import minicompile
    compiled = minicompile.compile(object_returned, backend="eager")
    x, y = two()
    a, b = compiled(x, y), compiled(x, y)
    assert isinstance(a, Affine) and a is not b and a.scale == 3.0
    torch.testing.assert_close(a.shift, x + y)


def test_super_forward_in_module_subclass():
    torch.manual_seed(0)
    compare(Stack(), one)


class ChannelsFirstNorm(nn.LayerNorm):
    """SqueezeBERT's layer norm: the parent's forward called through the class."""

    def forward(self, x):
        return nn.LayerNorm.forward(self, x.transpose(0, 1)).transpose(0, 1)


def test_forward_of_a_torch_module_class_called_with_self():
    compare(ChannelsFirstNorm(4), one)


class CastsItsClassifier(nn.Module):
    """Switch Transformers' router: its classifier cast to the router's dtype on every call."""

    def __init__(self):
        super().__init__()
        self.classifier = nn.Linear(5, 3)
        self.dtype = torch.float32

    def forward(self, x):
        self.classifier = self.classifier.to(self.dtype)
        return self.classifier(x.to(self.dtype)).softmax(-1)


def test_module_cast_to_the_dtype_it_has():
    # the graph and break counts of Dynamo, whose graph also holds the ops of Module.to's walk
    import minicompile
    compare(CastsItsClassifier(), one, check_ops=False)
    minicompile.metrics.reset()
    minicompile.compile(CastsItsClassifier())(*one())
    assert minicompile.metrics.graph_breaks == 0


class Doubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x):
        return x * 2 + self.lin(self.norm(x)).tanh()


class LockedStack(nn.Module):
    """Its forward is skipped (an unmodelled context manager) and calls torch.nn containers."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Doubler(), Doubler())
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                             1, enable_nested_tensor=False)

    def forward(self, x):
        with LOCK:
            return self.encoder(self.blocks(x))


def test_torch_containers_called_from_a_skipped_frame_are_compiled_on_their_own():
    """As TorchDynamo's frame hook compiles torch.nn's frames: an nn.Sequential of the user's
    blocks (which ran as plain Python: its forward is torch's) and an nn.TransformerEncoder
    (whose ops ran eagerly in the skipped frame) are each compiled, in training too."""
    import minicompile
    torch.manual_seed(0)
    model = LockedStack()
    twin = copy.deepcopy(model)
    minicompile.reset()
    minicompile.metrics.reset()
    compiled = minicompile.compile(model)
    for _ in range(2):
        x = torch.randn(2, 5, 8)
        got, want = compiled(x), twin(x)
        torch.testing.assert_close(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert minicompile.metrics.graphs == 2 and minicompile.metrics.backward_kernels > 0
    assert not LOCK.locked()


TABLE = {f"key{i}": i for i in range(40)}


def test_a_break_reason_shows_a_few_items_of_a_large_container():
    """A break's reason is one line: a container in it (a registry dict) shows its first items
    and how many more, not every one."""
    class Key:
        pass

    def f(x):
        return x * TABLE[Key()]
    with pytest.raises(minicompile.Unsupported) as caught:
        minicompile.compile(f, fullgraph=True)(torch.randn(3))
    assert "... (34 more)" in caught.value.reason and len(caught.value.reason) < 400


State = collections.namedtuple("State", "h c")


def pytree_flatten_map_unflatten(x, y):
    tree = {"a": x, "b": [y * 2, (x, 3)], "s": State(x + 1, None)}
    leaves, spec = pytree.tree_flatten(tree)
    doubled = pytree.tree_unflatten([v * 2 if isinstance(v, torch.Tensor) else v for v in leaves], spec)
    mapped = pytree.tree_map(lambda t: t.sin() if isinstance(t, torch.Tensor) else t, doubled)
    return mapped["b"][1][0] + mapped["s"].h * mapped["b"][1][1], len(pytree.tree_leaves(mapped)), \
        spec.num_leaves, pytree.tree_structure(mapped) == spec


def test_pytree_calls_are_traced():
    """torch's pytree helpers (torch's own code calls them: associative_scan) are modelled on
    the trace's values: leaves in pytree's order, the spec a constant, new containers."""
    compare(pytree_flatten_map_unflatten, lambda: (r(4, 5), r(4, 5)), check_ops=False)


def test_pytree_of_a_container_it_does_not_model_runs_pytrees_code():
    """An OrderedDict (registered with pytree, not modelled by these calls) and a torch.Size
    of leaves: pytree's own code is traced (or breaks, at what it cannot): eager's results."""
    def f(x):
        leaves, spec = pytree.tree_flatten(collections.OrderedDict(a=x, b=x + 1))
        return [t * 2 for t in leaves], pytree.tree_unflatten(leaves, spec)["b"], \
            pytree.tree_map(lambda n: n + 1, x.shape)
    x = r(3, 4)
    expected, got = f(x), minicompile.compile(f)(x)
    assert_same(expected, got)


def linear_recurrence(left, right):         # transformers' Mamba: h_t = a_t * h_(t-1) + b_t
    a_left, b_left = left
    a_right, b_right = right
    return a_left * a_right, a_right * b_left + b_right


def test_associative_scan_is_traced_as_one_graph_for_a_range_of_lengths():
    """torch's associative_scan (what Mamba layers call when compiled) runs its combine function
    under torch.vmap in eager; traced, on the slices themselves, as a scan whose steps depend
    on the length only through their count: eager's values, reversed or not, over any dim, one
    graph for lengths 5 to 8 once the length is dynamic, and lengths 1 and 2 too."""
    from torch._higher_order_ops.associative_scan import associative_scan

    def f(a, b, x):
        states = associative_scan(linear_recurrence, (a.sigmoid(), b), dim=2, combine_mode="generic")
        sums = associative_scan(lambda p, q: {"x": p["x"] + q["x"]}, {"x": x}, dim=-1, reverse=True,
                                combine_mode="generic")
        return states, sums
    minicompile.metrics.reset()
    compiled = minicompile.compile(f)
    for n in (5, 6, 7, 8, 1, 2):
        args = (r(2, 3, n, 4), r(2, 3, n, 4), r(3, n))
        assert_same(f(*args), compiled(*args))
    assert minicompile.metrics.graph_breaks == 0 and minicompile.metrics.graphs <= 4


def test_associative_scan_of_a_combine_that_is_not_pointwise_breaks_the_graph():
    """A combine function vmap must batch (a product of matrices) is not traced on slices: a
    graph break that names the op, and eager's values. Eager's errors stay eager's."""
    from torch._higher_order_ops.associative_scan import associative_scan

    def products(x):
        return associative_scan(lambda p, q: p @ q, x * 2, dim=0, combine_mode="generic")
    x = r(5, 3, 3)
    reasons = minicompile.explain(products)(x).break_reasons
    assert "not pointwise" in str(reasons[0]) and "matmul" in str(reasons[0])
    assert_same(products(x), minicompile.compile(products)(x))
    with pytest.raises(ValueError, match="need to be on CUDA"):
        minicompile.compile(lambda x: associative_scan(lambda p, q: p + q, x, 0))(r(4))


def aten_overloads_called(x):
    return torch.ops.aten.cumsum.default(x, 0) + torch.ops.aten.mul.Tensor(x, x) + torch.ops.aten.sin(x)


def test_aten_overloads_are_called_in_the_graph():
    """torch.ops.aten.cumsum.default (an overload of an op packet) is a call in the graph, as
    the packet is, not a frame that runs eagerly."""
    compare(aten_overloads_called, lambda: (r(4, 5),))


class Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2
    TEST = 3


def test_sets_of_enum_members_are_traced():
    """`mode in {Mode.TRAIN, Mode.EVAL}` (a set display of members, a common idiom) and a set
    comprehension over an Enum: sets of objects that are their own key, as dict literals are;
    each mode its own graph (the guard checks which member was passed), eager's results."""
    def f(x, mode):
        early = {m for m in Mode if m.value < 3}
        if mode in {Mode.TRAIN, Mode.EVAL}:
            x = x * 2
        return x + len(early) if mode in early else x - 1
    minicompile.metrics.reset()
    compiled = minicompile.compile(f)
    for mode in (Mode.TRAIN, Mode.TEST, Mode.EVAL, Mode.TEST):
        x = r(3, 4)
        torch.testing.assert_close(compiled(x, mode), f(x, mode))
    assert minicompile.metrics.graph_breaks == 0 and minicompile.metrics.graphs == 3
