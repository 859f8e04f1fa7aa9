"""Tests of minicompile.capture: bytecode -> FX graph, guards, Unsupported.

Every capture is checked against eager PyTorch on FRESH random inputs (not the ones it was
traced with), with awkward sizes, a non-contiguous input and a broadcast input, in float32
and float16. Version-independent: runs on Python 3.11, 3.12 and 3.13.
"""
import dis
import operator
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minicompile.capture import Unsupported, UnsupportedPythonVersion, capture  # noqa: E402
from minicompile.capture.bytecode import (SUPPORTED_VERSIONS, _REGISTRY,  # noqa: E402
                                          check_python_version, dispatch_table)

DTYPES = [torch.float32, torch.float16]


def tol(dtype):
    return dict(atol=1e-2, rtol=1e-2) if dtype == torch.float16 else dict(atol=1e-5, rtol=1e-5)


def run_capture(cap, args, kwargs=None):
    kwargs = kwargs or {}
    assert cap.guard(args, kwargs), cap.guard_source
    outs = cap.gm(*cap.get_inputs(args, kwargs))
    assert isinstance(outs, tuple)
    return cap.build_output(outs)


def assert_same(a, b, dtype=torch.float32):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        torch.testing.assert_close(a, b, **tol(dtype))
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            assert_same(x, y, dtype)
    elif isinstance(a, dict):
        assert type(b) is dict and list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k], dtype)
    else:
        assert a == b


def check(fn, make_args, kwargs=None, dtype=torch.float32):
    """Capture with one set of inputs; compare to eager on a fresh set of the same shape."""
    kwargs = kwargs or {}
    cap = capture(fn, make_args(), kwargs)
    fresh = make_args()
    assert_same(fn(*fresh, **kwargs), run_capture(cap, fresh, kwargs), dtype)
    return cap


def call_nodes(gm):
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def targets(gm):
    return [n.target for n in call_nodes(gm)]


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def awkward_inputs(dtype):
    """x: 37x19 non-contiguous (a transpose), y: 37x19 contiguous, b: broadcast row (19,)."""
    return lambda: (rand(19, 37, dtype=dtype).t(), rand(37, 19, dtype=dtype), rand(19, dtype=dtype))


