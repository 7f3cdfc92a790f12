"""Replacing the policy of a running dispatcher (a GpuPolicy edit) and explaining decisions."""

from gpulane.core.events import Dispatch, JobFinished
from gpulane.core.explain import describe_dispatch, format_score
from gpulane.core.policy import Policy
from gpulane.core.score import ScoreBreakdown

from .helpers import dispatcher, names, submit


def _busy_lane():
    d, clock = dispatcher(lanes={"gpu-0": "m"})
    submit(d, clock, "running", member="x")
    return d, clock


def test_new_policy_reorders_the_waiting_jobs_and_keeps_arrival_order_for_ties():
    d, clock = _busy_lane()
    submit(d, clock, "free-batch", priority=-100, tier="free", member="a")
    submit(d, clock, "pro-batch", priority=-100, tier="pro", member="b")
    submit(d, clock, "free-batch-2", priority=-100, tier="free", member="c")
    # Under the new policy free outranks pro: the order of the queue must follow it.
    rejected = d.replace_policy(Policy(tierBonus={"free": 5, "pro": 0}))
    assert rejected == []
    order = []
    for job in ["running", "free-batch", "free-batch-2"]:
        order += names(d.handle(JobFinished(job)))
    assert order == ["free-batch", "free-batch-2", "pro-batch"]


def test_jobs_the_new_policy_cannot_rank_are_returned_with_the_reason():
    d, clock = _busy_lane()
    submit(d, clock, "max-job", tier="max", member="a")
    submit(d, clock, "huge", priority=900, member="b")
    rejected = d.replace_policy(Policy(tierBonus={"free": 0, "pro": 1}, priorityBounds={"min": -500, "max": 500}))
    reasons = {job.id: reason for job, reason in rejected}
    assert set(reasons) == {"max-job", "huge"}
    assert "unknown tier 'max'" in reasons["max-job"]
    assert "outside this policy's bounds [-500, 500]" in reasons["huge"]
    assert d.pending_count == 0


def test_fair_share_clocks_survive_a_policy_change():
    d, clock = dispatcher(lanes={"gpu-0": "m"})
    clock.now = 1000.0
    submit(d, clock, "a1", priority=-100, member="a")  # dispatched at once: a's batch queue served at 1000
    submit(d, clock, "a2", priority=-100, member="a")
    served = d.ranking.served()
    d.replace_policy(Policy(agingDivisorSeconds=30))
    assert d.ranking.served() == served
    clock.now = 1060.0
    [decision] = d.handle(JobFinished("a1"))
    # Aging counts from the last service (1000), not from a2's submission at 1000 either way; the
    # divisor is the new one: 60 s / 30 = 2 points.
    assert decision.job.id == "a2"
    assert decision.score.aging == 2.0


def test_a_dispatch_is_described_with_its_terms_and_the_term_that_changed_the_winner():
    score = ScoreBreakdown(priority=-100, tier=2, affinity=10, aging=3.25)
    assert format_score(score) == "-84.8 = priority -100 + tier 2 + affinity 10 + aging 3.2"
    d, clock = dispatcher(lanes={"gpu-0": "m"})
    [decision] = submit(d, clock, "a")
    assert describe_dispatch(decision).startswith("dispatched to lane gpu-0 (m already loaded) with score 10.0")
    swap = Dispatch(decision.job, "gpu-0", "flux", True, "sdxl", 0.0, score, {"aging": "ns/other"})
    text = describe_dispatch(swap)
    assert "swapping sdxl for flux" in text
    assert text.endswith("won because of aging (else ns/other)")
