"""Proof that the kernels rocmfix dropped into an environment read ``rocmfix tune``'s file.

In a fresh process (run it with the target's interpreter), load the kernel modules that
``rocmfix apply`` dropped into vllm and DocLayout-YOLO, by file path (importing vllm itself
would need its compiled parts), resolve their configs on this GPU the way they do at their
first call, and compare them with the tuned file's entries for this GPU.

    python bench/tuned_pickup.py SITE_PACKAGES            # expects the tuned entries
    python bench/tuned_pickup.py SITE_PACKAGES --shipped  # after `tune --reset`

Prints one JSON document and PASS or FAIL; exits 1 on FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import torch

DROPS = {
    "patch_embed": "vllm/model_executor/models/qwen2_vl_vision_kernels.py",
    "dilated_conv": "doclayout_yolo/nn/modules/g2l_crm_triton.py",
}
SHAPES = {"c96_k5": (96, 5), "c192_k3": (192, 3)}


def load(path: Path, name: str) -> ModuleType:
    return _load.dropped(path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("site", type=Path)
    ap.add_argument("--shipped", action="store_true", help="expect the shipped configs")
    args = ap.parse_args()
    pe = load(args.site / DROPS["patch_embed"], "_pickup_patch_embed")
    dc = load(args.site / DROPS["dilated_conv"], "_pickup_dilated_conv")
    path = Path(pe.tuned_file_path())
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    kernels = data.get("kernels", {})
    device = torch.device("cuda")
    cases = [("patch_embed_gemm", pe, lambda m: m.resolve_config(device), None)]
    for name, (c, k) in SHAPES.items():
        key = f"{name}_{dc.precision_class(torch.float32, dc.device_arch(device))}"
        cases.append(
            ("dilated_conv", dc, lambda m, c=c, k=k: m.resolve_config(device, c, c, k), key)
        )
    report: dict[str, Any] = {"tuned_file": str(path), "exists": path.exists(), "checks": []}
    ok = True
    for kernel, module, resolve, key in cases:
        arch = module.device_arch(device)
        # The shipped config: the same module with no tuned file to read.
        saved = os.environ.get("ROCMFIX_TUNED_FILE")
        os.environ["ROCMFIX_TUNED_FILE"] = str(path.with_name("no-such-file.json"))
        module.clear_config_cache()
        shipped = resolve(module)
        os.environ["ROCMFIX_TUNED_FILE"] = saved if saved is not None else str(path)
        module.clear_config_cache()
        resolved = resolve(module)
        entry = kernels.get(kernel, {}).get(arch)
        stored = entry.get(key) if key is not None and isinstance(entry, dict) else entry
        expected = {**shipped, **(stored or {})}
        match = resolved == expected and (stored is None if args.shipped else True)
        ok &= match
        report["checks"].append(
            {
                "kernel": kernel,
                "arch": arch,
                "key": key,
                "in_file": stored is not None,
                "tuned_differs_from_shipped": resolved != shipped,
                "resolved": resolved,
                "match": match,
            }
        )
    print(json.dumps(report, indent=1))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
