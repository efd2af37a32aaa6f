"""Today's MinerU models, whole, through the files `rocmfix apply` rewrote: eager forward time
stock against patched in one process, outputs compared, and what convs the patched forward
still runs (a TorchDispatchMode on every forward; torch.profiler on one).

    pip install --no-deps --no-index mineru-4.0.12-py3-none-any.whl   # no hub, no deps
    rocmfix apply --force --scheme triton --only transformers-hgnet-v2 \\
        --only mineru-ocr-lcnetv4 --only mineru-ocr-hgnetv2 --only mineru-ocr-replkfpn \\
        --only mineru-ocr-lightsvtr --only mineru-ocr-db-head
    python bench/models_gpu.py --out models.json
    rocmfix revert

The models are built with random weights, as MinerU 4.0 runs them: PP-DocLayoutV2 from
transformers' default config (fp32, 800x800), and from the arch configs inside the installed
mineru wheel PP-OCRv6 det tiny (fp32, 960x672), rec small (fp16, batch 6 of 3x48x320) and the
PP-FormulaNet_plus-M encoder (fp16, batch 8 at 384x384). A rewritten file takes the dropped
kernel while its module's ``_rocmfix_*`` entry is set and the stock statements when it is None,
so one model gives both paths. IEEE fp32 (TF32 off), so a difference is the kernel's.

``--shapes`` prints every depthwise and transposed conv each stock forward runs (channels,
kernel, stride, input size, dtype, the activation after it) without timing anything.
``--breakdown`` adds torch.profiler's view of five stock and five patched forwards: self CPU
time per op, GPU kernels and their time, per forward.
``--device cpu --small`` runs the same checks through Triton's interpreter at small inputs
(the patched files' GPU guard read as true), to try the script where there is no GPU.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import torch
from torch.utils._python_dispatch import TorchDispatchMode

OCR = "mineru.model._internal.pytorchocr"
# (name, dtype, full-size input, small input): what MinerU 4.0 feeds each model on a GPU.
MODELS = {
    "layout": (torch.float32, (1, 3, 800, 800), (1, 3, 64, 64)),
    "det": (torch.float32, (1, 3, 960, 672), (1, 3, 64, 96)),
    "rec": (torch.float16, (6, 3, 48, 320), (1, 3, 48, 160)),
    "formula": (torch.float16, (8, 3, 384, 384), (1, 3, 64, 64)),
}


class Forced(importlib.machinery.SourceFileLoader):
    """On a CPU: a rewritten file with its ``x.is_cuda`` guard read as true."""

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> Any:
        tree = ast.parse(data)
        for node in ast.walk(tree):
            test = getattr(node, "test", None)
            if not (isinstance(node, ast.If) and isinstance(test, ast.BoolOp)):
                continue
            first = test.values[0]
            left = getattr(first, "left", None)
            if isinstance(first, ast.Compare) and getattr(left, "id", "").startswith("_rocmfix_"):
                test.values = [
                    ast.Constant(True)
                    if isinstance(v, ast.Attribute) and v.attr == "is_cuda"
                    else v
                    for v in test.values
                ]
        return compile(ast.fix_missing_locations(tree), path, "exec")


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if not name.startswith(("mineru.", "transformers.models.")):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, "rb") as f:
                if b"# rocmfix:" in f.read():
                    spec.loader = Forced(name, spec.origin)
        return spec


def conv_args(func: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """(input, weight, stride, transposed, groups) of a conv op, else None. Under
    ``torch.inference_mode`` a mode sees ``aten.conv2d`` itself (no autograd key decomposes it
    first); elsewhere ``aten.convolution``: each conv is seen once either way."""
    name = func.overloadpacket.__name__
    arg = lambda i, key, default: args[i] if len(args) > i else kwargs.get(key, default)  # noqa: E731
    if name in ("convolution", "_convolution"):
        return args[0], args[1], args[3], args[6], args[8]
    if name in ("conv2d", "conv1d", "conv3d"):
        return args[0], args[1], arg(3, "stride", [1]), False, arg(6, "groups", 1)
    if name in ("conv_transpose2d", "conv_transpose1d", "conv_transpose3d"):
        return args[0], args[1], arg(3, "stride", [1]), True, arg(6, "groups", 1)
    return None


class Convs(TorchDispatchMode):
    """Every aten.convolution that runs, as the dispatcher sees it, by kind."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        conv = conv_args(func, args, kwargs or {})
        if conv is not None:
            x, w, stride, transposed, groups = conv
            kind = "other"
            if transposed:
                kind = "transposed"
            elif groups > 1 and groups == x.shape[1] and w.shape[1] == 1:
                kind = "depthwise"
            self.seen.append(
                {"kind": kind, "c": x.shape[1], "kernel": list(w.shape[2:]),
                 "stride": list(stride), "hw": list(x.shape[2:]), "n": x.shape[0],
                 "groups": groups, "dtype": str(x.dtype).replace("torch.", "")}
            )  # fmt: skip
        return func(*args, **(kwargs or {}))

    def count(self, kind: str) -> int:
        return sum(s["kind"] == kind for s in self.seen)


