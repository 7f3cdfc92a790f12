"""Files generated from the models (the CRDs, the chart's values schema, the admission policies): written by
``make crds``, compared by the drift checks (``--check``), which the unit tests run."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path


def sync(files: Mapping[Path, str], *, check: bool, remedy: str, stale: Iterable[Path] = ()) -> int:
    """``files`` written where they differ, and ``stale`` ones removed; with ``check``, nothing written, each
    file that differs, is missing or is stale reported with ``remedy``, and 1 returned."""
    changed = {path: text for path, text in files.items() if not path.is_file() or path.read_text() != text}
    gone = sorted(stale)
    if check:
        for path in changed:
            print(f"{path}: {'differs' if path.exists() else 'missing'}", file=sys.stderr)
        for path in gone:
            print(f"{path}: stale", file=sys.stderr)
        if changed or gone:
            print(f"generated files are out of date: {remedy}", file=sys.stderr)
            return 1
        return 0
    for path, text in changed.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    for path in gone:
        path.unlink()
        print(f"removed {path}")
    return 0
