"""One stage of a pattern operator pipelined over k stages: pure Python, no Spark.

Owns `Stage` (which of k stages, and how many rows an attempt holds before it moves on),
`Item` (what crosses the channel from one stage to the next: a row, an attempt handed on, a
match found, a progress tick; `encode`, and `decode` that checks untrusted text whole) and
`StageMatcher` (one partition key's state in one stage; `feed_rows` for the first stage,
`feed_items` for the others; `to_json`/`from_json` for Spark's state store). The Spark side is
`executor.cep.spark.stage_frame`; the automaton is `executor.cep.match` (`step_threads`).

Semantics: the paper's P+ = P v (P P+) over k stages. An attempt (a partial match and its own
rows) starts in stage 1 at every row and steps, row by row, as `KeyMatcher` steps it; once it
holds i*n rows in stage i < k, it is handed on, right after the row it consumed, and stage i+1
steps it with the rows that follow. Every stage but the last forwards the rows it processes.
An attempt with no live thread is decided at once (attempts are independent: only
`skip-to-next-row` programs without a share run in a pipeline): its preferred completed
thread, if any, becomes a match item, which the later stages pass on and the last returns.
A stage's progress (stage 1: its watermark; later stages: the latest tick of the stage before,
or the watermark given, whichever is later) ends the threads of attempts whose time bound it
passed; each call of a stage but the last ends with a tick at its progress. Together, the k
stages find exactly the matches of one `KeyMatcher` with `skip-to-next-row` over the same rows.

Order: the items a call returns are in non-decreasing time (a stable sort: the tick and the
matches decided at the end of a call move before items of a later time, which only says
earlier what stays true). A later stage must get its items in the order its stage before
returned them, call after call; its watermark must lie before the time of every item still to
come.

Item text (`Item.encode`, compact JSON, NaN and infinities as `json` writes them, ASCII):
`["row",{column: value, ...}]`, `["attempt",[start_ts,[[pc,"labels"],...],candidate,[row,...]]]`
(labels: one letter per row, 'A' for the first of `PatternProgram.variables`; candidate null or
such labels), `["match",[measure value, ...]]`, `["tick",null]`. The item's time travels beside
the text. `Item.decode` accepts only items of that shape for the program (JSON spelling aside:
spacing, escapes and number forms are JSON's), checked whole.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from common.types import ColumnType
from executor.cep.row_eval import Row
from executor.cep.match import (Budget, Match, PatternOverflow, PatternProgram, measures, row_text,
                                step_threads)

Thread = tuple[int, str]  # (automaton state, labels: one variable letter per row)
KINDS = ("row", "attempt", "match", "tick")
MAX_ITEM_TEXT = 16 * 1024 * 1024  # characters of one item's text
INT_MIN, INT_MAX = -2**63, 2**63 - 1


@dataclass(frozen=True)
class Stage:
    """Stage `index` of `count`; stage i < count hands an attempt on once it holds i*`rows`
    rows (the last stage keeps every attempt until it is decided)."""

    index: int
    count: int
    rows: int

    def __post_init__(self) -> None:
        for name in ("index", "count", "rows"):
            if type(getattr(self, name)) is not int:
                raise ValueError(f"stage {name} {getattr(self, name)!r} is not a whole number")
        if self.count < 2:
            raise ValueError(f"a pipeline has at least 2 stages, not {self.count}")
        if not 1 <= self.index <= self.count:
            raise ValueError(f"stage {self.index} is not one of stages 1 to {self.count}")
        if self.rows < 1:
            raise ValueError(f"a stage holds at least 1 row of an attempt, not {self.rows}")

    @property
    def last(self) -> bool:
        return self.index == self.count

    @property
    def hands_on_at(self) -> int | None:
        """How many rows an attempt holds when it leaves this stage (None: the last stage)."""
        return None if self.last else self.index * self.rows


@dataclass(frozen=True)
class Carried:
    """An attempt on its way to the next stage: its first row's time, its live threads in
    preference order, its preferred completed match so far, and its rows from the first on."""

    start_ts: int
    threads: tuple[Thread, ...]
    candidate: str | None
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Item:
    """What one stage writes for the next. `time` (us) orders it; `body`: a row (the row's
    dict), an attempt (`Carried`), a match (the list of its measure values) or a tick (None)."""

    kind: str
    time: int
    body: Any

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"item kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def encode(self) -> str:
        """The item's compact JSON text (the module docstring shows its shape)."""
        body = self.body
        if self.kind == "attempt":
            body = [body.start_ts, [list(t) for t in body.threads], body.candidate,
                    list(body.rows)]
        return json.dumps([self.kind, body], separators=(",", ":"))

    @classmethod
    def decode(cls, text: str, time: int, program: PatternProgram) -> "Item":
        """The item `text` (from a channel: untrusted) at `time`; ValueError saying what is
        wrong unless it is an item of `program`, checked whole."""
        if type(time) is not int or not INT_MIN <= time <= INT_MAX:
            raise ValueError(f"item time {time!r} is not a 64-bit whole number")
        data = _parse(text)
        if not (type(data) is list and len(data) == 2 and data[0] in KINDS):
            raise ValueError("an item is [kind, body] with kind one of " + ", ".join(KINDS))
        kind, body = data
        if kind == "row":
            item = cls(kind, time, _row_item(body, time, program))
        elif kind == "attempt":
            item = cls(kind, time, _attempt_item(body, time, program))
        elif kind == "match":
            item = cls(kind, time, _match_item(body, program))
        else:
            if body is not None:
                raise ValueError("a tick's body is null")
            item = cls(kind, time, None)
        return item


