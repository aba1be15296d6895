"""Source positions and user-facing diagnostics.

Owns the `Position` of anything a user wrote (file, line, column) and the `Diagnostic` that
points at it. Every checker collects diagnostics instead of raising on the first problem, so a
user sees all of them in one run. Rendering is `file:line:column: error: message (hint)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Position:
    """A place in a user's file; line and column are 1-based."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    def shifted(self, columns: int) -> "Position":
        """The position `columns` characters further along the same line."""
        return Position(self.file, self.line, self.column + columns)


@dataclass(frozen=True)
class Diagnostic:
    """One problem found in user input, with where it is and what to do about it."""

    position: Position
    message: str
    hint: str = ""
    severity: Severity = "error"

    def render(self) -> str:
        text = f"{self.position}: {self.severity}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


class SpecError(Exception):
    """Raised when user input has one or more errors; carries every diagnostic found."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics: tuple[Diagnostic, ...] = tuple(sorted(diagnostics, key=_sort_key))
        super().__init__("\n".join(d.render() for d in self.diagnostics))


def _sort_key(d: Diagnostic) -> tuple[str, int, int, str]:
    return (d.position.file, d.position.line, d.position.column, d.message)


# A hint lists at most this many known names, and looks for a close one among at most
# SUGGEST_POOL of them (those sharing the word's first letter, nearest in length): in a spec of
# thousands of names each hint stays short and costs time linear in the names.
SUGGEST_LISTED = 20
SUGGEST_POOL = 500


def suggest(word: str, choices: Iterable[str], label: str) -> str:
    """A hint for an unknown name: the closest known one, if any, and the known ones."""
    import difflib
    import heapq

    known = list(dict.fromkeys(choices))
    listed = heapq.nsmallest(SUGGEST_LISTED, known)
    if len(known) > SUGGEST_LISTED:
        listed.append(f"... ({len(known)} in all)")
    pool = known
    if len(known) > SUGGEST_POOL:
        first = word[:1].casefold()
        same = [k for k in known if k[:1].casefold() == first]
        pool = heapq.nsmallest(SUGGEST_POOL, same, key=lambda k: abs(len(k) - len(word)))
    close = difflib.get_close_matches(word, sorted(pool), n=1, cutoff=0.6)
    listing = f"{label}: {', '.join(listed)}" if known else f"no {label} are declared"
    return f"did you mean '{close[0]}'? {listing}" if close else listing


# At most this many errors, and this many warnings, are shown; past them a last diagnostic says
# how many more there are (docs/spec-language.md, "Bounds"). Checkers stop elaborating (hints,
# suggestions) past it, so a spec full of errors is checked in time linear in its size.
MAX_SHOWN = 200


def cap_diagnostics(diagnostics: Iterable[Diagnostic], limit: int = MAX_SHOWN) -> list[Diagnostic]:
    """The first `limit` errors and the first `limit` warnings, by position, and, if any were left
    out, one more diagnostic (an error when errors were) at the first one left out that says
    how many."""
    ordered = sorted(diagnostics, key=_sort_key)
    kept: list[Diagnostic] = []
    left_out: list[Diagnostic] = []
    counts = {"error": 0, "warning": 0}
    for d in ordered:
        counts[d.severity] += 1
        (kept if counts[d.severity] <= limit else left_out).append(d)
    if not left_out:
        return kept
    first = left_out[0]
    severity: Severity = "error" if any(d.severity == "error" for d in left_out) else "warning"
    kept.append(Diagnostic(first.position, f"{len(left_out)} more problems not shown (only the "
                                           f"first {limit} errors and {limit} warnings are)",
                           "fix the problems above and check the spec again", severity))
    return kept
