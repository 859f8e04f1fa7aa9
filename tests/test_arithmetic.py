"""Arithmetic as eager computes it, in the generated kernels of both backends.

A property test draws small fused programs (pointwise ops, scalars, casts, comparisons,
reductions) over every dtype, on inputs full of special values (0, -0.0, +-inf, NaN,
subnormals, the dtype's least and greatest values, large and tiny magnitudes), compiles them
through minicompile's backend with C++ and Triton (its interpreter on a CPU) and compares
with eager: exactly for integers and bool, for floats with the same NaN and infinities and a
few units in the last place elsewhere. Then one test per case found wrong once (issue 21),
each through `minicompile.compile` end to end, first call and cached call.
"""
import math
import warnings

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings, strategies as st

import minicompile
from conftest import DEVICE, kernel_backends
from minicompile.graph_compiler import compile_graph

NAN, INF = float("nan"), float("inf")
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = INTS + [torch.bool] + FLOATS

# elementwise tolerance per float dtype, relative: a few units in the last place (transcendental
# functions are other implementations than eager's), and absolute: a few subnormal units
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5, torch.float64: 1e-12}
LEAST_SUBNORMAL = {torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133, torch.float32: 2.0**-149,
                   torch.float64: 2.0**-1074}


def special_values(dtype) -> list:
    if dtype == torch.bool:
        return [True, False]
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return [0, 1, -1, 2, 7, -100, 100, info.min, info.max, info.min + 1, info.max - 1]
    info = torch.finfo(dtype)
    return [0.0, -0.0, INF, -INF, NAN, info.tiny, info.smallest_normal / 4, -info.smallest_normal / 8,
            info.max, info.min, 1.5, -2.5, 0.3, 1e-20 if dtype != torch.float16 else 1e-6,
            1e20 if dtype != torch.float16 else 3e4, -7.0]


