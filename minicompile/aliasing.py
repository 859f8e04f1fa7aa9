"""What PyTorch's operations write in place, and their functional forms.

Takes: one call as capture records it or as it stands in an FX graph (the kind of node, its
target, its arguments). Hands on: which of the arguments the call writes into (`written`), and,
for `functionalize.py`, a call that computes the same new value without writing (`functional`).
Capture asks it so that tracing never writes into the caller's tensors and a write is never
dropped as dead code; functionalization asks it to turn every write into a new value.

One table serves both, so that "what counts as a write" cannot differ between the stages.
"""
from __future__ import annotations

import inspect
import operator
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

# `x op= y` on a tensor writes x; on anything else it is the plain operator
AUGMENTED = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
             operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
             operator.imod: operator.mod, operator.ipow: operator.pow,
             operator.imatmul: operator.matmul, operator.iand: operator.and_,
             operator.ior: operator.or_, operator.ixor: operator.xor,
             operator.ilshift: operator.lshift, operator.irshift: operator.rshift}

# In-place methods that change a tensor's sizes, strides or storage rather than its values:
# no new *value* stands for them, so they are not modelled (a graph break, or PyTorch's kernels)
METADATA_WRITES = {"resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_",
                   "squeeze_", "unsqueeze_", "swapdims_", "swapaxes_", "detach_",
                   "requires_grad_", "share_memory_", "retain_grad", "record_stream",
                   "_coalesced_", "sparse_resize_", "sparse_resize_and_clear_",
                   "set_data", "resize", "untyped_storage"}

# In-place methods whose out-of-place twin (the name without `_`) computes the same value
# (cast back to the written tensor's dtype, which the in-place form keeps)
SAME_AS_OUT_OF_PLACE = {
    "abs_", "acos_", "acosh_", "add_", "addcdiv_", "addcmul_", "addmm_", "asin_", "asinh_",
    "atan_", "atan2_", "atanh_", "baddbmm_", "bitwise_and_", "bitwise_not_", "bitwise_or_",
    "bitwise_xor_", "ceil_", "clamp_", "clamp_max_", "clamp_min_", "clip_", "cos_", "cosh_",
    "cumsum_", "deg2rad_", "digamma_", "div_", "divide_", "eq_", "erf_", "erfc_", "erfinv_",
    "exp_", "exp2_", "expm1_", "float_power_", "floor_", "floor_divide_", "fmod_", "frac_",
    "gcd_", "ge_", "gt_", "hypot_", "index_add_", "index_copy_", "index_fill_", "index_put_",
    "lcm_", "le_", "lerp_", "lgamma_", "log_", "log10_", "log1p_", "log2_", "logical_and_",
    "logical_not_", "logical_or_", "logical_xor_", "logit_", "lt_", "masked_fill_",
    "masked_scatter_", "mul_", "multiply_", "mvlgamma_", "nan_to_num_", "ne_", "neg_",
    "negative_", "pow_", "rad2deg_", "reciprocal_", "relu_", "remainder_", "renorm_", "round_",
    "rsqrt_", "scatter_", "scatter_add_", "scatter_reduce_", "sgn_", "sigmoid_", "sign_",
    "sin_", "sinc_", "sinh_", "sqrt_", "square_", "sub_", "subtract_", "tan_", "tanh_",
    "tril_", "triu_", "true_divide_", "trunc_", "xlogy_", "fix_", "heaviside_", "hardtanh_",
    "leaky_relu_", "elu_", "silu_", "mish_", "hardswish_", "hardsigmoid_", "selu_", "celu_",
    "logaddexp_", "copysign_", "nextafter_", "i0_", "igamma_", "igammac_", "polygamma_",
    "clamp_", "where_", "greater_", "greater_equal_", "less_", "less_equal_", "not_equal_",
}


def method_name(kind: str, target) -> Optional[str]:
    """The tensor method a call runs: 'add_' for `x.add_(y)` (a call_method node) and for
    `torch.Tensor.add_(x, y)`, `torch.relu_(x)` or `F.leaky_relu_(x)` (torch._C._nn's, which
    has no method of that name) (a function); None for anything else."""
    if kind == "call_method":
        return target if isinstance(target, str) else None
    name = getattr(target, "__name__", None)
    if not isinstance(name, str):
        return None
    if any(getattr(home, name, None) is target for home in (torch.Tensor, torch, torch._C._nn)):
        return name
    return None


