"""Triton code generation for GPU tensors (and for CPU tensors through Triton's interpreter).

Takes fusion `Kernel`s; hands the wrapper `@triton.jit` functions and their launch settings.

Pointwise kernels are flat: each program handles XBLOCK consecutive output elements and
recovers the per-dimension indices with `//` and `%` (only for dimensions that could not be
merged). Reductions are 2-D blocks, XBLOCK rows by RBLOCK reduction elements: *persistent*
(the whole row in one block) when the row is short, *looped* (accumulate RBLOCK at a time)
when it is long. Values are computed in float32 for half inputs and rounded when stored.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import importlib.util
import json
import math
import os
import re
import struct
import sys
import threading
import warnings
from typing import NamedTuple

import numpy as np
import torch

from .. import config, ir, metrics
from ..fusion.kernels import ComboKernel, TemplateKernel
from ..ir import Index, use_ops
from .common import KernelWriter, defined_once, plan_loops, reduction_identity, scalars_in, size_symbols_in

_LOAD_LINE = re.compile(r"\w+ = tl\.load\(")
TL_TYPES = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
            torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
            torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}

PERSISTENT_RBLOCK_LIMIT = 16384     # rows up to this many elements are reduced in registers
REDUCTION_PROGRAM_ELEMENTS = 1024   # the fewest elements a reduction program takes (whole rows)


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
        _patch_interpreter_libdevice()
        _patch_interpreter_bfloat16()
        _patch_interpreter_comparisons()
    return triton


# The libdevice functions the kernels call (CUDA's math library on a GPU, as Inductor calls
# it), and the NumPy function that computes each in Triton's interpreter, which has none.
INTERPRETED_LIBDEVICE = {"pow": "power", "tanh": "tanh", "sqrt": "sqrt"}


def _patch_interpreter_libdevice():
    """Let Triton's interpreter run the libdevice calls of INTERPRETED_LIBDEVICE, so it runs the
    code a GPU gets. `libdevice.pow` is a stub that Triton's compiler replaces by the GPU's
    function (in the interpreter it returns None), and the interpreter's builder raises for
    every external function. So the stub calls CUDA's libdevice function, and the builder
    hands its external call (`__nv_powf`, `__nv_pow`...) to NumPy."""
    import numpy as np
    from triton.language.extra import libdevice
    from triton.language.extra.cuda import libdevice as cuda_libdevice
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_extern_elementwise
    if getattr(original, "minicompile", False):
        return
    for name in INTERPRETED_LIBDEVICE:
        def call(*args, _function=getattr(cuda_libdevice, name)):
            return _function(*args, _semantic=interpreter.interpreter_semantic)
        setattr(libdevice, name, call)

    def create_extern_elementwise(self, lib_name, lib_path, symbol, args, ret_type, is_pure):
        name = symbol.removeprefix("__nv_")
        name = name if name in INTERPRETED_LIBDEVICE else name[:-1]      # __nv_powf: float32's
        if name not in INTERPRETED_LIBDEVICE:
            return original(self, lib_name, lib_path, symbol, args, ret_type, is_pure)
        with np.errstate(all="ignore"):       # NaN from a negative base, as on a GPU: no warning
            data = getattr(np, INTERPRETED_LIBDEVICE[name])(*[a.data for a in args])
        return interpreter.TensorHandle(data.astype(args[0].data.dtype), ret_type.scalar)
    create_extern_elementwise.minicompile = True
    builder.create_extern_elementwise = create_extern_elementwise


def _patch_interpreter_bfloat16():
    """Triton's interpreter converts float32 to bfloat16 by dropping the low bits (a GPU
    rounds to nearest even, as PyTorch does), and other types to bfloat16 by converting their
    values to 16-bit integers. Convert through float32, rounding to nearest even, as
    PyTorch's c10::BFloat16 does (a NaN stays a NaN)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.cast_impl
    if getattr(original, "minicompile", False):
        return

    def cast_impl(self, src, dst_type):
        source, target = src.dtype.scalar, dst_type.scalar
        if target == tl.bfloat16 and source != tl.bfloat16:
            f32 = np.ascontiguousarray(src.data.astype(np.float32))
            u = f32.view(np.uint32).astype(np.uint64)
            bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            return interpreter.TensorHandle(np.where(f32 != f32, np.uint16(0x7FC0), bits), target)
        if source == tl.bfloat16 and target != tl.bfloat16:
            f32 = (np.ascontiguousarray(src.data).astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(f32.astype(interpreter._get_np_dtype(dst_type)), target)
        return original(self, src, dst_type)
    cast_impl.minicompile = True
    builder.cast_impl = cast_impl           # (every conversion method of the builder calls it)


def _patch_interpreter_comparisons():
    """Triton's interpreter types a comparison's result as its operands' type (x != 0 of a
    float is a float tensor there), which a one-element comparison broadcast against a block
    then is (x.to(tl.int1) & block fails): a comparison is a bool (int1), as on a GPU."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.binary_op
    if getattr(original, "minicompile", False):
        return
    comparisons = {np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal}

    def binary_op(self, lhs, rhs, op):
        if op in comparisons:
            return interpreter.TensorHandle(op(lhs.data, rhs.data), tl.int1)
        return original(self, lhs, rhs, op)
    binary_op.minicompile = True
    builder.binary_op = binary_op


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
        "pow": "libdevice.pow({0}, {1})",
        "maximum": "tl.where(({0} != {0}) | ({0} > {1}), {0}, {1})",
        "minimum": "tl.where(({0} != {0}) | ({0} < {1}), {0}, {1})",
        "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
        "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "({0} & {1})",
        "logical_or": "({0} | {1})", "logical_not": "({0} == 0)", "neg": "(-{0})",
        "neg_float": "({0} * -1.0)",
        "abs": "tl.abs({0})", "relu": "tl.where({0} < 0, 0, {0})", "exp": "tl.exp({0})",
        "log": "tl.log({0})", "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "sin": "tl.sin({0})",
        "cos": "tl.cos({0})", "tanh": "libdevice.tanh({0})", "sigmoid": "tl.sigmoid({0})",
        "erf": "tl.erf({0})", "reciprocal": "(1 / {0})", "floor": "tl.floor({0})",
        # (where's condition may be a bool constant, written 1 or 0: an int to Triton, which
        # takes only a bool condition)
        "ceil": "tl.ceil({0})", "isnan": "({0} != {0})", "where": "tl.where(({0}) != 0, {1}, {2})",
        "rand": "tl.rand({0}, {1})", "randn": "tl.randn({0}, {1})", "opaque": "{0}",
    }

    def __init__(self, kernel, plan, buffers, mask: str):
        super().__init__(kernel, plan, buffers)
        self.mask = mask
        # float arithmetic here is float32 (narrower floats compute in it) unless the kernel
        # computes a float64 value: then Triton's own `/` and sqrt, which are IEEE for float64.
        # A float64 value comes from a load, a cast or a constant, each made before anything
        # divides it: `_sees` turns the float64 arithmetic on there (what the kernel computes
        # before stays float32's, rounded to nearest as eager's)
        self.float32_only = not any(m.box.dtype == torch.float64 for m in kernel.members)
        self.device_asserts = asserts_on_device(kernel.box.device)
        # a pointwise kernel's elements in loop order, as an index over its variables
        self.flat = None
        if not kernel.r_sizes and len(plan.x_vars) > 1:
            self.flat, stride = Index(), 1
            for var, size in zip(plan.x_vars[::-1], plan.x_sizes[::-1]):
                self.flat, stride = self.flat + Index.var(var) * stride, ir.size_expr(stride * size)

    # Division and square root rounded to nearest, as eager's CUDA kernels compute them:
    # Triton's float32 `/` and tl.sqrt are approximate (within 2 units in the last place),
    # which a later rounding to float16 can turn into a different half-precision value.
    def truediv(self, a, b):
        if a in self.constants and b in self.constants:
            # two Python numbers (an empty mean's 0 / 0): divided here, since Triton would
            # divide them while compiling and raise on a zero divisor
            with np.errstate(all="ignore"):
                value = np.float64(_literal(a)) / np.float64(_literal(b))
            return self.constant(float(value), torch.float32 if self.float32_only else torch.float64)
        if self.float32_only:
            return self._emit(f"tl.div_rn({self._block(a)}, {self._block(b)})")
        return self._emit(f"({a} / {b})")

    def reciprocal(self, x):
        return self.truediv(self.constant(1.0, torch.float32), x)

    def erf(self, x):
        # on a GPU, CUDA's own erf (libdevice's), the one eager's kernels call
        return self._emit(f"libdevice.erf({x})" if self.device_asserts else f"tl.erf({x})")

    def to_dtype(self, x, dtype, src_dtype=None):
        if src_dtype == torch.int16 and ir.compute_dtype(dtype) not in (torch.int16, torch.bool):
            # An int16 widened from its bits: on a GPU the compiler may take -(-32768) for an
            # overflow that cannot happen, and a plain widening cast then reads 32768 (the
            # GPU's arithmetic tests check it). Zero-extended bits, sign-corrected in 32 bits,
            # are right whatever the register holds above them.
            x = self._emit(f"(({x}).to(tl.uint16, bitcast=True).to(tl.int32) ^ 0x8000) - 0x8000")
            src_dtype = torch.int32
        if dtype in (torch.uint8, torch.int8, torch.int16) and (src_dtype is None or src_dtype.is_floating_point):
            # a float to a narrow integer through int64, as PyTorch's cast does (c10's
            # TypeCast): a value past its range wraps (-5.5 -> uint8 251, 300.7 -> int8 44),
            # where a GPU's direct conversion saturates (0, 127, -32768)
            x = self._emit(f"({x}).to(tl.int64)")
            src_dtype = torch.int64
        return super().to_dtype(x, dtype, src_dtype)

    def sqrt(self, x):
        return self._emit(f"tl.sqrt_rn({x})" if self.float32_only else f"tl.sqrt({x})")

    def rsqrt(self, x):
        # float64 on a GPU: libdevice's rsqrt, the one CUDA's kernels call (how close tl.rsqrt
        # comes in float64 is not measured here)
        return self._emit(f"libdevice.rsqrt({x})" if self.device_asserts and not self.float32_only
                          else f"tl.rsqrt({x})")

    def opaque(self, x):
        """x (an int32), hidden from the compiler's reasoning on a GPU by an empty asm move."""
        if not self.device_asserts:                 # Triton's interpreter: no compiler
            return x
        return self._emit(f'tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [{x}], '
                          f"dtype=tl.int32, is_pure=True, pack=1)")

    def _block(self, x):
        """A Python float as a float32 block (tl.div_rn takes blocks)."""
        return f"tl.full([1], {x}, tl.float32)" if x in self.constants and not x.startswith("tl.") else x

    def offset(self, index) -> str:
        """An index as code. One that walks the elements in loop order (a contiguous tensor in a
        pointwise kernel whose other inputs broadcast) is the block's own `xindex`: no
        per-dimension arithmetic is left for it, as in Inductor's kernels."""
        if self.flat is not None and index.terms == self.flat.terms:
            return "xindex" if index.const == 0 else f"xindex + {Index({}, index.const).render(ir.TRITON)}"
        return index.render(ir.TRITON)

    def assign(self, var, expr):
        return f"{var} = {expr}"

    def load(self, name, index):
        written = len(self.lines)
        var = super().load(name, index)
        if len(self.lines) == written + 1 and self.lines[-1].startswith(f"{var} = tl.load("):
            self._hoist_last_load()
        return var

    def _hoist_last_load(self) -> None:
        """Moves the load just written up to the first place its operands allow, after the
        loads already there, as Inductor writes its loads before its arithmetic: a load made
        after a long expression (the tanh GELU's backward reads g after computing tanh) waits
        for memory again, where made first its wait overlaps the other's. It never moves
        above a loop (its value would be held in registers through it) nor above a line that
        defines a name it uses (a gathered index, a mask)."""
        line = self.lines.pop()
        used = set(re.findall(r"\b[A-Za-z_]\w*\b", line.split(" = ", 1)[1]))
        at = len(self.lines)
        while at > 0:
            before = self.lines[at - 1]
            defined = re.match(r"(\w+) = ", before)
            if before.startswith((" ", "for ")) or defined and defined[1] in used:
                break
            at -= 1
        while at < len(self.lines) and _LOAD_LINE.match(self.lines[at]):
            at += 1        # loads keep their order
        self.lines.insert(at, line)

    def load_expr(self, name, index, dtype):
        ptr = self.arg_name(name)
        # an index without some loop variable reads each element many times (a weight broadcast
        # over the rows): ask the cache to keep it, as Inductor does
        keep = "" if set(self.plan.x_vars + self.plan.r_vars) <= index.variables() else \
            ", eviction_policy='evict_last'"
        if self.load_mask is not None:     # inside ops.masked: a block load under both masks
            offset = self.offset(index) if index.variables() else f"{index.render(ir.TRITON)} + 0 * xindex"
            value = f"tl.load({ptr} + ({offset}), {self.mask} & ({self.load_mask}), other=0{keep})"
        elif index.variables():
            value = f"tl.load({ptr} + ({self.offset(index)}), {self.mask}, other=0{keep})"
        else:   # one element for every lane: a scalar load (a block mask needs a block pointer)
            value = f"tl.load({ptr} + {index.render(ir.TRITON)})"
        cd = ir.compute_dtype(dtype)
        self._sees(cd)
        return f"{value}.to({TL_TYPES[cd]})" if cd != dtype else value

    def _sees(self, dtype):
        if dtype == torch.float64:
            self.float32_only = False

    def index_value_expr(self, index, dtype):
        if not index.variables():
            return self.constant_expr(index.const, dtype)
        self._sees(dtype)
        return f"({index.render(ir.TRITON)}).to({TL_TYPES[dtype]})"

    def index_assign(self, var, value):
        return f"{var} = ({value}).to(tl.int64)"

    def index_check(self, var, value, size, error):
        lanes = self.mask if self.load_mask is None else f"{self.mask} & ({self.load_mask})"
        bad = f"{var}_bad"           # a block of the lanes' shape: the store's pointers need it
        if self.device_asserts:
            report = f"tl.device_assert({bad} == 0, 'index out of range in self')"
        else:
            report = f"tl.store({ir.INDEX_ERRORS} + 0 * {bad}.to(tl.int32), {error}, {bad})"
        # the bad index is replaced all the same: no lane loads outside the tensor
        return [self.index_assign(var, value),
                f"{bad} = (({var} < 0) | ({var} >= {size})) & {lanes}",
                report,
                f"{var} = tl.where({bad}, 0, {var})"]

    def constant_expr(self, value, dtype):
        self._sees(dtype)
        if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
            return f"float('{value}')"
        if isinstance(value, float) and value == 0 and math.copysign(1.0, value) < 0 and dtype.is_floating_point:
            # -0.0 by its bits: Triton's front end folds a literal -0.0 (or float('-0.0')) to 0.0
            bits = 64 if dtype == torch.float64 else 32
            return f"tl.full([1], {-2 ** (bits - 1)}, tl.int{bits}).to(tl.float{bits}, bitcast=True)"
        if dtype == torch.bool:
            return "1" if value else "0"
        if isinstance(value, bool):          # a Python bool in arithmetic: 1 or 0
            value = int(value)
        if dtype == torch.float64 or not dtype.is_floating_point:
            return f"tl.full([1], {value!r}, {TL_TYPES[dtype]})"
        return repr(float(value))

    def cast_expr(self, x, dtype):
        self._sees(dtype)
        if x in self.constants and not x.startswith("tl."):    # a Python float: a block first
            x = f"tl.full([1], {x}, tl.float32)"
        return f"({x}).to({TL_TYPES[dtype]})"

    def render_size(self, size):
        return ir.render_size(size, ir.TRITON)

    def scalar_arg(self, name, dtype):
        self._sees(ir.compute_dtype(dtype))
        return self._emit(f"tl.full([1], {name}, {TL_TYPES[ir.compute_dtype(dtype)]})")

    def size_value(self, size, dtype):
        # a size argument is a scalar, not a block: a full block of it, then the cast
        return self._emit(self.cast_expr(f"tl.full([1], {self.render_size(size)}, tl.int64)", ir.compute_dtype(dtype)))


def _literal(text: str) -> float:
    """The number a constant's code holds (`0.5`, `float('nan')`, `tl.full([1], 3, tl.int64)`)."""
    match = re.fullmatch(r"tl\.full\(\[1\], (.*), tl\.\w+\)", text)
    return float(eval(match.group(1) if match else text, {"float": float}))


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

# Compile options every kernel gets on a GPU, so that its arithmetic is eager's: libdevice's
# functions (pow, tanh...) keep subnormal numbers, as eager's CUDA kernels do (Triton flushes
# them to zero by default); and a product is not fused with a sum into one FMA: the two are
# separate ops in eager, each rounded (a float16 product rounded between them is otherwise
# lost, and the result differs in its last bit)
EAGER_MATH = {"enable_reflect_ftz": False, "enable_fp_fusion": False}


def _decompose(flat: str, names: list[str], sizes: list[int]) -> list[str]:
    """Lines recovering per-dimension variables from a flat index (innermost last)."""
    lines, stride = [], 1
    for k in range(len(names) - 1, -1, -1):
        expr = flat if stride == 1 else f"({flat} // ({ir.render_size(stride, ir.TRITON)}))"
        if k > 0:
            expr = f"{expr} % ({ir.render_size(sizes[k], ir.TRITON)})"
        lines.append(f"{names[k]} = {expr}")
        stride = ir.size_expr(stride * sizes[k])
    return lines[::-1]


def kernel_source(kernel, buffers, graph=None):
    """Source of one @triton.jit kernel, the buffers it takes (inputs, then outputs) and its
    launch settings.

    Without r loops: a flat block of XBLOCK elements. With them: a block of XBLOCK rows by
    RBLOCK row elements; members are computed in order, a reduction's result stays in
    registers for the members after it. Short rows are reduced in one block (persistent);
    long rows in RBLOCK chunks, by loops over the row (_RowWalk): one for each run of
    members that need no result of a reduction in the same run."""
    plan = plan_loops(kernel)
    xnumel = ir.size_expr(math.prod(plan.x_sizes))
    rnumel = ir.size_expr(math.prod(plan.r_sizes))
    graph = graph or _GraphFacts.of(buffers)     # (generate works it out once for all its kernels)
    largest = graph.largest
    dynamic = ir.is_symbolic(xnumel) or ir.is_symbolic(rnumel) or largest is None
    # 32-bit indices unless some size could pass 2**31 (a dynamic size could: 64-bit then)
    big = dynamic or max(xnumel * max(1, rnumel), largest) >= 2**31
    pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
    mask = "xmask & rmask" if kernel.r_sizes else "xmask"
    writer = TritonWriter(kernel, plan, buffers, mask)
    x_idx, r_idx = writer.canonical

    def store(member, value, row: bool) -> str:
        shape = "[XBLOCK]" if not kernel.r_sizes else "[XBLOCK, RBLOCK]" if row else "[XBLOCK, 1]"
        return _store(writer, member, value, shape, "xmask & rmask" if row else "xmask")

    def finish(member, result):
        """A reduction's result per row: kept for the members after it, stored if asked."""
        if member.comp.reduction_type == "mean":
            result = writer._emit(f"{result} / ({writer.render_size(member.comp.rnumel())})")
        result = writer.rounded_as_stored(result, member.box.dtype)
        writer.row_values[member.box.name] = result
        if member.box.name in kernel.stored:
            writer.lines.append(store(member, result, row=False))

    with use_ops(writer):
        if not kernel.r_sizes:
            for m in kernel.members:
                value = m.run(x_idx, r_idx)
                if m.box.name in kernel.stored:
                    writer.lines.append(store(m, value, row=False))
            xblock, num_warps = _pointwise_config(xnumel, len(writer.whole_inputs))
            code = "\n".join(writer.lines)       # the per-dimension variables it still uses
            dims = [line for line in _decompose("xindex", plan.x_vars, plan.x_sizes)
                    if re.search(rf"\b{line.split(' = ')[0]}\b", code)]
            body = [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)", _mask("x", xnumel, xblock, "[XBLOCK]"),
                    *dims, *writer.lines]
            params = ["xnumel", "XBLOCK: tl.constexpr"]
            launch = {"xnumel": _launch_value(xnumel), "XBLOCK": xblock, "num_warps": num_warps,
                      "grid": _grid(xnumel, xblock)}
        else:
            persistent, xblock, rblock, _ = _reduction_config(xnumel, rnumel)   # warps: once the body is written
            columns = plan.columns and not ir.is_symbolic(xnumel) and not ir.is_symbolic(rnumel)
            if columns:
                persistent, (xblock, rblock, column_warps) = False, _column_config(xnumel, rnumel)
            rvars = [*_decompose("rindex", plan.r_vars, plan.r_sizes), _mask("r", rnumel, rblock, "[1, RBLOCK]")]
            head = [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]", _mask("x", xnumel, xblock, "[XBLOCK, 1]"),
                    *_decompose("xindex", plan.x_vars, plan.x_sizes), "rbase = tl.arange(0, RBLOCK)[None, :]"]
            if persistent:
                writer.lines += ["rindex = rbase", *rvars]
            # looped members share one walk of the row while none needs another's total
            walk = _RowWalk(writer, rvars, _reductions_needed(kernel))
            for k, m in enumerate(kernel.members):
                comp = m.comp
                if not persistent and (isinstance(comp, ir.Reduction) or m.role == "row"):
                    walk.join(m.box.name)
                else:
                    walk.close()
                # a per-row value loads one element per row: a row mask would widen it
                writer.mask = "xmask" if m.role == "x" and not isinstance(comp, ir.Reduction) else mask
                if isinstance(comp, ir.Reduction):
                    acc_tl = TL_TYPES[comp.src_dtype]
                    init = reduction_identity(comp.reduction_type, comp.src_dtype)
                    init = f"float('{init}')" if isinstance(init, float) and math.isinf(init) else repr(init)
                    # in a where, an identity as its dtype (a literal would be an int32: -2**63 is not)
                    init_value = f"tl.full([1], {init}, {acc_tl})"
                    reduce_fn = REDUCE_FN.get(comp.reduction_type)
                    if reduce_fn is None:
                        raise NotImplementedError(f"Triton reduction '{comp.reduction_type}'")
                    floating = comp.src_dtype.is_floating_point
                    nan_aware = comp.reduction_type in ("max", "min") and floating
                    arg = comp.reduction_type in ir.ARG_REDUCTIONS
                    deviations = comp.reduction_type == "squared_deviations"
                    if persistent:
                        value = m.run(x_idx, r_idx)
                        block = writer._emit(f"tl.where(xmask & rmask, {value}, {init_value}).to({acc_tl})")
                        if deviations:        # the row is in registers: its mean, then about it
                            count = writer._emit("tl.sum(tl.where(xmask & rmask, 1.0, 0.0), 1)[:, None]")
                            mean = writer._emit(f"tl.sum({block}, 1)[:, None] / tl.maximum({count}, 1.0)")
                            apart = writer._emit(f"tl.where(xmask & rmask, {block} - {mean}, 0.0)")
                            result = writer._emit(f"tl.sum({apart} * {apart}, 1)[:, None]")
                        elif arg:
                            positions = writer._emit("tl.where(xmask & rmask, rindex, rnumel)")
                            result = _first_best(writer, reduce_fn, block, positions, floating)
                        else:
                            result = _row_reduce(writer, reduce_fn, block, nan_aware)
                            if reduce_fn == "tl.sum" and floating:
                                # from +0.0, as eager's sum: a full block of -0.0s adds no padding
                                result = writer._emit(f"{result} + 0.0")
                    else:
                        acc, pos, v = f"acc{k}", f"pos{k}", f"v{k}"
                        value = m.run(x_idx, r_idx)
                        writer.lines.append(f"{v} = tl.where(xmask & rmask, {value}, {init_value}).to({acc_tl})")
                        if deviations:
                            _shifted_lanes(writer, walk, k, v, acc_tl)
                            walk.after.append(lambda m=m, k=k, t=acc_tl: finish(m, _merged_lanes(writer, k, t)))
                            continue
                        if arg:
                            # per lane, elements come in order: take the first, a NaN over a
                            # number, or a strictly better value (ties keep the earlier one)
                            better = ">" if comp.reduction_type == "argmax" else "<"
                            writer.lines += [f"take = xmask & rmask & (({pos} == rnumel) | ({v} {better} {acc}) | "
                                             f"(({v} != {v}) & ({acc} == {acc})))",
                                             f"{acc} = tl.where(take, {v}, {acc})",
                                             f"{pos} = tl.where(take, rindex, {pos})"]
                        else:
                            writer.lines.append(f"{acc} = {COMBINE[comp.reduction_type].format(acc=acc, v=v)}")
                        walk.before.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {init}, {acc_tl})")
                        if arg:
                            walk.before.append(f"{pos} = tl.full([XBLOCK, RBLOCK], rnumel, tl.int32)")
                        # the accumulators kept NaN; tl.max/tl.min alone would drop it
                        reduce_row = (functools.partial(_first_best, writer, reduce_fn, acc, pos, floating) if arg
                                      else functools.partial(_row_reduce, writer, reduce_fn, acc, nan_aware))
                        walk.after.append(lambda m=m, reduce_row=reduce_row: finish(m, reduce_row()))
                        continue
                    finish(m, result)
                elif m.role == "row":
                    value = m.run(x_idx, r_idx)
                    if m.box.name in kernel.stored:
                        writer.lines.append(store(m, value, row=True))
                else:
                    value = m.run(x_idx, r_idx)
                    writer.row_values[m.box.name] = value
                    if m.box.name in kernel.stored:
                        writer.lines.append(store(m, value, row=False))
            walk.close()
            body = head + writer.lines
            num_warps = column_warps if columns else _reduction_config(xnumel, rnumel, len(writer.whole_inputs))[3]   # (the inputs it reads whole)
            # a static row length is a compile-time constant (the loop over it is unrolled or
            # bounded at compile time); a dynamic one is an argument like the other sizes
            params = ["xnumel", "rnumel" if ir.is_symbolic(rnumel) else "rnumel: tl.constexpr",
                      "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"]
            launch = {"xnumel": _launch_value(xnumel), "rnumel": _launch_value(rnumel), "XBLOCK": xblock,
                      "RBLOCK": rblock, "num_warps": num_warps, "grid": _grid(xnumel, xblock)}
    # an output may be written over an input it replaces (as Inductor's in_out_ptr), except
    # an input read along a row walked several times: a later walk would read what an earlier
    # one overwrote (one read per row, a batch norm's running mean beside its statistics, is
    # read before its row's value is stored, however many walks come first)
    kernel.in_place = writer.in_place_inputs()
    if kernel.r_sizes and not persistent and walk.walks > 1:
        kernel.in_place = {out: [x for x in over if x not in writer.row_inputs] for out, over in kernel.in_place.items()}
    return _function(kernel, writer, body, params, launch)