def make_input(dtype, shape, seed: int, layout: str):
    """Half special values, half ordinary ones (normal floats, small integers)."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if dtype.is_floating_point:
        ordinary = torch.randn(n, generator=g, dtype=torch.float64) * 3
    elif dtype == torch.bool:
        ordinary = torch.randint(0, 2, (n,), generator=g).double()
    else:
        info = torch.iinfo(dtype)
        ordinary = torch.randint(max(info.min, -300), min(info.max, 300), (n,), generator=g).double()
    specials = special_values(dtype)
    pick = torch.randint(0, len(specials), (n,), generator=g)
    special = torch.rand(n, generator=g) < 0.5
    values = [specials[int(p)] if s else o for p, s, o in zip(pick, special, ordinary.tolist())]
    if dtype.is_floating_point:
        x = torch.tensor(values, dtype=torch.float64).to(dtype)
    else:
        x = torch.tensor([int(v) for v in values], dtype=torch.int64).to(dtype)
    x = x.reshape(shape)
    if layout == "transposed" and len(shape) == 2:
        x = x.t().contiguous().t()           # the same values, column-major
    return x.to(DEVICE)


# --------------------------------------------------------------------------- the program

UNARY = ["neg", "abs", "relu", "exp", "log", "sqrt", "sigmoid", "tanh", "floor", "ceil",
         "reciprocal", "square", "logical_not", "isnan", "sin", "erf"]
BINARY = ["add", "sub", "mul", "truediv", "maximum", "minimum", "eq", "lt", "ge", "logical_and",
          "where_gt"]
REDUCE = ["sum", "amax", "amin", "mean", "prod", "argmax", "argmin", "any", "all"]
POWERS = [0, 1, 2, 3, -1, -2, 0.5, -0.5, 2.5, 4, 1.0]
SCALARS = [1, -1, 3, 300, -7, 0.5, -2.25, 1e10, NAN, INF, True]


def apply(step, pool):
    kind, *rest = step
    a = pool[rest[0] % len(pool)]
    if kind == "unary":
        name = rest[1]
        if name == "square":
            return a * a
        if name == "isnan":
            return a != a
        if name == "sin_of_clamped":       # (sin of a huge float is another library's rounding)
            return torch.sin(a.clamp(-100, 100))
        return getattr(torch, name)(a)
    if kind == "binary":
        b = pool[rest[2] % len(pool)]
        name = rest[1]
        if name == "where_gt":
            return torch.where(a > b, a, b)
        if name in ("add", "sub", "mul", "truediv"):
            return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide}[name](a, b)
        return getattr(torch, name)(a, b)
    if kind == "scalar":
        op, value = rest[1], rest[2]
        return {"add": lambda: a + value, "rsub": lambda: value - a, "mul": lambda: a * value,
                "gt": lambda: a > value}[op]()
    if kind == "pow":
        return a ** rest[1]
    if kind == "clamp":
        return a.clamp(rest[1], rest[2])
    if kind == "cast":
        return a.to(rest[1])
    if kind == "cast_in_range":
        # a float outside an integer type's range (or NaN) converts to what the machine gives:
        # undefined in C++, and in PyTorch; so only values in range are converted
        info = torch.iinfo(rest[1])
        return torch.where(a != a, 0, a).clamp(max(info.min, -2**30), min(info.max, 2**30)).to(rest[1])
    if kind == "reduce":
        return getattr(torch, rest[1])(a, rest[2], keepdim=True)
    raise AssertionError(kind)


def resolve(step, pool):
    """The step as it applies to the values at hand (what tracing cannot ask of a value)."""
    a = pool[step[1] % len(pool)]
    if step[0] == "cast" and a.dtype.is_floating_point and not step[2].is_floating_point \
            and step[2] != torch.bool:
        return ("cast_in_range", *step[1:])
    if step[:3:2] == ("unary", "sin") and a.dtype.is_floating_point:
        return ("unary", step[1], "sin_of_clamped")
    if step[:3:2] == ("reduce", "prod") and a.dtype in (torch.float16, torch.bfloat16) and DEVICE == "cpu":
        # eager's CPU kernel multiplies float16 in float16, each partial product rounded, in
        # its own order (a subnormal partial product loses most digits); minicompile
        # multiplies in float32, as eager's CUDA kernel does: a known difference
        return None
    return step


@st.composite
def steps(draw):
    kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "scalar", "pow", "clamp", "cast",
                                 "reduce"]))
    pick = draw(st.integers(0, 7))
    if kind == "unary":
        return ("unary", pick, draw(st.sampled_from(UNARY)))
    if kind == "binary":
        return ("binary", pick, draw(st.sampled_from(BINARY)), draw(st.integers(0, 7)))
    if kind == "scalar":
        return ("scalar", pick, draw(st.sampled_from(["add", "rsub", "mul", "gt"])), draw(st.sampled_from(SCALARS)))
    if kind == "pow":
        return ("pow", pick, draw(st.sampled_from(POWERS)))
    if kind == "clamp":
        bound = st.sampled_from([None, -1, 0, 2, 200, 0.5, -3.5, NAN, -INF])
        return ("clamp", pick, draw(bound), draw(bound))
    if kind == "cast":
        return ("cast", pick, draw(st.sampled_from(DTYPES)))
    return ("reduce", pick, draw(st.sampled_from(REDUCE)), draw(st.integers(0, 1)))


@st.composite
def chains(draw):
    """Two inputs of one dtype (the second may broadcast) and the steps over them."""
    dtype = draw(st.sampled_from(DTYPES))
    rows, cols = draw(st.integers(1, 5)), draw(st.sampled_from([1, 2, 3, 7, 16, 0]))
    other = draw(st.sampled_from([(rows, cols), (1, cols), (rows, 1)]))
    layout = draw(st.sampled_from(["contiguous", "transposed"]))
    seed = draw(st.integers(0, 2**30))
    return dtype, (rows, cols), other, layout, seed, draw(st.lists(steps(), min_size=2, max_size=6))


def accepted(chain):
    """The chain's inputs, the steps eager runs without an error (others are dropped), and for
    each step's value the float dtype whose precision it has (the coarsest one it went
    through: exp in float32 cast to float64 has float32's last digits), or None."""
    dtype, shape, other, layout, seed, program = chain
    inputs = [make_input(dtype, shape, seed, layout), make_input(dtype, other, seed + 1, "contiguous")]
    pool, kept = list(inputs), []
    precision = [dtype if dtype.is_floating_point else None] * 2

    def coarsest(*dtypes):
        floats = [d for d in dtypes if d is not None and d.is_floating_point]
        return max(floats, key=RTOL.get) if floats else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in program:
            step = resolve(step, pool)
            if step is None:
                continue
            try:
                value = apply(step, pool)
            except (RuntimeError, TypeError, IndexError, ValueError):
                continue
            if not isinstance(value, torch.Tensor) or value.dtype not in DTYPES:
                continue
            operands = [step[1]] + ([step[3]] if step[0] == "binary" else [])
            precision.append(coarsest(value.dtype, *[precision[i % len(pool)] for i in operands]))
            pool.append(value)
            kept.append(step)
    return inputs, kept, precision[2:]


def build(chains_steps):
    """One function over every chain's two inputs (x0, x1, ...: one argument each, so that
    the graph has one input each), returning each chain's values."""
    def run(inputs):
        outs = []
        for k, steps_ in enumerate(chains_steps):
            pool = [inputs[2 * k], inputs[2 * k + 1]]
            for step in steps_:
                pool.append(apply(step, pool))
            outs += pool[2:]
        return tuple(outs)
    names = ", ".join(f"x{i}" for i in range(2 * len(chains_steps)))
    namespace = {"run": run}
    exec(f"def fn({names}):\n    return run([{names}])", namespace)
    return namespace["fn"]