def _mineru() -> tuple[types.ModuleType, dict[str, Any], dict[str, Any]]:
    import yaml

    # MinerU's package __init__ imports its whole document stack; the models need none of it.
    stub = sys.modules.get("mineru")
    if stub is None:
        spec = importlib.util.find_spec("mineru")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("mineru is not installed (pip install --no-deps the wheel)")
        stub = types.ModuleType("mineru")
        stub.__path__ = list(spec.submodule_search_locations)
        sys.modules["mineru"] = stub
    base = importlib.import_module(OCR + ".modeling.architectures.base_model")
    resources = Path(stub.__path__[0], "model/_internal/pytorchocr/utils/resources")
    arch = yaml.safe_load((resources / "arch_config.yaml").read_text())
    formula = yaml.safe_load((resources / "pp_formulanet_arch_config.yaml").read_text())
    return base, arch, formula


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "layout":
        from transformers import PPDocLayoutV2Config, PPDocLayoutV2ForObjectDetection

        config = PPDocLayoutV2Config()
        config.class_thresholds = [0.5] * config.num_labels
        config.class_order = list(range(config.num_labels))
        if SMALL:  # a 64x64 page has fewer anchors than the default 300 queries
            config.num_queries = 16
        model: torch.nn.Module = PPDocLayoutV2ForObjectDetection(config)
        # transformers' init (std 0.02) shrinks the backbone's activations tenfold a layer, to
        # 1e-20 at the last stage, where any conv would match: He init keeps them near 1.
        for m in model.model.backbone.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    else:
        base, arch, formula = _mineru()
        if name == "det":
            model = base.BaseModel(copy.deepcopy(arch["ch_PP-OCRv6_tiny_det_infer"]))
        elif name == "rec":
            model = base.BaseModel(copy.deepcopy(arch["ch_PP-OCRv6_small_rec_infer"]))
        else:
            backbones = importlib.import_module(OCR + ".modeling.backbones")
            cfg = formula["PP-FormulaNet_plus-M"]["Architecture"]["Backbone"]
            model = backbones.build_backbone(copy.deepcopy(cfg), "rec")
    # Non-trivial BatchNorm statistics, so a BatchNorm applied in the kernel's store counts.
    g = torch.Generator().manual_seed(2)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 0.4 - 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval()


def entries(name: str) -> dict[tuple[types.ModuleType, str], Any]:
    """The rewritten files' ``_rocmfix_*`` entries the model's modules import."""
    prefix = "transformers.models." if name == "layout" else "mineru."
    found = {}
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith(prefix) or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if attr.startswith("_rocmfix_") and value is not None and callable(value):
                found[(mod, attr)] = value
    return found


def use(routes: dict[tuple[types.ModuleType, str], Any], patched: bool) -> None:
    for (mod, attr), value in routes.items():
        setattr(mod, attr, value if patched else None)


def flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in flat(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat(o)]
    if hasattr(out, "__dict__"):
        return [t for k in sorted(vars(out)) for t in flat(vars(out)[k])]
    return []


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(run: Callable[[], Any], reps: int, host: list[float] | None = None) -> list[float]:
    """Wall ms per call (synchronised); ``host`` gets the process's CPU ms for each, which
    says how much of a forward is the host issuing launches."""
    times = []
    for _ in range(reps):
        sync()
        start, cpu = time.perf_counter(), time.process_time()
        run()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
        if host is not None:
            host.append((time.process_time() - cpu) * 1e3)
    return times


def profiled(run: Callable[[], Any]) -> dict[str, Any]:
    """One patched forward under torch.profiler: the aten::convolution events by kind, read
    from their recorded shapes and scalar arguments."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if DEVICE == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True) as prof:
        run()
        sync()
    kinds: dict[str, int] = {"depthwise": 0, "transposed": 0, "other": 0}
    left = []
    for e in prof.events():
        if e.name != "aten::convolution":
            continue
        shapes = e.input_shapes
        scalars = getattr(e, "concrete_inputs", None) or []
        transposed = len(scalars) > 6 and scalars[6] is True
        groups = scalars[8] if len(scalars) > 8 and isinstance(scalars[8], int) else None
        x, w = shapes[0], shapes[1]
        depthwise = (
            not transposed and len(w) == 4 and w[1] == 1 and len(x) == 4 and x[1] > 1
            and w[0] == x[1] and groups in (None, x[1])
        )  # fmt: skip
        kind = "transposed" if transposed else "depthwise" if depthwise else "other"
        kinds[kind] += 1
        if kind != "other":
            left.append({"kind": kind, "input": x, "weight": w, "groups": groups})
    names = {e.name for e in prof.events()}
    kernels = sorted(n for n in names if "depthwise" in n.lower() or "_kernel" in n)[:12]
    scalars_seen = any(
        getattr(e, "concrete_inputs", None) for e in prof.events() if e.name == "aten::convolution"
    )
    return {"convolution": kinds, "left": left, "rocmfix_kernels": kernels,
            "has_concrete_inputs": scalars_seen}  # fmt: skip


def breakdown(
    forward: Callable[[], Any], routes: dict[tuple[types.ModuleType, str], Any], reps: int = 5
) -> dict[str, Any]:
    """Where a forward's time goes, stock against patched: torch.profiler over ``reps``
    forwards of each, per forward: each op's self CPU time and calls (the 25 costliest), the
    GPU kernels launched and their summed time, and the wall time under the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if DEVICE == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities):  # the profiler's own start-up, on neither side
        forward()
        sync()
    sessions: dict[str, list[Any]] = {"stock": [], "patched": []}
    # Sessions in the order A B B A, so that a host's drift weighs on both sides alike.
    for label in ("stock", "patched", "patched", "stock"):
        use(routes, label == "patched")
        timed(forward, 2)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(reps):
                forward()
            sync()
            wall = (time.perf_counter() - start) * 1e3 / reps
        sessions[label].append((prof, wall))
    found: dict[str, Any] = {}
    for label, runs in sessions.items():
        n = reps * len(runs)
        ops_us: dict[str, float] = {}
        ops_calls: dict[str, float] = {}
        by_kernel: dict[str, list[float]] = {}
        for prof, _wall in runs:
            for avg in prof.key_averages():
                if avg.self_cpu_time_total > 0:
                    ops_us[avg.key] = ops_us.get(avg.key, 0.0) + avg.self_cpu_time_total / n
                    ops_calls[avg.key] = ops_calls.get(avg.key, 0.0) + avg.count / n
            for e in prof.events():
                if e.device_type == DeviceType.CUDA:
                    by_kernel.setdefault(e.name[:80], []).append(e.time_range.elapsed_us())
        ops = sorted(
            ({"op": k, "calls": ops_calls[k], "self_cpu_us": v} for k, v in ops_us.items()),
            key=lambda o: -float(o["self_cpu_us"]),
        )
        found[label] = {
            "wall_ms_profiled": statistics.mean(w for _p, w in runs),
            "self_cpu_ms": sum(ops_us.values()) / 1e3,
            "kernels": sum(len(v) for v in by_kernel.values()) / n,
            "gpu_kernel_ms": sum(sum(v) for v in by_kernel.values()) / n / 1e3,
            "ops": ops[:25],
            "kernels_by_name": sorted(
                ({"kernel": k, "count": len(v) / n, "us": sum(v) / n}
                 for k, v in by_kernel.items()),
                key=lambda k: -float(k["us"]),
            )[:25],
        }  # fmt: skip
    found["in_situ"] = in_situ(forward, routes, reps)
    use(routes, True)
    return found


