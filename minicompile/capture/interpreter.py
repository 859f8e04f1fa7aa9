"""The symbolic bytecode interpreter: one call of a Python function -> one FX graph.

Takes: a function (or bound method), the real arguments of one call. Hands on: a `Capture`
(the FX GraphModule, its example inputs, `get_inputs`, `build_output`, the generated guard).

How it works (the same scheme as TorchDynamo's InstructionTranslator):
- `InstructionTranslator` walks the code object's instructions with a value stack and a dict
  of locals holding `VariableTracker`s instead of Python objects. One handler per opcode, each
  registered (bytecode.handles) for the Python versions whose semantics it models.
- Tensors are `TensorVariable`s: an fx.Proxy in the graph being built plus the real value
  computed by running the op on the real example inputs as we go (Dynamo runs fake tensors).
- Calls: torch / operator functions and tensor methods become graph nodes; user Python
  functions and nn.Module.forward are inlined in a child translator (their frames are pushed
  on the same graph); anything else raises `Unsupported` naming the callable and source line.
- `OutputGraph` owns the graph, the graph inputs (placeholders, named after their Source) and
  the guards: every value read from outside the trace is wrapped once (`wrap`), and wrapping
  records the check that value needs.

Control flow on Python values and shapes is followed (loops unrolled, instruction budget
bounded). In the root frame, an instruction that cannot be traced raises `GraphBreak` (the
graph rolled back to before it, including anything an inlined call added); frame.py turns it
into a graph break with a resume point, `trace_segment` traces from any resume offset.
"""
from __future__ import annotations

import builtins
import dis
import inspect
import operator
import re
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx
from torch.fx.proxy import GraphAppendingTracer

from .breaks import GraphBreak, Unsupported, source_line
from .bytecode import (BINARY_OP_SYMBOLS, Instruction, check_python_version, current_version,
                       decode, dispatch_table, handles)
from .. import ir, logs
from .guards import ArgBinding, GuardBuilder, bind_arguments, dense_order, frame_target
from .sources import AttrSource, ItemSource, LocalSource, RootSource, Source, module_member_source
from .values import (NULL, BaseListVariable, BoundMethodVariable, BuiltinVariable,
                     ConstantMethodVariable, ConstantVariable, DictVariable, ListVariable,
                     NamedTupleVariable, NNModuleVariable, NullVariable, PythonModuleVariable,
                     SliceVariable, TensorMethodVariable, TensorVariable, TorchFunctionVariable,
                     TupleVariable, TypeVariable, UserFunctionVariable, VariableTracker,
                     is_constant_value, IteratorVariable, CellVariable, NestedFunctionVariable,
                     GradModeVariable, WithExitVariable, SymIntVariable, example_of, sym_leaves)

MAX_INLINE_DEPTH = 32

BINARY_OPS: Dict[str, Callable] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
    "@=": operator.imatmul, "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
    "<<=": operator.ilshift, ">>=": operator.irshift,
}
COMPARE_OPS: Dict[str, Callable] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, ">=": operator.ge,
}
INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv,
                     operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul,
                     operator.iand, operator.ior, operator.ixor, operator.ilshift,
                     operator.irshift, operator.setitem}

# Tensor attributes that are metadata: read as Python constants (valid because every input's
# dtype/device/sizes/strides/requires_grad is guarded; a dynamic size read this way is
# specialized again, see OutputGraph.specialize_sizes).
TENSOR_CONSTANT_ATTRS = {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda",
                         "layout", "is_sparse", "is_quantized", "is_meta", "is_leaf",
                         "is_mkldnn", "is_nested", "itemsize"}
# Tensor attributes that are tensors: a call_function getattr node, as TorchDynamo emits.
TENSOR_TENSOR_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}
# Tensor methods / torch functions whose non-tensor result depends only on metadata.
METADATA_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "stride",
                    "is_contiguous", "element_size", "is_floating_point", "is_complex",
                    "get_device", "storage_offset", "type", "__len__", "is_signed"}
# Integer arithmetic kept symbolic on dynamic sizes (anything else specializes them)
SIZE_ARITHMETIC = {"+": operator.add, "+=": operator.add, "-": operator.sub, "-=": operator.sub,
                   "*": operator.mul, "*=": operator.mul, "//": operator.floordiv,
                   "//=": operator.floordiv}
# Metadata reads that reveal a size: with dynamic shapes they specialize it (see specialize_sizes)
SIZE_READS = {"size", "numel", "nelement", "stride", "__len__", "storage_offset"}
METADATA_FUNCTIONS = {torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel,
                      len, isinstance}

_TORCH_MODULE_PREFIXES = ("torch", "_operator", "operator", "math")


def _is_torch_callable(v) -> bool:
    if isinstance(v, type):
        return False
    mod = getattr(v, "__module__", None) or ""
    if isinstance(v, (types.BuiltinFunctionType, types.FunctionType, torch._ops.OpOverloadPacket,
                      torch._ops.OpOverload)):
        return mod.split(".")[0] in _TORCH_MODULE_PREFIXES
    return False


def _is_internal_module_name(name: str) -> bool:
    """Globals of torch's own modules are not guarded (as TorchDynamo trusts torch itself)."""
    return name.split(".")[0] in ("torch", "math", "operator", "_operator", "builtins")


