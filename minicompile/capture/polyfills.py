"""Python stand-ins the translator traces in place of library functions whose own code it cannot
trace, as Dynamo's polyfills do.

Takes: a call the translator found in `POLYFILLS` (by the function's module and name: the
module need not be imported). Hands on: nothing of its own; the stand-in is inlined like any
user function, so the graph gets the ops it runs.

`associative_scan` (torch._higher_order_ops; transformers' Mamba layers call it when they are
compiled): eager runs the combine function under `torch.vmap` over pairs of slices. Here it is
called on the slices themselves (`combine_pointwise`), which computes what vmap does when the
function is pointwise: the translator checks that it is (the ops it traced are all tagged
pointwise, the results shaped as the inputs), and breaks the graph where it is not. The scan
itself is Hillis and Steele's (`_scan`), whose graph serves a range of lengths.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .values import example_of


def combine_pointwise(combine_fn, left, right):
    """combine_fn(left, right): traced, its ops must be pointwise (`trace_combine_pointwise`)."""
    return combine_fn(left, right)


# operator functions whose aten op has another name
_ATEN_NAMES = {"truediv": "div", "floordiv": "floor_divide", "mod": "remainder", "and_": "bitwise_and",
               "or_": "bitwise_or", "xor": "bitwise_xor", "invert": "bitwise_not"}


def _pointwise(node: torch.fx.Node) -> bool:
    """An op that computes each element from the same element of its inputs (its aten op is
    tagged pointwise), writing nothing in place."""
    if isinstance(node.target, torch._ops.OpOverload):
        return torch.Tag.pointwise in node.target.tags
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op not in ("call_method", "call_function") or not isinstance(name, str) or name.endswith("_"):
        return False
    packet = getattr(torch.ops.aten, _ATEN_NAMES.get(name, name), None)
    return isinstance(packet, torch._ops.OpOverloadPacket) and any(
        torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())


def trace_combine_pointwise(tx, args, kwargs):
    """combine_pointwise, traced: combine_fn inlined, then refused (a graph break) unless every
    op it added is pointwise and each result is shaped as the inputs, where calling it on
    slices gives what eager's vmap of it does."""
    graph = tx.output.graph
    before = set(graph.nodes)
    combine_fn, left, right = args
    result = tx.call_function(combine_fn, [left, right], {})
    odd = next((n for n in graph.nodes if n not in before and not _pointwise(n)), None)
    if odd is not None:
        raise tx.unsupported(f"associative_scan with a combine_fn that is not pointwise: `{odd.format_node()}`",
                             "eager runs it under torch.vmap, which minicompile does not model")
    shape = pytree.tree_leaves(example_of(left))[0].shape
    if any(getattr(r, "shape", None) != shape for r in pytree.tree_leaves(example_of(result))):
        raise tx.unsupported("associative_scan with a combine_fn whose results are not shaped as its inputs",
                             "eager runs it under torch.vmap, which minicompile does not model")
    return result


def associative_scan(combine_fn, xs, dim, reverse=False, combine_mode="pointwise"):
    leaves, spec = pytree.tree_flatten(xs)
    if not callable(combine_fn):
        raise ValueError(f"Combine_fn must be a callable, but got {combine_fn}")
    if not isinstance(dim, int):
        raise ValueError("Dim must be an int, but got " + str(type(dim)))
    if not isinstance(reverse, bool):
        raise RuntimeError("Reverse must be a bool, but got " + str(type(reverse)))
    if combine_mode not in ("pointwise", "generic"):
        raise ValueError(f"Combine_mode must either 'pointwise' or 'generic', but got {combine_mode}")
    if combine_mode == "pointwise" and not all(x.device.type in ("cuda", "xpu") for x in leaves):
        raise ValueError("For combine_mode='pointwise', all input tensors need to be on CUDA or XPU")
    if not leaves:
        raise ValueError("Expected at least 1 xs leaf")
    if any(not isinstance(x, torch.Tensor) for x in leaves):
        raise ValueError("xs leaves must be a Tensor")
    ndim = leaves[0].ndim
    if not -ndim <= dim < max(ndim, 1):
        raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], "
                         f"but got {dim})")
    dim = dim + ndim if dim < 0 else dim
    if any(x.ndim <= dim or x.shape[dim] == 0 for x in leaves):
        raise ValueError("All xs leaves must at least have 'dim' number of dimensions and scan dimension > 0")
    leaves = [torch.movedim(x, dim, 0) for x in leaves]
    if reverse:
        leaves = [x.flip([0]) for x in leaves]
    count = len(leaves)

    def combine(*pieces):
        left = pytree.tree_unflatten(list(pieces[:count]), spec)
        right = pytree.tree_unflatten(list(pieces[count:]), spec)
        return pytree.tree_leaves(combine_pointwise(combine_fn, left, right))

    out = _scan(combine, leaves)
    if reverse:
        out = [x.flip([0]) for x in out]
    return pytree.tree_unflatten([torch.movedim(x, 0, dim) for x in out], spec)


def _scan(combine, elems):
    """An inclusive scan over dim 0 in ceil(log2 n) steps, each combining every element with
    the one k before it (Hillis and Steele). The steps depend on n only through their count,
    guarded as a range (2**(j-1) < n <= 2**j): one graph serves every length in it, where
    eager's recursion (pairs of neighbours, then the halves) takes a branch on each bit of n.
    Its pairs are combined in another order than eager's: the values agree to rounding."""
    n, k = elems[0].shape[0], 1
    while k < n:
        combined = combine(*[e[:-k] for e in elems], *[e[k:] for e in elems])
        elems = [torch.cat([e[:k], c], dim=0) for e, c in zip(elems, combined)]
        k *= 2
    return elems


# (module, name) of a library function -> its stand-in
POLYFILLS = {("torch._higher_order_ops.associative_scan", "associative_scan"): associative_scan}
