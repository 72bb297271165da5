"""Before Hydra runs or launches anything: compose every point of the launch and check it.

``preflight(config_name, argv)`` expands a multirun into its points the way Hydra's basic sweeper does
(command-line sweeps and a sweep file's ``hydra.sweeper.params``), composes each, and checks its settings
(``config.to_typed``), its inputs (tasks, model path, checkpoint, the trainer's GPU, memory:
``check_run_inputs``) and the folders it writes (``check_job_folders``, ``check_sweep_files``: writable, and no
other run's). A bad point is one ``UserError`` naming the setting, the value and what is allowed,
raised before any run folder, ledger line, model, compiler or cluster is touched. Hydra's own composition errors (an unknown key,
a value of the wrong type, a missing group option) are translated into the same one-line form.
"""
from __future__ import annotations

import copy
import difflib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from kevin_exp.config import ConfigError, TrainConfig, to_typed
from kevin_exp.errors import UserError, one_line
from kevin_exp.launch.layout import resolve_layout
from kevin_exp.launch.memory_check import check_host_training, check_resources, local_gpu_memory_gb
from kevin_exp.launch.ranks import check_trainer_for_ranks
from kevin_exp.launch.resources import uses_gpu
from kevin_exp.launch.slurm_checks import check_cluster_reachable, check_points
from kevin_exp.models.loading import check_model_path
from kevin_exp.records.run_records import file_problem, folder_problem
from kevin_exp.run.folder import RUN_LOCK
from kevin_exp.run.setup import load_task_pool
from kevin_exp.trainer.checkpoint import find_checkpoint

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
# what Hydra does with these prints or explains; nothing runs, so nothing is checked
_INFO_FLAGS = ("help", "hydra_help", "info", "shell_completion", "experimental_rerun")


def _leaf_keys(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        keys = []
        for k, v in node.items():
            keys += [f"{prefix}{k}"] + _leaf_keys(v, f"{prefix}{k}.")
        return keys
    return []


# settings that have one name now: the name they had -> the one they have
RENAMED = {"algorithm.gamma": "gamma", "algorithm.normalization": "normalization", "evaluator.max_speedup": "algorithm.max_speedup"}


def _closest(key: str, known: Iterable[str]) -> str:
    match = [RENAMED[key]] if key in RENAMED else difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""


def explain_composition_error(error: Exception, entry: str, known_keys: Iterable[str]) -> str:
    """Hydra's multi-line composition error as one line: the setting, the value, what is allowed."""
    text, cause = str(error), str(error.__cause__ or "")
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown and ("not in" in cause or "not in struct" in cause):
        key = unknown.group(1)
        return (f"{key}: no such setting{_closest(key, known_keys)}; `python -m kevin_exp.{entry} --cfg job` lists "
                f"every setting, --help the groups")
    merging = re.search(r"Error merging override (\S+)", text)
    converted = re.search(r"could not be converted to (\w+)", cause)
    if merging and converted:
        return f"{merging.group(1)}: expected a value of type {converted.group(1).lower()}"
    if merging:
        return f"{merging.group(1)}: {one_line(cause.splitlines()[0] if cause else text)}"
    missing = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        return f"{group}={option}: no such option; available: {', '.join(options) or 'none'}"
    return one_line(text + (f" ({cause})" if cause else ""))


class Composer:
    """Composes points of one entry point's config with Hydra's compose API (outside any running job)."""

    def __init__(self, config_name: str) -> None:
        self.config_name = config_name
        self.entry = "evaluate" if config_name == "evaluate" else "train"
        self._known: list[str] | None = None

    def compose(self, overrides: list[str]) -> DictConfig:
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        failure: Exception | None = None
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                try:
                    return compose(self.config_name, overrides=overrides, return_hydra_config=True)
                except Exception as e:  # every composition failure is a setting the user gave
                    failure = e
        finally:
            GlobalHydra.instance().clear()
        raise ConfigError(explain_composition_error(failure, self.entry, self.known_keys())) from None

    def known_keys(self) -> list[str]:
        if self._known is None:
            self._known = []  # a base config that fails to compose names no keys (and its error must not recurse)
            base = self.compose([])
            self._known = _leaf_keys(OmegaConf.to_container(base, resolve=False))
        return self._known


def launch_points(composer: Composer, overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override list of every job this launch runs (one for a single run)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception as e:
        raise ConfigError(one_line(str(e))) from None
    if not multirun:
        swept = [o.input_line for o in parsed if o.is_sweep_override()]
        if swept:
            raise ConfigError(f"{swept[0]}: a list of values needs -m (a multirun); without -m give one value")
        return [overrides]
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    base = composer.compose(fixed)
    params = base.hydra.sweeper.get("params")
    swept = OmegaConf.to_container(params, resolve=False) if params else {}
    lines = [f"{k}={v}" for k, v in swept.items()] + list(overrides)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(lines), None)
    return [list(point) for batch in batches for point in batch]


def check_device(device: str) -> None:
    """``trainer.device`` names a GPU this machine has (checked where the run runs, before its folder exists)."""
    if not device.startswith("cuda"):
        return
    import torch

    fix = "use trainer.device=auto (cuda when a GPU is visible, else cpu) or trainer.device=cpu"
    if not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={device}: no CUDA GPU is visible on this machine; {fix}")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(f"trainer.device={device}: this machine shows {torch.cuda.device_count()} GPU(s) "
                          f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}); {fix}")


