"""The partitioner: a joint graph -> a forward graph and a backward graph, and what the
forward saves for the backward.

Takes joint.py's `Joint`. Every value the backward reads is either saved by the forward (it
stays in memory from the forward to the backward) or recomputed in the backward from values
that are saved. Saving costs memory; recomputing costs time. The rule, as AOTAutograd's
default partitioner has it:

- the outputs of matrix products, convolutions, reductions, random ops and ops lowering leaves
  to PyTorch are expensive: the backward never recomputes them (a reduction reads a whole row;
  a random op would draw other numbers);
- pointwise ops and views are cheap: the backward may recompute them, and does where that
  saves bytes (a ReLU's mask is recomputed from the tensor it was applied to, when that tensor
  is saved anyway);
- but not a pointwise value that an extern kernel of the backward reads (the input of a
  linear layer, which its weight's gradient multiplies): recomputed, it would be computed
  again and stored by a kernel of its own in the backward, work the forward did already;
  saved, it is read as it is. AOTAutograd's partitioner bans that recomputation too. A value
  made from no other (`full`: the zeros a slice's backward scatters into) is the exception:
  the backward makes it again at no cost but its fill, where saved it would be held from the
  forward to the backward (a Llama's rotary embedding, four per layer).

A value that only pointwise ops and reductions read lives inside fused kernels: the forward
would never store it. Saving it costs its bytes twice in the cut (memory the graph would not
otherwise hold, and a store), as in AOTAutograd's partitioner: of a layer norm's normalized
input and the input itself with its two statistics, the input is saved (a block's input is
held anyway) and the backward normalizes again.

Which values to save is then a minimum cut. Each value v of the forward is an edge v_in -> v_out
whose capacity is what saving it costs (`save_cost`: its size in bytes, and a tie-breaker); a
value's users hang off v_out. The source feeds the inputs and the expensive values (they are
available in the forward); the nodes the backward must run (those that read a gradient) drain
into the sink. A cut separates what the forward
computes from what the backward computes, and the edges it cuts are the values that cross:
the saved values, of the fewest bytes in all (a maximum flow: `source_side`). Of a view and
the value it views, equal in bytes, the value is saved (a saved view would be copied out by
the forward).

The backward computes a recomputed value right before its first reader. Where the cut makes
it recompute a chain that its first layer needs whole (a transformer's residual stream, from
the saved outputs of every layer's projections), every layer's value would be made at its start
and held through its matrix products until the backward reached that layer: the chain's values
are then held from the forward instead (the cut is made again with them saved), which costs no
more memory.

What a checkpointed function computed (torch.utils.checkpoint: capture marks its nodes) is
never saved, matrix products included: the cut goes through the function's inputs, and the
backward computes the rest again, which is what checkpointing trades time for. Its results,
read by the forward after it (by the next checkpointed call), are saved instead, as the next
call in eager saves its inputs. Its random ops are saved too: the numbers drawn must be the
forward's.

Hands on a `Partition`: the forward graph (primals -> forward outputs, then saved values) and
the backward graph (saved values, then tangents -> gradients), both aten-level FX graphs.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from .. import custom_ops, ir
from ..capture.higher_order import RECOMPUTE, REGION
from .joint import Joint, graph_module

aten = torch.ops.aten

# cheap ops that are not tagged pointwise: the backward may recompute them. A concatenation
# is one too: lowering makes it a pointwise value (each position reads one of its pieces), so
# recomputed it costs what a copy costs, and saved it costs the bytes of all its pieces (a
# Llama's rotary angles, cat((freqs, freqs)): saving freqs and recomputing the cat and its
# cos and sin holds half the bytes)
_CHEAP = {aten.alias.default, aten.detach.default, aten.clone.default, aten._to_copy.default,
          aten.expand.default, aten.scalar_tensor.default, aten.full.default, aten.zeros.default,
          aten.ones.default, aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
          aten.copy.default, aten.cat.default, aten.stack.default, operator.getitem}


@dataclass
class Partition:
    forward: torch.fx.GraphModule       # primals -> (forward outputs..., saved...)
    backward: torch.fx.GraphModule      # (saved..., tangents...) -> gradients
    saved: list                          # names of the saved values, in order
    saved_bytes: int
    # where each saved value comes from: ("primal", k), the k-th input passed on as it is, or
    # ("computed", j), the forward graph's j-th output after the forward outputs
    saved_from: list = field(default_factory=list)


def nbytes(node: torch.fx.Node) -> int | float:
    """The bytes of the value a node makes; infinite for what cannot be saved (a tuple)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):     # (sizes that are symbols: the example's)
        return ir.hint(val.numel()) * val.element_size()
    if isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)) or val is None:
        return 0
    return math.inf


