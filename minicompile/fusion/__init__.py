"""Fusion: decide which IR values get a buffer of their own, and group the work into kernels.

Takes the `Program` lowering built (every value an unrealized TensorBox) and hands code
generation a schedule: an ordered list of `Kernel`s (generated code) and `ExternCall`s
(PyTorch's own kernels).

The decisions are made by an ordered list of passes, `PASSES`, each a small class with a `run`
method over the `FusionState`:

1. realize-reductions, realize-outputs, inline-pointwise decide which values are stored; a
   value that is not stored is computed inside every kernel that reads it (vertical fusion).
2. make-kernels gives every stored computation a kernel of its own.
3. fuse-rows merges consecutive kernels that walk the same rows: a reduction with the
   pointwise work that reads its result (softmax: max, sum and the division in one kernel),
   sibling reductions and pointwise kernels over the same data (horizontal fusion).
4. elide-stores drops the store of a buffer that nothing outside its kernel reads.

Part III's assignments add passes to this list. Every decision is logged (`fusion` log).
`draw(fn_or_gm, example_inputs, passes)` (picture.py) draws the resulting kernels, one plan per
column, so the decisions can be looked at (the book's fusion chapter uses it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import ir, logs
from ..ir import Index
from ..lower.boxes import TensorBox


# --------------------------------------------------------------------------- kernels

@dataclass
class Member:
    """One stored computation inside a kernel, and how it walks the kernel's iteration space:
    'row' (one value per (x, r): a pointwise over whole rows), 'x' (one value per row: a
    reduction, or a pointwise over the reduced shape), or 'flat' (a pointwise kernel without
    reduction loops)."""
    box: TensorBox
    role: str

    @property
    def comp(self):
        return self.box.computation

    def index(self, x_idx: list[Index], r_idx: list[Index]) -> list[Index]:
        """The member's own output index at canonical position (x, r)."""
        shape = list(self.box.shape)
        if self.role in ("row", "flat"):
            return list(x_idx) + list(r_idx)
        # per-row: the reduced dims, when kept, are size 1 at the end
        return list(x_idx) + [Index()] * (len(shape) - len(x_idx))

    def run(self, x_idx, r_idx):
        """Evaluate the member's inner function (under the installed ops handler)."""
        comp = self.comp
        if isinstance(comp, ir.Reduction):
            return comp.inner_fn(self.index(x_idx, []), r_idx)
        return comp.inner_fn(self.index(x_idx, r_idx))

    def store_index(self, x_idx, r_idx) -> Index:
        return ir.flat_index(self.index(x_idx, r_idx), self.box.data.stride)


@dataclass
class Kernel:
    """One generated kernel. It iterates over x (rows, in parallel) and, for reductions, r
    (the elements of a row); its members are computed in order, and a member reading an
    earlier member's result reads it from registers instead of memory."""
    name: str
    members: list[Member]
    x_sizes: list[int]
    r_sizes: list[int] = field(default_factory=list)
    stored: set = field(default_factory=set)     # names of member buffers written to memory
    fused: list[str] = field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0
    # stored member -> inputs whose memory it may be written over (code generation finds them:
    # read only where the member is stored; the wrapper takes one that is dead by then)
    in_place: dict = field(default_factory=dict)

    @property
    def box(self) -> TensorBox:          # the first member (kernels of one member: the member)
        return self.members[0].box

    @property
    def kind(self) -> str:
        return "reduction" if self.r_sizes or any(isinstance(m.comp, ir.Reduction) for m in self.members) else "pointwise"

    def member_names(self) -> set:
        return {m.box.name for m in self.members}


@dataclass
class ExternCall:
    box: TensorBox


@dataclass
class FusionState:
    program: ir.Program
    boxes: list[TensorBox]
    outputs: list[TensorBox]
    steps: list = field(default_factory=list)

    def log(self, message: str) -> None:
        logs.log("fusion", message)


class FusionPass:
    """A pass reads and changes the fusion state. Subclasses document their rule."""
    name = "pass"

    def run(self, state: FusionState) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- realization passes

class RealizeReductions(FusionPass):
    """A reduction's result is stored: its consumers may read any element of it many times."""
    name = "realize-reductions"

    def run(self, state):
        for box in state.boxes:
            if isinstance(box.data, ir.Reduction):
                box.realize()
                state.log(f"{self.name}: {box.name} ({box.data.data.origin}) gets a buffer")


class RealizeOutputs(FusionPass):
    """Graph outputs must exist in memory when the graph returns."""
    name = "realize-outputs"

    def run(self, state):
        for box in state.outputs:
            if not box.is_realized:
                box.realize()
                state.log(f"{self.name}: {box.name} is a graph output")


