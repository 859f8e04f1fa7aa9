"""A compiled frame as a chain of segments: graph, graph break, resume point, graph, ...

Takes: a function (or bound method) and one call's arguments. Hands on: the result of the call,
computed by running, in order, `Segment`s: each is an FX graph traced from an instruction
offset of the function's code object (0 for the first, a resume point for the others) to a
`return` or to a graph break. At a break:

  1. the graph so far runs (compiled by the backend) and returns every live tensor;
  2. the live Python state (the value stack before the breaking instruction and the live
     locals) is rebuilt from those outputs and the call's own values (a `template`);
  3. the breaking instruction runs for real (`execute`): the call to `print`, to an untraceable
     function (a user function is compiled on its own), the data-dependent jump...;
  4. execution resumes at the next instruction: the segment traced from that offset, cached
     per (code object, offset) and guarded on the live state, like any frame.

This is option 2 of DESIGN.md: TorchDynamo writes new bytecode (a resume function per break);
minicompile keeps the chain as data, and `describe()` shows it as Python.

A frame whose break cannot be resumed (a break inside a loop, as Dynamo's
`maybe_has_backedge` decides; inside a `with` block other than a grad mode's or autocast's,
whose exit a break hands on as a real one; at an instruction that is not a call or a jump)
runs *eagerly* from that segment on, as Dynamo skips the frame: its segments are traced
but not compiled or counted, every user-function call in it is made for real (the callee
compiled on its own), and every unsupported instruction runs for real.
"""
from __future__ import annotations

import builtins
import copy
import dis
import functools
import itertools
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from .. import custom_ops, ir, logs
from . import values as V
from .breaks import Unsupported
from .builtin_calls import class_attr
from .bytecode import (BINARY_OP_SYMBOLS, BINARY_OPS, COMPARE_OPS, _cmp_symbol, current_version,
                       exception_table, handler_at)
from .output_graph import NodeByNode
from .resume import RaisedAt, call_resumed, resume_code

NULL_VALUE = type("NULL_VALUE", (), {"__repr__": lambda self: "NULL"})()
VERSION = current_version()


# ---------------------------------------------------------------------------------------
# Which breaks can be resumed
# ---------------------------------------------------------------------------------------
CALL_OPS = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}
JUMP_OPS = {"POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE",
            "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE",
            "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE",
            "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE",
            "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"}
# Dynamo splits the graph at these (break_graph_if_unsupported + generic_jump); other
# instructions that cannot be traced make it skip the frame
# (BINARY_SUBSCR: `x[mask]`, whose size depends on the mask's values, breaks there in Dynamo too;
# a tensor formatted in an f-string, f"tokens: {n}", is a graph's output Dynamo formats after it)
# (and, unlike Dynamo, at a dict or set display of values the trace cannot hold as keys, a
# module's or a tensor's, rather than run the whole frame eagerly)
RESUMABLE = CALL_OPS | JUMP_OPS | {"STORE_ATTR", "BINARY_SUBSCR", "FORMAT_VALUE", "FORMAT_SIMPLE",
                                   "BUILD_MAP", "BUILD_SET"}
EXECUTABLE = RESUMABLE | {"BINARY_OP", "COMPARE_OP", "BINARY_SUBSCR", "STORE_SUBSCR",
                          "DELETE_SUBSCR", "UNARY_NOT", "UNARY_NEGATIVE", "UNARY_INVERT",
                          "TO_BOOL", "CONTAINS_OP", "IS_OP", "GET_ITER", "STORE_GLOBAL",
                          "LOAD_ATTR", "LOAD_METHOD", "FORMAT_VALUE", "FORMAT_SIMPLE",
                          "BUILD_STRING", "UNPACK_SEQUENCE", "BEFORE_WITH"}
JUMP_NAMES = {dis.opname[o] for o in dis.hasjrel + dis.hasjabs}


def maybe_has_backedge(tx) -> bool:
    """Dynamo's heuristic, exactly: from the breaking instruction to the next return, does any
    jump go back before it? (then the break is taken to be inside a loop)"""
    cur = tx.current.offset
    for inst in tx.instructions[tx.pc:]:
        if inst.opname in ("RETURN_VALUE", "RETURN_CONST"):
            break
        if inst.opname in JUMP_NAMES and isinstance(inst.argval, int) and inst.argval < cur:
            return True
    return False


def live_locals(tx, start_index: int) -> set:
    """Names any instruction reachable from `start_index` may read (a safe over-estimate)."""
    insts, seen, todo, names = tx.instructions, set(), [start_index], set()
    # an exception raised in a try or with block goes on at its handler (a with block's
    # __exit__ may swallow it and the code after the block runs)
    handlers = [(e.start, e.end, e.target) for e in exception_table(tx.code)]
    while todo:
        i = todo.pop()
        while i < len(insts) and i not in seen:
            seen.add(i)
            ins = insts[i]
            todo += [tx.offset_to_index[target] for start, end, target in handlers
                     if start <= ins.offset < end and target in tx.offset_to_index]
            op = ins.opname
            if op.startswith("LOAD_FAST") or op in ("LOAD_DEREF", "LOAD_CLOSURE", "DELETE_FAST",
                                                     "STORE_FAST_LOAD_FAST"):
                v = ins.argval
                names.update(v if isinstance(v, tuple) else (v,))
            if op in JUMP_NAMES and isinstance(ins.argval, int) and ins.argval in tx.offset_to_index:
                todo.append(tx.offset_to_index[ins.argval])
            if op in ("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP",
                      "RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"):
                break
            i += 1
    names.update(tx.code.co_cellvars)
    code = tx.code
    if "super" in code.co_names and "__class__" in code.co_freevars and code.co_argcount:
        names.add(code.co_varnames[0])            # super() reads the first argument unnamed
    if _READS_FRAME_BY_NAME & set(tx.code.co_names):
        names.update(tx.code.co_varnames)        # eval("y"), locals()["y"]: any local
    return names


