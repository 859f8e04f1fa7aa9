"""The output graph: the FX graph under construction, its inputs and its guards.

Takes: from the translator, each value read from outside the frame (with its source) and each
operation on traced values. Hands on: a `torch.fx.Graph` whose placeholders are the values read
(named after their sources, as TorchDynamo names them), the `GuardBuilder` that checks what the
trace relied on, the example value of every node (the op run on the real inputs as the
trace goes; writes run on copies, so tracing never changes the caller's tensors), and the
side effects: the variables of objects from outside the frame the trace changed (lists, dicts,
attributes, globals, closure cells), which frame.Segment makes on the real objects after the
graph, as Dynamo replays its side effects.

`wrap` is TorchDynamo's VariableBuilder: a real value -> the VariableTracker that stands for it,
recording the guard it needs (one object read under two sources is one variable). `call`
records one operation. Symbolic sizes (dynamic shapes) are worked out here on fake tensors,
and comparisons of them answered on the symbols.
"""
from __future__ import annotations

import collections
import copy
import functools
import inspect
import math
import operator
import os
import re
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import sympy
import torch
import torch.fx
from torch.fx.proxy import GraphAppendingTracer
from torch.utils._python_dispatch import TorchDispatchMode

from .. import aliasing, autocast, custom_ops, ir, logs
from ..aliasing import storage_address
from .breaks import Unsupported, never_traced
from .guards import GuardBuilder, display, object_pattern, storage_pattern, viewed_dict
from .sources import (AttrSource, GenericAttrSource, HelperSource, ItemSource, LocalSource, RootSource, Source,
                      item_source)
from .builtin_calls import _BUILTIN_HANDLERS

if TYPE_CHECKING:
    from .translator import InstructionTranslator
from .values import (NULL, AutocastVariable, BaseListVariable, BoundMethodVariable, BuiltinVariable,
                     ClosureCellVariable, ConstantVariable, DictVariable, GlobalWritesVariable, NestedFunctionVariable,
                     PartialVariable, DictViewVariable, GradModeVariable, InferenceModeVariable, IteratorVariable,
                     ListVariable, TensorAttributeWrites,
                     ModelOutputVariable, NamedTupleVariable, NNModuleVariable, OpaqueConstantVariable, SetVariable,
                     PythonModuleVariable, SizeVariable, SliceVariable, SymIntVariable, TensorVariable,
                     TorchFunctionVariable,
                     TupleVariable, TypeVariable, UserFunctionVariable, UserObjectVariable, is_typing_form,
                     VariableTracker, WithExitVariable, example_of, _contains_tensor, _contains_tensor_value,
                     _hashable, is_constant_value, is_identity_key, is_model_output_class, sym_leaves)


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
COMPARE_SYMBOLS = {operator.eq: "==", operator.ne: "!=", operator.lt: "<", operator.le: "<=",
                   operator.gt: ">", operator.ge: ">="}
SIZE_ARITHMETIC = {"+": operator.add, "+=": operator.add, "-": operator.sub, "-=": operator.sub,
                   "*": operator.mul, "*=": operator.mul, "//": operator.floordiv,
                   "//=": operator.floordiv, "%": operator.mod, "%=": operator.mod}


# Arithmetic whose result is a float, on sizes and float inputs (`n / 4`, `lr * 0.5`): a graph
# node, which the backend computes from the sizes as Python would (lowering's scalar_arithmetic)
FLOAT_ARITHMETIC = {"+": operator.add, "+=": operator.add, "-": operator.sub, "-=": operator.sub,
                    "*": operator.mul, "*=": operator.mul, "/": operator.truediv, "/=": operator.truediv}

# Ops that give a list of tensors as long as a size says (x.split(2)): with dynamic shapes they
# specialize the sizes of what they split
SIZED_OUTPUTS = {"split": 2, "chunk": 2, "tensor_split": 2, "unsafe_split": 2, "unsafe_chunk": 2,
                 "unbind": 1, "hsplit": None, "vsplit": None, "dsplit": None}    # -> where dim is passed


# Metadata reads that reveal a size: with dynamic shapes they specialize it (see specialize_sizes)
SIZE_READS = {"size", "numel", "nelement", "stride", "__len__", "storage_offset"}


METADATA_FUNCTIONS = {torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel,
                      len, isinstance,
                      # of dtypes and whether a tensor has dims, which the guards check
                      torch.result_type,
                      # whether an argument overrides torch functions: a tensor subclass, which
                      # the tensor's type guard (`type(x) is Tensor`) already rules out
                      torch._C._has_torch_function, torch._C._has_torch_function_unary,
                      torch._C._has_torch_function_variadic}


# Calls whose effect is outside the tensors they return (the autograd engine filling `.grad`,
# hooks registered on a tensor): run on the example values they would happen once in the
# trace and again when the graph runs, so they break the graph before they run, as in Dynamo.
EFFECT_METHODS = {"backward", "register_hook", "register_post_accumulate_grad_hook"}
EFFECT_FUNCTIONS = {torch.autograd.backward}


class _InputWritten(Exception):
    """An op of the trace would have written memory of a graph input (see _NoInputWrites)."""


class _ExampleOps(TorchDispatchMode):
    """Watches the aten ops that one traced call runs on the example values (the real inputs).
    An op that would write an input's memory in a way capture did not recognise as a write
    (aliasing.written) is stopped before it writes, by its schema (the arguments it marks as
    written): a trace never changes the caller's tensors. An op that draws random numbers
    (tagged nondeterministic_seeded) is noted: its node must run, once, in program order. So is
    an op whose result's sizes depend on the values it reads (_sizes_from_values), and a
    tensor's value read into Python on the way (`torch.zeros(n)`, n a 0-dim tensor: its
    __index__)."""

    def __init__(self, storages):
        super().__init__()
        self.storages = storages          # the inputs' storage pointers (a dict's keys)
        self.draws_random = False
        self.sizes_from_values = None     # the first such op
        self.values_read: set = set()    # ids of the tensors whose values were read

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in torch._dynamo.disable, importing TorchDynamo
        # (seconds) on the first traced op; minicompile's path never needs it
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _made_of_others(func):
            # an op made of others (torch.where(mask) of nonzero, dropout of bernoulli) reaches
            # the mode whole where autograd's keys are off (inference tensors): its parts are
            # watched, as they are where autograd decomposes it first
            with self:                  # (the parts come through this mode again)
                made = func.decompose(*args, **kwargs)
            if made is not NotImplemented:
                return made
        schema = func._schema
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.draws_random = True
        if self.sizes_from_values is None and _sizes_from_values(func, args, kwargs):
            self.sizes_from_values = str(func)
        if func is torch.ops.aten._local_scalar_dense.default:
            self.values_read.add(id(args[0]))
        if schema.is_mutable:
            for i, arg in enumerate(schema.arguments):
                if arg.alias_info is None or not arg.alias_info.is_write:
                    continue
                value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
                for t in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(t, torch.Tensor) and storage_address(t) in self.storages:
                        raise _InputWritten(str(func))
        return func(*args, **kwargs)


@functools.cache
def _made_of_others(func) -> bool:
    """Whether the op is made of other ops (a CompositeImplicitAutograd kernel): asked once per op."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


# ops whose result's sizes come from values they read that torch does not tag so: a packed
# sequence's rows are the sum of its lengths
_SIZES_FROM_VALUES_UNTAGGED = {torch.ops.aten._pack_padded_sequence, torch.ops.aten._pad_packed_sequence}


def _sizes_from_values(func, args, kwargs) -> bool:
    """Whether the op's result has sizes that depend on the values it reads (nonzero, a
    boolean mask as an index, unique, masked_select): the ops torch tags so, but for the cases
    whose sizes the arguments give (integer indices, one_hot's num_classes, repeat_interleave's
    output_size). Traced on the examples, such a size would be baked into the graph."""
    if func.overloadpacket in _SIZES_FROM_VALUES_UNTAGGED:
        return True
    if torch.Tag.dynamic_output_shape not in func.tags:
        return False
    packet = func.overloadpacket
    if packet is torch.ops.aten.index:
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])
    if packet is torch.ops.aten.one_hot:
        return (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) == -1
    if packet is torch.ops.aten.repeat_interleave:
        return kwargs.get("output_size") is None
    return True


def _needs_values(kind, target, args, kwargs) -> bool:
    """Whether an op that read a tensor's value into Python when run on the examples needs
    it: run on fake tensors, which have none (a kernel that reads a value it may, `x.fill_(t)`,
    has a fake version that does not)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    # a mode of its own, with no ShapeEnv: ir.fake_mode()'s builds one, which imports
    # torch._dynamo (seconds, on a first compile that may need no symbol at all)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: ir.fake_of(mode, t), (args, kwargs))
    try:
        with mode:
            if kind == "call_method":
                getattr(args[0], target)(*args[1:], **kwargs)
            else:
                target(*args, **kwargs)
    except Exception:
        return True
    return False


def _of_torch(fn) -> bool:
    return (getattr(fn, "__module__", None) or "").split(".")[0] == "torch"


# functions of torch's that read global state that can change between calls
_STATE_GETTER_PREFIXES = ("get_", "is_", "are_", "has_", "initial_seed", "_get_")


def _state_of_the_trace(fn, args, kwargs) -> bool:
    """A read of state the guard checks at the frame's entry (guards.global_state) and the
    trace's own blocks set after it (`with torch.no_grad():` ... `torch.is_grad_enabled()`):
    the trace's answer holds on every call the guard lets through."""
    if fn in (torch.is_grad_enabled, torch.is_inference_mode_enabled, torch.get_default_dtype):
        return True
    device = args[0] if args else kwargs.get("device_type", "cuda")
    return fn in (torch.is_autocast_enabled, torch.get_autocast_dtype) and device in autocast.DEVICES