def in_situ(
    forward: Callable[[], Any], routes: dict[tuple[types.ModuleType, str], Any], reps: int
) -> dict[str, Any]:
    """Over ``reps`` patched forwards: each entry's calls, the host time they took inside the
    forward (perf_counter around each; the kernels are asynchronous), and how many of them
    missed the replay (went to the depthwise entry's ``_eager`` or the transposed one's
    ``_first``)."""
    calls: dict[str, list[float]] = {}
    misses: dict[str, int] = {}
    saved: list[tuple[Any, str, Any]] = []
    for (mod, attr), entry in routes.items():
        label = f"{mod.__name__.rsplit('.', 1)[1]}.{attr}"
        home = sys.modules.get(getattr(entry, "__module__", ""), None)
        for name in ("_eager", "_first"):
            inner = getattr(home, name, None)
            if inner is not None and not hasattr(inner, "_counted"):

                def counted(
                    *a: Any, _inner: Any = inner, _key: str = home.__name__, **kw: Any
                ) -> Any:
                    misses[_key] = misses.get(_key, 0) + 1
                    return _inner(*a, **kw)

                counted._counted = True  # type: ignore[attr-defined]
                saved.append((home, name, inner))
                setattr(home, name, counted)

        def timed_entry(*a: Any, _entry: Any = entry, _label: str = label, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return _entry(*a, **kw)
            finally:
                calls.setdefault(_label, []).append(time.perf_counter() - start)

        saved.append((mod, attr, entry))
        setattr(mod, attr, timed_entry)
    try:
        for _ in range(reps):
            forward()
        sync()
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
    return {
        "per_forward": {k: {"calls": len(v) / reps, "host_us": sum(v) * 1e6 / reps,
                            "median_call_us": statistics.median(v) * 1e6}
                        for k, v in calls.items()},
        "misses": misses,
    }  # fmt: skip


def summary(split: dict[str, Any]) -> str:
    """The breakdown as lines: totals, then the costliest ops side by side."""
    stock, patched = split["stock"], split["patched"]
    lines = [
        f"{'per forward':44s} {'stock':>18s} {'patched':>18s}",
        *(f"{key:44s} {stock[key]:18.3f} {patched[key]:18.3f}"
          for key in ("wall_ms_profiled", "self_cpu_ms", "kernels", "gpu_kernel_ms")),
        f"{'op (self CPU us, calls)':44s}",
    ]  # fmt: skip
    rows: dict[str, list[str]] = {}
    for col, side in enumerate((stock, patched)):
        for o in side["ops"][:16]:
            rows.setdefault(o["op"][:44], ["", ""])[col] = (
                f"{o['self_cpu_us']:9.1f} ({o['calls']:5.1f})"
            )
    lines += [f"{op:44s} {a:>18s} {b:>18s}" for op, (a, b) in rows.items()]
    lines.append(f"in situ: {json.dumps(split.get('in_situ'))}")
    return "\n".join(lines)


def activation_after(model: torch.nn.Module) -> dict[int, str]:
    """id(conv) -> the activation module its layer applies after it (by attribute name)."""
    acts = {}
    for layer in model.modules():
        conv = next((getattr(layer, a) for a in ("convolution", "conv", "depthwise_convolution",
                     "token_conv") if isinstance(getattr(layer, a, None), torch.nn.Conv2d)),
                    None)  # fmt: skip
        act = next((getattr(layer, a) for a in ("activation", "act") if hasattr(layer, a)), None)
        if conv is not None:
            acts[id(conv)] = type(act).__name__ if act is not None else "-"
    return acts


def shapes(name: str, model: torch.nn.Module, x: torch.Tensor) -> list[dict[str, Any]]:
    acts = activation_after(model)
    seen: list[dict[str, Any]] = []

    def hook(mod: torch.nn.Module, args: Any, _out: Any) -> None:
        assert isinstance(mod, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))
        inp = args[0]
        transposed = isinstance(mod, torch.nn.ConvTranspose2d)
        if not transposed and not (mod.groups > 1 and mod.groups == mod.in_channels):
            return
        seen.append(
            {"model": name, "kind": "transposed" if transposed else "depthwise",
             "n": inp.shape[0], "c": inp.shape[1], "out_c": mod.out_channels,
             "kernel": list(mod.kernel_size), "stride": list(mod.stride),
             "padding": list(mod.padding), "hw": list(inp.shape[2:]),
             "bias": mod.bias is not None, "dtype": str(inp.dtype).replace("torch.", ""),
             "act": acts.get(id(mod), "?")}
        )  # fmt: skip

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]  # fmt: skip
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return seen


