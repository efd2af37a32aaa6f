"""Plumbing the newer rocmfix kernel templates share (rocmfix template).

rocmfix drops this file, under this name, beside the kernel modules that import it (the
depthwise and transposed convs); ``rocmfix revert`` removes it with them. Standard library
and torch only.

- :class:`BoundedCache`: the one cache type, a map of fixed size read at a dict's speed;
- :func:`fold_bn`: an eval-mode ``BatchNorm2d`` (and the conv's bias) as a per-channel scale
  and shift, recomputed only when one of its tensors changes;
- :func:`act_code`: the activations a kernel can apply in its store;
- :func:`pair`: a conv's stride or padding as two ints (the depthwise and transposed convs);
- :func:`training` / :func:`training_seen`: a call autograd records takes the stock modules,
  and everything derived from the layers' tensors is forgotten;
- :func:`warn_once`: the one way a dropped module reports a failure, which never raises.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Optional, TypeVar

import torch

K = TypeVar("K")
V = TypeVar("V")


warned: set[str] = set()  # the keys warned about (rocmfix_kernel_config.clear forgets them)
_warn_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """One ``RuntimeWarning`` per ``key`` and process (a kernel runs thousands of times a
    page), which can never raise: under ``python -W error`` or pytest's ``filterwarnings =
    error`` a warning turned exception would leave the user's forward, the one thing a
    dropped module must not do. Such a filter gets the warning shown instead; an ``ignore``
    still silences it; a ``showwarning`` that raises loses it. Callers compute the stock
    result first, then report."""
    with _warn_lock:
        if key in warned:
            return
        warned.add(key)
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:  # noqa: BLE001 - an "error" filter, or a showwarning that raises
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("always", RuntimeWarning)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def failed(what: str, exc: Exception, then: str = "running the stock modules") -> None:
    """The one report of a dropped module's failure (:func:`warn_once`, once per ``what``
    and kind of exception): ``what`` failed, with the exception, and what runs instead."""
    kind = type(exc).__name__
    warn_once(f"{what}:{kind}", f"rocmfix: {what} failed ({kind}: {exc}); {then}")


class BoundedCache(dict[K, V]):
    """A map that forgets the entry stored first beyond ``size``. A lookup is the plain
    dict's ``get`` (one C call, read on every kernel call): no recency to update, so a full
    cache drops the key planned first, not the one used last. Writes take a lock."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self._lock = threading.Lock()

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self.pop(key, None)
            self[key] = value
            while len(self) > self.size:
                del self[next(iter(self))]

    def clear(self) -> None:
        with self._lock:
            super().clear()


# The activations a kernel applies in its store, by code; 0 is none. GELU only in its exact
# (erf) form: the tanh approximation is called as a module after the kernel.
ACT_NONE, ACT_RELU, ACT_SILU, ACT_GELU, ACT_HARDSWISH = 0, 1, 2, 3, 4
_ACTS: dict[type, int] = {
    torch.nn.Identity: ACT_NONE,
    torch.nn.ReLU: ACT_RELU,
    torch.nn.SiLU: ACT_SILU,
    torch.nn.GELU: ACT_GELU,
    torch.nn.Hardswish: ACT_HARDSWISH,
}


# torch's global forward hooks, as the dicts register_module_forward_(pre_)hook fill in place.
_GLOBAL_HOOKS = [getattr(torch.nn.modules.module, name, {})
                 for name in ("_global_forward_hooks", "_global_forward_pre_hooks")]  # fmt: skip


def global_hooks() -> bool:
    return bool(_GLOBAL_HOOKS[0] or _GLOBAL_HOOKS[1])


def hooked(module: Any) -> bool:
    # Modules always have both dicts (torch >= 1.0); anything else has no hooks to honour.
    try:
        return bool(module._forward_hooks or module._forward_pre_hooks)
    except AttributeError:
        return False


# The dtypes every dropped entry computes in.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def plain(x: torch.Tensor, layer: Any, cls: Any) -> bool:
    """Whether ``layer`` is a ``cls`` (``nn.Conv2d``, ``nn.ConvTranspose2d``) that runs torch's
    own forward, zero-padded, with no hooks of its own, on ``x``, 4-D in one of :data:`DTYPES`:
    a call whose module an entry may replace (each checks its own geometry after)."""
    return (
        isinstance(layer, cls)
        and type(layer).forward is cls.forward
        and getattr(type(layer), "_conv_forward", None) is getattr(cls, "_conv_forward", None)
        and not hooked(layer)
        and layer.padding_mode == "zeros"
        and x.dim() == 4
        and x.dtype in DTYPES
    )


def act_code(act: Any) -> int | None:
    """The store's code for ``act`` (None: ACT_NONE), or None where the module must be called
    itself: an unknown type or subclass, a hook that would see it called, GELU's tanh form,
    an in-place ReLU is fine (the kernel's output is its own)."""
    if act is None:
        return ACT_NONE
    code = _ACTS.get(type(act))
    if code is None or hooked(act):
        return None
    if code == ACT_GELU and getattr(act, "approximate", "none") != "none":
        return None
    return code


