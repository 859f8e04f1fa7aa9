"""Iterators the trace steps through one item at a time.

Takes: an iterator variable and the translator that asks for its next item (a for loop,
next(), list(), any(), zip()...). Hands on: the next item as a VariableTracker, or None once
the iterator is exhausted, with whatever producing it does done in the trace when CPython
would do it:

- IteratorVariable: items already known (a list's, a module list's): the next one;
- GeneratorVariable: a generator made in the trace (a generator function called, a generator
  expression): its frame runs to its next `yield` or its return, so what it does interleaves
  with what its consumer does as in CPython, and a generator partly consumed is left partly
  run (any() stops at the first true item; next() runs one step);
- LazyIteratorVariable: map, filter, zip, enumerate, itertools.islice: one item of each
  underlying iterator per item asked for, the function called on it then.

Each step is recorded (OutputGraph.record_mutation: the iterator's state), so a graph break
inside an inlined call rolls iterators back with everything else. A generator the frame lets
go of part way (a loop left by break or return, a returning frame's local) is closed then, as
CPython's reference counting closes it (`dropped`): its finally blocks run in the trace. One
let go of otherwise inside a `with` block of its own (a temporary: `next(gen())`), or still
paused at a graph break, is not modelled: the frame runs as Python (trace.py).
"""
from __future__ import annotations

import collections.abc
import types
from typing import List, Optional

from .breaks import ObservedException, Yield
from .builtin_calls import class_attr
from .values import (BaseListVariable, ConstantVariable, DictVariable, DictViewVariable, ExceptionVariable,
                     GeneratorVariable, IteratorVariable, LazyIteratorVariable, ListVariable, TupleVariable,
                     UserObjectVariable, VariableTracker, key_variable)

ITERATORS = (IteratorVariable, GeneratorVariable, LazyIteratorVariable)


def iter_of(tx, v: VariableTracker) -> VariableTracker:
    """iter(v): an iterator is its own; an object's is what its class's Python __iter__ gives;
    anything else's items are known now."""
    if isinstance(v, ITERATORS):
        return v
    if isinstance(v, UserObjectVariable):
        it = user_iter(tx, v)
        if it is not None:
            return it
    if type(v) is ListVariable:                                   # read as the loop goes
        return IteratorVariable([], python_type=_iterator_type(v), over=v)
    d = IteratorVariable.dict_of(v)
    if d is not None:                                             # a dict or a view of one
        return IteratorVariable([key_variable(k) for k in d.items], python_type=_iterator_type(v), over=v)
    return IteratorVariable(tx.iterate(v), python_type=_iterator_type(v))


def _iterator_type(v: VariableTracker) -> Optional[type]:
    """The type of iter(v) in eager (list_iterator...), where v's own type is known."""
    if isinstance(v, BaseListVariable):
        return type(iter(v.python_type() if not isinstance(v, TupleVariable) else ()))
    if isinstance(v, DictVariable):
        return type(iter({}))
    if isinstance(v, DictViewVariable):
        return type(iter(getattr({}, v.kind)()))
    if isinstance(v, ConstantVariable) and isinstance(v.value, (str, tuple, range, frozenset, bytes)):
        return type(iter(v.value))
    return None


def user_iter(tx, v: UserObjectVariable) -> Optional[VariableTracker]:
    """The iterator the Python __iter__ of v's class gives (a generator, often); None where it
    has none (collections.abc.Sequence's is left to iterate(), which reads the items by len)."""
    method = class_attr(type(v.value), "__iter__")
    if not isinstance(method, types.FunctionType) or method is collections.abc.Sequence.__iter__:
        return None
    it = tx.inline_call(method, [v], {})
    kind = _non_iterator_type(it)
    if kind is not None:                   # CPython's iter() checks that __iter__ gave an iterator
        raise tx.observed(TypeError(f"iter() returned non-iterator of type '{kind.__name__}'"))
    return iter_of(tx, it)


def _non_iterator_type(v: VariableTracker) -> Optional[type]:
    """The type of v where it is known not to be an iterator (no __next__), else None."""
    if isinstance(v, BaseListVariable):
        return v.python_type
    if isinstance(v, DictVariable):
        return v.cls
    if isinstance(v, DictViewVariable):
        return type(getattr({}, v.kind)())
    kind = type(v.value) if isinstance(v, UserObjectVariable) else type(v.as_example()) if v.is_constant() else None
    return kind if kind is not None and class_attr(kind, "__next__") is None else None