# what can read a frame's locals without naming them in bytecode
_READS_FRAME_BY_NAME = {"locals", "vars", "dir", "eval", "exec", "_getframe", "currentframe", "f_locals"}


# ---------------------------------------------------------------------------------------
# Executing one instruction for real
# ---------------------------------------------------------------------------------------
def _call_slots(inst, stack: list) -> tuple:
    """Where call instruction `inst`'s values sit on the value stack before it runs: (the index
    of the first value it pops, of its callable, of the self it passes first or None).
    3.11/3.12: NULL, or the method's function, then the callable or self; 3.13: the callable,
    then self or NULL; then the arguments; CALL_KW's names, CALL_FUNCTION_EX's argument tuple
    (and dict) on top."""
    if inst.opname == "CALL_FUNCTION_EX":
        first = len(stack) - (1 + (inst.arg & 1)) - 2
        return first, (first if VERSION >= (3, 13) else first + 1), None
    first = len(stack) - inst.arg - (inst.opname == "CALL_KW") - 2
    if VERSION >= (3, 13):
        return first, first, (None if stack[first + 1] is NULL_VALUE else first + 1)
    if stack[first] is NULL_VALUE:
        return first, first + 1, None
    return first, first, first + 1


def _pop_call(inst, stack: list, kw_names) -> tuple:
    """Pop call instruction `inst`'s values (_call_slots): -> (callable, args, kwargs).
    kw_names: the names KW_NAMES set before a 3.11/3.12 CALL."""
    first, fn_at, self_at = _call_slots(inst, stack)
    values = stack[first:]
    del stack[first:]
    fn = values[fn_at - first]
    if inst.opname == "CALL_FUNCTION_EX":
        return fn, list(values[2]), dict(values[3]) if inst.arg & 1 else {}
    if inst.opname == "CALL_KW":
        kw_names = tuple(values.pop())
    elif VERSION >= (3, 13):
        kw_names = ()
    args = ([values[self_at - first]] if self_at is not None else []) + values[2:]
    nkw = len(kw_names)
    kwargs = dict(zip(kw_names, args[len(args) - nkw:])) if nkw else {}
    return fn, (args[:len(args) - nkw] if nkw else args), kwargs


def _special(obj, name: str):
    """obj's special method `name`, bound, as the interpreter looks it up (on its class, never
    on the instance); None where its class has none."""
    attr = class_attr(type(obj), name, _NONE)
    if attr is _NONE:
        return None
    get = getattr(type(attr), "__get__", None)
    return get(attr, obj, type(obj)) if get is not None else attr


_NONE = object()
_DELETED = object()          # an attribute or item the trace deleted (its template: ["deleted"])


def execute(inst, stack: list, f_locals: dict, f_globals: dict, kw_names, call: Callable,
            offset_to_index) -> int:
    """Run `inst` on real values (mutating `stack`); -> the index of the next instruction."""
    op = inst.opname
    nxt = inst.index + 1
    if op in CALL_OPS:
        stack.append(call(*_pop_call(inst, stack, kw_names)))
    elif op in JUMP_OPS:
        v = stack[-1]
        if "NONE" in op:
            cond = v is None
            if "NOT_NONE" in op:
                cond = not cond
        else:
            cond = bool(v)
            if "FALSE" in op:
                cond = not cond
        if op.startswith("JUMP_IF"):
            if cond:
                return offset_to_index[inst.argval]
            stack.pop()
            return nxt
        stack.pop()
        return offset_to_index[inst.argval] if cond else nxt
    elif op == "STORE_ATTR":
        obj = stack.pop()
        setattr(obj, inst.argval, stack.pop())
    elif op == "BEFORE_WITH":
        # a context manager the trace does not model, entered for real (a frame that runs
        # eagerly); its __exit__ is called for real by the CALL that ends the block
        mgr = stack.pop()
        enter, exit_ = _special(mgr, "__enter__"), _special(mgr, "__exit__")
        if enter is None or exit_ is None:          # looked up on the class, as CPython does
            missed = " (missed __exit__ method)" if enter is not None else ""
            raise TypeError(f"'{type(mgr).__name__}' object does not support the context manager protocol{missed}")
        stack += [exit_, enter()]
    elif op == "STORE_GLOBAL":
        f_globals[inst.argval] = stack.pop()
    elif op == "STORE_SUBSCR":
        idx, obj, value = stack.pop(), stack.pop(), stack.pop()
        obj[idx] = value
    elif op == "DELETE_SUBSCR":
        idx, obj = stack.pop(), stack.pop()
        del obj[idx]
    elif op == "BINARY_SUBSCR":
        idx, obj = stack.pop(), stack.pop()
        stack.append(obj[idx])
    elif op == "BINARY_OP":
        b, a = stack.pop(), stack.pop()
        stack.append(BINARY_OPS[BINARY_OP_SYMBOLS[inst.arg]](a, b))
    elif op == "COMPARE_OP":
        b, a = stack.pop(), stack.pop()
        sym = _cmp_symbol(inst.argval)
        stack.append(COMPARE_OPS.get(sym, COMPARE_OPS.get(_cmp_symbol(inst.argrepr)))(a, b))
    elif op == "UNARY_NOT":
        stack.append(not stack.pop())
    elif op == "TO_BOOL":
        stack.append(bool(stack.pop()))
    elif op == "UNARY_NEGATIVE":
        stack.append(-stack.pop())
    elif op == "UNARY_INVERT":
        stack.append(~stack.pop())
    elif op == "CONTAINS_OP":
        c, x = stack.pop(), stack.pop()
        stack.append((x in c) != bool(inst.arg))
    elif op == "IS_OP":
        b, a = stack.pop(), stack.pop()
        stack.append((a is b) != bool(inst.arg))
    elif op == "GET_ITER":
        stack.append(iter(stack.pop()))
    elif op == "UNPACK_SEQUENCE":
        items = list(stack.pop())
        if len(items) != inst.arg:
            raise ValueError(f"expected {inst.arg} values to unpack, got {len(items)}")
        stack.extend(reversed(items))
    elif op == "BUILD_MAP":
        flat = stack[len(stack) - 2 * inst.arg:]
        del stack[len(stack) - 2 * inst.arg:]
        stack.append(dict(zip(flat[0::2], flat[1::2])))
    elif op == "BUILD_SET":
        items = stack[len(stack) - inst.arg:]
        del stack[len(stack) - inst.arg:]
        stack.append(set(items))
    elif op == "BUILD_STRING":
        parts = stack[len(stack) - inst.arg:]
        del stack[len(stack) - inst.arg:]
        stack.append("".join(parts))
    elif op == "FORMAT_SIMPLE":
        stack.append(format(stack.pop()))
    elif op == "FORMAT_VALUE":
        flags = inst.arg or 0
        spec = stack.pop() if flags & 0x04 else ""
        v = stack.pop()
        v = {0: lambda x: x, 1: str, 2: repr, 3: ascii}[flags & 3](v)
        stack.append(format(v, spec))
    elif op in ("LOAD_ATTR", "LOAD_METHOD"):
        obj = stack.pop()
        attr = getattr(obj, inst.argval)
        method = op == "LOAD_METHOD" or (VERSION >= (3, 12) and inst.arg & 1)
        if method and VERSION >= (3, 13):
            stack += [attr, NULL_VALUE]
        elif method:
            stack += [NULL_VALUE, attr]
        else:
            stack.append(attr)
    else:
        raise NotImplementedError(op)
    return nxt


