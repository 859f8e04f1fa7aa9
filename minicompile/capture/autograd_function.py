"""torch.autograd.Function subclasses called in the frame: `MyFunction.apply(x, ...)`.

Takes: the interpreter at a call of `cls.apply` (directly, or through a subclass's own `apply`
that calls `super().apply`). Hands on: the call's result, in the graph either way, as
TorchDynamo keeps it:

- where no gradient flows through the call (grad mode off, or no tensor argument requires
  grad), `forward` is inlined with a stand-in `ctx`, under no_grad as apply runs it: its ops
  join the graph like any others;
- where one does, the call is one node of the graph whose target is `cls.apply`: the backend
  traces its forward and backward (make_fx over the autograd engine, autograd/joint.py) and
  eager PyTorch runs it where the graph is not compiled. Before that, forward and backward
  are traced here on a stand-in ctx and undone (higher_order.trial), so that a call whose
  forward or backward does anything but compute (a print, a write to a global) or that the
  capture cannot model stays a graph break, run as Python.
"""
from __future__ import annotations

import weakref

import torch
from torch.autograd.function import _is_setup_context_defined

from .builtin_calls import class_attr
from .values import (BaseListVariable, ConstantVariable, TensorVariable, TupleVariable,
                     UserObjectVariable)


class FunctionCtx:
    """What `ctx` is while forward and backward are traced (these methods are traced too)."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors):
        self.saved_for_forward = tensors

    def mark_non_differentiable(self, *args):
        pass

    def mark_dirty(self, *args):
        # forward wrote these inputs in place and returns them: inlined (no gradient), the
        # writes are traced as any; as one graph node, the call runs as Python (call_apply)
        self.dirty = args

    def set_materialize_grads(self, value):
        pass


_FUNCTION_APPLY = torch.autograd.Function.apply.__func__


def is_apply(fn) -> bool:
    """Whether a bound method variable is torch.autograd.Function.apply of a subclass."""
    return getattr(fn, "func", None) is _FUNCTION_APPLY and \
        isinstance(getattr(fn.self_var, "value", None), type)


def _call_method(tx, cls, name, args):
    """cls.name(*args), traced: a staticmethod as written (the usual), a classmethod with cls
    first (entmax's Functions)."""
    attr = class_attr(cls, name)
    if isinstance(attr, classmethod):
        return tx.inline_call(attr.__func__, [tx.output.wrap(cls, None)] + list(args), {})
    return tx.inline_call(attr.__func__ if isinstance(attr, staticmethod) else attr, list(args), {})


def call_apply(tx, cls: type, args, kwargs):
    """`cls.apply(*args)` (see the module docstring)."""
    if kwargs:
        raise tx.unsupported(f"{cls.__qualname__}.apply with keyword arguments")
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(a, TensorVariable) and a.example.requires_grad for a in args)
    if not needs_grad:
        return _forward(tx, cls, args)[1]
    from .higher_order import trial
    with trial(tx) as changed_outside:
        ctx, result = _forward(tx, cls, args)
        outputs = result.items if isinstance(result, BaseListVariable) else [result]
        grads = [tx.output.call("call_function", torch.ones_like, [o], {}) if isinstance(o, TensorVariable)
                 else ConstantVariable(None) for o in outputs]
        tx.set_grad(False)                  # (the engine runs backward without recording)
        _call_method(tx, cls, "backward", [ctx] + grads)
        if changed_outside(ctx):
            raise tx.unsupported(f"{cls.__qualname__}'s forward or backward changes state outside it")
        if "dirty" in ctx.items:
            raise tx.unsupported(f"{cls.__qualname__}'s forward writes its inputs in place (ctx.mark_dirty)",
                                 "a graph node does not write its inputs: it runs as Python, at a graph break")
    return tx.output.call("call_function", apply_of(cls), list(args), {}, floats_traced=True)


_APPLY = weakref.WeakKeyDictionary()


def apply_of(cls: type):
    """torch's Function.apply for cls, as a plain function of this module: a node's target
    that FX's code calls as an object it holds (a bound method of torch's Function it would
    name as an import path), one per class, never stored in the graph cache (its name is a
    local one)."""
    fn = _APPLY.get(cls)
    if fn is None:
        def apply(*args):
            return _FUNCTION_APPLY(cls, *args)      # torch's own (a subclass's may take others)
        fn = _APPLY[cls] = apply
    return fn


def _forward(tx, cls: type, args):
    """forward inlined on a stand-in ctx, under no_grad -> (ctx, forward's result)."""
    ctx = UserObjectVariable(object.__new__(FunctionCtx), None)
    ctx.items["needs_input_grad"] = TupleVariable([ConstantVariable(
        torch.is_grad_enabled() and isinstance(a, TensorVariable) and a.example.requires_grad) for a in args])
    before = torch.is_grad_enabled()
    tx.set_grad(False)
    try:
        if _is_setup_context_defined(cls.setup_context):
            result = _call_method(tx, cls, "forward", list(args))
            _call_method(tx, cls, "setup_context", [ctx, TupleVariable(list(args)), result])
        else:
            result = _call_method(tx, cls, "forward", [ctx] + list(args))
    finally:
        tx.set_grad(before)
    return ctx, result
