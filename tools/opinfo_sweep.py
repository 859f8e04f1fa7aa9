"""A differential sweep of PyTorch's OpInfo database (`op_db`) through minicompile, forward and
backward, with eager PyTorch as the reference.

    PYTHONPATH=$PWD python tools/opinfo_sweep.py --out sweep.jsonl          # every op, C++ kernels
    PYTHONPATH=$PWD python tools/opinfo_sweep.py --ops '^(add|sum)$' --backend triton
    PYTHONPATH=$PWD python tools/opinfo_sweep.py --report sweep.jsonl       # the tables again

Ops that draw random numbers, sparse ones and those with no real dtype are left out. For every
other OpInfo (or those whose name matches --ops), a few of its sample inputs per dtype (float32,
then float16, bfloat16, float64, int32, int64 and bool where the op supports them) become each a
function of the sample's tensors (its other arguments constants), compiled with
`minicompile.compile` and compared with eager: the results (per-dtype tolerances, exact for
integers and bools, NaN equal to NaN), the inputs after the call (an op may write one), and for
ops with autograd the gradients of the float inputs for a random cotangent (float32, float64).
A few of the op's error inputs (on which eager raises) are run too. Each case ends as one of

    ok       as eager
    wrong    a result, an input after the call or a gradient differs from eager's, or
             minicompile gave a result where eager raised
    crash    minicompile raised where eager ran, or raised what eager's exception type does not
             catch, or the case ran past --timeout
    break    as eager, but not compiled whole: a graph break, or a graph run on PyTorch's kernels
    raised   eager raised, and minicompile raised that exception type too (or a subclass of it)
    layout   as eager, but an output's strides are not eager's, or it shares memory with other
             inputs than eager's does

Each line of --out is one case as JSON (op, dtype, pass "fwd"/"bwd"/"err", sample, outcome,
detail); at the end the counts per outcome and the ops with wrong results or crashes are printed. Cases
run in a worker process, each under an alarm of --timeout seconds; a worker that dies (a
crash in a generated kernel) is restarted after the op it was running. Generated C++ kernels
are cached on disk (minicompile.config.cache_dir), so a second run compiles little.

`run_case` and `select_ops` are what tests/test_opinfo.py runs for its curated subset.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import traceback
import warnings

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.bool]
GRAD_DTYPES = [torch.float32, torch.float64]
# (rtol, atol): float32 leaves room for a sum taken in another order, or another libm's exp
FWD_TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-7),
           torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}
BWD_TOL = {torch.float32: (1e-3, 1e-4), torch.float64: (1e-6, 1e-7)}
# Random ops: tagged nondeterministic_seeded, or random in training (rrelu), or taking a
# dropout probability. Scaled-dot-product attention carries the tag but its samples draw nothing.
RANDOM_NAMES = ("rand", "normal", "bernoulli", "multinomial", "dropout", "uniform", "cauchy",
                "exponential", "geometric", "log_normal", "poisson", "rrelu", "_flash_attention",
                "_efficient_attention")
NOT_RANDOM = ("signal.windows.exponential",)


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _why_skipped(op) -> str | None:
    name = op.name
    if name not in NOT_RANDOM and any(r in name for r in RANDOM_NAMES):
        return "random"
    if "sparse" in name or op.variant_test_name == "sparse":
        return "sparse"
    if name.startswith("jiterator"):
        return "CUDA only"
    if not any(not d.is_complex for d in op.supported_dtypes("cpu")):
        return "no real dtype on a CPU"
    if getattr(op, "has_nondeterministic_output", False):
        return "nondeterministic output (uninitialized memory)"
    return None


def select_ops(pattern: str | None = None):
    """[(op id, OpInfo)] of op_db that the sweep runs (names matching the regex `pattern`)."""
    import re
    from torch.testing._internal.common_methods_invocations import op_db
    rx = re.compile(pattern) if pattern else None
    return [(op_id(op), op) for op in op_db
            if _why_skipped(op) is None and (rx is None or rx.search(op_id(op)))]


def dtypes_of(op, grad: bool) -> list:
    supported = op.supported_backward_dtypes("cpu") if grad else op.supported_dtypes("cpu")
    return [d for d in (GRAD_DTYPES if grad else DTYPES) if d in supported]


def samples_of(op, dtype, grad: bool, n: int, reference: bool = False) -> list:
    """Up to n of the op's samples, spread over its list (the first ones are the plainest).
    reference: its reference inputs instead (the samples, then larger tensors and extremal
    values: NaN, infinities, huge and tiny numbers, for some ops)."""
    torch.manual_seed(len(op.name) * 1000 + DTYPES.index(dtype))
    samples, most = [], 200 if reference else 40
    for s in (op.reference_inputs if reference else op.sample_inputs)("cpu", dtype, requires_grad=grad):
        if _tensors_in(s, lambda t: t.layout != torch.strided or t.is_complex()):
            continue        # sparse layouts, complex numbers: out of scope
        samples.append(s)
        if len(samples) >= most:
            break
    if len(samples) <= n:
        return list(enumerate(samples))
    step = (len(samples) - 1) / max(n - 1, 1)
    picks = sorted({round(i * step) for i in range(n)})
    return [(i, samples[i]) for i in picks]


def _tensors_in(sample, pred) -> bool:
    flat = torch.utils._pytree.tree_leaves([sample.input, list(sample.args), dict(sample.kwargs)])
    return any(isinstance(t, torch.Tensor) and pred(t) for t in flat)


def as_function(op, sample):
    """(f, tensors): f(*tensors) calls the op on the sample; its other arguments are constants
    (globals of f), so capture sees a plain call."""
    tensors, consts = [], {}

    def src(v):
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            return f"t{len(tensors) - 1}"
        if type(v) in (list, tuple) and any(isinstance(x, torch.Tensor) for x in
                                             torch.utils._pytree.tree_leaves(v)):
            inner = ", ".join(src(x) for x in v)
            return f"[{inner}]" if type(v) is list else f"({inner},)"
        consts[f"c{len(consts)}"] = v
        return f"c{len(consts) - 1}"

    call = [src(sample.input)] + [src(a) for a in sample.args] + \
           [f"{k}={src(v)}" for k, v in sample.kwargs.items()]
    params = ", ".join(f"t{i}" for i in range(len(tensors)))
    namespace = {"op": op.op, **consts}
    exec(f"def case({params}):\n    return op({', '.join(call)})\n", namespace)
    return namespace["case"], tensors


def exact_copy(t: torch.Tensor, requires_grad: bool = False) -> torch.Tensor:
    """A new tensor equal to t with t's sizes, strides and storage offset (a transposed, sliced
    or expanded view stays one), a leaf."""
    storage = t.untyped_storage().nbytes() // t.element_size()
    base = t.detach().as_strided((storage,), (1,), 0).clone()       # the whole storage, as it is
    return base.as_strided(t.shape, t.stride(), t.storage_offset()).requires_grad_(requires_grad)


def _leaves(out):
    return torch.utils._pytree.tree_leaves(out)


def _compare(actual, expected, tol, what: str):
    """Raises AssertionError with `what` where the two (pytrees of tensors and numbers) differ."""
    a, e = _leaves(actual), _leaves(expected)
    if len(a) != len(e):
        raise AssertionError(f"{what}: {len(a)} values, eager has {len(e)}")
    for i, (x, y) in enumerate(zip(a, e)):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor):
                raise AssertionError(f"{what}[{i}]: {type(x).__name__}, eager has a tensor")
            exact = not (y.is_floating_point() or y.is_complex())
            rtol, atol = (0, 0) if exact else tol.get(y.dtype, (1e-4, 1e-5))
            try:
                torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as err:
                raise AssertionError(f"{what}[{i}] {tuple(y.shape)} {y.dtype}: {err}") from None
        elif x != y and not (x != x and y != y):
            raise AssertionError(f"{what}[{i}]: {x!r}, eager has {y!r}")


def _layout_differs(actual, expected, actual_in, expected_in) -> str | None:
    """Where an output's strides differ from eager's (over dims longer than 1: code that views
    the result may raise where eager's runs), or it shares memory with other inputs than
    eager's does (a write into it would reach other tensors)."""
    def shared(t, inputs):
        ptr = t.untyped_storage().data_ptr()
        return [k for k, x in enumerate(inputs) if x.numel() and ptr == x.untyped_storage().data_ptr()]
    for i, (x, y) in enumerate(zip(_leaves(actual), _leaves(expected))):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape:
            long = [d for d in range(y.dim()) if y.shape[d] > 1]
            if [x.stride(d) for d in long] != [y.stride(d) for d in long]:
                return f"output[{i}] {tuple(y.shape)}: strides {x.stride()}, eager's {y.stride()}"
            if y.numel() and shared(x, actual_in) != shared(y, expected_in):
                return f"output[{i}] shares memory with inputs {shared(x, actual_in)}, " \
                       f"eager's with {shared(y, expected_in)}"
    return None


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds: int):
    def expire(signum, frame):
        raise _Timeout(f"ran past {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _where(err: BaseException) -> str:
    """The innermost frame of minicompile (else the innermost) that raised: groups crashes."""
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if "minicompile" in f.filename] or frames
    if not mine:
        return ""
    f = mine[-1]
    return f"{f.filename.rpartition('minicompile/')[2]}:{f.lineno} {f.name}"


