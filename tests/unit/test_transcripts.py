"""Transcripts: rows built from real rollout objects, written as gzip members, read back after a cut, resumed.

``realistic_samples`` builds turns the way a rollout hands them over (``TurnSample`` holding the
``TurnResult`` and ``Attempt`` that ``KernelEnv.step`` makes from ``parse_response``) with responses of a
few KB: reasoning prose, a built-in CUDA solution (another one per trajectory) revised from turn to turn,
a summary. Turns cycle through ok / incorrect / compile_error / format_error. The size test measures bytes
per turn on them.
"""
from __future__ import annotations

import gzip
import json
import random
import subprocess
from pathlib import Path

from kevin_exp.records.transcripts import (
    TranscriptWriter,
    encode_rows,
    read_transcripts,
    transcript_path,
    transcript_rows,
    transcript_steps,
)
from kevin_exp.rollout.env import TurnResult
from kevin_exp.rollout.loop import TurnSample
from kevin_exp.rollout.parsing import parse_response
from kevin_exp.rollout.prompts import Attempt, feedback_text
from kevin_exp.tasks import load_builtin

FENCE = "`" * 3
WORDS = (
    "the kernel block thread warp shared memory tile row column each element we load store compute reduce sum "
    "max index stride offset launch grid dimension float input output tensor batch channel so then but since "
    "if because maybe should could need use avoid fuse coalesced access bank conflict register occupancy latency "
    "bandwidth vectorised float4 loop unroll partial result atomic synchronise barrier first second next last "
    "faster slower correct wrong check boundary size divide ceil instead also only one two four eight sixteen "
    "wait actually hmm let me think again about how this works here there which what when where who whose "
    "previous attempt feedback error compile failed mismatch tolerance precision half double accumulate "
    "write read global constant texture cache line hit miss prefetch pipeline stage async copy issue "
    "instruction throughput arithmetic intensity roofline bound limited scheduler dispatch divergence branch "
    "predicate mask lane shuffle broadcast transpose padding alignment contiguous layout major minor problem "
    "reference model forward pass weight bias activation relu gelu softmax norm mean variance epsilon scale "
    "residual matmul gemm convolution kernel_size padding stride dilation output_height output_width spatial "
    "is are was were be been has have had do does did not no yes all any some many few more less most least "
    "this that these those it its they them their our my your a an of to in on at by for with from into"
).split()
IDENTIFIERS = (
    "blockIdx.x threadIdx.x blockDim.x gridDim.x __syncthreads() __shfl_down_sync smem acc out[idx] x.size(1) "
    "BLOCK_SIZE TILE n_rows n_cols warpSize float4 load_inline ModelNew forward() row_max row_sum"
).split()
COMPILE_LOG = (
    "[1/3] /usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME=ext_{k} -DTORCH_API_INCLUDE_EXTENSION_H -isystem "
    "/opt/torch/include -isystem /opt/torch/include/torch/csrc/api/include -D__CUDA_NO_HALF_OPERATORS__ "
    "--expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 --compiler-options '-fPIC' -O3 -std=c++17 "
    "-c cuda.cu -o cuda.cuda.o\nFAILED: cuda.cuda.o\ncuda.cu({line}): error: identifier \"tile_{k}\" is undefined\n"
    "      float acc = tile_{k}[threadIdx.y][k];\n                  ^\ncuda.cu({line2}): error: expected a \";\"\n"
    "2 errors detected in the compilation of \"cuda.cu\".\nninja: build stopped: subcommand failed."
)


def _word(rng: random.Random) -> str:
    u = rng.random()
    if u < 0.08:
        return str(rng.choice((rng.randint(2, 64), rng.randint(64, 65536), round(rng.uniform(0, 10), 2))))
    return rng.choice(IDENTIFIERS) if u < 0.16 else rng.choice(WORDS)


def _prose(rng: random.Random, chars: int) -> str:
    sentences, length = [], 0
    while length < chars:
        words = [_word(rng) for _ in range(rng.randint(8, 22))]
        text = " ".join(words)
        sentence = text[0].upper() + text[1:] + rng.choice((".", ".", ".", "?", ":"))
        sentences.append(sentence)
        length += len(sentence) + 1
    paragraphs = [" ".join(sentences[i:i + 5]) for i in range(0, len(sentences), 5)]
    return "\n\n".join(paragraphs)


def _revised(code: str, rng: random.Random, turn: int) -> str:
    """The solution as a model's later turn would change it: other launch sizes, a new comment."""
    block = rng.choice((128, 256, 512, 1024))
    include = "#include <torch/extension.h>"
    note = f"{include}\n// turn {turn + 1}: {block} threads per block"
    return code.replace("256", str(block)).replace(include, note, 1)


