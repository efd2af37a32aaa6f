#!/bin/sh
# One lent GPU call for the depthwise entry's eager cost (issue 30), from this tree:
#   (a) bench/eager_host.py --depthwise: every MinerU depthwise shape, F.conv2d, the entry
#       alone and fused, and each shape's pieces (Triton's launcher, the replay's launch,
#       the allocation, the entry with its launch stubbed) in strictly interleaved bursts;
#   (b) whole models, eager, through bench/models_gpu.sh (skipped with MODELS=none).
# Options (environment): BURSTS (21), CALLS (100), EAGER_LIMIT (s, 150), OLD (another tree's
# templates folder, its fused entry beside), TRANSPOSED=1 (the DB head's transposed convs
# too), MODELS (det; "none" skips (b)), REPS (30), LIMIT (s, 150), BREAKDOWN=1 (the
# profiler's per-op view), WHL (the wheels folder, default .whl). Results land in $OUT:
# eager.txt, eager_depthwise.md/.json, models_run.txt, models.json.
#   cd .dev/NAME && WHL=../../.whl OUT=$OUT sh bench/eager_gpu.sh
set -u
W=${WHL:-.whl}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/libcst-*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cudnn", torch.backends.cudnn.version())'
NT=--no-transposed
[ "${TRANSPOSED:-0}" = 1 ] && NT=
# shellcheck disable=SC2086
OUT=$OUT timeout "${EAGER_LIMIT:-150}" python3 bench/eager_host.py --depthwise \
    --bursts "${BURSTS:-21}" --calls "${CALLS:-100}" ${OLD:+--old "$OLD"} \
    $NT > "$OUT/eager.txt" 2>&1
echo "eager rc $?"
grep -E '^\|' "$OUT/eager.txt" | grep -v 'µs/call' | tail -30
grep -c '^| depthwise' "$OUT/eager.txt"
[ "${MODELS:-det}" = none ] && exit 0
WHL=$W MODELS=${MODELS:-det} REPS=${REPS:-30} LIMIT=${LIMIT:-150} OUT=$OUT \
    timeout $((${LIMIT:-150} + 60)) sh bench/models_gpu.sh > "$OUT/models_run.txt" 2>&1
echo "models rc $?"
grep -E '"(stock_ms|patched_ms|ratio|stock_min_ms|patched_min_ms|rel_err|error)"|per forward' \
    "$OUT/models_run.txt" | head -30
