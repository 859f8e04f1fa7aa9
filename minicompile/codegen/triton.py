"""Triton code generation for GPU tensors (and for CPU tensors through Triton's interpreter).

Takes fusion `Kernel`s; hands the wrapper `@triton.jit` functions and their launch settings.

Pointwise kernels are flat: each program handles XBLOCK consecutive output elements and
recovers the per-dimension indices with `//` and `%` (only for dimensions that could not be
merged). Reductions are 2-D blocks, XBLOCK rows by RBLOCK reduction elements: *persistent*
(the whole row in one block) when the row is short, *looped* (accumulate RBLOCK at a time)
when it is long. Values are computed in float32 for half inputs and rounded when stored.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys

import torch

from .. import config, ir
from ..ir import Index, use_ops
from .common import KernelWriter, plan_loops, reduction_identity, scalars_in, size_symbols_in

TL_TYPES = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
            torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
            torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}

PERSISTENT_RBLOCK_LIMIT = 16384     # rows up to this many elements are reduced in registers


def import_triton():
    """Import triton; on a machine without a GPU, switch on its interpreter first (it must be
    set before triton is imported, so the error says so when it is too late)."""
    if not torch.cuda.is_available():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("Triton kernels on a CPU need Triton's interpreter: set the "
                               "environment variable TRITON_INTERPRET=1 before triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
    except ImportError:
        raise RuntimeError("Triton is not installed: `pip install triton` (it comes with PyTorch's "
                           "CUDA builds), or use the C++ backend on a CPU") from None
    if os.environ.get("TRITON_INTERPRET") == "1":
        _patch_interpreter_scalars()
    return triton


def _patch_interpreter_scalars():
    """Triton's interpreter holds a scalar argument as a one-element array, and converts it
    with int(array), which NumPy 2 refuses for arrays of one dimension: a run-time size used
    as a loop bound (`range(0, rnumel, RBLOCK)`, a dynamic row length) then fails. Convert
    the element instead."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "minicompile", False):
        return

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    patch.minicompile = True
    interpreter._patch_lang_tensor = patch