def next_item(tx, it: VariableTracker, sent: Optional[VariableTracker] = None) -> Optional[VariableTracker]:
    """The next item of `it` (`sent`: what a generator's paused yield evaluates to, for
    send() and `yield from`), or None where it is exhausted."""
    out = tx.output
    if isinstance(it, IteratorVariable):
        d = it.dict_of(it.over)
        if d is not None and len(d.items) != it.size:         # (checked first, as CPython does)
            raise tx.observed(RuntimeError("dictionary changed size during iteration"))
        i = it.index
        if not 0 <= i < len(it.items):
            if it.over is not None:     # CPython's lets go of its container: exhausted for good
                out.record_mutation(it)
                it._items, it.over = [], None
            return None
        out.record_mutation(it)
        out.advanced(it)
        it.index += -1 if it.backward else 1
        return it.item(i)
    if isinstance(it, GeneratorVariable):
        return _resume(tx, it, sent)
    if isinstance(it, LazyIteratorVariable):
        if it.kind == "filter":
            while True:
                item = next_item(tx, it.iterators[0])
                if item is None:
                    return None
                keep = item if _is_none(it.fn) else tx.call_function(it.fn, [item], {})
                if tx.truth(keep, "filter"):
                    return item
        if it.kind == "islice":
            start, stop, step = it.bounds
            read, given = it.count
            wanted = start + given * step             # the index of the next item it gives
            if stop is not None and wanted >= stop:
                return None
            out.record_mutation(it)
            while True:
                item = next_item(tx, it.iterators[0])
                if item is None:
                    return None
                read += 1
                it.count = (read, given)
                if read - 1 == wanted:
                    it.count = (read, given + 1)
                    return item
        items = []
        for sub in it.iterators:                  # left to right, stopping at the first exhausted
            item = next_item(tx, sub)
            if item is None:
                if it.strict and (items or any(next_item(tx, s) is not None for s in it.iterators[1:])):
                    raise tx.unsupported("zip(strict=True) of iterables of unequal lengths")
                return None
            items.append(item)
        if it.kind == "map":
            return tx.call_function(it.fn, items, {})
        if it.kind == "enumerate":
            out.record_mutation(it)
            it.count += 1
            return TupleVariable([ConstantVariable(it.count - 1), items[0]])
        return TupleVariable(items)                                    # zip
    raise tx.unsupported(f"next() of {it.describe()}")


def drain(tx, it: VariableTracker) -> List[VariableTracker]:
    """Every item `it` has left (list(it), sum(it), a for loop's unrolling)."""
    items = []
    while True:
        item = next_item(tx, it)
        if item is None:
            return items
        items.append(item)


def throw(tx, gen: GeneratorVariable, exc) -> Optional[VariableTracker]:
    """gen.throw(exc): raised where the generator is paused (its handlers see it) -> what it
    yields next, None where it returns; what it does not catch is raised to the caller."""
    tx.output.record_mutation(gen)
    if not gen.started or gen.done:
        gen.done = True
        raise ObservedException(exc)
    try:
        gen.tx.handle_exception(exc)
    except ObservedException:
        gen.done = True
        raise
    return _run(gen)


def close(tx, gen: GeneratorVariable) -> None:
    """gen.close(): GeneratorExit thrown where it is paused, so its finally blocks run."""
    if not gen.started or gen.done:
        tx.output.record_mutation(gen)
        gen.done = True
        return
    try:
        item = throw(tx, gen, ExceptionVariable(GeneratorExit, []))
    except ObservedException as e:
        if not issubclass(e.exc.cls, (GeneratorExit, StopIteration)):
            raise
        return
    if item is not None:
        raise tx.observed(RuntimeError("generator ignored GeneratorExit"))


