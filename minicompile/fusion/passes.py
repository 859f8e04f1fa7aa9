"""The fusion passes, in the order `PASSES` runs them (see the package's docstring), and the
helpers a new pass can reuse: `space` (a stored computation's iteration space), `merge`
(members into a kernel), `fuse_consecutive`, `reads_are_local` (may members share a kernel's registers), `loads`
and `stores` (the buffers a step reads and writes), `renumber`.

Each pass reads and changes a `FusionState`; each decision, and each fusion refused with its
reason, goes to the `fusion` log (MINICOMPILE_LOGS=fusion).
"""
from __future__ import annotations

import math
import operator

import torch

from .. import config, ir
from ..ir import Index
from ..lower.boxes import TensorBox
from ..lower.lowerings import as_view_of_buffer, viewed_value
from .kernels import ComboKernel, ExternCall, FusionPass, Kernel, Member, TemplateKernel


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
    if link is box or isinstance(link.data, (ir.InputBuffer, ir.ViewOfBuffer)):
        return None
    if box.eager_stride is not None:
        return _eagers_view(box, link)
    if not link.is_realized:
        return None
    view = as_view_of_buffer(box)
    if view is None or view.base is not link or (
            box.wanted_stride is not None and any(a != b and (ir.is_symbolic(n) or n > 1) for a, b, n in
                                                  zip(view.stride, box.wanted_stride, box.shape))):
        return None
    return view


