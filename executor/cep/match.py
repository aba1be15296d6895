"""The pattern operator's matcher for one partition key: pure Python, no Spark.

Owns `PatternProgram` (a pattern operator's parsed pattern, automaton, typed conditions and
measures, time bound), `KeyMatcher` (the state of one key: rows waiting for the watermark, the
rows of open attempts, the attempts and their threads; `feed` takes a micro-batch's rows and
watermark and returns the completed matches; `to_json`/`from_json` for Spark's state store),
`step_threads` (one step of an attempt's threads by a row, which the stages of a pipelined
pattern, `executor.cep.stage`, share) and `measures` (one output row per match).

Semantics (docs/spec-language.md, "pattern"): rows are matched in event-time order (ties by their
values), once the watermark has passed them; a row at or before the watermark of the batch it
arrives in is late and dropped. An attempt starts at every row; its threads run the automaton in
preference order (greedy quantifiers, left alternatives first), each with its own mapping of rows
to variables, so a condition sees exactly the match it extends; when a thread completes, the
threads it is preferred over end. The match of an attempt is its most preferred completed thread,
final once no more preferred thread is alive. Attempts are decided in order of their first row;
after a match, matching resumes after its last row (SKIP PAST LAST ROW), or, with
`skip-to-next-row`, every start row keeps its own match (attempts are then independent of each
other). A thread ends when the next row lies more than `within` after its first row, or when the
watermark passes that bound.

A share (instance i of k, `PatternProgram.share`) starts attempts only at the rows it owns
(`owner`: a stable hash of the row, the same in every process), and still reads every row: k
instances with shares 1..k over the same rows find, together, exactly the matches of one
instance without a share, each once, when attempts are independent (`skip-to-next-row`). This is
the partitioning of the repetition's partial matches (docs/patterns.md, "The pattern operator").
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from common.types import Schema
from compiler import expr
from compiler.expr import pattern as pt
from executor.cep.row_eval import MatchView, Row, evaluate

MAX_PARTIAL_DEFAULT = 100_000
AFTER_MATCH = ("skip-past-last-row", "skip-to-next-row")


class PatternOverflow(RuntimeError):
    """A key would hold more partial matches than the operator's bound. Raised while a row is
    stepped, as the thread past the bound is made (`held`: the partial matches the key held
    then, never more than the bound), so a row of an alternation-heavy pattern cannot make
    branching-factor times the bound first. Deterministic: the same rows overflow again on a
    restart from the checkpoint, so retrying cannot heal it (`common.failures`)."""

    def __init__(self, holder: str, bound: int, held: int) -> None:
        super().__init__(f"{holder} would hold more than {bound:,} partial matches, the "
                         f"bound max-partial-matches={bound}; raise it, shorten within, or make "
                         "the pattern's conditions more selective")
        self.holder, self.bound, self.held = holder, bound, held

    def __reduce__(self) -> tuple[Any, ...]:  # pickles although its args are not __init__'s
        return (PatternOverflow, (self.holder, self.bound, self.held))


@dataclass(frozen=True)
class PatternProgram:
    stream: str
    schema: Schema
    time: str
    nfa: pt.Nfa
    defines: Mapping[str, expr.Expr]
    measures: tuple[tuple[str, expr.Expr], ...]
    within_us: int
    max_partial: int = MAX_PARTIAL_DEFAULT
    after_match: str = "skip-past-last-row"
    share: tuple[int, int] | None = None  # (i, k): starts only the attempts instance i owns

    @property
    def skips_past_match(self) -> bool:
        return self.after_match == "skip-past-last-row"

    def owns(self, text: str) -> bool:
        """Whether this instance starts the attempt at the row whose `row_text` this is
        (always, without a share)."""
        return self.share is None or owner_of_text(text, self.share[1]) == self.share[0]

    @property
    def variables(self) -> tuple[str, ...]:
        """The variables in name order: a thread's labels hold one letter per row, 'A' for the
        first of these (stable across restarts, as the state store needs)."""
        return tuple(sorted({s.var for s in self.nfa.states if s.kind == "var"}))


def row_text(row: Row) -> str:
    """A row's canonical JSON: what orders rows of equal time, and what decides their owner."""
    return json.dumps(row, sort_keys=True, default=str)


