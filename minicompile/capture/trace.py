"""The tracing entry: one call of a function (from an instruction offset) -> a Segment.

Takes: a function, the call's arguments (or, at a resume point, the live state), the offset.
Hands on: `trace_segment` -> a frame.Segment (the FX graph, its guard and input fetchers, the
templates that rebuild the Python values after the graph, the side effects to replay);
`capture` -> a Capture, the whole-graph form used by capture_graph and the book.
"""
from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.fx

from .. import aliasing, autocast, custom_ops, ir
from .breaks import GraphBreak, ObservedException, Unsupported
from .higher_order import leaf_requiring_grad
from .iterators import let_go_in_a_block, suspended
from .bytecode import check_python_version, handler_at
from .guards import ArgBinding, bind_arguments, frame_target
from .sources import AttrSource, ItemSource, LocalSource, RootSource
from .values import (DELETED, NULL, ClosureCellVariable, DictVariable, GlobalWritesVariable, IteratorVariable,
                     ListVariable, SetVariable, UserObjectVariable, WithExitVariable, tensor_keys_to)
from .output_graph import OutputGraph, _is_internal_module_name
from .translator import InstructionTranslator


# ----------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------
@dataclass
class Capture:
    gm: torch.fx.GraphModule
    example_inputs: List[torch.Tensor]
    get_inputs: Callable[[tuple, dict], List[torch.Tensor]]
    build_output: Callable[[Sequence[torch.Tensor]], Any]
    guard: Callable[[tuple, dict], bool]
    guard_source: str
    code: types.CodeType
    get_inputs_source: str = ""
    input_sources: Optional[List[str]] = None


def _is_impure(node: torch.fx.Node) -> bool:
    """Kept even when nothing reads its result: a write (aliasing.written), or impure for FX."""
    if node.op in ("placeholder", "output") or ir.draws_random_numbers(node):
        return True
    if node.op in ("call_method", "call_function"):
        return bool(aliasing.node_writes(node)) or \
            node.op == "call_function" and node.is_impure()
    return False


# views whose sizes must fit their input's (`y.reshape(2, -1)`: its numel even)
_CHECKED_VIEWS = {"view", "reshape", "expand", "unflatten", "view_as", "expand_as", "narrow", "select",
                  torch.reshape, torch.narrow, torch.select, torch.unflatten}


def _impure_at_dynamic_sizes(graph: torch.fx.Graph):
    """_is_impure, and where the graph is generic in sizes, a view nothing reads whose sizes
    must fit its input's: the compiled code checks them (its guards) as eager's view raises."""
    dynamic = any(n.meta.get("dynamic_dims") for n in graph.nodes if n.op == "placeholder")

    def impure(node: torch.fx.Node) -> bool:
        return _is_impure(node) or dynamic and node.op in ("call_method", "call_function") and \
            node.target in _CHECKED_VIEWS
    return impure


def _effect_templates(output, builder, source_fn):
    effects = []
    for var in output.side_effects:
        if source_fn(var.source) is None:
            raise output.unsupported("a side effect on state outside the frame in a whole-graph capture")
        if isinstance(var, IteratorVariable):
            effects.append(("advance", source_fn(var.source), var.index))
        elif isinstance(var, ListVariable):
            effects.append(("list", source_fn(var.source), ["tuple", [builder.build(v) for v in var.items]]))
        elif isinstance(var, SetVariable):
            effects.append(("setsteps", source_fn(var.source), list(var.steps)))
        elif type(var) is DictVariable:          # (a ModelOutput's are its attributes)
            effects.append(("dict", source_fn(var.source),
                            [(k, builder.build(v)) for k, v in var.items.items()]))
        elif isinstance(var, GlobalWritesVariable) and isinstance(var.owner, type):
            effects.append(("attrs", source_fn(var.source), [(k, builder.build(v)) for k, v in var.items.items()]))
        elif isinstance(var, GlobalWritesVariable):
            writes = [(k, ["deleted"] if v is DELETED else builder.build(v)) for k, v in var.items.items()]
            effects.append(("setitems", source_fn(var.source), writes))
        else:
            # an object's attributes: stored as object.__setattr__ stores them, since the trace
            # ran its class's own __setattr__ or property setter already (a module's as
            # nn.Module.__setattr__ decides: a parameter, a buffer or a plain attribute)
            kind = "objattrs" if isinstance(var, UserObjectVariable) else "attrs"
            effects.append((kind, source_fn(var.source), [(k, ["deleted"] if v is DELETED else builder.build(v))
                                                          for k, v in var.items.items()]))
    output.guard_container_aliasing()
    return effects