def assert_same_values(actual, expected, precision=None, where=""):
    """Integers and bool exactly; floats: the same NaN, the same infinities, and elsewhere a
    few units in the last place of `precision` (a float dtype; default: their own)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
        (where, actual.dtype, expected.dtype, actual.shape, expected.shape)
    a, e = actual.cpu(), expected.cpu()
    if not e.dtype.is_floating_point:
        assert torch.equal(a, e), f"{where}\ncompiled {a}\neager    {e}"
        return
    assert torch.equal(a.isnan(), e.isnan()), f"{where}: NaN differ\ncompiled {a}\neager    {e}"
    assert torch.equal(a == INF, e == INF) and torch.equal(a == -INF, e == -INF), \
        f"{where}: infinities differ\ncompiled {a}\neager    {e}"
    finite = e.isfinite()
    a64, e64 = a[finite].double(), e[finite].double()
    precision = precision or e.dtype
    bad = (a64 - e64).abs() > RTOL[precision] * e64.abs() + 4 * LEAST_SUBNORMAL[e.dtype]
    assert not bad.any(), f"{where}\ncompiled {a64[bad]}\neager    {e64[bad]}"


@settings(max_examples=14, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(chains(), min_size=3, max_size=3))
def test_random_programs_of_every_dtype_match_eager(drawn):
    """Three chains per graph (one compile per backend for all three). The examples are the
    same on every run (derandomize), so CI is repeatable; `check_programs` with more examples
    drawn at random explores further."""
    check_programs(drawn)


def check_programs(drawn):
    inputs, kept, owner, precision = [], [], [], []
    for k, chain in enumerate(drawn):
        chain_inputs, chain_steps, chain_precision = accepted(chain)
        inputs += chain_inputs
        kept.append(chain_steps)
        owner += [k] * len(chain_steps)
        precision += chain_precision
    fn = build(kept)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fn(*inputs)
        gm = torch.fx.symbolic_trace(fn)
        for backend in kernel_backends():
            minicompile.config.cpu_backend = backend
            compiled = compile_graph(gm, list(inputs))
            for call in ("first", "second"):
                actual = compiled(*inputs)
                for k, (a, e) in enumerate(zip(actual, expected)):
                    c = owner[k]
                    assert_same_values(a, e, precision[k], f"{backend}, {call} call: value {k} of the chain "
                                                           f"{kept[c]} over {inputs[2 * c]} and {inputs[2 * c + 1]}")


# --------------------------------------------------------------------------- cases, end to end

def check_compiled(fn, *inputs, exact=False, precision=None):
    """minicompile.compile(fn) equals eager on a first call and on a cached call (new values of
    the same shapes), exactly for integers and bool (and floats too where `exact`)."""
    compiled = minicompile.compile(fn)
    for call in range(2):
        args = inputs if call == 0 else [vary(x) for x in inputs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = fn(*args)
            actual = compiled(*args)
        leaves = torch.utils._pytree.tree_leaves
        for a, e in zip(leaves(actual), leaves(expected)):
            if exact:
                assert a.dtype == e.dtype and torch.equal(a.isnan(), e.isnan()) \
                    and torch.equal(a.nan_to_num(), e.nan_to_num()), (call, a, e)
            else:
                assert_same_values(a, e, precision, f"call {call}")
    assert minicompile.metrics.graphs == 1, "the second call used the cached entry"
    return compiled


def vary(x):
    """Other values of x's shape and dtype (the same special values, shuffled)."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return x
    g = torch.Generator().manual_seed(x.numel())
    return x.reshape(-1)[torch.randperm(x.numel(), generator=g).to(x.device)].reshape(x.shape)


def t(values, dtype):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_small_integers_wrap_where_they_are_read_again(kernel_backend, dtype):
    """uint8 10 - 111 is 155, not -101, when a comparison, a widening cast or a sum reads it."""
    info = torch.iinfo(dtype)
    x = t([10, info.max, info.min, 3, 100, info.max - 1], dtype)
    y = t([111, 2, 1, info.max, 100, info.max], dtype)

    def fn(x, y):
        d, s, p = x - y, x + y, x * y
        n = -x          # -(-32768) is -32768 in int16: read by a widening cast, a compare, a sum
        return (d > 100, d.to(torch.int64), d.sum(), s < 0, s.float(), (p * 3).sum(0),
                n.to(torch.int64), n > 0, n.float(), n.sum())
    check_compiled(fn, x, y)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_abs_of_the_minimum_wraps(kernel_backend, dtype):
    """abs(-32768) is -32768 in int16, also when a widening cast reads it."""
    info = torch.iinfo(dtype)
    x = t([10, info.max, info.min, -3, 0, info.min + 1], dtype)
    check_compiled(lambda x: (x.abs().to(torch.int32), x.abs() < 0), x)


