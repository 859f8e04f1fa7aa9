"""ATen -> the torch-level calls lowering takes.

Takes an aten-level FX graph (a half of the partitioned joint graph, each node's fake value in
`meta["val"]`) and hands lowering the same graph written with the torch functions and tensor
methods its table knows (`lower/lowerings.py`): `aten.add.Tensor` becomes `torch.add`,
`aten.view` the method `view`, `aten.var_mean` a `torch.var` and a `torch.mean`, `aten.alias`
nothing. Each new node keeps the fake value of the node it replaces, so lowering reads sizes,
strides and dtypes from it, never running the graph.

An op without a translation stays an aten op: lowering hands it to PyTorch (an extern call,
as Inductor's fallback kernels), which computes exactly what the joint graph traced.
"""
from __future__ import annotations

import operator

import torch
import torch.fx
import torch.nn.functional as F

from .joint import graph_module

aten, prims = torch.ops.aten, torch.ops.prims


def _function(fn):
    return lambda g, args, kwargs: g.call_function(fn, args, kwargs)


def _method(name, unpack=False):
    """A tensor method; unpack: the op's list argument becomes the method's *args."""
    def emit(g, args, kwargs):
        if unpack:
            args = (args[0], *args[1])
        return g.call_method(name, args, kwargs)
    return emit


def _index_at(dim: int, item) -> tuple:
    """The subscript that applies `item` to dimension `dim` (negative: counted from the end)."""
    if dim < 0:
        return (Ellipsis, item) + (slice(None),) * (-dim - 1)
    return (slice(None),) * dim + (item,)


def _slice(g, args, kwargs):
    x, dim, start, end, step = (list(args) + [0, None, None, 1][len(args) - 1:])[:5]
    return g.call_function(operator.getitem, (x, _index_at(dim, slice(start, end, step))))


def _select(g, args, kwargs):
    x, dim, index = args
    return g.call_function(operator.getitem, (x, _index_at(dim, index)))


def _index(g, args, kwargs):
    """x[..., i0, i1, ...]: a None among the indices is a whole dim (a full slice)."""
    x, indices = args
    if kwargs:
        return None
    return g.call_function(operator.getitem, (x, tuple(slice(None) if i is None else i for i in indices)))


def _to(g, args, kwargs):
    if set(kwargs) - {"dtype", "layout", "device", "memory_format"} or len(args) != 1 \
            or kwargs.get("layout", torch.strided) != torch.strided:
        return None
    return g.call_method("to", (args[0],), {"dtype": kwargs["dtype"]} if "dtype" in kwargs else {})


def _convert(g, args, kwargs):
    return g.call_method("to", (args[0],), {"dtype": args[1]})


def _convolution(g, args, kwargs):
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args
    if transposed or any(output_padding) or len(stride) != 2:
        return None
    return g.call_function(torch.conv2d, (x, w, b, tuple(stride), tuple(padding), tuple(dilation), groups))


def _scalar_tensor(g, args, kwargs):
    return g.call_function(torch.full, ([], args[0]), kwargs)


def _full_like(g, args, kwargs):
    """A tensor of the node's shape filled with one value (lowering reads the shape, dtype and
    device from the node's fake value); a layout other than the default is left to PyTorch."""
    if kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return None
    val = args[0].meta.get("val")
    if val is None:
        return None
    # a size that is a symbol (dynamic shapes) read from the tensor, as the joint graph reads it
    shape = [_size_of(g, args[0], d, size) if isinstance(size, torch.SymInt) else size
             for d, size in enumerate(val.shape)]
    # (full_like's dtype and device are its input's, where torch.full's would be the fill's)
    rest = {"dtype": val.dtype, "device": val.device,
            **{k: v for k, v in kwargs.items() if k != "memory_format" and v is not None}}
    return g.call_function(torch.full, (shape, args[1]), rest)


def _size_of(g, node, dim: int, size):
    """A node reading `node.size(dim)`, with its value as every node has one (lowering takes
    the values from the nodes rather than running the graph)."""
    read = g.call_method("size", (node, dim))
    read.meta["val"] = size
    return read


def _copy(g, args, kwargs):
    """copy(self, src): a new tensor holding src in self's place. Where src already has self's
    shape, dtype and device (a running statistic's new value), that is a clone of src; other
    copies (casts, broadcasts, across devices) are left to PyTorch."""
    into, src = args[0].meta.get("val"), args[1].meta.get("val")
    if not isinstance(into, torch.Tensor) or not isinstance(src, torch.Tensor) \
            or (into.shape, into.dtype, into.device) != (src.shape, src.dtype, src.device):
        return None
    return g.call_method("clone", (args[1],))


def _on_bools(fn):
    """An aten bitwise op on bool tensors (masks) as its logical op; on integers, PyTorch's."""
    def emit(g, args, kwargs):
        if any(isinstance(a, torch.fx.Node) and getattr(a.meta.get("val"), "dtype", None) != torch.bool
               for a in args):
            return None
        return g.call_function(fn, args, kwargs)
    return emit


def _addmm(g, args, kwargs):
    return g.call_function(torch.addmm, args, kwargs) if not kwargs else None


def view_as_real_resolved(x: torch.Tensor) -> torch.Tensor:
    """view_as_real of a value the graph may have conjugated lazily (`_conj`, a conjugate bit):
    autograd reads the real and imaginary parts of such a gradient as the trace records, but
    run as PyTorch's op, view_as_real refuses it (where not conjugated, still a view)."""
    return torch.view_as_real(x.resolve_conj())


