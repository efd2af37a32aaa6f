"""The contract between the op registry and the templates, checked for every scheme of every
op (Template and KernelTemplate below), and the registry's discovery of op modules.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import rocmfix.ops as registry
from rocmfix import worker
from rocmfix.ops import OPS, Op, Scheme

from conftest import TEMPLATES, load_template


@runtime_checkable
class Template(Protocol):
    """What every template module a scheme drops exposes: its scheme's name, and the op's
    entry function (named by :attr:`Op.function`, the same signature in every scheme of the
    op), which the patched code calls."""

    SCHEME: str


@runtime_checkable
class KernelTemplate(Template, Protocol):
    """What an op's tunable Triton template (:attr:`Op.kernel_template`) exposes besides:
    its key in the tuned file, the environment variable it reads a config override from,
    how it resolves a config, names a GPU and a precision class, and forgets what it cached.
    ``tune``, ``doctor`` and ``kernels`` rely on these (the op's harness on the rest)."""

    KERNEL: str
    CONFIG_ENV: str

    def resolve_config(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...

    def clear_config_cache(self) -> None: ...

    def precision_class(self, *args: Any) -> str: ...

    def device_arch(self, *args: Any) -> str: ...


# A scheme with no entry is a setting of the user's stack (vision attention): no template.
PAIRS = [(op, scheme) for op in OPS for scheme in op.schemes if scheme.entry]


def _required(fn: object) -> list[str]:
    params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    return [p.name for p in params if p.default is inspect.Parameter.empty]


@pytest.mark.parametrize("op, scheme", PAIRS, ids=[f"{o.name}-{s.name}" for o, s in PAIRS])
def test_every_template_keeps_the_contract(op: Op, scheme: Scheme) -> None:
    module = load_template(scheme.entry[:-3])
    assert isinstance(module, Template) and scheme.name == module.SCHEME
    assert module.__doc__ and "rocmfix revert" in module.__doc__
    entry = getattr(module, op.function, None)
    assert callable(entry), f"{scheme.entry} has no {op.function}"
    # The patched code calls every scheme the same way.
    default = load_template(op.default_scheme.entry[:-3])
    assert _required(entry) == _required(getattr(default, op.function))
    for support in scheme.support:
        assert (TEMPLATES / support).is_file(), support
    if scheme.entry == op.kernel_template:
        assert isinstance(module, KernelTemplate)
        assert op.kernel == module.KERNEL and op.config_env == module.CONFIG_ENV
    elif hasattr(module, "CONFIG_ENV"):
        assert op.config_env == module.CONFIG_ENV


def _relative_imports(template: str) -> set[str]:
    """The template files ``template`` imports from its own folder (``from . import x``,
    ``from .x import y``)."""
    tree = ast.parse((TEMPLATES / template).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(f"{node.module}.py")
            else:
                found.update(f"{alias.name}.py" for alias in node.names)
    return found


@pytest.mark.parametrize("op, scheme", PAIRS, ids=[f"{o.name}-{s.name}" for o, s in PAIRS])
def test_every_template_imports_only_what_its_scheme_drops(op: Op, scheme: Scheme) -> None:
    """A dropped kernel imports its support modules relatively, from the folder it was dropped
    into: each one, and each one they import, must be among the files the scheme drops."""
    dropped = set(scheme.templates)
    for template in scheme.templates:
        missing = _relative_imports(template) - dropped
        assert not missing, f"{op.name} {scheme.name}: {template} imports {sorted(missing)}"


def test_every_op_names_a_fallback_and_its_own_config_variable() -> None:
    envs = [op.config_env for op in OPS if op.config_env]
    assert len(envs) == len(set(envs))
    for op in OPS:
        assert op.function and op.fallback is not None
        assert not op.scheme(op.fallback).needs_triton
        assert not op.kernel_template or op.config_env, op.name


def test_the_worker_reads_the_config_variables_from_the_request() -> None:
    request = worker.request("measure", OPS)
    assert request.config_envs() == [op.config_env for op in OPS if op.config_env]
    # Only the requested ops' variables: a doctor of one op neither reports nor clears others.
    one = [op for op in OPS if op.name == "depthwise-conv"]
    assert worker.request("measure", one).config_envs() == ["ROCMFIX_DEPTHWISE_CONV_CONFIG"]


def test_the_registry_discovers_a_new_op_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new op is one module in rocmfix/ops: nothing else in the registry names it.
    (tmp_path / "zz_probe_op.py").write_text(
        "from rocmfix.ops.base import Op, Scheme\n"
        "OP = Op(name='probe-op', title='probe', native='F.probe',\n"
        "        schemes=(Scheme('plain', 'a probe', 'probe', 'probe.py'),), cases=(),\n"
        "        kernel='', kernel_template='', tune=(), grid=(), harness='probe',\n"
        "        label=str, function='probe', fallback='plain', order=15)\n"
    )
    (tmp_path / "_private.py").write_text("raise AssertionError('private modules are skipped')\n")
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    try:
        found = registry._discover()
    finally:
        sys.modules.pop("rocmfix.ops.zz_probe_op", None)
    names = [op.name for op in found]
    assert names == ["patch-embed", "probe-op", *[op.name for op in OPS[1:]]]
    assert [op.name for op in OPS] == ["patch-embed", "dilated-conv", "depthwise-conv",
                                       "conv-transpose", "pointwise-conv",
                                       "vit-attention"]  # fmt: skip


# One call of each op, small, as ``rocmfix profile`` replays it: the torch functional and its
# arguments after input, weight and bias (stride, padding, dilation, output padding one number
# per axis), and a call of the same functional that no scheme computes.
F = torch.nn.functional
REPLAY_CALLS: dict[str, tuple[Any, tuple[int, ...], tuple[int, ...], tuple[Any, ...]]] = {
    "patch-embed": (F.conv3d, (6, 3, 2, 4, 4), (8, 3, 2, 4, 4), ([2, 4, 4], [0, 0, 0], [1] * 3, 1)),
    "dilated-conv": (F.conv2d, (1, 4, 9, 7), (5, 4, 3, 3), ([1, 1], [2, 2], [2, 2], 1)),
    "depthwise-conv": (F.conv2d, (2, 4, 9, 7), (4, 1, 3, 3), ([2, 2], [1, 1], [1, 1], 4)),
    "conv-transpose": (F.conv_transpose2d, (1, 4, 5, 3), (4, 3, 2, 2),
                       ([2, 2], [0, 0], [0, 0], 1, [1, 1])),
    "pointwise-conv": (F.conv2d, (1, 6, 5, 3), (4, 3, 1, 1), ([1, 1], [0, 0], [1, 1], 2)),
}  # fmt: skip
NO_OP: dict[Any, tuple[tuple[int, ...], tuple[int, ...], tuple[Any, ...]]] = {
    F.conv3d: ((1, 3, 4, 8, 8), (8, 3, 2, 4, 4), ([2, 4, 4], [0, 0, 0], [1] * 3, 1)),
    F.conv2d: ((1, 4, 9, 7), (5, 4, 3, 3), ([1, 1], [1, 1], [1, 1], 1)),
    F.conv_transpose2d: ((1, 4, 5, 3), (4, 3, 2, 2), ([2, 2], [1, 1], [0, 0], 1, [1, 1])),
}
# The scheme whose entry runs GPU tensors only (on a CPU it runs the stock op, not its own).
GPU_ONLY = {("patch-embed", "linear")}


def _params(fn: Any, rest: tuple[Any, ...]) -> dict[str, Any]:
    """The call's arguments as ``rocmfix.profile.analyse.conv_params`` reads them."""
    if fn is F.conv_transpose2d:
        stride, padding, output_padding, groups, dilation = rest
    else:
        (stride, padding, dilation, groups), output_padding = rest, [0]
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
            "transposed": fn is F.conv_transpose2d, "output_padding": output_padding}  # fmt: skip


REPLAYED = [op for op in OPS if op.matches is not None]


def test_every_op_with_a_call_rule_has_a_replay_case() -> None:
    # The vision attention is known by the torch op and the file that issue it (Op.calls,
    # Op.sites), not by a conv's arguments; every conv op is here.
    assert sorted(op.name for op in REPLAYED) == sorted(REPLAY_CALLS)


@pytest.mark.parametrize("op", REPLAYED, ids=[op.name for op in REPLAYED])
def test_every_op_knows_its_calls_and_replays_its_schemes_through_their_entries(op: Op) -> None:
    """``rocmfix profile`` knows an op's calls by its rule alone (Op.matches, one op's at most)
    and replays each scheme through its template's public entry (Op.replay), which computes
    the call as the functional does and declines any other with NotImplementedError."""
    fn, xs, ws, rest = REPLAY_CALLS[op.name]
    assert op.matches is not None and op.replay and op.replayed
    assert [o.name for o in OPS if o.matches and o.matches(_params(fn, rest), xs, ws)] == [op.name]
    nx, nw, nrest = NO_OP[fn]
    torch.manual_seed(0)
    x, w = torch.randn(xs), torch.randn(ws)
    b = torch.randn(fn(x, w, None, *rest).shape[1])
    want = fn(x, w, b, *rest)
    for label, scheme in op.replayed.items():
        assert label == f"rocmfix {scheme.label}"
        entry = getattr(load_template(scheme.entry[:-3]), op.replay)
        if (op.name, scheme.name) in GPU_ONLY:
            with pytest.raises(NotImplementedError):
                entry(x, w, b, *rest)
        else:
            got = entry(x, w, b, *rest)
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4), label
        with pytest.raises(NotImplementedError):
            entry(torch.randn(nx), torch.randn(nw), None, *nrest)