def test_int64_wraps(kernel_backend):
    x = t([2**62, -2**63, 2**63 - 1, 5], torch.int64)
    check_compiled(lambda x: (x * 4, x + x, -x, x.abs(), (x + 1) < x), x)


def test_floats_through_integers_and_back(kernel_backend):
    """float(int(x)) of x in (-1, 0) is +0.0 (GCC folded it into trunc(x), -0.0 under
    -fno-trapping-math); int64s past 2**53 are rounded once; a float past int8's or int16's
    range wraps through a wide integer as eager's conversion does (200.0 -> -56; a GPU's
    conversion saturated), and a negative float to uint8 wraps (-5.5 -> 251)."""
    x = t([-0.5, -0.9, 0.5, 1.7, -3.2, 100.0, -100.0, 7.0], torch.float32)
    check_compiled(lambda x: (1 / x.int().float(), 1 / x.long().float(), 1 / x.to(torch.int16).float()), x)
    big = t([2**60 + 2**36 + 1, 2**60 + 3 * 2**36, -5, 2**53 + 1], torch.int64)
    minicompile.metrics.reset()
    check_compiled(lambda i: i.float() - 2.0**60, big, exact=True)
    wide = t([200.0, -200.0, 300.7, -0.5, -102582.0, 40000.0], torch.float32)
    minicompile.metrics.reset()
    check_compiled(lambda x: (x.to(torch.int8).float(), x.to(torch.uint8).to(torch.int32),
                              (x * 1).to(torch.int16), (x * 1).to(torch.int8)), wide)
    # a negative float to uint8 wraps (through int64, as PyTorch's cast): on a GPU too, whose
    # direct conversion gives 0
    negative = t([-300.7, -200.2, -5.5, -1.0, 100.2, 1000.0], torch.float32)
    minicompile.metrics.reset()
    check_compiled(lambda x: x.to(torch.uint8), negative)


def test_a_product_is_rounded_before_it_is_added(kernel_backend):
    """a * a - b * b of equal a and b is 0, as eager rounds each product before subtracting:
    the C++ compiler had fused one product into the subtraction (a multiply-add, rounded once),
    leaving a rounding error of either sign, and sqrt of it NaN in half the places."""
    torch.manual_seed(0)
    a = torch.randn(1000, device=DEVICE)
    check_compiled(lambda a, b: (torch.sqrt(a * a - b * b), torch.sign(a * b - b * a)), a, a.clone(), exact=True)


