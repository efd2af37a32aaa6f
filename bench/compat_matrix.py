"""Every release of the target packages through rocmfix: ``docs/compatibility.md``.

For each PyPI release of mineru-vl-utils and doclayout-yolo, each vllm release from 0.8.0,
each transformers release from 4.45.0 and each mineru release from 2.0.0 (its own pytorchocr
files) to the newest, this builds a fresh environment
holding the released files (pip installs the small wheels; vllm's and transformers' target
files, the files their verdicts read, the package ``__init__.py`` files and the real
METADATA/WHEEL/RECORD come out of the wheel by HTTP range requests, see
``tests/releases.py``), then drives the real CLI against it with ``--python``:

1. ``status --json``: every patch of the package gets a verdict and a reason; a fresh
   install must never be ``changed``, ``stale``, ``interrupted`` or ``applied``.
2. For each scheme of the package's patches (the op registry's; mineru-vl-utils has one
   fixed rewrite): ``apply``, every applicable patch ``applied`` with that scheme; every
   written ``.py`` file compiles in the target interpreter; ``apply`` again is a no-op (every
   byte of site-packages and of rocmfix's manifest unchanged); ``revert`` gives site-packages
   back byte for byte and leaves no state behind.
3. With the first scheme, ``apply --dry-run`` prints a diff that ``patch -p1`` applies to a
   copy of site-packages, giving exactly what ``apply`` writes.
4. ``status`` at the end gives the same verdicts and reasons as at the start.
5. A release with nothing to apply: ``apply`` and ``revert`` write nothing, create no state.

Any exit code 3 (an internal error) is a failure, reported with the last line of its log.

Each MinerU release from 2.0.0 gets a row of which targets its code runs (read with
``rocmfix.mineru``, the reading ``status`` does, from the released wheel).

    python bench/compat_matrix.py [--sample] [--jobs N] [--output docs/compatibility.md]
                                  [--no-faults] [--only PROJECT]

``--sample`` checks a deterministic subset that meets every code shape and every patch once:
the first release of each code era (``*_ERAS``) of vllm, transformers, sglang, lmdeploy and
mineru (the newest for the last era), every doclayout-yolo release, seven mineru-vl-utils
releases with the 0.1.13/0.1.14 boundary and the newest; tests/test_compat.py runs it in CI. Without
``--no-faults`` the full run also kills apply and revert at every write point
(tests/faults.py) on a vllm release and records the counts. Exit status: 0 when no release
failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import itertools
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from rocmfix import __version__  # noqa: E402
from rocmfix.registry import all_patches  # noqa: E402

import faults  # noqa: E402
import releases  # noqa: E402

PROJECTS = (
    "mineru-vl-utils",
    "doclayout-yolo",
    "vllm",
    "transformers",
    "mineru",
    "sglang",
    "lmdeploy",
)
OLDEST = {
    "vllm": Version("0.8.0"),
    "transformers": Version("4.45.0"),
    "mineru": Version("2.0.0"),
    "sglang": Version("0.4.0"),
    "lmdeploy": Version("0.6.0"),
}
# Packages too big to install whole (or whose wheels are per platform): their patched files
# are read out of the wheel.
PARTIAL = ("vllm", "transformers", "sglang", "lmdeploy")
# Where the vllm patch-embed code changes shape or its surroundings change (see
# /work/shared/notes/targets.md; 0.11.0: qwen3_vl.py arrives, an nn.Conv3d with a bias, the
# one release before Conv3dLayer): the sample takes the first release of each era, and the
# newest for the last.
VLLM_ERAS = ("0.8.0", "0.9.0", "0.11.0", "0.11.1", "0.14.0", "0.19.0", "0.28.0")
# transformers: Qwen2-VL arrives, Qwen2.5-VL, the Qwen3-VL/GLM-4V files, the 5.x line.
TRANSFORMERS_ERAS = ("4.45.0", "4.49.0", "4.57.0", "5.0.0")
# sglang: nn.Conv3d up to 0.5.9, Conv3dLayer from 0.5.10. lmdeploy: the PyTorch engine's
# Qwen-VL files, 0.17.0 the release MinerU 4 runs.
SGLANG_ERAS = ("0.4.0", "0.5.0", "0.5.9", "0.5.10")
LMDEPLOY_ERAS = ("0.6.0", "0.10.0", "0.17.0")
# mineru: where the set of target files changes: paddleocr2pytorch's files, the vllm client
# (2.5), pytorchocr under model/utils (2.6), PP-DocLayoutV2 for DocLayout-YOLO (3.0),
# rec_lcnetv4 (3.4), model/_internal (4.0).
MINERU_ERAS = ("2.0.0", "2.5.0", "2.6.0", "3.0.0", "3.4.0", "4.0.0")
MINERU_BOUNDARY = ("0.1.0", "0.1.1", "0.1.13", "0.1.14")
MINERU_SAMPLE_SIZE = 7
TABLES_ONNXRUNTIME = ("onnxruntime-migraphx", "1.27.1")
# ``unmeasured``: a patch whose verdict follows doctor's measurement, with none stored.
OK_VERDICTS = {"applicable", "not-needed", "unsupported", "unmeasured"}
FRESH_BAD = {"changed", "stale", "interrupted", "applied", "not-installed"}


# ---------------------------------------------------------------------------- releases


# Loaded once, before any worker thread: importing the patch modules is not thread-safe.
PATCHES = all_patches()


def patches_of(project: str) -> list[str]:
    return [p.id for p in PATCHES if p.distribution == project]


def schemes_of(project: str) -> list[str | None]:
    names: list[str] = []
    for patch in PATCHES:
        if patch.distribution == project:
            names += [s for s in patch.scheme_names if s not in names]
    return list(names) or [None]


def target_files(project: str) -> list[str]:
    """The files a project's patches rewrite or read, and the packages that hold them."""
    files = {f for p in PATCHES if p.distribution == project for f in (p.path, *p.related)}
    packages = {
        "/".join(f.split("/")[:depth]) + "/__init__.py"
        for f in files
        for depth in range(1, f.count("/") + 1)
    }
    return sorted(files | packages)


