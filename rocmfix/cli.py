"""The command line: parse, call the engine, render, exit. Nothing else lives here."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer

from . import __version__, crashlog, doctor, exports, fsops, kernels, tune, tuned_file
from .environment import Environment, discover
from .errors import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Interrupted,
    RocmfixError,
    UsageError,
)
from .ops import OPS
from .patch import Patch
from .registry import all_patches, choose, named, scheme_names, select, setting_names
from .render import console, help_hooks
from .render.doctor import doctor_json, doctor_table
from .render.kernels import kernels_json, kernels_table
from .render.run import diff, run_summary
from .render.status import check_failures, next_step, patch_list, status_json, status_table
from .render.tune import tune_json, tune_reset, tune_table
from .results import WorkerReport
from .write import commands as write

# Choices come from the op registry and the patch list, and --help shows them; the values are
# checked by the engine (registry.select, registry.check_scheme, registry.choose), whose errors
# name what is wrong in rocmfix's own words instead of click's.
SCHEMES = ", ".join(scheme_names())
SETTINGS = ", ".join(setting_names())
DEFAULT_SCHEMES = "; ".join(f"{op.title}: {op.default_scheme.name}" for op in OPS)
OPS_CHOICE = ", ".join(op.name for op in OPS)
DISTRIBUTIONS = ", ".join(dict.fromkeys(p.distribution for p in all_patches()))


P = ParamSpec("P")
R = TypeVar("R", bound=WorkerReport)

help_hooks.no_types()

app = typer.Typer(
    name="rocmfix",
    help="Safe, reversible fixes for the slow ops and crashes of MinerU and Qwen-VL models on "
    "AMD GPUs: vllm, sglang, lmdeploy, transformers, MinerU's own models, DocLayout-YOLO, "
    "mineru-vl-utils.",
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

PythonOpt = Annotated[
    str | None,
    typer.Option(
        "--python",
        metavar="PATH",
        help="Interpreter of the environment to work on (default: the one running rocmfix).",
    ),
]
OnlyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--only",
        metavar="NAME",
        help=f"A distribution ({DISTRIBUTIONS}): only its patches, of those that apply; or a "
        "patch id (`rocmfix list`): that patch even where MinerU never runs it. Repeat to "
        "select several (default: all that apply).",
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Override rocmfix's refusals: patch a file someone else changed (or that "
        "cannot be checked), and patch on a torch that is not a ROCm build. Each line says "
        "what it overrode. Never overrides what MinerU runs (--only PATCH does).",
    ),
]
RevertForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Restore a file, or remove a dropped one, even if someone else changed it since "
        "rocmfix patched it.",
    ),
]


def _boundary(command: Callable[P, int]) -> Callable[P, None]:
    """The one error boundary: a command returns its exit code, and here the engine's errors
    become one line on stderr and the documented exit code."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            code = command(*args, **kwargs)
        except RocmfixError as exc:
            console.error(exc)
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError:
            # Whoever read the output has gone (`| head`): typer ends the run quietly with 1,
            # as rich does for its own writes and Python's documentation advises; not an
            # error line.
            raise
        except OSError as exc:
            # The system refused a read or a write rocmfix did not expect to fail (a failing
            # disk, a permission): a condition of the machine, not a bug, and one line.
            where = f" ({exc.filename})" if exc.filename else ""
            console.error(
                RocmfixError(
                    f"{exc.strerror or exc}{where}",
                    hint="`rocmfix status` says what state every file is in",
                )
            )
            raise typer.Exit(EXIT_FAILED) from None
        except KeyboardInterrupt:
            # Ctrl-C where no engine said what state it left (apply and revert do): one line.
            console.error(Interrupted("interrupted"))
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:  # noqa: BLE001 - the last line of defence: log, no traceback
            console.internal_error(exc, crashlog.write(exc))
            raise typer.Exit(EXIT_INTERNAL) from None
        raise typer.Exit(code)

    return run


def _shown(
    report: R, as_json: bool, document: Callable[[R], None], table: Callable[[R], None]
) -> int:
    """A worker command's report, as JSON or a table; exit 1 where it found a failure."""
    (document if as_json else table)(report)
    return EXIT_OK if report.ok else EXIT_FAILED


