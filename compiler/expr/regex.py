"""The regular expressions of the expression language (`regexp_like`, `regexp_extract`): a
closed subset of Java's syntax, checked when a spec is compiled.

Owns `check_regex` (pattern text -> its number of capturing groups, or every problem found, each
at a 0-based character position of the pattern) and the limits. Spark runs patterns with
`java.util.regex`, a backtracking engine: one pattern such as `(a+)+$` over a row of 30 `a`s and
a `b` can keep an executor's core busy for minutes. So only constructs that mean the same in
Java and in other common engines are accepted, and the ones that backtrack catastrophically are
refused with the reason: quantifiers nested inside quantified groups, quantified alternatives
that can start with the same character, quantifiers over what can match nothing,
backreferences, lookaround, inline flags and possessive quantifiers; repetition counts and the
pattern's length are bounded (docs/security.md). Pure: no `re`, no Spark; does not own lowering
(`executor.expression_lowering` passes the checked text to Spark as a literal).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

MAX_PATTERN_LENGTH = 256
MAX_REPEAT = 1000
MAX_GROUPS = 20

_ANY = None  # a character set too large to list: overlaps with every other set
_DIGITS = frozenset(string.digits)
_WORD = frozenset(string.ascii_letters + string.digits + "_")
_SPACE = frozenset(" \t\n\x0b\f\r")
_CLASS_ESCAPES: dict[str, "frozenset[str] | None"] = {
    "d": _DIGITS, "w": _WORD, "s": _SPACE, "D": _ANY, "W": _ANY, "S": _ANY}
_CHAR_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_META = frozenset("\\.^$|?*+()[]{}")
_LARGEST_LISTED_RANGE = 256
_END = "end of pattern"  # what `peek` returns past the end: no character, no substring of one


@dataclass(frozen=True)
class RegexProblem:
    """One thing wrong with a pattern, at a 0-based character position of the pattern."""

    position: int
    message: str


@dataclass
class _Node:
    """kind: char (chars), anchor, group (alternatives), repeat (body, low, high)."""

    kind: str
    position: int
    chars: "frozenset[str] | None" = frozenset()
    alternatives: "list[list[_Node]]" = field(default_factory=list)
    body: "_Node | None" = None
    low: int = 0
    high: "int | None" = None


def check_regex(pattern: str) -> tuple[int, list[RegexProblem]]:
    """(number of capturing groups, problems) of `pattern`; no problems means it is accepted."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        return 0, [RegexProblem(MAX_PATTERN_LENGTH, f"the pattern is {len(pattern)} characters "
                                f"long; the limit is {MAX_PATTERN_LENGTH}")]
    reader = _Reader(pattern)
    tree = reader.alternation(0)
    if not reader.problems and reader.pos < len(pattern):
        reader.problem("')' without a matching '('; write \\) for a parenthesis")
    if not reader.problems:
        _backtracking_problems(tree, reader.problems)
    if reader.groups > MAX_GROUPS:
        reader.problems.append(RegexProblem(0, f"the pattern has {reader.groups} groups; the "
                                               f"limit is {MAX_GROUPS}"))
    return reader.groups, sorted(reader.problems, key=lambda p: p.position)


