"""The rule-file language: rewrite rules written in the paper's notation, read as data.

Owns the lexer, the parser, the rule AST (frozen dataclasses) and the checks that refuse a rule
file naming an unknown phase, guard, operator, binding or pattern request, each problem located
at file:line:column. A rule file is never executed: it is tokenised, parsed into the AST below
and interpreted by `compiler.rewrite`. Does not own matching or splicing (`compiler.rewrite`) nor
where rule files live (`rewrite_rules`). The language is documented in docs/patterns.md:

    rule hot-standby
    phase fault-tolerance
    focus f
    match a2 := any(f := any(a1 := any*))
    when  wants(f, ha, hot-standby)
    =>    a2(stream-selector{protects: f, replicas: request(f, replicas)}@p*(
              for i in 1..request(f, replicas):
                  f[i]@p{i}(network-reader{replica: i}(m := multicast{...}@p*(a1)))))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Union

from common.diagnostics import Diagnostic, Position, SpecError, suggest
from compiler.guards import GUARDS
from compiler.operators import CATALOGUE, PLUMBING

PHASES = ("fault-tolerance", "partitioning", "pipelining", "shedding")  # the written order of the phases
REQUESTS = ("ha", "replicas", "parallelism", "partition-by", "partition-keys", "pipeline",
            "active", "min-parallelism", "elastic", "switch-time", "switch-window",
            "switch-horizon", "switch-slide", "switch-spread", "switch-planned", "switch-close",
            "match-instances", "folded-partitions", "pipeline-stages", "stage-rows")
MAX_RULE_BYTES = 64 * 1024


# ----------------------------------------------------------------------------------------------
# AST

@dataclass(frozen=True)
class PatternTerm:
    """`name := kind(args)`; kind is an operator kind, `any`, or `any*` (star: any inputs)."""

    binding: str | None
    kind: str
    star: bool
    args: tuple["PatternTerm", ...]
    pos: Position


@dataclass(frozen=True)
class Guard:
    """`name(arg, ...)`: a check from the closed set `compiler.guards.GUARDS` over bound
    nodes."""

    name: str
    args: tuple[str, ...]
    pos: Position
    arg_pos: tuple[Position, ...]


@dataclass(frozen=True)
class Call:
    """A value function in a replacement: `request(f, replicas)`, `input-request(f, name)`,
    `input-key(f)` or `param(f, name)` (a parameter the spec gave f)."""

    name: str
    args: tuple[str, ...]
    pos: Position


@dataclass(frozen=True)
class PlacementRef:
    """`@p1`, `@p*` or `@p{i}` (i: the loop variable)."""

    label: str  # "1", "*" or the loop variable's name
    is_var: bool
    pos: Position


Value = Union[int, str, Call, PlacementRef]


@dataclass(frozen=True)
class Param:
    name: str
    value: Value
    pos: Position


@dataclass(frozen=True)
class Loop:
    """`for i in 1..count: body`: `count` copies of body, numbered from 1."""

    var: str
    start: int
    stop: Union[int, Call]
    body: "ReplTerm"
    pos: Position


@dataclass(frozen=True)
class Chain:
    """`chain i in 1..count from source as prev: body`: count copies of body in a row, each
    reading the one before it (`prev` names the previous copy's output, the first copy's is
    `source`); it stands for the last copy's output, one stream."""

    var: str
    start: int
    stop: Union[int, Call]
    source: "ReplTerm"
    prev: str
    body: "ReplTerm"
    pos: Position


@dataclass(frozen=True)
class ReplTerm:
    """`name := head[index]@placement{params}(args)`. The head is a pattern binding (the bound
    node itself, rebuilt when given arguments; with [i], its i-th copy) or a plumbing kind."""

    binding: str | None
    head: str
    index: str | None
    placement: PlacementRef | None
    params: tuple[Param, ...]
    args: tuple[Union["ReplTerm", Loop, Chain], ...]
    has_args: bool
    pos: Position


