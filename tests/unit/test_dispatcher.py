import pytest

from gpulane.core.dispatcher import DispatchError
from gpulane.core.events import (
    JobAdopted,
    JobCancelled,
    JobFinished,
    JobSubmitted,
    LaneUpdated,
    ModelLoaded,
    ModelUpdated,
    QueueServed,
)
from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.policy import PolicyError

from .helpers import dispatcher, names, submit


def busy(d, clock, model="warm"):
    """Occupy the only lane with a long job, started (so that no load can yield), so that the next ones queue."""
    submit(d, clock, "blocker", model=model, member="blocker")
    d.handle(ModelLoaded(d.history[-1].lane, model))


def test_first_job_on_an_empty_gpu_loads_its_model():
    d, clock = dispatcher()
    [decision] = submit(d, clock, "a", model="sdxl")
    assert (decision.lane, decision.model, decision.load, decision.replaces) == ("gpu-0", "sdxl", True, None)


def test_resident_model_is_reused_and_a_different_one_is_swapped_in():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl"})
    [first] = submit(d, clock, "a", model="sdxl")
    assert not first.load
    submit(d, clock, "b", model="flux")
    [second] = d.handle(JobFinished("a"))
    assert (second.job.id, second.load, second.replaces) == ("b", True, "sdxl")


def test_worked_numbers_tier_breaks_ties_inside_the_batch_band():
    d, clock = dispatcher()
    busy(d, clock)
    for tier in ("free", "pro", "max"):
        submit(d, clock, f"batch-{tier}", priority=-100, tier=tier)
    submit(d, clock, "normal-free", priority=0)
    order = [names(d.handle(JobFinished(job)))[0] for job in ("blocker", "normal-free", "batch-max", "batch-pro")]
    assert order == ["normal-free", "batch-max", "batch-pro", "batch-free"]
    scores = [r.score for r in list(d.history)[2:]]
    assert [s.priority + s.tier for s in scores] == [-98, -99, -100]
    assert [s.total for s in scores] == [-88, -89, -90]  # plus affinity: "m" stayed loaded


@pytest.mark.parametrize(("wait_minutes", "winner"), [(197.9, "fresh-interactive"), (198.1, "max-batch")])
def test_max_batch_overtakes_a_fresh_free_interactive_job_after_198_minutes(wait_minutes, winner):
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "max-batch", priority=-100, tier="max", member="alice")
    clock.now = wait_minutes * 60
    submit(d, clock, "fresh-interactive", priority=100, tier="free", member="bob")
    [decision] = d.handle(JobFinished("blocker"))
    assert decision.job.id == winner


def test_affinity_breaks_near_ties_but_never_crosses_a_band():
    d, clock = dispatcher(lanes={"gpu-0": "warm"})
    busy(d, clock)
    submit(d, clock, "cold-normal", model="cold", priority=0)
    submit(d, clock, "warm-normal", model="warm", priority=-5)  # +10 affinity wins the near-tie
    submit(d, clock, "warm-batch", model="warm", priority=-100, tier="max")
    assert names(d.handle(JobFinished("blocker"))) == ["warm-normal"]
    assert d.history[-1].score.affinity == 10
    assert d.history[-1].changed_by == {"affinity": "cold-normal"}
    assert names(d.handle(JobFinished("warm-normal"))) == ["cold-normal"]


def test_aging_is_recorded_when_it_changed_the_winner():
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "old-batch", priority=-100, member="alice")
    clock.now = 250 * 60
    submit(d, clock, "new-interactive", priority=100, member="bob")
    [decision] = d.handle(JobFinished("blocker"))
    assert decision.job.id == "old-batch"
    assert decision.changed_by == {"aging": "new-interactive"}
    assert decision.score.aging == pytest.approx(250)


def test_fair_share_is_recorded_when_it_changed_the_winner():
    d, clock = dispatcher()
    busy(d, clock)
    for i in range(3):
        submit(d, clock, f"alice-{i}", priority=-100, member="alice")
    clock.now = 300
    submit(d, clock, "dave-0", priority=-100, member="dave")
    clock.now = 600
    assert names(d.handle(JobFinished("blocker"))) == ["alice-0"]
    clock.now = 1200
    [decision] = d.handle(JobFinished("alice-0"))
    # By each job's own age alice-1 (waiting since 0) beats dave-0 (since 300); but alice's
    # queue was served at 600, so by queue age dave's queue (unserved since 300) wins.
    assert decision.job.id == "dave-0"
    assert decision.changed_by == {"fairShare": "alice-1", "aging": "alice-1"}  # without aging: arrival order


