"""The patches rocmfix knows, in the order it shows and applies them, and how a command line
selects among them."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Sequence

from ._resources import patches_package
from .errors import UsageError
from .ops import OPS
from .patch import Patch


@functools.cache
def all_patches() -> tuple[Patch, ...]:
    patches = tuple(patches_package().PATCHES)
    assert all(isinstance(p, Patch) for p in patches)
    ids = [p.id for p in patches]
    assert len(ids) == len(set(ids)), "patch ids must be unique"
    return patches


def scheme_names() -> tuple[str, ...]:
    """Every scheme some op offers, in the registry's order."""
    return tuple(dict.fromkeys(s.name for op in OPS for s in op.schemes))


def setting_names() -> tuple[str, ...]:
    """The schemes of patches without an op: settings of their one rewrite."""
    return tuple(dict.fromkeys(s.name for p in all_patches() for s, _ in p.settings))


def select(patches: Sequence[Patch], only: Iterable[str] = ()) -> tuple[Patch, ...]:
    """Patches named by id or by distribution; all of them when ``only`` is empty."""
    wanted = list(dict.fromkeys(only))
    if not wanted:
        return tuple(patches)
    ids = {p.id for p in patches}
    distributions = list(dict.fromkeys(p.distribution for p in patches))
    unknown = [name for name in wanted if name not in ids and name not in distributions]
    if unknown:
        known = [*distributions, *sorted(ids)]
        near = [match for name in unknown for match in _closest(name.lower(), known)]
        maybe = f"did you mean {', '.join(dict.fromkeys(near))}? " if near else ""
        raise UsageError(
            f"unknown patch or distribution {', '.join(unknown)}",
            hint=f"{maybe}--only takes a distribution ({', '.join(distributions)}) or a "
            "patch id (`rocmfix list` shows them)",
        )
    return tuple(p for p in patches if p.id in wanted or p.distribution in wanted)


def _closest(name: str, known: Sequence[str]) -> list[str]:
    """The few names ``name`` is most likely a typo of, best first; past a near-exact match
    (``transformer``), the names well behind it are noise. A fragment that is no typo of any
    (``hgnet``) gets the names it is part of."""
    scored = sorted(
        ((difflib.SequenceMatcher(None, name, k).ratio(), k) for k in known), reverse=True
    )
    best = scored[0][0] if scored else 0.0
    close = [k for ratio, k in scored[:3] if ratio >= max(0.6, best - 0.1)]
    return close or [k for k in known if name in k][:3]


def choose(what: str, names: Sequence[str], known: Sequence[str]) -> tuple[str, ...]:
    """``names``, each one of ``known`` (a UsageError names any other), in ``known``'s order;
    all of ``known`` where ``names`` is empty."""
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(
            f"unknown {what} {', '.join(n or repr(n) for n in unknown)}",
            hint=f"choose from {', '.join(known)}",
        )
    return tuple(k for k in known if k in names) if names else tuple(known)


def named(patches: Sequence[Patch], only: Iterable[str] = ()) -> frozenset[str]:
    """The patches ``only`` names by id: those the user asks for whatever MinerU runs. A
    distribution name filters within what applies; it overrides nothing."""
    wanted = set(only)
    return frozenset(p.id for p in patches if p.id in wanted)


def check_scheme(patches: Sequence[Patch], scheme: str | None) -> None:
    """A scheme applies to the selected patches that offer it (the others keep their
    default); refuse one that none of them offers, and say which offers what."""
    if scheme is None or any(scheme in p.scheme_names for p in patches):
        return
    groups: dict[tuple[str, ...], list[str]] = {}
    for patch in patches:
        groups.setdefault(patch.scheme_names, []).append(patch.id)
    offers = "; ".join(
        f"{', '.join(ids)} {'offer' if len(ids) > 1 else 'offers'} {', '.join(names)}"
        if names
        else f"{', '.join(ids)} {'have' if len(ids) > 1 else 'has'} one fixed rewrite, no schemes"
        for names, ids in groups.items()
    )
    known = (*scheme_names(), *setting_names())
    if scheme not in known:
        raise UsageError(f"unknown scheme {scheme!r}", hint=f"choose from {', '.join(known)}")
    raise UsageError(f"no selected patch offers scheme {scheme!r}", hint=offers)