_RECOMPUTED = (torch.utils.checkpoint.CheckpointPolicy.MUST_RECOMPUTE,
               torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE)


def _checkpointed(node: torch.fx.Node) -> bool:
    """Computed by a checkpointed function (torch.utils.checkpoint), so never saved: the
    backward computes it again, matrix products included; but not a random op, whose numbers
    the forward's must be (eager's checkpoint replays the generator for them)."""
    if node.op != "call_function" or node.meta.get(RECOMPUTE) not in _RECOMPUTED:
        return False
    if node.target is operator.getitem:              # an item of a result: as the result
        return _checkpointed(node.args[0])
    return not _draws_random(node)


def _draws_random(node: torch.fx.Node) -> bool:
    """An op that draws random numbers: tagged so, but for one whose dropout_p is 0
    (attention without dropout), which draws none."""
    t = node.target
    if not (isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags):
        return False
    names = [a.name for a in t._schema.arguments]
    if "dropout_p" not in names:
        return True
    at = names.index("dropout_p")
    dropout = node.kwargs.get("dropout_p", node.args[at] if len(node.args) > at else
                              t._schema.arguments[at].default_value)
    return dropout != 0


def _leaves_its_checkpoint(node: torch.fx.Node, forward: set) -> bool:
    """Whether the forward (the values its outputs are made from) reads the value outside the
    checkpointed call that computed it (its result, read by the next call): saved, as eager's
    next checkpoint saves its input, and not computed again (else the backward would compute
    every call's values again from the first call's input, and hold them all)."""
    region = node.meta.get(REGION)
    return any(user.op == "output" or user in forward and (
        user.meta.get(RECOMPUTE) not in _RECOMPUTED or user.meta.get(REGION) != region) for user in node.users)


def recomputable(node: torch.fx.Node) -> bool:
    """Cheap enough for the backward to compute again: pointwise ops, views, getitem; a
    constant (the backward reads it where it is kept)."""
    if node.op == "get_attr":
        return True
    if node.op != "call_function":
        return False
    t = node.target
    if t in _CHEAP or _size_arithmetic(node):
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in t.tags:
        return False
    return torch.Tag.pointwise in t.tags or t.is_view


def _size_arithmetic(node: torch.fx.Node) -> bool:
    """Arithmetic on sizes the graph is generic in (dynamic shapes: a batch norm's n / (n - 1)),
    which the backward computes again from the sizes it is handed, rather than be handed a float."""
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)) and (
        getattr(node.target, "__module__", None) in ("_operator", "math")
        or node.target in (torch.sym_float, torch._sym_sqrt))


# reductions read their input where they compute it (fused into their kernel): what they read
# needs no buffer of its own
_REDUCTIONS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default, aten.amax.default,
               aten.amin.default, aten.var.correction, aten.var_mean.correction, aten.prod.default,
               aten.prod.dim_int}


def _fuses_its_reads(node: torch.fx.Node) -> bool:
    """A reduction, or max pooling's backward where its indices come from saved offsets
    (joint.py records that only where lowering makes the backward a gather of them)."""
    return node.target in _REDUCTIONS or (
        node.target is aten.max_pool2d_with_indices_backward.default and len(node.args) > 7
        and getattr(node.args[7], "target", None) is custom_ops.max_pool2d_offsets_to_indices)


def _extern(node: torch.fx.Node) -> bool:
    """An op that is neither pointwise, a view nor a reduction (a matrix product, a
    convolution's backward): an extern kernel, which reads its inputs from memory."""
    return node.op == "call_function" and not recomputable(node) and not _fuses_its_reads(node)


def is_view(node: torch.fx.Node) -> bool:
    """A view of another value (an item of split's pieces is one too)."""
    return node.op == "call_function" and (node.target is operator.getitem or (
        isinstance(node.target, torch._ops.OpOverload) and node.target.is_view))


