"""Checks capture/resume.py on whatever Python runs this file (no torch needed, so any
CPython 3.11 to 3.13 can run it: `python3.13 tests/resume_bytecode_check.py`).

For many functions, the frame's locals are snapshot (sys.settrace) at every line start where
the value stack is empty, and the rest of the frame is run from there as a resume function:
its return value or exception must be the original's. Then cases with values and NULLs on the
stack, and a traceback that must point at the original line."""
import contextlib
import dis
import importlib.util
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "resume", os.path.join(HERE, "..", "minicompile", "capture", "resume.py"))
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)
NULL = object()


def snapshots(fn, *args):
    """(offset, locals) at each line start reached in one run of fn."""
    code, found = fn.__code__, []
    starts = {i.offset for i in dis.get_instructions(code) if i.starts_line}

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode" and frame.f_lasti in starts:
            found.append((frame.f_lasti, dict(frame.f_locals)))
        return tracer
    sys.settrace(tracer)
    try:
        fn(*args)
    except Exception:
        pass
    finally:
        sys.settrace(None)
    return found


def outcome(thunk):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            return ("ok", thunk())
        except Exception as e:
            return ("raise", type(e).__name__, str(e))


def resumed_everywhere(fn, *args) -> int:
    depths = R.stack_depths(fn.__code__)
    expected = outcome(lambda: fn(*args))
    n = 0
    for offset, f_locals in snapshots(fn, *args):
        if depths.get(offset) != 0:
            continue
        got = outcome(lambda: R.call_resumed(fn, offset, f_locals, [], NULL)[1])
        assert got == expected, (fn.__name__, offset, got, expected)
        n += 1
    return n


# ---- the functions -----------------------------------------------------------------------
def simple(x, y=2):
    z = x * y
    w = z + 1
    return w - x


def loop(n):
    total = 0
    for i in range(n):
        total += i
        if total > 10:
            break
    return total


def with_try(x):
    try:
        y = 10 // x
        z = y + 1
    except ZeroDivisionError:
        z = -1
    finally:
        z += 100
    return z


def closures(a):
    c = a + 1

    def inner():
        return a + c
    c += 1
    return inner()


def varargs_and_cells(x, *rest, **kw):
    y = x
    g = lambda: y + len(rest) + len(kw)   # noqa: E731
    y = y * 2
    return g()


def raises(x):
    y = x + 1
    if y > 2:
        raise ValueError(f"too big {y}")
    return y


def asserts(x):
    y = x * 2
    assert y < 5, "y too large"
    return y


def with_block(x):
    with contextlib.suppress(KeyError):
        d = {}
        d["missing"]
    y = x + 1
    return y


def comprehension(xs):
    ys = [v * 2 for v in xs]
    s = sum(ys)
    return s, {k: k for k in ys}


def make_closure(k):
    def f(x):
        y = x * k
        return y + k
    return f


def helper(v):
    return v * 10


def uses_stack(x):
    return helper(x) + 1


def fails(x):
    y = x + 1
    return y / 0


def main():
    total = 0
    for fn, args in [(simple, (3,)), (loop, (10,)), (with_try, (0,)), (with_try, (5,)),
                     (closures, (1,)), (varargs_and_cells, (3, 1, 2)), (raises, (1,)),
                     (raises, (5,)), (asserts, (1,)), (asserts, (9,)), (with_block, (1,)),
                     (comprehension, ([1, 2, 3],)), (make_closure(3), (2,))]:
        total += resumed_everywhere(fn, *args)
    # a value on the stack: after the call of `return helper(x) + 1`
    ins = list(dis.get_instructions(uses_stack))
    call = next(i for i in ins if i.opname == "CALL")
    after = ins[ins.index(call) + 1]
    assert R.call_resumed(uses_stack, after.offset, {"x": 4}, [40], NULL) == (True, 41)
    # NULL on the stack: before the call (at 3.11's PRECALL)
    before = ins[ins.index(call) - 1] if ins[ins.index(call) - 1].opname == "PRECALL" else call
    stack = [NULL, helper, 4] if sys.version_info < (3, 13) else [helper, NULL, 4]
    assert R.call_resumed(uses_stack, before.offset, {"x": 4}, stack, NULL) == (True, 41)
    # a stack that is not the one CPython has there: refused, never run
    assert R.call_resumed(uses_stack, after.offset, {"x": 4}, [], NULL) == (False, None)
    # a traceback from resumed code names the original line
    offset = [i for i in dis.get_instructions(fails) if i.starts_line][-1].offset
    try:
        R.call_resumed(fails, offset, {"x": 1, "y": 2}, [], NULL)
        raise AssertionError("no ZeroDivisionError")
    except ZeroDivisionError as e:
        tb = e.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        assert tb.tb_lineno == fails.__code__.co_firstlineno + 2, tb.tb_lineno
    return total


if __name__ == "__main__":
    print(f"Python {sys.version_info[0]}.{sys.version_info[1]}: resume functions right at "
          f"{main()} points")
