#!/usr/bin/env bash
# Everything checked and measured on a GPU machine, in one call (see .library device notes):
# the unit tests (Triton kernels compiled for real, capture on that machine's Python),
# a block-size sweep, and the "Why compile?" benchmark. Results land in $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MINICOMPILE_CACHE_DIR=/tmp/mc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
python3 benchmarks/sweep_pointwise.py 8192 2>&1 | tee "$OUT/sweep.log"
python3 benchmarks/why_compile.py --device cuda --out "$OUT" 2>&1 | tail -8
