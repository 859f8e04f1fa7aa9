#!/usr/bin/env bash
# Everything checked and measured on a GPU machine, in one call (see .library device notes):
# the unit tests (Triton kernels compiled for real, capture on that machine's Python) and the
# benchmarks. Results land in $OUT. Usage: benchmarks/gpu_run.sh [tests] [why] [memory] [models] [realmodels] [dynamic] [firstcall] [sweep] [heavysweep] [training] [checkpointed] [modes] [optimizer] [columns] [splitcolumns] [unaligned] [decode] [nbval]
# nbval: the notebooks NOTEBOOKS (default all) under nbval; jupyter and nbval must be importable
# (on the device machine: wheels installed into a folder on PYTHONPATH, which is kept)
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MINICOMPILE_CACHE_DIR=/tmp/mc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=" ${*:-tests why memory models} "
python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [[ $what == *" tests "* ]]; then
  python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
fi
if [[ $what == *" testsubset "* ]]; then
  python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests} 2>&1 | tee "$OUT/pytest_gpu_subset.log" | tail -15
fi
if [[ $what == *" fusionlog "* ]]; then python3 benchmarks/fusion_log.py 2>&1 | tee "$OUT/fusion_log.txt" | tail -30; fi
if [[ $what == *" sweep "* ]]; then python3 benchmarks/sweep_configs.py --out "$OUT"; fi
if [[ $what == *" heavysweep "* ]]; then python3 benchmarks/sweep_configs.py --heavy --out "$OUT" 2>&1 | grep -v Warning | tail -14; fi
if [[ $what == *" why "* ]]; then python3 benchmarks/why_compile.py --device cuda --out "$OUT" 2>&1 | tail -8; fi
if [[ $what == *" memory "* ]]; then python3 benchmarks/memory_bound.py --device cuda --repeat 200 --out "$OUT" 2>&1 | tail -9; fi
if [[ $what == *" models "* ]]; then python3 benchmarks/models_bench.py --device cuda --out "$OUT" 2>&1 | tail -5; fi
if [[ $what == *" realmodels "* ]]; then python3 benchmarks/real_models.py --device cuda --out "$OUT" ${MODELS:+--models $MODELS} ${NAME:+--name $NAME} 2>&1 | grep -v Warning | tail -12; fi
if [[ $what == *" dynamic "* ]]; then python3 benchmarks/dynamic_shapes.py --device cuda --out "$OUT" 2>&1 | tail -8; fi
if [[ $what == *" firstcall "* ]]; then python3 benchmarks/first_call.py --device cuda --out "$OUT" 2>&1 | tail -9; fi
if [[ $what == *" modes "* ]]; then python3 benchmarks/modes.py --out "$OUT" 2>&1 | grep -v Warning | tail -24; fi
if [[ $what == *" training "* ]]; then python3 benchmarks/training.py --device cuda --out "$OUT" 2>&1 | grep -v Warning | tail -16; fi
if [[ $what == *" checkpointed "* ]]; then python3 benchmarks/training.py --device cuda --checkpoint --out "$OUT" ${MODELS:+--models $MODELS} 2>&1 | grep -v Warning | tail -10; fi
if [[ $what == *" columns "* ]]; then python3 benchmarks/sweep_column_reductions.py --out "$OUT" 2>&1 | grep -v Warning | tail -6; fi
if [[ $what == *" splitcolumns "* ]]; then python3 benchmarks/sweep_column_reductions.py --split --out "$OUT" 2>&1 | grep -v Warning | tail -9; fi
if [[ $what == *" optimizer "* ]]; then python3 benchmarks/optimizer.py --device cuda --out "$OUT" 2>&1 | grep -v "Warning\|record_function" | tail -24; fi
if [[ $what == *" decode "* ]]; then python3 benchmarks/decode.py --out "$OUT" ${MODELS:+--models $MODELS} 2>&1 | grep -v "Warning\|token_id" | tail -16; fi
if [[ $what == *" unaligned "* ]]; then python3 benchmarks/unaligned_matmul.py --out "$OUT" 2>&1 | grep -v Warning | tail -90; fi
if [[ $what == *" nbval "* ]]; then
  python3 -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env --nbval-cell-timeout=300 -p no:randomly \
    ${NOTEBOOKS:-notebooks} 2>&1 | tee "$OUT/nbval_gpu.log" | tail -15
fi
