"""What an op is: the data types of the op registry (see :mod:`rocmfix.ops`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocmfix.guest.protocol import GridSpec, OpSpec, ShapePair

TensorShape = Mapping[str, Any]
Config = Mapping[str, Any]

# Short names of the dtypes the shapes (and the profiled calls) use, for tables.
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}

# The plumbing templates a Triton scheme drops beside its kernel, config module first (every
# kernel imports its config resolution from it, under this same name): the Triton import
# switch with the launcher, the custom-op registration and the shared helpers (caches,
# BatchNorm folds, activation codes). They import each other, so they go together.
TRITON_SUPPORT = (
    "rocmfix_kernel_config.py",
    "rocmfix_triton.py",
    "rocmfix_custom_op.py",
    "rocmfix_kernel_support.py",
)


def tile(bm: int, bn: int, bk: int, warps: int, stages: int, **extra: Any) -> dict[str, Any]:
    """A tile config as the templates read it."""
    return {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "num_warps": warps,
        "num_stages": stages,
        **extra,
    }


@dataclass(frozen=True)
class Scheme:
    """One way to run an op. ``entry`` is the template that becomes the patch's kernel module
    (under the name the patch gives it); ``support`` templates are dropped beside it under their
    own names. The first scheme of an op is its default. A scheme with no ``entry`` is a
    setting of the user's own stack (an engine's backend, a library's flag), which the op's
    harness runs by name; ``env`` is what the worker that measures it must start with (read
    before torch is imported): doctor measures it in a worker of its own, and the others in
    one without those variables."""

    name: str
    summary: str
    label: str
    entry: str
    support: tuple[str, ...] = ()
    needs_triton: bool = False
    env: tuple[tuple[str, str], ...] = ()

    @property
    def templates(self) -> tuple[str, ...]:
        return (self.entry, *self.support) if self.entry else self.support


@dataclass(frozen=True)
class Case:
    """A shape MinerU runs, on a GPU and scaled down for Triton's CPU interpreter: one
    ``doctor`` measures (an op's cases), or one ``tune`` searches the kernel at (its tune
    targets, ``id`` the registry's id of the target)."""

    id: str
    gpu: TensorShape
    cpu: TensorShape


@dataclass(frozen=True)
class GridGroup:
    """Tile configs ``tune`` tries when every condition in ``when`` holds on the user's GPU.

    Conditions (evaluated by the target-side harness): ``cpu``, ``hip``, ``cuda``,
    ``sm>=90``, ``host-tma`` (sm_90+ with Triton's host tensor descriptors), ``arch:PREFIX``,
    ``option:NAME`` (the HIP backend knows that launch option), ``precision:NAME``; a leading
    ``!`` negates one.
    """

    when: tuple[str, ...]
    configs: tuple[Config, ...]


@dataclass(frozen=True)
class Op:
    """An op and everything rocmfix knows about it, as data. A module of this package that
    defines ``OP`` is an op: the registry finds it there (see :mod:`rocmfix.ops`)."""

    name: str
    title: str
    native: str
    schemes: tuple[Scheme, ...]
    cases: tuple[Case, ...]
    # The module under rocmfix.guest.harness that builds this op's inputs and calls it.
    harness: str
    # How a table row or a progress line names one of this op's shapes.
    label: Callable[[TensorShape], str]
    # The template's tunable kernel: its key in the tuned file and the template ``tune`` runs,
    # its tune targets and grid (none for an op whose schemes are all vendor formulations or
    # settings: nothing to tune or compile).
    kernel: str = ""
    kernel_template: str = ""
    tune: tuple[Case, ...] = ()
    grid: tuple[GridGroup, ...] = ()
    # The function of every scheme's template that the patched code calls.
    function: str = ""
    # The environment variable its kernel templates read a config override from (each
    # template declares it as ``CONFIG_ENV``; tune measures without it, doctor reports it).
    config_env: str | None = None
    # The scheme that runs without Triton, offered where Triton is missing.
    fallback: str | None = None
    # Where the op sorts among the others: tables, progress and the worker's order.
    order: int = 100
    # The dtypes its kernels are checked in, ahead of time, on every GPU.
    dtypes: tuple[str, ...] = ("bfloat16", "float16", "float32")
    # Whether the vendor op is slow depends on the GPU and the ROCm release: status and apply
    # follow what doctor measured here (rocmfix.measured), not the code alone.
    measured_verdict: bool = False
    # How ``rocmfix profile`` knows a recorded conv call for this op, from its arguments (as
    # ``profile.analyse.conv_params`` reads them) and the input's and weight's shapes. The ops'
    # rules are disjoint: a call is at most one op's.
    matches: Callable[[Mapping[str, Any], Sequence[int], Sequence[int]], bool] | None = None
    # The function of each scheme's entry that takes the recorded call's arguments as its
    # torch functional does (``F.conv2d``, ``F.conv3d``, ``F.conv_transpose2d``: input, weight,
    # bias, then the rest in that functional's order, stride, padding, dilation and
    # output_padding as one number per spatial axis) and raises NotImplementedError for a call
    # it does not compute: ``rocmfix profile`` replays each scheme through it, as
    # ``rocmfix <label>`` (see :attr:`replayed`).
    replay: str = ""
    # How the profiler knows this op when it is not a conv it classifies by its arguments:
    # the torch op it is called as (``calls``), from a file whose path ends in one of
    # ``sites`` (the engine's wrapper that issues it).
    calls: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    # What ran for one of ``calls`` (any caller's), from the ops it called as the profiler
    # recorded them: ``(what ran, why a setting `rocmfix env` exports fixes it)``, the second
    # None where no setting would (it is set, or the fast kernel ran), or None where the
    # callees do not say. ``hip``: a ROCm torch; ``env``: the run's environment.
    kernel_ran: (
        Callable[[Sequence[str], bool, Mapping[str, str]], tuple[str, str | None] | None] | None
    ) = None

    def __post_init__(self) -> None:
        names = self.scheme_names
        assert len(set(names)) == len(names), f"{self.name}: scheme names must be unique"
        if self.fallback is not None:
            fallback = self.scheme(self.fallback)
            assert not fallback.needs_triton, f"{self.name}: the fallback scheme needs Triton"
        assert not self.kernel_template or self.kernel_template in {s.entry for s in self.schemes}

    @property
    def scheme_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.schemes)

    @property
    def default_scheme(self) -> Scheme:
        return self.schemes[0]

    def scheme(self, name: str) -> Scheme:
        for scheme in self.schemes:
            if scheme.name == name:
                return scheme
        raise KeyError(name)

    @property
    def replayed(self) -> dict[str, Scheme]:
        """The schemes ``rocmfix profile`` replays, by the label of their form: the first
        scheme of each label (``rocmfix Triton`` is the op's default Triton scheme)."""
        if not self.replay:
            return {}
        found: dict[str, Scheme] = {}
        for scheme in self.schemes:
            found.setdefault(f"rocmfix {scheme.label}", scheme)
        return found

    def request(self) -> OpSpec:
        """What the target-side harness needs (sent as JSON)."""
        return OpSpec(
            name=self.name,
            harness=self.harness,
            config_env=self.config_env,
            kernel=self.kernel,
            kernel_template=self.kernel_template,
            schemes={s.name: s.entry for s in self.schemes},
            triton_schemes=[s.name for s in self.schemes if s.needs_triton],
            dtypes=list(self.dtypes),
            cases={c.id: ShapePair(gpu=dict(c.gpu), cpu=dict(c.cpu)) for c in self.cases},
            tune={t.id: ShapePair(gpu=dict(t.gpu), cpu=dict(t.cpu)) for t in self.tune},
            grid=[
                GridSpec(when=list(g.when), configs=[dict(c) for c in g.configs]) for g in self.grid
            ],
            replay=self.replay,
        )