def all_releases(project: str) -> list[str]:
    found = releases.releases(project)
    if project in OLDEST:
        found = [v for v in found if Version(v) >= OLDEST[project]]
    return sorted(found, key=Version)


def _eras(every: list[str], eras: Sequence[str]) -> list[str]:
    """Each code shape once: the first release of each era, and for the last era the newest."""
    bounds = [Version(v) for v in eras]
    picked = {every[-1]}
    for low, high in itertools.pairwise(bounds):
        era = [v for v in every if low <= Version(v) < high]
        picked |= set(era[:1])
    return sorted(picked, key=Version)


def sample_releases(project: str) -> list[str]:
    """A deterministic subset that keeps every boundary the patches care about."""
    every = all_releases(project)
    if project == "doclayout-yolo":
        return every
    if project == "vllm":
        return _eras(every, VLLM_ERAS)
    if project == "transformers":
        return _eras(every, TRANSFORMERS_ERAS)
    if project == "sglang":
        return _eras(every, SGLANG_ERAS)
    if project == "lmdeploy":
        return _eras(every, LMDEPLOY_ERAS)
    if project == "mineru":
        return _eras(every, MINERU_ERAS)
    fixed = sorted({every.index(v) for v in MINERU_BOUNDARY if v in every} | {0, len(every) - 1})
    # The rest spread over the stretches between the fixed ones: each extra release goes to
    # the stretch whose pieces are longest, then each stretch is cut evenly.
    spans = list(itertools.pairwise(fixed))
    cuts = [0] * len(spans)
    for _ in range(max(0, min(MINERU_SAMPLE_SIZE, len(every)) - len(fixed))):
        widest = max(range(len(spans)), key=lambda j: (spans[j][1] - spans[j][0]) / (cuts[j] + 1))
        cuts[widest] += 1
    picked = set(fixed)
    for (low, high), n in zip(spans, cuts, strict=True):
        picked |= {low + round((high - low) * (i + 1) / (n + 1)) for i in range(n)}
    return [every[i] for i in sorted(picked)]


# ---------------------------------------------------------------------------- the CLI


