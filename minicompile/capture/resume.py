"""Resume functions: the rest of a frame, from one instruction on, as a real Python function.

Takes: a function's code object, an instruction offset in it, and the shape of the live state
there (which locals are bound, the value stack with its NULL markers). Hands on: a function
that, called with those locals and stack values, runs the original bytecode from that offset to
the frame's end, exactly as CPython would have: every instruction, `try`/`except` and `with`
blocks, `assert`, `raise`, line numbers in tracebacks. TorchDynamo writes one of these for
every graph break; minicompile uses it where its own interpreter cannot run the rest of a frame,
so that a graph break never fails a call.

The new code object is the original one with a short prologue in front:

    COPY_FREE_VARS n            (the closure's cells, as the original frame starts)
    RESUME 0
    <each cell variable that is not a parameter>   its cell, from the pack
    <each stack value, bottom first>               PUSH_NULL, or pack[i]
    <local 0 itself>                               pack[0]
    DELETE_FAST <each local that was unbound>
    JUMP_FORWARD <to the resume offset>
    <the original bytecode, unchanged>

Every local of the original is a positional parameter (a cell variable's slot is passed its
cell). The values the prologue needs beyond the locals (the stack, the cells of variables that
are not parameters) travel in a tuple passed in local 0's slot (the "pack"), whose first item is
local 0's own value. Jumps in 3.11+ bytecode are relative, so the original code needs no change;
the exception table's offsets move by the prologue's length, and the line table gets
"no location" entries for the prologue. Python 3.11, 3.12 and 3.13.
"""
from __future__ import annotations

import contextlib
import dis
import inspect
import opcode
import os
import sys
import threading
import types
import warnings
from typing import Optional

_CACHE = {}


def _cache_entries(name: str) -> int:
    table = opcode._inline_cache_entries
    return table.get(name, 0) if isinstance(table, dict) else table[dis.opmap[name]]


def _emit(out: bytearray, name: str, arg: int = 0) -> None:
    """One instruction, with the EXTENDED_ARG prefixes its argument needs and its inline
    cache entries."""
    for shift in (24, 16, 8):
        if arg >> shift:
            out += bytes([dis.opmap["EXTENDED_ARG"], (arg >> shift) & 0xFF])
    out += bytes([dis.opmap[name], arg & 0xFF])
    out += bytes([dis.opmap["CACHE"], 0]) * _cache_entries(name)


def _varint(value: int, first: bool) -> bytes:
    """The exception table's variable-length integer (6 bits a byte, bit 6: more follow; bit
    7 marks an entry's first byte), as CPython's assembler writes it."""
    chunks = []
    while True:
        chunks.append(value & 0x3F)
        value >>= 6
        if not value:
            break
    chunks.reverse()
    out = bytearray()
    for i, c in enumerate(chunks):
        byte = c | (0x40 if i < len(chunks) - 1 else 0)
        if i == 0 and first:
            byte |= 0x80
        out.append(byte)
    return bytes(out)


