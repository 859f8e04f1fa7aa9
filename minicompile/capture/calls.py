"""How the translator calls things: torch functions, user functions and modules (inlined),
methods of containers and constants, classes (objects, ModelOutputs, namedtuples made in the
frame), copies of constant objects, special methods.

`CallsMixin` is part of InstructionTranslator; its methods take and give VariableTrackers.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import math
import operator
import sys
import types
import typing
import weakref
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.fx


from .. import custom_ops, ir, optim
from . import polyfills, pytree_calls
from .autograd_function import call_apply, is_apply
from .breaks import COMPILED_ORIGINAL, ObservedException, Unsupported, never_traced
from .bytecode import BINARY_OPS, COMPARE_OPS
from .sources import AttrSource, HelperSource, ItemSource, RootSource, module_member_source
from .guards import code_signature
from .builtin_calls import (_BUILTIN_HANDLERS, _COMPILING_QUERIES, FLOAT_TO_INT, ContainerReadVariable, class_attr,
                            python_method, sort_order, _builtin_dict, _constant_state, _is_none,
                            _is_plain_user_class, _runs_for_real, number_conversion,
                            tuple_subclass_with_python_new)
from .output_graph import _is_internal_module_name
from .values import (DELETED, BaseListVariable, BoundMethodVariable, BuiltinVariable, ConstantMethodVariable,
                     AutocastVariable, ConstantVariable, DictVariable, DictViewVariable, ExceptionInitVariable,
                     ExceptionVariable, BoundArgumentsVariable,
                     GeneratorVariable, GradModeVariable, InferenceModeVariable, NullContextVariable,
                     IteratorVariable, ListVariable, ModuleSliceVariable, ModelOutputVariable, NamedTupleVariable,
                     NestedFunctionVariable, NNModuleVariable, NullVariable, ObjectMethodVariable,
                     OpaqueConstantVariable, OperatorGetterVariable, PartialVariable,
                     SetVariable, SizeVariable, SuperVariable, SymIntVariable, TensorMethodVariable, TensorVariable,
                     TorchFunctionVariable, TupleVariable, TypeVariable, UserFunctionVariable,
                     UserObjectVariable, VariableTracker, WeakRefVariable, WithExitVariable, _constant_result, _hashable,
                     _DictFromKeys, _MakeInstance, _NoOpCallable, _UnboundConstantMethod, _UnboundTensorMethod, example_of, is_constant_value,
                     is_model_output_class, dict_key, key_example, key_variable, NO_KEY)


MAX_INLINE_DEPTH = 32

# torch._check_with's message where it is given none
TORCH_CHECK_MESSAGE = ("Expected cond to be True, but got False. (Could this error message be improved? "
                       "If so, please report an enhancement request to PyTorch.)")


# nn.Module's generator methods that walk its tree: done at trace time (CallsMixin.walk_module)
_MODULE_WALKS = {name: getattr(torch.nn.Module, name) for name in (
    "modules", "named_modules", "children", "named_children", "parameters", "named_parameters",
    "buffers", "named_buffers")}


# callables that read the frame they are called from: called at a graph break they would read
# minicompile's, so the frame that calls one runs as Python (its break is never resumed)
_READ_THE_CALLER = {globals, locals, vars, dir, eval, exec, breakpoint, sys._getframe,
                    inspect.currentframe, inspect.stack}


def _default_source(func, fn_source, name: str, value):
    """Where the default value of parameter `name` is read from: a keyword-only one from
    __kwdefaults__ (a dict, changed in place), another that is not a constant from its place in
    __defaults__ (a list may be changed); a constant in __defaults__ is covered by the guard
    that the tuple is the same."""
    if fn_source is None:
        return None
    code = func.__code__
    names = code.co_varnames[:code.co_argcount]
    if name not in names:
        return ItemSource(AttrSource(fn_source, "__kwdefaults__"), name)
    if is_constant_value(value):
        return None
    return ItemSource(AttrSource(fn_source, "__defaults__"),
                      names.index(name) - (code.co_argcount - len(func.__defaults__)))


# nn.Module's own __call__ and what it calls: a module called through one of these runs its
# hooks and forward (call_module)
MODULE_CALLS = (torch.nn.Module.__call__, torch.nn.Module._wrapped_call_impl, torch.nn.Module._call_impl)


def own_call(cls: type):
    """The __call__ of a module class where the class has its own, not nn.Module's (a Hugging
    Face layer that checkpoints itself there), as a Python function; else None. Eager runs
    it, and it runs the module's hooks and forward through super().__call__."""
    call = python_method(cls, "__call__")
    return call if call not in MODULE_CALLS else None


# a set's methods that make a new set, and those that answer a question, of the set and others
_NEW_SET_METHODS = ("union", "intersection", "difference", "symmetric_difference")
_SET_CHANGES = ("add", "update", "discard", "remove", "pop", "clear", "difference_update",
                "intersection_update", "symmetric_difference_update")
_SET_QUESTIONS = ("issubset", "issuperset", "isdisjoint")


def _builtin_type_of(v: VariableTracker) -> Optional[type]:
    """The type of a constant, a list, tuple, set or dict of the trace (None for others)."""
    if v.is_constant():
        return type(v.as_example())
    if isinstance(v, DictVariable):
        return v.cls
    return getattr(v, "python_type", None) if isinstance(v, BaseListVariable) else None


def _made_by(result: VariableTracker, fn, args, kwargs) -> VariableTracker:
    """A generator a call made remembers the call: where it outlives the trace before it
    started, the call is made again for a real one."""
    if isinstance(result, GeneratorVariable) and result.made_by is None:
        result.made_by = (fn, list(args), dict(kwargs))
    return result


def torch_container(module) -> bool:
    """A module whose forward is torch.nn's, with modules inside (nn.Sequential,
    nn.TransformerEncoder, nn.MultiheadAttention): called from a frame that runs eagerly, it is
    compiled on its own, as TorchDynamo's frame hook compiles torch.nn's frames (a single layer,
    nn.Linear, is traced into the frame)."""
    forward = getattr(type(module), "forward", None)
    return (getattr(forward, "__module__", None) or "").startswith("torch.nn.modules") and \
        next(module.children(), None) is not None


# the modules of DDP's and FSDP1's wrapper classes (FSDP2's run hooks instead)
_DISTRIBUTED_WRAPPERS = ("torch.nn.parallel.distributed", "torch.distributed.fsdp.fully_sharded_data_parallel")

# torch.profiler.record_function (torch.autograd.profiler's is the same class): a with-block
# that names a range in a profiler's trace
_PROFILER_RANGES = (torch.profiler.record_function,)


_RESHAPED_IN_PLACE = {"t_": "t", "transpose_": "transpose", "squeeze_": "squeeze", "unsqueeze_": "unsqueeze",
                      "swapdims_": "swapdims", "swapaxes_": "swapaxes"}


def _makes_a_leaf(kwargs: dict) -> bool:
    """A factory's requires_grad=True: its tensor is a leaf that requires grad."""
    flag = kwargs.get("requires_grad")
    return flag is not None and flag.is_constant() and flag.as_example() is True


def _without_requires_grad(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k != "requires_grad"}


_OPERATOR_SYMBOLS = {op: sym for sym, op in {**BINARY_OPS, **COMPARE_OPS}.items()}


def _operator_statement(tx, fn, args, kwargs) -> Optional[VariableTracker]:
    """A function of `operator` on the trace's Python values does what the statement it stands
    for does (operator.setitem(l, 0, v) writes the frame's list, operator.is_ compares two of
    its objects), not an op run on copies of them; None where an op does it (tensors)."""
    if kwargs or not _hashable(fn):
        return None
    from .instructions import contains, delete_item, identical, store_item
    if fn is operator.setitem and len(args) == 3:
        store_item(tx, *args)
    elif fn is operator.delitem and len(args) == 2:
        delete_item(tx, *args)
    elif fn in (operator.is_, operator.is_not) and len(args) == 2:
        return ConstantVariable(identical(tx, *args) == (fn is operator.is_))
    elif fn is operator.contains and len(args) == 2:
        return ConstantVariable(contains(tx, *args))
    elif any(isinstance(a, TensorVariable) for a in args):
        return None
    elif fn is operator.getitem and len(args) == 2:
        return tx.subscript(*args)
    elif fn in _OPERATOR_SYMBOLS and len(args) == 2:
        return tx.binary(_OPERATOR_SYMBOLS[fn], *args)
    else:
        return None
    return ConstantVariable(None)


# the legacy typed-tensor classes, by the dtype and device of what torch.XTensor(data) makes
_LEGACY_TENSOR_TYPES = {getattr(module, name): (dtype, device)
                        for module, device in ((torch, "cpu"), (torch.cuda, "cuda"))
                        for name, dtype in (("FloatTensor", torch.float32), ("DoubleTensor", torch.float64),
                                            ("HalfTensor", torch.float16), ("BFloat16Tensor", torch.bfloat16),
                                            ("ByteTensor", torch.uint8), ("CharTensor", torch.int8),
                                            ("ShortTensor", torch.int16), ("IntTensor", torch.int32),
                                            ("LongTensor", torch.int64), ("BoolTensor", torch.bool))
                        if hasattr(module, name)}