def _result(status: str, text: str, rng: random.Random, k: int) -> TurnResult:
    parsed = parse_response(text)
    if status == "format_error":
        assert not parsed.ok
        return TurnResult(status="format_error", correct=False, score=0.0,
                          attempt=Attempt(None, parsed.summary, "format_error", parsed.error), reason=parsed.error)
    assert parsed.ok
    if status == "ok":
        speedup = round(rng.uniform(0.4, 3.0), 3)
        attempt = Attempt(parsed.code, parsed.summary, "ok", f"correct, {speedup}x", speedup)
        return TurnResult(status="ok", correct=True, score=0.3 + speedup, attempt=attempt, speedup=speedup, runtime_ms=0.1,
                          ref_runtime_ms=0.1 * speedup, reason=f"correct, {speedup}x", device="H100")
    if status == "incorrect":
        message = f"output mismatch in trial 1 of 5: max abs diff {rng.uniform(0.01, 9):.4f} > atol 0.01 at index {k}"
        return TurnResult(status="incorrect", correct=False, score=0.0,
                          attempt=Attempt(parsed.code, parsed.summary, "incorrect", message), reason=message, device="H100")
    log = COMPILE_LOG.format(k=k, line=rng.randint(10, 60), line2=rng.randint(60, 90))
    return TurnResult(status="compile_error", correct=False, score=0.0,
                      attempt=Attempt(parsed.code, parsed.summary, "compile_error", log),
                      reason="compile error: identifier is undefined")


