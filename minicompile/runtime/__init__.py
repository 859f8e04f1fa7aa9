"""Run-time support for generated code: buffer allocation (memory.py), CUDA graphs for
mode="reduce-overhead" (cudagraphs.py), the whole-graph cache and its checked files (cache.py)."""
