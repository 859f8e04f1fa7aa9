"""mode="reduce-overhead": a compiled graph's launches recorded once into a CUDA graph, replayed.

Takes a compiled values-only graph (the epilogue that writes inputs and makes views runs
after it, outside the recording) and its example inputs; hands back a callable with the same
signature. Per call, the host work of a default call (the wrapper's Python, every allocation,
every launch) becomes: copy the inputs into the recording's own input buffers, one
`cudaGraphLaunch`, copy the outputs out.

- One recording per input signature (sizes, strides, dtypes): a graph compiled with dynamic
  sizes records each size it meets, up to `config.cudagraph_max_recordings`; past that it runs
  the default path (and says so once), as torch.compile's does for dynamic shapes.
- Static inputs are used in place: `nn.Parameter`s, and tensors marked as at a fixed address
  (`minicompile.mark_static_address`, or torch._dynamo's, as a Hugging Face static KV cache
  marks its tensors). The recording reads (and, where the graph writes them, writes) their
  memory directly, so they are not copied per call; if one's memory moves, it is recorded
  again. Every other input is copied into a buffer of the recording (its sizes and strides),
  and what the graph writes into it is copied out and written back by the epilogue.
- Before recording, the graph runs once on a side stream (its kernels are compiled and loaded
  then: nothing may be compiled or allocated with the host's help while recording). That run,
  and the timed calls below, write static inputs the graph writes: those are put back after
  them, so each call writes its input once, as eager's does.
- A static input's new value that the graph's kernels could not store straight into it (and
  the caller reads for nothing else) is copied into it by the recording itself, after the
  graph's kernels: a replay hands back the input, written, instead of a value for the
  epilogue to copy out of the recording and then into the input.
- All recordings of one graph share a private memory pool.
- Outputs: a replay writes the same memory again, so each call's outputs (but a static input
  the graph wrote, handed back as the call's own tensor) are copies of the recording's
  (torch.compile instead hands out the recording's own memory and raises if it is read after
  the next replay). The `cudagraphs` log says so when a graph is recorded. Inputs
  are copied in, and outputs out, by one multi-tensor copy each (`torch._foreach_copy_`; a
  single output by `clone`).
- A replay is not always faster: copying a large input in and its output out can cost more
  than the launches it saves. Right after recording, a few replays and a few calls of the
  default path are timed (`config.cudagraph_keep_faster`), and the faster serves that
  signature from then on; the log gives both times.
- Not recorded (the default path, with the reason in the `cudagraphs` log): inputs not all on
  one CUDA device, a graph that records gradients, a recording that fails (an op that
  synchronizes with the host, for instance).
"""
from __future__ import annotations

import time

import torch
import torch.utils._pytree as pytree

from .. import config, ir, logs


def is_static(t) -> bool:
    """A tensor a recording uses in place (at its address) rather than copying it in per call."""
    return isinstance(t, torch.nn.Parameter) or getattr(t, "_dynamo_static_input_type", None) is not None


