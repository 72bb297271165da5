"""The reward's optional speedup cap, the suspect share in the step metrics, and the evaluator settings'
checks (new timing-protocol settings)."""
from __future__ import annotations

import dataclasses
import re

import pytest

from kevin_exp.bench.config import BenchConfig
from kevin_exp.config import ConfigError, EvaluatorConfig
from kevin_exp.config.evaluator import SET_BY_THE_RUN, EvaluatorRunSide
from kevin_exp.records.rows import metrics_row, turn_row
from kevin_exp.rl.reward import counted_speedup, turn_score
from kevin_exp.rollout.env import TurnResult
from kevin_exp.rollout.loop import RolloutTimes, TurnSample
from kevin_exp.rollout.prompts import Attempt
from kevin_exp.run.setup import score_weights
from kevin_exp.tasks import load_builtin
from tests.helpers import compose_train


def test_the_speedup_term_is_capped_only_when_asked():
    assert turn_score(True, 40.0) == pytest.approx(40.3)
    assert turn_score(True, 40.0, max_speedup=0) == pytest.approx(40.3)
    assert turn_score(True, 40.0, max_speedup=None) == pytest.approx(40.3)
    assert turn_score(True, 40.0, max_speedup=10.0) == pytest.approx(10.3)
    assert turn_score(True, 2.0, max_speedup=10.0) == pytest.approx(2.3)
    assert turn_score(False, 40.0, max_speedup=10.0) == 0.0


def _sample(status: str, correct: bool, speedup: float | None) -> TurnSample:
    task = load_builtin()[0]
    result = TurnResult(status=status, correct=correct, score=turn_score(correct, speedup),
                        attempt=Attempt("code", "", status, ""), speedup=speedup, suspect=status == "suspect")
    return TurnSample(task, 0, 0, prompt_ids=[1], response_ids=[1, 2], text="Okay", truncated=False,
                      dropped_attempts=0, result=result)


def test_metrics_rows_carry_the_suspect_share_and_turn_rows_the_flag():
    samples = [_sample("ok", True, 2.0), _sample("suspect", False, 60.0), _sample("incorrect", False, None),
               _sample("ok", True, 1.0)]
    stats = {k: 0.0 for k in ("loss", "grad_norm", "kl", "entropy", "clip_fraction", "lr", "gradient_steps",
                              "logprob_diff_mean", "logprob_diff_max")}
    row = metrics_row("run", 1, samples, stats, RolloutTimes(), 0.0, 0.0, {}, "Okay")
    assert row["suspect_ratio"] == 0.25
    assert row["speedup_mean"] == 1.5  # the suspect speedup counts for nothing
    turn = turn_row("run", "train", 1, samples[1], {}, "Okay", "cpu")
    assert turn["suspect"] is True and turn["speedup"] is None and turn["score"] == 0.0


def test_the_not_okay_ratio_is_measured_only_for_a_model_with_a_usual_opening():
    """Kevin's proxy counts responses that do not open as QwQ's do ("Okay"); a model with no such opening (the menu's
    few-token answers, SmolLM2) would read 100% on every step, so its rows carry nothing and the summary says nothing."""
    from tests.helpers import compose_train

    samples = [_sample("ok", True, 2.0), _sample("ok", True, 1.0)]
    samples[1] = dataclasses.replace(samples[1], text="B")
    stats = {k: 0.0 for k in ("loss", "grad_norm", "kl", "entropy", "clip_fraction", "lr", "gradient_steps",
                              "logprob_diff_mean", "logprob_diff_max")}
    assert metrics_row("run", 1, samples, stats, RolloutTimes(), 0.0, 0.0, {}, "Okay")["not_okay_ratio"] == 0.5
    assert [turn_row("run", "train", 1, s, {}, "Okay", "cpu")["not_okay"] for s in samples] == [False, True]
    assert metrics_row("run", 1, samples, stats, RolloutTimes(), 0.0, 0.0, {}, None)["not_okay_ratio"] is None
    assert turn_row("run", "train", 1, samples[1], {}, None, "cpu")["not_okay"] is None
    assert compose_train([]).model.usual_opening is None
    assert compose_train(["model=7b", "model.source=random"]).model.usual_opening == "Okay"


