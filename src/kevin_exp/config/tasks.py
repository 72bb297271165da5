"""The ``tasks`` group: which suite, levels, split and task ids a run draws from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kevin_exp.settings_checks import Bounds, choice, each


def _splits() -> tuple[str, ...]:
    from kevin_exp.tasks.splits import SPLITS

    return SPLITS


@dataclass
class TasksConfig:
    # builtin | kernelbench | kernel_menu (answers are a letter of a menu of real kernels: docs/learning.md)
    suite: str = choice("builtin", ("builtin", "kernelbench", "kernel_menu"))
    # a KernelBench checkout (suite=kernelbench)
    kernelbench_path: Optional[str] = None
    levels: list[int] = each(lambda: [1, 2], bounds=Bounds(ge=1, le=4), non_empty=True)
    # all | kevin_train (KernelBench levels 1-2 minus the held-out 20) | kevin_holdout (those 20)
    split: str = choice("all", _splits)
    # explicit task ids (empty: every task of the levels and split)
    ids: list[str] = field(default_factory=list)
    # tasks=kernel_menu: false withholds every earlier turn (answer, verdict, speedup, what a profile showed) from the
    # next turn's prompt (a profile taken still makes A the fast kernel): a control (docs/learning.md)
    menu_feedback: bool = True

    def extra_checks(self, prefix: str) -> list[str]:
        if self.suite == "kernelbench" and not self.kernelbench_path:
            return [f"{prefix}kernelbench_path=null: tasks=kernelbench needs "
                    f"{prefix}kernelbench_path=/path/to/KernelBench"]
        if self.suite != "kernelbench" and self.split != "all":
            return [f"{prefix}split={self.split}: Kevin's splits are of KernelBench (tasks=kernelbench); the "
                    f"{self.suite} suite has split=all only"]
        if self.suite != "kernel_menu" and not self.menu_feedback:
            return [f"{prefix}menu_feedback=false: a setting of tasks=kernel_menu, but {prefix}suite={self.suite}; "
                    "leave it out"]
        if self.suite == "kernel_menu":
            from kevin_exp.tasks.kernel_menu.menu import menu_levels

            missing = [level for level in self.levels if level not in menu_levels()]
            if missing:
                return [f"{prefix}levels={list(self.levels)}: the kernel menu has levels {menu_levels()} only"]
        return []
