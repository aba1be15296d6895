"""The rule-file language (compiler.rules, rewrite_rules): the shipped rules load, user folders
add rules, and malformed rule files are refused with file:line:column (layer 1, pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.diagnostics import SpecError
from compiler.rules import PHASES, Loop, load_rules, parse_rule, tokenize
from rewrite_rules import rule_files, shipped_rule_files

GOOD = """\
rule mine
phase pipelining
focus f
match a2 := any(f := filter(a1 := any*))
when  wants(f, pipeline, split), stateless(f)
=>    a2(f@p2(network-reader@p2(network-writer@p1(a1))))
"""


def test_the_shipped_rules_load_in_phase_order() -> None:
    rules = load_rules(shipped_rule_files())
    assert [r.name for r in rules] == ["checkpoint", "hot-standby", "standby", "folding",
                                      "partitioning", "pattern-partitioning", "pattern-pipelining",
                                      "pipelining", "shedding"]
    assert [PHASES.index(r.phase) for r in rules] == sorted(PHASES.index(r.phase) for r in rules)
    assert all(Path(r.file).name == f"{r.name}.rule" for r in rules)


def test_a_rule_parses_into_its_parts() -> None:
    rule = parse_rule(GOOD, "mine.rule")
    assert (rule.name, rule.phase, rule.focus) == ("mine", "pipelining", "f")
    assert rule.pattern.binding == "a2" and rule.pattern.args[0].kind == "filter"
    assert rule.pattern.args[0].args[0].star
    assert [(g.name, g.args) for g in rule.guards] == [("wants", ("f", "pipeline", "split")),
                                                      ("stateless", ("f",))]
    inner = rule.replacement.args[0]
    assert inner.head == "f" and inner.placement.label == "2"  # type: ignore[union-attr]


def test_a_loop_and_a_value_function_parse() -> None:
    text = (shipped_rule_files()[0].parent / "hot-standby.rule").read_text()
    rule = parse_rule(text, "hot-standby.rule")
    loop = rule.replacement.args[0].args[0]  # type: ignore[union-attr]
    assert isinstance(loop, Loop) and loop.var == "i"
    assert loop.stop.name == "request" and loop.stop.args == ("f", "replicas")  # type: ignore


def test_comments_and_positions_in_tokens() -> None:
    tokens = tokenize("# comment\n  rule x # more\nphase", "r.rule")
    assert [(t.text, t.pos.line, t.pos.column) for t in tokens[:3]] == [
        ("rule", 2, 3), ("x", 2, 8), ("phase", 3, 1)]


# (name, text, line, column, words in the message)
MALFORMED = [
    ("no-phase", "rule r\nfocus f\n", 2, 1, "expected 'phase'"),
    ("bad-phase", GOOD.replace("phase pipelining", "phase scaling"), 2, 7, "unknown phase"),
    ("bad-guard", GOOD.replace("stateless(f)", "cheap(f)"), 5, 34, "unknown guard 'cheap'"),
    ("bad-kind", GOOD.replace("filter(", "filtre("), 4, 22, "unknown operator kind 'filtre'"),
    ("bad-plumbing", GOOD.replace("network-writer@p1", "netwriter@p1"), 6, 33,
     "unknown operator or binding 'netwriter'"),
    ("bad-binding", GOOD.replace("stateless(f)", "stateless(g)"), 5, 44, "'g' is not a binding"),
    ("unclosed", GOOD.rstrip().rstrip(")") + "\n", 7, 1, "expected ')'"),
    ("bad-char", GOOD.replace("a1 := any*", "a1 := $any"), 4, 35, "unexpected character '$'"),
    ("bad-placement", GOOD.replace("f@p2", "f@q2"), 6, 12, "expected a placement"),
    ("root-not-kept", GOOD.replace("=>    a2(", "=>    a3("), 6, 7,
     "ROOT(new producer)"),
    ("bad-param", GOOD.replace("network-writer@p1", "network-writer{speed: 3}@p1"), 6, 48,
     "network-writer has no parameter 'speed'"),
    ("twice-bound", GOOD.replace("a1 := any*", "a2 := any*"), 4, 35, "'a2' is used twice"),
    ("code-as-value", GOOD.replace("network-writer@p1", "network-writer{backup: eval(f)}@p1"),
     6, 56, "unknown value function 'eval'"),
    ("star-focus", GOOD.replace("focus f", "focus a1"), 3, 7, "the focus 'a1'"),
    ("bad-request", GOOD.replace("wants(f, pipeline, split)", "wants(f, speed)"), 5, 16,
     "unknown pattern request 'speed'"),
    ("two-rules", GOOD + GOOD, 7, 1, "one rule per file"),
]


@pytest.mark.parametrize("name,text,line,column,words", MALFORMED,
                         ids=[m[0] for m in MALFORMED])
def test_a_malformed_rule_file_is_refused_with_its_position(tmp_path: Path, name: str, text: str,
                                                            line: int, column: int,
                                                            words: str) -> None:
    path = tmp_path / f"{name}.rule"
    path.write_text(text)
    with pytest.raises(SpecError) as e:
        load_rules([path])
    found = [(d.position.line, d.position.column, d.message) for d in e.value.diagnostics]
    assert any(d.position.file == str(path) for d in e.value.diagnostics)
    assert any((ln, col) == (line, column) and words in msg for ln, col, msg in found), found


def test_every_problem_of_a_rule_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "many.rule"
    path.write_text(GOOD.replace("stateless(f)", "cheap(f)").replace("phase pipelining",
                                                                      "phase scaling"))
    with pytest.raises(SpecError) as e:
        load_rules([path])
    messages = " | ".join(d.message for d in e.value.diagnostics)
    assert "unknown phase" in messages and "unknown guard" in messages


def test_a_user_folder_adds_rules_and_a_clashing_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mine.rule").write_text(GOOD)
    names = [r.name for r in load_rules(rule_files(tmp_path))]
    assert "mine" in names and "standby" in names
    (tmp_path / "standby.rule").write_text(GOOD.replace("rule mine", "rule standby"))
    with pytest.raises(SpecError) as e:
        load_rules(rule_files(tmp_path))
    assert "rule 'standby' is already defined" in str(e.value)


def test_a_missing_user_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        rule_files(tmp_path / "nowhere")
