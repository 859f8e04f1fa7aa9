"""Higher-order operators: `torch.cond(pred, true_fn, false_fn, operands)` as one graph.

Takes: the interpreter at a call of `torch.cond`. Hands on: one `call_function` node whose
target is `torch.ops.higher_order.cond` (what TorchDynamo emits), with both branches traced
into their own FX graphs and attached to the captured GraphModule as submodules
(`cond_true_0`, `cond_false_0`, read by `get_attr` nodes):

    cond_true_0 = self.cond_true_0
    cond_false_0 = self.cond_false_0
    cond = torch.ops.higher_order.cond(gt, cond_true_0, cond_false_0, (x, y))
    getitem = cond[0]

A data-dependent `if` is a graph break; `torch.cond` keeps both ways in the graph and decides at
run time, so the whole function stays one graph. `torch.fx.Interpreter` runs it (the op runs
the chosen subgraph), and a backend may lower it as an extern call.

How a branch is traced: the output graph's `graph`/`tracer` are switched to a fresh graph (a
`SubgraphState` is pushed), the operands become its placeholders, and the branch function is
called through the ordinary interpreter (inlined). A tensor of an enclosing graph that the
branch reads (a closure, a global, a parameter) is *lifted*: it becomes one more placeholder of
the branch and one more operand of the cond node, as Dynamo lifts free variables. Both branches
get the same inputs (operands + the union of what either lifted) and must return the same
structure of tensors with the same shapes and dtypes. A constant predicate picks its branch at
trace time, as Dynamo specializes it.

`trial` traces code aside and undoes it, to learn whether it can be traced without effects
outside it (an autograd.Function's forward and backward, an nn.Module's __init__).

`torch.utils.checkpoint.checkpoint(fn, *args)` is not a subgraph: `fn` is inlined like any call
and the nodes it adds are marked (`node.meta["recompute"]`, and a region per call), for the
partitioner of training graphs (autograd/partition.py) to compute them again in the backward.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List

import torch
import torch.fx
from torch.fx.proxy import GraphAppendingTracer

from .values import (BaseListVariable, ConstantVariable, DictVariable, UserObjectVariable,
                     ListVariable, TensorVariable, TupleVariable)


class SubgraphState:
    """One branch being traced: its graph, tracer, and the placeholders made for inputs."""

    def __init__(self):
        self.graph = torch.fx.Graph()
        self.tracer = GraphAppendingTracer(self.graph)
        self.operand_placeholders: List[torch.fx.Node] = []
        # node of the enclosing graph -> placeholder of this graph (free variables)
        self.lifted: Dict[torch.fx.Node, torch.fx.Node] = {}

    def add_placeholder(self, name: str, example) -> torch.fx.Node:
        last = None
        for n in self.graph.nodes:
            if n.op != "placeholder":
                break
            last = n
        ctx = self.graph.inserting_after(last) if last is not None else self.graph.inserting_before(None)
        with ctx:
            ph = self.graph.placeholder(name)
        ph.meta["example_value"] = example
        return ph


def _graph_at(output, level: int) -> torch.fx.Graph:
    return output.root_graph if level == 0 else output.subgraphs[level - 1].graph


def _lift_node(output, node: torch.fx.Node, level: int) -> torch.fx.Node:
    """`node` (of this graph or an enclosing one) as a node of the graph at `level`."""
    if node.graph is _graph_at(output, level):
        return node
    if level == 0:
        raise AssertionError(f"node {node} belongs to no graph being traced")
    outer = _lift_node(output, node, level - 1)
    st = output.subgraphs[level - 1]
    ph = st.lifted.get(outer)
    if ph is None:
        ph = st.add_placeholder(outer.name, outer.meta.get("example_value"))
        st.lifted[outer] = ph
    return ph


def lift_proxy(output, p):
    if isinstance(p, torch.fx.Proxy) and p.node.graph is not output.graph:
        node = _lift_node(output, p.node, len(output.subgraphs))
        return torch.fx.Proxy(node, output.tracer)
    return p


def _lift_var(output, v: TensorVariable) -> TensorVariable:
    p = lift_proxy(output, v.proxy)
    return v if p is v.proxy else TensorVariable(p, v.example)


def _flatten_result(tx, v, what: str):
    """A branch's result -> (structure, [TensorVariable]). Tensors, tuples and lists of them."""
    if isinstance(v, TensorVariable):
        return ("tensor",), [v]
    if isinstance(v, (TupleVariable, ListVariable)) and type(v) in (TupleVariable, ListVariable):
        structs, flat = [], []
        for item in v.items:
            s, f = _flatten_result(tx, item, what)
            structs.append(s)
            flat += f
        return (v.python_type.__name__, tuple(structs)), flat
    raise tx.unsupported(f"torch.cond {what} returned {v.describe()}",
                         "a cond branch must return a tensor or a tuple/list of tensors",
                         "return tensors only (compute Python values outside torch.cond)")


