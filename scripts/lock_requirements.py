"""Write requirements.lock: the exact versions of Elastiq's runtime dependencies, as installed.

Walks the installed `elastiq` distribution's requirements (no extras) and theirs, recursively,
through `importlib.metadata`, honouring environment markers, and writes `name==version` for
each, sorted. The images install with it as pip constraints (`scripts/setup.sh --locked`), so
an image built later gets the versions this machine was tested with. Run after changing the
dependencies in pyproject.toml and installing them:  python3 scripts/lock_requirements.py
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
HEADER = ("# Elastiq's runtime dependencies, pinned as installed and tested. Written by\n"
          "# scripts/lock_requirements.py; scripts/setup.sh --locked installs with it as pip\n"
          "# constraints (the images do).\n")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str) -> dict[str, str]:
    """Every distribution `root` needs at run time (itself left out), name -> version."""
    found: dict[str, str] = {}
    todo = [root]
    while todo:
        dist = metadata.distribution(todo.pop())
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            key = _key(req.name)
            if key not in found:
                found[key] = metadata.version(req.name)
                todo.append(req.name)
    return found


def main() -> int:
    pins = closure("elastiq")
    text = HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
    (ROOT / "requirements.lock").write_text(text, encoding="utf-8")
    print(f"wrote requirements.lock ({len(pins)} distributions)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
