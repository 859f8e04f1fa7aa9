"""Code generation: the fusion schedule -> kernels (cpp.py, triton.py) and host code (wrapper.py)."""
