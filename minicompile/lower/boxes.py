"""TensorBox: the handle lowering gives every value, so fusion can decide later where it lives.

A box holds an IR node. Consumers load through the box *when their code is generated*, not when
they are lowered, so when a fusion pass realizes a box (stores a Pointwise in a buffer) every
consumer reads the buffer instead of recomputing: the decision is made once, in one place.
"""
from __future__ import annotations

from .. import ir


class TensorBox(ir.IRNode):
    def __init__(self, data: ir.IRNode, program: ir.Program, reads: tuple = ()):
        self.data = data
        self.program = program
        self.readers: list[TensorBox] = []     # boxes whose inner functions read this one
        self.wanted_stride = None              # the layout it gets when realized (a graph output's)
        self.eager_stride = None               # a graph output's strides in eager, where eager's is
                                               # a view (expanded: 0 where it repeats; or with gaps):
                                               # returned as a view, if it can be
        self.size_one_strides: dict = {}       # dim -> eager's stride, for its dims of size one
        self.reads = [r for r in reads if isinstance(r, TensorBox)]
        for r in self.reads:
            r.readers.append(self)
        if isinstance(data, (ir.Pointwise, ir.Reduction, ir.Extern)):
            program.nodes.append(self)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    device = property(lambda self: self.data.device)
    name = property(lambda self: self.data.name)

    @property
    def is_host_number(self) -> bool:
        """A 0-dim CPU tensor in a GPU program, which eager's kernels take as a number: GPU
        kernels read it copied there (the wrapper copies it once a call)."""
        return self.program.device.type != "cpu" and self.device.type == "cpu" and not self.shape

    def make_loader(self):
        def load(index, *rest):
            return self.data.make_loader()(index, *rest)
        return load

    @property
    def is_realized(self) -> bool:
        return not isinstance(self.data, (ir.Pointwise, ir.Reduction))

    @property
    def owns_buffer(self) -> bool:
        """Realized into memory of its own (not an input, not a view of another buffer)."""
        return self.is_realized and not isinstance(self.data, ir.ViewOfBuffer)

    @property
    def computation(self):
        """The Pointwise / Reduction behind this box, realized or not (None for inputs, externs)."""
        data = self.data.data if isinstance(self.data, ir.ComputedBuffer) else self.data
        return data if isinstance(data, (ir.Pointwise, ir.Reduction)) else None

    def realize(self, stride=None) -> "TensorBox":
        """Store the value in a buffer of its own, with `stride` (dense) when the caller needs a
        layout (a channels-last convolution's input), else `wanted_stride`, else contiguous.
        Already stored: unchanged (see `laid_out` for a value needed in a given layout)."""
        if not self.is_realized:
            self.data = ir.ComputedBuffer(self.program.new_name(), self.data, stride or self.wanted_stride)
        return self

    def has_strides(self, stride) -> bool:
        """Stored with these strides (a dim of size 1 may have any stride)."""
        actual = getattr(self.data, "stride", None) if self.is_realized else None
        return actual is not None and len(actual) == len(stride) and all(
            a == b or n == 1 for a, b, n in zip(actual, stride, self.shape))

    def laid_out(self, stride) -> "TensorBox":
        """This value in memory with strides `stride`: itself when stored so already, realized
        so when not stored yet, else a copy (one more kernel) that is."""
        if not self.is_realized:
            return self.realize(stride)
        if self.has_strides(stride):
            return self
        copy = ir.Pointwise(list(self.shape), self.dtype, self.device, self.make_loader(), "layout copy")
        return TensorBox(copy, self.program, [self]).realize(stride)

    def __repr__(self):
        name = getattr(self.data, "name", None) or "(not stored)"
        return f"TensorBox({type(self.data).__name__} {name} {list(self.shape)} {self.dtype})"
