"""AOT autograd: a graph whose inputs need gradients -> compiled forward and backward graphs.

The stage between capture and lowering, for training. Takes a values-only FX graph
(functionalize.py's) whose tensor inputs include some that require grad, its example inputs,
and the function that compiles a values-only graph (lowering, fusion, code generation:
graph_compiler's), and hands back a callable with the graph's inputs and outputs whose
results autograd differentiates with minicompile's generated code:

    joint.py      the joint forward+backward graph, traced on fake tensors, decomposed
                  to what lowering takes, functionalized
    record.py     the recorder that traces it: a lean make_fx
    partition.py  forward graph and backward graph, split by a min-cut over bytes: what the
                  forward saves for the backward, what the backward recomputes
    to_torch.py   each half's aten ops -> the torch-level calls the lowering table knows
    function.py   the two compiled halves behind a torch.autograd.Function

The `aot_graphs` log prints the forward and backward graphs and what was saved, as
TORCH_LOGS=aot_graphs does; minicompile.metrics.backward_kernels counts the backward's kernels.
"""
from __future__ import annotations

import re

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .. import ir, logs, metrics
from .function import CompiledTraining, SymbolicLayout
from .joint import Joint, trace_joint
from .partition import Partition, partition
from .to_torch import to_torch


def compile_training(gm: torch.fx.GraphModule, example_inputs, compile_values, written=None,
                     overwritten=None) -> CompiledTraining:
    """gm's forward and backward, compiled by `compile_values(gm, example_inputs, written)`.
    written: {output index: input index} of gm, outputs written back into inputs after the
    call (a batch norm's running statistics), which the forward may store straight into them.
    overwritten: {index of a gm input that gets a new value: the in-place ops that write it
    (none where each is through `.data`)}."""
    overwritten = overwritten or {}
    try:
        # (off under torch.autograd.detect_anomaly(): its checks of the trace's own backward on
        # fake tensors fail; the compiled backward's gradients are checked as any Function's)
        with metrics.timed("joint trace"), torch.autograd.set_detect_anomaly(False):
            joint = trace_joint(gm, example_inputs)
    except NotImplementedError:
        raise
    except Exception as err:
        # an op make_fx cannot trace on fake tensors (data-dependent output sizes, an op with
        # no fake kernel): the caller runs the graph on PyTorch's kernels, and says why
        raise NotImplementedError(f"the joint forward+backward graph could not be traced: "
                                  f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
    primal = _primal_index(joint)
    # gm's inputs that get new values, as the joint graph's primals: {primal: the ops writing it}
    overwritten = {primal[i]: n for i, n in overwritten.items() if i in primal}
    with metrics.timed("partition"):
        part = partition(joint, overwritten.keys())
    _log(part)
    primals = [example_inputs[i] for i in primal]
    forward_graph, backward_graph = to_torch(part.forward), to_torch(part.backward)
    backward_inputs = _examples(backward_graph)
    _examples(forward_graph)                # (its dynamic dims marked; the primals are its examples)
    stored = _in_forward(joint, written or {})
    forward = compile_values(forward_graph, primals, stored)
    backward = compile_values(backward_graph, backward_inputs)
    metrics.backward_kernels += len(getattr(backward, "kernels", ()))
    # what eager's autograd saves as it is and a later op writes: eager's backward finds it
    # written (an error) or, written through `.data`, reads its new value; so does this one
    compiled = CompiledTraining(joint, part, forward, backward, overwritten, gm,
                                sorted(overwritten.keys() & joint.saved_by_eager), stored)
    # what the forward's code relies on, over the user's graph inputs (the forward's are its
    # tensor inputs), and what the joint trace did (once: a forward lowered from the joint
    # trace's own values has its conditions too)
    primal_at = list(primal)
    compiled.shape_guards = list(dict.fromkeys(
        [re.sub(r"\barg(\d+)\b", lambda m: f"arg{primal_at[int(m.group(1))]}", cond)
         for cond in getattr(forward, "shape_guards", ())] + joint.shape_conditions))
    return compiled


def _examples(gm: torch.fx.GraphModule) -> list:
    """A half's example inputs, from the values the joint trace gave its placeholders: where
    those have symbolic sizes (dynamic shapes), values of the example's sizes, with the dims
    that are symbols marked dynamic (`meta["dynamic_dims"]`), as capture marks its graphs'."""
    examples = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta["val"]
        if isinstance(val, torch.SymInt):            # a size, handed from the forward
            if ir.is_symbolic(ir.size_expr(val)):
                node.meta["dynamic_dims"] = {0}
            examples.append(ir.hint(val))
        elif isinstance(val, torch.SymFloat):        # a float input the graph is generic in
            node.meta["dynamic_dims"] = {0}
            examples.append(float(val.node.hint))
        elif isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
            shape = [ir.hint(s) for s in val.shape]
            if ir.has_symbolic_layout(val):
                node.meta["dynamic_dims"] = {d for d, s in enumerate(val.shape) if ir.is_symbolic(ir.size_expr(s))}
                # as CompiledTraining hands it over: dense in the order of its dims in memory,
                # or the traced view where its strides are those at every size
                strides = SymbolicLayout.of(val).strides(shape)
            else:
                # symbols the trace specialized (sizes a lowering decided on): laid out as
                # traced, a view with room between its items too, as CompiledTraining hands it over
                strides = [ir.hint(s) for s in val.stride()]
            with FakeTensorMode():
                examples.append(torch.empty_strided(shape, strides, dtype=val.dtype, device=val.device))
        else:
            examples.append(val)
    return examples


def _in_forward(joint: Joint, written: dict) -> dict:
    """gm's {output index: input index} as the forward graph's: its outputs are gm's tensor
    outputs (then the saved values), its inputs gm's primals."""
    primal = _primal_index(joint)
    return {joint.outputs[k][1]: primal[i] for k, i in written.items()
            if joint.outputs[k][0] == "tensor" and i in primal}


def _primal_index(joint: Joint) -> dict:
    """gm's input index -> the forward graph's (its primals: tensor inputs, and the numbers
    it is generic in)."""
    return {i: p for p, i in enumerate(i for i, (kind, _) in enumerate(joint.inputs) if kind == "primal")}


def _log(part: Partition) -> None:
    if not logs.enabled("aot_graphs"):
        return
    saved = ", ".join(part.saved) or "nothing"
    logs.log("aot_graphs", "TRACED GRAPH\n ===== Forward graph =====\n"
             + part.forward.print_readable(print_output=False)
             + "\n ===== Backward graph =====\n" + part.backward.print_readable(print_output=False)
             + f"\n ===== Saved for backward: {len(part.saved)} values, {part.saved_bytes:,} bytes =====\n"
             + f"    {saved}")


__all__ = ["compile_training", "trace_joint", "partition", "to_torch", "Joint", "Partition",
           "CompiledTraining"]