def _sets_global_state(fn, name: str) -> bool:
    """torch.set_default_dtype(...), torch.use_deterministic_algorithms(...), torch.seed():
    run for their effect on PyTorch's global state (checked before they run on the examples)."""
    return _of_torch(fn) and (name.startswith(("set_", "use_", "_set_")) or name in ("seed", "manual_seed"))


def _constant_tensors(args, kwargs) -> set:
    """The ids of the example tensors among the arguments whose values the graph computes
    from constants alone (`torch.div(seq_len, w) - 1` of sizes): the same on every call the
    guards let through (no input, parameter or random number above them)."""
    ids = set()
    for v in _leaves(list(args) + list(kwargs.values())):
        if not isinstance(v, TensorVariable):
            continue
        todo, seen, constant = [v.as_proxy().node], set(), True
        while todo and constant:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            constant = node.op not in ("placeholder", "get_attr") and not node.meta.get("draws_random")
            todo += node.all_input_nodes
        if constant:
            ids.add(id(v.example))
    return ids


_TORCH_MODULE_PREFIXES = ("torch", "_operator", "operator", "math")


def _is_torch_callable(v) -> bool:
    """A function of torch's (or operator's, math's) that a call of becomes one graph node. A
    lambda or a function made inside another has no name a graph can call it by, unless its
    module holds it under its name (F.max_pool2d, made by boolean_dispatch): it is traced like
    the user's."""
    if isinstance(v, type):
        return False
    mod = getattr(v, "__module__", None) or ""
    if isinstance(v, types.FunctionType) and ("<lambda>" in v.__qualname__ or "<locals>" in v.__qualname__) \
            and getattr(sys.modules.get(mod), v.__name__, None) is not v:
        return False
    if isinstance(v, (types.BuiltinFunctionType, types.FunctionType, torch._ops.OpOverloadPacket,
                      torch._ops.OpOverload)):
        return mod.split(".")[0] in _TORCH_MODULE_PREFIXES and not _is_module_method(v)
    return False


def _copies_alike(s: set) -> bool:
    """Whether a copy of s iterates in s's order, in a table of its size (where hashes collide,
    a set's order hangs on its history, which a copy does not have): then the trace's copy
    changes as s does."""
    copied = s.copy()
    return list(copied) == list(s) and sys.getsizeof(copied) == sys.getsizeof(s)


def _made_per_call(fn) -> bool:
    """A user's function made by running code (a closure, a lambda, a function defined in
    another), which a caller may make anew for each call: not one of torch's."""
    return isinstance(fn, types.FunctionType) and ("<locals>" in fn.__qualname__ or "<lambda>" in fn.__qualname__) \
        and not _is_internal_module_name(fn.__globals__.get("__name__", "")) and never_traced(fn) is None \
        and not _is_torch_callable(fn)


def _is_module_method(fn) -> bool:
    """A method of one of torch's nn.Module classes read from the class (SqueezeBERT's
    `nn.LayerNorm.forward(self, x)`): Python to inline like the module's own call, not an op."""
    owner = getattr(sys.modules.get(getattr(fn, "__module__", None) or ""), fn.__qualname__.split(".")[0], None) \
        if isinstance(fn, types.FunctionType) and "." in fn.__qualname__ else None
    return isinstance(owner, type) and issubclass(owner, torch.nn.Module)


def _plain_tensor_type(cls) -> bool:
    """A tensor class whose operations are torch.Tensor's (Parameter, Buffer...), not its own
    __torch_function__ or __torch_dispatch__ (a tensor subclass's)."""
    function = getattr(cls.__torch_function__, "__func__", cls.__torch_function__)
    return function in (torch.Tensor.__torch_function__.__func__, torch._C._disabled_torch_function_impl) and \
        cls.__torch_dispatch__ is torch._C._disabled_torch_dispatch_impl


# a Python type given as a dtype (torch.zeros(n, dtype=int)): the dtype eager makes of it
_PYTHON_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool, complex: torch.complex128}


