"""Where the patches and templates are: inside the installed package (the wheel maps the
top-level ``patches/`` and ``templates/`` into ``rocmfix/``), or beside it in a checkout."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    for candidate in (_HERE / name, _HERE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"rocmfix is missing its {name}/ folder (looked in {_HERE})")


@functools.cache
def template_bytes(name: str) -> bytes:
    return (data_dir("templates") / name).read_bytes()


def patches_package() -> ModuleType:
    """Import the patch modules as ``rocmfix.patches``, wherever the folder is."""
    try:
        return importlib.import_module("rocmfix.patches")
    except ModuleNotFoundError as exc:
        if exc.name != "rocmfix.patches":
            raise
    folder = data_dir("patches")
    spec = importlib.util.spec_from_file_location(
        "rocmfix.patches", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rocmfix.patches"] = module
    spec.loader.exec_module(module)
    return module
