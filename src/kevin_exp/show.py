"""``python -m kevin_exp.show RUN_DIR``: one trajectory of a run, turn by turn, as the model wrote it.

Each turn shows its verdict (status, correct, speedup, score), the model's response (the middle of a long
one elided unless ``--full``), the kernel extracted from it and the feedback the evaluator gave. ``--list``
prints the step's tasks x trajectories with each turn's status, to pick one. Reads
``RUN_DIR/transcripts/`` (``kevin_exp.records.transcripts``); plain text, fit for a pager or a pipe.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

from kevin_exp.errors import UserError, exits_on_user_error
from kevin_exp.records.transcripts import SPLITS, read_transcripts, transcript_path, transcript_steps, transcripts_dir

PROG = "python -m kevin_exp.show"
HEAD_LINES, TAIL_LINES = 30, 30
HEAD_CHARS, TAIL_CHARS = 5000, 5000
# shown in --list and in error messages; a longer list is cut with a count of the rest
MAX_LISTED = 30


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see {PROG} --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Show one trajectory of a run turn by turn: the model's responses, the "
                                       "kernels extracted from them and the feedback they got.")
    p.add_argument("run_dir", type=Path, help="the run folder (the one holding turns.jsonl and transcripts/)")
    p.add_argument("--step", type=int, help="the step to read (default: the last one with transcripts)")
    p.add_argument("--task", help="task id, e.g. builtin/level1/3 (a unique ending such as level1/3 will do)")
    p.add_argument("--trajectory", type=int, help="trajectory index within the task, from 0")
    p.add_argument("--split", choices=SPLITS, help="train or eval rows (default: train where the step has both)")
    p.add_argument("--list", action="store_true", help="list the step's tasks x trajectories with each turn's status")
    p.add_argument("--full", action="store_true", help="print long responses whole")
    return p


# ------------------------------------------------------------------ choosing rows
def _ranges(numbers: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    parts: list[str] = []
    ordered = sorted(set(numbers))
    start = prev = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


def _listed(names: Sequence[str]) -> str:
    if len(names) <= MAX_LISTED:
        return ", ".join(names)
    return ", ".join(names[:MAX_LISTED]) + f" and {len(names) - MAX_LISTED} more"


def _unique(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def _step_rows(run_dir: Path, step: int | None) -> tuple[int, list[dict[str, Any]]]:
    if not run_dir.exists():
        raise UserError(f"run folder {run_dir} does not exist")
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a folder; pass a run folder")
    steps = transcript_steps(run_dir)
    if not steps:
        raise UserError(f"{run_dir} has no transcripts (no {transcripts_dir(run_dir)}/step_*.jsonl.gz); runs "
                        "started before transcripts were recorded have none")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise UserError(f"--step {step}: {run_dir} has no transcript of that step; steps with transcripts: "
                        f"{_ranges(steps)}")
    rows = read_transcripts(run_dir, step=step)
    if not rows:
        raise UserError(f"{transcript_path(run_dir, step)} holds no complete row (it was cut before its first "
                        "rows were written); pick another --step")
    return step, rows


def _split_rows(rows: list[dict[str, Any]], split: str | None,
                step: int) -> tuple[str, list[dict[str, Any]], list[str]]:
    """The chosen split, its rows, and the step's other splits."""
    present = _unique([str(r.get("split")) for r in rows])
    if split is None:
        split = "train" if "train" in present else present[0]
    elif split not in present:
        raise UserError(f"--split {split}: step {step} has no {split} rows, only {', '.join(present)}")
    return split, [r for r in rows if r.get("split") == split], [s for s in present if s != split]


def _resolve_task(wanted: str, tasks: list[str], step: int) -> str:
    if wanted in tasks:
        return wanted
    endings = [t for t in tasks if t.endswith("/" + wanted.strip("/"))]
    if len(endings) == 1:
        return endings[0]
    if endings:
        raise UserError(f"--task {wanted}: matches {len(endings)} tasks of step {step} ({_listed(endings)}); "
                        "give the full task id")
    raise UserError(f"--task {wanted}: not a task of step {step}; its tasks: {_listed(tasks)}")


# ------------------------------------------------------------------ printing
def _printable(text: str) -> str:
    # model output may hold terminal control sequences; show them escaped instead of letting them act
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def _elided(text: str) -> str:
    lines = text.splitlines()
    if len(lines) > HEAD_LINES + TAIL_LINES + 5:
        hidden = len(lines) - HEAD_LINES - TAIL_LINES
        lines = [*lines[:HEAD_LINES], f"[... {hidden} lines elided; --full shows them ...]", *lines[-TAIL_LINES:]]
        text = "\n".join(lines)
    if len(text) > HEAD_CHARS + TAIL_CHARS + 500:
        hidden = len(text) - HEAD_CHARS - TAIL_CHARS
        text = f"{text[:HEAD_CHARS]}\n[... {hidden} characters elided; --full shows them ...]\n{text[-TAIL_CHARS:]}"
    return text