def out_of_place(kind: str, target, name: str) -> tuple:
    """(kind, target) of the call that computes what in-place `name` (SAME_AS_OUT_OF_PLACE)
    writes, with the same arguments: the tensor method without its `_`, or, where tensors have
    none (`celu`, `leaky_relu`), the function beside the in-place one (torch.celu,
    torch._C._nn.leaky_relu)."""
    base = name[:-1]
    if hasattr(torch.Tensor, base):
        return "call_method", base
    home = next(h for h in (torch, torch._C._nn) if kind == "call_function" and getattr(h, name, None) is target)
    return "call_function", getattr(home, base)


def saves_what_it_wrote(node: torch.fx.Node) -> bool:
    """Whether eager's autograd, running the in-place op a functionalized node stands for
    (`h.relu_()`, F.leaky_relu(h, inplace=True), now out of place), saves the tensor it wrote,
    as it is after the write: a later write to it makes eager's backward raise. (Its
    out-of-place twin may save its input instead: leaky_relu does.) Asked of eager once per op
    and arguments, on a small tensor; an op with other tensor arguments is not asked (False)."""
    args, kwargs = node.args[1:], dict(node.kwargs)
    if not node.args or any(isinstance(a, torch.fx.Node) for a in (*args, *kwargs.values())):
        return False
    try:
        key = (node.op, node.target, args, tuple(sorted(kwargs.items())))
        hash(key)
    except TypeError:
        return False
    if key not in _SAVES_WHAT_IT_WROTE:
        _SAVES_WHAT_IT_WROTE[key] = _asked_of_eager(node.op, node.target, args, kwargs)
    return _SAVES_WHAT_IT_WROTE[key]


_SAVES_WHAT_IT_WROTE: dict = {}


def _asked_of_eager(kind: str, target, args: tuple, kwargs: dict) -> bool:
    written = torch.randn(6, requires_grad=True) * 1        # (not a leaf: it may be written)
    if kind == "call_method" and hasattr(torch.Tensor, f"{target}_"):
        run = lambda t: getattr(t, f"{target}_")(*args, **kwargs)       # noqa: E731
    elif kind == "call_function" and "inplace" in _parameters(target):
        bound = inspect.signature(target).bind(written, *args, **kwargs)
        bound.arguments["inplace"] = True
        run = lambda t: target(t, *bound.args[1:], **bound.kwargs)      # noqa: E731
    elif kind == "call_function" and any(getattr(h, getattr(target, "__name__", ""), None) is target
                                         and hasattr(h, f"{target.__name__}_") for h in (torch, torch._C._nn)):
        home = next(h for h in (torch, torch._C._nn) if getattr(h, target.__name__, None) is target)
        run = lambda t: getattr(home, f"{target.__name__}_")(t, *args, **kwargs)   # noqa: E731
    else:
        return False
    saved = []
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(t) or t, lambda t: t):
            result = run(written)
    except Exception:            # (eager refuses these arguments here: nothing to say)
        return False
    return any(t is result for t in saved)


