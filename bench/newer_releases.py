"""Which target releases came out after the ones the suite is pinned to (tests/releases.py:
PINNED). A report, never a failure: CI prints it after the tests.

    python bench/newer_releases.py

To take a new release in: bump its line in PINNED, run the suite and
`python bench/compat_matrix.py --jobs 2`, and read what changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import releases


def main() -> int:
    for project, pinned in releases.PINNED.items():
        try:
            found = releases.newer(project)
        except OSError as exc:  # offline: nothing to report, and no reason to fail
            print(f"{project}: cannot read the index ({exc})")
            continue
        if found:
            print(f"{project}: pinned {pinned}; newer on PyPI: {', '.join(found)}")
        else:
            print(f"{project}: pinned {pinned} is the newest")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
