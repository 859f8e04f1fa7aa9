"""minicompile.capture: a mini TorchDynamo. Python bytecode of one call -> torch.fx graphs.

Takes: a function (or method, partial, callable object) and the real arguments of one call.
Hands on: segments (frame.Segment), each an FX graph that follows the torch.compile backend
contract `backend(gm, example_inputs)`, the guard that says when it may be reused, and what to
do at its graph break; `capture` is the whole-graph form. The modules, in the order a call goes
through them (TorchDynamo's layout):

    trace.py         the entry: trace_segment (one segment), capture (one whole graph)
    translator.py    InstructionTranslator: the frame run on symbolic values
    instructions.py  one handler per opcode, registered with the Python versions it serves
    calls.py         calls: torch ops, inlined user functions and modules, objects made
    builtin_calls.py Python's builtins on traced values
    output_graph.py  the graph under construction, its inputs (wrap), symbolic sizes
    values.py        the symbolic values (VariableTrackers)
    sources.py       where a value came from, as a guard expression (L['x'], G['torch'])
    guards.py        the generated guard function (and its twin that says why it failed)
    breaks.py        Unsupported, GraphBreak
    frame.py         a frame as a chain of segments: graph, break run for real, resume point
    resume.py        the rest of a frame as a real Python function (a break never fails)
    bytecode.py      instruction decoding, Python versions, the opcode registry, operators
    higher_order.py  torch.cond; checkpoint's marks; tracing code aside and undoing it (trial)
    autograd_function.py  torch.autograd.Function.apply
"""
from .breaks import Unsupported, UnsupportedPythonVersion
from .bytecode import SUPPORTED_VERSIONS, check_python_version
from .trace import Capture, capture

__all__ = ["capture", "Capture", "Unsupported", "UnsupportedPythonVersion",
           "SUPPORTED_VERSIONS", "check_python_version"]
