"""Checkpoints in the run dir: ``checkpoints/step_000007/{policy.safetensors, trainer.safetensors, state.json}``.

Steps are 1-based: ``step_000007`` holds the weights after step 7, and a resumed run starts at step 8.

- ``policy.safetensors``: the model's weights in its training dtype, a tied weight stored once; all that
  evaluation reads (``load_policy_weights``).
- ``trainer.safetensors``: the optimizer's per-parameter tensors (AdamW: both moments and the step count)
  and torch's RNG states (CPU, every CUDA device).
- ``state.json``: the step, the caller's extra keys, the optimizer's parameter groups, the scheduler's state
  and Python's and NumPy's RNG states.

Nothing is pickled, so loading a checkpoint runs no code from it.

A ``trainer=deepspeed`` run writes the same folder with DeepSpeed's sharded state in place of
``trainer.safetensors`` (``save_sharded``/``load_sharded``; docs/deepspeed.md):

- ``zero/``: ``engine.save_checkpoint`` (every rank's optimizer and parameter partitions, the scheduler);
  these files are DeepSpeed's own (pickled) format, read only by ``load_sharded``.
- ``rng_rank{r}.safetensors`` + ``rng_rank{r}.json``: each rank's RNG states.
- ``policy.safetensors``: the consolidated model (rank 0 writes the generator's whole copy), so evaluation
  and ``load_policy_weights`` read it as any other checkpoint.
- ``state.json``: also ``world_size``. Resuming with another number of ranks converts ``zero/`` once into
  DeepSpeed's universal checkpoint (``universal/``, ``deepspeed.checkpoint.ds_to_universal``) and loads that.

A checkpoint is written into ``.step_000007.tmp`` and renamed into place, so every ``step_*`` folder is
complete; a run killed mid-save resumes from the previous one, and the next save removes the leftover. The
``checkpoints/latest`` file names the newest one, for people and scripts (resume reads the folders).

After each save only the newest ``trainer.keep_checkpoints`` are kept, plus the ones marked to keep: those
whose step is a multiple of ``trainer.keep_every`` (0: none), and any folder holding a file named ``keep``
(``touch checkpoints/step_000020/keep``).
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from kevin_exp.errors import UserError
from kevin_exp.records.run_records import fsync_path
from kevin_exp.trainer import collectives

POLICY_FILE = "policy.safetensors"
TRAINER_FILE = "trainer.safetensors"
STATE_FILE = "state.json"
KEEP_FILE = "keep"
ZERO_TAG = "zero"
UNIVERSAL_DIR = "universal"
# the layout written before safetensors (policy.pt, optimizer.pt, rng.pt; 0-based step numbers)
LEGACY_POLICY_FILE = "policy.pt"
_STEP_DIR = re.compile(r"step_(\d+)")
log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, run_dir: Path, keep: int = 1, keep_every: int = 0) -> None:
        if keep < 1:
            raise UserError(f"trainer.keep_checkpoints={keep}: must be at least 1 (a restarted job resumes from the "
                            "newest checkpoint); use trainer.keep_every to keep more")
        if keep_every < 0:
            raise UserError(f"trainer.keep_every={keep_every}: must be 0 (off) or a number of steps")
        self.root = Path(run_dir) / "checkpoints"
        self.keep, self.keep_every = keep, keep_every

    def latest(self) -> Path | None:
        """The newest complete checkpoint that holds the trainer's state (the one a run resumes from), or None."""
        resumable = [path for path in self._complete() if has_full_state(path)]
        return resumable[-1] if resumable else None

    def newest(self) -> Path | None:
        """The newest complete checkpoint, the policy-only ones included (what evaluation reads), or None."""
        complete = self._complete()
        return complete[-1] if complete else None

    def _complete(self) -> list[Path]:
        steps = _step_dirs(self.root)
        if steps and is_legacy(steps[-1][1]):
            raise UserError(f"{steps[-1][1]} was written in an older checkpoint format ({LEGACY_POLICY_FILE}) and "
                            "cannot be resumed: start the run in a new run_dir")
        return [path for _, path in steps if _is_complete(path)]

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             extra: dict[str, Any] | None = None, full_state: bool = True) -> Path:
        """Writes the checkpoint of the (1-based) step just finished, then prunes older ones; without
        ``full_state``, the policy alone (``trainer.state_every``)."""
        final, tmp = self._paths(step)
        self._clear_leftovers()
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / POLICY_FILE))
        state = {**(extra or {}), "step": step, "full_state": full_state}
        if full_state:
            tensors, opt_state = _split_optimizer(optimizer.state_dict())
            rng_tensors, rng_state = _rng_state()
            save_file({**tensors, **rng_tensors}, str(tmp / TRAINER_FILE))
            state.update(optimizer=opt_state, scheduler=scheduler.state_dict(), rng=rng_state)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        self._publish(tmp, final)
        return final

    def load(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
        """Restores everything ``save`` wrote; returns ``state.json`` without the trainer's parts (``step``
        and the caller's extra keys)."""
        path = Path(path)
        if (path / ZERO_TAG).is_dir():
            raise UserError(f"{path}: written by trainer.backend=deepspeed; resume it with trainer=deepspeed (or start "
                            "the run in a new run_dir)")
        _refuse_policy_only(path)
        load_policy_weights(path, model)
        state = json.loads((path / STATE_FILE).read_text())
        state.pop("full_state", None)
        tensors = load_file(str(path / TRAINER_FILE))
        optimizer.load_state_dict(_join_optimizer(tensors, state.pop("optimizer"), optimizer))
        scheduler.load_state_dict(state.pop("scheduler"))
        _set_rng_state(tensors, state.pop("rng"))
        return state

    # ------------------------------------------------------------------ DeepSpeed (every rank calls these)
    def save_sharded(self, step: int, learner: Any, extra: dict[str, Any] | None = None, full_state: bool = True) -> Path:
        """The DeepSpeed learner's checkpoint of the step just finished (a collective: every rank calls it); without
        ``full_state``, the consolidated policy alone (``trainer.state_every``)."""
        final, tmp = self._paths(step)
        rank, main = collectives.rank(), collectives.rank() == 0
        if main:
            self._clear_leftovers()
            tmp.mkdir(parents=True)
        collectives.barrier()
        if full_state:
            learner.engine.save_checkpoint(str(tmp), tag=ZERO_TAG, save_latest=False)
            rng_tensors, rng_state = _rng_state()
            save_file(rng_tensors, str(tmp / f"rng_rank{rank}.safetensors"))
            (tmp / f"rng_rank{rank}.json").write_text(json.dumps(rng_state))
            collectives.barrier()
        policy_state = learner.consolidated_state()  # gathered on rank 0 (a collective without a whole copy)
        if main:
            save_model(_StateHolder(policy_state), str(tmp / POLICY_FILE))
            state = {**(extra or {}), "step": step, "world_size": collectives.world_size(), "backend": "deepspeed",
                     "full_state": full_state}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
            self._publish(tmp, final)
        collectives.barrier()
        return final

    def load_sharded(self, path: Path, learner: Any) -> dict[str, Any]:
        """Restores what ``save_sharded`` wrote (a collective); another world size loads the universal form."""
        path = Path(path)
        _refuse_policy_only(path)
        state = json.loads((path / STATE_FILE).read_text())
        state.pop("full_state", None)
        if "world_size" not in state:
            raise UserError(f"{path}: written by trainer.backend=torch; resume it with trainer=torch (or start the "
                            "run in a new run_dir)")
        saved_world, world = state.pop("world_size"), collectives.world_size()
        state.pop("backend", None)
        if saved_world == world:
            learner.engine.load_checkpoint(str(path), tag=ZERO_TAG)
        else:
            if collectives.rank() == 0:
                universal_checkpoint(path)
            collectives.barrier()
            learner.engine.load_checkpoint(str(path / UNIVERSAL_DIR), tag=ZERO_TAG)
        learner.sync_generator_weights()
        rank_file = path / f"rng_rank{collectives.rank()}.json"
        if rank_file.is_file():  # a rank that did not exist when it was saved keeps its own RNG state
            _set_rng_state(load_file(str(path / f"rng_rank{collectives.rank()}.safetensors")), json.loads(rank_file.read_text()))
        return state

    def _paths(self, step: int) -> tuple[Path, Path]:
        """Where the checkpoint of ``step`` ends up, and the folder it is written in first."""
        name = f"step_{step:06d}"
        return self.root / name, self.root / f".{name}.tmp"

    def _clear_leftovers(self) -> None:
        """Folders of saves that never finished (a job killed while writing)."""
        for leftover in self.root.glob(".step_*.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)

    def _publish(self, tmp: Path, final: Path) -> None:
        """A written checkpoint made the newest: every file on disk, the folder renamed into place (the same step
        saved again, a rerun of it, replaces it), the ``latest`` pointer moved atomically, older ones pruned."""
        for path in [*tmp.rglob("*"), tmp]:
            fsync_path(path)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_path(self.root)
        pointer = self.root / "latest.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, self.root / "latest")
        self._prune(final)

    def _prune(self, newest: Path) -> None:
        """Keeps the newest ``keep``, the marked ones, and the newest that holds the trainer's state (what a
        restarted run resumes from, however many policy-only checkpoints came after it)."""
        complete = [(step, path) for step, path in _step_dirs(self.root) if _is_complete(path)]
        recent = {path for _, path in complete[-self.keep:]}
        resumable = [path for _, path in complete if has_full_state(path)]
        recent.update(resumable[-1:])
        for step, path in complete:
            marked = (self.keep_every > 0 and step % self.keep_every == 0) or (path / KEEP_FILE).exists()
            if path != newest and path not in recent and not marked:
                shutil.rmtree(path, ignore_errors=True)


class _StateHolder:
    """A state dict where ``save_model`` wants a model (it stores tensors that share storage once)."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint that ``checkpoint=<path>`` names: a run dir (its newest checkpoint), its ``checkpoints``
    folder, or one ``checkpoints/step_NNNNNN`` folder."""
    p = Path(path).expanduser()
    fix = ("pass a training run directory or one of its checkpoints/step_NNNNNN folders; leave checkpoint out to "
           "evaluate the model's own weights")
    if not p.is_dir():
        raise UserError(f"checkpoint={path}: no such folder; {fix}")
    if is_legacy(p):
        raise UserError(f"checkpoint={path}: written in an older checkpoint format ({LEGACY_POLICY_FILE}), which "
                        "this version does not read; retrain the run, or evaluate it with the version that wrote it")
    if _is_complete(p):
        return p
    run_dir = p.parent if p.name == "checkpoints" else p
    if not (run_dir / "checkpoints").is_dir():
        raise UserError(f"checkpoint={path}: neither a run directory (it has no checkpoints/ folder) nor a "
                        f"checkpoint folder (it has no {POLICY_FILE}); {fix}")
    try:
        latest = Checkpointer(run_dir).newest()
    except UserError as e:
        raise UserError(f"checkpoint={path}: {e}") from None
    if latest is None:
        raise UserError(f"checkpoint={path}: this run has no finished checkpoint yet (it saves one every "
                        "trainer.checkpoint_every steps); wait for one, or pass another run")
    return latest


def load_policy_weights(checkpoint_dir: Path, model: torch.nn.Module, model_name: str | None = None) -> None:
    """Copies the checkpoint's weights into ``model`` (cast to the model's dtype, on its device);
    ``model_name`` (the ``model`` setting) names the model in the error when they do not fit."""
    path = Path(checkpoint_dir) / POLICY_FILE
    try:
        load_model(model, str(path), strict=True)
    except RuntimeError as e:
        detail = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e))
        which = f"model={model_name}" if model_name else "this model"
        raise UserError(f"{checkpoint_dir}: its weights do not fit {which} ({detail}); use the model it was "
                        "trained with") from None


