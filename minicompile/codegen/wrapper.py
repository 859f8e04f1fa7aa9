"""Wrapper code: the generated Python host function that runs one compiled graph.

Takes the fusion schedule (kernels and extern calls) and the kernels' generated source; the
memory plan (`plan_memory`: which buffer's memory each new buffer takes) is decided first, and
the code is written from it. Hands back a callable with the backend contract's signature
(graph inputs in, graph outputs out) and its source text, which the `output_code` log prints
whole. The host function allocates each buffer, launches the kernels in order (C++ through
ctypes with data pointers, Triton with a grid), calls PyTorch for extern ops, deletes each
buffer once its last reader has run, raises IndexError if a kernel met an out-of-range
data-dependent index (ir.INDEX_ERRORS; on a GPU the kernel stops with a device-side assert
instead), and returns the outputs in the structure the graph had. (The graph computes values
only: writes into inputs are made by functionalize.py's epilogue, unless a kernel stored the
new value straight into the input.)
"""
from __future__ import annotations

import math
import operator
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from .. import aliasing, config, ir, logs, metrics
from ..fusion import ExternCall, Kernel, TemplateKernel, buffers_by_name
from ..lower import matmul
from ..lower.boxes import TensorBox
from ..lower.lowerings import returns_new_memory
from ..runtime import memory
from . import cpp, matmul_template, triton as triton_codegen


@dataclass
class CompiledGraph:
    """A compiled graph: call it with the graph's inputs."""
    fn: Callable
    wrapper_source: str
    kernel_source: str
    backend: str                 # "cpp" or "triton"
    kernels: list = field(default_factory=list)
    # dynamic shapes: what must hold of the inputs' sizes for this code to be right, as Python
    # conditions over the inputs (arg0, arg1...); the caller's guards check them
    shape_guards: list = field(default_factory=list)
    # what a later process needs to run this graph without lowering, fusion or code generation
    # (runtime/cache.py stores it; `rebuild` makes the callable again); None: not storable
    entry: dict | None = None
    cache_key: str | None = None   # the whole-graph cache's key of the stored entry, if stored

    def __call__(self, *args):
        return self.fn(list(args))

    def run_consuming(self, args: list):
        """Call with the list `args` itself, which the call empties: generated code lets go of
        each input after its last use, where `self(*args)` would keep them all to the end (a
        backward's saved activations)."""
        return self.fn(args)

    @property
    def source(self) -> str:
        return f"# ---- kernels ({self.backend})\n{self.kernel_source}\n# ---- wrapper\n{self.wrapper_source}"


def _qualified_name(value) -> str | None:
    """'torch.cumsum', 'operator.matmul', 'torch.nn.functional.linear', 'torch.ops.aten.mm.default'...
    for a function the generated code can name (so the wrapper reads like the program), else None."""
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{value}"          # (a constant holding one could not be pickled)
    name = getattr(value, "__name__", None)
    if not callable(value) or not isinstance(name, str):
        return None
    for prefix, module in (("torch", torch), ("torch.nn.functional", torch.nn.functional),
                           ("operator", operator), ("torch.Tensor", torch.Tensor), ("matmul", matmul)):
        if getattr(module, name, None) is value:
            return f"{prefix}.{name}"
    return None


def _literal_structure(spec, leaves: list) -> str | None:
    """The expression that rebuilds `spec` (a pytree spec of tuples/lists) from the leaves'
    expressions, or None for anything else (then pytree.tree_unflatten does it at run time)."""
    from torch.fx.immutable_collections import immutable_list
    it = iter(leaves)

    def build(s):
        if s.is_leaf():
            return next(it)
        if s.type not in (tuple, list, immutable_list):
            raise ValueError
        children = s.children() if hasattr(s, "children") else s.children_specs
        items = [build(c) for c in children]
        if s.type is not tuple:     # (an FX graph's output list is an immutable_list: eager's is a list)
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    try:
        expr = build(spec)
    except (ValueError, StopIteration, AttributeError, TypeError):
        return None
    if next(it, None) is not None:
        return None
    return expr


