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
        self.reads = [r for r in reads if isinstance(r, TensorBox)]
        for r in self.reads:
            r.readers.append(self)
        if isinstance(data, (ir.Pointwise, ir.Reduction, ir.Extern)):
            program.nodes.append(self)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    device = property(lambda self: self.data.device)
    name = property(lambda self: self.data.name)

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

    def realize(self) -> "TensorBox":
        if not self.is_realized:
            self.data = ir.ComputedBuffer(self.program.new_name(), self.data)
        return self

    def __repr__(self):
        name = getattr(self.data, "name", None) or "(not stored)"
        return f"TensorBox({type(self.data).__name__} {name} {list(self.shape)} {self.dtype})"