@dataclass
class Call:
    args: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def error_line(self) -> str:
        lines = [ln for ln in self.stderr.splitlines() if "error" in ln]
        return (lines or self.stderr.strip().splitlines() or ["(no output)"])[0].strip()


class Failure(Exception):
    """One release failed a check; the message says which and why."""


_frozen: list[Path] = []


def freeze_source(into: Path) -> Path:
    """A private copy of rocmfix, patches and templates for the whole run: the working tree
    may change under a long run, and every release must be checked by the same code."""
    dest = into / "rocmfix-source"
    for name in ("rocmfix", "patches", "templates"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    _frozen[:] = [dest]
    return dest


def cli_runner(python: Path, scratch: Path) -> Callable[..., Call]:
    """The real CLI in a subprocess, pointed at ``python``, as a user runs it."""
    base_env = {
        **os.environ,
        "PYTHONPATH": str(_frozen[0] if _frozen else ROOT),
        "COLUMNS": "200",
        "XDG_CACHE_HOME": str(scratch / "xdg-cache"),
    }
    base_env.pop("ROCMFIX_UNSAFE_TEST_HOOKS", None)

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Call:
        done = subprocess.run(
            [sys.executable, "-m", "rocmfix", *args, "--python", str(python)],
            capture_output=True,
            env={**base_env, **(env or {})},
            cwd="/",
            timeout=timeout,
            check=False,
        )
        call = Call(args, done.returncode, done.stdout, done.stderr.decode("utf-8", "replace"))
        if call.returncode == 3:
            raise Failure(f"`rocmfix {' '.join(args)}` crashed (exit 3): {_log_tail(call)}")
        return call

    return run


def in_process_runner(python: Path, scratch: Path) -> Callable[..., Call]:
    """The same CLI (typer app, engine, renderer) called in this process: no interpreter
    start and imports per call, for the CI sample. It swaps sys.stdout and os.environ while
    it runs, so one process runs one call at a time; kills need the subprocess runner."""
    from typer.testing import CliRunner

    from rocmfix.cli import app

    runner = CliRunner()
    base_env = {"COLUMNS": "200", "XDG_CACHE_HOME": str(scratch / "xdg-cache")}

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Call:
        if env:
            raise ValueError("the in-process runner cannot inject faults")
        result = runner.invoke(app, [*args, "--python", str(python)], env=base_env)
        call = Call(args, result.exit_code, result.stdout_bytes, result.stderr)
        if call.returncode == 3:
            raise Failure(f"`rocmfix {' '.join(args)}` crashed (exit 3): {_log_tail(call)}")
        return call

    return run


def _log_tail(call: Call) -> str:
    text = " ".join(call.stderr.split())
    marker = "the traceback is in "
    if marker in text:
        path = Path(text.split(marker, 1)[1].split()[0].rstrip(";"))
        try:
            last = path.read_text().strip().splitlines()[-1]
        except (OSError, IndexError):
            last = "(log unreadable)"
        return f"{text[:300]} [log: {last}]"
    return text[:300]


def expect(call: Call, code: int = 0) -> Call:
    if call.returncode != code:
        raise Failure(
            f"`rocmfix {' '.join(call.args)}` exited {call.returncode}, expected {code}: "
            f"{call.error_line()}"
        )
    return call


# ---------------------------------------------------------------------------- one release


@dataclass
class Env:
    project: str
    version: str
    root: Path
    python: Path
    site: Path

    @property
    def state(self) -> Path:
        return self.root / "share" / "rocmfix"


_download_lock = threading.Lock()


def build_env(project: str, version: str, workdir: Path) -> Env:
    """A fresh virtual environment holding ``project`` ``version`` as pip lays it out."""
    root = workdir / "env"
    python = releases.make_venv(root)
    if project in PARTIAL:
        with _download_lock:
            site = releases.partial_install(python, project, version, target_files(project))
    else:
        with _download_lock:
            wheel = releases.wheel(project, version)
        releases.pip_install(python, wheel)
        site = releases.site_packages(python)
    if project == "mineru":
        # The table patches apply only beside an onnxruntime build with an AMD provider:
        # its real METADATA and RECORD are what their verdict reads.
        with _download_lock:
            releases.partial_install(python, *TABLES_ONNXRUNTIME, [])
    return Env(project, version, root, python, site)


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` with its bytes, bytecode caches excluded."""
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts
    }


def _differences(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


def _compile_in_target(env: Env, files: Sequence[Path]) -> None:
    if not files:
        return
    program = (
        "import sys\n"
        "for p in sys.argv[1:]:\n"
        "    compile(open(p, 'rb').read(), p, 'exec', dont_inherit=True)\n"
    )
    done = subprocess.run(
        [str(env.python), "-c", program, *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise Failure(f"patched code does not compile in the target interpreter: {last}")


def _statuses(call: Call, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    by_id = {p["id"]: p for p in call.json()["patches"]}
    return {pid: by_id[pid] for pid in ids}


@dataclass
class Row:
    project: str
    version: str
    verdicts: dict[str, tuple[str, str]] = field(default_factory=dict)
    round_trip: str = ""
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


def _patch_p1(diff: bytes, cwd: Path) -> int:
    return subprocess.run(
        ["patch", "-p1", "--quiet"], input=diff, cwd=cwd, capture_output=True, check=False
    ).returncode


def _round_trip(env: Env, cli: Callable[..., Call], row: Row, scratch: Path) -> str:
    ids = patches_of(env.project)
    only = ("--only", env.project)
    pristine = snapshot(env.site)
    first = _statuses(expect(cli("status", "--json", *only)), ids)
    row.verdicts = {pid: (s["verdict"], s["reason"]) for pid, s in first.items()}
    for pid, s in first.items():
        if s["verdict"] in FRESH_BAD:
            raise Failure(f"{pid}: a fresh install reads as {s['verdict']}: {s['reason']}")
        if s["verdict"] not in OK_VERDICTS:
            raise Failure(f"{pid}: unknown verdict {s['verdict']!r}")
        if s["verdict"] == "applicable" and s["pristine"] != "record":
            raise Failure(f"{pid}: a wheel install is not pristine by its RECORD: {s['pristine']}")
    applicable = [pid for pid, s in first.items() if s["verdict"] == "applicable"]
    unsupported = [pid for pid, s in first.items() if s["verdict"] == "unsupported"]

    if unsupported or not applicable:
        applied = expect(cli("apply", *only), 1 if unsupported else 0)
        if snapshot(env.site) != pristine or env.state.exists():
            raise Failure("an apply with nothing to do (or refused) changed files")
        expect(cli("revert", *only))
        if snapshot(env.site) != pristine or env.state.exists():
            raise Failure("a revert with nothing to revert changed files")
        if unsupported:
            return f"refused, nothing written: {applied.error_line()}"
        return "nothing to apply; apply and revert write nothing"

    done_schemes: list[str] = []
    for index, scheme in enumerate(schemes_of(env.project)):
        scheme_args = ("--scheme", scheme) if scheme else ()
        if index == 0:
            dry = expect(cli("apply", "--dry-run", *scheme_args, *only))
            copy = scratch / "dry-run-copy"
            shutil.copytree(env.site, copy, symlinks=True)
        expect(cli("apply", *scheme_args, *only))
        now = snapshot(env.site)
        changed = _differences(pristine, now)
        after = _statuses(expect(cli("status", "--json", *only)), ids)
        for pid in ids:
            verdict, scheme_now = after[pid]["verdict"], after[pid]["scheme"]
            # A scheme applies to the patches that offer it; the others keep their default.
            patch = next(p for p in PATCHES if p.id == pid)
            wanted = scheme if scheme in patch.scheme_names else patch.default_scheme
            if pid in applicable and (verdict != "applied" or scheme_now != wanted):
                raise Failure(
                    f"{pid}: after apply {scheme or ''} it reads {verdict} ({scheme_now})"
                )
            if pid not in applicable and verdict != first[pid]["verdict"]:
                raise Failure(f"{pid}: apply changed its verdict to {verdict}")
        _compile_in_target(env, [env.site / name for name in changed if name.endswith(".py")])
        if index == 0:
            if _patch_p1(dry.stdout, copy) != 0:
                raise Failure("the --dry-run diff does not apply with patch -p1")
            if snapshot(copy) != now:
                raise Failure("patch -p1 with the --dry-run diff differs from what apply wrote")
            shutil.rmtree(copy)
        manifest = (env.state / "manifest.json").read_bytes()
        again = expect(cli("apply", *scheme_args, *only))
        if "unchanged" not in again.stderr:
            raise Failure("a second apply does not say the patches are unchanged")
        if snapshot(env.site) != now or (env.state / "manifest.json").read_bytes() != manifest:
            raise Failure("a second apply with the same scheme changed bytes")
        expect(cli("revert", *only))
        left = _differences(pristine, snapshot(env.site))
        if left:
            raise Failure(f"revert after {scheme or 'apply'} left {', '.join(left[:3])} changed")
        if env.state.exists():
            raise Failure(f"revert left rocmfix state behind: {sorted(env.state.rglob('*'))}")
        done_schemes.append(scheme or "fixed rewrite")
    last = _statuses(expect(cli("status", "--json", *only)), ids)
    for pid in ids:
        if (last[pid]["verdict"], last[pid]["reason"]) != row.verdicts[pid]:
            raise Failure(f"{pid}: after the round trips status reads {last[pid]['verdict']}")
    return f"ok ({', '.join(done_schemes)})"


def check_release(project: str, version: str, workdir: Path, in_process: bool = False) -> Row:
    """Build a fresh environment for one release and take it through every check."""
    row = Row(project, version)
    start = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f"{project}-{version}-", dir=workdir))
    runner = in_process_runner if in_process else cli_runner
    try:
        env = build_env(project, version, scratch)
        row.round_trip = _round_trip(env, runner(env.python, scratch), row, scratch)
    except Failure as exc:
        row.failures.append(str(exc))
        row.round_trip = "FAILED"
    except Exception as exc:  # noqa: BLE001 - every release gets a row, whatever broke
        row.failures.append(f"harness error: {type(exc).__name__}: {exc}")
        row.round_trip = "FAILED"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    row.seconds = time.monotonic() - start
    return row


def run_matrix(
    plan: Sequence[tuple[str, str]],
    jobs: int = 1,
    workdir: Path | None = None,
    progress: Callable[[Row], None] | None = None,
    in_process: bool = False,
) -> list[Row]:
    """Check every (project, version); rows come back in the order of ``plan``.

    Subprocess runs go ``jobs`` at a time on threads; in-process runs swap process-wide
    state (sys.stdout, os.environ), so they go ``jobs`` at a time in forked processes."""
    base = Path(tempfile.mkdtemp(prefix="rocmfix-compat-", dir=workdir))
    rows: dict[tuple[str, str], Row] = {}
    pool: concurrent.futures.Executor
    if in_process:
        pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=max(1, jobs), mp_context=multiprocessing.get_context("fork")
        )
    else:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        with pool:
            futures = {pool.submit(check_release, p, v, base, in_process): (p, v) for p, v in plan}
            for future in concurrent.futures.as_completed(futures):
                row = future.result()
                rows[futures[future]] = row
                if progress is not None:
                    progress(row)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [rows[key] for key in plan]


def make_plan(sample: bool, only: Sequence[str] = ()) -> list[tuple[str, str]]:
    pick = sample_releases if sample else all_releases
    return [(p, v) for p in PROJECTS if not only or p in only for v in pick(p)]


# ---------------------------------------------------------------------------- MinerU


@dataclass
class MinerURow:
    """What one MinerU release's code was found to run: per patch, the evidence or None."""

    version: str
    uses: dict[str, str | None] = field(default_factory=dict)
    failure: str | None = None


def mineru_patches() -> list[Any]:
    """The patches whose targets some MinerU may run (a table column each)."""
    # MinerU's own files (its pytorchocr package) are run by every release that has them.
    return [p for p in PATCHES if p.mineru is not None and not p.mineru.never and not p.mineru.own]


def check_mineru(version: str) -> MinerURow:
    """Read one released MinerU wheel the way ``status`` reads an installed MinerU."""
    from rocmfix import mineru

    row = MinerURow(version)
    try:
        with _download_lock:
            wheel = releases.wheel("mineru", version)
        with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith("mineru/") and name.endswith(".py"):
                    archive.extract(name, tmp)
            found = mineru.scan([Path(tmp)], PATCHES)
        row.uses = {p.id: found.shows(p.mineru) for p in mineru_patches()}
    except Exception as exc:  # noqa: BLE001 - every release gets a row, whatever broke
        row.failure = f"{type(exc).__name__}: {exc}"
    return row


def mineru_rows(sample: bool, jobs: int = 1) -> list[MinerURow]:
    versions = (sample_releases if sample else all_releases)("mineru")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(check_mineru, versions))


def _mineru_section(rows: Sequence[MinerURow]) -> list[str]:
    columns = mineru_patches()
    out = [
        "## mineru",
        "",
        "Which targets each MinerU release runs, read from its code as `status` reads an",
        "installed MinerU: a target it never runs reads `not-needed` in an environment that",
        "holds this MinerU (unless named with `--only`).",
        "",
        "| version | " + " | ".join(p.id for p in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for row in rows:
        if row.failure:
            out.append(f"| {row.version} | FAILED: {_cell(row.failure)} |")
            continue
        cells = [f"runs it ({row.uses[p.id]})" if row.uses[p.id] else "-" for p in columns]
        out.append(f"| {row.version} | " + " | ".join(cells) + " |")
    return out


# ---------------------------------------------------------------------------- faults


def fault_summaries(workdir: Path | None = None) -> list[str]:
    """Kill apply, revert and a scheme switch at every write point on vllm releases with
    three targets; on the first, also kill every recovering revert at each of its points, and
    fail every write with EIO from each write point on."""
    lines = []
    base = Path(tempfile.mkdtemp(prefix="rocmfix-faults-", dir=workdir))
    versions = [("0.11.0", True), (all_releases("vllm")[-1], False)]
    try:
        runs = [(v, n, c, "kill") for v, n in versions for c in ("apply", "revert", "switch")]
        runs += [(versions[0][0], False, c, "io-error") for c in ("apply", "revert", "switch")]
        for version, nested, command, fault in runs:
            scratch = base / f"vllm-{version}-{command}-{fault}"
            scratch.mkdir()
            label = f"vllm {version}"
            try:
                env = build_env("vllm", version, scratch)
                summary = faults.kill_loop(
                    cli_runner(env.python, scratch),
                    site=env.site,
                    state=env.state,
                    command=command,
                    label=label,
                    nested=nested,
                    fault=fault,
                )
                lines.append(summary.line())
                lines += [f"    problem: {p}" for p in summary.problems[:10]]
            except Failure as exc:
                lines.append(f"fault injection ({label}, {command}): FAILED: {exc}")
            print(lines[-1], file=sys.stderr)
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return lines


# ---------------------------------------------------------------------------- the report


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# What the CI suite checks beyond plain wheel installs: (install, what is checked, tests).
INSTALLS = (
    (
        "editable vllm checkout: PEP 660 with a finder hook, PEP 660 with a `.pth` path, "
        "the old `setup.py develop` egg-link",
        "status says `editable` and `pristine: git`; apply patches the checkout; revert gives "
        "it back byte for byte (`git status` as before); an uncommitted edit reads `changed` "
        "and is refused without `--force`; a `git pull` over a patch reads `stale`; status "
        "never rewrites `.git/index`",
        "test_installs.py",
    ),
    (
        "uv: two environments hard-linked from one cache (`UV_LINK_MODE=hardlink`)",
        "apply breaks only its own link: the other environment's file and the cache file "
        "keep their bytes and inode",
        "test_installs.py",
    ),
    (
        "conda-style prefix, simulated (no conda channel is reachable here): no `pyvenv.cfg`, "
        "`conda-meta/`, `lib/pythonX.Y/site-packages`, files hard-linked from `pkgs/`",
        "state in `<prefix>/share/rocmfix`; the package cache is never written through; "
        "revert removes only rocmfix's folder",
        "test_installs.py",
    ),
    (
        "`pip install --force-reinstall` or an upgrade over a patch",
        "`stale` (`not-needed` for a release fixed upstream); apply patches again; revert "
        "keeps the reinstalled file as shipped, leaves no dropped file, RECORD line or state",
        "test_installs.py",
    ),
    (
        "read-only state folder or `share/`; a root-owned prefix and an ordinary user; "
        "`sudo rocmfix apply` on a user's prefix",
        "one error line, exit 1, nothing written; what root creates belongs to the prefix's "
        "owner, who can revert without root",
        "test_installs.py",
    ),
    (
        "target files with CRLF line ends, a BOM, a latin-1 coding cookie, tab indentation",
        "the patched converted file is the converted patched file; revert gives the exact "
        "converted bytes back",
        "test_installs.py",
    ),
    (
        "a tampered manifest, links where files should be, a target that no longer parses, "
        "apply and revert racing",
        "one error line, exit 1, nothing outside the targets and rocmfix's state touched",
        "test_manifest_trust.py, test_target_files.py, test_lock.py",
    ),
)


def _installs_section() -> list[str]:
    out = [
        "## Other kinds of install",
        "",
        "The rows further down are plain `pip install`s of wheels. The CI suite also runs the",
        "CLI with `--python` on the other ways these packages get installed, each with real",
        "released files:",
        "",
        "| install | what is checked | tests/ |",
        "|---|---|---|",
    ]
    out += [f"| {a} | {b} | {c} |" for a, b, c in INSTALLS]
    return out


def render(
    rows: Sequence[Row],
    sample: bool,
    seconds: float,
    jobs: int,
    fault_lines: Sequence[str],
    minerus: Sequence[MinerURow] = (),
    in_process: bool = False,
) -> str:
    today = datetime.date.today().isoformat()
    per_project = Counter(r.project for r in rows)
    verdicts = Counter(v for r in rows for v, _ in r.verdicts.values())
    failed = [r for r in rows if not r.ok]
    out = [
        "# Compatibility matrix",
        "",
        f"Generated by `python bench/compat_matrix.py{' --sample' if sample else ''}"
        f"{' --in-process' if in_process else ''}` on "
        f"{today} with rocmfix {__version__} (Python {platform.python_version()}, "
        f"{len(rows)} releases in {seconds / 60:.1f} min with --jobs {jobs}). "
        "Do not edit by hand: run the script again.",
        "",
        "Every release gets a fresh environment with no torch (the verdicts of the vllm",
        "patches from 0.11.1 on also depend on the target's torch: see docs/patches.md) and goes",
        "through the real CLI with `--python`"
        + (
            " (called through typer's test runner in forked workers: the same parsing, engine"
            " and renderer, without an interpreter start per call; the fault runs below start"
            " it as a subprocess)"
            if in_process
            else ""
        )
        + ": `status`; then, for each scheme, `apply`, a",
        "compile of every written file by the target interpreter, a second `apply` that must",
        "change no byte, and a `revert` that must give site-packages back byte for byte and",
        "leave no state; with the first scheme, `apply --dry-run` must give a diff that",
        "`patch -p1` applies to the same bytes; `status` at the end must read as at the start.",
        "A release with nothing to apply must be left untouched by `apply` and `revert`.",
        "vllm is checked from 0.8.0, transformers from 4.45.0 (their target files, the",
        "files the verdicts read, the package `__init__.py` files and the real",
        "METADATA/RECORD, read out of the released wheel) and mineru from 2.0.0 (the whole",
        "wheel, installed without its dependencies).",
        "",
        "## Summary",
        "",
        "| package | releases | oldest | newest | failures |",
        "|---|---|---|---|---|",
    ]
    for project in PROJECTS:
        mine = [r for r in rows if r.project == project]
        if not mine:
            continue
        out.append(
            f"| {project} | {per_project[project]} | {mine[0].version} | {mine[-1].version} | "
            f"{sum(not r.ok for r in mine)} |"
        )
    if minerus:
        out.append(
            f"| mineru (which targets it runs) | {len(minerus)} | {minerus[0].version} | "
            f"{minerus[-1].version} | {sum(r.failure is not None for r in minerus)} |"
        )
    out += ["", "| verdict (one per patch and release) | count |", "|---|---|"]
    out += [f"| {verdict} | {count} |" for verdict, count in sorted(verdicts.items())]
    out += ["", f"Failures: {len(failed)}."]
    for row in failed:
        out.append(f"- {row.project} {row.version}: {_cell('; '.join(row.failures))}")
    out += ["", *_installs_section()]
    if fault_lines:
        out += [
            "",
            "## Fault injection",
            "",
            '`ROCMFIX_UNSAFE_TEST_HOOKS={"kill_at": N}` makes the N-th write point of a run',
            "SIGKILL the process.",
            "Each run below kills the command at its 1st, 2nd, ... write point until one",
            "finishes; after each kill `status` must describe the bytes on disk truthfully,",
            "every file must hold either its old or its new bytes (never a torn mix), and",
            "`revert` (itself killed at each of its own write points first, `nested`) must give",
            "site-packages back byte for byte. `switch` is `apply --scheme linear` over a gemm",
            "apply. Bytes lost counts the bytes of pristine files that did not come back.",
            '`io-error` runs use `{"fail_from": N}` instead: from the N-th write point on, every',
            "write fails with EIO (a dying disk, so the rollback fails too); each run must end",
            "in one error line, `status` must tell the truth, and a `revert` once the disk is",
            "healthy must give every byte back.",
            "",
            "```",
            *fault_lines,
            "```",
        ]
    if minerus:
        out += ["", *_mineru_section(minerus)]
    for project in PROJECTS:
        mine = [r for r in rows if r.project == project]
        if not mine:
            continue
        ids = patches_of(project)
        out += ["", f"## {project}", ""]
        out.append("| version | " + " | ".join(ids) + " | round trip |")
        out.append("|---" * (len(ids) + 2) + "|")
        for row in mine:
            cells = []
            for pid in ids:
                verdict, reason = row.verdicts.get(pid, ("(none)", ""))
                cells.append(f"**{verdict}**: {_cell(reason)}" if reason else f"**{verdict}**")
            trip = row.round_trip if row.ok else "FAILED: " + "; ".join(row.failures)
            out.append(f"| {row.version} | " + " | ".join(cells) + f" | {_cell(trip)} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", action="store_true", help="a deterministic subset")
    parser.add_argument("--jobs", type=int, default=1, help="releases checked at once")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "compatibility.md")
    parser.add_argument("--no-faults", action="store_true", help="skip the fault injection")
    parser.add_argument("--only", action="append", choices=PROJECTS, default=[])
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="call the CLI in-process (in forked workers with --jobs): faster, no kills",
    )
    args = parser.parse_args(argv)
    source = Path(tempfile.mkdtemp(prefix="rocmfix-source-"))
    freeze_source(source)
    try:
        return _main(args)
    finally:
        _frozen.clear()
        shutil.rmtree(source, ignore_errors=True)