def _new_memory(ext: ir.Extern) -> bool:
    """Whether an extern call's result is memory of its own, every byte of it in the tensor."""
    return returns_new_memory(ext.op) and not ext.reason and ext.value_is_tensor and ir.is_dense(ext.shape, ext.stride)


def _output_names(program: ir.Program) -> set[str]:
    """The buffers the graph returns (or whose views it returns)."""
    return {o.name for o in program.outputs if isinstance(o, TensorBox)}


def _into_planned(ext: ir.Extern) -> bool:
    """A linear layer with C++ kernels whose result goes into memory the plan gives it
    (torch.addmm or mm with out=, the product ATen's linear makes of a contiguous input), as
    Inductor's CPU wrapper does: a dead buffer of its size is reused instead of a new
    allocation, whose pages the system would map (a page fault each) on every call."""
    if ext.op is not torch.nn.functional.linear or ext.kind != "function" or ext.kwargs \
            or choose_backend(ext.device) != "cpp" or ext.dtype != torch.float32 or len(ext.args) not in (2, 3) \
            or any(ir.is_symbolic(s) for s in ext.shape) or list(ext.stride) != ir.contiguous_strides(ext.shape):
        return False
    x, w, *bias = ext.args
    return isinstance(x, TensorBox) and isinstance(w, TensorBox) and len(w.shape) == 2 and len(x.shape) >= 2 \
        and (not bias or bias[0] is None or (isinstance(bias[0], TensorBox) and len(bias[0].shape) == 1))


# extern ops whose result is their first argument with some elements replaced: the
# functional forms of index_copy_, index_put_... (functionalize.py's), new memory laid out as
# that argument. Over an argument nothing reads afterwards, the in-place form computes the same
# and moves only the elements it replaces (a static KV cache's new row, not the whole cache).
SCATTERS = {"index_copy", "index_put", "index_add", "index_fill", "scatter", "scatter_add",
            "scatter_reduce", "masked_scatter"}


def _method_of(ext: ir.Extern) -> str | None:
    """The tensor method an extern op calls ('index_copy' for x.index_copy(...) and for
    torch.index_copy(x, ...)), or None."""
    return aliasing.method_name("call_method" if ext.kind == "method" else "call_function", ext.op)


def _scatter_base(box: TensorBox) -> str | None:
    """The buffer whose elements a scatter extern op (SCATTERS) replaces, as it is (not a view
    of part of it) and laid out as the result; None for any other extern op."""
    ext = box.data
    if _method_of(ext) not in SCATTERS or not ext.value_is_tensor or not ext.args:
        return None
    base = ext.args[0]
    if not isinstance(base, TensorBox) or isinstance(base.data, ir.ViewOfBuffer) and not _views_all_of(base.data):
        return None
    return base.name if _same_layout(base.data, box) else None


def plan_reuse(program: ir.Program, steps: list, kernel_args: dict) -> tuple[dict, set, set]:
    """Memory planning: the step after which each buffer is last read; which buffers' memory
    may be reused once dead: those a kernel wrote or an extern kernel made new
    (lowerings.NEW_MEMORY_KERNELS, SCATTERS), that are not outputs and that no other extern op
    saw (its result may be a view of its input, so that memory is not ours); and the buffers
    those other extern ops read."""
    last_use: dict[str, int] = {}
    reusable: set[str] = set()
    seen_by_other = set()
    for i, step in enumerate(steps):
        if isinstance(step, Kernel):
            reusable |= {m.box.name for m in step.members if m.box.name in step.stored}
            for name in kernel_args.get(step.name, ()):
                last_use[name] = i
        else:
            reads = {r.name for r in step.box.reads}
            if _new_memory(step.box.data) or _scatter_base(step.box) is not None:
                reusable.add(step.box.name)
                for name in reads:
                    last_use[name] = i
            else:
                seen_by_other |= reads
    return last_use, reusable - seen_by_other - _output_names(program), seen_by_other


