#!/bin/bash
# Issue 29's shared template plumbing, before against after, in one GPU session: the eager
# per-call host cost (bench/eager_host.py, alternating rounds) and the dilated kernels' GPU
# times (bench/dilated_conv.py's main table), each run from two checkouts on the same card
# with one shared Triton cache.
#   bash bench/plumbing_compare.sh BEFORE_TREE AFTER_TREE
# Needs .whl/ (libcst) in BEFORE_TREE for the GPU's Python, as bench/gpu_session.sh. Logs go
# to /tmp/plumbing; $OUT gets one file, compare.md (also printed): the device tool returns a
# few files only.
set -u
BEFORE=$(cd "$1" && pwd)
AFTER=$(cd "$2" && pwd)
OUT=${OUT:-/tmp/out}
LOGS=/tmp/plumbing
mkdir -p "$OUT" "$LOGS"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$BEFORE"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 COLUMNS=100
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
run() {  # run NAME TREE SECONDS COMMAND...: one bench from one tree, its files in $LOGS/NAME
    local name=$1 tree=$2 limit=$3
    shift 3
    mkdir -p "$LOGS/$name"
    (cd "$tree" && OUT="$LOGS/$name" timeout "$limit" "$@") >"$LOGS/$name/log.txt" 2>&1
    echo "$name: rc $?"
}
for round in 1 2; do
    run "eager_before_$round" "$BEFORE" 60 python3 bench/eager_host.py --bursts 15 --calls 50
    run "eager_after_$round" "$AFTER" 60 python3 bench/eager_host.py --bursts 15 --calls 50
done
# The main table is printed row by row before the script's later sections.
run dilated_before "$BEFORE" 60 python3 bench/dilated_conv.py --out "$LOGS/dilated_before"
run dilated_after "$AFTER" 60 python3 bench/dilated_conv.py --out "$LOGS/dilated_after"
python3 - "$LOGS" <<'PY' | tee "$OUT/compare.md"
import json, statistics, sys
from pathlib import Path
logs = Path(sys.argv[1])
def eager(side):
    rows = {}
    for f in sorted(logs.glob(f"eager_{side}_*/eager_host.json")):
        for r in json.loads(f.read_text())["rows"]:
            rows.setdefault((r["group"], r["label"]), []).append((r["host_us"], r["wall_us"]))
    return {k: [statistics.median(x) for x in zip(*v)] for k, v in rows.items()}
b, a = eager("before"), eager("after")
print("| case | call | host before | host after | wall before | wall after |")
print("|---|---|---:|---:|---:|---:|")
for k in b:
    if k in a:
        print(f"| {k[0]} | {k[1]} | {b[k][0]:.1f} | {a[k][0]:.1f} | {b[k][1]:.1f} | {a[k][1]:.1f} |")
def table(side):
    rows = {}
    for line in (logs / f"dilated_{side}" / "log.txt").read_text().splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ("tf32", "ieee", "bf16") and len(cells) > 11:
            rows[tuple(cells[:4])] = (float(cells[6]), float(cells[11]))
    return rows
b, a = table("before"), table("after")
print("\n| mode | shape | batch | d | Triton graph before | after | do_bench before | after |")
print("|---|---|---|---|---:|---:|---:|---:|")
for k in b:
    if k in a and k[3] != "1":
        print(f"| {' | '.join(k)} | {b[k][0]} | {a[k][0]} | {b[k][1]} | {a[k][1]} |")
PY
date -u
