"""Symbolic values: what sits on the interpreter's stack and in its locals.

Takes: real Python objects (wrapped by the tracer's `wrap`) and results of traced operations.
Hands on: `VariableTracker`s the opcode handlers combine. Each knows
  - `as_proxy()`:   what to put in an FX node's args (an fx.Proxy for tensors, the value for
                    constants, containers of those);
  - `as_example()`: the real value, so each traced op can be run on real example inputs (this
                    is what TorchDynamo does with fake tensors; real tensors are fine here);
  - `source`:       where it came from, if it came from outside the trace (for guards).

A tensor is always a TensorVariable holding an fx.Proxy plus its example value; any other
Python value the graph cannot hold must be a constant (specialized and guarded by value) or a
container of variables. Anything else is a callable the interpreter knows how to call
(user functions are inlined, torch functions become graph nodes, nn.Modules inline forward),
an object whose attributes the trace reads and writes (one from outside the frame, or one made
in it: objects, exceptions, generators), or what the trace changes outside the frame
(`items`: its state, which OutputGraph.record_mutation saves and restores; iterators,
generators and exceptions save theirs with `state()`).
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import enum
import types
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.fx

from .breaks import Unsupported
from .sources import Source


class VariableTracker:
    source: Optional[Source] = None

    def as_proxy(self):
        raise NotImplementedError(type(self).__name__)

    def as_example(self):
        raise NotImplementedError(type(self).__name__)

    def is_constant(self) -> bool:
        return False

    def describe(self) -> str:
        return type(self).__name__


class NullVariable(VariableTracker):
    """The NULL that LOAD_GLOBAL/LOAD_ATTR/PUSH_NULL push next to a callable."""

    def describe(self):
        return "NULL"


NULL = NullVariable()


class TensorVariable(VariableTracker):
    """A tensor: an fx.Proxy plus its example value. `same_as`: the variable of the tensor an op
    gave back as its result (x.contiguous() of a contiguous x is x)."""

    def __init__(self, proxy: torch.fx.Proxy, example: torch.Tensor, source: Optional[Source] = None):
        self.proxy = proxy
        self.example = example
        self.source = source
        self.same_as: Optional["TensorVariable"] = None

    def identity(self) -> "TensorVariable":
        """The variable of the tensor object this one is (`is` compares these)."""
        v = self
        while v.same_as is not None:
            v = v.same_as
        return v

    @property
    def node(self) -> torch.fx.Node:
        return self.proxy.node

    def as_proxy(self):
        return self.proxy

    def as_example(self):
        return self.example

    def describe(self):
        return f"Tensor({self.node.name}, {tuple(self.example.shape)}, {self.example.dtype})"


# Python values that are baked into the graph as literals (specialized, guarded by value).
CONSTANT_TYPES = (int, float, bool, str, bytes, type(None), complex, torch.dtype, torch.device,
                  torch.layout, torch.memory_format, torch.Size, slice, type(Ellipsis),
                  type(NotImplemented), types.CodeType, np.generic)


def is_constant_value(v) -> bool:
    if isinstance(v, (tuple, frozenset)) and not isinstance(v, torch.Size):
        return all(is_constant_value(x) for x in v)
    return isinstance(v, CONSTANT_TYPES)


def is_identity_key(k) -> bool:
    """A dict key that is no constant but stands for itself and no trace changes it: a class,
    a function, a typing form (a dispatch table keyed by types, as huggingface_hub's field
    validators look theirs up), an Enum's member. Such a dict is held with its keys as they are; a key is looked
    up by what the variable stands for (dict_key)."""
    if type(k) is tuple:            # (a pair of classes: torch.distributions' KL registry)
        return all(is_constant_value(i) or is_identity_key(i) for i in k)
    return isinstance(k, (type, types.FunctionType, types.BuiltinFunctionType, types.UnionType,
                          types.GenericAlias, enum.Enum)) or is_typing_form(k)


def is_typing_form(k) -> bool:
    """An object of the typing module (List, Optional[int], a TypeVar), or a union (int | None)."""
    return type(k).__module__ == "typing" or isinstance(k, types.UnionType)


class TensorKey:
    """A tensor as a key of a dict the frame made (`{p: name for name, p in m.named_parameters()}`):
    Python hashes a tensor by identity, so two keys are one where they are one tensor (its
    variable's identity(); two of the call's own tensors are one where they were one object in
    the trace, which the guard then checks: see `tensor_keys_to`)."""
    __slots__ = ("var",)

    def __init__(self, var: "TensorVariable"):
        self.var = var.identity()

    def __hash__(self):
        return id(self.var.example)

    def __eq__(self, other):
        return isinstance(other, TensorKey) and other.var.example is self.var.example

    def __repr__(self):
        return self.var.describe()


# the trace in progress collects here the call's own tensors it used as dict keys
_TENSOR_KEYS: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("tensor_keys", default=None)


@contextlib.contextmanager
def tensor_keys_to(sink: list):
    """While tracing, the variables of the call's tensors used as dict keys go into `sink`:
    the guard keeps which of them are one object (OutputGraph.guard_tensor_keys)."""
    token = _TENSOR_KEYS.set(sink)
    try:
        yield sink
    finally:
        _TENSOR_KEYS.reset(token)


def key_example(k):
    """A dict key of the trace as the Python value eager's dict has."""
    return k.var.example if isinstance(k, TensorKey) else k


