"""Instruction decoding, Python-version checks and the opcode registry.

Takes: a code object. Hands on: a list of `Instruction`s (from `dis.get_instructions`, so
`argval` already holds the resolved name / constant / jump-target offset), a map from offsets to
instruction indices (for jumps), and, per Python version, the table opname -> handler that the
interpreter dispatches through.

Handlers register themselves with the versions whose bytecode they model, in the style of
lightning-thunder's interpreter:

    @handles("LOAD_FAST", "LOAD_FAST_CHECK")                   # every supported version
    @handles("PRECALL", versions=[(3, 11)])                    # only 3.11 has PRECALL
    @handles("CALL_KW", versions=[(3, 13)])

Bytecode changes with every minor Python version (3.12 folded LOAD_METHOD into LOAD_ATTR,
3.13 moved the NULL of a call after the callable), so a handler states which versions it was
written for, and an opcode with no handler for the running version is reported by name instead
of being half-modelled.
"""
from __future__ import annotations

import dis
import functools
import operator
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .breaks import UnsupportedPythonVersion

Version = Tuple[int, int]
SUPPORTED_VERSIONS: Tuple[Version, ...] = ((3, 11), (3, 12), (3, 13))
ALL_VERSIONS = SUPPORTED_VERSIONS

# version -> opname -> handler function (unbound, takes (translator, inst))
_REGISTRY: Dict[Version, Dict[str, Callable]] = {v: {} for v in SUPPORTED_VERSIONS}


def current_version() -> Version:
    return sys.version_info[:2]


def check_python_version(version: Optional[Version] = None) -> Version:
    """Raise UnsupportedPythonVersion unless `version` (default: the running one) is 3.11-3.13."""
    version = version or current_version()
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_VERSIONS)
        raise UnsupportedPythonVersion(
            f"Python {version[0]}.{version[1]} is not supported by minicompile's bytecode capture",
            explanation=f"opcode tables exist only for Python {supported}; bytecode changes "
                        "with every minor version",
            hint="the function runs eagerly; use a supported Python to compile it")
    return version


def handles(*opnames: str, versions: Iterable[Version] = ALL_VERSIONS):
    """Register the decorated function as the handler of `opnames` for `versions`."""
    versions = tuple(versions)

    def deco(fn):
        for v in versions:
            if v not in _REGISTRY:
                raise ValueError(f"unknown Python version {v}")
            for name in opnames:
                if name in _REGISTRY[v]:
                    raise ValueError(f"{name} registered twice for {v}")
                _REGISTRY[v][name] = fn
        fn._handles = (opnames, versions)
        return fn

    return deco


def dispatch_table(version: Optional[Version] = None) -> Dict[str, Callable]:
    """opname -> handler for `version` (default: the running Python)."""
    return _REGISTRY[check_python_version(version)]


@dataclass(frozen=True)
class Instruction:
    """The parts of a `dis.Instruction` the interpreter uses (stable across 3.11-3.13)."""
    opname: str
    arg: Optional[int]
    argval: Any
    argrepr: str
    offset: int
    lineno: Optional[int]      # source line of this instruction (None for synthetic ones)
    index: int                 # position in the decoded list, what the interpreter's pc counts

    def __repr__(self) -> str:
        return f"{self.offset:>4} {self.opname} {self.argrepr}".rstrip()


@functools.lru_cache(maxsize=4096)
def decode(code: types.CodeType) -> Tuple[List[Instruction], Dict[int, int]]:
    """Decode `code` into Instructions (CACHE entries hidden) and an offset -> index map.
    Decoded once per code object (a model's twelve blocks run one forward): the callers only
    read the list and the map, and an Instruction is frozen."""
    insts = []
    for i, ins in enumerate(dis.get_instructions(code)):
        # positions.lineno works on 3.11-3.13 (starts_line changed meaning in 3.13).
        pos = getattr(ins, "positions", None)
        lineno = pos.lineno if pos is not None else None
        insts.append(Instruction(ins.opname, ins.arg, ins.argval, ins.argrepr, ins.offset,
                                 lineno, i))
    return insts, {ins.offset: ins.index for ins in insts}


@functools.lru_cache(maxsize=4096)
def exception_table(code: types.CodeType) -> tuple:
    """The code object's exception table (3.11+): entries (start, end, target, depth, lasti)
    that say where CPython goes on when an instruction in [start, end) raises."""
    return tuple(dis._parse_exception_table(code))


def handler_at(code: types.CodeType, offset: int):
    """The exception-table entry covering the instruction at `offset` (None: an exception
    there leaves the frame). CPython goes on at its `target` with the value stack cut to its
    `depth`, then the instruction's position pushed where `lasti` is set, then the exception."""
    return next((e for e in exception_table(code) if e.start <= offset < e.end), None)


# BINARY_OP's argument indexes this table (same numbering in 3.11, 3.12 and 3.13).
BINARY_OP_SYMBOLS: List[str] = [sym for _name, sym in dis._nb_ops]


# What BINARY_OP and COMPARE_OP compute, by symbol (the same in 3.11, 3.12 and 3.13)
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


def _cmp_symbol(argval) -> str:
    # 3.13's dis shows bool(<) when the result is converted to bool; argval is the symbol
    s = str(argval)
    return s[5:-1] if s.startswith("bool(") else s
