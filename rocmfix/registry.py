"""The list of patches rocmfix knows, in the order it shows and applies them."""

from __future__ import annotations

import functools

from ._resources import patches_package
from .patch import Patch


@functools.cache
def all_patches() -> tuple[Patch, ...]:
    patches = tuple(patches_package().PATCHES)
    assert all(isinstance(p, Patch) for p in patches)
    ids = [p.id for p in patches]
    assert len(ids) == len(set(ids)), "patch ids must be unique"
    return patches
