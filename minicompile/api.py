"""The public entry points: compile, explain, reset, mark_dynamic.

Takes a user's function or nn.Module; hands each call to the cache of compiled entries for its
code object. On a miss: capture (capture/) -> the backend (graph_compiler.py by default) ->
a new entry guarded by what the trace relied on. What cannot be captured runs eagerly, with a
warning that gives the reason; with fullgraph=True it raises minicompile.Unsupported instead.
"""
from __future__ import annotations

import functools
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import config, logs, metrics
from .capture import Capture, Unsupported, capture

SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13))
MODES = (None, "default")
LATER_MODES = ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# One list of entries per (code object, backend): newest first, as Dynamo's cache.
_CACHES: dict[tuple, list["CacheEntry"]] = {}


@dataclass
class CacheEntry:
    capture: Capture
    compiled: Callable

    def run(self, args, kwargs):
        outputs = self.compiled(*self.capture.get_inputs(args, kwargs))
        return self.capture.build_output(outputs)


def reset() -> None:
    """Forget every compiled entry (as torch._dynamo.reset()). Counters: minicompile.metrics.reset()."""
    _CACHES.clear()


def mark_dynamic(tensor: torch.Tensor, dim) -> None:
    raise NotImplementedError("minicompile.mark_dynamic comes with the guards and dynamic shapes "
                              "stage (Part II, 'Guards and dynamic shapes'); shapes are static for now")


def _resolve_backend(backend) -> tuple[Callable, str]:
    if backend in (None, "minicompile"):
        from .graph_compiler import backend as ours
        return ours, "minicompile"
    if backend == "eager":
        return (lambda gm, example_inputs: gm), "eager"
    if backend == "inductor":
        def inductor(gm, example_inputs):
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        return inductor, "inductor"
    if callable(backend):
        return backend, getattr(backend, "__name__", repr(backend))
    raise ValueError(f"backend must be 'minicompile', 'inductor', 'eager' or a callable "
                     f"(gm, example_inputs) -> callable, not {backend!r}")


class CompiledFunction:
    """A function whose calls go through minicompile's cache of compiled entries."""

    def __init__(self, fn: Callable, *, fullgraph: bool, backend, dynamic, options=None):
        self.fn = fn
        self.options = dict(options or {})
        self.fullgraph = fullgraph
        self.backend, self.backend_name = _resolve_backend(backend)
        self.dynamic = dynamic
        self.eager_reason: Unsupported | None = None
        functools.update_wrapper(self, fn)

    @property
    def _key(self):
        code = getattr(self.fn, "__code__", None) or getattr(getattr(self.fn, "__func__", None), "__code__", None)
        return (code, self.backend_name, id(self.backend), tuple(sorted(self.options.items())))

    def __call__(self, *args, **kwargs):
        if not _python_supported():
            return self.fn(*args, **kwargs)
        entries = _CACHES.setdefault(self._key, [])
        for entry in entries:
            if entry.capture.guard(args, kwargs):
                return entry.run(args, kwargs)
        if self.eager_reason is not None:
            return self.fn(*args, **kwargs)
        if len(entries) >= config.recompile_limit:
            warnings.warn(f"minicompile: {self.__name__} reached the recompile limit "
                          f"(config.recompile_limit = {config.recompile_limit}); it runs eagerly "
                          "for inputs that match none of its compiled entries", stacklevel=2)
            return self.fn(*args, **kwargs)
        try:
            cap = capture(self.fn, args, kwargs)
        except Unsupported as err:
            if self.fullgraph:
                raise
            metrics.graph_breaks += 1
            self.eager_reason = err
            logs.log("graph_breaks", str(err))
            warnings.warn(f"minicompile: {self.__name__} runs eagerly: {err}", stacklevel=2)
            return self.fn(*args, **kwargs)
        logs.log("graph_code", _graph_code(cap))
        logs.log("guards", cap.guard_source)
        if entries:
            metrics.recompiles += 1
            logs.log("recompiles", f"recompiling {self.__name__}: no earlier entry's guard held "
                                   f"({len(entries)} entries)")
        with config.patch(**self.options):
            compiled = self.backend(cap.gm, cap.example_inputs)
        metrics.graphs += 1
        entry = CacheEntry(cap, compiled)
        entries.insert(0, entry)
        return entry.run(args, kwargs)