def _unflatten(struct, items: list):
    if struct[0] == "tensor":
        return items.pop(0)
    children = [_unflatten(s, items) for s in struct[1]]
    return TupleVariable(children) if struct[0] == "tuple" else ListVariable(children)


def _reachable(tx) -> set:
    """ids of the container variables the frames around a branch can see (a branch must not
    mutate them: the mutation would happen whichever branch runs)."""
    seen, todo = set(), []
    t = tx
    while t is not None:
        todo += list(t.locals.values()) + list(t.stack) + list(t.closure_cells.values())
        t = t.parent
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, BaseListVariable):
            todo += v.items
        elif isinstance(v, (DictVariable, UserObjectVariable)):
            todo += list(v.items.values())
    return seen


@contextlib.contextmanager
def trial(tx):
    """Trace something only to learn whether it can be traced, and does nothing outside what
    it makes (an nn.Module's __init__, an autograd.Function's backward), then undo it: its
    changes to containers, its side effects, its graph nodes and the grad mode are put back
    (graph inputs it read stay, unused). Yields `changed_outside()`: whether it changed a
    value the frames around it can see, or state outside the frame."""
    out = tx.output
    visible = _reachable(tx)
    mark, n_effects = len(out.undo_log), len(out.side_effects)
    nodes, grad = set(out.graph.nodes), torch.is_grad_enabled()

    def changed_outside(*own) -> bool:
        return len(out.side_effects) != n_effects or any(
            id(var) in visible and not any(var is v for v in own) for var, _old in out.undo_log[mark:])
    try:
        yield changed_outside
    finally:
        out.rollback(mark)
        del out.side_effects[n_effects:]
        for node in reversed(list(out.graph.nodes)):
            if node not in nodes and node.op != "placeholder":
                out.graph.erase_node(node)
        torch._C._set_grad_enabled(grad)


def trace_branch(tx, fn, operands: List[TensorVariable], what: str):
    """Trace `fn(*operands)` into a fresh graph -> (SubgraphState, structure, [example])."""
    out = tx.output
    outer_visible = _reachable(tx)
    mark, n_effects = len(out.undo_log), len(out.side_effects)
    st = SubgraphState()
    saved = (out.graph, out.tracer)
    out.subgraphs.append(st)
    out.graph, out.tracer = st.graph, st.tracer
    try:
        inner = []
        for v in operands:
            ph = st.add_placeholder(v.node.name, v.example)
            st.operand_placeholders.append(ph)
            inner.append(TensorVariable(torch.fx.Proxy(ph, st.tracer), v.example))
        result = tx.call_function(fn, inner, {})
        struct, flat = _flatten_result(tx, result, what)
        flat = [_lift_var(out, v) for v in flat]
        st.graph.output(tuple(v.node for v in flat))
        st.graph.eliminate_dead_code()
        changed = [var for var, _old in out.undo_log[mark:] if id(var) in outer_visible]
        if changed or len(out.side_effects) != n_effects:
            raise tx.unsupported(f"torch.cond {what} mutates Python state outside the branch",
                                 "only one branch runs, so its side effects cannot be traced",
                                 "return new values from both branches instead")
        return st, struct, [v.example for v in flat]
    finally:
        out.rollback(mark)
        out.subgraphs.pop()
        out.graph, out.tracer = saved


