"""DocLayout-YOLO through the file `rocmfix apply` rewrote, on a GPU: the patched forward
against the stock route of the same file, in one process.

    rocmfix apply --force --only doclayout-dilated-conv   # --force: a CUDA torch needs none
    python bench/doclayout_applied.py [--batch 2] [--size 1280 928]
    rocmfix revert

The rewritten ``dilated_conv`` takes the dropped kernel while the module's
``_rocmfix_dilated_conv2d`` is set and the stock line when it is None, so one model gives both;
IEEE fp32 (TF32 off), so the difference is the kernel's, not TF32's. Exits 1 past 1e-5.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, nargs=2, default=(1280, 928))
    args = parser.parse_args()

    import doclayout_yolo
    from doclayout_yolo.nn.modules import g2l_crm
    from doclayout_yolo.nn.tasks import YOLOv10DetectionModel

    kernel = getattr(g2l_crm, "_rocmfix_dilated_conv2d", None)
    if kernel is None:
        print(f"{g2l_crm.__file__} is not patched: run `rocmfix apply` first", file=sys.stderr)
        return 2
    cfg = f"{doclayout_yolo.__path__[0]}/cfg/models/v10/yolov10m-doclayout.yaml"
    torch.manual_seed(0)
    model = YOLOv10DetectionModel(cfg, nc=10, verbose=False)
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # statistics the BatchNorm fold must carry
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    model = model.eval().cuda()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.rand(args.batch, 3, *args.size, device="cuda")
    with torch.inference_mode():
        got = model(x)["one2one"][0]
        g2l_crm._rocmfix_dilated_conv2d = None
        try:
            want = model(x)["one2one"][0]
        finally:
            g2l_crm._rocmfix_dilated_conv2d = kernel
    rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
    print(f"{torch.cuda.get_device_name()}: patched vs stock route, IEEE fp32, batch "
          f"{args.batch} at {args.size[0]}x{args.size[1]}: relative error {rel:.2e}")  # fmt: skip
    return 0 if rel < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
