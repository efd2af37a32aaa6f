"""How the bench scripts import the templates: as the dropped-in kernels are imported, from a
package folder, so their relative import of ``rocmfix_kernel_config`` resolves (by path alone
it would not)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rocmfix.guest.templates import load  # noqa: E402


def template(name: str) -> ModuleType:
    """A fresh copy of ``templates/<name>.py`` (each call its own module and config cache)."""
    return load(str(ROOT / "templates"), name, fresh=True)


def dropped(path: Path) -> ModuleType:
    """A kernel module as rocmfix dropped it into a target package, with its config beside it."""
    return load(str(path.parent), path.name, fresh=True)
