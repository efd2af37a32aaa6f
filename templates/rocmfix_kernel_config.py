"""Which tile config a rocmfix kernel runs on this GPU (rocmfix template, shared by the
Triton kernels).

rocmfix drops this file, under this name, beside every Triton kernel module it drops into a
package (vllm, transformers, DocLayout-YOLO); ``rocmfix revert`` removes it with them. The
kernels import it relatively, so the copy they use is always the one dropped with them.
Standard library and torch only (and the support modules beside it).

A kernel's config comes from three sources, each merged key by key over the one before:

1. the kernel's shipped configs;
2. the tuned file (``$ROCMFIX_TUNED_FILE``, else ``$XDG_CONFIG_HOME/rocmfix/tuned.json`` or
   ``~/.config/rocmfix/tuned.json``), which ``rocmfix tune`` writes;
3. the kernel's environment variable, a JSON object.

Inside the first two, the entry for ``"default"`` applies first and the entry for this GPU's
arch (``gfx1100``, ``gfx942``, ``sm_90``, ...) over it.

An entry is either a flat config or layers keyed from least to most specific; each call names
the layers that apply to it (``"any"``, then a precision class, a shape class, ...). A source
that does not validate is ignored as a whole, with one warning that says what is wrong: a
half-applied config is one nobody measured. A config a caller passes explicitly
(``rocmfix tune``) raises instead. Files and environment variables are read once per process
and setting; :meth:`KernelConfig.clear` forgets them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from . import rocmfix_kernel_support as ks
from . import rocmfix_triton as rt

TUNED_FILE_ENV = "ROCMFIX_TUNED_FILE"
TUNED_SCHEMA = 1
# Passed to a launch on ROCm only; NVIDIA's backend rejects them.
HIP_LAUNCH_KEYS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")

Check = Callable[[Any], Any]

_lock = rt.LOCK
_gpu_cache: dict[int, tuple[str, int, int]] = {}
_tuned_cache: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class Emulation:
    """A GPU to prepare launches for without having it: rocmfix's ahead-of-time compile check
    resolves configs and builds launch arguments as the kernels would on that GPU, then
    compiles them for it."""

    arch: str
    hip: bool
    cc_major: int = 0
    sm_count: int = 0


_emulation: Emulation | None = None


@contextlib.contextmanager
def emulating(emulation: Emulation) -> Iterator[None]:
    global _emulation
    before, _emulation = _emulation, emulation
    try:
        yield
    finally:
        _emulation = before


def is_hip() -> bool:
    if _emulation is not None:
        return _emulation.hip
    return bool(getattr(torch.version, "hip", None))


def _facts(index: int) -> tuple[str, int, int]:
    """GPU ``index``'s arch, CUDA compute capability's major (0 on ROCm) and count of SMs/CUs,
    read once."""
    cached = _gpu_cache.get(index)
    if cached is None:
        props = torch.cuda.get_device_properties(index)
        if is_hip():
            arch = (getattr(props, "gcnArchName", "") or "").split(":")[0] or "unknown"
        else:
            arch = f"sm_{props.major}{props.minor}"
        major = 0 if is_hip() else int(props.major)
        cached = _gpu_cache[index] = (arch, major, int(props.multi_processor_count))
    return cached


def gpu(device: torch.device) -> tuple[bool, int, int]:
    """Whether ``device`` is a GPU, its CUDA compute capability's major (0 on ROCm) and its
    count of SMs/CUs."""
    if _emulation is not None:
        return True, _emulation.cc_major, _emulation.sm_count
    if device.type != "cuda":
        return False, 0, 0
    _arch, major, sms = _facts(
        device.index if device.index is not None else torch.cuda.current_device()
    )
    return True, major, sms


def device_arch(device: torch.device | str | int | None = None) -> str:
    """``gfxNNNN`` on ROCm, ``sm_XY`` on CUDA, ``"cpu"`` for anything that is not a GPU, and
    ``"unknown"`` when the driver will not say; the last two read the ``"default"`` configs."""
    if _emulation is not None:
        return _emulation.arch
    try:
        if isinstance(device, int):
            dev = torch.device("cuda", device)
        else:
            dev = torch.device(device if device is not None else "cuda")
        if dev.type != "cuda" or not torch.cuda.is_available():
            return "cpu"
        return _facts(dev.index if dev.index is not None else torch.cuda.current_device())[0]
    except Exception:  # noqa: BLE001 - a broken driver must not break inference
        return "unknown"


def tuned_file_path() -> str:
    explicit = os.environ.get(TUNED_FILE_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "rocmfix", "tuned.json")


def launch_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The launch keywords of a resolved config: warps, stages and, on ROCm, its HIP options."""
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    if is_hip():
        options.update({k: config[k] for k in HIP_LAUNCH_KEYS if k in config})
    return options


