"""One handler per opcode, registered with the Python versions it serves.

Each is a function (translator, instruction) that changes the translator's stack, locals or
position, as CPython's instruction would change the real frame, on VariableTrackers. An opcode
with no handler for the running Python is reported by name (translator.run), never half-done.
Grouped as CPython's documentation groups them: stack and constants, locals and cells,
attributes and items, operators, calls and functions, control flow, with-blocks, imports.
"""
from __future__ import annotations

import collections.abc
import enum
import importlib.util
import operator
import sys
import types

import torch
import torch.fx


from .breaks import ObservedException, Return, Yield
from .bytecode import BINARY_OP_SYMBOLS, COMPARE_OPS, _cmp_symbol, handles
from .builtin_calls import _is_singleton, class_attr
from .sources import ItemSource, RootSource
from .iterators import dropped, iter_of, next_item, pep_479
from .values import (DELETED, NULL, BaseListVariable, BoundMethodVariable, BuiltinVariable, CellVariable,
                     ClosureCellVariable, ConstantVariable, DictVariable, DictViewVariable, ExceptionVariable,
                     GeneratorVariable, GradModeVariable, InferenceModeVariable, ListVariable, ModelOutputVariable,
                     NestedFunctionVariable, NNModuleVariable, PythonModuleVariable, SetVariable,
                     SliceVariable, SuperVariable, SymIntVariable, TensorVariable, TupleVariable,
                     TypeVariable, UserObjectVariable, WithExitVariable,
                     AutocastVariable, NullContextVariable, dict_key, is_constant_value, key_example, set_key, NO_KEY)


# ===================================================================================
# Opcode handlers. Each states the versions whose semantics it implements.
# ===================================================================================
@handles("NOP", "RESUME", "CACHE", "EXTENDED_ARG", "COPY_FREE_VARS", "MAKE_CELL")
def _nop(tx, inst):
    # COPY_FREE_VARS / MAKE_CELL: free variables are read through the function's cells
    # (tx.freevars); cell variables are plain locals until a closure made in the frame
    # takes them (MAKE_FUNCTION: CellVariable)
    pass


@handles("PRECALL", versions=[(3, 11)])
def _precall(tx, inst):
    pass


# generators (iterators.py): their frame runs to each yield when an item is asked for
@handles("RETURN_GENERATOR")
def _return_generator(tx, inst):
    if not tx.generator:
        raise tx.unsupported("RETURN_GENERATOR outside an inlined generator")
    tx.push(ConstantVariable(None))         # popped by the POP_TOP that follows


@handles("YIELD_VALUE")
def _yield_value(tx, inst):
    if not tx.generator:
        raise tx.unsupported("yield outside an inlined generator")
    raise Yield(tx.pop())                   # resumed with what the yield evaluates to pushed


@handles("GET_YIELD_FROM_ITER")
def _get_yield_from_iter(tx, inst):
    tx.push(iter_of(tx, tx.pop()))


@handles("SEND")
def _send(tx, inst):
    # `yield from`: the next item of the iterator below, sent what our yield was given; where
    # it is exhausted, its return value replaces it (3.11) or joins it for END_SEND (3.12+)
    value = tx.pop()
    receiver = tx.stack[-1]
    item = next_item(tx, receiver, value)
    if item is not None:
        tx.push(item)
        return
    result = receiver.return_value if isinstance(receiver, GeneratorVariable) else ConstantVariable(None)
    if tx.version == (3, 11):
        tx.pop()
    tx.push(result)
    tx.jump_to(inst)


@handles("END_SEND", versions=[(3, 12), (3, 13)])
def _end_send(tx, inst):
    value = tx.pop()
    tx.pop()
    tx.push(value)


@handles("LOAD_SUPER_ATTR", versions=[(3, 12), (3, 13)])
def _load_super_attr(tx, inst):
    obj = tx.pop()
    cls = tx.pop()
    tx.pop()                                # the global `super`
    if not isinstance(cls, TypeVariable):
        raise tx.unsupported(f"super() with {cls.describe()}")
    attr = tx.load_attr(SuperVariable(cls.value, obj), inst.argval)
    tx._push_attribute(attr, method_load=bool(inst.arg & 1))   # as LOAD_ATTR


@handles("LOAD_FAST")
@handles("LOAD_FAST_CHECK", versions=[(3, 12), (3, 13)])
def _load_fast(tx, inst):
    if tx.version >= (3, 13) and (inst.argval in tx.code.co_cellvars or inst.argval in tx.code.co_freevars) \
            and tx._next_builds_closure():
        _load_closure(tx, inst)                      # 3.13: LOAD_CLOSURE became LOAD_FAST
        return
    tx.push(tx.load_local(inst.argval))


@handles("LOAD_CLOSURE", versions=[(3, 11), (3, 12)])
def _load_closure(tx, inst):
    name = inst.argval
    if name in tx.closure_cells:                    # passing our own free variable on
        tx.push(tx.closure_cells[name])
    elif name in tx.freevars:
        tx.push(tx.closure_cell(name))
    else:
        tx.push(CellVariable(tx, name))


@handles("MAKE_FUNCTION")
def _make_function(tx, inst):
    code = tx.pop().as_example()
    if tx.version >= (3, 13):
        tx.push(NestedFunctionVariable(code, tx.f_globals, code.co_qualname))
        return
    flags = inst.arg or 0
    closure = tx.pop() if flags & 0x08 else None
    annotations = _annotations(tx, tx.pop()) if flags & 0x04 else None
    kwdefaults = tx.pop() if flags & 0x02 else None
    defaults = tx.pop() if flags & 0x01 else None
    fn = NestedFunctionVariable(code, tx.f_globals, code.co_qualname, defaults, kwdefaults, closure)
    fn.annotations = annotations
    tx.push(fn)


def _annotations(tx, value) -> DictVariable:
    """A function's annotations as MAKE_FUNCTION takes them: (name, value, name, value...)."""
    items = tx.unpack(value)
    return DictVariable({items[i].as_example(): items[i + 1] for i in range(0, len(items), 2)})


