"""Wrapper code: the generated Python host function that runs one compiled graph.

Takes the fusion schedule (kernels and extern calls) and the kernels' generated source; hands
back a callable with the backend contract's signature (graph inputs in, graph outputs out) and
its source text, which the `output_code` log prints whole. The host function allocates each
buffer, launches the kernels in order (C++ through ctypes with data pointers, Triton with a
grid), calls PyTorch for extern ops, and returns the outputs in the structure the graph had.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from .. import config, ir, logs, metrics
from ..fusion import ExternCall, Kernel
from ..lower.boxes import TensorBox
from ..runtime import memory
from . import cpp, triton as triton_codegen


@dataclass
class CompiledGraph:
    """A compiled graph: call it with the graph's inputs."""
    fn: Callable
    wrapper_source: str
    kernel_source: str
    backend: str                 # "cpp" or "triton"
    kernels: list = field(default_factory=list)

    def __call__(self, *args):
        return self.fn(list(args))

    @property
    def source(self) -> str:
        return f"# ---- kernels ({self.backend})\n{self.kernel_source}\n# ---- wrapper\n{self.wrapper_source}"


def choose_backend(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    if device.type == "cpu":
        if config.cpu_backend not in ("cpp", "triton"):
            raise ValueError(f"minicompile.config.cpu_backend must be 'cpp' or 'triton', "
                             f"not {config.cpu_backend!r}")
        return config.cpu_backend
    raise NotImplementedError(f"no kernels for device type '{device.type}'")


def build(program: ir.Program, steps: list) -> CompiledGraph:
    kernels = [s for s in steps if isinstance(s, Kernel)]
    backend = choose_backend(program.device)
    buffers: dict[str, ir.IRNode] = {b.name: b for b in program.inputs}
    for box in program.nodes:
        if box.owns_buffer:
            buffers[box.name] = box

    if backend == "cpp":
        kernel_source, signatures = cpp.generate(kernels, buffers)
        launchers = cpp.load(kernel_source, signatures) if kernels else {}
        kernel_args = signatures
    else:
        kernel_source, meta = triton_codegen.generate(kernels, buffers)
        launchers = triton_codegen.load(kernel_source, meta) if kernels else {}
        kernel_args = {name: args for name, (args, _) in meta.items()}

    namespace: dict[str, Any] = {"torch": torch, "pytree": pytree, "output_spec": program.output_spec,
                                 "empty_strided": memory.empty_strided, "as_layout": memory.as_layout}
    namespace.update(launchers)
    lines = ["def call(args):"]
    if program.inputs:
        lines.append(f"    {', '.join(b.name for b in program.inputs)}, = args")
        lines.append("    args.clear()")
    device = repr(str(program.device))
    constants = 0

    def render(value) -> str:
        nonlocal constants
        if isinstance(value, TensorBox):
            if isinstance(value.data, ir.ViewOfBuffer):
                v = value.data
                return (f"torch.as_strided({v.base.name}, {tuple(v.shape)}, {tuple(v.stride)}, "
                        f"{v.base.name}.storage_offset() + {v.offset})")
            return value.name
        if isinstance(value, (list, tuple)):
            inner = ", ".join(render(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {render(v)}" for k, v in value.items()) + "}"
        if value is None or isinstance(value, (bool, int, str)) or (
                isinstance(value, float) and math.isfinite(value)):
            return repr(value)
        constants += 1
        namespace[f"const{constants}"] = value
        return f"const{constants}"

    for step in steps:
        if isinstance(step, Kernel):
            for m in step.members:
                if m.box.name not in step.stored:
                    continue
                # a 0-dim result is allocated as one element (Triton's interpreter reads 0-dim
                # tensors as Python scalars), then viewed as 0-dim
                shape = tuple(m.box.shape) or (1,)
                lines.append(f"    {m.box.name} = empty_strided({shape}, "
                             f"{tuple(ir.contiguous_strides(shape))}, dtype={m.box.dtype}, device={device})")
            args = kernel_args[step.name]
            if backend == "cpp":
                lines.append(f"    {step.name}({', '.join(f'{a}.data_ptr()' for a in args)})")
            else:
                launch = dict(meta[step.name][1])
                grid = launch.pop("grid")
                settings = ", ".join(f"{k}={v}" for k, v in launch.items())
                lines.append(f"    {step.name}[({grid},)]({', '.join(args)}, {settings})")
            for m in step.members:
                if m.box.name in step.stored and not m.box.shape:
                    lines.append(f"    {m.box.name} = {m.box.name}.view(())")
            metrics.kernels += 1
            metrics.kernel_bytes.append((step.name, step.bytes_read, step.bytes_written))
        elif isinstance(step, ExternCall):
            ext = step.box.data
            target = ext.op
            args = ", ".join([render(a) for a in ext.args] + [f"{k}={render(v)}" for k, v in ext.kwargs.items()])
            if ext.kind == "method":
                first, _, rest = args.partition(", ")
                call = f"{first}.{target}({rest})"
            else:
                call = f"{render(target)}({args})"
            comment = f"  # {ext.reason}" if ext.reason else ""
            lines.append(f"    {ext.name} = {call}{comment}")
            if ext.value_is_tensor:
                # kernels index this buffer with the strides lowering predicted: make sure
                lines.append(f"    {ext.name} = as_layout({ext.name}, {tuple(ext.stride)})")
    outs = ", ".join(render(o) for o in program.outputs)
    lines.append(f"    return pytree.tree_unflatten([{outs}], output_spec)")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<minicompile wrapper>", "exec"), namespace)
    logs.log("output_code", f"\n{kernel_source}\n{source}")
    return CompiledGraph(namespace["call"], source, kernel_source, backend, kernels)
