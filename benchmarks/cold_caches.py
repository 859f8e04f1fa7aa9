"""Imported first by a benchmark script (before torch): every compiler's on-disk cache points
into a new empty folder, so first calls measured in that run are cold for both compilers."""
import os
import tempfile

_root = tempfile.mkdtemp(prefix="bench-caches-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", f"{_root}/inductor")
os.environ.setdefault("TRITON_CACHE_DIR", f"{_root}/triton")
os.environ.setdefault("MINICOMPILE_CACHE_DIR", f"{_root}/minicompile")
