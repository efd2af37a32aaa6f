"""The mineru-vl-utils patch against every real release, through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import releases
from conftest import MINERU_TARGET, InstalledEnv, files_under

pytestmark = pytest.mark.network

UNGUARDED = [f"0.1.{n}" for n in range(1, 14)]
GUARDED = ["0.1.14", releases.PINNED["mineru-vl-utils"]]
PATCH = "mineru-tokenizer"


def test_every_unguarded_release_is_rewritten_and_compiles() -> None:
    """Every unguarded release's client, read from its wheel: classified as needing the
    patch, rewritten into code that compiles, then classified as patched (in process; the
    round trip through the CLI below runs on a spread of them, the compat sample on more)."""
    import libcst as cst

    from rocmfix.patch import CodeShape, TargetContext
    from rocmfix.registry import all_patches

    patch = next(p for p in all_patches() if p.id == PATCH)
    ctx = TargetContext(version="0", versions={}, torch=None, related={})
    distinct = set()
    for version in UNGUARDED:
        source = releases.wheel_members("mineru-vl-utils", version, [MINERU_TARGET])[MINERU_TARGET]
        assert source is not None, version
        distinct.add(source)
        assert patch.classify(patch.parse(source), ctx).shape is CodeShape.NEEDS_PATCH, version
        after = patch.transform(cst.parse_module(source)).bytes
        compile(after, MINERU_TARGET, "exec")
        assert b"except AttributeError:" in after, version
        assert patch.classify(patch.parse(after), ctx).shape is CodeShape.PATCHED, version
    assert len(distinct) > 1  # the releases differ: reading one would not stand for all


# The first and last unguarded releases and one between: every release's bytes are rewritten
# above, and the compat sample round-trips 0.1.0, 0.1.1 and 0.1.13 too.
@pytest.mark.parametrize("version", ["0.1.1", "0.1.6", "0.1.13"])
def test_unguarded_release_round_trip(
    version: str, mineru_env: Callable[[str], InstalledEnv]
) -> None:
    env = mineru_env(version)
    before = files_under(env.site)

    status = env.status(PATCH)
    assert status["verdict"] == "applicable", status
    assert status["version"] == version
    assert status["pristine"] == "record"

    applied = env.cli("apply")
    assert applied.returncode == 0, applied.stderr
    assert "mineru-tokenizer: applied" in applied.stderr
    patched = env.target.read_bytes()
    assert patched != env.original
    text = patched.decode()
    assert "except AttributeError:" in text
    assert "# rocmfix:" in text
    compile(patched, str(env.target), "exec")
    assert env.status(PATCH)["verdict"] == "applied"

    again = env.cli("apply")
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stderr
    assert env.target.read_bytes() == patched

    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == before, "revert must give back every byte, nothing more"
    assert not env.state.exists(), "no rocmfix state left behind"
    assert not list((env.target.parent / "__pycache__").glob("vllm_async_engine_client.*"))
    assert env.status(PATCH)["verdict"] == "applicable"


@pytest.mark.parametrize("version", GUARDED)
def test_guarded_release_is_left_alone(
    version: str, mineru_env: Callable[[str], InstalledEnv]
) -> None:
    env = mineru_env(version)
    status = env.status(PATCH)
    assert status["verdict"] == "not-needed"
    assert "hasattr" in status["reason"]
    result = env.cli("apply")
    assert result.returncode == 0
    assert "skipped" in result.stderr
    assert env.target.read_bytes() == env.original
    assert not env.state.exists()
    assert env.cli("revert").returncode == 0


def test_release_without_the_client(mineru_env: Callable[[str], InstalledEnv]) -> None:
    env = mineru_env("0.1.0")
    status = env.status(PATCH)
    assert status["verdict"] == "not-needed"
    assert "no vllm async engine client" in status["reason"]


# The smallest stand-in for the parts of vllm the client touches; the tokenizer of
# vllm >= 0.11 has no get_lora_tokenizer(), the tokenizer group of older vllm has one.
_FAKE_VLLM = {
    "vllm/__init__.py": "class SamplingParams: pass\n",
    "vllm/sampling_params.py": "class RequestOutputKind: pass\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/async_llm.py": textwrap.dedent(
        """
        class _Config:
            max_model_len = 16384

        class AsyncLLM:
            def __init__(self, tokenizer):
                self.tokenizer = tokenizer
                self.model_config = _Config()
        """
    ),
}

_PROGRAM = textwrap.dedent(
    """
    from mineru_vl_utils.vlm_client.vllm_async_engine_client import VllmAsyncEngineVlmClient
    from vllm.v1.engine.async_llm import AsyncLLM

    class Tokenizer:  # vllm >= 0.11
        pass

    class Group:  # vllm < 0.11
        def __init__(self):
            self.inner = Tokenizer()
        def get_lora_tokenizer(self):
            return self.inner

    plain = Tokenizer()
    client = VllmAsyncEngineVlmClient(AsyncLLM(plain))
    assert client.tokenizer is plain
    group = Group()
    client = VllmAsyncEngineVlmClient(AsyncLLM(group))
    assert client.tokenizer is group.inner
    print("ok")
    """
)


@pytest.mark.parametrize("version", ["0.1.1", "0.1.13"])
def test_patched_client_runs_with_new_and_old_vllm(
    version: str, mineru_env: Callable[[str], InstalledEnv], tmp_path: Path
) -> None:
    pytest.importorskip("aiofiles")
    pytest.importorskip("httpx")
    env = mineru_env(version)
    fake = tmp_path / "fake-vllm"
    for rel, text in _FAKE_VLLM.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    run_env = {**os.environ, "PYTHONPATH": f"{env.site}{os.pathsep}{fake}"}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _PROGRAM],
            env=run_env,
            capture_output=True,
            text=True,
            check=False,
        )

    stock = run()
    assert stock.returncode != 0
    assert "get_lora_tokenizer" in stock.stderr, "the stock release must show the crash"
    assert env.cli("apply").returncode == 0
    patched = run()
    assert patched.returncode == 0, patched.stderr
    assert patched.stdout.strip() == "ok"
