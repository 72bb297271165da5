"""submitit's SLURM launcher, with kevin-exp's pre-submission checks (kevin_exp.launch.slurm_checks) and a line per
submitted job: its overrides, SLURM job id, run folder and log folder. While it waits for the jobs it prints how many
are done, running and pending, and the time to the end of the sweep once a job has ended (``wait_reporting``). A
Ctrl-C while it waits for the jobs stops the waiting only: the jobs keep running, and the message says how to follow
and stop them."""
from __future__ import annotations

import copy
import functools
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig, open_dict

from kevin_exp.errors import LaunchError
from kevin_exp.launch.slurm_checks import check_cluster_reachable, check_points, job_config
from kevin_exp.records.progress import sweep_line
from kevin_exp.run.folder import run_lock_holder
from kevin_exp.run.signals import say_on_ctrl_c

if TYPE_CHECKING:
    import submitit


class CheckedSlurmLauncher(SlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        loader = self.hydra_context.config_loader
        sweep_configs = [loader.load_sweep_config(self.config, list(o)) for o in job_overrides]
        try:
            check_points([(filter_overrides(o), job_config(c)) for o, c in zip(job_overrides, sweep_configs)],
                         self.params.get("gpus_per_node"))
            check_cluster_reachable(self.config.hydra.runtime.choices.get("cluster", "?"), self.params.get("partition"))
            check_no_point_running(job_overrides, sweep_configs, initial_job_idx)
        except LaunchError as e:
            # Hydra reports launcher exceptions as tracebacks; this is a user error with its fix
            raise SystemExit(f"error: {e}") from None

        def report(jobs: Sequence[submitit.Job]) -> None:
            for idx, (overrides, sweep_config, job) in enumerate(zip(job_overrides, sweep_configs, jobs)):
                run_dir = _run_dir(sweep_config, job.job_id, initial_job_idx + idx)
                print(f"job {job.job_id} [{' '.join(filter_overrides(overrides))}] run: {run_dir} "
                      f"logs: {job.paths.folder}/", flush=True)
            sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
            say_on_ctrl_c(functools.partial(left_running, [job.job_id for job in jobs], sweep_dir))
            # the parent then waits on each job's result in turn, saying nothing: wait here, saying how far it is
            wait_reporting(jobs)

        with _on_submission(report):
            return super().launch(job_overrides, initial_job_idx)


def check_no_point_running(job_overrides: Sequence[Sequence[str]], sweep_configs: Sequence[DictConfig],
                           initial_job_idx: int) -> None:
    """A sweep relaunched while jobs of its first launch still write some of its points would submit second
    writers of those runs (refused by their lock, each a failed job): nothing is submitted, and the message names
    the jobs that hold them and how to finish the sweep."""
    live, jobs = [], set()
    for idx, (overrides, sweep_config) in enumerate(zip(job_overrides, sweep_configs)):
        own = sweep_config.get("run_dir")
        # (a copy: resolving the folder makes the config Hydra's current one, which leaves it read-only)
        folder = Path(str(own)) if own else _run_dir(copy.deepcopy(sweep_config), "0", initial_job_idx + idx)
        holder = run_lock_holder(folder)
        if holder is not None:
            live.append(f"  [{' '.join(filter_overrides(overrides))}] {folder} (pid {holder})")
            job = re.search(r"SLURM job (\d+)", holder)  # (an array's task: its array's id)
            if job:
                jobs.add(job[1])
    if live:
        ids = sorted(jobs)
        follow = f"follow them: squeue -j {','.join(ids)}; stop them: scancel {' '.join(ids)}\n" if ids else ""
        raise LaunchError(
            f"nothing was submitted: {len(live)} point(s) of this sweep are still being written by a running job:\n"
            + "\n".join(live) + f"\n{follow}relaunch the same command once they have ended: every point then "
            "resumes from its last checkpoint (a finished one has nothing left to run)")


def left_running(job_ids: list[str], sweep_dir: Path) -> list[str]:
    """What a Ctrl-C of the launcher says once its jobs are submitted (kevin_exp/run/signals.py)."""
    arrays = list(dict.fromkeys(job_id.split("_", 1)[0] for job_id in job_ids))
    return [f"interrupted (Ctrl-C): this launcher stopped waiting; the {len(job_ids)} SLURM job(s) it submitted keep "
            "running and write their records as usual",
            f"sweep folder: {sweep_dir} (the run folder of each job is on its line above)",
            f"follow them: squeue -j {','.join(arrays)}; stop them: scancel {' '.join(arrays)}"]


# the launcher's lines while it waits: a poll of SLURM's accounting (one sacct for every job) this often, a line
# when the counts change, and one at least this often while they do not
POLL_S = 30.0
QUIET_S = 600.0
RUNNING_STATES = ("RUNNING", "COMPLETING")
FAILED_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def wait_reporting(jobs: Sequence[submitit.Job], poll_s: float = POLL_S, quiet_s: float = QUIET_S) -> None:
    """Waits until every job has ended, printing ``sweep_line`` (kevin_exp/records/progress.py) when the counts
    change (or every ``quiet_s``). A job's time runs from the poll that first saw it running to the one that saw it
    end (a requeued job's includes its wait in the queue); the time left is estimated from the jobs that ended well,
    over as many jobs at once as were seen running at once. Should the status fail, the parent's plain wait takes
    over."""
    t0, last_line, last_counts = time.monotonic(), float("-inf"), None
    started: dict[str, float] = {}
    ended: set[str] = set()
    durations: list[float] = []
    parallel = 0
    try:
        while True:
            _refresh(jobs[0])
            now = time.monotonic()
            failed = running = pending = 0
            for job in jobs:
                state = str(job.state).upper()
                if job.job_id in ended or job.done():
                    if job.job_id not in ended:
                        ended.add(job.job_id)
                        if not state.startswith(FAILED_STATES) and job.job_id in started:
                            durations.append(now - started[job.job_id])
                    failed += state.startswith(FAILED_STATES)
                elif state.startswith(RUNNING_STATES):
                    running += 1
                    started.setdefault(job.job_id, now)
                else:
                    pending += 1
            parallel = max(parallel, running)
            counts = (len(ended), failed, running, pending)
            if counts != last_counts or now - last_line >= quiet_s:
                running_s = [now - started[j.job_id] for j in jobs
                             if j.job_id in started and j.job_id not in ended]
                print(sweep_line(len(jobs), len(ended), failed, running, pending, durations, running_s, parallel,
                                 now - t0), flush=True)
                last_line, last_counts = now, counts
            if len(ended) == len(jobs):
                return
            time.sleep(poll_s)
    except Exception as e:  # noqa: BLE001 - the sweep goes on; only its status lines stop
        print(f"sweep: no status from SLURM ({type(e).__name__}: {e}); waiting for the jobs quietly", flush=True)


def _refresh(job: submitit.Job) -> None:
    """One sacct for every job of the sweep (the jobs registered with their class's watcher when made); a job whose
    state is read from its own process (submitit's local jobs) has no watcher to refresh."""
    try:
        job.watcher.update()
    except NotImplementedError:
        pass


@contextmanager
def _on_submission(report: Callable[[Sequence[submitit.Job]], None]) -> Iterator[None]:
    """SlurmLauncher.launch builds its executor, submits the array with map_array and then blocks until every
    job has ended; wrapping map_array for the call is the one place to see the jobs as soon as they are queued."""
    import submitit  # imported when used, as the parent does, so that Hydra's plugin discovery stays fast

    executor_class = submitit.AutoExecutor
    own = executor_class.__dict__.get("map_array")
    original = executor_class.map_array

    def map_array(executor: submitit.AutoExecutor, fn: Callable, *iterable: Sequence) -> list[submitit.Job]:
        jobs = original(executor, fn, *iterable)
        report(jobs)
        return jobs

    executor_class.map_array = map_array  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own is None:
            del executor_class.map_array
        else:
            executor_class.map_array = own  # type: ignore[method-assign]


def _run_dir(sweep_config: DictConfig, job_id: str, job_num: int) -> Path:
    """hydra.sweep.dir/hydra.sweep.subdir as the job resolves them: with the job's id and number filled in and its
    own config as the current HydraConfig (for ${hydra:job.override_dirname})."""
    with open_dict(sweep_config.hydra.job):
        sweep_config.hydra.job.id = job_id
        sweep_config.hydra.job.num = job_num
    hydra_config = HydraConfig.instance()
    saved = hydra_config.cfg
    hydra_config.set_config(sweep_config)
    try:
        return Path(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir)).absolute()
    finally:
        hydra_config.cfg = saved
