"""The fusion passes, in the order `PASSES` runs them (see the package's docstring), and the
helpers a new pass can reuse: `space` (a stored computation's iteration space), `merge`
(members into a kernel), `fuse_consecutive`, `reads_are_local` (may members share a kernel's registers), `loads`
and `stores` (the buffers a step reads and writes), `renumber`.

Each pass reads and changes a `FusionState`; each decision, and each fusion refused with its
reason, goes to the `fusion` log (MINICOMPILE_LOGS=fusion).
"""
from __future__ import annotations

import math

from .. import ir
from ..ir import Index
from ..lower.boxes import TensorBox
from ..lower.lowerings import as_view_of_buffer, viewed_value
from .kernels import ComboKernel, ExternCall, FusionPass, Kernel, Member


class RealizeReductions(FusionPass):
    """A reduction's result is stored: its consumers may read any element of it many times."""
    name = "realize-reductions"

    def run(self, state):
        for box in state.boxes:
            if isinstance(box.data, ir.Reduction):
                box.realize()
                state.log(f"{self.name}: {box.name} ({box.data.data.origin}) gets a buffer")


class RealizeOutputs(FusionPass):
    """Graph outputs must exist in memory when the graph returns. An output that is a view in
    eager (a chain of views, `mm(...).t().t()` in a backward) of a buffer the graph made is
    returned as that view, with no copy: eager's result shares that memory too."""
    name = "realize-outputs"

    def run(self, state):
        for box in state.outputs:
            if box.is_realized:
                continue
            view = _view_of_made_buffer(box)
            if view is not None:
                box.data = view
                state.log(f"{self.name}: a graph output is a view of {view.base.name}, returned as one")
            else:
                box.realize()
                state.log(f"{self.name}: {box.name} is a graph output")


def _view_of_made_buffer(box: TensorBox):
    """box as strides over the buffer it views, when it is views all the way down to a buffer
    the graph computed (not an input: the epilogue makes those views), in eager's layout."""
    link = viewed_value(box)
    if not link.is_realized or isinstance(link.data, (ir.InputBuffer, ir.ViewOfBuffer)):
        return None
    view = as_view_of_buffer(box)
    if view is None or view.base is not link or (
            box.wanted_stride is not None and any(a != b and n > 1 for a, b, n in
                                                  zip(view.stride, box.wanted_stride, box.shape))):
        return None
    return view


class InlinePointwise(FusionPass):
    """Vertical fusion: a pointwise value is recomputed inside each consumer instead of being
    written to memory and read back. Exception: a value read by several consumers whose
    expression is expensive (more than `max_ops` operations, or a transcendental function of
    `CALLS`), or reads many buffers (more than `max_reads`, Inductor's realize_reads_threshold)
    gets a buffer, so the work is not repeated and expressions cannot grow exponentially.
    Rotary embeddings' cos and sin, a (T, D) table read by every layer's queries and keys,
    would otherwise be computed again for every head and batch row, with calls into the
    vector math library that GCC 12 does not vectorize in a loop with masked loads (the
    rotation's halves). A transformer's residual stream, a chain of adds of cheap
    expressions, would be summed again from the embedding up in every layer's norm."""
    name = "inline-pointwise"
    max_ops = 8
    max_reads = 4
    CALLS = {"sin", "cos", "tanh", "log", "erf", "pow"}

    def run(self, state):
        live = _live(state)
        for box in state.boxes:
            if box.is_realized or not isinstance(box.data, ir.Pointwise):
                continue
            # (a box nothing stored reads does not count: a transpose lowering made that a
            # product then read padded instead, lower/lowerings.py's _mm)
            readers = sum(id(r) in live for r in box.readers)
            if readers < 2:
                continue
            reads = ir.reads_of(box)
            buffers = len({name for name, _ in reads.loads})
            calls = reads.op_names & self.CALLS
            if reads.op_count > self.max_ops or calls or buffers > self.max_reads:
                box.realize()
                why = "costly" if reads.op_count > self.max_ops else \
                    f"computes {', '.join(sorted(calls))}" if calls else f"reads {buffers} buffers"
                state.log(f"{self.name}: {box.name} ({box.data.data.origin}) read by {readers} "
                          f"consumers and {why}: stored once")