def realistic_samples(n_tasks: int, n_trajectories: int, n_turns: int, seed: int = 0) -> list[TurnSample]:
    """Samples ordered by (task, trajectory, turn), as ``run_rollout`` returns them."""
    rng = random.Random(seed)
    problems = load_builtin()
    solutions = [p.solution("cuda") or "" for p in problems]
    statuses = ("compile_error", "incorrect", "ok", "format_error")
    samples = []
    for i, task in enumerate(problems[:n_tasks]):
        for j in range(n_trajectories):
            # trajectories start from different kernels; a trajectory's turns revise its own
            solution = solutions[(i + j) % len(solutions)]
            for turn in range(n_turns):
                status = statuses[(j + turn) % len(statuses)]
                reasoning = "Okay, " + _prose(rng, rng.randint(1800, 3200))
                if status == "format_error":
                    # cut at the token limit while still reasoning, with a code block never closed
                    text = f"{reasoning}\n{FENCE}python\n{solution[: len(solution) // 2]}"
                else:
                    text = (f"{reasoning}\n\n{FENCE}python\n{_revised(solution, rng, turn)}\n{FENCE}\n"
                            f"{_prose(rng, rng.randint(200, 450))}")
                result = _result(status, text, rng, turn)
                samples.append(TurnSample(task, j, turn, prompt_ids=list(range(900 + 700 * turn)),
                                          response_ids=list(range(len(text) // 4)), text=text,
                                          truncated=status == "format_error", dropped_attempts=0, result=result))
    return samples


def test_rows_carry_the_text_and_verdict_of_each_turn():
    samples = realistic_samples(n_tasks=1, n_trajectories=1, n_turns=4)
    rows = transcript_rows("train", 3, samples)
    keys = [(r["step"], r["split"], r["trajectory"], r["turn"]) for r in rows]
    assert keys == [(3, "train", 0, t) for t in (1, 2, 3, 4)]
    for row, sample in zip(rows, samples):
        r = sample.result
        assert row["task_id"] == sample.task.problem_id and row["level"] == sample.task.level
        assert row["response"] == sample.text and row["kernel"] == r.attempt.code
        assert row["status"] == r.status and row["correct"] == r.correct and row["score"] == r.score
        assert row["feedback"] == feedback_text(r.attempt) and row["reason"] == r.reason
        assert row["response_tokens"] == len(sample.response_ids) and row["prompt_tokens"] == len(sample.prompt_ids)
        assert "prompt" not in row
    by_status = {r["status"]: r for r in rows}
    assert by_status["format_error"]["kernel"] is None and by_status["format_error"]["truncated"] is True
    assert by_status["ok"]["speedup"] == samples[2].result.speedup and "made faster" in by_status["ok"]["feedback"]
    assert by_status["incorrect"]["speedup"] is None
    assert "__global__" in by_status["compile_error"]["kernel"]
    assert "is undefined" in by_status["compile_error"]["feedback"]


def test_round_trip_and_appends_across_calls_and_writers(tmp_path: Path):
    samples = realistic_samples(n_tasks=2, n_trajectories=2, n_turns=2)
    rows = transcript_rows("train", 1, samples)
    with TranscriptWriter(tmp_path) as writer:
        writer.append(1, rows[:3])
        writer.append(1, rows[3:5])
        writer.append(2, transcript_rows("train", 2, samples[:1]))
    # a second writer (a restarted process) appends to the same step
    with TranscriptWriter(tmp_path) as writer:
        writer.append(1, rows[5:])
    assert transcript_path(tmp_path, 1).name == "step_000001.jsonl.gz"
    assert transcript_steps(tmp_path) == [1, 2]
    assert read_transcripts(tmp_path, step=1) == rows
    # the members make one gzip stream that any gzip reader takes whole
    plain = gzip.decompress(transcript_path(tmp_path, 1).read_bytes()).decode()
    assert [json.loads(line) for line in plain.splitlines()] == rows
    zcat = subprocess.run(["zcat", str(transcript_path(tmp_path, 1))], capture_output=True, text=True, check=True)
    assert len(zcat.stdout.splitlines()) == len(rows)
    assert len(read_transcripts(tmp_path)) == len(rows) + 1


def test_filters(tmp_path: Path):
    samples = realistic_samples(n_tasks=2, n_trajectories=3, n_turns=2)
    with TranscriptWriter(tmp_path) as writer:
        writer.append(4, transcript_rows("train", 4, samples))
        writer.append(5, transcript_rows("eval", 5, samples))
    task = samples[-1].task.problem_id
    picked = read_transcripts(tmp_path, step=4, task=task, trajectory=2)
    assert [(r["task_id"], r["trajectory"], r["turn"]) for r in picked] == [(task, 2, 1), (task, 2, 2)]
    assert {r["step"] for r in read_transcripts(tmp_path, split="eval")} == {5}
    assert read_transcripts(tmp_path, step=9) == [] and read_transcripts(tmp_path / "missing") == []


def test_resume_at_drops_files_of_later_steps(tmp_path: Path):
    samples = realistic_samples(n_tasks=1, n_trajectories=1, n_turns=1)
    writer = TranscriptWriter(tmp_path)
    for step in (1, 2, 3, 4):
        writer.append(step, transcript_rows("train", step, samples))
    assert writer.resume_at(2) == [3, 4]
    assert transcript_steps(tmp_path) == [1, 2]
    writer.append(3, transcript_rows("train", 3, samples))
    writer.close()
    assert [r["step"] for r in read_transcripts(tmp_path)] == [1, 2, 3]
    assert TranscriptWriter(tmp_path).resume_at(0) == [1, 2, 3] and transcript_steps(tmp_path) == []


def test_a_file_cut_by_a_kill_keeps_every_complete_row(tmp_path: Path):
    samples = realistic_samples(n_tasks=1, n_trajectories=2, n_turns=4)
    rows = transcript_rows("train", 1, samples)
    with TranscriptWriter(tmp_path) as writer:
        writer.append(1, rows[:3])
        writer.append(1, rows[3:])
    path = transcript_path(tmp_path, 1)
    whole = path.read_bytes()
    first_member = len(encode_rows(rows[:3]))
    assert read_transcripts(tmp_path, step=1) == rows
    # cut in the second member (its header, its data, its trailer): the first member's rows all remain, plus
    # the second member's rows that decompressed whole before the cut
    for cut in (first_member + 5, first_member + (len(whole) - first_member) // 2, len(whole) - 4):
        path.write_bytes(whole[:cut])
        kept = read_transcripts(tmp_path, step=1)
        assert 3 <= len(kept) <= len(rows) and kept == rows[:len(kept)]
    path.write_bytes(whole[:first_member + (len(whole) - first_member) // 2])
    assert 3 < len(read_transcripts(tmp_path, step=1)) < len(rows)
    path.write_bytes(whole[:first_member // 2])
    kept = read_transcripts(tmp_path, step=1)
    assert len(kept) < 3 and kept == rows[:len(kept)]
    # a zero-filled tail (left by some file systems after a crash) is not a row either
    path.write_bytes(whole + b"\0" * 512)
    assert read_transcripts(tmp_path, step=1) == rows


def test_appending_after_a_cut_trims_the_broken_member_first(tmp_path: Path):
    samples = realistic_samples(n_tasks=1, n_trajectories=1, n_turns=4)
    rows = transcript_rows("train", 1, samples)
    with TranscriptWriter(tmp_path) as writer:
        writer.append(1, rows[:2])
        writer.append(1, rows[2:3])
    path = transcript_path(tmp_path, 1)
    path.write_bytes(path.read_bytes()[:-7])
    with TranscriptWriter(tmp_path) as writer:
        writer.append(1, rows[3:])
    assert read_transcripts(tmp_path, step=1) == rows[:2] + rows[3:]
    assert len(gzip.decompress(path.read_bytes()).splitlines()) == 3


def test_size_per_turn(tmp_path: Path):
    """One member per step (the step's rows appended at once) and one member per turn."""
    samples = realistic_samples(n_tasks=8, n_trajectories=4, n_turns=4)
    rows = transcript_rows("train", 1, samples)
    response_bytes = sum(len(s.text.encode()) for s in samples) / len(samples)
    with TranscriptWriter(tmp_path) as writer:
        writer.append(1, rows)
        for row in rows:
            writer.append(2, [row])
    per_step = transcript_path(tmp_path, 1).stat().st_size / len(rows)
    per_turn = transcript_path(tmp_path, 2).stat().st_size / len(rows)
    print(f"responses {response_bytes:.0f} B; compressed per turn: {per_step:.0f} B (one member per step), "
          f"{per_turn:.0f} B (one member per turn)")
    assert 3000 < response_bytes < 6000
    assert per_step < 1800 and per_turn < 3200
