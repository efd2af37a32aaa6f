"""Find out what a Python environment holds, like ``pip show``, from any interpreter."""

from __future__ import annotations

import base64
import json
import math
import os
import secrets
import shutil
import sys
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import fsops, guest, mineru, supervise
from . import system as machine
from .errors import ProbeError, UsageError, printable
from .guest import probe
from .mineru import MinerU
from .patch import Patch, TorchInfo
from .state import StateDir

# Distributions read for warnings and for the patches' context, beyond the targets.
# torchvision, accelerate and safetensors: what MinerU's small models need to run in torch
# (rocmfix.mineru.runs_onnx).
EXTRAS: tuple[str, ...] = (
    *("torch", "triton", "pytorch-triton-rocm", "flash-attn", "vllm", "mineru"),
    *("torchvision", "accelerate", "safetensors"),
    *machine.EXTRAS,
)
# Paths whose presence the checks need: flash-attn's Triton backend for AMD.
EXISTS = {"flash-attn": ["flash_attn/flash_attn_triton_amd"]}
# Extras whose code rocmfix reads (never imports): MinerU, to know which targets it runs.
PACKAGES = {"mineru": "mineru"}

# An environment on a slow network filesystem can take long to import from; the variable is
# for those (and for the tests, which need a probe that gives up sooner).
_PROBE_TIMEOUT_ENV = "ROCMFIX_PROBE_TIMEOUT"


_DEFAULT_TIMEOUT_S = 60.0
_MAX_TIMEOUT_S = 3600.0
_PYTHON_HINT = "give --python the interpreter of the environment that runs MinerU (…/bin/python)"
# A probe's answer is a few kilobytes; an interpreter that says more is not answering it.
ANSWER_LIMIT = 8 * 1024 * 1024


