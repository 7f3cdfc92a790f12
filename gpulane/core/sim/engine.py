"""The simulator: the real dispatcher on a virtual clock, fed by a scenario's job streams.

Job sets are drawn from the seed before any policy runs, so every policy sees exactly the
same jobs; only the dispatcher's ranking differs between runs, and for the llama-swap
baseline its admission cap in front of the dispatcher.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from gpulane.core.baselines import make_ranking
from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import (
    Dispatch,
    Effect,
    Event,
    Expired,
    JobFinished,
    JobSubmitted,
    LaneMemory,
    LaneUpdated,
    ModelLoaded,
    Unloaded,
)
from gpulane.core.jobs import Job, ModelCatalog, ModelSpec
from gpulane.core.policy import Policy
from gpulane.core.sim.llamaswap import AdmissionCap
from gpulane.core.sim.scenario import Range, Scenario, ScenarioError, Stream

# A simulation holds every job in memory; beyond this a scenario is almost surely a mistake.
MAX_JOBS = 200_000


@dataclass(slots=True)
class JobRecord:
    name: str
    stream: str | None
    member: str
    tier: str
    priority: int
    model: str
    run_seconds: float
    queue_timeout: float | None = None  # how long its caller waits for it to start
    team: str | None = None
    submitted_at: float | None = None  # the client's first attempt: waits count from here
    admitted_at: float | None = None  # when the dispatcher got it (later after a 429 and a retry)
    rejected: bool = False  # refused with 429 by the llama-swap baseline's admission cap
    dispatched_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    cold_start: bool = False
    replaced: str | None = None  # the model this job's dispatch swapped out
    swaps: int = 0  # its dispatches that swapped a model out (a load that yielded is one too)
    load_seconds: float = 0.0  # GPU time its dispatches spent loading its model (a new pod's or a switch's)
    switched: bool = False  # its lane's server switched to its model: a load there, or one it held
    yielded: int = 0  # times its load gave way to a better newcomer
    expired_at: float | None = None  # it waited past its queue deadline and never ran
    lane: str | None = None
    changed_by: dict[str, str] = field(default_factory=dict)
    score: dict[str, float] = field(default_factory=dict)  # the breakdown when it was dispatched

    @property
    def dropped(self) -> bool:
        """Refused, and its client gave the job up: it never runs."""
        return self.rejected and self.admitted_at is None

    @property
    def late(self) -> bool:
        """It started after its caller had given up (only possible where deadlines are not enforced)."""
        return self.queue_timeout is not None and self.started_at is not None and self.wait > self.queue_timeout

    @property
    def wait(self) -> float:
        assert self.started_at is not None and self.submitted_at is not None
        return self.started_at - self.submitted_at


@dataclass(frozen=True, slots=True)
class Planned:
    """A job the scenario will submit: at a fixed time, or after its chain predecessor ends."""

    record: JobRecord
    at: float | None  # None: chained


@dataclass(slots=True)
class SimResult:
    scenario: str
    policy: str
    jobs: list[JobRecord]
    lanes: list[str]
    # Per band, the GPU seconds each member received while two or more members of the band waited.
    contended: dict[int, dict[str, float]]
    idle_while_waiting: float
    end: float
    yields: int = 0  # loads abandoned for a better newcomer


def _draw_run(spec: float | Range, rng: random.Random) -> float:
    return spec if isinstance(spec, float | int) else rng.uniform(spec.min, spec.max)


def _stream_jobs(stream: Stream, seed: int) -> list[Planned]:
    rng = random.Random(f"{seed}:{stream.name}")
    planned: list[Planned] = []

    def plan(index: int, at: float | None) -> None:
        record = JobRecord(
            name=f"{stream.name}-{index}",
            stream=stream.name,
            member=stream.member_at(index),
            tier=stream.tier,
            priority=stream.priority,
            model=stream.model,
            run_seconds=_draw_run(stream.run_seconds, rng),
            queue_timeout=stream.queue_timeout_seconds,
            team=stream.team,
        )
        planned.append(Planned(record, at))

    if stream.submit is not None:
        count = stream.count or 0
        for i in range(count):
            at = stream.at if stream.submit == "burst" or i == 0 else None
            plan(i, at)
        return planned
    arrival = stream.arrival
    assert arrival is not None
    t, i = stream.from_, 0
    limit = stream.count if stream.count is not None else MAX_JOBS + 1
    while i < limit:
        if arrival.every_seconds is not None:
            at = t if i == 0 else t + arrival.every_seconds
        else:
            assert arrival.poisson_per_hour is not None
            at = t + rng.expovariate(arrival.poisson_per_hour / 3600.0)
        if stream.until is not None and at >= stream.until:
            break
        plan(i, at)
        t, i = at, i + 1
    return planned


def plan_jobs(scenario: Scenario) -> list[Planned]:
    planned: list[Planned] = []
    for stream in scenario.streams:
        planned += _stream_jobs(stream, scenario.seed)
        if len(planned) + len(scenario.jobs) > MAX_JOBS:
            raise ScenarioError(
                f"scenario {scenario.name!r} plans more than {MAX_JOBS:,} jobs (stream {stream.name!r} "
                f"alone plans {sum(1 for p in planned if p.record.stream == stream.name):,}); lower its rate or span"
            )
    for job in scenario.jobs:
        record = JobRecord(
            job.name,
            None,
            job.member,
            job.tier,
            job.priority,
            job.model,
            job.run_seconds,
            job.queue_timeout_seconds,
            job.team,
        )
        planned.append(Planned(record, job.at))
    return planned


def catalog_for(scenario: Scenario) -> ModelCatalog:
    default = ModelSpec(
        "*",
        max_concurrency=scenario.default_model.max_concurrency,
        load_seconds=scenario.default_model.load_seconds,
    )
    specs = [
        ModelSpec(
            m.name, m.max_concurrency, m.load_seconds, server=m.server, memory_mib=m.memory_mib,
            switch_seconds=m.switch_seconds,
        )
        for m in scenario.models
    ]  # fmt: skip
    return ModelCatalog(specs, default)


# The order of events within one instant: finishes, then loads, then arrivals in plan order. All of
# an instant's events reach the dispatcher before it decides, so this order only makes runs
# reproducible; it never decides which job gets a slot that frees at that instant. Reactions to an
# instant's events (a chain's next job, submitted when its predecessor ends; a retrying client let
# in by an end) are a client's round trip later in reality: they form the next round at the same
# timestamp, after the decision. A finish frees its admission place first, so an arrival at that
# instant sees the room (unless a retrying client already holds it).
FINISH, LOADED, RETRY, SUBMIT, DEADLINE = 0, 1, 2, 3, 4

# Policies that are gpulane itself: the others are systems without queue deadlines or yielding loads.
GPULANE = ("gpulane", "gpulane-turns")


# Called after each instant's decisions with the dispatcher, the time and the jobs submitted then.
Observer = Callable[[Dispatcher, float, list[str]], None]


def dispatcher_policy(scenario: Scenario, policy_name: str, *, deadlines: bool = True) -> Policy:
    """The scenario's policy as ``policy_name`` runs it: baselines neither expire jobs nor yield loads."""
    policy = scenario.policy
    no_timeouts: dict[str, object] = {
        "queue_timeout_seconds": {},
        "namespace_queue_timeout_seconds": {},
        "member_queue_timeout_seconds": {},
    }
    if policy_name not in GPULANE:
        return policy.model_copy(update={"load_yield": False, **no_timeouts})
    return policy if deadlines else policy.model_copy(update=no_timeouts)


