"""minicompile under torch.distributed: a model wrapped in DistributedDataParallel, or sharded
by FSDP (FSDP2's `fully_shard`, FSDP1's `FullyShardedDataParallel`); and any module with forward
hooks, which run the same way.

Takes the module `compile()` was given; hands `api.CompiledModule` the user's own module inside
it (the one whose forward is compiled) and runs each call through the wrapper's own `__call__`,
as PyTorch runs it, with that forward swapped for the compiled one for the length of the call.

Why not split the graph as TorchDynamo does. The communication of both engines happens in code
PyTorch runs around the user's forward, never inside it:

- DDP: its forward broadcasts buffers and prepares the reducer before the module runs; the
  all-reduce of the gradients is started by hooks on each parameter's gradient accumulator,
  bucket by bucket, as the backward hands autograd the parameters' gradients.
- FSDP2: hooks on each sharded module all-gather its parameters before its forward and free them
  after; hooks on its outputs gather them again before its backward, and the gradients are
  reduce-scattered after it.
- FSDP1 (`FullyShardedDataParallel`): the wrapper's forward gathers the flat parameter and sets
  the original parameters on the wrapped module as views of it (with `use_orig_params=False`
  as plain tensors, not Parameters), which is what the trace of the wrapped module's forward
  reads. So minicompile needs no `use_orig_params=True`; TorchDynamo does (without it, it breaks
  the graph at the wrapper, "FSDP with use_orig_params=False", and runs the model eagerly).

So compiling the user's forward and letting PyTorch run the rest gives eager's results: the
compiled backward is one autograd node that returns the parameters' gradients, their
accumulators fire DDP's hooks as in eager, and FSDP's hooks run on the compiled outputs and
inputs. What this gives up is overlap: every gradient of a graph comes at the end of its
backward, so DDP's first bucket is all-reduced only once the whole backward is done.
TorchDynamo's DDPOptimizer splits the graph at bucket boundaries so that each bucket's
all-reduce runs beside the rest of the backward; that pays on GPUs, where NCCL runs beside the
kernels, and costs the fusions across each boundary. minicompile keeps one graph.

A submodule sharded on its own (`fully_shard` on each block, or FSDP1's auto-wrap policy) is a
call with hooks, or into a wrapper, inside the parent's forward: the capture breaks the graph
there (the `graph_breaks` log says so), the hooks or the wrapper run as Python and the
submodule's forward is compiled on its own, by the same swap.
"""
from __future__ import annotations

import sys

import torch

from . import logs


def _fsdp():
    """torch.distributed.fsdp if the program imported it (a model it wraps was made by it);
    never imported here, since importing it imports TorchDynamo, which minicompile's own path
    does without."""
    return sys.modules.get("torch.distributed.fsdp")


def user_module(mod: torch.nn.Module) -> torch.nn.Module:
    """The module whose forward minicompile compiles: the one a DDP or FSDP1 wrapper runs (the
    innermost of nested wrappers), else `mod` itself."""
    fsdp = _fsdp()
    while True:
        if torch.distributed.is_available() and isinstance(mod, torch.nn.parallel.DistributedDataParallel):
            mod = mod.module
        elif fsdp is not None and isinstance(mod, fsdp.FullyShardedDataParallel):
            mod = mod._fsdp_wrapped_module
        else:
            return mod


def has_hooks(mod: torch.nn.Module) -> bool:
    """Hooks run around the module's forward (FSDP2's are some): forward hooks, and backward
    hooks, which nn.Module's call attaches to the forward's inputs and outputs."""
    module = torch.nn.modules.module
    return bool(mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or mod._backward_pre_hooks
                or module._global_forward_hooks or module._global_forward_pre_hooks
                or module._global_backward_hooks or module._global_backward_pre_hooks)


def runs_around(mod: torch.nn.Module) -> bool:
    """PyTorch code runs around the compiled forward: a wrapper's forward or hooks."""
    return user_module(mod) is not mod or has_hooks(mod)


def call_around(mod: torch.nn.Module, compiled, args, kwargs, logged: set):
    """mod(*args, **kwargs) as PyTorch runs it (a wrapper's forward, hooks), with the forward of
    its user module replaced by `compiled` for the length of the call: nn.Module.__call__ looks
    the forward up on the instance. The instance attribute is removed after (an earlier one is
    put back). `logged`: ids of the modules whose graph_breaks line was printed."""
    if id(mod) not in logged:
        logged.add(id(mod))
        logs.log("graph_breaks", describe(mod))
    inner = user_module(mod)
    before = inner.__dict__.get("forward")
    inner.__dict__["forward"] = compiled
    try:
        return mod(*args, **kwargs)
    finally:
        if before is None:
            del inner.__dict__["forward"]
        else:
            inner.__dict__["forward"] = before


def describe(mod: torch.nn.Module) -> str:
    """What runs around the compiled forward, for the graph_breaks log."""
    inner = type(user_module(mod)).__name__
    if isinstance(mod, torch.nn.parallel.DistributedDataParallel):
        return (f"DistributedDataParallel.forward runs as PyTorch around the compiled {inner}.forward; "
                f"the gradients are all-reduced by DDP's hooks on their accumulators, in buckets of "
                f"{mod.bucket_bytes_cap / 2**20:g} MiB, once the compiled backward returns them "
                f"(one graph: no overlap of the all-reduce with the backward)")
    if user_module(mod) is not mod:
        return (f"{type(mod).__name__}.forward runs as PyTorch around the compiled {inner}.forward "
                f"(it gathers the parameters; its hooks reduce-scatter the gradients)")
    fsdp2 = _fsdp() is not None and isinstance(mod, _fsdp().FSDPModule)
    return (f"{inner}'s hooks run as Python around its compiled forward"
            + (" (FSDP2's: they all-gather its parameters and free them after; in the backward "
               "they gather them again and reduce-scatter the gradients)" if fsdp2 else ""))

