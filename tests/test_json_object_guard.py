"""The guard in front of pyarrow's JSON reader (`executor.sources.json_object_lines`), shared by
the file source and kafka-source: pyarrow 26 segfaults the process on jsonl whose first line
is a bare `null`. Parsing runs in a subprocess, so a crash shows as its exit status (139 on
the old code), not as a dead pytest; the rows and the located bad lines are compared with a
plain-Python oracle over the same bytes. No Spark."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from executor import sources

ROOT = Path(__file__).resolve().parent.parent

PARSE_MAIN = '''
import json, sys
from common.types import Schema
from executor import sources
out = []
for text in json.load(sys.stdin):
    data = text.encode("latin-1")
    table, split = sources.parse_piece(data, "jsonl", Schema.of(("a", "int")))
    out.append({"rows": table.column("a").to_pylist(),
                "bad": [[at, line.decode("latin-1")] for at, line in split.bad]})
print(json.dumps(out))
'''

SHAPES = [b"null", b"true", b"1", b'"x"', b"[]", b"{}", b"", b"  ", b"\t", b" \r", b"\x0b",
          b"nul", b"[1, 2]", b'{"a": 7}', b' {"a": 8}', b'\t{"a": 9}', b"null ", b" null"]


def parse_in_subprocess(texts: list[bytes]) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-c", PARSE_MAIN], cwd=ROOT,
                          input=json.dumps([t.decode("latin-1") for t in texts]),
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the parser process exited {done.returncode}: " \
                                 f"{done.stderr[-1500:]}"
    return list(json.loads(done.stdout))


def oracle(data: bytes) -> dict[str, Any]:
    """Plain Python: an object line is a row; a blank line is nothing; any other is bad."""
    rows: list[Any] = []
    bad: list[list[Any]] = []
    at = 0
    for line in data.split(b"\n"):
        if line.lstrip(b" \t").startswith(b"{"):
            rows.append(json.loads(line).get("a"))
        elif line.strip(b" \t\r\x0b\x0c"):
            bad.append([at, line.rstrip(b"\r").decode("latin-1")])
        at += len(line) + 1
    return {"rows": rows, "bad": bad}


def test_a_leading_null_line_is_a_bad_line_and_the_rest_flows() -> None:
    text = b'null\n{"a":1}\n{"a":2}\n'
    assert parse_in_subprocess([text]) == [{"rows": [1, 2], "bad": [[0, "null"]]}]


def test_no_line_shape_crashes_the_parser_process() -> None:
    rng = random.Random(30)
    texts = [b"\n".join(rng.choice(SHAPES) for _ in range(rng.randint(1, 8)))
             + rng.choice([b"", b"\n"]) for _ in range(300)]
    texts += [shape + b"\n" for shape in SHAPES] + [shape for shape in SHAPES]
    assert parse_in_subprocess(texts) == [oracle(t) for t in texts]


def test_strict_parse_lines_refuses_a_line_that_is_not_an_object() -> None:
    import pytest

    from common.types import Schema

    with pytest.raises(sources.NotJsonObjects, match="not a JSON object"):
        sources.parse_lines(b'{"a":1}\nnull\n', "jsonl", Schema.of(("a", "int")))


def test_a_bad_line_is_located_in_the_file_past_the_skipped_long_lines() -> None:
    # piece read from byte 100 without the long lines at [110, 150) and [160, 170)
    skipped = [(110, 150), (160, 170), (500, 600)]
    assert sources.piece_offset(100, skipped, 5) == 105
    assert sources.piece_offset(100, skipped, 10) == 150
    assert sources.piece_offset(100, skipped, 19) == 159
    assert sources.piece_offset(100, skipped, 20) == 170
    assert sources.piece_offset(100, [(10, 20)], 3) == 103  # a range before the piece
    notice = sources.not_an_object_notice("in.jsonl", 1234, b"null")
    assert notice.startswith("in.jsonl: byte 1,234: the line is not a JSON object (b'null')")