def _store(writer, member, value, shape: str, mask: str) -> str:
    """The line storing `value` as `member`'s element(s); `shape`: the block's, for a constant."""
    index = writer.store_index(member)
    text = writer.offset(index) if index.variables() else f"{index.render(ir.TRITON)} + 0 * xindex"
    if "RBLOCK" in shape and index.variables() and not any(str(v).startswith("x") for v in index.variables()):
        # a row stored by a kernel that reduces to one value (no x in its index): the pointers
        # made a block of the mask's shape, [XBLOCK, RBLOCK], as Triton's store asks
        text = f"{text} + 0 * xindex"
    if value in writer.constants:       # a constant output still needs a block of values
        # (an integer constant is a one-element block already: added, not splat)
        value = f"(tl.zeros({shape}, {TL_TYPES[ir.compute_dtype(member.box.dtype)]}) + {value})"
    return (f"tl.store({writer.out_name(member.box.name)} + ({text}), "
            f"({value}).to({TL_TYPES[member.box.dtype]}), {mask})")


def _function(kernel, writer, body: list[str], params: list[str], launch: dict):
    """The @triton.jit function of `body`: its parameters are the buffers it loads, those it
    stores, the index-error flag where it checks indices on a CPU, the dynamic sizes and floats
    the body uses, then `params` (the launch settings). -> (source, argument buffer names,
    launch settings)."""
    stored = [m.box for m in kernel.members if m.box.name in kernel.stored]
    checked = [ir.INDEX_ERRORS] if writer.checks_indices and not writer.device_asserts else []
    if writer.checks_indices and writer.device_asserts:
        launch.update(DEVICE_ASSERT_OPTIONS)
    args = [f"in_ptr{i}" for i in range(len(writer.args))] + [f"out_ptr{i}" for i in range(len(stored))] + checked
    # dynamic sizes the body uses (not those only in xnumel / rnumel): arguments, before the
    # launch settings, in the order the launcher passes them
    symbols = size_symbols_in("\n".join(body))
    scalars = scalars_in("\n".join(body))
    if scalars and any(b.dtype == torch.float64 for b in writer.buffers.values()):
        # Triton passes a Python float as float32: exact only for float32 and narrower work
        raise NotImplementedError("a dynamic Python float in a float64 Triton kernel")
    symbols += scalars
    launch = {**{sym: sym for sym in symbols}, **launch}
    lines = ["@triton.jit", f"def {kernel.name}({', '.join(args + symbols + params)}):"]
    lines += ["    " + line for line in body]
    return "\n".join(lines), writer.args + [b.name for b in stored] + checked, launch


