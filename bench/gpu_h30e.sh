#!/bin/sh
# h30e's one GPU call: (a) eager per call, interleaved, (b) det and rec whole, with breakdown.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site ../../.whl/libcst-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader; python3 -V
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cudnn", torch.backends.cudnn.version())'
OUT=$OUT timeout 160 python3 bench/eager_host.py --depthwise --old old/templates --bursts 21 --calls 100 \
    > "$OUT/eager.txt" 2>&1
echo "eager rc $?"; grep '^|' "$OUT/eager.txt" | cut -c1-150 | head -160
WHL=../../.whl MODELS=det,rec REPS=50 LIMIT=190 BREAKDOWN=1 timeout 250 sh bench/models_gpu.sh \
    > "$OUT/models_run.txt" 2>&1
echo "models rc $?"
grep -E '"(stock_ms|patched_ms|ratio|rel_err|stock_host_ms|patched_host_ms|error)"|^==|per forward|wall_ms|self_cpu_ms|kernels  |gpu_kernel' "$OUT/models_run.txt" | head -60