def carrier_order(items: Sequence[tuple[Item, int, int]]) -> list[Item]:
    """One key's items of a micro-batch, given with their time and their place in the output
    of the call that wrote them, in the order a later stage must take them: by time, a tick
    after everything else of its time, then by place. Rows and attempts of one time all come
    from one call of the stage before (it processes rows of equal time together, and a
    micro-batch holds whole calls), so their places order them; a tick at P says the stage
    before has processed every row at or before P, so it goes after the rows at P even when a
    later call wrote it; matches may go anywhere."""
    ranked = sorted(items, key=lambda entry: (entry[1], entry[0].kind == "tick", entry[2]))
    return [item for item, _, _ in ranked]


# ------------------------------------------------------------------------- checking decoded text

def _parse(text: str) -> Any:
    if type(text) is not str:
        raise ValueError(f"an item text is a string, not {type(text).__name__}")
    if len(text) > MAX_ITEM_TEXT:
        raise ValueError(f"an item text of {len(text)} characters is over the limit "
                         f"of {MAX_ITEM_TEXT}")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the item text nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and numbers of too many digits
        raise ValueError(f"the item text is not JSON: {exc}") from None


def _whole(value: Any) -> bool:
    return type(value) is int and INT_MIN <= value <= INT_MAX


_KINDS_OF = {ColumnType.INT: "a 64-bit whole number",
             ColumnType.TIMESTAMP: "a 64-bit whole number", ColumnType.DOUBLE: "a double",
             ColumnType.STRING: "a string", ColumnType.BOOLEAN: "true or false"}


def _fits(value: Any, kind: ColumnType) -> bool:
    if value is None:
        return True
    if kind in (ColumnType.INT, ColumnType.TIMESTAMP):
        return _whole(value)
    if kind is ColumnType.DOUBLE:
        return type(value) is float
    if kind is ColumnType.STRING:
        return type(value) is str
    return type(value) is bool


def _row(value: Any, program: PatternProgram, what: str) -> tuple[Row, int]:
    """A row of the program's schema and its time; ValueError naming `what` otherwise."""
    if type(value) is not dict:
        raise ValueError(f"{what} is not an object of column values")
    names = program.schema.names
    if set(value) != set(names):
        missing = [n for n in names if n not in value]
        unknown = [k for k in value if k not in names][:3]
        raise ValueError(f"{what} does not have the columns {', '.join(names)}: "
                         f"missing {missing}, unknown {unknown!r:.80}")
    for f in program.schema:
        if not _fits(value[f.name], f.type):
            raise ValueError(f"{what}: column {f.name!r} is {_KINDS_OF[f.type]} or null, "
                             f"not {value[f.name]!r:.40}")
    ts = value[program.time]
    if not _whole(ts):
        raise ValueError(f"{what} has no time in {program.time!r}")
    return value, ts


def _row_item(body: Any, time: int, program: PatternProgram) -> Row:
    row, ts = _row(body, program, "a row item")
    if ts != time:
        raise ValueError(f"a row item at {time} holds a row at {ts}")
    return row


def _labels(value: Any, letters: int, what: str) -> str:
    if type(value) is not str or not value or any(
            not "A" <= c <= chr(64 + letters) for c in value):
        raise ValueError(f"{what} {value!r:.40} is not labels of letters A to {chr(64 + letters)}")
    return value