# ------------------------------------------------------------------------------------------
# arithmetic, comparisons, torch functions, tensor methods and attributes
# ------------------------------------------------------------------------------------------
def arith(x, y, b):
    a = x + y * 2.0 - b / 3
    c = -a ** 2 + (x // 1.5) + (y % 2.0)
    return c, x > y, a <= b


@pytest.mark.parametrize("dtype", DTYPES)
def test_arithmetic_and_comparisons(dtype):
    cap = check(arith, awkward_inputs(dtype), dtype=dtype)
    t = targets(cap.gm)
    for op in (operator.add, operator.mul, operator.sub, operator.truediv, operator.pow,
               operator.neg, operator.floordiv, operator.mod, operator.gt, operator.le):
        assert op in t, op
    assert not x_is_constant_in(cap.gm)


def x_is_constant_in(gm):
    return any(n.op == "get_attr" for n in gm.graph.nodes)


def matmul_fn(x, w, b):
    return x @ w + b


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_noncontiguous_and_broadcast(dtype):
    make = lambda: (rand(5, 37, dtype=dtype).t(), rand(5, 19, dtype=dtype), rand(19, dtype=dtype))
    cap = check(matmul_fn, make, dtype=dtype)
    assert targets(cap.gm) == [operator.matmul, operator.add]


def torch_calls(x, y, b):
    s = torch.softmax(x, dim=-1)
    g = F.gelu(y, approximate="tanh")
    c = torch.cat([s, g], dim=0)
    w = torch.where(x > 0, x, b)
    return torch.clamp(c, min=-0.5, max=0.5), F.layer_norm(w, (19,)), torch.relu(b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_and_functional_calls(dtype):
    cap = check(torch_calls, awkward_inputs(dtype), dtype=dtype)
    t = targets(cap.gm)
    assert torch.softmax in t and torch.cat in t and torch.clamp in t and torch.relu in t
    assert F.gelu in t and F.layer_norm in t
    cat = next(n for n in call_nodes(cap.gm) if n.target is torch.cat)
    assert cat.kwargs == {"dim": 0}


def methods(x, y, b):
    n = x.shape[0]
    s = x.sum(-1, keepdim=True)
    r = y.relu().reshape(n, -1)
    v = y.view(19, 37).transpose(0, 1)
    t = x.T
    d = x.to(y.dtype) * x.ndim
    return s + r + b, v, t, d, x.shape, x.dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_methods_and_attributes(dtype):
    cap = check(methods, awkward_inputs(dtype), dtype=dtype)
    nodes = call_nodes(cap.gm)
    assert [n.target for n in nodes if n.op == "call_method"] == \
        ["sum", "relu", "reshape", "view", "transpose", "to"]
    ssum = next(n for n in nodes if n.target == "sum")
    assert ssum.args[1:] == (-1,) and ssum.kwargs == {"keepdim": True}
    reshape = next(n for n in nodes if n.target == "reshape")
    assert reshape.args[1:] == (37, -1)               # x.shape[0] became a Python int
    assert any(n.target is getattr and n.args[1] == "T" for n in nodes)
    out = run_capture(cap, awkward_inputs(dtype)())
    assert out[4] == torch.Size([37, 19]) and out[5] == dtype      # constants baked in


def test_node_meta_source_and_example_value():
    x = rand(4, 6)
    cap = capture(matmul_fn, (x, rand(6, 3), rand(3)), {})
    for n in cap.gm.graph.nodes:
        if n.op in ("placeholder", "call_function", "call_method"):
            assert isinstance(n.meta["example_value"], torch.Tensor)
    add = next(n for n in call_nodes(cap.gm) if n.target is operator.add)
    filename, lineno, text = add.meta["source"]
    assert filename == __file__ and text == "return x @ w + b"
    assert lineno == matmul_fn.__code__.co_firstlineno + 1
    assert [n.name for n in cap.gm.graph.nodes if n.op == "placeholder"] == ["l_x_", "l_w_", "l_b_"]


def multi_out(x, y, b):
    parts = x.chunk(2, dim=-1)
    m = y.max(0)
    return parts[0].sum(), m.values + b, m.indices


def test_multi_output_ops():
    cap = check(multi_out, awkward_inputs(torch.float32))
    assert operator.getitem in targets(cap.gm)


def test_ops_count_matches_dynamo():
    """Same number of ops as TorchDynamo's graph for straight-line code."""
    import torch._dynamo
    for fn in (arith, matmul_fn, multi_out):
        args = awkward_inputs(torch.float32)() if fn is not matmul_fn else (rand(4, 6), rand(6, 3), rand(3))
        torch._dynamo.reset()
        ex = torch._dynamo.explain(fn)(*args)
        assert ex.graph_count == 1
        cap = capture(fn, args, {})
        # explain()'s ops_per_graph lists only call_function targets (tensor methods such as
        # x.chunk / x.sum are call_method nodes and are left out), so compare those; unused
        # items of multi-output ops (parts[1]) are dropped by both.
        ours = [n.target for n in cap.gm.graph.nodes if n.op == "call_function"]
        assert ours == ex.ops_per_graph[0], (fn.__name__, ours, ex.ops_per_graph[0])


# ------------------------------------------------------------------------------------------
# containers as values and as return values
# ------------------------------------------------------------------------------------------
def containers(x, y, b):
    pair = (x, y)
    lst = [x * 2, y]
    a, c = pair
    first, *rest = lst + [b]
    return {"sum": a + c, "items": [first, rest[0]], "n": len(rest)}, (lst[1] - b,)


def test_containers_and_dict_return():
    check(containers, awkward_inputs(torch.float32))


def returns_input_and_constants(x, y, b):
    return x, x * 2, 3, None, "s"


def test_return_input_unchanged_and_constants():
    cap = check(returns_input_and_constants, awkward_inputs(torch.float32))
    args = awkward_inputs(torch.float32)()
    out = run_capture(cap, args)
    assert out[0] is args[0]          # graph input returned unchanged
    assert out[2:] == (3, None, "s")


def no_tensors(x, n):
    return x.shape[0] + n


def test_no_tensor_outputs():
    cap = capture(no_tensors, (rand(3, 2), 4), {})
    assert cap.gm(*cap.get_inputs((rand(3, 2), 4), {})) == ()
    assert cap.build_output(()) == 7


def tuple_arg(pair, scale=2.0, *, shift=1):
    a, b = pair
    return a * scale + b + shift


def test_tuple_argument_defaults_and_kwonly():
    make = lambda: ((rand(37, 19), rand(19)),)
    check(tuple_arg, make)
    check(tuple_arg, make, kwargs={"scale": 3.0, "shift": 2})


# ------------------------------------------------------------------------------------------
# user functions: inlined
# ------------------------------------------------------------------------------------------
def helper(x, y, alpha=0.5, *, beta=2.0):
    return inner(x) * alpha + y * beta


def inner(x):
    return x.sigmoid()


SCALE = 3.0


def calls_helpers(x, y, b):
    u = helper(x, y)
    v = helper(y, b, 0.25, beta=1.0)
    w = helper(*(x, b), **{"alpha": 2.0})
    return u + v + w * SCALE


def test_user_functions_inlined():
    cap = check(calls_helpers, awkward_inputs(torch.float32))
    t = targets(cap.gm)
    assert t.count("sigmoid") == 3 and not any(callable(x) and getattr(x, "__name__", "") == "helper" for x in t)
    # the inlined lines are recorded as the source of their nodes
    sig = next(n for n in call_nodes(cap.gm) if n.target == "sigmoid")
    assert sig.meta["source"][2] == "return x.sigmoid()"
    # the global scalar is guarded by value
    assert "G['SCALE']" in cap.guard_source


def make_closure(k):
    def f(x):
        return x * k + inner(x)
    return f


def test_closure_variable():
    f = make_closure(1.5)
    cap = check(f, lambda: (rand(37, 19),))
    assert "cell_contents" in cap.guard_source


# ------------------------------------------------------------------------------------------
# nn.Modules: forward inlined, parameters are graph inputs
# ------------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        self.register_buffer("scale", torch.full((d,), 0.5))

    def forward(self, x):
        return self.proj(x).relu() * self.scale


class Net(nn.Module):
    def __init__(self, din=19, d=23):
        super().__init__()
        self.fc = nn.Linear(din, d)
        self.ln = nn.LayerNorm(d)
        self.act = nn.ReLU()
        self.block = Block(d)
        self.head = nn.Sequential(nn.Linear(d, 7), nn.GELU())
        self.alpha = 2.0

    def forward(self, x):
        h = self.act(self.ln(self.fc(x)))
        h = h + self.block(h) * self.alpha
        return self.head(h)


@pytest.mark.parametrize("dtype", DTYPES)
def test_module_with_submodules(dtype):
    torch.manual_seed(0)
    m = Net().to(dtype)
    make = lambda: (rand(19, 37, dtype=dtype).t(),)
    cap = check(m.forward, make, dtype=dtype)
    g = cap.gm.graph
    assert not any(n.op == "get_attr" for n in g.nodes)          # no weights baked in
    ph = [n.name for n in g.nodes if n.op == "placeholder"]
    assert "l_self_modules_fc_parameters_weight_" in ph
    assert "l_self_modules_block_modules_proj_parameters_weight_" in ph
    assert "l_self_modules_block_buffers_scale_" in ph
    assert "l_self_modules_head_modules_0_parameters_bias_" in ph
    n_params = len(list(m.parameters())) + len(list(m.buffers()))
    assert len(ph) == 1 + n_params
    assert [p for p in cap.example_inputs if isinstance(p, nn.Parameter)]
    t = targets(cap.gm)
    assert t.count(F.linear) == 3 and F.layer_norm in t and F.relu in t and F.gelu in t


def test_module_weights_are_read_live():
    torch.manual_seed(0)
    m = Net()
    x = rand(37, 19)
    cap = capture(m.forward, (x,), {})
    before = run_capture(cap, (x,))
    with torch.no_grad():
        m.fc.weight.mul_(2.0)
        m.block.proj.weight.add_(0.1)
        m.block.scale.fill_(3.0)
    after = run_capture(cap, (x,))
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, m(x))


def test_module_object_and_module_argument():
    torch.manual_seed(0)
    lin = nn.Linear(19, 5)

    def apply(mod, x):
        return mod(x) * 2

    cap = check(apply, lambda: (lin, rand(37, 19)))
    assert "l_mod_parameters_weight_" in [n.name for n in cap.gm.graph.nodes if n.op == "placeholder"]
    assert cap.guard((lin, rand(37, 19)), {})
    # another Linear of the same sizes passes (modules are guarded by type and what the
    # trace read from them, not identity: its parameters are graph inputs) and gives its
    # own result; one of other sizes does not pass
    other, x = nn.Linear(19, 5), rand(37, 19)
    torch.testing.assert_close(run_capture(cap, (other, x)), other(x) * 2)
    assert not cap.guard((nn.Linear(19, 6), rand(37, 19)), {})
    assert not cap.guard((nn.Identity(), rand(37, 19)), {})
    # an nn.Module itself is captured through its forward
    cap2 = capture(lin, (rand(3, 19),), {})
    assert targets(cap2.gm) == [F.linear]


class WithHelper(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(19))

    def scaled(self, x, k=2.0):
        return x * self.w * k

    def forward(self, x):
        if self.training:                 # a branch on a constant is followed, not a break
            x = x + 1
        return self.scaled(x, k=3.0)


def test_module_method_and_constant_branch():
    m = WithHelper()
    cap = check(m.forward, lambda: (rand(37, 19),))
    assert targets(cap.gm) == [operator.add, operator.mul, operator.mul]
    m.eval()
    assert not cap.guard((rand(37, 19),), {})
    cap_eval = check(m.forward, lambda: (rand(37, 19),))
    assert targets(cap_eval.gm) == [operator.mul, operator.mul]


# ------------------------------------------------------------------------------------------
# guards
# ------------------------------------------------------------------------------------------
def scaled(x, n, flag=True):
    return x * n if flag else x


def test_guards_tensors_and_constants():
    x = rand(37, 19)
    cap = capture(scaled, (x, 3), {})
    assert cap.guard((rand(37, 19), 3), {})
    assert not cap.guard((rand(38, 19), 3), {})                    # shape
    assert not cap.guard((rand(37, 19, dtype=torch.float16), 3), {})  # dtype
    assert not cap.guard((rand(19, 37).t(), 3), {})                # stride (same shape)
    assert not cap.guard((rand(37, 19).requires_grad_(), 3), {})   # requires_grad
    assert not cap.guard((rand(37, 19), 4), {})                    # Python constant
    assert not cap.guard((rand(37, 19), 3.0), {})                  # same value, other type
    assert not cap.guard((rand(37, 19), 3), {"flag": True})        # call shape
    assert not cap.guard((rand(37, 19), 3, False), {})
    with torch.no_grad():
        assert not cap.guard((rand(37, 19), 3), {})                # grad mode
    assert "def guard(F, args, kwargs):" in cap.guard_source
    assert "L['n']: constant" in cap.guard_source and "== 3)" in cap.guard_source


def test_guards_module_training_and_params():
    torch.manual_seed(0)
    m = Net()
    x = rand(37, 19)
    cap = capture(m.forward, (x,), {})
    assert cap.guard((rand(37, 19),), {})
    m.block.eval()
    assert not cap.guard((x,), {})
    m.block.train()
    assert cap.guard((x,), {})
    m.alpha = 3.0
    assert not cap.guard((x,), {})                                 # module attribute constant
    m.alpha = 2.0
    m.fc.weight = nn.Parameter(torch.randn(23, 19, dtype=torch.float64))
    assert not cap.guard((x,), {})                                 # parameter dtype
    m.fc.weight = nn.Parameter(torch.randn(23, 19))
    assert cap.guard((x,), {})                                     # new weight, same meta: live
    h = m.ln.register_forward_hook(lambda *a: None)
    assert not cap.guard((x,), {})                                 # hooks were not inlined
    h.remove()


def test_guards_globals():
    global SCALE
    cap = capture(calls_helpers, awkward_inputs(torch.float32)(), {})
    args = awkward_inputs(torch.float32)()
    assert cap.guard(args, {})
    old = SCALE
    try:
        SCALE = 4.0
        assert not cap.guard(args, {})
    finally:
        SCALE = old
    assert cap.guard(args, {})


# ------------------------------------------------------------------------------------------
# Unsupported
# ------------------------------------------------------------------------------------------
def has_print(x):
    y = x + 1
    print("y is", y)
    return y


def has_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def has_item(x):
    return x * x.sum().item()


def calls_print_inside(x):
    return has_print(x) * 2


@pytest.mark.parametrize("fn, line, what", [
    (has_print, 'print("y is", y)', "print"),
    (has_branch, "if x.sum() > 0:", "branch"),
    (has_item, "return x * x.sum().item()", "item"),
])
def test_unsupported_names_source_line(fn, line, what):
    with pytest.raises(Unsupported) as ei:
        capture(fn, (rand(4, 5),), {})
    e = ei.value
    assert line in str(e)
    assert what in e.reason
    assert e.user_stack[-1][0] == __file__ and e.user_stack[-1][2] == line


def test_unsupported_inside_inlined_call_shows_both_frames():
    with pytest.raises(Unsupported) as ei:
        capture(calls_print_inside, (rand(4, 5),), {})
    stack = [t for _, _, t in ei.value.user_stack]
    assert stack == ["return has_print(x) * 2", 'print("y is", y)']


def test_inplace_on_input_is_kept_in_the_graph():
    def f(x):
        x.add_(1)
        y = x[0]
        y.mul_(2)
        return x
    x = rand(3, 4)
    before = x.clone()
    cap = capture(f, (x,), {})
    assert torch.equal(x, before)         # tracing did not write the user's tensor
    assert [n.target for n in call_nodes(cap.gm) if n.op == "call_method"] == ["add_", "mul_"]
    assert "STORAGE_PATTERN" in cap.guard_source    # the write is right while inputs do not overlap


def inplace_on_intermediate(x, b):
    y = x * 2
    y.add_(b)
    z = y.view(-1)
    z.mul_(3)
    y += 1
    return y


def test_inplace_on_intermediate_kept():
    cap = check(inplace_on_intermediate, lambda: (rand(37, 19), rand(19)))
    assert [n.target for n in call_nodes(cap.gm) if n.op == "call_method"] == ["add_", "view", "mul_"]


# ------------------------------------------------------------------------------------------
# bytecode layer
# ------------------------------------------------------------------------------------------
def test_python_version_check():
    for v in SUPPORTED_VERSIONS:
        assert check_python_version(v) == v
    for v in [(3, 10), (3, 14), (2, 7)]:
        with pytest.raises(UnsupportedPythonVersion, match="not supported"):
            check_python_version(v)


def test_opcode_tables_per_version():
    t311, t312, t313 = (_REGISTRY[v] for v in SUPPORTED_VERSIONS)
    assert {"PRECALL", "LOAD_METHOD", "KW_NAMES"} <= set(t311)
    assert "RETURN_CONST" not in t311 and "CALL_KW" not in t311
    assert {"RETURN_CONST", "KW_NAMES", "BINARY_SLICE", "LOAD_FAST_CHECK"} <= set(t312)
    assert "LOAD_METHOD" not in t312 and "PRECALL" not in t312
    assert {"CALL_KW", "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "TO_BOOL",
            "RETURN_CONST"} <= set(t313)
    assert "KW_NAMES" not in t313
    # every opcode registered for the running Python exists in it
    assert set(dispatch_table()) <= set(dis.opmap), set(dispatch_table()) - set(dis.opmap)


def test_a_graph_run_node_by_node_gives_the_interpreters_results_and_the_ops_exceptions():
    # how a frame that runs eagerly (or a graph of no ops) runs on every call: each node's
    # target called, as torch.fx.Interpreter would (modules, methods, attributes, keyword
    # arguments, nested outputs), and an op's own exception raised as it is
    from minicompile.capture.output_graph import NodeByNode

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x, table):
            y = self.lin(x).clamp(min=-0.5) * self.scale
            return {"y": y, "parts": [y.sum(1), (lambda t: t - 1)(x)]}, table["k"]

    gm = torch.fx.symbolic_trace(M())
    x = torch.randn(5, 4)
    got, expected = NodeByNode(gm)(x, {"k": torch.ones(1)}), torch.fx.Interpreter(gm).run(x, {"k": torch.ones(1)})
    assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(expected)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)):
        assert torch.equal(a, b)

    def lookup(d, key):
        return operator.getitem(d, key)
    gm = torch.fx.symbolic_trace(lookup)
    with pytest.raises(KeyError):
        NodeByNode(gm)({"present": 1}, "missing")
