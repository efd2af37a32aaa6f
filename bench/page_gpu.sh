#!/bin/sh
# Issue 41's page benchmark on a lent GPU (bench/page_gpu.py): a page through MinerU 4.0.12's
# own predictors (layout, formula encoder and decoder, det, cls, rec), stock files against the
# files `rocmfix apply` rewrote for graphs, in alternating fresh processes, 4 passes a process.
# mineru 4.0.12 goes in twice with --no-deps: as it ships (/tmp/stock, beside a copy of the
# machine's transformers) and into the machine's python, where `rocmfix apply` applies the
# seven graph patches; then the pairs, a bounded memory run, and `rocmfix revert`. No network.
# About 5 minutes on an H200 (PAIRS=2, 4 passes a process, each part under its own time
# limit: 290 s with NO_MEMORY=1, 2026-11-28; pass 1 alone takes 23-33 s a process there).
# Needs $WHL (default .whl) with libcst-*.whl, mineru/mineru-4.0.12-py3-none-any.whl and, in
# $WHL/page/, wheels of what the page path imports beyond torch, torchvision, transformers,
# tokenizers and accelerate where the machine's python lacks it (every one of them can be
# there: the loop below installs only the missing ones), made where there is a network with
# (3.X: the machine's python, 3.11 or later: docvortex's wheel is cp311-abi3)
#   pip download --no-deps --only-binary=:all: --python-version 3.X \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl/page pypdfium2 fpdf2 fonttools defusedxml \
#       docvortex shapely pyclipper loguru tqdm pydantic pydantic-core annotated-types \
#       typing-inspection numpy pillow pyyaml ftfy wcwidth
# fpdf2 (with fonttools, defusedxml) writes the PDFs, pypdfium2 reads and renders them;
# MinerU's predictors import docvortex (its image and geometry modules; it imports pydantic),
# shapely, pyclipper, loguru, tqdm, numpy, pillow, pyyaml; its formula post-processing ftfy
# (and wcwidth).
# Results land in $OUT (page.json, page_memory.json, page.txt).
# BUCKET=1: the patched side's rec and det graphs patches with the bucket scheme (`rocmfix apply
# --scheme bucket`: rec's batch width padded up to a multiple of 320, det's crop both sides,
# docs/performance-graphs.md):
#   WHL=/work/main/.whl OUT=/tmp/out BUCKET=1 bash bench/page_gpu.sh
set -u
W=${WHL:-.whl}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/libcst-*.whl \
    || exit 1
# Only what the machine's python lacks: a second numpy or typing_extensions on the path first
# would shadow the ones torch came with.
for pair in numpy:numpy PIL:pillow yaml:pyyaml fpdf:fpdf2 fontTools:fonttools \
    defusedxml:defusedxml pypdfium2:pypdfium2 docvortex:docvortex shapely:shapely \
    pyclipper:pyclipper loguru:loguru tqdm:tqdm pydantic:pydantic pydantic_core:pydantic-core \
    annotated_types:annotated-types typing_inspection:typing-inspection ftfy:ftfy \
    wcwidth:wcwidth; do
    PYTHONPATH=/tmp/site python3 -c "import ${pair%%:*}" 2>/dev/null && continue
    python3 -m pip install -q --no-index --no-deps --no-compile --find-links "$W/page" \
        --target /tmp/site "${pair#*:}" || { echo "no wheel for ${pair#*:} in $W/page"; exit 1; }
done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=100
PY=$(command -v python3)
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())'
MW=$W/mineru/mineru-4.0.12-py3-none-any.whl
rm -rf /tmp/stock  # a run before this one left its copies there
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/stock "$MW" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile "$MW" \
    || python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages "$MW" \
    || exit 1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -c 'import transformers as t; print("transformers", t.__version__)'
cp -a "$(python3 -c 'import os, transformers; print(os.path.dirname(transformers.__file__))')" \
    /tmp/stock/ || exit 1
ONLY=""
for id in mineru-ocr-det mineru-ocr-rec mineru-ocr-cls mineru-layout mineru-formula-encoder \
    transformers-pp-doclayout-v2 transformers-eager-mask; do ONLY="$ONLY --only $id-graphs"; done
# bench/graphs_session.sh sources this file for the installs above and $ONLY.
if [ -n "${INSTALL_ONLY:-}" ]; then return 0; fi
python3 -m rocmfix apply $ONLY ${BUCKET:+--scheme bucket} --python "$PY" 2>&1 | tail -10
grep -c rocmfix_width_bucket "$SITE/mineru/model/_internal/pytorchocr/infer/predict_rec.py" \
    | sed 's/^/rec calls given a width bucket: /'
grep -c rocmfix_size_bucket "$SITE/mineru/model/_internal/pytorchocr/infer/predict_det.py" \
    | sed 's/^/det calls given a size bucket: /'
echo "== pages, stock against patched, $(date -u +%T)"
timeout "${LIMIT:-420}" python3 bench/page_gpu.py --stock /tmp/stock --patched "$SITE" \
    --out "$OUT" --pairs "${PAIRS:-2}" --passes "${PASSES:-4}" --pages-each "${PAGES_EACH:-1}" \
    --seconds "${SECONDS_PAIRS:-250}" --process-seconds "${PROCESS_SECONDS:-75}" \
    --work /tmp/page_work 2>&1 | grep --line-buffered -v -e 'it/s]' -e Predict -e DEBUG \
    | tee "$OUT/page.txt"
echo "== graph memory over pages, $(date -u +%T)"
[ -n "${NO_MEMORY:-}" ] || timeout "${MEMORY_LIMIT:-40}" python3 bench/page_gpu.py --memory \
    --patched "$SITE" --out "$OUT" --pages "${PAGES:-200}" --seconds 20 \
    --work /tmp/page_work 2>&1 | grep --line-buffered -v -e 'it/s]' -e Predict -e DEBUG \
    | tail -30
echo "== done, $(date -u +%T)"
python3 -m rocmfix revert --python "$PY" 2>&1 | tail -2
