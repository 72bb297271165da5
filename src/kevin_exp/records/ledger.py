"""The sweep ledger: every launched sweep appends one line (command, git commit, sweep dir, start time) that
analysis tools read to find a sweep's runs by name; and the guard that stops a sweep from writing into a
directory holding another sweep's results."""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from kevin_exp.errors import EXIT_USER_ERROR, UserError, report
from kevin_exp.launch.world import context_from_env
from kevin_exp.records.run_records import JsonlWriter, file_problem, folder_problem, git_state, read_jsonl

SWEEP_FILE = "sweep.json"


class SweepOverwriteError(UserError):
    pass


def sweep_identity(task_overrides: list[str], params: dict[str, Any], launch_keys: set[str]) -> dict[str, Any]:
    """What makes two launches the same sweep: the fixed overrides and the swept values. ``launch_keys``
    (the keys job directories ignore) never change results, so relaunching with others continues the sweep."""
    fixed = sorted(o for o in task_overrides if o.split("=", 1)[0].lstrip("+~") not in launch_keys)
    return {"overrides": fixed, "params": {k: str(v) for k, v in sorted(params.items())}}


def claim_sweep_dir(sweep_dir: Path, identity: dict[str, Any]) -> None:
    """Records ``identity`` in ``sweep_dir``; refuses a directory another sweep already claimed."""
    marker = sweep_dir / SWEEP_FILE
    if marker.is_file():
        previous = json.loads(marker.read_text())
        if previous.get("identity") != identity:
            raise SweepOverwriteError(
                f"{sweep_dir} holds the results of another sweep ({previous.get('command', '?')}). Give this one "
                "its own directory with sweep_name=<new name> (or hydra.sweep.dir=...), or delete that directory "
                "to start over. Relaunching the very same sweep continues it."
            )
        return
    sweep_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"identity": identity, "command": _command()}, indent=1))


def _command() -> str:
    return " ".join(shlex.quote(a) for a in ["python", "-m", "kevin_exp.train", *sys.argv[1:]])


class SweepLedger(Callback):
    """Hydra callback (``hydra.callbacks.ledger`` in conf/train.yaml); runs in the launching process."""

    def __init__(self, path: str = "outputs/ledger.jsonl") -> None:
        self.path = Path(path)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not context_from_env().is_main:
            return  # a sweep run under torchrun: its rank 0 writes the line and claims the folder
        hydra_cfg = config.hydra
        sweep_dir = Path(hydra_cfg.sweep.dir).resolve()
        params = OmegaConf.to_container(hydra_cfg.sweeper.params, resolve=True) if hydra_cfg.sweeper.get("params") else {}
        # preflight checks these before Hydra starts; a launch that skipped it must not leave a line for a sweep
        # that cannot run either
        for setting, problem in ((f"hydra.sweep.dir={hydra_cfg.sweep.dir}", folder_problem(sweep_dir)),
                                 (f"hydra.callbacks.ledger.path={self.path}", file_problem(self.path))):
            if problem:
                report(UserError(f"{setting}: {problem}; give {setting.split('=')[0]}=<a path this user can write>"))
                raise SystemExit(EXIT_USER_ERROR)
        if config.get("sweep_name"):
            # a named sweep owns its directory (relaunching it continues it); an unnamed one gets a new
            # date-time directory each launch
            try:
                launch_keys = set(hydra_cfg.job.config.override_dirname.exclude_keys)
                identity = sweep_identity(list(hydra_cfg.overrides.task), params or {}, launch_keys)
                claim_sweep_dir(sweep_dir, identity)
            except SweepOverwriteError as e:
                # Hydra turns a callback's exceptions into warnings; nothing may be launched, so exit here
                report(e)
                raise SystemExit(EXIT_USER_ERROR) from None
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "sweep_name": config.get("sweep_name"),
            "sweep_dir": str(sweep_dir),
            "command": _command(),
            "git": git_state(),
            "params": params,
            "swept": swept_values(list(hydra_cfg.overrides.task), params or {}),
        }
        writer = JsonlWriter(self.path)
        writer.append([entry])
        writer.close()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not context_from_env().is_main:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        print(f"sweep done: {sweep_dir}\ntabulate it: python analysis/ablation_table.py {sweep_dir}", flush=True)


def swept_values(task_overrides: list[str], params: dict[str, Any]) -> dict[str, list[str]]:
    """Every swept key with its values, from a sweep file's params and the command line's value lists."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [f"{k}={v}" for k, v in params.items()] + task_overrides
    swept: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(lines):
        if override.is_sweep_override():
            swept[override.get_key_element()] = [str(v) for v in override.sweep_string_iterator()]
    return swept


def ledger_entries(path: str | Path = "outputs/ledger.jsonl", sweep_name: str | None = None) -> list[dict[str, Any]]:
    rows = read_jsonl(Path(path))
    return [r for r in rows if sweep_name is None or r.get("sweep_name") == sweep_name]
