"""The lowering table: torch-level operations -> IR nodes.

One entry per operation, registered for every spelling it has in an FX graph (operator, torch
function, tensor method name), with a declared signature so arguments bind the same way however
they were passed. Each lowering returns a TensorBox (or a Python value), or NotImplemented to
let the generic fallback (an Extern calling PyTorch) handle a case it does not model exactly.

Type promotion follows PyTorch: the result dtype is the one the traced example value has;
operands are converted to its compute dtype (float16/bfloat16 compute in float32, rounded once
when stored).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
import types
from typing import Any, Callable

import sympy
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from .. import aliasing, config, custom_ops, ir
from ..ir import Index, compute_dtype, ops
from . import matmul
from .boxes import TensorBox

LOWERINGS: dict[Any, Callable] = {}


class Signature:
    """'input, dim=None, keepdim=False, *, dtype=None' -> binds args and kwargs to names."""

    def __init__(self, text: str):
        self.params: list[tuple[str, Any, bool]] = []   # (name, default, keyword_only)
        kw_only = False
        for part in [p.strip() for p in text.split(",") if p.strip()]:
            if part == "*":
                kw_only = True
                continue
            if part.startswith("*"):
                self.params.append((part, (), False))
                continue
            name, _, default = part.partition("=")
            self.params.append((name, eval(default) if default else _REQUIRED, kw_only))

    def bind(self, args, kwargs) -> dict | None:
        out, rest = {}, list(args)
        for name, default, kw_only in self.params:
            if name.startswith("*"):
                out[name[1:]] = tuple(rest)
                rest = []
            elif not kw_only and rest:
                out[name] = rest.pop(0)
            elif name in kwargs:
                out[name] = kwargs[name]
            elif default is _REQUIRED:
                return None
            else:
                out[name] = default
        unknown = set(kwargs) - {p[0] for p in self.params}
        return None if rest or unknown else out


_REQUIRED = object()


# targets whose lowering is elementwise: a value they read can be computed inside their kernel
POINTWISE_TARGETS: set = set()


def register(targets, signature: str, pointwise: bool = False):
    sig = Signature(signature)
    if pointwise:
        POINTWISE_TARGETS.update(t for t in targets if t is not None)

    def wrap(fn):
        def lowering(node, values, *args, **kwargs):
            bound = sig.bind(args, kwargs)
            if bound is None:
                return NotImplemented
            try:
                return fn(node, values, **bound)
            except _NotLowered:             # a part of a composite lowering: PyTorch's kernel
                return NotImplemented
        for t in targets:
            LOWERINGS[t] = lowering
        return fn
    return wrap


class _NotLowered(Exception):
    """Raised by a helper of composite lowerings (`_reduce`) for a part it cannot lower (a max
    over no elements): the whole op is left to PyTorch."""


def lookup(op: str, target) -> Callable | None:
    if op == "call_method":
        return LOWERINGS.get(target)
    if op == "call_module":
        return None
    return LOWERINGS.get(target)


# --------------------------------------------------------------------------- helpers

def _meta(node, values):
    v = values[node]
    return v if isinstance(v, torch.Tensor) else None


def _as_index_value(x, shape, dtype):
    """A loader that produces x (a box or a Python scalar) broadcast to `shape`, converted to
    `dtype` (PyTorch's common dtype of the op's operands) and held in its compute dtype. A
    tensor converted to float16 or bfloat16 is rounded to it, as PyTorch converts it before
    the op (int16 32766 is 32768 in float16); a Python number is not (PyTorch's kernels
    take it in float32). None for a CPU number a GPU kernel would convert so (some of eager's
    kernels take it as it is, some converted) or from float64 to another dtype."""
    cdtype = compute_dtype(dtype)
    if isinstance(x, TensorBox):
        load, src = x.make_loader(), list(x.shape)
        off = len(shape) - len(src)
        src_cdtype = compute_dtype(x.dtype)
        rounds = dtype in (torch.float16, torch.bfloat16) and x.dtype not in (dtype, torch.bool, torch.int8,
                                                                              torch.uint8)
        if x.is_host_number and (rounds or x.dtype == torch.float64 != dtype):
            # some of eager's GPU kernels take such a number unrounded; and a float64 one
            # would make the kernel's float32 division and sqrt Triton's approximate ones
            return None

        def f(idx):
            sub = [Index() if src[d] == 1 else idx[d + off] for d in range(len(src))]
            value = ops.to_dtype(load(sub), cdtype, src_cdtype)
            return ops.round_to(value, dtype) if rounds else value
        return f
    if isinstance(x, (bool, int, float)):
        return lambda idx: ops.constant(x, cdtype)
    if ir.is_symbolic(x):                # a dynamic size used as a number (x * T)
        return lambda idx: ops.size_value(x, cdtype)
    if isinstance(x, ir.ScalarInput):    # a dynamic float: a kernel argument
        return lambda idx: ops.scalar_arg(x.scalar, cdtype)
    if isinstance(x, _Rounded):
        load = _as_index_value(x.number, shape, dtype)
        return lambda idx: ops.round_to(load(idx), x.dtype)
    return None


def _pointwise_box(node, values, fn, inputs, common=None, origin=None, host_numbers=False):
    """host_numbers: a CPU number (TensorBox.is_host_number) may be among the inputs of a GPU
    op, whose eager kernel takes it as any tensor's value (arithmetic, comparisons; not pow,
    which picks sqrt or a product by its value, nor addcmul, which refuses it)."""
    meta = _meta(node, values)
    if meta is None:
        return NotImplemented
    box_inputs = [x for x in inputs if isinstance(x, TensorBox)]
    # (no tensor among the inputs: torch.add(2.0, 3.0) makes one; PyTorch's kernel does)
    if not box_inputs or any(b.device != meta.device and not (host_numbers and b.is_host_number)
                             for b in box_inputs):
        return NotImplemented
    return _pw(box_inputs[0].program, ir.shape_of(meta), meta.dtype, meta.device, fn, inputs,
               origin or _origin(node), common)


def _origin(node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _promoted(*xs) -> torch.dtype:
    # (a 0-dim tensor ranks below one with dims of its kind: u8 < i8 compares as uint8)
    probes = [torch.empty((1,) if x.shape else (), dtype=x.dtype) if isinstance(x, TensorBox)
              else 1.0 if isinstance(x, ir.ScalarInput) else 1 if ir.is_symbolic(x) else x for x in xs]
    return torch.result_type(*probes) if len(probes) > 1 else probes[0].dtype


def _unary(name, fn):
    @register([getattr(torch, name, None), getattr(torch.Tensor, name, None), name,
               getattr(F, name, None)], "input", pointwise=True)
    def lower(node, values, input):
        return _pointwise_box(node, values, fn, [input])
    return lower


def _binary(names_targets, fn, compare=False):
    @register(names_targets, "input, other", pointwise=True)
    def lower(node, values, input, other):
        if not isinstance(input, TensorBox) and not isinstance(other, TensorBox):
            return NotImplemented
        common = _promoted(input, other) if compare else None
        if compare:
            input, other = _number_as(input, common), _number_as(other, common)
        return _pointwise_box(node, values, fn, [input, other], common=common, host_numbers=True)
    return lower


def _number_as(x, dtype):
    """A Python number operand of a float16 or bfloat16 op as eager's kernels of the
    comparisons and pow's exponent take it, and on a CPU those of add and sub too: converted
    to that dtype first (x == 0.1 compares with float16's 0.1; x + 1000.7 adds bfloat16's 1000
    on a CPU). Theirs of mul and div, and add and sub on a GPU, take it as it is."""
    if dtype in (torch.float16, torch.bfloat16) and type(x) in (int, float):
        return torch.tensor(x, dtype=dtype).item()
    if dtype in (torch.float16, torch.bfloat16) and (isinstance(x, ir.ScalarInput) or ir.is_symbolic(x)):
        return _Rounded(x, dtype)            # (a dynamic float, or x + n of a dynamic size n)
    return x


@dataclasses.dataclass(frozen=True)
class _Rounded:
    """A number known only when the kernel runs (a dynamic float, a size) as an operand of a
    float16 or bfloat16 op: rounded to its dtype in the kernel, as eager's kernel takes it."""
    number: Any
    dtype: torch.dtype


# Arithmetic whose result is bool is logic, as in PyTorch (True + True is True): said so,
# rather than left to each backend's 1-bit integers (where True + True could wrap to False).
BOOL_ARITH = {"add": "logical_or", "mul": "logical_and", "maximum": "logical_or", "minimum": "logical_and"}


def _arith_box(node, values, op, inputs):
    """inputs combined by ops.<op>, computed in the result's compute dtype."""
    meta = _meta(node, values)
    if meta is not None and meta.dtype == torch.bool:
        op = BOOL_ARITH.get(op, op)
    return _pointwise_box(node, values, getattr(ops, op), inputs, host_numbers=True)


# --------------------------------------------------------------------------- pointwise

for _name in ["exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
              "reciprocal", "relu"]:
    _unary(_name, (lambda n: (lambda x: getattr(ops, n)(x)))(_name))


@register([torch.neg, torch.Tensor.neg, "neg", torch.negative, torch.Tensor.negative, "negative"], "input",
          pointwise=True)
def _neg(node, values, input):
    """-x; of a float, ops.neg_float, whose zero's sign is flipped too (Triton's unary minus is
    0 - x, which makes -(+0.0) +0.0: 1 / -x was +inf where eager's is -inf)."""
    meta = _meta(node, values)
    float_ = meta is not None and meta.dtype.is_floating_point
    return _pointwise_box(node, values, ops.neg_float if float_ else ops.neg, [input])


@register([torch.abs, torch.Tensor.abs, "abs", torch.absolute], "input", pointwise=True)
def _abs(node, values, input):
    """|x|. Of an int8 or int16: the abs of its int32 value, cast back (so the minimum stays
    the minimum, as in eager), the int32 kept opaque: on a GPU the compiler would narrow it to
    the int16 abs, whose -32768 widens to 32768."""
    meta = _meta(node, values)
    if meta is not None and meta.dtype in (torch.int8, torch.int16):
        dtype = meta.dtype
        return _pointwise_box(node, values, lambda x: ops.to_dtype(
            ops.abs(ops.opaque(ops.to_dtype(x, torch.int32, dtype))), dtype, torch.int32), [input])
    return _pointwise_box(node, values, ops.abs, [input])


@register([torch.floor, torch.Tensor.floor, "floor", torch.ceil, torch.Tensor.ceil, "ceil"], "input",
          pointwise=True)
def _floor_ceil(node, values, input):
    """floor and ceil; of an integer tensor, the tensor (as in PyTorch: no conversion)."""
    meta = _meta(node, values)
    if meta is not None and not meta.dtype.is_floating_point:
        return _pointwise_box(node, values, lambda x: x, [input])
    name = _origin(node)
    return _pointwise_box(node, values, getattr(ops, name), [input])


LOWERINGS[operator.neg] = LOWERINGS[torch.neg]
LOWERINGS[operator.abs] = LOWERINGS[torch.abs]


@register([torch.square, torch.Tensor.square, "square"], "input", pointwise=True)
def _square(node, values, input):
    return _arith_box(node, values, "mul", [input, input])


def _arith(op, targets):
    @register(targets, "input, other", pointwise=True)
    def lower(node, values, input, other):
        if not isinstance(input, TensorBox) and not isinstance(other, TensorBox):
            return NotImplemented
        if op == "truediv" and not isinstance(input, TensorBox):
            return _number_over(node, values, input, other)
        if op == "truediv" and type(other) in (int, float) and other != 0 and (meta := _meta(node, values)) \
                is not None and meta.device.type == "cuda" and meta.dtype.is_floating_point:
            # eager's CUDA kernel multiplies by the number's reciprocal, taken in double and
            # held in the compute dtype
            inverse = torch.tensor(1.0 / other, dtype=torch.float64).to(compute_dtype(meta.dtype)).item()
            return _arith_box(node, values, "mul", [input, inverse])
        if op == "truediv" and isinstance(other, ir.ScalarInput) and isinstance(input, TensorBox) and (
                meta := _meta(node, values)) is not None and meta.device.type == "cuda" and meta.dtype.is_floating_point:
            # so by a dynamic float's (the wrapper takes it in double: 1/0.0 is inf there too)
            inverse = scalar_expression(input.program, f"(1.0 / {other.scalar} if {other.scalar} "
                                                       f"else math.copysign(math.inf, {other.scalar}))")
            return _arith_box(node, values, "mul", [input, inverse])
        if op == "truediv" and isinstance(other, TensorBox) and other.is_host_number and (
                meta := _meta(node, values)) is not None and meta.device.type == "cuda" \
                and meta.dtype.is_floating_point:
            # so does it by a CPU number's, taken in the compute dtype
            return _pointwise_box(node, values, lambda a, b: ops.mul(a, ops.reciprocal(b)), [input, other],
                                  host_numbers=True)
        if op in ("add", "sub") and (meta := _meta(node, values)) is not None and meta.device.type == "cpu":
            input, other = _number_as(input, meta.dtype), _number_as(other, meta.dtype)
        if op in ("mul", "truediv") and (meta := _meta(node, values)) is not None and meta.device.type == "cpu" \
                and meta.dtype in (torch.float16, torch.bfloat16) and isinstance(other, TensorBox) \
                and not other.shape and other.dtype in (torch.float32, torch.float64):
            # eager's CPU kernels take a second operand that is a 0-dim tensor of another float
            # dtype as a number, in float32, unrounded (x_f16 / torch.tensor(1e5) is not x / inf;
            # a first one, torch.tensor(1e5) * x, is converted to float16): computed so
            return _pointwise_box(node, values, getattr(ops, op), [input, other], common=torch.float32)
        return _arith_box(node, values, op, [input, other])
    return lower


def _number_over(node, values, number, x):
    """number / x as eager computes it (Tensor.__rtruediv__): x's reciprocal, in x's dtype,
    times the number."""
    meta = _meta(node, values)
    if meta is None or not meta.dtype.is_floating_point or type(number) not in (int, float):
        return NotImplemented
    dt = meta.dtype

    def fn(v):
        inverse = ops.reciprocal(v)
        if dt in (torch.float16, torch.bfloat16):
            inverse = ops.round_to(inverse, dt)
        return ops.mul(inverse, ops.constant(number, compute_dtype(dt)))
    return _pointwise_box(node, values, fn, [x])


_arith("add", [operator.add, operator.iadd, "__radd__"])
_arith("sub", [operator.sub, operator.isub])
_arith("mul", [operator.mul, operator.imul, torch.mul, torch.Tensor.mul, "mul", "__rmul__", torch.multiply])
_arith("truediv", [operator.truediv, operator.itruediv, torch.true_divide, "true_divide"])
_arith("maximum", [torch.maximum, "maximum"])
_arith("minimum", [torch.minimum, "minimum"])
_arith("logical_and", [torch.logical_and, "logical_and"])
_arith("logical_or", [torch.logical_or, "logical_or"])


@register([operator.pow, torch.pow, torch.Tensor.pow, "pow"], "input, exponent", pointwise=True)
def _pow(node, values, input, exponent):
    """x ** k as PyTorch's kernels compute it, so that special values come out the same
    (inf ** 2.5 is inf, (-8) ** (1/3) is NaN, 0 ** -1 is inf). k = 0 and 1: 1 and x. A float
    result: k = 0.5, -0.5 and -1 are sqrt, rsqrt and reciprocal, k = 2, 3 and -2 are
    multiplications (on a CPU, bfloat16 products each rounded, as there; for float16, its CPU
    kernel calls pow for every k: so do we, where (-inf) ** 0.5 is inf and CUDA's sqrt NaN),
    any other k or a tensor exponent is ops.pow.
    An integer result (an integer k >= 0): k - 1 multiplications, which wrap as PyTorch's
    integer powers do; up to k = 8, else PyTorch's kernel."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox) or isinstance(exponent, bool):
        return NotImplemented
    cd = compute_dtype(meta.dtype)
    if isinstance(exponent, TensorBox):
        if not meta.dtype.is_floating_point:
            return NotImplemented
        return _pointwise_box(node, values, ops.pow, [input, exponent])
    if not isinstance(exponent, (int, float)):
        return NotImplemented
    k = _number_as(exponent, meta.dtype)
    if k == 0:
        return _pointwise_box(node, values, lambda x: ops.constant(1, cd), [input])
    if k == 1:
        return _pointwise_box(node, values, lambda x: x, [input])
    if not meta.dtype.is_floating_point:
        if not float(k).is_integer() or not 0 < k <= 8:
            return NotImplemented

        def fn(x):
            y = x
            for _ in range(int(k) - 1):
                y = ops.mul(y, x)
            return y
    elif (meta.dtype == torch.float16 and meta.device.type == "cpu") or k not in (0.5, -0.5, -1, 2, 3, -2):
        def fn(x):
            return ops.pow(x, ops.constant(float(k), cd))
    else:
        # on a CPU, PyTorch multiplies bfloat16 values as bfloat16 (each product rounded)
        rounded = meta.dtype == torch.bfloat16 and meta.device.type == "cpu"

        def product(a, b):
            y = ops.mul(a, b)
            return ops.round_to(y, meta.dtype) if rounded else y

        def fn(x):
            if k in (0.5, -0.5, -1):
                return {0.5: ops.sqrt, -0.5: ops.rsqrt, -1: ops.reciprocal}[k](x)
            y = product(x, x) if k in (2, -2) else product(product(x, x), x)
            return ops.reciprocal(y) if k < 0 else y
    return _pointwise_box(node, values, fn, [input])


for _op, _targets in [("eq", [operator.eq, torch.eq, "eq"]), ("ne", [operator.ne, torch.ne, "ne"]),
                      ("lt", [operator.lt, torch.lt, "lt"]), ("le", [operator.le, torch.le, "le"]),
                      ("gt", [operator.gt, torch.gt, "gt"]), ("ge", [operator.ge, torch.ge, "ge"])]:
    _binary(_targets, (lambda o: lambda a, b: getattr(ops, o)(a, b))(_op), compare=True)


@register([torch.add, torch.Tensor.add, "add"], "input, other, *, alpha=1", pointwise=True)
def _add(node, values, input, other, alpha):
    if not isinstance(alpha, (int, float)) or alpha != 1:
        return _scaled(node, values, ops.add, input, other, alpha)
    return LOWERINGS[operator.add](node, values, input, other)


@register([torch.sub, torch.Tensor.sub, "sub", torch.subtract], "input, other, *, alpha=1", pointwise=True)
def _sub(node, values, input, other, alpha):
    if not isinstance(alpha, (int, float)) or alpha != 1:
        return _scaled(node, values, ops.sub, input, other, alpha)
    return LOWERINGS[operator.sub](node, values, input, other)


def _scaled(node, values, op, input, other, alpha):
    """input op alpha * other (floating point; alpha a number or a float graph input)."""
    meta = _meta(node, values)
    if meta is None or not meta.dtype.is_floating_point or isinstance(alpha, bool):
        return NotImplemented
    if meta.device.type == "cpu":
        alpha = _number_as(alpha, meta.dtype)        # (as eager's CPU kernel takes it)
    return _pointwise_box(node, values, lambda a, k, b: op(a, ops.mul(k, b)), [input, alpha, other])


@register([torch.addcmul, torch.Tensor.addcmul, "addcmul"], "input, tensor1, tensor2, *, value=1",
          pointwise=True)
def _addcmul(node, values, input, tensor1, tensor2, value):
    """input + value * tensor1 * tensor2, in PyTorch's order (the products left to right)."""
    meta = _meta(node, values)
    if meta is None or not meta.dtype.is_floating_point:
        return NotImplemented
    return _pointwise_box(node, values, lambda a, v, b, c: ops.add(a, ops.mul(ops.mul(v, b), c)),
                          [input, value, tensor1, tensor2])


@register([torch.addcdiv, torch.Tensor.addcdiv, "addcdiv"], "input, tensor1, tensor2, *, value=1",
          pointwise=True)
