"""Safe XML reading with exact source positions.

Owns turning the bytes of a spec file into an lxml tree and a map from every element (and each
of its attributes) to the line and column where the user wrote it. lxml reports only a line per
element, so a small scanner walks the raw text in document order alongside the tree, in time
linear in the text (each token is matched once where it starts; a comment, CDATA section or
processing instruction is skipped to its closing marker, found once with `str.find`), so no spec
up to MAX_SPEC_BYTES can hold the interpreter (issue 36).

Safety (docs/architecture.md, invariant 4): a spec may not contain a DOCTYPE or entity
declarations, so billion-laughs and XXE files are refused before lxml sees them; the parser itself
runs with entity resolution, DTD loading and network access off. Does not own the schema or what
elements mean (`compiler.spec`).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Iterator

from lxml import etree

from common.diagnostics import MAX_SHOWN, Diagnostic, Position, SpecError

MAX_SPEC_BYTES = 4 << 20

_NAME = r"[A-Za-z_][\w.\-]*"
_TOKEN = re.compile(
    r"(?P<open><!--|<!\[CDATA\[|<\?)"  # comment, CDATA section, processing instruction
    r"|<!(?P<decl>[A-Za-z]+)"  # DOCTYPE, ENTITY, ... (refused)
    r"|</" + _NAME + r"\s*>"  # end tag
    r"|<(?P<start>" + _NAME + r")(?P<attrs>(?:\s+" + _NAME + r"\s*=\s*(?:\"[^\"]*\"|'[^']*'))*)\s*/?>",
)
# Where the markup an opening starts ends. Found with str.find from the opening, never with a
# lazy regular expression: `<!--.*?-->` re-scanned the rest of the file for every unclosed
# opening, quadratic in the file's size (issue 36).
_CLOSING = {"<!--": "-->", "<![CDATA[": "]]>", "<?": "?>"}
_ATTR = re.compile(r"(?P<name>" + _NAME + r")\s*=\s*(?P<q>[\"'])(?P<value>.*?)(?P=q)", re.DOTALL)
_ENTITY = re.compile(r"&(#x[0-9A-Fa-f]+|#[0-9]+|[A-Za-z]+);")


@dataclass(frozen=True)
class AttrSource:
    """Where an attribute's name starts and the raw text of its value (before entity decoding)."""

    position: Position
    value_position: Position
    raw_value: str

    def position_in_value(self, offset: int) -> Position:
        """The position of character `offset` of the decoded value, accounting for entity
        references such as `&gt;` that take several raw characters."""
        raw_index = _raw_index(self.raw_value, offset)
        before = self.raw_value[:raw_index]
        newlines = before.count("\n")
        if newlines == 0:
            return self.value_position.shifted(raw_index)
        return Position(
            self.value_position.file,
            self.value_position.line + newlines,
            raw_index - before.rfind("\n"),
        )


@dataclass(frozen=True)
class ElementSource:
    """Where an element's start tag begins, and where each of its attributes is."""

    position: Position
    attributes: dict[str, AttrSource] = field(default_factory=dict)

    def attr(self, name: str) -> Position:
        a = self.attributes.get(name)
        return a.position if a else self.position

    def value(self, name: str, offset: int = 0) -> Position:
        a = self.attributes.get(name)
        return a.position_in_value(offset) if a else self.position


@dataclass(frozen=True)
class XmlDocument:
    """A parsed spec file: its tree and the source of every element in document order."""

    filename: str
    root: etree._Element
    sources: dict[etree._Element, ElementSource]

    def where(self, element: etree._Element) -> ElementSource:
        return self.sources.get(element) or ElementSource(
            Position(self.filename, element.sourceline or 1, 1)
        )


def read_xml(text: str | bytes, filename: str) -> XmlDocument:
    """Parse a spec safely; raise SpecError with located diagnostics if it is not well-formed
    or not allowed (DOCTYPE, entity declarations, too large)."""
    if isinstance(text, bytes):
        if len(text) > MAX_SPEC_BYTES:
            raise SpecError([_too_large(filename, len(text))])
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError([Diagnostic(Position(filename, 1, 1),
                                        f"the file is not UTF-8 text (byte {e.start})",
                                        "save the spec as UTF-8")]) from None
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError([_too_large(filename, len(text))])
    starts, declarations = _scan(text)
    if declarations:
        raise SpecError(_refusals(declarations, _Locator(text, filename)))
    root = _parse(text, filename)
    elements = [e for e in root.iter() if isinstance(e.tag, str)]
    locate = _Locator(text, filename)
    sources = {element: _element_source(start, locate)
               for element, start in zip(elements, starts) if start.group("start") == element.tag}
    return XmlDocument(filename, root, sources)


def _too_large(filename: str, size: int) -> Diagnostic:
    return Diagnostic(Position(filename, 1, 1),
                      f"the spec is {size} bytes, more than the {MAX_SPEC_BYTES} allowed",
                      "split the dataflow into several queries")