@handles("SET_FUNCTION_ATTRIBUTE", versions=[(3, 13)])
def _set_function_attribute(tx, inst):
    fn = tx.pop()
    value = tx.pop()
    flag = inst.arg
    if flag == 0x08:
        fn.closure = value
    elif flag == 0x02:
        fn.kwdefaults = value
    elif flag == 0x01:
        fn.defaults = value
    elif flag == 0x04:
        fn.annotations = _annotations(tx, value)
    tx.push(fn)


@handles("FORMAT_VALUE", versions=[(3, 11), (3, 12)])
def _format_value(tx, inst):
    flags = inst.arg or 0
    spec = tx.pop().as_example() if flags & 0x04 else ""
    value = tx.pop()
    conv = {0: None, 1: "s", 2: "r", 3: "a"}[flags & 0x03]
    tx.push(tx._format(value, conv, spec))


@handles("CONVERT_VALUE", versions=[(3, 13)])
def _convert_value(tx, inst):
    value = tx.pop()
    conv = {1: "s", 2: "r", 3: "a"}.get(inst.arg)
    tx.push(tx._format(value, conv))


@handles("FORMAT_SIMPLE", versions=[(3, 13)])
def _format_simple(tx, inst):
    tx.push(tx._format(tx.pop(), None))


@handles("FORMAT_WITH_SPEC", versions=[(3, 13)])
def _format_with_spec(tx, inst):
    spec = tx.pop().as_example()
    tx.push(tx._format(tx.pop(), None, spec))


@handles("BUILD_STRING")
def _build_string(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(ConstantVariable("".join(p.as_example() for p in parts)))


# iteration (loops are unrolled) -----------------------------------------------------
# exceptions: raised ones go to the frame's handler (InstructionTranslator.handle_exception) -----
@handles("RAISE_VARARGS")
def _raise_varargs(tx, inst):
    handled = tx.handled_exception()
    if inst.arg == 0:                                      # a bare `raise` in a handler
        if handled is None:
            raise tx.observed(RuntimeError("No active exception to reraise"))
        raise ObservedException(handled)
    cause = tx.pop() if inst.arg == 2 else None
    exc = tx.make_exception(tx.pop())
    tx.output.record_mutation(exc)
    if cause is not None:                                  # raise ... from cause
        exc.items["__cause__"] = cause if _is_singleton(cause) else tx.make_exception(cause)
        exc.items["__suppress_context__"] = ConstantVariable(True)
    if handled is not None and handled is not exc and "__context__" not in exc.items:
        exc.items["__context__"] = handled                 # raised while handling another
    raise ObservedException(exc)


@handles("RERAISE")
def _reraise(tx, inst):
    raise ObservedException(tx.pop())


@handles("PUSH_EXC_INFO")
def _push_exc_info(tx, inst):
    exc = tx.pop()
    tx.push(tx.exc_info if tx.exc_info is not None else ConstantVariable(None))
    tx.exc_info = exc
    tx.push(exc)


@handles("POP_EXCEPT")
def _pop_except(tx, inst):
    before = tx.pop()
    tx.exc_info = None if isinstance(before, ConstantVariable) and before.value is None else before


@handles("CHECK_EXC_MATCH")
def _check_exc_match(tx, inst):
    classes = tx.pop()
    exc = tx.stack[-1]
    if not classes.is_constant() or not isinstance(exc, ExceptionVariable):
        raise tx.unsupported(f"except {classes.describe()} for {exc.describe()}")
    tx.push(ConstantVariable(issubclass(exc.cls, classes.as_example())))


@handles("LOAD_ASSERTION_ERROR")
def _load_assertion_error(tx, inst):
    tx.push(tx.output.wrap(AssertionError, None))


@handles("WITH_EXCEPT_START")
def _with_except_start(tx, inst):
    # an exception leaves a with block: its __exit__(type, value, traceback) is called
    exc = tx.stack[-1]
    tx.push(tx.call_function(tx.stack[-4], [tx.output.wrap(exc.cls, None), exc, ConstantVariable(None)], {}))


# match statements ------------------------------------------------------------------------
@handles("MATCH_SEQUENCE")
def _match_sequence(tx, inst):
    v = tx.stack[-1]
    tx.push(ConstantVariable(isinstance(v, (TupleVariable, ListVariable)) or
                             not isinstance(v, (DictVariable, BaseListVariable)) and
                             _matches(tx, v, collections.abc.Sequence) and
                             not _matches(tx, v, (str, bytes, bytearray))))


@handles("MATCH_MAPPING")
def _match_mapping(tx, inst):
    v = tx.stack[-1]
    tx.push(ConstantVariable(isinstance(v, DictVariable) or _matches(tx, v, collections.abc.Mapping)))


@handles("GET_LEN")
def _get_len(tx, inst):
    tx.push(tx.call_function(tx.output.wrap(len, None), [tx.stack[-1]], {}))


@handles("MATCH_KEYS")
def _match_keys(tx, inst):
    keys, subject = tx.stack[-1], tx.stack[-2]
    values = []
    for key in keys.as_example():
        if isinstance(subject, DictVariable) and getattr(subject.cls, "get", None) is dict.get:
            if key not in subject.items:
                tx.push(ConstantVariable(None))
                return
            values.append(subject.items[key])
            continue
        # CPython asks subject.get(key, <a marker>): a defaultdict's factory, a Counter's 0 or
        # a __missing__ is not run, and a missing key fails the pattern
        value = tx.call_function(tx.load_attr(subject, "get"), [ConstantVariable(key), ConstantVariable(_NO_KEY)], {})
        if isinstance(value, ConstantVariable) and value.value is _NO_KEY:
            tx.push(ConstantVariable(None))
            return
        values.append(value)
    tx.push(TupleVariable(values))


_NO_KEY = object()


@handles("MATCH_CLASS")
def _match_class(tx, inst):
    # case Cls(a, b, k=v): the subject's attributes (positional ones by __match_args__), or None
    names, cls, subject = tx.pop(), tx.pop(), tx.pop()
    if not isinstance(cls, (TypeVariable, BuiltinVariable)) or not isinstance(cls.value, type) or \
            not names.is_constant():
        raise tx.unsupported(f"case {cls.describe()}(...)")
    klass = cls.value
    if not _matches(tx, subject, klass):
        tx.push(ConstantVariable(None))
        return
    match_args = getattr(klass, "__match_args__", None)
    if match_args is not None:
        tx.output.guards.class_member(klass, "__match_args__", match_args)
        if not isinstance(match_args, tuple):
            raise tx.observed(TypeError(f"{klass.__name__}.__match_args__ must be a tuple "
                                        f"(got {type(match_args).__name__})"))
    # a builtin's subclass without __match_args__ of its own (an IntEnum, torch.Size) matches
    # a single positional sub-pattern whole, as the builtin does (case int(n): n is the subject)
    if inst.arg and match_args is None and issubclass(klass, _SELF_MATCHING):
        if inst.arg > 1:
            raise tx.observed(TypeError(f"{klass.__name__}() accepts 1 positional sub-pattern ({inst.arg} given)"))
        values, names_left = [subject], list(names.as_example())
    else:
        match_args = match_args or ()
        if inst.arg > len(match_args):
            raise tx.observed(TypeError(f"{klass.__name__}() accepts {len(match_args)} positional "
                                        f"sub-patterns ({inst.arg} given)"))
        values, names_left = [], list(match_args[:inst.arg]) + list(names.as_example())
    repeated = next((n for i, n in enumerate(names_left) if n in names_left[:i]), None)
    if repeated is not None:
        raise tx.observed(TypeError(f"{klass.__name__}() got multiple sub-patterns for attribute {repeated!r}"))
    for name in names_left:
        try:
            values.append(tx.load_attr(subject, name))
        except ObservedException as e:
            if not issubclass(e.exc.cls, AttributeError):
                raise
            tx.push(ConstantVariable(None))           # no such attribute: the pattern fails
            return
    tx.push(TupleVariable(values))


# classes whose instances a single positional sub-pattern matches whole (case int(n))
_SELF_MATCHING = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)


