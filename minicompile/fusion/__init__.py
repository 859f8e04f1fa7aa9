"""Fusion: decide which IR values get a buffer of their own, and group the work into kernels.

Takes the `Program` lowering built (every value an unrealized TensorBox) and hands code
generation a schedule: an ordered list of `Kernel`s (generated code) and `ExternCall`s
(PyTorch's own kernels).

The decisions are made by an ordered list of passes, `PASSES` (passes.py), each a small class
with a `run` method over the `FusionState` (kernels.py):

1. realize-reductions, realize-outputs, inline-pointwise decide which values are stored; a
   value that is not stored is computed inside every kernel that reads it (vertical fusion).
2. make-kernels gives every stored computation a kernel of its own.
3. fuse-rows merges consecutive kernels that walk the same rows: a reduction with the
   pointwise work that reads its result (softmax: max, sum and the division in one kernel),
   sibling reductions and pointwise kernels over the same data (horizontal fusion), and
   reductions over the same leading dims of one shape (batch norm's statistics per channel);
   a kernel also joins one up to eight steps before it that reads the same buffers (or
   results of the same kernel), where it does not depend on the steps between (the partial
   sums of two split reductions; two batch norms' backward work on one gradient, past a
   convolution).
4. elide-stores drops the store of a buffer that nothing outside its kernel reads.
5. matmul-templates (mode="max-autotune", on a GPU) makes a matrix product and the pointwise
   kernel that reads its result one `TemplateKernel` (a Triton matrix product with that
   work done on each tile before it is stored); code generation keeps it where it is faster
   than PyTorch's product and the separate kernel.
6. combo-kernels launches consecutive independent pointwise kernels as one (a `ComboKernel`:
   each part its own sizes and code; an optimizer step's per-parameter updates).

Another list of passes reaches `minicompile.compile` without editing the package:
`config.fusion_passes = [...]`, or `compile(fn, options={"fusion_passes": (...)})` (Part III's
assignments). Every decision, and every fusion refused with its reason, is logged (`fusion`).
`draw(fn_or_gm, example_inputs, passes)` (minicompile.picture) draws the resulting kernels.
"""
from __future__ import annotations

import math

from .. import config, ir, logs
from ..lower.boxes import TensorBox
from .kernels import ComboKernel, ExternCall, FusionPass, FusionState, Kernel, Member, TemplateKernel
from .passes import (ComboKernels, ElideStores, FuseRows, InlinePointwise, MakeKernels, MatmulTemplates,
                     RealizeOutputs, RealizeReductions, loads)

__all__ = ["ComboKernel", "ExternCall", "FusionPass", "FusionState", "Kernel", "Member", "PASSES", "TemplateKernel",
           "schedule", "buffers_by_name", "draw", "format_bytes"]

PASSES: list[FusionPass] = [RealizeReductions(), RealizeOutputs(), InlinePointwise(), MakeKernels(),
                            FuseRows(), ElideStores(), MatmulTemplates(), ComboKernels()]


def schedule(program: ir.Program, passes: list[FusionPass] | None = None) -> list:
    """Run the passes (None: `config.fusion_passes`, or `PASSES` when that is None); return the
    steps (Kernels and ExternCalls) in execution order."""
    # values written into graph inputs must exist in memory at the end, as outputs do
    outputs = [o for o in program.outputs if isinstance(o, TensorBox)]
    state = FusionState(program, list(program.nodes), outputs)
    if passes is None:
        passes = PASSES if config.fusion_passes is None else config.fusion_passes
    for p in passes:
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
    read = sum(math.prod(buffers[n].shape) * buffers[n].dtype.itemsize for n in loads(kernel))
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


def __getattr__(name):
    # the picture module draws schedules, so it imports this package: loaded when first used
    if name in ("draw", "format_bytes"):
        from .. import picture
        return getattr(picture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
