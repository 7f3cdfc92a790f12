"""Explaining the queue: which term put a job ahead of another, and the sentences of ``gpulane why``."""

from __future__ import annotations

import pytest

from gpulane.api.times import format_time
from gpulane.core.explain import deciding_term
from gpulane.core.policy import Policy
from gpulane.core.score import ScoreBreakdown
from gpulane.explain.report import duration, lanes, queue, render_lanes, render_queue, table, why

T0 = 1_800_000_000.0


@pytest.mark.parametrize(
    ("winner", "loser", "term"),
    [
        (ScoreBreakdown(100, 0, 0, 0.0), ScoreBreakdown(0, 2, 10, 50.0), "band"),
        (ScoreBreakdown(5, 0, 0, 0.1), ScoreBreakdown(0, 0, 0, 0.2), "priority"),
        (ScoreBreakdown(0, 2, 0, 0.1), ScoreBreakdown(0, 0, 0, 0.5), "tier"),
        (ScoreBreakdown(0, 0, 10, 0.1), ScoreBreakdown(0, 2, 0, 3.0), "affinity"),
        (ScoreBreakdown(-100, 0, 0, 210.0), ScoreBreakdown(-100, 2, 10, 5.0), "aging"),
        (ScoreBreakdown(-100, 2, 0, 200.0), ScoreBreakdown(100, 0, 0, 1.0), "aging"),  # across bands
        # By its own terms the waiting job scored higher: only its member's fair-share clock explains it.
        (ScoreBreakdown(0, 0, 0, 1.0), ScoreBreakdown(0, 0, 0, 4.0), "fairShare"),
        (ScoreBreakdown(0, 1, 0, 0.0), ScoreBreakdown(0, 1, 0, 0.0), "arrival"),
    ],
)
def test_the_deciding_term(winner, loser, term):
    assert deciding_term(winner, loser, 100) == term


def test_the_term_without_which_the_winner_would_not_have_won_is_named():
    # Affinity (10) alone covers the margin (10.5 - 0.5 = ... ); tier alone (2) does not.
    winner, loser = ScoreBreakdown(0, 2, 10, 0.0), ScoreBreakdown(0, 0, 0, 1.5)
    assert deciding_term(winner, loser, 100) == "affinity"


def record(job, at, *, priority=0, tier=0, affinity=0, aging=0.0, model="m", load=False, lane="gpu-0"):
    total = priority + tier + affinity + aging
    score = {"priority": priority, "tier": tier, "affinity": affinity, "aging": aging, "total": total}
    return {"job": job, "at": format_time(at), "lane": lane, "model": model, "load": load, "member": job,
            "priority": priority, "tier": "free", "score": score}  # fmt: skip


def gpujob(name, model="m", created=T0, **status):
    return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": format_time(created)},
            "spec": {"model": model, "priority": 0, "member": "me"}, "status": status}  # fmt: skip


def test_why_tells_a_waiting_jobs_story_from_the_lanes_history():
    lane = {"metadata": {"name": "gpu-0"}, "status": {"history": [
        record("ns/film-1", T0 - 30, priority=-100),
        record("ns/image", T0 + 60, priority=100, model="other", load=True),
        record("ns/film-2", T0 + 120, priority=-100, aging=400.0),
    ]}}  # fmt: skip
    job = gpujob("waiting", position=1, estimatedStart=format_time(T0 + 400),
                 score={"priority": 0, "tier": 0, "affinity": 0, "aging": 5.0, "total": 5.0})  # fmt: skip
    lines = why(job, [lane], Policy(), T0 + 300)
    text = "\n".join(lines)
    assert lines[0].startswith("ns/waiting (m, priority 0, tier free, member me) was queued at")
    assert "Running then: ns/film-1 on gpu-0." in text
    assert "2 job(s) were dispatched ahead of it" in text
    assert "ns/image on gpu-0" in text and "a higher priority band" in text
    assert "ns/film-2" in text and "aging (it had waited longer)" in text
    assert "It is at position 1 after 5m00s" in text


