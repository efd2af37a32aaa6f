"""Find out what a Python environment holds, like ``pip show``, from any interpreter."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import guest, mineru
from .errors import ProbeError, UsageError
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
)
# Paths whose presence the checks need: flash-attn's Triton backend for AMD.
EXISTS = {"flash-attn": ["flash_attn/flash_attn_triton_amd"]}
# Extras whose code rocmfix reads (never imports): MinerU, to know which targets it runs.
PACKAGES = {"mineru": "mineru"}

# An environment on a slow network filesystem can take long to import from; the variable is
# for those (and for the tests, which need a probe that gives up sooner).
_PROBE_TIMEOUT_ENV = "ROCMFIX_PROBE_TIMEOUT"


def _probe_timeout() -> float:
    try:
        value = float(os.environ.get(_PROBE_TIMEOUT_ENV) or 60)
    except ValueError:
        return 60.0
    return value if value > 0 else 60.0


@dataclass(frozen=True)
class TargetFile:
    rel: str
    path: Path
    root: Path
    record_hash: str | None


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    dist_info: Path | None
    location: Path
    editable: bool
    editable_url: str | None
    installer: str | None
    record: Path | None
    files: Mapping[str, TargetFile]


@dataclass(frozen=True)
class Installed:
    """A distribution read for context: its version, where it lives, what it requires, and
    where its import package is (for the extras in :data:`PACKAGES`)."""

    version: str
    location: Path
    requires: tuple[str, ...]
    exists: Mapping[str, bool]
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
    installed: Mapping[str, Installed]
    versions: Mapping[str, str]
    torch: TorchInfo | None
    in_process: bool
    # The MinerU installed here and what its code runs (None: no MinerU).
    mineru: MinerU | None = None

    @property
    def state(self) -> StateDir:
        return StateDir(self.python.prefix / "share" / "rocmfix", self.python.prefix)


def _request(patches: Iterable[Patch]) -> dict[str, Any]:
    targets: dict[str, dict[str, Any]] = {}
    for patch in patches:
        target = targets.setdefault(
            patch.distribution,
            {"distribution": patch.distribution, "package": patch.package, "files": []},
        )
        for rel in (patch.path, *patch.related):
            if rel not in target["files"]:
                target["files"].append(rel)
    return {
        "targets": list(targets.values()),
        "extras": list(EXTRAS),
        "exists": EXISTS,
        "packages": PACKAGES,
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
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    line = lines[-1] if any(line.startswith("Traceback") for line in lines) else lines[0]
    return line if len(line) <= 200 else line[:199] + "…"


def _python_version(python: str) -> str | None:
    """``X.Y`` if ``python`` runs Python code, else None."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; sys.stdout.write('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            timeout=_probe_timeout(),
            cwd="/",
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = done.stdout.decode("ascii", "replace").strip()
    return out if done.returncode == 0 and out.replace(".", "").isdigit() else None


def _run_probe(python: str, request: dict[str, Any]) -> dict[str, Any]:
    encoded = base64.b64encode(json.dumps(request).encode("utf-8")).decode("ascii")
    argv = guest.command(python, "probe", encoded)
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=_probe_timeout(),
            cwd=os.path.dirname(python) or "/",
            check=False,
        )
    except OSError as exc:
        raise ProbeError(f"cannot run {python}: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise ProbeError(
            f"{python} did not answer within {_probe_timeout():g} s",
            hint=f"a slow filesystem? ${_PROBE_TIMEOUT_ENV} sets the limit in seconds",
        ) from None
    stderr = done.stderr.decode("utf-8", "replace")
    version = _python_version(python) if done.returncode != 0 else None
    if version is not None and tuple(map(int, version.split("."))) < (3, 8):
        raise ProbeError(
            f"{python} is Python {version}: rocmfix reads environments of Python 3.8 or newer"
        )
    if done.returncode != 0 and version is None:
        said = _meaningful(stderr, *argv[2:])
        raise ProbeError(
            f"{python} does not look like a Python interpreter: it did not run "
            f"`{os.path.basename(python)} -c CODE` (exit {done.returncode})" + f": {said}",
            hint="give --python the interpreter of the environment that runs MinerU (…/bin/python)",
        )
    if done.returncode != 0:
        raise ProbeError(
            f"{python} could not be probed (exit {done.returncode}): "
            + _meaningful(stderr, *argv[2:]),
            hint="is it a Python 3.8+ interpreter?",
        )
    try:
        data = json.loads(done.stdout.decode("utf-8"))
    except ValueError:
        raise ProbeError(f"{python} answered the probe with something that is not JSON") from None
    if not isinstance(data, dict) or data.get("probe") != probe.PROBE_SCHEMA:
        raise ProbeError(f"{python} answered with an unknown probe format")
    return data