def _matches(tx, v, klass) -> bool:
    """isinstance(v, klass) of a traced value, without specializing a size."""
    from .values import example_of
    if isinstance(v, TensorVariable):
        return issubclass(type(v.example), klass)
    return isinstance(example_of(v), klass)


@handles("GET_ITER")
def _get_iter(tx, inst):
    tx.push(iter_of(tx, tx.pop()))


@handles("FOR_ITER")
def _for_iter(tx, inst):
    item = next_item(tx, tx.stack[-1])
    if item is not None:
        tx.push(item)
        return
    # exhausted: the iterator is popped and the loop's END_FOR (3.12: END_FOR,
    # 3.13: END_FOR + POP_TOP, which would pop it) skipped
    tx.pop()
    target = tx.offset_to_index[inst.argval]
    if tx.version >= (3, 12) and tx.instructions[target].opname == "END_FOR":
        target += 1
        if tx.version >= (3, 13) and tx.instructions[target].opname == "POP_TOP":
            target += 1
    tx.pc = target


@handles("END_FOR", versions=[(3, 12), (3, 13)])
def _end_for(tx, inst):
    tx.pop()
    if tx.version == (3, 12):
        tx.pop()


# with blocks: torch.no_grad() and friends, torch.autocast, nullcontext -------------------
_AUTOCAST_CLASSES = {torch.autocast, torch.amp.autocast, torch.cpu.amp.autocast, torch.cuda.amp.autocast}


@handles("BEFORE_WITH")
def _before_with(tx, inst):
    ctx = tx.pop()
    entered = ConstantVariable(None)
    if isinstance(ctx, UserObjectVariable) and type(ctx.value) in _AUTOCAST_CLASSES:
        # an autocast object made outside (@torch.autocast(...) on a function: its wrapper's
        # `with autocast_instance:`): the same as one made here with its settings
        if ctx.source is not None:
            tx.output.guards.identity(ctx.source, ctx.value, "autocast object")
        made = ctx.value
        ctx = AutocastVariable(made.device, made.fast_dtype, made._enabled, made._cache_enabled)
    if not tx.output.inline_user_calls and isinstance(ctx, (GradModeVariable, AutocastVariable,
                                                            InferenceModeVariable)):
        # a frame that runs eagerly enters it for real (a break here, the manager made again):
        # a break inside the block then calls the callee in its state, as eager
        raise tx.unsupported(f"with-block on {ctx.describe()} in a frame that runs eagerly",
                             "entered for real, so that a call in the block runs in its state")
    grad_before = autocast_entered = None
    if isinstance(ctx, GradModeVariable):
        prev = grad_before = torch.is_grad_enabled() if ctx.before is None else ctx.before
        tx.set_grad(ctx.enabled)
        undo = lambda tx: tx.set_grad(prev)          # noqa: E731
    elif isinstance(ctx, AutocastVariable):
        undo, entered = tx.enter_autocast(ctx), ctx
        autocast_entered = ctx
    elif isinstance(ctx, InferenceModeVariable) and ctx.mode:
        undo = tx.enter_inference_mode()
    elif isinstance(ctx, NullContextVariable):
        undo, entered = (lambda tx: None), ctx.enter_result
    elif isinstance(ctx, UserObjectVariable) and tx.output.inline_user_calls and all(isinstance(
            class_attr(type(ctx.value), m), types.FunctionType) for m in ("__enter__", "__exit__")):
        # a context manager of a Python class (contextlib.contextmanager's too): its methods traced
        exit_ = BoundMethodVariable(class_attr(type(ctx.value), "__exit__"), ctx)
        entered = tx.call_function(tx.load_attr(ctx, "__enter__"), [], {})
        tx.with_depth += 1
        tx.push(WithExitVariable(exit=exit_))
        tx.push(entered)
        return
    else:
        raise tx.unsupported(f"with-block on {ctx.describe()}",
                             "only torch.no_grad/enable_grad/set_grad_enabled, torch.autocast, "
                             "contextlib.nullcontext and Python classes' context managers are modelled")
    tx.with_depth += 1
    tx.push(WithExitVariable(undo, grad_before=grad_before, autocast=autocast_entered))
    tx.push(entered)