def traceable_target(fn) -> Tuple[types.FunctionType, tuple, dict]:
    """guards.frame_target(fn), or Unsupported when there is no bytecode minicompile traces."""
    try:
        func, pre, pre_kw = frame_target(fn)
    except TypeError as e:
        raise Unsupported(f"capture of {type(fn).__name__} {fn!r}",
                          f"only Python functions have bytecode to trace ({e})") from None
    if func.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise Unsupported(f"capture of generator/coroutine {func.__qualname__}")
    return func, pre, pre_kw


class _LeafLeaves(Exception):
    """A leaf the graph made (`x.clone().requires_grad_()`) would leave it: trace again,
    breaking the graph at the call that makes it (_leaves_stay_inside)."""


def trace_segment(fn, args: tuple, kwargs: dict, offset: int = 0, **options):
    """_trace_segment; where a leaf the graph made would leave it, traced again with a graph
    break at the call that makes the leaf, as TorchDynamo breaks there (an FGSM step's
    `x.clone().requires_grad_()`, whose `.grad` the code reads after backward)."""
    try:
        return _trace_segment(fn, args, kwargs, offset, **options)
    except _LeafLeaves:
        return _trace_segment(fn, args, kwargs, offset, leaf_breaks=True, **options)


def _trace_segment(fn, args: tuple, kwargs: dict, offset: int = 0, *, breaks: bool = True,
                   eager: bool = False, sources_in_templates: bool = True, dynamic=None, leaf_breaks: bool = False):
    """Trace `fn`'s code from `offset` to a return or a graph break -> frame.Segment.

    offset 0: (args, kwargs) are the call's arguments. A resume offset: args is () and kwargs
    the live state at that point (locals by name, the value stack as ___stack0, ...).
    breaks=False: any Unsupported propagates (a whole-graph capture, fullgraph=True).
    eager=True: the frame runs eagerly (Dynamo skipped it): user calls are not inlined and
    any instruction the concrete executor knows is a break.
    leaf_breaks=True: a graph-made tensor made to require grad is a graph break there."""
    from . import frame as F
    check_python_version()
    kwargs = dict(kwargs or {})
    func, pre, pre_kw = traceable_target(fn)
    code = func.__code__
    if offset == 0:
        args, kwargs = pre + tuple(args), {**pre_kw, **kwargs}
        try:
            binding, values = bind_arguments(func, args, kwargs)
        except TypeError as e:
            raise Unsupported(f"arguments do not match {func.__qualname__}: {e}",
                              "the eager call will raise the same error")
    else:
        names = tuple(sorted(kwargs))
        binding = ArgBinding(0, names, {k: f"kwargs[{k!r}]" for k in names})
        values = dict(kwargs)
    output = OutputGraph(func)
    output.breaks_allowed = breaks
    output.inline_user_calls = not eager
    output.dynamic_policy = dynamic
    output.leaf_breaks = leaf_breaks
    output.guards.global_state()
    gsrc = None
    if not _is_internal_module_name(func.__globals__.get("__name__", "")):
        gsrc = RootSource("G")          # F.__globals__ in the guard: the called function's
    stack_names = sorted((k for k in values if k.startswith("___stack")), key=lambda k: int(k[8:]))
    lazy = {name: (value, LocalSource(name)) for name, value in values.items()
            if not name.startswith("___stack")}
    fresh = {}
    if offset == 0 and code.co_flags & inspect.CO_VARKEYWORDS:
        # **kwargs is a dict made for this call: the frame's own to change (its items are the
        # call's keyword arguments, whose names the call-shape check fixes)
        name = code.co_varnames[code.co_argcount + code.co_kwonlyargcount +
                                bool(code.co_flags & inspect.CO_VARARGS)]
        value, src = lazy.pop(name)
        fresh[name] = (value, src)
        output.guards.dict_keys(src, value)     # which names, in the caller's order
    tx = InstructionTranslator(output, func, {}, lazy, parent=None, globals_source=gsrc)
    for name, (value, src) in fresh.items():
        tx.locals[name] = DictVariable({k: output.wrap(v, ItemSource(src, k)) for k, v in value.items()})
    for name in code.co_cellvars if offset else ():
        if isinstance(values.get(name), types.CellType):
            # a cell a function made before a break holds (frame.Segment.run passes it on):
            # read and written as that cell, which the function's calls read and write too
            cell, src = values[name], tx.lazy_locals.pop(name)[1]
            tx.closure_cells[name] = output.cells[id(cell)] = ClosureCellVariable(
                cell, src, AttrSource(src, "cell_contents"))
    grad, autocast_state = torch.is_grad_enabled(), autocast.state()
    output.entry_modes = grad, autocast_state       # (a skip's guard is checked at a call's entry)
    break_grad = None
    ns = output.guards.namespace

    def source_fn(src):
        return F.SourceRead(src.expr(), ns) if sources_in_templates else None

    # tracing runs the ops on real values: random ones draw from PyTorch's generator, which
    # is put back as it was, so the compiled code draws what eager would (ir.RANDOM_FUNCTIONS)
    with ir.preserved_rng(), tensor_keys_to(output.tensor_keys):
        try:
            output.tx = tx
            for k in stack_names:
                v = values[k]
                tx.stack.append(NULL if v is F.NULL_VALUE else output.wrap(v, LocalSource(k)))
            if offset:
                tx.pc = tx.offset_to_index[offset]
                # grad-mode blocks a break was inside, still open here (their exits on the stack)
                tx.with_depth = sum(isinstance(v, WithExitVariable) for v in tx.stack)
            try:
                try:
                    ret, end = tx.run(), "return"
                except ObservedException as raised:       # out of the frame: raised after the graph
                    ret, end = raised.exc, "raise"
                if let_go_in_a_block(tx, [ret]):
                    why = "a generator let go of inside a `with` block of its own: it runs as Python"
                    err = Unsupported(why, "CPython closed it then, leaving its block, which the trace did not")
                    err.as_python = True
                    raise _skipping(err, why, output, binding)
                builder = F.TemplateBuilder(tx, source_fn)
                output.tx = tx
                template = builder.build(ret)
                reason, inst, kw = None, None, ()
                effects = _effect_templates(output, builder, source_fn)
            except GraphBreak as gb:
                reason, inst = gb.unsupported, gb.inst
                ok = inst.opname in (F.EXECUTABLE if eager else F.RESUMABLE)
                why = None
                if getattr(reason, "internal", False):
                    why = "minicompile's interpreter failed here: the rest runs as Python"
                elif getattr(reason, "own_frame", False):
                    why = "a call that reads its caller's frame: the rest runs as Python"
                elif tx.exc_info is not None:
                    # CPython's exception state (sys.exc_info(), a bare `raise`) cannot be
                    # handed to the rest of the frame. (A break in a try body or in the body of
                    # a `with` entered for real is resumed: an exception the breaking
                    # instruction raises goes to the frame's handler, Segment.run)
                    why = "a graph break inside an exception handler: the frame runs eagerly"
                elif tx.with_depth and not _open_blocks_resumable(tx):
                    why = "a graph break inside a `with` block (other than a grad mode's or autocast's) is not resumed"
                elif suspended(tx, list(tx.locals.values()) + list(gb.stack)) or let_go_in_a_block(tx, []):
                    # CPython closes it when the frame lets go of it (its `with` exits and
                    # finally blocks run then), which neither a chain of segments nor one run
                    # eagerly (whose generator is real, let go of at a break) can do
                    why = "a graph break while a generator of the frame is paused part way: it runs as Python"
                    reason.as_python = True
                elif not ok:
                    why = f"a graph break at {inst.opname} (not a call, a jump or an index) is not resumed"
                elif not eager and F.maybe_has_backedge(tx):
                    why = "graph break in a for/while loop: the frame is skipped, as Dynamo does"
                if why is not None:
                    raise _skipping(reason, why, output, binding)
                builder = F.TemplateBuilder(tx, source_fn)
                live = F.live_locals(tx, inst.index)
                stack_t = [builder.build(v) for v in gb.stack]
                locals_t = {}
                lazy = list(tx.lazy_locals.items())      # (building a template may read a lazy one)
                for name, v in list(tx.locals.items()):
                    if name in live:
                        locals_t[name] = builder.build(v)
                for name, (value, src) in lazy:
                    if name in live:
                        locals_t[name] = ["src", source_fn(src)]
                for name, cell in tx.closure_cells.items():
                    if isinstance(cell, ClosureCellVariable) and cell.source is not None and name in live:
                        locals_t[name] = ["src", source_fn(cell.source)]      # the cell itself
                template = [stack_t, locals_t]
                end, kw = "break", gb.kw_names
                if torch.is_grad_enabled() != grad:
                    break_grad = torch.is_grad_enabled()     # inside a grad-mode block
                effects = _effect_templates(output, builder, source_fn)
                # the graph closes the autocast blocks open here, innermost first (a backend
                # that runs it as it is, explain's, leaves the state as it found it); the
                # break enters them for real (frame.py's "autocastexit")
                for v in reversed([v for v in tx.stack if isinstance(v, WithExitVariable)
                                   and v.autocast is not None and v.source is None]):
                    v.undo(tx)
        finally:
            output.leave_inference_mode(0)
            torch._C._set_grad_enabled(grad)
            autocast.set_state(autocast_state)
            output.tx = None
    if torch.is_grad_enabled() != grad:
        torch._C._set_grad_enabled(grad)
    output.tx = tx
    output.graph.output(tuple(p.node for p in builder.proxies))
    _leaves_stay_inside(output, builder, binding)
    output.graph.eliminate_dead_code(is_impure_node=_impure_at_dynamic_sizes(output.graph))
    gm = torch.fx.GraphModule(output.root_module, output.graph)
    output.guard_written_inputs()
    output.guard_tensor_keys()
    input_exprs = [s.expr() for s in output.input_sources]
    n_calls = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    seg = F.Segment(code=code, offset=offset, gm=gm, example_inputs=list(output.input_examples),
                    end=end, template=template, reason=reason,
                    break_inst=inst, kw_names=kw, break_grad=break_grad,
                    handler=handler_at(code, inst.offset) if end == "break" else None,
                    offset_to_index=tx.offset_to_index, instructions=tx.instructions,
                    n_calls=n_calls, eager=eager, input_sources=input_exprs, effects=effects,
                    raised_at=(getattr(ret, "raised_at", None) or []) if end == "raise" else [],
                    rerun_on_raise=(output.ops_under_handler or bool(effects)) and not output.written_inputs)
    seg.rerun_draws = (seg.rerun_on_raise or custom_ops.checks_branches(gm.graph)) and \
        any(ir.draws_random_numbers(n) for n in gm.graph.nodes)
    if output.inference_blocks:
        seg.inference_whole, seg.inference_outputs = _inference_outputs(gm, builder.proxies)
    seg.subclass_outputs = _subclass_outputs(builder.proxies)
    seg.guard_builder, seg.binding = output.guards, binding
    seg.use(output.guards.build(binding, input_exprs))
    return seg


