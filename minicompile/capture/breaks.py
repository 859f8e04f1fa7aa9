"""Why a capture stopped: the `Unsupported` exception.

Takes: whatever the interpreter could not model (an opcode, a callable, a data-dependent value)
plus the user's frames at that point. Hands on: an exception whose str() names the reason and
shows the user's source line, the way TorchDynamo's graph-break messages do. The API layer turns
it into a warning and an eager run; later, the frame compiler (frame.py) will turn the same
record into a graph break with a resume point, which is why it carries structured fields rather
than just a message.
"""
from __future__ import annotations

import linecache
from typing import List, Optional, Tuple

# (filename, lineno, source line text), outermost frame first, like a traceback.
UserFrame = Tuple[str, int, str]


def source_line(filename: str, lineno: Optional[int]) -> str:
    if lineno is None:
        return ""
    return linecache.getline(filename, lineno).strip()


# The attribute minicompile.disable sets on the function it returns (its value: the reason)
DISABLE_MARK = "_minicompile_disable"


# A compiled callable's class (api.CompiledFunction, api.CompiledModule) names under this the
# attribute that holds what it compiles: a trace that calls it calls that (hooks included),
# as TorchDynamo inlines the original of a torch.compile'd function or module it meets
COMPILED_ORIGINAL = "_minicompile_original"


def never_traced(fn) -> Optional[str]:
    """Why `fn` must run as Python, never traced: marked by minicompile.disable, or by
    torch.compiler.disable (whose marks TorchDynamo reads), or None."""
    reason = getattr(fn, DISABLE_MARK, None)
    if reason is None and getattr(fn, "_torchdynamo_disable", False):
        reason = getattr(fn, "_torchdynamo_disable_msg", None) or "marked with torch.compiler.disable"
    return reason


class Unsupported(Exception):
    """The interpreter met something it cannot trace.

    reason:       one line, what was met (e.g. "call to builtin print", "opcode POP_JUMP_IF_FALSE")
    explanation:  why that cannot go into a graph (yet)
    hint:         what the user can do about it
    user_stack:   [(filename, lineno, source line)], outermost first; the last entry is where it
                  happened (inside inlined calls the stack names every call site)
    """

    def __init__(self, reason: str, explanation: str = "", hint: str = "",
                 user_stack: Optional[List[UserFrame]] = None):
        self.reason = reason
        self.explanation = explanation
        self.hint = hint
        self.user_stack = list(user_stack or [])
        super().__init__(reason)

    def kept(self) -> "Unsupported":
        """Itself, as a cache keeps it to explain a break: without the frames it was raised
        through and the exceptions it was raised while handling, which hold the call's values
        (a generator there would not be closed while they live)."""
        self.__traceback__ = self.__cause__ = self.__context__ = None
        return self

    def __str__(self) -> str:
        lines = [f"Unsupported: {self.reason}"]
        if self.explanation:
            lines.append(f"  Explanation: {self.explanation}")
        if self.hint:
            lines.append(f"  Hint: {self.hint}")
        if self.user_stack:
            lines.append("  User code (most recent call last):")
            for filename, lineno, text in self.user_stack:
                lines.append(f'    File "{filename}", line {lineno}')
                if text:
                    lines.append(f"      {text}")
        return "\n".join(lines)


class UnsupportedPythonVersion(Unsupported):
    """This Python's bytecode has no opcode tables here (only 3.11, 3.12, 3.13)."""


class GraphBreak(Exception):
    """Raised by the root frame's interpreter when an instruction cannot be traced and the
    frame may be split there: the graph so far is compiled, `inst` runs for real on the live
    values, and tracing resumes after it (see frame.py).

    stack:    the value stack *before* `inst` ran (its operands are still on it)
    kw_names: 3.11/3.12 KW_NAMES pending for a CALL
    """

    def __init__(self, unsupported: Unsupported, inst, stack, kw_names, tx):
        super().__init__(unsupported.reason)
        self.unsupported = unsupported
        self.inst = inst
        self.stack = stack
        self.kw_names = kw_names
        self.tx = tx


class Return(Exception):
    """A traced frame returned (its value is the translator's return_value)."""


class ObservedException(Exception):
    """The traced code raised `exc` (an ExceptionVariable) and the frame being traced has no
    handler for it: it goes on to the frame that called it, or out of the captured frame."""

    def __init__(self, exc):
        super().__init__()
        self.exc = exc


class Yield(Exception):
    """A traced generator's frame yielded `value` (it is paused after its YIELD_VALUE)."""

    def __init__(self, value):
        super().__init__()
        self.value = value