# ------------------------------------------------------------------------------ validation


def pow2(low: int, high: int) -> Check:
    def check(value: Any) -> Any:
        ok = type(value) is int and low <= value <= high and value & (value - 1) == 0
        if not ok:
            raise ValueError(f"a power of two in [{low}, {high}]")
        return value

    return check


def integer(low: int, high: int) -> Check:
    def check(value: Any) -> Any:
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"an integer in [{low}, {high}]")
        return value

    return check


def flag(value: Any) -> Any:
    """true/false (0/1 from older tuned files are read as the same)."""
    if type(value) is bool:
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise ValueError("true or false")


def one_of(*choices: str) -> Check:
    def check(value: Any) -> Any:
        if value not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return value

    return check


# Keys every tile config may hold, whatever the kernel.
COMMON_FIELDS: dict[str, Check] = {
    "BLOCK_M": pow2(16, 512),
    "BLOCK_N": pow2(16, 512),
    "BLOCK_K": pow2(16, 512),
    "num_warps": pow2(1, 16),
    "num_stages": integer(1, 8),
    "waves_per_eu": integer(0, 16),
    "matrix_instr_nonkdim": integer(0, 64),
    "kpack": integer(0, 8),
}


# A tuned file holds a few configs per arch; anything far larger is not one rocmfix wrote.
CONFIG_LIMIT = 1 << 20


def _read_config_file(path: str) -> str | None:
    """The text of the regular file at ``path``, None if nothing is there. Opened
    non-blocking (a FIFO must not hang the model), never a device (a link to /dev/zero must
    not fill memory), at most CONFIG_LIMIT bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, CONFIG_LIMIT + 1)
        if len(data) > CONFIG_LIMIT:
            raise ValueError(f"larger than {CONFIG_LIMIT >> 10} KiB")
        return data.decode("utf-8")
    finally:
        os.close(fd)


def _parse_json(text: str) -> Any:
    """``json.loads``, where nesting too deep for the parser is one more ValueError."""
    if len(text) > CONFIG_LIMIT:
        raise ValueError(f"larger than {CONFIG_LIMIT >> 10} KiB")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _load_tuned(path: str) -> Any:
    """The tuned file's ``kernels`` object, read once per path; ``{}`` if absent or broken."""
    with _lock:
        if path in _tuned_cache:
            return _tuned_cache[path]
    kernels: Any = {}
    try:
        text = _read_config_file(path)
        data = None if text is None else _parse_json(text)
    except Exception as exc:  # noqa: BLE001 - a broken tuned file must never stop a model
        ks.warn_once("tuned:" + path, f"rocmfix: cannot read tuned file {path} ({exc}); ignored")
        data = None
    if data is not None:
        ok = isinstance(data, dict) and data.get("schema") == TUNED_SCHEMA
        kernels = data.get("kernels") if ok else None
        if not isinstance(kernels, dict):
            ks.warn_once(
                "tuned:" + path,
                f"rocmfix: tuned file {path} is not a schema {TUNED_SCHEMA} rocmfix file; ignored",
            )
            kernels = {}
    with _lock:
        _tuned_cache[path] = kernels
    return kernels


