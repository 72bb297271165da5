"""Kevin's split: 180 KernelBench level 1-2 tasks for training, 20 held out, fixed ids that follow their rule."""
from __future__ import annotations

from pathlib import Path

import pytest

from kevin_exp.config import TasksConfig
from kevin_exp.run.setup import TaskPoolError, load_task_pool
from kevin_exp.tasks.splits import holdout_rule, kevin_holdout_ids

PROGRAM = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def _checkout(root: Path) -> Path:
    for level in (1, 2, 3):
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True)
        for n in range(1, 101 if level < 3 else 51):
            (folder / f"{n}_Problem{n}.py").write_text(PROGRAM)
    return root


def _ids(tmp_path: Path, split: str, levels=(1, 2)) -> list[str]:
    cfg = TasksConfig(suite="kernelbench", kernelbench_path=str(tmp_path), levels=list(levels), split=split)
    return [p.problem_id for p in load_task_pool(cfg)]


def test_the_written_ids_are_the_rule_and_ten_per_level():
    ids = kevin_holdout_ids()
    assert ids == [f"kernelbench/level{level}/{n}" for level in (1, 2) for n in holdout_rule(level)]
    assert len(ids) == 20 and len(set(ids)) == 20


def test_train_and_holdout_partition_levels_one_and_two(tmp_path):
    _checkout(tmp_path)
    train, held, every = _ids(tmp_path, "kevin_train"), _ids(tmp_path, "kevin_holdout"), _ids(tmp_path, "all")
    assert len(train) == 180 and len(held) == 20 and not set(train) & set(held)
    assert sorted(train + held) == sorted(every)
    assert sum("/level1/" in i for i in train) == 90 and sum("/level2/" in i for i in train) == 90
    assert held == kevin_holdout_ids()
    # level 3 is outside Kevin's split
    assert all("/level3/" not in i for i in _ids(tmp_path, "kevin_train", levels=(1, 2, 3)))


def test_kevin_splits_of_the_builtin_suite_and_unknown_splits_fail_naming_the_key():
    with pytest.raises(TaskPoolError, match="tasks.split=kevin_holdout.*tasks.split=all"):
        load_task_pool(TasksConfig(suite="builtin", split="kevin_holdout"))
    with pytest.raises(TaskPoolError, match="tasks.split='heldout'"):
        load_task_pool(TasksConfig(suite="builtin", split="heldout"))
