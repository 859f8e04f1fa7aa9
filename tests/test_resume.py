"""A graph break never fails the call: what minicompile's interpreter cannot run after a break
runs as real Python (capture/resume.py), and exceptions, asserts and global state come out as
in eager.

Each function is run eagerly and compiled (first call and cached calls); the result, or the
exception's type and message, and the grad mode left behind must be eager's."""
import collections
import glob
import os
import shutil
import subprocess
import sys
import threading
import traceback
import warnings

import numpy as np
import pytest
import torch

import minicompile
import resume_bytecode_check


def test_resume_functions_on_this_python():
    assert resume_bytecode_check.main() > 30


def other_python(version: str):
    """A working CPython `version` on this machine (PATH, or pyenv's folders), else None."""
    candidates = [shutil.which(f"python{version}")] + \
        sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == str(tuple(map(int, version.split(".")))):
            return exe
    return None


@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_resume_functions_on_other_pythons(version):
    """The bytecode checks need no torch, so any CPython 3.11 to 3.13 on the machine runs them."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        pytest.skip("this Python: test_resume_functions_on_this_python")
    exe = other_python(version)
    if exe is None:
        pytest.skip(f"no python{version} on this machine")
    out = subprocess.run([exe, resume_bytecode_check.__file__], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def outcome(fn, *args):
    try:
        value = fn(*args)
        return ("ok", value)
    except Exception as e:          # (pytest's assert rewriting adds lines with addresses)
        return ("raise", type(e).__name__, str(e).splitlines()[0] if str(e) else "")


def same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "raise":
        return a[1:] == b[1:]
    x, y = a[1], b[1]
    if isinstance(x, torch.Tensor):
        return torch.equal(x, y)
    if isinstance(x, (tuple, list)):
        return type(x) is type(y) and len(x) == len(y) and all(same(("ok", p), ("ok", q)) for p, q in zip(x, y))
    return x == y


def check_calls(fn, make_args, calls=3):
    minicompile.reset()
    compiled = minicompile.compile(fn)
    for _ in range(calls):
        args = make_args()
        grad = torch.is_grad_enabled()
        expected = outcome(fn, *args)
        grad_eager = torch.is_grad_enabled()
        torch.set_grad_enabled(grad)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = outcome(compiled, *args)
        grad_mine = torch.is_grad_enabled()
        torch.set_grad_enabled(grad)
        assert same(got, expected), (got, expected)
        assert grad_mine == grad_eager


def quiet_break():
    print("", end="")


def assert_after_a_break(x):
    y = x * 2
    quiet_break()
    assert (y > 100).all(), "not big enough"
    return y


def raise_after_a_break(x):
    y = x * 2
    quiet_break()
    if x.shape[0] > 1:
        raise ValueError("boom")
    return y


def namedtuple_after_a_break(x):
    y = x + 1
    quiet_break()
    Pair = collections.namedtuple("Pair", "a b")
    return Pair(y, 2).a * 3


def iterator_across_a_break(x):
    it = iter([x, x * 2])
    quiet_break()
    return sum(it)


def handled_inside_try(x):
    y = x * 2
    quiet_break()
    try:
        assert (y < -100).all()
        z = y
    except AssertionError:
        z = y - 1
    return z


def break_in_a_with_block(x):
    with torch.no_grad():
        y = x * 2
        quiet_break()
        z = y + 1
    return z, torch.is_grad_enabled()


def unsupported_construct_after_a_break(x):
    y = x + 1
    quiet_break()
    total = 0
    for i, v in enumerate(y.tolist()):
        total += i * v
    return total


class _Base:
    def scale(self, x):
        return x * 2


class _Derived(_Base):
    def scale(self, x):
        quiet_break()
        return super().scale(x) + 1          # (zuko's DiagNormal.expand, after a break)


def super_after_a_break(x):
    return _Derived().scale(x) * 3


@pytest.mark.parametrize("fn", [assert_after_a_break, raise_after_a_break, namedtuple_after_a_break,
                                iterator_across_a_break, handled_inside_try, break_in_a_with_block,
                                unsupported_construct_after_a_break, super_after_a_break])
def test_the_rest_of_a_frame_runs_as_eager(fn):
    check_calls(fn, lambda: (torch.randn(3),))


def test_assert_fails_with_assertion_error():
    compiled = minicompile.compile(assert_after_a_break)
    with pytest.raises(AssertionError, match="not big enough"):
        compiled(torch.randn(3))


def test_no_cannot_continue_message():
    """The old failure: minicompile's own interpreter could not run the rest of a frame."""
    def f(x):
        y = x * 2
        quiet_break()
        raise KeyError("k")
    with pytest.raises(KeyError):
        minicompile.compile(f)(torch.randn(2))


