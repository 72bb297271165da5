"""What a report says about each run beyond its scores: how it was made (commands, ledger lines, commits,
versions, machines), where its time went, how often the evaluator distrusted or failed a verdict, and which
runs of the sweep are missing."""
from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from kevin_exp.analysis.loading import Run
from kevin_exp.analysis.tables import Table
from kevin_exp.analysis.variants import SEED_KEY, Variant, format_value
from kevin_exp.records.ledger import ledger_entries

TIME_PARTS = (("generate", "generate_s"), ("evaluate", "evaluate_s"), ("wait", "evaluate_wait_s"),
              ("train", "train_s"), ("checkpoint", "checkpoint_s"))


def read_meta(run: Run) -> dict[str, Any]:
    path = run.run_dir / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def sweep_ledger_lines(runs: Sequence[Run], ledger: Path) -> list[dict[str, Any]]:
    """The ledger lines of the sweeps whose folders hold ``runs`` (a sweep relaunched to continue has several)."""
    if not ledger.is_file():
        return []
    folders = {str(run.run_dir.parent.resolve()) for run in runs}
    return [e for e in ledger_entries(ledger) if e.get("sweep_dir") and str(Path(e["sweep_dir"]).resolve()) in folders]


def _distinct(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _command(argv: Sequence[str]) -> str:
    """A run's command as typed: ``python -m kevin_exp.train ...`` for the entry points' paths."""
    if not argv:
        return ""
    entry = Path(argv[0])
    head = [f"python -m kevin_exp.{entry.stem}"] if entry.parent.name == "kevin_exp" else [argv[0]]
    return shlex.join(head + list(argv[1:])).replace(f"'{head[0]}'", head[0])


def provenance_lines(runs: Sequence[Run], ledger_lines: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown bullets: the commands and ledger lines that made the runs, commits, versions and machines."""
    metas = [read_meta(run) for run in runs]
    lines = []
    for entry in ledger_lines:
        lines.append(f"- sweep launched {entry.get('time', '?')}: `{entry.get('command', '?')}`")
        lines.append(f"  - ledger line: `{json.dumps(entry, sort_keys=True)}`")
    if not ledger_lines:
        commands = _distinct([_command(start.get("argv") or []) for m in metas for start in m.get("starts", [])[:1]])
        lines += [f"- run command (no ledger line names these runs' folder): `{c}`" for c in commands]
    commits = _distinct([f"{m['git'].get('commit', '?')[:12]}{' (uncommitted changes)' if m['git'].get('dirty') else ''}"
                         for m in metas if m.get("git")])
    lines.append(f"- commit: {', '.join(commits) or 'not recorded'}")
    versions = _distinct([", ".join(f"{k} {v}" for k, v in sorted(m.get("versions", {}).items())) for m in metas])
    lines += [f"- versions: {v}" for v in versions] or ["- versions: not recorded"]
    machines = _distinct([f"{m.get('host', '?')}: {m.get('cpus', '?')} CPUs, "
                          f"{'GPUs ' + ', '.join(m['gpus']) if m.get('gpus') else 'no GPU'}, "
                          f"{m.get('platform', '?')}, Python {m.get('python', '?')}" for m in metas if m])
    lines += [f"- machine: {machine}" for machine in machines] or ["- machine: not recorded"]
    return lines


def settings_lines(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
    """The keys the runs vary, then every setting they share (folded, it is long)."""
    shared = {k: runs[0].config[k] for k in runs[0].config
              if all(k in run.config and run.config[k] == runs[0].config[k] for run in runs)}
    lines = [f"Vary: {', '.join(f'`{k}`' for k in keys) or 'nothing'} (runs are pooled over `seed`)." if keys
             else "Vary: nothing (one run, or runs of identical settings).", "",
             f"<details><summary>The {len(shared)} settings every run shares</summary>", "", "```"]
    lines += [f"{k}: {format_value(v)}" for k, v in shared.items()]
    return lines + ["```", "", "</details>"]


def _sum(metrics: pd.DataFrame, column: str) -> float | None:
    if column not in metrics:
        return None
    values = pd.to_numeric(metrics[column], errors="coerce").dropna()
    return float(values.sum()) if not values.empty else None


def _gpus(metrics: pd.DataFrame) -> int:
    """GPUs the run's ranks trained on: its world size where any rank held GPU memory."""
    if "gpu_mem_peak_gb" not in metrics or not (pd.to_numeric(metrics["gpu_mem_peak_gb"], errors="coerce") > 0).any():
        return 0
    return int(pd.to_numeric(metrics.get("world_size", pd.Series([1])), errors="coerce").max())


def run_time_table(runs: Sequence[Run], labels: Sequence[str]) -> Table:
    """Per run: steps done of those planned, the steps' wall time, GPU-hours and where the time went."""
    table = Table(title="Runs: steps, time and its split (sums over the finished steps' records)",
                  columns=["run", "steps done", "wall (steps)", "GPU-hours", *(p for p, _ in TIME_PARTS)], rows=[],
                  key_columns=1)
    for run, label in zip(runs, labels):
        metrics = run.metrics.drop_duplicates("step", keep="last") if "step" in run.metrics else run.metrics
        finished = run.finished_train_steps()
        done = len(finished) if finished is not None else int(run.rows["step"].nunique()) if "step" in run.rows else 0
        planned = run.planned_steps
        wall = _sum(metrics, "step_s")
        parts = []
        for _, column in TIME_PARTS:
            seconds = _sum(metrics, column)
            share = f" ({seconds / wall:.0%})" if seconds is not None and wall else ""
            parts.append("-" if seconds is None else f"{seconds:.0f} s{share}")
        table.rows.append([label, f"{done} of {planned}" if planned is not None else str(done),
                           "-" if wall is None else f"{wall / 60:.1f} min",
                           f"{wall * _gpus(metrics) / 3600:.2f}" if wall is not None else "-", *parts])
    table.notes.append("wall (steps): the steps' own time, without the start (model load) of each launch; GPU-hours: "
                       "that time x the GPUs the ranks trained on; wait: the part of evaluate the policy waited for")
    return table


def integrity_table(runs: Sequence[Run], labels: Sequence[str]) -> Table:
    """Per run: kernels evaluated, and the verdicts the reward did not take at face value."""
    table = Table(title="Reward integrity: verdicts the evaluator distrusted, refused or could not give",
                  columns=["run", "kernels evaluated", "suspect", "forbidden (by rule)", "recheck disagreed",
                           "infrastructure failures"], rows=[], key_columns=1)
    for run, label in zip(runs, labels):
        rows = run.rows
        status = rows["status"] if "status" in rows else pd.Series(dtype=str)
        rule = rows["rule"] if "rule" in rows else pd.Series([None] * len(rows), index=rows.index)
        forbidden = rule[status == "forbidden"]
        by_rule = ", ".join(f"{r} {n}" for r, n in forbidden.fillna("not recorded").value_counts().items())
        table.rows.append([label, int((status != "format_error").sum()), int((status == "suspect").sum()),
                           f"{len(forbidden)} ({by_rule})" if len(forbidden) else "0",
                           int((rule == "recheck_disagrees").sum()) if "rule" in rows else "not recorded",
                           int((status == "infra_error").sum())])
    table.notes.append("every turn row of the run, both splits; kernels evaluated: turns that submitted a kernel "
                       "(format errors excluded); suspect, forbidden and recheck-disagreed verdicts score 0; an "
                       "infrastructure failure is the machine's, scores 0 and is not fed back as the model's mistake")
    return table


def _matches(value: Any, text: str) -> bool:
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        return format_value(value) == text or str(value) == text


def missing_lines(runs: Sequence[Run], variants: Sequence[Variant], ledger_lines: Sequence[dict[str, Any]],
                  notes: Sequence[str]) -> list[str]:
    """Runs of the launched grid that are absent, seeds a variant lacks, and the analysis's notes on
    unfinished runs and steps."""
    lines = []
    swept: dict[str, list[str]] = {}
    for entry in ledger_lines:
        for key, values in (entry.get("swept") or {}).items():
            swept[key] = list(dict.fromkeys([*swept.get(key, []), *values]))
    checkable = {k: v for k, v in swept.items() if all(k in run.config for run in runs)}
    for combo in itertools.product(*checkable.values()):
        wanted = dict(zip(checkable, combo))
        if not any(all(_matches(run.config[k], v) for k, v in wanted.items()) for run in runs):
            lines.append(f"- absent: the run {', '.join(f'{k}={v}' for k, v in wanted.items())} of the launched sweep")
    seeds = sorted({run.seed for run in runs} | {int(s) for s in swept.get(SEED_KEY, []) if s.lstrip("-").isdigit()},
                   key=repr)
    for variant in variants:
        absent = [s for s in seeds if s not in variant.seeds]
        if absent:
            lines.append(f"- {variant.label}: seed {', '.join(map(str, absent))} absent")
    lines += [f"- {note}" for note in notes]
    return lines or ["- nothing: every run of the sweep is here, finished, with every seed"]