def _eagers_view(box: TensorBox, link: TensorBox):
    """An expanded value (`(a * 2).expand(4, -1, -1)`, `x.sum(0, True).expand_as(x)`), or a
    view with gaps (`(x + 1)[:, :5]`), as eager's view of the buffer of the value it views
    (`link`), stored for it where it was not: eager's result repeats elements in memory (a
    write into it raises; a copy would be larger), or has eager's strides (code may read them,
    or view the result). The view has eager's strides exactly, a dim of size 1's too (any
    stride reads the same elements, but code may read `.stride()`). None, `link` left as it
    was, where the view's strides are not eager's."""
    data = link.data
    link.realize()
    view = as_view_of_buffer(box)
    if view is not None and view.base is link and all(
            a == b or n == 1 for a, b, n in zip(view.stride, box.eager_stride, box.shape)):
        view.stride = list(box.eager_stride)
        return view
    link.data = data
    return None


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
    norm's mean and variance for each channel, its backward's two sums) share a kernel too.
    A kernel may also join one of the `look_back` steps before that, where it reads what that
    one reads (or another result of a kernel that one reads) and does not depend on the steps
    between: on a GPU a batch norm's backward sums are split reductions (partial sums, then
    their sum), and the second one's partial sums join the first's, past the first's second
    stage, so the gradient is read once, not twice. Where one gradient feeds two batch norms (a
    ResNet block's last and its shortcut's), the second's partial sums, their sum and its input
    gradient join the first's, past that gradient's convolution."""
    name = "fuse-rows"
    look_back = 8

    def run(self, state):
        fuse_consecutive(state, self.name, self.merge, self.look_back)

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
        x_dims = ()
        if not isinstance(comp, ir.Reduction):
            shape = list(member.box.shape)
            if not gr and shape == gx:
                role = "flat"
            elif gr and shape == gx + gr:
                role = "row"
            elif gr and _per_row_shape(shape, gx):
                role = "x"
            elif gr and (x_dims := _rows_among_ones(shape, gx)) is not None:
                role = "x"
            else:
                return f"other shape: {shape}, the kernel walks {gx} x {gr}"
        members = [Member(m.box, r, m.x_dims if r == m.role else ()) for m, r in zip(group.members, roles)] \
            + [Member(member.box, role, x_dims)]
        if not reads_are_local(members, gx, gr):
            return "it reads the kernel's results at other elements or rows (not from registers)"
        merge(group, members, gx, gr, new)
        return None


def fuse_consecutive(state, name: str, merge, look_back: int = 0) -> None:
    """Offer each kernel to the kernel just before it: `merge(prev, kernel)` merges it and returns
    None, or returns why not; either is logged under the pass's `name`. With `look_back`, a
    kernel that does not join the one before is offered to as many earlier kernels that read a
    buffer it reads, moving it back past steps that neither write what it reads nor read or
    write what it writes."""
    out = []
    for step in state.steps:
        prev = out[-1] if out else None
        if isinstance(step, Kernel) and isinstance(prev, Kernel):
            why_not = merge(prev, step)
            if why_not is None:
                state.log(f"{name}: {step.name} ({step.box.name}) joins {prev.name}")
                continue
            state.log(f"{name}: {step.name} ({step.box.name}) not fused with {prev.name}: {why_not}")
        if isinstance(step, Kernel) and look_back and _joined_earlier(state, name, merge, out, step, look_back):
            continue
        out.append(step)
    renumber(out)
    state.steps = out


def _joined_earlier(state, name: str, merge, out: list, step: Kernel, look_back: int) -> bool:
    """Whether `step` merged into one of the `look_back` kernels before the last of `out`."""
    reads, writes = loads(step), stores(step)
    candidate_reads = None                         # a candidate is the step passed next: read once
    made_what_it_reads = None                      # found where the first candidate shares no read
    for back in range(1, min(look_back, len(out) - 1) + 1):
        passed = out[-back]                        # the step it would move back past
        if reads & stores(passed) or writes & stores(passed) \
                or writes & (candidate_reads if candidate_reads is not None else loads(passed)):
            return False
        candidate, candidate_reads = out[-back - 1], None
        if not isinstance(candidate, Kernel):
            continue
        candidate_reads = loads(candidate)
        if reads & candidate_reads:
            shared = "they share reads"
        else:
            if made_what_it_reads is None:
                made_what_it_reads = _makers(out, reads)
            shared = "they read one kernel's results" if made_what_it_reads & _makers(out, candidate_reads) else None
        if shared and merge(candidate, step) is None:
            state.log(f"{name}: {step.name} ({step.box.name}) joins {candidate.name}, "
                      f"moved back past {back} step(s) ({shared})")
            return True
    return False


def _makers(steps: list, names: set) -> set:
    """The ids of the kernels among steps that store any of the buffers named."""
    return {id(s) for s in steps if isinstance(s, Kernel) and s.stored & names}


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


def _rows_among_ones(shape, x_sizes) -> tuple | None:
    """Where x_sizes's dims are in shape, in order, when every other dim of shape is 1 (a
    split mean of each channel, (C,), divided into its keepdim shape (1, C, 1, 1)); else None."""
    positions, d = [], 0
    for p, size in enumerate(shape):
        if d < len(x_sizes) and size == x_sizes[d]:
            positions.append(p)
            d += 1
        elif size != 1:
            return None
    return tuple(positions) if d == len(x_sizes) else None


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


class MatmulTemplates(FusionPass):
    """A matrix product of two 2-D operands (an extern torch.mm, torch.matmul or `@`) and the
    pointwise kernel that reads its result become one `TemplateKernel`: a Triton matrix
    product whose programs compute the epilogue (a linear layer's bias and activation, a
    residual add, a cast) on their tile of the product while it is in registers, so the product is never written to memory and read back. As
    Inductor, only in mode="max-autotune" (`config.autotune`, on a GPU), where code generation
    times the template against PyTorch's product followed by the epilogue kernel and keeps the
    faster, per shape; `config.matmul_templates` True makes templates wherever they apply,
    without timing (Triton's interpreter on a CPU runs them), False never.

    The epilogue kernel must be pointwise over the product's m x n elements in row-major order,
    reading the product only at the element it computes, and be the product's only reader (the
    graph does not return the product). The template runs where the epilogue ran."""
    name = "matmul-templates"

    def run(self, state):
        if not _templates_wanted(state.program.device):
            return
        outputs = {b.name for b in state.outputs}
        steps = list(state.steps)
        read = [loads(s) for s in steps]
        for i, step in enumerate(steps):
            if not isinstance(step, ExternCall):
                continue
            readers = [k for k in range(len(steps)) if k != i and step.box.name in read[k]]
            epilogue = steps[readers[0]] if len(readers) == 1 else None
            why_not = "read by more than one step" if len(readers) > 1 else \
                "the graph returns it" if step.box.name in outputs else \
                "nothing reads it" if epilogue is None else template_refused(step, epilogue)
            if why_not is None:
                steps[readers[0]] = TemplateKernel(step.box, epilogue)
                steps[i] = None
                state.log(f"{self.name}: {step.box.name}'s product and {epilogue.name} become one template kernel")
            elif _product_call(step.box.data):
                state.log(f"{self.name}: {step.box.name}'s product keeps its own kernel: {why_not}")
        state.steps = [s for s in steps if s is not None]
        renumber(state.steps)


def _templates_wanted(device: torch.device) -> bool:
    if config.matmul_templates is not None:
        return config.matmul_templates and (device.type == "cuda" or config.cpu_backend == "triton")
    return config.autotune and device.type == "cuda"


def _is_product(step: ExternCall) -> str | None:
    """None where the extern call is a product a template can compute, else why not."""
    ext = step.box.data
    if not _product_call(ext) or ext.kwargs or len(ext.args) != 2:
        return "not a matrix product"
    a, b = ext.args
    if not all(isinstance(x, TensorBox) and len(x.shape) == 2 for x in (a, b)):
        return "not a matrix product"
    if ext.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not a.dtype == b.dtype == ext.dtype:
        return f"a product of {ext.dtype}"
    if any(ir.is_symbolic(s) for s in (*a.shape, *b.shape)):
        return "dynamic sizes"
    if 0 in (*a.shape, b.shape[1]):
        return "no elements"
    views = [strided_operand(x) for x in (a, b)]
    if None in views:
        return "an operand that is not a strided view of a buffer"
    if math.prod(ext.shape) >= 2**31 or any(_extent(*v[1:], x.shape) >= 2**31 for v, x in zip(views, (a, b))):
        return "more elements than 32-bit offsets reach"
    return None


PRODUCTS = (torch.mm, torch.matmul, operator.matmul)          # of two 2-D operands: the same


def _product_call(ext: ir.Extern) -> bool:
    if ext.kind == "method":
        return ext.op in ("mm", "matmul", "__matmul__")
    return any(ext.op is p for p in PRODUCTS)


def template_refused(step: ExternCall, epilogue) -> str | None:
    """None where the product and its one reader, `epilogue`, may be one template kernel,
    else why not."""
    why_not = _is_product(step)
    if why_not is not None:
        return why_not
    if type(epilogue) is not Kernel or epilogue.r_sizes or any(m.role != "flat" for m in epilogue.members):
        return f"read by {getattr(epilogue, 'name', 'an extern call')}, which is not a pointwise kernel"
    m, n = step.box.shape
    if any(ir.is_symbolic(s) for s in epilogue.x_sizes) or math.prod(epilogue.x_sizes) != m * n:
        return f"read by {epilogue.name}, which walks {epilogue.x_sizes}, not its {m} x {n} elements"
    x_idx = [Index.var(f"x{d}") for d in range(len(epilogue.x_sizes))]
    ranges = {f"x{d}": s for d, s in enumerate(epilogue.x_sizes)}
    flat = ir.flat_index(x_idx, ir.contiguous_strides(epilogue.x_sizes)).simplify(ranges)
    for member in epilogue.members:
        rec = ir.RecordingOps()
        with ir.use_ops(rec):
            member.run(x_idx, [])
        if any(name == step.box.name and index.simplify(ranges) != flat for name, index in rec.loads):
            return f"{epilogue.name} reads the product at other elements than it computes"
    return None


def strided_operand(box: TensorBox):
    """(buffer name, [stride of dim 0, of dim 1], offset) of the elements a 2-D operand reads,
    or None where its loads are not one strided read of a buffer."""
    rec = ir.RecordingOps()
    with ir.use_ops(rec):
        box.make_loader()([Index.var("i0"), Index.var("i1")])
    if len(rec.loads) != 1 or rec.op_count:
        return None
    name, index = rec.loads[0]
    if not index.is_linear() or index.variables() - {"i0", "i1"} or index.symbols():
        return None
    return name, [index.coeff("i0"), index.coeff("i1")], index.const


def _extent(strides, offset, shape) -> int:
    """One past the largest element offset a strided view reaches."""
    return 1 + offset + sum((size - 1) * abs(stride) for size, stride in zip(shape, strides))


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
    if isinstance(step, TemplateKernel):        # the operands, not the product it computes
        return loads(step.epilogue) - {step.product.name} | loads(ExternCall(step.product))
    own = step.member_names()
    return {name for m in step.members for name, _ in ir.reads_of(m.comp).loads if name not in own}


def stores(step) -> set[str]:
    """Names of the buffers a step writes to memory."""
    return {step.box.name} if isinstance(step, ExternCall) else set(step.stored)
