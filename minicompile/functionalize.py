"""Functionalization: a graph that writes in place and returns views -> a graph of pure values
and an epilogue that makes the writes and the views real, as AOTAutograd does before Inductor.

Takes the backend contract's graph: TorchDynamo's and minicompile's capture both keep the
user's writes (`x[:, 0].mul_(2)`, `x += y`, `torch.mul(a, b, out=w[1])`, `x[i] = v`,
`F.relu(x, inplace=True)`, batch norm's running statistics) and return views of the inputs
(`x.t()`, `x[:4]`) or of one another. Hands lowering a graph in which every node computes a new
value from its inputs, and an `Epilogue` that the compiled graph runs through on every call:

- each input the graph writes gets its final value copied in (`x.copy_(new_x)`), so the caller
  sees every write, through any view, on every call;
- each output that is a view in eager is made as that view again, from its base (the input
  itself, or another output of the graph), by replaying the view ops on it: eager's sizes,
  strides and storage offset, sharing memory as eager's does; an output that *is* an input
  comes back as that very object.

How a write becomes a value: every tensor has a *root*, the tensor that owns its memory (an
input, or the result of a computing op), and a chain of view ops from the root. A write
computes the written tensor's new value, then its root's, back along the chain (one
`scatter_view` per view op); a view of that root read afterwards is made again from the root's
new value. Lowering fuses the new values of whole tensors (`x.add_(y)` is `x + y`, copied into
x at the end) and leaves `scatter_view` to PyTorch.

What cannot be expressed as values raises NotImplementedError with the reason, and the caller
runs the graph on PyTorch's kernels instead (exactly eager): writes that change a tensor's
metadata (`t_`, `resize_`), a written input that shares memory with another input.
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.autograd.graph import increment_version
from torch.multiprocessing.reductions import StorageWeakRef

from . import aliasing, ir


# ---------------------------------------------------------------------------------------
# The run-time half
# ---------------------------------------------------------------------------------------
@dataclass
class Epilogue:
    """What the compiled functional graph's outputs become, on every call. Each leaf of the
    user's output is ("out", k): the graph's k-th output; ("input", i): the i-th input itself;
    ("view", base leaf, replay): a view made from another leaf; ("const", value)."""
    spec: Any                      # the structure of the user's output (a pytree spec)
    leaves: list
    copies: list                   # (input index i, output index k): inputs[i].copy_(outs[k])
    description: list = field(default_factory=list)   # for the logs and the book
    read: frozenset | None = None  # the outputs the user's output is made from (None: any)
    unseen: frozenset = frozenset()   # inputs written under no_grad only: copied so too
    # {input index i: the in-place ops that write it}: its version counter goes up as many
    # times as eager's (autograd's check that a tensor saved for backward is unchanged); none
    # where every write is through `x.data`, which leaves the version as it was
    writes: dict = field(default_factory=dict)

    def __call__(self, compiled: Callable, inputs):
        # (a compiled training graph counts the writes the forward stored straight into an
        # input before it saves that input for the backward, as eager's saves follow its writes)
        versions = [inputs[i]._version for i, _ in self.copies]
        outs = compiled(*inputs)
        into, new, at = [], [], []
        for (i, k), version in zip(self.copies, versions):
            x, value = inputs[i], outs[k]
            # (a kernel may have stored the new value straight into the input: nothing to copy,
            # unless autograd must see the write: a value with a history, into a tensor that
            # takes it on, as eager's write makes it)
            copied = not aliasing.stored_into(value, x) or (value is not x and value.requires_grad and i not in self.unseen)
            if copied and self.writes.get(i, 1) == 0:
                x.data.copy_(value)
                continue
            if copied:
                into.append(x)
                new.append(value)
                at.append(i)
            for _ in range(self.writes.get(i, 1) - copied - (x._version - version)):   # (copy_ counts one)
                increment_version(x)
        if len(into) > 1 and not any(t.requires_grad for t in into + new):
            # one call per device and dtype pair (a launch or a few on a GPU, where each copy_
            # is one): a ResNet's 106 running statistics and 53 counts of batches (a write
            # autograd records, into a tensor that requires grad, is copy_'s own)
            groups: dict = {}
            for x, value in zip(into, new):
                group = groups.setdefault((x.device, x.dtype, value.device, value.dtype), ([], []))
                group[0].append(x)
                group[1].append(value)
            for xs, values in groups.values():
                torch._foreach_copy_(xs, values)
        else:
            for x, value, i in zip(into, new, at):
                if i in self.unseen:
                    with torch.no_grad():        # (as eager's write: a leaf's included)
                        x.copy_(value)
                else:
                    x.copy_(value)
        made: dict = {}
        return pytree.tree_unflatten([self._leaf(leaf, outs, inputs, made) for leaf in self.leaves],
                                     self.spec)

    def _leaf(self, leaf, outs, inputs, made):
        kind = leaf[0]
        if kind == "out":
            return outs[leaf[1]]
        if kind == "input":
            return inputs[leaf[1]]
        if kind == "const":
            return leaf[1]
        if id(leaf) not in made:
            made[id(leaf)] = leaf[2](self._leaf(leaf[1], outs, inputs, made), outs, inputs)
        return made[id(leaf)]


class Replay:
    """View ops run again on another tensor standing for their root (`base`), each in the grad
    mode the frame made it in (`grad`: a view made under no_grad carries no gradient, one made
    with grad does, whatever mode the graph ends in). An argument of a view op is the previous
    tensor of the chain (`alias` maps each argument to the tensor it stands for), or comes from
    the call: an input, or an output of the graph (`sources`)."""

    def __init__(self, chain: list, root: torch.fx.Node, alias: dict, sources: dict, grad: list):
        self.chain, self.root, self.alias, self.sources, self.grad = chain, root, alias, sources, grad

    def __call__(self, base, outs, inputs):
        values = {self.root: base}
        for node, grad in zip(self.chain, self.grad):
            def arg(a):
                a = self.alias.get(a, a)
                return values[a] if a in values else self.sources[a](outs, inputs)
            with torch.set_grad_enabled(grad):
                values[node] = _run(node, torch.fx.node.map_arg(node.args, arg),
                                    torch.fx.node.map_arg(node.kwargs, arg))
        return values[self.chain[-1]]


def _run(node: torch.fx.Node, args, kwargs):
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    return node.target(*args, **kwargs)


def scatter_view(view_fn: Callable) -> Callable:
    """The functional form of a write through a view: a function (base, new_view, *view_args)
    -> the value base has after `view_fn(base, *view_args).copy_(new_view)`, as a new tensor."""
    def scatter(base, new_view, *view_args):
        out = base.clone(memory_format=torch.preserve_format)
        view_fn(out, *view_args).copy_(new_view)
        return out
    scatter.__name__ = scatter.__qualname__ = f"scatter_{view_fn.__name__}"
    return scatter


class ViewFunction:
    """One view op (or a tuple of views and the item taken from it) as a function of its
    tensor base and the op's other node arguments: what `scatter_view` replays. `alias` maps
    each argument to the tensor it stands for."""

    def __init__(self, steps: list, base: torch.fx.Node, alias: dict):
        self.steps, self.base, self.alias = steps, base, alias
        inside = set(steps) | {base}
        self.others = list(dict.fromkeys(alias.get(a, a) for s in steps for a in s.all_input_nodes
                                         if alias.get(a, a) not in inside))
        last = steps[-1].target
        self.__name__ = f"view_{last if isinstance(last, str) else getattr(last, '__name__', 'op')}"

    def __call__(self, base, *others):
        values = dict(zip(self.others, others))
        values[self.base] = base

        def arg(a):
            return values[self.alias.get(a, a)]
        for s in self.steps:
            values[s] = _run(s, torch.fx.node.map_arg(s.args, arg), torch.fx.node.map_arg(s.kwargs, arg))
        return values[self.steps[-1]]


# ---------------------------------------------------------------------------------------
# Facts about the graph's values (from the example values the tracer left in node.meta)
# ---------------------------------------------------------------------------------------
def _example(node):
    if not isinstance(node, torch.fx.Node):
        return node
    return node.meta.get("example_value", node.meta.get("val"))


def _storage(t):
    try:
        return StorageWeakRef(t.untyped_storage())
    except (AttributeError, NotImplementedError, RuntimeError, TypeError):
        return None


def _shares_storage(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    sa = _storage(a)
    return sa is not None and sa == _storage(b)


def _fills_a_mask(x, index, value) -> bool:
    """Is `x[index] = value` a masked fill: index a bool tensor over x's leading dims, value
    one for every place (a number, or a tensor that broadcasts to what one place holds)?"""
    x, index, value = _example(x), _example(index), _example(value)
    if not (isinstance(x, torch.Tensor) and isinstance(index, torch.Tensor) and index.dtype == torch.bool
            and index.dim() <= x.dim() and tuple(index.shape) == tuple(x.shape[:index.dim()])):
        return False
    if isinstance(value, (bool, int, float)):
        return True
    if not isinstance(value, torch.Tensor) or value.dim() > x.dim():
        return False
    place = x.shape[index.dim():]
    lead = value.shape[:max(0, value.dim() - len(place))]
    tail = value.shape[len(lead):]
    return all(d == 1 for d in lead) and \
        all(v == 1 or v == p for v, p in zip(tail, place[len(place) - len(tail):]))


def _keeps_history(node) -> bool:
    """Whether an in-place op leaves the autograd history of the tensor it writes as it was
    (eager's non-differentiable ones do: after `v.logical_not_()` a later use's gradient flows
    on into v's history; `v.gt_(0)` gives v a comparison's, of zero gradient). Asked of
    autograd, on meta tensors: the op run on a tensor with a history."""
    def meta(a):
        ex = _example(a) if isinstance(a, torch.fx.Node) else a
        if not isinstance(ex, torch.Tensor):
            return ex
        return torch.empty_strided(ex.shape, ex.stride(), dtype=ex.dtype, device="meta")
    if not (node.op == "call_method" or node.op == "call_function" and callable(node.target)) or \
            aliasing.written(node.op, node.target, node.args, node.kwargs, _is_tensor_node) != [("arg", 0)]:
        return False
    try:
        args = [meta(a) for a in node.args]
        kwargs = {k: meta(v) for k, v in node.kwargs.items()}
        written = args[0]
        if not isinstance(written, torch.Tensor) or not written.dtype.is_floating_point:
            return False
        with torch.enable_grad():
            args[0] = written.requires_grad_() * 1
            history = args[0].grad_fn
            _run(node, args, kwargs)
        return args[0].grad_fn is history
    except Exception:                  # noqa: BLE001 (sizes that are symbols, an op meta lacks)
        return False


def _is_as_strided(node) -> bool:
    return node.op == "call_method" and node.target == "as_strided" or \
        node.op == "call_function" and node.target in (torch.as_strided, torch.Tensor.as_strided)


def _is_detach(node) -> bool:
    return node.op == "call_method" and node.target == "detach" or \
        node.op == "call_function" and node.target in (torch.detach, torch.ops.aten.detach.default)


def _is_tensor_node(a) -> bool:
    return isinstance(a, torch.fx.Node) and isinstance(_example(a), torch.Tensor)


def _output_leaves(gm):
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return pytree.tree_flatten(out.args[0])


def needs_functionalization(gm: torch.fx.GraphModule) -> bool:
    """Does the graph write anything, or return a tensor that is an input, or shares memory
    with an input or another output? (Else it goes to lowering as it is.)"""
    for node in gm.graph.nodes:
        if node.op in ("call_method", "call_function") and aliasing.written(
                node.op, node.target, node.args, node.kwargs, _is_tensor_node):
            return True
    inputs = [_example(n) for n in gm.graph.nodes if n.op == "placeholder"]
    seen = []
    for o in _output_leaves(gm)[0]:
        ex = _example(o) if isinstance(o, torch.fx.Node) else None
        if not isinstance(ex, torch.Tensor):
            continue
        if o.op == "placeholder" or any(_shares_storage(ex, t) for t in inputs + seen):
            return True
        seen.append(ex)
    return False


# ---------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------
class _Functionalizer:
    """One pass over the graph in order. For every old tensor node: its root and the chain of
    views from it (`root`, `chain`, `parent`); for every root, the new node holding its value
    now (`value`) and how many writes it has had (`version`). `same` maps a call that returns
    what it wrote (`y = x.add_(1)`) to that tensor."""

    def __init__(self, gm: torch.fx.GraphModule, training: bool = False):
        self.gm, self.training = gm, training
        self.graph = torch.fx.Graph()
        self.env: dict = {}            # old node -> new node, for values that are not tensors
        self.root: dict = {}
        self.chain: dict = {}
        self.parent: dict = {}
        self.value: dict = {}
        self.version: dict = {}
        self.made: dict = {}           # old view node -> ((root version, grad mode), new node)
        self.made_with_grad: dict = {}  # old view node -> the grad mode the frame made it in
        self.same: dict = {}
        self.inputs: list = []
        self.grad = torch.is_grad_enabled()       # the grad mode at this point of the graph
        self.seen_writes: set = set()              # roots written with grad mode on
        self.write_counts = collections.Counter()   # root -> the in-place ops writing it
        self.writing: frozenset = frozenset()      # the roots the write being made a value writes
        self.writing_node = None                   # and the node that writes them
        self.history: dict = {}                    # root -> the new nodes that held its value, in turn

    def resolve(self, a):
        while a in self.same:
            a = self.same[a]
        return a

    def current(self, a):
        """The new node holding old node a's value now, after every write so far."""
        if not isinstance(a, torch.fx.Node):
            return a
        a = self.resolve(a)
        if a not in self.root:
            return self.env[a]
        r = self.root[a]
        if not self.chain[a]:
            return self.value[r]
        made = self.made.get(a)
        # (made again where the grad mode changed: a view made under no_grad carries no
        # gradient to the uses after it, where eager's view, made with grad, does)
        if made is None or made[0] != (self.version[r], self.grad):
            if self.version[r] and r.op == "placeholder" and _is_as_strided(a):
                # its offset and strides place it in the input's memory, which the new value (a
                # tensor of the input's shape, laid out afresh) is not
                raise NotImplementedError(f"`{a.format_node()}` views input {r.name} by its memory "
                                          "after a write into it")
            parent, base = self.parent[a], self.current(self.parent[a])
            node = self.graph.node_copy(a, lambda x: base if self.resolve(x) is parent else self.current(x))
            node.meta = dict(a.meta)
            node.meta[aliasing.VIEW_OF] = r.name
            made = self.made[a] = ((self.version[r], self.grad), node)
        return made[1]

    def _new(self, kind, target, args, kwargs=None):
        """A new node, with its example value worked out from its arguments' (lowering reads
        sizes and dtypes there)."""
        node = self.graph.create_node(kind, target, tuple(args), dict(kwargs or {}))
        try:
            ex_args = torch.fx.node.map_arg(node.args, lambda a: a.meta.get("example_value"))
            ex_kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: a.meta.get("example_value"))
            # (TorchDynamo's example values are fake tensors: a Python number among the
            # arguments, a setitem's value, becomes one of their mode's)
            fake_mode = ir.fake_mode_of([ex_args, ex_kwargs])
            with torch.no_grad(), fake_mode if fake_mode is not None else contextlib.nullcontext():
                node.meta["example_value"] = _run(node, ex_args, ex_kwargs)
        except Exception:          # lowering runs the graph itself where a value is missing
            pass
        if self.writing:
            node.meta[aliasing.WRITES] = self.writing
            # (where the user's code wrote it: what error messages about the value quote)
            node.meta.update((k, v) for k, v in self.writing_node.meta.items() if k in ("source", "stack_trace"))
        return node

    def _fresh(self, old, new):
        self.root[old], self.chain[old], self.value[old], self.version[old] = old, [], new, 0
        self.history[old] = [new]

    def run(self):
        out = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                new = self.graph.placeholder(node.name)
                new.meta = dict(node.meta)
                self.inputs.append(node)
                if isinstance(_example(node), torch.Tensor):
                    self._fresh(node, new)
                else:
                    self.env[node] = new
            elif node.op == "get_attr":
                new = self.graph.get_attr(node.target)
                new.meta = dict(node.meta)
                self.env[node] = new
            elif node.op == "output":
                out = node
            else:
                self._call(node)
        return self._outputs(out)

    def _call(self, node):
        if node.target is torch._C._set_grad_enabled:
            self.grad = bool(node.args[0])
        where = aliasing.written(node.op, node.target, node.args, node.kwargs, _is_tensor_node)
        if where:
            if aliasing.writes_metadata(node.op, node.target):
                raise NotImplementedError(f"`{node.format_node()}` changes a tensor's sizes or strides")
            return self._write(node, where)
        base = self._view_base(node)
        if base is not None:
            self.parent[node], self.root[node] = base, self.root[base]
            self.chain[node] = self.chain[base] + [node]
            self.made_with_grad[node] = self.grad
            return
        new = self.graph.node_copy(node, self.current)
        new.meta = dict(node.meta)
        if isinstance(_example(node), torch.Tensor):
            self._fresh(node, new)
        else:
            self.env[node] = new

    def _view_base(self, node):
        """The tensor node is a view of: the argument whose memory its result shares in the
        example (a tuple of views, from split or unbind, is a view; an item of it, too)."""
        if node.op == "call_function" and node.target is operator.getitem and \
                isinstance(_example(node.args[0]), (tuple, list)):
            container = self.resolve(node.args[0])
            if container in self.root:
                return container
        ex = _example(node)
        tensors = [t for t in ex if isinstance(t, torch.Tensor)] if isinstance(ex, (tuple, list)) \
            else [ex] if isinstance(ex, torch.Tensor) else []
        if not tensors or (isinstance(ex, (tuple, list)) and len(tensors) != len(ex)):
            return None
        for a in node.all_input_nodes:
            a = self.resolve(a)
            if a in self.root and _is_tensor_node(a) and \
                    all(_shares_storage(t, _example(a)) for t in tensors):
                return a
        return None

    # -- writes -------------------------------------------------------------------------
    def _write(self, node, where):
        targets = [self.resolve(aliasing.locate(loc, node.args, node.kwargs)) for loc in where]
        for t in targets:
            if t not in self.root or not _is_tensor_node(t):
                raise NotImplementedError(f"`{node.format_node()}` writes into something that "
                                          "is not a tensor of the graph")
        self.writing, self.writing_node = frozenset(self.root[t].name for t in targets), node
        try:
            self._write_values(node, targets, *self._functional(node, where, targets))
        finally:
            self.writing = frozenset()

    def _write_values(self, node, targets, new_values, result):
        for t, v in zip(targets, new_values):
            if not (node.op == "call_function" and node.target in aliasing.UNVERSIONED_WRITES) and \
                    not any(n.meta.get(aliasing.OWN_VERSION_COUNTER) for n in self.chain.get(t, ())):
                self.write_counts[self.root[t]] += 1
            # written under no_grad, through detach() (F.embedding's max_norm renormalizes
            # weight.detach()), or by an op autograd does not differentiate: eager's tensor keeps
            # its history (a later use is differentiated into it), its new value unseen by autograd
            unseen = not self.grad or any(_is_detach(n) for n in self.chain.get(t, ())) or \
                self.training and _keeps_history(node)
            root = self.root[t]
            # (the tensor written keeps its history: the root's, where a view of it is written,
            # though the view, made under no_grad, does not require grad itself)
            hidden = self.training and unseen and getattr(_example(root), "requires_grad", False)
            if not unseen:
                self.seen_writes.add(root)
            before = self.current(root) if hidden else None
            self._assign(t, v)
            if hidden:
                kept = self._new("call_function", aliasing.written_unseen, [before, self.value[root]])
                self.value[root] = self.history[root][-1] = kept
        if result == "same":                    # x.add_(y) returns x
            self.same[node] = targets[0]
        elif isinstance(result, torch.fx.Node) and isinstance(_example(node), torch.Tensor):
            self._fresh(node, result)
        else:                                   # nothing, or a tuple (native_batch_norm's)
            self.env[node] = result

    def _functional(self, node, where, targets):
        """-> ([the new value of each written tensor], what the call returns: "same" (what it
        wrote), a new node, or None)."""
        cur = self.current
        kind, target = node.op, node.target
        args = [torch.fx.node.map_arg(a, cur) for a in node.args]
        kwargs = {k: torch.fx.node.map_arg(v, cur) for k, v in node.kwargs.items()}
        name = aliasing.method_name(kind, target)
        single = where == [("arg", 0)]
        if kind == "call_function" and target in aliasing.AUGMENTED:          # x += y
            return [self._cast(self._new(kind, aliasing.AUGMENTED[target], args), targets[0])], "same"
        if single and name in ("copy_", "fill_", "zero_"):
            value = self._new("call_function", torch.zeros_like, args[:1]) if name == "zero_" else \
                self._new("call_function", aliasing.copy_into, args[:2])
            if getattr(_example(node.args[0]), "requires_grad", False):
                value = self._new("call_function", aliasing.overwritten, [args[0], value])
            return [value], "same"
        if single and name in aliasing.SAME_AS_OUT_OF_PLACE:
            value = self._new(*aliasing.out_of_place(kind, target, name), args, kwargs)
            return [self._cast(value, targets[0])], "same"
        if single and kind == "call_function" and aliasing.inplace_flag(target, node.args, node.kwargs):
            if "inplace" in kwargs:
                kwargs["inplace"] = False
            else:                                        # given by position
                bound = inspect.signature(target).bind(*args, **kwargs)
                bound.arguments["inplace"] = False
                args, kwargs = list(bound.args), dict(bound.kwargs)
            return [self._cast(self._new(kind, target, args, kwargs), targets[0])], "same"
        if where == [("kwarg", "out")]:
            value = self._new(kind, target, args, {k: v for k, v in kwargs.items() if k != "out"})
            ex, want = value.meta.get("example_value"), _example(targets[0])
            if not isinstance(ex, torch.Tensor) or tuple(ex.shape) != tuple(want.shape):
                raise NotImplementedError(f"`{node.format_node()}` resizes its out= tensor")
            return [self._cast(value, targets[0])], "same"
        if kind == "call_function" and target is torch.nn.functional.batch_norm:
            return self._batch_norm(node, where)
        if single and kind == "call_function" and target is operator.setitem and _fills_a_mask(*node.args):
            # x[mask] = v, v the same for every place the mask picks: where(mask, v, x), a
            # pointwise value (no count of the places, which depends on the mask's values)
            spread = (Ellipsis,) + (None,) * (_example(node.args[0]).dim() - _example(node.args[1]).dim())
            mask = self._new("call_function", operator.getitem, [args[1], spread])
            return [self._cast(self._new("call_function", torch.where, [mask, args[2], args[0]]), targets[0])], None
        if self.training and name is not None and name.startswith("_foreach") and name.endswith("_"):
            # (the joint graph's trace loses a foreach write made on a copy: _foreach_mul_'s)
            raise NotImplementedError(f"`{node.format_node()}` writes a list of tensors in a graph "
                                      "compiled for training")
        # any other write: run by PyTorch on copies of what it writes
        run = aliasing.on_a_copy(kind, target, where)
        copies = self._new("call_function", run, args, kwargs)
        values = [self._new("call_function", operator.getitem, [copies, j + 1]) for j in range(len(where))]
        if name is not None and name.endswith("_") and not name.startswith("_foreach"):
            return values, "same"
        if _example(node) is None:
            return values, None
        return values, self._new("call_function", operator.getitem, [copies, 0])

    def _batch_norm(self, node, where):
        names = ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"]
        bound = {"weight": None, "bias": None, "momentum": 0.1, "eps": 1e-5}
        bound.update(zip(names, node.args))
        bound.update(node.kwargs)
        call = self._new("call_function", aliasing.batch_norm_training,
                         [self.current(bound[n]) for n in ("input", "running_mean", "running_var", "weight", "bias",
                                                          "momentum", "eps")])
        out = self._new("call_function", operator.getitem, [call, 0])
        stat = {("arg", 1): 1, ("kwarg", "running_mean"): 1, ("arg", 2): 2, ("kwarg", "running_var"): 2}
        return [self._new("call_function", operator.getitem, [call, stat[loc]]) for loc in where], out

    def _cast(self, value, target):
        """Written in place, a value keeps the dtype of the tensor it is written into."""
        ex, want = value.meta.get("example_value"), _example(target)
        if isinstance(ex, torch.Tensor) and isinstance(want, torch.Tensor) and ex.dtype != want.dtype:
            return self._new("call_method", "to", [value, want.dtype])
        return value

    def _assign(self, t, value):
        """Tensor t holds `value` now: its root gets it, written back through each view op of
        the chain between them (an item of a tuple of views together with the tuple's op)."""
        r, new = self.root[t], value
        while t is not r:
            steps, base = [t], self.parent[t]
            while base is not r and (not isinstance(_example(base), torch.Tensor)       # the tuple of a split
                                     or aliasing.overlaps_itself(_example(base))):
                # an expanded view takes the write with the views after it, at once: copied
                # into on its own, its elements that share memory would be written twice
                steps, base = [base] + steps, self.parent[base]
            fn = ViewFunction(steps, base, self._aliases(steps))
            new = self._new("call_function", scatter_view(fn),
                            [self.current(base), new] + [self.current(o) for o in fn.others])
            t = base
        self.value[r] = new
        self.version[r] += 1
        self.history[r].append(new)

    def _aliases(self, nodes) -> dict:
        """Each argument of `nodes` -> the tensor it stands for (`y = x.add_(1)`: y is x)."""
        return {a: self.resolve(a) for n in nodes for a in n.all_input_nodes}

    # -- outputs ------------------------------------------------------------------------
    def _outputs(self, out):
        leaves, spec = pytree.tree_flatten(out.args[0])
        outs, index = [], {}

        def output(new_node) -> int:
            if id(new_node) not in index:
                index[id(new_node)] = len(outs)
                outs.append(new_node)
            return index[id(new_node)]

        position = {p: i for i, p in enumerate(self.inputs)}
        written = [p for p in self.inputs if self.version.get(p)]
        if written:
            # (each input's storage found once: a ResNet writes the running statistics of
            # its 53 batch norms, among some 300 inputs)
            storages = [_storage(e) if isinstance(e, torch.Tensor) else None for e in map(_example, self.inputs)]
            holders = collections.Counter(s for s in storages if s is not None)
            for p in written:
                s = storages[position[p]]
                if s is not None and holders[s] > 1:
                    raise NotImplementedError(f"input {p.name} is written and shares memory with "
                                              "another input")

        def source(a):
            """Where the epilogue finds a view op's other argument: an input, or an output."""
            if a.op == "placeholder":
                i = position[a]
                return lambda outs_, inputs_: inputs_[i]
            k = output(self.current(a))
            return lambda outs_, inputs_: outs_[k]

        result = []
        for leaf in leaves:
            if not isinstance(leaf, torch.fx.Node):
                result.append(("const", leaf))
                continue
            leaf = self.resolve(leaf)
            if leaf not in self.root:
                result.append(("out", output(self.env[leaf])) if self.env.get(leaf) is not None
                              else ("const", None))
                continue
            r, chain = self.root[leaf], self.chain[leaf]
            base = ("input", position[r]) if r.op == "placeholder" else ("out", output(self.value[r]))
            if not chain:
                result.append(base)
                continue
            alias = self._aliases(chain)
            sources = {alias[a]: source(alias[a]) for v in chain for a in v.all_input_nodes
                       if alias[a] not in chain and alias[a] is not r}
            result.append(("view", base, Replay(chain, r, alias, sources,
                                                [self.made_with_grad[v] for v in chain])))
        final = set(self.value.values())
        for r, values in self.history.items():
            for v in values[:-1]:
                if v not in final:
                    v.meta[aliasing.WRITTEN_LATER] = r.name
        read = frozenset(range(len(outs)))     # the leaves' (a written input's new value may be one)
        copies = [(position[p], output(self.value[p])) for p in written]
        self.graph.output(tuple(outs))
        gm = torch.fx.GraphModule(self.gm, self.graph)
        said = [f"input {p.name} is written: its new value is copied into it after the graph"
                for p in written]
        said += [f"output {j} is a view of {'input ' + self.inputs[l[1][1]].name if l[1][0] == 'input' else 'output ' + str(l[1][1])}"
                 f" ({' -> '.join(str(v.target) if isinstance(v.target, str) else getattr(v.target, '__name__', '?') for v in l[2].chain)})"
                 for j, l in enumerate(result) if l[0] == "view"]
        said += [f"output {j} is input {self.inputs[l[1]].name} itself" for j, l in enumerate(result) if l[0] == "input"]
        unseen = frozenset(position[p] for p in written if p not in self.seen_writes)
        writes = {position[p]: self.write_counts[p] for p in written}
        return gm, Epilogue(spec, result, copies, said, read, unseen, writes)


def functionalize(gm: torch.fx.GraphModule, example_inputs, training: bool = False):
    """-> (a functional GraphModule, the Epilogue that completes it), or (gm, None) when the
    graph writes nothing and returns no view; raises NotImplementedError with the reason where
    a write cannot be made a value. training: the graph's gradients will be taken (a write
    under no_grad into a tensor that requires grad is then marked: aliasing.written_unseen)."""
    _fill_examples(gm, example_inputs)
    if not needs_functionalization(gm):
        return gm, None
    return _Functionalizer(gm, training).run()


def _fill_examples(gm: torch.fx.GraphModule, example_inputs) -> None:
    """Where the tracer left no example values (a graph from torch.fx.symbolic_trace), work
    them out on fake tensors, which keep which inputs share memory and are never written."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("output",)]
    if all("example_value" in n.meta or "val" in n.meta for n in nodes):
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [ir.fake_of(mode, t) if isinstance(t, torch.Tensor) else t for t in example_inputs]

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            n.meta.setdefault("example_value", out)
            return out
    with mode, torch.no_grad():
        Recorder(gm).run(*fakes)