def saved_world_size(checkpoint_dir: Path) -> int | None:
    """The number of ranks a DeepSpeed checkpoint was written by (None: a torch learner's checkpoint)."""
    return json.loads((Path(checkpoint_dir) / STATE_FILE).read_text()).get("world_size")


def universal_checkpoint(checkpoint_dir: Path) -> Path:
    """``checkpoint_dir/universal``: the world-size-free form of its ``zero/`` shards, made once (atomically) and
    kept next to them, so a second resume on another number of ranks loads it directly. The conversion is
    DeepSpeed's (``python -m deepspeed.checkpoint.ds_to_universal --input_folder step_N/zero --output_folder
    step_N/universal/zero``), run in a process of its own (a fresh one, not a fork of a rank that holds a CUDA
    context) with extract and merge workers sized to the host (``conversion_workers``); its stages go to the log as
    they happen."""
    out = Path(checkpoint_dir) / UNIVERSAL_DIR
    if out.is_dir():
        log.info("%s: loading the universal form made by an earlier resume", out)
        return out
    tmp = Path(checkpoint_dir) / f".{UNIVERSAL_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    extract, merge = conversion_workers(saved_world_size(checkpoint_dir) or 1)
    log.info("converting %s (written by %s ranks) to DeepSpeed's universal form: %d extract and %d merge workers",
             checkpoint_dir, saved_world_size(checkpoint_dir), extract, merge)
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
           "--input_folder", str(Path(checkpoint_dir) / ZERO_TAG), "--output_folder", str(tmp / ZERO_TAG),
           "--num_extract_workers", str(extract), "--num_merge_workers", str(merge)]
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            tail = [*tail[-19:], line]
            if line.startswith("***"):  # the conversion's stages (its progress bars stay out of the log)
                log.info("universal form: %s (%.0f s)", line.strip("* "), time.monotonic() - t0)
    if proc.returncode:
        raise RuntimeError(f"converting {checkpoint_dir} to DeepSpeed's universal form failed (exit {proc.returncode}); "
                           "its last lines:\n" + "\n".join(tail))
    os.rename(tmp, out)
    log.info("universal form of %s made in %.1f s, kept for later resumes", checkpoint_dir, time.monotonic() - t0)
    return out