def _live(state) -> set:
    """The ids of the boxes whose values the graph needs: what is stored (extern calls
    included), the outputs, and every box they read."""
    todo = [b for b in state.program.nodes if b.is_realized] + list(state.outputs)
    live: set = set()
    while todo:
        box = todo.pop()
        if id(box) not in live:
            live.add(id(box))
            todo.extend(box.reads)
    return live


# --------------------------------------------------------------------------- kernel passes

def space(box: TensorBox):
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
                x_sizes, r_sizes, role = space(box)
                state.steps.append(Kernel(f"kernel{count}", [Member(box, role)], x_sizes, r_sizes,
                                          stored={box.name}))
                count += 1


class FuseRows(FusionPass):
    """Merge a kernel into the kernel just before it when both walk the same rows:
    same x sizes, and reductions over the same trailing r sizes. The later kernel may read
    the earlier one's results only at the element (or row) it is computing, which is what
    lets those reads come from registers. Softmax (max, sum of exp, divide), layer norm
    (mean, variance, normalize) and RMS norm become one kernel; two reductions of the same
    rows share one pass over them. Reductions over the same leading dims of one shape (batch
    norm's mean and variance for each channel, its backward's two sums) share a kernel too."""
    name = "fuse-rows"

    def run(self, state):
        fuse_consecutive(state, self.name, self.merge)

    def merge(self, group: Kernel, new: Kernel) -> str | None:
        """Merge `new` into `group`; None when merged, else why not."""
        if len(new.members) != 1:
            return "a reduction that does not reduce trailing dims"
        if not _groupable(group) or not _groupable(new):
            if not _sibling_reductions(group, new):
                return "a reduction that does not reduce trailing dims"
        member = new.members[0]
        comp = member.comp
        gx, gr = group.x_sizes, group.r_sizes
        roles = [m.role for m in group.members]
        if isinstance(comp, ir.Reduction):
            nx, nr = new.x_sizes, new.r_sizes
            if gr:
                if (gx, gr) != (nx, nr):
                    return f"other rows: reduces {nx} x {nr}, the kernel {gx} x {gr}"
            elif gx == nx + nr:      # a pointwise group over whole rows grows r loops
                gx, gr, roles = nx, nr, ["row"] * len(group.members)
            elif math.prod(gx) == math.prod(nx) and _per_row_shape(gx, nx):   # over row results
                gx, gr, roles = nx, nr, ["x"] * len(group.members)
            else:
                return f"other rows: reduces {nx} x {nr}, the kernel is pointwise over {gx}"
            role = "x"
        else:
            shape = list(member.box.shape)
            if not gr and shape == gx:
                role = "flat"
            elif gr and shape == gx + gr:
                role = "row"
            elif gr and _per_row_shape(shape, gx):
                role = "x"
            else:
                return f"other shape: {shape}, the kernel walks {gx} x {gr}"
        members = [Member(m.box, r) for m, r in zip(group.members, roles)] + [Member(member.box, role)]
        if not reads_are_local(members, gx, gr):
            return "it reads the kernel's results at other elements or rows (not from registers)"
        merge(group, members, gx, gr, new)
        return None


def fuse_consecutive(state, name: str, merge) -> None:
    """Offer each kernel to the kernel just before it: `merge(prev, kernel)` merges it and returns
    None, or returns why not; either is logged under the pass's `name`."""
    out = []
    for step in state.steps:
        prev = out[-1] if out else None
        if isinstance(step, Kernel) and isinstance(prev, Kernel):
            why_not = merge(prev, step)
            if why_not is None:
                state.log(f"{name}: {step.name} ({step.box.name}) joins {prev.name}")
                continue
            state.log(f"{name}: {step.name} ({step.box.name}) not fused with {prev.name}: {why_not}")
        out.append(step)
    renumber(out)
    state.steps = out


def merge(group: Kernel, members: list[Member], x_sizes, r_sizes, new: Kernel) -> None:
    """Make `group` the kernel of `members` over (x_sizes, r_sizes), storing what `new` stored."""
    group.members, group.x_sizes, group.r_sizes = members, list(x_sizes), list(r_sizes)
    group.stored |= new.stored


