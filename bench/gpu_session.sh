#!/bin/bash
# One lent-GPU session's checks, batched (docs/performance.md records what it printed):
#   bash bench/gpu_session.sh tests    # tests/test_gpu.py, then bench/depthwise_conv.py
#   bash bench/gpu_session.sh profile  # bench/profile_gpu.sh
#   bash bench/gpu_session.sh compile  # bench/compile_gpu.py
# Needs .whl/ with libcst (for rocmfix itself) and doclayout_yolo 0.0.4 for the GPU's Python;
# results land in $OUT.
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=100
OUT=${OUT:-/tmp/out}
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
case "${1:-tests}" in
tests)
    timeout 330 python3 -m pytest -p no:cacheprovider -o addopts= -q -x tests/test_gpu.py \
        2>&1 | tee "$OUT/test_gpu.txt" | tail -15
    timeout 200 python3 bench/depthwise_conv.py --json "$OUT/depthwise.json" 2>&1 \
        | tee "$OUT/depthwise.txt" | tail -40
    ;;
profile)
    OUT=$OUT/profile timeout 500 bash bench/profile_gpu.sh 2>&1 | tee "$OUT/profile.txt" | tail -80
    ;;
compile)
    timeout 540 python3 bench/compile_gpu.py --out "$OUT/compile_gpu.json" 2>&1 \
        | grep -v pow_by_natural | tee "$OUT/compile.txt" | tail -40
    ;;
esac