@dataclass(frozen=True)
class Rule:
    name: str
    phase: str
    focus: str
    pattern: PatternTerm
    guards: tuple[Guard, ...]
    replacement: ReplTerm
    file: str
    pos: Position
    phase_pos: Position | None = field(default=None, compare=False)
    focus_pos: Position | None = field(default=None, compare=False)

    def bindings(self) -> dict[str, PatternTerm]:
        return {t.binding: t for t in _walk(self.pattern) if t.binding}


def _walk(term: PatternTerm) -> Iterable[PatternTerm]:
    yield term
    for a in term.args:
        yield from _walk(a)


# ----------------------------------------------------------------------------------------------
# Functions of replacement terms (guards are in compiler.guards)

FUNCTIONS: dict[str, int] = {"request": 2, "input-request": 2, "input-key": 1, "param": 2}


# ----------------------------------------------------------------------------------------------
# Lexer

@dataclass(frozen=True)
class Token:
    kind: str  # NAME INT PUNCT EOF
    text: str
    pos: Position


_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+) | (?P<comment>\#[^\n]*)
  | (?P<int>\d+(?![A-Za-z_]))
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*)
  | (?P<punct>:=|=>|\.\.|[()\[\]{},:@*])
""", re.VERBOSE)


class RuleSyntaxError(Exception):
    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.render())
        self.diagnostic = diagnostic


def tokenize(text: str, filename: str) -> list[Token]:
    tokens, line, line_start, i = [], 1, 0, 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        pos = Position(filename, line, i - line_start + 1)
        if not m:
            raise RuleSyntaxError(Diagnostic(pos, f"unexpected character {text[i]!r}",
                                             "see docs/patterns.md for the rule language"))
        kind = m.lastgroup or ""
        if kind in ("int", "name", "punct"):
            tokens.append(Token(kind.upper(), m.group(), pos))
        newlines = m.group().count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + m.group().rfind("\n") + 1
        i = m.end()
    tokens.append(Token("EOF", "", Position(filename, line, i - line_start + 1)))
    return tokens


# ----------------------------------------------------------------------------------------------
# Parser (recursive descent; the first syntax error stops the file)

class _Parser:
    def __init__(self, tokens: list[Token]):
        self.tokens, self.i = tokens, 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def fail(self, expected: str, tok: Token | None = None) -> RuleSyntaxError:
        tok = tok or self.tok
        found = "the end of the file" if tok.kind == "EOF" else f"'{tok.text}'"
        return RuleSyntaxError(Diagnostic(tok.pos, f"expected {expected}, found {found}",
                                          "see docs/patterns.md for the rule language"))

    def take(self, text: str) -> Token:
        if self.tok.text != text or self.tok.kind == "EOF":
            raise self.fail(f"'{text}'")
        return self.advance()

    def advance(self) -> Token:
        tok = self.tok
        self.i += 1
        return tok

    def name(self, what: str) -> Token:
        if self.tok.kind != "NAME":
            raise self.fail(what)
        return self.advance()

    def accept(self, text: str) -> bool:
        if self.tok.text == text and self.tok.kind == "PUNCT":
            self.i += 1
            return True
        return False

    # rule NAME phase NAME focus NAME match PATTERN [when GUARD, ...] => REPL
    def rule(self, filename: str) -> Rule:
        start = self.take("rule")
        name = self.name("a rule name").text
        self.take("phase")
        phase = self.name("a phase name")
        self.take("focus")
        focus = self.name("the focus binding")
        self.take("match")
        pattern = self.pattern()
        guards = self.guards() if self.tok.text == "when" else ()
        self.take("=>")
        replacement = self.repl()
        if self.tok.kind != "EOF":
            raise self.fail("the end of the rule (one rule per file)")
        return Rule(name, phase.text, focus.text, pattern, guards, replacement, filename,
                    start.pos, phase.pos, focus.pos)

    def pattern(self) -> PatternTerm:
        binding = self.binding()
        head = self.name("an operator kind, any or any*")
        star = head.text == "any" and self.accept("*")
        args: list[PatternTerm] = []
        if not star and self.accept("("):
            args.append(self.pattern())
            while self.accept(","):
                args.append(self.pattern())
            self.take(")")
        return PatternTerm(binding, head.text + ("*" if star else ""), star, tuple(args),
                           head.pos)

    def binding(self) -> str | None:
        if self.tok.kind == "NAME" and self.peek().text == ":=":
            name = self.advance().text
            self.advance()
            return name
        return None

    def guards(self) -> tuple[Guard, ...]:
        self.take("when")
        guards = [self.guard()]
        while self.accept(","):
            guards.append(self.guard())
        return tuple(guards)

    def guard(self) -> Guard:
        head = self.name("a guard such as stateless(f)")
        self.take("(")
        args = [self.name("a binding or a word")]
        while self.accept(","):
            args.append(self.name("a binding or a word"))
        self.take(")")
        return Guard(head.text, tuple(a.text for a in args), head.pos, tuple(a.pos for a in args))

    def repl(self) -> ReplTerm:
        binding = self.binding()
        head = self.name("a binding or a plumbing operator")
        index = None
        if self.accept("["):
            index = self.name("a loop variable").text
            self.take("]")
        placement = None
        params: tuple[Param, ...] = ()
        while (self.tok.text == "@" and placement is None) or (self.tok.text == "{"
                                                                and not params):
            if self.tok.text == "@":
                placement = self.placement()
            else:
                params = self.params()
        args: list[ReplTerm | Loop | Chain] = []
        has_args = self.accept("(")
        if has_args and not self.accept(")"):  # `s()`: the bound operator rebuilt, no inputs
            args.append(self.arg())
            while self.accept(","):
                args.append(self.arg())
            self.take(")")
        return ReplTerm(binding, head.text, index, placement, params, tuple(args), has_args,
                        head.pos)

    def arg(self) -> "ReplTerm | Loop | Chain":
        if self.tok.text == "for":
            return self.loop()
        return self.chain() if self.tok.text == "chain" else self.repl()

    def placement(self) -> PlacementRef:
        at = self.take("@")
        p = self.name("a placement such as p1, p* or p{i}")
        if p.text == "p" and self.accept("*"):
            return PlacementRef("*", False, at.pos)
        if p.text == "p" and self.accept("{"):
            var = self.name("a loop variable")
            self.take("}")
            return PlacementRef(var.text, True, at.pos)
        m = re.fullmatch(r"p([1-9]\d?)", p.text)
        if not m:
            raise self.fail("a placement such as p1, p* or p{i}", p)
        return PlacementRef(m.group(1), False, at.pos)

    def params(self) -> tuple[Param, ...]:
        self.take("{")
        params = [self.param()]
        while self.accept(","):
            params.append(self.param())
        self.take("}")
        return tuple(params)

    def param(self) -> Param:
        name = self.name("a parameter name")
        self.take(":")
        return Param(name.text, self.value(), name.pos)

    def value(self) -> Value:
        if self.tok.kind == "INT":
            return int(self.advance().text)
        if self.tok.text == "@":
            return self.placement()
        word = self.name("a value: a number, a word, a binding or request(f, name)")
        if self.tok.text == "(":
            self.advance()
            args = [self.name("a binding or a word").text]
            while self.accept(","):
                args.append(self.name("a binding or a word").text)
            self.take(")")
            return Call(word.text, tuple(args), word.pos)
        return word.text

    def loop(self) -> Loop:
        start = self.take("for")
        var, first, stop = self.count()
        self.take(":")
        return Loop(var, first, stop, self.repl(), start.pos)

    def chain(self) -> Chain:
        start = self.take("chain")
        var, first, stop = self.count()
        self.take("from")
        source = self.repl()
        self.take("as")
        prev = self.name("a name for the previous copy's output").text
        self.take(":")
        return Chain(var, first, stop, source, prev, self.repl(), start.pos)

    def count(self) -> tuple[str, int, Union[int, Call]]:
        """`i in 1..stop` of a loop or a chain."""
        var = self.name("a loop variable")
        self.take("in")
        if self.tok.kind != "INT":
            raise self.fail("a first number, e.g. 1..3")
        first = int(self.advance().text)
        self.take("..")
        stop = self.value()
        if not isinstance(stop, (int, Call)):
            raise self.fail("a number or request(f, name) after '..'")
        return var.text, first, stop


# ----------------------------------------------------------------------------------------------
# Checks: names a rule uses must exist

def check_rule(rule: Rule) -> list[Diagnostic]:
    phase_pos, focus_pos = rule.phase_pos or rule.pos, rule.focus_pos or rule.pos
    problems: list[Diagnostic] = []
    if rule.phase not in PHASES:
        problems.append(Diagnostic(phase_pos, f"unknown phase '{rule.phase}'",
                                   suggest(rule.phase, PHASES, "phases")))
    bound = _check_pattern(rule.pattern, problems)
    stars = {b for b, t in bound.items() if t.star}
    if rule.focus not in bound or rule.focus in stars or rule.focus == rule.pattern.binding:
        problems.append(Diagnostic(focus_pos, f"the focus '{rule.focus}' must name an operator "
                                              "the pattern binds below its root, not any*",
                                   suggest(rule.focus, set(bound) - stars, "bindings")))
    for g in rule.guards:
        problems += _check_guard(g, bound, stars)
    problems += _check_replacement(rule, bound, stars)
    return problems


def _check_pattern(term: PatternTerm, problems: list[Diagnostic]) -> dict[str, PatternTerm]:
    bound: dict[str, PatternTerm] = {}
    for t in _walk(term):
        kind = t.kind.rstrip("*")
        if kind != "any" and kind not in CATALOGUE and kind not in PLUMBING:
            problems.append(Diagnostic(t.pos, f"unknown operator kind '{t.kind}' in the pattern",
                                       suggest(t.kind, [*CATALOGUE, *PLUMBING, "any", "any*"],
                                               "kinds")))
        if t.binding in bound:
            problems.append(Diagnostic(t.pos, f"binding '{t.binding}' is used twice",
                                       "give each pattern operator its own name"))
        elif t.binding:
            bound[t.binding] = t
    return bound


def _check_guard(g: Guard, bound: dict[str, PatternTerm], stars: set[str]) -> list[Diagnostic]:
    guard = GUARDS.get(g.name)
    if guard is None:
        return [Diagnostic(g.pos, f"unknown guard '{g.name}'", suggest(g.name, GUARDS, "guards"))]
    if not guard.min_args <= len(g.args) <= guard.max_args:
        return [Diagnostic(g.pos, f"guard {g.name} takes {guard.doc}",
                           "fix the number of arguments")]
    problems = []
    if g.args[0] not in bound or g.args[0] in stars:
        problems.append(Diagnostic(g.arg_pos[0], f"guard {g.name}: '{g.args[0]}' is not a "
                                                 "binding of one operator in the pattern",
                                   suggest(g.args[0], set(bound) - stars, "bindings")))
    if g.name in ("wants", "lacks") and g.args[1] not in REQUESTS:
        problems.append(Diagnostic(g.arg_pos[1], f"unknown pattern request '{g.args[1]}'",
                                   suggest(g.args[1], REQUESTS, "requests")))
    if g.name == "kind" and g.args[1] not in CATALOGUE and g.args[1] not in PLUMBING:
        problems.append(Diagnostic(g.arg_pos[1], f"unknown operator kind '{g.args[1]}'",
                                   suggest(g.args[1], [*CATALOGUE, *PLUMBING], "kinds")))
    return problems


@dataclass
class _Scope:
    bound: dict[str, PatternTerm]
    stars: set[str]
    loop_vars: tuple[str, ...] = ()


def _check_replacement(rule: Rule, bound: dict[str, PatternTerm],
                       stars: set[str]) -> list[Diagnostic]:
    top = rule.replacement
    root = rule.pattern.binding
    problems: list[Diagnostic] = []
    if top.head != root or top.index or len(top.args) != 1 or isinstance(top.args[0], Loop):
        problems.append(Diagnostic(top.pos, "a replacement is written as ROOT(new producer), "
                                            "ROOT being the pattern's root binding",
                                   f"write {root or 'a2'}(...) around the new operators"
                                   + ("" if root else " and name the pattern's root")))
        return problems
    if top.placement or top.params:
        problems.append(Diagnostic(top.pos, f"'{root}' is kept as it is: no placement or "
                                            "parameters on it", "move them inside"))
    _check_arg(top.args[0], _Scope(bound, stars), problems, named=set())
    return problems


def _check_arg(a: Union[ReplTerm, Loop, Chain], scope: _Scope, problems: list[Diagnostic],
               named: set[str]) -> None:
    if isinstance(a, ReplTerm):
        _check_repl(a, scope, problems, named)
        return
    _check_value(a.stop, a.pos, scope, problems)
    inner = _Scope(scope.bound, scope.stars, scope.loop_vars + (a.var,))
    if isinstance(a, Loop):
        _check_repl(a.body, inner, problems, named)
        return
    _check_repl(a.source, scope, problems, named)
    if a.prev in scope.bound or a.prev in named:
        problems.append(Diagnostic(a.pos, f"name '{a.prev}' is already used",
                                   "choose a fresh name for the previous copy's output"))
    inside = _named_in(a.body)
    if inside:
        problems.append(Diagnostic(a.pos, f"a chain's body names '{inside[0]}': each copy "
                                          "would share it", "remove the name inside the chain"))
    if not any(t.head == a.prev and not t.has_args for t in _repl_terms(a.body)):
        problems.append(Diagnostic(a.pos, f"the chain's body never reads '{a.prev}', so its "
                                          "copies would not be chained",
                                   f"read {a.prev} in the body, e.g. network-writer({a.prev})"))
    _check_repl(a.body, inner, problems, named | {a.prev})


def _repl_terms(t: ReplTerm) -> Iterable[ReplTerm]:
    yield t
    for a in t.args:
        if isinstance(a, ReplTerm):
            yield from _repl_terms(a)
        elif isinstance(a, Loop):
            yield from _repl_terms(a.body)
        else:
            yield from _repl_terms(a.source)
            yield from _repl_terms(a.body)


def _named_in(t: ReplTerm) -> list[str]:
    return [x.binding for x in _repl_terms(t) if x.binding]


def _check_repl(t: ReplTerm, scope: _Scope, problems: list[Diagnostic], named: set[str]) -> None:
    is_binding = t.head in scope.bound
    if t.binding:
        if t.binding in scope.bound or t.binding in named:
            problems.append(Diagnostic(t.pos, f"name '{t.binding}' is already used",
                                       "choose a fresh name for a new operator"))
        named.add(t.binding)
    if not is_binding and t.head not in PLUMBING and t.head not in named:
        what = ("user operators can only be copied from a binding, e.g. f[i]"
                if t.head in CATALOGUE else "")
        problems.append(Diagnostic(t.pos, f"unknown operator or binding '{t.head}'",
                                   what or suggest(t.head, [*PLUMBING, *scope.bound],
                                                   "plumbing operators and bindings")))
    if t.index is not None and (not is_binding or t.index not in scope.loop_vars):
        problems.append(Diagnostic(t.pos, f"{t.head}[{t.index}] copies a bound operator inside "
                                          f"'for {t.index} in ...'", "check the loop variable"))
    if is_binding and t.head in scope.stars and (t.has_args or t.placement or t.params):
        problems.append(Diagnostic(t.pos, f"'{t.head}' stands for whole upstream dataflows; it "
                                          "takes no arguments, placement or parameters", ""))
    if t.placement and t.placement.is_var and t.placement.label not in scope.loop_vars:
        problems.append(Diagnostic(t.placement.pos, f"p{{{t.placement.label}}} needs a loop "
                                                    f"variable '{t.placement.label}'", ""))
    if t.params:
        _check_params(t, scope, problems)
    for a in t.args:
        _check_arg(a, scope, problems, named)


def _check_params(t: ReplTerm, scope: _Scope, problems: list[Diagnostic]) -> None:
    definition = PLUMBING.get(t.head)
    if definition is None:
        problems.append(Diagnostic(t.pos, f"parameters can only be given to plumbing operators, "
                                          f"not to '{t.head}'", "remove the {...}"))
        return
    for p in t.params:
        if definition.param(p.name) is None:
            problems.append(Diagnostic(p.pos, f"{t.head} has no parameter '{p.name}'",
                                       suggest(p.name, definition.param_names, "its parameters")))
        _check_value(p.value, p.pos, scope, problems)


def _check_value(v: Value, pos: Position, scope: _Scope, problems: list[Diagnostic]) -> None:
    if isinstance(v, Call):
        if v.name not in FUNCTIONS or len(v.args) != FUNCTIONS[v.name]:
            problems.append(Diagnostic(v.pos, f"unknown value function '{v.name}' (or wrong "
                                              "number of arguments)",
                                       "value functions: request(f, name), "
                                       "input-request(f, name), input-key(f), param(f, name)"))
            return
        if v.args[0] not in scope.bound or v.args[0] in scope.stars:
            problems.append(Diagnostic(v.pos, f"{v.name}: '{v.args[0]}' is not a binding of one "
                                              "operator", suggest(v.args[0], scope.bound,
                                                                  "bindings")))
        if v.name == "request" and v.args[1] not in REQUESTS:
            problems.append(Diagnostic(v.pos, f"unknown pattern request '{v.args[1]}'",
                                       suggest(v.args[1], REQUESTS, "requests")))
    elif isinstance(v, PlacementRef) and v.is_var and v.label not in scope.loop_vars:
        problems.append(Diagnostic(v.pos, f"p{{{v.label}}} needs a loop variable", ""))


# ----------------------------------------------------------------------------------------------
# Loading

def parse_rule(text: str, filename: str) -> Rule:
    """Parse and check one rule file; raise SpecError with every located problem."""
    if len(text.encode()) > MAX_RULE_BYTES:
        raise SpecError([Diagnostic(Position(filename, 1, 1), "the rule file is too large",
                                    f"keep it under {MAX_RULE_BYTES // 1024} KiB")])
    try:
        rule = _Parser(tokenize(text, filename)).rule(filename)
    except RuleSyntaxError as e:
        raise SpecError([e.diagnostic]) from None
    problems = check_rule(rule)
    if problems:
        raise SpecError(problems)
    return rule


def load_rules(paths: Iterable[Path]) -> tuple[Rule, ...]:
    """Every rule of the files, in phase order then name order; all problems reported at once
    (including two files defining the same rule name)."""
    rules: list[Rule] = []
    problems: list[Diagnostic] = []
    seen: dict[str, Rule] = {}
    for path in paths:
        try:
            rule = parse_rule(_read(path), str(path))
        except SpecError as e:
            problems += e.diagnostics
            continue
        if rule.name in seen:
            problems.append(Diagnostic(rule.pos, f"rule '{rule.name}' is already defined at "
                                                 f"{seen[rule.name].pos}", "rename one of them"))
            continue
        seen[rule.name] = rule
        rules.append(rule)
    if problems:
        raise SpecError(problems)
    return tuple(sorted(rules, key=lambda r: (PHASES.index(r.phase), r.name)))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError([Diagnostic(Position(str(path), 1, 1), f"cannot read the rule file: {e}",
                                    "check the path and that it is UTF-8 text")]) from None