class CompiledModule(torch.nn.Module):
    """What compile(module) returns: it behaves like the original module (its parameters,
    state_dict keys and attributes are the original's), and its forward is compiled."""

    def __init__(self, mod: torch.nn.Module, **options):
        super().__init__()
        self._orig_mod = mod
        self._compiled_forward = CompiledFunction(mod.forward, **options)

    def forward(self, *args, **kwargs):
        mod = self._orig_mod
        if mod._forward_hooks or mod._forward_pre_hooks or torch.nn.modules.module._global_forward_hooks:
            warnings.warn("minicompile: the module has hooks; it runs eagerly", stacklevel=2)
            return mod(*args, **kwargs)
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
    if dynamic is True:
        raise NotImplementedError("dynamic=True comes with the guards and dynamic shapes stage; "
                                  "use dynamic=None or False for now")
    if mode in LATER_MODES:
        raise NotImplementedError(f"mode={mode!r} comes with the runtime stage (CUDA graphs, "
                                  "autotuning); use mode=None for now")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; torch.compile's modes are 'default', "
                         "'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'")
    config.patch(**(options or {}))          # validates the names now, applies at compile time
    if disable:
        return model
    if isinstance(model, torch.nn.Module):
        return CompiledModule(model, fullgraph=fullgraph, backend=backend, dynamic=dynamic,
                              options=options)
    if not callable(model):
        raise TypeError(f"minicompile.compile takes a function or an nn.Module, not "
                        f"{type(model).__name__}")
    return CompiledFunction(model, fullgraph=fullgraph, backend=backend, dynamic=dynamic,
                            options=options)


@dataclass
class ExplainOutput:
    """What explain() found, with the fields torch._dynamo.explain gives."""
    graphs: list = field(default_factory=list)
    graph_count: int = 0
    graph_break_count: int = 0
    break_reasons: list = field(default_factory=list)
    ops_per_graph: list = field(default_factory=list)

    def __str__(self):
        lines = [f"Graph Count: {self.graph_count}", f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {sum(len(ops) for ops in self.ops_per_graph)}", "Break Reasons:"]
        for i, reason in enumerate(self.break_reasons, 1):
            lines.append(f"  Break Reason {i}:\n    {str(reason).replace(chr(10), chr(10) + '    ')}")
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  Ops {i}:")
            lines += [f"    {op}" for op in ops]
        return "\n".join(lines)


def explain(fn: Callable):
    """explain(fn)(*args, **kwargs) -> ExplainOutput: the graphs and breaks of one call."""
    def run(*args, **kwargs):
        out = ExplainOutput()
        target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        try:
            cap = capture(target, args, kwargs)
        except Unsupported as err:
            out.graph_break_count = 1
            out.break_reasons.append(err)
            return out
        out.graphs.append(cap.gm)
        out.graph_count = 1
        out.ops_per_graph.append([n.target for n in cap.gm.graph.nodes
                                  if n.op in ("call_function", "call_method", "call_module")])
        return out
    return run


def _graph_code(cap: Capture) -> str:
    """The captured graph's code, with the user's source line above each op (as Dynamo's
    graph_code log)."""
    lines, last = [f"TRACED GRAPH ({cap.code.co_name})"], None
    for node in cap.gm.graph.nodes:
        src = node.meta.get("source")
        if src and src != last and node.op != "placeholder":
            lines.append(f"    # File: {src[0]}:{src[1]} in {cap.code.co_name}, code: {src[2].strip()}")
            last = src
        lines.append(f"    {node.format_node()}")
    return "\n".join(lines)


_warned_python = False


def _python_supported() -> bool:
    global _warned_python
    if sys.version_info[:2] in SUPPORTED_PYTHONS:
        return True
    if not _warned_python:
        warnings.warn(f"minicompile captures the bytecode of Python 3.11 to 3.13; on Python "
                      f"{sys.version_info[0]}.{sys.version_info[1]} compiled functions run eagerly")
        _warned_python = True
    return False
