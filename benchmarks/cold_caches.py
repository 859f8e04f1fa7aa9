"""Imported first by a benchmark script (before torch): every compiler's on-disk cache points
into a new empty folder, so first calls measured in that run are cold for both compilers,
whatever the environment set (gpu_run.sh's MINICOMPILE_CACHE_DIR, kept by an earlier call on
the same machine, would otherwise make minicompile's first calls warm)."""
import os
import tempfile

_root = tempfile.mkdtemp(prefix="bench-caches-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{_root}/inductor"
os.environ["TRITON_CACHE_DIR"] = f"{_root}/triton"
os.environ["MINICOMPILE_CACHE_DIR"] = f"{_root}/minicompile"