def _readers(node: torch.fx.Node) -> list:
    """The ops that read the value, directly or through views (the views themselves not)."""
    found, todo = [], list(node.users)
    while todo:
        user = todo.pop()
        if is_view(user):
            todo.extend(user.users)
        else:
            found.append(user)
    return found


def read_by_backward_extern(node: torch.fx.Node, backward: set) -> bool:
    """Whether an op of the backward that is neither pointwise nor a reduction (a matrix
    product, a convolution's backward: an extern kernel) reads the node's value, directly or
    through views."""
    return any(user in backward and _extern(user) for user in _readers(node))


def save_cost(node: torch.fx.Node) -> int:
    """What saving a value costs the cut: its bytes, plus a little, so that of equal sizes
    fewer values are saved, and rather a value the forward computes anyway than one it would
    compute only to save it (a GELU's derivative; a view, which the compiled forward would
    write out as a copy: of a weight and its transpose, the weight is saved)."""
    extra = 1 if not recomputable(node) else 3 if is_view(node) else 2
    if recomputable(node) and _fused_into_readers(node):
        # read by pointwise work and reductions alone, the value lives inside fused kernels
        # and is never stored: saving it takes memory the graph would not otherwise hold, and
        # a store. It counts double (as in AOTAutograd's partitioner), so that of a layer
        # norm's normalized input and the input itself (held by the caller, or saved anyway)
        # with its two statistics, the input is saved, the normalization redone in the backward
        return 2 * nbytes(node) + extra
    return nbytes(node) + extra


def _fused_into_readers(node: torch.fx.Node) -> bool:
    """Whether every op that reads the value (through views) is pointwise or a reduction: ops
    whose kernels compute it where they read it, so that it needs no buffer of its own."""
    return all(user.op == "call_function" and (recomputable(user) or _fuses_its_reads(user))
               for user in _readers(node))


def partition(joint: Joint, overwritten=frozenset()) -> Partition:
    """overwritten: the primals (by index) that get new values after the forward, which the
    backward may read as they are then (an input written through `.data`, as eager's backward
    reads it where eager saved the input itself), so nothing is computed again from them."""
    graph = joint.graph.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    primals, tangents = placeholders[:joint.num_primals], placeholders[joint.num_primals:]
    outputs = list(next(n for n in graph.nodes if n.op == "output").args[0])
    fwd_outs, grads = outputs[:joint.num_outputs], outputs[joint.num_outputs:]

    reads_tangent = _descendants(tangents)
    needed_by_bwd = _ancestors([g for g in grads if isinstance(g, torch.fx.Node)])
    # what the backward computes again from saved values comes right before it is first read:
    # at the top, a value of every layer would be held through the whole backward
    recomputable_here = needed_by_bwd - reads_tangent
    # what is computed from an input that gets a new value is computed in the forward, from
    # its value then (eager saved such a value: the tanh of it, not the input)
    held: set = {user for k in overwritten for user in _readers(primals[k])} - reads_tangent
    # what a checkpointed call returns to the forward after it is saved (_leaves_its_checkpoint)
    checkpointed = [n for n in needed_by_bwd if _checkpointed(n)]
    forward = _ancestors([o for o in fwd_outs if isinstance(o, torch.fx.Node)]) if checkpointed else set()
    leaving = {n for n in checkpointed if _leaves_its_checkpoint(n, forward)}
    for _ in range(3):
        saved = _min_cut(graph, needed_by_bwd, reads_tangent, grads, held | leaving)
        order = _placed(joint.graph, saved + tangents, grads, late=recomputable_here)
        longer = {n for n in _held_across_externs(order, reads_tangent) - held - leaving if not _checkpointed(n)}
        if not longer:
            break
        held |= longer

    # the forward computes its outputs and the saved values; a saved primal is passed on as is
    computed = [s for s in saved if s.op != "placeholder"]
    saved_from = [("primal", primals.index(s)) if s.op == "placeholder" else ("computed", computed.index(s))
                  for s in saved]
    # what the forward computes only to save it (a layer norm's normalized input, which its
    # weight's gradient reads) is computed as early as it can be, beside the work it comes from
    # (the same kernel, where it walks the same rows), not after the forward's last output
    fwd_nodes = [o for o in fwd_outs if isinstance(o, torch.fx.Node)]
    only_saved = _ancestors(computed) - _ancestors(fwd_nodes)
    # a check (custom_ops.check: an assert on a tensor's values) is read by nothing: the
    # forward runs it all the same
    checks = [n for n in graph.nodes if n.op == "call_function" and n not in reads_tangent and (
        n.target is custom_ops.check or not n.users and _draws_random(n))]
    forward = _subgraph(joint.graph, primals, fwd_outs + computed,
                        _placed(joint.graph, primals, fwd_outs + computed + checks, early=only_saved))
    backward = _subgraph(joint.graph, saved + tangents, grads, order)
    _freeing_first(backward.graph)
    return Partition(forward, backward, [s.name for s in saved],
                     sum(int(nbytes(s)) for s in saved), saved_from)


