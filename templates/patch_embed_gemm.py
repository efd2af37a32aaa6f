"""Qwen2-VL patch embedding as a Triton GEMM (rocmfix scheme ``gemm``).

rocmfix dropped this file beside a Qwen-VL vision tower (vllm's ``qwen2_vl_vision_kernels.py``,
transformers' ``rocmfix_patch_embed.py``) and rewrote the patch embed's ``forward`` to call
:func:`triton_conv3d_patchify` instead of the Conv3d, whose MIOpen path takes seconds per
call on ROCm. ``rocmfix revert`` removes it.

The conv has kernel == stride and no padding, so it is exactly
``x.view(L, K) @ W.view(N, K).T (+ bias)`` with K = C*T*P*P (1176 for Qwen2-VL / MinerU2.5).
The module needs stdlib, torch, triton, its kernels (``patch_embed_kernels``) and the
``rocmfix_*`` support modules dropped beside it, never the package it sits in (vllm 0.8.x has
no ``tl``/``triton`` in ``vllm.triton_utils``). CPU inputs run the stock ``F.conv3d``.

Tile configs are data (``patch_embed_kernels.PATCH_EMBED_CONFIGS``, keyed by GPU arch, then by
precision class: ``"f16"`` for bf16/fp16 inputs, ``"fp32"`` for fp32). The shared
``rocmfix_kernel_config`` module, dropped beside this one, merges them with the tuned file and
``$ROCMFIX_PATCH_EMBED_CONFIG``; :func:`patchify_gemm` takes an explicit config, for
``rocmfix tune``/``doctor``. Nothing is tuned at inference time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from . import patch_embed_kernels as pk
from . import rocmfix_custom_op as rop
from . import rocmfix_kernel_config as kc
from . import rocmfix_kernel_support as ks
from . import rocmfix_triton as rt

SCHEME = "gemm"
OP_NAME = "patch_embed_gemm"
# The kernel's identity and configs, where rocmfix's tools look for them.
KERNEL, CONFIG_ENV, CONFIG = pk.KERNEL, pk.CONFIG_ENV, pk.CONFIG
PATCH_EMBED_CONFIGS = pk.PATCH_EMBED_CONFIGS
_gemm_ptr_kernel, _gemm_tma_kernel = pk.PTR_KERNEL, pk.TMA_KERNEL
triton, INTERPRETING = rt.triton, rt.INTERPRETING

try:
    # Host-side descriptors need no device-side scratch allocator (triton >= 3.4).
    from triton.tools.tensor_descriptor import TensorDescriptor

    _HAS_HOST_TMA = True
except Exception:  # noqa: BLE001
    TensorDescriptor = None  # type: ignore[assignment,misc]
    _HAS_HOST_TMA = False

# Plans by (device, dtype): a few per process.
_plan_cache: ks.BoundedCache[tuple[Any, ...], _Plan] = ks.BoundedCache(64)
# Weight descriptors by (address, shape, strides, dtype, block): the descriptor holds the weight,
# so its address cannot be reused by another tensor while the entry lives.
_w_desc_cache: ks.BoundedCache[tuple[Any, ...], Any] = ks.BoundedCache(8)
# Weights copied into rows padded to whole 128-byte lines, by (address, shape, strides, dtype,
# device, version counter): see _packed_weight. Each entry holds its source tensor too.
_packed_cache: ks.BoundedCache[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = (
    ks.BoundedCache(8)
)
# Prepared calls, by everything that fixes a call's launch but the tensors' addresses and
# values (see _call_key). Vision towers see a new M per image, so a few entries per model.
_calls: ks.BoundedCache[tuple[Any, ...], _Call] = ks.BoundedCache(64)
PACK_ROW_BYTES = 128


def clear_config_cache() -> None:
    """Forget the parsed tuned file, env config, arch queries, plans and packed weights."""
    CONFIG.clear()
    _plan_cache.clear()
    _calls.clear()
    _forget()


def _forget() -> None:
    """What an optimizer step makes stale: packed weights, descriptors (ks.derived)."""
    for cache in (_w_desc_cache, _packed_cache):
        cache.clear()


# Every optimizer step calls it: a fused step writes weights without moving their version.
ks.derived(_forget)


def precision_class(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "f16"


def resolve_config(
    device: torch.device | str | int | None = None, dtype: torch.dtype = torch.bfloat16
) -> dict[str, Any]:
    """The tile config of ``dtype`` inputs on ``device`` (see rocmfix_kernel_config)."""
    return CONFIG.resolve(kc.device_arch(device), ("any", precision_class(dtype)))


device_arch = kc.device_arch


# "SMs" of a persistent grid in Triton's CPU interpreter.
INTERPRETER_SM_COUNT = 4


# What a tile config too big for this GPU raises (see _run).
_OUT_OF_RESOURCES = (triton.runtime.errors.OutOfResources,) if rt.HAS_TRITON else ()


# --------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------


def _row_align(t: torch.Tensor, stride: int) -> int:
    # Largest power of two (elements, <= 16 bytes) dividing the row stride and the base address.
    align = max(1, 16 // t.element_size())
    while align > 1 and (stride % align or (t.data_ptr() // t.element_size()) % align):
        align //= 2
    return align


class _Plan:
    """A resolved config turned into launch settings once per device and dtype."""

    def __init__(self, cfg: Mapping[str, Any], device: torch.device) -> None:
        self.bm, self.bn, self.bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        self.group = cfg["GROUP_M"]
        self.opts = kc.launch_options(cfg)
        on_gpu, cc_major, sm_count = kc.gpu(device)
        # Host descriptors drive Hopper's TMA unit; the interpreter runs them too.
        where = (not kc.is_hip() and cc_major >= 9) if on_gpu else INTERPRETING
        self.tma = bool(cfg.get("tma")) and _HAS_HOST_TMA and where
        self.tma_min_m = int(cfg.get("tma_min_m", 0))
        # The interpreter runs persistent grids too (over INTERPRETER_SM_COUNT "SMs"), so the
        # CPU tests cover the persistent loop.
        self.persistent = bool(cfg.get("persistent")) and (on_gpu or INTERPRETING)
        self.occupancy = int(cfg.get("occupancy", 1))
        self.programs = self.occupancy * (sm_count if on_gpu else INTERPRETER_SM_COUNT)
        self.half = bool(cfg.get("epilogue_subtile")) and self.bn >= 32
        self.flatten = bool(cfg.get("flatten"))
        self.pack = bool(cfg.get("pack_weight"))


def _tma_ok(t: torch.Tensor) -> bool:
    # The TMA unit needs 16-byte aligned bases and row strides (1176 bf16 = 2352 bytes is).
    return (
        t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
    )


def _packed_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` with each row starting on a 128-byte line, copied once and cached.

    K = 1176 makes 2352-byte rows, so every other row starts 16 bytes into a 32-byte L2 sector
    and each 128-byte load of it touches five sectors instead of four. The weight is re-read
    from L2 for every row block of x, and padding its rows measured 11-23% faster on an H200
    for both kernels (docs/performance-patch-embed.md, item 11). x cannot be padded without
    a copy per call. The pad columns are zeros and never read: shapes stay [N, K].

    The key holds the tensor's version, so an in-place update through the tensor (``copy_``
    under ``no_grad``, ``load_state_dict``) makes a fresh copy. Writes through ``.data`` bypass
    the counter: vllm's weight loaders write that way, which is harmless at load time (before
    the first forward), but code that reloads weights into a live model must call
    :func:`clear_config_cache` afterwards. So do fused optimizer steps, which training runs
    after each optimizer step: that forgets the copies (ks.training_seen). Inference
    tensors keep no version counter and are used as they are.
    """
    align = max(1, PACK_ROW_BYTES // w.element_size())
    if w.stride(1) == 1 and w.stride(0) % align == 0 and w.data_ptr() % PACK_ROW_BYTES == 0:
        return w
    if w.is_inference():  # asking its version would raise, slowly
        return w
    version = int(w._version)
    key = (w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype, w.device, version)
    hit = _packed_cache.get(key)
    if hit is not None:
        return hit[1]
    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        # A copy recorded into a graph runs only at replay; an eager call before that would
        # read an unwritten buffer. Use the weight as it is until the next eager call.
        return w
    rows, cols = w.shape
    store = torch.zeros((rows, -(-cols // align) * align), dtype=w.dtype, device=w.device)
    packed = store[:, :cols]
    with torch.no_grad():
        packed.copy_(w)
    _packed_cache.put(key, (w, packed))
    return packed


def _weight_descriptor(w: torch.Tensor, bn: int, bk: int) -> Any:
    key = (w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype, w.device, bn, bk)
    desc = _w_desc_cache.get(key)
    if desc is None:
        desc = TensorDescriptor.from_tensor(w, [bn, bk])
        _w_desc_cache.put(key, desc)
    return desc


Launch = tuple[Any, tuple[int], tuple[Any, ...], dict[str, Any]]


def _launch(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    plan: _Plan,
    keep: bool = True,
) -> tuple[rt.Launcher, tuple[Any, ...]] | None:
    """Launch one call; with ``keep``, return the Launcher and arguments it used, which a
    later call with the same key (see :func:`_call_key`) repeats with its own tensors."""
    kernel, grid, args, kwargs = prepare_launch(a, w, bias, out, plan)
    launcher = rt.Launcher(kernel, grid, kwargs, device=rt.device_index(a))
    if not keep:
        launcher.launch_once(*args)
        return None
    launcher(*args)  # a config that does not fit raises here, before anything is kept
    return launcher, args


def _rebase(desc: Any, base: torch.Tensor) -> Any:
    # A descriptor is a record read at launch (base address, shape, strides, block): copying
    # the first call's record skips from_tensor's checks, which that call made and the call
    # key holds (shape, strides, 16-byte alignment).
    clone = copy.copy(desc)
    clone.base = base
    return clone


class _Call:
    """A call's launch made once per layout: the Launcher that Triton's first call adopted and
    every argument after the per-call tensors; for the descriptor kernel, the first call's x
    and output descriptors, rebased each call. The weight is read per call, packed
    (_packed_weight's cache sees its address and version)."""

    __slots__ = ("a_desc", "block", "c_desc", "device", "dtype", "launcher", "pack", "shape",
                 "tail", "w_stride")  # fmt: skip

    def __init__(
        self, launcher: rt.Launcher, args: tuple[Any, ...], plan: _Plan, w: torch.Tensor,
        out: torch.Tensor,
    ) -> None:  # fmt: skip
        self.launcher = launcher
        tma = launcher.kernel is _gemm_tma_kernel
        self.a_desc = args[0] if tma else None
        self.c_desc = args[2] if tma else None
        self.block = (plan.bn, plan.bk)
        self.pack, self.w_stride = plan.pack, w.stride(0)
        self.tail = args[4:]
        self.shape, self.dtype, self.device = out.shape, out.dtype, out.device

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        w = weight.flatten(1)
        if self.pack:
            w = _packed_weight(w)
        if w.stride(0) != self.w_stride:
            return None  # unpacked in a capture (see _packed_weight): the full path
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        b = out if bias is None else bias
        if self.a_desc is None:
            self.launcher(x, w, b, out, *self.tail)
        else:
            w_desc = _weight_descriptor(w, *self.block)
            self.launcher(_rebase(self.a_desc, x), w_desc, _rebase(self.c_desc, out), b,
                          *self.tail)  # fmt: skip
        return out


def _call_key(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """Everything Triton specialises on and prepare_launch reads: the tensors' layouts."""
    return (
        rt.layout_key(x),
        rt.layout_key(weight),
        None if bias is None else rt.layout_key(bias),
    )


def _cached_call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x.flatten(1) @ weight.flatten(1).T (+ bias)`` on a GPU, its launch prepared once per
    key. Eager callers pay Triton's and torch's per-call costs on the host: a repeat call is
    one key, the packed weight's lookup, one torch.empty and the compiled kernel's runner;
    x's flatten view is left out, since the kernel reads its rows by address and stride."""
    key = _call_key(x, weight, bias)
    hit = _calls.get(key)
    if hit is not None:
        out = hit(x, weight, bias)
        if out is not None:
            return out
    a = x.flatten(1)
    w = weight.flatten(1)
    plan = _plan_for(a.device, a.dtype)
    out, used = _run(a, w, bias, plan, None)
    if (
        used is not None
        # Views, not copies: a later call passes x itself and flattens the weight again.
        and a.data_ptr() == x.data_ptr()
        and w.data_ptr() == weight.data_ptr()
        # Anything converted or copied per call stays on this path.
        and weight.dtype == x.dtype
        and (bias is None or (bias.dtype == x.dtype and bias.stride(0) == 1))
        # A capture leaves the weight unpacked for this call only (see _packed_weight).
        and not (x.is_cuda and torch.cuda.is_current_stream_capturing())
    ):
        launcher, args = used
        packed = _packed_weight(w) if plan.pack and w.numel() > 0 else w
        _calls.put(key, _Call(launcher, args, plan, packed, out))
    return out


def prepare_launch(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    plan: _Plan,
) -> Launch:
    """The kernel, grid, arguments and launch options of one call, not launched."""
    M, K = a.shape
    N = w.shape[0]
    bm, bn, bk = plan.bm, plan.bn, plan.bk
    upcast = INTERPRETING and a.dtype in (torch.bfloat16, torch.float16)
    bias_arg = bias if bias is not None else out
    tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
    progs = min(tiles, plan.programs) if plan.persistent else tiles
    if plan.tma and plan.tma_min_m <= M and _tma_ok(a) and _tma_ok(w) and _tma_ok(out):
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        w_desc = _weight_descriptor(w, bn, bk)
        c_desc = TensorDescriptor.from_tensor(out, [bm, bn // 2 if plan.half else bn])
        args = (a_desc, w_desc, c_desc, bias_arg, M, N, K, progs)
        kwargs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=plan.group,
                      HAS_BIAS=bias is not None, UPCAST=upcast, EPILOGUE_SUBTILE=plan.half,
                      FLATTEN=plan.flatten, **plan.opts)  # fmt: skip
        return _gemm_tma_kernel, (progs,), args, kwargs
    aligns = (_row_align(a, a.stride(0)), _row_align(w, w.stride(0)))
    args, kwargs = pk.ptr_launch(a, w, bias, out, aligns, progs, plan, upcast, plan.opts)
    return _gemm_ptr_kernel, (progs,), args, kwargs


def _check(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[1]:
        raise ValueError(f"patch embed: bad shapes x{tuple(a.shape)} weight{tuple(w.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"patch embed: bias{tuple(bias.shape)} for {w.shape[0]} channels")


def _plan_for(device: torch.device, dtype: torch.dtype) -> _Plan:
    # The env var and the tuned file are read at the first call per device and dtype, not on
    # every call (each os.environ lookup is host time); clear_config_cache() re-reads them.
    key = (device, dtype)
    plan = _plan_cache.get(key)
    if plan is None:
        plan = _Plan(resolve_config(device, dtype), device)
        _plan_cache.put(key, plan)
    return plan


def _run(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    plan: _Plan,
    out: torch.Tensor | None,
    keep: bool = True,
) -> tuple[torch.Tensor, tuple[rt.Launcher, tuple[Any, ...]] | None]:
    """The output, and with ``keep`` the launch made (None where nothing was launched)."""
    _check(a, w, bias)
    if w.dtype != a.dtype:
        w = w.to(a.dtype)
    elif plan.pack and w.dim() == 2 and w.numel() > 0:
        w = _packed_weight(w)
    if bias is not None and bias.dtype != a.dtype:
        bias = bias.to(a.dtype)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()  # the kernel reads bias[n] at bias_ptr + n
    shape = (a.shape[0], w.shape[0])
    if out is None:
        out = torch.empty(shape, dtype=a.dtype, device=a.device)
    elif tuple(out.shape) != shape or out.dtype != a.dtype or not out.is_contiguous():
        raise ValueError(f"patch embed: out must be contiguous {shape} {a.dtype}")
    used = None
    if shape[0] > 0 and shape[1] > 0:
        try:
            used = _launch(a, w, bias, out, plan, keep)
        except _OUT_OF_RESOURCES as exc:
            # A tile config too big for this GPU or triton build (a tuned file from elsewhere,
            # a compiler that needs more shared memory than the one measured): one stage less
            # first, as long as that still pipelines, then the portable default. The plan
            # that fits replaces the cached one, so later calls do not fail again.
            ks.warn_once(
                f"oor:{plan.bm}x{plan.bn}x{plan.bk}s{plan.opts['num_stages']}",
                f"rocmfix: patch-embed config does not fit ({exc}); using a smaller one",
            )
            for smaller in _smaller_plans(plan, a):
                try:
                    used = _launch(a, w, bias, out, smaller, keep)
                except _OUT_OF_RESOURCES:
                    continue
                with rt.LOCK:
                    key = (a.device, a.dtype)
                    if _plan_cache.get(key) is plan:
                        _plan_cache.put(key, smaller)
                break
            else:
                raise
    return out, used


def prepare(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> Launch:
    """What one call of ``patchify_gemm`` would launch, from the same config resolution and
    preparation (the weight packed, the output made), without launching: rocmfix's
    ahead-of-time compile check compiles it for GPUs it does not have."""
    plan = _explicit_plan(a, config or {})
    if plan.pack and w.numel() > 0:
        w = _packed_weight(w)
    out = torch.empty((a.shape[0], w.shape[0]), dtype=a.dtype, device=a.device)
    return prepare_launch(a, w, bias, out, plan)


def _smaller_plans(plan: _Plan, a: torch.Tensor) -> Iterator[_Plan]:
    for stages in range(plan.opts["num_stages"] - 1, 1, -1):
        smaller = copy.copy(plan)
        smaller.opts = {**plan.opts, "num_stages": stages}
        yield smaller
    yield _Plan(CONFIG.shipped_config("default", ("any", precision_class(a.dtype))), a.device)


def patchify_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a[M, K] @ w[N, K].T (+ bias)`` with the Triton kernel and an explicit tile config.

    This is the entry point for ``rocmfix tune``/``doctor``; ``config`` keys override
    :func:`resolve_config` for ``a``'s device. ``out`` (contiguous ``[M, N]``, ``a``'s dtype)
    lets a caller pre-poison the result. It always runs Triton (the caller picks the device),
    and raises if triton is missing.
    """
    if not rt.HAS_TRITON:
        raise RuntimeError("triton is not importable")
    plan = _plan_for(a.device, a.dtype) if config is None else _explicit_plan(a, config)
    return _run(a, w, bias, plan, out, keep=False)[0]


def _explicit_plan(a: torch.Tensor, config: Mapping[str, Any]) -> _Plan:
    """The resolved config for ``a`` with ``config``'s fields over it (tune, doctor)."""
    cfg = resolve_config(a.device, a.dtype)
    cfg.update(CONFIG.validate(config))
    return _Plan(cfg, a.device)


def _linear_fallback(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(a, w.to(a.dtype), None if bias is None else bias.to(a.dtype))


def _impl(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The op on real tensors: the cached launch on a GPU (and under the interpreter), else
    F.linear; F.linear too where the kernel fails."""
    if not (a.is_cuda or INTERPRETING):
        return _linear_fallback(a, w, bias)
    return _guarded(_cached_call, _linear_fallback, a, w, bias)


def _guarded(kernel: Callable[..., torch.Tensor], stock: Callable[..., torch.Tensor],
             *args: Any) -> torch.Tensor:  # fmt: skip
    """``kernel(*args)``; where triton is missing or the kernel fails, ``stock(*args)`` first,
    then one warning, which cannot raise."""
    try:
        if rt.HAS_TRITON:
            return kernel(*args)
        failure = "triton is not importable"
    except Exception as exc:  # noqa: BLE001 - a dropped kernel must never take the model down
        failure = f"the kernel failed ({type(exc).__name__}: {exc})"
    y = stock(*args)
    ks.warn_once(failure.split(":")[0], f"rocmfix: patch embed: {failure}; running the stock op")
    return y


def _impl_fake(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return a.new_empty((a.shape[0], w.shape[0]))


def _graph(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The op as Inductor sees it: ``patch_embed_kernels.graph`` with the eager plan, or
    F.linear."""
    if not pk.takes(x, weight, bias):
        return _linear_fallback(x, weight, bias)
    _check(x, weight, bias)
    plan = _Plan(resolve_config(x.device, x.dtype), x.device)
    return pk.graph(x, weight, bias, plan, PACK_ROW_BYTES)


# Eager calls never reach the op (triton_conv3d_patchify calls _cached_call): it is the
# compiler's node, a triton op where torch has them (Inductor launches the kernel), else opaque.
_OP = rop.register_triton_op(
    OP_NAME,
    "(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    _graph,
    _impl,
    _impl,
    _impl_fake,
)


def triton_conv3d_patchify(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Conv3d with kernel == stride on ``x[L, C, T, P, P]`` and ``weight[N, C, T, P, P]``.

    Returns ``[L, N]`` in ``x``'s dtype, computed as one GEMM with fp32 accumulation.
    """
    if (not x.is_cuda and not INTERPRETING) or ks.training(x, weight, bias):
        # CPU inputs keep the stock op, bit for bit; so does a call autograd records (a vision
        # tower being fine-tuned): the kernel's output would carry no gradient to the weight.
        return _stock(x, weight, bias)
    if not rop.is_compiling():
        if ks.any_autocast() or torch._C._get_tracing_state() is not None:
            # Autocast runs the stock conv in its dtype (the GEMM keeps x's); a torch.jit
            # trace records no Triton launch.
            return _stock(x, weight, bias)
        # Eager: the implementation directly; the dispatcher round trip to a Python kernel is
        # several microseconds of host time per call. (The interpreter takes this path too,
        # so the CPU tests cover it.)
        return _guarded(_cached_call, _stock, x, weight, bias)
    if ks.autocasting(x):
        return _stock(x, weight, bias)
    # torch.compile sees one opaque op with a fake-tensor rule. flatten(1), not
    # reshape(L, -1): the latter is ambiguous for an empty batch.
    out: torch.Tensor = _OP(x.flatten(1), weight.flatten(1), bias)
    return out


def _stock(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:])).flatten(1)


def conv3d(x: torch.Tensor, weight: torch.Tensor, bias: Any, *call: Any) -> torch.Tensor:
    """``F.conv3d`` with one patch in each input row (its size the kernel's, no padding or
    dilation, one group) through the Triton GEMM, for GPU tensors or the interpreter: what
    ``rocmfix profile`` replays. Any other call raises NotImplementedError."""
    _stride, padding, dilation, groups = call  # one patch a row: any stride
    if (not x.is_cuda and not INTERPRETING) or x.dim() != 5 or groups != 1:
        raise NotImplementedError("the GEMM runs 3-D convs of GPU tensors")
    if x.shape[2:] != weight.shape[2:] or padding != [0, 0, 0] or dilation != [1, 1, 1]:
        raise NotImplementedError("not one patch in each input row")
    return triton_conv3d_patchify(x, weight, bias)[:, :, None, None, None]
