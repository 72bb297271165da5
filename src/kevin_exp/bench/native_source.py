"""C++/CUDA source as the compiler's preprocessor sees it, for the native rules (``checks/native``) and the
build's spec checks (``build/spec_check``): line splices joined, then one left-to-right tokenising pass that
finds comments, string/char literals (with their encoding prefixes), raw strings, numbers (with digit
separators) and identifiers exactly where the compiler does, so that nothing can be hidden from the scans by a
token the checks read differently (``1'0; system(...); 2'0``, ``FOOR"(" ...``, ``L'"'``). Every pattern here
is linear-time: each match consumes its text and none has nested or overlapping quantifiers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# Literals and comments, with everything else consumed in large chunks of "code" (numbers with digit
# separators and identifiers whole, possessively: no backtracking), so that a quote or slash is only read as
# the start of a literal or comment where the compiler reads it so. An identifier directly followed by a
# quote is matched on its own (``id``): it may be a literal's encoding prefix.
_LEXEME = re.compile(
    r"(?P<code>(?:\.?\d(?:[eEpP][+-]|'\w|[\w.])*+|[A-Za-z_]\w*+(?![\"'])|[^\"'/\w]|/(?![/*]))++)"
    r"|(?P<lc>//[^\n]*)"
    r"|(?P<bc>/\*.*?(?:\*/|\Z))"
    r'|(?P<raw>(?<!\w)(?:u8|[uUL])?R"(?P<d>[^()\\\s"]{0,16})\(.*?(?:\)(?P=d)"|\Z))'
    r'|(?P<str>(?:(?<!\w)(?:u8|[uUL]))?"(?:\\.|[^"\\\n])*+"?)'
    r"|(?P<chr>(?:(?<!\w)(?:u8|[uUL]))?'(?:\\.|[^'\\\n])*+'?)"
    r"|(?P<id>\w+)",
    re.S,
)
_TOKEN = re.compile(r"\w+|::|->|%:%:|%:|##|[^\w\s]")
# ??= ??/ ??' ??( ??) ??! ??< ??> ??-: with -trigraphs (or -std=c++14) ??/ is a line splice, ??= a `#`
TRIGRAPH = re.compile(r"\?\?[=/'()!<>\-]")


def is_word(token: str) -> bool:
    """An identifier, keyword or number (not punctuation)."""
    return token[0].isalnum() or token[0] == "_"


@dataclass
class NativeSource:
    """One source text: ``code`` (comments blanked, literals emptied), ``with_strings`` (comments blanked),
    its significant tokens, its string literals' contents, and the constructs that hide tokens."""

    code: str
    with_strings: str
    tokens: list[str]  # significant tokens of ``code``
    positions: list[int]  # each token's offset in ``code``
    strings: list[str]
    string_at: dict[int, str]  # offset of an emptied literal in ``code`` -> the literal
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
    strings: list[str] = []
    string_at: dict[int, str] = {}
    raw = 0
    hidden: list[tuple[str, int]] = []
    pos = 0
    for m in _LEXEME.finditer(text):
        kind = m.lastgroup
        s = m.group(0)
        if kind == "code" or kind == "id":
            code.append(s)
            kept.append(s)
            pos += len(s)
        elif kind in ("lc", "bc"):
            blank = " " + "\n" * s.count("\n")
            code.append(blank)
            kept.append(blank)
            pos += len(blank)
        else:
            if kind == "raw":
                raw += 1
                hidden.append(("raw string literal", pos))
            strings.append(s)
            string_at[pos] = s
            empty = '""' + "\n" * s.count("\n")
            code.append(empty)
            kept.append(s)
            pos += len(empty)
    stripped = "".join(code)
    tokens = _TOKEN.findall(stripped)
    positions = [m.start() for m in _TOKEN.finditer(stripped)]
    if "%:" in stripped:  # digraphs of ## and #
        hidden += [(f"digraph {t}", p) for t, p in zip(tokens, positions) if t in ("%:%:", "%:")]
    return NativeSource(stripped, "".join(kept), tokens, positions, strings, string_at, raw, trigraphs, hidden)


def matching_parens(tokens: list[str]) -> dict[int, int]:
    """Index of each ``(`` token -> index of its ``)`` (unbalanced ones are left out); one pass."""
    out: dict[int, int] = {}
    stack: list[int] = []
    for i, t in enumerate(tokens):
        if t == "(":
            stack.append(i)
        elif t == ")" and stack:
            out[stack.pop()] = i
    return out


_BODY_SKIP = frozenset(("const", "noexcept", "override", "final", "volatile", "&", "&&"))


def defined_functions(tokens: list[str]) -> set[str]:
    """Names of functions defined (``name(params) [const] [noexcept] [-> type] {``) in one linear pass: the
    tokens between the parentheses contain no ``;``, ``{`` or ``}``, and at most 64 tokens of qualifiers and
    trailing return type separate ``)`` from ``{``."""
    parens = matching_parens(tokens)
    stops = [0]
    for t in tokens:
        stops.append(stops[-1] + (t in (";", "{", "}")))
    out: set[str] = set()
    for i in range(len(tokens) - 1):
        if tokens[i + 1] != "(" or not is_word(tokens[i]):
            continue
        close = parens.get(i + 1)
        if close is None or stops[close] != stops[i + 2]:
            continue
        j = close + 1
        if j < len(tokens) and tokens[j] == "->":
            j += 1
            while j < len(tokens) and j - close <= 64 and tokens[j] not in ("{", ";", "}"):
                j += 1
        while j < len(tokens) and tokens[j] in _BODY_SKIP:
            j += 1
        if j < len(tokens) and tokens[j] == "{":
            out.add(tokens[i])
    return out
