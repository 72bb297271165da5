"""The run's closing summary says in one line whether the policy improved: the first step against the last three."""
from __future__ import annotations

import json

from kevin_exp.records.summary import headline_lines, improvement_line
from tests.helpers import compose_train


def steps(rewards: list[float], correct: list[float]) -> list[dict]:
    return [{"step": i + 1, "reward_mean": r, "correct_ratio": c} for i, (r, c) in enumerate(zip(rewards, correct))]


def test_a_run_whose_last_steps_beat_its_first_improved():
    line = improvement_line(steps([0.1, 0.2, 0.5, 0.6, 0.7], [0.1, 0.2, 0.4, 0.5, 0.5]))
    assert line.startswith("improved:"), line
    assert "0.100 (step 1) -> 0.600 (steps 3-5)" in line and "10% -> 47%" in line, line


def test_a_run_whose_reward_fell_or_whose_correct_share_fell_did_not_improve():
    assert improvement_line(steps([0.5, 0.4, 0.3, 0.2], [0.5, 0.5, 0.5, 0.5])).startswith("did not improve:")
    # a higher reward with fewer correct kernels is not an improvement of the policy's kernels
    assert improvement_line(steps([0.5, 0.9, 0.9, 0.9], [0.6, 0.5, 0.5, 0.5])).startswith("did not improve:")


def test_a_rise_within_the_step_to_step_noise_is_not_an_improvement():
    """The lr=0 control of experiment=learn_cpu (docs/learning-runs): its weights never moved, its step means did."""
    control = [0.072, 0.184, 0.083, 0.092, 0.041, 0.093, 0.103, 0.119]
    line = improvement_line(steps(control, [0.22, 0.3, 0.2, 0.25, 0.2, 0.25, 0.26, 0.27]))
    assert line.startswith("did not improve:") and "0.072 (step 1) -> 0.105 (steps 6-8)" in line, line
    assert "steps 1-3 -> last 3: -0.008" in line, line
    learned = [0.072, 0.237, 0.175, 0.185, 0.289, 0.530, 0.277, 0.702]  # seed 0 of the same experiment
    assert improvement_line(steps(learned, [0.22, 0.7, 0.5, 0.6, 0.7, 0.9, 0.8, 0.95])).startswith("improved:")


def test_a_short_run_compares_what_it_has():
    assert "nothing to compare" in improvement_line(steps([0.5], [0.5]))
    line = improvement_line(steps([0.1, 0.3], [0.0, 0.5]))
    assert "(step 2)" in line and "too few steps to tell a rise from noise" in line, line


def test_the_note_that_the_reward_stays_at_0_is_printed_only_when_it_did(tmp_path):
    """A smoke-scale model's note says its reward stays at 0: never under numbers that say otherwise."""
    cfg = compose_train(["model=tiny"])
    for score, noted in ((0.0, True), (0.6, False)):
        run_dir = tmp_path / str(score)
        run_dir.mkdir()
        row = {"score": score, "correct": score > 0, "status": "ok" if score else "format_error"}
        (run_dir / "turns.jsonl").write_text(json.dumps(row) + "\n")
        text = "\n".join(headline_lines(run_dir, cfg))
        assert f"mean reward {score:.3f}" in text
        assert ("its reward stays at 0" in text) is noted, text
