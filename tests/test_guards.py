"""Guards and recompilation, against the real torch.compile.

Each test runs one sequence of calls whose inputs change (a shape, a dtype, a Python scalar, a
flag, requires_grad, a global, a module's training flag, the layout, grad mode) through
minicompile and through torch.compile with a counting backend, and asserts that every result
equals eager's and that both compiled the same number of graphs.

Most sequences compare with `torch.compile(..., dynamic=False)` (a new size is a new compile
in both), and the dynamic-shape ones with the default `dynamic=None`, where both compile once
more after a size changes and then reuse a graph generic in that size (tests/test_dynamic.py
has more of those, and ints that change, which both make symbolic inputs under dynamic=None).
"""
import functools
import re
import warnings

import pytest
import torch
import torch.nn as nn

import minicompile
from helpers import assert_same, graph_counter


def run_both(fn, calls, *, backend="minicompile", dynamic=False):
    """Run `calls` (each a zero-argument function returning (args, kwargs); it may change
    globals or modules first) through minicompile, torch.compile and eager.

    -> (minicompile's graph count, torch.compile's graph count)."""
    torch._dynamo.reset()
    minicompile.reset()
    minicompile.metrics.reset()
    counter, graphs = graph_counter()
    ours = minicompile.compile(fn, backend=backend, dynamic=dynamic)
    theirs = torch.compile(fn, backend=counter, dynamic=dynamic)
    for prepare in calls:
        args, kwargs = prepare()
        expected = fn(*args, **kwargs)
        for compiled in (ours, theirs):
            got = compiled(*args, **kwargs)
            if isinstance(expected, torch.Tensor):
                assert_same(got.detach(), expected.detach(), expected.dtype)
            else:
                assert got == expected
    torch._dynamo.reset()
    return minicompile.metrics.graphs, len(graphs)


def call(*args, **kwargs):
    return lambda: (args, kwargs)


def pointwise(x):
    return torch.relu(x + 1) * 2


# --- sequences: compile counts equal torch.compile's -------------------------------------
def test_shape_change():
    calls = [call(torch.randn(4)), call(torch.randn(4)), call(torch.randn(8)), call(torch.randn(4)),
             call(torch.randn(3, 5))]
    assert run_both(pointwise, calls) == (3, 3)


def test_shape_change_dynamic_none():
    # dynamic=None (both compilers' default): the first change of a size makes that dim
    # dynamic, so sizes 8 and 16 share the second graph
    calls = [call(torch.randn(n)) for n in (4, 8, 16)]
    assert run_both(pointwise, calls, dynamic=None) == (2, 2)


def test_dtype_change():
    calls = [call(torch.randn(6)), call(torch.randn(6, dtype=torch.float16)), call(torch.randn(6)),
             call(torch.randn(6, dtype=torch.float64))]
    assert run_both(pointwise, calls) == (3, 3)


def scaled(x, n):
    return x * n + 1


def test_python_scalar_change():
    # ints and floats are specialized by value (dynamic=False: torch.compile's default would
    # make an int that changed dynamic, as for sizes)
    calls = [call(torch.randn(5), 2), call(torch.randn(5), 2), call(torch.randn(5), 3),
             call(torch.randn(5), 2), call(torch.randn(5), 2.0)]
    assert run_both(scaled, calls) == (3, 3)


def branchy(x, flag):
    if flag:
        return x.sin() * 2
    return x.cos() - 1


def test_bool_flag_change():
    calls = [call(torch.randn(7), True), call(torch.randn(7), False), call(torch.randn(7), True),
             call(torch.randn(7), False)]
    assert run_both(branchy, calls) == (2, 2)


def test_requires_grad_change():
    calls = [call(torch.randn(5)), call(torch.randn(5, requires_grad=True)), call(torch.randn(5)),
             call(torch.randn(5, requires_grad=True))]
    assert run_both(pointwise, calls) == (2, 2)


SCALE = 2.0


