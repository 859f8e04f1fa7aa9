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
import warnings

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


@pytest.mark.parametrize("fn", [assert_after_a_break, raise_after_a_break, namedtuple_after_a_break,
                                iterator_across_a_break, handled_inside_try, break_in_a_with_block,
                                unsupported_construct_after_a_break])
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
