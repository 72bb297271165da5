"""Hidden checks' inputs, drawn as the reference process draws them (no runner, no compile): other distributions
keep integer inputs and the input's sign domain, hidden sizes change only what get_inputs alone reads, and a
variant the reference is undefined on is skipped with the reason."""
from __future__ import annotations

import pytest
import torch

from kevin_exp.bench import hidden_checks
from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.protocol import schedule
from kevin_exp.bench.reference_server import Problem
from kevin_exp.bench.worker.input_variants import Skipped, shape_names, size_choices, transform
from kevin_exp.bench.worker.reference import load_reference
from tests.conftest import fixture_text

CPU = torch.device("cpu")


def test_each_distribution_redraws_floating_inputs_only_and_stays_finite():
    x = torch.randn(64, 1000)
    idx = torch.randint(0, 10, (5,))
    flag = torch.ones(3, dtype=torch.bool)
    for name in hidden_checks.DISTRIBUTIONS:
        out = transform(name, [x, idx, flag, 3], seed=7)
        assert out[1] is idx and out[2] is flag and out[3] == 3
        assert out[0].shape == x.shape and out[0].dtype == x.dtype and bool(torch.isfinite(out[0]).all())
        assert torch.equal(out[0], transform(name, [x, idx, flag, 3], seed=7)[0])  # the seed decides the draw
    assert torch.allclose(transform("scale_small", [x], 1)[0], x * 1e-3)
    assert torch.allclose(transform("scale_large", [x], 1)[0], x * 1e3)
    heavy = transform("heavy_tail", [x], 1)[0]
    assert float(heavy.abs().max()) > 50 * float(x.abs().max())  # tails far beyond a normal's
    spikes = transform("spikes", [x], 1)[0]
    changed = int((spikes != x).sum())
    assert 1 <= changed <= x.numel() // 1000 and float(spikes.abs().max()) >= 99 * float(x.abs().max())


def test_non_negative_inputs_stay_non_negative():
    u = torch.rand(32, 512)
    for name in hidden_checks.DISTRIBUTIONS:
        assert bool((transform(name, [u], 3)[0] >= 0).all()), name


def test_hidden_sizes_are_those_only_get_inputs_reads():
    assert shape_names(load_reference(fixture_text("problem_relu.py"), "cpu")) == ["M", "N"]
    # IN and OUT build the model (get_init_inputs): only the batch may change
    assert shape_names(load_reference(fixture_text("problem_linear.py"), "cpu")) == ["B"]
    reads_global = fixture_text("problem_relu.py").replace("return torch.relu(x) + 0.5 * x", "return x[:, :N] * 2")
    assert shape_names(load_reference(reads_global, "cpu")) == ["M"]
    literal = fixture_text("problem_relu.py").replace("torch.randn(M, N)", "torch.randn(8, 16)")
    assert shape_names(load_reference(literal, "cpu")) == []


