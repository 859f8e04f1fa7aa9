"""The public entry points: compile, explain, reset, mark_dynamic, mark_static_address.

Takes a user's function or nn.Module; hands each call to the cache of compiled entries for its
code object. On a miss: capture (capture/) -> the backend (graph_compiler.py by default) ->
a new entry guarded by what the trace relied on. What cannot be captured runs eagerly, with a
warning that gives the reason; with fullgraph=True it raises minicompile.Unsupported instead.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import gc
import itertools
import sys
import threading
import types
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.autograd.forward_ad as _forward_ad
from torch.utils._device import DeviceContext

from . import config, distributed, frame_store, ir, logs, metrics, optim
from .capture import SUPPORTED_VERSIONS, Unsupported
from .capture.breaks import DISABLE_MARK, never_traced
from .capture.calls import own_call as _class_own_call, torch_container
from .capture.frame import ResumeSegment
from .capture.guards import frame_target
from .capture.resume import called_from, calls_from, warn_from

SUPPORTED_PYTHONS = SUPPORTED_VERSIONS       # capture's list: the versions it has opcode tables for
# The settings each of torch.compile's modes stands for (options given with the mode win)
MODES = {None: {}, "default": {}, "reduce-overhead": {"cudagraphs": True},
         "max-autotune": {"autotune": True, "cudagraphs": True},
         "max-autotune-no-cudagraphs": {"autotune": True}}

# One _FrameCache per (code object, backend, options, fullgraph): its segments, newest first,
# as Dynamo's cache. Every callable running that code shares it (instances of a class,
# closures of one function): the entries' guards read the call's own self, cells, defaults
# and globals. The key holds the backend object itself, never its id(), which a later
# object could reuse.
_CACHES: dict[tuple, "_FrameCache"] = {}
_FRAME_IDS = itertools.count()
_COMPILE_LOCK = threading.RLock()   # held while a frame's segment is traced and compiled
_GENERATION = 0        # bumped whenever entries of _CACHES are dropped (compiled objects re-look)
_NESTED = threading.local()   # how deep calls made at graph breaks are nested, per thread


def cache_info() -> dict:
    """The whole-graph cache since the process started: hits, misses, stores, entries found
    corrupted, graphs not stored, frames saved and loaded (frame_store.py); and its directory
    (runtime/cache.py)."""
    from .runtime import cache
    return cache.info()


def reset() -> None:
    """Forget every compiled entry (as torch._dynamo.reset()). Counters: minicompile.metrics.reset()."""
    global _FRAME_IDS, _GENERATION
    _CACHES.clear()
    _GENERATION += 1
    _FRAME_IDS = itertools.count()


def mark_dynamic(tensor: torch.Tensor, dim) -> None:
    """Compile graphs that take `tensor` generic in dimension `dim` (an int or a list of
    ints) from the first compile on, as torch._dynamo.mark_dynamic does. It records the mark
    where TorchDynamo reads it, so either function marks a tensor for both compilers.
    A dim of size 0 or 1 is specialized all the same."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"mark_dynamic takes a tensor, not {type(tensor).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim) if isinstance(dim, (list, tuple)) else None
    if dims is None or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"mark_dynamic: dim must be an int or a list of ints, not {dim!r}")
    for d in dims:
        if not -tensor.dim() <= d < tensor.dim():
            raise IndexError(f"mark_dynamic: dim {d} is out of range for a tensor of "
                             f"{tensor.dim()} dims")
    marked = set(getattr(tensor, "_dynamo_dynamic_indices", set()))
    tensor._dynamo_dynamic_indices = marked | {d % tensor.dim() for d in dims}


