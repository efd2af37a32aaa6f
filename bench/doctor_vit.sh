#!/bin/bash
# `rocmfix doctor --op vit-attention` end to end on one GPU machine without network (issue 42,
# item 1): rocmfix from this tree, a target environment of the image's torch plus MinerU
# 4.0.12 (--no-deps, from .whl/mineru), doctor for the vision attention only, then what
# `status` and `env` read back from the verdict it stored. Outputs land in $OUT.
#
# Needs: python3 with torch (2.11 + Triton 3.6), typer, rich and packaging; .whl/ carried
# (libcst-*.whl, mineru/mineru-4.0.12-py3-none-any.whl). Bounded: each command under
# `timeout`, about 3 minutes in all.
#   bash bench/doctor_vit.sh
set -u
export PYTHONUNBUFFERED=1 COLUMNS=100
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/doctor-vit}
mkdir -p "$OUT"
# A fresh config folder: the stored verdict printed below is this run's, nothing older.
export XDG_CONFIG_HOME=$(mktemp -d)
{
date -u +"date %Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import libcst' 2>/dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --target /tmp/vit-site .whl/libcst-*.whl || exit 1
export PYTHONPATH=/tmp/vit-site:$PWD
python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name())'
# The target: a venv that sees the image's packages (torch) through a .pth, plus MinerU.
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m venv --without-pip /tmp/vit-env || exit 1
TARGET=/tmp/vit-env/bin/python
ESITE=$($TARGET -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$SITE" > "$ESITE/image-site.pth"
python3 -m pip --python $TARGET install -q --no-deps --no-index --no-compile \
    .whl/mineru/mineru-4.0.12-py3-none-any.whl || exit 1
R="timeout 150 python3 -m rocmfix"
echo "=== doctor --op vit-attention"
s=$SECONDS
$R doctor --python $TARGET --op vit-attention --time-limit 20 > "$OUT/doctor.txt"
echo "doctor rc=$? $((SECONDS-s)) s"
cat "$OUT/doctor.txt"
echo "=== the stored verdict ($XDG_CONFIG_HOME/rocmfix/measured.json)"
cp "$XDG_CONFIG_HOME/rocmfix/measured.json" "$OUT/measured.json" && cat "$OUT/measured.json"
# What status and apply read from that file for the arch it was measured on: status itself
# reads it only for the AMD arch the KFD names (none on NVIDIA), and only where vllm is there.
python3 -c 'import json, sys
from rocmfix import measured
from rocmfix.ops.vit_attention import OP
from rocmfix.patch import TorchInfo
for m in measured.read():
    torch = TorchInfo(m.torch, m.hip, None)
    for scheme in (None, "triton-attn", "sdpa-aotriton", "sdpa-flash"):
        r = measured.reading(OP, torch, archs=frozenset({m.arch}), scheme=scheme)
        print(m.arch, scheme or "best", r.faster, "-", r.reason)'
echo "=== status, as it reads the verdict"
timeout 60 python3 -m rocmfix status --python $TARGET --json > "$OUT/status.json"
echo "status rc=$?"
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for p in d["patches"]:
    if "vit-attention" in p["id"]:
        print(p["id"], p["verdict"], "-", p["reason"])' "$OUT/status.json"
timeout 60 python3 -m rocmfix status --python $TARGET | grep -i -A2 "vit-attention"
echo "=== env"
timeout 60 python3 -m rocmfix env --python $TARGET; echo "env rc=$?"
} 2>&1 | tee "$OUT/log.txt"