def clear() -> None:
    """Forget every parsed file, warning and arch query (every kernel's)."""
    with _lock:
        ks.warned.clear()
        _gpu_cache.clear()
        _tuned_cache.clear()


def _names(arch: str) -> tuple[str, ...]:
    return ("default", arch) if arch != "default" else ("default",)


class KernelConfig:
    """One kernel's shipped configs, its field checks and its environment variable."""

    def __init__(
        self,
        kernel: str,
        env: str,
        shipped: Mapping[str, Mapping[str, Mapping[str, Any]]],
        fields: Mapping[str, Check],
    ) -> None:
        self.kernel = kernel
        self.env = env
        self.shipped = shipped
        self.fields = {**COMMON_FIELDS, **fields}
        self._resolved: dict[tuple[Any, ...], dict[str, Any]] = {}

    def validate(self, raw: Any) -> dict[str, Any]:
        """A checked copy of a (partial) config; ValueError naming every bad key."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a config must be a JSON object, not {type(raw).__name__}")
        good: dict[str, Any] = {}
        bad: list[str] = []
        for key, value in raw.items():
            check = self.fields.get(key)
            if check is None:
                bad.append(f"unknown key {key!r}")
                continue
            try:
                good[key] = check(value)
            except ValueError as exc:
                bad.append(f"{key}={value!r} (must be {exc})")
        if bad:
            raise ValueError("; ".join(bad))
        return good

    def _layers(self, entry: Any, layers: Sequence[str]) -> list[dict[str, Any]]:
        if not isinstance(entry, Mapping):
            raise ValueError(f"expected a JSON object, not {type(entry).__name__}")
        if any(key in self.fields for key in entry):
            return [self.validate(entry)]  # a flat config applies to every call
        return [self.validate(entry[name]) for name in layers if name in entry]

    def _source(self, source: str, entry: Any, layers: Sequence[str]) -> list[dict[str, Any]]:
        try:
            return self._layers(entry, layers)
        except ValueError as exc:
            ks.warn_once(f"{self.kernel}:{source}", f"rocmfix: ignoring {source}: {exc}")
            return []

    def shipped_config(self, arch: str, layers: Sequence[str]) -> dict[str, Any]:
        """The config the kernel's own data gives ``arch`` (no tuned file, no environment)."""
        merged: dict[str, Any] = {}
        for name in _names(arch):
            for layer in self._layers(self.shipped.get(name, {}), layers):
                merged.update(layer)
        return merged

    def resolve(self, arch: str, layers: Sequence[str]) -> dict[str, Any]:
        """The config one call runs with on ``arch``; ``layers`` from least to most specific."""
        path = tuned_file_path()
        env = os.environ.get(self.env, "")
        key = (arch, tuple(layers), path, env)
        hit = self._resolved.get(key)
        if hit is not None:
            return dict(hit)
        merged = self.shipped_config(arch, layers)
        tuned = _load_tuned(path).get(self.kernel, {})
        if not isinstance(tuned, Mapping):
            ks.warn_once(path, f"rocmfix: ignoring {path}: {self.kernel} must map arch -> config")
            tuned = {}
        for name in _names(arch):
            if name in tuned:
                source = f"tuned config for {name} in {path}"
                for layer in self._source(source, tuned[name], layers):
                    merged.update(layer)
        if env:
            try:
                parsed = _parse_json(env)
            except ValueError as exc:
                ks.warn_once(
                    f"{self.env}:{env}", f"rocmfix: ${self.env} is not JSON ({exc}); ignored"
                )
            else:
                for layer in self._source(f"${self.env}", parsed, layers):
                    merged.update(layer)
        with _lock:
            self._resolved[key] = merged
        return dict(merged)

    def clear(self) -> None:
        with _lock:
            self._resolved.clear()
        clear()
