"""Summaries of a simulation: waits per stream, swaps, utilisation and fairness per band."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gpulane.core.priority import ALIASES
from gpulane.core.sim.engine import JobRecord, SimResult
from gpulane.core.sim.llamaswap import LlamaSwapConfig

PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (the common 'type 7' definition); inf is unbounded."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    if rank == low or ordered[high] == ordered[low]:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when everyone got the same, 1/n when one member got it all."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


def band_label(band: int, spacing: int) -> str:
    centre = band * spacing
    for alias, value in ALIASES.items():
        if value == centre:
            return alias
    return f"band{centre:+d}"


def _wait_stats(records: Sequence[JobRecord]) -> dict[str, float | None]:
    """Waits of the jobs that started; a dropped job never starts, so it counts as an endless wait.

    A policy that drops work must not look better because dropped jobs do not wait: a statistic
    that falls on a dropped job is unbounded, reported as None (null in JSON, "dropped" in tables).
    """
    waits = [r.wait for r in records if r.started_at is not None] + [math.inf for r in records if r.dropped]
    # (An expired job is neither: its caller gave up at the deadline, and it never ran. Counted apart.)
    stats: dict[str, float | None] = {f"p{p}": _num(percentile(waits, p)) for p in PERCENTILES}
    stats["max"] = _num(max(waits)) if waits else None
    stats["mean"] = _num(sum(waits) / len(waits)) if waits else None
    return stats


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _busy_seconds(records: Sequence[JobRecord]) -> float:
    """Lane time with at least one of these jobs running: jobs sharing a lane's slots overlap."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r.started_at is not None and r.lane is not None:
            spans.setdefault(r.lane, []).append((r.started_at, r.started_at + r.run_seconds))
    busy = 0.0
    for lane_spans in spans.values():
        covered = -math.inf
        for start, stop in sorted(lane_spans):
            if stop > covered:
                busy += stop - max(start, covered)
                covered = stop
    return busy


def summarize(result: SimResult, band_spacing: int) -> dict[str, Any]:
    streams: dict[str, list[JobRecord]] = {}
    for job in result.jobs:
        streams.setdefault(job.stream or job.name, []).append(job)
    first = min((j.submitted_at for j in result.jobs if j.submitted_at is not None), default=0.0)
    capacity = max(result.end - first, 1e-9) * len(result.lanes)  # lane-seconds since work first arrived

    per_stream = {
        name: {
            "jobs": len(records),
            "unfinished": sum(1 for r in records if r.finished_at is None and not r.dropped and r.expired_at is None),
            "expired": sum(1 for r in records if r.expired_at is not None),
            "late": sum(1 for r in records if r.late),
            "lateGpuSeconds": sum(r.run_seconds for r in records if r.late),
            "rejected": sum(1 for r in records if r.rejected),
            "dropped": sum(1 for r in records if r.dropped),
            "waitSeconds": _wait_stats(records),
            "swaps": sum(r.swaps for r in records),
            "coldStarts": sum(1 for r in records if r.cold_start),
            "gpuUtilisation": _busy_seconds(records) / capacity,
        }
        for name, records in streams.items()
    }
    bands = {
        band_label(band, band_spacing): {
            "fairness": jain(list(shares.values())),
            "contendedSeconds": shares,
            "contendedShare": {m: v / (sum(shares.values()) or 1.0) for m, v in shares.items()},
        }
        for band, shares in sorted(result.contended.items(), reverse=True)
    }
    changed: dict[str, int] = {}
    for job in result.jobs:
        for term in job.changed_by:
            changed[term] = changed.get(term, 0) + 1
    return {
        "streams": per_stream,
        "bands": bands,
        "overall": {
            "jobs": len(result.jobs),
            "rejected": sum(1 for j in result.jobs if j.rejected),
            "dropped": sum(1 for j in result.jobs if j.dropped),
            "swaps": sum(j.swaps for j in result.jobs),
            "switches": sum(1 for j in result.jobs if j.switched),
            "loadingGpuSeconds": sum(j.load_seconds for j in result.jobs),
            "loadsYielded": result.yields,
            "expired": sum(1 for j in result.jobs if j.expired_at is not None),
            "lateGpuSeconds": sum(j.run_seconds for j in result.jobs if j.late),
            "coldStarts": sum(1 for j in result.jobs if j.cold_start),
            "gpuUtilisation": _busy_seconds(result.jobs) / capacity,
            "idleWhileWaitingSeconds": result.idle_while_waiting,
            "makespanSeconds": result.end,
            "winnerChangedBy": changed,
        },
    }