def apply_act(y: torch.Tensor, code: int) -> torch.Tensor:
    """What the store's ``code`` computes, with torch ops (the no-Triton path of a custom op)."""
    if code == ACT_RELU:
        return torch.relu(y)
    if code == ACT_SILU:
        return torch.nn.functional.silu(y)
    if code == ACT_GELU:
        return torch.nn.functional.gelu(y)
    if code == ACT_HARDSWISH:
        return torch.nn.functional.hardswish(y)
    return y


Fold = tuple[Optional[torch.Tensor], Optional[torch.Tensor]]  # evaluated: 3.9's syntax
_folds: BoundedCache[tuple[int, int], tuple[Any, ...]] = BoundedCache(512)


def foldable_bn(bn: Any) -> bool:
    """An ``nn.BatchNorm2d`` (not a subclass) in eval mode with running statistics and no
    hooks: the one a kernel may apply as a scale and shift."""
    return (
        type(bn) is torch.nn.BatchNorm2d
        and not bn.training
        and not hooked(bn)
        and bn._buffers.get("running_mean") is not None
        and bn._buffers.get("running_var") is not None
    )


def fold_bn(bn: Any, bias: torch.Tensor | None, *, versioned: bool = False) -> Fold | None:
    """``bn(y + bias)`` as ``y * scale + shift`` per channel (fp32, contiguous), either of
    them None where it is the identity; None where it cannot be folded (see
    :func:`foldable_bn`), or where autograd records through the BatchNorm's parameters.

    Computed once per (BatchNorm, bias) and reused while the statistics, affine parameters,
    bias and eps are the same tensors at the same addresses and versions (an in-place update,
    a ``load_state_dict`` or a ``.to()`` changes one of them), and while the BatchNorm's
    ``num_batches_tracked`` keeps its version: a train-mode forward updates the running
    statistics inside aten's batch_norm, which leaves their versions alone, and counts the
    batch with an in-place add that moves it. Writes that move no version (a fused optimizer's
    step, ``.data`` writes) are what :func:`training_seen` and ``clear_config_cache`` are for.
    Inference tensors have no version to see an update by: folded anew each call, or with
    ``versioned`` not folded (None), for a caller that keys its own plans by the versions.
    """
    if bn is None:
        if bias is None:
            return None, None
        if torch.is_grad_enabled() and bias.requires_grad:
            return None
        return None, bias.detach().float().contiguous()
    if not foldable_bn(bn):
        return None
    buffers, params = bn._buffers, bn._parameters
    tensors = (
        buffers["running_mean"],
        buffers["running_var"],
        params.get("weight"),
        params.get("bias"),
        bias,
    )
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return None
    held = (*tensors, buffers.get("num_batches_tracked"))
    # eps, then each tensor's id, address and version, compared in one C call: the entry holds
    # the tensors it stamped, so a live tensor with a held one's id is that tensor.
    state: list[Any] = [bn.eps]
    try:
        for t in held:
            state += (0, 0, 0) if t is None else (id(t), t.data_ptr(), t._version)
    except RuntimeError:  # inference tensors
        return None if versioned else _fold(tensors, bn.eps)
    key = (id(bn), id(bias))
    seen = _folds.get(key)
    if seen is None or seen[0] != state:
        scale, shift = _fold(tensors, bn.eps)
        seen = (state, held, scale, shift)
        _folds.put(key, seen)
    return seen[2], seen[3]


def clear_folds() -> None:
    """Forget every cached fold (``clear_config_cache`` of a kernel)."""
    _folds.clear()


def training(x: torch.Tensor, *tensors: torch.Tensor | None, bn: Any = None) -> bool:
    """Whether autograd records this call: grad mode on, and ``x``, one of ``tensors`` (the
    layer's weight and bias) or a parameter of the BatchNorm ``bn`` requiring grad (a
    fine-tuned BatchNorm after a frozen conv). Such a call runs the stock modules, which have
    a backward."""
    if not torch.is_grad_enabled():
        return False
    if x.requires_grad or any(t is not None and t.requires_grad for t in tensors):
        return True
    params = getattr(bn, "_parameters", None) or {}
    return any(t is not None and t.requires_grad for t in params.values())


# Every dropped kernel module's forgetting of what it derived from layers' tensors (plans,
# replays, packed weights, folds), process-wide: the modules dropped into different packages
# (transformers', MinerU's) keep caches of their own, and one optimizer step can write the
# tensors of any of them. In sys.modules, so every import of this file shares one list and one
# optimizer hook; weak references, so a module imported afresh (tests) can go.
_REGISTRY = "_rocmfix_derived_caches"
_registry_lock = threading.Lock()


