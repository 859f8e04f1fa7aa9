"""Python that users write around tensors, run compiled and eagerly: the same results, the same
changes to what the call was given, the same exceptions, call after call as what the trace
relied on changes (an alias, a type, an instance's attribute, a cache, a container iterated)."""
import abc
import collections
import collections.abc
import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import itertools
import math
import operator
import random
import types
import typing

import pytest
import torch

import minicompile


def assert_same(a, b):
    """Equal values (NaN where eager has NaN, zeros of eager's sign) of the same types."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype
        torch.testing.assert_close(a, b, equal_nan=True)
        assert torch.equal(a.signbit(), b.signbit())
    elif isinstance(a, (tuple, list, dict)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in (zip(a.values(), b.values()) if isinstance(a, dict) else zip(a, b)):
            assert_same(x, y)
        if isinstance(a, dict):
            assert list(a) == list(b)
    else:
        assert type(a) is type(b) and a == b, (a, b)


def outcome(fn, *args, **kwargs):
    """What a call gives: its result, or the type of what it raised."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        return type(e)


def same_calls(fn, calls):
    """Each call (a function of `fn` returning what to compare) gives eager's outcome."""
    compiled = minicompile.compile(fn)
    for call in calls:
        assert_same(outcome(call, compiled), outcome(call, fn))


X = torch.randn(3)


def is_(x, a, b):
    return x + 1, a is b


def test_is_between_two_of_the_calls_lists_is_guarded():
    one = [1]
    same_calls(is_, [lambda f: f(X, one, one), lambda f: f(X, one, [1]), lambda f: f(X, one, one)])


def scaled(x, t):
    return x * t[0], type(t[0]).__name__


def times(x, s):
    return x * s


def keys(x, d):
    return x + 1, list(d)


def test_constants_are_guarded_by_type_sign_and_nan():
    """1, 1.0 and True are equal, -0.0 equals 0.0, NaN equals nothing: the guard tells them
    apart (a tensor in the tuple is a miss, not its truth value)."""
    same_calls(scaled, [lambda f, t=t: f(X, t) for t in [(1,), (1.0,), (True,), (torch.tensor(2.0),), (1,)]])
    same_calls(times, [lambda f, s=s: f(X, s) for s in [0.0, -0.0, float("nan"), float("nan"), 0.0]])
    same_calls(keys, [lambda f, d=d: f(X, d) for d in [{1: 1}, {1.0: 1}, {True: 1}]])


def products(x, *args):
    out = x
    for a in args:
        out = out * a
    return out


def test_varargs_that_change_from_numbers_to_tensors():
    same_calls(products, [lambda f: f(X, 2), lambda f: f(X, X, 2.5), lambda f: f(X, 2)])


def repeats(x):
    return list(itertools.repeat(x, 2)), list(itertools.repeat([1, 2], 2)), list(itertools.repeat(x, times=0))


def test_itertools_repeat_repeats_its_object():
    same_calls(repeats, [lambda f: f(X)])


def counts(x):
    x.counter = getattr(x, "counter", 0) + 1
    return x + x.counter


def test_an_attribute_a_tensor_is_given_is_read_again_each_call():
    t, u = torch.zeros(2), torch.zeros(2)
    compiled = minicompile.compile(counts)
    for _ in range(3):
        assert_same(compiled(t), counts(u))
    assert t.counter == u.counter == 3


class Adds:
    def go(self, x):
        return x + 1

    def __call__(self, x):
        return x + 2


class UsesHelper(torch.nn.Module):
    def forward(self, x):
        return self.helper(x)

    def helper(self, x):
        return x + 1


def goes(x, obj):
    return obj.go(x), obj(x)


def test_a_method_set_on_the_instance_or_a_call_patched_on_the_class_is_seen():
    a, b = Adds(), Adds()
    same_calls(goes, [lambda f: f(X, a)])
    a.go = b.go = lambda v: v - 7
    same_calls(goes, [lambda f: f(X, a)])
    saved = Adds.__call__
    try:
        Adds.__call__ = lambda self, x: x * 0 + 9
        same_calls(goes, [lambda f: f(X, b)])
    finally:
        Adds.__call__ = saved
    m = UsesHelper()
    compiled = minicompile.compile(m)
    assert_same(compiled(X), X + 1)
    m.helper = lambda v: v * 3
    assert_same(compiled(X), X * 3)


def factory(x):
    return torch.zeros(2).dtype, (x * torch.tensor(1.5)).dtype


def test_the_default_dtype_is_part_of_the_guard():
    compiled = minicompile.compile(factory)
    x = torch.ones(2, dtype=torch.int64)
    assert compiled(x) == factory(x)
    with contextlib.ExitStack() as stack:
        torch.set_default_dtype(torch.float64)
        stack.callback(torch.set_default_dtype, torch.float32)
        assert compiled(x) == factory(x) == (torch.float64, torch.float64)


SCALE = {"k": 2}


@functools.lru_cache(maxsize=None)
def cached_scale(n):
    return SCALE["k"] * n


def cached(x):
    return x * cached_scale(3)


def test_a_cached_function_is_called_again_after_its_cache_is_cleared():
    compiled = minicompile.compile(cached)
    assert_same(compiled(X), X * 6)
    SCALE["k"] = 10
    cached_scale.cache_clear()
    try:
        assert_same(compiled(X), X * 30)
    finally:
        SCALE["k"] = 2
        cached_scale.cache_clear()


def takes(x, **kw):
    return kw


def merges(x, d):
    return takes(x, **d, **{"a": 3})


class Slots:
    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a


def sets_a_slot(x, s):
    try:
        s.b = 5
    except AttributeError:
        return x - 1
    return x + 1


def test_errors_python_raises_are_raised():
    """A key given twice to a call; an attribute a __slots__ class has no slot for."""
    same_calls(merges, [lambda f: f(X, {"a": 1}), lambda f: f(X, {"b": 1})])
    same_calls(sets_a_slot, [lambda f: f(X, Slots(1))])


class Slices(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.ReLU())
        self.layers = torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.Tanh()])

    def forward(self, x):
        return self.seq[1:](self.seq[:1](x)), type(self.layers[1:]).__name__, type(self.seq[:2]).__name__