def _differentiable(out) -> list:
    return [t for t in _leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad
            and t.is_floating_point()]


def run_case(op, sample, grad: bool, timeout: int = 120) -> dict:
    """One case: {"outcome": ok | wrong | crash | break | raised, "detail": why}."""
    import minicompile
    from minicompile import api
    fn, tensors = as_function(op, sample)
    post = sample.output_process_fn_grad if grad else (lambda x: x)

    def inputs():
        return [exact_copy(t, grad and t.requires_grad) for t in tensors]

    # eager, the reference
    try:
        eager_in = inputs()
    except Exception as err:          # noqa: BLE001: a sample this harness cannot copy
        return {"outcome": "skip", "detail": f"inputs: {type(err).__name__}: {err}"[:200]}
    torch.manual_seed(0)
    try:
        expected = post(fn(*eager_in))
        eager_err = None
    except Exception as err:          # noqa: BLE001: any exception is a valid eager outcome
        eager_err = err
    cotangents = grads = None
    if eager_err is None and grad:
        outs = _differentiable(expected)
        if not outs:
            return {"outcome": "skip", "detail": "no differentiable output"}
        torch.manual_seed(1)
        cotangents = [torch.randn_like(o) for o in outs]
        wrt = [t for t in eager_in if t.requires_grad]
        grads = torch.autograd.grad(outs, wrt, cotangents, allow_unused=True)

    # minicompile
    compiled_in = inputs()
    minicompile.reset()
    minicompile.metrics.reset()
    reasons: list = []
    api._RECORDERS.append(reasons)
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings(record=True) as caught, _alarm(timeout):
            warnings.simplefilter("always")
            actual = post(minicompile.compile(fn)(*compiled_in))
            if grad and eager_err is None:
                outs = _differentiable(actual)
                wrt = [t for t in compiled_in if t.requires_grad]
                actual_grads = torch.autograd.grad(outs, wrt, cotangents, allow_unused=True)
    except _Timeout as err:
        return {"outcome": "crash", "detail": f"timeout: {err}"}
    except Exception as err:          # noqa: BLE001
        if eager_err is not None and isinstance(err, type(eager_err)):     # caught as eager's is
            return {"outcome": "raised", "detail": f"{type(err).__name__}: {str(err)[:200]}"}
        what = f"{type(err).__name__}: {str(err)[:300]}"
        if eager_err is not None:
            what = f"eager raised {type(eager_err).__name__}, minicompile {what}"
        return {"outcome": "crash", "detail": what, "where": _where(err)}
    finally:
        api._RECORDERS.remove(reasons)
    if eager_err is not None:         # a result where eager raises: as wrong as a wrong value
        return {"outcome": "wrong", "detail": f"eager raised {type(eager_err).__name__}: "
                                              f"{str(eager_err)[:200]}, minicompile ran"}
    try:
        _compare(actual, expected, FWD_TOL, "output")
        _compare(compiled_in, eager_in, FWD_TOL, "input after the call")
        if grad:
            _compare([g for g in actual_grads if g is not None],
                     [g for g in grads if g is not None], BWD_TOL, "gradient")
            if [g is None for g in actual_grads] != [g is None for g in grads]:
                raise AssertionError("gradient: another set of inputs got one")
    except AssertionError as err:
        return {"outcome": "wrong", "detail": str(err)[:600]}
    fallback = [str(w.message) for w in caught if "minicompile" in str(w.message)]
    broke = [str(r.reason if hasattr(r, "reason") else r) for _, r in reasons if r is not None]
    if minicompile.metrics.graph_breaks or broke or fallback:
        return {"outcome": "break", "detail": "; ".join(broke + fallback)[:300]}
    layout = _layout_differs(actual, expected, compiled_in, eager_in)
    if layout is not None:
        return {"outcome": "layout", "detail": layout}
    return {"outcome": "ok", "detail": ""}