class InlinePointwise(FusionPass):
    """Vertical fusion: a pointwise value is recomputed inside each consumer instead of being
    written to memory and read back. Exception: a value read by several consumers whose
    expression is expensive (more than `max_ops` operations) gets a buffer, so the work is not
    repeated and expressions cannot grow exponentially."""
    name = "inline-pointwise"
    max_ops = 8

    def run(self, state):
        for box in state.boxes:
            if box.is_realized or not isinstance(box.data, ir.Pointwise):
                continue
            readers = len(box.readers)
            if readers > 1 and ir.reads_of(box).op_count > self.max_ops:
                box.realize()
                state.log(f"{self.name}: {box.name} ({box.data.data.origin}) read by {readers} "
                          f"consumers and costly: stored once")


# --------------------------------------------------------------------------- kernel passes

def _space(box: TensorBox):
    """(x_sizes, r_sizes, role) of a stored computation on its own."""
    comp = box.computation
    if isinstance(comp, ir.Reduction):
        if comp.trailing:
            k = len(comp.reduced_dims)
            return list(comp.input_shape[:-k]), list(comp.input_shape[-k:]), "x"
        return list(comp.shape), list(comp.reduction_ranges), "x"
    return list(box.shape), [], "flat"


class MakeKernels(FusionPass):
    """Every stored computation gets a kernel of its own; externs stay calls of PyTorch."""
    name = "make-kernels"

    def run(self, state):
        count = 0
        for box in state.program.nodes:
            if isinstance(box.data, ir.Extern):
                state.steps.append(ExternCall(box))
                ext = box.data
                state.log(f"{self.name}: {box.name} calls PyTorch: "
                          + (ext.reason if ext.reason else "an extern kernel"))
            elif isinstance(box.data, ir.ComputedBuffer):
                x_sizes, r_sizes, role = _space(box)
                state.steps.append(Kernel(f"kernel{count}", [Member(box, role)], x_sizes, r_sizes,
                                          stored={box.name}))
                count += 1


class FuseRows(FusionPass):
    """Merge a kernel into the kernel just before it when both walk the same rows:
    same x sizes, and reductions over the same trailing r sizes. The later kernel may read
    the earlier one's results only at the element (or row) it is computing, which is what
    lets those reads come from registers. Softmax (max, sum of exp, divide), layer norm
    (mean, variance, normalize) and RMS norm become one kernel; two reductions of the same
    rows share one pass over them."""
    name = "fuse-rows"

    def run(self, state):
        out = []
        for step in state.steps:
            prev = out[-1] if out else None
            if isinstance(step, Kernel) and isinstance(prev, Kernel) and self.try_merge(prev, step):
                state.log(f"{self.name}: {step.name} ({step.box.name}) joins {prev.name}")
                continue
            out.append(step)
        for i, step in enumerate(s for s in out if isinstance(s, Kernel)):
            step.name = f"kernel{i}"
        state.steps = out

    def try_merge(self, group: Kernel, new: Kernel) -> bool:
        if len(new.members) != 1 or not _groupable(group) or not _groupable(new):
            return False
        member = new.members[0]
        comp = member.comp
        gx, gr = group.x_sizes, group.r_sizes
        if isinstance(comp, ir.Reduction):
            nx, nr = new.x_sizes, new.r_sizes
            if gr:
                if (gx, gr) != (nx, nr):
                    return False
                candidate = (gx, gr, [m.role for m in group.members])
            else:
                # a pointwise group over whole rows (or over the row results) grows r loops
                if gx == nx + nr:
                    roles = ["row"] * len(group.members)
                elif math.prod(gx) == math.prod(nx) and _per_row_shape(gx, nx):
                    roles = ["x"] * len(group.members)
                else:
                    return False
                candidate = (nx, nr, roles)
            role = "x"
        else:
            shape = list(member.box.shape)
            if not gr:
                if shape != gx:
                    return False
                candidate, role = (gx, gr, [m.role for m in group.members]), "flat"
            elif shape == gx + gr:
                candidate, role = (gx, gr, [m.role for m in group.members]), "row"
            elif _per_row_shape(shape, gx):
                candidate, role = (gx, gr, [m.role for m in group.members]), "x"
            else:
                return False
        x_sizes, r_sizes, roles = candidate
        members = [Member(m.box, r) for m, r in zip(group.members, roles)] + [Member(member.box, role)]
        if not _reads_are_local(members, x_sizes, r_sizes):
            return False
        group.members, group.x_sizes, group.r_sizes = members, x_sizes, r_sizes
        group.stored |= new.stored
        return True


def _groupable(kernel: Kernel) -> bool:
    return all(not isinstance(m.comp, ir.Reduction) or m.comp.trailing for m in kernel.members)