def test_why_uses_the_story_stored_on_a_job_that_ran():
    story = {"queuedAt": format_time(T0), "ranAheadTotal": 3, "load": True,
             "ranAhead": [record("ns/vip", T0 + 5, tier=2, affinity=10)]}  # fmt: skip
    job = gpujob("done", phase="Succeeded", lane="gpu-0", dispatchedAt=format_time(T0 + 10),
                 startedAt=format_time(T0 + 40), finishedAt=format_time(T0 + 100), story=story)  # fmt: skip
    text = "\n".join(why(job, [], Policy(), T0 + 200))
    assert "3 job(s) were dispatched ahead of it (the latest 1 shown)" in text
    assert "a better tier" in text
    assert "had to load first: 30s until it started" in text
    assert "It ended Succeeded" in text


def test_why_leaves_out_a_story_record_not_in_the_operators_shape_and_says_so():
    """The CRD stores a story's records unchecked (docs/benchmarks.md: checking them made each write of the job
    cost twice as much), so an executor writing status while the admission policies are away could leave one
    without a score, or no record at all: the rest of the story is still told."""
    forged = [{"job": "ns/ghost", "at": format_time(T0 + 3)}, "not a record", record("ns/vip", T0 + 5, tier=2)]
    story = {"queuedAt": format_time(T0), "ranAheadTotal": 3, "load": False, "ranAhead": forged}
    job = gpujob("done", phase="Succeeded", lane="gpu-0", dispatchedAt=format_time(T0 + 10),
                 startedAt=format_time(T0 + 10), finishedAt=format_time(T0 + 100), story=story)  # fmt: skip
    lane = {"metadata": {"name": "gpu-0"}, "status": {"history": [{"job": "ns/half"}, record("ns/old", T0 - 30)]}}
    text = "\n".join(why(job, [lane], Policy(), T0 + 200))
    assert "ns/vip on gpu-0" in text and "ghost" not in text
    assert "2 record(s) of its story are not in the shape the operator writes: left out." in text
    assert "Running then: ns/old on gpu-0." in text and "half" not in text


def test_queue_puts_running_jobs_first_then_positions():
    jobs = [
        gpujob("b", position=2, positionExact=True, score={"priority": 0, "tier": 0, "affinity": 0, "aging": 1.0,
                                                           "total": 1.0}),
        gpujob("a", position=1, positionExact=True, score={"priority": 0, "tier": 0, "affinity": 10, "aging": 1.0,
                                                           "total": 11.0}),
        gpujob("far", position=100, positionExact=False),
        gpujob("r", phase="Running", lane="gpu-0", startedAt=format_time(T0 + 10)),
    ]  # fmt: skip
    rows = queue(jobs, {"m": {"runSeconds": 60.0}}, T0 + 70)
    assert [r["job"] for r in rows["running"]] == ["ns/r"] and rows["running"][0]["expected"] == 60.0
    assert [r["job"] for r in rows["waiting"]] == ["ns/a", "ns/b", "ns/far"]
    text = render_queue(rows)
    assert text.splitlines()[0].split() == ["RUNNING", "LANE", "MODEL", "MEMBER", "ELAPSED", "EXPECTED"]
    assert "~100" in text and "11.0" in text and "1m00s" in text


def test_lanes_count_swaps_dispatches_and_use_over_the_hour():
    lane = {"metadata": {"name": "gpu-0"}, "status": {"residentModel": "m", "ready": True, "running": ["ns/r"],
            "queueDepth": {"100": 1, "-100": 4},
            "history": [record("ns/x", T0 - 7200, load=True), record("ns/y", T0 - 60, load=True),
                        record("ns/r", T0 - 30)]}}  # fmt: skip
    jobs = [gpujob("r", phase="Running", lane="gpu-0", startedAt=format_time(T0 - 1800))]
    [row] = lanes([lane], jobs, T0)
    assert (row["swaps"], row["dispatches"], row["utilisation"]) == (1, 2, 0.5)
    assert "interactive: 1, batch: 4" in render_lanes([row])