# ---------------------------------------------------------------------------------------
# Templates: symbolic values -> the real values after the graph ran
# ---------------------------------------------------------------------------------------
class TemplateBuilder:
    """Turns the variables live at a break (or returned) into a template that `rebuild`
    evaluates on the graph's outputs and the call's state. Identity is kept: a variable seen
    twice (a list in two locals) is rebuilt once."""

    def __init__(self, tx, source_fn: Callable[[Any], Callable]):
        self.tx = tx
        self.proxies: List[Any] = []
        self._memo: Dict[int, Any] = {}
        self._cyclic: set = set()
        self._source_fn = source_fn

    # the kinds `rebuild` makes before their parts, so that a part may refer back to them
    _CYCLIC_KINDS = ("list", "dict", "keyeddict", "obj", "copy", "nested")

    def build(self, v):
        key = id(v)
        if key in self._memo:
            t = self._memo[key]
            if not t:                        # still being built: a reference cycle back to it
                self._cyclic.add(key)
            return t
        # memoized before its parts are built (they may refer back to it), filled in place
        t = self._memo[key] = []
        t.extend(self._build(v))
        if key in self._cyclic and t[0] not in self._CYCLIC_KINDS:
            raise self.tx.unsupported(f"a reference cycle through a {t[0]!r} value",
                                      "minicompile cannot rebuild it as a Python value")
        return t

    def _dict_items(self, v):
        if any(isinstance(k, V.TensorKey) for k in v.items):         # keys made as the values are
            return ["keyeddict", [(self.build(k.var) if isinstance(k, V.TensorKey) else ["const", k], self.build(i))
                                  for k, i in v.items.items()]]
        return ["dict", [(k, self.build(i)) for k, i in v.items.items()]]

    def _build(self, v):
        if isinstance(v, V.TensorVariable):
            if v.source is not None and v.node.op == "placeholder" and self._source_fn(v.source):
                return ["src", self._source_fn(v.source)]
            for i, p in enumerate(self.proxies):
                if p.node is v.node:
                    return ["out", i]
            self.proxies.append(v.proxy)
            return ["out", len(self.proxies) - 1]
        if isinstance(v, V.SymIntVariable):
            # a symbolic size: the graph computes it (reading .value would make it static)
            for i, p in enumerate(self.proxies):
                if p.node is v.proxy.node:
                    return ["out", i]
            self.proxies.append(v.proxy)
            return ["out", len(self.proxies) - 1]
        if isinstance(v, V.NullVariable):
            return ["const", NULL_VALUE]
        if isinstance(v, V.ConstantVariable):
            return ["const", v.value]
        if isinstance(v, (V.BaseListVariable, V.DictVariable, V.NestedFunctionVariable)) and v.source is not None \
                and self._source_fn(v.source) is not None:
            return ["src", self._source_fn(v.source)]       # the call's own (its changes: effects)
        if isinstance(v, V.SetVariable):                # made again each time, as eager made it
            return ["set", v.maker()]
        if isinstance(v, V.ModuleSliceVariable) and v.parent is not None and len(v.items) == len(v.sliced) \
                and all(a is b for a, b in zip(v.items, v.sliced)):
            # a slice of a Sequential or ModuleList: the container eager's slicing makes
            return ["call", ["attr", self.build(v.parent), "__getitem__"], [["const", v.index]], []]
        if isinstance(v, V.NamedTupleVariable):
            return ["namedtuple", v.tuple_cls, [self.build(i) for i in v.items]]
        if isinstance(v, V.BaseListVariable):
            return [v.python_type.__name__, [self.build(i) for i in v.items]]
        if isinstance(v, V.ModelOutputVariable):
            return ["modeloutput", v.cls, [(k, self.build(i)) for k, i in v.items.items()]]
        if isinstance(v, V.DictVariable):
            items = self._dict_items(v)
            if v.cls is not dict:                  # an OrderedDict, a defaultdict
                return ["call", ["const", v.cls], ([self.build(v.factory)] if v.factory is not None else [])
                        + [items], []]
            return items
        if isinstance(v, V.OperatorGetterVariable):
            return ["call", ["const", v.cls], [self.build(a) for a in v.args],
                    [(k, self.build(a)) for k, a in v.kwargs.items()]]
        if isinstance(v, V.IteratorVariable):
            if v.source is not None and self._source_fn(v.source) is not None:
                return ["src", self._source_fn(v.source)]     # the real one, advanced (an effect)
            if isinstance(v.over, V.ListVariable) and not v.backward:     # over the list, from where it is
                return ["listiter", self.build(v.over), v.index]
            return ["iter", [self.build(i) for i in v.remaining()], v.python_type]
        if isinstance(v, V.ExceptionVariable):
            return ["exception", v.cls, [self.build(a) for a in v.args],
                    [(k, self.build(a)) for k, a in v.items.items()]]
        if isinstance(v, V.GeneratorVariable) and not v.started and v.made_by is not None:
            fn, args, kwargs = v.made_by        # not started: the call makes a fresh one
            return ["call", self.build(fn), [self.build(a) for a in args],
                    [(k, self.build(a)) for k, a in kwargs.items()]]
        if isinstance(v, V.LazyIteratorVariable):
            return ["lazy", v.kind, self.build(v.fn) if v.fn is not None else None,
                    [self.build(i) for i in v.iterators], v.count, v.strict, v.bounds]
        if isinstance(v, V.DictViewVariable):
            return ["dictview", self.build(v.dict_var), v.kind]
        if isinstance(v, V.NNModuleVariable) and v.made is not None:
            cls, args, kwargs = v.made          # made in the frame: made again for each call
            return ["new", cls, [self.build(a) for a in args], [(k, self.build(a)) for k, a in kwargs.items()]]
        if isinstance(v, V.NNModuleVariable):
            # the call's own module (modules are not guarded by identity)
            src = self._source_fn(v.source) if v.source is not None else None
            return ["src", src] if src is not None else ["const", v.module]
        if isinstance(v, V.UserObjectVariable):
            if v.snapshot is not None:
                # a copy the frame made: the same copy each call, then the trace's writes
                return ["copy", v.snapshot, [(k, ["deleted"] if i is V.DELETED else self.build(i))
                                             for k, i in v.items.items()]]
            if v.source is None:
                # an object made in the frame: a new one per call, its attributes from the trace
                return ["obj", type(v.value), [(k, self.build(i)) for k, i in v.items.items()
                                               if i is not V.DELETED]]
            src = self._source_fn(v.source)
            return ["src", src] if src is not None else ["const", v.value]
        if isinstance(v, (V.CallableVariable,)):
            return ["const", v.value]
        if isinstance(v, V.TensorMethodVariable):
            return ["attr", self.build(v.tensor), v.name]
        if isinstance(v, V.ConstantMethodVariable):
            return ["attr", self.build(v.obj), v.name]
        if isinstance(v, V.BoundMethodVariable):
            return ["bound", v.func, self.build(v.self_var)]
        if isinstance(v, V.WithExitVariable) and v.grad_before is not None:
            return ["gradexit", v.grad_before]
        if isinstance(v, V.WithExitVariable) and v.source is not None:     # (a real one, passed on)
            src = self._source_fn(v.source)
            if src is not None:
                return ["src", src]
        if isinstance(v, V.WithExitVariable) and v.autocast is not None:
            a = v.autocast
            return ["autocastexit", a.device_type, a.dtype, a.enabled, a.cache_enabled]
        if isinstance(v, V.GradModeVariable):
            src = self._source_fn(v.source) if getattr(v, "source", None) is not None else None
            return ["src", src] if src is not None else ["grad", v.enabled, v.before]
        if isinstance(v, V.InferenceModeVariable):
            src = self._source_fn(v.source) if getattr(v, "source", None) is not None else None
            return ["src", src] if src is not None else ["new", torch.inference_mode, [["const", v.mode]], []]
        if isinstance(v, V.AutocastVariable):
            return ["new", torch.autocast, [["const", v.device_type]],
                    [(k, ["const", getattr(v, k)]) for k in ("dtype", "enabled", "cache_enabled")]]
        if isinstance(v, V.NestedFunctionVariable):
            # its cells: a new one holding the value of a local of the frame, or a real cell
            # (one per local of the captured frame itself, shared by every function made from
            # it: what a call of theirs writes there is read back, Segment.run)
            cells = [["newcell", self.build(c.tx.load_local(c.name)), c.name if c.tx.parent is None else None]
                     if isinstance(c, V.CellVariable)
                     else self.build(c) for c in (v.closure.items if v.closure is not None else [])]
            kwdefaults = v.kwdefaults.items.items() if v.kwdefaults is not None else ()
            return ["nested", v, self.build(v.defaults) if v.defaults is not None else None, cells,
                    v.f_globals is self.tx.output.root_globals,
                    [(k, self.build(a)) for k, a in v.items.items()],
                    [(k, self.build(a)) for k, a in kwdefaults],
                    self.build(v.dict_of) if v.dict_of is not None else None,
                    self.build(v.annotations) if v.annotations is not None else None]
        if isinstance(v, V.ClosureCellVariable):
            src = self._source_fn(v.source) if v.source is not None else None
            return ["src", src] if src is not None else ["const", v.cell]
        if isinstance(v, V.PartialVariable):
            if v.source is not None and self._source_fn(v.source) is not None:
                return ["src", self._source_fn(v.source)]
            return ["partial", self.build(v.func), [self.build(a) for a in v.args],
                    [(k, self.build(a)) for k, a in v.keywords.items()]]
        if isinstance(v, V.WeakRefVariable):
            return ["new", weakref.ref, [self.build(v.target)], []]
        if isinstance(v, V.SliceVariable):        # (a bound the graph computed: a size)
            return ["new", slice, [self.build(p) for p in v.parts], []]
        raise self.tx.unsupported(f"{v.describe()} live across a graph break",
                                  "minicompile cannot rebuild it as a Python value")