def rel_err(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, int]:
    """The largest error relative to each tensor's largest finite value, over the positions
    where stock is finite; and how many positions the two paths disagree on being finite."""
    worst, mismatched = 0.0, 0
    for a, b in zip(got, want, strict=True):
        fine = b.isfinite()
        mismatched += int((fine != a.isfinite()).sum())
        if fine.any():
            scale = b[fine].abs().max().clamp_min(1e-6)
            worst = max(worst, ((a[fine] - b[fine]).abs().max() / scale).item())
    return worst, mismatched


def run_both(
    forward: Callable[[], Any],
    routes: dict[tuple[types.ModuleType, str], Any],
    backbone: torch.nn.Module,
) -> dict[str, Any]:
    """One stock and one patched forward: the convs each runs, and how far the outputs (and
    the backbone's, which a detector's head may hide) are apart."""
    found: dict[str, Any] = {}
    keep: dict[str, list[torch.Tensor]] = {}
    for label, patched in (("stock", False), ("patched", True)):
        use(routes, patched)
        feats: list[torch.Tensor] = []
        hook = backbone.register_forward_hook(
            lambda _m, _a, out, feats=feats: feats.extend(t.float().cpu() for t in flat(out))
        )
        convs = Convs()
        try:
            with convs:
                keep[label] = [t.float().cpu() for t in flat(forward()) if t.is_floating_point()]
        finally:
            hook.remove()
        keep[label + "_backbone"] = [t for t in feats if t.is_floating_point()]
        found[label + "_convs"] = {k: convs.count(k) for k in ("depthwise", "transposed", "other")}
        if patched:
            found["left"] = [c for c in convs.seen if c["kind"] != "other"]
    found["rel_err"], found["nonfinite_mismatch"] = rel_err(keep["patched"], keep["stock"])
    found["backbone_rel_err"], _ = rel_err(keep["patched_backbone"], keep["stock_backbone"])
    found["stock_nonfinite"] = sum(int((~t.isfinite()).sum()) for t in keep["stock"])
    return found


