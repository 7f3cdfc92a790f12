"""llama-swap's per-model ``filters`` as a GpuModel's ``spec.filters`` (docs/migration.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulane.api.resources import OWN_FIELDS
from gpulane.importers.pod_rewrites import Import


def model_filters(raw: object, where: str, out: Import) -> dict[str, Any]:
    """llama-swap's filters as GpuModel.spec.filters: stripParams (a comma-separated string, or a list) and
    setParams (a mapping). model and priority are gpulane's: they are left out, with a warning."""
    if not isinstance(raw, Mapping):
        out.warn(where, "not a mapping; the bridge forwards bodies as they are")
        return {}
    filters: dict[str, Any] = {}
    strip = raw.get("stripParams")
    names = (
        [n.strip() for n in strip.split(",")] if isinstance(strip, str) else strip if isinstance(strip, list) else []
    )
    kept = [str(n) for n in names if n and str(n) not in OWN_FIELDS]
    if dropped := [str(n) for n in names if str(n) in OWN_FIELDS]:
        out.warn(f"{where}.stripParams", f"{', '.join(dropped)}: gpulane's own fields, never stripped")
    if kept:
        filters["stripParams"] = kept
    given = raw.get("setParams")
    if isinstance(given, Mapping):
        if dropped := [str(k) for k in given if str(k) in OWN_FIELDS]:
            out.warn(f"{where}.setParams", f"{', '.join(dropped)}: gpulane's own fields, never set")
        if put := {str(k): v for k, v in given.items() if str(k) not in OWN_FIELDS}:
            filters["setParams"] = put
    for key in raw:
        if key not in ("stripParams", "setParams"):
            out.warn(f"{where}.{key}", "not a filter gpulane knows (stripParams, setParams); ignored")
    return filters