def cases_of(op, n_float32: int, n_other: int, n_errors: int = 0, reference: bool = False):
    """(dtype, grad, sample index, sample) of one op: forward cases, backward ones, then its
    error inputs (dtype None: samples on which eager raises)."""
    yield from _sample_cases(op, n_float32, n_other, reference)
    try:
        errors = [e.sample_input for e, _ in zip(op.error_inputs("cpu"), range(n_errors))]
    except Exception:                 # noqa: BLE001: error inputs that need CUDA...
        errors = []
    for i, s in enumerate(errors):
        yield None, False, i, s


def _sample_cases(op, n_float32: int, n_other: int, reference: bool):
    for grad in (False, True):
        if grad and not op.supports_autograd:
            continue
        for dtype in dtypes_of(op, grad):
            n = n_float32 if dtype == torch.float32 else n_other
            try:
                picked = samples_of(op, dtype, grad, n, reference)
            except Exception as err:  # noqa: BLE001: samples that need CUDA, a missing package...
                yield dtype, grad, -1, err
                continue
            for i, s in picked:
                yield dtype, grad, i, s


def _worker(args) -> None:
    """Runs the cases of the ops named on stdin, one JSON line per case on stdout."""
    torch.set_num_threads(1)
    import minicompile
    minicompile.config.cpu_backend = args.backend
    ops = dict(select_ops())
    out = sys.stdout
    sys.stdout = sys.stderr          # prints of the ops and of minicompile stay out of the protocol
    for name in sys.stdin.read().split():
        op = ops[name]
        print(json.dumps({"op": name, "start": True}), file=out, flush=True)
        for dtype, grad, i, sample in cases_of(op, args.samples, args.other_samples, args.errors,
                                               args.reference):
            row = {"op": name, "dtype": str(dtype).removeprefix("torch."),
                   "pass": "err" if dtype is None else "bwd" if grad else "fwd", "sample": i}
            if isinstance(sample, Exception):
                row.update(outcome="skip", detail=f"samples: {type(sample).__name__}: {sample}"[:200])
            else:
                row.update(run_case(op, sample, grad, args.timeout))
            print(json.dumps(row), file=out, flush=True)