def uses_global(x):
    return x * SCALE


def set_scale(value, n=4):
    def prepare():
        global SCALE
        SCALE = value
        return (torch.randn(n),), {}
    return prepare


def test_global_change():
    calls = [set_scale(2.0), set_scale(3.0), set_scale(2.0), set_scale(0.5)]
    try:
        assert run_both(uses_global, calls) == (3, 3)
    finally:
        set_scale(2.0)()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        y = self.fc(x)
        if self.training:
            return y * 2
        return torch.tanh(y)


def test_module_training_change():
    torch.manual_seed(0)
    net = Net()

    def mode(training):
        def prepare():
            net.train(training)
            return (torch.randn(3, 6),), {}
        return prepare

    calls = [mode(True), mode(False), mode(True), mode(False)]
    # compile(module) and torch.compile(module) both guard `self.training`
    torch._dynamo.reset()
    graphs = []

    def counter(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    ours = minicompile.compile(net)
    theirs = torch.compile(net, backend=counter, dynamic=False)
    with torch.no_grad():
        for prepare in calls:
            (x,), _ = prepare()
            expected = net(x)
            assert_same(ours(x), expected)
            assert_same(theirs(x), expected)
    assert (minicompile.metrics.graphs, len(graphs)) == (2, 2)
    torch._dynamo.reset()


def test_layout_change():
    base = torch.randn(6, 5)
    calls = [call(torch.randn(5, 6)), call(base.t()), call(torch.randn(5, 6)),
             call(torch.randn(6, 5).t())]
    assert run_both(pointwise, calls) == (2, 2)


def test_grad_mode_change():
    def prepare(grad):
        def p():
            torch.set_grad_enabled(grad)
            return (torch.randn(5),), {}
        return p
    try:
        assert run_both(pointwise, [prepare(True), prepare(False), prepare(True)]) == (2, 2)
    finally:
        torch.set_grad_enabled(True)


def asks_the_mode_inside_blocks(x):
    with torch.no_grad():
        off = torch.is_grad_enabled()
        with torch.autocast("cpu", torch.bfloat16):
            cast = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    return x * 2 + off + 2 * cast[0] + 4 * (cast[1] is torch.bfloat16) + 8 * torch.is_grad_enabled()


def test_grad_and_autocast_modes_read_inside_their_blocks_are_not_guarded_on_each_call():
    # (the entry's modes are guarded: inside a block the trace knows them; a guard on the
    # value read inside failed on every call, a graph each time)
    calls = [call(torch.randn(5))] * 3
    assert run_both(asks_the_mode_inside_blocks, calls) == (1, 1)


def defaulted(x, flag=True):
    return x * 2 if flag else x - 1


def test_call_shape_change_is_not_a_recompile():
    # minicompile's guard reads arguments at fixed positions; an entry is re-bound (checks
    # re-generated, no trace, no compile) when only the way the arguments are passed changed,
    # as Dynamo binds arguments before its guards run
    calls = [call(torch.randn(3)), call(torch.randn(3), True), call(torch.randn(3), flag=True),
             call(x=torch.randn(3)), call(torch.randn(3), False), call(torch.randn(3), flag=False)]
    assert run_both(defaulted, calls) == (2, 2)


def test_call_shape_and_size_change_logs_the_size(capsys):
    minicompile.set_logs(recompiles=True)
    try:
        f = minicompile.compile(defaulted, backend="eager")
        f(torch.randn(3))
        f(torch.randn(4), True)
    finally:
        minicompile.set_logs(recompiles=False)
    out = capsys.readouterr().out
    assert "- 0/0: tensor 'x' size mismatch at index 0. expected 3, actual 4" in out
    assert minicompile.metrics.graphs == 2


# --- failure reasons ---------------------------------------------------------------------
def guard_of(fn, *args):
    from minicompile.capture import capture
    return capture(fn, args, {}).guard


def test_fail_reason_tensor_metadata():
    g = guard_of(pointwise, torch.randn(4, 6))
    assert g.fail_reason((torch.randn(4, 6),), {}) is None
    assert g.fail_reason((torch.randn(8, 6),), {}) == \
        "tensor 'x' size mismatch at index 0. expected 4, actual 8"
    # every size before any stride, as Dynamo: a longer row is a new size, not a new layout
    assert g.fail_reason((torch.randn(4, 9),), {}) == \
        "tensor 'x' size mismatch at index 1. expected 6, actual 9"
    assert g.fail_reason((torch.randn(4, 6, dtype=torch.float16),), {}) == \
        "tensor 'x' dtype mismatch. expected Float, actual Half"
    assert g.fail_reason((torch.randn(6, 4).t(),), {}) == \
        "tensor 'x' stride mismatch at index 0. expected 6, actual 1"
    assert g.fail_reason((torch.randn(4, 6, requires_grad=True),), {}) == \
        "tensor 'x' requires_grad mismatch. expected requires_grad=0"
    assert g.fail_reason((torch.randn(4),), {}) == "tensor 'x' rank mismatch. expected 2, actual 1"
    assert g.fail_reason((3,), {}).startswith("expected type of 'x' to be a tensor type")
    with torch.no_grad():
        assert g.fail_reason((torch.randn(4, 6),), {}) == "GLOBAL_STATE changed: grad_mode"


def test_fail_reason_constants_globals_modules():
    g = guard_of(branchy, torch.randn(3), True)
    assert g.fail_reason((torch.randn(3), False), {}).startswith("flag == True ")
    assert "# if flag:" in g.fail_reason((torch.randn(3), False), {})
    g = guard_of(scaled, torch.randn(3), 2)
    assert g.fail_reason((torch.randn(3), 3), {}).startswith("n == 2")
    assert g.fail_reason((torch.randn(3), 2.0), {}).startswith("type(n) is int")
    g = guard_of(uses_global, torch.randn(3))
    global SCALE
    SCALE = 3.0
    try:
        assert g.fail_reason((torch.randn(3),), {}).startswith("G['SCALE'] == 2.0")
    finally:
        SCALE = 2.0
    net = Net()
    g = guard_of(net.forward, torch.randn(2, 6))
    net.eval()
    reason = g.fail_reason((torch.randn(2, 6),), {})
    assert reason.startswith("self.training == True")
    assert "# if self.training:" in reason            # the line that read it, as Dynamo's


def test_reset_forgets_entries_of_live_compiled_functions():
    # the hit path keeps its frame's cache on the compiled function; reset() must still
    # empty it (as torch._dynamo.reset())
    f = minicompile.compile(pointwise, backend="eager")
    x = torch.randn(4)
    f(x)
    f(x)
    minicompile.reset()
    assert_same(f(x), pointwise(x))
    assert minicompile.metrics.graphs == 2


def test_fast_guard_stays_one_boolean_function():
    g = guard_of(pointwise, torch.randn(4))
    assert g((torch.randn(4),), {}) is True and g((torch.randn(5),), {}) is False
    from minicompile.capture import capture
    src = capture(pointwise, (torch.randn(4),), {}).guard_source
    assert src.startswith("def guard(F, args, kwargs):")
    assert "TENSOR_FAILURE" not in src and "return False" in src     # no helper calls, no strings
    assert "def guard_failure(F, args, kwargs):" in g.failure_source


def test_guards_log_shows_the_generated_guard(capsys):
    minicompile.set_logs(guards=True)
    try:
        minicompile.compile(pointwise, backend="eager")(torch.randn(4))
    finally:
        minicompile.set_logs(guards=False)
    out = capsys.readouterr().out
    assert "[minicompile:guards] [0/0] pointwise" in out
    assert "def guard(F, args, kwargs):" in out
    assert ".shape == (4,)" in out or "size (4,) stride (1,)" in out    # Python or C++


def test_recompiles_log(capsys):
    minicompile.set_logs(recompiles=True)
    try:
        f = minicompile.compile(branchy, backend="eager")
        f(torch.randn(4), True)
        f(torch.randn(8), True)
        f(torch.randn(8), False)
    finally:
        minicompile.set_logs(recompiles=False)
    out = capsys.readouterr().out
    blocks = out.split("[minicompile:recompiles] ")[1:]
    assert len(blocks) == 2
    first, second = blocks
    assert first.startswith(f"Recompiling function branchy in {__file__}:")
    assert "    triggered by the following guard failure(s):\n" in first
    assert "    - 0/0: tensor 'x' size mismatch at index 0. expected 4, actual 8" in first
    # the second recompile lists both earlier entries, newest first
    lines = [l for l in second.splitlines() if re.match(r"    - \d+/\d+: ", l)]
    assert [l.split(":")[0] for l in lines] == ["    - 0/1", "    - 0/0"]
    assert lines[0].startswith("    - 0/1: flag == True ")
    assert "    - User stack trace:" in second
    assert "    -     if flag:" in second


def test_recompile_limit_warning_names_the_last_failing_guard():
    assert minicompile.config.recompile_limit == 8
    f = minicompile.compile(scaled, backend="eager", dynamic=False)    # every int its own entry
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(10):
            x = torch.randn(3)
            assert_same(f(x, n), scaled(x, n))
    limit = [w for w in caught if "recompile_limit" in str(w.message)]
    assert len(limit) == 1                       # once per frame, as torch.compile
    text = str(limit[0].message)
    assert text.startswith("minicompile hit config.recompile_limit (8)\n")
    assert "   function: 'scaled' (" in text
    assert re.search(r"   last reason: 0/7: n == 7 ", text), text
    assert minicompile.metrics.graphs == 8
    # the same number of compiles as torch.compile's, and the same words
    calls = [call(torch.randn(3), n) for n in range(10)]
    with pytest.warns(UserWarning, match="recompile_limit"):
        ours, theirs = run_both(scaled, calls, backend="eager")
    assert (ours, theirs) == (8, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_change():
    # the graph is specialized to the device (its kernels are C++ or Triton): a new device is
    # a new compile, and going back hits the first entry
    calls = [call(torch.randn(6)), call(torch.randn(6, device="cuda")), call(torch.randn(6)),
             call(torch.randn(6, device="cuda"))]
    assert run_both(pointwise, calls) == (2, 2)


def test_the_storage_pattern_sees_memory_shared_through_views_at_offsets():
    """The guard of a graph that writes an input compares which inputs share memory with the
    trace's: views at offsets into one storage (of another dtype too) share it, a tensor of its
    own does not."""
    from minicompile.capture.guards import storage_pattern
    base, other = torch.randn(12), torch.randn(3)
    assert storage_pattern(base[2:], other, base[5:], base.view(torch.int32)[1:], base) == (0, 1, 0, 0, 0)
    assert storage_pattern(other, base[::2], other[1:].view(1, 2)) == (0, 1, 0)
    assert storage_pattern(base[:6], base[6:].clone()) == (0, 1)


def test_a_forward_replaced_on_torchs_own_class_is_seen():
    """Libraries patch nn.Linear.forward on the class (LoRA, quantization): torch's classes
    are trusted, but not their forward."""
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    compiled = minicompile.compile(model)
    x = torch.randn(2, 3)
    compiled(x)
    original = nn.Linear.forward
    nn.Linear.forward = lambda self, inp: original(self, inp) * 3
    try:
        assert_same(compiled(x), model(x))
    finally:
        nn.Linear.forward = original
    assert_same(compiled(x), model(x))


def test_one_tensor_passed_twice_is_guarded_as_one_in_training():
    """A graph traced with one tensor as two arguments (self-attention's q, k, v) takes them
    for one: in training, one fake tensor and one gradient. A later call with two tensors
    (cross-attention) is another entry, as TorchDynamo's duplicate-input guard makes it: it ran
    the first graph and computed with the first argument twice."""
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v

    compiled = minicompile.compile(attention)
    x, memory = torch.randn(2, 5, 16, requires_grad=True), torch.randn(2, 5, 16, requires_grad=True)
    compiled(x, x, x).sum().backward()
    results = []
    for f in (attention, compiled):
        x.grad = memory.grad = None
        out = f(x, memory, memory)
        out.sum().backward()
        results.append((out, x.grad, memory.grad))
    assert_same(results[1], results[0])


def test_a_function_whose_code_is_replaced_runs_the_new_code():
    """IPython's autoreload replaces an edited function's `__code__` in place: the compiled
    function runs the new code (it ran the graph of the old one), for a function and for a
    module's forward."""
    def f(x):
        return x * 2

    class Doubling(nn.Module):
        def forward(self, x):
            return x * 2

    x = torch.randn(4)
    compiled, module = minicompile.compile(f), Doubling()
    compiled_module = minicompile.compile(module)
    compiled(x), compiled_module(x)
    f.__code__ = (lambda x: x * 3).__code__
    Doubling.forward.__code__ = (lambda self, x: x * 3).__code__
    assert_same(compiled(x), x * 3)
    assert_same(compiled_module(x), x * 3)


class _SubtractsForAdd(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.add, torch.Tensor.add, torch.Tensor.__add__):
            func = torch.sub
        return func(*args, **(kwargs or {}))


class _CountsMultiplications(torch.utils._python_dispatch.TorchDispatchMode):
    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mul.Tensor:
            type(self).count += 1
        return func(*args, **(kwargs or {}))


def test_a_call_under_a_torch_function_or_dispatch_mode_does_what_the_mode_makes_of_it():
    """A mode the caller enters after compiling (one that changes or counts ops) sees the ops
    eager's call makes: such a call runs eagerly, as TorchDynamo's does under a dispatch mode
    (the compiled kernels never reach the dispatcher, and the guard did not look at modes)."""
    def f(x, y):
        return (x + y) * y

    compiled = minicompile.compile(f)
    x, y = torch.randn(5), torch.randn(5)
    compiled(x, y)
    with _SubtractsForAdd():
        assert_same(compiled(x, y), (x - y) * y)
    with _CountsMultiplications():
        compiled(x, y)
    assert _CountsMultiplications.count == 1
    assert_same(compiled(x, y), (x + y) * y)


def test_torch_set_default_device_is_guarded_not_run_eagerly():
    """torch.set_default_device's mode changes where `torch.ones(3)` is made: a call under
    another (or none) compiles again; under it, the graph still compiles."""
    def f(x):
        return x + torch.ones(3)

    compiled = minicompile.compile(f)
    compiled(torch.randn(3))
    torch.set_default_device("cpu")
    try:
        compiled(torch.randn(3))
        compiled(torch.randn(3))
    finally:
        torch.set_default_device(None)
    assert minicompile.metrics.graphs == 2


def test_a_builtin_or_torch_function_patched_after_compile_is_called():
    """`builtins.abs = ...`, `F.linear = ...` (unittest.mock.patch does this; nn.Linear's
    forward then calls the patch): the guard sees it and the code traced again calls it. Only
    names a graph's trace read are guarded."""
    import builtins
    import torch.nn.functional as F

    def f(x):
        return abs(x) + 1

    linear = nn.Linear(4, 3)
    compiled, compiled_linear = minicompile.compile(f), minicompile.compile(linear)
    x = torch.randn(2, 4)
    compiled(x), compiled_linear(x)
    old_abs, old_linear = builtins.abs, F.linear
    builtins.abs = lambda t: t * 10
    F.linear = lambda t, w, b=None: old_linear(t, w, b) * 0
    try:
        assert_same(compiled(x), x * 10 + 1)
        assert_same(compiled_linear(x), torch.zeros(2, 3))
    finally:
        builtins.abs, F.linear = old_abs, old_linear
    assert_same(compiled(x), x.abs() + 1)


def _scaling(k):
    def act(x):
        return x * k
    return act


def test_a_closure_or_bound_method_made_per_call_is_guarded_by_its_code():
    """A closure, a lambda or a bound method the caller makes anew for each call (an
    activation built from a config, `default(val, self.get_decay)` as ema-pytorch passes it) is
    guarded by its code and what it holds, as TorchDynamo's CLOSURE_MATCH: one compile, not one
    per call; a cell, a default or an attribute that changes is seen."""
    def apply(x, act):
        return act(x) + 1

    x = torch.randn(5, 3)
    calls = [call(x, _scaling(2.0)), call(x, _scaling(2.0)), call(x, lambda t, k=3.0: t * k),
             call(x, lambda t, k=3.0: t * k), call(x, lambda t, k=4.0: t * k), call(x, _scaling(torch.randn(3)))]
    ours, theirs = run_both(apply, calls)
    assert ours <= theirs

    class Decay:
        def __init__(self, w):
            self.w = w

        def get(self):
            return self.w * 2 + 1

    def default(value, make):
        return value if value is not None else make()

    first, second = Decay(torch.randn(3)), Decay(torch.randn(3))
    ours, theirs = run_both(default, [call(None, first.get), call(None, first.get), call(None, second.get)])
    assert ours == theirs == 1

    def scaled(x, act):
        return act(x) * act.scale

    act = _scaling(2.0)
    act.scale = 3.0
    other = _scaling(2.0)
    other.scale = 5.0
    compiled = minicompile.compile(scaled)
    assert_same(compiled(x, act), scaled(x, act))
    assert_same(compiled(x, other), scaled(x, other))


def test_a_closure_passed_in_is_itself_in_the_compiled_code():
    """The function the caller passed is the one the compiled code gives back and compares
    (not one made again from its code), and two passed in are one or two as the caller's are."""
    def returns(x, act):
        return act(x), act

    def same(x, f, g):
        return x + 1 if f is g else x - 1

    compiled, compiled_same = minicompile.compile(returns), minicompile.compile(same)
    x = torch.randn(4)
    for k in (2.0, 3.0):
        act = _scaling(k)
        out, back = compiled(x, act)
        assert back is act
        assert_same(out, x * k)
        assert_same(compiled_same(x, act, act), x + 1)
        assert_same(compiled_same(x, act, _scaling(k)), x - 1)


def test_a_closure_made_before_a_graph_break_and_used_after_compiles_once():
    """vector-quantize's pack_one returns a closure the code calls after a graph break: the
    resume function receives a new closure each call, guarded by its code (it recompiled per
    call)."""
    def pack_one(t):
        shape = t.shape

        def unpack_one(y):
            return y.reshape(shape)
        return t.flatten(), unpack_one

    def f(x):
        y, unpack = pack_one(x)
        if y.sum() > 0:
            y = y * 2
        else:
            y = y - 1
        return unpack(y + 1)

    calls = [call(torch.randn(3, 5) + 2.0) for _ in range(4)]
    ours, theirs = run_both(f, calls)
    assert ours == theirs
    assert minicompile.metrics.recompiles == 0


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


def test_a_function_guarded_by_its_code_has_its_own_name_doc_and_annotations():
    """Two activations wrapped by one decorator share the wrapper's code: their names, docs and
    annotations are their own (read through them, and guarded: a rename is seen), not the
    code's ('wrapper'); a function made in the frame has its annotations."""
    def relu(t: torch.Tensor) -> torch.Tensor:
        """max(t, 0)"""
        return t.relu()

    def tanh(t):
        return t.tanh()

    acts = [_logged(relu), _logged(tanh)]

    def f(x):
        def local(t: torch.Tensor, k: float = 2.0):
            return t * k
        out = {a.__name__: a(x) for a in acts}
        return out, acts[0].__doc__, sorted(acts[0].__annotations__), sorted(local.__annotations__), \
            hasattr(acts[1], "__wrapped__")

    compiled = minicompile.compile(f)
    x = torch.randn(4)
    for rename in (None, "rectifier"):
        if rename:
            acts[0].__name__ = rename
        got, expected = compiled(x), f(x)
        assert sorted(got[0]) == sorted(expected[0])
        for name in expected[0]:
            assert_same(got[0][name], expected[0][name])
        assert got[1:] == expected[1:]


VERBOSE = False
_cached_runs: list = []


def _tripled_verbosely(x):
    if VERBOSE:                          # read by the helper, which then breaks the graph
        print("scaled")
    return x * 3


def _plus_one_then_logged(x):
    return _tripled_verbosely(x + 1) - 2


def test_facts_read_by_a_call_that_breaks_the_graph_are_not_guarded(capsys):
    """A call the trace gives up (a graph break there: it runs as Python) guarded what it read
    before giving up: flipping VERBOSE, which only the call reads, compiled the graph before it
    again (the called function's own frame, compiled on its own, rightly is).
    (TorchDynamo traces again from the start, with the break at the call.)"""
    global VERBOSE
    compiled = minicompile.compile(_plus_one_then_logged)
    x = torch.randn(5)
    minicompile.set_logs(recompiles=True)
    try:
        for verbose in (True, False, True):
            VERBOSE = verbose
            assert torch.equal(compiled(x), _plus_one_then_logged(x))
    finally:
        VERBOSE = False
        minicompile.set_logs(recompiles=False)
    assert "Recompiling function _plus_one_then_logged" not in capsys.readouterr().out


@functools.lru_cache(maxsize=1)
def _table(n):
    _cached_runs.append(n)               # (an effect: the call runs as Python, at a graph break)
    return torch.arange(n) * 1.5


def _scaled_by_a_table(x, n):
    return x[:n] * _table(n)


def test_a_bounded_cache_that_drops_entries_compiles_once_per_argument():
    """Called with 5, 3, 5, 3...: `_table(n)`'s call breaks the graph, but the trace's attempt to
    inline it had guarded `len(_cached_runs)`, which each call's miss changes: a compile per
    call until the recompile limit."""
    compiled = minicompile.compile(_scaled_by_a_table, dynamic=False)
    x = torch.randn(8)
    _cached_runs.clear()
    _table.cache_clear()
    for k in range(6):
        n = 3 if k % 2 else 5
        assert torch.equal(compiled(x, n), x[:n] * torch.arange(n) * 1.5)
    assert len(_cached_runs) == 6                        # (eager's: each call misses)
    assert minicompile.metrics.graphs == 4               # before and after the break, for each n


class _RescalesItsWeight(nn.Module):
    """As the old nn.utils.spectral_norm's hook: a plain tensor attribute replaced each call by
    one computed from a parameter (which requires grad)."""

    def __init__(self):
        super().__init__()
        self.raw = nn.Parameter(torch.randn(5, 6))
        self.weight = self.raw.detach().clone()

    def forward(self, x):
        self.weight = self.raw * 2.0
        return x @ self.weight.t()


def test_an_attribute_a_module_replaces_is_not_guarded_as_it_was():
    """`self.weight = computed` read the old value to ask whether it was the same (and guarded
    it: requires_grad False), so the second call, which found the computed one, compiled again."""
    model, twin = _RescalesItsWeight(), _RescalesItsWeight()
    twin.load_state_dict(model.state_dict())
    twin.weight = model.weight.clone()
    compiled = minicompile.compile(model)
    for _ in range(3):
        x = torch.randn(3, 6)
        torch.testing.assert_close(compiled(x), twin(x))
        torch.testing.assert_close(model.weight, twin.weight)
    assert minicompile.metrics.graphs == 1 and minicompile.metrics.recompiles == 0