def _setup(python: str | None, only: list[str] | None) -> tuple[Environment, tuple[Patch, ...]]:
    patches = select(all_patches(), only or ())
    return discover(patches, python), patches


@app.command(cls=help_hooks.Command)
@_boundary
def status(
    python: PythonOpt = None,
    only: OnlyOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print a JSON document (schema rocmfix-status/1)."),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Exit 1 unless every selected patch is applied, not needed or not installed.",
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Every patch with its reason and notes, by distribution (default: what needs "
            "doing in full, the rest one line per reason).",
        ),
    ] = False,
) -> int:
    """Show what is installed, patched and needed, and why.

    Example: [bold]rocmfix status --python ~/venvs/mineru/bin/python[/]
    """
    env, patches = _setup(python, only)
    report = write.status(
        env, patches, explicit=named(patches, only or ()), waiting=console.waiting
    )
    if as_json:
        status_json(report)
    else:
        status_table(report, verbose=verbose)
        next_step(report)
    if check and not report.settled:
        check_failures(report)
        return EXIT_FAILED
    return EXIT_OK


@app.command(cls=help_hooks.Command)
@_boundary
def apply(
    scheme: Annotated[
        str | None,
        typer.Option(
            "--scheme",
            metavar="SCHEME",
            help=f"How the kernel patches run their op: {SCHEMES}; settings other patches "
            f"offer: {SETTINGS} (`rocmfix list` describes each); a patch that does not offer it "
            f"keeps its own default ({DEFAULT_SCHEMES}).",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Write nothing; print a unified diff on stdout."),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Write nothing; exit 1 if anything would change (implies --dry-run).",
        ),
    ] = False,
    force: ForceOpt = False,
    python: PythonOpt = None,
    only: OnlyOpt = None,
) -> int:
    """Rewrite the target files and drop in the kernels, keeping backups.

    Example: [bold]rocmfix apply --scheme gemm[/]

    In CI: [bold]rocmfix apply --dry-run --check > rocmfix.diff[/]
    """
    if not (dry_run or check):
        write.refuse_if_busy(python)
    env, patches = _setup(python, only)
    result = write.apply(
        env,
        patches,
        scheme=scheme,
        force=force,
        dry_run=dry_run or check,
        explicit=named(patches, only or ()),
        waiting=console.waiting,
    )
    if result.dry_run:
        diff(result)
    run_summary(result)
    return EXIT_FAILED if check and result.changed else EXIT_OK


@app.command(cls=help_hooks.Command)
@_boundary
def revert(
    force: RevertForceOpt = False,
    python: PythonOpt = None,
    only: OnlyOpt = None,
) -> int:
    """Put the original bytes back and remove the dropped files.

    Example: [bold]rocmfix revert --only vllm[/]
    """
    write.refuse_if_busy(python)
    env, patches = _setup(python, only)
    run_summary(write.revert(env, patches, force=force, waiting=console.waiting))
    return EXIT_OK


@app.command("list", cls=help_hooks.Command)
@_boundary
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON document.")] = False,
) -> int:
    """List every patch: its target file, the versions and code shapes it knows, its schemes.

    Example: [bold]rocmfix list[/]
    """
    patch_list(all_patches(), as_json=as_json)
    return EXIT_OK


OpOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--op",
        metavar="OP",
        help=f"An op to measure: {OPS_CHOICE}; repeat to select several (default: all).",
    ),
]


@app.command("doctor", cls=help_hooks.Command)
@_boundary
def doctor_(
    python: PythonOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print a JSON document (schema rocmfix-doctor/1)."),
    ] = False,
    time_limit: Annotated[
        float,
        typer.Option(
            "--time-limit",
            metavar="SECONDS",
            help="Give up on a native op (or vendor-library scheme) that has no result after "
            "this long: a MIOpen kernel search, say.",
        ),
    ] = doctor.DEFAULT_TIME_LIMIT_S,
    op: OpOpt = None,
) -> int:
    """Measure the slow ops and every scheme's kernel on this GPU; say what to apply.

    Each kernel is checked against fp64 at MinerU's shapes and timed against the native op.

    Without a GPU: a check in Triton's CPU interpreter, at small shapes. Exit 1: a kernel failed.

    Example: [bold]rocmfix doctor --python ~/venvs/mineru/bin/python[/]
    """
    ops = doctor.select_ops(op or [])
    env, patches = _setup(python, None)
    status_report = write.status(env, patches)
    with console.progress("doctor") as progress:
        report = doctor.run(status_report, ops=ops, time_limit=time_limit, progress=progress)
    return _shown(report, as_json, doctor_json, doctor_table)


