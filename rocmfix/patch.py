"""What a patch is: data about its target, plus one libcst classification and one transform.

Each module under ``patches/`` builds one :class:`Patch` for one target file. The engine
reads the data (distribution, path, schemes, templates) and calls the two functions; it
never looks inside a target file any other way.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import libcst as cst


class Shape(enum.Enum):
    """What a patch recognises in a target file's code."""

    NEEDS_PATCH = "needs-patch"
    FIXED_UPSTREAM = "fixed-upstream"
    PATCHED = "patched"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Classification:
    shape: Shape
    reason: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TorchInfo:
    version: str
    hip: str | None
    cuda: str | None


@dataclass(frozen=True)
class TargetContext:
    """What a classification may know beyond the code: versions are hints, never verdicts."""

    version: str
    versions: Mapping[str, str]
    torch: TorchInfo | None


@dataclass(frozen=True)
class Template:
    """A file from ``templates/`` that a scheme drops beside its target."""

    source: str
    dest: str


@dataclass(frozen=True)
class Scheme:
    name: str
    summary: str
    templates: tuple[Template, ...] = ()
    needs_triton: bool = False


Classifier = Callable[[cst.Module, TargetContext], Classification]
Transformer = Callable[[cst.Module, "str | None"], cst.Module]


@dataclass(frozen=True)
class Patch:
    """One target file and how to fix it.

    ``path`` is relative to the directory that holds the top-level package (site-packages
    for a wheel install, the source checkout for an editable one), with ``/`` separators.
    A patch without schemes has one fixed rewrite; ``--scheme`` does not apply to it.
    """

    id: str
    summary: str
    distribution: str
    package: str
    path: str
    classify: Classifier
    transform: Transformer
    missing_reason: str
    schemes: tuple[Scheme, ...] = ()
    known: tuple[str, ...] = field(default=())
    # A kernel patch fixes a ROCm library gap; on a CUDA or CPU torch it is not needed.
    needs_rocm: bool = False

    def scheme(self, name: str | None) -> Scheme | None:
        if not self.schemes:
            return None
        for scheme in self.schemes:
            if scheme.name == name:
                return scheme
        raise KeyError(name)

    @property
    def scheme_names(self) -> tuple[str, ...]:
        return tuple(scheme.name for scheme in self.schemes)

    def templates(self, scheme: str | None) -> tuple[Template, ...]:
        chosen = self.scheme(scheme)
        return chosen.templates if chosen is not None else ()