# --- grad mode and other global state, as eager leaves it ---------------------------------
def set_grad_block(x):
    with torch.set_grad_enabled(False):
        y = x * 2
    return y + 1


def set_grad_statement(x):
    torch.set_grad_enabled(False)
    return x * 2


def set_grad_twice(x):
    y = x * 2
    torch.set_grad_enabled(False)
    z = y + 1
    torch.set_grad_enabled(True)
    return z


def enable_grad_inside(x):
    with torch.enable_grad():
        y = x * 2
    return y, y.requires_grad


def no_grad_then_break(x):
    with torch.no_grad():
        y = x * 2
    quiet_break()
    return y


@pytest.mark.parametrize("outer", [True, False], ids=["grad_on", "grad_off"])
@pytest.mark.parametrize("fn", [set_grad_block, set_grad_statement, set_grad_twice,
                                enable_grad_inside, no_grad_then_break])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_grad_mode_after_the_call(fn, outer, requires_grad):
    def make():
        return (torch.randn(3, requires_grad=requires_grad),)

    def compare(fn_):
        def run(x):
            out = fn_(x)
            leaves = out if isinstance(out, tuple) else (out,)
            return tuple(v.requires_grad if isinstance(v, torch.Tensor) else v for v in leaves) + \
                tuple(v.detach() for v in leaves if isinstance(v, torch.Tensor))
        return run
    prev = torch.is_grad_enabled()
    torch.set_grad_enabled(outer)
    try:
        minicompile.reset()
        compiled = minicompile.compile(fn)
        for _ in range(3):
            torch.set_grad_enabled(outer)
            x = make()[0]
            expected = compare(fn)(x)
            grad_eager = torch.is_grad_enabled()
            torch.set_grad_enabled(outer)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = compare(compiled)(x)
            assert torch.is_grad_enabled() == grad_eager
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                assert (torch.equal(g, e) if isinstance(e, torch.Tensor) else g == e)
    finally:
        torch.set_grad_enabled(prev)


def breaks_in_no_grad(x, w, fail):
    y = x @ w
    with torch.no_grad():
        scale = y.abs().amax()
        quiet_break()
        z = y * scale
        if fail:
            raise ValueError("inside the block")
    return (y * z).sum(), z.requires_grad, torch.is_grad_enabled()


def breaks_in_nested_grad_blocks(x, w, fail):
    with torch.no_grad():
        y = x @ w
        with torch.enable_grad():
            quiet_break()
            z = (x.sum() * y).sum()
        quiet_break()
        u = z * 2
    try:
        with torch.set_grad_enabled(False):
            quiet_break()
            if fail:
                raise KeyError("caught")
    except KeyError:
        pass
    return z, u, z.requires_grad, u.requires_grad, torch.is_grad_enabled()


@pytest.mark.parametrize("fn", [breaks_in_no_grad, breaks_in_nested_grad_blocks])
@pytest.mark.parametrize("outer", [True, False], ids=["grad_on", "grad_off"])
def test_a_break_inside_a_grad_mode_block_is_resumed(fn, outer):
    """A break inside `with torch.no_grad()` made the whole frame run eagerly: the rest of
    the frame resumes in the block's grad mode, with the block's real exit (the mode before
    it put back at its end, or when an exception leaves it), as Dynamo does."""
    prev = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(outer)
        minicompile.reset()
        compiled = minicompile.compile(fn)
        for fail in (False, False, True):
            x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, 4)
            want = outcome(fn, x, w, fail)
            assert torch.is_grad_enabled() == outer
            got = outcome(compiled, x, w, fail)
            assert torch.is_grad_enabled() == outer
            assert got[0] == want[0] and (got[0] == "raise" and got == want or len(got[1]) == len(want[1]))
            for g, e in zip(got[1], want[1]) if got[0] == "ok" else ():
                if isinstance(e, torch.Tensor):
                    torch.testing.assert_close(g, e)
                    assert g.requires_grad == e.requires_grad
                else:
                    assert g == e
        assert minicompile.explain(fn)(x, w, False).graph_count >= 2
    finally:
        torch.set_grad_enabled(prev)