def owner(row: Row, shares: int) -> int:
    """The instance (1..shares) that starts the attempt at `row`: a CRC-32 of the row's canonical
    JSON, so every process, and a restarted one, agrees; equal rows have one owner."""
    return owner_of_text(row_text(row), shares)


def owner_of_text(text: str, shares: int) -> int:
    return zlib.crc32(text.encode("utf-8")) % shares + 1


def build_program(stream: str, schema: Schema, time: str, pattern: str,
                  defines: Sequence[tuple[str, str]], measures: Sequence[tuple[str, str]],
                  within_us: int, max_partial: int = MAX_PARTIAL_DEFAULT,
                  after_match: str = "skip-past-last-row", share: tuple[int, int] | None = None
                  ) -> tuple[PatternProgram, tuple[expr.TypedExpr, ...]]:
    """The program of a pattern operator and its measures' typed trees; ExpressionError as the
    compiler reports it (the validator checked the spec already; this re-checks the program);
    ValueError for an unknown after-match policy or a share that is not 1 <= i <= k."""
    if after_match not in AFTER_MATCH:
        raise ValueError(f"after-match {after_match!r} is not one of {', '.join(AFTER_MATCH)}")
    if share is not None and not (len(share) == 2 and 1 <= share[0] <= share[1]):
        raise ValueError(f"share {share!r} is not (i, k) with 1 <= i <= k")
    tree = pt.parse_pattern(pattern)
    scope = pt.PatternScope(stream, schema, pt.variables(tree))
    typed_defines = {name: pt.compile_define(text, scope).expr for name, text in defines}
    typed_measures = tuple(pt.compile_measure(text, scope) for _, text in measures)
    program = PatternProgram(stream, schema, time, pt.compile_nfa(tree), typed_defines,
                             tuple((n, t.expr) for (n, _), t in zip(measures, typed_measures)),
                             within_us, max_partial, after_match,
                             None if share is None else (int(share[0]), int(share[1])))
    return program, typed_measures


@dataclass
class Attempt:
    start: int  # sequence number of its first row
    start_ts: int
    threads: list[tuple[int, str]]  # (automaton state, labels: one variable index per row)
    candidate: str | None = None  # labels of the preferred completed match so far


@dataclass(frozen=True)
class Match:
    rows: tuple[Row, ...]
    labels: tuple[str, ...]