def _shifted_exception_table(code: types.CodeType, units: int) -> bytes:
    out = bytearray()
    for e in dis._parse_exception_table(code):
        out += _varint(e.start // 2 + units, True)
        out += _varint((e.end - e.start) // 2, False)
        out += _varint(e.target // 2 + units, False)
        out += _varint((e.depth << 1) | int(e.lasti), False)
    return bytes(out)


def _no_location(units: int) -> bytes:
    """Line-table entries that give `units` code units no source location (code 15)."""
    out = bytearray()
    while units > 0:
        n = min(8, units)
        out.append(0x80 | (15 << 3) | (n - 1))
        units -= n
    return bytes(out)


def stack_depths(code: types.CodeType) -> dict:
    """The value stack's depth before each reachable instruction (offset -> depth), by
    following the bytecode's control flow with dis.stack_effect, exception handlers included."""
    if code in _DEPTHS:
        return _DEPTHS[code]
    instructions = list(dis.get_instructions(code))
    at = {ins.offset: i for i, ins in enumerate(instructions)}
    handlers = [(e.start, e.end, e.target, e.depth + 1 + int(e.lasti))
                for e in dis._parse_exception_table(code)]
    depths: dict = {}
    todo = [(0, 0)]
    while todo:
        offset, depth = todo.pop()
        while offset in at and offset not in depths:
            depths[offset] = depth
            for start, end, target, handler_depth in handlers:
                if start <= offset < end and target not in depths:
                    todo.append((target, handler_depth))
            ins = instructions[at[offset]]
            op, arg = ins.opcode, ins.arg
            if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
                todo.append((ins.argval, depth + dis.stack_effect(op, arg, jump=True)))
            if ins.opname in _ENDS_BLOCK:
                break
            depth += dis.stack_effect(op, arg, jump=False) if op >= dis.HAVE_ARGUMENT \
                else dis.stack_effect(op)
            offset = instructions[at[offset] + 1].offset if at[offset] + 1 < len(instructions) else -1
    _DEPTHS[code] = depths
    return depths


_DEPTHS: dict = {}
_ENDS_BLOCK = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
               "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT",
               "JUMP_ABSOLUTE"}


def resume_code(code: types.CodeType, offset: int, bound: frozenset, stack_nulls: tuple
                ) -> Optional[types.CodeType]:
    """The code object of a resume function (see the module docstring), or None where one
    cannot be written (a generator, or a function without locals that has closure cells)."""
    key = (code, offset, bound, stack_nulls)
    if key in _CACHE:
        return _CACHE[key]
    _CACHE[key] = made = _resume_code(code, offset, bound, stack_nulls)
    return made


def _resume_code(code, offset, bound, stack_nulls):
    if sys.version_info[:2] not in ((3, 11), (3, 12), (3, 13)):
        return None
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        return None
    if stack_depths(code).get(offset) != len(stack_nulls):
        return None                  # not the stack CPython would have there: never guess
    varnames = code.co_varnames
    if not varnames:
        if code.co_cellvars or code.co_freevars:
            return None              # a new local would move the cells' slots
        varnames = ("___pack",)
    cells_not_params = [c for c in code.co_cellvars if c not in varnames]
    n_params = len(varnames)
    consts = list(code.co_consts)

    def const(value) -> int:
        consts.append(value)
        return len(consts) - 1

    # the pack: (local 0, the cells of non-parameter cell variables..., the stack values...)
    prologue_body = bytearray()
    for j, name in enumerate(cells_not_params):
        slot = n_params + j                 # after the locals, in co_cellvars' order
        _emit(prologue_body, "LOAD_FAST", 0)
        _emit(prologue_body, "LOAD_CONST", const(1 + j))
        _emit(prologue_body, "BINARY_SUBSCR")
        _emit(prologue_body, "STORE_FAST", slot)
    item = 1 + len(cells_not_params)
    for is_null in stack_nulls:
        if is_null:
            _emit(prologue_body, "PUSH_NULL")
            continue
        _emit(prologue_body, "LOAD_FAST", 0)
        _emit(prologue_body, "LOAD_CONST", const(item))
        _emit(prologue_body, "BINARY_SUBSCR")
        item += 1
    _emit(prologue_body, "LOAD_FAST", 0)
    _emit(prologue_body, "LOAD_CONST", const(0))
    _emit(prologue_body, "BINARY_SUBSCR")
    _emit(prologue_body, "STORE_FAST", 0)
    for i, name in enumerate(varnames):
        if name not in bound and name not in code.co_cellvars and name != "___pack":
            _emit(prologue_body, "DELETE_FAST", i)

    head = bytearray()
    if code.co_freevars:
        _emit(head, "COPY_FREE_VARS", len(code.co_freevars))
    _emit(head, "RESUME", 0)
    prologue = head + prologue_body
    # the target is `offset` past the prologue's end, which is the jump's own end: a relative
    # jump over exactly `offset` bytes
    _emit(prologue, "JUMP_FORWARD", offset // 2)
    units = len(prologue) // 2
    flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    return code.replace(
        co_code=bytes(prologue) + code.co_code,
        co_consts=tuple(consts),
        co_varnames=varnames,
        co_nlocals=len(varnames),
        co_argcount=n_params, co_posonlyargcount=0, co_kwonlyargcount=0,
        co_flags=flags,
        co_stacksize=code.co_stacksize + len(stack_nulls) + 3,
        co_linetable=_no_location(units) + code.co_linetable,
        co_exceptiontable=_shifted_exception_table(code, units),
        co_name=code.co_name,
    )


class RaisedAt:
    """A stack value standing for the position of the instruction at `offset` (the original
    code's), which CPython pushes below an exception for a handler that re-raises it
    (RERAISE reads the raising instruction's position back from it)."""

    def __init__(self, offset: int):
        self.offset = offset


def _cell(f_locals: dict, name: str) -> types.CellType:
    """The cell of cell variable `name`: the one passed (a function made before holds it),
    else a new one holding its value (empty: unbound)."""
    value = f_locals.get(name, _UNBOUND)
    if isinstance(value, types.CellType):
        return value
    return types.CellType() if value is _UNBOUND else types.CellType(value)


_UNBOUND = object()


def call_resumed(func: types.FunctionType, offset: int, f_locals: dict, stack: list, null):
    """Run func's code from `offset` with these locals (name -> value; absent: unbound) and
    value stack (bottom first; `null` marks CPython's NULL; a RaisedAt, the position CPython
    would push there). -> (True, what the frame returns), or (False, None) where no resume
    function can be written. Exceptions propagate."""
    code = func.__code__
    stack_nulls = tuple(v is null for v in stack)
    bound = frozenset(f_locals)
    new = resume_code(code, offset, bound, stack_nulls)
    if new is None:
        return False, None
    units = (len(new.co_code) - len(code.co_code)) // 2        # the prologue's code units
    stack = [units + v.offset // 2 if isinstance(v, RaisedAt) else v for v in stack]
    varnames = new.co_varnames
    args = []
    for name in varnames:
        value = f_locals.get(name)
        if name in code.co_cellvars:
            value = _cell(f_locals, name)
        args.append(value)
    cells = [_cell(f_locals, c) for c in code.co_cellvars if c not in varnames]
    args[0] = (args[0], *cells, *[v for v in stack if v is not null])
    resumed = types.FunctionType(new, func.__globals__, func.__name__, None, func.__closure__)
    return True, resumed(*args)


_CALLER_CODES: dict = {}
_SITES = threading.local()     # the breaks whose calls run now, outermost first: (code, line, globals)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # minicompile's own files


def called_from(code: types.CodeType, lineno: Optional[int], f_globals: dict):
    """A function `(fn, args, kwargs) -> fn(*args, **kwargs)` whose frame looks like the user's
    frame at `lineno` of `code`: its file, line, function name and globals. A call made at a
    graph break goes through it, so what reads its caller's frame (warnings.warn and its
    module filters, logging's caller, sys._getframe(1)) finds the user's line, as in eager."""
    key = (code, lineno)
    made = _CALLER_CODES.get(key)
    if made is None:
        source = "\n" * max((lineno or 1) - 1, 0) + "def _(fn, args, kwargs): return fn(*args, **kwargs)\n"
        module = compile(source, code.co_filename, "exec")
        made = next(c for c in module.co_consts if isinstance(c, types.CodeType))
        made = made.replace(co_name=code.co_name, **({"co_qualname": code.co_qualname}
                                                     if hasattr(code, "co_qualname") else {}))
        _CALLER_CODES[key] = made
    return types.FunctionType(made, f_globals)


@contextlib.contextmanager
def calls_from(site):
    """What runs inside is called at a graph break at `site` (a function compiled on its own):
    a warning with a stacklevel past its own frame names the line of `site` (warn_from)."""
    sites = _SITES.__dict__.setdefault("stack", [])
    sites.append(site)
    try:
        yield
    finally:
        sites.pop()


def warn_from(site, args, kwargs):
    """warnings.warn(...) called at a graph break at `site`, as eager's call warns: its
    stacklevel counts the user's frames (the break's, those of the breaks it runs under, then
    the frames that called the compiled code), not minicompile's between them."""
    names = ("message", "category", "stacklevel", "source")     # (a builtin: no signature to bind)
    bound = {**dict(zip(names, args)), **kwargs}
    level = bound.get("stacklevel", 1)
    if len(args) > len(names) or set(kwargs) - set(names) or any(n in kwargs for n in names[:len(args)]) \
            or "message" not in bound or type(level) is not int or level <= 1:
        return called_from(*site)(warnings.warn, args, kwargs)    # (what it raises, or says, is its own)
    frames = [site, *reversed(getattr(_SITES, "stack", []))]
    outermost, frame = None, sys._getframe(1)
    while frame is not None:                 # the user's frames start above minicompile's last
        if frame.f_code.co_filename.startswith(_PACKAGE):
            outermost = frame
        frame = frame.f_back
    frame = outermost.f_back if outermost is not None else None
    while frame is not None:
        frames.append((frame.f_code, frame.f_lineno, frame.f_globals))
        frame = frame.f_back
    message, category = bound["message"], bound.get("category")
    if isinstance(message, Warning):
        category = type(message)
    if category is None:
        category = UserWarning
    if not (isinstance(category, type) and issubclass(category, Warning)):
        raise TypeError(f"category must be a Warning subclass, not '{type(category).__name__}'")
    if level - 1 < len(frames):
        code, lineno, f_globals = frames[level - 1]
        filename = code.co_filename
    else:                                    # past the stack's top: CPython names `sys`
        filename, lineno, f_globals = "sys", 1, sys.__dict__
    warnings.warn_explicit(message, category, filename, lineno, f_globals.get("__name__", "<string>"),
                           f_globals.setdefault("__warningregistry__", {}), f_globals,
                           source=bound.get("source"))
