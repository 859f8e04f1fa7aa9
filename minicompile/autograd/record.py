"""A lean make_fx: the aten ops a function runs on fake tensors, recorded into an FX graph.

Takes a function of lists of fake tensors (joint.py's: the captured graph run forward, then
`torch.autograd.grad`), the fake tensors and a decomposition table; hands back the aten-level
graph module make_fx would make of it, named as make_fx names it (placeholders `primals_1`...,
`tangents_1`..., each node's fake value in `meta["val"]`).

Why not make_fx itself: it traces for every use PyTorch has (symbolic sizes, pre-dispatch
graphs, module stacks, stack traces, proxies for every tensor and number), and that costs about
as much per op again as the fake tensors' own shape computation; a joint trace is most of a
training graph's first call. Here one dispatch mode sits above the fake tensors': each op that
reaches it is decomposed (the table first, then the op's own CompositeImplicitAutograd
decomposition, as make_fx does after autograd) or run on the fake tensors and recorded as one
node whose arguments are the nodes that made its tensor arguments. A tensor no node made (a
constant of the graph) becomes an attribute read by a `get_attr` node.

The fake tensors' mode costs about as much per op again (its cache of results included): an op
it has answered before for arguments of the same layouts (sizes, strides, dtypes, devices) and
the same other arguments is answered here from its first answer (`_MADE`), new tensors made
from the sizes and strides it gave, views as views of the same memory, as the mode makes them.

Each node keeps its value as make_fx does, a detached copy made when it is recorded: an op that
later changes the tensor's sizes in place (`t_`, `as_strided_`) leaves it as it was. What it
does not model, it does not guess: an op that gives a tensor other memory (`resize_`, `set_`),
a result nested deeper than a tuple of tensors, a tensor it cannot place, or an error anywhere in
the trace raises `NotRecorded`, and the caller traces with make_fx instead. The recorder's own
bookkeeping raises nothing inside the dispatch (a failure is noted, and raised after the trace):
PyTorch asks fake tensors for their device from C++ code that cannot pass a Python error on
(the process would stop).
"""
from __future__ import annotations

import operator
import weakref

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from .. import custom_ops

try:                                     # (where PyTorch has it: a detach without a dispatch)
    from torch._subclasses.fake_impls import fast_detach as _fast_detach
except ImportError:                      # pragma: no cover
    _fast_detach = None

aten = torch.ops.aten


class NotRecorded(Exception):
    """The trace met something this recorder does not model; make_fx traces it instead."""


def record(fn, primals: list, tangents: list, table: dict, root_graph):
    """`fn(primals, tangents)`'s aten ops as a graph module (see the module's docstring):
    placeholders for the primals then the tangents, and one output, the list fn returns.
    `root_graph(root, graph)` makes the graph module (joint.graph_module's lazy one)."""
    recorder = _Recorder(table)
    for prefix, tensors in (("primals", primals), ("tangents", tangents)):
        for k, t in enumerate(tensors):
            node = recorder.graph.placeholder(f"{prefix}_{k + 1}")
            node.meta["val"] = t
            recorder.track(t, node)
    mode = recorder.mode = _fake_mode(primals + tangents)
    try:
        with mode, recorder:
            outs = fn(primals, tangents)
        if recorder.failed:
            raise NotRecorded(recorder.failed)
        recorder.graph.output([recorder.node(o) for o in outs])
        # called as make_fx's is: gm(primals, tangents) -> the list fn returned
        recorder.graph._codegen = torch.fx.graph._PyTreeCodeGen(torch.fx.graph._PyTreeInfo(
            ["primals", "tangents"], pytree.tree_structure((primals, tangents)), pytree.tree_structure(outs)))
    except NotRecorded:
        raise
    except Exception as err:             # (make_fx gets to say what is wrong, or to trace it)
        raise NotRecorded(f"{type(err).__name__}: {err}") from err
    return root_graph(recorder.root, recorder.graph)


def _fake_mode(tensors: list):
    modes = {id(t.fake_mode): t.fake_mode for t in tensors if hasattr(t, "fake_mode")}
    if len(modes) != 1:
        raise NotRecorded("the inputs are not fake tensors of one mode")
    return next(iter(modes.values()))


# ops that give a tensor other memory (its storage swapped, or grown): not modelled
_RESIZES = {aten.resize_.default, aten.resize_as_.default, aten.set_.source_Tensor,
            aten.set_.source_Storage, aten.set_.source_Storage_storage_offset, aten.set_.default}