def _addcdiv(node, values, input, tensor1, tensor2, value):
    """input + value * tensor1 / tensor2: PyTorch's CPU kernel multiplies first, its CUDA
    kernel divides first; each device's order is kept."""
    meta = _meta(node, values)
    if meta is None or not meta.dtype.is_floating_point:
        return NotImplemented
    if meta.device.type == "cuda":
        def fn(a, v, b, c):
            return ops.add(a, ops.mul(v, ops.truediv(b, c)))
    else:
        def fn(a, v, b, c):
            return ops.add(a, ops.truediv(ops.mul(v, b), c))
    return _pointwise_box(node, values, fn, [input, value, tensor1, tensor2])


@register([torch.lerp, torch.Tensor.lerp, "lerp"], "input, end, weight", pointwise=True)
def _lerp(node, values, input, end, weight):
    """input + weight * (end - input), as PyTorch computes it: from the nearer end, so that
    weight 1 gives `end` exactly (for |weight| >= 0.5: end - (end - input) * (1 - weight))."""
    meta = _meta(node, values)
    if meta is None or not meta.dtype.is_floating_point:
        return NotImplemented

    def fn(a, b, w):
        one, half = ops.constant(1.0, compute_dtype(meta.dtype)), ops.constant(0.5, compute_dtype(meta.dtype))
        diff = ops.sub(b, a)
        return ops.where(ops.lt(ops.abs(w), half), ops.add(a, ops.mul(w, diff)),
                         ops.sub(b, ops.mul(diff, ops.sub(one, w))))
    return _pointwise_box(node, values, fn, [input, end, weight])


@register([torch.div, torch.Tensor.div, "div", torch.divide], "input, other, *, rounding_mode=None",
          pointwise=True)
def _div(node, values, input, other, rounding_mode):
    if rounding_mode is not None:
        return NotImplemented
    if not isinstance(input, TensorBox):      # torch.div(2.0, x) divides (2.0 / x takes x's reciprocal)
        return _pointwise_box(node, values, ops.truediv, [input, other])
    return LOWERINGS[operator.truediv](node, values, input, other)


@register([F.gelu, "gelu"], "input, approximate='none'", pointwise=True)
def _gelu(node, values, input, approximate):
    if not isinstance(input, TensorBox) or not input.dtype.is_floating_point:
        return NotImplemented
    c = _constants_of(input.dtype)
    if approximate == "tanh":
        def fn(x):
            inner = ops.mul(c(math.sqrt(2 / math.pi)), ops.add(x, ops.mul(c(0.044715), ops.mul(x, ops.mul(x, x)))))
            return ops.mul(ops.mul(c(0.5), x), ops.add(c(1.0), ops.tanh(inner)))
    else:
        erf = _erf_of_eager(input.device, input.dtype, in_gelu=True)

        def fn(x):
            return ops.mul(ops.mul(c(0.5), x), ops.add(c(1.0), erf(ops.mul(x, c(1 / math.sqrt(2))))))
    return _pointwise_box(node, values, fn, [input])


@register([torch.erf, torch.Tensor.erf, "erf", torch.special.erf], "input", pointwise=True)
def _erf(node, values, input):
    if not isinstance(input, TensorBox):
        return NotImplemented
    return _pointwise_box(node, values, _erf_of_eager(input.device, input.dtype), [input])


def _erf_of_eager(device, dtype, in_gelu=False):
    """erf as eager computes it. On a GPU, and for float32 and float64 on a CPU, the C
    library's erf (accurate: erf(1e-20) is 1.13e-20). On a CPU, ATen's vectorized kernels
    compute erf in float32 by Abramowitz and Stegun 7.1.26 (error below 1.5e-7, so erf(1e-20)
    is 0) for float16 and bfloat16, and for gelu of float32 too; there, so do we (gelu(-5)
    depends on the last digits of erf(-3.5))."""
    float32 = compute_dtype(dtype) == torch.float32 and (in_gelu or dtype != torch.float32)
    if device.type != "cpu" or not float32:
        return ops.erf

    def erf(x):
        def c(v):
            return ops.constant(v, torch.float32)
        t = ops.reciprocal(ops.add(ops.mul(c(0.3275911), ops.abs(x)), c(1.0)))
        r = c(1.061405429)
        for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
            r = ops.add(ops.mul(r, t), c(coefficient))
        y = ops.sub(c(1.0), ops.mul(ops.mul(t, ops.exp(ops.neg(ops.mul(x, x)))), r))
        # (ATen gives y the sign of x: -0.0 stays -0.0, where y is 0)
        return ops.where(ops.eq(x, c(0.0)), x, ops.where(ops.lt(x, c(0.0)), ops.neg(y), y))
    return erf


@register([F.silu, "silu"], "input, inplace=False", pointwise=True)
def _silu(node, values, input, inplace):
    if inplace:
        return NotImplemented
    return _pointwise_box(node, values, lambda x: ops.mul(x, ops.sigmoid(x)), [input])


@register([F.relu], "input, inplace=False", pointwise=True)
def _relu(node, values, input, inplace):
    if inplace:
        return NotImplemented
    return _pointwise_box(node, values, ops.relu, [input])


def _constants_of(dtype):
    """v -> ops.constant(v) in the dtype a value of `dtype` is computed in (float32 for half
    types, float64 for float64: a float32 constant would round a float64 computation)."""
    cd = compute_dtype(dtype)
    return lambda v: ops.constant(v, cd)


def _int64(v):
    """An integer constant for index arithmetic in a kernel."""
    return ops.constant(v, torch.int64)


def _int32(v):
    """An integer constant for index arithmetic known to fit 32 bits (positions in a plane)."""
    return ops.constant(v, torch.int32)


_pair = custom_ops.pair


def _all_of(conditions):
    """The mask where every one of the (non-empty) conditions holds."""
    mask = conditions[0]
    for c in conditions[1:]:
        mask = ops.logical_and(mask, c)
    return mask


def _relu6_of_shifted(x, c):
    """min(max(x + 3, 0), 6), NaN-propagating: what hardswish and hardsigmoid share."""
    return ops.minimum(ops.maximum(ops.add(x, c(3.0)), c(0.0)), c(6.0))


_SIXTH_IN_FLOAT32 = float(torch.tensor(1.0, dtype=torch.float32) / 6)     # CUDA's 1.0f / 6.0f


def _sixth_of(device, c):
    """v / 6 as eager's kernels compute it: divided on a CPU; on a GPU multiplied by 1/6 rounded
    to float32 (CUDA's kernels write the constant 1.0f / 6.0f, float64 inputs included)."""
    if device.type == "cuda":
        return lambda v: ops.mul(v, c(_SIXTH_IN_FLOAT32))
    return lambda v: ops.truediv(v, c(6.0))


@register([F.hardswish, "hardswish"], "input, inplace=False", pointwise=True)
def _hardswish(node, values, input, inplace):
    """x * min(max(x + 3, 0), 6) / 6, the sixth taken last as PyTorch's kernels do (_sixth_of)."""
    if inplace or not isinstance(input, TensorBox):
        return NotImplemented
    c = _constants_of(input.dtype)
    sixth = _sixth_of(input.device, c)
    return _pointwise_box(node, values, lambda x: sixth(ops.mul(x, _relu6_of_shifted(x, c))), [input])


@register([F.hardsigmoid, "hardsigmoid"], "input, inplace=False", pointwise=True)
def _hardsigmoid(node, values, input, inplace):
    if inplace or not isinstance(input, TensorBox):
        return NotImplemented
    c = _constants_of(input.dtype)
    sixth = _sixth_of(input.device, c)
    return _pointwise_box(node, values, lambda x: sixth(_relu6_of_shifted(x, c)), [input])


@functools.lru_cache(maxsize=None)
def _ignores_a_lone_nan_bound(device_type: str, dtype: torch.dtype) -> bool:
    """Whether eager's clamp with one bound, a NaN number, leaves x as it is: its CUDA kernel
    does (fmax/fmin ignore a NaN), and so does its CPU kernel in torch 2.11, where 2.13's
    makes every element NaN. Asked of eager, once."""
    return not torch.ones(1, dtype=dtype, device=device_type).clamp(min=float("nan")).isnan().item()


@register([torch.clamp, torch.clip, torch.Tensor.clamp, "clamp", "clip"], "input, min=None, max=None",
          pointwise=True)
def _clamp(node, values, input, min, max):
    """max(x, min) then min(_, max), NaN-propagating, in the result's dtype as PyTorch
    promotes: an int tensor clamped to float bounds is a float tensor; an int bound of a uint8
    tensor wraps into uint8 (as PyTorch converts it). Bounds may be numbers, tensors or
    dynamic floats. A NaN number as a bound makes every element NaN, except where it is the
    only bound and eager's kernel ignores it (_ignores_a_lone_nan_bound)."""
    given = [b for b in (min, max) if b is not None]
    ignored = len(given) == 1 and isinstance(given[0], float) and math.isnan(given[0]) and \
        isinstance(input, TensorBox) and _ignores_a_lone_nan_bound(torch.device(input.device).type, input.dtype)
    bounds = [(op, b) for op, b in ((ops.maximum, min), (ops.minimum, max)) if b is not None and not ignored]

    def fn(x, *values_):
        for (op, _), bound in zip(bounds, values_):
            x = op(x, bound)
        return x
    return _pointwise_box(node, values, fn, [input] + [b for _, b in bounds])


@register([F.hardtanh], "input, min_val=-1.0, max_val=1.0, inplace=False", pointwise=True)
def _hardtanh(node, values, input, min_val, max_val, inplace):
    """clamp(x, min_val, max_val), which is what PyTorch's kernel computes (NaN stays NaN):
    ReLU6 (MobileNet's activation) is hardtanh(x, 0, 6). Float tensors only: on an integer
    tensor hardtanh keeps its dtype where clamp would promote to the bounds' float."""
    if inplace or not isinstance(input, TensorBox) or not input.dtype.is_floating_point \
            or not all(isinstance(b, (int, float)) for b in (min_val, max_val)):
        return NotImplemented
    return _clamp(node, values, input, min_val, max_val)


@register([F.relu6], "input, inplace=False", pointwise=True)
def _relu6(node, values, input, inplace):
    return _hardtanh(node, values, input, 0.0, 6.0, inplace)


@register(["where"], "input, condition, other", pointwise=True)
def _where_method(node, values, input, condition, other):
    """x.where(condition, y): torch.where(condition, x, y)."""
    return _where(node, values, condition, input, other)


@register([torch.where], "condition, input, other", pointwise=True)
def _where(node, values, condition, input, other):
    meta = _meta(node, values)
    if meta is None or not isinstance(condition, TensorBox):
        return NotImplemented
    shape = ir.shape_of(meta)
    cond = _as_index_value(condition, shape, torch.bool)
    a, b = _as_index_value(input, shape, meta.dtype), _as_index_value(other, shape, meta.dtype)
    if a is None or b is None:
        return NotImplemented
    boxes = [x for x in (condition, input, other) if isinstance(x, TensorBox)]
    data = ir.Pointwise(shape, meta.dtype, meta.device, lambda idx: ops.where(cond(idx), a(idx), b(idx)), "where")
    return TensorBox(data, condition.program, boxes)


@register([aliasing.copy_into], "dest, src", pointwise=True)
def _copy_into(node, values, dest, src):
    """What dest.copy_(src) leaves in dest (functionalize.py): src broadcast and converted, a
    value of its own."""
    meta = _meta(node, values)
    if meta is None or not isinstance(src, TensorBox) or src.device != meta.device:
        return NotImplemented
    shape = ir.shape_of(meta)
    data = ir.Pointwise(shape, meta.dtype, meta.device, _as_index_value(src, shape, meta.dtype), "copy")
    return TensorBox(data, src.program, [src])


def _cast(node, values, input):
    """A dtype conversion (narrowing to half precision rounds at the end of the op, as every
    op's half result does: lower._rounded_as_eager)."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox) or meta.device != input.device:
        return NotImplemented
    box = _pointwise_box(node, values, lambda x: x, [input])
    if isinstance(box, TensorBox) and meta.dtype == input.dtype and node.target not in _CLONES:
        box.data.aliases = True          # .contiguous(), .to(same dtype), .detach() may return x itself
    return box


# (a clone is a tensor of its own, in every spelling the graphs have)
_CLONES = ("clone", torch.clone, torch.Tensor.clone, torch.ops.aten.clone.default)


@register(["to"], "input, *args, device=None, dtype=None, non_blocking=False, copy=False, memory_format=None")
def _to(node, values, input, args, device, dtype, non_blocking, copy, memory_format):
    """A conversion to a dtype, on the same device (`device=` naming the input's own, as
    Hugging Face's mask code writes it); to another device it stays PyTorch's copy."""
    return _cast(node, values, input)


for _m in ["float", "half", "double", "bfloat16", "int", "long", "bool", "type_as",
           "contiguous", "clone", "detach"]:
    LOWERINGS[_m] = lambda node, values, input, *a, **k: _cast(node, values, input)
LOWERINGS[torch.clone] = LOWERINGS["clone"]
LOWERINGS[torch.Tensor.contiguous] = LOWERINGS["contiguous"]


# --------------------------------------------------------------------------- reductions

def _reduction_box(meta, input, dims, keepdim, reduction_type):
    """meta: a tensor with the result's shape, dtype and device."""
    if meta is None or not isinstance(input, TensorBox):
        return NotImplemented
    ndim = len(input.shape)
    if dims is None or dims == [] or dims == ():
        dims = list(range(ndim))
    dims = ir.wrap_dims(dims, ndim)
    key = (id(input), tuple(dims), bool(keepdim), reduction_type, meta.dtype, tuple(map(str, meta.shape)))
    if key not in input.program.reductions:
        box = _new_reduction_box(meta, input, dims, keepdim, reduction_type)
        if box is NotImplemented:
            return box
        input.program.reductions[key] = (input, box)     # (input: its id stays its own)
    return input.program.reductions[key][1]


def _new_reduction_box(meta, input, dims, keepdim, reduction_type):
    ndim = len(input.shape)
    kept = [d for d in range(ndim) if d not in dims]
    ranges = [input.shape[d] for d in dims]
    if 0 in ranges:
        # rows without elements: PyTorch's value for them (max and min raise there)
        if reduction_type not in ("sum", "prod", "mean"):
            return NotImplemented
        value = {"sum": 0, "prod": 1, "mean": math.nan}[reduction_type]
        return _pw(input.program, ir.shape_of(meta), meta.dtype, meta.device,
                   lambda: ops.constant(value, compute_dtype(meta.dtype)), [], f"{reduction_type} of nothing")
    load = input.make_loader()
    # the dtype values are accumulated (or, for argmax/argmin, compared) in
    acc = compute_dtype(input.dtype if reduction_type in ir.ARG_REDUCTIONS else meta.dtype)
    if reduction_type in ("sum", "prod") and not meta.dtype.is_floating_point:
        acc = torch.int64
    src_cd = compute_dtype(input.dtype)

    split, columns = _split_choice(input, kept, dims) if reduction_type in ("sum", "mean", "max", "min") \
        else (0, False)
    if split:
        return _split_reduction(meta, input, dims, kept, ranges, reduction_type, acc, split, columns)

    def inner_fn(idx, ridx):
        full = [None] * ndim
        for j, d in enumerate(kept):
            full[d] = idx[d] if keepdim else idx[j]
        for j, d in enumerate(dims):
            full[d] = ridx[j]
        return ops.to_dtype(load(full), acc, src_cd)
    if reduction_type in UNROLLED and all(isinstance(r, int) for r in ranges) and math.prod(ranges) <= UNROLL_LIMIT \
            and kept and _unit_steps(input, kept, dims)[1] == 0:
        return _unrolled_reduction(meta, input, ranges, reduction_type, acc, inner_fn)
    data = ir.Reduction(ir.shape_of(meta), meta.dtype, meta.device, reduction_type, ranges,
                        inner_fn, src_dtype=acc, origin=reduction_type,
                        input_shape=list(input.shape), reduced_dims=dims, keepdim=bool(keepdim))
    return TensorBox(data, input.program, [input])


# Rows of at most this many elements, none next to another in memory, are reduced inside a
# pointwise expression, each element loaded and combined in turn (as Inductor's
# unroll_reductions_threshold): a reduction kernel would hold a block of mostly masked lanes
# per row, and load the rows' elements (a grouped-query attention's key gradient summed over
# the query heads that share each key head, 64 floats apart) by neighbouring lanes instead
# of neighbouring rows' elements. Short contiguous rows (a softmax over 7) stay a reduction
# kernel: its members read the row's results from registers, where an unrolled softmax's sum
# would compute its maximum again for each element.
UNROLL_LIMIT = 8
UNROLLED = {"sum": "add", "mean": "add", "prod": "mul", "max": "maximum", "min": "minimum"}


def _unrolled_reduction(meta, input, ranges, reduction_type, acc, inner_fn) -> TensorBox:
    """A reduction over short rows as a pointwise value: the row's elements combined in order,
    in the accumulator's dtype (a mean divided by the row length at the end)."""
    positions = [[Index.of(p) for p in position] for position in itertools.product(*[range(r) for r in ranges])]

    def row(idx):
        combine = getattr(ops, UNROLLED[reduction_type])
        total = inner_fn(idx, positions[0])
        if reduction_type in ("sum", "mean") and acc.is_floating_point:
            total = ops.add(ops.constant(0.0, acc), total)     # (from +0.0, as eager's: -0.0 + -0.0 is +0.0)
        for position in positions[1:]:
            total = combine(total, inner_fn(idx, position))
        return ops.truediv(total, ops.constant(float(len(positions)), acc)) if reduction_type == "mean" else total
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, row, reduction_type),
                     input.program, [input])


def _split_choice(input: TensorBox, kept: list, dims: list) -> tuple[int, bool]:
    """(pieces, columns): how a reduction of input over dims is split (0: not split), and
    whether its rows are columns (next to each other in memory)."""
    # a GPU needs a long row split to keep its many cores busy; C++ runs one long row's loop in
    # parallel itself, and unsplit it can share that loop with the work around it
    if input.device.type == "cpu" and config.cpu_backend == "cpp":
        return 0, False
    rows, length = math.prod(input.shape[d] for d in kept), math.prod(input.shape[d] for d in dims)
    as_columns, as_rows = _split_factor(rows, length, True), _split_factor(rows, length, False)
    # (looking at the loads costs a walk of the whole expression: only where it decides)
    columns = bool(kept) and bool(as_columns or as_rows) and _reads_columns(input, kept, dims)
    return (as_columns if columns else as_rows), columns


