"""A real MinerU 4 environment at an 80-column terminal (issue 32): MinerU 4.0.12,
mineru-vl-utils 2.0.7, vllm 0.33.0 and transformers 5.24.0 from their real wheels (vllm's and
transformers' target files with their real RECORDs). What needs doing comes first, the rest
is one line per reason, nothing is wider than the terminal or broken inside a word, and piped
output keeps every reason on one line."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import releases
from conftest import (
    PYTHONPATH,
    TRANSFORMERS_MODELS,
    VLLM_CONV,
    VLLM_TARGETS,
    InstalledEnv,
    fake_torch,
    require,
    run_cli,
)

pytestmark = pytest.mark.network

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RUN = ("vllm-qwen2-vl", "transformers-qwen2-vl")  # what MinerU 4 runs


def at_terminal(columns: int, *args: str, stdout_to_null: bool = False) -> str:
    """What a terminal of ``columns`` shows (stdout and stderr), through script(1)."""
    require(shutil.which("script") is not None, "script(1) is needed for a pseudo-terminal")
    command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "rocmfix", *args))
    if stdout_to_null:
        command += " > /dev/null"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update({"PYTHONPATH": PYTHONPATH, "TERM": "xterm-256color"})
    done = subprocess.run(
        ["script", "-qec", f"stty cols {columns} rows 60; {command}", "/dev/null"],
        capture_output=True,
        env=env,
        cwd="/",
        timeout=300,
        check=False,
    )
    screen = ANSI.sub("", done.stdout.decode("utf-8", "replace")).replace("\r", "")
    assert done.returncode in (0, 1), screen[-3000:]
    return screen


def fits(screen: str, columns: int) -> None:
    lines = screen.splitlines()
    assert lines, screen
    assert max(len(line) for line in lines) <= columns, screen


def mineru4(root: Path, torch: str | None = None) -> InstalledEnv:
    from rocmfix.registry import all_patches

    python = releases.make_venv(root)
    releases.pip_install(
        python, releases.wheel("mineru", "4.0.12"), releases.wheel("mineru-vl-utils", "2.0.7")
    )
    releases.partial_install(
        python, "vllm", "0.33.0", [*VLLM_TARGETS, VLLM_CONV, "vllm/__init__.py"]
    )
    files = [p.path for p in all_patches() if p.distribution == "transformers"]
    packages = ["transformers/__init__.py", f"{TRANSFORMERS_MODELS}/__init__.py"]
    packages += [f.rsplit("/", 1)[0] + "/__init__.py" for f in files]
    site = releases.partial_install(python, "transformers", "5.24.0", files + packages)
    if torch is not None:
        fake_torch(site, torch)
    return InstalledEnv(root, python, site, site / files[0], b"")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> InstalledEnv:
    return mineru4(tmp_path_factory.mktemp("mineru4") / "env")


def _words(text: str) -> set[str]:
    return set(text.split())


@pytest.mark.parametrize("columns", [80, 100])
def test_status_shows_what_needs_doing_first(env: InstalledEnv, columns: int) -> None:
    screen = at_terminal(columns, "status", "--python", str(env.python))
    fits(screen, columns)
    lines = screen.splitlines()
    # At most 33 lines, two of them only because the test's temporary path is long, five
    # where MinerU's models run, two the table patches (issue 42) and one the eager-mask
    # patch, not needed from transformers 5.20.2.
    assert len(lines) <= 33, screen
    assert "…" not in screen
    # The applicable patches open the report, right under the environment line.
    heads = [line for line in lines if not line.startswith(" ")]
    assert heads[0].startswith("Environment ")
    assert [h.split()[:2] for h in heads[1:3]] == [[r, "applicable"] for r in RUN], screen
    assert heads[3] == "Nothing to do (--verbose: each patch)"
    # What does not need doing: one entry per reason, every word of it whole.
    document = env.cli("status", "--json").json()
    words = _words(screen)
    # Files this release lacks, for reasons that differ, share one line (render/status.py).
    merged = "mineru 4.0.12 has none of these files" in " ".join(screen.split())
    for patch in document["patches"]:
        if merged and patch["verdict"] == "not-needed" and patch["path"] is None:
            continue
        if patch["verdict"] != "not-installed":
            assert _words(patch["reason"]) <= words, patch["reason"]
    assert merged, screen
    assert screen.count("mineru 4.0.12 never runs it") == 1, screen
    assert "20 patches not-needed (vllm 2, transformers 18)" in " ".join(screen.split())
    assert heads[-1].startswith("next: rocmfix apply --dry-run"), screen


def test_status_verbose_shows_each_patch(env: InstalledEnv) -> None:
    screen = at_terminal(80, "status", "--verbose", "--python", str(env.python))
    fits(screen, 80)
    document = env.cli("status", "--json").json()
    for patch in document["patches"]:
        if patch["verdict"] != "not-installed":
            assert patch["id"] in _words(screen.replace(",", " ")), patch["id"]


@pytest.mark.parametrize("columns", [80, 100])
def test_apply_dry_run_groups_what_it_skips(env: InstalledEnv, columns: int) -> None:
    screen = at_terminal(
        columns, "apply", "--dry-run", "--python", str(env.python), stdout_to_null=True
    )
    fits(screen, columns)
    lines = screen.splitlines()
    assert [line.split(":")[0] for line in lines[1:3]] == list(RUN), screen
    document = env.cli("status", "--json").json()
    skipped = [p for p in document["patches"] if p["verdict"] == "not-needed"]
    reasons = {p["reason"] for p in skipped}
    if "has none of these files" in screen:
        # The files a release lacks go on one line once their reasons differ, as in status.
        reasons = {p["reason"] for p in skipped if p["path"] is not None} | {"missing"}
    assert screen.count("skipped") == len(reasons), screen  # one line per reason
    # Wrapped between words only: "anyway" whole, never "an" + "yway".
    assert "anyway" in _words(screen)
    assert len(lines) < 17, screen  # one more since the eager-mask patch (not needed on 5.24)


def test_piped_output_is_one_line_per_reason_without_trailing_spaces(env: InstalledEnv) -> None:
    document = env.cli("status", "--json").json()
    for args in (("status",), ("status", "--verbose"), ("apply", "--dry-run")):
        done = env.cli(*args, env={"COLUMNS": "80"})
        text = done.stdout if args[0] == "status" else done.stderr
        lines = text.splitlines()
        assert all(line == line.rstrip() for line in lines), args
        for patch in document["patches"]:
            # apply says why it skips a patch, not why it applies one.
            if patch["verdict"] != "not-needed" and (
                patch["verdict"] == "not-installed" or args[0] == "apply"
            ):
                continue
            # Files the release lacks go on one line once their reasons differ.
            merged = "has none of these files" in text
            if merged and patch["verdict"] == "not-needed" and patch["path"] is None:
                continue
            # The whole reason on one line (after its label, where it has one).
            assert any(patch["reason"] in line for line in lines), (args, patch["reason"])
    verbose = env.cli("status", "--verbose").stdout.splitlines()
    notes = [n for p in document["patches"] for n in p["notes"]]
    assert all(any(n in line for line in verbose) for n in notes)


def test_only_a_distribution_filters_and_only_a_patch_overrides(env: InstalledEnv) -> None:
    def would(*only: str) -> list[str]:
        done = env.cli("apply", "--dry-run", *only)
        assert done.returncode == 0, done.stderr
        return [
            line.split(":")[0] for line in done.stderr.splitlines() if "would be applied" in line
        ]

    assert would() == list(RUN)
    # A distribution is a filter: of transformers' 16 towers, the one MinerU runs.
    assert would("--only", "transformers") == ["transformers-qwen2-vl"]
    # A patch id is the user's choice, whatever MinerU runs.
    assert would("--only", "transformers-qwen3-vl") == ["transformers-qwen3-vl"]
    status = env.cli("status", "--json", "--only", "transformers").json()
    verdicts = {p["id"]: p["verdict"] for p in status["patches"]}
    assert verdicts["transformers-qwen2-vl"] == "applicable"
    assert verdicts["transformers-qwen3-vl"] == "not-needed"
    unknown = env.cli("status", "--only", "mineru-vl")
    assert unknown.returncode == 2
    assert "mineru-vl-utils" in unknown.stderr and "transformers" in unknown.stderr
    help_text = " ".join(run_cli("apply", "--help", env={"COLUMNS": "400"}).stdout.split())
    assert "of those that apply" in help_text


def test_force_on_a_cpu_torch_overrides_the_torch_check_only(tmp_path: Path) -> None:
    # torch 2.8: vllm 0.33's Conv3dLayer would call F.conv3d, so only the torch check stops it.
    env = mineru4(tmp_path / "cpu", torch="2.8.0+cpu")
    plain = env.cli("apply", "--dry-run")
    assert "would be applied" not in plain.stderr
    forced = env.cli("apply", "--dry-run", "--force")
    assert forced.returncode == 0, forced.stderr
    applied = [line for line in forced.stderr.splitlines() if "would be applied" in line]
    # MinerU's choice of targets stands: --force never patches the 15 towers it never runs.
    assert [line.split(":")[0] for line in applied] == list(RUN), forced.stderr
    assert all("--force overrode: torch is not a ROCm build" in line for line in applied)


def test_a_machine_without_rocm_says_so_first_and_once(tmp_path: Path) -> None:
    """On a machine that needs nothing (a CPU torch), every command, revert too, repeated the
    torch-not-rocm and mixed-torch warnings (issue 43): now status and apply lead with one
    line that says so and where to go, and revert says none of it."""
    env = mineru4(tmp_path / "cpu", torch="2.8.0+cpu")
    lead = "No ROCm torch here (torch 2.8.0+cpu is a CPU-only build): the kernel patches"
    python = ("--python", str(env.python))
    status = at_terminal(80, "status", *python).splitlines()
    # The lead comes right after the Environment line (which a long temporary path, as
    # under xdist, spreads over more than one line).
    at = next(i for i, line in enumerate(status) if line.startswith(lead))
    assert status[0].startswith("Environment") and "(Python" in " ".join(status[:at]), status
    assert not any(line.startswith(("next:", "not installed")) for line in status[:at]), status
    assert "run `rocmfix doctor` on the ROCm machine" in " ".join(" ".join(status).split())
    assert "torch-not-rocm" not in " ".join(status), status
    assert status[-1] == "next: nothing to do", status
    apply = at_terminal(80, "apply", *python).splitlines()
    assert apply[0].startswith(lead), apply
    assert "torch-not-rocm" not in " ".join(apply) and " ".join(apply).count("mixed-torch") == 1
    revert = at_terminal(80, "revert", *python).splitlines()
    assert revert == ["Nothing to revert: rocmfix has not patched this environment."], revert
    assert env.cli("status", "--json").json()["warnings"][0]["code"] == "torch-not-rocm"


def test_top_level_python_and_the_next_line(env: InstalledEnv) -> None:
    bare = run_cli("--python", str(env.python))
    assert bare.returncode == 0, bare.stderr
    assert "vllm-qwen2-vl" in bare.stdout
    assert f"next: rocmfix apply --dry-run --python {env.python}" in bare.stderr
    status = env.cli("status")
    assert "next: rocmfix apply --dry-run" in status.stderr
    misplaced = run_cli("--python", str(env.python), "status")
    assert misplaced.returncode == 2 and "after the command" in misplaced.stderr


ARCHS = (["gfx942"], ["gfx1100"], ["sm_90"])
KERNEL_ARGS = ("--op", "patch-embed", "--arch", "gfx942", "--arch", "gfx1100", "--arch", "sm_90")


@pytest.mark.parametrize("columns", [80, 100])
def test_kernels_fit_the_terminal_and_cut_no_arch(columns: int) -> None:
    screen = at_terminal(columns, "kernels", *KERNEL_ARGS, stdout_to_null=False)
    body = screen[screen.index("Environment") :]
    fits(body, columns)
    assert "…" not in body
    words = _words(body)
    document = run_cli("kernels", "--json", *KERNEL_ARGS, timeout=600).json()
    for check in document["checks"]:
        assert check["arch"] in words, check["arch"]
    header = next(line for line in body.splitlines() if line.split()[:1] == ["arch"])
    assert header.split() == ["arch", "regs", "spills", "LDS", "waves", "matrix", "check",
                              "config"]  # fmt: skip
    # One row per compile, each with its whole verdict.
    rows = [line.split() for line in body.splitlines() if line.split()[:1] in ARCHS]
    assert len(rows) == len(document["checks"]), body
    assert all("ok" in row for row in rows), body


@pytest.mark.parametrize("columns", [80, 100])
def test_doctor_fits_the_terminal_and_cuts_no_verdict(columns: int) -> None:
    screen = at_terminal(columns, "doctor", "--op", "dilated-conv")
    body = screen[screen.index("Environment") :]
    fits(body, columns)
    assert "…" not in body
    said = " ".join(body.split())
    assert "act(bn(F.conv2d)) (CPU)" in said
    # Without a GPU: one line per case with each scheme's whole check against fp64, no columns
    # of times that mean nothing there (a CPU printed about 160 lines of them: issue 43).
    assert "first call" not in said and "vs native" not in said
    for impl in ("gemm", "linear"):
        assert said.count(f"{impl} ok (rel err ") == 6, body
    # torch here is no ROCm build: said first, once.
    heads = [line for line in body.splitlines() if not line.startswith(" ")]
    lead = [i for i, line in enumerate(heads) if line.startswith("No ROCm torch here")]
    assert len(lead) == 1 and lead[0] < heads.index("dilated conv"), body
    assert "torch-not-rocm" not in said
    assert len(body.splitlines()) < 40, body


def test_piped_doctor_and_kernels_have_whole_headers_and_no_trailing_spaces() -> None:
    doctor = run_cli("doctor", "--op", "dilated-conv", timeout=600)
    kernels = run_cli("kernels", *KERNEL_ARGS, timeout=600)
    for done in (doctor, kernels):
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert all(line == line.rstrip() for line in lines)
        assert "…" not in done.stdout
    assert any(line.split()[-1:] == ["config"] for line in kernels.stdout.splitlines())
    cases = [line for line in doctor.stdout.splitlines() if "gemm ok (rel err " in line]
    assert len(cases) == 6 and all(line.startswith("  ") for line in cases), doctor.stdout