class _Recorder(TorchDispatchMode):
    def __init__(self, table: dict):
        super().__init__()
        self.table = table
        self.graph = torch.fx.Graph()
        self.root = torch.nn.Module()
        # id(tensor) -> (a weak reference to it, the node that made it); weak, as make_fx's:
        # a tensor held here would be copied by autograd where it wraps a new result (an
        # empty_like's), and the copy recorded as one more op
        self.nodes: dict = {}
        self.mode = None
        self.constants = 0
        self.failed = ""

    def node(self, t: torch.Tensor) -> torch.fx.Node:
        entry = self.nodes.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        if isinstance(t, torch._subclasses.FakeTensor) or type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise NotRecorded(f"a {type(t).__name__} no recorded op made")
        name = f"_tensor_constant{self.constants}"        # a real tensor: the graph's constant
        self.constants += 1
        setattr(self.root, name, t)
        node = self.graph.get_attr(name)
        node.meta["val"] = self.mode.from_tensor(t)
        self.track(t, node)
        return node

    def track(self, t: torch.Tensor, node: torch.fx.Node) -> None:
        self.nodes[id(t)] = (weakref.ref(t), node)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "prim":     # (the device of a fake tensor, asked from C++)
            return func(*args, **kwargs)
        decomposition = self.table.get(func)
        if decomposition is not None:
            with self:
                out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if _decomposed_by_autograd(func, args, kwargs):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func is aten.lift_fresh.default:     # (its input is a constant: the graph copies it)
            func = aten.lift_fresh_copy.default
        out = self._run(func, args, kwargs)
        if not self.failed:
            try:
                self._add(func, args, kwargs, out)
            except Exception as err:     # noqa: BLE001 (never raised here: see the docstring)
                self.failed = f"{func}: {type(err).__name__}: {err}"
        return out

    def _run(self, func, args, kwargs):
        """func on the fake tensors. An op that makes new tensors (no view, no write) from fake
        tensors of the same sizes, strides, dtypes and devices and the same other arguments
        makes tensors of the same sizes and strides: the second time, they are made from what
        the fake tensors' mode answered the first time (`_MADE`), without asking it again (its
        own cache costs about as much per op as the rest of the recording)."""
        kind = _kind(func)
        key = self._key(func, args, kwargs) if kind is not None else None
        if key is not None:
            made = _MADE.get(key)
            if made is not None:
                return self._fresh(made) if kind == "new" else self._views(args[0], made)
        out = func(*args, **kwargs)
        if key is not None:
            made = _layouts(out, args[0] if kind == "view" else None)
            if made is not None:
                if len(_MADE) >= _MADE_AT_MOST:      # (a process tracing ever new sizes)
                    _MADE.clear()
                _MADE[key] = made
        return out

    def _key(self, func, args, kwargs):
        """The arguments as a key (a fake tensor by its layout, a number with its type, as
        2 and 2.0 give other dtypes), or None where one is not a fake tensor of this trace's
        mode without a known value, nor a number, a dtype, a device or None."""
        try:
            key = [func, len(args), torch.get_default_dtype()]     # (2 + int tensor: its dtype)
            for a in list(args) + [v for kv in kwargs.items() for v in kv]:
                if isinstance(a, (tuple, list)):
                    key += [self._part(v) for v in a] + [len(a)]
                else:
                    key.append(self._part(a))
            return tuple(key) if any(type(p) is tuple and p[0] == "t" for p in key) else None
        except _NotKeyed:
            return None

    def _part(self, a):
        if isinstance(a, torch.Tensor):
            if type(a) is not FakeTensor or a.fake_mode is not self.mode \
                    or a.constant is not None or a.layout is not torch.strided:
                raise _NotKeyed
            return ("t", tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, a.device, a.is_conj(), a.is_neg())
        if a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                       torch.memory_format)):
            return (type(a), a)
        raise _NotKeyed

    def _fresh(self, made):
        with unset_fake_temporarily():
            metas = [torch.empty_strided(shape, stride, dtype=dtype, device="meta")
                     for shape, stride, _, dtype, _ in made[1]]
        return self._wrapped(metas, made)

    def _views(self, base, made):
        """Views of base's memory, as the fake tensors' mode makes them: its meta kernel run on
        the fake tensor as the meta tensor it holds."""
        with in_kernel_invocation_manager(self.mode):
            metas = [aten.as_strided.default(base, shape, stride, offset) for shape, stride, offset, _, _ in made[1]]
        return self._wrapped(metas, made)

    def _wrapped(self, metas, made):
        tensors = [FakeTensor(self.mode, meta, device) for meta, (*_, device) in zip(metas, made[1])]
        return tensors[0] if made[0] is None else made[0](tensors)

    def _add(self, func, args, kwargs, out) -> None:
        if func in _RESIZES:
            raise NotRecorded(f"{func} gives a tensor other memory")
        if isinstance(out, torch.Tensor):
            outputs = [out]
        elif isinstance(out, (tuple, list)):
            outputs = list(out)
            if any(isinstance(o, (tuple, list)) for o in outputs):
                raise NotRecorded(f"{func}'s result is nested")
        elif out is None and func is custom_ops.check:
            # called for its effect (custom_ops.check: an assert), kept as make_fx keeps it
            self.graph.create_node("call_function", func, self._args(args), self._args(kwargs),
                                   name=func.overloadpacket.__name__)
            return
        else:
            return                       # a number or None: no node (make_fx's would be dead)
        if not any(isinstance(o, torch.Tensor) for o in outputs):
            return
        node = self.graph.create_node("call_function", func, self._args(args), self._args(kwargs),
                                      name=func.overloadpacket.__name__)
        if isinstance(out, torch.Tensor):
            node.meta["val"] = self._snapshot(out)
            self.track(out, node)
            return
        node.meta["val"] = type(out)(self._snapshot(o) if isinstance(o, torch.Tensor) else o for o in outputs)
        for k, (o, val) in enumerate(zip(outputs, node.meta["val"])):
            if isinstance(o, torch.Tensor):
                item = self.graph.create_node("call_function", operator.getitem, (node, k), {})
                item.meta["val"] = val
                self.track(o, item)

    def _args(self, a):
        if isinstance(a, torch.Tensor):
            return self.node(a)
        if isinstance(a, (tuple, list)):
            return type(a)(self._args(v) for v in a)
        if isinstance(a, dict):
            return {k: self._args(v) for k, v in a.items()}
        if isinstance(a, torch.SymInt):
            raise NotRecorded("a symbolic size")
        return a

    def _snapshot(self, t: torch.Tensor) -> torch.Tensor:
        """The value a node keeps (make_fx's): t detached, a tensor of its own, so that the
        trace's own tensor is not held (see `nodes`)."""
        if _fast_detach is not None:
            return _fast_detach(self.mode, t)
        return t.detach()                # pragma: no cover (the fake mode, under this one)