def check_groups(cfg: TrainConfig, pool_size: int) -> None:
    """A step has the tasks it asks for, and each task's group more than one sample (one alone has advantage 0)."""
    if cfg.tasks_per_step > pool_size:
        raise ConfigError(f"tasks_per_step={cfg.tasks_per_step}: the task pool has {pool_size} tasks (tasks.suite="
                          f"{cfg.tasks.suite}, tasks.levels={list(cfg.tasks.levels)}); give tasks_per_step={pool_size} "
                          "or fewer, or a larger pool (tasks.levels, tasks.suite)")
    if cfg.n_trajectories * cfg.n_turns == 1:
        raise ConfigError("n_trajectories=1 n_turns=1: each task's group would hold one sample, whose advantage is "
                          "always 0, so no step could change the policy; use n_trajectories=2 or more (Kevin: 16), "
                          "or n_turns=2 or more")


def check_appended_keys(composer: "Composer", overrides: list[str]) -> None:
    """``+key=value`` adds a key; one that no setting reads would be ignored, so it is refused like a typo."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    known = set(composer.known_keys())
    for o in OverridesParser.create().parse_overrides(overrides):
        if not (o.is_add() or o.is_force_add()):
            continue
        key = o.key_or_group
        is_group = (CONF_DIR / key).is_dir()
        if key.startswith("hydra.") or is_group or key in known or any(k.startswith(key + ".") for k in known):
            continue
        raise ConfigError(f"{o.input_line}: no setting is named {key}{_closest(key, known)}, so the value would be "
                          f"ignored; `python -m kevin_exp.{composer.entry} --cfg job` lists every setting")


def check_sweep_has_multirun(cfg: DictConfig, multirun: bool) -> None:
    """A sweep file composed without -m would run its base point alone, as if it were the sweep."""
    params = cfg.hydra.sweeper.get("params") if "hydra" in cfg else None
    if params and not multirun:
        sweep = cfg.hydra.runtime.choices.get("sweep")
        what = f"sweep={sweep}" if sweep else "hydra.sweeper.params"
        raise ConfigError(f"{what}: a sweep needs -m (python -m kevin_exp.train -m {what}); without -m only its first "
                          "point would run")


def check_trainer_installed(cfg: TrainConfig) -> None:
    """A run's trainer needs its package; the memory planner (``python -m kevin_exp.launch.memory_report``) does
    not, so this is checked where a run starts, not where a config is composed."""
    if cfg.trainer.backend == "deepspeed" and not installed("deepspeed"):
        raise ConfigError("trainer.backend=deepspeed: DeepSpeed is not installed; pip install -e '.[deepspeed]' "
                          "(or pip install deepspeed==0.19.8)")


def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _hydra_setting(cfg: DictConfig, key: str) -> str | None:
    """A path setting of Hydra's as the job will see it (its ``${hydra:...}`` interpolations read the running
    job's Hydra config), or None where that is only known once the job runs (``${hydra:job.num}``)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import OmegaConfBaseException

    holder = HydraConfig.instance()
    saved, job = holder.cfg, copy.deepcopy(cfg)
    try:
        holder.set_config(job)
        value = OmegaConf.select(job, key)
    except OmegaConfBaseException:
        return None
    finally:
        holder.cfg = saved
    return None if value is None else str(value)


# how a run gets a folder of its own, by the setting that named the folder
_OTHER_FOLDER = {"run_dir": "another run_dir, or none: the job's folder named by its overrides",
                 "hydra.run.dir": "another hydra.run.dir", "hydra.sweep.dir": "another sweep_name or hydra.sweep.dir"}


