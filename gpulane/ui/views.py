"""The web page's views as data: lanes, the queue, chains, one job, usage. Pure, as ``gpulane.explain.report``
(whose rows they extend): the objects a viewer may see in (``scope.visible``), JSON-ready dicts out. Times are
Unix seconds, so the page counts running jobs' elapsed time itself between updates."""

from __future__ import annotations

from dataclasses import dataclass

from gpulane.api.contract import Body
from gpulane.api.times import parse_time
from gpulane.core.policy import Policy
from gpulane.explain import report, usage
from gpulane.ui.scope import HIDDEN

QUEUE_ROWS = 500  # the queue view's rows at most (the count says how many more wait): a page of 5,000 is unread
NEXT_ROWS = 3  # what comes next on each lane
TIMELINE_SECONDS = 3 * 3600.0
ENDED = ("Succeeded", "Failed", "Cancelled")


@dataclass(frozen=True, slots=True)
class QueueFilter:
    namespace: str | None = None
    model: str | None = None
    member: str | None = None

    def admits(self, row: Body) -> bool:
        namespace = (row["job"] or "").split("/", 1)[0] if row["job"] else None
        return ((self.namespace is None or namespace == self.namespace)
                and (self.model is None or row["model"] == self.model)
                and (self.member is None or row.get("member") == self.member))  # fmt: skip


def _shown(key: str) -> str | None:
    """A job's ``namespace/name``, or None for a hidden one."""
    return None if key in (HIDDEN, f"{HIDDEN}/{HIDDEN}") else key


def _rows(jobs: list[Body], models: dict[str, Body], now: float) -> dict[str, list[Body]]:
    rows = report.queue(jobs, models, now)
    for row in rows["running"] + rows["waiting"]:
        row["job"] = _shown(row["job"])
    for row in rows["waiting"]:
        row["band"] = report.band_name(row["priority"])
    return rows


def _next(jobs: list[Body], lane: str) -> list[Body]:
    """The waiting jobs whose positions are on ``lane`` (its forecast's), first first."""
    upcoming = []
    for job in jobs:
        status, spec = job.get("status") or {}, job.get("spec") or {}
        if status.get("expectedLane") == lane and status.get("position") and status.get("phase") == "Pending":
            upcoming.append({
                "job": _shown(f"{job['metadata']['namespace']}/{job['metadata']['name']}"),
                "model": spec.get("model"), "member": spec.get("member"), "position": status["position"],
                "estimatedStart": parse_time(status.get("estimatedStart")),
            })  # fmt: skip
    return sorted(upcoming, key=lambda r: r["position"])[:NEXT_ROWS]


def timeline(jobs: list[Body], lane: str, now: float, window: float = TIMELINE_SECONDS) -> list[Body]:
    """The lane's last ``window`` as segments, oldest first: each job's model load (dispatch to start) and run
    (start to end, or now). The gaps between segments are the lane's idle time."""
    segments = []
    for job in jobs:
        status = job.get("status") or {}
        if status.get("lane") != lane:
            continue
        dispatched, started = parse_time(status.get("dispatchedAt")), parse_time(status.get("startedAt"))
        ended = parse_time(status.get("finishedAt"))
        end = ended if ended is not None else (now if status.get("phase") not in ENDED else None)
        if dispatched is None or end is None or end < now - window:
            continue
        key = _shown(f"{job['metadata']['namespace']}/{job['metadata']['name']}")
        model = (job.get("spec") or {}).get("model")
        run_from = started if started is not None else end
        if run_from - dispatched > 0.05:  # a load shown as such (a warm dispatch starts within milliseconds)
            segments.append({"kind": "load", "job": key, "model": model, "start": dispatched, "end": run_from})
        if started is not None:
            segments.append({"kind": "run", "job": key, "model": model, "start": started, "end": end,
                             "phase": status.get("phase")})  # fmt: skip
    return sorted(segments, key=lambda s: s["start"])


def lanes(jobs: list[Body], lane_objs: list[Body], models: dict[str, Body], now: float) -> list[Body]:
    """Each lane: its node, the model(s) loaded, the running job with elapsed and expected time, what comes next,
    its last hour's figures, and its timeline."""
    rows = _rows(jobs, models, now)
    stats = {r["lane"]: r for r in report.lanes(lane_objs, jobs, now)}
    out = []
    for lane in sorted(lane_objs, key=lambda obj: obj["metadata"]["name"]):
        name, spec = lane["metadata"]["name"], lane.get("spec") or {}
        out.append({
            **stats[name],
            "node": spec.get("nodeName") or ",".join(f"{k}={v}" for k, v in (spec.get("nodeSelector") or {}).items()),
            "running": [r for r in rows["running"] if r["lane"] == name],
            "next": _next(jobs, name),
            "timeline": timeline(jobs, name, now),
            "window": TIMELINE_SECONDS,
        })  # fmt: skip
    return out


def queue(jobs: list[Body], models: dict[str, Body], now: float, wanted: QueueFilter, limit: int = QUEUE_ROWS) -> Body:
    """The waiting jobs in order (at most ``limit``), with band, member, score and its terms, position and estimated
    start, and how many the filter leaves; the running jobs too."""
    rows = _rows(jobs, models, now)
    waiting = [r for r in rows["waiting"] if wanted.admits(r)]
    return {
        "running": [r for r in rows["running"] if wanted.admits(r)],
        "waiting": waiting[:limit],
        "total": len(waiting),
        "models": sorted({r["model"] for r in rows["waiting"] if r["model"]}),
    }


def chains(chain_objs: list[Body], now: float) -> list[Body]:
    """Each chain's row (``gpulane chains``), with its steps done and in all for a progress bar."""
    rows = report.chains(chain_objs, now)
    by_key = {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in chain_objs}
    for row in rows:
        status = by_key[row["chain"]].get("status") or {}
        if row["current"] != "-":  # a step is a job of the chain's namespace: the page links its story
            row["current"] = f"{row['chain'].split('/', 1)[0]}/{row['current']}"
        row["completed"], row["total"] = status.get("completed") or 0, status.get("total")
        row["failed"] = status.get("failed") or 0
    return rows


def job(obj: Body, lane_objs: list[Body], policy: Policy, now: float) -> Body:
    """One job: its story as ``gpulane why`` tells it, and its score's terms for a drawing."""
    status = obj.get("status") or {}
    return {
        "job": f"{obj['metadata']['namespace']}/{obj['metadata']['name']}",
        "model": (obj.get("spec") or {}).get("model"),
        "phase": status.get("phase") or "Pending",
        "position": status.get("position"),
        "estimatedStart": parse_time(status.get("estimatedStart")),
        "score": status.get("score") or (status.get("story") or {}).get("score"),
        "story": report.why(obj, lane_objs, policy, now),
    }


def usage_rows(jobs: list[Body], lane_objs: list[Body], policy: Policy, now: float, window: float) -> list[Body]:
    """GPU time per team and member over ``window`` (``gpulane usage``); hidden jobs count as one team."""
    rows = usage.usage(jobs, lane_objs, policy, now, window)
    for row in rows:
        if row["team"] == HIDDEN:
            row["team"], row["members"] = None, []
    return rows
