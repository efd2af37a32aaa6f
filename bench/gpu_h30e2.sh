#!/bin/sh
# h30e's second GPU call: where a replayed depthwise call's time goes (the split), and OCR
# det whole with the profiler's A B B A breakdown and each entry's in-situ calls and misses.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site ../../.whl/libcst-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u
OUT=$OUT timeout 100 python3 bench/eager_host.py --depthwise --split-only --bursts 21 --calls 100 \
    > "$OUT/split.txt" 2>&1
echo "split rc $?"; grep '^|' "$OUT/split.txt"
WHL=../../.whl MODELS=det REPS=30 LIMIT=150 BREAKDOWN=1 timeout 200 sh bench/models_gpu.sh \
    > "$OUT/models_run.txt" 2>&1
echo "models rc $?"
grep -E '"(stock_ms|patched_ms|ratio|stock_min_ms|patched_min_ms|error)"|per forward|wall_ms|self_cpu_ms|kernels  |gpu_kernel|in situ' "$OUT/models_run.txt" | head -40
grep -n "op (self CPU" -A40 "$OUT/models_run.txt" | head -45
