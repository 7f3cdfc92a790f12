"""What ``gpulane queue``, ``gpulane lanes``, ``gpulane chains`` and ``gpulane why`` print, from the resources
as plain dicts.

Everything here is pure: the command line reads the objects and hands them over, and the tests feed
objects straight in.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Sequence

from gpulane.api.contract import Body
from gpulane.api.resources import readable_records
from gpulane.api.times import format_duration, parse_time
from gpulane.core.explain import REASONS, deciding_term, format_score
from gpulane.core.policy import Policy
from gpulane.core.priority import resolve_priority
from gpulane.core.score import ScoreBreakdown


def clock(seconds: float | None) -> str:
    """``14:05:09`` in UTC, or ``-``."""
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).strftime("%H:%M:%S")


def duration(seconds: float | None) -> str:
    """Like kubectl's AGE column (``12m30s``), or ``-``."""
    return "-" if seconds is None or not math.isfinite(seconds) else format_duration(seconds)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Aligned columns, like kubectl's."""
    cells = [list(headers), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def _key(job: Body) -> str:
    return f"{job['metadata']['namespace']}/{job['metadata']['name']}"


def _priority(job: Body) -> int:
    score = (job.get("status") or {}).get("score") or {}
    if "priority" in score:
        return int(score["priority"])
    try:
        return resolve_priority((job.get("spec") or {}).get("priority", 0))
    except ValueError:
        return 0


def queue(jobs: list[Body], models: dict[str, Body], now: float, lane: str | None = None) -> dict[str, list[Body]]:
    """Running jobs (with elapsed and expected time) and waiting ones (by position), as rows."""
    running, waiting = [], []
    for job in jobs:
        spec, status = job.get("spec") or {}, job.get("status") or {}
        phase = status.get("phase") or "Pending"
        if lane is not None and status.get("lane") not in (lane, None):
            continue
        if phase in ("Running", "Dispatching"):
            started = parse_time(status.get("startedAt"))
            expected = (models.get(spec.get("model", "")) or {}).get("runSeconds")
            running.append(
                {
                    "job": _key(job),
                    "phase": phase,
                    "lane": status.get("lane"),
                    "model": spec.get("model"),
                    "member": spec.get("member"),
                    "elapsed": None if started is None else now - started,
                    "expected": spec.get("expectedRunSeconds") or expected,
                }
            )
        elif phase == "Pending":
            score = status.get("score") or {}
            waiting.append(
                {
                    "position": status.get("position"),
                    "exact": status.get("positionExact", True),
                    "job": _key(job),
                    "member": spec.get("member"),
                    "model": spec.get("model"),
                    "priority": _priority(job),
                    "tier": spec.get("tier") or "free",
                    "score": score,
                    "waited": now - (parse_time(job["metadata"].get("creationTimestamp")) or now),
                    "estimatedStart": parse_time(status.get("estimatedStart")),
                    "lane": status.get("expectedLane"),  # the lane its position is in
                    "reason": status.get("reason"),
                }
            )
    waiting.sort(key=lambda r: (r["position"] is None, r["position"] or 0, -r["waited"]))
    return {"running": running, "waiting": waiting}


def render_queue(rows: dict[str, list[Body]], wide: bool = False) -> str:
    parts = []
    if rows["running"]:
        parts.append(
            table(
                ["RUNNING", "LANE", "MODEL", "MEMBER", "ELAPSED", "EXPECTED"],
                (
                    [
                        r["job"],
                        r["lane"] or "-",
                        r["model"],
                        r.get("member") or "-",
                        duration(r["elapsed"]) if r["phase"] == "Running" else "loading",
                        duration(r["expected"]),
                    ]
                    for r in rows["running"]
                ),
            )
        )
    headers = [
        "POS",
        "JOB",
        "MEMBER",
        "MODEL",
        "BAND",
        "TIER",
        "PRIO",
        "+TIER",
        "+AFF",
        "+AGING",
        "SCORE",
        "WAITED",
        "EST. START",
    ]
    if wide:
        headers.append("NOTE")
    body = []
    for r in rows["waiting"]:
        s = r["score"]
        position = "-" if r["position"] is None else f"{'' if r['exact'] else '~'}{r['position']}"
        row = [
            position,
            r["job"],
            r.get("member") or "-",
            r["model"],
            band_name(r["priority"]),
            r["tier"],
            s.get("priority", r["priority"]),
            s.get("tier", "-"),
            s.get("affinity", "-"),
            _num(s.get("aging")),
            _num(s.get("total")),
            duration(r["waited"]),
            clock(r["estimatedStart"]),
        ]
        if wide:
            row.append(r["reason"] or "")
        body.append(row)
    parts.append(table(headers, body) if body else "no job is waiting")
    return "\n\n".join(parts)


def _num(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def band_name(priority: int) -> str:
    """A band's name (``interactive``, ``normal``, ``batch``), else its number."""
    return {100: "interactive", 0: "normal", -100: "batch"}.get(priority, str(priority))


def lanes(lane_objs: list[Body], jobs: list[Body], now: float, window: float = 3600.0) -> list[Body]:
    """Each lane's resident model (and the others its server holds), running jobs, queue depth per band, and swaps
    and use over ``window``."""
    out = []
    for lane in lane_objs:
        name, status = lane["metadata"]["name"], lane.get("status") or {}
        history = status.get("history") or []
        recent = [r for r in history if (parse_time(r.get("at")) or 0) >= now - window]
        busy = 0.0
        for job in jobs:
            js = job.get("status") or {}
            if js.get("lane") != name or not js.get("startedAt"):
                continue
            start = max(parse_time(js.get("startedAt")) or now, now - window)
            end = parse_time(js.get("finishedAt")) or now
            busy += max(0.0, end - start)
        loads = [r for r in history if r.get("loadSeconds") is not None]
        out.append(
            {
                "lane": name,
                "lastLoad": None if not loads else {k: loads[-1].get(k) for k in ("model", "loadSeconds", "switch")},
                "resident": status.get("residentModel"),
                "loaded": status.get("loaded") or [],
                "ready": bool(status.get("ready")),
                "running": status.get("running") or [],
                "queueDepth": status.get("queueDepth") or {},
                "swaps": sum(1 for r in recent if r.get("load")),
                "dispatches": len(recent),
                "utilisation": min(1.0, busy / window),
            }
        )
    return out


def render_lanes(rows: list[Body]) -> str:
    return table(
        [
            "LANE",
            "RESIDENT",
            "ALSO LOADED",
            "READY",
            "RUNNING",
            "QUEUE BY BAND",
            "DISPATCHES/1H",
            "SWAPS/1H",
            "LAST LOAD",
            "BUSY/1H",
        ],
        (
            [
                r["lane"],
                r["resident"] or "-",
                ", ".join(r.get("loaded") or []) or "-",
                "yes" if r["ready"] else "no",
                ", ".join(r["running"]) or "-",
                ", ".join(
                    f"{band_name(int(b))}: {n}" for b, n in sorted(r["queueDepth"].items(), key=lambda x: -int(x[0]))
                )
                or "-",
                r["dispatches"],
                r["swaps"],
                _last_load(r.get("lastLoad")),
                f"{r['utilisation']:.0%}",
            ]
            for r in rows
        ),
    )


def _last_load(load: Body | None) -> str:
    """``beta 0.14s (switch)``: a lane's latest load, and whether its server switched (no new pod)."""
    if not load:
        return "-"
    return f"{load['model']} {load['loadSeconds']:.2f}s ({'switch' if load.get('switch') else 'new pod'})"


def _load_of(key: str, lane: str | None, lane_objs: list[Body]) -> Body | None:
    """The job's own dispatch record on its lane, once its load is done (what it cost, and how)."""
    for obj in lane_objs:
        if obj["metadata"]["name"] == lane:
            records = (obj.get("status") or {}).get("history") or []
            return next((r for r in records if r.get("job") == key and r.get("loadSeconds") is not None), None)
    return None


def why(job: Body, lane_objs: list[Body], policy: Policy, now: float) -> list[str]:
    """A job's story in sentences: when it was queued, what went ahead of it and why, its load, its start."""
    meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    key, phase = _key(job), status.get("phase") or "Pending"
    queued = parse_time(meta.get("creationTimestamp")) or now
    priority, tier, model = _priority(job), spec.get("tier") or "free", spec.get("model", "")
    lines = [
        f"{key} ({model}, priority {priority}, tier {tier}, member {spec.get('member') or meta['namespace']}) "
        f"was queued at {clock(queued)}."
    ]
    story = status.get("story")
    histories = [readable_records((lane.get("status") or {}).get("history"))[0] for lane in lane_objs]
    unread = 0
    if story is not None:
        (records, unread), total = readable_records(story.get("ranAhead")), story.get("ranAheadTotal", 0)
    else:  # still waiting (or dispatched before stories existed): the lanes remember recent dispatches
        until = parse_time(status.get("dispatchedAt")) or now
        records = sorted(
            (
                r
                for history in histories
                for r in history
                if queued < (parse_time(r.get("at")) or 0) < until and r.get("job") != key
            ),
            key=lambda r: r["at"],
        )
        total = len(records)
    before = []  # what each lane had last dispatched when the job was queued
    for history in histories:
        earlier = [r for r in history if (parse_time(r.get("at")) or now) <= queued]
        before += earlier[-1:]
    if before:
        lines.append("Running then: " + "; ".join(f"{r['job']} on {r['lane']}" for r in before) + ".")
    if not records:
        lines.append("Nothing was dispatched ahead of it.")
    else:
        shown = "" if len(records) == total else f" (the latest {len(records)} shown)"
        lines.append(f"While it waited, {total} job(s) were dispatched ahead of it{shown}:")
        bonus = policy.tier_bonus.get(tier, 0)
        for r in records:
            at = parse_time(r["at"]) or now
            s = r["score"]
            winner = ScoreBreakdown(s["priority"], s["tier"], s["affinity"], s["aging"])
            affinity = policy.affinity_bonus if model == r["model"] and not r.get("load") else 0
            loser = ScoreBreakdown(priority, bonus, affinity, (at - queued) / policy.aging_divisor_seconds)
            term = deciding_term(winner, loser, policy.band_spacing)
            lines.append(
                f"  {clock(at)} {r['job']} on {r['lane']}, score {format_score(winner)}: ahead because of "
                f"{REASONS[term]}; this job's score then was about {loser.total:.1f}."
            )
    if unread:  # the CRD stores records unchecked: one not in the operator's shape is left out, and said so
        lines.append(f"{unread} record(s) of its story are not in the shape the operator writes: left out.")
    dispatched, started = parse_time(status.get("dispatchedAt")), parse_time(status.get("startedAt"))
    if dispatched is None:
        position, estimate = status.get("position"), parse_time(status.get("estimatedStart"))
        where = f"at position {position}" if position else "waiting"
        lines.append(f"It is {where} after {duration(now - queued)}; estimated start {clock(estimate)}.")
        if status.get("score"):
            s = status["score"]
            lines.append(
                f"Its score now: {format_score(ScoreBreakdown(s['priority'], s['tier'], s['affinity'], s['aging']))}."
            )
        for lane in lane_objs:
            held = lane.get("status") or {}
            if model in (held.get("loaded") or []):
                lines.append(f"Lane {lane['metadata']['name']}'s server holds its model beside "
                             f"{held.get('residentModel')}: it starts there with no load.")  # fmt: skip
        team = policy.fair_share_team(meta["namespace"], spec.get("member") or meta["namespace"])
        lines += _lent(meta["namespace"], team or meta["namespace"], lane_objs, policy)
        return lines
    lines.append(
        f"It was dispatched at {clock(dispatched)} to lane {status.get('lane')} after {duration(dispatched - queued)}."
    )
    load = (story or {}).get("load")
    if started is not None and load:
        lines.append(f"Its model {model} had to load first: {duration(started - dispatched)} until it started.")
        record = _load_of(key, status.get("lane"), lane_objs)
        if record is not None:
            how = "its lane's server switched to it, with no new pod" if record.get("switch") else "in a new pod"
            lines.append(f"The load took {record['loadSeconds']:.2f}s, {how}.")
    elif started is not None:
        lines.append(f"Its model {model} was already loaded; it started at {clock(started)}.")
    if phase in ("Succeeded", "Failed", "Cancelled"):
        reason = f" ({status.get('reason')}: {status.get('message')})" if status.get("reason") else ""
        lines.append(f"It ended {phase} at {clock(parse_time(status.get('finishedAt')))}{reason}.")
    return lines


def _lent(namespace: str, team: str, lane_objs: list[Body], policy: Policy) -> list[str]:
    """For a waiting job: the lanes reserved for its team (its namespace, or its ``fairShareTeams`` team) that
    another team's job borrows now (a running job's team by its namespace: the lane lists no members). No job is
    preempted, so the lane is its team's again once those jobs end."""
    lines = []
    for lane in lane_objs:
        owners = ((lane.get("spec") or {}).get("reservedFor") or {}).get("namespaces") or []
        running = (lane.get("status") or {}).get("running") or []
        borrowers = [j for j in running if policy.fair_share_team(j.split("/", 1)[0], "") != team]
        if team in owners and borrowers:
            whose = f"namespace {team}" if team == namespace else f"team {team}"
            lines.append(
                f"Lane {lane['metadata']['name']} is reserved for {whose}, and lent while it had nothing waiting: "
                f"{', '.join(borrowers)} runs there and is not preempted; its {whose.split()[0]}'s jobs go first "
                "once it ends (at most its maxRunSeconds)."
            )
    return lines


def chains(chain_objs: list[Body], now: float) -> list[Body]:
    """One row per GpuChain: its progress, phase, current step and ETA."""
    rows = []
    for chain in sorted(chain_objs, key=_key):
        status = chain.get("status") or {}
        current, eta = status.get("current") or {}, parse_time(status.get("estimatedCompletion"))
        rows.append({
            "chain": _key(chain), "progress": status.get("progress") or "-", "phase": status.get("phase") or "-",
            "current": current.get("job") or "-", "currentPhase": current.get("phase") or "-",
            "position": current.get("position"), "gpuSeconds": status.get("gpuSeconds"),
            "eta": status.get("estimatedCompletion"), "etaIn": None if eta is None else max(0.0, eta - now),
        })  # fmt: skip
    return rows


def render_chains(rows: list[Body]) -> str:
    headers = ("CHAIN", "PROGRESS", "PHASE", "CURRENT", "STEP PHASE", "POSITION", "GPU TIME", "ETA")
    return table(headers, ((r["chain"], r["progress"], r["phase"], r["current"], r["currentPhase"],
                            r["position"] or "-", duration(r["gpuSeconds"]),
                            "-" if r["etaIn"] is None else f"in {duration(r['etaIn'])} ({r['eta']})")
                           for r in rows))  # fmt: skip


def why_chain(chain: Body, steps: list[Body], lane_objs: list[Body], policy: Policy, now: float) -> list[str]:
    """A chain's story: how far it is and when it should end, what ran ahead of its latest steps, and the
    story of its current (or last) step."""
    status = chain.get("status") or {}
    eta = parse_time(status.get("estimatedCompletion"))
    end = "no estimated end." if eta is None else f"estimated end {clock(eta)} (in {duration(eta - now)})."
    lines = [f"{_key(chain)} ({status.get('phase') or 'not started'}): {status.get('progress') or '0/?'} steps done, "
             f"GPU time {duration(status.get('gpuSeconds'))}, {end}"]  # fmt: skip
    if status.get("message"):
        lines.append(f"{status['message']}.")
    ordered = sorted(steps, key=lambda j: parse_time(j["metadata"].get("creationTimestamp")) or 0)
    for step in ordered[-4:-1]:  # the latest ended steps: how much went ahead of each
        story = (step.get("status") or {}).get("story") or {}
        ahead = story.get("ranAheadTotal", 0)
        lines.append(f"  {step['metadata']['name']}: {(step.get('status') or {}).get('phase') or 'Pending'}, "
                     f"{ahead} job(s) dispatched ahead of it.")  # fmt: skip
    if ordered:
        lines += ["The latest step:", *(f"  {line}" for line in why(ordered[-1], lane_objs, policy, now))]
    return lines
