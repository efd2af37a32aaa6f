#!/bin/sh
# Issue 33's graph-mode parts on a lent GPU (bench/compile_gpu.py): DocLayout-YOLO's `gemm`
# gap split into host and kernel time, and the depthwise work's models (dw-*) compiled, with
# the machine's own transformers and mineru 4.0.12 (installed --no-deps) rewritten by
# `rocmfix apply --force` as bench/models_gpu.sh does, then `rocmfix revert`.
#   WHL=$PWD/.whl OUT=$OUT PARTS=doclayout-gemm,dw-det,dw-rec LIMIT=330 sh bench/compile_gpu.sh
# CHECK=1 then runs bench/triton_op_check.py (a small dilated + depthwise model: the kernels in
# Inductor's code, errors, frames, reduce-overhead; DTYPES, default float32), REPS the medians'
# count (30), HOSTPROF=1 cProfiles compiled forwards (TORCH_LOGS=output_code puts Inductor's
# code in compile.txt too). ROCMFIX_TRITON_OP=0 in the environment measures the opaque op instead.
# Needs $WHL with libcst, doclayout_yolo and mineru/mineru-4.0.12-py3-none-any.whl; results
# land in $OUT (compile_gpu.json, compile.txt).
set -u
cd "$(dirname "$0")/.."
W=${WHL:-.whl}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$W"/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=100
PY=$(command -v python3)
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
MW=$W/mineru/mineru-4.0.12-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --no-compile "$MW" \
    || python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages "$MW" \
    || exit 1
IDS="--only transformers-hgnet-v2 --only mineru-ocr-lcnetv4 --only mineru-ocr-hgnetv2"
IDS="$IDS --only mineru-ocr-replkfpn --only mineru-ocr-lightsvtr --only mineru-ocr-db-head"
# shellcheck disable=SC2086
python3 -m rocmfix apply --force --scheme triton $IDS --python "$PY" 2>&1 | tail -8
timeout "${LIMIT:-330}" python3 bench/compile_gpu.py --parts "${PARTS:-doclayout-gemm,dw-det,dw-rec}" \
    --no-frames-for doclayout-gemm --reps "${REPS:-30}" --out "$OUT/compile_gpu.json" \
    ${HOSTPROF:+--host-profile} 2>&1 \
    | grep -v pow_by_natural | tee "$OUT/compile.txt" | tail -60
if [ "${CHECK:-0}" = 1 ]; then
    timeout "${LIMIT_CHECK:-80}" python3 bench/triton_op_check.py --dtypes "${DTYPES:-float32}" \
        --out "$OUT/triton_op_check.json" 2>&1 | grep -v pow_by_natural \
        | tee "$OUT/check.txt" | tail -6
fi
python3 -m rocmfix revert --python "$PY" 2>&1 | tail -2