@pytest.mark.parametrize("fields, words", [
    (dict(hang_floor_s=30.0, hang_ceiling_s=10.0), "hang_floor_s"),
    (dict(recheck_tolerance=0.5), "recheck_tolerance"),
    (dict(chunk_bytes=0), "chunk_bytes"),
    (dict(load_timeout_s=0.0), "load_timeout_s"),
])
def test_bench_config_refuses_bad_protocol_settings(fields, words):
    with pytest.raises(ValueError, match=words):
        BenchConfig(**fields)


def test_the_hydra_evaluator_settings_reach_the_bench_config():
    cfg = EvaluatorConfig(backend="cpu", recheck_speedup=3.0, recheck_tolerance=2.0, hang_floor_s=5.0,
                          hang_factor=4.0, hang_ceiling_s=50.0, load_timeout_s=20.0, chunk_bytes=1 << 20,
                          forbid_new_tasks=False)
    bench = cfg.to_bench()
    assert (bench.recheck_speedup, bench.recheck_tolerance) == (3.0, 2.0)
    assert (bench.hang_floor_s, bench.hang_factor, bench.hang_ceiling_s, bench.load_timeout_s) == (5.0, 4.0, 50.0, 20.0)
    assert bench.chunk_bytes == 1 << 20 and bench.forbid_new_tasks is False
    assert EvaluatorConfig(hang_floor_s=30.0, hang_ceiling_s=10.0).extra_checks("evaluator.")


def test_the_reward_reads_its_weights_and_its_cap_from_one_place_and_the_bench_never_sees_them():
    cfg = compose_train(["algorithm.max_speedup=3", "algorithm.correctness_weight=0.5"])
    w = score_weights(cfg)
    assert (w.correctness, w.speedup, w.max_speedup) == (0.5, 1.0, 3.0)
    assert turn_score(True, 40.0, w.correctness, w.speedup, w.max_speedup) == pytest.approx(3.5)
    bench = cfg.evaluator.to_bench()
    assert not any(hasattr(bench, k) for k in ("max_speedup", "correctness_weight", "speedup_weight"))


def test_a_speedup_counts_only_for_a_correct_kernel():
    assert counted_speedup(True, 2.0) == 2.0 and counted_speedup(False, 2.0) is None
    assert counted_speedup(True, None) is None


def test_the_evaluator_group_is_the_bench_config_declared_once():
    """Every BenchConfig setting but those the run sets itself is an evaluator setting with the same default and
    limits; the run's own settings are EvaluatorRunSide's."""
    bench = {f.name: f for f in dataclasses.fields(BenchConfig)}
    run_side = {f.name for f in dataclasses.fields(EvaluatorRunSide)}
    for f in dataclasses.fields(EvaluatorConfig):
        if f.name in run_side:
            continue
        assert f.metadata == bench[f.name].metadata and f.default == bench[f.name].default, f.name
    assert {f.name for f in dataclasses.fields(EvaluatorConfig)} == (set(bench) - set(SET_BY_THE_RUN)) | run_side


@pytest.mark.parametrize("override, words", [
    ("evaluator.worker_start=spawn", "evaluator.worker_start='spawn': expected one of fork, exec"),
    ("evaluator.hang_floor_s=300", "evaluator.hang_floor_s=300.0 is above evaluator.hang_ceiling_s=120.0"),
    ("evaluator.max_source_bytes=0", "evaluator.max_source_bytes=0: expected >= 1"),
    ("evaluator.memory_limit_gb=0", "evaluator.memory_limit_gb=0.0: expected > 0"),
])
def test_a_bad_evaluator_setting_is_refused_at_composition_naming_it(override, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        compose_train([override])