def _inference_outputs(gm: torch.fx.GraphModule, proxies) -> tuple:
    """(whether every op of the graph ran in inference mode, the positions of the outputs
    that are inference tensors): see Segment.inference_outputs."""
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")
           and n.target is not torch._C._set_grad_enabled]
    whole = all(n.meta.get("inference_mode") for n in ops)
    outputs = [k for k, p in enumerate(proxies) if isinstance(t := p.node.meta.get("example_value"), torch.Tensor)
               and t.is_inference()]
    return whole, outputs


def _subclass_outputs(proxies) -> Optional[list]:
    """[(position, class)] of the outputs that are of a tensor subclass taking torch.Tensor's
    __torch_function__ (whose ops make the subclass again), or None."""
    found = [(k, type(t)) for k, p in enumerate(proxies) if isinstance(t := p.node.meta.get("example_value"), torch.Tensor)
             and type(t) is not torch.Tensor and getattr(type(t).__torch_function__, "__func__", None)
             is torch.Tensor.__torch_function__.__func__]
    return found or None


def _open_blocks_resumable(tx) -> bool:
    """Whether every `with` block open at a break is a grad mode's or autocast's: the break
    sets that mode (enters a real autocast), and the rest of the frame gets a real __exit__ for
    each (frame.py's "gradexit", "autocastexit")."""
    exits = [v for v in tx.stack if isinstance(v, WithExitVariable)]
    return len(exits) == tx.with_depth and all(v.grad_before is not None or v.autocast is not None
                                               for v in exits)