def _probe_timeout() -> tuple[float, str | None]:
    """The probe's time limit, and what to tell the user about a value it does not take."""
    raw = os.environ.get(_PROBE_TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return _DEFAULT_TIMEOUT_S, None
    shown = repr(raw) if len(raw) <= 40 else repr(raw[:40]) + "…"
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        return _DEFAULT_TIMEOUT_S, (
            f"${_PROBE_TIMEOUT_ENV}={shown} is not a number of seconds above 0; "
            f"using {_DEFAULT_TIMEOUT_S:g}"
        )
    if value > _MAX_TIMEOUT_S:
        return _MAX_TIMEOUT_S, (
            f"${_PROBE_TIMEOUT_ENV}={shown} is more than {_MAX_TIMEOUT_S:g} s; "
            f"using {_MAX_TIMEOUT_S:g}"
        )
    return value, None


@dataclass(frozen=True)
class TargetFile:
    rel: str
    path: Path
    root: Path
    record_hash: str | None


@dataclass(frozen=True)
class Distribution:
    """An installed distribution: a target's (with ``files``, the ones asked about) or one
    read for context (with ``exists``, the paths in :data:`EXISTS`); ``package_roots`` is
    where its import package is (for the extras in :data:`PACKAGES`)."""

    name: str
    version: str
    dist_info: Path | None
    location: Path
    editable: bool
    editable_url: str | None
    installer: str | None
    record: Path | None
    files: Mapping[str, TargetFile]
    requires: tuple[str, ...] = ()
    exists: Mapping[str, bool] = field(default_factory=dict)
    package_roots: tuple[Path, ...] = ()


@dataclass(frozen=True)
class PythonInfo:
    executable: str
    version: str
    prefix: Path
    purelib: Path | None


@dataclass(frozen=True)
class Environment:
    python: PythonInfo
    distributions: Mapping[str, Distribution]
    installed: Mapping[str, Distribution]
    versions: Mapping[str, str]
    torch: TorchInfo | None
    in_process: bool
    # The MinerU installed here and what its code runs (None: no MinerU).
    mineru: MinerU | None = None
    # What the probe met on the way that the user should hear once: stray output at the
    # interpreter's startup, a distribution it could not read, a setting it ignored.
    notes: tuple[str, ...] = ()
    system: machine.System = field(default_factory=machine.System)

    @property
    def state(self) -> StateDir:
        """The record of the installation that holds the targets: ``<base>/share/rocmfix``,
        where ``<base>`` is the base of the site folder the targets sit in (the prefix for a
        venv or conda env, ``~/.local`` for the user site, ``/usr/local`` for Debian's pip).
        Two package trees used with one interpreter never share a record. Targets in no such
        site folder, or in several, keep the prefix's record, and apply refuses them
        (:func:`rocmfix.write.transaction.check_sites`). Editable installs, whose metadata
        may sit in their checkout, do not choose."""
        bases = {site_base(d.location) for d in self.distributions.values() if not d.editable}
        base = bases.pop() if len(bases) == 1 else None
        base = base if base is not None else self.python.prefix
        return StateDir(base / "share" / "rocmfix", base)

    def keeps_record(self, dist: Distribution) -> bool:
        """Whether :attr:`state` is the record of ``dist`` as the probe found it. A package
        tree on PYTHONPATH that shadows the environment's own copy is not what the record
        names: status, apply and revert read the record only for what sits under its
        installation (or is an editable install, which is the environment's anywhere)."""
        return dist.editable or fsops.inside(dist.location / "x", self.state.prefix)


def site_base(site: Path) -> Path | None:
    """``<base>`` of a ``<base>/lib*/python*/{site,dist}-packages`` folder; None for a
    folder of another shape (``pip install --target``, a tree on PYTHONPATH)."""
    parent = site.parent
    if (
        site.name in ("site-packages", "dist-packages")
        and parent.name.startswith("python")
        and parent.parent.name.startswith("lib")
    ):
        return parent.parent.parent
    return None


def _request(patches: Iterable[Patch]) -> dict[str, Any]:
    targets: dict[str, dict[str, Any]] = {}
    for patch in patches:
        target = targets.setdefault(
            patch.distribution,
            {"distribution": patch.distribution, "package": patch.package, "files": []},
        )
        for rel in (patch.path, *patch.related):
            # "dist:path" names a file of another distribution (vllm's, for mineru-vl-utils).
            owner, _, path = rel.rpartition(":")
            where = target
            if owner:
                where = targets.setdefault(
                    owner, {"distribution": owner, "package": path.split("/")[0], "files": []}
                )
            if path not in where["files"]:
                where["files"].append(path)
    return {
        "targets": list(targets.values()),
        "extras": list(EXTRAS),
        "exists": EXISTS,
        "packages": PACKAGES,
        "system": machine.REQUEST,
    }


def _resolve_python(python: str) -> str:
    found = shutil.which(python) if os.sep not in python else python
    if found is None or not os.path.exists(found):
        raise UsageError(f"--python {python}: no such file")
    if os.path.isdir(found):
        raise UsageError(f"--python {python}: is a directory; give the interpreter (…/bin/python)")
    if not os.access(found, os.X_OK):
        raise UsageError(f"--python {python}: not executable")
    return os.path.abspath(found)


def _meaningful(stderr: str, *noise: str) -> str:
    """The line of a failed run worth one line of an error: a Python traceback's last line,
    else the first; the long arguments rocmfix passed cut out."""
    for text in noise:
        stderr = stderr.replace(text, "…")
    # A program that is not Python may quote the code in its own way (ls shell-quotes it):
    # any line of it left in the output, and the output is not worth showing.
    code = [line.strip() for text in noise for line in text.splitlines() if len(line) > 16]
    if any(line in stderr for line in code):
        return "(it printed rocmfix's probe code back; not shown)"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    line = lines[-1] if any(line.startswith("Traceback") for line in lines) else lines[0]
    return line if len(line) <= 200 else line[:199] + "…"


def _python_version(python: str) -> str | None:
    """``X.Y`` if ``python`` runs Python code, else None."""
    code = "import sys; sys.stdout.write('%d.%d' % sys.version_info[:2])"
    try:
        done = supervise.capped([python, "-c", code], timeout=_probe_timeout()[0], limit=4096)
    except OSError:
        return None
    out = done.stdout.decode("ascii", "replace").strip()
    return out if done.returncode == 0 and out.replace(".", "").isdigit() else None


def _framed(out: bytes, begin: str, end: str) -> tuple[bytes, bytes]:
    """What a child wrote between ``begin`` and ``end``, and what it wrote around them;
    ValueError when it wrote no frame."""
    first = out.rfind(begin.encode("ascii"))
    last = out.rfind(end.encode("ascii"))
    if first < 0 or last < first:
        raise ValueError("no answer in the output")
    return out[first + len(begin) : last], out[:first] + out[last + len(end) :]


def _run_probe(python: str, request: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The probe's answer, and the stray output the interpreter printed around it."""
    name = printable(python, 300)
    nonce = secrets.token_hex(8)
    request = {**request, "frame": nonce}
    encoded = base64.b64encode(json.dumps(request).encode("utf-8")).decode("ascii")
    argv = guest.command(python, "probe", encoded)
    timeout = _probe_timeout()[0]
    try:
        done = supervise.capped(argv, timeout=timeout, limit=ANSWER_LIMIT)
    except OSError as exc:
        raise ProbeError(f"cannot run {name}: {exc.strerror or exc}") from None
    if done.timed_out:
        raise ProbeError(
            f"{name} did not answer within {timeout:g} s",
            hint=f"a slow filesystem? ${_PROBE_TIMEOUT_ENV} sets the limit in seconds",
        )
    if done.overflow:
        raise ProbeError(
            f"{name} answered the probe with more than {ANSWER_LIMIT // 2**20} MiB; "
            "that is not an answer"
        )
    if done.returncode != 0:
        said = printable(_meaningful(done.stderr.decode("utf-8", "replace"), *argv[2:]), 200)
        version = _python_version(python)
        if version is None:
            raise ProbeError(
                f"{name} does not look like a Python interpreter: it did not run "
                f"`{os.path.basename(python)} -c CODE` (exit {done.returncode}): {said}",
                hint=_PYTHON_HINT,
            )
        if tuple(map(int, version.split("."))) < (3, 8):
            raise ProbeError(
                f"{name} is Python {version}: rocmfix reads environments of Python 3.8 or newer"
            )
        raise ProbeError(
            f"{name} could not be probed (exit {done.returncode}): {said}",
            hint="is it a Python 3.8+ interpreter?",
        )
    begin, end = probe.frame(nonce)
    try:
        answer, stray = _framed(done.stdout, begin, end)
    except ValueError:
        # No frame at all: all of it is the answer, or none of it is.
        answer, stray = done.stdout, b""
    try:
        data = json.loads(answer.decode("utf-8"))
    except (ValueError, RecursionError):
        raise ProbeError(
            f"{name} answered the probe with something that is not JSON",
            hint=None if _python_version(python) is not None else _PYTHON_HINT,
        ) from None
    if not isinstance(data, dict) or data.get("probe") != probe.PROBE_SCHEMA:
        raise ProbeError(f"{name} answered with an unknown probe format")
    lines = stray.decode("utf-8", "replace").strip().splitlines()
    if not lines:
        return data, None
    more = f" (and {len(lines) - 1} more lines)" if len(lines) > 1 else ""
    return data, (
        f"{name} printed at startup (a sitecustomize or .pth file?), ignored: "
        f'"{printable(lines[0], 120)}"{more}'
    )


class _Bad(Exception):
    """The probe's answer does not hold what it must; the message says what and where."""


def _field(raw: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(raw, dict):
        raise _Bad(f"{where} is not an object")
    if key not in raw:
        raise _Bad(f"{where} has no {key!r}")
    value = raw[key]
    # bool is an int to isinstance: an answer of ``true`` is not a number, nor the reverse.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _Bad(f"{where}.{key} is a {type(value).__name__}")
    return value


def _text(raw: Any, key: str, where: str, *, optional: bool = False) -> Any:
    value = _field(raw, key, (str, type(None)) if optional else str, where)
    if value is not None:
        _printable_only(value, f"{where}.{key}")
    return value


def _printable_only(value: str, where: str) -> None:
    """No interpreter, path, version or name holds a control character; one that does would
    reach the terminal as one (a NUL cuts a path short, an escape sequence restyles or
    retitles the terminal, a newline prints a line of the answer's own)."""
    bad = next((c for c in value if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise _Bad(f"{where} holds a control character ({bad!r})")


def _path(raw: Any, key: str, where: str, *, optional: bool = False) -> Path | None:
    value = _text(raw, key, where, optional=optional)
    if value is None or (optional and not value):
        return None
    if not os.path.isabs(value):
        raise _Bad(f"{where}.{key} is not an absolute path")
    return Path(os.path.normpath(value))


def _strings(raw: Any, key: str, where: str) -> tuple[str, ...]:
    values = _field(raw, key, list, where)
    if not all(isinstance(v, str) for v in values):
        raise _Bad(f"{where}.{key} holds something that is not a string")
    for value in values:
        _printable_only(value, f"{where}.{key}")
    return tuple(values)


def _target_file(rel: str, raw: Any, where: str) -> TargetFile:
    path, root = _path(raw, "path", where), _path(raw, "root", where)
    assert path is not None and root is not None
    # rocmfix writes to this path: it must be the file it asked about, inside its folder.
    if root == Path("/") or path != Path(os.path.normpath(root / rel)) or ".." in Path(rel).parts:
        raise _Bad(f"{where}.path is not {rel} inside the folder it names")
    return TargetFile(rel, path, root, _text(raw, "record_hash", where, optional=True))


def _distribution(where: str, raw: Any) -> Distribution:
    location = _path(raw, "location", where)
    assert location is not None
    files = _field(raw, "files", dict, where)
    exists = _field(raw, "exists", dict, where) if "exists" in raw else {}
    roots = raw.get("package_roots") or []
    if not isinstance(roots, list) or not all(isinstance(r, str) and r for r in roots):
        raise _Bad(f"{where}.package_roots is not a list of paths")
    return Distribution(
        name=_text(raw, "name", where),
        version=_text(raw, "version", where),
        dist_info=_path(raw, "dist_info", where, optional=True),
        location=location,
        editable=_field(raw, "editable", bool, where),
        editable_url=_text(raw, "editable_url", where, optional=True),
        installer=_text(raw, "installer", where, optional=True),
        record=_path(raw, "record", where, optional=True),
        files={rel: _target_file(rel, f, f"{where}.files.{rel}") for rel, f in files.items()},
        requires=_strings(raw, "requires", where),
        exists={str(k): v is True for k, v in exists.items()},
        package_roots=tuple(Path(r) for r in roots if "\0" not in r),
    )


def _unreadable(data: Mapping[str, Any]) -> tuple[str, ...]:
    raw = data.get("unreadable") or {}
    if not isinstance(raw, dict):
        raise _Bad("unreadable is not an object")
    notes = []
    for name, problems in raw.items():
        said = problems if isinstance(problems, list) else [problems]
        first = printable(str(said[0]) if said else "?", 120)
        more = f" ({len(said) - 1} more)" if len(said) > 1 else ""
        notes.append(f"{printable(str(name), 60)}'s metadata could not be read: {first}{more}")
    return tuple(notes)


def _parse(data: dict[str, Any], in_process: bool) -> Environment:
    """The probe's answer as an :class:`Environment`; every field is checked, since the
    interpreter that wrote it may be anything the user pointed ``--python`` at."""
    try:
        py = _field(data, "python", dict, "the answer")
        prefix = _path(py, "prefix", "python")
        assert prefix is not None
        if prefix == Path("/"):
            raise _Bad("python.prefix is / (rocmfix keeps its state under the prefix)")
        raw_dists = _field(data, "distributions", dict, "the answer")
        distributions = {
            name: _distribution(f"distributions.{name}", raw) for name, raw in raw_dists.items()
        }
        raw_extras = _field(data, "extras", dict, "the answer")
        installed = {name: _distribution(f"extras.{name}", raw) for name, raw in raw_extras.items()}
        versions = {name: extra.version for name, extra in installed.items()}
        versions.update({name: d.version for name, d in distributions.items()})
        torch_raw = data.get("torch")
        torch = (
            TorchInfo(
                version=_text(torch_raw, "version", "torch"),
                hip=_text(torch_raw, "hip", "torch", optional=True),
                cuda=_text(torch_raw, "cuda", "torch", optional=True),
            )
            if torch_raw is not None
            else None
        )
        found, said = machine.parse(data.get("system"))
        return Environment(
            python=PythonInfo(
                executable=_text(py, "executable", "python"),
                version=_text(py, "version", "python"),
                prefix=prefix,
                purelib=_path(py, "purelib", "python", optional=True),
            ),
            distributions=distributions,
            installed=installed,
            versions=versions,
            torch=torch,
            in_process=in_process,
            notes=(*_unreadable(data), *said),
            system=found,
        )
    except _Bad as exc:
        raise ProbeError(
            f"the probe's answer does not hold what it must: {printable(str(exc), 200)}",
            hint="is --python a Python interpreter rocmfix can trust to answer?",
        ) from None


def discover(patches: Iterable[Patch], python: str | None = None) -> Environment:
    """Probe ``python`` (default: this interpreter, in-process) for the patches' targets,
    and read the code of the MinerU installed there, if any."""
    patches = tuple(patches)
    request = _request(patches)
    notes: list[str] = []
    if python is None:
        env = _parse(json.loads(json.dumps(probe.probe(request))), in_process=True)
    else:
        setting = _probe_timeout()[1]
        if setting is not None:
            notes.append(setting)
        answer, stray = _run_probe(_resolve_python(python), request)
        if stray is not None:
            notes.append(stray)
        env = _parse(answer, in_process=False)
    if notes:
        env = replace(env, notes=(*notes, *env.notes))
    found = env.installed.get(mineru.DISTRIBUTION)
    if found is None:
        return env
    return replace(env, mineru=MinerU(found.version, mineru.scan(found.package_roots, patches)))


# Run from ``/`` with the script's folder dropped from sys.path before the first import: a
# ``base64.py`` wherever rocmfix was started must never run (as root, inside ``apply``).
_COMPILE_CHECK = """
import sys
while sys.path and sys.path[0] in ("", "/"):
    sys.path.pop(0)
import base64, json
errors = {}
for name, src in json.loads(sys.stdin.read()).items():
    try:
        compile(base64.b64decode(src), name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        errors[name] = "%s: %s (line %s)" % (type(exc).__name__, getattr(exc, "msg", exc),
                                             getattr(exc, "lineno", "?"))
sys.stdout.write(sys.argv[1] + json.dumps(errors) + sys.argv[2])
"""


def compile_errors(env: Environment, sources: Mapping[str, bytes]) -> dict[str, str]:
    """Compile each source with the target's own interpreter, which is what will run it."""
    if not sources:
        return {}
    # In a child also where the target is rocmfix's own interpreter: one way to compile.
    payload = json.dumps({k: base64.b64encode(v).decode("ascii") for k, v in sources.items()})
    result = None
    begin, end = probe.frame(secrets.token_hex(8))
    try:
        done = supervise.capped(
            [env.python.executable, "-c", _COMPILE_CHECK, begin, end],
            timeout=_probe_timeout()[0],
            limit=ANSWER_LIMIT,
            stdin=payload.encode("ascii"),
        )
        if done.returncode == 0:
            result = json.loads(_framed(done.stdout, begin, end)[0])
    except (OSError, ValueError, RecursionError):
        result = None
    if not isinstance(result, dict):
        raise ProbeError(f"{env.python.executable} could not compile-check the rewritten files")
    return {str(k): str(v) for k, v in result.items()}


def default_python_hint() -> str | None:
    """A hint for users whose rocmfix lives apart from their project (pipx, uv tool)."""
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = os.environ.get(var)
        if prefix and Path(prefix).resolve() != Path(sys.prefix).resolve():
            return f"{var} points at {prefix}: use --python {prefix}/bin/python to target it"
    return None
