"""Guards: what a capture relied on, generated as ONE Python function.

Takes: during tracing, each value the interpreter read from outside the trace (argument,
global, closure cell, module attribute, parameter) with its Source and the kind of check it
needs; at the end, how the captured frame's arguments were passed (`ArgBinding`). Hands on:
`guard(args, kwargs) -> bool`, its source text (for the `guards` log), and
`get_inputs(args, kwargs) -> [tensors]` generated from the same expressions.

What is checked, and why:
- the call's shape (number of positional args, keyword names): the graph's inputs are found
  at fixed positions (a miss on the call's shape alone re-binds the entry, `rebind`: no new
  trace, since Dynamo, which binds arguments before guarding, would not recompile either);
- every tensor input (parameters and buffers too): exact type, dtype, device, sizes, strides,
  requires_grad: the graph was specialized to all of these (static shapes);
- Python scalars, strings, None, dtypes: by value and type (they were baked into the graph;
  1.0 is not 1, -0.0 is not 0.0, a NaN is a NaN: `same_constant`);
- tuples/lists/dicts: type and length/keys (their items are guarded one by one);
- nn.Modules: type, `.training`, and that no forward hooks appeared (forward was inlined);
- globals and closure cells read: identity for functions/modules/classes, value for scalars;
  what the user's code reads of a module, torch's and the standard library's too (`F.relu`,
  `math.sqrt`: a test may patch them; torch's own code reading its modules is trusted);
  a builtin read: that no global of its name hides it; an instance's method: that no
  attribute of the instance hides it;
- grad mode, the default dtype, autocast, TF32 (`global_state`).
Each check is a plain expression, evaluated in order, failing fast. The tensors' checks are
the one exception: a guard's tensors with static shapes are checked together, by ONE call of
TorchDynamo's own C++ `TensorGuards` (type, dispatch keys, dtype, device, sizes, strides,
requires_grad of every tensor), at the end of the guard: a model's parameters and buffers are
graph inputs (modules are guarded by type, never identity), hundreds of tensors for a
ResNet-50, and the same checks as Python expressions cost about three times as much. It is a
private torch API, so where it is missing (or `config.cpp_tensor_guards` is off) each tensor
is checked by Python expressions instead.

Two things keep the fast function cheap on a model of many modules, whose guard reads
thousands of values per call: a module's attributes are read as items of its instance
`__dict__` (`_reads_own_dict`: nn.Module's __getattr__ keeps CPython from specializing
`module.attr`), and its locals are reused once read for the last time (`_name_locals`: few
locals, numbered below 256, so no EXTENDED_ARG). What is checked is the same; the slow twin
below reads each attribute by getattr, as the trace did. benchmarks/host_cost.py times it.

The guard has a twin that also hands on the graph's inputs (`check(F, args, kwargs) -> [inputs]
or None`): it fetched every input to check it, so the hot path runs one function per call.

On a miss (no entry's guard holds) the cache asks each entry *why*: a second generated
function, `guard.fail_reason(args, kwargs)`, runs the same checks one part at a time and returns
the first that fails in TorchDynamo's words (`tensor 'x' size mismatch at index 0. expected 4,
actual 8`, `flag == True`, `G['scale'] == 2.0`, `self.training == True`,
`GLOBAL_STATE changed: grad_mode`), with the user's line that made the trace rely on it. It is
never run on a hit, so the fast path stays one function returning a bool.
"""
from __future__ import annotations

import abc
import functools
import heapq
import importlib.util
import inspect
import math
import os
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import autocast, config, ir
from ..aliasing import storage_address
from .sources import AttrSource, GenericAttrSource, HelperSource, ItemSource, Source
from .values import is_constant_value


try:
    # TorchDynamo's C++ check of many tensors' metadata at once (a private API: where it is
    # missing, each tensor is checked by Python expressions, as config.cpp_tensor_guards=False)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:                      # pragma: no cover
    _TensorGuards = None


def frame_target(fn) -> Tuple[types.FunctionType, tuple, dict]:
    """The Python function a call of `fn` runs, and the arguments `fn` adds in front of the
    caller's: a bound method adds its `self`, a `functools.partial` its arguments, an object
    with a Python `__call__` itself. -> (function, leading args, keyword args); raises
    TypeError for a callable with no Python code (a builtin).

    Callables that share a function (instances of one class, partials of one function) share
    its code object and so one cache of compiled entries; what tells them apart (the `self`,
    the partial's arguments) is passed as an argument, so the entry's guard checks it."""
    pre: tuple = ()
    pre_kw: dict = {}
    for _ in range(32):
        if isinstance(fn, types.FunctionType):
            return fn, pre, pre_kw
        if isinstance(fn, types.MethodType):
            fn, pre = fn.__func__, (fn.__self__,) + pre
        elif isinstance(fn, functools.partial):
            pre_kw = {**fn.keywords, **pre_kw}
            fn, pre = fn.func, tuple(fn.args) + pre
        elif isinstance(fn, torch.nn.Module):
            fn = fn.forward
        elif not isinstance(fn, type) and isinstance(
                getattr(type(fn), "__call__", None), types.FunctionType):
            fn, pre = type(fn).__call__, (fn,) + pre
        else:
            break
    raise TypeError(f"{type(fn).__name__} {fn!r} has no Python code to trace")


@dataclass
class ArgBinding:
    """How the captured frame's parameters are found in (F, args, kwargs) for one call shape.
    `F` is the function the call runs: its defaults, closure cells and globals are read from
    it on every call, never from the function that was traced."""
    nargs: int                        # number of positional args passed
    kwnames: Tuple[str, ...]          # keyword names passed (sorted)
    exprs: Dict[str, str]             # parameter name -> expression over args/kwargs/F

    def prologue(self, freevars: Dict[str, int], indent: str = "    ") -> List[str]:
        """`L`: the frame's parameters and the free variables the trace read (a closure's
        cells, as Dynamo's `L['k']`); `G`: the function's globals."""
        exprs = dict(self.exprs)
        exprs.update({name: f"F.__closure__[{i}].cell_contents" for name, i in freevars.items()})
        items = ", ".join(f"{k!r}: {v}" for k, v in exprs.items())
        return [f"{indent}L = {{{items}}}", f"{indent}G = F.__globals__"]


def code_signature(func: types.FunctionType) -> inspect.Signature:
    """The parameters a call of the plain function `func` binds: its code's (with its defaults),
    not a `__signature__` set on it, which inspect reports instead (decorator libraries set one:
    tensordict's dispatch, tensorly's backends), nor a wrapped function's (functools.wraps)."""
    if "__signature__" not in getattr(func, "__dict__", ()):
        return inspect.signature(func, follow_wrapped=False)
    plain = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__, func.__closure__)
    plain.__kwdefaults__ = func.__kwdefaults__
    return inspect.signature(plain, follow_wrapped=False)