def mark_static_address(tensor: torch.Tensor) -> None:
    """Say that `tensor` stays at its address from call to call (a static KV cache, a buffer
    updated in place), as torch._dynamo.mark_static_address does, recording the mark where
    TorchDynamo reads it: mode="reduce-overhead" then uses it in place, as it does parameters,
    instead of copying it into its recording per call (and back, where the graph writes it).
    If it moves all the same, the graph is recorded again."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"mark_static_address takes a tensor, not {type(tensor).__name__}")
    tensor._dynamo_static_input_type = "unguarded"


def _dynamic_policy(frame: "_FrameCache", offset: int, dynamic, backend):
    """Which dims of each graph input are dynamic, read when the tracer meets the input:
    - those marked with mark_dynamic, always;
    - dynamic=True: every dim of every tensor but parameters and module buffers, and every
      int argument;
    - dynamic=None ("automatic dynamic", TorchDynamo's default): a dim whose size differs from
      the size the previous compile of this frame saw, an int argument whose value differs;
      the first compile is static;
    - dynamic=False: none (but marked ones);
    - dynamic="numbers" (the compiled optimizer step's): every number argument, no tensor dim.
    None when the backend cannot take dynamic graphs (it would compile them for one size)."""
    if not getattr(backend, "supports_dynamic_shapes", False):
        return None

    def policy(source: str, t) -> set:
        if not isinstance(t, torch.Tensor):            # an int argument: {0} makes it symbolic
            key, seen = frame.saw(offset, source, t)
            if dynamic is None and seen is not None and seen != t:
                frame.auto_dynamic[key] = {0}
            if type(t) is int and not ir.INT64_MIN <= t <= ir.INT64_MAX:
                return set()            # (the kernels take int64: one past it is static, by value)
            return {0} if dynamic in (True, "numbers") or frame.auto_dynamic.get(key) else set()
        dims = set(getattr(t, "_dynamo_dynamic_indices", ()))
        if dynamic == "numbers":
            return dims
        key, seen = frame.saw(offset, source, t)
        static_kind = isinstance(t, torch.nn.Parameter) or source.endswith("]") and "_buffers" in source
        if dynamic is True and not static_kind:
            dims |= set(range(t.dim()))
        elif dynamic is None:
            auto = frame.auto_dynamic.setdefault(key, set())
            if seen is not None and len(seen) == t.dim():
                changed = {d for d in range(t.dim()) if seen[d] != t.size(d)}
                if changed - auto:
                    logs.log("dynamic", f"{source}: size of dims {sorted(changed - auto)} changed "
                                        f"({seen} -> {tuple(t.shape)}): compiled as dynamic")
                auto |= changed
            dims |= {d for d in auto if d < t.dim()}      # (dims seen to change at another rank: not these)
        return dims

    def iterator_advanced(source: str, left: int) -> bool:
        """Whether an iterator the frame reads at `source` had another number of items left
        when a trace of this frame met it before (it is advanced across calls: `next(batches)`
        each step): then it is an object the graph does not read, as TorchDynamo's (next() on
        it is a graph break), not one graph per item it has left."""
        key, seen = frame.saw(offset, source, ("iterator", left))
        if seen is not None and seen != ("iterator", left):
            frame.auto_dynamic[key] = {0}
        return bool(frame.auto_dynamic.get(key))
    policy.iterator_advanced = iterator_advanced
    return policy


def _eager_backend(gm, example_inputs):
    return gm


_eager_backend.supports_dynamic_shapes = True          # the graph runs as PyTorch: any size


def _inductor_backend(gm, example_inputs):
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs)


def _resolve_backend(backend) -> tuple[Callable, str]:
    if backend in (None, "minicompile"):
        from .graph_compiler import backend as ours
        return ours, "minicompile"
    if backend == "eager":
        return _eager_backend, "eager"
    if backend == "inductor":
        return _inductor_backend, "inductor"
    if callable(backend):
        return backend, getattr(backend, "__name__", repr(backend))
    raise ValueError(f"backend must be 'minicompile', 'inductor', 'eager' or a callable "
                     f"(gm, example_inputs) -> callable, not {backend!r}")


def _compiled_function(fn, fullgraph, backend, dynamic, options):
    return CompiledFunction(fn, fullgraph=fullgraph, backend=backend, dynamic=dynamic, options=options)


class CompiledFunction:
    """A function whose calls go through minicompile's cache of compiled entries."""

    _minicompile_original = "fn"          # (capture.breaks.COMPILED_ORIGINAL: traced inside another's)

    def __init__(self, fn: Callable, *, fullgraph: bool, backend, dynamic, options=None):
        self.fn = fn
        self.options = dict(options or {})
        self.fullgraph = fullgraph
        self.backend, self.backend_name = _resolve_backend(backend)
        self.dynamic = dynamic
        self.eager_reason: Unsupported | None = None
        self._backend_arg = backend
        self._callees: dict = {}
        self._steps = weakref.WeakKeyDictionary()     # optimizer -> its compiled step
        self._around_logged: set = set()      # ids of modules whose hooks' log line was printed
        self.quiet = False            # True for a function compiled on its own at a graph break
        self._frame, self._frame_generation, self._frame_code = None, -1, None
        # the Python function the calls run, and what `fn` passes it before the caller's
        # arguments (a bound method's self, a partial's arguments): guards.frame_target
        self._func = None
        self._retarget()
        # what a partial or a callable object runs can change after compile() (the partial's
        # keywords dict, the class's __call__): found again on each of their calls
        self._per_call = self._func is not None and not isinstance(fn, (types.FunctionType, types.MethodType))
        functools.update_wrapper(self, fn)
        # compile(opt.step): the call runs minicompile's compiled step (optim.py)
        self._optimizer = optim.step_method(fn)
        if not hasattr(self, "__name__"):            # a partial, a callable object
            self.__name__ = getattr(self._func, "__name__", None) or type(fn).__name__

    def __reduce__(self):
        """Copied (deepcopy: an EMA of the model) or pickled (torch.save(model)) as what it
        compiles and how: the copy is compiled again, and finds the compiled entries this one
        made (they are keyed by code, not by object)."""
        return _compiled_function, (self.fn, self.fullgraph, self._backend_arg, self.dynamic, self.options)

    def __get__(self, obj, objtype=None):
        """Decorating a method in a class body: read from an instance, bound to it (as a
        function is), so `obj.method(x)` passes obj as self."""
        return self if obj is None else types.MethodType(self, obj)

    @property
    def _key(self):
        # a list option (fusion_passes) is keyed as a tuple of the same items
        options = ((k, tuple(v) if isinstance(v, list) else v) for k, v in self.options.items())
        return (self._func.__code__, self.backend, tuple(sorted(options)), self.fullgraph, self.dynamic)

    def __call__(self, *args, **kwargs):
        if self._per_call:
            self._retarget()
        frame = self._frame
        # (the function's code may be replaced: IPython's autoreload edits it in place)
        if frame is None or self._frame_generation != _GENERATION or self._optimizer is not None \
                or self._frame_code is not getattr(self._func, "__code__", None):
            # found once, not per call (the key is computed, the cache looked up): a hit's
            # cost is the guard and the compiled code
            if self._optimizer is not None:
                return self._optimizer_step(self.fn, self._optimizer)(*args, **kwargs)
            if not _python_supported() or never_traced(self.fn) is not None:
                return self.fn(*args, **kwargs)
            if self._func is None:
                self._no_code()
                return self.fn(*args, **kwargs)
            frame = self._frame = _CACHES.setdefault(self._key, _FrameCache())
            self._frame_generation, self._frame_code = _GENERATION, self._func.__code__
        F, a, k = self._func, args, kwargs
        if self._pre:
            a = self._pre + args
        if self._pre_kw:
            k = {**self._pre_kw, **kwargs}
        if frame.eager_calls and frame.runs_eagerly(F, a, k) or _forward_ad._current_level >= 0 or \
                torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack() and _user_modes():
            # (forward-mode AD's dual tensors carry tangents no graph computes: eager does; so
            # it does what a dispatch or torch function mode the caller entered makes of each op)
            return self.fn(*args, **kwargs)
        # the newest entry of the frame's start whose guard holds: the common case, one graph
        for seg in frame.segments.get((0, False), ()):
            inputs = seg.check(F, a, k)
            if inputs is not None:
                break
        else:
            seg, inputs = self._segment(frame, 0, a, k, False)
            if seg is None:                       # the whole frame runs eagerly
                return self.fn(*args, **kwargs)
        # the frame is a chain of segments: graph, break run for real, resume point, ...
        eager = False
        while True:
            result = seg.run(F, a, k, self._call_for_real, inputs)
            if result[0] == "return":
                return result[1]
            kind, offset, state = result
            if kind == "raised":         # at a break in a try body: on at its handler, as Python
                return ResumeSegment(self._func.__code__, offset, state, _AT_HANDLER).run(F, (), state, None)[1]
            if kind == "rerun":          # the graph raised: the segment again, as Python
                if offset == 0:
                    return self.fn(*args, **kwargs)
                return ResumeSegment(self._func.__code__, offset, state, _GRAPH_RAISED).run(F, (), state, None)[1]
            a, k, eager = (), state, eager or seg.eager
            seg, inputs = self._segment(frame, offset, a, k, eager)
            if seg is None:
                return self.fn(*args, **kwargs)

    def _retarget(self):
        """guards.frame_target for this call; another function than the last call's is looked
        up in the caches afresh (its own code, its own entries)."""
        try:
            func, self._pre, self._pre_kw = frame_target(self.fn)
        except TypeError:
            func, self._pre, self._pre_kw = None, (), {}
        if func is not self._func:
            self._func, self._frame = func, None

    def _no_code(self):
        err = Unsupported(f"capture of {type(self.fn).__name__} {self.fn!r}",
                          "only Python functions (and methods, partials and objects whose "
                          "__call__ is one) have bytecode to trace")
        if self.fullgraph:
            raise err
        if self.eager_reason is None:
            self.eager_reason = err
            logs.warn(f"minicompile: {self.__name__} runs eagerly: {err}")

    def _segment(self, frame: "_FrameCache", offset: int, args, kwargs, eager: bool):
        """(the cached segment of this frame starting at `offset` whose guard holds, or a new
        one; its graph's inputs where its guard fetched them, else None). (args, kwargs): the
        call as the frame's function takes them (a method's self first)."""
        F = self._func
        if not eager and frame.skips(offset, F, args, kwargs):
            eager = True
        entries = frame.segments.get((offset, eager))
        if entries is None:
            entries = frame.segments[(offset, eager)] = []
        for seg in entries:
            inputs = seg.check(F, args, kwargs)
            if inputs is not None:
                return seg, inputs
        with _COMPILE_LOCK:
            # one compile at a time (threads calling at once): lowering's ops handler and the
            # lazy imports are the process's; another thread may have made the entry meanwhile
            for seg in entries:
                inputs = seg.check(F, args, kwargs)
                if inputs is not None:
                    return seg, inputs
            return self._miss(frame, offset, args, kwargs, eager, entries), None

    def _miss(self, frame: "_FrameCache", offset: int, args, kwargs, eager: bool, entries: list):
        """A call no entry's guard lets through: a re-bound entry, a new trace, or eager."""
        F = self._func
        from .capture.trace import trace_segment
        where = self.__name__ if offset == 0 else f"{self.__name__} (resume at offset {offset})"
        # a miss: ask each earlier entry which of its checks failed (the slow twin of its guard);
        # not once the frame is past its limit and has said so (then the call just runs eagerly)
        past_limit = (offset, eager) in frame.limit_warned
        failures = [] if eager or past_limit else [
            (seg, seg.guard.failure(F, args, kwargs)) for seg in entries if hasattr(seg.guard, "failure")]
        if offset == 0 and not eager:
            seg = _rebound(F, failures, args, kwargs)
            if seg is not None:                  # same arguments, passed another way
                entries.insert(0, seg)
                logs.log("guards", f"[{seg.compile_id}] {where} (arguments passed another way)"
                                   f"\n{seg.guard_source}")
                return seg
        owner = _owner(F, args)
        if offset == 0 and not eager and not _past_limit(entries, owner):
            seg = self._saved_segment(frame, args, kwargs)
            if seg is not None:
                seg.owner = owner
                entries.insert(0, seg)
                return seg
        if eager and offset and _past_limit(entries, None):
            # the rest of a skipped frame, traced again for each call (a float a break handed
            # on, `1 / (1 + loss.item())`, guarded by its value): past the limit, CPython runs it
            seg = ResumeSegment(self._func.__code__, offset, kwargs, _PAST_THE_LIMIT)
            if seg.resumable():
                entries.insert(0, seg)
                return seg
        if not eager and _past_limit(entries, owner):
            if (offset, eager) not in frame.limit_warned:      # once per frame, as Dynamo
                frame.limit_warned.add((offset, eager))
                logs.warn(_limit_text(self.fn, where, failures))
            if offset == 0:
                return None
            eager = True
            entries = frame.segments.setdefault((offset, eager), [])
        try:
            with config.patch(**self.options), _collector_paused(), metrics.timed("capture"):
                seg = trace_segment(F, args, kwargs, offset, breaks=not self.fullgraph,
                                    eager=eager,
                                    dynamic=None if eager else _dynamic_policy(frame, offset, self.dynamic,
                                                                                self.backend))
        except Unsupported as err:
            if self.fullgraph:
                raise
            err.kept()
            if not eager and not getattr(err, "as_python", False):
                # Dynamo skips the frame (here: from this segment on): it runs eagerly, its
                # calls to user functions are compiled on their own
                metrics.graph_breaks += 1
                _note_eager(frame.skipped.setdefault(offset, []), err)
                _record(None, err)
                logs.log("graph_breaks", f"frame {where} runs eagerly: "
                         f"{getattr(err, 'frame_skip', '')}\n{err}")
                return self._segment(frame, offset, args, kwargs, True)[0]
            if offset == 0:
                _note_eager(frame.eager_calls, err)
                self.eager_reason = err
                if self.quiet:               # a callee compiled on its own: the logs say it
                    logs.log("graph_breaks", f"{where} runs eagerly: {err}")
                else:
                    logs.warn(f"minicompile: {self.__name__} runs eagerly: {err}")
                return None
            # minicompile's interpreter cannot run the rest of the frame: CPython does, from a
            # resume function (capture/resume.py), as TorchDynamo's resume functions do
            seg = ResumeSegment(self._func.__code__, offset, kwargs, err)
            _record(None, err)
            logs.log("graph_breaks", f"{where}: the rest of the frame runs as Python: {err}")
            entries.insert(0, seg)
            return seg
        if not eager:
            if offset == 0 and not frame.logged_bytecode:
                frame.logged_bytecode = True
                if logs.enabled("bytecode"):
                    logs.log("bytecode", _original_bytecode(seg.code))
            if seg.n_calls:
                logs.log("graph_code", _graph_code(seg))
                if entries:
                    metrics.recompiles += 1
                    logs.log("recompiles", _recompile_text(self.fn, where, failures))
                try:
                    with config.patch(**self.options), ir.preserved_rng(), _collector_paused():
                        seg.compiled = self.backend(seg.gm, seg.example_inputs)
                    _add_shape_guards(seg)
                except NotImplementedError as err:
                    # a stage minicompile does not have yet (a dtype, an op): the captured
                    # graph runs on PyTorch's kernels instead, which gives eager's results
                    seg.compiled = None
                    logs.warn(f"minicompile: {where}: the graph runs on PyTorch's kernels, "
                              f"not compiled: {err}")
                metrics.graphs += 1
                _record(seg.gm, seg.reason)
            if seg.end == "break":
                metrics.graph_breaks += 1
                logs.log("graph_breaks", _break_text(seg))
                if not seg.n_calls:          # no graph to carry its reason: explain() keeps it
                    _record(None, seg.reason)
            if logs.enabled("bytecode"):
                logs.log("bytecode", describe_segment(seg, self.__name__))
        if not eager:
            # Dynamo's compile id: frame/attempt ("0/1" is the second compile of frame 0)
            if offset not in frame.frame_ids:
                frame.frame_ids[offset] = next(_FRAME_IDS)
            fid = frame.frame_ids[offset]
            seg.compile_id = f"{fid}/{_n_entries(entries)}"
            seg.owner = owner
            logs.log("guards", f"[{seg.compile_id}] {where}\n{seg.guard_source}")
            if offset == 0 and seg.compiled is not None and self._frame_store(frame):
                frame_store.save(frame.store_key, seg)
        entries.insert(0, seg)
        return seg

    def _frame_store(self, frame: "_FrameCache") -> str | None:
        """The file of the frame's saved entries (None: frames are not saved), and the entries
        other processes saved there, read on the first call."""
        if frame.saved is None:
            frame.store_key = frame_store.frame_key(self._func, self.backend_name, self._key[2], self.fullgraph,
                                                    self.dynamic)
            frame.saved = [r for r in frame_store.saved(frame.store_key) if r["process"] != frame_store.PROCESS] \
                if frame.store_key else []
        return frame.store_key

    def _saved_segment(self, frame: "_FrameCache", args, kwargs):
        """The first of the frame's entries saved by other processes (frame_store.py) whose
        guard holds for this call, as a new entry; None if there is none. Each saved entry is
        taken once at most."""
        self._frame_store(frame)
        for record in frame.saved:
            found = frame_store.segment(record, self._func, args, kwargs)
            if found is None:
                continue
            seg, inputs = found
            frame.saved.remove(record)
            for source, value in zip(seg.input_sources, inputs):
                frame.saw(0, source, value)      # what automatic dynamic compares later calls with
            metrics.graphs += 1
            fid = frame.frame_ids.setdefault(0, next(_FRAME_IDS))
            seg.compile_id = f"{fid}/{_n_entries(frame.segments.get((0, False), []))}"
            logs.log("guards", f"[{seg.compile_id}] {self.__name__} (saved by an earlier process: not "
                               f"captured again)\n{seg.guard_source}")
            return seg
        return None

    def _call_for_real(self, fn, args, kwargs, site=None):
        """A call made at a graph break. A user function (or a user module's forward) is
        compiled on its own, as Dynamo's frame hook compiles every frame it sees. Anything
        else is called from a frame that looks like the user's at `site` (code, line, globals:
        resume.called_from)."""
        target, pre = None, []
        if isinstance(fn, torch.nn.Module) and not fn._backward_hooks:
            # the module DDP or FSDP1 wraps, if fn is such a wrapper; a class made at run time
            # (FSDP2's FSDP<Name>) is judged by its forward
            inner = distributed.user_module(fn)
            forward = getattr(type(inner), "forward", None)
            if (own_call := _class_own_call(type(inner))) is not None:     # its class's __call__ (hooks inside)
                return self._callee(own_call)(inner, *args, **kwargs)
            if isinstance(forward, types.FunctionType) and getattr(inner.forward, "__func__", None) is forward:
                target, pre = forward, [inner]
        elif (opt := optim.step_method(fn)) is not None:
            return self._optimizer_step(fn, opt)(*args, **kwargs)
        elif isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            target, pre = fn.__func__, [fn.__self__]
        elif isinstance(fn, types.FunctionType):
            target = fn
        if target is None or _is_torch_internal(target.__module__ or "") and not (
                isinstance(fn, torch.nn.Module) and torch_container(fn)) or \
                never_traced(fn) is not None or never_traced(target) is not None or \
                target.__code__.co_flags & 0x2A0:          # generators, coroutines
            if fn is warnings.warn and site is not None:
                return warn_from(site, args, kwargs)
            return called_from(*site)(fn, args, kwargs) if site is not None else fn(*args, **kwargs)
        depth = getattr(_NESTED, "calls", 0)
        if depth >= sys.getrecursionlimit() // 50:
            # calls at breaks nested this deep (a recursive function): each compiled level
            # takes several Python frames of minicompile's, so the deeper ones run as Python,
            # where eager's recursion limit holds
            return called_from(*site)(fn, args, kwargs) if site is not None else fn(*args, **kwargs)
        callee = self._callee(target)
        _NESTED.calls = depth + 1
        try:
            if isinstance(fn, torch.nn.Module) and distributed.runs_around(fn):
                # a wrapper's forward and the hooks (FSDP's gather the parameters) run as Python
                return distributed.call_around(fn, functools.partial(callee, *pre), args, kwargs,
                                               self._around_logged)
            with calls_from(site) if site is not None else contextlib.nullcontext():
                return callee(*pre, *args, **kwargs)
        finally:
            _NESTED.calls = depth

    def _callee(self, target) -> "CompiledFunction":
        """A function called at a graph break, compiled on its own (once)."""
        callee = self._callees.get(target)
        if callee is None:
            callee = CompiledFunction(target, fullgraph=False, backend=self._backend_arg,
                                      dynamic=self.dynamic, options=self.options)
            callee.backend, callee.backend_name = self.backend, self.backend_name
            callee.quiet = True
            self._callees[target] = callee
        return callee

    def _optimizer_step(self, fn, opt) -> Callable:
        """`opt.step` (fn) as minicompile's compiled step, made once per optimizer; the
        optimizer's own where optim.py does not model it."""
        why = optim.why_not_modelled(opt)
        if why is not None:
            optim.log_not_modelled(opt, why)
            return fn
        step = self._steps.get(opt)
        if step is None:
            def compile_update(update):
                callee = CompiledFunction(update, fullgraph=False, backend=self._backend_arg,
                                          dynamic="numbers", options=self.options)
                callee.backend, callee.backend_name = self.backend, self.backend_name
                callee.quiet = True
                return callee
            step = self._steps[opt] = optim.CompiledStep(opt, compile_update,
                                                           scheduled=not isinstance(fn, types.MethodType))
        return step


_AT_HANDLER = Unsupported("an exception raised at a graph break in a try block",
                          "the frame goes on at its handler, which runs as Python")
_GRAPH_RAISED = Unsupported("a graph that raised at run time",
                            "the frame runs again from the graph's start, as Python")
_PAST_THE_LIMIT = Unsupported("the rest of a frame that runs eagerly, traced again at every call",
                              "past the recompile limit, it runs as Python")


def _note_eager(entries: list, err) -> None:
    """Calls like this one run eagerly (`entries`: a frame's skipped[offset] or eager_calls),
    guarded by what the trace that stopped relied on (err.skip_guard); past the recompile
    limit, or with no such guard, every call does."""
    guard = getattr(err, "skip_guard", None) if len(entries) < config.recompile_limit else None
    entries.append((guard, err))


def _holds(entries: list, F, args, kwargs) -> bool:
    return any(guard is None or guard(F, args, kwargs) for guard, _ in entries)


@dataclass
class _FrameCache:
    """Everything compiled for one code object: segments per (offset, eager), newest first."""
    segments: dict = field(default_factory=dict)
    # offset -> [(guard, why)]: the calls for which the rest of the frame runs eagerly (a
    # trace from there stopped where Dynamo skips a frame), each guarded by what that trace
    # relied on (another instance of a class is traced on its own); None: every call
    skipped: dict = field(default_factory=dict)
    # [(guard, why)]: the calls that run the whole frame eagerly (a trace of it, eager, could
    # not go on), each guarded as `skipped`'s; None: every call
    eager_calls: list = field(default_factory=list)
    logged_bytecode: bool = False
    frame_ids: dict = field(default_factory=dict)    # offset -> Dynamo-style frame id
    limit_warned: set = field(default_factory=set)
    # automatic dynamic: (offset, source) -> sizes the last trace saw / dims seen to change
    seen_sizes: dict = field(default_factory=dict)
    auto_dynamic: dict = field(default_factory=dict)
    # frame_store.py: the file of this frame's saved entries, and those not yet taken
    # (CompiledFunction._frame_store reads them once)
    store_key: str | None = None
    saved: list | None = None

    def runs_eagerly(self, F, args, kwargs) -> bool:
        """Whether this call runs the whole frame eagerly."""
        return _holds(self.eager_calls, F, args, kwargs)

    def skips(self, offset: int, F, args, kwargs) -> bool:
        """Whether the frame runs eagerly from `offset` for this call."""
        return _holds(self.skipped.get(offset, ()), F, args, kwargs)

    def saw(self, offset: int, source: str, value) -> tuple:
        """Remember the sizes of a tensor input (the value of a number input) a trace met at
        `source`: -> (its key in seen_sizes and auto_dynamic, what was remembered before)."""
        # (a number there and a tensor another time: each its own key)
        key = (offset, source) if isinstance(value, torch.Tensor) else (offset, source, "number")
        seen = self.seen_sizes.get(key)
        self.seen_sizes[key] = tuple(value.shape) if isinstance(value, torch.Tensor) else value
        return key, seen

    def __iter__(self):          # the compiled segments
        return iter([seg for entries in self.segments.values() for seg in entries
                     if seg.compiled is not None])

    def __len__(self):
        return len(list(iter(self)))


_RECORDERS: list = []


def _record(gm, reason):
    for rec in _RECORDERS:
        rec.append((gm, reason))


def _is_torch_internal(modname: str) -> bool:
    """Functions of these modules, called at a graph break, run as they are, not compiled on
    their own: PyTorch's, minicompile's, and Python's standard library (TorchDynamo skips
    those files too)."""
    top = modname.split(".")[0]
    return top in ("torch", "minicompile") or top in sys.stdlib_module_names


def _n_entries(entries, owner=None) -> int:
    """Compiled entries (an entry re-bound for another call shape shares its compile id);
    with `owner`, those compiled for it (_owner)."""
    return len({getattr(e, "compile_id", id(e)) for e in entries
                if owner is None or getattr(e, "owner", None) == owner})


def _past_limit(entries, owner) -> bool:
    """config.recompile_limit entries compiled for this owner, or eight times as many in all."""
    return _n_entries(entries, owner) >= config.recompile_limit or \
        _n_entries(entries) >= 8 * config.recompile_limit


def _owner(F, args) -> tuple:
    """What an entry is compiled for: the functions, classes and modules F's closure holds
    (transformers' one wrapper function for every model class's forward, each with its own),
    and the module passed as self. The recompile limit counts an owner's entries: without a
    frame-evaluation hook, a frame past it runs eagerly with everything it calls."""
    held = []
    for cell in getattr(F, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:               # (an empty cell)
            continue
        if isinstance(value, (types.FunctionType, type, torch.nn.Module)):
            held.append(id(value))
    first = id(args[0]) if args and isinstance(args[0], torch.nn.Module) else None
    return tuple(held), first


def _add_shape_guards(seg) -> None:
    """Dynamic shapes: add to the entry's guard the conditions between sizes that its compiled
    code relies on (the backend's `shape_guards`, over its inputs arg0, arg1...), written over
    the inputs' sources."""
    conditions = getattr(seg.compiled, "shape_guards", None)
    if not conditions:
        return
    import re
    for cond in conditions:
        text = re.sub(r"\barg(\d+)\b", lambda m: seg.input_sources[int(m.group(1))], cond)
        seg.guard_builder.shape_condition(text, text)
    seg.use(seg.guard_builder.build(seg.binding, seg.input_sources))


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector off while a call is captured and while its graph is compiled:
    it runs on counts of allocations, and both make many short-lived objects, so it would walk
    torch's whole heap several times in one compile for little garbage (for GPT-2's training
    graphs, about a fifth of the compile's time on a CPU). On again after, whatever happens."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _rebound(F, failures, args, kwargs):
    """An entry whose only failing check is the call's shape (how the arguments were passed),
    re-bound to this call: no new trace and no compile, as Dynamo binds arguments before its
    guards run. None if there is none."""
    for i, (seg, failure) in enumerate(failures):
        if failure is None or not failure[0].startswith("call shape") \
                or not hasattr(seg.guard, "rebind"):
            continue
        new = seg.guard.rebind(F, args, kwargs)
        if new is None:
            continue
        if not new.guard(F, args, kwargs):
            # for the log: what failed besides the way the arguments were passed
            failures[i] = (seg, new.guard.failure(F, args, kwargs))
            continue
        clone = copy.copy(seg)
        clone.use(new)
        clone.compile_id = getattr(seg, "compile_id", "?")
        return clone
    return None


def _function_where(fn) -> tuple:
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    return (code.co_filename, code.co_firstlineno) if code is not None else ("?", 0)


def _failure_lines(compile_id, failure, prefix: str) -> list:
    """One entry's failed guard, as Dynamo prints it: `0/1: flag == True  # line`, then the
    user's stack where the trace relied on the value."""
    text, stack = failure
    lines = [f"{prefix}{compile_id}: {text}"]
    if stack:
        lines.append(f"{prefix}User stack trace:")
        for f, line, code, fn in stack:
            lines.append(f'{prefix}  File "{f}", line {line}, in {fn}')
            lines.append(f"{prefix}    {code.strip()}")
    return lines


def _recompile_text(fn, where: str, failures) -> str:
    """The `recompiles` log of one recompile, in the shape of torch 2.13's
    (torch._logging.set_logs(recompiles=True)): every earlier entry, newest first."""
    filename, line = _function_where(fn)
    lines = [f"Recompiling function {where} in {filename}:{line}",
             "    triggered by the following guard failure(s):"]
    for seg, failure in failures:
        if failure is not None:
            lines += _failure_lines(getattr(seg, "compile_id", "?"), failure, "    - ")
    return "\n".join(lines)


def _limit_text(fn, where: str, failures) -> str:
    """The recompile-limit warning, in the shape of torch.compile's: it names the failing
    guard of the newest entry ("last reason")."""
    filename, line = _function_where(fn)
    lines = [f"minicompile hit config.recompile_limit ({config.recompile_limit})",
             f"   function: '{where}' ({filename}:{line})"]
    last = next(((seg, f) for seg, f in failures if f is not None), None)
    if last is not None:
        seg, (text, stack) = last
        lines.append(f"   last reason: {getattr(seg, 'compile_id', '?')}: {text}")
        if stack:
            lines += _failure_lines("", (text, stack), "")[1:]
    lines.append('To log all recompilation reasons, use minicompile.set_logs(recompiles=True) '
                 'or MINICOMPILE_LOGS="recompiles".')
    lines.append(f"'{where}' runs eagerly (the recompile limit) for inputs that match none of "
                 f"its {config.recompile_limit} compiled entries.")
    return "\n".join(lines)


def _break_text(seg) -> str:
    r = seg.reason
    where = ""
    if r.user_stack:
        f, l, t = r.user_stack[-1]
        where = f"{f}:{l} ({t})"
    return (f"Graph break in {seg.code.co_name} at offset {seg.break_inst.offset} "
            f"({seg.break_inst.opname}) {where}\n{r}")


def _original_bytecode(code) -> str:
    import dis
    import io
    buf = io.StringIO()
    dis.dis(code, file=buf, depth=0)
    return f"ORIGINAL BYTECODE {code.co_name} {code.co_filename}:{code.co_firstlineno}\n{buf.getvalue()}"


def describe_segment(seg, name: str) -> str:
    """One segment of a transformed frame, as the Python it stands for (depyf's style)."""
    start = "entry" if seg.offset == 0 else f"resume point at offset {seg.offset}"
    ins = ", ".join(seg.input_sources) or "no tensor inputs"
    lines = [f"MODIFIED FRAME {name}, {start}:"]
    if seg.n_calls and not seg.eager:
        lines.append(f"    outs = __compiled_graph({ins})   # {seg.n_calls} ops, compiled")
    elif seg.n_calls:
        lines.append(f"    outs = __eager_graph({ins})   # {seg.n_calls} ops, run eagerly (frame skipped)")
    else:
        lines.append("    # no ops here: no graph")
    if seg.end == "return":
        lines.append("    return <rebuilt from outs>")
    elif seg.end == "raise":
        lines.append("    raise <rebuilt from outs>")
    else:
        inst = seg.break_inst
        stack_t, locals_t = seg.template
        text = seg.reason.user_stack[-1][2] if seg.reason.user_stack else ""
        lines.append(f"    # graph break: {seg.reason.reason}")
        lines.append(f"    stack, locals = <rebuilt from outs>  # stack depth {len(stack_t)}, "
                     f"live locals {sorted(locals_t)}")
        lines.append(f"    <run {inst.opname} for real>   # {text}")
        nxt = seg.instructions[inst.index + 1].offset if inst.index + 1 < len(seg.instructions) else None
        lines.append(f"    return __resume_{seg.code.co_name}_at_{nxt}(*stack, **locals)"
                     + ("   # or the jump target" if inst.opname.startswith(("POP_JUMP", "JUMP_IF")) else ""))
    return "\n".join(lines)


def _function_of(method):
    """The function a bound method runs (what a module's forward is, whichever object)."""
    return getattr(method, "__func__", method)


class CompiledModule(torch.nn.Module):
    """What compile(module) returns: it behaves like the original module (its parameters,
    state_dict keys and attributes are the original's), and its forward is compiled."""

    _minicompile_original = "_orig_mod"   # (capture.breaks.COMPILED_ORIGINAL: traced inside another's)

    def __init__(self, mod: torch.nn.Module, **options):
        super().__init__()
        self._orig_mod = mod
        # under DDP or FSDP1, the wrapped module's forward (distributed.py says why)
        inner = distributed.user_module(mod)
        own_call = _class_own_call(type(inner))
        # a class with its own __call__: that is compiled, as eager runs it (hooks and forward
        # are inside it, through super().__call__)
        self._compiled_forward = CompiledFunction(inner.forward if own_call is None else
                                                  types.MethodType(own_call, inner), **options)
        self._around_logged: set = set()
        # read on every call, so kept as plain attributes (a submodule is found through
        # nn.Module.__getattr__); whether `mod` is a wrapper is a matter of its class
        self.__dict__["_mod"], self.__dict__["_wrapper"] = mod, inner is not mod
        self.__dict__["_inner"], self.__dict__["_options"] = inner, options
        self.__dict__["_forward_fn"] = _function_of(inner.forward)
        self.__dict__["_own_call"] = own_call is not None
        # (its training flag is the original's: read and written there, as any attribute)
        del self.__dict__["training"]

    # the wrapper's own attributes; every other write goes to the original module, whose
    # forward the compiled code runs (`compiled.fc = nn.Linear(8, 10)`: a new head, trained)
    _OWN_ATTRIBUTES = frozenset({"_orig_mod", "_compiled_forward", "_around_logged"})

    def __setattr__(self, name, value):
        if name in CompiledModule._OWN_ATTRIBUTES or "_orig_mod" not in self.__dict__["_modules"]:
            super().__setattr__(name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        if name in CompiledModule._OWN_ATTRIBUTES:
            super().__delattr__(name)
        else:
            delattr(self._orig_mod, name)

    def __call__(self, *args, **kwargs):
        # the original's call (call_around) runs its hooks and the global ones; nn.Module's
        # call of this wrapper would run the global ones a second time (torch.compile's
        # OptimizedModule does, with a warning). Hooks put on the wrapper itself run as
        # nn.Module runs them.
        if self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks:
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if self._own_call:
            return self._compiled_forward(*args, **kwargs)
        forward = self._inner.forward
        if _function_of(forward) is not self._forward_fn:
            # forward was rebound (on the module's class or on it) since: the one it is now,
            # as eager's call would run it
            self.__dict__["_forward_fn"] = _function_of(forward)
            self._compiled_forward = CompiledFunction(forward, **self._options)
        mod = self._mod
        if self._wrapper or distributed.has_hooks(mod):
            # hooks and wrappers (DDP, FSDP) run as PyTorch's, around the compiled forward
            return distributed.call_around(mod, self._compiled_forward, args, kwargs,
                                           self._around_logged)
        return self._compiled_forward(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._orig_mod, name)

    # The original's names, without an `_orig_mod.` prefix (a deliberate difference from
    # torch.compile, whose checkpoints carry the prefix: Part I, "Training", shows both).
    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._orig_mod.named_buffers(*args, **kwargs)

    def extra_repr(self):
        return f"compiled by minicompile ({self._compiled_forward.backend_name})"


def compile(model: Callable | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend: Any = "minicompile", mode: str | None = None, options: dict | None = None,
            disable: bool = False):
    """Compile a function or an nn.Module, as torch.compile does.

    Forms: compile(fn), @compile, @compile(fullgraph=True), compile(module)."""
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                 mode=mode, options=options, disable=disable)
    if not isinstance(fullgraph, bool):
        raise TypeError(f"fullgraph must be True or False, not {fullgraph!r}")
    if dynamic not in (None, True, False):
        raise TypeError(f"dynamic must be None, True or False, not {dynamic!r}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; torch.compile's modes are 'default', "
                         "'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'")
    options = {**MODES[mode], **(options or {})}
    config.patch(**(options or {}))          # validates the names now, applies at compile time
    if disable:
        return model
    if isinstance(model, torch.nn.Module):
        return CompiledModule(model, fullgraph=fullgraph, backend=backend, dynamic=dynamic,
                              options=options)
    if not callable(model):
        raise TypeError(f"minicompile.compile takes a function or an nn.Module, not "
                        f"{type(model).__name__}")
    if getattr(model, "__func__", None) is torch.autograd.Function.apply.__func__:
        model = _calling_apply(model.__self__)
    return CompiledFunction(model, fullgraph=fullgraph, backend=backend, dynamic=dynamic,
                            options=options)


def _calling_apply(cls: type) -> Callable:
    """`cls.apply` (an autograd.Function's, compiled on its own: mambapy's `pscan = PScan.apply`)
    as a function whose frame calls it, which capture traces as any call of it; the frame of
    Function.apply itself hands on to a C method through super()."""
    def apply(*args, **kwargs):
        return cls.apply(*args, **kwargs)
    apply.__qualname__ = f"{cls.__qualname__}.apply"
    return apply


def compile_regions(model: torch.nn.Module, block: type | None = None, **options) -> torch.nn.Module:
    """Regional compilation: every submodule of class `block` (by default the class with the
    most instances in `model`, the layers of a transformer) compiled in place, as
    nn.Module.compile() does: its forward becomes the compiled one, and the module stays where
    it was, so the model's names (state_dict, named_parameters, get_submodule) and its hooks
    are eager's. All of them run one code object, whose guards check a block by its type and
    whose graph takes the block's parameters as inputs: the first block compiles, every other
    reuses that graph. `options` are compile()'s. Returns `model`."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"compile_regions takes an nn.Module, not {type(model).__name__}")
    if block is None:
        counts: dict = {}
        for m in model.modules():
            if m is not model and not _is_torch_internal(type(m).__module__):
                counts[type(m)] = counts.get(type(m), 0) + 1
        if not counts:
            raise ValueError("compile_regions: the model has no submodules of its own classes; "
                             "name the block class to compile")
        block = max(counts, key=counts.get)
    replaced = 0
    for child in model.modules():
        if type(child) is block and not isinstance(child.__dict__.get("forward"), CompiledFunction):
            child.forward = compile(child.forward, **options)      # (an attribute of the instance)
            replaced += 1
    if not replaced:
        raise ValueError(f"compile_regions: the model has no submodule of class {block.__name__}")
    return model


def disable(fn: Callable | None = None, *, reason: str | None = None):
    """`fn`, never traced: compiled code that calls it breaks the graph at the call, and the
    call runs as plain Python (as torch.compiler.disable; functions that one marks are treated
    the same). On an nn.Module, its forward is marked (on the instance). As a decorator:
    `@minicompile.disable` or `@minicompile.disable(reason="...")`."""
    if fn is None:
        return functools.partial(disable, reason=reason)
    why = f"marked with minicompile.disable ({reason})" if reason else "marked with minicompile.disable"
    if isinstance(fn, torch.nn.Module):
        fn.forward = disable(fn.forward, reason=reason)
        return fn
    if not callable(fn):
        raise TypeError(f"minicompile.disable takes a function or an nn.Module, not {type(fn).__name__}")

    @functools.wraps(fn)
    def never_traced_fn(*args, **kwargs):
        return fn(*args, **kwargs)
    setattr(never_traced_fn, DISABLE_MARK, why)
    return never_traced_fn


@dataclass
class ExplainOutput:
    """What explain() found, with the fields torch._dynamo.explain gives.

    graph_break_count is graph_count - 1, exactly as Dynamo computes it (so a frame that
    ran wholly eagerly reports -1, as Dynamo's does). break_reasons: one `Unsupported` per
    graph that ended at a break, and one per frame (or rest of a frame) that ran eagerly."""
    graphs: list = field(default_factory=list)
    graph_count: int = 0
    graph_break_count: int = 0
    break_reasons: list = field(default_factory=list)
    op_count: int = 0
    ops_per_graph: list = field(default_factory=list)

    def __str__(self):
        lines = [f"Graph Count: {self.graph_count}", f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}", "Break Reasons:"]
        for i, reason in enumerate(self.break_reasons, 1):
            lines.append(f"  Break Reason {i}:")
            lines.append(f"    Reason: {reason.reason}")
            if getattr(reason, "frame_skip", None):
                lines.append(f"    Frame runs eagerly: {reason.frame_skip}")
            if reason.explanation:
                lines.append(f"    Explanation: {reason.explanation}")
            if reason.hint:
                lines.append(f"    Hint: {reason.hint}")
            lines.append("    User Stack:")
            for filename, lineno, text in reason.user_stack:
                lines.append(f"      File \"{filename}\", line {lineno}: {text}")
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  Ops {i}:")
            lines += [f"    {op}" for op in ops]
        return "\n".join(lines)


def explain(fn: Callable):
    """explain(fn)(*args, **kwargs) -> ExplainOutput: the graphs and breaks of one call.

    Like torch._dynamo.explain, it runs the call (compiled afresh, graphs run as traced), so
    side effects such as prints happen; functions compiled on their own at breaks count too."""
    def run(*args, **kwargs):
        def explain_backend(gm, example_inputs):
            return gm
        compiled = compile(fn, backend=explain_backend)
        rec: list = []
        _RECORDERS.append(rec)
        try:
            compiled(*args, **kwargs)
        finally:
            _RECORDERS.remove(rec)
            _forget(explain_backend)
        out = ExplainOutput()
        for gm, reason in rec:
            if gm is not None:
                out.graphs.append(gm)
                ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
                out.ops_per_graph.append(ops)
                out.op_count += len(ops)
            if reason is not None:
                out.break_reasons.append(reason)
        out.graph_count = len(out.graphs)
        out.graph_break_count = out.graph_count - 1
        return out
    return run


def _forget(backend) -> None:
    """Drop the entries compiled with this backend (a throwaway one: explain's, capture_graph's):
    nothing will call them again."""
    global _GENERATION
    for key in [k for k in _CACHES if k[1] is backend]:
        del _CACHES[key]
    _GENERATION += 1


def capture_graph(fn: Callable, *args, **kwargs):
    """(gm, example_inputs): the one FX graph minicompile captures for this call of `fn` (a
    function or an nn.Module) and the inputs its backend receives (a module's parameters
    included), which is what `lower` takes. The call runs once (under torch.no_grad(): the
    graph is the inference graph minicompile compiles). A graph break raises Unsupported
    (fullgraph=True); explain(fn)(...).graphs lists the graphs of a call that breaks."""
    graphs: list = []

    def record(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm
    try:
        with torch.no_grad():
            compile(fn, fullgraph=True, backend=record)(*args, **kwargs)
    finally:
        _forget(record)
    if not graphs:
        raise Unsupported("the call captured no graph (it ran eagerly)")
    return graphs[0]


def _graph_code(cap) -> str:
    """The captured graph's code, with the user's source line above each op (as Dynamo's
    graph_code log)."""
    lines, last = [f"TRACED GRAPH ({cap.code.co_name})"], None
    for node in cap.gm.graph.nodes:
        src = node.meta.get("source")
        if src and src != last and node.op != "placeholder":
            function = node.meta.get("function", cap.code.co_name)
            where = f"{logs.short_path(src[0])}:{src[1]}"
            lines.append(f"    # File: {where} in {function}, code: {src[2].strip()}")
            last = src
        lines.append(f"    {node.format_node()}")
    return "\n".join(lines)


_warned_python = False


def _user_modes() -> bool:
    """Whether a torch function mode other than torch.set_default_device's is active (a mode
    that counts, logs or changes the ops a function calls, which compiled code does not make)."""
    return any(not isinstance(m, DeviceContext) for m in torch.overrides._get_current_function_mode_stack())


def _python_supported() -> bool:
    global _warned_python
    if sys.version_info[:2] in SUPPORTED_PYTHONS:
        return True
    if not _warned_python:
        logs.warn(f"minicompile captures the bytecode of Python 3.11 to 3.13; on Python "
                  f"{sys.version_info[0]}.{sys.version_info[1]} compiled functions run eagerly")
        _warned_python = True
    return False