def key_variable(k) -> "VariableTracker":
    """The variable for one of a dict's keys, read out of it (iteration, items())."""
    if isinstance(k, TensorKey):
        return k.var
    if is_constant_value(k):
        return ConstantVariable(k)
    if type(k) is tuple and is_identity_key(k) and all(is_constant_value(i) or isinstance(i, type) for i in k):
        return TupleVariable([ConstantVariable(i) if is_constant_value(i) else TypeVariable(i) for i in k])
    raise Unsupported(f"reading the keys of a dict keyed by {type(k).__name__} objects",
                      "only a dict's constant keys become variables")


def _python_numbers(v):
    """v with numpy's scalars as Python numbers, inside tuples, lists and slices too: what a
    graph's argument may hold (PyTorch reads np.int64(3) as 3 where it takes a number)."""
    if isinstance(v, np.generic):
        return v.item()
    if type(v) in (tuple, list):
        return type(v)(_python_numbers(i) for i in v)
    if type(v) is slice:
        return slice(_python_numbers(v.start), _python_numbers(v.stop), _python_numbers(v.step))
    return v


class ConstantVariable(VariableTracker):
    def __init__(self, value, source: Optional[Source] = None):
        self.value = value
        self.source = source

    def as_proxy(self):
        return _python_numbers(self.value)

    def as_example(self):
        return self.value

    def is_constant(self):
        return True

    def describe(self):
        return f"Constant({self.value!r})"


def _listing(parts, shown: int = 6) -> str:
    """A container's items for a message: the first few, and how many more (a break's reason
    is one line, and a registry dict would fill a screen)."""
    parts = list(parts)
    more = f", ... ({len(parts) - shown} more)" if len(parts) > shown else ""
    return ", ".join(parts[:shown]) + more


class BaseListVariable(VariableTracker):
    python_type = list

    def __init__(self, items: List[VariableTracker], source: Optional[Source] = None):
        self.items = list(items)
        self.source = source

    def holding(self, values):
        """A container of its kind holding `values` (a graph's or an example's)."""
        return self.python_type(values)

    def as_proxy(self):
        return self.holding(i.as_proxy() for i in self.items)

    def as_example(self):
        return self.holding(i.as_example() for i in self.items)

    def is_constant(self):
        return all(i.is_constant() for i in self.items)

    def describe(self):
        return f"{self.python_type.__name__}[{_listing(i.describe() for i in self.items)}]"


class TupleVariable(BaseListVariable):
    python_type = tuple


class ListVariable(BaseListVariable):
    python_type = list


class ModuleSliceVariable(ListVariable):
    """A slice of an nn.Sequential or nn.ModuleList (`self.features[:4]`): its modules, each
    read through its source. Eager makes a new container of the class: called, a Sequential's
    slice runs its modules in order; type() is the class."""

    def __init__(self, items, module_cls: type, parent: Optional[VariableTracker] = None,
                 index: Optional[slice] = None):
        super().__init__(items)
        self.module_cls = module_cls
        self.parent, self.index = parent, index       # parent[index] makes it again (a graph break)
        self.sliced = list(items)


class SizeVariable(TupleVariable):
    """A torch.Size with symbolic sizes in it (`x.shape` with dynamic shapes); in the graph
    it is a tuple of sizes."""
    python_type = torch.Size

    def as_proxy(self):
        return tuple(i.as_proxy() for i in self.items)


class NamedTupleVariable(TupleVariable):
    """A structseq / namedtuple result such as torch.return_types.max (fields by name)."""

    def __init__(self, items, tuple_cls, source=None):
        super().__init__(items, source)
        self.tuple_cls = self.python_type = tuple_cls        # (type() and isinstance see it)

    def holding(self, values):
        return make_named_tuple(self.tuple_cls, list(values))

    def as_proxy(self):
        return tuple(i.as_proxy() for i in self.items)          # in a graph, a plain tuple

    def field_index(self, name: str) -> Optional[int]:
        # namedtuples have _fields; torch.return_types structseqs have __match_args__
        fields = getattr(self.tuple_cls, "_fields", None) or getattr(self.tuple_cls, "__match_args__", ())
        return list(fields).index(name) if name in fields else None