class SourceRead:
    """A value read from the call's own state (a local, a global, an attribute of one): a
    source's expression, evaluated in the guard's namespace with the call's L, G and F
    (the namespace `make_env` gives)."""

    def __init__(self, expr: str, namespace: dict):
        self.expr, self.namespace = expr, namespace
        self._code = compile(expr, "<minicompile source>", "eval")

    def __call__(self, env):
        return eval(self._code, self.namespace, env)


def _frame_cell(t, outs, env, memo, fills) -> types.CellType:
    """A cell for a function made in the frame: the one of its local t[2], where it is the
    captured frame's (memo["cells"]: name -> cell), else a new one, made empty: (cell, value
    template) goes to `fills`, for the caller to fill once the function exists."""
    _, value, name = t
    cells = memo.setdefault("cells", {})
    if name is None or name not in cells:
        cell = types.CellType()
        fills.append((cell, value))
        if name is None:
            return cell
        cells[name] = cell
    return cells[name]


def rebuild(t, outs, env, memo=None):
    memo = {} if memo is None else memo
    key = id(t)
    if key in memo:
        return memo[key]
    kind = t[0]
    if kind == "out":
        r = outs[t[1]]
    elif kind == "src":
        r = t[1](env)
    elif kind == "const":
        r = t[1]
    elif kind == "tuple":
        r = tuple(rebuild(x, outs, env, memo) for x in t[1])
    elif kind == "list":                      # (memoized before its items: they may refer back)
        r = memo[key] = []
        r.extend(rebuild(x, outs, env, memo) for x in t[1])
    elif kind == "Size":
        r = torch.Size([rebuild(x, outs, env, memo) for x in t[1]])
    elif kind == "set":
        r = t[1]()
    elif kind == "obj":
        r = object.__new__(t[1])
        memo[key] = r                          # before the attributes: they may refer back
        for name, x in t[2]:                   # (its class's __setattr__ ran in the trace)
            object.__setattr__(r, name, rebuild(x, outs, env, memo))
    elif kind == "copy":
        r = copy.deepcopy(t[1])
        memo[key] = r
        for name, x in t[2]:
            if x[0] == "deleted":
                delattr(r, name)
            else:
                setattr(r, name, rebuild(x, outs, env, memo))
    elif kind == "namedtuple":
        r = V.make_named_tuple(t[1], [rebuild(x, outs, env, memo) for x in t[2]])
    elif kind == "dict":
        r = memo[key] = {}
        for k, x in t[1]:
            r[k] = rebuild(x, outs, env, memo)
    elif kind == "keyeddict":
        r = memo[key] = {}
        for k, x in t[1]:
            r[rebuild(k, outs, env, memo)] = rebuild(x, outs, env, memo)
    elif kind == "modeloutput":
        r = t[1](**{k: rebuild(x, outs, env, memo) for k, x in t[2]})
    elif kind == "iter":
        r = _iterator_of(t[2], [rebuild(x, outs, env, memo) for x in t[1]])
    elif kind == "listiter":
        r = iter(rebuild(t[1], outs, env, memo))
        for _ in range(t[2]):
            next(r)
    elif kind == "dictview":
        r = getattr(rebuild(t[1], outs, env, memo), t[2])()
    elif kind == "attr":
        r = getattr(rebuild(t[1], outs, env, memo), t[2])
    elif kind == "bound":
        r = types.MethodType(t[1], rebuild(t[2], outs, env, memo))
    elif kind == "exception":
        r = V.make_exception(t[1], [rebuild(a, outs, env, memo) for a in t[2]],
                             {k: rebuild(a, outs, env, memo) for k, a in t[3]})
    elif kind == "call":
        r = rebuild(t[1], outs, env, memo)(*[rebuild(a, outs, env, memo) for a in t[2]],
                                           **{k: rebuild(a, outs, env, memo) for k, a in t[3]})
    elif kind == "lazy":
        r = _lazy_iterator(t[1], rebuild(t[2], outs, env, memo) if t[2] is not None else None,
                           [rebuild(i, outs, env, memo) for i in t[3]], *t[4:])
    elif kind == "new":
        r = t[1](*[rebuild(a, outs, env, memo) for a in t[2]], **{k: rebuild(a, outs, env, memo) for k, a in t[3]})
    elif kind == "partial":
        r = functools.partial(rebuild(t[1], outs, env, memo), *[rebuild(a, outs, env, memo) for a in t[2]],
                              **{k: rebuild(a, outs, env, memo) for k, a in t[3]})
    elif kind == "grad":
        if t[2] is None:
            r = torch.enable_grad() if t[1] else torch.no_grad()
        else:          # set_grad_enabled(mode): made (the mode set) already, `before` to restore
            r = object.__new__(torch.set_grad_enabled)
            r.prev, r.mode = t[2], t[1]
    elif kind == "gradexit":
        # the __exit__ of a grad-mode block the break is inside (the graph set its mode): it
        # puts back the mode from before the block, as no_grad's own does
        manager = torch.no_grad()
        manager.prev = t[1]
        r = manager.__exit__
    elif kind == "autocastexit":
        # the __exit__ of an autocast block the break is inside (the graph ran its part with
        # the casts explicit, and left the state as it was): the block entered for real, so
        # the breaking call runs in its state, and the rest of the frame leaves it
        manager = torch.autocast(t[1], dtype=t[2], enabled=t[3], cache_enabled=t[4])
        manager.__enter__()
        r = manager.__exit__
    elif kind == "nested":
        v = t[1]
        # the function is made (and memoized) before its cells are filled and its defaults
        # set: they may refer back to it (a recursive helper's own cell)
        fills = []
        cells = tuple(_frame_cell(c, outs, env, memo, fills) if c[0] == "newcell"
                      else rebuild(c, outs, env, memo) for c in t[3]) or None
        # made in the captured frame: it takes the called function's globals
        f_globals = env.get("G", v.f_globals) if t[4] else v.f_globals
        r = memo[key] = types.FunctionType(v.code, f_globals, v.code.co_name, None, cells)
        for cell, value in fills:
            cell.cell_contents = rebuild(value, outs, env, memo)
        if t[2] is not None:
            r.__defaults__ = rebuild(t[2], outs, env, memo)
        r.__qualname__ = v.name
        if v.kwdefaults is not None:
            r.__kwdefaults__ = {k: rebuild(a, outs, env, memo) for k, a in t[6]}
        if t[7] is not None:          # functools.wraps: the wrapped one's __dict__ copied
            r.__dict__.update(getattr(rebuild(t[7], outs, env, memo), "__dict__", {}))
        if t[8] is not None:
            r.__annotations__ = rebuild(t[8], outs, env, memo)
        for name, a in t[5]:
            setattr(r, name, rebuild(a, outs, env, memo))
    else:
        raise AssertionError(kind)
    memo[key] = r
    return r