class CallsMixin:
    def make_autocast(self, cls, args, kwargs) -> AutocastVariable:
        """torch.autocast(...) (or its cuda/cpu subclasses) with constant arguments."""
        try:
            made = cls(*[a.as_example() for a in args],
                       **{k: v.as_example() for k, v in kwargs.items()})
        except Exception as e:
            raise self.unsupported(f"torch.autocast() raised {type(e).__name__}: {e}")
        if not all(a.is_constant() for a in list(args) + list(kwargs.values())):
            raise self.unsupported("torch.autocast with arguments that are not constants")
        return AutocastVariable(made.device, made.fast_dtype, made._enabled, made._cache_enabled)

    # calls --------------------------------------------------------------------------------
    def call_function(self, fn: VariableTracker, args: List[VariableTracker],
                      kwargs: Dict[str, VariableTracker]) -> VariableTracker:
        out = self.output
        real = getattr(fn, "value", None)
        if isinstance(fn, (UserObjectVariable, NNModuleVariable)) and (original := getattr(
                type(fn.module if isinstance(fn, NNModuleVariable) else fn.value), COMPILED_ORIGINAL, None)):
            # one compiled on its own, called in this trace: what it compiles, traced here
            return self.call_function(self.load_attr(fn, original), args, kwargs)
        if isinstance(fn, NNModuleVariable) and type(fn.module).__name__ == "OptimizedModule" \
                and isinstance(getattr(fn.module, "_orig_mod", None), torch.nn.Module):
            # torch.compile's: its module, traced here, as TorchDynamo inlines it (its wrapper
            # would turn TorchDynamo on for the frames under this trace)
            return self.call_function(self.load_attr(fn, "_orig_mod"), args, kwargs)
        if isinstance(fn, (UserFunctionVariable, BoundMethodVariable)) and callable(
                wrapped := getattr(getattr(fn, "func", real), "_torchdynamo_orig_callable", None)):
            # a function or method torch.compile wraps: what it wraps
            if isinstance(fn, BoundMethodVariable):
                return self.call_function(BoundMethodVariable(wrapped, fn.self_var, fn.source), args, kwargs)
            return self.call_function(UserFunctionVariable(wrapped, AttrSource(fn.source, "_torchdynamo_orig_callable")
                                                           if fn.source is not None else None), args, kwargs)
        if self.parent is None and _hashable(real) and real in _READ_THE_CALLER and \
                (real not in (vars, dir) or not args):
            err = self.unsupported(f"call to {real.__name__}(), which reads the frame that calls it",
                                   "made at a graph break it would read minicompile's frame")
            err.own_frame = True
            raise err
        if _hashable(real) and (real in FLOAT_TO_INT or real is float) and len(args) == 1 and not kwargs \
                and isinstance(args[0], SymIntVariable):
            return number_conversion(self, real, args[0])      # int(n / 2), float(n): still symbolic
        if real is functools.update_wrapper and args and isinstance(args[0], NestedFunctionVariable) \
                and args[0].source is None:
            return self.update_wrapper(*args, **kwargs)
        if real is math.prod and len(args) == 1 and not kwargs and isinstance(args[0], BaseListVariable) \
                and any(isinstance(i, SymIntVariable) for i in args[0].items):
            product = ConstantVariable(1)
            for item in args[0].items:             # math.prod(x.shape): sizes, multiplied symbolically
                product = self.binary("*", product, item)
            return product
        if real is math.sqrt and len(args) == 1 and not kwargs and isinstance(args[0], SymIntVariable) and \
                self.output.sym_compare(operator.ge, args[0], ConstantVariable(0)):
            return out.sym_arith(torch._sym_sqrt, args[0])            # math.sqrt(n): a float, symbolic
        if not out.inline_user_calls and self.parent is None and isinstance(
                fn, (UserFunctionVariable, BoundMethodVariable, NestedFunctionVariable)) \
                or not out.inline_user_calls and self.parent is None and isinstance(fn, NNModuleVariable) \
                and not type(fn.module).__module__.startswith("torch."):
            raise self.unsupported(f"call to {fn.describe()} from a frame that runs eagerly",
                                   "the callee is compiled on its own")
        if isinstance(fn, NestedFunctionVariable):
            return _made_by(self.inline_nested(fn, args, kwargs), fn, args, kwargs)
        if (stand_in := polyfills.POLYFILLS.get((getattr(real, "__module__", None),
                                                  getattr(real, "__qualname__", None)))) is not None:
            return self.inline_call(stand_in, args, kwargs)
        if real is polyfills.combine_pointwise:
            return polyfills.trace_combine_pointwise(self, args, kwargs)
        if _hashable(real) and real in pytree_calls.HANDLERS:
            try:
                return pytree_calls.HANDLERS[real](self, args, kwargs)
            except pytree_calls.NotModelled:
                pass                            # traced through pytree's own code
        if isinstance(fn, PartialVariable):
            return self.call_function(fn.func, fn.args + list(args), {**fn.keywords, **kwargs})
        if isinstance(fn, TypeVariable) and fn.value in (collections.OrderedDict, collections.defaultdict):
            factory = None
            if fn.value is collections.defaultdict:
                factory, args = (args[0], args[1:]) if args else (ConstantVariable(None), args)
            made = _builtin_dict(self, args, kwargs)
            return DictVariable(made.items, cls=fn.value, factory=None if _is_none(factory) else factory)
        if isinstance(fn, TypeVariable) and fn.value in (operator.itemgetter, operator.attrgetter,
                                                         operator.methodcaller):
            return OperatorGetterVariable(fn.value, args, kwargs)
        if isinstance(fn, OperatorGetterVariable):
            return self.call_getter(fn, args, kwargs)
        if isinstance(fn, TypeVariable) and fn.value is functools.partial:
            if not args:
                raise self.unsupported("functools.partial() without a function")
            func, rest = args[0], list(args[1:])
            if isinstance(func, PartialVariable):        # partial of a partial: one, as Python makes it
                return PartialVariable(func.func, func.args + rest, {**func.keywords, **kwargs})
            return PartialVariable(func, rest, kwargs)
        if isinstance(fn, UserFunctionVariable) and isinstance(fn.value, functools._lru_cache_wrapper):
            return self.call_cached(fn.value, args, kwargs)
        if isinstance(fn, BoundMethodVariable) and isinstance(fn.func, functools._lru_cache_wrapper):
            return self.call_cached(fn.func, args, kwargs, owner=fn.self_var)
        if isinstance(fn, _NoOpCallable):
            return ConstantVariable(None)
        if isinstance(fn, _MakeInstance):
            if not _is_plain_user_class(fn.cls, past_metaclass_call=True):
                raise self.unsupported(f"making a {fn.cls.__qualname__} past its metaclass's __call__")
            return self.new_object(fn.cls, args, kwargs)
        if isinstance(fn, ExceptionInitVariable):
            if kwargs:
                raise self.unsupported("BaseException.__init__ with keyword arguments")
            self.output.record_mutation(fn.exc)
            fn.exc.args = list(args)
            return ConstantVariable(None)
        if isinstance(fn, TypeVariable) and isinstance(fn.value, type) and issubclass(fn.value, BaseException):
            return self.new_exception(fn.value, args, kwargs)
        if isinstance(fn, ObjectMethodVariable):
            obj, name, *value = ([fn.self_var] if fn.self_var is not None else []) + list(args)
            if not isinstance(name, ConstantVariable) or not isinstance(name.value, str):
                raise self.unsupported(f"object.{fn.name} with a name that is not a constant")
            if fn.name == "__getattribute__":
                return self.load_attr(obj, name.value, generic=True)
            self.store_attr(obj, name.value, value[0], generic=True)
            return ConstantVariable(None)
        if isinstance(fn, ContainerReadVariable):
            return fn.call(self, args, kwargs)
        if isinstance(fn, _DictFromKeys):
            value = args[1] if len(args) > 1 else kwargs.get("value", ConstantVariable(None))
            keys = [k.as_example() for k in self.iterate(args[0])]
            return DictVariable({k: value for k in keys})
        if isinstance(fn, WithExitVariable):
            if fn.source is not None:
                raise self.unsupported("the exit of a torch.autocast block a graph break was inside",
                                       "it runs for real (the block was entered so at the break)")
            self.with_depth -= 1
            if fn.exit is not None:
                return self.call_function(fn.exit, args, kwargs)
            fn.undo(self)
            return ConstantVariable(None)
        if isinstance(fn, TypeVariable) and fn.value is contextlib.nullcontext:
            bound = inspect.signature(contextlib.nullcontext).bind(*args, **kwargs).arguments
            return NullContextVariable(bound.get("enter_result", ConstantVariable(None)))
        if isinstance(fn, TypeVariable) and fn.value in _PROFILER_RANGES and \
                all(a.is_constant() for a in [*args, *kwargs.values()]):
            # a profiler's named range: compiled code has none, as in Dynamo (which leaves it
            # out unless config.capture_profiler_record_function); eager's values either way
            try:
                inspect.signature(fn.value).bind(*args, **kwargs)
            except TypeError as e:
                raise self.observed(e)
            return NullContextVariable(ConstantVariable(None))
        if isinstance(fn, TypeVariable) and isinstance(fn.value, type) and \
                issubclass(fn.value, torch.amp.autocast):
            return self.make_autocast(fn.value, args, kwargs)
        if isinstance(fn, TypeVariable) and fn.value in (torch.no_grad, torch.enable_grad,
                                                         torch.set_grad_enabled):
            if fn.value is torch.set_grad_enabled:
                mode = args[0].as_example() if args else kwargs["mode"].as_example()
                if not isinstance(mode, bool):
                    raise self.unsupported("set_grad_enabled with a non-constant mode")
                # as a function it takes effect at once (it is also a context manager)
                prev = torch.is_grad_enabled()
                self.set_grad(mode)
                return GradModeVariable(mode, prev)
            return GradModeVariable(fn.value is torch.enable_grad)
        if isinstance(fn, TypeVariable) and fn.value is torch.inference_mode:
            bound = inspect.signature(torch.inference_mode).bind(*args, **kwargs).arguments
            mode = bound.get("mode", ConstantVariable(True))
            if not (mode.is_constant() and isinstance(mode.as_example(), bool)):
                raise self.unsupported(f"torch.inference_mode({mode.describe()})",
                                       "a decorator made in the frame runs as Python")
            return InferenceModeVariable(mode.as_example())
        if isinstance(fn, TorchFunctionVariable):
            self.break_at_optimizer_step(fn)      # (an LR scheduler's wrapper of it has torch's name)
            # (looked up without importing torch._dynamo: that import alone takes seconds, and
            # code that calls graph_break() has imported it already)
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is not None and fn.value is getattr(dynamo, "graph_break", None):
                raise self.unsupported("torch._dynamo.graph_break()",
                                       "a graph break the user asked for",
                                       "remove the call to keep one graph")
            if fn.value in _COMPILING_QUERIES:
                # code that asks whether it is being compiled takes its compile-friendly path
                # while it is traced (it answers True inside TorchDynamo too); what runs for
                # real at a break asks again and hears False, as under Dynamo
                return ConstantVariable(_COMPILING_QUERIES[fn.value])
            if fn.value is torch.is_tensor and len(args) == 1 and not kwargs:
                # answered by what the trace holds: a size stays symbolic (XGLM's max_pos)
                return ConstantVariable(isinstance(args[0], TensorVariable))
            if fn.value in (torch._check_tensor_all, torch._check_tensor_all_with, torch._assert_async):
                checked = self.tensor_check(fn.value, args, kwargs)
                if checked is not None:
                    return checked
            if fn.value is torch.cond:
                from .higher_order import call_cond
                return call_cond(self, args, kwargs)
            if fn.value is torch.utils.checkpoint.checkpoint:
                from .higher_order import call_checkpoint
                return call_checkpoint(self, args, kwargs)
            statement = _operator_statement(self, fn.value, args, kwargs)
            if statement is not None:
                return statement
            if fn.value is torch._C._group_tensors_by_device_and_dtype:
                return self.group_by_device_and_dtype(args, kwargs)
            if _makes_a_leaf(kwargs):           # torch.ones(3, requires_grad=True)
                made = out.call("call_function", fn.value, args, _without_requires_grad(kwargs))
                return self.requires_grad_(made, [], {})
            try:
                return out.call("call_function", fn.value, args, kwargs)
            except Unsupported as err:
                if not (getattr(err, "python_result", False) and isinstance(fn.value, types.FunctionType)):
                    raise
            # a Python helper of torch's that answers a question about tensors (their device,
            # whether they require grad): its code is traced, as Dynamo inlines torch.nn's
            return self.inline_call(fn.value, args, kwargs)
        if isinstance(fn, TensorMethodVariable) and fn.name == "requires_grad_":
            return self.requires_grad_(fn.tensor, args, kwargs)
        if isinstance(fn, TensorMethodVariable) and fn.name in _RESHAPED_IN_PLACE and fn.tensor.source is None \
                and fn.tensor.identity().source is None:
            # a tensor the graph computed, given another shape in place (BigBird's
            # `band_mask.unsqueeze_(1)`): its variable stands for the view from here on (a view
            # taken before keeps its own shape, as in eager), and so does every variable of the
            # same tensor object (`b = a.float()` of a float a is a itself)
            t, same = fn.tensor, fn.tensor.identity()
            made = out.call("call_method", _RESHAPED_IN_PLACE[fn.name], [t] + list(args), kwargs)
            for v in [t, same, *self.variables_of(same)]:
                v.proxy, v.example = made.proxy, made.example
            return t
        if isinstance(fn, TensorMethodVariable) and _makes_a_leaf(kwargs):    # x.new_ones(3, requires_grad=True)
            made = out.call("call_method", fn.name, [fn.tensor] + list(args), _without_requires_grad(kwargs))
            return self.requires_grad_(made, [], {})
        if isinstance(fn, TensorMethodVariable):
            return out.call("call_method", fn.name, [fn.tensor] + list(args), kwargs)
        if isinstance(fn, _UnboundTensorMethod):
            return out.call("call_method", fn.name, list(args), kwargs)
        if isinstance(fn, _UnboundConstantMethod) and args and _builtin_type_of(args[0]) is fn.cls:
            return self.call_function(self.load_attr(args[0], fn.name), list(args[1:]), kwargs)
        if isinstance(fn, UserFunctionVariable) and fn.value in (copy.deepcopy, copy.copy) and \
                len(args) == 1 and not kwargs:
            return self.private_copy(args[0], fn.value)
        if isinstance(fn, (UserFunctionVariable, BuiltinVariable, TypeVariable)) and \
                _runs_for_real(fn.value):
            def real(a):
                if a.is_constant():
                    return a.as_example()
                if fn.value in (dataclasses.fields, dataclasses.is_dataclass) and \
                        isinstance(a, (UserObjectVariable, TensorVariable)):
                    # an instance's fields are its class's (guarded; a tensor's, by its guard)
                    return type(a.value if isinstance(a, UserObjectVariable) else a.example)
                if isinstance(a, BoundMethodVariable) and isinstance(a.self_var, (NNModuleVariable, UserObjectVariable)):
                    return types.MethodType(a.func, a.self_var.as_example())   # its function is fixed
                raise self.unsupported(f"{fn.describe()} on {a.describe()}, not a constant")
            result = fn.value(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()})
            return ConstantVariable(result) if is_constant_value(result) else OpaqueConstantVariable(result)
        if isinstance(fn, (UserFunctionVariable, BoundMethodVariable)):
            self.break_at_optimizer_step(fn)
        if isinstance(fn, UserFunctionVariable):
            return _made_by(self.inline_call(fn.value, args, kwargs), fn, args, kwargs)
        if isinstance(fn, BoundMethodVariable) and isinstance(fn.self_var, NNModuleVariable) and \
                fn.func in _MODULE_WALKS.values():
            return self.walk_module(fn, args, kwargs)
        if isinstance(fn, BoundMethodVariable) and isinstance(fn.self_var, NNModuleVariable) and \
                fn.func is torch.nn.Module.to:
            return self.module_to(fn.self_var, args, kwargs)
        if isinstance(fn, BoundMethodVariable) and fn.func in MODULE_CALLS and isinstance(fn.self_var, NNModuleVariable):
            return self.module_call(fn.self_var, args, kwargs)      # super().__call__(...) of an override
        if isinstance(fn, BoundMethodVariable) and is_apply(fn):
            return call_apply(self, fn.self_var.value, args, kwargs)
        if isinstance(fn, BoundMethodVariable) and fn.func is torch.nn.Module.__init__ and \
                isinstance(fn.self_var, UserObjectVariable):
            return ConstantVariable(None)         # the stand-in of check_init_is_pure
        if isinstance(fn, BoundMethodVariable):
            return _made_by(self.inline_call(fn.func, [fn.self_var] + list(args), kwargs), fn, args, kwargs)
        if isinstance(fn, NNModuleVariable):
            return self.call_module(fn, args, kwargs)
        if isinstance(fn, ModuleSliceVariable) and issubclass(fn.module_cls, torch.nn.Sequential) \
                and len(args) == 1 and not kwargs:
            out = args[0]                                  # Sequential.forward, over the slice
            for module in fn.items:
                out = self.call_function(module, [out], {})
            return out
        if isinstance(fn, TypeVariable) and fn.value is weakref.ref and len(args) == 1 and not kwargs and \
                isinstance(args[0], UserObjectVariable) and args[0].source is None:
            return WeakRefVariable(args[0])            # (an object of the frame's: alive in the trace)
        if isinstance(fn, WeakRefVariable) and not args and not kwargs:
            return fn.target
        if isinstance(fn, UserObjectVariable) and isinstance(fn.value, weakref.ReferenceType) and \
                not args and not kwargs:
            # ref(): what it refers to now (or None), read through it by the guard too
            return self.output.wrap(fn.value(), HelperSource("DEREF", fn.source) if fn.source else None)
        if isinstance(fn, UserObjectVariable):
            call = self.class_member(type(fn.value), "__call__")
            if isinstance(call, types.FunctionType):          # an object with a Python __call__
                return self.inline_call(call, [fn] + list(args), kwargs)
        if getattr(fn, "value", None) is object.__new__ and len(args) == 1 and not kwargs and \
                isinstance(args[0], TypeVariable) and _is_plain_user_class(args[0].value) and \
                class_attr(args[0].value, "__new__") is object.__new__ and class_attr(args[0].value, "__del__") is None:
            # `self.__new__(type(self))` (torch.distributions' expand): an instance made in the
            # frame, its __init__ not run
            return UserObjectVariable(self.on_constants(object.__new__, args[0].value), None)
        if isinstance(fn, BuiltinVariable):
            return _BUILTIN_HANDLERS[fn.value](self, args, kwargs)
        if isinstance(fn, ConstantMethodVariable):
            return self.call_constant_method(fn, args, kwargs)
        if isinstance(fn, TypeVariable) and typing.is_typeddict(fn.value):
            return _BUILTIN_HANDLERS[dict](self, args, kwargs)     # (a TypedDict makes a dict)
        if isinstance(fn, TypeVariable):
            if is_model_output_class(fn.value):
                return self.new_model_output(fn.value, args, kwargs)
            if isinstance(fn.value, type) and issubclass(fn.value, tuple) and hasattr(fn.value, "_fields"):
                bound = inspect.signature(fn.value).bind(*args, **kwargs)     # TypeError as Python
                bound.apply_defaults()
                return NamedTupleVariable([v if isinstance(v, VariableTracker) else self.output.wrap(v, None)
                                           for v in bound.arguments.values()], fn.value)
            legacy = _LEGACY_TENSOR_TYPES.get(fn.value)
            if legacy is not None and len(args) == 1 and not kwargs and \
                    (isinstance(args[0], BaseListVariable) or
                     args[0].is_constant() and isinstance(args[0].as_example(), (list, tuple))):
                # torch.IntTensor([n]) (VITS), torch.FloatTensor([0.5]) (TabNet): torch.tensor of
                # the data, of that type (of an int, the legacy call would make that many items)
                dtype, device = legacy
                return self.call_function(TorchFunctionVariable(torch.tensor), list(args),
                                          {"dtype": ConstantVariable(dtype), "device": ConstantVariable(device)})
            if tuple_subclass_with_python_new(fn.value):
                new = self.class_member(fn.value, "__new__")
                self.class_member(fn.value, "__init__")        # (guarded to stay object's: not called)
                return self.inline_call(new.__func__, [fn] + list(args), kwargs)
            if fn.value is torch.Size and len(args) == 1 and not kwargs and isinstance(args[0], BaseListVariable) \
                    and any(isinstance(i, SymIntVariable) for i in args[0].items):
                return SizeVariable(list(args[0].items))      # torch.Size((n,)) of a symbolic n
            if fn.value is torch.Size and all(a.is_constant() for a in args):
                return ConstantVariable(torch.Size(*[a.as_example() for a in args]))
            if fn.value is super:
                return self.make_super(args)
            if isinstance(fn.value, enum.EnumMeta) and all(a.is_constant() for a in args) and not kwargs:
                if len(args) == 1 and _enum_member(fn.value, args[0].as_example()) is None:
                    # not a member's value: the class's _missing_ (user code, maybe with effects or
                    # reading state) decides on each call, as Python
                    raise self.unsupported(f"{fn.value.__name__}({args[0].describe()}): not a member's value")
                return self.output.wrap(fn.value(*[a.as_example() for a in args]), None)   # Color("r")
            meta_call = class_attr(type(fn.value), "__call__")
            if isinstance(meta_call, types.FunctionType) and _is_plain_user_class(fn.value, past_metaclass_call=True):
                # a metaclass's own __call__ (pyro's distributions coerce their arguments
                # there), traced; its super().__call__ makes the instance (_MakeInstance)
                self.output.guards.class_member(type(fn.value), "__call__", meta_call)
                return self.inline_call(meta_call, [fn] + list(args), kwargs)
            if _is_plain_user_class(fn.value):
                return self.new_object(fn.value, args, kwargs)
            if isinstance(fn.value, type) and issubclass(fn.value, torch.nn.Module) and \
                    type(fn.value) is type:
                return self.new_module(fn.value, args, kwargs)
        value = getattr(fn, "value", None)
        if (isinstance(value, np.ufunc) or isinstance(value, type) and issubclass(value, np.generic)) \
                and not kwargs and all(a.is_constant() and isinstance(a.as_example(), (int, float, np.generic))
                                       for a in args):
            # NumPy's math on numbers (CTRL's np.sqrt(d_model)): a number of the code
            return ConstantVariable(value(*[a.as_example() for a in args]))
        if isinstance(value, types.BuiltinMethodType) and type(getattr(value, "__self__", None)) in (
                str, bytes, frozenset, tuple) and is_constant_value(value.__self__) and \
                all(a.is_constant() for a in list(args) + list(kwargs.values())):
            # a C method of an immutable constant (keyword.iskeyword is a frozenset's
            # __contains__) on constants: its answer is a constant
            return ConstantVariable(self.on_constants(value, *[a.as_example() for a in args],
                                                      **{k: v.as_example() for k, v in kwargs.items()}))
        name = getattr(value, "__qualname__", None) or fn.describe()
        raise self.unsupported(f"call to {name}", "the capture cannot model this callable yet")

    def requires_grad_(self, t: VariableTracker, args, kwargs) -> VariableTracker:
        """t.requires_grad_(flag), and `t.requires_grad = flag`. Where t already is so (a
        Hugging Face model's hook that makes the embeddings require grad for checkpointing):
        nothing to do. A tensor the graph computed, untracked, made to require grad (wav2vec2's
        feature encoder, T5's zero position bias): from here on the variable stands for a leaf
        of the graph's own (higher_order.leaf_requiring_grad). Else it changes what autograd
        records of the caller's tensors, which runs as Python, at a graph break."""
        flag = args[0] if args else kwargs.get("requires_grad", ConstantVariable(True))
        if not (isinstance(t, TensorVariable) and flag.is_constant()):
            raise self.unsupported("requires_grad_() with a flag that is not a constant")
        if t.example.requires_grad == bool(flag.as_example()):
            return t
        if flag.as_example() and t.source is None and t.example.grad_fn is None and not self.output.leaf_breaks:
            from .higher_order import leaf_requiring_grad
            made = self.output.call("call_function", leaf_requiring_grad, [t], {})
            t.proxy, t.example = made.proxy, made.example      # every reference to t sees it
            return t
        raise self.unsupported(f"requires_grad_({flag.as_example()}) of a tensor whose flag it changes",
                               "what autograd records is changed as Python, at a graph break")

    def call_getter(self, fn, args, kwargs) -> VariableTracker:
        """operator.itemgetter/attrgetter/methodcaller applied to its one argument."""
        (obj,) = args
        if fn.cls is operator.methodcaller:
            name = fn.args[0].as_example()
            return self.call_function(self.load_attr(obj, name), fn.args[1:], fn.kwargs)

        def get(key):
            if fn.cls is operator.itemgetter:
                return self.subscript(obj, key)
            value = obj
            for part in key.as_example().split("."):     # attrgetter("a.b")
                value = self.load_attr(value, part)
            return value
        values = [get(k) for k in fn.args]
        return values[0] if len(values) == 1 else TupleVariable(values)

    def call_cached(self, cached, args, kwargs, owner: Optional[VariableTracker] = None) -> VariableTracker:
        """A call of a functools.lru_cache (or cache) function with constant arguments: made
        for real now, as eager's first call makes it (its effects happen then, once, and its
        result is cached as eager caches it); what it returns is a constant of the trace. A
        call with other arguments, or one that returns an object: traced (inline_cached).
        owner: the object a cached method is called on (transformers' `logger.warning_once`),
        part of the cache's key: an object read from outside the frame, guarded to be the same
        object, since another would miss the cache and run the method again."""
        name = cached.__qualname__
        values = list(args) + list(kwargs.values())
        if not all(v.is_constant() for v in values):
            return self.inline_cached(cached, args, kwargs, owner, "with arguments that are not constants")
        real = [a.as_example() for a in args]
        if owner is not None:
            if owner.source is None:
                raise self.unsupported(f"call to cached method {name} of {owner.describe()}",
                                       "the object is part of the cache's key: only objects read "
                                       "from outside the frame are modelled")
            obj = owner.as_example()
            self.output.guards.identity(owner.source, obj, f"the object cached method {name} is called on")
            real.insert(0, obj)
        real_kwargs = {k: v.as_example() for k, v in kwargs.items()}
        result = cached(*real, **real_kwargs)
        if not (is_constant_value(result) or isinstance(result, (types.FunctionType, type, types.ModuleType))):
            # (a cached object may be changed by whoever else holds it: what it is made of is
            # traced instead, each call; the call made now fills the cache as eager's first
            # does. Not guarded: a guard that calls the function would run it for calls eager
            # makes none of)
            return self.inline_cached(cached, args, kwargs, owner, f"returned a {type(result).__name__}")
        self.output.guards.cache_kept(cached, tuple(real), real_kwargs, result)
        return ConstantVariable(result) if is_constant_value(result) else self.output.wrap(result, None)

    def inline_cached(self, cached, args, kwargs, owner, why: str) -> VariableTracker:
        """A cached function's call that cannot be a constant of the trace (its arguments are
        not constants: sizes of the trace; or it returns an object, einops' recipes): the
        function it wraps, traced as any, as Dynamo does: the compiled calls neither read nor
        fill its cache. That is eager's result where the function is pure: one that changes anything
        from outside the frame, draws random numbers or writes a tensor it was given would do
        so once where eager's cache would not call it again, so it runs as Python, at a graph
        break, from its cache (`why`: what kept it from being a constant)."""
        name = cached.__qualname__
        out = self.output
        mark, effects, written = len(out.undo_log), len(out.side_effects), set(out.written_inputs)
        nodes = len(out.graph.nodes)
        result = self.inline_call(cached.__wrapped__, ([owner] if owner is not None else []) + list(args), kwargs)
        changed = len(out.side_effects) > effects or out.written_inputs != written or any(
            any(v is e for e in out.side_effects) for v, _ in out.undo_log[mark:])
        drawn = any(ir.draws_random_numbers(n) for n in list(out.graph.nodes)[nodes:])
        if changed or drawn:
            raise self.unsupported(f"call to cached function {name} {why}",
                                   "traced, it " + ("changes state outside the frame" if changed else
                                                    "draws random numbers") +
                                   ", which eager's cache would not do again: run as Python, at a graph break")
        return result

    def private_copy(self, v: VariableTracker, how) -> VariableTracker:
        """copy.deepcopy / copy.copy of an object read from outside the frame whose state is
        constants (a config): made for real, the original's state guarded as a whole; the copy
        is the frame's own (UserObjectVariable with a snapshot). Its lists and dicts are the
        frame's own too (deepcopy), or the original's very ones (copy: a change made through
        the copy is a change of the original's)."""
        shallow = how is copy.copy
        if shallow and type(v) in (ListVariable, DictVariable):   # a new container, the same items
            return ListVariable(list(v.items)) if type(v) is ListVariable else \
                DictVariable(dict(v.items), cls=v.cls, factory=v.factory)
        if not shallow and type(v) in (ListVariable, DictVariable):
            made = _deep_copied(v, {}, self.output.guards)   # (a config's to_dict(): deepcopy(self.__dict__))
            if made is not None:
                return made
        if v.is_constant():
            return self.output.wrap(how(v.as_example()), None)     # (a list of them: the frame's)
        if isinstance(v, UserObjectVariable) and v.source is None and v.snapshot is not None:
            return self._copy_of_a_copy(v, how)
        if not (isinstance(v, UserObjectVariable) and v.source is not None and not v.items
                and _constant_state(v.value)):
            raise self.unsupported(f"{how.__name__} of {v.describe()}",
                                   "only copies of objects whose state is constants are modelled")
        self.output.guards.state_equals(v.source, copy.deepcopy(v.value.__dict__))
        made = how(v.value)
        var = UserObjectVariable(made, None, snapshot=copy.deepcopy(made))
        for name, value in vars(made).items():
            if isinstance(value, (list, dict)):
                var.overrides[name] = self.output.wrap(value, AttrSource(v.source, name)) if shallow \
                    else self.output.wrap(value, None)
        return var

    def _copy_of_a_copy(self, v: UserObjectVariable, how) -> VariableTracker:
        """A copy of the frame's own copy of a config (Whisper's decoder deepcopies its config,
        sets an attribute, and the cache it makes deepcopies that again): made for real from
        its state as the trace has it, where that is constants."""
        state = copy.copy(v.value)
        for name, item in v.items.items():
            if item is DELETED:
                state.__dict__.pop(name, None)
            elif item.is_constant():
                state.__dict__[name] = item.as_example()
            else:
                raise self.unsupported(f"{how.__name__} of {v.describe()} holding {item.describe()}",
                                       "only copies of objects whose state is constants are modelled")
        if not _constant_state(state):
            raise self.unsupported(f"{how.__name__} of {v.describe()}",
                                   "only copies of objects whose state is constants are modelled")
        made = how(state)
        var = UserObjectVariable(made, None, snapshot=copy.deepcopy(made))
        for name, value in vars(made).items():
            if isinstance(value, (list, dict)):
                if how is copy.copy:       # the very containers of the copied one
                    v.items.setdefault(name, self.output.wrap(value, None))
                    var.overrides[name] = v.items[name]
                else:
                    var.overrides[name] = self.output.wrap(value, None)
        return var

    def group_by_device_and_dtype(self, args, kwargs) -> VariableTracker:
        """torch's foreach helpers group lists of tensors by device and dtype (clip_grad_norm_,
        the foreach optimizers): decided by the tensors' metadata, which the graph is
        specialized to, so grouped here; the groups hold the very variables given."""
        lists = args[0] if args else kwargs.get("tensorlistlist")
        if not isinstance(lists, BaseListVariable) or \
                not all(isinstance(item, BaseListVariable) for item in lists.items):
            raise self.unsupported("_group_tensors_by_device_and_dtype() of lists the trace does not hold")
        by_id = {id(example_of(v)): v for inner in lists.items for v in inner.items
                 if isinstance(v, TensorVariable)}
        rest = [a.as_example() for a in args[1:]] + [] if all(a.is_constant() for a in args[1:]) else None
        if rest is None or any(not v.is_constant() for k, v in kwargs.items() if k != "tensorlistlist"):
            raise self.unsupported("_group_tensors_by_device_and_dtype() with arguments that vary")
        grouped = torch._C._group_tensors_by_device_and_dtype(
            [[example_of(v) for v in inner.items] for inner in lists.items], *rest,
            **{k: v.as_example() for k, v in kwargs.items() if k != "tensorlistlist"})

        def held(t):
            return by_id[id(t)] if t is not None else ConstantVariable(None)
        return DictVariable({key: TupleVariable([ListVariable([ListVariable([held(t) for t in group])
                                                               for group in groups]),
                                                 ListVariable([ConstantVariable(i) for i in indices])])
                             for key, (groups, indices) in grouped.items()})

    def walk_module(self, fn: BoundMethodVariable, args, kwargs) -> VariableTracker:
        """module.modules(), .named_parameters() and the like (generator methods): the walk is
        done now, its names guarded, and each module or tensor it yields read from its path
        (`L['self']._modules['fc']._parameters['weight']`), so the loop over it unrolls."""
        mv, name = fn.self_var, fn.func.__name__
        if mv.source is None or not all(a.is_constant() for a in list(args) + list(kwargs.values())):
            raise self.unsupported(f"{name}() of a module made in the trace, or with arguments that vary")
        named = name if name.startswith("named_") else "named_" + name
        real_args = [a.as_example() for a in args]
        real_kwargs = {k: v.as_example() for k, v in kwargs.items()}
        call = "{}({})".format(named, ", ".join([repr(a) for a in real_args] +
                                                 [f"{k}={v!r}" for k, v in real_kwargs.items()]))
        pairs = list(getattr(mv.module, named)(*real_args, **real_kwargs))
        bound = inspect.signature(getattr(type(mv.module), named)).bind(mv.module, *real_args, **real_kwargs)
        prefix = bound.arguments.get("prefix", "")
        self.output.guards.module_walk(mv.source, call, [n for n, _ in pairs])
        items = []
        for full_name, value in pairs:
            parts = [p for p in full_name[len(prefix):].split(".") if p]
            holder = mv.module.get_submodule(".".join(parts[:-1])) if parts else None
            src = mv.source
            for i, part in enumerate(parts):
                last_kind = "_modules" if isinstance(value, torch.nn.Module) else \
                    "_parameters" if part in holder._parameters else "_buffers"
                src = module_member_source(src, last_kind if i == len(parts) - 1 else "_modules", part)
            var = self.output.wrap(value, src)
            items.append(TupleVariable([ConstantVariable(full_name), var]) if name.startswith("named_") else var)
        return IteratorVariable(items, python_type=types.GeneratorType)     # (eager's is a generator)

    def module_to(self, mv: NNModuleVariable, args, kwargs) -> VariableTracker:
        """module.to(dtype or device) that changes none of the module's tensors (Switch
        Transformers' router casts its classifier to its own dtype on every call): the module
        itself. Its tensors are read (and guarded) to know; a cast that changes one breaks."""
        if not all(a.is_constant() for a in [*args, *kwargs.values()]):
            raise self.unsupported("module.to() with arguments that vary")
        device, dtype, _, memory_format = torch._C._nn._parse_to(
            *[a.as_example() for a in args], **{k: v.as_example() for k, v in kwargs.items()})
        tensors = [t for walk in (torch.nn.Module.parameters, torch.nn.Module.buffers)
                   for t in self.walk_module(BoundMethodVariable(walk, mv), [], {}).items]
        for t in tensors:
            ex = t.as_example()
            if memory_format is not None or \
                    device is not None and (ex.device.type, ex.device.index) != (device.type, device.index) or \
                    dtype is not None and (ex.is_floating_point() or ex.is_complex()) and ex.dtype != dtype:
                raise self.unsupported("module.to() that changes the module's tensors")
        return mv

    def new_model_output(self, cls: type, args, kwargs) -> ModelOutputVariable:
        """`cls(...)` for a ModelOutput class: its fields bound as its dataclass __init__ binds
        them; the items are the fields that are not None, as its __post_init__ makes them."""
        names = ModelOutputVariable.field_names(cls)
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in bound:
                raise self.unsupported(f"{cls.__name__}() with argument {k!r}")
            bound[k] = v
        first = bound.get(names[0])
        rest_none = all(_is_none(bound.get(n)) for n in names[1:])
        items = first.items if isinstance(first, BaseListVariable) else None
        # (a tuple of tensors, BackboneOutput(feature_maps=(t,)), is the field itself: its
        # __post_init__ reads key/value pairs only from an iterable whose first item is one)
        head = None if not items else items[0].as_example() if items[0].is_constant() else \
            items[0].items if isinstance(items[0], BaseListVariable) else None
        pairs = not items or isinstance(head, (tuple, list)) and len(head) == 2 and (
            isinstance(head[0], str) or isinstance(head[0], ConstantVariable) and isinstance(head[0].value, str))
        if isinstance(first, (UserObjectVariable, NNModuleVariable)) and not any(
                class_attr(type(first.as_example()), m) is not None for m in ("__iter__", "__getitem__")):
            pairs = False          # (an object iter() refuses is the field itself: diffusers' latent_dist)
        if rest_none and first is not None and not _is_none(first) and not isinstance(first, TensorVariable) \
                and pairs:
            raise self.unsupported(f"{cls.__name__}() built from a {first.describe()}",
                                   "a ModelOutput whose only field is not a tensor reads it as "
                                   "key/value pairs")
        return ModelOutputVariable(cls, {n: bound[n] for n in names if n in bound and not _is_none(bound[n])})

    def new_exception(self, cls: type, args, kwargs) -> ExceptionVariable:
        """`cls(*args)` for an exception class: its args; a subclass's Python __init__ is
        traced (its super().__init__(...) sets them, its attributes are the exception's)."""
        exc = ExceptionVariable(cls, [])
        init = next((k.__dict__["__init__"] for k in cls.__mro__
                     if isinstance(k.__dict__.get("__init__"), types.FunctionType)), None)
        if init is not None:
            self.inline_call(init, [exc] + list(args), kwargs)
        elif kwargs:
            raise self.unsupported(f"{cls.__name__}() with keyword arguments")
        else:
            exc.args = list(args)
        return exc

    def new_object(self, cls: type, args, kwargs) -> VariableTracker:
        """`cls(*args)` for a plain Python class: a real instance with no attributes yet (its
        attributes live in the trace) and `__init__` inlined, as Dynamo does for user objects
        made inside the frame. After the graph the object is rebuilt (frame.rebuild)."""
        if class_attr(cls, "__del__") is not None:
            # eager's object is finalized when let go (its __del__ runs then): made for real
            raise self.unsupported(f"creating a {cls.__qualname__}, whose class has __del__",
                                   "the object is made for real, at a graph break, so that it is "
                                   "finalized when eager's would be")
        obj = UserObjectVariable(self.on_constants(object.__new__, cls), None)   # (an abstract class: TypeError)
        init = self.class_member(cls, "__init__")
        if isinstance(init, types.FunctionType):
            ret = self.inline_call(init, [obj] + list(args), kwargs)
            if not (isinstance(ret, ConstantVariable) and ret.value is None):
                raise self.unsupported(f"{cls.__qualname__}.__init__ returned a value")
        elif init is not object.__init__ or args or kwargs:
            raise self.unsupported(f"creating a {cls.__qualname__} (its __init__ is not Python)")
        return obj

    def new_module(self, cls: type, args, kwargs) -> NNModuleVariable:
        """`cls(...)` for an nn.Module class, with constant arguments (an activation made in
        forward, `ACT2FN[name]`): made for real now, and again after the graph wherever it
        outlives the trace (each eager call makes its own). Its __init__ must change nothing
        outside the new module: torch's own classes are trusted; a user's __init__ is traced
        first (nn.Module's own __init__ and __setattr__ taken as doing nothing else), and an
        effect outside the module, or what that trace cannot model, leaves the call a break.
        The module may hold no parameters or buffers and draw no random numbers (each eager
        call would make new ones)."""
        values = list(args) + list(kwargs.values())
        if not all(v.is_constant() for v in values):
            raise self.unsupported(f"creating a {cls.__qualname__} from values that are not constants")
        if not cls.__module__.startswith("torch.") and cls.__init__ is not torch.nn.Module.__init__:
            self.check_init_is_pure(cls, args, kwargs)
        rng = torch.random.get_rng_state()
        module = self.on_constants(cls, *[a.as_example() for a in args],
                                   **{k: v.as_example() for k, v in kwargs.items()})
        if not torch.equal(rng, torch.random.get_rng_state()):
            torch.random.set_rng_state(rng)
            raise self.unsupported(f"creating a {cls.__qualname__} draws random numbers")
        if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
            raise self.unsupported(f"creating a {cls.__qualname__}, which holds parameters or buffers",
                                   "each eager call makes new ones")
        return NNModuleVariable(module, None, made=(cls, list(args), dict(kwargs)))

    def check_init_is_pure(self, cls: type, args, kwargs) -> None:
        """Trace cls.__init__ on a stand-in for the new module and undo it: Unsupported where
        it cannot be traced or changes anything but the stand-in."""
        from .higher_order import trial
        with trial(self) as changed_outside:
            try:
                self.inline_call(cls.__init__, [UserObjectVariable(object.__new__(cls), None)] + list(args), kwargs)
            except ObservedException as e:
                # (what it raised on the stand-in, register_buffer's "before Module.__init__()"
                # for one: made for real at a break, the call raises what eager's does, if anything)
                raise self.unsupported(f"{cls.__qualname__}.__init__ raised {e.exc.cls.__name__} on a stand-in "
                                       "for the new module") from None
            if changed_outside():
                raise self.unsupported(f"{cls.__qualname__}.__init__ changes state outside the module")

    def bind_arguments(self, signature, method: str, args, kwargs) -> BoundArgumentsVariable:
        """signature.bind(*args, **kwargs): Python's own binding, run on stand-ins for the
        call's variables (a TypeError as Python raises it), its arguments mapped back."""
        stand_ins = _StandIns()
        try:
            bound = getattr(signature, method)(*[stand_ins.of(a) for a in args],
                                               **{k: stand_ins.of(v) for k, v in kwargs.items()})
        except TypeError as e:
            raise self.observed(e)
        return BoundArgumentsVariable(signature, DictVariable(
            {k: stand_ins.back(v) for k, v in bound.arguments.items()}))

    def bound_arguments_attr(self, obj: BoundArgumentsVariable, name: str) -> VariableTracker:
        """ba.arguments, ba.signature, ba.args, ba.kwargs (Python's, from stand-ins)."""
        if name == "arguments":
            return obj.arguments
        if name == "signature":
            return OpaqueConstantVariable(obj.signature)
        if name == "apply_defaults":
            return ConstantMethodVariable(obj, name)
        if name not in ("args", "kwargs"):
            raise self.unsupported(f"BoundArguments.{name}")
        stand_ins, params = _StandIns(), obj.signature.parameters
        real = inspect.BoundArguments(obj.signature, {
            k: stand_ins.of_packed(v) if params[k].kind in (params[k].VAR_POSITIONAL, params[k].VAR_KEYWORD)
            else stand_ins.of(v) for k, v in obj.arguments.items.items()})
        return stand_ins.back(real.args if name == "args" else real.kwargs)

    def bound_arguments_method(self, obj: BoundArgumentsVariable, name: str, args, kwargs):
        """BoundArguments.apply_defaults(): the missing parameters' defaults, in the
        signature's order (what Python's does)."""
        if name != "apply_defaults" or args or kwargs:
            raise self.unsupported(f"BoundArguments.{name}()")
        given, items = obj.arguments.items, {}
        for pname, param in obj.signature.parameters.items():
            if pname in given:
                items[pname] = given[pname]
            elif param.default is not inspect.Parameter.empty:
                items[pname] = self.output.wrap(param.default, None)
            elif param.kind is inspect.Parameter.VAR_POSITIONAL:
                items[pname] = TupleVariable([])
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                items[pname] = DictVariable({})
        self.mutate(obj.arguments)
        obj.arguments.items = items
        return ConstantVariable(None)

    def call_constant_method(self, fn: ConstantMethodVariable, args, kwargs):
        obj = fn.obj
        if isinstance(obj, ConstantVariable) and isinstance(obj.value, (str, bytes)) and \
                fn.name == "join" and len(args) == 1 and not args[0].is_constant():
            args = [ListVariable(self.iterate(args[0]))]      # "-".join(str(d) for d in x.shape)
        if isinstance(obj, OpaqueConstantVariable) and isinstance(obj.value, inspect.Signature) and \
                fn.name in ("bind", "bind_partial"):
            return self.bind_arguments(obj.value, fn.name, args, kwargs)
        if isinstance(obj, BoundArgumentsVariable):
            return self.bound_arguments_method(obj, fn.name, args, kwargs)
        if isinstance(obj, ConstantVariable) and all(a.is_constant() for a in args) \
                and all(v.is_constant() for v in kwargs.values()):
            r = getattr(obj.value, fn.name)(*[a.as_example() for a in args],
                                            **{k: v.as_example() for k, v in kwargs.items()})
            if is_constant_value(r) or isinstance(obj, OpaqueConstantVariable):
                return _constant_result(obj, r)
            if type(r) in (list, dict) and _constant_state(r):
                return self.output.wrap(r, None)          # a new list of them (str.split)
        if isinstance(obj, GeneratorVariable) and not kwargs:
            from .iterators import close, next_item, stop_iteration, throw
            if fn.name == "close":
                close(self, obj)
                return ConstantVariable(None)
            if fn.name == "throw":           # throw(exc) or throw(type[, value[, traceback]])
                exc = args[1] if len(args) > 1 and not _is_none(args[1]) else args[0]
                item = throw(self, obj, self.make_exception(exc))
            else:
                item = next_item(self, obj, args[0] if fn.name == "send" else None)
            if item is None:
                raise ObservedException(stop_iteration(obj))
            return item
        if isinstance(obj, NamedTupleVariable) and hasattr(obj.tuple_cls, "_fields") and \
                fn.name in ("_replace", "_asdict"):
            fields = obj.tuple_cls._fields
            if fn.name == "_asdict":
                return DictVariable(dict(zip(fields, obj.items)))
            if args or set(kwargs) - set(fields):
                raise self.unsupported(f"{obj.tuple_cls.__name__}._replace() with unknown fields")
            return NamedTupleVariable([kwargs.get(f, item) for f, item in zip(fields, obj.items)], obj.tuple_cls)
        if isinstance(obj, ModelOutputVariable) and fn.name == "to_tuple" and not args and not kwargs:
            return TupleVariable(list(obj.items.values()))
        if isinstance(obj, DictVariable) and not args and not kwargs and \
                fn.name in ("keys", "values", "items"):
            return DictViewVariable(obj, fn.name)
        if isinstance(obj, ListVariable) and fn.name in ("append", "extend", "insert", "pop",
                                                          "clear", "reverse", "remove", "sort"):
            self.mutate(obj)
            if fn.name == "append":
                obj.items.append(args[0])
            elif fn.name == "extend":
                obj.items.extend(self.iterate(args[0]))
            elif fn.name == "insert":
                obj.items.insert(args[0].as_example(), args[1])
            elif fn.name == "pop":
                return obj.items.pop(*[a.as_example() for a in args])
            elif fn.name == "clear":
                obj.items.clear()
            elif fn.name == "reverse":
                obj.items.reverse()
            elif fn.name == "remove" and args[0].is_constant() and obj.is_constant():
                obj.items = [ConstantVariable(v) for v in obj.as_example()]
                obj.items.remove(ConstantVariable(args[0].as_example())) if False else \
                    obj.items.pop([i.as_example() for i in obj.items].index(args[0].as_example()))
            elif fn.name == "sort" and not args:
                obj.items = [obj.items[j] for j in sort_order(self, obj.items, kwargs)]
            else:
                raise self.unsupported(f"list.{fn.name}() on {obj.describe()}")
            return ConstantVariable(None)
        if isinstance(obj, SetVariable) and fn.name in _SET_CHANGES and not kwargs and \
                all(a.is_constant() for a in args):
            operands = [a.as_example() if fn.name in ("add", "discard", "remove") else
                        SetVariable.operand(a, self.iterate(a)) for a in args]
            if fn.name == "remove" and operands[0] not in obj.real or fn.name == "pop" and not obj.real:
                self.on_constants(getattr(set(obj.real), fn.name), *operands)      # KeyError, as Python
            self.mutate(obj)
            return ConstantVariable(obj.apply(fn.name, *operands))
        if isinstance(obj, SetVariable) and fn.name == "copy":
            return SetVariable.made_by(set.copy, obj.make())
        if isinstance(obj, SetVariable) and fn.name in _NEW_SET_METHODS + _SET_QUESTIONS and not kwargs:
            operands = [SetVariable.operand(a, self.iterate(a)) for a in args]
            if fn.name in _SET_QUESTIONS:
                return ConstantVariable(self.on_constants(getattr(set, fn.name), obj.make(), *operands))
            return SetVariable.made_by(getattr(set, fn.name), obj.make(), *operands)
        if isinstance(obj, BaseListVariable) and fn.name == "copy":
            return ListVariable(list(obj.items))
        if isinstance(obj, DictVariable) and not isinstance(obj, ModelOutputVariable) and \
                fn.name in ("update", "pop", "setdefault", "clear", "copy", "popitem", "move_to_end"):
            if fn.name == "copy":
                return DictVariable(dict(obj.items), cls=obj.cls, factory=obj.factory)
            if fn.name in ("move_to_end", "popitem") and (args or kwargs):
                # OrderedDict's, with `last`: done on a real one of the same keys
                if obj.cls is not collections.OrderedDict:
                    raise self.unsupported(f"dict.{fn.name}() with arguments")
                real = collections.OrderedDict((k, k) for k in obj.items)
                operands = [a.as_example() for a in args]
                if fn.name == "move_to_end" and args and dict_key(args[0]) is not NO_KEY:
                    operands[0] = dict_key(args[0])            # (a key as the dict holds it)
                result = self.on_constants(getattr(real, fn.name), *operands,
                                           **{k: v.as_example() for k, v in kwargs.items()})
                self.mutate(obj)
                popped = {k: obj.items[k] for k in obj.items if k not in real}
                obj.items = {k: obj.items[k] for k in real}
                if fn.name == "popitem":
                    (k, v), = popped.items()
                    return TupleVariable([key_variable(k), v])
                return ConstantVariable(result)
            if fn.name in ("pop", "setdefault") and (not args or dict_key(args[0]) is NO_KEY):
                raise self.unsupported(f"dict.{fn.name}() of {args[0].describe() if args else 'no key'}")
            self.mutate(obj)
            if fn.name == "update":
                new = _builtin_dict(self, args, kwargs)
                obj.items.update(new.items)
                return ConstantVariable(None)
            if fn.name == "pop":
                key = dict_key(args[0])
                if key in obj.items:
                    return obj.items.pop(key)
                if len(args) > 1:
                    return args[1]
                raise self.observed(KeyError(key_example(key)))
            if fn.name == "setdefault":
                key = dict_key(args[0])
                if key not in obj.items:
                    obj.items[key] = args[1] if len(args) > 1 else ConstantVariable(None)
                return obj.items[key]
            if fn.name == "clear":
                obj.items.clear()
                return ConstantVariable(None)
            if not obj.items:
                raise self.observed(KeyError("popitem(): dictionary is empty"))
            k, v = obj.items.popitem()
            return TupleVariable([key_variable(k), v])
        if isinstance(obj, DictVariable) and fn.name == "get" and args and (key := dict_key(args[0])) is not NO_KEY:
            default = args[1] if len(args) > 1 else ConstantVariable(None)
            return obj.items.get(key, default)
        if isinstance(obj, SizeVariable) and fn.name == "numel" and not args and not kwargs:
            # the product of the sizes, symbolic where one is
            product = ConstantVariable(1)
            for item in obj.items:
                product = self.binary("*", product, item)
            return product
        if isinstance(obj, BaseListVariable) and fn.name in ("index", "count") \
                and all(a.is_constant() for a in args) and obj.is_constant():
            return ConstantVariable(getattr(obj.as_example(), fn.name)(*[a.as_example() for a in args]))
        raise self.unsupported(f"method .{fn.name}() of {obj.describe()}",
                               "mutating or calling methods of Python containers is not "
                               "modelled yet")

    def call_module(self, mv: NNModuleVariable, args, kwargs) -> VariableTracker:
        """module(*args, **kwargs): the __call__ of its class where the class has its own (a
        Hugging Face layer's, which checkpoints it; guarded), else as Module.__call__ makes it."""
        call = class_attr(type(mv.module), "__call__")
        if not self.output.inline_user_calls and torch_container(mv.module):
            raise self.unsupported(f"call to {type(mv.module).__name__} from a frame that runs eagerly",
                                   "a container of torch.nn's: compiled on its own")
        if call in MODULE_CALLS:
            return self.module_call(mv, args, kwargs)
        if not isinstance(call, types.FunctionType):
            raise self.unsupported(f"{type(mv.module).__name__}.__call__ is not a Python function")
        self.class_member(type(mv.module), "__call__")
        return self.inline_call(call, [mv] + list(args), kwargs)

    def module_call(self, mv: NNModuleVariable, args, kwargs) -> VariableTracker:
        """module(*args, **kwargs) as Module.__call__ makes it: its forward pre-hooks, its
        forward, its forward hooks (each hook inlined, with what it is given in eager)."""
        mod, everyone = mv.module, torch.nn.modules.module
        if type(mod).__module__ in _DISTRIBUTED_WRAPPERS:
            raise self.unsupported(f"call to {type(mod).__name__}",
                                   "torch.distributed's wrapper communicates in its forward: it is "
                                   "called for real, the module it wraps compiled on its own")
        if everyone._global_forward_hooks or everyone._global_forward_pre_hooks:
            raise self.unsupported(f"call to {type(mod).__name__} with global forward hooks",
                                   "hooks registered for every module are not inlined")
        if mod._backward_hooks or mod._backward_pre_hooks or everyone._global_backward_hooks or \
                everyone._global_backward_pre_hooks:
            raise self.unsupported(f"call to {type(mod).__name__} with backward hooks",
                                   "a backward hook runs in autograd's backward, which the "
                                   "compiled backward does not call")
        pre, post = mod._forward_pre_hooks, mod._forward_hooks
        if (pre or post) and mv.source is None:
            raise self.unsupported(f"call to {type(mod).__name__} made in the trace, with forward hooks")
        if mv.source is not None:
            self.output.guards.forward_hooks(mv.source, mod)
        args = list(args)
        for key, hook in pre.items():
            hook = self.output.wrap(hook, ItemSource(AttrSource(mv.source, "_forward_pre_hooks"), key))
            if key in mod._forward_pre_hooks_with_kwargs:
                got = self.call_function(hook, [mv, TupleVariable(args), DictVariable(kwargs)], {})
                if not _is_none(got):
                    if not (isinstance(got, TupleVariable) and len(got.items) == 2
                            and isinstance(got.items[1], DictVariable)):
                        raise self.unsupported("a forward pre-hook with kwargs that returns other "
                                               "than (args, kwargs)")
                    args, kwargs = list(self.iterate(got.items[0])), dict(got.items[1].items)
            else:
                got = self.call_function(hook, [mv, TupleVariable(args)], {})
                if not _is_none(got):
                    args = list(got.items) if isinstance(got, TupleVariable) else [got]
        result = self.call_forward(mv, args, kwargs)
        for key, hook in post.items():
            hook = self.output.wrap(hook, ItemSource(AttrSource(mv.source, "_forward_hooks"), key))
            given = [mv, TupleVariable(args)] + ([DictVariable(kwargs)] if key in mod._forward_hooks_with_kwargs else [])
            got = self.call_function(hook, given + [result], {})
            if not _is_none(got):
                result = got
        return result

    def call_forward(self, mv: NNModuleVariable, args, kwargs) -> VariableTracker:
        """The module's forward, inlined (its instance's own where it has one)."""
        mod = mv.module
        if "forward" in mod.__dict__:          # replaced on the instance: that one runs
            return self.call_function(self.load_module_attr(mv, "forward"), args, kwargs)
        if mv.source is not None:
            self.output.guards.class_forward(mv.source)
        if type(mod) is torch.nn.Sequential and not kwargs and len(args) == 1:
            # Sequential.forward is a loop over children; unrolled here (which children there
            # are is guarded)
            x = args[0]
            for name in self.output.members(mv):
                x = self.call_function(self.load_module_attr(mv, name), [x], {})
            return x
        forward = self.class_member(type(mod), "forward")
        if forward is not None and type(mod).__module__.startswith("torch."):
            # torch's classes are trusted but for forward, which libraries replace on the
            # class (LoRA and quantization patch nn.Linear.forward)
            self.output.guards.class_member(type(mod), "forward", forward)
        if not isinstance(forward, types.FunctionType):
            raise self.unsupported(f"{type(mod).__name__}.forward is not a Python function")
        return self.inline_call(forward, [mv] + list(args), kwargs)

    def break_at_optimizer_step(self, fn) -> None:
        """`opt.step()` is not traced into torch.optim's code: the graph breaks at the call,
        and the call at the break runs minicompile's compiled step (optim.py)."""
        real = getattr(fn.self_var, "value", None) if isinstance(fn, BoundMethodVariable) else fn.value
        if isinstance(fn, BoundMethodVariable) and isinstance(real, torch.optim.Optimizer):
            real = types.MethodType(fn.func, real)
        opt = optim.step_method(real)
        if opt is not None:
            raise self.unsupported(f"{type(opt).__name__}.step()",
                                   "the optimizer step runs as its own compiled graph (minicompile/optim.py)")

    def variables_of(self, tensor: TensorVariable) -> List[TensorVariable]:
        """The tensor variables on the stacks and in the locals of this frame and those it is
        inlined in (in their lists, tuples and dicts too) that stand for `tensor`'s object."""
        found, tx, seen = [], self, set()
        while tx is not None:
            todo = list(tx.stack) + list(tx.locals.values())
            while todo:
                v = todo.pop()
                if id(v) in seen:
                    continue
                seen.add(id(v))
                if isinstance(v, TensorVariable) and v.identity() is tensor:
                    found.append(v)
                elif isinstance(v, BaseListVariable):
                    todo += v.items
                elif isinstance(v, DictVariable):
                    todo += list(v.items.values())
            tx = tx.parent
        return found

    def update_wrapper(self, wrapper: NestedFunctionVariable, wrapped: VariableTracker,
                       assigned: VariableTracker = None, updated: VariableTracker = None) -> VariableTracker:
        """functools.update_wrapper (functools.wraps) on a function made in the frame: the
        wrapped one's name, doc... become the wrapper's attributes, as Python sets them; what
        the wrapped one's __dict__ holds is read through it when the wrapper's is asked for."""
        names = functools.WRAPPER_ASSIGNMENTS if assigned is None else assigned.as_example()
        updates = functools.WRAPPER_UPDATES if updated is None else updated.as_example()
        if tuple(updates) not in ((), ("__dict__",)):
            raise self.unsupported(f"functools.update_wrapper updating {updates}")
        self.output.record_mutation(wrapper)
        for name in names:
            try:
                wrapper.items[name] = self.load_attr(wrapped, name)
            except ObservedException:
                pass                                    # (Python skips what it lacks)
        if updates:
            wrapper.dict_of = wrapped
        wrapper.items["__wrapped__"] = wrapped
        return wrapper

    def tensor_check(self, fn, args, kwargs) -> Optional[VariableTracker]:
        """torch._check_tensor_all(cond), _check_tensor_all_with(error_type, cond) or
        torch._assert_async(cond, msg), on a bool tensor of the trace: a check in the graph
        (custom_ops.check), where its `.item()` would break the graph. It raises torch's error
        with torch's message; with a message of the caller's (a function, called on failure
        only, or _assert_async's text) or another error type, the frame runs again as Python
        where it fails (RaisingPathTaken), and raises what eager does. None where the call is
        not such (torch's code is traced then)."""
        if fn is torch._assert_async:         # (cond, msg=None): a C function, no signature
            if kwargs or not 1 <= len(args) <= 2:
                return None
            bound = {"cond": args[0], "message": args[1] if len(args) > 1 else None}
        else:
            try:
                bound = inspect.signature(fn).bind(*args, **kwargs).arguments
            except TypeError:
                return None
        cond, message = bound.get("cond"), bound.get("message") or ConstantVariable(None)
        error = bound["error_type"].as_example() if "error_type" in bound else RuntimeError
        if not (isinstance(cond, TensorVariable) and cond.example.dtype == torch.bool
                and not self.output.written_inputs):     # (as Translator.branch_to_raise)
            return None
        if fn is torch._assert_async and cond.example.numel() != 1:
            return None                      # (eager's own error: a value of several elements)
        exact = fn is not torch._assert_async and isinstance(message, ConstantVariable) and \
            message.value is None and custom_ops.CHECK_ERRORS.get(getattr(error, "__name__", None)) is error
        self.output.call("call_function", custom_ops.check, [
            cond, ConstantVariable(error.__name__ if exact else custom_ops.RaisingPathTaken.__name__),
            ConstantVariable(TORCH_CHECK_MESSAGE if exact else None)], {})
        return ConstantVariable(None)

    def inline_call(self, func: types.FunctionType, args: List[VariableTracker],
                    kwargs: Dict[str, VariableTracker], closure_cells=None, markers=None) -> VariableTracker:
        code = func.__code__
        name = func.__qualname__
        disabled = never_traced(func)
        if disabled is not None:
            raise self.unsupported(f"call to {name}: {disabled}",
                                   "a function marked as never traced runs as Python")
        if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                            inspect.CO_ITERABLE_COROUTINE):
            raise self.unsupported(f"call to coroutine function {name}")
        if self.depth + 1 > MAX_INLINE_DEPTH:
            raise self.unsupported(f"call to {name}: inlining depth limit {MAX_INLINE_DEPTH}")
        sig = code_signature(func)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise self.unsupported(f"call to {name}: {e}")
        bound.apply_defaults()
        fn_source = self.function_source(func) if markers is None else None
        locals_: Dict[str, VariableTracker] = {}
        for pname, value in bound.arguments.items():
            kind = sig.parameters[pname].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                value = TupleVariable([v for v in value])
            elif kind is inspect.Parameter.VAR_KEYWORD:
                value = DictVariable(dict(value))
            elif markers and id(value) in markers:             # a default made in the trace
                value = markers[id(value)]
            elif not isinstance(value, VariableTracker):      # a default value
                value = self.output.wrap(value, _default_source(func, fn_source, pname, value))
            if pname.startswith("implicit") and "." + pname[8:] in code.co_varnames:
                pname = "." + pname[8:]           # inspect renames a comprehension's .0
            locals_[pname] = value
        glob_name = func.__globals__.get("__name__", "")
        gsrc = None
        if _is_internal_module_name(glob_name):
            gsrc = None
        elif func.__globals__ is self.output.root_globals:
            gsrc = RootSource("G")             # the called function's globals, read per call
        else:
            gsrc = self.output.root_source(func.__globals__, "G_" + glob_name)
        child = type(self)(self.output, func, locals_, {}, parent=self, globals_source=gsrc,
                                      closure_cells=closure_cells)
        if code.co_flags & inspect.CO_GENERATOR:
            # a generator: its frame runs when items are asked for (iterators.py)
            child.generator = True
            return GeneratorVariable(child)
        return child.run()

    def function_source(self, func: types.FunctionType):
        """The user's function the trace inlines, held by the guard, whose code and defaults are
        guarded: they can be replaced on the function itself, which its identity does not show.
        None for torch's own (trusted, as their globals)."""
        if _is_internal_module_name(func.__globals__.get("__name__", "")):
            return None
        source = self.output.root_source(func, f"FN_{func.__name__}")
        self.output.guards.identity(AttrSource(source, "__code__"), func.__code__, "code")
        if func.__defaults__ is not None:
            self.output.guards.identity(AttrSource(source, "__defaults__"), func.__defaults__, "defaults")
        return source

    def inline_nested(self, fn: NestedFunctionVariable, args, kwargs) -> VariableTracker:
        code = fn.code
        markers = {}

        def mark(v):
            m = object()
            markers[id(m)] = v
            return m
        defaults = tuple(mark(v) for v in self.unpack(fn.defaults)) if fn.defaults is not None else None
        closure_vals = list(fn.closure.items) if fn.closure is not None else []
        func = types.FunctionType(code, fn.f_globals, code.co_name, defaults,
                                  tuple(types.CellType() for _ in code.co_freevars) or None)
        if fn.kwdefaults is not None:
            func.__kwdefaults__ = {k: mark(v) for k, v in fn.kwdefaults.items.items()}
        cells = dict(zip(code.co_freevars, closure_vals))
        return self.inline_call(func, args, kwargs, closure_cells=cells, markers=markers)

    def call_with_stack_layout(self, argc: int, kw_names: Tuple[str, ...]):
        """CALL's operands: [NULL, callable, args] / [callable, self, args] on 3.11-3.12,
        [callable, NULL, args] / [callable, self, args] on 3.13."""
        args = self.popn(argc)
        a, b = self.popn(2)
        if self.version >= (3, 13):
            fn, self_or_null = a, b
            if not isinstance(self_or_null, NullVariable):
                args = [self_or_null] + args
        else:
            if isinstance(a, NullVariable):
                fn = b
            else:
                fn, args = a, [b] + args
        nkw = len(kw_names)
        kwargs = dict(zip(kw_names, args[len(args) - nkw:])) if nkw else {}
        pos = args[:len(args) - nkw] if nkw else args
        self.push(self.call_function(fn, pos, kwargs))

    # super(): zero-argument (3.11: a call of `super`; 3.12+: LOAD_SUPER_ATTR) and two-argument
    def make_super(self, args) -> "SuperVariable":
        if args:
            if len(args) != 2 or not isinstance(args[0], TypeVariable):
                raise self.unsupported("super() with unusual arguments")
            return SuperVariable(args[0].value, args[1])
        cell = self.freevars.get("__class__")
        if cell is None or not self.code.co_argcount:
            raise self.unsupported("super() outside a method")
        return SuperVariable(cell.cell_contents, self.load_local(self.code.co_varnames[0]))

    def call_special(self, obj: VariableTracker, name: str, args) -> Optional[VariableTracker]:
        """obj.__name__(*args) for an object of a Python class (`obj[k]`, `len(obj)`, `k in obj`):
        its class's method inlined, or a builtin container's reading method (ContainerRead);
        None where there is neither."""
        if not isinstance(obj, UserObjectVariable):
            return None
        attr = self.class_member(type(obj.value), name)
        read = ContainerReadVariable.of(obj, attr)
        if read is not None:
            return read.call(self, args, {})
        if isinstance(attr, types.FunctionType):
            return self.inline_call(attr, [obj] + list(args), {})
        return None


