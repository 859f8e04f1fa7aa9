"""The backend half of minicompile: an FX graph and example inputs -> a compiled callable.

This is the contract between capture and code generation, and it is torch.compile's own
backend contract, so `torch.compile(f, backend=minicompile.backend)` runs real TorchDynamo with
minicompile's lowering, fusion and kernels.

    gm, example_inputs --autocast--> casts as nodes
        --functionalize--> values-only graph (+ epilogue: writes, views)
        [training: --autograd--> forward graph + backward graph, each compiled as below]
        --lower--> Program --fusion.schedule--> steps --wrapper.build--> callable

A graph records gradients when grad mode is on and an input requires grad (a module's
parameters, in training): autograd/ then builds and compiles its backward too.
"""
from __future__ import annotations

import operator

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from . import autocast, config, custom_ops, fusion, ir, logs, metrics
from .autograd import compile_training
from .capture.output_graph import NodeByNode
from .codegen import triton as triton_codegen, wrapper
from .codegen.cpp import KernelCompileError
from .functionalize import functionalize
from .lower import fold_host_constants, lower
from .runtime import cache, cudagraphs


def compile_graph(gm: torch.fx.GraphModule, example_inputs, training: bool = False):
    """The compiled graph: a callable with gm's inputs and outputs. Autocast's casts become
    nodes (autocast.py), and writes and views become values (functionalize.py), whose epilogue
    makes them real after the kernels. training: gradients flow through it (autograd/)."""
    if autocast.involved(gm):
        gm = autocast.explicit_casts(gm, example_inputs)
        with autocast.off():
            return autocast.AutocastOff(_compile_functional(gm, example_inputs, training))
    return _compile_functional(gm, example_inputs, training)


def _compile_functional(gm: torch.fx.GraphModule, example_inputs, training: bool = False):
    functional, epilogue = functionalize(gm, list(example_inputs), training)
    # the new value of an input the graph writes may be stored straight into it (the
    # epilogue's copy is then of memory onto itself); where CUDA graphs record, only into a
    # static input (the recording's own copy of any other is not the caller's tensor). Not in
    # training into one that requires grad: the epilogue's copy_ is what autograd records.
    # Not in a graph that checks (custom_ops.check): one that fails must leave every input as
    # it was, and a kernel storing into one may run before the check
    written = {} if epilogue is None or custom_ops.checks(functional.graph) else {
        k: i for i, k in epilogue.copies
        if (not config.cudagraphs or cudagraphs.is_static(example_inputs[i]))
        and not (training and getattr(example_inputs[i], "requires_grad", False))}
    if training:
        compiled = _compile_training(functional, example_inputs, written,
                                     epilogue.writes if epilogue is not None else {})
    else:
        compiled = _compile_values(functional, example_inputs, written)
    if config.cudagraphs:
        # the values-only graph is recorded; the epilogue's writes and views run after a replay,
        # but for a static input's new value that nothing else reads: the recording writes it
        write_back = {k: i for k, i in written.items() if epilogue.read is not None and k not in epilogue.read}
        compiled = cudagraphs.record_when_possible(compiled, example_inputs, training, set(written.values()),
                                                      dynamic=bool(_dynamic_dims(functional)),
                                                      write_back=write_back)
    if epilogue is None:
        return compiled
    logs.log("output_code", "epilogue:\n" + "\n".join(f"    {line}" for line in epilogue.description))
    return WithEpilogue(compiled, epilogue)


class WithEpilogue:
    """A compiled functional graph and the epilogue that completes it (functionalize.py):
    called with the graph's inputs, it returns what the original graph returned, and the
    inputs it writes are written. Everything else is the compiled graph's."""

    def __init__(self, compiled, epilogue):
        self.compiled, self.epilogue = compiled, epilogue

    def __call__(self, *args):
        return self.epilogue(self.compiled, args)

    def __getattr__(self, name):
        return getattr(self.compiled, name)


def _compile_training(gm: torch.fx.GraphModule, example_inputs, written=None, overwritten=None):
    """The forward and backward of a graph that records gradients (autograd/), generic in its
    dynamic dimensions, or where that cannot be (an op decides on a size), compiled for the
    example's sizes (its dynamic dimensions specialized, and guarded). written: as
    _compile_values takes it (a batch norm's running statistics, written by the forward);
    overwritten: {index of an input the graph writes: the in-place ops that write it}."""
    gpu = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
    fold_host_constants(gm, example_inputs)
    if _dynamic_dims(gm):
        try:
            with triton_codegen.compiling_together(gpu):
                return compile_training(gm, list(example_inputs), _compile_values, written, overwritten)
        except (NotImplementedError, TypeError, GuardOnDataDependentSymNode) as err:
            logs.log("dynamic", f"no size-generic training code ({type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''}); compiled for the example's sizes")
    conditions = _specialize(gm, example_inputs)
    if conditions:
        logs.log("dynamic", "a graph compiled for training is compiled for the example's sizes (each new "
                            f"size compiles again): {', '.join(conditions)}")
    with triton_codegen.compiling_together(gpu):      # the forward's kernels compile meanwhile
        compiled = compile_training(gm, list(example_inputs), _compile_values, written, overwritten)
    compiled.shape_guards = conditions
    return compiled


