"""Lowering: an FX graph of torch-level calls -> the loop IR (`minicompile.ir.Program`).

Takes the backend contract's `torch.fx.GraphModule` and example inputs (from minicompile's own
capture, or from TorchDynamo when minicompile is a `torch.compile` backend) and hands fusion a
`Program`: input buffers, IR nodes in order, outputs.

Each FX node is looked up in the lowering table (`lowerings.py`) by its target: an operator
(`operator.add`), a torch function (`torch.relu`, `F.gelu`) or a tensor method name (`"sum"`).
Arguments are bound to the op's declared signature, so `torch.sum(x, 1)`, `x.sum(dim=1)` and
`torch.sum(input=x, dim=1)` lower alike. An op with no lowering is not an error: it becomes an
`Extern` that calls the same PyTorch function at run time on realized inputs (what Inductor
calls a fallback kernel), and the reason is recorded for the `fusion` log.

Lowering never decides what is fused; it builds every value as an unrealized `TensorBox`
and leaves realization to the fusion passes.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import math
import operator
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from .. import ir
from .boxes import TensorBox
from .. import aliasing
from .lowerings import (LOWERINGS, constant_tensor, copy_of, lookup, lookup_factory, lower_fallback,
                        scalar_arithmetic, size_arithmetic, viewed_value)


def _example_values(gm: torch.fx.GraphModule, example_inputs) -> dict[torch.fx.Node, Any]:
    """The value each node produced: from node.meta where the tracer left it (minicompile's
    capture and TorchDynamo both do) and its inputs were laid out as the examples are,
    otherwise by running the graph once on the examples. (A backward traced with a saved
    value as a view with room between its items, and given it dense: its traced values are
    not what the kernels will read.)"""
    nodes = list(gm.graph.nodes)
    if all("example_value" in n.meta or "val" in n.meta for n in nodes if n.op not in ("output",)):
        values = {n: n.meta.get("example_value", n.meta.get("val")) for n in nodes if n.op != "output"}
        placeholders = [n for n in nodes if n.op == "placeholder"]
        if all(_laid_out_as(values[n], v) for n, v in zip(placeholders, example_inputs)):
            return values
    values = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n] = out
            return out

    # a graph of TorchDynamo's generic in its sizes (SymInt inputs, fake values of symbolic
    # sizes): run on those fake values, in their mode, so every value's sizes and strides are
    # the symbolic ones (the examples' would bake in the first call's)
    traced = [n.meta.get("example_value", n.meta.get("val")) for n in nodes if n.op == "placeholder"]
    fake_mode = ir.fake_mode_of(traced) if any(
        isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and _symbolic(v) for v in traced) else None
    try:
        with torch.no_grad(), fake_mode if fake_mode is not None else contextlib.nullcontext():
            Recorder(gm).run(*(traced if fake_mode is not None else example_inputs))
    except Exception as err:
        raise NotImplementedError(f"the graph does not run on its example inputs: {type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''}") from err
    return values


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(n, torch.SymInt) for n in (*t.shape, *t.stride()))


def _laid_out_as(traced, example) -> bool:
    """Whether a traced value has the example's sizes and strides (over dims longer than 1)."""
    if not isinstance(example, torch.Tensor) or not isinstance(traced, torch.Tensor):
        return True
    shape, stride = _hinted(traced.shape), _hinted(traced.stride())
    return shape == list(example.shape) and all(
        a == b for a, b, n in zip(stride, example.stride(), example.shape) if n > 1)


