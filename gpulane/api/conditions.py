"""Status conditions as the Kubernetes API conventions shape them: one entry per type, whose transition time
moves only when its status changes."""

from __future__ import annotations

from typing import Any

from gpulane.api.times import format_time


def condition(
    type_: str, status: bool, reason: str, message: str, now: float, generation: int | None = None
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": format_time(now),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def merge_condition(existing: list[dict[str, Any]] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """Replace the condition of the same type; keep its transition time when its status did not change."""
    out = []
    for cond in existing or []:
        if cond.get("type") == new["type"]:
            if cond.get("status") == new["status"]:
                new = {**new, "lastTransitionTime": cond.get("lastTransitionTime", new["lastTransitionTime"])}
            continue
        out.append(cond)
    out.append(new)
    return out