class Wrapper(torch.nn.Module):
    """Forwards what it lacks to the module it wraps (a common adapter's __getattr__)."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, x):
        return x @ self.weight.t() + self.bias


class Decorated:
    def __init__(self, k):
        self.k = k

    @minicompile.compile
    def scale(self, x):
        return x * self.k


@pytest.mark.parametrize("make", [Slices, Wrapper])
def test_modules_that_slice_sequentials_or_forward_attributes(make):
    m = make()
    x = torch.randn(2, 4)
    assert_same(minicompile.compile(m)(x), m(x))


def test_a_method_decorated_in_its_class_is_bound_to_its_instance():
    assert_same(Decorated(3).scale(X), X * 3)


def grows(x, items):
    for v in items:
        if len(items) < 5:
            items.append(v + 1)
    return x + len(items), items


def writes_ahead(x, items):
    out = []
    for v in items:
        items[-1] = v * 10
        out.append(v)
    return out


def updates_values(x, d):
    out = []
    for k, v in d.items():
        out.append(v)
        d["b"] = 100
    return out


def adds_keys(x, d):
    try:
        for k in d:
            d[k + "x"] = 1
    except RuntimeError:
        return x - 1
    return x + 1


def after_the_end(x, d, items):
    it, li = iter(d), iter(items)
    a, b = list(it), list(li)
    d["new"], _ = 1, items.append(5)
    return x + len(a), next(it, None), b, next(li, None)


def returns_an_iterator(x, items):
    return iter(items)


@pytest.mark.parametrize("fn, make", [
    (grows, lambda: ([1],)), (writes_ahead, lambda: ([1, 2, 3],)),
    (updates_values, lambda: ({"a": 1, "b": 2},)), (adds_keys, lambda: ({"a": 1},)),
    (after_the_end, lambda: ({"a": 1}, [1, 2]))])
def test_loops_see_the_container_as_it_changes(fn, make):
    """A list's iterator reads it as the loop goes; a dict's raises if its size changes; a
    view's values are read when reached; an exhausted iterator stays so."""
    mine, theirs = make(), make()
    assert_same(outcome(minicompile.compile(fn), X, *mine), outcome(fn, X, *theirs))
    assert_same(list(mine), list(theirs))


def test_an_iterator_over_a_list_returned_from_the_frame_is_the_lists():
    items = [1, 2]
    it = minicompile.compile(returns_an_iterator)(X, items)
    assert next(it) == 1
    items.append(3)
    assert list(it) == [2, 3]


def makes_a_leaf(x):
    w = torch.ones(3, requires_grad=True)
    return (w * x).sum(), w, torch.full((2,), 2.0, requires_grad=True), x.new_zeros(2, requires_grad=True)


def test_a_factory_asked_for_requires_grad_makes_a_leaf():
    """torch.ones(3, requires_grad=True) and x.new_zeros(..., requires_grad=True): leaves whose
    gradient the caller reads (they leave the graph: a graph break where each is made)."""
    x = torch.randn(3)
    loss, w, full, zeros = minicompile.compile(makes_a_leaf)(x)
    assert all(t.requires_grad and t.is_leaf for t in (w, full, zeros))
    loss.backward()
    assert_same(w.grad, x)


Pair = __import__("collections").namedtuple("Pair", ["first", "second"])


def asks_a_pair(x):
    p = Pair(x * 2, None)
    buckets = p.buckets if hasattr(p, "buckets") else None      # (Reformer's attention outputs)
    return (x + 1 if buckets is None else x - 1), hasattr(p, "first"), p.count(None)


def test_a_named_tuple_made_in_the_frame_has_only_its_fields_and_methods():
    same_calls(asks_a_pair, [lambda f: f(X)])


def nonlocal_then_print(x):
    n, z = 0, None

    def inner():
        nonlocal n, z
        n, z = 5, x.sum()
        print("in inner")                 # a break inside the inlined call
        n += 1
        return x * 2
    r = inner()
    return r, n, z


def counts_across_a_break(x):
    n = 0

    def inc():
        nonlocal n
        n += 1
    inc()
    print("break")
    inc()
    later = lambda: n * 10               # made after the break: the same cell
    return x + n, later()


def walrus_in_a_filter(x):
    z, count = None, 0
    r = [y for y in [x, x * 2] if (z := y.sum()) > 0 and (count := count + 1)]
    return len(r), z, count


@pytest.mark.parametrize("fn", [nonlocal_then_print, counts_across_a_break, walrus_in_a_filter])
def test_cells_written_by_nested_functions_across_graph_breaks(fn, capsys):
    """A nested function's (or a comprehension's) writes to the frame's cells, before and
    after a graph break, are the frame's: the break's call runs for real on the same cells."""
    same_calls(fn, [lambda f: f(torch.arange(4.0)), lambda f: f(-torch.arange(4.0)), lambda f: f(torch.arange(4.0))])


def uses_len(x, items):
    return x + len(items)


def test_a_global_that_hides_a_builtin_is_seen():
    compiled = minicompile.compile(uses_len)
    assert_same(compiled(X, [1, 2]), X + 2)
    globals()["len"] = lambda items: 7
    try:
        assert_same(compiled(X, [1, 2]), X + 7)
    finally:
        del globals()["len"]
    assert_same(compiled(X, [1, 2]), X + 2)


def torch_and_math(x):
    return torch.nn.functional.relu(x - 0.5) * math.sqrt(4)


@pytest.mark.parametrize("owner, name, patch", [
    (torch.nn.functional, "relu", lambda v: v * 100),
    (math, "sqrt", lambda v: 10.0),
])
def test_a_function_of_torch_or_math_replaced_by_the_user_is_seen(owner, name, patch):
    """Torch's own code is trusted, but what the user's code reads of torch's modules (and of
    the standard library's) is guarded: a user may replace it, as a test's monkeypatch does."""
    compiled = minicompile.compile(torch_and_math)
    assert_same(compiled(X), torch_and_math(X))
    original = getattr(owner, name)
    setattr(owner, name, patch)
    try:
        assert_same(compiled(X), torch_and_math(X))
    finally:
        setattr(owner, name, original)
    assert_same(compiled(X), torch_and_math(X))


def stops_inside(it):
    yield 1
    yield next(it)              # exhausted: StopIteration inside the generator's body


def drains(x):
    try:
        return list(stops_inside(iter([])))
    except RuntimeError:
        return x - 1


def shows(x, s):
    return x * s, str(s)


def adds(x, n):
    return x + n


def test_pep_479_the_sign_of_zero_and_ints_past_int64():
    """A StopIteration out of a generator's body is a RuntimeError; a float specialized by
    value tells -0.0 from 0.0; an int past int64 is eager's OverflowError, not wrapped."""
    same_calls(drains, [lambda f: f(X)])
    same_calls(shows, [lambda f, s=s: f(X, s) for s in (1.0, 0.0, -0.0, 0.0)])
    xi = torch.arange(3)
    same_calls(adds, [lambda f, n=n: f(xi, n) for n in (5, 6, 2**64 + 1, 7)])


class Volume(__import__("enum").IntEnum):
    HIGH = 3


def scales_by_a_level(x):
    return x * Volume.HIGH + 1


def test_an_int_enum_member_in_a_kernel_is_its_number():
    minicompile.metrics.reset()
    assert_same(minicompile.compile(scales_by_a_level)(X), X * 3 + 1)
    assert minicompile.metrics.kernels == 1


def reshapes_in_place(x):
    mask = x > 0
    first = mask[0]
    mask.unsqueeze_(1)                  # (BigBird's band mask)
    y = (x * 2).t_()
    held = [y]
    y.unsqueeze_(0)
    return mask.float() * 3, first, y + 1, held[0].shape


def annotated(x, items: list[int]):
    def helper(v: dict[str, int], w: "tuple[int, ...]" = ()) -> list[float]:
        return [v["a"] * 1.0]
    return x + helper({"a": len(items)})[0]


def backbone(x):
    from transformers.modeling_outputs import BackboneOutput
    out = BackboneOutput(feature_maps=(x.relu(), x.sigmoid()))
    return out.feature_maps[1] + 1, len(out)


class _Gaussian:                 # (diffusers' DiagonalGaussianDistribution: no __iter__)
    def __init__(self, p):
        self.mean, self.logvar = p.chunk(2, dim=1)