def _drive(args) -> None:
    """Runs every selected op in worker processes, restarting one that dies, into args.out."""
    names = [name for name, _ in select_ops(args.ops)]
    if args.start or args.stop:
        names = names[args.start:args.stop]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MINICOMPILE_GRAPH_CACHE": "0"}
    env.setdefault("TRITON_INTERPRET", "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", args.backend,
           "--samples", str(args.samples), "--other-samples", str(args.other_samples),
           "--errors", str(args.errors), "--timeout", str(args.timeout)] + \
        (["--reference"] if args.reference else [])
    with open(args.out, "a") as sink:
        while names:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env=env, text=True)
            proc.stdin.write("\n".join(names))
            proc.stdin.close()
            current = None
            for line in proc.stdout:
                row = json.loads(line)
                if row.get("start"):
                    current = row["op"]
                    print(current, file=sys.stderr, flush=True)
                    continue
                row["backend"] = args.backend
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            rc = proc.wait()
            done = names.index(current) + 1 if current in names else 0
            if rc != 0 and current is not None:
                sink.write(json.dumps({"op": current, "backend": args.backend, "outcome": "crash",
                                       "detail": f"worker died (exit {rc})"}) + "\n")
            names = names[done:] if rc != 0 else []
    report(args.out)


def report(path: str) -> None:
    """Counts per outcome (cases and ops), then every op with a wrong result or a crash."""
    rows = [json.loads(line) for line in open(path)]
    per_op = collections.defaultdict(list)
    for r in rows:
        per_op[(r.get("backend"), r["op"])].append(r)
    order = ["wrong", "crash", "layout", "break", "raised", "ok", "skip"]
    cases = collections.Counter(r["outcome"] for r in rows)
    worst = collections.Counter(min((r["outcome"] for r in rs), key=order.index)
                                for rs in per_op.values())
    pairs = {(r["op"], r.get("dtype")) for r in rows if r["outcome"] != "skip"}
    print(f"{len(per_op)} ops, {len(pairs)} op x dtype pairs, {len(rows)} cases")
    print("cases:", ", ".join(f"{k} {cases[k]}" for k in order if cases[k]))
    print("ops by worst case:", ", ".join(f"{k} {worst[k]}" for k in order if worst[k]))
    for kind in ("wrong", "crash", "layout"):
        print(f"\n--- {kind}")
        for (backend, op), rs in sorted(per_op.items()):
            bad = [r for r in rs if r["outcome"] == kind]
            if bad:
                r = bad[0]
                print(f"{op} [{backend}] {len(bad)}x {r.get('dtype')} {r.get('pass')}: "
                      f"{r['detail'][:160]} {r.get('where', '')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", help="regex over op names (name.variant)")
    p.add_argument("--start", type=int, default=0, help="first op (index into the selection)")
    p.add_argument("--stop", type=int, default=None, help="op after the last")
    p.add_argument("--backend", default="cpp", choices=["cpp", "triton"])
    p.add_argument("--samples", type=int, default=2, help="samples per op in float32")
    p.add_argument("--other-samples", type=int, default=1, help="samples per op in other dtypes")
    p.add_argument("--errors", type=int, default=2, help="error inputs per op (eager raises)")
    p.add_argument("--reference", action="store_true",
                   help="the ops' reference inputs (larger, extremal values) instead of their samples")
    p.add_argument("--timeout", type=int, default=120, help="seconds per case")
    p.add_argument("--out", default="opinfo_sweep.jsonl")
    p.add_argument("--report", metavar="JSONL", help="print the tables of an earlier run")
    p.add_argument("--list", action="store_true", help="print the selected ops and stop")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.report:
        report(args.report)
    elif args.list:
        for i, (name, _) in enumerate(select_ops(args.ops)):
            print(i, name)
    elif args.worker:
        _worker(args)
    else:
        _drive(args)


if __name__ == "__main__":
    main()