def _dead_after(program: ir.Program, steps: list, kernel_args: dict, kept: set) -> dict[int, list[str]]:
    """{step: the buffers read last by it}, to let go of each (`del`) once dead rather than
    when the graph returns: PyTorch and malloc reuse its memory for the buffers allocated after
    it, instead of growing the heap (and, on a CPU, taking a page fault on each new page of
    it, every call, where malloc gives the top of its heap back to the system between calls).
    Outputs, the buffers they view, and `kept` are not let go of here."""
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        names = kernel_args.get(step.name, ()) if isinstance(step, Kernel) else \
            [r.name for r in step.box.reads] + [step.box.name]
        for name in names:
            last[name] = i
    kept = kept | _output_names(program) | set(program.symbols) | set(program.scalars) | {ir.INDEX_ERRORS}
    dead: dict[int, list[str]] = {}
    for name, i in last.items():
        if name not in kept:
            dead.setdefault(i, []).append(name)
    return dead


def plan_memory(program: ir.Program, steps: list, kernel_args: dict, buffers: dict,
                written: dict | None = None) -> dict:
    """Where each buffer a kernel stores gets its memory, decided before any code is written:
    {buffer name: (how, source)}, how one of
    - "in place": over `source`, an input the kernel reads last and only where it writes; or
      over the graph input the buffer is written back into after the graph (`written`:
      {output index: input index}), where nothing later reads that input, so the
      write-back is of memory onto itself (an optimizer's update, in one pass); or, for a
      scatter extern op (SCATTERS), over its first argument, on the same terms;
    - "reuse": the memory of `source`, a buffer dead by then of the same bytes and dtype;
    - "torch": a new allocation by PyTorch (too small for huge pages, or not on a CPU);
    - "new": a new allocation by runtime.memory (huge pages for large CPU buffers).
    A buffer's memory is free once the kernel that reads it last has run (plan_reuse)."""
    last_use, reusable, maybe_viewed = plan_reuse(program, steps, kernel_args)
    kept = _output_names(program) | maybe_viewed
    write_back = {program.outputs[k].name: program.inputs[i].name for k, i in (written or {}).items()
                  if isinstance(program.outputs[k], TensorBox) and isinstance(program.inputs[i], ir.InputBuffer)
                  and program.inputs[i].name not in kept}
    huge_pages = program.device.type == "cpu"
    free: dict[tuple, list[str]] = {}        # (bytes, dtype) -> buffers whose memory is free
    overwritten: set[str] = set()            # buffers a kernel's output was written over
    plan: dict[str, tuple] = {}
    for i, step in enumerate(steps):
        if isinstance(step, ExternCall):
            base = _scatter_base(step.box)
            if base is not None and last_use.get(base) == i and base not in overwritten \
                    and (base in reusable or write_back.get(step.box.name) == base):
                overwritten.add(base)
                plan[step.box.name] = ("in place", base)
            elif _into_planned(step.box.data):
                key = (nbytes(step.box.data), step.box.dtype)
                plan[step.box.name] = ("reuse", free[key].pop()) if free.get(key) else \
                    ("torch", None) if not huge_pages or key[0] < memory.MIN_BYTES else ("new", None)
            for name in {r.name for r in step.box.reads}:
                if last_use.get(name) == i and name in reusable and name not in overwritten:
                    buf = buffers[name]
                    free.setdefault((nbytes(buf), buf.dtype), []).append(name)
            continue
        if not isinstance(step, Kernel):
            continue
        for m in step.members:
            if m.box.name not in step.stored:
                continue
            key = (nbytes(m.box), m.box.dtype)
            over = next((b for b in step.in_place.get(m.box.name, ()) if last_use.get(b) == i
                         and (b in reusable or write_back.get(m.box.name) == b) and b not in overwritten
                         and (nbytes(buffers[b]), buffers[b].dtype) == key), None)
            if over is not None:
                overwritten.add(over)
                plan[m.box.name] = ("in place", over)
            elif free.get(key):
                plan[m.box.name] = ("reuse", free[key].pop())
            elif not huge_pages or not ir.is_symbolic(key[0]) and key[0] < memory.MIN_BYTES:
                plan[m.box.name] = ("torch", None)
            else:
                plan[m.box.name] = ("new", None)
        for name in kernel_args.get(step.name, ()):
            if last_use.get(name) == i and name in reusable and name not in overwritten:
                buf = buffers[name]
                free.setdefault((nbytes(buf), buf.dtype), []).append(name)
    return plan


