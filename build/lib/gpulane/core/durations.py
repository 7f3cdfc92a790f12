"""Durations as written in scenarios and manifests: seconds, or strings like ``90s``, ``4m``, ``1h30m``."""

from __future__ import annotations

import re

# Longer than any job or scenario; beyond it a typo (or an attack) becomes an overflow to inf.
MAX_SECONDS = 10 * 365 * 86400.0
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")


def parse_duration(value: object) -> float:
    """Seconds from a number or a duration string; a ValueError that quotes the input otherwise."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '90s', '4m', '12h'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif len(text) <= 64 and _WHOLE.fullmatch(text):
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text))
        else:
            raise ValueError(f"duration {value[:40]!r} is not seconds or a string like '90s', '4m', '1h30m', '12h'")
    else:
        raise ValueError(f"a duration must be a number or a string, got {type(value).__name__}")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"duration {value!r} is not finite")
    if seconds < 0:
        raise ValueError(f"duration {value!r} is negative")
    if seconds > MAX_SECONDS:
        raise ValueError(f"duration {value!r} is longer than 10 years")
    return seconds