# what makes an iterator of eager's type over given items (a str's: ASCII or not)
_ITERATOR_MAKERS = {type(iter(())): tuple, type(iter("")): "".join, type(iter("\u0100")): "".join,
                    type(iter({})): dict.fromkeys, type(reversed([])): lambda xs: reversed(xs[::-1])}


def _iterator_of(python_type, items: list):
    """An iterator over `items` of eager's type where one can be made so (over a tuple, a str,
    a dict's keys, a reversed list), else a list's."""
    maker = _ITERATOR_MAKERS.get(python_type)
    try:
        made = iter(maker(items)) if maker is not None else None
    except TypeError:                                  # (items a str's iterator cannot hold)
        made = None
    return made if made is not None and type(made) is python_type else iter(items)


def _lazy_iterator(kind, fn, iterators, count, strict, bounds):
    """The real map/filter/zip/enumerate/islice a LazyIteratorVariable stands for."""
    if kind in ("map", "filter"):
        return getattr(builtins, kind)(fn, *iterators)
    if kind == "zip":
        return zip(*iterators, strict=strict)
    if kind == "enumerate":
        return enumerate(iterators[0], count)
    start, stop, step = bounds
    read, given = count                 # what is left: from the next wanted item on
    wanted = start + given * step
    return itertools.islice(iterators[0], wanted - read, None if stop is None else max(stop - read, 0), step)