def _allocation(name, shape, stride, dtype, device: torch.device, how, source) -> str:
    """The wrapper's line that gives a buffer new memory, or the memory of a dead one."""
    if how == "reuse":
        return f"    {name} = {source}.as_strided({sizes(shape)}, {stride}); del {source}  # reuses {source}'s memory"
    if how == "torch" and device.type in FAST_ALLOCATION:
        # PyTorch's allocation on the current device, without a Python call or parsing a
        # device (a step of a ResNet-50 allocates some 400 buffers); `call` runs on `device`
        # (_on_its_device)
        return f"    {name} = empty_strided_{device.type}({sizes(shape)}, {stride}, {dtype})"
    if how == "torch":
        return f"    {name} = torch_empty_strided({sizes(shape)}, {stride}, dtype={dtype}, device={str(device)!r})"
    return f"    {name} = empty_strided({sizes(shape)}, {stride}, dtype={dtype}, device={str(device)!r})"


# TorchDynamo's allocations on the current device of a type, as Inductor's wrapper makes them
FAST_ALLOCATION = {"cuda": torch._C._dynamo.guards._empty_strided_cuda,
                   "cpu": torch._C._dynamo.guards._empty_strided_cpu}


def _on_its_device(lines: list, device: torch.device) -> list:
    """The lines of `call`, run with `device` current where it is a GPU (its buffers are
    allocated on the current one)."""
    if device.type != "cuda" or device.index is None:
        return lines
    return [f"@memory.on_device({device.index})", *lines]


def _zero_dim(backend: str, how: str, itself: bool):
    """How a kernel's 0-dim result is made: (the shape it is allocated with, what the wrapper
    does after the kernel). It is its own 0-dim tensor, as eager's (a view of one element
    would be "a view created in no_grad mode" to autograd). `itself`: written in place into
    a 0-dim tensor, which it is. Another's memory: one element of it, viewed as 0-dim after.
    C++ with memory from PyTorch: allocated 0-dim. Triton (whose interpreter reads 0-dim
    tensors as Python scalars) or fresh memory: one element, made 0-dim in place after."""
    if itself:
        return (), None
    if how not in ("torch", "new"):
        return (1,), "view"
    if backend == "cpp" and how == "torch":
        return (), None
    return (1,), "set_"


def _same_layout(buf, box) -> bool:
    """A buffer laid out as box, so that its tensor itself can stand for box: an input, a
    buffer of a kernel's, or an extern op's result with no dims of size 1 (as_layout leaves
    PyTorch's strides for those, which may not be the ones predicted)."""
    buf = buf.data if isinstance(buf, TensorBox) else buf
    if isinstance(buf, ir.Extern):
        if not buf.value_is_tensor or 1 in buf.shape:
            return False
    elif not isinstance(buf, (ir.InputBuffer, ir.ComputedBuffer)):
        return False
    return (not getattr(buf, "offset", 0) and list(buf.shape) == list(box.shape)
            and list(buf.stride) == list(box.data.stride) and buf.dtype == box.dtype)