try:
    from transformers.utils import ModelOutput

    @dataclasses.dataclass
    class _EncoderOutput(ModelOutput):
        latent_dist: object = None
except ImportError:
    _EncoderOutput = None


def encoder_output(x):
    out = _EncoderOutput(latent_dist=_Gaussian(x * 2))
    return out.latent_dist.mean + out.latent_dist.logvar.exp(), len(out)


@pytest.mark.parametrize("fn", [reshapes_in_place, annotated, backbone, encoder_output])
def test_in_one_graph(fn):
    """A tensor the graph made, reshaped in place; a function made with annotations that
    subscript builtins; a ModelOutput whose one field is a tuple of tensors, or an object that
    is not iterable (a VAE encoder's output: its distribution)."""
    if fn in (backbone, encoder_output):
        pytest.importorskip("transformers.modeling_outputs")
    args = (torch.randn(3, 4),) + (([1, 2],) if fn is annotated else ())
    minicompile.metrics.reset()
    assert_same(minicompile.compile(fn)(*args), fn(*args))
    assert minicompile.metrics.graph_breaks == 0


def reversed_then_shrunk(x, items):
    r = reversed(items)
    items.pop()
    out = []
    for v in reversed(items):
        out.append(v)
        if len(items) > 1:
            items.pop(0)
    return x + 1, list(r), out


def test_reversed_reads_the_list_as_it_goes():
    same_calls(reversed_then_shrunk, [lambda f: f(X, [1, 2, 3, 4])])


@contextlib.contextmanager
def logged(log, name):
    log.append(f"enter {name}")
    try:
        yield
    finally:
        log.append(f"exit {name}")


def counting(x, log, name="gen"):
    with logged(log, name):
        yield x
        yield x + 1
    log.append("unreached")


def breaks_out(x, log):
    for v in counting(x, log):
        break
    log.append("after the loop")
    return v


def returns_from_the_loop(x, log):
    for v in counting(x, log):
        return v * 2


def helper_keeps_one_in_a_local(x, log):
    g = counting(x, log, "inner")
    return next(g) * 3          # returns: its local goes, the generator is closed


def calls_the_helper(x, log):
    y = helper_keeps_one_in_a_local(x, log)
    log.append("helper returned")
    return y


def keeps_it(x, log, kept):
    g = counting(x, log)
    first = next(g)
    kept.append(g)               # still referenced: not closed
    return first


def returns_it(x, log):
    g = counting(x, log)
    next(g)
    return g


@pytest.mark.parametrize("fn", [breaks_out, returns_from_the_loop, calls_the_helper])
def test_a_generator_let_go_of_is_closed_then(fn):
    """CPython closes a generator when its last reference goes (a loop left by break or
    return, a frame's locals as it returns): its finally blocks and with-exits run then."""
    logs = []
    same_calls(fn, [lambda f: (f(X, log := []), log, logs.append(log))[:2]] * 2)
    assert logs[0][-1] in ("after the loop", "exit gen", "helper returned")


def test_a_generator_still_referenced_is_not_closed():
    for fn in (keeps_it, returns_it):
        compiled = minicompile.compile(fn)
        for _ in range(2):
            eager_log, log, eager_kept, kept = [], [], [], []
            args = (eager_kept,) if fn is keeps_it else ()
            eager_out = fn(X, eager_log, *args)
            out = compiled(X, log, *((kept,) if fn is keeps_it else ()))
            assert log == eager_log == ["enter gen"]
            rest = (kept[0] if kept else out), (eager_kept[0] if eager_kept else eager_out)
            assert_same(next(rest[0]), next(rest[1]))      # it goes on where it was
            assert log == eager_log == ["enter gen"]


def closes_with_a_print(x):
    for v in counting_and_printing(x):
        return v + 1


def counting_and_printing(x):
    try:
        yield x
    finally:
        print("closed")


def test_a_generator_closed_at_a_graph_break_runs_its_finally_once(capsys):
    compiled = minicompile.compile(closes_with_a_print)
    for _ in range(2):
        assert_same(compiled(X), X + 1)
        assert capsys.readouterr().out == "closed\n"


def grad_off_while_paused(x):
    with torch.no_grad():
        yield x * 2


def breaks_while_generators_are_paused(x, log):
    g, h = grad_off_while_paused(x), counting(x, log)
    a = next(g) + next(h)
    print(end="")              # a graph break: both paused in their blocks, closed at the return
    log.append("after the break")
    return (a + x).requires_grad, torch.is_grad_enabled()


def takes_one_from_a_temporary(x, log):
    a = next(grad_off_while_paused(x))      # closed as next() returns: grad mode back on
    return (a + x).requires_grad, torch.is_grad_enabled()


@pytest.mark.parametrize("fn", [breaks_while_generators_are_paused, takes_one_from_a_temporary])
def test_a_generator_let_go_of_while_paused_is_closed_when_eager_closes_it(fn):
    """Paused at a graph break: its no_grad block still holds for the rest of the frame, its
    finally runs after it, and grad mode is back on for the caller. A temporary: closed at once."""
    x = torch.randn(3, requires_grad=True)
    with torch.enable_grad():
        same_calls(fn, [lambda f: (torch.set_grad_enabled(True), f(x, log := []), log, torch.is_grad_enabled())[1:]] * 2)


def types_of(x):
    found, pair = torch.max(x, 0), Pair(x, 1)
    return (found.values + 1, type(found).__name__, isinstance(found, torch.return_types.max),
            type(pair).__name__, isinstance(pair, Pair), isinstance(found, tuple),
            [type(it).__name__ for it in (iter(pair), iter((x,)), iter([x]), iter({1: 2}), iter("ab"),
                                          iter(range(3)), reversed([1]), enumerate([1]), zip([1]))])


def test_types_of_named_results_and_iterators_are_eagers():
    """torch.max's result is a torch.return_types.max, a namedtuple made in the frame is of its
    class, and an iterator over a tuple a tuple_iterator (not a plain tuple, a list_iterator)."""
    same_calls(types_of, [lambda f: f(X)])


def operator_statements(x, items, table):
    operator.setitem(items, 0, 9)
    operator.delitem(table, "a")
    grown = operator.iadd(items, [x])
    return (x + items[0] + len(table), operator.is_(items, items), operator.is_not(items, table),
            operator.contains(table, "b"), grown is items, functools.reduce(operator.add, [x, x]))


def test_operator_functions_do_what_their_statements_do():
    """operator.setitem/delitem write the call's list and dict, operator.is_ compares objects:
    as `l[0] = v`, `del d[k]`, `a is b` do (they ran on copies of the values)."""
    same_calls(operator_statements, [lambda f: (f(X, items := [1, 2], table := {"a": 1, "b": 2}), items, table)] * 2)


class Settings:
    def __init__(self):
        self.layers, self.options, self.depth = [8], {"act": "relu"}, 2

    def total(self):
        return sum(self.layers) + self.depth


def copied_settings(x, settings):
    deep, shallow = copy.deepcopy(settings), copy.copy(settings)
    deep.layers.append(16)           # the copy's own list
    shallow.options["norm"] = "ln"   # the original's very dict
    return x + deep.total() + len(settings.options), deep.layers, shallow.options is settings.options


