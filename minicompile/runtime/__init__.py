"""Run-time support for generated code: buffer allocation (memory.py). Later: CUDA graphs,
autotuning, the on-disk compile cache."""