def sizes(values) -> str:
    """A shape or strides as the Python tuple the wrapper evaluates (dynamic sizes by name)."""
    items = [ir.render_size(v) for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def nbytes(buf):
    """A buffer's size in bytes (an expression when its shape is dynamic): buffers of equal
    size may share memory."""
    return ir.size_expr(math.prod(buf.shape or [1]) * buf.dtype.itemsize)


def _on_the_host(buffer, device: torch.device) -> bool:
    """A buffer in CPU memory that a kernel on a GPU reads."""
    return device.type == "cuda" and getattr(buffer, "device", device).type == "cpu"


def choose_backend(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    if device.type == "cpu":
        if config.cpu_backend not in ("cpp", "triton"):
            raise ValueError(f"minicompile.config.cpu_backend must be 'cpp' or 'triton', "
                             f"not {config.cpu_backend!r}")
        return config.cpu_backend
    raise NotImplementedError(f"no kernels for device type '{device.type}'")


def has_no_elements(kernel: Kernel) -> bool:
    """A kernel over an empty iteration space (a dim of size 0): its outputs are allocated, and
    nothing is launched (a GPU refuses a grid of 0 programs)."""
    return any(not ir.is_symbolic(s) and s == 0 for s in (*kernel.x_sizes, *kernel.r_sizes))


def build(program: ir.Program, steps: list, written: dict | None = None) -> CompiledGraph:
    """written: {output index: input index}, outputs whose value is written back into an input
    after the graph (plan_memory may store them straight into it)."""
    backend = choose_backend(program.device)
    buffers = buffers_by_name(program)
    buffers[ir.INDEX_ERRORS] = ir.InputBuffer(ir.INDEX_ERRORS, [1], [1], 0, torch.int32, program.device)
    if backend == "triton" and any(isinstance(s, TemplateKernel) for s in steps):
        # each matrix-product template kept only where it is the faster (max-autotune times it)
        steps = matmul_template.choose_templates(steps, buffers, program.device,
                                                 lambda text: logs.log("autotune", text))
    kernels = [s for s in steps if isinstance(s, Kernel) and not has_no_elements(s)]

    if backend == "cpp":
        kernel_source, meta = cpp.generate(kernels, buffers)
        kernel_args = {name: args for name, (args, _) in meta.items()}
    else:
        kernel_source, meta = triton_codegen.generate(kernels, buffers)
        kernel_args = {name: args for name, (args, *_) in meta.items()}
        if config.autotune and program.device.type == "cuda":
            triton_codegen.autotune(kernel_source, meta, buffers, program.device,
                                    lambda text: logs.log("autotune", text))
    arg_dtypes = {name: [buffers[a].dtype if a in buffers else None for a in args]
                  for name, args in kernel_args.items()}
    namespace = _namespace(backend, kernel_source, meta, arg_dtypes, program.output_spec, _own_products(steps),
                           program.device.index if program.device.type == "cuda" else None)
    lines = ["def call(args):"]
    if program.inputs:
        lines.append(f"    {', '.join(b.name for b in program.inputs)}, = args")
        lines.append("    args.clear()")
    for symbol, read in program.symbols.items():       # dynamic sizes, read from the inputs
        lines.append(f"    {symbol} = {read}")
    for scalar, read in program.scalars.items():       # dynamic floats
        lines.append(f"    {scalar} = {read}")
    device = repr(str(program.device))
    constants = 0
    checks_indices = any(ir.INDEX_ERRORS in args for args in kernel_args.values())
    # kernels with data-dependent indices report a bad one here (C++, Triton's interpreter; on
    # a GPU they assert on the device: triton_codegen.asserts_on_device)
    if checks_indices:
        lines.append(f"    {ir.INDEX_ERRORS} = torch.zeros((1,), dtype=torch.int32, device={device})")

    def render(value, argument: bool = False) -> str:
        """argument: an extern call's argument, which only that call reads. A view of a buffer
        passed there is made by reinterpret_tensor (a C++ call, a third of torch.as_strided's
        host time), a plain view of the memory that autograd does not track; a view the graph
        returns is a real view (torch.as_strided)."""
        nonlocal constants
        if isinstance(value, TensorBox):
            if isinstance(value.data, ir.ViewOfBuffer):
                v = value.data
                if _views_all_of(v):          # the buffer as it is: no view to make per call
                    return v.base.name
                if argument:
                    return (f"reinterpret_tensor({v.base.name}, {sizes(v.shape)}, {sizes(v.stride)}, "
                            f"{ir.render_size(v.offset)})")
                ones = value.size_one_strides
                stride = [ones.get(d, st) if n == 1 else st for d, (n, st) in enumerate(zip(v.shape, v.stride))]
                return (f"torch.as_strided({v.base.name}, {sizes(v.shape)}, {sizes(stride)}, "
                        f"{v.base.name}.storage_offset() + {ir.render_size(v.offset)})")
            return value.name
        if ir.is_symbolic(value):
            return ir.render_size(value)
        if isinstance(value, ir.ScalarInput):
            return value.name
        if isinstance(value, (list, tuple)):
            inner = ", ".join(render(v, argument) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {render(v, argument)}" for k, v in value.items()) + "}"
        if isinstance(value, slice) and any(ir.is_symbolic(p) for p in (value.start, value.stop, value.step)):
            # x[..., 1:s - 1] of dynamic sizes: the bounds worked out from this call's sizes
            return f"slice({render(value.start)}, {render(value.stop)}, {render(value.step)})"
        if value is None or type(value) in (bool, int, str) or (
                type(value) is float and math.isfinite(value)):
            return repr(value)          # (an IntEnum's or numpy's number: held as it is, below)
        readable = _qualified_name(value)
        if readable is not None:
            return readable
        constants += 1
        namespace[f"const{constants}"] = value
        return f"const{constants}"

    plan = plan_memory(program, steps, kernel_args, buffers, written)
    # a buffer whose memory a later one takes is let go of by the line that takes it; one a
    # kernel writes over in place is let go of after that kernel (its last reader), as any
    # dead buffer: kept to the end, its name would hold the memory after the result's is freed
    taken = {source for how, source in plan.values() if how == "reuse"}
    dead_after = _dead_after(program, steps, kernel_args, kept=taken)
    made_0_dim = {}            # a 0-dim result -> what makes it 0-dim after its kernel (_zero_dim)
    copied = {}                # a CPU number GPU kernels read -> its copy on the GPU
    # the buffers the graph hands out as they are (a view of one shows its own strides)
    returned_as_is = {o.name for o in program.outputs
                      if isinstance(o, TensorBox) and not isinstance(o.data, ir.ViewOfBuffer)}
    for i, step in enumerate(steps):
        if isinstance(step, Kernel):
            for m in step.members:
                if m.box.name not in step.stored:
                    continue
                how, source = plan[m.box.name]
                itself = how == "in place" and _same_layout(buffers[source], m.box)
                shape = tuple(m.box.shape)
                if not shape:
                    shape, made_0_dim[m.box.name] = _zero_dim(backend, how, itself)
                stride = sizes(m.box.data.stride or (() if not shape else (1,)))
                if itself:
                    # (the very tensor: no view to make per call, nor a write-back to do)
                    lines.append(f"    {m.box.name} = {source}  # in place: {step.name} reads {source} "
                                 f"only where it writes this")
                elif how == "in place":
                    lines.append(f"    {m.box.name} = {source}.as_strided({sizes(shape)}, {stride})"
                                 f"  # in place: {step.name} reads {source} only where it writes this")
                elif how == "reuse" and _same_layout(buffers[source], m.box):
                    lines.append(f"    {m.box.name} = {source}; del {source}  # reuses {source}'s memory")
                else:
                    lines.append(_allocation(m.box.name, shape, stride, m.box.dtype, program.device, how, source))
            if step.name not in kernel_args:          # nothing to compute (has_no_elements)
                continue
            args = kernel_args[step.name]
            if backend == "cpp":
                passed = [a if a in program.symbols or a in program.scalars else f"{a}.data_ptr()" for a in args]
                lines.append(f"    {step.name}({', '.join(passed)})")
            else:
                launch = dict(meta[step.name][1])
                grid = launch.pop("grid")
                settings = ", ".join(f"{k}={v}" for k, v in launch.items())
                # a CPU 0-dim tensor (an input, or an op on numbers: torch.add(2.5, 1)) goes
                # with CUDA ones in eager; GPU kernels read it copied to the GPU, once a call
                for a in args:
                    if a not in copied and _on_the_host(buffers.get(a), program.device):
                        copied[a] = f"{a}_on_gpu"
                        lines.append(f"    {copied[a]} = {a}.to({device})")
                passed = [copied.get(a, a) for a in args]
                lines.append(f"    {step.name}[({grid},)]({', '.join(passed)}, {settings})")
            for m in step.members:
                after = made_0_dim.get(m.box.name) if m.box.name in step.stored else None
                if after == "view":
                    lines.append(f"    {m.box.name} = {m.box.name}.view(())")
                elif after == "set_":
                    lines.append(f"    {m.box.name}.set_({m.box.name}.untyped_storage(), 0, (), ())")
            metrics.kernels += 1
            metrics.kernel_bytes.append((step.name, step.bytes_read, step.bytes_written))
        elif isinstance(step, ExternCall) and plan.get(step.box.name, ("",))[0] == "in place":
            ext, base = step.box.data, plan[step.box.name][1]
            name = _method_of(ext)
            rest = [render(a, argument=True) for a in ext.args[1:]] + \
                [f"{k}={render(v, argument=True)}" for k, v in ext.kwargs.items()]
            lines.append(f"    {base}.{name}_({', '.join(rest)})")
            lines.append(f"    {ext.name} = {base}  # in place: nothing reads {base} after {name}")
        elif isinstance(step, ExternCall) and step.box.name in plan:        # into planned memory
            ext = step.box.data
            x, w, *bias = [render(a, argument=True) for a in ext.args]
            bias = bias[0] if bias and bias[0] != "None" else None
            lines.append(_allocation(ext.name, tuple(ext.shape), sizes(ext.stride), ext.dtype, program.device,
                                     *plan[ext.name]))
            k, n = ext.args[1].shape[1], ext.shape[-1]
            product = f"{x}.reshape(-1, {k}), {w}.t(), out={ext.name}.view(-1, {n})"
            lines.append(f"    torch.addmm({bias}, {product})" if bias else f"    torch.mm({product})")
        elif isinstance(step, ExternCall):
            ext = step.box.data
            target = ext.op
            rendered = [render(a, argument=True) for a in ext.args] + \
                [f"{k}={render(v, argument=True)}" for k, v in ext.kwargs.items()]
            args = ", ".join(rendered)
            if ext.kind == "method":
                call = f"{rendered[0]}.{target}({', '.join(rendered[1:])})"
            else:
                call = f"{render(target)}({args})"
            comment = f"  # {ext.reason}" if ext.reason else ""
            lines.append(f"    {ext.name} = {call}{comment}")
            if ext.value_is_tensor and not (target in CONTIGUOUS_RESULTS
                                            and list(ext.stride) == ir.contiguous_strides(ext.shape)):
                # kernels index this buffer with the strides lowering predicted: make sure
                returned = ", returned=True" if ext.name in returned_as_is else ""
                lines.append(f"    {ext.name} = as_layout({ext.name}, {sizes(ext.stride)}{returned}, dtype={ext.dtype})")
        dead = dead_after.get(i)
        if dead:
            lines.append(f"    del {', '.join(dead + [copied[d] for d in dead if d in copied])}")
    if checks_indices:       # one check per call, on the host
        lines.append(f"    index_error = {ir.INDEX_ERRORS}.item()")
        lines.append(f"    if index_error: raise (RuntimeError if index_error == {ir.RUNTIME_ERROR} else IndexError)"
                     f"('index out of range in self')")
    outs = ", ".join(render(o) for o in program.outputs)
    literal = _literal_structure(program.output_spec, [render(o) for o in program.outputs])
    if literal is not None:          # tuples/lists of tensors: built directly (per-call cost)
        lines.append(f"    return {literal}")
    else:
        lines.append(f"    return pytree.tree_unflatten([{outs}], output_spec)")
    source = "\n".join(_on_its_device(lines, program.device)) + "\n"
    exec(compile(source, "<minicompile wrapper>", "exec"), namespace)
    logs.log("output_code", f"\n{kernel_source}\n{source}")
    try:
        spec = pytree.treespec_dumps(program.output_spec)
    except Exception:                    # noqa: BLE001 (an output structure with no name)
        spec = None
    entry = None if spec is None else {
             "wrapper_source": source, "kernel_source": kernel_source, "backend": backend,
             "meta": meta, "arg_dtypes": arg_dtypes, "output_spec": spec,
             "constants": {f"const{i}": namespace[f"const{i}"] for i in range(1, constants + 1)},
             "kernels": [k.name for k in kernels],
             "kernel_bytes": [(k.name, k.bytes_read, k.bytes_written) for k in kernels if k.name in kernel_args]}
    return CompiledGraph(namespace["call"], source, kernel_source, backend, kernels, entry=entry)


# extern kernels whose result PyTorch always allocates contiguous (no as_layout check needed)
CONTIGUOUS_RESULTS = {torch.mm, torch.bmm, torch.addmm, torch.baddbmm, matmul.mm}


def _own_products(steps: list) -> list:
    """The products of lower/matmul.py's kernel among a graph's extern calls, as its
    compile_ahead takes them: (dtype, device, (m, k, n), a's strides, b's strides)."""
    products = []
    for step in steps:
        if isinstance(step, ExternCall) and getattr(step.box.data, "op", None) is matmul.mm:
            a, b = step.box.data.args
            layouts = [getattr(x.data, "stride", None) for x in (a, b)]
            sizes = (*a.shape, b.shape[1])
            if None not in layouts and not any(ir.is_symbolic(v) for v in (*sizes, *layouts[0], *layouts[1])):
                products.append((a.dtype, step.box.device, sizes, tuple(layouts[0]), tuple(layouts[1])))
    return products


def _namespace(backend: str, kernel_source: str, meta: dict, arg_dtypes: dict, output_spec,
               own_products=(), gpu: int | None = None) -> dict:
    """What the wrapper's source runs in: torch, the run-time helpers, and each kernel's
    launcher (C++ libraries compiled and loaded; Triton kernels defined, and on a GPU compiled
    ahead for the dtypes of their arguments, lower/matmul.py's products with them, and loaded
    onto GPU `gpu` where it is given)."""
    namespace: dict[str, Any] = {"torch": torch, "math": math, "operator": operator, "pytree": pytree, "matmul": matmul,
                                 "memory": memory,
                                 "output_spec": output_spec,
                                 "empty_strided": memory.empty_strided, "as_layout": memory.as_layout,
                                 "reinterpret_tensor": torch._C._dynamo.guards._reinterpret_tensor,
                                 "torch_empty_strided": torch.empty_strided,
                                 **{f"empty_strided_{kind}": f for kind, f in FAST_ALLOCATION.items()}}
    if not meta:
        return namespace
    if backend == "cpp":
        namespace.update(cpp.load(kernel_source, meta))
    else:
        launchers = triton_codegen.load(kernel_source, meta)
        typed = {a: types.SimpleNamespace(dtype=d) for name, (args, *_) in meta.items()
                 for a, d in zip(args, arg_dtypes[name])}
        triton_codegen.precompile(launchers, meta, typed,
                                  meanwhile=(lambda: matmul.compile_ahead(own_products)) if own_products else None,
                                  device=gpu)
        namespace.update({name: launcher.site() for name, launcher in launchers.items()})
    return namespace


def rebuild(entry: dict) -> CompiledGraph:
    """The compiled graph an entry of `build` stands for, made again without lowering, fusion
    or code generation: the kernels' launchers loaded (their binaries from the kernel caches),
    the wrapper's source run. Counted in the metrics as `build` counts it."""
    namespace = _namespace(entry["backend"], entry["kernel_source"], entry["meta"], entry["arg_dtypes"],
                           pytree.treespec_loads(entry["output_spec"]))
    namespace.update(entry["constants"])
    exec(compile(entry["wrapper_source"], "<minicompile wrapper>", "exec"), namespace)
    metrics.kernels += len(entry["kernel_bytes"])
    metrics.kernel_bytes.extend(entry["kernel_bytes"])
    logs.log("output_code", f"(from the graph cache)\n{entry['kernel_source']}\n{entry['wrapper_source']}")
    return CompiledGraph(namespace["call"], entry["wrapper_source"], entry["kernel_source"], entry["backend"],
                         list(entry["kernels"]), entry=entry)


def _views_all_of(view: ir.ViewOfBuffer) -> bool:
    """Whether a view is its buffer with the buffer's own sizes and strides (which hold at run
    time: an input's by its guard, an extern's result by as_layout)."""
    base = getattr(view.base, "data", view.base)
    return view.offset == 0 and list(view.shape) == list(getattr(base, "shape", ())) \
        and list(view.stride) == list(getattr(base, "stride", ()))
