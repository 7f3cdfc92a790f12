"""The operator's tunables (``gpulane operator --help`` sets them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Settings:
    namespace: str = "gpulane-system"  # where backend pods live
    exact_positions: int = 50  # per lane; positions beyond are rounded up to a multiple of this
    # A burst's first positions keep up with the apiserver's creates at 0.8x or better (docs/benchmarks.md).
    status_writes_per_second: float = 500.0
    status_interval: float = 1.0
    tick_seconds: float = 1.0
    resync_seconds: float = 300.0  # between lists that find deletions no watch reported (resync.py)
    unload_namespace: str | None = None  # where the bridge's /unload Lease is honoured (none: nowhere)
    shard: str | None = None  # the lanes, models and jobs labelled gpulane.io/shard=<it>; None: those without
