"""The stack tests' sink reader (`testkit.e2e_support.read_sink`) reuses what it parsed last
time; whatever the file did in between (grew, was cut back and rewritten, half a line written),
each read equals a plain parse of the whole file as it is now."""

from __future__ import annotations

import json
import random
from datetime import datetime
from pathlib import Path

from testkit.e2e_support import read_sink


def _oracle(path: Path) -> list[dict]:
    rows = []
    text = path.read_text(encoding="utf-8")
    for line in text.split("\n")[:-1]:
        if line.strip():
            row = json.loads(line)
            rows.append({k: datetime.fromisoformat(v[:-1] + "+00:00")
                         if isinstance(v, str) and v.endswith("Z") and "T" in v else v
                         for k, v in row.items()})
    return rows


def test_every_read_equals_a_whole_parse_through_appends_cuts_and_torn_lines(
        tmp_path: Path) -> None:
    rng = random.Random(2411)
    sink = tmp_path / "out.jsonl"
    assert read_sink(sink) == []
    content = ""
    for step in range(400):
        action = rng.random()
        if action < 0.6:  # a batch appended (after the sink cut back a torn one), maybe the
            # last line still half written
            content = content[:content.rfind("\n") + 1]
            lines = "".join(json.dumps({"n": step, "i": i, "s": "é\\n", "t": "2026-01-01T00:00:0"
                                        f"{i % 10}Z"}) + "\n" for i in range(rng.randint(1, 5)))
            content += lines[:rng.randint(len(lines) // 2, len(lines))]
        elif action < 0.8 and content:  # a torn append cut back, then a batch rewritten
            content = content[:rng.randint(0, len(content))]
            content = content[:content.rfind("\n") + 1] + json.dumps({"n": -step}) + "\n"
        else:  # the same length, other bytes (a rewrite the reader must not miss)
            content = content.replace('"n": ', '"n":  ', 1)
        sink.write_text(content, encoding="utf-8")
        assert read_sink(sink) == _oracle(sink), step