def _symbolic_example_values(gm: torch.fx.GraphModule, example_inputs):
    """Dynamic shapes: the value of each node as a fake tensor whose dynamic dimensions are
    size symbols, or None when no input has a dynamic dimension.

    minicompile's capture marks them in each placeholder's `meta["dynamic_dims"]`; the graph
    is run once on fake tensors (no data) under torch's own shape environment, which works out
    every intermediate size as an expression of the symbols and records what the ops needed
    to hold of them (its guards: `s0 == s1` where two sizes broadcast together, say).
    TorchDynamo's graphs arrive with these fake values already in `meta["example_value"]`."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    dynamic = [set(n.meta.get("dynamic_dims", ())) for n in placeholders]
    if not any(dynamic):
        return None, None
    mode = ir.fake_mode()
    fakes = [ir.symbolic_fake(mode, value, dims, f"arg{i}")
             for i, (dims, value) in enumerate(zip(dynamic, example_inputs))]
    values: dict[torch.fx.Node, Any] = dict(zip(placeholders, fakes))

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n] = out
            return out

    quiet = logging.getLogger("torch._subclasses.fake_tensor")     # (it logs what it raises)
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with ir.running_symbolically(mode):
            Recorder(gm).run(*fakes)
    except NotImplementedError:
        raise
    except Exception as err:
        # an op that cannot run on size symbols (torch.tensor of a list of tensors reads their
        # data; a meta function that checks a dtype): code for the example's sizes instead
        raise NotImplementedError(f"the graph does not run on symbolic sizes: {type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''}") from err
    finally:
        quiet.setLevel(level)
    return values, mode.shape_env


def _traced_symbolic_values(gm: torch.fx.GraphModule, example_inputs):
    """The symbolic run's values, where the graph already carries them: the halves of a joint
    graph traced on size symbols (autograd/) hold each node's fake value in `meta["val"]`, its
    sizes expressions of the trace's symbols. Taken where each placeholder's value is laid out
    as its example input (the forward's are the trace's primals; a backward's inputs are dense,
    in the order of their dims in memory, or views with room between their items, as
    CompiledTraining hands them over: autograd.function.SymbolicLayout) and every symbol
    of the trace's shape environment is some input's size (a dim, or a size input, that is that
    symbol alone), which the wrapper reads. Running the graph again would work the same sizes
    out once more, over symbols of its own per dynamic dim. (None, None) otherwise."""
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    if not all("val" in n.meta for n in nodes):
        return None, None
    readable, shape_env = set(), None
    for node, example in zip((n for n in nodes if n.op == "placeholder"), example_inputs):
        val, dims = node.meta["val"], set(node.meta.get("dynamic_dims", ()))
        if isinstance(val, torch.SymInt):                  # a size handed from the forward
            if not dims or type(example) is not int or ir.hint(val) != example:
                return None, None
        elif isinstance(example, torch.Tensor):
            if not isinstance(val, torch.Tensor) or getattr(val, "fake_mode", None) is None \
                    or (val.dtype, val.device, val.dim()) != (example.dtype, example.device, example.dim()) \
                    or _hinted(val.shape) != list(example.shape) or _hinted(val.stride()) != list(example.stride()) \
                    or {d for d, size in enumerate(val.shape) if isinstance(size, torch.SymInt)} != dims:
                return None, None
            if dims and ir.stride_of(val) != _strides_at_every_size(val, example):
                return None, None
        elif dims or isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None, None
        if isinstance(val, (torch.Tensor, torch.SymInt)):
            sizes = val.shape if isinstance(val, torch.Tensor) else [val]
            shape_env = next((s.node.shape_env for s in sizes if isinstance(s, torch.SymInt)), shape_env)
            readable.update(symbol for symbol, _ in ir.symbol_reads(val, ""))
    if shape_env is None:
        return None, None
    # (var_to_val is deprecated for this name where PyTorch has it)
    known = getattr(shape_env, "backed_var_to_val", None)
    if not {str(s) for s in (shape_env.var_to_val if known is None else known)} <= readable:
        return None, None
    return {n: n.meta["val"] for n in nodes}, shape_env


def _a_number(tensor) -> bool:
    return tensor.dim() == 0 and tensor.device.type == "cpu"


def _strides_at_every_size(val, example) -> list:
    """The strides, over the symbols of `val`'s sizes, of a tensor laid out as `example` is at
    every size: its strides where they are numbers (a batch dim outermost); else dense in the
    order of its dims in memory, or a view with whole gaps between its items (ir.gapped_layout)."""
    if list(example.stride()) == ir.stride_of(val):
        return list(example.stride())
    layout = ir.gapped_layout(example.shape, example.stride())
    order, gaps = layout if layout is not None else (ir.stride_order(example.stride()), None)
    return ir.layout_strides(ir.shape_of(val), order, gaps)


def _one_device(example_inputs, values) -> torch.device:
    """The device the graph computes on: its inputs', else its values'. A graph with tensors
    on two (`x.cpu()` in a GPU graph, a CPU factory beside CUDA inputs) runs on PyTorch's
    kernels, which leave each tensor where eager has it: one program's kernels are made for
    one device. A 0-dim CPU tensor goes with another device's tensors in eager, as a number
    (an input, a constant, torch.tensor(3), arithmetic on those): it does not count. A GPU
    kernel reads one copied there (the wrapper's _on_the_host); one computed by a kernel is
    returned on the CPU (_on_eager_device)."""
    counted = [(n, t) for n, v in values.items() for t in pytree.tree_leaves(v)
               if isinstance(t, torch.Tensor) and not _a_number(t)]
    counted += [(None, v) for v in example_inputs if isinstance(v, torch.Tensor) and not _a_number(v)]
    devices = {torch.device(t.device) for _, t in counted}
    if len(devices) > 1:
        usual = collections.Counter(str(t.device) for _, t in counted).most_common(1)[0][0]
        odd = next((n for n, t in counted if n is not None and str(t.device) != usual), None)
        raise NotImplementedError(f"the graph holds tensors on {len(devices)} devices "
                                  f"({', '.join(sorted(str(d) for d in devices))})"
                                  + (f": `{odd.format_node()}`" if odd is not None else ""))
    return devices.pop() if devices else torch.device("cpu")     # (else every tensor is a CPU number)


# factories whose CPU result is the same tensor made on another device (no random numbers)
_FACTORIES = {torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.eye}
_MOVES = {"to", "cuda"}
_INDEXING = {operator.getitem, torch.ops.aten.index.Tensor, torch.ops.aten._unsafe_index.Tensor,
             torch.ops.aten.index_put.default, torch.ops.aten._unsafe_index_put.default}


def _example(n):
    return n.meta.get("example_value", n.meta.get("val"))


def _device_of(v):
    """A tensor's device; None for anything else, a CPU number included (it goes anywhere)."""
    return v.device if isinstance(v, torch.Tensor) and not _a_number(v) else None


def _indexes_into(n, u, main: torch.device) -> bool:
    """Whether `u` uses `n` as an index into a tensor on `main` (the same items are read where
    the index is on `main` too)."""
    return u.op == "call_function" and u.target in _INDEXING and n not in u.args[0:1] \
        and isinstance(u.args[0], torch.fx.Node) and _device_of(_example(u.args[0])) == main


def _made_on(main: torch.device, nodes, real: dict) -> bool:
    """CPU tensors made from the graph's sizes alone, so not folded as constants: factory calls
    (EdgeNeXt's `torch.zeros((B, H, W)).to(device)`, `torch.arange(n)` at dynamic sizes) and
    what is computed from them, where they leave only as moves to `main` or as indices into a
    tensor on `main`: all made on `main` instead (the same items; each `.to` is then a no-op)."""
    def on_cpu(n) -> bool:
        v = _example(n)
        return isinstance(v, torch.Tensor) and not _a_number(v) and v.device.type == "cpu"

    def leaves_for_main(n, u) -> bool:
        if u.op == "call_method" and u.target in _MOVES:
            return _device_of(_example(u)) == main
        return _indexes_into(n, u, main)

    group: list = []
    for n in nodes:
        tensors = [i for i in n.all_input_nodes if isinstance(_example(i), torch.Tensor)]
        if n not in real and n.op in ("call_function", "call_method") and on_cpu(n) \
                and not ir.draws_random_numbers(n) and not aliasing.node_writes(n) \
                and all(i in group for i in tensors) and (tensors or n.target in _FACTORIES):
            group.append(n)
    changed = True
    while changed:                 # what leaves the group otherwise is eager's CPU tensor
        kept = [n for n in group if all(u in group or leaves_for_main(n, u) for u in n.users)
                and all(i in group for i in n.all_input_nodes if isinstance(_example(i), torch.Tensor))]
        changed, group = len(kept) != len(group), kept
    if not group:
        return False
    made: dict = {}                # node -> (its kwargs, its value on main)
    mode = getattr(_example(group[0]), "fake_mode", None)
    try:
        for n in group:
            given = {**n.kwargs, "device": main} if n.target in _FACTORIES else n.kwargs
            if mode is None:       # (the example's own values, as minicompile's capture records)
                made[n] = given, _example(n).to(main)
                continue
            args, kwargs = torch.fx.node.map_arg((n.args, given), lambda i: made[i][1] if i in made
                                                 else _example(i))
            with mode:             # (a tracer's fake values, symbolic sizes)
                made[n] = given, n.target(*args, **kwargs) if n.op == "call_function" else \
                    getattr(args[0], n.target)(*args[1:], **kwargs)
    except Exception:              # (left on the CPU: the graph runs on PyTorch's kernels)
        return False
    for n, (kwargs, value) in made.items():
        n.kwargs = kwargs
        for key in ("example_value", "val"):
            if key in n.meta:
                n.meta[key] = value
    return True


def fold_host_constants(gm: torch.fx.GraphModule, example_inputs) -> None:
    """A GPU graph's CPU tensors that no input feeds (positions made with torch.arange on the
    CPU, `torch.zeros(shape).to(device)`: torchvision's MViT, timm's EdgeNeXt) computed now,
    by the ops eager runs, so eager's values: each becomes a constant of the graph. One the
    graph hands to a `.to(device)` is that call's result, on the device; one that indexes a
    tensor on the graph's device is moved there (the same items are read). The graph then holds
    one device, which one program's kernels are made for. A graph compiled for training is
    folded before its joint graph is traced: a constant saved for the backward is then read
    by the backward itself, not handed on from the forward on the CPU."""
    devices = collections.Counter(str(v.device) for v in example_inputs
                                  if isinstance(v, torch.Tensor) and not _a_number(v))
    if not devices:
        return
    main = torch.device(devices.most_common(1)[0][0])
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    if not any(_device_of(_example(n)) not in (None, main) for n in nodes):
        return
    real: dict = {}                       # node -> its value, computed as eager does
    state = {name for name, _ in gm.named_parameters()} | {name for name, _ in gm.named_buffers()}
    with torch.no_grad():
        for n in nodes:
            inputs = n.all_input_nodes
            if n.op == "get_attr":
                # a constant of the trace's (a module's tensor may change between calls, the
                # optimizer's step writes its parameters)
                attr = _fetch_attr(gm, n.target)
                if isinstance(attr, torch.Tensor) and n.target not in state:
                    real[n] = attr
                continue
            if n.op not in ("call_function", "call_method") or ir.draws_random_numbers(n) \
                    or any(i not in real for i in inputs) or not isinstance(_example(n), torch.Tensor) \
                    or aliasing.node_writes(n):
                continue
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda i: real[i])
            try:
                real[n] = n.target(*args, **kwargs) if n.op == "call_function" else \
                    getattr(args[0], n.target)(*args[1:], **kwargs)
            except Exception:                 # (lowering meets it as eager would)
                continue
    moved_any = _made_on(main, nodes, real)
    folded_any = False
    for n in nodes:
        # (not one the graph returns: a tensor of its own at each call)
        if n not in real or all(u in real for u in n.users) or any(u.op == "output" for u in n.users):
            continue
        constant = real[n]
        if _device_of(constant) not in (None, main):
            if not all(_indexes_into(n, u, main) for u in n.users):
                continue
            constant = constant.to(main)
        elif n.op == "get_attr":
            continue                          # (a constant on the graph's device already)
        name = f"_host_constant{len([m for m in gm.graph.nodes if m.op == 'get_attr'])}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, constant)
        with gm.graph.inserting_before(n):
            folded = gm.graph.get_attr(name)
        folded.meta["val"] = folded.meta["example_value"] = constant
        n.replace_all_uses_with(folded)
        folded_any = True
    if folded_any:
        for n in reversed(nodes):
            if n in real and not n.users:
                gm.graph.erase_node(n)
    if moved_any or folded_any:
        gm.recompile()