def bind_arguments(func: types.FunctionType, args: tuple, kwargs: dict
                   ) -> Tuple[ArgBinding, Dict[str, Any]]:
    """Bind a call of the plain function `func` the way CPython would.

    Returns the binding (expressions for later calls) and the parameter values of this call.
    Raises TypeError like the call itself would."""
    code = func.__code__
    pos_names = list(code.co_varnames[:code.co_argcount])
    kwonly = list(code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount])
    i = code.co_argcount + code.co_kwonlyargcount
    varargs = code.co_varnames[i] if code.co_flags & inspect.CO_VARARGS else None
    if varargs:
        i += 1
    varkw = code.co_varnames[i] if code.co_flags & inspect.CO_VARKEYWORDS else None

    sig = code_signature(func)
    bound = sig.bind(*args, **kwargs)            # TypeError exactly as the call would raise
    bound.apply_defaults()
    values = {("." + k[8:] if k.startswith("implicit") and "." + k[8:] in code.co_varnames else k): v
              for k, v in bound.arguments.items()}     # inspect renames a comprehension's .0

    exprs: Dict[str, str] = {}
    first_default = len(pos_names) - len(func.__defaults__ or ())
    for j, name in enumerate(pos_names):
        if j < len(args):
            exprs[name] = f"args[{j}]"
        elif name in kwargs:
            exprs[name] = f"kwargs[{name!r}]"
        else:
            exprs[name] = f"F.__defaults__[{j - first_default}]"
    if varargs:
        exprs[varargs] = f"args[{len(pos_names)}:]"
    for name in kwonly:
        exprs[name] = f"kwargs[{name!r}]" if name in kwargs else f"F.__kwdefaults__[{name!r}]"
    if varkw:
        # in the order the caller passed them (a loop over **kwargs sees that order); which
        # names and in what order is guarded where the trace reads the dict
        named = set(pos_names[code.co_posonlyargcount:]) | set(kwonly)
        exprs[varkw] = (f"{{k: v for k, v in kwargs.items() if k not in {sorted(named)!r}}}"
                        if named else "dict(kwargs)")
    return ArgBinding(len(args), tuple(sorted(kwargs)), exprs), values


def remaining_items(iterator) -> list:
    """What an iterator has left, read from a copy of it (sources.HelperSource)."""
    import copy
    return list(copy.copy(iterator))


def viewed_dict(view) -> dict:
    """The dict a keys(), values() or items() view shows (its `.mapping` is a read-only proxy
    of it, whose one reference is the dict)."""
    import gc
    return gc.get_referents(view.mapping)[0]


_DATA_PTR, _STORAGE_OFFSET = torch.Tensor.data_ptr, torch.Tensor.storage_offset


def same_constant(value, expected) -> bool:
    """value == expected, with the same types all through: the trace specialized on both
    (1.0 is not 1 nor True, -0.0 is not 0.0, a NaN is the NaN it was), and a tensor where a
    number was is a miss, not a tensor's truth."""
    if type(value) is not type(expected):
        return False
    if isinstance(expected, (tuple, list)):
        return len(value) == len(expected) and all(map(same_constant, value, expected))
    if isinstance(expected, (set, frozenset)):
        return len(value) == len(expected) and all(any(same_constant(v, x) for v in value) for x in expected)
    if isinstance(expected, float):
        return same_float(value, expected)
    if isinstance(expected, complex):
        return same_float(value.real, expected.real) and same_float(value.imag, expected.imag)
    return value == expected


def same_float(value: float, expected: float) -> bool:
    if expected != expected:
        return value != value
    return value == expected and (expected != 0.0 or math.copysign(1.0, value) == math.copysign(1.0, expected))


def storage_pattern(*tensors) -> tuple:
    """For each tensor, the position of the first one that shares its memory."""
    # run per call over every tensor input (a model's parameters too): the addresses are read
    # by map, with no Python frame per tensor, and the usual answer, no memory shared, is
    # found by one set. A storage begins storage_offset elements before the tensor's data
    # (untyped_storage() would make a Python object per tensor, a microsecond each on a GPU).
    try:
        ptrs = list(map(_DATA_PTR, tensors))
        offsets = list(map(_STORAGE_OFFSET, tensors))
    except Exception:                    # noqa: BLE001 (a tensor without storage)
        ptrs = [storage_address(t) for t in tensors]
    else:
        if any(offsets):
            ptrs = [p - o * t.element_size() if o else p for p, o, t in zip(ptrs, offsets, tensors)]
    if len(set(ptrs)) == len(ptrs):
        return tuple(range(len(ptrs)))
    return _first_positions(ptrs)


def object_pattern(*values) -> tuple:
    """For each value, the position of the first one that is the same object."""
    return _first_positions(map(id, values))


def _first_positions(keys) -> tuple:
    """For each key, the position of its first occurrence."""
    first: dict = {}
    return tuple(first.setdefault(k, i) for i, k in enumerate(keys))


# how the generated code writes a local before it is named: \x01<n>\x01 (no repr() in the code
# can hold a control character)
LOCAL = "\x01"
_LOCAL_RE = re.compile("\x01([0-9]+)\x01")


def _name_locals(lines: List[str], reuse: bool) -> List[str]:
    """The generated lines with their locals named. Without `reuse`, local n is `vn`. With it
    (the fast functions), a value read only on the lines that follow takes a `v` name that is
    free again after its last read, and a value read on the last line (the tensors of the C++
    check, the graph's inputs) a `t` name of its own.

    Why: CPython numbers a function's locals in order of first use, and each read or write of
    one numbered past 255 takes one more instruction (EXTENDED_ARG). A ResNet-50's guard
    fetches thousands of values: a name for each put most reads and writes past 255 (a fifth
    of the function's instructions were EXTENDED_ARG). Reused, the short-lived values need
    about a dozen names, numbered first; only the last `t` names go past 255."""
    if not reuse:
        return [_LOCAL_RE.sub(r"v\1", line) for line in lines]
    code = [i for i, line in enumerate(lines) if not line.lstrip().startswith("#")]
    last_read: Dict[str, int] = {}       # comments name locals too, but read none
    for i in code:
        for n in _LOCAL_RE.findall(lines[i]):
            last_read[n] = i
    names: Dict[str, str] = {}
    free: List[int] = []                  # v names free again, the lowest first
    n_v = n_t = 0
    out = []
    for i, line in enumerate(lines):
        found = _LOCAL_RE.findall(line)
        for n in found:
            if n in names:
                continue
            if last_read[n] == code[-1]:
                names[n], n_t = f"t{n_t}", n_t + 1
            elif free:
                names[n] = f"v{heapq.heappop(free)}"
            else:
                names[n], n_v = f"v{n_v}", n_v + 1
        out.append(_LOCAL_RE.sub(lambda m: names[m.group(1)], line))
        for n in set(found):
            if last_read[n] == i and names[n][0] == "v":
                heapq.heappush(free, int(names[n][1:]))
    return out


def _plain_key(key) -> bool:
    """A constant key its repr writes as Python (not an Enum member, a NaN or an infinity)."""
    if type(key) is tuple:
        return all(_plain_key(k) for k in key)
    return type(key) in (str, int, bool, bytes, type(None)) or type(key) is float and math.isfinite(key)


def _literal(value, ns: Dict[str, Any]) -> str:
    """A Python expression for `value` inside the guard: its repr when that round-trips,
    else a name bound in the guard's namespace."""
    r = repr(value)
    try:
        if eval(r, {"torch": torch}) == value and type(eval(r, {"torch": torch})) is type(value):
            return r
    except Exception:
        pass
    name = f"CONST_{len(ns)}"
    ns[name] = value
    return name


# torch's own (c10 ScalarType) names, which Dynamo's tensor guard prints: Float, Half, ...
_SCALAR_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
                 torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
                 torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
                 torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}


def _scalar_name(dtype) -> str:
    return _SCALAR_NAMES.get(dtype, str(dtype))


def display(expr: str) -> str:
    """A source as Dynamo's guard failure reasons spell it on torch 2.13: locals by their own
    name (`L['x']` -> `x`, `L['self'].training` -> `self.training`), globals as `G['name']`."""
    return re.sub(r"^L\[(['\"])([A-Za-z_][A-Za-z0-9_]*)\1\]", r"\2", expr)


