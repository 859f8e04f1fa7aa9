"""The loop-level IR: what lowering produces and what fusion and code generation consume.

Takes nothing from other stages; it is the vocabulary they share.

A tensor in the IR is an `IRNode` with a shape and a dtype that knows how to *load* one element
given an index: `node.make_loader()(index) -> value`. Index expressions are explicit (`Index`,
linear combinations of loop variables plus a few floor-division and modulo atoms), so a view
(transpose, broadcast, slice) is only a different index, never a copy. Values are built by calling
operations on `ops`, a handler that is swapped per use: while code is generated it prints C++ or
Triton, while fusion analyses a node it records which buffers it reads. This is how one
`inner_fn` serves every backend (TorchInductor's `V.ops` idea, in miniature).

Sizes are ints, or sympy expressions over size symbols (`s0`, `s27`...) when shapes are
dynamic: a symbolic size is a kernel argument, so a kernel serves every size. Every size that
enters the IR goes through `size_expr` (ints stay ints, expressions are expanded, so equal
sizes compare equal), and nothing decides on a symbolic size except by what holds for every
value it may take (`provably_nonneg`, `divides`); a size symbol is at least 2 (sizes 0 and 1
are specialized before a dimension is made dynamic, as in TorchDynamo).

Nodes:
  InputBuffer   a graph input, with its real strides and offset
  Pointwise     out[i] = inner_fn(i)
  Reduction     out[i] = reduce_{r} inner_fn(i, r), reduction_type in REDUCTIONS (argmax and
                argmin give the position of the best inner_fn value instead of the value)
  Extern        a call of a PyTorch kernel (matrix products, and any op without a lowering)
  ComputedBuffer  a Pointwise or Reduction that fusion decided to store in memory
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import math
import operator
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import sympy
import torch
import torch.utils._pytree as pytree

# --------------------------------------------------------------------------- symbolic sizes

Size = "int | sympy.Expr"


def size_expr(size) -> "int | sympy.Expr":
    """An int, or an expanded sympy expression for a symbolic size (a torch.SymInt's too)."""
    if isinstance(size, torch.SymInt):
        node = size.node            # with the replacements its shape environment has learnt
        size = node.shape_env.replace(node.expr) if node.shape_env is not None else node.expr
    if isinstance(size, sympy.Basic):
        size = sympy.expand(size)
        return int(size) if size.is_Integer else size
    return int(size)


def is_symbolic(size) -> bool:
    return isinstance(size, sympy.Basic)


def shape_of(t: torch.Tensor) -> list:
    return [size_expr(s) for s in t.shape]


def stride_of(t: torch.Tensor) -> list:
    return [size_expr(s) for s in t.stride()]


def has_symbolic_layout(t: torch.Tensor) -> bool:
    """Whether a tensor's sizes or strides are symbols: not where its SymInts are all numbers
    by what the shape environment learnt (a trace whose sizes were specialized)."""
    return any(is_symbolic(size_expr(s)) for s in (*t.shape, *t.stride()))


def hint(size) -> int:
    """A size as the example has it: a symbolic size's value for the example's sizes."""
    return int(size.node.hint) if isinstance(size, torch.SymInt) else int(size)


def shape_conditions(shape_env, reads: dict) -> list[str]:
    """What `shape_env` learnt must hold of its size symbols while ops ran on fake tensors (two
    sizes that broadcast together are equal, a view's sizes divide...), as Python conditions
    over where each symbol is read (`reads`: symbol name -> `arg0.size(1)`), e.g.
    `arg0.size(0) == arg1.size(0)`. Conditions true for every size are left out. A condition
    on a symbol that `reads` does not name raises NotImplementedError."""
    # (each as recorded, not simplified with what the environment learnt since, which would
    # make `s0 == s2` true by having replaced s2 with s0)
    return [size_as_python(guard.expr, reads, "a shape condition") for guard in shape_env.guards
            if guard.expr != sympy.true]


def size_as_python(expr, reads: dict, what: str = "a size") -> str:
    """A sympy expression over size symbols as Python over where each is read (`reads`:
    symbol name -> `arg0.size(1)`): `arg0.size(1) + 1`. One over a symbol that `reads` does not
    name raises NotImplementedError."""
    from torch.utils._sympy.printers import PythonPrinter
    missing = [s for s in expr.free_symbols if str(s) not in reads]
    if missing:
        raise NotImplementedError(f"{what} over a size no input has: {expr}")
    return PythonPrinter().doprint(expr.xreplace({s: sympy.Symbol(reads[str(s)]) for s in expr.free_symbols}))


def function_of_inputs(num_inputs: int, text: str):
    """A Python function of a graph's inputs (arg0, arg1, ...) that returns the expression
    `text` over them (made by size_as_python, or a guard's text)."""
    names = ", ".join(f"arg{i}" for i in range(num_inputs))
    return eval(f"lambda {names}: {text}")


def provably_nonneg(e) -> bool:
    """e >= 0 for every value of its size symbols (each >= 2): true when, writing each symbol
    as 2 + t with t >= 0, every coefficient of the expanded polynomial is >= 0. A sufficient
    test, not a complete one: False means "not known"."""
    if e is None:
        return False
    if not is_symbolic(e):
        return e >= 0
    shifted = sympy.expand(e.subs({v: v + 2 for v in e.free_symbols}, simultaneous=True))
    if not shifted.is_polynomial(*shifted.free_symbols):
        return False
    return all(c >= 0 for c in sympy.Poly(shifted, *shifted.free_symbols).coeffs()) if shifted.free_symbols \
        else shifted >= 0


@functools.lru_cache(maxsize=65536)
def divides(k, v) -> "int | sympy.Expr | None":
    """v / k when it is an integer for every value of the symbols, else None."""
    if not is_symbolic(k) and not is_symbolic(v):
        return v // k if v % k == 0 else None
    q = sympy.cancel(sympy.sympify(v) / k)
    syms = sorted(q.free_symbols, key=str)
    if q.is_Integer:
        return int(q)
    if syms and q.is_polynomial(*syms) and all(c.is_Integer for c in sympy.Poly(q, *syms).coeffs()):
        return size_expr(q)
    return None


_SIMPLIFIED: dict = {}        # (Index, ranges) -> Index.simplified


# a size computed through a float (interpolate's floor(size * scale)), in double precision as
# PyTorch computes it: each conversion as (Triton, Python, C) write it
_CONVERSIONS = {
    "ToFloat": ("({}).to(tl.float64)", "float({})", "static_cast<double>({})"),
    "TruncToInt": ("({}).to(tl.int64)", "int({})", "static_cast<int64_t>({})"),
    "FloorToInt": ("tl.floor({}).to(tl.int64)", "int(({}) // 1)", "static_cast<int64_t>(std::floor({}))"),
}


# the ints the kernels compute with (Python's are unbounded: one past these is made static)
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


# Arithmetic on sizes and float numbers (graph nodes whose value is a float: `n / 4`, `lr * 0.5`)
# as Python writes it, for the wrapper that computes them and the guards that check them
PYTHON_SPELLINGS = {operator.truediv: "({} / {})", operator.add: "({} + {})", operator.sub: "({} - {})",
                    operator.mul: "({} * {})", operator.pow: "({} ** {})", operator.neg: "(-{})",
                    operator.abs: "abs({})",
                    torch.sym_float: "float({})", torch._sym_sqrt: "math.sqrt({})"}


# the size functions whose value is a double
_FLOAT_VALUED = {"ToFloat", "IntTrueDiv", "FloatTrueDiv", "FloatPow", "OpaqueUnaryFn_sqrt"}


class _SizePrinter(sympy.printing.str.StrPrinter):
    """Sizes as C / Python integer expressions: products instead of powers, floor division
    and max/min spelled per language."""

    def __init__(self, floordiv: str):
        super().__init__()
        # (TRITON: Python's spelling, but for what only a Triton kernel can compute)
        self.triton = floordiv == TRITON
        self.floordiv = "//" if self.triton else floordiv

    def _print(self, expr, **kwargs):
        # torch's FloorDiv and Mod print themselves (`a//b`); C needs its own spelling
        name = "FloorDiv" if type(expr).__name__ == "CleanDiv" else type(expr).__name__   # (exact)
        if name in ("FloorDiv", "Mod", "PythonMod", "CeilToInt", "IntTrueDiv", "FloatTrueDiv", "FloatPow",
                    "OpaqueUnaryFn_sqrt"):
            return getattr(self, f"_print_{name}")(expr)
        if name in _CONVERSIONS:
            triton, python, c = _CONVERSIONS[name]
            spelling = triton if self.triton else python if self.floordiv == "//" else c
            return spelling.format(self._print(expr.args[0]))
        return super()._print(expr, **kwargs)

    def _print_Float(self, e):
        # (a Triton kernel's float constant made float64 from the double, not float32)
        return f"tl.full([], {float(e)!r}, tl.float64)" if self.triton else repr(float(e))

    def _print_CeilToInt(self, e):
        # ceil(a / b) of sizes (a padded length: attention's row statistics on a GPU), as
        # (a + b - 1) // b; no other float inside a size
        inner = e.args[0]
        if type(inner).__name__ != "IntTrueDiv":
            raise NotImplementedError(f"size expression {e}")
        a, b = (self._print(x) for x in inner.args)
        return f"((({a}) + ({b}) - 1) {self.floordiv} ({b}))"

    def _print_IntTrueDiv(self, e):
        # a / b with a float result (`n / 4` in the code), as Python computes it: in doubles
        return f"({self._double(e.args[0])} / {self._double(e.args[1])})"

    _print_FloatTrueDiv = _print_IntTrueDiv

    def _print_FloatPow(self, e):
        # n ** 0.5 of a size (a patch grid's side), as Python's and C's pow compute it (a GPU's
        # pow is not correctly rounded; its sqrt is)
        base, exp = e.args
        if self.triton:
            return f"libdevice.sqrt({self._double(base)})" if exp == 0.5 else \
                f"libdevice.pow({self._double(base)}, {self._double(exp)})"
        spelling = "(({}) ** ({}))" if self.floordiv == "//" else "std::pow({}, {})"
        return spelling.format(self._double(base), self._double(exp))

    def _double(self, x) -> str:
        """x as a double (a number a literal, else converted)."""
        if x.is_number:
            return self._print_Float(sympy.Float(x))
        return self._print(x) if x.is_Function and type(x).__name__ in _FLOAT_VALUED else \
            _CONVERSIONS["ToFloat"][0 if self.triton else 1 if self.floordiv == "//" else 2].format(self._print(x))

    def _print_OpaqueUnaryFn_sqrt(self, e):
        spelling = "libdevice.sqrt({})" if self.triton else "math.sqrt({})" if self.floordiv == "//" \
            else "std::sqrt({})"
        return spelling.format(self._double(e.args[0]))

    def _print_Pow(self, e):
        base, exp = e.args
        if exp.is_Integer and exp > 0:
            return "(" + "*".join([self.parenthesize(base, 100)] * int(exp)) + ")"
        raise NotImplementedError(f"size expression {e}")

    def _print_FloorDiv(self, e):
        a, b = (self._print(x) for x in e.args)
        if (self.floordiv == "//" and not self.triton) or e.args[0].is_nonnegative:
            return f"(({a}) {self.floordiv} ({b}))"
        # C's and Triton's / truncate toward zero, Python's // floors: they differ where the
        # numerator is negative, which simplifying a size can make it ((30 - s) // 2 is
        # 15 + (-s) // 2). Less its floored remainder, the numerator is a multiple of b,
        # which either division divides exactly.
        return f"((({a}) - (((({a}) % ({b})) + ({b})) % ({b}))) {self.floordiv} ({b}))"

    def _print_Mod(self, e):
        return f"(({self._print(e.args[0])}) % ({self._print(e.args[1])}))"

    def _print_PythonMod(self, e):
        # Python's % takes the divisor's sign; C's and Triton's the dividend's ((s - 7) % s
        # with s = 5): made non-negative for them
        a, b = (self._print(x) for x in e.args)
        return f"(((({a}) % ({b})) + ({b})) % ({b}))"

    def _print_Max(self, e):
        return self._min_max("max", e.args)

    def _print_Min(self, e):
        return self._min_max("min", e.args)

    def _min_max(self, name, args):
        """Python's builtin, Triton's tl.maximum/tl.minimum or C++'s std:: one, two arguments
        at a time."""
        if self.floordiv == "//" and not self.triton:
            return f"{name}({', '.join(self._print(a) for a in args)})"
        pair = f"tl.{name}imum" if self.triton else f"std::{name}<int64_t>"
        text = self._print(args[0])
        for a in args[1:]:
            text = f"{pair}({text}, {self._print(a)})"
        return text


TRITON = "tl//"     # render_size's language for a Triton kernel's code (Python's is "//", C's "/")


def render_size(size, floordiv: str = "//") -> str:
    if not is_symbolic(size):
        return str(size)
    return _SizePrinter(floordiv).doprint(size)


def size_symbols(size) -> set[str]:
    return {str(v) for v in size.free_symbols} if is_symbolic(size) else set()


def fake_mode_of(values):
    """The fake-tensor mode of the first fake tensor among `values` (nested), or None."""
    from torch._subclasses.fake_tensor import FakeTensor
    return next((v.fake_mode for v in pytree.tree_leaves(values) if isinstance(v, FakeTensor)), None)


def fake_mode():
    """A fake-tensor mode (tensors without data) over a new shape environment, in which the
    sizes of values made by `symbolic_fake` are symbols. Real tensors met on the way (module
    parameters, constants) are taken as they are."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    # (its cache of op results: where sizes are symbols, making and checking each entry costs
    # more than running the op again; off, a model's generic compile takes about a third less)
    mode.cache_enabled = False
    return mode


@contextlib.contextmanager
def quiet_grad_reads():
    """Making a fake tensor reads the tensor's .grad, for which PyTorch warns where it is not a
    leaf: nothing the user did, so not shown (nor raised, under warnings-as-errors)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf")
        yield


def fake_of(mode, value, **kwargs):
    """A fake tensor of `value` in `mode`."""
    with quiet_grad_reads():
        return mode.from_tensor(value, **kwargs)


def symbolic_fake(mode, value, dims, name: str):
    """`value` in `mode` with the dims in `dims` as size symbols: a tensor becomes a fake tensor,
    an int (with non-empty dims) a symbolic int, anything else stays as it is."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext
    if not isinstance(value, torch.Tensor):
        if dims and type(value) is int:
            return mode.shape_env.create_unspecified_symint_and_symbol(value, ConstantSource(name),
                                                                       DimDynamic.DYNAMIC)
        return value
    sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(value.dim())]
    if value.is_leaf and value.grad is not None:
        # (a weight's gradient from the last step: not what the graph takes, and a fake of it
        # would bring size symbols of its own, tied to the weight's by a condition no input reads)
        value = value.detach().requires_grad_(value.requires_grad)
    fake = fake_of(mode, value, source=ConstantSource(name),
                   symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))
    layout = gapped_layout(value.shape, value.stride()) if dims else None
    if layout is not None and any(g != 1 for g in layout[1]):
        # a view with room between items (a split's piece): strides over its own size
        # symbols, where the fake tensor would have a symbol of their own
        with mode:
            made = torch.empty_strided(fake.shape, gapped_strides(fake.shape, *layout), dtype=fake.dtype,
                                       device=fake.device)
        fake = made.requires_grad_(value.requires_grad) if value.requires_grad else made
    return fake


def symbolic_float(mode, value: float, name: str) -> torch.SymFloat:
    """The float `value` as a symbol of `mode`'s shape environment (a float the graph is
    generic in: ops record it as an input instead of its value)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic
    source = ConstantSource(name)
    symbol = mode.shape_env.create_unspecified_symbol(value, source, DimDynamic.DYNAMIC)
    return mode.shape_env.create_symfloatnode(symbol, hint=value, source=source)