class TritonWriter(KernelWriter):
    OPS = {
        "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
        "maximum": "tl.where(({0} != {0}) | ({0} > {1}), {0}, {1})",
        "minimum": "tl.where(({0} != {0}) | ({0} < {1}), {0}, {1})",
        "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
        "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "({0} & {1})",
        "logical_or": "({0} | {1})", "logical_not": "({0} == 0)", "neg": "(-{0})",
        "abs": "tl.abs({0})", "relu": "tl.where({0} < 0, 0, {0})", "exp": "tl.exp({0})",
        "log": "tl.log({0})", "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "sin": "tl.sin({0})",
        "cos": "tl.cos({0})", "tanh": "(2 * tl.sigmoid(2 * {0}) - 1)", "sigmoid": "tl.sigmoid({0})",
        "erf": "tl.erf({0})", "reciprocal": "(1 / {0})", "floor": "tl.floor({0})",
        "ceil": "tl.ceil({0})", "isnan": "({0} != {0})", "where": "tl.where({0}, {1}, {2})",
    }

    def __init__(self, kernel, plan, buffers, mask: str):
        super().__init__(kernel, plan, buffers)
        self.mask = mask
        self.device_asserts = asserts_on_device(kernel.box.device)

    def assign(self, var, expr):
        return f"{var} = {expr}"

    def load_expr(self, name, index, dtype):
        ptr = self.arg_name(name)
        if self.load_mask is not None:     # inside ops.masked: a block load under both masks
            offset = index.render("//") if index.variables() else f"{index.render('//')} + 0 * xindex"
            value = f"tl.load({ptr} + ({offset}), {self.mask} & ({self.load_mask}), other=0)"
        elif index.variables():
            value = f"tl.load({ptr} + ({index.render('//')}), {self.mask}, other=0)"
        else:   # one element for every lane: a scalar load (a block mask needs a block pointer)
            value = f"tl.load({ptr} + {index.render('//')})"
        cd = ir.compute_dtype(dtype)
        return f"{value}.to({TL_TYPES[cd]})" if cd != dtype else value

    def index_value_expr(self, index, dtype):
        if not index.variables():
            return self.constant_expr(index.const, dtype)
        return f"({index.render('//')}).to({TL_TYPES[dtype]})"

    def index_check(self, var, value, size):
        lanes = self.mask if self.load_mask is None else f"{self.mask} & ({self.load_mask})"
        bad = f"{var}_bad"           # a block of the lanes' shape: the store's pointers need it
        if self.device_asserts:
            report = f"tl.device_assert({bad} == 0, 'index out of range in self')"
        else:
            report = f"tl.store({ir.INDEX_ERRORS} + 0 * {bad}.to(tl.int32), 1, {bad})"
        # the bad index is replaced all the same: no lane loads outside the tensor
        return [f"{var} = ({value}).to(tl.int64)",
                f"{bad} = (({var} < 0) | ({var} >= {size})) & {lanes}",
                report,
                f"{var} = tl.where({bad}, 0, {var})"]

    def constant_expr(self, value, dtype):
        if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
            return f"float('{value}')"
        if dtype == torch.bool:
            return "1" if value else "0"
        if dtype == torch.float64 or not dtype.is_floating_point:
            return f"tl.full([1], {value!r}, {TL_TYPES[dtype]})"
        return repr(float(value))

    def cast_expr(self, x, dtype):
        return f"({x}).to({TL_TYPES[dtype]})"

    def render_size(self, size):
        return ir.render_size(size, "//")

    def scalar_arg(self, name, dtype):
        return self._emit(f"tl.full([1], {name}, {TL_TYPES[ir.compute_dtype(dtype)]})")

    def size_value(self, size, dtype):
        # a size argument is a scalar, not a block: a full block of it, then the cast
        return self._emit(self.cast_expr(f"tl.full([1], {self.render_size(size)}, tl.int64)", ir.compute_dtype(dtype)))


