"""The run's records: ``turns.jsonl`` (one row per step x task x trajectory x turn) and ``metrics.jsonl``
(one row per step), appended and flushed as they are produced, plus the run's provenance files.

On resume, rows of steps after the checkpoint being resumed are dropped first, so a restarted run
writes every row exactly once.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

TURN_FIELDS = (
    "run_id", "split", "step", "task_id", "level", "trajectory", "turn", "status", "correct", "speedup",
    "runtime_ms", "ref_runtime_ms", "score", "return", "advantage", "response_tokens", "truncated", "not_okay",
    "device", "backend", "gamma", "n_turns", "n_trajectories", "normalization", "model", "seed",
)
"""The columns every turns.jsonl row has (analysis relies on them); rows may carry more."""


def run_id_for(run_dir: Path) -> str:
    """Stable across restarts and requeues of the same job dir."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float made null (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class JsonlWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self._fh.write(json.dumps(json_safe(row), allow_nan=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def fsync_path(path: Path) -> None:
    """Flushes a file's contents, or a folder's entries (a new file's name), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def folder_problem(folder: Path | str) -> str | None:
    """Why this process could not make ``folder`` (with its parents) and write in it, or None: the nearest part
    of the path that exists must be a folder it may write into and enter. Checked before anything is made, so
    a refused launch leaves nothing behind."""
    path = Path(folder).absolute()
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    if not existing.is_dir():
        what = "a file" if existing.is_file() else "a broken link" if existing.is_symlink() else "not a folder"
        return f"{existing} is {what}, so no folder can be made there"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user (uid {os.getuid()})"
    return None


def file_problem(path: Path | str) -> str | None:
    """Why this process could not append to the file ``path`` (making it and its folder if need be), or None."""
    path = Path(path).absolute()
    if os.path.lexists(path):
        if path.is_dir():
            return f"{path} is a folder, not a file"
        return None if os.access(path, os.W_OK) else f"{path} is not writable by this user (uid {os.getuid()})"
    return folder_problem(path.parent)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut by a kill: everything after it is unreliable
    return rows


def truncate_after(path: Path, step: int) -> int:
    """Keep only rows with ``row["step"] <= step`` (atomically); returns how many were dropped."""
    if not path.is_file():
        return 0
    rows = read_jsonl(path)
    keep = [r for r in rows if r.get("step", -1) <= step]
    dropped = len(path.read_text(encoding="utf-8").splitlines()) - len(keep)
    if dropped:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


class RunRecords:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.turns_path = self.run_dir / "turns.jsonl"
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._turns: JsonlWriter | None = None
        self._metrics: JsonlWriter | None = None

    def has_rows(self) -> bool:
        return any(p.is_file() and p.stat().st_size > 0 for p in (self.turns_path, self.metrics_path))

    def resume_at(self, last_done_step: int) -> int:
        """Drop rows of steps after ``last_done_step`` (-1: all); returns how many were dropped."""
        return truncate_after(self.turns_path, last_done_step) + truncate_after(self.metrics_path, last_done_step)

    def open(self) -> None:
        self._turns = JsonlWriter(self.turns_path)
        self._metrics = JsonlWriter(self.metrics_path)

    def append_turns(self, rows: list[dict[str, Any]]) -> None:
        assert self._turns is not None
        self._turns.append(rows)

    def append_metrics(self, row: dict[str, Any]) -> None:
        assert self._metrics is not None
        self._metrics.append([row])

    def restore_metrics(self, row: dict[str, Any]) -> bool:
        """Append a step's metrics row kept in its checkpoint, where the run stopped after the checkpoint was in
        place and before the row was appended (nothing is appended when a row of that step is there)."""
        assert self._metrics is not None
        if any(r.get("step") == row.get("step") for r in read_jsonl(self.metrics_path)):
            return False
        self._metrics.append([row])
        return True

    def close(self) -> None:
        for w in (self._turns, self._metrics):
            if w is not None:
                w.close()

    def write_provenance(self, resolved_config: dict[str, Any], config_yaml: str, start_step: int = 0) -> None:
        (self.run_dir / "config.yaml").write_text(config_yaml)
        (self.run_dir / "config.json").write_text(json.dumps(resolved_config, indent=1, default=str))
        meta_path = self.run_dir / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"starts": []}
        meta.update(git=git_state(), versions=versions(), host=socket.gethostname(), python=sys.version.split()[0],
                    platform=platform.platform(), cpus=len(os.sched_getaffinity(0)), gpus=gpu_names(),
                    run_id=run_id_for(self.run_dir))
        # one entry per start: a requeued SLURM job shows the same job id with a higher restart count
        meta["starts"].append({"time": time.time(), "start_step": start_step, "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                               "slurm_array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
                               "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
                               "slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0")), "argv": sys.argv})
        meta_path.write_text(json.dumps(meta, indent=1))


def git_state() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                                    text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": commit or "unknown", "dirty": dirty}


def gpu_names() -> list[str]:
    """The host's GPUs as ``nvidia-smi`` names them (none where it is absent). Asked of nvidia-smi, not torch:
    the run's process must not create a CUDA context before it forks its workers."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for pkg in ("kevin-exp", "torch", "transformers", "hydra-core", "omegaconf", "vllm", "deepspeed", "wandb", "submitit"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out
