"""Property tests of the dispatcher against its documented rules, with a brute-force reference."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulane.core.events import JobCancelled, JobFinished, JobSubmitted, LaneUpdated, ModelUpdated
from gpulane.core.forecast import forecast
from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.policy import Policy
from gpulane.core.sim.engine import simulate
from gpulane.core.sim.report import jobs_json
from gpulane.core.sim.scenario import Scenario

from .helpers import dispatcher

# The references below take turns inside a band and never see a model load end, so loads never yield.
TURNS = Policy(fairShare="turns", loadYield=False)

MODELS = ["a", "b", "c"]
MEMBERS = ["ann", "ben", "cai"]
TIERS = ["free", "pro", "max"]
PRIORITIES = st.sampled_from([-200, -100, -60, -1, 0, 1, 30, 100, 101, 250])

job_specs = st.tuples(
    st.sampled_from(MEMBERS),
    st.sampled_from(TIERS),
    PRIORITIES,
    st.sampled_from(MODELS),
    st.integers(min_value=0, max_value=8000).map(lambda half_seconds: half_seconds / 2),  # gap before submission
)


def reference_best(
    pending: dict[str, tuple[Job, int]], last_dispatch: dict, resident: str | None, now: float, policy: Policy
) -> tuple[Fraction, int, Job] | None:
    """The documented rule, computed naively and exactly: rescore every candidate from scratch."""
    heads: dict[tuple, tuple[Job, int]] = {}
    oldest: dict[tuple, float] = {}
    for job, seq in pending.values():
        level = (job.member, policy.band(job.priority))
        oldest[level] = min(oldest.get(level, job.submitted_at), job.submitted_at)
        key = (*level, job.model)
        best = heads.get(key)
        if best is None or (job.priority, -seq) > (best[0].priority, -best[1]):
            heads[key] = (job, seq)
    scored = []
    for (member, band, _), (job, seq) in heads.items():
        level = (member, band)
        start = job.submitted_at
        if level in last_dispatch:
            start = max(job.submitted_at, last_dispatch[level] + job.submitted_at - oldest[level])
        total = (
            job.priority
            + policy.bonus_for_tier(job.tier)
            + (policy.affinity_bonus if job.model == resident else 0)
            + (Fraction(now) - Fraction(start)) / Fraction(policy.aging_divisor_seconds)
        )
        scored.append((total, -seq, job))
    return max(scored, key=lambda t: (t[0], t[1])) if scored else None


def reference_winner(pending, last_dispatch, resident, now, policy) -> str:
    best = reference_best(pending, last_dispatch, resident, now, policy)
    assert best is not None
    return best[2].id


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(job_specs, min_size=1, max_size=40), st.data())
def test_dispatcher_matches_the_brute_force_reference(specs, data):
    d, clock = dispatcher(policy=TURNS)
    policy = d.policy
    pending: dict[str, tuple[Job, int]] = {}
    last_dispatch: dict = {}
    running: str | None = None

    def handle(event):
        nonlocal running
        resident = d.lanes["gpu-0"].resident  # as the decision sees it, before any swap
        for decision in d.handle(event):
            expected = reference_winner(pending, last_dispatch, resident, clock.now, policy)
            assert decision.job.id == expected, f"dispatched {decision.job.id}, the reference says {expected}"
            job = pending.pop(decision.job.id)[0]
            last_dispatch[(job.member, policy.band(job.priority))] = clock.now
            running = job.id

    for i, (member, tier, priority, model, gap) in enumerate(specs):
        clock.now += gap
        if running is not None and data.draw(st.booleans()):
            finished, running = running, None
            handle(JobFinished(finished))
        job = Job(f"j{i}", model, priority, tier, member, clock.now)
        pending[job.id] = (job, i + 1)  # the dispatcher's arrival sequence
        handle(JobSubmitted(job))
        if pending and data.draw(st.integers(0, 9)) == 0:
            victim = data.draw(st.sampled_from(sorted(pending)))
            pending.pop(victim)
            handle(JobCancelled(victim))
    while running is not None:
        clock.now += 100
        finished, running = running, None
        handle(JobFinished(finished))
    assert not pending and d.pending_count == 0


@settings(max_examples=200, deadline=None)
@given(
    hi=st.integers(-1000, 1000),
    gap=st.integers(13, 400),
    hi_tier=st.sampled_from(TIERS),
    lo_tier=st.sampled_from(TIERS),
    lo_has_affinity=st.booleans(),
)
def test_tier_and_affinity_never_reorder_jobs_further_apart_than_the_offsets(
    hi, gap, hi_tier, lo_tier, lo_has_affinity
):
    """Tier (<= 2) plus affinity (10) only break near-ties: priorities > 12 apart keep their order."""
    lo = max(hi - gap, -1000)
    if hi - lo <= 12:
        return
    d, clock = dispatcher(lanes={"gpu-0": "warm"})
    d.handle(JobSubmitted(Job("blocker", "warm", member="x")))
    lo_model = "warm" if lo_has_affinity else "cold"
    d.handle(JobSubmitted(Job("lo", lo_model, lo, lo_tier, "ann", 0.0)))
    d.handle(JobSubmitted(Job("hi", "cold", hi, hi_tier, "ben", 0.0)))  # same wait: equal aging
    clock.now = 1234.0
    [decision] = d.handle(JobFinished("blocker"))
    assert decision.job.id == "hi"


@settings(max_examples=60, deadline=None)
@given(low=st.integers(-500, 0), run=st.integers(30, 600), members=st.integers(1, 4))
def test_aging_eventually_dispatches_a_low_job_under_endless_high_traffic(low, run, members):
    """Keep the interactive band saturated forever: the low job still runs within its bound."""
    d, clock = dispatcher()
    count = 0

    def interactive():
        nonlocal count
        count += 1
        member = f"m{count % members}"
        return d.handle(JobSubmitted(Job(f"hot-{count}", "m", 100, "free", member, clock.now)))

    running = [x.job.id for x in interactive()]
    for _ in range(members):
        interactive()
    d.handle(JobSubmitted(Job("low", "m", low, "free", "starved", clock.now)))
    divisor = d.policy.aging_divisor_seconds
    # Competitor heads age at most members+1 runs between their dispatches, plus offsets.
    bound = (100 - low + 12 + (members + 2) * run / divisor) * divisor + run
    while clock.now <= bound:
        clock.now += run
        decisions = d.handle(JobFinished(running.pop()))
        interactive()  # demand never lets up
        [decision] = decisions
        if decision.job.id == "low":
            return
        running.append(decision.job.id)
    raise AssertionError(f"low job (priority {low}) not dispatched by t={clock.now}")


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "finish", "cancel", "resize"]),
            st.sampled_from(MODELS),
            st.integers(1, 3),
            st.sampled_from(MEMBERS),
            PRIORITIES,
        ),
        max_size=80,
    )
)
def test_never_more_running_jobs_than_a_lane_can_hold(ops):
    d, clock = dispatcher(lanes={"gpu-0": None, "gpu-1": "a"}, models=[ModelSpec(m, max_concurrency=2) for m in MODELS])
    n = 0
    for op, model, size, member, priority in ops:
        clock.now += 10
        if op == "submit":
            n += 1
            decisions = d.handle(JobSubmitted(Job(f"j{n}", model, priority, "free", member, clock.now)))
        elif op == "finish" and d.running:
            decisions = d.handle(JobFinished(sorted(d.running)[size % len(d.running)]))
        elif op == "cancel" and d.pending_count:
            decisions = d.handle(JobCancelled(sorted(j.id for j in d.ranking.pending())[0]))
        elif op == "resize":
            decisions = d.handle(ModelUpdated(ModelSpec(model, max_concurrency=size)))
        else:
            continue
        for decision in decisions:
            lane = d.lanes[decision.lane]
            assert len(lane.running) <= d.models.concurrency(lane.resident)
            assert all(d.running[j].job.model == lane.resident for j in lane.running)
        if d.pending_count:  # the GPU is never idle while work waits
            assert all(lane.running for lane in d.lanes.values())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), rate=st.floats(1, 60), members=st.lists(st.sampled_from(MEMBERS), min_size=1))
def test_same_seed_same_result(seed, rate, members):
    scenario = Scenario.model_validate(
        {
            "name": "random",
            "seed": seed,
            "streams": [
                {
                    "name": "a",
                    "members": members,
                    "priority": "interactive",
                    "model": "x",
                    "runSeconds": {"min": 5, "max": 90},
                    "arrival": {"poissonPerHour": rate},
                    "until": "2h",
                },
                {
                    "name": "b",
                    "member": "zed",
                    "priority": "batch",
                    "model": "y",
                    "runSeconds": 120,
                    "count": 5,
                    "submit": "burst",
                },
            ],
        }
    )
    first = json.dumps(jobs_json(simulate(scenario)))
    assert first == json.dumps(jobs_json(simulate(scenario)))


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 10**9))
def test_several_lanes_with_concurrency_match_the_reference(seed):
    """Random traffic on three lanes: every dispatch is the best (lane, job) pair by the rules."""
    rng = random.Random(seed)
    concurrency = {m: rng.randint(1, 3) for m in MODELS}
    lanes = {f"gpu-{i}": {"resident": rng.choice([None, *MODELS]), "running": set(), "online": True} for i in range(3)}
    d, clock = dispatcher(
        lanes={k: v["resident"] for k, v in lanes.items()},
        models=[ModelSpec(m, concurrency[m]) for m in MODELS],
        policy=TURNS,
    )
    pending: dict[str, tuple[Job, int]] = {}
    last_dispatch: dict = {}
    running: dict[str, str] = {}
    submitted: list[str] = []

    def reference_pair():
        best = None
        for name, lane in lanes.items():
            if not lane["online"]:
                continue
            if lane["running"] and len(lane["running"]) >= concurrency[lane["resident"]]:
                continue
            pick = reference_best(pending, last_dispatch, lane["resident"], clock.now, d.policy)
            if pick is None:
                return None
            if lane["running"] and pick[2].model != lane["resident"]:
                continue  # draining: nothing below the job that needs another model
            if best is None or pick[:2] > best[0][:2]:
                best = (pick, name)
        return best

    def handle(event):
        for decision in d.handle(event):
            expected = reference_pair()
            assert expected is not None, f"dispatched {decision.job.id}, the reference would not"
            (_, _, job), lane_name = expected
            assert (decision.job.id, decision.lane) == (job.id, lane_name)
            pending.pop(job.id)
            last_dispatch[(job.member, d.policy.band(job.priority))] = clock.now
            lane = lanes[lane_name]
            if lane["resident"] != job.model:
                assert not lane["running"], "swapped a model under running work"
                lane["resident"] = job.model
            lane["running"].add(job.id)
            running[job.id] = lane_name
        assert reference_pair() is None, "the reference would still dispatch"

    for n in range(150):
        clock.now += rng.choice([0, 1, 5, 30, 120, 600])
        op = rng.random()
        if op < 0.45:
            job = Job(
                f"j{n}",
                rng.choice(MODELS),
                rng.choice([-100, -60, 0, 20, 100, 150]),
                rng.choice(TIERS),
                rng.choice(MEMBERS),
                clock.now,
            )
            pending[job.id] = (job, len(submitted) + 1)  # the dispatcher's arrival sequence
            submitted.append(job.id)
            handle(JobSubmitted(job))
        elif op < 0.75 and running:
            job_id = rng.choice(sorted(running))
            lanes[running.pop(job_id)]["running"].discard(job_id)
            handle(JobFinished(job_id))
        elif op < 0.85 and pending:
            job_id = rng.choice(sorted(pending))
            pending.pop(job_id)
            handle(JobCancelled(job_id))
        elif op < 0.92:
            model = rng.choice(MODELS)
            concurrency[model] = rng.randint(1, 3)
            handle(ModelUpdated(ModelSpec(model, concurrency[model])))
        else:
            name = rng.choice(sorted(lanes))
            lanes[name]["online"] = not lanes[name]["online"]
            handle(LaneUpdated(name, online=lanes[name]["online"], resident=lanes[name]["resident"]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(MODELS), PRIORITIES, st.sampled_from(MEMBERS), st.integers(10, 300)),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 2),
)
def test_forecast_matches_what_happens_when_run_times_are_as_expected(jobs, lanes):
    """With no new arrivals and every job taking its expected time, the forecast is exact."""
    models = [ModelSpec(m, load_seconds=10 * (i + 1), run_seconds=60) for i, m in enumerate(MODELS)]
    d, clock = dispatcher(lanes={f"gpu-{i}": None for i in range(lanes)}, models=models, policy=Policy(loadYield=False))
    loads = {m.name: m.load_seconds for m in models}
    ends: list[tuple[float, str]] = []
    ready_at: dict[str, float] = {}
    actual: dict[str, float] = {}

    def started(decisions):
        for decision in decisions:
            if decision.load:
                ready_at[decision.lane] = clock.now + loads[decision.model]
            start = max(clock.now, ready_at.get(decision.lane, clock.now))
            actual[decision.job.id] = start
            ends.append((start + d.models.expected_run(decision.job), decision.job.id))

    for i, (model, priority, member, run) in enumerate(jobs):
        started(
            d.handle(
                JobSubmitted(Job(f"j{i}", model, priority, "free", member, clock.now, expected_run_seconds=float(run)))
            )
        )
    predicted = {f.job_id: f.start for f in forecast(d)}
    assert set(predicted) == {j.id for j in d.ranking.pending()}
    while ends:
        clock.now = min(ends)[0]
        finished = [JobFinished(job_id) for end, job_id in ends if end == clock.now]
        ends[:] = [(end, job_id) for end, job_id in ends if end != clock.now]
        started(d.handle_all(finished))
    for job_id, start in predicted.items():
        assert start == pytest.approx(actual[job_id]), job_id