def _min_cut(graph: torch.fx.Graph, needed_by_bwd: set, reads_tangent: set, grads: list, held: set) -> list:
    """The values to save, in graph order: the minimum cut of the module docstring's network.
    held: values the backward must not compute again (they count as available in the forward)."""
    flow: dict = {}         # (vertex, vertex) -> capacity
    for node in graph.nodes:
        if node.op == "output" or node not in needed_by_bwd:
            continue
        if node in reads_tangent:               # backward work: must run in the backward
            flow[node.name + "_in", "sink"] = math.inf
            continue
        checkpointed = _checkpointed(node) and node not in held
        if node.op == "placeholder" or node in held or not (checkpointed or recomputable(node)) \
                or (not checkpointed and not is_view(node) and node.all_input_nodes
                    and read_by_backward_extern(node, reads_tangent)):
            # available in the forward (an input, or too costly to run again)
            flow["source", node.name + "_in"] = math.inf
        flow[node.name + "_in", node.name + "_out"] = math.inf if checkpointed else save_cost(node)
        for user in node.users:
            flow[node.name + "_out", user.name + "_in"] = math.inf
    for g in grads:
        if isinstance(g, torch.fx.Node) and g not in reads_tangent:
            # a gradient that reads no tangent (angle's of a real input: zeros like it) is
            # still the backward's to hand on: saved, or recomputed from what is saved
            flow[g.name + "_out", "sink"] = math.inf
    reachable = source_side(flow, "source", "sink")
    vertices = {v for edge in flow for v in edge}
    by_name = {n.name: n for n in graph.nodes}
    saved = [by_name[v[:-3]] for v in vertices if v.endswith("_in") and v in reachable
             and v[:-3] + "_out" in vertices and v[:-3] + "_out" not in reachable]
    order = {n: i for i, n in enumerate(graph.nodes)}
    return sorted(saved, key=order.get)


def _held_across_externs(order: list, reads_tangent: set) -> set:
    """The chains of values the backward (nodes in `order`) computes again and holds while
    extern ops (matrix products) run: a value held so, read by another value it computes
    again that is held so too. A transformer's residual stream, recomputed from the saved
    outputs of every layer's projections, is such a chain, which the backward's first layer
    needs whole: every layer's sum would be made at the backward's start and held until it
    reaches that layer (as much memory as saving them, and the work again). A value held
    across a product or two within its layer (a SiLU's sigmoid) is not a chain. Values made
    from no other (a `full`) are not counted."""
    position = {n: i for i, n in enumerate(order)}
    externs_before, count = [], 0
    for n in order:
        externs_before.append(count)
        if _extern(n):
            count += 1
    externs_before.append(count)
    held = {}
    for n in order:
        if n in reads_tangent or n.op != "call_function" or is_view(n) or not n.all_input_nodes:
            continue
        readers = [r for r in _readers(n) if r in position]
        if readers and externs_before[max(position[r] for r in readers)] > externs_before[position[n] + 1]:
            held[n] = readers
    return {n for n, readers in held.items() if any(r in held for r in readers)}


