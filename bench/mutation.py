"""Mutation testing of the code that writes files: every small break cosmic-ray can make in
rocmfix/fsops.py and rocmfix/write/transaction.py, each run against the fast in-process tests
of those modules; docs/mutation.md says what survived and why.

    python bench/mutation.py [--module rocmfix/fsops.py]... [--jobs N]

Needs cosmic-ray (`pip install cosmic-ray`). Mutants inside type annotations are skipped
before the run: the modules use ``from __future__ import annotations``, so an annotation is
never evaluated and its mutants are equivalent by construction. The source files are mutated
in place one at a time and restored after each run (cosmic-ray's own guarantee); run it on a
clean checkout.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("rocmfix/fsops.py", "rocmfix/write/transaction.py")
TESTS = ("tests/test_fsops_units.py", "tests/test_transaction.py")
CONFIG = """\
[cosmic-ray]
module-path = {modules}
timeout = 60.0
excluded-modules = []
test-command = "{python} -m pytest -x -q -p no:cacheprovider {tests}"

[cosmic-ray.distributor]
name = "local"
"""


def _annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    spans = []
    for node in ast.walk(tree):
        annotations: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
        elif isinstance(node, (ast.arg, ast.AnnAssign)):
            annotations.append(node.annotation)
        for ann in annotations:
            if ann is not None and ann.end_lineno is not None and ann.end_col_offset is not None:
                spans.append(((ann.lineno, ann.col_offset), (ann.end_lineno, ann.end_col_offset)))
    return spans


def skip_annotations(session: Path) -> int:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans = {m: _annotation_spans(ROOT / m) for m in MODULES}
    skipped = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            mutation = item.mutations[0]
            start, end = tuple(mutation.start_pos), tuple(mutation.end_pos)
            for low, high in spans.get(str(mutation.module_path), []):
                if low <= start and end <= high:
                    db.set_result(
                        item.job_id,
                        WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="annotation"),
                    )
                    skipped += 1
                    break
    return skipped


def _rows(session: Path) -> list[dict[str, Any]]:
    from cosmic_ray.work_db import WorkDB, use_db

    rows = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            mutation = item.mutations[0]
            rows.append(
                {
                    "module": str(mutation.module_path),
                    "operator": mutation.operator_name.split("/")[-1],
                    "line": mutation.start_pos[0],
                    "outcome": str(result.worker_outcome),
                    "test": str(result.test_outcome) if result.test_outcome else None,
                    "skipped_why": result.output if str(result.worker_outcome) == "skipped"
                    else None,
                    "diff": result.diff or "",
                }
            )  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", default=[])
    parser.add_argument("--out", default=str(ROOT / "docs" / "mutation-results.json"))
    args = parser.parse_args()
    modules = tuple(args.module) or MODULES
    beside = Path(sys.executable).with_name("cosmic-ray")
    tool = str(beside) if beside.exists() else shutil.which("cosmic-ray")
    if tool is None:
        print("cosmic-ray is not installed: pip install cosmic-ray", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="rocmfix-mutation-"))
    config = work / "config.toml"
    session = work / "session.sqlite"
    config.write_text(
        CONFIG.format(
            modules=json.dumps(list(modules)), python=sys.executable, tests=" ".join(TESTS)
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([tool, "init", str(config), str(session)], cwd=ROOT, check=True, env=env)
    print(f"skipped {skip_annotations(session)} mutants inside annotations", file=sys.stderr)
    started = datetime.datetime.now()
    subprocess.run([tool, "baseline", str(config)], cwd=ROOT, check=True, env=env)
    subprocess.run([tool, "exec", str(config), str(session)], cwd=ROOT, check=True, env=env)
    minutes = (datetime.datetime.now() - started).total_seconds() / 60
    rows = _rows(session)
    Path(args.out).write_text(json.dumps({"minutes": minutes, "mutants": rows}, indent=1) + "\n")
    counts = Counter((r["module"], r["test"] or r["outcome"]) for r in rows)
    for (module, outcome), n in sorted(counts.items()):
        print(f"{module}: {outcome}: {n}")
    for r in rows:
        if (r["test"] or "").lower().endswith("survived"):
            print(f"SURVIVED {r['module']}:{r['line']} {r['operator']}\n{r['diff']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