@pytest.mark.parametrize("v", [1, 2, 3, 8, 12, 16, 100, 256, 2048, 4096, 131072])
def test_hidden_size_choices_are_larger_and_keep_small_vector_widths(v):
    choices = size_choices(v)
    step = min(v & -v, 16)
    assert choices and all(c > v and c % step == 0 for c in choices)
    assert max(choices) <= max(v + step, v + v // 4)


def test_a_problem_offers_every_check_it_is_defined_on():
    problem = Problem(fixture_text("problem_relu.py"), "cpu", 42, CPU)
    for name in hidden_checks.DISTRIBUTIONS + (hidden_checks.HIDDEN_SHAPE,):
        assert problem.variants.probe(name, 44) is None, name
    assert set(problem.variants.sizes) == {"M", "N"}
    inputs, out, drawn = problem.variants.draw(hidden_checks.HIDDEN_SHAPE, 5)
    m, n = drawn["sizes"]["M"], drawn["sizes"]["N"]
    assert inputs[0].shape == (m, n) and out.shape == (m, n) and m > 512 and n > 2048  # the cpu sizes, made larger
    # the region is sized for the largest draw
    assert problem.variants.largest_bytes["input"] >= m * n * 4


def test_checks_the_reference_is_undefined_on_are_skipped_with_the_reason():
    source = fixture_text("problem_relu.py").replace("return torch.relu(x) + 0.5 * x", "return torch.sqrt(1.0 - x)") \
        .replace("torch.randn(M, N)", "torch.rand(M, N)")
    problem = Problem(source, "cpu", 42, CPU)
    why = {name: problem.variants.probe(name, 44) for name in hidden_checks.DISTRIBUTIONS}
    assert why["scale_small"] is None
    for name in ("scale_large", "heavy_tail", "spikes"):
        assert why[name] == "the reference's output is not finite on these inputs", name
    with pytest.raises(Skipped):
        problem.variants.draw("scale_large", 3)


def test_a_problem_without_floating_inputs_skips_the_distributions():
    source = fixture_text("problem_relu.py").replace("torch.randn(M, N)", "torch.randint(0, 9, (M, N))") \
        .replace("return torch.relu(x) + 0.5 * x", "return x * 2")
    problem = Problem(source, "cpu", 42, CPU)
    assert problem.variants.probe("heavy_tail", 44) == "the problem has no floating-point inputs"
    assert problem.variants.probe(hidden_checks.HIDDEN_SHAPE, 44) is None


def test_the_schedule_puts_hidden_checks_after_the_correctness_trials_and_each_can_be_switched_off():
    config = BenchConfig(correctness_trials=2, warmup_trials=1, timed_trials=3)
    kinds = schedule(config)
    hidden = [hidden_checks.kind(n) for n in hidden_checks.DISTRIBUTIONS + (hidden_checks.HIDDEN_SHAPE,)]
    assert kinds == ["check"] * 2 + hidden + ["warmup"] + ["timed"] * 3 + ["check"]
    assert all(hidden_checks.is_checked(k) for k in hidden)
    assert schedule(config, ["spikes"]) == ["check"] * 2 + ["hidden:spikes", "warmup"] + ["timed"] * 3 + ["check"]
    off = BenchConfig(correctness_trials=2, warmup_trials=1, timed_trials=3, check_distributions=False,
                      hidden_shape_check=False)
    assert schedule(off) == ["check"] * 2 + ["warmup"] + ["timed"] * 3 + ["check"]
    shape_only = BenchConfig(check_distributions=False)
    assert hidden_checks.enabled(shape_only) == [hidden_checks.HIDDEN_SHAPE]
    assert hidden_checks.variants(kinds, 10) == {str(12 + k): n for k, n in enumerate(hidden_checks.enabled(config))}


def test_a_run_that_raises_or_dies_during_a_hidden_check_is_fed_back_without_the_calls_inputs():
    from kevin_exp.bench.run_outcome import RunOutcome
    from kevin_exp.bench.verdict import Status, verdict_from_run
    from kevin_exp.bench.worker_process import Ended

    def judge(o):
        return verdict_from_run("p", o, BenchConfig(), isolation="t", compile_s=0.0, run_s=0.0, cache_hit=False)

    raised = judge(RunOutcome(status="runtime_error", reason="your forward raised: expected 256 rows, got 288",
                              hidden={"during": "hidden_shape"}))
    assert raised.status is Status.RUNTIME_ERROR and "288" not in raised.feedback and "hidden check" in raised.feedback
    assert "288" in raised.reason  # the record keeps it
    died = judge(RunOutcome(status="ended", ended=Ended("exited", "printed: torch.Size([288, 2336])"),
                            output_tail="torch.Size([288, 2336])", hidden={"during": "hidden_shape"}))
    assert died.status is Status.CRASHED and "2336" not in died.feedback
    hung = judge(RunOutcome(status="ended", ended=Ended("timeout", ""), hidden={"during": "spikes"}))
    assert hung.status is Status.TIMEOUT and "spikes" not in hung.feedback
    elsewhere = judge(RunOutcome(status="runtime_error", reason="your forward raised: boom", hidden={"during": None}))
    assert elsewhere.feedback == "your forward raised: boom"


def test_the_absolute_tolerance_grows_with_the_redrawn_outputs_magnitude():
    """A matmul on inputs x1e3 has outputs x1e6: fp32 summed in another order misses an absolute 1e-2 near zero,
    so the absolute tolerance of that call grows by the outputs' ratio (never shrinks)."""
    source = '''import torch
import torch.nn as nn

M, K, N = 64, 256, 64


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
'''
    problem = Problem(source, "cpu", 42, CPU)
    _, _, large = problem.variants.draw("scale_large", 3)
    _, _, small = problem.variants.draw("scale_small", 3)
    assert 0.5e6 < large["atol_scale"] < 2e6 and small["atol_scale"] == 1.0