def _freeing_first(graph: torch.fx.Graph) -> None:
    """Each extern op of the backward (a matrix product) that is the last reader of more bytes
    than it makes runs as soon as its inputs are ready. A linear layer's backward makes the
    gradient of its input, then its weight's, which is the last to read the layer's saved
    input: in that order the input's gradient is made while the saved input is still held.
    Weight's first, the saved input's memory is free for the input's gradient (Inductor, too,
    reorders its backward for peak memory)."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    kept = set(output.all_input_nodes)
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    for node in list(nodes):
        if not _extern(node) or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            continue                # (a random op keeps its place in the draws)
        # the views it reads move with it (a weight's gradient reads the transposed gradient)
        views = [v for a in node.all_input_nodes for v in _view_chain(a)]
        # (after everything they read but one another: a view's sizes too, symbolic ones
        # computed in the backward)
        freed, after = 0, max((order[a] for n in [node, *views] for a in n.all_input_nodes if a not in views),
                              default=-1)
        for base in {_base(a) for a in node.all_input_nodes}:
            after = max(after, order[base])
            readers = _readers(base)
            if base in kept or not readers or max(order[r] for r in readers) != order[node]:
                continue                        # read later too (or handed on): not freed here
            freed += nbytes(base)
            after = max([after] + [order[r] for r in readers if r is not node])
        if freed > nbytes(node) and after + 1 < order[node]:
            anchor = nodes[after]
            for v in sorted(views, key=order.get):
                if order[v] > after:
                    anchor.append(v)
                    anchor = v
            anchor.append(node)
            nodes = list(graph.nodes)
            order = {n: i for i, n in enumerate(nodes)}


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The value a view (of a view...) views; a value is its own."""
    chain = _view_chain(node)
    return chain[-1].args[0] if chain else node


def _view_chain(node: torch.fx.Node) -> list:
    """The views from a value to `node` (none when node is no view), the value excluded."""
    chain = []
    while is_view(node) and isinstance(node.args[0], torch.fx.Node):
        chain.append(node)
        node = node.args[0]
    return chain


# --------------------------------------------------------------------------- the minimum cut

def source_side(capacity: dict, source, sink) -> set:
    """The vertices on the source's side of a minimum cut of the network `capacity`
    ({(u, v): capacity}): after a maximum flow, those that no longer reach the sink through
    edges with capacity to spare (of equal cuts, the one that computes the most in the
    forward, as networkx's minimum_cut gives). The network falls apart into parts that only
    the source and the sink join (a layer's pointwise work between its products), and each
    part's flow is found on its own (Dinic's algorithm: shortest augmenting paths, a phase at
    a time)."""
    parent: dict = {}

    def root(v):
        while parent.setdefault(v, v) != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v
    for u, v in capacity:
        if u != source and v != sink:
            parent[root(u)] = root(v)
    parts: dict = {}
    for (u, v), c in capacity.items():
        parts.setdefault(root(v if u == source else u), []).append((u, v, c))
    reached = {source}
    for edges in parts.values():
        reached |= _reached_after_max_flow(edges, source, sink)
    return reached


def _reached_after_max_flow(edges: list, source, sink) -> set:
    index: dict = {}
    adjacent: list = []                 # vertex -> its edges (and their reverses), by number
    head, spare = [], []                # edge -> where it goes, how much more it can carry
    for u, v, c in edges:
        a, b = (index.setdefault(x, len(index)) for x in (u, v))
        adjacent.extend([] for _ in range(len(index) - len(adjacent)))
        adjacent[a].append(len(head))
        head.append(b)
        spare.append(c)
        adjacent[b].append(len(head))   # the reverse edge (number ^ 1): flow sent back
        head.append(a)
        spare.append(0)
    s, t = index.get(source), index.get(sink)
    if s is not None and t is not None:
        while True:
            level = _levels(s, adjacent, head, spare)
            if level[t] < 0:
                break
            _blocking_flow(s, t, adjacent, head, spare, level)
    # of the minimum cuts, the one nearest the sink: every vertex that can no longer reach it
    reaching = [False] * len(adjacent)
    if t is not None:
        reaching[t], todo = True, [t]
        for v in todo:
            for e in adjacent[v]:          # e leaves v; e ^ 1 comes into v from head[e]
                if spare[e ^ 1] > 0 and not reaching[head[e]]:
                    reaching[head[e]] = True
                    todo.append(head[e])
    return {name for name, v in index.items() if not reaching[v]}