@handles("STORE_SUBSCR")
def _store_subscr(tx, inst):
    idx = tx.pop()
    obj = tx.pop()
    store_item(tx, obj, idx, tx.pop())


@handles("STORE_SLICE", versions=[(3, 12), (3, 13)])
def _store_slice(tx, inst):
    end = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    store_item(tx, obj, _slice_of(start, end), tx.pop())        # obj[start:end] = value


def store_item(tx, obj, idx, value):
    """obj[idx] = value (also operator.setitem)."""
    tx.no_tensor_bounds(idx)
    if isinstance(obj, TensorVariable):
        tx.output.call("call_function", operator.setitem, [obj, idx, value], {})
    elif isinstance(obj, ListVariable) and idx.is_constant():
        key = idx.as_example()
        if isinstance(key, slice):
            value = tx.iterate(value)                # l[1:3] = iterable
        tx.mutate(obj)
        obj.items[key] = value
    elif isinstance(obj, DictVariable) and (key := dict_key(idx)) is not NO_KEY:
        tx.mutate(obj)
        obj.items[key] = value
    else:
        raise tx.unsupported(f"item assignment on {obj.describe()}")


@handles("DELETE_SUBSCR")
def _delete_subscr(tx, inst):
    idx = tx.pop()
    delete_item(tx, tx.pop(), idx)


def delete_item(tx, obj, idx):
    """del obj[idx] (also operator.delitem)."""
    if isinstance(obj, ListVariable) and idx.is_constant():
        tx.mutate(obj)
        del obj.items[idx.as_example()]
    elif isinstance(obj, DictVariable) and (key := dict_key(idx)) is not NO_KEY:
        if key not in obj.items:
            raise tx.observed(KeyError(key_example(key)))
        tx.mutate(obj)
        del obj.items[key]
    else:
        raise tx.unsupported(f"del on {obj.describe()}")


@handles("STORE_ATTR")
def _store_attr(tx, inst):
    obj = tx.pop()
    value = tx.pop()
    tx.store_attr(obj, inst.argval, value)


@handles("DELETE_ATTR")
def _delete_attr(tx, inst):
    tx.store_attr(tx.pop(), inst.argval, DELETED)


@handles("LOAD_FAST_AND_CLEAR", versions=[(3, 12), (3, 13)])
def _load_fast_and_clear(tx, inst):
    name = inst.argval
    v = tx.locals.pop(name, None) if name in tx.locals else None
    tx.push(v if v is not None else NULL)


@handles("LOAD_FAST_LOAD_FAST", versions=[(3, 13)])
def _load_fast_load_fast(tx, inst):
    first, second = tx._two_locals(inst)
    tx.push(tx.load_local(first))
    tx.push(tx.load_local(second))


@handles("STORE_FAST")
def _store_fast(tx, inst):
    tx.lazy_locals.pop(inst.argval, None)
    tx.locals[inst.argval] = tx.pop()


@handles("STORE_FAST_LOAD_FAST", versions=[(3, 13)])
def _store_fast_load_fast(tx, inst):
    store, load = tx._two_locals(inst)
    tx.lazy_locals.pop(store, None)
    tx.locals[store] = tx.pop()
    tx.push(tx.load_local(load))


@handles("STORE_FAST_STORE_FAST", versions=[(3, 13)])
def _store_fast_store_fast(tx, inst):
    first, second = tx._two_locals(inst)   # TOS goes to the first name
    for name in (first, second):
        tx.lazy_locals.pop(name, None)
        tx.locals[name] = tx.pop()


@handles("DELETE_FAST")
def _delete_fast(tx, inst):
    tx.locals.pop(inst.argval, None)
    tx.lazy_locals.pop(inst.argval, None)


@handles("LOAD_CONST")
def _load_const(tx, inst):
    tx.push(ConstantVariable(inst.argval))


@handles("RETURN_VALUE")
def _return_value(tx, inst):
    tx.return_value = tx.pop()
    _returns(tx)


@handles("RETURN_CONST", versions=[(3, 12), (3, 13)])
def _return_const(tx, inst):
    tx.return_value = ConstantVariable(inst.argval)
    _returns(tx)


def _returns(tx):
    """The frame ends: generators only its locals held are closed (as its locals go)."""
    dropped(tx, list(tx.locals.values()), [tx.return_value], leaving=True)
    raise Return()


