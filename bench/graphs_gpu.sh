#!/bin/sh
# Issue 41's graph replay on a lent GPU (bench/graphs_gpu.py): mineru 4.0.12 and transformers
# 5.24.0 installed twice, once as they ship (/tmp/stock, --no-deps) and once into the machine's
# python (transformers with its dependencies, from $WHL/transformers), where `rocmfix apply`
# rewrites the three predictors, MinerU's layout call, PP-DocLayoutV2's modeling file (and,
# on 5.3.0-5.20.1, masking_utils' eager mask) and the formula encoder for graphs; then the fallback checks and the paired fresh-process timings,
# then `rocmfix revert`.
# Needs $WHL (default .whl) with libcst-*.whl, mineru/mineru-4.0.12-py3-none-any.whl and
# transformers/ (transformers-5.24.0-py3-none-any.whl and its dependencies, as
# `pip download -d transformers` gives them); results land in $OUT (graphs.json,
# graphs_check.json, graphs.txt). CONFIGS=layout-800,formula-8x384 times only those two.
set -u
W=${WHL:-.whl}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/libcst-*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=100
PY=$(command -v python3)
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())'
MW=$W/mineru/mineru-4.0.12-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/stock "$MW" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile "$MW" \
    || python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages "$MW" \
    || exit 1
TW=$W/transformers
if [ -d "$TW" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/stock \
        "$TW"/transformers-5.24.0-py3-none-any.whl || exit 1
    python3 -m pip install -q --no-index --no-compile --find-links "$TW" transformers==5.24.0 \
        || python3 -m pip install -q --no-index --no-compile --break-system-packages \
            --find-links "$TW" transformers==5.24.0 \
        || exit 1
else  # the machine's own transformers (5.3+ has the model), copied as it ships
    cp -a "$(python3 -c 'import os, transformers; print(os.path.dirname(transformers.__file__))')" \
        /tmp/stock/ || exit 1
fi
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m rocmfix apply --only mineru-ocr-det-graphs --only mineru-ocr-rec-graphs \
    --only mineru-ocr-cls-graphs --only mineru-layout-graphs \
    --only transformers-pp-doclayout-v2-graphs --only transformers-eager-mask-graphs \
    --only mineru-formula-encoder-graphs --python "$PY" 2>&1 | tail -10
[ -n "${SKIP_CHECKS:-}" ] || timeout 120 python3 bench/graphs_gpu.py --check --stock /tmp/stock --patched "$SITE" \
    --out "$OUT" 2>&1 | tail -40
[ -n "${SKIP_CHECKS:-}" ] || timeout 200 python3 bench/graphs_gpu.py --interleave --stock /tmp/stock --patched "$SITE" \
    --out "$OUT" 2>&1 | tail -60
[ -n "${NO_PAIRS:-}" ] || timeout "${LIMIT:-400}" python3 bench/graphs_gpu.py --stock /tmp/stock --patched "$SITE" \
    --out "$OUT" --pairs "${PAIRS:-6}" --reps "${REPS:-30}" ${CONFIGS:+--configs $CONFIGS} \
    2>&1 | tee "$OUT/graphs.txt" | tail -60
python3 -m rocmfix revert --python "$PY" 2>&1 | tail -2