def _levels(s: int, adjacent, head, spare) -> list:
    """Each vertex's distance from s through edges with spare capacity (-1: unreached)."""
    level = [-1] * len(adjacent)
    level[s], todo = 0, [s]
    for u in todo:
        for e in adjacent[u]:
            if spare[e] > 0 and level[head[e]] < 0:
                level[head[e]] = level[u] + 1
                todo.append(head[e])
    return level


def _blocking_flow(s: int, t: int, adjacent, head, spare, level) -> None:
    """Augment along shortest paths from s to t (each edge one level further) until none is
    left: a depth-first walk, each vertex's edges tried once (`tried`)."""
    tried = [0] * len(adjacent)
    path: list = []                    # the edges from s to u
    u = s
    while True:
        if u == t:
            amount = min(spare[e] for e in path)
            if amount == math.inf:
                raise AssertionError("partition: a path of unbounded capacity joins the forward and the backward")
            for e in path:
                spare[e] -= amount
                spare[e ^ 1] += amount
            del path[next(i for i, e in enumerate(path) if spare[e] == 0):]
            u = head[path[-1]] if path else s
            continue
        edges = adjacent[u]
        while tried[u] < len(edges):
            e = edges[tried[u]]
            if spare[e] > 0 and level[head[e]] == level[u] + 1:
                break
            tried[u] += 1
        else:                           # a dead end: back one edge, and past it
            if not path:
                return
            e = path.pop()
            u = head[e ^ 1]
            tried[u] += 1
            continue
        path.append(e)
        u = head[e]


def _descendants(nodes) -> set:
    return _closure(nodes, lambda n: n.users)


def _ancestors(nodes) -> set:
    return _closure(nodes, lambda n: n.all_input_nodes)


def _closure(nodes, step) -> set:
    """The nodes and every node reached from them by `step` (users, or inputs)."""
    seen, todo = set(), list(nodes)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(step(n))
    return seen


def _subgraph(gm: torch.fx.GraphModule, inputs: list, outputs: list, nodes: list) -> torch.fx.GraphModule:
    """A graph of `nodes` (of gm, in that order: `_placed`'s), which compute `outputs` from
    `inputs` (which become the placeholders), with their meta (the fake values lowering reads)."""
    new = torch.fx.Graph()
    env: dict = {}
    for n in inputs:
        env[n] = new.placeholder(n.name)
        env[n].meta = dict(n.meta)
    for n in nodes:
        env[n] = new.node_copy(n, lambda a: env[a])
    new.output([env[o] if isinstance(o, torch.fx.Node) else o for o in outputs])
    return graph_module(gm, new)


def _placed(gm: torch.fx.GraphModule, inputs: list, outputs: list, early=frozenset(), late=frozenset()) -> list:
    """The nodes of gm that compute `outputs` from `inputs`, in gm's order except that those
    in `early` come right after their last input and those in `late` right before their first
    reader."""
    needed, todo = set(), [o for o in outputs if isinstance(o, torch.fx.Node)]
    stop = set(inputs)
    while todo:
        n = todo.pop()
        if n in needed:
            continue
        needed.add(n)
        if n not in stop:
            if n.op == "placeholder":
                raise AssertionError(f"partition: {n.name} is needed but not an input")
            todo.extend(n.all_input_nodes)
    order: list = []
    for n in gm.graph.nodes:
        if n in needed and n not in stop and n not in late:
            after = [order.index(a) for a in n.all_input_nodes if a in order] if n in early else None
            order.insert(max(after) + 1 if after else len(order) if after is None else 0, n)
    placed, result = set(inputs), []
    for n in order + [o for o in outputs if isinstance(o, torch.fx.Node)]:
        result += _late_inputs(n, late, placed)
        if n not in placed:
            placed.add(n)
            result.append(n)
    return result


def _late_inputs(node: torch.fx.Node, late, placed: set) -> list:
    """The nodes of `late` that `node` reads, directly or through others of them, not placed
    yet: inputs first (a walk without recursion, as a chain of recomputed ops may be long).
    Marks them placed."""
    found, stack = [], [(node, iter(node.all_input_nodes))]
    while stack:
        current, inputs = stack[-1]
        child = next((a for a in inputs if a in late and a not in placed), None)
        if child is None:
            stack.pop()
            if current is not node:
                found.append(current)
        else:
            placed.add(child)
            stack.append((child, iter(child.all_input_nodes)))
    return found