def test_helpers_format_like_kubectl():
    assert [duration(s) for s in (0, 59, 61, 3700, None)] == ["0s", "59s", "1m01s", "1h01m", "-"]
    assert table(["A", "LONG"], [["xx", "y"]]) == "A    LONG\nxx   y"


def test_why_names_a_lane_reserved_for_the_jobs_team_and_lent_to_another():
    """A lane reserved for team ``lab``, which fairShareTeams gives namespace ns: a job of ns waits while another
    namespace's job borrows it; a job of lab's own namespace does not count as a borrower."""
    lane = {"metadata": {"name": "gpu-0"}, "spec": {"reservedFor": {"namespaces": ["lab"]}},
            "status": {"running": ["apps/borrower"]}}  # fmt: skip
    policy = Policy(fairShareTeams={"lab": ["ns"]})
    text = "\n".join(why(gpujob("waiting", position=1), [lane], policy, T0 + 60))
    assert "Lane gpu-0 is reserved for team lab, and lent while it had nothing waiting: apps/borrower" in text
    assert "its team's jobs go first" in text
    lane["status"]["running"] = ["lab/teammate"]  # type: ignore[index]
    assert "reserved for" not in "\n".join(why(gpujob("waiting", position=1), [lane], policy, T0 + 60))
    assert "reserved for" not in "\n".join(why(gpujob("waiting", position=1), [lane], Policy(), T0 + 60))


def test_lanes_show_the_models_a_server_holds_beside_the_serving_one():
    lane = {"metadata": {"name": "gpu-0"}, "status": {"residentModel": "qwen", "loaded": ["embed", "llama-8b"]}}
    [row] = lanes([lane], [], T0)
    text = render_lanes([row])
    assert "ALSO LOADED" in text.splitlines()[0] and "embed, llama-8b" in text.splitlines()[1]


def test_why_says_a_lanes_server_holds_the_waiting_jobs_model():
    lane = {"metadata": {"name": "gpu-0"}, "status": {"residentModel": "qwen", "loaded": ["m"]}}
    text = "\n".join(why(gpujob("waiting", position=1), [lane], Policy(), T0 + 60))
    assert "Lane gpu-0's server holds its model beside qwen: it starts there with no load." in text


def test_lanes_and_why_say_what_a_load_cost_and_whether_the_server_switched():
    switched = {**record("ns/done", T0 + 10, load=True), "loadSeconds": 0.14, "switch": True}
    lane = {"metadata": {"name": "gpu-0"}, "status": {"residentModel": "m", "history": [
        {**record("ns/old", T0 - 60, load=True), "loadSeconds": 4.0, "switch": False}, switched]}}  # fmt: skip
    [row] = lanes([lane], [], T0 + 20)
    assert row["lastLoad"] == {"model": "m", "loadSeconds": 0.14, "switch": True}
    assert "m 0.14s (switch)" in render_lanes([row]) and "LAST LOAD" in render_lanes([row]).splitlines()[0]
    job = gpujob("done", phase="Succeeded", lane="gpu-0", dispatchedAt=format_time(T0 + 10),
                 startedAt=format_time(T0 + 11), finishedAt=format_time(T0 + 100),
                 story={"queuedAt": format_time(T0), "ranAheadTotal": 0, "load": True, "ranAhead": []})  # fmt: skip
    text = "\n".join(why(job, [lane], Policy(), T0 + 200))
    assert "The load took 0.14s, its lane's server switched to it, with no new pod." in text
    lane["status"]["history"][1]["switch"] = False  # type: ignore[index]
    assert "The load took 0.14s, in a new pod." in "\n".join(why(job, [lane], Policy(), T0 + 200))
