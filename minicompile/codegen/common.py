"""What the C++ and Triton code generators share: the loop plan and the CSE code buffer.

Takes a fusion `Kernel`; hands each backend a `LoopPlan` (the iteration space with adjacent
dimensions merged wherever every access allows it, so a contiguous 2-D pointwise kernel is one
flat loop) and a `KernelWriter`, the `ops` handler base class that turns each operation into one
line of code, reusing a line already written for the same expression (common subexpression
elimination). A backend subclasses `KernelWriter` with its own spelling of each operation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import ir
from ..ir import Index


@dataclass
class LoopPlan:
    """Loop variables after merging. `x_sizes` are the output (parallel) loops, `r_sizes` the
    reduction loops. `apply` rewrites an index over the original variables into the merged ones."""
    x_sizes: list[int]
    r_sizes: list[int]
    groups: list[tuple[list[str], str, int]]     # (original vars, merged var, merged size)
    zero: list[str]                              # original vars of size 1 (always index 0)

    def apply(self, index: Index) -> Index:
        index = index.substitute({v: Index() for v in self.zero}) if self.zero else index
        for names, merged, _ in self.groups:
            if len(names) == 1:
                if names[0] != merged:
                    index = index.substitute({names[0]: Index.var(merged)})
                continue
            c = index.coeff(names[-1])
            terms = {k: v for k, v in index.terms.items() if k not in names}
            index = Index(terms, index.const) + Index.var(merged) * c
        return index

    @property
    def x_vars(self) -> list[str]:
        return [m for _, m, _ in self.groups if m.startswith("x")]

    @property
    def r_vars(self) -> list[str]:
        return [m for _, m, _ in self.groups if m.startswith("r")]


def plan_loops(kernel_box, store_strides: list[int]) -> LoopPlan:
    """Merge adjacent loop dimensions d, d+1 when every load and the store index them as one
    (coefficient of d == coefficient of d+1 times size of d+1) and neither appears inside a
    division or modulo."""
    comp = kernel_box.computation
    x_sizes = list(comp.shape)
    r_sizes = list(comp.reduction_ranges) if isinstance(comp, ir.Reduction) else []
    rec = ir.reads_of(comp)
    store = ir.flat_index([Index.var(f"i{d}") for d in range(len(x_sizes))], store_strides)
    indices = [idx for _, idx in rec.loads] + [store]
    nonlinear = set().union(*[i.nonlinear_variables() for i in indices]) if indices else set()

    def groups_for(prefix: str, sizes: list[int], out_prefix: str):
        dims = [(f"{prefix}{d}", s) for d, s in enumerate(sizes)]
        zero = [v for v, s in dims if s == 1]
        live = [(v, s) for v, s in dims if s != 1]
        groups: list[list[tuple[str, int]]] = []
        for v, s in live:
            if groups:
                pv, ps = groups[-1][-1]
                if (pv not in nonlinear and v not in nonlinear
                        and all(i.coeff(pv) == i.coeff(v) * s for i in indices)):
                    groups[-1].append((v, s))
                    continue
            groups.append([(v, s)])
        merged = [([v for v, _ in g], f"{out_prefix}{k}", math.prod(s for _, s in g))
                  for k, g in enumerate(groups)]
        return merged, zero

    xg, xz = groups_for("i", x_sizes, "x")
    rg, rz = groups_for("r", r_sizes, "r")
    return LoopPlan([g[2] for g in xg], [g[2] for g in rg], xg + rg, xz + rz)


class KernelWriter:
    """An ops handler that writes one line per new expression. Subclasses fill OPS (name ->
    format string over the operands) and the few methods that differ by language."""

    OPS: dict[str, str] = {}

    def __init__(self, plan: LoopPlan, buffers: dict[str, ir.IRNode]):
        self.plan = plan
        self.buffers = buffers           # name -> node with .dtype (inputs, realized buffers)
        self.lines: list[str] = []
        self.cache: dict[str, str] = {}
        self.args: list[str] = []        # buffer names in the order the kernel takes them
        self.constants: set[str] = set()

    # -- the handler interface used by inner functions
    def _emit(self, expr: str) -> str:
        if expr in self.cache:
            return self.cache[expr]
        var = f"tmp{len(self.cache)}"
        self.cache[expr] = var
        self.lines.append(self.assign(var, expr))
        return var

    def arg_name(self, buffer_name: str) -> str:
        if buffer_name not in self.args:
            self.args.append(buffer_name)
        return f"in_ptr{self.args.index(buffer_name)}"

    def load(self, name: str, index: Index) -> str:
        return self._emit(self.load_expr(name, self.plan.apply(index), self.buffers[name].dtype))

    def constant(self, value, dtype: torch.dtype) -> str:
        text = self.constant_expr(value, dtype)
        self.constants.add(text)
        return text

    def to_dtype(self, x: str, dtype: torch.dtype, src_dtype: torch.dtype | None = None) -> str:
        if src_dtype is not None and ir.compute_dtype(dtype) == src_dtype:
            return x
        if x in self.constants and dtype.is_floating_point:
            return x
        return self._emit(self.cast_expr(x, ir.compute_dtype(dtype)))

    def where(self, c: str, a: str, b: str) -> str:
        return self._emit(self.OPS["where"].format(c, a, b))

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
        raise NotImplementedError

    def constant_expr(self, value, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def cast_expr(self, x: str, dtype: torch.dtype) -> str:
        raise NotImplementedError


def reduction_identity(reduction_type: str, dtype: torch.dtype):
    if reduction_type in ("sum", "mean"):
        return 0
    if reduction_type == "prod":
        return 1
    big = math.inf if dtype.is_floating_point else (torch.iinfo(dtype).max if dtype != torch.bool else 1)
    return -big if reduction_type == "max" else big