_TABLE = {
    aten.mm.default: _function(torch.mm), aten.bmm.default: _function(torch.bmm),
    aten.addmm.default: _addmm, aten.convolution.default: _convolution,
    aten.where.self: _function(torch.where), aten.pow.Tensor_Scalar: _function(torch.pow),
    aten.clamp.default: _function(torch.clamp), aten.hardtanh.default: _function(F.hardtanh),
    aten.constant_pad_nd.default: _function(torch.constant_pad_nd), aten.gelu.default: _function(F.gelu),
    aten.silu.default: _function(F.silu), aten.embedding.default: _function(torch.embedding),
    aten.sum.dim_IntList: _function(torch.sum), aten.sum.default: _function(torch.sum),
    aten.mean.dim: _function(torch.mean), aten.mean.default: _function(torch.mean),
    aten.amax.default: _function(torch.amax), aten.amin.default: _function(torch.amin),
    aten.var.correction: _function(torch.var),
    aten._softmax.default: lambda g, a, k: g.call_function(torch.softmax, a[:2]),
    aten._log_softmax.default: lambda g, a, k: g.call_function(torch.log_softmax, a[:2]),
    aten.view.default: _method("view", unpack=True), aten._unsafe_view.default: _method("reshape", unpack=True),
    aten.reshape.default: _method("reshape", unpack=True), aten.permute.default: _method("permute", unpack=True),
    aten.expand.default: _method("expand", unpack=True), aten.t.default: _method("t"),
    aten.transpose.int: _method("transpose"), aten.unsqueeze.default: _method("unsqueeze"),
    aten.squeeze.dim: _method("squeeze"), aten.squeeze.dims: _method("squeeze"),
    aten.squeeze.default: _method("squeeze"), aten.slice.Tensor: _slice, aten.select.int: _select,
    aten.clone.default: lambda g, a, k: g.call_method("clone", a[:1], k),
    aten.split_with_sizes.default: _function(torch.split), aten.split.Tensor: _function(torch.split),
    aten.cat.default: _function(torch.cat), aten.slice_scatter.default: _function(torch.slice_scatter),
    aten.index.Tensor: _index, aten.gather.default: _function(torch.gather),
    aten._to_copy.default: _to, prims.convert_element_type.default: _convert,
    aten.full.default: _function(torch.full), aten.scalar_tensor.default: _scalar_tensor,
    aten.full_like.default: _full_like, aten.copy.default: _copy,
    aten.arange.default: _function(torch.arange), aten.arange.start: _function(torch.arange),
    aten.arange.start_step: _function(torch.arange),
    aten.logical_not.default: _function(torch.logical_not), aten.bitwise_not.default: _on_bools(torch.logical_not),
    aten.bitwise_and.Tensor: _on_bools(torch.logical_and), aten.bitwise_or.Tensor: _on_bools(torch.logical_or),
    aten.any.dim: _function(torch.any), aten.any.dims: _function(torch.any), aten.any.default: _function(torch.any),
}
for _name in ["add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum",
              "logical_and", "logical_or"]:
    for _overload in ("Tensor", "Scalar", "default"):
        _op = getattr(getattr(aten, _name), _overload, None)
        if _op is not None:
            _TABLE[_op] = _function(getattr(torch, _name))
for _name in ["neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "reciprocal", "abs",
              "relu", "sin", "cos", "floor", "ceil"]:
    _TABLE[getattr(aten, _name).default] = _function(getattr(torch, _name))

_TABLE[aten.view_as_real.default] = _function(view_as_real_resolved)
_TABLE[aten.sym_size.int] = _method("size")      # sizes the graph is generic in
_TABLE[aten.sym_numel.default] = _method("numel")

_IDENTITY = {aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default}


def to_torch(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    new = torch.fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            new.output(torch.fx.node.map_arg(node.args[0], lambda a: env[a]))
            continue
        args = torch.fx.node.map_arg(node.args, lambda a: env[a])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: env[a])
        if node.op == "call_function" and node.target in _IDENTITY:
            env[node] = args[0]
            continue
        if node.op == "call_function" and node.target is aten.var_mean.correction:
            env[node] = _var_mean(new, node, args, kwargs)
            continue
        if node.target is operator.getitem and isinstance(args[0], tuple):
            env[node] = args[0][args[1]]          # an item of var_mean's pair
            continue
        made = None
        if node.op == "call_function" and node.target in _TABLE:
            made = _TABLE[node.target](new, args, kwargs)
        if made is None:
            made = new.node_copy(node, lambda a: env[a])
            made.args, made.kwargs = args, kwargs
        made.meta = dict(node.meta)
        env[node] = made
    return graph_module(gm, new)


def _var_mean(g, node, args, kwargs):
    """var_mean as a var and a mean over the same rows (fusion puts them in one kernel): the
    pair of nodes, which the getitems of var_mean read."""
    x, dims = args[0], (args[1] if len(args) > 1 else kwargs.get("dim"))
    keepdim = kwargs.get("keepdim", False)
    var = g.call_function(torch.var, (x, dims), {"correction": kwargs.get("correction", 1), "keepdim": keepdim})
    mean = g.call_function(torch.mean, (x, dims), {"keepdim": keepdim})
    var.meta, mean.meta = {"val": node.meta["val"][0]}, {"val": node.meta["val"][1]}
    return var, mean
