#!/bin/sh
# Issue 41's eager target on a lent GPU (bench/eager_pairs.py): copies of the machine's
# transformers and of mineru 4.0.12 (installed --no-deps) kept as they ship in /tmp/stock,
# then `rocmfix apply --force` rewrites the machine's own (the kernel routes, no graphs), the
# paired fresh-process runs, then `rocmfix revert`.
# Needs $WHL (default .whl) with libcst-*.whl and mineru/mineru-4.0.12-py3-none-any.whl;
# results land in $OUT/ROUTE (eager_pairs.json, eager_pairs.txt). PAIRS (10), REPS (40), MODELS,
# ROUTES (below).
set -u
W=${WHL:-.whl}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/libcst-*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=100
PY=$(command -v python3)
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
MW=$W/mineru/mineru-4.0.12-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --no-compile "$MW" \
    || python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages "$MW" \
    || exit 1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
TF=$(python3 -c 'import transformers, os; print(os.path.dirname(transformers.__file__))')
mkdir -p /tmp/stock && cp -a "$SITE/mineru" "$TF" /tmp/stock/
ALL="transformers-hgnet-v2 mineru-ocr-lcnetv4 mineru-ocr-hgnetv2 mineru-ocr-replkfpn"
ALL="$ALL mineru-ocr-lightsvtr mineru-ocr-db-head"
# ROUTES: which route each run applies alone, e.g. "all mineru-ocr-lcnetv4 mineru-ocr-db-head"
# ("all": every one of $ALL); the results of each land in $OUT/ROUTE.
for route in ${ROUTES:-all}; do
    ids=$route
    [ "$route" = all ] && ids=$ALL
    echo "== $route"
    # The triton scheme where the routes offer it (mineru-ocr-db-head offers linear only).
    # shellcheck disable=SC2086
    python3 -m rocmfix apply --force --scheme triton $(printf -- '--only %s ' $ids) \
        --python "$PY" 2>&1 | tail -3 | grep -q "offer" \
        && python3 -m rocmfix apply --force $(printf -- '--only %s ' $ids) --python "$PY" 2>&1 \
        | tail -3
    mkdir -p "$OUT/$route"
    timeout "${LIMIT:-560}" python3 bench/eager_pairs.py --stock /tmp/stock --out "$OUT/$route" \
        --pairs "${PAIRS:-10}" --reps "${REPS:-40}" --models "${MODELS:-det,rec,layout,formula}" \
        2>&1 | tee "$OUT/$route/eager_pairs.txt" | tail -6
    python3 -m rocmfix revert --python "$PY" 2>&1 | tail -1
done