def combo_source(combo, buffers, defined: dict, graph=None) -> tuple[list[str], list[str], dict]:
    """The sources of a combo kernel (fusion's ComboKernel): each part is its kernel's code as
    a function of the program id (`pid`), and one @triton.jit kernel gives the first part's
    grid of programs to the first part, the next ids to the second, and so on. -> (sources,
    argument buffer names, launch settings)."""
    sources, args, symbols, branches, start = [], [], [], [], 0
    launch = {"num_warps": 1}
    for i, part in enumerate(combo.parts):
        src, part_args, part_launch = kernel_source(part, buffers, graph)
        name = f"{combo.name}_part{i}"
        src = src.replace(f"def {part.name}(", f"def {name}(pid, ", 1).replace("tl.program_id(0)", "pid")
        function = defined_once(defined, name, src)
        if function == name:
            sources += [src, ""]
        args += [a for a in part_args if a not in args]
        given = [k for k, v in part_launch.items() if k != "grid" and isinstance(v, str)]
        symbols += [k for k in given if k not in symbols]
        passed = [f"a{args.index(a)}" for a in part_args] + given + \
                 [str(part_launch["xnumel"]), str(part_launch["XBLOCK"])]
        start += part_launch["grid"]
        branches.append((start, f"{function}(pid - {start - part_launch['grid']}, {', '.join(passed)})"))
        launch["num_warps"] = max(launch["num_warps"], part_launch["num_warps"])
        launch.update({k: v for k, v in part_launch.items() if k in DEVICE_ASSERT_OPTIONS})
    lines = ["@triton.jit", f"def {combo.name}({', '.join([f'a{i}' for i in range(len(args))] + symbols)}):",
             "    pid = tl.program_id(0)"]
    for k, (end, call) in enumerate(branches):
        lines += [f"    {'if' if k == 0 else 'elif'} pid < {end}:", f"        {call}"]
    combo.take_in_place()
    return sources + ["\n".join(lines)], args, {**{sym: sym for sym in symbols}, **launch, "grid": start}