def test_a_members_backlog_never_delays_the_same_members_interactive_job():
    d, clock = dispatcher()
    busy(d, clock)
    for i in range(50):
        submit(d, clock, f"film-{i}", priority=-100, tier="max", member="alice")
    clock.now = 3600
    submit(d, clock, "alice-image", priority=100, member="alice")
    assert names(d.handle(JobFinished("blocker"))) == ["alice-image"]


def test_younger_jobs_of_a_member_keep_their_order_so_affinity_cannot_starve_the_member():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl"})
    busy(d, clock, model="sdxl")
    submit(d, clock, "ann-whisper", model="whisper", member="ann")
    clock.now = 5 * 60
    submit(d, clock, "ann-sdxl-close", model="sdxl", member="ann")  # 5 min younger: affinity wins
    clock.now = 16 * 60
    submit(d, clock, "ann-sdxl-far", model="sdxl", member="ann")  # 16 min younger: loses to the older job
    assert names(d.handle(JobFinished("blocker"))) == ["ann-sdxl-close"]
    assert names(d.handle(JobFinished("ann-sdxl-close"))) == ["ann-whisper"]


def test_a_members_jobs_run_in_submission_order_whatever_order_they_were_handed_in():
    """The order the operator sees jobs in (the seq) is not their arrival: a restart or a takeover replays
    them in another. Inside a member's queue the submission time decides."""
    d, clock = dispatcher()
    busy(d, clock)
    for name, at in [("c-last", 10.3), ("a-first", 10.1), ("b-second", 10.2)]:
        d.handle(JobSubmitted(Job(name, "m", 0, "free", "ann", at)))
    clock.now = 11
    order = [names(d.handle(JobFinished(done))) for done in ("blocker", "a-first", "b-second")]
    assert order == [["a-first"], ["b-second"], ["c-last"]]


def test_concurrency_fills_slots_with_the_resident_model():
    d, clock = dispatcher(lanes={"gpu-0": "llm"}, models=[ModelSpec("llm", max_concurrency=3)])
    decisions = []
    for i in range(5):
        decisions += submit(d, clock, f"chat-{i}", model="llm")
    assert names(decisions) == ["chat-0", "chat-1", "chat-2"]
    assert names(d.handle(JobFinished("chat-1"))) == ["chat-3"]


def test_a_better_job_for_another_model_drains_the_lane_before_the_swap():
    d, clock = dispatcher(lanes={"gpu-0": "llm"}, models=[ModelSpec("llm", max_concurrency=2)])
    submit(d, clock, "chat-0", model="llm", priority=0)
    submit(d, clock, "chat-1", model="llm", priority=0)
    submit(d, clock, "image", model="sdxl", priority=100)
    submit(d, clock, "chat-2", model="llm", priority=0)  # scores below the image: must not start
    assert names(d.handle(JobFinished("chat-0"))) == []
    submit(d, clock, "chat-urgent", model="llm", priority=200)  # scores above it: may start
    assert names(d.handle(JobFinished("none"))) == []  # a spurious finish changes nothing
    assert "chat-urgent" not in d.ranking  # it started when submitted, into the free slot
    assert names(d.handle(JobFinished("chat-1"))) == []
    [swap] = d.handle(JobFinished("chat-urgent"))
    assert (swap.job.id, swap.load, swap.replaces) == ("image", True, "llm")


def test_several_lanes_prefer_the_lane_with_the_model_loaded():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl", "gpu-1": "flux"})
    [a] = submit(d, clock, "flux-job", model="flux")
    [b] = submit(d, clock, "sdxl-job", model="sdxl")
    assert (a.lane, a.load, b.lane, b.load) == ("gpu-1", False, "gpu-0", False)


def test_cancel_removes_a_pending_job():
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "a")
    submit(d, clock, "b")
    d.handle(JobCancelled("a"))
    assert names(d.handle(JobFinished("blocker"))) == ["b"]
    assert d.handle(JobCancelled("a")) == []  # cancelling twice is harmless