def record_when_possible(compiled, example_inputs, training: bool = False, written=(), dynamic: bool = True,
                         write_back=None):
    """`compiled`, replayed from CUDA graphs where it can be; else `compiled` (the reason logged).
    written: the indices of the static inputs that `compiled` writes in place. dynamic: the
    graph has dynamic sizes (False: its caller's guards fix every input's sizes and strides).
    write_back: {output k: static input i of `written`}: output k is only input i's new value,
    which the recording writes into input i (if the graph did not), handing back input i as
    output k."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    devices = {t.device for t in tensors}
    reason = None
    if training:
        reason = "the graph records gradients (compiled training is not recorded)"
    elif not tensors or any(d.type != "cuda" for d in devices) or len(devices) > 1:
        reason = "its inputs are not all on one CUDA device: " + \
                 (", ".join(sorted(str(d) for d in devices)) or "no tensor inputs")
    if reason is not None:
        logs.log("cudagraphs", f"not recorded: {reason}")
        return compiled
    return CUDAGraphed(compiled, next(iter(devices)), example_inputs, written, dynamic, write_back)


class _Recording:
    """One CUDA graph of the compiled graph, for one input signature. static_at: the positions
    of the inputs used in place (the others' tensors are copied into its own)."""

    def __init__(self, compiled, args, pool, device, static_at, written, write_back):
        self.inputs = list(args)        # per input: the recording's tensor, or the call's
        self.copied_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in static_at]
        for i in self.copied_at:
            a = args[i]
            self.inputs[i] = torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
        self._copy_in(args)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), kept_as_they_are([args[i] for i in written]):
            # warm-up: kernels compiled and loaded
            _written_back(compiled(*self.inputs), args, write_back)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            outputs = _written_back(compiled(*self.inputs), args, write_back)
        self.static_at = sorted(static_at)
        self.static_ptrs = [a.data_ptr() if i in static_at else None for i, a in enumerate(args)]
        self.out_leaves, self.out_spec = pytree.tree_flatten(outputs)
        # a flat list or tuple (a compiled graph's outputs) is made again without pytree
        self.flat = type(outputs) if type(outputs) in (list, tuple) and len(outputs) == len(self.out_leaves) \
            else None
        # an output that is a static input (written in place) is handed back as the call's
        # own input; every other tensor output is copied out of the recording's memory
        self.out_inputs = {i: j for i, v in enumerate(self.out_leaves) for j in static_at if v is args[j]}
        self.out_tensors = [i for i, v in enumerate(self.out_leaves)
                            if isinstance(v, torch.Tensor) and i not in self.out_inputs]

    def _copy_in(self, args):
        pairs = [(self.inputs[i], args[i]) for i in self.copied_at if self.inputs[i].data_ptr() != args[i].data_ptr()]
        if pairs:
            torch._foreach_copy_([m for m, _ in pairs], [t for _, t in pairs])

    def holds(self, args) -> bool:
        """The static inputs are where they were when recorded (one C++ call where PyTorch
        has it, as torch.compile's CUDA graphs check theirs)."""
        global _DATA_PTRS_EQUAL
        if _DATA_PTRS_EQUAL is not None:
            try:
                return _DATA_PTRS_EQUAL(list(args), self.static_ptrs, self.static_at)
            except (TypeError, RuntimeError):       # a binding that takes other arguments
                _DATA_PTRS_EQUAL = None
        return all(args[i].data_ptr() == self.static_ptrs[i] for i in self.static_at)

    def __call__(self, args):
        self._copy_in(args)
        self.graph.replay()
        leaves = list(self.out_leaves)
        recorded = [leaves[i] for i in self.out_tensors]
        if len(recorded) == 1:                # (one call where there is one)
            fresh = [recorded[0].clone()]
        else:
            fresh = [torch.empty_like(t) for t in recorded]
            if fresh:
                torch._foreach_copy_(fresh, recorded)
        for i, t in zip(self.out_tensors, fresh):
            leaves[i] = t
        for i, j in self.out_inputs.items():
            leaves[i] = args[j]
        return self.flat(leaves) if self.flat is not None else pytree.tree_unflatten(leaves, self.out_spec)


def _written_back(outputs, args, write_back):
    """The graph's outputs, each output k of write_back {k: i} copied into static input i
    (unless the graph stored it there) and replaced by that input."""
    if not write_back:
        return outputs
    outputs = list(outputs)
    for k, i in write_back.items():
        value, x = outputs[k], args[i]
        if value is not x and (value.data_ptr() != x.data_ptr() or value.stride() != x.stride()):
            x.copy_(value)
        outputs[k] = x
    return outputs


class kept_as_they_are:
    """A context in which the tensors given may be written; they hold their values again after."""

    def __init__(self, tensors):
        self.tensors = [t for t in tensors if isinstance(t, torch.Tensor)]

    def __enter__(self):
        self.saved = [t.clone() for t in self.tensors]

    def __exit__(self, *exc):
        if self.tensors:
            torch._foreach_copy_(self.tensors, self.saved)


def _per_call_s(fn, device, calls: int = 5) -> float:
    """Wall time per call of `fn`, `calls` calls back to back after one, to the GPU's end:
    whichever of the host and the GPU is slower sets it."""
    fn()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / calls