class _Reader:
    """Recursive descent over the pattern's characters; nesting is bounded by the length."""

    def __init__(self, pattern: str):
        self.text = pattern
        self.pos = 0
        self.groups = 0
        self.problems: list[RegexProblem] = []

    def problem(self, message: str, position: int | None = None) -> None:
        self.problems.append(RegexProblem(self.pos if position is None else position, message))

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else _END

    def alternation(self, depth: int) -> _Node:
        start = self.pos
        alternatives = [self.sequence(depth)]
        while self.peek() == "|":
            self.pos += 1
            alternatives.append(self.sequence(depth))
        return _Node("group", start, alternatives=alternatives)

    def sequence(self, depth: int) -> list[_Node]:
        items: list[_Node] = []
        while self.peek() not in (_END, "|", ")") and not self.problems:
            atom = self.atom(depth)
            if atom is not None:
                items.append(self.quantified(atom))
        return items

    def atom(self, depth: int) -> _Node | None:
        ch, at = self.peek(), self.pos
        if ch in "*+?":
            self.problem(f"'{ch}' has nothing to repeat; write \\{ch} for the character itself")
            return None
        if ch == "{":
            self.problem("'{' must follow something to repeat, as in a{2,5}; write \\{ for the "
                         "character itself")
            return None
        if ch in "]}":
            self.problem(f"write \\{ch} for the character '{ch}'")
            return None
        self.pos += 1
        if ch == "(":
            return self.group(at, depth)
        if ch == "[":
            return _Node("char", at, chars=self.char_class(at))
        if ch == "\\":
            return _Node("char", at, chars=self.escape(in_class=False))
        if ch in "^$":
            return _Node("anchor", at)
        if ch == ".":
            return _Node("char", at, chars=_ANY)
        return _Node("char", at, chars=frozenset(ch))

    def group(self, at: int, depth: int) -> _Node | None:
        if self.text.startswith("?:", self.pos):
            self.pos += 2
        elif self.peek() == "?":
            self.problem(_special_group(self.text[self.pos:self.pos + 3]), at)
            return None
        else:
            self.groups += 1
        node = self.alternation(depth + 1)
        if self.peek() != ")":
            if not self.problems:
                self.problem(f"the '(' at character {at + 1} is not closed", at)
            return None
        self.pos += 1
        node.position = at
        return node

    def quantified(self, atom: _Node) -> _Node:
        bounds = self.quantifier()
        if bounds is None:
            return atom
        low, high, at = bounds
        if self.peek() == "?":
            self.pos += 1  # lazy: the same matches, tried in another order
        if self.peek() == "+":
            self.problem("possessive quantifiers ('*+', '++', ...) are not supported")
        elif self.peek() in ("*", "+", "?", "{"):
            self.problem("a quantifier cannot follow a quantifier; put the first in a group "
                         "only if the group is not repeated")
        if atom.kind == "anchor":
            self.problem("'^' and '$' cannot be repeated", at)
        return _Node("repeat", at, body=atom, low=low, high=high)

    def quantifier(self) -> tuple[int, int | None, int] | None:
        ch, at = self.peek(), self.pos
        if ch in "*+?":
            self.pos += 1
            return (0 if ch != "+" else 1), (1 if ch == "?" else None), at
        if ch != "{":
            return None
        end = self.text.find("}", at)
        body = self.text[at + 1:end] if end > at else ""
        low_text, comma, high_text = body.partition(",")
        if end < 0 or not low_text.isdigit() or not (high_text.isdigit() or high_text == ""):
            self.problem("a repetition count is written {n}, {n,} or {n,m}; write \\{ for the "
                         "character '{'")
            return None
        self.pos = end + 1
        low = int(low_text)
        high = low if not comma else (int(high_text) if high_text else None)
        if max(low, high or 0) > MAX_REPEAT:
            self.problem(f"repetition counts are limited to {MAX_REPEAT}", at)
        elif high is not None and high < low:
            self.problem(f"{{{body}}}: the upper count is below the lower", at)
        return low, high, at

    def escape(self, in_class: bool) -> "frozenset[str] | None":
        at = self.pos - 1
        ch = self.peek()
        self.pos += 1
        if ch == _END:
            self.problem("the pattern ends with a lone backslash", at)
            return frozenset()
        if ch in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[ch]
        if ch in _CHAR_ESCAPES:
            return frozenset(_CHAR_ESCAPES[ch])
        if ch.isdigit():
            self.problem("backreferences (\\1, ...) and octal escapes are refused: they make "
                         "matching backtrack exponentially", at)
        elif ch == "k":
            self.problem("backreferences (\\k<name>) are refused: they make matching backtrack "
                         "exponentially", at)
        elif ch.isascii() and ch.isalpha():
            self.problem(f"the escape '\\{ch}' is not supported (supported: \\d \\D \\w \\W \\s "
                         "\\S \\t \\n \\r \\f and a backslash before punctuation)", at)
        elif not ch.isascii():
            self.problem(f"write the character {ch!r} without a backslash", at)
        return frozenset(ch)

    def char_class(self, at: int) -> "frozenset[str] | None":
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        chars: set[str] = set()
        large = False
        if self.peek() == "]":
            self.problem("a character class needs a character; write \\] for ']'")
            return frozenset()
        while self.peek() != "]":
            if self.peek() == _END:
                self.problem(f"the '[' at character {at + 1} is not closed", at)
                return frozenset()
            item = self.class_item()
            if item is None:
                large = True
            else:
                chars |= item
        self.pos += 1
        if negated or large or not chars:
            return _ANY
        return frozenset(chars)

    def class_item(self) -> "frozenset[str] | None":
        first = self.class_char()
        if self.peek() != "-" or self.text[self.pos + 1:self.pos + 2] == "]":
            if self.peek() == "-":
                self.problem("write \\- for a '-' in a character class")
                self.pos += 1
            return first if isinstance(first, frozenset) or first is None else frozenset(first)
        self.pos += 1
        last = self.class_char()
        if not (isinstance(first, str) and isinstance(last, str)):
            self.problem("a range in a character class runs between two single characters")
            return frozenset()
        if ord(last) < ord(first):
            self.problem(f"the range {first}-{last} runs backwards")
            return frozenset()
        if ord(last) - ord(first) >= _LARGEST_LISTED_RANGE:
            return _ANY
        return frozenset(chr(c) for c in range(ord(first), ord(last) + 1))

    def class_char(self) -> "str | frozenset[str] | None":
        """A single character (str), or a set (an escape such as \\d), or None (too large)."""
        ch = self.peek()
        if ch == _END:
            return frozenset()  # the class is reported as not closed
        self.pos += 1
        if ch == "\\":
            found = self.escape(in_class=True)
            if found is not None and len(found) == 1:
                return next(iter(found))
            return found
        if ch == "[":
            self.problem("write \\[ for a '[' in a character class (Java would read a nested "
                         "class)", self.pos - 1)
        elif ch == "&" and self.peek() == "&":
            self.problem("'&&' (Java's class intersection) is not supported; write \\& for '&'",
                         self.pos - 1)
        elif ch == "-":
            self.problem("write \\- for a '-' in a character class", self.pos - 1)
        return ch


