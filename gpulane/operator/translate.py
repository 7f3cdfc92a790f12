"""Pure translations between Kubernetes objects (plain dicts) and the core's values.

Nothing here calls the API: handlers and the rebuild at start use these to turn what they see into
core events, and the unit tests exercise them without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpulane.api.contract import Body
from gpulane.api.resources import GpuJobSpec, GpuModelSpec
from gpulane.api.times import format_time, parse_time
from gpulane.core.events import Dispatch
from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.policy import Policy, PolicyError
from gpulane.core.priority import resolve_priority
from gpulane.core.score import ScoreBreakdown
from gpulane.core.validation import describe

DEFAULT_TIER = "free"  # of a job that names none (the webhook, when installed, always sets one)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a GpuJob cannot be queued: a reason (CamelCase, for status.reason) and a message."""

    reason: str
    message: str


def submission_time(body: Body, seen: float, arrivals: Arrivals | None = None) -> float:
    """When the job arrived, precisely and the same after any restart: what the operator wrote at first
    sight (``status.submittedAt``), else the first sight itself (``seen``). ``creationTimestamp`` has 1-s
    resolution, so jobs created in the same second would otherwise be ordered by name after a restart; the
    time is kept inside that second, and to the microsecond, as it is written.

    A first sight is also later than the latest time ``arrivals`` gave a job of the same second (and is
    recorded there): jobs seen only once their second has ended all fall on its last millisecond, and
    without this they would tie there and be ordered by name by the next leader."""
    written = parse_time((body.get("status") or {}).get("submittedAt"))
    created = parse_time(body["metadata"].get("creationTimestamp"))
    at = round(seen, 6) if written is None else written
    if created is None:
        return at
    # A first sight falls by its last millisecond at the latest, which leaves a thousand microseconds to
    # keep apart the jobs seen later still; what was written is kept as written, within the second.
    at = min(max(at, created), created + (0.999 if written is None else 0.999999))
    if written is None and arrivals is not None:
        after = arrivals.after(created)
        if after is not None and at <= after < created + 0.999999:
            at = round(after + 0.000001, 6)
        arrivals.gave(created, at)
    return at


class Arrivals:
    """The submission times this operator gave at first sight, the latest per creation second (a minute of
    them): the next job of that second comes after (``submission_time``'s ``after``)."""

    def __init__(self) -> None:
        self._latest: dict[int, float] = {}

    def after(self, created: float | None) -> float | None:
        return None if created is None else self._latest.get(int(created))

    def gave(self, created: float | None, submitted: float) -> None:
        if created is None:
            return
        second = int(created)
        self._latest[second] = max(submitted, self._latest.get(second, submitted))
        for old in [s for s in self._latest if s < second - 60]:
            del self._latest[old]


def job_from_body(
    body: Body, key: str, policy: Policy | None, seen: float, arrivals: Arrivals | None = None
) -> Job | Refusal:
    """The core job ``key`` (the table's, ``job_table.job_key``) for a GpuJob first seen at ``seen``, or why it
    cannot be queued under ``policy``.

    Without a policy only the spec itself is checked: a job adopted after a restart keeps running
    even if the policy changed meanwhile.
    """
    meta = body["metadata"]
    try:
        spec = GpuJobSpec.model_validate(body.get("spec") or {})
    except ValidationError as err:
        return Refusal("InvalidSpec", describe(err, "spec"))
    try:
        priority = resolve_priority(spec.priority)
    except ValueError as err:
        return Refusal("InvalidPriority", str(err))
    if policy is not None:
        refusal = policy_refusal(policy, priority, spec.tier or DEFAULT_TIER)
        if refusal is not None:
            return refusal
    return Job(
        id=key,
        model=spec.model,
        priority=priority,
        tier=spec.tier or DEFAULT_TIER,
        member=spec.member or meta["namespace"],
        team=meta["namespace"],
        submitted_at=submission_time(body, seen, arrivals),
        expected_run_seconds=None if spec.expected_run_seconds is None else float(spec.expected_run_seconds),
        queue_timeout_seconds=None if spec.queue_timeout_seconds is None else float(spec.queue_timeout_seconds),
    )


def policy_refusal(policy: Policy, priority: int, tier: str) -> Refusal | None:
    """Why ``policy`` cannot rank a job of this priority and tier, if it cannot."""
    try:
        policy.check_priority(priority)
    except PolicyError as err:
        return Refusal("PriorityOutOfBounds", str(err))
    try:
        policy.bonus_for_tier(tier)
    except PolicyError as err:
        return Refusal("UnknownTier", str(err))
    return None


def model_spec(
    name: str, spec: GpuModelSpec, status: Body | None, fallback: ModelSpec, lane_labels: dict[str, dict[str, str]]
) -> ModelSpec:
    """The core's view of a GpuModel: learned times from its status, else the spec's estimates; the lanes its
    laneSelector matches."""
    status = status or {}
    load = status.get("loadSeconds", spec.expected_load_seconds)
    run = status.get("runSeconds", spec.expected_run_seconds)
    switch = status.get("switchSeconds", spec.expected_switch_seconds)
    return ModelSpec(
        name,
        max_concurrency=spec.max_concurrency,
        load_seconds=float(load) if load is not None else fallback.load_seconds,
        run_seconds=float(run) if run is not None else fallback.run_seconds,
        ttl_seconds=float(spec.ttl_seconds) if spec.ttl_seconds is not None else None,
        lanes=pinned_lanes(spec, lane_labels),
        # A server is a model of its own name: the models it holds share it, and it shares nothing.
        server=spec.server if spec.server is not None else name if spec.router is not None else None,
        memory_mib=spec.memory_mib or 0,
        switch_seconds=None if switch is None else float(switch),
    )


def pinned_lanes(spec: GpuModelSpec, lane_labels: dict[str, dict[str, str]]) -> frozenset[str] | None:
    """The lanes a model's laneSelector matches, or None when it has none (any lane may serve it)."""
    selector = spec.lane_selector
    if selector is None:
        return None
    return frozenset(lane for lane, labels in lane_labels.items() if selector.matches(labels))


def band_label(priority: int, policy: Policy) -> str:
    """The metric and status label of a priority's band: the band's centre, e.g. ``-100``, ``0``, ``100``."""
    return band_name(policy.band(priority), policy)


def band_name(band: int, policy: Policy) -> str:
    """The same label, of a band by its index."""
    return str(band * policy.band_spacing)


def score_fields(score: ScoreBreakdown) -> dict[str, float]:
    """The score as written to a status: affinity, aging and total to two decimals (the clock is sub-second)."""
    rounded = {term: round(getattr(score, term), 2) for term in ("affinity", "aging")}
    return {**score.as_dict(), **rounded, "total": round(score.total, 2)}


def dispatch_record(decision: Dispatch) -> dict[str, Any]:
    """A dispatch as lanes remember it (status.history) and stories tell it (status.story). Unset fields are left
    out: the CRD stores records as they come (``OPAQUE``), so nothing would prune a null."""
    job = decision.job
    record = {
        "job": job.id,
        "at": format_time(decision.at),
        "lane": decision.lane,
        "model": decision.model,
        "load": decision.load,
        "member": job.member,
        "priority": job.priority,
        "tier": job.tier,
        "score": score_fields(decision.score),
        "changedBy": dict(decision.changed_by) or None,
    }
    return {k: v for k, v in record.items() if v is not None}
