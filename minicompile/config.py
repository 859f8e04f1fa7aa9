"""Settings read by every stage. Change them as attributes: `minicompile.config.recompile_limit = 4`."""
import os
import sys

# After this many compiled entries for one code object, the frame runs eagerly (with a warning),
# as in torch.compile (torch._dynamo.config.recompile_limit).
recompile_limit = 8

# Kernels for CPU tensors: "cpp" (C++ with OpenMP, the default) or "triton" (through Triton's
# interpreter: slow, but it runs the exact Triton code a GPU would get).
cpu_backend = os.environ.get("MINICOMPILE_CPU_BACKEND", "cpp")

# Where compiled C++ libraries and generated Triton modules are cached, keyed by source hash.
cache_dir = os.environ.get("MINICOMPILE_CACHE_DIR",
                           os.path.join(os.path.expanduser("~"), ".cache", "minicompile"))

# The whole-graph cache (runtime/cache.py): a graph compiled before, in any process, loads its
# generated code from cache_dir instead of being lowered, fused and generated again.
graph_cache = os.environ.get("MINICOMPILE_GRAPH_CACHE", "1") != "0"
# Saved frames (frame_store.py): with the graph cache on, a frame compiled before in any process
# is not captured again where its saved guard holds.
frame_cache = os.environ.get("MINICOMPILE_FRAME_CACHE", "1") != "0"

# Guards check the static-shaped tensors of an entry (a model's parameters) with one call of
# TorchDynamo's C++ TensorGuards (capture/guards.py); False: each by Python expressions.
cpp_tensor_guards = os.environ.get("MINICOMPILE_CPP_GUARDS", "1") != "0"

# The C++ compiler and its flags (OpenMP for the outer loop; the inner loop is vectorized).
cxx = os.environ.get("CXX", "g++")
# 512-bit vectors where the CPU has them (GCC prefers 256 by default): row reductions and the
# vector math library's exp run twice as wide; on a CPU without AVX-512 the flag does nothing.
# No fused multiply-adds the source does not write: eager rounds a * b before it adds c (with
# one, a * a - b * b of equal a and b is a rounding error, not 0: sqrt of it NaN), as Inductor's
# C++ code does too.
cxx_flags = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno",
             "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC", "-std=c++17"]
# Linked after the source: glibc's vector math library (exp, tanh, erf... on 8 floats at once).
cxx_libs = ["-lmvec"] if sys.platform.startswith("linux") else []


# Random numbers (torch.rand, randn, randint, randperm, bernoulli, dropout in training...): by
# default each random op runs as PyTorch's own kernel, once and in the order eager runs it, so
# a seeded program gives eager's numbers and leaves PyTorch's generator as eager leaves it; its
# result is then fused into the work that reads it. False: dropout, bernoulli, rand_like and
# randn_like are made inside the generated kernels instead (Philox, from one seed per op drawn
# from PyTorch's generator), which saves writing and reading the random tensor. Those are
# other numbers than eager's (a different stream, of the same distribution). The name and the
# meaning are torch._inductor.config.fallback_random's, whose default is False.
fallback_random = True


# A graph's Triton kernels are compiled by this many worker processes at most, and by no more
# than the machine has cores (forked; one: in this process, one by one).
compile_workers = int(os.environ.get("MINICOMPILE_COMPILE_WORKERS", "16"))


# 2-D convolutions are handed their input channels-last (and return their result so): on a
# CPU where oneDNN is there, on a GPU where cuDNN is (Inductor's layout optimization). False:
# every convolution keeps PyTorch's default layout.
channels_last_convolutions = os.environ.get("MINICOMPILE_CHANNELS_LAST", "1") != "0"


# mode="reduce-overhead" (and "max-autotune"): each compiled graph whose inputs are on one CUDA
# device replays CUDA graphs, one recording per input signature, at most this many per graph
# (runtime/cudagraphs.py). Set by the mode; can be set as an option too.
cudagraphs = False
cudagraph_max_recordings = 8
# mode="max-autotune": on a GPU, each Triton kernel's launch settings (block sizes, warps) are
# chosen by timing candidates when the graph is compiled (codegen/triton.py autotune), the
# choices kept in cache_dir/autotune. On a CPU it changes nothing (and the log says so).
autotune = False
# Matrix products and the pointwise work after them as one Triton kernel (fusion's
# matmul-templates): None, in mode="max-autotune" on a GPU, where timing says it is faster than
# PyTorch's product and a separate kernel; True, wherever Triton kernels run (Triton's
# interpreter on a CPU too), untimed; False, never.
matmul_templates = None
# Time a few replays against a few default calls after each recording, and keep the faster
# (copying large inputs in and outputs out can cost more than the launches a replay saves).
cudagraph_keep_faster = True


# The fusion passes `minicompile.compile` runs, in order: None for `fusion.PASSES`, or a list of
# passes (objects with a `name` and a `run(state)` method; Part III's assignments add their own).
# As an option, a tuple: `compile(fn, options={"fusion_passes": (...)})`.
fusion_passes = None


def patch(**changes):
    """Context manager: `with config.patch(cpu_backend="triton"): ...` sets these settings for
    the block only (how `minicompile.compile(..., options={...})` applies its options)."""
    import contextlib

    unknown = [k for k in changes if k not in globals() or k.startswith("_") or callable(globals()[k])]
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}: options are the settings in minicompile.config")

    @contextlib.contextmanager
    def patched():
        saved = {k: globals()[k] for k in changes}
        globals().update(changes)
        try:
            yield
        finally:
            globals().update(saved)
    return patched()