def make_named_tuple(tuple_cls, items):
    """An instance of a namedtuple class (fields as arguments) or of a structseq such as
    torch.return_types.max (one sequence of fields)."""
    return tuple_cls(*items) if hasattr(tuple_cls, "_fields") else tuple_cls(items)


class DictVariable(VariableTracker):
    """A dict (keys Python constants). Made in the frame it may be a collections.OrderedDict
    or a defaultdict (`cls`; `factory`: a defaultdict's default_factory, called for a key it
    does not have)."""

    def __init__(self, items: Dict[Any, VariableTracker], source: Optional[Source] = None,
                 cls: type = dict, factory: Optional[VariableTracker] = None):
        self.items = dict(items)
        self.source = source
        self.cls, self.factory = cls, factory

    def as_proxy(self):
        return {key_example(k): v.as_proxy() for k, v in self.items.items()}

    def as_example(self):
        items = {key_example(k): v.as_example() for k, v in self.items.items()}
        if self.factory is not None:
            return self.cls(self.factory.as_example(), items)
        return items if self.cls is dict else self.cls(items)

    def describe(self):
        return "dict{" + _listing(f"{k!r}: {v.describe()}" for k, v in self.items.items()) + "}"



def is_model_output_class(cls) -> bool:
    """A dataclass that is also an ordered dict of its fields that are not None, indexed by
    position like a tuple: Hugging Face's ModelOutput (and diffusers' BaseOutput, its copy)."""
    import dataclasses
    return isinstance(cls, type) and issubclass(cls, dict) and dataclasses.is_dataclass(cls) and \
        any(c.__name__ in ("ModelOutput", "BaseOutput") and "to_tuple" in c.__dict__ for c in cls.__mro__)


class ModelOutputVariable(DictVariable):
    """An instance of a ModelOutput class (is_model_output_class): its fields that are not None
    are the dict's items, in field order; an attribute is a field (None where unset); an int
    or a slice indexes the items as a tuple. Rebuilt after the graph as cls(**items)."""

    def __init__(self, cls, items: Dict[str, VariableTracker], source: Optional[Source] = None):
        super().__init__(items, source)
        self.cls = cls

    @staticmethod
    def field_names(cls) -> List[str]:
        import dataclasses
        return [f.name for f in dataclasses.fields(cls)]

    def field(self, name: str) -> Optional[VariableTracker]:
        if name in self.items:
            return self.items[name]
        return ConstantVariable(None) if name in self.field_names(self.cls) else None

    def as_example(self):
        return self.cls(**{k: v.as_example() for k, v in self.items.items()})

    def describe(self):
        return f"{self.cls.__name__}({', '.join(self.items)})"

class CallableVariable(VariableTracker):
    """Something the interpreter can call; `value` is the real callable."""

    def __init__(self, value, source: Optional[Source] = None):
        self.value = value
        self.source = source

    def as_example(self):
        return self.value

    def is_constant(self):
        # a callable is fixed for the entry: read from a source it is guarded by identity
        # (a class, by type), else it is a constant of the code
        return True

    def describe(self):
        return f"{type(self).__name__}({getattr(self.value, '__qualname__', self.value)!r})"


class UserFunctionVariable(CallableVariable):
    """A plain Python function written by the user: calls are inlined."""


class TorchFunctionVariable(CallableVariable):
    """A torch.* / torch.nn.functional.* / operator.* callable: a call becomes one FX node."""

    def as_proxy(self):
        return self.value


class BuiltinVariable(CallableVariable):
    """A Python builtin (len, isinstance, getattr, ...), modelled case by case."""


class TypeVariable(CallableVariable):
    """A class (tuple, list, dict, torch.Size, a user class): modelled case by case."""


class PythonModuleVariable(CallableVariable):
    """An imported Python module (torch, torch.nn.functional, math): attribute reads only."""


class NNModuleVariable(VariableTracker):
    """An nn.Module instance; calling it inlines its forward (parameters become placeholders).
    `made`: (class, args, kwargs) of one made in the frame (each call makes its own)."""

    def __init__(self, module: torch.nn.Module, source: Optional[Source], made=None):
        self.module = module
        self.source = source
        self.made = made
        self.items: Dict[str, VariableTracker] = {}    # attributes set in the trace (side effects)

    def as_example(self):
        return self.module

    def describe(self):
        return f"NNModule({type(self.module).__name__})"


class TensorMethodVariable(VariableTracker):
    """`x.sum` before the call: calling it emits a call_method node."""

    def __init__(self, tensor: TensorVariable, name: str):
        self.tensor = tensor
        self.name = name

    def describe(self):
        return f"TensorMethod({self.name})"


class BoundMethodVariable(VariableTracker):
    """`obj.method` for a Python-level method of a module or object: inlined with self bound."""

    def __init__(self, func, self_var: VariableTracker, source: Optional[Source] = None):
        self.func = func
        self.self_var = self_var
        self.source = source

    def describe(self):
        return f"BoundMethod({getattr(self.func, '__qualname__', self.func)})"