def dense_strides_expr(t: torch.Tensor, dynamic: set, e: str) -> str:
    """The Python expression of t's strides over the sizes of `e` (the tensor in the guard):
    a dynamic dim's size is read, a static one is a literal. t is laid out as ir.gapped_layout
    reads it (dense in some order of its dims, whole gaps allowed: a split's piece)."""
    order, gaps = ir.gapped_layout(t.shape, t.stride())
    strides = [""] * t.dim()
    inner: List[str] = []
    for d in reversed(order):
        # a dim of size 1 is never stepped over: any stride will do (PyTorch's own, a product
        # of the other sizes, changes with them)
        gap = [str(gaps[d])] if gaps[d] != 1 else []
        strides[d] = "*".join(gap + inner) or "1" if t.size(d) != 1 else f"{e}.stride({d})"
        inner = gap + inner + [f"{e}.size({d})" if d in dynamic else str(t.size(d))]
    return "(" + ", ".join(strides) + ("," if len(strides) == 1 else "") + ")"


def tensor_failure(v, name, ty, dtype, device, sizes, strides, requires_grad) -> Optional[str]:
    """Why tensor `v` fails the guard of a tensor seen with this metadata, in Dynamo's words
    and in Dynamo's order (TensorCheck::check_verbose): type, dtype, device, requires_grad,
    rank, then the sizes, then the strides, dimension by dimension. None if it passes."""
    if not isinstance(v, torch.Tensor):
        return f"expected type of '{name}' to be a tensor type, ' but found {type(v)}"
    if type(v) is not ty:
        return f"tensor '{name}' type mismatch. expected {ty.__name__}, actual {type(v).__name__}"
    if v.dtype != dtype:
        return (f"tensor '{name}' dtype mismatch. expected {_scalar_name(dtype)}, "
                f"actual {_scalar_name(v.dtype)}")
    if v.device != device:
        return f"tensor '{name}' device mismatch. expected {device}, actual {v.device}"
    if v.requires_grad is not requires_grad:
        return f"tensor '{name}' requires_grad mismatch. expected requires_grad={int(requires_grad)}"
    if v.dim() != len(sizes):
        return f"tensor '{name}' rank mismatch. expected {len(sizes)}, actual {v.dim()}"
    actual_sizes, actual_strides = v.shape, v.stride()
    for i in range(len(sizes)):
        if sizes[i] is None:                 # a dynamic dim: any size but 0 and 1
            if actual_sizes[i] < 2:
                return f"2 <= {name}.size()[{i}]  (a dynamic dim; sizes 0 and 1 are specialized)"
            continue
        if actual_sizes[i] != sizes[i]:
            return (f"tensor '{name}' size mismatch at index {i}. expected {sizes[i]}, "
                    f"actual {actual_sizes[i]}")
    for i in range(len(sizes)):              # (every size first: a new length is no layout)
        if sizes[i] is not None and actual_strides[i] != strides[i]:
            return (f"tensor '{name}' stride mismatch at index {i}. expected {strides[i]}, "
                    f"actual {actual_strides[i]}")
    return None


@dataclass
class Check:
    """One guarded fact. `parts`: (condition over {e}, reason if it is False), tested in order;
    the fast guard joins the conditions with `and`. `slow`: a call over {e} that returns the
    reason (or None), used by the failure function instead of `parts` (tensors)."""
    source: Optional[Source]
    parts: List[Tuple[str, str]]
    comment: str
    slow: Optional[str] = None
    where: Optional[list] = None          # the user's stack when the trace relied on it
    refresh: Optional[Callable] = None    # rewrites parts/slow when the guard is built
    others: List[Source] = field(default_factory=list)   # further sources, {e1}, {e2}...
    tensor: Optional[torch.Tensor] = None  # a static tensor check: what the C++ check copies


def default_namespace() -> Dict[str, Any]:
    """What every guard's namespace holds before the trace adds to it."""
    # (math: PyTorch's printer writes a size computed through a float as math.trunc(...))
    return {"torch": torch, "math": math, "Tensor": torch.Tensor, "Parameter": torch.nn.Parameter,
            "TENSOR_FAILURE": tensor_failure, "REMAINING": remaining_items, "VIEWED_DICT": viewed_dict,
            "DEREF": lambda ref: ref(), "SYS_MODULES": sys.modules, "FIND_SPEC": importlib.util.find_spec}


