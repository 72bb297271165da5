from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_DOUBLE = Path(__file__).parent / "vllm_double"


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {}
    if not _has_gpu():
        skips["gpu"] = pytest.mark.skip(reason="no CUDA GPU visible on this machine")
    if shutil.which("sinfo") is None:
        skips["slurm"] = pytest.mark.skip(reason="no SLURM here (sinfo not found): bash slurm/local-cluster.sh start")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def build_cache() -> Path:
    """One compile cache for the whole test session (KEVIN_EXP_CACHE keeps it across sessions)."""
    env = os.environ.get("KEVIN_EXP_CACHE")
    if env:
        path = Path(env)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="kevin_exp_test_cache_"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def vllm_double(monkeypatch):
    """``import vllm`` gives the test double of vLLM 0.33's API (tests/vllm_double) for this test."""
    import sys

    monkeypatch.syspath_prepend(str(VLLM_DOUBLE))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm

    assert Path(vllm.__file__).is_relative_to(VLLM_DOUBLE)
    vllm.LLM.log.clear()
    yield vllm
    sys.modules.pop("vllm", None)


def fixture_text(*parts: str) -> str:
    return FIXTURES.joinpath(*parts).read_text()