class SymIntVariable(ConstantVariable):
    """A size that is dynamic (a symbol in the backend), read by the traced code: `x.shape[0]`,
    `x.size(1)`, and arithmetic on them (`T * 2`, `C // heads`). In the graph it is a node (a
    `size` call, an `operator.mul`...), so a `view(B, T, -1)` stays generic in T, as with
    TorchDynamo's SymInt.

    Any use the tracer does not model symbolically reads `.value` (a comparison, a branch,
    `range(T)`, a Python function): the graph then depends on the number itself, so reading it
    *specializes* the size (the dims it came from become static, guarded by value) before
    handing out the int. Correct by default; symbolic only where the tracer knows how."""

    def __init__(self, proxy, example: int, deps: list, specialize: Callable):
        self.proxy = proxy
        self.example = example
        self.deps = deps                  # the TensorVariables whose sizes it was read from
        self._specialize = specialize
        self.source = None

    @property
    def value(self):
        self._specialize(self.deps, f"the trace used a size ({self.example}) as a Python int")
        return self.example

    def as_example(self):
        return self.value

    def as_proxy(self):
        return self.proxy

    def describe(self):
        return f"SymInt({self.proxy.node.name}, {self.example})"


def example_of(v: VariableTracker):
    """v's example value for running an op on the tracer's examples, without specializing a
    SymIntVariable inside it (the op's graph node takes the symbolic size)."""
    if isinstance(v, SymIntVariable):
        return v.example
    if isinstance(v, BaseListVariable):
        return v.holding(example_of(i) for i in v.items)
    if isinstance(v, DictVariable):
        return {k: example_of(i) for k, i in v.items.items()}
    if isinstance(v, SliceVariable):
        return slice(*[example_of(p) for p in v.parts])
    return v.as_example()


def sym_leaves(v) -> list:
    """The SymIntVariables inside v (containers searched)."""
    if isinstance(v, SymIntVariable):
        return [v]
    if isinstance(v, (list, tuple)):
        return [s for i in v for s in sym_leaves(i)]
    if isinstance(v, BaseListVariable):
        return sym_leaves(v.items)
    if isinstance(v, DictVariable):
        return sym_leaves(list(v.items.values()))
    if isinstance(v, SliceVariable):
        return sym_leaves(v.parts)
    return []


class ConstantMethodVariable(VariableTracker):
    """A method of a constant/container (e.g. `shape.numel`, `d.items`): evaluated in Python."""

    def __init__(self, obj: VariableTracker, name: str):
        self.obj = obj
        self.name = name


class SliceVariable(VariableTracker):
    """slice(a, b, c) whose parts are not all constants (never occurs with static shapes,
    kept so BUILD_SLICE always has a result)."""

    def __init__(self, parts: List[VariableTracker]):
        self.parts = parts

    def as_proxy(self):
        return slice(*[p.as_proxy() for p in self.parts])

    def as_example(self):
        return slice(*[p.as_example() for p in self.parts])


class IteratorVariable(VariableTracker):
    """An iterator over already-known items (iter(list), range, enumerate, zip, map, a
    ModuleList): loops are unrolled, so every item is known when the iterator is made."""

    def __init__(self, items: List[VariableTracker], index: int = 0, source: Optional[Source] = None,
                 python_type: Optional[type] = None, over: Optional[VariableTracker] = None,
                 backward: bool = False):
        self._items = list(items)
        self.index = index
        # reversed() of a list: `index` counts down from its last item then, as CPython's
        # reversed iterator does (an item the list no longer has ends it)
        self.backward = backward
        if backward:
            self.index = len(over.items) - 1
        self.source = source       # read from outside the frame: advanced for real after the graph
        self.python_type = python_type     # what eager's would be, where known (isinstance)
        # iter() of a list: its items read as the loop goes, as CPython's list iterator does (a
        # write or an append during the loop is seen); of a dict or a view of one: its keys
        # as they were, its values as they are, and a change of its size raises
        self.over = over
        self.size = len(self.dict_of(over).items) if self.dict_of(over) is not None else None

    @staticmethod
    def dict_of(over) -> Optional["DictVariable"]:
        return over if isinstance(over, DictVariable) else \
            over.dict_var if isinstance(over, DictViewVariable) else None

    @property
    def items(self) -> List[VariableTracker]:
        return self.over.items if isinstance(self.over, ListVariable) else self._items

    def item(self, i: int) -> VariableTracker:
        """The i-th item, as the iterator gives it now (a view's value read from its dict)."""
        item = self.items[i]
        if isinstance(self.over, DictViewVariable) and self.over.kind != "keys":
            value = self.over.dict_var.items[dict_key(item)]
            return value if self.over.kind == "values" else TupleVariable([item, value])
        return item

    def remaining(self) -> List[VariableTracker]:
        if self.backward:
            return self.items[self.index::-1] if 0 <= self.index < len(self.items) else []
        return [self.item(i) for i in range(self.index, len(self.items))]

    def state(self):                          # (what OutputGraph.record_mutation saves)
        return self.index, self._items, self.over

    def restore(self, state):
        self.index, self._items, self.over = state

    def describe(self):
        return f"iterator({len(self.remaining())} left)"


