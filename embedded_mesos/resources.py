"""Agent resources (scalars such as cpus and mem, ranges such as ports) and their arithmetic.

Owns parsing the agent's `{"cpus": 2, "mem": 1024, "ports": "31000-31999"}` form, converting to
and from the Mesos v1 JSON `Resource` list, and adding, subtracting and comparing. It does not
own who holds which resources (that is `master_state`). Roles, reservations and disks are out of
scope: every resource is unreserved (`*`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

Range = tuple[int, int]
_EPSILON = 1e-9


class ResourceError(ValueError):
    """A resource description that cannot be understood."""


@dataclass(frozen=True)
class Resources:
    """Scalars by name and inclusive integer ranges by name; never negative."""

    scalars: Mapping[str, float] = field(default_factory=dict)
    ranges: Mapping[str, tuple[Range, ...]] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not any(v > _EPSILON for v in self.scalars.values()) and not any(
            self.ranges.values()
        )

    def __add__(self, other: "Resources") -> "Resources":
        scalars = dict(self.scalars)
        for name, value in other.scalars.items():
            scalars[name] = scalars.get(name, 0.0) + value
        ranges = dict(self.ranges)
        for name, spans in other.ranges.items():
            ranges[name] = _merge(ranges.get(name, ()) + spans)
        return Resources(scalars, ranges)

    def __sub__(self, other: "Resources") -> "Resources":
        """What is left after taking `other`; parts of `other` not held here are ignored."""
        scalars = {
            name: max(0.0, value - other.scalars.get(name, 0.0))
            for name, value in self.scalars.items()
        }
        ranges = {
            name: _subtract(spans, other.ranges.get(name, ()))
            for name, spans in self.ranges.items()
        }
        return Resources(scalars, ranges)

    def contains(self, other: "Resources") -> bool:
        """True when every scalar and range of `other` fits in this."""
        for name, value in other.scalars.items():
            if value > self.scalars.get(name, 0.0) + _EPSILON:
                return False
        for name, spans in other.ranges.items():
            if _subtract(spans, self.ranges.get(name, ())):
                return False
        return True

    def to_mesos(self) -> list[dict[str, Any]]:
        """The Mesos v1 JSON `Resource` list (unreserved, role `*`)."""
        out: list[dict[str, Any]] = []
        for name, value in sorted(self.scalars.items()):
            if value > _EPSILON:
                out.append(_resource(name, "SCALAR", {"scalar": {"value": round(value, 6)}}))
        for name, spans in sorted(self.ranges.items()):
            if spans:
                body = {"ranges": {"range": [{"begin": b, "end": e} for b, e in spans]}}
                out.append(_resource(name, "RANGES", body))
        return out


def _resource(name: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "type": kind, "role": "*", "allocation_info": {"role": "*"}, **body}


def parse_agent_resources(spec: Mapping[str, Any]) -> Resources:
    """`{"cpus": 2, "mem": 1024, "ports": "31000-31999,32000-32010"}` -> Resources."""
    scalars: dict[str, float] = {}
    ranges: dict[str, tuple[Range, ...]] = {}
    for name, value in spec.items():
        if isinstance(value, bool):
            raise ResourceError(f"resource {name!r}: expected a number or ranges, got {value!r}")
        if isinstance(value, (int, float)):
            if value < 0:
                raise ResourceError(f"resource {name!r} is negative: {value}")
            scalars[name] = float(value)
        elif isinstance(value, str):
            ranges[name] = parse_ranges(value, name)
        else:
            raise ResourceError(f"resource {name!r}: expected a number or ranges, got {value!r}")
    return Resources(scalars, ranges)


def parse_ranges(text: str, name: str = "ports") -> tuple[Range, ...]:
    """`"31000-31999,32005"` -> ((31000, 31999), (32005, 32005))."""
    spans: list[Range] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        try:
            begin, end = int(low), int(high or low)
        except ValueError:
            raise ResourceError(f"resource {name!r}: bad range {part!r}") from None
        if begin < 0 or end < begin:
            raise ResourceError(f"resource {name!r}: bad range {part!r}")
        spans.append((begin, end))
    return _merge(tuple(spans))


def from_mesos(resources: Any) -> Resources:
    """A Mesos v1 JSON `Resource` list -> Resources; raises ResourceError when malformed."""
    if not isinstance(resources, list):
        raise ResourceError("resources must be a list")
    total = Resources()
    for item in resources:
        total = total + _one_from_mesos(item)
    return total


def _one_from_mesos(item: Any) -> Resources:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ResourceError(f"resource without a name: {item!r}")
    name, kind = item["name"], item.get("type", "SCALAR")
    try:
        if kind == "SCALAR":
            value = float(item["scalar"]["value"])
            if value < 0:
                raise ResourceError(f"resource {name!r} is negative")
            return Resources({name: value}, {})
        if kind == "RANGES":
            spans = tuple((int(r["begin"]), int(r["end"])) for r in item["ranges"]["range"])
            if any(b < 0 or e < b for b, e in spans):
                raise ResourceError(f"resource {name!r}: bad range")
            return Resources({}, {name: _merge(spans)})
    except (KeyError, TypeError, ValueError) as exc:
        raise ResourceError(f"resource {name!r}: malformed {kind} ({exc})") from None
    raise ResourceError(f"resource {name!r}: unsupported type {kind!r}")


def _merge(spans: tuple[Range, ...]) -> tuple[Range, ...]:
    merged: list[Range] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return tuple(merged)


def _subtract(spans: tuple[Range, ...], taken: tuple[Range, ...]) -> tuple[Range, ...]:
    left = list(spans)
    for t_begin, t_end in taken:
        nxt: list[Range] = []
        for begin, end in left:
            if t_end < begin or t_begin > end:
                nxt.append((begin, end))
                continue
            if begin < t_begin:
                nxt.append((begin, t_begin - 1))
            if t_end < end:
                nxt.append((t_end + 1, end))
        left = nxt
    return tuple(left)
