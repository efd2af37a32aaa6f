#!/bin/bash
# Issue 29's shared template plumbing, before against after, in one GPU session: the eager
# per-call host cost (bench/eager_host.py) and the kernels' GPU times (bench/dilated_conv.py,
# bench/patch_embed.py --quick), each run from two checkouts in the same process order on the
# same card, alternating, with one shared Triton cache.
#   bash bench/plumbing_compare.sh BEFORE_TREE AFTER_TREE
# Needs .whl/ (libcst) for the GPU's Python, as bench/gpu_session.sh; results land in $OUT.
set -u
BEFORE=$(cd "$1" && pwd)
AFTER=$(cd "$2" && pwd)
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$BEFORE"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 COLUMNS=100
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
run() {  # run NAME TREE SECONDS COMMAND...: one bench from one tree, its output under $OUT/NAME
    local name=$1 tree=$2 limit=$3
    shift 3
    mkdir -p "$OUT/$name"
    (cd "$tree" && OUT="$OUT/$name" timeout "$limit" "$@") >"$OUT/$name/log.txt" 2>&1
    echo "$name: rc $? $(tail -c 300 "$OUT/$name/log.txt" | tail -1)"
}
for round in 1 2; do
    run "eager_before_$round" "$BEFORE" 60 python3 bench/eager_host.py --bursts 15 --calls 50
    run "eager_after_$round" "$AFTER" 60 python3 bench/eager_host.py --bursts 15 --calls 50
done
run dilated_before "$BEFORE" 60 python3 bench/dilated_conv.py --out "$OUT/dilated_before"
run dilated_after "$AFTER" 60 python3 bench/dilated_conv.py --out "$OUT/dilated_after"
run patch_before "$BEFORE" 35 python3 bench/patch_embed.py --quick --out "$OUT/patch_before"
run patch_after "$AFTER" 35 python3 bench/patch_embed.py --quick --out "$OUT/patch_after"
date -u