def copied_lists(x, items, table):
    a, b, c = copy.copy(items), copy.copy(table), copy.deepcopy([[1], 2])
    a[0].append(x)                   # shared with items[0]
    b["new"] = 1
    c[0].append(3)
    return a, b, c


def test_copies_are_as_deep_as_eagers():
    """copy.deepcopy's lists are the copy's own (a change to them was lost); copy.copy's are the
    original's very ones (a change through the copy is a change of the original's)."""
    settings = lambda f: (f(X, s := Settings()), vars(s))      # noqa: E731
    same_calls(copied_settings, [settings] * 2)
    same_calls(copied_lists, [lambda f: (f(X, items := [[1]], table := {"k": 1}), items, table)] * 2)


NOTES = []


class Noting(Settings):
    def note(self):
        NOTES.append(self.depth)     # a side effect outside the copy, read back
        return len(NOTES)


def copied_and_noted(x, settings):
    return x + copy.deepcopy(settings).note()


def test_a_method_of_a_copy_runs_on_every_call_as_in_eager():
    compiled = minicompile.compile(copied_and_noted)
    NOTES.clear()
    for n in (1, 2, 3):
        assert_same(compiled(X, Noting()), copied_and_noted(X, Noting()) - 1)
        assert NOTES == [2] * 2 * n


class Numbered(Settings):
    made = 0

    def __deepcopy__(self, memo):       # its own copy: a fresh number each time
        Numbered.made += 1
        twin = Numbered()
        twin.depth = Numbered.made
        return twin


def copied_with_its_own_hook(x, settings):
    twin = copy.deepcopy(settings)
    return x * twin.depth, twin.depth


def test_a_classs_own_deepcopy_runs_on_every_call_as_in_eager():
    def twice(f):
        Numbered.made = 0
        return f(X, Numbered()), f(X, Numbered()), Numbered.made
    same_calls(copied_with_its_own_hook, [twice] * 2)


class Plain:
    pass


def through_the_dict(x, obj):
    own = obj.__dict__
    before = len(own)
    obj.z = 4                         # seen in the dict read before
    own["w"] = 2                      # seen as an attribute
    del vars(obj)["a"]
    return x + before + len(own) + obj.w + obj.z, hasattr(obj, "a"), sorted(vars(obj))


def with_a(f):
    obj = Plain()
    obj.a = 1
    return f(X, obj), vars(obj)


def test_an_instances_dict_and_its_attributes_see_each_other():
    same_calls(through_the_dict, [with_a] * 2)


class Counting:
    """A descriptor whose __get__ counts its reads."""
    reads = 0

    def __get__(self, obj, owner=None):
        Counting.reads += 1
        return Counting.reads


class Holder:
    counted = Counting()

    def __init__(self):
        self.side = 2

    @functools.cached_property
    def area(self):
        return self.side * self.side


def descriptors(x, holder):
    holder.side = 3
    return x + holder.counted + holder.area, holder.area


def test_python_descriptors_run_once_per_read_and_cached_properties_cache():
    """A Python descriptor's __get__ ran when traced and in the guard on every call (a counter
    in it counted twice a call); a cached_property was computed from the object as the call
    found it (not from the frame's writes) and never stored."""
    for _ in range(2):
        results = []
        for fn in (descriptors, minicompile.compile(descriptors)):
            Counting.reads = 0
            holder = Holder()
            results.append(([fn(X, holder) for _ in range(3)], Counting.reads, vars(holder)))
        assert_same(results[1], results[0])


class RaisesOnExit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        raise KeyError("from __exit__")


def reraises():
    raise                         # the exception its caller is handling


def exception_context(x):
    try:
        with RaisesOnExit():
            raise ValueError("body")
    except KeyError as e:
        context = type(e.__context__).__name__
    try:
        try:
            raise IndexError("first")
        except IndexError:
            reraises()
    except IndexError as e:
        again = str(e)
    try:
        raise ValueError("b")
    except ValueError as e:
        has_traceback = e.__traceback__ is not None
    return x + 1, context, again, has_traceback


def test_exceptions_see_the_exception_their_callers_handle():
    """An exception raised in a `with`'s __exit__ while another propagates has it as its
    __context__; a bare `raise` in a function called from an except block re-raises what that
    block handles; a caught exception has its traceback (a graph break: the trace has none)."""
    same_calls(exception_context, [lambda f: f(X)] * 2)


class StepsByOne:
    def step(self, x):
        return x + 1


class Subtracts:
    def step(self, x):
        return x - 50


def test_a_class_whose_bases_change_finds_its_methods_anew():
    class Stepper(StepsByOne):
        pass

    def step(x, obj):
        return obj.step(x)
    compiled, obj = minicompile.compile(step), Stepper()
    assert_same(compiled(X, obj), X + 1)
    Stepper.__bases__ = (Subtracts,)
    assert_same(compiled(X, obj), X - 50)


class Mode(str, enum.Enum):
    A = "a"
    B = "b"


class Tier(enum.IntEnum):
    LOW = 1
    HIGH = 2


SCALES = {Mode.A: 2.0, Mode.B: 3.0}
LEVELS = collections.OrderedDict({Tier.LOW: 0.5, Tier.HIGH: 4.0})


def scaled_by_mode(x, mode):
    for key in SCALES:
        if key == mode:
            return x * SCALES[key] + LEVELS[Tier.HIGH] + LEVELS.get(Tier.LOW)
    return x


def test_dicts_keyed_by_enum_members_are_guarded_in_python():
    """Their keys' repr (`<Mode.A: 'a'>`) is no Python: the guard was a SyntaxError. Read
    through the member's plain value (equal, same hash), the keys held by the guard."""
    compiled = minicompile.compile(scaled_by_mode)
    assert_same(compiled(X, Mode.B), scaled_by_mode(X, Mode.B))
    graphs = minicompile.metrics.graphs
    assert_same(compiled(X, Mode.B), scaled_by_mode(X, Mode.B))
    assert minicompile.metrics.graphs == graphs                 # the guard holds
    SCALES[Mode.B], LEVELS[Tier.HIGH] = 5.0, 1.0
    try:
        assert_same(compiled(X, Mode.B), scaled_by_mode(X, Mode.B))
    finally:
        SCALES[Mode.B], LEVELS[Tier.HIGH] = 3.0, 4.0


def names_given(x, **kwargs):
    given, frozen = set(kwargs.keys()), frozenset(k for k in kwargs)
    return x + len(given), sorted(given), "scale" in frozen, type(frozen).__name__


def test_a_set_of_a_dicts_keys_whose_values_are_tensors_is_one_graph():
    """set(kwargs.keys()) (Hugging Face's generation config) was a graph break: its items are
    names, whatever the values are."""
    same_calls(names_given, [lambda f: f(X, scale=X, bias=2)] * 2)
    assert minicompile.explain(names_given)(X, scale=X, bias=2).graph_break_count == 0


def sets_with_colliding_hashes(x, values, dropped, added, keys):
    """Numbers 8 apart collide in a small set's table: the order a set iterates in hangs on
    how it was made and changed, not only on what it holds."""
    s = {v for v in values}
    for d in dropped:
        s.discard(d)
    for a in added:
        s.add(a)
    t = s.copy()
    t |= {5, 13}
    u = set(keys) | set(dict.fromkeys(keys)) | {*t}
    in_frame = list(s), list(t), list(s | t), list(u), list(keys.keys() & {next(iter(keys)), 3, 11})
    print(end="")                               # a break: s, t and u cross it
    return x + 1, in_frame, list(s), list(t), list(u), s