def _parse(data: dict[str, Any], in_process: bool) -> Environment:
    try:
        py = data["python"]
        distributions = {}
        for name, raw in data["distributions"].items():
            distributions[name] = Distribution(
                name=raw["name"],
                version=raw["version"],
                dist_info=Path(raw["dist_info"]) if raw["dist_info"] else None,
                location=Path(raw["location"]),
                editable=bool(raw["editable"]),
                editable_url=raw["editable_url"],
                installer=raw["installer"],
                record=Path(raw["record"]) if raw["record"] else None,
                files={
                    rel: TargetFile(
                        rel=rel,
                        path=Path(f["path"]),
                        root=Path(f["root"]),
                        record_hash=f["record_hash"],
                    )
                    for rel, f in raw["files"].items()
                },
            )
        installed = {
            name: Installed(
                version=raw["version"],
                location=Path(raw["location"]),
                requires=tuple(raw["requires"]),
                exists=dict(raw["exists"]),
                package_roots=tuple(Path(r) for r in raw.get("package_roots") or ()),
            )
            for name, raw in data["extras"].items()
        }
        versions = {name: extra.version for name, extra in installed.items()}
        versions.update({name: d.version for name, d in distributions.items()})
        torch_raw = data.get("torch")
        torch = (
            TorchInfo(version=torch_raw["version"], hip=torch_raw["hip"], cuda=torch_raw["cuda"])
            if torch_raw
            else None
        )
        return Environment(
            python=PythonInfo(
                executable=py["executable"],
                version=py["version"],
                prefix=Path(py["prefix"]),
                purelib=Path(py["purelib"]) if py.get("purelib") else None,
            ),
            distributions=distributions,
            installed=installed,
            versions=versions,
            torch=torch,
            in_process=in_process,
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ProbeError(f"the probe's answer is missing {exc}") from None


def discover(patches: Iterable[Patch], python: str | None = None) -> Environment:
    """Probe ``python`` (default: this interpreter, in-process) for the patches' targets,
    and read the code of the MinerU installed there, if any."""
    patches = tuple(patches)
    request = _request(patches)
    if python is None:
        env = _parse(json.loads(json.dumps(probe.probe(request))), in_process=True)
    else:
        env = _parse(_run_probe(_resolve_python(python), request), in_process=False)
    found = env.installed.get(mineru.DISTRIBUTION)
    if found is None:
        return env
    return replace(env, mineru=mineru.read(found.version, found.package_roots, patches))


_COMPILE_CHECK = """
import base64, json, sys
errors = {}
for name, src in json.loads(sys.stdin.read()).items():
    try:
        compile(base64.b64decode(src), name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        errors[name] = "%s: %s (line %s)" % (type(exc).__name__, getattr(exc, "msg", exc),
                                             getattr(exc, "lineno", "?"))
sys.stdout.write(json.dumps(errors))
"""


def compile_errors(env: Environment, sources: Mapping[str, bytes]) -> dict[str, str]:
    """Compile each source with the target's own interpreter, which is what will run it."""
    if not sources:
        return {}
    if env.in_process:
        errors = {}
        for name, src in sources.items():
            try:
                compile(src, name, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                lineno = getattr(exc, "lineno", "?")
                errors[name] = f"{type(exc).__name__}: {getattr(exc, 'msg', exc)} (line {lineno})"
        return errors
    payload = json.dumps({k: base64.b64encode(v).decode("ascii") for k, v in sources.items()})
    try:
        done = subprocess.run(
            [env.python.executable, "-c", _COMPILE_CHECK],
            input=payload,
            capture_output=True,
            text=True,
            timeout=_probe_timeout(),
            check=False,
        )
        result = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
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
