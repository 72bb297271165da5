"""Where each step's metrics go besides the run's own records: nowhere else (logger=jsonl), or Weights &
Biases (logger=wandb). The W&B run id is the run directory's id, so a requeued or restarted job continues
the same W&B run; runs of one sweep share a group; without an API key W&B runs offline."""
from __future__ import annotations

import json
import netrc
import os
import subprocess
from numbers import Number
from pathlib import Path
from typing import Any, Protocol

from kevin_exp.config import LoggerConfig
from kevin_exp.launch.world import context_from_env

MODES = ("auto", "online", "offline", "disabled")


class MetricLogger(Protocol):
    def log(self, metrics: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class RecordsOnly:
    """logger=jsonl: turns.jsonl and metrics.jsonl in the run dir are the whole record."""

    def log(self, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode(cfg: LoggerConfig) -> str:
    if cfg.mode not in MODES:
        raise ValueError(f"logger.mode={cfg.mode!r}: expected one of {', '.join(MODES)}")
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if cfg.mode == "auto":
        return "online" if has_wandb_key() else "offline"
    return cfg.mode


class WandbLogger:
    def __init__(self, cfg: LoggerConfig, run_dir: Path, run_id: str, group: str | None, tags: list[str],
                 config: dict[str, Any]) -> None:
        import wandb

        self.settings = {"project": cfg.project, "entity": cfg.entity, "id": run_id, "name": run_dir.name[:120],
                         "group": cfg.group or group, "tags": sorted(set(tags + list(cfg.tags))),
                         "mode": wandb_mode(cfg), "dir": str(run_dir)}
        # what this run was given, next to the records (W&B keeps it in its binary log)
        (run_dir / "wandb_run.json").write_text(json.dumps(self.settings, indent=1))
        self.run = wandb.init(resume="allow", config=config, **self.settings)

    def log(self, metrics: dict[str, Any]) -> None:
        values = {k: v for k, v in metrics.items() if isinstance(v, Number) and not isinstance(v, bool) and k != "step"}
        self.run.log(values, step=int(metrics["step"]))

    def close(self) -> None:
        self.run.finish()


def git_commit_short() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def build_metric_logger(cfg: LoggerConfig, run_dir: Path, run_id: str, *, experiment: str | None,
                        sweep: str | None, config: dict[str, Any]) -> MetricLogger:
    if cfg.kind == "jsonl" or not context_from_env().is_main:
        # one W&B run per run: rank 0's (other ranks' rows reach rank 0's records)
        return RecordsOnly()
    if cfg.kind == "wandb":
        commit = git_commit_short()
        tags = [t for t in (f"experiment:{experiment}" if experiment else None, f"sweep:{sweep}" if sweep else None,
                            f"commit:{commit}" if commit else None) if t]
        return WandbLogger(cfg, run_dir, run_id, sweep, tags, config)
    raise ValueError(f"logger.kind={cfg.kind!r}: expected jsonl or wandb (logger=jsonl | logger=wandb)")