# ----------------------------------------------------------------------------------------
# OutputGraph: the graph under construction, its inputs and guards
# ----------------------------------------------------------------------------------------
class OutputGraph:
    def __init__(self, root_func: types.FunctionType):
        self.graph = torch.fx.Graph()
        self.tracer = GraphAppendingTracer(self.graph)
        # `graph`/`tracer` are where nodes go now: the root graph, or the body of a
        # higher-order op (a torch.cond branch) being traced; graph inputs always go to the root
        self.root_graph, self.root_tracer = self.graph, self.tracer
        self.subgraphs: List[Any] = []        # higher_order.SubgraphState, innermost last
        self.root_module = torch.nn.Module()  # holds the subgraphs (get_attr targets)
        self.guards = GuardBuilder()
        self.input_sources: List[Source] = []
        self.input_examples: List[torch.Tensor] = []
        self._by_source: Dict[str, VariableTracker] = {}
        self._last_placeholder: Optional[torch.fx.Node] = None
        self._roots: Dict[int, RootSource] = {}
        self.input_storages = set()
        # the captured frame's globals: read as `G` (the called function's own) by the guard
        self.root_globals = root_func.__globals__
        self.tx: Optional["InstructionTranslator"] = None     # the frame running now
        # in-place changes to containers made in the trace: (variable, old items), so that
        # a graph break inside an inlined call can roll the trace back to the call site
        self.undo_log: List[Tuple[VariableTracker, Any]] = []
        # objects from outside the frame changed by the trace (global lists, attributes):
        # the changes are made on the real objects after the graph runs
        self.side_effects: List[VariableTracker] = []
        # inline user functions and modules (False in a frame run eagerly: every user call
        # is then made for real, and the callee compiled on its own, as Dynamo does)
        self.inline_user_calls = True
        # dynamic shapes: (source expression, tensor) -> the dims to make dynamic (set by the
        # caller: dynamic=True, automatic dynamic, mark_dynamic); None: every shape is static
        self.dynamic_policy: Optional[Callable] = None
        self.breaks_allowed = False          # root-frame Unsupported -> GraphBreak
        self.instruction_budget = 200_000     # unrolled loops: a bound, not a hang

    def record_mutation(self, var: VariableTracker):
        if isinstance(var, (DictVariable, UserObjectVariable)):
            self.undo_log.append((var, dict(var.items)))
        elif isinstance(var, IteratorVariable):
            self.undo_log.append((var, var.index))
        else:
            self.undo_log.append((var, list(var.items)))

    def rollback(self, mark: int):
        while len(self.undo_log) > mark:
            var, old = self.undo_log.pop()
            if isinstance(var, IteratorVariable):
                var.index = old
            else:
                var.items = old

    # -- roots: objects the guard holds directly --------------------------------------
    def root_source(self, obj, hint: str) -> RootSource:
        if id(obj) not in self._roots:
            label = re.sub(r"[^A-Za-z0-9]+", "_", hint)
            if label in self.guards.namespace:
                label = f"{label}_{len(self._roots)}"
            self.guards.add_root(label, obj)
            self._roots[id(obj)] = RootSource(label)
        return self._roots[id(obj)]

    # -- facts about modules the trace relied on (modules are not guarded by identity) ---
    def members(self, mv: NNModuleVariable, kind: str = "_modules") -> dict:
        """A container module's members (`_modules` or `_parameters`), with a guard on their
        names when the trace relies on them (iterating, len(), indexing)."""
        members = getattr(mv.module, kind)
        if mv.source is not None:
            self.guards.dict_keys(AttrSource(mv.source, kind), members)
        return members

    def same_module(self, a: NNModuleVariable, b: NNModuleVariable) -> bool:
        """`a is b` of two modules, guarded (as a relation between their sources)."""
        same = a.module is b.module
        if a.source is not None and b.source is not None and a.source != b.source:
            self.guards.same_object(a.source, b.source, same)
        elif (a.source is None) != (b.source is None):
            raise self.unsupported("comparing a module from the frame's inputs with one made "
                                   "in the trace")
        return same

    # -- graph inputs -------------------------------------------------------------------
    def add_input(self, value: torch.Tensor, source: Source) -> TensorVariable:
        if self._last_placeholder is None:
            ctx = self.root_graph.inserting_before(None)    # placeholders go first
        else:
            ctx = self.root_graph.inserting_after(self._last_placeholder)
        with ctx:
            node = self.root_graph.placeholder(source.name())
        node.meta["example_value"] = value
        node.meta["source_expr"] = source.expr()
        # the dims this input's graph is generic in; shared with its guard, and emptied if
        # the trace reads the size (the trace then depends on its value)
        dynamic = set(self.dynamic_policy(source.expr(), value)) if self.dynamic_policy else set()
        dynamic = {d for d in dynamic if value.size(d) >= 2}       # 0 and 1 are specialized
        if dynamic and dense_order(value) is None:
            dynamic = set()          # strides not a function of the sizes: static (see guards)
        node.meta["dynamic_dims"] = dynamic
        self._last_placeholder = node
        self.input_sources.append(source)
        self.input_examples.append(value)
        try:
            self.input_storages.add(value.untyped_storage().data_ptr())
        except Exception:
            pass
        self.guards.tensor(source, value, dynamic)
        return TensorVariable(torch.fx.Proxy(node, self.root_tracer), value, source)

    def add_number_input(self, value, source: Source) -> "SymIntVariable":
        """An int or float whose value changed between compiles (automatic dynamic), or any
        with dynamic=True: a graph input the graph is generic in, as TorchDynamo makes such
        ints SymInt inputs and such floats tensor inputs. (An int used as a size: the
        backend's guard adds that it is >= 2.)"""
        ctx = (self.root_graph.inserting_before(None) if self._last_placeholder is None
               else self.root_graph.inserting_after(self._last_placeholder))
        with ctx:
            node = self.root_graph.placeholder(source.name())
        node.meta["example_value"] = value
        node.meta["source_expr"] = source.expr()
        node.meta["dynamic_dims"] = {0}           # emptied if the trace needs its value
        self._last_placeholder = node
        self.input_sources.append(source)
        self.input_examples.append(value)
        self.guards.dynamic_number(source, value, node.meta["dynamic_dims"])
        proxy = torch.fx.Proxy(node, self.root_tracer)
        return SymIntVariable(proxy, value, [types.SimpleNamespace(node=node)], self.specialize_sizes)

    def specialize_sizes(self, tensors: List["TensorVariable"], why: str) -> None:
        """The trace read a size (`x.shape`, `x.size(0)`, `len(x)`, `x.numel()`) as a Python
        int, so the graph depends on its value: the dimensions it may reveal become static
        again (guarded by value). A graph input's read specializes that input's dims; a read
        of any other tensor, whose sizes may derive from any input's, specializes them all.
        (TorchDynamo instead traces the size as a symbolic int; minicompile keeps sizes in
        Python static, which is correct, and costs a recompile per size of those dims.)"""
        nodes = [n for n in self.root_graph.nodes if n.op == "placeholder" and n.meta.get("dynamic_dims")]
        if not nodes:
            return
        inputs = {id(n) for n in nodes}
        if tensors and all(id(t.node) in inputs for t in tensors):
            nodes = [t.node for t in tensors]
        for n in nodes:
            if n.meta["dynamic_dims"]:
                logs.log("dynamic", f"{n.meta['source_expr']}: dims {sorted(n.meta['dynamic_dims'])} "
                                    f"made static: {why}")
                n.meta["dynamic_dims"].clear()

    # -- sizes read by the traced code, with dynamic shapes ------------------------------
    def has_dynamic_inputs(self) -> bool:
        return any(n.meta.get("dynamic_dims") for n in self.root_graph.nodes if n.op == "placeholder")

    def size_of(self, t: TensorVariable, d: int) -> VariableTracker:
        """x.size(d) as the traced code sees it: a constant when that size cannot change
        between calls of this entry, else a SymIntVariable (a `size` node in the graph)."""
        d = d % max(t.example.dim(), 1)
        if not self._is_dynamic_dim(t, d):
            return ConstantVariable(t.example.size(d))
        proxy = self.tracer.create_proxy("call_method", "size", (t.as_proxy(), d), {})
        self._set_meta(proxy.node, t.example.size(d))
        return SymIntVariable(proxy, t.example.size(d), [t], self.specialize_sizes)

    def shape_of(self, t: TensorVariable) -> VariableTracker:
        return TupleVariable([self.size_of(t, d) for d in range(t.example.dim())])

    def _is_dynamic_dim(self, t: TensorVariable, d: int) -> bool:
        """Whether dim d of t's size depends on a dynamic input dim: for an input, its own
        mark; for any other tensor, its size in a run of the graph so far on fake tensors
        (torch's shape propagation, the same the backend does) is a symbol, not an int."""
        node = t.node
        if node.op == "placeholder":
            return d in node.meta.get("dynamic_dims", ())
        if not self.has_dynamic_inputs():
            return False
        try:
            fake = self._fake_value(node)
        except Exception:           # the graph so far does not run on fake tensors: assume so
            return True
        return isinstance(fake.shape[d], torch.SymInt)

    def _fake_value(self, node: torch.fx.Node):
        """The node's value as a fake tensor with symbolic sizes for the dynamic input dims,
        computed (and remembered) from its inputs'."""
        if getattr(self, "_fake", None) is None:
            self._fake = (ir.fake_mode(), {})
        mode, values = self._fake
        if node in values:
            return values[node]
        if node.op == "placeholder":
            value = ir.symbolic_fake(mode, node.meta["example_value"], node.meta.get("dynamic_dims", ()),
                                     node.name)
        elif node.op == "get_attr":
            value = getattr(self.root_module, node.target)
        else:
            args = torch.fx.node.map_arg((node.args, node.kwargs), self._fake_value)
            with ir.running_symbolically(mode):
                if node.op == "call_method":
                    value = getattr(args[0][0], node.target)(*args[0][1:], **args[1])
                elif node.op == "call_module":
                    value = self.root_module.get_submodule(node.target)(*args[0], **args[1])
                else:
                    value = node.target(*args[0], **args[1])
        values[node] = value
        return value

    # -- VariableBuilder: a real value read from `source` -> a VariableTracker + guards -----
    def wrap(self, value, source: Optional[Source]) -> VariableTracker:
        if source is not None:
            key = source.expr()
            if key in self._by_source:
                return self._by_source[key]
            var = self._wrap(value, source)
            self._by_source[key] = var
            return var
        return self._wrap(value, None)

    def _wrap(self, value, source: Optional[Source]) -> VariableTracker:
        g = self.guards
        if isinstance(value, torch.Tensor):
            if source is None:
                raise self.unsupported(f"a tensor constant of unknown origin ({type(value).__name__})",
                                       "only tensors reachable from the arguments, globals or "
                                       "modules can become graph inputs")
            return self.add_input(value, source)
        if self.dynamic_policy and _may_be_dynamic_number(value, source) \
                and self.dynamic_policy(source.expr(), value):
            return self.add_number_input(value, source)
        if is_constant_value(value):
            if source is not None:
                g.constant(source, value)
            return ConstantVariable(value, source)
        if isinstance(value, torch.nn.Module):
            if source is not None:
                g.module(source, value)
            return NNModuleVariable(value, source)
        if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
            if source is not None:
                g.sequence(source, value)
            items = [self.wrap(v, ItemSource(source, i) if source else None)
                     for i, v in enumerate(value)]
            return (TupleVariable if isinstance(value, tuple) else ListVariable)(items, source)
        if type(value) is dict:
            if not all(is_constant_value(k) for k in value):
                raise self.unsupported("a dict with non-constant keys")
            if source is not None:
                g.dict_keys(source, value)
            return DictVariable({k: self.wrap(v, ItemSource(source, k) if source else None)
                                 for k, v in value.items()}, source)
        from .frame import ListIter, NULL_VALUE
        if value is NULL_VALUE:
            return NULL
        if type(value) is ListIter:
            if source is None:
                raise self.unsupported("an iterator of unknown origin")
            g.type_check(source, ListIter)
            items_src = AttrSource(source, "items")
            g.sequence(items_src, value.items)
            return IteratorVariable([self.wrap(v, ItemSource(items_src, i))
                                     for i, v in enumerate(value.items)])
        known = (isinstance(value, (types.ModuleType, types.FunctionType, types.MethodType, type))
                 or _is_torch_callable(value) or (_hashable(value) and value in _BUILTIN_HANDLERS))
        if source is not None and not known:
            g.type_check(source, type(value))     # its attributes are guarded one by one
            return UserObjectVariable(value, source)
        # callables and modules: guarded by identity when read from a guardable place
        if source is not None:
            g.identity(source, value, type(value).__name__)
        if value in _BUILTIN_HANDLERS if _hashable(value) else False:
            return BuiltinVariable(value, source)
        if isinstance(value, types.ModuleType):
            return PythonModuleVariable(value, source)
        if _is_torch_callable(value):
            return TorchFunctionVariable(value, source)
        if isinstance(value, types.FunctionType):
            return UserFunctionVariable(value, source)
        if isinstance(value, types.MethodType):
            self_var = self.wrap(value.__self__, AttrSource(source, "__self__") if source else None)
            return BoundMethodVariable(value.__func__, self_var, source)
        if isinstance(value, type):
            return TypeVariable(value, source)
        raise self.unsupported(f"a value of type {type(value).__qualname__}",
                               "only tensors, Python constants, tuples/lists/dicts, functions "
                               "and nn.Modules can be traced so far")

    def unsupported(self, reason, explanation="", hint="") -> Unsupported:
        stack = self.tx.user_stack() if self.tx is not None else []
        return Unsupported(reason, explanation, hint, stack)

    # -- graph nodes --------------------------------------------------------------------
    def call(self, kind: str, target, args: Sequence[VariableTracker],
             kwargs: Dict[str, VariableTracker]) -> VariableTracker:
        """Run `target` on the example values and, if tensors are involved, record a node."""
        has_tensor = _contains_tensor(list(args) + list(kwargs.values()))
        name = target if kind == "call_method" else getattr(target, "__name__", str(target))
        if args and isinstance(args[0], TensorVariable) and self.has_dynamic_inputs():
            sized = self._dynamic_size_call(kind, target, args, kwargs)
            if sized is not None:
                return sized
        ex_args = [example_of(a) for a in args]
        ex_kwargs = {k: example_of(v) for k, v in kwargs.items()}
        for i in _written_in_place(target, ex_args, ex_kwargs):
            # run on a copy: tracing must not change the caller's tensors (the compiled code
            # makes the change, once, when it runs)
            ex_args[i] = ex_args[i].clone()
        if has_tensor:
            self._check_mutation(kind, target, args, kwargs)
        try:
            if kind == "call_method":
                result = getattr(ex_args[0], target)(*ex_args[1:], **ex_kwargs)
            else:
                result = target(*ex_args, **ex_kwargs)
        except Unsupported:
            raise
        except Exception as e:
            raise self.unsupported(f"{name}() raised {type(e).__name__}: {e}",
                                   "running the operation on the example inputs failed; "
                                   "eager execution will raise the same error") from e
        if not _contains_tensor_value(result):
            for sym in sym_leaves(list(args) + list(kwargs.values())):
                sym.as_example()                 # a Python result of a size: specialized
            if name in SIZE_READS or target in (torch.numel, len):
                self.specialize_sizes([a for a in args if isinstance(a, TensorVariable)],
                                             f"the trace read {name}()")
            if has_tensor and not (name in METADATA_METHODS or target in METADATA_FUNCTIONS):
                raise self.unsupported(
                    f"data-dependent operation {name}() (returns {type(result).__name__})",
                    "its Python result depends on tensor values, which a graph cannot bake in",
                    "keep the value as a tensor, or move this out of the compiled region")
            if not is_constant_value(result):
                raise self.unsupported(f"{name}() returned a {type(result).__name__}")
            return ConstantVariable(result)
        proxy = self.tracer.create_proxy(kind, target, self.lift(tuple(a.as_proxy() for a in args)),
                                         self.lift({k: v.as_proxy() for k, v in kwargs.items()}))
        self._set_meta(proxy.node, result)
        return self._wrap_result(proxy, result)

    def _dynamic_size_call(self, kind, target, args, kwargs):
        """x.size(), x.size(d), len(x), x.numel() with dynamic shapes: symbolic where the size
        may change; None for anything else."""
        t = args[0]
        rest = [a for a in args[1:]] + list(kwargs.values())
        if not all(isinstance(a, ConstantVariable) and not isinstance(a, SymIntVariable) for a in rest):
            return None
        if kind == "call_method" and target == "size" and len(rest) <= 1:
            return self.shape_of(t) if not rest else self.size_of(t, rest[0].value)
        if (kind == "call_function" and target is len and not rest) and t.example.dim():
            return self.size_of(t, 0)
        if (kind == "call_method" and target in ("numel", "nelement") or target is torch.numel) and not rest:
            dims = [self.size_of(t, d) for d in range(t.example.dim())]
            if not any(isinstance(v, SymIntVariable) for v in dims):
                return ConstantVariable(t.example.numel())
            proxy = self.tracer.create_proxy("call_method", "numel", (t.as_proxy(),), {})
            self._set_meta(proxy.node, t.example.numel())
            return SymIntVariable(proxy, t.example.numel(), [t], self.specialize_sizes)
        return None

    def sym_arith(self, op, a: VariableTracker, b: VariableTracker) -> VariableTracker:
        """Integer arithmetic on sizes, at least one of them symbolic: a graph node."""
        example = op(example_of(a), example_of(b))
        proxy = self.tracer.create_proxy("call_function", op, (a.as_proxy(), b.as_proxy()), {})
        self._set_meta(proxy.node, example)
        deps = [t for v in (a, b) if isinstance(v, SymIntVariable) for t in v.deps]
        return SymIntVariable(proxy, example, deps, self.specialize_sizes)

    def lift(self, proxies):
        """Proxies (nested in tuples/lists/dicts) of an enclosing graph -> inputs of the
        subgraph being traced (free variables of a torch.cond branch become extra operands,
        as Dynamo lifts them)."""
        if not self.subgraphs:
            return proxies
        from .higher_order import lift_proxy
        return torch.fx.node.map_aggregate(proxies, lambda p: lift_proxy(self, p))

    def _set_meta(self, node: torch.fx.Node, example):
        node.meta["example_value"] = example
        if self.tx is not None:
            fn, lineno, text = self.tx.location()
            node.meta["source"] = (fn, lineno, text)
            node.meta["function"] = self.tx.code.co_name
            node.meta["stack_trace"] = "".join(
                f'  File "{f}", line {l}, in {n}\n    {t}\n' for f, l, t, n in self.tx.full_stack())

    def _wrap_result(self, proxy: torch.fx.Proxy, result) -> VariableTracker:
        if isinstance(result, torch.Tensor):
            return TensorVariable(proxy, result)
        if isinstance(result, (tuple, list)):
            items = []
            for i, r in enumerate(result):
                if isinstance(r, torch.Tensor):
                    p = self.tracer.create_proxy("call_function", operator.getitem, (proxy, i), {})
                    self._set_meta(p.node, r)
                    items.append(TensorVariable(p, r))
                elif is_constant_value(r):
                    items.append(ConstantVariable(r))
                else:
                    raise self.unsupported(f"an operation returned a {type(r).__name__} inside a "
                                           f"{type(result).__name__}")
            if isinstance(result, list):
                return ListVariable(items)
            if type(result) is tuple:
                return TupleVariable(items)
            return NamedTupleVariable(items, type(result))
        raise self.unsupported(f"an operation returned a {type(result).__name__}")

    def _check_mutation(self, kind, target, args, kwargs):
        """In-place ops on graph inputs are not modelled yet (the example values would be
        mutated during tracing, and the backend would need to write them back)."""
        inplace = (target in INPLACE_OPERATORS or "out" in kwargs or
                   (kind == "call_method" and target.endswith("_") and not target.endswith("__")))
        if not inplace:
            return
        mutated = [a for a in list(args[:1]) + ([kwargs["out"]] if "out" in kwargs else [])
                   if isinstance(a, TensorVariable)]
        for t in mutated:
            try:
                ptr = t.example.untyped_storage().data_ptr()
            except Exception:
                ptr = None
            if ptr in self.input_storages:
                name = target if isinstance(target, str) else getattr(target, "__name__", target)
                raise self.unsupported(f"in-place operation {name} on a graph input (or a view of one)",
                                       "mutating inputs is not modelled yet",
                                       "use the out-of-place version")


def _written_in_place(target, args, kwargs) -> list:
    """Positions of the tensor arguments a torch function writes in place (not an in-place
    method, which _check_mutation handles): batch norm's running statistics in training."""
    import torch.nn.functional as F
    if target in (F.batch_norm, torch.batch_norm) and len(args) >= 3:
        training = kwargs.get("training", args[5] if len(args) > 5 else False)
        if training is True:
            return [i for i in (1, 2) if isinstance(args[i], torch.Tensor)]
    return []


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def _contains_tensor(vars_) -> bool:
    for v in vars_:
        if isinstance(v, TensorVariable):
            return True
        if isinstance(v, BaseListVariable) and _contains_tensor(v.items):
            return True
        if isinstance(v, DictVariable) and _contains_tensor(list(v.items.values())):
            return True
        if isinstance(v, SliceVariable) and _contains_tensor(v.parts):
            return True
    return False


def _contains_tensor_value(v) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, (tuple, list)):
        return any(_contains_tensor_value(x) for x in v)
    return False