def _split_factor(rows: int, row_length: int, columns: bool = False) -> int:
    """How many pieces to cut each row into, when there are too few rows to keep a machine
    busy and each is long (a full sum of a large tensor would otherwise run in one program):
    a divisor of the row length, so no piece needs a bound check; 0 for no split. Columns (rows
    next to each other in memory, as a channels-last batch norm's channels) are reduced
    `ir.GPU_COLUMN_BLOCK` to a program where there are enough of them; long ones are split into
    enough pieces of at least 256 for two such programs a multiprocessor, each piece's columns
    side by side (a ResNet-50's batch norms at batch 32: 64 channels of 401,408 in 256 pieces,
    256 channels of 100,352 in 64). On the H200 (benchmarks/results/sweep_split_columns_h200.json)
    their backward sums took 20% less time than with 8 columns a program over a quarter as many
    pieces, and were within 2% of torch.compile's at every shape swept."""
    if ir.is_symbolic(rows) or ir.is_symbolic(row_length):
        return 0
    if columns:
        programs, wanted = -(-rows // ir.GPU_COLUMN_BLOCK), 2 * ir.GPU_MULTIPROCESSORS
        if programs >= wanted or row_length < 4096:
            return 0
        fits = [2**k for k in range(1, 11) if row_length % 2**k == 0 and row_length // 2**k >= 256]
        enough = [p for p in fits if p * programs >= wanted]
        return enough[0] if enough else (fits[-1] if fits else 0)
    if rows > 64 or row_length < 2**16:
        return 0
    for pieces in (1024, 512, 256, 128, 64):
        if row_length % pieces == 0 and row_length // pieces >= 1024:
            return pieces
    return 0


def _reads_columns(input: TensorBox, kept: list, dims: list) -> bool:
    """Whether more of the loads of a reduction's input step through memory along the kept
    dims than along the reduced ones (a reduction over the leading dims of a channels-last or
    row-major value: its rows are next to each other)."""
    along_kept, along_reduced = _unit_steps(input, kept, dims)
    return along_kept > along_reduced


def _unit_steps(input: TensorBox, kept: list, dims: list) -> tuple[int, int]:
    """(along kept, along reduced): how many of the loads that compute a reduction's input
    step through memory one element at a time along a kept dim, and along a reduced one. A
    load that only the kept dims or only the reduced ones index (a layer norm's mean per
    token, in its weight's gradient) is the same along the others and comes from cache: it
    is not counted."""
    rec = ir.RecordingOps()
    # a value that reads a reduction not stored yet (a variance reads its mean) cannot be
    # loaded now: the same-shaped values it is computed from are looked at instead
    boxes, seen = [input], set()
    while boxes:
        box = boxes.pop(0)
        if id(box) in seen or list(box.shape) != list(input.shape):
            continue
        seen.add(id(box))
        try:
            with ir.use_ops(rec):
                box.make_loader()([Index.var(f"i{d}") for d in range(len(input.shape))])
            break
        except NotImplementedError:
            rec, boxes = ir.RecordingOps(), boxes + box.reads
    kept_vars, reduced_vars = {f"i{d}" for d in kept}, {f"i{d}" for d in dims}
    # (a gathered load's index holds a value read first: it may vary along any dim)
    walking = [index for _, index in rec.loads
               if (index.variables() & kept_vars and index.variables() & reduced_vars)
               or index.variables() - kept_vars - reduced_vars]
    along_kept = sum(any(index.coeff(f"i{d}") == 1 for d in kept) for index in walking)
    along_reduced = sum(any(index.coeff(f"i{d}") == 1 for d in dims) for index in walking)
    return along_kept, along_reduced


def _split_reduction(meta, input, dims, kept, ranges, reduction_type, acc, pieces, columns=False):
    """A reduction in two stages: partial results of `pieces` chunks of each row (many
    programs in parallel), then a reduction of those (as Inductor's split reductions). For
    columns the partial results are stored piece by piece (each piece's columns next to each
    other), so the programs that compute them read neighbouring columns together."""
    ndim, program, device = len(input.shape), input.program, input.device
    kept_shape = [input.shape[d] for d in kept]
    chunk = math.prod(ranges) // pieces
    load, src_cd = input.make_loader(), compute_dtype(input.dtype)
    partial_type = "sum" if reduction_type == "mean" else reduction_type

    def partial_fn(idx, ridx):                  # idx: kept dims + [piece]; ridx: [j]
        position = ir.unflatten(idx[-1] * chunk + ridx[0], ranges)
        full = [None] * ndim
        for j, d in enumerate(kept):
            full[d] = idx[j]
        for j, d in enumerate(dims):
            full[d] = position[j]
        return ops.to_dtype(load(full), acc, src_cd)
    partial = _pieces(partial_fn, kept_shape, pieces, chunk, acc, device, partial_type, f"{reduction_type} (split)",
                      columns, program, [input])
    load_partial = partial.make_loader()
    total = TensorBox(ir.Reduction(kept_shape, acc, device, partial_type, [pieces],
                                   lambda idx, ridx: load_partial(list(idx) + [ridx[0]]),
                                   src_dtype=acc, origin=reduction_type, input_shape=kept_shape + [pieces],
                                   reduced_dims=[len(kept)]), program, [partial])
    load_total, count = total.make_loader(), math.prod(ranges)
    out_kept = [d for d in range(len(meta.shape)) if len(meta.shape) == len(kept) or d in kept]

    def finish(idx):
        value = load_total([idx[d] for d in out_kept])
        # divided, as PyTorch's mean is (times 1/n can be off by one unit in the last place)
        value = ops.truediv(value, ops.constant(float(count), acc)) if reduction_type == "mean" else value
        return ops.to_dtype(value, meta.dtype, acc)
    result = TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, device, finish, reduction_type),
                       program, [total])
    if reduction_type != "mean":
        return result
    # what a variance builds on (_split_squared_deviations): its sums of pieces, in the same pass
    result.split = types.SimpleNamespace(partial=partial, total=total, element=partial_fn, pieces=pieces,
                                         chunk=chunk, columns=columns, kept=kept, acc=acc)
    return result


def _pieces(fn, kept_shape, pieces, chunk, acc, device, reduction_type, origin, columns, program, reads):
    """The first stage of a split reduction: fn(kept index + [piece], [j]) reduced over each
    piece's `chunk` elements. For columns, stored piece by piece (each piece's columns next to
    each other), so the programs that compute them read neighbouring columns together."""
    box = TensorBox(ir.Reduction(kept_shape + [pieces], acc, device, reduction_type, [chunk], fn, src_dtype=acc,
                                 origin=origin, input_shape=kept_shape + [pieces, chunk],
                                 reduced_dims=[len(kept_shape) + 1]), program, reads)
    if columns:
        box.wanted_stride = ir.dense_strides(kept_shape + [pieces], [len(kept_shape)] + list(range(len(kept_shape))))
    return box


def _squared_deviations(input: TensorBox, mean: TensorBox, dims, keepdim: bool, shape) -> TensorBox:
    """sum((x - mean)^2) over dims (`shape`: the result's), in the mean's dtype: two walks of
    each row (the mean, then the squares about it), fused into one kernel; for a split mean, in
    one pass with its sums (_split_squared_deviations)."""
    split = _split_squared_deviations(mean, input, shape)
    if split is not None:
        return split
    squares = _pw(input.program, list(input.shape), mean.dtype, input.device,
                  lambda x, m: ops.mul(ops.sub(x, m), ops.sub(x, m)), [input, mean], "square")
    return _reduction_box(types.SimpleNamespace(shape=shape, dtype=mean.dtype, device=input.device),
                          squares, dims, keepdim, "sum")


def _split_squared_deviations(mean: TensorBox, input: TensorBox, shape) -> TensorBox | None:
    """sum((x - mean)^2) over the rows of a split mean (`shape`: the result's), read in one
    pass with the mean's sums (Chan's parallel variance): each piece's sum of squares about its
    own mean (a "squared_deviations" reduction, computed by code generation in the walk that
    sums the piece), then sum_p m2_p + n_p (mean_p - mean)^2 over the pieces, in the kernel that
    sums the pieces for the mean. Exact as two passes are (no difference of large sums), and a batch
    norm's statistics take two kernels instead of five, each element read once. None where the
    mean is not split."""
    split = getattr(mean, "split", None)
    if split is None:
        return None
    kept_shape = [input.shape[d] for d in split.kept]
    if getattr(split, "squared", None) is None:         # (made once for the mean's rows)
        split.squared = _chan_total(input, split, kept_shape)
    load = split.squared.make_loader()
    out_kept = [d for d in range(len(shape)) if len(shape) == len(kept_shape) or d in split.kept]
    return TensorBox(ir.Pointwise(list(shape), split.acc, input.device, lambda idx: load([idx[d] for d in out_kept]),
                                  "squared deviations"), input.program, [split.squared])


def _chan_total(input: TensorBox, split, kept_shape: list) -> TensorBox:
    """Chan's sum of squared deviations over the pieces of a split mean: (kept_shape,)."""
    program, device, acc, chunk = input.program, input.device, split.acc, split.chunk
    load_sums = split.partial.make_loader()
    m2 = _pieces(split.element, kept_shape, split.pieces, chunk, acc, device, "squared_deviations",
                 "squared deviations (split)", split.columns, program, [input])
    load_m2, load_total = m2.make_loader(), split.total.make_loader()
    count = chunk * split.pieces

    def total_m2(idx, ridx):
        piece = list(idx) + [ridx[0]]
        apart = ops.sub(ops.truediv(load_sums(piece), ops.constant(float(chunk), acc)),
                        ops.truediv(load_total(idx), ops.constant(float(count), acc)))
        return ops.add(load_m2(piece), ops.mul(ops.constant(float(chunk), acc), ops.mul(apart, apart)))
    return TensorBox(ir.Reduction(kept_shape, acc, device, "sum", [split.pieces], total_m2, src_dtype=acc,
                                  origin="squared deviations", input_shape=kept_shape + [split.pieces],
                                  reduced_dims=[len(kept_shape)]), program, [m2, split.partial, split.total])


def _reg_reduction(rtype, targets):
    @register(targets, "input, dim=None, keepdim=False, *, dtype=None")
    def lower(node, values, input, dim, keepdim, dtype):
        if dtype is not None:
            return NotImplemented
        return _reduction_box(_meta(node, values), input, dim, keepdim, rtype)


_reg_reduction("sum", [torch.sum, torch.Tensor.sum, "sum"])
_reg_reduction("mean", [torch.mean, torch.Tensor.mean, "mean"])
_reg_reduction("prod", [torch.prod, torch.Tensor.prod, "prod"])
_reg_reduction("max", [torch.amax, torch.Tensor.amax, "amax"])
_reg_reduction("min", [torch.amin, torch.Tensor.amin, "amin"])


@register([torch.argmax, torch.Tensor.argmax, "argmax"], "input, dim=None, keepdim=False")
def _argmax(node, values, input, dim, keepdim):
    return _arg_reduction(_meta(node, values), input, dim, keepdim, "argmax")


@register([torch.argmin, torch.Tensor.argmin, "argmin"], "input, dim=None, keepdim=False")
def _argmin(node, values, input, dim, keepdim):
    return _arg_reduction(_meta(node, values), input, dim, keepdim, "argmin")


def _arg_reduction(meta, input, dim, keepdim, rtype):
    """argmax/argmin as one reduction that keeps (value, position): over dim, or over the
    whole tensor (positions in the flattened tensor) without one."""
    if not _arg_reducible(input, dim):
        return NotImplemented
    return _reduction_box(meta, input, dim, keepdim, rtype)


def _arg_reducible(input, dim) -> bool:
    """A 0-dim input, an empty row (eager raises) and bool inputs are left to PyTorch."""
    if not isinstance(input, TensorBox) or not input.shape or input.dtype == torch.bool:
        return False
    if dim is not None and not isinstance(dim, int):
        return False
    return (input.shape[dim] if dim is not None else math.prod(input.shape)) != 0


_MAX_MIN_OF_TWO = Signature("input, other")
_MAX_MIN_OVER_DIM = Signature("input, dim, keepdim=False")


def _max_min(rtype, elementwise):
    """torch.max / torch.min in their three forms: of the whole tensor (a tensor), of two
    tensors (elementwise), and over a dim ((values, indices))."""
    def lower(node, values, input, *args, **kwargs):
        if not args and not kwargs:                        # full reduction, returns a tensor
            return _reduction_box(_meta(node, values), input, None, False, rtype)
        two = _MAX_MIN_OF_TWO.bind((input, *args), kwargs)
        if two is not None and isinstance(two["other"], TensorBox):
            return _pointwise_box(node, values, getattr(ops, elementwise), [input, two["other"]])
        over_dim = _MAX_MIN_OVER_DIM.bind((input, *args), kwargs)
        if over_dim is None:
            return NotImplemented
        return _values_and_indices(node, values, rtype, **over_dim)
    return lower


def _values_and_indices(node, values, rtype, input, dim, keepdim):
    """x.max(dim) / x.min(dim): amax's values (NaN where the row holds one) and argmax's
    positions (the first best, the first NaN), two reductions over the same rows that fuse
    into one kernel. Returned as eager's named tuple, so `.values` and `[1]` both work."""
    result = values.get(node)
    if not isinstance(result, tuple) or len(result) != 2 or not isinstance(dim, int) \
            or isinstance(dim, bool) or not _arg_reducible(input, dim):
        return NotImplemented        # what argmax leaves to PyTorch, max(dim) does too
    # an item no user reads is not computed: x.max(-1).values is amax alone
    used = _items_used(node, result)
    items = [_reduction_box(meta, input, dim, keepdim, reduction) if k in used else None
             for k, (meta, reduction) in enumerate(zip(result, (rtype, "arg" + rtype)))]
    return type(result)(items)


def _items_used(node, result: tuple) -> set[int]:
    """The positions of a tuple-valued node's items that its users read, by index or by field
    name; all of them where a user takes the tuple whole (an output, a call)."""
    fields = list(getattr(type(result), "__match_args__", ()))
    used = set()
    for user in node.users:
        item = user.args[1] if (user.op == "call_function" and user.target in (operator.getitem, getattr)
                                and len(user.args) == 2 and user.args[0] is node) else None
        if type(item) is int:
            used.add(item % len(result))
        elif isinstance(item, str) and item in fields:
            used.add(fields.index(item))
        else:
            return set(range(len(result)))
    return used


@register([getattr], "obj, name")
def _getattr(node, values, obj, name):
    """A field of a named tuple a lowering returned (max(dim)'s values, indices)."""
    if isinstance(obj, tuple) and name in getattr(type(obj), "__match_args__", ()):
        return getattr(obj, name)
    return NotImplemented


LOWERINGS[torch.max] = LOWERINGS["max"] = LOWERINGS[torch.Tensor.max] = _max_min("max", "maximum")
LOWERINGS[torch.min] = LOWERINGS["min"] = LOWERINGS[torch.Tensor.min] = _max_min("min", "minimum")


@register([torch.softmax, F.softmax, torch.Tensor.softmax, "softmax"], "input, dim=None, _stacklevel=3, dtype=None")
def _softmax(node, values, input, dim, _stacklevel, dtype):
    return _softmax_like(node, values, input, dim, dtype, log=False)


@register([torch.log_softmax, F.log_softmax, torch.Tensor.log_softmax, "log_softmax"],
          "input, dim=None, _stacklevel=3, dtype=None")
def _log_softmax(node, values, input, dim, _stacklevel, dtype):
    return _softmax_like(node, values, input, dim, dtype, log=True)


def _softmax_like(node, values, input, dim, dtype, log):
    meta = _meta(node, values)
    if dim is None or dtype is not None or meta is None or not meta.dtype.is_floating_point:
        return NotImplemented
    shape, device, program = list(input.shape), input.device, input.program
    # in the compute dtype, rounded once at the end, as eager's kernels keep a float16 or
    # bfloat16 row's exponentials and their sum
    cd = compute_dtype(meta.dtype)
    m = _reduce(input, dim, "max")
    shifted = _pw(program, shape, cd, device, ops.sub, [input, m], "sub")
    e = _pw(program, shape, cd, device, ops.exp, [shifted], "exp")
    s = _reduce(e, dim, "sum")
    if log:
        return _pw(program, shape, meta.dtype, device, lambda a, b: ops.sub(a, ops.log(b)), [shifted, s], "log_softmax",
                   common=cd)
    # times the reciprocal of the row's sum, as ATen's CPU kernel: one division per row
    # (hoisted out of the row's loop), not one per element
    return _pw(program, shape, meta.dtype, device, lambda a, b: ops.mul(a, ops.reciprocal(b)), [e, s], "softmax",
               common=cd)


@register([F.layer_norm], "input, normalized_shape, weight=None, bias=None, eps=1e-05")
def _layer_norm(node, values, input, normalized_shape, weight, bias, eps):
    meta = _meta(node, values)
    if meta is None or not meta.dtype.is_floating_point:
        return NotImplemented
    shape, device, program, dt = list(input.shape), input.device, input.program, meta.dtype
    dims = list(range(len(shape) - len(normalized_shape), len(shape)))
    # in the compute dtype throughout, rounded once at the end: eager's kernels keep a float16
    # or bfloat16 row's mean and variance in float32 (rounded, a row about 1000 loses its
    # deviations)
    cd = compute_dtype(dt)
    mean = _reduce(input, dims, "mean", cd)
    centered = _pw(program, shape, cd, device, ops.sub, [input, mean], "sub")
    var = _reduce(_pw(program, shape, cd, device, lambda c: ops.mul(c, c), [centered], "square"), dims, "mean")
    out = _pw(program, shape, cd, device,
              lambda c, v: ops.mul(c, ops.rsqrt(ops.add(v, ops.constant(eps, cd)))),
              [centered, var], "normalize")
    if weight is not None:
        out = _pw(program, shape, cd, device, ops.mul, [out, weight], "mul")
    if bias is not None:
        out = _pw(program, shape, cd, device, ops.add, [out, bias], "add")
    return out if cd == dt else _pw(program, shape, dt, device, lambda v: v, [out], "to_dtype", common=cd)


@register([torch.var, torch.Tensor.var, "var", torch.std, torch.Tensor.std, "std"],
          "input, dim=None, unbiased=None, keepdim=False, *, correction=None")
def _var(node, values, input, dim, unbiased, keepdim, correction):
    """var = sum((x - mean)^2) / max(n - correction, 0), as PyTorch divides (a row of n <=
    correction elements gives inf, or NaN where every element is the same): two reductions
    over the same rows (one kernel after fuse-rows), then a per-row division; std takes its
    square root. On a CPU, PyTorch accumulates float32 and half statistics in double, so a
    variance of values near 1e19 (squares near 1e38) does not overflow: so do we. (Its CUDA
    kernels accumulate in float32, and so do ours on a GPU.)"""
    dim, unbiased = _without_dim(dim, unbiased)
    return _variance(_meta(node, values), input, dim, unbiased, keepdim, correction, _origin(node) == "std")


@register([torch.var_mean, "var_mean"], "input, dim=None, unbiased=None, keepdim=False, *, correction=None")
def _var_mean(node, values, input, dim, unbiased, keepdim, correction):
    """(var, mean): the mean the variance is computed about is the one returned (on a GPU; on a
    CPU the variance's is accumulated in double, eager's too)."""
    metas = values[node]
    dim, unbiased = _without_dim(dim, unbiased)
    if not (isinstance(metas, tuple) and len(metas) == 2 and all(isinstance(m, torch.Tensor) for m in metas)):
        return NotImplemented
    var = _variance(metas[0], input, dim, unbiased, keepdim, correction, False)
    if var is NotImplemented:
        return NotImplemented
    mean = _reduction_box(metas[1], input, _variance_dims(input, dim), keepdim, "mean")
    return NotImplemented if mean is NotImplemented else (var, mean)


def _without_dim(dim, unbiased) -> tuple:
    """(dim, unbiased) of var(x, unbiased), std(x, unbiased) and var_mean(x, unbiased), the
    overloads without dim, whose bool lands in dim's place: (None, that bool)."""
    return (None, dim) if isinstance(dim, bool) else (dim, unbiased)


def _variance_dims(input: TensorBox, dim) -> list:
    """The dims a variance reduces: dim None or empty is every dimension (as for sum and mean)."""
    ndim = len(input.shape)
    return ir.wrap_dims(dim if dim not in (None, [], ()) else range(ndim), ndim)


def _variance(meta, input, dim, unbiased, keepdim, correction, is_std):
    if meta is None or not isinstance(input, TensorBox) or not input.dtype.is_floating_point:
        return NotImplemented
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    dims = _variance_dims(input, dim)
    n = math.prod(input.shape[d] for d in dims)
    device, program = input.device, input.program
    stats = torch.float64 if device.type == "cpu" else compute_dtype(input.dtype)
    total = _squared_deviations(input, _reduce(input, dims, "mean", stats), dims, keepdim, list(meta.shape))
    if ir.is_symbolic(n):
        if not ir.provably_nonneg(n - correction - 1):
            return NotImplemented

        def divisor():      # a size known only when the kernel runs
            return ops.size_value(ir.size_expr(n - correction), stats)
    else:
        def divisor():
            return ops.constant(float(max(n - correction, 0)), stats)

    def finish(v):
        v = ops.truediv(v, divisor())
        return ops.sqrt(v) if is_std else v
    return _pw(program, ir.shape_of(meta), meta.dtype, device, finish, [total], "std" if is_std else "var",
               common=stats)


