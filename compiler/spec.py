"""What the user wrote: a dataflow spec as frozen dataclasses, each piece with its position.

Owns reading a spec file (through `compiler.xmlsource`), checking its structure against the
shipped XML Schema (`compiler/schema/dataflow.xsd`), and building `Spec`. Every structural
problem is reported at once with file:line:column; the meaning of operators and whether types
agree is `compiler.validate`'s business. The builder is lenient: it skips what the schema
already reported, so semantic checks can still run and report the rest in the same run.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Iterable

from lxml import etree

from common.diagnostics import Diagnostic, Position, SpecError, suggest
from compiler.xmlsource import ElementSource, XmlDocument, read_xml

TOP_LEVEL = ("description", "type", "operator")


@dataclass(frozen=True)
class ColumnDecl:
    name: str
    type_name: str
    pos: Position
    type_pos: Position


@dataclass(frozen=True)
class TypeDecl:
    name: str
    columns: tuple[ColumnDecl, ...]
    pos: Position


@dataclass(frozen=True)
class ParamDecl:
    """`<param name value>`, or `<field name value>` of a projection. `source` locates characters
    inside the value (for expression errors)."""

    name: str
    value: str
    pos: Position
    source: ElementSource = field(compare=False, repr=False)

    def value_pos(self, offset: int = 0) -> Position:
        return self.source.value("value", offset)


@dataclass(frozen=True)
class PortDecl:
    """`<input name>` or `<output name type>`: a named stream entering or leaving an operator."""

    name: str
    type_name: str | None
    pos: Position
    publish: bool = False  # <output publish="true">: other queries may read it by name


@dataclass(frozen=True)
class AggregateDecl:
    name: str
    function: str
    column: str | None
    pos: Position
    function_pos: Position
    column_pos: Position
    by: str | None = None  # max_by / min_by: the column whose largest / least row is taken
    by_pos: Position | None = None
    # SQL's FILTER (WHERE ...): a boolean expression, the rows the aggregate reads; `source`
    # locates characters inside it (for expression errors)
    where: str | None = None
    source: ElementSource | None = field(default=None, compare=False, repr=False)

    def where_pos(self, offset: int = 0) -> Position:
        return self.pos if self.source is None else self.source.value("where", offset)


PATTERN_ATTRIBUTES = ("ha", "replicas", "parallelism", "partition-by", "pipeline",
                      "max-parallelism", "min-parallelism", "elastic", "match-instances",
                      "pipeline-stages", "stage-rows")
RESOURCE_ATTRIBUTES = ("cpus", "mem")  # what an operator's task asks of an agent
DPC_ATTRIBUTE = "max-delay"  # Borealis DPC: how long a result may wait for a cut-off input


@dataclass(frozen=True)
class PatternAttr:
    """A pattern request written as an attribute (`ha="standby"`), with where its value is."""

    name: str
    value: str
    pos: Position


@dataclass(frozen=True)
class OperatorDecl:
    name: str
    kind: str
    inputs: tuple[PortDecl, ...]
    outputs: tuple[PortDecl, ...]
    params: tuple[ParamDecl, ...]
    fields: tuple[ParamDecl, ...]
    aggregates: tuple[AggregateDecl, ...]
    pos: Position
    kind_pos: Position
    patterns: tuple[PatternAttr, ...] = ()
    defines: tuple[ParamDecl, ...] = ()  # <define name value>: a pattern variable's condition
    resources: tuple[PatternAttr, ...] = ()  # cpus= and mem= as written (RESOURCE_ATTRIBUTES)
    max_delay: PatternAttr | None = None  # max-delay= as written (docs/availability.md)

    def param(self, name: str) -> ParamDecl | None:
        for p in self.params:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True)
class Spec:
    name: str
    filename: str
    types: tuple[TypeDecl, ...]
    operators: tuple[OperatorDecl, ...]
    pos: Position
    description: str = ""
    patterns: tuple[PatternAttr, ...] = ()  # query-wide defaults
    share: bool = True  # share="false": never reuse a running query's equal subgraph
    max_delay: PatternAttr | None = None  # query-wide max-delay= (docs/availability.md)
    distribute: bool = False  # distribute="true": the load distributor may move its tasks


def read_spec_file(path: str) -> tuple[Spec, list[Diagnostic]]:
    with open(path, "rb") as f:
        return read_spec(f.read(), path)


def read_spec(text: str | bytes, filename: str) -> tuple[Spec, list[Diagnostic]]:
    """Parse and structure-check a spec. Raises SpecError if it cannot even be read as XML;
    otherwise returns the (leniently built) Spec and the structural diagnostics."""
    doc = read_xml(text, filename)
    problems = check_structure(doc)
    return build_spec(doc), problems


# ----------------------------------------------------------------------------------------------
# Structure: the shipped XML Schema, applied element by element so every problem is reported.

_SCHEMA: etree.XMLSchema | None = None


def _schema() -> etree.XMLSchema:
    global _SCHEMA
    if _SCHEMA is None:
        xsd = resources.files("compiler").joinpath("schema/dataflow.xsd").read_bytes()
        parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
        _SCHEMA = etree.XMLSchema(etree.fromstring(xsd, parser))
    return _SCHEMA


def check_structure(doc: XmlDocument) -> list[Diagnostic]:
    root = doc.root
    if root.tag != "dataflow":
        return [Diagnostic(doc.where(root).position,
                           f"the root element is <{root.tag}>, expected <dataflow>",
                           'wrap the spec in <dataflow name="...">')]
    problems = _validate_fragment(doc, _shallow(root), root)
    for child in root:
        if not isinstance(child.tag, str):
            continue
        if child.tag not in TOP_LEVEL:
            problems.append(_unexpected(doc, child, "dataflow", TOP_LEVEL))
        elif child.tag != "description":
            problems.extend(_validate_element(doc, child))
    if not any(c.tag == "operator" for c in root if isinstance(c.tag, str)):
        problems.append(Diagnostic(doc.where(root).position, "the dataflow has no operators",
                                   "add at least a source and a sink <operator>"))
    return problems


def _shallow(element: etree._Element) -> etree._Element:
    clone = etree.Element(element.tag, dict(element.attrib))
    clone.sourceline = element.sourceline
    return clone


# libxml2 takes time quadratic in the errors inside one element; an <operator>'s children are a
# choice of any number in any order, so validating them in slices of this many is exact.
_SLICE = 256


def _validate_element(doc: XmlDocument, element: etree._Element) -> list[Diagnostic]:
    """Schema problems of one top-level element; an <operator> with many children is validated
    slice by slice (its own attributes once), so a spec full of errors is checked in linear time."""
    children = list(element)
    if element.tag != "operator" or len(children) <= _SLICE:
        return _validate_fragment(doc, copy.deepcopy(element), element)
    index = _ElementIndex(element)
    problems: list[Diagnostic] = []
    for start in range(0, len(children), _SLICE):
        part = _shallow(element)
        part.text = element.text if start == 0 else None
        part.extend(copy.deepcopy(child) for child in children[start:start + _SLICE])
        problems += _validate_fragment(doc, part, element, index)
    return list(dict.fromkeys(problems))  # the element's own attribute problems, once


def _validate_fragment(doc: XmlDocument, fragment: etree._Element, original: etree._Element,
                       index: "_ElementIndex | None" = None) -> list[Diagnostic]:
    schema = _schema()
    if schema.validate(fragment):
        return []
    index = index or _ElementIndex(original)
    return [_translate(doc, index, err) for err in schema.error_log]


class _ElementIndex:
    """The elements of a fragment by tag, and by (tag, line): built once per fragment, so that
    locating each of many schema errors costs no walk over the fragment."""

    def __init__(self, scope: etree._Element) -> None:
        self.by_tag: dict[str, etree._Element] = {}
        self.by_line: dict[tuple[str, int], etree._Element] = {}
        for e in scope.iter():
            if isinstance(e.tag, str):
                self.by_tag.setdefault(e.tag, e)
                self.by_line.setdefault((e.tag, e.sourceline or 0), e)

    def find(self, tag: str, line: int) -> etree._Element | None:
        """The first element `tag` on `line`, else the first `tag` at all."""
        return self.by_line.get((tag, line), self.by_tag.get(tag))


_ELEMENT_RE = re.compile(r"^Element '(?P<tag>[^']+)'(?:, attribute '(?P<attr>[^']+)')?: (?P<msg>.*)$",
                         re.DOTALL)


def _translate(doc: XmlDocument, index: _ElementIndex, err: etree._LogEntry) -> Diagnostic:
    m = _ELEMENT_RE.match(err.message)
    if not m:
        return Diagnostic(Position(doc.filename, max(err.line, 1), 1), err.message.strip())
    tag, attr, msg = m.group("tag"), m.group("attr"), m.group("msg").strip()
    element = index.find(tag, err.line)
    where = doc.where(element) if element is not None else None
    pos = (where.attr(attr) if attr else where.position) if where else Position(
        doc.filename, max(err.line, 1), 1)
    return _friendly(pos, tag, attr, msg, element)


def _friendly(pos: Position, tag: str, attr: str | None, msg: str,
              element: etree._Element | None) -> Diagnostic:
    if "facet 'pattern'" in msg:
        value = re.search(r"The value '([^']*)'", msg)
        shown = value.group(1) if value else ""
        return Diagnostic(pos, f"<{tag}> {attr}='{shown}' is not a valid name",
                          _NAME_RULES.get((tag, attr or ""), _NAME_RULES[None]))
    if "facet 'enumeration'" in msg:
        value = re.search(r"The value '([^']*)'", msg)
        choices = re.search(r"\{(.*)\}", msg)
        return Diagnostic(pos, f"<{tag}> {attr}='{value.group(1) if value else ''}' is not "
                               f"allowed", f"use one of {choices.group(1) if choices else '?'}")
    if "facet 'maxLength'" in msg:
        return Diagnostic(pos, f"<{tag}> {attr} is too long", "keep it under 4096 characters")
    if "is required but missing" in msg:
        missing = re.search(r"attribute '([^']+)'", msg)
        name = missing.group(1) if missing else "?"
        return Diagnostic(pos, f"<{tag}> needs a '{name}' attribute",
                          f'add {name}="..." to this <{tag}>')
    if "is not allowed" in msg and attr:
        allowed = _ALLOWED_ATTRS.get(tag, ())
        return Diagnostic(pos, f"<{tag}> has no attribute '{attr}'",
                          suggest(attr, allowed, "allowed attributes"))
    if "This element is not expected" in msg:
        parent = element.getparent() if element is not None else None
        parent_tag = parent.tag if parent is not None else "dataflow"
        expected = _CHILDREN.get(parent_tag, ())
        return Diagnostic(pos, f"<{tag}> is not allowed inside <{parent_tag}>",
                          suggest(tag, expected, "allowed here"))
    if "Character content" in msg:
        return Diagnostic(pos, f"<{tag}> may not contain text",
                          "put values in attributes, e.g. <param name=\"...\" value=\"...\"/>")
    return Diagnostic(pos, f"<{tag}>: {msg}")


def _unexpected(doc: XmlDocument, element: etree._Element, parent: str,
                expected: Iterable[str]) -> Diagnostic:
    return Diagnostic(doc.where(element).position,
                      f"<{element.tag}> is not allowed inside <{parent}>",
                      suggest(str(element.tag), tuple(expected), "allowed here"))


_NAME_RULES = {
    None: "names start with a letter or _, then letters, digits or _ (at most 64 characters)",
    ("dataflow", "name"): "a query name starts with a letter, then letters, digits, _ or - "
                          "(at most 64 characters)",
    ("operator", "type"): "operator types are lower-case words joined by -, e.g. window-aggregate",
    ("param", "name"): "parameter names are lower-case words joined by -, e.g. group-by",
}
for _attr in PATTERN_ATTRIBUTES:
    for _tag in ("dataflow", "operator"):
        _NAME_RULES[(_tag, _attr)] = ("pattern values are short words or numbers, e.g. "
                                      "hot-standby, 4, sensor (see docs/patterns.md)")
_ALLOWED_ATTRS = {
    "dataflow": ("name", "share", "distribute", DPC_ATTRIBUTE) + PATTERN_ATTRIBUTES,
    "type": ("name",),
    "column": ("name", "type"),
    "operator": ("name", "type", DPC_ATTRIBUTE) + PATTERN_ATTRIBUTES + RESOURCE_ATTRIBUTES,
    "input": ("name",),
    "output": ("name", "type", "publish"),
    "param": ("name", "value"), "field": ("name", "value"), "define": ("name", "value"),
    "aggregate": ("name", "function", "column", "by", "where"),
}
_CHILDREN = {
    "dataflow": TOP_LEVEL, "type": ("column",),
    "operator": ("input", "output", "param", "field", "aggregate", "define"),
}


# ----------------------------------------------------------------------------------------------
# Building the Spec (lenient: anything missing was reported by check_structure).

def build_spec(doc: XmlDocument) -> Spec:
    root = doc.root
    types, operators, description = [], [], ""
    for child in root:
        if child.tag == "type" and child.get("name"):
            types.append(_type(doc, child))
        elif child.tag == "operator" and child.get("name") and child.get("type"):
            operators.append(_operator(doc, child))
        elif child.tag == "description":
            description = (child.text or "").strip()
    return Spec(root.get("name", ""), doc.filename, tuple(types), tuple(operators),
                doc.where(root).position, description, _patterns(doc, root),
                root.get("share") != "false", _max_delay(doc, root),
                root.get("distribute") == "true")


def _patterns(doc: XmlDocument, element: etree._Element,
              names: tuple[str, ...] = PATTERN_ATTRIBUTES) -> tuple[PatternAttr, ...]:
    where = doc.where(element)
    return tuple(PatternAttr(name, element.get(name), where.value(name))
                 for name in names if element.get(name) is not None)


def _max_delay(doc: XmlDocument, element: etree._Element) -> PatternAttr | None:
    found = _patterns(doc, element, (DPC_ATTRIBUTE,))
    return found[0] if found else None


def _children(element: etree._Element, tag: str, *required: str) -> list[etree._Element]:
    return [c for c in element if c.tag == tag and all(c.get(a) is not None for a in required)]


def _type(doc: XmlDocument, element: etree._Element) -> TypeDecl:
    columns = tuple(
        ColumnDecl(c.get("name"), c.get("type"), doc.where(c).position, doc.where(c).value("type"))
        for c in _children(element, "column", "name", "type")
    )
    return TypeDecl(element.get("name"), columns, doc.where(element).position)


def _param(doc: XmlDocument, element: etree._Element) -> ParamDecl:
    src = doc.where(element)
    return ParamDecl(element.get("name"), element.get("value"), src.position, src)


def _operator(doc: XmlDocument, element: etree._Element) -> OperatorDecl:
    where = doc.where(element)
    return OperatorDecl(
        name=element.get("name"),
        kind=element.get("type"),
        inputs=tuple(PortDecl(c.get("name"), None, doc.where(c).position)
                     for c in _children(element, "input", "name")),
        outputs=tuple(PortDecl(c.get("name"), c.get("type"), doc.where(c).position,
                               c.get("publish") == "true")
                      for c in _children(element, "output", "name")),
        params=tuple(_param(doc, c) for c in _children(element, "param", "name", "value")),
        fields=tuple(_param(doc, c) for c in _children(element, "field", "name", "value")),
        aggregates=tuple(_aggregate(doc, c)
                         for c in _children(element, "aggregate", "name", "function")),
        pos=where.position,
        kind_pos=where.value("type"),
        patterns=_patterns(doc, element),
        defines=tuple(_param(doc, c) for c in _children(element, "define", "name", "value")),
        resources=_patterns(doc, element, RESOURCE_ATTRIBUTES),
        max_delay=_max_delay(doc, element),
    )


def _aggregate(doc: XmlDocument, element: etree._Element) -> AggregateDecl:
    src = doc.where(element)
    return AggregateDecl(element.get("name"), element.get("function"), element.get("column"),
                         src.position, src.value("function"), src.value("column"),
                         element.get("by"), src.value("by"), element.get("where"), src)


def load_spec(path: str) -> Spec:
    """Read a spec and raise SpecError if its structure is broken (semantic checks aside)."""
    spec, problems = read_spec_file(path)
    if problems:
        raise SpecError(problems)
    return spec
