#!/bin/sh
# Issue 14/15 on the lent GPU: the patched transformers vision tower against stock (real
# `rocmfix apply` on the machine's own transformers), the sm_90 TF32 dilated-conv candidates
# under the machine's Triton, and `rocmfix kernels` with that Triton. Results under $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
py=$(command -v python3)
python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())'
python3 -m rocmfix status --only transformers-qwen2-vl --python "$py"
python3 bench/vision_tower.py --phase stock --out "$OUT" || exit 1
python3 -m rocmfix apply --scheme gemm --only transformers-qwen2-vl --force --python "$py" || exit 1
python3 bench/vision_tower.py --phase patched --out "$OUT"
python3 -m rocmfix revert --python "$py"
python3 -m rocmfix kernels --arch sm_90 --python "$py" --json > "$OUT/kernels_sm90.json"
python3 -m rocmfix kernels --arch sm_90 --python "$py" | tail -5
python3 bench/dilated_batches.py 2>&1 | tail -30
