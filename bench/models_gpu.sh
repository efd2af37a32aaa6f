#!/bin/sh
# Issue 30's whole models on a lent GPU (bench/models_gpu.py): the machine's own transformers
# and mineru 4.0.12 (installed --no-deps) rewritten by `rocmfix apply --force`, stock against
# patched eager forwards in one process, the profiler's view, then `rocmfix revert`.
# Needs $WHL (default .whl) with libcst-*.whl and mineru/mineru-4.0.12-py3-none-any.whl;
# results land in $OUT (models.json, models.txt). BREAKDOWN=1: torch.profiler per op as well.
set -u
W=${WHL:-.whl}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/libcst-*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=100
PY=$(command -v python3)
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "triton", triton.__version__, "transformers", transformers.__version__)'
MW=$W/mineru/mineru-4.0.12-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --no-compile "$MW" \
    || python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages "$MW" \
    || exit 1
IDS="--only transformers-hgnet-v2 --only mineru-ocr-lcnetv4 --only mineru-ocr-hgnetv2"
IDS="$IDS --only mineru-ocr-replkfpn --only mineru-ocr-lightsvtr --only mineru-ocr-db-head"
# shellcheck disable=SC2086
python3 -m rocmfix apply --force --scheme triton $IDS --python "$PY" 2>&1 | tail -12
timeout "${LIMIT:-420}" python3 bench/models_gpu.py --reps "${REPS:-30}" --out "$OUT/models.json" \
    --models "${MODELS:-layout,det,rec,formula}" ${BREAKDOWN:+--breakdown} \
    2>&1 | tee "$OUT/models.txt" | tail -120
python3 -m rocmfix revert --python "$PY" 2>&1 | tail -2
