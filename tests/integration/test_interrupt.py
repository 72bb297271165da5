"""A user's Ctrl-C, as a terminal sends it (SIGINT to the command's whole process group): the run stops within
seconds and exits 130 with no traceback, says where its folder, records and last checkpoint are and the exact
command that resumes it, and leaves no process and no temporary build folder behind; the command it prints
resumes the run (continues the sweep, the evaluation) to the end. A second Ctrl-C does not cut the cleanup short.
"""
from __future__ import annotations

import ctypes
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kevin_exp.records.run_records import read_jsonl
from tests.helpers import FEW_TRIALS

REPO = Path(__file__).resolve().parents[2]
PR_SET_CHILD_SUBREAPER = 36
SYNTHETIC = ["model=tiny", "rollout.env=synthetic", "logger.progress=lines", "rollout.max_new_tokens=64",
             "n_trajectories=2", "n_turns=2", "tasks_per_step=1"]
# scripted responses through the real cpu evaluator: at its first turn, with an empty compile cache, its builds run
CPU = ["experiment=cpu_smoke", "logger.progress=lines", *FEW_TRIALS]
STOP_S = 15.0  # from the Ctrl-C to the exit (the interpreter's own exit included, on a loaded 2-core machine)


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, state) of every process."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            found[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[0].decode())
    return found


@pytest.fixture
def adopted():
    """This test process adopts the orphans of what it starts (PR_SET_CHILD_SUBREAPER): a fork server or runner
    left behind in a session of its own is then found as a child of this process. Yields the children it had."""
    libc = ctypes.CDLL(None, use_errno=True)
    me = os.getpid()
    before = {pid for pid, (ppid, _, _) in _processes().items() if ppid == me}
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield before
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid, (ppid, _, state) in _processes().items():
            if ppid == me and state == "Z" and pid not in before:  # adopted and ended since: reaped
                os.waitpid(pid, os.WNOHANG)


def _left_behind(session: int, known: set[int], wait_s: float = 5.0) -> list[str]:
    """The processes of the run's session, and the orphans this process adopted, still alive after ``wait_s``
    (adopted ones that ended are reaped; a test that fails kills what it finds)."""
    me, deadline = os.getpid(), time.monotonic() + wait_s
    while True:
        alive = []
        for pid, (ppid, sid, state) in _processes().items():
            if sid != session and (ppid != me or pid in known):
                continue
            if state == "Z":
                if ppid == me:
                    os.waitpid(pid, os.WNOHANG)
                continue
            alive.append(pid)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    described = []
    for pid in alive:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200].decode(errors="replace")
            described.append(f"{pid}: {cmdline}")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return described


class Launch:
    """A command started as a terminal starts it, in a session (and process group) of its own; its output is read
    as it comes."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: str, after: str | None = None, timeout_s: float = 300.0) -> None:
        """Until a line matches ``pattern`` (a later one than the first that matches ``after``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = list(self.lines)
            if after is not None:
                start = next((i for i, line in enumerate(lines) if re.search(after, line)), None)
                lines = [] if start is None else lines[start + 1:]
            if any(re.search(pattern, line) for line in lines):
                return
            assert self.proc.poll() is None, f"it ended before {pattern!r}:\n{self.output()[-3000:]}"
            time.sleep(0.05)
        raise AssertionError(f"no line matched {pattern!r} within {timeout_s:.0f} s:\n{self.output()[-3000:]}")

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)

    def stopped(self) -> tuple[int, str]:
        """Its exit status and output, once it ended (within STOP_S of the Ctrl-C)."""
        t0 = time.monotonic()
        try:
            code = self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"still running {STOP_S:.0f} s after the Ctrl-C:\n{self.output()[-3000:]}") from None
        self._reader.join(timeout=10)
        assert time.monotonic() - t0 < STOP_S
        return code, self.output()

    def output(self) -> str:
        return "".join(self.lines)


def _stop_message(output: str) -> dict[str, str]:
    """The lines the Ctrl-C printed, as {label: text}."""
    start = output.index("interrupted (Ctrl-C)")
    return dict(line.split(": ", 1) for line in output[start:].splitlines() if ": " in line)