def conversion_workers(saved_ranks: int, cores: int | None = None) -> tuple[int, int]:
    """Extract workers (one per saved rank's shard, at most one per core) and merge workers (half the cores, at
    most 8: each holds every rank's slices of one parameter's states at once)."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, min(saved_ranks, cores)), max(1, min(cores // 2, 8))


def checkpoint_step(checkpoint_dir: Path) -> int:
    """The training steps behind a checkpoint's weights (1-based: the step it was saved after)."""
    return int(json.loads((Path(checkpoint_dir) / STATE_FILE).read_text())["step"])


def is_legacy(path: Path) -> bool:
    return (path / LEGACY_POLICY_FILE).is_file() and not (path / POLICY_FILE).is_file()


def has_full_state(path: Path) -> bool:
    """Whether a checkpoint holds the trainer's state besides the policy (checkpoints written before
    ``trainer.state_every`` existed all do)."""
    return bool(json.loads((Path(path) / STATE_FILE).read_text()).get("full_state", True))


def _refuse_policy_only(path: Path) -> None:
    if not has_full_state(path):
        raise UserError(f"{path}: holds the policy only (trainer.state_every), so a run cannot resume from it; "
                        "resume from a checkpoint whose step is a multiple of trainer.state_every")


def _is_complete(path: Path) -> bool:
    return (path / POLICY_FILE).is_file() and (path / STATE_FILE).is_file()


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = ((_STEP_DIR.fullmatch(p.name), p) for p in root.iterdir() if p.is_dir())
    return sorted((int(m.group(1)), p) for m, p in found if m)


