#!/bin/sh
# Issue 41's GPU figures still owed, in one bounded batch (about 7 minutes on an H100):
#   0. `rocmfix doctor`'s graph check (caps in force, the memory each graph held);
#   1. the whole PP-DocLayoutV2 detector replayed against stock (the machine's transformers,
#      5.17.0 there: `transformers-eager-mask-graphs` takes out its mask helper's host copy);
#   2. PP-FormulaNet_plus-M's encoder replayed against stock;
#   3. 200 synthetic pages through det and rec: graph memory after every page (--memory);
#   4. one pair of the page benchmark (MinerU's own layout, formula, det, cls and rec
#      predictors), stock against patched, 4 passes a process (bench/page_gpu.sh runs more);
# then `rocmfix revert`. Each part has its own time limit and prints as it goes.
# mineru 4.0.12 goes in twice with --no-deps: as it ships (/tmp/stock, beside a copy of the
# machine's transformers) and into the machine's python, where `rocmfix apply` rewrites the
# graph targets. Needs $WHL (default .whl): libcst-*.whl, mineru/mineru-4.0.12-py3-none-any.whl
# and page/ (bench/page_gpu.sh's header says what it holds). No network.
# Results land in $OUT: layout/graphs.json, formula/graphs.json, graphs_memory.json,
# page.json.
set -u
W=${WHL:-.whl}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/layout" "$OUT/formula"
INSTALL_ONLY=1
. bench/page_gpu.sh
python3 -m rocmfix apply $ONLY --python "$PY" 2>&1 | tail -10
G="python3 bench/graphs_gpu.py --stock /tmp/stock --patched $SITE --reps 20"
echo "== 0. rocmfix doctor's Graphs line, $(date -u +%T)"
timeout 60 python3 -m rocmfix doctor --json --op conv-transpose --python "$PY" 2>/dev/null \
    | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["graphs"]))'
echo "== 1. layout, $(date -u +%T)"
timeout 130 $G --out "$OUT/layout" --configs layout-800 --pairs 3 --seconds 85 2>&1
echo "== 2. formula encoder, $(date -u +%T)"
timeout 90 $G --out "$OUT/formula" --configs formula-8x384 --pairs 3 --seconds 55 2>&1
echo "== 3. graph memory, 200 synthetic pages, $(date -u +%T)"
timeout 50 $G --out "$OUT" --memory --pages 200 --seconds 35 2>&1
echo "== 4. pages, stock against patched, $(date -u +%T)"
timeout 130 python3 bench/page_gpu.py --stock /tmp/stock --patched "$SITE" --out "$OUT" \
    --pairs 1 --process-seconds 30 --work /tmp/page_work 2>&1 \
    | grep --line-buffered -v -e 'it/s]' -e 'Predict' -e 'DEBUG'
echo "== done, $(date -u +%T)"
python3 -m rocmfix revert --python "$PY" 2>&1 | tail -2
