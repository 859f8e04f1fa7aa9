"""minicompile: a small but complete torch.compile.

    import minicompile
    f = minicompile.compile(fn)             # or @minicompile.compile, or compile(module)
    torch.compile(fn, backend=minicompile.backend)

Pipeline (one package per stage, in the order data flows): capture/ (bytecode -> FX graph),
lower/ (FX -> loop IR), fusion/ (which values get buffers, which ops share a kernel),
codegen/ (Triton and C++ kernels, Python host code), runtime/ (caches).
"""
from . import config, metrics
from .api import cache_info, compile, compile_regions, disable, explain, mark_dynamic, mark_static_address, reset
from .capture import Unsupported
from .graph_compiler import backend
from .logs import set_logs
from .package import export, load, save

__all__ = ["compile", "compile_regions", "cache_info", "disable", "explain", "reset", "mark_dynamic", "mark_static_address", "set_logs", "backend", "config",
           "Unsupported", "metrics", "export", "save", "load"]
__version__ = "0.1.0"