def lower(gm: torch.fx.GraphModule, example_inputs) -> ir.Program:
    fold_host_constants(gm, example_inputs)
    values, shape_env = _traced_symbolic_values(gm, example_inputs)
    if values is None:
        values, shape_env = _symbolic_example_values(gm, example_inputs)
    if values is None:
        values = _example_values(gm, example_inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    device = _one_device(example_inputs, values)
    program = ir.Program(inputs=[], nodes=[], outputs=[], device=device)
    program.shape_env = shape_env

    env: dict[torch.fx.Node, Any] = {}
    storages = [_storage(v) for v in example_inputs]
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        traced = values.get(node, value)
        if isinstance(value, torch.Tensor):
            if value.is_neg() or value.is_conj():
                # (its memory holds the values negated, or conjugated, until resolved: what a
                # kernel would read)
                raise NotImplementedError(f"input {node.name} is a view whose negation or conjugation "
                                          "is pending (z.conj().imag): PyTorch's kernels read it")
            if not isinstance(traced, torch.Tensor):
                traced = value
            buf = ir.InputBuffer(f"arg{i}", ir.shape_of(traced), ir.stride_of(traced), 0,
                                 value.dtype, value.device,
                                 shares_memory=storages[i] is not None and storages.count(storages[i]) > 1)
            program.inputs.append(buf)
            env[node] = TensorBox(buf, program)
            # where the wrapper reads each size symbol: every input's own symbol, also one the
            # shape environment has since replaced by another (its guards still name it)
            for symbol, read in ir.symbol_reads(traced, f"arg{i}"):
                program.symbols.setdefault(symbol, read)
        elif isinstance(traced, torch.SymInt) or isinstance(value, int):
            # a size passed as an input (TorchDynamo does this with dynamic shapes)
            size = ir.size_expr(traced)
            env[node] = size
            for symbol, read in ir.symbol_reads(traced, f"arg{i}"):
                program.symbols.setdefault(symbol, read)
            program.inputs.append(ir.SizeInput(f"arg{i}", size))
        elif type(value) is float and node.meta.get("dynamic_dims"):
            # a float the graph is generic in: a scalar argument of the kernels that use it
            scalar = ir.ScalarInput(f"arg{i}", f"scalar{len(program.scalars)}")
            program.scalars[scalar.scalar] = scalar.name
            program.inputs.append(scalar)
            env[node] = scalar
        elif isinstance(value, (float, bool)):
            env[node] = value
            program.inputs.append(ir.SizeInput(f"arg{i}", value))
        else:
            raise NotImplementedError(
                f"graph input {node.name} is a {type(value).__name__}: graph inputs must be "
                "tensors or numbers")
    unknown = set().union(*[ir.size_symbols(s) for b in program.inputs if isinstance(b, ir.InputBuffer)
                            for s in (*b.shape, *b.stride)]) - set(program.symbols)
    if unknown:
        raise NotImplementedError(f"size symbols {sorted(unknown)} are not sizes of any input")

    for node in gm.graph.nodes:
        if node.op in ("placeholder",):
            continue
        if node.op == "output":
            # flattened after lookup: a value may itself be a tuple (split's, chunk's pieces)
            outputs = torch.fx.node.map_arg(node.args[0], lambda n: env[n])
            program.outputs, program.output_spec = pytree.tree_flatten(outputs)
            program.outputs = _own_values(program.outputs, node.args[0], env, values)
            traced = pytree.tree_leaves(torch.fx.node.map_arg(node.args[0], lambda n: values.get(n)))
            ran = pytree.tree_leaves(torch.fx.node.map_arg(node.args[0], lambda n: n.meta.get("example_value")))
            if len(traced) == len(program.outputs):
                if len(ran) != len(traced):
                    ran = [None] * len(traced)
                program.outputs = [_on_eager_device(program, _eager_layout(o, v, e), v)
                                   for o, v, e in zip(program.outputs, traced, ran)]
                _viewed_values_as_eager(program.outputs, env, values)
            break
        args = torch.fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
        if node.op == "get_attr":
            # a subgraph (torch.cond's branches) is a Python value for the extern that uses it;
            # a constant tensor becomes an extern "op" that returns it
            value = _fetch_attr(gm, node.target)
            env[node] = constant_tensor(program, value) if isinstance(value, torch.Tensor) else value
            continue
        if node.op == "call_module":
            target = gm.get_submodule(node.target)
        else:
            target = node.target
        if aliasing.written(node.op, target, node.args, node.kwargs, _is_tensor_node):
            # values are computed here, never written: writes are made values before
            # (functionalize.py), so nothing here can lose one
            raise NotImplementedError(f"`{node.format_node()}` writes in place: lowering takes "
                                      "the graph functionalize() makes")
        if node.op == "call_function":
            size = size_arithmetic(target, args)       # arithmetic on sizes read by the code
            if size is None:
                size = scalar_arithmetic(program, target, args)
            if size is None and target in _TO_INT and isinstance(values.get(node), torch.SymInt):
                # a size computed through a float (interpolate's trunc(size * scale)): its
                # expression in the trace's shape environment
                size = ir.size_expr(values[node])
            elif size is None and target in _TO_INT and all(type(a) in (int, float) for a in args):
                size = target(*args)          # (of sizes made static since the trace)
            if size is not None:
                env[node] = size
                continue
        lowering = lookup(node.op, target) if not _touches_complex(node, values) else None
        factory = lookup_factory(node.op, target) if lowering is None else None
        result = None
        if lowering is not None:
            result = lowering(node, values, *args, **kwargs)
        elif factory is not None:
            result = factory(program, node, values, *args, **kwargs)
        if result is None or result is NotImplemented:
            result = lower_fallback(program, node, values, target, args, kwargs)
        for box in pytree.tree_leaves(result):
            _nothing_to_compute(box)
            _rounded_as_eager(box)
        if isinstance(result, TensorBox):
            _channels_last_as_traced(result, values.get(node))
            _channels_last_as_read(result)
        env[node] = result
    return program


_TO_INT = (math.trunc, math.floor, math.ceil, torch.sym_int)


def _own_values(boxes: list, returned, env: dict, values: dict) -> list:
    """Outputs that are apart in eager are apart here, where lowering made them one value, or
    views of one (two equal reductions are computed once): a write into one must not show in
    the other. Outputs that share memory in eager (`return y, y`, `s, s.view(5, 1)`) stay so.
    `boxes`: the output leaves; `returned`: the output node's argument, whose nodes env maps
    to them; `values`: the nodes' example values (eager's memory, where they are real)."""
    tagged = torch.fx.node.map_arg(returned, lambda n: pytree.tree_map(lambda v: _From(n), env[n]))
    owners = [t.node if isinstance(t, _From) else None for t in pytree.tree_leaves(tagged)]
    if len(owners) != len(boxes):
        return boxes
    first, out = {}, []
    for box, node in zip(boxes, owners):
        if isinstance(box, TensorBox) and node is not None:
            example = values.get(node)
            address = aliasing.storage_address(example) if isinstance(example, torch.Tensor) \
                and getattr(example, "fake_mode", None) is None else None
            seen_node, seen_address, seen_box = first.setdefault(id(_memory_of(box)), (node, address, box))
            if seen_node is not node and (address != seen_address if None not in (address, seen_address)
                                          else box is seen_box):
                box = copy_of(box)
        out.append(box)
    return out


def _memory_of(box):
    """The box whose memory a view box reads (itself where it is no view)."""
    while isinstance(box.data, ir.Pointwise) and box.data.aliases and len(box.reads) == 1:
        box = box.reads[0]
    return box


class _From:
    """A leaf of the output standing for the node whose value it is."""
    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node


def _touches_complex(node, values) -> bool:
    """Complex numbers have no lowering (their arithmetic is not modelled in kernels): an op
    that reads or makes a complex tensor runs as PyTorch's. A size read of one (x.size(0)) is
    a size as any other: as an extern's result it would be a tensor box where a size is due
    (a slice bound of the rfft backward's)."""
    value = values.get(node)
    if _is_size(value) or (isinstance(value, tuple) and all(map(_is_size, value))):
        return False
    return any(_holds_complex(values.get(n)) for n in (node, *node.all_input_nodes))


def _is_size(value) -> bool:
    return isinstance(value, torch.SymInt) or (isinstance(value, int) and not isinstance(value, bool))


def _holds_complex(value) -> bool:
    """A complex tensor, or a list, tuple or dict holding one (checked for every node: a plain
    walk, where pytree's is several times the cost)."""
    if isinstance(value, torch.Tensor):
        return value.is_complex()
    if isinstance(value, (list, tuple)):
        return any(_holds_complex(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_complex(v) for v in value.values())
    return False


def _nothing_to_compute(box) -> None:
    """A value without elements (a dim of size 0) computes nothing: its inner function, which
    no kernel will run, becomes a constant, so that no index of it is ever worked out (a
    reshape of an empty tensor would divide by its size 0)."""
    if isinstance(box, TensorBox) and isinstance(box.data, ir.Pointwise) and 0 in box.shape:
        cd = ir.compute_dtype(box.dtype)
        box.data.inner_fn = lambda idx: ir.ops.constant(0, cd)


def _rounded_as_eager(box) -> None:
    """Eager rounds the result of every op on float16 or bfloat16 to its dtype (its kernels
    compute in float32 and round when they store). A value computed here is kept in float32
    when the next op's code reads it in the same kernel, so it is rounded where eager rounds:
    at the end of each op (not inside one: a layer norm computes in float32 throughout, as
    ATen's does). Views move no data and need no rounding."""
    if isinstance(box, TensorBox) and isinstance(box.data, ir.Pointwise) and not box.data.aliases \
            and box.dtype in (torch.float16, torch.bfloat16):
        fn, dtype = box.data.inner_fn, box.dtype
        box.data.inner_fn = lambda idx: ir.ops.round_to(fn(idx), dtype)


def _channels_last_as_traced(box, value) -> None:
    """A value computed channels-last where it was traced (after a convolution on a CPU: the
    training graphs of autograd/joint.py) is stored channels-last when it gets a buffer, so the
    kernels around the convolutions read and write one layout instead of transposing."""
    if box.computation is None or box.is_realized or not isinstance(value, torch.Tensor) \
            or value.dim() != 4 or value.is_contiguous() \
            or not value.is_contiguous(memory_format=torch.channels_last) \
            or any(ir.is_symbolic(s) for s in (*box.shape, *value.stride())):
        return
    box.wanted_stride = ir.dense_strides(box.shape, ir.CHANNELS_LAST)


def _channels_last_as_read(box) -> None:
    """A pointwise value computed from a channels-last value of its shape (a batch norm and
    activation after a convolution given its input channels-last) is stored channels-last
    when it gets a buffer (as Inductor orders a buffer's strides by those of its reads): stored
    contiguous, the kernel that writes it, or the one that reads it, would walk memory across
    the channels (a squeeze-excitation's scaled input, kept for after its pooled branch)."""
    if not isinstance(box.data, ir.Pointwise) or box.wanted_stride is not None or len(box.shape) != 4 \
            or any(ir.is_symbolic(s) for s in box.shape):
        return
    channels_last = ir.dense_strides(box.shape, ir.CHANNELS_LAST)
    if channels_last == ir.contiguous_strides(box.shape):
        return                                  # (one channel, or 1 x 1 images: the same layout)
    for read in box.reads:
        if list(read.shape) != list(box.shape):
            continue
        stride = read.wanted_stride if not read.is_realized else getattr(read.data, "stride", None)
        if stride is not None and list(stride) == channels_last:
            box.wanted_stride = channels_last
            return


def _on_eager_device(program, box, value):
    """A number (a 0-dim CPU tensor, _one_device) that a GPU program's kernel computed is in
    GPU memory: the graph returns it on the CPU, where eager has it."""
    if not (isinstance(box, TensorBox) and isinstance(value, torch.Tensor) and _a_number(value)) \
            or program.device.type == "cpu" or isinstance(box.data, ir.InputBuffer):
        return box
    stored = box.realize()
    on_the_cpu = ir.Extern(program.new_name("buf"), "cpu", (stored,), {}, [], [], value.dtype, value.device,
                           reason="a number returned where eager has it", kind="method",
                           meta_value=torch.empty((), dtype=value.dtype, device="meta"))
    return TensorBox(on_the_cpu, program, [stored])


def _eager_layout(box, value, ran=None):
    """A graph output computed here is stored in the dense layout eager gives it (a relu of a
    channels-last convolution's result is channels-last): set before it is stored, or a copy
    if it is already stored otherwise (on a CPU, an input of a channels-last convolution that
    eager returns contiguous). PyTorch's result that comes back dense in another order than
    eager's (a convolution given a channels-last input here) is copied too, so code that views
    the output behaves as in eager. `ran`: the output as eager's kernels made it in the trace,
    whose dim order is eager's where the symbolic run's shape functions differ (a batch norm
    or `2 ** x` of a transposed input is contiguous in eager, transposed by its meta kernel)."""
    if not isinstance(box, TensorBox) or not isinstance(value, torch.Tensor) \
            or value.dim() != len(box.shape):
        return box
    # a dim of size 1 may have any stride, which a view of a buffer reads as 0: eager's, where
    # the output is returned as a view (code may read it: x.stride())
    box.size_one_strides = {d: s for d, (n, s) in enumerate(zip(value.shape, value.stride()))
                            if type(n) is int and n == 1 and type(s) is int}
    if box.computation is not None and not box.is_realized and (any(
            st == 0 and ir.hint(n) > 1 for st, n in zip(ir.stride_of(value), value.shape)) or _strided_view(value)):
        box.eager_stride = ir.stride_of(value)      # expanded, or a view (fusion's RealizeOutputs)
        return box
    if any(ir.is_symbolic(s) for s in (*box.shape, *ir.stride_of(value))):
        # a graph generic in sizes: the order of eager's strides as the example has them (the
        # entry's guard keeps each input's layout, so the order holds for every call)
        hinted = _hinted(value.stride())
        if hinted is None or 0 in hinted:
            return box
        if isinstance(ran, torch.Tensor) and not isinstance(ran, torch._subclasses.FakeTensor) and \
                list(ran.shape) == _hinted(value.shape) and 0 not in ran.stride() and \
                ir.stride_order(ran.stride()) != ir.stride_order(hinted):
            # eager's kernel laid it out otherwise than its shape function says
            value = ran
        elif box.computation is None or box.is_realized:
            return box
        else:
            box.wanted_stride = ir.dense_strides(box.shape, ir.stride_order(hinted))
            return box
    stride = ir.dense_strides(box.shape, ir.stride_order(value.stride()))
    if box.computation is None:
        dense = value.is_contiguous() or (value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last))
        return box.laid_out(stride) if isinstance(box.data, ir.Extern) and dense else box
    if box.is_realized:
        return box.laid_out(stride)
    box.wanted_stride = stride
    return box


def _strided_view(value) -> bool:
    """Eager's value is laid out with gaps no dense layout has (`(x + 1)[:, :5]`, `y[:, 2]`):
    a view of a larger tensor, which eager returns. (Asked of the example's sizes: where a
    graph generic in sizes returns the view, its strides are eager's at every size.)"""
    shape, stride = _hinted(value.shape), _hinted(value.stride())
    if shape is None or stride is None or 0 in shape:
        return False
    layout = ir.gapped_layout(shape, stride)
    return layout is None or any(g != 1 for g in layout[1])


def _viewed_values_as_eager(outputs, env, values) -> None:
    """The value an output eager returns as a view (expanded, or with gaps) views is stored in
    eager's layout of it, so that the output can be eager's view of its buffer (fusion's
    RealizeOutputs): `(x.t() * 2).expand(2, -1, -1)` repeats a value eager lays out transposed."""
    viewed = [viewed_value(o) for o in outputs if isinstance(o, TensorBox) and o.eager_stride is not None]
    if not viewed:
        return
    node_of = {id(box): node for node, box in env.items() if isinstance(box, TensorBox)}
    for box in viewed:
        if id(box) in node_of and box.computation is not None and not box.is_realized:
            _eager_layout(box, values.get(node_of[id(box)]))


def _hinted(numbers):
    """Sizes or strides as numbers: a symbolic one's example value (None where one has none)."""
    out = []
    for s in numbers:
        hint = s.node.hint if isinstance(s, torch.SymInt) else int(s)
        if hint is None:
            return None
        out.append(int(hint))
    return out


def _storage(value):
    """An input's storage, to see which inputs share memory (None where there is none)."""
    if getattr(value, "fake_mode", None) is not None:     # a fake tensor (a backward's input)
        return None
    try:
        return value.untyped_storage().data_ptr() or None
    except (AttributeError, RuntimeError, NotImplementedError):   # not a tensor, or a fake one
        return None


def _is_tensor_node(a) -> bool:
    value = a.meta.get("example_value", a.meta.get("val")) if isinstance(a, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) or isinstance(a, torch.fx.Node) and not a.meta


def _fetch_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


__all__ = ["lower", "LOWERINGS", "TensorBox"]
