"""C++ code generation for CPU tensors: one C++ function per fused kernel.

Takes fusion `Kernel`s; hands the wrapper callables loaded from a shared library.

Shape of a kernel: OpenMP splits the outer loops across cores (`#pragma omp parallel for`),
the innermost loop is written so the compiler vectorizes it (`#pragma omp simd`); half
precision is loaded into float and rounded once when stored. The kernels of a graph are split into
one translation unit per core, compiled at the same time by the system's C++ compiler, loaded
with ctypes (no Python build step), and cached on disk by the hash of the source and the
compiler command.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch

from .. import config, ir, metrics
from ..fusion.kernels import ComboKernel
from ..ir import Index, use_ops
from .common import (SCALAR, SYMBOL, KernelWriter, defined_once, plan_loops, reduction_identity, scalars_in,
                     size_symbols_in)

CTYPES = {torch.float32: "float", torch.float64: "double", torch.float16: "_Float16",
          torch.bfloat16: "mc_bf16", torch.int64: "int64_t", torch.int32: "int32_t",
          torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool"}

# The source that precedes a graph's kernels (`prelude`): the pragma for half precision where a
# kernel uses it (before the headers, so their functions and the kernels share one target), the
# headers every kernel needs, and of the helpers only those a kernel, or a helper it keeps, names.
HALF_PRAGMA = r"""
// GCC 12 keeps _Float16 values in excess precision where the CPU has AVX512-FP16 arithmetic,
// dropping the float -> _Float16 -> float round trips that round each op's result as eager
// does; without those instructions it must convert (and still vectorizes the conversions).
#if defined(__AVX512FP16__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("no-avx512fp16")
#endif
"""

PRELUDE_HEADER = r"""
// glibc declares the vector versions of exp, log, tanh, erf... (libmvec) only under fast-math.
// We want those declarations (so loops calling them vectorize) without fast-math's semantics
// (NaN and infinity must behave as in PyTorch), so we ask for the declarations alone.
#if defined(__linux__) && !defined(__FAST_MATH__)
#define __FAST_MATH__ 1
#endif
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <type_traits>
"""

HELPERS = [      # (the names a piece defines, its source), in the order they are emitted
    (('mc_wide',), r"""
// Arithmetic in the operands' own type, as PyTorch computes it. C++ widens bool, int8, uint8
// and int16 operands to int, so uint8 3 - 5 would stay -2 where PyTorch has 254 (and a later
// comparison, cast or sum would see -2); and overflow of int32 and int64 is undefined. So
// integers are added, subtracted and multiplied as unsigned numbers at least as wide as int
// (which wrap) and converted back to their type: every result wraps as PyTorch's does.
// bool + bool is then bool (logical or), bool * bool logical and, as in PyTorch.
template <typename T> using mc_wide = std::make_unsigned_t<std::common_type_t<T, int>>;
"""),
    (('mc_add', 'mc_sub', 'mc_mul'), r"""
#define MC_WRAPPING(name, op)                                                              \
    template <typename A, typename B> static inline std::common_type_t<A, B> name(A a, B b) { \
        using T = std::common_type_t<A, B>;                                                \
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)                   \
            return static_cast<T>(static_cast<mc_wide<T>>(a) op static_cast<mc_wide<T>>(b)); \
        else                                                                               \
            return static_cast<T>(a op b);                                                 \
    }
MC_WRAPPING(mc_add, +)
MC_WRAPPING(mc_sub, -)
MC_WRAPPING(mc_mul, *)
"""),
    (('mc_neg',), r"""
template <typename T> static inline T mc_neg(T a) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(mc_wide<T>(0) - static_cast<mc_wide<T>>(a));
    else return -a;
}
"""),
    (('mc_abs',), r"""
template <typename T> static inline T mc_abs(T a) {
    if constexpr (std::is_integral_v<T>) return a < T(0) ? mc_neg(a) : a;
    else return std::abs(a);
}
"""),
    (('mc_to_int',), r"""
// A float to an integer type: NaN and a value past the type's range give its lowest value, as
// x86's conversion (eager's kernels) does at run time. C++ leaves that case undefined, and GCC
// folds a constant one otherwise (a NaN to 0, 1e20 to the highest value), or a float made
// int and float again into trunc(x) whatever its size.
template <typename I, typename F> static inline I mc_to_int(F v) {
    const double d = static_cast<double>(v), lowest = static_cast<double>(std::numeric_limits<I>::min());
    return d >= lowest && d < -lowest ? static_cast<I>(d) : std::numeric_limits<I>::min();
}
"""),
    (('mc_floor',), r"""
// floor and ceil of an integer are the integer (std::floor would make it a double)
template <typename T> static inline T mc_floor(T a) {
    if constexpr (std::is_integral_v<T>) return a; else return std::floor(a);
}
"""),
    (('mc_ceil',), r"""
template <typename T> static inline T mc_ceil(T a) {
    if constexpr (std::is_integral_v<T>) return a; else return std::ceil(a);
}
"""),
    (('mc_bf16',), r"""