def _enum_member(cls: enum.EnumMeta, value):
    """The member of cls whose value is `value` (hashable), as Enum's own lookup finds it before
    it asks _missing_; None where there is none."""
    if type(value) is cls:                              # Color(Color.RED)
        return value
    try:
        return cls._value2member_map_.get(value)
    except TypeError:
        return None


class _StandIns:
    """Plain objects standing for variables, for Python's own argument binding to move
    about (inspect.Signature.bind, BoundArguments.args); the tuples and dicts that binding
    makes (*args, **kwargs) come back as new variables, any other stand-in as its variable."""

    def __init__(self):
        self._vars: dict = {}                             # id(stand-in) -> (stand-in, variable)

    def of(self, v: VariableTracker):
        marker = object()
        self._vars[id(marker)] = (marker, v)
        return marker

    def of_packed(self, v: VariableTracker):
        """The stand-ins of a parameter's *args tuple or **kwargs dict, packed as Python's."""
        if isinstance(v, TupleVariable):
            return tuple(self.of(i) for i in v.items)
        if isinstance(v, DictVariable):
            return {k: self.of(i) for k, i in v.items.items()}
        return self.of(v)

    def back(self, value) -> VariableTracker:
        if isinstance(value, tuple):
            return TupleVariable([self.back(v) for v in value])
        if isinstance(value, dict):
            return DictVariable({k: self.back(v) for k, v in value.items()})
        return self._vars[id(value)][1]