# ---------------------------------------------------------------------------------------------- optimizer


def _split_optimizer(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Per-parameter tensors (``optimizer.<index>.<name>``) apart from everything else (JSON)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, per_param in state_dict["state"].items():
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{name}"] = value.detach().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _join_optimizer(tensors: dict[str, torch.Tensor], saved: dict[str, Any],
                    optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        kind, index, name = key.split(".", 2)
        if kind == "optimizer":
            state.setdefault(int(index), {})[name] = value
    for index, values in saved["scalars"].items():
        state.setdefault(int(index), {}).update(values)
    # JSON turns tuples (AdamW's betas) into lists: give each setting back the type the optimizer uses
    groups = []
    for group, live in zip(saved["param_groups"], optimizer.param_groups):
        groups.append({k: tuple(v) if isinstance(live.get(k), tuple) else v for k, v in group.items()})
    return {"state": state, "param_groups": groups}


# ---------------------------------------------------------------------------------------------- RNG


def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"rng.torch.cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"rng.torch.cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return tensors, {"python": [version, list(internal), gauss_next],
                     "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}


def _set_rng_state(tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["rng.torch.cpu"])
    cuda: list[torch.Tensor] = []
    while (key := f"rng.torch.cuda{len(cuda)}") in tensors:
        cuda.append(tensors[key])
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