def _assert_clean_stop(code: int, output: str) -> dict[str, str]:
    assert code == 130, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-5000:]
    return _stop_message(output)


def _command(cwd: Path, entry: str, *args: str) -> str:
    return f"cd {shlex.quote(str(cwd))} && {shlex.join(['python', '-m', f'kevin_exp.{entry}', *args])}"


def _run_printed(command: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """The printed ``cd <folder> && python -m ...``, run as written (with this interpreter for ``python``)."""
    cd, _, rest = command.partition(" && ")
    assert cd.startswith("cd ") and rest.startswith("python -m kevin_exp."), command
    argv = shlex.split(rest)
    return subprocess.run([sys.executable, *argv[1:]], cwd=shlex.split(cd)[1], capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> Path:
    """A compile cache of these tests alone: empty at first, so the first turn's builds are long (lean headers)."""
    return tmp_path_factory.mktemp("compile-cache")


def _start_evaluating(tmp_path: Path, cache: Path) -> Launch:
    """A run of the cpu evaluator, returned while a build of its first turn is under way (a compiler is live)."""
    run = Launch(["-m", "kevin_exp.train", *CPU, f"hydra.run.dir={tmp_path / 'run'}"], REPO,
                 env={**os.environ, "KEVIN_EXP_CACHE": str(cache)})
    run.wait_for(r"step 1/2 turn 1 group 1")
    deadline = time.monotonic() + 60
    while not list(cache.glob("ext/*/.tmp-*")) and not list(cache.glob("*/.tmp-*")):
        assert time.monotonic() < deadline, "no build started after the first turn"
        time.sleep(0.05)
    return run


def test_ctrl_c_while_kernels_compile_stops_cleans_up_and_says_how_to_resume(tmp_path, compile_cache, adopted):
    run = _start_evaluating(tmp_path, compile_cache)
    run.ctrl_c()
    code, output = run.stopped()
    said = _assert_clean_stop(code, output)
    assert said["run folder"] == str(tmp_path / "run")
    assert said["records"].startswith("turns.jsonl (0 rows)")
    assert said["last checkpoint"] == "none written yet; resuming starts at step 1"
    assert said["resume"] == _command(REPO, "train", *CPU, f"hydra.run.dir={tmp_path / 'run'}")
    assert not _left_behind(run.proc.pid, adopted), "processes of the run are still alive"
    assert not list(compile_cache.rglob(".tmp-*")), "temporary build folders are left in the compile cache"


def test_a_second_ctrl_c_does_not_cut_the_cleanup_short(tmp_path, compile_cache, adopted):
    run = _start_evaluating(tmp_path, compile_cache)
    run.ctrl_c()
    time.sleep(0.05)
    run.ctrl_c()
    code, output = run.stopped()
    said = _assert_clean_stop(code, output)
    assert "still stopping" in output and said["run folder"] == str(tmp_path / "run")
    assert not _left_behind(run.proc.pid, adopted), "processes of the run are still alive"
    assert not list(compile_cache.rglob(".tmp-*")), "temporary build folders are left in the compile cache"


def test_the_printed_command_resumes_a_run_stopped_by_ctrl_c_from_its_last_checkpoint(tmp_path, adopted):
    run_dir = tmp_path / "run"
    run = Launch(["-m", "kevin_exp.train", *SYNTHETIC, "steps=3", f"hydra.run.dir={run_dir}"], REPO)
    run.wait_for(r"step 2/3 turn 1 group 1")  # step 1 checkpointed, step 2 generating its second turn
    run.ctrl_c()
    code, output = run.stopped()
    said = _assert_clean_stop(code, output)
    assert said["run folder"] == str(run_dir)
    assert said["last checkpoint"] == f"{run_dir}/checkpoints/step_000001 (step 1 of 3); resuming starts at step 2"
    assert not _left_behind(run.proc.pid, adopted)

    resumed = _run_printed(said["resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert len(read_jsonl(run_dir / "turns.jsonl")) == 3 * 1 * 2 * 2


def test_a_run_of_two_ranks_stopped_by_ctrl_c_exits_130_and_its_printed_command_resumes_both(tmp_path, adopted):
    """The ranks run in sessions of their own (torch's elastic agent starts them so): the launcher's agent gets
    the Ctrl-C, passes it on and waits for them; the launcher alone speaks."""
    run_dir = tmp_path / "run"
    ranks = ["resources=cpu", "resources.ranks_per_node=2", "tasks_per_step=2", "trainer=deepspeed",
             "trainer.bf16=false", "trainer.offload_optimizer=none", "trainer.activation_checkpointing=false"]
    run = Launch(["-m", "kevin_exp.train", *SYNTHETIC, *ranks, "steps=3", f"hydra.run.dir={run_dir}"], REPO)
    run.wait_for(r"step 2/3 turn 1 group 1")
    run.ctrl_c()
    code, output = run.stopped()
    said = _assert_clean_stop(code, output)
    assert output.count("interrupted (Ctrl-C)") == 1
    assert said["run folder"] == str(run_dir)
    assert said["last checkpoint"] == f"{run_dir}/checkpoints/step_000001 (step 1 of 3); resuming starts at step 2"
    assert not _left_behind(run.proc.pid, adopted), "a rank is still alive"

    resumed = _run_printed(said["resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert len(read_jsonl(run_dir / "turns.jsonl")) == 3 * 2 * 2 * 2


def test_an_unnamed_sweep_stopped_by_ctrl_c_continues_in_its_own_folder(tmp_path, adopted):
    sweep = ["-m", "gamma=0.0,1.0", *SYNTHETIC, "steps=1"]
    run = Launch(["-m", "kevin_exp.train", *sweep], tmp_path)
    run.wait_for(r"step 1/1 turn 1 group 1", after=r"^job #1")  # job #0 is done
    run.ctrl_c()
    code, output = run.stopped()
    said = _assert_clean_stop(code, output)
    [sweep_dir] = (tmp_path / "outputs" / "sweeps").iterdir()
    assert said["sweep folder"].startswith(f"{sweep_dir} ") and "job #1" in said["sweep folder"]
    assert said["run folder of that job"].startswith(f"{sweep_dir}/gamma-1.0+")
    assert said["continue the sweep"] == _command(tmp_path, "train", *sweep, f"hydra.sweep.dir={sweep_dir}")
    assert not _left_behind(run.proc.pid, adopted)
    [done] = sweep_dir.glob("gamma-0.0*")
    kept = (done / "turns.jsonl").read_text()

    continued = _run_printed(said["continue the sweep"])
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert list((tmp_path / "outputs" / "sweeps").iterdir()) == [sweep_dir], "the sweep went on in its own folder"
    assert (done / "turns.jsonl").read_text() == kept, "a finished run is kept, not run again"
    [stopped] = sweep_dir.glob("gamma-1.0*")
    assert [m["step"] for m in read_jsonl(stopped / "metrics.jsonl")] == [1]


def test_an_evaluation_stopped_by_ctrl_c_keeps_its_finished_batches_and_the_printed_command_finishes_it(tmp_path,
                                                                                                      adopted):
    out = tmp_path / "eval"
    ids = "tasks.ids=[builtin/level1/1,builtin/level1/2,builtin/level1/3,builtin/level2/1,builtin/level2/2]"
    args = [*SYNTHETIC[:4], ids, "eval.n_trajectories=2", "eval.n_turns=2", "eval.tasks_per_batch=2",
            f"hydra.run.dir={out}"]
    run = Launch(["-m", "kevin_exp.evaluate", *args], REPO)
    run.wait_for(r"batch 2/3 turn 1 group 1")  # the first batch is written, the second generating its second turn
    run.ctrl_c()
    code, output = run.stopped()
    said = _assert_clean_stop(code, output)
    assert "the evaluation stopped" in output and said["run folder"] == str(out)
    assert said["records"].startswith("turns.jsonl (8 rows")
    assert said["resume"] == _command(REPO, "evaluate", *args)
    assert not _left_behind(run.proc.pid, adopted)

    finished = _run_printed(said["resume"])
    assert finished.returncode == 0, finished.stderr[-3000:]
    rows = read_jsonl(out / "turns.jsonl")
    assert len(rows) == 5 * 2 * 2 and len({(r["task_id"], r["trajectory"], r["turn"]) for r in rows}) == 20
