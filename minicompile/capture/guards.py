"""Guards: what a capture relied on, generated as ONE Python function.

Takes: during tracing, each value the interpreter read from outside the trace (argument,
global, closure cell, module attribute, parameter) with its Source and the kind of check it
needs; at the end, how the captured frame's arguments were passed (`ArgBinding`). Hands on:
`guard(args, kwargs) -> bool`, its source text (for the `guards` log), and
`get_inputs(args, kwargs) -> [tensors]` generated from the same expressions.

What is checked, and why:
- the call's shape (number of positional args, keyword names): the graph's inputs are found
  at fixed positions;
- every tensor input (parameters and buffers too): exact type, dtype, device, sizes, strides,
  requires_grad: the graph was specialized to all of these (static shapes);
- Python scalars, strings, None, dtypes: by value (they were baked into the graph);
- tuples/lists/dicts: type and length/keys (their items are guarded one by one);
- nn.Modules: identity, `.training`, and that no forward hooks appeared (forward was inlined);
- globals and closure cells read: identity for functions/modules/classes, value for scalars;
- grad mode.
Each check is a plain expression, evaluated in order, failing fast; no helper calls, so the
guard costs a few microseconds.
"""
from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .sources import AttrSource, ItemSource, Source


@dataclass
class ArgBinding:
    """How the captured frame's parameters are found in (args, kwargs) for this call shape."""
    nargs: int                        # number of positional args passed
    kwnames: Tuple[str, ...]          # keyword names passed (sorted)
    exprs: Dict[str, str]             # parameter name -> expression over args/kwargs/D/S
    namespace: Dict[str, Any]         # D (defaults), S (bound self)

    def prologue(self, indent: str = "    ") -> List[str]:
        items = ", ".join(f"{k!r}: {v}" for k, v in self.exprs.items())
        return [f"{indent}L = {{{items}}}"]


def bind_arguments(fn, args: tuple, kwargs: dict) -> Tuple[ArgBinding, Dict[str, Any]]:
    """Bind a call of `fn` (function or bound method) the way CPython would.

    Returns the binding (expressions for later calls) and the parameter values of this call.
    Raises TypeError like the call itself would."""
    func = fn.__func__ if isinstance(fn, types.MethodType) else fn
    self_obj = fn.__self__ if isinstance(fn, types.MethodType) else None
    code = func.__code__
    pos_names = list(code.co_varnames[:code.co_argcount])
    kwonly = list(code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount])
    i = code.co_argcount + code.co_kwonlyargcount
    varargs = code.co_varnames[i] if code.co_flags & inspect.CO_VARARGS else None
    if varargs:
        i += 1
    varkw = code.co_varnames[i] if code.co_flags & inspect.CO_VARKEYWORDS else None

    sig = inspect.signature(func)
    full_args = ((self_obj,) + tuple(args)) if self_obj is not None else tuple(args)
    bound = sig.bind(*full_args, **kwargs)       # TypeError exactly as the call would raise
    bound.apply_defaults()
    values = {("." + k[8:] if k.startswith("implicit") and "." + k[8:] in code.co_varnames else k): v
              for k, v in bound.arguments.items()}     # inspect renames a comprehension's .0

    defaults = {}
    exprs: Dict[str, str] = {}
    offset = 1 if self_obj is not None else 0
    for j, name in enumerate(pos_names):
        if j == 0 and self_obj is not None:
            exprs[name] = "S"
        elif j - offset < len(args):
            exprs[name] = f"args[{j - offset}]"
        elif name in kwargs:
            exprs[name] = f"kwargs[{name!r}]"
        else:
            defaults[name] = values[name]
            exprs[name] = f"D[{name!r}]"
    if varargs:
        exprs[varargs] = f"args[{max(len(pos_names) - offset, 0)}:]"
    for name in kwonly:
        if name in kwargs:
            exprs[name] = f"kwargs[{name!r}]"
        else:
            defaults[name] = values[name]
            exprs[name] = f"D[{name!r}]"
    if varkw:
        extra = [k for k in kwargs if k not in pos_names and k not in kwonly]
        exprs[varkw] = "{" + ", ".join(f"{k!r}: kwargs[{k!r}]" for k in extra) + "}"
    binding = ArgBinding(len(args), tuple(sorted(kwargs)), exprs, {"D": defaults, "S": self_obj})
    return binding, values


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


