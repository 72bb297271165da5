"""The progress lines (records/progress.py): every step line says the step's time, the mean per step measured in this
process and the time to the end of the run from it; lines within a turn come at a bounded rate and only when
something changed; an evaluation counts batches; ``none`` prints nothing; the sweep's line (the SLURM launcher's).
A rollout's counts (rollout/loop.py) reach the display from a real tiny model and environment."""
from __future__ import annotations

import re

import pytest

from kevin_exp.config import ModelConfig
from kevin_exp.models import chat_prompt_ids, load_policy
from kevin_exp.records.progress import Progress, counts_text, duration, sweep_line, sweep_time_left
from kevin_exp.rollout.env import SyntheticEnv
from kevin_exp.rollout.generation import HFGenerator
from kevin_exp.rollout.loop import RolloutCounts, RolloutSettings, run_rollout
from kevin_exp.tasks.loader import load_builtin


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _metrics(step: int) -> dict:
    return {"step": step, "reward_mean": 0.5, "reward_max": 1.0, "correct_ratio": 0.25, "loss": 0.01,
            "grad_norm": 1.5, "generate_s": 30.0, "evaluate_s": 20.0, "train_s": 10.0}


def _lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if line]


def test_each_step_line_has_its_time_the_mean_and_the_time_left_from_measured_steps(capsys):
    clock = Clock()
    progress = Progress("lines", 10, 0, 2, clock=clock)
    for step, seconds in ((1, 60.0), (2, 120.0), (3, 90.0)):
        clock.now += seconds
        progress.step(_metrics(step))
    lines = _lines(capsys)
    assert len(lines) == 3
    assert lines[0].endswith("30/20/10 s gen/eval/train; 1m00s (mean 1m00s/step), ~9m00s left")  # 9 x 60 s
    assert lines[1].endswith("; 2m00s (mean 1m30s/step), ~12m00s left")  # 8 x 90 s
    assert lines[2].endswith("; 1m30s (mean 1m30s/step), ~10m30s left")  # 7 x 90 s
    assert lines[2].startswith("[    270s] step 3/10: reward 0.500")


def test_a_resumed_run_measures_from_its_restart_and_its_last_step_says_no_time_left(capsys):
    clock = Clock()
    progress = Progress("lines", 10, 7, 2, clock=clock)  # 7 steps done before this process started
    clock.now += 40.0
    progress.step(_metrics(8))
    clock.now += 20.0
    progress.step(_metrics(9))
    clock.now += 30.0
    progress.step(_metrics(10))
    lines = _lines(capsys)
    assert lines[0].endswith("; 40s (mean 40s/step), ~1m20s left")  # 2 steps at the mean of this process's one
    assert lines[1].endswith("; 20s (mean 30s/step), ~30s left")
    assert lines[2].endswith("; 30s (mean 30s/step)") and "left" not in lines[2]


def _counts(n_turns: int = 2, per_turn: int = 4) -> RolloutCounts:
    return RolloutCounts(n_turns, per_turn, max_new_tokens=512)


def test_lines_within_a_turn_come_at_most_every_every_s_and_only_when_something_changed(capsys):
    clock = Clock()
    progress = Progress("lines", 3, 0, 2, every_s=30.0, clock=clock)
    counts = _counts()
    counts.listener = lambda c: progress.within(2, c)
    counts.start_call([0, 0, 0, 0])  # the first change is shown at once
    for tokens in range(1, 200):  # a token a tenth of a second for 20 s: nothing more shown
        clock.now = 1000.0 + tokens / 10
        counts.in_call(0, tokens)
    assert _lines(capsys) == ["[      0s] step 2/3 turn 1/2: 0/4 generated, 0/4 evaluated; generating 4"]
    clock.now = 1030.0
    counts.in_call(0, 210)
    assert _lines(capsys) == ["[     30s] step 2/3 turn 1/2: 0/4 generated, 0/4 evaluated; generating 4 (token 210/512)"]
    clock.now += 60.0
    progress.within(2, counts)  # nothing changed since: nothing shown, however long after
    assert _lines(capsys) == []
    counts.end_call([0, 0, 0, 0])
    counts.verdicts(0)  # right after the line before: not shown
    assert _lines(capsys) == ["[     90s] step 2/3 turn 1/2: 4/4 generated, 0/4 evaluated"]
    # a turn's own line counts as a line: the next line within the turn waits every_s after it
    clock.now += 40.0
    progress.turn(2, 1, 0, 12.3)
    clock.now += 10.0
    counts.start_call([1, 1, 1])
    counts.verdicts(0, 3)
    clock.now += 25.0
    counts.in_call(1, 7)
    assert _lines(capsys) == ["[    130s] step 2/3 turn 2 group 1: generated in 12.3 s",
                              "[    165s] step 2/3 turn 2/2: 0/4 generated, 0/4 evaluated; generating 3 (1 done, token 7/512)"]


