"""Tables as Markdown (default), CSV (raw fractions, one column per bound) or LaTeX (booktabs)."""
from __future__ import annotations

import csv
import io
import math
from typing import Any, Callable

from kevin_exp.analysis.tables import BudgetCell, Cell, Table
from kevin_exp.analysis.variants import format_value
from kevin_exp.errors import UserError

FORMATS = ("markdown", "csv", "latex")


def format_cell(value: Any) -> str:
    if isinstance(value, Cell):
        if value.kind == "speedup":
            text = f"{value.value:.2f}x"
            bounds = None if value.lo is None else f"[{value.lo:.2f}, {value.hi:.2f}]"
        else:
            text = f"{100 * value.value:.1f}%"
            bounds = None if value.lo is None else f"[{100 * value.lo:.1f}, {100 * value.hi:.1f}]"
        return text if bounds is None else f"{text} {bounds}"
    if isinstance(value, BudgetCell):
        return f"{value.speedup:.2f}x / {100 * value.correct:.1f}%"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format_value(value)


def render_markdown(table: Table) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    align = [":---" if i < table.key_columns else "---:" for i in range(len(table.columns))]
    lines = [f"### {table.title}", "", line(table.columns), line(align)]
    lines += [line([format_cell(v) for v in row]) for row in table.rows]
    lines += [""] + [f"Note: {note}" for note in table.notes] if table.notes else []
    return "\n".join(lines) + "\n"


def _raw(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.6g}"


def render_csv(table: Table) -> str:
    """Rates stay fractions (0.82, not 82%); each interval cell becomes value, ``<name> lo``, ``<name> hi``."""
    header: list[str] = []
    expanders: list[Callable[[Any], list[str]]] = []
    for index, name in enumerate(table.columns):
        sample = next((row[index] for row in table.rows if row[index] is not None), None)
        if isinstance(sample, Cell):
            header += [name, f"{name} lo", f"{name} hi"]
            expanders.append(lambda c: ["", "", ""] if c is None else [_raw(c.value), _raw(c.lo), _raw(c.hi)])
        elif isinstance(sample, BudgetCell):
            header += [f"{name} speedup", f"{name} correct"]
            expanders.append(lambda c: ["", ""] if c is None else [_raw(c.speedup), _raw(c.correct)])
        else:
            header.append(name)
            expanders.append(lambda v: ["" if v is None else format_cell(v)])
    buffer = io.StringIO()
    buffer.write(f"# {table.title}\n")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        writer.writerow([text for expand, value in zip(expanders, row) for text in expand(value)])
    for note in table.notes:
        buffer.write(f"# note: {note}\n")
    return buffer.getvalue()


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def render_latex(table: Table) -> str:
    spec = "l" * table.key_columns + "r" * (len(table.columns) - table.key_columns)
    lines = [f"% {table.title}", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(latex_escape(c) for c in table.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(format_cell(v)) for v in row) + r" \\" for row in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}"] + [f"% note: {note}" for note in table.notes]
    return "\n".join(lines) + "\n"


def render(table: Table, fmt: str = "markdown") -> str:
    renderers = {"markdown": render_markdown, "csv": render_csv, "latex": render_latex}
    if fmt not in renderers:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return renderers[fmt](table)