def _as_inference_tensors(outs, positions: list) -> list:
    """The graph's outputs, those at `positions` made inference tensors where they are not
    (a copy made in inference mode; outputs that share memory share the copy's)."""
    outs, copies = list(outs), {}
    with torch.inference_mode():
        for k in positions:
            t = outs[k]
            if not isinstance(t, torch.Tensor) or t.is_inference():
                continue
            storage = t.untyped_storage()
            cloned = copies.get(storage.data_ptr()) if storage.nbytes() else None
            if cloned is None:
                cloned = copies[storage.data_ptr()] = storage.clone()
            outs[k] = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                cloned, t.storage_offset(), t.size(), t.stride())
    return outs


def _as_subclasses(outs, classes: list) -> list:
    """The graph's outputs, each at a position of `classes` viewed as its class (one output
    object twice stays one object)."""
    outs, made = list(outs), {}
    for k, cls in classes:
        t = outs[k]
        if isinstance(t, torch.Tensor) and type(t) is not cls:
            if id(t) not in made:
                made[id(t)] = (t, t.as_subclass(cls))
            outs[k] = made[id(t)][1]
    return outs


@dataclass
class Segment:
    """One traced piece of a frame (see the module docstring). Its generated functions (the
    guard, get_inputs, make_env) take the call as (F, args, kwargs): F is the function the
    call runs, whose closure, defaults and globals they read (guards.ArgBinding)."""
    code: types.CodeType
    offset: int                       # where it starts (0: the frame's entry)
    gm: torch.fx.GraphModule
    example_inputs: List[torch.Tensor]
    end: str                          # "return", "raise" or "break"
    template: Any                     # return value / [stack templates, {local: template}]
    reason: Optional[Unsupported] = None
    break_inst: Any = None
    kw_names: tuple = ()
    handler: Any = None               # the exception-table entry covering break_inst (a try body)
    break_grad: Optional[bool] = None  # the grad mode break_inst runs in (inside a no_grad block)
    offset_to_index: dict = None
    instructions: list = None
    n_calls: int = 0                  # call nodes: a graph without any is not compiled (Dynamo)
    eager: bool = False               # part of a frame that runs eagerly (not compiled/counted)
    compiled: Any = None
    node_by_node: Any = None          # how it runs where not compiled (made on its first run)
    input_sources: List[str] = field(default_factory=list)
    effects: list = field(default_factory=list)   # side effects replayed after the graph
    raised_at: list = field(default_factory=list)  # end "raise": (file, line, text, function) of
                                                   # the user's frames that raised, outermost first
    # the graph raised at run time: where the frame would catch it (ops_under_handler) or
    # side effects come before it, the frame runs again from `offset` as Python (api.py) and
    # does what eager does; not where the graph writes its inputs (they may be written)
    rerun_on_raise: bool = False
    rerun_draws: bool = False         # ... and the graph draws random numbers: the generators'
                                      # states are kept, for the rerun to draw eager's
    # a torch.inference_mode() block in the trace: the graph's outputs eager makes inference
    # tensors (their positions), and whether every op of the graph is inside such a block
    # (the graph then runs in inference mode; else those outputs are made so after it runs)
    inference_outputs: Optional[list] = None
    inference_whole: bool = False
    # outputs eager makes of a tensor subclass (an op on one gives one, as torch.Tensor's
    # __torch_function__ makes it): [(position, the class)]; the compiled code's are made so
    subclass_outputs: Optional[list] = None
    guard: Callable = None            # (F, args, kwargs) -> bool
    guard_source: str = ""
    get_inputs: Callable = None       # (F, args, kwargs) -> the graph's inputs
    get_inputs_source: str = ""
    make_env: Callable = None         # (F, args, kwargs) -> the namespace templates read
    check: Callable = None            # (F, args, kwargs) -> the graph's inputs if the guard holds
    guard_code: Any = None            # the guards.GuardCode they come from

    def __post_init__(self):
        if self.reason is not None:
            self.reason.kept()

    def use(self, code) -> None:
        """Take the generated functions of a guards.GuardCode."""
        self.guard_code = code
        self.guard, self.guard_source = code.guard, code.source
        self.get_inputs, self.get_inputs_source = code.get_inputs, code.get_inputs_source
        self.make_env, self.check = code.make_env, code.check

    def run(self, F, args, kwargs, call, inputs=None):
        """-> ("return", value), ("resume", offset, state), ("raised", offset, state) (a break
        in a try body raised: on at its handler), ("rerun", offset, state) (the graph raised:
        run again from its start as Python); raises what the frame raised.
        `inputs`: the graph's inputs, where the caller has them (from `check`)."""
        if inputs is None:
            inputs = self.get_inputs(F, args, kwargs)
        rng = ir.rng_states() if self.rerun_draws else None
        try:
            if self.inference_whole:
                with torch.inference_mode():
                    outs = self._run_graph(inputs)
            else:
                outs = self._run_graph(inputs)
                if self.inference_outputs:
                    outs = _as_inference_tensors(outs, self.inference_outputs)
            if self.subclass_outputs:
                outs = _as_subclasses(outs, self.subclass_outputs)
        except Exception as exc:
            # (a failed check of a branch's side: the frame raises there, on the side the graph
            # left out; no input was written, the writes are made after the graph)
            if not (self.rerun_on_raise or isinstance(exc, custom_ops.RaisingPathTaken)):
                raise
            if rng is not None:
                ir.set_rng_states(rng)
            logs.log("graph_breaks", f"the graph of {self.code.co_name} from offset {self.offset} raised "
                     f"{type(exc).__name__} at run time ({exc}): the frame runs again from there as "
                     "Python, where a handler or the side effects before the raise are eager's")
            return ("rerun", self.offset, kwargs)
        if self.end == "return" and not self.effects and self.template[0] == "out":
            return ("return", outs[self.template[1]])       # one of the graph's outputs
        env = self.make_env(F, args, kwargs)
        memo: dict = {}
        # every value is rebuilt first, then the side effects are made: a value the trace read
        # from outside the frame is the one it read before its own writes
        effects = []
        for kind, obj_fn, t in self.effects:
            obj = obj_fn(env)
            if kind == "list":
                t = list(rebuild(t, outs, env, memo))
            elif kind in ("attrs", "objattrs", "dict", "setitems"):
                t = [(name, _DELETED if vt[0] == "deleted" else rebuild(vt, outs, env, memo)) for name, vt in t]
            effects.append((kind, obj, t))
        if self.end in ("return", "raise"):
            result = rebuild(self.template, outs, env, memo)
        else:
            stack_t, locals_t = self.template
            stack = [rebuild(t, outs, env, memo) for t in stack_t]
            f_locals = {k: rebuild(t, outs, env, memo) for k, t in locals_t.items()}
        for kind, obj, t in effects:
            if kind == "advance":
                for _ in range(t):
                    next(obj)
            elif kind == "list":
                obj[:] = t
            elif kind == "dict":
                obj.clear()
                obj.update(t)
            elif kind == "setsteps":
                for name, operands in t:
                    getattr(obj, name)(*operands)
            elif kind == "setitems":
                for name, value in t:
                    if value is _DELETED:
                        obj.pop(name, None)        # (made by the trace, or there: read, so guarded)
                    else:
                        obj[name] = value
            else:
                store = object.__setattr__ if kind == "objattrs" else setattr
                for name, value in t:
                    if value is _DELETED:             # (set in the trace, then deleted)
                        vars(obj).pop(name, None)
                    else:
                        store(obj, name, value)
        if self.end == "return":
            return ("return", result)
        if self.end == "raise":            # the frame raised it (its effects are made)
            _note_where(result, self.raised_at)
            raise result
        call_here = functools.partial(call, site=(self.code, self.break_inst.lineno, env["G"]))
        if self.break_grad is not None:
            torch._C._set_grad_enabled(self.break_grad)
        if self.handler is None:
            nxt = execute(self.break_inst, stack, f_locals, env["G"], self.kw_names, call_here,
                          self.offset_to_index)
        else:
            before = list(stack)
            try:
                nxt = execute(self.break_inst, stack, f_locals, env["G"], self.kw_names, call_here,
                              self.offset_to_index)
            except BaseException as exc:
                # the frame's handler takes it: the rest of the frame runs as Python (resume.py)
                _read_cells(f_locals, memo)
                return ("raised", *self._raised(exc, before, f_locals))
        _read_cells(f_locals, memo)
        return ("resume", self.instructions[nxt].offset, _live_state(f_locals, stack))

    def _run_graph(self, inputs):
        if self.compiled is not None:
            return self.compiled(*inputs)
        if self.node_by_node is None:      # not compiled (no ops, or a frame run eagerly)
            self.node_by_node = NodeByNode(self.gm)
        return self.node_by_node(*inputs)

    def _raised(self, exc: BaseException, before: list, f_locals: dict) -> tuple:
        """(offset, live state) from which the rest of the frame, run as Python, goes on as
        CPython would after the breaking instruction raised `exc` in a try or with body."""
        inst = self.break_inst
        if inst.opname in CALL_OPS:
            # from the call itself, its callable swapped for one that raises exc: CPython
            # routes it and the traceback names the frame's line, as in eager
            stack = list(before)
            stack[_call_slots(inst, before)[1]] = _Raises(exc)
            first = inst.index
            while self.instructions[first - 1].opname in ("PRECALL", "KW_NAMES"):
                first -= 1          # (3.11, 3.12: they set up the call; dis counts its stack there)
            return self.instructions[first].offset, _live_state(f_locals, stack)
        # as CPython unwinds: on at the handler, the stack cut to its depth, where it asks the
        # raising instruction's position (resume.RaisedAt), then the exception
        h = self.handler
        stack = before[:h.depth] + ([RaisedAt(inst.offset)] if h.lasti else []) + [exc]
        return h.target, _live_state(f_locals, stack)


