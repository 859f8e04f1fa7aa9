"""The run-time half of training: the compiled forward and backward graphs, called by autograd.

Takes the two compiled halves and what the partition decided (partition.py); hands the backend
contract a callable with the user's graph's inputs and outputs. Each call runs the compiled
forward inside a `torch.autograd.Function`, which keeps the saved values for the backward
(through `ctx.save_for_backward`, so that a later in-place write to one of them raises, as in
eager, instead of giving a wrong gradient); `loss.backward()` then runs the compiled backward,
which returns the gradients of the inputs that need them. A backward asked to be differentiable
itself (create_graph=True: a gradient penalty, a meta-learning step) computes the gradients from
the graph run again by PyTorch, whose own backward then serves: the compiled backward has none.
"""
from __future__ import annotations

import weakref

import torch
import torch.utils._pytree as pytree

from torch.autograd.graph import increment_version

from .. import aliasing, autocast, ir
from ..runtime.memory import as_layout


class CompiledTraining:
    """Call it with the graph's inputs: its outputs, recorded by autograd as one node whose
    backward is the compiled backward graph."""

    def __init__(self, joint, partition, forward, backward, overwritten=None, values_graph=None,
                 saved_as_eager=(), stored=None):
        """overwritten: {primal that gets a new value: the in-place ops that write it}; stored:
        {forward output: the primal it may be stored straight into}."""
        self.joint, self.partition = joint, partition
        self.forward, self.backward = forward, backward
        self.overwritten, self.stored = overwritten or {}, stored or {}
        # the values-only graph, which a differentiable backward runs again with PyTorch's
        # autograd: not where it draws random numbers (the draws would not be the forward's),
        # nor where it writes its inputs (run again, it would read the values written)
        self.values_graph = values_graph if values_graph is not None and not overwritten and not any(
            ir.draws_random_numbers(n) for n in values_graph.graph.nodes) else None
        self.shape_guards: list = []
        # inputs that get new values (by the forward, or after it) and that eager's autograd
        # saves as they are before that (joint.py's `_SavesOf`): their versions are kept, so
        # that the backward raises where eager's does (the write moved their version counter),
        # and they are read as they are (written through `.data`, which leaves the version as
        # it was, eager's backward reads the new values)
        self.saved_as_eager = list(saved_as_eager)
        # the others eager saves as they are: a write after the call (in eager code, or the next
        # graph's) makes eager's backward raise, and so this one (watched, not held)
        self.saved_and_watched = sorted(joint.saved_by_eager - set(saved_as_eager))
        # other inputs the backward reads as they were, which get new values: saved as copies
        # made before the forward runs (eager saved a value computed from them)
        self.saved_overwritten = {k for kind, k in partition.saved_from if kind == "primal" and k in overwritten
                                  and k not in self.saved_as_eager}
        # the layout the backward was compiled for, per saved value (where its sizes are
        # symbols: the order of its dims in memory, its strides made for each call's sizes)
        placeholders = [n.meta["val"] for n in partition.backward.graph.nodes if n.op == "placeholder"]
        self.saved_strides = [_layout(v) for v in placeholders[:len(partition.saved_from)]]
        # dynamic shapes: sizes the backward reads (numbers, not tensors), by position
        self.sizes_at = [k for k, v in enumerate(placeholders[:len(partition.saved_from)])
                         if not isinstance(v, torch.Tensor)]
        self.tangents = placeholders[len(partition.saved_from):]
        # the gradients' shapes, for the zeros of an output the caller did not use: known now
        # unless their sizes are symbols (then each call's outputs say)
        self.tangent_shapes = None if any(isinstance(n, torch.SymInt) for v in self.tangents
                                          for n in v.shape) else [v.shape for v in self.tangents]
        self.backward_holds = _conditions(backward, partition.backward)
        # inputs that get no gradient (not read, or read only where no gradient flows) are
        # handed over detached: autograd would link the node to their history (a tensor an
        # earlier call computed, whose graph is gone: the old weight_norm's `weight`), as eager
        # never does
        self.no_gradient = {k for k in range(joint.num_primals) if k not in set(joint.grad_inputs)}
        # a flat tuple or list of outputs (a model's graph returning its result and the
        # statistics its batch norms update) is made without pytree, on every call
        numbers = pytree.tree_unflatten(list(range(joint.output_spec.num_leaves)), joint.output_spec)
        self.flat = type(numbers) if type(numbers) in (tuple, list) and list(numbers) == list(
            range(joint.output_spec.num_leaves)) else None

    def __call__(self, *args):
        primals = [a for a, (kind, _) in zip(args, self.joint.inputs) if kind == "primal"]
        if self.no_gradient:
            primals = [t.detach() if k in self.no_gradient and getattr(t, "requires_grad", False) else t
                       for k, t in enumerate(primals)]
        # recorded with grad mode on: which outputs carry gradients was decided by the trace,
        # grad mode switches inside the graph included (the others are non-differentiable)
        with torch.enable_grad():
            outs = _Function.apply(self, *primals)
        if self.joint.grad_mode_after is not None:     # the graph's torch.set_grad_enabled
            torch._C._set_grad_enabled(self.joint.grad_mode_after)
        leaves = [outs[k] if kind == "tensor" else k(*args) if kind == "size" else k
                  for kind, k in self.joint.outputs]
        return self.flat(leaves) if self.flat is not None else pytree.tree_unflatten(leaves, self.joint.output_spec)

    @property
    def source(self) -> str:
        return (f"# ==== forward\n{self.forward.source}\n"
                f"# ==== backward\n{self.backward.source}")


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: CompiledTraining, *primals):
        joint, part = plan.joint, plan.partition
        before = {k: primals[k].clone() for k in plan.saved_overwritten}
        result = plan.forward(*primals)
        ctx.versions = [(primals[k], primals[k]._version) for k in plan.saved_as_eager]
        ctx.watched = [(weakref.ref(primals[k]), primals[k]._version) for k in plan.saved_and_watched]
        for k, p in plan.stored.items():
            if aliasing.stored_into(result[k], primals[p]):
                # the forward stored the new value straight into the input: its version moves
                # now, before a value is saved, as eager's saves follow its writes (the
                # epilogue moves it no further)
                for _ in range(plan.overwritten.get(p, 1)):
                    increment_version(primals[p])
        tensors = [t for t in primals if isinstance(t, torch.Tensor)]
        outs = [_own_tensor(o, tensors) for o in result[:joint.num_outputs]]
        computed = list(result[joint.num_outputs:])
        kept = [before.get(k, t) for k, t in enumerate(primals)] if before else primals
        # an inference-mode input (a cached embedding, a teacher's output), or a view of one,
        # cannot be saved: the partition saves inputs and their views where eager may save a
        # copy of one (t.clone() * x, t.clone() @ w), so a copy it is
        # (a saved input too: the backward reads each saved value as `_layout` says, and an
        # input may be laid out otherwise, a split's piece)
        saved = [_laid_out(kept[k] if kind == "primal" else computed[k], stride)
                 for (kind, k), stride in zip(part.saved_from, plan.saved_strides)]
        ctx.written_outputs = _watch_outputs_saved(saved, outs, plan) if plan.values_graph is not None else ()
        ctx.sizes = [(k, saved[k]) for k in plan.sizes_at]       # (numbers: kept apart)
        if ctx.sizes:
            saved = [t for t in saved if isinstance(t, torch.Tensor)]
        # (and the outputs eager saves: their versions checked as the saved values are read)
        ctx.save_for_backward(*[t.clone() if t.is_inference() else t for t in saved],
                              *[outs[k] for k in plan.joint.outputs_saved_by_eager])
        ctx.shapes = plan.tangent_shapes or [o.shape for o, d in zip(outs, joint.differentiable) if d]
        ctx.plan = plan
        # what a differentiable backward reads: the inputs (the graph run again), or those that
        # need gradients, for the node that raises (_not_differentiable): all, not those saved
        ctx.inputs = primals if plan.values_graph is not None else [t for t in tensors if t.requires_grad]
        ctx.set_materialize_grads(False)       # an output the caller did not use: None
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, joint.differentiable) if not d])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        for t, version in ctx.versions + [(ref(), version) for ref, version in ctx.watched]:
            if t is not None and t._version != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: [{t.type()} {list(t.shape)}] is at version {t._version}; expected version "
                    f"{version} instead. Hint: the variable was written in place after it was used (in eager, "
                    "after autograd saved it)")
        if any(o() is not None and o()._version != version for o, version in ctx.written_outputs):
            # an output the backward reads (eager's reads a value of its own) that the caller
            # wrote in place: the gradients of the graph run again on the inputs
            grads = _Function._differentiable_gradients(ctx, grad_outputs)
            return tuple(g.detach() if isinstance(g, torch.Tensor) else g for g in grads)
        saved = list(ctx.saved_tensors)
        del saved[len(saved) - len(ctx.plan.joint.outputs_saved_by_eager):]
        for k, size in ctx.sizes:
            saved.insert(k, size)
        # from here the list alone holds the saved values (unless the graph is kept:
        # retain_graph), and the compiled backward lets go of each after its last use, as
        # AOTAutograd's does: the gradients computed late in the backward take the memory of
        # activations read early, instead of adding to them
        ctx.maybe_clear_saved_tensors()
        differentiable = torch.is_grad_enabled()
        if differentiable and ctx.plan.values_graph is not None:
            saved.clear()
            return _Function._differentiable_gradients(ctx, grad_outputs)
        with torch.no_grad():
            grads = _Function._gradients(ctx, saved, grad_outputs)
        if differentiable:
            # create_graph=True on a graph not run again (it draws random numbers or writes its
            # inputs): these gradients may be differentiated, but the compiled backward has no
            # backward of its own. Asking for one raises, as in torch.compile, rather than losing
            # the second-order terms (through every input that needs a gradient: one the forward
            # did not save, whose own history leads to the parameters, included)
            return _not_differentiable(grads, ctx.inputs)
        return grads

    @staticmethod
    def _differentiable_gradients(ctx, grad_outputs):
        """The gradients as PyTorch's autograd computes them from the graph run again on the
        same inputs (create_graph: its backward is differentiable, the inputs' history kept)."""
        plan, joint = ctx.plan, ctx.plan.joint
        with torch.enable_grad():
            # asked of aliases of the inputs: a hook on an input (registered at a break before
            # this graph) runs once, when the gradient flows on into it, as in eager; asked of
            # the input itself, autograd.grad would run it too
            inputs = [t.view_as(t) if isinstance(t, torch.Tensor) and t.requires_grad else t for t in ctx.inputs]
        args = [inputs[k] if kind == "primal" else k for kind, k in joint.inputs]
        with torch.enable_grad(), autocast.off():
            leaves = pytree.tree_flatten(plan.values_graph(*args))[0]
        outs = [leaves[i] for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        pairs = [(o, g) for o, g, d in zip(outs, grad_outputs, joint.differentiable)
                 if d and g is not None and o.requires_grad]
        wanted = [k for k, t in enumerate(inputs) if ctx.needs_input_grad[k + 1]]
        result = [None] * len(inputs)
        if pairs and wanted:
            grads = torch.autograd.grad([o for o, _ in pairs], [inputs[k] for k in wanted],
                                        [g for _, g in pairs], allow_unused=True, create_graph=True)
            for k, g in zip(wanted, grads):
                result[k] = g
        return (None, *result)

    @staticmethod
    def _gradients(ctx, saved: list, grad_outputs):
        """The gradients; empties `saved` (handed on to the compiled backward)."""
        plan = ctx.plan
        joint = plan.joint
        # the backward was compiled for dense gradients (autograd may hand an expanded one)
        tangents = [g for g, d in zip(grad_outputs, joint.differentiable) if d]
        used = {i for i, g in enumerate(tangents) if g is not None}
        result = [None] * joint.num_primals
        if not used:
            return (None, *result)
        args = saved + [g.contiguous() if g is not None else
                        torch.zeros(shape, dtype=v.dtype, device=v.device)
                        for g, v, shape in zip(tangents, plan.tangents, ctx.shapes)]
        saved.clear()
        if plan.backward_holds is None or plan.backward_holds(*args):
            grads = plan.backward.run_consuming(args)
        else:
            # sizes the backward's code was not made for (a size the forward's guards do not
            # cover that its lowering decided on, or below 2): the backward graph on PyTorch's
            # kernels, which computes what the joint graph traced
            grads = plan.partition.backward(*args)
        for k, g in zip(joint.grad_inputs, grads):
            result[k] = g if joint.reached_by[k] & used else None
        return (None, *result)


def _watch_outputs_saved(saved: list, outs: list, plan) -> list:
    """Each saved value that is (the memory of) an output eager's autograd does not save, which
    the partition chose to save, replaced in `saved` by an alias with a version counter of its
    own: the caller may write the output in place, which eager's backward does not see (nor
    raise for: the write moves the output's version, not the alias's). -> [(a weak reference to
    each such output, its version)], for the backward to see whether it was written."""
    outputs = {aliasing.storage_address(o): o for k, o in enumerate(outs)
               if k not in plan.joint.outputs_saved_by_eager}
    outputs.pop(None, None), outputs.pop(0, None)       # (no memory: nothing to write)
    watched = []
    for i, (t, (kind, _)) in enumerate(zip(saved, plan.partition.saved_from)):
        out = outputs.get(aliasing.storage_address(t)) if kind == "computed" and isinstance(t, torch.Tensor) else None
        if out is not None:
            saved[i] = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
            watched.append((weakref.ref(out), out._version))
    return watched


def _layout(value):
    """What the backward was compiled to read of a saved value: its strides (a tuple); where
    its sizes or strides are symbolic (dynamic shapes), a `SymbolicLayout`, from which
    `_laid_out` makes the strides of each call's sizes; None for a size."""
    if not isinstance(value, torch.Tensor):
        return None
    if not ir.has_symbolic_layout(value):       # (SymInts the trace specialized are numbers)
        return tuple(ir.hint(s) for s in value.stride())
    return SymbolicLayout.of(value)


class SymbolicLayout(tuple):
    """(order, gaps, fixed): how the backward reads a saved value of symbolic sizes, as the
    joint graph traced it where that holds at every size, since the backward's graph may view
    it only so (q's class token split off one qkv product: torchvision's MViT). `fixed`: the
    traced strides, where they are numbers and one dim, the outermost, has a symbolic size
    (a batch dim). Else `gaps`: ir.gapped_layout's room after each dim's items, where the
    traced strides are those at every size. Else (gaps None) dense, its dims in `order`, from
    the outermost in memory to the innermost."""

    @classmethod
    def of(cls, value: torch.Tensor) -> "SymbolicLayout":
        hints = [ir.hint(s) for s in value.shape], [ir.hint(s) for s in value.stride()]
        traced = ir.stride_of(value)
        layout = ir.gapped_layout(*hints)
        symbolic = [d for d, n in enumerate(value.shape) if ir.is_symbolic(ir.size_expr(n))]
        if not any(ir.is_symbolic(s) for s in traced) and len(symbolic) == 1 and \
                hints[1][symbolic[0]] == max(hints[1]) and layout is not None:
            # (one dim of symbolic size, the outermost: its items never overlap at any size)
            return cls((None, None, tuple(traced)))
        if layout is not None and any(g != 1 for g in layout[1]) and ir.layout_strides(value.shape, *layout) == traced:
            return cls((*layout, None))
        return cls((ir.stride_order(hints[1]), None, None))

    def strides(self, shape) -> tuple:
        order, gaps, fixed = self
        return fixed if fixed is not None else tuple(ir.layout_strides(shape, order, gaps))


def _laid_out(value, layout):
    """A saved value laid out as `_layout` says the backward reads it."""
    if layout is None:
        return value
    if isinstance(layout, SymbolicLayout):
        layout = layout.strides(value.shape)
    return as_layout(value, layout)


def _conditions(backward, graph: torch.fx.GraphModule):
    """Where the backward's code is generic in sizes: a function of its inputs that says
    whether it was made for theirs (its shape guards, and each size symbol at least 2), else
    None (made for the example's sizes, which the forward's guards fix)."""
    conditions = list(getattr(backward, "shape_guards", ()))
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            conditions.append(f"arg{i} >= 2")
        elif isinstance(val, torch.Tensor) and any(ir.is_symbolic(ir.size_expr(s)) for s in val.shape):
            conditions += [f"arg{i}.size({d}) >= 2" for d, s in enumerate(val.shape)
                           if ir.is_symbolic(ir.size_expr(s))]
    if not conditions:
        return None
    return ir.function_of_inputs(len(placeholders), " and ".join(f"({c})" for c in conditions))


def _own_tensor(out: torch.Tensor, inputs) -> torch.Tensor:
    """An output the generated code made as a view of one of its own buffers (a transpose it
    did not copy), as a tensor of its own: autograd forbids writing in place into a view that
    is one of several outputs of a Function, where eager's result (a view of a value the graph
    does not return, or no view at all) may be written. Views of the inputs, and of other
    outputs, are made again outside (functionalize.Epilogue)."""
    base = out._base
    if base is None or any(base is t or base is t._base for t in inputs):
        return out
    return out.detach()


def _not_differentiable(grads: tuple, inputs: list) -> tuple:
    """The gradients, each with a backward that raises (as torch's @once_differentiable). The
    node also reads `inputs`, the Function's inputs that need gradients, so that a gradient
    asked of them, or of what they were computed from, reaches it and raises too."""
    error = torch._C._functions.DelayedError(
        b"minicompile: the compiled backward is not differentiable (double backward: "
        b"create_graph=True, then a gradient of a gradient)", len(grads) + len(inputs))
    outs = error(*[g.detach().requires_grad_() if g is not None else None for g in grads], *inputs)
    return tuple(outs[:len(grads)])
