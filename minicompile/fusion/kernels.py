"""What fusion works on and hands on: `Member`s grouped into `Kernel`s, `ExternCall`s, the
`FusionState` the passes change, and `FusionPass`, the base of every pass (passes.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir, logs
from ..ir import Index
from ..lower.boxes import TensorBox


@dataclass
class Member:
    """One stored computation inside a kernel, and how it walks the kernel's iteration space:
    'row' (one value per (x, r): a pointwise over whole rows), 'x' (one value per row: a
    reduction, or a pointwise over the reduced shape), or 'flat' (a pointwise kernel without
    reduction loops)."""
    box: TensorBox
    role: str
    x_dims: tuple = ()      # per row, where the x indices go in its shape when not leading

    @property
    def comp(self):
        return self.box.computation

    def index(self, x_idx: list[Index], r_idx: list[Index]) -> list[Index]:
        """The member's own output index at canonical position (x, r)."""
        shape = list(self.box.shape)
        if self.role in ("row", "flat"):
            return list(x_idx) + list(r_idx)
        if self.x_dims:         # per row, with size-1 dims among the rows' (a keepdim mean)
            idx = [Index()] * len(shape)
            for d, i in zip(self.x_dims, x_idx):
                idx[d] = i
            return idx
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


class ComboKernel(Kernel):
    """Independent pointwise kernels launched as one (combo-kernels): each part keeps its own
    iteration space and code, and a program runs the part its id falls in. Its members are
    the parts' members, so the wrapper and the passes see one kernel that stores them all."""

    def __init__(self, name: str, parts: list[Kernel]):
        super().__init__(name, [m for k in parts for m in k.members], [],
                         stored=set().union(*(k.stored for k in parts)))
        self.parts = parts

    @property
    def kind(self) -> str:
        return "combo"

    def take_in_place(self) -> None:
        """The parts' in-place writes (code generation found them, per part), kept where no
        other part reads the input written over: parts run side by side, or one after another."""
        readers: dict[str, set] = {}
        for k, part in enumerate(self.parts):
            for m in part.members:
                for name, _ in ir.reads_of(m.comp).loads:
                    readers.setdefault(name, set()).add(k)
        self.in_place = {out: [x for x in over if readers.get(x, set()) <= {k}]
                         for k, part in enumerate(self.parts) for out, over in part.in_place.items()}


@dataclass
class ExternCall:
    box: TensorBox


class TemplateKernel(Kernel):
    """A matrix product and the pointwise kernel that reads its result, as one kernel
    (matmul-templates): each program multiplies a tile of the product in registers, then
    computes the epilogue's members on that tile (a bias, an activation, a residual, a cast)
    and stores them; the product itself is never written to memory. `product` is the extern
    product's box, `epilogue` the kernel it replaces; where PyTorch's product is faster, code
    generation runs those two instead (codegen/matmul_template.py's choose_templates).
    `settings`: the launch settings chosen for it (None: the template's defaults)."""

    def __init__(self, product: TensorBox, epilogue: Kernel):
        super().__init__(epilogue.name, epilogue.members, epilogue.x_sizes, stored=set(epilogue.stored))
        self.product, self.epilogue = product, epilogue
        self.settings = None

    @property
    def kind(self) -> str:
        return "template"

    @property
    def operands(self) -> list:
        """The product's two operands (boxes over buffers or strided views of them)."""
        return list(self.product.data.args)


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