# ----------------------------------------------------------------------------------------
# Builtins, modelled case by case
# ----------------------------------------------------------------------------------------
def _builtin_len(tx, args, kwargs):
    (x,) = args
    if isinstance(x, BaseListVariable):
        return ConstantVariable(len(x.items))
    if isinstance(x, DictVariable):
        return ConstantVariable(len(x.items))
    if isinstance(x, TensorVariable):
        return ConstantVariable(len(x.example))
    if isinstance(x, ConstantVariable):
        return ConstantVariable(len(x.value))
    if isinstance(x, NNModuleVariable):
        mod = x.module
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
            return ConstantVariable(len(tx.output.members(x)))
        if isinstance(mod, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            return ConstantVariable(len(tx.output.members(x, "_parameters")))
    raise tx.unsupported(f"len() of {x.describe()}")


def _builtin_isinstance(tx, args, kwargs):
    obj, cls = args
    if not isinstance(cls, (TypeVariable, ConstantVariable, TupleVariable, BuiltinVariable)):
        raise tx.unsupported(f"isinstance() with {cls.describe()}")
    return ConstantVariable(isinstance(obj.as_example(), cls.as_example()))


def _builtin_getattr(tx, args, kwargs):
    if len(args) == 2 and isinstance(args[1], ConstantVariable):
        return tx.load_attr(args[0], args[1].value)
    if len(args) == 3 and isinstance(args[1], ConstantVariable):
        if not _attribute_present(tx, args[0], args[1].value):
            return args[2]
        return tx.load_attr(args[0], args[1].value)
    raise tx.unsupported("getattr() with a non-constant name")


def _attribute_present(tx, obj: VariableTracker, name: str) -> bool:
    """hasattr(obj, name) of a value read from outside the frame, guarded (another instance
    of the class may have it or not); other values answer from the trace."""
    source = getattr(obj, "source", None)
    if name in getattr(obj, "overrides", ()):       # set in the trace
        return True
    if isinstance(obj, (NNModuleVariable, UserObjectVariable, PythonModuleVariable)) \
            and source is not None:
        present = hasattr(obj.as_example(), name)
        tx.output.guards.has_attr(source, name, present)
        return present
    try:
        tx.load_attr(obj, name)
        return True
    except AttributeError:
        return False
    except Unsupported:
        return hasattr(obj.as_example(), name)


def _builtin_container(kind):
    def impl(tx, args, kwargs):
        if not args:
            return kind([])
        (x,) = args
        if isinstance(x, BaseListVariable):
            return kind(list(x.items))
        if isinstance(x, ConstantVariable) and isinstance(x.value, (tuple, list, torch.Size, range)):
            return kind([ConstantVariable(v) for v in x.value])
        if isinstance(x, DictVariable):
            return kind([ConstantVariable(k) for k in x.items])
        if isinstance(x, TensorVariable):
            return kind(tx.unpack_tensor(x, len(x.example)))
        return kind(tx.iterate(x))
    return impl


def _builtin_const(fn):
    def impl(tx, args, kwargs):
        if all(a.is_constant() for a in args) and all(v.is_constant() for v in kwargs.values()):
            return ConstantVariable(fn(*[a.as_example() for a in args],
                                       **{k: v.as_example() for k, v in kwargs.items()}))
        if fn in (abs, pow) and _contains_tensor(list(args)):
            return tx.output.call("call_function", fn, args, kwargs)
        raise tx.unsupported(f"builtin {fn.__name__}() on non-constant arguments",
                             hint="it would need the tensor's values")
    return impl


def _builtin_print(tx, args, kwargs):
    raise tx.unsupported("call to builtin print()", "printing is a side effect the graph "
                         "cannot hold", "remove the print, or print outside the compiled code")


def _builtin_iter(kind):
    def impl(tx, args, kwargs):
        if kind == "enumerate":
            start = args[1].as_example() if len(args) > 1 else kwargs.get("start", ConstantVariable(0)).as_example()
            return IteratorVariable([TupleVariable([ConstantVariable(start + i), v])
                                     for i, v in enumerate(tx.iterate(args[0]))])
        if kind == "zip":
            if kwargs.get("strict", ConstantVariable(False)).as_example():
                lists = [tx.iterate(a) for a in args]
                if len({len(l) for l in lists}) > 1:
                    raise tx.unsupported("zip(strict=True) of unequal lengths")
            lists = [tx.iterate(a) for a in args]
            return IteratorVariable([TupleVariable(list(t)) for t in zip(*lists)])
        if kind == "map":
            fn, seqs = args[0], [tx.iterate(a) for a in args[1:]]
            return IteratorVariable([tx.call_function(fn, list(t), {}) for t in zip(*seqs)])
        if kind == "filter":
            fn, items = args[0], tx.iterate(args[1])
            keep = []
            for it in items:
                r = it if isinstance(fn, ConstantVariable) and fn.value is None else tx.call_function(fn, [it], {})
                if tx.truth(r, "filter"):
                    keep.append(it)
            return IteratorVariable(keep)
        if kind == "reversed":
            return IteratorVariable(list(reversed(tx.iterate(args[0]))))
        if kind == "iter":
            return IteratorVariable(tx.iterate(args[0]))
        raise AssertionError(kind)
    return impl


def _builtin_next(tx, args, kwargs):
    it = args[0]
    if not isinstance(it, IteratorVariable):
        raise tx.unsupported(f"next() of {it.describe()}")
    if it.index >= len(it.items):
        if len(args) > 1:
            return args[1]
        raise tx.unsupported("next() of an exhausted iterator (StopIteration)")
    tx.output.record_mutation(it)
    it.index += 1
    return it.items[it.index - 1]


def _builtin_reduce(kind):
    def impl(tx, args, kwargs):
        items = tx.iterate(args[0]) if len(args) == 1 else list(args)
        if kind == "sum":
            start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
            items = tx.iterate(args[0]) if len(args) > 1 else items   # (an iterator is read once)
            acc = start
            for it in items:
                acc = tx.binary("+", acc, it)
            return acc
        if all(i.is_constant() for i in items) and all(v.is_constant() for v in kwargs.values()):
            fn = {"min": min, "max": max, "any": any, "all": all, "sorted": sorted}[kind]
            r = fn([i.as_example() for i in items], **{k: v.as_example() for k, v in kwargs.items()})
            if kind == "sorted":
                return ListVariable([ConstantVariable(x) for x in r])
            return ConstantVariable(r)
        if kind in ("any", "all"):
            vals = [tx.truth(i, kind) for i in items]
            return ConstantVariable(any(vals) if kind == "any" else all(vals))
        if kind in ("min", "max") and not kwargs and len(items) == 2 and _contains_tensor(items):
            raise tx.unsupported(f"builtin {kind}() comparing tensors",
                                 "which is smaller depends on the tensors' values")
        raise tx.unsupported(f"builtin {kind}() on non-constant values")
    return impl


def _builtin_hasattr(tx, args, kwargs):
    obj, name = args
    return ConstantVariable(_attribute_present(tx, obj, name.as_example()))


def _builtin_dict(tx, args, kwargs):
    items = {}
    if args:
        src = args[0]
        if isinstance(src, DictVariable):
            items.update(src.items)
        else:
            for pair in tx.iterate(src):
                k, v = tx.unpack(pair, 2)
                if not k.is_constant():
                    raise tx.unsupported("dict() with non-constant keys")
                items[k.as_example()] = v
    items.update(kwargs)
    return DictVariable(items)


def _builtin_callable(tx, args, kwargs):
    v = args[0]
    if v.is_constant():
        return ConstantVariable(callable(v.as_example()))
    return ConstantVariable(not isinstance(v, (TensorVariable, BaseListVariable, DictVariable)))


def _builtin_type(tx, args, kwargs):
    v = args[0]
    if isinstance(v, TensorVariable):
        return tx.output.wrap(type(v.example), None)
    if isinstance(v, BaseListVariable):
        return tx.output.wrap(v.python_type, None)
    if isinstance(v, DictVariable):
        return tx.output.wrap(dict, None)
    if isinstance(v, NNModuleVariable):
        return TypeVariable(type(v.module))
    if v.is_constant():
        return tx.output.wrap(type(v.as_example()), None)
    raise tx.unsupported(f"type() of {v.describe()}")


def _builtin_id(tx, args, kwargs):
    v = args[0]
    if isinstance(v, NNModuleVariable):
        if v.source is not None:       # the trace now depends on which object it is
            tx.output.guards.identity(v.source, v.module, f"nn.Module {type(v.module).__name__}")
        return ConstantVariable(id(v.module))
    raise tx.unsupported(f"id() of {v.describe()}")


_BUILTIN_HANDLERS: Dict[Any, Callable] = {
    len: _builtin_len, isinstance: _builtin_isinstance, getattr: _builtin_getattr,
    tuple: _builtin_container(TupleVariable), list: _builtin_container(ListVariable),
    print: _builtin_print,
    enumerate: _builtin_iter("enumerate"), zip: _builtin_iter("zip"), map: _builtin_iter("map"),
    filter: _builtin_iter("filter"), reversed: _builtin_iter("reversed"), iter: _builtin_iter("iter"),
    next: _builtin_next, sum: _builtin_reduce("sum"), min: _builtin_reduce("min"),
    max: _builtin_reduce("max"), any: _builtin_reduce("any"), all: _builtin_reduce("all"),
    sorted: _builtin_reduce("sorted"), hasattr: _builtin_hasattr, dict: _builtin_dict,
    callable: _builtin_callable, type: _builtin_type, id: _builtin_id,
}
for _f in (int, float, bool, str, abs, pow, round, range, slice, divmod, hash, repr, chr, ord,
           set, frozenset, complex, format, ascii, bin, hex, oct):
    _BUILTIN_HANDLERS[_f] = _builtin_const(_f)


def _cmp_symbol(argval) -> str:
    # 3.13's dis shows bool(<) when the result is converted to bool; argval is the symbol
    s = str(argval)
    return s[5:-1] if s.startswith("bool(") else s


# ----------------------------------------------------------------------------------------
# The interpreter: one instance per (inlined) frame
# ----------------------------------------------------------------------------------------
class _Return(Exception):
    pass


class InstructionTranslator:
    def __init__(self, output: OutputGraph, func: types.FunctionType,
                 locals_: Dict[str, VariableTracker], lazy_locals: Dict[str, Tuple[Any, Source]],
                 parent: Optional["InstructionTranslator"] = None, globals_source: Optional[Source] = None,
                 closure_cells: Optional[Dict[str, VariableTracker]] = None, code=None):
        self.output = output
        self.func = func
        self.code: types.CodeType = code if code is not None else func.__code__
        self.f_globals = func.__globals__ if func is not None else None
        self.globals_source = globals_source
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.instructions, self.offset_to_index = decode(self.code)
        self.dispatch = dispatch_table()
        self.version = current_version()
        self.stack: List[VariableTracker] = []
        self.locals: Dict[str, VariableTracker] = dict(locals_)
        self.lazy_locals = dict(lazy_locals)
        self.pc = 0
        self.current: Optional[Instruction] = None
        self.kw_names: Tuple[str, ...] = ()
        self.return_value: Optional[VariableTracker] = None
        # free variables: name -> cell (read through its contents, guarded like a global)
        self.freevars = dict(zip(self.code.co_freevars, (func.__closure__ or ()) if func is not None else ()))
        # free variables of a function made inside the trace: CellVariables
        self.closure_cells: Dict[str, VariableTracker] = dict(closure_cells or {})
        self.with_depth = 0                   # open `with` blocks (a break inside: no resume)
        self.generator_items: Optional[List[VariableTracker]] = None   # a generator's yields

    # -- where we are (for error messages and node meta) ---------------------------------
    def location(self):
        lineno = self.current.lineno if self.current is not None else self.code.co_firstlineno
        if lineno is None:
            lineno = self.code.co_firstlineno
        return (self.code.co_filename, lineno, source_line(self.code.co_filename, lineno))

    def full_stack(self):
        frames = []
        tx = self
        while tx is not None:
            f, l, t = tx.location()
            frames.append((f, l, t, tx.code.co_name))
            tx = tx.parent
        return frames[::-1]

    def user_stack(self):
        return [(f, l, t) for f, l, t, _ in self.full_stack()]

    def unsupported(self, reason, explanation="", hint="") -> Unsupported:
        return Unsupported(reason, explanation, hint, self.user_stack())

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> VariableTracker:
        prev_tx = self.output.tx
        self.output.tx = self
        out = self.output
        root = self.parent is None and out.breaks_allowed
        try:
            while True:
                inst = self.instructions[self.pc]
                self.current = inst
                self.pc += 1
                out.instruction_budget -= 1
                if out.instruction_budget < 0:
                    raise self.unsupported("too many instructions (an unrolled loop that does "
                                           "not end on Python values?)")
                handler = self.dispatch.get(inst.opname)
                if root:
                    # what a graph break at this instruction needs: the stack before it, and a
                    # checkpoint to roll the graph back to (an inlined call may have added nodes)
                    stack_before = list(self.stack)
                    kw_before = self.kw_names
                    undo_mark = len(out.undo_log)
                    grad_before = torch.is_grad_enabled()
                    nodes_before = set(out.graph.nodes) if inst.opname.startswith("CALL") else None
                try:
                    if handler is None:
                        raise self.unsupported(
                            f"opcode {inst.opname}" + (f" ({inst.argrepr})" if inst.argrepr else ""),
                            f"minicompile's capture has no handler for {inst.opname} on Python "
                            f"{self.version[0]}.{self.version[1]}")
                    try:
                        handler(self, inst)
                    except (_Return, Unsupported, GraphBreak):
                        raise
                    except Exception as e:
                        raise self.unsupported(
                            f"internal error while tracing {inst.opname}: {type(e).__name__}: {e}",
                            "minicompile could not model this instruction") from e
                except Unsupported as e:
                    if not root:
                        raise
                    out.rollback(undo_mark)
                    torch._C._set_grad_enabled(grad_before)
                    if nodes_before is not None:
                        for node in reversed(list(out.graph.nodes)):
                            if node not in nodes_before and node.op != "placeholder" and not node.users:
                                out.graph.erase_node(node)
                    self.stack = stack_before
                    self.kw_names = kw_before
                    self.current = inst
                    raise GraphBreak(e, inst, stack_before, kw_before, self) from None
        except _Return:
            return self.return_value
        finally:
            self.output.tx = prev_tx

    # -- stack helpers ------------------------------------------------------------------
    def push(self, v: VariableTracker):
        self.stack.append(v)

    def pop(self) -> VariableTracker:
        return self.stack.pop()

    def popn(self, n: int) -> List[VariableTracker]:
        if n == 0:
            return []
        vals = self.stack[-n:]
        del self.stack[-n:]
        return vals

    def jump_to(self, inst: Instruction):
        # loops are unrolled: a backward jump is followed like any other
        self.pc = self.offset_to_index[inst.argval]

    # -- building blocks used by handlers -------------------------------------------------
    def load_local(self, name: str) -> VariableTracker:
        if name in self.locals:
            return self.locals[name]
        if name in self.lazy_locals:
            value, source = self.lazy_locals.pop(name)
            var = self.output.wrap(value, source)
            self.locals[name] = var
            return var
        raise self.unsupported(f"read of unbound local {name!r}")

    def load_global(self, name: str) -> VariableTracker:
        if name in self.f_globals:
            src = ItemSource(self.globals_source, name) if self.globals_source is not None else None
            return self.output.wrap(self.f_globals[name], src)
        b = self.f_globals.get("__builtins__", builtins)
        b = b.__dict__ if isinstance(b, types.ModuleType) else b
        if name in b:
            return self.output.wrap(b[name], None)
        raise self.unsupported(f"global name {name!r} is not defined")

    def unpack_tensor(self, t: TensorVariable, n: int) -> List[VariableTracker]:
        self.output.specialize_sizes([t], "the trace unpacked a tensor")
        if t.example.dim() == 0 or len(t.example) != n:
            raise self.unsupported(f"unpacking a tensor of shape {tuple(t.example.shape)} into {n}")
        return [self.output.call("call_function", operator.getitem, [t, ConstantVariable(i)], {})
                for i in range(n)]

    def iterate(self, v: VariableTracker) -> List[VariableTracker]:
        """The items a for loop over `v` sees (all known: loops are unrolled)."""
        if isinstance(v, IteratorVariable):
            self.output.record_mutation(v)
            items = v.remaining()
            v.index = len(v.items)
            return items
        if isinstance(v, NNModuleVariable):
            mod = v.module
            if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
                return [self.load_module_attr(v, k) for k in self.output.members(v)]
            if isinstance(mod, torch.nn.ModuleDict):
                return [ConstantVariable(k) for k in self.output.members(v)]
            if isinstance(mod, (torch.nn.ParameterList,)):
                return [self.load_module_attr(v, k) for k in self.output.members(v, "_parameters")]
            raise self.unsupported(f"iterating over {type(mod).__name__}")
        if isinstance(v, ConstantVariable) and isinstance(v.value, (str, dict, frozenset, set)):
            return [ConstantVariable(x) for x in v.value]
        return self.unpack(v)

    def unpack(self, v: VariableTracker, n: Optional[int] = None) -> List[VariableTracker]:
        if isinstance(v, (IteratorVariable, NNModuleVariable)):
            items = self.iterate(v)
            if n is not None and len(items) != n:
                raise self.unsupported(f"unpacking {len(items)} values into {n}")
            return items
        if isinstance(v, BaseListVariable):
            items = list(v.items)
        elif isinstance(v, ConstantVariable) and isinstance(v.value, (tuple, list, torch.Size, range)):
            items = [ConstantVariable(x) for x in v.value]
        elif isinstance(v, TensorVariable):
            items = self.unpack_tensor(v, n if n is not None else len(v.example))
        elif isinstance(v, DictVariable):
            items = [ConstantVariable(k) for k in v.items]
        else:
            raise self.unsupported(f"unpacking {v.describe()}")
        if n is not None and len(items) != n:
            raise self.unsupported(f"unpacking {len(items)} values into {n}")
        return items

    def truth(self, v: VariableTracker, opname: str) -> bool:
        if isinstance(v, ConstantVariable):
            return bool(v.value)
        if isinstance(v, (BaseListVariable, DictVariable)):
            return bool(v.items)
        if isinstance(v, TensorVariable):
            raise self.unsupported(
                f"data-dependent branch ({opname} on a tensor)",
                "the branch taken depends on a tensor's values, which are not known while "
                "tracing: the graph so far is compiled, the branch runs in Python, and the code "
                "after it is compiled on its own (a graph break)",
                "use torch.where or torch.cond to keep one graph")
        if isinstance(v, (NNModuleVariable, UserFunctionVariable, TorchFunctionVariable,
                          UserObjectVariable, NestedFunctionVariable, IteratorVariable,
                          PythonModuleVariable, TypeVariable, BuiltinVariable)):
            return True
        raise self.unsupported(f"truth value of {v.describe()}")

    # attribute access ------------------------------------------------------------------
    def load_attr(self, obj: VariableTracker, name: str) -> VariableTracker:
        out = self.output
        if isinstance(obj, TensorVariable):
            if name in TENSOR_CONSTANT_ATTRS:
                if name == "shape" and out.has_dynamic_inputs():
                    return out.shape_of(obj)
                return ConstantVariable(getattr(obj.example, name))
            if name in TENSOR_TENSOR_ATTRS:
                return out.call("call_function", getattr, [obj, ConstantVariable(name)], {})
            if callable(getattr(torch.Tensor, name, None)):
                return TensorMethodVariable(obj, name)
            raise self.unsupported(f"tensor attribute .{name}")
        if isinstance(obj, NNModuleVariable):
            return self.load_module_attr(obj, name)
        if isinstance(obj, SuperVariable):
            return self.load_super_attr(obj, name)
        if isinstance(obj, UserObjectVariable):
            if name in obj.overrides:
                return obj.overrides[name]
            value = obj.value
            d = getattr(value, "__dict__", None)
            if d is not None and name in d and obj.source is not None:
                return out.wrap(d[name], AttrSource(obj.source, name))
            attr = inspect.getattr_static(type(value), name)     # AttributeError as Python
            if isinstance(attr, types.FunctionType):
                return BoundMethodVariable(attr, obj)
            if isinstance(attr, property) and attr.fget is not None:
                return self.inline_call(attr.fget, [obj], {})
            if is_constant_value(attr):
                return out.wrap(attr, AttrSource(obj.source, name) if obj.source is not None else None)
            raise self.unsupported(f"attribute .{name} of {type(value).__name__}")
        if isinstance(obj, PythonModuleVariable):
            mod = obj.value
            if not hasattr(mod, name):
                raise AttributeError(name)
            src = None
            if obj.source is not None and not _is_internal_module_name(mod.__name__):
                src = AttrSource(obj.source, name)
            return out.wrap(getattr(mod, name), src)
        if isinstance(obj, NamedTupleVariable):
            idx = obj.field_index(name)
            if idx is not None:
                return obj.items[idx]
        if isinstance(obj, ConstantVariable):
            attr = getattr(obj.value, name)
            if callable(attr):
                return ConstantMethodVariable(obj, name)
            return ConstantVariable(attr)
        if isinstance(obj, (BaseListVariable, DictVariable)):
            return ConstantMethodVariable(obj, name)
        if isinstance(obj, (TorchFunctionVariable, UserFunctionVariable, TypeVariable)):
            if obj.value in (torch.Tensor,) and callable(getattr(torch.Tensor, name, None)):
                return _UnboundTensorMethod(name)
            attr = getattr(obj.value, name)
            if is_constant_value(attr):
                return ConstantVariable(attr)
        raise self.unsupported(f"attribute .{name} of {obj.describe()}")

    def load_super_attr(self, sup: "SuperVariable", name: str) -> VariableTracker:
        """super(cls, obj).name: the first class after `cls` in obj's MRO that defines it."""
        obj = sup.obj
        target = obj.value if isinstance(obj, TypeVariable) else obj.as_example()
        mro = target.__mro__ if isinstance(obj, TypeVariable) else type(target).__mro__
        if sup.cls not in mro:
            raise self.unsupported("super(): the object is not an instance of the class")
        for klass in mro[mro.index(sup.cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                break
        else:
            raise AttributeError(name)
        if isinstance(attr, types.FunctionType):
            if isinstance(obj, TypeVariable):
                return self.output.wrap(attr, None)
            return BoundMethodVariable(attr, obj)
        if isinstance(attr, classmethod):
            return BoundMethodVariable(attr.__func__, obj if isinstance(obj, TypeVariable)
                                       else TypeVariable(type(target)))
        if isinstance(attr, staticmethod):
            return self.output.wrap(attr.__func__, None)
        if attr is object.__init__:
            return _NoOpCallable()
        if is_constant_value(attr):
            return ConstantVariable(attr)
        raise self.unsupported(f"super().{name} ({type(attr).__name__})")

    def load_module_attr(self, obj: NNModuleVariable, name: str) -> VariableTracker:
        mod, src, out = obj.module, obj.source, self.output
        d = mod.__dict__
        for kind in ("_parameters", "_buffers", "_modules"):
            members = d.get(kind, {})
            if name in members:
                s = module_member_source(src, kind, name) if src is not None else None
                value = members[name]
                if value is None:
                    if s is not None:
                        out.guards.constant(s, None)
                    return ConstantVariable(None, s)
                return out.wrap(value, s)
        if name in d:
            return out.wrap(d[name], AttrSource(src, name) if src is not None else None)
        # class attribute: methods are inlined with self bound; properties are inlined
        try:
            attr = inspect.getattr_static(type(mod), name)
        except AttributeError:
            raise self.unsupported(f"{type(mod).__name__} has no attribute {name!r}")
        if isinstance(attr, types.FunctionType):
            return BoundMethodVariable(attr, obj)
        if isinstance(attr, property) and attr.fget is not None:
            return self.inline_call(attr.fget, [obj], {})
        if isinstance(attr, staticmethod):
            return out.wrap(attr.__func__, None)
        if isinstance(attr, classmethod):
            return BoundMethodVariable(attr.__func__, TypeVariable(type(mod)))
        if is_constant_value(attr):
            # a class attribute: read through the instance, so a change to the class (or an
            # instance attribute that hides it) is seen by the guard
            return out.wrap(attr, AttrSource(src, name) if src is not None else None)
        raise self.unsupported(f"attribute {name!r} of {type(mod).__name__} "
                               f"({type(attr).__name__})")

    # calls --------------------------------------------------------------------------------
    def call_function(self, fn: VariableTracker, args: List[VariableTracker],
                      kwargs: Dict[str, VariableTracker]) -> VariableTracker:
        out = self.output
        if not out.inline_user_calls and self.parent is None and isinstance(
                fn, (UserFunctionVariable, BoundMethodVariable, NestedFunctionVariable)) \
                or not out.inline_user_calls and self.parent is None and isinstance(fn, NNModuleVariable) \
                and not type(fn.module).__module__.startswith("torch."):
            raise self.unsupported(f"call to {fn.describe()} from a frame that runs eagerly",
                                   "the callee is compiled on its own")
        if isinstance(fn, NestedFunctionVariable):
            return self.inline_nested(fn, args, kwargs)
        if isinstance(fn, _NoOpCallable):
            return ConstantVariable(None)
        if isinstance(fn, WithExitVariable):
            self.set_grad(fn.prev)
            self.with_depth -= 1
            return ConstantVariable(None)
        if isinstance(fn, TypeVariable) and fn.value in (torch.no_grad, torch.enable_grad,
                                                         torch.set_grad_enabled):
            if fn.value is torch.set_grad_enabled:
                mode = args[0].as_example() if args else kwargs["mode"].as_example()
                if not isinstance(mode, bool):
                    raise self.unsupported("set_grad_enabled with a non-constant mode")
                # as a function it takes effect at once (it is also a context manager)
                prev = torch.is_grad_enabled()
                self.set_grad(mode)
                return GradModeVariable(mode, prev)
            return GradModeVariable(fn.value is torch.enable_grad)
        if isinstance(fn, TorchFunctionVariable):
            # (looked up without importing torch._dynamo: that import alone takes seconds, and
            # code that calls graph_break() has imported it already)
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is not None and fn.value is getattr(dynamo, "graph_break", None):
                raise self.unsupported("torch._dynamo.graph_break()",
                                       "a graph break the user asked for",
                                       "remove the call to keep one graph")
            if fn.value is torch.cond:
                from .higher_order import call_cond
                return call_cond(self, args, kwargs)
            return out.call("call_function", fn.value, args, kwargs)
        if isinstance(fn, TensorMethodVariable):
            return out.call("call_method", fn.name, [fn.tensor] + list(args), kwargs)
        if isinstance(fn, _UnboundTensorMethod):
            return out.call("call_method", fn.name, list(args), kwargs)
        if isinstance(fn, UserFunctionVariable):
            return self.inline_call(fn.value, args, kwargs)
        if isinstance(fn, BoundMethodVariable):
            return self.inline_call(fn.func, [fn.self_var] + list(args), kwargs)
        if isinstance(fn, NNModuleVariable):
            return self.call_module(fn, args, kwargs)
        if isinstance(fn, BuiltinVariable):
            return _BUILTIN_HANDLERS[fn.value](self, args, kwargs)
        if isinstance(fn, ConstantMethodVariable):
            return self.call_constant_method(fn, args, kwargs)
        if isinstance(fn, TypeVariable):
            if fn.value is torch.Size and all(a.is_constant() for a in args):
                return ConstantVariable(torch.Size(*[a.as_example() for a in args]))
            if fn.value is super:
                return self.make_super(args)
            if _is_plain_user_class(fn.value):
                return self.new_object(fn.value, args, kwargs)
        name = getattr(getattr(fn, "value", None), "__qualname__", None) or fn.describe()
        raise self.unsupported(f"call to {name}", "the capture cannot model this callable yet")

    def new_object(self, cls: type, args, kwargs) -> VariableTracker:
        """`cls(*args)` for a plain Python class: a real instance with no attributes yet (its
        attributes live in the trace) and `__init__` inlined, as Dynamo does for user objects
        made inside the frame. After the graph the object is rebuilt (frame.rebuild)."""
        obj = UserObjectVariable(object.__new__(cls), None)
        init = inspect.getattr_static(cls, "__init__")
        if isinstance(init, types.FunctionType):
            ret = self.inline_call(init, [obj] + list(args), kwargs)
            if not (isinstance(ret, ConstantVariable) and ret.value is None):
                raise self.unsupported(f"{cls.__qualname__}.__init__ returned a value")
        elif init is not object.__init__ or args or kwargs:
            raise self.unsupported(f"creating a {cls.__qualname__} (its __init__ is not Python)")
        return obj

    def call_constant_method(self, fn: ConstantMethodVariable, args, kwargs):
        obj = fn.obj
        if isinstance(obj, ConstantVariable) and all(a.is_constant() for a in args) \
                and all(v.is_constant() for v in kwargs.values()):
            r = getattr(obj.value, fn.name)(*[a.as_example() for a in args],
                                            **{k: v.as_example() for k, v in kwargs.items()})
            if is_constant_value(r):
                return ConstantVariable(r)
        if isinstance(obj, DictVariable) and not args and not kwargs:
            if fn.name == "keys":
                return TupleVariable([ConstantVariable(k) for k in obj.items])
            if fn.name == "values":
                return TupleVariable(list(obj.items.values()))
            if fn.name == "items":
                return TupleVariable([TupleVariable([ConstantVariable(k), v])
                                      for k, v in obj.items.items()])
        if isinstance(obj, ListVariable) and fn.name in ("append", "extend", "insert", "pop",
                                                          "clear", "reverse", "remove", "sort"):
            self.check_mutable(obj)
            self.output.record_mutation(obj)
            if fn.name == "append":
                obj.items.append(args[0])
            elif fn.name == "extend":
                obj.items.extend(self.iterate(args[0]))
            elif fn.name == "insert":
                obj.items.insert(args[0].as_example(), args[1])
            elif fn.name == "pop":
                return obj.items.pop(*[a.as_example() for a in args])
            elif fn.name == "clear":
                obj.items.clear()
            elif fn.name == "reverse":
                obj.items.reverse()
            elif fn.name == "remove" and args[0].is_constant() and obj.is_constant():
                obj.items = [ConstantVariable(v) for v in obj.as_example()]
                obj.items.remove(ConstantVariable(args[0].as_example())) if False else \
                    obj.items.pop([i.as_example() for i in obj.items].index(args[0].as_example()))
            elif fn.name == "sort" and obj.is_constant() and not kwargs:
                obj.items = [ConstantVariable(v) for v in sorted(obj.as_example())]
            else:
                raise self.unsupported(f"list.{fn.name}() on {obj.describe()}")
            return ConstantVariable(None)
        if isinstance(obj, SetVariable) and fn.name in ("add", "update", "discard") and \
                all(a.is_constant() for a in args):
            self.check_mutable(obj)
            self.output.record_mutation(obj)
            real = set(obj.as_example())
            getattr(real, fn.name)(*[a.as_example() for a in args])
            obj.items = SetVariable.of(real).items
            return ConstantVariable(None)
        if isinstance(obj, SetVariable) and fn.name == "copy":
            return SetVariable(list(obj.items))
        if isinstance(obj, BaseListVariable) and fn.name == "copy":
            return ListVariable(list(obj.items))
        if isinstance(obj, DictVariable) and fn.name in ("update", "pop", "setdefault", "clear",
                                                          "copy", "popitem"):
            if fn.name == "copy":
                return DictVariable(dict(obj.items))
            self.check_mutable(obj)
            self.output.record_mutation(obj)
            if fn.name == "update":
                new = _builtin_dict(self, args, kwargs)
                obj.items.update(new.items)
                return ConstantVariable(None)
            if fn.name == "pop":
                key = args[0].as_example()
                if key in obj.items:
                    return obj.items.pop(key)
                if len(args) > 1:
                    return args[1]
                raise self.unsupported(f"dict.pop of missing key {key!r}")
            if fn.name == "setdefault":
                key = args[0].as_example()
                if key not in obj.items:
                    obj.items[key] = args[1] if len(args) > 1 else ConstantVariable(None)
                return obj.items[key]
            if fn.name == "clear":
                obj.items.clear()
                return ConstantVariable(None)
            k, v = obj.items.popitem()
            return TupleVariable([ConstantVariable(k), v])
        if isinstance(obj, DictVariable) and fn.name == "get" and args and args[0].is_constant():
            default = args[1] if len(args) > 1 else ConstantVariable(None)
            return obj.items.get(args[0].as_example(), default)
        if isinstance(obj, BaseListVariable) and fn.name in ("index", "count") \
                and all(a.is_constant() for a in args) and obj.is_constant():
            return ConstantVariable(getattr(obj.as_example(), fn.name)(*[a.as_example() for a in args]))
        raise self.unsupported(f"method .{fn.name}() of {obj.describe()}",
                               "mutating or calling methods of Python containers is not "
                               "modelled yet")

    def call_module(self, mv: NNModuleVariable, args, kwargs) -> VariableTracker:
        mod = mv.module
        hooks = (mod._forward_hooks or mod._forward_pre_hooks or
                 torch.nn.modules.module._global_forward_hooks or
                 torch.nn.modules.module._global_forward_pre_hooks)
        if hooks:
            raise self.unsupported(f"call to {type(mod).__name__} with forward hooks",
                                   "hooks are not inlined yet")
        if "forward" in mod.__dict__:          # replaced on the instance: that one runs
            return self.call_function(self.load_module_attr(mv, "forward"), args, kwargs)
        if mv.source is not None:
            self.output.guards.class_forward(mv.source)
        if type(mod) is torch.nn.Sequential and not kwargs and len(args) == 1:
            # Sequential.forward is a loop over children; unrolled here (which children there
            # are is guarded)
            x = args[0]
            for name in self.output.members(mv):
                x = self.call_function(self.load_module_attr(mv, name), [x], {})
            return x
        forward = inspect.getattr_static(type(mod), "forward")
        if not isinstance(forward, types.FunctionType):
            raise self.unsupported(f"{type(mod).__name__}.forward is not a Python function")
        return self.inline_call(forward, [mv] + list(args), kwargs)

    def inline_call(self, func: types.FunctionType, args: List[VariableTracker],
                    kwargs: Dict[str, VariableTracker], closure_cells=None, markers=None) -> VariableTracker:
        code = func.__code__
        name = func.__qualname__
        if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                            inspect.CO_ITERABLE_COROUTINE) or \
                code.co_flags & inspect.CO_GENERATOR and code.co_name != "<genexpr>":
            # a generator function's object may be kept and resumed later (a contextmanager);
            # only generator expressions, consumed where they are made, are run to the end
            raise self.unsupported(f"call to generator/coroutine function {name}")
        if self.depth + 1 > MAX_INLINE_DEPTH:
            raise self.unsupported(f"call to {name}: inlining depth limit {MAX_INLINE_DEPTH}")
        # the function's own parameters, not those of a function it wraps (functools.wraps)
        sig = inspect.signature(func, follow_wrapped=False)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise self.unsupported(f"call to {name}: {e}")
        bound.apply_defaults()
        locals_: Dict[str, VariableTracker] = {}
        for pname, value in bound.arguments.items():
            kind = sig.parameters[pname].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                value = TupleVariable([v for v in value])
            elif kind is inspect.Parameter.VAR_KEYWORD:
                value = DictVariable(dict(value))
            elif markers and id(value) in markers:             # a default made in the trace
                value = markers[id(value)]
            elif not isinstance(value, VariableTracker):      # a default value
                value = self.output.wrap(value, None)
            if pname.startswith("implicit") and "." + pname[8:] in code.co_varnames:
                pname = "." + pname[8:]           # inspect renames a comprehension's .0
            locals_[pname] = value
        glob_name = func.__globals__.get("__name__", "")
        gsrc = None
        if _is_internal_module_name(glob_name):
            gsrc = None
        elif func.__globals__ is self.output.root_globals:
            gsrc = RootSource("G")             # the called function's globals, read per call
        else:
            gsrc = self.output.root_source(func.__globals__, "G_" + glob_name)
        child = InstructionTranslator(self.output, func, locals_, {}, parent=self, globals_source=gsrc,
                                      closure_cells=closure_cells)
        if code.co_flags & inspect.CO_GENERATOR:
            # a generator expression is run to the end at once and its values kept:
            # `sum(f(t) for t in ts)`, `tuple(...)`, `any(...)` consume it whole
            child.generator_items = []
            child.run()
            return IteratorVariable(child.generator_items)
        return child.run()

    def inline_nested(self, fn: NestedFunctionVariable, args, kwargs) -> VariableTracker:
        code = fn.code
        markers = {}

        def mark(v):
            m = object()
            markers[id(m)] = v
            return m
        defaults = tuple(mark(v) for v in self.unpack(fn.defaults)) if fn.defaults is not None else None
        closure_vals = list(fn.closure.items) if fn.closure is not None else []
        func = types.FunctionType(code, fn.f_globals, code.co_name, defaults,
                                  tuple(types.CellType() for _ in code.co_freevars) or None)
        if fn.kwdefaults is not None:
            func.__kwdefaults__ = {k: mark(v) for k, v in fn.kwdefaults.items.items()}
        cells = dict(zip(code.co_freevars, closure_vals))
        return self.inline_call(func, args, kwargs, closure_cells=cells, markers=markers)

    def call_with_stack_layout(self, argc: int, kw_names: Tuple[str, ...]):
        """CALL's operands: [NULL, callable, args] / [callable, self, args] on 3.11-3.12,
        [callable, NULL, args] / [callable, self, args] on 3.13."""
        args = self.popn(argc)
        a, b = self.popn(2)
        if self.version >= (3, 13):
            fn, self_or_null = a, b
            if not isinstance(self_or_null, NullVariable):
                args = [self_or_null] + args
        else:
            if isinstance(a, NullVariable):
                fn = b
            else:
                fn, args = a, [b] + args
        nkw = len(kw_names)
        kwargs = dict(zip(kw_names, args[len(args) - nkw:])) if nkw else {}
        pos = args[:len(args) - nkw] if nkw else args
        self.push(self.call_function(fn, pos, kwargs))

    def binary(self, sym: str, a: VariableTracker, b: VariableTracker) -> VariableTracker:
        op = BINARY_OPS.get(sym) or COMPARE_OPS[sym]
        if (isinstance(a, SymIntVariable) or isinstance(b, SymIntVariable)) and sym in SIZE_ARITHMETIC \
                and all(type(v.example if isinstance(v, SymIntVariable) else getattr(v, "value", None)) is int
                        for v in (a, b)):
            return self.output.sym_arith(SIZE_ARITHMETIC[sym], a, b)
        if a.is_constant() and b.is_constant():
            return ConstantVariable(op(a.as_example(), b.as_example()))
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            return self.output.call("call_function", op, [a, b], {})
        if isinstance(a, BaseListVariable) and isinstance(b, BaseListVariable) and sym in ("+", "+=") \
                and type(a) is type(b):
            return type(a)(a.items + b.items)
        if isinstance(a, BaseListVariable) and isinstance(b, ConstantVariable) and sym == "*":
            return type(a)(a.items * b.value)
        if sym in ("==", "!=") and isinstance(a, NNModuleVariable):
            same = isinstance(b, NNModuleVariable) and self.output.same_module(a, b)
            return ConstantVariable(same if sym == "==" else not same)
        raise self.unsupported(f"operator {sym} on {a.describe()} and {b.describe()}")

    def make_tuple(self, items):
        return TupleVariable(items)

    # ===================================================================================
    # Opcode handlers. Each states the versions whose semantics it implements.
    # ===================================================================================
    @handles("NOP", "RESUME", "CACHE", "EXTENDED_ARG", "COPY_FREE_VARS", "MAKE_CELL")
    def _nop(self, inst):
        # COPY_FREE_VARS / MAKE_CELL: free variables are read through the function's cells
        # (self.freevars), cell variables are plain locals until a closure is created, which
        # is not supported yet (MAKE_FUNCTION has no handler).
        pass

    @handles("PRECALL", versions=[(3, 11)])
    def _precall(self, inst):
        pass

    # generators (see inline_call): run to the end, each yielded value collected
    @handles("RETURN_GENERATOR")
    def _return_generator(self, inst):
        if self.generator_items is None:
            raise self.unsupported("RETURN_GENERATOR outside an inlined generator")
        self.push(ConstantVariable(None))         # popped by the POP_TOP that follows

    @handles("YIELD_VALUE")
    def _yield_value(self, inst):
        if self.generator_items is None:
            raise self.unsupported("yield outside an inlined generator")
        self.generator_items.append(self.pop())
        self.push(ConstantVariable(None))         # what `yield` evaluates to: nothing was sent

    # super(): zero-argument (3.11: a call of `super`; 3.12+: LOAD_SUPER_ATTR) and two-argument
    def make_super(self, args) -> "SuperVariable":
        if args:
            if len(args) != 2 or not isinstance(args[0], TypeVariable):
                raise self.unsupported("super() with unusual arguments")
            return SuperVariable(args[0].value, args[1])
        cell = self.freevars.get("__class__")
        if cell is None or not self.code.co_argcount:
            raise self.unsupported("super() outside a method")
        return SuperVariable(cell.cell_contents, self.load_local(self.code.co_varnames[0]))

    @handles("LOAD_SUPER_ATTR", versions=[(3, 12), (3, 13)])
    def _load_super_attr(self, inst):
        obj = self.pop()
        cls = self.pop()
        self.pop()                                # the global `super`
        if not isinstance(cls, TypeVariable):
            raise self.unsupported(f"super() with {cls.describe()}")
        attr = self.load_attr(SuperVariable(cls.value, obj), inst.argval)
        self._push_attribute(attr, method_load=bool(inst.arg & 1))   # as LOAD_ATTR

    @handles("LOAD_FAST")
    @handles("LOAD_FAST_CHECK", versions=[(3, 12), (3, 13)])
    def _load_fast(self, inst):
        if self.version >= (3, 13) and inst.argval in self.code.co_cellvars \
                and self._next_builds_closure():
            self.push(CellVariable(self, inst.argval))      # 3.13: LOAD_CLOSURE became LOAD_FAST
            return
        self.push(self.load_local(inst.argval))

    def _next_builds_closure(self) -> bool:
        for ins in self.instructions[self.pc:self.pc + 64]:
            if ins.opname in ("LOAD_FAST", "LOAD_FAST_CHECK") and ins.argval in self.code.co_cellvars:
                continue
            if ins.opname == "BUILD_TUPLE":
                continue
            return ins.opname == "LOAD_CONST" and isinstance(ins.argval, types.CodeType)
        return False

    @handles("LOAD_CLOSURE", versions=[(3, 11), (3, 12)])
    def _load_closure(self, inst):
        name = inst.argval
        if name in self.closure_cells:                    # passing our own free variable on
            self.push(self.closure_cells[name])
        elif name in self.freevars:
            self.push(self.freevars[name])
        else:
            self.push(CellVariable(self, name))

    @handles("MAKE_FUNCTION")
    def _make_function(self, inst):
        code = self.pop().as_example()
        if self.version >= (3, 13):
            self.push(NestedFunctionVariable(code, self.f_globals, code.co_qualname))
            return
        flags = inst.arg or 0
        closure = self.pop() if flags & 0x08 else None
        if flags & 0x04:
            self.pop()                                    # annotations
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop() if flags & 0x01 else None
        self.push(NestedFunctionVariable(code, self.f_globals, code.co_qualname, defaults,
                                         kwdefaults, closure))

    @handles("SET_FUNCTION_ATTRIBUTE", versions=[(3, 13)])
    def _set_function_attribute(self, inst):
        fn = self.pop()
        value = self.pop()
        flag = inst.arg
        if flag == 0x08:
            fn.closure = value
        elif flag == 0x02:
            fn.kwdefaults = value
        elif flag == 0x01:
            fn.defaults = value
        self.push(fn)

    # f-strings --------------------------------------------------------------------------
    def _format(self, value: VariableTracker, conversion: Optional[str], spec: str = ""):
        if not value.is_constant():
            if isinstance(value, (NNModuleVariable, TypeVariable, UserFunctionVariable)) and not spec:
                v = value.as_example()
            else:
                raise self.unsupported(f"formatting {value.describe()} in an f-string",
                                       "the text would depend on a tensor's values")
        else:
            v = value.as_example()
        if conversion == "s":
            v = str(v)
        elif conversion == "r":
            v = repr(v)
        elif conversion == "a":
            v = ascii(v)
        return ConstantVariable(format(v, spec))

    @handles("FORMAT_VALUE", versions=[(3, 11), (3, 12)])
    def _format_value(self, inst):
        flags = inst.arg or 0
        spec = self.pop().as_example() if flags & 0x04 else ""
        value = self.pop()
        conv = {0: None, 1: "s", 2: "r", 3: "a"}[flags & 0x03]
        self.push(self._format(value, conv, spec))

    @handles("CONVERT_VALUE", versions=[(3, 13)])
    def _convert_value(self, inst):
        value = self.pop()
        conv = {1: "s", 2: "r", 3: "a"}.get(inst.arg)
        self.push(self._format(value, conv))

    @handles("FORMAT_SIMPLE", versions=[(3, 13)])
    def _format_simple(self, inst):
        self.push(self._format(self.pop(), None))

    @handles("FORMAT_WITH_SPEC", versions=[(3, 13)])
    def _format_with_spec(self, inst):
        spec = self.pop().as_example()
        self.push(self._format(self.pop(), None, spec))

    @handles("BUILD_STRING")
    def _build_string(self, inst):
        parts = self.popn(inst.arg)
        self.push(ConstantVariable("".join(p.as_example() for p in parts)))

    # iteration (loops are unrolled) -----------------------------------------------------
    @handles("GET_ITER")
    def _get_iter(self, inst):
        v = self.pop()
        if isinstance(v, IteratorVariable):
            self.push(v)
        else:
            self.push(IteratorVariable(self.iterate(v)))

    @handles("FOR_ITER")
    def _for_iter(self, inst):
        it = self.stack[-1]
        if not isinstance(it, IteratorVariable):
            raise self.unsupported(f"for loop over {it.describe()}")
        if it.index < len(it.items):
            self.output.record_mutation(it)
            it.index += 1
            self.push(it.items[it.index - 1])
            return
        # exhausted: the iterator is popped and the loop's END_FOR (3.12: END_FOR,
        # 3.13: END_FOR + POP_TOP, which would pop it) skipped
        self.pop()
        target = self.offset_to_index[inst.argval]
        if self.version >= (3, 12) and self.instructions[target].opname == "END_FOR":
            target += 1
            if self.version >= (3, 13) and self.instructions[target].opname == "POP_TOP":
                target += 1
        self.pc = target

    @handles("END_FOR", versions=[(3, 12), (3, 13)])
    def _end_for(self, inst):
        self.pop()
        if self.version == (3, 12):
            self.pop()

    # with blocks: torch.no_grad() and friends ---------------------------------------------
    @handles("BEFORE_WITH")
    def _before_with(self, inst):
        ctx = self.pop()
        if not isinstance(ctx, GradModeVariable):
            raise self.unsupported(f"with-block on {ctx.describe()}",
                                   "only torch.no_grad/enable_grad/set_grad_enabled are modelled")
        prev = torch.is_grad_enabled()
        self.set_grad(ctx.enabled)
        self.with_depth += 1
        self.push(WithExitVariable(ctx, prev))
        self.push(ConstantVariable(None))

    def set_grad(self, enabled: bool):
        if torch.is_grad_enabled() != enabled:
            node = self.output.graph.call_function(torch._C._set_grad_enabled, (enabled,))
            self.output._set_meta(node, None)
            torch._C._set_grad_enabled(enabled)

    @handles("STORE_SUBSCR")
    def _store_subscr(self, inst):
        idx = self.pop()
        obj = self.pop()
        value = self.pop()
        if isinstance(obj, TensorVariable):
            self.output.call("call_function", operator.setitem, [obj, idx, value], {})
        elif isinstance(obj, (ListVariable, DictVariable)) and idx.is_constant():
            self.check_mutable(obj)
            self.output.record_mutation(obj)
            obj.items[idx.as_example()] = value
        else:
            raise self.unsupported(f"item assignment on {obj.describe()}")

    @handles("DELETE_SUBSCR")
    def _delete_subscr(self, inst):
        idx = self.pop()
        obj = self.pop()
        if isinstance(obj, (ListVariable, DictVariable)) and idx.is_constant():
            self.check_mutable(obj)
            self.output.record_mutation(obj)
            del obj.items[idx.as_example()]
        else:
            raise self.unsupported(f"del on {obj.describe()}")

    @handles("STORE_ATTR")
    def _store_attr(self, inst):
        obj = self.pop()
        value = self.pop()
        if isinstance(obj, UserObjectVariable) and obj.source is None:
            # an object made in the frame: its attributes are trace state
            self.output.record_mutation(obj)
            obj.overrides[inst.argval] = value
            return
        if isinstance(obj, UserObjectVariable) and obj.source is not None and \
                not isinstance(value, (NNModuleVariable,)):
            # replayed with setattr after the graph; later reads in the trace see the new value
            self.output.record_mutation(obj)
            obj.overrides[inst.argval] = value
            if obj not in self.output.side_effects:
                self.output.side_effects.append(obj)
            return
        raise self.unsupported(f"setting attribute .{inst.argval} of {obj.describe()}",
                               "a side effect on an object outside the graph",
                               "it runs for real at a graph break")

    def check_mutable(self, obj: VariableTracker):
        if obj.source is not None and isinstance(obj, ListVariable) and obj.source.expr().startswith(("G[", "G_")):
            # a global list: the change is replayed on the real list after the graph, as Dynamo does
            if obj not in self.output.side_effects:
                self.output.side_effects.append(obj)
            return
        if obj.source is not None:
            raise self.unsupported(f"mutation of {obj.describe()} that came from outside the frame",
                                   "changing Python state outside the frame is done for real "
                                   "at a graph break")

    @handles("LOAD_FAST_AND_CLEAR", versions=[(3, 12), (3, 13)])
    def _load_fast_and_clear(self, inst):
        name = inst.argval
        v = self.locals.pop(name, None) if name in self.locals else None
        self.push(v if v is not None else NULL)

    def _two_locals(self, inst) -> Tuple[str, str]:
        """3.13's superinstructions pack two local indices: (oparg >> 4, oparg & 15).
        dis resolves them to a pair of names; fall back to decoding the oparg ourselves."""
        if isinstance(inst.argval, tuple) and len(inst.argval) == 2:
            return inst.argval
        names = self.code.co_varnames + self.code.co_cellvars + self.code.co_freevars
        return names[inst.arg >> 4], names[inst.arg & 15]

    @handles("LOAD_FAST_LOAD_FAST", versions=[(3, 13)])
    def _load_fast_load_fast(self, inst):
        first, second = self._two_locals(inst)
        self.push(self.load_local(first))
        self.push(self.load_local(second))

    @handles("STORE_FAST")
    def _store_fast(self, inst):
        self.lazy_locals.pop(inst.argval, None)
        self.locals[inst.argval] = self.pop()

    @handles("STORE_FAST_LOAD_FAST", versions=[(3, 13)])
    def _store_fast_load_fast(self, inst):
        store, load = self._two_locals(inst)
        self.lazy_locals.pop(store, None)
        self.locals[store] = self.pop()
        self.push(self.load_local(load))

    @handles("STORE_FAST_STORE_FAST", versions=[(3, 13)])
    def _store_fast_store_fast(self, inst):
        first, second = self._two_locals(inst)   # TOS goes to the first name
        for name in (first, second):
            self.lazy_locals.pop(name, None)
            self.locals[name] = self.pop()

    @handles("DELETE_FAST")
    def _delete_fast(self, inst):
        self.locals.pop(inst.argval, None)
        self.lazy_locals.pop(inst.argval, None)

    @handles("LOAD_CONST")
    def _load_const(self, inst):
        self.push(ConstantVariable(inst.argval))

    @handles("RETURN_VALUE")
    def _return_value(self, inst):
        self.return_value = self.pop()
        raise _Return()

    @handles("RETURN_CONST", versions=[(3, 12), (3, 13)])
    def _return_const(self, inst):
        self.return_value = ConstantVariable(inst.argval)
        raise _Return()

    @handles("LOAD_GLOBAL")
    def _load_global(self, inst):
        # low bit of the oparg: also push a NULL, before the global on 3.11/3.12 and after
        # it on 3.13 (dis has already resolved argval to the name)
        null = bool(inst.arg & 1)
        if null and self.version < (3, 13):
            self.push(NULL)
        self.push(self.load_global(inst.argval))
        if null and self.version >= (3, 13):
            self.push(NULL)

    @handles("LOAD_DEREF")
    def _load_deref(self, inst):
        name = inst.argval
        if name in self.closure_cells:
            cell = self.closure_cells[name]
            if isinstance(cell, CellVariable):
                self.push(cell.tx.load_local(cell.name))
                return
            self.push(self.output.wrap(cell.cell_contents, None))
            return
        if name in self.freevars:
            cell = self.freevars[name]
            src = None
            if self.parent is None:
                # the captured frame's own closure: read from the called function's cells
                # (F.__closure__), as `L[name]` (Dynamo's spelling), so that two closures of
                # one function are told apart
                src = LocalSource(name)
                self.output.guards.freevars[name] = self.code.co_freevars.index(name)
            elif not _is_internal_module_name(self.f_globals.get("__name__", "")):
                # an inlined function's: it was guarded by identity, so its cells are its own
                src = AttrSource(self.output.root_source(cell, f"CELL_{name}"), "cell_contents")
            try:
                value = cell.cell_contents
            except ValueError:
                raise self.unsupported(f"free variable {name!r} referenced before assignment")
            self.push(self.output.wrap(value, src))
        else:
            self.push(self.load_local(name))        # a cell variable of this frame

    @handles("STORE_DEREF")
    def _store_deref(self, inst):
        cell = self.closure_cells.get(inst.argval)
        if isinstance(cell, CellVariable):
            if cell.tx.parent is None and cell.tx is not self and cell.tx.output is not self.output:
                raise self.unsupported("nonlocal assignment to another frame")
            cell.tx.lazy_locals.pop(cell.name, None)
            cell.tx.locals[cell.name] = self.pop()
            return
        if inst.argval in self.freevars:
            raise self.unsupported(f"assignment to free variable {inst.argval!r} (nonlocal)",
                                   "side effects on enclosing scopes are not modelled yet")
        self.locals[inst.argval] = self.pop()

    @handles("LOAD_ATTR", versions=[(3, 11)])
    def _load_attr_311(self, inst):
        self.push(self.load_attr(self.pop(), inst.argval))

    @handles("LOAD_METHOD", versions=[(3, 11)])
    def _load_method_311(self, inst):
        # CPython pushes [unbound method, self] or [NULL, attribute]; a bound-method variable
        # behind a NULL means the same to CALL and keeps one representation.
        obj = self.pop()
        self.push(NULL)
        self.push(self.load_attr(obj, inst.argval))

    @handles("LOAD_ATTR", versions=[(3, 12), (3, 13)])
    def _load_attr_312(self, inst):
        # low bit set: a method load for a following CALL; 3.12 pushes [NULL|meth, attr|self],
        # 3.13 pushes [attr|meth, NULL|self]
        obj = self.pop()
        self._push_attribute(self.load_attr(obj, inst.argval), method_load=bool(inst.arg & 1))

    def _push_attribute(self, attr, method_load: bool):
        """Push a loaded attribute; a method load for a following CALL also pushes the NULL
        marker, before the attribute in 3.12 and after it in 3.13."""
        if not method_load:
            self.push(attr)
        elif self.version >= (3, 13):
            self.push(attr)
            self.push(NULL)
        else:
            self.push(NULL)
            self.push(attr)

    @handles("PUSH_NULL")
    def _push_null(self, inst):
        self.push(NULL)

    @handles("KW_NAMES", versions=[(3, 11), (3, 12)])
    def _kw_names(self, inst):
        names = inst.argval
        if not isinstance(names, tuple):          # 3.11's dis does not resolve the const
            names = self.code.co_consts[inst.arg]
        self.kw_names = tuple(names)

    @handles("CALL")
    def _call(self, inst):
        kw, self.kw_names = self.kw_names, ()
        if self.version >= (3, 13):
            kw = ()                               # 3.13 uses CALL_KW for keywords
        self.call_with_stack_layout(inst.arg, kw)

    @handles("CALL_KW", versions=[(3, 13)])
    def _call_kw(self, inst):
        names = self.pop()                        # a constant tuple of keyword names
        self.call_with_stack_layout(inst.arg, tuple(names.as_example()))

    @handles("CALL_FUNCTION_EX")
    def _call_function_ex(self, inst):
        kwargs = self.pop() if inst.arg & 1 else DictVariable({})
        callargs = self.pop()
        a, b = self.popn(2)
        # 3.11/3.12: [NULL, func, args, kwargs]; 3.13: [func, NULL, args, kwargs]
        fn = a if self.version >= (3, 13) else b
        if not isinstance(kwargs, DictVariable) or not all(isinstance(k, str) for k in kwargs.items):
            raise self.unsupported(f"**kwargs from {kwargs.describe()}")
        self.push(self.call_function(fn, self.unpack(callargs), dict(kwargs.items)))

    @handles("POP_TOP")
    def _pop_top(self, inst):
        self.pop()

    @handles("COPY")
    def _copy(self, inst):
        self.push(self.stack[-inst.arg])

    @handles("SWAP")
    def _swap(self, inst):
        i = inst.arg
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    @handles("BINARY_OP")
    def _binary_op(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(self.binary(BINARY_OP_SYMBOLS[inst.arg], a, b))

    @handles("COMPARE_OP")
    def _compare_op(self, inst):
        b = self.pop()
        a = self.pop()
        sym = _cmp_symbol(inst.argval)
        if sym not in COMPARE_OPS:                 # an unresolved oparg: use the printed form
            sym = _cmp_symbol(inst.argrepr)
        self.push(self.binary(sym, a, b))

    @handles("IS_OP")
    def _is_op(self, inst):
        b = self.pop()
        a = self.pop()
        if a.is_constant() and b.is_constant():
            r = a.as_example() is b.as_example()
        elif a is b:
            r = True
        elif isinstance(a, (TensorVariable, NNModuleVariable, BaseListVariable, DictVariable)) \
                and b.is_constant() or isinstance(b, (TensorVariable, NNModuleVariable)) and a.is_constant():
            r = False                          # a tensor/module is never None or a literal
        elif isinstance(a, NNModuleVariable) and isinstance(b, NNModuleVariable):
            r = self.output.same_module(a, b)
        else:
            raise self.unsupported(f"'is' between {a.describe()} and {b.describe()}")
        self.push(ConstantVariable(r != bool(inst.arg)))

    @handles("CONTAINS_OP")
    def _contains_op(self, inst):
        container = self.pop()
        item = self.pop()
        if item.is_constant() and container.is_constant():
            r = item.as_example() in container.as_example()
        elif item.is_constant() and isinstance(container, DictVariable):
            r = item.as_example() in container.items
        else:
            raise self.unsupported(f"'in' on {container.describe()}")
        self.push(ConstantVariable(r != bool(inst.arg)))

    def _unary(self, op, name):
        v = self.pop()
        if v.is_constant():
            self.push(ConstantVariable(op(v.as_example())))
        elif isinstance(v, TensorVariable):
            self.push(self.output.call("call_function", op, [v], {}))
        else:
            raise self.unsupported(f"{name} of {v.describe()}")

    @handles("UNARY_NEGATIVE")
    def _unary_negative(self, inst):
        self._unary(operator.neg, "unary -")

    @handles("UNARY_INVERT")
    def _unary_invert(self, inst):
        self._unary(operator.invert, "unary ~")

    @handles("UNARY_POSITIVE", versions=[(3, 11)])
    def _unary_positive(self, inst):
        self._unary(operator.pos, "unary +")

    @handles("UNARY_NOT")
    def _unary_not(self, inst):
        v = self.pop()
        self.push(ConstantVariable(not self.truth(v, "not")))

    @handles("TO_BOOL", versions=[(3, 13)])
    def _to_bool(self, inst):
        v = self.pop()
        self.push(ConstantVariable(self.truth(v, "TO_BOOL")))

    @handles("CALL_INTRINSIC_1", versions=[(3, 12), (3, 13)])
    def _call_intrinsic_1(self, inst):
        if inst.argrepr == "INTRINSIC_LIST_TO_TUPLE":
            v = self.pop()
            self.push(TupleVariable(self.unpack(v)))
        elif inst.argrepr == "INTRINSIC_UNARY_POSITIVE":
            self._unary(operator.pos, "unary +")
        else:
            raise self.unsupported(f"CALL_INTRINSIC_1 {inst.argrepr}")

    @handles("LIST_TO_TUPLE", versions=[(3, 11)])
    def _list_to_tuple(self, inst):
        self.push(TupleVariable(self.unpack(self.pop())))

    # containers -----------------------------------------------------------------------
    @handles("BUILD_TUPLE")
    def _build_tuple(self, inst):
        self.push(TupleVariable(self.popn(inst.arg)))

    @handles("BUILD_LIST")
    def _build_list(self, inst):
        self.push(ListVariable(self.popn(inst.arg)))

    @handles("LIST_EXTEND")
    def _list_extend(self, inst):
        v = self.pop()
        lst = self.stack[-inst.arg]
        if not isinstance(lst, ListVariable):
            raise self.unsupported("LIST_EXTEND on a non-list")
        self.output.record_mutation(lst)
        lst.items.extend(self.iterate(v))

    @handles("LIST_APPEND")
    def _list_append(self, inst):
        v = self.pop()
        lst = self.stack[-inst.arg]
        self.output.record_mutation(lst)
        lst.items.append(v)

    @handles("MAP_ADD")
    def _map_add(self, inst):
        value = self.pop()
        key = self.pop()
        d = self.stack[-inst.arg]
        if not key.is_constant():
            raise self.unsupported("dict comprehension with a non-constant key")
        self.output.record_mutation(d)
        d.items[key.as_example()] = value

    @handles("SET_ADD")
    def _set_add(self, inst):
        item = self.pop()
        s = self.stack[-inst.arg]
        if not isinstance(s, SetVariable) or not item.is_constant():
            raise self.unsupported(f"adding {item.describe()} to a set",
                                   "sets of Python constants are modelled, not sets of tensors")
        self.output.record_mutation(s)
        s.items = SetVariable.of(set(s.as_example()) | {item.as_example()}).items

    @handles("BUILD_SET")
    def _build_set(self, inst):
        items = self.popn(inst.arg)
        if not all(i.is_constant() for i in items):
            raise self.unsupported("a set of non-constant values")
        self.push(SetVariable.of({i.as_example() for i in items}))

    @handles("SET_UPDATE")
    def _set_update(self, inst):
        v = self.pop()
        s = self.stack[-inst.arg]
        items = self.iterate(v)
        if not isinstance(s, SetVariable) or not all(i.is_constant() for i in items):
            raise self.unsupported("a set of non-constant values")
        self.output.record_mutation(s)
        s.items = SetVariable.of(set(s.as_example()) | {i.as_example() for i in items}).items

    @handles("BUILD_MAP")
    def _build_map(self, inst):
        flat = self.popn(2 * inst.arg)
        keys, vals = flat[0::2], flat[1::2]
        if not all(k.is_constant() for k in keys):
            raise self.unsupported("dict with non-constant keys")
        self.push(DictVariable({k.as_example(): v for k, v in zip(keys, vals)}))

    @handles("BUILD_CONST_KEY_MAP")
    def _build_const_key_map(self, inst):
        keys = self.pop()
        vals = self.popn(inst.arg)
        self.push(DictVariable(dict(zip(keys.as_example(), vals))))

    @handles("DICT_MERGE", "DICT_UPDATE")
    def _dict_merge(self, inst):
        v = self.pop()
        d = self.stack[-inst.arg]
        if not isinstance(v, DictVariable) or not isinstance(d, DictVariable):
            raise self.unsupported(f"{inst.opname} with {v.describe()}")
        self.output.record_mutation(d)
        d.items.update(v.items)

    @handles("BUILD_SLICE")
    def _build_slice(self, inst):
        parts = self.popn(inst.arg)
        if all(p.is_constant() and not isinstance(p, SymIntVariable) for p in parts):
            self.push(ConstantVariable(slice(*[p.as_example() for p in parts])))
        else:
            self.push(SliceVariable(parts))

    def subscript(self, obj: VariableTracker, idx: VariableTracker) -> VariableTracker:
        if isinstance(obj, TensorVariable):
            return self.output.call("call_function", operator.getitem, [obj, idx], {})
        if isinstance(obj, BaseListVariable) and idx.is_constant():
            i = idx.as_example()
            if isinstance(i, slice):
                return type(obj)(obj.items[i]) if not isinstance(obj, NamedTupleVariable) \
                    else TupleVariable(obj.items[i])
            return obj.items[i]
        if isinstance(obj, DictVariable) and idx.is_constant():
            return obj.items[idx.as_example()]
        if isinstance(obj, ConstantVariable) and idx.is_constant():
            return ConstantVariable(obj.value[idx.as_example()])
        if isinstance(obj, NNModuleVariable) and idx.is_constant():
            sub = obj.module[idx.as_example()]
            if isinstance(sub, torch.nn.Module):
                for key, m in self.output.members(obj).items():
                    if m is sub:
                        return self.load_module_attr(obj, key)
            raise self.unsupported(f"indexing {type(obj.module).__name__}")
        raise self.unsupported(f"subscript of {obj.describe()} with {idx.describe()}")

    @handles("BINARY_SUBSCR")
    def _binary_subscr(self, inst):
        idx = self.pop()
        obj = self.pop()
        self.push(self.subscript(obj, idx))

    @handles("BINARY_SLICE", versions=[(3, 12), (3, 13)])
    def _binary_slice(self, inst):
        end = self.pop()
        start = self.pop()
        obj = self.pop()
        if start.is_constant() and end.is_constant():
            idx = ConstantVariable(slice(start.as_example(), end.as_example()))
        else:
            idx = SliceVariable([start, end])
        self.push(self.subscript(obj, idx))

    @handles("UNPACK_SEQUENCE")
    def _unpack_sequence(self, inst):
        items = self.unpack(self.pop(), inst.arg)
        for v in reversed(items):
            self.push(v)

    @handles("UNPACK_EX")
    def _unpack_ex(self, inst):
        before, after = inst.arg & 0xFF, inst.arg >> 8
        items = self.unpack(self.pop())
        if len(items) < before + after:
            raise self.unsupported("not enough values to unpack")
        rest = ListVariable(items[before:len(items) - after])
        out = items[:before] + [rest] + items[len(items) - after:]
        for v in reversed(out):
            self.push(v)

    # branches on constants (a branch on a tensor is data-dependent: Unsupported) ------------
    def _cond_jump(self, inst, jump_if: Callable[[VariableTracker], bool]):
        v = self.pop()
        if jump_if(v):
            self.jump_to(inst)

    def _is_none(self, v):
        if isinstance(v, ConstantVariable):
            return v.value is None
        if isinstance(v, NullVariable):
            return True
        if isinstance(v, (TensorVariable, NNModuleVariable, BaseListVariable, DictVariable)):
            return False
        raise self.unsupported(f"'is None' on {v.describe()}")

    @handles("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", versions=[(3, 11)])
    @handles("POP_JUMP_IF_FALSE", versions=[(3, 12), (3, 13)])
    def _pop_jump_if_false(self, inst):
        self._cond_jump(inst, lambda v: not self.truth(v, inst.opname))

    @handles("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE", versions=[(3, 11)])
    @handles("POP_JUMP_IF_TRUE", versions=[(3, 12), (3, 13)])
    def _pop_jump_if_true(self, inst):
        self._cond_jump(inst, lambda v: self.truth(v, inst.opname))

    @handles("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE", versions=[(3, 11)])
    @handles("POP_JUMP_IF_NONE", versions=[(3, 12), (3, 13)])
    def _pop_jump_if_none(self, inst):
        self._cond_jump(inst, self._is_none)

    @handles("POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", versions=[(3, 11)])
    @handles("POP_JUMP_IF_NOT_NONE", versions=[(3, 12), (3, 13)])
    def _pop_jump_if_not_none(self, inst):
        self._cond_jump(inst, lambda v: not self._is_none(v))

    @handles("JUMP_IF_FALSE_OR_POP", versions=[(3, 11)])
    def _jump_if_false_or_pop(self, inst):
        if not self.truth(self.stack[-1], inst.opname):
            self.jump_to(inst)
        else:
            self.pop()

    @handles("JUMP_IF_TRUE_OR_POP", versions=[(3, 11)])
    def _jump_if_true_or_pop(self, inst):
        if self.truth(self.stack[-1], inst.opname):
            self.jump_to(inst)
        else:
            self.pop()

    @handles("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
    def _jump(self, inst):
        self.jump_to(inst)           # backward jumps (loops) raise Unsupported


class UserObjectVariable(VariableTracker):
    """Any other Python object read from the arguments or globals (a config object, a
    dataclass): guarded by identity, its attributes read (and guarded) one by one."""

    def __init__(self, value, source):
        self.value = value
        self.source = source
        self.items = {}          # (so record_mutation can save/restore the overrides)

    @property
    def overrides(self):
        return self.items

    def as_example(self):
        return self.value

    def describe(self):
        return f"{type(self.value).__name__} object"


class SetVariable(BaseListVariable):
    """A set of Python constants made in the frame (a set display or comprehension). Its items
    are kept in the order Python's own set iterates them."""
    python_type = set

    @staticmethod
    def of(values: set) -> "SetVariable":
        return SetVariable([ConstantVariable(v) for v in values])


class SuperVariable(VariableTracker):
    """super(cls, obj) (or the zero-argument form): attribute reads only."""

    def __init__(self, cls: type, obj: VariableTracker):
        self.cls = cls
        self.obj = obj

    def describe(self):
        return f"super({self.cls.__name__})"


class _NoOpCallable(VariableTracker):
    """object.__init__ reached through super(): calling it does nothing."""


def _is_plain_user_class(cls) -> bool:
    """A class written in Python whose instances are ordinary objects (no custom __new__, no
    metaclass, not a torch or builtin type): safe to create inside the trace."""
    if not isinstance(cls, type) or type(cls) is not type:
        return False
    top = cls.__module__.split(".")[0]
    if top in sys.stdlib_module_names or top in ("torch", "builtins", "numpy"):
        return False
    if issubclass(cls, (BaseException, torch.nn.Module, torch.Tensor, tuple, list, dict, set)):
        return False
    if inspect.getattr_static(cls, "__new__") is not object.__new__:
        return False
    return all(k.__dict__.get("__slots__") is None for k in cls.__mro__[:-1])


class _UnboundTensorMethod(VariableTracker):
    """`torch.Tensor.add` used as a function: a call_method node on its first argument."""

    def __init__(self, name):
        self.name = name


# ----------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------
@dataclass
class Capture:
    gm: torch.fx.GraphModule
    example_inputs: List[torch.Tensor]
    get_inputs: Callable[[tuple, dict], List[torch.Tensor]]
    build_output: Callable[[Sequence[torch.Tensor]], Any]
    guard: Callable[[tuple, dict], bool]
    guard_source: str
    code: types.CodeType
    get_inputs_source: str = ""
    input_sources: Optional[List[str]] = None


def _in_exception_block(code: types.CodeType, offset: int) -> bool:
    """Is `offset` covered by the code's exception table (a try body, a with body, a handler)?"""
    parse = getattr(dis, "_parse_exception_table", None)
    if parse is None:
        return False
    return any(e.start <= offset < e.end for e in parse(code))


def _is_impure(node: torch.fx.Node) -> bool:
    if node.op in ("placeholder", "output") or ir.draws_random_numbers(node):
        return True
    if node.op == "call_method":
        name = str(node.target)
        return (name.endswith("_") and not name.endswith("__")) or "out" in node.kwargs
    if node.op == "call_function":
        return node.target in INPLACE_OPERATORS or "out" in node.kwargs or node.is_impure()
    return False


def _rng_states():
    """The state of PyTorch's random-number generators (the CPU's, and each GPU's once CUDA
    is initialized)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)


def _set_rng_states(states) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _effect_templates(output, builder, source_fn):
    effects = []
    for var in output.side_effects:
        if source_fn(var.source) is None:
            raise output.unsupported("a side effect on state outside the frame in a whole-graph capture")
        if isinstance(var, ListVariable):
            effects.append(("list", source_fn(var.source), builder.build(TupleVariable(var.items))))
        else:
            effects.append(("attrs", source_fn(var.source),
                            [(k, builder.build(v)) for k, v in var.items.items()]))
    return effects


def traceable_target(fn) -> Tuple[types.FunctionType, tuple, dict]:
    """guards.frame_target(fn), or Unsupported when there is no bytecode minicompile traces."""
    try:
        func, pre, pre_kw = frame_target(fn)
    except TypeError as e:
        raise Unsupported(f"capture of {type(fn).__name__} {fn!r}",
                          f"only Python functions have bytecode to trace ({e})") from None
    if func.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise Unsupported(f"capture of generator/coroutine {func.__qualname__}")
    return func, pre, pre_kw


def _may_be_dynamic_number(value, source) -> bool:
    """Numbers automatic dynamic applies to, as in TorchDynamo: ints passed as arguments;
    floats passed as arguments or read from globals (module attributes stay specialized)."""
    if type(value) is int:
        return isinstance(source, LocalSource)
    if type(value) is float:
        return isinstance(source, LocalSource) or (
            isinstance(source, ItemSource) and isinstance(source.base, RootSource) and source.base.expr() == "G")
    return False


def trace_segment(fn, args: tuple, kwargs: dict, offset: int = 0, *, breaks: bool = True,
                  eager: bool = False, sources_in_templates: bool = True, dynamic=None):
    """Trace `fn`'s code from `offset` to a return or a graph break -> frame.Segment.

    offset 0: (args, kwargs) are the call's arguments. A resume offset: args is () and kwargs
    the live state at that point (locals by name, the value stack as ___stack0, ...).
    breaks=False: any Unsupported propagates (a whole-graph capture, fullgraph=True).
    eager=True: the frame runs eagerly (Dynamo skipped it): user calls are not inlined and
    any instruction the concrete executor knows is a break."""
    from . import frame as F
    check_python_version()
    kwargs = dict(kwargs or {})
    func, pre, pre_kw = traceable_target(fn)
    code = func.__code__
    if offset == 0:
        args, kwargs = pre + tuple(args), {**pre_kw, **kwargs}
        try:
            binding, values = bind_arguments(func, args, kwargs)
        except TypeError as e:
            raise Unsupported(f"arguments do not match {func.__qualname__}: {e}",
                              "the eager call will raise the same error")
    else:
        names = tuple(sorted(kwargs))
        binding = ArgBinding(0, names, {k: f"kwargs[{k!r}]" for k in names})
        values = dict(kwargs)
    output = OutputGraph(func)
    output.breaks_allowed = breaks
    output.inline_user_calls = not eager
    output.dynamic_policy = dynamic
    output.guards.grad_mode()
    gsrc = None
    if not _is_internal_module_name(func.__globals__.get("__name__", "")):
        gsrc = RootSource("G")          # F.__globals__ in the guard: the called function's
    stack_names = sorted((k for k in values if k.startswith("___stack")), key=lambda k: int(k[8:]))
    lazy = {name: (value, LocalSource(name)) for name, value in values.items()
            if not name.startswith("___stack")}
    tx = InstructionTranslator(output, func, {}, lazy, parent=None, globals_source=gsrc)
    grad = torch.is_grad_enabled()
    ns = output.guards.namespace

    def source_fn(src):
        if not sources_in_templates:
            return None
        expr = compile(src.expr(), "<minicompile source>", "eval")
        return lambda env, e=expr: eval(e, ns, env)

    result = None
    # tracing runs the ops on real values: random ones draw from PyTorch's generator, which
    # is put back as it was, so the compiled code draws what eager would (ir.RANDOM_FUNCTIONS)
    rng = _rng_states()
    try:
        output.tx = tx
        for k in stack_names:
            v = values[k]
            tx.stack.append(NULL if v is F.NULL_VALUE else output.wrap(v, LocalSource(k)))
        if offset:
            tx.pc = tx.offset_to_index[offset]
        try:
            ret = tx.run()
            builder = F.TemplateBuilder(tx, source_fn)
            output.tx = tx
            template = builder.build(ret)
            end, reason, inst, kw = "return", None, None, ()
            effects = _effect_templates(output, builder, source_fn)
        except GraphBreak as gb:
            reason, inst = gb.unsupported, gb.inst
            ok = inst.opname in (F.EXECUTABLE if eager else F.RESUMABLE)
            if eager and offset == 0 and inst.opname == "BEFORE_WITH":
                # an unmodelled context manager met before any break: the whole frame runs
                # for real, so that Python routes exceptions through its __exit__ (entering it
                # for real is the fallback when the frame has already been split)
                ok = False
            why = None
            if _in_exception_block(code, inst.offset):
                # the chain of segments cannot route an exception to the frame's handler (a
                # try block, or the __exit__ of a `with` block): the frame runs for real
                why = "a graph break inside a try or with block: the frame runs eagerly"
            elif tx.with_depth:
                why = "a graph break inside a `with` block is not resumed"
            elif not ok:
                why = f"a graph break at {inst.opname} (not a call or a jump) is not resumed"
            elif not eager and F.maybe_has_backedge(tx):
                why = "graph break in a for/while loop: the frame is skipped, as Dynamo does"
            if why is not None:
                reason.frame_skip = why
                raise reason
            builder = F.TemplateBuilder(tx, source_fn)
            live = F.live_locals(tx, inst.index)
            stack_t = [builder.build(v) for v in gb.stack]
            locals_t = {}
            for name, v in tx.locals.items():
                if name in live:
                    locals_t[name] = builder.build(v)
            for name, (value, src) in tx.lazy_locals.items():
                if name in live:
                    locals_t[name] = ["src", source_fn(src)]
            template = [stack_t, locals_t]
            end, kw = "break", gb.kw_names
            effects = _effect_templates(output, builder, source_fn)
    finally:
        torch._C._set_grad_enabled(grad)
        _set_rng_states(rng)
        output.tx = None
    if torch.is_grad_enabled() != grad:
        torch._C._set_grad_enabled(grad)
    output.tx = tx
    output.graph.output(tuple(p.node for p in builder.proxies))
    output.graph.eliminate_dead_code(is_impure_node=_is_impure)
    gm = torch.fx.GraphModule(output.root_module, output.graph)
    input_exprs = [s.expr() for s in output.input_sources]
    n_calls = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    seg = F.Segment(code=code, offset=offset, gm=gm, example_inputs=list(output.input_examples),
                    end=end, template=template, reason=reason,
                    break_inst=inst, kw_names=kw,
                    offset_to_index=tx.offset_to_index, instructions=tx.instructions,
                    n_calls=n_calls, eager=eager, input_sources=input_exprs, effects=effects)
    seg.guard_builder, seg.binding = output.guards, binding
    seg.use(output.guards.build(binding, input_exprs))
    return seg


def capture(fn, args: tuple, kwargs: dict) -> Capture:
    """Trace ONE call of `fn(*args, **kwargs)` into a single FX graph (fullgraph): anything
    that would be a graph break raises Unsupported. The Capture's `guard` and `get_inputs`
    take later calls of `fn` as (args, kwargs)."""
    seg = trace_segment(fn, args, kwargs, 0, breaks=False, sources_in_templates=False)
    template = seg.template
    from .frame import rebuild
    calls = _CallsOf(fn)

    def build_output(outs):
        return rebuild(template, outs, {})
    cap = Capture(gm=seg.gm, example_inputs=seg.example_inputs,
                  get_inputs=lambda args, kwargs: seg.get_inputs(*calls.frame_call(args, kwargs)),
                  build_output=build_output, guard=_CallGuard(seg.guard, calls),
                  guard_source=seg.guard_source, code=seg.code,
                  get_inputs_source=seg.get_inputs_source, input_sources=seg.input_sources)
    cap.segment = seg
    return cap


class _CallsOf:
    """Calls of one callable as its function's frame sees them: (F, args, kwargs)."""

    def __init__(self, fn):
        self.func, self.pre, self.pre_kw = traceable_target(fn)

    def frame_call(self, args, kwargs):
        return self.func, self.pre + tuple(args), {**self.pre_kw, **kwargs}


class _CallGuard:
    """An entry's generated guard (guards.GuardBuilder.build) for calls of one callable."""

    def __init__(self, guard, calls: _CallsOf):
        self.guard, self.calls = guard, calls
        self.failure_source = guard.failure_source

    def __call__(self, args, kwargs) -> bool:
        return self.guard(*self.calls.frame_call(args, kwargs))

    def failure(self, args, kwargs):
        return self.guard.failure(*self.calls.frame_call(args, kwargs))

    def fail_reason(self, args, kwargs):
        return self.guard.fail_reason(*self.calls.frame_call(args, kwargs))
