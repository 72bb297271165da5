"""Pulling the candidate program and the reasoning summary out of a model response.

The candidate is the last *complete* fenced code block (```python ... ``` or a bare ``` block); the
summary is the text after it (Kevin asks for a few sentences summarising the changes after the code).
A response with no complete code block is a format error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)\n[ \t]*```", re.DOTALL)
_THINK_END = re.compile(r"</think>", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedResponse:
    code: str | None
    summary: str
    reasoning: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.code is not None


def parse_response(text: str, max_summary_chars: int = 2000) -> ParsedResponse:
    # Code inside the chain of thought is a draft: look only after </think> when the model emits one.
    reasoning, answer = "", text
    ends = list(_THINK_END.finditer(text))
    if ends:
        reasoning, answer = text[: ends[-1].start()], text[ends[-1].end() :]
    blocks = [m for m in _FENCE.finditer(answer) if m.group(1).lower() in ("", "python", "py", "python3")]
    if not blocks:
        return ParsedResponse(None, "", reasoning, "no complete ```python code block found in the response")
    last = blocks[-1]
    code = last.group(2).strip("\n")
    summary = answer[last.end() :].strip()[:max_summary_chars]
    return ParsedResponse(code, summary, reasoning)