@pytest.mark.parametrize("seed", range(6))
def test_a_set_made_in_the_frame_iterates_in_eagers_order_where_hashes_collide(seed):
    """A set was rebuilt from its items at each change (and at a break), so it iterated in
    another order than eager's after a removal: loops over it and list(s) differed."""
    r = random.Random(seed)
    values = [r.randrange(3, 400, 8) for _ in range(r.randrange(4, 12))]
    dropped, added = r.sample(values, 3), [r.randrange(3, 400, 8) for _ in range(3)]
    keys = dict.fromkeys(r.randrange(3, 400, 8) for _ in range(6))
    same_calls(sets_with_colliding_hashes, [lambda f: f(X, values, dropped, added, keys)] * 2)


class _Settings:
    scale = 3.0


def act_if_callable(x, v):
    return x * 2 if callable(v) else x - 1


@pytest.mark.parametrize("make", [_Settings, lambda: {1, 2}, lambda: (i for i in range(3)), lambda: iter([1]),
                                  lambda: range(3), lambda: math, lambda: torch.no_grad(), lambda: len,
                                  lambda: (lambda: 0), lambda: torch.nn.ReLU(), lambda: X.add],
                         ids=["object", "set", "generator", "iterator", "range", "module", "no_grad", "builtin",
                              "lambda", "module_object", "tensor_method"])
def test_callable_is_pythons_answer(make):
    """callable(v) was True for any value but a tensor, list or dict: an object, a set, a
    generator took the branch meant for a function."""
    same_calls(act_if_callable, [lambda f: f(X, make())] * 2)


def test_callable_follows_a_call_method_added_to_the_class():
    """callable(obj) was fixed at the trace: a __call__ added to its class later (or removed)
    was not seen."""
    class Maybe:
        pass
    obj = Maybe()

    def add(f):
        Maybe.__call__ = lambda self: 1
        return f(X, obj)

    def remove(f):
        if "__call__" in vars(Maybe):      # (each call runs twice: compiled, then eager)
            del Maybe.__call__
        return f(X, obj)
    same_calls(act_if_callable, [lambda f: f(X, obj), add, remove])


class _TorchNamedPackageClass:
    """A class of a package whose name starts with "torch" (torchvision, torchmetrics, a
    user's torchutils): the user's, not torch's own."""
    scale = 2.0
    count = 0


_TorchNamedPackageClass.__module__ = "torchutils_of_a_user"


def reads_and_bumps(x):
    _TorchNamedPackageClass.count += 1
    return x * _TorchNamedPackageClass.scale + _TorchNamedPackageClass.count


def test_a_class_of_a_package_named_torch_something_is_guarded_and_written():
    """A class attribute of such a class was an unguarded constant (trusted as torch's), and
    `count += 1` wrote the traced value on every call."""
    results = []
    for fn in (reads_and_bumps, minicompile.compile(reads_and_bumps)):
        _TorchNamedPackageClass.count, _TorchNamedPackageClass.scale = 0, 2.0
        got = [fn(X)]
        _TorchNamedPackageClass.scale = 5.0
        got += [fn(X), fn(X)]
        results.append(got + [_TorchNamedPackageClass.count])
    assert_same(results[1], results[0])


class _MissingGivesFive(dict):
    def __missing__(self, key):
        return 5.0


class _PlainMapping(collections.abc.Mapping):
    def __init__(self, items):
        self._items = items

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)


def matches_a_mapping(x, d):
    match d:
        case {"scale": s}:
            return x * s, dict(d)
        case _:
            return x, dict(d)


@pytest.mark.parametrize("make", [lambda: collections.defaultdict(lambda: 2.0, a=1), lambda: collections.Counter(a=1),
                                  lambda: _MissingGivesFive(a=1), lambda: _PlainMapping({"a": 1}),
                                  lambda: {"scale": 3.0}, lambda: _PlainMapping({"scale": 4.0})],
                         ids=["defaultdict", "Counter", "missing", "Mapping", "dict", "Mapping_with_key"])
def test_a_mapping_pattern_asks_get_as_python_does(make):
    """case {"k": v} subscripted the subject: a defaultdict's factory ran (and put the key in
    the caller's dict), a Counter and a __missing__ matched, a Mapping raised KeyError."""
    same_calls(matches_a_mapping, [lambda f: f(X, make())] * 2)


class _LoggedMapping(collections.abc.Mapping):
    def __init__(self, items, log):
        self._items, self._log = items, log

    def __getitem__(self, key):
        self._log.append(f"getitem {key}")
        return self._items[key]

    def __iter__(self):
        self._log.append("iter")
        return iter(self._items)

    def __len__(self):
        self._log.append("len")
        return len(self._items)


def reads_a_logged_mapping(x, m):
    match m:
        case {"a": a}:
            x = x * a
    return x * m.get("a", 0) + m.get("b", 1), "a" in m, "b" in m, len(m)


def test_a_user_mappings_get_in_and_pattern_run_its_methods_as_often_as_eager():
    """Its get() and `in` (and a mapping pattern's get) were answered by calling its
    __getitem__ at the trace and again in the guard: each call logged more than eager's."""
    same_calls(reads_a_logged_mapping, [lambda f: (f(X, _LoggedMapping({"a": 2.0}, log := [])), log)] * 3)
    assert minicompile.metrics.recompiles == 0


class _PluginBase(abc.ABC):
    pass


class _Plugin:
    pass


@typing.runtime_checkable
class _HasScale(typing.Protocol):
    scale: float


@typing.runtime_checkable
class _Indexable(typing.Protocol):
    def __index__(self) -> int: ...


class _Holder:
    pass


def class_checks(x, p, h):
    return (x * 5 if isinstance(p, _PluginBase) else x, issubclass(type(p), _PluginBase),
            isinstance(h, _HasScale), isinstance(3, _Indexable))


def test_isinstance_of_an_abc_or_a_protocol_follows_registrations_and_attributes():
    """isinstance()/issubclass() were constants of the trace: after _PluginBase.register(...)
    or an attribute set that a runtime Protocol asks for, the traced branch was taken."""
    holder = _Holder()

    def register(f):
        _PluginBase.register(_Plugin)
        holder.scale = 2.0
        return f(X, _Plugin(), holder)
    same_calls(class_checks, [lambda f: f(X, _Plugin(), holder), register, lambda f: f(X, _Plugin(), holder)])
    assert minicompile.explain(lambda x: x * isinstance(3, _Indexable))(X).graph_break_count == 0


def has_index(x, o, give_it_one):
    if give_it_one:
        o.__index__ = lambda: 2
    return x * 5 if isinstance(o, _Indexable) else x


def test_a_protocol_of_methods_is_satisfied_by_the_objects_own_attributes():
    """isinstance() of a runtime Protocol of methods was answered by the object's class: an
    instance given the method (before the call, or in the frame) still did not satisfy it."""
    given = _Holder()
    given.__index__ = lambda: 1
    same_calls(has_index, [lambda f: f(X, _Holder(), False), lambda f: f(X, given, False),
                           lambda f: f(X, _Holder(), True), lambda f: f(X, 4, False)])