class GuardBuilder:
    def __init__(self):
        self.checks: List[Check] = []
        self._seen = set()
        self._by_key: Dict[Any, Check] = {}
        # free variables of the captured frame the trace read: name -> index in __closure__
        self.freevars: Dict[str, int] = {}
        self.namespace: Dict[str, Any] = default_namespace()
        self._cpp_guards = None          # (the checks it covers, their C++ TensorGuards)
        # module source -> (its class, the names in its instance __dict__) when the trace read
        # it: the fast guard reads these names from the __dict__ (see _reads_own_dict)
        self._module_dicts: Dict[str, Tuple[type, frozenset]] = {}

    def _add(self, key, source: Optional[Source], parts, comment: str = "", slow=None,
             stack: bool = True, others=()):
        if key in self._seen:
            return
        self._seen.add(key)
        if isinstance(parts, str):
            parts = [(parts, "")]
        self.checks.append(Check(source, list(parts), comment, slow,
                                 self._user_stack() if stack else None, others=list(others)))
        self._by_key[key] = self.checks[-1]

    def mark(self) -> int:
        return len(self.checks)

    def drop_since(self, mark: int) -> None:
        """Forget the facts found after `mark` by an instruction the trace then gave up (a graph
        break there: the instruction runs as Python, and the graph relies on nothing it read),
        but those of graph inputs it added (a placeholder stays) and conditions between sizes."""
        kept = {id(c) for c in self.checks[:mark]}
        for key, check in list(self._by_key.items()):
            if id(check) in kept or check.tensor is not None or check.slow is not None \
                    or check.refresh is not None or key[0] == "shape":
                kept.add(id(check))
            else:
                del self._by_key[key]
                self._seen.discard(key)
        self.checks = [c for c in self.checks if id(c) in kept]

    def _user_stack(self):
        """The user's frames at the instruction the tracer is running (for the `# line` part
        of a failure reason). The tracer owns this builder as `output.guards`, and its
        `output.tx` is the frame being traced; found by walking up the Python stack, at trace
        time only."""
        try:
            f = sys._getframe(1)
            for _ in range(20):
                if f is None:
                    return None
                owner = f.f_locals.get("self")
                if owner is not None and getattr(owner, "guards", None) is self:
                    tx = getattr(owner, "tx", None)
                    return tx.full_stack() if tx is not None else None
                f = f.f_back
        except Exception:
            pass
        return None

    def _ref(self, obj, prefix: str) -> str:
        for k, v in self.namespace.items():
            if k.startswith(prefix) and v is obj:
                return k
        name = f"{prefix}{sum(k.startswith(prefix) for k in self.namespace)}"
        self.namespace[name] = obj
        return name

    def _class_dict(self, cls: type) -> str:
        """A name in the guard's namespace for `cls.__dict__`, read once: a read-only view
        of the class's own dict, which shows later changes to the class (reading
        `cls.__dict__` in the guard would make a new view on every call)."""
        name = "VARS_" + self._ref(cls, "CLS_")
        self.namespace.setdefault(name, cls.__dict__)
        return name

    def _mro_unchanged(self, cls: type) -> tuple:
        """The check that cls's bases are still the classes the trace found (a part of a check)."""
        classes = "".join(f"{self._ref(k, 'CLS_')}, " for k in cls.__mro__)
        return (f"{self._ref(cls, 'CLS_')}.__mro__ == ({classes})", f"{cls.__qualname__}'s bases were changed")

    def add_root(self, label: str, obj):
        self.namespace[label] = obj

    # --- one method per kind of check -------------------------------------------------
    def tensor(self, source: Source, t: torch.Tensor, dynamic: Optional[set] = None):
        """`dynamic`: the dims the graph is generic in (the capture's own set: a dim it later
        specializes leaves it, so the check is written when the guard is built)."""
        if dynamic is not None:
            self._add(("tensor", source.expr()), source, [], "", stack=False)
            check = self._by_key[("tensor", source.expr())]
            check.refresh = lambda: self._tensor_check(check, source, t, dynamic)
            return
        self._tensor_check(None, source, t, set())

    def _tensor_check(self, check: Optional[Check], source: Source, t: torch.Tensor, dynamic: set):
        e = source.expr()
        if type(t) is torch.Tensor:
            ty = "Tensor"
        elif type(t) is torch.nn.Parameter:
            ty = "Parameter"
        else:
            ty = self._ref(type(t), "TYPE_")
        dev = self._ref(t.device, "DEVICE_") if t.device.type != "cpu" else "DEVICE_cpu"
        self.namespace.setdefault("DEVICE_cpu", torch.device("cpu"))
        # the dtype as a name in the guard's namespace (`is`: dtypes are singletons), and
        # `.is_cpu` rather than a device comparison: the cheapest spellings of the same checks
        dt = str(t.dtype).replace(".", "_")
        self.namespace[dt] = t.dtype
        on_dev = "{e}.is_cpu" if t.device.type == "cpu" else f"{{e}}.device == {dev}"
        comment = f"{e}: tensor type, dtype, device, sizes, strides, requires_grad"
        if not dynamic:
            sizes, strides = tuple(t.shape), tuple(t.stride())
            shape_test = f"{{e}}.shape == {sizes} and {{e}}.stride() == {strides}"
        else:
            # dynamic dims: any size >= 2 (0 and 1 are specialized, as TorchDynamo does);
            # static dims by value; strides those of the same dense layout at these sizes
            sizes = tuple(None if d in dynamic else n for d, n in enumerate(t.shape))
            strides = dense_strides_expr(t, dynamic, "{e}")
            shape_test = " and ".join([f"{{e}}.dim() == {t.dim()}"]
                                      + [f"{{e}}.size({d}) >= 2" if n is None else f"{{e}}.size({d}) == {n}"
                                         for d, n in enumerate(sizes)] + [f"{{e}}.stride() == {strides}"])
            comment += f" (dims {sorted(dynamic)} dynamic)"
        expr = (f"type({{e}}) is {ty} and {{e}}.dtype is {dt} and {on_dev} "
                f"and {shape_test} and {{e}}.requires_grad is {t.requires_grad}")
        slow = (f"TENSOR_FAILURE({{e}}, {display(e)!r}, {ty}, {t.dtype}, {dev}, {sizes}, "
                f"{strides}, {t.requires_grad})")
        if check is None:
            if ("tensor", e) in self._seen:
                return
            self._add(("tensor", e), source, expr, comment, slow, stack=False)
            check = self._by_key[("tensor", e)]
        check.parts, check.slow, check.comment = [(expr, "")], slow, comment
        check.tensor = None if dynamic else t

    def dynamic_number(self, source: Source, value, dynamic: set):
        """An int or float graph input: any of its type while the graph is generic in it
        (`dynamic` non-empty), its value once the trace specialized it."""
        e = source.expr()
        self._add(("const", e), source, [], "", stack=False)
        check = self._by_key[("const", e)]
        d = display(e)

        def refresh():
            kind = type(value).__name__
            if dynamic:
                # any value (as in TorchDynamo); the backend adds `>= 2` if it used an int as a size
                check.parts = [(f"type({{e}}) is {kind}", f"type({d}) is {kind}")]
                if kind == "int":        # (the kernels take int64: a larger one is static, api's policy)
                    check.parts.append((f"{ir.INT64_MIN} <= {{e}} <= {ir.INT64_MAX}", f"{d} fits in int64"))
                check.comment = f"{e}: a {kind} graph input (dynamic)"
            else:
                check.parts = [(f"type({{e}}) is {kind}", f"type({d}) is {kind}"), self._equals(value, d)]
                check.comment = f"{e}: a {kind} graph input, specialized by value"
        check.refresh = refresh
        refresh()

    def shape_condition(self, condition: str, text: str):
        """A condition between sizes that the compiled code relies on (from the backend's
        shape environment: two dynamic sizes that must be equal, say), over sources."""
        self._add(("shape", condition), None, [(condition, text)], f"sizes: {text}", stack=False)

    def constant(self, source: Source, value):
        e = source.expr()
        if isinstance(source, AttrSource) and source.attr == "training" and \
                ("training", source.base.expr()) in self._by_key:
            # a module's `training` is already checked (module()); this read is the line a
            # failure should point to (`if self.training:`), as in Dynamo's reason
            check = self._by_key[("training", source.base.expr())]
            if not getattr(check, "read", False):
                check.where, check.read = self._user_stack(), True
            return
        d = display(e)
        if value is None or isinstance(value, bool):
            # Dynamo: `flag == True` (an ID_MATCH on the singleton, printed as ==)
            parts = [(f"{{e}} is {value}", f"{d} is None" if value is None else f"{d} == {value}")]
        else:
            tn = self._type_name(type(value))
            parts = [(f"type({{e}}) is {tn}", f"type({d}) is {type(value).__name__}"), self._equals(value, d)]
        self._add(("const", e), source, parts, f"{e}: constant, specialized by value")

    def _equals(self, value, d: str) -> tuple:
        """The check that a value of value's type (checked before) is value: by == where
        that is exact, else by same_constant (a container's items, a zero's sign, a NaN)."""
        if type(value) in (int, str, bytes) or (type(value) is float and value == value and value != 0.0):
            return (f"{{e}} == {_literal(value, self.namespace)}", f"{d} == {value!r}")
        self.namespace["SAME_CONSTANT"] = same_constant
        return (f"SAME_CONSTANT({{e}}, {_literal(value, self.namespace)})", f"{d} == {value!r}")

    def _type_name(self, ty) -> str:
        if ty in (int, float, str, tuple, list, dict, complex):
            return ty.__name__
        if ty is torch.Size:
            return "torch.Size"
        return self._ref(ty, "TYPE_")

    def sequence(self, source: Source, value):
        e = source.expr()
        d = display(e)
        self._add(("seq", e), source,
                  [(f"type({{e}}) is {self._type_name(type(value))}", f"type({d}) is {type(value).__name__}"),
                   (f"len({{e}}) == {len(value)}", f"len({d}) == {len(value)}")],
                  f"{e}: container type and length (items guarded one by one)")

    def _keys_expr(self, keys: list) -> str:
        """A dict's keys, in order, as the guard compares them: written as Python where each
        key's repr is, else the list held in the namespace (classes, typing forms, Enum members)."""
        return repr(keys) if all(_plain_key(k) for k in keys) else self._ref(keys, "KEYS_")

    def set_items(self, source: Source, value):
        """A set read from outside the frame and iterated: its items in the order it iterates
        them (where hashes collide, a set's order hangs on its history, not only on its items)."""
        e = source.expr()
        d = display(e)
        items = list(value)
        self._add(("set", e), source,
                  [(f"type({{e}}) is {self._type_name(type(value))}", f"type({d}) is {type(value).__name__}"),
                   (f"list({{e}}) == {self._keys_expr(items)}", f"list({d}) == {items!r}")],
                  f"{e}: set items, in the order it iterates them")

    def dict_keys(self, source: Source, value: dict):
        e = source.expr()
        d = display(e)
        keys = list(value.keys())
        expected = self._keys_expr(keys)
        check = f"list({{e}}.keys()) == {expected}"
        if any(type(k) is not str and is_constant_value(k) for k in keys):
            self.namespace["SAME_CONSTANT"] = same_constant      # (1.0 is the key 1 too)
            check = f"SAME_CONSTANT(list({{e}}.keys()), {expected})"
        self._add(("dict", e), source,
                  [(f"type({{e}}) is {self._type_name(type(value))}", f"type({d}) is {type(value).__name__}"),
                   (check, f"list({d}.keys()) == {keys!r}")],
                  f"{e}: dict type and keys")

    def module_walk(self, source: Source, call: str, names: list):
        """The names a walk over a module's tree gives (`named_modules()`, `named_parameters()`):
        the tree's shape, which modules are shared, and which members it holds, in order."""
        e = source.expr()
        self._add(("walk", e, call), source,
                  [(f"[n for n, _ in {{e}}.{call}] == {names!r}",
                    f"[n for n, _ in {display(e)}.{call}] == {names!r}")],
                  f"{e}.{call}: the names it walks")

    def mapping_keys(self, source: Source, value):
        """The keys of a mapping (a dict subclass such as a ModelOutput), in order."""
        e = source.expr()
        keys = list(value.keys())
        expected = self._keys_expr(keys)
        self._add(("keys", e), source,
                  [(f"list({{e}}.keys()) == {expected}", f"list({display(e)}.keys()) == {keys!r}")],
                  f"{e}: its keys")

    def state_equals(self, source: Source, state: dict):
        """An object's whole state (its __dict__) equals what the trace copied it from."""
        e = source.expr()
        ref = self._ref(state, "STATE_")
        self._add(("state", e), source,
                  [(f"{{e}}.__dict__ == {ref}", f"{display(e)} changed since it was copied in the trace")],
                  f"{e}: its state, as copied in the trace")

    def has_key(self, source: Source, key, present: bool):
        """Whether a mapping has this key (what it holds under it is guarded on its own)."""
        e = source.expr()
        k = _literal(key, self.namespace)
        self._add(("has_key", e, repr(key)), source,
                  [(f"({k} in {{e}}) is {present}", f"({key!r} in {display(e)}) == {present}")],
                  f"{e}: {'has' if present else 'has no'} key {key!r}")

    def type_check(self, source: Source, ty):
        e = source.expr()
        self._add(("type", e), source,
                  [(f"type({{e}}) is {self._ref(ty, 'TYPE_')}", f"type({display(e)}) is {ty.__qualname__}")],
                  f"{e}: type")

    def identity(self, source: Source, obj, what: str = "object"):
        e = source.expr()
        # (a module's name from its dict: getattr would run its __getattr__ for __qualname__)
        label = obj.__dict__.get("__name__") if isinstance(obj, types.ModuleType) else \
            getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
        label = label or what
        self._add(("id", e), source,
                  [(f"{{e}} is {self._ref(obj, 'OBJ_')}", f"{display(e)} is {label} (identity)")],
                  f"{e}: {what}, identity")

    def class_member(self, cls: type, name: str, value):
        """The code the trace ran for cls's `name` (a method, a property, __init__) is still
        what the class has: found on the same class of its MRO (no class before it has one
        now), and the same object there. Rebinding a method of a class changes every instance,
        which their type checks do not see."""
        mro = cls.__mro__
        owner = next(k for k in mro if name in k.__dict__)
        parts = [self._mro_unchanged(cls)]
        parts += [(f"{name!r} not in {self._class_dict(k)}", f"{k.__qualname__}.{name} was added")
                  for k in mro[:mro.index(owner)]]
        parts.append((f"{self._class_dict(owner)}.get({name!r}) is {self._ref(value, 'OBJ_')}",
                      f"{owner.__qualname__}.{name} was rebound"))
        self._add(("member", id(cls), name), None, parts, f"{cls.__qualname__}.{name}: as traced")

    def module(self, source: Source, mod: torch.nn.Module):
        """A module the trace read: its type and `training`, never its identity.
        What the trace read from it (parameters, buffers, attributes, submodules) is guarded
        through its source, so every instance of a class passes (one compile serves all the
        layers of a model, as Dynamo's inlining of modules); where the trace did depend on
        identity (`is`, `id()`), that is guarded where it happened."""
        e = source.expr()
        self.type_check(source, type(mod))
        self._module_dicts.setdefault(e, (type(mod), frozenset(vars(mod))))
        self._add(("training", e), source,
                  [("{e1} is %s" % mod.training, f"{display(e)}.training == {mod.training}")],
                  f"{e}.training", others=[AttrSource(source, "training")])

    def forward_hooks(self, source: Source, mod: torch.nn.Module):
        """A module whose forward the trace inlined: the forward hooks it ran around it, which
        the module has still (the same keys, in order, each with or without kwargs; each hook
        is guarded where the trace read it), or none, and none global or for the backward.
        (A frame's own `self` may have hooks: its hooks ran around the compiled forward, as
        Python.)"""
        e = source.expr()
        d = display(e)
        backward = [AttrSource(source, "_backward_hooks"), AttrSource(source, "_backward_pre_hooks")]
        if mod._forward_hooks or mod._forward_pre_hooks:
            for name in ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
                         "_forward_hooks_with_kwargs"):
                self.mapping_keys(AttrSource(source, name), getattr(mod, name))
            self._add(("hooks", e), source,
                      [("not ({e1} or {e2})", f"{d} has backward hooks now (its forward was inlined)")],
                      f"{e}: forward was inlined with its hooks, and it has no backward hooks",
                      others=backward)
        else:
            self._add(("hooks", e), source,
                      [("not ({e1} or {e2} or {e3} or {e4})",
                        f"{d} has hooks now (its forward was inlined without them)")],
                      f"{e}: forward was inlined, so no hooks",
                      others=[AttrSource(source, "_forward_hooks"), AttrSource(source, "_forward_pre_hooks")] + backward)
        self.namespace["HOOKS"] = torch.nn.modules.module
        self._add(("global_hooks",), None,
                  [("not (HOOKS._global_forward_hooks or HOOKS._global_forward_pre_hooks or "
                    "HOOKS._global_backward_hooks or HOOKS._global_backward_pre_hooks)",
                    "global module hooks were registered")],
                  "no global module hooks", stack=False)

    def class_forward(self, source: Source):
        """The module's forward was found on its class: no instance attribute hides it."""
        e = source.expr()
        self._add(("class_forward", e), source,
                  [("'forward' not in {e1}", f"{display(e)}.forward was replaced on the instance")],
                  f"{e}: forward is its class's", others=[AttrSource(source, "__dict__")])

    def same_object(self, a: Source, b: Source, same: bool):
        """The trace relied on whether two values are one object (`a is b`, `a == b` of modules)."""
        ea, eb = a.expr(), b.expr()
        self._add(("same", ea, eb), a,
                  [(f"({{e}} is {{e1}}) is {same}",
                    f"({display(ea)} is {display(eb)}) == {same}")],
                  f"{ea} is {'' if same else 'not '}{eb}", others=[b])

    def lacks_attr(self, source: Source, name: str):
        """The object has no attribute `name`, in its own dict or on its class (read without
        running its class's __getattr__, which the trace ran for the missing name)."""
        e = source.expr()
        self._add(("lacks", e, name), source,
                  [(f"{name!r} not in object.__getattribute__({{e}}, '__dict__') and "
                    f"not hasattr(type({{e}}), {name!r})", f"{display(e)} has an attribute {name!r} now")],
                  f"{e}: no attribute {name!r} of its own")

    def cache_kept(self, cached, args: tuple, kwargs: dict, result):
        """The trace took a cached function's result. The cache drops it at cache_clear(), or
        (lru_cache's bounded one) after calls with other arguments, and eager's call would then
        run the function again, effects and all: the check makes the call eager makes (a look-up
        while the entry is there), and holds while it gives back the very object the trace took.
        (Counting the cache's misses would not see a cache_clear() followed by as many calls.)"""
        ref = self._ref(cached, "CACHED_")
        call, returned = self._ref((args, kwargs), "CALL_"), self._ref(result, "RETURNED_")
        self._add(("cache_call", ref, call), None,
                  [(f"{ref}(*{call}[0], **{call}[1]) is {returned}",
                    f"{cached.__qualname__} was called again (its cache had dropped the entry)")],
                  f"{cached.__qualname__}: called as eager calls it")

    def imported(self, name: str, module):
        """An import the trace made (`import x`, `from x import y` in the function): eager's
        import looks in sys.modules on every call, so the check does too: the module is the one
        the trace bound (not a stub put in its place, mock.patch.dict(sys.modules)), or, where
        the trace found none (`try: import x except ImportError:`), none can be found yet."""
        if module is None:
            self._add(("import", name), None,
                      [(f"{name!r} not in SYS_MODULES and FIND_SPEC({name!r}) is None",
                        f"module {name} can be imported now")], f"import {name}: no such module")
            return
        self._add(("import", name), None,
                  [(f"SYS_MODULES.get({name!r}) is {self._ref(module, 'MODULE_')}", f"sys.modules[{name!r}] was replaced")],
                  f"import {name}: the module imported")

    def abc_answer(self, cls: type, base: abc.ABCMeta):
        """issubclass(cls, base) of an ABC (numbers.Number, a plugin base), which isinstance
        of a cls object asks too, answered by the trace: the same answer (ABC.register may
        change it; asked again, it comes from the ABC's cache)."""
        answer = issubclass(cls, base)
        c, b = self._ref(cls, "CLS_"), self._ref(base, "CLS_")
        self._add(("abc", id(cls), id(base)), None,
                  [(f"issubclass({c}, {b}) is {answer}", f"issubclass({cls.__qualname__}, {base.__qualname__}) "
                                                          f"is {not answer} now (ABC.register)")],
                  f"{cls.__qualname__} is {'' if answer else 'not '}a {base.__qualname__}")

    def class_lacks(self, cls: type, name: str, metaclass: bool = True):
        """No class of cls's MRO, nor (metaclass) its metaclass, has `name` (a metaclass's
        __getattr__ served it; an instance is not callable): a base given that attribute later
        hides the __getattr__, or makes the instances callable."""
        mro = cls.__mro__
        parts = [self._mro_unchanged(cls)]
        parts += [(f"{name!r} not in {self._class_dict(k)}", f"{k.__qualname__}.{name} was added") for k in mro]
        if metaclass:
            parts.append((f"not hasattr({self._ref(type(cls), 'CLS_')}, {name!r})",
                          f"{type(cls).__qualname__}.{name} was added"))
        self._add(("class_lacks", id(cls), name, metaclass), None, parts, f"{cls.__qualname__}: no attribute {name!r}")

    def module_getattr(self, module, name: str, hook):
        """`module.name` is served by the module's own __getattr__ (PEP 562), which the trace
        ran: the module still has that hook and no attribute of that name."""
        m, h = self._ref(module, "MODULE_"), self._ref(hook, "OBJ_")
        self._add(("module_getattr", id(module), name), None,
                  [(f"{m}.__dict__.get('__getattr__') is {h} and {name!r} not in {m}.__dict__",
                    f"{module.__name__}.{name} is an attribute now, or its __getattr__ was replaced")],
                  f"{module.__name__}.{name}: served by its __getattr__")

    def module_lacks(self, source: Source, name: str):
        """The module has no attribute `name`, nor a __getattr__ (PEP 562) that could serve it:
        read from its dict, so that a __getattr__ added later is not run by the guard."""
        e = source.expr()
        self._add(("module_lacks", e, name), source,
                  [(f"{name!r} not in {{e}}.__dict__ and '__getattr__' not in {{e}}.__dict__",
                    f"{display(e)} has an attribute {name!r} or a __getattr__ now")],
                  f"{e}: no attribute {name!r}, no __getattr__")

    def not_own_attr(self, source: Source, name: str, plain: bool):
        """The object has no attribute `name` in its own dict, which would hide its class's
        method. plain: its class reads `__dict__` as object does (no __getattribute__ of its
        own), so the guard may too."""
        e = source.expr()
        own = "{e}.__dict__" if plain else "object.__getattribute__({e}, '__dict__')"
        self._add(("own", e, name), source,
                  [(f"{name!r} not in {own}", f"{display(e)}.{name} was set on the instance")],
                  f"{e}: {name} is its class's")

    def has_attr(self, source: Source, name: str, present: bool):
        """The trace relied on whether an attribute exists (`hasattr`, `getattr` with a default)."""
        e = source.expr()
        self._add(("hasattr", e, name), source,
                  [(f"hasattr({{e}}, {name!r}) is {present}", f"hasattr({display(e)}, {name!r}) == {present}")],
                  f"{e}: has{'' if present else ' no'} attribute {name!r}")

    def storage_pattern(self, sources: List[Source], pattern: tuple):
        """Which of these tensors share memory: as in the trace (the graph writes one of them)."""
        self._pattern("STORAGE_PATTERN", storage_pattern, sources, pattern,
                      "the graph writes an input, and the inputs now share memory differently",
                      "tensor inputs share memory as in the trace (the graph writes one)")

    def object_pattern(self, sources: List[Source], pattern: tuple):
        """Which of these values are one object: as in the trace (tensors it used as dict keys)."""
        self._pattern("OBJECT_PATTERN", object_pattern, sources, pattern,
                      "tensors used as dict keys are now one object where they were two, or two where one",
                      "tensors used as dict keys are one object where they were in the trace")

    def _pattern(self, name: str, fn, sources: List[Source], pattern: tuple, failure: str, comment: str):
        """One check over many sources: fn of their values (named `name` in the guard) is `pattern`."""
        self.namespace[name] = fn
        refs = ", ".join(["{e}"] + [f"{{e{j + 1}}}" for j in range(len(sources) - 1)])
        self._add((name,), sources[0], [(f"{name}({refs}) == {pattern}", failure)], comment,
                  stack=False, others=sources[1:])

    def global_state(self):
        """PyTorch's global state that changes what ops compute: grad mode, inference mode, the default dtype,
        autocast (on which device, to which dtype), and whether float32 matrix products may use TF32 (a template
        kernel decides that as it is compiled), as Dynamo's GLOBAL_STATE guard checks them."""
        # torch's functions under names of the guard's own (one lookup, not `torch.` and then
        # the function in torch's module dict)
        self.namespace.update(GRAD_ENABLED=torch.is_grad_enabled,
                              INFERENCE_MODE=torch.is_inference_mode_enabled,
                              AUTOCAST_ENABLED=torch.is_autocast_enabled,
                              AUTOCAST_DTYPE=torch.get_autocast_dtype,
                              ALLOW_TF32=torch._C._get_cublas_allow_tf32,
                              DEFAULT_DTYPE=torch.get_default_dtype)
        checks = [(f"GRAD_ENABLED() is {torch.is_grad_enabled()}",
                   "GLOBAL_STATE changed: grad_mode"),
                  (f"INFERENCE_MODE() is {torch.is_inference_mode_enabled()}",    # (what it makes)
                   "GLOBAL_STATE changed: inference_mode"),
                  (f"DEFAULT_DTYPE() is {torch.get_default_dtype()}",      # (factories, 2 * int tensor)
                   "GLOBAL_STATE changed: default_dtype"),
                  (f"ALLOW_TF32() is {torch._C._get_cublas_allow_tf32()}",
                   "GLOBAL_STATE changed: torch.backends.cuda.matmul.allow_tf32")]
        # torch.set_default_device's mode (the device of `torch.ones(3)`): the same, or none
        # (a call under another mode runs eagerly: api.py)
        modes = torch.overrides._get_current_function_mode_stack()
        if modes:
            self.namespace.update(FUNCTION_MODES=torch.overrides._get_current_function_mode_stack)
            held = ", ".join(self._ref(m, "MODE_") for m in modes)
            checks.append((f"all(a is b for a, b in zip(FUNCTION_MODES(), ({held},))) and "
                           f"FUNCTION_MODE_COUNT() == {len(modes)}",
                           "GLOBAL_STATE changed: torch function modes (torch.set_default_device)"))
        else:
            checks.append(("FUNCTION_MODE_COUNT() == 0",
                           "GLOBAL_STATE changed: a torch function mode (torch.set_default_device)"))
        self.namespace.update(FUNCTION_MODE_COUNT=torch._C._len_torch_function_stack)
        for device, dtype in zip(autocast.DEVICES, autocast.state()):
            on = f"AUTOCAST_ENABLED({device!r})"
            checks.append((f"not {on}" if dtype is None else
                           f"{on} and AUTOCAST_DTYPE({device!r}) is {dtype}",
                           f"GLOBAL_STATE changed: autocast ({device})"))
        self._add(("grad",), None, checks, "grad mode, autocast", stack=False)

    def _cpp_tensor_checks(self):
        """(one TorchDynamo TensorGuards for every static tensor check, those checks), or None
        where the C++ class is missing, turned off (config.cpp_tensor_guards) or there are no
        such checks. Made once, from the tensors as the trace saw them: a later build (a
        re-bound call shape, the backend's shape guards) reuses it.

        TensorGuards fails when one tensor object is passed twice (TorchDynamo's "duplicate
        tensor"): a tensor the trace found under two sources (tied weights) is checked there
        under the first only, and under the others by Python expressions. A call that then
        passes one tensor where the trace saw two is a miss, as in TorchDynamo."""
        if not config.cpp_tensor_guards or _TensorGuards is None:
            return None
        checks, seen = [], set()
        for c in self.checks:
            if c.tensor is not None and id(c.tensor) not in seen:
                seen.add(id(c.tensor))
                checks.append(c)
        if not checks:
            return None
        key = tuple(id(c) for c in checks)
        if self._cpp_guards is None or self._cpp_guards[0] != key:
            tensors = [c.tensor for c in checks]
            made = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                                 dynamic_dims_strides=[list(t.stride()) for t in tensors])
            self._cpp_guards = (key, made)
        return self._cpp_guards[1], checks

    def _reads_own_dict(self, src: AttrSource) -> bool:
        """Whether the fast guard reads `src` (a module's attribute) as `base.__dict__[attr]`.

        nn.Module defines __getattr__, so CPython cannot specialize attribute reads on a module
        and each `module.attr` takes the generic path, about twice a dict item's time; a
        ResNet-50's guard reads thousands of them. A dict read gives the same
        value where the attribute was in the instance's __dict__ when the trace read it and
        the class (checked by type before: a module source is guarded by type) puts nothing
        in front of that dict: no __getattribute__ of its own and no data descriptor (a
        property) of that name. TorchDynamo reads a module's attributes from its __dict__ too.
        Where the attribute has left the dict since, the read fails and so does the guard (the
        slow twin, reading by getattr, says what changed)."""
        seen = self._module_dicts.get(src.base.expr())
        if seen is None or src.attr not in seen[1]:
            return False
        cls = seen[0]
        if cls.__getattribute__ is not object.__getattribute__:
            return False
        for klass in cls.__mro__:
            if src.attr in klass.__dict__:
                kind = type(klass.__dict__[src.attr])
                return not (hasattr(kind, "__set__") or hasattr(kind, "__delete__"))
        return True

    # --- code generation ---------------------------------------------------------------
    def build(self, binding: ArgBinding, input_exprs: List[str]) -> "GuardCode":
        """The generated functions of one entry, each taking the call as (F, args, kwargs):
        `F` the function it runs (see ArgBinding), `args`/`kwargs` as passed to it.

        `guard(F, args, kwargs) -> bool` is the fast check run on every call. It carries, as
        attributes, its slow twin run only on a miss: `guard.fail_reason(F, args, kwargs)` ->
        the first failing check in words (None if the guard holds), `guard.failure(...)` ->
        (reason, user stack) or None, and `guard.failure_source` (the generated text)."""
        for c in self.checks:
            if c.refresh is not None:
                c.refresh()
        ns = dict(self.namespace)
        kw = repr(binding.kwnames)
        shape_test = (f"len(args) != {binding.nargs} or "
                      + ("kwargs" if not binding.kwnames else f"tuple(sorted(kwargs)) != {kw}"))
        prologue = binding.prologue(self.freevars, "        ")
        slow = ["def guard_failure(F, args, kwargs):",
                "    # run on a cache miss only: (the first check of `guard` that fails, its index)",
                f"    if {shape_test}:",
                f"        return ({'call shape: expected %d positional arguments and keywords %s' % (binding.nargs, kw)!r}"
                " + f', got {len(args)} and {tuple(sorted(kwargs))}', -1)"]
        # Each source's value is fetched once into a local (v0, v1, ...) and shared prefixes
        # (L['self']._modules['fc']) are fetched once too: most of a guard's cost is lookups.
        # A lookup that fails (a module lost an attribute, a function with fewer defaults)
        # means the guard fails.
        slow.append("    at = ''")
        slow.append("    try:")
        slow += prologue
        body: List[str] = []
        names: Dict[str, str] = {}

        own_dict = True              # the fast functions' reads (the slow twin's: False)

        def local(src: Source, out: List[str]) -> str:
            key = src.expr()
            if key in names:
                return names[key]
            if isinstance(src, AttrSource) and own_dict and self._reads_own_dict(src):
                rhs = f"{local(AttrSource(src.base, '__dict__'), out)}[{src.attr!r}]"
            elif isinstance(src, AttrSource):
                rhs = f"{local(src.base, out)}.{src.attr}"
            elif isinstance(src, ItemSource):
                rhs = src.read(local(src.base, out))
            elif isinstance(src, HelperSource):
                rhs = f"{src.helper}({local(src.base, out)})"
            elif isinstance(src, GenericAttrSource):
                rhs = f"object.__getattribute__({local(src.base, out)}, {src.attr!r})"
            else:
                rhs = key                        # L['x'], G, a root label
            names[key] = f"{LOCAL}{len(names)}{LOCAL}"      # named in the end (_name_locals)
            out.append(f"        {names[key]} = {rhs}")
            return names[key]

        def fill(cond: str, c: Check, out: List[str]) -> str:
            cond = cond.replace("{e}", local(c.source, out) if c.source is not None else "")
            for j, other in enumerate(c.others):
                cond = cond.replace(f"{{e{j + 1}}}", local(other, out))
            return cond

        # where a failed check returns: False in `guard`, None in `check` (the same body); a NUL,
        # which no repr() in the body can contain
        FAIL = "\0fail\0"
        batched = self._cpp_tensor_checks()
        in_cpp = {id(c) for c in batched[1]} if batched else set()
        if batched:
            ns["TENSORS"] = batched[0]
            ns["TENSOR_NAMES"] = [display(c.source.expr()) for c in batched[1]]
        for i, c in enumerate(self.checks):
            if id(c) in in_cpp:
                local(c.source, body)            # checked below, with the others, in C++
                continue
            check = " and ".join(fill(cond, c, body) for cond, _ in c.parts)
            body.append(f"        # {c.comment}")
            body.append(f"        if not ({check}): {FAIL}")
        if batched:
            refs = ", ".join(names[c.source.expr()] for c in batched[1])
            body.append(f"        # {len(batched[1])} tensors: type, dispatch keys, dtype, device, sizes, "
                        "strides, requires_grad (one C++ call):")
            for c in batched[1]:
                t = c.tensor
                body.append(f"        #   {names[c.source.expr()]} = {c.source.expr()}: {type(t).__name__} "
                            f"{t.dtype} {t.device} size {tuple(t.shape)} stride {t.stride()} "
                            f"requires_grad={t.requires_grad}")
            body.append(f"        if not TENSORS.check({refs}): {FAIL}")
        # the graph's inputs, read from the locals the checks fetched them into
        inputs = ", ".join(names.get(e) or e for e in input_exprs)
        # the slow twin reads attributes as the trace did: a failure to read one is reported
        # in Python's own words (AttributeError: 'Linear' object has no attribute ...)
        names.clear()
        own_dict = False
        for i, c in enumerate(self.checks):
            if c.source is not None:
                slow.append(f"        at = {c.source.expr()!r}")
            if c.slow is not None:
                slow.append(f"        r = {fill(c.slow, c, slow)}")
                slow.append(f"        if r: return (r, {i})")
            else:
                for cond, text in c.parts:
                    slow.append(f"        if not ({fill(cond, c, slow)}): return ({text!r}, {i})")
        if batched:
            # what only the C++ check sees (its dispatch keys: an inference tensor, a conj view)
            refs = ", ".join(fill("{e}", c, slow) for c in batched[1])
            slow.append(f"        if not TENSORS.check({refs}):")
            slow.append(f"            return (TENSORS.check_verbose({refs}, "
                        "tensor_check_names=TENSOR_NAMES), -1)")
        slow = _name_locals(slow, reuse=False)
        *body, inputs = _name_locals(body + [inputs], reuse=True)
        errors = ["    except (AttributeError, KeyError, IndexError, TypeError, ValueError,",
                  "            ZeroDivisionError):"]

        def function(name: str, fail: str, success: str) -> str:
            lines = [f"def {name}(F, args, kwargs):",
                     "    # v0, v1, ...: reused once read for the last time; t0, t1, ...: read at the end",
                     f"    # call shape: {binding.nargs} positional, keywords {kw}",
                     f"    if {shape_test}: {fail}",
                     "    try:"] + prologue
            lines += [line.replace(FAIL, fail) for line in body]
            lines += [f"        {success}"] + errors + [f"        {fail}"]
            return "\n".join(lines) + "\n"
        guard_src = function("guard", "return False", "return True")
        check_src = function("check", "return None", f"return [{inputs}]")
        slow += ["    except (AttributeError, KeyError, IndexError, TypeError, ValueError,",
                 "            ZeroDivisionError) as err:",
                 "        return (f'{at}: cannot be read now ({type(err).__name__}: {err})', -1)",
                 "    return None"]
        failure_src = "\n".join(slow) + "\n"
        outer = binding.prologue(self.freevars)
        inputs_src = "\n".join(["def get_inputs(F, args, kwargs):"] + outer
                               + [f"    return [{', '.join(input_exprs)}]"]) + "\n"
        # the namespace the templates of the live state and the side effects are read in
        env_src = "\n".join(["def make_env(F, args, kwargs):"] + outer
                            + ["    return {'L': L, 'G': G, 'F': F}"]) + "\n"
        sources = {"check": check_src, "guard": guard_src, "guard_failure": failure_src,
                   "get_inputs": inputs_src, "make_env": env_src}
        code = generated(sources, ns, [c.where for c in self.checks])
        code.guard.rebind = lambda F, args, kwargs: self.rebind(F, args, kwargs, input_exprs)
        code.tensors = [c.tensor for c in batched[1]] if batched else []
        return code

    def rebind(self, func, args: tuple, kwargs: dict, input_exprs: List[str]) -> Optional["GuardCode"]:
        """The same checks for another way of passing the same arguments (`f(x)` and then
        `f(x, True)` or `f(x, flag=True)`): TorchDynamo binds the arguments before its guards
        run, so the call's shape is not part of its guard; minicompile's guard reads arguments
        at fixed positions, so a new call shape gets the entry's checks re-generated for it
        rather than a new trace. None if the arguments do not bind."""
        try:
            binding, _ = bind_arguments(func, tuple(args), dict(kwargs))
        except TypeError:
            return None
        return self.build(binding, input_exprs)


