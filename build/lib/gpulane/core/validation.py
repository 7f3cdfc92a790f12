"""One way to tell a user what pydantic refused: one ``path: problem`` per error."""

from __future__ import annotations

from pydantic import ValidationError


def describe(err: ValidationError, prefix: str | None = None) -> str:
    """``spec.tier: String should have at most 63 characters; ...``. A validator's own error (a
    PolicyError, say) is shown as its message, without pydantic's "Value error," in front."""
    parts = []
    for problem in err.errors():
        loc = [str(p) for p in problem["loc"]]
        whole = not loc and problem["type"] == "value_error"  # a model's own check: its message names the fields
        where = ".".join([*([prefix] if prefix and not whole else []), *loc])
        text = str((problem.get("ctx") or {}).get("error") or problem["msg"])
        parts.append(f"{where}: {text}" if where else text)
    return "; ".join(parts)