def test_duplicate_and_invalid_jobs_are_rejected_without_side_effects():
    d, clock = dispatcher()
    submit(d, clock, "a")
    with pytest.raises(DispatchError, match="already known"):
        submit(d, clock, "a")
    with pytest.raises(PolicyError, match="unknown tier 'gold'"):
        submit(d, clock, "b", tier="gold")
    assert d.pending_count == 0 and list(d.running) == ["a"]


def test_offline_lane_dispatches_nothing_until_it_returns():
    d, clock = dispatcher()
    d.handle(LaneUpdated("gpu-0", online=False))
    assert submit(d, clock, "a") == []
    assert names(d.handle(LaneUpdated("gpu-0", online=True))) == ["a"]


def test_adopted_running_job_holds_capacity_after_a_restart():
    d, clock = dispatcher(lanes={})
    d.handle(JobAdopted(Job("survivor", "sdxl"), "gpu-0", started_at=0))
    assert submit(d, clock, "next", model="sdxl") == []
    [decision] = d.handle(JobFinished("survivor"))
    assert (decision.job.id, decision.load) == ("next", False)


def test_model_loaded_and_finished_teach_the_catalog():
    d, clock = dispatcher(models=[ModelSpec("sdxl", load_seconds=100, run_seconds=100)])
    submit(d, clock, "a", model="sdxl")
    d.handle(ModelLoaded("gpu-0", "sdxl", load_seconds=50))
    assert d.lanes["gpu-0"].ready
    d.handle(JobFinished("a", run_seconds=200))
    spec = d.models.get("sdxl")
    assert spec.load_seconds == pytest.approx(90)
    assert spec.run_seconds == pytest.approx(120)


def test_model_update_changes_concurrency():
    d, clock = dispatcher(lanes={"gpu-0": "llm"})
    submit(d, clock, "a", model="llm")
    submit(d, clock, "b", model="llm")
    assert names(d.handle(ModelUpdated(ModelSpec("llm", max_concurrency=2)))) == ["b"]


def test_model_spec_rejects_nonsense():
    with pytest.raises(ValueError, match="maxConcurrency must be >= 1"):
        ModelSpec("x", max_concurrency=0)


def test_a_job_id_reused_after_cancel_is_a_new_job_in_its_own_queue():
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "head", priority=-100, member="alice")
    submit(d, clock, "x", priority=-100, member="alice")  # behind alice's head
    d.handle(JobCancelled("x"))
    clock.now = 100
    submit(d, clock, "x", priority=100, member="bob")  # same name, another member and band
    assert names(d.handle(JobFinished("blocker"))) == ["x"]
    assert d.history[-1].job.member == "bob"
    assert names(d.handle(JobFinished("x"))) == ["head"]
    assert names(d.handle(JobFinished("head"))) == []
    assert d.pending_count == 0


def test_cancel_churn_behind_a_waiting_job_does_not_grow_the_queues():
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "head", member="alice")
    for i in range(5000):
        submit(d, clock, f"churn-{i}", member="alice")
        d.handle(JobCancelled(f"churn-{i}"))
    queue_sizes = [len(q) for q in d.ranking._queues.values()]
    assert max(queue_sizes) < 100
    assert max(len(h) for h in d.ranking._oldest.values()) < 100
    assert names(d.handle(JobFinished("blocker"))) == ["head"]


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (Job("a", "m", priority=5000), r"priority 5000 is outside this policy's bounds \[-1000, 1000\]"),
        (Job("a", "m", priority="100"), "priority must be an integer, got str"),  # type: ignore[arg-type]
        (Job("a", "m", submitted_at=float("nan")), "submission time nan is not finite"),
        (Job("a", "m", expected_run_seconds=float("inf")), "expected run seconds inf"),
        (Job("a", "m", expected_run_seconds=-1), "expected run seconds -1"),
    ],
)
def test_invalid_jobs_are_refused_before_they_are_queued(job, message):
    d, _ = dispatcher()
    with pytest.raises(ValueError, match=message):
        d.handle(JobSubmitted(job))
    assert d.pending_count == 0 and not d.running


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_concurrency": 1.5}, "must be an integer"),
        ({"load_seconds": float("nan")}, "load seconds"),
        ({"run_seconds": float("inf")}, "run seconds"),
        ({"load_seconds": -1}, "load seconds"),
    ],
)
def test_model_spec_rejects_non_finite_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec("x", **kwargs)