def renumber(steps: list) -> None:
    """Name the kernels kernel0, kernel1... in execution order (after a merge or a move)."""
    for i, step in enumerate(s for s in steps if isinstance(s, Kernel)):
        step.name = f"kernel{i}"


def _groupable(kernel: Kernel) -> bool:
    return all(not isinstance(m.comp, ir.Reduction) or m.comp.trailing for m in kernel.members)


def _sibling_reductions(group: Kernel, new: Kernel) -> bool:
    """Kernels of reductions over the same dims of same-shaped inputs, other than the last
    (batch norm's statistics, reduced over N, H and W for each channel, and the two sums of its
    backward): they walk their rows alike, so one kernel computes them all."""
    def shape(m):
        comp = m.comp
        return isinstance(comp, ir.Reduction) and (list(comp.input_shape), list(comp.reduced_dims), list(comp.shape))
    shapes = {str(shape(m)) for m in group.members + new.members}
    return len(shapes) == 1 and shape(new.members[0]) is not False


def _per_row_shape(shape, x_sizes) -> bool:
    """shape is x_sizes, possibly followed by kept (size 1) reduced dims."""
    return list(shape[:len(x_sizes)]) == list(x_sizes) and all(s == 1 for s in shape[len(x_sizes):])


def reads_are_local(members: list[Member], x_sizes, r_sizes) -> bool:
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
        needed = {b.name for b in state.outputs}.union(*(loads(step) for step in state.steps))
        for step in state.steps:
            if isinstance(step, Kernel) and len(step.members) > 1:
                for m in step.members:
                    if m.box.name not in needed and m.box.name in step.stored:
                        step.stored.discard(m.box.name)
                        state.log(f"{self.name}: {m.box.name} stays in {step.name}'s registers")


class ComboKernels(FusionPass):
    """Consecutive pointwise kernels that do not read what another writes are launched as one
    kernel (Inductor's combo kernels): an optimizer step updating every parameter with one
    launch instead of one per parameter. Each part keeps its own sizes and code."""
    name = "combo-kernels"
    max_parts = 32

    def run(self, state):
        steps, group = [], []

        def close():
            if len(group) > 1:
                combo = ComboKernel(f"combo_{group[0].name}", list(group))
                state.log(f"{self.name}: {', '.join(k.name for k in group)} launched as {combo.name}")
                steps.append(combo)
            else:
                steps.extend(group)
            group.clear()

        for step in state.steps:
            reason = self.why_not(group, step) if group else None
            if reason is not None:
                state.log(f"{self.name}: {step.name if isinstance(step, Kernel) else step.box.name} "
                          f"not launched with {group[0].name}: {reason}")
                close()
            if self.why_not([], step) is None:
                group.append(step)
            else:                        # (never a part: the group was closed above)
                steps.append(step)
        close()
        state.steps = steps

    def why_not(self, group: list[Kernel], new) -> str | None:
        """None when `new` may join the kernels of `group` in one launch, else why not."""
        if not isinstance(new, Kernel) or new.kind != "pointwise":
            return "not a pointwise kernel"
        if any(ir.is_symbolic(s) or s == 0 for s in new.x_sizes):
            return "a dynamic or empty size"
        if len(group) >= self.max_parts:
            return f"the combo has {self.max_parts} parts already"
        written = set().union(*(stores(k) for k in group))
        if loads(new) & written:
            return f"reads {sorted(loads(new) & written)[0]}, written by the combo"
        if stores(new) & set().union(*(loads(k) for k in group)):
            return "writes what the combo reads"
        return None


def loads(step) -> set[str]:
    """Names of the buffers a step reads from memory (a kernel's own members excluded)."""
    if isinstance(step, ExternCall):
        return {r.name for r in step.box.reads}
    own = step.member_names()
    return {name for m in step.members for name, _ in ir.reads_of(m.comp).loads if name not in own}


def stores(step) -> set[str]:
    """Names of the buffers a step writes to memory."""
    return {step.box.name} if isinstance(step, ExternCall) else set(step.stored)