def _recurse(x, n):
    if n == 0:
        return x
    return _recurse(x + 1, n - 1)


def deep_recursion(x):
    return _recurse(x, 300)


def test_a_deep_recursion_stays_within_eagers_limit():
    """Each call made at a break (a recursive helper's) is compiled, and took several frames of
    minicompile's: 200 levels raised RecursionError where eager's limit is about 1000. Calls
    nested deeper than a few dozen run as Python."""
    same_calls(deep_recursion, [lambda f: f(X)] * 2)


def sums_strings(x, parts):
    try:
        return x, sum(parts, "")
    except TypeError as e:
        return x + 1, str(e)


def test_sum_of_strings_raises_pythons_type_error():
    """sum(["a", "b"], "") gave "ab"; Python refuses it (use ''.join)."""
    same_calls(sums_strings, [lambda f: f(X, ["a", "b"])] * 2)


ODD_KEYS = {float("inf"): 2.0, float("-inf"): 3.0, torch.device("cpu"): 4.0, (Tier.LOW, "a"): 5.0}


def by_odd_keys(x, key):
    for k in ODD_KEYS:
        if k == key:
            return x * ODD_KEYS[k]
    return x


@pytest.mark.parametrize("key", list(ODD_KEYS))
def test_dicts_keyed_by_infinities_devices_and_tuples_of_members(key):
    """Keys whose repr is no Python (inf, device(type='cpu'), a tuple holding an Enum member):
    the guard writes them as calls, item by item, or reads the item by its position."""
    same_calls(by_odd_keys, [lambda f: f(X, key)] * 3)


class RopeSettings(typing.TypedDict):
    theta: float


def first_type_that_fits(x, value):
    for kind in (RopeSettings, dict):         # as huggingface_hub's union validator
        try:
            if isinstance(value, kind):
                return x + 1, kind.__name__
        except TypeError:                     # a TypedDict refuses isinstance()
            continue
    return x, None


def test_a_class_that_refuses_isinstance_raises_in_the_frame():
    same_calls(first_type_that_fits, [lambda f: f(X, {"theta": 1.0})] * 2)
    assert minicompile.explain(first_type_that_fits)(X, {"theta": 1.0}).graph_break_count == 0


class Color(enum.Enum):
    RED = 1
    BLUE = 2


WEIGHTS = {Color.RED: 2.0, Color.BLUE: 3.0}


def weighted_by_color(x, color):
    return x * WEIGHTS[color] + WEIGHTS.get(Color.RED, 0.0), color in WEIGHTS


def test_dicts_keyed_by_plain_enum_members_are_looked_up_in_the_graph():
    """A plain Enum's members stand for themselves as keys: looked up in the trace (the frame
    ran eagerly), each member an argument guarded by identity."""
    same_calls(weighted_by_color, [lambda f, c=c: f(X, c) for c in (Color.BLUE, Color.RED, Color.BLUE)])
    assert minicompile.explain(weighted_by_color)(X, Color.RED).graph_break_count == 0


# ---- a tensor's value where Python wants a number ----------------------------------------
def sized_by_tensors(x, n):
    return (torch.zeros(n) + x.sum(), x.view(n, -1) * 2, x.repeat(n), x.split(n)[0] * 2,
            torch.arange(n) * x[0], x[:n] * 3)


def test_a_size_or_slice_bound_given_as_a_tensor_follows_each_calls_value():
    """`torch.zeros(n)`, `x.view(n, -1)`, `x[:n]` with n a 0-dim tensor read its value (its
    __index__): a graph break each time, as in Dynamo, never the first call's sizes."""
    x = torch.randn(12)
    same_calls(sized_by_tensors, [lambda f, n=n: f(x, torch.tensor(n)) for n in (2, 3, 4, 6, 3)])


def sliced_by_a_constant_tensor(x, y):
    n = torch.IntTensor([3])                   # VITS's WaveNet: torch.IntTensor([hidden_size])
    written = torch.tensor([3])
    written.add_(x.sum().long().clamp(0, 2))   # written from an input: read at each call
    return y[:, : n[0]] * 2, y[:, : written[0]]


def test_a_slice_bound_made_of_constants_alone_is_that_constant():
    """A bound computed from constants alone is the same number at every call: no break;
    one that an input changed is read at each call, as before."""
    y = torch.randn(2, 8)
    calls = [lambda f, k=k: f(torch.full((4,), k), y) for k in (0.5, 5.0, -4.0)]
    same_calls(sliced_by_a_constant_tensor, calls)
    assert minicompile.explain(lambda y: y[:, : torch.IntTensor([3])[0]] * 2)(torch.randn(2, 8)).graph_break_count == 0


def values_the_graph_reads(x, t):
    y = x.clone().fill_(t) + x.masked_fill(x > 0, t) + torch.clamp(x, -t, t)
    n = torch.div(x.shape[0], 4, rounding_mode="trunc") - 1        # a tensor of sizes only
    return y + x[t.long()], x.new_zeros((2, n + 1))


def test_ops_that_read_a_value_in_their_kernel_or_a_constant_tensor_stay_in_one_graph():
    x = torch.randn(8)
    same_calls(values_the_graph_reads, [lambda f, v=v: f(x, torch.tensor(v)) for v in (1.5, 2.5)])
    assert minicompile.explain(values_the_graph_reads)(x, torch.tensor(1.5)).graph_break_count == 0


# ---- PyTorch's global state, set and read in the frame -----------------------------------
def sets_and_reads_global_state(x, dtype, threads):
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)
    return x * 2, torch.get_num_threads(), torch.tensor(1.5).dtype


def test_torch_setters_run_on_every_call_and_getters_are_asked_again():
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    try:
        for fn in (sets_and_reads_global_state, minicompile.compile(sets_and_reads_global_state)):
            for _ in range(3):
                torch.set_default_dtype(torch.float32)
                torch.set_num_threads(2)
                result = fn(X, torch.float64, 1)
                assert result[1:] == (1, torch.float64) and torch.get_default_dtype() is torch.float64
                assert torch.get_num_threads() == 1
        reads = minicompile.compile(lambda x: (x + 1, torch.get_num_threads()))
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            assert reads(X)[1] == n
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)


def saves(x, path):
    torch.save({"step": 1}, path)
    return x + 1


def test_torch_save_in_the_frame_writes_on_every_call(tmp_path):
    compiled = minicompile.compile(saves)
    path = tmp_path / "state.pt"
    for _ in range(3):
        compiled(X, str(path))
        assert path.exists()
        path.unlink()


# ---- classes and containers of the user's ------------------------------------------------
class Registered:
    count = 0
    instances = []
    scale = 1.0

    def __init__(self):
        type(self).count += 1
        type(self).instances.append(type(self).count)
        self.s = self.__class__.scale


def makes_a_registered(x):
    r = Registered()
    return x * r.s + Registered.count


