"""The instruction translator: one frame's bytecode, run on symbolic values.

Takes: a function (the root frame, or one inlined into it), its arguments as VariableTrackers,
the OutputGraph. Hands on: the frame's return value as a VariableTracker, the graph filled in;
or, in the root frame, a `GraphBreak` at the first instruction that cannot be traced (the graph
rolled back to before it, including what an inlined call added).

How it works (the same scheme as TorchDynamo's InstructionTranslator): a value stack and a
dict of locals holding VariableTrackers instead of Python objects; one handler per opcode
(instructions.py), registered for the Python versions whose bytecode it models; calls are
calls.py's. Tensors are TensorVariables: an fx.Proxy plus the real value computed by running
the op on the real example inputs as the trace goes (Dynamo runs fake tensors). Control flow on
Python values and sizes is followed (loops unrolled, the instruction budget bounded).
"""
from __future__ import annotations

import abc
import builtins
import collections.abc
import enum
import functools
import inspect
import math
import operator
import re
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.fx

from .. import aliasing, autocast, config, custom_ops
from .breaks import GraphBreak, ObservedException, Return, Unsupported, Yield, source_line
from .bytecode import (BINARY_OPS, COMPARE_OPS, Instruction, current_version, decode, dispatch_table,
                       handler_at)
from .sources import (AttrSource, ClosureCellSource, ItemSource, LocalSource, Source,
                      module_member_source)
from .builtin_calls import (_BUILTIN_HANDLERS, ContainerReadVariable, _builtin_type, _constant_state, is_distribution,
                            _custom_getattr, _is_none, attr_source, class_attr, python_method)
from .output_graph import (FLOAT_ARITHMETIC, SIZE_ARITHMETIC, TENSOR_CONSTANT_ATTRS, TENSOR_TENSOR_ATTRS, _MISSING,
                           OutputGraph, _is_internal_module_name)
from .values import (DELETED, NULL, BaseListVariable, BoundArgumentsVariable, BoundMethodVariable, BuiltinVariable,
                     InferenceModeVariable, WeakRefVariable,
                     CallableVariable, ClosureCellVariable, ConstantMethodVariable, ConstantVariable,
                     DictVariable, DictViewVariable, ExceptionInitVariable, ExceptionVariable,
                     GeneratorVariable, GradModeVariable,
                     IteratorVariable,
                     LazyIteratorVariable, ListVariable, ModuleSliceVariable,
                     ModelOutputVariable, NamedTupleVariable, NestedFunctionVariable,
                     NNModuleVariable, NullVariable, ObjectMethodVariable, OpaqueConstantVariable,
                     PartialVariable, PythonModuleVariable,
                     SetVariable, SizeVariable, SliceVariable, SuperVariable, SymIntVariable, TensorMethodVariable,
                     TensorVariable, example_of,
                     TorchFunctionVariable, TupleVariable, TypeVariable, UserFunctionVariable,
                     UserObjectVariable, VariableTracker, _constant_result, _DictFromKeys,
                     _NoOpCallable, _MakeInstance, _UnboundConstantMethod, _UnboundTensorMethod, is_constant_value, dict_key, NO_KEY, key_example,
                     key_variable, is_typing_form)
from .calls import CallsMixin
from .iterators import ITERATORS, drain, user_iter
from . import instructions  # noqa: F401  (registers the opcode handlers)
from .instructions import identical




# ----------------------------------------------------------------------------------------
# The interpreter: one instance per (inlined) frame
# ----------------------------------------------------------------------------------------


# descriptors whose __get__ only reads (a __slots__ member, an instance's __dict__, an Enum
# member's name and value, a C method bound): read for real by the trace and by the guard. A
# Python descriptor's __get__ may do anything, and would run in the guard on every call: a
# graph break instead
_PURE_DESCRIPTORS = (types.MemberDescriptorType, types.GetSetDescriptorType, types.DynamicClassAttribute,
                     types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType)


