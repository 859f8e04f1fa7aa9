"""Python as TorchDynamo's own tests write it: each function gives eager's result (and, where it
is an iterator or a dict view, eager's type and liveness), in no more graphs than Dynamo's
explain finds for it."""
import collections
import functools
import itertools
import operator
import warnings

import numpy as np
import pytest
import torch

import minicompile


def quiet_break():
    print("", end="")


def dict_views_are_live(x):
    d = {"a": x}
    keys, values = d.keys(), d.values()
    d["b"] = x * 2
    return len(keys), list(keys), sum(values), "b" in keys


def dict_view_across_a_break(x):
    d = {"a": x}
    items = d.items()
    quiet_break()
    d["b"] = x + 1
    return [k for k, _ in items], type(items).__name__


def iterator_passed_to_a_call_at_a_break(x):
    it = iter([x, x + 1, x + 2])
    quiet_break()
    return sum(it)


def iterator_keeps_its_type(x):
    it = iter([x, x + 1])
    quiet_break()
    next(it)
    return type(it).__name__, next(it)


def numpy_scalars_and_info(x):
    return x * np.float32(2.0) + np.iinfo(np.int8).max + float(np.finfo(np.float32).eps)


def dict_fromkeys(x):
    d = dict.fromkeys(["a", "b"], 1)
    return x * d["a"] + d["b"]


def itertools_loops(x):
    total = x * 0
    for a, b in itertools.product([1, 2], [3]):
        total = total + x * a * b
    for v in itertools.chain([1], [2, 3]):
        total = total + v
    for c in itertools.combinations([1, 2, 3], 2):
        total = total + c[0]
    for v in itertools.islice([5, 6, 7, 8], 2):
        total = total + v
    return total


def partial_and_reduce(x):
    add3 = functools.partial(operator.add, 3)
    return functools.reduce(operator.mul, [x, x, 2]) + add3(1)


def in_sets_and_lists(x):
    s, l = {1, 2}, [3, 4]
    return x * (1 in s) + x * (5 in l) + x * (3 in l)


def tuple_plus_constant_tuple(x):
    t = (x,) + (1, 2)
    return t[0] * t[1] + t[2]


class Point:
    def __init__(self, v):
        self.v = v


def identity_and_equality_of_user_objects(x):
    a, c = Point(1), Point(1)
    b = a
    return x * (a == b) + x * (a is c) + x * (a != c) + x * (a is not c)


def import_inside(x):
    import math
    from operator import mul
    return mul(x, math.pi)


def augmented_assignment_on_an_input(x):
    x += 1
    return x * 2


def namedtuple_made_and_read(x):
    Pair = collections.namedtuple("Pair", "a b")
    p = Pair(x, 2)
    return p.a * p.b + p[1]


def class_made_with_type(x):
    Box = type("Box", (), {"scale": 2})
    box = Box()
    box.value = x * box.scale
    return box.value + 1


FUNCTIONS = [dict_views_are_live, dict_view_across_a_break, iterator_passed_to_a_call_at_a_break,
             iterator_keeps_its_type, numpy_scalars_and_info, dict_fromkeys, itertools_loops,
             partial_and_reduce, in_sets_and_lists, tuple_plus_constant_tuple,
             identity_and_equality_of_user_objects, import_inside, augmented_assignment_on_an_input,
             namedtuple_made_and_read, class_made_with_type]


def dict_union(x):
    kwargs = {"scale": 2}
    merged = kwargs | {"limit": (0.0, float("inf"))}      # Mamba2's fused kwargs
    alias = merged
    alias |= {"shift": x}
    return x * merged["scale"] + merged["shift"], sorted(merged)


def sets_changed_in_place(x):
    s = {1, 2, 3}
    alias = s
    alias |= {7}
    alias -= {1}
    alias ^= {2, 9}
    return x + sum(s), sorted(s)


def list_made_by_repetition_changed(x):
    pad = [(0, 0)] * x.dim()                              # LongT5's padding of one dim
    pad[0] = (1, 2)
    return torch.nn.functional.pad(x, sum(pad[::-1], ())), pad


def containers_compared_with_other_kinds(x):
    rope = {"full": 1}
    return x * 2, (rope == "longrope", rope != None, [x] == (x,), (1, 2) == [1, 2])  # noqa: E711


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.allclose(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(p, q) for p, q in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_python_as_eager_in_no_more_graphs_than_dynamo(fn):
    compiled = minicompile.compile(fn)
    for _ in range(2):
        x = torch.randn(3)
        expected = fn(x.clone())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert same(compiled(x.clone()), expected)
    x = torch.randn(3)
    ours = minicompile.explain(fn)(x.clone())
    torch._dynamo.reset()
    theirs = torch._dynamo.explain(fn)(x.clone())
    torch._dynamo.reset()
    assert ours.graph_count <= max(theirs.graph_count, 1) + (1 if "break" in fn.__name__ else 0)


class Interface(collections.abc.MutableMapping):
    """Hugging Face's GeneralInterface (ALL_ATTENTION_FUNCTIONS): a mapping whose __getitem__
    raises KeyError for a name it does not hold, and get() with a default on top."""
    _global = {"double": lambda x: x * 2}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        return self._local[key] if key in self._local else self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global) + len(self._local)

    def get_interface(self, name, default):
        return super().get(name, default)


