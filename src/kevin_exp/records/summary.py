"""The one-screen summary a run ends with: what each step did, the headline numbers, where the records are,
and the commands to run next."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from kevin_exp.config import TrainConfig
from kevin_exp.launch.world import context_from_env
from kevin_exp.records.run_records import read_jsonl

# models that write no compiling kernel at all: their reward stays 0 and there is nothing to learn from
SMOKE_MODELS = ("tiny", "smollm2_135m")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_lines(run_dir: Path) -> list[str]:
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    turns = read_jsonl(run_dir / "turns.jsonl")
    lines = [f"records: {run_dir}", f"  turns.jsonl   {len(turns)} rows", f"  metrics.jsonl {len(metrics)} rows"]
    if not metrics:
        return lines + ["no step has finished yet"]
    n_turns = len(metrics[-1].get("correct_per_turn", []))
    head = f"{'step':>4} {'reward':>7} {'max':>6} {'correct':>7} " + " ".join(f"{'t' + str(k + 1):>5}" for k in range(n_turns))
    head += f" {'speedup':>7} {'loss':>9} {'gnorm':>7} {'gen s':>6} {'eval s':>6} {'train s':>7}"
    lines += ["", head]
    shown = metrics if len(metrics) <= 12 else metrics[:3] + [None] + metrics[-8:]
    for m in shown:
        if m is None:
            lines.append(f"{'...':>4}")
            continue
        per_turn = " ".join(f"{c:5.0%}" for c in m.get("correct_per_turn", []))
        lines.append(
            f"{m['step']:>4} {m['reward_mean']:7.3f} {m['reward_max']:6.2f} {m['correct_ratio']:7.0%} {per_turn} "
            f"{_fmt(m.get('speedup_mean'), '7.2f'):>7} {m['loss']:9.3g} {m['grad_norm']:7.3g} "
            f"{m['generate_s']:6.1f} {m['evaluate_s']:6.1f} {m['train_s']:7.1f}"
        )
    statuses = Counter(r["status"] for r in turns)
    lines += ["", "verdicts: " + ", ".join(f"{k} {v}" for k, v in statuses.most_common())]
    last = metrics[-1]
    lines.append(
        f"last step: response {last['response_tokens_mean']:.0f} tokens on average, truncated {last['truncation_ratio']:.0%}"
        + (f", not-okay {last['not_okay_ratio']:.0%}" if last.get("not_okay_ratio") is not None else "")
    )
    return lines


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _spread(values: list[float]) -> float:
    """Sample variance of ``values``."""
    mean = _mean(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def improvement_line(metrics: list[dict]) -> str:
    """Whether the policy improved, in one line: the first step against the mean of the last three (fewer when the
    run is shorter), by mean reward and share of correct kernels. From 4 steps on, a rise counts only when it is over
    twice its standard error, taken from how much the step means of the first and last steps (up to three each)
    vary: a short run's step-to-step noise is as large as a small rise (an ``lr=0`` control's step means moved
    between 0.04 and 0.18)."""
    if len(metrics) < 2:
        return "improvement: one step only, nothing to compare"
    first, last = metrics[0], metrics[-min(3, len(metrics) - 1):]
    reward = _mean([m["reward_mean"] for m in last])
    correct = _mean([m["correct_ratio"] for m in last])
    improved = reward > first["reward_mean"] and correct >= first["correct_ratio"]
    steps = f"step {last[0]['step']}" if len(last) == 1 else f"steps {last[0]['step']}-{last[-1]['step']}"
    noise = ""
    k = min(3, len(metrics) // 2)
    if k >= 2:
        early = [m["reward_mean"] for m in metrics[:k]]
        late = [m["reward_mean"] for m in metrics[-k:]]
        rise, error = _mean(late) - _mean(early), ((_spread(early) + _spread(late)) / k) ** 0.5
        improved = improved and rise > 2 * error
        noise = f"; steps 1-{k} -> last {k}: {rise:+.3f}, standard error {error:.3f}"
    else:
        noise = "; too few steps to tell a rise from noise"
    return (f"{'improved' if improved else 'did not improve'}: mean reward {first['reward_mean']:.3f} (step "
            f"{first['step']}) -> {reward:.3f} ({steps}), correct {first['correct_ratio']:.0%} -> {correct:.0%}{noise}")


def infra_line(turns: list[dict]) -> str | None:
    """One line when most verdicts are ``infra_error``: the evaluator could not build the kernels for reasons of
    its machine (its toolchain, torch's install, a path), so the run's reward says nothing about the model."""
    infra = [r for r in turns if r.get("status") == "infra_error"]
    if 2 * len(infra) <= len(turns):
        return None
    reason = Counter(r.get("reason") or "none recorded" for r in infra).most_common(1)[0][0]
    backend = turns[-1].get("backend") or "cpu"
    return (f"note: {len(infra)} of {len(turns)} kernels ({len(infra) / len(turns):.0%}) ended as infra_error, the "
            f"machine's failure and not the model's: most likely the toolchain or build environment (compiler, torch "
            f"install, paths); most common reason: {reason[:200]}; check it: python -m kevin_exp.bench --builtin "
            f"--backend {backend}")


def headline_lines(run_dir: Path, cfg: TrainConfig) -> list[str]:
    """The run in three numbers, where its records are, and what to do next."""
    turns = read_jsonl(run_dir / "turns.jsonl")
    if not turns:
        return []
    n = len(turns)
    reward = sum(r["score"] for r in turns) / n
    lines = ["", improvement_line(read_jsonl(run_dir / "metrics.jsonl")),
             f"over {n} kernels: mean reward {reward:.3f}, correct {sum(bool(r['correct']) for r in turns) / n:.0%}, "
             f"format errors {sum(r['status'] == 'format_error' for r in turns) / n:.0%}",
             f"records: {run_dir}/turns.jsonl, metrics.jsonl; transcripts: python -m kevin_exp.show {run_dir}",
             f"plots: python analysis/plots.py {run_dir} --out {run_dir}/plots; "
             f"tables: python analysis/ablation_table.py {run_dir}",
             f"evaluate it: python -m kevin_exp.evaluate checkpoint={run_dir}"]
    infra = infra_line(turns)
    if infra is not None:  # the reward is then the machine's doing: the note below would blame the model
        return lines + ["", infra]
    # (only when the numbers above say so: a scripted or lucky run of such a model can score)
    if reward == 0 and cfg.model.name in SMOKE_MODELS and cfg.rollout.env == "kernel" and cfg.tasks.suite != "kernel_menu":
        lines += ["", f"note: model={cfg.model.name} is a smoke-scale policy that writes no valid kernels, so its reward "
                  "stays at 0 and the update has nothing to learn from. To see the whole loop learn on a CPU (this model "
                  "choosing among real kernels, about 16 minutes on 2 cores): python -m kevin_exp.train "
                  "experiment=learn_cpu; for kernels it writes itself, a 7B+ model on a GPU (experiment=kevin_7b)."]
    return lines


def print_summary(run_dir: Path, cfg: TrainConfig) -> float:
    """Prints the summary (rank 0 of a run of several ranks); returns the last step's mean reward (the value a
    Hydra sweeper would optimise)."""
    if context_from_env().is_main:
        print("\n".join(summary_lines(run_dir) + headline_lines(run_dir, cfg)), flush=True)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    return float(metrics[-1]["reward_mean"]) if metrics else 0.0