class GeneratorVariable(VariableTracker):
    """A generator made in the trace (a generator function called, a generator expression):
    its frame `tx` runs to its next yield each time an item is asked for (iterators.py).
    `made_by`: (the function, its arguments), to make it again where it outlives the trace
    before it started."""

    def __init__(self, tx, made_by=None):
        self.tx, self.made_by = tx, made_by
        self.started = self.done = False
        self.return_value: VariableTracker = ConstantVariable(None)

    def state(self):
        t = self.tx
        return (t.pc, list(t.stack), dict(t.locals), dict(t.lazy_locals), t.with_depth,
                self.started, self.done, self.return_value)

    def restore(self, state):
        t = self.tx
        t.pc, t.stack, t.locals, t.lazy_locals, t.with_depth, self.started, self.done, \
            self.return_value = state

    python_type = types.GeneratorType

    def describe(self):
        return f"generator({self.tx.code.co_name})"


class LazyIteratorVariable(VariableTracker):
    """map(fn, *its), filter(fn, it), zip(*its), enumerate(it, start) or itertools.islice of
    the trace: each item made when it is asked for, from the next items of `iterators` (fn
    called then), as Python's own are lazy. `count`: enumerate's next index."""

    def __init__(self, kind: str, iterators: List[VariableTracker], fn=None, count=0,
                 strict: bool = False, bounds=None):
        self.kind, self.iterators, self.fn = kind, list(iterators), fn
        self.count, self.strict = count, strict
        self.bounds = bounds           # islice's (start, stop, step); count: (read, given)

    def state(self):
        return self.count

    def restore(self, state):
        self.count = state

    @property
    def python_type(self) -> type:
        return {"map": map, "filter": filter, "zip": zip, "enumerate": enumerate,
                "islice": itertools.islice}[self.kind]

    def describe(self):
        return f"{self.kind} object"


class DictViewVariable(VariableTracker):
    """d.keys(), d.values() or d.items(): a live view of the dict, read each time it is used
    (a key added to d later is in it), as Python's views are."""

    def __init__(self, dict_var: "DictVariable", kind: str):
        self.dict_var, self.kind = dict_var, kind

    def items_now(self) -> List[VariableTracker]:
        d = self.dict_var.items
        if self.kind == "keys":
            return [key_variable(k) for k in d]
        if self.kind == "values":
            return list(d.values())
        return [TupleVariable([key_variable(k), v]) for k, v in d.items()]

    def describe(self):
        return f"dict_{self.kind}"


class CellVariable(VariableTracker):
    """A closure cell of a frame being traced: reads and writes go to that frame's local."""

    def __init__(self, tx, name: str):
        self.tx = tx
        self.name = name

    def describe(self):
        return f"cell({self.name})"


class ClosureCellVariable(VariableTracker):
    """A real closure cell (of the captured function, or of a function it calls) that the
    trace reads or writes (`nonlocal`): a write is what later reads see, and is made on the
    cell after the graph. `source`: the cell; `contents_source`: its value (the captured
    function's own free variables read as `L[name]`, as Dynamo spells them)."""

    def __init__(self, cell, source: Optional[Source], contents_source: Optional[Source]):
        self.cell, self.source, self.contents_source = cell, source, contents_source
        self.items: Dict[str, VariableTracker] = {}     # "cell_contents" once written

    def describe(self):
        return "closure cell"


class GlobalWritesVariable(VariableTracker):
    """What the trace assigns to a module's globals (`global x; x = ...`, DELETED for `del`):
    later loads read it, and it is assigned for real after the graph. `source`: the dict.
    (Also what it assigns to a class's attributes, `Counter.n += 1`: `source` the class.)"""

    def __init__(self, source: Source):
        self.source = source
        self.items: Dict[str, VariableTracker] = {}

    def describe(self):
        return "globals"