@register([F.batch_norm], "input, running_mean, running_var, weight=None, bias=None, training=False, "
          "momentum=0.1, eps=1e-05")
def _batch_norm(node, values, input, running_mean, running_var, weight, bias, training, momentum, eps):
    """(x - mean) * rsqrt(var + eps) * weight + bias per channel (dim 1): one pointwise
    expression over the running statistics (inference) or over the batch's (training without
    running statistics; with them, functionalization made it `batch_norm_training`)."""
    if not isinstance(input, TensorBox) or len(input.shape) < 2 or (weight is None and bias is not None):
        return NotImplemented
    ndim = len(input.shape)
    if training:
        if running_mean is not None or running_var is not None:
            return NotImplemented
        stats = _batch_statistics(input, None, None, momentum)
        if stats is NotImplemented:
            return NotImplemented
        mean, var, _, _ = stats
    elif isinstance(running_mean, TensorBox) and isinstance(running_var, TensorBox):
        mean, var = _channel_view(running_mean, ndim), _channel_view(running_var, ndim)
    else:
        return NotImplemented
    return _normalized(node, values, input, mean, var, weight, bias, eps)


@register([aliasing.batch_norm_training], "input, running_mean, running_var, weight=None, bias=None, "
          "momentum=0.1, eps=1e-05")
def _batch_norm_training(node, values, input, running_mean, running_var, weight, bias, momentum, eps):
    """Batch norm in training, with the new running statistics as values (what F.batch_norm
    writes into them): -> (output, new running mean, new running variance)."""
    if not isinstance(input, TensorBox) or len(input.shape) < 2 or (weight is None and bias is not None):
        return NotImplemented
    stats = _batch_statistics(input, running_mean, running_var, momentum)
    if stats is NotImplemented:
        return NotImplemented
    mean, var, new_mean, new_var = stats
    return _normalized(node, values, input, mean, var, weight, bias, eps), new_mean, new_var


def _normalized(node, values, input, mean, var, weight, bias, eps):
    """(x - mean) * rsqrt(var + eps) * weight + bias, per channel, as the node's (first) result."""
    ndim = len(input.shape)
    parts = [input, mean, var] + [_channel_view(p, ndim) for p in (weight, bias) if p is not None]
    meta = values[node][0] if isinstance(values[node], tuple) else values[node]
    if not isinstance(meta, torch.Tensor) or meta.device != input.device:
        return NotImplemented

    def fn(x, m, v, w=None, b=None):
        y = ops.mul(ops.sub(x, m), ops.rsqrt(ops.add(v, ops.constant(eps, compute_dtype(meta.dtype)))))
        y = ops.mul(y, w) if w is not None else y
        return ops.add(y, b) if b is not None else y
    return _pw(input.program, ir.shape_of(meta), meta.dtype, meta.device, fn, parts, _origin(node))


def _batch_statistics(input, running_mean, running_var, momentum):
    """Training batch norm's statistics, as (1, C, 1, ...) views: the mean and the biased
    variance over every dim but the channel's, computed in float32 for half inputs; and, with
    running statistics, their new values as PyTorch computes them: (1 - momentum) * running
    + momentum * batch, with the unbiased variance (else None). -> (mean, var, new running
    mean, new running var). Reductions run over a channels-first view, so the two reductions
    and both updates share one kernel (fuse-rows). Falls back for a cumulative average
    (momentum None), a single value per channel (eager raises), and running statistics that
    are not both tensors."""
    track = running_mean is not None or running_var is not None
    if track and not (isinstance(momentum, (int, float)) and isinstance(running_mean, TensorBox)
                      and isinstance(running_var, TensorBox)):
        return NotImplemented
    shape, program, device = list(input.shape), input.program, input.device
    channels, ndim = shape[1], len(shape)
    n = math.prod(shape) // channels if channels else 0
    if not isinstance(n, int) or n <= 1:
        # (one value per channel: eager raises; a count of size symbols: PyTorch's kernel)
        return NotImplemented
    stats_dtype = compute_dtype(input.dtype)
    channels_first = _view(input, [channels, shape[0], *shape[2:]],
                           lambda idx: [idx[1], idx[0], *idx[2:]], "permute", aliases=False)
    dims = list(range(1, ndim))
    mean = _reduce(channels_first, dims, "mean", stats_dtype)                # (C, 1, ...)
    total = _squared_deviations(channels_first, mean, dims, True, list(mean.shape))
    per_channel = [Index()] * (ndim - 1)
    if track:
        def update(box, stat, scale):
            cd = compute_dtype(box.dtype)

            def fn(r, s):
                return ops.add(ops.mul(r, ops.constant(1.0 - momentum, cd)),
                               ops.mul(s, ops.constant(momentum * scale, cd)))
            vector = _view(stat, [channels], lambda idx: [idx[0], *per_channel], "view", aliases=False)
            return _pw(program, [channels], box.dtype, device, fn, [box, vector], "running stats")
        new_mean = update(running_mean, mean, 1.0)
        new_var = update(running_var, total, 1.0 / (n - 1))
    else:
        new_mean = new_var = None
    var = _pw(program, list(total.shape), stats_dtype, device,
              lambda s: ops.mul(s, ops.constant(1.0 / n, stats_dtype)), [total], "var")
    # (C, 1, ...) -> (1, C, 1, ...): the channel back at dim 1, to broadcast against the input
    return tuple(_view(s, [1, channels] + [1] * (ndim - 2), lambda idx: [idx[1], *per_channel], "view",
                       aliases=False) for s in (mean, var)) + (new_mean, new_var)


def _channel_view(box, ndim):
    """A (C,) vector viewed as (1, C, 1, ...) for broadcasting against (N, C, ...)."""
    shape = [1, box.shape[0]] + [1] * (ndim - 2)
    return _view(box, shape, lambda idx: [idx[1]], "view", aliases=False)


# --------------------------------------------------------------------------- random numbers

RANDOM_REASON = "random numbers: PyTorch's generator, in eager's order (config.fallback_random)"


@register([F.dropout, torch.dropout, "dropout"], "input, p=0.5, training=True, inplace=False")
def _dropout(node, values, input, p, training, inplace):
    """Dropout is the identity in evaluation mode (or with p = 0). In training, PyTorch's own
    kernel (the default), or x * (rand > p) / (1 - p) made in the kernel that reads it (with
    config.fallback_random off)."""
    if inplace:
        return NotImplemented
    if not training or p == 0:
        return _cast(node, values, input)
    meta = _meta(node, values)
    if config.fallback_random or meta is None or not meta.dtype.is_floating_point \
            or not isinstance(p, float) or not 0 < p < 1:
        return NotImplemented
    noise = _random_values(input.program, meta, "rand")
    cd = compute_dtype(meta.dtype)

    def fn(x, r):
        kept = ops.to_dtype(ops.gt(r, ops.constant(p, cd)), cd, torch.bool)
        return ops.mul(ops.mul(x, kept), ops.constant(1 / (1 - p), cd))
    return _pointwise_box(node, values, fn, [input, noise])


@register([torch.rand_like, torch.randn_like], "input, *, dtype=None, layout=None, device=None, "
          "pin_memory=False, requires_grad=False, memory_format=torch.preserve_format")
def _rand_like(node, values, input, dtype, layout, device, pin_memory, requires_grad, memory_format):
    """rand_like and randn_like made in the kernels that read them (with config.fallback_random
    off; by default PyTorch's kernel draws them). torch.rand(sizes) and torch.randn(sizes)
    stay PyTorch's kernels either way."""
    meta = _meta(node, values)
    if config.fallback_random or meta is None or not meta.dtype.is_floating_point \
            or not isinstance(input, TensorBox) or meta.device != input.device:
        return NotImplemented
    return _random_values(input.program, meta, "randn" if node.target is torch.randn_like else "rand")


@register([torch.bernoulli, "bernoulli"], "input, p=None, *, generator=None")
def _bernoulli(node, values, input, p, generator):
    """bernoulli(probabilities) and x.bernoulli(p): rand < p, made in the kernel (with
    config.fallback_random off)."""
    meta = _meta(node, values)
    if config.fallback_random or meta is None or generator is not None or not isinstance(input, TensorBox) \
            or not (p is None or isinstance(p, float)):
        return NotImplemented
    noise = _random_values(input.program, meta, "rand", torch.float32)

    def fn(x, r):
        prob = x if p is None else ops.constant(p, torch.float32)
        return ops.to_dtype(ops.lt(r, prob), meta.dtype, torch.bool)
    return _pw(input.program, ir.shape_of(meta), meta.dtype, meta.device, fn, [input, noise], "bernoulli",
               common=torch.float32)


def _random_values(program, meta, kind: str, dtype=None) -> TensorBox:
    """Random numbers of meta's shape (ops.rand or ops.randn), from a seed PyTorch's generator
    draws when the graph runs (one draw per random op: the only use of that generator), and
    each element's position: a pure function of both, so a kernel may compute it wherever
    it is needed (it is not stored)."""
    dtype = dtype or meta.dtype
    shape, device = ir.shape_of(meta), meta.device
    seed = TensorBox(ir.Extern(program.new_name("buf"), torch.randint, (2**62, (1,)), {"device": device},
                               [1], [1], torch.int64, device,
                               reason="a seed for random numbers made in kernels (config.fallback_random)",
                               meta_value=torch.empty(1, dtype=torch.int64, device="meta")), program)
    load_seed, strides = seed.make_loader(), ir.contiguous_strides(shape)

    def inner_fn(idx):
        offset = ops.index_expr(ir.flat_index(idx, strides), torch.int32)
        value = getattr(ops, kind)(load_seed([Index()]), offset)
        if kind == "rand" and dtype.itemsize < 4:
            # a draw just below 1 would round up to 1.0 in half precision: rand is in [0, 1)
            value = ops.minimum(value, ops.constant(1 - torch.finfo(dtype).eps / 2, torch.float32))
        return ops.to_dtype(value, dtype, torch.float32)
    return TensorBox(ir.Pointwise(shape, dtype, device, inner_fn, kind), program, [seed])


def _reduce(box, dims, rtype, dtype=None):
    """A keepdim reduction of box over dims (for composite lowerings), of box's dtype unless
    another is given."""
    dims = ir.wrap_dims(dims, len(box.shape))
    out_shape = [1 if d in dims else s for d, s in enumerate(box.shape)]
    meta = types.SimpleNamespace(shape=out_shape, dtype=dtype or box.dtype, device=box.device)
    result = _reduction_box(meta, box, dims, True, rtype)
    if result is NotImplemented:
        raise _NotLowered(f"{rtype} over {dims} of {box.shape}")
    return result


def _pw(program, shape, dtype, device, fn, inputs, origin, common=None):
    """out[i] = fn(inputs broadcast to shape, at i), the inputs converted to `common` (default:
    dtype) and computed in its compute dtype; NotImplemented if an input is neither a tensor
    nor a Python number."""
    loaders = [_as_index_value(x, shape, common or dtype) for x in inputs]
    if any(l is None for l in loaders):
        return NotImplemented

    def inner_fn(idx):
        return fn(*[l(idx) for l in loaders])
    return TensorBox(ir.Pointwise(shape, dtype, device, inner_fn, origin), program,
                     [x for x in inputs if isinstance(x, TensorBox)])


def copy_of(box: TensorBox) -> TensorBox:
    """A new value equal to box (a tensor of its own, as eager's second `x.sum()` is)."""
    return _pw(box.program, box.shape, box.dtype, box.device, lambda x: x, [box], "clone")


# --------------------------------------------------------------------------- views

def _view_box(node, values, input, index_map):
    """A view: out[idx] = input[index_map(idx)]; no data moves."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox):
        return NotImplemented
    return _view(input, ir.shape_of(meta), index_map, _origin(node))


def _view(input, shape, index_map, origin, aliases=True):
    """A view of `shape` over input (same dtype and device): out[idx] = input[index_map(idx)].
    aliases=False for a lowering's internal re-indexing, which no user code can see."""
    load = input.make_loader()
    data = ir.Pointwise(shape, input.dtype, input.device, lambda idx: load(index_map(idx)), origin,
                        aliases=aliases)
    return TensorBox(data, input.program, [input])


def _reshape_map(in_shape, out_shape):
    squeeze_in = [s for s in in_shape if s != 1]
    if squeeze_in == [s for s in out_shape if s != 1]:
        # only size-1 dims inserted or removed: map dims directly, no division
        out_pos = [d for d, s in enumerate(out_shape) if s != 1]

        def f(idx):
            it = iter(out_pos)
            return [Index() if s == 1 else idx[next(it)] for s in in_shape]
        return f
    groups = _reshape_groups(in_shape, out_shape)
    if groups is None:
        out_strides = ir.contiguous_strides(out_shape)
        return lambda idx: ir.unflatten(ir.flat_index(idx, out_strides), in_shape)

    def f(idx):
        src = [Index() for _ in in_shape]         # (size-1 dims of the input: index 0)
        for ins, outs in groups:
            flat = ir.flat_index([idx[d] for d in outs], ir.contiguous_strides([out_shape[d] for d in outs]))
            parts = [flat] if len(ins) == 1 else ir.unflatten(flat, [in_shape[d] for d in ins])
            for d, part in zip(ins, parts):
                src[d] = part
        return src
    return f


def _reshape_groups(in_shape, out_shape):
    """A reshape as groups of consecutive dims (input dims, output dims) whose sizes have the
    same product, size-1 dims left out: (8, 64, 256) -> (8, 64, 8, 32) is [0]-[0], [1]-[1],
    [2]-[2, 3]. Each group is reindexed on its own, so a split dim is read at 32*i + j, with
    no division: a later slice (x[..., 16:], rotary embeddings) stays a plain offset the
    kernel loads contiguously, where one flat index over all dims is divided and taken
    modulo every size and a slice's offset then defeats the simplification. None where sizes
    are symbolic or zero."""
    if any(ir.is_symbolic(s) or s == 0 for s in (*in_shape, *out_shape)):
        return None
    ins = [d for d, s in enumerate(in_shape) if s != 1]
    outs = [d for d, s in enumerate(out_shape) if s != 1]
    groups, i, j = [], 0, 0
    while i < len(ins) and j < len(outs):
        gi, gj = [ins[i]], [outs[j]]
        pi, pj = in_shape[ins[i]], out_shape[outs[j]]
        while pi != pj:
            if pi < pj:
                i += 1
                gi.append(ins[i])
                pi *= in_shape[ins[i]]
            else:
                j += 1
                gj.append(outs[j])
                pj *= out_shape[outs[j]]
        groups.append((gi, gj))
        i, j = i + 1, j + 1
    return groups


@register(["view", "reshape", torch.reshape, "flatten", torch.flatten, "unsqueeze", torch.unsqueeze,
           "squeeze", torch.squeeze, "view_as", "reshape_as", "unflatten"],
          "input, *args, shape=None, start_dim=None, end_dim=None, dim=None, sizes=None, other=None")
