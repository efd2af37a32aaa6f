"""What an environment holds, read from inside that environment's interpreter.

This file runs in two ways: imported by rocmfix (the default target is rocmfix's own
interpreter), and through :data:`rocmfix.guest.BOOT` in another interpreter (``--python``).
It therefore uses only the standard library, runs on every Python vllm ever supported
(3.8+: no ``match``, no ``X | Y`` at runtime), and never imports the packages it looks at:
importing vllm or torch takes seconds and can fail in a broken environment.
"""

from __future__ import annotations

import ast
import base64
import csv
import json
import os
import sys
import sysconfig
from typing import Any, Dict, List, Optional, Tuple

PROBE_SCHEMA = 1


def _record_hashes(dist: Any, problems: List[str]) -> Dict[str, str]:
    # Read row by row rather than through dist.files, which gives up on the whole file at
    # one malformed row (a blank line, a fourth column, a size that is not a number).
    hashes: Dict[str, str] = {}
    text = dist.read_text("RECORD") or ""
    for number, row in enumerate(csv.reader(text.splitlines()), start=1):
        if len(row) != 3 or (row[2] and not row[2].isdigit()):
            problems.append("RECORD line %d does not parse; it was skipped" % number)
            continue
        mode, _, value = row[1].partition("=")
        if mode == "sha256" and value:
            hashes[row[0].replace("\\", "/")] = value
    return hashes


def _direct_url(dist: Any) -> Optional[Dict[str, Any]]:
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _package_roots(package: str) -> List[str]:
    # find_spec on a top-level name consults the path finders without executing the package,
    # and it follows editable-install finders and .pth entries just as an import would.
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    locations = list(spec.submodule_search_locations or [])
    return [os.path.dirname(os.path.abspath(loc)) for loc in locations]


def _string_assignments(path: str, names: List[str]) -> Dict[str, Optional[str]]:
    found: Dict[str, Optional[str]] = {name: None for name in names}
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return found
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
            value: Optional[ast.expr] = node.value
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
            value = node.value
        else:
            continue
        for target in targets:
            if (
                isinstance(target, ast.Name)
                and target.id in found
                and isinstance(value, ast.Constant)
                and isinstance(value.value, str)
            ):
                found[target.id] = value.value
    return found


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _distribution(
    name: str, package: Optional[str], files: List[str], problems: List[str]
) -> Optional[Dict[str, Any]]:
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    if dist.version is None:
        # A dist-info folder an uninstall left behind, with no METADATA: not installed.
        return None
    dist_path = getattr(dist, "_path", None)
    dist_info = os.path.abspath(str(dist_path)) if dist_path is not None else None
    location = os.path.abspath(str(dist.locate_file("")))
    direct_url = _direct_url(dist)
    dir_info = (direct_url or {}).get("dir_info") or {}
    has_record = dist.read_text("RECORD") is not None
    editable = bool(dir_info.get("editable")) or not has_record
    roots = _package_roots(package) if package else []
    hashes = _record_hashes(dist, problems) if has_record else {}
    out_files: Dict[str, Dict[str, Any]] = {}
    for rel in files:
        # The import system decides which copy of a file runs, so look where it looks;
        # fall back to the distribution's own location when nothing is importable.
        candidates = [*roots, location]
        root = next(
            (each for each in candidates if os.path.lexists(os.path.join(each, rel))),
            candidates[0],
        )
        out_files[rel] = {
            "path": os.path.join(root, rel),
            "root": root,
            # RECORD speaks for the copy in the distribution's location only; an editable
            # or shadowing copy elsewhere has no recorded hash.
            "record_hash": hashes.get(rel) if _same_dir(root, location) else None,
        }
    return {
        "name": dist.metadata["Name"],
        "version": dist.version,
        "dist_info": dist_info,
        "location": location,
        "editable": editable,
        "editable_url": direct_url.get("url") if direct_url else None,
        "installer": (dist.read_text("INSTALLER") or "").strip() or None,
        "record": os.path.join(dist_info, "RECORD") if dist_info and has_record else None,
        "package_roots": roots,
        "files": out_files,
        "requires": list(dist.requires or []),
    }