def _attempt_item(body: Any, time: int, program: PatternProgram) -> Carried:
    if not (type(body) is list and len(body) == 4):
        raise ValueError("an attempt item is [start_ts, threads, candidate, rows]")
    start_ts, threads, candidate, rows = body
    if not (type(rows) is list and rows):
        raise ValueError("an attempt item holds a non-empty list of rows")
    checked = [_row(r, program, f"row {i} of an attempt item")[0] for i, r in enumerate(rows)]
    times = [r[program.time] for r in checked]
    if not _whole(start_ts) or start_ts != times[0] or times != sorted(times):
        raise ValueError(f"an attempt item's rows are not in time order from its start "
                         f"{start_ts!r:.40}")
    if times[-1] > time or times[-1] - times[0] > program.within_us:
        raise ValueError(f"an attempt item at {time} holds rows from {times[0]} to {times[-1]}")
    if not (type(threads) is list and 1 <= len(threads) <= program.max_partial):
        raise ValueError(f"an attempt item has 1 to {program.max_partial} threads")
    letters = len(program.variables)
    states = program.nfa.states
    parsed: list[Thread] = []
    for thread in threads:
        if not (type(thread) is list and len(thread) == 2 and type(thread[0]) is int
                and 0 <= thread[0] < len(states) and states[thread[0]].kind == "var"):
            raise ValueError(f"thread {thread!r:.40} of an attempt item is not "
                             "[automaton state, labels]")
        labels = _labels(thread[1], letters, "a thread's labels")
        if len(labels) != len(rows):
            raise ValueError(f"a thread's labels {labels!r:.40} do not label the attempt's "
                             f"{len(rows)} rows")
        parsed.append((thread[0], labels))
    if candidate is not None:
        _labels(candidate, letters, "an attempt item's candidate")
        if len(candidate) > len(rows):
            raise ValueError("an attempt item's candidate labels more rows than it holds")
    return Carried(start_ts, tuple(parsed), candidate, tuple(checked))


def _match_item(body: Any, program: PatternProgram) -> list[Any]:
    if not (type(body) is list and len(body) == len(program.measures)):
        raise ValueError(f"a match item is a list of {len(program.measures)} measure values")
    for value in body:
        if not (value is None or type(value) in (bool, float, str) or _whole(value)):
            raise ValueError(f"measure value {value!r:.40} is not a scalar")
    return body


# ------------------------------------------------------------------------------------ matching

@dataclass
class Held:
    """An attempt a stage holds: its first row's time, live threads, candidate, own rows."""

    start_ts: int
    threads: list[Thread]
    candidate: str | None
    rows: list[Row]

    def carried(self) -> Carried:
        return Carried(self.start_ts, tuple(self.threads), self.candidate, tuple(self.rows))

    @classmethod
    def of(cls, carried: Carried) -> "Held":
        return cls(carried.start_ts, list(carried.threads), carried.candidate,
                   list(carried.rows))


