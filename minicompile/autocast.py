"""Autocast made explicit: a graph that runs under `torch.autocast` -> the same graph with the
casts autocast would make as nodes of their own, to run with autocast off.

Autocast is global state read by PyTorch's dispatcher: under `torch.autocast("cuda",
torch.bfloat16)` a matrix product casts its float32 inputs to bfloat16 before it runs, and
some other ops cast theirs up to float32. Generated kernels read no such state, so a graph
compiled without it would compute in the wrong dtype (or read a bfloat16 buffer as float32).
TorchDynamo records the `with torch.autocast(...)` blocks of the frame as `_enter_autocast` /
`_exit_autocast` nodes, guards the state at the call, and AOTAutograd's trace turns both into
explicit casts. This pass does that last step without a trace of the ops' internals: each
node runs on fake tensors twice, under the autocast state that holds at it and with autocast
off; where the dtypes differ, its floating-point inputs are cast to the dtype autocast gave,
which is what autocast itself does before it calls the op. A composite op whose own ops
autocast casts (`F.multi_head_attention_forward`, `torch.gru`) runs in autocast's state instead
(`under`): PyTorch's kernel reads it, and training's trace of the op records the casts op by op.

    gm (with autocast nodes, or traced under autocast) --explicit_casts--> gm (casts as
    `.to(dtype)` nodes, no autocast nodes)

The compiled graph then runs with autocast off (`AutocastOff`), so the kernels PyTorch runs
for it (a matrix product) see the dtypes the graph names and nothing else.
"""
from __future__ import annotations

import contextlib
import functools
import operator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import aliasing, ir

DEVICES = ("cpu", "cuda")
ENTER, EXIT = torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast


def state() -> tuple:
    """The autocast state PyTorch's dispatcher reads: per device, its dtype if it is on."""
    return tuple(torch.get_autocast_dtype(d) if torch.is_autocast_enabled(d) else None
                 for d in DEVICES)


def set_state(s: tuple) -> None:
    for device, dtype in zip(DEVICES, s):
        torch.set_autocast_enabled(device, dtype is not None)
        if dtype is not None:
            torch.set_autocast_dtype(device, dtype)


OFF = (None,) * len(DEVICES)


def involved(gm: torch.fx.GraphModule) -> bool:
    """Does the graph depend on autocast: traced under it, or with a block of its own?"""
    return state() != OFF or any(n.target in (ENTER, EXIT) for n in gm.graph.nodes)