def _reshape(node, values, input, args, shape, start_dim, end_dim, dim, sizes, other):
    """The result's sizes are the traced value's, however the call gave them (flatten's
    start_dim=1 by keyword, as a classifier's head writes it)."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox) or meta.dtype != input.dtype:
        return NotImplemented         # (x.view(torch.int32): the same bits as another dtype)
    return _view_box(node, values, input, _reshape_map(list(input.shape), ir.shape_of(meta)))


@register(["permute", torch.permute], "input, *dims")
def _permute(node, values, input, dims):
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = dims[0]
    ndim = len(input.shape)
    dims = [ir.wrap_dim(d, ndim) for d in dims] if ndim else []

    def f(idx):
        src = [None] * ndim
        for i, d in enumerate(dims):
            src[d] = idx[i]
        return src
    return _view_box(node, values, input, f)


@register(["transpose", torch.transpose, "swapaxes", torch.swapaxes], "input, dim0, dim1")
def _transpose(node, values, input, dim0, dim1):
    ndim = len(input.shape)
    a, b = ir.wrap_dim(dim0, ndim), ir.wrap_dim(dim1, ndim)

    def f(idx):
        idx = list(idx)
        if ndim:                          # (a 0-dim tensor's transpose(0, -1) is itself)
            idx[a], idx[b] = idx[b], idx[a]
        return idx
    return _view_box(node, values, input, f)


@register(["t", torch.t], "input")
def _t(node, values, input):
    return _view_box(node, values, input, lambda idx: list(idx)[::-1])


@register(["expand", "expand_as", torch.broadcast_to, "broadcast_to"], "input, *sizes, size=None")
def _expand(node, values, input, sizes, size):
    meta = _meta(node, values)
    if meta is None:
        return NotImplemented
    shape = ir.shape_of(meta)
    src = list(input.shape)
    off = len(shape) - len(src)
    return _view_box(node, values, input,
                     lambda idx: [Index() if src[d] == 1 else idx[d + off] for d in range(len(src))])


@register(["as_strided", torch.as_strided], "input, size, stride, storage_offset=None")
def _as_strided(node, values, input, size, stride, storage_offset):
    """A view of the memory under `input`, not of its elements: eager reads the storage of
    the tensor the input's views were taken of (Longformer's overlapping chunks of a reshaped
    projection). So it is a view of the buffer of the value the input's views read, stored in
    the layout eager's storage has. Where that cannot be shown, the graph runs on PyTorch's
    kernels (NotImplementedError): an argument realized as minicompile lays it out is other
    memory, and as_strided of it other values."""
    arg = node.args[0] if node.args else node.kwargs.get("input")
    traced, result = values.get(arg), values.get(node)
    if not isinstance(input, TensorBox) or not isinstance(traced, torch.Tensor):
        return NotImplemented
    if isinstance(input.data, ir.InputBuffer):
        return NotImplemented        # the caller's own tensor, passed as it is: eager's memory

    def refuse(why):
        raise NotImplementedError(f"{_origin(node)}: as_strided {why}")
    base = viewed_value(input)
    storage = traced._base if traced._base is not None else traced
    if _has_symbolic_sizes(result) or not _owns_its_storage(storage) or \
            isinstance(base.data, (ir.InputBuffer, ir.ViewOfBuffer)):
        refuse("of memory minicompile may lay out otherwise than eager")
    if not all(isinstance(v, int) or isinstance(v, TensorBox) and _computed_from_constants(v)
               for v in (*size, *stride, storage_offset or 0)):
        refuse("with sizes computed from the inputs")
    # the sizes as eager used them (Longformer's are 0-dim tensors of constants)
    size, stride, offset = list(result.shape), list(result.stride()), result.storage_offset()
    base.realize(list(storage.stride()))
    if list(base.shape) != list(storage.shape) or not base.has_strides(list(storage.stride())):
        refuse("of a value laid out otherwise than eager's storage")
    if base is not input:
        view = as_view_of_buffer(input)       # where the input's elements are in that buffer
        if view is None or view.base.name != base.name or view.offset != traced.storage_offset() or \
                any(a != b and n > 1 for a, b, n in zip(view.stride, traced.stride(), traced.shape)):
            refuse("of views minicompile cannot follow to eager's storage")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if min(stride, default=0) < 0 or 0 in size or last >= storage.numel():
        refuse("beyond the value's memory")
    return TensorBox(ir.ViewOfBuffer(base, size, stride, offset), input.program, [base])


def _computed_from_constants(box: TensorBox) -> bool:
    """The value reads no graph input (a size worked out with torch.div of Python ints)."""
    return not isinstance(box.data, (ir.InputBuffer, ir.ViewOfBuffer)) and \
        getattr(box.data, "reason", "") != RANDOM_REASON and \
        all(_computed_from_constants(r) for r in box.reads)


def _owns_its_storage(t: torch.Tensor) -> bool:
    """The tensor is all of its storage, densely (so its layout is the storage's)."""
    return not _has_symbolic_sizes(t) and t.storage_offset() == 0 and t.numel() > 0 and \
        ir.is_dense(list(t.shape), list(t.stride())) and \
        t.untyped_storage().nbytes() == t.numel() * t.element_size()


@register([operator.getitem], "input, item")
def _getitem(node, values, input, item):
    """Basic indexing (ints, slices, None, Ellipsis) as a view; anything else falls back.
    An item of a tuple lowering returned (split, chunk, unbind) is that tuple's item."""
    if isinstance(input, (tuple, list)) and isinstance(item, (int, slice)):
        return input[item]
    if not isinstance(input, TensorBox):
        return NotImplemented
    if isinstance(input.data, ir.Extern):
        return NotImplemented       # indexing the tuple an Extern returned: fallback handles it
    items = item if isinstance(item, tuple) else (item,)
    if any(isinstance(i, TensorBox) for i in items) \
            and all(isinstance(i, TensorBox) or i == slice(None) for i in items):
        return _indexed_by_tensors(node, values, input, items)
    if not all(isinstance(i, (int, slice, type(None), type(Ellipsis))) and not isinstance(i, bool) for i in items):
        return NotImplemented        # (x[True] is a new dim of size 1, not x[1])
    shape = list(input.shape)
    n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
    # each `...` stands for the dims no other index takes (PyTorch, unlike numpy, takes a
    # second one: it skips as many again, past the last dim where nothing follows)
    items = sum(((slice(None),) * (len(shape) - n_real) if i is Ellipsis else (i,) for i in items), ())
    while sum(1 for i in items if i is not None) > len(shape) and items[-1] == slice(None):
        items = items[:-1]
    items = items + (slice(None),) * (len(shape) - sum(1 for i in items if i is not None))
    plan, d = [], 0      # per output dim: ("take", src_dim, start, step) ; fixed picks listed apart
    fixed = {}
    for it in items:
        if it is None:
            plan.append(("new",))
        elif isinstance(it, int):
            fixed[d] = _position(it, shape[d])
            if fixed[d] is None:
                return NotImplemented
            d += 1
        elif ir.is_symbolic(shape[d]) or any(ir.is_symbolic(p) for p in (it.start, it.stop, it.step)):
            # a dynamic dimension: only what holds for every size (the slice's length is the
            # traced value's, whose guards the shape environment keeps)
            step = 1 if it.step is None else it.step
            start = it.start or 0          # from 0 up: the slice's length bounds every read
            if isinstance(start, int) and start < 0:
                start = _position(start, shape[d])
            elif isinstance(start, sympy.Basic) and not start.is_nonnegative:
                # x[:, -T:]: counted from the end, where that is a position for every size
                from_end = sympy.simplify(shape[d] + start) if start.is_negative else None
                if from_end is None or not from_end.is_nonnegative:
                    return NotImplemented
                start = from_end
            if not isinstance(step, int) or step <= 0 or not isinstance(start, (int, sympy.Basic)):
                return NotImplemented
            plan.append(("take", d, start, step))
            d += 1
        else:
            start, _, step = it.indices(shape[d])
            if step <= 0:
                return NotImplemented
            plan.append(("take", d, start, step))
            d += 1

    def f(idx):
        src = [None] * len(shape)
        for dim, val in fixed.items():
            src[dim] = Index({}, val)
        for out_i, p in enumerate(plan):
            if p[0] == "take":
                src[p[1]] = idx[out_i] * p[3] + p[2]
        return src
    return _view_box(node, values, input, f)


def _indexed_by_tensors(node, values, input: TensorBox, items) -> TensorBox:
    """x[i0, i1, ...] with integer tensors for adjacent dims, full slices around them (a mask's
    rows picked per batch, as Hugging Face builds attention masks; the gathers that training
    graphs make of padding by reflection): out[a..., b..., c...] = x[a..., i0[b...], i1[b...],
    c...] with the index tensors broadcast together (b), each index loaded in the kernel
    (negative ones count from the end; one outside the dim raises IndexError, as in eager)."""
    meta = _meta(node, values)
    picks = [d for d, i in enumerate(items) if isinstance(i, TensorBox)]
    first, n = picks[0], len(picks)
    if meta is None or len(items) > len(input.shape) or picks != list(range(first, first + n)) \
            or any(items[d].dtype not in (torch.int64, torch.int32) or items[d].device != input.device for d in picks) \
            or any(ir.is_symbolic(s) for s in (*input.shape, *meta.shape)):
        return NotImplemented           # (tensors apart from each other put their dims first)
    out_shape = ir.shape_of(meta)
    k = first + len(out_shape) - (len(input.shape) - n)     # the broadcast dims are [first, k)
    positions = [_as_index_value(items[d], out_shape[first:k], torch.int64) for d in picks]
    load = input.make_loader()

    def inner_fn(idx):
        picked = []
        for position, size in zip(positions, input.shape[first:first + n]):
            v = position(list(idx[first:k]))
            v = ops.where(ops.lt(v, _int64(0)), ops.add(v, _int64(size)), v)
            picked.append(ops.indirect_indexing(v, size))
        return load([*idx[:first], *picked, *idx[k:]])
    return TensorBox(ir.Pointwise(out_shape, meta.dtype, meta.device, inner_fn, "indexing"),
                     input.program, [input, *items])


@register([torch.slice_scatter], "input, src, dim=0, start=None, end=None, step=1")
def _slice_scatter(node, values, input, src, dim, start, end, step):
    """`input` with src in positions [start, end) of dim (the gradient of a slice, in training:
    Llama's rotate_half): src where the position is in the slice, else input, one kernel."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox) or not isinstance(src, TensorBox) or step != 1 \
            or not input.dtype == src.dtype == meta.dtype or src.device != input.device \
            or any(ir.is_symbolic(s) for s in (*input.shape, *src.shape)) \
            or not all(v is None or isinstance(v, int) for v in (start, end)):
        return NotImplemented
    d = ir.wrap_dim(dim, len(input.shape))
    first, last, _ = slice(start, end).indices(input.shape[d])
    if max(last - first, 0) != src.shape[d]:
        return NotImplemented
    load_input, load_src, cd = input.make_loader(), src.make_loader(), compute_dtype(meta.dtype)

    def inner_fn(idx):
        p = ops.index_expr(idx[d], torch.int64)
        inside = ops.logical_and(ops.ge(p, _int64(first)), ops.lt(p, _int64(last)))
        at = [*idx[:d], idx[d] + (-first), *idx[d + 1:]]
        return ops.where(inside, ops.masked(inside, lambda: load_src(at), ops.constant(0, cd)), load_input(list(idx)))
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, "slice_scatter"),
                     input.program, [input, src])


def _position(i, size):
    """Index i (negative counts from the end) of a dimension of `size`, or None when a
    symbolic size does not decide it for every value."""
    if not isinstance(i, int):
        return None
    if not ir.is_symbolic(size):
        return i % size if -size <= i < size else None
    if i >= 0:
        return i if ir.provably_nonneg(size - i - 1) else None
    return ir.size_expr(size + i) if ir.provably_nonneg(size + i) else None


# --------------------------------------------------------------------------- sizes

@register(["size"], "input, dim=None")
def _size(node, values, input, dim):
    """x.size(d) in the graph (the traced code read a dynamic size): the size itself, an int
    or a symbolic expression, for the ops that take it."""
    if not isinstance(input, TensorBox):
        return NotImplemented
    shape = list(input.shape)
    return tuple(shape) if dim is None else shape[ir.wrap_dim(dim, len(shape))]


@register(["numel", "nelement", torch.numel], "input")
def _numel(node, values, input):
    if not isinstance(input, TensorBox):
        return NotImplemented
    return ir.size_expr(math.prod(input.shape))


def size_arithmetic(target, args):
    """operator.add/sub/mul/floordiv/mod/neg/pow on sizes (ints and symbolic expressions): the
    result as a size, or None when these are not sizes."""
    if target not in _SIZE_OPS or len(args) != (1 if target is operator.neg else 2) or not all(
            (isinstance(a, int) and not isinstance(a, bool)) or ir.is_symbolic(a) for a in args):
        return None
    if target is operator.floordiv and any(map(ir.is_symbolic, args)):
        from torch.utils._sympy.functions import FloorDiv
        q = ir.divides(args[1], args[0])
        return q if q is not None else FloorDiv(*args)
    if target is operator.mod and any(map(ir.is_symbolic, args)):
        # torch.roll's start (n - shift) % n: Python's modulo, whose sign is the divisor's
        from torch.utils._sympy.functions import PythonMod
        return ir.size_expr(PythonMod(*args))
    return ir.size_expr(_SIZE_OPS[target](*args))


_SIZE_OPS = {operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
             operator.floordiv: operator.floordiv, operator.mod: operator.mod, operator.neg: operator.neg,
             operator.pow: operator.pow}


def scalar_arithmetic(program: ir.Program, target, args):
    """A float computed from sizes (a batch norm's `n / (n - 1)`, n a size symbol) or float
    inputs: a scalar argument of the kernels (ir.ScalarInput), which the wrapper computes from
    the sizes in Python, in the graph's order of operations (so to the bit as eager's Python
    computes it); its Python value where the sizes it reads were made static after the trace
    wrote it; or None when this is not such arithmetic."""
    spelling = ir.PYTHON_SPELLINGS.get(target)
    if spelling is None or len(args) != spelling.count("{}"):
        return None
    if all(type(a) in (int, float) for a in args):
        return target(*args)

    def operand(a):
        if isinstance(a, ir.ScalarInput):
            return a.scalar
        if ir.is_symbolic(a) or type(a) in (int, float):
            return f"({ir.render_size(a)})" if ir.is_symbolic(a) else repr(a)
        return None
    operands = [operand(a) for a in args]
    if None in operands or not any(ir.is_symbolic(a) or isinstance(a, ir.ScalarInput) for a in args):
        return None
    if target in (operator.add, operator.sub, operator.mul, operator.neg, operator.pow) and \
            not any(isinstance(a, (float, ir.ScalarInput)) for a in args):
        return None                      # (integer arithmetic on sizes: size_arithmetic's)
    return scalar_expression(program, spelling.format(*operands))


def scalar_expression(program: ir.Program, expr: str) -> ir.ScalarInput:
    """A kernel argument the wrapper computes in Python from the sizes and scalars."""
    name = f"scalar{len(program.scalars)}"
    program.scalars[name] = expr
    return ir.ScalarInput(name, name)


# the function and the method name their arguments differently (as keywords, each its own)
@register([torch.split], "tensor, split_size_or_sections, dim=0")
def _split(node, values, tensor, split_size_or_sections, dim):
    return _consecutive_views(node, values, tensor, dim)


@register([torch.Tensor.split, "split"], "input, split_size, dim=0")
def _split_method(node, values, input, split_size, dim):
    return _consecutive_views(node, values, input, dim)


@register([torch.chunk, torch.Tensor.chunk, "chunk"], "input, chunks, dim=0")
def _chunk(node, values, input, chunks, dim):
    return _consecutive_views(node, values, input, dim)


def _consecutive_views(node, values, input, dim):
    """split and chunk: a tuple of views, consecutive slices along dim. The sizes are those of
    the traced pieces (split's and chunk's rules for the last piece are PyTorch's, not ours)."""
    pieces = values.get(node)
    if not isinstance(input, TensorBox) or not isinstance(dim, int) or not input.shape \
            or not isinstance(pieces, (tuple, list)):
        return NotImplemented
    d = ir.wrap_dim(dim, len(input.shape))
    views, start = [], 0
    for piece in pieces:
        def index_map(idx, start=start):
            return [i + start if k == d else i for k, i in enumerate(idx)]
        views.append(_view(input, ir.shape_of(piece), index_map, _origin(node)))
        start = ir.size_expr(start + ir.size_expr(piece.shape[d]))
    return tuple(views)


@register([torch.unbind, torch.Tensor.unbind, "unbind"], "input, dim=0")
def _unbind(node, values, input, dim):
    """A tuple of views, one per position along dim, that dim removed."""
    if not isinstance(input, TensorBox) or not isinstance(dim, int) or not input.shape:
        return NotImplemented
    d = ir.wrap_dim(dim, len(input.shape))
    shape = input.shape[:d] + input.shape[d + 1:]
    return tuple(_view(input, list(shape), lambda idx, k=k: list(idx[:d]) + [Index({}, k)] + list(idx[d:]),
                       _origin(node))
                 for k in range(input.shape[d]))


@register([torch.cat, torch.concat, torch.concatenate], "tensors, dim=None, *, axis=None")
def _cat(node, values, tensors, dim, axis):
    """Concatenation along dim: input k fills positions [start_k, end_k) of that dim, read
    at the position less start_k. Empty inputs contribute nothing (PyTorch also skips the
    legacy 1-D empty tensor); dtypes promote as PyTorch's (the traced result's dtype).
    `axis` is NumPy's name for dim, which PyTorch also accepts (not both at once)."""
    meta = _meta(node, values)
    if dim is not None and axis is not None:
        return NotImplemented
    dim = dim if dim is not None else axis if axis is not None else 0
    if meta is None or meta.dim() == 0 or not isinstance(dim, int) or not isinstance(tensors, (list, tuple)):
        return NotImplemented
    d = dim % meta.dim()
    pieces, start = [], 0
    for t in tensors:
        if not isinstance(t, TensorBox):
            return NotImplemented
        if math.prod(t.shape) == 0:
            continue
        if len(t.shape) != meta.dim():
            return NotImplemented

        def index_map(idx, start=start):
            return [i + (-start) if k == d else i for k, i in enumerate(idx)]
        pieces.append((t, start, start + t.shape[d], index_map))
        start += t.shape[d]
    return _pieces_along(node, values, d, pieces)


@register([torch.stack], "tensors, dim=0")
def _stack(node, values, tensors, dim):
    """Stacking along a new dim: input k is the slice at position k of that dim."""
    meta = _meta(node, values)
    if meta is None or not isinstance(dim, int) or not isinstance(tensors, (list, tuple)) \
            or not all(isinstance(t, TensorBox) for t in tensors):
        return NotImplemented
    d = dim % meta.dim()

    def index_map(idx):
        return list(idx[:d]) + list(idx[d + 1:])
    return _pieces_along(node, values, d, [(t, k, k + 1, index_map) for k, t in enumerate(tensors)])


def _pieces_along(node, values, dim, pieces):
    """One pointwise value made of pieces side by side along dim: pieces are (box, start, end,
    index_map), and out[idx] = box[index_map(idx)] where start <= idx[dim] < end. Each box is
    read under a mask of its range (ops.masked), so no load leaves it, and the pieces are
    selected with where: one kernel that also computes the pieces (vertical fusion)."""
    meta = _meta(node, values)
    if meta is None or not pieces or meta.numel() == 0 or any(b.device != meta.device for b, *_ in pieces):
        return NotImplemented
    cd, size = compute_dtype(meta.dtype), ir.size_expr(meta.shape[dim])

    def inner_fn(idx):
        position = ops.index_expr(idx[dim], torch.int64)
        value = ops.constant(0, cd)
        for box, start, end, index_map in pieces:
            # (a bound that is a size symbol is checked: always right, only not needed when
            # it is the dim's own end or 0)
            conditions = ([ops.ge(position, ops.constant(start, torch.int64))] if start != 0 else []) + \
                         ([ops.lt(position, ops.constant(end, torch.int64))]
                          if ir.size_expr(end - size) != 0 else [])
            load, src = box.make_loader(), compute_dtype(box.dtype)

            def body(load=load, src=src, index_map=index_map):
                return ops.to_dtype(load(index_map(idx)), cd, src)
            if not conditions:
                value = body()
                continue
            mask = conditions[0] if len(conditions) == 1 else ops.logical_and(*conditions)
            value = ops.masked(mask, body, value)
        return value
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, _origin(node)),
                     pieces[0][0].program, [b for b, *_ in pieces])


@register([F.embedding], "input, weight, padding_idx=None, max_norm=None, norm_type=2.0, "
          "scale_grad_by_freq=False, sparse=False")
def _embedding(node, values, input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse):
    """F.embedding: max_norm renormalizes weight rows in place, left to PyTorch (padding_idx,
    scale_grad_by_freq and sparse only change the gradient)."""
    if max_norm is not None:
        return NotImplemented
    return _embedding_box(node, values, weight, input)


@register([torch.embedding], "weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False")
def _torch_embedding(node, values, weight, indices, padding_idx, scale_grad_by_freq, sparse):
    return _embedding_box(node, values, weight, indices)


def _embedding_box(node, values, weight, indices):
    """out[i..., j] = weight[indices[i...], j]: the row index is data, loaded in the kernel
    (ops.indirect_indexing), so the gather fuses with what computes the indices and with what
    consumes the rows. An index outside the table raises IndexError, as in eager."""
    meta = _meta(node, values)
    if meta is None or not isinstance(weight, TensorBox) or not isinstance(indices, TensorBox) \
            or len(weight.shape) != 2 or weight.shape[0] == 0 \
            or indices.dtype not in (torch.int64, torch.int32) or weight.device != indices.device:
        return NotImplemented
    k, rows = len(indices.shape), weight.shape[0]
    load_weight, load_index = weight.make_loader(), indices.make_loader()

    def inner_fn(idx):
        row = ops.indirect_indexing(load_index(list(idx[:k])), rows)
        return load_weight([row, idx[k]])
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, "embedding"),
                     weight.program, [weight, indices])


@register([torch.gather, "gather"], "input, dim, index, *, sparse_grad=False")
def _gather(node, values, input, dim, index, sparse_grad):
    """out[i..., j, k...] = input[i..., index[i..., j, k...], k...] along dim: the index loaded
    in the kernel, which fuses with what computes the input (a log_softmax whose chosen
    tokens are picked) and what reads the result. An index outside the dim raises
    RuntimeError, as eager's gather does on a CPU (negative ones too)."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox) or not isinstance(index, TensorBox) \
            or index.dtype not in (torch.int64, torch.int32) or index.device != input.device \
            or len(index.shape) != len(input.shape) or not input.shape \
            or any(ir.is_symbolic(s) for s in (*input.shape, *index.shape)):
        return NotImplemented
    d = ir.wrap_dim(dim, len(input.shape))
    load_input, load_index = input.make_loader(), index.make_loader()

    def inner_fn(idx):
        at = ops.indirect_indexing(load_index(list(idx)), input.shape[d], ir.RUNTIME_ERROR)
        return load_input([*idx[:d], at, *idx[d + 1:]])
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, "gather"),
                     input.program, [input, index])


# --------------------------------------------------------------------------- pooling

@register([F.max_pool2d, torch.max_pool2d], "input, kernel_size, stride=None, padding=0, dilation=1, "
          "ceil_mode=False, return_indices=False")
def _max_pool2d(node, values, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    """out[..., h, w] = max of input over the (dilated) window at (h*sh - ph, w*sw - pw): a
    pointwise value, as in Inductor, so it fuses with what computes its input (a batch norm and
    a relu) and with what reads it, instead of storing the input for PyTorch's kernel. Window
    positions outside the input (padding, ceil_mode's last window) are masked out; a NaN in
    the window gives NaN, as in eager. Large windows (over 25 elements) stay PyTorch's."""
    meta = _meta(node, values)
    window = None if meta is None or return_indices else _pool_window(input, meta, kernel_size, stride,
                                                                       padding, dilation)
    if window is None:
        return NotImplemented
    load, cd = input.make_loader(), compute_dtype(meta.dtype)

    def inner_fn(idx):
        result = None
        for _, _, value in window(idx, load, ops.constant(-math.inf, cd)):
            result = value if result is None else ops.maximum(result, value)
        return result
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, _origin(node)),
                     input.program, [input])


@register([torch.ops.aten.max_pool2d_with_indices.default],
          "input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False")
def _max_pool2d_with_indices(node, values, input, kernel_size, stride, padding, dilation, ceil_mode):
    """Training's max pooling: the maximum and where it is (h * W + w, for the backward), as
    two pointwise values over the same windows (one kernel after fuse-rows). Dilated windows
    stay PyTorch's."""
    return _maxima_and_places(node, values, input, kernel_size, stride, padding, dilation, offsets=False)