class StageMatcher:
    """The state of one partition key in one stage of a pipelined pattern operator."""

    def __init__(self, program: PatternProgram, stage: Stage) -> None:
        if program.after_match != "skip-to-next-row":
            raise ValueError(f"a pattern runs in stages only with after-match skip-to-next-row, "
                             f"not {program.after_match}")
        if program.share is not None:
            raise ValueError(f"a pattern with a share {program.share} cannot run in stages")
        self.program = program
        self.stage = stage
        self.progress: int | None = None  # stage 1: rows at or before this time are processed
        self.pending: list[Row] = []  # stage 1: rows waiting for the watermark
        self.late = 0  # stage 1: rows dropped as late
        self.attempts: list[Held] = []
        self._names = program.variables

    # -- feeding --------------------------------------------------------------------------------

    def feed_rows(self, batch: Sequence[Row], watermark_us: int | None) -> list[Item]:
        """Stage 1: take a batch's rows as `KeyMatcher.feed` does (late rows dropped, the others
        processed in (time, row text) order once `watermark_us` passes them) and return the
        items for stage 2."""
        if self.stage.index != 1:
            raise ValueError(f"stage {self.stage.index} reads items, not rows")
        time = self.program.time
        for row in batch:
            ts = row.get(time)
            if ts is None or (self.progress is not None and ts <= self.progress):
                self.late += 1
            else:
                self.pending.append(row)
        out: list[Item] = []
        if watermark_us is not None:
            ready = sorted(((r[time], row_text(r), r) for r in self.pending
                            if r[time] <= watermark_us), key=lambda entry: entry[:2])
            self.pending = [r for r in self.pending if r[time] > watermark_us]
            start = self.program.nfa.closure(self.program.nfa.start)
            for ts, _, row in ready:
                self.attempts.append(Held(ts, [(pc, "") for pc in start], None, []))
                self._on_row(row, ts, out)
            self._advance(watermark_us, out)
        return self._close(out)

    def feed_items(self, items: Sequence[Item], watermark_us: int | None) -> list[Item]:
        """Stages 2..k: process the items of the stage before in their order; then let the
        progress reach `watermark_us` (None: no watermark). Returns the items for the next
        stage, or, in the last stage, the match items."""
        if self.stage.index == 1:
            raise ValueError("stage 1 reads rows, not items")
        out: list[Item] = []
        for item in items:
            if item.kind == "row":
                self._on_row(item.body, item.time, out)
            elif item.kind == "attempt":
                self._arrive(item.body, item.time, out)
            elif item.kind == "match":
                out.append(item)
            else:  # a tick (Item admits no other kind)
                self._advance(item.time, out)
        if watermark_us is not None:
            self._advance(watermark_us, out)
        return self._close(out)

    def next_deadline(self) -> int | None:
        """The earliest time (us) the progress must reach for this key to change: a waiting
        row's time or an attempt's time bound."""
        times = [r[self.program.time] for r in self.pending]
        times += [a.start_ts + self.program.within_us for a in self.attempts]
        return min(times) if times else None

    def idle(self) -> bool:
        return not self.pending and not self.attempts

    # -- one item at a time ---------------------------------------------------------------------

    def _on_row(self, row: Row, ts: int, out: list[Item]) -> None:
        if not self.stage.last:
            out.append(Item("row", ts, row))
        held = 0  # the threads the attempts stepped so far made: counted as they are made
        for attempt in self.attempts:
            self._step(attempt, row, ts, held)
            held += len(attempt.threads)
        self._settle(ts, out)

    def _step(self, attempt: Held, row: Row, ts: int, held: int) -> None:
        if ts - attempt.start_ts > self.program.within_us:
            attempt.threads = []
            return
        attempt.rows.append(row)
        attempt.threads, accepted = step_threads(self.program, self._names, attempt.threads,
                                                 attempt.rows, Budget(self._holder, held))
        if accepted is not None:
            attempt.candidate = accepted

    def _arrive(self, carried: Carried, ts: int, out: list[Item]) -> None:
        attempt = Held.of(carried)
        if self._expired(attempt):
            attempt.threads = []
        self.attempts.append(attempt)
        self._settle(ts, out)

    def _advance(self, to: int, out: list[Item]) -> None:
        """The progress reaches `to`: attempts whose bound it passed end and are decided."""
        self.progress = to if self.progress is None else max(self.progress, to)
        for attempt in self.attempts:
            if self._expired(attempt):
                attempt.threads = []
        self._settle(self.progress, out)

    def _expired(self, attempt: Held) -> bool:
        return (self.progress is not None
                and attempt.start_ts + self.program.within_us <= self.progress)

    def _settle(self, ts: int, out: list[Item]) -> None:
        """Decide the attempts with no live thread, hand on those that hold enough rows (items
        at `ts`), and check the bound on the partial matches this stage holds."""
        at = self.stage.hands_on_at
        kept: list[Held] = []
        for attempt in self.attempts:
            if not attempt.threads:
                if attempt.candidate is not None:
                    out.append(Item("match", ts, self._measures(attempt, attempt.candidate)))
            elif at is not None and len(attempt.rows) >= at:
                out.append(Item("attempt", ts, attempt.carried()))
            else:
                kept.append(attempt)
        self.attempts = kept
        total = sum(len(a.threads) for a in kept)  # attempts handed over from the stage before
        if total > self.program.max_partial:
            raise PatternOverflow(self._holder, self.program.max_partial, total)

    @property
    def _holder(self) -> str:
        return f"stage {self.stage.index} of {self.stage.count} of one key"

    def _measures(self, attempt: Held, labels: str) -> list[Any]:
        match = Match(tuple(attempt.rows[:len(labels)]),
                      tuple(self._names[ord(c) - 65] for c in labels))
        return list(measures(self.program, match))

    def _close(self, out: list[Item]) -> list[Item]:
        """The call's items in non-decreasing time, with the tick at the progress."""
        if not self.stage.last and self.progress is not None:
            out.append(Item("tick", self.progress, None))
        out.sort(key=lambda item: item.time)
        return out

    # -- state store ----------------------------------------------------------------------------

    def to_json(self) -> str:
        """The whole state: progress, waiting rows, late count, attempts as
        [start_ts, threads, candidate, rows]."""
        return json.dumps({"p": self.progress, "w": self.pending, "l": self.late,
                           "a": [[a.start_ts, a.threads, a.candidate, a.rows]
                                 for a in self.attempts]}, separators=(",", ":"))

    @classmethod
    def from_json(cls, program: PatternProgram, stage: Stage, text: str) -> "StageMatcher":
        data = json.loads(text)
        matcher = cls(program, stage)
        matcher.progress, matcher.pending, matcher.late = data["p"], data["w"], data["l"]
        matcher.attempts = [Held(s, [(pc, lb) for pc, lb in th], c, rows)
                            for s, th, c, rows in data["a"]]
        return matcher