def test_class_attributes_through_the_type_of_an_object_made_in_the_frame():
    """type(self).count += 1 in __init__: the class's attribute, read and written (it was a
    constant written once), and its later changes seen."""
    def state():
        return Registered.count, list(Registered.instances)
    results = []
    for fn in (makes_a_registered, minicompile.compile(makes_a_registered)):
        Registered.count, Registered.scale = 0, 1.0
        Registered.instances.clear()
        for i in range(3):
            Registered.scale = 5.0 if i == 2 else 1.0
            results.append((fn(X), state()))
    assert_same(results[3:], results[:3])


class TenTimes(list):
    def __getitem__(self, i):
        return super().__getitem__(i) * 10


class TenTimesDict(dict):
    def __getitem__(self, k):
        return super().__getitem__(k) * 10


def first_item(x, items):
    return x + items[0]


def item_a(x, d):
    return x + d["a"]


def test_a_containers_own_getitem_is_not_applied_twice_by_the_guard():
    """A list (dict) subclass with its own __getitem__: the guard reads the item past it (the
    trace runs it), also once the item is a graph input."""
    same_calls(first_item, [lambda f, v=v: f(X, TenTimes(v)) for v in ([1, 2], [3], [4], [5, 6])])
    same_calls(item_a, [lambda f, v=v: f(X, TenTimesDict(a=v)) for v in (1, 2, 3)])


class OwnReversed:
    def __iter__(self):
        return iter(range(3))

    def __reversed__(self):
        return iter(["own"])


class IterOnly:
    def __iter__(self):
        return iter([1, 2])


class ReversedList(list):
    def __reversed__(self):
        return iter(["own"])


def reversed_list(x, o):
    return x + 1, list(reversed(o))


def test_reversed_asks_the_objects_own_reversed_or_raises_as_python():
    for make in (OwnReversed, lambda: ReversedList([1, 2]), IterOnly, lambda: {1, 2}):
        same_calls(reversed_list, [lambda f: f(X, make())] * 2)


def test_a_class_with_del_is_made_for_real():
    """Its instance is finalized by eager's reference counting (made in the trace, a stand-in
    without attributes was finalized at the trace instead)."""
    log = []

    class Handle:
        def __init__(self, n):
            self.n = n

        def __del__(self):
            log.append(self.n)

    def f(x):
        h = Handle(7)
        return x * 2, h.n

    compiled = minicompile.compile(f)
    for _ in range(3):
        assert_same(compiled(X), f(X))
    assert log == [7] * 6


# ---- the rest of a frame after a break -----------------------------------------------------
def reads_locals_by_name(x, scale):
    y = x * scale
    print("step")
    return eval("y") + 1, sorted(locals())


def test_locals_read_by_name_after_a_break_are_kept():
    same_calls(reads_locals_by_name, [lambda f, s=s: f(X, s) for s in (2.0, 3.0)])


def holds_a_memoryview(x, buf):
    view = memoryview(buf)
    print("step")
    return x + 1, view[0]


def test_a_writable_memoryview_live_at_a_break():
    same_calls(holds_a_memoryview, [lambda f: f(X, bytearray(b"ab"))] * 2)


def warns(x):
    import warnings
    warnings.warn("careful")
    return x + 1


def test_a_warning_at_a_break_names_the_users_module_and_line():
    import warnings
    compiled = minicompile.compile(warns)
    for fn in (warns, compiled, compiled):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(X)
        assert [(w.filename, w.lineno) for w in caught if str(w.message) == "careful"] == \
            [(__file__, warns.__code__.co_firstlineno + 2)]
        with warnings.catch_warnings():
            warnings.filterwarnings("error", module=__name__)
            with pytest.raises(UserWarning):
                fn(X)


def _deprecated_helper(x):
    import warnings
    warnings.warn("use something else", FutureWarning, stacklevel=2)
    return x + 1


def _warns_for_its_callers_caller(x):
    import warnings
    warnings.warn("three up", UserWarning, stacklevel=3)
    return x + 1


def calls_deprecated_helpers(x):
    y = _deprecated_helper(x)
    return _warns_for_its_callers_caller(y) * 2


def test_a_warning_with_a_stacklevel_at_a_break_names_the_line_eager_names():
    """warnings.warn(..., stacklevel=2) in a library function (inlined, so the call runs at a
    graph break) names the line that called it, and stacklevel=3 the line that called the
    compiled function: the frames counted are the user's, not minicompile's between them."""
    import sys
    import warnings
    compiled = minicompile.compile(calls_deprecated_helpers)
    first = calls_deprecated_helpers.__code__.co_firstlineno
    for fn in (calls_deprecated_helpers, compiled, compiled):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(X); here = sys._getframe().f_lineno  # noqa: E702
        assert [(str(w.message), w.filename, w.lineno) for w in caught] == \
            [("use something else", __file__, first + 1), ("three up", __file__, here)]


def test_calls_from_threads_at_once_compile_one_at_a_time():
    import threading

    def f(x, k):
        return (x * k).relu() + 1

    compiled, errors = minicompile.compile(f), []

    def worker(i):
        for j in range(4):
            x = torch.randn(2 + (i + j) % 3, 3)
            try:
                torch.testing.assert_close(compiled(x, j), f(x, j))
            except Exception as e:           # noqa: BLE001 (collected for the assert)
                errors.append(e)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_global_set_by_a_modules_function_read_as_the_modules_attribute():
    """cfg.set_scale(v) does `global SCALE; SCALE = v`; the frame then reads cfg.SCALE."""
    import sys
    import types
    cfg = types.ModuleType("minicompile_test_cfg")
    exec("SCALE = 1.0\ndef set_scale(v):\n    global SCALE\n    SCALE = v\n", cfg.__dict__)
    sys.modules[cfg.__name__] = cfg

    def f(x, v):
        cfg.set_scale(v)
        return x * cfg.SCALE

    compiled = minicompile.compile(f)
    try:
        for v in (2.0, 3.0, 4.0):
            cfg.SCALE = 1.0
            assert_same(compiled(X, v), f(X, v))
    finally:
        del sys.modules[cfg.__name__]


def _reads_an_argument_by_name(name):
    """A decorator that binds the call to its function's signature (transformers' own for the
    vision towers of its multimodal models)."""
    def wrap(func):
        signature = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return func(*args, **kwargs), bound.arguments[name], len(bound.args), sorted(bound.kwargs)
        return wrapper
    return wrap


@_reads_an_argument_by_name("layer")
def scaled_by_layer(x, layer=-1, *rest, strategy="default", **options):
    return x * layer


def test_a_signature_made_by_a_decorator_binds_the_call_in_the_graph():
    calls = [lambda f: f(X), lambda f: f(X, 3), lambda f: f(X, 2, 5, strategy="s", extra=1),
             lambda f: f(X, layer=4), lambda f: f()]                     # (the last a TypeError)
    same_calls(scaled_by_layer, calls)
    assert minicompile.explain(scaled_by_layer)(X, 3).graph_break_count == 0


def counts_in_a_message(x, ids):
    h = x.sin() * 2
    n = (ids == 5).sum()
    message = f"tokens: {n}, shape {tuple(h.shape)}"       # built even when never shown
    return h.cos() + 1, message