class _RowWalk:
    """The members of a looped reduction kernel that walk the row together: one loop over it,
    whose body computes each of them (a load or an expression they share written once), with
    the accumulators set before it and the reductions finished after it. A member that needs
    the result of a reduction in the walk (softmax's exp(x - max) needs the max) starts the
    next walk; so does a per-row member, which is computed between walks."""

    def __init__(self, writer, rvars: list[str], needs: dict[str, set[str]]):
        self.writer, self.rvars, self.needs = writer, rvars, needs
        self.scope = None
        self.walks = 0              # loops written so far

    def join(self, name: str) -> None:
        """Member `name`'s code, written next, goes into the walk's loop."""
        if self.scope is not None and self.needs[name] & self.members:
            self.close()
        if self.scope is None:
            self.members: set[str] = set()
            self.before: list[str] = []         # lines before the loop (accumulators)
            self.after: list = []               # callables writing the lines after it
            self.scope = self.writer.scope()
            self.body = self.scope.__enter__()
        self.members.add(name)

    def close(self) -> None:
        """Writes the loop of the walk under way, if any, and what follows it."""
        if self.scope is None:
            return
        self.scope.__exit__(None, None, None)
        self.scope = None
        self.writer.lines += [*self.before, "for roffset in range(0, rnumel, RBLOCK):",
                              *["    " + line for line in ["rindex = roffset + rbase", *self.rvars, *self.body]]]
        for write in self.after:
            write()
        self.walks += 1


def _reductions_needed(kernel) -> dict[str, set[str]]:
    """For each member, the kernel's reductions whose results it uses: those it reads, and
    those the pointwise members it reads (and recomputes) use."""
    members = {m.box.name: m for m in kernel.members}
    needs: dict[str, set[str]] = {}
    for m in kernel.members:
        needs[m.box.name] = set()
        for name, _ in ir.reads_of(m.comp).loads:
            if name in members:
                needs[m.box.name] |= {name} if isinstance(members[name].comp, ir.Reduction) else needs.get(name, set())
    return needs


def _mask(axis: str, numel, block: int, shape: str) -> str:
    """Which lanes of a block are in range. When the block size divides a static size, all
    are: the mask is a constant, and Triton's compiler drops it from every load, store and
    `where` (as Inductor's kernels do), which saves the comparisons and keeps loads wide."""
    if not ir.is_symbolic(numel) and numel % block == 0:
        return f"{axis}mask = tl.full({shape}, True, tl.int1)"
    return f"{axis}mask = {axis}index < {axis}numel"


def _shifted_lanes(writer, walk, k: int, v: str, acc_tl: str) -> None:
    """A walked row's sum of squared deviations about its own mean, read once: each lane sums
    its elements' differences from the first element it saw (its shift), and their squares.
    About a shift near the mean the squares' sum loses little to the square of the sum taken
    from it (_merged_lanes), where the plain sums of squares of values far from zero would lose
    every digit; and there is no division for each element (Welford's update, one a lane per
    element, bounded the kernel by its instructions)."""
    seen = "xmask & rmask"
    writer.lines += [f"shift{k} = tl.where(roffset == 0, {v}, shift{k})",
                     f"apart{k} = tl.where({seen}, {v} - shift{k}, 0.0)",
                     f"sum{k} = sum{k} + apart{k}",
                     f"acc{k} = acc{k} + apart{k} * apart{k}"]
    walk.before += [f"{name}{k} = tl.full([XBLOCK, RBLOCK], 0, {acc_tl})" for name in ("shift", "sum", "acc")]


def _merged_lanes(writer, k: int, acc_tl: str) -> str:
    """The row's sum of squared deviations from its lanes': each lane's count (the walk's
    steps that reached it), mean and sum of squared deviations about it, then Chan's formula
    for many parts: sum_l m2_l + sum_l n_l (mean_l - mean)^2, mean the lanes' means weighted by
    their counts (sums of terms of one sign: no cancellation)."""
    count = writer._emit(f"((rnumel - rbase + RBLOCK - 1) // RBLOCK).to({acc_tl})")
    share = writer._emit(f"sum{k} / tl.maximum({count}, 1.0)")
    lane_mean = writer._emit(f"shift{k} + {share}")
    lane_m2 = writer._emit(f"tl.maximum(acc{k} - sum{k} * {share}, 0.0)")
    mean = writer._emit(f"tl.sum({lane_mean} * {count}, 1)[:, None] / tl.maximum(rnumel, 1.0)")
    apart = writer._emit(f"{lane_mean} - {mean}")
    return writer._emit(f"tl.sum({lane_m2} + {count} * {apart} * {apart}, 1)[:, None]")


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
             "argmax": "tl.max", "argmin": "tl.min", "squared_deviations": "tl.sum"}
COMBINE = {"sum": "{acc} + {v}", "mean": "{acc} + {v}", "prod": "{acc} * {v}",
           "max": "tl.where(({v} != {v}) | ({v} > {acc}), {v}, {acc})",
           "min": "tl.where(({v} != {v}) | ({v} < {acc}), {v}, {acc})"}


