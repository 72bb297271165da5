"""Trimming compiler and runtime output to what fits in a model's next prompt."""
from __future__ import annotations

import re

_ERROR_LINE = re.compile(r"\berror\b|Error|error:", re.IGNORECASE)
_NOISE = re.compile(r"^\s*(\[\d+/\d+\]|ninja: |FAILED: |c\+\+ |g\+\+ |/usr/\S*nvcc |nvcc )")


def trim_compiler_log(log: str, limit: int) -> str:
    """Keep the first error lines with a little context, drop command lines and paths noise."""
    lines = [ln for ln in log.splitlines() if ln.strip() and not _NOISE.match(ln)]
    picked: list[str] = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line):
            for ctx in lines[i : i + 3]:
                if ctx not in picked:
                    picked.append(ctx)
        if sum(len(p) + 1 for p in picked) > limit:
            break
    text = "\n".join(picked or lines[-20:])
    return trim(text, limit)


def trim(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + "\n[... trimmed ...]\n" + text[-(limit - head - 20) :]
