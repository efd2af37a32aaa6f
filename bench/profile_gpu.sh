#!/usr/bin/env bash
# rocmfix profile on a GPU (issue 31). Run from the repo root on the H100 host:
#   bash bench/profile_gpu.sh
# Needs in the interpreter ($PY, default python3): torch, transformers (5.x), and the
# doclayout-yolo 0.0.4 wheel's package importable (pip install --no-deps doclayout_yolo-0.0.4
# plus its runtime needs: the test suite's tests/releases.importable does the same), no hub.
# Shows: with cuDNN off (native convs stand in for a vendor library without a fast kernel)
# the patch embed (transformers-qwen2-vl) and the dilated convs (doclayout-dilated-conv) are
# flagged with those fixes ("wanted: yes"), and every other flag with its measured reason;
# with cuDNN on, every flag with its reason; DocLayout-YOLO with cudnn.benchmark on and no
# warm-up skipped (first-call cost, fix: torch.backends.cudnn.benchmark = False); then
# PP-DocLayoutV2 (if this transformers has it): its depthwise convs with their HGNetV2 lines and
# patch; and the profiled/unprofiled wall time of the same script. All seven runs take more than
# 10 minutes on an H100 (the cuDNN-off Qwen run did not end in 200 s); RUNS="qwen-0 layout-1"
# picks some (tags: doclayout-0 doclayout-1 qwen-0 qwen-1 doclayout-1-bench layout-0 layout-1).
set -euo pipefail
PY=${PY:-python3}
OUT=${OUT:-/tmp/rocmfix-profile-gpu}
mkdir -p "$OUT"
cat > "$OUT/models.py" <<'PYEOF'
import importlib, os, sys, time
from pathlib import Path
import torch
torch.backends.cudnn.enabled = os.environ.get("CUDNN", "1") == "1"
torch.backends.cudnn.benchmark = os.environ.get("BENCH", "0") == "1"
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
if which == "layout":
    from transformers.models.pp_doclayout_v2 import (
        PPDocLayoutV2Config, PPDocLayoutV2ForObjectDetection)
    cfg = PPDocLayoutV2Config()  # defaults, random weights
    cfg.class_thresholds = [0.5] * cfg.num_labels
    cfg.class_order = list(range(cfg.num_labels))
    layout = PPDocLayoutV2ForObjectDetection(cfg).eval().to(dev)
    image = torch.randn(1, 3, 800, 800, device=dev)
    runs.append(lambda: layout(pixel_values=image))
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
one() {  # model cudnn bench skip
  local model=$1 cudnn=$2 bench=$3 skip=$4 tag="$1-$2$([ "$3" = 1 ] && echo -bench)"
  case " ${RUNS:-$tag} " in *" $tag "*) ;; *) return 0 ;; esac
  export MODEL=$model CUDNN=$cudnn BENCH=$bench
  echo "== $tag: cuDNN enabled=$cudnn benchmark=$bench, unprofiled"
  timeout 120 "$PY" "$OUT/models.py" 2>&1 | tail -2 | tee "$OUT/plain-$tag.txt" || true
  echo "== $tag: profiled"
  rm -rf "$OUT/out-$tag"
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 300 "$PY" -m rocmfix profile --top 12 \
    --skip-calls "$skip" --json --out "$OUT/out-$tag" -- "$PY" "$OUT/models.py" \
    > "$OUT/profiled-$tag.json" 2> "$OUT/report-$tag.txt" || true
  tail -3 "$OUT/report-$tag.txt"
  grep -h '^wall' "$OUT/profiled-$tag.json" | sed "s/^/profiled $tag: /" || true
  # Kept as it goes: a run cut short by a time limit still leaves the ones before it.
  { echo "=== $tag"; cat "$OUT/report-$tag.txt"; } >> "$OUT/reports.txt"
  "$PY" - "$OUT/profiled-$tag.json" "$cudnn" "$model" <<'PYEOF' || true
import json, sys
text = open(sys.argv[1]).read()
doc = json.loads(text[text.index('{\n  "schema"'):])
want = {"qwen": {("conv3d", "transformers-qwen2-vl")},
        "doclayout": {("conv2d", "doclayout-dilated-conv")}}.get(sys.argv[3], set())
flagged = set()
for r in doc["ops"]:
    fix = r["fix"] or {}
    if r["flagged"]:
        flagged.add((r["op"], fix.get("patch_id")))
        print(f"flagged {r['op']} {r['shapes'][0]} {r['reason']} -> {fix.get('kind')} "
              f"{fix.get('command') or ''}")
    if r["conv"] and r["conv"]["groups"] > 1:
        print(f"grouped {r['shapes'][:2]} {r['source']} patch={r['patch']} best={r['best']} "
              f"x{r['speedup'] or 0:.2f}")
if sys.argv[2] == "0" and want:
    print("wanted:", "yes" if want <= flagged else "NO", sorted(want, key=str))
PYEOF
  rm -rf "$OUT/out-$tag"  # the traces: large, and many files for the transfer back
}
one doclayout 0 0 2
one doclayout 1 0 2
one qwen 0 0 2
one qwen 1 0 2
one doclayout 1 1 0
one layout 0 0 1
one layout 1 0 1
echo "overhead: compare 'wall' in $OUT/plain-*.txt with the 'wall' line the profiled run printed"
grep -H wall "$OUT"/plain-*.txt "$OUT"/profiled-*.json | sed 's/:.*"wall/: wall/' || true
# One file of JSON documents, for a transfer that takes few files.
for f in "$OUT"/profiled-*.json; do echo "=== $f"; cat "$f"; done > "$OUT/profiled.txt"
rm -rf "$OUT"/report-*.txt "$OUT"/profiled-*.json "$OUT"/out-* "$OUT"/plain-*.txt
