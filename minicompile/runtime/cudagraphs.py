"""mode="reduce-overhead": a compiled graph's launches recorded once into a CUDA graph, replayed.

Takes a compiled values-only graph (the epilogue that writes inputs and makes views runs
after it, outside the recording) and its example inputs; hands back a callable with the same
signature. Per call, the host work of a default call (the wrapper's Python, every allocation,
every launch) becomes: copy the inputs into the recording's own input buffers, one
`cudaGraphLaunch`, copy the outputs out.

- One recording per input signature (sizes, strides, dtypes): a graph compiled with dynamic
  sizes records each size it meets, up to `config.cudagraph_max_recordings`; past that it runs
  the default path (and says so once), as torch.compile's does for dynamic shapes.
- Parameters (`nn.Parameter` inputs) are used in place: the recording reads their memory
  directly, so they are not copied per call; if a parameter's memory moves, it is recorded again.
  Every other input is copied into a buffer of the recording (its sizes and strides).
- Before recording, the graph runs once on a side stream (its kernels are compiled and loaded
  then: nothing may be compiled or allocated with the host's help while recording).
- All recordings of one graph share a private memory pool.
- Outputs: a replay writes the same memory again, so each call's outputs are copies of the
  recording's (torch.compile instead hands out the recording's own memory and raises if it is
  read after the next replay). The `cudagraphs` log says so when a graph is recorded. Inputs
  are copied in, and outputs out, by one multi-tensor copy each (`torch._foreach_copy_`).
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


def record_when_possible(compiled, example_inputs, training: bool = False):
    """`compiled`, replayed from CUDA graphs where it can be; else `compiled` (the reason logged)."""
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
    return CUDAGraphed(compiled, next(iter(devices)))


class _Recording:
    """One CUDA graph of the compiled graph, for one input signature."""

    def __init__(self, compiled, args, pool, device):
        self.inputs = []        # per input: the recording's tensor, or the value (non-tensors)
        self.copied = []        # per input: whether the call's tensor is copied in
        for a in args:
            if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter):
                self.inputs.append(torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device))
                self.copied.append(True)
            else:
                self.inputs.append(a)
                self.copied.append(False)
        self._copy_in(args)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            compiled(*self.inputs)                   # warm-up: kernels compiled and loaded
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            outputs = compiled(*self.inputs)
        self.params = [a.data_ptr() if isinstance(a, torch.nn.Parameter) else None for a in args]
        self.out_leaves, self.out_spec = pytree.tree_flatten(outputs)
        self.out_tensors = [i for i, v in enumerate(self.out_leaves) if isinstance(v, torch.Tensor)]

    def _copy_in(self, args):
        pairs = [(mine, theirs) for mine, theirs, copied in zip(self.inputs, args, self.copied)
                 if copied and mine.data_ptr() != theirs.data_ptr()]
        if pairs:
            torch._foreach_copy_([m for m, _ in pairs], [t for _, t in pairs])

    def holds(self, args) -> bool:
        """The parameters are where they were when recorded."""
        return all(p is None or a.data_ptr() == p for a, p in zip(args, self.params))

    def __call__(self, args):
        self._copy_in(args)
        self.graph.replay()
        leaves = list(self.out_leaves)
        recorded = [leaves[i] for i in self.out_tensors]
        if recorded:
            fresh = [torch.empty_like(t) for t in recorded]
            torch._foreach_copy_(fresh, recorded)
            for i, t in zip(self.out_tensors, fresh):
                leaves[i] = t
        return pytree.tree_unflatten(leaves, self.out_spec)


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


def _signature(args) -> tuple:
    return tuple((tuple(a.shape), a.stride(), a.dtype, isinstance(a, torch.nn.Parameter))
                 if isinstance(a, torch.Tensor) else ("value", a) for a in args)


class CUDAGraphed:
    """A compiled graph whose calls replay CUDA graphs, one recording per input signature."""

    def __init__(self, compiled, device):
        self.compiled, self.device = compiled, device
        self.recordings: dict = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.limit = config.cudagraph_max_recordings
        self.failed: str | None = None
        self.said_limit = False

    def __call__(self, *args):
        if self.failed is not None:
            return self.compiled(*args)
        key = _signature(args)
        rec = self.recordings.get(key)
        if rec is not None and rec is not _DEFAULT and not rec.holds(args):
            logs.log("cudagraphs", "recorded again: a parameter's memory moved")
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
                        rec = _Recording(self.compiled, args, self.pool, self.device)
                    except Exception:
                        _end_failed_capture(self.device)
                        raise
            except Exception as err:          # noqa: BLE001 (whatever stops the recording)
                self.failed = f"{type(err).__name__}: {err}"
                logs.log("cudagraphs", f"not recorded, the default path runs instead: {self.failed}")
                return self.compiled(*args)
            sizes = ", ".join("x".join(map(str, k[0])) or "scalar" for k in key if k[0] != "value")
            logs.log("cudagraphs", f"recorded a CUDA graph for inputs of sizes [{sizes}]: "
                                   f"{sum(rec.copied)} inputs copied in per call, "
                                   f"{len(args) - sum(rec.copied)} used in place; outputs copied out")
            if config.cudagraph_keep_faster:
                with ir.preserved_rng():         # the timed calls must not use up random numbers
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
