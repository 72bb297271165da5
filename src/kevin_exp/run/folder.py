"""The run folder: where a run's records go (turns, metrics, transcripts, provenance), and the writer's lock
that lets one process write them. In a run of several ranks only rank 0 writes; the others see the records
read-only (``RankRecords``, ``RankTranscripts``)."""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from kevin_exp.config import TrainConfig
from kevin_exp.errors import UserError
from kevin_exp.launch.ranks import joined_ranks
from kevin_exp.launch.world import DistContext, context_from_env
from kevin_exp.records.run_records import RunRecords, run_id_for
from kevin_exp.records.transcripts import TranscriptWriter


class RankRecords(RunRecords):
    """The records as a rank other than 0 sees them: it reads what is there (so every rank decides a resume
    alike) and writes nothing; rank 0 writes the run's rows once."""

    def resume_at(self, last_done_step: int) -> int:
        return 0

    def open(self) -> None:
        pass

    def append_turns(self, rows: list[dict[str, Any]]) -> None:
        pass

    def append_metrics(self, row: dict[str, Any]) -> None:
        pass

    def write_provenance(self, resolved_config: dict[str, Any], config_yaml: str, start_step: int = 0) -> None:
        pass


class RankTranscripts(TranscriptWriter):
    """Transcripts on a rank other than 0: nothing is written or deleted."""

    def append(self, step: int, rows: Any) -> None:
        pass

    def resume_at(self, last_done_step: int) -> list[int]:
        return []

    def discard(self, step: int) -> None:
        pass


@dataclass
class RunFolder:
    """Where a run's records go; opened before the model loads so a resume can be refused early. In a run of
    several ranks only rank 0 writes to it (``main``)."""

    path: Path
    run_id: str
    records: RunRecords
    transcripts: TranscriptWriter
    main: bool = True
    # the folder whose writer's lock this one holds (rank 0's; hold_run_lock)
    lock: Path | None = None

    @classmethod
    def at(cls, run_dir: str | Path, ctx: DistContext | None = None) -> "RunFolder":
        ctx = ctx or context_from_env()
        path = Path(run_dir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        if not ctx.is_main:
            return cls(path, run_id_for(path), RankRecords(path), RankTranscripts(path), main=False)
        folder = cls(path, run_id_for(path), RunRecords(path), TranscriptWriter(path))
        folder.lock = hold_run_lock(path)
        return folder

    def open(self, cfg: TrainConfig, start_step: int) -> None:
        if not self.main:
            return
        resolved = provenance_config(cfg)
        self.records.write_provenance(resolved, yaml_of(resolved), start_step)
        record_ranks(self.path)
        self.records.open()

    def close(self) -> None:
        self.records.close()
        self.transcripts.close()
        if self.lock is not None:
            release_run_lock(self.lock)
            self.lock = None


RUN_LOCK = ".writer.lock"
# folders this process holds the writer's lock of, with how many open RunFolders use each
_held_locks: dict[Path, list[int]] = {}


def hold_run_lock(path: Path) -> Path:
    """An exclusive ``flock`` on the run folder's lock file, held by the one process that writes its records
    (until it closes the folder, or dies): a second writer, such as a restart while the first run's processes
    still live, is refused instead of writing the same steps twice. One process may open its folder again."""
    if path in _held_locks:
        _held_locks[path][1] += 1
        return path
    fd = os.open(path / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise UserError(f"run_dir={path}: another process (pid {holder}) is writing this run; wait for it to end or "
                        "stop it, then start again (the run resumes from its last checkpoint), or choose another "
                        "run_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{_writer()}\n".encode(), 0)
    _held_locks[path] = [fd, 1]
    return path


def _writer() -> str:
    """Who holds a run's lock, as its lock file says: the pid, and where it runs (host, SLURM job)."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") and f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID')}"
    job = job or os.environ.get("SLURM_JOB_ID")
    return f"{os.getpid()} on {socket.gethostname()}" + (f", SLURM job {job}" if job else "")


def run_lock_holder(path: Path) -> str | None:
    """Who is writing the run in ``path`` now (as its lock file says), or None when no process holds its lock."""
    try:
        fd = os.open(path / RUN_LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)
    return None


def _holder(fd: int) -> str:
    """What the lock file open at ``fd`` says of its holder (``_writer``)."""
    return os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"


def release_run_lock(path: Path) -> None:
    held = _held_locks.get(path)
    if held is None:
        return
    held[1] -= 1
    if held[1] == 0:
        os.close(held[0])
        del _held_locks[path]


def record_ranks(run_dir: Path) -> None:
    """The ranks that joined the run, in this start's entry of meta.json (nothing for a run of one process)."""
    ranks = joined_ranks()
    if not ranks:
        return
    meta_path = run_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["starts"][-1].update(world_size=len(ranks), ranks=ranks)
    meta_path.write_text(json.dumps(meta, indent=1, default=str))


def stopped_lines(entry: str, run_dir: Path, steps: int, command: str, sweep_dir: Path | None = None,
                  job: str = "") -> list[str]:
    """What a job stopped by Ctrl-C says (``run/signals.py``): where its records and last checkpoint are, and the
    command that resumes it; in a sweep, the sweep's folder and the command that continues the sweep."""
    from kevin_exp.trainer.checkpoint import Checkpointer, checkpoint_step

    what = "sweep" if sweep_dir is not None else "evaluation" if entry == "evaluate" else "run"
    lines = [f"interrupted (Ctrl-C): the {what} stopped, and none of its processes or temporary build folders is left"]
    if sweep_dir is not None:
        lines.append(f"sweep folder: {sweep_dir} (a run folder per job; it stopped in job {job})")
    lines.append(f"{'run folder of that job' if sweep_dir is not None else 'run folder'}: {run_dir}")
    turns = _rows(run_dir / "turns.jsonl")
    if entry == "evaluate":
        lines.append(f"records: turns.jsonl ({turns}, of whole batches of tasks); a restart keeps them and evaluates the "
                     "other tasks")
    else:
        lines.append(f"records: turns.jsonl ({turns}), metrics.jsonl ({_rows(run_dir / 'metrics.jsonl')})")
        try:
            latest = Checkpointer(run_dir).latest()
        except UserError:  # a checkpoint of an older format: the run's own start says so
            latest = None
        step = checkpoint_step(latest) if latest is not None else 0
        if latest is None:
            lines.append("last checkpoint: none written yet; resuming starts at step 1")
        elif step >= steps:
            lines.append(f"last checkpoint: {latest} (step {step} of {steps}: the run is complete)")
        else:
            lines.append(f"last checkpoint: {latest} (step {step} of {steps}); resuming starts at step {step + 1}")
    lines.append(f"{'continue the sweep' if sweep_dir is not None else 'resume'}: {command}")
    if sweep_dir is not None:
        lines.append("(the finished runs are kept; each other run resumes from its last checkpoint)")
    return lines


def _rows(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            n = sum(1 for line in f if line.strip())
    except OSError:
        n = 0
    return f"{n} row{'' if n == 1 else 's'}"


def provenance_config(cfg: TrainConfig) -> dict[str, Any]:
    """The settings the run used, as written to config.json and W&B."""
    return dataclasses.asdict(cfg)


def yaml_of(resolved: dict[str, Any]) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(resolved))