def test_half_precision_powers_are_the_devices_kernels(kernel_backend):
    """float16 x ** 0.5: pow on a CPU (eager's kernel calls it for every exponent: (-inf) ** 0.5
    is inf), sqrt on a GPU (CUDA's kernel: NaN); x ** 2 and x ** 3 multiply."""
    x = t([-float("inf"), 65504.0, 2.0, 7.3, 0.0, -0.0, -3.5], torch.float16)
    check_compiled(lambda x: (x ** 0.5, x ** 2, x ** 3), x, exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_negating_a_zero_flips_its_sign(kernel_backend, dtype):
    """-(+0.0) is -0.0, so 1 / -x at x = +0.0 is -inf: Triton's unary minus is 0 - x, which
    gave +0.0 and +inf."""
    x = t([0.0, -0.0, 1.5, -2.0, float("inf")], dtype)
    check_compiled(lambda x: (1 / (-x), 1 / torch.neg(x * 2)), x, exact=True)


@pytest.mark.skipif(DEVICE != "cpu", reason="eager's result is the CPU's conversion (x86's)")
def test_a_float_past_an_integers_range_converts_as_eagers_cpu_kernels(kernel_backend):
    """NaN, infinities and floats past int32's or int64's range convert to the type's lowest
    value in eager's CPU kernels (x86's conversion; to int8 or int16 through int32, whose lowest
    value has zero low bits). A C++ conversion of them is undefined:
    GCC folded a constant one (a NaN to 0, 1e20 to the highest value) and int(x) made float
    again into trunc(x), keeping 3e9 in an "int32"."""
    if kernel_backend != "cpp":
        pytest.skip("the C++ kernels' conversion")
    x = t([-1.5, 0.5, 2.0, -3.0, 3e9, -1e30, float("inf"), float("nan")], torch.float64)
    check_compiled(lambda x: (torch.where(x > 0, float("nan"), x).long(), torch.where(x > 0, 1e20, x).int(),
                              x.int().double(), x.long(), x.float().int(), x.bfloat16().long(),
                              x.short(), x.char(), x.float().short(), (x * 1e9).float().short()), x)


def test_integer_scalars_wrap_into_the_tensors_dtype(kernel_backend):
    """uint8 x + 300 adds 44, x > 300 compares with 44, clamp(-5, 100) of uint8 clamps to 251
    then 100: as eager converts the scalar."""
    x = t([1, 250, 44, 0, 255], torch.uint8)
    check_compiled(lambda x: (x + 300, x > 300, x.clamp(-5, 100), x * 2, x - 1), x)


def test_a_wider_zero_dim_tensor_wraps_into_the_tensors_dtype_in_comparisons(kernel_backend):
    """uint8 x < int8 tensor(-100) compares with 156: a 0-dim tensor ranks below one with dims
    of its kind in type promotion (as a Python scalar does), so it is converted to uint8."""
    x = t([0, 5, 100, 160, 255], torch.uint8)
    check_compiled(lambda x, s, w: (x < s, x >= s, x == w, x.to(torch.int8) > w.to(torch.int16)),
                   x, t(-100, torch.int8), t(300, torch.int64))


def test_bool_arithmetic_is_bool(kernel_backend):
    """True + True is True (logical or), True * False is False: never 2."""
    b, c = t([True, False, True, False], torch.bool), t([True, True, False, False], torch.bool)
    check_compiled(lambda b, c: (b + c, (b + c).int(), b * c, (b * c).sum(), torch.maximum(b, c),
                                 torch.minimum(b, c), (b + c + c).to(torch.float32)), b, c)


@pytest.mark.parametrize("op", ["amax", "amin", "any", "all", "sum", "prod"])
def test_bool_row_reductions(kernel_backend, op):
    x = t([[False] * 5, [True] * 5, [False, True, False, False, False]], torch.bool)
    check_compiled(lambda x: (getattr(torch, op)(x, 1), getattr(torch, op)(x, 0)), x)


@pytest.mark.parametrize("dtype", INTS)
def test_max_and_min_of_rows_of_the_dtypes_extremes(kernel_backend, dtype):
    """A row of only -32768 (int16) has max -32768, not the identity -32767."""
    info = torch.iinfo(dtype)
    x = t([[info.min] * 6, [info.max] * 6, [info.min, info.max, 0, 1, info.min, 2]], dtype)
    check_compiled(lambda x: (x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), x.max(1).values,
                              x.amax(0), x.argmin(0)), x)


def test_argmax_argmin_ties_keep_the_first(kernel_backend):
    x = t([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, 2.0, 2.0], [NAN, 1.0, NAN, 5.0], [-INF, -INF, INF, INF]],
          torch.float32)
    check_compiled(lambda x: (x.argmax(1), x.argmin(1), x.argmax(0), x.argmin(0), x.argmax()), x)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, -1, -2, -3, 0.5, -0.5, 2.5, 1 / 3, -1.5])
def test_powers_of_special_values(kernel_backend, k):
    """inf ** 2.5 is inf (not NaN), 0 ** -1 is inf, (-8) ** (1/3) is NaN, NaN ** 0 is 1."""
    x = t([INF, -INF, 0.0, -0.0, NAN, 1.0, -1.0, -8.0, 2.0, 1e20, 1e-20, 3.5e-39, -2.5], torch.float32)
    check_compiled(lambda x: (x ** k, torch.pow(x.double(), k)), x)


def test_powers_of_integers_and_tensor_exponents(kernel_backend):
    x = t([2, -3, 0, 127, -128, 5], torch.int8)
    e = t([0.5, 2.0, -1.0, INF, NAN, 3.0], torch.float32)
    check_compiled(lambda x, e: (x ** 2, x ** 3, x ** 7, x ** 0, torch.pow(x.float(), e),
                                 torch.pow(e, e)), x, e)


def test_exp_keeps_subnormals(kernel_backend):
    """exp of -103.9 .. -87 in float32 is subnormal, as eager computes it (not 0)."""
    x = torch.linspace(-105, -86, 2001, device=DEVICE)
    c = check_compiled(lambda x: (torch.exp(x), torch.sigmoid(-x - 20)), x)
    assert (c(x)[0] > 0).sum() == (torch.exp(x) > 0).sum()


