"""Counters a test, a notebook or an assignment's grader can assert on.

    minicompile.metrics.reset()
    f(x)
    minicompile.metrics.kernels        # kernels generated since the reset
    minicompile.metrics.kernel_bytes   # [(kernel name, bytes read, bytes written), ...]
    minicompile.metrics.backward_kernels   # of those, the kernels of compiled backward graphs
    minicompile.metrics.compile_seconds    # {stage: seconds} spent compiling, as Dynamo's
                                           # compile_times(): where a first call's time went
    minicompile.metrics.template_choices   # max-autotune's matrix-product templates, as timed
"""
import contextlib
import time

graphs = 0          # FX graphs captured and compiled (or saved frames loaded: frame_store.py)
graph_breaks = 0    # graph breaks (a frame that could not be captured whole counts one)
recompiles = 0      # compiles of a frame that already had a compiled entry
kernels = 0         # kernels generated (Triton or C++), extern calls not counted
kernel_bytes: list = []
backward_kernels = 0  # kernels of compiled backward graphs (training), counted in `kernels` too
# seconds by stage: capture, joint trace, partition, lowering, fusion, code generation, kernel
# compile (waiting for the C++ compiler or Triton's workers). A stage inside another (a graph
# compiled at a break, during capture) counts in its own stage only.
compile_seconds: dict = {}
# each matrix-product template max-autotune timed (codegen/matmul_template.py): {"kernel",
# "sizes" (m, k, n), "dtype", "template_ms", "settings", "pytorch_ms" (its product and the
# epilogue kernel), "chosen" ("template" or "pytorch"), "same_code" (the graph's templates of
# this code, which the choice serves)}
template_choices: list = []
_open: list = []        # the stages being timed, innermost last: [stage, start, seconds inside]


def reset() -> None:
    global graphs, graph_breaks, recompiles, kernels, kernel_bytes, backward_kernels
    graphs = graph_breaks = recompiles = kernels = backward_kernels = 0
    kernel_bytes = []
    compile_seconds.clear()
    template_choices.clear()


@contextlib.contextmanager
def timed(stage: str):
    """Add the time inside the block to compile_seconds[stage], less the stages timed inside it."""
    entry = [stage, time.perf_counter(), 0.0]
    _open.append(entry)
    try:
        yield
    finally:
        _open.pop()
        spent = time.perf_counter() - entry[1]
        compile_seconds[stage] = compile_seconds.get(stage, 0.0) + spent - entry[2]
        if _open:
            _open[-1][2] += spent


def bytes_moved() -> int:
    """Total bytes read plus written by the kernels generated since the reset."""
    return sum(r + w for _, r, w in kernel_bytes)
