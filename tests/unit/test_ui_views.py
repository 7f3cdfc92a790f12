"""The web page's views as data: what a viewer may see, the queue's order and filters, what comes next on a lane,
the lane's timeline, chains' progress and a job's story."""

from __future__ import annotations

import json

import pytest

from gpulane.ui import views
from gpulane.ui.scope import Viewer
from gpulane.ui.server import NotVisible, Views

from .ui_world import NOW, T0, filled, world

ALICE = Viewer("user alice", frozenset({"team-a"}))
EVERYONE = Viewer("user admin", None)


def compute(view: str, viewer: Viewer, **query: str) -> dict:
    return Views(filled(), clock=lambda: NOW).compute(view, viewer, query)


@pytest.mark.parametrize("view", ["lanes", "queue", "chains", "usage"])
def test_another_namespaces_jobs_are_load_without_a_name(view: str) -> None:
    text = json.dumps(compute(view, ALICE))
    for secret in ("team-b", "secret-plan", "old-secret", "secret-chain", "bob"):
        assert secret not in text, f"{secret!r} shows in the {view} view"
    # ...and a reader of every namespace sees them (the test can fail).
    assert "team-b" in json.dumps(compute(view, EVERYONE)) or (
        view == "chains" and "secret-chain" in json.dumps(compute(view, EVERYONE))
    )


def test_the_queue_is_in_order_with_hidden_load_in_its_place() -> None:
    queue = compute("queue", ALICE)["data"]
    assert [(r["position"], r["job"], r["band"]) for r in queue["waiting"]] == [
        (1, None, "interactive"),  # team-b's job: where it is and its band, not who
        (2, "team-a/chat", "normal"),
    ]
    assert queue["total"] == 2
    assert [r["job"] for r in queue["running"]] == ["team-a/film-3"]
    assert queue["waiting"][1]["score"]["total"] == 2.0 and queue["waiting"][1]["member"] == "alice"


def test_the_queue_filters_by_namespace_model_and_member() -> None:
    assert [r["job"] for r in compute("queue", EVERYONE, namespace="team-b")["data"]["waiting"]] == [
        "team-b/secret-plan"
    ]
    assert compute("queue", EVERYONE, model="flux")["data"]["waiting"] == []
    by_member = compute("queue", EVERYONE, member="alice")["data"]
    assert [r["job"] for r in by_member["waiting"]] == ["team-a/chat"] and by_member["total"] == 1
    # A hidden job has no namespace: a filter on one leaves it out rather than guessing.
    assert [r["job"] for r in compute("queue", ALICE, namespace="team-b")["data"]["waiting"]] == []


def test_the_queue_shows_its_first_rows_and_counts_the_rest() -> None:
    s = filled()
    jobs = s.items("gpujobs")
    queue = views.queue(jobs, {}, NOW, views.QueueFilter(), limit=1)
    assert len(queue["waiting"]) == 1 and queue["total"] == 2


def test_a_lane_shows_its_node_running_job_next_and_timeline() -> None:
    (lane,) = compute("lanes", ALICE)["data"]
    assert (lane["lane"], lane["node"], lane["resident"], lane["ready"]) == ("gpu-0", "node-a", "flux", True)
    (running,) = lane["running"]
    assert (running["job"], running["elapsed"], running["expected"]) == ("team-a/film-3", NOW - (T0 + 400), 120.0)
    assert [(r["position"], r["job"], r["estimatedStart"] - T0) for r in lane["next"]] == [
        (1, None, 700),  # team-b's job: when it starts, not what it is
        (2, "team-a/chat", 760),
    ]
    # film-1 loaded its model for a minute, then ran; film-2 started warm; film-3 runs until now. The gap from
    # T0+200 to T0+300 is idle time: no segment covers it.
    assert [(s["kind"], s["job"], s["start"] - T0, s["end"] - T0) for s in lane["timeline"]] == [
        ("load", "team-a/film-1", 10, 70),
        ("run", "team-a/film-1", 70, 200),
        ("run", "team-a/film-2", 300, 400),
        ("run", "team-a/film-3", 400, 600),
    ]


def test_a_timeline_keeps_only_its_window() -> None:
    jobs = filled().items("gpujobs")
    assert [s["job"] for s in views.timeline(jobs, "gpu-0", NOW, window=250)] == ["team-a/film-2", "team-a/film-3"]


def test_chains_show_progress_and_only_ones_own() -> None:
    (chain,) = compute("chains", ALICE)["data"]
    shown = (chain["chain"], chain["completed"], chain["total"], chain["current"], chain["etaIn"])
    assert shown == ("team-a/film", 2, 5, "team-a/film-3", 900)


def test_a_jobs_story_and_score() -> None:
    job = compute("job", ALICE, job="team-a/chat")["data"]
    assert job["position"] == 2 and job["score"]["total"] == 2.0
    assert job["story"][0].startswith("team-a/chat (llama, priority 0")
    assert "old-secret" not in json.dumps(job)  # the lane's history named it; the story reads the hidden lane


def test_a_chains_story() -> None:
    chain = compute("job", ALICE, job="team-a/film")["data"]
    assert chain["chain"] is True and "2/5 steps done" in chain["story"][0]


@pytest.mark.parametrize("key", ["team-b/secret-plan", "team-a/nothing", "team-b/secret-chain", "garbage"])
def test_a_hidden_job_is_the_same_as_a_missing_one(key: str) -> None:
    with pytest.raises(NotVisible, match="that you may see"):
        compute("job", ALICE, job=key)


def test_a_key_sees_its_own_member_and_its_users() -> None:
    key = Viewer("key app", frozenset({"team-a"}), frozenset({"app"}))
    s = filled()
    s.deliver("gpujobs", "ADDED", {**world()["gpujobs"][4], "metadata": {"namespace": "team-a", "name": "mine"},
                                   "spec": {"model": "llama", "member": "app/ann"}})  # fmt: skip
    queue = Views(s, clock=lambda: NOW).compute("queue", key, {})["data"]
    assert sorted(r["job"] or "-" for r in queue["waiting"]) == ["-", "-", "team-a/mine"]  # alice's chat is hidden


def test_usage_counts_hidden_jobs_as_one_nameless_team() -> None:
    usage = compute("usage", ALICE, window="1h")["data"]
    assert usage["window"] == 3600
    team_a, others = usage["teams"]
    assert (team_a["team"], [m["member"] for m in team_a["members"]]) == ("team-a", ["team-a", "alice"])
    assert team_a["gpuSeconds"] == 190 + 100 + 200  # each film step from its dispatch (its load included)
    assert (others["team"], others["members"]) == (None, [])  # team-b, unnamed


def test_a_hidden_jobs_change_shows_though_its_anonymous_copy_is_kept() -> None:
    s = filled()
    views_ = Views(s, clock=lambda: NOW)
    first = views_.compute("queue", ALICE, {})["data"]["waiting"]
    assert [(r["position"], r["job"]) for r in first] == [(1, None), (2, "team-a/chat")]
    secret = s.get("gpujobs", "team-b", "secret-plan")
    assert secret is not None
    s.deliver("gpujobs", "MODIFIED", {**secret, "status": {**secret["status"], "position": 3}})
    again = views_.compute("queue", ALICE, {})["data"]["waiting"]
    assert [(r["position"], r["job"]) for r in again] == [(2, "team-a/chat"), (3, None)]
