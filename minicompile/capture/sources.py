"""Sources: where a value the trace read came from, as a Python expression.

Takes: the path the interpreter followed to reach a value (a local of the captured frame, a
global, an attribute, an item, a module's parameter). Hands on: an expression string over the
guard's namespace (`L['x']`, `G['torch']`, `L['self']._modules['fc']._parameters['weight']`),
the same spelling TorchDynamo uses, so that guards.py can generate one check function and
`get_inputs` from the same strings, and placeholder names follow (`l_self_modules_fc_...`).

Namespace roots: `L` is the dict of the captured frame's arguments (built from args/kwargs at
call time), `G` the captured function's globals; anything else (another module's globals, a
closure cell) is an object held by the generated function under a label chosen by the tracer.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

import torch


class Source:
    def expr(self) -> str:
        # made once per source: a source's expression is read for each value found through
        # it, and a parameter's is the expressions of all the modules above it
        e = self.__dict__.get("_expr")
        if e is None:
            e = self.__dict__["_expr"] = self._expr()
        return e

    def _expr(self) -> str:
        raise NotImplementedError

    def name(self) -> str:
        """A Python identifier for graph placeholders: L['x'] -> l_x_ (TorchDynamo's style)."""
        return re.sub(r"[^A-Za-z0-9]+", "_", self.expr()).lower()

    def __str__(self) -> str:
        return self.expr()


@dataclass(frozen=True, eq=True)
class LocalSource(Source):
    local: str

    def _expr(self):
        return f"L[{self.local!r}]"


@dataclass(frozen=True, eq=True)
class RootSource(Source):
    """An object the guard holds directly under `label` (globals dicts, closure cells)."""
    label: str

    def _expr(self):
        return self.label


@dataclass(frozen=True, eq=True)
class ClosureCellSource(Source):
    """Closure cell `index` of the function the call runs (its free variable's cell)."""
    index: int

    def _expr(self):
        return f"F.__closure__[{self.index}]"


@dataclass(frozen=True, eq=True)
class AttrSource(Source):
    base: Source
    attr: str

    def _expr(self):
        return f"{self.base.expr()}.{self.attr}"


@dataclass(frozen=True, eq=True)
class GenericAttrSource(Source):
    """`base.attr` as object.__getattribute__ reads it, past a class's own __getattribute__
    (which the trace runs itself: the guard must not run it again)."""
    base: Source
    attr: str

    def _expr(self):
        return f"object.__getattribute__({self.base.expr()}, {self.attr!r})"


def key_literal(key) -> Optional[str]:
    """A dict key (or index) as Python that finds the same item, or None where none does: its
    repr; for a member of an Enum with a str or int mixin (`<Mode.A: 'a'>` is no Python) its
    plain value, which is equal to it and hashes the same; an infinity or a device by the call
    that makes it; a tuple item by item."""
    if type(key) is tuple:
        items = [key_literal(k) for k in key]
        return None if None in items else "(" + "".join(f"{i}, " for i in items) + ")"
    if isinstance(key, float) and not math.isfinite(key):
        return None if math.isnan(key) else f"float({str(float(key))!r})"
    if isinstance(key, torch.device):
        return f"torch.device({str(key)!r})"
    if type(key) in (str, int, float, bool, bytes, type(None)):
        return repr(key)
    for base, plain in ((bool, bool), (int, int.__index__), (float, float), (str, str.__str__),
                        (bytes, bytes)):
        if isinstance(key, base):
            return repr(plain(key))
    return None


@dataclass(frozen=True, eq=True)
class ItemSource(Source):
    base: Source
    index: object      # int or str (dict key / module name)
    via: Optional[str] = None   # a builtin class whose __getitem__ reads it (a subclass's own
                                # __getitem__ would give what the trace computes from the item)

    def _expr(self):
        return self.read(self.base.expr())

    def read(self, base: str) -> str:
        """The item read from `base`, an expression for the container."""
        literal = key_literal(self.index)
        if literal is None:             # (callers read such an item by position: DictValueSource)
            raise ValueError(f"no Python reads the item at key {self.index!r}")
        if self.via is not None:
            return f"{self.via}.__getitem__({base}, {literal})"
        return f"{base}[{literal}]"


def item_source(base: Source, key, position: int, via: Optional[str] = None) -> Source:
    """Where the guard reads a dict's item: by its key where Python can write the key, else by
    its position (the dict's keys, in order, are then guarded by the caller)."""
    return ItemSource(base, key, via) if key_literal(key) is not None else DictValueSource(base, position)


@dataclass(frozen=True, eq=True)
class DictValueSource(Source):
    """The value at a dict's `position`-th key, for a key the guard's code cannot write (a
    class: values.is_identity_key); the dict's keys, in order, are guarded."""
    base: Source
    position: int

    def _expr(self):
        return f"list({self.base.expr()}.values())[{self.position}]"


@dataclass(frozen=True, eq=True)
class HelperSource(Source):
    """What a function of the guard's namespace reads from `base` without changing it:
    REMAINING, the items an iterator has not yet given (from a copy of it); VIEWED_DICT, the
    dict that a keys(), values() or items() view shows; DEREF, what a weak reference refers to."""
    helper: str
    base: Source

    def _expr(self):
        return f"{self.helper}({self.base.expr()})"


def module_member_source(module_source: Source, kind: str, key: str) -> Source:
    """`self.fc` -> L['self']._modules['fc'] (kind: _modules, _parameters or _buffers).

    Reading the dicts directly skips nn.Module.__getattr__ in the guard and names placeholders
    exactly as TorchDynamo does."""
    return ItemSource(AttrSource(module_source, kind), key)