def _read_cells(f_locals: dict, memo: dict) -> None:
    """The frame's locals that functions made in it hold cells of (`nonlocal n; n = 5` in a
    nested function, a comprehension's walrus): the cells themselves from here on, which the
    call run for real wrote and later calls of those functions will."""
    for name, cell in memo.get("cells", {}).items():
        f_locals[name] = cell          # (trace_segment reads and writes it as that cell)


def _note_where(exc, user_stack: list) -> None:
    """Raised from here, the exception's traceback shows minicompile's frames: a note gives the
    user's lines that raised it, as eager's traceback would show them."""
    if not user_stack or not isinstance(exc, BaseException) or not hasattr(exc, "add_note"):
        return
    note = "raised in the compiled function, by:\n" + "\n".join(
        f'  File "{filename}", line {lineno}, in {name}' + (f"\n    {text.strip()}" if text else "")
        for filename, lineno, text, name in user_stack)
    if note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)


class _Raises:
    """Stands for the callable of a call that raised at a graph break (Segment._raised)."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __call__(self, *args, **kwargs):
        exc, self.exc = self.exc, None
        raise exc


def _live_state(f_locals: dict, stack: list) -> dict:
    """The state a resume point takes: locals by name, the value stack as ___stack0, ..."""
    state = dict(f_locals)
    for i, v in enumerate(stack):
        state[f"___stack{i}"] = v
    return state


class ResumeSegment:
    """The rest of a frame from `offset` on, run as a real Python function (resume.py):
    where minicompile's interpreter cannot run it, CPython does, so a graph break never fails
    the call. It matches the live state it was made for (which locals are bound, where the
    value stack has NULLs)."""
    eager, compiled, n_calls, end, gm, reason = True, None, 0, "return", None, None

    def __init__(self, code: types.CodeType, offset: int, kwargs: dict, why: Unsupported):
        self.code, self.offset, self.why = code, offset, why
        self.shape = _state_shape(kwargs)
        self.guard_source = f"# the rest of {code.co_name} from offset {offset} runs as Python: {why.reason}"

    def resumable(self) -> bool:
        """Whether a resume function can be written for this state (resume.py)."""
        return resume_code(self.code, self.offset, *self.shape) is not None

    def guard(self, F, args, kwargs) -> bool:
        return not args and _state_shape(kwargs) == self.shape

    def check(self, F, args, kwargs):
        return () if self.guard(F, args, kwargs) else None

    def run(self, F, args, kwargs, call, inputs=None):
        f_locals = {k: v for k, v in kwargs.items() if not k.startswith("___stack")}
        stack = [kwargs[f"___stack{i}"] for i in range(len(self.shape[1]))]
        ok, value = call_resumed(F, self.offset, f_locals, stack, NULL_VALUE)
        if not ok:
            raise RuntimeError(f"minicompile: the rest of {self.code.co_name} (from offset "
                               f"{self.offset}) can be neither traced nor resumed: {self.why}")
        return ("return", value)


def _state_shape(kwargs: dict) -> tuple:
    """(the bound locals, where the stack holds NULL) of a live state."""
    n = sum(1 for k in kwargs if k.startswith("___stack"))
    return (frozenset(k for k in kwargs if not k.startswith("___stack")),
            tuple(kwargs[f"___stack{i}"] is NULL_VALUE for i in range(n)))

