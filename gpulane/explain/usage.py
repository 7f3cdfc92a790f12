"""What ``gpulane usage`` prints: each team's (a namespace, or a GpuPolicy's ``fairShareTeams`` team) and member's
GPU time over a window, beside the weight and the decayed usage that fair share ranks them by. Pure, as
``report``: objects in, rows out."""

from __future__ import annotations

from collections import defaultdict

from gpulane.api.contract import Body
from gpulane.api.times import parse_time
from gpulane.core.policy import Policy
from gpulane.explain.report import duration, table

ACTIVE = ("Dispatching", "Running")


def held(job: Body, now: float, window: float) -> float:
    """The seconds a job held its lane within the last ``window`` (from its dispatch, its load included)."""
    status = job.get("status") or {}
    start = parse_time(status.get("dispatchedAt"))
    end = now if status.get("phase") in ACTIVE else parse_time(status.get("finishedAt"))
    if start is None or end is None:
        return 0.0
    return max(0.0, min(end, now) - max(start, now - window))


def _latest(lanes: list[Body], field: str, who: str) -> dict[str, float]:
    """Each name's decayed usage summed over its bands, from the latest entry of each (name, band) on the lanes."""
    latest: dict[tuple[str, int], tuple[float, float]] = {}
    for lane in lanes:
        for entry in (lane.get("status") or {}).get(field) or []:
            at, seconds = parse_time(entry.get("at")), entry.get("gpuSeconds")
            key = (str(entry.get(who)), int(entry.get("band", 0)))
            if at is not None and isinstance(seconds, int | float) and (key not in latest or at > latest[key][1]):
                latest[key] = (float(seconds), at)
    out: dict[str, float] = defaultdict(float)
    for (name, _band), (seconds, _at) in latest.items():
        out[name] += seconds
    return dict(out)


def usage(jobs: list[Body], lanes: list[Body], policy: Policy, now: float, window: float) -> list[Body]:
    """One row per team, each with its members' rows, by GPU time in the window, most first. A member is shown
    as ``namespace/member`` when its namespace is not the team's name."""
    seconds: dict[str, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
    for job in jobs:
        namespace = job["metadata"]["namespace"]
        member = (job.get("spec") or {}).get("member") or namespace
        team = policy.fair_share_team(namespace, member) or namespace
        seconds[team][(namespace, member)] += held(job, now, window)
    decayed_teams = _latest(lanes, "teamUsage", "namespace")
    decayed_members = _latest(lanes, "usage", "member")
    weights = policy.fair_share_weights
    total = sum(sum(m.values()) for m in seconds.values()) or 1.0
    rows = []
    for team, members in sorted(seconds.items(), key=lambda t: (-sum(t[1].values()), t[0])):
        team_seconds = sum(members.values())
        rows.append(
            {
                "team": team,
                "weight": weights.namespaces.get(team, 1.0),
                "gpuSeconds": team_seconds,
                "share": team_seconds / total,
                "usage": decayed_teams.get(team, 0.0),
                "members": [
                    {
                        "member": member if namespace == team else f"{namespace}/{member}",
                        "weight": weights.members.get(member, 1.0),
                        "gpuSeconds": used,
                        "share": used / (team_seconds or 1.0),
                        "usage": decayed_members.get(f"{namespace}/{member}", 0.0),
                    }
                    for (namespace, member), used in sorted(members.items(), key=lambda t: (-t[1], t[0]))
                ],
            }
        )
    return rows


def render_usage(rows: list[Body], window: float) -> str:
    """The teams, each followed by its members indented; shares of all GPU time, then of the team's."""
    lines = []
    for team in rows:
        lines.append([team["team"], "", f"{team['weight']:g}", duration(team["gpuSeconds"]),
                      f"{team['share']:.0%}", duration(team["usage"])])  # fmt: skip
        lines += [
            [
                "",
                m["member"],
                f"{m['weight']:g}",
                duration(m["gpuSeconds"]),
                f"{m['share']:.0%} of team",
                duration(m["usage"]),
            ]
            for m in team["members"]
        ]
    window_text = duration(window)
    headers = ["TEAM", "MEMBER", "WEIGHT", f"GPU TIME/{window_text}", "SHARE", "USAGE (DECAYED)"]
    return table(headers, lines)