def _deep_copied(v: VariableTracker, memo: dict, guards) -> Optional[VariableTracker]:
    """copy.deepcopy of lists and dicts of constants made or read in the trace: new containers
    (sharing and cycles kept, as deepcopy's memo keeps them), the same immutable constants; a
    set of constants read from outside (a config's ignore_keys_at_rope_validation) a new set
    of them, its items guarded. None where it holds anything else."""
    if id(v) in memo:
        return memo[id(v)]
    if isinstance(v, SetVariable):
        made = memo[id(v)] = SetVariable.made_by(copy.deepcopy, v.make())     # (its items guarded)
        return made
    if v.is_constant() and type(v) not in (ListVariable, DictVariable):
        return v
    if type(v) is ListVariable:
        made = memo[id(v)] = ListVariable([])
        for item in v.items:
            made.items.append(_deep_copied(item, memo, guards))
        return made if None not in made.items else None
    if type(v) is DictVariable:
        made = memo[id(v)] = DictVariable({}, cls=v.cls, factory=v.factory)
        for k, item in v.items.items():
            made.items[k] = _deep_copied(item, memo, guards)
        return made if None not in made.items.values() else None
    if isinstance(v, UserObjectVariable) and type(v.value) is set and v.source is not None and not v.items \
            and all(is_constant_value(x) for x in v.value):
        items = set(v.value)
        guards.constant(v.source, items)
        made = memo[id(v)] = SetVariable.made_by(copy.deepcopy, items)
        return made
    return None