def _main(args: argparse.Namespace) -> int:

    plan = make_plan(args.sample, args.only)
    print(f"checking {len(plan)} releases with --jobs {args.jobs}", file=sys.stderr)
    start = time.monotonic()

    def progress(row: Row) -> None:
        state = "ok" if row.ok else "FAILED: " + "; ".join(row.failures)
        print(f"{row.project} {row.version}: {state} ({row.seconds:.0f} s)", file=sys.stderr)

    rows = run_matrix(plan, args.jobs, progress=progress, in_process=args.in_process)
    minerus = mineru_rows(args.sample, args.jobs) if not args.only else []
    elapsed = time.monotonic() - start
    fault_lines = [] if args.no_faults else fault_summaries()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    report = render(rows, args.sample, elapsed, args.jobs, fault_lines, minerus, args.in_process)
    args.output.write_text(report)
    failed = [r for r in rows if not r.ok] + [r for r in minerus if r.failure]
    faulty = [ln for ln in fault_lines if ln.startswith("fault") and "lost, 0 files" not in ln]
    faulty += [ln for ln in fault_lines if ln.startswith("fault") and " 0 problems" not in ln]
    print(
        f"{len(rows)} releases, {len(failed)} failed, {len(set(faulty))} fault runs with "
        f"problems; wrote {args.output}",
        file=sys.stderr,
    )
    return 1 if failed or faulty else 0


if __name__ == "__main__":
    sys.exit(main())
