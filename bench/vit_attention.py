"""The VLM vision tower's attention at MinerU2.5's shapes (issue 42, item 1), on a GPU.

    python bench/vit_attention.py [--rounds 7] [--depth 32] [--out FILE.json]

Part 1, the attention alone: q, k, v [1, S, 16, 80] bf16 at the shapes ``rocmfix doctor``
measures (rocmfix/ops/vit_attention.py: a 1036x1036 page, 5476 tokens, and five block crops
in one batch split by cu_seqlens), through every backend this torch has, each called the way
vLLM's TORCH_SDPA wrapper calls SDPA (one call per image): torch's own choice, and SDPA's
math, efficient, flash and cuDNN kernels forced with ``sdpa_kernel``; flex_attention compiled
(a Triton kernel, one call for the batch, a document mask); vLLM's TRITON_ATTN kernel where
vLLM is installed. Timed in interleaved rounds (every backend once a round), the median and
the spread per backend; each output's error against fp32 attention. On NVIDIA, SDPA's math
path against its fused ones stands in for ROCm's gap on RDNA (math unless
TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1).

Part 2, where transformers is installed: a Qwen2-VL vision tower with MinerU2.5's dimensions,
built from its config with random weights (seed 0, no hub), run on one page's patches with
its attention switched (eager, SDPA's own choice, SDPA forced to math, to flash, to
efficient): each output against the fp32 eager tower, and whether it is within bf16's
tolerance. Part 3: a tiny whole Qwen2-VL (random weights, the tower's heads of 80)
generating greedily from one image with each switch: the same tokens as eager attention, or
not. Prints one JSON document (and writes it to --out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rocmfix.ops.vit_attention import BLOCKS, HEAD_DIM, HEADS, PAGE

DEVICE = "cuda"
KERNELS = ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION")
# The tower's config (Qwen2-VL's vision config, MinerU2.5's sizes) and one page in patches.
DIMS = {"embed_dim": HEADS * HEAD_DIM, "num_heads": HEADS, "hidden_size": 896,
        "mlp_ratio": 4, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
        "temporal_patch_size": 2}  # fmt: skip
GRID = (1, 74, 74)
TOLERANCE = 2e-2  # relative (Frobenius) error of a bf16 result


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@contextlib.contextmanager
def forced(kernel: str | None) -> Iterator[None]:
    if kernel is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, kernel)):
        yield


def per_image(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """vLLM's torch_sdpa_wrapper: one SDPA per image on ``b h s d`` views."""
    lengths = (cu[1:] - cu[:-1]).tolist()
    outs = [
        F.scaled_dot_product_attention(qi.transpose(1, 2), ki.transpose(1, 2), vi.transpose(1, 2))
        for qi, ki, vi in zip(*(torch.split(x, lengths, dim=1) for x in (q, k, v)), strict=True)
    ]
    return torch.cat([o.transpose(1, 2) for o in outs], dim=1)


def backends(q: Any, k: Any, v: Any, cu: Any, lengths: list[int]) -> dict[str, Callable[[], Any]]:
    found: dict[str, Callable[[], Any]] = {"sdpa (torch's choice)": lambda: per_image(q, k, v, cu)}
    for kernel in KERNELS:

        def call(kernel: str = kernel) -> Any:
            with forced(kernel):
                return per_image(q, k, v, cu)

        found[f"sdpa {kernel.lower()}"] = call
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(
            torch.arange(len(lengths), device=DEVICE), torch.tensor(lengths, device=DEVICE)
        )
        mask = create_block_mask(lambda b, h, i, j: doc[i] == doc[j], None, None, len(doc),
                                 len(doc), device=DEVICE)  # fmt: skip
        flex = torch.compile(flex_attention)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        found["flex_attention (Triton)"] = lambda: flex(qt, kt, vt, block_mask=mask).transpose(1, 2)
    except Exception as exc:  # noqa: BLE001 - an older torch: reported, not fatal
        print(f"flex_attention unavailable: {exc}", file=sys.stderr)
    try:
        from vllm.v1.attention.ops.triton_prefill_attention import context_attention_fwd

        def vllm_triton() -> Any:
            out = torch.empty_like(q[0])
            context_attention_fwd(q[0], k[0], v[0], out, b_start_loc=cu[:-1],
                                  b_seq_len=cu[1:] - cu[:-1], max_input_len=max(lengths),
                                  is_causal=False, softmax_scale=HEAD_DIM**-0.5)  # fmt: skip
            return out.unsqueeze(0)

        found["vllm TRITON_ATTN"] = vllm_triton
    except Exception as exc:  # noqa: BLE001 - no vLLM here
        print(f"vLLM's Triton attention unavailable: {type(exc).__name__}", file=sys.stderr)
    return found