def _parse(text: str, filename: str) -> etree._Element:
    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False,
        huge_tree=False, remove_pis=True, remove_comments=False,
    )
    body = re.sub(r"^\s*<\?xml[^>]*\?>", lambda m: " " * len(m.group(0)), text, count=1)
    try:
        return etree.fromstring(body, parser)
    except ValueError:  # lxml refuses text with an encoding declaration the strip left (unended)
        raise SpecError([Diagnostic(Position(filename, 1, 1), "XML is not well-formed: an XML "
                                    "declaration that does not end with '?>'",
                                    'write <?xml version="1.0" encoding="UTF-8"?> or leave it '
                                    "out")]) from None
    except etree.XMLSyntaxError:
        lines = text.split("\n")
        diagnostics = [
            Diagnostic(_token_start(lines, filename, err.line, err.column),
                       f"XML is not well-formed: {err.message.strip()}",
                       "fix the markup at this place")
            for err in parser.error_log
        ]
        raise SpecError(diagnostics[:20] or [
            Diagnostic(Position(filename, 1, 1), "XML is not well-formed", "check the file")
        ]) from None


def _token_start(lines: list[str], filename: str, line: int, column: int) -> Position:
    """libxml2 reports the column just after the offending tag; point at the tag's '<'."""
    line = max(line, 1)
    text = lines[line - 1] if line <= len(lines) else ""
    end = min(max(column, 1), len(text) + 1) - 1
    if end > 0 and text[end - 1] == ">":
        start = text.rfind("<", 0, end)
        if start >= 0:
            return Position(filename, line, start + 1)
    return Position(filename, line, max(column, 1))


def _scan(text: str) -> tuple[list[re.Match[str]], list[re.Match[str]]]:
    """The start tags and the declarations (refused) of `text`, each in document order."""
    starts: list[re.Match[str]] = []
    declarations: list[re.Match[str]] = []
    for m in _tokens(text):
        if m.group("decl"):
            declarations.append(m)
        elif m.group("start"):
            starts.append(m)
    return starts, declarations


class _Locator:
    """file:line:column of a character index of one text (line and column from 1)."""

    def __init__(self, text: str, filename: str):
        self.filename = filename
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def __call__(self, index: int) -> Position:
        line = bisect.bisect_right(self.line_starts, index) - 1
        return Position(self.filename, line + 1, index - self.line_starts[line] + 1)


def _element_source(start: re.Match[str], locate: _Locator) -> ElementSource:
    """Where the start tag `start` and each of its attributes are."""
    attrs_text, attrs_at = start.group("attrs"), start.start("attrs")
    attributes = {
        a.group("name"): AttrSource(locate(attrs_at + a.start()),
                                    locate(attrs_at + a.start("value")), a.group("value"))
        for a in _ATTR.finditer(attrs_text)
    }
    return ElementSource(locate(start.start()), attributes)


def _tokens(text: str) -> Iterator[re.Match[str]]:
    """Declarations and start tags in document order, outside comments, CDATA sections and
    processing instructions, in time linear in `text`: each token is matched once where it
    starts, and a comment, CDATA section or processing instruction is skipped to its closing
    marker, found once. Markup after an opening that is never closed is inside it, so the scan
    ends there (lxml then reports where it opened)."""
    at = 0
    while (m := _TOKEN.search(text, at)) is not None:
        opening = m.group("open")
        if opening is None:
            yield m
            at = m.end()
            continue
        close = text.find(_CLOSING[opening], m.end())
        if close < 0:
            return
        at = close + len(_CLOSING[opening])


def _refusals(declarations: list[re.Match[str]], locate: _Locator) -> list[Diagnostic]:
    """A refusal for each of the first MAX_SHOWN declarations, and one saying how many more."""
    shown = [_refusal(m.group("decl"), locate(m.start())) for m in declarations[:MAX_SHOWN]]
    if len(declarations) > MAX_SHOWN:
        shown.append(Diagnostic(locate(declarations[MAX_SHOWN].start()),
                                f"{len(declarations) - MAX_SHOWN} more declarations not shown "
                                f"(only the first {MAX_SHOWN} are)",
                                "remove every <!...> declaration from the spec"))
    return shown


def _refusal(decl: str, at: Position) -> Diagnostic:
    kind = decl.upper()
    if kind == "DOCTYPE":
        return Diagnostic(at, "a DOCTYPE is not allowed in a spec (DTDs and entities are off "
                              "for safety)", "remove the <!DOCTYPE ...> declaration")
    return Diagnostic(at, f"<!{decl} ...> declarations are not allowed in a spec",
                      "remove the declaration; entities are never expanded")


def _raw_index(raw: str, offset: int) -> int:
    """Index into the raw attribute text of decoded character `offset`."""
    decoded = 0
    i = 0
    while i < len(raw) and decoded < offset:
        m = _ENTITY.match(raw, i) if raw[i] == "&" else None
        i = m.end() if m else i + 1
        decoded += 1
    return i
