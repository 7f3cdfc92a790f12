"""Times as the Kubernetes API writes them (RFC 3339), and durations as kubectl shows them."""

from __future__ import annotations

import datetime


def parse_time(text: str | None) -> float | None:
    """Seconds since the epoch from an RFC 3339 timestamp as the apiserver writes it."""
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def format_time(seconds: float) -> str:
    """RFC 3339 in UTC with millisecond precision (what a date-time schema field accepts)."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_duration(seconds: float) -> str:
    """``45s``, ``12m30s``, ``3h05m``: compact like kubectl's AGE column."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_micro_time(seconds: float) -> str:
    """RFC 3339 with exactly six fractional digits: a MicroTime field (a Lease's renewTime) takes no other."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