def bench(name: str, reps: int) -> dict[str, Any]:
    dtype, full, small = MODELS[name]
    model = build(name)
    routes = entries(name)
    if not routes:
        return {"error": "no rewritten file with a _rocmfix_ entry: run rocmfix apply first"}
    if DEVICE == "cpu":
        dtype = torch.float32  # the interpreter's fp16 is slow and proves nothing more
    model = model.to(DEVICE, dtype)
    x = torch.randn(*(small if SMALL else full), generator=torch.Generator().manual_seed(1))
    x = x.to(DEVICE, dtype)
    key = "pixel_values" if name == "layout" else "input_data" if name == "formula" else "x"

    def forward() -> Any:
        with torch.inference_mode():
            return model(**{key: x})

    backbone = next((m for n, m in model.named_modules() if n.endswith("backbone")), model)
    seen = run_both(forward, routes, backbone)
    result: dict[str, Any] = {
        "dtype": str(dtype).replace("torch.", ""),
        "input": list(x.shape),
        "routes": sorted(f"{m.__name__.rsplit('.', 1)[1]}.{a}" for m, a in routes),
        **seen,
    }
    if dtype != torch.float32:
        # Random weights overflow fp16 in deep stacks: fp32 is where the outputs say most.
        model.float()
        x = x.float()
        result["fp32"] = run_both(forward, routes, backbone)
        model.to(dtype)
        x = x.to(dtype)
    if reps:
        for patched in (False, True, False, True):  # warm both: compiles, autotune, cuDNN
            use(routes, patched)
            timed(forward, 3)
        stock_ms: list[float] = []
        patched_ms: list[float] = []
        stock_cpu: list[float] = []
        patched_cpu: list[float] = []
        for _ in range(reps):  # interleaved, so drift hits both alike
            use(routes, False)
            stock_ms += timed(forward, 1, stock_cpu)
            use(routes, True)
            patched_ms += timed(forward, 1, patched_cpu)
        s, p = statistics.median(stock_ms), statistics.median(patched_ms)
        result.update(stock_ms=s, patched_ms=p, ratio=p / s,
                      stock_min_ms=min(stock_ms), patched_min_ms=min(patched_ms),
                      stock_host_ms=statistics.median(stock_cpu),
                      patched_host_ms=statistics.median(patched_cpu))  # fmt: skip
    if BREAKDOWN:
        result["breakdown"] = breakdown(forward, routes, 1 if DEVICE == "cpu" else 5)
    # On a CPU the routed forward runs in Triton's interpreter, which the profiler makes a
    # hundred times slower: there the profiler reads a stock forward, which tries its parsing.
    use(routes, DEVICE == "cuda")
    result["profiled"] = "patched" if DEVICE == "cuda" else "stock"
    result["profiler"] = profiled(forward)
    use(routes, True)
    return result


def main() -> int:
    global DEVICE, SMALL, BREAKDOWN
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="layout,det,rec,formula")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--small", action="store_true", help="small inputs (for a CPU try)")
    parser.add_argument("--reps", type=int, default=30, help="timed forwards each (0: none)")
    parser.add_argument("--shapes", action="store_true", help="list the stock convs only")
    parser.add_argument("--breakdown", action="store_true",
                        help="torch.profiler per op, stock against patched")  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    DEVICE, SMALL, BREAKDOWN = args.device, args.small, args.breakdown
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if DEVICE == "cpu" and not args.shapes:
        sys.meta_path.insert(0, Finder())
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "cudnn": torch.backends.cudnn.version() if DEVICE == "cuda" else None,
        "models": {},
    }
    for name in args.models.split(","):
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            if args.shapes:
                _, full, small = MODELS[name]
                # One image: the batch MinerU runs changes no conv's shape.
                x = torch.randn(1, *(small if SMALL else full)[1:])
                found = [dict(f, n=full[0]) for f in shapes(name, build(name), x)]
                for s in found:
                    print(json.dumps(s))
                report["models"][name] = found
                continue
            if DEVICE == "cpu":
                _cpu_transpose(name)
            report["models"][name] = bench(name, args.reps)
        except Exception as e:  # noqa: BLE001 - one model's failure (no PP-DocLayoutV2 here, say) is a row
            report["models"][name] = {"error": f"{type(e).__name__}: {e}"}
        found = report["models"][name]
        split = found.pop("breakdown", None)
        print(json.dumps(found, indent=1)[:3000], file=sys.stderr, flush=True)
        if split is not None:
            found["breakdown"] = split
            print(summary(split), file=sys.stderr, flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


def _cpu_transpose(name: str) -> None:
    """On a CPU the transposed-conv entry keeps the stock op: its GEMM and shuffle run here."""
    if name != "det":
        return
    _mineru()
    head = importlib.import_module(OCR + ".modeling.heads.det_db_head")
    if getattr(head, "_rocmfix_conv_transpose2d", None) is None:
        return
    ct = importlib.import_module(OCR + ".modeling.rocmfix_conv_transpose")
    head._rocmfix_conv_transpose2d = lambda x, d: (
        ct.gemm(x, d.weight, d.bias) if ct.handled(x, d) else d(x)
    )


DEVICE, SMALL, BREAKDOWN = "cuda", False, False

if __name__ == "__main__":
    sys.exit(main())