def test_a_tensor_formatted_in_an_f_string_breaks_the_graph_and_resumes():
    """The text needs the tensor's value: a break there, and the rest of the frame compiled
    (it ran eagerly, the whole frame)."""
    ids = torch.tensor([[5, 1], [1, 5]])
    same_calls(counts_in_a_message, [lambda f, x=torch.randn(2, 4): f(x, ids) for _ in range(3)])
    assert minicompile.explain(counts_in_a_message)(torch.randn(2, 4), ids).graph_count == 2


def annotated_list(x):
    from typing import Dict, List, Optional
    out = torch.jit.annotate(List[torch.Tensor], [])
    table = torch.jit.annotate(Dict[str, Optional[torch.Tensor]], {})
    for i in range(2):
        out.append(x * i)
    table["a"] = out[-1]
    return out, table


def test_typing_forms_of_torchscript_annotations_are_evaluated_in_the_trace():
    """torch.jit.annotate(List[torch.Tensor], []) (timm's CrossViT): List[...] is a typing
    form Python makes, not a break."""
    same_calls(annotated_list, [lambda f: f(X)] * 2)
    assert minicompile.explain(annotated_list)(X).graph_break_count == 0


def _takes(x, options, pair, *rest, **extra):
    return x


def binds_and_writes_through_the_arguments(x, options):
    bound = inspect.signature(_takes).bind(x, options, (2, 3), 4, flag=True)
    bound.arguments["options"]["seen"] = True          # the caller's dict, as in Python
    return x * bound.args[2][1] + len(bound.args) + len(bound.kwargs)


def test_bound_arguments_hand_back_the_callers_objects():
    """A dict bound to a parameter is the caller's (a write through it reaches them); a tuple
    bound to a plain parameter stays one argument of ba.args."""
    options_eager, options_compiled = {}, {}
    assert_same(minicompile.compile(binds_and_writes_through_the_arguments)(X, options_compiled),
                binds_and_writes_through_the_arguments(X, options_eager))
    assert options_compiled == options_eager == {"seen": True}
    assert minicompile.explain(binds_and_writes_through_the_arguments)(X, {}).graph_break_count == 0


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 3


class Reduction(str, enum.Enum):
    SUM = "sum"


def enum_members_as_arguments(x):
    import torch.nn.functional as F
    return (x.topk(Level.HIGH).values, x[[Level.LOW, Level.HIGH]], torch.tensor([Level.HIGH, 1]),
            F.cross_entropy(x.view(3, 2), torch.tensor([0, 1, 1]), reduction=Reduction.SUM))


def test_enum_members_are_handed_to_pytorchs_kernels_as_they_are():
    """An IntEnum's member or a str Enum's is an int or a str to PyTorch: the generated code
    holds the member (its repr, `<Level.HIGH: 3>`, was written into it: a SyntaxError)."""
    x = torch.randn(6)
    same_calls(enum_members_as_arguments, [lambda f: f(x), lambda f: f(x * 2)])


def scaled_if_defined(x):
    try:
        return x * LATER_SCALE                      # noqa: F821 (defined by the test, later)
    except NameError:
        return x - 1


def scaled_if_the_module_has_it(x):
    try:
        return x * OPTIONS.scale
    except AttributeError:
        return x - 1


def with_an_optional_kernel(x):
    try:
        from math import fast_tanh_kernel           # noqa: F401 (there is none)
    except ImportError:
        return torch.tanh(x)
    return fast_tanh_kernel(x)


OPTIONS = types.ModuleType("options")


def test_names_missing_when_traced_are_found_once_defined():
    """A caught NameError or AttributeError of a module is the guard's too: defined later
    (the next cell of a notebook), the name is read. A from-import of a missing name raises
    ImportError, as Python's."""
    global LATER_SCALE
    compiled = minicompile.compile(scaled_if_defined)
    assert_same(compiled(X), X - 1)
    LATER_SCALE = 5.0
    try:
        assert_same(compiled(X), X * 5)
    finally:
        del LATER_SCALE
    compiled = minicompile.compile(scaled_if_the_module_has_it)
    assert_same(compiled(X), X - 1)
    OPTIONS.scale = 3.0
    try:
        assert_same(compiled(X), X * 3)
    finally:
        del OPTIONS.scale
    same_calls(with_an_optional_kernel, [lambda f: f(X)] * 2)
    assert minicompile.explain(with_an_optional_kernel)(X).graph_break_count == 0


def reads_what_a_container_has(x, items, table):
    a = x * 2 if hasattr(items, "shape") else x - 2           # a list has no .shape
    b = getattr(table, "num_layers_key", "layers")             # nor a dict attributes
    return a, b, hasattr(items, "append"), hasattr(table, "items")


def test_attributes_a_list_or_dict_does_not_have_are_missing():
    same_calls(reads_what_a_container_has, [lambda f: f(X, [1, 2], {"a": 1})] * 2)
    assert minicompile.explain(reads_what_a_container_has)(X, [1, 2], {"a": 1}).graph_break_count == 0


class _NotAManager:
    pass


def _has_methods_on_the_instance_only():
    o = _NotAManager()
    o.__enter__, o.__exit__ = (lambda: None), (lambda *a: None)
    return o


def enters(x, o):
    try:
        with o:
            return x + 1
    except TypeError as e:
        return x - 1, str(e)


def test_with_on_an_object_whose_class_is_no_context_manager_raises_typeerror():
    """`with o:` whose class has no __enter__/__exit__ (the instance's own are not looked at)
    raised AttributeError, where Python raises TypeError."""
    same_calls(enters, [lambda f: f(X, _NotAManager()), lambda f: f(X, _has_methods_on_the_instance_only())])


class _Returns:
    def __init__(self, value):
        self.value = value

    def __bool__(self):
        return self.value

    def __len__(self):
        return self.value

    def __iter__(self):
        return self.value


class _Sized:
    def __init__(self, value):
        self.value = value

    def __len__(self):
        return self.value


def truth_of(x, o):
    return x + 1 if o else x - 1


def times_len(x, o):
    return x * len(o)


def sums_over(x, o):
    s = 0
    for v in o:
        s += v
    return x * s


def test_what_bool_len_and_iter_return_is_checked_as_python_checks_it():
    """__bool__ returning an int, __len__ a negative number or a float, __iter__ a list: Python
    raises TypeError or ValueError; compiled code used what they returned."""
    same_calls(truth_of, [lambda f: f(X, _Returns(1)), lambda f: f(X, _Sized(-1)), lambda f: f(X, _Returns(True))])
    same_calls(times_len, [lambda f: f(X, _Sized(-1)), lambda f: f(X, _Sized(2.0)), lambda f: f(X, _Sized(2))])
    same_calls(sums_over, [lambda f: f(X, _Returns([1, 2])), lambda f: f(X, _Returns(iter([1, 2])))])


def test_a_cached_result_is_not_kept_after_cache_clear_and_a_call_elsewhere():
    """cache_clear(), then a call from outside the compiled code with other arguments: the
    cache's counts are back where they were, but the compiled code's entry is gone; eager's
    call runs the function again (and reads the new setting), so does the compiled code."""
    compiled = minicompile.compile(cached)
    assert_same(compiled(X), X * 6)
    SCALE["k"] = 10
    cached_scale.cache_clear()
    try:
        cached_scale(5)                  # one miss, as the trace's call counted one
        assert_same(compiled(X), X * 30)
    finally:
        SCALE["k"] = 2
        cached_scale.cache_clear()
