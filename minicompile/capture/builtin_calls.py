"""Python's builtins (and a few pure library functions) on traced values.

Takes: a call of `len`, `isinstance`, `getattr`, `zip`, `max`, `dict`, itertools... with
VariableTracker arguments, from the translator. Hands on: its result as a VariableTracker,
computed on the trace's values (loops are unrolled, so every item is known), with a guard
where the answer depends on something from outside the frame (a dict subclass's keys, whether
an attribute exists). `_BUILTIN_HANDLERS` maps each builtin to its handler.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
import functools
import inspect
import itertools
import math
import operator
import re
import sys
import types
import typing
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
import torch.fx
from torch.nn.utils._named_member_accessor import NamedMemberAccessor


from .breaks import ObservedException, Unsupported
from .sources import AttrSource, GenericAttrSource, ItemSource, Source, item_source
from .values import (DELETED, AutocastVariable, BaseListVariable, BoundMethodVariable, BuiltinVariable,
                     CallableVariable, CellVariable, ConstantMethodVariable, ConstantVariable, DictVariable,
                     DictViewVariable, ExceptionVariable, GeneratorVariable, GradModeVariable, InferenceModeVariable,
                     IteratorVariable, LazyIteratorVariable, ListVariable, ModuleSliceVariable, ModelOutputVariable,
                     NestedFunctionVariable, NNModuleVariable, NullContextVariable, OperatorGetterVariable,
                     PartialVariable, PythonModuleVariable, SetVariable, SliceVariable, SuperVariable,
                     SymIntVariable, TensorMethodVariable, TensorVariable,
                     TupleVariable, TypeVariable, UserObjectVariable, VariableTracker, example_of,
                     _contains_tensor, dict_key, is_constant_value, key_variable, NO_KEY)


# ----------------------------------------------------------------------------------------
# Builtins, modelled case by case
# ----------------------------------------------------------------------------------------
def _builtin_len(tx, args, kwargs):
    (x,) = args
    if isinstance(x, BaseListVariable):
        return ConstantVariable(len(x.items))
    if isinstance(x, DictVariable):
        return ConstantVariable(len(x.items))
    if isinstance(x, DictViewVariable):
        return ConstantVariable(len(x.dict_var.items))
    if isinstance(x, TensorVariable):
        if x.example.dim() == 0:
            raise tx.observed(TypeError("len() of a 0-d tensor"))
        return tx.output.size_of(x, 0)          # (symbolic where dim 0 is dynamic)
    if isinstance(x, ConstantVariable):
        return ConstantVariable(len(x.value))
    if isinstance(x, TypeVariable) and isinstance(x.value, enum.EnumMeta):
        return ConstantVariable(len(x.value))        # an Enum's members (fixed when it is made)
    if isinstance(x, NNModuleVariable):
        mod = x.module
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
            return ConstantVariable(len(tx.output.members(x)))
        if isinstance(mod, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            return ConstantVariable(len(tx.output.members(x, "_parameters")))
    special = tx.call_special(x, "__len__", [])
    if special is None:
        raise tx.unsupported(f"len() of {x.describe()}")
    if special.is_constant():
        # what a Python __len__ returns is checked as CPython's len() checks it
        n = special.as_example()
        if not hasattr(type(n), "__index__"):
            raise tx.observed(TypeError(f"'{type(n).__name__}' object cannot be interpreted as an integer"))
        n = operator.index(n)
        if n < 0:
            raise tx.observed(ValueError("__len__() should return >= 0"))
        if n > sys.maxsize:
            raise tx.observed(OverflowError("cannot fit 'int' into an index-sized integer"))
        return ConstantVariable(n)
    return special


def _builtin_isinstance(tx, args, kwargs):
    obj, cls = args
    if not isinstance(cls, (TypeVariable, ConstantVariable, TupleVariable, BuiltinVariable)):
        raise tx.unsupported(f"isinstance() with {cls.describe()}")
    if isinstance(obj, (IteratorVariable, GeneratorVariable, LazyIteratorVariable)):
        return ConstantVariable(_iterator_isinstance(tx, obj, cls.as_example()))
    # (example_of: a symbolic size is an int without making it static; a class that refuses
    # the check, a TypedDict's, raises the TypeError the code may catch)
    value, classinfo = example_of(obj), cls.as_example()
    _class_check_holds(tx, classinfo, "__instancecheck__", type(value))
    answer = tx.on_constants(isinstance, value, classinfo)
    if not answer and any(getattr(k, "_is_protocol", False) for k in
                          (classinfo if isinstance(classinfo, tuple) else (classinfo,))) \
            and (hasattr(value, "__dict__") or python_method(type(value), "__getattr__")):
        # a runtime Protocol its class does not satisfy may be satisfied by the object's own
        # attributes (Python looks for them on the object), which its class's guard does not see
        raise tx.unsupported(f"isinstance() of {obj.describe()} and a Protocol its class does not satisfy",
                             "it reads the object's attributes: asked as Python")
    return ConstantVariable(answer)


def _protocol_members(k) -> set:
    members = getattr(k, "__protocol_attrs__", None)
    return set(members) if members is not None else set(typing._get_protocol_attrs(k))


def _class_check_holds(tx, classinfo, check: str, subject: type) -> None:
    """isinstance()/issubclass() of `subject` (the object's class, or the class asked of)
    answered by the trace stays eager's answer: for an ABC, the check asks it again (an ABC's
    answer for a class changes when a class is registered with it, and comes from its cache
    after); a runtime Protocol with data members (it reads the object's attributes) or a
    metaclass with a check of its own in Python (its answer may change) is asked as Python, at a
    break. (A Protocol of methods, SupportsIndex, holds where the object's class, which is
    guarded, satisfies it; where it does not, _builtin_isinstance asks as Python.)"""
    name = "isinstance" if check == "__instancecheck__" else "issubclass"
    for k in (classinfo if isinstance(classinfo, tuple) else (classinfo,)):
        meta = type(k)
        if meta is type or not isinstance(k, type):
            continue
        if getattr(k, "_is_protocol", False) and any(not callable(getattr(k, m, None)) for m in _protocol_members(k)):
            raise tx.unsupported(f"{name}() of the Protocol {k.__name__}",
                                 "it reads the object's attributes: asked as Python")
        if isinstance(k, abc.ABCMeta) and isinstance(subject, type):
            tx.output.guards.abc_answer(subject, k)
        own = next((c.__dict__[check] for c in meta.__mro__ if check in c.__dict__), None)
        # (typing's own metaclasses answer by the class, or refuse: a TypedDict's raises)
        if isinstance(own, types.FunctionType) and own is not getattr(abc.ABCMeta, check, None) \
                and own.__module__ not in ("typing", "typing_extensions"):
            raise tx.unsupported(f"{name}() of {k.__name__}: its metaclass's {check} is Python's",
                                 "its answer may change between calls: asked as Python")


# what an iterator of the trace may be in eager where the trace does not know (iter() of an
# object's items): isinstance() is answered where all of these agree
_SOME_ITERATOR_TYPES = (type(iter([])), type(iter(())), type(iter(range(0))), type(iter({})),
                        type(iter("")), types.GeneratorType)


def _iterator_isinstance(tx, it, cls) -> bool:
    """isinstance(it, cls) for an iterator the trace holds as its items (no real object):
    by the type eager's would have (clip_grad_norm_ asks whether it was given a generator)."""
    known = it.python_type
    answers = {issubclass(t, cls) for t in ([known] if known is not None else _SOME_ITERATOR_TYPES)}
    if len(answers) > 1:
        raise tx.unsupported(f"isinstance() of {it.describe()}, whose type in eager the trace does not know")
    return answers.pop()


def _builtin_issubclass(tx, args, kwargs):
    cls, classinfo = args
    if not all(isinstance(a, (TypeVariable, TupleVariable, ConstantVariable, BuiltinVariable)) for a in args):
        raise tx.unsupported(f"issubclass() of {cls.describe()}")
    _class_check_holds(tx, classinfo.as_example(), "__subclasscheck__", cls.as_example())
    return ConstantVariable(tx.on_constants(issubclass, cls.as_example(), classinfo.as_example()))


def _builtin_vars(tx, args, kwargs):
    """vars(obj) of an object read from outside the frame: its very __dict__."""
    if len(args) != 1 or not isinstance(args[0], UserObjectVariable) or args[0].source is None:
        raise tx.unsupported("vars() of a value that is not an object from outside the frame")
    own = tx.output.wrap(vars(args[0].value), AttrSource(args[0].source, "__dict__"))
    tx.mirror_in_dict(args[0], args[0].items)          # the attributes the trace set so far
    return own


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
    if name in getattr(obj, "overrides", ()):       # set (or deleted) in the trace
        return obj.overrides[name] is not DELETED
    # (a class's own attribute logic, or an instance __dict__ the trace wrote: as the trace reads)
    traced = isinstance(obj, UserObjectVariable) and (python_method(type(obj.value), "__getattribute__") or
                                                      python_method(type(obj.value), "__getattr__") or
                                                      tx.output.instance_dict(obj) in tx.output.side_effects)
    own = isinstance(obj, TensorVariable) and not hasattr(torch.Tensor, name)   # x.counter = ...
    # (a Python module: read as `module.name` below, its own __getattr__ inlined)
    if (own or isinstance(obj, (NNModuleVariable, UserObjectVariable))) and source is not None and not traced:
        present = hasattr(obj.as_example(), name)
        tx.output.guards.has_attr(source, name, present)
        return present
    try:
        tx.load_attr(obj, name)
        return True
    except ObservedException as e:
        if issubclass(e.exc.cls, AttributeError):
            return False
        raise
    except Unsupported as unread:
        if isinstance(obj, NestedFunctionVariable):      # (one the trace made: every function's)
            return hasattr(obj.real if obj.real is not None else types.FunctionType, name)
        try:
            example = obj.as_example()
        except NotImplementedError:                      # (no value to ask: a graph break)
            raise unread from None
        return hasattr(example, name)


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
            return kind([key_variable(k) for k in x.items])
        if isinstance(x, TensorVariable):
            return kind(tx.unpack_tensor(x, len(x.example)))
        return kind(tx.iterate(x))
    return impl


def _builtin_const(fn):
    def impl(tx, args, kwargs):
        if fn in (str, repr) and len(args) == 1 and not kwargs:
            text = tx.object_text(args[0], fn.__name__)      # a Python class's __str__/__repr__
            if text is not None:
                return text
        if fn in (set, frozenset) and len(args) <= 1 and not kwargs:
            # (a set is the frame's own, changed in place: never a constant, which the graph's
            # every call would hand out as one object)
            items = tx.iterate(args[0]) if args else []       # (a dict's keys, a list of names...)
            if all(i.is_constant() for i in items):
                made = SetVariable.operand(args[0], items) if args else []
                return SetVariable.made_by(set, made) if fn is set else ConstantVariable(frozenset(made))
        if fn is abs and len(args) == 1 and not kwargs and isinstance(args[0], SymIntVariable) \
                and type(args[0].example) is float:
            return tx.output.sym_arith(operator.abs, args[0])        # abs(v) of a float input
        if fn is pow and len(args) == 2 and not kwargs and any(isinstance(a, SymIntVariable) for a in args):
            return tx.binary("**", *args)
        if all(a.is_constant() for a in args) and all(v.is_constant() for v in kwargs.values()):
            return ConstantVariable(tx.on_constants(fn, *[a.as_example() for a in args],
                                                    **{k: v.as_example() for k, v in kwargs.items()}))
        if fn in (abs, pow) and _contains_tensor(list(args)):
            return tx.output.call("call_function", fn, args, kwargs)
        raise tx.unsupported(f"builtin {fn.__name__}() on non-constant arguments",
                             hint="it would need the tensor's values")
    return impl


# A float made an int (`int(n / 2)`, `math.floor(h * scale)`): the size it gives stays symbolic
FLOAT_TO_INT = {int: math.trunc, math.trunc: math.trunc, math.floor: math.floor, math.ceil: math.ceil}


def number_conversion(tx, fn, v: SymIntVariable) -> VariableTracker:
    """int(T), float(T), int(n / 2), math.floor(h * scale) of a symbolic number: still symbolic
    (int of a float a graph node; the conversion of a number to its own type the number itself)."""
    if fn is type(v.example) or fn in (math.floor, math.ceil, math.trunc) and type(v.example) is int:
        return v
    if fn is float:
        return tx.output.sym_arith(torch.sym_float, v)
    if any(type(getattr(d.node, "meta", {}).get("example_value")) is float for d in v.deps):
        # an int of a float input (int(lr * 10)): not a size the backend can compute
        return ConstantVariable(fn(v.as_example()))
    return tx.output.sym_arith(FLOAT_TO_INT[fn], v)


def _builtin_print(tx, args, kwargs):
    raise tx.unsupported("call to builtin print()", "printing is a side effect the graph "
                         "cannot hold", "remove the print, or print outside the compiled code")


def _builtin_iter(kind):
    """iter, enumerate, zip, map, filter (lazy, as Python's: iterators.py), reversed."""
    def impl(tx, args, kwargs):
        from .iterators import ITERATORS, iter_of
        if kind == "iter":
            return iter_of(tx, args[0])
        if kind == "reversed":
            if isinstance(args[0], ITERATORS):
                raise tx.unsupported(f"reversed() of {args[0].describe()}", "it is not reversible")
            v = args[0]
            if isinstance(v, UserObjectVariable):
                method = class_attr(type(v.value), "__reversed__")
                if isinstance(method, types.FunctionType):          # its class's own
                    return iter_of(tx, tx.inline_call(method, [v], {}))
                if method is None and not (class_attr(type(v.value), "__len__") is not None and
                                           class_attr(type(v.value), "__getitem__") is not None):
                    raise tx.observed(TypeError(f"'{type(v.value).__name__}' object is not reversible"))
            if isinstance(v, SetVariable) or isinstance(v, ConstantVariable) and isinstance(v.value, (set, frozenset)):
                name = "set" if isinstance(v, SetVariable) else type(v.value).__name__
                raise tx.observed(TypeError(f"'{name}' object is not reversible"))
            if type(args[0]) is ListVariable:       # from its last item down, read as it goes
                return IteratorVariable([], over=args[0], backward=True, python_type=type(reversed([])))
            return IteratorVariable(list(reversed(tx.iterate(args[0]))))
        if kind == "enumerate":
            start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
            return LazyIteratorVariable("enumerate", [iter_of(tx, args[0])], count=start.as_example())
        if kind == "zip":
            strict = kwargs.get("strict", ConstantVariable(False)).as_example()
            return LazyIteratorVariable("zip", [iter_of(tx, a) for a in args], strict=strict)
        fn, rest = args[0], args[1:]
        return LazyIteratorVariable(kind, [iter_of(tx, a) for a in rest], fn=fn)      # map, filter
    return impl


def _islice(tx, args, kwargs):
    """itertools.islice(it, [start,] stop[, step]): lazy, so a generator (an endless one too)
    is run only as far as the items taken."""
    from .iterators import iter_of
    if kwargs or not all(a.is_constant() for a in args[1:]):
        raise tx.unsupported("itertools.islice with bounds that are not constants")
    bounds = slice(*[a.as_example() for a in args[1:]])
    return LazyIteratorVariable("islice", [iter_of(tx, args[0])], count=(0, 0),
                                bounds=(bounds.start or 0, bounds.stop, bounds.step or 1))


def _itertools(fn):
    """A function of itertools over the traced values: the items of each iterable argument
    (loops are unrolled, so all are known) through the real function; what it groups becomes
    tuples of the same variables."""
    def impl(tx, args, kwargs):
        if any(not v.is_constant() for v in kwargs.values()):
            raise tx.unsupported(f"itertools.{fn.__name__} with keyword arguments that are not constants")
        real = [a.as_example() if isinstance(a, ConstantVariable) and not isinstance(a.value, (tuple, list, str, range))
                else tx.iterate(a) for a in args]
        out = fn(*real, **{k: v.as_example() for k, v in kwargs.items()})

        def variable(v):                     # the traced items, and constants (a fillvalue)
            if isinstance(v, tuple):
                return TupleVariable([variable(x) for x in v])
            return v if isinstance(v, VariableTracker) else ConstantVariable(v)
        return IteratorVariable([variable(t) for t in itertools.islice(out, 100_000)])
    return impl


def _itertools_repeat(tx, args, kwargs):
    """itertools.repeat(obj, times): the one variable, `times` times (obj is an item, not an
    iterable; without `times` the iterator never ends, which a trace cannot unroll)."""
    bound = dict(zip(("object", "times"), args), **kwargs)
    times = bound.get("times")
    if "object" not in bound or times is None or not times.is_constant() or len(bound) != len(args) + len(kwargs):
        raise tx.unsupported("itertools.repeat() without a constant number of times")
    return IteratorVariable([bound["object"]] * max(times.as_example(), 0))


def _functools_reduce(tx, args, kwargs):
    """functools.reduce(fn, iterable[, initial]): fn called item by item (loops are unrolled)."""
    if kwargs or len(args) not in (2, 3):
        raise tx.unsupported("functools.reduce() with keyword arguments")
    items = tx.iterate(args[1])
    if len(args) == 3:
        acc = args[2]
    elif items:
        acc, items = items[0], items[1:]
    else:
        raise tx.unsupported("functools.reduce() of an empty iterable without an initial value")
    for item in items:
        acc = tx.call_function(args[0], [acc, item], {})
    return acc


def _builtin_next(tx, args, kwargs):
    from .iterators import ITERATORS, next_item, stop_iteration
    if not isinstance(args[0], ITERATORS):
        raise tx.unsupported(f"next() of {args[0].describe()}")
    item = next_item(tx, args[0])
    if item is not None:
        return item
    if len(args) > 1:
        return args[1]
    raise tx.observed(stop_iteration(args[0]))


def _builtin_reduce(kind):
    def impl(tx, args, kwargs):
        if kind in ("any", "all") and len(args) == 1:
            # item by item, stopping where the answer is known (a generator is left there)
            from .iterators import iter_of, next_item
            it = iter_of(tx, args[0])
            while (item := next_item(tx, it)) is not None:
                if tx.truth(item, kind) == (kind == "any"):
                    return ConstantVariable(kind == "any")
            return ConstantVariable(kind == "all")
        items = tx.iterate(args[0]) if len(args) == 1 else list(args)
        if kind == "sum":
            start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
            if start.is_constant() and isinstance(start.as_example(), (str, bytes, bytearray)):
                tx.on_constants(sum, (), start.as_example())     # Python's TypeError ("use ''.join")
            items = tx.iterate(args[0]) if len(args) > 1 else items   # (an iterator is read once)
            acc = start
            for it in items:
                acc = tx.binary("+", acc, it)
            return acc
        if kind in ("min", "max") and not kwargs and any(isinstance(i, SymIntVariable) for i in items) \
                and all(isinstance(i, SymIntVariable) or i.is_constant() and type(i.value) in (int, float)
                        for i in items):
            # of sizes (or floats made of them: torch_ema's min(decay, (1 + n) / (10 + n))): each
            # comparison answered on the symbols (guarded where it depends on them)
            best = items[0]
            for other in items[1:]:
                better = tx.output.sym_compare(operator.lt if kind == "max" else operator.gt, best, other)
                if better is None:
                    break
                best = other if better else best
            else:
                return best
        if kind in ("min", "max", "sorted") and (not all(i.is_constant() for i in items) or
                                                 not all(v.is_constant() for v in kwargs.values())):
            order = sort_order(tx, items, kwargs, kind)
            if kind == "sorted":
                return ListVariable([items[j] for j in order])
            if order:
                return items[order[0]]
            if "default" in kwargs:
                return kwargs["default"]
            tx.on_constants(min if kind == "min" else max, [])      # Python's ValueError
        if all(i.is_constant() for i in items) and all(v.is_constant() for v in kwargs.values()):
            fn = {"min": min, "max": max, "any": any, "all": all, "sorted": sorted}[kind]
            # (Python's own error where it raises: max([]), a key that fails)
            r = tx.on_constants(fn, [i.as_example() for i in items], **{k: v.as_example() for k, v in kwargs.items()})
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


def sort_order(tx, items, kwargs, kind: str = "sorted") -> list:
    """The positions of `items` in the order sorted() (min/max: the first, the best) puts
    them, their keys computed in the trace (`key=`, called item by item) and Python constants."""
    key, reverse = kwargs.get("key"), kwargs.get("reverse", ConstantVariable(False))
    if not reverse.is_constant() or set(kwargs) - {"key", "reverse", "default"}:
        raise tx.unsupported(f"{kind}() with arguments that are not constants")
    keys = [item if key is None or _is_none(key) else tx.call_function(key, [item], {}) for item in items]
    if all(k.is_constant() for k in keys):
        values = [k.as_example() for k in keys]
    else:
        # tuples compared item by item, as far as the first that differs (sorted(d.items())
        # of distinct names: the values, tensors, are never compared)
        values = [_ComparedAsPython(k, tx, kind) for k in keys]
    if kind == "sorted":
        return sorted(range(len(items)), key=values.__getitem__, reverse=reverse.as_example())
    pick = min if kind == "min" else max
    return [pick(range(len(items)), key=values.__getitem__)] if items else []


@functools.total_ordering
class _ComparedAsPython:
    """A sort key as Python compares it: a tuple item by item, up to the first items that
    differ, each a constant; a comparison that reaches another value is refused (its order would
    depend on tensors' values)."""

    def __init__(self, key, tx, kind):
        self.parts = key.items if isinstance(key, TupleVariable) else None
        self.key, self.tx, self.kind = key, tx, kind

    def _order(self, other) -> int:
        if self.parts is not None and other.parts is not None:
            for a, b in zip(self.parts, other.parts):
                if not (a.is_constant() and b.is_constant()):
                    break
                if a.as_example() != b.as_example():
                    return -1 if a.as_example() < b.as_example() else 1
            else:
                return (len(self.parts) > len(other.parts)) - (len(self.parts) < len(other.parts))
        elif self.key.is_constant() and other.key.is_constant():
            a, b = self.key.as_example(), other.key.as_example()
            return 0 if a == b else -1 if a < b else 1
        raise self.tx.unsupported(f"{self.kind}() of values whose keys are not constants",
                                  "which comes first would depend on tensors' values")

    def __eq__(self, other):
        return self._order(other) == 0

    def __lt__(self, other):
        return self._order(other) < 0


def _builtin_setattr(tx, args, kwargs):
    """setattr(obj, name, value), and delattr(obj, name) as the value DELETED."""
    obj, name, value = args if len(args) == 3 else (*args, DELETED)
    if not isinstance(name, ConstantVariable) or not isinstance(name.value, str):
        raise tx.unsupported("setattr()/delattr() with a name that is not a constant")
    tx.store_attr(obj, name.value, value)
    return ConstantVariable(None)


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
                key = dict_key(k)              # (a constant, a class or function, a tensor)
                if key is NO_KEY:
                    raise tx.unsupported(f"dict() with a key {k.describe()}")
                items[key] = v
    items.update(kwargs)
    return DictVariable(items)


def _builtin_callable(tx, args, kwargs):
    v = args[0]
    if v.is_constant():
        return ConstantVariable(callable(v.as_example()))
    if isinstance(v, UserObjectVariable):            # its class is guarded, and what it has
        cls = type(v.value)
        if callable(v.value):
            tx.class_member(cls, "__call__")
        else:
            tx.output.guards.class_lacks(cls, "__call__", metaclass=False)
        return ConstantVariable(callable(v.value))
    if isinstance(v, _NOT_CALLABLE):
        return ConstantVariable(False)
    if isinstance(v, _CALLABLE):
        return ConstantVariable(True)
    raise tx.unsupported(f"callable() of {v.describe()}")


_NOT_CALLABLE = (TensorVariable, BaseListVariable, DictVariable, DictViewVariable, IteratorVariable,
                 GeneratorVariable, LazyIteratorVariable, SliceVariable, ExceptionVariable, SuperVariable,
                 NullContextVariable, CellVariable, PythonModuleVariable)
# (a grad-mode or autocast context manager object is a decorator too: callable)
_CALLABLE = (CallableVariable, NNModuleVariable, TensorMethodVariable, BoundMethodVariable, ConstantMethodVariable,
             PartialVariable, NestedFunctionVariable, OperatorGetterVariable, GradModeVariable, AutocastVariable,
             InferenceModeVariable)


def _builtin_type(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        raise tx.unsupported("type() with three arguments (a new class)",
                             "classes made in the frame run as Python")
    v = args[0]
    if isinstance(v, TensorVariable):
        return tx.output.wrap(type(v.example), None)
    if isinstance(v, ModuleSliceVariable):
        return tx.output.wrap(v.module_cls, None)
    if isinstance(v, BaseListVariable):
        return tx.output.wrap(v.python_type, None)
    # an object's type is guarded; read from a source, so are the class attributes read from it
    source = attr_source(v, "__class__") if getattr(v, "source", None) is not None else None
    if isinstance(v, ModelOutputVariable):
        return TypeVariable(v.cls, source)
    if isinstance(v, DictVariable):
        return tx.output.wrap(v.cls, None)
    if isinstance(v, NNModuleVariable):
        return TypeVariable(type(v.module), source)
    if isinstance(v, UserObjectVariable):
        cls = type(v.value)
        if source is None:                 # an object made in the frame (OutputGraph.wrap)
            return tx.output.wrap(cls, None)
        return TypeVariable(cls, source)
    if isinstance(v, (IteratorVariable, GeneratorVariable, LazyIteratorVariable)) and v.python_type is not None:
        return tx.output.wrap(v.python_type, None)         # (eager's: tuple_iterator...)
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


def _tuple_new(tx, args, kwargs):
    """tuple.__new__(cls, items), as a tuple subclass's own __new__ calls it through super()
    (e3nn's Irreps, Irrep): of constant items, the instance itself, a constant as a tuple of
    constants read from outside is. Items that are not constants are not modelled."""
    if kwargs or not 1 <= len(args) <= 2 or not isinstance(args[0], TypeVariable) \
            or not issubclass(args[0].value, tuple):
        raise tx.unsupported("tuple.__new__ with these arguments")
    items = _builtin_container(TupleVariable)(tx, args[1:], {}).items
    if not all(i.is_constant() for i in items):
        raise tx.unsupported(f"a {args[0].value.__qualname__} holding values that are not constants",
                             "an instance of a tuple subclass is modelled as a constant")
    return ConstantVariable(tuple.__new__(args[0].value, [i.as_example() for i in items]))


def tuple_subclass_with_python_new(cls) -> bool:
    """A tuple subclass whose instances its own Python __new__ makes (e3nn's Irreps("1o")), with
    no __init__ of its own: `cls(...)` is that __new__, inlined."""
    return isinstance(cls, type) and type(cls) is type and issubclass(cls, tuple) \
        and not hasattr(cls, "_fields") and not issubclass(cls, torch.Size) \
        and isinstance(class_attr(cls, "__new__"), staticmethod) \
        and isinstance(class_attr(cls, "__new__").__func__, types.FunctionType) \
        and class_attr(cls, "__init__") is object.__init__


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
    setattr: _builtin_setattr, delattr: _builtin_setattr, functools.reduce: _functools_reduce,
    issubclass: _builtin_issubclass, vars: _builtin_vars, tuple.__new__: _tuple_new,
}
for _f in (itertools.product, itertools.chain, itertools.chain.from_iterable, itertools.combinations,
           itertools.combinations_with_replacement, itertools.permutations,
           itertools.zip_longest, itertools.pairwise):
    _BUILTIN_HANDLERS[_f] = _itertools(_f)
_BUILTIN_HANDLERS[itertools.repeat] = _itertools_repeat
_BUILTIN_HANDLERS[itertools.islice] = _islice
for _f in (int, float, bool, str, abs, pow, round, range, slice, divmod, hash, repr, chr, ord,
           set, frozenset, complex, format, ascii, bin, hex, oct):
    _BUILTIN_HANDLERS[_f] = _builtin_const(_f)


# the methods of builtin containers that only read: run on the real object, with a guard on
# what they read (a dict's keys, a list's length and the item returned)
_CONTAINER_READS = {dict: {"get", "__getitem__", "__contains__", "keys", "__len__", "copy"},
                    list: {"__getitem__", "__len__", "index", "count", "__contains__", "copy"},
                    tuple: {"__getitem__", "__len__", "index", "count", "__contains__"}}


class ContainerReadVariable(VariableTracker):
    """A reading method of dict/list/tuple on an instance of a subclass read from outside the
    frame (`super().get(key)` in a dict subclass): what it reads is guarded through the
    instance's source, and an item it returns is wrapped with its own source."""

    def __init__(self, obj: "UserObjectVariable", method):
        self.obj, self.method = obj, method

    @staticmethod
    def of(obj, attr) -> Optional["ContainerReadVariable"]:
        if not isinstance(obj, UserObjectVariable) or obj.source is None:
            return None
        owner = getattr(attr, "__objclass__", None)
        if getattr(attr, "__name__", None) in _CONTAINER_READS.get(owner, ()) and isinstance(obj.value, owner):
            return ContainerReadVariable(obj, attr)
        # (a collections.abc.Mapping's get/in are Python: inlined, they run its own
        # __getitem__ in the trace, as often as eager does, with its side effects)
        return None

    def call(self, tx, args, kwargs) -> VariableTracker:
        real, source, out = self.obj.value, self.obj.source, tx.output
        if kwargs or not all(a.is_constant() for a in args):
            raise tx.unsupported(f"{self.describe()} with arguments that are not constants")
        values = [a.as_example() for a in args]
        if isinstance(real, dict):
            out.guards.mapping_keys(source, real)
        else:
            out.guards.sequence(source, real)
        result = self.method(real, *values)
        name = self.method.__name__
        if name in ("get", "__getitem__") and values and not isinstance(values[0], slice) and \
                (values[0] in real if isinstance(real, dict) else True):
            # a subclass with a __getitem__ of its own (that the trace runs): read past it
            base = next(b for b in (dict, list, tuple) if isinstance(real, b))
            via = base.__name__ if type(real).__getitem__ is not base.__getitem__ else None
            return out.wrap(result, item_source(source, values[0], list(real).index(values[0]), via)
                            if isinstance(real, dict) else ItemSource(source, values[0], via))
        if is_constant_value(result):
            return ConstantVariable(result)
        raise tx.unsupported(f"{self.describe()} returned a {type(result).__name__}")

    def describe(self):
        return f"{type(self.obj.value).__name__}.{self.method.__name__}"


def _runs_for_real(fn) -> bool:
    """Functions whose result depends on their arguments alone and is not changed afterwards
    (inspecting a function's signature, a dataclass's fields, math): called on constant
    arguments, they run as they are while tracing, and their result is a constant of the code,
    as Dynamo's InspectSignatureVariable does for inspect.signature."""
    if fn in _PURE_FUNCTIONS:
        return True
    module = getattr(fn, "__module__", None) or ""
    return module == "math" and callable(fn)


_PURE_FUNCTIONS = {inspect.signature, inspect.getfullargspec, inspect.isclass, inspect.isfunction,
                   inspect.ismethod, inspect.isgeneratorfunction, inspect.iscoroutinefunction,
                   inspect.isbuiltin, inspect.isroutine, inspect.getmro, inspect.unwrap,
                   dataclasses.fields, dataclasses.is_dataclass, torch.finfo, torch.iinfo,
                   np.iinfo, np.finfo, np.dtype, torch.device,
                   re.compile, re.match, re.fullmatch, re.search, re.findall, re.split, re.escape}


# torch's "am I being compiled?" functions, and what they answer while capture traces
_COMPILING_QUERIES = {f: answer for f, answer in (
    (getattr(torch.compiler, "is_compiling", None), True),
    (getattr(torch.compiler, "is_dynamo_compiling", None), True),
    (getattr(torch.compiler, "is_exporting", None), False),
    (getattr(torch._C, "_is_torch_function_mode_enabled", None), None),
) if f is not None and answer is not None}


def _constant_state(obj, depth: int = 0) -> bool:
    """obj's attributes are constants, containers of them, or objects of the same kind (a
    config and its sub-configs): what a copy can be made of while tracing."""
    if is_constant_value(obj):
        return True
    if depth > 4:
        return False
    if isinstance(obj, (list, tuple, set, frozenset)):
        return all(_constant_state(v, depth + 1) for v in obj)
    if isinstance(obj, dict):
        return all(is_constant_value(k) and _constant_state(v, depth + 1) for k, v in obj.items())
    if isinstance(obj, (torch.Tensor, torch.nn.Module, types.FunctionType, types.ModuleType)):
        return False
    d = getattr(obj, "__dict__", None)
    return type(obj).__module__ not in ("builtins",) and d is not None and \
        not any(name in vars(k) for k in type(obj).__mro__[:-1] for name in _COPY_HOOKS) and \
        all(_constant_state(v, depth + 1) for v in d.values())


# a class's own code that copy.copy/deepcopy would run: a copy made once at the trace would
# not run it on each call (a fresh id, a log)
_COPY_HOOKS = ("__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__",
               "__getnewargs__", "__getnewargs_ex__", "__new__")


def _is_singleton(v) -> bool:
    return isinstance(v, ConstantVariable) and any(v.value is c for c in (None, True, False, Ellipsis, NotImplemented))


def _is_none(v) -> bool:
    return v is None or isinstance(v, ConstantVariable) and v.value is None


def class_attr(cls, name: str, default=None):
    """What an instance of cls finds for `name` on its class: the first class of its MRO that
    has it (inspect.getattr_static(cls, name) would look at cls's metaclass too: an Enum
    member has no __len__ of EnumType's)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return default


def python_method(cls, name: str):
    """cls's `name` where it is a Python function (a class's own __getattribute__), else None."""
    attr = class_attr(cls, name)
    return attr if isinstance(attr, types.FunctionType) else None


def attr_source(obj, name: str) -> Optional[Source]:
    """Where `obj.name` is read from, for the guard: past the class's own __getattribute__
    where it has one in Python (the trace runs that itself)."""
    if obj.source is None:
        return None
    if isinstance(obj, UserObjectVariable) and python_method(type(obj.value), "__getattribute__"):
        return GenericAttrSource(obj.source, name)
    return AttrSource(obj.source, name)


def _custom_getattr(cls) -> bool:
    """The class (not object) decides attribute reads: a __getattribute__ or __getattr__ of
    its own (a builtin base's generic one, dict's say, does not count)."""
    getattribute = class_attr(cls, "__getattribute__")
    generic = getattribute is object.__getattribute__ or \
        isinstance(getattribute, types.WrapperDescriptorType) and getattribute.__objclass__ in _BUILTIN_BASES
    return not generic or class_attr(cls, "__getattr__") is not None


# builtin types whose __getattribute__ is Python's generic one (they define it only as a slot)
_BUILTIN_BASES = (object, dict, list, tuple, set, frozenset, str, int, float, type)


# classes of the standard library's and torch's written in Python, whose methods the capture
# can trace (torch.func.functional_call swaps a module's tensors through a NamedMemberAccessor)
_PYTHON_LIBRARY_CLASSES = {contextlib._GeneratorContextManager, contextlib.suppress,
                           NamedMemberAccessor}


def is_distribution(cls) -> bool:
    """A torch.distributions class (Normal, Categorical..., their constraints and transforms): Python
    objects over tensors, made in the frame as a user's class is (their argument validation is
    a branch to a raise, checked in the graph)."""
    return isinstance(cls, type) and issubclass(cls, (torch.distributions.Distribution,
                                                      torch.distributions.constraints.Constraint,
                                                      torch.distributions.transforms.Transform))


def _is_plain_user_class(cls, past_metaclass_call: bool = False) -> bool:
    """A class written in Python whose instances are ordinary objects (no custom __new__, no
    metaclass that changes how an instance is made, not a torch or builtin type; __slots__ are
    fine): safe to create inside the trace. past_metaclass_call: its metaclass's own __call__
    is traced (or is being), so only type.__call__'s part remains."""
    if not isinstance(cls, type) or not issubclass(type(cls), type):
        return False
    meta_call = class_attr(type(cls), "__call__")
    if meta_call is not type.__call__ and not (past_metaclass_call and isinstance(meta_call, types.FunctionType)):
        return False
    top = cls.__module__.split(".")[0]
    if (top in sys.stdlib_module_names or top in ("torch", "builtins", "numpy")) and \
            cls not in _PYTHON_LIBRARY_CLASSES and not is_distribution(cls):
        return False
    if issubclass(cls, (BaseException, torch.nn.Module, torch.Tensor, tuple, list, dict, set)):
        return False
    return class_attr(cls, "__new__") is object.__new__
