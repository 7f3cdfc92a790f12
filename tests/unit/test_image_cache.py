"""The local cluster's image cache (hack/localcluster/images.py) stays bounded: each source edit makes a new
project archive of ~400 MB, and a day of edits left 60 of them (24 GB) on this project's machine."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

HACK = str(Path(__file__).resolve().parents[2] / "hack")
if HACK not in sys.path:
    sys.path.insert(0, HACK)

from localcluster import images  # noqa: E402  (lives in hack/, which is not a package)


def test_the_cache_keeps_the_archives_in_use_and_the_newest_project_archives_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULANE_IMAGES_CACHE", str(tmp_path))
    now = time.time()

    def archive(name: str, age: float) -> Path:
        path = tmp_path / name
        path.write_bytes(b"x")
        os.utime(path, (now - age, now - age))
        return path

    projects = [archive(f"gpulane-{i:02d}.tar", age=60.0 * i) for i in range(10)]  # the newest first
    base, layer = archive("python-base-1.tar", 600.0), archive("python-base-1.layer.tar", 3 * 86400.0)
    stale = archive("pause-old.tar", 2 * 86400.0)
    in_use = [images.Image("gpulane.local/gpulane:dev", projects[9], "k"), images.Image("base", base, "b")]

    images._prune(in_use)

    left = sorted(p.name for p in tmp_path.iterdir())
    kept = [p.name for p in projects[: images.KEEP_PROJECT_ARCHIVES]] + [projects[9].name]
    assert left == sorted([*kept, base.name, layer.name])
    assert not stale.exists()