def _compile_values(gm: torch.fx.GraphModule, example_inputs, written=None) -> wrapper.CompiledGraph:
    """written: {output index k: input index i} where output k is the value written back
    into input i after the graph (functionalize's epilogue)."""
    written = written or {}
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    if config.autotune and "cuda" not in devices:
        logs.log("autotune", f"max-autotune on {', '.join(sorted(devices)) or 'no device'}: kernels "
                             "here have no launch settings to time; the default code runs")
    key = _graph_cache_key(gm, example_inputs)
    if key is not None and written:
        key = f"{key}-w{abs(hash(tuple(sorted(written.items())))):x}"
    if key is not None:
        entry = cache.load(key)
        if entry is not None:
            compiled = wrapper.rebuild(entry)
            compiled.shape_guards, compiled.cache_key = entry["shape_guards"], key
            return compiled
    try:
        with metrics.timed("lowering"):
            program = lower(gm, list(example_inputs))
        with metrics.timed("fusion"):
            steps = fusion.schedule(program)
        with metrics.timed("code generation"):
            compiled = wrapper.build(program, steps, written)
        compiled.shape_guards = shape_guards(program)
        if key is not None:
            if compiled.entry is None:
                cache.not_stored("its output structure has no name a later process can read")
            elif cache.store(key, {**compiled.entry, "shape_guards": compiled.shape_guards}):
                compiled.cache_key = key          # where a later process finds it (frame_store.py)
        return compiled
    except KernelCompileError as err:
        if not err.generated_code:
            raise                        # no compiler, or a bad flag: the user must know
        # code minicompile wrote that the compiler rejects: a bug of ours, which must not
        # cost the user a result (nor a different one)
        reason = f"a generated kernel did not compile, so this graph runs on PyTorch's kernels: {err}"
        logs.log("output_code", reason)
        logs.warn(f"minicompile: {reason}")
        return on_pytorch_kernels(gm, reason)
    except (TypeError, NotImplementedError, GuardOnDataDependentSymNode) as err:
        # (GuardOnDataDependentSymNode: an op's sizes depend on a value, `x[x.argmax()]`)
        dynamic = _dynamic_dims(gm)
        if not dynamic:
            raise
        # code generic in the sizes could not be made (an op decided on a size): code for
        # these sizes, and guards that say so, as TorchDynamo specializes a symbol
        logs.log("dynamic", f"no size-generic code ({type(err).__name__}: {err}); "
                            f"compiled for the example's sizes")
        conditions = _specialize(gm, example_inputs)
        compiled = _compile_values(gm, example_inputs, written)
        compiled.shape_guards = conditions
        return compiled


def _graph_cache_key(gm: torch.fx.GraphModule, example_inputs):
    """The whole-graph cache's key for this graph (runtime/cache.py), or None: the cache is
    off, the `fusion` log is on (a cached graph skips the decisions it prints), or the graph
    holds something no key can name (said in the output_code log)."""
    if not config.graph_cache or logs.enabled("fusion"):
        return None
    try:
        return cache.graph_key(gm, example_inputs)
    except cache.NotCacheable as err:
        cache.not_stored(str(err))
        return None


def on_pytorch_kernels(gm: torch.fx.GraphModule, reason: str) -> wrapper.CompiledGraph:
    """The graph as a compiled graph that runs it on PyTorch's own kernels."""
    run = as_traced(gm)
    return wrapper.CompiledGraph(lambda args: run(*args), f"# runs on PyTorch's kernels: {reason}\n",
                                 "", "pytorch")


def as_traced(gm: torch.fx.GraphModule):
    """gm run node by node, each node calling its target: eager's results (capture's NodeByNode)."""
    return NodeByNode(gm)


def _specialize(gm: torch.fx.GraphModule, example_inputs) -> list[str]:
    """Makes gm's dynamic dimensions static (the example's sizes) and returns the guards that
    say so (`arg0.size(1) == 7`), as TorchDynamo specializes a symbol."""
    conditions = []
    for i, (node, dims) in enumerate(_dynamic_dims(gm)):
        value = example_inputs[i]
        if isinstance(value, torch.Tensor):
            conditions += [f"arg{i}.size({d}) == {value.size(d)}" for d in sorted(dims)]
        elif dims:                         # an int or float input: its value
            conditions.append(f"arg{i} == {value!r}")
        node.meta["dynamic_dims"] = set()
    return conditions