class _NotKeyed(Exception):
    pass


# an op's arguments (_Recorder._key) -> (None for one tensor, or the sequence type of several;
# each tensor's sizes, strides, storage offset, dtype and device)
_MADE: dict = {}
_MADE_AT_MOST = 200_000                 # entries (a few hundred bytes each)
_KINDS: dict = {}                        # op -> _kind's answer


def _kind(func):
    """"new": an aten op that writes none of its arguments and returns new tensors only (no
    number); "view": one that returns views of its first argument only; whose results' sizes
    follow from its arguments' sizes, not from their values (nonzero's do not). Else None."""
    if func in _KINDS:
        return _KINDS[func]
    schema, kind = func._schema, None
    if func.namespace == "aten" and not schema.is_mutable and schema.returns and schema.arguments \
            and all(str(r.type) in ("Tensor", "Tensor[]") for r in schema.returns) \
            and not {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output,
                     torch.Tag.inplace_view} & set(func.tags):
        first = schema.arguments[0].alias_info
        if all(r.alias_info is None for r in schema.returns):
            kind = "new"
        elif first is not None and not first.is_write and all(
                r.alias_info is not None and not r.alias_info.is_write
                and r.alias_info.before_set == first.before_set for r in schema.returns):
            kind = "view"
    _KINDS[func] = kind
    return kind


def _layouts(out, base=None):
    """What _MADE keeps of an op's result, or None where it is not fake tensors alone (of
    base's dtype, where they are views of base)."""
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if not outs or not all(type(o) is FakeTensor and o.constant is None and o.layout is torch.strided
                           and (base is None or o.dtype == base.dtype) for o in outs):
        return None
    return (None if isinstance(out, torch.Tensor) else type(out),
            [(tuple(o.shape), o.stride(), o.storage_offset(), o.dtype, o.device) for o in outs])


_DECOMPOSED: dict = {}                   # (op, device type) -> _decomposed_by_autograd's answer


def _decomposed_by_autograd(func, args, kwargs) -> bool:
    """Whether autograd, had this op passed it, would have run its CompositeImplicitAutograd
    decomposition (an op that reaches a dispatch mode without passing autograd: called by
    another decomposition, or under no_grad): it has one, and no kernel of its own for the
    device of its first tensor argument (make_fx's test)."""
    if func in (aten.size.default, aten.stride.default, aten.storage_offset.default):
        return False
    first = _first_tensor((args, kwargs))
    key = (func, None if first is None else first.device.type)
    answer = _DECOMPOSED.get(key)
    if answer is None:
        name = func.name()
        answer = torch._C._dispatch_has_kernel_for_dispatch_key(
            name, torch._C.DispatchKey.CompositeImplicitAutograd)
        if answer and first is not None:
            backend = torch._C._parse_dispatch_key(torch._C._dispatch_key_for_device(first.device.type))
            answer = backend is None or not torch._C._dispatch_has_kernel_for_dispatch_key(name, backend)
        _DECOMPOSED[key] = answer
    return answer


def _first_tensor(a):
    if isinstance(a, torch.Tensor):
        return a
    if isinstance(a, (tuple, list)):
        for v in a:
            t = _first_tensor(v)
            if t is not None:
                return t
    elif isinstance(a, dict):
        return _first_tensor(list(a.values()))
    return None