def _speedup(row: dict[str, Any]) -> str:
    return f"{row['speedup']:.2f}x" if isinstance(row.get("speedup"), (int, float)) else "-"


def _turn_text(row: dict[str, Any], n_turns: int, full: bool) -> str:
    correct = {True: "yes", False: "no"}.get(row.get("correct"), "-")
    score = f"{row['score']:.3f}" if isinstance(row.get("score"), (int, float)) else "-"
    header = (f"turn {row.get('turn')} of {n_turns} | {row.get('status')} | correct: {correct} | "
              f"speedup: {_speedup(row)} | score: {score}")
    tokens = f"tokens: prompt {row.get('prompt_tokens', '-')}, response {row.get('response_tokens', '-')}"
    if row.get("truncated"):
        tokens += " (cut at the token limit)"
    if row.get("dropped_attempts"):
        tokens += f"; the prompt left out the {row['dropped_attempts']} earliest attempts"
    parts = [f"{'=' * 8} {header} {'=' * 8}", tokens]
    if row.get("reason"):
        parts.append(f"reason: {row['reason']}")
    if row.get("excessive_speedup"):
        parts.append("flag: excessive speedup (worth reading the kernel)")
    response = row.get("response") or ""
    parts += ["--- response ---", response if full else _elided(response)]
    kernel = row.get("kernel")
    parts += ["--- kernel ---", kernel if kernel is not None else "(none: no complete code block was parsed)"]
    parts += ["--- feedback ---", row.get("feedback") or "(none)"]
    return _printable("\n".join(parts))


def _list_table(rows: list[dict[str, Any]]) -> str:
    cells: dict[tuple[str, int], dict[int, str]] = {}
    for r in rows:
        status = str(r.get("status"))
        cell = f"{status} {_speedup(r)}" if r.get("correct") and r.get("speedup") is not None else status
        cells.setdefault((r["task_id"], r["trajectory"]), {})[r["turn"]] = cell
    turns = sorted({t for per_turn in cells.values() for t in per_turn})
    header = ["task", "trajectory", *(f"turn {t}" for t in turns)]
    table = [header] + [[task, str(j), *(per_turn.get(t, "") for t in turns)] for (task, j), per_turn in cells.items()]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)


# ------------------------------------------------------------------ command
def show(args: argparse.Namespace) -> str:
    step, rows = _step_rows(args.run_dir, args.step)
    split, rows, other_splits = _split_rows(rows, args.split, step)
    where = f"step {step} ({split}" + "".join(f"; {s} rows too: --split {s}" for s in other_splits) + ")"
    tasks = _unique([r["task_id"] for r in rows])
    task = _resolve_task(args.task, tasks, step) if args.task is not None else None
    if args.list:
        listed = [r for r in rows if task is None or r["task_id"] == task]
        split_arg = f" --split {split}" if other_splits else ""
        pick = f"{PROG} {args.run_dir} --step {step}{split_arg} --task ID --trajectory J"
        return f"{where}:\n{_list_table(listed)}\n\nshow one with: {pick}"
    chosen = task if task is not None else tasks[0]
    task_rows = [r for r in rows if r["task_id"] == chosen]
    trajectories = sorted({r["trajectory"] for r in task_rows})
    if args.trajectory is None:
        trajectory = trajectories[0]
    elif args.trajectory in trajectories:
        trajectory = args.trajectory
    else:
        raise UserError(f"--trajectory {args.trajectory}: task {chosen} at step {step} has trajectories "
                        f"{_ranges(trajectories)}")
    turns = sorted((r for r in task_rows if r["trajectory"] == trajectory), key=lambda r: r.get("turn", 0))
    level = turns[0].get("level")
    task_name = chosen + (f" (level {level})" if level is not None else "")
    lines = [f"run {args.run_dir} | {where} | task {task_name} | trajectory {trajectory} of {_ranges(trajectories)} "
             f"| {len(turns)} turns"]
    defaults = ([f"task {chosen}"] if args.task is None else []) + \
               ([f"trajectory {trajectory}"] if args.trajectory is None else [])
    if defaults:
        lines.append(f"(chose {' and '.join(defaults)}; the step has {len(tasks)} tasks: pick another with "
                     f"--task ID --trajectory J, list them with --list)")
    n_turns = max(r.get("turn", 0) for r in turns)
    return "\n\n".join(["\n".join(lines), *(_turn_text(r, n_turns, args.full) for r in turns)])


@exits_on_user_error
def main(argv: Sequence[str] | None = None) -> int:
    text = show(_parser().parse_args(argv))
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader stopped (| head): not an error; keep the interpreter from reporting it again at exit
        sys.stdout = open(sys.devnull, "w")
    return 0


if __name__ == "__main__":
    sys.exit(main())