def time_ms(fn: Callable[[], Any], calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / calls


def attention(shape: dict[str, Any], rounds: int) -> dict[str, Any]:
    lengths = list(shape["seqlens"])
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    size = (1, sum(lengths), HEADS, HEAD_DIM)
    q, k, v = (torch.randn(size, generator=gen, device=DEVICE, dtype=torch.bfloat16)
               for _ in range(3))  # fmt: skip
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEVICE,
                      dtype=torch.int32)  # fmt: skip
    with forced("MATH"):
        ref = per_image(q.float(), k.float(), v.float(), cu)
    rows: dict[str, dict[str, Any]] = {}
    runnable: dict[str, Callable[[], Any]] = {}
    for name, fn in backends(q, k, v, cu, lengths).items():
        try:
            out = fn()  # the first call compiles or picks its kernel
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a kernel this GPU has none of
            rows[name] = {"status": "unavailable", "message": str(exc).splitlines()[0][:160]}
            continue
        err = (out.float() - ref).abs()
        rows[name] = {"status": "ok", "rel_err": rel_err(out, ref), "max_abs_err": float(err.max())}
        runnable[name] = fn
    samples: dict[str, list[float]] = {name: [] for name in runnable}
    for _ in range(rounds):
        for name, fn in runnable.items():
            samples[name].append(time_ms(fn, calls=5))
    for name, times in samples.items():
        rows[name].update(ms=statistics.median(times), ms_min=min(times), ms_max=max(times))
    math = rows.get("sdpa math", {}).get("ms")
    for row in rows.values():
        if math and row.get("ms"):
            row["x_vs_math"] = math / row["ms"]
    return {"seqlens": lengths, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": "bf16",
            "backends": rows}  # fmt: skip


def tower(depth: int) -> dict[str, Any]:
    try:
        import transformers
        from transformers.models.qwen2_vl import modeling_qwen2_vl as m
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    except ImportError as exc:
        return {"skipped": f"transformers is not installed ({exc})"}
    torch.manual_seed(0)
    model = m.Qwen2VisionTransformerPretrainedModel._from_config(
        Qwen2VLVisionConfig(**DIMS, depth=depth)
    ).to(DEVICE).eval()  # fmt: skip
    patches = GRID[0] * GRID[1] * GRID[2]
    k = DIMS["in_channels"] * DIMS["temporal_patch_size"] * DIMS["patch_size"] ** 2
    x = torch.randn(patches, k, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(1))
    grid = torch.tensor([GRID], device=DEVICE)

    def run(impl: str, kernel: str | None, dtype: torch.dtype) -> torch.Tensor:
        for module in model.modules():
            config = getattr(module, "config", None)
            if config is not None:
                config._attn_implementation = impl
        model.to(dtype)
        with torch.inference_mode(), forced(kernel):
            y = model(x.to(dtype), grid_thw=grid)
        # transformers 4 returns the merged embeddings; 5 returns them as pooler_output.
        if isinstance(y, tuple):
            y = y[0]
        merged = getattr(y, "pooler_output", None)
        return (y if merged is None else merged).float()

    ref = run("eager", None, torch.float32)
    report: dict[str, Any] = {"transformers": transformers.__version__, "depth": depth,
                              "tokens": patches, "reference": "eager attention, fp32"}  # fmt: skip
    cases = {"eager": ("eager", None), "sdpa (torch's choice)": ("sdpa", None),
             "sdpa math": ("sdpa", "MATH"), "sdpa flash": ("sdpa", "FLASH_ATTENTION"),
             "sdpa efficient": ("sdpa", "EFFICIENT_ATTENTION")}  # fmt: skip
    rows = {}
    for name, (impl, kernel) in cases.items():
        try:
            err = rel_err(run(impl, kernel, torch.bfloat16), ref)
        except Exception as exc:  # noqa: BLE001 - a kernel this GPU has none of
            rows[name] = {"status": "unavailable", "message": str(exc).splitlines()[0][:160]}
            continue
        rows[name] = {"status": "ok", "rel_err_vs_fp32": err, "within": err <= TOLERANCE}
    report["bf16"] = rows
    return report