def _meta(t: torch.Tensor):
    return (tuple(t.shape), t.dtype, t.device, t.requires_grad)


def call_cond(tx, args, kwargs):
    """torch.cond(pred, true_fn, false_fn, operands=()) -> one cond node (see module doc)."""
    names = ("pred", "true_fn", "false_fn", "operands")
    if len(args) > len(names) or any(k not in names for k in kwargs):
        raise tx.unsupported("torch.cond with unexpected arguments")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    if not all(n in bound for n in names[:3]):
        raise tx.unsupported("torch.cond without pred, true_fn and false_fn")
    pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
    ops_var = bound.get("operands", TupleVariable([]))
    if not isinstance(ops_var, BaseListVariable):
        raise tx.unsupported(f"torch.cond operands given as {ops_var.describe()}",
                             hint="pass the operands as a tuple of tensors")
    operands = list(ops_var.items)
    if not all(isinstance(v, TensorVariable) for v in operands):
        raise tx.unsupported("torch.cond with non-tensor operands",
                             "the operands of a cond are the inputs of both branch graphs",
                             "pass tensors; use Python values from the enclosing scope directly")
    if isinstance(pred, ConstantVariable):
        # a Python predicate is known now: Dynamo specializes on it and inlines one branch
        return tx.call_function(true_fn if pred.value else false_fn, operands, {})
    if not isinstance(pred, TensorVariable) or pred.example.numel() != 1:
        raise tx.unsupported(f"torch.cond predicate {pred.describe()}",
                             "the predicate must be a Python bool or a one-element tensor")
    out = tx.output
    t_st, t_struct, t_ex = trace_branch(tx, true_fn, operands, "true branch")
    f_st, f_struct, f_ex = trace_branch(tx, false_fn, operands, "false branch")
    if t_struct != f_struct or [_meta(a) for a in t_ex] != [_meta(b) for b in f_ex]:
        raise tx.unsupported(
            "torch.cond branches return different structures, shapes or dtypes",
            f"true branch: {[_meta(a)[:2] for a in t_ex]}, false branch: "
            f"{[_meta(b)[:2] for b in f_ex]}",
            "both branches must return tensors of the same shapes and dtypes")
    # both branch graphs take the same inputs: the operands, then every lifted free variable
    extra = list(t_st.lifted) + [n for n in f_st.lifted if n not in t_st.lifted]
    for st in (t_st, f_st):
        order = list(st.operand_placeholders)
        for n in extra:
            ph = st.lifted.get(n)
            if ph is None:
                ph = st.add_placeholder(n.name, n.meta.get("example_value"))
            order.append(ph)
        for i, ph in enumerate(order):
            if i == 0:
                first = next(iter(st.graph.nodes))
                if first is not ph:
                    first.prepend(ph)
            else:
                order[i - 1].append(ph)
        st.graph.lint()
    # register the branches on the module that the captured GraphModule is built from
    root = out.root_module
    i = 0
    while hasattr(root, f"cond_true_{i}"):
        i += 1
    names = (f"cond_true_{i}", f"cond_false_{i}")
    for name, st in zip(names, (t_st, f_st)):
        root.add_module(name, torch.fx.GraphModule(root, st.graph, class_name=name))
    level = len(out.subgraphs)
    pred_p = lift_proxy(out, pred.proxy)
    operand_nodes = [lift_proxy(out, v.proxy).node for v in operands] + \
                    [_lift_node(out, n, level) for n in extra]
    g = out.graph
    true_node = g.get_attr(names[0])
    false_node = g.get_attr(names[1])
    node = g.call_function(torch.ops.higher_order.cond,
                           (pred_p.node, true_node, false_node, tuple(operand_nodes)))
    # the example value: the branch the example predicate picks (both were run on the
    # real operands while tracing)
    example = tuple(t_ex if bool(pred.example) else f_ex)
    out._set_meta(node, example)
    for n in (true_node, false_node):
        n.meta.update({k: node.meta[k] for k in ("source", "stack_trace") if k in node.meta})
    result = out._wrap_result(torch.fx.Proxy(node, out.tracer), example)
    return _unflatten(t_struct, list(result.items))