@dataclass
class GuardCode:
    """The generated functions of one entry (see GuardBuilder.build)."""
    guard: Callable                   # (F, args, kwargs) -> bool, with .failure/.fail_reason
    source: str
    get_inputs: Callable              # (F, args, kwargs) -> the graph's inputs
    get_inputs_source: str
    make_env: Callable                # (F, args, kwargs) -> {'L', 'G', 'F'} for templates
    check: Callable                   # (F, args, kwargs) -> the graph's inputs, or None: guard
    # what made them (frame_store.py saves an entry from these): the generated sources by
    # function name, the namespace they run in, each check's user stack, and the tensors the
    # C++ check (the namespace's TENSORS) was made from
    sources: Dict[str, str] = field(default_factory=dict)
    namespace: Dict[str, Any] = field(default_factory=dict)
    where: list = field(default_factory=list)
    tensors: list = field(default_factory=list)


def generated(sources: Dict[str, str], ns: Dict[str, Any], where: list) -> GuardCode:
    """An entry's functions from their generated sources (GuardBuilder.build's, or a saved
    entry's), run in the namespace `ns`. `where`: the user's stack of each check, which the
    failure reason names."""
    def on_first_call(name: str, filename: str) -> Callable:
        """The generated function `name`, compiled when it is first called: the boolean
        guard and the slow twin run only on a miss (or when a reader asks), and a large
        model's take milliseconds to compile, which a first call need not pay."""
        made = None

        def call(*args):
            nonlocal made
            if made is None:
                exec(compile(sources[name], filename, "exec"), ns)
                made = ns[name]
            return made(*args)
        return call
    exec(compile(sources["check"], "<minicompile guard>", "exec"), ns)
    exec(compile(sources["make_env"], "<minicompile env>", "exec"), ns)
    guard = on_first_call("guard", "<minicompile guard>")
    raw = on_first_call("guard_failure", "<minicompile guard_failure>")
    get_inputs = on_first_call("get_inputs", "<minicompile get_inputs>")

    def failure(F, args, kwargs):
        """-> (reason with the user's line, the user's stack as (file, line, code, function))
        or None if the guard holds."""
        hit = raw(F, args, kwargs)
        if hit is None:
            return None
        text, i = hit
        at = where[i] if i >= 0 else None
        if at:
            f, line, code, fn = at[-1]
            text = f"{text:<56} # {code.strip()}  # {os.path.basename(f)}:{line} in {fn}"
        return text, list(at or [])

    def fail_reason(F, args, kwargs):
        """The first check of the guard that fails on this call, in words; None if it holds."""
        hit = failure(F, args, kwargs)
        return None if hit is None else hit[0]

    guard.failure = failure
    guard.fail_reason = fail_reason
    guard.failure_source = sources["guard_failure"]
    return GuardCode(guard, sources["guard"], get_inputs, sources["get_inputs"], ns["make_env"], ns["check"],
                     sources, ns, where)
