"""minicompile.capture: a mini TorchDynamo. Python bytecode of one call -> a torch.fx graph.

Takes: a function or bound method and the real arguments of one call. Hands on: a `Capture`
(`gm`, `example_inputs`, `get_inputs`, `build_output`, `guard`, `guard_source`, `code`), whose
`gm` follows the torch.compile backend contract `backend(gm, example_inputs)`.
Anything that cannot be traced raises `Unsupported` (later: a graph break).

    bytecode.py     instruction decoding, Python-version checks, opcode registry
    values.py       symbolic values (tensors as fx.Proxy + example value, constants, ...)
    sources.py      where a value came from, as a guard expression (L['x'], G['torch'], ...)
    interpreter.py  the symbolic interpreter (one handler per opcode) and `capture`
    guards.py       the generated guard function
    breaks.py       `Unsupported`, `GraphBreak`
    frame.py        a frame as a chain of segments: graph, break run for real, resume point
"""
from .breaks import Unsupported, UnsupportedPythonVersion
from .bytecode import SUPPORTED_VERSIONS, check_python_version
from .interpreter import Capture, capture

__all__ = ["capture", "Capture", "Unsupported", "UnsupportedPythonVersion",
           "SUPPORTED_VERSIONS", "check_python_version"]