def _leaves_stay_inside(output: OutputGraph, builder, binding) -> None:
    """A leaf the graph made (`t.requires_grad = True`: higher_order.leaf_requiring_grad) is
    modelled while it stays inside the graph and gradients flow from the graph's inputs too:
    returned or stored, the caller could read its `.grad` (a compiled graph's output is no
    leaf); with no input that requires grad, the compiled graph's outputs would carry none.
    Else the frame runs eagerly (a skip guarded as any)."""
    made = [n for n in output.graph.nodes if n.target is leaf_requiring_grad]
    if not made:
        return
    leaving = {p.node for p in builder.proxies}
    why = None
    if any(n in leaving for n in made):
        why = "a tensor made to require grad (requires_grad = True) leaves the graph"
    elif not any(isinstance(t, torch.Tensor) and t.requires_grad for t in output.input_examples):
        why = "a tensor made to require grad (requires_grad = True) in a graph no input of which does"
    if why is not None and output.breaks_allowed and not output.leaf_breaks:
        raise _LeafLeaves(why)
    if why is not None:
        raise _skipping(Unsupported(why, "its gradient could be read, or the graph's outputs would carry none"),
                        why, output, binding)


def _skipping(err: Unsupported, why: str, output: OutputGraph, binding) -> Unsupported:
    """err, marked as a frame skip (`why`), guarded by what the trace relied on so far."""
    err.frame_skip = why
    err.skip_guard = _guard_so_far(output, binding)
    return err


