"""The backend half of minicompile: an FX graph and example inputs -> a compiled callable.

This is the contract between capture and code generation, and it is torch.compile's own
backend contract, so `torch.compile(f, backend=minicompile.backend)` runs real TorchDynamo with
minicompile's lowering, fusion and kernels.

    gm, example_inputs --lower--> Program --fusion.schedule--> steps --wrapper.build--> callable
"""
from __future__ import annotations

import warnings

import torch

from . import fusion
from .codegen import wrapper
from .lower import lower


def compile_graph(gm: torch.fx.GraphModule, example_inputs) -> wrapper.CompiledGraph:
    program = lower(gm, list(example_inputs))
    steps = fusion.schedule(program)
    compiled = wrapper.build(program, steps)
    return compiled


def backend(gm: torch.fx.GraphModule, example_inputs):
    """A torch.compile backend: `torch.compile(f, backend=minicompile.backend)`.

    Generated kernels compute values, not gradients: AOT autograd (a joint forward and backward
    graph) is a later stage. So a graph that must record gradients (grad mode on and an input
    that requires grad) runs on PyTorch's kernels, with a warning, rather than silently
    returning tensors that autograd cannot differentiate."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        warnings.warn("minicompile: this graph needs gradients (an input requires grad and grad mode "
                      "is on); compiled training (AOT autograd) is a later stage, so it runs on "
                      "PyTorch's kernels. Use torch.no_grad() for inference.", stacklevel=2)
        return gm
    return compile_graph(gm, example_inputs)


def generated_source(gm: torch.fx.GraphModule, example_inputs, kernel_backend: str) -> str:
    """The kernel source minicompile would generate for this graph with the given backend
    ("cpp" or "triton"), without compiling or running it: for reading, on any machine."""
    from .codegen import cpp, triton as triton_codegen

    program = lower(gm, list(example_inputs))
    kernels = [s for s in fusion.schedule(program) if isinstance(s, fusion.Kernel)]
    buffers = fusion.buffers_by_name(program)
    generator = {"cpp": cpp, "triton": triton_codegen}[kernel_backend]
    return generator.generate(kernels, buffers)[0]
