"""CPU-heavy projection fields for benchmarks and cluster tests that need real CPU per row.

`heavy_field(column, i)` is `length(upper(concat(<column>, '<3,900 Greek letters>')))`:
upper-casing non-ASCII text takes Spark's slow path (~70 us per field and row on the project's
2-core machine), and its value is an exact integer a plain-Python oracle computes
(`len(value) + LITERAL_CHARS`, Greek letters keep their length upper-cased). The expression
language caps one expression at 4,096 characters, hence several fields for more cost. Shared by
benchmarks/elasticity.py, benchmarks/distribution.py and testkit/shed_support.py.
"""

from __future__ import annotations

GREEK = "".join(chr(c) for c in range(0x3B1, 0x3CA) if c != 0x3C2)  # alpha..omega, no final sigma
LITERAL_CHARS = 3900  # + the rest of the expression stays under the language's 4,096


def literal(i: int) -> str:
    """The i-th field's Greek text (rotated, so no two fields share a subexpression)."""
    text = GREEK * (LITERAL_CHARS // len(GREEK) + 2)
    return text[i % len(GREEK):i % len(GREEK) + LITERAL_CHARS]


def heavy_field(column: str, i: int) -> str:
    """The i-th heavy field's expression over a string `column`."""
    return f"length(upper(concat({column}, '{literal(i)}')))"