def _torch(location_of: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    torch = location_of.get("torch")
    if torch is None:
        return None
    roots = _package_roots("torch")
    version_py = os.path.join(roots[0], "torch", "version.py") if roots else None
    values = _string_assignments(version_py, ["hip", "cuda", "__version__"]) if version_py else {}
    return {
        "version": values.get("__version__") or torch["version"],
        "hip": values.get("hip"),
        "cuda": values.get("cuda"),
    }


def _read(
    name: str,
    package: Optional[str],
    files: List[str],
    unreadable: Dict[str, List[str]],
) -> Optional[Dict[str, Any]]:
    """One distribution on its own: what cannot be read of it (any error at all, in metadata
    nobody checked) is reported by name, and the others are still answered."""
    problems: List[str] = []
    try:
        found = _distribution(name, package, files, problems)
    except Exception as exc:  # noqa: BLE001 - any file of any dist-info may be malformed
        found = None
        problems.append("%s: %s" % (type(exc).__name__, exc))
    if problems:
        unreadable[name] = problems
    return found


def _gfx(nodes: str) -> List[int]:
    """The ``gfx_target_version`` of each GPU node the kernel's KFD lists."""
    found: List[int] = []
    try:
        names = sorted(os.listdir(nodes))[:64]
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(nodes, name, "properties"), "rb") as handle:
                text = handle.read(1 << 16).decode("ascii", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "gfx_target_version" and value.strip().isdigit() and int(value) > 0:
                found.append(int(value))
    return found


def _listed(name: str, prefixes: List[str]) -> List[str]:
    from importlib import metadata

    try:
        text = metadata.distribution(name).read_text("RECORD") or ""
    except Exception:  # noqa: BLE001 - not installed, or metadata nobody checked
        return []
    paths = [row[0] for row in csv.reader(text.splitlines()) if row]
    return [p for p in paths if any(p.startswith(prefix) for prefix in prefixes)][:64]


def _system(request: Dict[str, Any]) -> Dict[str, Any]:
    """Settings and files the engine traps show themselves by, read without an import."""
    import importlib.util

    modules = {}
    for module in request.get("modules", []):
        try:
            modules[module] = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            modules[module] = False
    owners: Dict[str, Any] = {}
    for package, rel in request.get("owners", {}).items():
        roots = _package_roots(package)
        path = os.path.join(roots[0], rel) if roots else None
        if path is not None and os.path.isfile(path):
            owners[package] = _string_assignments(path, ["package_name", "__version__"])
    return {
        "platform": sys.platform,
        "env": {name: os.environ.get(name) for name in request.get("env", [])},
        "gfx": _gfx(request["kfd"]) if request.get("kfd") else [],
        "devices": {path: os.path.exists(path) for path in request.get("devices", [])},
        "modules": modules,
        "listings": {
            name: _listed(name, prefixes) for name, prefixes in request.get("listings", {}).items()
        },
        "owners": owners,
    }


def probe(request: Dict[str, Any]) -> Dict[str, Any]:
    """Answer ``request``: targets with their files, extra distribution names (and, in
    ``packages``, the import package whose folder to find for some of them)."""
    distributions: Dict[str, Any] = {}
    unreadable: Dict[str, List[str]] = {}
    for target in request.get("targets", []):
        found = _read(
            target["distribution"], target.get("package"), target.get("files", []), unreadable
        )
        if found is not None:
            distributions[target["distribution"]] = found
    extras: Dict[str, Any] = {}
    exists = request.get("exists", {})
    packages = request.get("packages", {})
    for name in request.get("extras", []):
        found = _read(name, packages.get(name), [], unreadable)
        if found is not None:
            location = found["location"]
            found["exists"] = {
                rel: os.path.exists(os.path.join(location, rel)) for rel in exists.get(name, [])
            }
            extras[name] = found
    return {
        "probe": PROBE_SCHEMA,
        "python": {
            "executable": sys.executable,
            "version": ".".join(str(part) for part in sys.version_info[:3]),
            "prefix": sys.prefix,
            "purelib": sysconfig.get_paths().get("purelib"),
        },
        "distributions": distributions,
        "extras": extras,
        "torch": _torch(extras),
        "unreadable": unreadable,
        "system": _system(request.get("system") or {}),
    }


def frame(nonce: str) -> Tuple[str, str]:
    """The lines around the answer: a sitecustomize or .pth that prints at startup (or at
    exit) writes outside them, and the host reads only what is inside."""
    return "\n--rocmfix-probe-%s-begin--\n" % nonce, "\n--rocmfix-probe-%s-end--\n" % nonce


def main(argv: List[str]) -> int:
    # BOOT has dropped the current directory from sys.path: a user standing in a vllm
    # checkout would otherwise probe that checkout instead of what the environment imports.
    request = json.loads(base64.b64decode(argv[1]).decode("utf-8"))
    begin, end = frame(str(request.get("frame", "")))
    sys.stdout.write(begin + json.dumps(probe(request)) + end)
    sys.stdout.flush()
    return 0