def _end_failed_capture(device) -> None:
    """A recording that fails part way leaves PyTorch's CUDA generator in its capturing state:
    its next random op raises "Offset increment outside graph capture". An empty recording
    takes it through a whole capture again, which ends that state."""
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass


_DEFAULT = object()           # a signature whose replay was slower than the default path


# (a private binding of CUDA builds of PyTorch; a Python loop where it is missing)
_DATA_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


def _signature(args, at) -> tuple:
    """What a recording is for: the sizes, strides and dtypes of the inputs at positions `at`
    (the numbers among them by value)."""
    return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else ("value", a)
                 for a in map(args.__getitem__, at))


class CUDAGraphed:
    """A compiled graph whose calls replay CUDA graphs, one recording per input signature."""

    def __init__(self, compiled, device, example_inputs, written=(), dynamic=True, write_back=None):
        self.compiled, self.device, self.written = compiled, device, tuple(written)
        self.write_back = dict(write_back or {})
        n = len(example_inputs)
        self.static_at = {i for i, a in enumerate(example_inputs) if isinstance(a, torch.Tensor) and is_static(a)}
        # per call, the key of its recording: a graph of static sizes meets one layout per
        # input (its caller's guards check them), so the inputs copied in and the numbers make
        # its key; a graph of dynamic sizes keys on every input
        self.keyed_at = range(n) if dynamic else [i for i in range(n) if i not in self.static_at]
        self.recordings: dict = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.limit = config.cudagraph_max_recordings
        self.failed: str | None = None
        self.said_limit = False

    def __call__(self, *args):
        if self.failed is not None:
            return self.compiled(*args)
        key = _signature(args, self.keyed_at)
        rec = self.recordings.get(key)
        if rec is not None and rec is not _DEFAULT and not rec.holds(args):
            logs.log("cudagraphs", "recorded again: a static input's memory moved")
            del self.recordings[key]
            rec = None
        if rec is None:
            if len(self.recordings) >= self.limit:
                if not self.said_limit:
                    self.said_limit = True
                    logs.log("cudagraphs", f"not recorded: {self.limit} input signatures are recorded "
                                           f"already (config.cudagraph_max_recordings); other "
                                           f"signatures run the default path")
                return self.compiled(*args)
            try:
                # the warm-up run and the recording draw no random numbers from the program's
                # stream: each replay then draws where eager's call would
                with ir.preserved_rng():
                    try:
                        rec = _Recording(self.compiled, args, self.pool, self.device, self.static_at, self.written,
                                         self.write_back)
                    except Exception:
                        _end_failed_capture(self.device)
                        raise
            except Exception as err:          # noqa: BLE001 (whatever stops the recording)
                self.failed = f"{type(err).__name__}: {err}"
                logs.log("cudagraphs", f"not recorded, the default path runs instead: {self.failed}")
                return self.compiled(*args)
            sizes = ", ".join("x".join(map(str, a.shape)) or "scalar" for a in args if isinstance(a, torch.Tensor))
            logs.log("cudagraphs", f"recorded a CUDA graph for inputs of sizes [{sizes}]: "
                                   f"{len(rec.copied_at)} inputs copied in per call, "
                                   f"{len(rec.static_at)} used in place; outputs copied out")
            if config.cudagraph_keep_faster:
                # the timed calls must not use up random numbers, nor write the inputs again
                with ir.preserved_rng(), kept_as_they_are([args[i] for i in self.written]):
                    replay = _per_call_s(lambda: rec(args), self.device)
                    default = _per_call_s(lambda: self.compiled(*args), self.device)
                keep = replay < default
                logs.log("cudagraphs", f"per call: replay {replay * 1e6:.1f} us, default path "
                                       f"{default * 1e6:.1f} us: the {'replay' if keep else 'default path'} "
                                       f"serves inputs of sizes [{sizes}]")
                if not keep:
                    rec = _DEFAULT
            self.recordings[key] = rec
        if rec is _DEFAULT:
            return self.compiled(*args)
        return rec(args)

    def __getattr__(self, name):
        return getattr(self.compiled, name)
