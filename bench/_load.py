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


def triton_op(template: ModuleType) -> bool | None:
    """Whether the template's op is a triton op (Inductor launches its kernel: issue 33) or
    the opaque one (``ROCMFIX_TRITON_OP=0``, torch < 2.7); None for a template without one."""
    rop, name = getattr(template, "rop", None), getattr(template, "OP_NAME", None)
    if rop is None or name is None:
        return None
    return type(getattr(rop.rt.process_holder(), name, None)).__name__ == "CustomOpDef"


def dropped(path: Path) -> ModuleType:
    """A kernel module as rocmfix dropped it into a target package, with its config beside it."""
    return load(str(path.parent), path.name, fresh=True)
