"""What a patch is: data about its target, plus one libcst classification and one transform.

Each module under ``patches/`` builds the :class:`Patch` of one target file (or a table of
them, for a family of files with one shape). The engine reads the data (distribution, path,
the op and so the schemes and templates) and calls the two functions; it never looks inside
a target file any other way.
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import libcst as cst

from .ops import Op, Scheme
from .rewrite import focused, parse


class CodeShape(enum.Enum):
    """What a patch recognises in a target file's code."""

    NEEDS_PATCH = "needs-patch"
    FIXED_UPSTREAM = "fixed-upstream"
    PATCHED = "patched"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Classification:
    shape: CodeShape
    reason: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TorchInfo:
    version: str
    hip: str | None
    cuda: str | None


@dataclass(frozen=True)
class TargetContext:
    """What a classification may know beyond its file: versions are hints, never verdicts;
    ``related`` holds the bytes of the other files the patch reads, its own package's or
    another distribution's as "dist:path" (None where there is no such file)."""

    version: str
    versions: Mapping[str, str]
    torch: TorchInfo | None
    related: Mapping[str, bytes | None] = field(default_factory=dict)


@dataclass(frozen=True)
class MinerUUse:
    """How MinerU's own code shows that it runs a target: any import of one of ``imports``
    (a module or its submodules), of one of ``names`` from any module, or any string constant
    in ``strings``, or ``own`` (the target is MinerU's own file). With none of them, no MinerU
    runs the target, and ``what`` says why; else ``what`` names the part of MinerU that runs
    it."""

    what: str
    imports: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    strings: tuple[str, ...] = ()
    # A file of MinerU's own package: MinerU runs it whenever it runs the model it belongs to.
    own: bool = False
    # One of MinerU's small models, which run in torch only where MinerU's torch stack is
    # installed (rocmfix.mineru reads which), else in ONNX.
    small_model: bool = False

    @property
    def never(self) -> bool:
        return not (self.own or self.imports or self.names or self.strings)


@dataclass(frozen=True)
class Drop:
    """A template file that a scheme drops beside its target: ``dest`` is relative to the
    folder that holds the package, like :attr:`Patch.path`."""

    source: str
    dest: str


Classifier = Callable[[cst.Module, TargetContext], Classification]
Transformer = Callable[[cst.Module], cst.Module]


@dataclass(frozen=True)
class Patch:
    """One target file and how to fix it.

    ``path`` is relative to the directory that holds the top-level package (site-packages
    for a wheel install, the source checkout for an editable one), with ``/`` separators.
    A kernel patch routes an :class:`~rocmfix.ops.Op` and offers its schemes: the scheme's
    entry template is dropped as ``kernel_module``, its support templates beside it under
    their own names. A patch without an op has one rewrite; where it offers ``settings`` (schemes
    of that rewrite, each with its transform), ``--scheme`` picks one, else it does not apply.
    """

    id: str
    summary: str
    distribution: str
    package: str
    path: str
    classify: Classifier
    transform: Transformer
    missing_reason: str
    op: Op | None = None
    kernel_module: str | None = None
    known: tuple[str, ...] = field(default=())
    # Files the classification reads: of the same package (vllm's conv.py, say), or of
    # another distribution as "dist:path" (mineru-vl-utils reads vllm's tokenizer group).
    related: tuple[str, ...] = field(default=())
    # How to tell whether the MinerU in the environment runs this target; None: no opinion.
    mineru: MinerUUse | None = None
    # The one class the classification looks at, if it looks at one: status then parses only
    # that class (see rewrite.focused), not the whole file.
    focus: str | None = None
    # A patch without an op may still drop one template as ``kernel_module``: the runner its
    # fixed rewrite calls (the graph replay's, say).
    runner: str | None = None
    # The one scheme of ``op`` that this fixed rewrite is (a setting, where the op's schemes
    # are settings of the user's stack): it offers no other, and apply follows what doctor
    # measured of that scheme, not of the op's best.
    realizes: str | None = None
    # A patch without an op may offer settings of its rewrite as schemes, each with its own
    # transform (the first the default): the rec graph replay's width bucket, say.
    settings: tuple[tuple[Scheme, Transformer], ...] = ()

    def parse(self, data: bytes) -> cst.Module:
        """The module ``classify`` reads: the whole file, or only its focus class."""
        return focused(data, self.focus) if self.focus else parse(data)

    @property
    def schemes(self) -> tuple[Scheme, ...]:
        if self.op is None:
            return tuple(scheme for scheme, _ in self.settings)
        if self.realizes is not None:
            return (self.op.scheme(self.realizes),)
        return self.op.schemes

    @property
    def scheme_names(self) -> tuple[str, ...]:
        return tuple(scheme.name for scheme in self.schemes)

    @property
    def default_scheme(self) -> str | None:
        return self.schemes[0].name if self.schemes else None

    @property
    def needs_rocm(self) -> bool:
        """A kernel patch fixes a ROCm library gap; on a CUDA or CPU torch it is not needed."""
        return self.op is not None

    def scheme(self, name: str | None) -> Scheme | None:
        if self.op is None:
            return None
        return self.op.scheme(name or self.schemes[0].name)

    def transformer(self, scheme: str | None) -> Transformer:
        """The transform that writes ``scheme``: a setting's own, else the patch's one."""
        return next((t for s, t in self.settings if s.name == scheme), self.transform)

    def drops(self, scheme: str | None) -> tuple[Drop, ...]:
        if self.op is None and self.runner is not None and self.kernel_module is not None:
            return (Drop(self.runner, self.kernel_module),)
        chosen = self.scheme(scheme)
        if chosen is None or self.kernel_module is None:
            return ()
        folder = posixpath.dirname(self.kernel_module)
        support = (Drop(t, posixpath.join(folder, t)) for t in chosen.support)
        return (Drop(chosen.entry, self.kernel_module), *support)

    @property
    def drop_paths(self) -> frozenset[str]:
        """Every file any scheme of this patch may drop: all a manifest may name for it."""
        schemes: tuple[str | None, ...] = self.scheme_names or (None,)
        return frozenset(d.dest for s in schemes for d in self.drops(s))