@register([custom_ops.max_pool2d_offsets], "input, kernel_size, stride, padding, ceil_mode")
def _max_pool2d_offsets(node, values, input, kernel_size, stride, padding, ceil_mode):
    """The maximum and its place in its window (i * kw + j, int8): custom_ops.py's."""
    return _maxima_and_places(node, values, input, kernel_size, stride, padding, 1, offsets=True)


def _maxima_and_places(node, values, input, kernel_size, stride, padding, dilation, offsets):
    """Eager's kernels scan a window by row, then column, and move to an element greater
    than the maximum so far, or NaN: the first of equal maxima, the last NaN; a window of -inf
    alone (or padding) points at its first element inside the input. The place is that
    element's index in the input plane, or (offsets) its place in the window."""
    metas = values[node]
    if not isinstance(metas, tuple) or _pair(dilation) != [1, 1]:
        return NotImplemented
    meta, place_meta = metas
    window = _pool_window(input, meta, kernel_size, stride, padding, dilation)
    if window is None or place_meta.dtype != (torch.int8 if offsets else torch.int64):
        return NotImplemented
    ((kh, kw), (sh, sw), (ph, pw)), width = custom_ops.pooling_sizes(kernel_size, stride, padding), input.shape[-1]
    load, cd = input.make_loader(), compute_dtype(meta.dtype)

    def maximum_and_place(idx):
        *_, oh, ow = idx
        start = [ops.index_expr(o * step + (-pad), torch.int64) for o, step, pad in ((oh, sh, ph), (ow, sw, pw))]
        first = [ops.maximum(s, _int64(0)) for s in start]
        if offsets:              # the first element inside the input, as a place in the window
            where = ops.add(ops.mul(ops.sub(first[0], start[0]), _int64(kw)), ops.sub(first[1], start[1]))
        else:
            where = ops.add(ops.mul(first[0], _int64(width)), first[1])
        best = ops.constant(-math.inf, cd)
        for (i, j), (h, w), value in window(idx, load, ops.constant(-math.inf, cd)):
            take = ops.logical_or(ops.gt(value, best), ops.isnan(value))
            best = ops.where(take, value, best)
            where = ops.where(take, _int64(i * kw + j) if offsets else ops.index_expr(h * width + w, torch.int64),
                              where)
        return best, ops.to_dtype(where, torch.int8, torch.int64) if offsets else where
    maxima = TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device,
                                    lambda idx: maximum_and_place(idx)[0], "max_pool2d"), input.program, [input])
    places = TensorBox(ir.Pointwise(ir.shape_of(place_meta), place_meta.dtype, meta.device,
                                    lambda idx: maximum_and_place(idx)[1],
                                    "max_pool2d offsets" if offsets else "max_pool2d indices"),
                       input.program, [input])
    return maxima, places


@register([custom_ops.max_pool2d_offsets_to_indices], "offsets, kernel_size, stride, padding, width")
def _max_pool2d_offsets_to_indices(node, values, offsets, kernel_size, stride, padding, width):
    """Offsets in windows (i * kw + j) as indices into the input plane, (h0 + i) * W + w0 + j;
    i counted by comparisons (i >= 1, i >= 2...: the window has a few rows), as integer
    division is not among the ops."""
    meta = _meta(node, values)
    if meta is None or not isinstance(offsets, TensorBox) or len(offsets.shape) < 2 \
            or any(ir.is_symbolic(s) for s in (*offsets.shape, width)):
        return NotImplemented
    (kh, kw), (sh, sw), (ph, pw) = custom_ops.pooling_sizes(kernel_size, stride, padding)
    load = offsets.make_loader()

    def inner_fn(idx):
        *_, oh, ow = idx
        at = ops.to_dtype(load(list(idx)), torch.int64, offsets.dtype)
        row = _int64(0)
        for i in range(1, kh):
            row = ops.add(row, ops.to_dtype(ops.ge(at, _int64(i * kw)), torch.int64, torch.bool))
        col = ops.sub(at, ops.mul(row, _int64(kw)))
        h = ops.add(ops.index_expr(oh * sh + (-ph), torch.int64), row)
        w = ops.add(ops.index_expr(ow * sw + (-pw), torch.int64), col)
        return ops.add(ops.mul(h, _int64(width)), w)
    indices = TensorBox(ir.Pointwise(ir.shape_of(meta), torch.int64, meta.device, inner_fn, "max_pool2d indices"),
                        offsets.program, [offsets])
    indices.window_offsets = types.SimpleNamespace(offsets=offsets, kernel=(kh, kw), stride=(sh, sw), padding=(ph, pw))
    return indices


def _pool_window(input, meta, kernel_size, stride, padding, dilation):
    """For a 2-D pooling of `input` to `meta`'s size: window(idx, load, outside) -> for each
    element of output idx's window, by row then column, ((i, j) its place in the window,
    (h, w) its position in the input, its value: `outside` where it lies outside the input). None where the pooling stays PyTorch's
    (not floating point, not 3 or 4 dims, a dynamic size, a window of over 25 elements)."""
    if not isinstance(input, TensorBox) or not input.dtype.is_floating_point or len(input.shape) not in (3, 4) \
            or any(ir.is_symbolic(s) for s in (*input.shape, *meta.shape)):
        return None
    (kh, kw), (sh, sw), (ph, pw) = custom_ops.pooling_sizes(kernel_size, stride, padding)
    dh, dw = _pair(dilation)
    if kh * kw > custom_ops.LARGEST_WINDOW:
        return None
    sizes, out_sizes, steps = input.shape[-2:], meta.shape[-2:], (sh, sw)

    def window(idx, load, outside):
        *lead, oh, ow = idx
        for i, j in [(i, j) for i in range(kh) for j in range(kw)]:
            pos, conditions = [], []
            for o, offset, step, size, out_size in zip((oh, ow), (i * dh - ph, j * dw - pw), steps, sizes, out_sizes):
                pos.append(o * step + offset)
                if offset < 0 or (out_size - 1) * step + offset >= size:      # may leave the input
                    p = ops.index_expr(pos[-1], torch.int64)
                    conditions += [ops.ge(p, _int64(0)), ops.lt(p, _int64(size))]
            if conditions:
                value = ops.masked(_all_of(conditions), lambda pos=pos: load([*lead, *pos]), outside)
            else:
                value = load([*lead, *pos])
            yield (i, j), tuple(pos), value
    return window


@register([torch.ops.aten.max_pool2d_with_indices_backward.default],
          "grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices")
def _max_pool2d_backward(node, values, grad_output, input, kernel_size, stride, padding, dilation,
                         ceil_mode, indices):
    """Training's max pooling backward: grad_input[..., h, w] is the sum of grad_output over
    the windows that cover (h, w) and whose maximum was there (`indices` holds h * W + w).
    Gathered, as a pointwise value (as Inductor does), rather than PyTorch's kernel, which
    fills the whole gradient with zeros and then scatters into it (on a CPU the fill is most
    of its time). The windows are visited in eager's order (by row, then column), so
    overlapping windows sum as eager's do. Dilated windows, and dtypes other than float32 and
    float64, stay PyTorch's."""
    meta = _meta(node, values)
    if meta is None or not all(isinstance(b, TensorBox) for b in (grad_output, indices)) \
            or meta.dtype not in (torch.float32, torch.float64) or grad_output.dtype != meta.dtype \
            or len(meta.shape) not in (3, 4) or len(grad_output.shape) != len(meta.shape) \
            or any(ir.is_symbolic(s) for s in (*meta.shape, *grad_output.shape)) or _pair(dilation) != [1, 1]:
        return NotImplemented
    (kh, kw), (sh, sw), (ph, pw) = custom_ops.pooling_sizes(kernel_size, stride, padding)
    width = meta.shape[-1]
    out_sizes = grad_output.shape[-2:]
    # the maxima's places in their windows, where the indices were computed from them (a
    # training graph's, autograd/joint.py): (h, w) was window (oh, ow)'s maximum where its place
    # there, (h - oh * sh + ph) * kw + (w - ow * sw + pw), is the one saved. One int32 multiply-add
    # against the indices' int64 arithmetic, which bounded the kernel by its instructions
    source = getattr(indices, "window_offsets", None)
    if source is not None and (source.kernel, source.stride, source.padding) != ((kh, kw), (sh, sw), (ph, pw)):
        source = None
    places = source.offsets if source is not None else indices
    load_grad, load_place = grad_output.make_loader(), places.make_loader()

    def windows(i, pad, step, k, out_size):
        """The windows along one dim that may cover position i, first to last: (the window's
        index, the conditions under which it exists and covers i)."""
        found = []
        for t in reversed(range(-(-k // step))):
            o = (i + pad) // step + (-t)
            conditions = [ops.lt(ops.index_expr((i + pad) % step + t * step, torch.int32), _int32(k))] \
                if t * step + step > k else []
            if t > 0:
                conditions.append(ops.ge(ops.index_expr(o, torch.int32), _int32(0)))
            conditions.append(ops.lt(ops.index_expr(o, torch.int32), _int32(out_size)))
            found.append((o, conditions))
        return found

    def chosen(at, h, w, oh, ow):
        """Whether input element (h, w) is window `at`'s maximum."""
        if source is not None:
            place = (h + oh * -sh + ph) * kw + w + ow * -sw + pw
            return ops.eq(ops.to_dtype(load_place(at), torch.int32, places.dtype), ops.index_expr(place, torch.int32))
        here = ops.index_expr(h * width + w, torch.int64)
        return ops.eq(ops.to_dtype(load_place(at), torch.int64, places.dtype), here)

    def inner_fn(idx):
        *lead, h, w = idx
        total = ops.constant(0, meta.dtype)
        for oh, rows in windows(h, ph, sh, kh, out_sizes[0]):
            for ow, cols in windows(w, pw, sw, kw, out_sizes[1]):
                at = [*lead, oh, ow]

                def term(at=at, oh=oh, ow=ow):
                    return ops.where(chosen(at, h, w, oh, ow), load_grad(at), ops.constant(0, meta.dtype))
                total = ops.add(total, ops.masked(_all_of(rows + cols), term, ops.constant(0, meta.dtype)))
        return total
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, "max_pool2d_backward"),
                     grad_output.program, [grad_output, places])


@register([F.pad, torch._C._nn.pad], "input, pad, mode='constant', value=None")
def _pad(node, values, input, pad, mode, value):
    """out[..., i] = input[..., i - before] where that is inside the input; elsewhere the value
    (constant), the nearest edge element (replicate), the element mirrored at the edge
    (reflect) or the one from the other end (circular). A pointwise value: it fuses with what
    computes its input and what reads it, as Inductor's constant_pad_nd and its reflection
    and replication pads. Negative amounts crop."""
    meta = _meta(node, values)
    if meta is None or mode not in ("constant", *_WRAPPED_POSITION) or not isinstance(input, TensorBox) \
            or not isinstance(pad, (list, tuple)) or len(pad) % 2 or len(pad) // 2 > len(input.shape) \
            or not all(isinstance(p, int) for p in pad) \
            or any(ir.is_symbolic(s) for s in (*input.shape, *meta.shape)):
        return NotImplemented
    before = {len(input.shape) - 1 - i: pad[2 * i] for i in range(len(pad) // 2)}
    if mode != "constant":
        # (with a negative amount, circular padding wraps around the cropped input, whose size
        # is not the input's)
        if any(input.shape[d] == 0 for d in before) or (mode == "circular" and min(pad) < 0):
            return NotImplemented
        return _wrapped(input, meta, before, _WRAPPED_POSITION[mode], _origin(node))
    value = 0 if value is None else value
    if not isinstance(value, (int, float)) or not (input.dtype.is_floating_point or float(value).is_integer()):
        return NotImplemented                   # (PyTorch converts the value to the tensor's dtype)
    return _padded(input, meta, before, value, _origin(node))


def _replicated(r, size):
    return ops.minimum(ops.maximum(r, _int64(0)), _int64(size - 1))


def _reflected(r, size):
    # (PyTorch allows amounts below the size: one reflection at each edge reaches every position)
    r = ops.abs(r)
    return ops.where(ops.gt(r, _int64(size - 1)), ops.sub(_int64(2 * (size - 1)), r), r)


def _circular(r, size):
    # (PyTorch allows amounts up to the size: one turn reaches every position)
    r = ops.where(ops.lt(r, _int64(0)), ops.add(r, _int64(size)), r)
    return ops.where(ops.ge(r, _int64(size)), ops.sub(r, _int64(size)), r)


# mode -> the position inside [0, size) that a position r of the moved input reads
_WRAPPED_POSITION = {"replicate": _replicated, "reflect": _reflected, "circular": _circular}


def _wrapped(input: TensorBox, meta, before: dict, position, origin: str) -> TensorBox:
    """`input` moved by before[d] positions in each dim d, into the sizes of `meta`, positions
    outside it read where `position` maps them (computed in the kernel, inside the input by
    construction: an index that needs no check)."""
    load = input.make_loader()

    def inner_fn(idx):
        pos = list(idx)
        for d, b in before.items():
            r = ops.index_expr(idx[d] + (-b), torch.int64)
            pos[d] = ops.indirect_indexing(position(r, input.shape[d]), input.shape[d], None)
        return load(pos)
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, origin),
                     input.program, [input])


def _padded(input: TensorBox, meta, before: dict, value, origin: str) -> TensorBox:
    """`input` moved by before[d] positions in each dim d, into the sizes of `meta`, with
    `value` where no element of the input lands."""
    load, cd = input.make_loader(), compute_dtype(meta.dtype)

    def inner_fn(idx):
        pos, conditions = list(idx), []
        for d, b in before.items():
            pos[d] = idx[d] + (-b)
            if b > 0 or meta.shape[d] - b > input.shape[d]:       # may leave the input
                p = ops.index_expr(pos[d], torch.int64)
                conditions += [ops.ge(p, _int64(0)), ops.lt(p, _int64(input.shape[d]))]
        if not conditions:
            return load(pos)
        return ops.masked(_all_of(conditions), lambda: load(pos), ops.constant(value, cd))
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, origin),
                     input.program, [input])


@register([torch.constant_pad_nd], "input, pad, value=0")
def _constant_pad_nd(node, values, input, pad, value):
    return _pad(node, values, input, pad, "constant", value)


