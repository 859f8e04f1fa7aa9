"""Fusion: decide which IR values get a buffer of their own, and group the work into kernels.

Takes the `Program` lowering built (every value an unrealized TensorBox) and hands code
generation a schedule: an ordered list of `Kernel`s (generated code) and `ExternCall`s
(PyTorch's own kernels).

The decisions are made by an ordered list of passes, `PASSES`, each a small class with a `run`
method over the `FusionState`. A value that no pass realizes is computed inside the kernels
that read it (vertical fusion by inlining): that is how `relu(x + 1) * 2` becomes one kernel.
Part III's assignments add passes to this list. Every decision is logged (`fusion` log).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import ir, logs
from ..lower.boxes import TensorBox


@dataclass
class Kernel:
    """One generated kernel: computes `box` (a realized Pointwise or Reduction), with every
    unrealized value it reads computed inline."""
    name: str
    box: TensorBox
    fused: list[str] = field(default_factory=list)     # origins of the ops computed in it
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def kind(self) -> str:
        return "reduction" if isinstance(self.box.computation, ir.Reduction) else "pointwise"


@dataclass
class ExternCall:
    box: TensorBox


@dataclass
class FusionState:
    program: ir.Program
    boxes: list[TensorBox]
    outputs: list[TensorBox]

    def log(self, message: str) -> None:
        logs.log("fusion", message)


class FusionPass:
    """A pass reads and changes realization decisions. Subclasses document their rule."""
    name = "pass"

    def run(self, state: FusionState) -> None:
        raise NotImplementedError


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


PASSES: list[FusionPass] = [RealizeReductions(), RealizeOutputs(), InlinePointwise()]


def schedule(program: ir.Program, passes: list[FusionPass] | None = None) -> list:
    """Run the passes, then emit one Kernel per realized computation, in program order."""
    outputs = [o for o in program.outputs if isinstance(o, TensorBox)]
    state = FusionState(program, list(program.nodes), outputs)
    for p in PASSES if passes is None else passes:
        p.run(state)
    steps, count = [], 0
    for box in program.nodes:
        if isinstance(box.data, ir.Extern):
            steps.append(ExternCall(box))
        elif isinstance(box.data, ir.ComputedBuffer):
            kernel = Kernel(f"kernel{count}", box)
            count += 1
            kernel.fused = _fused_origins(box)
            kernel.bytes_read, kernel.bytes_written = _bytes_moved(box)
            state.log(f"{kernel.name} computes {box.name} ({kernel.kind}): "
                      f"{' -> '.join(kernel.fused)}; reads {kernel.bytes_read} B, "
                      f"writes {kernel.bytes_written} B")
            steps.append(kernel)
    return steps


def _fused_origins(box: TensorBox) -> list[str]:
    """The ops computed in the kernel of `box`: its own and those of unrealized boxes it reads."""
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


def _bytes_moved(box: TensorBox) -> tuple[int, int]:
    """Minimal bytes: each buffer the kernel loads read once, the output written once."""
    loads = ir.reads_of(box.data.data)
    names = {name for name, _ in loads.loads}
    read = 0
    for buf in _buffers_by_name(box.program).values():
        if buf.name in names:
            read += math.prod(buf.shape) * buf.dtype.itemsize
    written = math.prod(box.shape) * box.dtype.itemsize
    return read, written


def _buffers_by_name(program: ir.Program) -> dict:
    out = {b.name: b for b in program.inputs}
    for box in program.nodes:
        if box.is_realized:
            out[box.name] = box
    return out