def asserts_on_device(device: torch.device) -> bool:
    """How a kernel reports a data-dependent index out of range (embedding's). On a GPU: a
    device-side assert stops the kernel, as eager's CUDA kernels do, so the host never waits
    for the GPU to learn there was none. Elsewhere (Triton's interpreter skips device asserts;
    C++) the kernel sets the INDEX_ERRORS flag and the wrapper raises IndexError, as eager on
    a CPU does."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"


# The compile options of a kernel with device asserts (Triton compiles them in only in debug
# mode, which also asserts that no 32-bit integer arithmetic overflows: off, as Inductor
# does, since eager's integer arithmetic wraps). Launch settings, not kernel arguments.
DEVICE_ASSERT_OPTIONS = {"debug": True, "sanitize_overflow": False}


def _decompose(flat: str, names: list[str], sizes: list[int]) -> list[str]:
    """Lines recovering per-dimension variables from a flat index (innermost last)."""
    lines, stride = [], 1
    for k in range(len(names) - 1, -1, -1):
        expr = flat if stride == 1 else f"({flat} // ({ir.render_size(stride)}))"
        if k > 0:
            expr = f"{expr} % ({ir.render_size(sizes[k])})"
        lines.append(f"{names[k]} = {expr}")
        stride = ir.size_expr(stride * sizes[k])
    return lines[::-1]


def kernel_source(kernel, buffers):
    """Source of one @triton.jit kernel, the buffers it takes (inputs, then outputs) and its
    launch settings.

    Without r loops: a flat block of XBLOCK elements. With them: a block of XBLOCK rows by
    RBLOCK row elements; members are computed in order, a reduction's result stays in
    registers for the members after it. Short rows are reduced in one block (persistent);
    long rows in RBLOCK chunks, one loop per member that walks the row."""
    plan = plan_loops(kernel)
    xnumel = ir.size_expr(math.prod(plan.x_sizes))
    rnumel = ir.size_expr(math.prod(plan.r_sizes))
    dynamic = ir.is_symbolic(xnumel) or ir.is_symbolic(rnumel) or _largest_offset(buffers) is None
    # 32-bit indices unless some size could pass 2**31 (a dynamic size could: 64-bit then)
    big = dynamic or max(xnumel * max(1, rnumel), _largest_offset(buffers)) >= 2**31
    pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
    mask = "xmask & rmask" if kernel.r_sizes else "xmask"
    writer = TritonWriter(kernel, plan, buffers, mask)
    x_idx, r_idx = writer.canonical

    def store(member, value, row: bool) -> str:
        index = plan.apply(member.store_index(x_idx, r_idx))
        text = index.render("//") if index.variables() else f"{index.render('//')} + 0 * xindex"
        if value in writer.constants:       # a constant output still needs a block of values
            value = f"tl.full([XBLOCK], {value}, {TL_TYPES[member.box.dtype]})"
        return (f"tl.store({writer.out_name(member.box.name)} + ({text}), "
                f"({value}).to({TL_TYPES[member.box.dtype]}), {'xmask & rmask' if row else 'xmask'})")

    with use_ops(writer):
        if not kernel.r_sizes:
            for m in kernel.members:
                value = m.run(x_idx, r_idx)
                if m.box.name in kernel.stored:
                    writer.lines.append(store(m, value, row=False))
            xblock, num_warps = _pointwise_config(xnumel)
            body = [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)", "xmask = xindex < xnumel",
                    *_decompose("xindex", plan.x_vars, plan.x_sizes), *writer.lines]
            params = ["xnumel", "XBLOCK: tl.constexpr"]
            launch = {"xnumel": _launch_value(xnumel), "XBLOCK": xblock, "num_warps": num_warps,
                      "grid": _grid(xnumel, xblock)}
        else:
            persistent, xblock, rblock, num_warps = _reduction_config(xnumel, rnumel)
            rvars = [*_decompose("rindex", plan.r_vars, plan.r_sizes), "rmask = rindex < rnumel"]
            head = [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]", "xmask = xindex < xnumel",
                    *_decompose("xindex", plan.x_vars, plan.x_sizes), "rbase = tl.arange(0, RBLOCK)[None, :]"]
            if persistent:
                writer.lines += ["rindex = rbase", *rvars]
            for k, m in enumerate(kernel.members):
                comp = m.comp
                # a per-row value loads one element per row: a row mask would widen it
                writer.mask = "xmask" if m.role == "x" and not isinstance(comp, ir.Reduction) else mask
                if isinstance(comp, ir.Reduction):
                    acc_tl = TL_TYPES[comp.src_dtype]
                    init = reduction_identity(comp.reduction_type, comp.src_dtype)
                    init = f"float('{init}')" if isinstance(init, float) and math.isinf(init) else repr(init)
                    reduce_fn = REDUCE_FN.get(comp.reduction_type)
                    if reduce_fn is None:
                        raise NotImplementedError(f"Triton reduction '{comp.reduction_type}'")
                    floating = comp.src_dtype.is_floating_point
                    nan_aware = comp.reduction_type in ("max", "min") and floating
                    arg = comp.reduction_type in ir.ARG_REDUCTIONS
                    if persistent:
                        value = m.run(x_idx, r_idx)
                        block = writer._emit(f"tl.where(xmask & rmask, {value}, {init}).to({acc_tl})")
                        if arg:
                            positions = writer._emit("tl.where(xmask & rmask, rindex, rnumel)")
                            result = _first_best(writer, reduce_fn, block, positions, floating)
                        else:
                            result = _row_reduce(writer, reduce_fn, block, nan_aware)
                    else:
                        acc, pos = f"acc{k}", f"pos{k}"
                        with writer.scope() as loop_body:
                            value = m.run(x_idx, r_idx)
                            loop_body.append(f"v = tl.where(xmask & rmask, {value}, {init}).to({acc_tl})")
                            if arg:
                                # per lane, elements come in order: take the first, a NaN over a
                                # number, or a strictly better value (ties keep the earlier one)
                                better = ">" if comp.reduction_type == "argmax" else "<"
                                loop_body += [f"take = xmask & rmask & (({pos} == rnumel) | (v {better} {acc}) | "
                                              f"((v != v) & ({acc} == {acc})))",
                                              f"{acc} = tl.where(take, v, {acc})",
                                              f"{pos} = tl.where(take, rindex, {pos})"]
                            else:
                                loop_body.append(f"{acc} = {COMBINE[comp.reduction_type].format(acc=acc, v='v')}")
                        writer.lines.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {init}, {acc_tl})")
                        if arg:
                            writer.lines.append(f"{pos} = tl.full([XBLOCK, RBLOCK], rnumel, tl.int32)")
                        writer.lines += ["for roffset in range(0, rnumel, RBLOCK):",
                                         *["    " + line for line in ["rindex = roffset + rbase", *rvars, *loop_body]]]
                        # the accumulators kept NaN; tl.max/tl.min alone would drop it
                        result = (_first_best(writer, reduce_fn, acc, pos, floating) if arg
                                  else _row_reduce(writer, reduce_fn, acc, nan_aware))
                    if comp.reduction_type == "mean":
                        result = writer._emit(f"{result} / {writer.render_size(comp.rnumel())}")
                    writer.row_values[m.box.name] = result
                    if m.box.name in kernel.stored:
                        writer.lines.append(store(m, result, row=False))
                elif m.role == "row":
                    if persistent:
                        value = m.run(x_idx, r_idx)
                        if m.box.name in kernel.stored:
                            writer.lines.append(store(m, value, row=True))
                    else:
                        with writer.scope() as loop_body:
                            value = m.run(x_idx, r_idx)
                            if m.box.name in kernel.stored:
                                loop_body.append(store(m, value, row=True))
                        writer.lines += ["for roffset in range(0, rnumel, RBLOCK):",
                                         *["    " + line for line in ["rindex = roffset + rbase", *rvars, *loop_body]]]
                else:
                    value = m.run(x_idx, r_idx)
                    writer.row_values[m.box.name] = value
                    if m.box.name in kernel.stored:
                        writer.lines.append(store(m, value, row=False))
            body = head + writer.lines
            # a static row length is a compile-time constant (the loop over it is unrolled or
            # bounded at compile time); a dynamic one is an argument like the other sizes
            params = ["xnumel", "rnumel" if ir.is_symbolic(rnumel) else "rnumel: tl.constexpr",
                      "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"]
            launch = {"xnumel": _launch_value(xnumel), "rnumel": _launch_value(rnumel), "XBLOCK": xblock,
                      "RBLOCK": rblock, "num_warps": num_warps, "grid": _grid(xnumel, xblock)}
    stored = [m.box for m in kernel.members if m.box.name in kernel.stored]
    checked = [ir.INDEX_ERRORS] if writer.checks_indices and not writer.device_asserts else []
    if writer.checks_indices and writer.device_asserts:
        launch.update(DEVICE_ASSERT_OPTIONS)
    args = [f"in_ptr{i}" for i in range(len(writer.args))] + [f"out_ptr{i}" for i in range(len(stored))] + checked
    # dynamic sizes the body uses (not those only in xnumel / rnumel): arguments, before the
    # launch settings, in the order the launcher passes them
    symbols = size_symbols_in("\n".join(body))
    scalars = scalars_in("\n".join(body))
    if scalars and any(b.dtype == torch.float64 for b in buffers.values()):
        # Triton passes a Python float as float32: exact only for float32 and narrower work
        raise NotImplementedError("a dynamic Python float in a float64 Triton kernel")
    symbols += scalars
    launch = {**{sym: sym for sym in symbols}, **launch}
    lines = ["@triton.jit", f"def {kernel.name}({', '.join(args + symbols + params)}):"]
    lines += ["    " + line for line in body]
    return "\n".join(lines), writer.args + [b.name for b in stored] + checked, launch


def _row_reduce(writer, reduce_fn: str, block: str, nan_aware: bool) -> str:
    """reduce_fn over each row of a [XBLOCK, RBLOCK] block; NaN where the row holds one when
    nan_aware (tl.max and tl.min skip NaN, PyTorch's amax and amin return it)."""
    result = writer._emit(f"{reduce_fn}({block}, 1)[:, None]")
    if not nan_aware:
        return result
    return writer._emit(f"tl.where(tl.max(({block} != {block}).to(tl.int32), 1)[:, None] > 0, "
                        f"float('nan'), {result})")


def _first_best(writer, reduce_fn: str, block: str, positions: str, nan_aware: bool) -> str:
    """argmax/argmin of each row of a block of values and their positions (rnumel where a lane
    holds no element): the least position holding the row's best value, NaN counting as best."""
    best = _row_reduce(writer, reduce_fn, block, nan_aware)
    return writer._emit(f"tl.min(tl.where(({block} == {best}) | (({block} != {block}) & ({best} != {best})), "
                        f"{positions}, rnumel), 1)[:, None]")


REDUCE_FN = {"sum": "tl.sum", "mean": "tl.sum", "max": "tl.max", "min": "tl.min", "prod": "_prod",
             "argmax": "tl.max", "argmin": "tl.min"}
COMBINE = {"sum": "{acc} + {v}", "mean": "{acc} + {v}", "prod": "{acc} * {v}",
           "max": "tl.where(({v} != {v}) | ({v} > {acc}), {v}, {acc})",
           "min": "tl.where(({v} != {v}) | ({v} < {acc}), {v}, {acc})"}


def _reduction_config(xnumel: int, rnumel: int) -> tuple[bool, int, int, int]:
    """(persistent, XBLOCK, RBLOCK, num_warps) for a reduction kernel. A row that fits is
    held in registers whole (persistent: the row is read from memory once, however many
    members walk it); about 4096 elements per program, one warp per 256 of them."""
    if ir.is_symbolic(rnumel):
        # a row of any length: looped, in blocks sized for short rows (a persistent block
        # would have to hold the longest row the size could be)
        return False, 16, 256, 8
    persistent = rnumel <= PERSISTENT_RBLOCK_LIMIT
    rblock = _next_pow2(rnumel) if persistent else 2048
    rows = 4096 if ir.is_symbolic(xnumel) else _next_pow2(xnumel)
    xblock = max(1, min(rows, 4096 // rblock if persistent else 1))
    num_warps = max(2, min(16, (xblock * rblock) // 256))
    return persistent, xblock, rblock, num_warps


def _pointwise_config(xnumel: int) -> tuple[int, int]:
    """Block size and warps: large blocks for large tensors (fewer, fuller programs), small for
    small ones (enough programs to fill the GPU); one middle size for a dynamic number."""
    if ir.is_symbolic(xnumel):
        return 1024, 4
    if xnumel >= 2**22:
        return 2048, 8
    if xnumel >= 2**16:
        return 1024, 4
    return max(16, min(1024, _next_pow2(xnumel))), 4 if xnumel >= 1024 else 1


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _largest_offset(buffers):
    """The most elements any buffer has; None when some size is dynamic."""
    sizes = [ir.size_expr(math.prod(b.shape)) for b in buffers.values()]
    return None if any(ir.is_symbolic(n) for n in sizes) else max(sizes + [0])


def _launch_value(size):
    """A launch argument: an int, or the Python expression the wrapper evaluates per call."""
    return ir.render_size(size) if ir.is_symbolic(size) else size


def _grid(xnumel, xblock):
    if ir.is_symbolic(xnumel):
        return f"-(-({ir.render_size(xnumel)}) // {xblock})"
    return math.ceil(xnumel / xblock)


# Reductions Triton does not provide (it has tl.sum, tl.max, tl.min, but no product), as
# tl.reduce with a combine function; written into a module whose kernels call them.
HELPERS = {
    "_prod": ["@triton.jit", "def _multiply(a, b):", "    return a * b", "", "",
              "@triton.jit", "def _prod(x, axis):", "    return tl.reduce(x, axis, _multiply)"],
}


def generate(kernels, buffers) -> tuple[str, dict]:
    sources, meta = [], {}
    for kernel in kernels:
        src, args, launch = kernel_source(kernel, buffers)
        sources += [src, ""]
        meta[kernel.name] = (args, launch)
    parts = ["import triton", "import triton.language as tl", ""]
    for name, lines in HELPERS.items():
        if any(f"{name}(" in src for src in sources):
            parts += [*lines, "", ""]
    return "\n".join(parts + sources) + "\n", meta


def load(source: str, meta: dict) -> dict:
    """Write the module to the cache (Triton reads a kernel's source from its file) and import it."""
    import_triton()
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    directory = os.path.join(config.cache_dir, "triton")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"k{key}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"minicompile_triton_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: Launcher(getattr(module, name)) for name in meta}


def precompile(launchers: dict, meta: dict, buffers: dict) -> None:
    """Compile every kernel of a graph at once, in threads (Triton's compiler spends most of
    its time outside Python), instead of one by one at first launch. Each kernel is compiled
    for the specialization its first real launch will ask for: 16-byte-aligned pointers."""
    if os.environ.get("TRITON_INTERPRET") == "1" or len(launchers) < 2:
        return
    from concurrent.futures import ThreadPoolExecutor

    def compile_one(name):
        args, launch = meta[name]
        settings = {k: v for k, v in launch.items() if k != "grid"}
        if any(isinstance(v, str) for v in settings.values()):
            return                  # dynamic sizes: compiled at its first launch
        try:
            launchers[name].jit_fn.warmup(*[buffers[a].dtype for a in args], grid=(1,), **settings)
        except Exception:           # the real launch compiles again, and reports the error
            pass
    with ThreadPoolExecutor(max_workers=min(8, len(launchers))) as pool:
        list(pool.map(compile_one, launchers))


class Launcher:
    """`launcher[grid](*args, **constexprs)`, as a @triton.jit function is launched, but with
    less work per call on a GPU: the first launch goes through Triton's JIT (which binds the
    arguments, specializes and compiles); later launches with the same grid and the same
    pointer alignment call the compiled kernel directly. Host time per launch matters: for a
    small model it is what the GPU waits on."""

    def __init__(self, jit_fn):
        self.jit_fn = jit_fn
        self.compiled: dict = {}
        self.__name__ = jit_fn.__name__

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        # what Triton specializes a compiled kernel on: pointer alignment, and whether each
        # integer argument (a dynamic size) is 1 or a multiple of 16
        key = (grid, tuple(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor)),
               tuple((v == 1, v % 16 == 0) for v in kwargs.values() if type(v) is int))
        fast = self.compiled.get(key)
        if fast is None:
            kernel = self.jit_fn[grid](*args, **kwargs)
            if kernel is not None and hasattr(kernel, "run") and os.environ.get("TRITON_INTERPRET") != "1":
                from triton import knobs
                from triton.runtime.driver import driver
                self.compiled[key] = (kernel, driver.active, knobs.runtime)
            return
        kernel, active, runtime = fast
        values = [v for k, v in kwargs.items() if k not in ("num_warps", "num_stages", *DEVICE_ASSERT_OPTIONS)]
        stream = active.get_current_stream(active.get_current_device())
        enter, leave = _active(runtime.launch_enter_hook), _active(runtime.launch_exit_hook)
        # hooks (a profiler, torch.compile's own) get the launch's metadata, as Triton gives it
        metadata = kernel.launch_metadata(grid, stream, *args, *values) if enter or leave else None
        kernel.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                   kernel.function, kernel.packed_metadata, metadata, enter, leave, *args, *values)


def _active(hook):
    """The hook, or None when there is nothing to call (Triton 3.6 keeps an empty HookChain)."""
    if hook is None or (hasattr(hook, "calls") and not hook.calls):
        return None
    return hook