// bfloat16 (GCC 12 has no arithmetic type for it): the upper half of a float's bits, made
// from a float by rounding to nearest even as PyTorch's c10::BFloat16 does (a NaN stays a
// NaN). Kernels load it as float and store it rounded, as they do float16.
struct mc_bf16 {
    uint16_t bits;
    mc_bf16() = default;
    mc_bf16(float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        bits = f != f ? uint16_t(0x7FC0) : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    operator float() const {
        uint32_t u = static_cast<uint32_t>(bits) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};
"""),
    (('mc_max', 'mc_min'), r"""
// NaN-propagating helpers, as PyTorch's maximum/minimum/relu behave; of two equal values the
// first, as its clamp keeps x where x == bound (clamp(-0.0, min=0.0) is -0.0). Two selects,
// not one select on `b != b || b > a`: GCC does not vectorize a loop calling the latter (max
// pooling). (Of two types, as mc_add: a value a kernel carries in double, a layer norm's
// statistics, and a float constant.)
template <typename A, typename B, typename T = std::common_type_t<A, B>>
static inline T mc_max(A a_, B b_) { T a = a_, b = b_; T m = b > a ? b : a; return b != b ? b : m; }
template <typename A, typename B, typename T = std::common_type_t<A, B>>
static inline T mc_min(A a_, B b_) { T a = a_, b = b_; T m = b < a ? b : a; return b != b ? b : m; }
"""),
    (('mc_relu',), r"""
template <typename T> static inline T mc_relu(T a) { return a < T(0) ? T(0) : a; }
"""),
    (('mc_exp',), r"""
// exp for float, written out so the compiler vectorizes it in any loop: exp(x) = 2^k exp(r),
// k = round(x / ln 2), r = x - k ln 2 (in two parts), exp(r) by Cephes' polynomial; error
// under 2 ulp. glibc's vector expf is as fast in its range, but a lane below -87.3 (masked
// softmax's -inf, a saturated erf's tail) sends the whole vector to a scalar path, ten times
// slower, and the compiler may call it on a value before clamping it. From -87.34 down to
// -103.97 the result is subnormal, as PyTorch's is: 2^k as two factors keeps each one a
// normal float, and the last multiplication rounds once into the subnormal range. Below
// -104 (under half the least subnormal) the result is 0.
template <typename T> static inline T mc_exp(T a) { return std::exp(a); }
template <> inline float mc_exp<float>(float x) {
    float c = x < -104.0f ? -104.0f : (x > 88.73f ? 88.73f : x);
    float k = std::nearbyint(c * 1.44269504088896341f);
    float r = std::fma(k, 2.12194440e-4f, std::fma(k, -0.693359375f, c));
    float p = std::fma(std::fma(std::fma(std::fma(std::fma(1.9875691500e-4f, r, 1.3981999507e-3f), r,
                                                  8.3334519073e-3f), r, 4.1665795894e-2f), r,
                                1.6666665459e-1f), r, 5.0000001201e-1f);
    float y = std::fma(p, r * r, r) + 1.0f;
    int32_t ki = static_cast<int32_t>(k), k1 = ki >> 1;     // 2^k as two factors: no overflow
    int32_t b1 = (k1 + 127) << 23, b2 = (ki - k1 + 127) << 23;
    float s1, s2;
    std::memcpy(&s1, &b1, 4);
    std::memcpy(&s2, &b2, 4);
    y = y * s1 * s2;
    return x < -104.0f ? 0.0f : (x != x ? x : y);
}
"""),
    (('mc_philox',), r"""
// Random numbers made in a kernel (config.fallback_random off): Philox 4x32-10 of the counter
// (offset, 0, 0, 0) under the key (seed's low, high 32 bits), as Triton's tl.rand and
// tl.randn compute it, so C++ and Triton kernels draw the same bits. rand: the first word as
// a float in [0, 1); randn: the first two by the Box-Muller transform.
static inline void mc_philox(int64_t seed, int32_t offset, uint32_t out[4]) {
    uint32_t c0 = static_cast<uint32_t>(offset), c1 = 0, c2 = 0, c3 = 0;
    uint32_t k0 = static_cast<uint32_t>(static_cast<uint64_t>(seed)),
             k1 = static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32);
    for (int i = 0; i < 10; i++) {
        uint64_t p0 = static_cast<uint64_t>(0xCD9E8D57u) * c2, p2 = static_cast<uint64_t>(0xD2511F53u) * c0;
        uint32_t n0 = static_cast<uint32_t>(p0 >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(p2 >> 32) ^ c3 ^ k1;
        c1 = static_cast<uint32_t>(p0);
        c3 = static_cast<uint32_t>(p2);
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
"""),
    (('mc_uniform',), r"""
static inline float mc_uniform(uint32_t bits) {
    int32_t x = static_cast<int32_t>(bits);
    return static_cast<float>(x < 0 ? ~x : x) * 4.6566127342e-10f;     // ~x is -x - 1
}
"""),
    (('mc_rand',), r"""
static inline float mc_rand(int64_t seed, int32_t offset) {
    uint32_t r[4];
    mc_philox(seed, offset, r);
    return mc_uniform(r[0]);
}
"""),
    (('mc_randn',), r"""
static inline float mc_randn(int64_t seed, int32_t offset) {
    uint32_t r[4];
    mc_philox(seed, offset, r);
    float u1 = std::max(1.0e-7f, mc_uniform(r[0])), u2 = mc_uniform(r[1]);
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.283185307179586f * u2);
}
"""),
    (('mc_sigmoid',), r"""
template <typename T> static inline T mc_sigmoid(T a) { return T(1) / (T(1) + mc_exp(-a)); }
"""),
]


class KernelCompileError(RuntimeError):
    """A generated kernel failed to compile: the message names the compiler and its error.
    `generated_code`: the compiler works (it compiles an empty function with the same
    command), so the fault is in the code minicompile wrote, and the graph can run on
    PyTorch's kernels instead (graph_compiler does that); else the tool chain is at fault
    (no compiler, a bad flag), which the user must hear about."""

    def __init__(self, message: str, generated_code: bool = False):
        super().__init__(message)
        self.generated_code = generated_code


class CppWriter(KernelWriter):
    """Spells each operation in C++ (values of the compute dtype; `auto` keeps them so).

    Between the passes over one row (softmax: the sum of exp(x - max), then the division) an
    expensive value a later pass needs again is not recomputed: the first pass also stores it
    in a row-sized array on the stack (`row0[r]`), the later one loads it, as ATen's softmax
    keeps exp(x - max). `carry` is on when the kernel allows it (see kernel_source)."""

    def __init__(self, kernel, plan, buffers):
        super().__init__(kernel, plan, buffers)
        self.expanded: dict[str, str] = {}      # variable -> its expression over loads only
        self.carry = None                       # expanded expr -> [pass body, var, array]
        self.position = None                    # the element's position in its row (C text)
        self.rows: list[str] = []               # row arrays to declare

    def _emit(self, expr: str) -> str:
        if expr in self.cache:
            return self.cache[expr]
        full = _TMP.sub(lambda m: "(" + self.expanded.get(m.group(0), m.group(0)) + ")", expr)
        hit = self.carry.get(full) if self.carry is not None else None
        if hit is not None and hit[0] is not self.lines:         # computed in an earlier pass
            if hit[2] is None:
                hit[2] = f"row{len(self.rows)}"
                self.rows.append(hit[2])
                hit[0].append(f"{hit[2]}[{self.position}] = {hit[1]};")
            var = super()._emit(f"{hit[2]}[{self.position}]")
            self.cache[expr] = var
            self.expanded[var] = full
            return var
        var = super()._emit(expr)
        self.expanded[var] = full
        if self.carry is not None and _EXPENSIVE.search(expr):
            self.carry.setdefault(full, [self.lines, var, None])
        return var

    OPS = {
        "add": "mc_add({0}, {1})", "sub": "mc_sub({0}, {1})", "mul": "mc_mul({0}, {1})",
        "truediv": "({0} / {1})", "pow": "std::pow({0}, {1})",
        "maximum": "mc_max({0}, {1})", "minimum": "mc_min({0}, {1})",
        "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
        "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "({0} && {1})",
        "logical_or": "({0} || {1})", "logical_not": "(!{0})", "neg": "mc_neg({0})",
        "neg_float": "(-{0})",
        "opaque": "{0}", "abs": "mc_abs({0})", "relu": "mc_relu({0})", "exp": "mc_exp({0})", "log": "std::log({0})",
        "sqrt": "std::sqrt({0})", "rsqrt": "(1 / std::sqrt({0}))", "sin": "std::sin({0})",
        "cos": "std::cos({0})", "tanh": "std::tanh({0})", "sigmoid": "mc_sigmoid({0})",
        "erf": "std::erf({0})", "reciprocal": "(1 / {0})", "floor": "mc_floor({0})",
        "ceil": "mc_ceil({0})", "isnan": "({0} != {0})", "where": "({0} ? {1} : {2})",
        "rand": "mc_rand({0}, {1})", "randn": "mc_randn({0}, {1})",
    }

    def assign(self, var, expr):
        return f"auto {var} = {expr};"

    def load_expr(self, name, index, dtype):
        value = f"{self.arg_name(name)}[{index.render('/')}]"
        cd = ir.compute_dtype(dtype)
        value = f"static_cast<{ctype(cd)}>({value})" if cd != dtype else value
        if self.load_mask is not None:      # the ternary reads memory only where the mask holds
            value = f"({self.load_mask} ? {value} : {self.constant_expr(0, cd)})"
        return value

    def index_value_expr(self, index, dtype):
        return f"static_cast<{ctype(dtype)}>({index.render('/')})"

    def index_assign(self, var, value):
        return f"int64_t {var} = static_cast<int64_t>({value});"

    def index_check(self, var, value, size, error):
        report = f"__atomic_store_n({ir.INDEX_ERRORS}, {error}, __ATOMIC_RELAXED);"
        if self.load_mask is not None:
            report = f"if ({self.load_mask}) {report}"
        return [self.index_assign(var, value),
                f"if ({var} < 0 || {var} >= {size}) {{ {report} {var} = 0; }}"]

    def constant_expr(self, value, dtype):
        t = ctype(dtype)
        if ir.is_symbolic(value):            # a size the code is generic in (C's / floors it)
            return f"static_cast<{t}>({self.render_size(value)})"
        if not dtype.is_floating_point and dtype != torch.bool and value == torch.iinfo(dtype).min:
            return f"std::numeric_limits<{t}>::min()"      # (its literal's magnitude overflows)
        if isinstance(value, float) and math.isinf(value):
            return f"(-std::numeric_limits<{t}>::infinity())" if value < 0 else f"std::numeric_limits<{t}>::infinity()"
        if isinstance(value, float) and math.isnan(value):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if dtype == torch.bool:
            return "true" if value else "false"
        if isinstance(value, bool):          # a Python bool in arithmetic: 1 or 0
            value = int(value)
        return f"static_cast<{t}>({value!r})"

    def cast_expr(self, x, dtype):
        return f"static_cast<{ctype(dtype)}>({x})"

    def convert_expr(self, x, dtype, src_dtype):
        t = ctype(dtype)
        if src_dtype is not None and dtype.is_floating_point and not src_dtype.is_floating_point:
            # through double: GCC (-fno-trapping-math) folds float(int(x)) into trunc(x), -0.0
            # for x in (-1, 0), where the types on both sides match. Exact for 32-bit integers;
            # an int64 past 2**53 would be rounded twice, and is converted straight (no trunc()
            # of a float that large differs from it)
            via_double = f"static_cast<{t}>(static_cast<double>({x}))"
            if src_dtype.itemsize < 8:
                return via_double
            size = f"std::abs({x})" if src_dtype.is_signed else x
            return f"({size} <= (int64_t(1) << 53) ? {via_double} : static_cast<{t}>({x}))"
        if src_dtype is not None and src_dtype.is_floating_point and dtype in (torch.int8, torch.uint8, torch.int16):
            # through a wider integer, as eager's conversion wraps (300.0 -> int8 44): int32 for
            # the signed ones (3e9 -> int16 0, as x86's 32-bit conversion gives eager's), int64
            # for uint8
            wide = "int64_t" if dtype == torch.uint8 else "int32_t"
            return f"static_cast<{t}>(mc_to_int<{wide}>({x}))"
        if src_dtype is not None and src_dtype.is_floating_point and dtype in (torch.int32, torch.int64):
            return f"mc_to_int<{t}>({x})"
        return self.cast_expr(x, dtype)

    def render_size(self, size):
        return ir.render_size(size, "/")


_TMP = re.compile(r"\btmp\d+\b")
_EXPENSIVE = re.compile(r"mc_exp\(|mc_sigmoid\(|std::(log|tanh|sqrt|sin|cos|erf|pow)\(")
CARRY_LIMIT = 16384         # row length up to which carried values live in stack arrays


def ctype(dtype: torch.dtype) -> str:
    t = CTYPES.get(dtype)
    if t is None:
        raise NotImplementedError(f"no C++ kernels for {dtype} yet")
    return t


REDUCE = {  # reduction type -> (combine statement, OpenMP reduction operator)
    "sum": ("{acc} = mc_add({acc}, {v});", "+"), "mean": ("{acc} = mc_add({acc}, {v});", "+"),
    "prod": ("{acc} = mc_mul({acc}, {v});", "*"),
    "max": ("{acc} = {v} > {acc} ? {v} : {acc}; {nan} |= ({v} != {v});", "max"),
    "min": ("{acc} = {v} < {acc} ? {v} : {acc}; {nan} |= ({v} != {v});", "min"),
    # keep the first NaN, else take a NaN, else a strictly better value (ties keep the first)
    "argmax": ("if ({acc} == {acc} && ({v} != {v} || {v} > {acc})) {{ {acc} = {v}; {idx} = {r}; }}", None),
    "argmin": ("if ({acc} == {acc} && ({v} != {v} || {v} < {acc})) {{ {acc} = {v}; {idx} = {r}; }}", None),
}


def accumulator_type(comp: ir.Reduction) -> str:
    """The C type a reduction accumulates in. A float32 sum or mean adds in double: added in
    float one by one (per vector lane), a long row loses digits that PyTorch's cascade
    summation keeps (the mean of a million values near 1e20 was off in the fifth digit).
    Its result is rounded to float once, at the end."""
    if comp.reduction_type in ("sum", "mean") and comp.src_dtype == torch.float32:
        return "double"
    return ctype(comp.src_dtype)


def _finish(comp: ir.Reduction, acc: str, nan: str, writer) -> str:
    """A sum, mean, max or min's result from its accumulator (and NaN flag), in src_dtype."""
    acc_t, src_t = accumulator_type(comp), ctype(comp.src_dtype)
    result = acc
    if comp.reduction_type == "mean":
        result = f"({acc} / static_cast<{acc_t}>({writer.render_size(comp.rnumel())}))"
    if acc_t != src_t:
        result = f"static_cast<{src_t}>({result})"
    if comp.reduction_type in ("max", "min") and comp.src_dtype.is_floating_point:
        result = f"({nan} ? std::numeric_limits<{src_t}>::quiet_NaN() : {result})"
    return result


def kernel_source(kernel, buffers: dict[str, ir.IRNode]) -> tuple[str, list[str]]:
    """C++ source of one kernel, and the names of the buffers it takes (inputs, then outputs).

    Shape: the x loops run in parallel (OpenMP); inside, each member in order: a reduction is
    an inner r loop into an accumulator, a pointwise member over whole rows is an inner r loop
    that stores, a per-row value is a few scalar lines. Without r loops (a pointwise kernel)
    all members share the innermost x loop, which the compiler vectorizes. A lone reduction
    whose input is contiguous across rows, not along them, vectorizes across rows instead
    (`_across_rows`)."""
    plan = plan_loops(kernel)
    writer = CppWriter(kernel, plan, buffers)
    x_idx, r_idx = writer.canonical
    xs = list(zip(plan.x_vars, plan.x_sizes))
    rs = list(zip(plan.r_vars, plan.r_sizes))
    numel = ir.size_expr(math.prod(plan.x_sizes) * math.prod(plan.r_sizes))
    # the row-major position of the current element in its row (what argmax/argmin return)
    position = plan.apply(ir.flat_index(r_idx, ir.contiguous_strides(kernel.r_sizes)))
    parallel_if = f"if({writer.render_size(numel)} >= 32768)"

    def store(member, value) -> str:
        name = member.box.name
        index = writer.store_index(member)
        return f"{writer.out_name(name)}[{index.render('/')}] = static_cast<{ctype(member.box.dtype)}>({value});"

    with use_ops(writer):
        if not kernel.r_sizes:                       # pointwise: one loop nest, every member inside
            for m in kernel.members:
                value = m.run(x_idx, r_idx)
                if m.box.name in kernel.stored:
                    writer.lines.append(store(m, value))
            if len(xs) <= 1:
                body = _nest(xs, writer.lines, innermost_pragma=f"#pragma omp parallel for simd {parallel_if}")
            else:
                inner_loop = _nest(xs[-1:], writer.lines, innermost_pragma="#pragma omp simd")
                body = _nest(xs[:-1], inner_loop, outer_pragma=f"#pragma omp parallel for {parallel_if}",
                             collapse=True)
        elif _across_rows_fits(kernel, plan, writer, buffers):
            body = _across_rows(writer, xs, rs, store, parallel_if)
        else:
            # Members that walk the row go into one loop (a pass) until one needs a reduction's
            # final value from the current pass (softmax's exp needs the max): then a new pass.
            # So y = f(x) stored and sum(y) share one read of x. Without x loops (one long
            # row) each pass is itself the parallel loop.
            whole_row = not xs
            current: list = []
            rnumel = ir.size_expr(math.prod(kernel.r_sizes))
            if xs and not ir.is_symbolic(rnumel) and rnumel <= CARRY_LIMIT and _all_float32(kernel, buffers):
                writer.carry, writer.position = {}, position.render("/")

            def flush():
                if current:
                    _emit_pass(writer, current, rs, store, position, parallel_if if whole_row else None)
                    current.clear()
            for k, m in enumerate(kernel.members):
                comp = m.comp
                if not isinstance(comp, ir.Reduction) and m.role != "row":      # a per-row value
                    flush()
                    # outside the passes there is no row position: a value an earlier pass
                    # computed is computed again here, not read from a row array
                    carry, writer.carry = writer.carry, None
                    value = m.run(x_idx, r_idx)
                    writer.carry = carry
                    writer.row_values[m.box.name] = value
                    if m.box.name in kernel.stored:
                        writer.lines.append(store(m, value))
                    continue
                reads = {name for name, _ in ir.reads_of(comp).loads}
                ordered = isinstance(comp, ir.Reduction) and comp.reduction_type in ir.ARG_REDUCTIONS
                if _needs_the_walk_done(reads, current) \
                        or ordered or any(isinstance(c.comp, ir.Reduction) and c.comp.reduction_type
                                          in ir.ARG_REDUCTIONS for _, c in current):
                    flush()
                current.append((k, m))
            flush()
            lines = [f"float {row}[{rnumel}];" for row in writer.rows]
            for line in writer.lines:                     # the passes' loops, now complete
                lines += _nest(*line.nest_args, **line.nest_kwargs) if isinstance(line, _Loop) else [line]
            body = _nest(xs, lines, outer_pragma=f"#pragma omp parallel for {parallel_if}",
                         collapse=True)

    stored = [m.box for m in kernel.members if m.box.name in kernel.stored]
    # An output may be written over an input it replaces (the wrapper decides, where the input
    # is dead): a GELU over its linear layer's result, a norm over the residual it reads. Those
    # two pointers may then be equal, so neither is declared __restrict__ (a promise that they
    # never overlap); the loops still vectorize: `omp simd` says that no iteration depends on
    # another, and each element is read before it is written, at the same index.
    kernel.in_place = writer.in_place_inputs()
    overlaps = {name for over in kernel.in_place.values() for name in over}

    def qualifier(overlapping: bool) -> str:
        return "" if overlapping else " __restrict__"
    symbols = size_symbols_in("\n".join(body))          # dynamic sizes: passed as arguments
    params = [f"const {ctype(buffers[n].dtype)}*{qualifier(n in overlaps)} in_ptr{i}"
              for i, n in enumerate(writer.args)]
    params += [f"{ctype(b.dtype)}*{qualifier(bool(kernel.in_place.get(b.name)))} out_ptr{i}"
               for i, b in enumerate(stored)]
    checked = [ir.INDEX_ERRORS] if writer.checks_indices else []
    params += [f"int32_t* __restrict__ {name}" for name in checked]
    params += [f"int64_t {s}" for s in symbols]
    scalars = scalars_in("\n".join(body))             # dynamic floats, by value
    params += [f"double {s}" for s in scalars]
    lines = [f'extern "C" void {kernel.name}({", ".join(params)}) {{']
    lines += ["    " + line for line in body] + ["}"]
    return "\n".join(lines), writer.args + [b.name for b in stored] + checked + symbols + scalars


@dataclass
class _Loop:
    """A pass's loop, nested into lines when the kernel is complete."""
    nest_args: tuple
    nest_kwargs: dict


def _all_float32(kernel, buffers, also=()) -> bool:
    """Every value of the kernel is computed in float32 (what a row array holds), or in one of
    the dtypes `also` names."""
    names = {n for m in kernel.members for n, _ in ir.reads_of(m.comp).loads}
    dtypes = [m.box.dtype for m in kernel.members] + [buffers[n].dtype for n in names if n in buffers]
    dtypes += [m.comp.src_dtype for m in kernel.members if isinstance(m.comp, ir.Reduction)]
    return all(ir.compute_dtype(d) in (torch.float32, *also) for d in dtypes)


def _across_rows_fits(kernel, plan, writer, buffers) -> bool:
    """Float32 (or float64: a variance's passes) sums/means/maxes/mins of the same rows, and
    nothing else, whose every input that varies along the row is contiguous along the
    innermost row (x) loop: a mean over H and W of a channels-last (N, C, H, W) tensor, whose
    rows (n, c) are side by side in memory and whose row elements are C apart; batch norm's
    statistics of such a tensor (its variance's sum of squared deviations reads the mean); the
    column sums of an (R, N) gradient that give a bias its gradient, or a layer norm's weight
    its gradient (with the norm's mean and rstd per row, one value across all columns). With
    outer x loops, those run in parallel and the innermost must be short."""
    if not plan.x_sizes or not plan.r_sizes:
        return False
    inner = plan.x_sizes[-1]
    if ir.is_symbolic(inner) or (len(plan.x_sizes) > 1 and inner > CARRY_LIMIT) \
            or not _all_float32(kernel, buffers, also=(torch.float64,)):
        return False
    reductions = [m for m in kernel.members if isinstance(m.comp, ir.Reduction)]
    if not reductions or any(m.comp.reduction_type not in ("sum", "mean", "max", "min") for m in reductions) \
            or any(m.role == "row" for m in kernel.members if m not in reductions):
        return False          # (besides reductions, only values per row: a variance from its sum)
    rec = ir.RecordingOps()
    with use_ops(rec):
        for m in kernel.members:
            m.run(*writer.canonical)
    # (a member may read an earlier one's result, one value per row: a later walk of the rows)
    members = kernel.member_names()
    loads = [plan.apply(index.simplify(writer.ranges)) for name, index in rec.loads if name not in members]
    along = [i for i in loads if any(i.coeff(r) != 0 for r in plan.r_vars)]
    # each of those contiguous across the rows, or one value for all of them (a layer norm's
    # mean and rstd per token, in its weight's gradient: the same in every lane)
    across = [i for i in along if i.is_linear() and i.coeff(plan.x_vars[-1]) == 1]
    shared = [i for i in along if i.is_linear() and i.coeff(plan.x_vars[-1]) == 0]
    return bool(across) and not rec.indirect and len(across) + len(shared) == len(along)


ACROSS_BLOCK = 128          # columns per parallel block when a lone x loop is cut into blocks
ACROSS_CHUNKS = 8           # parallel pieces of the rows of a lone short x loop


def _across_rows(writer, xs, rs, store, parallel_if) -> list[str]:
    """Loops of reductions vectorized across rows: for each outer row group (in parallel),
    the r loops outside and the innermost x loop inside, accumulating one array element per
    row and reduction (vector loads along x); then each row's results are stored. A lone x
    loop runs in blocks of ACROSS_BLOCK rows, in parallel; a lone short one (batch norm's
    channels) has its rows' elements cut into ACROSS_CHUNKS chunks instead, reduced in
    parallel and then combined in chunk order (the same result on any number of cores).
    A reduction that reads an earlier one's result (the squared deviations from a mean) walks
    the rows again after it, reading that result from an array of one value per row; a value
    per row (a variance from its sum of squared deviations) is computed after the walk whose
    results it reads."""
    (xi, n), outer = xs[-1], xs[:-1]
    blocked = not outer and n > ACROSS_BLOCK
    width, lo, hi = (ACROSS_BLOCK, f"{xi}_lo", f"{xi}_hi") if blocked else (n, "0", n)
    at = f"{xi} - {lo}" if blocked else xi

    def over_x(body):
        return ["#pragma omp simd", f"for (int64_t {xi} = {lo}; {xi} < {hi}; {xi}++) {{",
                *["    " + line for line in body], "}"]
    reads = {m.box.name: {name for name, _ in ir.reads_of(m.comp).loads} for m in writer.kernel.members}
    grouped = _walks(list(enumerate(writer.kernel.members)), reads)
    walk_of = {m.box.name: w for w, walk in enumerate(grouped) for _, m in walk}
    read_later = {name for w, walk in enumerate(grouped) for _, m in walk
                  for name in reads[m.box.name] if walk_of.get(name, w) < w}
    results, walks = [], []             # arrays of the results later walks read; each walk's lines
    for walk in grouped:
        decls, inits, parts, combine = [], [], [], []
        with writer.scope() as body:
            for k, member in walk:
                comp = member.comp
                if not isinstance(comp, ir.Reduction):
                    continue            # a value per row: once the walk is done
                acc, nan = f"acc{k}[{at}]", f"nan{k}[{at}]"
                reduce = REDUCE[comp.reduction_type][0]
                body.append(reduce.format(acc=acc, v=member.run(*writer.canonical), nan=nan))
                init = writer.constant_expr(reduction_identity(comp.reduction_type, comp.src_dtype), comp.src_dtype)
                decls += [f"{accumulator_type(comp)} acc{k}[{width}];", f"int nan{k}[{width}];"]
                inits += [f"{acc} = {init};", f"{nan} = 0;"]
                part, part_nan = f"part{k}[chunk][{xi}]", f"part_nan{k}[chunk][{xi}]"
                parts.append((f"{accumulator_type(comp)} part{k}[{ACROSS_CHUNKS}][{n}];",
                              f"int part_nan{k}[{ACROSS_CHUNKS}][{n}];", f"{part} = {acc}; {part_nan} = {nan};"))
                combine.append(reduce.format(acc=acc, v=part, nan=nan) + f" {nan} |= {part_nan};")
        with writer.scope() as finals:
            for k, member in walk:
                if isinstance(member.comp, ir.Reduction):
                    result = _finish(member.comp, f"acc{k}[{at}]", f"nan{k}[{at}]", writer)
                    result = writer.rounded_as_stored(writer._emit(result), member.box.dtype)
                else:
                    result = member.run(*writer.canonical)
                writer.row_values[member.box.name] = result
                if member.box.name in read_later:
                    results.append(f"{ctype(ir.compute_dtype(member.box.dtype))} result{k}[{width}];")
                    finals.append(f"result{k}[{at}] = {result};")
                if member.box.name in writer.kernel.stored:
                    finals.append(store(member, result))
        for k, member in walk:          # later walks read a result from its array
            if member.box.name in read_later:
                writer.row_values[member.box.name] = f"result{k}[{at}]"
        if blocked or outer:
            walks.append([*decls, *over_x(inits), *_nest(rs, over_x(body)), *over_x(finals)])
            continue
        (r, size), inner = rs[0], rs[1:]
        size = ir.render_size(size, "/")
        chunk = [*decls, *over_x(inits),
                 f"for (int64_t {r} = ({size}) * chunk / {ACROSS_CHUNKS}; {r} < ({size}) * (chunk + 1) / {ACROSS_CHUNKS}; "
                 f"{r}++) {{",
                 *["    " + line for line in _nest(inner, over_x(body))], "}",
                 *over_x([p[2] for p in parts])]
        walks.append([*[line for p in parts for line in p[:2]],
                      *_nest([("chunk", ACROSS_CHUNKS)], chunk, outer_pragma=f"#pragma omp parallel for {parallel_if}"),
                      *decls, *over_x(inits), *_nest([("chunk", ACROSS_CHUNKS)], over_x(combine)), *over_x(finals)])
    lines = [*results, *(line for walk in walks for line in walk)]
    if blocked:
        blocks = -(-n // ACROSS_BLOCK)
        lines.insert(0, f"int64_t {lo} = {ACROSS_BLOCK} * {xi}_block, {hi} = std::min<int64_t>({lo} + {ACROSS_BLOCK}, {n});")
        return _nest([(f"{xi}_block", blocks)], lines, outer_pragma=f"#pragma omp parallel for {parallel_if}")
    if outer:
        return _nest(outer, lines, outer_pragma=f"#pragma omp parallel for {parallel_if}", collapse=True)
    return lines


def _walks(members: list, reads: dict) -> list[list]:
    """Consecutive (k, member) pairs cut where a reduction reads (`reads`: member name -> the
    names it loads) the result of a member before it in the same group: each group is one walk
    of the rows (its values per row follow it)."""
    walks: list[list] = [[]]
    for k, member in members:
        if isinstance(member.comp, ir.Reduction) and _needs_the_walk_done(reads[member.box.name], walks[-1]):
            walks.append([])
        walks[-1].append((k, member))
    return walks


def _needs_the_walk_done(reads: set, walk: list) -> bool:
    """Whether a member that loads `reads` needs a value the walk of the rows under way (its
    (k, member) pairs) has only once it is done: a reduction's result, or a value per row
    computed from such results after the walk. (A value along the row is at hand, computed at
    the same position.)"""
    return any(m.box.name in reads and (isinstance(m.comp, ir.Reduction) or m.role != "row") for _, m in walk)


def _emit_pass(writer, members, rs, store, position, parallel_if) -> None:
    """One loop over the row for consecutive members: reductions accumulate, row-wise members
    store, sharing every common subexpression; then each reduction's final value. parallel_if:
    the pass is the kernel's whole iteration space, run in parallel (one long row)."""
    inits, finals, clauses, ordered = [], [], [], False
    with writer.scope() as loop_body:
        for k, m in members:
            comp = m.comp
            value = m.run(*writer.canonical)
            if not isinstance(comp, ir.Reduction):
                if m.box.name in writer.kernel.stored:
                    loop_body.append(store(m, value))
                continue
            acc, nan, idx = f"acc{k}", f"nan{k}", f"idx{k}"
            acc_t = accumulator_type(comp)
            init = writer.constant_expr(reduction_identity(comp.reduction_type, comp.src_dtype), comp.src_dtype)
            combine, omp_op = REDUCE[comp.reduction_type]
            loop_body.append(combine.format(acc=acc, v=value, nan=nan, idx=idx, r=position.render("/")))
            if comp.reduction_type in ir.ARG_REDUCTIONS:
                # an in-order loop: the first position of the best value is kept
                ordered = True
                inits += [f"{acc_t} {acc} = {init};", f"int64_t {idx} = 0;"]
                result = idx
            else:
                inits += [f"{acc_t} {acc} = {init};", f"int {nan} = 0;"]
                clauses.append(f"reduction({omp_op}:{acc}) reduction(|:{nan})")
                result = _finish(comp, acc, nan, writer)
            finals.append((m, result))
    writer.lines += _hoist_invariant(loop_body, [r for r, _ in rs]) + inits
    # the loop is written out at the end of the kernel: a later pass may still add a line to
    # its body (storing a value it carries over, see CppWriter)
    if ordered:
        writer.lines.append(_Loop((rs, loop_body), {}))
    else:
        clause = " ".join(clauses)
        simd = " simd" if len(rs) == 1 else ""          # one loop: threads, and vectors in each
        writer.lines.append(_Loop((rs, loop_body), dict(
            innermost_pragma=f"#pragma omp simd {clause}".rstrip(),
            outer_pragma=f"#pragma omp parallel for{simd} {clause} {parallel_if}" if parallel_if else None)))
    for m, result in finals:
        var = writer.rounded_as_stored(writer._emit(result), m.box.dtype)
        writer.row_values[m.box.name] = var
        if m.box.name in writer.kernel.stored:
            writer.lines.append(store(m, var))


_DEFINES = re.compile(r"(?:auto|int64_t) (tmp\d+) = ")
_CHECKS = re.compile(r"if \((tmp\d+) < 0 \|\| ")
_LOOP_STATE = re.compile(r"\b(?:acc|nan|idx|row|part|part_nan)\d+\b|\bout_ptr\d+")


def _hoist_invariant(body: list, r_vars: list) -> list:
    """The lines of a row loop's body that do not depend on the row position, taken out of
    `body` (in place: a later pass may still append to it) and returned, to run once before
    the loop: per-row loads and, above all, the bounds check of a gathered index (an
    embedding's row), whose branch would keep the compiler from vectorizing the loop."""
    varying = set()                     # variables defined in the loop that depend on r
    position = re.compile(r"\b(?:" + "|".join(r_vars) + r")\b") if r_vars else None
    hoisted, kept = [], []
    for line in body:
        match = _DEFINES.match(line) or _CHECKS.match(line)
        uses = set(re.findall(r"\btmp\d+\b", line)) - ({match.group(1)} if _DEFINES.match(line) else set())
        if match and not (position and position.search(line)) and not _LOOP_STATE.search(line) \
                and not uses & varying:
            hoisted.append(line)
            continue
        kept.append(line)
        if match:
            varying.add(match.group(1))
    body[:] = kept
    return hoisted


def _nest(loops, body, innermost_pragma=None, outer_pragma=None, collapse=False):
    """Nested for-loops over (var, size) pairs around body lines."""
    if not loops:
        return list(body)
    lines = list(body)
    for depth, (var, size) in enumerate(reversed(loops)):
        is_outer = depth == len(loops) - 1
        head = [f"for (int64_t {var} = 0; {var} < {ir.render_size(size, '/')}; {var}++) {{"]
        pragma = None
        if depth == 0 and innermost_pragma:
            pragma = innermost_pragma
        if is_outer and outer_pragma:
            pragma = outer_pragma + (f" collapse({len(loops)})" if collapse and len(loops) > 1 else "")
        if pragma:
            head.insert(0, pragma)
        lines = head + ["    " + line for line in lines] + ["}"]
    return lines


def compile_library(source: str) -> ctypes.CDLL:
    """Compile a translation unit to a shared library (cached by hash) and load it."""
    command = [config.cxx, *config.cxx_flags]
    key = hashlib.sha256((source + "\0" + " ".join(command + config.cxx_libs)).encode()).hexdigest()[:24]
    directory = os.path.join(config.cache_dir, "cpp")
    os.makedirs(directory, exist_ok=True)
    lib_path = os.path.join(directory, f"k{key}.so")
    if not os.path.exists(lib_path):
        # the source and the library are written under names of this process's own, then
        # renamed (atomic): processes compiling the same kernels at once (the ranks of a
        # distributed job) never compile or load a file another is writing
        src_path = os.path.join(directory, f"k{key}.cpp")
        fd, tmp_src = tempfile.mkstemp(suffix=".cpp", dir=directory)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        fd, tmp_lib = tempfile.mkstemp(suffix=".so", dir=directory)
        os.close(fd)
        try:
            proc = subprocess.run([*command, tmp_src, "-o", tmp_lib, *config.cxx_libs],
                                  capture_output=True, text=True)
        except FileNotFoundError:
            os.unlink(tmp_src)
            os.unlink(tmp_lib)
            raise KernelCompileError(
                f"the C++ compiler '{config.cxx}' was not found: install g++ (or set CXX), "
                "or run on a GPU, or use minicompile.config.cpu_backend = 'triton'") from None
        os.replace(tmp_src, src_path)       # kept beside the library, for the reader
        if proc.returncode != 0:
            os.unlink(tmp_lib)
            raise KernelCompileError(
                f"C++ kernel failed to compile with `{' '.join(command)}` ({src_path}):\n"
                + "\n".join(proc.stderr.replace(tmp_src, src_path).splitlines()[:20]),
                generated_code=_compiler_works(tuple(command)))
        os.replace(tmp_lib, lib_path)
    return ctypes.CDLL(lib_path)


@functools.lru_cache(None)
def _compiler_works(command: tuple) -> bool:
    """Whether `command` compiles an empty function (asked once a kernel has failed)."""
    with tempfile.TemporaryDirectory() as directory:
        src = os.path.join(directory, "empty.cpp")
        with open(src, "w") as f:
            f.write('extern "C" void empty() {}\n')
        proc = subprocess.run([*command, src, "-o", os.path.join(directory, "empty.so"), *config.cxx_libs],
                              capture_output=True, text=True)
    return proc.returncode == 0


KERNEL_MARK = "// ---- kernel "


def combo_source(combo, buffers, defined: dict) -> tuple[str, list[str]]:
    """A combo kernel (fusion's ComboKernel): its parts' functions, called one after another
    by one exported function. -> (source, argument names)."""
    sources, args, calls = [], [], []
    for i, part in enumerate(combo.parts):
        src, part_args = kernel_source(part, buffers)
        name = f"{combo.name}_part{i}"
        src = src.replace(f'extern "C" void {part.name}(', f"static void {name}(", 1)
        function = defined_once(defined, name, src)
        if function == name:
            sources.append(src)
        args += [a for a in part_args if a not in args]
        declared = src.split("(", 1)[1].split(") {", 1)[0].split(", ")
        passed = [f"a{args.index(a)}" if "*" not in d else
                  f"({d.rsplit(' ', 1)[0].replace(' __restrict__', '')})a{args.index(a)}"
                  for a, d in zip(part_args, declared)]
        calls.append(f"    {function}({', '.join(passed)});")
    params = [f"int64_t a{i}" if SYMBOL.fullmatch(a) else f"double a{i}" if SCALAR.fullmatch(a)
              else f"void* a{i}" for i, a in enumerate(args)]
    combo.take_in_place()
    return "\n\n".join(sources + [f'extern "C" void {combo.name}({", ".join(params)}) {{', *calls, "}"]), args


def generate(kernels, buffers) -> tuple[str, dict]:
    """Source of all kernels of a graph, and {kernel name: (argument buffer names, name of the
    function that runs it)}: kernels with the same code share one function."""
    parts, signatures, defined = [], {}, {}
    for kernel in kernels:
        if isinstance(kernel, ComboKernel):
            # (its parts shared only inside it: each combo may land in another library)
            src, args = combo_source(kernel, buffers, {})
            parts.append(f"{KERNEL_MARK}{kernel.name}\n{src}")
            signatures[kernel.name] = (args, kernel.name)
            continue
        src, args = kernel_source(kernel, buffers)
        function = defined_once(defined, kernel.name, src)
        if function == kernel.name:
            parts.append(f"{KERNEL_MARK}{kernel.name}\n{src}")
        signatures[kernel.name] = (args, function)
    return "\n\n".join([prelude("".join(parts)), *parts]) + "\n", signatures


def prelude(kernels_source: str) -> str:
    """The source the kernels need before them: the helpers they name, with the helpers those
    name in turn, in HELPERS' order (a helper comes after those it uses)."""
    used, text = set(), kernels_source
    while True:
        more = {i for i, (names, _) in enumerate(HELPERS)
                if i not in used and any(re.search(rf"\b{n}\b", text) for n in names)}
        if not more:
            break
        used |= more
        text = "".join(HELPERS[i][1] for i in more)
    pragma = HALF_PRAGMA if "_Float16" in kernels_source else ""
    return pragma + PRELUDE_HEADER + "".join(HELPERS[i][1] for i in sorted(used))


def load(source: str, signatures: dict) -> dict:
    """{kernel name: C function taking data pointers} from compiled source. The kernels are
    split into as many translation units as there are cores, compiled at the same time."""
    prelude, *kernels = source.split(KERNEL_MARK)
    units = max(1, min(os.cpu_count() or 1, len(kernels)))
    chunks = ["".join(KERNEL_MARK + k for k in kernels[i::units]) for i in range(units)]
    with metrics.timed("kernel compile"):
        if units == 1:
            libraries = [compile_library(prelude + chunks[0])]
        else:
            from concurrent.futures import ThreadPoolExecutor       # the compiler runs outside Python
            with ThreadPoolExecutor(max_workers=units) as pool:
                libraries = list(pool.map(lambda chunk: compile_library(prelude + chunk), chunks))
    out = {}
    for name, (args, function) in signatures.items():
        lib = next(lib for lib, chunk in zip(libraries, chunks) if f"void {function}(" in chunk)
        fn = getattr(lib, function)
        # buffers by data pointer, size symbols (dynamic shapes) by value
        fn.argtypes = [ctypes.c_int64 if SYMBOL.fullmatch(a) else ctypes.c_double if SCALAR.fullmatch(a)
                       else ctypes.c_void_p for a in args]
        fn.restype = None
        out[name] = fn
    return out