class ExceptionVariable(VariableTracker):
    """An exception object of the trace (`ValueError("bad")` called, or one an operation
    raised): its class, args and the attributes set on it (`__cause__`, a subclass's own);
    made for real where it leaves the trace."""

    def __init__(self, cls: type, args: List[VariableTracker], attrs=None):
        self.cls, self.args = cls, list(args)
        self.items: Dict[str, VariableTracker] = dict(attrs or {})

    @staticmethod
    def of(exc: BaseException) -> "ExceptionVariable":
        """A real exception (one Python raised on constants: KeyError('b')) as a variable,
        with its attributes (an ImportError's name and path are C members, not in its dict)."""
        attrs = dict(getattr(exc, "__dict__", {}))
        if isinstance(exc, ImportError):
            attrs.update(name=exc.name, path=exc.path)
        return ExceptionVariable(type(exc), [ConstantVariable(a) for a in exc.args],
                                 {k: ConstantVariable(v) for k, v in attrs.items() if is_constant_value(v)})

    def as_example(self):
        return make_exception(self.cls, [a.as_example() for a in self.args],
                              {k: v.as_example() for k, v in self.items.items()})

    def is_constant(self):
        return all(a.is_constant() for a in self.args) and all(v.is_constant() for v in self.items.values())

    def state(self):                          # (what OutputGraph.record_mutation saves)
        return list(self.args), dict(self.items)

    def restore(self, state):
        self.args, self.items = state

    def describe(self):
        return f"{self.cls.__name__}({', '.join(a.describe() for a in self.args)})"


def make_exception(cls: type, args: list, attrs: dict) -> BaseException:
    """An exception of class cls with these args and attributes, made without running a
    Python __init__ of the class (its effect is in args and attrs already)."""
    python_init = any(isinstance(k.__dict__.get("__init__"), types.FunctionType) for k in cls.__mro__)
    exc = cls.__new__(cls) if python_init else cls(*args)
    exc.args = tuple(args)
    for name, value in attrs.items():
        setattr(exc, name, value)
    return exc


class PartialVariable(VariableTracker):
    """functools.partial(func, *args, **keywords): a call calls func with those first. Read
    from outside the frame, its parts are read (and guarded) through its source."""

    def __init__(self, func: VariableTracker, args: List[VariableTracker],
                 keywords: "Dict[str, VariableTracker] | DictVariable", source: Optional[Source] = None):
        self.func, self.args, self.source = func, list(args), source
        # one dict variable, what p.keywords reads: a write through it is a write of the partial's
        self.keywords_var = keywords if isinstance(keywords, DictVariable) else DictVariable(keywords)

    @property
    def keywords(self) -> Dict[str, VariableTracker]:
        return self.keywords_var.items

    def describe(self):
        return f"partial({self.func.describe()})"


class NestedFunctionVariable(VariableTracker):
    """A function made by MAKE_FUNCTION inside the trace (lambda, closure, 3.11 comprehension):
    code + globals + defaults and closure cells as variables. Calls are inlined."""

    def __init__(self, code, f_globals, name: str, defaults=None, kwdefaults=None,
                 closure=None):
        self.code = code
        self.f_globals = f_globals
        self.name = name
        self.defaults = defaults           # TupleVariable or None
        self.kwdefaults = kwdefaults       # DictVariable or None
        self.closure = closure             # TupleVariable of CellVariable / ClosureCellVariable
        self.items: Dict[str, VariableTracker] = {}     # attributes set in the trace (fn.tag = 1)
        self.dict_of = None        # what functools.update_wrapper copied the __dict__ of
        self.annotations = None    # DictVariable, once made or read
        self.source = None         # one the call passed in (made at run time, guarded by code)
        self.real = None           # and that function

    def describe(self):
        return f"NestedFunction({self.name})"


class GradModeVariable(VariableTracker):
    """torch.no_grad() / torch.enable_grad() / torch.set_grad_enabled(b) as a context manager.
    `before`: the mode before it, where making it already set the mode (set_grad_enabled
    takes effect when called, before its `with` block is entered)."""

    def __init__(self, enabled: bool, before: bool | None = None):
        self.enabled = enabled
        self.before = before

    def describe(self):
        return f"GradMode({self.enabled})"


class InferenceModeVariable(VariableTracker):
    """torch.inference_mode() as a context manager (mode True: grad mode off too). Tensors
    the block makes are inference tensors; the trace makes them so (it enters the mode for
    real), and so does the compiled code (frame.Segment's `inference_outputs`)."""

    def __init__(self, mode: bool = True):
        self.mode = mode

    def describe(self):
        return f"torch.inference_mode({self.mode})"


class NullContextVariable(VariableTracker):
    """contextlib.nullcontext(enter_result): a with-block that does nothing."""

    def __init__(self, enter_result: VariableTracker):
        self.enter_result = enter_result

    def describe(self):
        return "nullcontext()"


class AutocastVariable(VariableTracker):
    """torch.autocast(device_type, dtype, enabled, cache_enabled) as a context manager, its
    arguments constants. Entering it records `_enter_autocast` in the graph where it changes
    the autocast state (the backend makes the casts explicit: autocast.py)."""

    def __init__(self, device_type: str, dtype, enabled: bool, cache_enabled):
        self.device_type, self.dtype = device_type, dtype
        self.enabled, self.cache_enabled = enabled, cache_enabled

    def describe(self):
        return f"torch.autocast({self.device_type!r}, enabled={self.enabled})"