def _python_dtype(v) -> Optional[ConstantVariable]:
    """The torch dtype for a variable standing for float, int, bool or complex; else None."""
    if isinstance(v, (BuiltinVariable, TypeVariable)) and v.value in _PYTHON_DTYPES:
        return ConstantVariable(_PYTHON_DTYPES[v.value])
    return None


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
        # id -> (dict or list, its variable): one variable per mutable container however the
        # trace reaches it, so that a change made through one path is seen through the others
        self._containers: Dict[int, Tuple[Any, VariableTracker]] = {}
        self._last_placeholder: Optional[torch.fx.Node] = None
        # the placeholders' sets of dynamic dims that were not empty (emptied in place when
        # the trace specializes a dim): checked before every op
        self._dynamic_dims: List[set] = []
        self._roots: Dict[int, RootSource] = {}
        # the memory of the graph's tensor inputs: storage pointer -> the inputs' sources;
        # and the sources of inputs whose memory the trace writes (guard_written_inputs)
        self.input_storages: Dict[Any, List[Source]] = {}
        self.written_inputs: set = set()
        # id of each tensor input -> (it, its first source, its dynamic dims)
        self._input_tensors: Dict[int, tuple] = {}
        self.tensor_keys: List[TensorVariable] = []    # the call's tensors used as dict keys
        # an op was traced where the frame catches what it raises (a try or with body, here
        # or in a caller inlined): see Segment.rerun_on_raise
        self.ops_under_handler = False
        self._tensor_writes: Dict[str, TensorAttributeWrites] = {}    # tensor_attribute_writes
        # torch.inference_mode() blocks the trace is inside: PyTorch's guards, entered for real
        # (the examples made there are inference tensors), innermost last; `inference_blocks`:
        # whether the trace entered one (Segment.inference_outputs)
        self.inference_guards: list = []
        self.inference_blocks = False
        self.module_sources: set = set()       # sources of the modules read (their ints stay static)
        # the captured frame's globals: read as `G` (the called function's own) by the guard
        self.root_globals = root_func.__globals__
        self._tx = None                                         # the frame running now (tx)
        self.running: List["InstructionTranslator"] = []      # it and those waiting on it
        self.generators: List[VariableTracker] = []           # those started in the trace
        # in-place changes to containers made in the trace: (variable, old items), so that
        # a graph break inside an inlined call can roll the trace back to the call site
        self.undo_log: List[Tuple[VariableTracker, Any]] = []
        # objects from outside the frame changed by the trace (global lists, attributes):
        # the changes are made on the real objects after the graph runs
        self.side_effects: List[VariableTracker] = []
        self.entry_modes: Optional[tuple] = None     # (grad mode, autocast state) at the frame's entry
        # the lists, dicts and other objects read from outside the frame: id -> (the object,
        # its variable)
        self._containers: Dict[int, Tuple[Any, VariableTracker]] = {}
        # closure cells and globals dicts the trace reads or writes: id -> their variable
        self.cells: Dict[int, ClosureCellVariable] = {}
        self._global_writes: Dict[int, GlobalWritesVariable] = {}
        # inline user functions and modules (False in a frame run eagerly: every user call
        # is then made for real, and the callee compiled on its own, as Dynamo does)
        self.inline_user_calls = True
        # dynamic shapes: (source expression, tensor) -> the dims to make dynamic (set by the
        # caller: dynamic=True, automatic dynamic, mark_dynamic); None: every shape is static
        self.dynamic_policy: Optional[Callable] = None
        self.breaks_allowed = False          # root-frame Unsupported -> GraphBreak
        self.leaf_breaks = False             # a graph-made tensor made to require grad: a break
        self.instruction_budget = 200_000     # unrolled loops: a bound, not a hang

    @property
    def tx(self) -> Optional["InstructionTranslator"]:
        return self._tx() if self._tx is not None else None

    @tx.setter
    def tx(self, tx) -> None:
        # held weakly: the frame holds the graph, and a cycle back would keep what the trace
        # read (a generator, the call's tensors) alive past the trace, until a collection
        self._tx = weakref.ref(tx) if tx is not None else None

    def tensor_attribute_writes(self, source: Source, make: bool = True):
        """The TensorAttributeWrites of the call's tensor at `source` (made, and a side effect,
        on first use where `make`; else None where the trace wrote none of its attributes)."""
        key = source.expr()
        var = self._tensor_writes.get(key)
        if var is None and make:
            var = self._tensor_writes[key] = TensorAttributeWrites(source)
            self.add_side_effect(var)
        return var

    def leave_inference_mode(self, depth: int) -> None:
        """Exit the inference-mode blocks entered for real past the first `depth` (the block
        ends, or the trace leaves it at a break)."""
        while len(self.inference_guards) > depth:
            self.inference_guards.pop().__exit__(None, None, None)

    def record_mutation(self, var: VariableTracker):
        if hasattr(var, "state"):                 # an iterator: its position
            self.undo_log.append((var, var.state()))
        elif isinstance(var.items, dict):
            self.undo_log.append((var, dict(var.items)))
        else:
            self.undo_log.append((var, list(var.items)))

    def rollback(self, mark: int):
        while len(self.undo_log) > mark:
            var, old = self.undo_log.pop()
            if hasattr(var, "state"):
                var.restore(old)
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

    def advanced(self, it: IteratorVariable) -> None:
        """An iterator from outside the frame gives items: the real one gives as many after the
        graph (a side effect)."""
        if it.source is not None:
            self.add_side_effect(it)

    def global_writes(self, f_globals, source: Source) -> GlobalWritesVariable:
        """The assignments the trace made to this globals dict (STORE_GLOBAL), or to this
        class's attributes."""
        var = self._global_writes.get(id(f_globals))
        if var is None:
            var = self._global_writes[id(f_globals)] = GlobalWritesVariable(source)
            var.owner = f_globals
        return var

    def class_write(self, cls: type, name: str) -> Optional[VariableTracker]:
        """What the trace assigned to `name` on cls or a base it inherits it from, or None
        (where a class before it in the MRO has its own)."""
        for klass in cls.__mro__:
            var = self._global_writes.get(id(klass))
            if var is not None and name in var.items:
                return var.items[name]
            if name in klass.__dict__:
                return None
        return None

    def add_side_effect(self, var: VariableTracker) -> None:
        """`var` came from outside the frame and the trace changes it: the change is made on the
        real object after the graph runs."""
        if var not in self.side_effects:
            self.side_effects.append(var)

    def instance_dict(self, obj: VariableTracker, kind: str = "__dict__") -> Optional[VariableTracker]:
        """The variable of obj's own __dict__ (or a module's `kind`: _parameters, _buffers,
        _modules) where the trace read it (`obj.__dict__`, vars(), `self._buffers`).
        Attributes the trace sets are kept apart from it (obj's overrides): callers refuse to
        let the two disagree."""
        if getattr(obj, "source", None) is None:
            return None
        return next((self._by_source[s.expr()] for s in (AttrSource(obj.source, kind),
                                                         GenericAttrSource(obj.source, kind))
                     if s.expr() in self._by_source), None)

    def is_container(self, var: VariableTracker) -> bool:
        """Whether `var` is an object of the call that wrap keeps one variable for, however
        many sources it is read under."""
        return any(v is var for _, v in self._containers.values())

    def guard_container_aliasing(self) -> None:
        """An object the trace changed (a list, a dict, an object's attributes) is no other
        object of its type the trace read: a later call that passes one list twice (where the
        trace saw two) must not reuse a trace that changed only one of them. (One object read
        under two sources is one variable, and that is guarded where it is found: wrap.)"""
        for var in self.side_effects:
            mine = next((value for value, v in self._containers.values() if v is var), None)
            for value, other in self._containers.values():
                if mine is not None and other is not var and type(value) is type(mine):
                    self.guards.same_object(var.source, other.source, False)

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
        if dynamic and ir.gapped_layout(value.shape, value.stride()) is None:
            dynamic = set()          # strides not a function of the sizes: static (see guards)
        node.meta["dynamic_dims"] = dynamic
        if dynamic:
            self._dynamic_dims.append(dynamic)
        self._last_placeholder = node
        seen = self._input_tensors.setdefault(id(value), (value, source, dynamic))
        if seen[1] is not source:
            # one tensor under two sources (f(x, x)): a call with two tensors is another entry
            # (TorchDynamo's duplicate-input guard), as the graph may take them for one (the
            # joint graph of training does: one gradient, one tensor; with dynamic dims, one
            # set of size symbols)
            self.guards.same_object(seen[1], source, True)
        self.input_sources.append(source)
        self.input_examples.append(value)
        self.input_storages.setdefault(storage_address(value), []).append(source)
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
        self._dynamic_dims.append(node.meta["dynamic_dims"])
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
        if tensors:
            # inputs made static already (a number read as an int a second time): nothing to do
            static = {id(n) for n in self.root_graph.nodes if n.op == "placeholder"} - inputs
            tensors = [t for t in tensors if id(t.node) not in static]
            if not tensors:
                return
        dims = {id(n): set(n.meta["dynamic_dims"]) for n in nodes}
        if tensors and all(id(t.node) in inputs for t in tensors):
            # the sizes of inputs: those dims alone (one read by `x.size(1)` says nothing of dim 0)
            dims = {}
            for t in tensors:
                dims.setdefault(id(t.node), set()).update(
                    {t.dim} if hasattr(t, "dim") else t.node.meta["dynamic_dims"])
            nodes = list({id(t.node): t.node for t in tensors}.values())
        where = ""
        if self.tx is not None:
            f, line, text = self.tx.user_stack()[-1]
            where = f" ({os.path.basename(f)}:{line}: {text.strip()})"
        for n in nodes:
            static = dims[id(n)] & n.meta["dynamic_dims"]
            if static:
                logs.log("dynamic", f"{n.meta['source_expr']}: dims {sorted(static)} made static: {why}{where}")
                n.meta["dynamic_dims"].difference_update(static)

    def _fix_piece_count(self, name: str, args, kwargs) -> None:
        """split, chunk, unbind... give as many tensors as a size says: where that size is
        dynamic, the Python the trace runs on them depends on it, so it becomes static (and a
        split size, a count of chunks, guarded by value). split(x, [1, n - 1]) gives as many
        as its list holds, each as long as it says: its sizes stay symbolic."""
        t, at = args[0], SIZED_OUTPUTS[name]
        sections = args[1] if len(args) > 1 else kwargs.get("split_size_or_sections", kwargs.get("split_size"))
        if name == "split" and isinstance(sections, BaseListVariable):
            return
        if at is None:                      # hsplit, vsplit, dsplit: a dim of their own
            d = {"vsplit": 0, "hsplit": 1 if t.example.dim() > 1 else 0, "dsplit": 2}[name]
        else:
            d = kwargs.get("dim", args[at] if len(args) > at else ConstantVariable(0)).as_example()
        if self._is_dynamic_dim(t, d % t.example.dim()):
            self.specialize_dim(t, d % t.example.dim(), f"{name}() gives as many tensors as dim {d}'s size says")
        for v in sym_leaves(list(args[1:]) + list(kwargs.values())):
            v.as_example()

    def specialize_dim(self, t: "TensorVariable", d: int, why: str) -> None:
        """specialize_sizes for one dim of t: the input dims its size is computed from (in the
        graph so far on fake tensors), not all of them (qkv.chunk(3, -1) of a projection fixes
        the hidden size, not the batch's and the sequence's)."""
        reads = None
        if t.node.op != "placeholder":
            try:
                size = self._fake_value(t.node).shape[d]
                reads = self._input_dims(size.node.expr) if isinstance(size, torch.SymInt) else None
            except Exception:          # (the graph so far does not run on fake tensors)
                reads = None
        else:
            reads = [types.SimpleNamespace(node=t.node, dim=d)]
        self.specialize_sizes(reads if reads else [t], why)

    def _input_dims(self, expr) -> Optional[list]:
        """The input dims a size expression reads ((node, dim) namespaces); None where a symbol
        is not an input's dim."""
        shape_env = self._fake[0].shape_env
        by_name = {n.name: n for n in self.root_graph.nodes if n.op == "placeholder"}
        found = []
        for sym in expr.free_symbols:
            sources = shape_env.var_to_sources.get(sym)
            src = sources[0] if sources else None
            node = by_name.get(getattr(getattr(src, "base", src), "source_name", None))
            if node is None or not hasattr(src, "idx"):
                return None
            found.append(types.SimpleNamespace(node=node, dim=src.idx))
        return found

    # -- sizes read by the traced code, with dynamic shapes ------------------------------
    def has_dynamic_inputs(self) -> bool:
        return any(self._dynamic_dims)

    def size_of(self, t: TensorVariable, d: int) -> VariableTracker:
        """x.size(d) as the traced code sees it: a constant when that size cannot change
        between calls of this entry, else a SymIntVariable (a `size` node in the graph)."""
        d = d % max(t.example.dim(), 1)
        if not self._is_dynamic_dim(t, d):
            return ConstantVariable(t.example.size(d))
        proxy = self.tracer.create_proxy("call_method", "size", (t.as_proxy(), d), {})
        self._set_meta(proxy.node, t.example.size(d))
        # read from an input: the one dim it reveals; from another tensor: the input dims its
        # size is made of (else all of them)
        if t.node.op == "placeholder":
            deps = [types.SimpleNamespace(node=t.node, dim=d)]
        else:
            try:
                size = self._fake_value(t.node).shape[d]
            except Exception:       # (no fake run: _is_dynamic_dim assumed it dynamic)
                size = None
            deps = self._input_dims_of(size.node.expr.free_symbols) if isinstance(size, torch.SymInt) else None
        return SymIntVariable(proxy, t.example.size(d), deps or [t], self.specialize_sizes)

    def shape_of(self, t: TensorVariable) -> VariableTracker:
        return SizeVariable([self.size_of(t, d) for d in range(t.example.dim())])

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
        if isinstance(fake.shape[d], torch.SymInt):
            return True
        self._specialized_by_shape_functions()
        return False

    def _float_arguments(self, name: str, floats: List[SymIntVariable], leaves: list) -> None:
        """Float graph inputs given to an op: static (guarded by value) where the op may take one
        as a size (arange's end, interpolate's scale: the fake tensors cannot follow it). Where it
        is a value of elements, eager converts it to the tensors' dtype, and many ops refuse one
        past that dtype's range ("value cannot be converted to type float without overflow",
        clamp's bound, add's alpha): the guard keeps it within range, and one past it is static,
        so the op's own check runs on it."""
        widths = [torch.finfo(v.example.dtype).max for v in leaves if isinstance(v, TensorVariable)
                  and v.example.dtype in (torch.float32, torch.float16, torch.bfloat16)]
        for v in floats:
            if not _float_is_a_value(name):
                v.as_example()
                continue
            if not widths:
                continue
            limit = min(widths)
            text = self._number_text(v)
            if text is None or math.isfinite(v.example) and abs(v.example) > limit:
                v.as_example()
            else:
                self.guards.shape_condition(f"(-{limit!r} <= {text} <= {limit!r} or abs({text}) == 1e999 or "
                                            f"{text} != {text})", f"{text} is within the range of the tensors' dtype")

    def _specialized_by_shape_functions(self) -> None:
        """Sizes PyTorch's shape functions made constants as the graph ran on fake tensors
        (unfold's size, a pooling's kernel, linspace's steps: `Eq(s, 3)` in the shape
        environment): a size the trace reads is then a constant only at that value, so those
        inputs become static (guarded by value), as if the trace had read them."""
        replaced = [sym for sym, value in self._fake[0].shape_env.replacements.items()
                    if getattr(value, "is_Integer", False)]
        read = [dep for dep in self._input_dims_of(replaced) or () if dep.node.meta.get("dynamic_dims")]
        if read:
            self.specialize_sizes(read, "PyTorch's shape function of an op needs its value")

    def _input_dims_of(self, symbols) -> Optional[list]:
        """The graph inputs' dims (and int inputs) that these size symbols of the fake run
        stand for, as specialize_sizes takes them; None where one stands for none."""
        shape_env = self._fake[0].shape_env
        by_name = {n.name: n for n in self.root_graph.nodes if n.op == "placeholder"}
        dims = []
        for sym in symbols:
            sources = shape_env.var_to_sources.get(sym)
            if not sources:
                return None
            for src in sources:            # (one symbol for sizes equal in the trace: each of them)
                node = by_name.get(getattr(getattr(src, "base", src), "source_name", None))
                if node is None:
                    return None
                dims.append(types.SimpleNamespace(node=node, dim=src.idx) if hasattr(src, "idx")
                            else types.SimpleNamespace(node=node))
        return dims

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
            if id(value) in self._containers:
                # one object read under two sources: one variable, so that a change through
                # either is seen through both (and the guard checks they are one)
                var = self._containers[id(value)][1]
                self.guards.same_object(source, var.source, True)
            else:
                var = self._wrap(value, source)
                if type(value) in (list, dict, set) or isinstance(var, (UserObjectVariable, NestedFunctionVariable)):
                    self._containers[id(value)] = (value, var)
            self._by_source[key] = var
            return var
        return self._wrap(value, None)

    def _numbers_one_by_one(self, value, source: Source) -> Optional[VariableTracker]:
        """A torch.Size, a slice, or a tuple of numbers and slices (an index) the call passes in
        (a distribution's batch shape, monai's sliding windows, an interpolation's output size,
        loss weights): its numbers read one by one, each as automatic dynamic takes a number
        argument, so one that changes becomes symbolic rather than a graph per value. None where
        none is (the whole is then a constant, its parts guarded)."""
        if type(value) is slice:
            self.guards.type_check(source, slice)
            parts = [self.wrap(getattr(value, a), AttrSource(source, a)) for a in ("start", "stop", "step")]
            return SliceVariable(parts) if any(isinstance(p, SymIntVariable) for p in parts) else None
        self.guards.sequence(source, value)
        items = [self.wrap(v, ItemSource(source, i)) for i, v in enumerate(value)]
        if not any(isinstance(v, (SymIntVariable, SliceVariable)) for v in items):
            return None
        return SizeVariable(items, source) if type(value) is torch.Size else TupleVariable(items, source)

    def _wrap(self, value, source: Optional[Source]) -> VariableTracker:
        g = self.guards
        if isinstance(value, torch.Tensor):
            if not _plain_tensor_type(type(value)):
                raise self.unsupported(f"a tensor of class {type(value).__qualname__}, which overrides "
                                       "__torch_function__ or __torch_dispatch__",
                                       "its operations do what its class says, which the graph does not "
                                       "model: they run as Python")
            if source is None:
                raise self.unsupported(f"a tensor constant of unknown origin ({type(value).__name__})",
                                       "only tensors reachable from the arguments, globals or "
                                       "modules can become graph inputs")
            return self.add_input(value, source)
        if self.dynamic_policy and _may_be_dynamic_number(value, source, self.module_sources) \
                and self.dynamic_policy(source.expr(), value):
            return self.add_number_input(value, source)
        if (type(value) in (slice, torch.Size) or type(value) is tuple and value and
                all(type(i) in (slice, int, float) or i is None or i is Ellipsis for i in value)) \
                and self.dynamic_policy and _from_the_arguments(source, self.module_sources):
            var = self._numbers_one_by_one(value, source)
            return var if var is not None else ConstantVariable(value, source)
        if is_constant_value(value):
            if source is not None:
                g.constant(source, value)
            return ConstantVariable(value, source)
        if isinstance(value, torch.nn.Module):
            if source is not None:
                g.module(source, value)
                self.module_sources.add(source.expr())
            return NNModuleVariable(value, source)
        if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
            if source is not None:
                g.sequence(source, value)
            items = [self.wrap(v, ItemSource(source, i) if source else None)
                     for i, v in enumerate(value)]
            return (TupleVariable if isinstance(value, tuple) else ListVariable)(items, source)
        if isinstance(value, tuple) and isinstance(getattr(type(value), "_fields", None), tuple):
            # a namedtuple with values that are not all constants (else it is one)
            if source is not None:
                g.type_check(source, type(value))
            return NamedTupleVariable([self.wrap(v, ItemSource(source, i) if source else None)
                                       for i, v in enumerate(value)], type(value), source)
        if source is not None and is_model_output_class(type(value)):
            g.type_check(source, type(value))
            g.mapping_keys(source, value)
            return ModelOutputVariable(type(value), {k: self.wrap(value[k], AttrSource(source, k))
                                                     for k in value.keys()}, source)
        if type(value) is set and source is not None and len(value) <= _SET_ITEMS_GUARDED \
                and all(is_constant_value(x) for x in value) and _copies_alike(value):
            # a set from outside the frame (the names a registry has seen): its items, in the
            # order it iterates them, are guarded; the trace changes a copy of it, and what it
            # does is made on the real one after the graph, its operations replayed
            g.set_items(source, value)
            var = SetVariable(functools.partial(set.copy, value.copy()))
            var.source = source
            return var
        if type(value) in (dict, collections.OrderedDict) or type(value) is types.MappingProxyType and \
                source is not None and all(is_constant_value(v) or is_identity_key(v) for v in value.values()):
            # (a mappingproxy of constants: an Enum's __members__, read only: translator.mutate)
            if not all(is_constant_value(k) or is_identity_key(k) for k in value):
                raise self.unsupported("a dict with non-constant keys")
            if source is not None:
                g.dict_keys(source, value)
            return DictVariable({k: self.wrap(v, None if source is None else item_source(source, k, i))
                                 for i, (k, v) in enumerate(value.items())}, source, cls=type(value))
        from .frame import NULL_VALUE
        if value is NULL_VALUE:
            return NULL
        if isinstance(value, (inspect.Signature, inspect.Parameter)) and source is not None or \
                isinstance(value, re.Pattern):
            # immutable (made once, by a decorator; a compiled regular expression, packaging's
            # Version._regex, whose class attribute is guarded where it has no source): its
            # methods run on it for real
            if source is not None:
                g.identity(source, value, type(value).__name__)
            return OpaqueConstantVariable(value, source)
        if type(value) in (torch.no_grad, torch.enable_grad):
            # a grad-mode context manager object (@torch.no_grad() on a method keeps one)
            if source is not None:
                g.type_check(source, type(value))      # (which of the two it is, the graph says)
            var = GradModeVariable(type(value) is torch.enable_grad)
            var.source = source          # (entered: a break passes on this very object)
            return var
        if type(value) is torch.inference_mode:
            # (@torch.inference_mode() on a function keeps one: its wrapper calls its clone)
            if source is not None:
                g.type_check(source, type(value))
                g.constant(AttrSource(source, "mode"), value.mode)
            var = InferenceModeVariable(value.mode)
            var.source = source
            return var
        if isinstance(value, types.MethodType) and type(value.__self__) in (torch.no_grad, torch.enable_grad) \
                and value.__func__ is type(value.__self__).__exit__ and source is not None:
            # the exit of a grad-mode block a break was inside (frame.py's "gradexit"): the
            # rest of the block runs in the trace, and its end puts back the mode from before
            prev = value.__self__.prev
            g.constant(AttrSource(AttrSource(source, "__self__"), "prev"), prev)
            return WithExitVariable(lambda tx: tx.set_grad(prev), grad_before=prev)
        if isinstance(value, types.MethodType) and type(value.__self__) is torch.autocast \
                and value.__func__ is torch.autocast.__exit__ and source is not None:
            # the exit of an autocast block a break was inside (frame.py's "autocastexit"),
            # entered for real: the rest of the block is traced in the state this call is in
            # (guarded as any entry's), and its exit breaks the graph, to run for real
            made = value.__self__
            var = WithExitVariable(autocast=AutocastVariable(made.device, made.fast_dtype, made._enabled,
                                                             made._cache_enabled))
            var.source = source
            return var
        if isinstance(value, _DICT_VIEWS) and source is not None:
            # a dict's keys()/values()/items() from outside the frame: a view of its dict
            # (the dict's own variable where the trace has it already: a change made to it in
            # the trace shows in the view)
            g.type_check(source, type(value))
            kind = next(k for t, k in zip(_DICT_VIEWS, ("keys", "values", "items")) if isinstance(value, t))
            if type(viewed_dict(value)) is dict:
                # the dict itself: one variable with the dict where the trace reads that too
                return DictViewVariable(self.wrap(viewed_dict(value), HelperSource("VIEWED_DICT", source)), kind)
            mapping, map_src = value.mapping, AttrSource(source, "mapping")
            g.mapping_keys(map_src, mapping)
            d = DictVariable({k: self.wrap(v, item_source(map_src, k, i)) for i, (k, v) in enumerate(mapping.items())},
                             map_src)
            return DictViewVariable(d, kind)
        if type(value) in _READABLE_ITERATORS and source is not None:
            # an iterator from outside the frame (or across a graph break): its remaining items
            # read from a copy of it (it is not advanced); what the trace takes from it is taken
            # from the real one after the graph (an effect)
            g.type_check(source, type(value))
            remaining = list(copy.copy(value))
            advanced = getattr(self.dynamic_policy, "iterator_advanced", None)
            if advanced is not None and advanced(source.expr(), len(remaining)):
                return UserObjectVariable(value, source)
            items_src = HelperSource("REMAINING", source)
            g.sequence(items_src, remaining)
            return IteratorVariable([self.wrap(v, ItemSource(items_src, i)) for i, v in enumerate(remaining)],
                                    source=source, python_type=type(value))
        if type(value) is functools.partial:
            # its function and arguments, each read (and guarded) through the partial's source
            if source is not None:
                g.type_check(source, functools.partial)
            part = lambda name: AttrSource(source, name) if source is not None else None  # noqa: E731
            args = self.wrap(value.args, part("args"))
            args = [ConstantVariable(a) for a in args.value] if args.is_constant() else args.items
            keywords = self.wrap(value.keywords, part("keywords"))
            return PartialVariable(self.wrap(value.func, part("func")), args, keywords, source)
        # (a method of a Cython class, numpy.random.rand: a bound method whose function has a
        # code object with no bytecode, is an object like any other: called, a graph break)
        python_method = isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType)
        known = (isinstance(value, (types.ModuleType, types.FunctionType, type, functools._lru_cache_wrapper))
                 or python_method or _is_torch_callable(value) or (_hashable(value) and value in _BUILTIN_HANDLERS))
        if source is None and not known and not isinstance(value, _BUILTIN_CALLABLES):
            # an object the trace reached by no path a guard can follow again (a global of a
            # Python helper of torch's, a default argument): the guard holds the object itself,
            # and checks what the trace reads of it as for any other object
            source = self.root_source(value, f"OBJ_{type(value).__name__}")
        if source is not None and not known:
            if is_identity_key(value):
                # an Enum's member (a typing form): it may stand for itself, a dict's key
                g.identity(source, value, type(value).__name__)
                if is_typing_form(value):
                    return ConstantVariable(value, source)     # (data: compared, read, a key)
            else:
                g.type_check(source, type(value))     # its attributes are guarded one by one
            return UserObjectVariable(value, source)
        if source is not None and _made_per_call(value):
            return self._function_by_code(value, source)
        if python_method and source is not None:
            # a bound method is made anew by each attribute read (`self.get_decay` passed on):
            # guarded by its function, its object through its own source
            g.type_check(source, types.MethodType)
            g.identity(AttrSource(source, "__func__"), value.__func__, "function")
            self_var = self.wrap(value.__self__, AttrSource(source, "__self__"))
            return BoundMethodVariable(value.__func__, self_var, source)
        # callables and modules: guarded by identity when read from a guardable place
        if source is not None:
            g.identity(source, value, type(value).__name__)
        if value in _BUILTIN_HANDLERS if _hashable(value) else False:
            return BuiltinVariable(value, source)
        if isinstance(value, types.ModuleType):
            return PythonModuleVariable(value, source)
        if _is_torch_callable(value) and never_traced(value) is None:
            return TorchFunctionVariable(value, source)
        if isinstance(value, (types.FunctionType, functools._lru_cache_wrapper)):
            return UserFunctionVariable(value, source)
        if python_method:
            self_var = self.wrap(value.__self__, AttrSource(source, "__self__") if source else None)
            return BoundMethodVariable(value.__func__, self_var, source)
        if isinstance(value, type):
            if source is None and value.__module__ != "builtins":
                # a class reached through no guarded place (`cls` of a classmethod called on an
                # instance, type() of an object made in the frame): held by the guard, so that
                # what the trace reads of it is guarded and what it writes is made on it
                source = self.root_source(value, f"CLASS_{value.__name__}")
            return TypeVariable(value, source)
        raise self.unsupported(f"a value of type {type(value).__qualname__}",
                               "only tensors, Python constants, tuples/lists/dicts, functions "
                               "and nn.Modules can be traced so far")

    def _function_by_code(self, fn: types.FunctionType, source: Source) -> NestedFunctionVariable:
        """A function made at run time (a closure, a lambda) that the call passes in: each call
        may pass a new one, so it is guarded by its code, as TorchDynamo's CLOSURE_MATCH, and its
        defaults and cells are read through its source (guarded as the trace reads them)."""
        g = self.guards
        g.type_check(source, types.FunctionType)
        g.identity(AttrSource(source, "__code__"), fn.__code__, "code")
        g.identity(AttrSource(source, "__globals__"), fn.__globals__, "globals")
        defaults = self.wrap(fn.__defaults__, AttrSource(source, "__defaults__"))
        kwdefaults = self.wrap(fn.__kwdefaults__, AttrSource(source, "__kwdefaults__"))
        if isinstance(kwdefaults, ConstantVariable) and fn.__kwdefaults__ is not None:
            kwdefaults = DictVariable({k: ConstantVariable(v) for k, v in fn.__kwdefaults__.items()})
        cells = []
        for i, cell in enumerate(fn.__closure__ or ()):
            var = self.cells.get(id(cell))
            if var is None:
                cell_source = ItemSource(AttrSource(source, "__closure__"), i)
                var = self.cells[id(cell)] = ClosureCellVariable(cell, cell_source,
                                                                 AttrSource(cell_source, "cell_contents"))
            cells.append(var)
        var = NestedFunctionVariable(fn.__code__, fn.__globals__, fn.__qualname__,
                                     defaults if fn.__defaults__ is not None else None,
                                     kwdefaults if fn.__kwdefaults__ is not None else None,
                                     TupleVariable(cells) if fn.__closure__ else None)
        var.source, var.real = source, fn
        return var

    def unsupported(self, reason, explanation="", hint="") -> Unsupported:
        stack = self.tx.user_stack() if self.tx is not None else []
        return Unsupported(reason, explanation, hint, stack)

    # -- graph nodes --------------------------------------------------------------------
    def call(self, kind: str, target, args: Sequence[VariableTracker],
             kwargs: Dict[str, VariableTracker], floats_traced: bool = False) -> VariableTracker:
        """Run `target` on the example values and, if tensors are involved, record a node.
        floats_traced: what the call does with its float arguments was traced (an
        autograd.Function's forward and backward), which read them as values or made them static:
        those left symbolic stay so."""
        out = kwargs.get("out")
        if isinstance(out, ConstantVariable) and out.value is None:
            # out=None is no `out` (a library's default passed on: linear_operator's cholesky_ex)
            kwargs = {k: v for k, v in kwargs.items() if k != "out"}
        if _python_dtype(kwargs.get("dtype")) is not None:
            kwargs = {**kwargs, "dtype": _python_dtype(kwargs["dtype"])}
        if kind == "call_method" and target == "to" and len(args) > 1 and _python_dtype(args[1]) is not None:
            args = [args[0], _python_dtype(args[1]), *args[2:]]
        if kind == "call_method" and target == "type" and len(args) == 2 and not kwargs and \
                isinstance(args[1], TypeVariable) and type(args[1].value).__name__ == "tensortype" and \
                isinstance(args[0], TensorVariable):
            # x.type(torch.FloatTensor), a legacy tensor type (TAPAS): its dtype, on the CPU or,
            # for torch.cuda's, a GPU (x's own where it is on one)
            legacy, device = args[1].value, args[0].example.device
            device = device if legacy.is_cuda and device.type == "cuda" else torch.device("cuda" if legacy.is_cuda else "cpu")
            target, args = "to", [args[0], ConstantVariable(device), ConstantVariable(legacy.dtype)]
        if kind == "call_function" and target in (torch.tensor, torch.as_tensor, torch.scalar_tensor) \
                and len(args) == 1 and isinstance(args[0], SymIntVariable) and type(args[0].example) is float \
                and set(kwargs) <= {"dtype", "device", "requires_grad"}:
            # torch.tensor(v) of a float input: a fill, so that v stays symbolic (a graph per
            # value otherwise), in the dtype torch.tensor gives a float
            kwargs = {**kwargs, "dtype": kwargs.get("dtype") or ConstantVariable(torch.get_default_dtype())}
            target, args = torch.full, [ConstantVariable(()), args[0]]
        if (kind, target) in (("call_method", "detach_"), ("call_function", torch.detach_)) and len(args) == 1 \
                and not kwargs and isinstance(args[0], TensorVariable) and args[0].source is None \
                and args[0].example._base is None:
            # s.detach_() of a tensor the graph made: from here on it stands for s.detach() (every
            # reference to it sees that; views made before keep their history, as eager's do)
            t = args[0]
            made = self.call("call_function", torch.detach, [t], {})
            t.proxy, t.example = made.proxy, made.example
            return t
        has_tensor = _contains_tensor(list(args) + list(kwargs.values()))
        if kind == "call_method" and isinstance(target, str) and target.startswith("__") \
                and target.endswith("__") and callable(getattr(operator, target, None)):
            # x.__setitem__(i, v), x.__iadd__(y): the operator they stand for (the same write)
            kind, target = "call_function", getattr(operator, target)
        name = target if kind == "call_method" else getattr(target, "__name__", str(target))
        # an argument a graph node cannot hold: a Python function (associative_scan...: run on
        # the examples, it would run once more than eager runs it), or another object
        # (clip_grad_norm_(model.parameters()): run on the examples, the call would act on the
        # real one, a generator drained, gradients scaled, and then have no node to record). A
        # Python helper of torch's is traced instead; anything else runs as Python at a graph
        # break, once, as in eager
        containers: list = []
        leaves = _leaves(list(args) + list(kwargs.values()), containers)
        python_fn = next((v for v in leaves if isinstance(
            v, (UserFunctionVariable, NestedFunctionVariable, BoundMethodVariable, PartialVariable,
                NNModuleVariable))), None)
        opaque = python_fn or next((v for v in leaves if not _has_graph_form(v)), None) or \
            next((c for c in containers if _is_python_named_tuple(c)), None)
        if opaque is not None:
            what = f"takes a Python function ({opaque.describe()})" if python_fn is not None else \
                f"with {opaque.describe()}, which a graph cannot hold"
            err = self.unsupported(f"{name}() {what}", "the call runs as Python, at a graph break")
            err.python_result = True
            raise err
        if args and isinstance(args[0], TensorVariable) and self.has_dynamic_inputs():
            sized = self._dynamic_size_call(kind, target, args, kwargs)
            if sized is not None:
                return sized
        if has_tensor or kind == "call_function" and _of_torch(target):
            floats = [v for v in sym_leaves(list(args) + list(kwargs.values())) if type(v.example) is float]
            if floats and not floats_traced:
                self._float_arguments(name, floats, leaves)
        ex_args = [example_of(a) for a in args]
        ex_kwargs = {k: example_of(v) for k, v in kwargs.items()}
        if has_tensor and (kind == "call_method" and target in EFFECT_METHODS or
                           kind == "call_function" and _hashable(target) and target in EFFECT_FUNCTIONS):
            raise self.unsupported(f"{name}(): an effect outside the tensors it returns",
                                   "it runs once, as Python, at a graph break")
        if has_tensor and kind == "call_function" and target is torch.autograd.grad and any(
                isinstance(x, torch.Tensor) and x.grad_fn is not None for x in self.input_examples):
            # run on the examples, it would go back through the caller's autograd graph too, and
            # free it (and run its hooks) before the call itself does
            raise self.unsupported(f"{name}() where a graph input has autograd history",
                                   "it runs once, as Python, at a graph break")
        if not has_tensor and kind == "call_function" and _sets_global_state(target, name):
            raise self.unsupported(f"{name}() sets PyTorch's global state",
                                   "called for its effect: it runs as Python at a graph break, on every call")
        if any(isinstance(v, torch.Generator) for v in [*ex_args, *ex_kwargs.values()]):
            # drawing from it here would advance it for real: the call runs at a break instead
            raise self.unsupported(f"{name}() with an explicit torch.Generator",
                                   "random numbers from a generator object run as Python")
        writes = has_tensor and self._writes(kind, target, args, kwargs, ex_args, ex_kwargs)
        out_given, returned = ex_kwargs.get("out"), None
        if out_given is not None:
            # written on copies, and back only if the sizes stay: an `out=` of other sizes is
            # resized by PyTorch, which the graph cannot model (and the examples must not see).
            # Whether it is hangs on the sizes: static, guarded by value
            if self.has_dynamic_inputs():
                self.specialize_sizes([v for v in leaves if isinstance(v, TensorVariable)],
                                      f"{name}(out=...) resizes its out tensor where the sizes differ")
                for v in sym_leaves(leaves):
                    v.as_example()
            ex_kwargs["out"] = _map_tensors(lambda t: t.clone(), out_given)
        try:
            with _ExampleOps(self.input_storages) as watch:
                if kind == "call_method":
                    result = getattr(ex_args[0], target)(*ex_args[1:], **ex_kwargs)
                else:
                    result = target(*ex_args, **ex_kwargs)
        except Unsupported:
            raise
        except _InputWritten as e:
            err = self.unsupported(f"{name}() writes into an input through {e}",
                                   "a write minicompile does not model runs as Python, at a graph break")
            err.python_result = True      # (a Python function of torch's is traced: its writes are)
            raise err from None
        except Exception as e:
            raise self.unsupported(f"{name}() raised {type(e).__name__}: {e}",
                                   "running the operation on the example inputs failed; "
                                   "eager execution will raise the same error") from e
        if watch.sizes_from_values is not None:
            # as TorchDynamo (without capture_dynamic_output_shape_ops): the op runs at a graph
            # break and its result is an input of the graph that follows
            raise self.unsupported(f"{name}(): the sizes of its result depend on tensor values "
                                   f"({watch.sizes_from_values})",
                                   "a graph has one size for each value it computes")
        if watch.values_read and _contains_tensor_value(result) and \
                target not in (operator.getitem, operator.setitem) and \
                not watch.values_read <= _constant_tensors(args, kwargs) and \
                _needs_values(kind, target, ex_args, ex_kwargs):
            # (an index tensor is read by the kernel; a slice's tensor bound breaks before:
            # InstructionTranslator.no_tensor_bounds)
            # as TorchDynamo, whose fake tensors have no value to give
            raise self.unsupported(f"{name}() reads a tensor's value as a Python number (a size, "
                                   f"an index or a bound given as a tensor)",
                                   "the graph would keep the value of this call's tensor",
                                   "pass a Python int, or keep the computation in tensors")
        if out_given is not None:
            if _shape_of(out_given) != _shape_of(ex_kwargs["out"]):
                raise self.unsupported(f"{name}(out=...) resizes its out tensor",
                                       "a write that changes a tensor's size runs as Python")
            for given, written in zip(_tensors_of(out_given), _tensors_of(ex_kwargs["out"])):
                given.copy_(written)
            if result is not None and aliasing.returns_written(kind, target, args, kwargs, _constant):
                returned, result = result, out_given
        if writes and (result is None or aliasing.returns_written(kind, target, args, kwargs, _constant)) \
                or target is custom_ops.check:
            # kept in the graph for its write; what it returns is what it wrote (`x.add_(1)`
            # is x: the same variable, so `y is x` and `self.buf += 1` hold as in eager), or
            # nothing (x[i] = v, or a check that raises, custom_ops.check)
            node = self.tracer.create_proxy(kind, target, self.lift(tuple(_graph_arg(a) for a in args)),
                                            self.lift({k: _graph_arg(v) for k, v in kwargs.items()})).node
            # (every node has its example: a graph without one for each is run again on fake
            # tensors, where an op whose size depends on values, such as nonzero, cannot run)
            self._set_meta(node, result)
            if watch.draws_random:
                node.meta["draws_random"] = True
            if result is None:
                return ConstantVariable(None)
            where = aliasing.written(kind, target, args, kwargs, lambda v: isinstance(v, TensorVariable), _constant)
            written = aliasing.locate(where[0], args, kwargs)
            if isinstance(returned, tuple) and type(returned) is not tuple and isinstance(written, TupleVariable):
                # out=(values, indices): the same tensors, in the op's own result type (max_out)
                return NamedTupleVariable(list(written.items), type(returned))
            return written
        if not _contains_tensor_value(result):
            for sym in sym_leaves(list(args) + list(kwargs.values())):
                sym.as_example()                 # a Python result of a size: specialized
            if name in SIZE_READS or target in (torch.numel, len):
                self.specialize_sizes([a for a in args if isinstance(a, TensorVariable)],
                                             f"the trace read {name}()")
            if name == "storage_offset" and args and isinstance(args[0], TensorVariable):
                # (the tensor guards check sizes and strides, not where in its memory a tensor
                # begins): each input whose memory it is, at its offset
                for source in self.input_storages.get(storage_address(args[0].example), ()):
                    example = self.input_examples[self.input_sources.index(source)]
                    self.guards.shape_condition(f"{source.expr()}.storage_offset() == {example.storage_offset()}",
                                                f"{display(source.expr())}.storage_offset() == {example.storage_offset()}")
            if has_tensor and not (name in METADATA_METHODS or target in METADATA_FUNCTIONS):
                err = self.unsupported(
                    f"data-dependent operation {name}() (returns {type(result).__name__})",
                    "its Python result depends on tensor values, which a graph cannot bake in",
                    "keep the value as a tensor, or move this out of the compiled region")
                err.python_result = True
                raise err
            if not is_constant_value(result):
                raise self.unsupported(f"{name}() returned a {type(result).__name__}")
            if not has_tensor and kind == "call_function" and _of_torch(target):
                if result is None and not name.startswith("_"):
                    # (torch.save(state, path), torch.cuda.synchronize(); a private helper,
                    # F._none_or_dtype, torch._assert, is taken as it answers)
                    raise self.unsupported(f"{name}() returns None: called for its effect",
                                           "it runs as Python at a graph break, on every call")
                if name.startswith(_STATE_GETTER_PREFIXES) and not _state_of_the_trace(target, ex_args, ex_kwargs):
                    # PyTorch's global state read (torch.get_num_threads()): asked again by the
                    # guard, as the trace folds the answer in
                    label = "STATE_" + re.sub(r"[^A-Za-z0-9]+", "_", name)
                    while label in self.guards.namespace:
                        label += "_"
                    self.guards.add_root(label, functools.partial(target, *ex_args, **ex_kwargs))
                    self.guards.constant(RootSource(f"{label}()"), result)
            return ConstantVariable(result)
        if isinstance(result, (tuple, list)) and name in SIZED_OUTPUTS and args and \
                isinstance(args[0], TensorVariable) and self.has_dynamic_inputs():
            self._fix_piece_count(name, args, kwargs)
        proxy = self.tracer.create_proxy(kind, target, self.lift(tuple(_graph_arg(a) for a in args)),
                                         self.lift({k: _graph_arg(v) for k, v in kwargs.items()}))
        self._set_meta(proxy.node, result)
        if watch.draws_random:
            proxy.node.meta["draws_random"] = True
        var = self._wrap_result(proxy, result)
        for a, example in zip(args, ex_args):
            if isinstance(var, TensorVariable) and isinstance(a, TensorVariable) and result is example:
                # the op gave its input back (x.contiguous() of a contiguous x, x.to(x.dtype)):
                # `y is x` holds, as in eager
                var.same_as = a
        return var

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

    def sym_compare(self, op, a: VariableTracker, b: VariableTracker) -> Optional[bool]:
        """`a < b` (any comparison) where a size is symbolic, answered without making the size
        static, as TorchDynamo answers it: true (or false) for every size the graph takes (each
        dynamic size is at least 2) needs no guard; otherwise the example's answer is taken and
        becomes a condition of the guard (`x.size(2) > 3`), so another answer recompiles. None
        where the sizes cannot be worked out symbolically."""
        from torch.fx.experimental.symbolic_shapes import statically_known_true
        if any(isinstance(v, SymIntVariable) and type(v.example) is float for v in (a, b)):
            return self._float_compare(op, a, b)
        try:
            fa, fb = self._sym_fake(a), self._sym_fake(b)
            cond = op(fa, fb)
        except Exception:
            return None
        if isinstance(cond, bool):
            return cond
        if statically_known_true(cond):
            return True
        if statically_known_true(torch.sym_not(cond)):
            return False
        answer = bool(op(example_of(a), example_of(b)))
        text = self._shape_condition_text(cond.node.expr if answer else sympy.Not(cond.node.expr))
        if text is None:
            return None
        self.guards.shape_condition(text, text)
        return answer

    def _float_compare(self, op, a: VariableTracker, b: VariableTracker) -> Optional[bool]:
        """A comparison of a float computed from sizes or float inputs (`if n / 4 > 2.5`,
        `if weight_decay != 0`) with a number or another one: the example's answer, and a guard
        that the comparison still gives it, its float arithmetic written in the order the code
        did it (so to the bit as the code computes it). None where a side is neither (the caller
        specializes)."""
        symbol = COMPARE_SYMBOLS.get(op)
        sides = [self._number_text(v) for v in (a, b)]
        if symbol is None or None in sides:
            return None
        answer = bool(op(example_of(a), example_of(b)))
        text = f"({sides[0]} {symbol} {sides[1]})"
        self.guards.shape_condition(text if answer else f"not {text}", text)
        return answer

    def _number_text(self, v) -> Optional[str]:
        """A number of the trace (a variable, a graph node or a constant) as Python over the
        frame's inputs: a float input by its source, float arithmetic node by node, an integer
        size by its expression in the sizes; None where it cannot be written so."""
        if isinstance(v, SymIntVariable):
            v = v.proxy.node
        elif isinstance(v, ConstantVariable):
            v = v.value
        if not isinstance(v, torch.fx.Node):
            return repr(v) if type(v) in (int, float) and math.isfinite(v) else None
        example = v.meta.get("example_value")
        if type(example) is int:
            try:
                fake = self._fake_value(v)
            except Exception:
                return None
            if type(fake) is int:
                return repr(fake)
            text = self._shape_condition_text(fake.node.expr)
            return None if text is None else f"({text})"          # (an operand of what reads it)
        if type(example) is not float:
            return None
        if v.op == "placeholder":
            return v.meta["source_expr"]
        operands = [self._number_text(a) for a in v.args]
        spelling = ir.PYTHON_SPELLINGS.get(v.target)
        if None in operands or v.kwargs or spelling is None or spelling.count("{}") != len(operands):
            return None
        return spelling.format(*operands)

    def _sym_fake(self, v: VariableTracker):
        if isinstance(v, SymIntVariable):
            return self._fake_value(v.proxy.node)
        if isinstance(v, ConstantVariable) and type(v.value) is int:
            return v.value
        raise TypeError(v.describe())

    def _shape_condition_text(self, expr) -> Optional[str]:
        """A condition on size symbols as Python over the inputs' sources (`L['x'].size(2) > 3`)."""
        from torch.utils._sympy.printers import PythonPrinter
        shape_env = self._fake[0].shape_env
        by_name = {n.name: n for n in self.root_graph.nodes if n.op == "placeholder"}
        names = {}
        for sym in expr.free_symbols:
            sources = shape_env.var_to_sources.get(sym)
            if not sources:
                return None
            src = sources[0]
            base = getattr(src, "base", src)
            node = by_name.get(getattr(base, "source_name", None))
            if node is None:
                return None
            expr_src = node.meta["source_expr"]
            names[sym] = sympy.Symbol(f"{expr_src}.size({src.idx})" if hasattr(src, "idx") else expr_src)
        return PythonPrinter().doprint(expr.xreplace(names))

    def made_of_constants(self, t: "TensorVariable") -> bool:
        """Whether a tensor of the trace is made from constants alone (VITS's
        torch.IntTensor([hidden_size])[0]): no input, nothing random, nothing written in place
        before it, so its value is the example's at every call."""
        seen, todo = set(), [t.proxy.node]
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            if node.op in ("placeholder", "get_attr") or ir.draws_random_numbers(node) or aliasing.node_writes(node):
                return False
            todo.extend(node.all_input_nodes)
        # (a value written in place later is another node: the one read here is this one's)
        return not any(n not in seen and any(i in seen for i in n.all_input_nodes) and aliasing.node_writes(n)
                       for n in self.root_graph.nodes)

    def sym_arith(self, op, *operands: VariableTracker) -> VariableTracker:
        """Arithmetic on sizes (or float inputs), at least one of them symbolic: a graph node."""
        def static():
            for v in sym_leaves(list(operands)):
                v.as_example()               # static, guarded by value

        try:
            example = op(*map(example_of, operands))
        except ArithmeticError as e:        # (n // 0): the trace now depends on the values
            static()
            raise self.tx.observed(e) from None
        if type(example) is int and not ir.INT64_MIN <= example <= ir.INT64_MAX:
            # the kernels compute ints in int64, Python exactly: a result past int64 is made
            # here, from the operands' values
            static()
            return ConstantVariable(example)
        proxy = self.tracer.create_proxy("call_function", op, tuple(v.as_proxy() for v in operands), {})
        self._set_meta(proxy.node, example)
        deps = [t for v in operands if isinstance(v, SymIntVariable) for t in v.deps]
        result = SymIntVariable(proxy, example, deps, self.specialize_sizes)
        if type(example) is int and (abs(example) > 2 ** 31 or any(not isinstance(t, TensorVariable) for t in deps)):
            # an int input (unbounded, unlike a size) or a large result: that it stays in
            # int64 on the calls to come is a condition of the guard (else a recompile
            # makes it above); one that cannot be written so makes the operands static
            text = self._number_text(result)
            if text is None:
                static()
                return ConstantVariable(example)
            self.guards.shape_condition(f"{ir.INT64_MIN} <= {text} <= {ir.INT64_MAX}", f"{text} fits in int64")
        return result

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
        if self.inference_blocks:
            node.meta["inference_mode"] = torch.is_inference_mode_enabled()
        if self.tx is not None:
            fn, lineno, text = self.tx.location()
            node.meta["source"] = (fn, lineno, text)
            node.meta["function"] = self.tx.code.co_name
            if not self.ops_under_handler:
                self.ops_under_handler = self.tx.under_handler()
            node.meta["stack_trace"] = "".join(
                f'  File "{f}", line {l}, in {n}\n    {t}\n' for f, l, t, n in self.tx.full_stack())

    def _wrap_result(self, proxy: torch.fx.Proxy, result) -> VariableTracker:
        if isinstance(result, torch.Tensor) and not _plain_tensor_type(type(result)):
            raise self.unsupported(f"an operation gave a tensor of class {type(result).__qualname__}, "
                                   "which overrides __torch_function__ or __torch_dispatch__")
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
                    err = self.unsupported(f"an operation returned a {type(r).__name__} inside a "
                                           f"{type(result).__name__}")
                    err.python_result = True        # (a Python helper of torch's is traced)
                    raise err
            if isinstance(result, list):
                return ListVariable(items)
            if type(result) is tuple:
                return TupleVariable(items)
            return NamedTupleVariable(items, type(result))
        raise self.unsupported(f"an operation returned a {type(result).__name__}")

    def _writes(self, kind, target, args, kwargs, ex_args, ex_kwargs):
        """A call that writes tensors in place (aliasing.written) is kept in the graph, as
        Dynamo keeps it (the backend makes the write, on every call: functionalize.py). Where
        what it writes shares memory with a graph input, the example op runs on a copy:
        tracing must never change the caller's tensors."""
        where = aliasing.written(kind, target, args, kwargs, lambda v: isinstance(v, TensorVariable),
                                 _constant)
        if not where:
            return False
        name = target if isinstance(target, str) else getattr(target, "__name__", target)
        if name == "detach_":
            raise self.unsupported("detach_() of a tensor from outside the graph, or of a view",
                                   "what autograd records of the caller's tensors is changed as Python")
        if aliasing.writes_metadata(kind, target):
            raise self.unsupported(f"in-place {name} changes a tensor's sizes or strides",
                                   "only writes of values are modelled")
        sources = None
        for loc in where:
            example = aliasing.locate(loc, ex_args, ex_kwargs)
            if not isinstance(example, torch.Tensor):
                continue
            if sources is None:
                sources = [t for t in torch.utils._pytree.tree_leaves((ex_args, ex_kwargs)) if isinstance(t, torch.Tensor)]
            region = _written_region(kind, target, example, ex_args)
            # eager refuses these (or writes in its kernel's order): run as Python, they do
            # what eager does
            if any(t is not example and aliasing.partly_overlaps(region, t) for t in sources):
                raise self.unsupported(f"in-place {name} reads memory it writes, through another view",
                                       "runs as Python, at a graph break")
            address = storage_address(example)
            inputs = self.input_storages.get(address)
            # (a written input gets its new value whole: its own elements must be apart too,
            # and so must a tensor `x[index] = v` writes into, which gets its new value whole)
            if aliasing.overlaps_itself(region) or aliasing.overlaps_itself(example) or inputs is not None and any(
                    aliasing.overlaps_itself(x) for x in self.input_examples if storage_address(x) == address):
                raise self.unsupported(f"in-place {name} into a tensor whose elements share memory",
                                       "runs as Python, at a graph break")
            if example.is_inference() and not torch.is_inference_mode_enabled():
                # eager refuses it ("Inplace update to inference tensor outside InferenceMode"):
                # run for real at a break, it raises there
                raise self.unsupported(f"in-place {name} on an inference tensor outside inference mode")
            if torch.is_grad_enabled() and example.requires_grad and \
                    (example.is_leaf or example._base is not None and example._base.is_leaf):
                # eager raises (a leaf that requires grad, or a view of one, written in place):
                # run for real at a break, it raises there with eager's message
                raise self.unsupported(f"in-place {name} on a leaf tensor that requires grad")
            if inputs is None:
                continue
            self.written_inputs.update(inputs)
            copy = example.clone()
            if loc[0] == "arg":
                ex_args[loc[1]] = copy
            elif loc[0] == "kwarg":
                ex_kwargs[loc[1]] = copy
            else:
                holder = ex_args if loc[0] == "item" else ex_kwargs
                holder[loc[1]] = list(holder[loc[1]])
                holder[loc[1]][loc[2]] = copy
        return True

    def guard_tensor_keys(self) -> None:
        """The call's tensors the trace used as dict keys: a dict holds one key for one object,
        so the guard checks they are one object where they were (values.tensor_keys_to)."""
        by_source = {v.source.expr(): v for v in self.tensor_keys}
        if len(by_source) > 1:
            keys = list(by_source.values())
            self.guards.object_pattern([v.source for v in keys], object_pattern(*[v.example for v in keys]))

    def guard_written_inputs(self) -> None:
        """The graph writes inputs: the backend's functional graph is right only while the
        inputs share memory as they did in the trace (written inputs that share it with
        another input run on PyTorch's kernels), so the guard checks that pattern."""
        if not self.written_inputs:
            return
        tensors = [(s, v) for s, v in zip(self.input_sources, self.input_examples)
                   if isinstance(v, torch.Tensor)]
        pattern = storage_pattern(*[v for _, v in tensors])
        self.guards.storage_pattern([s for s, _ in tensors], pattern)


