#!/bin/sh
# Issue 33 (triton ops) on a lent GPU in one call under 300 s: DocLayout-YOLO `gemm` compiled
# against compiled stock (default-mode wall, CUDA-graph replay, kernels, rocmfix Python per
# forward: bench/compile_gpu.py), then the small dilated + depthwise model's Inductor checks
# (bench/triton_op_check.py: kernels in Inductor's code, errors, frames, reduce-overhead).
#   WHL=$PWD/.whl OUT=$OUT sh bench/gpu_h33t.sh
# ROCMFIX_TRITON_OP=0 in the environment measures the opaque op instead (the "before").
set -u
cd "$(dirname "$0")/.."
W=${WHL:-.whl}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$W"/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=100
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout "${LIMIT_DOC:-190}" python3 bench/compile_gpu.py --parts doclayout-gemm \
    --no-frames-for doclayout-gemm --reps 20 --out "$OUT/compile_gpu.json" 2>&1 \
    | grep -v pow_by_natural | tee "$OUT/compile.txt" | tail -25
timeout "${LIMIT_CHECK:-80}" python3 bench/triton_op_check.py --dtypes "${DTYPES:-float32}" \
    --out "$OUT/triton_op_check.json" 2>&1 | grep -v pow_by_natural \
    | tee "$OUT/check.txt" | tail -6
date -u