# imports inside a function: of a module already imported, they only look it up ----------
@handles("IMPORT_NAME")
def _import_name(tx, inst):
    fromlist, level = tx.pop().as_example(), tx.pop().as_example()
    name = inst.argval
    if level:
        package = tx.f_globals.get("__package__") or tx.f_globals.get("__name__", "")
        base = package.rsplit(".", level - 1)[0] if level > 1 else package
        name = f"{base}.{name}" if name else base
    module = sys.modules.get(name)
    if module is None and "." not in name and importlib.util.find_spec(name) is None:
        # an optional dependency that is not installed (`try: import x except ImportError:`)
        tx.output.guards.imported(name, None)
        raise tx.observed(ModuleNotFoundError(f"No module named {name!r}", name=name))
    if module is None:
        raise tx.unsupported(f"import of {name}, not imported yet",
                               "a first import runs the module's code: it runs for real")
    tx.output.guards.imported(name, module)
    if not fromlist and not level:
        name = name.partition(".")[0]                       # `import a.b` binds a
        module = sys.modules[name]
        tx.output.guards.imported(name, module)
    # read through sys.modules (the guard's SYS_MODULES): its attributes are guarded, and its
    # lists and dicts are the ones the trace reaches by other ways
    var = PythonModuleVariable(module, ItemSource(RootSource("SYS_MODULES"), name))
    if fromlist and isinstance(module.__dict__.get("__getattr__"), types.FunctionType):
        # CPython asks the module for __path__ (is it a package?), which its own __getattr__
        # answers where it has none: that call is made in the trace too. A package's from-list
        # is read by importlib, which asks its __getattr__ for each name its dict lacks (torch's
        # own `from torch import nn` asks none): then imported for real
        try:
            tx.load_attr(var, "__path__")
        except ObservedException as e:
            if not issubclass(e.exc.cls, AttributeError):
                raise
        else:
            if any(n == "*" or n not in module.__dict__ for n in fromlist):
                raise tx.unsupported(f"from-import of a name a package serves by its __getattr__ ({name})",
                                     "importlib reads the name with it: it runs for real")
    tx.push(var)


@handles("IMPORT_FROM")
def _import_from(tx, inst):
    module = tx.stack[-1]
    if not isinstance(module, PythonModuleVariable):
        raise tx.unsupported(f"from-import of {module.describe()}")
    mod, name = module.value, inst.argval
    try:
        # as `module.name` reads it: its __getattr__ inlined, a name it lacks guarded (it may
        # be set later, or served by a __getattr__ added later)
        value = tx.load_attr(module, name)
    except ObservedException as e:
        if not issubclass(e.exc.cls, AttributeError):
            raise
        submodule = f"{mod.__name__}.{name}"
        if submodule in sys.modules:
            tx.output.guards.imported(submodule, sys.modules[submodule])
            tx.push(PythonModuleVariable(sys.modules[submodule]))
            return
        if hasattr(mod, "__path__") and importlib.util.find_spec(submodule) is not None:
            raise tx.unsupported(f"import of {submodule}, not imported yet",
                                 "a first import runs the module's code: it runs for real")
        # (`try: from fast import kernel except ImportError:`)
        raise tx.observed(ImportError(f"cannot import name {name!r} from {mod.__name__!r} "
                                      f"({getattr(mod, '__file__', None) or 'unknown location'})",
                                      name=mod.__name__, path=getattr(mod, "__file__", None)))
    tx.push(value)


@handles("LOAD_GLOBAL")
def _load_global(tx, inst):
    # low bit of the oparg: also push a NULL, before the global on 3.11/3.12 and after
    # it on 3.13 (dis has already resolved argval to the name)
    null = bool(inst.arg & 1)
    if null and tx.version < (3, 13):
        tx.push(NULL)
    tx.push(tx.load_global(inst.argval))
    if null and tx.version >= (3, 13):
        tx.push(NULL)


@handles("LOAD_DEREF")
def _load_deref(tx, inst):
    name = inst.argval
    cell = tx.closure_cells.get(name)
    if isinstance(cell, CellVariable):                  # a local of a frame in the trace
        if cell.name not in cell.tx.locals and cell.name not in cell.tx.lazy_locals:
            raise tx.observed(NameError(f"cannot access free variable '{name}' where it is not "
                                        "associated with a value in enclosing scope"))
        tx.push(cell.tx.load_local(cell.name))
    elif isinstance(cell, ClosureCellVariable):
        tx.push(tx.read_cell(cell, name))
    elif name in tx.freevars:
        tx.push(tx.read_cell(tx.closure_cell(name), name))
    else:
        tx.push(tx.load_local(name))        # a cell variable of this frame


class FrameLocals:
    """A frame's locals as the trace's undo log keeps them (OutputGraph.record_mutation)."""

    def __init__(self, tx):
        self.tx = tx

    def state(self):
        return dict(self.tx.locals), dict(self.tx.lazy_locals)

    def restore(self, state):
        for now, then in zip((self.tx.locals, self.tx.lazy_locals), state):
            now.clear()
            now.update(then)


@handles("STORE_DEREF")
def _store_deref(tx, inst):
    name = inst.argval
    cell = tx.closure_cells.get(name)
    if isinstance(cell, CellVariable):
        if cell.tx.parent is None and cell.tx is not tx and cell.tx.output is not tx.output:
            raise tx.unsupported("nonlocal assignment to another frame")
        if cell.tx is not tx:           # a caller's local, from an inlined call: rolled back
            tx.output.record_mutation(FrameLocals(cell.tx))     # with it if the call breaks
        cell.tx.lazy_locals.pop(cell.name, None)
        cell.tx.locals[cell.name] = tx.pop()
    elif isinstance(cell, ClosureCellVariable):
        tx.write_cell(cell, name, tx.pop())
    elif name in tx.freevars:
        tx.write_cell(tx.closure_cell(name), name, tx.pop())
    else:
        tx.lazy_locals.pop(name, None)      # a cell variable of this frame, rebound
        tx.locals[name] = tx.pop()


@handles("STORE_GLOBAL")
def _store_global(tx, inst):
    tx.store_global(inst.argval, tx.pop())


@handles("DELETE_GLOBAL")
def _delete_global(tx, inst):
    tx.store_global(inst.argval, DELETED)


@handles("LOAD_ATTR", versions=[(3, 11)])
def _load_attr_311(tx, inst):
    tx.push(tx.load_attr(tx.pop(), inst.argval))


@handles("LOAD_METHOD", versions=[(3, 11)])
def _load_method_311(tx, inst):
    # CPython pushes [unbound method, tx] or [NULL, attribute]; a bound-method variable
    # behind a NULL means the same to CALL and keeps one representation.
    obj = tx.pop()
    tx.push(NULL)
    tx.push(tx.load_attr(obj, inst.argval))


