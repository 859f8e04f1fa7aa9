"""Counters a test, a notebook or an assignment's grader can assert on.

    minicompile.metrics.reset()
    f(x)
    minicompile.metrics.kernels        # kernels generated since the reset
    minicompile.metrics.kernel_bytes   # [(kernel name, bytes read, bytes written), ...]
    minicompile.metrics.backward_kernels   # of those, the kernels of compiled backward graphs
"""
graphs = 0          # FX graphs captured and compiled (or saved frames loaded: frame_store.py)
graph_breaks = 0    # graph breaks (a frame that could not be captured whole counts one)
recompiles = 0      # compiles of a frame that already had a compiled entry
kernels = 0         # kernels generated (Triton or C++), extern calls not counted
kernel_bytes: list = []
backward_kernels = 0  # kernels of compiled backward graphs (training), counted in `kernels` too


def reset() -> None:
    global graphs, graph_breaks, recompiles, kernels, kernel_bytes, backward_kernels
    graphs = graph_breaks = recompiles = kernels = backward_kernels = 0
    kernel_bytes = []


def bytes_moved() -> int:
    """Total bytes read plus written by the kernels generated since the reset."""
    return sum(r + w for _, r, w in kernel_bytes)