def test_counts_text_names_every_started_turn_still_waiting_for_verdicts():
    counts = _counts(n_turns=3, per_turn=4)
    assert counts_text(counts) == "waiting"
    counts.start_call([0, 0, 0, 0])
    counts.end_call([0, 0, 0, 0])
    counts.verdicts(0, 3)
    counts.start_call([1, 1])  # the pipeline: two trajectories' second turns while two verdicts of the first are out
    counts.in_call(1, 33)
    assert counts_text(counts) == ("turn 1/3: 4/4 generated, 3/4 evaluated; turn 2/3: 0/4 generated, 0/4 evaluated; "
                                   "generating 2 (1 done, token 33/512)")
    counts.end_call([1, 1])
    counts.verdicts(0)
    assert counts_text(counts) == "turn 2/3: 2/4 generated, 0/4 evaluated"


def test_an_evaluation_counts_batches(capsys):
    clock = Clock()
    progress = Progress("lines", 3, 0, 2, unit="batch", clock=clock)
    progress.turn(1, 0, 0, 4.0)
    counts = _counts()
    counts.start_call([0] * 4)
    clock.now += 30.0
    progress.within(1, counts)
    clock.now += 20.0
    progress.done(1)
    lines = _lines(capsys)
    assert [re.sub(r"^\[ *\d+s\] ", "", line) for line in lines] == [
        "batch 1/3 turn 1 group 1: generated in 4.0 s",
        "batch 1/3 turn 1/2: 0/4 generated, 0/4 evaluated; generating 4",
        "batch 1/3 done; 50s (mean 50s/batch), ~1m40s left"]
    assert not any("step" in line for line in lines)


def test_progress_none_prints_nothing(capsys):
    progress = Progress("none", 2, 0, 2, clock=Clock())
    counts = _counts()
    counts.listener = lambda c: progress.within(1, c)
    counts.start_call([0, 0])
    progress.turn(1, 0, 0, 1.0)
    progress.step(_metrics(1))
    progress.done(2)
    progress.close()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("seconds, text", [(0.04, "0.0s"), (4.25, "4.2s"), (42.4, "42s"), (343, "5m43s"),
                                           (7500, "2h05m"), (97200, "1d03h")])
def test_durations(seconds, text):
    assert duration(seconds) == text


def test_the_sweeps_time_left_fills_the_slots_seen_running_at_the_mean_of_the_jobs_that_ended():
    assert sweep_time_left([], [10.0], 3, 2) is None  # no job ended: no estimate
    # mean 100 s; two slots: the running jobs end in 40 and 90 s; the 3 pending then start at 40, 90 and 140 s
    assert sweep_time_left([80.0, 120.0], [60.0, 10.0], 3, 2) == pytest.approx(240.0)
    # a job running past the mean is taken to end now
    assert sweep_time_left([100.0], [150.0], 0, 1) == 0.0
    # more slots than were ever seen running at once are not assumed
    assert sweep_time_left([100.0], [], 4, 1) == pytest.approx(400.0)


def test_the_sweeps_line():
    assert sweep_line(6, 0, 0, 2, 4, [], [30.0, 30.0], 2, 31.0) == "sweep (31s in): 0/6 jobs done, 2 running, 4 pending"
    assert sweep_line(6, 3, 1, 2, 1, [600.0, 1200.0], [300.0, 60.0], 2, 1900.0) == (
        "sweep (31m40s in): 3/6 jobs done (1 failed), 2 running, 1 pending; 15m00s/job (mean of 2), ~25m00s left")  # 600 s + 900 s
    assert sweep_line(2, 2, 0, 0, 0, [60.0, 60.0], [], 2, 130.0) == (
        "sweep (2m10s in): 2/2 jobs done; 1m00s/job (mean of 2)")


@pytest.fixture(scope="module")
def tiny():
    return load_policy(ModelConfig(source="tiny", name="tiny"))


@pytest.mark.parametrize("schedule", ["pipeline", "barrier"])
def test_a_rollout_reports_its_counts_to_the_end_of_every_turn(tiny, schedule):
    tasks = load_builtin()[:2]
    seen: list[tuple] = []
    settings = RolloutSettings(3, 2, max_new_tokens=5, max_prompt_tokens=512, temperature=0.9, top_p=1.0,
                               schedule=schedule)
    run_rollout(tasks, HFGenerator(tiny, batch_size=4), SyntheticEnv(target_below=100),
                lambda text: chat_prompt_ids(tiny.tokenizer, text), lambda text: len(tiny.tokenizer.encode(text)),
                settings, seed=3, on_progress=lambda c: seen.append(c.snapshot()))
    generated, evaluated, calling, call_done, call_tokens = seen[-1]
    assert generated == evaluated == (6, 6) and calling == 0
    # the generator said how far each call was: tokens drawn, and the batches of a call (at most 4 rows) finished
    assert 1 in {s[4] for s in seen} and max(s[4] for s in seen) <= 5
    assert any(s[2] == 6 and s[3] == 4 for s in seen)