@dataclass
class KeyMatcher:
    """The matching state of one partition key."""

    program: PatternProgram
    processed_to: int | None = None  # rows at or before this time (us) are processed
    pending: list[Row] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)  # rows from sequence number `base` on
    base: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    late: int = 0

    def __post_init__(self) -> None:
        self._vars = self.program.variables

    def feed(self, batch: Sequence[Row], watermark_us: int | None) -> list[Match]:
        """Take a batch's rows; process every row at or before `watermark_us` (None: hold
        all) in time order; return the matches decided."""
        time = self.program.time
        for row in batch:
            ts = row.get(time)
            if ts is None or (self.processed_to is not None and ts <= self.processed_to):
                self.late += 1
                continue
            self.pending.append(row)
        if watermark_us is None:
            return []
        ready = sorted(((r[time], row_text(r), r) for r in self.pending if r[time] <= watermark_us),
                       key=lambda entry: entry[:2])
        self.pending = [r for r in self.pending if r[time] > watermark_us]
        out: list[Match] = []
        for _, text, row in ready:
            out += self._process(row, text)
        self.processed_to = watermark_us if self.processed_to is None else max(
            self.processed_to, watermark_us)
        for attempt in self.attempts:
            if attempt.start_ts + self.program.within_us <= watermark_us:
                attempt.threads = []
        out += self._decide()
        self._prune()
        return out

    def next_deadline(self) -> int | None:
        """The earliest time (us) the watermark must reach for this key to change: a waiting
        row's time or an open attempt's time bound."""
        times = [r[self.program.time] for r in self.pending]
        times += [a.start_ts + self.program.within_us for a in self.attempts if a.threads]
        return min(times) if times else None

    def idle(self) -> bool:
        return not self.pending and not self.attempts

    # -- the automaton --------------------------------------------------------------------------

    def _process(self, row: Row, text: str) -> list[Match]:
        seq = self.base + len(self.rows)
        self.rows.append(row)
        nfa = self.program.nfa
        if self.program.owns(text):
            self.attempts.append(Attempt(seq, row[self.program.time],
                                         [(pc, "") for pc in nfa.closure(nfa.start)]))
        held = 0  # the threads the attempts stepped so far made: counted as they are made
        for attempt in self.attempts:
            if attempt.threads:
                self._step(attempt, row, seq, held)
                held += len(attempt.threads)
        return self._decide()

    def _step(self, attempt: Attempt, row: Row, seq: int, held: int) -> None:
        if row[self.program.time] - attempt.start_ts > self.program.within_us:
            attempt.threads = []
            return
        rows = self.rows[attempt.start - self.base: seq - self.base + 1]
        attempt.threads, accepted = step_threads(self.program, self._vars, attempt.threads, rows,
                                                 Budget("one key", held))
        if accepted is not None:
            attempt.candidate = accepted

    def _decide(self) -> list[Match]:
        out: list[Match] = []
        names = self._vars
        while self.attempts and not self.attempts[0].threads:
            head = self.attempts.pop(0)
            if head.candidate is None:
                continue
            end = head.start + len(head.candidate) - 1
            rows = tuple(self.rows[head.start - self.base: end - self.base + 1])
            out.append(Match(rows, tuple(names[ord(c) - 65] for c in head.candidate)))
            if self.program.skips_past_match:
                self.attempts = [a for a in self.attempts if a.start > end]
        return out

    def _prune(self) -> None:
        keep_from = self.attempts[0].start if self.attempts else self.base + len(self.rows)
        del self.rows[:keep_from - self.base]
        self.base = keep_from

    # -- state store ----------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps({"p": self.processed_to, "w": self.pending, "r": self.rows,
                           "b": self.base, "l": self.late,
                           "a": [[a.start, a.start_ts, a.threads, a.candidate]
                                 for a in self.attempts]}, separators=(",", ":"))

    @classmethod
    def from_json(cls, program: PatternProgram, text: str) -> "KeyMatcher":
        data = json.loads(text)
        return cls(program, data["p"], data["w"], data["r"], data["b"],
                   [Attempt(s, t, [(pc, lb) for pc, lb in th], c) for s, t, th, c in data["a"]],
                   data["l"])


@dataclass(frozen=True)
class Budget:
    """What a step may make: the partial matches its holder (one key, or one stage of a key)
    already holds in the attempts stepped before this one; with the program's bound, the room
    left."""

    holder: str
    held: int


def step_threads(program: PatternProgram, names: tuple[str, ...],
                 threads: Sequence[tuple[int, str]], rows: Sequence[Row], budget: Budget
                 ) -> tuple[list[tuple[int, str]], str | None]:
    """One step of an attempt's threads (in preference order) by the last of `rows`, the
    attempt's rows from its first on (`names`: `program.variables`): the threads that go on and
    the labels of the match this row completes, if one does (the threads it is preferred over
    end). PatternOverflow as soon as the thread that would take the holder past
    `program.max_partial` is made (it is never stored). The time bound is the caller's to
    check."""
    nfa = program.nfa
    room = program.max_partial - budget.held
    new: list[tuple[int, str]] = []
    for pc, labels in threads:
        state = nfa.states[pc]
        extended = labels + chr(65 + names.index(state.var))
        if not _holds(program, state.var, rows, extended, names):
            continue
        for nxt in nfa.closure(state.next):
            if nfa.states[nxt].kind == "accept":
                return new, extended
            if len(new) >= room:
                raise PatternOverflow(budget.holder, program.max_partial, budget.held + len(new))
            new.append((nxt, extended))
    return new, None


def _holds(program: PatternProgram, var: str, rows: Sequence[Row], labels: str,
           names: tuple[str, ...]) -> bool:
    condition = program.defines.get(var)
    if condition is None:
        return True
    view = MatchView(rows, [names[ord(c) - 65] for c in labels], program.stream)
    return evaluate(condition, view) is True


def measures(program: PatternProgram, match: Match) -> tuple[Any, ...]:
    """The measure values of a complete match."""
    view = MatchView(match.rows, match.labels, program.stream)
    return tuple(evaluate(tree, view) for _, tree in program.measures)