def sizes_generic(symbolic: bool = True):
    """Ops run under the Python dispatcher where sizes are symbols, as TorchDynamo runs them:
    composite ops (matmul, linear) then decompose through code written for symbolic sizes
    instead of specializing them."""
    from torch._dispatch.python import enable_python_dispatcher
    return enable_python_dispatcher() if symbolic else contextlib.nullcontext()


@contextlib.contextmanager
def running_symbolically(mode):
    """Run ops on `mode`'s fake values, their sizes kept generic (`sizes_generic`)."""
    with torch.no_grad(), mode, sizes_generic():
        yield


def symbol_reads(value, name: str):
    """(symbol, where the wrapper reads it) for each dim of the tensor `value` (called `name`)
    whose size is a symbol of its own: `("s0", "arg3.size(0)")`; for a size input (a SymInt),
    its own symbol: `("s0", "arg3")`. Also a symbol the shape environment has since replaced
    by another: guards still name it."""
    sizes = [(size, f"{name}.size({d})") for d, size in enumerate(value.shape)] \
        if isinstance(value, torch.Tensor) else [(value, name)]
    for size, read in sizes:
        raw = getattr(size.node, "_expr", size.node.expr) if isinstance(size, (torch.SymInt, torch.SymFloat)) \
            else None
        if raw is not None and raw.is_Symbol:
            yield str(raw), read