def _parameters(target) -> tuple:
    try:
        return tuple(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return ()


def inplace_flag(target, args, kwargs, constant: Callable = lambda v: v) -> bool:
    """`inplace=True` given to a function of torch.nn.functional (by keyword or position)."""
    if "inplace" in kwargs:
        return constant(kwargs["inplace"]) is True
    if getattr(target, "__module__", "") != "torch.nn.functional":
        return False
    try:
        bound = inspect.signature(target).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return constant(bound.arguments.get("inplace")) is True


def written(kind: str, target, args, kwargs, is_tensor: Callable[[Any], bool],
            constant: Callable[[Any], Any] = lambda v: v) -> list:
    """Where the call writes: a list of locators, ('arg', i), ('kwarg', name) or
    ('item', i, j) (the j-th tensor of the list in argument i, for torch._foreach_*_).
    `is_tensor` says whether an argument is a tensor, `constant` what Python value it is
    (for flags such as `inplace=True`): the arguments may be FX nodes or traced variables."""
    if kind not in ("call_method", "call_function"):
        return []
    out: list = []
    if "out" in kwargs:
        value = kwargs["out"]
        out += [("kwarg", "out")] if not isinstance(value, (tuple, list)) else \
               [("kwarg_item", "out", j) for j in range(len(value))]
    if kind == "call_function" and target in AUGMENTED and args and is_tensor(args[0]):
        return out + [("arg", 0)]
    if kind == "call_function" and target is operator.setitem and args and is_tensor(args[0]):
        return out + [("arg", 0)]
    name = method_name(kind, target)
    if name is not None and name.endswith("_") and not name.startswith("_") and args:
        if name.startswith("_foreach_") or (kind == "call_function" and name.startswith("_foreach")):
            return out + [("item", 0, j) for j in range(len(_items(args[0])))]
        if is_tensor(args[0]):
            return out + [("arg", 0)]
    if kind == "call_function" and isinstance(getattr(target, "__name__", None), str) \
            and target.__name__.startswith("_foreach_") and target.__name__.endswith("_") and args:
        return out + [("item", 0, j) for j in range(len(_items(args[0])))]
    if kind == "call_function" and callable(target) and inplace_flag(target, args, kwargs, constant) \
            and args and is_tensor(args[0]):
        return out + [("arg", 0)]
    if kind == "call_function" and target in RUNNING_STATS:
        *running, (at, name, default) = RUNNING_STATS[target]
        if constant(kwargs[name] if name in kwargs else args[at] if len(args) > at else default) is True:
            for at, name in running:
                loc = ("arg", at) if len(args) > at else ("kwarg", name)
                if (len(args) > at or name in kwargs) and is_tensor(locate(loc, args, kwargs)):
                    out.append(loc)
    return out


# Functions that update the running statistics they are handed (aten's schemas of
# native_batch_norm, batch_norm and instance_norm do not say so): function -> where the
# running mean and variance are, then the flag that makes them update and its default
# (each: position, name). torch.batch_norm's arguments are in another order than F.batch_norm's.
RUNNING_STATS = {
    F.batch_norm: ((1, "running_mean"), (2, "running_var"), (5, "training", False)),
    F.instance_norm: ((1, "running_mean"), (2, "running_var"), (5, "use_input_stats", True)),
    torch.batch_norm: ((3, "running_mean"), (4, "running_var"), (5, "training", None)),
    torch.native_batch_norm: ((3, "running_mean"), (4, "running_var"), (5, "training", None)),
    torch.instance_norm: ((3, "running_mean"), (4, "running_var"), (5, "use_input_stats", None)),
}


# Of those, the ones whose writes leave the statistics' version counters as they were (ATen's
# batch norm kernels update them through their data; instance norm copies into them, a write)
UNVERSIONED_WRITES = {F.batch_norm, torch.batch_norm, torch.native_batch_norm}


def node_writes(node) -> list:
    """`written` of an FX node, whose tensor arguments are the nodes among its arguments."""
    return written(node.op, node.target, node.args, node.kwargs, lambda a: isinstance(a, torch.fx.Node))


def returns_written(kind: str, target, args, kwargs, constant: Callable[[Any], Any] = lambda v: v) -> bool:
    """The call's result is the tensor it wrote (`x.add_(y)` is x, `x += y` is x,
    `F.relu(x, inplace=True)` is x, `torch.mul(a, b, out=w)` is w)."""
    name = method_name(kind, target)
    if name is not None and name.endswith("_") and not name.startswith("_"):
        return True
    return (kind == "call_function" and target in AUGMENTED) or "out" in kwargs or \
        (kind == "call_function" and inplace_flag(target, args, kwargs, constant))


def locate(loc, args, kwargs):
    """The argument a locator names."""
    if loc[0] == "arg":
        return args[loc[1]]
    if loc[0] == "kwarg":
        return kwargs[loc[1]]
    if loc[0] == "item":
        return _items(args[loc[1]])[loc[2]]
    return _items(kwargs[loc[1]])[loc[2]]


def _items(sequence):
    """A list or tuple argument's items: FX's, the examples', or a traced list's (`.items`)."""
    return sequence.items if hasattr(sequence, "items") and not isinstance(sequence, dict) else sequence


def storage_address(t: torch.Tensor):
    """Where a tensor's memory (its storage) begins; None for a tensor without storage."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:                    # noqa: BLE001 (a wrapper subclass, a functional tensor)
        return None


def overlaps_itself(t: torch.Tensor) -> bool:
    """Whether elements of t share memory (an expanded tensor, x.unfold(0, 3, 1)): eager
    refuses most writes into such a tensor and makes the rest element by element, the same
    memory written again for each element on it; a functional graph writes each place once."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1)
    reach = 1                                # elements spanned by the dims of smaller strides
    for st, n in dims:
        if st < reach:
            break
        reach = st * (n - 1) + reach
    else:
        return False                         # each dim steps past all the smaller ones: apart
    if any(st == 0 for st, _ in dims):
        return True
    # strides that interleave (a transposed unfold) may still keep the elements apart: count
    # the places they take
    taken = _places_taken(1 + sum(st * (n - 1) for st, n in dims),
                          [n for _, n in dims], [st for st, _ in dims])
    return int(taken.count_nonzero()) < t.numel()


def partly_overlaps(written: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether an in-place call's source `other` shares some of the memory it writes without
    being the very tensor written (`x[1:] = x[:-1]`): eager refuses most such calls, and
    computes the rest in its kernels' order, where a functional graph would read a copy."""
    if written.numel() == 0 or other.numel() == 0 or written.device != other.device:
        return False
    address = storage_address(written)
    if address is None or address != storage_address(other):
        return False
    views = [(t.storage_offset() * t.element_size(), tuple(t.shape), t.stride(), t.element_size())
             for t in (written, other)]
    if views[0] == views[1]:
        return False                                  # x.add_(x): the same elements, in place
    spans = [(begin, begin + size * (1 + sum((n - 1) * s for n, s in zip(shape, stride))))
             for begin, shape, stride, size in views]
    if spans[0][1] <= spans[1][0] or spans[1][1] <= spans[0][0]:
        return False                                  # apart: x[:3] += x[3:]
    if written.element_size() != other.element_size():
        return True
    # spans that meet may still hold no common element (x[:, 0] and x[:, 1])
    length = max(end for _, end in spans) // written.element_size()
    taken = [_places_taken(length, shape, stride, begin // size) for begin, shape, stride, size in views]
    return bool((taken[0] & taken[1]).any())


def _places_taken(length: int, shape, stride, offset: int = 0) -> torch.Tensor:
    """The elements of a memory of `length` elements that a view of this shape, stride and
    offset reaches, marked True."""
    marks = torch.zeros(length, dtype=torch.bool)
    marks.as_strided(shape, stride, offset).fill_(True)
    return marks


def writes_metadata(kind: str, target) -> bool:
    """The call changes a tensor's sizes, strides or storage (no value can stand for it)."""
    name = method_name(kind, target)
    return name in METADATA_WRITES


# ---------------------------------------------------------------------------------------
# Functional forms: a call that computes, as new tensors, what an in-place call writes
# ---------------------------------------------------------------------------------------
def batch_norm_training(input, running_mean, running_var, weight=None, bias=None,
                        momentum=0.1, eps=1e-5):
    """F.batch_norm in training without writing: -> (output, new running mean, new running
    variance), the new statistics computed as F.batch_norm updates them (None where there are
    none). Lowering fuses it; this body is what runs where it is not lowered."""
    if running_mean is None or running_var is None or momentum is None:
        mean = running_mean.clone() if running_mean is not None else None
        var = running_var.clone() if running_var is not None else None
        return F.batch_norm(input, mean, var, weight, bias, True, momentum, eps), mean, var
    # aten's functional form: traced for training (autograd/joint.py), it writes nothing, so
    # the joint graph needs no functionalization (F.batch_norm on clones writes into them)
    F._verify_batch_size(input.size())
    out, _, _, mean, var = torch.ops.aten._native_batch_norm_legit_functional(
        input, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, var


def copy_into(dest, src):
    """The value `dest.copy_(src)` leaves in dest: src broadcast to dest's shape, in its dtype,
    laid out as dest. A new tensor, never src or a view of it: the graph may return it, and a
    write into what it returns must not reach src. (Made of differentiable ops: traced for
    training, aten's functional copy has no derivative.)"""
    if not isinstance(src, torch.Tensor):
        return torch.full_like(dest, src)
    value = src.to(device=dest.device, dtype=dest.dtype).expand(dest.shape)
    if dest.is_contiguous():
        return value.clone(memory_format=torch.contiguous_format)
    return torch.empty_like(dest).copy_(value)


def overwritten(dest, value):
    """`value` in place of the whole of dest as autograd sees an in-place overwrite: still
    connected to dest, with a zero gradient (eager's x.clone().fill_(v) requires grad where x
    does, where full_like's result would not)."""
    return torch.where(torch.ones_like(dest, dtype=torch.bool), value, dest)


class _WrittenUnseen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dest, value):
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# a node's meta key: the node is `x.data` (a detach whose tensor has a version counter of its
# own: eager's writes through it leave x's version as it was, so a tensor saved for backward
# and written so raises nothing, and the backward reads its new value)
OWN_VERSION_COUNTER = "own_version_counter"
# a node's meta key: the node computes (part of) an in-place op's write, made a value by
# functionalize.py, into these tensors (the names of the nodes that own their memory in the
# captured graph: a graph input, or the op that computed it)
WRITES = "writes"
# a node's meta key: the node's value is what a tensor of the captured graph (named: the node
# that owns its memory) holds until a later in-place op writes it again; eager's autograd,
# saving that tensor for backward, finds it changed then
WRITTEN_LATER = "written_later"
# a node's meta key: the node is a view of the memory of a tensor of the captured graph (named
# as in WRITES), or a detach of it (`.data` too)
VIEW_OF = "view_of"


def stored_into(value: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether compiled code stored the new value `value` of x straight into x's memory: one
    tensor, or two that begin at one address and take the same memory element for element (a
    dim of size 1 has a stride that says nothing: x[::2] of 2 elements is (1,) by (2,))."""
    return value is x or (value.data_ptr() == x.data_ptr() and value.shape == x.shape and all(
        sv == sx for sv, sx, n in zip(value.stride(), x.stride(), x.shape) if n > 1))


def written_unseen(dest, value):
    """dest's new value `value`, written under no_grad: autograd goes on seeing dest (a later
    use's gradient flows into dest's history unchanged), as eager's tensor keeps its own.
    (Run where the graph's grad mode is off, for the uses after, where it is on.)"""
    with torch.enable_grad():
        return _WrittenUnseen.apply(dest, value)


def on_a_copy(kind: str, target, written_at):
    """A function that runs an in-place call on copies of what it writes and returns what the
    call returns, then the new values (one per locator in `written_at`): the functional form of
    any write, run by PyTorch (lowering leaves it to PyTorch's kernels)."""
    def run(*args, **kwargs):
        args, kwargs = list(args), dict(kwargs)
        copies = []
        for loc in written_at:
            original = locate(loc, args, kwargs)
            copy = original.clone()
            if loc[0] == "arg":
                args[loc[1]] = copy
            elif loc[0] == "kwarg":
                kwargs[loc[1]] = copy
            elif loc[0] == "item":
                args[loc[1]] = list(args[loc[1]])
                args[loc[1]][loc[2]] = copy
            else:
                kwargs[loc[1]] = list(kwargs[loc[1]])
                kwargs[loc[1]][loc[2]] = copy
            copies.append(copy)
        if kind == "call_method":
            result = getattr(args[0], target)(*args[1:], **kwargs)
        else:
            result = target(*args, **kwargs)
        return (result, *copies)
    name = target if isinstance(target, str) else getattr(target, "__name__", "op")
    run.__name__ = run.__qualname__ = f"{name}_on_a_copy"
    return run