@handles("LOAD_ATTR", versions=[(3, 12), (3, 13)])
def _load_attr_312(tx, inst):
    # low bit set: a method load for a following CALL; 3.12 pushes [NULL|meth, attr|tx],
    # 3.13 pushes [attr|meth, NULL|tx]
    obj = tx.pop()
    tx._push_attribute(tx.load_attr(obj, inst.argval), method_load=bool(inst.arg & 1))


@handles("PUSH_NULL")
def _push_null(tx, inst):
    tx.push(NULL)


@handles("KW_NAMES", versions=[(3, 11), (3, 12)])
def _kw_names(tx, inst):
    names = inst.argval
    if not isinstance(names, tuple):          # 3.11's dis does not resolve the const
        names = tx.code.co_consts[inst.arg]
    tx.kw_names = tuple(names)


@handles("CALL")
def _call(tx, inst):
    kw, tx.kw_names = tx.kw_names, ()
    if tx.version >= (3, 13):
        kw = ()                               # 3.13 uses CALL_KW for keywords
    tx.call_with_stack_layout(inst.arg, kw)


@handles("CALL_KW", versions=[(3, 13)])
def _call_kw(tx, inst):
    names = tx.pop()                        # a constant tuple of keyword names
    tx.call_with_stack_layout(inst.arg, tuple(names.as_example()))


@handles("CALL_FUNCTION_EX")
def _call_function_ex(tx, inst):
    kwargs = tx.pop() if inst.arg & 1 else DictVariable({})
    callargs = tx.pop()
    a, b = tx.popn(2)
    # 3.11/3.12: [NULL, func, args, kwargs]; 3.13: [func, NULL, args, kwargs]
    fn = a if tx.version >= (3, 13) else b
    if not isinstance(kwargs, DictVariable) or not all(isinstance(k, str) for k in kwargs.items):
        raise tx.unsupported(f"**kwargs from {kwargs.describe()}")
    tx.push(tx.call_function(fn, tx.unpack(callargs), dict(kwargs.items)))


@handles("POP_TOP")
def _pop_top(tx, inst):
    popped = tx.pop()
    if isinstance(popped, GeneratorVariable):        # (a loop's iterator, left by break/return)
        dropped(tx, [popped], [tx])


@handles("COPY")
def _copy(tx, inst):
    tx.push(tx.stack[-inst.arg])


@handles("SWAP")
def _swap(tx, inst):
    i = inst.arg
    tx.stack[-1], tx.stack[-i] = tx.stack[-i], tx.stack[-1]


@handles("BINARY_OP")
def _binary_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(tx.binary(BINARY_OP_SYMBOLS[inst.arg], a, b))


@handles("COMPARE_OP")
def _compare_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    sym = _cmp_symbol(inst.argval)
    if sym not in COMPARE_OPS:                 # an unresolved oparg: use the printed form
        sym = _cmp_symbol(inst.argrepr)
    tx.push(tx.binary(sym, a, b))


@handles("IS_OP")
def _is_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(ConstantVariable(identical(tx, a, b) != bool(inst.arg)))


def identical(tx, a, b) -> bool:
    """`a is b` (also operator.is_), guarded where it depends on the call."""
    if a is b:
        r = True
    elif isinstance(a, UserObjectVariable) and isinstance(b, UserObjectVariable) and \
            isinstance(a.value, enum.Enum) and isinstance(b.value, enum.Enum):
        r = a.value is b.value           # an Enum's members: each held by identity (OutputGraph.wrap)
    elif isinstance(a, _OBJECTS) and isinstance(b, _OBJECTS) and \
            getattr(a, "source", None) is not None and getattr(b, "source", None) is not None:
        # two of the call's objects (lists, dicts, objects): one read under two sources is
        # one variable (OutputGraph.wrap), so these are two, and stay two by a guard
        if not (tx.output.is_container(a) and tx.output.is_container(b)):
            raise tx.unsupported(f"'is' between {a.describe()} and {b.describe()}")
        r = False
        tx.output.guards.same_object(a.source, b.source, False)
    elif isinstance(a, SymIntVariable) and _is_singleton(b) or isinstance(b, SymIntVariable) and _is_singleton(a):
        r = False              # a size is an int, never None: not read (that would make it static)
    elif a.is_constant() and b.is_constant():
        r = a.as_example() is b.as_example()
    elif not isinstance(a, TensorVariable) and not isinstance(b, TensorVariable) and \
            (key_a := dict_key(a)) is not NO_KEY and (key_b := dict_key(b)) is not NO_KEY:
        r = key_a is key_b                 # classes, functions, typing forms: each is itself
    elif _is_singleton(a) and not b.is_constant() or _is_singleton(b) and not a.is_constant():
        r = False              # None, True, False...: never an object the trace tracks
    elif isinstance(a, NNModuleVariable) and isinstance(b, NNModuleVariable):
        r = tx.output.same_module(a, b)
    elif isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        a, b = a.identity(), b.identity()
        if a is b:
            r = True
        elif a.source is not None and b.source is not None:
            r = a.example is b.example         # two of the call's tensors (attention's `query is key`)
            tx.output.guards.same_object(a.source, b.source, r)
        else:
            # one the graph computed: each op's new tensor is a new variable (one that gives
            # its input back is marked so: OutputGraph.call)
            r = False
    elif isinstance(a, _OBJECTS) and isinstance(b, _OBJECTS) and \
            (getattr(a, "source", None) is None or getattr(b, "source", None) is None):
        r = False                  # one made in the frame: only itself (a is b, above) is it
    elif any(isinstance(t, TensorVariable) and isinstance(o, UserObjectVariable) and not isinstance(o.value, torch.Tensor)
             for t, o in ((a, b), (b, a))):
        r = False                  # a tensor is no object of another type (`t is not _MISSING`)
    elif any(c.is_constant() and isinstance(o, UserObjectVariable) and type(o.value) is not type(c.as_example())
             for c, o in ((a, b), (b, a))):
        r = False                  # an object is no constant of another type (`value is NO_DEFAULT`, an enum)
    else:
        raise tx.unsupported(f"'is' between {a.describe()} and {b.describe()}")
    return r