def enters_the_given_block(x, block):
    with block:
        y = x * 2
        quiet_break()
        z = y + x
    return z, z.requires_grad


def test_a_grad_mode_block_passed_in_is_guarded_by_its_kind():
    """A no_grad() or enable_grad() object handed in and entered: its kind was not guarded, so
    enable_grad's call ran no_grad's graph (results that did not require grad)."""
    prev = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(False)
        compiled = minicompile.compile(enters_the_given_block)
        for make in (torch.no_grad, torch.enable_grad, torch.no_grad, torch.enable_grad):
            x = torch.randn(3, requires_grad=True)
            want, got = enters_the_given_block(x, make()), compiled(x, make())
            assert got[1] == want[1]
            torch.testing.assert_close(got[0], want[0])
    finally:
        torch.set_grad_enabled(prev)


# --- a graph break in a try body or a with body: resumed, its exceptions handled -----------
LOG = []
LOCK = threading.Lock()              # a context manager of C's: entered for real


def breaks_inside(x, fail):
    """A user function with a graph break inside; raises after it where `fail` says."""
    y = x.sin() * 2
    quiet_break()
    LOG.append("callee")
    if fail == "value":
        raise ValueError("bad value")
    if fail == "key":
        raise KeyError("k")
    return y.cos()


def try_finally(x, fail):
    LOG.append("enter")
    try:
        out = breaks_inside(x, fail)
    finally:
        LOG.append("finally")
    return out + 1


def try_except(x, fail):
    y = x * 3
    try:
        out = breaks_inside(y, fail)
        LOG.append("after")
    except ValueError as e:
        LOG.append(str(e))
        out = y - 1
    return out * 2


def nested_tries(x, fail):
    try:
        try:
            out = breaks_inside(x, fail)
        finally:
            LOG.append("inner finally")
        out = out + breaks_inside(out, None)
    except (ValueError, KeyError) as e:
        LOG.append(type(e).__name__)
        out = x
    return out


def with_a_lock(x, fail):
    with LOCK:
        out = breaks_inside(x, fail)
        LOG.append(LOCK.locked())
    return out + LOCK.locked()


@pytest.mark.parametrize("fn", [try_finally, try_except, nested_tries, with_a_lock])
@pytest.mark.parametrize("fail", [None, "value", "key"])
def test_a_break_in_a_try_or_with_body_is_resumed(fn, fail):
    """The frame is not run eagerly whole: the callee that breaks is compiled on its own, and an
    exception it raises goes to the frame's handler (finally, except, a with's __exit__) as in
    eager, which the side effects' order shows."""
    x = torch.randn(5)
    LOG.clear()
    expected = outcome(fn, x, fail)
    want_log = list(LOG)
    for _ in range(2):
        LOG.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")           # nothing runs eagerly whole
            got = outcome(minicompile.compile(fn), x, fail)
        # (cos of values near pi/2: an ulp of the sin and cos kernels is more than allclose's
        # default absolute tolerance of 1e-8 lets through)
        assert got[0] == expected[0] and (got[1:] == expected[1:] if got[0] == "raise" else
                                          torch.allclose(got[1], expected[1], atol=1e-6)), (got, expected)
        assert LOG == want_log
        assert not LOCK.locked()
    ex = minicompile.explain(fn)(x, None)
    assert ex.graph_count >= 2           # the frame's own graph and the callee's


def test_a_reraised_exception_points_at_the_user_line():
    """The exception a call at a graph break raised is raised again at that call, in the rest of
    the frame run as Python: its traceback names the frame's line, as eager's."""
    def lines(fn):
        try:
            fn(torch.randn(3), "value")
        except ValueError as e:
            return [(frame.f_code.co_name, line) for frame, line in traceback.walk_tb(e.__traceback__)
                    if frame.f_code.co_name in ("try_finally", "breaks_inside")]
    want = lines(try_finally)
    minicompile.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = lines(minicompile.compile(try_finally))
    assert got[0] == want[0] == ("try_finally", try_finally.__code__.co_firstlineno + 3)