class InstructionTranslator(CallsMixin):
    def __init__(self, output: OutputGraph, func: types.FunctionType,
                 locals_: Dict[str, VariableTracker], lazy_locals: Dict[str, Tuple[Any, Source]],
                 parent: Optional["InstructionTranslator"] = None, globals_source: Optional[Source] = None,
                 closure_cells: Optional[Dict[str, VariableTracker]] = None, code=None):
        self.output = output
        self.func = func
        self.code: types.CodeType = code if code is not None else func.__code__
        self.f_globals = func.__globals__ if func is not None else None
        self.globals_source = globals_source
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.instructions, self.offset_to_index = decode(self.code)
        self.dispatch = dispatch_table()
        self.version = current_version()
        self.stack: List[VariableTracker] = []
        self.locals: Dict[str, VariableTracker] = dict(locals_)
        self.lazy_locals = dict(lazy_locals)
        self.pc = 0
        self.current: Optional[Instruction] = None
        self.kw_names: Tuple[str, ...] = ()
        self.return_value: Optional[VariableTracker] = None
        # free variables: name -> cell (read through its contents, guarded like a global)
        self.freevars = dict(zip(self.code.co_freevars, (func.__closure__ or ()) if func is not None else ()))
        # free variables of a function made inside the trace: CellVariables
        self.closure_cells: Dict[str, VariableTracker] = dict(closure_cells or {})
        # open `with` blocks (a break inside: resumed in a grad mode's or autocast's only)
        self.with_depth = 0
        self.generator = False                # a generator's frame: it yields (iterators.py)
        self.exc_info: Optional[VariableTracker] = None   # the exception being handled

    # -- where we are (for error messages and node meta) ---------------------------------
    def location(self):
        lineno = self.current.lineno if self.current is not None else self.code.co_firstlineno
        if lineno is None:
            lineno = self.code.co_firstlineno
        return (self.code.co_filename, lineno, source_line(self.code.co_filename, lineno))

    def full_stack(self):
        frames = []
        tx = self
        while tx is not None:
            f, l, t = tx.location()
            frames.append((f, l, t, tx.code.co_name))
            tx = tx.parent
        return frames[::-1]

    def under_handler(self) -> bool:
        """Whether this frame, or a frame inlined into, catches what the current instruction
        raises (its code object's exception table covers the instruction: a try or with body)."""
        tx = self
        while tx is not None:
            if tx.current is not None and handler_at(tx.code, tx.current.offset) is not None:
                return True
            tx = tx.parent
        return False

    def user_stack(self):
        return [(f, l, t) for f, l, t, _ in self.full_stack()]

    def unsupported(self, reason, explanation="", hint="") -> Unsupported:
        return Unsupported(reason, explanation, hint, self.user_stack())

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> VariableTracker:
        prev_tx = self.output.tx
        self.output.tx = self
        out = self.output
        out.running.append(self)
        root = self.parent is None and out.breaks_allowed
        try:
            while True:
                inst = self.instructions[self.pc]
                self.current = inst
                self.pc += 1
                out.instruction_budget -= 1
                if out.instruction_budget < 0:
                    raise self.unsupported("too many instructions (an unrolled loop that does "
                                           "not end on Python values?)")
                handler = self.dispatch.get(inst.opname)
                if root:
                    # what a graph break at this instruction needs: the stack before it, and a
                    # checkpoint to roll the graph back to (an inlined call may have added nodes)
                    stack_before = list(self.stack)
                    kw_before = self.kw_names
                    undo_mark, effects_before = len(out.undo_log), len(out.side_effects)
                    guards_mark = out.guards.mark()
                    grad_before = torch.is_grad_enabled()
                    inference_depth = len(out.inference_guards)
                    nodes_before = set(out.graph.nodes) if inst.opname.startswith("CALL") else None
                try:
                    if handler is None:
                        raise self.unsupported(
                            f"opcode {inst.opname}" + (f" ({inst.argrepr})" if inst.argrepr else ""),
                            f"minicompile's capture has no handler for {inst.opname} on Python "
                            f"{self.version[0]}.{self.version[1]}")
                    try:
                        handler(self, inst)
                    except ObservedException as e:
                        self.handle_exception(e.exc)      # this frame's handler, or out of it
                    except (Return, Yield, Unsupported, GraphBreak):
                        raise
                    except Exception as e:
                        err = self.unsupported(
                            f"internal error while tracing {inst.opname}: {type(e).__name__}: {e}",
                            "minicompile could not model this instruction")
                        # the trace's own state may be what is wrong: never run the
                        # instruction for real from it (trace_segment skips the segment)
                        err.internal = True
                        raise err from e
                except Unsupported as e:
                    if not root:
                        raise
                    out.rollback(undo_mark)
                    del out.side_effects[effects_before:]    # (their changes are undone)
                    out.guards.drop_since(guards_mark)
                    out.leave_inference_mode(inference_depth)
                    torch._C._set_grad_enabled(grad_before)
                    if nodes_before is not None:
                        for node in reversed(list(out.graph.nodes)):
                            if node not in nodes_before and node.op != "placeholder" and not node.users:
                                out.graph.erase_node(node)
                    self.stack = stack_before
                    self.kw_names = kw_before
                    self.current = inst
                    raise GraphBreak(e, inst, stack_before, kw_before, self) from None
        except Return:
            return self.return_value
        finally:
            self.output.tx = prev_tx
            out.running.pop()

    # -- exceptions the traced code raises and catches ------------------------------------
    def handle_exception(self, exc: VariableTracker) -> None:
        """The instruction running raised `exc`: go to this frame's handler for it (the code
        object's exception table, as CPython unwinds: the stack cut to the handler's depth,
        the instruction's offset pushed where it asks, then the exception), or raise it out of
        the frame, to the frame that called this one."""
        if getattr(exc, "raised_at", None) is None:       # (the innermost frame sees it first)
            exc.raised_at = self.full_stack()
        entry = handler_at(self.code, self.current.offset)
        if entry is None:
            raise ObservedException(exc)
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(ConstantVariable(self.current.offset))
        self.push(exc)
        self.pc = self.offset_to_index[entry.target]

    def handled_exception(self) -> Optional[VariableTracker]:
        """The exception being handled here, or in a caller this frame runs inside (an
        `except` block that called it, a `with` whose __exit__ it is), as sys.exc_info() sees."""
        tx = self
        while tx is not None and tx.exc_info is None:
            tx = tx.parent
        return tx.exc_info if tx is not None else None

    def make_exception(self, v: VariableTracker) -> ExceptionVariable:
        """What `raise v` raises: v, or v() of an exception class."""
        if isinstance(v, TypeVariable) and isinstance(v.value, type) and issubclass(v.value, BaseException):
            v = self.call_function(v, [], {})
        if not isinstance(v, ExceptionVariable):
            raise self.unsupported(f"raise {v.describe()}")
        return v

    def observed(self, error: "BaseException | ExceptionVariable") -> ObservedException:
        """`error`, which Python raises for what the traced code does (a missing key or
        attribute, 1 // 0), as an exception of the traced code: its handlers see it. Raised
        while another is handled, that one is its __context__, as in Python."""
        exc = error if isinstance(error, ExceptionVariable) else ExceptionVariable.of(error)
        handled = self.handled_exception()
        if handled is not None:
            exc.items["__context__"] = handled
        return ObservedException(exc)

    # -- stack helpers ------------------------------------------------------------------
    def push(self, v: VariableTracker):
        self.stack.append(v)

    def pop(self) -> VariableTracker:
        return self.stack.pop()

    def popn(self, n: int) -> List[VariableTracker]:
        if n == 0:
            return []
        vals = self.stack[-n:]
        del self.stack[-n:]
        return vals

    def jump_to(self, inst: Instruction):
        # loops are unrolled: a backward jump is followed like any other
        self.pc = self.offset_to_index[inst.argval]

    # -- building blocks used by handlers -------------------------------------------------
    def load_local(self, name: str) -> VariableTracker:
        if name in self.locals:
            return self.locals[name]
        if name in self.lazy_locals:
            value, source = self.lazy_locals.pop(name)
            var = self.output.wrap(value, source)
            self.locals[name] = var
            return var
        raise self.observed(UnboundLocalError(
            f"cannot access local variable '{name}' where it is not associated with a value"))

    def load_global(self, name: str) -> VariableTracker:
        written = self.output._global_writes.get(id(self.f_globals))
        if written is not None and name in written.items:         # assigned earlier in the trace
            if written.items[name] is DELETED:
                raise self.unsupported(f"global name {name!r} is not defined (deleted in the trace)")
            return written.items[name]
        if name in self.f_globals:
            src = ItemSource(self.globals_source, name) if self.globals_source is not None else None
            return self.output.wrap(self.f_globals[name], src)
        b = self.f_globals.get("__builtins__", builtins)
        b = b.__dict__ if isinstance(b, types.ModuleType) else b
        if name in b:
            if self.globals_source is not None:    # a global of that name would hide it (`len = ...`)
                self.output.guards.has_key(self.globals_source, name, False)
                # and the builtin is the same (`builtins.print = ...`, mock.patch("builtins.open"))
                self.output.guards.identity(ItemSource(self.output.root_source(b, "BUILTINS"), name), b[name],
                                            "builtin")
            return self.output.wrap(b[name], None)
        if self.globals_source is not None:        # (defined later: the name is then found)
            self.output.guards.has_key(self.globals_source, name, False)
        raise self.observed(NameError(f"name '{name}' is not defined"))

    def store_global(self, name: str, value: VariableTracker) -> None:
        """`global name; name = value` (DELETED: `del name`): made on the real globals after
        the graph, as Dynamo replays it; later reads in the trace see it."""
        if self.globals_source is None:
            raise self.unsupported(f"assignment to global {name!r} of torch's own code")
        if value is DELETED:
            self.load_global(name)          # NameError where it is not there (guarded where it is)
        var = self.output.global_writes(self.f_globals, self.globals_source)
        self.output.record_mutation(var)
        var.items[name] = value
        self.output.add_side_effect(var)

    def closure_cell(self, name: str) -> ClosureCellVariable:
        """The real cell of free variable `name` of this frame's function (one variable per
        cell, however many functions the trace reaches it through)."""
        cell = self.freevars[name]
        var = self.output.cells.get(id(cell))
        if var is None:
            source = contents = None
            if self.parent is None:
                # the captured frame's own closure: the called function's cells (F.__closure__),
                # its value as `L[name]` (Dynamo's spelling), so two closures of one function
                # are told apart
                index = self.code.co_freevars.index(name)
                source, contents = ClosureCellSource(index), LocalSource(name)
                self.output.guards.freevars[name] = index
            elif not _is_internal_module_name(self.f_globals.get("__name__", "")):
                # an inlined function's: it was guarded by identity, so its cells are its own
                source = self.output.root_source(cell, f"CELL_{name}")
                contents = AttrSource(source, "cell_contents")
            var = self.output.cells[id(cell)] = ClosureCellVariable(cell, source, contents)
        return var

    def read_cell(self, var: ClosureCellVariable, name: str) -> VariableTracker:
        if "cell_contents" in var.items:               # written earlier in the trace
            return var.items["cell_contents"]
        try:
            value = var.cell.cell_contents
        except ValueError:
            raise self.unsupported(f"free variable {name!r} referenced before assignment")
        return self.output.wrap(value, var.contents_source)

    def write_cell(self, var: ClosureCellVariable, name: str, value: VariableTracker) -> None:
        """`nonlocal name; name = value` on a real cell: made on it after the graph."""
        if var.source is None:
            raise self.unsupported(f"assignment to free variable {name!r} of torch's own code")
        self.output.record_mutation(var)
        var.items["cell_contents"] = value
        self.output.add_side_effect(var)

    def unpack_tensor(self, t: TensorVariable, n: int) -> List[VariableTracker]:
        if t.example.dim():
            # the length of its first dim is all the unpacking reads (`q, k, v = qkv`): that
            # size is made static, the others stay as they are
            length = self.output.size_of(t, 0)
            if isinstance(length, SymIntVariable):
                length.as_example()
        if t.example.dim() == 0 or len(t.example) != n:
            raise self.unsupported(f"unpacking a tensor of shape {tuple(t.example.shape)} into {n}")
        return [self.output.call("call_function", operator.getitem, [t, ConstantVariable(i)], {})
                for i in range(n)]

    def iterate(self, v: VariableTracker) -> List[VariableTracker]:
        """The items a for loop over `v` sees (all known: loops are unrolled); an iterator's
        remaining ones, taken from it."""
        if isinstance(v, ITERATORS):
            return drain(self, v)
        if isinstance(v, DictViewVariable):
            return v.items_now()
        if isinstance(v, NNModuleVariable):
            mod = v.module
            if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
                return [self.load_module_attr(v, k) for k in self.output.members(v)]
            if isinstance(mod, torch.nn.ModuleDict):
                return [ConstantVariable(k) for k in self.output.members(v)]
            if isinstance(mod, (torch.nn.ParameterList,)):
                return [self.load_module_attr(v, k) for k in self.output.members(v, "_parameters")]
            if isinstance(mod, torch.nn.ParameterDict) and list(mod) == list(self.output.members(v, "_parameters")):
                return [ConstantVariable(k) for k in mod]                 # its keys, in order
            raise self.unsupported(f"iterating over {type(mod).__name__}")
        if isinstance(v, TypeVariable) and isinstance(v.value, enum.EnumMeta):
            return [self.output.wrap(member, None) for member in v.value]
        if isinstance(v, ConstantVariable) and isinstance(v.value, (str, dict, frozenset, set)) or \
                isinstance(v, OpaqueConstantVariable):
            return [_constant_result(v, x) for x in v.value]
        if isinstance(v, UserObjectVariable) and \
                class_attr(type(v.value), "__iter__") is collections.abc.Sequence.__iter__:
            # Sequence's own iteration: self[0], self[1]... up to its len()
            n = self.call_special(v, "__len__", [])
            if n is None or not n.is_constant():
                raise self.unsupported(f"iterating over {v.describe()}: no constant length")
            return [self.call_special(v, "__getitem__", [ConstantVariable(i)]) for i in range(n.as_example())]
        if isinstance(v, UserObjectVariable) and v.source is not None and type(v.value) in (set, frozenset) \
                and all(is_constant_value(x) for x in v.value):
            # a set of constants read from outside (a class's expected keys): its items
            self.output.guards.set_items(v.source, v.value)
            return [ConstantVariable(x) for x in v.value]
        if isinstance(v, UserObjectVariable):
            it = user_iter(self, v)                   # its class's __iter__
            if it is not None:
                return drain(self, it)
            if v.source is not None and isinstance(v.value, (list, tuple)) and \
                    class_attr(type(v.value), "__iter__") in (list.__iter__, tuple.__iter__):
                # a list or tuple subclass read from outside the frame: its items
                self.output.guards.sequence(v.source, v.value)
                return [self.output.wrap(x, ItemSource(v.source, i)) for i, x in enumerate(v.value)]
        return self.unpack(v)

    def unpack(self, v: VariableTracker, n: Optional[int] = None) -> List[VariableTracker]:
        if isinstance(v, ITERATORS + (NNModuleVariable,)):
            items = self.iterate(v)
            self.check_unpacked(items, n)
            return items
        if isinstance(v, BaseListVariable):
            items = list(v.items)
        elif isinstance(v, ConstantVariable) and isinstance(v.value, (tuple, list, torch.Size, range)):
            items = [ConstantVariable(x) for x in v.value]
        elif isinstance(v, TensorVariable):
            items = self.unpack_tensor(v, n if n is not None else len(v.example))
        elif isinstance(v, DictVariable):
            items = [key_variable(k) for k in v.items]
        else:
            raise self.unsupported(f"unpacking {v.describe()}")
        self.check_unpacked(items, n)
        return items

    def check_unpacked(self, items, n: Optional[int]) -> None:
        if n is not None and len(items) > n:
            raise self.observed(ValueError(f"too many values to unpack (expected {n})"))
        if n is not None and len(items) < n:
            raise self.observed(ValueError(f"not enough values to unpack (expected {n}, got {len(items)})"))

    def on_constants(self, fn, *args, **kwargs):
        """fn (an operator, a method of a constant) run on Python values, as the traced code
        runs it: what it raises is the traced code's exception (1 // 0, int("x"))."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:           # noqa: BLE001 (Python's own exception of that code)
            raise self.observed(e) from None

    def read_attribute(self, value, name: str):
        """getattr(value, name) of a real object, as the traced code does it: an AttributeError
        is the traced code's (its handlers see it)."""
        try:
            return getattr(value, name)
        except AttributeError as e:
            raise self.observed(e) from None

    def truth(self, v: VariableTracker, opname: str) -> bool:
        if isinstance(v, SymIntVariable):
            # `if n:` of a size: n != 0, guarded as a comparison (true for every dynamic dim)
            answer = self.output.sym_compare(operator.ne, v, ConstantVariable(0))
            if answer is not None:
                return answer
        if isinstance(v, ConstantVariable):
            return bool(v.value)
        if isinstance(v, (BaseListVariable, DictVariable)):
            return bool(v.items)
        if isinstance(v, TensorVariable):
            raise self.unsupported(
                f"data-dependent branch ({opname} on a tensor)",
                "the branch taken depends on a tensor's values, which are not known while "
                "tracing: the graph so far is compiled, the branch runs in Python, and the code "
                "after it is compiled on its own (a graph break)",
                "use torch.where or torch.cond to keep one graph")
        if isinstance(v, (NNModuleVariable, UserObjectVariable)):
            # bool(obj): its class's __bool__, else its __len__ (an empty ModuleList is false)
            cls = type(v.as_example())
            for special in ("__bool__", "__len__"):
                if class_attr(cls, special) is None:
                    continue
                r = _BUILTIN_HANDLERS[len](self, [v], {}) if special == "__len__" else \
                    self.call_special(v, special, [])
                if r is None or not r.is_constant():
                    raise self.unsupported(f"truth value of {v.describe()} ({special})")
                if special == "__bool__" and type(r.as_example()) is not bool:
                    raise self.observed(TypeError(
                        f"__bool__ should return bool, returned {type(r.as_example()).__name__}"))
                return bool(r.as_example())
            return True
        if isinstance(v, (UserFunctionVariable, TorchFunctionVariable, NestedFunctionVariable,
                          IteratorVariable, PythonModuleVariable, TypeVariable, BuiltinVariable,
                          PartialVariable, BoundMethodVariable, GeneratorVariable, LazyIteratorVariable,
                          ExceptionVariable)):
            return True
        raise self.unsupported(f"truth value of {v.describe()}")

    # attribute access ------------------------------------------------------------------
    def load_attr(self, obj: VariableTracker, name: str, generic: bool = False) -> VariableTracker:
        """obj.name, as Python reads it. generic: as object.__getattribute__ reads it (what a
        class's own __getattribute__ calls), past that class's own."""
        out = self.output
        if isinstance(obj, TensorVariable):
            if name in TENSOR_CONSTANT_ATTRS:
                if name == "shape" and out.has_dynamic_inputs():
                    return out.shape_of(obj)
                if name == "is_leaf" and obj.source is not None:
                    # (an input's own: requires_grad is guarded, leafness too: w * 1 is none)
                    return out.wrap(obj.example.is_leaf, AttrSource(obj.source, name))
                return ConstantVariable(getattr(obj.example, name))
            if name in TENSOR_TENSOR_ATTRS:
                return out.call("call_function", getattr, [obj, ConstantVariable(name)], {})
            if name == "data":
                # the same memory, cut off from autograd: what detach() gives (writes through
                # it are ones autograd does not see, as functionalize.py takes a detach's)
                data = out.call("call_method", "detach", [obj], {})
                data.node.meta[aliasing.OWN_VERSION_COUNTER] = True
                return data
            if name == "__class__":
                return _builtin_type(self, [obj], {})      # type(x): guarded, or torch.Tensor
            if callable(getattr(torch.Tensor, name, None)):
                return TensorMethodVariable(obj, name)
            written = out.tensor_attribute_writes(obj.source, make=False) if obj.source is not None else None
            if written is not None and name in written.items:
                return written.items[name]          # (set earlier in the trace)
            if name == "grad" and obj.source is not None and obj.example.is_leaf:
                # a leaf's gradient from outside the frame (clip_grad_norm_ over parameters):
                # a graph input, or None, guarded as any
                return out.wrap(obj.example.grad, AttrSource(obj.source, "grad"))
            raise self.unsupported(f"tensor attribute .{name}")
        if name == "__class__" and isinstance(obj, GradModeVariable):
            return TypeVariable(torch.enable_grad if obj.enabled else torch.no_grad)
        if isinstance(obj, InferenceModeVariable) and name in ("__class__", "mode"):
            return TypeVariable(torch.inference_mode) if name == "__class__" else ConstantVariable(obj.mode)
        if name == "__class__":
            return _builtin_type(self, [obj], {})          # its type is guarded, or fixed
        if isinstance(obj, NNModuleVariable):
            return self.load_module_attr(obj, name)
        if isinstance(obj, BoundArgumentsVariable):
            return self.bound_arguments_attr(obj, name)
        if isinstance(obj, ModelOutputVariable):
            field = obj.field(name)
            if field is not None:
                return field
            if name in ("to_tuple", "keys", "values", "items", "get"):
                return ConstantMethodVariable(obj, name)
            raise self.unsupported(f"attribute .{name} of {obj.describe()}")
        if isinstance(obj, SuperVariable):
            return self.load_super_attr(obj, name)
        if isinstance(obj, NestedFunctionVariable):
            return self.nested_function_attr(obj, name)
        if isinstance(obj, ExceptionVariable):
            if name in obj.items:
                return obj.items[name]
            if name == "args":
                return TupleVariable(list(obj.args))
            if name == "__traceback__" and getattr(obj, "raised_at", None) is not None:
                raise self.unsupported("the traceback of an exception raised in the trace",
                                       "the trace has no frames to make one of")
            if name in ("__cause__", "__context__", "__traceback__"):
                return ConstantVariable(None)
            if name == "__class__":
                return self.output.wrap(obj.cls, None)
            if name in ("add_note", "with_traceback"):
                # (its C methods would run on a stand-in made from the class and args)
                raise self.unsupported(f"{obj.cls.__name__}.{name}() in the trace",
                                       "a change to an exception by its own methods is not modelled")
            attr = class_attr(obj.cls, name, _MISSING)
            found = self.class_attribute(obj, name, attr) if attr is not _MISSING and \
                not isinstance(attr, types.MemberDescriptorType) else None
            if found is not None:
                return found
            if obj.is_constant():             # what the class makes of its args (KeyError's, OSError's)
                return _constant_result(ConstantVariable(None), self.read_attribute(obj.as_example(), name))
            raise self.unsupported(f"attribute .{name} of {obj.describe()}")
        if isinstance(obj, PartialVariable) and name in ("func", "args", "keywords"):
            return {"func": obj.func, "args": TupleVariable(obj.args),
                    "keywords": obj.keywords_var}[name]
        if isinstance(obj, UserObjectVariable) and not generic and obj.snapshot is None and \
                python_method(type(obj.value), "__getattribute__") is not None:
            # (a private copy's own attribute logic runs on it for real, below)
            return self.user_getattribute(obj, name)
        if isinstance(obj, UserObjectVariable) and name == "__dict__" and obj.source is None \
                and obj.snapshot is None and DELETED not in obj.items.values() and \
                class_attr(type(obj.value), "__dict__") is not None:
            # an object made in the frame: its attributes, as a dict that is theirs (a write
            # through either is seen through the other; a distribution's `name in self.__dict__`)
            return DictVariable(obj.items)
        if isinstance(obj, UserObjectVariable):
            if obj.overrides.get(name) is DELETED:
                raise self.observed(AttributeError(
                    f"'{type(obj.value).__name__}' object has no attribute '{name}'"))
            if name in obj.overrides:
                return obj.overrides[name]
            value = obj.value
            if obj.snapshot is not None:
                static = class_attr(type(value), name, _MISSING)
                if isinstance(static, types.FunctionType):
                    return BoundMethodVariable(static, obj)
                if isinstance(static, property) and static.fget is not None and not _own_descriptor_methods(static):
                    return self.inline_call(static.fget, [obj], {})
                attr = self.read_attribute(value, name)
                if is_constant_value(attr):
                    return ConstantVariable(attr)
                if isinstance(attr, (dict, list, tuple)) and _constant_state(attr):
                    return out.wrap(attr, None)          # read only: a trace value of constants
                raise self.unsupported(f"attribute .{name} of a copied {type(value).__name__}: "
                                       f"a {type(attr).__name__}")
            own = out.instance_dict(obj)
            if own is not None and own in out.side_effects:       # written through obj.__dict__
                if name in own.items:
                    return own.items[name]
            else:
                d = _instance_dict(value)
                if d is not None and name in d and obj.source is not None:
                    return out.wrap(d[name], attr_source(obj, name))
            written = out.class_write(type(value), name)
            if written is not None:
                return written
            attr = class_attr(type(value), name, _MISSING)
            if obj.source is not None and not generic and _custom_getattr(type(value)) and \
                    python_method(type(value), "__getattr__") is None and not isinstance(
                    attr, (types.FunctionType, property, classmethod, staticmethod)):
                # its class decides what an attribute read returns, in C: read it as Python
                # does; the guard reads it the same way
                return out.wrap(self.read_attribute(value, name), AttrSource(obj.source, name))
            if attr is _MISSING:
                if obj.source is not None:                # the trace relies on it being absent
                    out.guards.lacks_attr(obj.source, name)
                fallback = python_method(type(value), "__getattr__")
                if fallback is not None and not generic:          # its class's __getattr__
                    return self.inline_call(fallback, [obj, ConstantVariable(name)], {})
                raise self.observed(AttributeError(
                    f"'{type(value).__name__}' object has no attribute '{name}'"))
            if name == "__new__" and attr is object.__new__:
                return ConstantVariable(object.__new__)       # (calls.py makes the instance)
            read = ContainerReadVariable.of(obj, attr)
            if read is not None:
                return read
            fallback = python_method(type(value), "__getattr__") if not generic else None
            try:
                found = self.class_attribute(obj, name, attr)
            except ObservedException as raised:
                # a property that raises AttributeError: Python calls the class's __getattr__
                if fallback is None or not (isinstance(raised.exc, ExceptionVariable)
                                            and issubclass(raised.exc.cls, AttributeError)):
                    raise
                return self.inline_call(fallback, [obj, ConstantVariable(name)], {})
            if found is not None:
                return found
            raise self.unsupported(f"attribute .{name} of {type(value).__name__}")
        if isinstance(obj, PythonModuleVariable):
            mod = obj.value
            written = out._global_writes.get(id(mod.__dict__))
            if written is not None and name in written.items and written.items[name] is not DELETED:
                return written.items[name]          # `global X; X = v` in a function of mod's
            hook = mod.__dict__.get("__getattr__")
            if name not in mod.__dict__ and written is None and isinstance(hook, types.FunctionType):
                # the module's own __getattr__ (PEP 562: a lazy attribute, a deprecated alias)
                # runs on every read, its effects with it: inlined, as a function of the module's
                out.guards.module_getattr(mod, name, hook)
                return self.inline_call(hook, [ConstantVariable(name)], {})
            if not hasattr(mod, name) or written is not None and written.items.get(name) is DELETED:
                if obj.source is not None and not hasattr(mod, name):     # (set later: then found)
                    if "__getattr__" in mod.__dict__:          # (one that is not a Python function)
                        out.guards.has_attr(obj.source, name, False)
                    else:
                        out.guards.module_lacks(obj.source, name)
                raise self.observed(AttributeError(f"module '{mod.__name__}' has no attribute '{name}'"))
            # reached from the user's globals (`F.relu`, `math.sqrt`), the attribute is guarded
            # even on torch's own modules: a user may replace it; torch's code reading its own
            # modules has no source (trusted)
            src = AttrSource(obj.source, name) if obj.source is not None else None
            value = getattr(mod, name)
            if src is None and mod in _PATCHED_NAMESPACES and callable(value) and not isinstance(value, type):
                # but for the functions of the namespaces users patch (`F.linear = ...`, which
                # nn.Linear's forward then calls; unittest.mock.patch("torch.sigmoid"))
                src = AttrSource(out.root_source(mod, mod.__name__), name)
            return out.wrap(value, src)
        if isinstance(obj, NamedTupleVariable):
            idx = obj.field_index(name)
            if idx is not None:
                return obj.items[idx]
            if name == "_fields" and hasattr(obj.tuple_cls, "_fields"):
                return ConstantVariable(obj.tuple_cls._fields)
            if not hasattr(obj.tuple_cls, name):
                raise self.observed(AttributeError(f"'{obj.tuple_cls.__name__}' object has no attribute '{name}'"))
        if isinstance(obj, ConstantVariable):
            attr = self.read_attribute(obj.value, name)      # (None.x: the code's AttributeError)
            if isinstance(attr, type):
                return self.output.wrap(attr, None)        # a class held as data (an annotation)
            if callable(attr) and not is_typing_form(attr):
                return ConstantMethodVariable(obj, name)
            return _constant_result(obj, attr)        # (Optional[T], callable, is data too)
        if isinstance(obj, (BaseListVariable, DictVariable)):
            cls = obj.python_type if isinstance(obj, BaseListVariable) else obj.cls
            if not hasattr(cls, name):             # (hasattr(a_list, "shape") is False)
                raise self.observed(AttributeError(f"'{cls.__name__}' object has no attribute '{name}'"))
            return ConstantMethodVariable(obj, name)
        if isinstance(obj, GeneratorVariable) and name in ("send", "__next__", "throw", "close"):
            return ConstantMethodVariable(obj, name)
        if isinstance(obj, (TypeVariable, BuiltinVariable)) and obj.value is dict and name == "fromkeys":
            return _DictFromKeys()
        if isinstance(obj, TypeVariable) and obj.value is object and name in ("__setattr__", "__getattribute__"):
            return ObjectMethodVariable(name)
        if isinstance(obj, (TorchFunctionVariable, UserFunctionVariable, TypeVariable)):
            if obj.value in (torch.Tensor,) and callable(getattr(torch.Tensor, name, None)):
                return _UnboundTensorMethod(name)
            if isinstance(obj, TypeVariable) and (not _torch_or_builtin(obj.value) or is_distribution(obj.value)
                                                  or issubclass(obj.value, torch.nn.Module)
                                                  or isinstance(obj.value, enum.EnumMeta)):
                # an attribute of a Python class (`type(self).forward`, an Enum's member, torch's
                # enums among them): through the class's source where it has one, so the guard
                # sees it change
                written = out.class_write(obj.value, name)
                if written is not None:
                    return written
                static = inspect.getattr_static(obj.value, name, _MISSING)
                fallback = python_method(type(obj.value), "__getattr__") if static is _MISSING else None
                if fallback is not None:
                    # the metaclass's own __getattr__ (a registry's `Config.X`): traced, as Python calls it
                    self.class_member(type(obj.value), "__getattr__")
                    out.guards.class_lacks(obj.value, name)
                    return self.inline_call(fallback, [obj, ConstantVariable(name)], {})
                if static is _MISSING:
                    raise self.observed(AttributeError(
                        f"type object '{obj.value.__name__}' has no attribute '{name}'"))
                if _own_descriptor_methods(static):
                    raise self.unsupported(f"attribute {name!r} of {obj.value.__name__}: a {type(static).__name__}, "
                                           "whose class has a __get__ of its own")
                if isinstance(static, classmethod):
                    return BoundMethodVariable(static.__func__, obj)
                attr = static.__func__ if isinstance(static, staticmethod) else \
                    self.read_attribute(obj.value, name)
                return out.wrap(attr, AttrSource(obj.source, name) if obj.source is not None else None)
            if isinstance(obj, UserFunctionVariable) and name == "__dict__":
                # (its writes would not be seen by the trace's reads of its attributes)
                raise self.unsupported(f"the __dict__ of {obj.describe()}")
            attr = self.read_attribute(obj.value, name)
            if isinstance(obj.value, torch._ops.OpOverloadPacket) and isinstance(attr, torch._ops.OpOverload):
                return TorchFunctionVariable(attr)       # torch.ops.aten.mm.default: one node, as the packet
            if isinstance(obj, UserFunctionVariable) and obj.source is not None:
                # a function's attributes can be set (`fn.scale = 3`): read through its source
                return out.wrap(attr, AttrSource(obj.source, name))
            if is_constant_value(attr):
                return ConstantVariable(attr)
        if isinstance(obj, BuiltinVariable) and name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVariable(getattr(obj.value, name))       # a builtin's, fixed
        if isinstance(obj, BuiltinVariable) and obj.value in _UNBOUND_METHOD_TYPES and \
                isinstance(getattr(obj.value, name, None), types.MethodDescriptorType):
            return _UnboundConstantMethod(obj.value, name)           # str.isalnum(c)
        raise self.unsupported(f"attribute .{name} of {obj.describe()}")

    def user_getattribute(self, obj: UserObjectVariable, name: str) -> VariableTracker:
        """obj.name where obj's class has its own __getattribute__ in Python: traced (what it
        does and reads is the trace's, and the guard reads past it), its __getattr__ traced
        where it raises AttributeError, as Python's slot does."""
        cls = type(obj.value)
        self.class_member(cls, "__getattribute__")
        try:
            return self.inline_call(python_method(cls, "__getattribute__"), [obj, ConstantVariable(name)], {})
        except ObservedException as e:
            fallback = python_method(cls, "__getattr__")
            if fallback is None or not issubclass(e.exc.cls, AttributeError):
                raise
            return self.inline_call(fallback, [obj, ConstantVariable(name)], {})

    def class_member(self, cls: type, name: str):
        """What an instance of cls finds for `name` on its class (None where it has none); for
        a class of the user's (torch's are trusted), guarded to stay what it is
        (GuardBuilder.class_member)."""
        attr = class_attr(cls, name)
        # (a distribution's too: Distribution.set_default_validate_args(...) changes its class)
        if attr is not None and (not cls.__module__.startswith(("torch.", "builtins")) or is_distribution(cls)):
            self.output.guards.class_member(cls, name, attr)
        return attr

    def nested_function_attr(self, fn: NestedFunctionVariable, name: str) -> VariableTracker:
        """An attribute of a function made in the frame: one set in the trace, or what
        CPython's function object holds; of one the call passed in (guarded by its code), what
        the real one holds."""
        if name in fn.items:
            return fn.items[name]
        if fn.source is not None and name not in _FUNCTION_PARTS:
            # one the call passed in, guarded by its code: what else it holds (a name and a doc
            # functools.wraps set, `fn.scale`) read through it, and so guarded
            present = hasattr(fn.real, name)
            if name not in _FUNCTION_ATTRIBUTES:
                self.output.guards.has_attr(fn.source, name, present)
            if present:
                return self.output.wrap(getattr(fn.real, name), AttrSource(fn.source, name))
            raise self.observed(AttributeError(f"'function' object has no attribute '{name}'"))
        if fn.dict_of is not None:
            # copied from the wrapped one's __dict__ by functools.wraps (one made in the frame:
            # its attributes set in the trace)
            wrapped = fn.dict_of
            held = wrapped.items if isinstance(wrapped, NestedFunctionVariable) else \
                getattr(example_of(wrapped), "__dict__", {})
            if name in held:
                return self.load_attr(wrapped, name)
        code = fn.code
        doc = code.co_consts[0] if code.co_consts and isinstance(code.co_consts[0], str) else None
        known = {"__name__": code.co_name, "__qualname__": fn.name, "__code__": code, "__doc__": doc,
                 "__module__": fn.f_globals.get("__name__")}
        if name in known:
            return ConstantVariable(known[name])
        if name == "__defaults__":
            return fn.defaults if fn.defaults is not None else ConstantVariable(None)
        if name == "__kwdefaults__":
            return fn.kwdefaults if fn.kwdefaults is not None else ConstantVariable(None)
        if name == "__annotations__":
            if fn.annotations is None:             # (made on first read, as CPython makes it)
                fn.annotations = DictVariable({})
            return fn.annotations
        if hasattr(types.FunctionType, name):
            raise self.unsupported(f"attribute .{name} of {fn.describe()}")
        raise self.observed(AttributeError(f"'function' object has no attribute '{name}'"))

    def class_attribute(self, obj: VariableTracker, name: str, attr) -> Optional[VariableTracker]:
        """What reading `name` gives when it is found on obj's class (`attr`, as getattr_static
        finds it): a method bound to obj, a property's value, a static or class method, or data
        read through the instance, so that the guard sees the class change or an instance
        attribute hide it. None for anything else (another descriptor)."""
        source = obj.source
        if _own_descriptor_methods(attr):
            raise self.unsupported(f"attribute {name!r}: a {type(attr).__name__}, whose class has a "
                                   "__get__, __set__ or __delete__ of its own")
        if isinstance(attr, (types.FunctionType, property, staticmethod, classmethod, functools._lru_cache_wrapper)):
            cls = type(obj.as_example())
            self.class_member(cls, name)
            if source is not None and not isinstance(obj, TypeVariable) and not isinstance(attr, property) \
                    and hasattr(obj.as_example(), "__dict__"):
                # an instance attribute of that name would hide it (`obj.method = other`)
                self.output.guards.not_own_attr(source, name, class_attr(cls, "__getattribute__") in (
                    object.__getattribute__, torch.nn.Module.__getattribute__))
        if isinstance(attr, (types.FunctionType, functools._lru_cache_wrapper)):
            # (a method with a cache binds as a function does: a new bound method each read)
            return BoundMethodVariable(attr, obj)
        if isinstance(attr, property) and attr.fget is not None:
            return self.inline_call(attr.fget, [obj], {})
        if isinstance(attr, staticmethod):
            return self.output.wrap(attr.__func__, None)
        if isinstance(attr, classmethod):
            return BoundMethodVariable(attr.__func__, self.output.wrap(type(obj.as_example()), None))
        if is_constant_value(attr) or isinstance(attr, re.Pattern) or \
                source is not None and not hasattr(type(attr), "__get__"):
            if source is None and isinstance(obj, UserObjectVariable):
                # (an object made in the frame: no place to read it through, so the class's own
                # attribute is guarded to stay what it is: `Foo.scale = 3` after compiling)
                self.class_member(type(obj.value), name)
            return self.output.wrap(attr, attr_source(obj, name))
        if source is None and isinstance(obj, UserObjectVariable) and is_distribution(type(obj.value)) \
                and not hasattr(type(attr), "__get__"):
            # data of torch's own class (a distribution's arg_constraints), read as torch's code
            # reads its own modules: trusted, not guarded
            return self.output.wrap(attr, None)
        if isinstance(attr, functools.cached_property) and isinstance(obj, UserObjectVariable):
            # computed once, into the instance's __dict__ (where a later read finds it first)
            value = self.inline_call(attr.func, [obj], {})
            self.store_attr(obj, attr.attrname or name, value)
            return value
        get = python_method(type(attr), "__get__")
        data = class_attr(type(attr), "__set__") is not None or class_attr(type(attr), "__delete__") is not None
        if get is not None and isinstance(obj, UserObjectVariable) and \
                (not data or python_method(type(attr), "__set__") is not None):
            # a descriptor whose class's __get__ is Python (torch.distributions' lazy_property,
            # a cache of the user's; a validating field, whose __set__ is Python too): its
            # __get__, traced; an instance attribute of that name, read before, wins as in
            # Python, but for a data descriptor (one with a __set__), which wins over it
            cls = type(obj.value)
            self.class_member(cls, name)
            if not data and source is not None and hasattr(obj.value, "__dict__"):
                # (one set on the instance since, as lazy_property's __get__ does, hides it)
                self.output.guards.not_own_attr(source, name, class_attr(cls, "__getattribute__") in (
                    object.__getattribute__, torch.nn.Module.__getattribute__))
            descriptor = self.output.wrap(attr, self.output.root_source(attr, f"descriptor_{name}"))
            return self.inline_call(get, [descriptor, obj, self.output.wrap(cls, None)], {})
        if source is not None and not isinstance(obj, TypeVariable) and isinstance(attr, _PURE_DESCRIPTORS):
            # another descriptor (a __slots__ member, an Enum member's name and value): what it
            # gives the instance, read as Python reads it, and by the guard the same way
            read = self.output.wrap(self.read_attribute(obj.as_example(), name), attr_source(obj, name))
            if name == "__dict__" and isinstance(obj, UserObjectVariable):
                self.mirror_in_dict(obj, obj.items)        # the attributes the trace set so far
            return read
        return None

    def mirror_in_dict(self, obj: UserObjectVariable, attributes: dict) -> None:
        """Attributes the trace sets on an object from outside the frame are kept as its
        overrides, replayed after the graph; where the trace also holds the object's __dict__
        (`obj.__dict__`, vars(obj)), they are written there too, so that each sees the other."""
        own = self.output.instance_dict(obj)
        if own is None or not attributes:
            return
        self.mutate(own)
        for name, value in attributes.items():
            if value is DELETED:
                own.items.pop(name, None)
            else:
                own.items[name] = value

    def load_super_attr(self, sup: "SuperVariable", name: str) -> VariableTracker:
        """super(cls, obj).name: the first class after `cls` in obj's MRO that defines it."""
        obj = sup.obj
        target = obj.value if isinstance(obj, TypeVariable) else obj.as_example()
        # (a class method's super() walks the class's own MRO; a metaclass method's, whose obj
        # is a class that is an instance of it, the metaclass's, as Python's super does)
        own = isinstance(obj, TypeVariable) and isinstance(target, type) and issubclass(target, sup.cls)
        mro = target.__mro__ if own else type(target).__mro__
        if sup.cls not in mro:
            raise self.unsupported("super(): the object is not an instance of the class")
        for klass in mro[mro.index(sup.cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if not klass.__module__.startswith(("torch.", "builtins")):
                    self.output.guards.class_member(klass, name, attr)
                break
        else:
            raise self.observed(AttributeError(f"'super' object has no attribute '{name}'"))
        read = ContainerReadVariable.of(obj, attr)
        if read is not None:
            return read
        if _own_descriptor_methods(attr):
            raise self.unsupported(f"super().{name}: a {type(attr).__name__}, whose class has a __get__ of its own")
        if isinstance(attr, types.FunctionType):
            if isinstance(obj, TypeVariable):
                return self.output.wrap(attr, None)
            return BoundMethodVariable(attr, obj)
        if isinstance(attr, classmethod):
            return BoundMethodVariable(attr.__func__, obj if isinstance(obj, TypeVariable)
                                       else self.output.wrap(type(target), None))
        if isinstance(attr, staticmethod):
            return self.output.wrap(attr.__func__, None)
        if attr is object.__init__:
            return _NoOpCallable()
        if attr is type.__call__ and isinstance(obj, TypeVariable):
            return _MakeInstance(target)
        if attr is tuple.__new__:
            return self.output.wrap(attr, None)
        if attr in (object.__setattr__, object.__getattribute__):
            return ObjectMethodVariable(name, obj)
        if isinstance(obj, ExceptionVariable) and name == "__init__" and \
                isinstance(attr, types.WrapperDescriptorType):
            return ExceptionInitVariable(obj)          # BaseException's: it sets args
        if is_constant_value(attr):
            return ConstantVariable(attr)
        raise self.unsupported(f"super().{name} ({type(attr).__name__})")

    def parameter_container_item(self, obj: NNModuleVariable, key) -> Optional[VariableTracker]:
        """`params[i]` of a ParameterList, `params[name]` of a ParameterDict (peft's adapter
        weights): the parameter, through its source; None where it holds something else there.
        A key it does not have raises what eager raises."""
        mod = obj.module
        if not isinstance(mod, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            return None
        try:
            name = mod._get_abs_string_index(key) if isinstance(mod, torch.nn.ParameterList) else key
            mod[key]
        except (IndexError, KeyError, TypeError, AttributeError) as e:
            raise self.observed(e) from None
        return self.load_module_attr(obj, name) if name in self.output.members(obj, "_parameters") else None

    def load_module_attr(self, obj: NNModuleVariable, name: str) -> VariableTracker:
        if name in obj.items:                     # set earlier in the trace
            return obj.items[name]
        mod, src, out = obj.module, obj.source, self.output
        d = mod.__dict__
        for kind in ("_parameters", "_buffers", "_modules", "__dict__"):
            # a member dict the trace wrote into (`self._buffers[name] = t`, .pop(name)):
            # what it holds now, not what the module's does until the graph has run
            held = out.instance_dict(obj, kind)
            if isinstance(held, DictVariable) and held in out.side_effects:
                if name in held.items:
                    return held.items[name]
                if name in d.get(kind, {}) or kind == "__dict__" and name in d:
                    raise self.unsupported(f"{type(mod).__name__}.{name} read after the trace removed it "
                                           f"from {kind}")
        if name == "__dict__" and obj.items or \
                name in ("_parameters", "_buffers", "_modules") and any(k in d.get(name, {}) for k in obj.items):
            # `self.buf = t` then `self._buffers`: Module.__setattr__ put t there in eager
            raise self.unsupported(f"{type(mod).__name__}.{name} read after the trace set one of its members")
        for kind in ("_parameters", "_buffers", "_modules"):
            members = d.get(kind, {})
            if name in members:
                s = module_member_source(src, kind, name) if src is not None else None
                value = members[name]
                if value is None:
                    if s is not None:
                        out.guards.constant(s, None)
                    return ConstantVariable(None, s)
                return out.wrap(value, s)
        if name in d:
            return out.wrap(d[name], AttrSource(src, name) if src is not None else None)
        # class attribute: methods are inlined with self bound; properties are inlined
        written = out.class_write(type(mod), name)
        if written is not None:
            return written
        attr = class_attr(type(mod), name, _MISSING)
        if attr is _MISSING:
            fallback = python_method(type(mod), "__getattr__")
            if fallback is not None and fallback is not torch.nn.Module.__getattr__:
                # a wrapper's own __getattr__ (on to a wrapped module's attributes)
                self.class_member(type(mod), "__getattr__")
                return self.inline_call(fallback, [obj, ConstantVariable(name)], {})
            raise self.observed(AttributeError(f"'{type(mod).__name__}' object has no attribute '{name}'"))
        found = self.class_attribute(obj, name, attr)
        if found is not None:
            return found
        raise self.unsupported(f"attribute {name!r} of {type(mod).__name__} "
                               f"({type(attr).__name__})")

    def _real_float_power(self, a: VariableTracker, b: VariableTracker) -> bool:
        """Whether `a ** b`, a symbolic number among them (`n ** 0.5` of a size, `v ** 2`, `2 ** v`
        of a float input), is a float on every call the guard admits: kept symbolic, computed by
        the wrapper in Python as eager's code does. A negative base to a fractional power is
        complex: the base's sign becomes a condition of the guard."""
        kinds = (_number_type(a), _number_type(b))
        if None in kinds or float not in kinds or not any(isinstance(v, SymIntVariable) for v in (a, b)):
            return False
        if kinds[1] is int or not isinstance(a, SymIntVariable) and a.value >= 0:
            return True
        return bool(self.output.sym_compare(operator.ge, a, ConstantVariable(0)))

    def binary(self, sym: str, a: VariableTracker, b: VariableTracker) -> VariableTracker:
        op = BINARY_OPS.get(sym) or COMPARE_OPS[sym]
        shifted = _as_size_arithmetic(sym, a, b)
        if shifted is not None:              # n >> 1, n << 2, n & 7, n & ~7 of a size
            return shifted(self.output)
        if (isinstance(a, SymIntVariable) or isinstance(b, SymIntVariable)) and sym in SIZE_ARITHMETIC \
                and all(type(v.example if isinstance(v, SymIntVariable) else getattr(v, "value", None)) is int
                        for v in (a, b)):
            return self.output.sym_arith(SIZE_ARITHMETIC[sym], a, b)
        if (isinstance(a, SymIntVariable) or isinstance(b, SymIntVariable)) and sym in FLOAT_ARITHMETIC:
            kinds = {_number_type(a), _number_type(b)}
            if None not in kinds and (float in kinds or sym in ("/", "/=")):
                return self.output.sym_arith(FLOAT_ARITHMETIC[sym], a, b)     # (a float, kept symbolic)
        if sym in ("**", "**=") and self._real_float_power(a, b):
            return self.output.sym_arith(operator.pow, a, b)
        if sym in ("**", "**=") and isinstance(a, SymIntVariable) and type(a.example) is int and \
                isinstance(b, ConstantVariable) and not isinstance(b, SymIntVariable) and type(b.value) is int \
                and 0 <= b.value <= 8:
            return self.output.sym_arith(operator.pow, a, b)     # n ** 2 of a size: a size
        if type(a) is DictVariable and type(b) is DictVariable and sym in ("|", "|="):
            if sym == "|":
                return DictVariable({**a.items, **b.items})
            self.mutate(a)                         # dict |= ...: updates that very dict
            a.items.update(b.items)
            return a
        if isinstance(a, SetVariable) and sym in ("|=", "&=", "-=", "^=") and b.is_constant() \
                and isinstance(b.as_example(), (set, frozenset)):
            self.mutate(a)                         # set |= ...: changes that very set
            a.apply(f"__{op.__name__}__", b.as_example())
            return a
        if sym in ("+=", "*=") and isinstance(a, ListVariable):
            # list += iterable, list *= n: that very list changes (another name for it sees it)
            if sym == "*=" and not (b.is_constant() and type(b.as_example()) is int):
                raise self.unsupported(f"list *= {b.describe()}")
            items = a.items + self.iterate(b) if sym == "+=" else a.items * b.as_example()
            self.mutate(a)
            a.items = items
            return a
        if sym not in ("==", "!=") and (isinstance(a, UserObjectVariable) or isinstance(b, UserObjectVariable)):
            return self.user_operator(sym, a, b)
        if op in aliasing.AUGMENTED and not isinstance(a, (TensorVariable, ListVariable)):
            op = aliasing.AUGMENTED[op]           # `x op= y` writes in place only a tensor or a list
            sym = sym[:-1]
        if sym in COMPARE_OPS and (isinstance(a, SymIntVariable) or isinstance(b, SymIntVariable)):
            answer = self.output.sym_compare(op, a, b)
            if answer is not None:
                return ConstantVariable(answer)
        if sym in ("==", "!=") and isinstance(a, BaseListVariable) and isinstance(b, BaseListVariable) \
                and any(isinstance(v, SymIntVariable) for v in (*a.items, *b.items)):
            # (a tuple, torch.Size among them, never equals a list)
            same = self.same_items(a, b) if issubclass(a.python_type, list) == issubclass(b.python_type, list) \
                else False
            if same is not None:
                return ConstantVariable(same == (sym == "=="))
        # sizes inside tuples (`x.size()[:-1] + (heads, -1)`) are kept as they are below: folding
        # them here would read them as Python ints
        if a.is_constant() and b.is_constant() and not (_holds_sizes(a) or _holds_sizes(b)):
            return self.constant_result(op, a, b)
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            return self.output.call("call_function", op, [a, b], {})
        if isinstance(b, ConstantVariable) and isinstance(b.value, (tuple, list)) and \
                isinstance(a, BaseListVariable):
            b = _sequence_variable(b.value)
        if isinstance(a, ConstantVariable) and isinstance(a.value, (tuple, list)) and \
                isinstance(b, BaseListVariable):
            a = _sequence_variable(a.value)
        if isinstance(a, DictVariable) and isinstance(b, DictVariable) and sym in ("|", "|="):
            if sym == "|=":                          # that very dict changes
                self.mutate(a)
                a.items.update(b.items)
                return a
            return DictVariable({**a.items, **b.items})
        if isinstance(a, DictViewVariable) and a.kind == "keys" and sym in ("&", "|", "-", "^"):
            other = dict.fromkeys(b.dict_var.items).keys() if isinstance(b, DictViewVariable) and b.kind == "keys" \
                else (b.as_example() if b.is_constant() else None)
            if other is not None:                   # keys are constants: a set of them
                keys = tuple(a.dict_var.items)
                return SetVariable.made_by(lambda o: op(dict.fromkeys(keys).keys(), o), other)
        if isinstance(b, DictViewVariable) and b.kind == "keys" and sym in ("&", "|", "-", "^") and (
                isinstance(a, SetVariable) or a.is_constant() and isinstance(a.as_example(), (set, frozenset))):
            # set() | d.keys() (peft's mixed-adapter batches): a set of the keys, as the view's
            # reflected operator makes it
            keys = tuple(b.dict_var.items)
            first = a.maker() if isinstance(a, SetVariable) else (lambda v=a.as_example(): v)
            return SetVariable.made_by(lambda: op(first(), dict.fromkeys(keys).keys()))
        if isinstance(a, BaseListVariable) and isinstance(b, BaseListVariable) and sym in ("+", "+="):
            if type(a) is type(b):
                return type(a)(a.items + b.items)
            if {type(a), type(b)} == {TupleVariable, SizeVariable}:
                return SizeVariable(a.items + b.items)       # torch.Size + tuple, either way round
        if isinstance(a, BaseListVariable) and isinstance(b, ConstantVariable) and sym in ("*", "*="):
            return type(a)(a.items * b.value)
        if sym in ("==", "!=") and (_never_equal(a, b) or _never_equal(b, a)):
            return ConstantVariable(sym == "!=")
        if sym in ("==", "!=") and isinstance(a, BaseListVariable) and isinstance(b, BaseListVariable) \
                and isinstance(a, ListVariable) == isinstance(b, ListVariable) and len(a.items) != len(b.items):
            # sequences of two lengths differ, their items unread (`index != ()` of a tensor index)
            return ConstantVariable(sym == "!=")
        if sym in ("==", "!=") and isinstance(b, UserObjectVariable) and \
                isinstance(a, (UserFunctionVariable, NestedFunctionVariable)):
            # a function's == knows only functions: the object's own == answers (reflected)
            return self.binary(sym, b, a)
        if sym in ("==", "!=") and isinstance(a, NestedFunctionVariable):
            # functions compare by identity (two the call passes in: guarded so)
            return ConstantVariable(identical(self, a, b) == (sym == "=="))
        if sym in ("==", "!=") and isinstance(a, NNModuleVariable):
            same = isinstance(b, NNModuleVariable) and self.output.same_module(a, b)
            return ConstantVariable(same if sym == "==" else not same)
        if sym in ("==", "!=") and isinstance(a, UserObjectVariable):
            result = self.user_operator(sym, a, b)
            if result is not None:
                return result
            # neither side's method answered: object's own ==, identity
            if a is b:
                same = True
            elif isinstance(b, UserObjectVariable) and a.source is not None and b.source is not None:
                same = a.value is b.value
                self.output.guards.same_object(a.source, b.source, same)
            elif isinstance(b, UserObjectVariable) or b.is_constant():
                same = False            # another object made in the frame, or a constant
            else:
                raise self.unsupported(f"operator {sym} on {a.describe()} and {b.describe()}")
            return ConstantVariable(same == (sym == "=="))
        if a.is_constant() and b.is_constant():
            return self.constant_result(op, a, b)      # (the sizes become static)
        raise self.unsupported(f"operator {sym} on {a.describe()} and {b.describe()}")

    def constant_result(self, op, a: VariableTracker, b: VariableTracker) -> VariableTracker:
        operands = a.as_example(), b.as_example()
        result = self.on_constants(op, *operands)
        # a list made so (`[(0, 0)] * n`) is the frame's own to change: not a constant
        if type(result) is set:
            return SetVariable.made_by(op, *operands)
        return self.output.wrap(result, None) if type(result) in (list, dict) else ConstantVariable(result)

    def same_items(self, a: BaseListVariable, b: BaseListVariable) -> Optional[bool]:
        """`a == b` of two tuples or lists holding sizes (`x.size() != (bsz * heads, q, k)`),
        item by item as Python compares them, each size compared symbolically (and guarded),
        so that it stays dynamic. None where an item's comparison is not a constant."""
        if _never_equal(a, b) or len(a.items) != len(b.items):
            return False
        for x, y in zip(a.items, b.items):
            eq = self.binary("==", x, y)
            if not eq.is_constant():
                return None
            if not eq.as_example():
                return False
        return True

    def user_operator(self, sym: str, a: VariableTracker, b: VariableTracker) -> Optional[VariableTracker]:
        """`a sym b` where an operand is an object of a Python class, its methods tried in
        Python's order: `__iadd__` first for +=; the right operand's reflected method before the
        left's method where its class is a proper subclass of the left's (for arithmetic, only
        where it has a reflected method of its own); the reflected method never for two operands
        of one class, save for comparisons; NotImplemented passes on to the next. For == and !=
        None where no method answered (identity decides), for the rest a graph break."""
        base = sym[:-1] if sym.endswith("=") and sym not in COMPARE_OPS else sym
        forward, reflected = _OPERATOR_METHODS[base]
        ta, tb = _operand_type(a), _operand_type(b)
        comparison = base in COMPARE_OPS
        right_first = ta is not None and tb is not None and tb is not ta and issubclass(tb, ta) and (
            comparison or self.class_member(tb, reflected) is not self.class_member(ta, reflected))
        tries = [(a, forward, b)]
        if comparison or tb is not ta:
            tries.insert(0 if right_first else 1, (b, reflected, a))
        if base != sym:
            tries.insert(0, (a, f"__i{forward[2:]}", b))
        for obj, name, other in tries:
            result = self.user_method(obj, name, other)
            if not (isinstance(result, ConstantVariable) and result.value is NotImplemented):
                return result
        if base in ("==", "!="):
            return None
        raise self.unsupported(f"operator {sym} on {a.describe()} and {b.describe()}")

    def user_method(self, obj: VariableTracker, name: str, other: VariableTracker) -> VariableTracker:
        """obj.name(other) for one operator method: NotImplemented where it would not answer."""
        if not isinstance(obj, UserObjectVariable):
            if obj.is_constant() and isinstance(other, UserObjectVariable) and \
                    isinstance(other.value, type(obj.as_example())):
                raise self.unsupported(f"operator {name} of {obj.describe()} on an object of its subclass")
            # a builtin value's operator methods do not know a Python class's objects
            return ConstantVariable(NotImplemented)
        attr = self.class_member(type(obj.value), name)
        if isinstance(attr, types.FunctionType):
            return self.call_special(obj, name, [other])
        if name == "__ne__" and attr is object.__ne__:
            eq = self.user_method(obj, "__eq__", other)     # object's != negates the class's ==
            if isinstance(eq, ConstantVariable) and eq.value is NotImplemented:
                return eq
            return ConstantVariable(not self.truth(eq, "!="))
        if attr is None or attr is getattr(object, name, None):
            return ConstantVariable(NotImplemented)          # (object's == is identity, decided last)
        raise self.unsupported(f"operator {name} of {obj.describe()}: a builtin method")

    def make_tuple(self, items):
        return TupleVariable(items)

    def _next_builds_closure(self) -> bool:
        for ins in self.instructions[self.pc:self.pc + 64]:
            if ins.opname in ("LOAD_FAST", "LOAD_FAST_CHECK") and \
                    (ins.argval in self.code.co_cellvars or ins.argval in self.code.co_freevars):
                continue
            if ins.opname == "BUILD_TUPLE":
                continue
            return ins.opname == "LOAD_CONST" and isinstance(ins.argval, types.CodeType)
        return False

    # f-strings --------------------------------------------------------------------------
    def object_text(self, obj: VariableTracker, kind: str) -> Optional[ConstantVariable]:
        """str(obj) or repr(obj) (kind) of an object whose class writes it in Python (__str__
        falls back to __repr__, as object's does); None where it does not."""
        if not isinstance(obj, UserObjectVariable):
            return None
        for name in (("__str__", "__repr__") if kind == "str" else ("__repr__",)):
            method = class_attr(type(obj.value), name)
            if isinstance(method, types.FunctionType):
                text = self.call_special(obj, name, [])
                if not (text.is_constant() and isinstance(text.as_example(), str)):
                    raise self.unsupported(f"{type(obj.value).__name__}.{name} gave {text.describe()}")
                return text
            if method is not object.__str__:
                return None
        return None

    def _format(self, value: VariableTracker, conversion: Optional[str], spec: str = ""):
        if conversion is None and isinstance(value, UserObjectVariable) and \
                isinstance(class_attr(type(value.value), "__format__"), types.FunctionType):
            # f"{obj:spec}" is type(obj).__format__(obj, spec) (str(obj) only by object's)
            text = self.call_special(value, "__format__", [ConstantVariable(spec)])
            if not (text.is_constant() and isinstance(text.as_example(), str)):
                raise self.unsupported(f"{type(value.value).__name__}.__format__ gave {text.describe()}")
            return text
        text = self.object_text(value, "repr" if conversion == "r" else "str") \
            if conversion in (None, "s", "r") and not spec else None
        if text is not None:
            return text
        if not value.is_constant():
            if isinstance(value, (NNModuleVariable, TypeVariable, UserFunctionVariable)) and not spec:
                v = value.as_example()
            elif isinstance(value, UserObjectVariable) and value.source is not None and \
                    type(value.value) in (set, frozenset, list, dict) and \
                    is_constant_value(tuple(value.value) + tuple(getattr(value.value, "values", tuple)())):
                # a container of constants read from outside (kornia's set of border names in an
                # error message): its text, guarded to hold what it held
                v = value.value
                self.output.guards.constant(value.source, v)
            else:
                raise self.unsupported(f"formatting {value.describe()} in an f-string",
                                       "the text would depend on a tensor's values")
        else:
            v = value.as_example()
        if conversion == "s":
            v = str(v)
        elif conversion == "r":
            v = repr(v)
        elif conversion == "a":
            v = ascii(v)
        return ConstantVariable(format(v, spec))

    def set_grad(self, enabled: bool):
        if torch.is_grad_enabled() != enabled:
            node = self.output.graph.call_function(torch._C._set_grad_enabled, (enabled,))
            self.output._set_meta(node, None)
            torch._C._set_grad_enabled(enabled)

    def enter_inference_mode(self):
        """Enter `with torch.inference_mode():`: grad mode off (a node, as no_grad's) and
        inference mode on for real, so that the tensors the block makes are inference tensors
        as in eager; returns what its exit does."""
        out, grad_before = self.output, torch.is_grad_enabled()
        self.set_grad(False)
        out.inference_blocks = True
        guard = torch._C._InferenceMode(True)
        guard.__enter__()
        out.inference_guards.append(guard)

        def leave(tx):
            tx.output.leave_inference_mode(len(out.inference_guards) - 1)
            tx.set_grad(grad_before)
        return leave

    def enter_autocast(self, ctx):
        """Enter `with torch.autocast(...)`: the state set for real (so example values are
        autocast's) and, where it changes, an `_enter_autocast` node; returns what its exit
        does. A block that changes nothing (transformers' `enabled=False` when autocast is
        off) leaves no trace in the graph."""
        if ctx.device_type not in autocast.DEVICES:
            raise self.unsupported(f"torch.autocast on device {ctx.device_type!r}")
        before = autocast.state()
        i = autocast.DEVICES.index(ctx.device_type)
        after = before[:i] + ((ctx.dtype if ctx.enabled else None),) + before[i + 1:]
        if after == before:
            return lambda tx: None
        enter = self.output.graph.call_function(
            autocast.ENTER, (ctx.device_type, ctx.dtype, ctx.enabled, ctx.cache_enabled))
        self.output._set_meta(enter, None)
        autocast.set_state(after)

        def leave(tx):
            node = tx.output.graph.call_function(autocast.EXIT, (enter,))
            tx.output._set_meta(node, None)
            autocast.set_state(before)
        return leave

    def store_attr(self, obj: VariableTracker, name: str, value: VariableTracker,
                   generic: bool = False) -> None:
        """`obj.name = value` (STORE_ATTR, setattr()). generic: object.__setattr__'s store,
        which a class's own __setattr__ calls (its __setattr__ is not called again)."""
        if isinstance(obj, UserObjectVariable) and obj.snapshot is None and value is not DELETED \
                and not isinstance(obj.value, torch.nn.Module):   # (a module's: calls.check_init_is_pure)
            cls = type(obj.value)
            custom = class_attr(cls, "__setattr__")
            if custom is not object.__setattr__ and not generic:
                if not isinstance(custom, types.FunctionType):
                    raise self.unsupported(f"setting .{name} of {obj.describe()}: its class's "
                                           f"__setattr__ is not Python")
                self.inline_call(custom, [obj, ConstantVariable(name), value], {})
                return
            # a data descriptor on the class takes the write: a property's setter runs
            attr = class_attr(cls, name, _MISSING)
            if _own_descriptor_methods(attr):
                raise self.unsupported(f"setting .{name} of {obj.describe()} through a {type(attr).__name__}, "
                                       "whose class has a __set__ of its own")
            if isinstance(attr, property):
                if attr.fset is None:
                    raise self.observed(AttributeError(
                        f"property {name!r} of {cls.__name__!r} object has no setter"))
                self.inline_call(attr.fset, [obj, value], {})
                return
            put = python_method(type(attr), "__set__")
            if put is not None and python_method(type(attr), "__get__") is not None:
                # a data descriptor of Python's (a validating field): its __set__, traced
                self.class_member(cls, name)
                descriptor = self.output.wrap(attr, self.output.root_source(attr, f"descriptor_{name}"))
                self.inline_call(put, [descriptor, obj, value], {})
                return
            if hasattr(type(attr), "__set__") and not isinstance(attr, types.MemberDescriptorType):
                raise self.unsupported(f"setting .{name} of {obj.describe()} through a "
                                       f"{type(attr).__name__}")
        if isinstance(obj, UserObjectVariable) and not hasattr(obj.value, "__dict__") and \
                not hasattr(type(class_attr(type(obj.value), name, None)), "__set__"):
            # __slots__ without the name, and no __dict__ to hold it
            raise self.observed(AttributeError(f"'{type(obj.value).__name__}' object has no attribute '{name}'"))
        if value is DELETED and isinstance(obj, UserObjectVariable) and obj.source is None and \
                obj.snapshot is None:                     # an object made in the frame: its own
            if obj.items.get(name, DELETED) is DELETED:
                raise self.observed(AttributeError(name))
            self.output.record_mutation(obj)
            obj.items[name] = DELETED
            return
        if value is DELETED and isinstance(obj, UserObjectVariable) and obj.source is not None and \
                obj.snapshot is None and obj.overrides.get(name, DELETED) is not DELETED:
            # one the trace set on an object from outside (`obj.cache = ...; del obj.cache`):
            # deleted after the graph; later reads in the trace see it gone
            self.output.record_mutation(obj)
            obj.overrides[name] = DELETED
            self.output.add_side_effect(obj)
            return
        if value is DELETED:
            if not (isinstance(obj, UserObjectVariable) and obj.snapshot is not None):
                raise self.unsupported(f"deleting attribute .{name} of {obj.describe()}")
            self.output.record_mutation(obj)
            self.on_constants(delattr, obj.value, name)          # (the frame's own copy)
            obj.overrides[name] = DELETED
            return
        if isinstance(obj, ExceptionVariable):
            self.output.record_mutation(obj)          # an exception of the trace: its own
            obj.items[name] = value
            return
        if isinstance(obj, NestedFunctionVariable) and obj.source is None and not name.startswith("__"):
            self.output.record_mutation(obj)          # a function made in the frame: its own
            obj.items[name] = value
            return
        if isinstance(obj, ModelOutputVariable) and obj.source is None and \
                name in ModelOutputVariable.field_names(obj.cls) and not _is_none(value):
            self.output.record_mutation(obj)          # ModelOutput.__setattr__: the item too
            obj.items[name] = value
            return
        if isinstance(obj, UserObjectVariable) and obj.snapshot is not None:
            if not value.is_constant():
                raise self.unsupported(f"setting .{name} of a copied {type(obj.value).__name__} "
                                       f"to {value.describe()}")
            self.output.record_mutation(obj)
            obj.overrides[name] = value
            setattr(obj.value, name, value.as_example())    # the frame's own copy
            return
        if isinstance(obj, UserObjectVariable) and obj.source is None:
            # an object made in the frame: its attributes are trace state
            self.output.record_mutation(obj)
            obj.overrides[name] = value
            return
        if isinstance(obj, UserObjectVariable) and obj.source is not None and \
                not isinstance(value, (NNModuleVariable,)):
            self.mirror_in_dict(obj, {name: value})
            # replayed with setattr after the graph; later reads in the trace see the new value
            self.output.record_mutation(obj)
            obj.overrides[name] = value
            self.output.add_side_effect(obj)
            return
        if isinstance(obj, NNModuleVariable) and obj.source is not None:
            # (a value with no source is not what the module holds: not read, nor guarded, for
            # the comparison: spectral_norm's `self.weight = computed` over a plain tensor)
            if (name in obj.items or hasattr(obj.module, name) and getattr(value, "source", None) is not None) \
                    and value is self.load_module_attr(obj, name):
                return                  # `self.count += 1`: the buffer itself, written in place
            # replayed with setattr after the graph (nn.Module's own: a parameter, buffer or
            # plain attribute as it decides); later reads in the trace see the new value
            self.output.record_mutation(obj)
            obj.items[name] = value
            self.output.add_side_effect(obj)
            return
        if isinstance(obj, TypeVariable) and _is_python_class(obj.value) and value is not DELETED and \
                not isinstance(class_attr(type(obj.value), name), property):
            # a class attribute (`Counter.n += 1`): later reads see it, made after the graph
            source = obj.source or self.output.root_source(obj.value, f"CLASS_{obj.value.__name__}")
            var = self.output.global_writes(obj.value, source)
            self.output.record_mutation(var)
            var.items[name] = value
            self.output.add_side_effect(var)
            return
        if isinstance(obj, TensorVariable) and name == "requires_grad":
            self.requires_grad_(obj, [value], {})
            return
        if isinstance(obj, TensorVariable) and name == "grad" and obj.source is not None and obj.example.is_leaf \
                and (_is_none(value) or isinstance(value, TensorVariable) and
                     (value.example.shape, value.example.dtype, value.example.device)
                     == (obj.example.shape, obj.example.dtype, obj.example.device)):
            # `p.grad = g` (a gradient transformed by hand, averaged, clipped): set after the
            # graph, seen by later reads in the trace (another size, dtype or device: eager
            # raises, at a break)
            writes = self.output.tensor_attribute_writes(obj.source)
            self.output.record_mutation(writes)
            writes.items[name] = value
            return
        raise self.unsupported(f"setting attribute .{name} of {obj.describe()}",
                               "a side effect on an object outside the graph",
                               "it runs for real at a graph break")

    def mutate(self, obj: VariableTracker):
        """`obj` is about to change in place: the change can be rolled back (a break inside an
        inlined call), and a list or dict from outside the frame gets the change made on the
        real one after the graph, as Dynamo replays its side effects."""
        if isinstance(obj, DictVariable) and obj.cls is types.MappingProxyType:
            raise self.unsupported(f"a change to a read-only {obj.describe()}", "eager raises its own error")
        if obj.source is not None:
            if not isinstance(obj, (ListVariable, DictVariable, SetVariable)) or isinstance(obj, ModelOutputVariable) \
                    or isinstance(obj, DictVariable) and not all(is_constant_value(k) for k in obj.items):
                raise self.unsupported(f"mutation of {obj.describe()} that came from outside the frame",
                                       "changing Python state outside the frame is done for real "
                                       "at a graph break")
            self.output.add_side_effect(obj)
        self.output.record_mutation(obj)

    def _two_locals(self, inst) -> Tuple[str, str]:
        """3.13's superinstructions pack two local indices: (oparg >> 4, oparg & 15).
        dis resolves them to a pair of names; fall back to decoding the oparg ourselves."""
        if isinstance(inst.argval, tuple) and len(inst.argval) == 2:
            return inst.argval
        names = self.code.co_varnames + self.code.co_cellvars + self.code.co_freevars
        return names[inst.arg >> 4], names[inst.arg & 15]

    def _push_attribute(self, attr, method_load: bool):
        """Push a loaded attribute; a method load for a following CALL also pushes the NULL
        marker, before the attribute in 3.12 and after it in 3.13."""
        if not method_load:
            self.push(attr)
        elif self.version >= (3, 13):
            self.push(attr)
            self.push(NULL)
        else:
            self.push(NULL)
            self.push(attr)

    def _unary(self, op, name):
        v = self.pop()
        if isinstance(v, SymIntVariable) and op in (operator.neg, operator.pos):
            # (-T: a slice's start, x[:, -T:]; kept symbolic; -f of a float: its sign, zero's too)
            self.push(v if op is operator.pos else self.output.sym_arith(operator.neg, v) if type(v.example) is float
                      else self.output.sym_arith(operator.sub, ConstantVariable(0), v))
        elif v.is_constant():
            self.push(ConstantVariable(op(v.as_example())))
        elif isinstance(v, TensorVariable):
            self.push(self.output.call("call_function", op, [v], {}))
        elif (result := self.call_special(v, f"__{op.__name__}__", [])) is not None:
            self.push(result)                  # its class's __neg__ (a wrapper of tensors)
        else:
            raise self.unsupported(f"{name} of {v.describe()}")

    def no_tensor_bounds(self, idx: VariableTracker) -> None:
        """A slice bounded by a tensor (`x[:n]`, n a 0-dim tensor) reads the tensor's value
        (its __index__): the sizes that follow depend on data, so a graph break, as in Dynamo."""
        parts = idx.items if isinstance(idx, TupleVariable) else [idx]
        if any(isinstance(p, SliceVariable) and any(isinstance(b, TensorVariable) for b in p.parts)
               for p in parts):
            raise self.unsupported("a slice bounded by a tensor",
                                   "the slice reads the tensor's value (its __index__): the sizes "
                                   "that follow depend on data",
                                   "bound the slice with a Python int (n.item() breaks the graph once)")

    def subscript(self, obj: VariableTracker, idx: VariableTracker) -> VariableTracker:
        self.no_tensor_bounds(idx)
        if isinstance(obj, TensorVariable):
            return self.output.call("call_function", operator.getitem, [obj, idx], {})
        if isinstance(obj, BaseListVariable) and idx.is_constant():
            i = idx.as_example()
            if isinstance(i, slice):
                return type(obj)(obj.items[i]) if not isinstance(obj, NamedTupleVariable) \
                    else TupleVariable(obj.items[i])
            if isinstance(i, int) and not -len(obj.items) <= i < len(obj.items):
                raise self.observed(IndexError(f"{obj.python_type.__name__} index out of range"))
            return obj.items[i]
        if isinstance(obj, ModelOutputVariable) and idx.is_constant() and not isinstance(idx.as_example(), str):
            items = list(obj.items.values())[idx.as_example()]         # an int or a slice: as a tuple
            return TupleVariable(items) if isinstance(items, list) else items
        if isinstance(obj, DictVariable) and (key := dict_key(idx)) is not NO_KEY:
            if key not in obj.items and obj.factory is not None:     # a defaultdict's new key
                value = self.call_function(obj.factory, [], {})
                self.mutate(obj)
                obj.items[key] = value
            if key not in obj.items:
                raise self.observed(KeyError(key_example(key)))
            return obj.items[key]
        if isinstance(obj, ConstantVariable) and idx.is_constant():
            return ConstantVariable(self.on_constants(operator.getitem, obj.value, idx.as_example()))
        if isinstance(obj, (BuiltinVariable, TypeVariable)) and isinstance(obj.value, type) and \
                not isinstance(obj.value, enum.EnumMeta) and hasattr(obj.value, "__class_getitem__") or \
                isinstance(obj, (UserObjectVariable, ConstantVariable)) and is_typing_form(obj.value):
            # an annotation (list[Any], dict[str, int], List[torch.Tensor] for torch.jit.annotate):
            # a typing form, evaluated as Python does
            parts = idx.items if isinstance(idx, TupleVariable) else [idx]
            forms = [p.value if isinstance(p, (TypeVariable, BuiltinVariable, UserObjectVariable)) else p.as_example()
                     for p in parts if isinstance(p, (TypeVariable, BuiltinVariable)) or p.is_constant() or
                     isinstance(p, UserObjectVariable) and is_typing_form(p.value)]
            if len(forms) == len(parts):
                return self.output.wrap(obj.value[tuple(forms) if isinstance(idx, TupleVariable) else forms[0]], None)
        if isinstance(obj, TypeVariable) and isinstance(obj.value, enum.EnumMeta) and idx.is_constant():
            return self.output.wrap(obj.value[idx.as_example()], None)          # Color["RED"]
        if isinstance(obj, NNModuleVariable) and idx.is_constant() and isinstance(idx.as_example(), slice) \
                and isinstance(obj.module, (torch.nn.ModuleList, torch.nn.Sequential)):
            # a slice of a ModuleList (`self.layers[:n]`): its modules, each through its source
            names = list(self.output.members(obj))[idx.as_example()]
            return ModuleSliceVariable([self.load_module_attr(obj, k) for k in names], type(obj.module),
                                       obj, idx.as_example())
        if isinstance(obj, NNModuleVariable) and idx.is_constant():
            held = self.parameter_container_item(obj, idx.as_example())
            if held is not None:
                return held
            sub = obj.module[idx.as_example()]
            if isinstance(sub, torch.nn.Module):
                for key, m in self.output.members(obj).items():
                    if m is sub:
                        return self.load_module_attr(obj, key)
            if sub is None and isinstance(obj.module, (torch.nn.ModuleList, torch.nn.Sequential)):
                # a None held in its place (ModuleList.append(None)): the member at that position
                return self.load_module_attr(obj, list(self.output.members(obj))[idx.as_example()])
            raise self.unsupported(f"indexing {type(obj.module).__name__}")
        special = self.call_special(obj, "__getitem__", [idx])
        if special is not None:
            return special
        raise self.unsupported(f"subscript of {obj.describe()} with {idx.describe()}")

    # branches on constants (a branch on a tensor is data-dependent: Unsupported) ------------
    def assertion_message(self, at: int):
        """Whether the instructions from index `at` raise AssertionError, as an `assert` whose
        condition failed does: (its message,), a constant string or None; None where they do
        not, or where the message is an expression (evaluated on failure only)."""
        names = [i.opname for i in self.instructions[at:at + 5]]
        if names[:2] == ["LOAD_ASSERTION_ERROR", "RAISE_VARARGS"]:
            return (None,)
        if names[:2] == ["LOAD_ASSERTION_ERROR", "LOAD_CONST"] and isinstance(self.instructions[at + 1].argval, str) \
                and (names[2:5] == ["PRECALL", "CALL", "RAISE_VARARGS"] or names[2:4] == ["CALL", "RAISE_VARARGS"]):
            return (self.instructions[at + 1].argval,)
        return None

    def raises_from(self, at: int, limit: int = 400) -> bool:
        """Whether the instructions from index `at` run straight into a `raise` (no jump, loop,
        return or yield on the way): the side of a branch that a frame takes only to raise."""
        for inst in self.instructions[at:at + limit]:
            if inst.opname == "RAISE_VARARGS":
                return inst.arg >= 1
            if "JUMP" in inst.opname or inst.opname.startswith(("FOR_ITER", "RETURN", "YIELD", "SEND", "RERAISE")):
                return False
        return False

    def branch_to_raise(self, inst) -> Optional[Tuple[bool, Optional[tuple]]]:
        """Where the jump `inst` on the tensor atop the stack has a side that runs
        straight into a `raise` (`assert t, "msg"`; `if not ok.all(): raise ValueError(f"...
        {x}")`; `if torch.isnan(x).any(): raise`), and the graph can check the tensor (one
        element, of the trace; no write into an input so far, which a failed check would leave
        unmade): (the truth it must have for the other side, the assert's constant message as
        assertion_message gives it, or None for any other raise). None where it is not so."""
        v = self.stack[-1]
        if not isinstance(v, TensorVariable) or v.example.numel() != 1 or self.output.written_inputs \
                or not isinstance(inst.argval, int):
            return None
        jump_on = inst.opname.endswith("IF_TRUE")
        through = self.offset_to_index[inst.offset] + 1
        if self.raises_from(through):            # (the jump may be a loop's, back to its start)
            needed, at = jump_on, through
        elif inst.argval > inst.offset and self.raises_from(self.offset_to_index[inst.argval]):
            needed, at = not jump_on, self.offset_to_index[inst.argval]
        else:
            return None
        assertion = self.assertion_message(at)
        if assertion is None and config.cudagraphs and v.example.device.type == "cuda":
            return None        # (checked there, a failure waits for the GPU, which no CUDA graph
            #                    records: a break leaves the graphs on either side to record)
        return needed, assertion

    def check_branch_to_raise(self, inst) -> bool:
        """A branch on a tensor's value whose other side raises (branch_to_raise): a check in
        the graph that the value is as the side taken needs (custom_ops.check), and the trace
        goes on along that side, where the branch would break the graph. An assert of a
        constant message raises its AssertionError from the check; any other raise is
        RaisingPathTaken: the frame runs again from the graph's start as Python (Segment.run),
        which raises what eager raises, with eager's message."""
        found = self.branch_to_raise(inst)
        if found is None:
            return False
        needed, assertion = found
        v = self.pop()
        cond = v if needed else self.output.call("call_function", torch.logical_not, [v], {})
        error, message = ("AssertionError", assertion[0]) if assertion is not None else \
            (custom_ops.RaisingPathTaken.__name__, None)
        self.output.call("call_function", custom_ops.check,
                         [cond, ConstantVariable(error), ConstantVariable(message)], {})
        if needed == inst.opname.endswith("IF_TRUE"):
            self.jump_to(inst)
        return True

    def _cond_jump(self, inst, jump_if: Callable[[VariableTracker], bool]):
        v = self.pop()
        if jump_if(v):
            self.jump_to(inst)

    def _is_none(self, v):
        if isinstance(v, SymIntVariable):
            return False                  # a size is an int (its value not read: it stays symbolic)
        if isinstance(v, ConstantVariable):
            return v.value is None
        if isinstance(v, NullVariable):
            return True
        if isinstance(v, (TensorVariable, NNModuleVariable, BaseListVariable, DictVariable,
                          UserObjectVariable, CallableVariable, NestedFunctionVariable, PartialVariable,
                          BoundMethodVariable, IteratorVariable, SymIntVariable, GeneratorVariable,
                          LazyIteratorVariable, ExceptionVariable, WeakRefVariable, GradModeVariable,
                          InferenceModeVariable)):
            return False                  # a value the trace tracks is never None
        raise self.unsupported(f"'is None' on {v.describe()}")


# builtin types whose methods the trace calls as `cls.method(value, ...)` on a value of that type
_UNBOUND_METHOD_TYPES = (str, bytes, int, float, complex, bool, set, frozenset, list, tuple, dict)


def _never_equal(a: VariableTracker, b: VariableTracker) -> bool:
    """`a == b` of a dict, list, tuple or set of the trace and a value of another kind (a
    constant, another kind of container) is False, as in Python: neither side's __eq__ knows
    the other, so identity decides (ESM's `rope_type == "longrope"` with a dict of rope types)."""
    kinds = {DictVariable: (dict,), SetVariable: (set, frozenset), TupleVariable: (tuple,),
             NamedTupleVariable: (tuple,), ListVariable: (list,)}
    kind = kinds.get(type(a))
    other = type(b.value) if isinstance(b, ConstantVariable) else \
        kinds[type(b)][0] if type(b) in kinds else None
    return kind is not None and other is not None and not issubclass(other, kind)


# what a function guarded by its code is made of: the trace's own variables of them
_FUNCTION_PARTS = {"__code__", "__defaults__", "__kwdefaults__", "__closure__", "__globals__"}
# what every function has (no guard that it does)
_FUNCTION_ATTRIBUTES = {"__name__", "__qualname__", "__doc__", "__module__", "__dict__", "__annotations__"}


def _as_size_arithmetic(sym: str, a: VariableTracker, b: VariableTracker) -> Optional[Callable]:
    """A shift or mask of a symbolic int by a constant, written as the arithmetic sizes have
    (the same value for every int, negative ones too): n >> k is n // 2**k, n << k is n * 2**k,
    n & (2**k - 1) is n % 2**k, n & -2**k (~(2**k - 1)) is n - n % 2**k. -> a function of the
    output graph that makes it, or None."""
    op = sym.rstrip("=") if sym not in ("==", "!=", "<=", ">=") else None
    if op not in (">>", "<<", "&") or not isinstance(a, SymIntVariable) or type(a.example) is not int \
            or isinstance(b, SymIntVariable) or not isinstance(b, ConstantVariable) or type(b.value) is not int:
        return None
    k = b.value
    if op in (">>", "<<") and 0 <= k <= 62:
        return lambda out: out.sym_arith(operator.floordiv if op == ">>" else operator.mul, a, ConstantVariable(2 ** k))
    if op == "&" and k > 0 and k & (k + 1) == 0:
        return lambda out: out.sym_arith(operator.mod, a, ConstantVariable(k + 1))
    if op == "&" and k < 0 and -k & (-k - 1) == 0:
        return lambda out: out.sym_arith(operator.sub, a, out.sym_arith(operator.mod, a, ConstantVariable(-k)))
    return None


def _number_type(v: VariableTracker) -> Optional[type]:
    """int or float for a size, a number input or a finite number constant; else None."""
    value = v.example if isinstance(v, SymIntVariable) else getattr(v, "value", None) \
        if isinstance(v, ConstantVariable) else None
    if type(value) is int or type(value) is float and math.isfinite(value):
        return type(value)
    return None


def _holds_sizes(v: VariableTracker) -> bool:
    """A tuple or list with a symbolic size among its items."""
    return isinstance(v, BaseListVariable) and any(isinstance(i, SymIntVariable) for i in v.items)


# the methods Python tries for a binary operator: the left operand's, the right one's reflected
_OPERATOR_METHODS = {
    "+": ("__add__", "__radd__"), "-": ("__sub__", "__rsub__"), "*": ("__mul__", "__rmul__"),
    "/": ("__truediv__", "__rtruediv__"), "//": ("__floordiv__", "__rfloordiv__"),
    "%": ("__mod__", "__rmod__"), "**": ("__pow__", "__rpow__"), "@": ("__matmul__", "__rmatmul__"),
    "&": ("__and__", "__rand__"), "|": ("__or__", "__ror__"), "^": ("__xor__", "__rxor__"),
    "<<": ("__lshift__", "__rlshift__"), ">>": ("__rshift__", "__rrshift__"),
    "<": ("__lt__", "__gt__"), "<=": ("__le__", "__ge__"), ">": ("__gt__", "__lt__"),
    ">=": ("__ge__", "__le__"), "==": ("__eq__", "__eq__"), "!=": ("__ne__", "__ne__"),
}


def _operand_type(v: VariableTracker) -> Optional[type]:
    """The class of an operand whose class Python's operator order is decided on: an object of
    a Python class, or a constant."""
    if isinstance(v, UserObjectVariable):
        return type(v.value)
    return type(v.as_example()) if v.is_constant() else None


def _sequence_variable(value):
    """A constant tuple, torch.Size or list as a variable of its kind, its items constants
    (for an operator with a sequence holding sizes: torch.Size + (n,) is a torch.Size)."""
    kind = SizeVariable if isinstance(value, torch.Size) else TupleVariable if isinstance(value, tuple) \
        else ListVariable
    return kind([ConstantVariable(v) for v in value])


@functools.lru_cache(maxsize=4096)
def _is_python_class(cls) -> bool:
    """A class of the user's (not torch's, not a builtin), whose attributes may be set."""
    return isinstance(cls, type) and type(cls) in (type, abc.ABCMeta) and not _torch_or_builtin(cls)


_DESCRIPTOR_BASES = (property, staticmethod, classmethod, functools.cached_property)


def _own_descriptor_methods(attr) -> bool:
    """A subclass of property, staticmethod, classmethod or cached_property whose class has a
    __get__, __set__ or __delete__ of its own (a classproperty): Python runs those, not the
    base's, which the trace models."""
    base = next((b for b in _DESCRIPTOR_BASES if isinstance(attr, b)), None)
    return base is not None and type(attr) is not base and any(
        getattr(type(attr), m, None) is not getattr(base, m, None) for m in ("__get__", "__set__", "__delete__"))


# the modules whose functions torch's own code reads and users replace: those reads are guarded
_PATCHED_NAMESPACES = (torch, torch.nn.functional)


def _torch_or_builtin(cls: type) -> bool:
    """A class of torch's own or a builtin (trusted: not guarded). torchvision's, torchao's or
    a package "torchutils"'s are the user's."""
    return str(getattr(cls, "__module__", "")).split(".")[0] in ("torch", "builtins")


def _instance_dict(value) -> Optional[dict]:
    """value's __dict__, read past its class's own __getattribute__ (None: it has none)."""
    try:
        return object.__getattribute__(value, "__dict__")
    except AttributeError:
        return None