def explicit_casts(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
    """The graph with autocast's casts as nodes and its enter/exit nodes removed; it computes
    with autocast off what gm computes under the autocast state of this call. Raises
    NotImplementedError where a node cannot be checked (it does not run on fake tensors)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))     # gm itself stays as it is (the fallback)
    gm = torch.fx.GraphModule(gm, graph)
    mode = ir.fake_mode()
    inputs = iter(example_inputs)
    values, saved, casts = {}, {}, {}
    current = before = state()

    def fake(v):
        return ir.fake_of(mode, v) if isinstance(v, torch.Tensor) else v

    def cast(arg, dtype, user):
        """arg as `dtype`: one `.to` node per input and dtype, before its first user."""
        if (arg, dtype) not in casts:
            with graph.inserting_before(user):
                casts[arg, dtype] = graph.call_method("to", (arg, dtype))
            values[casts[arg, dtype]] = values[arg].to(dtype)
        return casts[arg, dtype]

    try:
        for node in list(graph.nodes):
            if node.op == "placeholder":
                values[node] = fake(next(inputs))
            elif node.op == "get_attr":
                values[node] = fake(operator.attrgetter(node.target)(gm))
            elif node.target is ENTER:
                device, dtype, enabled = node.args[0], node.args[1], node.args[2]
                saved[node] = current
                i = DEVICES.index(device) if device in DEVICES else None
                if i is not None:
                    on = dtype if dtype is not None else torch.get_autocast_dtype(device)
                    current = current[:i] + ((on if enabled else None),) + current[i + 1:]
                values[node] = None
            elif node.target is EXIT:
                current = saved[node.args[0]]
                values[node] = None
            elif node.op in ("call_function", "call_method"):
                values[node] = _run_cast(node, values, current, cast)
    except NotImplementedError:
        raise
    except Exception as err:
        raise NotImplementedError(f"autocast: {node.format_node()} could not be checked on fake "
                                  f"tensors ({type(err).__name__}: {err})") from err
    finally:
        set_state(before)
    for node in reversed(list(graph.nodes)):
        if node.target in (EXIT, ENTER):
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm


def _run_cast(node, values, current, cast):
    """Run node on its fake inputs under `current`, watching the casts autocast makes below it
    (a dispatch mode sees the ops autocast calls); give the node those casts of its inputs as
    nodes, and return its value, run again with autocast off."""
    def run():
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return node.target(*args, **kwargs)

    def casts_made(under):
        """{(input node, dtype)} cast by this run, and how many casts of other tensors."""
        inputs = {}
        torch.fx.node.map_arg((node.args, node.kwargs), lambda a: inputs.setdefault(id(values[a]), a))
        with _CastRecorder() as rec:
            set_state(under)
            try:
                value = run()
            finally:
                set_state(OFF)
        of_inputs = {(inputs[id(t)], dtype) for t, dtype in rec.casts if id(t) in inputs}
        return value, of_inputs, sum(1 for t, _ in rec.casts if id(t) not in inputs)

    if current == OFF or not _floating_inputs(node, values):
        return run()
    expected, by_autocast, others = casts_made(current)
    try:
        _, by_op, op_others = casts_made(OFF)      # the casts the op makes itself (x.float())
    except Exception:                              # (mixed dtypes: only autocast makes it run)
        by_op, op_others = set(), 0
    if others != op_others:
        if aliasing.written(node.op, node.target, node.args, node.kwargs, lambda a: isinstance(a, torch.fx.Node)):
            raise NotImplementedError(f"autocast: {node.format_node()} writes an input and casts values "
                                      f"inside it, not only its inputs")
        # a composite op (multi_head_attention_forward, torch.gru) whose own ops autocast
        # casts: it runs in autocast's state, which PyTorch's kernel reads (a training graph's
        # trace of it then records those casts, op by op)
        node.target = under(current, node.target if node.op == "call_function" else
                            functools.partial(_call_method, node.target))
        node.op = "call_function"
        return expected
    for arg, dtype in sorted(by_autocast - by_op, key=lambda c: (c[0].name, str(c[1]))):
        node.args, node.kwargs = torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda a: cast(a, dtype, node) if a is arg else a)
    result = run()
    if _dtypes(result) != _dtypes(expected):
        raise NotImplementedError(f"autocast: {node.format_node()} with its inputs cast does "
                                  f"not give the dtypes autocast gives")
    return result


def under(autocast_state: tuple, fn):
    """fn, called in this autocast state (a graph node whose casts autocast makes inside it:
    explicit_casts)."""
    def call(*args, **kwargs):
        before = state()
        set_state(autocast_state)
        try:
            return fn(*args, **kwargs)
        finally:
            set_state(before)
    # (named for the graph's code; its qualified name stays a local one, which the graph
    # cache does not store: the state and fn are not in the name)
    call.__name__ = f"{getattr(fn, '__name__', 'method')}_under_autocast"
    return call


def _call_method(name: str, obj, *args, **kwargs):
    return getattr(obj, name)(*args, **kwargs)


class _CastRecorder(TorchDispatchMode):
    """Records the dtype conversions (aten._to_copy) run while it is active: below autocast in
    the dispatcher, so these are the casts autocast makes."""

    def __enter__(self):
        self.casts = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and "dtype" in kwargs and \
                kwargs["dtype"] != args[0].dtype:
            self.casts.append((args[0], kwargs["dtype"]))
        return func(*args, **kwargs)


def _is_float(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _floating_inputs(node, values) -> bool:
    found = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: found.append(_is_float(values[a])))
    return any(found)


def _dtypes(value) -> list:
    leaves = []
    torch.utils._pytree.tree_map(lambda v: leaves.append(v.dtype) if isinstance(v, torch.Tensor) else None,
                                 value)
    return leaves


@contextlib.contextmanager
def off():
    """Autocast off inside, the caller's state restored after."""
    before = state()
    if before == OFF:
        yield
        return
    set_state(OFF)
    try:
        yield
    finally:
        set_state(before)


class AutocastOff:
    """A compiled graph whose casts are explicit, run with autocast off, so that no PyTorch
    kernel it calls casts again."""

    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, *args):
        with off():
            return self.compiled(*args)

    def __getattr__(self, name):
        return getattr(self.compiled, name)