def tokens(new_tokens: int = 16) -> dict[str, Any]:
    """A whole (tiny) Qwen2-VL with random weights, its tower's heads of 80 as MinerU2.5's,
    generating greedily from one image with each attention switch: the same tokens as eager
    attention in the same dtype, or not."""
    try:
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    except ImportError as exc:
        return {"skipped": f"transformers is not installed ({exc})"}
    text = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
            "max_position_embeddings": 4096,
            "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}}  # fmt: skip
    vision = {"depth": 2, "embed_dim": 2 * HEAD_DIM, "num_heads": 2, "hidden_size": 128,
              "mlp_ratio": 2}  # fmt: skip
    special = {"image_token_id": 500, "vision_start_token_id": 501, "vision_end_token_id": 502,
               "video_token_id": 503}  # fmt: skip
    config = Qwen2VLConfig(text_config=text, vision_config=vision, **special)
    grid = torch.tensor([[1, 28, 28]], device=DEVICE)
    patches = int(grid.prod())
    gen = torch.Generator(DEVICE).manual_seed(2)
    pixels = torch.randn(patches, 3 * 2 * 14 * 14, device=DEVICE, generator=gen)
    ids = torch.tensor([[1, 2, 501] + [500] * (patches // 4) + [502, 3, 4]], device=DEVICE)
    cases = {"eager": ("eager", None), "sdpa (torch's choice)": ("sdpa", None),
             "sdpa math": ("sdpa", "MATH"), "sdpa flash": ("sdpa", "FLASH_ATTENTION"),
             "sdpa efficient": ("sdpa", "EFFICIENT_ATTENTION")}  # fmt: skip
    state = None
    found: dict[str, Any] = {}
    for name, (impl, kernel) in cases.items():
        torch.manual_seed(0)
        model = Qwen2VLForConditionalGeneration._from_config(config, attn_implementation=impl)
        if state is None:
            state = model.state_dict()
        model.load_state_dict(state)
        model = model.to(DEVICE, torch.bfloat16).eval()
        try:
            with torch.inference_mode(), forced(kernel):
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     pixel_values=pixels.to(torch.bfloat16), image_grid_thw=grid,
                                     max_new_tokens=new_tokens, do_sample=False)  # fmt: skip
            found[name] = out[0, ids.shape[1] :].tolist()
        except Exception as exc:  # noqa: BLE001 - a kernel this GPU has none of
            found[name] = str(exc).splitlines()[0][:160]
    same = {
        name: got == found["eager"] if isinstance(got, list) else None  # None: did not run
        for name, got in found.items()
        if name != "eager"
    }
    return {"image_tokens": patches // 4, "generated": found, "same_as_eager": same}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--out")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "tolerance": TOLERANCE,
    }
    with torch.inference_mode():
        report["page"] = attention(PAGE, args.rounds)
        report["blocks"] = attention(BLOCKS, args.rounds)
    report["tower"] = tower(args.depth)
    report["tokens"] = tokens()
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
