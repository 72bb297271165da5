"""Checkpoints in the run dir: ``checkpoints/step_000007/{policy.pt, optimizer.pt, rng.pt, state.json}``.

The ``checkpoints/latest`` pointer is written last (tmp file + rename), so a run killed mid-save resumes
from the previous complete checkpoint. Older checkpoints beyond ``keep`` are removed after the pointer
moves.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(self, run_dir: Path, keep: int = 2) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if not pointer.is_file():
            return None
        path = self.root / pointer.read_text().strip()
        return path if (path / "state.json").is_file() else None

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             extra: dict[str, Any] | None = None) -> Path:
        name = f"step_{step:06d}"
        final = self.root / name
        tmp = self.root / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save(model.state_dict(), tmp / "policy.pt")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **(extra or {})}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        pointer_tmp = self.root / "latest.tmp"
        pointer_tmp.write_text(name)
        os.replace(pointer_tmp, self.root / "latest")
        self._prune(keep_name=name)
        return final

    def load(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
        model.load_state_dict(torch.load(path / "policy.pt", map_location="cpu"))
        opt = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
        optimizer.load_state_dict(opt["optimizer"])
        scheduler.load_state_dict(opt["scheduler"])
        _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
        return json.loads((path / "state.json").read_text())

    def _prune(self, keep_name: str) -> None:
        done = sorted(p for p in self.root.glob("step_*") if p.is_dir())
        for old in done[: max(0, len(done) - self.keep)]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)