def test_mean_of_large_values_keeps_eagers_digits(kernel_backend):
    """A float32 mean of 1.4 million values near 1e20: eager's cascade summation is off by
    about 1e-8 of the exact mean; adding in float32 one by one (per vector lane) was off by
    1e-5. The compiled mean must be as close as eager's, give or take a few units in the
    last place, first call and cached call."""
    x = 1e20 + torch.randn(1823, 781, device=DEVICE) * 1e18
    compiled = minicompile.compile(lambda x: (x.mean(), x.sum(), x.mean(1)))
    for call in range(2):
        x = x if call == 0 else vary(x)
        exact = [x.double().mean(), x.double().sum(), x.double().mean(1)]
        for got, eager, truth in zip(compiled(x), (x.mean(), x.sum(), x.mean(1)), exact):
            allowed = 2 * (eager.double() - truth).abs() + 5e-7 * truth.abs()     # 4 units
            assert ((got.double() - truth).abs() <= allowed).all(), (call, got, eager, truth)


def test_var_and_std_where_the_divisor_is_not_positive(kernel_backend):
    """var with correction >= n divides by max(n - correction, 0): inf (NaN for a constant
    row), as eager."""
    x = torch.randn(4, 2, device=DEVICE)
    x[3] = 1.5
    check_compiled(lambda x: (torch.var(x, 1, correction=2), torch.std(x, 1, correction=3),
                              torch.var(x[:, :1], 1, correction=2), torch.var(x, correction=8)), x)


@pytest.mark.skipif(DEVICE != "cpu", reason="PyTorch's CUDA kernels accumulate in float32")
def test_var_of_large_values_does_not_overflow_on_a_cpu(kernel_backend):
    """On a CPU eager accumulates float32 statistics in double: squares near 1e38 do not
    overflow."""
    x = torch.randn(8, 300) * 1e19
    check_compiled(lambda x: (x.var(1), x.std(), torch.var(x, 0, correction=0)), x)


def test_nan_propagates_through_max_min_clamp(kernel_backend):
    x = t([NAN, 1.0, -INF, INF, 0.0, -0.0, 2.0], torch.float32)
    y = t([0.0, NAN, NAN, 3.0, -0.0, 0.0, 2.0], torch.float32)
    # (NaN bounds written out: a guard on a global NaN never holds, NaN != NaN)
    check_compiled(lambda x, y: (torch.maximum(x, y), torch.minimum(x, y), x.clamp(0, 1),
                                 x.clamp(min=float("nan")), x.clamp(max=float("nan")), x.clamp(-1, float("nan")),
                                 x.relu(), torch.where(x > y, x, y), x.clamp(y, y + 1), x.clamp(max=y),
                                 x.reshape(1, -1).amax(1), y.reshape(1, -1).amin(1)), x, y)