def _special_group(text: str) -> str:
    if text.startswith(("?=", "?!", "?<=", "?<!")):
        return "lookaround ((?=, (?!, (?<=, (?<!) is refused: it can make matching backtrack " \
               "without bound"
    if text.startswith(("?<", "?P")):
        return "named groups are not supported; use (...) and its number"
    return "inline flags and special groups ((?i), (?>, ...) are not supported; only (...) " \
           "and (?:...)"


# --- catastrophic backtracking --------------------------------------------------------------


def _backtracking_problems(tree: _Node, problems: list[RegexProblem]) -> None:
    for node in _nodes(tree):
        if node.kind != "repeat" or node.body is None:
            continue
        body = node.body
        inner = [n for n in _nodes(body) if n.kind == "repeat"]
        if inner:
            problems.append(RegexProblem(node.position, "a quantifier over a group that "
                                         "contains another quantifier (as in (a+)+) is refused: "
                                         "it can backtrack exponentially; repeat the inner part "
                                         "only"))
        elif _nullable(body):
            problems.append(RegexProblem(node.position, "a quantifier over something that can "
                                         "match nothing is refused"))
        elif any(_overlapping(n) for n in _nodes(body) if n.kind == "group"):
            problems.append(RegexProblem(node.position, "a quantified alternation whose "
                                         "branches can start with the same character (as in "
                                         "(a|ab)*) is refused: it can backtrack exponentially"))


def _nodes(node: _Node) -> list[_Node]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        if n.body is not None:
            stack.append(n.body)
        for alternative in n.alternatives:
            stack.extend(alternative)
    return out


def _nullable(node: _Node) -> bool:
    if node.kind == "anchor":
        return True
    if node.kind == "repeat":
        return node.low == 0 or (node.body is not None and _nullable(node.body))
    if node.kind == "group":
        return any(all(_nullable(n) for n in alt) for alt in node.alternatives)
    return False


def _first(items: list[_Node]) -> "frozenset[str] | None":
    """The characters a sequence can start with (None: too many to list)."""
    found: set[str] = set()
    for node in items:
        chars = _first_of(node)
        if chars is None:
            return None
        found |= chars
        if not _nullable(node):
            break
    return frozenset(found)


def _first_of(node: _Node) -> "frozenset[str] | None":
    if node.kind == "char":
        return node.chars
    if node.kind == "anchor":
        return frozenset()
    if node.kind == "repeat":
        return _first_of(node.body) if node.body is not None else frozenset()
    sets = [_first(alt) for alt in node.alternatives]
    if any(s is None for s in sets):
        return None
    return frozenset().union(*[s for s in sets if s is not None])


def _overlapping(group: _Node) -> bool:
    """Two alternatives of the group can start with the same character."""
    seen: set[str] = set()
    for alternative in group.alternatives if len(group.alternatives) > 1 else ():
        first = _first(alternative)
        if first is None or first & seen:
            return True
        seen |= first
    return False
