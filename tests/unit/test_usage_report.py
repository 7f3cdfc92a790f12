"""``gpulane usage`` (issue 37): each namespace's and member's GPU time over a window, with weight and the
decayed usage fair share ranks by, from the objects as the command line reads them."""

from __future__ import annotations

import pytest

from gpulane.core.policy import Policy
from gpulane.explain.usage import held, render_usage, usage

NOW = 1_800_000_000.0
HOUR = 3600.0


def stamp(seconds_ago: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(NOW - seconds_ago, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def job(ns: str, member: str | None, phase: str, dispatched_ago: float, finished_ago: float | None) -> dict:
    status = {"phase": phase, "dispatchedAt": stamp(dispatched_ago)}
    if finished_ago is not None:
        status["finishedAt"] = stamp(finished_ago)
    spec = {"model": "m", **({"member": member} if member else {})}
    return {"metadata": {"namespace": ns, "name": f"j-{dispatched_ago}"}, "spec": spec, "status": status}


def test_a_job_counts_the_part_of_its_lane_time_inside_the_window():
    assert held(job("a", None, "Succeeded", 600, 300), NOW, HOUR) == pytest.approx(300)
    assert held(job("a", None, "Succeeded", 2 * HOUR, HOUR - 60), NOW, HOUR) == pytest.approx(60)  # began before
    assert held(job("a", None, "Running", 120, None), NOW, HOUR) == pytest.approx(120)  # still holding it
    assert held(job("a", None, "Failed", 100, None), NOW, HOUR) == 0.0  # ended with no finishedAt: not counted
    assert held({"metadata": {"namespace": "a"}, "status": {"phase": "Pending"}}, NOW, HOUR) == 0.0


def test_teams_then_members_with_weights_shares_and_decayed_usage():
    jobs = [
        job("studio", "ann", "Succeeded", 3000, 2400),  # 600 s
        job("studio", "ben", "Succeeded", 2400, 2100),  # 300 s
        job("solo", None, "Running", 800, None),  # 800 s, member defaults to the namespace
    ]
    ann = [{"member": "studio/ann", "band": 0, "gpuSeconds": seconds, "at": stamp(ago)} for seconds, ago in
           ((500.0, 10), (400.0, 60))]  # fmt: skip
    team = {"namespace": "studio", "band": 0, "gpuSeconds": 800.0, "at": stamp(10)}
    lanes = [{"status": {"teamUsage": [team], "usage": ann}}]
    rows = usage(jobs, lanes, Policy(fairShareWeights={"namespaces": {"studio": 2}}), NOW, HOUR)
    assert [(r["team"], r["gpuSeconds"], r["weight"]) for r in rows] == [("studio", 900, 2), ("solo", 800, 1)]
    studio = rows[0]
    assert studio["share"] == pytest.approx(900 / 1700) and studio["usage"] == 800.0
    assert [(m["member"], m["gpuSeconds"], m["usage"]) for m in studio["members"]] == [
        ("ann", 600, 500.0),  # the latest entry wins
        ("ben", 300, 0.0),
    ]
    text = render_usage(rows, HOUR)
    assert text.splitlines()[0].split()[:4] == ["TEAM", "MEMBER", "WEIGHT", "GPU"]
    assert "67% of team" in text and "15m00s" in text


def test_a_fair_share_team_is_one_row_with_its_namespaces_members():
    """fairShareTeams puts key ``ui`` of the bridge's namespace in team ``lab`` with namespace lab: one row, whose
    members say their namespace where it is not the team's name."""
    jobs = [job("lab", "rae", "Succeeded", 3000, 2400), job("gpulane-system", "ui/ann", "Succeeded", 2400, 2100),
            job("gpulane-system", "bob", "Succeeded", 2000, 1900)]  # fmt: skip
    policy = Policy(fairShareTeams={"lab": ["gpulane-system/ui"]}, fairShareWeights={"namespaces": {"lab": 3}})
    rows = usage(jobs, [], policy, NOW, HOUR)
    assert [(r["team"], r["gpuSeconds"], r["weight"]) for r in rows] == [("lab", 900, 3), ("gpulane-system", 100, 1)]
    assert [m["member"] for m in rows[0]["members"]] == ["rae", "gpulane-system/ui/ann"]