def job_folders(cfg: DictConfig, typed: TrainConfig, multirun: bool) -> list[tuple[str, Path]]:
    """The folders a job writes, each with the setting that names it: its records' (``run_dir``) and Hydra's
    (``.hydra/`` and the job's log: ``hydra.run.dir``, or in a sweep ``hydra.sweep.dir``/``hydra.sweep.subdir``)."""
    named = [("run_dir", typed.run_dir, typed.run_dir)] if typed.run_dir else []
    if multirun:
        sweep, subdir = _hydra_setting(cfg, "hydra.sweep.dir"), _hydra_setting(cfg, "hydra.sweep.subdir")
        if sweep is not None and subdir is not None:
            named.append(("hydra.sweep.dir", sweep, os.path.join(sweep, subdir)))
    else:
        run = _hydra_setting(cfg, "hydra.run.dir")
        if run is not None:
            named.append(("hydra.run.dir", run, run))
    folders: dict[Path, str] = {}
    for key, value, folder in named:
        folders.setdefault(Path(os.path.abspath(folder)), f"{key}={value}")
    return [(setting, folder) for folder, setting in folders.items()]


def run_identity(overrides: Iterable[str], launch_keys: set[str]) -> list[str]:
    """What makes two launches one run, as it makes the job's folder name: its overrides, less the launch
    settings (``hydra.job.config.override_dirname.exclude_keys``, which never change results, with every key under
    them: ``resources.ranks_per_node`` is one of ``resources``, so a run resumes on another number of ranks) and
    Hydra's own."""
    identity = []
    for line in overrides:
        key = line.split("=", 1)[0].lstrip("+~")
        parts = key.split(".")
        launch = any(".".join(parts[:i]) in launch_keys for i in range(1, len(parts) + 1))
        if not launch and re.split(r"[./]", key)[0] != "hydra":
            identity.append(line.lstrip("+"))
    return sorted(identity)


def _holds_a_run(folder: Path) -> bool:
    """Anything besides what Hydra writes before the job starts (``.hydra/``, the job's log) and the writer's lock."""
    return any(p.name not in (".hydra", RUN_LOCK) and p.suffix != ".log" for p in folder.iterdir())


# settings a run may be relaunched with to continue it: more steps trains the same run on
CONTINUING_KEYS = ("steps",)


def check_job_folders(cfg: DictConfig, typed: TrainConfig, multirun: bool) -> None:
    """Every folder the job writes can be made and written by this user, and none holds another run: a folder
    whose ``.hydra/overrides.yaml`` names other settings (a run relaunched with its own settings, whatever its
    launch settings, resumes in its folder)."""
    launch_keys = set(cfg.hydra.job.config.override_dirname.exclude_keys) | set(CONTINUING_KEYS)
    mine = run_identity(cfg.hydra.overrides.task, launch_keys)
    for setting, folder in job_folders(cfg, typed, multirun):
        key = setting.split("=", 1)[0]
        problem = folder_problem(folder)
        if problem:
            raise ConfigError(f"{setting}: {problem}; give {key}=<a folder this user can write>")
        saved = folder / ".hydra" / "overrides.yaml"
        if not saved.is_file() or not _holds_a_run(folder):
            continue
        try:
            theirs = run_identity([str(o) for o in OmegaConf.load(saved)], launch_keys)
        except Exception:  # a file that is not Hydra's list of overrides says nothing about the run
            continue
        if theirs != mine:
            here = " ".join(o for o in mine if o not in theirs) or "none"
            there = " ".join(o for o in theirs if o not in mine) or "none"
            raise ConfigError(
                f"{setting}: {folder} holds another run, whose records this one would overwrite (settings only this "
                f"run has: {here}; only that run has: {there}); give this run a folder of its own ({_OTHER_FOLDER[key]}), "
                "or delete that folder to start over. Relaunching that run with its own settings resumes it")


def check_sweep_files(cfg: DictConfig) -> None:
    """A sweep's folder and its ledger file can be written (the ledger line is appended before any job runs)."""
    sweep = _hydra_setting(cfg, "hydra.sweep.dir")
    problem = folder_problem(sweep) if sweep is not None else None
    if problem:
        raise ConfigError(f"hydra.sweep.dir={sweep}: {problem}; give hydra.sweep.dir=<a folder this user can write>")
    ledger = OmegaConf.select(cfg, "hydra.callbacks.ledger.path")
    problem = file_problem(ledger) if ledger else None
    if problem:
        raise ConfigError(f"hydra.callbacks.ledger.path={ledger}: {problem}; give hydra.callbacks.ledger.path=<a file "
                          "in a folder this user can write>")


