from __future__ import annotations

import os
import shutil
import tempfile
import time
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


STALE_BUILD_LOCK_S = 20 * 60  # a DeepSpeed op builds in a few minutes here; an older lock was left by a killed build


def pytest_sessionstart(session: pytest.Session) -> None:
    """A JIT build of a torch extension (DeepSpeed's ops) that was killed leaves its lock file behind, and every
    later build of that op waits for it forever: such locks are removed before the tests start."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    for lock in root.glob("*/*/lock"):
        try:
            if time.time() - lock.stat().st_mtime > STALE_BUILD_LOCK_S:
                lock.unlink()
        except OSError:
            continue


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects on the ``timing`` mark added here
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
        item.add_marker(pytest.mark.xdist_group(run_group(item)))
        if judges_timings(item):
            item.add_marker(pytest.mark.timing)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # under `-n N --dist loadgroup --no-loadscope-reorder` the groups are handed out in this order: the two long
        # groups start first, on workers of their own, and the rest fills the others (a serial run keeps its order)
        items.sort(key=lambda item: GROUP_ORDER.get(run_group(item), len(GROUP_ORDER)))


# Which tests share a worker when the suite runs in parallel (README's test command). The SLURM tests share one
# cluster and mostly wait for it; the adversarial tests judge speedups and timings, so they run one after another,
# never beside each other; every other module keeps its tests (and its module-scoped fixtures) on one worker.
GROUP_ORDER = {"slurm": 0, "timing": 1}


# Modules whose tests judge speedups or timings (a verdict's class depends on them): ``scripts/test.sh`` runs them
# alone, after the rest ran on two workers, since a loaded 2-core machine changes timings (measured: a menu's fast
# kernel timed slower than its reference, an honest kernel's hidden time over its allowance).
TIMING_MODULES = {"integration/test_evaluator_cpu.py", "integration/test_evaluator_protocol.py",
                  "integration/test_kernel_menu_evaluator.py", "integration/test_learning_guard.py",
                  "integration/test_fork_server.py", "unit/test_tasks.py"}


def _test_path(item: pytest.Item) -> Path:
    return Path(str(item.path)).relative_to(Path(__file__).parent)


def judges_timings(item: pytest.Item) -> bool:
    path = _test_path(item)
    return path.parts[0] == "adversarial" or path.as_posix() in TIMING_MODULES


def run_group(item: pytest.Item) -> str:
    path = _test_path(item)
    if "slurm" in item.keywords:
        return "slurm"
    if path.parts[0] == "adversarial":
        return "timing"
    return path.as_posix()


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