# --------------------------------------------------------------------------- index expressions


class Index:
    """sum(coeff * atom) + const, with atoms that are loop variables (str) or
    FloorDiv/Mod atoms. Immutable; + and * by ints fold as they go."""

    __slots__ = ("terms", "const", "_hash", "_text")

    def __init__(self, terms: dict | None = None, const=0):
        # (lowering and code generation make hundreds of thousands of these for a large model:
        # plain ints, the common case, skip the symbolic check)
        kept = {}
        if terms:
            for k, v in terms.items():
                if type(v) is not int and is_symbolic(v):
                    v = size_expr(v)
                if v != 0:
                    kept[k] = v
        self.terms = kept
        self.const = size_expr(const) if type(const) is not int and is_symbolic(const) else const
        self._hash = None
        self._text = None          # render()'s, in Python's spelling (terms are sorted by it)

    @staticmethod
    def var(name: str) -> "Index":
        return Index({name: 1})

    @staticmethod
    def of(value: "Index | int") -> "Index":
        return value if isinstance(value, Index) else Index({}, size_expr(value))

    def __add__(self, other):
        if type(other) is int:
            if other == 0:
                return self
            return Index(self.terms, self.const + other)
        other = Index.of(other)
        if not other.terms:
            return Index(self.terms, self.const + other.const)
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0) + v
        return Index(terms, self.const + other.const)

    __radd__ = __add__

    def __mul__(self, k):
        assert isinstance(k, (int, sympy.Basic)), k
        if type(k) is int and k == 1:
            return self
        return Index({a: c * k for a, c in self.terms.items()}, self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, k) -> "Index":
        if k == 1:
            return self
        if not self.terms and not is_symbolic(self.const) and not is_symbolic(k):
            return Index({}, self.const // k)
        return Index({FloorDiv(self, k): 1})

    def __mod__(self, k: int) -> "Index":
        if k == 1:
            return Index()
        if not self.terms and not is_symbolic(self.const) and not is_symbolic(k):
            return Index({}, self.const % k)
        return Index({Mod(self, k): 1})

    def coeff(self, var: str) -> int:
        return self.terms.get(var, 0)

    def variables(self) -> set[str]:
        out = set()
        for atom in self.terms:
            out |= {atom} if isinstance(atom, str) else atom.index.variables()
        return out

    def nonlinear_variables(self) -> set[str]:
        out = set()
        for atom in self.terms:
            if not isinstance(atom, str):
                out |= atom.index.variables()
        return out

    def substitute(self, mapping: dict[str, "Index"]) -> "Index":
        result = Index({}, self.const)
        for atom, c in self.terms.items():
            if isinstance(atom, str):
                result = result + (mapping[atom] if atom in mapping else Index.var(atom)) * c
            else:
                inner = atom.index.substitute(mapping)
                result = result + (inner // atom.k if isinstance(atom, FloorDiv) else inner % atom.k) * c
        return result

    # -- simplification, given the range of each loop variable (0 <= v < size)

    def bounds(self, ranges: dict):
        """(lo, hi) over the ranges (sizes may be symbolic); None where not known."""
        lo = hi = self.const
        for atom, c in self.terms.items():
            if isinstance(atom, str):
                a_lo, a_hi = 0, size_expr(ranges.get(atom, 2**62)) - 1
            elif isinstance(atom, Mod):
                a_lo, a_hi = 0, size_expr(atom.k - 1)
            else:
                i_lo, i_hi = atom.index.bounds(ranges)
                if is_symbolic(atom.k) or is_symbolic(i_lo) or is_symbolic(i_hi) or None in (i_lo, i_hi):
                    # floor division by k >= 1 of a non-negative value stays in [0, value]
                    if not provably_nonneg(i_lo):
                        return None, None
                    a_lo, a_hi = 0, i_hi
                else:
                    a_lo, a_hi = i_lo // atom.k, i_hi // atom.k
            if lo is None or a_lo is None or a_hi is None:
                return None, None
            if provably_nonneg(c):
                lo, hi = size_expr(lo + c * a_lo), size_expr(hi + c * a_hi)
            elif provably_nonneg(-c):
                lo, hi = size_expr(lo + c * a_hi), size_expr(hi + c * a_lo)
            else:
                return None, None
        return lo, hi

    def simplify(self, ranges: dict) -> "Index":
        """simplified(), remembered: an index nests the same inner index under a division and
        a modulo at each level (a view of a view of a view...), and kernels load the same
        index more than once; with symbolic sizes each proof costs sympy's work."""
        key = (self, tuple(sorted(ranges.items(), key=lambda kv: str(kv[0]))))
        found = _SIMPLIFIED.get(key)
        if found is None:
            if len(_SIMPLIFIED) > 50_000:
                _SIMPLIFIED.clear()
            found = _SIMPLIFIED[key] = self.simplified(ranges)
        return found

    def simplified(self, ranges: dict) -> "Index":
        """Remove divisions and modulos that the ranges make unnecessary:
        (q*k + r) // k -> q and (q*k + r) % k -> r when 0 <= r < k, and
        c*k*(a // k) + c*(a % k) -> c*a. This is what turns a reshape of a contiguous
        tensor back into a plain linear index. With symbolic sizes, a term goes to q only if
        k divides it for every size, and 0 <= r < k must be provable."""
        result = Index({}, self.const)
        for atom, c in self.terms.items():
            if isinstance(atom, str):
                result = result + Index({atom: c})
                continue
            inner = atom.index.simplify(ranges)
            k = atom.k
            q_terms, r_terms = {}, {}
            for a, v in inner.terms.items():
                quotient = divides(k, v)
                if quotient is None:
                    r_terms[a] = v
                else:
                    q_terms[a] = quotient
            if not is_symbolic(inner.const) and not is_symbolic(k):
                q_const, r_const = inner.const // k, inner.const % k
            elif divides(k, inner.const) is not None:
                q_const, r_const = divides(k, inner.const), 0
            else:
                # a symbolic constant term by term: 8 - 96*s0 modulo 96 leaves 8
                q_const, r_const = 0, 0
                for term in sympy.Add.make_args(sympy.expand(sympy.sympify(inner.const))):
                    quotient = divides(k, term)
                    if quotient is None:
                        r_const = size_expr(r_const + term)
                    else:
                        q_const = size_expr(q_const + quotient)
            q, r = Index(q_terms, q_const), Index(r_terms, r_const)
            lo, hi = r.bounds(ranges)
            fits = provably_nonneg(lo) and hi is not None and provably_nonneg(size_expr(k - 1 - hi))
            # (q*k + r) // k == q + r // k and (q*k + r) % k == r % k, and when 0 <= r < k
            # just q and r. The generated code divides as C does, truncating, which agrees
            # with floor division only for a dividend >= 0: a whole index is one where it is
            # read, but r alone may be negative (q*k + r = 96*x1 + 8 - 96*s0), and then the
            # division stays whole
            r_nonneg = provably_nonneg(lo)
            split = None if fits else _split_below(inner, k, ranges)
            if split is not None:
                # (g*h + l) // k == h // (k/g) and (g*h + l) % k == g*(h % (k/g)) + l when
                # g divides k and 0 <= l < g: the rows of a (2*512, 3072) buffer read through
                # a (2, 512, 3072) view, (3072*x0 + x1) // 1572864, are x0 // 512
                g, high, low = split
                simple = (high // (k // g)).simplify(ranges) if isinstance(atom, FloorDiv) \
                    else (high % (k // g)).simplify(ranges) * g + low
            elif isinstance(atom, FloorDiv):
                simple = q if fits else q + r // k if r_nonneg else inner // k
            else:
                simple = r if fits else r % k if r_nonneg else inner % k
            result = result + simple * c
        return result._combine_div_mod()

    def _combine_div_mod(self) -> "Index":
        """c*(e % k) + c*k*(e // k) is c*e; and c*(e % k) + c*k*((e // k) % m) is c*(e % (k*m)):
        a walk of several dims laid out one after another (a channels-last batch norm's rows,
        n, h and w, unflattened from one position) reads as one index, without a division."""
        terms = dict(self.terms)
        for atom, c in list(terms.items()):
            if isinstance(atom, Mod) and atom in terms:
                partner = FloorDiv(atom.index, atom.k)
                if terms.get(partner) == size_expr(c * atom.k):
                    del terms[atom], terms[partner]
                    return (Index(terms, self.const) + atom.index * c)._combine_div_mod()
                above = Index({partner: 1})
                for other, c2 in terms.items():
                    if isinstance(other, Mod) and other.index == above and c2 == size_expr(c * atom.k):
                        del terms[atom], terms[other]
                        return (Index(terms, self.const) + (atom.index % (atom.k * other.k)) * c)._combine_div_mod()
        return self

    def is_linear(self) -> bool:
        return all(isinstance(a, str) for a in self.terms)

    def render(self, floordiv: str = "//") -> str:
        if floordiv == "//":
            # (kept: sorting the terms renders each nested one again, at every level)
            if self._text is None:
                self._text = self._render(floordiv)
            return self._text
        return self._render(floordiv)

    def _render(self, floordiv: str) -> str:
        parts = []
        for atom, c in sorted(self.terms.items(), key=lambda t: str(t[0])):
            if isinstance(atom, str):
                text = atom
            else:
                op = ("//" if floordiv == TRITON else floordiv) if isinstance(atom, FloorDiv) else "%"
                k = render_size(atom.k, floordiv)
                text = f"(({atom.index.render(floordiv)}) {op} {k if not is_symbolic(atom.k) else f'({k})'})"
            coeff = render_size(c, floordiv)
            parts.append(text if c == 1 else f"{coeff}*{text}" if not is_symbolic(c) else f"({coeff})*{text}")
        if self.const != 0 or not parts:
            const = render_size(self.const, floordiv)
            parts.append(f"({const})" if is_symbolic(self.const) else const)
        return " + ".join(parts)

    def symbols(self) -> set[str]:
        """The size symbols the expression uses (kernel arguments)."""
        out = size_symbols(self.const)
        for atom, c in self.terms.items():
            out |= size_symbols(c)
            if not isinstance(atom, str):
                out |= atom.index.symbols() | size_symbols(atom.k)
        return out

    def __repr__(self):
        return self.render()

    def __eq__(self, other):
        return isinstance(other, Index) and self.terms == other.terms and self.const == other.const

    def __hash__(self):
        if self._hash is None:
            self._hash = hash((frozenset(self.terms.items()), self.const))
        return self._hash

    def __reduce__(self):
        # (a hash kept from another process would be wrong here: strings hash per process)
        return Index, (self.terms, self.const)


def _split_below(inner: Index, k, ranges: dict):
    """(g, h, l) with inner == g*h + l, g > 1 dividing k, and 0 <= h, 0 <= l < g over the
    ranges; the largest such g among inner's coefficients, or None (constant sizes only)."""
    if is_symbolic(k) or is_symbolic(inner.const) or any(is_symbolic(v) for v in inner.terms.values()):
        return None
    for g in sorted({abs(v) for v in inner.terms.values() if 1 < abs(v) < k and k % v == 0}, reverse=True):
        high = Index({a: v // g for a, v in inner.terms.items() if v % g == 0}, inner.const // g)
        low = Index({a: v for a, v in inner.terms.items() if v % g != 0}, inner.const % g)
        h_lo, _ = high.bounds(ranges)
        l_lo, l_hi = low.bounds(ranges)
        # (bounds over symbolic ranges are expressions: what holds for every size)
        if h_lo is not None and l_hi is not None and provably_nonneg(h_lo) and provably_nonneg(l_lo) \
                and provably_nonneg(g - 1 - l_hi):
            return g, high, low
    return None


@dataclass(frozen=True)
class FloorDiv:
    index: Index
    k: "int | sympy.Expr"


@dataclass(frozen=True)
class Mod:
    index: Index
    k: "int | sympy.Expr"


def wrap_dim(dim: int, ndim: int) -> int:
    """A dimension argument (negative: counted from the end) as a position, as PyTorch reads
    it: a 0-dim tensor takes 0 and -1 (both 0 here); out of range raises IndexError."""
    from torch._prims_common import canonicalize_dim
    return canonicalize_dim(ndim, dim)


def wrap_dims(dims, ndim: int) -> list[int]:
    """Dimension arguments (an int or a sequence) as sorted distinct positions; none for a
    0-dim tensor, whose 0 and -1 name no dimension of it."""
    dims = {wrap_dim(d, ndim) for d in ([dims] if isinstance(dims, int) else dims)}
    return sorted(dims) if ndim else []


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc = size_expr(acc * size) if is_symbolic(size) else acc * max(size, 1)
    return strides[::-1]


def is_dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a tensor of this shape and these strides covers its memory exactly: each
    element once, no gaps (contiguous, or a permutation of it such as channels-last)."""
    if any(is_symbolic(v) for v in (*shape, *stride)):
        return list(stride) == contiguous_strides(shape)
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    return all(st == de or sz == 1 for st, de, sz in zip(stride, dense_strides(shape, order), shape))


def dense_strides(shape: Sequence[int], order: Sequence[int]) -> list[int]:
    """Strides of a dense tensor whose dims, from outermost to innermost, are `order`
    (range(n): contiguous; (0, 2, 3, 1) for a 4-D tensor: channels-last)."""
    strides, acc = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = acc
        acc = size_expr(acc * shape[d]) if is_symbolic(shape[d]) else acc * max(shape[d], 1)
    return strides


def gapped_layout(shape: Sequence[int], stride: Sequence[int]):
    """(order, gaps) where a tensor's strides are those of a dense tensor with its dims in
    `order` (outermost first) and a whole number of elements' room left after each dim's
    items (`gaps[d]` times what the dims inside it span): 1 everywhere for a dense tensor; 2 for
    the channels of x[:, :2] when x has 4. A view passed on at a graph break (a split's piece)
    keeps its gaps at every size, so its strides are functions of its sizes. None where a
    stride is not such a multiple (a broadcast's 0, a slice along an inner dim)."""
    order = stride_order(stride)
    gaps, span = [1] * len(shape), 1
    for d in reversed(order):
        if shape[d] == 0:
            return None                       # (no items: no layout to speak of)
        if shape[d] == 1:
            continue                          # (never stepped over: any stride will do)
        if stride[d] < span or stride[d] % span:
            return None
        gaps[d], span = stride[d] // span, stride[d] * shape[d]
    return order, gaps


def gapped_strides(shape: Sequence, order: Sequence[int], gaps: Sequence[int]) -> list:
    """The strides of `gapped_layout`'s (order, gaps) at these sizes (ints or SymInts)."""
    strides, span = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = gaps[d] * span
        span = strides[d] * shape[d]
    return strides


def layout_strides(shape: Sequence, order: Sequence[int], gaps: Sequence[int] | None = None) -> list:
    """The strides at these sizes of a tensor dense with its dims in `order` (outermost first),
    with `gaps` (gapped_layout's) room after each dim's items where given."""
    if gaps is None or all(g == 1 for g in gaps):
        return dense_strides(shape, order)
    return [size_expr(s) for s in gapped_strides(shape, order, gaps)]


def stride_order(stride: Sequence[int]) -> list[int]:
    """The dims from outermost to innermost memory position (ties: the earlier dim outer)."""
    return sorted(range(len(stride)), key=lambda d: (-stride[d], d))


CHANNELS_LAST = (0, 2, 3, 1)      # dim order of a 4-D (N, C, H, W) tensor stored as N, H, W, C

# An H100's streaming multiprocessors: where lowering splits a column reduction
# (lowerings._split_factor) and how many columns a Triton program takes (codegen/triton.py's
# _column_config) are sized to keep each of them busy
GPU_MULTIPROCESSORS = 132
# The columns a Triton program of a column reduction takes where there are enough of them to
# keep the multiprocessors busy (128 bytes of float32 along each row it reads); lowering splits
# long columns into enough pieces for that
GPU_COLUMN_BLOCK = 32

# Output pixels (N * H_out * W_out) from which a CPU convolution runs channels-last.
CONV_CHANNELS_LAST_PIXELS = 256


def conv_channels_last(out_shape: Sequence[int]) -> bool:
    """Whether a 2-D convolution on a CPU is given its input channels-last (the layout
    optimization of Inductor's CPU backend), from its output's shape (N, C_out, H_out, W_out).
    oneDNN's channels-last kernels split the work over output pixels: with many of them
    (a 3-channel image, the early layers of a ResNet) they are up to 8x faster than its
    kernels for contiguous tensors, but with few pixels and many channels (the last layers
    of a ResNet on 64-pixel images: 32 to 128 pixels, 256 to 512 channels) they are 1.4x to 3x
    slower, measured on 2 cores. So: channels-last from CONV_CHANNELS_LAST_PIXELS pixels."""
    n, _, h, w = out_shape
    return n * h * w >= CONV_CHANNELS_LAST_PIXELS


def conv_input_channels_last(device, dtype, out_shape: Sequence[int]) -> bool:
    """Whether a 2-D convolution with this output shape is given its input channels-last:
    what lowering does (lower/lowerings.py) and what the training trace records
    (autograd/joint.py), so that the values around a convolution, the saved ones and the
    backward's included, are stored in the layout the convolution reads and writes. On a CPU
    (oneDNN, float32): with many output pixels (conv_channels_last). On a GPU (cuDNN): always,
    as Inductor does. Depthwise convolutions included: PyTorch's kernel for them in the
    contiguous layout is its own, and cuDNN's channels-last one is faster. (The models this
    chose for are timed in benchmarks/results/real_models_h100.json.)"""
    from . import config
    if not config.channels_last_convolutions or len(out_shape) != 4 \
            or any(is_symbolic(s) or isinstance(s, torch.SymInt) for s in out_shape):
        return False                 # (sizes that are symbols: contiguous, as lowering has them)
    device = torch.device(device)
    if device.type == "cpu":
        return dtype == torch.float32 and torch.backends.mkldnn.is_available() and conv_channels_last(out_shape)
    return device.type == "cuda" and dtype in (torch.float32, torch.float16, torch.bfloat16) \
        and torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled


def flat_index(index: Sequence[Index], strides: Sequence[int], offset: int = 0) -> Index:
    out = Index({}, offset)
    for i, s in zip(index, strides):
        out = out + i * s
    return out


def unflatten(flat: Index, shape: Sequence[int]) -> list[Index]:
    """The per-dimension indices of a contiguous tensor of `shape` at flat position `flat`."""
    out, stride = [], 1
    for size in reversed(shape):
        out.append((flat // stride) % size if size != 1 else Index())
        stride = size_expr(stride * size)
    return out[::-1]


# --------------------------------------------------------------------------- ops handlers

class _Virtualized:
    """`ops.add(a, b)` calls whichever handler is installed (`with use_ops(handler)`)."""

    def __init__(self):
        self._handler = None

    def __getattr__(self, name):
        # Resolved when called, so `ops.add` can be passed around before any handler exists.
        def call(*args, **kwargs):
            if self._handler is None:
                raise RuntimeError("no ops handler installed: inner functions run only inside "
                                   "code generation or analysis (with use_ops(...))")
            return getattr(self._handler, name)(*args, **kwargs)
        call.__name__ = name
        return call


ops = _Virtualized()


@contextlib.contextmanager
def use_ops(handler):
    previous, ops._handler = ops._handler, handler
    try:
        yield handler
    finally:
        ops._handler = previous


# The pointwise operations every backend prints (tests/test_codegen.py checks that both do).
# Lowerings may use nothing else, plus:
#   load(name, index), constant(value, dtype), to_dtype(x, dtype, src_dtype), round_to(x, dtype),
#   where(c, a, b),
#   index_expr(index, dtype)   the value of an index expression (a position as a number),
#   masked(mask, body, other)  body() where mask holds, else other; the loads body makes are
#                              performed only where mask holds (they may be out of bounds
#                              elsewhere: a concatenation's inputs outside their range).
#   indirect_indexing(value, size, error=INDEX_ERROR)  an Index variable holding `value` (an
#                              integer computed in the kernel, e.g. loaded from another buffer),
#                              for an index that depends on data (embedding). A value outside
#                              [0, size) is replaced by 0, so no load leaves the tensor, and
#                              its error code is recorded in the graph's INDEX_ERRORS buffer:
#                              the call then raises that error (INDEX_ERROR: IndexError, as
#                              eager's embedding and indexing; RUNTIME_ERROR: RuntimeError, as
#                              its gather) as eager does on a CPU (on a GPU, a device-side
#                              assert, as eager's). error=None: no check, where lowering
#                              computed the value inside [0, size) itself (padding by reflection).
# rand(seed, offset) and randn(seed, offset) are random numbers made inside a kernel (when
# config.fallback_random is off): a float32 in [0, 1) and a standard normal one, from Philox
# 4x32-10 as Triton's tl.rand and tl.randn draw them (the C++ kernels compute the same bits);
# seed is an int64 value, offset an int32 (the element's position).
# neg_float(x) is -x of a float: the sign of a zero is flipped too (Triton's `-x` is 0 - x).
# opaque(x) is x, as a value the compiler may not reason about (on a GPU, Triton's LLVM would
# otherwise narrow an int32 abs of a widened int16 back to the int16 abs that gets -32768 wrong).
# name -> number of operands.
POINTWISE_OPS = {
    "add": 2, "sub": 2, "mul": 2, "truediv": 2, "pow": 2,
    "maximum": 2, "minimum": 2,
    "eq": 2, "ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2,
    "logical_and": 2, "logical_or": 2,
    "neg": 1, "neg_float": 1, "abs": 1, "relu": 1, "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1,
    "sin": 1, "cos": 1, "tanh": 1, "sigmoid": 1, "erf": 1, "reciprocal": 1,
    "floor": 1, "ceil": 1, "logical_not": 1, "isnan": 1,
    "rand": 2, "randn": 2,
    "opaque": 1,
}

# Graph targets that draw from PyTorch's random-number generator. By default each runs as
# PyTorch's own kernel, once and in program order, so the numbers and the generator's state
# after the call are eager's; capture keeps them in the graph even when nothing reads their
# result (eager draws all the same).
RANDOM_FUNCTIONS = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like,
                    torch.randn_like, torch.randint_like, torch.normal, torch.poisson, torch.bernoulli,
                    torch.multinomial, torch.dropout, torch.nn.functional.dropout,
                    torch.nn.functional.dropout1d, torch.nn.functional.dropout2d,
                    torch.nn.functional.dropout3d, torch.nn.functional.alpha_dropout,
                    torch.nn.functional.feature_alpha_dropout, torch.nn.functional.rrelu}
RANDOM_METHODS = {"bernoulli", "bernoulli_", "uniform_", "normal_", "random_", "exponential_",
                  "geometric_", "log_normal_", "cauchy_", "multinomial", "dropout"}


def draws_random_numbers(node) -> bool:
    """Whether an FX node draws from PyTorch's generator: one of RANDOM_FUNCTIONS or
    RANDOM_METHODS, or any call capture saw draw (`meta["draws_random"]`, from the aten ops'
    `nondeterministic_seeded` tag)."""
    if node.meta.get("draws_random"):
        return True
    if node.op == "call_method":
        return node.target in RANDOM_METHODS
    try:
        return node.op == "call_function" and node.target in RANDOM_FUNCTIONS
    except TypeError:                  # an unhashable target
        return False


@contextlib.contextmanager
def preserved_rng():
    """PyTorch's generators (the CPU's, and each GPU's once CUDA is initialized) as they were
    before the block: tracing and compiling run ops on example values, and whatever they draw
    must not be missing from the program's own stream."""
    states = rng_states()
    try:
        yield
    finally:
        set_rng_states(states)


def rng_states() -> tuple:
    """PyTorch's generators' states: the CPU's, and each GPU's once CUDA is initialized."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)


def set_rng_states(states: tuple) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


# The one-element int32 buffer kernels with indirect indexing report an out-of-range index in
# (the wrapper allocates it zeroed, passes it last, and raises if a kernel set it). Not on a
# GPU, where the kernel asserts instead (codegen.triton.asserts_on_device).
INDEX_ERRORS = "index_errors"
INDEX_ERROR, RUNTIME_ERROR = 1, 2        # what INDEX_ERRORS holds: the exception eager raises

# The reduction types a Reduction node may have.
# ("squared_deviations": sum((v - mean(v))^2) over the row, read once: a split variance's pieces)
REDUCTIONS = ("sum", "mean", "max", "min", "prod", "argmax", "argmin", "squared_deviations")

# Reductions whose result is a position, not a value: the flat (row-major) index over
# reduction_ranges of the first greatest (least) value, NaN counting as greatest (least) and
# the first NaN winning, as PyTorch's argmax/argmin. Their src_dtype is the dtype the values
# are compared in; the result is int64.
ARG_REDUCTIONS = ("argmax", "argmin")


class RecordingOps:
    """An ops handler that evaluates nothing and records what an inner_fn reads."""

    def __init__(self):
        self.loads: list[tuple[str, Index]] = []
        self.index_exprs: list[Index] = []      # indices used as values (loop plans must see them)
        self.indirect: list[str] = []           # variables of indirect indices
        self.op_count = 0
        self.op_names: set[str] = set()         # the ops handler methods called (sin, add...)

    def load(self, name: str, index: Index):
        self.loads.append((name, index))
        return "v"

    def index_expr(self, index: Index, dtype):
        self.index_exprs.append(index)
        self.op_count += 1
        return "v"

    def masked(self, mask, body, other):
        body()
        self.op_count += 1
        return "v"

    def indirect_indexing(self, value, size: int, error: int | None = INDEX_ERROR) -> Index:
        self.indirect.append(f"ind{len(self.indirect)}")
        self.op_count += 1
        return Index.var(self.indirect[-1])

    def to_dtype(self, x, dtype, src_dtype=None):
        if src_dtype is not None and compute_dtype(dtype) == src_dtype:
            return x                     # no conversion: not an operation
        self.op_count += 1
        return "v"

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.op_count += 1
            self.op_names.add(name)
            return "v"
        return record


# --------------------------------------------------------------------------- nodes

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
               torch.float64: "float64", torch.int64: "int64", torch.int32: "int32",
               torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
               torch.bool: "bool"}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic is done in: half types are computed in float32 (as Inductor does),
    rounded once when stored."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class IRNode:
    """Every IR value has .shape (list of ints), .dtype, .device and, once it lives in
    memory, a .name."""

    def make_loader(self) -> Callable[[Sequence[Index]], Any]:
        raise NotImplementedError


@dataclass(eq=False)
class InputBuffer(IRNode):
    name: str
    shape: list[int]
    stride: list[int]
    offset: int
    dtype: torch.dtype
    device: torch.device
    shares_memory: bool = False   # another input uses the same storage: writes to it not modelled

    def make_loader(self):
        def load(index):
            return ops.load(self.name, flat_index(index, self.stride, self.offset))
        return load


@dataclass(eq=False)
class SizeInput:
    """A graph input that is a size (an int), not a tensor: TorchDynamo passes the values of
    size symbols this way when shapes are dynamic."""
    name: str
    value: Any


@dataclass(eq=False)
class ScalarInput:
    """A graph input that is a Python float the graph is generic in (a float argument or
    global that changed between calls): a kernel argument named `scalar` (scalar0, ...), read
    with ops.scalar_arg."""
    name: str                     # the graph input (arg3)
    scalar: str                   # the kernel argument (scalar0)


@dataclass(eq=False)
class Pointwise(IRNode):
    shape: list[int]
    dtype: torch.dtype
    device: torch.device
    inner_fn: Callable[[Sequence[Index]], Any]
    origin: str = ""            # the op it was lowered from, for logs
    aliases: bool = False       # a view of its input in eager (shares its memory there)

    def make_loader(self):
        return self.inner_fn


@dataclass(eq=False)
class Reduction(IRNode):
    shape: list[int]            # output shape (reduced dims dropped or kept as 1)
    dtype: torch.dtype
    device: torch.device
    reduction_type: str
    reduction_ranges: list[int]
    inner_fn: Callable[[Sequence[Index], Sequence[Index]], Any]
    src_dtype: torch.dtype = torch.float32
    origin: str = ""
    input_shape: list[int] = field(default_factory=list)   # the shape reduced over
    reduced_dims: list[int] = field(default_factory=list)
    keepdim: bool = False

    @property
    def trailing(self) -> bool:
        """Reduces the last dims of its input: rows that other row-wise work can share."""
        n = len(self.input_shape)
        return bool(self.reduced_dims) and self.reduced_dims == list(range(n - len(self.reduced_dims), n))

    def rnumel(self):
        return size_expr(math.prod(self.reduction_ranges))


@dataclass(eq=False)
class ComputedBuffer(IRNode):
    """A Pointwise or Reduction stored in memory; consumers load from it. Its strides are
    dense: contiguous unless a layout was chosen for it (`dense_strides` in some dimension
    order: channels-last for a convolution's input on a CPU, eager's order for a graph output;
    see TensorBox.realize)."""
    name: str
    data: Pointwise | Reduction
    stride: list = None

    def __post_init__(self):
        if self.stride is None:
            self.stride = contiguous_strides(self.shape)

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return self.data.device

    def make_loader(self):
        strides = self.stride

        def load(index):
            return ops.load(self.name, flat_index(index, strides))
        return load


@dataclass(eq=False)
class Extern(IRNode):
    """A call of a PyTorch operator on realized buffers: extern kernels (mm, conv, attention)
    and the fallback for any op minicompile has no lowering for. Its result has the strides
    PyTorch gives it (recorded from the traced example value)."""
    name: str
    op: Any
    args: tuple
    kwargs: dict
    shape: list[int]
    stride: list[int]
    dtype: torch.dtype
    device: torch.device
    reason: str = ""              # why this op is not generated code ("" for extern kernels)
    kind: str = "function"        # "function": op(*args); "method": args[0].op(*args[1:])
    value_is_tensor: bool = True  # False for ops returning tuples or Python values
    meta_value: Any = None        # the result's layout, as meta tensors (a tensor or a tuple)

    def make_loader(self):
        def load(index):
            return ops.load(self.name, flat_index(index, self.stride))
        return load


@dataclass(eq=False)
class ViewOfBuffer(IRNode):
    """A view (reshape, permute, slice...) of a realized buffer, as strides over its storage."""
    base: IRNode
    shape: list[int]
    stride: list[int]
    offset: int

    @property
    def dtype(self):
        return self.base.dtype

    @property
    def device(self):
        return self.base.device

    @property
    def name(self):
        return self.base.name

    def make_loader(self):
        def load(index):
            return ops.load(self.base.name, flat_index(index, self.stride, self.offset))
        return load


@dataclass
class Program:
    """What lowering hands to fusion: inputs, every node in order, and the outputs."""
    inputs: list                          # InputBuffer (tensors), SizeInput (ints), ScalarInput (floats)
    nodes: list[IRNode]                   # Pointwise / Reduction / Extern, topological order
    outputs: list[Any]                    # IRNode, or a Python scalar / None for non-tensor outputs
    device: torch.device
    output_spec: Any = None               # pytree spec: how outputs nest (tuple, list, single)
    # size symbol -> how the wrapper reads it from the graph's inputs ("arg0.size(1)")
    symbols: dict = field(default_factory=dict)
    # kernel scalar argument -> the graph input it is (a dynamic float: "scalar0" -> "arg3")
    scalars: dict = field(default_factory=dict)
    # a reduction already lowered, by (input, dims, type, result): the same one asked for again
    # (a variance's mean and the mean beside it, as var_mean and batch norm compute them) is it
    reductions: dict = field(default_factory=dict)
    # a matrix product's operand stored with zeros up to aligned sizes, by its FX node: a value
    # two products read (the logits' gradient in a language model's head) is padded once
    padded: dict = field(default_factory=dict)
    # buffer name -> the input or stored box of that name (lowerings.py's _stored_as)
    stored_by_name: dict = field(default_factory=dict)
    _names: Any = field(default_factory=lambda: itertools.count())

    def new_name(self, prefix: str = "buf") -> str:
        return f"{prefix}{next(self._names)}"


def reads_of(node: IRNode) -> RecordingOps:
    """Which buffers a node's inner function loads, and how many ops it does."""
    rec = RecordingOps()
    with use_ops(rec):
        idx = [Index.var(f"i{d}") for d in range(len(node.shape))]
        if isinstance(node, Reduction):
            ridx = [Index.var(f"r{d}") for d in range(len(node.reduction_ranges))]
            node.inner_fn(idx, ridx)
        else:
            node.make_loader()(idx)
    return rec
