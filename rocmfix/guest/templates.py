"""Load rocmfix's kernel templates from their folder, the one way every caller does it.

The kernels import their shared config module relatively (``from . import
rocmfix_kernel_config``), as they do once dropped into a target package, so the folder is
loaded as a package of its own. ``fresh`` gives a new package (and new module objects, caches
and all): the tests import a template under several environments.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import sys
from types import ModuleType

_PACKAGE = "_rocmfix_templates"
_counter = itertools.count(1)


def _package(folder: str, name: str) -> ModuleType:
    package = sys.modules.get(name)
    if package is None:
        spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        assert spec is not None
        package = importlib.util.module_from_spec(spec)
        package.__path__ = [folder]
        sys.modules[name] = package
    return package


def load(folder: str, template: str, *, fresh: bool = False) -> ModuleType:
    """Import ``template`` (``patch_embed_gemm.py`` or ``patch_embed_gemm``) from ``folder``."""
    name = f"{_PACKAGE}_{next(_counter)}" if fresh else _PACKAGE
    package = _package(os.path.abspath(folder), name)
    module = template[:-3] if template.endswith(".py") else template
    return importlib.import_module(f"{package.__name__}.{module}")