def check_run_inputs(cfg: TrainConfig, entry: str, memory_check: bool = True, runs_here: bool = True) -> None:
    """What a run needs besides valid settings: its tasks, its model's weights, its checkpoint, (where it runs
    on this machine) the GPU its trainer.device names, and (on a GPU) enough memory. Raises a UserError naming
    the setting and the fix."""
    if runs_here:
        check_device(cfg.trainer.device)
    pool = load_task_pool(cfg.tasks)
    if entry == "train":
        check_groups(cfg, len(pool))
    check_model_path(cfg.model, loads_here=runs_here)
    if entry == "evaluate" and cfg.checkpoint:
        find_checkpoint(cfg.checkpoint)
    if entry == "train":
        check_trainer_installed(cfg)
        check_trainer_for_ranks(cfg)
    if memory_check and uses_gpu(cfg):
        check_resources(resolve_layout(cfg, on_gpu=True)[0], local_gpu_gb=local_gpu_memory_gb() if runs_here else None)
    elif memory_check and runs_here:
        check_host_training(resolve_layout(cfg, on_gpu=False)[0])


def check_points_have_their_own_folders(checked: list[tuple[list[str], TrainConfig]], overrides: list[str]) -> None:
    """Two points of a sweep given the same ``run_dir`` would write one folder (the second refused, or resuming
    the first's records as its own): refused before the sweep starts."""
    seen: dict[str, list[str]] = {}
    for point, typed in checked:
        if not typed.run_dir:
            continue
        first = seen.setdefault(str(Path(typed.run_dir).resolve()), point)
        if first is not point:
            swept = lambda p: " ".join(o for o in p if o not in overrides)  # noqa: E731
            raise ConfigError(
                f"run_dir={typed.run_dir}: the sweep points {swept(first)} and {swept(point)} would both write their "
                "records there; leave run_dir out of a sweep (each point gets a folder of its own under "
                "hydra.sweep.dir) or make it differ per point, e.g. run_dir=runs/gamma_${gamma}")


def launched_by_cluster(cfg: DictConfig | None = None) -> bool:
    """A cluster launch's memory check is its launcher's (it knows the GPUs each job gets)."""
    from hydra.core.hydra_config import HydraConfig

    if cfg is not None and "hydra" in cfg:
        choices = cfg.hydra.runtime.choices
    elif HydraConfig.initialized():
        choices = HydraConfig.get().runtime.choices
    else:
        return False
    return "submitit" in str(choices.get("hydra/launcher", ""))


def preflight(config_name: str, argv: list[str]) -> list[TrainConfig]:
    """Checks every point of the launch that ``argv`` asks for; returns their typed configs."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    if any(getattr(args, flag) for flag in _INFO_FLAGS) or args.config_name or args.config_path or args.config_dir:
        return []
    composer = Composer(config_name)
    checked = []
    check_appended_keys(composer, list(args.overrides))
    points = launch_points(composer, list(args.overrides), bool(args.multirun))
    for point in points:
        cfg = composer.compose(point)
        check_sweep_has_multirun(cfg, bool(args.multirun))
        if args.multirun and not args.cfg and not checked:
            check_sweep_files(cfg)  # the sweep's, the same for every point
        try:
            typed = to_typed(cfg)
            if not args.cfg:
                here = not launched_by_cluster(cfg)  # a cluster's job runs on a node of its own
                check_run_inputs(typed, composer.entry, memory_check=here, runs_here=here)
                check_job_folders(cfg, typed, bool(args.multirun))
        except UserError as e:
            swept = [o for o in point if o not in args.overrides]
            raise type(e)(f"{e} (in the sweep point {' '.join(swept)})" if len(points) > 1 else str(e)) from None
        checked.append((point, typed))
    if args.multirun and not args.cfg:
        check_points_have_their_own_folders(checked, list(args.overrides))
    if checked and not args.cfg and launched_by_cluster(cfg):
        # the GPUs each job gets are the launcher's: every point must fit them, and the cluster must answer
        check_points([(p, t) for p, t in checked], cfg.hydra.launcher.get("gpus_per_node"))
        check_cluster_reachable(str(cfg.hydra.runtime.choices.get("cluster")), cfg.hydra.launcher.get("partition"))
    return [t for _, t in checked]