# values whose identity the trace knows: one made in the frame is only itself
_OBJECTS = (UserObjectVariable, ModelOutputVariable, DictVariable, ListVariable, NestedFunctionVariable,
            ExceptionVariable)


@handles("CONTAINS_OP")
def _contains_op(tx, inst):
    container = tx.pop()
    item = tx.pop()
    tx.push(ConstantVariable(contains(tx, container, item) != bool(inst.arg)))


def contains(tx, container, item) -> bool:
    """`item in container` (also operator.contains)."""
    if item.is_constant() and container.is_constant():
        r = item.as_example() in container.as_example()
    elif isinstance(container, DictVariable) and (key := dict_key(item)) is not NO_KEY:
        r = key in container.items
    elif isinstance(container, SetVariable) and (key := set_key(item)) is not NO_KEY:
        r = key in container.real                         # (mode in {Mode.TRAIN, Mode.EVAL})
    elif item.is_constant() and isinstance(container, DictViewVariable) and container.kind == "keys":
        r = item.as_example() in container.dict_var.items
    elif item.is_constant() and isinstance(container, NNModuleVariable) and \
            isinstance(container.module, torch.nn.ModuleDict):
        r = item.as_example() in tx.output.members(container)
    elif item.is_constant() and isinstance(container, UserObjectVariable) and type(container.value) is set \
            and container.source is not None and all(is_constant_value(x) for x in container.value):
        # a set of constants from outside the frame (a registry's names): the answer holds
        # while it has these items, which the guard checks (the trace cannot change it)
        tx.output.guards.constant(container.source, set(container.value))
        r = item.as_example() in container.value
    elif isinstance(container, (ListVariable, TupleVariable)):
        # as Python: an item that is it, or == it (objects by their __eq__ or identity)
        r = any(e is item or tx.truth(tx.binary("==", e, item), "in") for e in container.items)
    else:
        special = tx.call_special(container, "__contains__", [item])
        if special is None or not special.is_constant():
            raise tx.unsupported(f"'in' on {container.describe()}")
        r = bool(special.as_example())
    return r


@handles("UNARY_NEGATIVE")
def _unary_negative(tx, inst):
    tx._unary(operator.neg, "unary -")


@handles("UNARY_INVERT")
def _unary_invert(tx, inst):
    tx._unary(operator.invert, "unary ~")


@handles("UNARY_POSITIVE", versions=[(3, 11)])
def _unary_positive(tx, inst):
    tx._unary(operator.pos, "unary +")


@handles("UNARY_NOT")
def _unary_not(tx, inst):
    v = tx.pop()
    tx.push(ConstantVariable(not tx.truth(v, "not")))


@handles("TO_BOOL", versions=[(3, 13)])
def _to_bool(tx, inst):
    jump = tx.instructions[tx.pc]
    if jump.opname in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE") and \
            tx.branch_to_raise(jump) is not None:
        return         # (`assert t`, a branch to a raise: the tensor is checked in the graph, at the jump)
    v = tx.pop()
    tx.push(ConstantVariable(tx.truth(v, "TO_BOOL")))


@handles("CALL_INTRINSIC_1", versions=[(3, 12), (3, 13)])
def _call_intrinsic_1(tx, inst):
    if inst.argrepr == "INTRINSIC_LIST_TO_TUPLE":
        v = tx.pop()
        tx.push(TupleVariable(tx.unpack(v)))
    elif inst.argrepr == "INTRINSIC_UNARY_POSITIVE":
        tx._unary(operator.pos, "unary +")
    elif inst.argrepr == "INTRINSIC_STOPITERATION_ERROR":
        tx.push(pep_479(tx.pop()))
    else:
        raise tx.unsupported(f"CALL_INTRINSIC_1 {inst.argrepr}")


@handles("LIST_TO_TUPLE", versions=[(3, 11)])
def _list_to_tuple(tx, inst):
    tx.push(TupleVariable(tx.unpack(tx.pop())))


# containers -----------------------------------------------------------------------
@handles("BUILD_TUPLE")
def _build_tuple(tx, inst):
    tx.push(TupleVariable(tx.popn(inst.arg)))


@handles("BUILD_LIST")
def _build_list(tx, inst):
    tx.push(ListVariable(tx.popn(inst.arg)))


@handles("LIST_EXTEND")
def _list_extend(tx, inst):
    v = tx.pop()
    lst = tx.stack[-inst.arg]
    if not isinstance(lst, ListVariable):
        raise tx.unsupported("LIST_EXTEND on a non-list")
    tx.mutate(lst)
    lst.items.extend(tx.iterate(v))


@handles("LIST_APPEND")
def _list_append(tx, inst):
    v = tx.pop()
    lst = tx.stack[-inst.arg]
    tx.mutate(lst)
    lst.items.append(v)


@handles("MAP_ADD")
def _map_add(tx, inst):
    value = tx.pop()
    key = tx.pop()
    d = tx.stack[-inst.arg]
    k = dict_key(key)
    if k is NO_KEY:
        raise tx.unsupported("dict comprehension with a key that is neither a constant nor a class, "
                             "function or Enum member")
    tx.mutate(d)
    d.items[k] = value


@handles("SET_ADD")
def _set_add(tx, inst):
    item = tx.pop()
    s = tx.stack[-inst.arg]
    key = set_key(item)
    if not isinstance(s, SetVariable) or key is NO_KEY:
        raise tx.unsupported(f"adding {item.describe()} to a set",
                               "sets of Python constants are modelled, not sets of tensors")
    tx.mutate(s)
    s.apply("add", key)


@handles("BUILD_SET")
def _build_set(tx, inst):
    keys = [set_key(i) for i in tx.popn(inst.arg)]      # constants, and objects that are their own key
    if any(k is NO_KEY for k in keys):
        raise tx.unsupported("a set of values that are neither constants nor classes, functions or Enum members")
    tx.push(SetVariable.made_by(set, keys))


