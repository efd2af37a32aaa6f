#!/usr/bin/env bash
# rocmfix profile on a GPU (issue 31). Run from the repo root on the H100 host:
#   bash bench/profile_gpu.sh
# Needs in the interpreter ($PY, default python3): torch, transformers (5.x), and the
# doclayout-yolo 0.0.4 wheel's package importable (pip install --no-deps doclayout_yolo-0.0.4
# plus its runtime needs: the test suite's tests/releases.importable does the same), no hub.
# Shows: with cuDNN off (native convs stand in for a vendor library without a fast kernel)
# the patch embed (transformers-qwen2-vl) and the dilated convs (doclayout-dilated-conv) are
# flagged with those fixes and nothing else is; with cuDNN on, nothing is flagged; and the
# profiled/unprofiled wall time of the same script.
set -euo pipefail
PY=${PY:-python3}
OUT=${OUT:-/tmp/rocmfix-profile-gpu}
mkdir -p "$OUT"
cat > "$OUT/models.py" <<'PYEOF'
import importlib, os, sys, time
from pathlib import Path
import torch
torch.backends.cudnn.enabled = os.environ.get("CUDNN", "1") == "1"
dev = "cuda"
which = os.environ.get("MODEL", "both")
runs = []
if which in ("doclayout", "both"):
    yolo = importlib.import_module("doclayout_yolo")
    tasks = importlib.import_module("doclayout_yolo.nn.tasks")
    cfg = Path(yolo.__file__).parent / "cfg/models/v10/yolov10m-doclayout.yaml"
    model = tasks.YOLOv10DetectionModel(str(cfg), nc=10, verbose=False).eval().to(dev)
    page = torch.randn(1, 3, 1024, 736, device=dev)
    runs.append(lambda: model(page))
if which in ("qwen", "both"):
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VisionTransformerPretrainedModel,
    )
    # MinerU2.5's tower geometry, 4 blocks (the patch embed is the op in question), bf16.
    config = Qwen2VLVisionConfig(depth=4, embed_dim=1280, hidden_size=1536, num_heads=16,
                                 in_channels=3, patch_size=14, spatial_merge_size=2,
                                 temporal_patch_size=2)
    tower = Qwen2VisionTransformerPretrainedModel._from_config(config).eval().to(
        dev, torch.bfloat16)
    grid = torch.tensor([[1, 74, 74]], device=dev)  # M = 5476 patches
    pixels = torch.randn(5476, 3 * 2 * 14 * 14, device=dev, dtype=torch.bfloat16)
    runs.append(lambda: tower(pixels, grid_thw=grid))
start = time.perf_counter()
with torch.no_grad():
    for _ in range(5):
        for run in runs:
            run()
torch.cuda.synchronize()
print(f"wall {time.perf_counter() - start:.3f} s", flush=True)
PYEOF
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"
for model in doclayout qwen; do
for cudnn in 0 1; do
  export MODEL=$model
  echo "== cuDNN enabled=$cudnn, unprofiled"
  CUDNN=$cudnn "$PY" "$OUT/models.py" | tee "$OUT/plain-$model-$cudnn.txt"
  echo "== cuDNN enabled=$cudnn, profiled"
  CUDNN=$cudnn PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m rocmfix profile --top 12 \
    --skip-calls 2 --json --out "$OUT/out-$model-$cudnn" -- "$PY" "$OUT/models.py" \
    > "$OUT/profiled-$model-$cudnn.json" 2> "$OUT/report-$model-$cudnn.txt" || true
  tail -3 "$OUT/report-$model-$cudnn.txt"
  "$PY" - "$OUT/profiled-$model-$cudnn.json" "$cudnn" "$model" <<'PYEOF'
import json, sys
text = open(sys.argv[1]).read()
doc = json.loads(text[text.index('{\n  "schema"'):])
flagged = {(r["op"], (r["fix"] or {}).get("patch_id")) for r in doc["ops"] if r["flagged"]}
print("flagged:", sorted(flagged, key=str))
want = {"qwen": {("conv3d", "transformers-qwen2-vl")},
        "doclayout": {("conv2d", "doclayout-dilated-conv")}}[sys.argv[3]]
ok = flagged == want if sys.argv[2] == "0" else not flagged
print("model", sys.argv[3], "cudnn", sys.argv[2])
print("EXPECTED" if ok else "UNEXPECTED")
PYEOF
done
done
echo "overhead: compare 'wall' in $OUT/plain-*.txt with the 'wall' line the profiled run printed"
grep -H wall "$OUT"/plain-*.txt "$OUT"/profiled-*.json || true
# One file of reports and one of JSON documents, for a transfer that takes few files.
for f in "$OUT"/report-*.txt; do echo "=== $f"; cat "$f"; done > "$OUT/reports.txt"
for f in "$OUT"/profiled-*.json; do echo "=== $f"; cat "$f"; done > "$OUT/profiled.txt"
rm -rf "$OUT"/report-*.txt "$OUT"/profiled-*.json "$OUT"/out-* "$OUT"/plain-*.txt