class WithExitVariable(VariableTracker):
    """The __exit__ that BEFORE_WITH pushes: calling it undoes what entering did (`undo`, a
    function of the translator: restore the grad mode, leave autocast), or, for a context
    manager of a Python class (`exit`: its bound __exit__), calls that. `grad_before`: for a
    grad-mode block (torch.no_grad()...), the mode its exit restores: a break inside it hands
    the rest of the frame a real __exit__ that does so. `autocast`: for a torch.autocast
    block, its AutocastVariable: a break inside it enters a real one (the breaking call runs
    in its state) and hands the rest of the frame its __exit__."""

    def __init__(self, undo=None, exit=None, grad_before=None, autocast=None):
        self.undo, self.exit, self.grad_before, self.autocast = undo, exit, grad_before, autocast


class UserObjectVariable(VariableTracker):
    """Any other Python object read from the arguments or globals (a config object, a
    dataclass): its type guarded, its attributes read (and guarded) one by one. Or one made in
    the frame (source None): its attributes are trace state (`items`); made by copying an
    object whose state is constants (copy.deepcopy(config)), it keeps a private real copy
    (`snapshot`, what each call starts from) and `value` follows the trace's writes, so its
    class's own attribute logic can run on it for real."""

    def __init__(self, value, source, snapshot=None):
        self.value = value
        self.source = source
        self.items = {}          # (so record_mutation can save/restore the overrides)
        self.snapshot = snapshot

    @property
    def overrides(self):
        return self.items

    def as_example(self):
        return self.value

    def describe(self):
        return f"{type(self.value).__name__} object"


class SetVariable(BaseListVariable):
    """A set of Python constants made in the frame (a set display or comprehension). Where
    hashes collide, the order a set iterates in hangs on its history (what was added and
    removed, in which order, from which kind of object), not only on what it holds; a copy
    need not keep it. So it keeps the steps that made it (`start`, then the in-place `steps`),
    to make eager's very set again (`make`: a fresh one for each call, when it crosses a break),
    and `real`, one made so, changed by the frame's operations. Its items follow `real`."""
    python_type = set

    def __init__(self, start: Callable[[], set]):
        super().__init__([])
        self.start, self.steps = start, []
        self.real = start()
        self.changed()

    def make(self) -> set:
        return _replayed(self.start, self.steps)

    def maker(self) -> Callable[[], set]:
        """`make` as the set is now (the steps taken so far)."""
        start, steps = self.start, list(self.steps)
        return lambda: _replayed(start, steps)

    @staticmethod
    def made_by(fn: Callable, *operands) -> "SetVariable":
        """The set fn(*operands) gives: operands are values the frame does not change after
        (see `operand`)."""
        return SetVariable(lambda: fn(*operands))

    @staticmethod
    def operand(v: "VariableTracker", items: List["VariableTracker"]):
        """What eager hands a set operation for `v` (whose items are `items`): a set's own table,
        a dict (a set takes its size first), or the items in order."""
        if isinstance(v, SetVariable):
            return v.make()
        if isinstance(v, DictVariable):
            return dict.fromkeys(i.as_example() for i in items)
        if isinstance(v, ConstantVariable) and isinstance(v.value, frozenset):
            return v.value
        return [i.as_example() for i in items]

    def apply(self, name: str, *operands):
        """self.<name>(*operands) in place (add, discard, update, pop, __ior__...): its result."""
        result = getattr(self.real, name)(*operands)
        self.steps.append((name, operands))
        self.changed()
        return result

    def changed(self) -> None:
        self.items = [ConstantVariable(v) for v in self.real]

    def state(self) -> int:
        """How far it has changed (OutputGraph.rollback undoes the steps after)."""
        return len(self.steps)

    def restore(self, steps: int) -> None:
        del self.steps[steps:]
        self.real = self.make()
        self.changed()

    def as_example(self):
        return self.make()


def _replayed(start: Callable[[], set], steps: list) -> set:
    s = start()
    for name, operands in steps:
        getattr(s, name)(*operands)
    return s


class SuperVariable(VariableTracker):
    """super(cls, obj) (or the zero-argument form): attribute reads only."""

    def __init__(self, cls: type, obj: VariableTracker):
        self.cls = cls
        self.obj = obj

    def describe(self):
        return f"super({self.cls.__name__})"


class _Deleted(VariableTracker):
    """An attribute deleted in the trace (delattr on the frame's own copy)."""


DELETED = _Deleted()


class _DictFromKeys(VariableTracker):
    """dict.fromkeys: a dict of those keys, each holding the same value."""


class _NoOpCallable(VariableTracker):
    """object.__init__ reached through super(): calling it does nothing."""


