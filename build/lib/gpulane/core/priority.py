"""Priority values: the signed integer that callers send, its aliases, and its band.

Two parsers exist on purpose. Headers are lenient (anything unparseable means 0, as the
design demands of ``X-LlamaSwap-Priority``); manifests and scenarios are strict, because a
typo in a file should be an error, not silently "normal".
"""

from __future__ import annotations

import re

ALIASES: dict[str, int] = {"interactive": 100, "normal": 0, "batch": -100}

# Ints beyond this saturate instead of being parsed: nobody means 10**40, and converting
# unbounded digit strings is a denial-of-service lever. Policy bounds clamp further.
SATURATION = 10**18
_INT = re.compile(r"[+-]?[0-9]{1,4000}")


def _parse_int_text(text: str) -> int | None:
    stripped = text.strip()
    if not _INT.fullmatch(stripped):
        return None
    digits = stripped.lstrip("+-")
    negative = stripped.startswith("-")
    if len(digits.lstrip("0")) > len(str(SATURATION)) - 1:
        return -SATURATION if negative else SATURATION
    value = int(stripped)
    return max(-SATURATION, min(SATURATION, value))


def parse_priority(value: str | int | None) -> int:
    """Lenient parse with header semantics: ints with an optional sign, or an alias; else 0."""
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return max(-SATURATION, min(SATURATION, value))
    alias = ALIASES.get(value.strip().lower())
    if alias is not None:
        return alias
    parsed = _parse_int_text(value)
    return 0 if parsed is None else parsed


def resolve_priority(value: object) -> int:
    """Strict parse for manifests and scenarios: an int or a known alias, or a ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"priority must be an integer or one of {', '.join(ALIASES)}, got a boolean")
    if isinstance(value, int):
        return parse_priority(value)
    if isinstance(value, str):
        alias = ALIASES.get(value.strip().lower())
        if alias is not None:
            return alias
        parsed = _parse_int_text(value)
        if parsed is not None:
            return parsed
        raise ValueError(f"priority {value[:40]!r} is neither an integer nor one of {', '.join(ALIASES)}")
    raise ValueError(f"priority must be an integer or one of {', '.join(ALIASES)}, got {type(value).__name__}")


def shown(value: int) -> str:
    """An integer for a message: in full when reasonable, else its order of magnitude (never a wall of digits)."""
    if abs(value) < 10**12:
        return str(value)
    return f"{'-' if value < 0 else ''}about 10^{int(abs(value).bit_length() * 0.30103)}"


def band_of(priority: int, spacing: int) -> int:
    """The band index of a priority: the nearest multiple of the spacing (halves round up).

    With spacing 100: -100 -> -1, -51 -> -1, -50 -> 0, 49 -> 0, 50 -> 1, 100 -> 1.
    """
    return (priority + spacing // 2) // spacing
