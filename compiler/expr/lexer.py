"""The expression language's tokenizer.

Owns `Token` and `tokenize`: expression text -> tokens, collecting every lexical problem (stray
characters with a hint for each, malformed numbers, unterminated strings, unknown escapes)
instead of stopping at the first. Does not own the grammar (`compiler.expr.parser`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from compiler.expr.ast import KEYWORDS, Problem


@dataclass(frozen=True)
class Token:
    """One lexical unit. kind: number, string, name, keyword, op, (, ), ",", ".", end."""

    kind: str
    text: str
    offset: int
    length: int
    value: Any = None

    def describe(self) -> str:
        if self.kind == "end":
            return "end of expression"
        if self.kind == "string":
            return f"the string {self.text}"
        if self.kind == "number":
            return f"the number {self.text}"
        if self.kind == "name":
            return f"the name '{self.text}'"
        if self.kind == "keyword":
            return f"the keyword '{self.text.lower()}'"
        return f"'{self.text}'"


_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TWO_CHAR_OPS = ("==", "!=", "<>", "<=", ">=")
_ONE_CHAR = {"=": "op", "<": "op", ">": "op", "+": "op", "-": "op", "*": "op", "/": "op",
             "%": "op", "(": "(", ")": ")", ",": ",", ".": "."}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t"}
_STRAY_HINTS = {
    "|": "strings are joined with concat(a, b); 'or' is the logical or",
    "&": "write 'and'",
    "!": "write 'not x' or 'a != b'",
    "`": "names are not quoted: write the column name as it is; text goes in '...'",
    "$": "there are no variables or substitutions in expressions",
    ";": "an expression is a single value; ';' has no meaning here",
    "[": "there are no arrays or indexing",
    "]": "there are no arrays or indexing",
    "{": "there are no blocks or substitutions",
    "}": "there are no blocks or substitutions",
    "#": "there are no comments in expressions",
    "\\": "backslash escapes are only allowed inside quoted strings",
}
_SPACE = " \t\r\n"


def tokenize(text: str) -> tuple[list[Token], list[Problem]]:
    """Split text into tokens; collects every lexical problem instead of stopping at the first."""
    tokens: list[Token] = []
    problems: list[Problem] = []
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if ch in _SPACE:
            pos += 1
            continue
        token, pos = _scan_one(text, pos, problems)
        if token is not None:
            tokens.append(token)
    tokens.append(Token("end", "", len(text), 0))
    return tokens, problems


def _scan_one(text: str, pos: int, problems: list[Problem]) -> tuple[Token | None, int]:
    ch = text[pos]
    if "0" <= ch <= "9":
        return _scan_number(text, pos, problems)
    if ch in "'\"":
        return _scan_string(text, pos, problems)
    m = _NAME.match(text, pos)
    if m:
        word = m.group()
        kind = "keyword" if word.lower() in KEYWORDS else "name"
        return Token(kind, word, pos, len(word)), m.end()
    two = text[pos:pos + 2]
    if two == "--":
        problems.append(Problem(pos, len(text) - pos, "'--' is not a comment: expressions have "
                                                      "no comments",
                                "remove it; write - -x (with a space) for a double negation"))
        return None, len(text)
    if two in _TWO_CHAR_OPS:
        return Token("op", two, pos, 2), pos + 2
    if ch in _ONE_CHAR:
        return Token(_ONE_CHAR[ch], ch, pos, 1), pos + 1
    problem = _stray_character(text, pos)
    problems.append(problem)
    return None, pos + problem.length


def _stray_character(text: str, pos: int) -> Problem:
    ch = text[pos]
    if ch == "|" and text[pos:pos + 2] == "||":
        return Problem(pos, 2, "'||' is not an operator of this language", _STRAY_HINTS["|"])
    if ord(ch) < 128 and ch.isprintable():
        return Problem(pos, 1, f"unexpected character '{ch}'",
                       _STRAY_HINTS.get(ch, "see docs/expressions.md for the grammar"))
    name = unicodedata.name(ch, "unnamed character")
    return Problem(pos, 1, f"unexpected character {ch!r} (U+{ord(ch):04X} {name})",
                   "names use ASCII letters, digits and '_' only; other text goes in quotes")


def _scan_number(text: str, pos: int, problems: list[Problem]) -> tuple[Token | None, int]:
    m = _NUMBER.match(text, pos)
    assert m is not None
    raw, end = m.group(), m.end()
    if end < len(text) and (text[end] == "." or text[end].isalnum() or text[end] == "_"):
        problems.append(Problem(pos, end + 1 - pos,
                                f"malformed number '{text[pos:end + 1]}'",
                                "numbers look like 42, 1.5 or 2e3"))
        while end < len(text) and (text[end].isalnum() or text[end] in "._"):
            end += 1
        return None, end
    is_double = m.group(1) is not None or m.group(2) is not None
    value: int | float = float(raw) if is_double else int(raw)
    if is_double and math.isinf(value):
        problems.append(Problem(pos, len(raw), f"number {raw} is too large for a double", ""))
        return None, end
    return Token("number", raw, pos, len(raw), value), end


def _scan_string(text: str, pos: int, problems: list[Problem]) -> tuple[Token | None, int]:
    quote, i = text[pos], pos + 1
    chars: list[str] = []
    while i < len(text):
        ch = text[i]
        if ch == quote:
            return Token("string", text[pos:i + 1], pos, i + 1 - pos, "".join(chars)), i + 1
        if ch == "\\":
            nxt = text[i + 1:i + 2]
            if nxt in _ESCAPES:
                chars.append(_ESCAPES[nxt])
            else:
                problems.append(Problem(i, 1 + len(nxt), f"unknown escape '\\{nxt}' in a string",
                                        "known escapes: \\\\ \\' \\\" \\n \\t"))
            i += 2
            continue
        chars.append(ch)
        i += 1
    problems.append(Problem(pos, len(text) - pos, f"unterminated string: no closing {quote}",
                            f"close the string with {quote}; write \\{quote} for a quote inside"))
    return None, len(text)