def ambiguous_condition(x):
    try:
        if x > 0:                      # a jump on a tensor of 4 values: RuntimeError
            return x
    except RuntimeError as e:
        LOG.append(str(e)[:20])
        return x * 2
    return x


def numpy_sizes_differ(x):
    y = x * 2
    try:
        LOG.append(y.sum().item() > 100)          # (a break: the frame goes on from here)
        z = np.ones(3) + np.ones(int(y.shape[0]))  # ValueError, at an instruction run for real
    except ValueError:
        z = 5
    return y + 1, z


@pytest.mark.parametrize("fn", [ambiguous_condition, numpy_sizes_differ])
def test_an_instruction_at_a_break_that_raises_goes_to_the_handler(fn):
    """Not a call: CPython goes on at the handler, with the stack cut to its depth and the
    instruction's position where it asks (resume.RaisedAt)."""
    x = torch.randn(4)
    LOG.clear()
    want, want_log = fn(x), list(LOG)
    minicompile.reset()
    for _ in range(2):
        LOG.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = minicompile.compile(fn)(x)
        torch.testing.assert_close(got, want)
        assert LOG == want_log


def callee_breaks(x):
    y = x.sin() * 2
    quiet_break()
    return y.cos() + y.requires_grad


def in_no_grad(x, w):
    with torch.no_grad():
        out = callee_breaks(x)
    return out, torch.is_grad_enabled()


def in_set_grad_enabled(x, w):
    with torch.set_grad_enabled(False):
        out = callee_breaks(x)
    return out * 2, torch.is_grad_enabled()


def in_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = callee_breaks(x @ w)
    return out, out.dtype


def in_nested_blocks(x, w):
    with torch.no_grad():
        with torch.enable_grad():
            out = callee_breaks(x)
        out = out + callee_breaks(out)
    return out, torch.is_grad_enabled()


@pytest.mark.parametrize("fn", [in_no_grad, in_set_grad_enabled, in_autocast, in_nested_blocks])
@pytest.mark.parametrize("outer", [True, False], ids=["grad_on", "grad_off"])
def test_a_callee_that_breaks_inside_a_grad_mode_or_autocast_block(fn, outer):
    """The break inside a block the capture models (grad mode, autocast) is resumed, the block
    entered for real around the call: the callee is compiled on its own and called in the
    block's state, and the state after the block is eager's (explain's graphs, run as they
    are, too)."""
    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)
    prev = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(outer)
        want = fn(x, w)
        assert torch.is_grad_enabled() == outer
        minicompile.reset()
        for _ in range(2):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got = minicompile.compile(fn)(x, w)
            assert torch.is_grad_enabled() == outer
            torch.testing.assert_close(got[0].float(), want[0].float())
            assert got[0].dtype == want[0].dtype and got[0].requires_grad == want[0].requires_grad
            assert got[1] == want[1]
        assert minicompile.explain(fn)(x, w).graph_count >= 2       # the callee's graphs
        assert torch.is_grad_enabled() == outer and not torch.is_autocast_enabled("cpu")
    finally:
        torch.set_grad_enabled(prev)


def _accumulates_with_weights_from_items(xs, w):
    total = torch.zeros(())
    for x in xs:                                 # a break in a loop: the frame is skipped
        loss = (x * w).square().mean()
        weight = 1.0 / (1.0 + loss.item())       # a new float each call, guarded by its value
        total = total + loss * weight
    return total


def test_the_rest_of_a_skipped_frame_guarded_by_a_changing_float_is_not_traced_at_every_call():
    """Each call traced the rest of the frame again (its float, a new value every call, is
    guarded by value) and kept it: as many entries as calls, and a trace per call. Past the
    recompile limit the rest runs as Python."""
    compiled, w = minicompile.compile(_accumulates_with_weights_from_items), torch.randn(4)
    for _ in range(3 * minicompile.config.recompile_limit):
        xs = [torch.randn(3, 4) for _ in range(2)]
        torch.testing.assert_close(compiled(xs, w), _accumulates_with_weights_from_items(xs, w))
    frame = minicompile.api._CACHES[compiled._key]
    assert max(len(entries) for entries in frame.segments.values()) <= minicompile.config.recompile_limit + 1