@app.command("tune", cls=help_hooks.Command)
@_boundary
def tune_(
    python: PythonOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print a JSON document (schema rocmfix-tune/1)."),
    ] = False,
    reset: Annotated[
        bool,
        typer.Option(
            "--reset",
            help="Remove the tuned-config file (every GPU's entries): the kernels go back to "
            "their shipped configs.",
        ),
    ] = False,
    budget: Annotated[
        float,
        typer.Option(
            "--budget",
            metavar="SECONDS",
            help="Stop trying new candidates after this long (compiles and checks included).",
        ),
    ] = tune.DEFAULT_BUDGET_S,
    op: OpOpt = None,
    interpret: Annotated[
        bool,
        typer.Option(
            "--interpret",
            hidden=True,
            help="Search in Triton's CPU interpreter on tiny shapes (tests the plumbing; the "
            "timings mean nothing).",
        ),
    ] = False,
) -> int:
    """Find each kernel's fastest correct tile config on this GPU and store it for the kernels.

    The kernels read it at import from $ROCMFIX_TUNED_FILE, else ~/.config/rocmfix/tuned.json.

    The shipped config stays unless a candidate is clearly faster.

    Example: [bold]rocmfix tune --python ~/venvs/mineru/bin/python[/]
    """
    if reset:
        path = tuned_file.tuned_path()
        tune_reset(str(path), tuned_file.reset(path))
        return EXIT_OK
    ops = doctor.select_ops(op or [])
    env = discover(all_patches(), python)
    with console.progress("tune") as progress:
        report = tune.run(env, ops=ops, budget_s=budget, interpret=interpret, progress=progress)
    return _shown(report, as_json, tune_json, tune_table)


@app.command("kernels", cls=help_hooks.Command)
@_boundary
def kernels_(
    python: PythonOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print a JSON document (schema rocmfix-kernels/1)."),
    ] = False,
    arch: Annotated[
        list[str] | None,
        typer.Option(
            "--arch",
            metavar="ARCH",
            help=f"A GPU to compile for: {', '.join(kernels.ARCHS)}; repeat to select "
            "several (default: all).",
        ),
    ] = None,
    op: OpOpt = None,
) -> int:
    """Compile every Triton kernel rocmfix drops for each GPU, without that GPU.

    Each kernel is compiled at MinerU's shapes, in each dtype, with the config that GPU would
    run (tuned file and environment included), by the interpreter's own Triton. A kernel fails
    when it does not compile, spills registers, needs more LDS/shared memory than the GPU has,
    or misses the GPU's matrix instruction. Exit 1: a kernel failed.

    Example: [bold]rocmfix kernels --arch gfx1100 --python ~/venvs/mineru/bin/python[/]
    """
    ops = doctor.select_ops(op or [])
    archs = choose("arch", arch or [], kernels.ARCHS)
    env = discover(all_patches(), python)
    with console.progress("kernels") as progress:
        report = kernels.run(env, archs=archs, ops=ops, progress=progress)
    return _shown(report, as_json, kernels_json, kernels_table)


@app.command("env", cls=help_hooks.Command)
@_boundary
def env_(
    shell: Annotated[
        str,
        typer.Option(
            "--shell",
            metavar="SHELL",
            help="Syntax of the lines printed: bash, zsh, fish or powershell.",
        ),
    ] = "bash",
    model_source: Annotated[
        str | None,
        typer.Option(
            "--model-source",
            metavar="SOURCE",
            help="Also export MINERU_MODEL_SOURCE: huggingface (MinerU's default), modelscope "
            "or local (never set unless asked for).",
        ),
    ] = None,
    python: PythonOpt = None,
) -> int:
    """Print the environment variables this environment needs, each with its reason.

    Example: [bold]eval "$(rocmfix env --python ~/venvs/mineru/bin/python)"[/]
    """
    # Refused before the probe runs.
    choose("shell", [shell], exports.SHELLS)
    choose(
        "model source", [] if model_source is None else [model_source], list(exports.MODEL_SOURCES)
    )
    env = discover(all_patches(), python)
    console.text(exports.script(env, shell, model_source))
    return EXIT_OK


