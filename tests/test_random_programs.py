"""Property-based tests: random programs of pointwise, reduction and view ops, compiled with
minicompile's backend and compared with eager PyTorch (hypothesis draws the programs)."""
import itertools

import torch
import torch.fx
from hypothesis import HealthCheck, given, settings, strategies as st

import minicompile
from conftest import DEVICE, kernel_backends
from helpers import assert_same
from minicompile.graph_compiler import compile_graph
from minicompile.ir import Index, flat_index, unflatten

UNARY = ["relu", "sigmoid", "tanh", "exp_neg", "abs", "neg", "square", "gelu"]
BINARY = ["add", "sub", "mul", "maximum", "where_gt"]
REDUCE = ["sum", "mean", "amax", "amin"]


def apply_unary(name, x):
    return {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
            "exp_neg": lambda t: torch.exp(-t.abs()), "abs": torch.abs, "neg": torch.neg,
            "square": lambda t: t * t, "gelu": torch.nn.functional.gelu}[name](x)


def apply_binary(name, a, b):
    return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
            "where_gt": lambda p, q: torch.where(p > q, p, q * 0.5)}[name](a, b)


@st.composite
def programs(draw):
    """A list of steps over a pool of tensors of one 3-D shape (plus reductions that keep dims,
    so every value stays broadcastable against the input; a matrix product by a square weight,
    whose result later kernels may be written over)."""
    shape = draw(st.lists(st.integers(1, 9), min_size=3, max_size=3))
    steps = []
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "view", "matmul"]))
        if kind == "unary":
            steps.append(("unary", draw(st.sampled_from(UNARY))))
        elif kind == "binary":
            steps.append(("binary", draw(st.sampled_from(BINARY))))
        elif kind == "reduce":
            steps.append(("reduce", draw(st.sampled_from(REDUCE)), draw(st.integers(0, 2))))
        elif kind == "matmul":
            steps.append(("matmul",))
        else:
            steps.append(("view", draw(st.sampled_from(["transpose", "permute", "flip_view", "slice"]))))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    return shape, steps, layout


def build(steps):
    def fn(x, w):
        pool = [x]
        for step in steps:
            last = pool[-1]
            if step[0] == "unary":
                pool.append(apply_unary(step[1], last))
            elif step[0] == "binary":
                pool.append(apply_binary(step[1], last, pool[0]))
            elif step[0] == "reduce":
                pool.append(last - getattr(torch, step[1])(last, step[2], keepdim=True))
            elif step[0] == "matmul":
                pool.append(last @ w)
            elif step[1] == "transpose":
                pool.append(last.transpose(0, 2).transpose(0, 2) + 0)
            elif step[1] == "permute":
                pool.append(last.permute(1, 2, 0).permute(2, 0, 1) * 1.5)
            elif step[1] == "flip_view":
                pool.append(last.reshape(-1).reshape(last.shape) - 1)
            else:
                pool.append(last[:, :, :1] + last)
        return pool[-1], pool[len(pool) // 2]
    return fn


def make_input(shape, layout):
    if layout == "transposed":
        return torch.randn(*shape[::-1], device=DEVICE).permute(2, 1, 0)
    if layout == "strided":
        return torch.randn(shape[0], shape[1], shape[2] * 2, device=DEVICE)[..., ::2]
    return torch.randn(*shape, device=DEVICE)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_match_eager(program):
    shape, steps, layout = program
    fn = build(steps)
    x = make_input(shape, layout)
    w = torch.randn(shape[2], shape[2], device=DEVICE) / shape[2] ** 0.5
    gm = torch.fx.symbolic_trace(fn)
    expected = fn(x, w)
    for backend in kernel_backends():      # C++ and Triton (interpreted on a CPU)
        minicompile.config.cpu_backend = backend
        actual = compile_graph(gm, [x, w])(x, w)
        for a, e in zip(actual, expected):
            assert_same(a, e)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.data())
def test_index_simplify_keeps_values(shape, data):
    """Index.simplify never changes the value of an index anywhere in its loop ranges."""
    xs = [Index.var(f"x{i}") for i in range(len(shape))]
    ranges = {f"x{i}": s for i, s in enumerate(shape)}
    strides = data.draw(st.lists(st.integers(0, 7), min_size=len(shape), max_size=len(shape)))
    view = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    parts = unflatten(flat_index(xs, strides, data.draw(st.integers(0, 3))), view)
    expr = flat_index(parts, data.draw(st.lists(st.integers(1, 9), min_size=len(parts), max_size=len(parts))))
    simple = expr.simplify(ranges)

    def value(ix, env):
        total = ix.const
        for atom, c in ix.terms.items():
            if isinstance(atom, str):
                v = env[atom]
            else:
                inner = value(atom.index, env)
                v = inner // atom.k if type(atom).__name__ == "FloorDiv" else inner % atom.k
            total += c * v
        return total
    for point in itertools.product(*[range(s) for s in shape]):
        env = {f"x{i}": v for i, v in enumerate(point)}
        assert value(expr, env) == value(simple, env)
