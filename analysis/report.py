"""One report for a sweep (or any runs): report.md, with the figures and CSVs it embeds, in --out. It says how the
runs were made (command, ledger line, commit, versions, machines), the settings that vary and those that do not,
Table 1 (and Table 2 where the runs' budget allows), the per-turn table, the figures, each run's steps, time and
its split, the reward-integrity counters, and what is missing. A sweep launched with `-m` writes its own at the
end, in <sweep dir>/report.

    python analysis/report.py outputs/sweeps/gamma_ablation --out reports/gamma
    python analysis/report.py gamma_ablation --steps 6:8 --out reports/gamma
"""
from __future__ import annotations

import sys
from pathlib import Path

try:
    import kevin_exp  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kevin_exp.analysis.report import main as write  # noqa: E402
from kevin_exp.errors import exits_on_user_error  # noqa: E402


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    print(write(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
