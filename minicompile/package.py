"""A compiled package: one whole graph, compiled ahead, saved to a file, run by another process
without capture, lowering or code generation (as AOTInductor's packages).

    exported = minicompile.export(model, x)       # one graph, or Unsupported naming the break
    minicompile.save(exported, "model.mcpkg")
    run = minicompile.load("model.mcpkg")          # in another process
    run(x2)                                         # tensors of the exported sizes and dtypes

Takes a function or module and example arguments; capture (fullgraph) gives the graph,
graph_compiler compiles it, and the package keeps what `codegen.wrapper.rebuild` needs (the
wrapper's source and the kernels' source), the values of every graph input that is not an
argument (a module's parameters and buffers, at export time), and the exported arguments'
sizes, strides, dtypes and devices, which each call checks (the package's guard). Kernels are
loaded from the kernel caches, or compiled from their source where a machine has not seen them.

Packaged: graphs that compute values, in inference (no gradients). A graph that writes its
inputs, returns views of them, or runs under autocast is refused with the reason.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .capture.trace import capture
from .codegen import wrapper
from .graph_compiler import compile_graph
from .runtime.cache import read_checked, write_checked

FORMAT = "minicompile-package-1"


class ExportedProgram:
    """One compiled graph and how a call's arguments become its inputs."""

    def __init__(self, entry: dict, plan: list, inputs_spec: list, output_spec: str, graph_code: str = ""):
        self.entry, self.plan, self.inputs_spec, self.output_spec = entry, plan, inputs_spec, output_spec
        self.graph_code = graph_code
        self._tree = pytree.treespec_loads(output_spec)     # the result's structure, read once
        self._compiled = None

    def _run(self):
        if self._compiled is None:
            self._compiled = wrapper.rebuild(self.entry)
        return self._compiled

    def __call__(self, *args):
        given = [a for a in pytree.tree_leaves(list(args)) if isinstance(a, torch.Tensor)]
        if len(given) != len(self.inputs_spec):
            raise TypeError(f"this package takes {len(self.inputs_spec)} tensors, got {len(given)}")
        for i, (t, want) in enumerate(zip(given, self.inputs_spec)):
            have = _spec(t)
            if have != want:
                raise ValueError(f"argument tensor {i} is {_say(have)}; the package was exported for {_say(want)}")
        inputs = [given[where] if kind == "arg" else where for kind, where in self.plan]
        outs = self._run()(*inputs)
        return pytree.tree_unflatten(list(outs), self._tree)


def _spec(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), str(t.dtype), str(t.device))


def _say(spec) -> str:
    return f"sizes {spec[0]}, strides {spec[1]}, {spec[2]} on {spec[3]}"


def export(model, *args, **kwargs) -> ExportedProgram:
    """Capture `model(*args, **kwargs)` as one graph (minicompile.Unsupported names the break
    where there is one, as torch.export does), compile it, and hand back the program."""
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    with torch.no_grad():
        cap = capture(fn, args, kwargs)
        compiled = compile_graph(cap.gm, cap.example_inputs)
        entry = getattr(compiled, "entry", None)
        if not isinstance(compiled, wrapper.CompiledGraph) or entry is None:
            raise NotImplementedError(
                "export packages graphs that compute values only: this one writes its inputs, "
                "returns views of them, runs under autocast or runs on PyTorch's kernels")
        outs = compiled(*cap.example_inputs)
        result = cap.build_output(outs)
    leaves, spec = pytree.tree_flatten(result)
    if len(leaves) != len(outs) or any(a is not b for a, b in zip(leaves, outs)):
        raise NotImplementedError("export packages a result made of the graph's outputs (tensors in "
                                  "tuples, lists and dicts), each once")
    arguments = [a for a in pytree.tree_leaves([list(args), kwargs]) if isinstance(a, torch.Tensor)]
    given = {id(t): i for i, t in enumerate(arguments)}
    plan = [("arg", given[id(t)]) if id(t) in given else ("value", t.detach().clone() if isinstance(t, torch.Tensor) else t)
            for t in cap.example_inputs]
    inputs_spec = [_spec(a) for a in arguments]
    return ExportedProgram({**entry, "shape_guards": []}, plan, inputs_spec, pytree.treespec_dumps(spec),
                           cap.gm.code)


def save(exported: ExportedProgram, path) -> None:
    """Write the package to `path` (one file: a checksum, then the pickled package)."""
    write_checked(path, {"format": FORMAT, "torch": torch.__version__, "entry": exported.entry,
                         "plan": exported.plan, "inputs_spec": exported.inputs_spec,
                         "output_spec": exported.output_spec, "graph_code": exported.graph_code})


def load(path) -> ExportedProgram:
    """The package saved at `path`, ready to call: no capture, lowering or code generation."""
    try:
        package = read_checked(path)
    except ValueError as err:
        raise ValueError(f"{path} is not a whole minicompile package ({err})") from None
    if package.get("format") != FORMAT:
        raise ValueError(f"{path} is a package of another format ({package.get('format')!r}, not {FORMAT!r})")
    return ExportedProgram(package["entry"], package["plan"], package["inputs_spec"], package["output_spec"],
                           package["graph_code"])