FUNCTIONS_OF = Interface()


def mapping_get_with_a_default(x):
    eager = FUNCTIONS_OF.get_interface("eager", torch.tanh)       # not held: the default
    return eager(x) + FUNCTIONS_OF.get_interface("double", None)(x), "eager" in FUNCTIONS_OF


def numpy_math_on_numbers(x):
    y = x * 2
    y *= np.sqrt(32)                                           # CTRL's np.sqrt(d_model)
    return y + np.log(2.0) * np.float32(1.5)


@pytest.mark.parametrize("fn", [numpy_math_on_numbers, mapping_get_with_a_default, dict_union, sets_changed_in_place, list_made_by_repetition_changed,
                                containers_compared_with_other_kinds], ids=lambda f: f.__name__)
def test_operators_on_containers_as_eager_without_a_break(fn):
    compiled = minicompile.compile(fn)
    for _ in range(2):
        x = torch.randn(3, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert same(compiled(x.clone()), fn(x.clone()))
    assert minicompile.metrics.graph_breaks == 0 and minicompile.metrics.graphs == 1


def test_an_iterator_from_the_caller_is_advanced_as_in_eager():
    def takes(x, it):
        a = next(it)
        quiet_break()
        return x * a + next(it)
    compiled = minicompile.compile(takes)
    for _ in range(2):
        mine, theirs = iter([1, 2, 3, 4]), iter([1, 2, 3, 4])
        x = torch.randn(3)
        assert torch.allclose(compiled(x, mine), takes(x, theirs))
        assert list(mine) == list(theirs) == [3, 4]


def test_explain_keeps_the_reason_of_a_break_with_no_graph():
    def f(x):
        quiet_break()
        return x + 1
    out = minicompile.explain(f)(torch.randn(2))
    assert any("print" in str(r.reason) for r in out.break_reasons)


def class_of_plain_values(x):
    items, fn = [1, 2], torch.relu
    return x * len(items.__class__.__name__) + len(fn.__class__.__name__)


@pytest.mark.parametrize("grad", [False, True])
def test_torch_python_helpers_that_ask_about_tensors_are_traced(grad):
    # nn.MultiheadAttention's fast-path checks: Python helpers of torch's (_arg_requires_grad,
    # _check_arg_device) inlined, `query is key` guarded, `self.modules()` walked at trace time
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(24, 4, dim_feedforward=40, batch_first=True).eval()
    attention = torch.nn.MultiheadAttention(24, 4, batch_first=True).eval()
    x, y = torch.randn(3, 7, 24), torch.randn(3, 5, 24)
    with torch.set_grad_enabled(grad):
        for module, args in ((layer, (x,)), (attention, (x, x, x)), (attention, (x, y, y))):
            ours = minicompile.explain(module)(*args)
            assert ours.graph_count == 1 and ours.graph_break_count == 0, ours.break_reasons
        for module, calls in ((layer, [(x,)]), (attention, [(x, x, x), (x, y, y), (y, x, x)])):
            compiled = minicompile.compile(module)
            for args in calls:
                torch.testing.assert_close(compiled(*args), module(*args), rtol=1e-4, atol=1e-5)
    assert same(minicompile.compile(class_of_plain_values)(x), class_of_plain_values(x))
    assert minicompile.explain(class_of_plain_values)(x).graph_count == 1


class Walks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        self.b.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        for name, m in self.named_modules(prefix="root"):
            if isinstance(m, torch.nn.Linear):
                x = m(x) + len(name)
        x = x * sum(p.sum() for p in self.parameters())
        return x, [n for n, _ in self.named_buffers()], len(list(self.children()))


def test_loops_over_a_modules_tree_unroll_and_follow_changes_to_it():
    torch.manual_seed(0)
    model = Walks()
    compiled = minicompile.compile(model)
    x = torch.randn(2, 4)
    assert minicompile.explain(model)(x).graph_count == 1
    for change in (None, lambda: setattr(model, "c", torch.nn.Linear(4, 4)),
                   lambda: setattr(model.b, "0", model.a)):       # a shared module: walked once
        if change:
            change()
        got, want = compiled(x), model(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]