class TensorAttributeWrites(VariableTracker):
    """`p.grad = g` on a tensor of the call's (a leaf: a parameter): the values the trace gave
    its attributes (`items`), which later reads in the trace see, set on the real tensor after
    the graph."""

    def __init__(self, source: Source):
        self.source = source
        self.items: Dict[str, VariableTracker] = {}

    def describe(self):
        return f"attributes of {self.source.expr()}"


class WeakRefVariable(VariableTracker):
    """weakref.ref(obj) of an object made in the frame (torch.distributions' Transform.inv on
    torch 2.11 keeps its inverse so): in the trace it refers to the object; where it outlives the
    trace, a real weak reference to the object made then."""

    def __init__(self, target: VariableTracker):
        self.target = target

    def describe(self):
        return f"weakref.ref({self.target.describe()})"


class _MakeInstance(VariableTracker):
    """type.__call__ of a class, reached through super() in its metaclass's own __call__
    (pyro's distributions): calling it makes an instance as the class's call would, past the
    metaclass's __call__."""

    def __init__(self, cls: type):
        self.cls = cls


class OperatorGetterVariable(VariableTracker):
    """operator.itemgetter(*keys), attrgetter(*names) or methodcaller(name, *args, **kwargs):
    calling it reads those items or attributes, or calls that method, of its argument."""

    def __init__(self, cls: type, args: List[VariableTracker], kwargs: Dict[str, VariableTracker]):
        self.cls, self.args, self.kwargs = cls, list(args), dict(kwargs)

    def describe(self):
        return f"operator.{self.cls.__name__}"


class ExceptionInitVariable(VariableTracker):
    """BaseException.__init__ of an exception of the trace (a subclass's __init__ calls
    super().__init__(message)): calling it sets the exception's args."""

    def __init__(self, exc: "ExceptionVariable"):
        self.exc = exc


class ObjectMethodVariable(VariableTracker):
    """object.__setattr__ or object.__getattribute__ (`name`): with `self_var` None called
    with the object first, else bound to it (super().__setattr__): the generic store or read,
    which a class's own __setattr__ or __getattribute__ calls (its own is not called again)."""

    def __init__(self, name: str, self_var: Optional[VariableTracker] = None):
        self.name, self.self_var = name, self_var


class OpaqueConstantVariable(ConstantVariable):
    """An immutable object that a pure function made from constants (an inspect.Signature, its
    parameters): attribute reads and calls of its methods with constant arguments run as they
    are, and what they return is constant too."""

    def describe(self):
        return f"constant {type(self.value).__name__}"


class BoundArgumentsVariable(VariableTracker):
    """What inspect.Signature.bind gives (a decorator that reads an argument by name): the
    signature, a constant, and `arguments`, a dict of the call's variables by parameter name."""

    def __init__(self, signature, arguments: "DictVariable"):
        self.signature, self.arguments = signature, arguments

    def describe(self):
        return "inspect.BoundArguments"


class _UnboundTensorMethod(VariableTracker):
    """`torch.Tensor.add` used as a function: a call_method node on its first argument."""

    def __init__(self, name):
        self.name = name


class _UnboundConstantMethod(VariableTracker):
    """`str.isalnum`, `set.symmetric_difference` used as functions (einops' parser): the
    method of their first argument, a value of that very type."""

    def __init__(self, cls: type, name: str):
        self.cls, self.name = cls, name


def _constant_result(parent: ConstantVariable, value) -> ConstantVariable:
    """What reading or calling a constant gives: a constant (opaque where the parent was)."""
    if is_constant_value(value) or not isinstance(parent, OpaqueConstantVariable):
        return ConstantVariable(value)
    return OpaqueConstantVariable(value)


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except (TypeError, ValueError):      # (a writable memoryview raises ValueError)
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


NO_KEY = object()


def set_key(v: VariableTracker):
    """The set item a variable stands for: dict_key's, but no tensor (sets hold constants)."""
    return NO_KEY if isinstance(v, TensorVariable) else dict_key(v)


def dict_key(v: VariableTracker):
    """The dict key a variable stands for: a constant's value, an identity key's object
    (is_identity_key: a class, a function, a typing form), a tensor's TensorKey; NO_KEY for
    anything else."""
    if v.is_constant():
        return v.as_example()
    value = getattr(v, "value", NO_KEY)
    if isinstance(v, (TypeVariable, BuiltinVariable, UserFunctionVariable, UserObjectVariable)) \
            and value is not NO_KEY and is_identity_key(value):
        return value
    if type(v) is TupleVariable:
        keys = tuple(dict_key(i) for i in v.items)
        return keys if not any(k is NO_KEY or isinstance(k, TensorKey) for k in keys) else NO_KEY
    if isinstance(v, TensorVariable):
        key = TensorKey(v)
        sink = _TENSOR_KEYS.get()
        if key.var.source is not None and sink is not None:
            sink.append(key.var)
        return key
    return NO_KEY