def _written_region(kind, target, example: torch.Tensor, ex_args) -> torch.Tensor:
    """What an in-place call writes of its tensor `example`: all of it, or for
    `x[index] = v` the view the index selects (an index of tensors selects copies: all of x)."""
    if kind == "call_function" and target is operator.setitem and ex_args[0] is example:
        try:
            with torch.no_grad():
                region = example[ex_args[1]]
        except Exception:                # noqa: BLE001 (eager's own error comes from the call)
            return example
        # (a view shares x's memory; _base would say so too, but an inference tensor's views
        # are not tracked)
        if isinstance(region, torch.Tensor) and storage_address(region) is not None and \
                storage_address(region) == storage_address(example):
            return region
    return example


def _leaves(vars_, containers: Optional[list] = None) -> list:
    """The variables in vars_, with the items of lists, tuples and dicts among them (the
    lists, tuples and dicts flattened are added to `containers` when it is given)."""
    out = []
    for v in vars_:
        if isinstance(v, (BaseListVariable, DictVariable)):
            if containers is not None:
                containers.append(v)
            out += _leaves(v.items if isinstance(v, BaseListVariable) else list(v.items.values()), containers)
        else:
            out.append(v)
    return out


def _has_graph_form(v: VariableTracker) -> bool:
    """Whether a graph node can take v as an argument (a tensor, a size, a constant...)."""
    try:
        v.as_proxy()
    except NotImplementedError:
        return False
    return True