@app.command(
    "profile",
    cls=help_hooks.Command,
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
@_boundary
def profile_(
    command: Annotated[
        list[str], typer.Argument(metavar="-- COMMAND [ARGS]...", help="The command to run.")
    ],
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="After the command ends, print a JSON document (schema rocmfix-profile/1) on "
            "stdout, after anything the command printed there. For a file of JSON alone, use "
            "--out DIR: it writes DIR/profile.json.",
        ),
    ] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="DIR",
            help="Write the traces (Perfetto / chrome://tracing), the repro snippets and "
            "profile.json there.",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", metavar="N", help="Ops to show.")] = 10,
    skip_seconds: Annotated[
        float, typer.Option("--skip-seconds", metavar="S", help="Skip each process's first S s.")
    ] = 0.0,
    skip_calls: Annotated[
        int,
        typer.Option("--skip-calls", metavar="N", help="Skip each process's first N model calls."),
    ] = 0,
    seconds: Annotated[
        float | None,
        typer.Option("--seconds", metavar="S", help="Profile S seconds, then stop."),
    ] = None,
    calls: Annotated[
        int | None,
        typer.Option("--calls", metavar="N", help="Profile N model calls, then stop."),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            metavar="PATH",
            help="Interpreter that replays the hot ops (default: the profiled process's own).",
        ),
    ] = None,
) -> int:
    """Profile a command's torch processes; name each slow op's fix.

    The command runs unmodified (children included); its output and exit code pass through.
    A model call is one forward of an outermost nn.Module. The report goes to stderr.

    Example: [bold]rocmfix profile -- mineru -p doc.pdf -o out -b pipeline[/]
    """
    from . import profile as profile_mod
    from .render import profile as render_profile

    args = command[1:] if command and command[0] == "--" else command
    window = profile_mod.Window(skip_seconds, skip_calls, seconds, calls)
    report = profile_mod.run(args, all_patches(), window=window, top=top, out_dir=out_dir,
                             python=python, on_warning=console.warning)  # fmt: skip
    render_profile.profile_table(report)
    if report.out_dir is not None and report.ops:
        render_profile.write_out(report, report.out_dir)
    if as_json:
        render_profile.profile_json(report)
    return report.exit_code


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rocmfix {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback(invoke_without_command=True)
def _main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            metavar="PATH",
            help="With no command: the interpreter whose environment to look at (each "
            "command takes its own --python).",
        ),
    ] = None,
) -> None:
    """With no command: a short status and the next command to run."""
    if ctx.invoked_subcommand is not None:
        if python is not None:
            # `rocmfix --python P status` would silently look at rocmfix's own interpreter.
            raise typer.BadParameter(
                f"give --python after the command: rocmfix {ctx.invoked_subcommand} --python PATH",
                param_hint="--python",
            )
        return
    status(python=python)


def main() -> None:
    """Run the app; click's own usage errors get rocmfix's one error style and exit 2."""
    if os.environ.get(fsops.TEST_HOOKS_ENV):
        console.warning(
            f"{fsops.TEST_HOOKS_ENV} is set: this run injects the faults its tests ask for"
        )
    try:
        code = app(prog_name="rocmfix", standalone_mode=False)
        # Here, not at exit: a reader that left must not turn into a traceback there.
        sys.stdout.flush()
    except BrokenPipeError:
        console.closed_pipe()
        sys.exit(EXIT_FAILED)
    except typer.TyperException as exc:  # click's errors: a usage error, or a file it opened
        context = getattr(exc, "ctx", None)
        command = context.command_path if context is not None else "rocmfix"
        console.error(UsageError(exc.format_message(), hint=f"`{command} --help` says more"))
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
    except typer.Abort:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
