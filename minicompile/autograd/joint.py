"""The joint graph: a values-only FX graph whose inputs need gradients -> one aten-level graph
that computes the forward outputs and the gradients together.

Takes functionalize.py's graph (every node computes a new value) and its example inputs.
record.py (a lean make_fx; make_fx itself for what it does not model) records the aten ops of a
function that runs the graph and asks autograd for the gradients of its outputs
(`torch.autograd.grad`), so what autograd's backward formulas run is recorded as ops beside the
forward's. The trace runs on fake tensors (no data, no arithmetic); the gradients it starts from
(one per output that carries a gradient, shaped as it) are inputs of the trace, known before it
from the values capture recorded for the graph's outputs. A decomposition table
breaks composite ops into the small set lowering takes (batch norm and layer norm, their
backwards, softmax's backward, ReLU's `threshold_backward`... into pointwise ops and
reductions). Where the decompositions write (batch norm writes its running statistics into the
clones functionalize.py made), a second trace through `torch.func.functionalize` makes the
writes values again. A value the graph computes more than once (a mask each layer's attention
makes from the same input) is then computed once (`_merge_common_values`).

Hands the partitioner (partition.py) a `Joint`: placeholders are the tensor inputs ("primals")
then one gradient per differentiable output ("tangents"); outputs are the forward's tensor
outputs then the gradients of the inputs that need them.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
import torch.utils._pytree as pytree

from .. import aliasing, custom_ops, ir, logs
from . import record
from ..capture.higher_order import RECOMPUTE

aten = torch.ops.aten


@dataclass
class Joint:
    graph: torch.fx.GraphModule
    num_primals: int               # tensor inputs of the user's graph, and the numbers it is
                                   # generic in (dynamic), in order
    num_outputs: int               # tensor outputs of the forward (the joint's first outputs)
    differentiable: list           # per forward tensor output: does it carry a gradient?
    grad_inputs: list              # per gradient output: which primal it is the gradient of
    reached_by: list               # per primal: the differentiable outputs whose autograd graph
                                   # reaches it (none of those the caller used: its gradient is
                                   # None, as in eager; a formula that gives zeros still reaches)
    inputs: list                   # the user's graph inputs: ("primal", k) or ("const", v)
    outputs: list                  # its output leaves: ("tensor", k), ("const", v) or ("size", f),
                                   # f(*graph inputs) computing a size from the inputs' sizes
    output_spec: Any               # the pytree structure of its output
    grad_mode_after: Any = None    # the grad mode the graph leaves set (torch.set_grad_enabled
                                   # in it), which the traced aten graphs do not record
    shape_conditions: list = field(default_factory=list)
                                   # dynamic shapes: what the trace needed of the user's graph
                                   # inputs' sizes (`arg0.size(0) == arg2.size(1)`)
    saved_by_eager: frozenset = frozenset()
                                   # the primals eager's autograd saves as they are (or a view
                                   # of them) for an op other than one that writes them
    outputs_saved_by_eager: frozenset = frozenset()
                                   # the forward's tensor outputs (by index) eager's autograd
                                   # saves (or a view of their memory): one the caller writes
                                   # makes the backward raise


@functools.lru_cache(maxsize=None)
def decompositions() -> dict:
    """PyTorch's core ATen decompositions, plus batch norm's (training and inference), layer
    norm's and group norm's forward: what is left is matrix products, convolutions, attention, pointwise
    ops, reductions, views and a few ops lowering hands to PyTorch. Made once per process
    (tens of milliseconds, which every graph's first call paid); not to be changed."""
    import torch._decomp as decomp
    # (core_aten_decompositions() adds the decomposition of every CompositeImplicitAutograd op
    # of every namespace, found op by op, a tenth of a second: a trace after autograd, as this
    # one is, decomposes those ops anyway)
    core = getattr(decomp, "_core_aten_decompositions_post_autograd", decomp.core_aten_decompositions)
    table = dict(core())
    table.update(decomp.get_decompositions([
        aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
        aten._native_batch_norm_legit_no_training, aten.native_layer_norm, aten.native_group_norm, aten._softmax,
        aten._log_softmax]))
    # attention stays one fused op (an extern call) whose backward reads its logsumexp: a
    # decomposed forward would hand the fused backward other tensors in that place. An
    # embedding's backward stays PyTorch's kernel: decomposed, it is an accumulating index_put,
    # whose deterministic kernel sorts the indices first (on the H100, BERT-base's three
    # embeddings: 0.98 ms a step against 0.22)
    # multilabel_margin_loss's decomposition counts the target slots after the first -1
    # (input[:, 0] in their place; torch 2.13): PyTorch's kernel instead, and its backward
    for op in (aten.scaled_dot_product_attention.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default,
               aten.embedding_dense_backward.default,
               aten.multilabel_margin_loss_forward.default):
        table.pop(op, None)
    table[aten.max_pool2d_with_indices.default] = _max_pool_saving_offsets
    # a power by a float the graph is generic in stays one op: its decomposition asks whether
    # the exponent is 2 or 0.5 (some torch versions), which would fix its value
    for op in (aten.pow.Tensor_Scalar, aten.pow.Scalar):
        if op in table:
            table[op] = functools.partial(_unless_symbolic_float, table[op])
    return table


def _unless_symbolic_float(decomposition, *args, **kwargs):
    if any(isinstance(a, torch.SymFloat) for a in args):
        return NotImplemented
    return decomposition(*args, **kwargs)


def _max_pool_saving_offsets(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Max pooling whose backward reads each maximum's place in its window (int8, which the
    partition saves) instead of its index into the input plane (int64): custom_ops.py's pair.
    Where lowering would leave the pooling or its backward to PyTorch (a dilated or large
    window, a dtype other than float32 and float64), PyTorch's op is recorded as it is."""
    kernel, stride, padding = custom_ops.pooling_sizes(kernel_size, stride, padding)
    if custom_ops.pair(dilation) != [1, 1] or kernel[0] * kernel[1] > custom_ops.LARGEST_WINDOW \
            or x.dim() not in (3, 4) or x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    maxima, offsets = custom_ops.max_pool2d_offsets(x, kernel, stride, padding, ceil_mode)
    return maxima, custom_ops.max_pool2d_offsets_to_indices(offsets, kernel, stride, padding, x.shape[-1])


def trace_joint(gm: torch.fx.GraphModule, example_inputs, from_capture: bool = True) -> Joint:
    """The joint graph of gm (see the module's docstring). What the trace must know before it
    starts (the outputs' shapes, which carry gradients) comes from the values capture recorded
    for gm's outputs; where it did not record them, or the trace finds otherwise, from a run of
    gm on fake tensors first (`from_capture=False`).

    Dynamic shapes: where capture marked dims of gm's inputs dynamic (`meta["dynamic_dims"]`),
    the trace runs on fake tensors whose sizes there are symbols, so the joint graph is generic
    in them (its sizes read by `sym_size` nodes), and what the trace needed of them is kept in
    `Joint.shape_conditions`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    example_inputs = list(example_inputs)
    dynamic = [set(n.meta.get("dynamic_dims", ())) for n in gm.graph.nodes if n.op == "placeholder"]
    # the primals: the tensor inputs, and the numbers the graph is generic in (a mixup weight,
    # a loss scale that changes every step), which the forward and the backward read as inputs
    primal_at = [i for i, v in enumerate(example_inputs)
                 if isinstance(v, torch.Tensor) or (dynamic[i] and type(v) in (int, float))]
    needs_grad = [getattr(example_inputs[i], "requires_grad", False) for i in primal_at]
    inputs = [("primal", primal_at.index(i)) if i in primal_at else ("const", v)
              for i, v in enumerate(example_inputs)]

    symbolic = any(dynamic)
    if symbolic:
        mode = ir.fake_mode()
        primals = [ir.symbolic_float(mode, example_inputs[i], f"arg{i}") if type(example_inputs[i]) is float
                   else ir.symbolic_fake(mode, example_inputs[i], dynamic[i], f"arg{i}") for i in primal_at]
        from_capture = False            # (capture's values have the example's sizes)
    else:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with ir.quiet_grad_reads():        # (one warnings filter for a model's hundreds of weights)
            primals = [mode.from_tensor(example_inputs[i]) for i in primal_at]

    def run(values, interpreter=torch.fx.Interpreter):
        args = [values[k] if kind == "primal" else k for kind, k in inputs]
        return pytree.tree_flatten(interpreter(gm).run(*args))

    # which outputs carry gradients, and their shapes: as capture ran them (eager's values), or
    # else from one run on fake tensors, from the caller's grad mode (the graph may switch it)
    grad_on = torch.is_grad_enabled()
    touched: list = []
    captured = _captured_outputs(gm) if from_capture else None
    watching = functools.partial(_WatchingGenerators, touched=touched)
    if captured is None:
        with mode, torch.set_grad_enabled(grad_on), ir.sizes_generic(symbolic):
            leaves, spec = run(primals, watching)
        _refuse_seeding(touched)
    else:
        leaves, spec = captured
    tensor_outs = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    outputs = [("tensor", tensor_outs.index(i)) if i in tensor_outs else ("const", v)
               for i, v in enumerate(leaves)]
    reads = _symbol_reads(primals, primal_at) if symbolic else {}
    if any(isinstance(v, torch.SymBool) or isinstance(v, torch.SymFloat) and not v.node.expr.is_Symbol
           for v in leaves):
        raise NotImplementedError("the graph returns a float or bool computed from its sizes")
    # a size the graph returns (a cache's length += x.shape[1]), or a float input it hands on (to
    # the code after a break): computed from the inputs by Python on each call, as the
    # generated code's wrapper computes one
    outputs = [("size", _size_function(v, reads, len(example_inputs))) if isinstance(v, (torch.SymInt, torch.SymFloat))
               else o for o, v in zip(outputs, leaves)]
    differentiable = [leaves[i].requires_grad for i in tensor_outs]
    reached_by = None if captured is not None else \
        _reached_by([leaves[i] for i, d in zip(tensor_outs, differentiable) if d], primals)
    with mode:
        tangents = [torch.empty(leaves[i].shape, dtype=leaves[i].dtype, device=leaves[i].device)
                    for i, d in zip(tensor_outs, differentiable) if d]
    grad_inputs: list = []
    saved_by_eager: set = set()
    saved_then_written: set = set()
    outputs_saved: set = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    placeholders = [placeholders[i] for i in primal_at]
    # the outputs eager's code lays out contiguous: asked here, as make_fx traces only what its
    # own trace computes (a sizes-generic value's strides are expressions it did not record)
    contiguous_in_eager = [leaves[i].is_contiguous() for i in tensor_outs]
    # in-place ops whose eager autograd saves what they wrote, written again later (asked of
    # eager here, outside the trace's modes)
    saving_writes = {n for n in gm.graph.nodes if n.meta.get(aliasing.WRITES)
                     and n.meta.get(aliasing.WRITTEN_LATER) is not None and aliasing.saves_what_it_wrote(n)}

    def joint(primals, tangents):
        nonlocal reached_by
        leafs = [p.detach().requires_grad_(n) if isinstance(p, torch.Tensor) else p
                 for p, n in zip(primals, needs_grad)]
        saves = _SavesOf(leafs, placeholders, saved_by_eager, saved_then_written, saving_writes)
        with torch.set_grad_enabled(grad_on), _AsCompiledCodeComputes(), saves:
            outs, _ = run(leafs, functools.partial(saves.interpreter,
                                                   torch.fx.Interpreter if captured is None else watching))
        if captured is not None:
            if [isinstance(o, torch.Tensor) for o in outs] != [isinstance(v, torch.Tensor) for v in leaves] \
                    or [(o.requires_grad, o.shape, o.dtype, o.device) for o in (outs[i] for i in tensor_outs)] \
                    != [(v.requires_grad, v.shape, v.dtype, v.device) for v in (leaves[i] for i in tensor_outs)]:
                raise _NotAsCaptured      # (a graph compiled again for other sizes, say)
            reached_by = _reached_by([outs[i] for i, d in zip(tensor_outs, differentiable) if d], leafs)
        # outputs eager's autograd saves (or a view of their memory), which a write after the
        # graph makes its backward raise (not the primals': those are saved as they are)
        outputs_saved.update(j for j, i in enumerate(tensor_outs) if saves.saves(outs[i]) and not any(
            _memory_owner(outs[i]) is p for p in leafs))
        # the outputs in eager's layout (a value computed channels-last is made contiguous)
        outs = [outs[i].contiguous() if c and not outs[i].is_contiguous() else outs[i]
                for i, c in zip(tensor_outs, contiguous_in_eager)]
        wanted = [k for k, n in enumerate(needs_grad) if n]
        grads = torch.autograd.grad([o for o, d in zip(outs, differentiable) if d],
                                    [leafs[k] for k in wanted], tangents, allow_unused=True)
        grad_inputs[:] = [k for k, g in zip(wanted, grads) if g is not None]
        return [o.detach() for o in outs] + [g for g in grads if g is not None]

    table = decompositions()
    # a checkpointed function's nodes (capture marks them) mark the aten nodes they become, for
    # the partitioner; only then, as it costs a copy of each node's meta
    marked = any(RECOMPUTE in n.meta for n in gm.graph.nodes)
    with _lazy_code(), ir.quiet_grad_reads(), ir.sizes_generic(symbolic), \
            torch.fx.traceback.preserve_node_meta() if marked else contextlib.nullcontext():
        try:
            graph = _trace(joint, primals, tangents, table, lean=not marked and not symbolic)
        except _NotAsCaptured:
            return trace_joint(gm, example_inputs, from_capture=False)
        _refuse_seeding(touched)
        if captured is not None:        # one tensor passed as several inputs reaches them all
            reached_by = _reached_by_tied(reached_by, primals)
        if _writes(graph):
            # (run by an interpreter where nodes are marked, which hands each node's marks on)
            again = torch.fx.Interpreter(graph).run if marked else graph
            graph = _trace(torch.func.functionalize(again, remove="mutations"), primals, tangents, table,
                           lean=not marked and not symbolic)
    if _writes(graph):
        raise NotImplementedError("the joint graph writes an input (functionalization left a copy_ "
                                  "into it)")
    if saved_then_written:
        # (eager's backward then raises, or reads what `.data` wrote; PyTorch's kernels run it so)
        raise NotImplementedError(f"a tensor eager's autograd saves for backward ({', '.join(sorted(saved_then_written))}) "
                                  "is written in place after it is saved")
    for node in list(graph.graph.nodes):       # aliases of values are the values
        if node.op == "call_function" and node.target in (aten.alias.default, aten.detach.default):
            node.replace_all_uses_with(node.args[0])
            graph.graph.erase_node(node)
    _fold_views(graph)
    graph.graph.eliminate_dead_code(is_impure_node=_impure_by_op())
    _merge_common_values(graph)
    graph.recompile()
    modes = [n.args[0] for n in gm.graph.nodes if n.target is torch._C._set_grad_enabled]
    conditions = ir.shape_conditions(mode.shape_env, reads) if symbolic else []
    return Joint(graph, len(primals), len(tensor_outs), differentiable, list(grad_inputs), reached_by,
                 inputs, outputs, spec, modes[-1] if modes else None, conditions,
                 frozenset(saved_by_eager), frozenset(outputs_saved))


class _SavesOf(torch.autograd.graph.saved_tensors_hooks):
    """Inside it, autograd's saves for backward made while `interpreter(...)` runs gm's nodes
    are followed to the node whose value each saved tensor is (or is a view of). Eager saves a
    tensor, not a value: one that a later in-place op writes (functionalize.py marks the values
    so held: aliasing.WRITTEN_LATER) its backward finds changed (its version counter moved: an
    error) or, written through `.data`, reads as it is then. Noted: in `primals`, the primals
    (by index) saved so; in `overwritten`, any other tensor so saved (the graph's own values:
    eager's backward would not read what the forward computed); in `saved`, every tensor
    saved (by the tensor that owns its memory). Saves by the op that writes the tensor do not
    count (`h[0].mul_(w)`'s h[0], a batch norm's running statistics): eager's in-place op saves
    what it needs after its write, or a copy; but its save of another argument that shares the
    memory it writes counts (`y.mul_(y)`: `_also_read_by`), so does its save of its own result
    (`y.exp_()` saves y as it wrote it, which a later write changes), and so does the op whose
    eager in-place form saves its result where its out-of-place twin, run here, saves its
    input (`saving_writes`: leaky_relu). placeholders: gm's node of each primal."""

    def __init__(self, leafs: list, placeholders: list, primals: set, overwritten: set, saving_writes: set):
        # (each tensor held: an id is not reused by another while the trace runs)
        self.node_of = {id(t): (node, t) for t, node in zip(leafs, placeholders) if isinstance(t, torch.Tensor)}
        self.primal_of = {node: k for k, node in enumerate(placeholders)}
        self.primals, self.overwritten = primals, overwritten
        self.saving_writes = saving_writes     # (nodes of in-place ops whose eager save is their result)
        self.saved: dict = {}
        self.pending: dict = {}        # id(tensor) -> (tensor, the node that saved it): a value
        self.running = None            # of a node not run yet (its own output, saved as it runs)

        def pack(t):
            base = _memory_owner(t)
            self.saved[id(base)] = base
            if self.running is not None:
                found = self.node_of.get(id(base))
                if found is None:
                    self.pending[id(base)] = (base, self.running)
                else:
                    self._note(found[0], self.running)
            return t
        super().__init__(pack, lambda t: t)

    def _note(self, node, saver) -> None:
        root = node.meta.get(aliasing.WRITTEN_LATER)
        memory = root or node.meta.get(aliasing.VIEW_OF)
        if memory is not None and memory in saver.meta.get(aliasing.WRITES, ()) and node is not saver:
            if not _also_read_by(saver, node, memory):
                return
            root = memory      # (the op's own write moves the version counter its save shares)
        if node in self.primal_of:
            self.primals.add(self.primal_of[node])
        elif root is not None:
            self.overwritten.add(_described(node))

    def interpreter(self, make, gm):
        """make(gm), an FX interpreter, noting the node it runs and the values it makes."""
        interpreter = make(gm)
        run_node = interpreter.run_node

        def noting(node):
            self.running = node
            result = run_node(node)
            if node in self.saving_writes:
                self.overwritten.add(_described(node))     # (eager's in-place op saved it so)
            for value in pytree.tree_leaves(result):
                if isinstance(value, torch.Tensor):
                    self.node_of[id(value)] = (node, value)
                    # (an item of a tuple the node returns is the value of the getitem after it)
                    if id(value) in self.pending and isinstance(result, torch.Tensor):
                        self._note(node, self.pending.pop(id(value))[1])
            return result
        interpreter.run_node = noting
        return interpreter

    def saves(self, t: torch.Tensor) -> bool:
        """Whether autograd saved t, or a view of t's memory, for backward."""
        return id(_memory_owner(t)) in self.saved


def _also_read_by(writer: torch.fx.Node, node: torch.fx.Node, memory: str) -> bool:
    """Whether the functionalized in-place op `writer` is handed node, or a view of the memory
    it writes, as an argument it does not write (`y.mul_(y)`'s other, `y[:2].mul_(y[3:])`'s,
    `y.addcmul_(w, y.detach())`'s): eager saves that argument as it is, and its own write then
    moves the version counter they share, which makes eager's backward raise, or, through
    `.data`, changes what that backward reads. (The written argument is the first, or what
    aliasing.written finds: a batch norm's running statistics.)"""
    locators = aliasing.node_writes(writer) or [("arg", 0)]
    written = [aliasing.locate(loc, writer.args, writer.kwargs) for loc in locators
               if loc[0] != "arg" or loc[1] < len(writer.args)]

    def holds_it(a) -> bool:
        return isinstance(a, torch.fx.Node) and (a is node or a.meta.get(aliasing.VIEW_OF) == memory)
    return sum(map(holds_it, (*writer.args, *writer.kwargs.values()))) > sum(map(holds_it, written))


def _memory_owner(t: torch.Tensor) -> torch.Tensor:
    """The tensor that owns t's memory: t's base if t is a view, else t."""
    return t if t._base is None else t._base


def _described(node: torch.fx.Node) -> str:
    """Node's value, as the user's code made it: `x.mul_(2)` (line 12 of model.py)."""
    source = node.meta.get("source")
    if source is None:
        return node.name
    filename, lineno, text = source
    return f"`{text.strip()}` (line {lineno} of {os.path.basename(filename)})"


def _symbol_reads(primals: list, primal_at: list) -> dict:
    """Where each size symbol is read from the user's graph inputs: {"s0": "arg3.size(0)"}."""
    reads = {}
    for p, i in zip(primals, primal_at):
        for symbol, read in ir.symbol_reads(p, f"arg{i}"):
            reads.setdefault(symbol, read)
    return reads


def _size_function(size: torch.SymInt, reads: dict, num_inputs: int):
    """A function of the user's graph inputs that computes `size` from their sizes."""
    return ir.function_of_inputs(num_inputs, ir.size_as_python(size.node.expr, reads))


def _trace(joint, primals: list, tangents: list, table: dict, lean: bool) -> torch.fx.GraphModule:
    """joint's aten graph: recorded by record.py, or where it cannot (or where nodes carry marks
    make_fx hands on: a checkpointed function's), traced by make_fx."""
    from torch.fx.experimental.proxy_tensor import make_fx
    if lean:
        try:
            return record.record(joint, primals, tangents, table, graph_module)
        except record.NotRecorded as err:
            if isinstance(err.__cause__, _NotAsCaptured):
                raise err.__cause__ from None
            logs.log("aot_graphs", f"the joint graph is traced by make_fx: {str(err).splitlines()[0][:200]}")
    return make_fx(joint, decomposition_table=table, tracing_mode="fake")(primals, tangents)


def _impure_by_op():
    """FX's purity test of a node, asked once per ATen op: for an op it reads the op's schema
    and registrations, the same for each of a model's thousands of nodes."""
    memo: dict = {}

    def impure(node: torch.fx.Node) -> bool:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            return node.is_impure()
        if node.target not in memo:
            # (a random op whose result is not used still advances the generator, as eager's)
            memo[node.target] = node.is_impure() or torch.Tag.nondeterministic_seeded in node.target.tags
        return memo[node.target]
    return impure


class _NotAsCaptured(Exception):
    """The trace's outputs are not as capture recorded them (which are tensors, their shapes,
    dtypes and devices, which carry gradients): trace_joint runs the graph on fake tensors
    first, as without a record."""


def _captured_outputs(gm: torch.fx.GraphModule):
    """(leaves, spec) of gm's output as capture ran it: its example values (eager's tensors,
    with their shapes, layouts and whether they carry gradients), or None where a leaf has
    none, or is a container (its leaves would be flattened further)."""
    output = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if output is None:
        return None
    nodes, spec = pytree.tree_flatten(output.args[0])
    leaves = []
    for leaf in nodes:
        if isinstance(leaf, torch.fx.Node):
            if "example_value" not in leaf.meta:
                return None
            leaf = leaf.meta["example_value"]
        if isinstance(leaf, (tuple, list, dict)) or (isinstance(leaf, torch.Tensor) and type(leaf) is not torch.Tensor
                                                     and not isinstance(leaf, torch.nn.Parameter)):
            return None
        leaves.append(leaf)
    return leaves, spec


def _refuse_seeding(touched: list) -> None:
    if touched:
        # (torch.testing's wrapper_set_seed, which a graph calls whole): the traced graph
        # records aten ops, not that, and would draw other numbers than eager
        raise NotImplementedError(f"the graph sets a random generator's {touched[0]} "
                                  "(torch.manual_seed, set_rng_state)")


def _reached_by_tied(reached: list, primals: list) -> list:
    """reached (per input position, traced with a leaf of its own for each) with the positions
    that pass one tensor (tied weights: GPT-2's embedding and LM head) reaching what any of them
    reaches, as _reached_by finds for one fake tensor."""
    union: dict = {}
    for p, r in zip(primals, reached):
        union.setdefault(id(p), set()).update(r)
    return [set(union[id(p)]) for p in primals]


def _lazy_code():
    """Inside it, make_fx's graph modules write their Python code only when it is asked for
    (a call, `.code`, a log): the stages after it read the graph's nodes, never its code, and
    writing and compiling the code of a 12-layer model's joint graph (some 10,000 nodes) took
    a few tenths of a second of the first call, per graph module made from it."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:                      # (a PyTorch without it writes the code at once)
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


def graph_module(root: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A graph module of `graph` whose code is written when first asked for (_lazy_code)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:
        return torch.fx.GraphModule(root, graph)
    return _LazyGraphModule(root, graph)


def _reached_by(outputs: list, leaves: list) -> list:
    """Per input: the indices of the outputs from whose autograd node a path leads to it (to
    its AccumulateGrad node; or, for an input that is itself computed with autograd, as an
    activation handed to a compiled block is, and as a fake copy of it is, to its grad_fn). One
    tensor passed as several inputs (tied weights: GPT-2's embedding and LM head) is one fake
    tensor, so what reaches it reaches each of them."""
    at: dict = {}
    made_by: dict = {}
    for k, t in enumerate(leaves):
        at.setdefault(id(t), []).append(k)
        if getattr(t, "grad_fn", None) is not None:
            made_by.setdefault(t.grad_fn, []).append(k)
    reached: list = [set() for _ in leaves]
    for i, out in enumerate(outputs):
        hits = list(at.get(id(out), ()))        # an input handed back as it is
        seen, todo = set(), [out.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            hits += made_by.get(node, [])
            leaf = getattr(node, "variable", None)       # an AccumulateGrad node
            if leaf is not None:
                hits += at.get(id(leaf), [])
            todo.extend(fn for fn, _ in node.next_functions)
        for k in hits:
            reached[k].add(i)
    return reached


class _WatchingGenerators(torch.fx.Interpreter):
    """Runs the graph, and adds to `touched` the names of the calls that set a random
    generator's seed or state. Only calls that could are watched (a watch costs every Python
    call under it, the fake tensors' own included): not aten ops, C functions, tensor methods,
    torch.nn.functional's functions or functionalization's, which may draw from a generator but
    never seed one."""

    def __init__(self, gm, touched: list):
        super().__init__(gm)
        self.touched = touched

    def call_function(self, target, args, kwargs):
        if _never_seeds(target):
            return super().call_function(target, args, kwargs)
        return self._watched(super().call_function, target, args, kwargs)

    def call_module(self, target, args, kwargs):
        return self._watched(super().call_module, target, args, kwargs)

    def _watched(self, call, *arguments):
        with _watch_generators() as seen:
            try:
                return call(*arguments)
            finally:
                self.touched += seen


def _never_seeds(target) -> bool:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    if isinstance(target, types.BuiltinFunctionType):     # a C function, or a C object's method
        return not isinstance(getattr(target, "__self__", None), torch.Generator)
    if isinstance(target, types.MethodDescriptorType):      # torch.Tensor.add
        return issubclass(target.__objclass__, torch._C.TensorBase)
    if target in (aliasing.batch_norm_training, aliasing.copy_into, aliasing.overwritten):
        return True                                     # functionalization's: torch ops only
    return getattr(target, "__module__", None) in ("torch.nn.functional", "_operator", "operator")


@contextlib.contextmanager
def _watch_generators():
    """The names of the calls that set a random generator's seed or state while the block
    runs (a Python profile hook sees each call of a C function)."""
    seen: list = []

    def watch(frame, event, arg):
        if event == "c_call" and isinstance(getattr(arg, "__self__", None), torch.Generator) \
                and arg.__name__ in ("manual_seed", "seed", "set_state"):
            seen.append(arg.__name__)
    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


class _AsCompiledCodeComputes(torch.overrides.TorchFunctionMode):
    """Torch functions traced as the compiled code will compute them, where eager's choice of
    kernel would record something else.

    Inductor's layout optimization: a 2-D convolution's input is made channels-last where
    lowering gives it that layout (ir.conv_input_channels_last: oneDNN's fast kernels on a CPU,
    cuDNN's on a GPU), so the traced graph records, as eager would compute them, channels-last
    results for the convolution and everything computed from it (batch norm, ReLU, pooling), in
    the forward and in the backward alike. Lowering stores each value in the layout the graph
    records: without this, the saved values and the backward's, recorded contiguous, are copied
    out of and back into channels-last around every convolution.

    A global average pool (to 1 x 1) is traced as the mean over rows and columns it is: ATen's
    adaptive_avg_pool2d restrides that mean in place where its input is channels-last
    (`as_strided_`), a write, and the backward of the restride writes too, which would cost the
    joint graph a second trace through functionalization.

    An LSTM whose weights need gradients is traced as its cells' ops. PyTorch's decomposition
    of it picks oneDNN's LSTM kernel on a CPU whenever the *input* needs no gradient (an
    embedding's output does not, a model's first layer's input); that kernel keeps the
    workspace its backward reads only when called with grad mode on, and the compiled forward
    runs with it off (inside autograd.Function.forward).

    A product's gradient is eager's (_ProdAsEager): traced, PyTorch's formula always takes the
    products of the other elements, which eager takes only where the input holds a zero.

    A power whose exponent (or base) is a float the graph is generic in (a focal loss's gamma
    that changes each step) is traced with its gradient written out (_PowByNumber,
    _NumberToPower): PyTorch's backward of a power by a number reads the number as a double,
    which would fix its value (a graph per value)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        if func in (torch.prod, torch.Tensor.prod) and isinstance(x, torch.Tensor) and x.requires_grad \
                and x.is_floating_point() and torch.is_grad_enabled() and kwargs.get("dtype") is None:
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            if dim is None or isinstance(dim, int):
                return _ProdAsEager.apply(x, dim, keepdim)
        if func is F.adaptive_avg_pool2d and isinstance(x, torch.Tensor) and x.dim() == 4 \
                and _global(args[1] if len(args) > 1 else kwargs.get("output_size")):
            return x.mean((-2, -1), keepdim=True)
        if func in _POWERS and len(args) == 2 and not kwargs and any(isinstance(a, torch.SymFloat) for a in args):
            base, exponent = reversed(args) if func is torch.Tensor.__rpow__ else args
            if isinstance(base, torch.Tensor) != isinstance(exponent, torch.Tensor):
                return _PowByNumber.apply(base, exponent) if isinstance(base, torch.Tensor) \
                    else _NumberToPower.apply(exponent, base)
        if func is torch.lstm and torch.is_grad_enabled() and torch._C._get_mkldnn_enabled():
            torch._C._set_mkldnn_enabled(False)      # (flags() would also set TF32, and warn)
            try:
                return func(*args, **kwargs)
            finally:
                torch._C._set_mkldnn_enabled(True)
        result = func(*args, **kwargs)
        if func in (torch.conv2d, F.conv2d) and isinstance(x, torch.Tensor) and x.dim() == 4 \
                and ir.conv_input_channels_last(x.device, x.dtype, result.shape):
            result = func(x.contiguous(memory_format=torch.channels_last), *args[1:], **kwargs)
        return result


_POWERS = (torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.Tensor.__rpow__)


class _PowByNumber(torch.autograd.Function):
    """x ** k for a float k the graph is generic in, and its gradient as eager's (pow_backward:
    zeros where k is 0, else k * x ** (k - 1)), the powers PyTorch's own (which picks sqrt or a
    product by k's value)."""

    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return aten.pow.Tensor_Scalar(x, k)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        k = ctx.k
        d = aten.mul.Tensor(aten.pow.Tensor_Scalar(x, k - 1), k)
        zero = aten.eq.Scalar(aten.scalar_tensor.default(k, dtype=torch.float64, device=x.device), 0)
        return aten.where.self(zero, aten.zeros_like.default(grad), aten.mul.Tensor(grad, d)), None


class _NumberToPower(torch.autograd.Function):
    """k ** x for a float k the graph is generic in, and its gradient as eager's
    (pow_backward_exponent: k ** x * log(k), log(k) in double; zeros where k is 0 and x >= 0)."""

    @staticmethod
    def forward(ctx, x, k):
        out = aten.pow.Scalar(k, x)
        ctx.save_for_backward(x, out)
        ctx.k = k
        return out

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        k = aten.scalar_tensor.default(ctx.k, dtype=torch.float64, device=x.device)
        d = aten.mul.Tensor(out, aten.log.default(k))
        zero = aten.logical_and.default(aten.eq.Scalar(k, 0), aten.ge.Scalar(x, 0))
        return aten.mul.Tensor(grad, aten.where.self(zero, aten.zeros_like.default(d), d)), None


class _ProdAsEager(torch.autograd.Function):
    """x.prod(dim) whose gradient is eager's (prod_backward): result / x times the gradient
    where x holds no zero, the products of the other elements where it does (at a NaN or an
    infinity the two differ: NaN against a finite product)."""

    @staticmethod
    def forward(ctx, x, dim, keepdim):
        out = x.prod() if dim is None else x.prod(dim, keepdim)
        ctx.save_for_backward(x, out)
        ctx.dim, ctx.keepdim = dim, keepdim
        return out

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        if x.dim() == 0:
            return grad, None, None
        if ctx.dim is None:
            others = _products_of_the_others(x.reshape(-1), 0).view(x.shape)
        else:
            others = _products_of_the_others(x, ctx.dim)
            if not ctx.keepdim:
                grad, out = grad.unsqueeze(ctx.dim), out.unsqueeze(ctx.dim)
        return torch.where((x == 0).any(), grad * others, grad * (out / x)), None, None


def _products_of_the_others(x, dim):
    """Each element's product of the others along dim, without dividing (PyTorch's
    prod_safe_zeros_backward): products of those before it times products of those after."""
    n = x.shape[dim]
    ones = torch.ones_like(x.narrow(dim, 0, 1))
    before = torch.cat([ones, x.narrow(dim, 0, n - 1)], dim).cumprod(dim)
    after = torch.cat([ones, x.narrow(dim, 1, n - 1).flip(dim)], dim).cumprod(dim).flip(dim)
    return before * after


def _global(output_size) -> bool:
    """An adaptive pool's output size that is 1 x 1."""
    return output_size == 1 or (isinstance(output_size, (tuple, list)) and list(output_size) == [1, 1])


def _fold_views(gm: torch.fx.GraphModule) -> None:
    """Views that the compiled code would otherwise copy out of a graph, folded away. A permute
    of a permute is one permute, and none where they undo each other: a linear layer's
    backward multiplies by W.t().t(), which is W (so the partitioner saves the weight itself,
    not a copy of it), and its weight's gradient is (x.t() @ g).t().t(). A sum that keeps its
    reduced dims only for a view to drop them (a bias's gradient) does not keep them."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.args[0], torch.fx.Node):
            continue
        inner = node.args[0]
        if node.target is aten.permute.default and inner.target is aten.permute.default:
            dims = [inner.args[1][d] for d in node.args[1]]
            if dims == list(range(len(dims))):
                node.replace_all_uses_with(inner.args[0])
            else:
                node.args = (inner.args[0], dims)
        elif node.target is aten.view.default and inner.target is aten.sum.dim_IntList \
                and len(inner.users) == 1 and not inner.kwargs and len(inner.args) == 3 and inner.args[2]:
            x, dims = inner.args[0], inner.args[1]
            shape = x.meta["val"].shape
            if any(isinstance(s, torch.SymInt) for s in shape):
                continue                # (comparing symbolic sizes would add conditions on them)
            kept = ir.wrap_dims(dims, len(shape))
            if list(node.args[1]) == [s for d, s in enumerate(shape) if d not in kept]:
                inner.args = (x, dims, False)
                inner.meta["val"] = node.meta["val"]
                node.replace_all_uses_with(inner)


def _merge_common_values(gm: torch.fx.GraphModule) -> None:
    """One node for each value computed more than once (common subexpressions): the same pure
    op on the same arguments. A model computes some values once per layer: PyTorch's attention
    turns a boolean mask into an additive one (`where(mask, 0, -inf)`) in every call, and each
    copy, read by its layer's attention backward, would be saved for the backward on its own
    (a GPT-2's (8, 1, 512, 512) mask: 8 MB a layer). Random ops draw new numbers each call
    and are never merged; nor are ops that write, or whose results are uninitialized memory;
    nor two outputs: eager's are two tensors (one may carry a gradient and the other not, the
    same expression computed under no_grad and with grad; a write into one is not seen in the
    other)."""
    first: dict = {}
    outputs = {n for n in pytree.tree_leaves(gm.graph.output_node().args) if isinstance(n, torch.fx.Node)}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not _pure(node.target):
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs))
        except TypeError:                       # an argument with no value to compare
            continue
        same = first.setdefault(key, node)
        if same is node or same in outputs and node in outputs:
            continue
        if node in outputs:
            outputs.add(same)
        node.replace_all_uses_with(same)
        gm.graph.erase_node(node)


_UNINITIALIZED = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
                  aten.empty_permuted.default, aten.new_empty.default, aten.new_empty_strided.default}


def _pure(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable \
        and torch.Tag.nondeterministic_seeded not in target.tags and target not in _UNINITIALIZED


def _key(value):
    """An argument as a dictionary key: equal keys, equal arguments. Numbers keep their type
    (add(x, 1) and add(x, 1.0) differ in the result's dtype) and a float its sign and bits
    (0.0 and -0.0 are equal to Python, not to a division)."""
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _key(v)) for k, v in value.items()))
    if isinstance(value, float):
        return (float, value.hex())
    if isinstance(value, (torch.fx.Node, str, torch.dtype, torch.device, torch.layout, torch.memory_format)) \
            or value is None:
        return value
    if isinstance(value, (bool, int)):
        return (type(value), value)
    raise TypeError(f"no key for {type(value).__name__}")


def _writes(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable for n in gm.graph.nodes)
