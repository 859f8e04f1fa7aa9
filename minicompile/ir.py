"""The loop-level IR: what lowering produces and what fusion and code generation consume.

Takes nothing from other stages; it is the vocabulary they share.

A tensor in the IR is an `IRNode` with a shape and a dtype that knows how to *load* one element
given an index: `node.make_loader()(index) -> value`. Index expressions are explicit (`Index`,
linear combinations of loop variables plus a few floor-division and modulo atoms), so a view
(transpose, broadcast, slice) is only a different index, never a copy. Values are built by calling
operations on `ops`, a handler that is swapped per use: while code is generated it prints C++ or
Triton, while fusion analyses a node it records which buffers it reads. This is how one
`inner_fn` serves every backend (TorchInductor's `V.ops` idea, in miniature).

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
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

# --------------------------------------------------------------------------- index expressions


class Index:
    """sum(coeff * atom) + const, with atoms that are loop variables (str) or
    FloorDiv/Mod atoms. Immutable; + and * by ints fold as they go."""

    __slots__ = ("terms", "const")

    def __init__(self, terms: dict | None = None, const: int = 0):
        self.terms = {k: v for k, v in (terms or {}).items() if v != 0}
        self.const = const

    @staticmethod
    def var(name: str) -> "Index":
        return Index({name: 1})

    @staticmethod
    def of(value: "Index | int") -> "Index":
        return value if isinstance(value, Index) else Index({}, int(value))

    def __add__(self, other):
        other = Index.of(other)
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0) + v
        return Index(terms, self.const + other.const)

    __radd__ = __add__

    def __mul__(self, k: int):
        assert isinstance(k, int), k
        return Index({a: c * k for a, c in self.terms.items()}, self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> "Index":
        if k == 1:
            return self
        if not self.terms:
            return Index({}, self.const // k)
        return Index({FloorDiv(self, k): 1})

    def __mod__(self, k: int) -> "Index":
        if k == 1:
            return Index()
        if not self.terms:
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

    def bounds(self, ranges: dict[str, int]) -> tuple[int, int]:
        lo = hi = self.const
        for atom, c in self.terms.items():
            if isinstance(atom, str):
                a_lo, a_hi = 0, ranges.get(atom, 2**62) - 1
            elif isinstance(atom, Mod):
                a_lo, a_hi = 0, atom.k - 1
            else:
                i_lo, i_hi = atom.index.bounds(ranges)
                a_lo, a_hi = i_lo // atom.k, i_hi // atom.k
            lo, hi = (lo + c * a_lo, hi + c * a_hi) if c > 0 else (lo + c * a_hi, hi + c * a_lo)
        return lo, hi

    def simplify(self, ranges: dict[str, int]) -> "Index":
        """Remove divisions and modulos that the ranges make unnecessary:
        (q*k + r) // k -> q and (q*k + r) % k -> r when 0 <= r < k, and
        c*k*(a // k) + c*(a % k) -> c*a. This is what turns a reshape of a contiguous
        tensor back into a plain linear index."""
        result = Index({}, self.const)
        for atom, c in self.terms.items():
            if isinstance(atom, str):
                result = result + Index({atom: c})
                continue
            inner = atom.index.simplify(ranges)
            k = atom.k
            q = Index({a: v // k for a, v in inner.terms.items() if v % k == 0}, inner.const // k)
            r = Index({a: v for a, v in inner.terms.items() if v % k != 0}, inner.const % k)
            lo, hi = r.bounds(ranges)
            # (q*k + r) // k == q + r // k and (q*k + r) % k == r % k for integers
            if isinstance(atom, FloorDiv):
                simple = q if 0 <= lo and hi < k else q + r // k
            else:
                simple = r if 0 <= lo and hi < k else r % k
            result = result + simple * c
        return result._combine_div_mod()

    def _combine_div_mod(self) -> "Index":
        terms = dict(self.terms)
        for atom, c in list(terms.items()):
            if isinstance(atom, Mod) and atom in terms:
                partner = FloorDiv(atom.index, atom.k)
                if terms.get(partner) == c * atom.k:
                    del terms[atom], terms[partner]
                    return (Index(terms, self.const) + atom.index * c)._combine_div_mod()
        return self

    def is_linear(self) -> bool:
        return all(isinstance(a, str) for a in self.terms)

    def render(self, floordiv: str = "//") -> str:
        parts = []
        for atom, c in sorted(self.terms.items(), key=lambda t: str(t[0])):
            if isinstance(atom, str):
                text = atom
            else:
                op = floordiv if isinstance(atom, FloorDiv) else "%"
                text = f"(({atom.index.render(floordiv)}) {op} {atom.k})"
            parts.append(text if c == 1 else f"{c}*{text}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)

    def __repr__(self):
        return self.render()

    def __eq__(self, other):
        return isinstance(other, Index) and self.terms == other.terms and self.const == other.const

    def __hash__(self):
        return hash((frozenset(self.terms.items()), self.const))


@dataclass(frozen=True)
class FloorDiv:
    index: Index
    k: int


@dataclass(frozen=True)
class Mod:
    index: Index
    k: int


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return strides[::-1]


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
        stride *= size
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
#   indirect_indexing(value, size)  an Index variable holding `value` (an integer computed in
#                              the kernel, e.g. loaded from another buffer), for an index that
#                              depends on data (embedding). A value outside [0, size) is
#                              replaced by 0, so no load leaves the tensor, and recorded in the
#                              graph's INDEX_ERRORS buffer: the call then raises IndexError, as
#                              eager does.
# name -> number of operands.
POINTWISE_OPS = {
    "add": 2, "sub": 2, "mul": 2, "truediv": 2,
    "maximum": 2, "minimum": 2,
    "eq": 2, "ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2,
    "logical_and": 2, "logical_or": 2,
    "neg": 1, "abs": 1, "relu": 1, "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1,
    "sin": 1, "cos": 1, "tanh": 1, "sigmoid": 1, "erf": 1, "reciprocal": 1,
    "floor": 1, "ceil": 1, "logical_not": 1, "isnan": 1,
}

# The one-element int32 buffer kernels with indirect indexing report an out-of-range index in
# (the wrapper allocates it zeroed, passes it last, and raises if a kernel set it).
INDEX_ERRORS = "index_errors"

# The reduction types a Reduction node may have.
REDUCTIONS = ("sum", "mean", "max", "min", "prod", "argmax", "argmin")

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

    def indirect_indexing(self, value, size: int) -> Index:
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

    def rnumel(self) -> int:
        return math.prod(self.reduction_ranges)


@dataclass(eq=False)
class ComputedBuffer(IRNode):
    """A Pointwise or Reduction stored in a contiguous buffer; consumers load from memory."""
    name: str
    data: Pointwise | Reduction

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return self.data.device

    @property
    def stride(self):
        return contiguous_strides(self.shape)

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
    inputs: list[InputBuffer]
    nodes: list[IRNode]                   # Pointwise / Reduction / Extern, topological order
    outputs: list[Any]                    # IRNode, or a Python scalar / None for non-tensor outputs
    device: torch.device
    output_spec: Any = None               # pytree spec: how outputs nest (tuple, list, single)
    # graph inputs an op writes in place (batch norm's running statistics): input name -> the
    # node holding its new value, copied into the input after the kernels, as eager leaves it
    mutated_inputs: dict = field(default_factory=dict)
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