def jobs_json(result: SimResult) -> list[dict[str, Any]]:
    return [
        {
            "name": j.name,
            "stream": j.stream,
            "member": j.member,
            "tier": j.tier,
            "priority": j.priority,
            "model": j.model,
            "submittedAt": j.submitted_at,
            "rejected": j.rejected,
            "admittedAt": j.admitted_at,
            "dispatchedAt": j.dispatched_at,
            "startedAt": j.started_at,
            "finishedAt": j.finished_at,
            "coldStart": j.cold_start,
            "replaced": j.replaced,
            "swaps": j.swaps,
            "loadSeconds": j.load_seconds,
            "switched": j.switched,
            "yielded": j.yielded,
            "expiredAt": j.expired_at,
            "lane": j.lane,
            "changedBy": j.changed_by,
            "score": j.score,
        }
        for j in result.jobs
    ]


def llama_swap_settings(config: LlamaSwapConfig) -> str:
    """``concurrencyLimit 10 per model (sdxl 4), clients retry after a 429``."""
    limits = ", ".join(f"{name} {m.concurrency_limit}" for name, m in sorted(config.models.items()))
    text = f"concurrencyLimit {config.concurrency_limit} per model" + (f" ({limits})" if limits else "")
    return text + f", clients {config.clients} after a 429"


def human(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def comparison_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Streams down, policies across, as fixed-width text."""
    policies = list(summaries)
    first = next(iter(summaries.values()))
    width = max(14, *(len(p) + 2 for p in policies))
    lines: list[str] = []

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"{label:<34}" + "".join(f"{c:>{width}}" for c in cells))

    def wait(stream: dict[str, Any], stat: str) -> str:
        value = stream["waitSeconds"][stat]
        return "dropped" if value is None and stream["dropped"] else human(value)

    row("", policies)
    for stream in first["streams"]:
        lines.append(f"stream {stream} ({first['streams'][stream]['jobs']} jobs)")
        cells = [summaries[p]["streams"][stream] for p in policies]
        for stat in ("p50", "p95", "max"):
            row(f"  wait {stat}", [wait(cell, stat) for cell in cells])
        row("  swaps", [str(cell["swaps"]) for cell in cells])
        for count, label in (
            ("rejected", "  rejected (429)"),
            ("dropped", "  dropped after a 429"),
            ("expired", "  expired (queue timeout)"),
            ("late", "  ran after its caller left"),
        ):
            if any(cell[count] for cell in cells):
                row(label, [str(cell[count]) for cell in cells])
    lines.append("overall")
    row("  rejected (429)", [str(summaries[p]["overall"]["rejected"]) for p in policies])
    row("  dropped after a 429", [str(summaries[p]["overall"]["dropped"]) for p in policies])
    row("  swaps", [str(summaries[p]["overall"]["swaps"]) for p in policies])
    if any(summaries[p]["overall"]["switches"] for p in policies):  # a server that holds several models
        row("  switches in the server", [str(summaries[p]["overall"]["switches"]) for p in policies])
        row("  GPU time loading", [human(summaries[p]["overall"]["loadingGpuSeconds"]) for p in policies])
    if any(summaries[p]["overall"]["loadsYielded"] for p in policies):
        row("  loads yielded", [str(summaries[p]["overall"]["loadsYielded"]) for p in policies])
    if any(summaries[p]["overall"]["lateGpuSeconds"] or summaries[p]["overall"]["expired"] for p in policies):
        row("  GPU time for callers gone", [human(summaries[p]["overall"]["lateGpuSeconds"]) for p in policies])
    row("  GPU utilisation", [f"{summaries[p]['overall']['gpuUtilisation']:.1%}" for p in policies])
    row(
        "  idle while work waits",
        [human(summaries[p]["overall"]["idleWhileWaitingSeconds"]) for p in policies],
    )
    row("  makespan", [human(summaries[p]["overall"]["makespanSeconds"]) for p in policies])
    bands = sorted({b for s in summaries.values() for b in s["bands"]})
    for band in bands:
        row(
            f"  fairness ({band}, Jain)",
            [
                f"{summaries[p]['bands'][band]['fairness']:.2f}" if band in summaries[p]["bands"] else "-"
                for p in policies
            ],
        )
        members = sorted({m for s in summaries.values() for m in s["bands"].get(band, {}).get("contendedShare", {})})
        for member in members if len(members) <= 4 else ():
            row(
                f"  GPU share, {band}: {member}"[:34],
                [
                    f"{s['bands'][band]['contendedShare'].get(member, 0):.0%}" if band in s["bands"] else "-"
                    for s in (summaries[p] for p in policies)
                ],
            )
    return "\n".join(lines)
