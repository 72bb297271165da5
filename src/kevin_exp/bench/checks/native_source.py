"""C++/CUDA source as the compiler's preprocessor sees it, for the native rules: line splices joined, then one
left-to-right tokenising pass that finds comments, string/char literals (with their encoding prefixes), raw
strings, numbers (with digit separators) and identifiers exactly where the compiler does, so that nothing
can be hidden from the scans by a token the checks read differently (``1'0; system(...); 2'0``,
``FOOR"(" ...``, ``L'"'``). Every pattern here is linear-time: each match consumes its text and none has
nested or overlapping quantifiers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"(?P<lc>//[^\n]*)"
    r"|(?P<bc>/\*.*?(?:\*/|\Z))"
    r'|(?P<raw>(?:u8|[uUL])?R"(?P<d>[^()\\\s"]{0,16})\(.*?(?:\)(?P=d)"|\Z))'
    r'|(?P<str>(?:u8|[uUL])?"(?:\\.|[^"\\\n])*"?)'
    r"|(?P<chr>(?:u8|[uUL])?'(?:\\.|[^'\\\n])*'?)"
    r"|(?P<num>\.?\d(?:[eEpP][+-]|'\w|[\w.])*)"
    r"|(?P<id>\w+)"
    r"|(?P<ws>\s+)"
    r"|(?P<op>::|->|##|%:%:|%:|[^\w\s])",
    re.S,
)
# ??= ??/ ??' ??( ??) ??! ??< ??> ??-: with -trigraphs (or -std=c++14) ??/ is a line splice, ??= a `#`
TRIGRAPH = re.compile(r"\?\?[=/'()!<>\-]")


@dataclass(frozen=True)
class Token:
    kind: str  # "id", "num", "op"
    text: str
    pos: int  # offset in ``NativeSource.code``


@dataclass
class NativeSource:
    """One source text: ``code`` (comments blanked, literals emptied), ``with_strings`` (comments blanked),
    its significant tokens, its string literals' contents, and the constructs that hide tokens."""

    code: str
    with_strings: str
    tokens: list[Token]
    strings: list[str]
    raw_strings: int = 0
    trigraphs: int = 0
    hidden: list[tuple[str, int]] = field(default_factory=list)  # (construct, position in code)


def splice(text: str) -> str:
    return text.replace("\\\r\n", "").replace("\\\n", "")


def tokenize(text: str) -> NativeSource:
    """Tokenise one source (linear in its length)."""
    trigraphs = len(TRIGRAPH.findall(text))
    text = splice(text)
    code: list[str] = []
    kept: list[str] = []
    tokens: list[Token] = []
    strings: list[str] = []
    raw = 0
    hidden: list[tuple[str, int]] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        s = m.group(0)
        if kind in ("lc", "bc"):
            blank = " " + "\n" * s.count("\n")
            code.append(blank)
            kept.append(blank)
            pos += len(blank)
            continue
        if kind in ("raw", "str", "chr"):
            if kind == "raw":
                raw += 1
                hidden.append(("raw string literal", pos))
            strings.append(s)
            empty = '""' + "\n" * s.count("\n")
            code.append(empty)
            kept.append(s)
            pos += len(empty)
            continue
        if kind in ("id", "num", "op"):
            tokens.append(Token(kind, s, pos))
            if s in ("%:%:", "%:"):  # digraphs of ## and #
                hidden.append((f"digraph {s}", pos))
        code.append(s)
        kept.append(s)
        pos += len(s)
    return NativeSource("".join(code), "".join(kept), tokens, strings, raw, trigraphs, hidden)


def matching_parens(tokens: list[Token]) -> dict[int, int]:
    """Index of each ``(`` token -> index of its ``)`` (unbalanced ones are left out); one pass."""
    out: dict[int, int] = {}
    stack: list[int] = []
    for i, t in enumerate(tokens):
        if t.text == "(":
            stack.append(i)
        elif t.text == ")" and stack:
            out[stack.pop()] = i
    return out


_BODY_SKIP = frozenset(("const", "noexcept", "override", "final", "volatile", "&", "&&"))


def defined_functions(tokens: list[Token]) -> set[str]:
    """Names of functions defined (``name(params) [const] [noexcept] [-> type] {``) in one linear pass: the
    tokens between the parentheses contain no ``;``, ``{`` or ``}``, and at most 64 tokens of qualifiers and
    trailing return type separate ``)`` from ``{``."""
    parens = matching_parens(tokens)
    stops = [0]
    for t in tokens:
        stops.append(stops[-1] + (t.text in (";", "{", "}")))
    out: set[str] = set()
    for i in range(len(tokens) - 1):
        if tokens[i].kind != "id" or tokens[i + 1].text != "(":
            continue
        close = parens.get(i + 1)
        if close is None or stops[close] != stops[i + 2]:
            continue
        j = close + 1
        if j < len(tokens) and tokens[j].text == "->":
            j += 1
            while j < len(tokens) and j - close <= 64 and tokens[j].text not in ("{", ";", "}"):
                j += 1
        while j < len(tokens) and tokens[j].text in _BODY_SKIP:
            j += 1
        if j < len(tokens) and tokens[j].text == "{":
            out.add(tokens[i].text)
    return out
