"""torch.utils._pytree's tree functions on traced values, as Dynamo's polyfills model them.

Takes: a call of tree_flatten, tree_leaves, tree_structure, tree_unflatten or tree_map (torch's
own helpers call them: associative_scan, a research model's state handling) with
VariableTracker arguments, from the translator. Hands on: the leaves as the trace's variables,
the structure as a TreeSpec constant, new containers for tree_unflatten.

Which parts are containers is pytree's own answer: pytree runs on a stand-in of the tree, the
containers of their real kinds (lists, tuples, dicts, namedtuples, None, constants) with a
marker in place of each other value, so the spec and the order of the leaves are the ones
eager gets. A value of another kind pytree would take apart (an OrderedDict, a ModelOutput, a
class registered with pytree) is not modelled here (NotModelled): the call is traced as any
other, through pytree's own code.
"""
from __future__ import annotations

import torch.utils._pytree as pytree

from .values import (ConstantVariable, DictVariable, ListVariable, NamedTupleVariable, OpaqueConstantVariable,
                     TupleVariable, UserObjectVariable, VariableTracker)


class NotModelled(Exception):
    """These handlers do not model the call: the translator traces pytree's code instead."""


class _Leaf:
    """A marker for a leaf in the stand-in tree: the variable it stands for."""
    __slots__ = ("var",)

    def __init__(self, var: VariableTracker):
        self.var = var


def _stand_in(v: VariableTracker):
    if type(v) is ListVariable:
        return [_stand_in(i) for i in v.items]
    if type(v) is TupleVariable:
        return tuple(_stand_in(i) for i in v.items)
    if type(v) is NamedTupleVariable:
        return v.holding(_stand_in(i) for i in v.items)
    if type(v) is DictVariable and v.cls is dict and v.factory is None:
        return {k: _stand_in(i) for k, i in v.items.items()}
    if isinstance(v, ConstantVariable) and not isinstance(v, OpaqueConstantVariable):
        return v.value             # a constant, containers of constants too: pytree's to take apart
    kind = type(v.value) if isinstance(v, UserObjectVariable) else getattr(v, "python_type", None)
    if isinstance(kind, type) and (kind in pytree.SUPPORTED_NODES or _is_namedtuple_class(kind)):
        raise NotModelled(v.describe())
    if isinstance(v, (ListVariable, TupleVariable, DictVariable)):
        raise NotModelled(v.describe())
    return _Leaf(v)


def _is_namedtuple_class(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _leaf_variables(leaves: list) -> list:
    return [x.var if isinstance(x, _Leaf) else ConstantVariable(x) for x in leaves]


def _variable(s) -> VariableTracker:
    """The trace's variable for a part of a tree tree_unflatten built: new containers."""
    if isinstance(s, _Leaf):
        return s.var
    if type(s) is list:
        return ListVariable([_variable(i) for i in s])
    if type(s) is tuple:
        return TupleVariable([_variable(i) for i in s])
    if type(s) is dict:
        return DictVariable({k: _variable(i) for k, i in s.items()})
    if _is_namedtuple_class(type(s)):
        return NamedTupleVariable([_variable(i) for i in s], type(s))
    if s is None:
        return ConstantVariable(None)
    raise NotModelled(type(s).__name__)


def _plain(kwargs: dict, name: str) -> None:
    if any(k != "is_leaf" or not (isinstance(v, ConstantVariable) and v.value is None) for k, v in kwargs.items()):
        raise NotModelled(f"{name} with {', '.join(kwargs)}")


def _flatten(args, kwargs):
    _plain(kwargs, "tree_flatten")
    leaves, spec = pytree.tree_flatten(_stand_in(args[0]))
    return _leaf_variables(leaves), spec


def tree_flatten(tx, args, kwargs):
    leaves, spec = _flatten(args, kwargs)
    return TupleVariable([ListVariable(leaves), OpaqueConstantVariable(spec)])


def tree_leaves(tx, args, kwargs):
    return ListVariable(_flatten(args, kwargs)[0])


def tree_structure(tx, args, kwargs):
    return OpaqueConstantVariable(_flatten(args, kwargs)[1])


def _unflattened(variables: list, spec) -> VariableTracker:
    try:
        tree = pytree.tree_unflatten([_Leaf(v) for v in variables], spec)
    except Exception as err:        # (too few leaves, a torch.Size of them): pytree's code raises it
        raise NotModelled(str(err)) from err
    return _variable(tree)


def tree_unflatten(tx, args, kwargs):
    if kwargs or len(args) != 2 or not isinstance(args[1], ConstantVariable) or \
            not isinstance(args[1].value, pytree.TreeSpec):
        raise NotModelled("tree_unflatten of a spec that is not a constant of the code")
    return _unflattened(tx.iterate(args[0]), args[1].value)


def tree_map(tx, args, kwargs):
    if len(args) != 2:
        raise NotModelled("tree_map over several trees")
    _plain(kwargs, "tree_map")
    leaves, spec = pytree.tree_flatten(_stand_in(args[1]))
    leaves = _leaf_variables(leaves)
    _unflattened(leaves, spec)        # (what it builds is modelled: known before fn runs)
    return _unflattened([tx.call_function(args[0], [v], {}) for v in leaves], spec)


HANDLERS = {pytree.tree_flatten: tree_flatten, pytree.tree_leaves: tree_leaves,
            pytree.tree_structure: tree_structure, pytree.tree_unflatten: tree_unflatten,
            pytree.tree_map: tree_map}