def _guard_so_far(output: OutputGraph, binding) -> Optional[Callable]:
    """The guard of what a trace that stops (a frame it skips) relied on up to there:
    guard(F, args, kwargs) -> bool. Where it holds, a new trace would stop there too; where it
    fails (another instance of a class, a lazy module since initialized), the frame is traced
    again. None where it cannot be built (the skip then holds for every call)."""
    grad, autocast_state = torch.is_grad_enabled(), autocast.state()
    entry = output.entry_modes
    try:
        if entry is not None:    # (built where a call's check runs: with the modes of the entry,
            torch._C._set_grad_enabled(entry[0])      # not those of a block the trace is in)
            autocast.set_state(entry[1])
        return output.guards.build(binding, [s.expr() for s in output.input_sources]).guard
    except Exception:            # (a guard for a trace cut short: a skip that always holds)
        return None
    finally:
        torch._C._set_grad_enabled(grad)
        autocast.set_state(autocast_state)


def capture(fn, args: tuple, kwargs: dict) -> Capture:
    """Trace ONE call of `fn(*args, **kwargs)` into a single FX graph (fullgraph): anything
    that would be a graph break raises Unsupported. The Capture's `guard` and `get_inputs`
    take later calls of `fn` as (args, kwargs)."""
    seg = trace_segment(fn, args, kwargs, 0, breaks=False, sources_in_templates=False)
    template = seg.template
    from .frame import rebuild
    calls = _CallsOf(fn)

    def build_output(outs):
        return rebuild(template, outs, {})
    cap = Capture(gm=seg.gm, example_inputs=seg.example_inputs,
                  get_inputs=lambda args, kwargs: seg.get_inputs(*calls.frame_call(args, kwargs)),
                  build_output=build_output, guard=_CallGuard(seg.guard, calls),
                  guard_source=seg.guard_source, code=seg.code,
                  get_inputs_source=seg.get_inputs_source, input_sources=seg.input_sources)
    cap.segment = seg
    return cap


class _CallsOf:
    """Calls of one callable as its function's frame sees them: (F, args, kwargs)."""

    def __init__(self, fn):
        self.func, self.pre, self.pre_kw = traceable_target(fn)

    def frame_call(self, args, kwargs):
        return self.func, self.pre + tuple(args), {**self.pre_kw, **kwargs}


class _CallGuard:
    """An entry's generated guard (guards.GuardBuilder.build) for calls of one callable."""

    def __init__(self, guard, calls: _CallsOf):
        self.guard, self.calls = guard, calls
        self.failure_source = guard.failure_source

    def __call__(self, args, kwargs) -> bool:
        return self.guard(*self.calls.frame_call(args, kwargs))

    def failure(self, args, kwargs):
        return self.guard.failure(*self.calls.frame_call(args, kwargs))

    def fail_reason(self, args, kwargs):
        return self.guard.fail_reason(*self.calls.frame_call(args, kwargs))