def _per_row_shape(shape, x_sizes) -> bool:
    """shape is x_sizes, possibly followed by kept (size 1) reduced dims."""
    return list(shape[:len(x_sizes)]) == list(x_sizes) and all(s == 1 for s in shape[len(x_sizes):])


def _reads_are_local(members: list[Member], x_sizes, r_sizes) -> bool:
    """Each member reads earlier members only where they are computed at the same (x, r), or
    per-row values at the same x: never another row's or another element's value."""
    x_idx = [Index.var(f"x{d}") for d in range(len(x_sizes))]
    r_idx = [Index.var(f"r{d}") for d in range(len(r_sizes))]
    ranges = {**{f"x{d}": s for d, s in enumerate(x_sizes)}, **{f"r{d}": s for d, s in enumerate(r_sizes)}}
    ones = {v: Index() for v, s in ranges.items() if s == 1}

    def canonical(index: Index) -> Index:       # equal positions compare equal
        return index.substitute(ones).simplify(ranges) if ones else index.simplify(ranges)
    positions = {}
    for m in members:
        rec = ir.RecordingOps()
        with ir.use_ops(rec):
            m.run(x_idx, r_idx)
        for name, index in rec.loads:
            if name in positions and positions[name] != canonical(index):
                return False
        positions[m.box.name] = canonical(m.store_index(x_idx, r_idx))
        if m.role == "x" and r_sizes and any(v.startswith("r") for v in positions[m.box.name].variables()):
            return False
    return True


class ElideStores(FusionPass):
    """A buffer read only inside the kernel that computes it, and not returned, is never
    written to memory: the kernel keeps it in registers."""
    name = "elide-stores"

    def run(self, state):
        needed = {b.name for b in state.outputs}
        for step in state.steps:
            if isinstance(step, ExternCall):
                needed |= {r.name for r in step.box.reads}
            else:
                own = step.member_names()
                for m in step.members:
                    needed |= {name for name, _ in ir.reads_of(m.comp).loads if name not in own}
        for step in state.steps:
            if isinstance(step, Kernel) and len(step.members) > 1:
                for m in step.members:
                    if m.box.name not in needed and m.box.name in step.stored:
                        step.stored.discard(m.box.name)
                        state.log(f"{self.name}: {m.box.name} stays in {step.name}'s registers")


PASSES: list[FusionPass] = [RealizeReductions(), RealizeOutputs(), InlinePointwise(), MakeKernels(),
                            FuseRows(), ElideStores()]


def schedule(program: ir.Program, passes: list[FusionPass] | None = None) -> list:
    """Run the passes; return the steps (Kernels and ExternCalls) in execution order."""
    # values written into graph inputs must exist in memory at the end, as outputs do
    outputs = [o for o in program.outputs if isinstance(o, TensorBox)]
    state = FusionState(program, list(program.nodes), outputs)
    for p in PASSES if passes is None else passes:
        p.run(state)
    buffers = buffers_by_name(program)
    for step in state.steps:
        if isinstance(step, Kernel):
            step.fused = [o for m in step.members for o in _fused_origins(m.box)]
            step.bytes_read, step.bytes_written = _bytes_moved(step, buffers)
            state.log(f"{step.name} ({step.kind}) computes {', '.join(m.box.name for m in step.members)}: "
                      f"{' -> '.join(step.fused)}; reads {step.bytes_read} B, writes {step.bytes_written} B")
    return state.steps


def _fused_origins(box: TensorBox) -> list[str]:
    """The ops computed for `box`: its own and those of unrealized boxes it reads."""
    seen, order = set(), []

    def visit(b: TensorBox, top: bool):
        if id(b) in seen or (b.is_realized and not top):
            return
        seen.add(id(b))
        for r in b.reads:
            visit(r, False)
        comp = b.computation
        if comp is not None:
            order.append(comp.origin)
    visit(box, True)
    return order


def _bytes_moved(kernel: Kernel, buffers: dict) -> tuple[int, int]:
    """Minimal bytes: each buffer the kernel loads from memory read once, each stored
    buffer written once."""
    own = kernel.member_names()
    names = {name for m in kernel.members for name, _ in ir.reads_of(m.comp).loads if name not in own}
    read = sum(math.prod(buffers[n].shape) * buffers[n].dtype.itemsize for n in names)
    written = sum(math.prod(m.box.shape) * m.box.dtype.itemsize for m in kernel.members
                  if m.box.name in kernel.stored)
    return read, written


def buffers_by_name(program: ir.Program) -> dict:
    """{name: node} of every buffer in memory: the inputs and each box with a buffer of its own."""
    out = {b.name: b for b in program.inputs if isinstance(b, ir.InputBuffer)}
    for box in program.nodes:
        if box.owns_buffer:
            out[box.name] = box
    return out


from .picture import draw, format_bytes  # noqa: E402  (the decisions as a picture; needs the above)
