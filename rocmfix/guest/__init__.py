"""Code that runs inside the user's interpreter: the probe, the doctor/tune worker and the
per-op harness.

The target environment is not rocmfix's own (rocmfix may live in pipx while MinerU runs in a
conda env with another Python), so nothing here imports rocmfix's host side, and nothing is
imported from rocmfix's environment: the host loads this folder as a package of its own by
path (:data:`BOOT`), without putting rocmfix's site-packages on the target's ``sys.path``.
Modules import only the standard library at module level; torch and triton are imported where
they are needed, so a missing or broken install becomes an event, never a traceback. The
probe runs on Python 3.8+, the rest on 3.9+ (torch 2.x's floor).
"""

from __future__ import annotations

import os

# ``python -c BOOT FOLDER MODULE ARGS...``: load FOLDER as the package ``_rocmfix_guest``
# and run MODULE's ``main(argv)``. Neither the current directory nor rocmfix's checkout may
# shadow the target's packages, so the script's own directory entry is dropped before anything
# is imported (os and sys are loaded by every interpreter's startup, so importing them reads
# nothing); the host also starts every child in ``/``.
BOOT = """
import os, sys
while sys.path and sys.path[0] in ("", os.getcwd()):
    sys.path.pop(0)
import importlib.util
folder = sys.argv[1]
spec = importlib.util.spec_from_file_location(
    "_rocmfix_guest", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
)
package = importlib.util.module_from_spec(spec)
sys.modules["_rocmfix_guest"] = package
spec.loader.exec_module(package)
module = importlib.import_module("_rocmfix_guest." + sys.argv[2])
sys.exit(module.main(sys.argv[2:]))
"""


def command(python: str, module: str, *args: str) -> list[str]:
    """The argv that runs ``module``'s ``main`` in ``python``, from this folder."""
    return [python, "-c", BOOT, os.path.dirname(os.path.abspath(__file__)), module, *args]