def test_adopted_jobs_and_queue_served_restore_fair_share_clocks_after_a_restart():
    """Five hours into a film burst the operator restarts: the film must not count its whole age."""
    d, clock = dispatcher(lanes={})
    clock.now = 5 * 3600
    d.handle(JobSubmitted(Job("shot-50", "h3", -100, "max", "alice", submitted_at=0)))
    d.handle(JobSubmitted(Job("shot-51", "h3", -100, "max", "alice", submitted_at=0)))
    d.handle(JobAdopted(Job("shot-49", "h3", -100, "max", "alice", submitted_at=0), "gpu-0", started_at=clock.now - 60))
    submit(d, clock, "image", model="h3", priority=100, member="bob")
    clock.now += 200
    [decision] = d.handle(JobFinished("shot-49"))
    assert decision.job.id == "image"  # alice was served 260 s ago, not 5 hours ago


def test_queue_served_restores_a_clock_for_a_member_with_nothing_running():
    d, clock = dispatcher()
    busy(d, clock)
    clock.now = 5 * 3600
    d.handle(JobSubmitted(Job("shot", "m", -100, "max", "alice", submitted_at=0)))
    d.handle(QueueServed("alice", -100, at=clock.now - 120))
    submit(d, clock, "image", priority=100, member="bob")
    assert names(d.handle(JobFinished("blocker"))) == ["image"]


def test_model_loaded_from_an_old_swap_is_ignored():
    d, clock = dispatcher()
    submit(d, clock, "a", model="sdxl")
    d.handle(JobFinished("a"))
    submit(d, clock, "b", model="flux")
    d.handle(ModelLoaded("gpu-0", "sdxl"))  # late report for the model already swapped out
    assert not d.lanes["gpu-0"].ready
    assert d.running["b"].started_at is None


def test_a_job_arriving_at_the_instant_a_slot_frees_competes_for_that_slot():
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "shot", priority=-100, member="alice")
    clock.now = 240
    image = JobSubmitted(Job("image", "m", 100, "free", "bob", clock.now))
    assert names(d.handle_all([JobFinished("blocker"), image])) == ["image"]
    assert d.history[-1].at == 240 and "shot" in d.ranking


def test_a_job_cancelled_at_the_instant_a_slot_frees_never_gets_it():
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "first")
    submit(d, clock, "second")
    assert names(d.handle_all([JobFinished("blocker"), JobCancelled("first")])) == ["second"]
    assert d.pending_count == 0


def test_the_order_of_events_within_an_instant_does_not_change_the_winner():
    outcomes = []
    for finish_first in (True, False):
        d, clock = dispatcher()
        busy(d, clock)
        submit(d, clock, "shot", priority=-100, member="alice")
        clock.now = 240
        events = [JobFinished("blocker"), JobSubmitted(Job("image", "m", 100, "free", "bob", clock.now))]
        outcomes.append(names(d.handle_all(events if finish_first else events[::-1])))
    assert outcomes == [["image"], ["image"]]


def test_events_handled_one_at_a_time_give_the_slot_to_whoever_waited_when_it_freed():
    """The artefact handle_all removes: the finish alone dispatches before the arrival is seen.

    The shot's model is loaded, so the shot starts at once (a load in progress would yield)."""
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "shot", model="warm", priority=-100, member="alice")
    clock.now = 240
    assert names(d.handle(JobFinished("blocker"))) == ["shot"]
    assert submit(d, clock, "image", model="warm", priority=100, member="bob") == []


def test_a_refused_event_in_an_instant_keeps_the_events_before_it_and_decides_nothing():
    d, clock = dispatcher()
    busy(d, clock)
    submit(d, clock, "waiting")
    events = [JobFinished("blocker"), JobSubmitted(Job("waiting", "m")), JobSubmitted(Job("after", "m"))]
    with pytest.raises(DispatchError, match="'waiting' is already known"):
        d.handle_all(events)
    assert not d.running and "after" not in d.ranking  # the finish happened; the rest was not applied
    assert names(d.decide()) == ["waiting"]
    assert d.handle_all([]) == []