def _is_python_named_tuple(v: VariableTracker) -> bool:
    """A namedtuple of a Python class (a PackedSequence, whose fields and methods the callee
    reads): a graph holds it as a plain tuple."""
    return isinstance(v, NamedTupleVariable) and hasattr(v.tuple_cls, "_fields")


# operator's names for the ATen ops they call (x / a is aten.div)
_OPERATOR_ATEN = {"truediv": "div", "floordiv": "floor_divide", "mod": "remainder"}


# a set from outside the frame up to this size is read (and guarded) item by item; a larger
# one is an object whose operations run at a graph break
_SET_ITEMS_GUARDED = 64


# ops that take a float as a value of elements, whatever tags a torch version gives them
_FLOAT_VALUE_OPS = {"fill", "fill_", "full", "full_like", "new_full", "leaky_relu", "elu", "celu",
                    "softplus", "hardtanh", "threshold", "hardshrink", "softshrink", "clamp", "clip",
                    "lerp", "addcmul", "addcdiv", "nan_to_num", "masked_fill", "where"}


@functools.lru_cache(maxsize=None)
def _float_is_a_value(name: str) -> bool:
    """Whether an op takes a float argument as a value of its elements only, never as
    something that sets a size: a pointwise op (ATen's tag), a foreach one, a fill. A float
    graph input stays symbolic in those; any other op gets its value."""
    if name.startswith("_foreach_") or name in _FLOAT_VALUE_OPS:
        return True
    base = name.strip("_")
    for candidate in (base, base[1:]):             # (__rmul__, __itruediv__)
        packet = getattr(torch.ops.aten, _OPERATOR_ATEN.get(candidate, candidate), None)
        if isinstance(packet, torch._ops.OpOverloadPacket) and \
                any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads()):
            return True
    return False