def _reduction_config(xnumel: int, rnumel: int, whole_inputs: int = 1) -> tuple[bool, int, int, int]:
    """(persistent, XBLOCK, RBLOCK, num_warps) for a reduction kernel that reads `whole_inputs`
    inputs at every element (not a weight broadcast over the rows). A row that fits is held in
    registers whole (persistent: the row is read from memory once, however many members walk
    it). A program takes whole rows, at least REDUCTION_PROGRAM_ELEMENTS of them. Warps, from
    an H100 sweep of nine settings for rows of 256 to 8192 (benchmarks/sweep_configs.py,
    results/sweep_configs_h100.json): reading one input (softmax, layer_norm, RMS norm), one
    warp per 256 elements (8 per thread), up to 32, was the best setting or within 1% of it
    (4-row programs, used before, were up to 8% slower). Reading two or more (an MLP's gelu +
    residual + layer_norm), 8 warps was best or within 2%, where one warp per 256 elements was
    up to 11% slower for rows of 1024 and 39% for rows of 8192."""
    if ir.is_symbolic(rnumel):
        # a row of any length: looped, in blocks sized for short rows (a persistent block
        # would have to hold the longest row the size could be)
        return False, 16, 256, 8
    persistent = rnumel <= PERSISTENT_RBLOCK_LIMIT
    rblock = _next_pow2(rnumel) if persistent else 2048
    rows = 4096 if ir.is_symbolic(xnumel) else _next_pow2(xnumel)
    xblock = max(1, min(rows, REDUCTION_PROGRAM_ELEMENTS // rblock if persistent else 1))
    if persistent and whole_inputs >= 2:
        return persistent, xblock, rblock, 8
    num_warps = max(2, min(32, (xblock * rblock) // 256))
    return persistent, xblock, rblock, num_warps


def _column_config(xnumel: int, rnumel: int) -> tuple[int, int, int]:
    """(XBLOCK, RBLOCK, num_warps) for a column reduction (its rows far apart in memory, its
    columns next to each other): a program takes XBLOCK neighbouring columns,
    `ir.GPU_COLUMN_BLOCK` (32) where that leaves a program for each of the GPU's 132
    multiprocessors (two each where the columns are shorter than 2048, whose walk of a few steps
    gives a program too little work to hide its loads' latency), else fewer, down to 8 (a
    32-byte sector of float32 per row read); it walks the rows RBLOCK at a time (tiles of
    2048). Long columns come split into enough pieces for 32 a program (lowerings._split_factor).
    Swept (benchmarks/sweep_column_reductions.py): unsplit columns on the H100
    (results/sweep_column_reductions_h100.json: there, 8 columns a program in tiles of 2048 was
    the best of 30 settings or within 4% of it, but for 3072 columns), split ones on the H200
    (results/sweep_split_columns_h200.json: 32 columns in tiles of 2048 over the pieces chosen
    was within 1% of the best of 15 settings at a ResNet-50's three largest batch-norm shapes).
    For short columns, MobileNetV3's batch norm, activation and mean over 28 x 28 positions of 72
    and 120 channels (batch 64): 16 columns a program took 20% and 14% less time than 32, within
    1.1% of the best of 24 settings (a one-off sweep on an H100; no results file holds it)."""
    programs = ir.GPU_MULTIPROCESSORS if rnumel >= 2048 else 2 * ir.GPU_MULTIPROCESSORS
    xblock = ir.GPU_COLUMN_BLOCK
    while xblock > 8 and xnumel // xblock < programs:
        xblock //= 2
    return xblock, max(16, min(2048 // xblock, _next_pow2(rnumel))), 8


def _pointwise_config(xnumel: int, whole_inputs: int = 1) -> tuple[int, int]:
    """Block size and warps for a kernel reading `whole_inputs` inputs at every element, from
    H100 sweeps (benchmarks/sweep_configs.py: float32 gelu(x + b) + r, whose x and r are read
    whole; results/sweep_configs_h100.json). Below 2**20 elements, blocks of 512 with 4 warps
    (enough programs to fill the GPU; within 3% of the best setting tried). From 2**20, 1024
    with 8 warps: one 16-byte load per input per thread (at 2**20, 16% faster than 2048 with
    8). From 2**24, far past the L2 cache, a kernel reading two or more inputs whole takes 512
    with 8 warps (what Inductor's autotuning picks there; 1.5% faster than 1024); with it,
    relu(x + 1) * 2 and gelu(x + b), which read one, were 3% and 6% slower
    (results/memory_bound_h100_xblock512.json), so they keep 1024. One middle size for a
    dynamic number."""
    if ir.is_symbolic(xnumel):
        return 1024, 4
    if xnumel >= 2**24 and whole_inputs >= 2:
        return 512, 8
    if xnumel >= 2**20:
        return 1024, 8
    xblock = max(16, min(512, _next_pow2(xnumel)))
    return xblock, max(1, min(4, xblock // 128))


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class _GraphFacts(NamedTuple):
    """What every kernel of a graph asks of all its buffers, found once per graph."""
    largest: int | None         # the most elements any buffer has; None when some size is dynamic

    @staticmethod
    def of(buffers) -> "_GraphFacts":
        sizes = [ir.size_expr(math.prod(b.shape)) for b in buffers.values()]
        largest = None if any(ir.is_symbolic(n) for n in sizes) else max(sizes + [0])
        return _GraphFacts(largest)


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
    """The module of all kernels of a graph, and {kernel name: (argument buffer names, launch
    settings, name of the function that runs it)}. Kernels whose code is the same (the layers
    of an MLP, say) are defined once, as Inductor does: the others are aliases in the module,
    and Triton compiles that code once."""
    sources, meta, defined = [], {}, {}
    graph = _GraphFacts.of(buffers)
    for kernel in kernels:
        if isinstance(kernel, ComboKernel):
            parts, args, launch = combo_source(kernel, buffers, defined, graph)
            sources += [*parts, ""]
            meta[kernel.name] = (args, launch, kernel.name)
            continue
        if isinstance(kernel, TemplateKernel):
            from .matmul_template import template_source     # (it builds on this module)
            src, args, launch = template_source(kernel, buffers)
        else:
            src, args, launch = kernel_source(kernel, buffers, graph)
        function = defined_once(defined, kernel.name, src)
        sources += [src, ""] if function == kernel.name else [f"{kernel.name} = {function}  # the same code", ""]
        meta[kernel.name] = (args, launch, function)
    parts = ["import triton", "import triton.language as tl"]
    if any("libdevice." in src for src in sources):
        parts.append("from triton.language.extra import libdevice")
    parts.append("")
    for name, lines in HELPERS.items():
        if any(f"{name}(" in src for src in sources):
            parts += [*lines, "", ""]
    return "\n".join(parts + sources) + "\n", meta


def write_whole(path: str, data: str | bytes) -> None:
    """Write `data` to a file of this process and thread, then rename it to `path`: another
    process reading the cache (or compiling the same kernels) finds the whole file or none."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def load(source: str, meta: dict) -> dict:
    """Write the module to the cache (Triton reads a kernel's source from its file) and hand
    back one `Launcher` per kernel. Nothing is imported yet: when every kernel's binary is on
    disk already, the graph runs without importing Triton at all."""
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    directory = os.path.join(config.cache_dir, "triton")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"k{key}.py")
    if not os.path.exists(path):
        write_whole(path, source)
    module = _KernelModule(path, key)
    launchers, shared = {}, {}
    for name, (args, launch, function) in meta.items():
        # call sites of one function with the same fixed settings share a launcher (and binaries)
        fixed = _fixed_settings(launch)
        if (function, fixed) not in shared:
            shared[function, fixed] = Launcher(module, function, len(args), launch)
        launchers[name] = shared[function, fixed]
    return launchers


def _fixed_settings(launch: dict) -> tuple:
    """The launch settings fixed at a launch site (block sizes, a static row length...): part
    of what a binary is compiled for, since one function can be launched with several."""
    return tuple((k, v) for k, v in launch.items() if k != "grid" and not isinstance(v, str))


class _KernelModule:
    """The generated module, imported (with Triton) the first time a kernel must be compiled
    (by one of precompile's threads, perhaps: the lock makes that once)."""

    def __init__(self, path: str, key: str):
        self.path, self.key, self.module = path, key, None
        self.lock = threading.Lock()

    def jit_fn(self, name: str):
        with self.lock:
            if self.module is None:
                import_triton()
                spec = importlib.util.spec_from_file_location(f"minicompile_triton_{self.key}", self.path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                self.module = module
        return getattr(self.module, name)


def precompile(launchers: dict, meta: dict, buffers: dict, meanwhile=None, device: int | None = None) -> None:
    """Compile every kernel of a graph at once, instead of one by one at first launch. Each
    kernel is compiled for the specialization its first real launch will ask for: 16-byte-
    aligned pointers. Kernels whose binary is on disk already cost nothing here. `meanwhile`:
    other compilation for this process to do while the workers compile (see compile_all);
    `device`: the GPU the kernels run on, where known (see _CompileServer.close)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return
    jobs = []
    for name, launcher in launchers.items():
        args, launch, _ = meta[name]
        jobs.append((launcher, [buffers[a].dtype for a in args], launch))
    compile_all(jobs, meanwhile, device=device)


def compile_all(jobs, meanwhile=None, wait: bool = False, device: int | None = None) -> None:
    """Compile (launcher, argument dtypes, launch settings) jobs not on disk yet, for aligned
    pointers. Triton's front end (Python source to its IR) is Python, so threads would take
    turns at the interpreter lock: the jobs are shared among forked worker processes instead
    (where the system can fork), each of which compiles its share, saves the binaries and
    exits; launches then load the binaries from disk. A kernel a worker could not compile is
    compiled again at its first launch, which reports the error. `meanwhile()` runs in this
    process while the workers compile (after the fork: a worker must not inherit a compilation
    half done); what it raises is left to the first launch to report. Inside
    `compiling_together` the workers are waited for at its end, unless `wait`, and they are
    forked by its compile server when it has one, which loads each binary onto GPU `device`
    (where given) as it is answered."""
    todo, seen = [], set()
    for launcher, dtypes, launch in jobs:
        settings = {k: v for k, v in launch.items() if k != "grid"}
        if any(isinstance(v, str) for v in settings.values()):
            continue                # dynamic sizes: compiled at its first launch
        key = _spec_key(tuple((dtype, True) for dtype in dtypes), ())
        if (launcher, key) not in seen and launcher.binary_path(key) is None:
            todo.append((launcher, dtypes, settings, key))
            seen.add((launcher, key))

    def run_meanwhile():
        try:
            if meanwhile is not None:
                meanwhile()
        except Exception:           # noqa: BLE001 (the first launch compiles, and reports)
            pass
    workers = min(len(todo), os.cpu_count() or 1, config.compile_workers)
    server = None if wait else getattr(_TOGETHER, "server", None)
    if todo and server is not None and server.submit(todo, device):
        run_meanwhile()
        return
    if workers <= 1 or not hasattr(os, "fork"):
        for job in todo:
            _compile_job(job)
        run_meanwhile()
        return
    _gpu_target(), _toolchain()     # asked of the GPU here: a forked worker must not touch CUDA
    import_triton()
    with warnings.catch_warnings():
        # Python 3.12 warns of fork in a process with threads (PyTorch's, CUDA's): a worker
        # runs Triton's compiler only, and one that hangs is stopped (_wait_for)
        warnings.simplefilter("ignore", DeprecationWarning)
        first = _fork_workers(todo, workers, own_group=True)
    with contextlib.suppress(OSError):      # (set on both sides: whichever runs first)
        os.setpgid(first, first)
    children = [first]
    run_meanwhile()
    deferred = None if wait else getattr(_TOGETHER, "children", None)
    if deferred is not None:        # compiling_together waits for them
        deferred.extend(children)
    else:
        _wait_for(children, deadline=300.0)


def _compile_job(job) -> None:
    launcher, dtypes, settings, key = job
    try:
        launcher.compile(dtypes, settings, key)
    except Exception:           # noqa: BLE001 (the real launch compiles again, and reports the error)
        pass


def _fork_workers(todo: list, workers: int, own_group: bool) -> int:
    """Fork the first of `workers` processes that compile `todo` between them; its pid. With
    `own_group` the workers are a process group of their own, stopped together (_wait_for)."""
    def compile_share(w):
        for job in todo[w::workers]:
            _compile_job(job)
    return _fork_tree(workers, compile_share, own_group)


def _fork_tree(count: int, work, own_group: bool) -> int:
    """Fork `count` processes, each running work(its number) then exiting; the first one's pid.

    This process forks one, and they fork the others, as a tree: a fork copies the page tables
    of all a process maps (a model on a GPU, CUDA's mappings), 15 to 20 ms a fork on the H100
    machine, so forked one by one from here the workers cost this process a quarter of a
    second and the last started that late; as a tree, one fork, and the last starts four forks
    after the first. Each waits for the ones it forked. `own_group`: they are a process group
    of their own (stopped together, _wait_for); else they stay in this process's."""
    def worker(w):
        """Worker w forks workers 2w + 1 and 2w + 2, does its work, and waits for the two."""
        forked = []
        for other in (2 * w + 1, 2 * w + 2):
            if other < count:
                pid = os.fork()
                if pid == 0:
                    try:
                        worker(other)
                    finally:
                        os._exit(0)
                forked.append(pid)
        work(w)
        for pid in forked:
            os.waitpid(pid, 0)
    first = os.fork()
    if first == 0:
        try:
            if own_group:
                os.setpgid(0, 0)
            worker(0)
        finally:
            os._exit(0)
    return first


class _CompileServer:
    """Compile workers forked warm, and ready before the first kernel is.

    A process's first Triton compilation pays for setting Triton's compiler up (LLVM, the
    backend, its libraries) before its kernel, and a worker forked from a process that has
    compiled once does not pay it again. So when a graph that will need kernels starts compiling (a training graph,
    before its joint trace: compiling_together), one process is forked, sets Triton up by
    compiling a small kernel, and forks the workers from that state, all while this process
    traces and lowers. Each worker then takes jobs one at a time from a pipe and answers each
    on another once its binary is saved: a batch starts compiling the moment it is
    handed over, and this process knows it is done without waiting for 16 processes to exit
    (tens of milliseconds each, for processes this large). Jobs travel pickled, through a file
    per batch (a launcher is rebuilt from its module's path, see Launcher.__reduce__); the
    pipe carries fixed-size records, batch and job number, each read whole by one worker, and
    each answer names its batch and job. While it waits for the others, this process loads the
    binary of each job answered onto its GPU (reading the cubin, the driver's module load: a
    millisecond or so a kernel, which the first launch would pay, after every compile)."""

    RECORD = 64            # bytes a job's record takes (a divisor of the pipe's atomic write)
    ANSWER = struct.Struct("<II")      # a job answered: its batch's number, its own

    def __init__(self, pid: int, jobs: int, done: int):
        self.pid, self.jobs, self.done = pid, jobs, done
        self.expected = 0
        self.batches: list = []        # (its file, its jobs, their GPU), by batch number
        self.directory = config.cache_dir          # where its workers save the binaries

    @classmethod
    def take(cls) -> "_CompileServer":
        """A server for the graphs about to compile: the one the last graphs' end started
        (leave_one_started), set up by now, where it is still running and saves where this
        process looks; else one started now. Its Triton set-up (a few tenths of a second)
        was then paid while the process ran the last graphs, not while this graph's first
        kernels wait for workers."""
        while _SPARE:
            server = _SPARE.pop()
            if server.directory == config.cache_dir and server.running():
                return server
            server.discard()
        return cls.start()

    @classmethod
    def leave_one_started(cls) -> None:
        """Start the next graphs' server now (torch.compile keeps its pool of compile workers
        warm so too); nothing where the system cannot fork one."""
        if not _SPARE:
            with contextlib.suppress(OSError):
                _SPARE.append(cls.start())

    def running(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def discard(self) -> None:
        """Let an unused server go: its workers find the pipe of jobs closed, and exit."""
        for fd in (self.jobs, self.done):
            with contextlib.suppress(OSError):
                os.close(fd)
        threading.Thread(target=_reap, args=(self.pid,), daemon=True).start()

    @classmethod
    def start(cls) -> "_CompileServer":
        _gpu_target(), _toolchain()     # asked of the GPU here: the server must not touch CUDA
        workers = max(1, min(os.cpu_count() or 1, config.compile_workers))
        jobs_read, jobs_write = os.pipe()
        done_read, done_write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)     # (as compile_all's fork)
            pid = os.fork()
        if pid == 0:
            try:
                os.close(jobs_write), os.close(done_read)
                os.setpgid(0, 0)
                with contextlib.suppress(Exception):
                    _set_triton_up()
                directory = config.cache_dir
                first = _fork_tree(workers, lambda w: _work(directory, jobs_read, done_write), own_group=False)
                os.close(jobs_read), os.close(done_write)
                os.waitpid(first, 0)
            finally:
                os._exit(0)
        os.close(jobs_read), os.close(done_write)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        return cls(pid, jobs_write, done_read)

    def submit(self, todo: list, device: int | None = None) -> bool:
        """Hand the workers a batch (for GPU `device`, where known); False where it cannot be
        handed over (this process then compiles it, as without a server)."""
        import pickle
        try:
            os.makedirs(config.cache_dir, exist_ok=True)
            path = os.path.join(config.cache_dir, f"jobs-{self.pid}-{len(self.batches)}")
            write_whole(path, pickle.dumps(todo))
        except (OSError, pickle.PicklingError, AttributeError, TypeError):
            return False
        self.batches.append((path, todo, device))
        name = os.path.basename(path)
        records = b"".join(f"{name} {i}".encode().ljust(self.RECORD) for i in range(len(todo)))
        step = 4096 // self.RECORD * self.RECORD      # each write whole (atomic), records unsplit
        try:
            for at in range(0, len(records), step):
                os.write(self.jobs, records[at:at + step])
        except OSError:         # (no worker left to read them: the server was stopped)
            return False
        self.expected += len(todo)
        return True

    def close(self, deadline: float = 300.0) -> None:
        """No more batches: wait until every job handed over is compiled (or every worker has
        gone, or the deadline: then the group is stopped, and what is missing is compiled at
        its first launch). The workers exit when the pipe is empty; nobody waits for that."""
        import select
        import signal
        import time
        os.close(self.jobs)
        with metrics.timed("kernel compile"):
            start, answered, pending = time.monotonic(), 0, b""
            while answered < self.expected:
                left = deadline - (time.monotonic() - start)
                if left <= 0 or not select.select([self.done], [], [], left)[0]:
                    with contextlib.suppress(OSError):
                        os.killpg(self.pid, signal.SIGKILL)
                    break
                got = os.read(self.done, 4096)
                if not got:             # every worker has exited
                    break
                pending += got
                whole = len(pending) - len(pending) % self.ANSWER.size
                for batch, job in self.ANSWER.iter_unpack(pending[:whole]):
                    answered += 1
                    self._load(batch, job)
                pending = pending[whole:]
        os.close(self.done)
        for path, _, _ in self.batches:
            with contextlib.suppress(OSError):
                os.unlink(path)
        threading.Thread(target=_reap, args=(self.pid,), daemon=True).start()

    def _load(self, batch: int, job: int) -> None:
        _, todo, device = self.batches[batch]
        launcher, _, _, key = todo[job]
        if device is not None:
            with contextlib.suppress(Exception):       # (its first launch loads it, and reports)
                launcher.load(key, device)


_SPARE: list = []          # the compile server started for the next graphs (take, leave_one_started)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)


def _work(directory: str, jobs: int, done: int) -> None:
    """A compile server's worker: take a job's record (its batch's file in `directory`, its
    number), compile it, answer; until the pipe of jobs is closed and empty."""
    import pickle
    batches: dict = {}
    while True:
        record = os.read(jobs, _CompileServer.RECORD)
        if not record:
            return
        name, index = record.decode().split()
        try:
            if name not in batches:
                with open(os.path.join(directory, name), "rb") as f:
                    batches[name] = pickle.load(f)
            _compile_job(batches[name][int(index)])
        except Exception:       # noqa: BLE001 (its first launch compiles it, and reports)
            pass
        os.write(done, _CompileServer.ANSWER.pack(int(name.rsplit("-", 1)[1]), int(index)))


WARM_UP_KERNEL = """import triton
import triton.language as tl


@triton.jit
def warm_up(in_ptr0, out_ptr0, xnumel: tl.constexpr, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, xmask, other=0)
    tl.store(out_ptr0 + xindex, tl.exp(tmp0) / tl.sum(tl.exp(tmp0), 0), xmask)
"""


def _set_triton_up() -> None:
    """Compile a small kernel (and keep nothing): what a process's first compilation sets up."""
    import_triton()
    path = os.path.join(config.cache_dir, "triton", "warm_up.py")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_whole(path, WARM_UP_KERNEL)
    fn = _KernelModule(path, "warm_up").jit_fn("warm_up")
    _compile_ahead(fn, [torch.float32, torch.float32], {"xnumel": 1000, "XBLOCK": 1024, "num_warps": 4})


_TOGETHER = threading.local()


@contextlib.contextmanager
def compiling_together(gpu: bool = False):
    """Inside it, compile_all leaves its workers compiling and returns: the process goes on to
    the next graph (a training step's backward is lowered while its forward's kernels
    compile). The workers are waited for at its end, before anything compiled inside it
    launches. `gpu`: the graphs are a GPU's, so a compile server (_CompileServer) is started
    first, to fork the workers warm."""
    if getattr(_TOGETHER, "children", None) is not None:      # (already inside one)
        yield
        return
    _TOGETHER.children = []
    _TOGETHER.server = _CompileServer.take() if gpu and _compiles_ahead() else None
    try:
        yield
    finally:
        children, _TOGETHER.children = _TOGETHER.children, None
        server, _TOGETHER.server = _TOGETHER.server, None
        if server is not None:
            server.close()
            _CompileServer.leave_one_started()
        _wait_for(children, deadline=300.0)


def _compiles_ahead() -> bool:
    """Whether compile_all forks workers here: Triton compiles for a GPU, the system forks."""
    return (hasattr(os, "fork") and config.compile_workers > 1 and (os.cpu_count() or 1) > 1
            and os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()
            and _static_launcher() is not None and bool(_toolchain()))


def _wait_for(children: list, deadline: float) -> None:
    """Wait for the worker processes; any still running after `deadline` seconds is stopped
    (its kernels are then compiled at their first launch)."""
    import signal
    import time
    with metrics.timed("kernel compile"):
        start, running = time.monotonic(), set(children)
        while running:
            for pid in list(running):
                if os.waitpid(pid, os.WNOHANG)[0] != 0:
                    running.discard(pid)
            if running and time.monotonic() - start > deadline:
                for pid in running:
                    try:                     # the worker and the workers it forked
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:          # (not a group's leader)
                        os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                return
            if running:
                time.sleep(0.005)


@functools.lru_cache(None)
def _gpu_target():
    """The GPU Triton compiles for, from PyTorch (asking Triton's driver instead would build
    its CUDA helper module with gcc, which only Triton's own launcher needs)."""
    from triton.backends.compiler import GPUTarget
    major, minor = torch.cuda.get_device_capability(torch._C._cuda_getDevice())
    return GPUTarget("cuda", major * 10 + minor, 32)


def _compile_ahead(fn, args, settings):
    """Compile the @triton.jit function `fn` for `args` (tensors, or dtypes for 16-byte-aligned
    pointers) and launch `settings`, without launching it. Triton's own binder decides the
    specialization, exactly as its `warmup` does; the GPU target comes from PyTorch, as
    Inductor passes it. Triton versions without these pieces, and ROCm, use `warmup`."""
    try:
        from triton import knobs
        from triton.compiler import ASTSource, compile, make_backend
        from triton.runtime.jit import MockTensor, create_function_from_signature
        fn._pack_args, knobs.compilation.instrumentation_mode
        supported = not torch.version.hip
    except (ImportError, AttributeError):
        supported = False
    if not supported:
        return fn.warmup(*args, grid=(1,), **settings)
    target = _gpu_target()
    backend = make_backend(target)
    kwargs = {**EAGER_MATH, **settings, "debug": settings.get("debug", fn.debug) or knobs.runtime.debug,
              "instrumentation_mode": knobs.compilation.instrumentation_mode}     # as its run() does
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*map(MockTensor.wrap_dtype, args), **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    source = ASTSource(fn, signature, constexprs, attrs)
    compilation = knobs.compilation
    if compilation.override or compilation.dump_ir or compilation.listener:
        return compile(source, target=target, options=options.__dict__)   # what they hook is there
    return _run_stages(source, backend, target, options)


def _run_stages(source, backend, target, options):
    """Triton's compiler pipeline, Python AST -> TTIR -> TTGIR -> LLVM IR -> PTX -> cubin, one
    stage after another as `triton.compile` runs it, minus its on-disk cache. That cache's
    key starts with a hash of Triton's own sources and its 400 MB library: a third of a
    second, before the first kernel of every new process can start compiling. minicompile
    keeps the binaries it needs itself (keyed by the source, the specialization and the
    Triton build), so it would only ever miss there. Hands back what `_save_binary` reads of
    a Triton CompiledKernel: metadata, asm and src."""
    from types import SimpleNamespace

    from triton._C.libtriton import ir
    stages = {}
    backend.add_stages(stages, options, source.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                            backend.get_module_map(), context)
    metadata = {"target": target, **options.__dict__}     # each stage adds what it learns
    for stage in list(stages.values())[list(stages).index(source.ext):]:
        module = stage(module, metadata)
    return SimpleNamespace(metadata=SimpleNamespace(**metadata), asm={"cubin": module}, src=source)


def _spec_key(pointers: tuple, sizes: tuple) -> tuple:
    """What Triton compiles a kernel for, beyond its fixed launch settings: each pointer's
    dtype and whether it is 16-byte aligned, and whether each integer given at launch (a
    dynamic size) is 1, a multiple of 16, and fits in 32 bits. (The source alone does not say: a
    kernel without casts reads float32 and float64 with the same text.)"""
    return pointers, tuple([(v == 1, v % 16 == 0, -2**31 <= v < 2**31) for v in sizes if type(v) is int])


# ---------------------------------------------------------------------------------------
# max-autotune: each kernel's launch settings chosen by timing candidates
# ---------------------------------------------------------------------------------------
def _candidates(launch: dict) -> list[dict]:
    """Launch settings to try for one kernel: its own first, then its neighbours, settings that
    leave its code as it is: half and twice its block, by half and twice its warps (a
    persistent reduction keeps its RBLOCK, the whole row; a looped one tries other RBLOCKs).
    The code's own choice is near the best, and each candidate is one more compile, so the
    search stays near it: at most nine settings a kernel."""
    xnumel, warps = launch["xnumel"], launch["num_warps"]
    if "RBLOCK" not in launch:
        blocks = _near(launch["XBLOCK"], 128, min(2048, max(128, _next_pow2(xnumel))))
        tried = [{"XBLOCK": b, "num_warps": w} for b in blocks for w in _near(warps, 2, 8) if b // w >= 16]
    elif launch["RBLOCK"] >= launch["rnumel"]:              # persistent: rows held whole
        rblock = launch["RBLOCK"]
        blocks = _near(launch["XBLOCK"], 1, min(32, _next_pow2(xnumel)))
        tried = [{"XBLOCK": b, "num_warps": w} for b in blocks for w in _near(warps, 2, 16)
                 if b * rblock <= 16384 and b * rblock >= 32 * w]
    else:                                                   # looped rows
        tried = [{"RBLOCK": r, "num_warps": w} for r in _near(launch["RBLOCK"], 512, 4096)
                 for w in _near(warps, 4, 16)]
    mine = {k: launch[k] for k in ("XBLOCK", "RBLOCK", "num_warps") if k in launch}
    out = [dict(launch)]
    for c in tried:
        candidate = {**launch, **c}
        if {k: candidate[k] for k in mine} != mine:
            candidate["grid"] = _grid(xnumel, candidate["XBLOCK"])
            out.append(candidate)
    return out


def _near(value: int, low: int, high: int) -> list[int]:
    """value, half of it and twice it, those within [low, high] (value itself always)."""
    return sorted({value} | {v for v in (value // 2, value * 2) if low <= v <= high})


def time_launch(launcher, args, launch) -> float:
    """GPU time of one launch in ms (time_calls)."""
    settings = {k: v for k, v in launch.items() if k != "grid"}
    run = launcher[(launch["grid"],)]
    return time_calls(lambda: run(*args, **settings))


def time_calls(call, calls: int = 10, blocks: int = 5) -> float:
    """GPU time of one call in ms: the median over `blocks` of `calls` calls queued back to
    back between two CUDA events, after a warm-up call. (Events around one call of a short
    kernel would time the host's launch too: the GPU waits for it after the first event.)"""
    call()
    times = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def stand_in(buf, device) -> torch.Tensor:
    """A tensor laid out as buffer `buf` (an input, or a computed buffer with its strides):
    floats random, integers 0."""
    stride = getattr(buf, "stride", None)
    if stride is None:
        stride = getattr(getattr(buf, "data", None), "stride", None)
    shape = list(buf.shape) or [1]
    t = torch.empty_strided(shape, list(stride) if stride else torch.empty(shape, device="meta").stride(),
                            dtype=buf.dtype, device=device)
    return t.normal_() if t.is_floating_point() else t.zero_()


def autotune(source: str, meta: dict, buffers: dict, device: torch.device, log) -> None:
    """mode="max-autotune" on a GPU: each kernel of static sizes is launched with every
    candidate setting (`_candidates`) on buffers of its arguments' sizes (floats random,
    integers 0, so indices stay in range), and `meta` takes the fastest. Choices are kept on
    disk by the kernel's code, settings and GPU, so a later compile times nothing. A kernel
    whose tuning fails keeps its settings (and the log says why)."""
    directory = os.path.join(config.cache_dir, "autotune")
    os.makedirs(directory, exist_ok=True)
    gpu = torch.cuda.get_device_name(device)
    tuning = {}                  # kernel -> (where its choice is kept, its candidates' launchers)
    for name, (args, launch, function) in list(meta.items()):
        if any(isinstance(v, str) for k, v in launch.items() if k != "grid") or "xnumel" not in launch:
            continue                              # dynamic sizes: one setting for every size
        key = hashlib.sha256(repr((source, function, sorted(launch.items()), gpu)).encode()).hexdigest()[:24]
        path = os.path.join(directory, f"{key}.json")
        if os.path.exists(path):
            with open(path) as f:
                chosen = json.load(f)
            meta[name] = (args, chosen, function)
            continue
        tuning[name] = (path, [(load(source, {name: (args, c, function)})[name], c) for c in _candidates(launch)])
    # every candidate of every kernel compiled at once (in worker processes), then timed
    compile_all([(launcher, [buffers[a].dtype for a in meta[name][0]], c)
                 for name, (_, candidates) in tuning.items() for launcher, c in candidates], wait=True)
    for name, (path, candidates) in tuning.items():
        args, launch, function = meta[name]
        try:
            tensors = [stand_in(buffers[a], device) for a in args]
            timed = [(time_launch(launcher, tensors, c), c) for launcher, c in candidates]
        except Exception as err:                  # noqa: BLE001 (keep the default settings)
            log(f"{name}: not tuned ({type(err).__name__}: {err})")
            continue
        best_ms, best = min(timed, key=lambda t: t[0])
        log(f"{name}: {len(timed)} settings timed, best {best_ms * 1e3:.1f} us "
            f"({', '.join(f'{k}={best[k]}' for k in ('XBLOCK', 'RBLOCK', 'num_warps') if k in best)}), "
            f"default {timed[0][0] * 1e3:.1f} us")
        write_whole(path, json.dumps(best))
        meta[name] = (args, best, function)


class Launcher:
    """`launcher[grid](*args, **settings)`, as a @triton.jit function is launched.

    Triton's own launch path has two costs a small model feels. Per process: its driver
    builds a CUDA helper module with gcc, a cold cache also builds a C launcher per kernel
    signature, and its cache lookup hashes its own 400 MB library first (about a second in
    all). Per call: binding and specializing the arguments in Python. So, on a GPU, the compiled
    kernel's binary (a cubin) and the few facts needed to launch it are saved next to the
    generated module, and launched with PyTorch's own static CUDA launcher (the one Inductor
    uses): a later process, or a later call, goes straight from the cubin to `cuLaunchKernel`.
    What is not on disk is compiled by `_compile_ahead`. Triton's JIT launches only on a CPU
    (its interpreter), or while a profiler has hooked Triton's launches."""

    def __init__(self, module: _KernelModule, name: str, positional: int, launch: dict):
        self.module, self.name, self.__name__ = module, name, name
        self.positional = positional       # how many arguments come by position (the buffers)
        self.fixed = _fixed_settings(launch)
        # the settings whose values come with each launch (dynamic sizes)
        self.given = tuple(k for k, v in launch.items() if k != "grid" and isinstance(v, str))
        self.binaries: dict = {}       # specialization key -> _Binary, or None: Triton launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def __reduce__(self):
        # (to a compile server: the same kernel of the same module file, nothing loaded yet)
        return _rebuilt_launcher, (self.module.path, self.module.key, self.name, self.positional, dict(self.fixed))

    def site(self) -> "LaunchSite":
        """This kernel where one launch of the wrapper calls it."""
        return LaunchSite(self)

    def launch(self, grid, args, kwargs):
        pointers = [a.data_ptr() for a in args]
        self.run(self.binary_for(args, pointers, kwargs), grid, args, pointers, kwargs)

    def binary_for(self, args, pointers, kwargs):
        """The binary for these arguments (None: launched through Triton's JIT)."""
        key = _spec_key(tuple([(a.dtype, p % 16 == 0) for a, p in zip(args, pointers)]),
                        tuple([kwargs[k] for k in self.given]) if self.given else ())
        try:
            return self.binaries[key]
        except KeyError:
            binary = self.binaries[key] = self._binary(key, args, kwargs)
            return binary

    def run(self, binary, grid, args, pointers, kwargs):
        if binary is not None and not _launch_hooks_active():
            binary.launch(grid, pointers, kwargs)
        elif os.environ.get("TRITON_INTERPRET") == "1":
            # the interpreter computes with NumPy, which warns where a GPU gives inf or NaN silently
            with np.errstate(all="ignore"):
                self.module.jit_fn(self.name)[grid](*args, **kwargs)
        else:
            self.module.jit_fn(self.name)[grid](*args, **kwargs, **EAGER_MATH)

    def binary_path(self, key) -> str | None:
        """Where this kernel's binary for `key` is saved; None when there is none (yet), or
        when kernels are not launched from binaries here."""
        if _static_launcher() is None:
            return None
        base = _binary_base(self.module.key, self.name, self.fixed, key)
        return base if os.path.exists(base + ".json") else None

    def compile(self, args, settings, key) -> str | None:
        """Compile (without launching) for `args` (tensors, or dtypes for aligned pointers)
        and save the binary; the path, or None when it cannot be launched from its binary."""
        kernel = _compile_ahead(self.module.jit_fn(self.name), args, settings)
        return _save_binary(kernel, _binary_base(self.module.key, self.name, self.fixed, key))

    def _binary(self, key, args, kwargs):
        if _static_launcher() is None:
            return None
        path = self.binary_path(key) or self.compile(args, kwargs, key)
        return None if path is None else self._loaded(path, args[0].device.index)

    def load(self, key, device: int) -> None:
        """Load the binary saved for `key` onto GPU `device` ahead of the first launch that
        asks for it (nothing where there is none, or it is loaded)."""
        if key not in self.binaries:
            path = self.binary_path(key)
            if path is not None:
                self.binaries[key] = self._loaded(path, device)

    def _loaded(self, path: str, device: int):
        try:
            return _Binary(path, self.positional, device)
        except ValueError:             # parameters in an order the fast launch does not take
            return None


def _rebuilt_launcher(path: str, key: str, name: str, positional: int, fixed: dict) -> Launcher:
    return Launcher(_KernelModule(path, key), name, positional, fixed)


class LaunchSite:
    """A `Launcher` where the wrapper launches it: there its arguments' dtypes never change (the
    graph's guards hold them), so a launch looks its binary up by the pointers' alignment (and
    the dynamic sizes) alone: cheaper than the dtypes' key, in Python, once per launch, and a
    small model launches over a hundred kernels per call."""

    __slots__ = ("launcher", "given", "binaries", "__name__")

    def __init__(self, launcher: Launcher):
        self.launcher, self.given, self.binaries, self.__name__ = launcher, launcher.given, {}, launcher.name

    def __getitem__(self, grid):
        # (a partial, not a lambda: one Python frame less on every launch)
        return functools.partial(self.launch, grid)

    def launch(self, grid, *args, **kwargs):
        pointers = [a.data_ptr() for a in args]
        given = self.given
        key = (tuple([p & 15 == 0 for p in pointers]), tuple([kwargs[k] for k in given])) if given \
            else tuple([p & 15 == 0 for p in pointers])
        try:
            binary = self.binaries[key]
        except KeyError:
            binary = self.binaries[key] = self.launcher.binary_for(args, pointers, kwargs)
        # Launcher.run's fast path, written here: a call less on every launch
        if binary is not None and not _launch_hooks_active():
            binary.launch(grid, pointers, kwargs)
        else:
            self.launcher.run(binary, grid, args, pointers, kwargs)


class _Binary:
    """A compiled kernel loaded from its cubin, launched by torch._C._StaticCudaLauncher."""

    def __init__(self, base: str, positional: int, device: int):
        with open(base + ".json") as f:
            facts = json.load(f)
        self.num_warps, self.shared = facts["num_warps"], facts["shared"]
        self.types = facts["types"] + "O" * facts["null_params"]
        # the cubin's parameters: pointers from positional arguments (the buffers, by index),
        # then numbers from settings given at launch (by name); recent Triton kernels end with
        # scratch pointers, passed as null
        self.buffers = [i for i, _ in facts["params"] if i < positional]
        self.settings = [name for i, name in facts["params"] if i >= positional]
        if [i for i, _ in facts["params"]][:len(self.buffers)] != self.buffers:
            raise ValueError(f"{facts['name']}: a setting comes before a buffer in its parameters")
        # every positional argument is a parameter, in order (the usual case): passed as they are
        self.every_buffer = self.buffers == list(range(positional))
        self.nulls = (None,) * facts["null_params"]
        self.device = device
        launcher = _static_launcher()
        self._launch_kernel = launcher._launch_kernel
        # (module, function, registers, spills) in recent PyTorch, (function, ...) before
        self.function = launcher._load_kernel(base + ".cubin", facts["name"], self.shared, device)[-3]

    def launch(self, grid, pointers, kwargs):
        """Launch on the device's current stream; `pointers`: the positional arguments'
        addresses. (Once per kernel and call: kept to the few steps it needs.)"""
        values = pointers if self.every_buffer else [pointers[i] for i in self.buffers]
        if self.settings:
            values = values + [kwargs[name] for name in self.settings]
        self._launch_kernel(
            self.function, grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            self.num_warps, self.shared, self.types, (*values, *self.nulls),
            torch._C._cuda_getCurrentRawStream(self.device))


# Triton's type names -> the static launcher's codes (pointers are passed as ints: "O")
_TYPE_CODES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B",
               "u16": "H", "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "fp64": "d"}


def _save_binary(kernel, base: str) -> str | None:
    """Save a Triton `CompiledKernel`'s cubin and launch facts under `base`; None (nothing
    saved) for a kernel the static launcher cannot run."""
    metadata, src = kernel.metadata, kernel.src
    if "cubin" not in kernel.asm or getattr(metadata, "num_ctas", 1) != 1:
        return None
    # recent Triton kernels take scratch-memory pointers after the user's parameters;
    # minicompile's kernels never need scratch, so they get null pointers
    null_params = 0
    for field in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(metadata, field):
            if getattr(metadata, field) > 0:
                return None
            null_params += 1
    names = src.fn.arg_names
    constants = {names.index(k) if isinstance(k, str) else k[0] if isinstance(k, tuple) else k
                 for k in getattr(src, "constants", {})}
    signature = {names.index(k) if isinstance(k, str) else k: v for k, v in src.signature.items()}
    params, types = [], ""
    for i, name in enumerate(names):       # what stays a parameter of the cubin
        ty = signature.get(i, "constexpr")
        if ty == "constexpr" or i in constants:
            continue
        code = "O" if ty.startswith("*") else _TYPE_CODES.get(ty)
        if code is None:
            return None
        params.append((i, name))
        types += code
    facts = {"name": metadata.name, "num_warps": metadata.num_warps, "shared": metadata.shared,
             "params": params, "types": types, "null_params": null_params}
    os.makedirs(os.path.dirname(base), exist_ok=True)
    for suffix, data in ((".cubin", kernel.asm["cubin"]), (".json", json.dumps(facts))):
        write_whole(base + suffix, data)    # the .json last: it says the cubin is complete
    return base


def _binary_base(module_key: str, name: str, fixed: tuple, key) -> str:
    """A binary depends on the source, the constants it is launched with, the specialization,
    the compile options, the GPU and the compiler versions."""
    text = repr((module_key, name, fixed, key, EAGER_MATH, _toolchain()))
    return os.path.join(config.cache_dir, "triton", "bin", hashlib.sha256(text.encode()).hexdigest()[:32])


@functools.lru_cache(None)
def _toolchain() -> tuple:
    """What a binary is built with: Triton (its version, and the size and time of its compiler
    library, which tell a rebuilt Triton of the same version apart), PyTorch, CUDA and the
    GPU. Found without importing Triton."""
    from importlib.metadata import version
    spec = importlib.util.find_spec("triton")
    if spec is None:            # no Triton: nothing can be compiled (import_triton says so)
        return ()
    library = sorted(p for p in glob.glob(os.path.join(spec.submodule_search_locations[0], "_C", "libtriton*"))
                     if os.path.isfile(p))
    return (version("triton"), [(os.path.getsize(p), os.path.getmtime(p)) for p in library],
            torch.__version__, torch.version.cuda,
            torch.cuda.get_device_capability(torch._C._cuda_getDevice()))


@functools.lru_cache(None)
def _static_launcher():
    """PyTorch's static CUDA launcher, or None: on a CPU, under Triton's interpreter, or with
    a PyTorch built without it (Triton's own launch path is used then)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return None
    return getattr(torch._C, "_StaticCudaLauncher", None)


def _launch_hooks_active() -> bool:
    """Whether a profiler has hooked Triton's launches (they would miss a static launch).
    Checked on every launch: a hook is None, a function, or (recent Triton) a chain of calls,
    empty unless hooked."""
    runtime = _RUNTIME_KNOBS or _triton_runtime_knobs()
    if runtime is None:
        return False
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _triton_runtime_knobs():
    """Triton's runtime settings (where profilers hook launches), once Triton is imported."""
    global _RUNTIME_KNOBS
    if _RUNTIME_KNOBS is None:
        triton = sys.modules.get("triton")
        if triton is not None and hasattr(triton, "knobs"):
            _RUNTIME_KNOBS = triton.knobs.runtime
    return _RUNTIME_KNOBS


_RUNTIME_KNOBS = None
