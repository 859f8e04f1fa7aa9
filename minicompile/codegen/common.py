"""What the C++ and Triton code generators share: the loop plan and the CSE code writer.

Takes a fusion `Kernel`; hands each backend a `LoopPlan` (the kernel's iteration space with
adjacent dimensions merged wherever every access allows it, so a contiguous 2-D pointwise
kernel is one flat loop) and a `KernelWriter`, the `ops` handler base class that turns each
operation into one line of code, reusing a line already written for the same expression
(common subexpression elimination). A backend subclasses `KernelWriter` with its own spelling
of each operation, and walks the kernel's members in order.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass

import torch

from .. import ir
from ..ir import Index


@dataclass
class LoopPlan:
    """Loop variables after merging. `x_sizes` are the output (parallel) loops, `r_sizes` the
    reduction loops. `apply` rewrites an index over the canonical variables (x0.., r0..) into
    the merged ones (also named x0.., r0.., fewer of them)."""
    x_sizes: list[int]
    r_sizes: list[int]
    groups: list[tuple[list[str], str, int]]     # (canonical vars, merged var, merged size)
    zero: list[str]                              # canonical vars of size 1 (always index 0)
    # more of the loads that walk a row step through memory along x than along r: a column
    # reduction (a bias gradient's sum over rows), whose rows are far apart in memory
    columns: bool = False

    def apply(self, index: Index) -> Index:
        if self.zero:
            index = index.substitute({v: Index() for v in self.zero})
        renames = {}
        for names, merged, _ in self.groups:
            if len(names) == 1:
                renames[names[0]] = Index.var("_" + merged)
                continue
            c = index.coeff(names[-1])
            terms = {k: v for k, v in index.terms.items() if k not in names}
            index = Index(terms, index.const) + Index.var("_" + merged) * c
        index = index.substitute(renames)
        return index.substitute({f"_{m}": Index.var(m) for _, m, _ in self.groups})

    @property
    def x_vars(self) -> list[str]:
        return [m for _, m, _ in self.groups if m.startswith("x")]

    @property
    def r_vars(self) -> list[str]:
        return [m for _, m, _ in self.groups if m.startswith("r")]


def canonical_ranges(kernel) -> dict[str, int]:
    return {**{f"x{d}": s for d, s in enumerate(kernel.x_sizes)},
            **{f"r{d}": s for d, s in enumerate(kernel.r_sizes)}}


def canonical_indices(kernel) -> tuple[list[Index], list[Index]]:
    return ([Index.var(f"x{d}") for d in range(len(kernel.x_sizes))],
            [Index.var(f"r{d}") for d in range(len(kernel.r_sizes))])


def plan_loops(kernel) -> LoopPlan:
    """The x loops nest in the memory order of the first buffer the kernel stores (a
    channels-last buffer of logical shape N, C, H, W: N, H, W outer and C innermost), so stores
    are contiguous and the innermost loop vectorizes; then adjacent loop dimensions d, d+1 merge
    when every load and store indexes them as one (coefficient of d == coefficient of d+1 times
    size of d+1) and neither appears inside a division or modulo."""
    x_idx, r_idx = canonical_indices(kernel)
    ranges = canonical_ranges(kernel)
    indices, loads = [], []
    for m in kernel.members:
        rec = ir.RecordingOps()
        with ir.use_ops(rec):
            m.run(x_idx, r_idx)
        loads += [i.simplify(ranges) for _, i in rec.loads]
        indices += [idx.simplify(ranges) for idx in [i for _, i in rec.loads] + rec.index_exprs]
        indices.append(m.store_index(x_idx, r_idx))
    nonlinear = set().union(*[i.nonlinear_variables() for i in indices]) if indices else set()

    def groups_for(prefix: str, sizes: list[int], order=None):
        dims = [(f"{prefix}{d}", sizes[d]) for d in (order or range(len(sizes)))]
        zero = [v for v, s in dims if s == 1]
        groups: list[list[tuple[str, int]]] = []
        for v, s in [(v, s) for v, s in dims if s != 1]:
            if groups:
                pv, _ = groups[-1][-1]
                if (pv not in nonlinear and v not in nonlinear
                        and all(i.coeff(pv) == ir.size_expr(i.coeff(v) * s) for i in indices)):
                    groups[-1].append((v, s))
                    continue
            groups.append([(v, s)])
        merged = [([v for v, _ in g], f"{prefix}{k}", ir.size_expr(math.prod(s for _, s in g)))
                  for k, g in enumerate(groups)]
        return merged, zero

    xg, xz = groups_for("x", kernel.x_sizes, _store_order(kernel, x_idx, r_idx))
    rg, rz = groups_for("r", kernel.r_sizes)
    return LoopPlan([g[2] for g in xg], [g[2] for g in rg], xg + rg, xz + rz,
                    columns=_column_loads(loads, kernel))


def _column_loads(loads: list, kernel) -> bool:
    """Whether more of the loads that walk the rows (r) are contiguous along x than along r.
    A load the same for every row (a layer norm's mean per token, in its weight's gradient: a
    sum over tokens for each channel) comes from cache after the first row reads it: it has
    no say, as a per-row value has none."""
    rvars = [f"r{d}" for d in range(len(kernel.r_sizes)) if kernel.r_sizes[d] != 1]
    xvars = [f"x{d}" for d in range(len(kernel.x_sizes)) if kernel.x_sizes[d] != 1]
    along_r = along_x = 0
    for index in loads:
        walks = index.nonlinear_variables()       # (a row of several dims, unflattened from r)
        if not any(index.coeff(v) != 0 or v in walks for v in rvars):
            continue                              # a per-row value: read once per row
        if not any(index.coeff(v) != 0 or v in walks for v in xvars):
            continue                              # the same for every row
        if any(index.coeff(v) == 1 for v in rvars):
            along_r += 1
        elif any(index.coeff(v) == 1 for v in xvars):
            along_x += 1
    return along_x > along_r


def _store_order(kernel, x_idx, r_idx) -> list[int] | None:
    """The x dims from outermost to innermost in the first stored buffer (None: as numbered)."""
    stored = [m for m in kernel.members if m.box.name in kernel.stored]
    if not stored:
        return None
    index = stored[0].store_index(x_idx, r_idx)
    strides = [index.coeff(f"x{d}") for d in range(len(kernel.x_sizes))]
    if any(ir.is_symbolic(s) for s in strides):
        return None
    return ir.stride_order(strides)


class KernelWriter:
    """An ops handler that writes one line per new expression. Subclasses fill OPS (name ->
    format string over the operands) and the few methods that differ by language.

    Reads of buffers this kernel computes itself never touch memory: a per-row value (a
    reduction's result) is the variable that holds it, and an element of a pointwise member is
    recomputed from the member's own expression at the same position (the fuse-rows pass
    guarantees reads are at that position)."""

    OPS: dict[str, str] = {}

    def __init__(self, kernel, plan: LoopPlan, buffers: dict[str, ir.IRNode]):
        self.kernel = kernel
        self.plan = plan
        self.buffers = buffers           # name -> node with .dtype (inputs, realized buffers)
        self.lines: list[str] = []
        self.cache: dict[str, str] = {}
        self.count = 0
        self.args: list[str] = []        # buffers loaded from memory, in argument order
        self.constants: set[str] = set()
        self.row_values: dict[str, str] = {}        # member name -> variable (per-row results)
        self.members = {m.box.name: m for m in kernel.members}
        self.load_mask: str | None = None         # inside ops.masked: where loads may be made
        self.checks_indices = False               # uses indirect indexing: takes INDEX_ERRORS
        self.canonical = canonical_indices(kernel)
        self.ranges = canonical_ranges(kernel)
        self.accesses: list[tuple[str, str, str]] = []   # ("load" | "store", buffer, index), in order
        self.whole_inputs: set[str] = set()   # inputs read at every position (not broadcast)
        self.row_inputs: set[str] = set()     # inputs read along the reduced dims

    # -- code buffer
    def _emit(self, expr: str) -> str:
        if expr in self.cache:
            return self.cache[expr]
        var = f"tmp{self.count}"
        self.count += 1
        self.cache[expr] = var
        self.lines.append(self.assign(var, expr))
        return var

    @contextlib.contextmanager
    def scope(self):
        """Lines written inside are collected apart (a loop body); their variables are not
        reused after it."""
        saved_lines, saved_cache = self.lines, dict(self.cache)
        self.lines = []
        body = self.lines
        try:
            yield body
        finally:
            self.lines, self.cache = saved_lines, saved_cache

    def arg_name(self, buffer_name: str) -> str:
        if buffer_name not in self.args:
            self.args.append(buffer_name)
        return f"in_ptr{self.args.index(buffer_name)}"

    def out_name(self, buffer_name: str) -> str:
        stored = [m.box.name for m in self.kernel.members if m.box.name in self.kernel.stored]
        return f"out_ptr{stored.index(buffer_name)}"

    # -- the handler interface used by inner functions
    def load(self, name: str, index: Index) -> str:
        if name in self.row_values:
            return self.row_values[name]
        member = self.members.get(name)
        if member is not None:
            return member.run(*self.canonical)
        index = self.plan.apply(index.simplify(self.ranges))
        expr = self.load_expr(name, index, self.buffers[name].dtype)
        if expr not in self.cache:       # (a load made before is reused, not made again here)
            self.accesses.append(("load", name, index.render("//")))
        if set(self.plan.x_vars + self.plan.r_vars) <= index.variables():
            self.whole_inputs.add(name)
        if not index.variables().isdisjoint(self.plan.r_vars):
            self.row_inputs.add(name)
        return self._emit(expr)

    def store_index(self, member) -> Index:
        """Where `member` is stored (over the merged loop variables); the store is recorded."""
        index = member.store_index(*self.canonical)
        # recorded as loads are (simplified), so that equal positions compare equal
        self.accesses.append(("store", member.box.name, self.plan.apply(index.simplify(self.ranges)).render("//")))
        return self.plan.apply(index)

    def in_place_inputs(self) -> dict[str, list[str]]:
        """For each stored member, the inputs whose memory it could be written over: read (only)
        at the very positions it is stored to, of its dtype, and never after its store. Each
        element is then read before it is overwritten, by the same lane (the same index is the
        same pointer pattern, so the same layout). Which of them is dead by then, and not
        someone else's memory, is for the wrapper to say."""
        loads = [(pos, name, index) for pos, (kind, name, index) in enumerate(self.accesses) if kind == "load"]
        found: dict[str, list[str]] = {}
        for pos, (kind, out, where) in enumerate(self.accesses):
            if kind == "store":
                reads: dict[str, set] = {}       # input -> where it is read (None: after this store)
                for at, name, index in loads:
                    reads.setdefault(name, set()).add(index if at < pos else None)
                found[out] = [name for name, indices in reads.items() if indices == {where}
                              and self.buffers[name].dtype == self.members[out].box.dtype]
        return found

    def constant(self, value, dtype: torch.dtype) -> str:
        value = wrapped(value, dtype)
        text = self.constant_expr(value, dtype)
        self.constants.add(text)
        return text

    def to_dtype(self, x: str, dtype: torch.dtype, src_dtype: torch.dtype | None = None) -> str:
        if src_dtype is not None and ir.compute_dtype(dtype) == src_dtype:
            return x
        if x in self.constants and dtype.is_floating_point:
            return x
        return self._emit(self.convert_expr(x, ir.compute_dtype(dtype), src_dtype))

    def convert_expr(self, x: str, dtype: torch.dtype, src_dtype: torch.dtype | None) -> str:
        """A value of src_dtype (None: not known) as one of dtype, as eager converts it."""
        return self.cast_expr(x, dtype)

    def round_to(self, x: str, dtype: torch.dtype) -> str:
        """x (a float32 value) rounded to `dtype`'s precision, still held as float32."""
        return self._emit(self.cast_expr(self.cast_expr(x, dtype), ir.compute_dtype(dtype)))

    def rounded_as_stored(self, x: str, dtype: torch.dtype) -> str:
        """A reduction's result that later members read from a register: rounded as its
        stored value is, for float16 and bfloat16 (eager's next op reads the rounded one)."""
        return self.round_to(x, dtype) if dtype in (torch.float16, torch.bfloat16) else x

    def scalar_arg(self, name: str, dtype: torch.dtype) -> str:
        """A float kernel argument (a dynamic Python float) as a value of `dtype`."""
        return self._emit(self.cast_expr(name, ir.compute_dtype(dtype)))

    def size_value(self, size, dtype: torch.dtype) -> str:
        """A size (maybe symbolic: a kernel argument) as a value of `dtype`."""
        return self._emit(self.cast_expr(self.render_size(size), ir.compute_dtype(dtype)))

    def where(self, c: str, a: str, b: str) -> str:
        return self._emit(self.OPS["where"].format(c, a, b))

    def index_expr(self, index: Index, dtype: torch.dtype) -> str:
        return self._emit(self.index_value_expr(self.plan.apply(index.simplify(self.ranges)), dtype))

    def indirect_indexing(self, value: str, size: int, error: int | None = ir.INDEX_ERROR) -> Index:
        """A variable holding value as an int64 index, checked against [0, size) (lines from
        the backend's `index_check`), once per value; `error`: the code it records if not.
        error None: no check (lowering computed the value inside [0, size) itself)."""
        key = f"indirect_indexing({value}, {size}, {error})"
        if key not in self.cache:
            var = self.cache[key] = f"tmp{self.count}"
            self.count += 1
            if error is None:
                self.lines.append(self.index_assign(var, value))
            else:
                self.checks_indices = True
                self.lines += self.index_check(var, value, size, error)
        return Index.var(self.cache[key])

    def masked(self, mask: str, body, other: str) -> str:
        """body() where mask holds, else other. While body runs, loads are guarded by the mask
        (each backend's load_expr reads self.load_mask), so they never touch memory outside it."""
        outer = self.load_mask
        self.load_mask = mask if outer is None else self.logical_and(outer, mask)
        try:
            value = body()
        finally:
            self.load_mask = outer
        return self.where(mask, value, other)

    def __getattr__(self, name: str):
        if name not in self.OPS:
            raise NotImplementedError(f"{type(self).__name__} has no code for operation '{name}'")
        fmt = self.OPS[name]

        def op(*args):
            return self._emit(fmt.format(*args))
        return op

    # -- to be provided by a backend
    def assign(self, var: str, expr: str) -> str:
        raise NotImplementedError

    def load_expr(self, name: str, index: Index, dtype: torch.dtype) -> str:
        """A load of one element (in the compute dtype), guarded by self.load_mask if set."""
        raise NotImplementedError

    def index_value_expr(self, index: Index, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def index_assign(self, var: str, value: str) -> str:
        """The line setting var to value as an int64 index."""
        raise NotImplementedError

    def index_check(self, var: str, value: str, size: int, error: int) -> list[str]:
        """Lines setting var to value (as int64), or to 0 with INDEX_ERRORS set to `error` (on
        a GPU: a device-side assert) where value is outside [0, size) on a lane that computes
        (inside ops.masked: where the mask holds)."""
        raise NotImplementedError

    def constant_expr(self, value, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def cast_expr(self, x: str, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def render_size(self, size) -> str:
        raise NotImplementedError


SYMBOL = re.compile(r"\bs\d+\b")
SCALAR = re.compile(r"\bscalar\d+\b")


def defined_once(defined: dict, name: str, source: str) -> str:
    """The kernel whose function runs kernel `name` (whose code is `source`): the first kernel
    with the same code but for its name. Kernels that are the same (the layers of an MLP, say)
    are defined, and compiled, once, as Inductor does. `defined` maps code to name, across
    one module."""
    return defined.setdefault(source.replace(f"{name}(", "KERNEL("), name)


def size_symbols_in(source: str) -> list[str]:
    """The size symbols (s0, s27, ...) a kernel's source uses: its size arguments, in order."""
    return sorted(set(SYMBOL.findall(source)), key=lambda s: int(s[1:]))


def scalars_in(source: str) -> list[str]:
    """The float arguments (scalar0, ...) a kernel's source uses, in order."""
    return sorted(set(SCALAR.findall(source)), key=lambda s: int(s[6:]))


def wrapped(value, dtype: torch.dtype):
    """A Python number as a constant of an integer dtype holds it: wrapped into its range
    (uint8 300 is 44, as PyTorch converts `x + 300` for a uint8 x), bool as 0 or 1; of a
    subclass of int or float (an IntEnum's member), the plain number. Floats and other
    dtypes: unchanged."""
    if dtype == torch.bool:
        return int(bool(value))
    if isinstance(value, (int, float)) and type(value) not in (int, float, bool):
        value = (float if isinstance(value, float) else int)(value)     # an IntEnum's member: its number
    if dtype.is_floating_point or not isinstance(value, int):
        return value
    info = torch.iinfo(dtype)
    return (value - info.min) % (info.max - info.min + 1) + info.min


def reduction_identity(reduction_type: str, dtype: torch.dtype):
    """The value a row's accumulator starts from: what combined with any x gives x. For max
    and min of integers, the dtype's least and greatest value (-iinfo.max would turn a row of
    int16 -32768 into -32767); for bool, False and True."""
    if reduction_type in ("sum", "mean", "squared_deviations"):
        return 0
    if reduction_type == "prod":
        return 1
    largest = reduction_type in ("max", "argmax")
    if dtype == torch.bool:
        return 0 if largest else 1
    if dtype.is_floating_point:
        return -math.inf if largest else math.inf
    return torch.iinfo(dtype).min if largest else torch.iinfo(dtype).max