def dropped(tx, gens, roots, leaving: bool = False) -> None:
    """Generators the frame lets go of (the iterator a loop's `break` or `return` pops, a
    frame's locals as it returns): CPython closes one when its last reference goes, so that its
    finally blocks and `with` exits run then. Closed here in that order, unless something the
    trace still has reaches it (`roots`, the frames running but the one `leaving`, what the
    trace changed outside)."""
    gens = [g for g in gens if isinstance(g, GeneratorVariable) and g.started and not g.done]
    if not gens:
        return
    running = [t for t in tx.output.running if not (leaving and t is tx)]
    reachable = _reachable(list(roots) + running + _changed_outside(tx.output))
    for gen in gens:
        if id(gen) not in reachable:
            close(tx, gen)


def suspended(tx, roots) -> List[GeneratorVariable]:
    """The generators of the trace paused part way (started, not finished) that `roots` or
    what the trace changed outside still reach."""
    reached = _reachable(list(roots) + _changed_outside(tx.output)).values()
    return [g for g in reached if isinstance(g, GeneratorVariable) and g.started and not g.done]


def let_go_in_a_block(tx, roots) -> List[GeneratorVariable]:
    """The generators of the trace paused inside a `with` block that nothing reaches any more
    (not `roots`, nor what the trace changed outside): let go of part way (a temporary,
    `next(gen())`), which CPython closed then, leaving the block then, and the trace did not."""
    paused = [g for g in tx.output.generators if g.started and not g.done and g.tx.with_depth]
    if not paused:
        return []
    reached = _reachable(list(roots) + _changed_outside(tx.output))
    return [g for g in paused if id(g) not in reached]


def _changed_outside(out) -> list:
    """The variables of what the trace changed outside the frame (they outlive it)."""
    return (out.side_effects + list(out.cells.values()) + list(out._global_writes.values())
            + [v for _, v in out._containers.values()])


def _reachable(roots) -> dict:
    """The trace's objects (variables, frames, their containers) that `roots` reach, by id."""
    seen, todo = {}, list(roots)
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen[id(obj)] = obj
        if isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif type(obj).__module__.startswith(__package__) and hasattr(obj, "__dict__"):
            # a variable or a frame of the trace (not the OutputGraph: its tables are roots; not
            # a frame's caller: one running is a root, and a generator's creator may be gone)
            todo.extend(v for k, v in vars(obj).items() if k not in ("output", "parent"))
    return seen


def _resume(tx, gen: GeneratorVariable, sent: Optional[VariableTracker]) -> Optional[VariableTracker]:
    if gen.done:
        if not _is_none(gen.return_value):      # it gives what it returned once, then nothing
            tx.output.record_mutation(gen)
            gen.return_value = ConstantVariable(None)
        return None
    if not gen.started and sent is not None and not (isinstance(sent, ConstantVariable) and sent.value is None):
        raise tx.unsupported("send() of a value to a generator that has not started")
    tx.output.record_mutation(gen)
    if gen.started:
        gen.tx.push(sent if sent is not None else ConstantVariable(None))   # what its yield gives
    else:
        tx.output.generators.append(gen)
    gen.started = True
    return _run(gen)


def _run(gen: GeneratorVariable) -> Optional[VariableTracker]:
    """Run the generator's frame to its next yield (-> the value) or its end (-> None)."""
    try:
        gen.return_value = gen.tx.run()
    except Yield as y:
        return y.value
    except ObservedException as e:
        gen.done = True                  # an exception ends a generator (and goes to its reader)
        raise ObservedException(pep_479(e.exc)) from None
    gen.done = True
    return None


def stop_iteration(it: VariableTracker) -> ExceptionVariable:
    """The StopIteration that says `it` is exhausted: a generator's holds what it returned
    (e.value), as CPython's."""
    value = it.return_value if isinstance(it, GeneratorVariable) else ConstantVariable(None)
    return ExceptionVariable(StopIteration, [] if _is_none(value) else [value], {"value": value})


def pep_479(exc: VariableTracker) -> VariableTracker:
    """What leaves a generator's body for `exc` raised in it: a StopIteration becomes a
    RuntimeError (PEP 479; 3.12's bytecode says so itself: INTRINSIC_STOPITERATION_ERROR)."""
    if isinstance(exc, ExceptionVariable) and issubclass(exc.cls, StopIteration):
        error = ExceptionVariable(RuntimeError, [ConstantVariable("generator raised StopIteration")])
        error.items["__cause__"] = exc
        return error
    return exc


def _is_none(v) -> bool:
    return isinstance(v, ConstantVariable) and v.value is None