# the node meta key that marks what a checkpointed function computed, with the value Dynamo's
# tag_activation_checkpoint gives it; make_fx copies it onto the aten nodes each one becomes
# (torch.fx.proxy's _COPY_META_FIELDS), and the partitioner recomputes those in the backward
# instead of saving them
RECOMPUTE, REGION = "recompute", "ac_graph_id"


def call_checkpoint(tx, args, kwargs):
    """torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=..., **kwargs): the
    function inlined into the graph, its nodes marked `recompute`: the values are eager's, and
    what the checkpoint saves memory by (the backward computes the function's values again
    from its inputs) is the partitioner's to do, as AOTAutograd's does with Dynamo's
    tag_activation_checkpoint. What the graph cannot model as eager runs it breaks on."""
    if not args:
        raise tx.unsupported("torch.utils.checkpoint.checkpoint without a function")
    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in ("use_reentrant", "context_fn", "determinism_check",
                                          "debug", "early_stop", "preserve_rng_state") if k in kwargs}
    if not all(v.is_constant() for k, v in options.items() if k != "context_fn"):
        raise tx.unsupported("checkpoint options that are not constants")
    reentrant = options["use_reentrant"].as_example() if "use_reentrant" in options else None
    if reentrant is None:
        raise tx.unsupported("checkpoint without use_reentrant",
                             "eager warns and picks the reentrant variant, at a graph break",
                             "pass use_reentrant=False (or True) to keep the graph whole")
    if "context_fn" in options or options.get("debug", ConstantVariable(False)).as_example():
        raise tx.unsupported("checkpoint with a context_fn or debug", "it runs as eager's, at a graph break")
    if not options.get("preserve_rng_state", ConstantVariable(True)).as_example():
        # eager's recomputation draws new random numbers for the backward; the graph's one
        # function draws once
        raise tx.unsupported("checkpoint with preserve_rng_state=False", "it runs as eager's, at a graph break")
    function, fn_args = args[0], list(args[1:])
    if reentrant:
        if kwargs:
            raise tx.unsupported("reentrant checkpoint with keyword arguments (eager raises)")
        if torch.is_grad_enabled() and not any(
                isinstance(a, TensorVariable) and a.example.requires_grad for a in fn_args):
            # no input needs gradients: eager's outputs need none either, and the function's
            # parameters get none (with a warning)
            raise tx.unsupported("reentrant checkpoint whose inputs need no gradients",
                                 "its outputs need none in eager, at a graph break")
    out = tx.output
    before = set(out.graph.nodes)
    # each call its own region (a checkpoint inside another is part of the outer one): what
    # leaves a region is saved, as eager saves the inputs of the checkpoint that reads it
    region = 1 + max((n.meta.get(REGION, 0) for n in before), default=0)
    result = tx.call_function(function, fn_args, kwargs)
    for node in out.graph.nodes:
        if node not in before and node.op in ("call_function", "call_method", "call_module"):
            node.meta[RECOMPUTE] = torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE
            node.meta[REGION] = region
    return result


# --------------------------------------------------------------------------------------
# A leaf made in the graph: `t.requires_grad = True` on a tensor the graph computed
# --------------------------------------------------------------------------------------
def leaf_requiring_grad(t: torch.Tensor) -> torch.Tensor:
    """What `t.requires_grad = True` (or `t.requires_grad_()`) makes of a tensor the graph
    computed and autograd does not track (wav2vec2's feature encoder does it to its input's
    view, T5 to a zero position bias): the same memory as a leaf that requires grad, so that
    what is computed from it records gradients. The capture records a call to this; the joint
    trace (autograd/joint.py) runs it, and nothing asks for the leaf's own gradient, which no
    one can read as long as the leaf stays inside the graph (capture checks that)."""
    return t.detach().requires_grad_()
