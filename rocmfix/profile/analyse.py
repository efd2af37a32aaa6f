"""From grouped calls to the report's rows: time, share, achieved rates against this machine's
own, the rocmfix patch that routes an op, and the verdict once the replay has run."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from rocmfix.guest.protocol import Call
from rocmfix.ops import OPS
from rocmfix.patch import Patch

from .collect import Group, layout
from .model import (
    FLAG_ROOFLINE,
    FLAG_SHARE,
    FLAG_SPEEDUP,
    Calibration,
    Fix,
    Form,
    OpStat,
)

CONVS = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
         "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d")  # fmt: skip
ITEMSIZE = {"float": 4, "c10::half": 2, "c10::bfloat16": 2, "double": 8, "half": 2, "bfloat16": 2}
DTYPE = {"float": "float32", "c10::half": "float16", "c10::bfloat16": "bfloat16",
         "double": "float64"}  # fmt: skip
ROOFLINE_MIN_MS_GPU = 0.1
ROOFLINE_MIN_MS_CPU = 1.0
# First-call cost (a MIOpen Find, a cuDNN benchmark autotune, a one-time compile) is flagged
# when the first call takes this many times a steady call and what it adds takes at least
# FLAG_SHARE of the run: a first call a few times slower is a cold cache, not a search.
FIRST_CALL_RATIO = 5.0
# ... and it adds at least this much: CPU times include the scheduler's stalls, which reach
# tens of ms on a loaded machine; device times do not.
FIRST_CALL_MIN_MS_CPU = 100.0
FIRST_CALL_MIN_MS_GPU = 1.0
# A replay whose "as run" time is further than this factor from the run's own steady time did
# not reproduce the run: it gives no verdict (a 2-core CPU under load read 36 ms for a conv the
# run took 5.5 ms for, and flagged it 101.8x and then 121.7x "faster").
REPLAY_AGREES = 2.0


def conv_params(op: Mapping[str, Any]) -> dict[str, Any] | None:
    if op["name"] not in CONVS:
        return None
    c = list(op.get("concrete") or [])

    def at(i: int, default: Any) -> Any:
        return c[i] if i < len(c) and c[i] is not None else default

    if op["name"] in ("aten::convolution", "aten::_convolution"):
        return {"stride": at(3, [1]), "padding": at(4, [0]), "dilation": at(5, [1]),
                "groups": at(8, 1), "transposed": bool(at(6, False)),
                "output_padding": at(7, [0])}  # fmt: skip
    if op["name"].startswith("aten::conv_transpose"):
        # (input, weight, bias, stride, padding, output_padding, groups, dilation)
        return {"stride": at(3, [1]), "padding": at(4, [0]), "dilation": at(7, [1]),
                "groups": at(6, 1), "transposed": True, "output_padding": at(5, [0])}  # fmt: skip
    params = {"stride": at(3, [1]), "padding": at(4, [0]), "dilation": at(5, [1]),
              "groups": at(6, 1), "transposed": False, "output_padding": [0]}  # fmt: skip
    mode = params["padding"]
    shapes = op.get("shapes") or []
    if isinstance(mode, str) and len(shapes) > 1 and len(shapes[1]) >= 3:
        # padding="same"/"valid", as torch resolves it: the total d*(k-1) split with the far
        # side (bottom/right) one more where it is odd (torch pads the input by that first).
        kernel = shapes[1][2:]
        dl = _expand(params["dilation"], len(kernel))
        total = [0 if mode == "valid" else d * (k - 1) for k, d in zip(kernel, dl, strict=False)]
        params.update(padding=[t // 2 for t in total], padding_mode=mode,
                      pad_far=[t % 2 for t in total])  # fmt: skip
    return params


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 0


def _expand(values: Sequence[int], dims: int) -> list[int]:
    return list(values) * dims if len(values) == 1 else list(values)


def work(op: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(flops, bytes moved) of one call, where the op is one rocmfix knows the cost of."""
    shapes, dtypes = op["shapes"], op.get("dtypes") or []
    size = ITEMSIZE.get(str(dtypes[0]).lower(), 4) if dtypes else 4
    name = op["name"]
    params = conv_params(op)
    if params is not None and len(shapes) >= 2 and len(shapes[0]) >= 3 and len(shapes[1]) >= 3:
        x, w = shapes[0], shapes[1]  # transposed: w is (in, out / groups, k...)
        dims = len(x) - 2
        st, pd = _expand(params["stride"], dims), _expand(params["padding"], dims)
        span = [d * (k - 1) for d, k in zip(_expand(params["dilation"], dims), w[2:], strict=False)]
        if params["transposed"]:
            op_ = _expand(params["output_padding"], dims)
            out = [(x[2 + i] - 1) * st[i] - 2 * pd[i] + span[i] + op_[i] + 1 for i in range(dims)]
            outputs = x[0] * w[1] * int(params["groups"]) * math.prod(out)
            flops = 2.0 * _numel(x) * _numel(w[1:])
        else:
            far = params.get("pad_far") or [0] * dims
            out = [(x[2 + i] + 2 * pd[i] + far[i] - span[i] - 1) // st[i] + 1 for i in range(dims)]
            outputs = x[0] * w[0] * math.prod(out)
            flops = 2.0 * outputs * _numel(w[1:])
        return flops, float(size * (_numel(x) + _numel(w) + outputs))
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        if len(shapes) < 2 or not shapes[0] or not shapes[1]:
            return None, None
        a, b = shapes[0], shapes[1]
        if name == "aten::addmm" and len(shapes) >= 3:
            a, b = shapes[1], shapes[2]
        k = a[-1]
        n = b[0] if name == "aten::linear" else b[-1]
        m = _numel(a) // k if k else 0
        return 2.0 * m * n * k, float(size * (_numel(a) + _numel(b) + m * n))
    return None, None


def conv_kind(op: Mapping[str, Any]) -> str | None:
    """Which rocmfix op a conv call is, from its arguments alone: the op whose rule
    (:attr:`rocmfix.ops.Op.matches`) takes it."""
    params = conv_params(op)
    shapes = op.get("shapes") or []
    if params is None or len(shapes) < 2 or len(shapes[0]) < 3 or len(shapes[1]) < 3:
        return None
    found = (each for each in OPS if each.matches and each.matches(params, shapes[0], shapes[1]))
    return next((each.name for each in found), None)


def patch_for(
    op: Mapping[str, Any], source: str | None, patches: Sequence[Patch]
) -> tuple[Patch | None, bool]:
    """The patch whose op this call is, from the file that issued it; and whether the call
    came from a file a patch drops (already routed)."""
    if not source:
        return None, False
    # The profiler names files relative to their sys.path entry (doclayout_yolo/nn/...).
    path = "/" + source.split(" ")[0].rsplit(":", 1)[0].replace("\\", "/").lstrip("/")
    kind = conv_kind(op)
    name = str(op.get("name", "")).removeprefix("aten::")
    for patch in patches:
        if any(path.endswith("/" + drop) for drop in patch.drop_paths):
            return patch, True
        if patch.op is None:
            continue
        # An op called through an engine's wrapper: the patch that selects its backend.
        if name in patch.op.calls and any(path.endswith("/" + s) for s in patch.op.sites):
            return patch, False
        if kind is None or not path.endswith("/" + patch.path):
            continue
        if patch.op.name == kind:
            return patch, False
    return None, False


def rows(
    groups: Mapping[str, Group], total_us: float, calibration: Calibration | None
) -> list[OpStat]:
    out: list[OpStat] = []
    for key, group in groups.items():
        op = group.op
        times = group.times_us
        total = sum(times)
        # A steady call is the median of the calls after the first: a mean carries the stalls
        # of a loaded machine's scheduler into the figure the replay is checked against.
        steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
        host = group.host_us if group.host_us != times and len(group.host_us) > 1 else None
        flops, moved = work(op)
        # Rates are a steady call's, for the same reason (a stalled call is not the kernel).
        call_s = steady / 1e6
        tflops = flops / call_s / 1e12 if flops and call_s > 0 else None
        gbps = moved / call_s / 1e9 if moved and call_s > 0 else None
        roof = None
        if calibration and flops and moved and call_s > 0:
            dtype = DTYPE.get(str((op.get("dtypes") or ["float"])[0]).lower(), "float32")
            peak = calibration.matmul_tflops.get(dtype) or calibration.matmul_tflops.get("float32")
            if peak:
                bound = min(peak * 1e12, flops / moved * calibration.copy_gbps * 1e9)
                roof = (flops / call_s) / bound if bound > 0 else None
        source = op.get("source")
        # The profiler's Python frames carry the line of the function's ``def``, not the call.
        where = (
            f"{source[0]}:{source[1]} {source[2] if len(source) > 2 else ''}".rstrip()
            if isinstance(source, list) and len(source) >= 2
            else None
        )
        strides = op.get("strides") or []
        out.append(
            OpStat(
                key=key,
                op=op["name"].replace("aten::", ""),
                shapes=tuple(tuple(int(v) for v in s) for s in op["shapes"]),
                dtypes=tuple(DTYPE.get(str(d).lower(), str(d)) for d in op.get("dtypes") or []),
                layout=layout(op["shapes"][0], strides[0]) if op["shapes"] and strides else "-",
                conv=conv_params(op),
                calls=len(times),
                total_ms=total / 1e3,
                first_ms=times[0] / 1e3,
                steady_ms=steady / 1e3,
                share=total / total_us if total_us else 0.0,
                flops=flops,
                bytes=moved,
                tflops=tflops,
                gbps=gbps,
                roofline=roof,
                modules=tuple(m for m in group.modules if m)[:8],
                source=where,
                kernels=tuple(sorted(group.kernels, key=lambda k: -group.kernels[k]))[:4],
                pids=tuple(group.pids),
                host_first_ms=host[0] / 1e3 if host else None,
                host_steady_ms=statistics.median(host[1:]) / 1e3 if host else None,
            )
        )
    out.sort(key=lambda r: -r.total_ms)
    return out


def repro(row: OpStat, device: str, backend: Mapping[str, Any]) -> str:
    """A standalone snippet that times the call as it ran."""
    conv = row.conv or {}
    dims = len(row.shapes[0]) - 2 if row.shapes else 2
    fn = f"torch.nn.functional.conv{dims}d"
    dtype = row.dtypes[0] if row.dtypes else "float32"
    lines = [
        "import time, torch",
        f"torch.backends.cudnn.enabled = {bool(backend.get('cudnn.enabled', True))}",
        f"dev, dt = {device!r}, torch.{dtype}",
        f"x = torch.randn({list(row.shapes[0])}, device=dev, dtype=dt)",
        f"w = torch.randn({list(row.shapes[1])}, device=dev, dtype=dt)",
    ]
    if row.layout == "channels-last":
        fmt = "channels_last" if dims == 2 else "channels_last_3d"
        lines.append(f"x = x.contiguous(memory_format=torch.{fmt})")
    bias = "None"
    if len(row.shapes) > 2 and row.shapes[2]:
        lines.append(f"b = torch.randn({list(row.shapes[2])}, device=dev, dtype=dt)")
        bias = "b"
    padding = conv.get("padding_mode") or conv.get("padding")
    call = (f"{fn}(x, w, {bias}, stride={conv.get('stride')}, padding={padding!r}, "
            f"dilation={conv.get('dilation')}, groups={conv.get('groups')})")  # fmt: skip
    if any(conv.get("pad_far") or ()):
        lines.append("# padding='same', odd total: torch pads the far side one more (F.pad first)")
    if conv.get("transposed"):
        call = (f"torch.nn.functional.conv_transpose{dims}d(x, w, {bias}, "
                f"stride={conv.get('stride')}, padding={conv.get('padding')}, "
                f"output_padding={conv.get('output_padding')}, groups={conv.get('groups')}, "
                f"dilation={conv.get('dilation')})")  # fmt: skip
    sync = "torch.cuda.synchronize()" if device == "cuda" else "pass"
    lines += [
        f"y = {call}",
        f"{sync}",
        "t = time.perf_counter()",
        "for _ in range(10):",
        f"    y = {call}",
        f"{sync}",
        "print(f'{(time.perf_counter() - t) / 10 * 1e3:.3f} ms per call')",
    ]
    return "\n".join(lines) + "\n"


def miopen_driver(row: OpStat) -> str | None:
    """The MIOpenDriver line for a 2-D conv (what MIOpen's own logging prints)."""
    conv = row.conv
    if not conv or len(row.shapes[0]) != 4 or conv["transposed"]:
        return None
    n, c, h, w = row.shapes[0]
    k, _cg, y, x = row.shapes[1]
    st, pd, dl = (_expand(conv[n_], 2) for n_ in ("stride", "padding", "dilation"))
    # padding="same" with an odd total: MIOpen gets the input torch padded on the far side.
    far = conv.get("pad_far") or [0, 0]
    h, w = h + far[0], w + far[1]
    base = {"float32": "conv", "float16": "convfp16", "bfloat16": "convbfp16"}
    kind = base.get(row.dtypes[0] if row.dtypes else "float32", "conv")
    return (
        f"MIOpenDriver {kind} -n {n} -c {c} -H {h} -W {w} -k {k} -y {y} -x {x} "
        f"-p {pd[0]} -q {pd[1]} -u {st[0]} -v {st[1]} -l {dl[0]} -j {dl[1]} "
        f"-g {conv['groups']} -F 1 -t 1"
    )


def _first_steady(row: OpStat) -> tuple[float, float]:
    """(first, steady) ms: device times, or for a conv on a GPU its host times where those
    show more first-call cost (a cuDNN autotune or a MIOpen Find searches synchronously)."""
    first, steady = row.first_ms, row.steady_ms
    hf, hs = row.host_first_ms, row.host_steady_ms
    if row.conv is not None and hf is not None and hs is not None and hf - hs > first - steady:
        return hf, hs
    return first, steady


def first_call(row: OpStat, total_ms: float, device: str) -> float | None:
    """What the first call adds over a steady one (ms), where that is first-call cost."""
    if row.calls < 2 or total_ms <= 0:
        return None
    first, steady = _first_steady(row)
    extra = first - steady
    floor = FIRST_CALL_MIN_MS_GPU if device == "cuda" else FIRST_CALL_MIN_MS_CPU
    if first < FIRST_CALL_RATIO * steady or extra / total_ms < FLAG_SHARE:
        return None
    return extra if extra >= floor else None


def _first_reason(row: OpStat) -> str:
    first, steady = _first_steady(row)
    where = " (host)" if first != row.first_ms else ""
    return f"first call {first:.0f}ms{where}, then {steady:.2f}ms"


def setting_fix(
    row: OpStat, hip: bool, device: str, backend: Mapping[str, Any], env: Mapping[str, str],
    callees: Sequence[str], startup_ms: float | None,
) -> tuple[str, Fix] | None:  # fmt: skip
    """(reason, fix) where a setting fixes what was measured: first-call cost of a conv that
    MIOpen's Find or cuDNN's benchmark autotune explains, or a kernel an op's calls ran that
    a setting `rocmfix env` exports avoids (the op says which: ``Op.kernel_ran``)."""
    for op in OPS:
        if row.op in op.calls and op.kernel_ran is not None:
            ran = op.kernel_ran(callees, hip, env)
            if ran is None or ran[1] is None:
                return None
            return f"{row.op} ran {ran[0]}", Fix(
                kind="env", command='eval "$(rocmfix env)"', why=ran[1]
            )
    if startup_ms is None or row.conv is None or device != "cuda":
        return None
    reason = _first_reason(row)
    if hip and env.get("MIOPEN_FIND_MODE", "").upper() not in ("FAST", "2"):
        why = ("MIOpen's Find searches its solvers at each new conv shape; FAST takes the "
               "best known one without searching (cuts search time, not kernel time)")  # fmt: skip
        return reason + " (MIOpen Find)", Fix(
            kind="env", command="export MIOPEN_FIND_MODE=FAST", why=why
        )
    if not hip and backend.get("cudnn.benchmark") and backend.get("cudnn.enabled", True):
        why = "cuDNN's benchmark mode times every algorithm at each new conv shape"
        return reason + " (cuDNN benchmark)", Fix(
            kind="setting", command="torch.backends.cudnn.benchmark = False", why=why
        )
    return None


def verdict(
    row: OpStat,
    forms: Sequence[Form] | None,
    patch: Patch | None,
    routed: bool,
    device: str,
    hip: bool,
    backend: Mapping[str, Any],
    *,
    total_ms: float = 0.0,
    env: Mapping[str, str] | None = None,
    callees: Sequence[str] = (),
) -> dict[str, Any]:
    """The fields of ``row`` the replay decides: forms, best, speedup, flagged, reason, fix."""
    if routed and patch is not None:
        return {"fix": Fix(kind="patched", patch_id=patch.id)}
    forms = forms or ()
    note = None
    base = next((f for f in forms if f.label == "as run" and f.ms), None)
    if forms and base is None:
        as_run = next((f for f in forms if f.label == "as run"), None)
        note = "the call as it ran: " + ((as_run.error or "no time") if as_run else "not replayed")
    others = [f for f in forms if f.label != "as run" and f.ok and f.ms]
    best = min(others, key=lambda f: f.ms or math.inf) if others and note is None else None
    if base is not None and base.ms and row.steady_ms > 0:
        apart = max(base.ms / row.steady_ms, row.steady_ms / base.ms)
        if apart > REPLAY_AGREES:
            # The replay did not reproduce the run (thread count, affinity, warm-up, a machine
            # under load): comparing its forms would be comparing noise.
            note = (f"the replay ran it in {base.ms:.2f}ms where the run's steady calls took "
                    f"{row.steady_ms:.2f}ms ({apart:.1f}x apart, more than "
                    f"{REPLAY_AGREES:.0f}x: other threads, load or warm-up)")  # fmt: skip
            best = None
    # Against the slower-looking of the run's own time and the replay's, never the noisier one.
    anchor = min(base.ms, row.steady_ms) if base is not None and base.ms else None
    speedup = anchor / best.ms if anchor and best and best.ms else None
    fields: dict[str, Any] = {"forms": tuple(forms), "replay_note": note,
                              "best": best.label if best else None, "speedup": speedup,
                              "flagged": False, "reason": None}  # fmt: skip
    hot = row.share >= FLAG_SHARE
    startup = first_call(row, total_ms, device)
    setting = setting_fix(row, hip, device, backend, env or {}, callees, startup)
    if setting is not None and (hot or startup is not None):
        reason, fix = setting
        op = patch.op if patch is not None else None
        if patch is not None and patch.realizes is not None and op and op.kernel_ran:
            # The op of an engine's wrapper: doctor measures its backends here, and the patch
            # selects the faster one (the setting stays the fix of every other such call).
            ran = op.kernel_ran(callees, hip, env or {})
            reason = f"{op.title}: {op.native} ran {ran[0] if ran else 'an unknown kernel'}"
            command = f"rocmfix doctor --op {op.name} && rocmfix apply --only {patch.id}"
            fix = Fix(kind="patch", patch_id=patch.id, command=command,
                      why=f"{patch.summary}; for other callers: {fix.why}")  # fmt: skip
        fields.update(flagged=True, reason=reason, fix=fix)
        return fields
    if hot and speedup is not None and speedup >= FLAG_SPEEDUP and best is not None:
        fields.update(flagged=True, reason=f"{speedup:.1f}x faster as {best.label}")
    elif (
        hot
        and row.roofline is not None
        and row.roofline < FLAG_ROOFLINE
        and row.steady_ms >= (ROOFLINE_MIN_MS_GPU if device == "cuda" else ROOFLINE_MIN_MS_CPU)
    ):
        # Shorter calls are bound by their launch, not by the kernel: no verdict on those.
        fields.update(flagged=True, reason=f"{row.roofline:.1%} of this machine's roofline")
    elif startup is not None:
        # First-call cost no setting explains (a one-time compile, a lazy init): a repro.
        reason = _first_reason(row)
        fields.update(flagged=True, reason=reason)
    gpu = device == "cuda"
    # The op's own fastest form names the scheme, where it is the fastest of all or itself
    # fast enough for a fix (reshape + matmul a hair ahead of the patch embed's F.linear).
    schemes = patch.op.replayed if patch is not None and patch.op else {}
    own = [f for f in others if f.label in schemes] if best is not None and startup is None else []
    mine = min(own, key=lambda f: f.ms or math.inf) if own else None
    mine_speedup = anchor / mine.ms if anchor and mine is not None and mine.ms else None
    if mine is not None and mine is not best and (mine_speedup or 0.0) < FLAG_SPEEDUP:
        mine = None
    scheme = schemes[mine.label].name if mine is not None else None
    # rocmfix's routes take GPU inputs only (CPU inputs run the stock line): a patch is the fix
    # on a GPU, where it changes what runs; on a torch that is not ROCm, apply needs --force.
    proposed = fields["flagged"] and scheme is not None and gpu
    if patch is not None and proposed and scheme in patch.scheme_names:
        command = f"rocmfix apply --only {patch.id}"
        if scheme != patch.default_scheme:
            command += f" --scheme {scheme}"
        if not hip:
            command += " --force"
        fields["fix"] = Fix(kind="patch", patch_id=patch.id, command=command,
                            speedup=mine_speedup, why=patch.summary)  # fmt: skip
    elif fields["flagged"] or patch is not None:
        flagged = fields["flagged"]
        fields["fix"] = Fix(
            kind="none",
            patch_id=patch.id if patch is not None else None,
            repro=repro(row, device, backend) if row.conv and flagged else None,
            driver=miopen_driver(row) if hip and flagged else None,
            why=_not_proposed(patch, row, fields, base, gpu) if patch is not None else None,
        )
    return fields


def _not_proposed(
    patch: Patch, row: OpStat, fields: Mapping[str, Any], base: Form | None, gpu: bool
) -> str:
    """What a patch that routes this op does, and why it is not the fix here."""
    labels = patch.op.replayed if patch.op is not None else {}
    own = [f for f in fields["forms"] if f.label in labels and f.ok and f.ms]
    if not gpu:
        why = "CPU inputs take the stock path (its routes take GPU inputs only)"
    elif fields["replay_note"]:
        why = "the replay gave no verdict"
    elif not fields["flagged"] and row.share < FLAG_SHARE:
        why = f"the op takes {row.share:.1%} of the run, under {FLAG_SHARE:.0%}"
    elif own and base is not None and base.ms:
        form = min(own, key=lambda f: f.ms or math.inf)
        speedup = min(base.ms, row.steady_ms) / (form.ms or math.inf)
        why = (f"its {form.label} form measured {speedup:.1f}x the op as it ran here, under "
               f"the {FLAG_SPEEDUP:.0f}x a fix needs")  # fmt: skip
        if speedup >= FLAG_SPEEDUP:  # not proposed for its first call, which no patch removes
            why = (f"its first call took {row.first_ms:.0f}ms, which the patch does not "
                   f"change (its {form.label} form measured {speedup:.1f}x on the steady "
                   "calls)")  # fmt: skip
    else:
        why = "the patch's formulation was not replayed here"
    return f"{patch.summary}; not proposed here: {why}"


def replay_calls(rows_: Sequence[OpStat], groups: Mapping[str, Group]) -> dict[str, Call]:
    """The hot convs the replay runs, by row key: each as it ran, and the op whose call it is
    (a transposed conv no op computes is not replayed)."""
    calls = {}
    for row in rows_:
        if row.share < FLAG_SHARE or row.conv is None:
            continue
        op, conv = groups[row.key].op, row.conv
        kind = conv_kind(op)
        if conv["transposed"] and kind is None:
            continue
        dims = len(row.shapes[0]) - 2
        calls[row.key] = Call(
            name=op["name"], shapes=op["shapes"], dtypes=list(row.dtypes), strides=op["strides"],
            op=kind or "", stride=_expand(conv["stride"], dims),
            padding=_expand(conv["padding"], dims), dilation=_expand(conv["dilation"], dims),
            groups=int(conv["groups"]), transposed=bool(conv["transposed"]),
            output_padding=_expand(conv["output_padding"], dims),
            padding_mode=conv.get("padding_mode"), pad_far=list(conv.get("pad_far") or ()),
        )  # fmt: skip
    return calls