def _registry() -> Any:
    holder = sys.modules.get(_REGISTRY)
    if holder is None:
        holder = types.ModuleType(_REGISTRY)
        holder.__dict__.update(forgets=[], hooked=False)
        sys.modules[_REGISTRY] = holder
    return holder


def derived(forget: Callable[[], None]) -> None:
    """Register a kernel module's ``forget`` (a module-level function), called by
    :func:`training_seen` after every optimizer step in the process."""
    with _registry_lock:
        holder = _registry()
        holder.forgets.append(weakref.ref(forget))
        if not holder.hooked:
            try:  # torch >= 2.0
                from torch.optim.optimizer import register_optimizer_step_post_hook
            except ImportError:
                pass
            else:
                register_optimizer_step_post_hook(_after_step)
            holder.hooked = True


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    # A step writes parameters, and a fused one moves no version (AdamW(fused=True), the
    # default of transformers' Trainer on torch >= 2.8). Hooked on the step itself, not on the
    # training forward: an inference call between the forward and the step, or a forward
    # under torch.compile (traced code has no side effects), would plan the old values anew.
    # It forgets every layer's plans, frozen ones' too: they plan again once a step.
    with contextlib.suppress(Exception):  # the user's step must not fail for rocmfix
        training_seen()


def training_seen() -> None:
    """An optimizer step may have written the layers' tensors without moving their versions
    (a fused step does): every registered kernel module forgets what it derived from them
    (:func:`derived`: its plans, replays, packed weights, and the folds), and the next
    inference call derives them afresh. (BatchNorm's train-mode forward, which updates the
    running statistics without moving their versions either, moves its batch count's: the
    folds and replays stamp it.)"""
    with _registry_lock:
        forgets = list(_registry().forgets)
    for ref in forgets:
        forget = ref()
        if forget is not None:
            forget()


derived(clear_folds)


def _fold(tensors: tuple[Any, ...], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    mean, var, gamma, beta, bias = tensors
    with torch.no_grad():
        scale, shift = _fold_math(mean, var, gamma, beta, bias, eps)
    return scale.contiguous(), shift.contiguous()


def _fold_math(
    mean: Any, var: Any, gamma: Any, beta: Any, bias: Any, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    scale = torch.rsqrt(var.float() + eps)
    if gamma is not None:
        scale = scale * gamma.float()
    centre = -mean.float() if bias is None else bias.float() - mean.float()
    shift = centre * scale
    if beta is not None:
        shift = shift + beta.float()
    return scale, shift


def fold_traced(bn: Any, bias: torch.Tensor | None) -> Fold:
    """:func:`fold_bn` as plain torch ops, for ``torch.compile`` to trace (no cache, no
    version reads); the caller checked :func:`foldable_bn`."""
    if bn is None:
        return None, None if bias is None else bias.float()
    return _fold_math(bn.running_mean, bn.running_var, bn.weight, bn.bias, bias, bn.eps)


def pair(v: Any) -> tuple[int, int] | None:
    """A conv's stride or padding as two ints, or None where it is neither an int nor two."""
    if type(v) is int:
        return v, v
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(type(i) is int for i in v):
        return int(v[0]), int(v[1])
    return None


def layer_hooked(layer: torch.nn.Module, bn: Any, act: Any) -> bool:
    """Whether a hook would see the modules called, or ``bn`` trains (per call: hooks of
    ``layer``, an ``nn.Module``, read directly)."""
    return bool(
        layer._forward_hooks
        or layer._forward_pre_hooks
        or (bn is not None and (bn.training or hooked(bn)))
        or (act is not None and hooked(act))
        or global_hooks()
    )


try:
    torch.is_autocast_enabled("cpu")
    _AUTOCAST_BY_DEVICE = True
except TypeError:  # torch < 2.4: no device argument
    _AUTOCAST_BY_DEVICE = False


# Whether any autocast is on (one C call; the replays ask it every call): autocast would run
# a stock conv in its lower dtype where a kernel keeps x's.
any_autocast: Callable[[], bool] = getattr(
    torch._C, "_is_any_autocast_enabled",
    lambda: torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled(),
)  # fmt: skip


def autocasting(x: torch.Tensor) -> bool:
    """Whether autocast is on for ``x``'s device (dynamo folds the call to a constant)."""
    if _AUTOCAST_BY_DEVICE:
        return bool(torch.is_autocast_enabled(x.device.type))
    return bool(torch.is_autocast_enabled() if x.is_cuda else torch.is_autocast_cpu_enabled())


def stock(
    x: torch.Tensor,
    layer: Callable[[torch.Tensor], torch.Tensor],
    bn: Callable[[torch.Tensor], torch.Tensor] | None,
    act: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """``act(bn(layer(x)))`` as the patched code called them, modules and hooks and all."""
    y = layer(x)
    if bn is not None:
        y = bn(y)
    if act is not None:
        y = act(y)
    return y
