"""What a GpuJob watch event is read against, and the writes it may ask for, as data: ``JobTable.enter`` reads the
event against the table and returns an ``Intake`` of them; ``effects.settle`` hands its events to the core and
applies the rest, with the core's own effects, in one place. The event's branches decide; none of them writes."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpulane.api.contract import Body
from gpulane.core.policy import Policy
from gpulane.operator.translate import Refusal


@dataclass(frozen=True, slots=True)
class Admission:
    """What a new job is admitted against: the policy that ranks it, when it was seen, the GpuModels this shard
    serves and those another shard serves, and the GpuPolicy's caps on waiting jobs."""

    policy: Policy
    now: float
    models: Collection[str]
    elsewhere: Collection[str]
    pending_cap: int | None = None
    member_pending_cap: int | None = None


@dataclass(frozen=True, slots=True)
class Refuse:
    """The job cannot be queued: Failed with the refusal's reason (counted), and a Warning Event."""

    body: Body
    refusal: Refusal


@dataclass(frozen=True, slots=True)
class DropFinalizer:
    """The job needs the operator no more: its finalizer off (``finalizers``: the list as last seen)."""

    namespace: str
    name: str
    finalizers: list[str]