def simulate(
    scenario: Scenario, policy_name: str = "gpulane", observe: Observer | None = None, *, deadlines: bool = True
) -> SimResult:
    """Run ``scenario`` under ``policy_name``. ``deadlines=False``: callers still give up, but gpulane
    is not told (jobs run after their caller left, counted as late)."""
    planned = plan_jobs(scenario)
    catalog = catalog_for(scenario)
    now = [0.0]
    policy = dispatcher_policy(scenario, policy_name, deadlines=deadlines)
    enforced = deadlines and policy_name in GPULANE
    dispatcher = Dispatcher(policy, lambda: now[0], catalog, make_ranking(policy_name, policy))
    truth = catalog_for(scenario)  # the real load times, apart from what the dispatcher learns
    cap = AdmissionCap(scenario.llama_swap) if policy_name == "llama-swap" else None
    records = {p.record.name: p.record for p in planned}
    chain_next: dict[str, JobRecord] = {}
    for stream in scenario.streams:
        if stream.submit == "chain":
            chain = [p.record for p in planned if p.record.stream == stream.name]
            chain_next.update({a.name: b for a, b in itertools.pairwise(chain)})

    queue: list[tuple[float, int, int, str, str]] = []
    order = itertools.count()

    def push(at: float, kind: int, what: str, detail: str = "") -> None:
        heapq.heappush(queue, (at, kind, next(order), what, detail))

    for p in planned:
        if p.at is not None:
            push(p.at, SUBMIT, p.record.name)
        # The caller's patience: the job's own timeout or its band's default, the smaller.
        record = p.record
        record.queue_timeout = scenario.policy.queue_timeout(
            record.priority, record.queue_timeout, record.team, record.member
        )

    lanes = [f"gpu-{i}" for i in range(scenario.lanes)]
    ready_at = dict.fromkeys(lanes, 0.0)
    loads = dict.fromkeys(lanes, 0)  # a completed load counts only if it is the lane's latest
    dispatches: dict[str, int] = {}  # a finish counts only for the job's latest dispatch
    shared: dict[str, int] = {}  # the band whose contended share a dispatch added to
    yields = 0
    serving: dict[str, str | None] = dict.fromkeys(lanes, scenario.initial_model)
    for lane in lanes:
        dispatcher.handle(LaneMemory(lane, scenario.lane_memory_mib or 0))
        dispatcher.handle(LaneUpdated(lane, resident=scenario.initial_model))

    band_of = scenario.policy.band
    waiting: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    contended: dict[int, dict[str, float]] = defaultdict(dict)
    idle_while_waiting = 0.0

    def admitted(record: JobRecord) -> JobSubmitted:
        record.admitted_at = now[0]
        timeout = record.queue_timeout if enforced else None
        job = Job(
            record.name, record.model, record.priority, record.tier, record.member, now[0], None, timeout, record.team
        )
        if timeout is not None:
            push(now[0] + timeout, DEADLINE, record.name)
        return JobSubmitted(job)

    def follow(name: str) -> None:
        """A chain's next job is submitted when this one ends, or is given up."""
        follower = chain_next.get(name)
        if follower is not None:
            push(now[0], SUBMIT, follower.name)

    def dispatched(decision: Dispatch) -> None:
        record = records[decision.job.id]
        t = now[0]
        record.dispatched_at, record.lane, record.changed_by = t, decision.lane, decision.changed_by
        record.score = decision.score.as_dict()
        band = band_of(record.priority)
        members = waiting[band]
        if sum(1 for n in members.values() if n) >= 2:
            share = contended[band]
            for member, n in members.items():
                if n:
                    share.setdefault(member, 0.0)
            share[record.member] += record.run_seconds
            shared[record.name] = band
        members[record.member] -= 1
        real = truth.get(decision.model)
        record.switched |= decision.in_server or (not decision.load and serving[decision.lane] != decision.model)
        serving[decision.lane] = decision.model
        if decision.load:
            record.cold_start, record.replaced = True, decision.replaces
            record.swaps += decision.replaces is not None
            seconds = (
                real.switch_seconds if decision.in_server and real.switch_seconds is not None else real.load_seconds
            )
            record.load_seconds += seconds
            ready_at[decision.lane] = t + seconds
            loads[decision.lane] += 1
            push(ready_at[decision.lane], LOADED, decision.lane, f"{loads[decision.lane]}:{decision.model}")
        record.started_at = max(t, ready_at[decision.lane])
        dispatches[record.name] = dispatches.get(record.name, 0) + 1
        push(record.started_at + record.run_seconds, FINISH, record.name, str(dispatches[record.name]))

    def undo(record: JobRecord) -> None:
        """Its dispatch is void: it never started on its lane (expired mid-load, or its load yielded)."""
        dispatches[record.name] += 1  # its scheduled finish no longer counts
        band = shared.pop(record.name, None)
        if band is not None:
            contended[band][record.member] -= record.run_seconds
        record.dispatched_at = record.started_at = record.lane = None

    def apply(effect: Effect) -> None:
        """The simulated world's side of one of the dispatcher's effects, taken in the order they happened."""
        nonlocal yields
        if isinstance(effect, Dispatch):
            dispatched(effect)
            return
        if isinstance(effect, Unloaded):
            serving[effect.lane] = None  # an idle lane gave its model up: its next job loads one
            return
        record = records[effect.job.id]
        if effect.lane is not None:
            undo(record)
        if isinstance(effect, Expired):
            record.expired_at = now[0]
            if effect.lane is None:
                waiting[band_of(record.priority)][record.member] -= 1
            follow(record.name)
        else:
            record.yielded += 1
            yields += 1
            waiting[band_of(record.priority)][record.member] += 1

    last = 0.0
    while queue:
        at = queue[0][0]
        idle_lanes = sum(1 for lane in lanes if not dispatcher.on_lane(lane))
        if dispatcher.pending_count and idle_lanes:
            idle_while_waiting += (at - last) * idle_lanes
        now[0] = last = at
        instant = []
        while queue and queue[0][0] == at:
            instant.append(heapq.heappop(queue))
        events: list[Event] = []
        for _, kind, _, what, detail in instant:
            if kind == LOADED:
                count, model = detail.split(":", 1)
                if int(count) == loads[what]:
                    events.append(ModelLoaded(what, model))
                continue
            if kind == DEADLINE:
                continue  # the decision below expires whatever is due
            record = records[what]
            if kind == SUBMIT:
                record.submitted_at = at
                if cap is None or cap.admit(what, record.model):
                    events.append(admitted(record))
                else:
                    record.rejected = True
                    if cap.config.clients == "reject":
                        follow(what)
                        continue
                waiting[band_of(record.priority)][record.member] += 1  # a retrying client waits too
            elif kind == RETRY:
                events.append(admitted(record))
            elif int(detail) != dispatches[what]:
                continue  # the end of a dispatch that was undone
            else:
                record.finished_at = at
                events.append(JobFinished(what, record.run_seconds))
                retrying = None if cap is None else cap.release(record.model)
                if retrying is not None:
                    push(at, RETRY, retrying)
                follow(what)
        for effect in dispatcher.handle_all(events):
            apply(effect)
        if observe is not None:
            observe(dispatcher, at, [what for _, kind, _, what, _ in instant if kind in (SUBMIT, RETRY)])

    return SimResult(
        scenario=scenario.name,
        policy=policy_name,
        jobs=[p.record for p in planned],
        lanes=lanes,
        contended={band: dict(shares) for band, shares in contended.items()},
        idle_while_waiting=idle_while_waiting,
        end=last,
        yields=yields,
    )