def _graph_arg(v: VariableTracker):
    """An argument as the graph holds it: NumPy's scalars as Python's (the same to torch)."""
    p = v.as_proxy()
    return p.item() if isinstance(p, np.generic) else p


def _constant(v):
    """A traced argument's Python value, where it is a constant (for aliasing's flags)."""
    return v.value if isinstance(v, ConstantVariable) else v


def _map_tensors(fn, value):
    """fn applied to a tensor, or to each tensor of a list/tuple (the rest kept)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(fn(v) if isinstance(v, torch.Tensor) else v for v in value)
    return value


def _tensors_of(value) -> list:
    return [value] if isinstance(value, torch.Tensor) else \
        [v for v in value if isinstance(v, torch.Tensor)] if isinstance(value, (list, tuple)) else []


def _shape_of(out) -> list:
    """The sizes of the tensors of an `out=` argument (a tensor or a sequence of them)."""
    return [tuple(t.shape) for t in _tensors_of(out)]


_DICT_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


# callables written in C: one capture does not model stays a break where it is read
_BUILTIN_CALLABLES = (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodWrapperType,
                      types.MethodDescriptorType, types.ClassMethodDescriptorType)


# iterators whose copy (copy.copy) is independent of them: their remaining items can be read
# without advancing them
_READABLE_ITERATORS = tuple({type(iter(c)) for c in ([], (), range(1), "", b"")} | {type(reversed([]))})


def _may_be_dynamic_number(value, source, module_sources=frozenset()) -> bool:
    """Numbers automatic dynamic applies to, as in TorchDynamo: ints and floats reached from
    the frame's arguments (an argument, an item or attribute of one: a cache's length, a
    learning rate), floats from its globals too (a statistic a dict holds), but not through an
    nn.Module (its attributes stay specialized)."""
    if type(value) not in (int, float):
        return False
    s = _base_past_modules(source, module_sources)
    return isinstance(s, LocalSource) or type(value) is float and isinstance(s, RootSource) and s.expr() == "G"


def _from_the_arguments(source, module_sources) -> bool:
    """Whether `source` reads from the frame's arguments (not through an nn.Module): where a
    torch.Size, a slice or a tuple of slices holds ints automatic dynamic may take one by one."""
    return isinstance(_base_past_modules(source, module_sources), LocalSource)


def _base_past_modules(source, module_sources):
    """The root `source` reads from (an argument, the globals), or None through a module."""
    s = source
    while isinstance(s, (AttrSource, ItemSource)):
        s = s.base
        if s.expr() in module_sources:
            return None
    return s


_MISSING = object()


def _data_of(t: torch.Tensor) -> torch.Tensor:
    """t.data: a detach whose version counter is its own (writes through it leave t's as it was)."""
    return t.data


class NodeByNode:
    """A traced graph run node by node, each node calling its target: eager's results, as
    torch.fx.Interpreter gives them (not the graph module's own code, which names a function
    by its qualified name: a lambda or a local function has none that imports). It is on the
    path of every call of a frame that runs eagerly or a graph with no ops, where the
    Interpreter's per-run progress bar and per-node method dispatch cost more than the graph
    (an optimizer step's two such frames: about 0.4 ms a step on 2 CPU cores). An op's
    exception is raised as the op raised it."""

    def __init__(self, gm: torch.fx.GraphModule):
        nodes = list(gm.graph.nodes)
        slot = {n: i for i, n in enumerate(nodes)}
        self.steps = []          # (op, what to call or fetch, args, kwargs, slot)
        self.placeholders = []   # (slot, default or _NO_DEFAULT)
        self.output = None
        for n in nodes:
            args = torch.fx.node.map_arg(n.args, lambda m: _Slot(slot[m]))
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda m: _Slot(slot[m]))
            if n.op == "placeholder":
                self.placeholders.append((slot[n], args[0] if args else _NO_DEFAULT))
            elif n.op == "get_attr":
                value = gm
                for part in n.target.split("."):
                    value = getattr(value, part)
                self.steps.append(("value", value, (), {}, slot[n]))
            elif n.op == "call_module":
                self.steps.append(("call", gm.get_submodule(n.target), args, kwargs, slot[n]))
            elif n.op == "call_method" and n.meta.get(aliasing.OWN_VERSION_COUNTER):
                self.steps.append(("call", _data_of, args, kwargs, slot[n]))    # `x.data`, traced as a detach
            elif n.op == "call_method":
                self.steps.append(("method", n.target, args, kwargs, slot[n]))
            elif n.op == "call_function":
                self.steps.append(("call", n.target, args, kwargs, slot[n]))
            elif n.op == "output":
                self.output = args[0]
        self.size = len(nodes)
        # a graph whose code flattens its inputs and unflattens its outputs (a pytree codegen):
        # as the Interpreter, through the graph's own processing
        self.graph = gm.graph if type(gm.graph._codegen) is not torch.fx.graph.CodeGen else None

    def __call__(self, *inputs):
        if self.graph is not None:
            inputs = self.graph.process_inputs(*inputs)
        env = [None] * self.size
        if len(inputs) > len(self.placeholders):
            raise TypeError(f"a graph of {len(self.placeholders)} inputs called with {len(inputs)}")
        for i, (at, default) in enumerate(self.placeholders):
            if i < len(inputs):
                env[at] = inputs[i]
            elif default is _NO_DEFAULT:
                raise TypeError(f"a graph of {len(self.placeholders)} inputs called with {len(inputs)}")
            else:
                env[at] = default

        def fetch(a):
            return env[a.index] if type(a) is _Slot else a
        for op, target, args, kwargs, at in self.steps:
            if op == "value":
                env[at] = target
                continue
            args = torch.fx.node.map_aggregate(args, fetch)
            kwargs = torch.fx.node.map_aggregate(kwargs, fetch)
            env[at] = getattr(args[0], target)(*args[1:], **kwargs) if op == "method" else target(*args, **kwargs)
        out = torch.fx.node.map_aggregate(self.output, fetch)
        return out if self.graph is None else self.graph.process_outputs(out)


class _Slot:
    """A node's value in NodeByNode's environment, by position."""
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


_NO_DEFAULT = object()
