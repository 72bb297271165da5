"""The report a sweep ends with: a Hydra callback (``hydra.callbacks.report`` in conf/train.yaml) that writes
``analysis/report.py``'s report into ``<sweep dir>/report`` once every job of a ``-m`` sweep has ended, and
prints the line that names it last."""
from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from kevin_exp.errors import UserError
from kevin_exp.launch.world import context_from_env

log = logging.getLogger(__name__)


def sweep_report(sweep_dir: Path, ledger: Path) -> str:
    """Writes the report of the runs under ``sweep_dir``; the line that names it, or why there is none and the
    command that writes it later."""
    # imported here, not at the top: Hydra creates its callbacks in every run, and the analysis (pandas,
    # matplotlib) takes seconds to import where no sweep ends
    from kevin_exp.analysis.report import main as write_report

    out = sweep_dir / "report"
    command = f"python analysis/report.py {shlex.quote(str(sweep_dir))} --out {shlex.quote(str(out))}"
    try:
        return f"report: {write_report([str(sweep_dir), '--out', str(out), '--ledger', str(ledger)])}"
    except UserError as e:
        return f"no report: {e} (once the runs hold rows: {command})"
    except Exception as e:  # the sweep's work is done and kept: a failing report must not end it in a traceback
        log.exception("the sweep's report failed")
        return f"no report: {type(e).__name__}: {e} (retry with: {command})"


class SweepReport(Callback):
    def __init__(self, ledger: str = "outputs/ledger.jsonl") -> None:
        self.ledger = Path(ledger)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not context_from_env().is_main:
            return
        print(sweep_report(Path(config.hydra.sweep.dir), self.ledger), flush=True)
