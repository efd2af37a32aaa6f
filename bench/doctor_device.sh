#!/bin/bash
# `rocmfix doctor` and `rocmfix tune` end to end on one GPU machine without network, as in
# docs/performance-doctor.md: a target environment holding vllm 0.11.0's patch-embed files
# (with its real METADATA/RECORD) and DocLayout-YOLO 0.0.4, `rocmfix apply --force`, doctor,
# tune, a fresh-process check that the dropped-in kernels read the tuned file, doctor again,
# tune --reset, and a simulated MIOpen search that the time limit must cut short.
#
# Prepare $DEV (default .doctor-dev, git-ignored) where there is network:
#   $DEV/site/        vllm/__init__.py, vllm/model_executor/models/qwen{2,2_5,3}_vl.py and
#                     vllm-0.11.0.dist-info/ (tests/releases.py partial_install lays this out)
#   $DEV/*.whl        doclayout_yolo-0.0.4 and libcst (for the GPU machine's Python)
# then run `bash bench/doctor_device.sh` there with $OUT set; the outputs land in $OUT.
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
cd "$(dirname "$0")/.."
DEV=${DEV:-.doctor-dev}
{
date -u +"date %Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $DEV/libcst-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
PY=$(python3 -c 'import sys; print(sys.executable)')
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "triton", triton.__version__, torch.cuda.get_device_name())'
if touch "$SITE/.rocmfix-w" 2>/dev/null; then
    rm "$SITE/.rocmfix-w"; TARGET=$PY
    python3 -m pip install -q --no-deps --no-index --no-compile $DEV/doclayout_yolo-0.0.4-py3-none-any.whl
else
    python3 -m venv --without-pip /tmp/env
    ESITE=$(/tmp/env/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$SITE" > "$ESITE/image-site.pth"; SITE=$ESITE; TARGET=/tmp/env/bin/python
    python3 -m pip --python $TARGET install -q --no-deps --no-index --no-compile $DEV/doclayout_yolo-0.0.4-py3-none-any.whl
fi
cp -r $DEV/site/* "$SITE/"
echo "target $TARGET site $SITE"
R="python3 -m rocmfix"
$R status --python $TARGET
$R apply --force --python $TARGET; echo "apply rc=$?"
echo "=== doctor (shipped configs)"
s=$SECONDS; $R doctor --python $TARGET > $OUT/doctor.txt; echo "doctor rc=$? $((SECONDS-s)) s"
cat $OUT/doctor.txt
echo "=== tune"
s=$SECONDS; $R tune --python $TARGET --budget 150 --json > $OUT/tune.json; echo "tune rc=$? $((SECONDS-s)) s"
python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
for k in d["kernels"]:
    print(k["id"], k["arch"], k["key"], "shipped", k["shipped"]["ms"], "fastest", k["fastest"]["ms"], "tuned", k["tuned"], "verified", k["verified"], k["chosen"]["config"])
    for c in k["candidates"]: print("   ", c["role"], c["status"], c["ms"], c["rel_err"], c["config"])' $OUT/tune.json
cp "$(python3 -c "from rocmfix.tuned_file import tuned_path; print(tuned_path())")" $OUT/tuned.json
echo "=== fresh process: the dropped-in kernels resolve the tuned file"
$TARGET bench/tuned_pickup.py "$SITE" > $OUT/pickup.txt; echo "pickup rc=$?"; tail -1 $OUT/pickup.txt
echo "=== doctor after tune"
s=$SECONDS; $R doctor --python $TARGET --json > $OUT/doctor-after.json; echo "doctor rc=$? $((SECONDS-s)) s"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(o["op"], r["id"], m["impl"], m["status"], m["ms"], m["speedup"], m["config"]) for o in d["ops"] for r in o["cases"] for m in r["schemes"] if m["impl"]=="gemm"]' $OUT/doctor-after.json
echo "=== reset"
$R tune --reset; $TARGET bench/tuned_pickup.py "$SITE" --shipped | tail -1
echo "=== doctor native time limit on the GPU (simulated MIOpen search)"
s=$SECONDS; ROCMFIX_WORKER_TEST='{"sleep": {"patch-embed/native": 60}}' $R doctor --python $TARGET --op patch-embed --time-limit 5 2>/dev/null | grep -E "F.conv3d|patch embed|recommend|needed"; echo "rc=$? $((SECONDS-s)) s"
} 2>&1 | tee $OUT/log.txt
