"""Queue deadlines (a job waiting past its deadline is never dispatched) and loads that yield."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpulane.core.dispatcher import DispatchError
from gpulane.core.events import (
    Dispatch,
    Expired,
    JobCancelled,
    JobFinished,
    JobSubmitted,
    LoadLost,
    ModelLoaded,
    Requeued,
)
from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.policy import Policy

from .helpers import dispatcher, names, submit

MODELS = [ModelSpec("film", load_seconds=90, run_seconds=960), ModelSpec("sdxl", load_seconds=30, run_seconds=40)]
YIELD = Policy(loadYield=True)


def busy(d, clock, model="film"):
    """The lane runs a long job (started), so the next ones queue."""
    submit(d, clock, "blocker", model=model, member="blocker")
    d.handle(ModelLoaded("gpu-0", model))


# -- deadlines ----------------------------------------------------------------------------------


def test_a_job_waiting_past_its_deadline_expires_and_never_runs():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    busy(d, clock)
    submit(d, clock, "image", model="sdxl", priority=100, member="bob", queue_timeout_seconds=600)
    submit(d, clock, "shot", priority=-100, member="alice")
    assert d.next_deadline() == 600
    clock.now = 600
    [notice] = d.decide()  # the deadline passes while the film still runs: no dispatch, one expiry
    assert notice == Expired(notice.job, 600, 600, None) and notice.job.id == "image"
    assert d.decide() == [] and d.next_deadline() is None
    clock.now = 960
    assert names(d.handle(JobFinished("blocker"))) == ["shot"]


def test_the_smallest_timeout_applies():
    policy = Policy(queueTimeoutSeconds={100: 300, -100: 3600})
    d, clock = dispatcher(models=MODELS, policy=policy)
    busy(d, clock)
    submit(d, clock, "patient", model="sdxl", priority=100, member="a", queue_timeout_seconds=900)  # 300 applies
    submit(d, clock, "hasty", model="sdxl", priority=100, member="b", queue_timeout_seconds=60)  # 60 applies
    submit(d, clock, "batch", priority=-100, member="c")  # the band's 3600
    submit(d, clock, "normal", priority=0, member="e")  # no default for band 0: waits forever
    deadlines = []
    while (deadline := d.next_deadline()) is not None:
        clock.now = deadline
        deadlines += [(n.job.id, n.deadline) for n in d.decide() if isinstance(n, Expired)]
    assert deadlines == [("hasty", 60), ("patient", 300), ("batch", 3600)]
    assert [j.id for j in d.ranking.pending()] == ["normal"]


def test_a_job_assigned_to_a_lane_still_loading_expires_and_frees_the_lane():
    d, clock = dispatcher(lanes={"gpu-0": "film"}, models=MODELS, policy=Policy(loadYield=False))
    [decision] = submit(d, clock, "image", model="sdxl", member="bob", queue_timeout_seconds=20)
    assert decision.load  # sdxl takes 30 s to load: the caller gives up at 20
    submit(d, clock, "next", model="sdxl", member="carol")
    clock.now = 20
    notice, decision = d.decide()  # the expiry first: the lane (still loading sdxl) is free again
    assert isinstance(notice, Expired) and (notice.job.id, notice.lane) == ("image", "gpu-0")
    assert names([decision]) == ["next"] and decision.lane == "gpu-0"
    clock.now = 30
    d.handle(ModelLoaded("gpu-0", "sdxl"))
    assert d.running["next"].started_at == 30 and "image" not in d.running


def test_a_load_that_ends_at_the_deadline_does_not_start_the_job():
    d, clock = dispatcher(lanes={"gpu-0": "film"}, models=MODELS, policy=Policy(loadYield=False))
    submit(d, clock, "image", model="sdxl", member="bob", queue_timeout_seconds=30)
    clock.now = 30
    [notice] = d.handle(ModelLoaded("gpu-0", "sdxl"))
    assert not d.running
    assert isinstance(notice, Expired) and notice.job.id == "image"


def test_started_cancelled_and_finished_jobs_have_no_deadline():
    d, clock = dispatcher(models=MODELS)
    submit(d, clock, "runs", model="sdxl", member="a", queue_timeout_seconds=100)
    submit(d, clock, "cancelled", model="sdxl", member="b", queue_timeout_seconds=100)
    d.handle(ModelLoaded("gpu-0", "sdxl"))
    d.handle(JobCancelled("cancelled"))
    clock.now = 500
    assert d.decide() == [] and "runs" in d.running


def test_a_fork_and_its_original_expire_jobs_each_on_its_own():
    """The fork lends its deadlines and their heap (issue 35: at 100,000 waiting they held the forecast's first
    step); an expiry or a cancel on one side must not reach the other."""
    d, clock = dispatcher(models=MODELS, policy=Policy(queueTimeoutSeconds={0: 100}))
    busy(d, clock)
    for i, name in enumerate(["a", "b", "c"]):
        clock.now = 10.0 * i
        submit(d, clock, name, model="sdxl", member=name)
    virtual = [clock.now]
    fork = d.fork(lambda: virtual[0])
    virtual[0] = 105
    assert [(e.job.id, e.deadline) for e in fork.decide()] == [("a", 100)]  # pops a's entry on the fork's side
    assert fork.next_deadline() == 110
    d.handle(JobCancelled("b"))
    clock.now = 30
    submit(d, clock, "new", model="sdxl", member="new")
    assert d.next_deadline() == 100  # a's entry is still in the original's heap
    assert fork.next_deadline() == 110  # b's deadline stands in the fork, and "new" is not there
    virtual[0] = 200
    assert [e.job.id for e in fork.decide()] == ["b", "c"]
    clock.now = 200
    assert [e.job.id for e in d.decide()] == ["a", "c", "new"]


@pytest.mark.parametrize("timeout", [0, -5, float("inf"), float("nan")])
def test_bad_job_timeouts_are_refused(timeout):
    d, clock = dispatcher()
    with pytest.raises(DispatchError, match="queue timeout"):
        submit(d, clock, "x", queue_timeout_seconds=timeout)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"queueTimeoutSeconds": {150: 60}}, "queueTimeoutSeconds key 150 is not a band"),
        ({"queueTimeoutSeconds": {100: 0}}, "for band 100 must be more than 0 seconds"),
        ({"queueTimeoutSeconds": {100: float("inf")}}, "for band 100 must be more than 0 seconds"),
    ],
)
def test_bad_band_timeouts_are_refused(raw, message):
    with pytest.raises(ValidationError, match=message):
        Policy.model_validate(raw)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**9))
def test_no_job_is_dispatched_or_started_after_its_deadline(seed):
    rng = random.Random(seed)
    policy = Policy(queueTimeoutSeconds={100: 120}, loadYield=True)
    d, clock = dispatcher(lanes={"gpu-0": None, "gpu-1": "a"}, models=[ModelSpec(m, load_seconds=25) for m in "ab"])
    d.replace_policy(policy)
    deadlines: dict[str, float] = {}
    gone: set[str] = set()
    for n in range(80):
        clock.now += rng.choice([0, 5, 20, 60, 200])
        events = []
        roll = rng.random()
        if roll < 0.5:
            timeout = rng.choice([None, 30, 90, 400])
            job = Job(f"j{n}", rng.choice("ab"), rng.choice([-100, 0, 100]), "free", rng.choice("xyz"), clock.now)
            job = replace(job, queue_timeout_seconds=timeout)
            own = policy.queue_timeout(job.priority, timeout)
            if own is not None:
                deadlines[job.id] = clock.now + own
            events.append(JobSubmitted(job))
        elif roll < 0.8 and d.running:
            events.append(JobFinished(rng.choice(sorted(d.running))))
        else:
            lane = rng.choice(["gpu-0", "gpu-1"])
            if d.lanes[lane].resident:
                events.append(ModelLoaded(lane, d.lanes[lane].resident))
        for effect in d.handle_all(events):
            if isinstance(effect, Dispatch):
                assert clock.now < deadlines.get(effect.job.id, float("inf")), f"{effect.job.id} dispatched late"
            elif isinstance(effect, Expired):
                assert effect.at >= effect.deadline == deadlines[effect.job.id]
                gone.add(effect.job.id)
        for run in d.running.values():
            if run.started_at is not None and run.job.id in deadlines:
                assert run.started_at < deadlines[run.job.id], f"{run.job.id} started late"
        assert not gone & set(d.running) and not any(j.id in gone for j in d.ranking.pending())


# -- loads that yield ---------------------------------------------------------------------------


def test_a_load_nobody_started_yields_to_a_higher_band_then_the_job_runs_next():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl"}, models=MODELS, policy=YIELD)
    [load] = submit(d, clock, "shot", model="film", priority=-100, member="alice")
    assert load.load
    clock.now = 45  # half way through the film model's 90 s load
    requeued, image = submit(d, clock, "image", model="sdxl", priority=100, member="bob")
    assert requeued == Requeued(load.job, "gpu-0", 45, "image")  # first off the lane, then the lane loads anew
    assert (image.job.id, image.load, image.replaces) == ("image", True, "film")
    assert [j.id for j in d.ranking.pending()] == ["shot"]  # no work lost: it waits again
    clock.now = 45 + 30 + 40
    d.handle(ModelLoaded("gpu-0", "sdxl"))
    assert names(d.handle(JobFinished("image"))) == ["shot"]


def test_a_job_yields_once_then_its_load_sticks():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl"}, models=MODELS, policy=YIELD)
    submit(d, clock, "shot", model="film", priority=-100, member="alice")
    clock.now = 10
    requeued, _ = submit(d, clock, "image-1", model="sdxl", priority=100, member="bob")
    assert requeued == Requeued(d.history[0].job, "gpu-0", 10, "image-1")
    d.handle(ModelLoaded("gpu-0", "sdxl"))
    clock.now = 60
    assert names(d.handle(JobFinished("image-1"))) == ["shot"]  # loading the film model again
    clock.now = 70
    assert submit(d, clock, "image-2", model="sdxl", priority=100, member="bob") == []  # no second yield


def test_a_newcomer_for_the_model_being_loaded_takes_the_slot_and_the_load_goes_on():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS, policy=YIELD)
    [shot] = submit(d, clock, "shot", model="film", priority=-100, member="alice")
    clock.now = 30
    requeued, decision = submit(d, clock, "preview", model="film", priority=100, member="bob")
    assert requeued == Requeued(shot.job, "gpu-0", 30, "preview")  # the shot waits again, in its place
    assert not decision.load and d.lanes["gpu-0"].loading_since == 0  # the film model keeps loading
    clock.now = 90
    d.handle(ModelLoaded("gpu-0", "film"))
    assert d.running["preview"].started_at == 90


@pytest.mark.parametrize(
    ("priority", "started", "enabled"),
    [
        (-90, False, True),  # max tier: 12 - 0.75 points of aging ahead, within tier + affinity
        (100, True, True),  # the job has started: never interrupted
        (100, False, False),  # loadYield off
    ],
)
def test_no_yield_within_the_offsets_once_started_or_when_off(priority, started, enabled):
    d, clock = dispatcher(lanes={"gpu-0": "sdxl"}, models=MODELS, policy=Policy(loadYield=enabled))
    submit(d, clock, "shot", model="film", priority=-100, member="alice")
    if started:
        d.handle(ModelLoaded("gpu-0", "film"))
    clock.now = 45
    assert submit(d, clock, "other", model="sdxl", priority=priority, tier="max", member="bob") == []
    assert "shot" in d.running


def test_a_yielded_job_keeps_its_place_and_its_member_is_not_charged():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl"}, models=MODELS, policy=Policy(fairShare="turns", loadYield=True))
    submit(d, clock, "shot-1", model="film", priority=-100, member="alice")
    submit(d, clock, "shot-2", model="film", priority=-100, member="alice")
    clock.now = 20
    submit(d, clock, "dave-1", model="film", priority=-100, member="dave")
    clock.now = 45
    submit(d, clock, "image", model="sdxl", priority=100, member="bob")
    assert d.ranking.usage(45) == {("bob", 1): pytest.approx(30 + 40, rel=0.01)}  # alice's charge refunded
    assert ("alice", -1) not in d.ranking.served()  # as if alice's queue had never been served
    d.handle(ModelLoaded("gpu-0", "sdxl"))
    clock.now = 200
    assert names(d.handle(JobFinished("image"))) == ["shot-1"]  # alice's queue is older than dave's


# -- loads that are lost ------------------------------------------------------------------------


def test_a_lost_load_puts_its_jobs_back_in_their_places_once_then_they_stay_to_fail():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS, policy=Policy(fairShare="turns"))
    [shot] = submit(d, clock, "shot", model="film", priority=-100, member="alice")
    submit(d, clock, "later", model="film", priority=-100, member="dave")
    charged = d.ranking.usage(0)
    clock.now = 10
    requeued, again = d.handle(LoadLost("gpu-0"))
    assert requeued == Requeued(shot.job, "gpu-0", 10, None)
    assert (again.job.id, again.load, again.at) == ("shot", True, 10)  # first in its place, loading afresh
    assert d.ranking.usage(10) == pytest.approx(charged, rel=0.01)  # charged once: the lost load was refunded
    clock.now = 20
    assert d.handle(LoadLost("gpu-0")) == []  # lost twice: it stays on the lane, for the shell to fail
    assert "shot" in d.running and d.lanes["gpu-0"].resident is None
    assert names(d.handle(JobFinished("shot"))) == ["later"]


def test_a_lost_backend_whose_jobs_had_started_requeues_nothing():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    submit(d, clock, "shot", model="film", member="alice")
    d.handle(ModelLoaded("gpu-0", "film"))
    clock.now = 100
    assert d.handle(LoadLost("gpu-0")) == []
    assert d.running["shot"].started_at == 0 and d.lanes["gpu-0"].resident is None
    assert d.handle(LoadLost("gpu-unknown")) == []


def test_a_namespace_and_a_member_have_queue_timeouts_of_their_own_over_the_bands():
    """Issue 37: the member's timeout for the band, else its namespace's, else the band's; the job's own if
    smaller."""
    policy = Policy(
        queueTimeoutSeconds={0: 3600},
        namespaceQueueTimeoutSeconds={"interactive-team": {0: 120}},
        memberQueueTimeoutSeconds={"impatient": {0: 30}},
    )
    assert policy.queue_timeout(0, None, "interactive-team", "impatient") == 30
    assert policy.queue_timeout(0, None, "interactive-team", "ann") == 120
    assert policy.queue_timeout(0, 60, "interactive-team", "ann") == 60  # its own, smaller
    assert policy.queue_timeout(0, None, "other", "ann") == 3600
    assert policy.queue_timeout(100, None, "interactive-team", "impatient") is None  # no timeout for that band
    d, clock = dispatcher(models=MODELS, policy=policy)
    busy(d, clock)
    d.handle(JobSubmitted(Job("team-job", "sdxl", 0, "free", "ann", 0.0, team="interactive-team")))
    d.handle(JobSubmitted(Job("other-job", "sdxl", 0, "free", "bob", 0.0, team="other")))
    assert d.next_deadline() == 120
    clock.now = 120
    [expired] = d.decide()
    assert isinstance(expired, Expired) and expired.job.id == "team-job"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"namespaceQueueTimeoutSeconds": {"a": {50: 10}}}, r"namespaceQueueTimeoutSeconds\['a'\] key 50 is not"),
        ({"memberQueueTimeoutSeconds": {"b": {0: 0}}}, r"memberQueueTimeoutSeconds\['b'\] for band 0 must be more"),
    ],
)
def test_bad_namespace_and_member_timeouts_are_refused(raw, message):
    with pytest.raises(ValidationError, match=message):
        Policy.model_validate(raw)