@register([F.adaptive_avg_pool2d, torch._C._nn.adaptive_avg_pool2d], "input, output_size")
def _adaptive_avg_pool2d(node, values, input, output_size):
    """Global average pooling (an output of 1 x 1, how classifiers end) is the mean over the
    last two dims: a reduction that fuses with the work before and after it."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox) or not input.dtype.is_floating_point \
            or len(input.shape) not in (3, 4) or tuple(meta.shape[-2:]) != (1, 1) \
            or 0 in input.shape[-2:]:
        return NotImplemented
    return _reduce(input, [-2, -1], "mean")


# --------------------------------------------------------------------------- tensors made from nothing

# ops whose result depends on no tensor (torch.ones, torch.arange): lowered with the program
# given, since no argument brings it. target -> lowering(program, node, values, *args, **kwargs)
FACTORIES: dict[Any, Callable] = {}
_FACTORY_OPTIONS = "*, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False"


def factory(targets, signature: str):
    sig = Signature(signature)

    def wrap(fn):
        def lowering(program, node, values, *args, **kwargs):
            bound = sig.bind(args, kwargs)
            if bound is None or bound.get("layout") not in (None, torch.strided) or bound.get("pin_memory"):
                return NotImplemented
            return fn(program, node, values, **bound)
        for t in targets:
            FACTORIES[t] = lowering
        return fn
    return wrap


def lookup_factory(op: str, target) -> Callable | None:
    return FACTORIES.get(target) if op == "call_function" and _in(target, FACTORIES) else None


def _filled(program, node, values, value):
    """A tensor of the node's shape, dtype and device, every element `value` as PyTorch stores
    it in that dtype: a pointwise value that costs no memory until a kernel that reads it."""
    meta = _meta(node, values)
    if not _made_here(meta, program) or not isinstance(value, (int, float)):
        return NotImplemented
    stored = torch.tensor(value, dtype=meta.dtype).item()
    cd = compute_dtype(meta.dtype)
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device,
                                  lambda idx: ops.constant(stored, cd), _origin(node)), program)


def _made_here(meta, program) -> bool:
    """A tensor of static sizes on the graph's device (one made on another device, a CPU tensor
    in a GPU graph, is left to PyTorch), of a real dtype."""
    return meta is not None and torch.device(meta.device) == torch.device(program.device) \
        and not meta.dtype.is_complex and not any(ir.is_symbolic(s) for s in ir.shape_of(meta))


@factory([torch.ones], "*size, " + _FACTORY_OPTIONS)
def _ones(program, node, values, size, dtype, layout, device, pin_memory, requires_grad):
    return _filled(program, node, values, 1)


@factory([torch.zeros], "*size, " + _FACTORY_OPTIONS)
def _zeros(program, node, values, size, dtype, layout, device, pin_memory, requires_grad):
    return _filled(program, node, values, 0)


@factory([torch.empty], "*size, " + _FACTORY_OPTIONS)
def _empty(program, node, values, size, dtype, layout, device, pin_memory, requires_grad):
    """A tensor whose values eager leaves undefined: zeros will do, and as a pointwise value
    it costs nothing where the graph writes it whole before reading (torch.empty(3, 7).copy_(r)
    needs no allocation of its own)."""
    return _filled(program, node, values, 0)


@factory([torch.full], "size, fill_value, " + _FACTORY_OPTIONS)
def _full(program, node, values, size, fill_value, dtype, layout, device, pin_memory, requires_grad):
    return _filled(program, node, values, fill_value)


_LIKE_OPTIONS = "*, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, memory_format=None"


@register([torch.full_like], "input, fill_value, " + _LIKE_OPTIONS)
def _full_like(node, values, input, fill_value, dtype, layout, device, pin_memory, requires_grad, memory_format):
    """A tensor of the traced result's sizes, dtype and layout (eager's preserve_format),
    every element the value: a pointwise value, as torch.full's (T5's position buckets)."""
    if not isinstance(input, TensorBox) or requires_grad or layout not in (None, torch.strided):
        return NotImplemented
    return _filled(input.program, node, values, fill_value)


@register([torch.zeros_like], "input, " + _LIKE_OPTIONS)
def _zeros_like(node, values, input, dtype, layout, device, pin_memory, requires_grad, memory_format):
    return _full_like(node, values, input, 0, dtype, layout, device, pin_memory, requires_grad, memory_format)


@register([torch.empty_like], "input, " + _LIKE_OPTIONS)
def _empty_like(node, values, input, dtype, layout, device, pin_memory, requires_grad, memory_format):
    return _full_like(node, values, input, 0, dtype, layout, device, pin_memory, requires_grad, memory_format)


@register([torch.ones_like], "input, " + _LIKE_OPTIONS)
def _ones_like(node, values, input, dtype, layout, device, pin_memory, requires_grad, memory_format):
    return _full_like(node, values, input, 1, dtype, layout, device, pin_memory, requires_grad, memory_format)


@factory([torch.tensor], "data, " + _FACTORY_OPTIONS)
def _tensor(program, node, values, data, dtype, layout, device, pin_memory, requires_grad):
    """torch.tensor of a Python number (a 0-dim constant) or of an empty list (a tensor of no
    elements, as Hugging Face's mask code makes one): no call of PyTorch's per graph call."""
    if requires_grad:
        return NotImplemented
    if isinstance(data, (list, tuple)) and len(data) == 0:
        return _filled(program, node, values, 0)
    if type(data) in (bool, int, float):
        return _filled(program, node, values, data)
    return NotImplemented


@factory([torch.arange], "*bounds, " + _FACTORY_OPTIONS)
def _arange(program, node, values, bounds, dtype, layout, device, pin_memory, requires_grad):
    """start + i * step, for integer results (float ones are left to PyTorch, whose kernels
    compute them in a wider type)."""
    meta = _meta(node, values)
    if not _made_here(meta, program) or meta.dtype.is_floating_point or meta.dtype == torch.bool \
            or len(bounds) not in (1, 2, 3) or not all(type(b) is int for b in bounds):
        return NotImplemented
    start, step = (bounds[0] if len(bounds) > 1 else 0), (bounds[2] if len(bounds) == 3 else 1)

    def inner_fn(idx):
        return ops.add(ops.mul(ops.index_expr(idx[0], torch.int64), _int64(step)), _int64(start))
    return TensorBox(ir.Pointwise(ir.shape_of(meta), meta.dtype, meta.device, inner_fn, "arange"), program)


@register(["new_ones"], "input, *size, " + _FACTORY_OPTIONS)
def _new_ones(node, values, input, size, dtype, layout, device, pin_memory, requires_grad):
    return _filled(input.program, node, values, 1) if isinstance(input, TensorBox) else NotImplemented


@register(["new_zeros"], "input, *size, " + _FACTORY_OPTIONS)
def _new_zeros(node, values, input, size, dtype, layout, device, pin_memory, requires_grad):
    return _filled(input.program, node, values, 0) if isinstance(input, TensorBox) else NotImplemented


@register(["new_full"], "input, size, fill_value, " + _FACTORY_OPTIONS)
def _new_full(node, values, input, size, fill_value, dtype, layout, device, pin_memory, requires_grad):
    return _filled(input.program, node, values, fill_value) if isinstance(input, TensorBox) else NotImplemented


def _logical(op):
    """& or | of boolean tensors (the masks models build)."""
    def lower(node, values, input, other):
        meta = _meta(node, values)
        operands = [x for x in (input, other) if isinstance(x, TensorBox)]
        if meta is None or meta.dtype != torch.bool or not operands \
                or any(x.dtype != torch.bool for x in operands) \
                or any(not isinstance(x, (TensorBox, bool)) for x in (input, other)):
            return NotImplemented
        return _pointwise_box(node, values, op, [input, other], common=torch.bool)
    return lower


@register([torch.logical_not, torch.Tensor.logical_not, "logical_not"], "input", pointwise=True)
def _logical_not(node, values, input):
    """not x, x read as a bool (nonzero, NaN included, is True), as PyTorch's logical_not."""
    meta = _meta(node, values)
    if meta is None or meta.dtype != torch.bool or not isinstance(input, TensorBox):
        return NotImplemented
    return _pointwise_box(node, values, ops.logical_not, [input], common=torch.bool)


@register([torch.bitwise_not, torch.Tensor.bitwise_not, "bitwise_not", operator.invert, "__invert__"],
          "input", pointwise=True)
def _invert(node, values, input):
    """~ of a bool tensor (a mask): its logical not. Integers' bitwise not is left to PyTorch."""
    if not isinstance(input, TensorBox) or input.dtype != torch.bool:
        return NotImplemented
    return _logical_not(node, values, input)


@register([torch.any, torch.Tensor.any, "any"], "input, dim=None, keepdim=False")
def _any(node, values, input, dim, keepdim):
    """Whether any element of each row is nonzero: a count of the nonzero ones, compared with 0
    (so it needs no boolean reduction in the kernels)."""
    meta = _meta(node, values)
    if meta is None or meta.dtype != torch.bool or not isinstance(input, TensorBox):
        return NotImplemented
    program, device, shape = input.program, input.device, list(input.shape)
    nonzero = _pw(program, shape, torch.int64, device, lambda x: ops.to_dtype(x, torch.int64, torch.bool),
                  [input], "ne", common=torch.bool)
    counted = types.SimpleNamespace(shape=list(meta.shape), dtype=torch.int64, device=device)
    dims = list(dim) if isinstance(dim, (list, tuple)) else dim
    count = _reduction_box(counted, nonzero, dims, keepdim, "sum")
    if count is NotImplemented:
        return count
    return _pw(program, ir.shape_of(meta), torch.bool, device,
               lambda c: ops.gt(c, ops.constant(0, torch.int64)), [count], "any", common=torch.int64)


register([operator.and_, torch.logical_and, "logical_and", "__and__"], "input, other",
         pointwise=True)(_logical(ops.logical_and))
register([operator.or_, torch.logical_or, "logical_or", "__or__"], "input, other",
         pointwise=True)(_logical(ops.logical_or))


# --------------------------------------------------------------------------- convolution

@register([torch.conv2d, F.conv2d], "input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1")
def _conv2d(node, values, input, weight, bias, stride, padding, dilation, groups):
    """A 2-D convolution stays PyTorch's kernel (an Extern), given its input channels-last
    where ir.conv_input_channels_last says so, as Inductor's layout optimization does (oneDNN's
    and cuDNN's channels-last kernels are the fast ones there). PyTorch then returns the result
    channels-last too, so the kernels after it read and write that layout (their loops follow
    memory order: codegen/common.py's plan_loops). The copy into channels-last is a generated
    kernel, or no work at all when the input is computed here (it is stored so directly). On a
    CPU the weight is given channels-last too: oneDNN reorders a contiguous one on every call."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox) or not isinstance(weight, TensorBox) \
            or len(input.shape) != 4 or any(ir.is_symbolic(s) for s in input.shape):
        return NotImplemented
    channels_last = ir.conv_input_channels_last(input.device, input.dtype, ir.shape_of(meta))
    if channels_last:
        x = input.laid_out(ir.dense_strides(input.shape, ir.CHANNELS_LAST))
        # meta kernels answer contiguous here; PyTorch's kernels keep a channels-last input's
        # layout (and the wrapper's as_layout would copy if one did not)
        out_stride = ir.dense_strides(ir.shape_of(meta), ir.CHANNELS_LAST)
    else:
        # PyTorch's default layout (a value computed from a channels-last one would be stored
        # channels-last otherwise: lower/__init__.py's _channels_last_as_read)
        x = input if input.is_realized else input.realize(ir.contiguous_strides(input.shape))
        out_stride = None
    if not channels_last or isinstance(padding, str):      # ("same", "valid": conv2d works them out)
        return lower_fallback(input.program, node, values, node.target,
                              (x, weight, bias, stride, padding, dilation, groups), {}, stride=out_stride)
    if input.device.type == "cpu" and len(weight.shape) == 4:     # (a copy: a small generated kernel)
        weight = weight.laid_out(ir.dense_strides(weight.shape, ir.CHANNELS_LAST))
    # the op conv2d calls, called directly: a model calls dozens per forward, and conv2d's own
    # argument checks are host time on every call
    # for Triton kernels a bias is added by a generated kernel, the one that reads the result
    # (a batch norm, an activation), as Inductor does on a GPU: cuDNN would add it with a launch
    # of its own. (oneDNN adds it as it goes: with C++ kernels it stays in the convolution.)
    add_bias = isinstance(bias, TensorBox) and list(bias.shape) == [meta.shape[1]] \
        and not (input.device.type == "cpu" and config.cpu_backend == "cpp")
    result = lower_fallback(input.program, node, values, torch.convolution,
                            (x, weight, None if add_bias else bias, _pair(stride), _pair(padding),
                             _pair(dilation), False, [0, 0], groups), {}, stride=out_stride)
    if not add_bias:
        return result
    per_channel = _view(bias, [bias.shape[0], 1, 1], lambda idx: [idx[0]], "bias per channel", aliases=False)
    return _pw(input.program, ir.shape_of(meta), meta.dtype, meta.device, ops.add, [result, per_channel],
               "convolution bias")


# --------------------------------------------------------------------------- matrix products

@register([F.linear], "input, weight, bias=None")
def _linear(node, values, input, weight, bias):
    """A linear layer is PyTorch's matrix product. For Triton kernels its bias is added by a
    generated kernel, as Inductor does on a GPU, where everything that reads the result is
    elementwise (an activation, a residual add): in the kernel that does that work, so the
    product writes its result once. Elsewhere (a projection that attention reads) the bias is
    added by a kernel of its own, over the product in place, where the result is small
    (BIAS_PASS_UP_TO bytes): a product with a bias is cuBLASLt's, which asks for its heuristics
    on every call (measured on the H100, BERT-base's 73 linear layers spent 3 ms of host time a
    call there), more than one more pass over a small result costs. With C++ kernels the bias
    stays in the product, as Inductor keeps it on a CPU: measured on 2 cores, the BLAS
    library's addmm adds it for less than a separate read does.

    On a GPU, a large product whose output rows are not a multiple of 16 bytes long (a
    language model's head over a vocabulary of 50,257 words) is slow in cuBLAS: its fast kernels
    need aligned rows. Where minicompile's own kernel computes it as eager does (lower/matmul.py:
    TF32 or half precision, on GPUs from Ampere on), that kernel writes it in eager's layout.
    Otherwise the weight is padded with zero rows to an aligned width and the result is the
    view of the first columns (as Inductor pads), which a graph output copies into eager's
    layout. The three ways are timed in benchmarks/results/unaligned_matmul_h100.json."""
    meta = _meta(node, values)
    if meta is None or not isinstance(input, TensorBox) or not isinstance(weight, TensorBox) \
            or (input.device.type == "cpu" and config.cpu_backend == "cpp"):
        return NotImplemented
    fuse_bias = isinstance(bias, TensorBox) and len(bias.shape) == 1 and _bias_added_apart(node, meta)
    if bias is not None and not fuse_bias:
        return NotImplemented
    program, shape = input.program, ir.shape_of(meta)
    unaligned = _worth_padding(weight, meta)
    if unaligned and matmul.chosen(meta.device, meta.dtype):
        product = _product(node, values, input, weight, meta, target=matmul.mm)
    elif unaligned:
        product = _product(node, values, input, _padded_rows(weight), meta)
        product = _view(product, shape, lambda idx: idx, "first columns of a padded product")
    else:
        product = _product(node, values, input, weight, meta)
    if not fuse_bias:
        return product
    return _pw(program, shape, meta.dtype, meta.device, ops.add, [product, bias], "linear bias")


def _product(node, values, input, weight, meta, target=torch.mm) -> TensorBox:
    """input @ weight.t() as PyTorch's matrix product, a new contiguous tensor (the wrapper's
    as_layout checks it at run time). Where the sizes are static, the call is torch.mm on 2-D
    views of the input's rows and of the weight transposed, as Inductor calls it: F.linear on a
    3-D input reshapes, multiplies and reshapes back through a dozen dispatcher calls (measured
    on the H100 for BERT-base's layers, 24 us of host time a call against about 10). `target`:
    the 2-D product called (torch.mm, or matmul.mm for an unaligned result)."""
    program = input.program
    *lead, k = input.shape
    n = weight.shape[0]
    shape = [*lead, n]
    if not lead or any(ir.is_symbolic(s) for s in (*input.shape, n)) or _has_symbolic_sizes(values.get(node)) \
            or not input.dtype == weight.dtype == meta.dtype:
        return lower_fallback(program, node, values, F.linear, (input, weight), {},
                              stride=ir.contiguous_strides(shape), shape=shape)
    rows = math.prod(lead)
    # views of the values as eager's linear takes them (not internal re-indexings): the extern
    # call stores each value once and reads it through strided views (_realize_viewed), where
    # a re-indexing would be stored again, for every product that reads it
    flat = input if len(lead) == 1 else _view(input, [rows, k], _reshape_map(input.shape, [rows, k]),
                                              "rows of a linear layer's input")
    transposed = _view(weight, [k, n], lambda idx: [idx[1], idx[0]], "transposed weight")
    product = lower_fallback(program, node, values, target, (flat, transposed), {},
                             stride=ir.contiguous_strides([rows, n]), shape=[rows, n])
    if len(lead) == 1:
        return product
    return _view(product, shape, _reshape_map([rows, n], shape), "a linear layer's result")


@register([torch.addmm, torch.Tensor.addmm, "addmm"], "input, mat1, mat2, *, beta=1, alpha=1")
def _addmm(node, values, input, mat1, mat2, beta, alpha):
    """bias + mat1 @ mat2 (a Hugging Face Conv1D, GPT-2's layers), for Triton kernels: the
    product, and the bias added by a generated kernel, as a linear layer's (see _linear)."""
    meta = _meta(node, values)
    if meta is None or beta != 1 or alpha != 1 or not all(isinstance(x, TensorBox) for x in (input, mat1, mat2)) \
            or len(input.shape) > 2 or (mat1.device.type == "cpu" and config.cpu_backend == "cpp") \
            or not _bias_added_apart(node, meta):
        return NotImplemented
    shape = ir.shape_of(meta)
    product = lower_fallback(mat1.program, node, values, torch.mm, (mat1, mat2), {},
                             stride=ir.contiguous_strides(shape))
    return _pw(mat1.program, shape, meta.dtype, meta.device, ops.add, [product, input], "addmm bias")


BIAS_PASS_UP_TO = 2 ** 24    # bytes of a product's result that one more pass may read and write


def _bias_added_apart(node, meta) -> bool:
    """Whether a product's bias is better added by a generated kernel (see _linear). Not for a
    product of one row (a decoding step's) on a GPU: there cuBLAS multiplies a matrix by a
    vector, and its kernels for that with the bias (addmm) were the faster ones for GPT-2's four
    layer shapes, timed against the product without it on the H200 (the decoding benchmark,
    benchmarks/decode.py, ran with this choice)."""
    if meta.device.type == "cuda" and meta.dim() >= 1 and meta.numel() == meta.shape[-1]:
        return False
    if meta.numel() * meta.dtype.itemsize <= BIAS_PASS_UP_TO:
        return True
    users = list(node.users)
    try:
        return bool(users) and all(u.op in ("call_function", "call_method") and u.target in POINTWISE_TARGETS
                                   for u in users)
    except TypeError:                 # an unhashable target: not one of ours
        return False


PAD_PRODUCTS_FROM = 2 ** 28     # multiply-adds: below this, padding costs more than it saves


def _worth_padding(weight: TensorBox, meta) -> bool:
    """Whether a product's result rows are unaligned (not a multiple of 16 bytes) and the
    product large enough for that to matter: a float product of at least PAD_PRODUCTS_FROM
    multiply-adds with static sizes."""
    n, k = weight.shape if len(weight.shape) == 2 else (None, None)
    shape = ir.shape_of(meta)
    if n is None or not meta.dtype.is_floating_point \
            or any(ir.is_symbolic(s) for s in (*shape, k)):
        return False
    return n % _aligned_count(meta.dtype) != 0 and math.prod(shape) * k >= PAD_PRODUCTS_FROM


def _aligned_count(dtype: torch.dtype) -> int:
    """Elements in 16 bytes."""
    return max(1, 16 // dtype.itemsize)


def _padded_rows(weight: TensorBox) -> TensorBox:
    """The (n, k) weight with zero rows appended up to n's next multiple of 16 bytes."""
    n, k = weight.shape
    return _zero_padded(weight, [_aligned_up(n, weight.dtype), k], "zero-padded weight")


def _aligned_up(size: int, dtype: torch.dtype) -> int:
    """size rounded up to a multiple of 16 bytes' elements."""
    align = _aligned_count(dtype)
    return -(-size // align) * align


def _zero_padded(box: TensorBox, wide: list, origin: str) -> TensorBox:
    """box with zeros appended in each dim up to the sizes `wide`, stored contiguous."""
    load = box.make_loader()

    def inner_fn(idx):
        inside = [ops.lt(ops.index_expr(idx[d], torch.int64), ops.constant(size, torch.int64))
                  for d, size in enumerate(box.shape) if size != wide[d]]
        return ops.masked(_all_of(inside), lambda: load(idx), ops.constant(0.0, compute_dtype(box.dtype)))
    padded = TensorBox(ir.Pointwise(list(wide), box.dtype, box.device, inner_fn, origin), box.program, [box])
    return padded.realize(ir.contiguous_strides(list(wide)))


@register([torch.mm, "mm"], "a, b")
def _mm(node, values, a, b):
    """A large product with a size that is not a multiple of 16 bytes, where Triton kernels run.
    The backward of a language model's head has two: the gradient of its input multiplies the
    gradient of the logits, 50,257 words long, by the weight (k unaligned), and the gradient
    of its weight multiplies their transpose (m unaligned, and the leading dimension of a
    column-major operand). cuBLAS's fast kernels need each matrix's rows (or columns) to
    start on 16-byte boundaries and k aligned too (timed on the H100 for GPT-2's head: 2.5 ms
    for the first as it is, 1.0 ms with k padded). So, as Inductor's pad_mm does, the operands
    get zero rows or columns up to aligned sizes and the result is the view of its first
    m x n: k's zeros add nothing to the sums.

    An operand that is the transpose of a value is padded untransposed, then transposed: the
    logits' gradient is padded once for both products (`program.padded`), and the kernel that
    computes it writes the padded buffer itself. (lower/matmul.py's kernel, which _linear
    calls for a result of unaligned width, is not called here: in a training step's forward
    its compilation, in this process, held the step's first call up by seconds.)"""
    meta = _meta(node, values)
    if meta is None or not isinstance(a, TensorBox) or not isinstance(b, TensorBox) \
            or len(a.shape) != 2 or len(b.shape) != 2 or not a.dtype == b.dtype == meta.dtype \
            or not meta.dtype.is_floating_point or (a.device.type == "cpu" and config.cpu_backend == "cpp") \
            or any(ir.is_symbolic(s) for s in (*a.shape, *b.shape)):
        return NotImplemented
    (m, k), n = a.shape, b.shape[1]
    if m * k * n < PAD_PRODUCTS_FROM:
        return NotImplemented
    align = _aligned_count(meta.dtype)
    a_of, b_of = _transposed_value(node.args[0], a), _transposed_value(node.args[1], b)
    # the leading dimensions: a's is k, or m where a is a transpose; b's and the result's n
    if not (k % align or n % align or (m % align and a_of is not None)):
        return NotImplemented
    up = functools.partial(_aligned_up, dtype=meta.dtype)
    a = _aligned_operand(node.args[0], a, a_of, [up(m) if a_of is not None else m, up(k)])
    b = _aligned_operand(node.args[1], b, b_of, [up(k), up(n)])
    wide = [a.shape[0], b.shape[1]]
    product = lower_fallback(a.program, node, values, torch.mm, (a, b), {},
                             stride=ir.contiguous_strides(wide), shape=wide)
    if wide == [m, n]:
        return product
    return _view(product, [m, n], lambda idx: idx, "the first rows and columns of a padded product")


def _transposed_value(arg, box: TensorBox):
    """(FX node, box) of the 2-D value that `arg`, a product's operand, is the transpose of;
    None where it is not a transpose."""
    if not isinstance(arg, torch.fx.Node) or not arg.args or not isinstance(arg.args[0], torch.fx.Node) \
            or len(box.reads) != 1 or len(box.reads[0].shape) != 2:
        return None
    dims = arg.args[1:]
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):      # permute(x, [1, 0])
        dims = dims[0]
    if not all(isinstance(d, int) for d in dims):
        return None
    dims = [d % 2 for d in dims]
    swaps = (arg.target in ("t", torch.t) and len(arg.args) == 1) \
        or (arg.target in ("transpose", torch.transpose) and sorted(dims) == [0, 1]) \
        or (arg.target in ("permute", torch.permute) and dims == [1, 0])
    return (arg.args[0], box.reads[0]) if swaps else None


def _aligned_operand(arg, box: TensorBox, transposed_of, wide: list) -> TensorBox:
    """A product's 2-D operand with zeros appended up to the sizes `wide`. A value padded for
    another product already, to these sizes or more, is read from that buffer."""
    source, value = (arg, box) if transposed_of is None else transposed_of
    if transposed_of is not None:
        wide = wide[::-1]
    if wide == list(value.shape):
        return box
    padded = box.program.padded.get(source)
    if padded is None or any(have < want for have, want in zip(padded.shape, wide)):
        padded = box.program.padded[source] = _zero_padded(value, wide, "a product's operand, zero-padded")
    if list(padded.shape) != wide:
        padded = _view(padded, wide, lambda idx: idx, "the first rows and columns of a padded operand")
    if transposed_of is None:
        return padded
    return _view(padded, wide[::-1], lambda idx: [idx[1], idx[0]], "a padded operand, transposed")


@register([F.scaled_dot_product_attention],
          "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False")
def _attention(node, values, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Attention of one query per head (a decoding step) is generated code
    (_attention_of_one_query). Otherwise attention is PyTorch's kernel; a boolean mask is
    handed to it as the additive float mask it stands for (0 where attending, -inf where not:
    what PyTorch converts it to), computed in a generated kernel and stored dense. The masks models build (Hugging Face's, from positions
    and padding) are views with a stride of 0 somewhere: PyTorch's fused attention kernels need
    the key dimension contiguous, so such a mask sends the call to its unfused math path (a
    dozen kernels; measured on the H100 for BERT-base's shapes, 0.21 ms a call against 0.055 ms
    with the dense float mask). Triton kernels only: on a CPU, attention keeps the mask it got."""
    meta = _meta(node, values)
    if meta is None or not isinstance(query, TensorBox) or not query.dtype.is_floating_point:
        return NotImplemented
    if (query.shape[-2] == 1 and dropout_p == 0 and not is_causal and not enable_gqa
            and all(isinstance(t, TensorBox) and t.dtype == query.dtype for t in (key, value))
            and query.shape[:-2] == key.shape[:-2] == value.shape[:-2] and key.shape[-2] == value.shape[-2]
            and (attn_mask is None or isinstance(attn_mask, TensorBox))):
        return _attention_of_one_query(query, key, value, attn_mask, scale)
    if (not isinstance(attn_mask, TensorBox) or attn_mask.dtype != torch.bool
            or (query.device.type == "cpu" and config.cpu_backend == "cpp")
            or any(ir.is_symbolic(s) for s in attn_mask.shape)):
        return NotImplemented
    kwargs = dict(attn_mask=_additive_mask(attn_mask, query), dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    if enable_gqa:
        kwargs["enable_gqa"] = True
    return lower_fallback(query.program, node, values, node.target, (query, key, value), kwargs)


def _additive_mask(attn_mask, query):
    """A boolean attention mask as the additive float mask it stands for (0 where attending,
    -inf where not), of the query's dtype, stored dense. Every layer of a model reads the same
    mask: it is made once (kept on the boolean mask's box)."""
    dt, shape = query.dtype, list(attn_mask.shape)
    made = attn_mask.__dict__.setdefault("additive_masks", {})
    if dt not in made:
        additive = _pw(query.program, shape, dt, query.device,
                       lambda m: ops.where(m, ops.constant(0.0, dt), ops.constant(-math.inf, dt)),
                       [attn_mask], "attention mask", common=torch.bool)
        made[dt] = additive.laid_out(ir.contiguous_strides(shape))
    return made[dt]


def _attention_of_one_query(query, key, value, attn_mask, scale):
    """Attention of one query per head (a decoding step): generated kernels, not PyTorch's.
    Its fused kernels are built for many queries; for one, the work is a few products per key
    and the kernel's fixed cost dominates. Here: scores = q . k over the head's features (a
    reduction per key), their softmax over the keys, and the keys' values weighted by it (a
    reduction per feature), in float32 whatever the inputs' dtype, as the fused kernels
    accumulate. q, k, v: (..., 1, E), (..., S, E), (..., S, Ev); the mask broadcasts to (..., 1, S)."""
    program, device, dt = query.program, query.device, query.dtype
    *batch, _, e = query.shape
    s, ev = key.shape[-2], value.shape[-1]
    f32 = torch.float32
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    products = _pw(program, [*batch, s, e], f32, device, ops.mul, [query, key], "q * k")
    scores = _view(_reduce(products, -1, "sum"), [*batch, 1, s], lambda idx: [*idx[:-2], idx[-1], Index()],
                   "scores", aliases=False)
    load_scores = _as_index_value(scores, [*batch, 1, s], f32)
    boolean = attn_mask is not None and attn_mask.dtype == torch.bool
    load_mask = None if attn_mask is None else \
        _as_index_value(attn_mask, [*batch, 1, s], torch.bool if boolean else f32)

    def scaled_scores(idx):                   # a boolean mask: -inf where it says no
        x = ops.mul(load_scores(idx), ops.constant(scale, f32))
        if load_mask is None:
            return x
        m = load_mask(idx)
        return ops.where(m, x, ops.constant(-math.inf, f32)) if boolean else ops.add(x, m)
    scaled = TensorBox(ir.Pointwise([*batch, 1, s], f32, device, scaled_scores, "scaled scores"), program,
                       [scores] + ([attn_mask] if attn_mask is not None else []))
    # the softmax over the keys; a row with every key masked out gets weights of 0 (and an
    # output of 0), as PyTorch's fused kernels give, where a plain softmax would give NaN
    def zero():
        return ops.constant(0.0, f32)
    top = _reduce(scaled, -1, "max")
    exps = _pw(program, [*batch, 1, s], f32, device,
               lambda x, m: ops.exp(ops.sub(x, ops.where(ops.eq(m, ops.constant(-math.inf, f32)), zero(), m))),
               [scaled, top], "exp")
    total = _reduce(exps, -1, "sum")
    weights = _pw(program, [*batch, 1, s], f32, device,
                  lambda x, t: ops.where(ops.eq(t, zero()), zero(), ops.mul(x, ops.reciprocal(t))),
                  [exps, total], "softmax")
    v_t = _view(value, [*batch, ev, s], lambda idx: [*idx[:-2], idx[-1], idx[-2]], "v transposed", aliases=False)
    weighted = _pw(program, [*batch, ev, s], f32, device, ops.mul, [weights, v_t], "weights * v")
    out = _view(_reduce(weighted, -1, "sum"), [*batch, 1, ev], lambda idx: [*idx[:-2], idx[-1], Index()],
                "attention", aliases=False)
    return _pw(program, [*batch, 1, ev], dt, device, lambda x: x, [out], "attention", common=f32)


# --------------------------------------------------------------------------- fallback

def lower_fallback(program: ir.Program, node, values, target, args, kwargs, stride=None, shape=None):
    """Any op without a lowering: an Extern that calls PyTorch on realized inputs. `stride`:
    the result's strides, where the caller knows them better than a meta kernel does; `shape`
    with it, where the call is not the node's own (a lowering's product of padded operands)."""
    boxes = []

    pure = _reads_inputs_only(target)    # a strided view of a buffer will do
    traced_args = _traced_arguments(node, values, (args, kwargs))

    def realize(x):
        if isinstance(x, TensorBox):
            traced = traced_args.get(id(x))
            if pure:
                _realize_viewed(x)
                view = as_view_of_buffer(x)
                # a transpose or slice of a buffer: pass a strided view, if laid out as the
                # traced argument was (an internal op may need the contiguous copy the traced
                # graph made: _embedding_bag's indices)
                if view is not None and _strides_agree(view.shape, view.stride, traced):
                    if x.data.aliases:
                        x.data = view
                    else:       # (a clone, a copy: a tensor of its own to the other readers)
                        x = TensorBox(view, x.program)
            # stored as the traced argument was where that layout was dense: the op's kernel
            # may take no other (a GPU's native_group_norm takes contiguous input only, and a
            # value lowering would store channels-last is then copied)
            stride = _dense_traced_strides(x.shape, traced)
            if getattr(x.dtype, "is_complex", False):
                # no kernel copies complex numbers: PyTorch's op takes the tensor as it is
                view = None if x.is_realized else as_view_of_buffer(x)
                if view is not None:
                    x.data = view
                x = x.realize()
            else:
                x = x.laid_out(stride) if stride is not None else x.realize()
            boxes.append(x)
        return x
    args = torch.fx.node.map_aggregate(args, realize)
    kwargs = torch.fx.node.map_aggregate(kwargs, realize)
    kind = "method" if node.op == "call_method" else "function"
    # The traced value's strides can differ from what the call will return at run time: the
    # inputs are now realized buffers (contiguous), not the views eager passed. Predict the
    # layout by running the op on meta tensors laid out as the realized inputs will be.
    traced = values.get(node)
    if _has_symbolic_sizes(traced):
        # dynamic shapes: the traced (fake) value's symbolic layout; as_layout in the wrapper
        # makes it hold at run time
        value = traced
    elif stride is not None:          # the caller knows the layout
        value = torch.empty_strided(traced.shape if shape is None else shape, stride, dtype=traced.dtype,
                                    device="meta")
    else:
        value = None
        if target is F.scaled_dot_product_attention and program.device.type == "cuda":
            value = _predict_on_meta(target, kind, args, kwargs, device=program.device)
        if value is None and _inputs_laid_out_as_traced(node, values, (args, kwargs)):
            value = traced
        if value is None:
            value = _predict_on_meta(target, kind, args, kwargs)
        if value is None:
            value = traced
    name = program.new_name("buf")
    if isinstance(value, torch.Tensor):
        traced = values.get(node)
        device = traced.device if isinstance(traced, torch.Tensor) else program.device
        shape, stride, dtype = ir.shape_of(value), ir.stride_of(value), value.dtype
    else:
        shape, stride, dtype, device = [], [], None, program.device
    reason = "" if _is_extern_kernel(target) else RANDOM_REASON if ir.draws_random_numbers(node) \
        else f"no lowering for {_origin(node)}"
    data = ir.Extern(name, target, args, kwargs, shape, stride, dtype, device, reason=reason,
                     kind=kind, value_is_tensor=isinstance(value, torch.Tensor),
                     meta_value=_to_meta(value))
    return TensorBox(data, program, boxes)


class _Constant:
    """A constant tensor of the graph, as an extern op of no arguments that returns it."""

    def __init__(self, value: torch.Tensor):
        self.value = value
        self.__name__ = "constant"

    def __call__(self):
        return self.value


def constant_tensor(program: ir.Program, value: torch.Tensor) -> TensorBox:
    data = ir.Extern(program.new_name("buf"), _Constant(value), (), {}, list(value.shape),
                     list(value.stride()), value.dtype, value.device, reason="a constant tensor",
                     meta_value=_to_meta(value))
    return TensorBox(data, program)


def viewed_value(box: TensorBox) -> TensorBox:
    """The value a chain of views (eager's views, not yet stored) reads: box itself where box
    is not such a view."""
    while isinstance(box.data, ir.Pointwise) and box.data.aliases and len(box.reads) == 1:
        box = box.reads[0]
    return box


def _realize_viewed(box: TensorBox) -> None:
    """The value a chain of views reads (a layer norm's result that a linear layer reads
    reshaped), stored, where the views are then a strided view of its buffer: the extern reads
    that view, instead of a copy of the value made for it (and the value is not stored twice
    where the graph also returns it). Left as it was where the views are not strided views."""
    base = viewed_value(box)
    if base is box or base.is_realized:
        return
    data = base.data
    base.realize()
    if as_view_of_buffer(box) is None:
        base.data = data


def _traced_arguments(node, values, mapped) -> dict:
    """id(box) -> the traced value of the argument node that box stands for."""
    nodes, boxes = pytree.tree_leaves((node.args, node.kwargs)), pytree.tree_leaves(mapped)
    if len(nodes) != len(boxes):
        return {}
    return {id(b): values.get(n) for n, b in zip(nodes, boxes)
            if isinstance(b, TensorBox) and isinstance(n, torch.fx.Node)}


def _dense_traced_strides(shape, traced):
    """The traced argument's strides, where it was a dense tensor of this shape (contiguous,
    channels-last, transposed...); else None. Where the sizes are symbols (a fake tensor's
    SymInts), the dense strides of `shape` in the traced value's order of dims in memory: a
    random op draws its numbers in memory order (randn_like of a transpose, dropout's mask)."""
    if not isinstance(traced, torch.Tensor) or len(traced.shape) != len(shape):
        return None
    if all(type(v) is int for v in (*shape, *traced.stride())):
        if list(traced.shape) != list(shape) or not ir.is_dense(shape, traced.stride()):
            return None
        return list(traced.stride())
    hinted = [ir.hint(v) for v in traced.shape], [ir.hint(v) for v in traced.stride()]
    if [ir.size_expr(v) for v in traced.shape] != [ir.size_expr(v) for v in shape] or not ir.is_dense(*hinted):
        return None
    return ir.dense_strides(shape, ir.stride_order(hinted[1]))


def _strides_agree(shape, stride, traced) -> bool:
    """Whether a view of these strides is laid out as the traced value (over its dims longer
    than 1, at the example's sizes); True where nothing was traced. At symbolic sizes the
    strides' expressions must be the same: an op's kernel may take no other layout
    (efficient attention's bias, last dim contiguous), so a view laid out otherwise is copied."""
    if not isinstance(traced, torch.Tensor) or len(traced.shape) != len(shape) \
            or [ir.size_expr(v) for v in traced.shape] != [ir.size_expr(v) for v in shape]:
        return True
    return all(ir.size_expr(a) == ir.size_expr(b) for a, b, n in zip(stride, traced.stride(), traced.shape)
               if ir.hint(n) > 1)


def _stored_as(program: ir.Program, name: str):
    """The input, or the stored box, whose buffer is called `name` (the first, in the program's
    order); None where there is none. Looked up in `program.stored_by_name`, which is made
    again where the name is missing or stale (values are stored, and views made of them, as
    lowering goes): a model's graph has thousands of values, too many to scan per lookup."""
    def holds(b) -> bool:
        return getattr(b, "name", None) == name and (not isinstance(b, TensorBox) or b.is_realized)
    found = program.stored_by_name.get(name)
    if found is None or not holds(found):
        program.stored_by_name.clear()
        for b in [*program.inputs, *program.nodes]:
            if not isinstance(b, TensorBox) or b.is_realized:
                b_name = getattr(b, "name", None)
                if b_name is not None:
                    program.stored_by_name.setdefault(b_name, b)
        found = program.stored_by_name.get(name)
    return found if found is not None and holds(found) else None


def as_view_of_buffer(box: TensorBox):
    """If box only re-indexes a buffer in memory (no arithmetic; a linear index once
    divisions are simplified away), that buffer viewed with strides and an offset; else None."""
    if box.is_realized or not isinstance(box.data, ir.Pointwise):
        return None
    try:
        rec = ir.reads_of(box)
    except NotImplementedError:      # reads a reduction not yet realized: not a plain view
        return None
    if rec.op_count or len(rec.loads) != 1:
        return None
    name, index = rec.loads[0]
    index = index.simplify({f"i{d}": s for d, s in enumerate(box.shape)})
    base = _stored_as(box.program, name)
    if base is None or not index.is_linear() or base.dtype != box.dtype:
        return None
    stride = [index.coeff(f"i{d}") for d in range(len(box.shape))]
    if not all(ir.provably_nonneg(st) for st in stride) or not ir.provably_nonneg(index.const):
        return None
    return ir.ViewOfBuffer(base, list(box.shape), stride, index.const)


def _layout(box: TensorBox) -> list[int]:
    data = box.data
    if isinstance(data, (ir.InputBuffer, ir.Extern, ir.ViewOfBuffer, ir.ComputedBuffer)):
        return list(data.stride)
    return ir.contiguous_strides(box.shape)


def _inputs_laid_out_as_traced(node, values, mapped) -> bool:
    """True when every tensor the call will get has the layout the traced call had: then the
    traced result's layout is exactly what the call returns."""
    traced = torch.utils._pytree.tree_leaves(torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n))
    now = torch.utils._pytree.tree_leaves(mapped)
    if len(traced) != len(now):
        return False
    for t, b in zip(traced, now):
        if isinstance(b, TensorBox):
            v = values.get(t) if isinstance(t, torch.fx.Node) else None
            if not isinstance(v, torch.Tensor) or not isinstance(b.data, (ir.InputBuffer, ir.ComputedBuffer, ir.Extern, ir.ViewOfBuffer)):
                return False
            if any(a != c and n > 1 for a, c, n in zip(_layout(b), v.stride(), v.shape)):
                return False
    return True


def _has_symbolic_sizes(value) -> bool:
    return any(isinstance(s, torch.SymInt) for v in torch.utils._pytree.tree_leaves(value)
               if isinstance(v, torch.Tensor) for s in (*v.shape, *v.stride()))


def _to_meta(value):
    if _has_symbolic_sizes(value):
        return value                 # a fake tensor already: no data, symbolic sizes
    def convert(v):
        if isinstance(v, torch.Tensor) and v.device.type != "meta":
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        return v
    return torch.utils._pytree.tree_map(convert, value)


def _predict_on_meta(target, kind, args, kwargs, device="meta"):
    """The op's result on meta tensors with the realized inputs' layouts, or None if the op
    cannot run on meta tensors (then the traced value is used, and the wrapper checks).
    device: where to run it instead, on empty tensors, for an op whose meta kernel does not
    choose the layout its device's kernel does (attention on a GPU: its fused kernels return
    the heads dimension transposed, the math path on meta tensors does not)."""
    if isinstance(target, torch.nn.Module):
        return None

    def meta(x):
        if not isinstance(x, TensorBox):
            return x
        data = x.data
        if isinstance(data, ir.Extern):
            return torch.empty_strided(data.meta_value.shape, data.meta_value.stride(), dtype=x.dtype, device=device)
        if isinstance(data, ir.ViewOfBuffer):
            return torch.empty_strided(data.shape, data.stride, dtype=x.dtype, device=device)
        stride = data.stride if isinstance(data, (ir.InputBuffer, ir.ComputedBuffer)) else ir.contiguous_strides(x.shape)
        return torch.empty_strided(x.shape, stride, dtype=x.dtype, device=device)
    try:
        margs = torch.fx.node.map_aggregate(args, meta)
        mkwargs = torch.fx.node.map_aggregate(kwargs, meta)
        with torch.no_grad():
            out = getattr(margs[0], target)(*margs[1:], **mkwargs) if kind == "method" else target(*margs, **mkwargs)
    except Exception:       # no meta kernel, or a Python value that is not a tensor op
        return None
    leaves = torch.utils._pytree.tree_leaves(out)
    if not leaves or not all(isinstance(v, torch.Tensor) and v.device.type == torch.device(device).type
                             for v in leaves):
        return None
    return out if device == "meta" else _to_meta(out)


# extern kernels whose result is always new memory, never a view of an argument
NEW_MEMORY_KERNELS = {torch.matmul, operator.matmul, torch.mm, torch.bmm, torch.addmm, F.linear,
                      torch.conv2d, F.conv2d, torch.convolution, F.scaled_dot_product_attention, "matmul", "mm",
                      "bmm",
                      torch.baddbmm, matmul.mm}
# the aten ops of training's joint graph that are PyTorch's kernels too (attention and its
# backward, a convolution's backward): they read their inputs, strided views included
_ATEN_KERNELS = {getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "convolution_backward") if hasattr(torch.ops.aten, name)}
EXTERN_KERNELS = NEW_MEMORY_KERNELS | {torch.einsum} | _ATEN_KERNELS     # einsum may hand back a view


def _in(target, kernels: set) -> bool:
    try:
        return target in kernels
    except TypeError:               # an unhashable target (a module instance...)
        return False


def _is_extern_kernel(target) -> bool:
    return _in(target, EXTERN_KERNELS) or isinstance(target, torch.nn.Module)


def _reads_inputs_only(target) -> bool:
    """Whether an op surely writes none of its tensor arguments, so that it may be given a
    strided view of a buffer (a transpose, a head split) instead of a copy: the extern kernels,
    and aten ops whose schema writes nothing (the functional graphs of training call these)."""
    if _is_extern_kernel(target):
        return not isinstance(target, torch.nn.Module)
    schema = getattr(target, "_schema", None)
    return isinstance(target, torch._ops.OpOverload) and schema is not None and not schema.is_mutable


def returns_new_memory(target) -> bool:
    """Whether an extern kernel's result is always memory of its own (modules, einsum and
    fallback ops may return a view of an argument)."""
    return _in(target, NEW_MEMORY_KERNELS)


LOWERINGS.pop(None, None)