def test_clamp_keeps_the_sign_of_a_zero_at_its_bound(kernel_backend):
    """clamp(-0.0, min=0.0) is -0.0 in eager's CPU kernels (x is kept unless it is beyond a
    bound): relu6, hardtanh and clamp's bounds too. Compared by sign bit, which assert_close
    does not see."""
    if kernel_backend != "cpp":
        pytest.skip("the C++ kernels serve CPU tensors, whose eager kernels are the reference here")
    x = t([0.0, -0.0, 1.0, -1e-30, 6.0, -6.0, -1.0], torch.float32)
    fn = lambda x: (x.clamp(min=0.0), x.clamp(max=0.0), F.relu6(x), F.hardtanh(x, 0.0, 6.0), x.relu(),
                    x.clamp(-1.0, 6.0))
    for got, expected in zip(minicompile.compile(fn)(x), fn(x)):
        assert torch.equal(got.signbit(), expected.signbit()) and torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_erf_of_a_negative_zero_in_half_precision_is_negative_zero(kernel_backend, dtype):
    """ATen's float32 erf for half precision gives its result x's sign bit: erf(-0.0) is -0.0
    (the compiled code chose the sign by `x < 0`, and gave +0.0)."""
    x = t([0.0, -0.0, 1e-3, -1e-3, 2.0, -2.0, -0.0, 0.0, 0.5], dtype)
    got, expected = minicompile.compile(lambda x: torch.erf(x))(x), torch.erf(x)
    assert torch.equal(got.signbit(), expected.signbit()) and torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_clamp_of_integers_with_float_and_nan_bounds(kernel_backend, dtype):
    """An integer tensor clamped to float bounds is a float tensor (this compiled to bad C++)."""
    x = t([0, 1, 3, 100, 7], dtype)
    check_compiled(lambda x: (x.clamp(0.5, 2.5), x.clamp(min=float("nan")), x.clamp(max=1.5), x.clamp(-1, 2)), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rounds_after_every_op_as_eager(kernel_backend, dtype):
    """Each op's result is rounded to the dtype where eager rounds it (its kernels compute in
    float32 and round when they store), so fused elementwise work gives eager's bits, also at
    the edge of float16's range (65504 + 16 - 16 is inf in eager)."""
    big = torch.finfo(dtype).max
    x = torch.cat([torch.randn(200, device=DEVICE), t([big, -big, 1e-7, 3.0, 1 / 3], torch.float32)]).to(dtype)
    y = torch.cat([torch.randn(200, device=DEVICE), t([16.0, -16.0, 1e-7, 7.0, 3.0], torch.float32)]).to(dtype)
    check_compiled(lambda x, y: (x * y + x, (x + y) - y, x / y * y, (x - y) * 0.1 + 1, x.float() * 3,
                                 (x * 3).float()), x, y, exact=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_numbers_with_half_tensors_as_eagers_kernels_take_them(kernel_backend, dtype):
    """The comparisons convert a Python number to the tensor's dtype first (x == 0.1
    compares with float16's 0.1), as does pow's exponent, and on a CPU add and sub too (x +
    1000.7 adds bfloat16's 1000; on a GPU they take it as it is); mul and div take it as it is;
    number / x is x's reciprocal times the number."""
    x = torch.cat([torch.randn(300, device=DEVICE), t([0.1, 1 / 3, 0.0999, 300.0, -2.265625], torch.float32)]).to(dtype)
    check_compiled(lambda x: (x + 1000.7, x - 0.1, 3.14159 - x, 1e-4 / x, x * 0.1, x == 0.1, x < 1 / 3,
                              x >= 0.1, x ** 1.0024, x + 1001), x, exact=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_layer_norm_and_softmax_keep_float32_statistics(kernel_backend, dtype):
    """A row's mean, variance, exponentials and their sum stay float32, rounded once in the
    result, as eager's kernels keep them: rows about 1000 (bfloat16's step there is 4) keep
    their deviations."""
    x = (torch.randn(4, 1000, device=DEVICE) * 4 + 1000).to(dtype)
    w, b = torch.randn(1000, device=DEVICE).to(dtype), torch.randn(1000, device=DEVICE).to(dtype)

    def f(x, w, b):
        return F.layer_norm(x, (1000,)), F.layer_norm(x, (1000,), w, b), (x - 1000).softmax(-1), \
            (x - 1000).log_softmax(-1)
    exact = f(x.double(), w.double(), b.double())
    for got, want, best in zip(minicompile.compile(f)(x, w, b), f(x, w, b), exact):
        # eager's error from the float64 result, give or take a unit in the last place
        error, eagers = (got.double() - best).abs().max(), (want.double() - best).abs().max()
        assert error <= eagers + 2 * torch.finfo(dtype).eps * best.abs().max(), (error, eagers)


def test_half_precision_reduction_read_again_in_its_kernel(kernel_backend):
    """A float16 sum that the next op reads from a register is rounded as the stored one."""
    x = torch.randn(64, 100, device=DEVICE).to(torch.float16)
    check_compiled(lambda x: x - x.sum(1, keepdim=True), x, precision=torch.float16)


def test_tiny_values_through_tanh_and_erf(kernel_backend):
    """tanh(1e-20) is 1e-20 (2 sigmoid(2x) - 1 gave 0); erf as eager computes it per dtype."""
    x = t([1e-20, -1e-30, 3e-39, 1e-8, 0.5, -3.0, 20.0, NAN, INF], torch.float32)
    check_compiled(lambda x: (torch.tanh(x), torch.erf(x.to(torch.bfloat16)), torch.erf(x.half())), x)
    # float32 erf, and gelu that is made of it, within one unit in the last place of erf's
    # result: eager computes them differently per machine. On a CPU its gelu uses a polynomial
    # erf whose last digits depend on the vector instructions (and gelu(inf) is inf in its
    # scalar loop, NaN in its AVX-512 one: left out); on a GPU, generated kernels call
    # libdevice's erf (as Inductor's do) and eager's kernels the CUDA math library's erff, which
    # differ by one unit on 17% of float32 inputs in [-4.3, 4.3] (H100, CUDA 13, Triton 3.6).
    # gelu's 1 + erf(x/√2) magnifies one unit near x = -3 (2e-5 relative).
    # (a subnormal result may also differ by its one smallest step, 2**-149)
    x = x[:-1]
    for fn, spread in ((lambda x: torch.erf(x), 0.0), (lambda x: torch.nn.functional.gelu(x), 1.0)):
        compiled = minicompile.compile(fn)         # a lambda: a builtin itself would run eagerly
        for call in range(2):
            args = x if call == 0 else vary(x)
            actual, expected = compiled(args).cpu(), fn(args).cpu()
            assert torch.equal(actual.isnan(), expected.isnan()) and torch.equal(actual.isinf(), expected.isinf())
            finite = expected.isfinite()
            ulp = 1.2e-7 * (expected.abs() + spread * args.cpu().abs()) + 2.0 ** -149
            assert ((actual - expected).abs() <= ulp)[finite].all(), (fn, call, actual, expected)
    assert minicompile.metrics.graphs >= 3, "erf and gelu were compiled, not run eagerly"


def test_float_to_integer_casts_in_range(kernel_backend):
    """Toward zero (a float out of the integer type's range converts to what the machine gives,
    in eager too: not tested)."""
    x = t([1.5, -2.5, 100.7, -0.9, 127.0, 0.0, 3.99, -128.0], torch.float32)
    check_compiled(lambda x: (x.to(torch.int8), x.abs().to(torch.uint8), x.int(), x.long(), x.bool(),
                              x.to(torch.int16) * 300, (x * 1e30).bool()), x)


@pytest.mark.parametrize("shape, dim", [((3, 0), 1), ((0, 3), 0), ((0, 3), 1), ((2, 0, 4), 1)])
def test_reductions_over_empty_dims(kernel_backend, shape, dim):
    """A sum over a dim of size 0 is 0 (it crashed the process with Triton), prod 1, mean NaN."""
    x = torch.randn(shape, device=DEVICE)
    check_compiled(lambda x: (x.sum(dim), x.prod(dim), x.mean(dim), x.sum(), (x * 2).sum(dim, keepdim=True),
                              torch.var(x, dim)), x)


def test_empty_tensors_through_pointwise_and_views(kernel_backend):
    x, y = torch.randn(5, 0, device=DEVICE), torch.randn(0, device=DEVICE)
    check_compiled(lambda x, y: (x.t() + 1, x.reshape(0, 5) * 2, torch.relu(x) + y, x.unsqueeze(0).exp(),
                                 x[:, ::2] - 1, (x > 0).sum(1)), x, y)


def test_max_of_an_empty_dim_raises_as_eager(kernel_backend):
    f = minicompile.compile(lambda x: (x * 2).amax(1))
    with pytest.raises(IndexError, match="non-zero size"):
        f(torch.randn(3, 0, device=DEVICE))


@pytest.mark.skipif(DEVICE != "cpu", reason="C++ kernels are for CPU tensors")
def test_a_kernel_the_compiler_rejects_runs_on_pytorch(monkeypatch):
    """Generated code that g++ refuses is our bug, not the user's: the graph runs on
    PyTorch's kernels (with a warning and the reason in the output_code log), right results."""
    from minicompile.codegen.cpp import CppWriter
    monkeypatch.setattr(minicompile.config, "cpu_backend", "cpp")
    monkeypatch.setitem(CppWriter.OPS, "sigmoid", "this_is_not_cpp({0})")
    f = minicompile.compile(lambda x: torch.sigmoid(x) * 2 + 1)
    x = torch.randn(8, 8)
    with pytest.warns(UserWarning, match="did not compile, so this graph runs on PyTorch's kernels"):
        assert torch.equal(f(x), torch.sigmoid(x) * 2 + 1)
    assert torch.equal(f(x), torch.sigmoid(x) * 2 + 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_times_a_zero_dim_float32_tensor_as_eager(kernel_backend, dtype):
    """x_f16 / torch.tensor(1e5): eager's CPU kernels take a second operand that is a 0-dim
    float32 (or float64) tensor as a number, in float32, unrounded; it was rounded to float16
    first (1e5 is inf there: every result 0). A first one (s * x) is converted, as on a GPU."""
    x = t([-300.5, 2047.0, 3.0, -0.001, 65000.0, 1.5, 0.1], dtype)
    check_compiled(lambda x, s, d: (x * s, x / s, s * x, x / d, x * torch.tensor(0.7, device=x.device)),
                   x, t(1e5, torch.float32), t(1e-8, torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_dynamic_size_added_to_half_precision_is_rounded_to_it(kernel_backend, dtype):
    """ones_f16 + n with n a dynamic size (2049): eager converts n to float16 first (2048), as it
    converts a constant; the size was added exactly (2050)."""
    def fn(x):
        n = x.shape[0]
        return x + n, x == n, x - n * 3

    compiled = minicompile.compile(fn, dynamic=True)
    for n in (2049, 4099, 257):
        x = torch.full((n,), float(n - 1), dtype=dtype, device=DEVICE)
        for got, expected in zip(compiled(x), fn(x)):
            assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_a_short_sum_of_negative_zeros_is_positive_zero(kernel_backend, dtype):
    """Eager's sum starts from +0.0: a sum or mean of -0.0s over a short (unrolled) or size-one
    dim is +0.0 (1 / it is inf); it was -0.0."""
    x = torch.full((4, 3, 1), -0.0, dtype=dtype, device=DEVICE)
    check_compiled(lambda x: (1 / x.sum(0), 1 / x.sum(2), 1 / x.mean(1), 1 / x.sum((1, 2))), x)