@handles("SET_UPDATE")
def _set_update(tx, inst):
    v = tx.pop()
    s = tx.stack[-inst.arg]
    items = tx.iterate(v)
    if not isinstance(s, SetVariable) or not all(i.is_constant() for i in items):
        raise tx.unsupported("a set of non-constant values")
    tx.mutate(s)
    s.apply("update", SetVariable.operand(v, items))


@handles("BUILD_MAP")
def _build_map(tx, inst):
    flat = tx.popn(2 * inst.arg)
    keys = [dict_key(k) for k in flat[0::2]]      # constants, and objects that are their own key
    if any(k is NO_KEY for k in keys):
        raise tx.unsupported("dict with keys that are neither constants nor classes, functions or Enum members")
    tx.push(DictVariable(dict(zip(keys, flat[1::2]))))


@handles("BUILD_CONST_KEY_MAP")
def _build_const_key_map(tx, inst):
    keys = tx.pop()
    vals = tx.popn(inst.arg)
    tx.push(DictVariable(dict(zip(keys.as_example(), vals))))


@handles("DICT_MERGE", "DICT_UPDATE")
def _dict_merge(tx, inst):
    v = tx.pop()
    d = tx.stack[-inst.arg]
    if not isinstance(v, DictVariable) or not isinstance(d, DictVariable):
        raise tx.unsupported(f"{inst.opname} with {v.describe()}")
    if inst.opname == "DICT_MERGE" and (twice := next((k for k in v.items if k in d.items), None)) is not None:
        # f(**a, **b) with a key in both: CPython's TypeError, naming the function called
        fn = tx.stack[-inst.arg - (3 if tx.version >= (3, 13) else 2)]    # (3.13: self or NULL between)
        real = getattr(fn, "value", None)
        name = f"{real.__module__}.{real.__qualname__}()" if hasattr(real, "__qualname__") else "function"
        raise tx.observed(TypeError(f"{name} got multiple values for keyword argument '{twice}'"))
    tx.mutate(d)
    d.items.update(v.items)


@handles("BUILD_SLICE")
def _build_slice(tx, inst):
    # a bound that is a tensor made from constants alone (VITS's torch.IntTensor([n])[0]): its
    # value, as the slice's __index__ reads it, is the same at every call
    parts = [ConstantVariable(p.example.item()) if isinstance(p, TensorVariable) and p.example.dim() == 0
             and not p.example.is_floating_point() and not p.example.is_complex() and p.example.dtype != torch.bool
             and tx.output.made_of_constants(p) else p for p in tx.popn(inst.arg)]
    if all(p.is_constant() and not isinstance(p, SymIntVariable) for p in parts):
        tx.push(ConstantVariable(slice(*[p.as_example() for p in parts])))
    else:
        tx.push(SliceVariable(parts))


@handles("BINARY_SUBSCR")
def _binary_subscr(tx, inst):
    idx = tx.pop()
    obj = tx.pop()
    tx.push(tx.subscript(obj, idx))


@handles("BINARY_SLICE", versions=[(3, 12), (3, 13)])
def _binary_slice(tx, inst):
    end = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    tx.push(tx.subscript(obj, _slice_of(start, end)))


def _slice_of(start, end):
    """The slice start:end of 3.12's BINARY_SLICE and STORE_SLICE."""
    if start.is_constant() and end.is_constant():
        return ConstantVariable(slice(start.as_example(), end.as_example()))
    return SliceVariable([start, end])


@handles("UNPACK_SEQUENCE")
def _unpack_sequence(tx, inst):
    items = tx.unpack(tx.pop(), inst.arg)
    for v in reversed(items):
        tx.push(v)


@handles("UNPACK_EX")
def _unpack_ex(tx, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = tx.unpack(tx.pop())
    if len(items) < before + after:
        raise tx.unsupported("not enough values to unpack")
    rest = ListVariable(items[before:len(items) - after])
    out = items[:before] + [rest] + items[len(items) - after:]
    for v in reversed(out):
        tx.push(v)


@handles("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", versions=[(3, 11)])
@handles("POP_JUMP_IF_FALSE", versions=[(3, 12), (3, 13)])
def _pop_jump_if_false(tx, inst):
    if tx.check_branch_to_raise(inst):
        return
    tx._cond_jump(inst, lambda v: not tx.truth(v, inst.opname))


@handles("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE", versions=[(3, 11)])
@handles("POP_JUMP_IF_TRUE", versions=[(3, 12), (3, 13)])
def _pop_jump_if_true(tx, inst):
    if tx.check_branch_to_raise(inst):
        return
    tx._cond_jump(inst, lambda v: tx.truth(v, inst.opname))


@handles("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE", versions=[(3, 11)])
@handles("POP_JUMP_IF_NONE", versions=[(3, 12), (3, 13)])
def _pop_jump_if_none(tx, inst):
    tx._cond_jump(inst, tx._is_none)


@handles("POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", versions=[(3, 11)])
@handles("POP_JUMP_IF_NOT_NONE", versions=[(3, 12), (3, 13)])
def _pop_jump_if_not_none(tx, inst):
    tx._cond_jump(inst, lambda v: not tx._is_none(v))


@handles("JUMP_IF_FALSE_OR_POP", versions=[(3, 11)])
def _jump_if_false_or_pop(tx, inst):
    if not tx.truth(tx.stack[-1], inst.opname):
        tx.jump_to(inst)
    else:
        tx.pop()


@handles("JUMP_IF_TRUE_OR_POP", versions=[(3, 11)])
def _jump_if_true_or_pop(tx, inst):
    if tx.truth(tx.stack[-1], inst.opname):
        tx.jump_to(inst)
    else:
        tx.pop()


@handles("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
def _jump(tx, inst):
    tx.jump_to(inst)           # backward jumps (loops) raise Unsupported
