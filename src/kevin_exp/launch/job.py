"""What every entry point does first inside a Hydra job: the typed, checked settings of this job, with the
run folder and the sweep's name filled in from Hydra, the process's thread budget applied, and what a Ctrl-C
will say about the job (where its records are, the command that resumes it)."""
from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from kevin_exp.config import TrainConfig, to_typed
from kevin_exp.errors import LaunchError
from kevin_exp.launch.layout import generation_line, layout_line, resolve_layout
from kevin_exp.launch.preflight import check_run_inputs, launched_by_cluster
from kevin_exp.launch.ranks import LAUNCHER_PID_ENV, as_launched, launched_ranks, rank_env_from_slurm
from kevin_exp.launch.resources import uses_gpu
from kevin_exp.launch.threads import apply_thread_limits
from kevin_exp.launch.world import context_from_env
from kevin_exp.run.folder import stopped_lines
from kevin_exp.run.signals import say_on_ctrl_c
from kevin_exp.settings_checks import AUTO


@dataclass(frozen=True)
class JobSettings:
    cfg: TrainConfig
    # the sweep's name (its runs share a W&B group), None for a single run
    sweep: str | None


def sweep_group(cfg: TrainConfig) -> str | None:
    """A sweep's name: sweep_name, or the sweep directory's name."""
    hc = HydraConfig.get()
    if cfg.sweep_name or hc.mode != RunMode.MULTIRUN:
        return cfg.sweep_name
    return Path(hc.sweep.dir).name


def job_settings(cfg: DictConfig, entry: str) -> JobSettings:
    """The job's typed config (raises a UserError naming any bad setting or missing input). In a run of several
    ranks every rank composes and checks the same config; the world the launcher started is what it records."""
    rank_env_from_slurm()  # a SLURM task of a multi-task job: its rank, from SLURM, before anything reads it
    ctx = context_from_env()
    typed = to_typed(cfg)
    hc = HydraConfig.get()
    run_dir = typed.run_dir or hc.runtime.output_dir
    typed = dataclasses.replace(typed, run_dir=str(Path(run_dir).resolve()))
    if launched_ranks():
        typed = as_launched(typed, ctx)
    generation_auto, on_gpu = typed.rollout.generation_batch_size == AUTO, uses_gpu(typed)
    typed, layout_reason = resolve_layout(typed, on_gpu=on_gpu)
    if layout_reason and ctx.is_main:
        print(layout_line(typed, layout_reason), flush=True)
    if generation_auto and ctx.is_main:
        print(generation_line(typed, on_gpu), flush=True)
    if entry != "train" and (ctx.distributed or typed.resources.world_size > 1):
        raise LaunchError(f"python -m kevin_exp.{entry} runs in one process, but resources ask for "
                          f"{typed.resources.world_size} ranks: resources.ranks_per_node=1 resources.nodes=1")
    check_run_inputs(typed, entry, memory_check=not launched_by_cluster())
    apply_thread_limits(typed.resources)  # before the model loads and the evaluator starts
    if hc.mode == RunMode.MULTIRUN and ctx.is_main:
        print(f"job #{hc.job.num}: {' '.join(hc.overrides.task) or 'no overrides'} -> {typed.run_dir}", flush=True)
    # a rank of a run that this machine's launcher started says nothing: the job that started it speaks for the run
    speaks = ctx.is_main and not os.environ.get(LAUNCHER_PID_ENV)
    say_on_ctrl_c(stop_report(entry, typed) if speaks else list)
    return JobSettings(typed, sweep_group(typed))


def stop_report(entry: str, cfg: TrainConfig) -> Callable[[], list[str]]:
    """What a Ctrl-C says about this job (``run.folder.stopped_lines``), with the folders and the command taken from
    Hydra now (the lines are made once the job has ended, when its Hydra config is gone)."""
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        sweep_dir = Path(hc.sweep.dir).resolve()
        command = resume_command(entry, sys.argv[1:], f"hydra.sweep.dir={sweep_dir}")
        return functools.partial(stopped_lines, entry, Path(cfg.run_dir), cfg.steps, command, sweep_dir, f"#{hc.job.num}")
    given = {a.lstrip("+").split("=", 1)[0] for a in sys.argv[1:]}
    pin = f"run_dir={cfg.run_dir}" if "run_dir" in given else f"hydra.run.dir={Path(hc.runtime.output_dir).resolve()}"
    return functools.partial(stopped_lines, entry, Path(cfg.run_dir), cfg.steps, resume_command(entry, sys.argv[1:], pin))


def resume_command(entry: str, argv: list[str], pin: str) -> str:
    """The command that starts this launch again where it stopped: the same arguments from the same folder, with
    the folder it writes pinned (``pin``: ``key=<absolute folder>``; an unnamed sweep gets a new date-time folder at
    each launch, and a relative folder depends on where the command runs). A resumed run continues from its last
    checkpoint (``resume=auto``, the default; a ``resume=never`` would refuse its folder)."""
    key = pin.split("=", 1)[0]
    kept = [a for a in argv if a.lstrip("+").split("=", 1)[0] != key and a.lstrip("+") != "resume=never"]
    return f"cd {shlex.quote(os.getcwd())} && {shlex.join(['python', '-m', f'kevin_exp.{entry}', *kept, pin])}"


def model_chosen(overrides: list[str]) -> bool:
    """The command line picks a model (the group, one of its keys, or an experiment that sets one)."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    return any(k == "model" or k.startswith("model.") or k == "experiment" for k in keys)