class GuardBuilder:
    def __init__(self):
        # (source or None, expression template over {e} = the source's value, comment)
        self.checks: List[Tuple[Optional[Source], str, str]] = []
        self._seen = set()
        self.namespace: Dict[str, Any] = {"torch": torch, "Tensor": torch.Tensor,
                                          "Parameter": torch.nn.Parameter}

    def _add(self, key, source: Optional[Source], template: str, comment: str = ""):
        if key in self._seen:
            return
        self._seen.add(key)
        self.checks.append((source, template, comment))

    def _ref(self, obj, prefix: str) -> str:
        for k, v in self.namespace.items():
            if k.startswith(prefix) and v is obj:
                return k
        name = f"{prefix}{sum(k.startswith(prefix) for k in self.namespace)}"
        self.namespace[name] = obj
        return name

    def add_root(self, label: str, obj):
        self.namespace[label] = obj

    # --- one method per kind of check -------------------------------------------------
    def tensor(self, source: Source, t: torch.Tensor):
        e = source.expr()
        if type(t) is torch.Tensor:
            ty = "Tensor"
        elif type(t) is torch.nn.Parameter:
            ty = "Parameter"
        else:
            ty = self._ref(type(t), "TYPE_")
        dev = self._ref(t.device, "DEVICE_") if t.device.type != "cpu" else "DEVICE_cpu"
        self.namespace.setdefault("DEVICE_cpu", torch.device("cpu"))
        expr = (f"type({{e}}) is {ty} and {{e}}.dtype == {t.dtype} and {{e}}.device == {dev} "
                f"and {{e}}.shape == {tuple(t.shape)} and {{e}}.stride() == {tuple(t.stride())} "
                f"and {{e}}.requires_grad is {t.requires_grad}")
        self._add(("tensor", e), source, expr,
                  f"{e}: tensor type, dtype, device, sizes, strides, requires_grad")

    def constant(self, source: Source, value):
        e = source.expr()
        if value is None or isinstance(value, bool):
            expr = f"{{e}} is {value}"
        else:
            expr = (f"type({{e}}) is {self._type_name(type(value))} and "
                    f"{{e}} == {_literal(value, self.namespace)}")
        self._add(("const", e), source, expr, f"{e}: constant, specialized by value")

    def _type_name(self, ty) -> str:
        if ty in (int, float, str, tuple, list, dict, complex):
            return ty.__name__
        if ty is torch.Size:
            return "torch.Size"
        return self._ref(ty, "TYPE_")

    def sequence(self, source: Source, value):
        e = source.expr()
        self._add(("seq", e), source,
                  f"type({{e}}) is {self._type_name(type(value))} and len({{e}}) == {len(value)}",
                  f"{e}: container type and length (items guarded one by one)")

    def dict_keys(self, source: Source, value: dict):
        e = source.expr()
        self._add(("dict", e), source,
                  f"type({{e}}) is dict and list({{e}}.keys()) == {list(value.keys())!r}",
                  f"{e}: dict type and keys")

    def type_check(self, source: Source, ty):
        e = source.expr()
        self._add(("type", e), source, f"type({{e}}) is {self._ref(ty, 'TYPE_')}", f"{e}: type")

    def identity(self, source: Source, obj, what: str = "object"):
        e = source.expr()
        self._add(("id", e), source, f"{{e}} is {self._ref(obj, 'OBJ_')}", f"{e}: {what}, identity")

    def module(self, source: Source, mod: torch.nn.Module, check_identity: bool = True):
        e = source.expr()
        if check_identity:
            self.identity(source, mod, f"nn.Module {type(mod).__name__}")
        self._add(("training", e), source, f"{{e}}.training is {mod.training}", f"{e}.training")
        self._add(("hooks", e), source, "not ({e}._forward_hooks or {e}._forward_pre_hooks)",
                  f"{e}: forward was inlined, so no hooks")
        self.namespace["HOOKS"] = torch.nn.modules.module
        self._add(("global_hooks",), None,
                  "not (HOOKS._global_forward_hooks or HOOKS._global_forward_pre_hooks)",
                  "no global module hooks")

    def grad_mode(self):
        self._add(("grad",), None, f"torch.is_grad_enabled() is {torch.is_grad_enabled()}",
                  "grad mode")

    # --- code generation ---------------------------------------------------------------
    def build(self, binding: ArgBinding, input_exprs: List[str]):
        """-> (guard, guard_source, get_inputs, get_inputs_source)."""
        ns = dict(self.namespace)
        ns.update(binding.namespace)
        kw = repr(binding.kwnames)
        lines = ["def guard(args, kwargs):",
                 f"    # call shape: {binding.nargs} positional, keywords {kw}",
                 f"    if len(args) != {binding.nargs} or "
                 + ("kwargs" if not binding.kwnames else f"tuple(sorted(kwargs)) != {kw}")
                 + (": return False" if binding.kwnames else ": return False")]
        if not binding.kwnames:
            lines[-1] = f"    if len(args) != {binding.nargs} or kwargs: return False"
        lines += binding.prologue()
        # Each source's value is fetched once into a local (v0, v1, ...) and shared prefixes
        # (L['self']._modules['fc']) are fetched once too: most of a guard's cost is lookups.
        # A lookup that fails (a module lost an attribute) means the guard fails.
        lines.append("    try:")
        body: List[str] = []
        names: Dict[str, str] = {}

        def local(src: Source) -> str:
            key = src.expr()
            if key in names:
                return names[key]
            if isinstance(src, AttrSource):
                rhs = f"{local(src.base)}.{src.attr}"
            elif isinstance(src, ItemSource):
                rhs = f"{local(src.base)}[{src.index!r}]"
            else:
                rhs = key                        # L['x'], G, a root label
            names[key] = f"v{len(names)}"
            body.append(f"        {names[key]} = {rhs}")
            return names[key]

        for source, template, comment in self.checks:
            e = local(source) if source is not None else ""
            body.append(f"        # {comment}")
            check = template.replace("{e}", e)
            body.append(f"        if not ({check}): return False")
        lines += body
        lines += ["    except (AttributeError, KeyError, IndexError, TypeError):",
                  "        return False",
                  "    return True"]
        guard_src = "\n".join(lines) + "\n"
        inputs_src = "\n".join(["def get_inputs(args, kwargs):"] + binding.prologue()
                               + [f"    return [{', '.join(input_exprs)}]"]) + "\n"
        exec(compile(guard_src, "<minicompile guard>", "exec"), ns)
        exec(compile(inputs_src, "<minicompile get_inputs>", "exec"), ns)
        guard, get_inputs = ns["guard"], ns["get_inputs"]
        return guard, guard_src, get_inputs, inputs_src