def _dynamic_dims(gm) -> list:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    dims = [(n, set(n.meta.get("dynamic_dims", ()))) for n in placeholders]
    return dims if any(d for _, d in dims) else []


def shape_guards(program) -> list[str]:
    """Dynamic shapes: what the shape environment learnt must hold of the size symbols while
    the graph ran on fake tensors (two sizes that broadcast together are equal, a view's
    sizes divide...), as Python conditions over the graph's inputs (`arg0.size(0) ==
    arg1.size(0)`). Conditions true for every size are left out. Each symbol is at least 2:
    that is the caller's to check (it decided which dimensions are dynamic)."""
    shape_env = getattr(program, "shape_env", None)
    if shape_env is None:
        return []
    out = ir.shape_conditions(shape_env, program.symbols)
    # an int input used as a size: the IR assumes every size symbol is at least 2, as it is
    # for a tensor's dynamic dim (whose own guard says so)
    sizes = {str(v) for box in [*program.inputs, *program.nodes] if hasattr(box, "shape")
             for size in getattr(box, "shape", ()) for v in getattr(size, "free_symbols", ())}
    for sym, read in program.symbols.items():
        if sym in sizes and "." not in read:
            out.append(f"{read} >= 2")
    return out


def _records_gradients(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether an op of the graph runs with grad mode on and reads a value that requires grad
    (an input that does, or such an op's result): one that reads inputs only under no_grad
    (an EMA of the weights, clip_grad_norm_ reading their .grad) records nothing."""
    grad = torch.is_grad_enabled()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    needs = {n for n, t in zip(placeholders, example_inputs) if isinstance(t, torch.Tensor) and t.requires_grad}
    for n in gm.graph.nodes:
        if n.op == "get_attr" and getattr(operator.attrgetter(n.target)(gm), "requires_grad", False):
            needs.add(n)                 # (a parameter the graph holds, not an input)
        if n.target is torch._C._set_grad_enabled:
            grad = bool(n.args[0])
        elif grad and (n.op in ("call_function", "call_method") and any(a in needs for a in n.all_input_nodes)
                       or n.op == "call_module" and (any(a in needs for a in n.all_input_nodes) or any(
                           p.requires_grad for p in gm.get_submodule(n.target).parameters()))):
            return True
    return False


def backend(gm: torch.fx.GraphModule, example_inputs):
    """A torch.compile backend: `torch.compile(f, backend=minicompile.backend)`.

    A graph that must record gradients (grad mode on and an input that requires grad) is
    compiled for training: a forward and a backward graph (autograd/)."""
    training = _records_gradients(gm, example_inputs)
    if training and any(isinstance(v, torch.SymInt) for v in example_inputs):
        # TorchDynamo's graph is generic in its sizes (the SymInt inputs) and reused for every
        # size; the joint trace is generic only in dims capture marks, and code compiled for
        # the example's sizes would be reused at others (TorchDynamo does not check the
        # conditions minicompile's own guard would)
        logs.warn("minicompile: a training graph TorchDynamo made generic in its sizes runs on "
                  "PyTorch's kernels, not compiled (minicompile.compile(..., dynamic=True) compiles it)")
        return as_traced(gm)
    try:
        return compile_graph(gm, example_inputs, training)
    except NotImplementedError as err:
        # a stage minicompile does not have yet (a dtype, an op): PyTorch's kernels run the
        # graph, which gives eager's results (as minicompile.compile does)
        logs.warn(f"minicompile: the graph runs on PyTorch's kernels, not compiled: {err}")
        return as_traced(gm)


backend.supports_dynamic_shapes = True     # takes graphs whose inputs have dynamic dims


def generated_source(gm: torch.fx.GraphModule, example_inputs, kernel_backend: str) -> str:
    """The kernel source minicompile would generate for this graph with the given backend
    ("cpp" or "triton"), without compiling or running it: for reading, on any machine."""
    from .codegen import cpp, triton as triton_codegen

    program = lower(functionalize(gm, list(example_inputs))[0], list(example_inputs))
    kernels = [s for s in fusion.schedule(program) if isinstance(s, fusion.Kernel)]
    buffers = fusion.buffers_by_name(program)
    generator = {"cpp": cpp, "triton": triton_codegen}[kernel_backend]
    return generator.generate(kernels, buffers)[0]
