"""What the model wrote, turn by turn: ``run_dir/transcripts/step_000001.jsonl.gz``, one file per step.

Each row is one turn of one trajectory (the same key as a ``turns.jsonl`` row: split, step, task_id,
trajectory, turn) with the text behind it: the model's full response, the kernel extracted from it (None
on a format error), the summary after the code, the feedback the next prompt shows, and the verdict
(status, correct, speedup, score, reason). The prompt text is not kept: it is rebuilt from the task's
reference program and the earlier turns' kernels, summaries and feedback (``rollout/prompts.py``), all of
which are here; only its token count is kept, and how many early attempts it left out to fit its budget.

Every ``TranscriptWriter.append`` writes its rows as one new gzip member and flushes and fsyncs the file;
concatenated members are one valid gzip stream, so ``zcat`` reads a file whole. A kill can cut only the
last member: ``read_transcripts`` keeps every complete row before the cut, and a writer that reopens such a
file first trims it back to its last complete member. ``resume_at`` deletes the files of steps after the
checkpoint a run resumes from, as ``run_records.py`` does for ``turns.jsonl``.

Size, measured on responses of 5.4 KB on average (reasoning, a CUDA kernel revised from turn to turn, a
summary) and the feedback of each outcome: 1.3 KB per turn when a step's rows are appended in one call
(one member), 2.8 KB per turn when every turn is appended alone; so append a step's (or a batch's) rows
at once. ``docs/transcripts.md`` has the details.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterator, Sequence

from kevin_exp.records.run_records import fsync_path
from kevin_exp.rl.reward import counted_speedup
from kevin_exp.rollout.prompts import feedback_text

if TYPE_CHECKING:
    from kevin_exp.rollout.loop import TurnSample

SPLITS = ("train", "eval")
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl\.gz$")
# the header bytes every gzip member starts with (magic, deflate)
_GZIP_MAGIC = b"\x1f\x8b\x08"
_CHUNK = 1 << 16


def transcripts_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / "transcripts"


def transcript_path(run_dir: Path | str, step: int) -> Path:
    return transcripts_dir(run_dir) / f"step_{step:06d}.jsonl.gz"


def transcript_steps(run_dir: Path | str) -> list[int]:
    """The steps that have a transcript file, in order."""
    folder = transcripts_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


def transcript_rows(split: str, step: int, samples: Sequence[TurnSample]) -> list[dict[str, Any]]:
    """One row per sample (a rollout's turns), in the samples' order."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {', '.join(SPLITS)}")
    rows = []
    for s in samples:
        r = s.result
        rows.append({
            "split": split, "step": step, "task_id": s.task.problem_id, "level": s.task.level,
            "trajectory": s.trajectory, "turn": s.turn + 1, "status": r.status, "correct": r.correct,
            "speedup": counted_speedup(r.correct, r.speedup), "score": r.score, "reason": r.reason,
            "excessive_speedup": r.excessive_speedup, "response": s.text, "kernel": r.attempt.code,
            "summary": r.attempt.summary, "feedback": feedback_text(r.attempt),
            "prompt_tokens": len(s.prompt_ids), "dropped_attempts": s.dropped_attempts,
            "response_tokens": len(s.response_ids), "truncated": s.truncated,
        })
    return rows


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def encode_rows(rows: Sequence[dict[str, Any]]) -> bytes:
    """The rows as one gzip member of JSON lines."""
    text = "".join(json.dumps({k: _finite(v) for k, v in row.items()}, allow_nan=False) + "\n" for row in rows)
    return gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)


def _members(data: bytes) -> Iterator[tuple[bytes, int, bool]]:
    """Each gzip member's decompressed bytes, the offset where it ends, and whether it is complete.

    A member cut short yields what it decompressed before the cut, marked incomplete, and ends the walk;
    a corrupt member yields nothing and ends it; bytes after the last member that do not start a gzip
    header (a zero-filled tail) end it quietly."""
    view = memoryview(data)
    offset = 0
    while offset < len(data) and data.startswith(_GZIP_MAGIC, offset):
        decompressor = zlib.decompressobj(wbits=31)
        parts, position = [], offset
        try:
            # fed in chunks, so what is left after the member (unused_data) is never more than one chunk
            while not decompressor.eof and position < len(data):
                chunk = view[position:position + _CHUNK]
                parts.append(decompressor.decompress(chunk))
                position += len(chunk)
        except zlib.error:
            yield b"", offset, False
            return
        if not decompressor.eof:
            yield b"".join(parts), offset, False
            return
        offset = position - len(decompressor.unused_data)
        yield b"".join(parts), offset, True


def _complete_rows(text: bytes) -> Iterator[dict[str, Any]]:
    for line in text.split(b"\n")[:-1]:  # the piece after the last newline is not a complete row
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                return


def read_transcript_file(path: Path) -> list[dict[str, Any]]:
    """Every complete row of one file, also of one whose last member a kill cut short."""
    rows: list[dict[str, Any]] = []
    for text, _, _ in _members(path.read_bytes()):
        rows.extend(_complete_rows(text))
    return rows


def read_transcripts(run_dir: Path | str, step: int | None = None, task: str | None = None,
                     trajectory: int | None = None, split: str | None = None) -> list[dict[str, Any]]:
    """The rows of one step's file (``step``) or of all files, in file order, keeping those that match
    every filter given. A missing folder or step has no rows."""
    steps = transcript_steps(run_dir) if step is None else [step]
    rows = []
    for s in steps:
        path = transcript_path(run_dir, s)
        if not path.is_file():
            continue
        rows.extend(r for r in read_transcript_file(path)
                    if (task is None or r.get("task_id") == task)
                    and (trajectory is None or r.get("trajectory") == trajectory)
                    and (split is None or r.get("split") == split))
    return rows


def _complete_length(path: Path) -> int:
    """Bytes of ``path`` up to the end of its last complete gzip member."""
    end = 0
    for _, offset, complete in _members(path.read_bytes()):
        if complete:
            end = offset
    return end


class TranscriptWriter:
    """Appends rows to ``run_dir/transcripts/step_{step:06d}.jsonl.gz``; each call is durable when it returns."""

    def __init__(self, run_dir: Path | str) -> None:
        self.folder = transcripts_dir(run_dir)
        self.run_dir = Path(run_dir)
        self._step: int | None = None
        self._fh: IO[bytes] | None = None

    def append(self, step: int, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        fh = self._file(step)
        fh.write(encode_rows(rows))
        fh.flush()
        os.fsync(fh.fileno())

    def resume_at(self, last_done_step: int) -> list[int]:
        """Delete the files of steps after ``last_done_step`` (a restarted run redoes them); returns their steps."""
        dropped = [s for s in transcript_steps(self.run_dir) if s > last_done_step]
        for step in dropped:
            self.discard(step)
        return dropped

    def discard(self, step: int) -> None:
        """Delete one step's file, e.g. an evaluation batch that runs again."""
        if self._step == step:
            self.close()
        transcript_path(self.run_dir, step).unlink(missing_ok=True)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh, self._step = None, None

    def _file(self, step: int) -> IO[bytes]:
        if self._fh is not None and self._step == step:
            return self._fh
        self.close()
        self.folder.mkdir(parents=True, exist_ok=True)
        path = transcript_path(self.run_dir, step)
        existed = path.is_file()
        if existed:
            # a member cut by a kill would hide every member appended after it from gzip readers
            end = _complete_length(path)
            if end < path.stat().st_size:
                os.truncate(path, end)
        self._fh, self._step = open(path, "ab"), step
        if not existed:
            fsync_path(self.folder)  # the new file's name, durable along with its contents
        return self._fh

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


